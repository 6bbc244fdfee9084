//! [`Barrier`]: `std::sync::Barrier`'s semantics with observations.
//!
//! Kind code 6 (`barrier`). Ops: `wait` (1, C, latency = how long this
//! thread was blocked) for every thread that arrives before the last, and
//! `release` (2, latency = time from the generation's first arrival to its
//! last: how long the stragglers kept everyone waiting) for the last one,
//! the leader. The leader reads the clock once; a barrier of 0 or 1
//! threads never blocks, and every `wait` is a leader with latency 0.

use std::fmt;
use std::panic::Location;

use super::{CONTENDED, Registration, since};
use crate::clock;
use crate::registry::InstanceKind;

/// The kind [`Barrier`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 6,
    name: "barrier",
    ops: &["wait", "release"],
};

/// Op kinds of [`Barrier`].
pub mod op {
    /// A non-leader's wait.
    pub const WAIT: u16 = 1;
    /// The leader's arrival, which releases the generation.
    pub const RELEASE: u16 = 2;
}

/// What [`Barrier::wait`] returns: whether this thread was the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierWaitResult(bool);

impl BarrierWaitResult {
    /// True for exactly one thread per generation: the last to arrive.
    pub fn is_leader(&self) -> bool {
        self.0
    }
}

struct State {
    arrived: usize,
    generation: u64,
    first_arrival: u64,
}

/// A reusable barrier for `n` threads (kind 6).
///
/// ```
/// use std::sync::Arc;
/// use subetha_core::Barrier;
///
/// let phase = Arc::new(Barrier::named("phase", 2));
/// let other = {
///     let phase = Arc::clone(&phase);
///     std::thread::spawn(move || phase.wait().is_leader())
/// };
/// let leaders = phase.wait().is_leader() as u32 + other.join().unwrap() as u32;
/// assert_eq!(leaders, 1);
/// ```
pub struct Barrier {
    state: parking_lot::Mutex<State>,
    cv: parking_lot::Condvar,
    n: usize,
    registration: Registration,
}

impl fmt::Debug for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Barrier")
            .field("n", &self.n)
            .field("instance_id", &self.registration.id())
            .finish()
    }
}

impl Barrier {
    /// A barrier for `n` threads named after its creation site.
    #[track_caller]
    pub fn new(n: usize) -> Self {
        Self::build(n, Registration::register(KIND, None, Location::caller()))
    }

    /// A barrier for `n` threads named `name`.
    #[track_caller]
    pub fn named(name: &str, n: usize) -> Self {
        Self::build(n, Registration::register(KIND, Some(name), Location::caller()))
    }

    /// A barrier without an instance (nothing observed); `const`.
    pub const fn unobserved(n: usize) -> Self {
        Self::build(n, Registration::NONE)
    }

    const fn build(n: usize, registration: Registration) -> Self {
        Self {
            state: parking_lot::const_mutex(State {
                arrived: 0,
                generation: 0,
                first_arrival: 0,
            }),
            cv: parking_lot::Condvar::new(),
            n,
            registration,
        }
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.registration.id()
    }

    /// Blocks until `n` threads have called `wait` in this generation.
    #[track_caller]
    pub fn wait(&self) -> BarrierWaitResult {
        let site = Location::caller();
        let mut state = self.state.lock();
        if state.arrived + 1 >= self.n {
            let skew = if self.n > 1 { since(state.first_arrival) } else { 0 };
            state.arrived = 0;
            state.generation = state.generation.wrapping_add(1);
            drop(state);
            self.cv.notify_all();
            self.registration.emit(op::RELEASE, 0, skew);
            return BarrierWaitResult(true);
        }
        let start = clock::ticks();
        if state.arrived == 0 {
            state.first_arrival = start;
        }
        state.arrived += 1;
        let generation = state.generation;
        while state.generation == generation {
            self.cv.wait(&mut state);
        }
        drop(state);
        self.registration.emit_at(op::WAIT, CONTENDED, since(start), site);
        BarrierWaitResult(false)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::test_support::{op, unique, wait_for};
    use super::*;

    #[test]
    fn waiters_block_until_the_leader_arrives() {
        let name = unique("barrier");
        let b = Arc::new(Barrier::named(&name, 3));
        for _ in 0..2 {
            let early: Vec<_> = (0..2)
                .map(|_| {
                    let b = Arc::clone(&b);
                    std::thread::spawn(move || b.wait().is_leader())
                })
                .collect();
            std::thread::sleep(Duration::from_millis(20));
            let leader = b.wait().is_leader();
            let others: Vec<bool> = early.into_iter().map(|t| t.join().unwrap()).collect();
            assert_eq!(others.iter().filter(|l| **l).count() + usize::from(leader), 1);
        }
        let r = wait_for(&name, |r| r.stats.total_ops() >= 6);
        assert_eq!(op(&r, op::WAIT), (4, 4, 0, 4));
        assert_eq!(op(&r, op::RELEASE), (2, 0, 0, 2));
        // The leader's skew covers the 20 ms the main thread slept (in the
        // usual case where the main thread is the leader).
        let skew = r.stats.op(op::RELEASE).unwrap().latency().unwrap().max();
        assert!(crate::clock::calibration().ticks_to_ns(skew) >= 15_000_000);
        let single = Barrier::named(&unique("barrier-1"), 1);
        assert!(single.wait().is_leader());
        assert!(Barrier::unobserved(0).wait().is_leader());
        // Dropping unregisters; the final stats stay with the consumer.
        drop(b);
        let r = wait_for(&name, |r| r.meta.retired_mono_ns.is_some());
        assert_eq!(op(&r, op::WAIT).0, 4);
    }
}
