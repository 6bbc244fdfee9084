//! The atomics and cells the lock-free code is written against.
//!
//! In a normal build these are `std`'s types (plus a thin `UnsafeCell`
//! wrapper with loom's closure API). Under `RUSTFLAGS="--cfg loom"` they are
//! loom's, so the ring's orderings are model-checked against every
//! interleaving the C++11 memory model allows (see `ring::loom_tests`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64};

pub(crate) use std::sync::atomic::Ordering;

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `core::cell::UnsafeCell` with loom's `with`/`with_mut` access API, so the
/// same ring code compiles against both.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
