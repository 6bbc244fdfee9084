//! End to end in one process: threads observe instances through the global
//! API, the automatic sidecar drains them, and its snapshot shows exact
//! per-instance statistics; policies reach the primitives; dropping an
//! instance moves its final statistics into `retired`; ring slots of exited
//! threads are freed and reused.
//!
//! One `#[test]`: the process segment and its sidecar are process-global.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};

use subetha_core::segment::slot_state;
use subetha_core::stats::InstanceStats;
use subetha_core::{
    Instance, InstanceKind, LatencyHistogram, Observation, Policy, Snapshot, process_segment,
    process_sidecar, thread_id,
};
use subetha_tests::{TIMEOUT, gettid, wait_for};

const MUTEX: InstanceKind = InstanceKind {
    code: 1,
    name: "mutex",
    ops: &["lock", "try_lock", "unlock"],
};
const NAMES: [&str; 3] = ["e2e-alpha", "e2e-beta", "e2e-gamma"];
const WORKERS: u32 = 4;

/// What worker `w` does to instance `i`: `(op, flags, latency)` per call.
/// Beta is only touched by workers 0 and 1. Every latency is unique, so the
/// maximum and the thread that produced it are unambiguous.
fn plan(w: u32, i: usize) -> Vec<(u16, u16, u64)> {
    if i == 1 && w > 1 {
        return Vec::new();
    }
    let n = 200 * (i as u64 + 1);
    (0..n)
        .map(|k| {
            let op = 1 + (k % 3) as u16;
            let contended = k % 5 == 0;
            let miss = op == 2 && k % 2 == 0;
            let flags =
                u16::from(contended) * Observation::FLAG_CONTENDED + u16::from(miss) * Observation::FLAG_MISS;
            let latency = if contended {
                1_000_000 * (i as u64 + 1) + 1000 * u64::from(w + 1) + k
            } else {
                0
            };
            (op, flags, latency)
        })
        .collect()
}

/// Independently kept expectations for one op kind.
#[derive(Clone, Default, Debug)]
struct Expected {
    ops: u64,
    contended: u64,
    misses: u64,
    latency: Option<LatencyHistogram>,
    max: Option<(u64, u32)>,
    threads: BTreeSet<u32>,
}

type ExpectedStats = BTreeMap<u16, Expected>;

fn expect(into: &mut ExpectedStats, thread: u32, (op, flags, latency): (u16, u16, u64)) {
    let e = into.entry(op).or_default();
    e.ops += 1;
    e.contended += u64::from(flags & Observation::FLAG_CONTENDED != 0);
    e.misses += u64::from(flags & Observation::FLAG_MISS != 0);
    e.threads.insert(thread);
    if latency != 0 {
        e.latency
            .get_or_insert_with(LatencyHistogram::new)
            .record(latency);
        if e.max.is_none_or(|(max, _)| latency > max) {
            e.max = Some((latency, thread));
        }
    }
}

fn check_stats(name: &str, actual: &InstanceStats, expected: &ExpectedStats) {
    for op in 1..=7u16 {
        let got = actual.op(op).unwrap();
        let Some(want) = expected.get(&op) else {
            assert_eq!(got.ops(), 0, "{name} op {op}");
            continue;
        };
        assert_eq!(
            (got.ops(), got.contended(), got.misses()),
            (want.ops, want.contended, want.misses),
            "{name} op {op}: ops, contended, misses"
        );
        assert_eq!(
            got.latency(),
            want.latency.as_ref(),
            "{name} op {op}: latency histogram"
        );
        assert_eq!(
            got.max_latency().map(|m| (m.ticks, m.thread_id)),
            want.max,
            "{name} op {op}: max latency and its thread"
        );
        let threads: BTreeSet<u32> = got.thread_ids().iter().copied().collect();
        assert_eq!(threads, want.threads, "{name} op {op}: producer threads");
    }
    let all: BTreeSet<u32> = expected
        .values()
        .flat_map(|e| e.threads.iter().copied())
        .collect();
    assert_eq!(
        actual.distinct_threads().count,
        all.len(),
        "{name}: distinct threads"
    );
    assert_eq!(actual.invalid_op_kind(), 0);
    assert_eq!(actual.drops_attributed(), 0);
}

/// Sets each mutex's policy word to its total op count.
struct CountPolicy;

impl Policy for CountPolicy {
    fn applies_to(&self, kind: u16) -> bool {
        kind == MUTEX.code
    }

    fn decide(&mut self, stats: &InstanceStats, _current: u32) -> Option<u32> {
        Some(stats.total_ops() as u32)
    }
}

fn snapshot_until(what: &str, cond: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let sidecar = process_sidecar().unwrap();
    wait_for(
        TIMEOUT,
        what,
        || {
            let snap = sidecar.snapshot();
            cond(&snap).then_some(snap)
        },
        || format!("{:?}", sidecar.snapshot().totals),
    )
}

#[test]
fn sidecar_snapshot_is_exact_end_to_end() {
    let instances: Arc<Vec<Instance>> = Arc::new(
        NAMES
            .iter()
            .map(|n| Instance::register(MUTEX, n).unwrap())
            .collect(),
    );
    let sidecar = process_sidecar().expect("auto sidecar");
    sidecar.add_policy(CountPolicy);
    let view = process_segment().unwrap().view();
    assert_eq!(view.rings_in_use(), 0, "registering claims no ring");

    // Wave 1: four workers, alive together until the rings are checked.
    let hold = Arc::new(Barrier::new(WORKERS as usize + 1));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let instances = Arc::clone(&instances);
            let hold = Arc::clone(&hold);
            std::thread::Builder::new()
                .name(format!("e2e-worker-{w}"))
                .spawn(move || {
                    let mut pushed = 0u64;
                    for (i, instance) in instances.iter().enumerate() {
                        for (op, flags, latency) in plan(w, i) {
                            assert!(instance.observe(op, flags, latency).unwrap());
                            pushed += 1;
                        }
                    }
                    let ids = (gettid(), thread_id(), pushed);
                    hold.wait();
                    hold.wait();
                    ids
                })
                .unwrap()
        })
        .collect();
    hold.wait();
    // Workers are done pushing; their ids are known once they are joined,
    // but the ring records are checked while they are alive.
    let mut expected: Vec<ExpectedStats> = vec![ExpectedStats::new(); NAMES.len()];
    let total: u64 = (0..WORKERS)
        .flat_map(|w| (0..NAMES.len()).map(move |i| plan(w, i).len() as u64))
        .sum();
    let snap = snapshot_until("the sidecar to drain wave 1", |s| s.totals.drained == total);
    assert_eq!(view.rings_in_use(), WORKERS, "four live observers, four slots");
    let live: Vec<_> = snap
        .rings
        .iter()
        .filter(|r| r.state == slot_state::ACTIVE)
        .cloned()
        .collect();
    assert_eq!(live.len(), WORKERS as usize, "{:#?}", snap.rings);
    hold.wait();
    let mut ids = BTreeMap::new();
    for (w, handle) in workers.into_iter().enumerate() {
        let (tid, id, pushed) = handle.join().unwrap();
        ids.insert(w as u32, id);
        let ring = live
            .iter()
            .find(|r| r.os_tid == tid)
            .unwrap_or_else(|| panic!("no ring for worker {w}: {live:#?}"));
        assert_eq!(ring.thread_name, format!("e2e-worker-{w}"));
        assert_eq!(ring.thread_id, id);
        assert_eq!((ring.drained, ring.dropped, ring.episodes), (pushed, 0, 0));
    }
    for w in 0..WORKERS {
        for (i, e) in expected.iter_mut().enumerate() {
            for step in plan(w, i) {
                expect(e, ids[&w], step);
            }
        }
    }
    assert_eq!(snap.totals.dropped, 0);
    assert_eq!(snap.totals.unattributed, 0);
    assert_eq!(snap.lost_no_ring, 0);
    for (i, name) in NAMES.iter().enumerate() {
        let record = snap.instance(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(record.meta.id, instances[i].id());
        assert_eq!(
            (record.meta.kind_name.as_str(), record.meta.op_name(2).as_str()),
            ("mutex", "try_lock")
        );
        check_stats(name, &record.stats, &expected[i]);
    }

    // The policy sees the same numbers and writes them where the primitive
    // reads them.
    for (i, name) in NAMES.iter().enumerate() {
        let want: u64 = expected[i].values().map(|e| e.ops).sum();
        wait_for(
            TIMEOUT,
            format!("{name}'s policy word to become {want}"),
            || (u64::from(instances[i].policy()) == want).then_some(()),
            || instances[i].policy().to_string(),
        );
    }

    // Exited threads' slots are drained and freed.
    let slots_free = |s: &Snapshot| {
        (0..view.rings_in_use())
            .all(|i| view.ring_slot(i).unwrap().state.load(Ordering::Acquire) == slot_state::FREE)
            && s.rings.iter().all(|r| r.state == slot_state::FREE)
    };
    let snap = snapshot_until("wave 1's slots to be freed", slots_free);
    assert_eq!(snap.totals.freed_slots, u64::from(WORKERS));

    // Dropping an instance moves its final statistics into `retired`.
    let mut instances = Arc::into_inner(instances).expect("workers joined");
    let gamma = instances.pop().unwrap();
    let gamma_id = gamma.id();
    drop(gamma);
    let snap = snapshot_until("e2e-gamma to retire", |s| {
        s.retired.iter().any(|r| r.meta.name == "e2e-gamma")
    });
    assert!(
        snap.instances.iter().all(|r| r.meta.id != gamma_id),
        "gamma no longer live"
    );
    let retired = snap.retired.iter().find(|r| r.meta.name == "e2e-gamma").unwrap();
    assert_eq!(retired.meta.id, gamma_id);
    assert!(
        retired
            .meta
            .retired_mono_ns
            .is_some_and(|t| t >= retired.meta.registered_mono_ns)
    );
    check_stats("retired e2e-gamma", &retired.stats, &expected[2]);

    // An instance dropped right after its last observations (possibly
    // before any scan saw them) still retires with all of them.
    let delta = Arc::new(Instance::register(MUTEX, "e2e-delta").unwrap());
    let pusher = {
        let delta = Arc::clone(&delta);
        std::thread::spawn(move || {
            for k in 0..1000 {
                assert!(delta.observe(3, 0, k).unwrap());
            }
        })
    };
    pusher.join().unwrap();
    drop(Arc::into_inner(delta).unwrap());
    let snap = snapshot_until("e2e-delta to retire", |s| {
        s.retired.iter().any(|r| r.meta.name == "e2e-delta")
    });
    let delta = snap.retired.iter().find(|r| r.meta.name == "e2e-delta").unwrap();
    assert_eq!(delta.stats.op(3).unwrap().ops(), 1000);
    assert_eq!(
        delta.stats.op(3).unwrap().latency().unwrap().count(),
        999,
        "latency 0 not measured"
    );

    // Wave 2 reuses the freed slots: no new ring memory.
    snapshot_until("the delta pusher's slot to be freed", slots_free);
    let instances = Arc::new(instances);
    let start = Arc::new(Barrier::new(WORKERS as usize));
    let wave2: Vec<_> = (0..WORKERS)
        .map(|_| {
            let instances = Arc::clone(&instances);
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..10 {
                    assert!(instances[0].observe(1, 0, 0).unwrap());
                }
                start.wait();
                thread_id()
            })
        })
        .collect();
    let wave2_ids: BTreeSet<u32> = wave2.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(wave2_ids.len(), WORKERS as usize);
    assert!(
        wave2_ids.iter().all(|id| !ids.values().any(|w| w == id)),
        "thread ids are never reused"
    );
    assert_eq!(
        view.rings_in_use(),
        WORKERS,
        "slots reused, high-water mark unchanged"
    );
    let generations: u32 = (0..WORKERS)
        .map(|i| view.ring_slot(i).unwrap().generation.load(Ordering::Relaxed))
        .sum();
    assert_eq!(
        generations,
        2 * WORKERS + 1,
        "wave 1, the delta pusher and wave 2 each claimed once"
    );
    let alpha_ops: u64 = expected[0].values().map(|e| e.ops).sum();
    let snap = snapshot_until("wave 2 to be drained and its slots freed", |s| {
        s.instance("e2e-alpha")
            .is_some_and(|r| r.stats.total_ops() == alpha_ops + 40)
            && slots_free(s)
    });
    let alpha = &snap.instance("e2e-alpha").unwrap().stats;
    assert_eq!(alpha.distinct_threads().count, 2 * WORKERS as usize);
    assert_eq!(snap.totals.freed_slots, 2 * u64::from(WORKERS) + 1);
    assert_eq!(snap.totals.unattributed, 0);
    assert_eq!(snap.totals.dropped, 0);
}
