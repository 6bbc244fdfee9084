//! What the consumer ("drainer") accumulates: per-instance statistics.
//!
//! The drainer turns the stream of observations coming out of the rings into
//! one [`InstanceStats`] per instrumented primitive. This module owns those
//! accumulators and the arithmetic on them; it deliberately knows nothing
//! about rings, observations or clocks, so it can be used (and tested) on its
//! own.
//!
//! # [`LatencyHistogram`]
//!
//! A fixed-size log-linear histogram of `u64` values (raw TSC ticks here):
//!
//! * **Layout.** A plain `#[repr(C)]` struct holding a `[u64; 592]` bucket
//!   array plus `count`/`sum`/`min`/`max`: no heap, no pointers, 4 768 bytes
//!   (asserted ≤ 8 KiB in the tests), so it could later live in shared memory.
//! * **Buckets.** Values below 32 get one bucket each (exact). Above that,
//!   every power of two `[2^e, 2^(e+1))` is split into 16 equal-width
//!   sub-buckets, up to [`LatencyHistogram::HIGHEST_TRACKABLE`] `= 2^40 - 1`
//!   (≈ 366 s at 3 GHz).
//! * **Error bound.** A reported quantile is the midpoint of the bucket that
//!   holds the exact quantile, clamped to `[min, max]`, so its relative error is
//!   strictly below [`LatencyHistogram::MAX_RELATIVE_ERROR`] `= 1/32 ≈ 3.1 %`
//!   (measured maximum in the tests: ≈ 3.1 %, i.e. the bound is tight). The
//!   quantile at rank 1 is the exact `min` and the one at rank `count` the
//!   exact `max`. The exact quantile is the sample at 1-based rank
//!   `ceil(q · count)` (at least 1), the same definition `hdrhistogram` uses.
//! * **Out of range.** Values above `HIGHEST_TRACKABLE` are counted in the top
//!   bucket; `max` (and `sum`) still record the exact value. Quantiles that fall
//!   among such clamped values are not covered by the error bound (they are
//!   reported inside the top bucket, or as `max` at rank `count`).
//! * **Recording** ([`LatencyHistogram::record`]) is branch-free apart from
//!   the bounds check: one `leading_zeros`, a shift, an add, `min`/`max`
//!   updates; no loops, no floating point.
//! * **Merge** is bucket-wise addition ([`LatencyHistogram::merge`]): merging
//!   two histograms gives exactly the histogram of the union of their samples.
//!   [`LatencyHistogram::saturating_sub`] is the inverse for monotonic
//!   snapshots and yields per-window histograms.
//!
//! # [`InstanceStats`]
//!
//! Per-instance accumulation, fed one observation at a time by
//! [`InstanceStats::record`] (no clock read, no allocation except the first
//! time an op kind records a latency or a new producer thread is seen) plus
//! [`InstanceStats::touch`] once per drained batch with the scan time. Per op
//! kind (`1..=7`, see [`OpStats`]) it keeps: op count, contended count, miss
//! count, a lazily boxed [`LatencyHistogram`] of the non-zero latencies, the
//! maximum latency with the producer thread that produced it, and the set of
//! distinct producer threads (exact up to [`DISTINCT_THREADS_CAP`], then
//! flagged as saturated). Invalid op kinds (0 or > 7) are only counted.
//!
//! Memory: `size_of::<InstanceStats>()` is about 0.6 KiB; each op kind that
//! recorded a latency adds one 4 768-byte heap histogram; each distinct
//! producer thread costs 4 bytes in a sorted `Vec` (at most 16 KiB per op
//! kind). [`InstanceStats::heap_bytes`] reports the heap part.
//!
//! Merge ([`InstanceStats::merge`]) adds counters and histograms, keeps the
//! larger maximum (with its thread), unions the thread sets, and takes the
//! earliest `first_seen` / latest `last_seen`.
//!
//! # Windows
//!
//! All counters are monotonic, so a window is the difference of two snapshots:
//! [`InstanceStats::delta_since`] gives a [`StatsDelta`] (counts and window
//! histograms), [`StatsDelta::rates`] turns it into per-second
//! [`WindowRates`] for a known elapsed time, and [`StatsWindow`] keeps the
//! previous snapshot for you.
//!
//! # Units
//!
//! Latencies are stored in raw ticks. Conversion to nanoseconds is a
//! presentation concern of the caller (it owns the TSC calibration); see
//! [`Quantiles::map`].

use std::fmt;

// ---------------------------------------------------------------------------
// LatencyHistogram
// ---------------------------------------------------------------------------

/// log2 of the number of linear sub-buckets per power of two.
const SUB_BUCKET_BITS: u32 = 4;
/// Linear sub-buckets per power of two.
const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Values up to `2^MAX_VALUE_BITS - 1` are tracked with full resolution.
const MAX_VALUE_BITS: u32 = 40;
/// Number of buckets: one per value below `2 * SUB_BUCKETS`, then
/// `SUB_BUCKETS` per power of two up to `2^MAX_VALUE_BITS`.
const BUCKETS: usize = (MAX_VALUE_BITS - SUB_BUCKET_BITS + 1) as usize * SUB_BUCKETS;
/// Largest value that is not clamped.
const HIGHEST_TRACKABLE: u64 = (1 << MAX_VALUE_BITS) - 1;

/// A fixed-size, mergeable log-linear histogram of `u64` values.
///
/// See the [module documentation](self) for the bucket layout and the error
/// bound. `min()`/`max()`/quantiles of an empty histogram are 0.
#[derive(Clone, PartialEq, Eq)]
#[repr(C)]
pub struct LatencyHistogram {
    counts: [u64; BUCKETS],
    count: u64,
    /// Saturating sum of the recorded (unclamped) values.
    sum: u64,
    /// `u64::MAX` when empty.
    min: u64,
    /// 0 when empty.
    max: u64,
}

/// One non-empty bucket of a [`LatencyHistogram`], as yielded by
/// [`LatencyHistogram::buckets`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Smallest value that falls into this bucket.
    pub low: u64,
    /// Largest value that falls into this bucket (inclusive). For the top
    /// bucket this is [`LatencyHistogram::HIGHEST_TRACKABLE`], although
    /// clamped larger values are counted there too.
    pub high: u64,
    /// Number of recorded values in `low..=high`.
    pub count: u64,
}

impl LatencyHistogram {
    /// Number of buckets in the histogram (592).
    pub const BUCKETS: usize = BUCKETS;
    /// Linear sub-buckets per power of two (16).
    pub const SUB_BUCKETS: usize = SUB_BUCKETS;
    /// Largest value recorded without clamping: `2^40 - 1`.
    pub const HIGHEST_TRACKABLE: u64 = HIGHEST_TRACKABLE;
    /// Upper bound (exclusive) on the relative error of any reported quantile
    /// whose exact value is at most [`Self::HIGHEST_TRACKABLE`]: `1/32`.
    pub const MAX_RELATIVE_ERROR: f64 = 1.0 / (2 * SUB_BUCKETS) as f64;

    /// An empty histogram.
    pub const fn new() -> Self {
        Self {
            counts: [0; BUCKETS],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Index of the bucket that `value` falls into (values above
    /// [`Self::HIGHEST_TRACKABLE`] go into the top bucket).
    #[inline]
    pub const fn bucket_index(value: u64) -> usize {
        // Compiles to a cmov; `Ord::min` is not const.
        let v = if value > HIGHEST_TRACKABLE {
            HIGHEST_TRACKABLE
        } else {
            value
        };
        // Exponent of the highest set bit, at least SUB_BUCKET_BITS so that
        // values below 2 * SUB_BUCKETS map to themselves (shift 0).
        let exp = 63 - (v | SUB_BUCKETS as u64).leading_zeros();
        let shift = exp - SUB_BUCKET_BITS;
        // `v >> shift` is in SUB_BUCKETS..2*SUB_BUCKETS for v >= SUB_BUCKETS.
        ((shift as usize) << SUB_BUCKET_BITS) + (v >> shift) as usize
    }

    /// Inclusive value range `(low, high)` of bucket `index`.
    ///
    /// # Panics
    ///
    /// If `index >= Self::BUCKETS`.
    pub const fn bucket_bounds(index: usize) -> (u64, u64) {
        assert!(index < BUCKETS, "bucket index out of range");
        if index < 2 * SUB_BUCKETS {
            (index as u64, index as u64)
        } else {
            let shift = (index >> SUB_BUCKET_BITS) - 1;
            let sub = (index & (SUB_BUCKETS - 1)) + SUB_BUCKETS;
            let low = (sub as u64) << shift;
            (low, low + (1 << shift) - 1)
        }
    }

    /// The value reported for samples in bucket `index`: the (lower) midpoint
    /// of its range.
    ///
    /// # Panics
    ///
    /// If `index >= Self::BUCKETS`.
    pub const fn bucket_representative(index: usize) -> u64 {
        let (low, high) = Self::bucket_bounds(index);
        low + (high - low) / 2
    }

    /// Records one value.
    #[inline]
    pub fn record(&mut self, value: u64) {
        self.counts[Self::bucket_index(value)] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(value);
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// Records `value` `n` times (no-op for `n == 0`).
    #[inline]
    pub fn record_n(&mut self, value: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.counts[Self::bucket_index(value)] += n;
        self.count += n;
        self.sum = self.sum.saturating_add(value.saturating_mul(n));
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// Number of recorded values.
    #[inline]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the recorded values (exact, not clamped), saturating at
    /// `u64::MAX`.
    #[inline]
    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Smallest recorded value (exact), 0 if empty. For a histogram produced
    /// by [`Self::saturating_sub`] it may be an estimate (see there).
    #[inline]
    pub fn min(&self) -> u64 {
        if self.count == 0 { 0 } else { self.min }
    }

    /// Largest recorded value (exact, even above
    /// [`Self::HIGHEST_TRACKABLE`]), 0 if empty. For a histogram produced by
    /// [`Self::saturating_sub`] it may be an estimate (see there).
    #[inline]
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Arithmetic mean of the recorded values, 0.0 if empty (inexact once
    /// `sum` saturates).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// Whether nothing has been recorded.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Forgets everything recorded.
    pub fn reset(&mut self) {
        *self = Self::new();
    }

    /// 1-based rank of quantile `q` among `count` samples: `ceil(q * count)`
    /// clamped to `1..=count`. NaN counts as 0.
    fn rank(&self, q: f64) -> u64 {
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        // `as` saturates; the clamp handles both ends.
        ((q * self.count as f64).ceil() as u64).clamp(1, self.count)
    }

    /// Value reported for the sample at 1-based `rank` (`1..=count`).
    fn value_at_rank(&self, rank: u64) -> u64 {
        if rank <= 1 {
            return self.min;
        }
        if rank >= self.count {
            return self.max;
        }
        let mut seen = 0u64;
        for (index, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::bucket_representative(index).clamp(self.min, self.max);
            }
        }
        // Unreachable while `count` equals the sum of the buckets.
        self.max
    }

    /// Value at quantile `q` (`0.0..=1.0`, clamped; NaN counts as 0), 0 if
    /// empty.
    ///
    /// `q = 0` gives the exact `min`, `q = 1` the exact `max`; other
    /// quantiles are within [`Self::MAX_RELATIVE_ERROR`] of the exact sample
    /// at rank `ceil(q · count)`.
    pub fn value_at_quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        self.value_at_rank(self.rank(q))
    }

    /// p50, p90, p99, p99.9 and max (all 0 if empty).
    pub fn quantiles(&self) -> Quantiles {
        Quantiles {
            p50: self.value_at_quantile(0.5),
            p90: self.value_at_quantile(0.9),
            p99: self.value_at_quantile(0.99),
            p999: self.value_at_quantile(0.999),
            max: self.max(),
        }
    }

    /// Adds every sample of `other` to `self`. The result is exactly the
    /// histogram of the union of both sample multisets (counts saturate at
    /// `u64::MAX`, which cannot happen in practice).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
        self.count = self.count.saturating_add(other.count);
        self.sum = self.sum.saturating_add(other.sum);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// The samples recorded in `self` but not in `earlier`, where `earlier`
    /// is an older snapshot of the same histogram: the per-window histogram.
    ///
    /// Bucket counts and `sum` subtract exactly (saturating at 0 if `earlier`
    /// is not actually older). `max` is exact when the window set a new
    /// maximum (`self.max() > earlier.max()`); otherwise it is estimated as
    /// the representative of the highest non-empty window bucket, capped at
    /// `self.max()`. `min` likewise (exact when `self.min() < earlier.min()`,
    /// else the representative of the lowest non-empty bucket, raised to at
    /// least `self.min()`). Quantiles of the result keep the
    /// [`Self::MAX_RELATIVE_ERROR`] bound.
    pub fn saturating_sub(&self, earlier: &LatencyHistogram) -> Self {
        let mut out = Self::new();
        let mut count = 0u64;
        let mut lowest = None;
        let mut highest = None;
        for (index, ((o, a), b)) in out
            .counts
            .iter_mut()
            .zip(self.counts.iter())
            .zip(earlier.counts.iter())
            .enumerate()
        {
            *o = a.saturating_sub(*b);
            if *o != 0 {
                count += *o;
                lowest.get_or_insert(index);
                highest = Some(index);
            }
        }
        let (Some(lowest), Some(highest)) = (lowest, highest) else {
            return out;
        };
        out.count = count;
        out.sum = self.sum.saturating_sub(earlier.sum);
        out.max = if self.max > earlier.max {
            self.max
        } else {
            Self::bucket_representative(highest).min(self.max)
        };
        out.min = if self.min < earlier.min {
            self.min
        } else {
            Self::bucket_representative(lowest).max(self.min)
        };
        // Keep min <= max even for degenerate (non-monotonic) inputs.
        out.min = out.min.min(out.max);
        out
    }

    /// The non-empty buckets, in increasing value order.
    pub fn buckets(&self) -> impl Iterator<Item = Bucket> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|&(_, &count)| count != 0)
            .map(|(index, &count)| {
                let (low, high) = Self::bucket_bounds(index);
                Bucket { low, high, count }
            })
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LatencyHistogram {
    /// A summary (the bucket array itself is too long to be useful).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count)
            .field("sum", &self.sum)
            .field("min", &self.min())
            .field("max", &self.max)
            .field("quantiles", &self.quantiles())
            .field("non_empty_buckets", &self.buckets().count())
            .finish()
    }
}

/// Summary quantiles of a latency distribution: ticks (`T = u64`) as
/// returned by [`LatencyHistogram::quantiles`], or whatever unit
/// [`Quantiles::map`] converts them to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Quantiles<T = u64> {
    /// Median.
    pub p50: T,
    /// 90th percentile.
    pub p90: T,
    /// 99th percentile.
    pub p99: T,
    /// 99.9th percentile.
    pub p999: T,
    /// Maximum.
    pub max: T,
}

impl<T> Quantiles<T> {
    /// Applies `f` to every field, e.g. `q.map(|ticks| calib.ticks_to_ns(ticks))`.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> Quantiles<U> {
        Quantiles {
            p50: f(self.p50),
            p90: f(self.p90),
            p99: f(self.p99),
            p999: f(self.p999),
            max: f(self.max),
        }
    }
}

// ---------------------------------------------------------------------------
// InstanceStats
// ---------------------------------------------------------------------------

/// Number of valid op kinds; valid op kinds are `1..=OP_KINDS`.
pub const OP_KINDS: usize = 7;

/// Distinct producer threads are tracked exactly up to this many per op kind;
/// beyond it the set stops growing and is flagged as saturated.
pub const DISTINCT_THREADS_CAP: usize = 4096;

/// Observation flag bit: the operation was contended. Mirrors
/// `Observation::FLAG_CONTENDED = 1` in `crate::observation`.
const FLAG_CONTENDED: u16 = 1;
/// Observation flag bit: the operation missed / found nothing. Mirrors
/// `Observation::FLAG_MISS = 2` in `crate::observation`.
const FLAG_MISS: u16 = 2;
/// Observation flag bit: `latency_ticks` counts uncontended operations.
/// Mirrors `Observation::FLAG_COUNT = 4` in `crate::observation`.
const FLAG_COUNT: u16 = 4;

/// `OpStats::last_thread` before any thread was seen (no `u32` equals it).
const NO_THREAD: u64 = u64::MAX;

/// The largest latency seen, with the producer thread that reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MaxLatency {
    /// The latency, in ticks.
    pub ticks: u64,
    /// `producer_thread_id` of the observation that carried it (the first
    /// one, on ties).
    pub thread_id: u32,
}

/// Number of distinct producer threads seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DistinctThreads {
    /// Exact count while `saturated` is false; otherwise the cap, and the
    /// true count is larger.
    pub count: usize,
    /// Whether more distinct threads were seen than could be tracked.
    pub saturated: bool,
}

/// Sorted set of thread ids, capped at `DISTINCT_THREADS_CAP`.
#[derive(Clone, Debug, Default)]
struct ThreadSet {
    ids: Vec<u32>,
    saturated: bool,
}

impl ThreadSet {
    const fn new() -> Self {
        Self {
            ids: Vec::new(),
            saturated: false,
        }
    }

    fn insert(&mut self, id: u32) {
        if let Err(pos) = self.ids.binary_search(&id) {
            if self.ids.len() < DISTINCT_THREADS_CAP {
                self.ids.insert(pos, id);
            } else {
                self.saturated = true;
            }
        }
    }

    fn union(&mut self, other: &ThreadSet) {
        self.saturated |= other.saturated;
        if other.ids.is_empty() {
            return;
        }
        let mut merged = Vec::with_capacity(self.ids.len() + other.ids.len());
        let (mut a, mut b) = (self.ids.iter().peekable(), other.ids.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&x), Some(&&y)) if x < y => a.next(),
                (Some(&&x), Some(&&y)) if x > y => b.next(),
                (Some(_), Some(_)) => {
                    b.next();
                    a.next()
                }
                (Some(_), None) => a.next(),
                (None, Some(_)) => b.next(),
                (None, None) => break,
            };
            merged.extend(next.copied());
        }
        if merged.len() > DISTINCT_THREADS_CAP {
            merged.truncate(DISTINCT_THREADS_CAP);
            self.saturated = true;
        }
        self.ids = merged;
    }

    fn distinct(&self) -> DistinctThreads {
        DistinctThreads {
            count: self.ids.len(),
            saturated: self.saturated,
        }
    }
}

/// Statistics of one op kind of one instance (see [`InstanceStats::op`]).
#[derive(Clone, Debug)]
pub struct OpStats {
    ops: u64,
    contended: u64,
    misses: u64,
    /// Last producer thread seen, or `NO_THREAD`; the thread set is only
    /// consulted when this changes.
    last_thread: u64,
    /// Thread that produced `latency.max()`.
    max_thread: u32,
    /// Non-zero latencies; allocated on the first one.
    latency: Option<Box<LatencyHistogram>>,
    threads: ThreadSet,
}

impl OpStats {
    const fn new() -> Self {
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
    fn record(&mut self, flags: u16, latency_ticks: u64, thread_id: u32) {
        if flags & FLAG_COUNT != 0 {
            return self.record_count(latency_ticks, thread_id);
        }
        self.ops += 1;
        self.contended += u64::from(flags & FLAG_CONTENDED);
        self.misses += u64::from((flags & FLAG_MISS) >> 1);
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

    /// A [`FLAG_COUNT`] observation: `count` uncontended operations, no
    /// latency. Saturates rather than trusting a hostile count.
    #[inline(never)]
    fn record_count(&mut self, count: u64, thread_id: u32) {
        self.ops = self.ops.saturating_add(count);
        if u64::from(thread_id) != self.last_thread {
            self.thread_changed(thread_id);
        }
    }

    #[cold]
    #[inline(never)]
    fn thread_changed(&mut self, thread_id: u32) {
        self.last_thread = u64::from(thread_id);
        self.threads.insert(thread_id);
    }

    fn merge(&mut self, other: &OpStats) {
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

    fn delta_since(&self, earlier: &OpStats) -> OpDelta {
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
    /// [`DISTINCT_THREADS_CAP`]; incomplete if saturated).
    pub fn thread_ids(&self) -> &[u32] {
        &self.threads.ids
    }

    fn heap_bytes(&self) -> usize {
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
fn new_boxed_histogram() -> Box<LatencyHistogram> {
    Box::new(LatencyHistogram::new())
}

/// Everything accumulated about one instrumented instance.
///
/// Fed by [`Self::record`] (one call per observation) and [`Self::touch`]
/// (once per drained batch). See the [module documentation](self).
#[derive(Clone, Debug, Default)]
pub struct InstanceStats {
    ops: [OpStats; OP_KINDS],
    invalid_op_kind: u64,
    drops_attributed: u64,
    first_seen_ns: Option<u64>,
    last_seen_ns: Option<u64>,
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

fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn merged_histogram<'a>(hists: impl Iterator<Item = &'a LatencyHistogram>) -> Option<LatencyHistogram> {
    let mut out: Option<LatencyHistogram> = None;
    for h in hists {
        match &mut out {
            Some(o) => o.merge(h),
            None => out = Some(h.clone()),
        }
    }
    out
}

fn max_with_kind(maxima: impl Iterator<Item = (u16, Option<MaxLatency>)>) -> Option<(u16, MaxLatency)> {
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

// ---------------------------------------------------------------------------
// Windows
// ---------------------------------------------------------------------------

/// Per-op-kind part of a [`StatsDelta`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpDelta {
    /// Operations in the window.
    pub ops: u64,
    /// Contended operations in the window.
    pub contended: u64,
    /// Miss / empty operations in the window.
    pub misses: u64,
    /// Histogram of the latencies recorded in the window, `None` if none.
    pub latency: Option<Box<LatencyHistogram>>,
    /// The overall maximum latency and its thread, if it was set during the
    /// window (the window's own maximum is then exactly this); `None`
    /// otherwise.
    pub new_max_latency: Option<MaxLatency>,
}

/// Difference between two snapshots of an [`InstanceStats`]; see
/// [`InstanceStats::delta_since`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsDelta {
    /// Per op kind; index `op_kind - 1`.
    pub ops: [OpDelta; OP_KINDS],
    /// Observations with an invalid op kind in the window.
    pub invalid_op_kind: u64,
    /// Drops attributed in the window.
    pub drops_attributed: u64,
}

impl StatsDelta {
    /// Delta of op kind `op_kind` (`1..=7`), `None` for invalid kinds.
    pub fn op(&self, op_kind: u16) -> Option<&OpDelta> {
        self.ops.get(usize::from(op_kind.wrapping_sub(1)))
    }

    /// Operations of all valid op kinds in the window.
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().map(|o| o.ops).sum()
    }

    /// Window latency histogram over all op kinds, `None` if empty.
    pub fn latency(&self) -> Option<LatencyHistogram> {
        merged_histogram(self.ops.iter().filter_map(|o| o.latency.as_deref()))
    }

    /// Per-second rates for a window that lasted `elapsed_ns` nanoseconds
    /// (all rates are 0.0 when `elapsed_ns == 0`).
    pub fn rates(&self, elapsed_ns: u64) -> WindowRates {
        let per_sec = |n: u64| {
            if elapsed_ns == 0 {
                0.0
            } else {
                n as f64 * 1e9 / elapsed_ns as f64
            }
        };
        let mut ops = [OpRates::default(); OP_KINDS];
        for (r, d) in ops.iter_mut().zip(&self.ops) {
            *r = OpRates {
                ops: d.ops,
                ops_per_sec: per_sec(d.ops),
                contended_per_sec: per_sec(d.contended),
                misses_per_sec: per_sec(d.misses),
                latency: d.latency.as_ref().map(|h| h.quantiles()),
                new_max_latency: d.new_max_latency,
            };
        }
        WindowRates {
            elapsed_ns,
            ops,
            ops_per_sec: per_sec(self.total_ops()),
            contended_per_sec: per_sec(self.ops.iter().map(|o| o.contended).sum()),
            misses_per_sec: per_sec(self.ops.iter().map(|o| o.misses).sum()),
            drops_per_sec: per_sec(self.drops_attributed),
            invalid_per_sec: per_sec(self.invalid_op_kind),
            latency: self.latency().map(|h| h.quantiles()),
            new_max_latency: max_with_kind((1u16..).zip(self.ops.iter().map(|o| o.new_max_latency))),
        }
    }
}

/// Per-op-kind part of [`WindowRates`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpRates {
    /// Operations in the window (so callers can skip idle op kinds).
    pub ops: u64,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Contended operations per second.
    pub contended_per_sec: f64,
    /// Miss / empty operations per second.
    pub misses_per_sec: f64,
    /// Latency quantiles (ticks) of the window, `None` if no latency was
    /// recorded in it.
    pub latency: Option<Quantiles>,
    /// See [`OpDelta::new_max_latency`].
    pub new_max_latency: Option<MaxLatency>,
}

/// Rates over one window; see [`StatsDelta::rates`] and [`StatsWindow`].
#[derive(Clone, Debug, PartialEq)]
pub struct WindowRates {
    /// Length of the window.
    pub elapsed_ns: u64,
    /// Per op kind; index `op_kind - 1` (see [`Self::op`]).
    pub ops: [OpRates; OP_KINDS],
    /// Operations per second, all valid op kinds.
    pub ops_per_sec: f64,
    /// Contended operations per second, all op kinds.
    pub contended_per_sec: f64,
    /// Miss / empty operations per second, all op kinds.
    pub misses_per_sec: f64,
    /// Attributed drops per second.
    pub drops_per_sec: f64,
    /// Observations with an invalid op kind per second.
    pub invalid_per_sec: f64,
    /// Latency quantiles (ticks) of the window over all op kinds.
    pub latency: Option<Quantiles>,
    /// `(op_kind, max)` if the all-time maximum latency was raised during
    /// the window.
    pub new_max_latency: Option<(u16, MaxLatency)>,
}

impl WindowRates {
    /// Rates of op kind `op_kind` (`1..=7`), `None` for invalid kinds.
    pub fn op(&self, op_kind: u16) -> Option<&OpRates> {
        self.ops.get(usize::from(op_kind.wrapping_sub(1)))
    }
}

/// Keeps the previous snapshot of an [`InstanceStats`] to report one
/// [`WindowRates`] per call to [`Self::advance`].
#[derive(Clone, Debug)]
pub struct StatsWindow {
    baseline: InstanceStats,
    baseline_ns: u64,
}

impl StatsWindow {
    /// A window starting at `start_ns` from empty statistics (use for an
    /// instance created at `start_ns`).
    pub fn new(start_ns: u64) -> Self {
        Self {
            baseline: InstanceStats::new(),
            baseline_ns: start_ns,
        }
    }

    /// A window starting at `now_ns` from the current state of `stats`.
    pub fn starting_at(stats: &InstanceStats, now_ns: u64) -> Self {
        Self {
            baseline: stats.clone(),
            baseline_ns: now_ns,
        }
    }

    /// Closes the current window at `now_ns` with `current` (the same
    /// instance's statistics, now), returns its rates, and starts the next
    /// window there.
    pub fn advance(&mut self, current: &InstanceStats, now_ns: u64) -> WindowRates {
        let rates = current
            .delta_since(&self.baseline)
            .rates(now_ns.saturating_sub(self.baseline_ns));
        self.baseline.clone_from(current);
        self.baseline_ns = now_ns;
        rates
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64* PRNG.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        /// Uniform in (0, 1].
        fn unit(&mut self) -> f64 {
            ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }
    }

    const QS: [f64; 16] = [
        0.0, 0.0001, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 0.99999, 1.0,
    ];

    fn exact_quantile(sorted: &[u64], q: f64) -> u64 {
        let n = sorted.len() as u64;
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        sorted[rank as usize - 1]
    }

    /// Checks every quantile of `QS` against the exact one; returns the
    /// largest relative error seen for in-range values.
    fn check_against_exact(name: &str, values: &[u64]) -> f64 {
        let mut h = LatencyHistogram::new();
        for &v in values {
            h.record(v);
        }
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        assert_eq!(h.count(), values.len() as u64);
        assert_eq!(h.min(), sorted[0], "{name}: min");
        assert_eq!(h.max(), *sorted.last().unwrap(), "{name}: max");
        let exact_sum = values.iter().fold(0u64, |a, &v| a.saturating_add(v));
        assert_eq!(h.sum(), exact_sum, "{name}: sum");
        let mut worst = 0.0f64;
        for q in QS {
            let exact = exact_quantile(&sorted, q);
            let got = h.value_at_quantile(q);
            if exact <= LatencyHistogram::HIGHEST_TRACKABLE {
                if exact < 32 {
                    assert_eq!(got, exact, "{name}: small value at q={q}");
                }
                let err = got.abs_diff(exact) as f64 / exact.max(1) as f64;
                worst = worst.max(err);
                assert!(
                    err < LatencyHistogram::MAX_RELATIVE_ERROR,
                    "{name}: q={q} exact={exact} got={got} err={err}"
                );
            } else {
                // Clamped into the top bucket: reported within it, or as max.
                let (top_low, _) = LatencyHistogram::bucket_bounds(LatencyHistogram::BUCKETS - 1);
                assert!(got >= top_low && got <= h.max(), "{name}: q={q} got={got}");
            }
        }
        let q = h.quantiles();
        assert_eq!(q.max, h.max());
        assert_eq!(q.p50, h.value_at_quantile(0.5));
        assert_eq!(q.p999, h.value_at_quantile(0.999));
        eprintln!("{name}: worst relative error {:.4}%", worst * 100.0);
        worst
    }

    fn distributions() -> Vec<(&'static str, Vec<u64>)> {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let n = 200_000;
        let mut d = Vec::new();
        d.push(("uniform small", (0..n).map(|_| rng.below(100)).collect()));
        d.push(("uniform 10k", (0..n).map(|_| rng.below(10_000)).collect()));
        d.push(("uniform to 2^40", (0..n).map(|_| rng.below(1 << 40)).collect()));
        d.push((
            "exponential mean 5000",
            (0..n).map(|_| (-rng.unit().ln() * 5000.0) as u64).collect(),
        ));
        d.push((
            "pareto alpha 1.1",
            (0..n)
                .map(|_| (100.0 / rng.unit().powf(1.0 / 1.1)) as u64)
                .collect(),
        ));
        d.push((
            "log-uniform 1..2^39",
            (0..n).map(|_| 2f64.powf(rng.unit() * 39.0) as u64).collect(),
        ));
        d.push((
            "near 2^40",
            (0..n).map(|_| (1u64 << 40) - 1 - rng.below(1 << 36)).collect(),
        ));
        d.push((
            "log-uniform to 2^46 (clamped tail)",
            (0..n).map(|_| 2f64.powf(rng.unit() * 46.0) as u64).collect(),
        ));
        d.push(("u64::MAX mixed", {
            let mut v: Vec<u64> = (0..n).map(|_| rng.below(1000) + 1).collect();
            v.push(u64::MAX);
            v.push(1 << 50);
            v
        }));
        d
    }

    #[test]
    fn size_is_small() {
        assert_eq!(LatencyHistogram::BUCKETS, 592);
        assert_eq!(size_of::<LatencyHistogram>(), 592 * 8 + 32);
        assert!(size_of::<LatencyHistogram>() <= 8 * 1024);
        assert!(
            size_of::<InstanceStats>() <= 1024,
            "{}",
            size_of::<InstanceStats>()
        );
        eprintln!(
            "LatencyHistogram: {} bytes, InstanceStats: {} bytes, OpStats: {} bytes",
            size_of::<LatencyHistogram>(),
            size_of::<InstanceStats>(),
            size_of::<OpStats>()
        );
    }

    #[test]
    fn bucket_layout_is_contiguous_and_tight() {
        let mut expected_low = 0u64;
        for index in 0..LatencyHistogram::BUCKETS {
            let (low, high) = LatencyHistogram::bucket_bounds(index);
            assert_eq!(low, expected_low, "bucket {index}");
            assert!(high >= low);
            assert_eq!(LatencyHistogram::bucket_index(low), index);
            assert_eq!(LatencyHistogram::bucket_index(high), index);
            if index < 32 {
                assert_eq!((low, high), (index as u64, index as u64));
            } else {
                // Width is 1/16 of the power of two the bucket lives in.
                let width = high - low + 1;
                assert!(width.is_power_of_two());
                assert!(width * 16 <= low, "bucket {index}: {low}..={high}");
                let rep = LatencyHistogram::bucket_representative(index);
                // Relative to the value itself, at both ends of the bucket.
                let err = ((rep - low) as f64 / low as f64).max((high - rep) as f64 / high as f64);
                assert!(err < LatencyHistogram::MAX_RELATIVE_ERROR);
            }
            expected_low = high + 1;
        }
        assert_eq!(expected_low, 1 << 40);
        assert_eq!(
            LatencyHistogram::bucket_index(u64::MAX),
            LatencyHistogram::BUCKETS - 1
        );
        assert_eq!(
            LatencyHistogram::bucket_index(1 << 40),
            LatencyHistogram::BUCKETS - 1
        );
        // Spot values.
        assert_eq!(LatencyHistogram::bucket_index(0), 0);
        assert_eq!(LatencyHistogram::bucket_index(15), 15);
        assert_eq!(LatencyHistogram::bucket_index(16), 16);
        assert_eq!(LatencyHistogram::bucket_index(31), 31);
        assert_eq!(LatencyHistogram::bucket_index(32), 32);
        assert_eq!(LatencyHistogram::bucket_index(33), 32);
        assert_eq!(LatencyHistogram::bucket_index(34), 33);
        assert_eq!(LatencyHistogram::bucket_bounds(32), (32, 33));
        assert_eq!(LatencyHistogram::bucket_bounds(48), (64, 67));
    }

    #[test]
    fn small_values_are_exact() {
        let mut h = LatencyHistogram::new();
        for v in 0..32u64 {
            h.record_n(v, v + 1);
        }
        let buckets: Vec<Bucket> = h.buckets().collect();
        assert_eq!(buckets.len(), 32);
        for (v, b) in buckets.iter().enumerate() {
            let v = v as u64;
            assert_eq!(
                *b,
                Bucket {
                    low: v,
                    high: v,
                    count: v + 1
                }
            );
        }
        // Every quantile of values < 32 is exact.
        let mut sorted = Vec::new();
        for v in 0..32u64 {
            sorted.extend(std::iter::repeat_n(v, v as usize + 1));
        }
        for i in 0..=1000 {
            let q = i as f64 / 1000.0;
            assert_eq!(h.value_at_quantile(q), exact_quantile(&sorted, q), "q={q}");
        }
    }

    #[test]
    fn representative_error_is_bounded_for_every_value() {
        // Exhaustive over a range, then random samples up to 2^40.
        let mut worst = 0.0f64;
        let mut check = |v: u64| {
            let rep = LatencyHistogram::bucket_representative(LatencyHistogram::bucket_index(v));
            let err = rep.abs_diff(v) as f64 / v as f64;
            worst = worst.max(err);
            assert!(err < LatencyHistogram::MAX_RELATIVE_ERROR, "v={v} rep={rep}");
        };
        for v in 1..300_000 {
            check(v);
        }
        let mut rng = Rng(7);
        for _ in 0..300_000 {
            let bits = rng.below(41) as u32;
            check((rng.next_u64() >> (64 - bits.max(1))).max(1));
        }
        for e in 5..40 {
            check(1 << e);
            check((1 << e) - 1);
        }
        eprintln!("per-value worst relative error {:.6}%", worst * 100.0);
        assert!(worst > 0.03, "bound should be nearly reached: {worst}");
    }

    #[test]
    fn quantiles_within_error_bound_for_distributions() {
        let mut worst = 0.0f64;
        for (name, values) in distributions() {
            worst = worst.max(check_against_exact(name, &values));
        }
        eprintln!("overall worst quantile relative error {:.4}%", worst * 100.0);
        assert!(worst < LatencyHistogram::MAX_RELATIVE_ERROR);
    }

    #[test]
    fn clamped_values_keep_exact_max() {
        let mut h = LatencyHistogram::new();
        h.record(5);
        h.record(u64::MAX);
        h.record(1 << 45);
        assert_eq!(h.max(), u64::MAX);
        assert_eq!(h.min(), 5);
        assert_eq!(h.value_at_quantile(1.0), u64::MAX);
        assert_eq!(h.value_at_quantile(0.0), 5);
        assert_eq!(h.sum(), u64::MAX, "sum saturates");
        let top = h.buckets().last().unwrap();
        assert_eq!(top.count, 2);
        assert_eq!(top.high, LatencyHistogram::HIGHEST_TRACKABLE);
        // Middle sample (1<<45) is clamped into the top bucket.
        let mid = h.value_at_quantile(0.5);
        assert_eq!(
            mid,
            LatencyHistogram::bucket_representative(LatencyHistogram::BUCKETS - 1)
        );
    }

    #[test]
    fn empty_and_edge_quantiles() {
        let mut h = LatencyHistogram::new();
        assert!(h.is_empty());
        assert_eq!(h.value_at_quantile(0.5), 0);
        assert_eq!((h.min(), h.max(), h.mean()), (0, 0, 0.0));
        assert_eq!(h.quantiles(), Quantiles::default());
        h.record(1000);
        for q in [-1.0, 0.0, 0.5, 1.0, 2.0, f64::NAN, f64::INFINITY] {
            assert_eq!(h.value_at_quantile(q), 1000, "q={q}");
        }
        h.record_n(7, 0);
        assert_eq!((h.count(), h.min()), (1, 1000));
        h.record_n(2000, 3);
        assert_eq!(h.count(), 4);
        assert_eq!(h.sum(), 7000);
        assert_eq!(h.mean(), 1750.0);
        h.reset();
        assert_eq!(h, LatencyHistogram::new());
    }

    #[test]
    fn merge_equals_union() {
        let mut rng = Rng(42);
        let a: Vec<u64> = (0..50_000).map(|_| rng.below(1 << 20)).collect();
        let b: Vec<u64> = (0..30_000).map(|_| (-rng.unit().ln() * 1e6) as u64).collect();
        let (mut ha, mut hb, mut hu) = (
            LatencyHistogram::new(),
            LatencyHistogram::new(),
            LatencyHistogram::new(),
        );
        for &v in &a {
            ha.record(v);
            hu.record(v);
        }
        for &v in &b {
            hb.record(v);
            hu.record(v);
        }
        let mut merged = ha.clone();
        merged.merge(&hb);
        assert_eq!(merged, hu);
        assert_eq!(merged.quantiles(), hu.quantiles());
        // Merging an empty histogram is the identity, both ways.
        let mut e = LatencyHistogram::new();
        e.merge(&ha);
        assert_eq!(e, ha);
        let mut a2 = ha.clone();
        a2.merge(&LatencyHistogram::new());
        assert_eq!(a2, ha);
    }

    #[test]
    fn saturating_sub_gives_window() {
        let mut rng = Rng(3);
        let first: Vec<u64> = (0..40_000).map(|_| rng.below(100_000) + 1).collect();
        let second: Vec<u64> = (0..25_000).map(|_| rng.below(50_000) + 200).collect();
        let mut h = LatencyHistogram::new();
        let mut window_only = LatencyHistogram::new();
        for &v in &first {
            h.record(v);
        }
        let snapshot = h.clone();
        for &v in &second {
            h.record(v);
            window_only.record(v);
        }
        let w = h.saturating_sub(&snapshot);
        assert_eq!(w.count(), 25_000);
        assert_eq!(w.sum(), window_only.sum());
        assert!(w.buckets().eq(window_only.buckets()));
        // Max/min were not new records: estimated within the error bound.
        let rel = |a: u64, b: u64| a.abs_diff(b) as f64 / b as f64;
        assert!(rel(w.max(), window_only.max()) < LatencyHistogram::MAX_RELATIVE_ERROR);
        assert!(rel(w.min(), window_only.min()) < LatencyHistogram::MAX_RELATIVE_ERROR);
        let mut sorted = second.clone();
        sorted.sort_unstable();
        for q in QS {
            let exact = exact_quantile(&sorted, q);
            let got = w.value_at_quantile(q);
            assert!(
                rel(got, exact) < LatencyHistogram::MAX_RELATIVE_ERROR,
                "q={q} exact={exact} got={got}"
            );
        }
        // A new max in the window is exact.
        let snap2 = h.clone();
        h.record(10_000_000);
        h.record(300);
        let w2 = h.saturating_sub(&snap2);
        assert_eq!((w2.count(), w2.max()), (2, 10_000_000));
        assert_eq!(w2.value_at_quantile(1.0), 10_000_000);
        // 300 is not a new all-time minimum: estimated by its bucket.
        let min_est = w2.value_at_quantile(0.0);
        assert_eq!(
            min_est,
            LatencyHistogram::bucket_representative(LatencyHistogram::bucket_index(300))
        );
        assert!(rel(min_est, 300) < LatencyHistogram::MAX_RELATIVE_ERROR);
        // Empty window, and the first window (earlier empty) is exact.
        assert!(h.saturating_sub(&h).is_empty());
        assert_eq!(h.saturating_sub(&LatencyHistogram::new()), h);
        // Not-actually-earlier input saturates instead of wrapping.
        assert!(snapshot.saturating_sub(&h).is_empty());
    }

    #[test]
    fn quantiles_map_converts_units() {
        let q = Quantiles {
            p50: 30,
            p90: 60,
            p99: 90,
            p999: 300,
            max: 3000,
        };
        let ns = q.map(|ticks| ticks as f64 / 3.0);
        assert_eq!(
            ns,
            Quantiles {
                p50: 10.0,
                p90: 20.0,
                p99: 30.0,
                p999: 100.0,
                max: 1000.0
            }
        );
    }

    #[test]
    fn matches_hdrhistogram_reference() {
        use hdrhistogram::Histogram;
        // hdrhistogram with 3 significant digits reports the highest
        // equivalent value of its bucket: relative error <= 2^-10 above exact.
        let hdr_err = 1.0 / 1024.0;
        let mut worst = 0.0f64;
        let mut compared = 0;
        for (name, values) in distributions() {
            let mut ours = LatencyHistogram::new();
            let mut hdr = Histogram::<u64>::new_with_bounds(1, 1 << 41, 3).unwrap();
            for &v in values
                .iter()
                .filter(|&&v| v <= LatencyHistogram::HIGHEST_TRACKABLE)
            {
                // hdrhistogram's lowest discernible value is 1: feed both
                // the same data, with 0 raised to 1.
                let v = v.max(1);
                ours.record(v);
                hdr.record(v).unwrap();
            }
            compared += 1;
            assert_eq!(ours.count(), hdr.len(), "{name}");
            // hdrhistogram reports min/max as the edges of their buckets.
            let near =
                |exact: u64, hdr_value: u64| exact.abs_diff(hdr_value) as f64 <= exact as f64 * hdr_err;
            assert!(near(ours.max(), hdr.max()), "{name}");
            assert!(near(ours.min(), hdr.min()), "{name}");
            for q in QS {
                let a = ours.value_at_quantile(q);
                let b = hdr.value_at_quantile(q);
                let err = a.abs_diff(b) as f64 / b as f64;
                worst = worst.max(err);
                assert!(
                    err <= LatencyHistogram::MAX_RELATIVE_ERROR + hdr_err,
                    "{name}: q={q} ours={a} hdr={b}"
                );
            }
        }
        assert_eq!(compared, distributions().len());
        eprintln!("worst difference vs hdrhistogram {:.4}%", worst * 100.0);
    }

    // --- InstanceStats ----------------------------------------------------

    #[test]
    fn counts_per_op_kind_and_flags() {
        let mut s = InstanceStats::new();
        for i in 0..100u32 {
            s.record(1, 0, 0, 1);
            if i % 2 == 0 {
                s.record(2, FLAG_CONTENDED, 50, 1);
            }
            if i % 4 == 0 {
                s.record(7, FLAG_MISS, 0, 1);
            }
            if i % 10 == 0 {
                // Bits above FLAG_COUNT mean nothing (yet) and are ignored.
                s.record(3, FLAG_CONTENDED | FLAG_MISS | 0xfff8, 10, 1);
            }
        }
        let get = |k: u16| {
            let o = s.op(k).unwrap();
            (o.ops(), o.contended(), o.misses())
        };
        assert_eq!(get(1), (100, 0, 0));
        assert_eq!(get(2), (50, 50, 0));
        assert_eq!(get(3), (10, 10, 10));
        assert_eq!(get(7), (25, 0, 25));
        assert_eq!(get(4), (0, 0, 0));
        assert_eq!(s.total_ops(), 185);
        assert_eq!(s.total_contended(), 60);
        assert_eq!(s.total_misses(), 35);
        assert_eq!(s.invalid_op_kind(), 0);
        assert!(s.op(0).is_none() && s.op(8).is_none());
        let kinds: Vec<u16> = s.ops_by_kind().map(|(k, _)| k).collect();
        assert_eq!(kinds, vec![1, 2, 3, 4, 5, 6, 7]);
    }

    /// A `FLAG_COUNT` observation adds its count to the op and nothing
    /// else (other flags on it are ignored, no latency is recorded), its
    /// thread is seen, and a hostile count saturates instead of wrapping.
    #[test]
    fn count_observations_add_uncontended_operations() {
        let mut s = InstanceStats::new();
        s.record(1, 0, 0, 1);
        s.record(1, FLAG_COUNT, 64, 2);
        s.record(1, FLAG_COUNT | FLAG_CONTENDED | FLAG_MISS, 5, 3);
        s.record(1, FLAG_CONTENDED, 40, 1);
        let op = s.op(1).unwrap();
        assert_eq!((op.ops(), op.contended(), op.misses()), (71, 1, 0));
        assert_eq!(op.latency().unwrap().count(), 1, "only the real wait");
        assert_eq!(op.distinct_threads().count, 3);
        s.record(2, FLAG_COUNT, u64::MAX - 1, 1);
        s.record(2, FLAG_COUNT, 10, 1);
        assert_eq!(s.op(2).unwrap().ops(), u64::MAX);
        assert!(s.op(2).unwrap().latency().is_none());
    }

    #[test]
    fn invalid_op_kinds_are_only_counted() {
        let mut s = InstanceStats::new();
        for k in [0u16, 8, 9, 100, u16::MAX] {
            s.record(k, FLAG_CONTENDED | FLAG_MISS, 1234, 9);
        }
        assert_eq!(s.invalid_op_kind(), 5);
        assert_eq!(s.total_ops(), 0);
        assert_eq!(s.total_contended(), 0);
        assert_eq!(s.total_misses(), 0);
        assert!(s.latency().is_none());
        assert_eq!(s.distinct_threads(), DistinctThreads::default());
        assert!(!s.is_empty());
        assert_eq!(s.heap_bytes(), 0);
    }

    #[test]
    fn zero_latency_not_recorded_and_histograms_are_lazy() {
        let mut s = InstanceStats::new();
        s.record(1, 0, 0, 1);
        s.record(1, 0, 0, 1);
        assert!(s.op(1).unwrap().latency().is_none());
        assert!(s.op(1).unwrap().max_latency().is_none());
        assert!(s.max_latency().is_none());
        s.record(1, 0, 40, 1);
        s.record(1, 0, 0, 1);
        let h = s.op(1).unwrap().latency().unwrap();
        assert_eq!((h.count(), h.min(), h.max()), (1, 40, 40));
        assert_eq!(s.op(1).unwrap().ops(), 4);
        // Only op kind 1 has a histogram.
        assert!((2..=7).all(|k| s.op(k).unwrap().latency().is_none()));
        assert!(s.heap_bytes() >= size_of::<LatencyHistogram>());
        assert!(s.heap_bytes() < 2 * size_of::<LatencyHistogram>());
    }

    #[test]
    fn max_latency_with_thread() {
        let mut s = InstanceStats::new();
        s.record(2, 0, 100, 10);
        s.record(2, 0, 900, 11);
        s.record(2, 0, 900, 12); // tie: first producer kept
        s.record(2, 0, 500, 13);
        s.record(4, 0, 700, 14);
        s.record(4, 0, 5000, 15);
        s.record(4, 0, 0, 16);
        assert_eq!(
            s.op(2).unwrap().max_latency(),
            Some(MaxLatency {
                ticks: 900,
                thread_id: 11
            })
        );
        assert_eq!(
            s.max_latency(),
            Some((
                4,
                MaxLatency {
                    ticks: 5000,
                    thread_id: 15
                }
            ))
        );
        let all = s.latency().unwrap();
        assert_eq!((all.count(), all.max(), all.min()), (6, 5000, 100));
    }

    #[test]
    fn distinct_threads_exact_then_saturating() {
        let mut s = InstanceStats::new();
        // Batches per thread, threads revisited: still counted once.
        for _ in 0..3 {
            for t in [5u32, 3, 9, 3, 0, u32::MAX] {
                for _ in 0..10 {
                    s.record(1, 0, 1, t);
                }
            }
        }
        s.record(2, 0, 1, 77);
        let o = s.op(1).unwrap();
        assert_eq!(
            o.distinct_threads(),
            DistinctThreads {
                count: 5,
                saturated: false
            }
        );
        assert_eq!(o.thread_ids(), &[0, 3, 5, 9, u32::MAX]);
        assert_eq!(
            s.distinct_threads(),
            DistinctThreads {
                count: 6,
                saturated: false
            }
        );

        let mut big = InstanceStats::new();
        for t in 0..(DISTINCT_THREADS_CAP as u32 + 100) {
            big.record(3, 0, 0, t * 7);
        }
        assert_eq!(
            big.op(3).unwrap().distinct_threads(),
            DistinctThreads {
                count: DISTINCT_THREADS_CAP,
                saturated: true
            }
        );
        // Exactly at the cap is not saturated.
        let mut at_cap = InstanceStats::new();
        for t in 0..DISTINCT_THREADS_CAP as u32 {
            at_cap.record(3, 0, 0, t);
            at_cap.record(3, 0, 0, t);
        }
        assert_eq!(
            at_cap.op(3).unwrap().distinct_threads(),
            DistinctThreads {
                count: DISTINCT_THREADS_CAP,
                saturated: false
            }
        );
        // Union over the cap saturates; union of overlapping sets is exact.
        let mut other = InstanceStats::new();
        other.record(3, 0, 0, 1_000_000);
        let mut merged = at_cap.clone();
        merged.merge(&other);
        assert!(merged.op(3).unwrap().distinct_threads().saturated);
        let mut overlap = at_cap.clone();
        overlap.merge(&at_cap);
        assert_eq!(
            overlap.op(3).unwrap().distinct_threads(),
            DistinctThreads {
                count: DISTINCT_THREADS_CAP,
                saturated: false
            }
        );
    }

    #[test]
    fn touch_and_drops() {
        let mut s = InstanceStats::new();
        assert!(s.is_empty());
        assert_eq!((s.first_seen_ns(), s.last_seen_ns()), (None, None));
        s.touch(1000);
        s.touch(5000);
        s.touch(3000); // never moves back
        assert_eq!((s.first_seen_ns(), s.last_seen_ns()), (Some(1000), Some(5000)));
        s.add_attributed_drops(3);
        s.add_attributed_drops(4);
        assert_eq!(s.drops_attributed(), 7);
        assert!(!s.is_empty());
    }

    fn feed(s: &mut InstanceStats, rng: &mut Rng, n: usize) {
        for _ in 0..n {
            let kind = rng.below(9) as u16; // includes invalid 0 and 8
            let flags = rng.below(4) as u16;
            let lat = if rng.below(3) == 0 { 0 } else { rng.below(1 << 24) };
            let thread = rng.below(20) as u32;
            s.record(kind, flags, lat, thread);
        }
    }

    fn assert_same(a: &InstanceStats, b: &InstanceStats) {
        for k in 1..=7 {
            let (x, y) = (a.op(k).unwrap(), b.op(k).unwrap());
            assert_eq!(
                (x.ops(), x.contended(), x.misses()),
                (y.ops(), y.contended(), y.misses())
            );
            assert_eq!(x.latency(), y.latency(), "kind {k}");
            assert_eq!(x.max_latency().map(|m| m.ticks), y.max_latency().map(|m| m.ticks));
            assert_eq!(x.thread_ids(), y.thread_ids());
            assert_eq!(x.distinct_threads(), y.distinct_threads());
        }
        assert_eq!(a.invalid_op_kind(), b.invalid_op_kind());
        assert_eq!(a.drops_attributed(), b.drops_attributed());
        assert_eq!(a.first_seen_ns(), b.first_seen_ns());
        assert_eq!(a.last_seen_ns(), b.last_seen_ns());
    }

    #[test]
    fn instance_merge_equals_union() {
        let (mut a, mut b, mut u) = (InstanceStats::new(), InstanceStats::new(), InstanceStats::new());
        let mut rng = Rng(11);
        feed(&mut a, &mut rng, 20_000);
        a.touch(2000);
        a.add_attributed_drops(5);
        let mut rng = Rng(11);
        feed(&mut u, &mut rng, 20_000);
        let mut rng = Rng(12);
        feed(&mut b, &mut rng, 15_000);
        b.touch(1000);
        b.touch(1500);
        b.add_attributed_drops(2);
        let mut rng = Rng(12);
        feed(&mut u, &mut rng, 15_000);
        u.touch(1000);
        u.touch(2000);
        u.add_attributed_drops(7);
        let mut m = a.clone();
        m.merge(&b);
        assert_same(&m, &u);
        // Max thread follows the larger max.
        let mut x = InstanceStats::new();
        x.record(5, 0, 10, 1);
        let mut y = InstanceStats::new();
        y.record(5, 0, 20, 2);
        x.merge(&y);
        assert_eq!(
            x.max_latency(),
            Some((
                5,
                MaxLatency {
                    ticks: 20,
                    thread_id: 2
                }
            ))
        );
        let mut z = InstanceStats::new();
        z.merge(&y);
        assert_eq!(
            z.max_latency(),
            Some((
                5,
                MaxLatency {
                    ticks: 20,
                    thread_id: 2
                }
            ))
        );
    }

    #[test]
    fn window_rates_with_known_elapsed_time() {
        let mut s = InstanceStats::new();
        s.touch(0);
        for _ in 0..1000 {
            s.record(1, FLAG_CONTENDED, 100, 1);
        }
        s.add_attributed_drops(10);
        let mut w = StatsWindow::new(0);
        let r0 = w.advance(&s, 1_000_000_000);
        assert_eq!(r0.elapsed_ns, 1_000_000_000);
        assert_eq!(r0.ops_per_sec, 1000.0);
        assert_eq!(
            r0.new_max_latency,
            Some((
                1,
                MaxLatency {
                    ticks: 100,
                    thread_id: 1
                }
            ))
        );

        // Second window: 2 s long.
        for i in 0..4000u32 {
            s.record(1, 0, 200, 2);
            if i % 4 == 0 {
                s.record(2, FLAG_MISS | FLAG_CONTENDED, 0, 3);
            }
        }
        s.record(0, 0, 0, 0);
        s.record(9, 0, 0, 0);
        s.add_attributed_drops(40);
        let r = w.advance(&s, 3_000_000_000);
        assert_eq!(r.elapsed_ns, 2_000_000_000);
        assert_eq!(r.op(1).unwrap().ops, 4000);
        assert_eq!(r.op(1).unwrap().ops_per_sec, 2000.0);
        assert_eq!(r.op(1).unwrap().contended_per_sec, 0.0);
        assert_eq!(r.op(2).unwrap().ops_per_sec, 500.0);
        assert_eq!(r.op(2).unwrap().misses_per_sec, 500.0);
        assert_eq!(r.ops_per_sec, 2500.0);
        assert_eq!(r.contended_per_sec, 500.0);
        assert_eq!(r.misses_per_sec, 500.0);
        assert_eq!(r.drops_per_sec, 20.0);
        assert_eq!(r.invalid_per_sec, 1.0);
        // Window latency only covers this window's 200s, not the earlier 100s.
        let q = r.op(1).unwrap().latency.unwrap();
        assert_eq!(
            q.p50,
            LatencyHistogram::bucket_representative(LatencyHistogram::bucket_index(200)).clamp(100, 200)
        );
        assert_eq!(q.max, 200, "new max in window is exact");
        assert_eq!(r.latency.unwrap().max, 200);
        assert!(r.op(2).unwrap().latency.is_none());
        assert_eq!(
            r.new_max_latency,
            Some((
                1,
                MaxLatency {
                    ticks: 200,
                    thread_id: 2
                }
            ))
        );

        // Idle window.
        let idle = w.advance(&s, 4_000_000_000);
        assert_eq!(idle.ops_per_sec, 0.0);
        assert!(idle.latency.is_none());
        assert!(idle.new_max_latency.is_none());
        // Zero-length window: no division by zero.
        let z = s.delta_since(&InstanceStats::new()).rates(0);
        assert_eq!(z.ops_per_sec, 0.0);

        // delta_since directly.
        let d = s.delta_since(&InstanceStats::new());
        assert_eq!(d.total_ops(), 6000);
        assert_eq!(d.op(1).unwrap().contended, 1000);
        assert_eq!(d.invalid_op_kind, 2);
        assert_eq!(d.drops_attributed, 50);
        assert_eq!(d.latency().unwrap().count(), 5000);
        // A window started from the current state sees only what follows.
        let mut later = StatsWindow::starting_at(&s, 10_000_000_000);
        s.record(3, 0, 0, 1);
        s.record(3, 0, 0, 1);
        let r = later.advance(&s, 10_500_000_000);
        assert_eq!(r.elapsed_ns, 500_000_000);
        assert_eq!(r.ops_per_sec, 4.0);
        assert_eq!(r.op(3).unwrap().ops, 2);
        assert_eq!(r.op(1).unwrap().ops, 0);
    }
}
