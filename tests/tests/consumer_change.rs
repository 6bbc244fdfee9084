//! A new consumer (an agent that attaches after another consumer detached,
//! or restarts) must not blame a ring slot's current thread for drops that
//! an earlier occupant of the slot made and an earlier consumer already
//! accounted.
//!
//! Sidecar off: this test drives its consumers itself. One `#[test]`: the
//! process segment is process-global.

use subetha_core::{
    Drainer, Instance, InstanceKind, ObservationRing, SidecarMode, process_segment, process_sidecar,
    set_sidecar_mode,
};
use subetha_tests::gettid;

#[test]
fn new_consumer_does_not_charge_old_drops_to_the_slots_new_thread() {
    set_sidecar_mode(SidecarMode::Off);
    let x = Instance::register(InstanceKind::CUSTOM, "cc-x").unwrap();
    assert!(
        process_sidecar().is_none(),
        "sidecar mode off (is SUBETHA_SIDECAR set?)"
    );
    let view = process_segment().unwrap().view();

    // Thread A overfills slot 0 and exits.
    let a_tid = std::thread::scope(|s| {
        s.spawn(|| {
            let dropped = (0..5000).filter(|_| !x.observe(1, 0, 0).unwrap()).count();
            assert_eq!(dropped, 904);
            gettid()
        })
        .join()
        .unwrap()
    });

    // The first consumer accounts A's drops, frees the slot, detaches.
    let mut first = Drainer::attach(view).unwrap();
    let report = first.scan();
    assert_eq!(
        (
            report.drained,
            report.dropped,
            report.episodes_begun,
            report.freed_slots
        ),
        (ObservationRing::CAPACITY as u64, 904, 1, 1)
    );
    assert_eq!(first.episodes().next().unwrap().os_tid, a_tid);
    drop(first);

    // Thread B reuses slot 0 and drops nothing.
    let (b_tid, b_done) = std::sync::mpsc::channel();
    let x = &x;
    std::thread::scope(|s| {
        // Created in here so that a failing assertion drops `release` and
        // lets B finish instead of deadlocking the scope.
        let (release, wait) = std::sync::mpsc::channel::<()>();
        s.spawn(move || {
            for _ in 0..10 {
                assert!(x.observe(2, 0, 0).unwrap());
            }
            b_tid.send(gettid()).unwrap();
            let _ = wait.recv();
        });
        let b_tid = b_done.recv().unwrap();
        assert_eq!(view.rings_in_use(), 1, "B reused slot 0");

        // A second consumer attaches while B owns the slot.
        let mut second = Drainer::attach(view).unwrap();
        let report = second.scan();
        assert_eq!(report.drained, 10);
        let ring = &second.rings()[0];
        assert_eq!(ring.os_tid, b_tid);
        let blamed: Vec<_> = second.episodes().filter(|e| e.os_tid == b_tid).cloned().collect();
        assert!(
            ring.dropped == 0 && ring.episodes == 0 && blamed.is_empty(),
            "thread B (tid {b_tid}) dropped nothing, but the new consumer charges it with \
             {} drops in {} episodes: {blamed:#?}",
            ring.dropped,
            ring.episodes
        );
        release.send(()).unwrap();
    });
}
