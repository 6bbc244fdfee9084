//! Hand-over without loss between an application's sidecar and the agent.
//!
//! With `SUBETHA_SIDECAR=auto` the sidecar drains until an agent asks; the
//! lease word then names the agent; an agent stopped with SIGINT exits 0
//! and hands the lease back, and the sidecar resumes; a second agent takes
//! over again. At every phase the workload is paused (nothing in flight)
//! and, once its rings are empty, the segment's per-slot drained totals
//! plus drops and lost observations equal its `observe` calls exactly.
//!
//! With `SUBETHA_SIDECAR=always` the agent leaves the application's own
//! consumer alone and reports the process as `waiting`, saying why.

use std::time::Duration;

use subetha_tests::agent::{
    AgentProcess, ScratchDir, SegmentProbe, Workload, agent_exe, assert_conserved, in_process_agent, process,
    wait_agent,
};
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

/// Pauses the workload, waits for the current consumer to empty the rings
/// and checks the segment's books against the exact truth; resumes.
fn check_books(workload: &mut Workload, probe: &SegmentProbe, phase: &str) {
    let truth = workload.truth("pause");
    let totals = wait_for(
        TIMEOUT,
        format!("the rings to be drained ({phase})"),
        || {
            let totals = probe.totals();
            (totals.waiting == 0).then_some(totals)
        },
        || format!("{:?}, lease pid {}", probe.totals(), probe.lease_pid()),
    );
    assert_eq!(
        totals.drained + totals.dropped + totals.lost,
        truth.attempted,
        "{phase}: per-slot totals {totals:?} vs truth {truth:?}"
    );
    assert_eq!(totals.drained, truth.queued, "{phase}: {totals:?} vs {truth:?}");
    assert_eq!(totals.dropped, truth.dropped, "{phase}: {totals:?} vs {truth:?}");
    workload.cmd("resume");
}

#[test]
fn sidecar_and_agent_hand_over_both_ways_without_loss() {
    let scratch = ScratchDir::new("handover");
    let mut workload = Workload::spawn(WORKLOAD, &["run", "--threads", "3", "--rate", "20000"], &[]);
    let pid = workload.pid();
    let pid_arg = pid.to_string();
    let args = [
        "--pid",
        pid_arg.as_str(),
        "--no-socket",
        "--discovery-interval",
        "50ms",
    ];
    let probe = SegmentProbe::open(pid);
    probe.wait_lease(pid, "the sidecar drains first");
    workload.cmd("go");
    probe.wait_drained_above(0, "the sidecar drains");
    check_books(&mut workload, &probe, "sidecar");

    let mut first = AgentProcess::start(agent_exe(), &args, scratch.join("agent-1.log"));
    probe.wait_lease(first.pid(), "agent 1 takes over");
    first.wait_snapshot("agent 1 to report the process attached", |s| {
        process(s, pid).filter(|p| p.state == "attached").map(|_| ())
    });
    let before = probe.totals().drained;
    probe.wait_drained_above(before, "agent 1 drains");
    check_books(&mut workload, &probe, "agent 1");

    first.signal(libc::SIGINT);
    let status = first.wait_exit(Duration::from_secs(10));
    assert!(
        status.success(),
        "SIGINT → exit 0, got {status}; log:\n{}",
        first.log()
    );
    probe.wait_lease(pid, "the lease handed back to the sidecar");
    let before = probe.totals().drained;
    probe.wait_drained_above(before, "the sidecar resumes");
    check_books(&mut workload, &probe, "sidecar again");

    let mut second = AgentProcess::start(agent_exe(), &args, scratch.join("agent-2.log"));
    probe.wait_lease(second.pid(), "agent 2 takes over");
    let before = probe.totals().drained;
    probe.wait_drained_above(before, "agent 2 drains");
    check_books(&mut workload, &probe, "agent 2");

    let truth = workload.stop();
    let report = second.wait_snapshot("agent 2 to see the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").cloned()
    });
    assert_conserved(&report, &truth, "after two hand-overs and a hand-back");
    let totals = probe.totals();
    assert_eq!(totals.waiting, 0);
    assert_eq!(
        totals.drained + totals.dropped + totals.lost,
        truth.attempted,
        "{totals:?}"
    );
    second.signal(libc::SIGINT);
    let status = second.wait_exit(Duration::from_secs(10));
    assert!(
        status.success(),
        "SIGINT → exit 0, got {status}; log:\n{}",
        second.log()
    );
}

#[test]
fn always_mode_keeps_its_own_consumer() {
    let mut workload = Workload::spawn(
        WORKLOAD,
        &["run", "--threads", "2", "--rate", "5000"],
        &[("SUBETHA_SIDECAR", "always")],
    );
    let pid = workload.pid();
    let probe = SegmentProbe::open(pid);
    probe.wait_lease(pid, "the sidecar drains");
    let agent = in_process_agent(&[pid], |c| c.takeover_timeout = Duration::from_millis(200));
    let report = wait_agent(&agent, "the agent to report the process waiting", |s| {
        process(s, pid)
            .filter(|p| p.state == "waiting" && p.note.is_some())
            .cloned()
    });
    let note = report.note.unwrap();
    assert!(note.contains("always"), "the note says why: {note:?}");
    workload.cmd("go");
    // Many agent scans later, the application still drains itself.
    let scans = agent.snapshot().agent.scans;
    let mut drained = probe.totals().drained;
    for _ in 0..3 {
        drained = probe.wait_drained_above(drained, "the sidecar keeps draining");
    }
    wait_agent(&agent, "100 more agent scans", |s| {
        (s.agent.scans >= scans + 100).then_some(())
    });
    assert_eq!(probe.lease_pid(), pid, "the agent did not take the lease");
    let snapshot = agent.snapshot();
    let report = process(&snapshot, pid).unwrap();
    assert_eq!(report.state, "waiting", "{report:#?}");
    assert!(
        report.note.as_deref().unwrap_or("").contains("always"),
        "{report:#?}"
    );
    check_books(&mut workload, &probe, "always mode");
    workload.stop();
    agent.stop();
}
