//! [`RwLock`]: `parking_lot::RwLock` with observations.
//!
//! Its cost against `parking_lot::RwLock` is what the `rwlock` group of
//! `benches/primitives.rs` shows.
//!
//! Kind code 2 (`rwlock`). Ops: `read` (1), `try_read` (2), `write` (3),
//! `try_write` (4), `read_unlock` (5, sampled read hold), `write_unlock` (6,
//! sampled write hold), `upgrade` (7). See the [table](super#op-kinds).
//!
//! Built on [`lock_api`] with [`RawRwLock`] over [`parking_lot::RawRwLock`],
//! so recursive reads, upgradable reads, `upgrade`/`downgrade`, the fair
//! unlocks, the timed variants and guard mapping all work. Upgradable and
//! recursive reads count as `read`/`try_read`; an upgradable hold itself is
//! not sampled, a write hold reached through `upgrade` is.
//!
//! Uncontended `read`s and `write`s are counted, not pushed one by one
//! (see [`op_counts`](super::op_counts)): a count at the 1st, 2nd, 4th …
//! 64th, then every 64th, per thread stripe, and the rest when the lock is
//! dropped. Waits, `try_*`s and sampled holds are pushed one by one. (A push
//! per operation would have the sidecar drain an observation per operation,
//! CPU time it takes from the lock's threads on a small host: the `rwlock`
//! group's `…/mixed/{2,4}` rows of `benches/primitives.rs`.)
//!
//! Nothing is counted or pushed inside a read or write hold (a wait's end
//! is read off the clock in it, as the acquisition returns): an
//! uncontended one is counted after its release, one that waited, like a
//! `try_read`, a `try_write` or an upgrade, is pushed after it.
//! (Upgradable reads are pushed as they acquire.) A hold whose release
//! reports more than a count leaves a record in a per-thread table keyed
//! by the lock's address, one table for reads and one for writes, beside
//! a count of them, so the release of a hold that needs no record looks
//! at nothing but that thread-local count. Apart from the bias's changes
//! and a policy refresh at most once a millisecond, no acquisition or
//! release writes to the lock outside `parking_lot`'s word (see
//! [`RawRwLock`]). (Guards are not `Send`, as in `parking_lot`, so a hold
//! ends on the thread that began it. A guard leaked with `mem::forget`
//! leaves its record behind; a later lock at the same address would
//! report it once. A write lock released by another thread through
//! `force_unlock_write` is counted there as a plain `write`; a record it
//! had stays with the thread that took it, as a leaked guard's does.)
//! A read's release counts on the lock the thread last took shared,
//! remembered in a thread-local at the acquisition, not by reading the
//! lock again once it is let go: that read would pull the lock's cache
//! line back from the thread taking it next.
//!
//! Hold sampling is decided before the acquisition, as the
//! [`Mutex`](super::Mutex)'s is: a count that covers `k` uncontended
//! operations leaves its thread a draw of weight `k` (`sampling::HoldDraw`), and
//! the thread's next acquisition of an observed `RwLock` pays it (up to
//! 64 acquisitions of unobserved locks in between leave it be): sampled
//! with probability `k` / the lock's level, its clock read before the
//! atomic operation. So holds are sampled at the lock's level in
//! expectation, at random, the common acquisition reads one thread-local
//! and stores none, and nothing is decided inside the hold. A sampled hold
//! runs from that reading (or the end of its wait) to just after the
//! release. Levels finer than 1 in 64 are exact for a thread that keeps
//! taking the lock, lower (down to 1 in 64) for one that takes other
//! observed locks in between.
//! Acquisitions reported one by one (`try_*`, timed, waited, upgrades)
//! are not counted, so they bring no draws: they are sampled by the
//! thread's operation number as well, out of line, and re-read the policy
//! word every 1,024 of them, so a lock only ever taken that way still
//! follows its level.
//!
//! An observed lock is *reader-biased* most of the time (BRAVO; the
//! crate's private `reader_bias` module has the protocol): a `read` then
//! stores the lock's name into its thread's own reader slot instead of
//! adding to `parking_lot`'s lock word, so readers on different cores share no cache line, and a
//! writer, once it holds the word, clears the bias and waits for the
//! readers in slots to leave. A writer that had to wait for them reports
//! a contended `write` (or `upgrade`) with that wait; a `try_write` that
//! finds one misses. After a revocation the lock reads through its word
//! for a while, longer the sooner the bias was revoked again, so a lock
//! written often behaves like `parking_lot`'s. (The `rwlock` group's
//! `…/read/{2,4}` rows show what the bias gives readers, its `…/mixed` rows
//! what a lock also written keeps.) A thread holds at most one lock through
//! its slot (further holds of that lock count there, so a recursive read never
//! waits for a writer that waits for it); its holds of other locks go through
//! their words as before.
//!
//! An unobserved lock ([`RwLock::unobserved`], the raw `INIT`) is never
//! biased and reads no clock even when it waits; its blocking `read` and
//! `write` are `parking_lot`'s own.

use std::cell::Cell;
use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_api::{
    GuardNoSend, RawRwLock as _, RawRwLockFair as _, RawRwLockRecursive as _, RawRwLockTimed as _,
    RawRwLockUpgrade as _, RawRwLockUpgradeDowngrade as _, RawRwLockUpgradeTimed as _,
};

use super::held::{HoldRecord, Records, hold_records};
use super::op_counts::{BATCH, OpCounts};
use super::reader_bias::{self, BiasPolicy, RevokeWait};
use super::sampling::{HoldDraw, Sampler, next_thread_op};
use super::{CONTENDED, COUNT, MISS, PolicyWord, Registration, since};
use crate::clock;
use crate::registry::InstanceKind;
use crate::site::SiteWord;

/// The kind [`RwLock`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 2,
    name: "rwlock",
    ops: &[
        "read",
        "try_read",
        "write",
        "try_write",
        "read_unlock",
        "write_unlock",
        "upgrade",
    ],
};

/// Op kinds of [`RwLock`].
pub mod op {
    /// Blocking shared acquisition (also recursive and upgradable).
    pub const READ: u16 = 1;
    /// Non-blocking or timed shared acquisition.
    pub const TRY_READ: u16 = 2;
    /// Blocking exclusive acquisition.
    pub const WRITE: u16 = 3;
    /// Non-blocking or timed exclusive acquisition.
    pub const TRY_WRITE: u16 = 4;
    /// A sampled shared release; latency = hold time.
    pub const READ_UNLOCK: u16 = 5;
    /// A sampled exclusive release (or downgrade); latency = hold time.
    pub const WRITE_UNLOCK: u16 = 6;
    /// Upgradable → exclusive.
    pub const UPGRADE: u16 = 7;
}

mod hold;
mod lock_api_impls;
mod raw;
#[cfg(test)]
mod tests;

pub use raw::RawRwLock;

/// A shared guard of [`RwLock`].
pub type RwLockReadGuard<'a, T> = lock_api::RwLockReadGuard<'a, RawRwLock, T>;
/// An exclusive guard of [`RwLock`].
pub type RwLockWriteGuard<'a, T> = lock_api::RwLockWriteGuard<'a, RawRwLock, T>;
/// An upgradable shared guard of [`RwLock`].
pub type RwLockUpgradableReadGuard<'a, T> = lock_api::RwLockUpgradableReadGuard<'a, RawRwLock, T>;
/// A shared guard mapped to a part of the data.
pub type MappedRwLockReadGuard<'a, T> = lock_api::MappedRwLockReadGuard<'a, RawRwLock, T>;
/// An exclusive guard mapped to a part of the data.
pub type MappedRwLockWriteGuard<'a, T> = lock_api::MappedRwLockWriteGuard<'a, RawRwLock, T>;

/// A reader-writer lock, `parking_lot::RwLock` with observations (kind 2).
///
/// ```
/// use subetha_core::RwLock;
/// use subetha_core::primitives::RwLockUpgradableReadGuard;
///
/// let config = RwLock::named("config", String::from("v1"));
/// assert_eq!(config.read().as_str(), "v1");
/// let up = config.upgradable_read();
/// let mut w = RwLockUpgradableReadGuard::upgrade(up);
/// w.push('!');
/// drop(w);
/// assert_eq!(config.into_inner(), "v1!");
/// ```
pub struct RwLock<T: ?Sized> {
    inner: lock_api::RwLock<RawRwLock, T>,
}

impl<T> RwLock<T> {
    /// A lock named after its creation site.
    #[track_caller]
    pub fn new(value: T) -> Self {
        Self {
            inner: lock_api::RwLock::from_raw(RawRwLock::register(None, Location::caller()), value),
        }
    }

    /// A lock named `name`.
    #[track_caller]
    pub fn named(name: &str, value: T) -> Self {
        Self {
            inner: lock_api::RwLock::from_raw(RawRwLock::register(Some(name), Location::caller()), value),
        }
    }

    /// A lock without an instance (nothing observed); `const`.
    pub const fn unobserved(value: T) -> Self {
        Self {
            inner: lock_api::RwLock::from_raw(RawRwLock::unobserved(), value),
        }
    }

    /// Consumes the lock (unregistering its instance) and returns the data.
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, blocking while a writer holds the lock. A wait is attributed to the caller's line ([`crate::site`]).
    #[inline]
    #[track_caller]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        let raw = self.raw();
        lock_api::RawRwLock::lock_shared(raw);
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_read_guard_unchecked() }
    }

    /// Shared access if available now.
    #[inline]
    #[track_caller]
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLock::try_lock_shared(raw) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Shared access, waiting at most `timeout`.
    #[inline]
    #[track_caller]
    pub fn try_read_for(&self, timeout: Duration) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockTimed::try_lock_shared_for(raw, timeout) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Shared access, waiting until `deadline` at most.
    #[inline]
    #[track_caller]
    pub fn try_read_until(&self, deadline: Instant) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockTimed::try_lock_shared_until(raw, deadline) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Shared access that succeeds even with writers waiting, if this thread
    /// already reads (see `parking_lot::RwLock::read_recursive`).
    #[inline]
    #[track_caller]
    pub fn read_recursive(&self) -> RwLockReadGuard<'_, T> {
        let raw = self.raw();
        lock_api::RawRwLockRecursive::lock_shared_recursive(raw);
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_read_guard_unchecked() }
    }

    /// Non-blocking [`RwLock::read_recursive`].
    #[inline]
    #[track_caller]
    pub fn try_read_recursive(&self) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockRecursive::try_lock_shared_recursive(raw) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Timed [`RwLock::read_recursive`].
    #[inline]
    #[track_caller]
    pub fn try_read_recursive_for(&self, timeout: Duration) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockRecursiveTimed::try_lock_shared_recursive_for(raw, timeout) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Exclusive access, blocking while anyone holds the lock.
    #[inline]
    #[track_caller]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        let raw = self.raw();
        lock_api::RawRwLock::lock_exclusive(raw);
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_write_guard_unchecked() }
    }

    /// Exclusive access if available now.
    #[inline]
    #[track_caller]
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLock::try_lock_exclusive(raw) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_write_guard_unchecked() })
        } else {
            None
        }
    }

    /// Exclusive access, waiting at most `timeout`.
    #[inline]
    #[track_caller]
    pub fn try_write_for(&self, timeout: Duration) -> Option<RwLockWriteGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockTimed::try_lock_exclusive_for(raw, timeout) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_write_guard_unchecked() })
        } else {
            None
        }
    }

    /// Exclusive access, waiting until `deadline` at most.
    #[inline]
    #[track_caller]
    pub fn try_write_until(&self, deadline: Instant) -> Option<RwLockWriteGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockTimed::try_lock_exclusive_until(raw, deadline) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_write_guard_unchecked() })
        } else {
            None
        }
    }

    /// Upgradable shared access (one at a time; upgrade with
    /// [`RwLockUpgradableReadGuard::upgrade`], whose wait is attributed to
    /// `lock_api`'s line: the guard's methods are `lock_api`'s).
    #[inline]
    #[track_caller]
    pub fn upgradable_read(&self) -> RwLockUpgradableReadGuard<'_, T> {
        let raw = self.raw();
        lock_api::RawRwLockUpgrade::lock_upgradable(raw);
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_upgradable_guard_unchecked() }
    }

    /// Non-blocking [`RwLock::upgradable_read`].
    #[inline]
    #[track_caller]
    pub fn try_upgradable_read(&self) -> Option<RwLockUpgradableReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockUpgrade::try_lock_upgradable(raw) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_upgradable_guard_unchecked() })
        } else {
            None
        }
    }

    /// Timed [`RwLock::upgradable_read`].
    #[inline]
    #[track_caller]
    pub fn try_upgradable_read_for(&self, timeout: Duration) -> Option<RwLockUpgradableReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockUpgradeTimed::try_lock_upgradable_for(raw, timeout) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_upgradable_guard_unchecked() })
        } else {
            None
        }
    }

    /// Whether anyone holds the lock (racy hint, not observed).
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.inner.is_locked()
    }

    /// Whether a writer holds the lock (racy hint, not observed).
    #[inline]
    pub fn is_locked_exclusive(&self) -> bool {
        self.inner.is_locked_exclusive()
    }

    /// The data through exclusive access (no locking, not observed).
    #[inline]
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// A raw pointer to the data.
    #[inline]
    pub fn data_ptr(&self) -> *mut T {
        self.inner.data_ptr()
    }

    /// Releases a shared lock whose guard was forgotten.
    ///
    /// # Safety
    ///
    /// See `lock_api::RwLock::force_unlock_read`.
    #[inline]
    pub unsafe fn force_unlock_read(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.force_unlock_read() }
    }

    /// Releases an exclusive lock whose guard was forgotten.
    ///
    /// # Safety
    ///
    /// See `lock_api::RwLock::force_unlock_write`.
    #[inline]
    pub unsafe fn force_unlock_write(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.force_unlock_write() }
    }

    /// The underlying `lock_api` lock.
    pub fn as_lock_api(&self) -> &lock_api::RwLock<RawRwLock, T> {
        &self.inner
    }

    fn raw(&self) -> &RawRwLock {
        // SAFETY: the raw lock is used for its instance id, its policy
        // cache and acquisitions whose success is turned into a guard at
        // once, so no guard's view of the lock is invalidated.
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

impl<T: Default> Default for RwLock<T> {
    #[track_caller]
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> From<T> for RwLock<T> {
    #[track_caller]
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    /// Shows the data if no writer holds the lock; records nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RwLock");
        let raw = self.raw();
        if raw.inner.try_lock_shared() {
            // SAFETY: the shared lock was just acquired (unobserved) and is
            // released right below, also unobserved; no writer can exist.
            let data = unsafe { &*self.inner.data_ptr() };
            d.field("data", &data);
            // SAFETY: acquired just above.
            unsafe { raw.inner.unlock_shared() };
        } else {
            d.field("data", &format_args!("<locked>"));
        }
        d.field("instance_id", &self.instance_id()).finish()
    }
}
