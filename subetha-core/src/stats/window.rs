//! Windows: the difference of two snapshots of an [`InstanceStats`], and
//! its rates.

use super::*;
use super::{histogram::*, instance::*, op::*};

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
    pub latency: Option<LatencyQuantiles>,
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
    pub latency: Option<LatencyQuantiles>,
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
    pub(super) baseline: InstanceStats,
    pub(super) baseline_ns: u64,
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
