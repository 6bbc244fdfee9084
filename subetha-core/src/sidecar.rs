//! The [`Sidecar`]: an in-process scan thread that drains this process's
//! segment, runs [`Policy`] decisions and answers snapshot requests.
//!
//! By default ([`SidecarMode::Auto`]) a sidecar starts by itself when the
//! process segment is created, so an application that links subetha-core
//! gets statistics without running anything else. `SUBETHA_SIDECAR=off`
//! (or [`set_sidecar_mode`] before first use) disables it, e.g. when only an
//! external agent should drain. The sidecar is the segment's consumer: it
//! holds the consumer lease while it runs and gives it back when stopped.
//!
//! The scan thread paces itself by how full it finds the rings (see
//! [`ScanPacer`]): it pauses between `interval` (default 200 µs, after a
//! scan that met drops or a ring over half full) and `max_interval` (5 ms,
//! while the rings stay under an eighth full or idle), and
//! evaluates policies every `policy_interval` (default 10 ms): a policy's
//! verdict is written into the instance's policy word, which the primitive
//! reads on its own schedule.
//!
//! In `Auto` mode the sidecar answers an agent's takeover request between
//! two scans (see [`crate::lease`]) and then waits in standby, checking every
//! `standby_interval` whether the lease came back (the agent stopped) or its
//! holder died, and resumes draining if so. In `Always` mode it ignores
//! takeover requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock;
use crate::drain::{DrainTotals, Drainer, DropEpisode, InstanceRecord, RingRecord, ScanPacer, ScanReport};
use crate::lease::LeaseBusy;
use crate::segment::{Segment, SegmentView};
use crate::stats::InstanceStats;

/// Whether this process drains its own segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SidecarMode {
    /// Never: only an external agent drains.
    Off,
    /// Drain in-process by default (an agent may take over).
    #[default]
    Auto,
    /// Always drain in-process.
    Always,
}

impl SidecarMode {
    fn from_env() -> Option<Self> {
        match std::env::var("SUBETHA_SIDECAR").ok()?.trim() {
            "off" | "0" | "false" => Some(Self::Off),
            "auto" => Some(Self::Auto),
            "always" | "on" | "1" | "true" => Some(Self::Always),
            other => {
                tracing::warn!(
                    value = other,
                    "SUBETHA_SIDECAR: expected off, auto or always; using auto"
                );
                Some(Self::Auto)
            }
        }
    }
}

static MODE: AtomicU8 = AtomicU8::new(1);
static GLOBAL: AtomicPtr<Sidecar> = AtomicPtr::new(std::ptr::null_mut());

/// Chooses the sidecar mode for this process. Takes effect only before the
/// process segment is created (the first registration or observation);
/// `SUBETHA_SIDECAR` in the environment overrides it.
pub fn set_sidecar_mode(mode: SidecarMode) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

fn configured_mode() -> SidecarMode {
    SidecarMode::from_env().unwrap_or(match MODE.load(Ordering::Relaxed) {
        0 => SidecarMode::Off,
        2 => SidecarMode::Always,
        _ => SidecarMode::Auto,
    })
}

/// Called by the registry right after the process segment is created
/// (through [`PROCESS_HOOKS`](crate::PROCESS_HOOKS)).
pub(crate) fn on_process_segment_created(segment: &'static Segment) {
    let mode = configured_mode();
    segment
        .view()
        .live()
        .sidecar_mode
        .store(mode as u32, Ordering::Relaxed);
    if mode == SidecarMode::Off {
        return;
    }
    let config = SidecarConfig {
        yield_to_agent: mode == SidecarMode::Auto,
        ..SidecarConfig::default()
    };
    match Sidecar::start(segment.view(), config) {
        Ok(sidecar) => {
            let leaked = Box::into_raw(Box::new(sidecar));
            if GLOBAL
                .compare_exchange(std::ptr::null_mut(), leaked, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // SAFETY: `leaked` came from Box::into_raw just above and was
                // not shared.
                drop(unsafe { Box::from_raw(leaked) });
            }
        }
        Err(error) => tracing::warn!(%error, "subetha: sidecar not started"),
    }
}

/// The process's automatically started sidecar, if any. The thread that
/// creates the process segment starts it right after publishing the
/// segment, so another thread may briefly see `None` in between.
pub fn process_sidecar() -> Option<&'static Sidecar> {
    let ptr = GLOBAL.load(Ordering::Acquire);
    // SAFETY: GLOBAL only ever holds a leaked, never-freed Sidecar.
    (!ptr.is_null()).then(|| unsafe { &*ptr })
}

/// In a forked child the sidecar's thread does not exist: forget it without
/// running its destructor (which would join a thread of the parent).
pub(crate) fn forget_after_fork() {
    GLOBAL.store(std::ptr::null_mut(), Ordering::Release);
}

/// Decides an instance's policy word from its statistics.
pub trait Policy: Send + 'static {
    /// Whether this policy governs instances of kind code `kind`.
    fn applies_to(&self, kind: u16) -> bool {
        let _ = kind;
        true
    }

    /// The new policy word, or `None` to leave `current` as it is.
    fn decide(&mut self, stats: &InstanceStats, current: u32) -> Option<u32>;
}

/// Sidecar timing and behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SidecarConfig {
    /// The shortest pause between scans: after one that found drops, the
    /// pause returns to it (see [`ScanPacer`]).
    pub interval: Duration,
    /// The longest pause: reached while every ring stays under an eighth
    /// full, or idle, so a lightly loaded process pays a few hundred
    /// wake-ups a second, not thousands.
    pub max_interval: Duration,
    /// Pause between policy evaluations.
    pub policy_interval: Duration,
    /// Pause between lease checks while another consumer drains.
    pub standby_interval: Duration,
    /// Whether to hand the lease to an agent that asks ([`SidecarMode::Auto`])
    /// or keep it ([`SidecarMode::Always`]).
    pub yield_to_agent: bool,
}

impl Default for SidecarConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_micros(200),
            max_interval: Duration::from_millis(5),
            policy_interval: Duration::from_millis(10),
            standby_interval: Duration::from_millis(5),
            yield_to_agent: true,
        }
    }
}

/// A copy of what a consumer knows, for reporting.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC ns when taken.
    pub taken_mono_ns: u64,
    /// Live instances.
    pub instances: Vec<InstanceRecord>,
    /// Unregistered instances' final stats.
    pub retired: Vec<InstanceRecord>,
    /// Ring slots.
    pub rings: Vec<RingRecord>,
    /// Drop episodes, oldest first.
    pub episodes: Vec<DropEpisode>,
    /// Lifetime totals.
    pub totals: DrainTotals,
    /// The latest scan.
    pub last_scan: ScanReport,
    /// Whether this consumer holds the lease (false while an agent drains).
    pub draining: bool,
    /// Times the lease was handed to an agent.
    pub handovers: u64,
    /// Observations lost for want of a ring slot.
    pub lost_no_ring: u64,
}

impl Snapshot {
    /// The live or retired instance named `name`.
    pub fn instance(&self, name: &str) -> Option<&InstanceRecord> {
        self.instances
            .iter()
            .chain(&self.retired)
            .find(|r| r.meta.name == name)
    }
}

struct Shared {
    drainer: Mutex<Drainer<&'static SegmentView>>,
    policies: Mutex<Vec<Box<dyn Policy>>>,
    last_scan: Mutex<ScanReport>,
    handovers: AtomicU64,
    stop: AtomicBool,
}

/// An in-process consumer thread. Stops, drains once more and releases the
/// lease when dropped.
pub struct Sidecar {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sidecar").finish_non_exhaustive()
    }
}

impl Sidecar {
    /// Takes the consumer lease of `view` and starts the scan thread.
    pub fn start(view: &'static SegmentView, config: SidecarConfig) -> Result<Self, SidecarError> {
        let drainer = Drainer::attach(view)?;
        let shared = Arc::new(Shared {
            drainer: Mutex::new(drainer),
            policies: Mutex::new(Vec::new()),
            last_scan: Mutex::new(ScanReport::default()),
            handovers: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let thread = std::thread::Builder::new()
            .name("subetha-sidecar".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || run(&shared, config)
            })
            .map_err(SidecarError::Spawn)?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Adds a policy, evaluated from the next policy round on.
    pub fn add_policy(&self, policy: impl Policy) {
        self.shared.policies.lock().push(Box::new(policy));
    }

    /// Runs one scan now, on the calling thread, and returns its report.
    pub fn scan_now(&self) -> ScanReport {
        let report = self.shared.drainer.lock().scan();
        *self.shared.last_scan.lock() = report;
        report
    }

    /// Evaluates the policies now.
    pub fn apply_policies_now(&self) {
        apply_policies(&self.shared);
    }

    /// A copy of the statistics and drop history.
    pub fn snapshot(&self) -> Snapshot {
        let drainer = self.shared.drainer.lock();
        Snapshot {
            taken_mono_ns: clock::monotonic_ns(),
            instances: drainer.instances().cloned().collect(),
            retired: drainer.retired().cloned().collect(),
            rings: drainer.rings().to_vec(),
            episodes: drainer.episodes().cloned().collect(),
            totals: drainer.totals(),
            last_scan: *self.shared.last_scan.lock(),
            draining: drainer.holds_lease(),
            handovers: self.shared.handovers.load(Ordering::Relaxed),
            lost_no_ring: drainer.view().live().lost_no_ring.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// Why a sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    /// Someone else drains the segment.
    #[error(transparent)]
    Busy(#[from] LeaseBusy),
    /// The thread could not be spawned.
    #[error("cannot spawn the sidecar thread: {0}")]
    Spawn(std::io::Error),
}

fn run(shared: &Shared, config: SidecarConfig) {
    let mut next_policy = clock::monotonic_ns();
    let mut pacer = ScanPacer::new(config.interval, config.max_interval);
    while !shared.stop.load(Ordering::Acquire) {
        let mut drainer = shared.drainer.lock();
        if !drainer.holds_lease() && !drainer.try_acquire() {
            // Another consumer (an agent) drains; wait for it to hand back
            // or die.
            drop(drainer);
            std::thread::park_timeout(config.standby_interval);
            continue;
        }
        let report = drainer.scan();
        // Between scans is the only place the lease changes hands.
        if config.yield_to_agent && drainer.hand_over_if_requested().is_some() {
            shared.handovers.fetch_add(1, Ordering::Relaxed);
        }
        drop(drainer);
        *shared.last_scan.lock() = report;
        if report.started_mono_ns >= next_policy {
            apply_policies(shared);
            next_policy = report.started_mono_ns + config.policy_interval.as_nanos() as u64;
        }
        std::thread::park_timeout(pacer.after_scan(&report));
    }
    // Final drain so nothing pushed before the stop is left behind, then
    // give the lease back.
    let mut drainer = shared.drainer.lock();
    if drainer.holds_lease() {
        let report = drainer.scan();
        *shared.last_scan.lock() = report;
    }
    drainer.release_lease();
}

fn apply_policies(shared: &Shared) {
    let mut policies = shared.policies.lock();
    if policies.is_empty() {
        return;
    }
    let drainer = shared.drainer.lock();
    if !drainer.holds_lease() {
        return; // the consumer that drains decides
    }
    let mut updates = Vec::new();
    for record in drainer.instances() {
        let Some(current) = drainer.policy(record.meta.id) else {
            continue;
        };
        let mut word = current;
        for policy in policies.iter_mut().filter(|p| p.applies_to(record.meta.kind)) {
            if let Some(new) = policy.decide(&record.stats, word) {
                word = new;
            }
        }
        if word != current {
            updates.push((record.meta.id, word));
        }
    }
    for (id, word) in updates {
        drainer.set_policy(id, word);
    }
}
