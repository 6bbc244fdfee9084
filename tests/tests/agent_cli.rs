//! The real `subetha-agent` binary at its edges: bad command lines and a
//! busy port fail fast with a clear message and a non-zero exit; `status`
//! against a closed port says nobody answers; SIGTERM stops `run` cleanly
//! (exit 0); and the registration socket attaches a new process at once,
//! with `/proc` discovery slowed to once a minute so it cannot explain it.
//!
//! Every `run` is limited with `--pid` (a pid that cannot exist, where the
//! test needs none) and `--socket`/`--no-socket`, so an argument that is
//! wrongly accepted cannot make the agent drain other processes.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use subetha_tests::agent::{
    AgentProcess, ScratchDir, SegmentProbe, Workload, agent_exe, free_port, process, run_agent,
};
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");
/// Above the kernel's pid_max: no such process.
const NO_PID: &str = "4194305";

/// Asserts `args` fail with a non-zero exit and `phrases` in stderr.
fn fails_with(args: &[&str], phrases: &[&str]) {
    let output = run_agent(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{args:?} must fail; stderr:\n{stderr}");
    for phrase in phrases {
        assert!(
            stderr.contains(phrase),
            "{args:?}: stderr should name the problem ({phrase:?}):\n{stderr}"
        );
    }
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    assert!(
        stderr.len() < 4096,
        "{args:?}: a short message, not a wall:\n{stderr}"
    );
}

#[test]
fn bad_command_lines_fail_with_clear_errors() {
    let listen = format!("127.0.0.1:{}", free_port());
    let safe = ["--pid", NO_PID, "--no-socket", "--listen", listen.as_str()];
    let run = |extra: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(safe.iter().map(|s| s.to_string()));
        args
    };
    let check = |args: Vec<String>, phrases: &[&str]| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&refs, phrases);
    };
    fails_with(&["frobnicate"], &["frobnicate"]);
    fails_with(&[], &["Usage"]);
    check(run(&["--frobnicate"]), &["--frobnicate"]);
    fails_with(
        &["run", "--pid", NO_PID, "--no-socket", "--listen", "not-an-addr"],
        &["not-an-addr", "--listen"],
    );
    check(run(&["--max-scan-interval", "0s"]), &["--max-scan-interval"]);
    check(
        run(&["--min-scan-interval", "10ms", "--max-scan-interval", "1ms"]),
        &["--min-scan-interval", "--max-scan-interval"],
    );
    check(
        run(&["--max-scan-interval", "soon"]),
        &["soon", "--max-scan-interval"],
    );
    check(run(&["--discovery-interval", "0s"]), &["interval"]);
    check(run(&["--pid", "-3"]), &["-3"]);
    fails_with(
        &[
            "run",
            "--pid",
            NO_PID,
            "--socket",
            "/tmp/x.sock",
            "--no-socket",
            "--listen",
            &listen,
        ],
        &["--socket", "--no-socket"],
    );
    fails_with(&["snapshot", "--duration", "forever"], &["forever"]);
}

#[test]
fn busy_port_fails_fast_and_names_it() {
    let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = busy.local_addr().unwrap().to_string();
    agent_exe(); // built before the clock starts
    let started = Instant::now();
    fails_with(
        &["run", "--pid", NO_PID, "--no-socket", "--listen", &addr],
        &[&format!("cannot listen on {addr}"), "in use"],
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a busy port fails fast"
    );
}

#[test]
fn status_against_a_closed_port_fails_clearly() {
    let addr = format!("127.0.0.1:{}", free_port());
    fails_with(
        &["status", "--addr", &addr],
        &[&format!("no agent answering on {addr}")],
    );
    fails_with(
        &["storms", "--addr", &addr],
        &[&format!("no agent answering on {addr}")],
    );
}

#[test]
fn sigterm_stops_a_running_agent_with_exit_0() {
    let scratch = ScratchDir::new("agent-sigterm");
    let socket = scratch.join("agent.sock");
    let socket = socket.to_str().unwrap();
    let mut workload = Workload::spawn(WORKLOAD, &["run", "--threads", "1", "--rate", "1000"], &[]);
    let pid = workload.pid();
    let pid_arg = pid.to_string();
    let mut agent = AgentProcess::start(
        agent_exe(),
        &[
            "--pid",
            &pid_arg,
            "--socket",
            socket,
            "--discovery-interval",
            "50ms",
        ],
        scratch.join("agent.log"),
    );
    let probe = SegmentProbe::open(pid);
    probe.wait_lease(agent.pid(), "the agent takes over");
    assert!(std::path::Path::new(socket).exists(), "registration socket bound");
    // Running for a while (see `sigterm_right_after_the_port_opens` for
    // the start-up window).
    let scans = agent.wait_snapshot("a first scan", |s| (s.agent.scans > 0).then_some(s.agent.scans));
    agent.wait_snapshot("50 more scans", |s| (s.agent.scans >= scans + 50).then_some(()));
    agent.signal(libc::SIGTERM);
    let started = Instant::now();
    let status = agent.wait_exit(Duration::from_secs(5));
    assert!(
        status.success(),
        "SIGTERM → exit 0, got {status}; log:\n{}",
        agent.log()
    );
    eprintln!("SIGTERM → exit in {:?}", started.elapsed());
    assert!(!std::path::Path::new(socket).exists(), "socket removed on exit");
    probe.wait_lease(pid, "the lease handed back to the sidecar");
    workload.stop();
}

#[test]
fn sigterm_right_after_the_port_opens_exits_0() {
    let scratch = ScratchDir::new("agent-sigterm-early");
    for round in 0..3 {
        let mut agent = AgentProcess::start(
            agent_exe(),
            &["--pid", NO_PID, "--no-socket"],
            scratch.join(&format!("agent-{round}.log")),
        );
        // Ready, as a supervisor's port check sees it.
        let addr = agent.addr();
        wait_for(
            TIMEOUT,
            "the port to accept connections",
            || std::net::TcpStream::connect(addr).ok(),
            || agent.log(),
        );
        agent.signal(libc::SIGTERM);
        let status = agent.wait_exit(Duration::from_secs(5));
        assert!(
            status.success(),
            "round {round}: SIGTERM once the port accepts connections → exit 0, got {status}; log:\n{}",
            agent.log()
        );
    }
}

#[test]
fn registration_socket_attaches_a_new_process_at_once() {
    let scratch = ScratchDir::new("agent-registration");
    let socket = scratch.join("agent.sock");
    let socket = socket.to_str().unwrap();
    // The workload exists but has no segment yet: the agent's first /proc
    // scan (at start) finds nothing, and the next is a minute away.
    let mut workload = Workload::spawn(
        WORKLOAD,
        &["run", "--threads", "2", "--rate", "2000", "--hold"],
        &[("SUBETHA_AGENT_SOCKET", socket)],
    );
    let pid = workload.pid();
    let pid_arg = pid.to_string();
    let mut agent = AgentProcess::start(
        agent_exe(),
        &[
            "--pid",
            &pid_arg,
            "--socket",
            socket,
            "--discovery-interval",
            "60s",
        ],
        scratch.join("agent.log"),
    );
    agent.wait_snapshot("the agent to serve", |s| (s.agent.scans > 0).then_some(()));
    wait_for(
        TIMEOUT,
        "the registration socket",
        || std::os::unix::net::UnixStream::connect(socket).ok(),
        || agent.log(),
    );
    let started = Instant::now();
    workload.cmd("register");
    let probe = SegmentProbe::open(pid);
    let agent_pid = agent.pid();
    wait_for(
        Duration::from_secs(10),
        "the agent to take the lease",
        || (probe.lease_pid() == agent_pid).then_some(()),
        || format!("lease pid {}; log:\n{}", probe.lease_pid(), agent.log()),
    );
    let attached_in = started.elapsed();
    eprintln!("registered → lease taken in {attached_in:?}");
    assert!(
        attached_in < Duration::from_secs(2),
        "attached {attached_in:?} after registering (discovery alone would take up to 60 s)"
    );
    let report = agent.wait_snapshot("the agent to report it attached", |s| {
        process(s, pid).filter(|p| p.state == "attached").cloned()
    });
    assert_eq!(report.instances.len(), 3, "{report:#?}");
    workload.stop();
    agent.signal(libc::SIGINT);
    assert!(agent.wait_exit(Duration::from_secs(10)).success());
}

#[test]
fn pid_filter_applies_to_registrations_too() {
    let scratch = ScratchDir::new("agent-registration-filter");
    let socket = scratch.join("agent.sock");
    let socket = socket.to_str().unwrap();
    let mut agent = AgentProcess::start(
        agent_exe(),
        &["--pid", NO_PID, "--socket", socket, "--discovery-interval", "60s"],
        scratch.join("agent.log"),
    );
    agent.wait_snapshot("the agent to serve", |_| Some(()));
    wait_for(
        TIMEOUT,
        "the registration socket",
        || std::os::unix::net::UnixStream::connect(socket).ok(),
        || agent.log(),
    );
    // A process outside `--pid` announces itself.
    let mut workload = Workload::spawn(
        WORKLOAD,
        &["run", "--threads", "1", "--rate", "1000"],
        &[("SUBETHA_AGENT_SOCKET", socket)],
    );
    let pid = workload.pid();
    let probe = SegmentProbe::open(pid);
    // Give the agent every chance to (wrongly) attach: 50 scans.
    let scans = agent.wait_snapshot("a first scan", |s| Some(s.agent.scans));
    agent.wait_snapshot("50 more scans", |s| (s.agent.scans >= scans + 50).then_some(()));
    let snapshot = agent.snapshot().expect("snapshot");
    assert!(
        process(&snapshot, pid).is_none() && probe.lease_pid() == pid,
        "the agent was told `--pid {NO_PID}` but attached registered pid {pid}: lease pid {}, {:#?}",
        probe.lease_pid(),
        snapshot.processes
    );
    workload.stop();
    agent.signal(libc::SIGINT);
    assert!(agent.wait_exit(Duration::from_secs(10)).success());
}
