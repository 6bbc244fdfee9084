//! What `subetha-agent` writes, as an operator meets it: every printing
//! subcommand exits quietly (status 0, no panic, no "Broken pipe") when
//! its stdout is a pipe nobody reads any more (`storms | head`); logs
//! written to a file carry no ANSI escape codes; `status` is a summary
//! with one line per storm while `storms` has the causes and evidence.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

use subetha_tests::agent::{AgentProcess, ScratchDir, Workload, agent_exe, run_agent};
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");
/// Above the kernel's pid_max: no such process.
const NO_PID: &str = "4194305";

/// A pipe whose read end is already closed: the first write to the other
/// end fails with EPIPE.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are fresh descriptors that nobody else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

/// Runs the agent with `args` and stdout on a closed pipe; asserts it
/// exits 0 (or dies of SIGPIPE, the shell convention) and says nothing
/// about the pipe or a panic.
fn quiet_on_a_closed_pipe(args: &[&str]) {
    let output = Command::new(agent_exe())
        .args(args)
        .env("SUBETHA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::from(closed_pipe()))
        .stderr(Stdio::piped())
        .output()
        .expect("run subetha-agent");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let sigpipe = std::os::unix::process::ExitStatusExt::signal(&output.status) == Some(libc::SIGPIPE);
    assert!(
        output.status.success() || sigpipe,
        "{args:?} on a closed pipe: {}\n{stderr}",
        output.status
    );
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    assert!(
        !stderr.to_lowercase().contains("broken pipe"),
        "{args:?} complains about the pipe:\n{stderr}"
    );
}

#[test]
fn every_printing_subcommand_is_quiet_on_a_closed_pipe() {
    let scratch = ScratchDir::new("closed-pipe");
    let agent = AgentProcess::start(
        agent_exe(),
        &["--pid", NO_PID, "--no-socket", "--probes", "off"],
        scratch.join("agent.log"),
    );
    agent.wait_snapshot("the agent to answer", |_| Some(()));
    let addr = agent.addr().to_string();
    let out_dir = scratch.join("generated");
    let out_dir = out_dir.to_str().unwrap();
    let report = scratch.join("report.html");
    let report = report.to_str().unwrap();
    let config = scratch.join("agent.toml");
    std::fs::write(&config, "").unwrap();
    let config = config.to_str().unwrap();
    for args in [
        &["status", "--addr", &addr][..],
        &["status", "--addr", &addr, "--json"],
        &["storms", "--addr", &addr],
        &["storms", "--addr", &addr, "--json"],
        &[
            "snapshot",
            "--pid",
            NO_PID,
            "--probes",
            "off",
            "--duration",
            "50ms",
        ],
        &[
            "snapshot",
            "--pid",
            NO_PID,
            "--probes",
            "off",
            "--duration",
            "50ms",
            "--json",
        ],
        &["doctor"],
        &["doctor", "--json"],
        &["config", "check", "--config", config],
        &["completions", "bash"],
        &["report", "--addr", &addr, "--out", report],
        &["generate", "completions", "--out-dir", out_dir],
        &["generate", "man", "--out-dir", out_dir],
        &["--help"],
        &["status", "--help"],
        &["--version"],
    ] {
        quiet_on_a_closed_pipe(args);
    }
}

#[test]
fn logs_to_a_file_carry_no_colour_codes() {
    let scratch = ScratchDir::new("log-colour");
    let log = scratch.join("agent.log");
    let agent = AgentProcess::start(
        agent_exe(),
        &["--pid", NO_PID, "--no-socket", "--probes", "off"],
        log.clone(),
    );
    agent.wait_snapshot("the agent to answer", |_| Some(()));
    let text = wait_for(
        TIMEOUT,
        "the agent to log that it serves",
        || {
            let text = agent.log();
            text.contains("serving").then_some(text)
        },
        || agent.log(),
    );
    assert!(
        !text.contains('\u{1b}'),
        "escape codes in a log written to a file:\n{text:?}"
    );
    // The same for a log on a pipe.
    let mut child = Command::new(agent_exe())
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--pid",
            NO_PID,
            "--no-socket",
            "--probes",
            "off",
        ])
        .env("SUBETHA_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run subetha-agent run");
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stderr.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(first.contains("INFO"), "a line was logged: {first:?}");
    assert!(!first.contains('\u{1b}'), "escape codes on a pipe: {first:?}");
}

#[test]
fn status_summarises_storms_and_storms_has_the_evidence() {
    let scratch = ScratchDir::new("status-summary");
    let mut workload = Workload::spawn(
        WORKLOAD,
        &[
            "run",
            "--threads",
            "2",
            "--rate",
            "2000",
            "--burst",
            "20000",
            "--burst-every-ms",
            "200",
        ],
        &[],
    );
    let pid = workload.pid().to_string();
    let agent = AgentProcess::start(
        agent_exe(),
        &["--pid", &pid, "--no-socket", "--probes", "off"],
        scratch.join("agent.log"),
    );
    assert!(workload.cmd("go").is_empty());
    // Enough storms, with causes, that the summary must cut.
    let snapshot = agent.wait_snapshot("a dozen storms with causes", |s| {
        let with_cause = s.storms.iter().filter(|s| s.cause.is_some()).count();
        (s.storms.len() > 11 && with_cause > 0).then(|| s.clone())
    });
    let addr = agent.addr().to_string();
    let text = |args: &[&str]| {
        let output = run_agent(args);
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let status = text(&["status", "--addr", &addr]);
    let storms = text(&["storms", "--addr", &addr]);
    let storm_lines: Vec<&str> = status
        .lines()
        .filter(|l| l.trim_start().starts_with('#'))
        .collect();
    assert_eq!(storm_lines.len(), 10, "the ten newest, one line each:\n{status}");
    assert!(
        status.contains("older") && status.contains("subetha-agent storms"),
        "says there is more, and where:\n{status}"
    );
    assert!(
        !status.contains("confidence") && !status.lines().any(|l| l.trim_start().starts_with("- ")),
        "no evidence in the summary:\n{status}"
    );
    assert!(status.contains(&format!("process {pid} ")), "{status}");
    // `storms` has every storm it had then, with causes and evidence.
    assert!(
        storms.lines().filter(|l| l.trim_start().starts_with('#')).count() >= snapshot.storms.len(),
        "{storms}"
    );
    assert!(storms.contains("confidence): "), "{storms}");
    assert!(
        storms.lines().any(|l| l.trim_start().starts_with("- ")),
        "evidence lines:\n{storms}"
    );
    // Newest first in the CLI, as its help says (text and JSON); oldest
    // first in the JSON API and the snapshot, as theirs say.
    let ids = |text: &str| -> Vec<u64> {
        text.lines()
            .filter_map(|l| l.trim_start().strip_prefix('#'))
            .filter_map(|l| l.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .collect()
    };
    let descending = |ids: &[u64]| ids.len() > 1 && ids.windows(2).all(|w| w[0] > w[1]);
    assert!(
        descending(&ids(&status)),
        "status newest first: {:?}",
        ids(&status)
    );
    assert!(
        descending(&ids(&storms)),
        "storms newest first: {:?}",
        ids(&storms)
    );
    let json_ids = |body: &str| -> Vec<u64> {
        let storms: serde_json::Value = serde_json::from_str(body).expect("storms JSON");
        storms
            .as_array()
            .expect("an array")
            .iter()
            .map(|s| s["id"].as_u64().expect("id"))
            .collect()
    };
    let cli_json = json_ids(&text(&["storms", "--addr", &addr, "--json"]));
    assert!(descending(&cli_json), "storms --json newest first: {cli_json:?}");
    let api =
        json_ids(&subetha_agent::client::get(agent.addr(), "/api/v1/storms").expect("GET /api/v1/storms"));
    assert!(
        api.len() > 1 && api.windows(2).all(|w| w[0] < w[1]),
        "the API oldest first: {api:?}"
    );
    drop(workload);
}

#[test]
fn doctor_says_nothing_about_memlock_when_the_probes_load() {
    let output = Command::new(agent_exe())
        .args(["doctor", "--json"])
        .env("SUBETHA_LOG", "info")
        .output()
        .expect("run subetha-agent doctor");
    assert!(output.status.success(), "{output:?}");
    let checks: serde_json::Value = serde_json::from_slice(&output.stdout).expect("doctor's JSON");
    let probes = checks
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "probes"))
        .expect("a probes check")
        .clone();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if probes["detail"].as_str().is_some_and(|d| d.starts_with("loaded")) {
        assert!(
            !stderr.contains("RLIMIT_MEMLOCK"),
            "the probes loaded, so the memlock limit did not matter:\n{stderr}"
        );
    } else {
        eprintln!("probes did not load here ({probes}); only the loaded case is checked");
    }
}
