//! The agent's scan thread: discovery, attachment, draining, storms.
//!
//! One dedicated OS thread ([`Agent::spawn`]) does the work, because
//! draining is CPU work with a latency budget, not async work: it attaches
//! the segments a second thread finds walking `/proc` every
//! `discovery_interval` (a walk can take tens of milliseconds, which the
//! rings must not wait for), takes their segments'
//! consumer lease (asking an application's sidecar to hand over), drains
//! every attached segment through the core [`Drainer`], notices process
//! exits through pidfds (draining what the process left in its rings before
//! forgetting it after `retention`), turns drop episodes into storms and
//! publishes an [`AgentSnapshot`] every `publish_interval` for the HTTP
//! server, the exporters and the CLI.
//!
//! The pause between scans follows the fastest ring's measured push rate
//! ([`RingRates`]): the next scan comes before that ring is a quarter full,
//! between `min_scan_interval` and `max_scan_interval`, and backs off to
//! the longest while every ring is idle.
//!
//! After the scans, at most every [`POLICY_INTERVAL`] per process, the
//! agent runs the built-in [`AdaptivePolicy`] of
//! [`AdaptiveMutex`](subetha_core::AdaptiveMutex) over the process's
//! instances and writes the spin budgets it decides into their policy
//! words, as the application's sidecar would: one policy per tracked
//! process (its windows are per instance). A lock's park cost is its own
//! waiters' wake-ups; until it has some, every policy falls back on one
//! shared host measurement that a background thread takes (never the scan
//! thread: the measurement blocks for milliseconds).
//! `AgentConfig::adaptive_policy` turns this off.
//!
//! Stopping ([`AgentHandle::stop`]) drains once more and hands every lease
//! back, so the applications' sidecars resume.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::{Range, RangeInclusive};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use subetha_core::ObservationRing;
use subetha_core::clock;
use subetha_core::drain::{Drainer, ScanReport};
use subetha_core::lease::{LeaseScope, TakeoverRequest, word_pid};
use subetha_core::primitives::adaptive::{self, AdaptivePolicy};
use subetha_core::segment::{SegmentView, slot_state};
use subetha_core::stats::LatencyHistogram;

use std::os::unix::fs::MetadataExt;
use std::sync::mpsc::Receiver;

use crate::container::{Identity, LabelFrom};
use crate::diagnosis::{self, Facts, OffCpu, OwnWork, SchedSample};
use crate::discovery::{self, Candidate, ProcWalker};
use crate::history::BoundedHistory;
use crate::model::{
    AgentInfo, AgentSnapshot, Buckets, InstanceReport, ProcessReport, Quantiles, RefusedSegment, RingReport,
    ScanGap, StormReport,
};
use crate::pidns::{PidNamespace, TidMap};
use crate::probes::{LoadedProbes, OffCpuFilter, ProbeEvent, Role};
use crate::registration::{Registered, Registration};
use crate::report::timeline::{self, DropTrace, TimelineInputs};
use crate::ring_rates::RingRates;
use crate::sched_sampler::SchedSampler;

/// How the agent behaves.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Only these pids (None: every process we may inspect).
    pub pids: Option<Vec<u32>>,
    /// Pause between `/proc` scans.
    pub discovery_interval: Duration,
    /// Shortest pause between scans.
    pub min_scan_interval: Duration,
    /// Longest pause between scans.
    pub max_scan_interval: Duration,
    /// How often a snapshot is published.
    pub publish_interval: Duration,
    /// How long an exited process's final stats are kept.
    pub retention: Duration,
    /// How long to wait for a sidecar to hand its lease over.
    pub takeover_timeout: Duration,
    /// Storms kept.
    pub storm_history: usize,
    /// Listen for applications announcing their segments here (None: rely
    /// on the `/proc` scan only).
    pub registration_socket: Option<std::path::PathBuf>,
    /// Pin the scan thread to this CPU.
    pub scanner_cpu: Option<usize>,
    /// Whether to load the eBPF probes.
    pub probes: ProbeMode,
    /// Whether to run the adaptive-mutex policy on the processes drained
    /// (see the [module docs](self)).
    pub adaptive_policy: bool,
    /// Where processes' container labels come from.
    pub label_from: LabelFrom,
}

/// `--probes auto|on|off`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProbeMode {
    /// Load them when privileges and kernel allow; else one warning.
    #[default]
    Auto,
    /// Load them or fail to start.
    On,
    /// Never.
    Off,
}

/// The longest pause between scans by default, reached while every ring
/// stays below an eighth full. An idle agent's cost is mostly its wakeups, and
/// at 20 ms 100 idle rings stay within the 1%-of-a-core budget that
/// `tests/tests/agent_idle_cpu.rs` checks. A ring that fills
/// faster shortens the pause (see the module docs).
pub const DEFAULT_MAX_SCAN_INTERVAL: Duration = Duration::from_millis(20);

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            pids: None,
            discovery_interval: Duration::from_secs(1),
            min_scan_interval: Duration::from_micros(100),
            max_scan_interval: DEFAULT_MAX_SCAN_INTERVAL,
            publish_interval: Duration::from_millis(250),
            retention: Duration::from_secs(600),
            takeover_timeout: Duration::from_secs(2),
            storm_history: 1024,
            registration_socket: None,
            scanner_cpu: None,
            probes: ProbeMode::Auto,
            adaptive_policy: true,
            label_from: LabelFrom::Cgroup,
        }
    }
}

/// Shortest pause between two policy rounds on one process (the sidecar's
/// default `policy_interval`).
pub const POLICY_INTERVAL: Duration = Duration::from_millis(10);

/// Scans kept for finding the gaps that overlap a storm.
const SCAN_HISTORY: usize = 1 << 16;
/// Scheduler samples of the scan thread kept (one per `SCHED_SAMPLE_NS`).
const SCHED_HISTORY: usize = 8192;
/// How often the scan thread samples its own schedstat (without probes).
const SCHED_SAMPLE_NS: u64 = 10_000_000;
/// How often the probes' ring buffer is read.
const PROBE_DRAIN_NS: u64 = 50_000_000;
/// Producer threads whose CPU and migrations are remembered.
const PRODUCER_HISTORY: usize = 4096;
/// Migrations kept per producer thread.
const MIGRATION_HISTORY: usize = 64;
/// A scanner runqueue wait worth keeping as evidence.
const SIGNIFICANT_WAIT_NS: u64 = OffCpuFilter::SIGNIFICANT_WAIT_NS;
/// Scanner off-CPU intervals kept (from the probes).
const OFF_CPU_HISTORY: usize = 8192;
/// Stretches of the scan thread's own work kept.
const OWN_WORK_HISTORY: usize = 4096;
/// Own work shorter than this is not kept: it cannot explain a gap
/// between scans worth a diagnosis.
const OWN_WORK_MIN_NS: u64 = 50_000;
/// A storm's cause is (re)computed until this long after it ended, as late
/// kernel events and scheduler samples arrive.
const CAUSE_SETTLE_NS: u64 = 2_000_000_000;
/// A `no_ring` storm ends once the process's lost count has not grown for
/// this long.
const NO_RING_QUIET: u64 = 1_000_000_000;
/// Exited processes whose final reports are kept (within `retention`).
const EXITED_HISTORY: usize = 4096;
/// How long a segment may stay unpublished (magic 0) before it is refused.
const UNINITIALISED_GRACE: Duration = Duration::from_secs(5);
/// Refused segments remembered (one error log each).
const REFUSED_HISTORY: usize = 256;
/// Storms (the newest) whose timelines are kept for `report`.
const TIMELINE_HISTORY: usize = 64;
/// How often unsettled storms' timelines are rebuilt (and once more when
/// their cause settles).
const TIMELINE_REFRESH_NS: u64 = 200_000_000;
/// CPU observations kept per producer thread (for storm timelines).
const PRODUCER_CPU_HISTORY: usize = 256;

enum Lease {
    /// We drain.
    Held,
    /// Asked the holder to hand over.
    Requested(TakeoverRequest, Instant),
    /// Someone else drains; retry at the given time.
    Waiting(String, Instant),
}

struct Tracked {
    candidate: Candidate,
    pid: u32,
    uid: u32,
    comm: String,
    pidfd: OwnedFd,
    drainer: Drainer<Arc<SegmentView>>,
    lease: Lease,
    attached_mono_ns: u64,
    exited: Option<(u64, Instant)>,
    /// Highest drop-episode seq already turned into a storm, and storm ids
    /// of open episodes by episode seq.
    last_episode_seq: u64,
    open_storms: HashMap<u64, u64>,
    storms_begun: u64,
    /// The segment's `lost_no_ring` as last read, the open `no_ring` storm
    /// (its id) and when its count last grew (`clock::monotonic_ns()`).
    lost_no_ring_seen: u64,
    no_ring_storm: Option<(u64, u64)>,
    /// The adaptive-mutex policy for this process (None: turned off).
    policy: Option<AdaptivePolicy>,
    /// `clock::monotonic_ns()` from which the next policy round is due.
    next_policy_ns: u64,
    /// The segment's resident bytes as last measured, and when
    /// (`clock::monotonic_ns()`, 0: never). See [`RESIDENT_REFRESH`].
    resident_bytes: AtomicU64,
    resident_at_ns: AtomicU64,
    /// Its pid namespace.
    ns: PidNamespace,
    /// Maps its threads' ids to ours (a process in another pid namespace).
    tids: Option<TidMap>,
    /// Its container and service.
    identity: Identity,
}

/// How long a measurement of a segment's resident bytes is reused.
/// `mincore` over a whole segment walks every page of it (a segment
/// reserves tens of MiB of ring slots); measured at every 250 ms publish it
/// held a seventh of an idle agent's `perf` samples.
const RESIDENT_REFRESH: Duration = Duration::from_secs(5);

struct State {
    config: AgentConfig,
    /// Segments found before their header was published, and since when.
    uninitialised: HashMap<(u32, u64), Instant>,
    /// Settled storm causes per process, for the monotonic metric.
    cause_counts: HashMap<u32, BTreeMap<String, u64>>,
    /// Final reports of exited processes, oldest first, kept for `retention`.
    exited: BoundedHistory<(ProcessReport, Instant)>,
    registrations: Option<(Registration, Receiver<Registered>)>,
    tracked: Vec<Tracked>,
    refused: BoundedHistory<RefusedSegment>,
    refused_keys: HashSet<(u32, u64)>,
    storms: BoundedHistory<StormReport>,
    next_storm_id: u64,
    scans: BoundedHistory<(u64, u64)>,
    /// Observations drained by each scan in `scans`.
    scan_drained: BoundedHistory<u64>,
    scan_durations: LatencyHistogram,
    scan_gaps: LatencyHistogram,
    scan_count: u64,
    /// Each ring's push rate, and the pause before the next scan.
    rates: RingRates,
    last_scan_end: Option<u64>,
    scanner_tid: u32,
    sched_samples: BoundedHistory<SchedSample>,
    sched_sampler: Option<SchedSampler>,
    next_sched_sample_ns: u64,
    off_cpu: BoundedHistory<OffCpu>,
    /// The scan thread's own work between scans that took at least
    /// [`OWN_WORK_MIN_NS`], newest last: what a storm's gap may be blamed
    /// on.
    own_work: BoundedHistory<OwnWork>,
    probes_active: bool,
    probes: Option<LoadedProbes>,
    probes_note: String,
    probe_events: Vec<ProbeEvent>,
    probe_events_total: u64,
    next_probe_drain_ns: u64,
    /// Per producer thread: the CPU of its latest drop, and its migrations
    /// (ns, from, to), bounded.
    producer_cpus: HashMap<u32, u32>,
    producer_migrations: HashMap<u32, BoundedHistory<(u64, u32, u32)>>,
    /// Per producer thread: (ns, CPU) as probe events placed it, bounded;
    /// for storm timelines.
    producer_cpu_seen: HashMap<u32, BoundedHistory<(u64, u32)>>,
    /// Per process: its rings' drop counters where they changed, for storm
    /// timelines.
    drop_traces: HashMap<u32, DropTrace>,
    next_timeline_refresh_ns: u64,
}

/// The agent's scan engine (not yet running).
pub struct Agent {
    state: State,
}

/// A running agent.
pub struct AgentHandle {
    latest: Arc<Mutex<Arc<AgentSnapshot>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<AgentSnapshot>>,
}

impl Agent {
    /// An agent with `config`.
    pub fn new(config: AgentConfig) -> Self {
        let rates = RingRates::new(
            config.min_scan_interval,
            config.max_scan_interval,
            ObservationRing::CAPACITY as u64,
        );
        let storm_history = config.storm_history;
        Self {
            state: State {
                config,
                uninitialised: HashMap::new(),
                cause_counts: HashMap::new(),
                exited: BoundedHistory::new(EXITED_HISTORY),
                registrations: None,
                tracked: Vec::new(),
                refused: BoundedHistory::new(REFUSED_HISTORY),
                refused_keys: HashSet::new(),
                storms: BoundedHistory::new(storm_history),
                next_storm_id: 1,
                scans: BoundedHistory::new(SCAN_HISTORY),
                scan_drained: BoundedHistory::new(SCAN_HISTORY),
                scan_durations: LatencyHistogram::new(),
                scan_gaps: LatencyHistogram::new(),
                scan_count: 0,
                rates,
                last_scan_end: None,
                scanner_tid: 0,
                sched_samples: BoundedHistory::new(SCHED_HISTORY),
                sched_sampler: None,
                next_sched_sample_ns: 0,
                off_cpu: BoundedHistory::new(OFF_CPU_HISTORY),
                own_work: BoundedHistory::new(OWN_WORK_HISTORY),
                probes_active: false,
                probes: None,
                probes_note: "off".into(),
                probe_events: Vec::new(),
                probe_events_total: 0,
                next_probe_drain_ns: 0,
                producer_cpus: HashMap::new(),
                producer_migrations: HashMap::new(),
                producer_cpu_seen: HashMap::new(),
                drop_traces: HashMap::new(),
                next_timeline_refresh_ns: 0,
            },
        }
    }

    /// Starts the scan thread (and the registration listener, if
    /// configured; failing to bind it is a warning, not an error). Loads the
    /// eBPF probes per [`AgentConfig::probes`]: with `On`, failing to load
    /// them is an error.
    pub fn spawn(mut self) -> std::io::Result<AgentHandle> {
        match self.state.config.probes {
            ProbeMode::Off => self.state.probes_note = "off".into(),
            mode => match LoadedProbes::load() {
                Ok(mut probes) => {
                    // Only intervals that can explain a storm reach user
                    // space; the kernel counts the rest.
                    let max_pause = self.state.config.max_scan_interval.as_nanos() as u64;
                    if let Err(error) = probes.set_off_cpu_filter(Some(OffCpuFilter::for_agent(max_pause))) {
                        tracing::warn!(%error, "off-CPU event filter not set; every interval is reported");
                    }
                    self.state.probes_note = probes.summary();
                    tracing::info!(probes = %self.state.probes_note, "eBPF probes loaded");
                    self.state.probes = Some(probes);
                }
                Err(error) if mode == ProbeMode::On => {
                    return Err(std::io::Error::other(format!("--probes on: {error}")));
                }
                Err(error) => {
                    tracing::warn!(
                        %error,
                        "eBPF probes unavailable; storms get a lower-confidence cause from /proc"
                    );
                    self.state.probes_note = format!("unavailable: {error}");
                }
            },
        }
        if self.state.config.adaptive_policy {
            // Start the park-cost measurement now, on its own thread, so the
            // first decisions already have it.
            adaptive::shared_park_cost_ns();
        }
        if let Some(path) = self.state.config.registration_socket.clone() {
            let (tx, rx) = std::sync::mpsc::channel();
            match Registration::start(&path, tx) {
                Ok(registration) => {
                    tracing::info!(path = %path.display(), "registration socket listening");
                    self.state.registrations = Some((registration, rx));
                }
                Err(error) => tracing::warn!(
                    path = %path.display(),
                    %error,
                    "registration socket unavailable; discovering through /proc only"
                ),
            }
        }
        let walker = ProcWalker::start(
            self.state.config.pids.clone(),
            self.state.config.discovery_interval,
        )?;
        let latest = Arc::new(Mutex::new(Arc::new(AgentSnapshot::default())));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name("subetha-scan".into()).spawn({
            let latest = Arc::clone(&latest);
            let stop = Arc::clone(&stop);
            move || self.run(&walker, &latest, &stop)
        })?;
        Ok(AgentHandle {
            latest,
            stop,
            thread: Some(thread),
        })
    }

    fn run(
        mut self,
        walker: &ProcWalker,
        latest: &Mutex<Arc<AgentSnapshot>>,
        stop: &AtomicBool,
    ) -> AgentSnapshot {
        // SAFETY: gettid has no preconditions.
        self.state.scanner_tid = unsafe { libc::gettid() } as u32;
        if let Some(cpu) = self.state.config.scanner_cpu
            && let Err(error) = pin_to_cpu(cpu)
        {
            tracing::warn!(cpu, %error, "cannot pin the scan thread");
        }
        self.state.sched_sampler = SchedSampler::for_current_thread();
        let scanner_tid = self.state.scanner_tid;
        if let Some(probes) = self.state.probes.as_mut() {
            if let Err(error) = probes.attach_scanner(std::process::id(), scanner_tid) {
                tracing::warn!(%error, "scan-hook uprobes not attached in the agent");
            }
            self.state.probes_active = probes.sched_active();
            self.state.probes_note = probes.summary();
        }
        let mut next_publish = Instant::now();
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            self.state.timed("attaching segments", |state| {
                for candidates in walker.take() {
                    state.attach_found(candidates);
                }
                state.take_registrations();
            });
            self.state.scan_all();
            // The pause runs from the end of the scan: the agent's own work
            // below comes out of it rather than adding to the rings' wait.
            let next_scan = Instant::now() + self.state.rates.pause();
            self.state.sample_scheduler();
            self.state
                .timed("reading the probes' events", State::drain_probe_events);
            if now >= next_publish {
                self.state.timed("publishing a snapshot", |state| {
                    state.refresh_causes();
                    *latest.lock() = Arc::new(state.snapshot());
                });
                next_publish = now + self.state.config.publish_interval;
            }
            let pause = next_scan.saturating_duration_since(Instant::now());
            if !pause.is_zero() {
                std::thread::park_timeout(pause);
            }
        }
        self.state.scan_all();
        self.state.drain_probe_events();
        self.state.refresh_causes();
        // The final picture is the one we drained; then hand the leases back.
        let last = self.state.snapshot();
        self.state.release_all();
        *latest.lock() = Arc::new(last.clone());
        last
    }
}

impl AgentHandle {
    /// The latest published snapshot.
    pub fn snapshot(&self) -> Arc<AgentSnapshot> {
        Arc::clone(&self.latest.lock())
    }

    /// Stops the scan thread: a final drain, leases handed back. Returns the
    /// final snapshot.
    pub fn stop(mut self) -> AgentSnapshot {
        self.stop_inner().unwrap_or_default()
    }

    fn stop_inner(&mut self) -> Option<AgentSnapshot> {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.take()?;
        thread.thread().unpark();
        thread.join().ok()
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

impl State {
    /// Runs `work`, the scan thread's own work between two scans, and keeps
    /// its stretch if it took [`OWN_WORK_MIN_NS`] or more.
    fn timed<R>(&mut self, what: &'static str, work: impl FnOnce(&mut Self) -> R) -> R {
        let begin_ns = clock::monotonic_ns();
        let result = work(self);
        let end_ns = clock::monotonic_ns();
        if end_ns.saturating_sub(begin_ns) >= OWN_WORK_MIN_NS {
            self.own_work.push(OwnWork {
                begin_ns,
                end_ns,
                what,
            });
        }
        result
    }

    fn take_registrations(&mut self) {
        let Some((_, rx)) = &self.registrations else {
            return;
        };
        let registered: Vec<Registered> = rx.try_iter().collect();
        for Registered { pid, file } in registered {
            if let Some(pids) = &self.config.pids
                && !pids.contains(&pid)
            {
                continue; // --pid limits registrations too
            }
            let inode = file.metadata().map(|m| m.ino()).unwrap_or(0);
            let candidate = Candidate {
                pid,
                fd: u32::MAX,
                inode,
            };
            if self.is_known(&candidate) {
                continue;
            }
            match discovery::validate_file(pid, &file) {
                Ok(opened) => self.attach(candidate, opened),
                Err(error) => self.not_attached(&candidate, error),
            }
        }
    }

    /// Whether this segment (pid and memfd inode: several descriptors may
    /// name one segment) was already attached or refused.
    fn is_known(&self, candidate: &Candidate) -> bool {
        self.refused_keys.contains(&(candidate.pid, candidate.inode))
            || self
                .tracked
                .iter()
                .any(|t| t.pid == candidate.pid && t.candidate.inode == candidate.inode)
    }

    /// Attaches the segments a walk of `/proc` found that are not tracked
    /// yet.
    fn attach_found(&mut self, candidates: Vec<Candidate>) {
        for candidate in candidates {
            if self.is_known(&candidate) {
                continue;
            }
            match discovery::open_segment(&candidate) {
                Ok(opened) => {
                    self.uninitialised.remove(&(candidate.pid, candidate.inode));
                    self.attach(candidate, opened);
                }
                Err(error) => self.not_attached(&candidate, error),
            }
        }
    }

    /// Handles a failed attach: a vanished process is forgotten; a segment
    /// whose magic is still 0 was found between `memfd_create` and the
    /// header's publication and is retried, for a while; anything else is
    /// refused (once).
    fn not_attached(&mut self, candidate: &Candidate, error: discovery::AttachError) {
        use subetha_core::segment::SegmentError;
        match error {
            discovery::AttachError::Gone(_) => {}
            discovery::AttachError::Invalid(SegmentError::BadMagic(0)) => {
                let key = (candidate.pid, candidate.inode);
                let since = *self.uninitialised.entry(key).or_insert_with(Instant::now);
                if since.elapsed() > UNINITIALISED_GRACE {
                    self.uninitialised.remove(&key);
                    self.refuse(candidate, format!("{error} for over {UNINITIALISED_GRACE:?}"));
                }
            }
            error => self.refuse(candidate, error.to_string()),
        }
    }

    fn refuse(&mut self, candidate: &Candidate, reason: String) {
        if let Some(permit) = crate::logging::throttle("refusing subetha segment", candidate.pid) {
            tracing::error!(
                pid = candidate.pid,
                path = %candidate.path().display(),
                %reason,
                "refusing subetha segment{permit}"
            );
        }
        self.refused_keys.insert((candidate.pid, candidate.inode));
        self.refused.push(RefusedSegment {
            pid: candidate.pid,
            path: candidate.path().display().to_string(),
            reason,
            at_mono_ns: clock::monotonic_ns(),
        });
    }

    fn attach(&mut self, candidate: Candidate, opened: discovery::OpenedSegment) {
        let view = Arc::new(opened.view);
        let drainer = Drainer::with_lease(Arc::clone(&view), None);
        let mut tracked = Tracked {
            candidate,
            pid: opened.pid,
            uid: opened.uid,
            comm: opened.comm,
            pidfd: opened.pidfd,
            drainer,
            lease: Lease::Waiting(String::new(), Instant::now()),
            attached_mono_ns: clock::monotonic_ns(),
            exited: None,
            last_episode_seq: 0,
            open_storms: HashMap::new(),
            storms_begun: 0,
            lost_no_ring_seen: 0,
            no_ring_storm: None,
            policy: self.config.adaptive_policy.then(AdaptivePolicy::default),
            next_policy_ns: 0,
            resident_bytes: AtomicU64::new(0),
            resident_at_ns: AtomicU64::new(0),
            tids: opened.ns.foreign.then(|| TidMap::new(opened.pid)),
            ns: opened.ns,
            identity: Identity::of(opened.pid, self.config.label_from),
        };
        if tracked.tids.is_some() {
            tracked.drainer.set_foreign_tids();
        }
        tracing::info!(
            pid = tracked.pid,
            comm = %tracked.comm,
            nspid = %tracked.ns.describe(),
            container = tracked.identity.container_id.as_deref().unwrap_or("-"),
            "attached subetha segment"
        );
        if let Some(probes) = self.probes.as_mut()
            && let Err(error) = probes.attach_producer_process(tracked.pid)
            && let Some(permit) = crate::logging::throttle("drop-hook uprobes not attached", tracked.pid)
        {
            tracing::warn!(pid = tracked.pid, %error, "drop-hook uprobes not attached{permit}");
        }
        tracked.try_take_lease(self.config.takeover_timeout);
        self.tracked.push(tracked);
    }

    fn scan_all(&mut self) {
        let started = clock::monotonic_ns();
        if let Some(end) = self.last_scan_end {
            self.scan_gaps.record(started.saturating_sub(end));
        }
        let mut load = ScanReport::default();
        for tracked in self.tracked.iter_mut() {
            if tracked.exited.is_some() {
                continue;
            }
            tracked.try_take_lease(self.config.takeover_timeout);
            let exited = discovery::has_exited(&tracked.pidfd);
            if !matches!(tracked.lease, Lease::Held) {
                if exited {
                    // Nobody drains a dead process's leftovers but us: its
                    // sidecar died with it, so the lease is free to take.
                    tracked.try_take_lease(Duration::ZERO);
                }
                if !matches!(tracked.lease, Lease::Held) {
                    if exited {
                        tracked.exited = Some((clock::monotonic_ns(), Instant::now()));
                    }
                    continue;
                }
            }
            let report = tracked.drainer.scan();
            tracked.map_thread_ids();
            self.rates.observe(
                tracked.pid,
                tracked.drainer.rings(),
                report.started_mono_ns.saturating_add(report.duration_ns),
            );
            load.merge_load(&report);
            tracked.run_policy(report.started_mono_ns.saturating_add(report.duration_ns));
            if exited {
                // Final drain: the process is gone, its rings hold the rest.
                for _ in 0..64 {
                    let report = tracked.drainer.scan();
                    if report.drained == 0 {
                        break;
                    }
                }
                tracked.exited = Some((clock::monotonic_ns(), Instant::now()));
                tracing::info!(pid = tracked.pid, "process exited; final stats kept");
            }
        }
        let ended = clock::monotonic_ns();
        self.scan_durations.record(ended.saturating_sub(started));
        self.scan_count += 1;
        self.last_scan_end = Some(ended);
        self.scans.push((started, ended));
        self.scan_drained.push(load.drained);
        self.trace_drops(ended);
        for index in 0..self.tracked.len() {
            self.update_storms(index);
            self.update_no_ring(index, ended);
        }
        self.retire_exited();
        self.rates.after_pass(load.rings_left_full);
        self.expire();
    }

    /// Freezes exited processes into reports and unmaps their segments: an
    /// exited process's final stats cost a report, not its rings' memory.
    fn retire_exited(&mut self) {
        let mut index = 0;
        while index < self.tracked.len() {
            if self.tracked[index].exited.is_none() {
                index += 1;
                continue;
            }
            let tracked = self.tracked.swap_remove(index);
            self.rates.forget(tracked.pid);
            if let Some(probes) = self.probes.as_mut() {
                probes.detach_process(tracked.pid);
                for ring in tracked.drainer.rings() {
                    probes.unwatch(ring.os_tid);
                }
            }
            let at = tracked.exited.map_or_else(Instant::now, |(_, at)| at);
            // Storms still open when the process died end with it (a
            // `no_ring` storm where its count last grew).
            let exit_ns = tracked.exited.map_or_else(clock::monotonic_ns, |(ns, _)| ns);
            if let Some((storm_id, last)) = tracked.no_ring_storm
                && let Some(storm) = self.storms.iter_mut().rev().find(|s| s.id == storm_id)
                && storm.end_mono_ns.is_none()
            {
                storm.end_mono_ns = Some(last.max(storm.begin_mono_ns));
                storm.end_estimated = true;
                storm.duration_ns = last.saturating_sub(storm.begin_mono_ns);
            }
            for storm_id in tracked.open_storms.values() {
                if let Some(storm) = self.storms.iter_mut().rev().find(|s| s.id == *storm_id)
                    && storm.end_mono_ns.is_none()
                {
                    storm.end_mono_ns = Some(exit_ns.max(storm.begin_mono_ns));
                    storm.end_estimated = true;
                    storm.duration_ns = exit_ns.saturating_sub(storm.begin_mono_ns);
                }
            }
            self.exited.push((tracked.report(), at));
        }
    }

    /// Samples the scan thread's run delay (the fallback when the sched
    /// probes are not running).
    fn sample_scheduler(&mut self) {
        let now = clock::monotonic_ns();
        if now < self.next_sched_sample_ns || self.probes_active {
            return;
        }
        self.next_sched_sample_ns = now + SCHED_SAMPLE_NS;
        if let Some(sample) = self.sched_sampler.as_ref().and_then(|s| s.sample(now)) {
            self.sched_samples.push(sample);
        }
    }

    /// Reads the probes' events (on a timer: they are submitted without
    /// wakeups) and keeps the producer thread watch list current.
    fn drain_probe_events(&mut self) {
        let now = clock::monotonic_ns();
        if now < self.next_probe_drain_ns {
            return;
        }
        self.next_probe_drain_ns = now + PROBE_DRAIN_NS;
        let Some(probes) = self.probes.as_mut() else {
            return;
        };
        // Watch every live producer thread of the attached processes.
        let wanted: HashSet<u32> = self
            .tracked
            .iter()
            .flat_map(|t| t.drainer.rings().iter())
            .filter(|r| r.state == slot_state::ACTIVE && r.os_tid != 0)
            .map(|r| r.os_tid)
            .collect();
        for (tid, role) in probes.watched() {
            if role == Role::Producer && !wanted.contains(&tid) {
                probes.unwatch(tid);
            }
        }
        let watched: HashSet<u32> = probes.watched().into_iter().map(|(tid, _)| tid).collect();
        for tid in wanted.difference(&watched) {
            if let Err(error) = probes.watch(*tid, Role::Producer) {
                tracing::debug!(tid, %error, "cannot watch producer thread");
            }
        }
        let mut events = std::mem::take(&mut self.probe_events);
        events.clear();
        probes.drain_events(&mut events);
        self.probes_active = probes.sched_active();
        self.probe_events_total += events.len() as u64;
        for event in &events {
            match event {
                ProbeEvent::OffCpu(interval) if interval.tid == self.scanner_tid => {
                    self.record_off_cpu(OffCpu {
                        tid: interval.tid,
                        out_ns: interval.out_ts,
                        in_ns: interval.in_ts,
                        preempted: interval.preempted(),
                        state: interval.out_state,
                        wakeup_ns: (interval.wakeup_ts != 0).then_some(interval.wakeup_ts),
                        cpu_out: interval.cpu_out,
                        cpu_in: interval.cpu_in,
                        holder_pid: interval.holder_pid,
                        holder_comm: interval.holder_comm.clone(),
                        switch_in_unseen: interval.switch_in_unseen,
                    });
                }
                ProbeEvent::DropBegin { tid, cpu, ts_ns, .. } => {
                    self.producer_cpus.insert(*tid, *cpu);
                    self.saw_producer_on(*tid, *ts_ns, *cpu);
                }
                ProbeEvent::DropEnd { tid, cpu, ts_ns, .. } => self.saw_producer_on(*tid, *ts_ns, *cpu),
                ProbeEvent::OffCpu(interval) if wanted.contains(&interval.tid) => {
                    self.saw_producer_on(interval.tid, interval.out_ts, interval.cpu_out);
                    self.saw_producer_on(interval.tid, interval.in_ts, interval.cpu_in);
                }
                ProbeEvent::Migrate {
                    tid,
                    orig_cpu,
                    dest_cpu,
                    ts_ns,
                    ..
                } if wanted.contains(tid) => {
                    self.producer_migrations
                        .entry(*tid)
                        .or_insert_with(|| BoundedHistory::new(MIGRATION_HISTORY))
                        .push((*ts_ns, *orig_cpu, *dest_cpu));
                    self.producer_cpus.insert(*tid, *dest_cpu);
                    self.saw_producer_on(*tid, *ts_ns, *dest_cpu);
                }
                _ => {}
            }
        }
        self.probe_events = events;
        // Keep what gone threads did for a while (their storms are still
        // being diagnosed); bound the maps.
        if self.producer_cpus.len() > PRODUCER_HISTORY {
            self.producer_cpus.retain(|tid, _| wanted.contains(tid));
        }
        if self.producer_migrations.len() > PRODUCER_HISTORY {
            self.producer_migrations.retain(|tid, _| wanted.contains(tid));
        }
        if self.producer_cpu_seen.len() > PRODUCER_HISTORY {
            self.producer_cpu_seen.retain(|tid, _| wanted.contains(tid));
        }
    }

    /// Remembers that a probe event saw producer `tid` on `cpu` at `at_ns`.
    fn saw_producer_on(&mut self, tid: u32, at_ns: u64, cpu: u32) {
        if at_ns == 0 {
            return;
        }
        self.producer_cpu_seen
            .entry(tid)
            .or_insert_with(|| BoundedHistory::new(PRODUCER_CPU_HISTORY))
            .push((at_ns, cpu));
    }

    /// Records the drop counters the scan that ended at `ended` read, per
    /// process (only changes are kept).
    fn trace_drops(&mut self, ended: u64) {
        let previous_end = self.scans.iter().rev().nth(1).map(|&(_, end)| end);
        for tracked in &self.tracked {
            self.drop_traces.entry(tracked.pid).or_default().record(
                tracked.drainer.rings(),
                previous_end,
                ended,
            );
        }
    }

    /// Rebuilds the timelines of storms whose cause has not settled (on a
    /// timer, and a last time as it settles), forgets the timelines of all
    /// but the newest [`TIMELINE_HISTORY`] storms and the drop traces of
    /// processes that neither run nor have such a storm.
    fn refresh_timelines(&mut self, now: u64) {
        let due = now >= self.next_timeline_refresh_ns;
        if due {
            self.next_timeline_refresh_ns = now + TIMELINE_REFRESH_NS;
        }
        let mut pids_in_use: HashSet<u32> = self.tracked.iter().map(|t| t.pid).collect();
        for (index, storm) in self.storms.iter_mut().rev().enumerate() {
            if index >= TIMELINE_HISTORY {
                if storm.timeline.is_none() {
                    break; // older ones were forgotten before
                }
                storm.timeline = None;
                continue;
            }
            if storm.cause_settled {
                continue;
            }
            pids_in_use.insert(storm.pid);
            let settling = storm
                .end_mono_ns
                .is_some_and(|end| now.saturating_sub(end) > CAUSE_SETTLE_NS);
            if !(due || settling || storm.timeline.is_none()) {
                continue;
            }
            let inputs = TimelineInputs {
                now,
                trace: self.drop_traces.get(&storm.pid),
                scans: &self.scans,
                probes_active: self.probes_active,
                probes_note: &self.probes_note,
                off_cpu: &self.off_cpu,
                min_wait_ns: SIGNIFICANT_WAIT_NS,
                max_ordinary_sleep_ns: (self.config.max_scan_interval.as_nanos() as u64).saturating_mul(2),
                producer_cpu: self.producer_cpu_seen.get(&storm.tid).map(|seen| &**seen),
                producer_cpu_latest: self.producer_cpus.get(&storm.tid).copied(),
            };
            let built = timeline::build(storm, &inputs, storm.timeline.as_deref());
            storm.timeline = Some(Arc::new(built));
        }
        if due {
            self.drop_traces.retain(|pid, _| pids_in_use.contains(pid));
        }
    }

    /// Records a scanner off-CPU interval reported by the sched probes.
    pub(crate) fn record_off_cpu(&mut self, interval: OffCpu) {
        // Keep only intervals that could explain a storm: a real runqueue
        // wait, or a sleep beyond the scanner's own pause. The scanner's
        // ordinary pauses (thousands a second) would otherwise push the
        // evidence out of the history before its storm's cause settles.
        let pause = self.config.max_scan_interval.as_nanos() as u64;
        if interval.runnable_wait_ns() < SIGNIFICANT_WAIT_NS
            && interval.asleep_ns() <= pause.saturating_mul(2)
        {
            return;
        }
        self.off_cpu.push(interval);
    }

    /// Diagnoses storms that ended recently (or still go on).
    fn refresh_causes(&mut self) {
        let now = clock::monotonic_ns();
        self.refresh_timelines(now);
        // Borrowed in place, not copied: this runs on the scan thread, and
        // every microsecond here is one the rings wait.
        let samples: &[SchedSample] = self.sched_samples.make_contiguous();
        let off_cpu: &[OffCpu] = self.off_cpu.make_contiguous();
        let own_work: &[OwnWork] = self.own_work.make_contiguous();
        for storm in self.storms.iter_mut().rev() {
            if storm.cause_settled {
                break; // older storms settled before this one
            }
            let settled = storm
                .end_mono_ns
                .is_some_and(|end| now.saturating_sub(end) > CAUSE_SETTLE_NS);
            if let Some(verdict) = storm.cause.as_ref().filter(|c| c.kind == diagnosis::NO_RING) {
                // Its cause is known from the counter; nothing to diagnose.
                if settled {
                    storm.cause_settled = true;
                    *self
                        .cause_counts
                        .entry(storm.pid)
                        .or_default()
                        .entry(verdict.kind.clone())
                        .or_default() += 1;
                }
                continue;
            }
            // Copying the whole history instead cost milliseconds per
            // publish in a debug build, long enough to stall the scanner it
            // was diagnosing.
            let lookback = storm
                .max_scan_gap_ns
                .max(self.config.max_scan_interval.as_nanos() as u64);
            let window = storm.begin_mono_ns.saturating_sub(lookback)..=storm.end_mono_ns.unwrap_or(now);
            let range = scans_for_diagnosis(&self.scans, window);
            let scans: Vec<(u64, u64)> = self.scans.range(range.clone()).copied().collect();
            let scan_drained: Vec<u64> = self.scan_drained.range(range).copied().collect();
            let facts = Facts {
                off_cpu,
                probes: self.probes_active,
                scans: &scans,
                scan_drained: &scan_drained,
                max_interval_ns: self.config.max_scan_interval.as_nanos() as u64,
                min_interval_ns: self.config.min_scan_interval.as_nanos() as u64,
                ring_capacity: ObservationRing::CAPACITY as u64,
                sched_samples: samples,
                producer_cpu: producer_cpu_at(
                    self.producer_cpu_seen.get(&storm.tid).map(|seen| &**seen),
                    storm.end_mono_ns.unwrap_or(now),
                )
                .or_else(|| self.producer_cpus.get(&storm.tid).copied()),
                producer_migrations: &self
                    .producer_migrations
                    .get(&storm.tid)
                    .map(|m| m.iter().copied().collect::<Vec<_>>())
                    .unwrap_or_default(),
                own_work,
            };
            let verdict = diagnosis::diagnose(storm, &facts);
            // Evidence only ever leaves the bounded histories: a verdict
            // with kernel evidence is not replaced by a weaker one.
            let verdict = match storm.cause.take() {
                Some(old) if old.confidence > verdict.confidence => old,
                _ => verdict,
            };
            if settled {
                storm.cause_settled = true;
                *self
                    .cause_counts
                    .entry(storm.pid)
                    .or_default()
                    .entry(verdict.kind.clone())
                    .or_default() += 1;
            }
            storm.cause = Some(verdict);
        }
    }

    fn expire(&mut self) {
        let retention = self.config.retention;
        while self
            .exited
            .front()
            .is_some_and(|(_, at)| at.elapsed() >= retention)
        {
            self.exited.pop_oldest();
        }
    }

    fn update_storms(&mut self, index: usize) {
        let tracked = &mut self.tracked[index];
        let instance_name = |id: u32| {
            tracked
                .drainer
                .instances()
                .chain(tracked.drainer.retired())
                .find(|r| r.meta.id == id)
                .map(|r| r.meta.name.clone())
        };
        let mut new = Vec::new();
        let mut updates = Vec::new();
        // Newest first, stopping at the first episode that is neither new nor
        // open: an idle scan costs nothing however long the history is.
        let oldest_open = tracked.open_storms.keys().min().copied().unwrap_or(u64::MAX);
        for episode in tracked.drainer.episodes().rev() {
            if episode.seq > tracked.last_episode_seq {
                new.push((episode.clone(), instance_name(episode.first_instance)));
            } else if let Some(&storm_id) = tracked.open_storms.get(&episode.seq) {
                updates.push((storm_id, episode.clone()));
            } else if episode.seq < oldest_open {
                break;
            }
        }
        new.reverse();
        for (storm_id, episode) in updates {
            let gaps = overlapping_gaps(&self.scans, episode.begin_mono_ns, episode.end_mono_ns);
            if let Some(storm) = self.storms.iter_mut().rev().find(|s| s.id == storm_id) {
                storm.end_mono_ns = episode.end_mono_ns;
                if storm.tid == 0 {
                    // A containerized thread mapped after the storm began.
                    storm.tid = episode.os_tid;
                }
                storm.end_estimated = episode.end_estimated;
                storm.dropped = episode.dropped;
                storm.duration_ns = episode
                    .end_mono_ns
                    .unwrap_or_else(clock::monotonic_ns)
                    .saturating_sub(episode.begin_mono_ns);
                storm.max_scan_gap_ns = gaps.first().map_or(0, |g| g.end_mono_ns - g.begin_mono_ns);
                storm.scan_gaps = gaps;
            }
            if episode.end_mono_ns.is_some() {
                tracked.open_storms.remove(&episode.seq);
            }
        }
        for (episode, first_instance) in new {
            tracked.last_episode_seq = episode.seq;
            tracked.storms_begun += 1;
            let id = self.next_storm_id;
            self.next_storm_id += 1;
            let gaps = overlapping_gaps(&self.scans, episode.begin_mono_ns, episode.end_mono_ns);
            if episode.end_mono_ns.is_none() {
                tracked.open_storms.insert(episode.seq, id);
            }
            let storm = StormReport {
                id,
                pid: tracked.pid,
                comm: tracked.comm.clone(),
                container_id: tracked.identity.container_id.clone(),
                slot: episode.slot,
                tid: episode.os_tid,
                ns_tid: episode.ns_tid,
                thread_name: episode.thread_name.clone(),
                begin_mono_ns: episode.begin_mono_ns,
                end_mono_ns: episode.end_mono_ns,
                end_estimated: episode.end_estimated,
                duration_ns: episode
                    .end_mono_ns
                    .unwrap_or_else(clock::monotonic_ns)
                    .saturating_sub(episode.begin_mono_ns),
                dropped: episode.dropped,
                first_instance_id: episode.first_instance,
                first_instance,
                merged: episode.merged,
                max_scan_gap_ns: gaps.first().map_or(0, |g| g.end_mono_ns - g.begin_mono_ns),
                scan_gaps: gaps,
                attempts_at_open: self
                    .rates
                    .last_two(tracked.pid, episode.slot)
                    .map(|(before, found)| found.attempts().saturating_sub(before.attempts())),
                rate_before_per_sec: self.rates.rate_before_latest(tracked.pid, episode.slot),
                cause: None,
                cause_settled: false,
                timeline: None,
            };
            if let Some(permit) = crate::logging::throttle("drop storm", storm.pid) {
                tracing::warn!(
                    storm = id,
                    pid = storm.pid,
                    tid = storm.tid,
                    thread = %storm.thread_name,
                    dropped = storm.dropped,
                    "drop storm{permit}"
                );
            }
            self.storms.push(storm);
        }
    }

    /// Observations lost because their thread found no ring slot are a
    /// storm of their own (cause `no_ring`): one per run of losses, open
    /// while the count grows and ended [`NO_RING_QUIET`] after it stopped,
    /// naming the latest thread that found the table full.
    fn update_no_ring(&mut self, index: usize, now: u64) {
        let tracked = &mut self.tracked[index];
        let live = tracked.drainer.view().live();
        let lost = live.lost_no_ring.load(Ordering::Relaxed);
        let ns_tid = live.lost_no_ring_tid.load(Ordering::Relaxed);
        // The app wrote its own tid; in a container, ours differs.
        let tid = match tracked.tids.as_mut() {
            Some(tids) if ns_tid != 0 => tids.host_tid(ns_tid).unwrap_or(0),
            _ => ns_tid,
        };
        let capacity = tracked.drainer.view().layout().ring_slot_capacity;
        let grown = lost.saturating_sub(tracked.lost_no_ring_seen);
        if grown == 0 && lost >= tracked.lost_no_ring_seen {
            if let Some((storm_id, last)) = tracked.no_ring_storm
                && now.saturating_sub(last) > NO_RING_QUIET
            {
                tracked.no_ring_storm = None;
                if let Some(storm) = self.storms.iter_mut().rev().find(|s| s.id == storm_id) {
                    storm.end_mono_ns = Some(last);
                    storm.end_estimated = true;
                    storm.duration_ns = last.saturating_sub(storm.begin_mono_ns);
                }
            }
            return;
        }
        // A count that went down was rewritten by the process: start over.
        tracked.lost_no_ring_seen = lost;
        if grown == 0 {
            return;
        }
        let thread = (tid != 0).then_some(tid);
        let summary = |dropped: u64| {
            format!(
                "{dropped} observations lost: every one of the {capacity} ring slots was in use by a live thread{}; raise SUBETHA_RING_SLOTS above the number of observing threads",
                thread.map_or_else(String::new, |t| format!(" when thread {t} needed one"))
            )
        };
        if let Some((storm_id, _)) = tracked.no_ring_storm
            && let Some(storm) = self.storms.iter_mut().rev().find(|s| s.id == storm_id)
        {
            storm.dropped += grown;
            storm.duration_ns = now.saturating_sub(storm.begin_mono_ns);
            storm.tid = tid;
            storm.ns_tid = ns_tid;
            if let Some(cause) = storm.cause.as_mut() {
                cause.summary = summary(storm.dropped);
            }
            tracked.no_ring_storm = Some((storm_id, now));
            return;
        }
        let id = self.next_storm_id;
        self.next_storm_id += 1;
        tracked.storms_begun += 1;
        tracked.no_ring_storm = Some((id, now));
        if let Some(permit) = crate::logging::throttle("no ring slot", tracked.pid) {
            tracing::warn!(
                storm = id,
                pid = tracked.pid,
                tid,
                lost = grown,
                slots = capacity,
                "observations lost: no free ring slot; raise SUBETHA_RING_SLOTS{permit}"
            );
        }
        let storm = StormReport {
            id,
            pid: tracked.pid,
            comm: tracked.comm.clone(),
            container_id: tracked.identity.container_id.clone(),
            slot: capacity,
            tid,
            ns_tid,
            thread_name: String::new(),
            begin_mono_ns: now,
            end_mono_ns: None,
            end_estimated: false,
            duration_ns: 0,
            dropped: grown,
            first_instance_id: 0,
            first_instance: None,
            merged: 0,
            scan_gaps: Vec::new(),
            max_scan_gap_ns: 0,
            attempts_at_open: None,
            rate_before_per_sec: None,
            cause: Some(crate::model::Cause {
                kind: diagnosis::NO_RING.into(),
                summary: summary(grown),
                confidence: crate::model::Confidence::High,
                evidence: vec![format!(
                    "the segment's lost_no_ring counter grew by {grown} (to {lost}) between two scans; the ring table has {capacity} slots"
                )],
                interval: None,
                culprit: None,
                rate: None,
                fix: Some("raise SUBETHA_RING_SLOTS above the number of observing threads".into()),
            }),
            cause_settled: false,
            timeline: None,
        };
        self.storms.push(storm);
    }

    fn release_all(&mut self) {
        for tracked in &mut self.tracked {
            tracked.drainer.release_lease();
            if let Lease::Requested(request, _) =
                std::mem::replace(&mut tracked.lease, Lease::Waiting(String::new(), Instant::now()))
            {
                // Withdraw by waiting zero time.
                let _ = request
                    .wait(tracked.drainer.view(), Duration::ZERO)
                    .map(|lease| lease.release(tracked.drainer.view()));
            }
        }
    }

    fn snapshot(&self) -> AgentSnapshot {
        let now = clock::monotonic_ns();
        AgentSnapshot {
            agent: AgentInfo {
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").into(),
                taken_mono_ns: now,
                taken_unix_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                scans: self.scan_count,
                scan_interval_us: self.rates.pause().as_micros() as u64,
                scan_duration_ns: Quantiles::from_histogram(&self.scan_durations, |v| v),
                scan_gap_ns: Quantiles::from_histogram(&self.scan_gaps, |v| v),
                scan_duration_buckets: Buckets::from_histogram(&self.scan_durations, |v| v),
                scan_gap_buckets: Buckets::from_histogram(&self.scan_gaps, |v| v),
                probes: self.probes_note.clone(),
                probe_events: self.probe_events_total,
                probe_losses: self.probes.as_ref().map_or(0, LoadedProbes::losses),
                probe_filtered: self.probes.as_ref().map_or(0, LoadedProbes::off_cpu_filtered),
            },
            processes: self
                .tracked
                .iter()
                .map(Tracked::report)
                .chain(self.exited.iter().map(|(report, _)| report.clone()))
                .map(|mut report| {
                    report.storm_causes = self.cause_counts.get(&report.pid).cloned().unwrap_or_default();
                    report
                })
                .collect(),
            storms: self.storms.iter().cloned().collect(),
            refused: self.refused.iter().cloned().collect(),
        }
    }
}

impl Tracked {
    /// Where the agent stands relative to the process's pid namespace (see
    /// [`subetha_core::lease`]).
    fn lease_scope(&self) -> LeaseScope {
        if self.ns.foreign {
            LeaseScope::Foreign {
                owner_ns_pid: self.ns.own_pid(),
                owner_host_pid: self.pid,
            }
        } else {
            LeaseScope::Local
        }
    }

    /// Gives the drainer's records of threads in another pid namespace our
    /// thread ids.
    fn map_thread_ids(&mut self) {
        if let Some(tids) = self.tids.as_mut()
            && self.drainer.has_unmapped_tids()
        {
            self.drainer.map_thread_ids(|ns_tid| tids.host_tid(ns_tid));
        }
    }

    fn try_take_lease(&mut self, timeout: Duration) {
        let view = Arc::clone(self.drainer_view());
        match std::mem::replace(&mut self.lease, Lease::Held) {
            Lease::Held => {
                if !self.drainer.holds_lease() {
                    self.lease = Lease::Waiting("lease lost".into(), Instant::now());
                }
            }
            Lease::Requested(request, since) => match request.poll(&view) {
                Some(lease) => {
                    self.drainer.set_lease(lease);
                    tracing::info!(pid = self.pid, "sidecar handed the lease over");
                }
                None if since.elapsed() >= timeout => {
                    let holder = word_pid(view.live().consumer.load(Ordering::Acquire));
                    let note = match request.wait(&view, Duration::ZERO) {
                        Ok(lease) => {
                            self.drainer.set_lease(lease);
                            return;
                        }
                        Err(e) => e.to_string(),
                    };
                    if let Some(permit) = crate::logging::throttle("takeover not granted", self.pid) {
                        tracing::warn!(pid = self.pid, holder, %note, "takeover not granted; will retry{permit}");
                    }
                    self.lease = Lease::Waiting(note, Instant::now() + Duration::from_secs(10));
                }
                None => self.lease = Lease::Requested(request, since),
            },
            Lease::Waiting(note, retry_at) => {
                if Instant::now() < retry_at {
                    self.lease = Lease::Waiting(note, retry_at);
                    return;
                }
                // An application that chose `always` keeps draining itself.
                let mode = view.live().sidecar_mode.load(Ordering::Relaxed);
                let holder = view.live().consumer.load(Ordering::Acquire);
                if mode == 2 && holder != 0 {
                    self.lease = Lease::Waiting(
                        "application drains itself (SUBETHA_SIDECAR=always)".into(),
                        Instant::now() + Duration::from_secs(10),
                    );
                    return;
                }
                // Another agent hands its leases back only when it exits:
                // wait for that, and say so once, instead of asking.
                let holder_pid = word_pid(holder);
                if holder != 0
                    && holder_pid != self.pid
                    && subetha_core::lease::word_is_foreign(holder) == self.ns.foreign
                    && discovery::is_other_agent(holder_pid)
                {
                    let waiting = discovery::drained_by_another_agent(holder_pid, self.pid);
                    if note != waiting {
                        tracing::info!(pid = self.pid, agent = holder_pid, "{waiting}");
                    }
                    self.lease = Lease::Waiting(waiting, Instant::now() + Duration::from_secs(1));
                    return;
                }
                match TakeoverRequest::raise_in(&view, self.lease_scope()) {
                    Ok(Ok(lease)) => self.drainer.set_lease(lease),
                    Ok(Err(request)) => {
                        self.lease = Lease::Requested(request, Instant::now());
                        if timeout.is_zero() {
                            self.try_take_lease(timeout);
                        }
                    }
                    Err(e) => {
                        self.lease = Lease::Waiting(e.to_string(), Instant::now() + Duration::from_secs(1));
                    }
                }
            }
        }
    }

    /// Runs the adaptive policy if a round is due at `now_ns` (after a
    /// scan, while the lease is held).
    fn run_policy(&mut self, now_ns: u64) {
        let Some(policy) = self.policy.as_mut() else {
            return;
        };
        if now_ns < self.next_policy_ns {
            return;
        }
        self.next_policy_ns = now_ns.saturating_add(POLICY_INTERVAL.as_nanos() as u64);
        let changed = adaptive::apply_policy(&self.drainer, policy);
        if changed > 0 {
            tracing::debug!(pid = self.pid, changed, "adaptive policy set spin budgets");
        }
    }

    fn drainer_view(&self) -> &Arc<SegmentView> {
        // The drainer owns an Arc of the view; keep a second handle for the
        // lease calls without borrowing the drainer mutably.
        self.drainer.view_handle()
    }

    /// The segment's resident bytes, measured at most every
    /// [`RESIDENT_REFRESH`].
    fn resident_bytes(&self, view: &SegmentView) -> u64 {
        let now = clock::monotonic_ns();
        let at = self.resident_at_ns.load(Ordering::Relaxed);
        if at != 0 && now.saturating_sub(at) < RESIDENT_REFRESH.as_nanos() as u64 {
            return self.resident_bytes.load(Ordering::Relaxed);
        }
        let bytes = view.resident_bytes().unwrap_or(0) as u64;
        self.resident_bytes.store(bytes, Ordering::Relaxed);
        self.resident_at_ns.store(now.max(1), Ordering::Relaxed);
        bytes
    }

    /// `report` with `record`'s call-site rows ([`crate::sites`]).
    fn with_sites(
        &self,
        mut report: InstanceReport,
        record: &subetha_core::InstanceRecord,
    ) -> InstanceReport {
        report.sites = crate::sites::site_reports(
            &record.sites,
            |id| self.drainer.resolve_site(id),
            |op| record.meta.op_name(op),
            &self.drainer.view().layout().calibration,
        );
        report
    }

    fn report(&self) -> ProcessReport {
        let view = self.drainer.view();
        let calibration = view.layout().calibration;
        // Slots never claimed are not reported (a hostile high-water mark can
        // put thousands of them in range).
        let rings: Vec<RingReport> = self
            .drainer
            .rings()
            .iter()
            .filter(|r| r.generation != 0 || r.slot_drained_total != 0 || r.slot_dropped_total != 0)
            .map(RingReport::from_record)
            .collect();
        let mut instances: Vec<InstanceReport> = self
            .drainer
            .instances()
            .map(|r| {
                let policy = self.drainer.policy(r.meta.id).unwrap_or(0);
                self.with_sites(InstanceReport::from_record(r, false, policy, &calibration), r)
            })
            .collect();
        instances.extend(
            self.drainer
                .retired()
                .map(|r| self.with_sites(InstanceReport::from_record(r, true, 0, &calibration), r)),
        );
        let (state, note) = match (&self.exited, &self.lease) {
            (Some(_), _) => ("exited", None),
            (None, Lease::Held) => ("attached", None),
            (None, Lease::Requested(..)) => ("waiting", Some("takeover requested".to_string())),
            (None, Lease::Waiting(note, _)) => ("waiting", Some(note.clone()).filter(|n| !n.is_empty())),
        };
        ProcessReport {
            pid: self.pid,
            nspid: self.ns.nspid.clone(),
            pid_ns: self.ns.inode,
            exe: self.identity.exe.clone(),
            cgroup: self.identity.cgroup.clone(),
            container_id: self.identity.container_id.clone(),
            pod_uid: self.identity.pod_uid.clone(),
            service: self.identity.service.clone(),
            comm: self.comm.clone(),
            uid: self.uid,
            state: state.into(),
            note,
            attached_mono_ns: self.attached_mono_ns,
            exited_mono_ns: self.exited.map(|(ns, _)| ns),
            segment_bytes: view.layout().total_size,
            segment_resident_bytes: self.resident_bytes(view),
            lost_no_ring: view.live().lost_no_ring.load(Ordering::Relaxed),
            unattributed: self.drainer.totals().unattributed,
            drained: rings.iter().map(|r| r.drained).sum(),
            dropped: rings.iter().map(|r| r.dropped).sum(),
            episodes: self.drainer.totals().episodes,
            storms: self.storms_begun,
            storm_causes: BTreeMap::new(),
            rings,
            instances,
        }
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays within
    // it for cpu < CPU_SETSIZE (checked); sched_setaffinity(0) affects the
    // calling thread.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The CPU probe events last placed a producer on at or before `at_ns`
/// (else the first after it): the CPU the storm's evidence names and its
/// picture draws, from the same events.
fn producer_cpu_at(seen: Option<&VecDeque<(u64, u32)>>, at_ns: u64) -> Option<u32> {
    let seen = seen?;
    seen.iter()
        .filter(|&&(at, _)| at <= at_ns)
        .max_by_key(|&&(at, _)| at)
        .or_else(|| seen.iter().min_by_key(|&&(at, _)| at))
        .map(|&(_, cpu)| cpu)
}

/// Scan gaps overlapping `[begin, end]` (end None: until now), longest
/// first, at most 8. Walks the history backwards and stops at the first scan
/// that ended before `begin`, so an update costs the storm's length in scans,
/// not the whole history.
fn overlapping_gaps(scans: &VecDeque<(u64, u64)>, begin: u64, end: Option<u64>) -> Vec<ScanGap> {
    let end = end.unwrap_or(u64::MAX);
    let mut gaps = Vec::new();
    let mut later_start: Option<u64> = None;
    for &(start, finish) in scans.iter().rev() {
        if let Some(next_start) = later_start {
            let gap = ScanGap {
                begin_mono_ns: finish,
                end_mono_ns: next_start,
            };
            if gap.end_mono_ns >= begin && gap.begin_mono_ns <= end {
                gaps.push(gap);
            }
        }
        if finish < begin {
            break;
        }
        later_start = Some(start);
    }
    gaps.sort_by_key(|g| std::cmp::Reverse(g.end_mono_ns.saturating_sub(g.begin_mono_ns)));
    gaps.truncate(8);
    gaps
}

/// The scans a storm's diagnosis reads, as indices into the history: those
/// overlapping `window` (the storm and the gap before it), and the last one
/// before it, when the ring was last emptied.
fn scans_for_diagnosis(scans: &VecDeque<(u64, u64)>, window: RangeInclusive<u64>) -> Range<usize> {
    let first = scans
        .partition_point(|&(_, end)| end < *window.start())
        .saturating_sub(1);
    let last = scans.partition_point(|&(begin, _)| begin <= *window.end());
    first..last.max(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diagnosis_reads_the_scans_around_its_storm_and_the_one_before() {
        let scans: VecDeque<(u64, u64)> = [(0, 10), (20, 30), (100, 110), (115, 120), (300, 310)].into();
        // Overlapping 105..=200: the scans at 100 and 115, and the one at 20
        // (the ring was last emptied at 30).
        assert_eq!(scans_for_diagnosis(&scans, 105..=200), 1..4);
        // A window between scans still gets the scan before it.
        assert_eq!(scans_for_diagnosis(&scans, 40..=90), 1..2);
        // Before the history: nothing to read, no panic.
        assert_eq!(scans_for_diagnosis(&scans, 0..=0), 0..1);
        assert_eq!(scans_for_diagnosis(&VecDeque::new(), 5..=9), 0..0);
        // After the last scan: the last scan only.
        assert_eq!(scans_for_diagnosis(&scans, 400..=500), 4..5);
    }

    #[test]
    fn the_producer_cpu_is_the_one_seen_at_the_storm() {
        let seen: VecDeque<(u64, u32)> = [(10, 0), (50, 1), (90, 3)].into();
        assert_eq!(producer_cpu_at(Some(&seen), 60), Some(1));
        assert_eq!(producer_cpu_at(Some(&seen), 5), Some(0));
        assert_eq!(producer_cpu_at(Some(&seen), 100), Some(3));
        assert_eq!(producer_cpu_at(None, 100), None);
    }

    #[test]
    fn gaps_overlapping_a_window_longest_first() {
        let scans: VecDeque<(u64, u64)> = [(0, 10), (20, 30), (100, 110), (115, 120), (300, 310)].into();
        let gaps = overlapping_gaps(&scans, 25, Some(116));
        let spans: Vec<(u64, u64)> = gaps.iter().map(|g| (g.begin_mono_ns, g.end_mono_ns)).collect();
        assert_eq!(spans, vec![(30, 100), (110, 115)]);
        let open = overlapping_gaps(&scans, 200, None);
        assert_eq!(open.len(), 1);
        assert_eq!((open[0].begin_mono_ns, open[0].end_mono_ns), (120, 300));
    }
}
