use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier as StdBarrier};

use super::super::set_policy_word;
use super::super::test_support::{op, unique, wait_for};
use super::hold::*;
use super::raw::*;
use super::*;

fn every_hold<T>(l: &RwLock<T>) {
    assert!(set_policy_word(
        l.instance_id().unwrap(),
        PolicyWord::default().with_sample_every(1)
    ));
    l.refresh_policy();
}

#[test]
fn lock_word_and_small_data_share_a_cache_line_wherever_the_allocator_puts_them() {
    // `lock_api::RwLock` puts the data right after the raw lock.
    let l = RwLock::unobserved(0u64);
    let word = std::mem::offset_of!(RawRwLock, inner);
    let data = l.data_ptr() as usize - &l as *const _ as usize;
    assert_eq!(
        data,
        std::mem::size_of::<RawRwLock>(),
        "data follows the raw lock"
    );
    // Allocations are at least 16-byte aligned; try every such placement
    // within a line, also behind an `Arc`'s two counters.
    for base in (0..64).step_by(16) {
        let line = |offset: usize| (base + offset) / 64;
        assert_eq!(line(word), line(word + 7), "placement {base}: the word splits");
        assert_eq!(line(word), line(data), "placement {base}: word and data split");
        assert_eq!(
            line(data),
            line(data + 7),
            "placement {base}: a u64 of data splits"
        );
    }
}

/// Whether `l` is biased, after a first read (whose draw biases a
/// fresh observed lock).
fn biased_after_a_read<T>(l: &RwLock<T>) -> bool {
    drop(l.read());
    l.raw().bias.load(Ordering::Relaxed)
}

/// Whether some thread holds `l` shared through its reader slot.
fn read_through_a_slot<T>(l: &RwLock<T>) -> bool {
    reader_bias::any_reader_of(l.raw().counts_ptr().addr())
}

/// Runs `write` on another thread, which must block while this thread
/// holds its read guard, and finishes once the guard is dropped.
fn blocked_until_dropped<T: Send + Sync + 'static, G>(
    l: &Arc<RwLock<T>>,
    guard: G,
    write: impl FnOnce(&RwLock<T>) + Send + 'static,
) {
    let done = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (l, done) = (Arc::clone(l), Arc::clone(&done));
        move || {
            write(&l);
            done.store(true, Ordering::SeqCst);
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(!done.load(Ordering::SeqCst), "the writer got in past a reader");
    drop(guard);
    writer.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
}

#[test]
fn a_biased_read_leaves_the_word_alone_and_writers_wait_for_it() {
    let name = unique("rwlock-bias");
    let l = Arc::new(RwLock::named(&name, 0u64));
    assert!(
        biased_after_a_read(&l),
        "a fresh lock is biased by its first read"
    );
    let guard = l.read();
    assert!(read_through_a_slot(&l));
    assert!(!l.raw().inner.is_locked(), "the biased read took the word");
    assert!(l.is_locked(), "a biased reader is a reader");
    assert!(l.try_write().is_none());
    assert!(
        l.raw().bias.load(Ordering::Relaxed),
        "a failed try leaves the bias set"
    );
    assert!(l.try_write_for(Duration::from_millis(5)).is_none());
    assert!(l.try_write().is_none(), "a timed-out write forgot the reader");
    blocked_until_dropped(&l, guard, |l| *l.write() += 1);
    assert_eq!(*l.read(), 1);
    assert!(!read_through_a_slot(&l));
    // The waited write was reported as contended.
    let r = wait_for(&name, |r| op(r, op::WRITE).0 >= 1);
    assert_eq!(op(&r, op::WRITE).1, 1, "the write that waited is contended");
    assert_eq!(op(&r, op::TRY_WRITE).2, 3, "every try missed");
}

#[test]
fn upgrades_and_bumps_wait_for_biased_readers() {
    let l = Arc::new(RwLock::named(&unique("rwlock-bias-upgrade"), 0u64));
    assert!(biased_after_a_read(&l));
    let guard = l.read();
    assert!(read_through_a_slot(&l));
    blocked_until_dropped(&l, guard, |l| {
        let up = l.upgradable_read();
        *RwLockUpgradableReadGuard::upgrade(up) += 1;
    });
    // Bias again (the revocation inhibits it for a while), then a
    // reader in; a timed upgrade gives up and keeps its upgradable hold.
    while !biased_after_a_read(&l) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let guard = l.read();
    assert!(read_through_a_slot(&l));
    let up = l.upgradable_read();
    let up = RwLockUpgradableReadGuard::try_upgrade_for(up, Duration::from_millis(5))
        .expect_err("a biased reader is inside");
    drop(up);
    // A biased reader bumped while a writer waits lets it in.
    let writer = std::thread::spawn({
        let l = Arc::clone(&l);
        move || *l.write() += 1
    });
    let mut guard = guard;
    // The writer holds the word, then clears the bias: only then does
    // it wait for this reader.
    while !l.raw().inner.is_locked_exclusive() || l.raw().bias.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    RwLockReadGuard::bump(&mut guard);
    assert_eq!(*guard, 2, "the bump let the waiting writer in");
    drop(guard);
    writer.join().unwrap();
}

#[test]
fn a_thread_reads_one_lock_through_its_slot_and_the_rest_through_words() {
    let a = Arc::new(RwLock::named(&unique("rwlock-bias-a"), 0u64));
    let b = RwLock::named(&unique("rwlock-bias-b"), 0u64);
    assert!(biased_after_a_read(&a) && biased_after_a_read(&b));
    let first = a.read();
    let again = a.read_recursive();
    let other = b.read();
    assert!(read_through_a_slot(&a));
    assert!(!a.raw().inner.is_locked(), "the second hold counts in the slot");
    assert!(b.raw().inner.is_locked(), "another lock went through its word");
    // Either release may come first; the slot is free after both.
    drop(first);
    assert!(read_through_a_slot(&a), "one hold is still out");
    blocked_until_dropped(&a, again, |l| *l.write() += 1);
    assert!(!read_through_a_slot(&a));
    drop(other);
    assert!(!b.is_locked());
}

/// Readers and writers on four threads: a writer changes two halves
/// together, and no reader ever sees them differ.
#[test]
fn readers_never_see_a_write_half_done() {
    let l = Arc::new(RwLock::named(&unique("rwlock-bias-stress"), (0u64, 0u64)));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    if (i + t) % 16 == 0 {
                        let mut w = l.write();
                        w.0 += 1;
                        std::hint::black_box(&mut *w);
                        w.1 += 1;
                    } else {
                        let r = l.read();
                        assert_eq!(r.0, r.1, "a reader saw half a write");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (a, b) = *l.read();
    assert_eq!((a, b), (5_000, 5_000));
}

/// A thread that holds a biased read takes it again recursively while
/// a writer is revoking the bias and waiting for that thread's slot:
/// through the word it would wait for the writer, which waits for it.
#[test]
fn a_recursive_read_does_not_wait_for_a_writer_that_waits_for_it() {
    let l = Arc::new(RwLock::named(&unique("rwlock-bias-recursive"), 0u64));
    assert!(biased_after_a_read(&l));
    let outer = l.read();
    assert!(read_through_a_slot(&l));
    let writer = std::thread::spawn({
        let l = Arc::clone(&l);
        move || *l.write() += 1
    });
    // The writer holds the word and has revoked the bias.
    while l.raw().bias.load(Ordering::Relaxed) || !l.raw().inner.is_locked_exclusive() {
        std::thread::yield_now();
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let reader = std::thread::scope(|_| {
        let inner = l.read_recursive();
        let again = l.try_read_recursive().expect("a further hold of the slot's lock");
        done_tx.send(()).unwrap();
        (*inner, *again)
    });
    done_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the recursive read waited for the writer");
    assert_eq!(reader, (0, 0));
    assert!(read_through_a_slot(&l), "the first hold still holds the slot");
    drop(outer);
    writer.join().unwrap();
    assert_eq!(*l.read(), 1);
}

/// Every way in, on four threads at once, while the bias comes and
/// goes: a writer (however it got the lock) changes two halves
/// together, and no reader (however it got in) sees them differ.
#[test]
fn every_acquisition_excludes_writers_while_the_bias_comes_and_goes() {
    let l = Arc::new(RwLock::named(&unique("rwlock-bias-every"), (0u64, 0u64)));
    let write = |w: &mut (u64, u64)| {
        w.0 += 1;
        std::hint::black_box(&mut *w);
        w.1 += 1;
    };
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let mut writes = 0u64;
                for i in 0..10_000u64 {
                    let check = |r: &(u64, u64)| assert_eq!(r.0, r.1, "a reader saw half a write");
                    match (i * 7 + t) % 23 {
                        0 => {
                            write(&mut l.write());
                            writes += 1;
                        }
                        1 => {
                            if let Some(mut w) = l.try_write() {
                                write(&mut w);
                                writes += 1;
                            }
                        }
                        2 => {
                            if let Some(mut w) = l.try_write_for(Duration::from_micros(50)) {
                                write(&mut w);
                                writes += 1;
                            }
                        }
                        3 => {
                            let up = l.upgradable_read();
                            check(&up);
                            write(&mut RwLockUpgradableReadGuard::upgrade(up));
                            writes += 1;
                        }
                        4 => {
                            let up = l.upgradable_read();
                            if let Ok(mut w) = RwLockUpgradableReadGuard::try_upgrade(up) {
                                write(&mut w);
                                writes += 1;
                            }
                        }
                        5 => check(&l.read_recursive()),
                        6 => {
                            if let Some(r) = l.try_read() {
                                check(&r);
                            }
                        }
                        7 => {
                            let outer = l.read();
                            let inner = l.read_recursive();
                            check(&outer);
                            drop(outer);
                            check(&inner);
                        }
                        _ => check(&l.read()),
                    }
                }
                writes
            })
        })
        .collect();
    let writes: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(*l.read(), (writes, writes));
}

/// A writer never overlaps a reader that holds the lock through its reader
/// slot, without the lock word: there exclusion is the bias revocation's
/// (see the SAFETY comment on the `lock_api::RawRwLock` impl), not
/// `parking_lot`'s. Readers mark their holds, and writers theirs, in
/// SeqCst flags each side checks at both ends of its hold; many writes must
/// have found a reader inside through its slot, or this would test the
/// word instead.
#[test]
fn a_writer_never_overlaps_a_biased_reader() {
    use std::sync::atomic::AtomicU32;
    let l = Arc::new(RwLock::named(&unique("rwlock-bias-overlap"), ()));
    let readers_inside = Arc::new(AtomicU32::new(0));
    let writer_inside = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (l, readers_inside, writer_inside, stop) = (
                Arc::clone(&l),
                Arc::clone(&readers_inside),
                Arc::clone(&writer_inside),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || {
                let (mut reads, mut biased) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let guard = l.read();
                    biased += u64::from(reader_bias::holds(l.raw().counts_ptr().addr()));
                    readers_inside.fetch_add(1, Ordering::SeqCst);
                    assert!(
                        !writer_inside.load(Ordering::SeqCst),
                        "a writer is inside a read hold"
                    );
                    for _ in 0..20 {
                        std::hint::spin_loop();
                    }
                    assert!(
                        !writer_inside.load(Ordering::SeqCst),
                        "a writer came into a read hold"
                    );
                    readers_inside.fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                    reads += 1;
                }
                (reads, biased)
            })
        })
        .collect();
    let (mut writes, mut biased_before_write) = (0u32, 0u32);
    // Until 100 writes came while a reader was inside through its slot (or
    // 15 s). A writer waits for the readers to have biased the lock again,
    // and for the bias to have lasted a while (a bias revoked soon after it
    // is set keeps the lock unbiased longer and longer: `BiasPolicy`).
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut attempt = 0u32;
    while biased_before_write < 100 && Instant::now() < deadline {
        attempt += 1;
        while !read_through_a_slot(&l) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
        std::thread::sleep(Duration::from_millis(1));
        biased_before_write += u32::from(read_through_a_slot(&l));
        let guard = match attempt % 4 {
            0 => l.write(),
            1 => match l.try_write_for(Duration::from_millis(5)) {
                Some(guard) => guard,
                None => continue,
            },
            2 => RwLockUpgradableReadGuard::upgrade(l.upgradable_read()),
            _ => match l.try_write() {
                Some(guard) => guard,
                None => continue,
            },
        };
        writer_inside.store(true, Ordering::SeqCst);
        assert_eq!(
            readers_inside.load(Ordering::SeqCst),
            0,
            "a reader is inside the write hold"
        );
        for _ in 0..200 {
            std::hint::spin_loop();
        }
        assert_eq!(
            readers_inside.load(Ordering::SeqCst),
            0,
            "a reader came into the write hold"
        );
        writer_inside.store(false, Ordering::SeqCst);
        drop(guard);
        writes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (reads, biased) = readers
        .into_iter()
        .map(|r| r.join().unwrap())
        .fold((0, 0), |(a, b), (r, s)| (a + r, b + s));
    // The overlap this checks for needs readers inside through their slots
    // when writers come.
    assert!(
        biased_before_write >= 100,
        "only {biased_before_write} of {attempt} writes found a reader inside through its slot \
         ({biased} of {reads} reads went through one)"
    );
    assert!(writes >= attempt / 2, "only {writes} of {attempt} writes");
}

#[test]
fn reads_writes_and_misses() {
    let name = unique("rwlock-basic");
    let l = RwLock::named(&name, 0u32);
    every_hold(&l);
    {
        let a = l.read();
        let b = l.read();
        assert_eq!(*a + *b, 0);
        assert!(l.try_write().is_none());
        assert!(l.try_write_for(Duration::from_millis(1)).is_none());
        assert!(l.try_read().is_some());
    }
    *l.write() += 1;
    {
        let _w = l.write();
        assert!(l.try_read().is_none());
    }
    let r = wait_for(&name, |r| r.stats.total_ops() >= 11);
    assert_eq!(op(&r, op::READ), (2, 0, 0, 0));
    assert_eq!(op(&r, op::TRY_READ), (2, 0, 1, 0));
    assert_eq!(op(&r, op::WRITE), (2, 0, 0, 0));
    assert_eq!(op(&r, op::TRY_WRITE), (2, 1, 2, 1));
    // Every hold sampled: 3 successful read holds, 2 write holds.
    assert_eq!(op(&r, op::READ_UNLOCK), (3, 0, 0, 3));
    assert_eq!(op(&r, op::WRITE_UNLOCK), (2, 0, 0, 2));
}

/// Uncontended reads and writes are counted: while the lock lives the
/// consumer sees the counts that have ended (1, 2, 4 … 64, then every
/// 64), and once it is dropped, every operation.
#[test]
fn uncontended_reads_and_writes_are_counted_and_a_dropped_lock_reports_the_rest() {
    for n in [1u64, 3, 63, 64, 65, 200] {
        let name = unique("rwlock-count");
        let l = RwLock::named(&name, ());
        for _ in 0..n {
            drop(l.read());
        }
        for _ in 0..n {
            drop(l.write());
        }
        // What the counts that ended cover: the highest power of two
        // up to 64, then whole batches of 64.
        let counted = if n < 64 { 1 << n.ilog2() } else { n - n % 64 };
        let live = wait_for(&name, |r| op(r, op::WRITE).0 >= counted);
        assert_eq!(op(&live, op::READ), (counted, 0, 0, 0), "n = {n}");
        assert_eq!(op(&live, op::WRITE), (counted, 0, 0, 0), "n = {n}");
        drop(l);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::WRITE).0 >= n
        });
        assert_eq!(op(&r, op::READ), (n, 0, 0, 0), "n = {n}");
        assert_eq!(op(&r, op::WRITE), (n, 0, 0, 0), "n = {n}");
    }
}

/// Four threads reading and writing one lock: the data shows the
/// writes were exclusive, and after the drop the consumer's totals are
/// exactly the operations done, contended (pushed one by one) or not
/// (counted per thread stripe). Few enough that no ring can fill.
#[test]
fn every_read_and_write_is_reported_once_under_contention() {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 3000;
    let name = unique("rwlock-stress");
    let l = Arc::new(RwLock::named(&name, 0u64));
    let start = Arc::new(StdBarrier::new(THREADS as usize));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (l, start) = (Arc::clone(&l), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for i in 0..PER_THREAD {
                    if i % 4 == 0 {
                        let mut w = l.write();
                        let seen = *w;
                        std::hint::spin_loop();
                        *w = seen + 1;
                    } else {
                        let r = l.read();
                        std::hint::black_box(*r);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let l = Arc::into_inner(l).unwrap();
    let writes = THREADS * PER_THREAD / 4;
    assert_eq!(*l.read(), writes);
    drop(l);
    // The final read above is one more.
    let reads = THREADS * PER_THREAD - writes + 1;
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 >= reads && op(r, op::WRITE).0 >= writes
    });
    assert_eq!(op(&r, op::READ).0, reads);
    assert_eq!(op(&r, op::WRITE).0, writes);
}

#[test]
fn blocked_writer_and_blocked_reader_record_their_waits() {
    let name = unique("rwlock-contended");
    let l = Arc::new(RwLock::named(&name, 0u32));
    let ready = Arc::new(StdBarrier::new(2));
    // A writer blocks behind a reader …
    let read = l.read();
    let writer = {
        let (l, ready) = (Arc::clone(&l), Arc::clone(&ready));
        std::thread::spawn(move || {
            ready.wait();
            *l.write() += 1;
        })
    };
    ready.wait();
    std::thread::sleep(Duration::from_millis(20));
    drop(read);
    writer.join().unwrap();
    // … and a reader behind a writer.
    let write = l.write();
    let reader = {
        let (l, ready) = (Arc::clone(&l), Arc::clone(&ready));
        std::thread::spawn(move || {
            ready.wait();
            assert_eq!(*l.read(), 1);
        })
    };
    ready.wait();
    std::thread::sleep(Duration::from_millis(20));
    drop(write);
    reader.join().unwrap();
    let r = wait_for(&name, |r| op(r, op::WRITE).1 >= 1 && op(r, op::READ).1 >= 1);
    assert_eq!(op(&r, op::WRITE), (2, 1, 0, 1));
    assert_eq!(op(&r, op::READ), (2, 1, 0, 1));
    let ms15 = crate::clock::calibration().ns_to_ticks(15_000_000);
    for k in [op::WRITE, op::READ] {
        let waited = r.stats.op(k).unwrap().latency().unwrap().max();
        assert!(waited >= ms15, "op {k} waited {waited} ticks");
    }
}

/// A thread's records of write holds are kept per lock: holding a
/// waited-for lock and a plain one, and releasing them in either
/// order, each release reports its own hold.
#[test]
fn write_holds_of_two_locks_report_their_own_records() {
    for release_waited_first in [false, true] {
        let (waited_name, plain_name) = (unique("rwlock-two-waited"), unique("rwlock-two-plain"));
        let waited = Arc::new(RwLock::named(&waited_name, 0u32));
        let plain = RwLock::named(&plain_name, 0u32);
        // Its hold never sampled, so its release needs no record.
        assert!(set_policy_word(
            plain.instance_id().unwrap(),
            PolicyWord::default().with_sample_every(0)
        ));
        plain.refresh_policy();
        let ready = Arc::new(StdBarrier::new(2));
        let reader = {
            let (waited, ready) = (Arc::clone(&waited), Arc::clone(&ready));
            std::thread::spawn(move || {
                let read = waited.read();
                ready.wait();
                std::thread::sleep(Duration::from_millis(20));
                drop(read);
            })
        };
        ready.wait();
        let first = waited.write();
        let second = plain.write();
        assert_eq!(Writes.held(), 1, "only the waited hold leaves a record");
        if release_waited_first {
            drop(first);
            drop(second);
        } else {
            drop(second);
            drop(first);
        }
        assert_eq!(Writes.held(), 0);
        reader.join().unwrap();
        let r = wait_for(&waited_name, |r| op(r, op::WRITE).1 == 1);
        assert_eq!(op(&r, op::WRITE), (1, 1, 0, 1), "the waited lock's write");
        drop(plain);
        let r = wait_for(&plain_name, |r| op(r, op::WRITE).0 == 1);
        assert_eq!(op(&r, op::WRITE).1, 0, "the plain lock's write did not wait");
    }
}

/// Write holds ended by a downgrade or a fair unlock are counted once,
/// and a bump that hands the lock to a waiting writer keeps each hold's
/// record apart: the holder's sample and count survive the other
/// writer's waited, sampled hold.
#[test]
fn downgraded_fair_and_bumped_write_holds_are_reported_once() {
    let name = unique("rwlock-bump");
    let l = Arc::new(RwLock::named(&name, 0u32));
    every_hold(&l);
    drop(RwLockWriteGuard::downgrade(l.write()));
    RwLockWriteGuard::unlock_fair(l.write());
    let mut held = l.write();
    let ready = Arc::new(StdBarrier::new(2));
    let waiter = {
        let (l, ready) = (Arc::clone(&l), Arc::clone(&ready));
        std::thread::spawn(move || {
            ready.wait();
            *l.write() += 1;
        })
    };
    ready.wait();
    // Let the waiter park, then hand it the lock and take it back.
    std::thread::sleep(Duration::from_millis(20));
    RwLockWriteGuard::bump(&mut held);
    assert_eq!(*held, 1, "the waiter wrote during the bump");
    drop(held);
    waiter.join().unwrap();
    // The third uncontended write is counted when the lock goes.
    drop(Arc::into_inner(l).unwrap());
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::WRITE).0 >= 4 && op(r, op::WRITE_UNLOCK).0 >= 4
    });
    // Three uncontended writes (counted), one that waited (pushed).
    assert_eq!(op(&r, op::WRITE), (4, 1, 0, 1));
    assert_eq!(op(&r, op::WRITE_UNLOCK), (4, 0, 0, 4));
    // The downgrade's shared hold is not a `read`.
    assert_eq!(op(&r, op::READ).0, 0);
}

#[test]
fn upgrade_downgrade_and_recursive_reads() {
    let name = unique("rwlock-upgrade");
    let l = RwLock::named(&name, vec![1]);
    every_hold(&l);
    let up = l.upgradable_read();
    let r1 = l.read_recursive();
    drop(r1);
    let mut w = RwLockUpgradableReadGuard::upgrade(up);
    w.push(2);
    let rd = RwLockWriteGuard::downgrade(w);
    assert_eq!(*rd, vec![1, 2]);
    drop(rd);
    let up = l.upgradable_read();
    let other = l.read();
    let up = RwLockUpgradableReadGuard::try_upgrade(up).expect_err("a reader is in");
    drop(other);
    let w = RwLockUpgradableReadGuard::try_upgrade(up).expect("alone now");
    drop(w);
    let r = wait_for(&name, |r| op(r, op::UPGRADE).0 >= 3);
    // 2 upgradable + 1 recursive + 1 plain read.
    assert_eq!(op(&r, op::READ).0, 4);
    assert_eq!(op(&r, op::UPGRADE), (3, 0, 1, 0));
    // Write holds reached by upgrade are sampled (downgrade ends one).
    assert_eq!(op(&r, op::WRITE_UNLOCK).0, 2);
    // The recursive read and the plain read were sampled.
    assert_eq!(op(&r, op::READ_UNLOCK).0, 2);
}

/// Every shared hold that needs a record gets one, however many a
/// thread has outstanding, and each release reports its own: ten
/// `try_read`s held at once, sampled, and two locks read in turn and
/// released out of order, each counted on its own lock.
#[test]
fn outstanding_read_holds_are_each_reported_at_their_release() {
    let name = unique("rwlock-records");
    let other_name = unique("rwlock-records-other");
    let l = RwLock::named(&name, 0u32);
    let other = RwLock::named(&other_name, 0u32);
    // Both sampled at every hold: a thread that takes a lock sampled
    // more coarsely in between samples the next one less often.
    every_hold(&l);
    every_hold(&other);
    let held: Vec<_> = (0..10).map(|_| l.try_read().expect("only readers")).collect();
    assert_eq!(Reads.held(), 10);
    drop(held);
    assert_eq!(Reads.held(), 0);
    for _ in 0..5 {
        let a = l.read();
        let b = other.read();
        drop(a);
        drop(b);
    }
    // An upgradable hold downgraded to a shared one is one `read`.
    drop(RwLockUpgradableReadGuard::downgrade(l.upgradable_read()));
    assert_eq!(Reads.held(), 0);
    drop(l);
    drop(other);
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 >= 6
    });
    assert_eq!(op(&r, op::TRY_READ), (10, 0, 0, 0));
    assert_eq!(op(&r, op::READ), (6, 0, 0, 0));
    // Ten `try_read` holds and five `read` holds, all sampled; the
    // downgraded hold is not a read hold of its own.
    assert_eq!(op(&r, op::READ_UNLOCK), (15, 0, 0, 15));
    let o = wait_for(&other_name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 >= 5
    });
    assert_eq!(op(&o, op::READ), (5, 0, 0, 0));
    assert_eq!(op(&o, op::READ_UNLOCK), (5, 0, 0, 5));
}

/// An unobserved lock waits like `parking_lot`'s, and leaves no
/// record behind.
#[test]
fn an_unobserved_lock_records_nothing_even_when_it_waits() {
    let l = Arc::new(RwLock::unobserved(0u32));
    let ready = Arc::new(StdBarrier::new(2));
    let write = l.write();
    let reader = {
        let (l, ready) = (Arc::clone(&l), Arc::clone(&ready));
        std::thread::spawn(move || {
            ready.wait();
            let guard = l.read();
            // Its release counts on nothing: the waited read left this
            // lock, uncounted, where the release looks first.
            let remembered = LAST_READ.with(Cell::get) == (l.raw().addr(), std::ptr::null());
            (*guard, Reads.held(), remembered)
        })
    };
    ready.wait();
    std::thread::sleep(Duration::from_millis(10));
    drop(write);
    assert_eq!(reader.join().unwrap(), (0, 0, true));
    let _read = l.try_read().unwrap();
    assert_eq!(Reads.held(), 0);
}

/// At the default level (1 in 256) holds are sampled at random, at
/// that rate in expectation, and a thread alternating between two
/// locks samples each at its own level (a fixed interval would land
/// on one of them). Bounds are over four standard deviations; the
/// thread's draws are seeded by its id, so a run repeats.
#[test]
fn read_holds_are_sampled_at_each_locks_level_in_expectation() {
    const ROUNDS: u64 = 64_000;
    let (name_a, name_b) = (unique("rwlock-level-a"), unique("rwlock-level-b"));
    let (a, b) = (RwLock::named(&name_a, ()), RwLock::named(&name_b, ()));
    assert!(set_policy_word(
        b.instance_id().unwrap(),
        PolicyWord::default().with_sample_every(512)
    ));
    b.refresh_policy();
    let mut done = 0;
    while done < ROUNDS {
        for _ in 0..1000 {
            drop(a.read());
            drop(b.read());
        }
        done += 1000;
        // Let the sidecar keep up, so no ring fills (counts come every
        // 64th read, and 1000 is 40 past a multiple of 64).
        wait_for(&name_a, |r| op(r, op::READ).0 >= done - done % 64);
    }
    drop((a, b));
    let ra = wait_for(&name_a, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 == ROUNDS
    });
    let rb = wait_for(&name_b, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 == ROUNDS
    });
    // 250 ± 16 and 125 ± 11 expected.
    let (sa, sb) = (op(&ra, op::READ_UNLOCK).0, op(&rb, op::READ_UNLOCK).0);
    assert!((185..=315).contains(&sa), "a: {sa} of {ROUNDS} sampled");
    assert!((80..=170).contains(&sb), "b: {sb} of {ROUNDS} sampled");
}

/// Plain `read`s and `write`s pick up a level a consumer sets when
/// their counts are pushed, without an explicit refresh: sampling
/// turned off, then every hold, then off again.
#[test]
fn counted_reads_and_writes_follow_a_level_set_by_the_consumer() {
    let name = unique("rwlock-count-refresh");
    let l = RwLock::named(&name, ());
    let id = l.instance_id().unwrap();
    for every in [0, 1, 0] {
        assert!(set_policy_word(
            id,
            PolicyWord::default().with_sample_every(every)
        ));
        for _ in 0..640 {
            drop(l.read());
            drop(l.write());
        }
    }
    drop(l);
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 == 1920 && op(r, op::WRITE).0 == 1920
    });
    let (reads, writes) = (op(&r, op::READ_UNLOCK).0, op(&r, op::WRITE_UNLOCK).0);
    // The first 128 rounds after a change may still run at the old
    // level (the new one comes with a count): at least the last 512
    // of the 640 sampled holds, at most all 640 and 128 after.
    assert!((512..=768).contains(&reads), "{reads} read holds sampled");
    assert!((512..=768).contains(&writes), "{writes} write holds sampled");
}

/// A draw that an observed lock's count leaves waits for that thread's
/// next acquisition of an observed lock: writes to an unobserved lock
/// in between do not take it. At a level of 1 in 64 each count's draw
/// (weight 64) samples the next observed hold for certain.
#[test]
fn unobserved_writes_leave_an_observed_locks_draws_alone() {
    const ROUNDS: u64 = 6400;
    let name = unique("rwlock-draws-kept");
    let observed = RwLock::named(&name, ());
    let unobserved = RwLock::unobserved(());
    assert!(set_policy_word(
        observed.instance_id().unwrap(),
        PolicyWord::default().with_sample_every(64)
    ));
    observed.refresh_policy();
    for _ in 0..ROUNDS {
        drop(observed.read());
        drop(unobserved.write());
    }
    drop(observed);
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 == ROUNDS
    });
    // The counts at the 128th, 192nd ... 6,336th read cover 64 each:
    // 98 certain samples. The counts at the 1st, 2nd, 4th ... 64th
    // cover 64 between them, and the first read draws with weight 1:
    // one more in expectation, eight at most. (Taken by the writes,
    // the draws would leave none.)
    let samples = op(&r, op::READ_UNLOCK).0;
    assert!(
        (98..=106).contains(&samples),
        "{samples} of {ROUNDS} read holds sampled"
    );
}

/// A lock only ever taken by `try_read` and `try_write` has no counts,
/// so no draws: its holds are sampled by the thread's operation
/// number, and it re-reads its policy word on its own (every 1,024
/// operations of the thread), without an explicit refresh.
#[test]
fn a_lock_taken_only_by_try_is_sampled_and_follows_its_policy() {
    let name = unique("rwlock-try-only");
    let l = RwLock::named(&name, ());
    assert!(set_policy_word(
        l.instance_id().unwrap(),
        PolicyWord::default().with_sample_every(1)
    ));
    for _ in 0..1100 {
        drop(l.try_read().expect("free"));
    }
    for _ in 0..100 {
        drop(l.try_read().expect("free"));
        drop(l.try_write().expect("free"));
    }
    drop(l);
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::TRY_WRITE).0 == 100
    });
    assert_eq!(op(&r, op::TRY_READ).0, 1200);
    // Every hold once the new level was read (by the 1,024th operation
    // at the latest), a few at the default level before.
    let read_samples = op(&r, op::READ_UNLOCK).0;
    assert!(
        (176..=200).contains(&read_samples),
        "{read_samples} of 1200 read holds sampled"
    );
    assert_eq!(op(&r, op::WRITE_UNLOCK), (100, 0, 0, 100));
}

#[test]
fn read_hold_samples_follow_the_policy_and_drop_unregisters() {
    let name = unique("rwlock-sampling");
    let l = RwLock::named(&name, ());
    let id = l.instance_id().unwrap();
    assert!(set_policy_word(id, PolicyWord::default().with_sample_every(0)));
    l.refresh_policy();
    // A multiple of 64: the last read's count leaves this thread a
    // draw, so the next read draws at the level set below.
    for _ in 0..3008 {
        drop(l.read());
    }
    assert!(set_policy_word(id, PolicyWord::default().with_sample_every(1)));
    l.refresh_policy();
    for _ in 0..10 {
        let _a = l.read();
        let _b = l.read();
    }
    drop(l);
    let r = wait_for(&name, |r| {
        r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 >= 3028
    });
    // None of the 3,008 while sampling was off, every one since.
    assert_eq!(op(&r, op::READ_UNLOCK), (20, 0, 0, 20));
    assert_eq!(super::super::policy_word(id), None);
}
