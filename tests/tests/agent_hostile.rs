//! The shared memory is hostile input. `subetha-workload hostile` publishes
//! hand-made `memfd:subetha` segments: eight the agent must refuse (wrong
//! magic, a total size that is not the file's, an unsealed file, a file
//! smaller than a header, an absurd capacity, overlapping tables, another
//! ABI, a header naming pid 1) and four it must serve (a valid one; one
//! with a ring whose head and tail are a million apart; one whose
//! high-water marks are `u32::MAX`; one whose names are unterminated and
//! full of control characters).
//!
//! The agent (in-process, limited to that pid) refuses each bad segment
//! with exactly one clear error, however many discovery rounds pass; keeps
//! serving the others with exact counts; marks the corrupt ring corrupt
//! while draining its neighbour; sanitises names; and its memory, its
//! descriptors and its mappings do not grow over hundreds of discovery
//! rounds.

use std::collections::HashMap;
use std::time::Duration;

use subetha_agent::AgentSnapshot;
use subetha_agent::model::ProcessReport;
use subetha_tests::agent::{
    AgentProcess, ScratchDir, Workload, agent_exe, in_process_agent, status_kib, wait_agent,
};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

/// Refused cases and a phrase their one error must contain.
const REFUSED: [(&str, &str); 8] = [
    ("bad_magic", "bad magic 0x4142434445464748"),
    ("bad_total_size", "total_size is"),
    ("unsealed", "not sealed against shrinking"),
    ("too_small", "smaller than its 4096-byte header"),
    ("huge_capacity", "capacity 4294967295 exceeds"),
    ("overlapping_tables", "out of bounds, misaligned or overlapping"),
    ("bad_abi", "ABI version 77"),
    ("wrong_pid", "claims pid 1,"),
];

/// The served segment whose instance is named `name`.
fn served<'a>(snapshot: &'a AgentSnapshot, pid: u32, name: &str) -> Option<&'a ProcessReport> {
    snapshot
        .processes
        .iter()
        .filter(|p| p.pid == pid)
        .find(|p| p.instances.iter().any(|i| i.name == name))
}

fn no_control(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// The tests here measure the whole process (descriptors, mappings, RSS):
/// they run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn subetha_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("memfd:subetha"))
        .count()
}

#[test]
fn hostile_segments_are_refused_once_each_and_the_rest_served() {
    let _serial = serial();
    let mut workload = Workload::spawn(WORKLOAD, &["hostile"], &[]);
    let pid = workload.pid();
    let fds: HashMap<String, i32> = workload.segments.iter().cloned().collect();
    assert_eq!(fds.len(), REFUSED.len() + 4, "{:?}", workload.segments);
    // A walk of /proc every 1 ms, less than the 5 ms scan pause: every
    // scan attaches from a fresh walk, so scans count discovery rounds.
    let agent = in_process_agent(&[pid], |c| {
        c.discovery_interval = Duration::from_millis(1);
        c.min_scan_interval = Duration::from_millis(5);
        c.max_scan_interval = Duration::from_millis(5);
        c.publish_interval = Duration::ZERO;
    });
    let all_in = |s: &AgentSnapshot| {
        let served = s.processes.iter().filter(|p| p.pid == pid).count();
        let drained = served == 4
            && s.processes
                .iter()
                .filter(|p| p.pid == pid)
                .all(|p| p.instances.iter().map(|i| i.ops).sum::<u64>() > 0);
        (s.refused.len() >= REFUSED.len() && drained).then(|| s.clone())
    };
    let first = wait_agent(&agent, "every segment refused or served", all_in);
    let rss_before = status_kib("self", "VmRSS");
    let fds_before = fd_count();
    let maps_before = subetha_mappings();
    let scans = first.agent.scans;
    let snapshot = wait_agent(&agent, "300 more discovery rounds", |s| {
        (s.agent.scans >= scans + 300).then(|| s.clone())
    });
    let rss_after = status_kib("self", "VmRSS");
    let fds_after = fd_count();
    let maps_after = subetha_mappings();

    // One error per bad segment, naming the problem, however many rounds.
    assert_eq!(
        snapshot.refused.len(),
        REFUSED.len(),
        "exactly one refusal per bad segment: {:#?}",
        snapshot.refused
    );
    for (case, phrase) in REFUSED {
        let path = format!("/proc/{pid}/fd/{}", fds[case]);
        let refusals: Vec<_> = snapshot.refused.iter().filter(|r| r.path == path).collect();
        assert_eq!(refusals.len(), 1, "{case}: {:#?}", snapshot.refused);
        assert!(
            refusals[0].reason.contains(phrase),
            "{case}: reason {:?} should contain {phrase:?}",
            refusals[0].reason
        );
        assert_eq!(refusals[0].pid, pid);
    }

    // The valid segment: exact counts.
    let valid = served(&snapshot, pid, "valid-a").expect("the valid segment is served");
    assert_eq!(valid.state, "attached");
    let instance = &valid.instances[0];
    assert_eq!(
        (instance.ops, instance.contended, instance.misses),
        (1200, 200, 0)
    );
    let by_op: Vec<(u16, u64)> = instance.per_op.iter().map(|o| (o.op, o.ops)).collect();
    assert_eq!(by_op, vec![(1, 1000), (2, 200)]);
    assert_eq!(instance.latency_ns.count, 200, "200 latencies of 500 ticks");
    assert_eq!((valid.drained, valid.dropped, valid.unattributed), (1200, 0, 0));
    assert_eq!(valid.rings.len(), 1);
    assert_eq!(valid.rings[0].thread_name, "valid-thread");
    assert!(valid.rings[0].corrupt.is_none());

    // The corrupt ring is reported; its neighbour is drained.
    let corrupt = served(&snapshot, pid, "corrupt-seg").expect("served despite a corrupt ring");
    let bad = corrupt.rings.iter().find(|r| r.slot == 0).expect("slot 0");
    let reason = bad.corrupt.as_deref().expect("slot 0 reported corrupt");
    assert!(reason.contains("corrupt"), "{reason}");
    let good = corrupt.rings.iter().find(|r| r.slot == 1).expect("slot 1");
    assert!(good.corrupt.is_none());
    assert_eq!(good.drained, 300);
    assert_eq!(
        corrupt.instances[0].ops, 300,
        "nothing read from the corrupt ring"
    );

    // High-water marks beyond the tables are clamped to them.
    let huge = served(&snapshot, pid, "huge-counts").expect("served with clamped counts");
    assert!(huge.rings.len() <= 4, "at most the 4 slots: {:#?}", huge.rings);
    assert!(huge.instances.len() <= 8, "at most the 8 entries");
    assert_eq!(huge.instances.iter().map(|i| i.ops).sum::<u64>(), 250);
    assert_eq!(huge.drained, 250);

    // Names: cut to their fields, no control characters left.
    let names = snapshot
        .processes
        .iter()
        .filter(|p| p.pid == pid)
        .find(|p| p.instances.iter().any(|i| i.name.contains("NNN")))
        .expect("the segment with hostile names is served");
    let instance = &names.instances[0];
    assert_eq!(instance.ops, 40);
    for text in [&instance.name, &instance.kind]
        .into_iter()
        .chain(instance.per_op.iter().map(|o| &o.name))
    {
        assert!(no_control(text), "control characters in {text:?}");
    }
    assert!(instance.name.chars().count() <= 64, "{:?}", instance.name);
    assert!(instance.kind.chars().count() <= 16, "{:?}", instance.kind);
    for ring in &names.rings {
        assert!(no_control(&ring.thread_name), "{:?}", ring.thread_name);
        assert!(ring.thread_name.chars().count() <= 24, "{:?}", ring.thread_name);
    }
    assert!(no_control(&names.comm));

    // Bounded: no descriptor, mapping or memory growth over 300 rounds.
    // The agent's /proc walker, on a thread of its own, holds one directory
    // open while it walks, whenever this looks: one descriptor either way;
    // a leak per round would be hundreds.
    assert!(
        fds_after.abs_diff(fds_before) <= 1,
        "descriptors leak per discovery round: {fds_before} → {fds_after}"
    );
    assert_eq!(maps_after, maps_before, "mappings leak per discovery round");
    assert_eq!(maps_after, 4, "one mapping per served segment");
    let growth = rss_after.saturating_sub(rss_before);
    eprintln!("VmRSS {rss_before} kB → {rss_after} kB over 300 discovery rounds");
    assert!(
        growth <= 1024,
        "VmRSS grew {growth} kB over 300 discovery rounds ({rss_before} → {rss_after} kB)"
    );
    drop(snapshot);
    agent.stop();
    workload.close();
}

#[test]
fn segment_seen_before_its_magic_is_written_is_served_once_published() {
    let _serial = serial();
    let mut workload = Workload::spawn(WORKLOAD, &["hostile", "--uninit"], &[]);
    let pid = workload.pid();
    let agent = in_process_agent(&[pid], |c| {
        c.discovery_interval = Duration::from_millis(1);
        c.min_scan_interval = Duration::from_millis(5);
        c.max_scan_interval = Duration::from_millis(5);
        c.publish_interval = Duration::ZERO;
    });
    // A process's segment looks like this for the ~1.25 ms its creator
    // spends calibrating the clock: sealed, sized, magic still 0. The agent
    // keeps looking (within a grace period) instead of refusing it.
    let scans = agent.snapshot().agent.scans;
    let snapshot = wait_agent(&agent, "100 discovery rounds over the unpublished segment", |s| {
        (s.agent.scans >= scans + 100).then(|| s.clone())
    });
    assert!(
        snapshot.refused.iter().all(|r| r.pid != pid),
        "an unpublished segment was refused within its grace period: {:#?}",
        snapshot.refused
    );
    assert!(
        served(&snapshot, pid, "late-init").is_none(),
        "served before its magic was written"
    );
    workload.cmd("publish");
    let scans = agent.snapshot().agent.scans;
    let snapshot = wait_agent(&agent, "200 more discovery rounds", |s| {
        (s.agent.scans >= scans + 200).then(|| s.clone())
    });
    let report = served(&snapshot, pid, "late-init").unwrap_or_else(|| {
        panic!(
            "200 discovery rounds after its magic was published the segment is still not served: \
             refused {:#?}",
            snapshot.refused
        )
    });
    assert_eq!(report.instances[0].ops, 77);
    agent.stop();
    workload.close();
}

#[test]
fn maximal_segments_keep_the_agent_within_its_memory_budget() {
    let _serial = serial();
    let scratch = ScratchDir::new("agent-max-geometry");
    // Four valid segments of the largest geometry the agent accepts, with
    // one live instance and one used ring each but high-water marks at
    // u32::MAX: what any local user can publish.
    let mut workload = Workload::spawn(WORKLOAD, &["hostile", "--max-geometry", "--segments", "4"], &[]);
    let pid = workload.pid();
    let pid_arg = pid.to_string();
    let agent = AgentProcess::start(
        agent_exe(),
        &["--pid", &pid_arg, "--no-socket", "--discovery-interval", "50ms"],
        scratch.join("agent.log"),
    );
    let served = agent.wait_snapshot("the four segments served", |s| {
        let served: Vec<_> = s
            .processes
            .iter()
            .filter(|p| p.pid == pid && p.drained == 10)
            .collect();
        (served.len() == 4).then_some(s.agent.scans)
    });
    agent.wait_snapshot("50 more scans", |s| (s.agent.scans >= served + 50).then_some(()));
    let agent_pid = agent.pid().to_string();
    let (rss, shmem) = (
        status_kib(&agent_pid, "VmRSS"),
        status_kib(&agent_pid, "RssShmem"),
    );
    let snapshot = agent.snapshot().expect("snapshot");
    eprintln!(
        "agent with 4 maximal segments: VmRSS {rss} kB (RssShmem {shmem} kB); scan p50 {} µs p99 {} µs",
        snapshot.agent.scan_duration_ns.p50 / 1000,
        snapshot.agent.scan_duration_ns.p99 / 1000
    );
    assert!(
        rss <= 64 * 1024,
        "4 segments with one instance and one ring each cost the agent VmRSS {rss} kB \
         (RssShmem {shmem} kB: pages of the application's memfd the agent faulted in)"
    );
    workload.close();
}
