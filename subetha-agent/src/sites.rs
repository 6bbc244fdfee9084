//! Per-call-site rows of an instance, as the agent reports them: the
//! drainer's [`SiteStats`] with ids resolved to `file:line:column` and ticks
//! converted to nanoseconds.
//!
//! Two views of the same waits (see `subetha_core::site_stats`): `waiter`
//! rows (the code that waited or missed: Go's block profile) and `holder`
//! rows (the code whose hold the wait ended behind: Go's mutex profile).
//! Sites are resolved through the drainer, which keeps what it resolved,
//! so a retired instance's rows keep their text.

use serde::{Deserialize, Serialize};
use subetha_core::clock::Calibration;
use subetha_core::site::{OVERFLOW, Site, SiteError};
use subetha_core::site_stats::SiteStats;

use crate::model::Quantiles;

/// Which view a row belongs to.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum SiteView {
    /// The operation's own call site.
    #[default]
    Waiter,
    /// The call site of the hold whose release ended the wait.
    Holder,
}

/// One row.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SiteReport {
    /// Waiter or holder.
    pub view: SiteView,
    /// Op kind of the operations.
    pub op: u16,
    /// Its name.
    pub op_name: String,
    /// `file:line:column`, or what is known instead (`<holder not sampled>`,
    /// `<site table full>`, `<bad site N: …>`).
    pub site: String,
    /// Source file ("" when not resolved).
    pub file: String,
    /// Line (0 when not resolved).
    pub line: u32,
    /// Waits counted on the row.
    pub contended: u64,
    /// Misses (waiter rows).
    pub misses: u64,
    /// Sum of the waits, ns.
    pub wait_total_ns: u64,
    /// Longest wait, ns.
    pub wait_max_ns: u64,
    /// Waits' quantiles, ns (waiter rows).
    pub wait_ns: Quantiles,
}

/// What an id names, as text: the site, or why there is none.
fn describe(view: SiteView, id: u16, resolved: Result<Site, SiteError>) -> (String, String, u32) {
    match (view, id, resolved) {
        (_, _, Ok(site)) => (site.to_string(), site.file, site.line),
        (SiteView::Holder, 0, _) => ("<holder not sampled>".into(), String::new(), 0),
        (_, 0, _) => ("<no site>".into(), String::new(), 0),
        (_, OVERFLOW, _) => ("<site table full>".into(), String::new(), 0),
        (_, id, Err(error)) => (format!("<bad site {id}: {error}>"), String::new(), 0),
    }
}

/// The rows of `stats`, ids resolved by `resolve`, op names by `op_name`.
pub fn site_reports(
    stats: &SiteStats,
    resolve: impl Fn(u16) -> Result<Site, SiteError>,
    op_name: impl Fn(u16) -> String,
    calibration: &Calibration,
) -> Vec<SiteReport> {
    let ns = |ticks: u64| calibration.ticks_to_ns(ticks);
    let mut rows = Vec::with_capacity(stats.waiters.len() + stats.holders.len());
    for (&(op, id), row) in &stats.waiters {
        let (site, file, line) = describe(SiteView::Waiter, id, resolve(id));
        let wait = row.wait.as_deref();
        rows.push(SiteReport {
            view: SiteView::Waiter,
            op,
            op_name: op_name(op),
            site,
            file,
            line,
            contended: row.contended,
            misses: row.misses,
            wait_total_ns: ns(row.wait_ticks()),
            wait_max_ns: wait.map_or(0, |h| ns(h.max())),
            wait_ns: wait
                .map(|h| Quantiles::from_ticks(h, calibration))
                .unwrap_or_default(),
        });
    }
    for (&(op, id), row) in &stats.holders {
        let (site, file, line) = describe(SiteView::Holder, id, resolve(id));
        rows.push(SiteReport {
            view: SiteView::Holder,
            op,
            op_name: op_name(op),
            site,
            file,
            line,
            contended: row.waits,
            misses: 0,
            wait_total_ns: ns(row.wait_ticks),
            wait_max_ns: ns(row.max_ticks),
            wait_ns: Quantiles::default(),
        });
    }
    rows
}
