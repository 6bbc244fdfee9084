//! [`Condvar`]: a condition variable with observations.
//!
//! Kind code 3 (`condvar`). Ops: `wait` (1, latency = time blocked until
//! woken, M when a timed wait timed out), `notify_one` (2) and `notify_all`
//! (3), M when nobody was waiting. Waiting always blocks, so every wait
//! reads the clock; re-acquiring the mutex afterwards is observed by the
//! mutex (a `lock`, contended if it had to wait).
//!
//! Works with the guard of any `lock_api` mutex: [`Mutex`](super::Mutex),
//! [`AdaptiveMutex`](super::AdaptiveMutex) and `parking_lot::Mutex` alike.
//! Internally it is a `parking_lot::Condvar` over a private gate mutex: a
//! waiter registers and takes the gate *before* it releases the caller's
//! mutex, and a notifier takes the gate before notifying, so a notification
//! sent after the waiter released the caller's mutex cannot be lost. When
//! nobody waits a notify costs one atomic load (and the observation).
//! Spurious wakeups do not happen, but as with every condition variable,
//! re-check the condition (or use [`Condvar::wait_while`]).

use std::panic::Location;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_api::MutexGuard;

use super::{MISS, Registration};
use crate::clock;
use crate::registry::InstanceKind;

/// The kind [`Condvar`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 3,
    name: "condvar",
    ops: &["wait", "notify_one", "notify_all"],
};

/// Op kinds of [`Condvar`].
pub mod op {
    /// A wait (latency = time blocked; M = timed out).
    pub const WAIT: u16 = 1;
    /// `notify_one` (M = nobody waiting).
    pub const NOTIFY_ONE: u16 = 2;
    /// `notify_all` (M = nobody waiting).
    pub const NOTIFY_ALL: u16 = 3;
}

/// Whether a timed wait returned because its time ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// True if the wait timed out.
    pub fn timed_out(self) -> bool {
        self.0
    }
}

/// A condition variable (kind 3). See the [module docs](self).
///
/// ```
/// use std::sync::Arc;
/// use subetha_core::{Condvar, Mutex};
///
/// let pair = Arc::new((Mutex::named("ready_flag", false), Condvar::named("ready")));
/// let pair2 = Arc::clone(&pair);
/// std::thread::spawn(move || {
///     *pair2.0.lock() = true;
///     pair2.1.notify_one();
/// });
/// let mut ready = pair.0.lock();
/// pair.1.wait_while(&mut ready, |ready| !*ready);
/// ```
#[derive(Debug)]
pub struct Condvar {
    cv: parking_lot::Condvar,
    gate: parking_lot::Mutex<()>,
    waiters: AtomicUsize,
    registration: Registration,
}

impl Default for Condvar {
    #[track_caller]
    fn default() -> Self {
        Self::new()
    }
}

impl Condvar {
    /// A condition variable named after its creation site.
    #[track_caller]
    pub fn new() -> Self {
        Self::build(Registration::register(KIND, None, Location::caller()))
    }

    /// A condition variable named `name`.
    #[track_caller]
    pub fn named(name: &str) -> Self {
        Self::build(Registration::register(KIND, Some(name), Location::caller()))
    }

    /// A condition variable without an instance (nothing observed); `const`.
    pub const fn unobserved() -> Self {
        Self::build(Registration::NONE)
    }

    const fn build(registration: Registration) -> Self {
        Self {
            cv: parking_lot::Condvar::new(),
            gate: parking_lot::const_mutex(()),
            waiters: AtomicUsize::new(0),
            registration,
        }
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.registration.id()
    }

    /// Releases the guard's mutex, blocks until notified, re-acquires it.
    #[track_caller]
    pub fn wait<R: lock_api::RawMutex, T: ?Sized>(&self, guard: &mut MutexGuard<'_, R, T>) {
        self.wait_inner(guard, None, Location::caller());
    }

    /// [`Condvar::wait`] until `deadline` at most.
    #[track_caller]
    pub fn wait_until<R: lock_api::RawMutex, T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, R, T>,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        WaitTimeoutResult(self.wait_inner(guard, Some(deadline), Location::caller()))
    }

    /// [`Condvar::wait`] for `timeout` at most.
    #[track_caller]
    pub fn wait_for<R: lock_api::RawMutex, T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, R, T>,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        WaitTimeoutResult(self.wait_inner(guard, Instant::now().checked_add(timeout), Location::caller()))
    }

    /// Waits while `condition` holds (checked before each wait).
    #[track_caller]
    pub fn wait_while<R: lock_api::RawMutex, T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, R, T>,
        mut condition: impl FnMut(&mut T) -> bool,
    ) {
        while condition(&mut *guard) {
            self.wait(guard);
        }
    }

    /// [`Condvar::wait_while`] until `deadline` at most; timed out means the
    /// condition still held at the deadline.
    #[track_caller]
    pub fn wait_while_until<R: lock_api::RawMutex, T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, R, T>,
        mut condition: impl FnMut(&mut T) -> bool,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        while condition(&mut *guard) {
            if self.wait_until(guard, deadline).timed_out() {
                return WaitTimeoutResult(condition(&mut *guard));
            }
        }
        WaitTimeoutResult(false)
    }

    /// [`Condvar::wait_while`] for `timeout` at most.
    #[track_caller]
    pub fn wait_while_for<R: lock_api::RawMutex, T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, R, T>,
        condition: impl FnMut(&mut T) -> bool,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.wait_while_until(guard, condition, deadline),
            None => {
                self.wait_while(guard, condition);
                WaitTimeoutResult(false)
            }
        }
    }

    /// Wakes one waiter; true if there was one.
    pub fn notify_one(&self) -> bool {
        // SeqCst pairs with the waiter's increment: a waiter that released
        // its mutex before we looked is counted (see the module docs).
        let woke = self.waiters.load(Ordering::SeqCst) != 0 && {
            let _gate = self.gate.lock();
            self.cv.notify_one()
        };
        self.registration
            .emit(op::NOTIFY_ONE, if woke { 0 } else { MISS }, 0);
        woke
    }

    /// Wakes every waiter; returns how many.
    pub fn notify_all(&self) -> usize {
        let woke = if self.waiters.load(Ordering::SeqCst) == 0 {
            0
        } else {
            let _gate = self.gate.lock();
            self.cv.notify_all()
        };
        self.registration
            .emit(op::NOTIFY_ALL, if woke == 0 { MISS } else { 0 }, 0);
        woke
    }

    /// Returns whether the wait timed out.
    fn wait_inner<R: lock_api::RawMutex, T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, R, T>,
        deadline: Option<Instant>,
        site: &'static Location<'static>,
    ) -> bool {
        let start = clock::ticks();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        // Taken before the caller's mutex is released: a notifier that
        // changed the condition under that mutex must then wait for the
        // gate, which we hold until we are parked on `cv`.
        let mut gate = self.gate.lock();
        let (timed_out, woke) = MutexGuard::unlocked(guard, || {
            let timed_out = match deadline {
                None => {
                    self.cv.wait(&mut gate);
                    false
                }
                Some(deadline) => self.cv.wait_until(&mut gate, deadline).timed_out(),
            };
            let woke = clock::ticks();
            self.waiters.fetch_sub(1, Ordering::SeqCst);
            // Released before the caller's mutex is re-acquired: notifiers
            // take the gate while holding that mutex.
            drop(gate);
            (timed_out, woke)
        });
        // Every wait blocked: it carries its call site.
        self.registration.emit_at(
            op::WAIT,
            if timed_out { MISS } else { 0 },
            woke.saturating_sub(start).max(1),
            site,
        );
        timed_out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_support::{is_retired, op, unique, wait_for};
    use super::super::{Mutex, mutex};
    use super::*;

    #[test]
    fn a_blocked_waiter_records_its_wait_and_notifies_are_counted() {
        let name = unique("condvar-wait");
        let lock_name = unique("condvar-lock");
        let pair = Arc::new((Mutex::named(&lock_name, false), Condvar::named(&name)));
        // Nobody waiting yet: a miss.
        assert!(!pair.1.notify_one());
        assert_eq!(pair.1.notify_all(), 0);
        let waiter = {
            let pair = Arc::clone(&pair);
            std::thread::spawn(move || {
                let mut ready = pair.0.lock();
                while !*ready {
                    pair.1.wait(&mut ready);
                }
            })
        };
        // Wait until the waiter is parked.
        while pair.1.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        *pair.0.lock() = true;
        assert!(pair.1.notify_one());
        waiter.join().unwrap();
        // Ops from two threads' rings: wait for all of them.
        let r = wait_for(&name, |r| {
            op(r, op::WAIT).0 >= 1 && op(r, op::NOTIFY_ONE).0 >= 2 && op(r, op::NOTIFY_ALL).0 >= 1
        });
        assert_eq!(op(&r, op::WAIT), (1, 0, 0, 1));
        assert_eq!(op(&r, op::NOTIFY_ONE), (2, 0, 1, 0));
        assert_eq!(op(&r, op::NOTIFY_ALL), (1, 0, 1, 0));
        let waited = r.stats.op(op::WAIT).unwrap().latency().unwrap().max();
        assert!(crate::clock::calibration().ticks_to_ns(waited) >= 15_000_000);
        // The mutex saw the waiter's initial lock and its relock, and this
        // thread's lock: all three once it is dropped (uncontended `lock`s
        // are counted, and the last count comes with the drop).
        drop(pair);
        let m = wait_for(&lock_name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, mutex::op::LOCK).0 >= 3
        });
        assert_eq!(op(&m, mutex::op::LOCK).0, 3);
    }

    #[test]
    fn timed_waits_miss_and_notify_all_wakes_everyone() {
        let name = unique("condvar-all");
        let pair = Arc::new((parking_lot::Mutex::new(0u32), Condvar::named(&name)));
        {
            let mut g = pair.0.lock();
            let r = pair.1.wait_for(&mut g, Duration::from_millis(5));
            assert!(r.timed_out());
            let r = pair
                .1
                .wait_while_for(&mut g, |n| *n == 0, Duration::from_millis(2));
            assert!(r.timed_out());
        }
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let pair = Arc::clone(&pair);
                std::thread::spawn(move || {
                    let mut g = pair.0.lock();
                    pair.1.wait_while(&mut g, |go| *go == 0);
                })
            })
            .collect();
        while pair.1.waiters.load(Ordering::SeqCst) < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        *pair.0.lock() = 1;
        assert_eq!(pair.1.notify_all(), 3);
        for w in waiters {
            w.join().unwrap();
        }
        let r = wait_for(&name, |r| op(r, op::WAIT).0 >= 5);
        // Two timed out (misses with latency), three woken.
        assert_eq!(op(&r, op::WAIT), (5, 0, 2, 5));
        assert_eq!(op(&r, op::NOTIFY_ALL), (1, 0, 0, 0));
        let name_of_dropped = name.clone();
        drop(pair);
        wait_for(&name_of_dropped, |r| r.meta.retired_mono_ns.is_some());
        assert!(is_retired(&name_of_dropped));
    }
}
