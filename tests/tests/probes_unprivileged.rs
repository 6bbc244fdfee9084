//! The agent without the privileges the eBPF probes need.
//!
//! The real `subetha-agent` binary runs as `nobody` (uid/gid 65534, no
//! supplementary groups; when the test itself is not root it simply runs as
//! the test's user) against a `subetha-flood` producer of the same user
//! (`SUBETHA_SIDECAR=off`, so only the agent drains):
//!
//! * `snapshot --probes auto` prints one clear warning that the probes are
//!   unavailable and why, exits 0, and its JSON shows the flood attached and
//!   drained (`drained > 0`) with `agent.probes` saying `unavailable: ...`;
//! * `snapshot --probes on` refuses to start: a non-zero exit and an error
//!   naming `--probes on` and the load failure, no panic.
//!
//! Both binaries are copied into a fresh scratch directory (mode 755) so
//! `nobody` can execute them whatever the permissions on the target
//! directory: an unreadable executable would also make the flood
//! non-dumpable, and then not even its own user could open its segment
//! through `/proc/<pid>/fd`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use subetha_agent::AgentSnapshot;
use subetha_tests::agent::{ScratchDir, agent_exe, process};
use subetha_tests::getuid;

const FLOOD: &str = env!("CARGO_BIN_EXE_subetha-flood");
/// `nobody`/`nogroup`.
const NOBODY: u32 = 65534;

/// Who the unprivileged processes run as: `nobody` when the test is root,
/// else the test's own (already unprivileged) user.
fn unprivileged(command: &mut Command) -> &mut Command {
    if getuid() == 0 {
        // std drops supplementary groups (setgroups(0)) before setuid when
        // running as root, then sets the real, effective and saved ids.
        command.uid(NOBODY).gid(NOBODY);
    }
    command
}

/// Copies `exe` into `dir` with mode 755.
fn installed(exe: &Path, dir: &ScratchDir) -> PathBuf {
    let name = exe.file_name().expect("file name").to_str().expect("utf-8");
    let copy = dir.join(name);
    std::fs::copy(exe, &copy).unwrap_or_else(|e| panic!("copy {}: {e}", exe.display()));
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod 755");
    copy
}

/// Spawns `command`, retrying while the kernel answers ETXTBSY: the copy
/// `installed` just wrote can still be open for writing in a child another
/// test thread forked meanwhile (until that child execs and closes it).
fn spawn_fresh_copy(command: &mut Command, exe: &Path) -> Child {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match command.spawn() {
            Ok(child) => return child,
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("spawn {} unprivileged: {e}", exe.display()),
        }
    }
}

/// A `subetha-flood` running unprivileged.
struct Flood {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pid: u32,
}

impl Flood {
    fn spawn(exe: &Path, args: &[&str]) -> Self {
        let mut command = Command::new(exe);
        command
            .args(args)
            .current_dir("/")
            .env("SUBETHA_SIDECAR", "off")
            .env("SUBETHA_AGENT_SOCKET", "/nonexistent/subetha-test.sock")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = spawn_fresh_copy(unprivileged(&mut command), exe);
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut flood = Self {
            child,
            stdin,
            stdout,
            pid: 0,
        };
        let ready = flood.line();
        flood.pid = ready
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("flood said {ready:?}"));
        flood
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("read the flood");
        assert!(n > 0, "the flood exited: {:?}", self.child.try_wait());
        line.trim_end().to_owned()
    }

    fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "go")
            .and_then(|()| stdin.flush())
            .expect("send go");
        let line = self.line();
        assert!(line.starts_with("flooding "), "flood said {line:?}");
    }

    /// Its ground truth line, and a clean exit.
    fn finish(&mut self) -> serde_json::Value {
        let line = self.line();
        let truth: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("flood truth {line:?}: {e}"));
        let status = self.child.wait().expect("wait for the flood");
        assert!(status.success(), "flood exit {status}");
        truth
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the agent unprivileged with `args`; fails if it runs over 30 s.
fn agent(exe: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(exe);
    command
        .args(args)
        .current_dir("/")
        .env("SUBETHA_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn_fresh_copy(unprivileged(&mut command), exe);
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("collect output");
            panic!(
                "subetha-agent {args:?} still running after 30 s; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("collect output")
}

/// `text` without ANSI escape sequences (in case the log is coloured).
fn plain(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte (0x40..=0x7e).
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What one unprivileged `snapshot --probes auto` saw of a flood.
struct Run {
    scratch: ScratchDir,
    agent_exe: PathBuf,
    flood: Flood,
    output: Output,
    stderr: String,
}

/// Starts an unprivileged flood and runs an unprivileged `snapshot --probes
/// auto` against it (the flood keeps pushing for 2 s after it).
fn snapshot_unprivileged(test: &str) -> Run {
    let scratch = ScratchDir::new(test);
    std::fs::set_permissions(scratch.join(""), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the scratch dir");
    let agent_exe = installed(agent_exe(), &scratch);
    let flood_exe = installed(Path::new(FLOOD), &scratch);
    let mut flood = Flood::spawn(&flood_exe, &["--rate", "200000", "--duration-ms", "4000"]);
    let pid = flood.pid.to_string();
    flood.go();
    let output = agent(
        &agent_exe,
        &[
            "snapshot",
            "--duration",
            "2s",
            "--json",
            "--probes",
            "auto",
            "--pid",
            &pid,
            "--discovery-interval",
            "100ms",
        ],
    );
    let stderr = plain(&output.stderr);
    eprintln!("--- {test}: unprivileged `snapshot --probes auto` stderr ---\n{stderr}");
    assert!(
        output.status.success(),
        "snapshot --probes auto as uid {} exited with {}:\n{stderr}",
        if getuid() == 0 { NOBODY } else { getuid() },
        output.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    Run {
        scratch,
        agent_exe,
        flood,
        output,
        stderr,
    }
}

impl Run {
    fn snapshot(&self) -> AgentSnapshot {
        let stdout = String::from_utf8_lossy(&self.output.stdout);
        serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("snapshot JSON: {e}\n{stdout}\n--- stderr ---\n{}", self.stderr))
    }
}

#[test]
fn unprivileged_agent_warns_and_keeps_draining() {
    let mut run = snapshot_unprivileged("probes-unprivileged");
    let stderr = &run.stderr;
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("eBPF probes unavailable"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one clear warning that the probes are unavailable:\n{stderr}"
    );
    assert!(
        warnings[0].contains("loading the eBPF probes failed"),
        "the warning says why: {}",
        warnings[0]
    );
    let snapshot = run.snapshot();
    assert!(
        snapshot.agent.probes.starts_with("unavailable: "),
        "agent.probes: {:?}",
        snapshot.agent.probes
    );
    let pid = run.flood.pid;
    let report = process(&snapshot, pid)
        .unwrap_or_else(|| panic!("the flood (pid {pid}) is not in the snapshot: {snapshot:#?}\n{stderr}"));
    assert!(
        report.drained > 0,
        "the agent drained nothing: {report:#?}\n{stderr}"
    );
    assert_eq!(report.note, None, "{report:#?}");
    assert_eq!(report.storms, snapshot.storms.len() as u64, "{snapshot:#?}");
    if getuid() == 0 {
        assert_eq!(report.uid, NOBODY, "{report:#?}");
    }
    eprintln!(
        "unprivileged agent: pid {pid} {} — drained {} dropped {}; probes {:?}",
        report.state, report.drained, report.dropped, snapshot.agent.probes
    );

    // On: refuses to start, and says why.
    let pid = pid.to_string();
    let output = agent(
        &run.agent_exe,
        &[
            "snapshot",
            "--duration",
            "1s",
            "--json",
            "--probes",
            "on",
            "--pid",
            &pid,
        ],
    );
    let stderr = plain(&output.stderr);
    eprintln!("--- unprivileged `snapshot --probes on` stderr ---\n{stderr}");
    assert!(
        !output.status.success(),
        "--probes on without privileges must fail:\n{stderr}"
    );
    assert!(
        stderr.contains("--probes on") && stderr.contains("loading the eBPF probes failed"),
        "the error names the option and the failure:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        output.stdout.is_empty(),
        "no snapshot printed: {:?}",
        output.stdout
    );

    let truth = run.flood.finish();
    eprintln!("flood truth: {truth}");
    drop(run.scratch);
}

#[test]
fn unprivileged_snapshot_shows_the_flood_attached() {
    let mut run = snapshot_unprivileged("probes-unprivileged-state");
    let snapshot = run.snapshot();
    let report = process(&snapshot, run.flood.pid).expect("the flood in the snapshot");
    assert!(report.drained > 0, "{report:#?}");
    assert_eq!(
        report.state, "attached",
        "`snapshot` drained the flood for its whole duration: {report:#?}"
    );
    run.flood.finish();
}
