//! Per-(instance, call site) statistics: what the consumer accumulates from
//! the site ids that contended and missed observations carry
//! ([`crate::site`]).
//!
//! Two views of the same waits, as Go's profiles have them:
//!
//! * **waiter rows** (the block view), keyed by `(op, site)` of the
//!   operation that waited or missed: contended count, misses, and the
//!   waits' histogram (sum, max, quantiles);
//! * **holder rows** (the mutex view), keyed by `(op, holder site)`: the
//!   same waits charged to the call site of the hold whose release ended
//!   them (site 0: the holder was not known, see `primitives::holder`).
//!
//! Rows are keyed by id, which is only meaningful with the segment that
//! issued it; consumers resolve ids to text through
//! [`Drainer::resolve_site`](crate::Drainer::resolve_site). Each view keeps
//! at most [`MAX_ROWS`] rows per instance (a hostile producer can send any
//! id); observations beyond it are counted in `overflowed`, never dropped
//! silently.

use std::collections::BTreeMap;

use crate::observation::Observation;
use crate::stats::LatencyHistogram;

/// Most rows per view per instance.
pub const MAX_ROWS: usize = 32;

/// One waiter row: an `(op, site)`'s waits and misses.
#[derive(Clone, Debug, Default)]
pub struct WaitRow {
    /// Operations that waited ([`Observation::FLAG_CONTENDED`]).
    pub contended: u64,
    /// Operations that missed ([`Observation::FLAG_MISS`]).
    pub misses: u64,
    /// Waits in ticks (contended operations with a latency).
    pub wait: Option<Box<LatencyHistogram>>,
}

impl WaitRow {
    /// Sum of the waits in ticks.
    pub fn wait_ticks(&self) -> u64 {
        self.wait.as_ref().map_or(0, |h| h.sum())
    }
}

/// One holder row: waits charged to the hold that ended them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HolderRow {
    /// Waits charged.
    pub waits: u64,
    /// Their sum in ticks (saturating).
    pub wait_ticks: u64,
    /// The longest, in ticks.
    pub max_ticks: u64,
}

/// Both views of one instance.
#[derive(Clone, Debug, Default)]
pub struct SiteStats {
    /// Waiter rows by `(op, site)`.
    pub waiters: BTreeMap<(u16, u16), WaitRow>,
    /// Holder rows by `(op, holder site)`.
    pub holders: BTreeMap<(u16, u16), HolderRow>,
    /// Observations that found a view full.
    pub overflowed: u64,
}

impl SiteStats {
    /// Adds an observation that carries a site word (`_reserved != 0`).
    #[cold]
    #[inline(never)]
    pub fn record(&mut self, obs: &Observation) {
        if obs.is_count() {
            return;
        }
        let site = obs.site_id();
        let contended = obs.is_contended();
        if site != 0 || contended {
            let full = self.waiters.len() >= MAX_ROWS;
            match self.waiters.get_mut(&(obs.op_kind, site)) {
                Some(row) => row.add(obs),
                None if full => self.overflowed += 1,
                None => self.waiters.entry((obs.op_kind, site)).or_default().add(obs),
            }
        }
        // Only a wait has a holder; the row of holder 0 is "not known".
        if contended && obs.latency_ticks != 0 {
            let key = (obs.op_kind, obs.holder_site_id());
            let full = self.holders.len() >= MAX_ROWS;
            match self.holders.get_mut(&key) {
                Some(row) => row.add(obs.latency_ticks),
                None if full => self.overflowed += 1,
                None => self.holders.entry(key).or_default().add(obs.latency_ticks),
            }
        }
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty() && self.holders.is_empty() && self.overflowed == 0
    }
}

impl WaitRow {
    fn add(&mut self, obs: &Observation) {
        self.contended += u64::from(obs.is_contended());
        self.misses += u64::from(obs.is_miss());
        if obs.is_contended() && obs.latency_ticks != 0 {
            self.wait
                .get_or_insert_with(|| Box::new(LatencyHistogram::new()))
                .record(obs.latency_ticks);
        }
    }
}

impl HolderRow {
    fn add(&mut self, ticks: u64) {
        self.waits += 1;
        self.wait_ticks = self.wait_ticks.saturating_add(ticks);
        self.max_ticks = self.max_ticks.max(ticks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::site::SiteWord;

    fn obs(op: u16, flags: u16, latency: u64, sites: SiteWord) -> Observation {
        Observation {
            _reserved: sites.0,
            ..Observation::new(1, op, flags, latency)
        }
    }

    #[test]
    fn waits_go_to_the_waiter_and_the_holder_rows() {
        let mut s = SiteStats::default();
        s.record(&obs(
            1,
            Observation::FLAG_CONTENDED,
            100,
            SiteWord::with_holder(3, 4),
        ));
        s.record(&obs(
            1,
            Observation::FLAG_CONTENDED,
            300,
            SiteWord::with_holder(3, 0),
        ));
        s.record(&obs(2, Observation::FLAG_MISS, 0, SiteWord::own(5)));
        let row = &s.waiters[&(1, 3)];
        assert_eq!((row.contended, row.misses, row.wait_ticks()), (2, 0, 400));
        assert_eq!(s.waiters[&(2, 5)].misses, 1);
        assert_eq!(
            s.holders[&(1, 4)],
            HolderRow {
                waits: 1,
                wait_ticks: 100,
                max_ticks: 100
            }
        );
        assert_eq!(s.holders[&(1, 0)].wait_ticks, 300, "holder not known");
        assert!(!s.holders.contains_key(&(2, 0)), "a miss has no holder");
    }

    #[test]
    fn rows_are_bounded_and_the_rest_counted() {
        let mut s = SiteStats::default();
        for site in 1..=(MAX_ROWS as u16 + 10) {
            s.record(&obs(
                1,
                Observation::FLAG_CONTENDED,
                5,
                SiteWord::with_holder(site, site),
            ));
        }
        assert_eq!(s.waiters.len(), MAX_ROWS);
        assert_eq!(s.holders.len(), MAX_ROWS);
        assert_eq!(s.overflowed, 20);
    }
}
