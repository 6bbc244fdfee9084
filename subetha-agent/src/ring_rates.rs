//! Each ring's push rate, learnt from what the scans find, and when the next
//! scan is due so that no steady producer's ring fills.
//!
//! After every scan of a process the agent hands [`RingRates::observe`] the
//! rings' cumulative counters. Drained plus dropped is every push a
//! producer attempted, so a ring's rate is the attempts since the previous
//! scan over the time between the two scans. The estimate rises at once to a
//! faster rate and falls by at most half per scan, so a single quiet scan
//! does not stretch the pause before a steady producer's next batch. The
//! next scan is due when the fastest ring would be a quarter full
//! ([`TARGET_FILL`]): a producer whose rate doubles, or a pause that
//! overruns twofold, still fits. The pause stays between the configured
//! shortest and longest, and is the shortest after a scan that left a ring
//! full. Idle rings leave it at the longest, so an idle agent pays only the
//! wake-ups of the longest pause (`tests/tests/agent_idle_cpu.rs` holds that
//! budget).
//!
//! What this cannot catch: a producer that goes from quiet to more than a
//! ring in less than one pause (nothing announced it), or that pushes a
//! ring-full faster than the shortest pause (no scan rate keeps up). Those
//! drop, are counted, and are storms with a measured rate and a fix
//! ([`crate::diagnosis`]).
//!
//! The demo's `--burst` run in `docs/performance.md` shows the effect.

use std::collections::HashMap;
use std::time::Duration;

use subetha_core::drain::RingRecord;

/// Share of a ring the fastest producer may fill before its next scan.
pub const TARGET_FILL: f64 = 0.25;
/// Rates below this (obs/s) count as idle.
const IDLE_RATE: f64 = 1.0;
/// Ring slots followed per process (a hostile ring table can claim more).
const MAX_SLOTS: usize = 1 << 16;

/// One ring's counters as a scan read them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCounts {
    /// When the scan that read them ended (CLOCK_MONOTONIC ns).
    pub at_ns: u64,
    /// Observations drained from the slot over its life.
    pub drained: u64,
    /// Drops in the slot over its life.
    pub dropped: u64,
}

impl RingCounts {
    /// Every push attempted: drained plus dropped.
    pub fn attempts(&self) -> u64 {
        self.drained.saturating_add(self.dropped)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct RingRate {
    /// The counters the scan before `previous` read.
    earlier: Option<RingCounts>,
    /// The counters the scan before `latest` read.
    previous: Option<RingCounts>,
    latest: RingCounts,
    /// Push attempts per second, estimated.
    per_sec: f64,
}

/// The push rates of every ring of every process the agent drains, and the
/// pause before the next scan they call for.
#[derive(Debug)]
pub struct RingRates {
    min: Duration,
    max: Duration,
    capacity: u64,
    rings: HashMap<u32, Vec<Option<RingRate>>>,
    pause: Duration,
    /// A ring was left full by the latest pass: scan again at the shortest.
    left_full: bool,
}

impl RingRates {
    /// Rates of rings holding `capacity` observations, for pauses between
    /// `min` and `max` (`max` below `min` is taken as `min`). Starts at `min`.
    pub fn new(min: Duration, max: Duration, capacity: u64) -> Self {
        Self {
            min,
            max: max.max(min),
            capacity: capacity.max(1),
            rings: HashMap::new(),
            pause: min,
            left_full: false,
        }
    }

    /// Learns from the rings of process `pid` as the scan that ended at
    /// `now_ns` left them.
    pub fn observe(&mut self, pid: u32, rings: &[RingRecord], now_ns: u64) {
        let table = self.rings.entry(pid).or_default();
        for ring in rings {
            let slot = ring.slot as usize;
            if slot >= MAX_SLOTS {
                continue;
            }
            if table.len() <= slot {
                table.resize(slot + 1, None);
            }
            let counts = RingCounts {
                at_ns: now_ns,
                drained: ring.slot_drained_total,
                dropped: ring.slot_dropped_total,
            };
            table[slot] = Some(match table[slot] {
                None => RingRate {
                    earlier: None,
                    previous: None,
                    latest: counts,
                    per_sec: 0.0,
                },
                Some(rate) => rate.next(counts),
            });
        }
    }

    /// Notes that a pass left `rings_left_full` rings full (its per-scan cap
    /// was hit): the next scan comes at the shortest pause.
    pub fn after_pass(&mut self, rings_left_full: u32) -> Duration {
        self.left_full = rings_left_full != 0;
        self.pause = self.planned_pause();
        self.pause
    }

    /// The pause before the next scan, as last planned.
    pub fn pause(&self) -> Duration {
        self.pause
    }

    /// Forgets a process.
    pub fn forget(&mut self, pid: u32) {
        self.rings.remove(&pid);
    }

    /// The counters of ring `slot` of `pid` at the last two scans (the scan
    /// before the latest, and the latest).
    pub fn last_two(&self, pid: u32, slot: u32) -> Option<(RingCounts, RingCounts)> {
        let rate = self.rings.get(&pid)?.get(slot as usize)?.as_ref()?;
        Some((rate.previous?, rate.latest))
    }

    /// Ring `slot` of `pid`'s push attempts per second between the two
    /// scans before the latest (what it did before the latest interval).
    pub fn rate_before_latest(&self, pid: u32, slot: u32) -> Option<f64> {
        let rate = self.rings.get(&pid)?.get(slot as usize)?.as_ref()?;
        let (earlier, previous) = (rate.earlier?, rate.previous?);
        let elapsed = previous.at_ns.checked_sub(earlier.at_ns).filter(|&ns| ns > 0)?;
        Some(previous.attempts().saturating_sub(earlier.attempts()) as f64 * 1e9 / elapsed as f64)
    }

    /// The fastest ring's estimated push rate, obs/s (0: every ring idle).
    pub fn fastest_per_sec(&self) -> f64 {
        self.rings
            .values()
            .flatten()
            .flatten()
            .map(|r| r.per_sec)
            .fold(0.0, f64::max)
    }

    fn planned_pause(&self) -> Duration {
        if self.left_full {
            return self.min;
        }
        let fastest = self.fastest_per_sec();
        if fastest < IDLE_RATE {
            return self.max;
        }
        let due = TARGET_FILL * self.capacity as f64 / fastest;
        Duration::from_secs_f64(due.min(self.max.as_secs_f64())).clamp(self.min, self.max)
    }
}

impl RingRate {
    fn next(self, counts: RingCounts) -> Self {
        let last = self.latest;
        // A counter that went backwards was rewritten (a new segment in
        // the slot, or a hostile one): start over from here.
        if counts.attempts() < last.attempts() || counts.at_ns <= last.at_ns {
            return Self {
                earlier: None,
                previous: None,
                latest: counts,
                per_sec: 0.0,
            };
        }
        let elapsed_s = (counts.at_ns - last.at_ns) as f64 / 1e9;
        let seen = (counts.attempts() - last.attempts()) as f64 / elapsed_s;
        let per_sec = if seen >= self.per_sec {
            seen
        } else {
            seen.max(self.per_sec / 2.0)
        };
        Self {
            earlier: self.previous,
            previous: Some(last),
            latest: counts,
            per_sec: if per_sec < IDLE_RATE { 0.0 } else { per_sec },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn ring(slot: u32, drained: u64, dropped: u64) -> RingRecord {
        let mut record = RingRecord::default();
        record.slot = slot;
        record.slot_drained_total = drained;
        record.slot_dropped_total = dropped;
        record
    }

    fn rates() -> RingRates {
        RingRates::new(Duration::from_micros(100), Duration::from_millis(20), 4096)
    }

    #[test]
    fn a_steady_ring_is_scanned_before_it_is_a_quarter_full() {
        let mut r = rates();
        // 200k obs/s: a quarter ring (1024) in 5.12 ms.
        for i in 0..10u64 {
            r.observe(1, &[ring(0, i * 2000, 0)], i * 10 * MS);
            r.after_pass(0);
        }
        assert_eq!(r.pause(), Duration::from_micros(5120));
        // The old pacer stayed at 20 ms, under which this ring overflows.
        assert!(r.pause().as_secs_f64() * 200_000.0 < 4096.0 / 2.0);
    }

    #[test]
    fn idle_rings_back_off_to_the_longest_pause_by_halves() {
        let mut r = rates();
        r.observe(1, &[ring(0, 0, 0), ring(1, 5, 0)], 0);
        r.after_pass(0);
        r.observe(1, &[ring(0, 4000, 0), ring(1, 5, 0)], MS); // 4 M/s
        assert_eq!(r.after_pass(0), Duration::from_micros(256));
        let mut pauses = Vec::new();
        let mut at = MS;
        for _ in 0..30 {
            at += r.pause().as_nanos() as u64;
            r.observe(1, &[ring(0, 4000, 0), ring(1, 5, 0)], at);
            pauses.push(r.after_pass(0));
        }
        // The estimate halves per quiet scan: the pause doubles, never jumps.
        assert_eq!(pauses[0], Duration::from_micros(512));
        assert_eq!(pauses[1], Duration::from_micros(1024));
        assert_eq!(*pauses.last().unwrap(), Duration::from_millis(20));
    }

    #[test]
    fn a_faster_rate_shortens_the_pause_at_once_down_to_the_shortest() {
        let mut r = rates();
        r.observe(7, &[ring(3, 0, 0)], 0);
        r.after_pass(0);
        r.observe(7, &[ring(3, 10, 0)], 20 * MS);
        assert_eq!(r.after_pass(0), Duration::from_millis(20));
        // 40k drained and 60k dropped in 1 ms: 100 M attempts/s.
        r.observe(7, &[ring(3, 40_010, 60_000)], 21 * MS);
        assert_eq!(r.after_pass(0), Duration::from_micros(100));
        assert!((r.fastest_per_sec() - 1e8).abs() < 1.0);
        let (before, after) = r.last_two(7, 3).unwrap();
        assert_eq!(after.attempts() - before.attempts(), 100_000);
        // Before the latest interval: 10 attempts in 20 ms.
        assert!((r.rate_before_latest(7, 3).unwrap() - 500.0).abs() < 1e-6);
    }

    #[test]
    fn a_ring_left_full_means_the_shortest_pause() {
        let mut r = rates();
        r.observe(1, &[ring(0, 0, 0)], 0);
        assert_eq!(r.after_pass(1), Duration::from_micros(100));
        assert_eq!(r.after_pass(0), Duration::from_millis(20));
    }

    #[test]
    fn rewritten_counters_and_forgotten_processes_start_over() {
        let mut r = rates();
        r.observe(1, &[ring(0, 1000, 0)], 0);
        r.observe(1, &[ring(0, 2_000_000, 0)], MS);
        assert!(r.fastest_per_sec() > 1e9);
        r.observe(1, &[ring(0, 5, 0)], 2 * MS);
        assert_eq!(r.fastest_per_sec(), 0.0);
        assert_eq!(r.last_two(1, 0), None);
        r.observe(1, &[ring(0, 1005, 0)], 3 * MS);
        assert!(r.fastest_per_sec() > 0.0);
        r.forget(1);
        assert_eq!(r.fastest_per_sec(), 0.0);
        // A hostile slot number is ignored, not allocated for.
        r.observe(2, &[ring(u32::MAX, 1, 1)], 0);
        assert!(r.rings.get(&2).is_some_and(Vec::is_empty));
    }
}
