//! Why a ring dropped observations: turning what the kernel and the scanner
//! did around a storm into a cause with evidence.
//!
//! A ring drops when its producer outruns its consumer. Either the consumer
//! (the scanner thread) was not running — **preempted** (runnable, but
//! another task held its CPU), or **blocked** (asleep in the kernel beyond
//! its own pause between scans) — or it ran but could not keep up: a scan
//! lasted longer than the ring takes to fill (**scanner too slow**), its
//! pause between scans is longer than the ring takes to fill at this push
//! rate (**scan interval too long**), or it scanned back to back and the
//! producer still outran it (**producer burst**). A gap the agent's own
//! work between two scans mostly filled (publishing a snapshot, attaching
//! segments, reading the probes' events: the agent times each) is
//! **agent busy**. A gap far beyond the scanner's planned pause that
//! nothing observed explains is reported as **scanner stalled**, with low
//! confidence. Observations lost because their thread found every ring
//! slot taken by live threads are a storm of their own, **no ring**
//! ([`NO_RING`]): the agent names it from the segment's counter, with no
//! diagnosis to run.
//!
//! With the eBPF probes the scanner's off-CPU intervals come from
//! `sched_switch`/`sched_wakeup` (who held the CPU, in which state it
//! slept): those causes have `high` confidence. Without probes the agent
//! samples the scanner's `/proc/<tid>/schedstat` run delay and involuntary
//! context switches; a cause inferred from those is marked `low`.
//! [`diagnose`] is pure: it takes the facts and returns the verdict, so every
//! rule is unit-tested.

use crate::model::{Cause, Culprit, Interval, StormReport};

/// The cause kind of observations lost for want of a ring slot.
pub const NO_RING: &str = "no_ring";

/// A period the scanner thread spent off its CPU (from the sched probes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffCpu {
    /// Scanner thread id.
    pub tid: u32,
    /// CLOCK_MONOTONIC ns when it left the CPU.
    pub out_ns: u64,
    /// When it got back on.
    pub in_ns: u64,
    /// True if it left while runnable (preempted); false if it slept.
    pub preempted: bool,
    /// The sleep state bits at switch-out (0 when preempted).
    pub state: u64,
    /// When it was woken, if it slept.
    pub wakeup_ns: Option<u64>,
    /// CPU it left and CPU it came back on.
    pub cpu_out: u32,
    /// See `cpu_out`.
    pub cpu_in: u32,
    /// The task that held the CPU until it got back on.
    pub holder_pid: u32,
    /// Its command name.
    pub holder_comm: String,
    /// The kernel reported no tracepoint for the switch-in: `in_ns` is the
    /// scheduler's own record of it, read at the next switch-out, and the
    /// holder may be unknown (pid 0).
    pub switch_in_unseen: bool,
}

impl OffCpu {
    /// When it became runnable: at switch-out if preempted, else at wakeup.
    pub fn runnable_since(&self) -> u64 {
        if self.preempted {
            self.out_ns
        } else {
            self.wakeup_ns
                .unwrap_or(self.in_ns)
                .clamp(self.out_ns, self.in_ns)
        }
    }

    /// Time spent runnable but not running (runqueue wait), ns.
    pub fn runnable_wait_ns(&self) -> u64 {
        self.in_ns.saturating_sub(self.runnable_since())
    }

    /// Time spent asleep, ns (0 if preempted).
    pub fn asleep_ns(&self) -> u64 {
        self.runnable_since().saturating_sub(self.out_ns)
    }
}

/// A stretch of the scan thread's own work between two scans, timed by
/// the agent (CLOCK_MONOTONIC ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnWork {
    /// When it began.
    pub begin_ns: u64,
    /// When it ended.
    pub end_ns: u64,
    /// What it was, e.g. "publishing a snapshot".
    pub what: &'static str,
}

/// A run-queue delay sample of the scanner from `/proc/<tid>/schedstat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedSample {
    /// CLOCK_MONOTONIC ns when read.
    pub at_ns: u64,
    /// Cumulative time spent waiting on a runqueue, ns.
    pub run_delay_ns: u64,
    /// Cumulative involuntary context switches.
    pub involuntary_switches: u64,
}

/// What the scanner's schedstat says about a storm's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SchedDelta {
    /// Run-queue delay beyond the scanner's usual, ns.
    excess_delay_ns: u64,
    /// Involuntary switches (preemptions).
    involuntary: u64,
}

/// Everything known around a storm.
#[derive(Clone, Debug, Default)]
pub struct Facts<'a> {
    /// Scanner off-CPU intervals (any time; filtered here). Empty without
    /// probes.
    pub off_cpu: &'a [OffCpu],
    /// Whether the sched probes were running (so an empty `off_cpu` means
    /// "never off CPU", not "unknown").
    pub probes: bool,
    /// The scanner's scans as (begin, end) ns, chronological.
    pub scans: &'a [(u64, u64)],
    /// Observations drained by each scan in `scans` (same length; empty if
    /// unknown).
    pub scan_drained: &'a [u64],
    /// The scanner's longest intended pause between scans, ns.
    pub max_interval_ns: u64,
    /// The scanner's shortest intended pause between scans, ns.
    pub min_interval_ns: u64,
    /// Ring capacity (observations).
    pub ring_capacity: u64,
    /// Scheduler samples of the scanner (without probes), chronological.
    pub sched_samples: &'a [SchedSample],
    /// The CPU the producer last ran on, if known.
    pub producer_cpu: Option<u32>,
    /// Producer thread migrations during the storm: (ns, from, to).
    pub producer_migrations: &'a [(u64, u32, u32)],
    /// The scan thread's own work between scans, chronological.
    pub own_work: &'a [OwnWork],
}

/// Share of the longest scan gap that a runnable wait must cover to be the
/// cause.
const EXPLAINS: f64 = 0.5;
/// Least run delay (from /proc, without probes) taken as a preemption.
const SIGNIFICANT_DELAY_NS: u64 = 500_000;
/// A gap this many times the scanner's longest pause is overdue.
const OVERDUE: f64 = 1.5;

/// The agent's own work as the cause: the longest gap overlapping the
/// storm is longer than the scanner's longest pause (the pause runs from
/// a scan's end, so only work longer than the pause can stretch a gap),
/// and work the agent timed fills at least [`EXPLAINS`] of it.
fn agent_busy(storm: &StormReport, facts: &Facts<'_>, evidence: &mut Vec<String>) -> Option<Cause> {
    let gap = storm.scan_gaps.first()?;
    let (begin, end) = (gap.begin_mono_ns, gap.end_mono_ns);
    let gap_ns = end.saturating_sub(begin);
    if gap_ns <= facts.max_interval_ns {
        return None;
    }
    let within: Vec<(u64, &OwnWork)> = facts
        .own_work
        .iter()
        .filter(|w| w.end_ns > begin && w.begin_ns < end)
        .map(|w| (w.end_ns.min(end) - w.begin_ns.max(begin), w))
        .collect();
    let busy_ns: u64 = within.iter().map(|&(ns, _)| ns).sum();
    if (busy_ns as f64) < EXPLAINS * gap_ns as f64 {
        return None;
    }
    let &(longest_ns, longest) = within.iter().max_by_key(|&&(ns, _)| ns)?;
    for &(ns, work) in &within {
        evidence.push(format!("the scan thread spent {} {}", ms(ns), work.what));
    }
    evidence.push(format!(
        "{} of the {} between two scans was the agent's own work",
        ms(busy_ns),
        ms(gap_ns)
    ));
    Some(Cause {
        kind: "agent_busy".into(),
        summary: format!(
            "the agent's scan thread spent {} {} instead of scanning, and the ring filled",
            ms(longest_ns),
            longest.what
        ),
        // The agent timed its own work: nothing is inferred.
        confidence: "high".into(),
        evidence: std::mem::take(evidence),
        interval: Some(Interval {
            begin_mono_ns: longest.begin_ns.max(begin),
            end_mono_ns: longest.end_ns.min(end),
        }),
        culprit: None,
    })
}

/// The verdict for `storm`.
pub fn diagnose(storm: &StormReport, facts: &Facts<'_>) -> Cause {
    let begin = storm.begin_mono_ns;
    let end = storm.end_mono_ns.unwrap_or(begin + storm.duration_ns).max(begin);
    // The longest scan that overlaps the storm, (start, duration). A
    // scanner can be held up *inside* a scan (preempted between its start
    // and end): the rings it had not reached yet, or had just drained,
    // then wait that long with no gap between scans to show for it.
    let overlapping_scan = facts
        .scans
        .iter()
        .filter(|&&(b, e)| e >= begin && b <= end)
        .map(|&(b, e)| (b, e.saturating_sub(b)))
        .max_by_key(|&(_, took)| took);
    // The ring filled during the gap before the first drop: look back one
    // full ring's worth of time before the storm as well.
    let lookback = storm
        .scan_gaps
        .iter()
        .map(|g| g.end_mono_ns.saturating_sub(g.begin_mono_ns))
        .max()
        .unwrap_or(0)
        .max(facts.max_interval_ns)
        .max(overlapping_scan.map_or(0, |(b, _)| begin.saturating_sub(b)));
    let window = (begin.saturating_sub(lookback), end);
    let gap = storm.max_scan_gap_ns.max(1);
    // The ring was empty when the last scan before the storm ended and full
    // at the first drop: that is the fill time, when known.
    let filled_in = facts
        .scans
        .iter()
        .rev()
        .find(|&&(_, scan_end)| scan_end <= begin)
        .map(|&(_, scan_end)| begin - scan_end)
        .filter(|&ns| ns >= 1_000);
    let push_rate = match filled_in {
        Some(ns) => Some(facts.ring_capacity as f64 * 1e9 / ns as f64),
        None => push_rate(storm, facts.ring_capacity),
    };
    let fill_ns = fill_time_ns(facts.ring_capacity, push_rate);
    let mut evidence = vec![
        format!(
            "{} observations dropped over {} on thread {} ({})",
            storm.dropped,
            ms(end - begin),
            storm.tid,
            storm.thread_name
        ),
        format!(
            "longest scanner gap overlapping the storm: {}",
            ms(storm.max_scan_gap_ns)
        ),
    ];
    if let Some(rate) = push_rate {
        evidence.push(format!(
            "producer pushed at least {:.1} M obs/s: a {}-slot ring fills in {}",
            rate / 1e6,
            facts.ring_capacity,
            ms(fill_ns.unwrap_or(0))
        ));
    }
    if let Some(cpu) = facts.producer_cpu {
        evidence.push(format!("producer last ran on CPU {cpu}"));
    }
    for &(at, from, to) in facts
        .producer_migrations
        .iter()
        .filter(|m| m.0 >= window.0 && m.0 <= window.1)
    {
        evidence.push(format!(
            "producer migrated CPU {from} → {to} at +{}",
            ms(at.saturating_sub(begin))
        ));
    }

    let overlapping: Vec<&OffCpu> = facts
        .off_cpu
        .iter()
        .filter(|o| o.in_ns >= window.0 && o.out_ns <= window.1)
        .collect();
    // The scanner's absence explains the storm if it covers most of the
    // longest gap, or most of the storm itself.
    let explains = |ns: u64| ns as f64 >= EXPLAINS * gap.min((end - begin).max(1)) as f64;
    if let Some(longest) = overlapping.iter().max_by_key(|o| o.runnable_wait_ns())
        && explains(longest.runnable_wait_ns())
    {
        if longest.switch_in_unseen {
            evidence.push(
                "the kernel reported no sched_switch for the scanner's return: its time is the scheduler's \
                 last_arrival, read when the scanner next left the CPU"
                    .to_string(),
            );
        }
        let holder = if longest.holder_pid == 0 {
            "a task no switch reported".to_string()
        } else {
            format!("{} (pid {})", longest.holder_comm, longest.holder_pid)
        };
        evidence.push(format!(
            "scanner {} off-CPU {}–{} ({}), runnable for {}",
            longest.tid,
            ms(longest.out_ns.saturating_sub(begin)),
            ms(longest.in_ns.saturating_sub(begin)),
            if longest.preempted {
                "preempted while running".to_string()
            } else {
                format!("woke after {}", ms(longest.asleep_ns()))
            },
            ms(longest.runnable_wait_ns())
        ));
        return Cause {
            kind: "scanner_preempted".into(),
            summary: format!(
                "the scanner was runnable but off-CPU for {} on CPU {}, preempted by {holder}",
                ms(longest.runnable_wait_ns()),
                longest.cpu_in,
            ),
            confidence: "high".into(),
            evidence,
            interval: Some(Interval {
                begin_mono_ns: longest.runnable_since(),
                end_mono_ns: longest.in_ns,
            }),
            culprit: (longest.holder_pid != 0).then(|| Culprit {
                pid: longest.holder_pid,
                comm: longest.holder_comm.clone(),
                cpu: longest.cpu_in,
            }),
        };
    }
    if let Some(longest) = overlapping.iter().max_by_key(|o| o.asleep_ns())
        && longest.asleep_ns() > facts.max_interval_ns.saturating_mul(2)
        && explains(longest.asleep_ns())
    {
        evidence.push(format!(
            "scanner {} asleep for {} (state {:#x}), its pause between scans is at most {}",
            longest.tid,
            ms(longest.asleep_ns()),
            longest.state,
            ms(facts.max_interval_ns)
        ));
        return Cause {
            kind: "scanner_blocked".into(),
            summary: format!(
                "the scanner was blocked for {} ({}) while the ring filled",
                ms(longest.asleep_ns()),
                state_name(longest.state)
            ),
            confidence: "high".into(),
            evidence,
            interval: Some(Interval {
                begin_mono_ns: longest.out_ns,
                end_mono_ns: longest.runnable_since(),
            }),
            culprit: None,
        };
    }
    let confidence = if facts.probes { "high" } else { "low" };
    // How long the scanner was away from the rings: the longest gap
    // between scans, or a scan it was held up in.
    let held_in_scan = overlapping_scan.map_or(0, |(_, took)| took);
    let away = gap.max(held_in_scan);
    if !facts.probes
        // A gap within the scanner's own pause (and its usual overrun)
        // was not made longer by a wait, whatever the coarse samples around
        // it add up to.
        && away as f64 >= OVERDUE * facts.max_interval_ns as f64
        && let Some(SchedDelta {
            excess_delay_ns: delay,
            involuntary,
        }) = sched_delta(facts.sched_samples, window)
        && delay >= SIGNIFICANT_DELAY_NS
        && delay as f64 >= EXPLAINS * away as f64
    {
        if held_in_scan > gap {
            evidence.push(format!(
                "a scan overlapping the storm took {}: the scanner was held up inside it",
                ms(held_in_scan)
            ));
        }
        evidence.push(format!(
            "scanner waited {} on a runqueue beyond its usual, with {involuntary} involuntary context switches (/proc schedstat)",
            ms(delay)
        ));
        return Cause {
            kind: "scanner_preempted".into(),
            summary: format!(
                "the scanner probably waited {} for a CPU (no kernel events: inferred from /proc)",
                ms(delay)
            ),
            confidence: "low".into(),
            evidence,
            interval: None,
            culprit: None,
        };
    }
    let (longest_scan, longest_scan_drained) = facts
        .scans
        .iter()
        .enumerate()
        .filter(|&(_, &(b, e))| e >= window.0 && b <= window.1)
        .map(|(i, &(b, e))| {
            (
                e.saturating_sub(b),
                facts.scan_drained.get(i).copied().unwrap_or(0),
            )
        })
        .max()
        .unwrap_or((0, 0));
    // How fast the scanner drains while it works: if that is below the push
    // rate, even back-to-back scans lose — the producer outran the drain
    // capacity, and the long scan is the symptom, not the cause.
    let drain_rate = (longest_scan > 0 && longest_scan_drained > 0)
        .then(|| longest_scan_drained as f64 * 1e9 / longest_scan as f64);
    let outran = matches!((drain_rate, push_rate), (Some(drain), Some(push)) if drain < push);
    // A scan that spent its time draining at least a ring-full was long
    // because the producer kept refilling the ring, not because the scanner
    // was slow for the work it had.
    let busy_draining = longest_scan_drained >= facts.ring_capacity;
    if let Some(fill) = fill_ns
        && longest_scan > fill
        && !outran
        && !busy_draining
    {
        evidence.push(format!(
            "a scan took {} while the ring fills in {}",
            ms(longest_scan),
            ms(fill)
        ));
        return Cause {
            kind: "scanner_too_slow".into(),
            summary: format!(
                "the scanner was on CPU but one scan took {}, longer than the {} the ring takes to fill",
                ms(longest_scan),
                ms(fill)
            ),
            confidence: confidence.into(),
            evidence,
            interval: None,
            culprit: None,
        };
    }
    if let Some(cause) = agent_busy(storm, facts, &mut evidence) {
        return cause;
    }
    // The scanner ran and paused as configured. Was the pause the problem,
    // or would even back-to-back scans have lost?
    // Pauses of a millisecond or less are wake-up jitter around a short
    // interval, not a configuration to blame.
    let near_min = gap <= facts.min_interval_ns.saturating_mul(3).max(1_000_000);
    // A gap far beyond the scanner's longest pause, with nothing seen
    // keeping it off its CPU: it stalled for a reason not observed (e.g.
    // without probes, or inside the agent's own work).
    if gap > facts.max_interval_ns.saturating_mul(3).max(1_000_000) {
        evidence.push(format!(
            "the scanner paused {} between scans, its longest planned pause is {}",
            ms(gap),
            ms(facts.max_interval_ns)
        ));
        return Cause {
            kind: "scanner_stalled".into(),
            summary: format!(
                "the scanner did not scan for {} (its pause is at most {}) and the ring filled",
                ms(gap),
                ms(facts.max_interval_ns)
            ),
            confidence: "low".into(),
            evidence,
            interval: storm.scan_gaps.first().map(|g| Interval {
                begin_mono_ns: g.begin_mono_ns,
                end_mono_ns: g.end_mono_ns,
            }),
            culprit: None,
        };
    }
    if !near_min && fill_ns.is_some_and(|fill| gap > fill) {
        evidence.push(format!(
            "the scanner paused {} between scans; the ring fills in {}",
            ms(gap),
            ms(fill_ns.unwrap_or(0))
        ));
        return Cause {
            kind: "scan_interval_too_long".into(),
            summary: format!(
                "the scan interval ({}) is too long for the push rate: the ring fills in {}",
                ms(gap),
                ms(fill_ns.unwrap_or(0))
            ),
            confidence: confidence.into(),
            evidence,
            interval: None,
            culprit: None,
        };
    }
    if let (true, Some(drain)) = (outran, drain_rate) {
        evidence.push(format!(
            "working flat out the scanner drains {:.1} M obs/s, less than the producer pushed",
            drain / 1e6
        ));
    }
    evidence.push(format!("the scanner ran unhindered, scanning every {}", ms(gap)));
    Cause {
        kind: "producer_burst".into(),
        summary: format!(
            "producer burst beyond drain capacity: {} dropped although the scanner ran unhindered",
            storm.dropped
        ),
        confidence: confidence.into(),
        evidence,
        interval: None,
        culprit: None,
    }
}

/// A lower bound of the producer's push rate during the storm, obs/s, when
/// the fill time is unknown: it filled the ring and then dropped `dropped`
/// in the storm's duration (at least 1 µs).
fn push_rate(storm: &StormReport, capacity: u64) -> Option<f64> {
    let duration = storm.duration_ns.max(storm.max_scan_gap_ns);
    (duration >= 1_000).then(|| (storm.dropped + capacity) as f64 * 1e9 / duration as f64)
}

fn fill_time_ns(capacity: u64, rate: Option<f64>) -> Option<u64> {
    rate.filter(|r| *r > 0.0)
        .map(|r| (capacity as f64 * 1e9 / r) as u64)
}

/// Sample intervals before a storm from which the scanner's usual run-queue
/// delay is learnt.
const BASELINE_SAMPLES: usize = 32;

/// Run-queue delay beyond the scanner's usual, and involuntary switches,
/// accumulated over `window`, from the samples bracketing it.
///
/// The samples are coarse (one per 10 ms) next to a storm's gap (often a
/// millisecond), and a scanner on a busy host waits a little at most
/// wakeups. So the delay the bracket would hold anyway, at the median rate
/// of the sample intervals before it, is subtracted: what remains is delay
/// that came with the storm.
fn sched_delta(samples: &[SchedSample], window: (u64, u64)) -> Option<SchedDelta> {
    let before_index = samples.iter().rposition(|s| s.at_ns <= window.0)?;
    let before = samples[before_index];
    let after = samples.iter().find(|s| s.at_ns >= window.1)?;
    let mut rates: Vec<f64> = samples[before_index.saturating_sub(BASELINE_SAMPLES)..=before_index]
        .windows(2)
        .filter(|pair| pair[1].at_ns > pair[0].at_ns)
        .map(|pair| {
            pair[1].run_delay_ns.saturating_sub(pair[0].run_delay_ns) as f64
                / (pair[1].at_ns - pair[0].at_ns) as f64
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    let usual_rate = rates.get(rates.len() / 2).copied().unwrap_or(0.0);
    let usual = (usual_rate * after.at_ns.saturating_sub(before.at_ns) as f64) as u64;
    Some(SchedDelta {
        excess_delay_ns: after
            .run_delay_ns
            .saturating_sub(before.run_delay_ns)
            .saturating_sub(usual),
        involuntary: after
            .involuntary_switches
            .saturating_sub(before.involuntary_switches),
    })
}

/// Samples the *calling* thread's scheduler counters cheaply: the run delay
/// from `/proc/thread-self/schedstat` through a descriptor kept open (one
/// `pread` per sample) and the involuntary switches from
/// `getrusage(RUSAGE_THREAD)`.
#[derive(Debug)]
pub struct SchedSampler {
    schedstat: std::fs::File,
}

impl SchedSampler {
    /// Opens the calling thread's schedstat; samples must then be taken on
    /// this same thread.
    pub fn for_current_thread() -> Option<Self> {
        Some(Self {
            schedstat: std::fs::File::open("/proc/thread-self/schedstat").ok()?,
        })
    }

    /// One sample stamped `now_ns`.
    pub fn sample(&self, now_ns: u64) -> Option<SchedSample> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let n = self.schedstat.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let run_delay_ns = text.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: getrusage fills the zeroed struct we pass.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_THREAD reports the calling thread.
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
            return None;
        }
        Some(SchedSample {
            at_ns: now_ns,
            run_delay_ns,
            involuntary_switches: usage.ru_nivcsw as u64,
        })
    }
}

fn state_name(state: u64) -> String {
    match state {
        0 => "running".into(),
        s if s & 0x2 != 0 => "uninterruptible (D)".into(),
        s if s & 0x1 != 0 => "sleeping (S)".into(),
        s => format!("state {s:#x}"),
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ScanGap;

    const MS: u64 = 1_000_000;

    fn storm(begin: u64, end: u64, dropped: u64, gap: (u64, u64)) -> StormReport {
        StormReport {
            id: 1,
            pid: 10,
            comm: "app".into(),
            tid: 11,
            thread_name: "worker".into(),
            begin_mono_ns: begin,
            end_mono_ns: Some(end),
            duration_ns: end - begin,
            dropped,
            scan_gaps: vec![ScanGap {
                begin_mono_ns: gap.0,
                end_mono_ns: gap.1,
            }],
            max_scan_gap_ns: gap.1 - gap.0,
            ..StormReport::default()
        }
    }

    fn facts<'a>(off_cpu: &'a [OffCpu], scans: &'a [(u64, u64)]) -> Facts<'a> {
        Facts {
            off_cpu,
            probes: true,
            scans,
            scan_drained: &[],
            max_interval_ns: MS,
            min_interval_ns: MS / 10,
            ring_capacity: 4096,
            ..Facts::default()
        }
    }

    /// The scanner (tid 7) off CPU 1 from 998 to 1051 ms, woken at 999 ms
    /// and kept off by `hog` (pid 4242).
    fn held_off_by_the_hog(switch_in_unseen: bool) -> OffCpu {
        OffCpu {
            tid: 7,
            out_ns: 998 * MS,
            in_ns: 1051 * MS,
            preempted: false,
            state: 1,
            wakeup_ns: Some(999 * MS),
            cpu_out: 1,
            cpu_in: 1,
            holder_pid: 4242,
            holder_comm: "hog".into(),
            switch_in_unseen,
        }
    }

    #[test]
    fn preempted_scanner_names_the_hog() {
        let s = storm(1000 * MS, 1050 * MS, 100_000, (998 * MS, 1051 * MS));
        let off = [held_off_by_the_hog(false)];
        let cause = diagnose(&s, &facts(&off, &[]));
        assert_eq!(cause.kind, "scanner_preempted");
        assert!(cause.summary.contains("hog (pid 4242)"), "{}", cause.summary);
        assert!(!cause.evidence.iter().any(|e| e.contains("last_arrival")));
        assert!(cause.summary.contains("52.000 ms"), "{}", cause.summary);
        assert_eq!(cause.confidence, "high");
        let interval = cause.interval.expect("interval");
        assert_eq!(
            (interval.begin_mono_ns, interval.end_mono_ns),
            (999 * MS, 1051 * MS)
        );
        assert_eq!(
            cause.culprit.map(|c| (c.pid, c.comm)),
            Some((4242, "hog".to_string()))
        );
    }

    #[test]
    fn a_preemption_whose_return_the_kernel_did_not_report_is_still_named() {
        let s = storm(1000 * MS, 1050 * MS, 100_000, (998 * MS, 1051 * MS));
        let seen = held_off_by_the_hog(true);
        let cause = diagnose(&s, &facts(std::slice::from_ref(&seen), &[]));
        assert_eq!(cause.kind, "scanner_preempted");
        assert!(cause.summary.contains("hog (pid 4242)"), "{}", cause.summary);
        assert!(
            cause.evidence.iter().any(|e| e.contains("no sched_switch")),
            "{:?}",
            cause.evidence
        );
        // No stretch seen on the CPU: the cause stands, with no culprit.
        let unknown = [OffCpu {
            holder_pid: 0,
            holder_comm: String::new(),
            ..seen
        }];
        let cause = diagnose(&s, &facts(&unknown, &[]));
        assert_eq!(cause.kind, "scanner_preempted");
        assert!(
            cause.summary.contains("a task no switch reported"),
            "{}",
            cause.summary
        );
        assert_eq!(cause.culprit, None);
    }

    #[test]
    fn long_sleep_is_blocked() {
        let s = storm(1000 * MS, 1020 * MS, 50_000, (995 * MS, 1021 * MS));
        let off = [OffCpu {
            tid: 7,
            out_ns: 995 * MS,
            in_ns: 1021 * MS,
            state: 2,
            wakeup_ns: Some(1021 * MS - 10_000),
            ..OffCpu::default()
        }];
        let cause = diagnose(&s, &facts(&off, &[]));
        assert_eq!(cause.kind, "scanner_blocked");
        assert!(cause.summary.contains("uninterruptible"), "{}", cause.summary);
    }

    #[test]
    fn slow_scan_is_too_slow() {
        // 100k dropped in 10 ms: ~10 M obs/s, the ring fills in ~0.4 ms.
        let s = storm(1000 * MS, 1010 * MS, 100_000, (1000 * MS, 1000 * MS + 50_000));
        let scans = [(999 * MS, 1009 * MS)];
        let cause = diagnose(&s, &facts(&[], &scans));
        assert_eq!(cause.kind, "scanner_too_slow");
    }

    #[test]
    fn a_long_scan_that_drains_slower_than_the_push_rate_is_a_burst() {
        // 10 M obs/s pushed; the long scan drained 8192 in 10 ms (0.8 M/s):
        // too slow. The same scan draining 200k in 10 ms (20 M/s) kept up
        // with 10 M/s... so it is slow only relative to the fill time; but a
        // scan draining 8192 in 1 ms (8 M/s) against 10 M/s pushed means the
        // producer outran the drain capacity.
        let s = storm(1000 * MS, 1010 * MS, 100_000, (1000 * MS, 1000 * MS + 50_000));
        let scans = [(999 * MS, 1000 * MS)];
        let drained = [8192];
        let f = Facts {
            scan_drained: &drained,
            ..facts(&[], &scans)
        };
        let cause = diagnose(&s, &f);
        assert_eq!(cause.kind, "producer_burst", "{cause:?}");
        assert!(
            cause.evidence.iter().any(|e| e.contains("flat out")),
            "{:?}",
            cause.evidence
        );
    }

    #[test]
    fn long_pause_is_interval_too_long() {
        // Gaps of 10 ms, ring fills in ~1 ms.
        let s = storm(1000 * MS, 1010 * MS, 40_000, (1000 * MS, 1010 * MS));
        let mut f = facts(
            &[],
            &[(990 * MS, 990 * MS + 10_000), (1010 * MS, 1010 * MS + 10_000)],
        );
        f.max_interval_ns = 10 * MS;
        let cause = diagnose(&s, &f);
        assert_eq!(cause.kind, "scan_interval_too_long");
    }

    #[test]
    fn a_gap_filled_by_the_agents_own_work_is_agent_busy() {
        let s = storm(1000 * MS, 1100 * MS, 40_000, (990 * MS, 1100 * MS));
        let mut f = facts(&[], &[(980 * MS, 990 * MS), (1100 * MS, 1101 * MS)]);
        f.max_interval_ns = 10 * MS;
        let work = [
            OwnWork {
                begin_ns: 991 * MS,
                end_ns: 1060 * MS,
                what: "publishing a snapshot",
            },
            OwnWork {
                begin_ns: 1060 * MS,
                end_ns: 1070 * MS,
                what: "attaching segments",
            },
            // Outside the gap: not counted.
            OwnWork {
                begin_ns: 900 * MS,
                end_ns: 980 * MS,
                what: "attaching segments",
            },
        ];
        f.own_work = &work;
        let cause = diagnose(&s, &f);
        assert_eq!(
            (cause.kind.as_str(), cause.confidence.as_str()),
            ("agent_busy", "high"),
            "{cause:?}"
        );
        assert!(
            cause.summary.contains("69.000 ms publishing a snapshot"),
            "{}",
            cause.summary
        );
        assert!(
            cause
                .evidence
                .iter()
                .any(|e| e.contains("79.000 ms of the 110.000 ms")),
            "{:?}",
            cause.evidence
        );
        assert_eq!(
            cause.interval.map(|i| (i.begin_mono_ns, i.end_mono_ns)),
            Some((991 * MS, 1060 * MS))
        );
        // Work filling less than half of the gap leaves it unexplained.
        let little = [OwnWork {
            begin_ns: 991 * MS,
            end_ns: 1040 * MS,
            what: "publishing a snapshot",
        }];
        f.own_work = &little;
        assert_eq!(diagnose(&s, &f).kind, "scanner_stalled");
    }

    #[test]
    fn unexplained_long_gap_is_a_stall() {
        let s = storm(1000 * MS, 1100 * MS, 40_000, (990 * MS, 1100 * MS));
        let mut f = facts(&[], &[(980 * MS, 990 * MS), (1100 * MS, 1101 * MS)]);
        f.max_interval_ns = 10 * MS;
        let cause = diagnose(&s, &f);
        assert_eq!(
            (cause.kind.as_str(), cause.confidence.as_str()),
            ("scanner_stalled", "low")
        );
        assert_eq!(
            cause.interval.map(|i| i.end_mono_ns - i.begin_mono_ns),
            Some(110 * MS)
        );
    }

    #[test]
    fn back_to_back_scans_mean_producer_burst() {
        // Scans every 100 µs, yet drops: the producer outran back-to-back scans.
        let s = storm(1000 * MS, 1001 * MS, 60_000, (1000 * MS, 1000 * MS + 100_000));
        let scans: Vec<(u64, u64)> = (0..20)
            .map(|i| (999 * MS + i * 110_000, 999 * MS + i * 110_000 + 10_000))
            .collect();
        let cause = diagnose(&s, &facts(&[], &scans));
        assert_eq!(cause.kind, "producer_burst");
    }

    #[test]
    fn without_probes_a_scanners_usual_runqueue_delay_is_not_a_preemption() {
        // A busy host: the scanner waits 0.7 ms in every 10 ms sample. A
        // burst storm whose 10 ms bracket holds just that is a producer
        // burst, not a preemption (without the baseline it would read as
        // 0.7 ms of preemption).
        let s = storm(1000 * MS, 1001 * MS, 60_000, (1000 * MS, 1000 * MS + 100_000));
        let samples: Vec<SchedSample> = (0..40u64)
            .map(|i| SchedSample {
                at_ns: 800 * MS + i * 10 * MS,
                run_delay_ns: i * 700_000,
                involuntary_switches: 0,
            })
            .collect();
        let scans: Vec<(u64, u64)> = (0..20)
            .map(|i| (999 * MS + i * 110_000, 999 * MS + i * 110_000 + 10_000))
            .collect();
        let f = Facts {
            probes: false,
            sched_samples: &samples,
            ..facts(&[], &scans)
        };
        assert_eq!(diagnose(&s, &f).kind, "producer_burst");
    }

    #[test]
    fn without_probes_a_gap_on_schedule_is_not_a_preemption() {
        // 1.5 ms more run delay than usual around a storm whose gap is the
        // scanner's own 1 ms pause: the wait went elsewhere in the coarse
        // bracket. The same delay around a 2 ms gap (pause 1 ms) explains it.
        let sample = |at_ns, run_delay_ns| SchedSample {
            at_ns,
            run_delay_ns,
            involuntary_switches: 0,
        };
        let samples = [
            sample(990 * MS, 0),
            sample(1000 * MS, 0),
            sample(1010 * MS, 1_500_000),
        ];
        let on_schedule = storm(1000 * MS, 1001 * MS, 60_000, (1000 * MS, 1000 * MS + 1_050_000));
        let late = storm(1000 * MS, 1002 * MS, 60_000, (1000 * MS, 1000 * MS + 2 * MS));
        let f = Facts {
            probes: false,
            sched_samples: &samples,
            ..facts(&[], &[])
        };
        assert_ne!(diagnose(&on_schedule, &f).kind, "scanner_preempted");
        assert_eq!(diagnose(&late, &f).kind, "scanner_preempted");
    }

    #[test]
    fn without_probes_a_scanner_preempted_inside_a_scan_is_still_preempted() {
        // The scanner lost its CPU in the middle of a scan (997–1049 ms) and
        // drained 4096 observations in it: no gap between scans overlaps the
        // storm, and the long scan's drain rate looks too slow for the
        // producer. The run delay says where the time went.
        let s = storm(1000 * MS, 1048 * MS, 96_000, (1049 * MS, 1049 * MS));
        let scans = [
            (990 * MS, 990 * MS + 50_000),
            (997 * MS, 1049 * MS),
            (1049 * MS + 100_000, 1049 * MS + 150_000),
        ];
        let drained = [100, 4096, 4096];
        let samples = [
            SchedSample {
                at_ns: 990 * MS,
                run_delay_ns: 0,
                involuntary_switches: 0,
            },
            SchedSample {
                at_ns: 1050 * MS,
                run_delay_ns: 50 * MS,
                involuntary_switches: 1,
            },
        ];
        let f = Facts {
            probes: false,
            sched_samples: &samples,
            scan_drained: &drained,
            ..facts(&[], &scans)
        };
        let cause = diagnose(&s, &f);
        assert_eq!(
            (cause.kind.as_str(), cause.confidence.as_str()),
            ("scanner_preempted", "low"),
            "{cause:?}"
        );
        assert!(
            cause.evidence.iter().any(|e| e.contains("held up inside it")),
            "{:?}",
            cause.evidence
        );
    }

    #[test]
    fn without_probes_schedstat_gives_a_low_confidence_preemption() {
        let s = storm(1000 * MS, 1050 * MS, 100_000, (998 * MS, 1051 * MS));
        let samples = [
            SchedSample {
                at_ns: 940 * MS,
                run_delay_ns: 5 * MS,
                involuntary_switches: 10,
            },
            SchedSample {
                at_ns: 1060 * MS,
                run_delay_ns: 52 * MS,
                involuntary_switches: 12,
            },
        ];
        let f = Facts {
            probes: false,
            sched_samples: &samples,
            ..facts(&[], &[])
        };
        let cause = diagnose(&s, &f);
        assert_eq!(
            (cause.kind.as_str(), cause.confidence.as_str()),
            ("scanner_preempted", "low")
        );
        assert!(
            cause.evidence.iter().any(|e| e.contains("47.000 ms")),
            "{:?}",
            cause.evidence
        );
    }

    #[test]
    fn samples_own_scheduler_counters() {
        let sampler = SchedSampler::for_current_thread().expect("schedstat readable");
        let first = sampler.sample(1).expect("sample");
        // Burn a little CPU and yield so the counters can move.
        for _ in 0..100 {
            std::thread::yield_now();
        }
        let second = sampler.sample(2).expect("sample");
        assert_eq!((first.at_ns, second.at_ns), (1, 2));
        assert!(second.run_delay_ns >= first.run_delay_ns);
        assert!(second.involuntary_switches >= first.involuntary_switches);
    }
}
