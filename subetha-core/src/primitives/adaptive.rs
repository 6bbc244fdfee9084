//! [`AdaptiveMutex`]: a [`Mutex`] whose spin-before-park budget is chosen
//! by a built-in [`Policy`] from what the lock was observed doing.
//!
//! The `adaptive` group of `benches/primitives.rs` sets it against
//! `parking_lot`, the plain [`Mutex`] and a pinned spin budget (`fixed_spin`),
//! from the hammer to holds of tens of µs.
//!
//! # Mechanism
//!
//! The lock is a [`Mutex`] in adaptive mode (kind 7, `adaptive_mutex`;
//! ops `lock`, `try_lock`, `unlock` as for [`Mutex`], plus `park` (4)). When
//! the fast path fails, the waiter polls the lock word (a few `pause`s
//! between polls, the clock read after each) for up to the budget in the
//! policy word's `SPIN` field ([`PolicyWord`]), whether or not other
//! waiters are parked, and then parks. A contended acquisition that had to
//! park also records a `park` observation whose latency is the wake-up:
//! from the releasing thread's call to wake it (the clock read under
//! `parking_lot_core`'s queue lock, passed in the unpark token) to the
//! woken thread running again. With `SPIN` unset the budget is [`DEFAULT_SPIN_NS`]; a
//! budget of 0 parks at once. With the word's `Y` bit set the waiter
//! instead waits as a plain [`Mutex`] does, like `parking_lot`: a fixed
//! few exponential spin rounds while nobody is parked, then `sched_yield`s,
//! then it parks.
//!
//! # The decision
//!
//! Spin-then-park is the classic answer to "is the wait shorter than a
//! context switch?": spinning for as long as parking and being woken would
//! cost never does worse than twice the better of the two, and a waiter
//! whose lock comes free within a short hold should not park at all. The
//! policy therefore needs what a park/wake hand-off costs, and how long the
//! lock is held (only to tell holds so short that polling hurts, step 3
//! below). It observes both on the lock itself: the
//! park cost is the p50 of the lock's `park` wake-ups, once a window holds
//! [`AdaptiveConfig::min_wake_samples`] of them, kept until a later window
//! brings as many (a lock that spins long enough parks rarely).
//!
//! The wake-up is measured where it happens because it depends on what the
//! waiter's CPU is doing. A separate measurement misleads: a futex ping-pong
//! ([`measure_park_cost_ns`]) taken while other threads keep the CPUs busy
//! wakes threads onto busy CPUs, while the lock's own waiters, whose CPUs go
//! idle once they park, take far longer to wake; a budget capped by the
//! ping-pong's figure spins too briefly for long holds and parks anyway (the
//! `adaptive` group's `…/20000+20000ns` rows).
//!
//! Until a lock has had wake-ups of its own the policy uses that host
//! measurement. It blocks for milliseconds, so it never runs on a
//! consumer's scan thread (a scanner that stops draining makes rings
//! overflow): every policy of a process shares one measurement
//! ([`shared_park_cost_ns`]), taken on a background thread when first
//! asked for and again once it is older than [`PARK_COST_TTL`]; until the
//! first one completes the policy assumes [`DEFAULT_PARK_COST_NS`].
//!
//! [`AdaptivePolicy`] runs in whichever consumer drains the segment: the
//! in-process sidecar (installed automatically when the first
//! `AdaptiveMutex` is created, unless `SUBETHA_ADAPTIVE_POLICY=off`) or an
//! agent (which calls [`apply_policy`] with one `AdaptivePolicy` per
//! tracked process after its scans). It only sees [`InstanceStats`] and the
//! policy word, so it behaves the same in both. Per instance and per window
//! (the observations since its last decision on that instance):
//!
//! 1. Fewer than [`AdaptiveConfig::min_contended`] contended acquisitions:
//!    keep accumulating — unless the window already holds
//!    [`AdaptiveConfig::max_quiet_window`] acquisitions, or contention is
//!    below [`AdaptiveConfig::min_contention_rate`]: then spinning does not
//!    matter; the budget is left alone and a new window starts.
//! 2. Hold time: the p90 of the window's sampled `unlock` hold times, once
//!    there are [`AdaptiveConfig::min_hold_samples`] of them (an adaptive
//!    lock's sample is the critical section alone: from once the lock is
//!    taken to just before the release, where a plain [`Mutex`]'s includes
//!    the atomic operations at both ends); if a window of
//!    [`AdaptiveConfig::max_quiet_window`] acquisitions brings none
//!    (sampling turned off), the p50 of the contended waits stands in.
//! 3. A hold time under [`AdaptiveConfig::yield_below_hold_ns`]: wait like
//!    a plain `Mutex` (the `Y` bit). Such a lock is released and taken
//!    again within nanoseconds; a waiter polling its word every few
//!    `pause`s takes the word's cache line from the holder each time and slows
//!    every hold, while `parking_lot`'s waiter soon yields and leaves the
//!    holder alone (the `adaptive` group's `…/hammer` rows).
//! 4. Otherwise budget = the park cost (the lock's observed wake-up, see
//!    above), at least [`AdaptiveConfig::min_spin_ns`]: a wait that ends
//!    within it never parks, and one that does not has cost at most twice
//!    what parking at once would have. (A budget of a few hold p90s, capped by
//!    the park cost, would spare CPU on short holds, but a waiter whose short
//!    wait is stretched, by a holder that was preempted or by the waiters
//!    ahead of it, would then park early and pay a whole wake-up: the
//!    `adaptive` group's `…/500+500ns` rows, against `fixed_spin`'s.)
//!
//! A word with the pin bit set is left alone. The policy finds its window
//! for an instance through the word's `TAG` field (it assigns tags itself),
//! checked against the instance's first-seen time, so a collision or a
//! reused tag only costs one window that falls back to cumulative counts.
//!
//! Limitation: spinning assumes the lock holder is running. On a host with
//! more runnable threads than CPUs a spinning waiter can take the CPU the
//! holder needs; the budget (one park cost) bounds that waste.

use std::fmt;
use std::num::NonZeroU64;
use std::ops::{Deref, DerefMut};
use std::panic::Location;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::PolicyWord;
use super::mutex::{self, Mutex, RawMutex};
use crate::clock;
use crate::drain::Drainer;
use crate::registry::InstanceKind;
use crate::segment::SegmentView;
use crate::sidecar::{Policy, Sidecar, process_sidecar};
use crate::stats::InstanceStats;

/// The kind [`AdaptiveMutex`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 7,
    name: "adaptive_mutex",
    ops: &["lock", "try_lock", "unlock", "park"],
};

pub use super::spin::DEFAULT_SPIN_NS;

/// A [`Mutex`] whose spin-before-park budget adapts to the lock's observed
/// behaviour (kind 7). Dereferences to [`Mutex`]: `lock`, `try_lock`, the
/// timed variants, guards and [`Condvar`](crate::Condvar) all work as
/// there.
///
/// ```
/// use subetha_core::AdaptiveMutex;
///
/// let hot = AdaptiveMutex::named("hot_counter", 0u64);
/// *hot.lock() += 1;
/// assert_eq!(hot.into_inner(), 1);
/// ```
pub struct AdaptiveMutex<T: ?Sized>(Mutex<T>);

impl<T> AdaptiveMutex<T> {
    /// An adaptive mutex named after its creation site.
    #[track_caller]
    pub fn new(value: T) -> Self {
        Self::build(None, Location::caller(), value)
    }

    /// An adaptive mutex named `name`.
    #[track_caller]
    pub fn named(name: &str, value: T) -> Self {
        Self::build(Some(name), Location::caller(), value)
    }

    fn build(name: Option<&str>, site: &'static Location<'static>, value: T) -> Self {
        let raw = RawMutex::register(KIND, name, site, true);
        install_builtin_policy();
        Self(Mutex::from_raw(raw, value))
    }

    /// Consumes the mutex (unregistering its instance) and returns the data.
    pub fn into_inner(self) -> T {
        self.0.into_inner()
    }
}

impl<T: ?Sized> Deref for AdaptiveMutex<T> {
    type Target = Mutex<T>;

    fn deref(&self) -> &Mutex<T> {
        &self.0
    }
}

impl<T: ?Sized> DerefMut for AdaptiveMutex<T> {
    fn deref_mut(&mut self) -> &mut Mutex<T> {
        &mut self.0
    }
}

impl<T: Default> Default for AdaptiveMutex<T> {
    #[track_caller]
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> From<T> for AdaptiveMutex<T> {
    #[track_caller]
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for AdaptiveMutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AdaptiveMutex").field(&&self.0).finish()
    }
}

/// Adds [`AdaptivePolicy`] to the process sidecar once (again after a fork
/// replaced the sidecar).
fn install_builtin_policy() {
    static INSTALLED_ON: AtomicPtr<Sidecar> = AtomicPtr::new(std::ptr::null_mut());
    let Some(sidecar) = process_sidecar() else {
        return;
    };
    let ptr = sidecar as *const Sidecar as *mut Sidecar;
    if INSTALLED_ON.load(Ordering::Acquire) == ptr
        || std::env::var("SUBETHA_ADAPTIVE_POLICY").is_ok_and(|v| matches!(v.trim(), "off" | "0" | "false"))
    {
        return;
    }
    if INSTALLED_ON.swap(ptr, Ordering::AcqRel) != ptr {
        install_policy(sidecar);
    }
}

/// Adds an [`AdaptivePolicy`] with the default configuration to `sidecar`
/// (for sidecars started by hand; the process sidecar gets one
/// automatically).
pub fn install_policy(sidecar: &Sidecar) {
    sidecar.add_policy(AdaptivePolicy::default());
}

/// Runs `policy` over every live instance `drainer` knows, as the sidecar
/// does each policy round: for consumers that drain with their own
/// [`Drainer`] (the agent). Returns how many policy words changed. Does
/// nothing unless the drainer holds the lease.
pub fn apply_policy<V: AsRef<SegmentView>>(drainer: &Drainer<V>, policy: &mut dyn Policy) -> usize {
    if !drainer.holds_lease() {
        return 0;
    }
    let mut updates = Vec::new();
    for record in drainer.instances() {
        if !policy.applies_to(record.meta.kind) {
            continue;
        }
        let Some(current) = drainer.policy(record.meta.id) else {
            continue;
        };
        if let Some(word) = policy.decide(&record.stats, current)
            && word != current
        {
            updates.push((record.meta.id, word));
        }
    }
    updates
        .into_iter()
        .filter(|&(id, word)| drainer.set_policy(id, word))
        .count()
}

/// Thresholds of [`AdaptivePolicy`] (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveConfig {
    /// Contended acquisitions a window needs before a decision.
    pub min_contended: u64,
    /// Contended share of acquisitions below which the budget is left alone.
    pub min_contention_rate: f64,
    /// A window this many acquisitions long without enough contention is
    /// closed without a decision.
    pub max_quiet_window: u64,
    /// Sampled hold times needed to use them (else contended waits stand in).
    pub min_hold_samples: u64,
    /// Measured wake-ups a window needs before their p50 becomes the
    /// lock's park cost.
    pub min_wake_samples: u64,
    /// Smallest budget.
    pub min_spin_ns: u64,
    /// Holds shorter than this make the lock wait like a plain `Mutex` (see
    /// the module docs). The default, 128 ns, lies between the holds where
    /// yielding does at least as well (the `adaptive` group's `…/hammer` and
    /// `…/50+100ns` rows) and those where polling for a budget does
    /// (`…/500+500ns` and up).
    pub yield_below_hold_ns: u64,
    /// The cost of parking and being woken, which is the budget; `None`:
    /// observed on each lock's own wake-ups, and until a lock has any,
    /// measured on this host ([`shared_park_cost_ns`]).
    pub park_cost_ns: Option<u64>,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        Self {
            min_contended: 16,
            min_contention_rate: 0.001,
            max_quiet_window: 1 << 16,
            min_hold_samples: 8,
            min_wake_samples: 8,
            min_spin_ns: 512,
            yield_below_hold_ns: 128,
            park_cost_ns: None,
        }
    }
}

/// What [`AdaptiveConfig::verdict`] says about a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Too little evidence yet: keep the window open.
    Accumulate,
    /// Contention too rare for the budget to matter: leave it, start a new
    /// window.
    Keep,
    /// Set the budget to this many ns (and poll for it).
    Spin(u64),
    /// Wait like a plain `Mutex` (set the `Y` bit).
    Yield,
}

impl AdaptiveConfig {
    /// The decision for one window, given the park cost (ns). Pure.
    pub fn verdict(&self, window: &WindowSummary, park_cost_ns: u64) -> Verdict {
        let rare = (window.contended as f64) < self.min_contention_rate * window.acquisitions as f64;
        if window.contended < self.min_contended || rare {
            return if window.acquisitions >= self.max_quiet_window
                || (rare && window.contended >= self.min_contended)
            {
                Verdict::Keep
            } else {
                Verdict::Accumulate
            };
        }
        let hold = if window.hold_samples >= self.min_hold_samples {
            window.hold_p90_ns
        } else if window.acquisitions < self.max_quiet_window {
            // Hold samples come 1 in 256 acquisitions by default: wait for
            // enough of them unless sampling seems to be off.
            return Verdict::Accumulate;
        } else {
            window.wait_p50_ns
        };
        if hold < self.yield_below_hold_ns {
            return Verdict::Yield;
        }
        Verdict::Spin(park_cost_ns.clamp(self.min_spin_ns, PolicyWord::MAX_SPIN_NS))
    }
}

/// Measures the cost of parking a thread and waking it on this host, in ns:
/// the median one-way hand-off of a futex ping-pong between two threads (64
/// round trips, a few ms of wall time, most of it asleep). It depends on load:
/// on a virtual machine waking an idle virtual CPU costs far more than waking
/// a thread onto a busy one, so the shared measurement
/// ([`shared_park_cost_ns`]) is repeated every [`PARK_COST_TTL`].
///
/// Blocks the caller for the whole measurement: never call it on a scan
/// thread.
pub fn measure_park_cost_ns() -> u64 {
    const ROUNDS: usize = 64;
    let turn = Arc::new(AtomicU64::new(0));
    let main = std::thread::current();
    let helper = {
        let turn = Arc::clone(&turn);
        std::thread::Builder::new()
            .name("subetha-parkcost".into())
            .spawn(move || {
                for round in 1..=ROUNDS as u64 {
                    while turn.load(Ordering::Acquire) != 2 * round - 1 {
                        std::thread::park();
                    }
                    turn.store(2 * round, Ordering::Release);
                    main.unpark();
                }
            })
    };
    let Ok(helper) = helper else {
        return DEFAULT_PARK_COST_NS;
    };
    let mut trips = Vec::with_capacity(ROUNDS);
    for round in 1..=ROUNDS as u64 {
        // Let the helper fall asleep, so each hand-off really wakes it.
        std::thread::sleep(Duration::from_micros(50));
        let started = Instant::now();
        turn.store(2 * round - 1, Ordering::Release);
        helper.thread().unpark();
        while turn.load(Ordering::Acquire) != 2 * round {
            std::thread::park();
        }
        trips.push(started.elapsed().as_nanos() as u64);
    }
    let _ = helper.join();
    trips.sort_unstable();
    (trips[ROUNDS / 2] / 2).max(1)
}

/// Park cost assumed until it has been measured (or if it cannot be).
pub const DEFAULT_PARK_COST_NS: u64 = 10_000;
/// How long a park-cost measurement is trusted.
pub const PARK_COST_TTL: Duration = Duration::from_secs(10);

/// The park cost (ns) every [`AdaptivePolicy`] of this process uses unless
/// its configuration fixes one: the latest background measurement
/// ([`measure_park_cost_ns`]), or [`DEFAULT_PARK_COST_NS`] until the first
/// completes. Never blocks: when there is no measurement yet, or it is
/// older than [`PARK_COST_TTL`], it asks the background thread (started on
/// first use; again in a forked child) for a new one and returns at once.
pub fn shared_park_cost_ns() -> u64 {
    SHARED_PARK_COST.get()
}

/// The latest background park-cost measurement (ns), `None` before the
/// first has completed. Does not ask for one.
pub fn measured_park_cost_ns() -> Option<u64> {
    SHARED_PARK_COST.measured()
}

static SHARED_PARK_COST: BackgroundMeasurement =
    BackgroundMeasurement::new(measure_park_cost_ns, PARK_COST_TTL);

/// A value that is slow to measure, measured on a background thread and
/// cached: readers never wait for it.
struct BackgroundMeasurement {
    /// The latest value; 0 until the first measurement completes.
    value: AtomicU64,
    /// `clock::monotonic_ns()` when `value` was measured.
    measured_at_ns: AtomicU64,
    /// A new measurement was asked for and has not started yet.
    wanted: AtomicBool,
    /// The worker thread, with the pid of the process it runs in (a forked
    /// child has no worker even though it inherited this entry); `None` in
    /// the tuple: spawning it failed in that process.
    worker: parking_lot::Mutex<Option<(u32, Option<std::thread::Thread>)>>,
    measure: fn() -> u64,
    ttl: Duration,
}

impl BackgroundMeasurement {
    const fn new(measure: fn() -> u64, ttl: Duration) -> Self {
        Self {
            value: AtomicU64::new(0),
            measured_at_ns: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            worker: parking_lot::const_mutex(None),
            measure,
            ttl,
        }
    }

    /// The latest value, if any.
    fn measured(&self) -> Option<u64> {
        NonZeroU64::new(self.value.load(Ordering::Acquire)).map(NonZeroU64::get)
    }

    /// The latest value, or the default; asks for a new measurement when
    /// there is none or it is stale.
    fn get(&'static self) -> u64 {
        let value = self.measured();
        let age_ns = clock::monotonic_ns().saturating_sub(self.measured_at_ns.load(Ordering::Relaxed));
        if value.is_none() || age_ns >= self.ttl.as_nanos() as u64 {
            self.request();
        }
        value.unwrap_or(DEFAULT_PARK_COST_NS)
    }

    /// Asks the worker for a measurement, starting the worker if this
    /// process has none.
    fn request(&'static self) {
        self.wanted.store(true, Ordering::Release);
        let pid = std::process::id();
        let mut worker = self.worker.lock();
        match &*worker {
            Some((owner, Some(thread))) if *owner == pid => thread.unpark(),
            Some((owner, None)) if *owner == pid => {} // could not spawn here
            _ => {
                let spawned = std::thread::Builder::new()
                    .name("subetha-parkcost".into())
                    .spawn(move || self.work());
                *worker = Some((pid, spawned.ok().map(|handle| handle.thread().clone())));
            }
        }
    }

    /// The worker: measures whenever asked, sleeps otherwise.
    fn work(&self) {
        loop {
            if !self.wanted.swap(false, Ordering::AcqRel) {
                std::thread::park();
                continue;
            }
            let value = (self.measure)().max(1);
            self.measured_at_ns
                .store(clock::monotonic_ns(), Ordering::Relaxed);
            self.value.store(value, Ordering::Release);
            // Requests made while measuring are answered by this value.
            self.wanted.store(false, Ordering::Release);
        }
    }
}

/// What one window of an adaptive lock's statistics says (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowSummary {
    /// `lock` + `try_lock` acquisitions.
    pub acquisitions: u64,
    /// Contended `lock`s.
    pub contended: u64,
    /// Of those, how many exhausted the spin budget.
    pub parked: u64,
    /// Parks whose wake-up was measured ([`mutex::op::PARK`]'s latency).
    pub wake_samples: u64,
    /// Wake-up p50: from the releasing thread's call to wake a parked
    /// waiter to that waiter running.
    pub wake_p50_ns: u64,
    /// Sampled hold times.
    pub hold_samples: u64,
    /// Hold time p50.
    pub hold_p50_ns: u64,
    /// Hold time p90.
    pub hold_p90_ns: u64,
    /// Contended wait p50.
    pub wait_p50_ns: u64,
}

impl WindowSummary {
    /// Summarises the observations in `now` that are not in `base`.
    pub fn between(base: &InstanceStats, now: &InstanceStats) -> Self {
        let delta = now.delta_since(base);
        let cal = clock::calibration();
        let op = |k| delta.op(k);
        let ops = |k| op(k).map_or(0, |o| o.ops);
        let quantile = |k, q| {
            op(k)
                .and_then(|o| o.latency.as_ref())
                .map_or(0, |h| cal.ticks_to_ns(h.value_at_quantile(q)))
        };
        Self {
            acquisitions: ops(mutex::op::LOCK) + ops(mutex::op::TRY_LOCK),
            contended: op(mutex::op::LOCK).map_or(0, |o| o.contended),
            parked: ops(mutex::op::PARK),
            wake_samples: op(mutex::op::PARK)
                .and_then(|o| o.latency.as_ref())
                .map_or(0, |h| h.count()),
            wake_p50_ns: quantile(mutex::op::PARK, 0.5),
            hold_samples: op(mutex::op::UNLOCK)
                .and_then(|o| o.latency.as_ref())
                .map_or(0, |h| h.count()),
            hold_p50_ns: quantile(mutex::op::UNLOCK, 0.5),
            hold_p90_ns: quantile(mutex::op::UNLOCK, 0.9),
            wait_p50_ns: quantile(mutex::op::LOCK, 0.5),
        }
    }
}

/// The built-in policy of [`AdaptiveMutex`] (kind 7): sets the `SPIN` field
/// of the policy word from each window's contention and hold times.
pub struct AdaptivePolicy {
    config: AdaptiveConfig,
    /// Window start per tag (index 0 unused).
    windows: Vec<Option<Window>>,
    next_tag: u8,
    decisions: u64,
}

struct Window {
    base: InstanceStats,
    first_seen_ns: Option<u64>,
    /// The lock's wake-up p50 from the last window with enough of them.
    observed_park_cost_ns: Option<u64>,
}

impl Default for AdaptivePolicy {
    fn default() -> Self {
        Self::new(AdaptiveConfig::default())
    }
}

impl fmt::Debug for AdaptivePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptivePolicy")
            .field("config", &self.config)
            .field("tracked", &self.windows.iter().flatten().count())
            .field("decisions", &self.decisions)
            .finish()
    }
}

impl AdaptivePolicy {
    /// A policy with these thresholds.
    pub fn new(config: AdaptiveConfig) -> Self {
        Self {
            config,
            windows: (0..256).map(|_| None).collect(),
            next_tag: 0,
            decisions: 0,
        }
    }

    /// Budget decisions made so far.
    pub fn decisions(&self) -> u64 {
        self.decisions
    }

    fn fresh_tag(&mut self) -> u8 {
        self.next_tag = self.next_tag.checked_add(1).unwrap_or(1);
        self.next_tag
    }

    /// The park cost of a lock whose own wake-ups have not been observed:
    /// configured, or the process's shared background measurement
    /// ([`shared_park_cost_ns`]). Never blocks.
    pub fn park_cost_ns(&self) -> u64 {
        self.config.park_cost_ns.unwrap_or_else(shared_park_cost_ns)
    }
}

impl Policy for AdaptivePolicy {
    fn applies_to(&self, kind: u16) -> bool {
        kind == KIND.code
    }

    fn decide(&mut self, stats: &InstanceStats, current: u32) -> Option<u32> {
        let word = PolicyWord(current);
        let mut tag = word.tag();
        let known = tag != 0
            && self.windows[usize::from(tag)].as_ref().is_some_and(|w| {
                w.first_seen_ns == stats.first_seen_ns() && w.base.total_ops() <= stats.total_ops()
            });
        if !known {
            tag = self.fresh_tag();
            self.windows[usize::from(tag)] = Some(Window {
                base: InstanceStats::new(),
                first_seen_ns: stats.first_seen_ns(),
                observed_park_cost_ns: None,
            });
        }
        let window = self.windows[usize::from(tag)]
            .as_mut()
            .expect("window installed above");
        let summary = WindowSummary::between(&window.base, stats);
        if summary.wake_samples >= self.config.min_wake_samples {
            window.observed_park_cost_ns = Some(summary.wake_p50_ns.max(1));
        }
        // The host's measurement (asked for again when stale) only for a
        // lock whose own wake-ups have not been seen.
        let park_cost = self
            .config
            .park_cost_ns
            .or(window.observed_park_cost_ns)
            .unwrap_or_else(shared_park_cost_ns);
        let mut new = word.with_tag(tag);
        match self.config.verdict(&summary, park_cost) {
            Verdict::Accumulate => {}
            Verdict::Keep => window.base = stats.clone(),
            Verdict::Spin(budget) => {
                window.base = stats.clone();
                self.decisions += 1;
                if !word.spin_pinned() {
                    new = new.with_spin_ns(budget).with_spin_yields(false);
                }
            }
            Verdict::Yield => {
                window.base = stats.clone();
                self.decisions += 1;
                if !word.spin_pinned() {
                    new = new.with_spin_yields(true);
                }
            }
        }
        (new != word).then_some(new.0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::super::test_support::{init, op, unique, wait_for};
    use super::super::{CONTENDED, policy_word, set_policy_word};
    use super::*;

    fn ns(ns: u64) -> u64 {
        clock::calibration().ns_to_ticks(ns)
    }

    /// `n` contended locks waiting `wait_ns` and `n` holds of `hold_ns`.
    fn stats(n: u64, hold_ns: u64, wait_ns: u64) -> InstanceStats {
        let mut s = InstanceStats::new();
        for _ in 0..n {
            s.record(mutex::op::LOCK, CONTENDED, ns(wait_ns), 1);
            s.record(mutex::op::LOCK, 0, 0, 2);
            s.record(mutex::op::UNLOCK, 0, ns(hold_ns), 1);
        }
        s.touch(42);
        s
    }

    const PARK_COST: u64 = 12_000;

    fn config() -> AdaptiveConfig {
        AdaptiveConfig {
            park_cost_ns: Some(PARK_COST),
            ..AdaptiveConfig::default()
        }
    }

    #[test]
    fn budget_is_the_park_cost_unless_holds_are_tiny() {
        let c = config();
        let short = WindowSummary::between(&InstanceStats::new(), &stats(100, 500, 900));
        assert_eq!(short.contended, 100);
        assert_eq!(short.acquisitions, 200);
        assert_eq!(short.hold_samples, 100);
        // Holds past the yield threshold, short or long: spin for as long
        // as a park costs, then park.
        assert_eq!(c.verdict(&short, PARK_COST), Verdict::Spin(PARK_COST));
        let long = WindowSummary::between(&InstanceStats::new(), &stats(100, 200_000, 300_000));
        assert_eq!(c.verdict(&long, PARK_COST), Verdict::Spin(PARK_COST));
        // … where parking is cheap, that is a short spin, never below the
        // floor.
        assert_eq!(c.verdict(&long, 2_000), Verdict::Spin(2_000));
        assert_eq!(c.verdict(&short, 100), Verdict::Spin(c.min_spin_ns));
        // Tiny holds: wait like a plain mutex.
        let tiny = WindowSummary::between(&InstanceStats::new(), &stats(100, 20, 50));
        assert_eq!(c.verdict(&tiny, PARK_COST), Verdict::Yield);
        // Too little evidence.
        let few = WindowSummary::between(&InstanceStats::new(), &stats(3, 500, 900));
        assert_eq!(c.verdict(&few, PARK_COST), Verdict::Accumulate);
        // Without hold samples the contended waits stand in.
        let mut waits = InstanceStats::new();
        for _ in 0..100 {
            waits.record(mutex::op::LOCK, CONTENDED, ns(2_000), 1);
        }
        let w = WindowSummary::between(&InstanceStats::new(), &waits);
        assert_eq!(
            c.verdict(&w, PARK_COST),
            Verdict::Accumulate,
            "waits for hold samples"
        );
        for _ in 0..c.max_quiet_window {
            waits.record(mutex::op::TRY_LOCK, 0, 0, 1);
        }
        let w = WindowSummary::between(&InstanceStats::new(), &waits);
        assert_eq!(c.verdict(&w, PARK_COST), Verdict::Spin(PARK_COST));
        let mut short_waits = InstanceStats::new();
        for _ in 0..100 {
            short_waits.record(mutex::op::LOCK, CONTENDED, ns(50), 1);
        }
        for _ in 0..c.max_quiet_window {
            short_waits.record(mutex::op::TRY_LOCK, 0, 0, 1);
        }
        let w = WindowSummary::between(&InstanceStats::new(), &short_waits);
        assert_eq!(c.verdict(&w, PARK_COST), Verdict::Yield);
        // Contention too rare to matter: leave the budget, new window.
        let mut rare = stats(20, 500, 900);
        for _ in 0..100_000 {
            rare.record(mutex::op::LOCK, 0, 0, 1);
        }
        let r = WindowSummary::between(&InstanceStats::new(), &rare);
        assert_eq!(c.verdict(&r, PARK_COST), Verdict::Keep);
        // A long window without contention is closed too.
        let mut quiet = InstanceStats::new();
        quiet.record(mutex::op::LOCK, CONTENDED, ns(1_000), 1);
        for _ in 0..c.max_quiet_window {
            quiet.record(mutex::op::LOCK, 0, 0, 1);
        }
        let q = WindowSummary::between(&InstanceStats::new(), &quiet);
        assert_eq!(c.verdict(&q, PARK_COST), Verdict::Keep);
    }

    /// Without a configured park cost, a lock's own wake-ups cap its
    /// budget once a window has enough of them, and the cap stays when
    /// later windows bring none; a configured cost still wins.
    #[test]
    fn the_lock_s_own_wake_ups_are_its_park_cost() {
        let observed = AdaptiveConfig {
            park_cost_ns: None,
            ..AdaptiveConfig::default()
        };
        let mut p = AdaptivePolicy::new(observed);
        // Holds of 200 µs: the budget is the park cost.
        let mut s = stats(100, 200_000, 300_000);
        for _ in 0..observed.min_wake_samples {
            s.record(mutex::op::PARK, CONTENDED, ns(30_000), 1);
        }
        let w1 = PolicyWord(p.decide(&s, 0).expect("decides"));
        let b1 = w1.spin_ns().unwrap();
        assert!((29_000..=31_000).contains(&b1), "{b1}");
        // A window without parks (the budget now covers the waits).
        for _ in 0..100 {
            s.record(mutex::op::LOCK, CONTENDED, ns(20_000), 1);
            s.record(mutex::op::UNLOCK, 0, ns(200_000), 1);
        }
        assert_eq!(p.decide(&s, w1.0), None, "the budget stays");
        // Too few wake-ups to count: the last estimate stands.
        for _ in 0..100 {
            s.record(mutex::op::LOCK, CONTENDED, ns(20_000), 1);
            s.record(mutex::op::UNLOCK, 0, ns(200_000), 1);
        }
        s.record(mutex::op::PARK, CONTENDED, ns(2_000), 1);
        assert_eq!(p.decide(&s, w1.0), None, "one wake-up is not evidence");
        // Wake-ups get cheaper: so does the budget.
        for _ in 0..100 {
            s.record(mutex::op::LOCK, CONTENDED, ns(20_000), 1);
            s.record(mutex::op::UNLOCK, 0, ns(200_000), 1);
            s.record(mutex::op::PARK, CONTENDED, ns(8_000), 1);
        }
        let w2 = PolicyWord(p.decide(&s, w1.0).expect("decides"));
        let b2 = w2.spin_ns().unwrap();
        assert!((7_600..=8_400).contains(&b2), "{b2}");
        // A configured cost is used whatever the lock's wake-ups say.
        let mut fixed = AdaptivePolicy::new(config());
        let w = PolicyWord(fixed.decide(&s, 0).expect("decides"));
        assert_eq!(
            w.spin_ns(),
            PolicyWord::default().with_spin_ns(PARK_COST).spin_ns()
        );
    }

    #[test]
    fn policy_uses_windows_and_respects_the_pin() {
        let mut p = AdaptivePolicy::new(config());
        assert!(p.applies_to(7) && !p.applies_to(1));
        let mut s = stats(100, 500, 900);
        let w1 = PolicyWord(p.decide(&s, 0).expect("decides"));
        assert_ne!(w1.tag(), 0);
        assert_eq!(
            w1.spin_ns(),
            PolicyWord::default().with_spin_ns(PARK_COST).spin_ns()
        );
        // Unchanged stats: nothing new in the window, nothing to do.
        assert_eq!(p.decide(&s, w1.0), None);
        // The holds shrink to a few ns: wait like a plain mutex, the
        // budget kept for when they grow again (over both windows the
        // p90 would still be 500 ns) …
        for _ in 0..1_000 {
            s.record(mutex::op::LOCK, CONTENDED, ns(40), 1);
            s.record(mutex::op::UNLOCK, 0, ns(20), 1);
        }
        let w2 = PolicyWord(p.decide(&s, w1.0).expect("decides"));
        assert_eq!(w2.tag(), w1.tag());
        assert!(w2.spin_yields(), "{w2:?}");
        assert_eq!(w2.spin_ns(), w1.spin_ns());
        // … which they do: poll for the budget again.
        for _ in 0..1_000 {
            s.record(mutex::op::LOCK, CONTENDED, ns(900), 1);
            s.record(mutex::op::UNLOCK, 0, ns(500), 1);
        }
        let w3 = PolicyWord(p.decide(&s, w2.0).expect("decides"));
        assert!(!w3.spin_yields(), "{w3:?}");
        assert_eq!(w3.spin_ns(), w1.spin_ns());
        // A window of the same kind changes nothing.
        for _ in 0..100 {
            s.record(mutex::op::LOCK, CONTENDED, ns(300_000), 1);
            s.record(mutex::op::UNLOCK, 0, ns(200_000), 1);
        }
        assert_eq!(p.decide(&s, w3.0), None);
        assert_eq!(p.decisions(), 4);
        // A pinned word is left alone (the tag is still assigned).
        let pinned_yield = PolicyWord::default().with_spin_pinned(true);
        let w5 = PolicyWord(p.decide(&stats(100, 20, 40), pinned_yield.0).expect("tags"));
        assert!(!w5.spin_yields() && w5.spin_ns().is_none(), "{w5:?}");
        let pinned = PolicyWord::default().with_spin_ns(20_000).with_spin_pinned(true);
        let w6 = PolicyWord(p.decide(&stats(100, 500, 900), pinned.0).expect("tags"));
        assert_eq!(w6.spin_ns(), pinned.spin_ns());
        assert!(w6.spin_pinned() && w6.tag() != 0);
        // Other fields are preserved.
        let sampled = PolicyWord::default().with_sample_every(4);
        let w7 = PolicyWord(p.decide(&stats(100, 500, 900), sampled.0).unwrap());
        assert_eq!(w7.sample_shift(), Some(2));
    }

    #[test]
    fn park_cost_is_measured_in_the_background_and_shared() {
        let p = AdaptivePolicy::default();
        // The first ask starts the measurement and answers at once.
        let first = p.park_cost_ns();
        let measured = crate::primitives::test_support::poll(Duration::from_secs(20), measured_park_cost_ns)
            .expect("the background thread measures the park cost");
        assert!(first == DEFAULT_PARK_COST_NS || first == measured, "{first}");
        assert!((100..10_000_000).contains(&measured), "{measured} ns");
        // Every policy uses the one measurement (until it goes stale).
        assert_eq!(p.park_cost_ns(), measured);
        assert_eq!(AdaptivePolicy::default().park_cost_ns(), measured);
        assert_eq!(AdaptivePolicy::new(config()).park_cost_ns(), PARK_COST);
    }

    /// A measurement that takes as long as the test says.
    static RELEASE: AtomicBool = AtomicBool::new(false);
    fn slow_measure() -> u64 {
        while !RELEASE.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        4321
    }

    #[test]
    fn readers_never_wait_for_the_measurement() {
        static SLOW: BackgroundMeasurement =
            BackgroundMeasurement::new(slow_measure, Duration::from_secs(3600));
        // While the measurement is blocked, readers get the default.
        for _ in 0..3 {
            assert_eq!(SLOW.get(), DEFAULT_PARK_COST_NS);
        }
        assert_eq!(SLOW.measured(), None);
        RELEASE.store(true, Ordering::Release);
        let value = crate::primitives::test_support::poll(Duration::from_secs(20), || SLOW.measured());
        assert_eq!(value, Some(4321));
        assert_eq!(SLOW.get(), 4321);
    }

    #[test]
    fn zero_budget_parks_and_counts_park_ops() {
        let name = unique("adaptive-park");
        let m = Arc::new(AdaptiveMutex::named(&name, 0u32));
        let id = m.instance_id().unwrap();
        set_policy_word(id, PolicyWord::default().with_spin_ns(0).with_spin_pinned(true));
        m.refresh_policy();
        contend(&m, 2, Duration::from_millis(2), 5);
        let r = wait_for(&name, |r| op(r, mutex::op::LOCK).1 >= 1);
        let (_, contended, _, _) = op(&r, mutex::op::LOCK);
        let (parks, park_contended, _, park_latencies) = op(&r, mutex::op::PARK);
        // Every contended acquisition fell back to parking.
        assert_eq!(parks, contended);
        assert_eq!((park_contended, park_latencies), (parks, parks));
    }

    /// `threads` threads each take the lock `rounds` times and hold it for
    /// `hold` (sleeping), so the others really block.
    fn contend(m: &Arc<AdaptiveMutex<u32>>, threads: usize, hold: Duration, rounds: usize) {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let m = Arc::clone(m);
                std::thread::spawn(move || {
                    for _ in 0..rounds {
                        let mut g = m.lock();
                        *g += 1;
                        std::thread::sleep(hold);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn builtin_policy_sets_a_budget_through_the_sidecar() {
        init();
        let name = unique("adaptive-policy");
        let m = Arc::new(AdaptiveMutex::named(&name, 0u32));
        let id = m.instance_id().unwrap();
        // Short holds under contention from two threads until the policy
        // (run by the sidecar every 10 ms) has written a budget.
        let deadline = Instant::now() + Duration::from_secs(20);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (m, stop) = (Arc::clone(&m), Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        {
                            let mut g = m.lock();
                            for _ in 0..200 {
                                *g = std::hint::black_box(*g + 1);
                            }
                        }
                        for _ in 0..200 {
                            std::hint::black_box(0u32);
                        }
                    }
                })
            })
            .collect();
        let word = loop {
            let word = PolicyWord(policy_word(id).unwrap());
            if word.spin_ns().is_some() || word.spin_yields() || Instant::now() > deadline {
                break word;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        assert_ne!(word.tag(), 0, "policy never ran: {word:?}");
        // Holds of 200 dependent adds: a budget, or on a fast host the
        // plain mutex's wait.
        if !word.spin_yields() {
            let budget = word.spin_ns().expect("a budget was set");
            assert!(budget <= PolicyWord::MAX_SPIN_NS, "{budget}");
        }
    }

    #[test]
    fn apply_policy_drives_a_private_drainer() {
        use crate::segment::{Segment, SegmentConfig};
        let segment = Box::leak(Box::new(
            Segment::create(SegmentConfig {
                instances: 4,
                ring_slots: 1,
            })
            .unwrap(),
        ));
        let view: &'static SegmentView = segment.view();
        let id = crate::registry::register_instance(view, KIND, "private").unwrap();
        let mut drainer = Drainer::attach(view).unwrap();
        let slot = view.ring_slot(0).unwrap();
        slot.thread_id.store(1, Ordering::Relaxed);
        slot.state
            .store(crate::segment::slot_state::ACTIVE, Ordering::Release);
        view.live().rings_high_water.fetch_max(1, Ordering::AcqRel);
        let ring = &slot.ring;
        for _ in 0..100 {
            ring.push(crate::Observation::new(id, mutex::op::LOCK, CONTENDED, ns(900)));
            ring.push(crate::Observation::new(id, mutex::op::UNLOCK, 0, ns(500)));
        }
        drainer.scan();
        let mut policy = AdaptivePolicy::new(config());
        assert_eq!(apply_policy(&drainer, &mut policy), 1);
        let word = PolicyWord(drainer.policy(id).unwrap());
        assert!(word.spin_ns().is_some_and(|b| b > 0), "{word:?}");
    }
}
