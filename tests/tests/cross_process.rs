//! A consumer in another process drains an instrumented process's segment
//! the way the agent does: find the memfd through `/proc/<pid>/fd`, map it
//! with the process's identity as expectations, take the lease, scan.
//!
//! The instrumented process is the `subetha-child` helper with
//! `SUBETHA_SIDECAR=off`, so nothing drains it but us and every count is
//! exact, including a ring overfilled by 904 observations.

use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

use subetha_core::drain::RingRecord;
use subetha_core::lease::LeaseBusy;
use subetha_core::segment::{Expectations, SegmentError, process_start_time, slot_state};
use subetha_core::{Drainer, InstanceRecord, Observation, ObservationRing, SegmentView};
use subetha_tests::child::{Helper, Observed};
use subetha_tests::forking::in_forked_child;
use subetha_tests::{getuid, procfs};

const HELPER: &str = env!("CARGO_BIN_EXE_subetha-child");

/// Opens another process's descriptor read-write, as a consumer must: it
/// maps the segment shared and writes ring heads and the lease.
fn open_rw(pid: u32, fd: i32) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .unwrap_or_else(|e| panic!("open /proc/{pid}/fd/{fd}: {e}"))
}

/// Scans until a scan drains nothing; returns the total drained.
fn drain_all(drainer: &mut Drainer<SegmentView>) -> u64 {
    let mut total = 0;
    for _ in 0..100 {
        let report = drainer.scan();
        assert_eq!(report.corrupt_rings, 0);
        total += report.drained;
        if report.drained == 0 {
            return total;
        }
    }
    panic!("rings never became empty");
}

fn record(drainer: &Drainer<SegmentView>, id: u32) -> InstanceRecord {
    drainer
        .instances()
        .find(|r| r.meta.id == id)
        .unwrap_or_else(|| panic!("instance {id:#x} not live"))
        .clone()
}

fn ring_of(drainer: &Drainer<SegmentView>, os_tid: u32) -> RingRecord {
    drainer
        .rings()
        .iter()
        .find(|r| r.os_tid == os_tid)
        .unwrap_or_else(|| panic!("no ring for tid {os_tid}: {:#?}", drainer.rings()))
        .clone()
}

/// Our subetha descriptors that hold a segment this process created (its
/// header names our pid). The other tests here run on parallel threads and
/// briefly hold descriptors of their children's segments, opened through
/// `/proc`; those are not ours, and one closed while we look is skipped.
fn own_segment_memfds() -> Vec<i32> {
    let ours = Expectations {
        pid: Some(std::process::id()),
        start_time_ticks: None,
        uid: None,
        pid_ns_inode: None,
    };
    procfs::subetha_memfds("self")
        .into_iter()
        .filter(|&fd| {
            let Ok(file) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/self/fd/{fd}"))
            else {
                return false;
            };
            // A child's segment fails with `PidMismatch`; a descriptor
            // number reused by an unrelated file fails its own way.
            SegmentView::map_fd(file.as_fd(), &ours).is_ok()
        })
        .collect()
}

#[test]
fn another_process_drains_the_childs_segment_exactly() {
    // The consumer side never creates a segment of its own.
    assert_eq!(own_segment_memfds(), Vec::<i32>::new());

    let mut child = Helper::spawn(HELPER, &[("SUBETHA_SIDECAR", "off")]);
    let pid = child.pid();
    let a = child.register("xp-a");
    let b = child.register("xp-b");
    let gone = child.register("xp-gone");
    let (w1_tid, w1_id) = child.spawn_thread("worker-1");
    let (burst_tid, burst_id) = child.spawn_thread("burst");
    let ok = |n| Observed {
        queued: n,
        dropped: 0,
        lost: 0,
    };
    let contended = Observation::FLAG_CONTENDED;
    let miss = Observation::FLAG_MISS;
    assert_eq!(child.observe("main", "xp-a", 100, 1, 0, 0), ok(100));
    assert_eq!(child.observe("main", "xp-a", 10, 2, contended, 777), ok(10));
    assert_eq!(child.observe("worker-1", "xp-a", 50, 3, miss, 0), ok(50));
    assert_eq!(child.observe("worker-1", "xp-b", 200, 1, 0, 5), ok(200));
    assert_eq!(child.observe("main", "xp-gone", 7, 1, 0, 0), ok(7));
    child.cmd("drop xp-gone");
    // Nobody drains: the 4097th push onwards is dropped.
    let burst = child.observe("burst", "xp-b", 5000, 2, 0, 0);
    assert_eq!(
        burst,
        Observed {
            queued: ObservationRing::CAPACITY as u64,
            dropped: 904,
            lost: 0
        }
    );

    let info = child.info();
    assert_eq!(info.pid, pid);
    assert!(!info.sidecar, "SUBETHA_SIDECAR=off keeps the sidecar away");
    let memfds = procfs::subetha_memfds(&pid.to_string());
    assert_eq!(
        memfds,
        vec![info.memfd],
        "exactly one subetha memfd, the one the child names"
    );

    // Map it through /proc with the child's identity as expectations.
    let file = open_rw(pid, memfds[0]);
    let expect = Expectations {
        pid: Some(pid),
        start_time_ticks: Some(process_start_time(pid).expect("child start time")),
        uid: Some(getuid()),
        pid_ns_inode: None,
    };
    let wrong_pid = Expectations {
        pid: Some(pid + 1),
        ..expect
    };
    let refused = SegmentView::map_fd(file.as_fd(), &wrong_pid);
    assert!(
        matches!(refused, Err(SegmentError::PidMismatch { found, .. }) if found == pid),
        "{refused:?}"
    );
    let wrong_start = Expectations {
        start_time_ticks: expect.start_time_ticks.map(|t| t + 1),
        ..expect
    };
    let refused = SegmentView::map_fd(file.as_fd(), &wrong_start);
    assert!(
        matches!(refused, Err(SegmentError::StartTimeMismatch { .. })),
        "{refused:?}"
    );
    let wrong_uid = Expectations {
        uid: Some(getuid() + 1),
        ..expect
    };
    let refused = SegmentView::map_fd(file.as_fd(), &wrong_uid);
    assert!(
        matches!(refused, Err(SegmentError::UidMismatch { .. })),
        "{refused:?}"
    );
    let view = SegmentView::map_fd(file.as_fd(), &expect).expect("the child's segment validates");
    drop(file);
    assert_eq!(view.layout().pid, pid);
    assert_eq!(
        view.live().sidecar_mode.load(Ordering::Relaxed),
        0,
        "mode off recorded"
    );
    assert_eq!(
        view.live().consumer.load(Ordering::Acquire),
        0,
        "nobody drains yet"
    );

    let mut drainer = Drainer::attach(view).expect("lease is free");
    let our_pid = std::process::id();
    assert_eq!(
        drainer.view().live().consumer.load(Ordering::Acquire) >> 32,
        u64::from(our_pid)
    );
    let mapped_again = SegmentView::map_fd(open_rw(pid, memfds[0]).as_fd(), &expect).unwrap();
    assert_eq!(
        Drainer::attach(mapped_again).unwrap_err(),
        LeaseBusy { holder_pid: our_pid },
        "one consumer at a time, across mappings"
    );

    // First drain: everything, exactly.
    let drained = drain_all(&mut drainer);
    assert_eq!(drained, 100 + 10 + 50 + 200 + 7 + 4096);
    let totals = drainer.totals();
    assert_eq!(
        (
            totals.drained,
            totals.dropped,
            totals.episodes,
            totals.unattributed
        ),
        (4463, 904, 1, 0)
    );
    assert_eq!(totals.freed_instances, 1, "xp-gone retired and freed");
    assert_eq!(drainer.view().live().lost_no_ring.load(Ordering::Relaxed), 0);

    let ra = record(&drainer, a);
    assert_eq!(ra.meta.name, "xp-a");
    assert_eq!((ra.meta.kind, ra.meta.kind_name.as_str()), (200, "testkind"));
    assert_eq!(ra.meta.op_name(2), "two");
    let op1 = ra.stats.op(1).unwrap();
    assert_eq!((op1.ops(), op1.contended(), op1.misses()), (100, 0, 0));
    assert!(op1.latency().is_none(), "latency 0 is not measured");
    let op2 = ra.stats.op(2).unwrap();
    assert_eq!((op2.ops(), op2.contended(), op2.misses()), (10, 10, 0));
    let hist = op2.latency().expect("latencies recorded");
    assert_eq!(
        (hist.count(), hist.min(), hist.max(), hist.sum()),
        (10, 777, 777, 7770)
    );
    let op3 = ra.stats.op(3).unwrap();
    assert_eq!((op3.ops(), op3.contended(), op3.misses()), (50, 0, 50));
    assert_eq!(op3.thread_ids(), &[w1_id]);
    assert_eq!(ra.stats.distinct_threads().count, 2, "main and worker-1");
    assert_eq!(ra.stats.drops_attributed(), 0);

    let rb = record(&drainer, b);
    let op1 = rb.stats.op(1).unwrap();
    assert_eq!(op1.ops(), 200);
    let hist = op1.latency().unwrap();
    assert_eq!((hist.count(), hist.min(), hist.max()), (200, 5, 5));
    assert_eq!(op1.max_latency().unwrap().thread_id, w1_id);
    assert_eq!(rb.stats.op(2).unwrap().ops(), 4096);
    assert_eq!(rb.stats.op(2).unwrap().thread_ids(), &[burst_id]);
    assert_eq!(
        rb.stats.drops_attributed(),
        904,
        "drops attributed to the first dropped instance"
    );

    assert!(drainer.instances().all(|r| r.meta.id != gone));
    let retired: Vec<_> = drainer.retired().collect();
    assert_eq!(retired.len(), 1);
    assert_eq!(
        (retired[0].meta.id, retired[0].meta.name.as_str()),
        (gone, "xp-gone")
    );
    assert_eq!(retired[0].stats.total_ops(), 7);
    assert!(retired[0].meta.retired_mono_ns.is_some_and(|t| t > 0));

    let ring = ring_of(&drainer, burst_tid);
    assert_eq!(ring.thread_name, "burst");
    assert_eq!(ring.thread_id, burst_id);
    assert_eq!(ring.state, slot_state::ACTIVE);
    assert_eq!((ring.drained, ring.dropped, ring.episodes), (4096, 904, 1));
    assert_eq!(ring.slot_dropped_total, 904);
    assert_eq!(ring_of(&drainer, w1_tid).drained, 250);
    let episodes: Vec<_> = drainer.episodes().cloned().collect();
    assert_eq!(episodes.len(), 1, "{episodes:#?}");
    let episode = &episodes[0];
    assert_eq!((episode.slot, episode.os_tid), (ring.slot, burst_tid));
    assert_eq!(episode.thread_name, "burst");
    assert_eq!(
        (episode.dropped, episode.first_instance, episode.merged),
        (904, b, 0)
    );
    assert_eq!(episode.end_mono_ns, None, "no successful push since the drops");

    // One successful push ends the episode; the next scan sees the end.
    assert_eq!(child.observe("burst", "xp-b", 1, 2, 0, 0), ok(1));
    assert_eq!(drain_all(&mut drainer), 1);
    let episodes: Vec<_> = drainer.episodes().cloned().collect();
    assert_eq!(episodes.len(), 1);
    let end = episodes[0].end_mono_ns.expect("episode ended");
    assert!(end >= episodes[0].begin_mono_ns && !episodes[0].end_estimated);
    assert_eq!(episodes[0].dropped, 904);
    let ring = ring_of(&drainer, burst_tid);
    assert_eq!((ring.drained, ring.dropped, ring.episodes), (4097, 904, 1));

    // Exited threads' slots are drained and freed by this consumer; a
    // thread that exits in the middle of a drop episode closes it.
    child.observe("worker-1", "xp-a", 3, 1, 0, 0);
    let (burst2_tid, _) = child.spawn_thread("burst2");
    let over = child.observe("burst2", "xp-a", ObservationRing::CAPACITY as u64 + 4, 1, 0, 0);
    assert_eq!((over.queued, over.dropped), (ObservationRing::CAPACITY as u64, 4));
    child.cmd("join worker-1");
    child.cmd("join burst");
    child.cmd("join burst2");
    let report = drainer.scan();
    assert_eq!(
        (
            report.drained,
            report.dropped,
            report.episodes_begun,
            report.freed_slots
        ),
        (3 + ObservationRing::CAPACITY as u64, 4, 1, 3)
    );
    let last = drainer.episodes().last().unwrap().clone();
    assert_eq!(
        (last.os_tid, last.thread_name.as_str(), last.dropped),
        (burst2_tid, "burst2", 4)
    );
    assert!(
        last.end_mono_ns.is_some(),
        "thread exit closed the episode: {last:?}"
    );
    assert_eq!(drainer.episodes().count(), 2);
    for slot in 0..drainer.view().rings_in_use() {
        let state = drainer
            .view()
            .ring_slot(slot)
            .unwrap()
            .state
            .load(Ordering::Acquire);
        let expected = if slot == 0 {
            slot_state::ACTIVE
        } else {
            slot_state::FREE
        };
        assert_eq!(
            state, expected,
            "slot {slot} (slot 0 is the helper's main thread)"
        );
    }

    // Later observations arrive as exact increments.
    assert_eq!(child.observe("main", "xp-a", 25, 1, 0, 0), ok(25));
    assert_eq!(drain_all(&mut drainer), 25);
    assert_eq!(
        record(&drainer, a).stats.op(1).unwrap().ops(),
        100 + 3 + ObservationRing::CAPACITY as u64 + 25
    );

    // Detaching gives the lease back.
    let (records, totals) = drainer.detach();
    assert_eq!(
        totals.drained,
        4463 + 1 + 3 + ObservationRing::CAPACITY as u64 + 25
    );
    assert_eq!(records.len(), 2);
    let view = SegmentView::map_fd(open_rw(pid, memfds[0]).as_fd(), &expect).unwrap();
    assert_eq!(view.live().consumer.load(Ordering::Acquire), 0, "lease released");
    drop(view);
    child.quit();
}

/// The helper's memfd, mapped with the helper's identity.
fn map_child(child: &mut Helper) -> SegmentView {
    let info = child.info();
    let memfds = procfs::subetha_memfds(&info.pid.to_string());
    assert_eq!(memfds, vec![info.memfd]);
    let expect = Expectations {
        pid: Some(info.pid),
        start_time_ticks: process_start_time(info.pid),
        uid: Some(getuid()),
        pid_ns_inode: None,
    };
    SegmentView::map_fd(open_rw(info.pid, info.memfd).as_fd(), &expect)
        .expect("the child's segment validates")
}

#[test]
fn agent_is_refused_while_the_childs_own_sidecar_drains() {
    let mut child = Helper::spawn(HELPER, &[]);
    child.register("busy-a");
    let info = child.info();
    assert!(info.sidecar, "auto sidecar by default");
    let view = map_child(&mut child);
    assert_eq!(view.live().sidecar_mode.load(Ordering::Relaxed), 1);
    assert_eq!(
        Drainer::attach(view).unwrap_err(),
        LeaseBusy {
            holder_pid: child.pid()
        }
    );
    child.quit();
}

#[test]
fn a_dead_consumers_lease_is_broken_and_draining_resumes_where_it_stopped() {
    let mut child = Helper::spawn(HELPER, &[("SUBETHA_SIDECAR", "off")]);
    let id = child.register("dc-a");
    assert_eq!(child.observe("main", "dc-a", 100, 1, 0, 0).queued, 100);
    let view = map_child(&mut child);

    // A consumer in another process drains the first 100 and dies holding
    // the lease (no release: `_exit` without destructors).
    let report = in_forked_child(|| {
        let mut drainer = Drainer::attach(map_again(&view)).expect("lease is free");
        let drained = drainer.scan().drained;
        std::mem::forget(drainer);
        format!("{} {drained}", std::process::id())
    });
    let (dead_pid, drained) = report.split_once(' ').unwrap();
    assert_eq!(drained, "100");
    let dead_pid: u32 = dead_pid.parse().unwrap();
    assert_eq!(
        view.live().consumer.load(Ordering::Acquire) >> 32,
        u64::from(dead_pid),
        "the dead consumer's lease is left behind"
    );

    // The next consumer breaks the dead lease and gets exactly what was
    // pushed after the dead one's last scan.
    assert_eq!(child.observe("main", "dc-a", 50, 2, 0, 0).queued, 50);
    let mut drainer = Drainer::attach(view).expect("a dead holder's lease is broken");
    assert_eq!(
        drainer.view().live().consumer.load(Ordering::Acquire) >> 32,
        u64::from(std::process::id())
    );
    assert_eq!(drain_all(&mut drainer), 50);
    let stats = &record(&drainer, id).stats;
    assert_eq!((stats.op(1).unwrap().ops(), stats.op(2).unwrap().ops()), (0, 50));
    let ring = &drainer.rings()[0];
    assert_eq!((ring.drained, ring.slot_drained_total), (50, 150));
    drop(drainer);
    child.quit();
}

/// A second, independent mapping of the segment `view` maps, as a separate
/// agent process would make.
fn map_again(view: &SegmentView) -> SegmentView {
    let pid = view.layout().pid;
    let fd = procfs::subetha_memfds(&pid.to_string())[0];
    let expect = Expectations {
        pid: Some(pid),
        start_time_ticks: Some(view.layout().start_time_ticks),
        uid: Some(view.layout().uid),
        pid_ns_inode: None,
    };
    SegmentView::map_fd(open_rw(pid, fd).as_fd(), &expect).unwrap()
}
