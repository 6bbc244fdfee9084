//! Fork with the automatic sidecar running (the default an application
//! gets): the child gets a sidecar of its own on a segment of its own, and
//! a grandchild forked before the child ever used subetha still sees the
//! original instance ids. Each process's sidecar reports exactly its own
//! observations.
//!
//! One `#[test]`: the segment and the sidecar are process-global.

use std::sync::atomic::Ordering;

use subetha_core::{Instance, InstanceKind, Snapshot, process_segment, process_sidecar, thread_id};
use subetha_tests::forking::in_forked_child;
use subetha_tests::{TIMEOUT, wait_for};

const KIND: InstanceKind = InstanceKind {
    code: 9,
    name: "sidecarfork",
    ops: &[],
};

/// Waits until this process's sidecar shows `ops` for op kind `op` of the
/// instance named `name`, then returns the snapshot.
fn drained(name: &str, op: u16, ops: u64) -> Snapshot {
    let sidecar = process_sidecar().expect("a sidecar runs in this process");
    wait_for(
        TIMEOUT,
        format!("{name} op {op} to reach {ops} in pid {}", std::process::id()),
        || {
            let snap = sidecar.snapshot();
            (snap.instance(name)?.stats.op(op)?.ops() == ops).then_some(snap)
        },
        || format!("{:?}", sidecar.snapshot().totals),
    )
}

/// The holder pid in this process's segment's lease word.
fn lease_holder() -> u32 {
    (process_segment()
        .unwrap()
        .view()
        .live()
        .consumer
        .load(Ordering::Acquire)
        >> 32) as u32
}

#[test]
fn each_forked_process_has_its_own_sidecar_and_counts() {
    let a = Instance::register(KIND, "sf-a").unwrap();
    for _ in 0..300 {
        assert!(a.observe(1, 0, 0).unwrap());
    }
    let parent_sidecar = process_sidecar().expect("auto sidecar") as *const _ as usize;
    drained("sf-a", 1, 300);
    let parent = std::process::id();
    assert_eq!(lease_holder(), parent);
    let parent_thread = thread_id();

    let report = in_forked_child(|| {
        // Before any use in the child: fork again. The grandchild's first
        // observation builds its segment from the original instance table.
        let grandchild = in_forked_child(|| {
            for _ in 0..33 {
                assert!(a.observe(2, 0, 0).unwrap());
            }
            let me = std::process::id();
            assert_eq!(process_segment().unwrap().view().layout().pid, me);
            assert_eq!(
                lease_holder(),
                me,
                "the grandchild's sidecar drains the grandchild's segment"
            );
            let snap = drained("sf-a", 2, 33);
            let stats = &snap.instance("sf-a").unwrap().stats;
            assert_eq!((stats.op(1).unwrap().ops(), stats.total_ops()), (0, 33));
            assert_eq!(snap.totals.unattributed, 0);
            assert_eq!(thread_id(), parent_thread);
            format!("grandchild {me} ok")
        });

        for _ in 0..44 {
            assert!(a.observe(3, 0, 0).unwrap());
        }
        let me = std::process::id();
        let sidecar = process_sidecar().expect("a new sidecar starts with the child's segment");
        assert_ne!(
            sidecar as *const _ as usize, parent_sidecar,
            "not the parent's (dead) sidecar"
        );
        assert_eq!(process_segment().unwrap().view().layout().pid, me);
        assert_eq!(lease_holder(), me);
        let snap = drained("sf-a", 3, 44);
        let stats = &snap.instance("sf-a").unwrap().stats;
        assert_eq!(
            stats.total_ops(),
            44,
            "neither the parent's nor the grandchild's observations"
        );
        assert_eq!(snap.totals.drained, 44);
        assert_eq!(snap.totals.unattributed, 0);
        format!("child {me} ok; {grandchild}")
    });
    eprintln!("{report}");

    // The parent's sidecar saw only the parent's observations.
    for _ in 0..7 {
        assert!(a.observe(1, 0, 0).unwrap());
    }
    let snap = drained("sf-a", 1, 307);
    let stats = &snap.instance("sf-a").unwrap().stats;
    assert_eq!(stats.total_ops(), 307);
    assert_eq!(snap.totals.drained, 307);
    assert_eq!(snap.totals.unattributed, 0);
    assert_eq!(lease_holder(), parent);
}
