//! [`OpStats`]: what one op kind of an instance has seen.

use super::{histogram::*, threads::*, window::*};
use crate::observation::Observation;

/// `OpStats::last_thread` before any thread was seen (no `u32` equals it).
pub(super) const NO_THREAD: u64 = u64::MAX;

/// The largest latency seen, with the producer thread that reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MaxLatency {
    /// The latency, in ticks.
    pub ticks: u64,
    /// `producer_thread_id` of the observation that carried it (the first
    /// one, on ties).
    pub thread_id: u32,
}

/// Statistics of one op kind of one instance (see [`InstanceStats::op`](super::InstanceStats::op)).
#[derive(Clone, Debug)]
pub struct OpStats {
    pub(super) ops: u64,
    pub(super) contended: u64,
    pub(super) misses: u64,
    /// Last producer thread seen, or `NO_THREAD`; the thread set is only
    /// consulted when this changes.
    pub(super) last_thread: u64,
    /// Thread that produced `latency.max()`.
    pub(super) max_thread: u32,
    /// Non-zero latencies; allocated on the first one.
    pub(super) latency: Option<Box<LatencyHistogram>>,
    pub(super) threads: ThreadSet,
}

impl OpStats {
    pub(super) const fn new() -> Self {
        Self {
            ops: 0,
            contended: 0,
            misses: 0,
            last_thread: NO_THREAD,
            max_thread: 0,
            latency: None,
            threads: ThreadSet::new(),
        }
    }

    // Always inlined: the drainer's per-observation loop (a call here cost
    // a tenth of a scan in `perf`).
    #[inline(always)]
    pub(super) fn record(&mut self, flags: u16, latency_ticks: u64, thread_id: u32) {
        if flags & Observation::FLAG_COUNT != 0 {
            return self.record_count(latency_ticks, thread_id);
        }
        self.ops += 1;
        self.contended += u64::from(flags & Observation::FLAG_CONTENDED != 0);
        self.misses += u64::from(flags & Observation::FLAG_MISS != 0);
        if u64::from(thread_id) != self.last_thread {
            self.thread_changed(thread_id);
        }
        if latency_ticks != 0 {
            let hist = match &mut self.latency {
                Some(hist) => hist,
                None => self.latency.insert(new_boxed_histogram()),
            };
            if latency_ticks > hist.max {
                self.max_thread = thread_id;
            }
            hist.record(latency_ticks);
        }
    }

    /// A [`FLAG_COUNT`](Observation::FLAG_COUNT) observation: `count` uncontended operations, no
    /// latency. Saturates rather than trusting a hostile count.
    #[inline(never)]
    pub(super) fn record_count(&mut self, count: u64, thread_id: u32) {
        self.ops = self.ops.saturating_add(count);
        if u64::from(thread_id) != self.last_thread {
            self.thread_changed(thread_id);
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn thread_changed(&mut self, thread_id: u32) {
        self.last_thread = u64::from(thread_id);
        self.threads.insert(thread_id);
    }

    pub(super) fn merge(&mut self, other: &OpStats) {
        self.ops = self.ops.saturating_add(other.ops);
        self.contended = self.contended.saturating_add(other.contended);
        self.misses = self.misses.saturating_add(other.misses);
        if let Some(theirs) = &other.latency {
            match &mut self.latency {
                Some(ours) => {
                    if theirs.max > ours.max {
                        self.max_thread = other.max_thread;
                    }
                    ours.merge(theirs);
                }
                None => {
                    self.latency = Some(theirs.clone());
                    self.max_thread = other.max_thread;
                }
            }
        }
        self.threads.union(&other.threads);
    }

    pub(super) fn delta_since(&self, earlier: &OpStats) -> OpDelta {
        let latency = match (&self.latency, &earlier.latency) {
            (Some(now), Some(then)) => Some(Box::new(now.saturating_sub(then))),
            (Some(now), None) => Some(now.clone()),
            (None, _) => None,
        }
        .filter(|h| !h.is_empty());
        let earlier_max = earlier.latency.as_ref().map_or(0, |h| h.max);
        let new_max_latency = self.max_latency().filter(|m| m.ticks > earlier_max);
        OpDelta {
            ops: self.ops.saturating_sub(earlier.ops),
            contended: self.contended.saturating_sub(earlier.contended),
            misses: self.misses.saturating_sub(earlier.misses),
            latency,
            new_max_latency,
        }
    }

    /// Number of operations observed.
    #[inline]
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// Number of operations flagged contended.
    #[inline]
    pub fn contended(&self) -> u64 {
        self.contended
    }

    /// Number of operations flagged miss / empty.
    #[inline]
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Histogram of the non-zero latencies (ticks), `None` if none was
    /// recorded.
    #[inline]
    pub fn latency(&self) -> Option<&LatencyHistogram> {
        self.latency.as_deref()
    }

    /// Largest latency with the thread that produced it, `None` if no
    /// latency was recorded.
    pub fn max_latency(&self) -> Option<MaxLatency> {
        self.latency.as_ref().map(|h| MaxLatency {
            ticks: h.max,
            thread_id: self.max_thread,
        })
    }

    /// Number of distinct producer threads seen for this op kind.
    pub fn distinct_threads(&self) -> DistinctThreads {
        self.threads.distinct()
    }

    /// The distinct producer thread ids seen, sorted ascending (at most
    /// [`DISTINCT_THREADS_CAP`](super::DISTINCT_THREADS_CAP); incomplete if saturated).
    pub fn thread_ids(&self) -> &[u32] {
        &self.threads.ids
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.latency.as_ref().map_or(0, |_| size_of::<LatencyHistogram>())
            + self.threads.ids.capacity() * size_of::<u32>()
    }
}

impl Default for OpStats {
    fn default() -> Self {
        Self::new()
    }
}

#[cold]
#[inline(never)]
pub(super) fn new_boxed_histogram() -> Box<LatencyHistogram> {
    Box::new(LatencyHistogram::new())
}
