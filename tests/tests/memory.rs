//! Memory stays bounded by what observes at once: a thread that never
//! observes costs nothing, and after 10,000 short-lived observing threads
//! with at most 8 holding a ring slot at once, the segment's touched memory
//! (`mincore`) is within 8 rings plus the header and instance table, because
//! the sidecar frees exited threads' slots and new threads reuse them (or
//! adopt an exited thread's slot before the sidecar gets to it).
//! Every observation is accounted: drained + dropped = observe calls.
//!
//! One `#[test]`: the process segment and its sidecar are process-global.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use subetha_core::segment::{HEADER_SIZE, InstanceEntry, RingSlot, SegmentView, slot_state};
use subetha_core::{Instance, InstanceKind, ObservationRing, process_segment, process_sidecar, thread_id};
use subetha_tests::{TIMEOUT, wait_for};

const THREADS: u64 = 10_000;
const MAX_AT_ONCE: u32 = 8;
/// Every this many threads, one overfills its ring (drops are likely).
const BURST_EVERY: u64 = 500;
const BURST: u64 = ObservationRing::CAPACITY as u64 + 1500;
const PAGE: usize = 4096;

fn count_slots(view: &SegmentView, state: u32) -> u32 {
    (0..view.rings_in_use())
        .filter(|&i| view.ring_slot(i).unwrap().state.load(Ordering::Acquire) == state)
        .count() as u32
}

/// The resident-memory bound: header, the touched part of the instance
/// table, and `rings` ring slots (each rounded up to pages, plus one page
/// because a slot need not start on a page boundary).
fn bound(view: &SegmentView, rings: u32) -> usize {
    let instance_pages = (view.instances_in_use() as usize * size_of::<InstanceEntry>()).div_ceil(PAGE);
    let ring_pages = size_of::<RingSlot>().div_ceil(PAGE) + 1;
    HEADER_SIZE + instance_pages * PAGE + rings as usize * ring_pages * PAGE
}

#[test]
fn ten_thousand_short_lived_threads_reuse_eight_slots() {
    let steady = Arc::new(Instance::register(InstanceKind::CUSTOM, "mem-steady").unwrap());
    let burst = Arc::new(Instance::register(InstanceKind::CUSTOM, "mem-burst").unwrap());
    let sidecar = process_sidecar().expect("auto sidecar frees exited threads' slots");
    let view = process_segment().unwrap().view();
    assert_eq!(view.rings_in_use(), 0);
    let resident_at_start = view.resident_bytes().unwrap();
    assert!(
        resident_at_start >= HEADER_SIZE,
        "mincore sees at least the header"
    );
    assert!(
        resident_at_start <= bound(view, 0),
        "nothing but header and instance table touched"
    );

    // Threads that never observe claim nothing and touch nothing.
    let idle: Vec<_> = (0..64)
        .map(|_| {
            let steady = Arc::clone(&steady);
            std::thread::spawn(move || (thread_id(), steady.id(), steady.policy()))
        })
        .collect();
    for handle in idle {
        let (tid, id, policy) = handle.join().unwrap();
        assert!(tid != 0 && id == steady.id() && policy == 0);
    }
    assert_eq!(
        view.rings_in_use(),
        0,
        "non-observing threads claimed no ring slot"
    );
    assert_eq!(
        view.resident_bytes().unwrap(),
        resident_at_start,
        "and touched no memory"
    );

    // 10,000 observing threads. A new one starts only while fewer than 8
    // threads are unjoined plus slots still await the sidecar, so at most 8
    // slots are ever claimed at once.
    let calls = Arc::new(AtomicU64::new(0));
    let queued = Arc::new(AtomicU64::new(0));
    let dropped = Arc::new(AtomicU64::new(0));
    let mut alive: VecDeque<std::thread::JoinHandle<()>> = VecDeque::new();
    let started = Instant::now();
    let mut max_alive = 0;
    for t in 0..THREADS {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            while alive.front().is_some_and(|h| h.is_finished()) {
                alive.pop_front().unwrap().join().unwrap();
            }
            let busy = alive.len() as u32 + count_slots(view, slot_state::ORPHANED);
            if busy < MAX_AT_ONCE {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "thread {t}: no slot freed within {TIMEOUT:?} ({} alive)",
                alive.len()
            );
            std::thread::sleep(Duration::from_micros(20));
        }
        let (steady, burst) = (Arc::clone(&steady), Arc::clone(&burst));
        let (calls, queued, dropped) = (Arc::clone(&calls), Arc::clone(&queued), Arc::clone(&dropped));
        alive.push_back(std::thread::spawn(move || {
            let (instance, n) = if t % BURST_EVERY == 0 {
                (&burst, BURST)
            } else {
                (&steady, 1 + t % 5)
            };
            let (mut ok, mut full) = (0, 0);
            for k in 0..n {
                match instance.observe(1 + (k % 3) as u16, 0, k) {
                    Ok(true) => ok += 1,
                    Ok(false) => full += 1,
                    Err(e) => panic!("thread {t}: {e}"),
                }
            }
            calls.fetch_add(n, Ordering::Relaxed);
            queued.fetch_add(ok, Ordering::Relaxed);
            dropped.fetch_add(full, Ordering::Relaxed);
        }));
        max_alive = max_alive.max(alive.len());
    }
    for handle in alive {
        handle.join().unwrap();
    }
    let elapsed = started.elapsed();
    assert!(max_alive <= MAX_AT_ONCE as usize);

    let calls = calls.load(Ordering::Relaxed);
    let queued = queued.load(Ordering::Relaxed);
    let dropped = dropped.load(Ordering::Relaxed);
    assert_eq!(queued + dropped, calls);
    let snap = wait_for(
        TIMEOUT,
        "the sidecar to drain everything and free every slot",
        || {
            let snap = sidecar.snapshot();
            let done =
                snap.totals.drained == queued && count_slots(view, slot_state::FREE) == view.rings_in_use();
            done.then_some(snap)
        },
        || {
            format!(
                "{:?}; queued {queued} dropped {dropped}",
                sidecar.snapshot().totals
            )
        },
    );

    // Conservation, in the consumer's books.
    assert_eq!(
        snap.totals.drained + snap.totals.dropped,
        calls,
        "drained + dropped = observe calls"
    );
    assert_eq!(snap.totals.dropped, dropped);
    assert_eq!(snap.totals.unattributed, 0);
    assert_eq!(snap.lost_no_ring, 0);
    let ops = |name: &str| snap.instance(name).unwrap().stats.total_ops();
    assert_eq!(ops("mem-steady") + ops("mem-burst"), queued);
    assert_eq!(
        snap.instance("mem-burst").unwrap().stats.drops_attributed(),
        dropped,
        "only bursts drop"
    );

    // Slot reuse: never more than 8 slots, claimed 10,000 times between them.
    // A thread may adopt an exited thread's slot before the sidecar frees
    // it, so a slot is freed at most once per claim.
    let high_water = view.rings_in_use();
    assert!(
        (u64::from(high_water)..=THREADS).contains(&snap.totals.freed_slots),
        "{:?}",
        snap.totals
    );
    assert!(
        (1..=MAX_AT_ONCE).contains(&high_water),
        "ring high-water mark {high_water} > {MAX_AT_ONCE}"
    );
    let generations: Vec<u32> = (0..high_water)
        .map(|i| view.ring_slot(i).unwrap().generation.load(Ordering::Relaxed))
        .collect();
    assert_eq!(
        generations.iter().map(|&g| u64::from(g)).sum::<u64>(),
        THREADS,
        "{generations:?}"
    );
    assert!(
        generations
            .iter()
            .any(|&g| u64::from(g) >= THREADS / u64::from(MAX_AT_ONCE)),
        "{generations:?}"
    );

    // Touched memory: at least the rings that were filled, at most 8 rings
    // plus header and instance table.
    let resident = view.resident_bytes().unwrap();
    let limit = bound(view, MAX_AT_ONCE);
    assert!(
        resident >= size_of::<ObservationRing>() / PAGE * PAGE,
        "a full ring's pages are resident ({resident} bytes)"
    );
    assert!(
        resident <= limit,
        "resident {resident} bytes > bound {limit} (high water {high_water}, generations {generations:?})"
    );
    eprintln!(
        "{THREADS} threads in {elapsed:?}: {calls} observations, {dropped} dropped; \
         {high_water} slots, {resident} of {limit} bytes resident"
    );
}
