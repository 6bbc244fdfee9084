//! [`InstanceStats`]: the statistics of one instance, an [`OpStats`] per op
//! kind.

use super::*;
use super::{histogram::*, op::*, threads::*, window::*};

/// Everything accumulated about one instrumented instance.
///
/// Fed by [`Self::record`] (one call per observation) and [`Self::touch`]
/// (once per drained batch). See the [module documentation](super).
#[derive(Clone, Debug, Default)]
pub struct InstanceStats {
    pub(super) ops: [OpStats; OP_KINDS],
    pub(super) invalid_op_kind: u64,
    pub(super) drops_attributed: u64,
    pub(super) first_seen_ns: Option<u64>,
    pub(super) last_seen_ns: Option<u64>,
}

impl InstanceStats {
    /// Empty statistics (no allocation).
    pub const fn new() -> Self {
        Self {
            ops: [const { OpStats::new() }; OP_KINDS],
            invalid_op_kind: 0,
            drops_attributed: 0,
            first_seen_ns: None,
            last_seen_ns: None,
        }
    }

    /// Accounts one observation. This is the drainer's hot path: no clock
    /// read, no loop, and no allocation except on the first latency of an op
    /// kind or when a producer thread not seen before shows up.
    ///
    /// * `op_kind` must be in `1..=7`; anything else only increments
    ///   [`Self::invalid_op_kind`].
    /// * `flags` is the observation's raw flag word: bit 0 (`1`) = contended,
    ///   bit 1 (`2`) = miss / empty, mirroring `Observation::FLAG_CONTENDED`
    ///   and `Observation::FLAG_MISS`; other bits are ignored, except bit 2
    ///   (`4`, `Observation::FLAG_COUNT`): then `latency_ticks` is a number
    ///   of uncontended operations, added to the count (saturating) with
    ///   nothing else.
    /// * `latency_ticks == 0` means "not measured" and is not put into the
    ///   histogram (the op is still counted).
    /// * `producer_thread_id` feeds the distinct-thread set (only looked at
    ///   when it differs from the previous observation of this op kind) and
    ///   the max-latency attribution.
    #[inline(always)]
    pub fn record(&mut self, op_kind: u16, flags: u16, latency_ticks: u64, producer_thread_id: u32) {
        // op_kind 0 wraps to 65535, so one bounds check rejects 0 and > 7.
        match self.ops.get_mut(usize::from(op_kind.wrapping_sub(1))) {
            Some(op) => op.record(flags, latency_ticks, producer_thread_id),
            None => self.invalid_op_kind += 1,
        }
    }

    /// Marks the instance as seen at `now_ns` (caller-supplied monotonic
    /// nanoseconds, e.g. the drainer's scan time for a batch): sets
    /// `first_seen` if unset and advances `last_seen` (never moves it back).
    pub fn touch(&mut self, now_ns: u64) {
        self.first_seen_ns.get_or_insert(now_ns);
        self.last_seen_ns = Some(self.last_seen_ns.map_or(now_ns, |t| t.max(now_ns)));
    }

    /// Adds `n` ring drops that the drainer attributes to this instance.
    pub fn add_attributed_drops(&mut self, n: u64) {
        self.drops_attributed = self.drops_attributed.saturating_add(n);
    }

    /// Adds `other` into `self`: counters and histograms are summed, the
    /// larger maximum latency (with its thread) wins, thread sets are united
    /// (exact up to the cap), `first_seen` is the earliest and `last_seen`
    /// the latest of both.
    pub fn merge(&mut self, other: &InstanceStats) {
        for (ours, theirs) in self.ops.iter_mut().zip(other.ops.iter()) {
            ours.merge(theirs);
        }
        self.invalid_op_kind = self.invalid_op_kind.saturating_add(other.invalid_op_kind);
        self.drops_attributed = self.drops_attributed.saturating_add(other.drops_attributed);
        self.first_seen_ns = min_opt(self.first_seen_ns, other.first_seen_ns);
        self.last_seen_ns = self.last_seen_ns.max(other.last_seen_ns);
    }

    /// Statistics of op kind `op_kind` (`1..=7`), `None` for invalid kinds.
    pub fn op(&self, op_kind: u16) -> Option<&OpStats> {
        self.ops.get(usize::from(op_kind.wrapping_sub(1)))
    }

    /// `(op_kind, stats)` for every valid op kind `1..=7`, including the ones
    /// that saw no operation.
    pub fn ops_by_kind(&self) -> impl Iterator<Item = (u16, &OpStats)> + '_ {
        (1u16..).zip(self.ops.iter())
    }

    /// Operations of all valid op kinds.
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().map(|o| o.ops).sum()
    }

    /// Contended operations of all valid op kinds.
    pub fn total_contended(&self) -> u64 {
        self.ops.iter().map(|o| o.contended).sum()
    }

    /// Miss / empty operations of all valid op kinds.
    pub fn total_misses(&self) -> u64 {
        self.ops.iter().map(|o| o.misses).sum()
    }

    /// Observations whose op kind was 0 or > 7 (not otherwise accounted).
    pub fn invalid_op_kind(&self) -> u64 {
        self.invalid_op_kind
    }

    /// Ring drops attributed to this instance by the drainer.
    pub fn drops_attributed(&self) -> u64 {
        self.drops_attributed
    }

    /// First [`Self::touch`] time, `None` if never touched.
    pub fn first_seen_ns(&self) -> Option<u64> {
        self.first_seen_ns
    }

    /// Latest [`Self::touch`] time, `None` if never touched.
    pub fn last_seen_ns(&self) -> Option<u64> {
        self.last_seen_ns
    }

    /// Latency histogram over all op kinds (a merged copy), `None` if no op
    /// kind recorded a latency.
    pub fn latency(&self) -> Option<LatencyHistogram> {
        merged_histogram(self.ops.iter().filter_map(|o| o.latency()))
    }

    /// The largest latency over all op kinds: `(op_kind, max)`, `None` if no
    /// latency was recorded. On ties the lowest op kind wins.
    pub fn max_latency(&self) -> Option<(u16, MaxLatency)> {
        max_with_kind(self.ops_by_kind().map(|(k, o)| (k, o.max_latency())))
    }

    /// Distinct producer threads over all op kinds (saturated if any op
    /// kind's set is, or if the union exceeds [`DISTINCT_THREADS_CAP`]).
    pub fn distinct_threads(&self) -> DistinctThreads {
        let mut all = ThreadSet::new();
        for op in &self.ops {
            all.union(&op.threads);
        }
        all.distinct()
    }

    /// Whether nothing at all was accounted (no op, invalid op or drop).
    pub fn is_empty(&self) -> bool {
        self.total_ops() == 0 && self.invalid_op_kind == 0 && self.drops_attributed == 0
    }

    /// Heap memory owned by these statistics, in bytes (histograms and
    /// thread sets; add `size_of::<InstanceStats>()` for the total).
    pub fn heap_bytes(&self) -> usize {
        self.ops.iter().map(OpStats::heap_bytes).sum()
    }

    /// What happened between the snapshot `earlier` (an older clone of these
    /// same statistics) and `self`. Counters subtract (saturating at 0);
    /// histograms subtract with [`LatencyHistogram::saturating_sub`].
    pub fn delta_since(&self, earlier: &InstanceStats) -> StatsDelta {
        let mut ops: [OpDelta; OP_KINDS] = Default::default();
        for ((d, now), then) in ops.iter_mut().zip(&self.ops).zip(&earlier.ops) {
            *d = now.delta_since(then);
        }
        StatsDelta {
            ops,
            invalid_op_kind: self.invalid_op_kind.saturating_sub(earlier.invalid_op_kind),
            drops_attributed: self.drops_attributed.saturating_sub(earlier.drops_attributed),
        }
    }
}

pub(super) fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub(super) fn merged_histogram<'a>(
    hists: impl Iterator<Item = &'a LatencyHistogram>,
) -> Option<LatencyHistogram> {
    let mut out: Option<LatencyHistogram> = None;
    for h in hists {
        match &mut out {
            Some(o) => o.merge(h),
            None => out = Some(h.clone()),
        }
    }
    out
}

pub(super) fn max_with_kind(
    maxima: impl Iterator<Item = (u16, Option<MaxLatency>)>,
) -> Option<(u16, MaxLatency)> {
    let mut best: Option<(u16, MaxLatency)> = None;
    for (kind, m) in maxima {
        if let Some(m) = m
            && best.is_none_or(|(_, b)| m.ticks > b.ticks)
        {
            best = Some((kind, m));
        }
    }
    best
}
