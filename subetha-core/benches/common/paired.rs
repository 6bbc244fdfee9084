//! Paired per-round comparisons, shared by the benches that alternate
//! implementations in short rounds (`primitives`, `ring`).
//!
//! On the sessions' VMs a two-thread workload drifts between speed regimes
//! over seconds; two implementations run back to back in one round see
//! nearly the same regime, so the ratio of their round times is far
//! steadier than either time. Many short rounds then give the median
//! ratio a usable confidence interval.

/// The median of `values`, which it sorts.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// [`RatioSummary::verdict`] when the interval holds the target.
pub const SPANS: &str = "CI spans target";

/// The paired per-round ratios of one comparison, summarised.
#[derive(Clone, Copy, Debug)]
pub struct RatioSummary {
    pub median: f64,
    /// A distribution-free 95% confidence interval of the median: the
    /// order statistics `n/2 ∓ 0.98·√n` (the normal approximation to the
    /// binomial). It treats rounds as independent, which the VM's slow
    /// regime drift only approximates.
    pub ci: (f64, f64),
    pub min: f64,
    pub max: f64,
}

impl RatioSummary {
    /// Summarises `ratios` (at least one).
    pub fn of(mut ratios: Vec<f64>) -> Self {
        assert!(!ratios.is_empty(), "no rounds to summarise");
        // Sorts `ratios`, which the order statistics below rely on.
        let median = median(&mut ratios);
        let n = ratios.len();
        let half_width = 0.98 * (n as f64).sqrt();
        let at = |i: f64| ratios[(i.max(0.0) as usize).min(n - 1)];
        Self {
            median,
            ci: (
                at((n as f64 / 2.0 - half_width).floor()),
                at((n as f64 / 2.0 + half_width).ceil()),
            ),
            min: ratios[0],
            max: ratios[n - 1],
        }
    }

    /// Against a lower bound on the ratio: met when the whole interval is
    /// at or above it, missed when all of it is below.
    pub fn verdict(&self, target: f64) -> &'static str {
        if self.ci.0 >= target {
            "meets"
        } else if self.ci.1 < target {
            "MISSES"
        } else {
            SPANS
        }
    }
}
