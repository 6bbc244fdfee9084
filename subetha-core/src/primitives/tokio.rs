//! Async variants over `tokio::sync` (feature `tokio`): [`AsyncMutex`]
//! (kind 8), [`AsyncRwLock`] (kind 9) and [`AsyncSemaphore`] (kind 10).
//!
//! Op kinds and flags are those of their blocking counterparts
//! ([table](super#op-kinds)): the fast path is tokio's `try_*`, and only
//! when it fails is the clock read and the acquisition awaited; the
//! recorded wait is wall time from the first attempt to acquisition, so it
//! includes the task's scheduling delay. Guards are this module's own
//! wrappers (dereferencing to the data) so that they can carry a sampled
//! hold's start; a sampled hold is recorded as the guard drops, just before
//! tokio releases the lock. Tokio's locks are fair (FIFO) and never
//! poisoned; a guard may be held across `.await` and dropped on another
//! worker thread.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::panic::Location;

use super::sampling::{Sampler, next_thread_op};
use super::{CONTENDED, MISS, PolicyWord, Registration, since};
use super::{mutex, rwlock, semaphore};
use crate::clock;
use crate::registry::InstanceKind;

/// The kind [`AsyncMutex`] registers (ops as [`Mutex`](super::Mutex)).
pub const ASYNC_MUTEX_KIND: InstanceKind = InstanceKind {
    code: 8,
    name: "async_mutex",
    ops: mutex::KIND.ops,
};

/// The kind [`AsyncRwLock`] registers (ops as [`RwLock`](super::RwLock),
/// without `upgrade`).
pub const ASYNC_RWLOCK_KIND: InstanceKind = InstanceKind {
    code: 9,
    name: "async_rwlock",
    ops: &[
        "read",
        "try_read",
        "write",
        "try_write",
        "read_unlock",
        "write_unlock",
    ],
};

/// The kind [`AsyncSemaphore`] registers (ops as
/// [`Semaphore`](super::Semaphore)).
pub const ASYNC_SEMAPHORE_KIND: InstanceKind = InstanceKind {
    code: 10,
    name: "async_semaphore",
    ops: semaphore::KIND.ops,
};

/// What the three async primitives share: the registration and the sampling cache.
#[derive(Debug)]
struct Common {
    registration: Registration,
    sampler: Sampler,
}

impl Common {
    fn register(kind: InstanceKind, name: Option<&str>, site: &'static Location<'static>) -> Self {
        let common = Self {
            registration: Registration::register(kind, name, site),
            sampler: Sampler::new(),
        };
        common.refresh_policy();
        common
    }

    fn refresh_policy(&self) -> PolicyWord {
        let word = self.registration.policy_word();
        self.sampler.apply(word);
        word
    }

    /// Emits an acquisition and decides whether its hold is sampled;
    /// returns the hold's start (0 = not sampled).
    #[inline(always)]
    fn acquired(&self, op: u16, flags: u16, latency: u64, now: u64) -> u64 {
        self.registration.emit(op, flags, latency);
        let n = next_thread_op();
        if n & self.sampler.check_mask() == 0 {
            self.sampler.bookkeeping(&self.registration, n, now)
        } else {
            0
        }
    }

    /// [`acquired`](Self::acquired) of an acquisition that waited, called
    /// at `site` (carried by its observation).
    #[cold]
    fn acquired_waited(&self, op: u16, latency: u64, now: u64, site: &'static Location<'static>) -> u64 {
        self.registration.emit_at(op, CONTENDED, latency, site);
        let n = next_thread_op();
        if n & self.sampler.check_mask() == 0 {
            self.sampler.bookkeeping(&self.registration, n, now)
        } else {
            0
        }
    }

    fn released(&self, op: u16, hold_start: u64) {
        if hold_start != 0 {
            self.registration.emit(op, 0, since(hold_start));
        }
    }

    /// The contended path's bookkeeping around an awaited acquisition.
    fn start_wait(&self) -> u64 {
        let start = clock::ticks();
        if self.sampler.slow_path_due(start) {
            self.refresh_policy();
        }
        start
    }
}

// ---------------------------------------------------------------------------

/// `tokio::sync::Mutex` with observations (kind 8).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use subetha_core::primitives::tokio::AsyncMutex;
///
/// let sessions = AsyncMutex::named("sessions", 0u32);
/// *sessions.lock().await += 1;
/// assert_eq!(sessions.into_inner(), 1);
/// # });
/// ```
pub struct AsyncMutex<T: ?Sized> {
    common: Common,
    inner: tokio::sync::Mutex<T>,
}

/// A guard of [`AsyncMutex`].
pub struct AsyncMutexGuard<'a, T: ?Sized> {
    common: &'a Common,
    hold_start: u64,
    guard: tokio::sync::MutexGuard<'a, T>,
}

impl<T> AsyncMutex<T> {
    /// A mutex named after its creation site.
    #[track_caller]
    pub fn new(value: T) -> Self {
        Self {
            common: Common::register(ASYNC_MUTEX_KIND, None, Location::caller()),
            inner: tokio::sync::Mutex::new(value),
        }
    }

    /// A mutex named `name`.
    #[track_caller]
    pub fn named(name: &str, value: T) -> Self {
        Self {
            common: Common::register(ASYNC_MUTEX_KIND, Some(name), Location::caller()),
            inner: tokio::sync::Mutex::new(value),
        }
    }

    /// Consumes the mutex (unregistering it) and returns the data.
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> AsyncMutex<T> {
    fn guard<'a>(&'a self, guard: tokio::sync::MutexGuard<'a, T>, hold_start: u64) -> AsyncMutexGuard<'a, T> {
        AsyncMutexGuard {
            common: &self.common,
            hold_start,
            guard,
        }
    }

    /// Acquires the lock, waiting (asynchronously) while it is held.
    #[track_caller]
    pub fn lock(&self) -> impl std::future::Future<Output = AsyncMutexGuard<'_, T>> {
        let site = Location::caller();
        async move {
            if let Ok(guard) = self.inner.try_lock() {
                let start = self.common.acquired(mutex::op::LOCK, 0, 0, 0);
                return self.guard(guard, start);
            }
            let start = self.common.start_wait();
            let guard = self.inner.lock().await;
            let now = clock::ticks();
            let hold =
                self.common
                    .acquired_waited(mutex::op::LOCK, now.saturating_sub(start).max(1), now, site);
            self.guard(guard, hold)
        }
    }

    /// Acquires the lock from synchronous code (not inside a runtime).
    #[track_caller]
    pub fn blocking_lock(&self) -> AsyncMutexGuard<'_, T> {
        if let Ok(guard) = self.inner.try_lock() {
            let start = self.common.acquired(mutex::op::LOCK, 0, 0, 0);
            return self.guard(guard, start);
        }
        let start = self.common.start_wait();
        let guard = self.inner.blocking_lock();
        let now = clock::ticks();
        let hold = self.common.acquired_waited(
            mutex::op::LOCK,
            now.saturating_sub(start).max(1),
            now,
            Location::caller(),
        );
        self.guard(guard, hold)
    }

    /// Acquires the lock if it is free.
    #[track_caller]
    pub fn try_lock(&self) -> Result<AsyncMutexGuard<'_, T>, tokio::sync::TryLockError> {
        match self.inner.try_lock() {
            Ok(guard) => {
                let start = self.common.acquired(mutex::op::TRY_LOCK, 0, 0, 0);
                Ok(self.guard(guard, start))
            }
            Err(error) => {
                self.common
                    .registration
                    .emit_at(mutex::op::TRY_LOCK, MISS, 0, Location::caller());
                Err(error)
            }
        }
    }

    /// The data through exclusive access (not observed).
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.common.registration.id()
    }

    /// Re-reads the policy word now; returns it.
    pub fn refresh_policy(&self) -> PolicyWord {
        self.common.refresh_policy()
    }
}

impl<T: ?Sized> Deref for AsyncMutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for AsyncMutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T: ?Sized> Drop for AsyncMutexGuard<'_, T> {
    fn drop(&mut self) {
        self.common.released(mutex::op::UNLOCK, self.hold_start);
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for AsyncMutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.guard, f)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for AsyncMutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncMutex")
            .field("instance_id", &self.instance_id())
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------

/// `tokio::sync::RwLock` with observations (kind 9).
pub struct AsyncRwLock<T: ?Sized> {
    common: Common,
    inner: tokio::sync::RwLock<T>,
}

/// A shared guard of [`AsyncRwLock`].
pub struct AsyncRwLockReadGuard<'a, T: ?Sized> {
    common: &'a Common,
    hold_start: u64,
    guard: tokio::sync::RwLockReadGuard<'a, T>,
}

/// An exclusive guard of [`AsyncRwLock`].
pub struct AsyncRwLockWriteGuard<'a, T: ?Sized> {
    common: &'a Common,
    hold_start: u64,
    guard: tokio::sync::RwLockWriteGuard<'a, T>,
}

impl<T> AsyncRwLock<T> {
    /// A lock named after its creation site.
    #[track_caller]
    pub fn new(value: T) -> Self {
        Self {
            common: Common::register(ASYNC_RWLOCK_KIND, None, Location::caller()),
            inner: tokio::sync::RwLock::new(value),
        }
    }

    /// A lock named `name`.
    #[track_caller]
    pub fn named(name: &str, value: T) -> Self {
        Self {
            common: Common::register(ASYNC_RWLOCK_KIND, Some(name), Location::caller()),
            inner: tokio::sync::RwLock::new(value),
        }
    }

    /// Consumes the lock (unregistering it) and returns the data.
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> AsyncRwLock<T> {
    /// Shared access, waiting while a writer holds or waits for the lock.
    #[track_caller]
    pub fn read(&self) -> impl std::future::Future<Output = AsyncRwLockReadGuard<'_, T>> {
        let site = Location::caller();
        async move {
            let (guard, hold_start) = match self.inner.try_read() {
                Ok(guard) => (guard, self.common.acquired(rwlock::op::READ, 0, 0, 0)),
                Err(_) => {
                    let start = self.common.start_wait();
                    let guard = self.inner.read().await;
                    let now = clock::ticks();
                    let waited = now.saturating_sub(start).max(1);
                    (
                        guard,
                        self.common.acquired_waited(rwlock::op::READ, waited, now, site),
                    )
                }
            };
            AsyncRwLockReadGuard {
                common: &self.common,
                hold_start,
                guard,
            }
        }
    }

    /// Shared access if available now.
    #[track_caller]
    pub fn try_read(&self) -> Result<AsyncRwLockReadGuard<'_, T>, tokio::sync::TryLockError> {
        match self.inner.try_read() {
            Ok(guard) => Ok(AsyncRwLockReadGuard {
                common: &self.common,
                hold_start: self.common.acquired(rwlock::op::TRY_READ, 0, 0, 0),
                guard,
            }),
            Err(error) => {
                self.common
                    .registration
                    .emit_at(rwlock::op::TRY_READ, MISS, 0, Location::caller());
                Err(error)
            }
        }
    }

    /// Exclusive access, waiting while anyone holds the lock.
    #[track_caller]
    pub fn write(&self) -> impl std::future::Future<Output = AsyncRwLockWriteGuard<'_, T>> {
        let site = Location::caller();
        async move {
            let (guard, hold_start) = match self.inner.try_write() {
                Ok(guard) => (guard, self.common.acquired(rwlock::op::WRITE, 0, 0, 0)),
                Err(_) => {
                    let start = self.common.start_wait();
                    let guard = self.inner.write().await;
                    let now = clock::ticks();
                    let waited = now.saturating_sub(start).max(1);
                    (
                        guard,
                        self.common.acquired_waited(rwlock::op::WRITE, waited, now, site),
                    )
                }
            };
            AsyncRwLockWriteGuard {
                common: &self.common,
                hold_start,
                guard,
            }
        }
    }

    /// Exclusive access if available now.
    #[track_caller]
    pub fn try_write(&self) -> Result<AsyncRwLockWriteGuard<'_, T>, tokio::sync::TryLockError> {
        match self.inner.try_write() {
            Ok(guard) => Ok(AsyncRwLockWriteGuard {
                common: &self.common,
                hold_start: self.common.acquired(rwlock::op::TRY_WRITE, 0, 0, 0),
                guard,
            }),
            Err(error) => {
                self.common
                    .registration
                    .emit_at(rwlock::op::TRY_WRITE, MISS, 0, Location::caller());
                Err(error)
            }
        }
    }

    /// The data through exclusive access (not observed).
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.common.registration.id()
    }

    /// Re-reads the policy word now; returns it.
    pub fn refresh_policy(&self) -> PolicyWord {
        self.common.refresh_policy()
    }
}

impl<T: ?Sized> Deref for AsyncRwLockReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> Drop for AsyncRwLockReadGuard<'_, T> {
    fn drop(&mut self) {
        self.common.released(rwlock::op::READ_UNLOCK, self.hold_start);
    }
}

impl<T: ?Sized> Deref for AsyncRwLockWriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for AsyncRwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T: ?Sized> Drop for AsyncRwLockWriteGuard<'_, T> {
    fn drop(&mut self) {
        self.common.released(rwlock::op::WRITE_UNLOCK, self.hold_start);
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for AsyncRwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncRwLock")
            .field("instance_id", &self.instance_id())
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------

/// `tokio::sync::Semaphore` with observations (kind 10).
#[derive(Debug)]
pub struct AsyncSemaphore {
    common: Common,
    inner: tokio::sync::Semaphore,
}

/// A permit of [`AsyncSemaphore`], returned on drop.
#[must_use = "dropping the permit returns it at once"]
pub struct AsyncSemaphorePermit<'a> {
    common: &'a Common,
    hold_start: u64,
    permit: Option<tokio::sync::SemaphorePermit<'a>>,
}

impl fmt::Debug for AsyncSemaphorePermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncSemaphorePermit").finish_non_exhaustive()
    }
}

impl AsyncSemaphorePermit<'_> {
    /// Keeps the permit taken for good.
    pub fn forget(mut self) {
        if let Some(permit) = self.permit.take() {
            permit.forget();
        }
        self.hold_start = 0;
    }
}

impl Drop for AsyncSemaphorePermit<'_> {
    fn drop(&mut self) {
        self.common.released(semaphore::op::RELEASE, self.hold_start);
    }
}

impl AsyncSemaphore {
    /// A semaphore with `permits` permits, named after its creation site.
    #[track_caller]
    pub fn new(permits: usize) -> Self {
        Self {
            common: Common::register(ASYNC_SEMAPHORE_KIND, None, Location::caller()),
            inner: tokio::sync::Semaphore::new(permits),
        }
    }

    /// A semaphore named `name`.
    #[track_caller]
    pub fn named(name: &str, permits: usize) -> Self {
        Self {
            common: Common::register(ASYNC_SEMAPHORE_KIND, Some(name), Location::caller()),
            inner: tokio::sync::Semaphore::new(permits),
        }
    }

    fn permit<'a>(
        &'a self,
        permit: tokio::sync::SemaphorePermit<'a>,
        hold_start: u64,
    ) -> AsyncSemaphorePermit<'a> {
        AsyncSemaphorePermit {
            common: &self.common,
            hold_start,
            permit: Some(permit),
        }
    }

    /// Takes a permit, waiting for one; fails once the semaphore is closed.
    #[track_caller]
    pub fn acquire(
        &self,
    ) -> impl std::future::Future<Output = Result<AsyncSemaphorePermit<'_>, tokio::sync::AcquireError>> {
        let site = Location::caller();
        async move {
            match self.inner.try_acquire() {
                Ok(permit) => {
                    let start = self.common.acquired(semaphore::op::ACQUIRE, 0, 0, 0);
                    return Ok(self.permit(permit, start));
                }
                Err(tokio::sync::TryAcquireError::Closed) => {
                    self.common
                        .registration
                        .emit_at(semaphore::op::ACQUIRE, MISS, 0, site);
                    // Let tokio produce its error value (a closed semaphore
                    // answers at once).
                    return match self.inner.acquire().await {
                        Ok(permit) => Ok(self.permit(permit, 0)),
                        Err(error) => Err(error),
                    };
                }
                Err(tokio::sync::TryAcquireError::NoPermits) => {}
            }
            let start = self.common.start_wait();
            let result = self.inner.acquire().await;
            let now = clock::ticks();
            let waited = now.saturating_sub(start).max(1);
            match result {
                Ok(permit) => {
                    let hold = self
                        .common
                        .acquired_waited(semaphore::op::ACQUIRE, waited, now, site);
                    Ok(self.permit(permit, hold))
                }
                Err(error) => {
                    self.common
                        .registration
                        .emit_at(semaphore::op::ACQUIRE, CONTENDED | MISS, waited, site);
                    Err(error)
                }
            }
        }
    }

    /// Takes a permit if one is free.
    #[track_caller]
    pub fn try_acquire(&self) -> Result<AsyncSemaphorePermit<'_>, tokio::sync::TryAcquireError> {
        match self.inner.try_acquire() {
            Ok(permit) => {
                let start = self.common.acquired(semaphore::op::TRY_ACQUIRE, 0, 0, 0);
                Ok(self.permit(permit, start))
            }
            Err(error) => {
                self.common
                    .registration
                    .emit_at(semaphore::op::TRY_ACQUIRE, MISS, 0, Location::caller());
                Err(error)
            }
        }
    }

    /// Adds `n` permits.
    pub fn add_permits(&self, n: usize) {
        self.inner.add_permits(n);
        self.common.registration.emit(semaphore::op::ADD_PERMITS, 0, 0);
    }

    /// Permits free now.
    pub fn available_permits(&self) -> usize {
        self.inner.available_permits()
    }

    /// Closes the semaphore: pending and later acquisitions fail.
    pub fn close(&self) {
        self.inner.close();
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.common.registration.id()
    }

    /// Re-reads the policy word now; returns it.
    pub fn refresh_policy(&self) -> PolicyWord {
        self.common.refresh_policy()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::set_policy_word;
    use super::super::test_support::{init, op, unique, wait_for};
    use super::*;

    fn every_hold(id: Option<u32>) {
        assert!(set_policy_word(
            id.unwrap(),
            PolicyWord::default().with_sample_every(1)
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_mutex_waits_misses_and_holds() {
        init();
        let name = unique("async-mutex");
        let m = Arc::new(AsyncMutex::named(&name, 0u32));
        every_hold(m.instance_id());
        m.refresh_policy();
        let guard = m.lock().await;
        assert!(m.try_lock().is_err());
        let waiter = {
            let m = Arc::clone(&m);
            tokio::spawn(async move { *m.lock().await += 1 })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(guard);
        waiter.await.unwrap();
        // Ops from two worker threads' rings: wait for all of them.
        let r = wait_for(&name, |r| {
            op(r, mutex::op::LOCK).0 >= 2
                && op(r, mutex::op::TRY_LOCK).0 >= 1
                && op(r, mutex::op::UNLOCK).0 >= 2
        });
        assert_eq!(op(&r, mutex::op::LOCK), (2, 1, 0, 1));
        assert_eq!(op(&r, mutex::op::TRY_LOCK), (1, 0, 1, 0));
        assert_eq!(op(&r, mutex::op::UNLOCK), (2, 0, 0, 2));
        let waited = r.stats.op(mutex::op::LOCK).unwrap().latency().unwrap().max();
        assert!(clock::calibration().ticks_to_ns(waited) >= 15_000_000);
        assert_eq!(r.meta.kind, 8);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_rwlock_and_semaphore() {
        init();
        let name = unique("async-rwlock");
        let l = Arc::new(AsyncRwLock::named(&name, 1u32));
        let r1 = l.read().await;
        assert!(l.try_write().is_err());
        let writer = {
            let l = Arc::clone(&l);
            tokio::spawn(async move { *l.write().await += 1 })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(r1);
        writer.await.unwrap();
        assert_eq!(*l.try_read().unwrap(), 2);
        let r = wait_for(&name, |r| r.stats.total_ops() >= 4);
        assert_eq!(op(&r, rwlock::op::READ), (1, 0, 0, 0));
        assert_eq!(op(&r, rwlock::op::WRITE), (1, 1, 0, 1));
        assert_eq!(op(&r, rwlock::op::TRY_WRITE), (1, 0, 1, 0));
        assert_eq!(op(&r, rwlock::op::TRY_READ), (1, 0, 0, 0));

        let name = unique("async-semaphore");
        let s = Arc::new(AsyncSemaphore::named(&name, 1));
        let p = s.acquire().await.unwrap();
        assert!(s.try_acquire().is_err());
        let waiter = {
            let s = Arc::clone(&s);
            tokio::spawn(async move { s.acquire().await.map(drop).is_ok() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(p);
        assert!(waiter.await.unwrap());
        s.add_permits(1);
        s.close();
        assert!(s.acquire().await.is_err());
        let r = wait_for(&name, |r| r.stats.total_ops() >= 5);
        assert_eq!(op(&r, semaphore::op::ACQUIRE), (3, 1, 1, 1));
        assert_eq!(op(&r, semaphore::op::TRY_ACQUIRE), (1, 0, 1, 0));
        assert_eq!(op(&r, semaphore::op::ADD_PERMITS), (1, 0, 0, 0));
    }
}
