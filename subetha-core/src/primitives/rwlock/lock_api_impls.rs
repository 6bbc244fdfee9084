//! The `lock_api` traits of [`RawRwLock`], each method
//! forwarding to the raw lock's own.

use super::raw::*;
use super::*;

// SAFETY: exclusion has two sources, and every path relies on one of them.
// (1) Holds through the lock word are `parking_lot::RawRwLock`'s: every
// method acquires or releases the word exactly as its own implementation
// would. (2) A shared hold taken through the thread's reader slot
// (`read_biased`, from `lock_shared`, `try_lock_shared` and the recursive and
// timed reads) never touches the word, so the word does not exclude writers
// from it; the bias revocation of `reader_bias` does. Every exclusive
// acquisition (`lock_exclusive`, `try_lock_exclusive`, the timed ones, every
// upgrade) takes the word exclusively and then, before it returns, clears
// the bias and waits until no reader slot names this lock
// (`exclude_biased_readers`), or gives the word back and fails without having
// entered (`excluded_or_given_back`, which may set the bias again first). A
// reader holds through its slot only if it saw the bias still set after
// publishing its slot (`reader_bias::enter`: the SeqCst handshake that
// `reader_bias::loom_tests::a_revoking_writer_never_overlaps_a_reader_inside`
// model-checks), and only a reader holding the word shared sets the bias
// (`rebias`), so never while a writer holds the lock. A thread already
// holding the lock through its slot may re-enter it without the check
// (`reenter`): the hold it extends is one a revoking writer waits for.
// `tests::a_writer_never_overlaps_a_biased_reader` checks the whole of it.
unsafe impl lock_api::RawRwLock for RawRwLock {
    /// An unobserved raw lock (no instance).
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = Self::unobserved();
    type GuardMarker = GuardNoSend;

    #[inline(always)]
    #[track_caller]
    fn lock_shared(&self) {
        // Unobserved: nothing to tell apart, so `parking_lot`'s own
        // acquisition, not a `try` first. (Its `try` retries at once a
        // compare-and-swap that lost to another reader's, where its `lock`
        // backs off first, which readers hammering the lock pay for: the
        // `rwlock` group's `unobserved/read/{2,4}` rows.)
        if self.observed.is_none() {
            self.remember_shared_hold();
            self.inner.lock_shared();
            return;
        }
        let ticket = self.ticket();
        // Remembered before the hold: between the acquisition's atomic
        // operation and the release's, the other reader's next attempt
        // can take the lock word's line away, and the release waits for
        // it back.
        let counts = self.remember_shared_hold();
        if self.read_biased(counts) {
            self.leave_read_record(op::READ, 0, 0, ticket, 0);
        } else if self.inner.try_lock_shared() {
            self.rebias_if_due(ticket);
            self.leave_read_record(op::READ, 0, 0, ticket, 0);
        } else {
            self.wait_for(op::READ, false, ticket, |inner| inner.lock_shared());
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_shared(&self) -> bool {
        let ticket = Ticket::REPORTED;
        let acquired = self.read_biased(self.counts_ptr()) || self.inner.try_lock_shared();
        self.try_shared(op::TRY_READ, ticket, acquired)
    }

    #[inline(always)]
    unsafe fn unlock_shared(&self) {
        // SAFETY: forwarded: the caller holds a shared lock.
        unsafe { self.end_read_hold(false) }
    }

    #[inline(always)]
    #[track_caller]
    fn lock_exclusive(&self) {
        // Nothing of the lock is read before the compare-and-swap: a load of
        // its line there costs the swap its exclusive ownership, as the
        // `Mutex`'s does (the `rwlock` group's `…/mixed/2` rows).
        let ticket = self.ticket();
        if self.inner.try_lock_exclusive() {
            // An unobserved lock is never biased and reports nothing.
            if self.observed.is_some() {
                self.exclude_then_report(op::WRITE, ticket);
            }
        } else {
            self.wait_for(op::WRITE, true, ticket, |_| {
                self.exclusive_then_exclude(|inner| inner.lock_exclusive());
            });
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_exclusive(&self) -> bool {
        let ticket = Ticket::REPORTED;
        self.try_exclusive(op::TRY_WRITE, ticket, self.try_write_now())
    }

    #[inline(always)]
    unsafe fn unlock_exclusive(&self) {
        // SAFETY: the caller holds the exclusive lock, which the closure
        // releases.
        unsafe { self.end_write_hold(|inner| inner.unlock_exclusive()) }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.inner.is_locked()
            || (self.bias.load(Ordering::Relaxed) && reader_bias::any_reader_of(self.counts_ptr().addr()))
    }

    #[inline]
    fn is_locked_exclusive(&self) -> bool {
        self.inner.is_locked_exclusive()
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockFair for RawRwLock {
    #[inline]
    unsafe fn unlock_shared_fair(&self) {
        // SAFETY: forwarded: the caller holds a shared lock.
        unsafe { self.end_read_hold(true) }
    }

    #[inline]
    unsafe fn unlock_exclusive_fair(&self) {
        // SAFETY: the caller holds the exclusive lock, which the closure
        // releases.
        unsafe { self.end_write_hold(|inner| inner.unlock_exclusive_fair()) }
    }

    /// The hold's record (on this thread) stays with it. A hold through
    /// the thread's reader slot yields only to a writer revoking the bias,
    /// and only if it is the thread's one hold there: it leaves the slot
    /// and waits on the word.
    #[inline]
    unsafe fn bump_shared(&self) {
        let counts = self.counts_ptr();
        if !counts.is_null() && reader_bias::holds(counts.addr()) {
            // Recursive: if this thread also holds the word, a writer
            // waiting for it must not hold this one up.
            if !self.bias.load(Ordering::Relaxed) && reader_bias::leave_last(counts.addr()) {
                self.inner.lock_shared_recursive();
            }
            return;
        }
        // SAFETY: forwarded: the caller holds a shared lock, through the
        // word.
        unsafe { self.inner.bump_shared() }
    }

    #[inline]
    unsafe fn bump_exclusive(&self) {
        // The hold goes on: its record, if any, stays on this thread.
        // SAFETY: forwarded: the caller holds the exclusive lock.
        unsafe { self.inner.bump_exclusive() }
        // A reader may have biased the lock while it was let go.
        let excluded = self.exclude_biased_readers(Revocation::Wait);
        debug_assert!(excluded.is_ok(), "a waiting revocation gave up");
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockDowngrade for RawRwLock {
    #[inline]
    unsafe fn downgrade(&self) {
        // SAFETY: the caller holds the exclusive lock, which the closure
        // turns into a shared one.
        unsafe { self.end_write_hold(|inner| inner.downgrade()) }
        self.downgraded_to_shared();
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockTimed for RawRwLock {
    type Duration = Duration;
    type Instant = Instant;

    #[inline]
    #[track_caller]
    fn try_lock_shared_for(&self, timeout: Duration) -> bool {
        let ticket = Ticket::REPORTED;
        if self.read_biased(self.counts_ptr()) || self.inner.try_lock_shared() {
            return self.try_shared(op::TRY_READ, ticket, true);
        }
        self.timed(op::TRY_READ, false, ticket, |inner| {
            inner.try_lock_shared_for(timeout)
        })
    }

    #[inline]
    #[track_caller]
    fn try_lock_shared_until(&self, timeout: Instant) -> bool {
        let ticket = Ticket::REPORTED;
        if self.read_biased(self.counts_ptr()) || self.inner.try_lock_shared() {
            return self.try_shared(op::TRY_READ, ticket, true);
        }
        self.timed(op::TRY_READ, false, ticket, |inner| {
            inner.try_lock_shared_until(timeout)
        })
    }

    #[inline]
    #[track_caller]
    fn try_lock_exclusive_for(&self, timeout: Duration) -> bool {
        let ticket = Ticket::REPORTED;
        if self.try_write_now() {
            return self.try_exclusive(op::TRY_WRITE, ticket, true);
        }
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.write_until(ticket, deadline),
            None => self.timed(op::TRY_WRITE, true, ticket, |_| {
                self.exclusive_then_exclude(|inner| inner.lock_exclusive());
                true
            }),
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_exclusive_until(&self, timeout: Instant) -> bool {
        let ticket = Ticket::REPORTED;
        if self.try_write_now() {
            return self.try_exclusive(op::TRY_WRITE, ticket, true);
        }
        self.write_until(ticket, timeout)
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockRecursive for RawRwLock {
    #[inline]
    #[track_caller]
    fn lock_shared_recursive(&self) {
        let ticket = self.ticket();
        // Remembered before the hold: between the acquisition's atomic
        // operation and the release's, the other reader's next attempt
        // can take the lock word's line away, and the release waits for
        // it back.
        let counts = self.remember_shared_hold();
        if self.read_biased_recursive(counts) {
            self.leave_read_record(op::READ, 0, 0, ticket, 0);
        } else if self.inner.try_lock_shared_recursive() {
            self.rebias_if_due(ticket);
            self.leave_read_record(op::READ, 0, 0, ticket, 0);
        } else {
            self.wait_for(op::READ, false, ticket, |inner| inner.lock_shared_recursive());
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_shared_recursive(&self) -> bool {
        let ticket = Ticket::REPORTED;
        let acquired =
            self.read_biased_recursive(self.counts_ptr()) || self.inner.try_lock_shared_recursive();
        self.try_shared(op::TRY_READ, ticket, acquired)
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockRecursiveTimed for RawRwLock {
    #[inline]
    #[track_caller]
    fn try_lock_shared_recursive_for(&self, timeout: Duration) -> bool {
        let ticket = Ticket::REPORTED;
        if self.read_biased_recursive(self.counts_ptr()) || self.inner.try_lock_shared_recursive() {
            return self.try_shared(op::TRY_READ, ticket, true);
        }
        self.timed(op::TRY_READ, false, ticket, |inner| {
            inner.try_lock_shared_recursive_for(timeout)
        })
    }

    #[inline]
    #[track_caller]
    fn try_lock_shared_recursive_until(&self, timeout: Instant) -> bool {
        let ticket = Ticket::REPORTED;
        if self.read_biased_recursive(self.counts_ptr()) || self.inner.try_lock_shared_recursive() {
            return self.try_shared(op::TRY_READ, ticket, true);
        }
        self.timed(op::TRY_READ, false, ticket, |inner| {
            inner.try_lock_shared_recursive_until(timeout)
        })
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockUpgrade for RawRwLock {
    /// Pushed at once, in the hold: an upgradable hold is rarer than a
    /// read, and its release is not a read unlock.
    #[inline]
    #[track_caller]
    fn lock_upgradable(&self) {
        if self.inner.try_lock_upgradable() {
            self.registration.emit(op::READ, 0, 0);
        } else {
            let site = Location::caller();
            let start = clock::ticks();
            self.inner.lock_upgradable();
            self.registration.emit_at(op::READ, CONTENDED, since(start), site);
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_upgradable(&self) -> bool {
        let acquired = self.inner.try_lock_upgradable();
        if acquired {
            self.registration.emit(op::TRY_READ, 0, 0);
        } else {
            self.registration
                .emit_at(op::TRY_READ, MISS, 0, Location::caller());
        }
        acquired
    }

    #[inline]
    unsafe fn unlock_upgradable(&self) {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.inner.unlock_upgradable() }
    }

    #[inline]
    #[track_caller]
    unsafe fn upgrade(&self) {
        let ticket = Ticket::REPORTED;
        // SAFETY: forwarded: the caller holds an upgradable lock.
        if unsafe { self.inner.try_upgrade() } {
            self.exclude_then_report(op::UPGRADE, ticket);
        } else {
            self.wait_for(op::UPGRADE, true, ticket, |_| {
                // SAFETY: forwarded: the caller holds an upgradable lock.
                self.exclusive_then_exclude(|inner| unsafe { inner.upgrade() });
            });
        }
    }

    #[inline]
    #[track_caller]
    unsafe fn try_upgrade(&self) -> bool {
        let ticket = Ticket::REPORTED;
        // SAFETY: forwarded: the caller holds an upgradable lock; a
        // successful `try_upgrade` holds the word exclusively.
        let upgraded =
            unsafe { self.inner.try_upgrade() && self.excluded_or_given_back(Revocation::Now, true) };
        self.try_exclusive(op::UPGRADE, ticket, upgraded)
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockUpgradeFair for RawRwLock {
    #[inline]
    unsafe fn unlock_upgradable_fair(&self) {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.inner.unlock_upgradable_fair() }
    }

    #[inline]
    unsafe fn bump_upgradable(&self) {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.inner.bump_upgradable() }
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockUpgradeDowngrade for RawRwLock {
    #[inline]
    unsafe fn downgrade_upgradable(&self) {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.inner.downgrade_upgradable() }
        self.downgraded_to_shared();
    }

    #[inline]
    unsafe fn downgrade_to_upgradable(&self) {
        // SAFETY: the caller holds the exclusive lock, which the closure
        // turns into an upgradable one.
        unsafe { self.end_write_hold(|inner| inner.downgrade_to_upgradable()) }
    }
}

// SAFETY: as for `lock_api::RawRwLock` above: word holds are
// `parking_lot::RawRwLock`'s, and biased shared holds are excluded by the
// revocation every exclusive path runs before it returns.
unsafe impl lock_api::RawRwLockUpgradeTimed for RawRwLock {
    #[inline]
    #[track_caller]
    fn try_lock_upgradable_for(&self, timeout: Duration) -> bool {
        if self.inner.try_lock_upgradable() {
            self.registration.emit(op::TRY_READ, 0, 0);
            return true;
        }
        let start = clock::ticks();
        let acquired = self.inner.try_lock_upgradable_for(timeout);
        let flags = if acquired { CONTENDED } else { CONTENDED | MISS };
        self.registration
            .emit_at(op::TRY_READ, flags, since(start), Location::caller());
        acquired
    }

    #[inline]
    #[track_caller]
    fn try_lock_upgradable_until(&self, timeout: Instant) -> bool {
        if self.inner.try_lock_upgradable() {
            self.registration.emit(op::TRY_READ, 0, 0);
            return true;
        }
        let start = clock::ticks();
        let acquired = self.inner.try_lock_upgradable_until(timeout);
        let flags = if acquired { CONTENDED } else { CONTENDED | MISS };
        self.registration
            .emit_at(op::TRY_READ, flags, since(start), Location::caller());
        acquired
    }

    #[inline]
    #[track_caller]
    unsafe fn try_upgrade_for(&self, timeout: Duration) -> bool {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.upgrade_until(Instant::now().checked_add(timeout)) }
    }

    #[inline]
    #[track_caller]
    unsafe fn try_upgrade_until(&self, timeout: Instant) -> bool {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.upgrade_until(Some(timeout)) }
    }
}
