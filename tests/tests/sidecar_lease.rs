//! With the automatic sidecar running, it holds the process segment's
//! consumer lease: a second consumer is refused with `LeaseBusy` naming
//! this process, and the refusal does not disturb the sidecar.
//!
//! One `#[test]`: the process segment and its sidecar are process-global.

use std::sync::atomic::Ordering;

use subetha_core::lease::LeaseBusy;
use subetha_core::{Drainer, Instance, InstanceKind, process_segment, process_sidecar};
use subetha_tests::{TIMEOUT, wait_for};

#[test]
fn second_consumer_is_refused_while_the_auto_sidecar_drains() {
    let instance = Instance::register(InstanceKind::CUSTOM, "lease-probe").unwrap();
    assert!(instance.observe(1, 0, 0).unwrap());
    let sidecar = process_sidecar().expect("the auto sidecar started with the segment");
    let segment = process_segment().unwrap();
    let view = segment.view();
    let pid = std::process::id();
    assert_eq!(
        view.live().sidecar_mode.load(Ordering::Relaxed),
        1,
        "auto mode recorded in the header"
    );

    let word = view.live().consumer.load(Ordering::Acquire);
    assert_eq!(word >> 32, u64::from(pid), "lease word {word:#x} names us");
    assert_ne!(word & 0xFFFF_FFFF, 0, "lease token is set");

    let err = Drainer::attach(view).expect_err("the sidecar holds the lease");
    assert_eq!(err, LeaseBusy { holder_pid: pid });
    assert!(err.to_string().contains(&pid.to_string()), "{err}");
    assert_eq!(
        view.live().consumer.load(Ordering::Acquire),
        word,
        "a refused attach leaves the lease alone"
    );

    // The sidecar is still the consumer: its heartbeat moves and it drains
    // what we push after the refusal.
    let beat = view.live().consumer_heartbeat_ns.load(Ordering::Acquire);
    wait_for(
        TIMEOUT,
        "the sidecar's heartbeat to advance",
        || (view.live().consumer_heartbeat_ns.load(Ordering::Acquire) > beat).then_some(()),
        || {
            format!(
                "heartbeat {}",
                view.live().consumer_heartbeat_ns.load(Ordering::Acquire)
            )
        },
    );
    for _ in 0..99 {
        assert!(instance.observe(2, 0, 0).unwrap());
    }
    wait_for(
        TIMEOUT,
        "the sidecar to drain all 100 observations",
        || {
            let snap = sidecar.snapshot();
            let record = snap.instance("lease-probe")?;
            (record.stats.total_ops() == 100).then_some(())
        },
        || format!("{:?}", sidecar.snapshot().totals),
    );
    let snap = sidecar.snapshot();
    let record = snap.instance("lease-probe").unwrap();
    assert_eq!(record.stats.op(1).unwrap().ops(), 1);
    assert_eq!(record.stats.op(2).unwrap().ops(), 99);
    assert_eq!(snap.totals.drained, 100);
    assert_eq!(snap.totals.unattributed, 0);
    assert_eq!(
        view.live().consumer.load(Ordering::Acquire),
        word,
        "still the same holder"
    );
}
