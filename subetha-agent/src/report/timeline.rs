//! A storm's timeline: what the agent collects around a drop storm so that
//! `subetha-agent report` can draw it.
//!
//! The scan thread keeps a [`DropTrace`] per process (each ring's drop
//! counter, sampled only when it changes, so an idle scan adds nothing) and
//! calls [`build`] for storms whose cause is not settled yet; it freezes the
//! timeline when the cause settles (every input is in by then). [`build`]
//! promises a bounded result whatever the histories hold: at most
//! [`MAX_RINGS`] rings of [`MAX_SAMPLES`]+1 samples, [`MAX_SCANS`] scan boxes
//! and [`MAX_SPANS`] scanner spans, thinned evenly over time.
//!
//! The window runs from a margin before the storm's first drop to a margin
//! after its end (the storm's length, between 5 and 50 ms), widened to the
//! scan gaps overlapping the storm (the drops are counted by the scans at
//! their edges, so a window without them would draw no drops) and to the
//! cause's interval (at most 1 s either way), and never past `now`.
//! Between the agent's scans the scanner's state is known only from the
//! probes: the picture draws it as unknown, never as running.

use std::collections::{BTreeMap, HashMap, VecDeque};

use subetha_core::drain::RingRecord;

use crate::diagnosis::OffCpu;
use crate::history::BoundedHistory;
use crate::model::{
    CpuSpan, DropSample, Interval, RingDrops, ScannerSpan, StormReport, StormTimeline, TaskRef,
};

/// Rings drawn per storm (the storm's own and the other rings of its
/// process that dropped most in the window).
pub const MAX_RINGS: usize = 8;
/// Drop samples kept per ring (plus the first).
pub const MAX_SAMPLES: usize = 400;
/// Scan boxes kept per storm (closer scans are merged).
pub const MAX_SCANS: usize = 600;
/// Scanner off-CPU spans kept per storm (the longest).
pub const MAX_SPANS: usize = 256;
/// Drop-counter changes kept per process.
const TRACE_HISTORY: usize = 16_384;
/// Ring slots followed per process (a hostile ring table can claim more).
const MAX_TRACED_SLOTS: usize = 1 << 16;
/// Thread names remembered per process before unused ones are forgotten.
const NAME_HISTORY: usize = 4096;
/// Margins around a storm.
const MIN_MARGIN_NS: u64 = 5_000_000;
const MAX_MARGIN_NS: u64 = 50_000_000;
/// How far the window may be widened to show the cause's interval.
const MAX_CAUSE_WIDENING_NS: u64 = 1_000_000_000;

/// One change of a ring's drop counter as a scan read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TraceSample {
    at_mono_ns: u64,
    slot: u32,
    tid: u32,
    dropped: u64,
}

/// The drop counters of one process's rings over time, recorded only where
/// they change (with the scan before the change, so a rate is never spread
/// over a long quiet stretch), bounded.
#[derive(Debug)]
pub struct DropTrace {
    /// Per slot: the counter last read and when.
    last: Vec<Option<(u64, u64)>>,
    samples: BoundedHistory<TraceSample>,
    names: HashMap<u32, String>,
}

impl Default for DropTrace {
    fn default() -> Self {
        Self {
            last: Vec::new(),
            samples: BoundedHistory::new(TRACE_HISTORY),
            names: HashMap::new(),
        }
    }
}

impl DropTrace {
    /// Records what a scan that ended at `now` read from `rings`;
    /// `previous_scan_end` is when the scan before it ended. The first read
    /// of a slot is a baseline, not a sample.
    pub fn record(&mut self, rings: &[RingRecord], previous_scan_end: Option<u64>, now: u64) {
        for ring in rings {
            let slot = ring.slot as usize;
            if slot >= MAX_TRACED_SLOTS {
                continue;
            }
            if self.last.len() <= slot {
                self.last.resize(slot + 1, None);
            }
            let total = ring.slot_dropped_total;
            match self.last[slot] {
                None => self.last[slot] = Some((total, now)),
                Some((seen, _)) if seen == total => {}
                Some((seen, seen_at)) => {
                    if let Some(previous) = previous_scan_end
                        && previous > seen_at
                        && previous < now
                    {
                        self.push(previous, ring, seen);
                    }
                    self.push(now, ring, total);
                    self.last[slot] = Some((total, now));
                }
            }
        }
    }

    fn push(&mut self, at_mono_ns: u64, ring: &RingRecord, dropped: u64) {
        self.samples.push(TraceSample {
            at_mono_ns,
            slot: ring.slot,
            tid: ring.os_tid,
            dropped,
        });
        if !self.names.contains_key(&ring.os_tid) {
            if self.names.len() >= NAME_HISTORY {
                let live: std::collections::HashSet<u32> = self.samples.iter().map(|s| s.tid).collect();
                self.names.retain(|tid, _| live.contains(tid));
            }
            self.names.insert(ring.os_tid, ring.thread_name.clone());
        }
    }

    /// When the oldest sample still kept was taken.
    fn oldest(&self) -> Option<u64> {
        self.samples.front().map(|s| s.at_mono_ns)
    }

    /// Samples taken within `window`, oldest first.
    fn within(&self, window: Interval) -> impl Iterator<Item = &TraceSample> {
        let first = self
            .samples
            .partition_point(|s| s.at_mono_ns < window.begin_mono_ns);
        self.samples
            .range(first..)
            .take_while(move |s| s.at_mono_ns <= window.end_mono_ns)
    }
}

/// The agent's histories a timeline is cut from.
pub struct TimelineInputs<'a> {
    /// CLOCK_MONOTONIC ns now.
    pub now: u64,
    /// The storm's process's drop trace, if still kept.
    pub trace: Option<&'a DropTrace>,
    /// The agent's scans (begin, end), oldest first.
    pub scans: &'a VecDeque<(u64, u64)>,
    /// Whether the sched probes run (else scheduler states are unknown).
    pub probes_active: bool,
    /// The probes' state, for the note when they do not run.
    pub probes_note: &'a str,
    /// The scanner's significant off-CPU intervals.
    pub off_cpu: &'a VecDeque<OffCpu>,
    /// Runqueue waits shorter than this are not in `off_cpu`.
    pub min_wait_ns: u64,
    /// Sleeps this short are not in `off_cpu`.
    pub max_ordinary_sleep_ns: u64,
    /// The producer thread's CPU as probe events saw it: (ns, cpu).
    pub producer_cpu: Option<&'a VecDeque<(u64, u32)>>,
    /// The CPU of the producer's latest drop-hook event, when no timed
    /// event placed it (what the storm's evidence then names).
    pub producer_cpu_latest: Option<u32>,
}

/// The window a storm's timeline covers (see the module docs).
pub fn window(storm: &StormReport, now: u64) -> Interval {
    let end = storm.end_mono_ns.unwrap_or(now).max(storm.begin_mono_ns);
    let margin = (end - storm.begin_mono_ns).clamp(MIN_MARGIN_NS, MAX_MARGIN_NS);
    let mut begin = storm.begin_mono_ns.saturating_sub(margin);
    let mut finish = end.saturating_add(margin);
    let earliest = storm.begin_mono_ns.saturating_sub(MAX_CAUSE_WIDENING_NS);
    let latest = end.saturating_add(MAX_CAUSE_WIDENING_NS);
    for gap in &storm.scan_gaps {
        begin = begin.min(gap.begin_mono_ns.saturating_sub(MIN_MARGIN_NS).max(earliest));
        // The scan ending the gap reads the counters: past its end.
        finish = finish.max(gap.end_mono_ns.saturating_add(MIN_MARGIN_NS).min(latest));
    }
    if let Some(interval) = storm.cause.as_ref().and_then(|c| c.interval) {
        begin = begin.min(
            interval
                .begin_mono_ns
                .max(storm.begin_mono_ns.saturating_sub(MAX_CAUSE_WIDENING_NS)),
        );
        finish = finish.max(
            interval
                .end_mono_ns
                .min(end.saturating_add(MAX_CAUSE_WIDENING_NS)),
        );
    }
    Interval {
        begin_mono_ns: begin,
        end_mono_ns: finish.min(now).max(begin),
    }
}

/// The timeline of `storm` from `inputs`; what `previous` (the last build)
/// holds that the histories have since forgotten is kept.
pub fn build(
    storm: &StormReport,
    inputs: &TimelineInputs<'_>,
    previous: Option<&StormTimeline>,
) -> StormTimeline {
    let window = window(storm, inputs.now);
    let (scans, scan_resolution_ns) = scans(inputs.scans, window, previous);
    let (scanner, scanner_note) = scanner_lane(inputs, window, previous);
    let (producer_cpu, producer_cpu_note) = producer_lane(inputs, window, previous);
    StormTimeline {
        window,
        rings: rings(storm, inputs.trace, window, previous),
        scans,
        scan_resolution_ns,
        scanner,
        scanner_note,
        producer_cpu,
        producer_cpu_note,
    }
}

fn rings(
    storm: &StormReport,
    trace: Option<&DropTrace>,
    window: Interval,
    previous: Option<&StormTimeline>,
) -> Vec<RingDrops> {
    let mut series: BTreeMap<(u32, u32), RingDrops> = BTreeMap::new();
    let forgotten_before = trace.and_then(DropTrace::oldest).unwrap_or(u64::MAX);
    for ring in previous.map_or(&[][..], |p| &p.rings[..]) {
        let kept: Vec<DropSample> = ring
            .samples
            .iter()
            .copied()
            .filter(|s| s.at_mono_ns < forgotten_before && s.at_mono_ns >= window.begin_mono_ns)
            .collect();
        if !kept.is_empty() {
            series.insert(
                (ring.slot, ring.tid),
                RingDrops {
                    samples: kept,
                    ..ring.clone()
                },
            );
        }
    }
    if let Some(trace) = trace {
        for sample in trace.within(window) {
            let ring = series
                .entry((sample.slot, sample.tid))
                .or_insert_with(|| RingDrops {
                    slot: sample.slot,
                    tid: sample.tid,
                    thread_name: trace.names.get(&sample.tid).cloned().unwrap_or_default(),
                    ..RingDrops::default()
                });
            if ring
                .samples
                .last()
                .is_none_or(|s| s.at_mono_ns < sample.at_mono_ns)
            {
                ring.samples.push(DropSample {
                    at_mono_ns: sample.at_mono_ns,
                    dropped: sample.dropped,
                });
            }
        }
    }
    let own = (storm.slot, storm.tid);
    let mut own_ring = series.remove(&own).unwrap_or_else(|| RingDrops {
        slot: storm.slot,
        tid: storm.tid,
        ..RingDrops::default()
    });
    own_ring.storm_ring = true;
    if own_ring.thread_name.is_empty() {
        own_ring.thread_name = storm.thread_name.clone();
    }
    let dropped_in_window = |r: &RingDrops| match (r.samples.first(), r.samples.last()) {
        (Some(first), Some(last)) => last.dropped.saturating_sub(first.dropped),
        _ => 0,
    };
    let mut others: Vec<RingDrops> = series
        .into_values()
        .filter(|r| dropped_in_window(r) > 0)
        .collect();
    others.sort_by_key(|r| std::cmp::Reverse(dropped_in_window(r)));
    others.truncate(MAX_RINGS - 1);
    let mut rings = vec![own_ring];
    rings.extend(others);
    for ring in &mut rings {
        ring.samples = thin(std::mem::take(&mut ring.samples), MAX_SAMPLES);
    }
    rings
}

/// At most `max` + 1 samples: the first, and the last of each of `max`
/// equal stretches of time (a rate between kept samples stays exact, only
/// coarser).
fn thin(samples: Vec<DropSample>, max: usize) -> Vec<DropSample> {
    if samples.len() <= max + 1 {
        return samples;
    }
    let first = samples[0].at_mono_ns;
    let span = samples[samples.len() - 1].at_mono_ns - first;
    let bucket = |s: &DropSample| ((s.at_mono_ns - first) as u128 * max as u128 / (span as u128 + 1)) as u64;
    let mut kept = vec![samples[0]];
    for pair in samples[1..].windows(2) {
        if bucket(&pair[0]) != bucket(&pair[1]) {
            kept.push(pair[0]);
        }
    }
    kept.push(samples[samples.len() - 1]);
    kept
}

fn scans(
    history: &VecDeque<(u64, u64)>,
    window: Interval,
    previous: Option<&StormTimeline>,
) -> (Vec<Interval>, u64) {
    let forgotten_before = history.front().map_or(u64::MAX, |s| s.0);
    let first = history.partition_point(|&(_, end)| end < window.begin_mono_ns);
    let mut all: Vec<Interval> = previous
        .map_or(&[][..], |p| &p.scans[..])
        .iter()
        .copied()
        .filter(|s| s.end_mono_ns < forgotten_before && s.end_mono_ns >= window.begin_mono_ns)
        .collect();
    all.extend(
        history
            .range(first..)
            .take_while(|&&(begin, _)| begin <= window.end_mono_ns)
            .map(|&(begin, end)| Interval {
                begin_mono_ns: begin,
                end_mono_ns: end,
            }),
    );
    // Merge what the picture could not tell apart anyway, and more until
    // the bound holds.
    let mut resolution = (window.end_mono_ns - window.begin_mono_ns) / 2000;
    loop {
        let merged = merge_close(&all, resolution);
        if merged.len() <= MAX_SCANS {
            return (merged, resolution);
        }
        resolution = (resolution * 2).max(1);
    }
}

fn merge_close(scans: &[Interval], resolution: u64) -> Vec<Interval> {
    let mut merged: Vec<Interval> = Vec::with_capacity(scans.len().min(MAX_SCANS + 1));
    for scan in scans {
        match merged.last_mut() {
            Some(last) if scan.begin_mono_ns.saturating_sub(last.end_mono_ns) < resolution.max(1) => {
                last.end_mono_ns = last.end_mono_ns.max(scan.end_mono_ns);
            }
            _ => merged.push(*scan),
        }
    }
    merged
}

fn scanner_lane(
    inputs: &TimelineInputs<'_>,
    window: Interval,
    previous: Option<&StormTimeline>,
) -> (Option<Vec<ScannerSpan>>, String) {
    if !inputs.probes_active && inputs.off_cpu.is_empty() {
        let note = format!(
            "scanner states unknown: eBPF sched probes not running (probes: {})",
            inputs.probes_note
        );
        return (previous.and_then(|p| p.scanner.clone()), note);
    }
    let mut spans: Vec<ScannerSpan> = previous.and_then(|p| p.scanner.clone()).unwrap_or_default();
    for off in inputs.off_cpu {
        if off.in_ns < window.begin_mono_ns || off.out_ns > window.end_mono_ns {
            continue;
        }
        let runnable_since = off.runnable_since();
        if runnable_since > off.out_ns {
            spans.push(ScannerSpan {
                begin_mono_ns: off.out_ns,
                end_mono_ns: runnable_since,
                state: "blocked".into(),
                cpu: off.cpu_out,
                holder: None,
            });
        }
        if off.in_ns > runnable_since {
            spans.push(ScannerSpan {
                begin_mono_ns: runnable_since,
                end_mono_ns: off.in_ns,
                state: "runnable_waiting".into(),
                cpu: off.cpu_in,
                holder: (off.holder_pid != 0 || !off.holder_comm.is_empty()).then(|| TaskRef {
                    pid: off.holder_pid,
                    comm: off.holder_comm.clone(),
                }),
            });
        }
    }
    spans.sort_by(|a, b| (a.begin_mono_ns, &a.state).cmp(&(b.begin_mono_ns, &b.state)));
    spans.dedup_by(|a, b| a.begin_mono_ns == b.begin_mono_ns && a.state == b.state);
    if spans.len() > MAX_SPANS {
        spans.sort_by_key(|s| std::cmp::Reverse(s.end_mono_ns - s.begin_mono_ns));
        spans.truncate(MAX_SPANS);
        spans.sort_by_key(|s| s.begin_mono_ns);
    }
    let note = format!(
        "from the sched probes and the agent's scans (running); runqueue waits under {:.1} ms and sleeps up to \
         {:.1} ms (the scanner's own pauses) are not kept: between scans they show as unknown",
        inputs.min_wait_ns as f64 / 1e6,
        inputs.max_ordinary_sleep_ns as f64 / 1e6
    );
    (Some(spans), note)
}

fn producer_lane(
    inputs: &TimelineInputs<'_>,
    window: Interval,
    previous: Option<&StormTimeline>,
) -> (Option<Vec<CpuSpan>>, String) {
    let seen: Vec<(u64, u32)> = {
        let mut seen: Vec<(u64, u32)> = inputs
            .producer_cpu
            .map(|h| {
                h.iter()
                    .copied()
                    .filter(|&(at, _)| at <= window.end_mono_ns)
                    .collect()
            })
            .unwrap_or_default();
        seen.sort_by_key(|&(at, _)| at);
        seen
    };
    if seen.is_empty()
        && let Some(cpu) = inputs.producer_cpu_latest
    {
        let span = CpuSpan {
            begin_mono_ns: window.begin_mono_ns,
            end_mono_ns: window.end_mono_ns,
            cpu,
        };
        return (
            Some(vec![span]),
            "the CPU of the producer's latest drop-hook event (when it ran there is not known)".to_string(),
        );
    }
    if !inputs.probes_active && seen.is_empty() {
        let note = format!(
            "producer CPU unknown: eBPF probes not running (probes: {})",
            inputs.probes_note
        );
        return (previous.and_then(|p| p.producer_cpu.clone()), note);
    }
    // The last CPU seen before the window holds at its start.
    let start = seen
        .partition_point(|&(at, _)| at < window.begin_mono_ns)
        .saturating_sub(1);
    let mut spans: Vec<CpuSpan> = Vec::new();
    let relevant = seen.get(start..).unwrap_or_default();
    for (index, &(at, cpu)) in relevant.iter().enumerate() {
        let begin = at.max(window.begin_mono_ns);
        let end = relevant
            .get(index + 1)
            .map_or(window.end_mono_ns, |&(next, _)| next.max(window.begin_mono_ns));
        match spans.last_mut() {
            Some(last) if last.cpu == cpu => last.end_mono_ns = end,
            _ if end > begin || relevant.len() == 1 => spans.push(CpuSpan {
                begin_mono_ns: begin,
                end_mono_ns: end,
                cpu,
            }),
            _ => {}
        }
    }
    if let Some(first) = spans.first()
        && let Some(previous) = previous.and_then(|p| p.producer_cpu.as_ref())
    {
        let kept: Vec<CpuSpan> = previous
            .iter()
            .copied()
            .filter(|s| s.end_mono_ns <= first.begin_mono_ns && s.begin_mono_ns >= window.begin_mono_ns)
            .collect();
        spans.splice(0..0, kept);
    }
    spans.truncate(MAX_SPANS);
    let note = if spans.is_empty() {
        "no probe event placed the producer on a CPU in this window".to_string()
    } else {
        "from the producer's drop-hook, migration and context-switch events; between events, the CPU last seen"
            .to_string()
    };
    (Some(spans), note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cause, ScanGap, StormReport};

    const MS: u64 = 1_000_000;

    fn ring(slot: u32, tid: u32, dropped: u64) -> RingRecord {
        let mut record = RingRecord::default();
        record.slot = slot;
        record.os_tid = tid;
        record.thread_name = format!("worker-{slot}");
        record.slot_dropped_total = dropped;
        record
    }

    fn storm() -> StormReport {
        StormReport {
            id: 7,
            pid: 10,
            slot: 1,
            tid: 101,
            thread_name: "worker-1".into(),
            begin_mono_ns: 100 * MS,
            end_mono_ns: Some(120 * MS),
            duration_ns: 20 * MS,
            ..StormReport::default()
        }
    }

    #[test]
    fn trace_records_changes_with_the_scan_before() {
        let mut trace = DropTrace::default();
        trace.record(&[ring(1, 101, 5), ring(2, 102, 0)], None, 10 * MS);
        // Quiet scans add nothing.
        trace.record(&[ring(1, 101, 5), ring(2, 102, 0)], Some(10 * MS), 50 * MS);
        assert!(trace.samples.is_empty(), "{:?}", trace.samples);
        trace.record(&[ring(1, 101, 905), ring(2, 102, 0)], Some(99 * MS), 101 * MS);
        trace.record(&[ring(1, 101, 1905), ring(2, 102, 0)], Some(101 * MS), 102 * MS);
        let got: Vec<(u64, u32, u64)> = trace
            .samples
            .iter()
            .map(|s| (s.at_mono_ns / MS, s.slot, s.dropped))
            .collect();
        assert_eq!(got, vec![(99, 1, 5), (101, 1, 905), (102, 1, 1905)]);
    }

    #[test]
    fn window_has_margins_and_stops_at_now() {
        let storm = storm();
        let window = window(&storm, 1000 * MS);
        assert_eq!((window.begin_mono_ns, window.end_mono_ns), (80 * MS, 140 * MS));
        let early = super::window(&storm, 130 * MS);
        assert_eq!(early.end_mono_ns, 130 * MS);
        let mut with_cause = storm.clone();
        with_cause.cause = Some(Cause {
            interval: Some(Interval {
                begin_mono_ns: 60 * MS,
                end_mono_ns: 110 * MS,
            }),
            ..Cause::default()
        });
        assert_eq!(super::window(&with_cause, 1000 * MS).begin_mono_ns, 60 * MS);
    }

    #[test]
    fn build_collects_rings_scans_and_lanes_bounded() {
        let storm = storm();
        let mut trace = DropTrace::default();
        trace.record(&[ring(1, 101, 0), ring(2, 102, 0), ring(3, 103, 0)], None, 0);
        let mut scans = VecDeque::new();
        // A scan every 0.1 ms from 0 to 300 ms: far more than MAX_SCANS.
        for i in 0..3000u64 {
            let begin = i * MS / 10;
            scans.push_back((begin, begin + 20_000));
            let end = begin + 20_000;
            // Ring 1 drops during the storm, ring 2 a little; ring 3 never.
            let r1 = if (100 * MS..120 * MS).contains(&end) {
                (end - 100 * MS) / 1000
            } else {
                0
            };
            let r1 = if end >= 120 * MS { 20_000 } else { r1 };
            let r2 = if end >= 110 * MS { 50 } else { 0 };
            trace.record(
                &[ring(1, 101, r1), ring(2, 102, r2), ring(3, 103, 0)],
                Some(end.saturating_sub(MS / 10)),
                end,
            );
        }
        let off_cpu: VecDeque<OffCpu> = [OffCpu {
            tid: 1,
            out_ns: 95 * MS,
            in_ns: 118 * MS,
            preempted: true,
            cpu_out: 1,
            cpu_in: 1,
            holder_pid: 4242,
            holder_comm: "subetha-hog".into(),
            ..OffCpu::default()
        }]
        .into();
        let producer: VecDeque<(u64, u32)> = [(50 * MS, 0), (105 * MS, 1)].into();
        let inputs = TimelineInputs {
            now: 1000 * MS,
            trace: Some(&trace),
            scans: &scans,
            probes_active: true,
            probes_note: "on",
            off_cpu: &off_cpu,
            min_wait_ns: MS / 2,
            max_ordinary_sleep_ns: 2 * MS,
            producer_cpu: Some(&producer),
            producer_cpu_latest: None,
        };
        let timeline = build(&storm, &inputs, None);
        assert_eq!(timeline.window.begin_mono_ns, 80 * MS);
        assert_eq!(
            timeline.rings.len(),
            2,
            "ring 3 never dropped: {:?}",
            timeline.rings
        );
        assert!(timeline.rings[0].storm_ring && timeline.rings[0].slot == 1);
        assert_eq!(timeline.rings[1].slot, 2);
        assert!(timeline.rings[0].samples.len() <= MAX_SAMPLES + 1);
        let first = timeline.rings[0].samples.first().unwrap();
        let last = timeline.rings[0].samples.last().unwrap();
        assert_eq!(last.dropped - first.dropped, 20_000, "thinning keeps the totals");
        assert!(!timeline.scans.is_empty() && timeline.scans.len() <= MAX_SCANS);
        assert!(
            timeline
                .scans
                .iter()
                .all(|s| s.end_mono_ns >= timeline.window.begin_mono_ns
                    && s.begin_mono_ns <= timeline.window.end_mono_ns)
        );
        let spans = timeline.scanner.as_ref().unwrap();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].state, "runnable_waiting");
        assert_eq!(spans[0].holder.as_ref().unwrap().comm, "subetha-hog");
        let cpus = timeline.producer_cpu.as_ref().unwrap();
        let got: Vec<(u64, u64, u32)> = cpus
            .iter()
            .map(|s| (s.begin_mono_ns / MS, s.end_mono_ns / MS, s.cpu))
            .collect();
        assert_eq!(got, vec![(80, 105, 0), (105, 140, 1)]);
    }

    #[test]
    fn the_window_holds_the_causing_gap_and_the_scans_that_counted_the_drops() {
        // The storm #110: 36105 dropped in 1.72 ms, in a gap from
        // −17.9 to +2.2 ms. The drops are counted by the scans at the gap's
        // edges; the old window (−5…+6.7 ms) held neither and drew none.
        let begin = 1000 * MS;
        let storm = StormReport {
            begin_mono_ns: begin,
            end_mono_ns: Some(begin + 1_720_000),
            duration_ns: 1_720_000,
            dropped: 36_105,
            scan_gaps: vec![ScanGap {
                begin_mono_ns: begin - 17_900_000,
                end_mono_ns: begin + 2_200_000,
            }],
            ..storm()
        };
        let w = window(&storm, 2000 * MS);
        assert!(w.begin_mono_ns < begin - 17_900_000, "{w:?}");
        assert!(w.end_mono_ns > begin + 2_200_000, "{w:?}");
        let mut trace = DropTrace::default();
        trace.record(&[ring(1, 101, 0)], None, begin - 30 * MS);
        trace.record(&[ring(1, 101, 0)], None, begin - 17_900_000);
        trace.record(
            &[ring(1, 101, 36_105)],
            Some(begin - 17_900_000),
            begin + 2_300_000,
        );
        let scans: VecDeque<(u64, u64)> = [
            (begin - 18 * MS, begin - 17_900_000),
            (begin + 2_200_000, begin + 2_300_000),
        ]
        .into();
        let inputs = TimelineInputs {
            now: 2000 * MS,
            trace: Some(&trace),
            scans: &scans,
            probes_active: false,
            probes_note: "off",
            off_cpu: &VecDeque::new(),
            min_wait_ns: MS / 2,
            max_ordinary_sleep_ns: 2 * MS,
            producer_cpu: None,
            producer_cpu_latest: None,
        };
        let timeline = build(&storm, &inputs, None);
        let own = &timeline.rings[0];
        let drawn =
            own.samples.last().map_or(0, |s| s.dropped) - own.samples.first().map_or(0, |s| s.dropped);
        assert_eq!(drawn, 36_105, "{:?}", own.samples);
    }

    #[test]
    fn the_producer_cpu_the_evidence_names_is_drawn_when_no_timed_event_placed_it() {
        let storm = storm();
        let inputs = TimelineInputs {
            now: 1000 * MS,
            trace: None,
            scans: &VecDeque::new(),
            probes_active: true,
            probes_note: "on",
            off_cpu: &VecDeque::new(),
            min_wait_ns: MS / 2,
            max_ordinary_sleep_ns: 2 * MS,
            producer_cpu: None,
            producer_cpu_latest: Some(1),
        };
        let timeline = build(&storm, &inputs, None);
        let cpus: Vec<u32> = timeline.producer_cpu.unwrap().iter().map(|s| s.cpu).collect();
        assert_eq!(cpus, vec![1], "{}", timeline.producer_cpu_note);
    }

    #[test]
    fn without_probes_the_lanes_are_unknown_and_say_why() {
        let storm = storm();
        let inputs = TimelineInputs {
            now: 1000 * MS,
            trace: None,
            scans: &VecDeque::new(),
            probes_active: false,
            probes_note: "off",
            off_cpu: &VecDeque::new(),
            min_wait_ns: MS / 2,
            max_ordinary_sleep_ns: 2 * MS,
            producer_cpu: None,
            producer_cpu_latest: None,
        };
        let timeline = build(&storm, &inputs, None);
        assert!(timeline.scanner.is_none());
        assert!(
            timeline.scanner_note.contains("unknown"),
            "{}",
            timeline.scanner_note
        );
        assert!(timeline.producer_cpu.is_none());
        assert_eq!(timeline.rings.len(), 1);
        assert_eq!(timeline.rings[0].thread_name, "worker-1");
    }

    #[test]
    fn a_rebuild_keeps_what_the_histories_forgot() {
        let storm = storm();
        let previous = StormTimeline {
            rings: vec![RingDrops {
                slot: 1,
                tid: 101,
                thread_name: "worker-1".into(),
                storm_ring: true,
                samples: vec![
                    DropSample {
                        at_mono_ns: 101 * MS,
                        dropped: 10,
                    },
                    DropSample {
                        at_mono_ns: 102 * MS,
                        dropped: 20,
                    },
                ],
            }],
            scans: vec![Interval {
                begin_mono_ns: 100 * MS,
                end_mono_ns: 101 * MS,
            }],
            ..StormTimeline::default()
        };
        let mut trace = DropTrace::default();
        trace.record(&[ring(1, 101, 20)], None, 103 * MS);
        trace.record(&[ring(1, 101, 30)], Some(104 * MS), 105 * MS);
        let scans: VecDeque<(u64, u64)> = [(110 * MS, 111 * MS)].into();
        let inputs = TimelineInputs {
            now: 1000 * MS,
            trace: Some(&trace),
            scans: &scans,
            probes_active: false,
            probes_note: "off",
            off_cpu: &VecDeque::new(),
            min_wait_ns: MS / 2,
            max_ordinary_sleep_ns: 2 * MS,
            producer_cpu: None,
            producer_cpu_latest: None,
        };
        let timeline = build(&storm, &inputs, Some(&previous));
        let at: Vec<u64> = timeline.rings[0]
            .samples
            .iter()
            .map(|s| s.at_mono_ns / MS)
            .collect();
        assert_eq!(at, vec![101, 102, 104, 105]);
        assert_eq!(timeline.scans.len(), 2);
    }
}
