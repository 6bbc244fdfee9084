//! A full ring table: with `SUBETHA_RING_SLOTS=2` (read when the segment is
//! created, so the scenario runs in a re-executed child process), a third
//! concurrently observing thread gets `RingTableFull`, each such observation
//! is counted in the header's `lost_no_ring`, and once one of the first two
//! threads exits and the sidecar frees its slot, the third thread claims it
//! on a later observation.

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
