//! Sampling: which operations of a primitive are measured one by one.
//!
//! Two schedules. Operations reported on their own (a `try_lock`, a wait, a
//! permit, a channel op) are sampled by the thread's operation number
//! ([`next_thread_op`]) against the instance's level, cached in its
//! [`Sampler`]. The holds of the `Mutex` and the `RwLock`, whose uncontended
//! acquisitions are only counted, are sampled by a draw the counts leave the
//! thread ([`HoldDraw`]): one random draw per batch of counted acquisitions,
//! weighted so each lock is sampled at its level in expectation, decided
//! before the acquisition so that nothing of it runs inside the hold.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::LocalKey;

use super::{PolicyWord, REFRESH_EVERY, Registration, SLOW_PATH_REFRESH_NS, spin};

/// What one primitive caches of its policy word (the hold-sampling level
/// and, for adaptive locks, the spin budget) and when a slow path last
/// re-read it.
///
/// Eight bytes on purpose: it lives in the primitive next to the lock word,
/// and a small primitive keeps the lock word and the protected data in one
/// cache line (see `mutex::RawMutex`). The sampling mask is derived from
/// the word when needed (a few register operations) rather than cached.
#[derive(Debug)]
pub(crate) struct Sampler {
    word: AtomicU32,
    /// `ticks() >> REFRESH_TICK_SHIFT` at the last slow-path refresh
    /// (wrapping; compared by difference).
    refreshed_at: AtomicU32,
}

/// Units of `Sampler::refreshed_at`: 2^16 ticks (~25 µs at 2.6 GHz), so a
/// `u32` wraps only after ~30 hours.
const REFRESH_TICK_SHIFT: u32 = 16;

impl Sampler {
    /// Mask meaning "never sample".
    pub(crate) const OFF: u32 = u32::MAX;

    pub(crate) const fn new() -> Self {
        Self {
            word: AtomicU32::new(0),
            refreshed_at: AtomicU32::new(0),
        }
    }

    /// The hold-sampling mask of the cached word: sample operation `n` when
    /// `n & mask == 0`; [`Sampler::OFF`] = never.
    #[inline(always)]
    pub(crate) fn mask(&self) -> u32 {
        Self::mask_of(PolicyWord(self.word.load(Ordering::Relaxed)))
    }

    /// The hold-sampling mask of `word`.
    const fn mask_of(word: PolicyWord) -> u32 {
        match word.sample_shift() {
            Some(shift) => (1u32 << shift) - 1,
            None => Self::OFF,
        }
    }

    /// The mask that decides whether operation `n` needs the slow
    /// bookkeeping: a sample, a policy refresh, or both. Zero bits of `n`
    /// under it ⇒ call [`Sampler::wants_sample`] / refresh.
    #[inline(always)]
    pub(crate) fn check_mask(&self) -> u32 {
        Self::check_mask_of(PolicyWord(self.word.load(Ordering::Relaxed)))
    }

    /// [`check_mask`](Self::check_mask) for a cached `word`.
    pub(crate) const fn check_mask_of(word: PolicyWord) -> u32 {
        Self::mask_of(word) & (REFRESH_EVERY - 1)
    }

    /// Whether operation `n` is a sampled one.
    #[inline]
    pub(crate) fn wants_sample(&self, n: u32) -> bool {
        let mask = self.mask();
        mask != Self::OFF && n & mask == 0
    }

    /// Operation `n`'s out-of-line bookkeeping, for a primitive that
    /// samples by the thread's operation number: re-reads the policy word
    /// from `registration` when `n` is due, then returns the start of the hold
    /// sample `n` begins (`now`, or the clock now when `now` is 0), or 0
    /// when `n` is not sampled.
    #[cold]
    #[inline(never)]
    pub(crate) fn bookkeeping(&self, registration: &Registration, n: u32, now: u64) -> u64 {
        if Self::wants_refresh(n) {
            self.apply(registration.policy_word());
        }
        if !self.wants_sample(n) {
            0
        } else if now != 0 {
            now
        } else {
            crate::clock::ticks().max(1)
        }
    }

    /// Whether operation `n` is due to re-read the policy word.
    #[inline]
    pub(crate) fn wants_refresh(n: u32) -> bool {
        n & (REFRESH_EVERY - 1) == 0
    }

    /// On a slow path at tick `now`: whether to re-read the policy word
    /// (at most once per [`SLOW_PATH_REFRESH_NS`]); claims the refresh.
    #[inline]
    pub(crate) fn slow_path_due(&self, now: u64) -> bool {
        let now_units = (now >> REFRESH_TICK_SHIFT) as u32;
        let last = self.refreshed_at.load(Ordering::Relaxed);
        let period_ticks = spin::ticks_per_spin_unit() * (SLOW_PATH_REFRESH_NS / PolicyWord::SPIN_UNIT_NS);
        if u64::from(now_units.wrapping_sub(last)) < (period_ticks >> REFRESH_TICK_SHIFT).max(1) {
            return false;
        }
        self.refreshed_at.store(now_units, Ordering::Relaxed);
        true
    }

    /// The cached word.
    #[inline]
    pub(crate) fn word(&self) -> PolicyWord {
        PolicyWord(self.word.load(Ordering::Relaxed))
    }

    /// Caches `word`. Stores only a change: the cache shares a line with
    /// the primitive, which other threads read on every operation.
    pub(crate) fn apply(&self, word: PolicyWord) {
        if self.word.load(Ordering::Relaxed) != word.0 {
            self.word.store(word.0, Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// Per-thread operation counter for sampling decisions of operations
    /// that hold no exclusive lock (shared reads, permits, channel ops).
    static OPS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The calling thread's next operation number (see `OPS`).
#[inline(always)]
pub(crate) fn next_thread_op() -> u32 {
    OPS.try_with(|ops| {
        let n = ops.get().wrapping_add(1);
        ops.set(n);
        n
    })
    .unwrap_or(1)
}

thread_local! {
    /// The hold samplers' xorshift state; 0 until the thread's first draw.
    static HOLD_SAMPLE_RNG: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The next random number of the calling thread's hold samplers (the
/// `Mutex`'s and the `RwLock`'s draws).
pub(crate) fn next_hold_random() -> u32 {
    HOLD_SAMPLE_RNG.with(|rng| {
        let mut x = rng.get();
        if x == 0 {
            // A distinct, nonzero seed per thread.
            x = crate::thread_id().wrapping_mul(0x9E37_79B9) | 1;
        }
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        rng.set(x);
        x
    })
}

thread_local! {
    /// Acquisitions of unobserved locks that found this thread's
    /// hold-sampler draw pending and left it, since an observed lock last
    /// paid one (see [`unobserved_lock_drops_draw`]).
    static DRAW_PASSED_BY: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// How many acquisitions of unobserved locks a pending draw survives.
const DRAW_OUTLIVES_UNOBSERVED: u32 = 64;

/// An unobserved `Mutex` or `RwLock`, about to be taken, found this
/// thread's draw of the hold sampler pending (`first`: it is the thread's
/// first-acquisition draw): whether to clear it. It has no hold to sample,
/// and a draw it cleared would be lost to the observed lock whose count
/// left it (a thread alternating between the two would never sample that
/// lock's holds), so it leaves the draw for the next observed
/// acquisition. But each acquisition that finds a draw pending takes a
/// slower path, so after [`DRAW_OUTLIVES_UNOBSERVED`] of them (a thread
/// that took an observed lock once and now takes only unobserved ones)
/// the draw goes.
pub(crate) fn unobserved_lock_drops_draw(first: bool) -> bool {
    DRAW_PASSED_BY.with(|passed| {
        let n = passed.get() + 1;
        let drop = first || n >= DRAW_OUTLIVES_UNOBSERVED;
        passed.set(if drop { 0 } else { n });
        drop
    })
}

/// An observed lock paid this thread's draw (see
/// [`unobserved_lock_drops_draw`]).
pub(crate) fn draw_paid() {
    DRAW_PASSED_BY.with(|passed| passed.set(0));
}

/// A thread's owed draw of one lock type's hold sampler, as its weight: 0
/// none, [`HoldDraw::FIRST`] before the thread's first acquisition of an
/// observed lock of the type (which draws with weight 1). The counts of
/// uncontended acquisitions leave a draw ([`owe`](Self::owe)); the next
/// acquisition of an observed lock of the type, whichever it is, pays it
/// ([`pay`](Self::pay)): sampled with probability weight / its level.
/// Draws thus come at the rate of the counts, and each lock is sampled at
/// its level in expectation. A lock sampled finer than a count's batch
/// leaves a draw of weight 1, so the thread's next acquisition draws again:
/// exact for a thread that keeps taking that lock, lower (down to 1 in a
/// batch) while it takes others. An unobserved lock has nothing to sample
/// and leaves the draw for a while ([`pass_by`](Self::pass_by)).
#[derive(Clone, Copy)]
pub(crate) struct HoldDraw(&'static LocalKey<Cell<u32>>);

thread_local! {
    static MUTEX_DRAW: Cell<u32> = const { Cell::new(HoldDraw::FIRST) };
    static RWLOCK_DRAW: Cell<u32> = const { Cell::new(HoldDraw::FIRST) };
}

impl HoldDraw {
    /// The `Mutex`'s (and `AdaptiveMutex`'s) draws.
    pub(crate) const MUTEX: HoldDraw = HoldDraw(&MUTEX_DRAW);
    /// The `RwLock`'s draws, shared and exclusive holds alike.
    pub(crate) const RWLOCK: HoldDraw = HoldDraw(&RWLOCK_DRAW);
    /// The draw of a thread that has taken no observed lock of the type
    /// yet. An unobserved lock that finds it clears it, so a thread that
    /// takes only unobserved locks reads one thread-local per acquisition
    /// and no more.
    pub(crate) const FIRST: u32 = u32::MAX;

    /// The weight this thread owes (0: none): the one thread-local read of
    /// an uncontended acquisition.
    #[inline(always)]
    pub(crate) fn owed(self) -> u32 {
        self.0.with(Cell::get)
    }

    /// An unobserved lock, about to be taken, found `weight` owed.
    pub(crate) fn pass_by(self, weight: u32) {
        if unobserved_lock_drops_draw(weight == Self::FIRST) {
            self.0.with(|draw| draw.set(0));
        }
    }

    /// An observed lock sampling at `mask` ([`Sampler::OFF`]: never), about
    /// to be taken, pays `weight`; its counts come in batches of `batch`.
    /// Whether its hold is sampled.
    pub(crate) fn pay(self, weight: u32, mask: u32, batch: u32) -> bool {
        draw_paid();
        let weight = if weight == Self::FIRST { 1 } else { weight };
        let fine = mask != Sampler::OFF && mask < batch - 1;
        self.0.with(|draw| draw.set(u32::from(fine)));
        // Probability weight / level (certain once the weight covers it).
        mask != Sampler::OFF && next_hold_random() & mask < weight
    }

    /// A count covering `covered` acquisitions leaves a draw of that weight
    /// (added to one still owed). (`FIRST` only until the thread's first
    /// acquisition of an observed lock, which comes before any count of one.)
    pub(crate) fn owe(self, covered: u32) {
        self.0.with(|draw| {
            let owed = if draw.get() == Self::FIRST { 1 } else { draw.get() };
            draw.set(owed.saturating_add(covered).min(Self::FIRST - 1));
        });
    }

    /// A count ends a batch of `batch` acquisitions: owes a draw of weight
    /// `batch` unless one is owed already (a batch's draw is not added to).
    pub(crate) fn owe_batch(self, batch: u32) {
        self.0.with(|draw| {
            if draw.get() == 0 || draw.get() == Self::FIRST {
                draw.set(batch);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draw protocol on a fresh thread: the first acquisition draws with
    /// weight 1; counts leave weights (added for the `RwLock`, a batch's not
    /// added to for the `Mutex`); a level finer than the batch leaves 1;
    /// unobserved locks leave a draw for a while, a first one at once.
    #[test]
    fn draws_are_owed_paid_and_passed_by() {
        std::thread::spawn(|| {
            let d = HoldDraw::RWLOCK;
            assert_eq!(d.owed(), HoldDraw::FIRST);
            // Level 1 in 1 (mask 0): always sampled; finer than a batch of 64.
            assert!(d.pay(d.owed(), 0, 64));
            assert_eq!(d.owed(), 1, "a fine level leaves a draw of weight 1");
            // Level 1 in 256, coarser than the batch: leaves nothing.
            let _ = d.pay(d.owed(), 255, 64);
            assert_eq!(d.owed(), 0);
            d.owe(64);
            d.owe(3);
            assert_eq!(d.owed(), 67, "counts add up");
            // Weight at least the level: certain.
            assert!(d.pay(256, 255, 64));
            assert!(!d.pay(5, Sampler::OFF, 64), "OFF never samples");
            assert_eq!(d.owed(), 0);

            let m = HoldDraw::MUTEX;
            assert_eq!(m.owed(), HoldDraw::FIRST, "each lock type draws on its own");
            m.owe_batch(64);
            assert_eq!(m.owed(), 64, "FIRST gives way to the batch's draw");
            m.owe_batch(64);
            assert_eq!(m.owed(), 64, "a batch's draw is not added to");
            // An unobserved lock leaves a pending draw for 63 acquisitions.
            for _ in 0..DRAW_OUTLIVES_UNOBSERVED - 1 {
                m.pass_by(m.owed());
            }
            assert_eq!(m.owed(), 64);
            m.pass_by(m.owed());
            assert_eq!(m.owed(), 0, "dropped at the 64th");
        })
        .join()
        .unwrap();
        std::thread::spawn(|| {
            let m = HoldDraw::MUTEX;
            m.pass_by(m.owed());
            assert_eq!(m.owed(), 0, "a first-acquisition draw goes at once");
        })
        .join()
        .unwrap();
    }
}
