//! A full ring table: with `SUBETHA_RING_SLOTS=2` (read when the segment is
//! created, so the scenario runs in a re-executed child process), a third
//! concurrently observing thread gets `RingTableFull`, each such observation
//! is counted in the header's `lost_no_ring`, and once one of the first two
//! threads exits and the sidecar frees its slot, the third thread claims it
//! on a later observation.
//!
//! And with one slot and no consumer at all, a new thread adopts the slot
//! its exited predecessor left (orphaned, still holding observations), so
//! nothing is lost for want of a ring; the consumer that comes later drains
//! both threads' observations from the one ring and counts both threads'
//! drops.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use subetha_core::segment::slot_state;
use subetha_core::{
    Instance, InstanceKind, RegistryError, SegmentConfig, process_segment, process_sidecar, thread_id,
};
use subetha_tests::{TIMEOUT, gettid, rerun_self, role, wait_for};

const TEST: &str = "third_thread_finds_the_ring_table_full_until_a_slot_is_freed";
const ADOPT_TEST: &str = "a_new_thread_adopts_an_exited_threads_slot_without_a_consumer";

#[test]
fn third_thread_finds_the_ring_table_full_until_a_slot_is_freed() {
    match role().as_deref() {
        None => {
            rerun_self(TEST, "two-slots", &[("SUBETHA_RING_SLOTS", "2")]);
        }
        Some("two-slots") => two_slots(),
        Some(other) => panic!("unknown role {other:?}"),
    }
}

#[test]
fn a_new_thread_adopts_an_exited_threads_slot_without_a_consumer() {
    match role().as_deref() {
        None => {
            rerun_self(
                ADOPT_TEST,
                "one-slot",
                &[("SUBETHA_RING_SLOTS", "1"), ("SUBETHA_SIDECAR", "off")],
            );
        }
        Some("one-slot") => one_slot_adopted(),
        Some(other) => panic!("unknown role {other:?}"),
    }
}

/// Runs `n` observations of `instance` on a new thread named `name` and
/// returns (queued, dropped, thread_id); panics on any error (a lost one).
fn observe_on_new_thread(name: &str, instance: &Arc<Instance>, n: u64) -> (u64, u64, u32) {
    let instance = Arc::clone(instance);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let (mut queued, mut dropped) = (0, 0);
            for k in 0..n {
                match instance.observe(1, 0, k) {
                    Ok(true) => queued += 1,
                    Ok(false) => dropped += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            (queued, dropped, thread_id())
        })
        .unwrap()
        .join()
        .unwrap()
}

fn one_slot_adopted() {
    use subetha_core::drain::Drainer;
    assert!(
        process_sidecar().is_none(),
        "SUBETHA_SIDECAR=off reached the child"
    );
    let instance = Arc::new(Instance::register(InstanceKind::CUSTOM, "adopted").unwrap());
    let view = process_segment().unwrap().view();
    assert_eq!(view.layout().ring_slot_capacity, 1);
    let slot = view.ring_slot(0).unwrap();
    let state = || slot.state.load(Ordering::Acquire);

    // A observes once and exits; with nobody to free its slot, B adopts it
    // (A's observation still queued in it): no loss.
    let a1 = observe_on_new_thread("first", &instance, 1);
    assert_eq!(state(), slot_state::ORPHANED);
    let b = Observer::spawn("second", &instance);
    assert!(b.observe().unwrap());
    assert_eq!(
        view.live().lost_no_ring.load(Ordering::Relaxed),
        0,
        "nothing lost for want of a ring"
    );
    assert_eq!(
        slot.generation.load(Ordering::Relaxed),
        2,
        "B claimed the slot A left"
    );
    assert_eq!(slot.os_tid.load(Ordering::Relaxed), b.ids.0);
    // A consumer comes and follows B's ring; B then overruns it and exits.
    let mut drainer = Drainer::attach(view).unwrap();
    drainer.scan();
    let mut b_counts = (1, 0);
    for _ in 0..5000 {
        match b.observe() {
            Ok(true) => b_counts.0 += 1,
            Ok(false) => b_counts.1 += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(b_counts.1 > 0, "B overran the ring: {b_counts:?}");
    let b_thread = b.ids.1;
    b.exit();
    assert_eq!(state(), slot_state::ORPHANED);
    // C adopts the slot while B's observations are still queued in it, and
    // finds it full: its one observation is a drop of its own.
    let c = observe_on_new_thread("third", &instance, 1);
    assert_eq!(c, (0, 1, c.2), "C met a full ring");
    assert_eq!(view.live().lost_no_ring.load(Ordering::Relaxed), 0);
    assert_eq!(slot.generation.load(Ordering::Relaxed), 3);

    // The consumer drains every queued observation and counts every drop,
    // B's (made before C's claim) included, then frees the slot.
    for _ in 0..4 {
        drainer.scan();
    }
    let queued = a1.0 + b_counts.0 + c.0;
    let dropped = a1.1 + b_counts.1 + c.1;
    let totals = drainer.totals();
    assert_eq!((totals.drained, totals.dropped), (queued, dropped), "{totals:?}");
    let record = drainer.instances().find(|r| r.meta.name == "adopted").unwrap();
    assert_eq!(record.stats.total_ops(), queued);
    assert_eq!(state(), slot_state::FREE, "freed once drained");
    assert_eq!(totals.freed_slots, 1, "freed once, after the last occupant");
    let mut ids = record.stats.op(1).unwrap().thread_ids().to_vec();
    ids.sort_unstable();
    let mut expected = vec![a1.2, b_thread];
    expected.sort_unstable();
    assert_eq!(ids, expected, "each observation keeps its own thread");
}

/// A thread that observes on command and reports each result.
struct Observer {
    go: Sender<bool>,
    results: Receiver<Result<bool, RegistryError>>,
    ids: (u32, u32),
    handle: JoinHandle<()>,
}

impl Observer {
    fn spawn(name: &str, instance: &Arc<Instance>) -> Self {
        let (go, go_rx) = channel::<bool>();
        let (results_tx, results) = channel();
        let (ids_tx, ids_rx) = channel();
        let instance = Arc::clone(instance);
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                ids_tx.send((gettid(), thread_id())).unwrap();
                // `true`: observe once; `false` or hang-up: exit.
                while let Ok(true) = go_rx.recv() {
                    results_tx.send(instance.observe(1, 0, 0)).unwrap();
                }
            })
            .unwrap();
        let ids = ids_rx.recv().unwrap();
        Self {
            go,
            results,
            ids,
            handle,
        }
    }

    fn observe(&self) -> Result<bool, RegistryError> {
        self.go.send(true).unwrap();
        self.results.recv().unwrap()
    }

    fn exit(self) {
        self.go.send(false).unwrap();
        self.handle.join().unwrap();
    }
}

fn two_slots() {
    assert_eq!(
        SegmentConfig::from_env().ring_slots,
        2,
        "SUBETHA_RING_SLOTS reached the child"
    );
    let instance = Arc::new(Instance::register(InstanceKind::CUSTOM, "crowded").unwrap());
    let segment = process_segment().unwrap();
    let view = segment.view();
    assert_eq!(view.layout().ring_slot_capacity, 2);
    let sidecar = process_sidecar().expect("auto sidecar");
    let lost = || view.live().lost_no_ring.load(Ordering::Relaxed);
    let slot_state = |i: u32| view.ring_slot(i).unwrap().state.load(Ordering::Acquire);

    // Two threads take the two slots, one after the other: A gets slot 0.
    let a = Observer::spawn("crowd-a", &instance);
    assert!(a.observe().unwrap());
    let b = Observer::spawn("crowd-b", &instance);
    assert!(b.observe().unwrap());
    assert_eq!(view.rings_in_use(), 2);
    assert_eq!(view.ring_slot(0).unwrap().os_tid.load(Ordering::Relaxed), a.ids.0);
    assert_eq!(view.ring_slot(1).unwrap().os_tid.load(Ordering::Relaxed), b.ids.0);
    assert_eq!(
        (slot_state(0), slot_state(1)),
        (slot_state::ACTIVE, slot_state::ACTIVE)
    );
    assert_eq!(lost(), 0);

    // A third observing thread finds no slot; each attempt is counted lost.
    let c = Observer::spawn("crowd-c", &instance);
    let err = c.observe().expect_err("both slots are taken");
    assert!(
        matches!(err, RegistryError::RingTableFull { capacity: 2 }),
        "{err:?}"
    );
    assert!(err.to_string().contains("SUBETHA_RING_SLOTS"), "{err}");
    assert_eq!(lost(), 1);
    let err = c.observe().expect_err("still no slot");
    assert!(
        matches!(err, RegistryError::RingTableFull { capacity: 2 }),
        "{err:?}"
    );
    assert_eq!(lost(), 2);
    assert_eq!(view.rings_in_use(), 2);

    // A exits; the sidecar drains and frees its slot.
    let epoch = view.live().ring_free_epoch.load(Ordering::Acquire);
    let a_ids = a.ids;
    a.exit();
    wait_for(
        TIMEOUT,
        "the sidecar to free the exited thread's slot 0",
        || (slot_state(0) == slot_state::FREE).then_some(()),
        || format!("slot 0 state {}", slot_state(0)),
    );
    assert!(view.live().ring_free_epoch.load(Ordering::Acquire) > epoch);

    // C's next observation claims the freed slot.
    assert!(c.observe().unwrap(), "C claims the freed slot");
    let slot0 = view.ring_slot(0).unwrap();
    assert_eq!(slot_state(0), slot_state::ACTIVE);
    assert_eq!(slot0.os_tid.load(Ordering::Relaxed), c.ids.0);
    assert_eq!(slot0.thread_id.load(Ordering::Relaxed), c.ids.1);
    assert_eq!(
        slot0.generation.load(Ordering::Relaxed),
        2,
        "slot 0 claimed twice"
    );
    for _ in 0..9 {
        assert!(c.observe().unwrap());
    }
    assert_eq!(lost(), 2, "no further losses");
    assert_eq!(view.rings_in_use(), 2);

    // The sidecar accounts everything that got a ring, and the losses.
    wait_for(
        TIMEOUT,
        "the sidecar to drain 12 observations",
        || {
            let snap = sidecar.snapshot();
            (snap.instance("crowded")?.stats.total_ops() == 12).then_some(snap)
        },
        || format!("{:?}", sidecar.snapshot().totals),
    );
    let snap = sidecar.snapshot();
    assert_eq!(snap.lost_no_ring, 2);
    assert_eq!(snap.totals.drained, 12);
    assert_eq!(snap.totals.dropped, 0);
    let stats = &snap.instance("crowded").unwrap().stats;
    assert_eq!(stats.distinct_threads().count, 3, "A, B and C all got through");
    let mut ids = stats.op(1).unwrap().thread_ids().to_vec();
    ids.sort_unstable();
    let mut expected = vec![a_ids.1, b.ids.1, c.ids.1];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    b.exit();
    c.exit();
}
