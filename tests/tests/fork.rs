//! Fork safety with a real `fork()`: the child of an instrumented process
//! gets a segment of its own, never writes into the parent's rings, keeps
//! the inherited instance ids meaning the same instances, and hands out
//! thread ids that cannot collide with the parent's.
//!
//! The parent runs with the sidecar off and drains its own segment, so
//! every count is exact. The child reports through a pipe and its exit
//! status. One `#[test]`: the segment is process-global, and forking a
//! process with other tests running in it would fork them too.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;

use subetha_core::segment::{instance_state, slot_state};
use subetha_core::{
    Drainer, Instance, InstanceKind, InstanceRecord, Observation, SegmentView, SidecarMode, process_segment,
    process_sidecar, set_sidecar_mode, thread_id,
};
use subetha_tests::forking::in_forked_child;
use subetha_tests::{gettid, procfs};

const KIND: InstanceKind = InstanceKind {
    code: 7,
    name: "forkkind",
    ops: &["a", "b", "c", "d"],
};
const PARENT_WORKERS: usize = 3;

/// What the parent knew at the fork, for the child to compare against.
#[derive(Clone, Copy, Debug)]
struct AtFork {
    parent_pid: u32,
    memfd: i32,
    memfd_id: procfs::FileId,
    base: usize,
    forking_thread_id: u32,
    max_parent_thread_id: u32,
}

fn drain_all(drainer: &mut Drainer<&SegmentView>) -> u64 {
    let mut total = 0;
    for _ in 0..100 {
        let drained = drainer.scan().drained;
        total += drained;
        if drained == 0 {
            return total;
        }
    }
    panic!("rings never became empty");
}

fn find(records: &[InstanceRecord], id: u32) -> Option<&InstanceRecord> {
    records.iter().find(|r| r.meta.id == id)
}

fn ops(records: &[InstanceRecord], id: u32, op: u16) -> u64 {
    find(records, id).map_or(0, |r| r.stats.op(op).unwrap().ops())
}

#[test]
fn forked_child_gets_its_own_segment_and_leaves_the_parents_rings_alone() {
    set_sidecar_mode(SidecarMode::Off);
    let a = Instance::register(KIND, "fork-a").unwrap();
    let b = Instance::register(KIND, "fork-b").unwrap();
    let retired = Instance::register(KIND, "fork-retired").unwrap();
    assert!(
        process_sidecar().is_none(),
        "sidecar mode off (is SUBETHA_SIDECAR set?)"
    );
    drop(retired); // retired before the fork: the child must not revive it

    // The forking thread and three workers observe; nothing is drained yet,
    // so the parent's rings hold data at the fork.
    for _ in 0..100 {
        assert!(a.observe(1, 0, 0).unwrap());
    }
    let mut parent_ids = vec![thread_id()];
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..PARENT_WORKERS)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..50 {
                        assert!(b.observe(2, 0, 0).unwrap());
                    }
                    thread_id()
                })
            })
            .collect();
        parent_ids.extend(workers.into_iter().map(|h| h.join().unwrap()));
    });
    let segment = process_segment().unwrap();
    let memfd = segment.fd().expect("memfd-backed").as_raw_fd();
    let at_fork = AtFork {
        parent_pid: std::process::id(),
        memfd,
        memfd_id: procfs::fd_file_id("self", memfd).unwrap(),
        base: segment.view().base_addr(),
        forking_thread_id: thread_id(),
        max_parent_thread_id: *parent_ids.iter().max().unwrap(),
    };
    let main_ring_tail = segment.view().ring_slot(0).unwrap().ring.producer_counters().tail;
    assert_eq!(main_ring_tail, 100);

    let b_id = b.id();
    let report = in_forked_child(|| child(at_fork, &a, b));
    eprintln!("child: {report}");

    // The parent's segment is untouched by the child: exactly what the
    // parent pushed, nothing for the ops only the child used, and the child
    // dropping its copy of `b` did not retire the parent's.
    let view = segment.view();
    assert_eq!(
        view.ring_slot(0).unwrap().ring.producer_counters().tail,
        main_ring_tail
    );
    let b_entry = view
        .instance(subetha_core::registry::entry_index(b_id).unwrap())
        .unwrap();
    assert_eq!(b_entry.state.load(Ordering::Acquire), instance_state::LIVE);
    assert_eq!(a.policy(), 0, "the child's policy write went to its own segment");
    assert_eq!(
        procfs::fd_file_id("self", memfd),
        Some(at_fork.memfd_id),
        "our memfd is still open"
    );

    for _ in 0..5 {
        assert!(a.observe(1, 0, 0).unwrap());
    }
    let mut drainer = Drainer::attach(view).unwrap();
    assert_eq!(drain_all(&mut drainer), 100 + 5 + 50 * PARENT_WORKERS as u64);
    let records: Vec<InstanceRecord> = drainer.instances().cloned().collect();
    assert_eq!(ops(&records, a.id(), 1), 105);
    assert_eq!(ops(&records, b_id, 2), 150);
    for op in [3, 4] {
        assert_eq!(ops(&records, a.id(), op), 0, "op {op} was only used by the child");
        assert_eq!(ops(&records, b_id, op), 0, "op {op} was only used by the child");
    }
    let totals = drainer.totals();
    assert_eq!((totals.unattributed, totals.dropped), (0, 0));
    // A worker that starts after another exited may adopt its orphaned slot
    // (nobody drained here before the fork), so they used 1..=3 slots: each
    // freed once, none left behind.
    assert!(
        (1..=PARENT_WORKERS as u64).contains(&totals.freed_slots),
        "the workers' slots: {totals:?}"
    );
    assert!(
        drainer.rings().iter().all(|r| r.state != slot_state::ORPHANED),
        "every exited worker's slot freed: {:?}",
        drainer.rings()
    );
    assert_eq!(drainer.retired().count(), 1, "fork-retired");
    let mut a_threads = find(&records, a.id())
        .unwrap()
        .stats
        .op(1)
        .unwrap()
        .thread_ids()
        .to_vec();
    a_threads.sort_unstable();
    assert_eq!(a_threads, vec![at_fork.forking_thread_id]);
}

/// Runs in the forked child; panics on any failed check. Returns a summary.
fn child(at: AtFork, a: &Instance, b: Instance) -> String {
    let me = std::process::id();
    assert_ne!(me, at.parent_pid);

    // The atfork handler closed the inherited memfd before anything else
    // could reuse its number.
    assert!(
        std::fs::symlink_metadata(format!("/proc/self/fd/{}", at.memfd)).is_err(),
        "the parent's memfd (fd {}) is still open in the child",
        at.memfd
    );
    // The forking thread keeps its id.
    assert_eq!(thread_id(), at.forking_thread_id);

    // The inherited instance, observed from the forking thread.
    for _ in 0..70 {
        assert!(a.observe(3, Observation::FLAG_CONTENDED, 500).unwrap());
    }
    let segment = process_segment().unwrap();
    let view = segment.view();
    assert_eq!(view.layout().pid, me, "the child's segment names the child");
    assert_ne!(view.base_addr(), at.base, "a new mapping");
    let fd = segment.fd().expect("memfd-backed").as_raw_fd();
    let id = procfs::fd_file_id("self", fd).unwrap();
    assert_ne!(id, at.memfd_id, "a new memfd");
    assert!(
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .unwrap()
            .to_string_lossy()
            .starts_with(procfs::MEMFD_LINK_PREFIX)
    );
    assert!(process_sidecar().is_none(), "sidecar mode off is inherited");

    // A new instance and a new thread in the child.
    let c = Instance::register(KIND, "fork-child-c").unwrap();
    assert!(
        c.id() != a.id() && c.id() != b.id(),
        "child ids do not collide with inherited ones"
    );
    let new_thread_id = std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..40 {
                assert!(c.observe(4, 0, 0).unwrap());
            }
            for _ in 0..10 {
                assert!(a.observe(3, Observation::FLAG_MISS, 0).unwrap());
            }
            thread_id()
        })
        .join()
        .unwrap()
    });
    assert!(
        new_thread_id > at.max_parent_thread_id,
        "new thread id {new_thread_id} must exceed every parent id (max {})",
        at.max_parent_thread_id
    );

    // No descriptor and no mapping of the parent's segment is left.
    let open = procfs::open_file_ids("self");
    assert!(
        open.iter().all(|(_, file)| *file != at.memfd_id),
        "a descriptor still refers to the parent's memfd: {open:?}"
    );
    assert_eq!(
        procfs::subetha_memfds("self"),
        vec![fd],
        "exactly our own segment's memfd"
    );
    let leftover = procfs::maps_of_inode("self", "memfd:subetha", at.memfd_id.1);
    assert!(
        leftover.is_empty(),
        "the parent's segment is still mapped: {leftover:?}"
    );
    let own_mapping = procfs::maps_of_inode("self", "memfd:subetha", id.1);
    assert!(!own_mapping.is_empty(), "our own segment is mapped");
    assert_eq!(
        std::fs::metadata(format!("/proc/self/fd/{fd}")).unwrap().ino(),
        id.1
    );

    // Drain the child's own segment: the inherited ids are attributed,
    // nothing of the parent's data is here.
    let mut drainer = Drainer::attach(view).expect("nobody else drains the child's segment");
    assert_eq!(drain_all(&mut drainer), 70 + 40 + 10);
    let records: Vec<InstanceRecord> = drainer.instances().cloned().collect();
    let ra = find(&records, a.id()).expect("inherited instance attributed");
    assert_eq!(ra.meta.name, "fork-a");
    assert_eq!(
        (ra.meta.kind_name.as_str(), ra.meta.op_name(4).as_str()),
        ("forkkind", "d")
    );
    let op3 = ra.stats.op(3).unwrap();
    assert_eq!((op3.ops(), op3.contended(), op3.misses()), (80, 70, 10));
    assert_eq!(op3.latency().unwrap().count(), 70);
    let mut threads = op3.thread_ids().to_vec();
    threads.sort_unstable();
    assert_eq!(threads, vec![at.forking_thread_id, new_thread_id]);
    assert_eq!(
        ops(&records, a.id(), 1),
        0,
        "the parent's observations are not in the child's segment"
    );
    let rb = find(&records, b.id()).expect("inherited live instance copied");
    assert_eq!((rb.meta.name.as_str(), rb.stats.total_ops()), ("fork-b", 0));
    assert_eq!(ops(&records, c.id(), 4), 40);
    assert!(
        records.iter().all(|r| r.meta.name != "fork-retired"),
        "an instance retired before the fork is not revived"
    );
    let totals = drainer.totals();
    assert_eq!((totals.unattributed, totals.dropped), (0, 0));
    assert_eq!(view.live().lost_no_ring.load(Ordering::Relaxed), 0);
    let ring0 = &drainer.rings()[0];
    assert_eq!((ring0.thread_id, ring0.os_tid), (at.forking_thread_id, gettid()));
    assert_eq!(
        view.ring_slot(1).unwrap().state.load(Ordering::Acquire),
        slot_state::FREE
    );

    // Policy words and retirement act on the child's table only.
    assert!(drainer.set_policy(a.id(), 99));
    assert_eq!(a.policy(), 99);
    drop(b);
    drain_all(&mut drainer);
    assert!(drainer.retired().any(|r| r.meta.name == "fork-b"));

    format!(
        "pid {me}, segment base {:#x}, memfd ino {}, new thread id {new_thread_id}",
        view.base_addr(),
        id.1
    )
}
