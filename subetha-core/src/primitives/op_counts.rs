//! Counted operations for primitives whose handles many threads share.
//!
//! A primitive that pushed one observation for every fast-path operation
//! of a busy handle would out-run its consumer: a channel moving 20 M
//! messages a second makes 40 M `send`s and `recv`s, more than one sidecar
//! drains beside the producer and consumer on a small host, so the rings
//! drop and the statistics lose them. `OpCounts` counts such operations
//! instead and says when a count is due; the caller then pushes one
//! observation with [`Observation::FLAG_COUNT`](crate::Observation::FLAG_COUNT)
//! whose latency field carries how many operations it stands for.
//!
//! # What a consumer sees
//!
//! Per counter, counts end at the 1st, 2nd, 4th, … 64th operation (so a
//! new primitive shows up at once), then at every 64th ([`BATCH`]).
//! Whatever no count covers yet is returned by `OpCounts::take_uncounted`,
//! which the owner calls when the primitive goes away: the totals are then
//! exact. While the primitive lives, a consumer's count of an operation
//! lags by at most 63 per stripe that thread used.
//!
//! # Why stripes, and why slots
//!
//! The handles are `Sync` (crossbeam's channel ends are, and a `&Channel`
//! is shared by reference), so the counters are atomics. One counter per
//! operation would put every thread's increment on one cache line, which
//! then moves between cores on every operation. So each `OpCounts` has
//! [`STRIPES`] stripes, each on a line of its own, and the process has as
//! many counting *slots*: a thread takes a free slot at its first count
//! and gives it back when it exits. While it holds slot `k` it is the only
//! thread that stores to stripe `k` of any `OpCounts`, so its count is a
//! load and a store, not a locked read-modify-write, which would cost an
//! uncontended `RwLock::read` (the `rwlock` group's `subetha/read/1` row of
//! `benches/primitives.rs`). The slot's hand-over from an exited
//! thread to the next (a Release when it is given back, an Acquire when
//! it is taken) orders the two threads' stores. A thread that finds no
//! free slot (more than [`STRIPES`] live threads have counted) counts on
//! the shared stripe, atomically: a slower count, never a lost one.
//!
//! The count a stripe reports is that stripe's own, so every operation is
//! covered exactly once whichever thread's add ends its batch. The slot
//! protocol is model-checked with loom (`loom_tests`). After `fork` the
//! child keeps the parent's slots taken (their threads are gone), so the
//! child's threads may count on the shared stripe.

#[cfg(not(loom))]
use std::cell::Cell;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU32, AtomicU64, Ordering, OwnerLoad};

#[cfg(not(loom))]
pub use super::counting::BATCH;
use super::counting::{count_ending_at, uncounted};
/// Counting slots (and owned stripes per `OpCounts`).
pub const STRIPES: usize = 8;

/// Which counting slots live threads hold.
pub(crate) struct SlotPool {
    /// Bit `k` set: slot `k` is held.
    taken: AtomicU32,
}

const ALL_SLOTS: u32 = (1 << STRIPES) - 1;

impl SlotPool {
    /// Takes a free slot, if any. Acquire: the stores of the thread that
    /// held it last happen before this thread's.
    fn claim(&self) -> Option<usize> {
        let mut taken = self.taken.load(Ordering::Relaxed);
        loop {
            let free = !taken & ALL_SLOTS;
            if free == 0 {
                return None;
            }
            let slot = free.trailing_zeros();
            match self.taken.compare_exchange_weak(
                taken,
                taken | 1 << slot,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(slot as usize),
                Err(now) => taken = now,
            }
        }
    }

    /// Gives `slot` back. Release: see [`claim`](Self::claim).
    fn release(&self, slot: usize) {
        self.taken.fetch_and(!(1 << slot), Ordering::Release);
    }
}

#[cfg(not(loom))]
static SLOTS: SlotPool = SlotPool {
    taken: AtomicU32::new(0),
};

/// A thread's counting slot, given back when the thread exits.
#[cfg(not(loom))]
struct HeldSlot(Option<usize>);

#[cfg(not(loom))]
impl Drop for HeldSlot {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            // Later counts on this thread (other thread-locals' destructors
            // may still count) go to the shared stripe.
            SLOT_INDEX.with(|index| index.set(NO_SLOT));
            SLOTS.release(slot);
        }
    }
}

/// `SLOT_INDEX` before the thread's first count.
#[cfg(not(loom))]
const UNCLAIMED: u8 = u8::MAX;
/// `SLOT_INDEX` of a thread without a slot: none was free, or it gave its
/// slot back on exit.
#[cfg(not(loom))]
const NO_SLOT: u8 = u8::MAX - 1;
#[cfg(not(loom))]
const _: () = assert!(STRIPES < NO_SLOT as usize);

#[cfg(not(loom))]
thread_local! {
    /// The slot `SLOT_HELD` holds, as an index, or [`UNCLAIMED`] /
    /// [`NO_SLOT`]. A copy without a destructor, so that a count reads
    /// one byte and compares it once (the holder's own thread-local
    /// carries a registration state that every access would test).
    static SLOT_INDEX: Cell<u8> = const { Cell::new(UNCLAIMED) };
    /// Gives the slot back when the thread exits.
    static SLOT_HELD: HeldSlot = HeldSlot(SLOTS.claim());
}

/// The calling thread's counting slot (`None`: none free, or the thread
/// is exiting and has given it back).
#[cfg(not(loom))]
#[inline(always)]
fn my_slot() -> Option<usize> {
    let index = SLOT_INDEX.with(Cell::get);
    if usize::from(index) < STRIPES {
        Some(usize::from(index))
    } else {
        claim_slot(index)
    }
}

/// [`my_slot`] before the thread's first count, or without a slot.
#[cfg(not(loom))]
#[cold]
#[inline(never)]
fn claim_slot(index: u8) -> Option<usize> {
    if index != UNCLAIMED {
        return None;
    }
    // `try_with` fails once the thread has begun to exit and the holder is
    // gone; the thread then counts on the shared stripe.
    let slot = SLOT_HELD.try_with(|held| held.0).ok().flatten();
    let index = slot.map_or(NO_SLOT, |slot| slot as u8);
    SLOT_INDEX.with(|cell| cell.set(index));
    slot
}

/// `OPS` operation counters, striped by counting slot (see the module
/// docs).
pub(crate) struct OpCounts<const OPS: usize> {
    /// Stripe `k` is stored to only by the holder of slot `k`.
    owned: [CachePadded<[AtomicU64; OPS]>; STRIPES],
    /// For threads without a slot.
    shared: CachePadded<[AtomicU64; OPS]>,
}

fn zeros<const OPS: usize>() -> [AtomicU64; OPS] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

impl<const OPS: usize> OpCounts<OPS> {
    pub(crate) fn new() -> Self {
        Self {
            owned: std::array::from_fn(|_| CachePadded::new(zeros())),
            shared: CachePadded::new(zeros()),
        }
    }

    /// Counts one operation of counter `op` (< `OPS`) by this thread.
    /// Returns how many operations a count ending here covers, when one
    /// does; the caller pushes it.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn add(&self, op: usize) -> Option<u64> {
        self.add_in(my_slot(), op)
    }

    /// [`add`](Self::add) by the holder of `slot` (the loom model passes
    /// its threads' slots: loom runs them all on one OS thread).
    #[inline(always)]
    fn add_in(&self, slot: Option<usize>, op: usize) -> Option<u64> {
        // Relaxed: a counter only has to count, the observation that
        // reports it is published by the ring's own Release, and
        // `take_uncounted` has `&mut self`.
        let nth = match slot {
            Some(slot) => {
                // Only the slot's holder stores to this counter.
                let counter = &self.owned[slot][op];
                let nth = counter.owner_load() + 1;
                counter.store(nth, Ordering::Relaxed);
                nth
            }
            None => self.shared[op].fetch_add(1, Ordering::Relaxed) + 1,
        };
        count_ending_at(nth)
    }

    /// What no count has covered yet, per counter, summed over the
    /// stripes; resets the counters. With
    /// `&mut self` nobody is counting.
    pub(crate) fn take_uncounted(&mut self) -> [u64; OPS] {
        let mut rest = [0; OPS];
        let stripes = self
            .owned
            .iter_mut()
            .map(|stripe| &mut **stripe)
            .chain(std::iter::once(&mut *self.shared));
        for counters in stripes {
            for (sum, counter) in rest.iter_mut().zip(counters.iter_mut()) {
                *sum += uncounted(counter.take_all());
            }
        }
        rest
    }
}

/// Reads a counter through `&mut` and resets it (loom's atomics have no
/// `get_mut`).
trait TakeAll {
    fn take_all(&mut self) -> u64;
}

impl TakeAll for AtomicU64 {
    fn take_all(&mut self) -> u64 {
        #[cfg(not(loom))]
        {
            std::mem::take(self.get_mut())
        }
        #[cfg(loom)]
        {
            self.with_mut(std::mem::take)
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// More threads at once than slots, so that some count on their own
    /// stripe and the rest on the shared one, then as many again after
    /// the first have exited and given their slots back: every operation
    /// is covered once.
    #[test]
    fn threads_with_and_without_slots_are_counted_exactly() {
        use std::sync::{Arc, Barrier};
        const THREADS: usize = 3 * STRIPES;
        const EACH: u64 = 10_007;
        let counts = Arc::new(OpCounts::<2>::new());
        let mut reported = 0;
        for _ in 0..2 {
            // All alive at once: only STRIPES of them (at most) get a slot.
            let together = Arc::new(Barrier::new(THREADS));
            reported += (0..THREADS)
                .map(|_| {
                    let (counts, together) = (Arc::clone(&counts), Arc::clone(&together));
                    std::thread::spawn(move || {
                        let first = counts.add(1).map_or(0, |n| n);
                        together.wait();
                        first + (1..EACH).filter_map(|_| counts.add(1)).sum::<u64>()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .sum::<u64>();
        }
        let mut counts = Arc::into_inner(counts).unwrap();
        let rest = counts.take_uncounted();
        assert_eq!(rest[0], 0);
        assert_eq!(reported + rest[1], 2 * THREADS as u64 * EACH);
        assert_eq!(counts.take_uncounted(), [0, 0]);
    }

    /// A slot given back is free for the next thread; none is handed out
    /// twice.
    #[test]
    fn an_exiting_thread_gives_its_slot_back() {
        let pool = SlotPool {
            taken: AtomicU32::new(ALL_SLOTS & !0b100),
        };
        assert_eq!(pool.claim(), Some(2));
        assert_eq!(pool.claim(), None, "all taken");
        pool.release(2);
        assert_eq!(pool.claim(), Some(2));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Model checks: `RUSTFLAGS="--cfg loom" cargo test -p subetha-core --lib loom`.
    use super::*;
    use loom::sync::Arc;

    /// Two threads share one free slot: each takes it if it can, counts,
    /// and gives it back. In every interleaving a slot's holder never
    /// overlaps the one before it (loom checks its plain counter access),
    /// and the counts plus the rest cover every operation exactly once.
    #[test]
    fn a_slot_handed_between_threads_loses_no_operation() {
        const EACH: u64 = 2;
        loom::model(|| {
            let pool = Arc::new(SlotPool {
                taken: AtomicU32::new(ALL_SLOTS & !1),
            });
            let counts = Arc::new(OpCounts::<1>::new());
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (pool, counts) = (Arc::clone(&pool), Arc::clone(&counts));
                    loom::thread::spawn(move || {
                        let slot = pool.claim();
                        let reported = (0..EACH).filter_map(|_| counts.add_in(slot, 0)).sum::<u64>();
                        if let Some(slot) = slot {
                            pool.release(slot);
                        }
                        reported
                    })
                })
                .collect();
            let reported: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
            let mut counts = Arc::try_unwrap(counts).ok().expect("threads joined");
            let [rest] = counts.take_uncounted();
            assert_eq!(reported + rest, 2 * EACH);
        });
    }
}
