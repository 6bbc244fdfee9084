//! Applications in their own namespaces, as container runtimes start them:
//! the agent (in this process, in the host's namespaces) attaches them
//! through `/proc` without entering or mounting anything, takes their lease
//! from their sidecar, balances their books exactly, and names their
//! threads by host tid —
//!
//! * in a pid namespace of their own (`unshare --pid --fork --mount-proc`);
//! * in pid, mount and user namespaces, the app's uid mapped to another one
//!   (`unshare --user --map-user=1000 ...`);
//! * two pid namespaces deep (a container in a container);
//!
//! and a process in a pid namespace whose segments lie about one identity
//! field each (pid, pid namespace, start time, uid) has each refused with a
//! message naming the failed check, while its truthful segment is served.
//!
//! Also: a containerized app announcing its segment on the registration
//! socket (reachable in its mount namespace) is attached at once, by its
//! host pid; and a rootless container — an unprivileged user's app in a
//! user namespace of its own, root inside — is attached by an agent
//! running as that same unprivileged user (the same-uid rule: the host
//! uid owns the process and its memfd).
//!
//! The namespaces are real (`unshare(1)`); the tests need root, as in CI.
//! Without root they say so and do nothing, unless `SUBETHA_REQUIRE_TOOLS=1`
//! makes that a failure.

use std::collections::HashMap;
use std::time::Duration;

use subetha_agent::pidns::{PidNamespace, parse_nspid};
use subetha_tests::agent::{
    AgentProcess, ScratchDir, SegmentProbe, Workload, agent_exe, assert_conserved, in_process_agent, process,
    storms_of, wait_agent,
};
use subetha_tests::{getuid, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

/// A pid namespace with its own `/proc`, the child killed with us.
const PID_NS: &[&str] = &["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"];
/// Pid, mount and user namespaces; uid and gid 0 here are 1000 inside.
const PID_MOUNT_USER_NS: &[&str] = &[
    "unshare",
    "--user",
    "--map-user=1000",
    "--map-group=1000",
    "--pid",
    "--mount",
    "--fork",
    "--mount-proc",
    "--kill-child",
];
/// A pid namespace inside another.
const NESTED_PID_NS: &[&str] = &[
    "unshare",
    "--pid",
    "--fork",
    "--mount-proc",
    "--kill-child",
    "unshare",
    "--pid",
    "--fork",
    "--mount-proc",
    "--kill-child",
];

/// Whether namespaces can be made here; panics if they cannot and CI
/// requires them.
fn can_unshare() -> bool {
    let have_unshare = std::process::Command::new("unshare")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if getuid() == 0 && have_unshare {
        return true;
    }
    assert!(
        std::env::var("SUBETHA_REQUIRE_TOOLS").as_deref() != Ok("1"),
        "SUBETHA_REQUIRE_TOOLS=1: namespace tests need root and unshare(1) (util-linux)"
    );
    eprintln!("skipped: namespace tests need root and unshare(1)");
    false
}

/// `/proc/<pid>/task/<tid>/status`'s NSpid, if the thread exists.
fn task_nspid(pid: u32, tid: u32) -> Option<Vec<u32>> {
    parse_nspid(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?)
}

/// Runs the bursting workload under `wrapper` (`levels` pid namespaces deep
/// as seen from here), drained by an in-process agent, and checks
/// attachment, host tids, storms and the books.
fn attached_with_host_tids_and_balanced(wrapper: &[&str], levels: usize, ns_uid: u32) {
    let mut workload = Workload::spawn_in(
        wrapper,
        WORKLOAD,
        &[
            "run",
            "--threads",
            "4",
            "--rate",
            "20000",
            "--burst",
            "200000",
            "--burst-every-ms",
            "100",
        ],
        &[],
    );
    let pid = workload.pid();
    let ns = PidNamespace::of(pid).expect("the workload's namespaces");
    assert_eq!(ns.nspid.len(), levels, "NSpid {:?}", ns.nspid);
    assert!(ns.foreign);
    assert_eq!(
        workload.ready.first().map(String::as_str),
        Some(ns.own_pid().to_string().as_str()),
        "the workload's own pid is its innermost NSpid"
    );
    let agent = in_process_agent(&[pid], |c| {
        c.min_scan_interval = Duration::from_millis(2);
        c.max_scan_interval = Duration::from_millis(10);
    });
    let report = wait_agent(&agent, "the agent to attach and take the lease", |s| {
        process(s, pid).filter(|p| p.state == "attached").cloned()
    });
    assert_eq!(report.nspid, ns.nspid);
    assert_eq!(report.pid_ns, ns.inode);
    let probe = SegmentProbe::open(pid);
    assert_eq!(probe.lease_pid(), std::process::id(), "the agent took the lease");
    assert_eq!(probe.view().layout().pid, ns.own_pid());
    assert_eq!(probe.view().layout().pid_ns_inode, ns.inode);
    assert_eq!(probe.view().layout().uid, ns_uid);

    workload.cmd("go");
    workload.wait_progress("two bursts", |t| t.bursts >= 2);
    // While the threads live: every ring names its thread by host tid, the
    // thread whose NSpid ends in the tid the app recorded.
    let rings = wait_agent(&agent, "all four workers' rings mapped", |s| {
        let rings = &process(s, pid)?.rings;
        let active: Vec<_> = rings.iter().filter(|r| r.state == "active").collect();
        (active.len() >= 4 && active.iter().all(|r| r.tid != 0)).then(|| rings.clone())
    });
    let mut host_tids: HashMap<u32, String> = HashMap::new();
    for ring in rings.iter().filter(|r| r.state == "active") {
        let nspid = task_nspid(pid, ring.tid).unwrap_or_else(|| {
            panic!(
                "ring's tid {} is no thread of host pid {pid}: {ring:#?}",
                ring.tid
            )
        });
        assert_eq!(nspid.len(), levels, "{nspid:?}");
        assert_eq!(nspid.first(), Some(&ring.tid));
        assert_eq!(nspid.last(), Some(&ring.ns_tid), "{ring:#?}");
        assert_ne!(ring.tid, ring.ns_tid, "a host tid differs from the namespace's");
        host_tids.insert(ring.tid, ring.thread_name.clone());
    }
    workload.wait_progress("five bursts", |t| t.bursts >= 5);
    let truth = workload.stop();
    assert!(truth.dropped > 0, "bursts must overrun a ring: {truth:?}");

    let snapshot = wait_agent(&agent, "the agent to see the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").map(|_| s.clone())
    });
    let report = process(&snapshot, pid).unwrap();
    assert_conserved(report, &truth, "in namespaces");
    let storms = storms_of(&snapshot, pid);
    assert!(!storms.is_empty(), "drops without storms: {report:#?}");
    let storm_drops: u64 = storms.iter().map(|s| s.dropped).sum();
    assert_eq!(storm_drops, report.dropped, "every drop is in exactly one storm");
    for storm in &storms {
        assert_eq!(
            host_tids.get(&storm.tid),
            Some(&storm.thread_name),
            "a storm names its thread by the host tid seen running: {storm:#?}"
        );
        assert_ne!(storm.tid, storm.ns_tid, "{storm:#?}");
    }
    assert!(
        storms.iter().any(|s| s.thread_name == "worker-0"),
        "the bursting thread stormed: {storms:#?}"
    );
    agent.stop();
}

#[test]
fn in_its_own_pid_namespace() {
    if can_unshare() {
        attached_with_host_tids_and_balanced(PID_NS, 2, getuid());
    }
}

#[test]
fn in_pid_mount_and_user_namespaces() {
    if can_unshare() {
        attached_with_host_tids_and_balanced(PID_MOUNT_USER_NS, 2, 1000);
    }
}

#[test]
fn in_a_nested_pid_namespace() {
    if can_unshare() {
        attached_with_host_tids_and_balanced(NESTED_PID_NS, 3, getuid());
    }
}

#[test]
fn segments_lying_about_their_creator_in_its_namespace_are_refused_by_check() {
    if !can_unshare() {
        return;
    }
    let mut workload = Workload::spawn_in(PID_NS, WORKLOAD, &["hostile", "--liars"], &[]);
    let pid = workload.pid();
    let agent = in_process_agent(&[pid], |_| {});
    let expected = [
        ("other_pid", "pid check failed: segment claims pid 2, but pid"),
        (
            "other_pid_ns",
            "pid namespace check failed: segment claims pid namespace",
        ),
        ("other_start_time", "start time check failed"),
        ("other_uid", "uid check failed"),
    ];
    let snapshot = wait_agent(&agent, "four refusals and the truthful segment served", |s| {
        let refused = s.refused.iter().filter(|r| r.pid == pid).count();
        let served = s
            .processes
            .iter()
            .any(|p| p.pid == pid && p.instances.iter().any(|i| i.name == "truthful-a"));
        (refused == expected.len() && served).then(|| s.clone())
    });
    let fds: HashMap<&str, i32> = workload
        .segments
        .iter()
        .map(|(c, fd)| (c.as_str(), *fd))
        .collect();
    for (case, phrase) in expected {
        let path = format!("/proc/{pid}/fd/{}", fds[case]);
        let refusal = snapshot
            .refused
            .iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("{case} ({path}) not refused: {:#?}", snapshot.refused));
        assert!(
            refusal.reason.contains(phrase),
            "{case}: {:?} does not say {phrase:?}",
            refusal.reason
        );
    }
    let other_pid = snapshot
        .refused
        .iter()
        .find(|r| r.path.ends_with(&format!("/{}", fds["other_pid"])))
        .unwrap();
    assert!(
        other_pid.reason.contains(&format!("NSpid {pid} 1")),
        "the refusal shows the namespace ids: {:?}",
        other_pid.reason
    );
    agent.stop();
    workload.close();
}

#[test]
fn a_containerized_app_registers_on_the_socket_and_is_attached_at_once() {
    if !can_unshare() {
        return;
    }
    let scratch = ScratchDir::new("pidns-registration");
    let socket = scratch.join("agent.sock");
    let socket_text = socket.to_str().unwrap().to_owned();
    // The app holds its segment back until told: only the registration can
    // announce it (discovery would wait a minute).
    let mut workload = Workload::spawn_in(
        PID_MOUNT_USER_NS,
        WORKLOAD,
        &["run", "--threads", "2", "--rate", "2000", "--hold"],
        &[("SUBETHA_AGENT_SOCKET", &socket_text)],
    );
    let pid = workload.pid();
    let agent = in_process_agent(&[pid], |c| {
        c.registration_socket = Some(socket.clone());
        c.discovery_interval = Duration::from_secs(60);
    });
    wait_for(
        Duration::from_secs(30),
        "the registration socket",
        || std::os::unix::net::UnixStream::connect(&socket).ok(),
        String::new,
    );
    let started = std::time::Instant::now();
    workload.cmd("register");
    let report = wait_agent(&agent, "the registered app attached", |s| {
        process(s, pid).filter(|p| p.state == "attached").cloned()
    });
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "attached {took:?} after registering"
    );
    assert_eq!(
        report.nspid.len(),
        2,
        "by its host pid, from SO_PEERCRED: {:?}",
        report.nspid
    );
    // The received descriptor is the app's own open description: the lease
    // must not be judged by a lock on it (the sidecar's test would take the
    // lock back and break the lease of a live agent).
    let probe = SegmentProbe::open(pid);
    for _ in 0..30 {
        assert_eq!(
            probe.lease_pid(),
            std::process::id(),
            "the sidecar took a live agent's lease back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    workload.cmd("go");
    workload.wait_progress("some observations", |t| t.attempted > 1000);
    let truth = workload.stop();
    let snapshot = wait_agent(&agent, "the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").map(|_| s.clone())
    });
    assert_conserved(
        process(&snapshot, pid).unwrap(),
        &truth,
        "registered from a container",
    );
    agent.stop();
}

/// An unprivileged user with a user namespace of its own (rootless
/// podman's layout: the user's uid is root inside).
const ROOTLESS: &[&str] = &[
    "setpriv",
    "--reuid",
    "1000",
    "--regid",
    "1000",
    "--clear-groups",
    "unshare",
    "--user",
    "--map-root-user",
    "--pid",
    "--fork",
    "--mount-proc",
    "--kill-child",
];

#[test]
fn a_rootless_container_is_attached_by_an_agent_of_the_same_user() {
    if !can_unshare() {
        return;
    }
    let mut workload = Workload::spawn_in(
        ROOTLESS,
        WORKLOAD,
        &["run", "--threads", "2", "--rate", "5000"],
        &[],
    );
    let pid = workload.pid();
    let ns = PidNamespace::of(pid).unwrap();
    assert_eq!(ns.nspid.len(), 2);
    let scratch = ScratchDir::new("pidns-rootless");
    let pid_text = pid.to_string();
    let agent = AgentProcess::start_in(
        &["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups"],
        agent_exe(),
        &["--pid", &pid_text, "--no-socket", "--probes", "off"],
        scratch.join("agent.log"),
    );
    let report = agent.wait_snapshot("the unprivileged agent to attach the rootless app", |s| {
        process(s, pid).filter(|p| p.state == "attached").cloned()
    });
    assert_eq!(report.uid, 1000, "the host uid");
    let probe = SegmentProbe::open(pid);
    assert_eq!(probe.view().layout().uid, 0, "root inside its user namespace");
    workload.cmd("go");
    workload.wait_progress("some observations", |t| t.attempted > 1000);
    let truth = workload.stop();
    let snapshot = agent.wait_snapshot("the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").map(|_| s.clone())
    });
    assert_conserved(process(&snapshot, pid).unwrap(), &truth, "rootless");
}

/// A host agent stopped (SIGSTOP) for longer than any heartbeat allows keeps
/// the lease of an app in a container, whose sidecar cannot see the agent's
/// pid: its presence lock on the segment says it lives and may resume
/// mid-pop. Killed, it loses the lease to the sidecar at once, and the books
/// balance across both consumers.
#[test]
fn a_stopped_host_agent_keeps_a_containerized_apps_lease_and_a_dead_one_loses_it() {
    if !can_unshare() {
        return;
    }
    let mut workload = Workload::spawn_in(
        PID_NS,
        WORKLOAD,
        &["run", "--threads", "2", "--rate", "5000"],
        &[],
    );
    let pid = workload.pid();
    let ns = PidNamespace::of(pid).unwrap();
    let scratch = ScratchDir::new("pidns-stopped-agent");
    let pid_text = pid.to_string();
    let mut agent = AgentProcess::start(
        agent_exe(),
        &["--pid", &pid_text, "--no-socket", "--probes", "off"],
        scratch.join("agent.log"),
    );
    agent.wait_snapshot("the agent to attach", |s| {
        process(s, pid).filter(|p| p.state == "attached").cloned()
    });
    let probe = SegmentProbe::open(pid);
    probe.wait_lease(agent.pid(), "the host agent takes it");
    workload.cmd("go");
    workload.wait_progress("some observations", |t| t.attempted > 1000);

    agent.signal(libc::SIGSTOP);
    std::thread::sleep(subetha_core::lease::FOREIGN_STALE + Duration::from_secs(2));
    assert_eq!(
        probe.lease_pid(),
        agent.pid(),
        "the sidecar broke a stopped agent's lease (two consumers once it resumes)"
    );
    agent.signal(libc::SIGCONT);
    probe.wait_drained_above(probe.totals().drained, "the resumed agent drains");

    agent.signal(libc::SIGKILL);
    let _ = agent.wait_exit(Duration::from_secs(10));
    let killed = std::time::Instant::now();
    probe.wait_lease(ns.own_pid(), "the sidecar takes a dead agent's lease back");
    assert!(
        killed.elapsed() < subetha_core::lease::FOREIGN_STALE,
        "taken back after {:?}: judged by heartbeat, not by the agent's death",
        killed.elapsed()
    );
    let truth = workload.stop();
    let totals = probe.totals();
    assert_eq!(
        truth.attempted,
        totals.drained + totals.dropped + totals.lost + totals.waiting,
        "books across the agent and the sidecar: {truth:?} {totals:?}"
    );
}
