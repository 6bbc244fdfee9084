//! The [`Mutex`](super::Mutex)'s lock protocol: the lock word, the parkers
//! byte beside it, parking and hand-off.
//!
//! The word holds `parking_lot`'s lock and parked bits and, above them, a
//! count of uncontended `lock`s that a release adds in the same atomic
//! operation that clears the lock bit. The algorithm is `parking_lot`'s: a
//! `lock` takes a free word even when threads are parked, a waiter sets the
//! parked bit before it parks (re-checked under the parking lot's queue
//! lock), and a release that finds the bit set wakes one waiter, handing it
//! the lock still locked when the lot says the wake-up is due to be fair.
//! The parkers byte counts the threads between announcing a park and
//! returning from it, for a `lock` that must learn cheaply that threads are
//! parked.
//!
//! Written against `crate::sync` and a [`Lot`] (`parking_lot_core`'s in a
//! build, a model lot under loom), so that `loom_tests` checks this very
//! code: exclusion, no lost wake-up, hand-off, and exact counts. The
//! observations around it (what a hold reports, the clock readings of a
//! wait) are the raw mutex's (`raw.rs`).

use std::time::Instant;

use crate::sync::{AtomicU8, AtomicU16, Ordering};

/// The lock word's bits: `parking_lot`'s two, then the count.
pub(crate) const LOCKED_BIT: u16 = 0b01;
/// Some thread is (or may be) parked on the lock.
pub(crate) const PARKED_BIT: u16 = 0b10;
/// Bits 2–15 of the lock word: the uncontended `lock`s released so far,
/// modulo 2^14. A plain hold's release adds [`COUNT_ONE`] in the same
/// atomic operation that clears [`LOCKED_BIT`], so counting costs the
/// fast path no store of its own. Only the lock holder changes them.
pub(crate) const COUNT_SHIFT: u32 = 2;
/// One uncontended `lock` in the lock word.
pub(crate) const COUNT_ONE: u16 = 1 << COUNT_SHIFT;
/// The count bits of the lock word.
pub(crate) const COUNT_BITS: u16 = !(LOCKED_BIT | PARKED_BIT);
/// The largest count the lock word holds; the next `lock` wraps it to 0.
pub(crate) const COUNT_MAX: u16 = COUNT_BITS >> COUNT_SHIFT;
/// Unpark token bit: the lock was handed to the woken thread, still
/// locked (clear: try to take it again). The token's other bits are the
/// caller's (the raw mutex's wake-up clock).
pub(crate) const TOKEN_HANDOFF_BIT: usize = 1;

/// What an unpark found, as `parking_lot_core::UnparkResult` says it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unparked {
    /// A thread was woken.
    pub(crate) unparked: bool,
    /// More threads are still parked on the lock.
    pub(crate) have_more: bool,
    /// The lot says this wake-up should hand the lock over (fairness).
    pub(crate) be_fair: bool,
}

/// How a park ended, as `parking_lot_core::ParkResult` says it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Parked {
    /// Woken by an unpark, with its token.
    Woken(usize),
    /// `validate` said no: the thread did not park.
    Invalid,
    /// The deadline passed.
    TimedOut,
}

/// A parking lot: `parking_lot_core`'s semantics (queues keyed by address,
/// callbacks run under the queue's lock).
pub(crate) trait Lot {
    /// Under the queue lock, runs `validate`; if it holds, queues the
    /// thread and sleeps until an unpark or `deadline` (then `timed_out`
    /// runs under the queue lock, told whether the thread was the last
    /// one queued).
    fn park(
        &self,
        key: usize,
        validate: impl FnOnce() -> bool,
        timed_out: impl FnOnce(bool),
        deadline: Option<Instant>,
    ) -> Parked;

    /// Under the queue lock, dequeues one thread of `key` and runs
    /// `callback`, whose result is the token the thread wakes with.
    fn unpark_one(&self, key: usize, callback: impl FnOnce(Unparked) -> usize);
}

/// `parking_lot_core`'s global parking lot.
#[cfg(not(loom))]
pub(crate) struct ParkingLot;

#[cfg(not(loom))]
impl Lot for ParkingLot {
    #[inline]
    fn park(
        &self,
        key: usize,
        validate: impl FnOnce() -> bool,
        timed_out: impl FnOnce(bool),
        deadline: Option<Instant>,
    ) -> Parked {
        // SAFETY: `key` is a lock's address, which only that lock parks and
        // unparks on; this module's `validate` and `timed_out` only touch the
        // lock word (they neither panic nor call into `parking_lot_core`),
        // and the empty `before_sleep` does not park.
        let result = unsafe {
            parking_lot_core::park(
                key,
                validate,
                || {},
                |_, was_last| timed_out(was_last),
                parking_lot_core::DEFAULT_PARK_TOKEN,
                deadline,
            )
        };
        match result {
            parking_lot_core::ParkResult::Unparked(token) => Parked::Woken(token.0),
            parking_lot_core::ParkResult::Invalid => Parked::Invalid,
            parking_lot_core::ParkResult::TimedOut => Parked::TimedOut,
        }
    }

    #[inline]
    fn unpark_one(&self, key: usize, callback: impl FnOnce(Unparked) -> usize) {
        let callback = |result: parking_lot_core::UnparkResult| {
            parking_lot_core::UnparkToken(callback(Unparked {
                unparked: result.unparked_threads != 0,
                have_more: result.have_more_threads,
                be_fair: result.be_fair,
            }))
        };
        // SAFETY: `key` as in `park`; this module's callbacks only update the
        // lock word and compute a token (the caller's `token` reads the clock
        // at most), and neither panic nor call into `parking_lot_core`.
        unsafe {
            parking_lot_core::unpark_one(key, callback);
        }
    }
}

/// What a waiting `lock` does between looks at the word: the raw mutex's
/// spin policy and clock readings.
pub(crate) trait Wait {
    /// The word (`state`) says the lock is held: whether to spin and look
    /// again (false: park).
    fn spin(&mut self, state: u16) -> bool;
    /// Back from a park that ended as `how`.
    fn parked(&mut self, how: Parked);
}

/// The uncontended acquisition: one atomic bit-test-and-set (`lock bts`),
/// whatever the count; it fails only if the lock is held. (`parking_lot`
/// also fails while threads are parked, then takes the free lock in its
/// slow path: the same outcome.)
#[inline(always)]
pub(crate) fn lock_fast(state: &AtomicU16) -> bool {
    state.fetch_or(LOCKED_BIT, Ordering::Acquire) & LOCKED_BIT == 0
}

/// Takes the lock if it is free, parked threads or not.
#[inline]
pub(crate) fn try_lock(state: &AtomicU16) -> bool {
    let mut word = state.load(Ordering::Relaxed);
    loop {
        if word & LOCKED_BIT != 0 {
            return false;
        }
        match state.compare_exchange_weak(word, word | LOCKED_BIT, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => word = now,
        }
    }
}

/// `parking_lot`'s lock slow path: takes the lock when free, else spins
/// while `wait` says so, else announces itself in `parkers` and the parked
/// bit and parks, until it has the lock (true) or `deadline` passed
/// (false). `key`: the lock's address.
pub(crate) fn lock_slow<L: Lot>(
    lot: &L,
    key: usize,
    state: &AtomicU16,
    parkers: &AtomicU8,
    deadline: Option<Instant>,
    wait: &mut impl Wait,
) -> bool {
    let mut word = state.load(Ordering::Relaxed);
    loop {
        // Take the lock if it is free, even if others are parked.
        if word & LOCKED_BIT == 0 {
            match state.compare_exchange_weak(word, word | LOCKED_BIT, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => word = now,
            }
            continue;
        }
        if wait.spin(word) {
            word = state.load(Ordering::Relaxed);
            continue;
        }
        // Announce a parked thread, then park. Counted in `parkers` first:
        // the Release below publishes the count with the bit.
        parkers.fetch_add(1, Ordering::Relaxed);
        if word & PARKED_BIT == 0
            && let Err(now) =
                state.compare_exchange_weak(word, word | PARKED_BIT, Ordering::Release, Ordering::Relaxed)
        {
            parkers.fetch_sub(1, Ordering::Relaxed);
            word = now;
            continue;
        }
        let validate = || state.load(Ordering::Relaxed) & !COUNT_BITS == LOCKED_BIT | PARKED_BIT;
        let timed_out = |was_last_thread| {
            // Clear the parked bit if we were the last parked thread.
            if was_last_thread {
                state.fetch_and(!PARKED_BIT, Ordering::Relaxed);
            }
        };
        let how = lot.park(key, validate, timed_out, deadline);
        parkers.fetch_sub(1, Ordering::Relaxed);
        wait.parked(how);
        match how {
            // The unlocking thread handed the lock over, still locked.
            Parked::Woken(token) if token & TOKEN_HANDOFF_BIT != 0 => return true,
            Parked::TimedOut => return false,
            Parked::Woken(_) | Parked::Invalid => {}
        }
        word = state.load(Ordering::Relaxed);
    }
}

/// `parking_lot`'s release: with threads parked, wakes one while the lock
/// is still held and may hand it over ([`unlock_slow`]); otherwise
/// [`release`]. Adds `count` (0 or [`COUNT_ONE`]) to the word's count
/// either way, and returns the word it replaced. `token` makes a wake-up's
/// token from what the unpark found and whether it hands the lock over
/// (it must set [`TOKEN_HANDOFF_BIT`] exactly then).
///
/// The caller holds the lock.
#[inline(always)]
pub(crate) fn unlock<L: Lot>(
    lot: &L,
    key: usize,
    state: &AtomicU16,
    fair: bool,
    count: u16,
    token: impl Fn(&Unparked, bool) -> usize,
) -> u16 {
    if state.load(Ordering::Relaxed) & PARKED_BIT != 0 {
        return unlock_slow(lot, key, state, fair, count, token);
    }
    release(lot, key, state, count, token)
}

/// Releases the lock in one atomic add that also adds `count` to the word's
/// count; wakes a thread that parked meanwhile. Returns the word it
/// replaced.
///
/// It does not load the word first: the release of a plain uncontended
/// `lock` that saw no parked thread is this alone. (A load before the add
/// would lengthen the uncontended `lock`+`unlock`, the `uncontended`
/// group's `subetha` row against `parking_lot`'s, and a hammered lock runs
/// at about its uncontended ratio to `parking_lot`.)
///
/// The caller holds the lock.
#[inline(always)]
pub(crate) fn release<L: Lot>(
    lot: &L,
    key: usize,
    state: &AtomicU16,
    count: u16,
    token: impl Fn(&Unparked, bool) -> usize,
) -> u16 {
    // LOCKED_BIT is set, so adding `count - LOCKED_BIT` clears it and
    // carries nothing into PARKED_BIT: one `lock xadd`, whose Release
    // publishes the critical section.
    let before = state.fetch_add(count.wrapping_sub(LOCKED_BIT), Ordering::Release);
    if before & PARKED_BIT != 0 {
        wake_one_released(lot, key, state, token);
    }
    before
}

/// Wakes one parked thread after a release that found PARKED_BIT set (a
/// thread parked during the hold); clears the bit if nobody else waits.
///
/// When the lot says this wake-up is due to be fair (`parking_lot_core`:
/// about every 0.5 ms), the callback takes the lock back for the woken
/// thread if it is still free and hands it over locked, as [`unlock_slow`]
/// would. If another thread took it in the meantime, the woken thread
/// competes as after any other wake-up, and the next holder, which finds
/// PARKED_BIT set when it takes the lock, releases through `unlock_slow`.
#[cold]
#[inline(never)]
pub(crate) fn wake_one_released<L: Lot>(
    lot: &L,
    key: usize,
    state: &AtomicU16,
    token: impl Fn(&Unparked, bool) -> usize,
) {
    lot.unpark_one(key, |result| {
        // Atomic updates: the lock is free or someone else's now. A thread
        // about to park re-validates the word under the queue lock, after
        // this callback, so it cannot park on a cleared bit.
        let parked = if result.have_more { PARKED_BIT } else { 0 };
        if result.unparked && result.be_fair {
            let mut word = state.load(Ordering::Relaxed);
            while word & LOCKED_BIT == 0 {
                // Acquire: the woken thread's hold follows whatever holder
                // released the lock last; the unpark's own synchronisation
                // carries that on to the woken thread.
                match state.compare_exchange_weak(
                    word,
                    (word & !PARKED_BIT) | parked | LOCKED_BIT,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return token(&result, true),
                    Err(now) => word = now,
                }
            }
        }
        if parked == 0 {
            state.fetch_and(!PARKED_BIT, Ordering::Relaxed);
        }
        token(&result, false)
    });
}

/// Wakes one parked thread while the lock is still held; with `force_fair`
/// (or the lot's periodic fairness) hands it the lock directly. Adds
/// `count` to the word's count either way, and returns the word it
/// replaced.
///
/// The caller holds the lock.
#[cold]
#[inline(never)]
pub(crate) fn unlock_slow<L: Lot>(
    lot: &L,
    key: usize,
    state: &AtomicU16,
    force_fair: bool,
    count: u16,
    token: impl Fn(&Unparked, bool) -> usize,
) -> u16 {
    let mut replaced = 0;
    lot.unpark_one(key, |result| {
        // Unconditional writes, as `parking_lot`'s stores: the lock is still
        // ours and the queue is locked, so the one concurrent change is a
        // waiter setting PARKED_BIT before it parks, and its park
        // re-validates the word under the queue lock after this callback.
        // (Swaps rather than stores, in this cold path: loom 0.7 can order a
        // plain store before a compare-and-swap that read the value the store
        // replaced, which C11 forbids, and then reports a lost wake-up that
        // cannot happen; a swap it orders as C11 does.) (Another thread's `lock
        // bts` finds the bit set and changes nothing; an earlier holder's
        // `wake_one_released` runs under the same queue lock.) The count
        // bits are only changed by the holder.
        replaced = state.load(Ordering::Relaxed);
        let counted = (replaced & COUNT_BITS).wrapping_add(count);
        let parked = if result.have_more { PARKED_BIT } else { 0 };
        if result.unparked && (force_fair || result.be_fair) {
            // Keep the lock locked for the woken thread.
            state.swap(counted | parked | LOCKED_BIT, Ordering::Relaxed);
            return token(&result, true);
        }
        state.swap(counted | parked, Ordering::Release);
        token(&result, false)
    });
    replaced
}

/// The protocol under every interleaving loom allows, on a model parking
/// lot: threads lock (the uncontended bit-test-and-set, else the slow path,
/// which parks at once instead of spinning), change data behind a loom cell
/// (a hold that overlapped another would race there), and release as the raw
/// mutex does (counted by the bare add when no thread was parked, else
/// through `unlock`, which may hand the lock over). Loom reports a lost
/// wake-up as a deadlock; at the end the lock is free, nobody is parked, and
/// the word's count is exactly the counted releases.
#[cfg(all(test, loom))]
mod loom_tests {
    use std::collections::VecDeque;

    use loom::cell::UnsafeCell;
    use loom::sync::{Arc, Condvar, Mutex};

    use super::*;

    /// `parking_lot_core`'s semantics on loom's mutex and condition
    /// variable: one FIFO queue, the callbacks run under its lock, a woken
    /// thread returns with its token. Every unpark reports `fair`.
    struct ModelLot {
        queue: Mutex<VecDeque<Arc<Waiter>>>,
        fair: bool,
    }

    struct Waiter {
        token: Mutex<Option<usize>>,
        woken: Condvar,
    }

    impl Lot for ModelLot {
        fn park(
            &self,
            _key: usize,
            validate: impl FnOnce() -> bool,
            _timed_out: impl FnOnce(bool),
            deadline: Option<Instant>,
        ) -> Parked {
            assert!(deadline.is_none(), "the model has no clock");
            let waiter = Arc::new(Waiter {
                token: Mutex::new(None),
                woken: Condvar::new(),
            });
            {
                let mut queue = self.queue.lock().unwrap();
                if !validate() {
                    return Parked::Invalid;
                }
                queue.push_back(Arc::clone(&waiter));
            }
            let mut token = waiter.token.lock().unwrap();
            loop {
                if let Some(token) = *token {
                    return Parked::Woken(token);
                }
                token = waiter.woken.wait(token).unwrap();
            }
        }

        fn unpark_one(&self, _key: usize, callback: impl FnOnce(Unparked) -> usize) {
            let mut queue = self.queue.lock().unwrap();
            let woken = queue.pop_front();
            let token = callback(Unparked {
                unparked: woken.is_some(),
                have_more: !queue.is_empty(),
                be_fair: self.fair,
            });
            drop(queue);
            if let Some(waiter) = woken {
                *waiter.token.lock().unwrap() = Some(token);
                waiter.woken.notify_one();
            }
        }
    }

    struct Lock {
        state: AtomicU16,
        parkers: AtomicU8,
        lot: ModelLot,
        data: UnsafeCell<u32>,
        counted: crate::sync::AtomicU32,
    }

    /// Parks at once: the interleavings that matter are the park's.
    struct NoSpin;

    impl Wait for NoSpin {
        fn spin(&mut self, _state: u16) -> bool {
            false
        }

        fn parked(&mut self, _how: Parked) {}
    }

    fn token(_: &Unparked, handoff: bool) -> usize {
        if handoff { TOKEN_HANDOFF_BIT } else { 0 }
    }

    /// One hold, as the raw mutex takes and releases it.
    fn hold(lock: &Lock) {
        let plain = lock_fast(&lock.state);
        if !plain {
            assert!(lock_slow(
                &lock.lot,
                1,
                &lock.state,
                &lock.parkers,
                None,
                &mut NoSpin
            ));
        }
        // A plain `lock` that finds threads parked releases through
        // `parking_lot`'s path (`acquired_plain`), as does any waited one.
        let quiet = plain && lock.parkers.load(Ordering::Relaxed) == 0;
        // SAFETY: under the lock (which is what this checks).
        lock.data.with_mut(|data| unsafe { *data += 1 });
        let count = if plain { COUNT_ONE } else { 0 };
        if plain {
            lock.counted.fetch_add(1, Ordering::Relaxed);
        }
        if quiet {
            release(&lock.lot, 1, &lock.state, count, token);
        } else {
            unlock(&lock.lot, 1, &lock.state, false, count, token);
        }
    }

    /// `threads` threads take the lock `holds` times each; `preemptions`
    /// bounds loom's search (None: every interleaving).
    fn model(fair: bool, threads: usize, holds: usize, preemptions: Option<usize>) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = preemptions;
        builder.check(move || {
            let lock = Arc::new(Lock {
                state: AtomicU16::new(0),
                parkers: AtomicU8::new(0),
                lot: ModelLot {
                    queue: Mutex::new(VecDeque::new()),
                    fair,
                },
                data: UnsafeCell::new(0),
                counted: crate::sync::AtomicU32::new(0),
            });
            let others: Vec<_> = (1..threads)
                .map(|_| {
                    let lock = Arc::clone(&lock);
                    loom::thread::spawn(move || (0..holds).for_each(|_| hold(&lock)))
                })
                .collect();
            (0..holds).for_each(|_| hold(&lock));
            for other in others {
                other.join().unwrap();
            }
            let word = lock.state.load(Ordering::Acquire);
            assert_eq!(word & LOCKED_BIT, 0, "the lock is free");
            assert_eq!(word & PARKED_BIT, 0, "nobody is parked");
            assert_eq!(lock.parkers.load(Ordering::Relaxed), 0);
            assert_eq!(
                u32::from(word >> COUNT_SHIFT),
                lock.counted.load(Ordering::Relaxed),
                "every counted release counted once"
            );
            // SAFETY: every other thread has been joined.
            let data = lock.data.with_mut(|data| unsafe { *data });
            assert_eq!(data as usize, threads * holds);
        });
    }

    #[test]
    fn loom_mutex_two_threads_exclude_and_wake() {
        model(false, 2, 1, None);
    }

    #[test]
    fn loom_mutex_hands_over_when_fair() {
        model(true, 2, 1, None);
    }

    /// A second hold each: a waiter woken without the lock parks again, a
    /// stale parked bit is cleared, counts go on (bounded: the full search
    /// takes hours).
    #[test]
    fn loom_mutex_two_threads_twice() {
        model(false, 2, 2, Some(3));
    }

    #[test]
    fn loom_mutex_two_threads_twice_fair() {
        model(true, 2, 2, Some(3));
    }
}
