//! [`LatencyHistogram`]: log-linear buckets of latencies in ticks, and the
//! [`LatencyQuantiles`] read from them.

use super::*;

/// log2 of the number of linear sub-buckets per power of two.
pub(super) const SUB_BUCKET_BITS: u32 = 4;
/// Linear sub-buckets per power of two.
pub(super) const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Values up to `2^MAX_VALUE_BITS - 1` are tracked with full resolution.
pub(super) const MAX_VALUE_BITS: u32 = 40;
/// Number of buckets: one per value below `2 * SUB_BUCKETS`, then
/// `SUB_BUCKETS` per power of two up to `2^MAX_VALUE_BITS`.
pub(super) const BUCKETS: usize = (MAX_VALUE_BITS - SUB_BUCKET_BITS + 1) as usize * SUB_BUCKETS;
/// Largest value that is not clamped.
pub(super) const HIGHEST_TRACKABLE: u64 = (1 << MAX_VALUE_BITS) - 1;

/// A fixed-size, mergeable log-linear histogram of `u64` values.
///
/// See the [module documentation](super) for the bucket layout and the error
/// bound. `min()`/`max()`/quantiles of an empty histogram are 0.
#[derive(Clone, PartialEq, Eq)]
#[repr(C)]
pub struct LatencyHistogram {
    pub(super) counts: [u64; BUCKETS],
    pub(super) count: u64,
    /// Saturating sum of the recorded (unclamped) values.
    pub(super) sum: u64,
    /// `u64::MAX` when empty.
    pub(super) min: u64,
    /// 0 when empty.
    pub(super) max: u64,
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
    pub(super) fn rank(&self, q: f64) -> u64 {
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        // `as` saturates; the clamp handles both ends.
        ((q * self.count as f64).ceil() as u64).clamp(1, self.count)
    }

    /// Value reported for the sample at 1-based `rank` (`1..=count`).
    pub(super) fn value_at_rank(&self, rank: u64) -> u64 {
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
    pub fn quantiles(&self) -> LatencyQuantiles {
        LatencyQuantiles {
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
    /// least `self.min()`). LatencyQuantiles of the result keep the
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
/// [`LatencyQuantiles::map`] converts them to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatencyQuantiles<T = u64> {
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

impl<T> LatencyQuantiles<T> {
    /// Applies `f` to every field, e.g. `q.map(|ticks| calib.ticks_to_ns(ticks))`.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> LatencyQuantiles<U> {
        LatencyQuantiles {
            p50: f(self.p50),
            p90: f(self.p90),
            p99: f(self.p99),
            p999: f(self.p999),
            max: f(self.max),
        }
    }
}
