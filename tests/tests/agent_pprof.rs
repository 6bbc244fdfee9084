//! Contention profiles end to end: a workload takes one mutex at two call
//! sites (one holding it 1 ms, one taking it briefly); the agent's
//! `/debug/pprof/mutex` names the holding line first, `/debug/pprof/block`
//! the waiting line, with the wait total within 10% of the workload's own
//! measurement; and `go tool pprof -top` reads both (Debian `golang-go`,
//! required when `SUBETHA_REQUIRE_TOOLS=1`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;

use subetha_agent::pprof::{self, Profile};
use subetha_tests::agent::{AgentProcess, ScratchDir, SegmentProbe, Workload, agent_exe};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

/// GET `path`, the raw body (the agent's client answers text only).
fn get_bytes(addr: SocketAddr, path: &str) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).expect("connect to the agent");
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP response");
    let head = String::from_utf8_lossy(&response[..split]);
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    response[split + 4..].to_vec()
}

/// (leaf frame name, contentions, delay ns) per sample, by delay, largest first.
fn ranked(p: &Profile) -> Vec<(String, i64, i64)> {
    let mut rows: Vec<(String, i64, i64)> = p
        .sample
        .iter()
        .map(|s| {
            let loc = p.location.iter().find(|l| l.id == s.location_id[0]).unwrap();
            let f = p
                .function
                .iter()
                .find(|f| f.id == loc.line[0].function_id)
                .unwrap();
            (p.string_table[f.name as usize].clone(), s.value[0], s.value[1])
        })
        .collect();
    rows.sort_by_key(|r| -r.2);
    rows
}

fn go() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("go"))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("SUBETHA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "go is required (SUBETHA_REQUIRE_TOOLS=1) but not on PATH (Debian package `golang-go`)"
        );
        eprintln!("SKIPPED: go tool pprof: go is not installed (Debian package `golang-go`)");
    }
    found
}

#[test]
fn profiles_name_the_holding_and_the_waiting_line_with_the_measured_waits() {
    let scratch = ScratchDir::new("agent-pprof");
    let mut workload = Workload::spawn(WORKLOAD, &["sites", "--holds", "200", "--hold-us", "1000"], &[]);
    let pid = workload.pid();
    let waiter_line: u32 = workload.ready[1].parse().unwrap();
    let holder_line: u32 = workload.ready[2].parse().unwrap();
    let pid_arg = pid.to_string();
    let socket = scratch.join("agent.sock");
    let agent = AgentProcess::start(
        agent_exe(),
        &[
            "--pid",
            &pid_arg,
            "--socket",
            socket.to_str().unwrap(),
            "--discovery-interval",
            "50ms",
        ],
        scratch.join("agent.log"),
    );
    SegmentProbe::open(pid).wait_lease(agent.pid(), "the agent takes over");
    workload.cmd("go");
    let truth = workload.cmd("truth");
    let (waited_ns, waiter_locks): (u64, u64) = (truth[0].parse().unwrap(), truth[1].parse().unwrap());
    // The mutex was dropped: its final rows come with its retirement.
    agent.wait_snapshot("the retired mutex's rows", |s| {
        s.processes
            .iter()
            .flat_map(|p| &p.instances)
            .find(|i| i.name == "contention_demo" && i.retired && !i.sites.is_empty())
            .map(|_| ())
    });
    let addr = agent.addr();
    let dir = scratch.join("profiles");
    std::fs::create_dir_all(&dir).unwrap();
    let mut views = Vec::new();
    for view in ["mutex", "block"] {
        let bytes = get_bytes(addr, &format!("/debug/pprof/{view}"));
        let path = dir.join(format!("{view}.pb.gz"));
        std::fs::write(&path, &bytes).unwrap();
        let profile = pprof::decode(&bytes).expect("a pprof profile");
        let st = |i: i64| profile.string_table[i as usize].clone();
        let types: Vec<_> = profile
            .sample_type
            .iter()
            .map(|t| (st(t.r#type), st(t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("contentions".to_string(), "count".to_string()),
                ("delay".to_string(), "nanoseconds".to_string())
            ]
        );
        views.push((view, path, ranked(&profile)));
    }
    let line_of = |frame: &str| -> u32 { frame.rsplit(':').nth(1).and_then(|l| l.parse().ok()).unwrap_or(0) };
    let (_, _, mutex) = &views[0];
    let (_, _, block) = &views[1];
    eprintln!(
        "mutex view: {mutex:#?}\nblock view: {block:#?}\ntruth: {waited_ns} ns over {waiter_locks} locks"
    );
    assert!(mutex[0].0.contains("subetha-workload.rs"), "{mutex:?}");
    assert_eq!(
        line_of(&mutex[0].0),
        holder_line,
        "the holder's line leads the mutex view: {mutex:?}"
    );
    assert_eq!(
        line_of(&block[0].0),
        waiter_line,
        "the waiter's line leads the block view: {block:?}"
    );
    // Every hold was sampled: no wait is left to an unknown holder.
    assert!(
        mutex.iter().all(|r| !r.0.starts_with('<')),
        "every holder known: {mutex:?}"
    );
    assert_eq!(
        block[0].1 as u64, mutex[0].1 as u64,
        "the same waits, seen from both sides"
    );
    for (what, delay) in [("block (waiter)", block[0].2), ("mutex (holder)", mutex[0].2)] {
        let error = (delay as f64 - waited_ns as f64).abs() / waited_ns as f64;
        assert!(
            error <= 0.10,
            "{what} delay {delay} ns vs the workload's {waited_ns} ns: {:.1}% off",
            error * 100.0
        );
    }
    // A real pprof client reads both.
    if let Some(go) = go() {
        for (view, path, rows) in &views {
            let out = Command::new(&go)
                .args(["tool", "pprof", "-top", "-sample_index=delay"])
                .arg(path)
                .env("HOME", scratch.join("home"))
                .env("PPROF_TMPDIR", scratch.join("pprof-tmp"))
                .output()
                .expect("run go tool pprof");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "go tool pprof -top {view}: {stderr}");
            eprintln!("go tool pprof -top ({view}):\n{stdout}");
            assert!(
                stdout.contains(&rows[0].0),
                "{view}: top names {:?}:\n{stdout}\n{stderr}",
                rows[0].0
            );
        }
    }
    workload.close();
}

#[test]
fn the_profile_command_writes_the_windows_collapsed_stacks() {
    let scratch = ScratchDir::new("agent-profile-cmd");
    let mut workload = Workload::spawn(WORKLOAD, &["sites", "--holds", "100", "--hold-us", "1000"], &[]);
    let pid = workload.pid().to_string();
    let holder_line = workload.ready[2].clone();
    let out = scratch.join("mutex.txt");
    let mut profile = Command::new(agent_exe())
        .args([
            "profile",
            "--pid",
            &pid,
            "--duration",
            "4s",
            "--discovery-interval",
            "50ms",
        ])
        .args([
            "--probes",
            "off",
            "--format",
            "collapsed",
            "--view",
            "mutex",
            "--out",
        ])
        .arg(&out)
        .spawn()
        .expect("start subetha-agent profile");
    SegmentProbe::open(workload.pid()).wait_lease(profile.id(), "the profiler takes over");
    workload.cmd("go");
    let truth = workload.cmd("truth");
    let waited_ns: f64 = truth[0].parse().unwrap();
    let status = profile.wait().unwrap();
    assert!(status.success(), "profile exited with {status}");
    let text = std::fs::read_to_string(&out).unwrap();
    eprintln!("{text}");
    let line = text
        .lines()
        .find(|l| l.contains(&format!("subetha-workload.rs:{holder_line}:")))
        .unwrap_or_else(|| panic!("no stack of the holder's line {holder_line}:\n{text}"));
    assert!(line.starts_with("mutex_contention_demo;"), "{line}");
    let ns: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        (ns - waited_ns).abs() / waited_ns <= 0.10,
        "{ns} ns vs the workload's {waited_ns} ns"
    );
    workload.close();
}
