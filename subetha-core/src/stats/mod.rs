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
//!   bucket; `max` (and `sum`) still record the exact value. LatencyQuantiles that fall
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
//! [`LatencyQuantiles::map`].

use std::fmt;

mod histogram;
mod instance;
mod op;
#[cfg(test)]
mod tests;
mod threads;
mod window;

pub use histogram::{Bucket, LatencyHistogram, LatencyQuantiles};
pub use instance::InstanceStats;
pub use op::{MaxLatency, OpStats};
pub use threads::DistinctThreads;
pub use window::{OpDelta, OpRates, StatsDelta, StatsWindow, WindowRates};

/// Number of valid op kinds; valid op kinds are `1..=OP_KINDS`.
pub const OP_KINDS: usize = 7;

/// Distinct producer threads are tracked exactly up to this many per op kind;
/// beyond it the set stops growing and is flagged as saturated.
pub const DISTINCT_THREADS_CAP: usize = 4096;
