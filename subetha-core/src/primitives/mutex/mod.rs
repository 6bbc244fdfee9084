//! [`Mutex`]: `parking_lot::Mutex` with observations.
//!
//! Its cost against `parking_lot::Mutex` is what the `uncontended` and
//! `contended` groups of `benches/primitives.rs` show.
//!
//! Kind code 1 (`mutex`). Ops: `lock` (1, C + wait when it had to wait),
//! `try_lock` (2, M when it failed; the timed variants set C and record the
//! wait, M when they time out), `unlock` (3, sampled hold time). See the
//! [table](super#op-kinds).
//!
//! Built on [`lock_api`] with [`RawMutex`], whose lock bits and slow path
//! are `parking_lot`'s (the same algorithm, on `parking_lot_core`, so the
//! two behave alike under contention: a brief exponential spin while nobody
//! is parked, then parking, with `parking_lot`'s eventual fairness; one
//! difference, for speed: a thread that parks *during* a plain hold is woken
//! just after that hold's release rather than just before). Guards
//! are `lock_api` guards, so `map`, `unlocked`, `unlock_fair`, `bump` and
//! `leak` all work. The uncontended `lock` is a test of a thread-local
//! (does this thread owe a hold-sampler draw?), one atomic test-and-set of
//! the lock bit, and a test for parked threads; its release is one atomic
//! add that clears the lock bit and counts the `lock`, and a test of the
//! count it replaced (is a count due?). No clock read, no ring push, no
//! other store. Only when the test-and-set finds the lock held does the
//! slow path take a timestamp, and it records the whole wait when it gets
//! the lock.
//!
//! Nothing of the bookkeeping runs inside the hold: counts are decided after
//! the release, and hold sampling before the acquisition (see `raw::DRAWS`).
//! Any work inside even an occasional hold (one `rdtsc` in every 64th) can tip
//! two threads sharing a lock from alternating into colliding; the `contended`
//! group's `…/50+100ns/2` rows of `benches/primitives.rs` show the lock
//! against `parking_lot`'s.
//!
//! Uncontended `lock`s are reported as counts
//! ([`Observation::FLAG_COUNT`](crate::Observation::FLAG_COUNT)): one
//! observation for the 1st, 2nd, 4th, … 64th of the lock's life (so a lock
//! shows up at once), then one per [`COUNT_BATCH`], and the rest when the
//! mutex is dropped. (The early counts start again after each wrap of the
//! lock word's 14-bit count, every 16,384 `lock`s; they add up to one
//! batch, so the total stays exact.) A consumer's `lock` count may
//! therefore lag a live mutex by up to 63 uncontended acquisitions; it is
//! exact once the mutex is gone. Contended `lock`s, `try_lock`s and sampled
//! holds are reported one by one. (Counting keeps a push per uncontended
//! `lock`, and the sidecar's draining of it, off a hammered lock: see the
//! `contended` group's `…/hammer` rows.)
//!
//! An acquisition's observation is pushed when the lock is released, just
//! after the release, so the ring push is not part of the critical section
//! (a lock held for a long time shows its `lock` only at release; the
//! recorded wait is still measured at acquisition).
//!
//! Hold times are sampled at the level in the instance's policy word (1 in
//! 256 by default) in expectation, at random, not every 256th acquisition
//! (an acquisition reported on its own, a `lock` that waited or a
//! `try_lock`, is sampled by its thread's operation number instead): a
//! sampled hold runs from a clock reading just before the acquisition (or
//! the end of its wait) to one just after the release, so it includes the
//! acquiring instruction (a few ns, more when another core holds the lock
//! word's line). [`AdaptiveMutex`](super::AdaptiveMutex), whose policy needs
//! the critical section alone, reads the clock once the lock is taken. Levels finer than 1
//! in 64 are exact for a thread that keeps taking the mutex, lower (down to
//! 1 in 64) for one that takes other mutexes in between.
//!
//! `lock_api::Mutex::<RawMutex, T>::new` (the raw `INIT`) and
//! [`Mutex::unobserved`] build an unobserved mutex (no instance), usable in
//! `static`s. It measures nothing: its waits read no clock, and its holds
//! store nothing but the lock word, so it runs as `parking_lot`'s does (the
//! `unobserved` rows of the `contended` group).

use std::cell::Cell;
use std::fmt;
use std::hint;
use std::panic::Location;
use std::sync::atomic::{AtomicU8, AtomicU16, Ordering};
use std::time::{Duration, Instant};

use lock_api::GuardNoSend;
use parking_lot_core::SpinWait;

use super::sampling::{HoldDraw, Sampler};
use super::{CONTENDED, COUNT, MISS, PolicyWord, Registration, hold_ticks, holder};
use crate::clock;
use crate::registry::InstanceKind;
use crate::site::SiteWord;

/// The kind [`Mutex`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 1,
    name: "mutex",
    ops: &["lock", "try_lock", "unlock"],
};

/// Op kinds of [`Mutex`] (and [`AdaptiveMutex`](super::AdaptiveMutex)).
pub mod op {
    /// Blocking acquisition.
    pub const LOCK: u16 = 1;
    /// `try_lock` and its timed variants.
    pub const TRY_LOCK: u16 = 2;
    /// A sampled release; latency = hold time.
    pub const UNLOCK: u16 = 3;
    /// ([`AdaptiveMutex`](crate::AdaptiveMutex) only) the spin budget ran
    /// out and the thread slept in a park; latency = its (last) wake-up:
    /// from the releasing thread's call to wake it to it running again
    /// (none if the two CPUs' clocks disagreed, the waker's reading later
    /// than the woken thread's).
    pub const PARK: u16 = 4;
}

mod protocol;
mod raw;
#[cfg(test)]
mod tests;
mod word;

pub use raw::RawMutex;
pub use word::COUNT_BATCH;

/// A guard of [`Mutex`] (a `lock_api` guard: `map`, `unlocked`,
/// `unlock_fair`, `bump`, `leak` …).
pub type MutexGuard<'a, T> = lock_api::MutexGuard<'a, RawMutex, T>;
/// A guard of [`Mutex`] mapped to a part of the data.
pub type MappedMutexGuard<'a, T> = lock_api::MappedMutexGuard<'a, RawMutex, T>;

/// A mutual-exclusion lock, `parking_lot::Mutex` with observations (kind 1).
///
/// ```
/// use std::time::Duration;
/// use subetha_core::Mutex;
///
/// let cache = Mutex::named("cache", 0u32);
/// *cache.lock() += 1;
/// if let Some(mut g) = cache.try_lock_for(Duration::from_millis(5)) {
///     *g += 1;
/// }
/// assert_eq!(cache.into_inner(), 2);
/// ```
pub struct Mutex<T: ?Sized> {
    inner: lock_api::Mutex<RawMutex, T>,
}

impl<T> Mutex<T> {
    /// A mutex named after its creation site.
    #[track_caller]
    pub fn new(value: T) -> Self {
        Self::from_raw(RawMutex::register(KIND, None, Location::caller(), false), value)
    }

    /// A mutex named `name` (1..=64 bytes; longer is cut, control characters
    /// become `?`, empty means "name after the creation site").
    #[track_caller]
    pub fn named(name: &str, value: T) -> Self {
        Self::from_raw(
            RawMutex::register(KIND, Some(name), Location::caller(), false),
            value,
        )
    }

    /// A mutex without an instance: nothing is observed. `const`, so it can
    /// initialise a `static`.
    pub const fn unobserved(value: T) -> Self {
        Self::from_raw(RawMutex::unobserved(false), value)
    }

    pub(crate) const fn from_raw(raw: RawMutex, value: T) -> Self {
        Self {
            inner: lock_api::Mutex::from_raw(raw, value),
        }
    }

    /// Consumes the mutex (unregistering its instance) and returns the data.
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Acquires the lock, blocking while another thread holds it. A wait
    /// is attributed to the caller's line ([`crate::site`]).
    #[inline]
    #[track_caller]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.raw().lock_at(Location::caller());
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_guard_unchecked() }
    }

    /// Acquires the lock if it is free.
    #[inline]
    #[track_caller]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        if self.raw().try_lock_at(Location::caller()) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_guard_unchecked() })
        } else {
            None
        }
    }

    /// Acquires the lock, waiting at most `timeout`.
    #[inline]
    #[track_caller]
    pub fn try_lock_for(&self, timeout: Duration) -> Option<MutexGuard<'_, T>> {
        let site = Location::caller();
        if self
            .raw()
            .try_lock_until_at(Instant::now().checked_add(timeout), site)
        {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_guard_unchecked() })
        } else {
            None
        }
    }

    /// Acquires the lock, waiting until `deadline` at most.
    #[inline]
    #[track_caller]
    pub fn try_lock_until(&self, deadline: Instant) -> Option<MutexGuard<'_, T>> {
        if self.raw().try_lock_until_at(Some(deadline), Location::caller()) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_guard_unchecked() })
        } else {
            None
        }
    }

    /// Whether the lock is held (a racy hint; not observed).
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.inner.is_locked()
    }

    /// The data, through exclusive access (no locking, not observed).
    #[inline]
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// A raw pointer to the data (see `lock_api::Mutex::data_ptr`).
    #[inline]
    pub fn data_ptr(&self) -> *mut T {
        self.inner.data_ptr()
    }

    /// Releases a lock whose guard was forgotten.
    ///
    /// # Safety
    ///
    /// The lock must be held by the current context through a forgotten
    /// guard (see `lock_api::Mutex::force_unlock`).
    #[inline]
    pub unsafe fn force_unlock(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.force_unlock() }
    }

    /// Releases a lock whose guard was forgotten, fairly.
    ///
    /// # Safety
    ///
    /// As for [`Mutex::force_unlock`].
    #[inline]
    pub unsafe fn force_unlock_fair(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.force_unlock_fair() }
    }

    /// A guard for a lock the current context already holds.
    ///
    /// # Safety
    ///
    /// The lock must be held (see `lock_api::Mutex::make_guard_unchecked`).
    #[inline]
    pub unsafe fn make_guard_unchecked(&self) -> MutexGuard<'_, T> {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.make_guard_unchecked() }
    }

    /// The underlying `lock_api` mutex.
    pub fn as_lock_api(&self) -> &lock_api::Mutex<RawMutex, T> {
        &self.inner
    }

    fn raw(&self) -> &RawMutex {
        // SAFETY: the raw lock is only used for its instance id, its policy
        // cache and acquisitions (`lock`, the `try_lock`s, the try-lock of
        // `Debug`) whose success is turned into a guard at once, so no
        // guard's view of the lock is invalidated.
        unsafe { self.inner.raw() }
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.raw().instance_id()
    }

    /// Re-reads the policy word now; returns it.
    pub fn refresh_policy(&self) -> PolicyWord {
        self.raw().refresh_policy()
    }
}

impl<T: Default> Default for Mutex<T> {
    #[track_caller]
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> From<T> for Mutex<T> {
    #[track_caller]
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    /// Like `parking_lot`'s, but without recording a `try_lock`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Mutex");
        if self.raw().try_lock_quiet() {
            // SAFETY: the quiet try-lock just acquired the lock; the guard
            // releases it (through the instrumented unlock, which records
            // nothing for a hold whose `pending` is `PENDING_QUIET`).
            let guard = unsafe { self.inner.make_guard_unchecked() };
            d.field("data", &&*guard);
        } else {
            d.field("data", &format_args!("<locked>"));
        }
        d.field("instance_id", &self.instance_id()).finish()
    }
}
