//! Why a ring dropped observations: turning what the kernel and the scanner
//! did around a storm into a cause, a measured push rate, a confidence and
//! a fix.
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
//!
//! The producer's push rate is measured, not bounded (`measure_rate`): every
//! push between a ring's first drop and the scan that drained it failed, so
//! the storm's drops over that stretch are its rate, with the stretch's
//! uncertainty (where in that scan the ring was reached) stated. A long pause
//! is blamed (**scan interval too long**) only when the ring was already that
//! busy before (at the rate its counters saw in the scan interval before the
//! storm it fills within the pause taken) and a pause the agent can take
//! would have fitted; a change of pace within one pause is a **producer
//! burst**, with the rate that shows whether any scan rate could keep up.
//! Every verdict ends with what to change.
//!
//! This module is pure: it takes the facts and returns the verdict, so every
//! rule is unit-tested ([`crate::sched_sampler`] does the I/O without probes).

use crate::model::{Cause, Confidence, Culprit, Interval, PushRate, StormReport};

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
        confidence: Confidence::High,
        evidence: std::mem::take(evidence),
        interval: Some(Interval {
            begin_mono_ns: longest.begin_ns.max(begin),
            end_mono_ns: longest.end_ns.min(end),
        }),
        culprit: None,
        rate: None,
        fix: Some(format!(
            "the agent's own work ({}) delayed its scans: report it, or run the agent with `--scanner-cpu` on a quiet CPU",
            longest.what
        )),
    })
}

/// The verdict for `storm`: its cause, measured rate, confidence and fix.
pub fn diagnose(storm: &StormReport, facts: &Facts<'_>) -> Cause {
    finish(verdict(storm, facts), measure_rate(storm, facts))
}

fn verdict(storm: &StormReport, facts: &Facts<'_>) -> Cause {
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
    // Its average rate over that fill, and the rate measured over the drops.
    let fill_rate = filled_in.map(|ns| facts.ring_capacity as f64 * 1e9 / ns as f64);
    let measured = measure_rate(storm, facts);
    // The rate the verdicts weigh: the measured one, else the fill's average.
    let push_rate = measured.as_ref().map(|r| r.per_sec).or(fill_rate);
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
    if let Some(rate) = &measured {
        evidence.push(format!(
            "producer pushed {} over the storm ({}): a {}-slot ring fills in {}",
            rate_text(rate),
            rate.basis,
            facts.ring_capacity,
            ms(fill_ns.unwrap_or(0))
        ));
    }
    if let (Some(ns), Some(rate)) = (filled_in, fill_rate) {
        evidence.push(format!(
            "the ring filled in {} after the scan before the storm (on average {:.2} M obs/s)",
            ms(ns),
            rate / 1e6
        ));
    }
    // The pause is to blame only if the ring was already that busy before:
    // at the rate its counters saw in the scan interval before, it fills
    // within the pause the scanner took. A producer that changed pace within
    // the pause (from quiet, or far slower) is a burst no plan saw coming.
    let before_fill_ns = storm
        .rate_before_per_sec
        .filter(|&rate| rate >= 1.0)
        .map(|rate| (facts.ring_capacity as f64 * 1e9 / rate) as u64);
    if let (Some(before), Some(fill)) = (storm.rate_before_per_sec, before_fill_ns) {
        evidence.push(format!(
            "in the scan interval before, the ring's counters saw {}: a ring-full in {}",
            per_sec_text(before),
            ms(fill)
        ));
    }
    let busy_before = before_fill_ns.is_some_and(|fill| fill < gap);
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
            confidence: Confidence::High,
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
            rate: None,
            fix: Some(format!(
                "give the scan thread a CPU of its own: `--scanner-cpu N` on a CPU other than {}, or raise the agent's priority",
                longest.cpu_in
            )),
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
            confidence: Confidence::High,
            evidence,
            interval: Some(Interval {
                begin_mono_ns: longest.out_ns,
                end_mono_ns: longest.runnable_since(),
            }),
            culprit: None,
            rate: None,
            fix: Some(format!(
                "find what the scan thread waited on ({}): memory pressure, swap or slow storage under the agent",
                state_name(longest.state)
            )),
        };
    }
    let confidence = if facts.probes {
        Confidence::High
    } else {
        Confidence::Low
    };
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
            confidence: Confidence::Low,
            evidence,
            interval: None,
            culprit: None,
            rate: None,
            fix: Some(
                "give the scan thread a CPU of its own (`--scanner-cpu N`); run with the probes (`--probes on`, as root) to see what held it off"
                    .into(),
            ),
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
        // Scans shorter than the shortest pause are not what a faster
        // scanner would change.
        && longest_scan > facts.min_interval_ns
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
            confidence,
            evidence,
            interval: None,
            culprit: None,
            rate: None,
            fix: Some(
                "one scan is too long for this producer: pin the scan thread (`--scanner-cpu N`), or observe less in this code path (sample the instance)"
                    .into(),
            ),
        };
    }
    if let Some(cause) = agent_busy(storm, facts, &mut evidence) {
        return cause;
    }
    // The scanner ran and paused as configured. Was the pause the problem,
    // or would even back-to-back scans have lost?
    // Pauses within a few of a short shortest pause (and at most a
    // millisecond) are wake-up jitter, not a configuration to blame.
    let near_min = facts.min_interval_ns < 1_000_000
        && gap <= facts.min_interval_ns.saturating_mul(3).clamp(300_000, 1_000_000);
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
            confidence: Confidence::Low,
            evidence,
            interval: storm.scan_gaps.first().map(|g| Interval {
                begin_mono_ns: g.begin_mono_ns,
                end_mono_ns: g.end_mono_ns,
            }),
            culprit: None,
            rate: None,
            fix: Some("run with the probes (`--probes on`, as root) to see what held the scanner off".into()),
        };
    }
    let dropped_text = format!("{} dropped in {}", storm.dropped, ms(end - begin));
    if !near_min
        && busy_before
        && let Some(fill) = before_fill_ns
        && gap > fill
        && fill / 2 >= SHORTEST_SUGGESTED_NS
    {
        let (_, pause) = suggest_pause(fill / 2);
        let flag = if facts.min_interval_ns > fill / 2 {
            "--min-scan-interval"
        } else {
            "--max-scan-interval"
        };
        evidence.push(format!(
            "the scanner paused {} between scans; at the rate before the storm the ring fills in {}",
            ms(gap),
            ms(fill)
        ));
        // The rate is a measurement only when both ends of the drop stretch
        // are known.
        let measured_well = measured.as_ref().is_some_and(|m| m.high_per_sec.is_some());
        return Cause {
            kind: "scan_interval_too_long".into(),
            summary: format!(
                "the scan interval ({}) is too long for this producer ({} before the storm, {} in it): the ring fills in {}",
                ms(gap),
                storm.rate_before_per_sec.map_or_else(String::new, per_sec_text),
                push_rate.map_or_else(|| "unknown".into(), per_sec_text),
                ms(fill)
            ),
            confidence: if measured_well {
                confidence
            } else {
                Confidence::Low
            },
            evidence,
            interval: None,
            culprit: None,
            rate: None,
            fix: Some(format!("lower `{flag}` to {pause}")),
        };
    }
    if let (true, Some(drain)) = (outran, drain_rate) {
        evidence.push(format!(
            "working flat out the scanner drains {:.1} M obs/s, less than the producer pushed",
            drain / 1e6
        ));
    }
    evidence.push(format!("the scanner ran unhindered, scanning every {}", ms(gap)));
    let fix = match fill_ns {
        Some(fill) if fill < facts.min_interval_ns => format!(
            "this burst ({dropped_text}) fills a ring in {}, faster than the shortest pause ({}): no scan rate keeps up; observe less in this code path (sample the instance, or back off between polls)",
            ms(fill),
            ms(facts.min_interval_ns)
        ),
        Some(fill) => format!(
            "this burst ({dropped_text}) fills a ring in {} and came within one pause: if such bursts matter, scan at least every {} (`--max-scan-interval`, more wake-ups) or observe less in this code path (sample the instance)",
            ms(fill),
            suggest_pause(fill / 2).1
        ),
        None => format!(
            "this burst ({dropped_text}) outran the scanner: observe less in this code path (sample the instance)"
        ),
    };
    Cause {
        kind: "producer_burst".into(),
        summary: format!(
            "producer burst beyond drain capacity: {} dropped although the scanner ran unhindered{}",
            storm.dropped,
            push_rate.map_or_else(String::new, |r| format!(" (pushing {})", per_sec_text(r)))
        ),
        confidence,
        evidence,
        interval: None,
        culprit: None,
        rate: None,
        fix: Some(fix),
    }
}

/// The shortest pause a fix suggests (the default `--min-scan-interval`).
const SHORTEST_SUGGESTED_NS: u64 = 100_000;

/// Shortest stretch a rate is measured over.
const MIN_MEASURED_NS: u64 = 1_000;

/// The producer's push rate over a storm, measured from the episode's edges
/// and the scans around it.
///
/// Every push between a ring's first drop and the scan that drained it
/// failed, so for one episode the drops over that stretch are the push rate.
/// The stretch ends where the last scan that began before the episode's end
/// reached the ring: between that scan's start and end (and before the
/// episode's end). At the stretch's longest the rate is a true lower bound;
/// at its shortest it is an upper one if the producer pushed until the ring
/// was drained. An episode that folds several (they began between two
/// scans) or whose end the producer did not stamp leaves only a lower
/// bound: every attempt the ring's counters saw between the two scans, over
/// the time between them.
pub fn measure_rate(storm: &StormReport, facts: &Facts<'_>) -> Option<PushRate> {
    let begin = storm.begin_mono_ns;
    if storm.dropped == 0 {
        return None;
    }
    if storm.merged == 0
        && !storm.end_estimated
        && let Some(end) = storm.end_mono_ns
    {
        let drain = facts.scans.iter().rev().find(|&&(b, _)| b <= end).copied();
        let (earliest, latest) = match drain {
            Some((scan_begin, scan_end)) if scan_end > begin => {
                (scan_begin.max(begin).min(end), scan_end.min(end))
            }
            _ => (end, end),
        };
        let longest = latest.saturating_sub(begin);
        let shortest = earliest.saturating_sub(begin);
        if longest < MIN_MEASURED_NS {
            return None;
        }
        let low = storm.dropped as f64 * 1e9 / longest as f64;
        let high = (shortest >= MIN_MEASURED_NS).then(|| storm.dropped as f64 * 1e9 / shortest as f64);
        return Some(PushRate {
            per_sec: high.map_or(low, |high| (low * high).sqrt()),
            low_per_sec: low,
            high_per_sec: high,
            over_ns: longest,
            basis: if shortest == longest {
                format!(
                    "{} drops in the {} before the ring was drained",
                    storm.dropped,
                    ms(longest)
                )
            } else {
                format!(
                    "{} drops in the {}–{} before the ring was drained",
                    storm.dropped,
                    ms(shortest),
                    ms(longest)
                )
            },
        });
    }
    let attempts = storm.attempts_at_open?;
    let before = facts.scans.iter().rev().find(|&&(_, e)| e <= begin)?.1;
    let found = facts.scans.iter().find(|&&(_, e)| e > begin)?.1;
    let over = found.saturating_sub(before);
    if over < MIN_MEASURED_NS {
        return None;
    }
    let low = attempts as f64 * 1e9 / over as f64;
    Some(PushRate {
        per_sec: low,
        low_per_sec: low,
        high_per_sec: None,
        over_ns: over,
        basis: format!(
            "{attempts} push attempts, drained and dropped, between two scans {} apart{}",
            ms(over),
            if storm.merged > 0 {
                format!(", {} drop episodes folded together", storm.merged + 1)
            } else {
                String::new()
            }
        ),
    })
}

/// `cause` with its measured rate, its summary ending with its fix.
fn finish(mut cause: Cause, rate: Option<PushRate>) -> Cause {
    if let Some(fix) = &cause.fix {
        cause.summary = format!("{}. Fix: {fix}", cause.summary);
    }
    cause.rate = rate;
    cause
}

/// A pause no longer than `ns`, rounded down to 1, 2 or 5 times a power of
/// ten microseconds (at least 1 µs), and how to write it for the command
/// line.
pub fn suggest_pause(ns: u64) -> (u64, String) {
    let us = (ns / 1_000).max(1);
    let mut unit = 1;
    while unit * 10 <= us {
        unit *= 10;
    }
    let lead = us / unit;
    let nice = unit
        * if lead >= 5 {
            5
        } else if lead >= 2 {
            2
        } else {
            1
        };
    let text = if nice >= 1_000 && nice.is_multiple_of(1_000) {
        format!("{}ms", nice / 1_000)
    } else {
        format!("{nice}us")
    };
    (nice * 1_000, text)
}

fn per_sec_text(rate: f64) -> String {
    format!("{:.2} M obs/s", rate / 1e6)
}

fn rate_text(rate: &PushRate) -> String {
    match rate.high_per_sec {
        Some(high) if high > rate.low_per_sec * 1.01 => format!(
            "{} ({:.2}–{:.2})",
            per_sec_text(rate.per_sec),
            rate.low_per_sec / 1e6,
            high / 1e6
        ),
        Some(_) => per_sec_text(rate.per_sec),
        None => format!("at least {}", per_sec_text(rate.low_per_sec)),
    }
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

fn state_name(state: u64) -> String {
    match state {
        0 => "running".into(),
        s if s & 0x2 != 0 => "uninterruptible (D)".into(),
        s if s & 0x1 != 0 => "sleeping (S)".into(),
        s if s & 0x4 != 0 => "stopped (T)".into(),
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
        assert_eq!(cause.confidence, Confidence::High);
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

    /// One staged storm for the table-driven cases: the last scan before it
    /// ended at `last_scan_end`, the next scan ran `next_scan`.
    struct Case {
        name: &'static str,
        begin: u64,
        end: u64,
        dropped: u64,
        last_scan_end: u64,
        next_scan: (u64, u64),
        min_interval: u64,
        max_interval: u64,
        /// The ring's rate in the scan interval before, obs/s.
        before: Option<f64>,
        kind: &'static str,
        confidence: Confidence,
        /// (low, high) of the measured rate, M obs/s, to 1%.
        rate: Option<(f64, Option<f64>)>,
        fix: &'static str,
    }

    #[test]
    fn rates_are_measured_and_a_long_interval_is_blamed_only_when_the_ring_was_that_busy_before() {
        let cases = [
            Case {
                // 4 M obs/s throughout: the ring filled in 1.024 ms and then
                // dropped at the same pace until the scan 11 ms after the
                // last one drained it.
                name: "steady producer, long interval",
                begin: 1000 * MS + 24_000,
                end: 1010 * MS + 24_000,
                dropped: 40_000,
                last_scan_end: 999 * MS,
                next_scan: (1010 * MS, 1010 * MS + 10_000),
                min_interval: MS / 10,
                max_interval: 10 * MS,
                before: Some(4e6),
                kind: "scan_interval_too_long",
                confidence: Confidence::High,
                rate: Some((4.0, Some(4.0))),
                fix: "lower `--max-scan-interval` to 500us",
            },
            Case {
                name: "steady producer, long shortest pause configured",
                min_interval: 10 * MS,
                fix: "lower `--min-scan-interval` to 500us",
                ..Case {
                    name: "",
                    begin: 1000 * MS + 24_000,
                    end: 1010 * MS + 24_000,
                    dropped: 40_000,
                    last_scan_end: 999 * MS,
                    next_scan: (1010 * MS, 1010 * MS + 10_000),
                    min_interval: 0,
                    max_interval: 10 * MS,
                    before: Some(4e6),
                    kind: "scan_interval_too_long",
                    confidence: Confidence::High,
                    rate: Some((4.0, Some(4.0))),
                    fix: "",
                }
            },
            Case {
                // The example: the ring took 17.9 ms to fill (0.23 M
                // obs/s on average), then 16449 drops in 0.183 ms (90 M
                // obs/s): a burst no scan rate keeps up with, not a pause to
                // shorten.
                name: "burst within a pause",
                begin: 1000 * MS,
                end: 1000 * MS + 183_000,
                dropped: 16_449,
                last_scan_end: 1000 * MS - 17_940_000,
                next_scan: (1000 * MS + 173_000, 1000 * MS + 193_000),
                min_interval: MS / 10,
                max_interval: 20 * MS,
                before: Some(0.2e6),
                kind: "producer_burst",
                confidence: Confidence::High,
                // Drained between 173 and 183 µs after the first drop.
                rate: Some((89.9, Some(95.1))),
                fix: "faster than the shortest pause",
            },
            Case {
                // 40k drops over 4 ms after a 16 ms fill: faster than the
                // fill, but a ring-full in ~0.4 ms is within reach of a
                // shorter pause.
                name: "moderate burst within a pause",
                begin: 1000 * MS,
                end: 1004 * MS,
                dropped: 40_000,
                last_scan_end: 984 * MS,
                next_scan: (1004 * MS - 10_000, 1004 * MS + 10_000),
                min_interval: MS / 10,
                max_interval: 20 * MS,
                // A ring-full in 41 ms at this rate: the 20 ms pause fitted it.
                before: Some(0.1e6),
                kind: "producer_burst",
                confidence: Confidence::High,
                rate: Some((10.0, Some(10.03))),
                fix: "scan at least every 200us",
            },
        ];
        let cases = cases.into_iter().chain([Case {
            // The same steady-looking storm with nothing known of the ring
            // before it (it went from quiet to 4 M obs/s within one pause):
            // a burst the agent could not have seen coming.
            name: "from quiet within one pause",
            begin: 1000 * MS + 24_000,
            end: 1010 * MS + 24_000,
            dropped: 40_000,
            last_scan_end: 999 * MS,
            next_scan: (1010 * MS, 1010 * MS + 10_000),
            min_interval: MS / 10,
            max_interval: 10 * MS,
            before: None,
            kind: "producer_burst",
            confidence: Confidence::High,
            rate: Some((4.0, Some(4.0))),
            fix: "came within one pause",
        }]);
        for case in cases {
            let mut s = storm(
                case.begin,
                case.end,
                case.dropped,
                (case.last_scan_end, case.next_scan.0),
            );
            s.max_scan_gap_ns = case.next_scan.0 - case.last_scan_end;
            s.rate_before_per_sec = case.before;
            let scans = [(case.last_scan_end - 10_000, case.last_scan_end), case.next_scan];
            let mut f = facts(&[], &scans);
            f.min_interval_ns = case.min_interval;
            f.max_interval_ns = case.max_interval;
            let cause = diagnose(&s, &f);
            assert_eq!(
                (cause.kind.as_str(), cause.confidence),
                (case.kind, case.confidence),
                "{}: {cause:#?}",
                case.name
            );
            let fix = cause.fix.as_deref().unwrap_or_default();
            assert!(fix.contains(case.fix), "{}: fix {fix:?}", case.name);
            assert!(cause.summary.ends_with(fix), "{}: {}", case.name, cause.summary);
            let rate = cause
                .rate
                .as_ref()
                .map(|r| (r.low_per_sec / 1e6, r.high_per_sec.map(|h| h / 1e6)));
            match (rate, case.rate) {
                (Some((low, high)), Some((want_low, want_high))) => {
                    assert!((low / want_low - 1.0).abs() < 0.01, "{}: low {low}", case.name);
                    match (high, want_high) {
                        (Some(h), Some(w)) => assert!((h / w - 1.0).abs() < 0.01, "{}: high {h}", case.name),
                        (h, w) => assert_eq!(h.is_some(), w.is_some(), "{}", case.name),
                    }
                }
                (got, want) => assert_eq!(got.is_some(), want.is_some(), "{}", case.name),
            }
        }
    }

    #[test]
    fn folded_episodes_give_a_lower_bound_from_the_rings_counters() {
        let mut s = storm(1000 * MS, 1001 * MS, 30_000, (995 * MS, 1005 * MS));
        s.merged = 2;
        s.attempts_at_open = Some(50_000);
        let scans = [(994 * MS, 995 * MS), (1005 * MS, 1005 * MS + 10_000)];
        let rate = measure_rate(&s, &facts(&[], &scans)).expect("a rate");
        // 50k attempts between scans ending 10.01 ms apart.
        assert!((rate.low_per_sec - 50_000.0 / 0.01001).abs() < 1.0, "{rate:?}");
        assert_eq!(rate.high_per_sec, None);
        assert!(rate.basis.contains("3 drop episodes"), "{}", rate.basis);
        // Without the counters, nothing is claimed.
        s.attempts_at_open = None;
        assert_eq!(measure_rate(&s, &facts(&[], &scans)), None);
    }

    #[test]
    fn suggested_pauses_round_down_to_one_two_five() {
        assert_eq!(suggest_pause(512_000), (500_000, "500us".to_string()));
        assert_eq!(suggest_pause(2_900_000), (2_000_000, "2ms".to_string()));
        assert_eq!(suggest_pause(1_000_000), (1_000_000, "1ms".to_string()));
        assert_eq!(suggest_pause(19_000), (10_000, "10us".to_string()));
        assert_eq!(suggest_pause(0), (1_000, "1us".to_string()));
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
}
