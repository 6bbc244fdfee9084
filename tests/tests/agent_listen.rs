//! Who can read a running agent, tested on the real binary: `run --listen`
//! beyond loopback logs a loud WARN (and on loopback does not);
//! `--auth-token-file` makes every request but `/healthz` answer 401
//! without `Authorization: Bearer <token>` and 200 with it (curl); `--listen
//! unix:PATH` serves on a socket of mode 0600 that curl `--unix-socket`
//! reaches and that is gone after shutdown; and the client commands
//! (`status`, `storms`, `top`) reach an agent with a token on the socket.
//!
//! curl (and tmux for `top`) are needed: without them these tests skip
//! loudly, unless `SUBETHA_REQUIRE_TOOLS=1`.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use subetha_tests::agent::{ScratchDir, Workload, agent_exe, free_port};
use subetha_tests::tmux::Tmux;
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");
/// Above the kernel's pid_max: no such process.
const NO_PID: &str = "4194305";
const TOKEN: &str = "a-test-token-0123456789abcdef";

/// `subetha-agent run --listen <listen> <args>`, its stderr in a file;
/// SIGTERMed (then killed) on drop.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn start(listen: &str, args: &[&str], log: PathBuf) -> Self {
        let child = Command::new(agent_exe())
            .args(["run", "--listen", listen, "--no-socket", "--probes", "off"])
            .args(args)
            .env("SUBETHA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("create the agent log"))
            .spawn()
            .expect("spawn subetha-agent");
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log has `line`.
    fn wait_log(&self, line: &str) {
        wait_for(
            TIMEOUT,
            line,
            || self.log().contains(line).then_some(()),
            || self.log(),
        );
    }

    /// SIGTERM, then waits (bounded) for the exit.
    fn stop(&mut self) {
        // SAFETY: kill on our own child's pid (not yet reaped: we hold it).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().expect("try_wait").is_none() {
            assert!(
                Instant::now() < deadline,
                "the agent did not stop:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn curl_available(test: &str) -> bool {
    let found = Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("SUBETHA_REQUIRE_TOOLS").is_none(),
            "{test}: curl is required (SUBETHA_REQUIRE_TOOLS is set) but not installed"
        );
        eprintln!("\n*** SKIPPING {test}: curl is not installed (apt-get install curl) ***\n");
    }
    found
}

/// `curl -s <args> URL`: (HTTP status, body).
fn curl(args: &[&str], url: &str) -> (u16, String) {
    let output = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// Polls `url` until it answers anything (the agent has bound).
fn wait_answering(args: &[&str], url: &str, agent: &Agent) {
    wait_for(
        TIMEOUT,
        "the agent to answer",
        || (curl(args, url).0 != 0).then_some(()),
        || agent.log(),
    );
}

fn agent_command(args: &[&str]) -> Output {
    Command::new(agent_exe())
        .args(args)
        .env("SUBETHA_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run subetha-agent")
}

fn write_token(dir: &ScratchDir) -> PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    path
}

const BEYOND_LOOPBACK: &str = "beyond loopback, without authentication";

#[test]
fn listening_beyond_loopback_is_warned_about_and_loopback_is_not() {
    let scratch = ScratchDir::new("listen-warning");
    let port = free_port();
    let mut open = Agent::start(
        &format!("0.0.0.0:{port}"),
        &["--pid", NO_PID],
        scratch.join("open.log"),
    );
    open.wait_log("serving /metrics and /api/v1");
    open.stop();
    let log = open.log();
    let warning = log
        .lines()
        .find(|line| line.contains(BEYOND_LOOPBACK))
        .unwrap_or_else(|| panic!("no warning about 0.0.0.0:\n{log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains(&format!("0.0.0.0:{port}")), "{warning}");
    assert!(warning.contains("--auth-token-file"), "{warning}");

    let mut quiet = Agent::start(
        &format!("127.0.0.1:{}", free_port()),
        &["--pid", NO_PID],
        scratch.join("quiet.log"),
    );
    quiet.wait_log("serving /metrics and /api/v1");
    quiet.stop();
    assert!(!quiet.log().contains("beyond loopback"), "{}", quiet.log());
}

#[test]
fn a_token_is_asked_for_and_the_clients_send_it() {
    if !curl_available("a_token_is_asked_for_and_the_clients_send_it") {
        return;
    }
    let scratch = ScratchDir::new("listen-token");
    let token = write_token(&scratch);
    let token = token.to_str().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut agent = Agent::start(
        &addr,
        &["--pid", NO_PID, "--auth-token-file", token],
        scratch.join("agent.log"),
    );
    let base = format!("http://{addr}");
    wait_answering(&[], &format!("{base}/healthz"), &agent);
    // A token file others can read is warned about (this one is 0644).
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(token).unwrap().permissions());
    if mode & 0o077 != 0 {
        let log = agent.log();
        assert!(
            log.lines()
                .any(|l| l.contains("WARN") && l.contains("readable beyond its owner")),
            "{log}"
        );
    }
    // The token is not on the command line.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", agent.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(TOKEN));

    let bearer = format!("Authorization: Bearer {TOKEN}");
    for path in [
        "/metrics",
        "/api/v1/snapshot",
        "/api/v1/storms",
        "/debug/pprof/mutex",
    ] {
        let (status, body) = curl(&[], &format!("{base}{path}"));
        assert_eq!(status, 401, "{path} without a token: {body}");
        assert!(body.contains("Authorization: Bearer"), "{path}: {body}");
        let (status, _) = curl(
            &["-H", "Authorization: Bearer wrong-token-0123456789"],
            &format!("{base}{path}"),
        );
        assert_eq!(status, 401, "{path} with a wrong token");
        let (status, body) = curl(&["-H", &bearer], &format!("{base}{path}"));
        assert_eq!(status, 200, "{path} with the token: {body}");
    }
    let (status, body) = curl(&[], &format!("{base}/healthz"));
    assert_eq!(
        (status, body.starts_with("ok scans=")),
        (200, true),
        "/healthz stays open: {body}"
    );

    let without = agent_command(&["status", "--addr", &addr]);
    assert!(!without.status.success());
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert!(
        stderr.contains("401") && stderr.contains("--auth-token-file"),
        "{stderr}"
    );
    for command in ["status", "storms"] {
        let with = agent_command(&[command, "--addr", &addr, "--auth-token-file", token]);
        let stdout = String::from_utf8_lossy(&with.stdout);
        assert!(
            with.status.success(),
            "{command} with the token: {}",
            String::from_utf8_lossy(&with.stderr)
        );
        assert!(stdout.contains("storms ("), "{command}: {stdout}");
    }
    agent.stop();
}

#[test]
fn a_unix_socket_is_private_reachable_and_removed() {
    if !curl_available("a_unix_socket_is_private_reachable_and_removed") {
        return;
    }
    let scratch = ScratchDir::new("listen-unix");
    let socket = scratch.join("http.sock");
    let listen = format!("unix:{}", socket.display());
    let mut agent = Agent::start(&listen, &["--pid", NO_PID], scratch.join("agent.log"));
    let via = ["--unix-socket", socket.to_str().unwrap()];
    wait_answering(&via, "http://localhost/healthz", &agent);
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let (status, body) = curl(&via, "http://localhost/api/v1/snapshot");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"processes\""), "{body}");
    assert!(!agent.log().contains("beyond loopback"), "{}", agent.log());

    let status = agent_command(&["status", "--addr", &listen]);
    assert!(
        status.status.success(),
        "status over the socket: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(String::from_utf8_lossy(&status.stdout).starts_with("agent pid "));
    agent.stop();
    assert!(!socket.exists(), "the socket is removed at shutdown");
}

/// Runs `top` against the agent, then stays (so the screen can be read).
const TOP: &str = r#"
"$1" top --addr "$2" --auth-token-file "$3" --interval 500ms
echo "top-exited status=$?"
exec sleep 3600
"#;

#[test]
fn top_reaches_an_agent_on_a_socket_with_a_token() {
    let test = "top_reaches_an_agent_on_a_socket_with_a_token";
    if !Tmux::available(test) {
        return;
    }
    let scratch = ScratchDir::new("listen-top");
    let token = write_token(&scratch);
    let mut workload = Workload::spawn(WORKLOAD, &["run", "--threads", "1", "--rate", "2000"], &[]);
    assert!(workload.cmd("go").is_empty());
    let pid = workload.pid().to_string();
    let socket = scratch.join("http.sock");
    let listen = format!("unix:{}", socket.display());
    let token_path = token.to_str().unwrap();
    let agent = Agent::start(
        &listen,
        &["--pid", &pid, "--auth-token-file", token_path],
        scratch.join("agent.log"),
    );
    agent.wait_log("serving /metrics and /api/v1");
    let exe = agent_exe().to_str().unwrap().to_owned();
    let tmux = Tmux::start(
        "listen-top",
        160,
        45,
        &["sh", "-c", TOP, "sh", &exe, &listen, token_path],
    );
    tmux.wait_screen(
        "top to show the workload's instances",
        |screen| screen.contains("orders_lock").then_some(()),
        || agent.log(),
    );
    tmux.send_keys(&["q"]);
    tmux.wait_screen(
        "top to exit",
        |screen| screen.contains("top-exited status=0").then_some(()),
        || agent.log(),
    );
    drop(tmux);
    drop(agent);
    workload.stop();
}

/// The 401 path of `top`: without the token it says so on screen.
#[test]
fn top_without_the_token_says_what_is_missing() {
    let test = "top_without_the_token_says_what_is_missing";
    if !Tmux::available(test) {
        return;
    }
    let scratch = ScratchDir::new("listen-top-401");
    let token = write_token(&scratch);
    let addr = format!("127.0.0.1:{}", free_port());
    let agent = Agent::start(
        &addr,
        &["--pid", NO_PID, "--auth-token-file", token.to_str().unwrap()],
        scratch.join("agent.log"),
    );
    agent.wait_log("serving /metrics and /api/v1");
    let exe = agent_exe().to_str().unwrap().to_owned();
    let script = "\"$1\" top --addr \"$2\" --interval 500ms; exec sleep 3600";
    let tmux = Tmux::start(
        "listen-top-401",
        160,
        45,
        &["sh", "-c", script, "sh", &exe, &addr],
    );
    tmux.wait_screen(
        "top to show the 401",
        |screen| (screen.contains("401") && screen.contains("auth-token-file")).then_some(()),
        || agent.log(),
    );
}
