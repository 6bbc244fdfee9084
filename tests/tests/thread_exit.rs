//! Observations made while a thread exits, from other thread-locals'
//! destructors: one that runs before the thread gives its ring slot back
//! still gets through; one that runs after is refused with `ThreadExiting`
//! and counted in `lost_no_ring`, without claiming a new slot.
//!
//! One `#[test]`: the process segment and its sidecar are process-global.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Sender, channel};

use subetha_core::segment::slot_state;
use subetha_core::{Instance, InstanceKind, RegistryError, process_segment, process_sidecar};
use subetha_tests::{TIMEOUT, wait_for};

/// Observes `instance` once when dropped and reports the outcome.
struct ObserveOnDrop {
    instance: Arc<Instance>,
    report: Sender<Result<bool, RegistryError>>,
}

impl Drop for ObserveOnDrop {
    fn drop(&mut self) {
        let _ = self.report.send(self.instance.observe(2, 0, 0));
    }
}

thread_local! {
    static AT_EXIT: RefCell<Option<ObserveOnDrop>> = const { RefCell::new(None) };
    static FIRST: RefCell<Option<Tell>> = const { RefCell::new(None) };
    static SECOND: RefCell<Option<Tell>> = const { RefCell::new(None) };
}

/// Sends its tag when dropped.
struct Tell(u8, Sender<u8>);

impl Drop for Tell {
    fn drop(&mut self) {
        let _ = self.1.send(self.0);
    }
}

/// Whether this std runs thread-local destructors in reverse order of
/// registration (the premise of the two scenarios below).
fn destructors_run_in_reverse() -> bool {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        FIRST.with(|f| *f.borrow_mut() = Some(Tell(1, tx.clone())));
        SECOND.with(|f| *f.borrow_mut() = Some(Tell(2, tx)));
    })
    .join()
    .unwrap();
    rx.iter().collect::<Vec<_>>() == [2, 1]
}

#[test]
fn observations_from_thread_exit_are_delivered_or_counted_lost() {
    let instance = Arc::new(Instance::register(InstanceKind::CUSTOM, "at-exit").unwrap());
    let sidecar = process_sidecar().expect("auto sidecar");
    let view = process_segment().unwrap().view();
    assert!(
        destructors_run_in_reverse(),
        "this std runs thread-local destructors in another order; the scenarios below assume LIFO"
    );

    // Registered after the thread's slot: its destructor runs first
    // (thread-local destructors run in reverse order of registration), while
    // the slot is still the thread's.
    let (report, late) = channel();
    let handle = {
        let instance = Arc::clone(&instance);
        std::thread::spawn(move || {
            assert!(instance.observe(1, 0, 0).unwrap());
            AT_EXIT.with(|slot| *slot.borrow_mut() = Some(ObserveOnDrop { instance, report }));
        })
    };
    handle.join().unwrap();
    assert!(
        late.recv().unwrap().unwrap(),
        "a destructor running before the slot is released still observes"
    );
    assert_eq!(view.live().lost_no_ring.load(Ordering::Relaxed), 0);

    wait_for(
        TIMEOUT,
        "the first thread's slot to be freed",
        || (view.ring_slot(0).unwrap().state.load(Ordering::Acquire) == slot_state::FREE).then_some(()),
        String::new,
    );
    let claims_before = view.ring_slot(0).unwrap().generation.load(Ordering::Relaxed);

    // Registered before the thread's slot: its destructor runs after the
    // slot was released.
    let (report, early) = channel();
    let handle = {
        let instance = Arc::clone(&instance);
        std::thread::spawn(move || {
            let observer = ObserveOnDrop {
                instance: Arc::clone(&instance),
                report,
            };
            AT_EXIT.with(|slot| *slot.borrow_mut() = Some(observer));
            assert!(instance.observe(1, 0, 0).unwrap());
        })
    };
    handle.join().unwrap();
    let result = early.recv().unwrap();
    assert!(matches!(result, Err(RegistryError::ThreadExiting)), "{result:?}");
    assert_eq!(
        view.live().lost_no_ring.load(Ordering::Relaxed),
        1,
        "counted lost"
    );

    // No slot was resurrected for the exiting thread; everything else is
    // drained and the slots are freed.
    let snap = wait_for(
        TIMEOUT,
        "3 observations drained and all slots freed",
        || {
            let snap = sidecar.snapshot();
            let free = (0..view.rings_in_use())
                .all(|i| view.ring_slot(i).unwrap().state.load(Ordering::Acquire) == slot_state::FREE);
            (snap.totals.drained == 3 && free).then_some(snap)
        },
        || format!("{:?}", sidecar.snapshot().totals),
    );
    assert_eq!(
        view.ring_slot(0).unwrap().generation.load(Ordering::Relaxed),
        claims_before + 1,
        "the second thread claimed once"
    );
    assert_eq!(view.rings_in_use(), 1);
    let stats = &snap.instance("at-exit").unwrap().stats;
    assert_eq!((stats.op(1).unwrap().ops(), stats.op(2).unwrap().ops()), (2, 1));
    assert_eq!(snap.lost_no_ring, 1);
    assert_eq!(snap.totals.freed_slots, 2);
}
