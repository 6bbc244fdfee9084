use std::sync::{Arc, Barrier as StdBarrier};

use super::super::test_support::{is_retired, op, unique, wait_for};
use super::raw::*;
use super::word::*;
use super::*;
use crate::Observation;

/// An unobserved mutex (the same word and slow path, nothing measured)
/// still excludes, blocks, times out and hands over.
#[test]
fn an_unobserved_mutex_excludes_blocks_and_times_out() {
    let m = Arc::new(Mutex::unobserved(0u64));
    let held = m.lock();
    let waiter = {
        let m = Arc::clone(&m);
        std::thread::spawn(move || {
            assert!(
                m.try_lock_for(Duration::from_millis(5)).is_none(),
                "the lock is held"
            );
            *m.lock() += 1;
        })
    };
    std::thread::sleep(Duration::from_millis(30));
    drop(held);
    waiter.join().unwrap();
    assert_eq!(*m.lock(), 1);
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 5000;
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for i in 0..PER_THREAD {
                    let mut guard = if i % 16 == 0 {
                        m.try_lock_for(Duration::from_secs(10)).expect("within 10 s")
                    } else {
                        m.lock()
                    };
                    let seen = *guard;
                    std::hint::spin_loop();
                    *guard = seen + 1;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(*m.lock(), 1 + THREADS * PER_THREAD);
}

#[test]
fn lock_word_and_small_data_share_a_cache_line_wherever_the_allocator_puts_them() {
    // `lock_api::Mutex` puts the data right after the raw lock.
    let m = Mutex::unobserved(0u64);
    let state = std::mem::offset_of!(RawMutex, state);
    let data = m.data_ptr() as usize - &m as *const _ as usize;
    assert_eq!(data, std::mem::size_of::<RawMutex>(), "data follows the raw lock");
    // Allocations are at least 16-byte aligned; try every such placement
    // within a line, also behind an `Arc`'s two counters.
    let per_acquisition = [
        std::mem::offset_of!(RawMutex, wait),
        std::mem::offset_of!(RawMutex, pending),
    ];
    for base in (0..64).step_by(16) {
        let line = |offset: usize| (base + offset) / 64;
        assert_eq!(line(state), line(data), "placement {base}: state and data split");
        for field in per_acquisition {
            assert_eq!(
                line(field),
                line(state),
                "placement {base}: byte {field} split from state"
            );
        }
        assert_eq!(
            line(data),
            line(data + 7),
            "placement {base}: a u64 of data splits"
        );
    }
}

#[test]
fn uncontended_lock_emits_lock_without_latency_and_try_lock_misses() {
    let name = unique("mutex-basic");
    let m = Mutex::named(&name, 0u32);
    set_sampling(&m, PolicyWord::default().with_sample_every(0));
    for _ in 0..10 {
        *m.lock() += 1;
    }
    let held = m.lock();
    assert!(m.try_lock().is_none());
    assert!(m.try_lock_for(Duration::from_millis(1)).is_none());
    drop(held);
    assert!(m.try_lock().is_some());
    let r = wait_for(&name, |r| r.stats.total_ops() >= 11);
    // 11 locks, none contended, no latency: counted at the 1st, 2nd,
    // 4th and 8th, the last three not yet.
    assert_eq!(op(&r, op::LOCK), (8, 0, 0, 0));
    // try_lock: one miss, one timed-out (contended + miss, with its
    // wait), one success.
    assert_eq!(op(&r, op::TRY_LOCK), (3, 1, 2, 1));
    // Sampling off: no hold times.
    assert_eq!(op(&r, op::UNLOCK), (0, 0, 0, 0));
    let timed_out = r.stats.op(op::TRY_LOCK).unwrap().latency().unwrap();
    let ms = crate::clock::calibration().ns_to_ticks(1_000_000);
    assert!(timed_out.max() >= ms * 9 / 10, "waited {} ticks", timed_out.max());
    // Dropping the mutex counts the rest.
    drop(m);
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= 11
    });
    assert_eq!(op(&r, op::LOCK), (11, 0, 0, 0));
}

/// Runs `steps` uncontended `lock`s from `start`, checking after each
/// that the counts so far plus what is left uncounted cover every
/// `lock` exactly once (from `start`'s own uncounted rest); returns the
/// `lock`s (1-based, from `start`) at which counts were due.
fn run_counts(start: LockCount, steps: u32) -> Vec<u32> {
    let mut count = start;
    let mut counted = 0u64;
    let mut due_at = Vec::new();
    for n in 1..=steps {
        if let Some(covers) = count.due() {
            // A count covers what was left uncounted, and this lock.
            assert_eq!(covers, count.uncounted() + 1, "at {count:?}");
            counted += u64::from(covers);
            due_at.push(n);
        }
        count = count.next();
        assert_eq!(
            counted + u64::from(count.uncounted()),
            u64::from(start.uncounted()) + u64::from(n),
            "after {n} from {start:?}"
        );
    }
    due_at
}

/// The counts of uncontended `lock`s: the 1st, 2nd, 4th … 64th of a
/// lock's life, then every 64th, and the early counts again after each
/// wrap of the lock word's 14-bit count; what they leave uncounted is
/// what a drop reports.
#[test]
fn counts_cover_every_uncontended_lock_exactly_once() {
    let fresh = LockCount(0);
    let due = run_counts(fresh, 100_000);
    assert_eq!(due[..10], [1, 2, 4, 8, 16, 32, 64, 128, 192, 256]);
    assert_eq!(fresh.due(), Some(1));
    // Across the word's wrap: a full batch ends at the wrap, then the
    // early counts start again (they add up to one batch).
    let near_wrap = LockCount(COUNT_MAX - 70);
    let due = run_counts(near_wrap, 200);
    assert_eq!(due[..4], [7, 71, 72, 73]);
    assert_eq!(LockCount(COUNT_MAX).next(), LockCount(0));
    assert_eq!(LockCount(COUNT_MAX).due(), Some(COUNT_BATCH));
    assert_eq!(near_wrap.uncounted(), (u32::from(COUNT_MAX) - 70) % COUNT_BATCH);
    assert_eq!(
        (fresh.next().uncounted(), fresh.next().next().next().uncounted()),
        (0, 1)
    );
    // The release's cheap test lets every due count through.
    for n in 0..=COUNT_MAX {
        let count = LockCount(n);
        if count.due().is_some() || count.refresh_due() {
            assert!(count.may_be_due(), "{count:?}");
        }
    }
}

/// Through the lock itself: `n` uncontended locks, then a drop, reach
/// the consumer as exactly `n`, whatever `n`'s place between counts.
#[test]
fn a_dropped_mutex_reports_every_uncontended_lock() {
    for n in [1u32, 3, 63, 64, 65, 200] {
        let name = unique("mutex-count");
        let m = Mutex::named(&name, ());
        for _ in 0..n {
            drop(m.lock());
        }
        assert_eq!(u32::from(m.raw().count().0), n);
        drop(m);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= u64::from(n)
        });
        assert_eq!(op(&r, op::LOCK), (u64::from(n), 0, 0, 0), "n = {n}");
    }
}

/// Four threads on one lock, with fair unlocks and bumps mixed in:
/// the data shows mutual exclusion, and after the drop the consumer's
/// `lock` total is exactly the `lock`s taken, contended (pushed one by
/// one) or not (counted in the lock word). Few enough per thread that
/// no ring can fill, so nothing may be missing.
#[test]
fn every_lock_is_reported_once_under_contention() {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 2000;
    let name = unique("mutex-stress");
    let m = Arc::new(Mutex::named(&name, 0u64));
    let start = Arc::new(StdBarrier::new(THREADS as usize));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (m, start) = (Arc::clone(&m), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for i in 0..PER_THREAD {
                    let mut g = m.lock();
                    let seen = *g;
                    std::hint::spin_loop();
                    *g = seen + 1;
                    match (i + t) % 97 {
                        0 => MutexGuard::unlock_fair(g),
                        1 => {
                            MutexGuard::bump(&mut g);
                            *g += 0;
                        }
                        _ => drop(g),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let m = Arc::into_inner(m).expect("workers are gone");
    assert_eq!(*m.lock(), THREADS * PER_THREAD, "a lost update");
    let total = THREADS * PER_THREAD + 1;
    assert_eq!(m.raw().state.load(Ordering::Relaxed) & !COUNT_BITS, 0);
    drop(m);
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= total
    });
    let (ops, contended, _, _) = op(&r, op::LOCK);
    assert_eq!(ops, total, "{contended} of them contended");
}

/// A bump in the middle of a plain hold that ends a count: a thread that
/// takes the lock plainly during the bump must not end the same count
/// again (the word's count did not yet include the bumped hold, so it
/// looked due a second time, and its `lock`s were reported twice). One
/// thread bumps every hold; the other only takes plain `lock`s, so they
/// meet in the gap often.
/// the other only takes plain `lock`s, so they meet in the gap often.
#[test]
fn a_bumped_hold_and_a_lock_taken_during_the_bump_end_no_count_twice() {
    const PER_THREAD: u64 = 800;
    for round in 0..10 {
        let name = unique("mutex-bump-count");
        let m = Arc::new(Mutex::named(&name, 0u64));
        let start = Arc::new(StdBarrier::new(4));
        let workers: Vec<_> = [true, false, true, false]
            .into_iter()
            .map(|bumps| {
                let (m, start) = (Arc::clone(&m), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..PER_THREAD {
                        let mut g = m.lock();
                        *g += 1;
                        // Long enough that waiters park, so bumps hand
                        // the lock over.
                        for _ in 0..200 {
                            std::hint::spin_loop();
                        }
                        if bumps {
                            MutexGuard::bump(&mut g);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let m = Arc::into_inner(m).expect("workers are gone");
        assert_eq!(*m.lock(), 4 * PER_THREAD);
        drop(m);
        let total = 4 * PER_THREAD + 1;
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= total
        });
        assert_eq!(op(&r, op::LOCK).0, total, "round {round}");
    }
}

/// Counting goes on across the wrap of the lock word's count, through
/// the lock itself: the batch that ends at the wrap, the early counts
/// after it, and the rest at the drop add up to every `lock`.
#[test]
fn counting_goes_on_across_the_wrap_of_the_lock_words_count() {
    let name = unique("mutex-wrap");
    let m = Mutex::named(&name, ());
    // As if 16,381 `lock`s had gone by: the last 61 of them were not
    // counted yet (the batch ends at 16,384).
    let near = LockCount(COUNT_MAX - 2);
    m.raw().state.store(near.0 << COUNT_SHIFT, Ordering::Relaxed);
    for _ in 0..200 {
        drop(m.lock());
    }
    assert_eq!(m.raw().count(), LockCount(197));
    assert!(!m.is_locked());
    drop(m);
    let expected = u64::from(near.uncounted()) + 200;
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= expected
    });
    assert_eq!(op(&r, op::LOCK), (expected, 0, 0, 0));
}

#[test]
fn bump_hands_over_without_recording_the_other_hold_twice() {
    let name = unique("mutex-bump");
    let m = Arc::new(Mutex::named(&name, 0u32));
    set_sampling(&m, PolicyWord::default().with_sample_every(0));
    let mut guard = m.lock();
    let waiter = spawn_parked(&m, |m| *m.lock() += 1);
    MutexGuard::bump(&mut guard);
    // The waiter had the lock in between.
    assert_eq!(*guard, 1);
    drop(guard);
    waiter.join().unwrap();
    let r = wait_for(&name, |r| r.stats.total_ops() >= 2);
    // This thread's plain lock and the waiter's contended one; the
    // waiter's is not recorded again at this thread's release.
    assert_eq!(op(&r, op::LOCK), (2, 1, 0, 1));
}

/// Runs `f` on a new thread that blocks on `m` (which the caller holds)
/// and returns once that thread sits in `parking_lot_core`'s queue for the
/// lock. PARKED_BIT alone is not enough (the thread sets it before it
/// queues itself, and a release in between wakes nobody), nor is the
/// thread's sleeping state: it can sleep on the queue's own lock, still
/// unqueued. Either can mislead a test on a loaded host.
fn spawn_parked<T: Send + 'static>(
    m: &Arc<Mutex<T>>,
    f: impl FnOnce(&Mutex<T>) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let before = queued_on(m.raw());
    let waiter = {
        let m = Arc::clone(m);
        std::thread::spawn(move || f(&m))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while queued_on(m.raw()) == before {
        assert!(Instant::now() < deadline, "the waiter never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_ne!(m.raw().state.load(Ordering::SeqCst) & PARKED_BIT, 0);
    waiter
}

/// `parkers` counts the threads parked on the lock, so a plain `lock`
/// taken while they sleep releases through `parking_lot`'s slow path,
/// and returns to 0 once they are gone: a count left behind would send
/// every later release that way.
#[test]
fn parked_threads_are_counted_beside_the_word_and_uncounted_when_they_leave() {
    let m = Arc::new(Mutex::named(&unique("mutex-parkers"), 0u32));
    let held = m.lock();
    let waiters: Vec<_> = (0..3).map(|_| spawn_parked(&m, |m| *m.lock() += 1)).collect();
    assert_eq!(m.raw().parkers.load(Ordering::SeqCst), 3);
    drop(held);
    for waiter in waiters {
        waiter.join().unwrap();
    }
    assert_eq!(*m.lock(), 3);
    assert_eq!(m.raw().parkers.load(Ordering::SeqCst), 0);
    // A timed-out park leaves no count either.
    let held = m.lock();
    let timed = {
        let m = Arc::clone(&m);
        std::thread::spawn(move || m.try_lock_for(Duration::from_millis(20)).is_none())
    };
    assert!(
        timed.join().unwrap(),
        "the timed lock gave up while the lock was held"
    );
    assert_eq!(m.raw().parkers.load(Ordering::SeqCst), 0);
    drop(held);
    // And nothing sends a plain `lock` the slow way now.
    let plain = m.lock();
    assert_eq!(m.raw().pending.get() & PENDING_PARKED, 0);
    drop(plain);
}

/// How many threads sleep in `parking_lot_core`'s queue for `raw`,
/// counted under the queue's lock without waking any.
fn queued_on(raw: &RawMutex) -> usize {
    let mut queued = 0;
    // SAFETY: the key is the address `raw` parks on; the filter only
    // counts and skips, and neither it nor the callback panics or calls
    // into `parking_lot_core`. With nobody unparked, the call changes
    // neither the queue nor the bucket's fairness timer.
    unsafe {
        parking_lot_core::unpark_filter(
            raw as *const RawMutex as usize,
            |_| {
                queued += 1;
                parking_lot_core::FilterOp::Skip
            },
            |_| parking_lot_core::DEFAULT_UNPARK_TOKEN,
        );
    }
    queued
}

fn set_sampling<T>(m: &Mutex<T>, word: PolicyWord) {
    assert!(super::super::set_policy_word(m.instance_id().unwrap(), word));
    m.refresh_policy();
}

#[test]
fn an_adaptive_lock_with_the_yield_bit_waits_like_a_plain_one() {
    let m = crate::AdaptiveMutex::named(&unique("adaptive-yield"), ());
    let budget = PolicyWord::default().with_spin_ns(4096);
    set_sampling(&m, budget);
    assert!(matches!(m.raw().spin_policy(clock::ticks()), Spin::Until(_)));
    set_sampling(&m, budget.with_spin_yields(true));
    assert!(matches!(m.raw().spin_policy(clock::ticks()), Spin::ParkingLot));
    let plain = Mutex::named(&unique("plain-yield"), ());
    set_sampling(&plain, budget);
    assert!(matches!(
        plain.raw().spin_policy(clock::ticks()),
        Spin::ParkingLot
    ));
}

/// A `lock` that waited is sampled at the lock's level too, by the
/// thread's operation number (it brings no draw). Every one of the
/// waiter's 128 `lock`s waits for the main thread's `try_lock` hold;
/// at 1 in 64 each thread's 64th and 128th operations are sampled:
/// two of the waiter's holds and two of the main thread's.
#[test]
fn contended_locks_are_sampled_at_the_level_too() {
    const ROUNDS: usize = 128;
    let name = unique("mutex-contended-sampling");
    let m = Arc::new(Mutex::named(&name, 0u32));
    set_sampling(&m, PolicyWord::default().with_sample_every(64));
    let (go, wants) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let waiter = {
        let m = Arc::clone(&m);
        std::thread::spawn(move || {
            while wants.recv().is_ok() {
                *m.lock() += 1;
                done.send(()).unwrap();
            }
        })
    };
    for _ in 0..ROUNDS {
        let held = m.try_lock().expect("free between rounds");
        let before = queued_on(m.raw());
        go.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while queued_on(m.raw()) == before {
            assert!(Instant::now() < deadline, "the waiter never parked");
            std::thread::sleep(Duration::from_micros(200));
        }
        drop(held);
        finished.recv().unwrap();
    }
    drop(go);
    waiter.join().unwrap();
    assert_eq!(*m.lock(), ROUNDS as u32);
    let r = wait_for(&name, |r| {
        op(r, op::LOCK).1 >= ROUNDS as u64 && held_samples(r) >= 4
    });
    // The waiter's, all waited for, and the check's own.
    let rounds = ROUNDS as u64;
    assert_eq!(op(&r, op::LOCK), (rounds + 1, rounds, 0, rounds));
    assert_eq!(op(&r, op::TRY_LOCK).0, rounds);
    assert_eq!(held_samples(&r), 4, "two holds of each thread");
}

/// An adaptive lock's `park` reports the waiter's wake-up, from the
/// releasing thread's call to wake it to it running: a fraction of a
/// wait that lasted as long as the 100 ms hold it queued behind.
#[test]
fn a_park_reports_its_wake_up_not_its_wait() {
    let name = unique("adaptive-wake");
    let raw = RawMutex::register(
        crate::primitives::adaptive::KIND,
        Some(&name),
        Location::caller(),
        true,
    );
    let m = Arc::new(Mutex::from_raw(raw, 0u32));
    // Park at once.
    set_sampling(&m, PolicyWord::default().with_spin_ns(0).with_spin_pinned(true));
    let held = m.lock();
    let waiter = spawn_parked(&m, |m| *m.lock() += 1);
    std::thread::sleep(Duration::from_millis(100));
    drop(held);
    waiter.join().unwrap();
    let r = wait_for(&name, |r| op(r, op::PARK).0 >= 1 && op(r, op::LOCK).1 >= 1);
    assert_eq!(op(&r, op::PARK), (1, 1, 0, 1));
    let max_ns = |kind| {
        let h = r.stats.op(kind).and_then(|o| o.latency()).expect("a latency");
        crate::clock::calibration().ticks_to_ns(h.max())
    };
    let (waited, woken) = (max_ns(op::LOCK), max_ns(op::PARK));
    assert!(waited >= 90_000_000, "waited only {waited} ns");
    assert!(woken < waited / 4, "wake-up {woken} ns of a {waited} ns wait");
}

#[test]
fn contended_lock_records_the_wait_of_a_blocked_thread() {
    let name = unique("mutex-contended");
    let m = Arc::new(Mutex::named(&name, 0u32));
    let start = Arc::new(StdBarrier::new(2));
    let guard = m.lock();
    let waiter = {
        let (m, start) = (Arc::clone(&m), Arc::clone(&start));
        std::thread::spawn(move || {
            start.wait();
            *m.lock() += 1; // blocks until the main thread lets go
        })
    };
    start.wait();
    // Let the waiter block (spin, then park) for a while.
    std::thread::sleep(Duration::from_millis(30));
    drop(guard);
    waiter.join().unwrap();
    let r = wait_for(&name, |r| {
        r.stats.op(op::LOCK).is_some_and(|o| o.contended() >= 1)
    });
    let (ops, contended, misses, latencies) = op(&r, op::LOCK);
    assert_eq!((ops, contended, misses, latencies), (2, 1, 0, 1));
    let lock = r.stats.op(op::LOCK).unwrap();
    let waited_ns = crate::clock::calibration().ticks_to_ns(lock.latency().unwrap().max());
    assert!(waited_ns >= 25_000_000, "waited only {waited_ns} ns");
    assert_eq!(lock.distinct_threads().count, 2);
}

/// `parking_lot`'s eventual fairness after the bare-add release: an
/// uncontended `lock` that finds threads parked is released by
/// `parking_lot`'s slow path, which hands the lock to a parked thread
/// when a fair turn is due. With the bare add the lock would be free
/// for a moment, and a thread spinning on `try_lock` would take it.
///
/// The state is built directly rather than raced for (a race that needs a
/// woken thread to be slower than its waker is unreliable on a loaded
/// host): a waiter parks behind the main thread's hold; the main thread
/// clears LOCKED_BIT alone, as if it had released just before the waiter's
/// park, so PARKED_BIT stays set with nobody woken, and takes the lock
/// again with a plain `lock`.
///
/// Three runs: the release without the hand-off loses to the thief only
/// some of the time (the woken waiter's own attempt to take the lock on a
/// fair turn sometimes wins anyway), so one run could miss it.
///
/// The runs happen in a child process of this test binary, alone: the
/// fair turn is due when a timer of `parking_lot_core`'s hash bucket
/// has run out, the bucket is shared with other locks, and another
/// test's wake-up there restarts the timer.
#[test]
fn a_plain_lock_taken_while_threads_park_hands_the_lock_over_when_fairness_is_due() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "primitives::mutex::tests::fair_turn_child_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FAIR_TURN_CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let winners = stdout
        .lines()
        .find_map(|line| line.split_once("fair-turn winners: ").map(|(_, w)| w))
        .unwrap_or_else(|| panic!("the child reported no winners:\n{stdout}"));
    assert_eq!(
        winners,
        format!("{:?}", [FAIR_TURN_WAITER; 3]),
        "the spinning thief (2) took the lock on a fair turn"
    );
}

const FAIR_TURN_CHILD_ENV: &str = "SUBETHA_FAIR_TURN_CHILD";

/// Runs in the child process started by the test above (and does
/// nothing otherwise).
#[test]
#[ignore = "helper process of a_plain_lock_taken_while_threads_park_hands_the_lock_over_when_fairness_is_due"]
fn fair_turn_child_process() {
    if std::env::var_os(FAIR_TURN_CHILD_ENV).is_none() {
        return;
    }
    let winners: Vec<u8> = (0..3).map(|_| fair_turn_winner()).collect();
    println!("fair-turn winners: {winners:?}");
}

const FAIR_TURN_WAITER: u8 = 1;

/// One run of the test above; who got the lock after the plain hold.
fn fair_turn_winner() -> u8 {
    use std::sync::atomic::AtomicU8;
    const WAITER: u8 = FAIR_TURN_WAITER;
    const THIEF: u8 = 2;
    let m = Arc::new(Mutex::named(&unique("mutex-fair-turn"), ()));
    // No sampled hold, and past the early counts (the 1st, 2nd, 4th …
    // `lock`), so nothing else sends the release the slow way.
    set_sampling(&m, PolicyWord::default().with_sample_every(0));
    for _ in 0..2 * COUNT_BATCH {
        drop(m.lock());
    }
    let first = m.lock();
    let winner = Arc::new(AtomicU8::new(0));
    let waiter = {
        let winner = Arc::clone(&winner);
        spawn_parked(&m, move |m| {
            let _hold = m.lock();
            let _ = winner.compare_exchange(0, WAITER, Ordering::SeqCst, Ordering::SeqCst);
        })
    };
    std::mem::forget(first);
    m.raw().state.fetch_and(!LOCKED_BIT, Ordering::Release);
    let plain = m.lock();
    assert_eq!(
        m.raw().pending.get(),
        PENDING_PARKED | PENDING_SITE,
        "a plain lock, threads parked (its site kept for the holder view)"
    );
    let thief = {
        let (m, winner) = (Arc::clone(&m), Arc::clone(&winner));
        std::thread::spawn(move || {
            // As tight a loop as a test build allows: the quiet
            // `try_lock` of `Debug` (no observation) on every turn.
            let raw = m.raw();
            let deadline = Instant::now() + Duration::from_secs(10);
            while winner.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
                for _ in 0..1024 {
                    if raw.try_lock_quiet() {
                        let _ = winner.compare_exchange(0, THIEF, Ordering::SeqCst, Ordering::SeqCst);
                        // SAFETY: this thread took the lock just above,
                        // and nothing borrows its data.
                        unsafe { m.force_unlock() };
                        break;
                    }
                }
            }
        })
    };
    // Past `parking_lot_core`'s fair interval (at most 1 ms), with the
    // thief spinning.
    std::thread::sleep(Duration::from_millis(5));
    drop(plain);
    waiter.join().unwrap();
    thief.join().unwrap();
    winner.load(Ordering::SeqCst)
}

/// Takes `m` `n` more times (`before` were taken so far, all on this
/// thread) in chunks small enough for the ring, waiting after each
/// chunk until the sidecar has every count that is due; returns the
/// record afterwards.
fn lock_n(m: &Mutex<()>, name: &str, before: u64, n: u64) -> crate::drain::InstanceRecord {
    let mut done = 0;
    let mut record = None;
    while done < n {
        let chunk = (n - done).min(1000);
        for _ in 0..chunk {
            drop(m.lock());
        }
        done += chunk;
        let total = before + done;
        let count = LockCount((total % (u64::from(COUNT_MAX) + 1)) as u16);
        let counted = total - u64::from(count.uncounted());
        record = Some(wait_for(name, |r| op(r, op::LOCK).0 >= counted));
    }
    record.expect("n > 0")
}

fn held_samples(r: &crate::drain::InstanceRecord) -> u64 {
    op(r, op::UNLOCK).0
}

/// Hold sampling follows the level a consumer writes into the policy
/// word: 1 in 256 by default, every hold, 1 in 512, off. The levels at
/// or above 1 in 64 are drawn at random per thread, so their counts
/// are checked against bounds (over four standard deviations wide;
/// the thread's draws are seeded by its id, so a run repeats); every
/// hold and off are exact.
#[test]
fn sampling_level_follows_the_policy_word_at_runtime() {
    let name = unique("mutex-sampling");
    let m = Mutex::named(&name, ());
    let id = m.instance_id().unwrap();
    // Default: 1 in 256, about 100 of 25,600 (standard deviation 10).
    let r = lock_n(&m, &name, 0, 25_600);
    let default = held_samples(&r);
    assert!((60..=140).contains(&default), "{default} of 25600 sampled");
    // A consumer raises the level to "every hold"; the mutex picks it
    // up at its next refresh (every 1,024 `lock`s), within this round.
    assert!(super::super::set_policy_word(
        id,
        PolicyWord::default().with_sample_every(1)
    ));
    let r = lock_n(&m, &name, 25_600, 1024);
    let raised = held_samples(&r);
    let r = lock_n(&m, &name, 26_624, 100);
    assert_eq!(held_samples(&r), raised + 100, "every hold sampled");
    // 1 in 512 (applied at once by an explicit refresh): about 64 of
    // 32,768 (standard deviation 8), across a wrap of the lock word's
    // count.
    assert!(super::super::set_policy_word(
        id,
        PolicyWord::default().with_sample_every(512)
    ));
    m.refresh_policy();
    let r = lock_n(&m, &name, 26_724, 32_768);
    let rare = held_samples(&r) - (raised + 100);
    assert!((30..=100).contains(&rare), "{rare} of 32768 sampled");
    // And off.
    assert!(super::super::set_policy_word(
        id,
        PolicyWord::default().with_sample_every(0)
    ));
    m.refresh_policy();
    let before_off = held_samples(&r);
    let r = lock_n(&m, &name, 59_492, 5000);
    assert_eq!(held_samples(&r), before_off);
    // Every `lock` counted but the 44 since the last count (64,448 is
    // a multiple of 64).
    assert_eq!(op(&r, op::LOCK).0, 64_492 - 44);
    let samples = r.stats.op(op::UNLOCK).unwrap().latency().unwrap();
    assert!(samples.min() >= 1, "a hold time is never 0");
}

/// A thread alternating between two mutexes samples each at its own
/// level: the draw does not favour one of them (a fixed interval of 64
/// would always land on the same one).
#[test]
fn interleaved_mutexes_are_each_sampled_at_their_level() {
    const ROUNDS: u64 = 64_000;
    let (name_a, name_b) = (unique("mutex-interleave-a"), unique("mutex-interleave-b"));
    let (a, b) = (Mutex::named(&name_a, ()), Mutex::named(&name_b, ()));
    set_sampling(&b, PolicyWord::default().with_sample_every(512));
    let mut done = 0;
    while done < ROUNDS {
        for _ in 0..500 {
            drop(a.lock());
            drop(b.lock());
        }
        done += 500;
        // Let the sidecar keep up, so no ring fills.
        let counted = done - u64::from(a.raw().count().uncounted());
        wait_for(&name_a, |r| op(r, op::LOCK).0 >= counted);
    }
    let counted = ROUNDS - u64::from(b.raw().count().uncounted());
    let rb = wait_for(&name_b, |r| op(r, op::LOCK).0 >= counted);
    let ra = wait_for(&name_a, |r| op(r, op::LOCK).0 >= counted);
    // 250 ± 16 (the default, 1 in 256) and 125 ± 11 expected: bounds
    // over four deviations.
    let (sa, sb) = (held_samples(&ra), held_samples(&rb));
    assert!((185..=315).contains(&sa), "a: {sa} of {ROUNDS}");
    assert!((80..=170).contains(&sb), "b: {sb} of {ROUNDS}");
}

/// A draw that a measured mutex's count leaves waits for the thread's
/// next `lock` of a measured mutex: `lock`s of an unobserved one in
/// between do not take it. At a level of 1 in 64 each such draw
/// (weight 64) samples the next hold for certain.
#[test]
fn unobserved_locks_leave_a_measured_mutexs_draws_alone() {
    const ROUNDS: u64 = 6400;
    let name = unique("mutex-draws-kept");
    let (observed, unobserved) = (Mutex::named(&name, ()), Mutex::unobserved(()));
    set_sampling(&observed, PolicyWord::default().with_sample_every(64));
    for _ in 0..ROUNDS {
        drop(observed.lock());
        drop(unobserved.lock());
    }
    let counted = ROUNDS - u64::from(observed.raw().count().uncounted());
    let r = wait_for(&name, |r| op(r, op::LOCK).0 >= counted);
    // The batches end at the 64th, 128th ... 6,336th `lock` with a
    // hold after them: 99 samples, and the first `lock` draws with
    // weight 1 (1 in 64). Taken by the unobserved mutex, the draws
    // would leave none.
    let samples = held_samples(&r);
    assert!(
        (99..=100).contains(&samples),
        "{samples} of {ROUNDS} holds sampled"
    );
}

/// A draw left pending survives 63 `lock`s of unobserved mutexes and
/// goes at the 64th, so a thread that now takes only those is back on
/// their fast path.
#[test]
fn a_pending_draw_outlives_64_unobserved_locks_at_most() {
    let observed = Mutex::named(&unique("mutex-draw-outlived"), ());
    let unobserved = Mutex::unobserved(());
    set_sampling(&observed, PolicyWord::default().with_sample_every(256));
    // The thread's first `lock` pays its first draw; a count that ends
    // a batch (within 64 uncontended `lock`s) leaves the next.
    drop(observed.lock());
    let mut locks = 1;
    while DRAWS.owed() == 0 && locks < 200 {
        drop(observed.lock());
        locks += 1;
    }
    let pending = DRAWS.owed();
    assert!(
        pending != 0 && pending != HoldDraw::FIRST,
        "a draw is pending: {pending}"
    );
    assert!(locks <= 65, "the draw came after {locks} locks");
    for _ in 0..63 {
        drop(unobserved.lock());
    }
    assert_eq!(DRAWS.owed(), pending, "kept for 63");
    drop(unobserved.lock());
    assert_eq!(DRAWS.owed(), 0, "dropped at the 64th");
}

#[test]
fn drop_unregisters_and_final_stats_stay_visible() {
    let name = unique("mutex-drop");
    let m = Mutex::named(&name, vec![1, 2]);
    drop(m.lock());
    let id = m.instance_id().unwrap();
    assert_eq!(m.into_inner(), vec![1, 2]);
    assert!(super::super::policy_word(id).is_none(), "entry no longer live");
    let r = wait_for(&name, |r| r.meta.retired_mono_ns.is_some() && is_retired(&name));
    assert_eq!(op(&r, op::LOCK).0, 1);
}

#[test]
fn guards_and_lock_api_features_work() {
    let m = Mutex::named(&unique("mutex-api"), (1u32, 2u32));
    {
        let g = m.lock();
        let mut second = MutexGuard::map(g, |pair| &mut pair.1);
        *second += 40;
    }
    let mut g = m.lock();
    MutexGuard::unlocked(&mut g, || assert!(!m.is_locked()));
    MutexGuard::bump(&mut g);
    MutexGuard::unlock_fair(g);
    assert_eq!(*m.lock(), (1, 42));
    let mut m = m;
    m.get_mut().0 = 7;
    let text = format!("{m:?}");
    assert!(text.contains("(7, 42)"), "{text}");
    let g = m.lock();
    assert!(format!("{m:?}").contains("<locked>"));
    std::mem::forget(g);
    // SAFETY: the forgotten guard's lock is held by this thread.
    unsafe { m.force_unlock() };
    assert!(!m.is_locked());
    static STATIC: Mutex<u32> = Mutex::unobserved(5);
    assert_eq!(*STATIC.lock(), 5);
    assert_eq!(STATIC.instance_id(), None);
}

#[test]
fn waits_of_any_length_reach_the_observation() {
    let name = unique("mutex-long-wait");
    let m = Mutex::named(&name, 0u32);
    set_sampling(&m, PolicyWord::default().with_sample_every(0));
    let raw = m.raw();
    for ticks in [1, u64::from(u32::MAX), u64::from(u32::MAX) + 1, u64::MAX] {
        assert!(raw.try_lock_raw());
        raw.acquired(
            Acquired::Waited {
                op: op::LOCK,
                ticks,
                sites: 0,
            },
            0,
        );
        // SAFETY: locked just above.
        unsafe { lock_api::RawMutex::unlock(raw) };
    }
    let r = wait_for(&name, |r| r.stats.total_ops() >= 4);
    assert_eq!(op(&r, op::LOCK), (4, 4, 0, 4));
    let latency = r.stats.op(op::LOCK).unwrap().latency().unwrap();
    assert!(
        latency.max() > u64::from(u32::MAX) * 1000,
        "max {}",
        latency.max()
    );
}

#[test]
fn hold_time_of_a_sampled_hold_is_measured() {
    let name = unique("mutex-hold");
    let m = Mutex::named(&name, ());
    set_sampling(&m, PolicyWord::default().with_sample_every(1));
    // Past a batch of 64: whatever draw this thread owed has been paid,
    // and under "every hold" each `lock` since has drawn.
    for _ in 0..100 {
        drop(m.lock());
    }
    {
        let _g = m.lock();
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = wait_for(&name, |r| op(r, op::UNLOCK).0 >= 1);
    let held = r.stats.op(op::UNLOCK).unwrap().latency().unwrap().max();
    let held_ns = crate::clock::calibration().ticks_to_ns(held);
    assert!(held_ns >= 4_500_000, "held {held_ns} ns");
    assert_eq!(r.stats.op(op::UNLOCK).unwrap().misses(), 0);
    let _ = Observation::FLAG_MISS;
}
