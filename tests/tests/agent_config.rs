//! The real `subetha-agent` binary with a config file: an unknown key or a
//! bad value fails with the key and the file named; a value from the file
//! is used; a flag given on the command line beats the file while a flag's
//! built-in default does not; a missing `--config` file is an error; and
//! `config check` prints the effective settings with where each came from,
//! in a form that reads back as a config file.
//!
//! Every `run` is limited to a pid that cannot exist and has no
//! registration socket, so it drains nothing of other tests.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use subetha_tests::agent::{ScratchDir, agent_exe, free_port, run_agent};
use subetha_tests::{TIMEOUT, wait_for};

/// Above the kernel's pid_max: no such process.
const NO_PID: u32 = 4_194_305;

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .expect("write the config file");
    path.to_path_buf()
}

/// Asserts `args` fail, naming every phrase, briefly and without a panic.
fn fails_naming(args: &[&str], phrases: &[&str]) {
    let output = run_agent(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{args:?} must fail; stderr:\n{stderr}");
    for phrase in phrases {
        assert!(
            stderr.contains(phrase),
            "{args:?}: stderr should name {phrase:?}:\n{stderr}"
        );
    }
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    assert!(stderr.len() < 4096, "a short message, not a wall:\n{stderr}");
}

/// A `run` in the background, SIGKILLed on drop if still running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Running {
    fn start(args: &[&str], log: &Path) -> Self {
        let child = Command::new(agent_exe())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("create the log"))
            .spawn()
            .expect("spawn subetha-agent run");
        Self(child)
    }

    /// Waits until `port` answers the JSON API (or the agent exits: fail).
    fn wait_serving(&mut self, port: u16, log: &Path) {
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_for(
            TIMEOUT,
            format!("the agent serving on port {port}"),
            || {
                if let Some(status) = self.0.try_wait().expect("try_wait") {
                    panic!(
                        "the agent exited ({status}):\n{}",
                        std::fs::read_to_string(log).unwrap_or_default()
                    );
                }
                subetha_agent::client::get(addr, "/api/v1/snapshot").ok()
            },
            || std::fs::read_to_string(log).unwrap_or_default(),
        );
    }

    /// SIGTERM, then a clean exit.
    fn stop(mut self, log: &Path) {
        // SAFETY: kill on our own, not yet reaped, child.
        let rc = unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
        let status = wait_for(
            TIMEOUT,
            "the agent to exit after SIGTERM",
            || self.0.try_wait().expect("try_wait"),
            || std::fs::read_to_string(log).unwrap_or_default(),
        );
        assert!(
            status.success(),
            "exit {status}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
}

#[test]
fn unknown_keys_and_bad_values_fail_naming_key_and_file() {
    let dir = ScratchDir::new("config-errors");
    let typo = write(
        &dir.join("typo.toml"),
        "listen = \"127.0.0.1:1\"\nmax_scan_intervall = \"5ms\"\n",
    );
    let typo = typo.to_str().unwrap();
    fails_naming(
        &["run", "--config", typo],
        &["max_scan_intervall", typo, "unknown field"],
    );
    fails_naming(
        &["config", "check", "--config", typo],
        &["max_scan_intervall", typo],
    );

    let bad = write(&dir.join("bad.toml"), "retention = \"soon\"\n");
    let bad = bad.to_str().unwrap();
    fails_naming(&["config", "check", "--config", bad], &["retention", "soon", bad]);

    // Validation of a value that parses names the key and the file too.
    let zero = write(&dir.join("zero.toml"), "max_scan_interval = \"0s\"\n");
    let zero = zero.to_str().unwrap();
    fails_naming(
        &[
            "run",
            "--config",
            zero,
            "--pid",
            &NO_PID.to_string(),
            "--no-socket",
        ],
        &[&format!(
            "max_scan_interval (in {zero}) must be greater than zero"
        )],
    );

    let missing = dir.join("missing.toml");
    let missing = missing.to_str().unwrap();
    fails_naming(&["run", "--config", missing], &[missing]);
}

#[test]
fn run_uses_the_file_and_a_given_flag_overrides_it() {
    let dir = ScratchDir::new("config-run");
    let log = dir.join("agent.log");

    // The file's address is used when no --listen is given.
    let port = free_port();
    let config = write(
        &dir.join("agent.toml"),
        &format!("listen = \"127.0.0.1:{port}\"\npids = [{NO_PID}]\nno_socket = true\nprobes = \"off\"\n"),
    );
    let config = config.to_str().unwrap();
    let mut agent = Running::start(&["run", "--config", config], &log);
    agent.wait_serving(port, &log);
    agent.stop(&log);

    // The file now names a port that is busy: only an override lets `run`
    // start, and it serves on the flag's port.
    let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy_port = busy.local_addr().unwrap().port();
    write(
        Path::new(config),
        &format!(
            "listen = \"127.0.0.1:{busy_port}\"\npids = [{NO_PID}]\nno_socket = true\nprobes = \"off\"\n"
        ),
    );
    fails_naming(
        &["run", "--config", config],
        &[&format!("cannot listen on 127.0.0.1:{busy_port}")],
    );
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = Running::start(&["run", "--config", config, "--listen", &listen], &log);
    agent.wait_serving(port, &log);
    agent.stop(&log);
}

#[test]
fn config_check_prints_the_effective_settings_and_their_origins() {
    let dir = ScratchDir::new("config-check");
    let config = write(
        &dir.join("agent.toml"),
        "retention = \"90s\"\nmax_scan_interval = \"5ms\"\nprobes = \"off\"\nlog_format = \"json\"\n",
    );
    let config = config.to_str().unwrap();
    let output = run_agent(&[
        "config",
        "check",
        "--config",
        config,
        "--max-scan-interval",
        "7ms",
        "--pid",
        "3",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "config check failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        format!("# effective `run` settings; config file {config}"),
        "retention = \"1m 30s\"  # config file".to_string(),
        "max_scan_interval = \"7ms\"  # command line (--max-scan-interval)".to_string(),
        "pids = [3]  # command line (--pid)".to_string(),
        "probes = \"off\"  # config file".to_string(),
        "log_format = \"json\"  # config file".to_string(),
        "min_scan_interval = \"100us\"  # default".to_string(),
        "listen = \"127.0.0.1:9464\"  # default".to_string(),
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing line {line:?} in:\n{stdout}"
        );
    }
    // The global --log-format beats the file's.
    let output = run_agent(&["--log-format", "text", "config", "check", "--config", config]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("log_format = \"text\"  # command line (--log-format)"),
        "{stdout}"
    );

    // What it prints is itself a valid config with the same values.
    let printed = write(
        &dir.join("printed.toml"),
        &String::from_utf8_lossy(
            &run_agent(&[
                "config",
                "check",
                "--config",
                config,
                "--max-scan-interval",
                "7ms",
                "--pid",
                "3",
            ])
            .stdout,
        ),
    );
    let output = run_agent(&["config", "check", "--config", printed.to_str().unwrap()]);
    let again = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "retention = \"1m 30s\"  # config file",
        "max_scan_interval = \"7ms\"  # config file",
        "pids = [3]  # config file",
    ] {
        assert!(again.lines().any(|l| l == line), "missing {line:?} in:\n{again}");
    }
}
