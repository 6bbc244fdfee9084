//! The atomics and cells the lock-free code is written against.
//!
//! In a normal build these are `std`'s types (plus a thin `UnsafeCell`
//! wrapper with loom's closure API). Under `RUSTFLAGS="--cfg loom"` they are
//! loom's, so the ring's orderings are model-checked against every
//! interleaving the C++11 memory model allows (see `ring::loom_tests`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, fence,
};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, AtomicUsize};

pub(crate) use std::sync::atomic::Ordering;

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `core::cell::UnsafeCell` with loom's `with_mut` access API, so the same
/// ring code compiles against both. (Reads go through `copy_out`, which has a
/// loom-specific version using loom's `with`.)
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
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// A load by the *only writer* of an atomic, of a value it stored itself.
///
/// In a normal build this is a `Relaxed` load (a plain `mov`). Under loom it
/// is `unsync_load`, which tells the model checker the access cannot race a
/// store. Besides being precise, that matters: loom's exploration computes
/// backtracking points from the last access to an atomic, and a writer's
/// own atomic load there hides the other side's accesses from it (a model
/// with producer `tail.load` + `tail.store` and consumer `tail.load`
/// completes in one iteration).
pub(crate) trait OwnerLoad {
    /// The value type.
    type Value;
    /// See the trait docs.
    fn owner_load(&self) -> Self::Value;
}

macro_rules! owner_load {
    ($atomic:ty, $value:ty) => {
        impl OwnerLoad for $atomic {
            type Value = $value;

            #[inline(always)]
            fn owner_load(&self) -> $value {
                #[cfg(not(loom))]
                {
                    self.load(Ordering::Relaxed)
                }
                #[cfg(loom)]
                // SAFETY: callers only use this on atomics that no other
                // thread stores to (the single-writer fields of the ring).
                unsafe {
                    self.unsync_load()
                }
            }
        }
    };
}

owner_load!(AtomicU32, u32);
owner_load!(AtomicU64, u64);
