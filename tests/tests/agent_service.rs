//! `subetha-agent` as a service: the sd_notify conversation with a fake
//! service manager (a unix datagram socket the test binds), the shipped
//! systemd unit (checked with `systemd-analyze verify` and against the
//! binary's own parser), the example config, and the generated man pages
//! and completions (man pages checked with groff).
//!
//! systemd is not PID 1 on the test hosts, so the unit is verified, not
//! started. `systemd-analyze` (Debian package `systemd`) and `groff`
//! (`groff-base`) are required when `SUBETHA_REQUIRE_TOOLS=1` (CI); elsewhere
//! a missing tool skips that check with a note on stderr.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use subetha_tests::agent::{ScratchDir, agent_exe, free_port};
use subetha_tests::{TIMEOUT, wait_for};

/// Above the kernel's pid_max: no such process.
const NO_PID: &str = "4194305";

fn contrib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../subetha-agent/contrib")
}

/// `name` on PATH; `None` (skip, with a note) unless SUBETHA_REQUIRE_TOOLS=1.
fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("SUBETHA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "{name} is required (SUBETHA_REQUIRE_TOOLS=1) but not on PATH (Debian package `{package}`)"
        );
        eprintln!("SKIPPED: {name} is not installed (Debian package `{package}`)");
    }
    found
}

/// Receives notifications until one contains `wanted` (each datagram is one
/// or more `KEY=value` lines). Returns every datagram seen so far.
fn receive_until(socket: &UnixDatagram, wanted: &str, seen: &mut Vec<String>, log: &Path) {
    let deadline = Instant::now() + TIMEOUT;
    let mut buf = [0u8; 4096];
    while !seen.iter().any(|m| m.lines().any(|l| l == wanted)) {
        assert!(
            Instant::now() < deadline,
            "no {wanted} within {TIMEOUT:?}; got {seen:?}\n--- agent log ---\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        match socket.recv(&mut buf) {
            Ok(n) => seen.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("recv on the notify socket: {e}"),
        }
    }
}

#[test]
fn sd_notify_ready_status_watchdog_and_stopping() {
    let dir = ScratchDir::new("sd-notify");
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let log = dir.join("agent.log");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let config = contrib().join("agent.toml.example");
    let child = Command::new(agent_exe())
        .args(["run", "--config"])
        .arg(&config)
        .args([
            "--listen",
            &listen,
            "--pid",
            NO_PID,
            "--no-socket",
            "--probes",
            "off",
        ])
        .env("NOTIFY_SOCKET", &socket_path)
        // A ping every second while the scan thread publishes.
        .env("WATCHDOG_USEC", "2000000")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn subetha-agent run");
    let mut guard = KillOnDrop(child);

    let mut seen = Vec::new();
    receive_until(&socket, "READY=1", &mut seen, &log);
    // Ready means serving: the listener is bound before READY=1.
    let addr = listen.parse().unwrap();
    subetha_agent::client::get(addr, "/api/v1/snapshot").expect("the API answers once READY=1 is sent");
    receive_until(&socket, "WATCHDOG=1", &mut seen, &log);
    receive_until(
        &socket,
        "STATUS=draining 0 processes, 0 waiting for a lease; 0 storms recorded",
        &mut seen,
        &log,
    );
    assert!(
        !seen.iter().any(|m| m.contains("STOPPING=1")),
        "no STOPPING before the signal: {seen:?}"
    );
    let ready_count = seen
        .iter()
        .flat_map(|m| m.lines())
        .filter(|l| *l == "READY=1")
        .count();
    assert_eq!(ready_count, 1, "READY=1 is sent once: {seen:?}");

    // SAFETY: kill on our own, not yet reaped, child.
    let rc = unsafe { libc::kill(guard.0.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    receive_until(&socket, "STOPPING=1", &mut seen, &log);
    let status = wait_for(
        TIMEOUT,
        "the agent to exit after SIGTERM",
        || guard.0.try_wait().expect("try_wait"),
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    assert!(
        status.success(),
        "clean exit after SIGTERM, got {status}:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// Kills the child on drop (a failed assertion must not leak an agent).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `key=value` pairs of the unit's lines (comments and sections dropped).
fn unit_entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .map(|l| {
            let (key, value) = l.split_once('=').unwrap_or_else(|| panic!("not key=value: {l}"));
            (key.trim().to_string(), value.trim().to_string())
        })
        .collect()
}

fn unit_value<'a>(entries: &'a [(String, String)], key: &str) -> &'a str {
    let values: Vec<&str> = entries
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(values.len(), 1, "{key} set exactly once in the unit");
    values[0]
}

#[test]
fn the_systemd_unit_is_valid_and_its_command_line_parses() {
    let unit_path = contrib().join("systemd/subetha-agent.service");
    let unit = std::fs::read_to_string(&unit_path).expect("read the unit");
    let entries = unit_entries(&unit);
    assert_eq!(unit_value(&entries, "Type"), "notify");
    assert_eq!(unit_value(&entries, "RuntimeDirectory"), "subetha");
    assert_eq!(unit_value(&entries, "NoNewPrivileges"), "yes");
    let mut caps: Vec<&str> = unit_value(&entries, "CapabilityBoundingSet")
        .split_whitespace()
        .collect();
    caps.sort();
    assert_eq!(
        caps,
        [
            "CAP_BPF",
            "CAP_DAC_READ_SEARCH",
            "CAP_PERFMON",
            "CAP_SYS_ADMIN",
            "CAP_SYS_PTRACE"
        ],
        "the capabilities the agent needs and no more"
    );
    for (key, value) in &entries {
        let hides_proc =
            (key == "ProtectProc" && value != "default") || (key == "ProcSubset" && value != "all");
        let blocks_tracefs_mount = key == "ProtectKernelTunables" && value != "no";
        assert!(
            !hides_proc && !blocks_tracefs_mount,
            "{key}={value} would hide /proc or stop the tracefs mount"
        );
    }
    let exec_start = unit_value(&entries, "ExecStart");
    let words: Vec<&str> = exec_start.split_whitespace().collect();
    assert_eq!(
        words[..2],
        ["/usr/local/bin/subetha-agent", "run"],
        "{exec_start}"
    );
    let config_at = words
        .iter()
        .position(|w| *w == "--config")
        .expect("ExecStart names --config");
    assert_eq!(words[config_at + 1], "/etc/subetha/agent.toml");

    // The binary's own parser accepts ExecStart's flags (with the example
    // config standing in for /etc/subetha/agent.toml).
    let example = contrib().join("agent.toml.example");
    let mut args: Vec<String> = words[2..].iter().map(|w| w.to_string()).collect();
    args[config_at - 1] = example.display().to_string();
    let output = Command::new(agent_exe())
        .args(["config", "check"])
        .args(&args)
        .output()
        .expect("run config check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "config check {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("listen = \"127.0.0.1:9464\"  # config file"),
        "{stdout}"
    );

    // systemd's own verdict, with ExecStart pointing at the built binary
    // (verify insists it exists) and the generated man pages on MANPATH (it
    // checks Documentation=man:… too).
    let Some(analyze) = tool("systemd-analyze", "systemd") else {
        return;
    };
    let dir = ScratchDir::new("unit-verify");
    let man = dir.join("man");
    generate(&["man", "--out-dir", man.join("man1").to_str().unwrap()]);
    let copy = dir.join("subetha-agent.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/subetha-agent", agent_exe().to_str().unwrap()),
    )
    .unwrap();
    let output = Command::new(analyze)
        .arg("verify")
        .arg(&copy)
        .env("MANPATH", &man)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .expect("run systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        output.status
    );
}

fn generate(args: &[&str]) {
    let output = Command::new(agent_exe())
        .arg("generate")
        .args(args)
        .output()
        .expect("run generate");
    assert!(
        output.status.success(),
        "generate {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn generated_man_pages_and_completions() {
    let dir = ScratchDir::new("generate");
    let man = dir.join("man1");
    generate(&["man", "--out-dir", man.to_str().unwrap()]);
    let mut pages: Vec<String> = std::fs::read_dir(&man)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    let expected = [
        "subetha-agent-completions.1",
        "subetha-agent-config-check.1",
        "subetha-agent-config.1",
        "subetha-agent-doctor.1",
        "subetha-agent-profile.1",
        "subetha-agent-report.1",
        "subetha-agent-run.1",
        "subetha-agent-snapshot.1",
        "subetha-agent-status.1",
        "subetha-agent-storms.1",
        "subetha-agent-top.1",
        "subetha-agent.1",
    ];
    assert_eq!(
        pages, expected,
        "a page per visible (sub)command, none for `generate`"
    );
    for page in &pages {
        let text = std::fs::read_to_string(man.join(page)).unwrap();
        assert!(
            text.starts_with(".ie") || text.contains("\n.TH "),
            "{page} has no .TH"
        );
    }
    let main_page = std::fs::read_to_string(man.join("subetha-agent.1")).unwrap();
    assert!(
        main_page.contains("/etc/subetha/agent.toml"),
        "the main page documents the config file"
    );
    let run_page = std::fs::read_to_string(man.join("subetha-agent-run.1")).unwrap();
    for flag in [
        "config",
        "max\\-scan\\-interval",
        "otlp\\-endpoint",
        "no\\-socket",
    ] {
        assert!(run_page.contains(flag), "run's page documents --{flag}");
    }

    if let Some(groff) = tool("groff", "groff-base") {
        for page in &pages {
            let output = Command::new(&groff)
                .args(["-man", "-Tutf8", "-ww", "-z"])
                .arg(man.join(page))
                .output()
                .expect("run groff");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success() && stderr.trim().is_empty(),
                "groff on {page}: {}\n{stderr}",
                output.status
            );
        }
    }

    let completions = dir.join("completions");
    generate(&["completions", "--out-dir", completions.to_str().unwrap()]);
    for (file, marker) in [
        ("subetha-agent.bash", "complete -F"),
        ("_subetha-agent", "#compdef subetha-agent"),
        ("subetha-agent.fish", "complete -c subetha-agent"),
    ] {
        let text = std::fs::read_to_string(completions.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(marker), "{file} lacks {marker:?}");
        assert!(text.contains("max-scan-interval"), "{file} completes run's flags");
        assert!(
            !text.contains("out-dir"),
            "{file} leaks the hidden generate command"
        );
    }
}
