//! The agent's books balance exactly against the workload's ground truth:
//! over the workload's process, `drained + dropped + lost_no_ring` (the
//! agent's `ProcessReport`) equals every `observe` call the workload made —
//!
//! * with bursts that overrun a ring (and then every drop is in a storm with
//!   its thread, thread name and first instance);
//! * when the agent process is SIGKILLed mid-run and restarted (the
//!   application's sidecar takes the lease back and drains meanwhile);
//! * when the workload is SIGKILLed with observations still in its rings
//!   (the agent drains them after the death);
//! * with thousands of short-lived threads reusing ring slots;
//! * when the agent attaches after threads came and went under the sidecar.
//!
//! The workload is `subetha-workload run`, which answers exact counts when
//! paused or stopped. Agents are limited to the workload's pid.

use std::time::Duration;

use subetha_tests::agent::{
    AgentProcess, ScratchDir, SegmentProbe, Workload, agent_exe, assert_conserved, in_process_agent, process,
    storms_of, wait_agent,
};
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

/// Waits until the in-process agent drains `pid` (holds its lease).
fn wait_attached(agent: &subetha_agent::AgentHandle, pid: u32) {
    wait_agent(agent, "the agent to attach and take the lease", |s| {
        process(s, pid).filter(|p| p.state == "attached").map(|_| ())
    });
}

#[test]
fn bursts_become_storms_and_the_books_balance() {
    let mut workload = Workload::spawn(
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
    // At most one scan per 2 ms: a 200,000-observation burst overruns a
    // 4096-slot ring whatever the producer's speed.
    let agent = in_process_agent(&[pid], |c| {
        c.min_scan_interval = Duration::from_millis(2);
        c.max_scan_interval = Duration::from_millis(10);
    });
    wait_attached(&agent, pid);
    let probe = SegmentProbe::open(pid);
    assert_eq!(probe.lease_pid(), std::process::id(), "the agent took the lease");
    workload.cmd("go");
    workload.wait_progress("five bursts", |t| t.bursts >= 5);
    let truth = workload.stop();
    assert!(truth.dropped > 0, "bursts must overrun a ring: {truth:?}");

    let snapshot = wait_agent(&agent, "the agent to see the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").map(|_| s.clone())
    });
    let report = process(&snapshot, pid).unwrap();
    assert_conserved(report, &truth, "bursts");
    assert_eq!(report.unattributed, 0);
    let ops: u64 = report.instances.iter().map(|i| i.ops).sum();
    assert_eq!(
        ops, truth.queued,
        "every drained observation reached its instance"
    );

    let storms = storms_of(&snapshot, pid);
    assert!(!storms.is_empty(), "drops without storms: {report:#?}");
    assert_eq!(
        report.storms,
        storms.len() as u64,
        "storm counter matches history"
    );
    for storm in &storms {
        let end = storm
            .end_mono_ns
            .unwrap_or_else(|| panic!("storm still open after exit: {storm:#?}"));
        assert!(storm.begin_mono_ns <= end, "{storm:#?}");
        assert!(storm.dropped > 0, "{storm:#?}");
        assert_ne!(storm.tid, 0, "{storm:#?}");
        assert!(storm.thread_name.starts_with("worker-"), "{storm:#?}");
        assert!(storm.first_instance.is_some(), "{storm:#?}");
        let ring = report
            .rings
            .iter()
            .find(|r| r.slot == storm.slot)
            .unwrap_or_else(|| panic!("storm on unknown slot: {storm:#?}"));
        assert_eq!(ring.thread_name, storm.thread_name, "{storm:#?}");
    }
    assert!(
        storms
            .iter()
            .any(|s| s.thread_name == "worker-0" && s.first_instance.as_deref() == Some("orders_lock")),
        "the bursting thread's storms name it and its instance: {storms:#?}"
    );
    let storm_drops: u64 = storms.iter().map(|s| s.dropped).sum();
    assert_eq!(storm_drops, report.dropped, "every drop is in exactly one storm");
    let attributed: u64 = report.instances.iter().map(|i| i.drops_attributed).sum();
    assert_eq!(attributed, report.dropped, "drops attributed to first instances");
    agent.stop();
}

#[test]
fn agent_killed_and_restarted_loses_nothing() {
    let scratch = ScratchDir::new("agent-kill");
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

    let mut first = AgentProcess::start(agent_exe(), &args, scratch.join("agent-1.log"));
    probe.wait_lease(first.pid(), "agent 1 takes over");
    let before = probe.totals().drained;
    probe.wait_drained_above(before, "agent 1 drains");
    first.signal(libc::SIGKILL);
    let status = first.wait_exit(TIMEOUT);
    assert_eq!(status.code(), None, "SIGKILLed: {status}");

    // The dead agent's word stays in the lease until the sidecar breaks it.
    probe.wait_lease(pid, "the sidecar takes the lease back from the dead agent");
    let during = probe.totals().drained;
    probe.wait_drained_above(during, "the sidecar drains while no agent runs");

    let mut second = AgentProcess::start(agent_exe(), &args, scratch.join("agent-2.log"));
    probe.wait_lease(second.pid(), "agent 2 takes over");
    let before = probe.totals().drained;
    probe.wait_drained_above(before, "agent 2 drains");
    let truth = workload.stop();

    let report = second.wait_snapshot("agent 2 to see the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").cloned()
    });
    assert_conserved(&report, &truth, "agent killed and restarted");
    let totals = probe.totals();
    assert_eq!(totals.waiting, 0, "nothing left in the rings: {totals:?}");
    assert_eq!(
        totals.drained + totals.dropped + totals.lost,
        truth.attempted,
        "the segment's own per-slot totals: {totals:?}"
    );
    second.signal(libc::SIGINT);
    let status = second.wait_exit(TIMEOUT);
    assert!(status.success(), "SIGINT: {status}; log:\n{}", second.log());
}

#[test]
fn workload_killed_with_full_rings_is_drained_after_death() {
    let mut workload = Workload::spawn(WORKLOAD, &["run", "--threads", "4", "--rate", "1000"], &[]);
    let pid = workload.pid();
    // A slow agent: one scan every 2 s, so the rings hold what the
    // workload pushed since the last one when it dies.
    let agent = in_process_agent(&[pid], |c| {
        c.min_scan_interval = Duration::from_secs(2);
        c.max_scan_interval = Duration::from_secs(2);
        c.publish_interval = Duration::ZERO;
    });
    wait_attached(&agent, pid);
    let probe = SegmentProbe::open(pid);
    assert_eq!(probe.lease_pid(), std::process::id());
    // Start right after a scan, pause well before the next.
    let scans = agent.snapshot().agent.scans;
    wait_agent(&agent, "a scan to finish", |s| {
        (s.agent.scans > scans).then_some(())
    });
    workload.cmd("go");
    workload.wait_progress("some observations", |t| t.attempted >= 3000);
    let truth = workload.truth("pause");
    workload.kill();
    let left = probe.totals();
    assert!(
        left.waiting > 0,
        "the workload died with its observations still in the rings: {left:?}"
    );

    let report = wait_agent(&agent, "the agent to see the death", |s| {
        process(s, pid).filter(|p| p.state == "exited").cloned()
    });
    assert_conserved(&report, &truth, "workload SIGKILLed");
    let after = probe.totals();
    assert_eq!(after.waiting, 0, "leftovers drained after the death: {after:?}");
    assert_eq!(after.drained, report.drained);
    assert!(
        after.drained >= left.drained + left.waiting,
        "{left:?} → {after:?}"
    );
    let ops: u64 = report.instances.iter().map(|i| i.ops).sum();
    assert_eq!(ops, truth.queued, "leftovers reached their instances");
    agent.stop();
}

#[test]
fn thousands_of_short_lived_threads_reuse_slots_and_balance() {
    let mut workload = Workload::spawn(
        WORKLOAD,
        &[
            "run",
            "--threads",
            "2",
            "--rate",
            "5000",
            "--churn",
            "8",
            "--churn-ops",
            "20",
        ],
        &[],
    );
    let pid = workload.pid();
    let agent = in_process_agent(&[pid], |_| {});
    wait_attached(&agent, pid);
    workload.cmd("go");
    workload.wait_progress("3000 threads", |t| t.threads >= 3000);
    let truth = workload.stop();

    let report = wait_agent(&agent, "the agent to see the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").cloned()
    });
    assert_conserved(&report, &truth, "thread churn");
    let slots = report.rings.len() as u64;
    assert!(
        slots * 10 < truth.threads,
        "{} threads used {slots} slots: slots must be reused",
        truth.threads
    );
    assert!(
        report.rings.iter().all(|r| r.state == "free"),
        "every slot freed: {:#?}",
        report.rings
    );
    // Each claim bumps the slot's generation: if no thread went without a
    // ring, every thread claimed exactly one slot.
    let claims: u64 = report.rings.iter().map(|r| u64::from(r.generation)).sum();
    if truth.lost == 0 {
        assert_eq!(claims, truth.threads, "one claim per thread");
    } else {
        assert!(claims <= truth.threads, "{claims} claims, {truth:?}");
    }
    agent.stop();
}

/// Eight short-lived observing threads at a time for ten seconds, at the
/// agent's default scan intervals: thousands of threads come and go between
/// two scans, and each finds a ring (an exited thread's slot, adopted when
/// none is free), but for a rare race noted below.
#[test]
fn churn_of_eight_for_ten_seconds_loses_nothing_for_want_of_a_ring() {
    let mut workload = Workload::spawn(
        WORKLOAD,
        &[
            "run",
            "--threads",
            "2",
            "--rate",
            "5000",
            "--churn",
            "8",
            "--churn-ops",
            "50",
        ],
        &[],
    );
    let pid = workload.pid();
    let agent = in_process_agent(&[pid], |_| {});
    wait_attached(&agent, pid);
    workload.cmd("go");
    std::thread::sleep(Duration::from_secs(10));
    let truth = workload.stop();
    let report = wait_agent(&agent, "the agent to see the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").cloned()
    });
    assert!(truth.threads > 1000, "the churn ran: {truth:?}");
    // A thread that meets the table while every slot is live or being
    // claimed yields once and looks again before it counts a loss. Before
    // adoption this lost ~6% (600,093 of 9,956,415).
    assert_eq!(truth.lost, 0, "nothing lost for want of a ring: {truth:?}");
    assert_conserved(&report, &truth, "churn of eight");
    agent.stop();
}

/// More live observing threads than ring slots (`SUBETHA_RING_SLOTS=2`,
/// four workers): the losses are a `no_ring` storm naming a thread, whose
/// count is every observation lost for want of a ring.
#[test]
fn too_few_slots_for_the_live_threads_is_a_no_ring_storm() {
    let mut workload = Workload::spawn(
        WORKLOAD,
        &["run", "--threads", "4", "--rate", "2000"],
        &[("SUBETHA_RING_SLOTS", "2")],
    );
    let pid = workload.pid();
    let agent = in_process_agent(&[pid], |_| {});
    wait_attached(&agent, pid);
    workload.cmd("go");
    std::thread::sleep(Duration::from_millis(500));
    let truth = workload.stop();
    assert!(truth.lost > 0, "two slots for four live threads: {truth:?}");
    let snapshot = wait_agent(&agent, "the agent to see the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").map(|_| s.clone())
    });
    assert_conserved(process(&snapshot, pid).unwrap(), &truth, "no ring");
    let no_ring: Vec<_> = storms_of(&snapshot, pid)
        .into_iter()
        .filter(|s| s.cause.as_ref().is_some_and(|c| c.kind == "no_ring"))
        .collect();
    assert!(!no_ring.is_empty(), "no no_ring storm: {:#?}", snapshot.storms);
    assert_eq!(no_ring.iter().map(|s| s.dropped).sum::<u64>(), truth.lost);
    let storm = no_ring[0];
    assert_ne!(storm.tid, 0, "names the thread: {storm:#?}");
    assert_eq!(storm.slot, 2, "no slot: the table's capacity");
    let summary = &storm.cause.as_ref().unwrap().summary;
    assert!(summary.contains("SUBETHA_RING_SLOTS"), "{summary}");
    agent.stop();
}

#[test]
fn slots_freed_before_the_agent_attached_still_count() {
    let mut workload = Workload::spawn(
        WORKLOAD,
        &[
            "run",
            "--threads",
            "1",
            "--rate",
            "2000",
            "--churn",
            "4",
            "--churn-ops",
            "50",
        ],
        &[],
    );
    let pid = workload.pid();
    let probe = SegmentProbe::open(pid);
    probe.wait_lease(pid, "the sidecar drains");
    workload.cmd("go");
    workload.wait_progress("100 short-lived threads", |t| t.threads >= 100);
    let paused = workload.truth("pause");
    // The sidecar frees every exited thread's slot; only the worker's stays.
    wait_for(
        TIMEOUT,
        "the sidecar to free the short-lived threads' slots",
        || {
            let view = probe.view();
            let busy = (0..view.rings_in_use())
                .filter(|&i| {
                    let state = view
                        .ring_slot(i)
                        .unwrap()
                        .state
                        .load(std::sync::atomic::Ordering::Acquire);
                    state != subetha_core::segment::slot_state::FREE
                })
                .count();
            (busy == 1 && probe.totals().waiting == 0).then_some(())
        },
        || format!("{:?}", probe.totals()),
    );
    let freed = probe.totals();
    assert!(freed.slots > 1, "several slots were used and freed: {freed:?}");
    assert_eq!(freed.drained + freed.dropped + freed.lost, paused.attempted);

    let agent = in_process_agent(&[pid], |_| {});
    wait_attached(&agent, pid);
    let truth = workload.stop();
    let report = wait_agent(&agent, "the agent to see the exit", |s| {
        process(s, pid).filter(|p| p.state == "exited").cloned()
    });
    assert_conserved(&report, &truth, "agent attached after slots were freed");
    agent.stop();
}
