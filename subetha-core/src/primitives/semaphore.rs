//! [`Semaphore`]: a counting semaphore with observations.
//!
//! Kind code 4 (`semaphore`). Ops: `acquire` (1, C + wait when it had to
//! wait), `try_acquire` (2, M when no permit was free; the timed variant
//! sets C and records the wait, M when it timed out), `release` (3, sampled
//! permit hold time: from acquisition to the [`SemaphorePermit`]'s drop),
//! `add_permits` (4).
//!
//! The permit count is one atomic: taking a free permit is one
//! compare-and-swap, returning one is a `fetch_add` plus a load of the
//! waiter count. Only a thread that finds no permit takes a timestamp and
//! parks on a `parking_lot` condition variable; a release wakes one parked
//! thread when any is registered (the waiter registers, then re-checks the
//! count, both sequentially consistent, so a release cannot slip between the
//! check and the park).

use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::sampling::{Sampler, next_thread_op};
use super::{CONTENDED, MISS, PolicyWord, Registration, since};
use crate::clock;
use crate::registry::InstanceKind;
use crate::site::SiteWord;

/// The kind [`Semaphore`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 4,
    name: "semaphore",
    ops: &["acquire", "try_acquire", "release", "add_permits"],
};

/// Op kinds of [`Semaphore`].
pub mod op {
    /// Blocking acquisition.
    pub const ACQUIRE: u16 = 1;
    /// Non-blocking or timed acquisition.
    pub const TRY_ACQUIRE: u16 = 2;
    /// A sampled release; latency = how long the permit was held.
    pub const RELEASE: u16 = 3;
    /// Permits added without a permit guard.
    pub const ADD_PERMITS: u16 = 4;
}

/// A counting semaphore (kind 4).
///
/// ```
/// use subetha_core::Semaphore;
///
/// let slots = Semaphore::named("upload_slots", 2);
/// let a = slots.acquire();
/// let b = slots.try_acquire().expect("second permit");
/// assert!(slots.try_acquire().is_none());
/// drop((a, b));
/// assert_eq!(slots.available_permits(), 2);
/// ```
pub struct Semaphore {
    permits: AtomicUsize,
    waiters: AtomicUsize,
    gate: parking_lot::Mutex<()>,
    cv: parking_lot::Condvar,
    sampler: Sampler,
    registration: Registration,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("permits", &self.available_permits())
            .field("instance_id", &self.registration.id())
            .finish()
    }
}

/// A permit of a [`Semaphore`]; returned to it on drop.
#[must_use = "dropping the permit returns it at once"]
pub struct SemaphorePermit<'a> {
    semaphore: &'a Semaphore,
    /// Ticks at acquisition when this hold is sampled, else 0.
    hold_start: u64,
}

impl fmt::Debug for SemaphorePermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit").finish_non_exhaustive()
    }
}

impl SemaphorePermit<'_> {
    /// Keeps the permit taken for good (it is not returned).
    pub fn forget(self) {
        std::mem::forget(self);
    }
}

impl Drop for SemaphorePermit<'_> {
    fn drop(&mut self) {
        self.semaphore.release_one();
        if self.hold_start != 0 {
            self.semaphore
                .registration
                .emit(op::RELEASE, 0, since(self.hold_start));
        }
    }
}

impl Semaphore {
    /// A semaphore with `permits` free permits, named after its creation site.
    #[track_caller]
    pub fn new(permits: usize) -> Self {
        Self::build(permits, Registration::register(KIND, None, Location::caller()))
    }

    /// A semaphore named `name`.
    #[track_caller]
    pub fn named(name: &str, permits: usize) -> Self {
        Self::build(
            permits,
            Registration::register(KIND, Some(name), Location::caller()),
        )
    }

    /// A semaphore without an instance (nothing observed); `const`.
    pub const fn unobserved(permits: usize) -> Self {
        Self {
            permits: AtomicUsize::new(permits),
            waiters: AtomicUsize::new(0),
            gate: parking_lot::const_mutex(()),
            cv: parking_lot::Condvar::new(),
            sampler: Sampler::new(),
            registration: Registration::NONE,
        }
    }

    fn build(permits: usize, registration: Registration) -> Self {
        let s = Self {
            registration,
            ..Self::unobserved(permits)
        };
        s.refresh_policy();
        s
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.registration.id()
    }

    /// Re-reads the policy word now; returns it.
    pub fn refresh_policy(&self) -> PolicyWord {
        let word = self.registration.policy_word();
        self.sampler.apply(word);
        word
    }

    /// Permits free right now.
    pub fn available_permits(&self) -> usize {
        self.permits.load(Ordering::Relaxed)
    }

    /// Takes a permit, blocking until one is free.
    #[inline]
    #[track_caller]
    pub fn acquire(&self) -> SemaphorePermit<'_> {
        if self.take(Ordering::Acquire) {
            return self.permit(op::ACQUIRE, 0, 0, 0);
        }
        self.acquire_slow(op::ACQUIRE, None, Location::caller())
            .expect("an untimed acquisition always succeeds")
    }

    /// Takes a permit if one is free.
    #[inline]
    #[track_caller]
    pub fn try_acquire(&self) -> Option<SemaphorePermit<'_>> {
        if self.take(Ordering::Acquire) {
            Some(self.permit(op::TRY_ACQUIRE, 0, 0, 0))
        } else {
            self.registration
                .emit_at(op::TRY_ACQUIRE, MISS, 0, Location::caller());
            None
        }
    }

    /// Takes a permit, waiting at most `timeout`.
    #[track_caller]
    pub fn try_acquire_for(&self, timeout: Duration) -> Option<SemaphorePermit<'_>> {
        if self.take(Ordering::Acquire) {
            return Some(self.permit(op::TRY_ACQUIRE, 0, 0, 0));
        }
        self.acquire_slow(
            op::TRY_ACQUIRE,
            Some(Instant::now().checked_add(timeout)),
            Location::caller(),
        )
    }

    /// Takes a permit, waiting until `deadline` at most.
    #[track_caller]
    pub fn try_acquire_until(&self, deadline: Instant) -> Option<SemaphorePermit<'_>> {
        if self.take(Ordering::Acquire) {
            return Some(self.permit(op::TRY_ACQUIRE, 0, 0, 0));
        }
        self.acquire_slow(op::TRY_ACQUIRE, Some(Some(deadline)), Location::caller())
    }

    /// Adds `n` permits (e.g. to hand out ones taken with
    /// [`SemaphorePermit::forget`]).
    pub fn add_permits(&self, n: usize) {
        self.permits.fetch_add(n, Ordering::SeqCst);
        self.wake(n);
        self.registration.emit(op::ADD_PERMITS, 0, 0);
    }

    /// Takes a free permit, if any.
    #[inline]
    fn take(&self, success: Ordering) -> bool {
        let mut current = self.permits.load(Ordering::Relaxed);
        while current != 0 {
            match self
                .permits
                .compare_exchange_weak(current, current - 1, success, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
        false
    }

    #[inline(always)]
    fn permit(&self, op: u16, flags: u16, latency: u64, now: u64) -> SemaphorePermit<'_> {
        self.permit_sites(op, flags, latency, now, SiteWord::NONE)
    }

    /// [`permit`](Self::permit) of an acquisition carrying call sites.
    #[inline(always)]
    fn permit_sites(
        &self,
        op: u16,
        flags: u16,
        latency: u64,
        now: u64,
        sites: SiteWord,
    ) -> SemaphorePermit<'_> {
        self.registration.emitter().emit_sites(op, flags, latency, sites);
        let n = next_thread_op();
        let mut hold_start = 0;
        if n & self.sampler.check_mask() == 0 {
            hold_start = self.sampler.bookkeeping(&self.registration, n, now);
        }
        SemaphorePermit {
            semaphore: self,
            hold_start,
        }
    }

    /// Parks until a permit is taken or `deadline` (`Some(None)`: a timeout
    /// too far away to represent, i.e. none) passes.
    #[cold]
    #[inline(never)]
    fn acquire_slow(
        &self,
        op: u16,
        deadline: Option<Option<Instant>>,
        site: &'static Location<'static>,
    ) -> Option<SemaphorePermit<'_>> {
        let sites = SiteWord::own(self.registration.site_id(site));
        let start = clock::ticks();
        if self.sampler.slow_path_due(start) {
            self.refresh_policy();
        }
        let deadline = deadline.flatten();
        let mut gate = self.gate.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let acquired = loop {
            // SeqCst: with the increment above and the releaser's
            // `fetch_add` + `waiters` load, one of the two sees the other.
            if self.take(Ordering::SeqCst) {
                break true;
            }
            match deadline {
                None => self.cv.wait(&mut gate),
                Some(deadline) => {
                    if self.cv.wait_until(&mut gate, deadline).timed_out() {
                        break self.take(Ordering::SeqCst);
                    }
                }
            }
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(gate);
        let now = clock::ticks();
        let waited = now.saturating_sub(start).max(1);
        if acquired {
            Some(self.permit_sites(op, CONTENDED, waited, now, sites))
        } else {
            self.registration
                .emitter()
                .emit_sites(op, CONTENDED | MISS, waited, sites);
            None
        }
    }

    fn release_one(&self) {
        self.permits.fetch_add(1, Ordering::SeqCst);
        self.wake(1);
    }

    #[inline]
    fn wake(&self, n: usize) {
        if self.waiters.load(Ordering::SeqCst) != 0 {
            self.wake_slow(n);
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_slow(&self, n: usize) {
        let _gate = self.gate.lock();
        if n == 1 {
            self.cv.notify_one();
        } else {
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_support::{op, unique, wait_for};
    use super::super::{policy_word, set_policy_word};
    use super::*;

    #[test]
    fn permits_misses_and_blocked_acquirers() {
        let name = unique("semaphore");
        let s = Arc::new(Semaphore::named(&name, 1));
        assert!(set_policy_word(
            s.instance_id().unwrap(),
            PolicyWord::default().with_sample_every(1)
        ));
        s.refresh_policy();
        let held = s.acquire();
        assert!(s.try_acquire().is_none());
        assert!(s.try_acquire_for(Duration::from_millis(2)).is_none());
        let waiter = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || drop(s.acquire()))
        };
        while s.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        waiter.join().unwrap();
        let p = s.acquire();
        p.forget();
        assert_eq!(s.available_permits(), 0);
        s.add_permits(1);
        assert_eq!(s.available_permits(), 1);
        // The three acquires come from two threads' rings: wait for all of
        // them (a lost one times out here), not just the latest op.
        let r = wait_for(&name, |r| {
            op(r, op::ADD_PERMITS).0 >= 1 && op(r, op::ACQUIRE).0 >= 3
        });
        assert_eq!(op(&r, op::ACQUIRE), (3, 1, 0, 1));
        assert_eq!(op(&r, op::TRY_ACQUIRE), (2, 1, 2, 1));
        // Every hold sampled: the first permit and the waiter's (the
        // forgotten one is never released).
        assert_eq!(op(&r, op::RELEASE), (2, 0, 0, 2));
        let waited = r.stats.op(op::ACQUIRE).unwrap().latency().unwrap().max();
        assert!(crate::clock::calibration().ticks_to_ns(waited) >= 15_000_000);
        let id = s.instance_id().unwrap();
        drop(s);
        assert_eq!(policy_word(id), None);
        wait_for(&name, |r| r.meta.retired_mono_ns.is_some());
    }

    /// A consumer policy that recognises the test's semaphore by a mark in
    /// its statistics (how many `add_permits` it made) and sets its
    /// sampling: every hold at mark 37, none at mark 38.
    struct MarkPolicy;

    impl crate::Policy for MarkPolicy {
        fn applies_to(&self, kind: u16) -> bool {
            kind == KIND.code
        }

        fn decide(&mut self, stats: &crate::InstanceStats, current: u32) -> Option<u32> {
            let word = PolicyWord(current);
            match stats.op(op::ADD_PERMITS).map_or(0, |o| o.ops()) {
                37 => Some(word.with_sample_every(1).0),
                38 => Some(word.with_sample_every(0).0),
                _ => None,
            }
        }
    }

    /// `n` acquire/release pairs in ring-sized chunks, each drained.
    fn cycle(s: &Semaphore, name: &str, n: u64) -> crate::drain::InstanceRecord {
        let mut record = wait_for(name, |_| true);
        for _ in 0..n.div_ceil(1000) {
            let before = op(&record, op::ACQUIRE).0;
            for _ in 0..1000 {
                drop(s.acquire());
            }
            record = wait_for(name, |r| op(r, op::ACQUIRE).0 >= before + 1000);
        }
        record
    }

    #[test]
    fn a_consumer_policy_changes_sampling_at_runtime() {
        super::super::test_support::init();
        let sidecar = crate::process_sidecar().expect("sidecar");
        sidecar.add_policy(MarkPolicy);
        let name = unique("semaphore-policy");
        let s = Semaphore::named(&name, 1);
        let id = s.instance_id().unwrap();
        // Mark 37: the consumer raises sampling to every hold.
        s.add_permits(37);
        for _ in 0..36 {
            s.add_permits(0);
        }
        wait_for(&name, |r| op(r, op::ADD_PERMITS).0 == 37);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while PolicyWord(policy_word(id).unwrap()).sample_shift() != Some(0) {
            assert!(std::time::Instant::now() < deadline, "the policy never ran");
            std::thread::sleep(Duration::from_millis(2));
        }
        // Picked up within 1024 operations of this thread.
        let r = cycle(&s, &name, 2000);
        let sampled = op(&r, op::RELEASE).0;
        assert!(sampled >= 900, "only {sampled} holds sampled");
        // Mark 38: the consumer turns sampling off.
        s.add_permits(0);
        wait_for(&name, |r| op(r, op::ADD_PERMITS).0 == 38);
        while PolicyWord(policy_word(id).unwrap()).sample_shift().is_some() {
            assert!(std::time::Instant::now() < deadline, "the policy never ran");
            std::thread::sleep(Duration::from_millis(2));
        }
        let settled = cycle(&s, &name, 2000);
        let r = cycle(&s, &name, 3000);
        assert_eq!(op(&r, op::RELEASE).0, op(&settled, op::RELEASE).0);
    }

    #[test]
    fn no_lost_wakeups_under_churn() {
        let s = Arc::new(Semaphore::named(&unique("semaphore-churn"), 2));
        let total = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (s, total) = (Arc::clone(&s), Arc::clone(&total));
                std::thread::spawn(move || {
                    for _ in 0..5_000 {
                        let _p = s.acquire();
                        total.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(total.load(Ordering::Relaxed), 20_000);
        assert_eq!(s.available_permits(), 2);
    }
}
