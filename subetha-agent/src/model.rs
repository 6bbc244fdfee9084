//! What the agent knows, as plain serialisable data.
//!
//! The scan thread turns its drainers' state into an [`AgentSnapshot`] a few
//! times a second; every output — `snapshot --json`, the JSON API, JSON
//! lines, `/metrics`, `status` — is rendered from such a snapshot, so they
//! always agree. Times are CLOCK_MONOTONIC nanoseconds (the clock eBPF's
//! `bpf_ktime_get_ns` reads) unless a field says otherwise; latencies are
//! nanoseconds converted with the observed process's own TSC calibration.

use serde::{Deserialize, Serialize};
use subetha_core::clock::Calibration;
use subetha_core::drain::{InstanceRecord, RingRecord};
use subetha_core::segment::slot_state;
use subetha_core::stats::LatencyHistogram;

/// Everything the agent reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AgentSnapshot {
    /// About the agent itself.
    pub agent: AgentInfo,
    /// Attached (and recently exited) processes.
    pub processes: Vec<ProcessReport>,
    /// Drop storms, newest last (bounded history).
    pub storms: Vec<StormReport>,
    /// Segments that were found but refused (bad input), newest last.
    pub refused: Vec<RefusedSegment>,
}

/// The agent's own state.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct AgentInfo {
    /// Agent pid.
    pub pid: u32,
    /// Crate version.
    pub version: String,
    /// CLOCK_MONOTONIC ns when the snapshot was taken.
    pub taken_mono_ns: u64,
    /// Wall clock (ms since the Unix epoch) when the snapshot was taken.
    pub taken_unix_ms: u64,
    /// Scans completed.
    pub scans: u64,
    /// Current scan interval (adaptive), µs.
    pub scan_interval_us: u64,
    /// Scan duration quantiles, ns.
    pub scan_duration_ns: Quantiles,
    /// Gap between consecutive scans (end to next start) quantiles, ns.
    pub scan_gap_ns: Quantiles,
    /// Scan durations on the export layout.
    #[serde(default)]
    pub scan_duration_buckets: Buckets,
    /// Scan gaps on the export layout.
    #[serde(default)]
    pub scan_gap_buckets: Buckets,
    /// eBPF probes: `off`, `unavailable: <why>`, or what is attached.
    pub probes: String,
    /// Events read from the probes.
    pub probe_events: u64,
    /// Events the probes could not deliver (ring buffer full).
    pub probe_losses: u64,
    /// Off-CPU intervals the probes' in-kernel filter judged unremarkable
    /// and did not deliver (by design, not a loss).
    #[serde(default)]
    pub probe_filtered: u64,
}

/// p50/p90/p99/p99.9/max, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Quantiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Maximum (exact).
    pub max: u64,
}

impl Quantiles {
    /// Quantiles of a histogram of ticks, converted with `calibration`.
    pub fn from_ticks(histogram: &LatencyHistogram, calibration: &Calibration) -> Self {
        Self::from_histogram(histogram, |ticks| calibration.ticks_to_ns(ticks))
    }

    /// Quantiles of a histogram whose values `to_ns` converts.
    pub fn from_histogram(histogram: &LatencyHistogram, to_ns: impl Fn(u64) -> u64) -> Self {
        if histogram.is_empty() {
            return Self::default();
        }
        let q = histogram.quantiles();
        Self {
            count: histogram.count(),
            p50: to_ns(q.p50),
            p90: to_ns(q.p90),
            p99: to_ns(q.p99),
            p999: to_ns(q.p999),
            max: to_ns(q.max),
        }
    }
}

/// Upper bounds, in ns, of the buckets every latency distribution is
/// exported on (Prometheus classic histograms, OTLP explicit-bucket
/// histograms): 100 ns to 10 s at 1 and 3 per decade, then `+Inf`. The
/// range runs from a sampled uncontended hold to a stuck wait; 18 buckets
/// keep an op kind at 20 series (with `_sum` and `_count`).
pub const BUCKET_BOUNDS_NS: [u64; 17] = [
    100,
    300,
    1_000,
    3_000,
    10_000,
    30_000,
    100_000,
    300_000,
    1_000_000,
    3_000_000,
    10_000_000,
    30_000_000,
    100_000_000,
    300_000_000,
    1_000_000_000,
    3_000_000_000,
    10_000_000_000,
];

/// A distribution on the fixed layout [`BUCKET_BOUNDS_NS`], for exports
/// that aggregate across series (the quantiles cannot be).
///
/// Re-bucketed from the agent's log-linear histograms (buckets about 3%
/// wide): a sample is counted in the first bound at or above its bucket's
/// upper edge, so a count at `le` never includes a sample above `le`, and
/// misses at most the samples within 3% below it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Buckets {
    /// Samples.
    pub count: u64,
    /// Their sum, ns (saturating).
    pub sum_ns: u64,
    /// Samples per bucket (not cumulative): one per bound of
    /// [`BUCKET_BOUNDS_NS`], then those above the last (`+Inf`). Empty when
    /// `count` is 0.
    pub counts: Vec<u64>,
}

impl Buckets {
    /// The distribution of a histogram whose values `to_ns` converts.
    pub fn from_histogram(histogram: &LatencyHistogram, to_ns: impl Fn(u64) -> u64) -> Self {
        if histogram.is_empty() {
            return Self::default();
        }
        let mut counts = vec![0u64; BUCKET_BOUNDS_NS.len() + 1];
        for bucket in histogram.buckets().filter(|b| b.count > 0) {
            let high = to_ns(bucket.high);
            let index = BUCKET_BOUNDS_NS.partition_point(|&bound| bound < high);
            counts[index] += bucket.count;
        }
        Self {
            count: histogram.count(),
            sum_ns: to_ns(histogram.sum()),
            counts,
        }
    }

    /// A histogram of ticks, converted with `calibration`.
    pub fn from_ticks(histogram: &LatencyHistogram, calibration: &Calibration) -> Self {
        Self::from_histogram(histogram, |ticks| calibration.ticks_to_ns(ticks))
    }
}

/// One instrumented process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessReport {
    /// Process id (in the agent's pid namespace).
    pub pid: u32,
    /// `NSpid:` of `/proc/<pid>/status`: its pid in each pid namespace, the
    /// agent's first and its own last (one entry: it shares the agent's).
    #[serde(default)]
    pub nspid: Vec<u32>,
    /// The inode of its pid namespace.
    #[serde(default)]
    pub pid_ns: u64,
    /// Its executable's file name (`/proc/<pid>/exe`, sanitised; `comm`
    /// is cut to 15 bytes).
    #[serde(default)]
    pub exe: String,
    /// Its cgroup (v2 path, or the v1 hierarchy naming a container), empty
    /// with `--label-from none` or when unreadable.
    #[serde(default)]
    pub cgroup: String,
    /// The container id its cgroup names (docker, containerd, cri-o,
    /// podman), if any.
    #[serde(default)]
    pub container_id: Option<String>,
    /// The Kubernetes pod uid its cgroup names, if any.
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// A stable name for the application: `SUBETHA_SERVICE` from its
    /// environment, else its executable's name (None: `--label-from none`).
    #[serde(default)]
    pub service: Option<String>,
    /// Command name (`/proc/<pid>/comm`, sanitised).
    pub comm: String,
    /// Owner uid.
    pub uid: u32,
    /// `attached` (we drain), `waiting` (another consumer drains; takeover
    /// pending or refused), or `exited` (kept for the retention period).
    pub state: String,
    /// Why we do not drain it, when `state` is `waiting`.
    pub note: Option<String>,
    /// CLOCK_MONOTONIC ns when attached.
    pub attached_mono_ns: u64,
    /// CLOCK_MONOTONIC ns when the process exit was seen.
    pub exited_mono_ns: Option<u64>,
    /// Segment size in bytes and how much of it is resident.
    pub segment_bytes: u64,
    /// Resident bytes of the segment (pages touched).
    pub segment_resident_bytes: u64,
    /// Observations lost because a thread found no ring slot.
    pub lost_no_ring: u64,
    /// Drained observations whose instance id matched no instance.
    pub unattributed: u64,
    /// Σ over rings of `drained` (all consumers, all occupants).
    pub drained: u64,
    /// Σ over rings of `dropped`.
    pub dropped: u64,
    /// Drop episodes seen begin in the process by this agent (never
    /// decreases, unlike a ring's count, which restarts with each thread).
    #[serde(default)]
    pub episodes: u64,
    /// Drop storms begun in this process since the agent attached (never
    /// decreases, unlike the bounded storm history).
    pub storms: u64,
    /// Storms with a settled cause, by cause kind (never decrease).
    pub storm_causes: std::collections::BTreeMap<String, u64>,
    /// Ring slots in use or used.
    pub rings: Vec<RingReport>,
    /// Live and retired instances.
    pub instances: Vec<InstanceReport>,
}

/// One ring slot.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RingReport {
    /// Slot index.
    pub slot: u32,
    /// `active`, `orphaned` (thread exited, leftovers being drained) or
    /// `free`.
    pub state: String,
    /// Claim generation (how many threads have used the slot).
    pub generation: u32,
    /// Current (or last) producer's OS thread id, in the agent's pid
    /// namespace (0: a thread of a containerized process that exited before
    /// it could be mapped; see `ns_tid`).
    pub tid: u32,
    /// The same thread's id in its own process's pid namespace (what the
    /// application logs; equal to `tid` outside containers).
    #[serde(default)]
    pub ns_tid: u32,
    /// Its thread name.
    pub thread_name: String,
    /// Observations drained from this slot over its life, by any consumer.
    pub drained: u64,
    /// Observations dropped in this slot over its life.
    pub dropped: u64,
    /// Drop episodes seen by this agent.
    pub episodes: u64,
    /// Set when the ring's indices were impossible (hostile or corrupt).
    pub corrupt: Option<String>,
}

impl RingReport {
    /// From a drainer's ring record.
    pub fn from_record(record: &RingRecord) -> Self {
        Self {
            slot: record.slot,
            state: match record.state {
                slot_state::ACTIVE => "active",
                slot_state::ORPHANED => "orphaned",
                slot_state::CLAIMED => "claimed",
                _ => "free",
            }
            .into(),
            generation: record.generation,
            tid: record.os_tid,
            ns_tid: record.ns_tid,
            thread_name: record.thread_name.clone(),
            drained: record.slot_drained_total,
            dropped: record.slot_dropped_total,
            episodes: record.episodes,
            corrupt: record.corrupt.map(|c| c.to_string()),
        }
    }
}

/// One instance (a mutex, a channel, ...).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct InstanceReport {
    /// Id observations carry.
    pub id: u32,
    /// Kind name.
    pub kind: String,
    /// Instance name.
    pub name: String,
    /// Unregistered (final stats).
    pub retired: bool,
    /// Operations of all kinds.
    pub ops: u64,
    /// Operations that had to wait.
    pub contended: u64,
    /// Operations that found nothing.
    pub misses: u64,
    /// Ring drops attributed to this instance (first dropped instance of an
    /// episode).
    pub drops_attributed: u64,
    /// Latency over all op kinds, ns.
    pub latency_ns: Quantiles,
    /// Thread that produced the maximum latency.
    pub max_latency_thread: Option<u32>,
    /// Distinct producer threads (max over op kinds).
    pub threads: u64,
    /// Per op kind.
    pub per_op: Vec<OpReport>,
    /// CLOCK_MONOTONIC ns of the first and latest drained observation's scan.
    pub first_seen_mono_ns: Option<u64>,
    /// See `first_seen_mono_ns`.
    pub last_seen_mono_ns: Option<u64>,
    /// Policy word (0 when none).
    pub policy: u32,
    /// Per call site: who waited, and whose hold they waited for
    /// ([`crate::sites`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<crate::sites::SiteReport>,
}

/// One op kind of an instance.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpReport {
    /// Op kind number (1..=7).
    pub op: u16,
    /// Its name (`lock`, ...) or `opN`.
    pub name: String,
    /// Count.
    pub ops: u64,
    /// Contended count.
    pub contended: u64,
    /// Miss count.
    pub misses: u64,
    /// Latency, ns.
    pub latency_ns: Quantiles,
    /// The same latencies on the export layout.
    #[serde(default)]
    pub latency_buckets: Buckets,
    /// Distinct producer threads.
    pub threads: u64,
}

impl InstanceReport {
    /// From a drainer's instance record.
    pub fn from_record(
        record: &InstanceRecord,
        retired: bool,
        policy: u32,
        calibration: &Calibration,
    ) -> Self {
        let stats = &record.stats;
        let latency = stats
            .latency()
            .map(|h| Quantiles::from_ticks(&h, calibration))
            .unwrap_or_default();
        let per_op = stats
            .ops_by_kind()
            .filter(|(_, op)| op.ops() > 0)
            .map(|(kind, op)| OpReport {
                op: kind,
                name: record.meta.op_name(kind),
                ops: op.ops(),
                contended: op.contended(),
                misses: op.misses(),
                latency_ns: op
                    .latency()
                    .map(|h| Quantiles::from_ticks(h, calibration))
                    .unwrap_or_default(),
                latency_buckets: op
                    .latency()
                    .map(|h| Buckets::from_ticks(h, calibration))
                    .unwrap_or_default(),
                threads: op.distinct_threads().count as u64,
            })
            .collect::<Vec<_>>();
        Self {
            id: record.meta.id,
            kind: record.meta.kind_name.clone(),
            name: record.meta.name.clone(),
            retired,
            ops: stats.total_ops(),
            contended: stats.total_contended(),
            misses: stats.total_misses(),
            drops_attributed: stats.drops_attributed(),
            latency_ns: latency,
            max_latency_thread: stats.max_latency().map(|(_, m)| m.thread_id),
            threads: per_op.iter().map(|o| o.threads).max().unwrap_or(0),
            per_op,
            first_seen_mono_ns: stats.first_seen_ns(),
            last_seen_mono_ns: stats.last_seen_ns(),
            policy,
            sites: Vec::new(),
        }
    }
}

/// A drop storm: one run of drops on one ring, with the facts around it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StormReport {
    /// Agent-wide storm id, increasing.
    pub id: u64,
    /// Process.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// The container its process runs in, if its cgroup names one.
    #[serde(default)]
    pub container_id: Option<String>,
    /// Ring slot (for a `no_ring` storm, which has none: the table's
    /// capacity).
    pub slot: u32,
    /// Producer OS thread id, in the agent's pid namespace (what the probes
    /// and `/proc` know; 0 if a containerized thread could not be mapped;
    /// for a `no_ring` storm, the latest thread that found no slot, 0 if
    /// unknown).
    pub tid: u32,
    /// The producer's thread id in its own pid namespace.
    #[serde(default)]
    pub ns_tid: u32,
    /// Producer thread name.
    pub thread_name: String,
    /// CLOCK_MONOTONIC ns of the first drop.
    pub begin_mono_ns: u64,
    /// CLOCK_MONOTONIC ns of the first successful push after (None: going on).
    pub end_mono_ns: Option<u64>,
    /// Whether `end_mono_ns` is the time the end was noticed, not exact.
    pub end_estimated: bool,
    /// Duration so far, ns.
    pub duration_ns: u64,
    /// Observations lost.
    pub dropped: u64,
    /// First dropped observation's instance.
    pub first_instance_id: u32,
    /// Its name, if known.
    pub first_instance: Option<String>,
    /// Episodes folded into this one (several began between two scans).
    pub merged: u32,
    /// Scanner gaps (end of one scan to start of the next) overlapping the
    /// storm, longest first (at most 8).
    pub scan_gaps: Vec<ScanGap>,
    /// Longest overlapping scan gap, ns.
    pub max_scan_gap_ns: u64,
    /// Push attempts (drained plus dropped) on its ring between the scan
    /// before the storm and the scan that found it, from the ring's counters
    /// (None: not known).
    #[serde(default)]
    pub attempts_at_open: Option<u64>,
    /// Its ring's push rate (obs/s) over the scan interval before the one
    /// the storm began in, from the ring's counters (None: not known).
    #[serde(default)]
    pub rate_before_per_sec: Option<f64>,
    /// Why it happened: recomputed as evidence arrives, final once
    /// `cause_settled`.
    pub cause: Option<Cause>,
    /// The cause will not change any more (evidence settled after the end).
    pub cause_settled: bool,
    /// What happened around the storm, for its picture: kept for the newest
    /// storms only, final once `cause_settled`. Not part of the snapshot's
    /// JSON (every poll would carry it): `/api/v1/storms/{id}` serves it
    /// as a [`StormDetail`].
    #[serde(skip)]
    pub timeline: Option<std::sync::Arc<StormTimeline>>,
}

/// One storm with its timeline, as `/api/v1/storms/{id}` serves it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StormDetail {
    /// The storm.
    pub storm: StormReport,
    /// What happened around it (None: no longer kept, or not yet built).
    #[serde(default)]
    pub timeline: Option<StormTimeline>,
}

/// What happened around one storm, bounded: the drops of the process's
/// rings, the scanner's scans and scheduler states and the producer's CPU
/// over a window from a margin before the storm's begin to a margin after
/// its end. Times are CLOCK_MONOTONIC ns.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StormTimeline {
    /// The window the timeline covers.
    #[serde(default)]
    pub window: Interval,
    /// Rings of the storm's process that dropped in the window, the storm's
    /// ring first (at most 8).
    #[serde(default)]
    pub rings: Vec<RingDrops>,
    /// The agent's scans in the window (begin, end); scans closer together
    /// than `scan_resolution_ns` are merged into one.
    #[serde(default)]
    pub scans: Vec<Interval>,
    /// Gap below which consecutive scans were merged, ns (0: none merged).
    #[serde(default)]
    pub scan_resolution_ns: u64,
    /// The scanner's time off its CPU in the window, from the sched probes
    /// (None: probes not active, states unknown). Time not covered was spent
    /// running or in its ordinary short pauses.
    #[serde(default)]
    pub scanner: Option<Vec<ScannerSpan>>,
    /// What the scanner lane shows, or why it is empty.
    #[serde(default)]
    pub scanner_note: String,
    /// The producer thread's CPU over the window, from probe events (None:
    /// probes not active).
    #[serde(default)]
    pub producer_cpu: Option<Vec<CpuSpan>>,
    /// What the producer CPU lane shows, or why it is empty.
    #[serde(default)]
    pub producer_cpu_note: String,
}

/// The drops of one ring over a storm's window.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RingDrops {
    /// Ring slot (for a `no_ring` storm, which has none: the table's
    /// capacity).
    pub slot: u32,
    /// Producer OS thread id (for a `no_ring` storm: the latest thread that
    /// found no slot, 0 if unknown).
    pub tid: u32,
    /// Its thread name.
    pub thread_name: String,
    /// This is the storm's own ring.
    #[serde(default)]
    pub storm_ring: bool,
    /// The ring's cumulative drop count as scans read it, oldest first: the
    /// drop rate between two samples is their difference over their
    /// distance. At most a few hundred (thinned evenly over time).
    #[serde(default)]
    pub samples: Vec<DropSample>,
}

/// A ring's drop counter read by a scan.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DropSample {
    /// When the scan read it, ns.
    pub at_mono_ns: u64,
    /// Observations the ring's slot had dropped by then (over its life).
    pub dropped: u64,
}

/// A stretch of time the scanner spent off its CPU.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ScannerSpan {
    /// Start, ns.
    pub begin_mono_ns: u64,
    /// End, ns.
    pub end_mono_ns: u64,
    /// `runnable_waiting` (preempted or woken, waiting for a CPU) or
    /// `blocked` (asleep).
    pub state: String,
    /// The CPU it waited for (runnable) or left (blocked).
    pub cpu: u32,
    /// The task that held that CPU until the scanner got it back (for a
    /// runnable wait), when known.
    #[serde(default)]
    pub holder: Option<TaskRef>,
}

/// A task by pid (the kernel's thread id) and command name.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TaskRef {
    /// Kernel pid (thread id).
    pub pid: u32,
    /// Command name.
    pub comm: String,
}

/// A thread on one CPU from `begin` to `end`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CpuSpan {
    /// Start, ns.
    pub begin_mono_ns: u64,
    /// End, ns.
    pub end_mono_ns: u64,
    /// The CPU.
    pub cpu: u32,
}

/// A gap between two scans of the agent's scanner.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ScanGap {
    /// CLOCK_MONOTONIC ns when the earlier scan ended.
    pub begin_mono_ns: u64,
    /// CLOCK_MONOTONIC ns when the next scan began.
    pub end_mono_ns: u64,
}

/// The cause of a storm, with its evidence.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Cause {
    /// Short machine-readable kind, e.g. `scanner_preempted`.
    pub kind: String,
    /// One readable sentence.
    pub summary: String,
    /// How sure the verdict is.
    pub confidence: Confidence,
    /// Supporting facts, readable.
    pub evidence: Vec<String>,
    /// The producer's push rate over the storm, as measured.
    #[serde(default)]
    pub rate: Option<PushRate>,
    /// What to change so that it does not happen again (the summary ends
    /// with it too).
    #[serde(default)]
    pub fix: Option<String>,
    /// The interval the verdict rests on (CLOCK_MONOTONIC ns): for a
    /// preempted scanner the time it was runnable but off-CPU, for a blocked
    /// one the time it slept.
    pub interval: Option<Interval>,
    /// The task that kept the scanner off its CPU, when known.
    pub culprit: Option<Culprit>,
}

/// How sure a storm's cause is. Serialised as `"high"` or `"low"`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Confidence {
    /// Inferred: from `/proc` counters, or from rates that are only bounds.
    #[default]
    Low,
    /// Observed: kernel events, or the agent's own timing and counters.
    High,
}

impl Confidence {
    /// `"high"` or `"low"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Low => "low",
        }
    }
}

impl std::fmt::Display for Confidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A producer's push rate over a storm, measured from the ring's counters
/// and the episode's edges.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PushRate {
    /// The estimate, observations per second.
    pub per_sec: f64,
    /// It was at least this.
    pub low_per_sec: f64,
    /// At most this, if the producer pushed without pause until the ring
    /// was drained (None: no upper bound known).
    pub high_per_sec: Option<f64>,
    /// The stretch it was measured over, ns.
    pub over_ns: u64,
    /// How it was measured, readable.
    pub basis: String,
}

/// A span of CLOCK_MONOTONIC time.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Interval {
    /// Start, ns.
    pub begin_mono_ns: u64,
    /// End, ns.
    pub end_mono_ns: u64,
}

/// A task named in a cause.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Culprit {
    /// Its pid as the kernel reports it (the thread id).
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// The CPU it held.
    pub cpu: u32,
}

/// A segment that failed validation.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RefusedSegment {
    /// Process it was found in.
    pub pid: u32,
    /// `/proc/<pid>/fd/<n>`.
    pub path: String,
    /// Why.
    pub reason: String,
    /// CLOCK_MONOTONIC ns when refused.
    pub at_mono_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_the_fixed_layout() {
        let mut histogram = LatencyHistogram::new();
        // ≤100 ns, ≤1 µs, ≤3 µs, ≤10 ms, beyond 10 s.
        for (value, n) in [(50, 3), (500, 2), (2_000, 1), (5_000_000, 4), (20_000_000_000, 1)] {
            histogram.record_n(value, n);
        }
        let buckets = Buckets::from_histogram(&histogram, |v| v);
        assert_eq!(buckets.count, 11);
        assert_eq!(buckets.sum_ns, 150 + 1_000 + 2_000 + 20_000_000 + 20_000_000_000);
        assert_eq!(buckets.counts.len(), BUCKET_BOUNDS_NS.len() + 1);
        let at = |bound: u64| buckets.counts[BUCKET_BOUNDS_NS.iter().position(|&b| b == bound).unwrap()];
        assert_eq!(at(100), 3);
        assert_eq!(at(1_000), 2);
        assert_eq!(at(3_000), 1);
        assert_eq!(at(10_000_000), 4);
        assert_eq!(*buckets.counts.last().unwrap(), 1, "+Inf");
        assert_eq!(buckets.counts.iter().sum::<u64>(), buckets.count);
        // A sample never counts under a bound it exceeds: just above 1 µs
        // goes to the 3 µs bucket.
        let mut above = LatencyHistogram::new();
        above.record(1_001);
        assert_eq!(Buckets::from_histogram(&above, |v| v).counts[3], 1);
        // Ticks are converted first: at 2 ticks per ns, 4000 ticks is 2 µs.
        let mut ticks = LatencyHistogram::new();
        ticks.record(4_000);
        let halved = Buckets::from_histogram(&ticks, |t| t / 2);
        assert_eq!((halved.counts[3], halved.sum_ns), (1, 2_000));
        assert_eq!(
            Buckets::from_histogram(&LatencyHistogram::new(), |v| v),
            Buckets::default()
        );
    }
}
