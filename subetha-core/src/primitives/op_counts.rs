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
//! # Why stripes
//!
//! The handles are `Sync` (crossbeam's channel ends are, and a `&Channel`
//! is shared by reference), so the counters are atomics. One counter per
//! operation would put every thread's increment on one cache line, which
//! then moves between cores on every operation. Each thread instead adds
//! to the stripe of its [`thread_id`] (modulo [`STRIPES`]), on a line of
//! its own: with up to [`STRIPES`] threads (sequential ids) no two share
//! one, and beyond that a collision only costs speed. The count a stripe
//! reports is that stripe's own, so every operation is covered exactly
//! once whichever thread's add ends its batch.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::thread_id;

/// Operations per count once a counter is past its first [`BATCH`].
pub const BATCH: u64 = 64;
/// Counter stripes per `OpCounts`, each on a cache line of its own.
pub const STRIPES: usize = 8;

/// `OPS` operation counters, striped by thread (see the module docs).
pub(crate) struct OpCounts<const OPS: usize> {
    stripes: [CachePadded<[AtomicU64; OPS]>; STRIPES],
}

impl<const OPS: usize> OpCounts<OPS> {
    pub(crate) fn new() -> Self {
        Self {
            stripes: std::array::from_fn(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0)))),
        }
    }

    /// Counts one operation of counter `op` (< `OPS`) by this thread.
    /// Returns how many operations a count ending here covers, when one
    /// does; the caller pushes it.
    #[inline]
    pub(crate) fn add(&self, op: usize) -> Option<u64> {
        let stripe = &self.stripes[thread_id() as usize % STRIPES];
        // Relaxed: the counter only has to count; the observation that
        // reports it is published by the ring's own Release.
        let nth = stripe[op].fetch_add(1, Ordering::Relaxed) + 1;
        count_ending_at(nth)
    }

    /// What no count has covered yet, per counter, summed over the
    /// stripes; resets the counters. With `&mut self` nobody is counting.
    pub(crate) fn take_uncounted(&mut self) -> [u64; OPS] {
        let mut rest = [0; OPS];
        for stripe in &mut self.stripes {
            for (sum, counter) in rest.iter_mut().zip(stripe.iter_mut()) {
                *sum += uncounted(std::mem::take(counter.get_mut()));
            }
        }
        rest
    }
}

/// How many operations the count ending at the `nth` operation of a counter
/// covers, if one ends there: the 1st, 2nd, 4th … [`BATCH`]th, then every
/// [`BATCH`]th.
fn count_ending_at(nth: u64) -> Option<u64> {
    if nth <= BATCH {
        nth.is_power_of_two().then(|| nth - nth / 2)
    } else {
        nth.is_multiple_of(BATCH).then_some(BATCH)
    }
}

/// How many of a counter's first `total` operations no count covers.
fn uncounted(total: u64) -> u64 {
    if total < BATCH {
        // The last count ended at the highest power of two ≤ total.
        total.checked_ilog2().map_or(0, |log| total - (1 << log))
    } else {
        total % BATCH
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_the_rest_cover_every_operation_exactly_once() {
        for total in 0..1000 {
            let counted: u64 = (1..=total).filter_map(count_ending_at).sum();
            assert_eq!(counted + uncounted(total), total, "total {total}");
        }
        let ends: Vec<u64> = (1..=200).filter(|&n| count_ending_at(n).is_some()).collect();
        assert_eq!(ends, [1, 2, 4, 8, 16, 32, 64, 128, 192]);
    }

    #[test]
    fn threads_on_shared_or_own_stripes_are_counted_exactly() {
        use std::sync::Arc;
        const THREADS: u64 = 6;
        const EACH: u64 = 10_007;
        let counts = Arc::new(OpCounts::<2>::new());
        let reported: u64 = (0..THREADS)
            .map(|_| {
                let counts = Arc::clone(&counts);
                std::thread::spawn(move || (0..EACH).filter_map(|_| counts.add(1)).sum::<u64>())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        let mut counts = Arc::into_inner(counts).unwrap();
        let rest = counts.take_uncounted();
        assert_eq!(rest[0], 0);
        assert_eq!(reported + rest[1], THREADS * EACH);
        assert_eq!(counts.take_uncounted(), [0, 0]);
    }
}
