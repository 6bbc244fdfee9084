//! Instrumented concurrency primitives: drop-in replacements for
//! `parking_lot`'s locks, a condition variable, a counting semaphore, a
//! bounded MPMC channel over `crossbeam-channel` and a barrier, each of which
//! registers an [`Instance`] and observes its own operations.
//!
//! ```
//! use subetha_core::Mutex;
//!
//! let pool = Mutex::named("db_pool", Vec::<u32>::new());
//! pool.lock().push(7); // counted as an uncontended `lock`; no clock read
//! assert_eq!(pool.try_lock().map(|g| g.len()), Some(1));
//! ```
//!
//! # What every primitive does
//!
//! * **Registration.** `X::named("db_pool", …)` registers an instance named
//!   `db_pool`; `X::new(…)` names it after its creation site
//!   (`#[track_caller]`: `src/pool.rs:42:17`, the path cut from the left to
//!   fit 64 bytes). Names are sanitised rather than rejected (control
//!   characters become `?`, an empty name becomes the creation site). The
//!   kind and its op names are published in the segment, so consumers show
//!   `lock`, `try_lock`, `send` … instead of numbers. Dropping the primitive
//!   unregisters the instance; the consumer keeps its final statistics
//!   ([`Snapshot::retired`](crate::Snapshot::retired)). If the instance table
//!   is full the primitive still works, unobserved (one warning is logged).
//! * **Fast paths read no clock.** Every operation first tries the
//!   non-blocking fast path of the wrapped type. Only when that fails does it
//!   take a timestamp, wait, and record the wait with
//!   [`Observation::FLAG_CONTENDED`]. A failed `try_*` records
//!   [`Observation::FLAG_MISS`].
//! * **Uncontended `lock`s of a [`Mutex`] / [`AdaptiveMutex`], uncontended
//!   `read`s and `write`s of a [`RwLock`], and [`Channel`] operations that
//!   succeed at once, are counted, not pushed one by one**: an observation
//!   with [`Observation::FLAG_COUNT`] stands for the 1st, 2nd, 4th, … 64th,
//!   then every 64 (see [`mutex`] and [`op_counts`]); the rest come when
//!   the primitive is dropped. Everything else (waits, misses, `try_*`s of
//!   the locks, sampled holds, and the other primitives' operations) is one
//!   observation per operation.
//! * **Waits and misses carry their call site.** Every acquiring method is
//!   `#[track_caller]`; an operation that waited or missed interns its
//!   caller's `file:line:column` in the segment's site table and carries
//!   the id in the observation's `_reserved` word ([`crate::site`]). A
//!   `Mutex`/`AdaptiveMutex` wait also carries the site of the hold it
//!   waited for, where that hold's site is known (see `holder`). Calls
//!   through `lock_api` (`as_lock_api()`, guard methods such as
//!   `RwLockUpgradableReadGuard::upgrade`, a `Condvar`'s relock) record
//!   `lock_api`'s line instead. Uncontended paths never look at the site.
//! * **Hold times are sampled**: 1 in 2^k acquisitions (k from the policy
//!   word, default [`DEFAULT_SAMPLE_SHIFT`] = 1 in 256) reads the clock at
//!   acquisition and records the hold time on release as the `unlock`-type
//!   op. Unsampled releases record nothing, so the count of an `unlock` op is
//!   the number of *sampled* holds, not of releases. ([`Mutex`] samples at
//!   that rate in expectation, at random, so that no bookkeeping runs inside
//!   its holds; see its module.)
//! * **Policy word.** A consumer (the sidecar's [`Policy`](crate::Policy)
//!   decisions, or the agent) writes a per-instance `u32` in the segment; its
//!   encoding is [`PolicyWord`]. Reading it is a segment lookup, so each
//!   primitive caches what it needs and refreshes it every
//!   [`REFRESH_EVERY`] operations (counted per lock for exclusive
//!   acquisitions, per thread otherwise) and on slow paths (contended or
//!   timed acquisitions), there at most once per [`SLOW_PATH_REFRESH_NS`]
//!   (~1 ms). A change is therefore in effect within 1024 operations or at
//!   the first wait after a millisecond, whichever comes first;
//!   `refresh_policy()` on each primitive applies it at once.
//! * **Semantics of the wrapped type are kept**: guards, `try_*`, timeouts,
//!   `into_inner`, `get_mut`, `map`/`downgrade`/`upgrade` on guards. Like
//!   `parking_lot`, nothing is poisoned: a panic while a guard is held
//!   releases the lock during unwinding and the next owner sees whatever
//!   state the panicking code left.
//!
//! # Op kinds
//!
//! Latencies are raw ticks ([`crate::clock`]); 0 means "not measured".
//! `C` = [`Observation::FLAG_CONTENDED`], `M` = [`Observation::FLAG_MISS`],
//! `N` = [`Observation::FLAG_COUNT`].
//!
//! | kind (code) | op | name | flags | latency |
//! |---|---|---|---|---|
//! | [`Mutex`] (1) | 1 | `lock` | C: had to wait; N: a count of uncontended `lock`s | wait (0 if not contended); with N, how many |
//! | | 2 | `try_lock` | M: failed; timed variants: C waited, M timed out | wait of timed variants |
//! | | 3 | `unlock` | — | sampled hold time |
//! | [`RwLock`] (2) | 1 | `read` | C: had to wait (also recursive / upgradable reads); N: a count of uncontended `read`s | wait; with N, how many |
//! | | 2 | `try_read` | M: failed; timed: C, M as above | wait of timed variants |
//! | | 3 | `write` | C: had to wait; N: a count of uncontended `write`s | wait; with N, how many |
//! | | 4 | `try_write` | M: failed; timed: C, M | wait of timed variants |
//! | | 5 | `read_unlock` | — | sampled read hold time |
//! | | 6 | `write_unlock` | — | sampled write hold time (also ended by `downgrade`) |
//! | | 7 | `upgrade` | C: waited for readers; M: `try_upgrade*` failed | wait |
//! | [`Condvar`] (3) | 1 | `wait` | M: timed out | time blocked until woken (not the relock) |
//! | | 2 | `notify_one` | M: nobody was waiting | — |
//! | | 3 | `notify_all` | M: nobody was waiting | — |
//! | [`Semaphore`] (4) | 1 | `acquire` | C: had to wait | wait |
//! | | 2 | `try_acquire` | M: no permit; timed: C, M | wait of timed variant |
//! | | 3 | `release` | — | sampled permit hold time |
//! | | 4 | `add_permits` | — | — |
//! | [`Channel`] (5) | 1 | `send` | C: channel full, waited; M: disconnected / timed out; N: a count of sends done at once | wait; with N, how many |
//! | | 2 | `recv` | C: channel empty, waited; M: disconnected / timed out; N: as for `send` | wait; with N, how many |
//! | | 3 | `try_send` | M: full or disconnected; N: a count of successes | with N, how many |
//! | | 4 | `try_recv` | M: empty or disconnected; N: a count of successes | with N, how many |
//! | [`Barrier`] (6) | 1 | `wait` | C (always: every non-leader blocks) | time blocked |
//! | | 2 | `release` | — (the leader: last to arrive) | first arrival → last arrival of the generation |
//! | [`AdaptiveMutex`] (7) | 1–3 | as [`Mutex`] | | |
//! | | 4 | `park` | C | spin budget exhausted, the waiter slept | its (last) wake-up: from the releasing thread's call to wake it to it running |
//! | `AsyncMutex` (8, feature `tokio`) | 1–3 | as [`Mutex`] | | |
//! | `AsyncRwLock` (9) | 1–6 | as [`RwLock`] | | |
//! | `AsyncSemaphore` (10) | 1–4 | as [`Semaphore`] | | |
//!
//! # Counting what was attempted
//!
//! [`accounting`] keeps a process-wide, opt-in tally of every observation
//! the primitives attempted and what became of it (queued, dropped by a full
//! ring, lost for want of a ring) — the ground truth a test or demo compares
//! a consumer's numbers against. Off by default: then it costs one
//! predictable branch per observation.

use std::num::NonZeroU32;
use std::panic::Location;
use std::sync::atomic::Ordering;

use crate::clock;
use crate::observation::Observation;
use crate::registry::{Instance, InstanceKind, process_segment};
use crate::segment::{INSTANCE_NAME_MAX, instance_state};
use crate::site::SiteWord;

pub mod adaptive;
pub mod barrier;
pub mod channel;
pub mod condvar;
pub(crate) mod counting;
pub(crate) mod held;
pub(crate) mod holder;
pub mod mutex;
pub mod op_counts;
pub(crate) mod reader_bias;
pub mod rwlock;
pub(crate) mod sampling;
pub mod semaphore;
mod spin;
#[cfg(feature = "tokio")]
pub mod tokio;

pub use adaptive::{AdaptiveConfig, AdaptiveMutex, AdaptivePolicy};
pub use barrier::{Barrier, BarrierWaitResult};
pub use channel::{Channel, Receiver, Sender};
pub use condvar::{Condvar, WaitTimeoutResult};
pub use mutex::{MappedMutexGuard, Mutex, MutexGuard, RawMutex};
pub use rwlock::{
    MappedRwLockReadGuard, MappedRwLockWriteGuard, RawRwLock, RwLock, RwLockReadGuard,
    RwLockUpgradableReadGuard, RwLockWriteGuard,
};
pub use semaphore::{Semaphore, SemaphorePermit};

/// Every built-in primitive kind, for consumers that want to list them.
pub const KINDS: &[InstanceKind] = &[
    mutex::KIND,
    rwlock::KIND,
    condvar::KIND,
    semaphore::KIND,
    channel::KIND,
    barrier::KIND,
    adaptive::KIND,
    #[cfg(feature = "tokio")]
    tokio::ASYNC_MUTEX_KIND,
    #[cfg(feature = "tokio")]
    tokio::ASYNC_RWLOCK_KIND,
    #[cfg(feature = "tokio")]
    tokio::ASYNC_SEMAPHORE_KIND,
];

/// Hold-time sampling when the policy word leaves it at 0: 1 in 2^8 = 256.
///
/// A sample costs two clock reads and a push, which at 1 in 64 a hammered
/// `Mutex` on two threads pays for in throughput (the `contended` group's
/// `…/hammer/2` rows of `benches/primitives.rs`). A lock taken a million times
/// a second still yields about
/// 4,000 hold samples a second, and a consumer that suspects a lock raises
/// its level through the policy word.
pub const DEFAULT_SAMPLE_SHIFT: u32 = 8;
/// Operations between two reads of the policy word (a power of two).
pub const REFRESH_EVERY: u32 = 1024;
/// Slow paths re-read the policy word at most this often (≈ 1 ms).
pub const SLOW_PATH_REFRESH_NS: u64 = 1 << 20;
const _: () = assert!(REFRESH_EVERY.is_power_of_two());

/// The per-instance policy word, as the built-in primitives read it.
///
/// ```text
///  31        24 23   18  17  16  15        8 7         0
/// +------------+-------+---+---+-----------+-----------+
/// |    TAG     |reserv.| Y | P |   SPIN    |  SAMPLE   |
/// +------------+-------+---+---+-----------+-----------+
/// ```
///
/// * `SAMPLE` (bits 0–7), hold-time sampling level of every primitive:
///   `0` = default (1 in 2^[`DEFAULT_SAMPLE_SHIFT`]); `1..=32` = sample 1 in
///   2^(`SAMPLE`−1) (`1` = every operation, `2` = every other, …); `255` =
///   never; other values act as 1 in 2^31.
/// * `SPIN` (bits 8–15), [`AdaptiveMutex`] spin-before-park budget: `0` =
///   unset (built-in default, [`adaptive::DEFAULT_SPIN_NS`]); `v ≥ 1` = spin
///   up to (`v`−1) × [`PolicyWord::SPIN_UNIT_NS`] ns, so `1` parks at once and
///   `255` spins up to 65 µs.
/// * `P` (bit 16), spin pinned: the built-in [`AdaptivePolicy`] leaves `SPIN`
///   and `Y` alone (an operator fixed them).
/// * `Y` (bit 17), [`AdaptiveMutex`] waits like a plain [`Mutex`] instead:
///   `parking_lot`'s few exponential spin rounds, then yields, then parks;
///   `SPIN` is ignored while it is set. For holds so short that a waiter
///   polling the lock word mostly takes the word's cache line away from
///   the holder (see [`AdaptiveConfig::yield_below_hold_ns`]).
/// * `TAG` (bits 24–31): owned by [`AdaptivePolicy`], which uses it to find
///   its per-instance window; other writers should preserve it.
/// * bits 18–23 are reserved and written as 0.
///
/// Consumers write the word; primitives only read it. [`set_policy_word`]
/// writes it from inside the process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolicyWord(pub u32);

impl PolicyWord {
    /// `SAMPLE` value: the default rate.
    pub const SAMPLE_DEFAULT: u8 = 0;
    /// `SAMPLE` value: never sample.
    pub const SAMPLE_OFF: u8 = 0xFF;
    /// Nanoseconds per step of `SPIN`.
    pub const SPIN_UNIT_NS: u64 = 256;
    /// The largest spin budget the word can hold (65 024 ns).
    pub const MAX_SPIN_NS: u64 = 254 * Self::SPIN_UNIT_NS;
    /// The `P` bit.
    pub const SPIN_PINNED: u32 = 1 << 16;
    /// The `Y` bit.
    pub const SPIN_YIELDS: u32 = 1 << 17;

    /// The raw `SAMPLE` field.
    pub const fn sample_level(self) -> u8 {
        self.0 as u8
    }

    /// Hold times are sampled 1 in 2^shift; `None` = never.
    pub const fn sample_shift(self) -> Option<u32> {
        match self.sample_level() {
            0 => Some(DEFAULT_SAMPLE_SHIFT),
            Self::SAMPLE_OFF => None,
            v @ 1..=32 => Some(v as u32 - 1),
            _ => Some(31),
        }
    }

    /// Samples 1 in `n` operations (`n` rounded up to a power of two, at
    /// most 2^31); `n == 0` turns sampling off.
    pub const fn with_sample_every(self, n: u32) -> Self {
        let level = if n == 0 {
            Self::SAMPLE_OFF as u32
        } else {
            let shift = if n > 1 << 31 {
                31
            } else {
                n.next_power_of_two().trailing_zeros()
            };
            shift + 1
        };
        Self((self.0 & !0xFF) | level)
    }

    /// Back to the default sampling rate.
    pub const fn with_sample_default(self) -> Self {
        Self(self.0 & !0xFF)
    }

    /// The raw `SPIN` field.
    pub const fn spin_field(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// The spin budget in ns, `None` when unset.
    pub const fn spin_ns(self) -> Option<u64> {
        match self.spin_field() {
            0 => None,
            v => Some((v as u64 - 1) * Self::SPIN_UNIT_NS),
        }
    }

    /// Sets the spin budget (rounded to the nearest unit, at most 65 µs).
    pub const fn with_spin_ns(self, ns: u64) -> Self {
        let units = (ns + Self::SPIN_UNIT_NS / 2) / Self::SPIN_UNIT_NS;
        let field = if units > 254 { 255 } else { units as u32 + 1 };
        Self((self.0 & !0xFF00) | (field << 8))
    }

    /// Clears the spin budget (built-in default).
    pub const fn with_spin_unset(self) -> Self {
        Self(self.0 & !0xFF00)
    }

    /// Whether the spin budget is pinned.
    pub const fn spin_pinned(self) -> bool {
        self.0 & Self::SPIN_PINNED != 0
    }

    /// Sets or clears the pin bit.
    pub const fn with_spin_pinned(self, pinned: bool) -> Self {
        self.with_bit(Self::SPIN_PINNED, pinned)
    }

    /// Whether an [`AdaptiveMutex`] waits like a plain [`Mutex`] (`Y`).
    pub const fn spin_yields(self) -> bool {
        self.0 & Self::SPIN_YIELDS != 0
    }

    /// Sets or clears the `Y` bit.
    pub const fn with_spin_yields(self, yields: bool) -> Self {
        self.with_bit(Self::SPIN_YIELDS, yields)
    }

    const fn with_bit(self, bit: u32, set: bool) -> Self {
        if set {
            Self(self.0 | bit)
        } else {
            Self(self.0 & !bit)
        }
    }

    /// The `TAG` field.
    pub const fn tag(self) -> u8 {
        (self.0 >> 24) as u8
    }

    /// Sets the `TAG` field.
    pub const fn with_tag(self, tag: u8) -> Self {
        Self((self.0 & 0x00FF_FFFF) | ((tag as u32) << 24))
    }
}

impl From<u32> for PolicyWord {
    fn from(word: u32) -> Self {
        Self(word)
    }
}

impl From<PolicyWord> for u32 {
    fn from(word: PolicyWord) -> Self {
        word.0
    }
}

/// Writes the policy word of the live instance `id` in this process's
/// segment, as a consumer would; false if `id` is not live. The primitive
/// picks it up within [`REFRESH_EVERY`] operations or at its next slow path.
///
/// For applications that want to raise the sampling level of a lock they
/// suspect from inside the process (a debug endpoint, a test). A consumer
/// running a [`Policy`](crate::Policy) may overwrite it at its next round.
pub fn set_policy_word(id: u32, word: impl Into<u32>) -> bool {
    let Some(entry) = process_entry(id) else {
        return false;
    };
    entry.policy.store(word.into(), Ordering::Relaxed);
    true
}

/// The policy word of the live instance `id` in this process's segment.
pub fn policy_word(id: u32) -> Option<u32> {
    process_entry(id).map(|e| e.policy.load(Ordering::Relaxed))
}

fn process_entry(id: u32) -> Option<&'static crate::segment::InstanceEntry> {
    let entry = process_segment().ok()?.view().instance_of(id)?;
    (entry.state.load(Ordering::Acquire) == instance_state::LIVE).then_some(entry)
}

// ---------------------------------------------------------------------------
// The machinery every primitive shares.

/// An instrumented primitive's registration: emits observations and reads
/// the policy word. `None` when unobserved (const-constructed, or the
/// instance table was full).
#[derive(Debug)]
pub(crate) struct Registration {
    instance: Option<Instance>,
}

impl Registration {
    /// An unobserved primitive.
    pub(crate) const NONE: Registration = Registration { instance: None };

    /// Registers an instance of `kind` named `name`, or after `site`.
    pub(crate) fn register(
        kind: InstanceKind,
        name: Option<&str>,
        site: &'static Location<'static>,
    ) -> Registration {
        let name = match name.map(sanitize_name) {
            Some(name) if !name.is_empty() => name,
            _ => site_name(site),
        };
        match Instance::register(kind, &name) {
            Ok(instance) => Registration {
                instance: Some(instance),
            },
            Err(error) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(%error, kind = kind.name, %name, "subetha: primitive left unobserved");
                });
                Registration::NONE
            }
        }
    }

    /// The instance id, if observed.
    pub(crate) fn id(&self) -> Option<u32> {
        self.instance.as_ref().map(Instance::id)
    }

    /// Pushes one observation (and tallies it when [`accounting`] is on).
    #[inline(always)]
    pub(crate) fn emit(&self, op_kind: u16, flags: u16, latency_ticks: u64) {
        self.emitter().emit(op_kind, flags, latency_ticks);
    }

    /// [`emit`](Self::emit) of a slow-path operation called at `site`
    /// (interned here, so only on the paths that need it).
    #[inline(always)]
    pub(crate) fn emit_at(
        &self,
        op_kind: u16,
        flags: u16,
        latency_ticks: u64,
        site: &'static Location<'static>,
    ) {
        self.emitter().emit_at(op_kind, flags, latency_ticks, site);
    }

    /// The interned id of `site` (0 when unobserved).
    pub(crate) fn site_id(&self, site: &'static Location<'static>) -> u16 {
        if self.instance.is_some() {
            crate::site::intern(site)
        } else {
            crate::site::NONE
        }
    }

    /// What [`emit`](Self::emit) needs, read now to push later: a lock
    /// reads it before its release, while its line is surely in this
    /// core's cache.
    #[inline(always)]
    pub(crate) fn emitter(&self) -> Emitter {
        Emitter(self.instance.as_ref().map(Instance::raw_id))
    }

    /// Reads the policy word from the segment (0 when unobserved).
    pub(crate) fn policy_word(&self) -> PolicyWord {
        PolicyWord(self.instance.as_ref().map_or(0, Instance::policy))
    }
}

/// A [`Registration`]'s instance id, copied out of the primitive.
#[derive(Clone, Copy)]
pub(crate) struct Emitter(Option<NonZeroU32>);

impl Emitter {
    /// [`Registration::emit`].
    #[inline(always)]
    pub(crate) fn emit(self, op_kind: u16, flags: u16, latency_ticks: u64) {
        self.emit_sites(op_kind, flags, latency_ticks, SiteWord::NONE);
    }

    /// [`emit`](Self::emit) carrying call-site ids (see [`crate::site`]).
    #[inline(always)]
    pub(crate) fn emit_sites(self, op_kind: u16, flags: u16, latency_ticks: u64, sites: SiteWord) {
        if let Some(id) = self.0 {
            match crate::registry::observe_with_sites(id, op_kind, flags, latency_ticks, sites.0) {
                Ok(queued) => {
                    if accounting::ENABLED.load(Ordering::Relaxed) {
                        accounting::count(if queued {
                            accounting::Outcome::Queued
                        } else {
                            accounting::Outcome::Dropped
                        });
                    }
                }
                Err(error) => lost(error),
            }
        }
    }

    /// Emits a slow-path observation made at `site`: interns the site
    /// (only if the primitive is observed) and carries its id.
    #[cold]
    #[inline(never)]
    pub(crate) fn emit_at(
        self,
        op_kind: u16,
        flags: u16,
        latency_ticks: u64,
        site: &'static Location<'static>,
    ) {
        if self.0.is_some() {
            self.emit_sites(
                op_kind,
                flags,
                latency_ticks,
                SiteWord::own(crate::site::intern(site)),
            );
        }
    }
}

/// An observation that found no ring (already counted in the segment).
#[cold]
#[inline(never)]
fn lost(error: crate::registry::RegistryError) {
    drop(error);
    if accounting::ENABLED.load(Ordering::Relaxed) {
        accounting::count(accounting::Outcome::Lost);
    }
}

/// Ticks elapsed since `start`, at least 1 (0 means "not measured").
#[inline]
pub(crate) fn since(start: u64) -> u64 {
    clock::ticks().saturating_sub(start).max(1)
}

/// A hold's length in ticks from `start` to `ended` (0: until now).
pub(crate) fn hold_ticks(start: u64, ended: u64) -> u64 {
    if ended == 0 {
        since(start)
    } else {
        ended.saturating_sub(start).max(1)
    }
}

/// Flag shorthands for the primitives.
pub(crate) const CONTENDED: u16 = Observation::FLAG_CONTENDED;
pub(crate) const MISS: u16 = Observation::FLAG_MISS;
pub(crate) const COUNT: u16 = Observation::FLAG_COUNT;

/// A name the registry accepts: control characters replaced, cut to 64
/// bytes on a character boundary.
fn sanitize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len().min(INSTANCE_NAME_MAX));
    for c in name.chars().map(|c| if c.is_control() { '?' } else { c }) {
        if out.len() + c.len_utf8() > INSTANCE_NAME_MAX {
            break;
        }
        out.push(c);
    }
    out
}

/// `file:line:col` of a creation site, the path cut from the left (at a
/// `/` where possible) to fit 64 bytes.
fn site_name(site: &Location<'_>) -> String {
    let suffix = format!(":{}:{}", site.line(), site.column());
    let file = sanitize_name(site.file());
    let room = INSTANCE_NAME_MAX.saturating_sub(suffix.len());
    let mut file = file.as_str();
    if file.len() > room {
        let mut cut = file.len() - room;
        while !file.is_char_boundary(cut) {
            cut += 1;
        }
        file = &file[cut..];
        if let Some(slash) = file.find('/') {
            file = &file[slash..];
        }
    }
    format!("{file}{suffix}")
}

/// An opt-in, process-wide tally of the observations the primitives
/// attempted and what became of each: the ground truth for tests and demos.
///
/// ```
/// use subetha_core::primitives::accounting;
///
/// accounting::enable();
/// let m = subetha_core::Mutex::named("accounted", 0);
/// *m.lock() += 1;
/// let t = accounting::totals();
/// assert!(t.attempted >= 1);
/// assert_eq!(t.attempted, t.queued + t.dropped + t.lost);
/// ```
///
/// Counting is per thread (plain stores into the thread's own counters, no
/// shared cache line); a thread's counts move into a process total when it
/// exits. [`totals`](accounting::totals) sums both, and is exact for every
/// thread that has been joined (or is the caller).
pub mod accounting {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    pub(crate) static ENABLED: AtomicBool = AtomicBool::new(false);

    /// What became of the observations attempted so far.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Outcomes {
        /// Every observation a primitive tried to push:
        /// `queued + dropped + lost`.
        pub attempted: u64,
        /// Pushed into a ring.
        pub queued: u64,
        /// Dropped because the ring was full (counted by the ring too).
        pub dropped: u64,
        /// Lost because no ring could be had (counted in the segment's
        /// `lost_no_ring` too).
        pub lost: u64,
    }

    /// Starts counting (from now on; earlier observations are not known).
    pub fn enable() {
        ENABLED.store(true, Ordering::Relaxed);
    }

    /// Stops counting; totals so far are kept.
    pub fn disable() {
        ENABLED.store(false, Ordering::Relaxed);
    }

    /// Whether counting is on.
    pub fn is_enabled() -> bool {
        ENABLED.load(Ordering::Relaxed)
    }

    /// The totals over every thread, live and exited.
    pub fn totals() -> Outcomes {
        let live = LIVE.lock();
        let mut sum = EXITED.read();
        for counts in live.iter() {
            let c = counts.read();
            sum.queued += c.queued;
            sum.dropped += c.dropped;
            sum.lost += c.lost;
        }
        sum.attempted = sum.queued + sum.dropped + sum.lost;
        sum
    }

    #[derive(Clone, Copy)]
    pub(crate) enum Outcome {
        Queued,
        Dropped,
        Lost,
    }

    #[derive(Default)]
    struct Counts {
        queued: AtomicU64,
        dropped: AtomicU64,
        lost: AtomicU64,
    }

    impl Counts {
        const fn new() -> Self {
            Self {
                queued: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                lost: AtomicU64::new(0),
            }
        }

        fn field(&self, outcome: Outcome) -> &AtomicU64 {
            match outcome {
                Outcome::Queued => &self.queued,
                Outcome::Dropped => &self.dropped,
                Outcome::Lost => &self.lost,
            }
        }

        fn read(&self) -> Outcomes {
            Outcomes {
                attempted: 0,
                queued: self.queued.load(Ordering::Relaxed),
                dropped: self.dropped.load(Ordering::Relaxed),
                lost: self.lost.load(Ordering::Relaxed),
            }
        }
    }

    /// Counters of live threads.
    static LIVE: parking_lot::Mutex<Vec<Arc<Counts>>> = parking_lot::const_mutex(Vec::new());
    /// Counts of exited threads (and of observations made while a thread's
    /// own counters were already destroyed).
    static EXITED: Counts = Counts::new();

    /// The calling thread's counters; folded into `EXITED` at thread exit.
    struct Local(Arc<Counts>);

    impl Local {
        fn register() -> Self {
            let counts = Arc::new(Counts::default());
            LIVE.lock().push(Arc::clone(&counts));
            Self(counts)
        }
    }

    impl Drop for Local {
        fn drop(&mut self) {
            // Fold and unlist under the lock, so `totals` sees the counts
            // exactly once.
            let mut live = LIVE.lock();
            let c = self.0.read();
            EXITED.queued.fetch_add(c.queued, Ordering::Relaxed);
            EXITED.dropped.fetch_add(c.dropped, Ordering::Relaxed);
            EXITED.lost.fetch_add(c.lost, Ordering::Relaxed);
            live.retain(|other| !Arc::ptr_eq(other, &self.0));
        }
    }

    thread_local! {
        static LOCAL: Local = Local::register();
    }

    #[inline(never)]
    pub(crate) fn count(outcome: Outcome) {
        let counted = LOCAL.try_with(|local| {
            // This thread is the only writer of its counters: a plain
            // load + store, no locked read-modify-write.
            let field = local.0.field(outcome);
            field.store(field.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        });
        if counted.is_err() {
            EXITED.field(outcome).fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Polling the process sidecar for what a test's primitives emitted.

    use std::time::{Duration, Instant};

    use crate::drain::InstanceRecord;
    use crate::sidecar::{SidecarMode, process_sidecar, set_sidecar_mode};

    /// The unique instance name `prefix-<n>` for one test.
    pub(crate) fn unique(prefix: &str) -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Makes sure this test binary's segment and sidecar exist, with the
    /// sidecar keeping the lease even if an agent runs on the host.
    pub(crate) fn init() {
        set_sidecar_mode(SidecarMode::Always);
        crate::registry::process_segment().expect("process segment");
        // The thread that created the segment starts the sidecar just after
        // publishing it: another test's thread may get here in between.
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_sidecar().is_none() && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }

    /// Polls the sidecar until the record of `name` (live or retired)
    /// satisfies `done`, and returns it; panics after 10 s.
    pub(crate) fn wait_for(name: &str, mut done: impl FnMut(&InstanceRecord) -> bool) -> InstanceRecord {
        init();
        let sidecar = process_sidecar().expect("the process sidecar runs (SUBETHA_SIDECAR not off)");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            sidecar.scan_now();
            let snapshot = sidecar.snapshot();
            let record = snapshot.instance(name).cloned();
            if let Some(record) = &record
                && done(record)
            {
                return record.clone();
            }
            if Instant::now() >= deadline {
                // Where a missing observation could have gone: no ring for
                // its thread, a full one, or an id the consumer did not know.
                let segment = crate::registry::process_segment().expect("process segment");
                let lost = segment
                    .view()
                    .live()
                    .lost_no_ring
                    .load(std::sync::atomic::Ordering::Relaxed);
                let dropped: u64 = (0..segment.view().layout().ring_slot_capacity)
                    .filter_map(|i| segment.view().ring_slot(i))
                    .map(|slot| slot.ring.dropped())
                    .sum();
                let unattributed = sidecar.snapshot().totals.unattributed;
                panic!(
                    "timed out waiting for {name}: {:?}; process-wide: {lost} observations lost without a \
                     ring, {dropped} dropped by full rings, {unattributed} drained but unattributed",
                    record.map(|r| summarize(&r))
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Polls `check` every millisecond until it returns `Some`, for at most
    /// `timeout`.
    pub(crate) fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check() {
                return Some(value);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Ops, contended, misses and latency count per op kind.
    pub(crate) fn summarize(record: &InstanceRecord) -> Vec<(u16, u64, u64, u64, u64)> {
        record
            .stats
            .ops_by_kind()
            .map(|(k, op)| {
                (
                    k,
                    op.ops(),
                    op.contended(),
                    op.misses(),
                    op.latency().map_or(0, |h| h.count()),
                )
            })
            .collect()
    }

    /// (ops, contended, misses, latencies recorded) of op `kind`.
    pub(crate) fn op(record: &InstanceRecord, kind: u16) -> (u64, u64, u64, u64) {
        record.stats.op(kind).map_or((0, 0, 0, 0), |op| {
            (
                op.ops(),
                op.contended(),
                op.misses(),
                op.latency().map_or(0, |h| h.count()),
            )
        })
    }

    /// Whether the instance is retired in the sidecar's view.
    pub(crate) fn is_retired(name: &str) -> bool {
        let snapshot = process_sidecar().expect("sidecar").snapshot();
        snapshot.retired.iter().any(|r| r.meta.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance_id::entry_index;

    #[test]
    fn policy_word_fields_round_trip() {
        let w = PolicyWord::default();
        assert_eq!(w.sample_shift(), Some(DEFAULT_SAMPLE_SHIFT));
        assert_eq!(w.spin_ns(), None);
        assert_eq!(w.with_sample_every(1).sample_shift(), Some(0));
        assert_eq!(w.with_sample_every(1).sample_level(), 1);
        assert_eq!(w.with_sample_every(5).sample_shift(), Some(3));
        assert_eq!(w.with_sample_every(0).sample_shift(), None);
        assert_eq!(w.with_sample_every(u32::MAX).sample_shift(), Some(31));
        assert_eq!(PolicyWord(40).sample_shift(), Some(31));
        assert_eq!(w.with_spin_ns(0).spin_ns(), Some(0));
        assert_eq!(w.with_spin_ns(0).spin_field(), 1);
        assert_eq!(w.with_spin_ns(2_000).spin_ns(), Some(2048));
        assert_eq!(w.with_spin_ns(10_000_000).spin_ns(), Some(254 * 256));
        let all = w
            .with_sample_every(8)
            .with_spin_ns(1000)
            .with_spin_pinned(true)
            .with_tag(9);
        assert_eq!(all.sample_shift(), Some(3));
        assert_eq!(all.spin_ns(), Some(1024));
        assert!(all.spin_pinned());
        assert_eq!(all.tag(), 9);
        assert_eq!(all.with_spin_unset().spin_ns(), None);
        assert_eq!(all.with_sample_default().sample_level(), 0);
        assert!(!all.with_spin_pinned(false).spin_pinned());
        assert!(!all.spin_yields());
        let yields = all.with_spin_yields(true);
        assert!(yields.spin_yields() && yields.spin_pinned());
        assert_eq!((yields.spin_ns(), yields.tag()), (Some(1024), 9));
        assert_eq!(yields.with_spin_yields(false), all);
        assert_eq!(all.with_tag(0).0 >> 24, 0);
    }

    #[test]
    fn names_are_sanitised_and_sites_fit() {
        assert_eq!(sanitize_name("a\nb"), "a?b");
        assert_eq!(sanitize_name(&"é".repeat(40)).len(), 64);
        let site = Location::caller();
        let name = site_name(site);
        assert!(
            name.ends_with(&format!(":{}:{}", site.line(), site.column())),
            "{name}"
        );
        assert!(name.len() <= INSTANCE_NAME_MAX);
        assert!(name.contains("mod.rs"), "{name}");
    }

    #[test]
    fn anonymous_primitives_are_named_by_creation_site() {
        test_support::init();
        let line = line!() + 1;
        let m = Mutex::new(1);
        let id = m.instance_id().expect("registered");
        let segment = process_segment().unwrap();
        let entry = segment.view().instance(entry_index(id).unwrap()).unwrap();
        let name = crate::segment::read_text(&entry.name, entry.name_len.load(Ordering::Relaxed));
        assert!(name.ends_with(&format!("mod.rs:{line}:17")), "{name}");
        assert_eq!(crate::segment::read_padded_text(&entry.op_names[2]), "unlock");
    }

    /// The line of every (op, site) waiter row of `name` with a miss or a wait.
    fn site_lines(name: &str, ops: usize) -> Vec<(u16, u32)> {
        let r = test_support::wait_for(name, |r| r.sites.waiters.len() >= ops);
        let segment = process_segment().unwrap();
        r.sites
            .waiters
            .keys()
            .map(|&(op, id)| {
                (
                    op,
                    crate::site::read_site(segment.view().sites(), id).unwrap().line,
                )
            })
            .collect()
    }

    #[test]
    fn misses_and_waits_of_every_primitive_carry_their_callers_line() {
        use std::time::Duration;
        test_support::init();
        let name = test_support::unique("sites-mutex");
        let m = Mutex::named(&name, ());
        let held = m.lock();
        let line = line!() + 1;
        assert!(m.try_lock().is_none());
        assert!(m.try_lock_for(Duration::from_millis(1)).is_none());
        drop(held);
        assert_eq!(
            site_lines(&name, 2),
            vec![(mutex::op::TRY_LOCK, line), (mutex::op::TRY_LOCK, line + 1)]
        );

        let name = test_support::unique("sites-rwlock");
        let l = RwLock::named(&name, ());
        let w = l.write();
        let line = line!() + 1;
        assert!(l.try_read().is_none());
        assert!(l.try_write_for(Duration::from_millis(1)).is_none());
        drop(w);
        let r = l.read();
        assert!(l.try_upgradable_read().is_some());
        drop(r);
        assert_eq!(
            site_lines(&name, 2),
            vec![(rwlock::op::TRY_READ, line), (rwlock::op::TRY_WRITE, line + 1)]
        );

        let name = test_support::unique("sites-semaphore");
        let sem = Semaphore::named(&name, 0);
        let line = line!() + 1;
        assert!(sem.try_acquire().is_none());
        assert!(sem.try_acquire_for(Duration::from_millis(1)).is_none());
        assert_eq!(
            site_lines(&name, 2),
            vec![
                (semaphore::op::TRY_ACQUIRE, line),
                (semaphore::op::TRY_ACQUIRE, line + 1)
            ]
        );

        let name = test_support::unique("sites-channel");
        let ch = Channel::<u8>::named(&name, 1);
        let line = line!() + 1;
        assert!(ch.try_recv().is_err());
        assert!(ch.recv_timeout(Duration::from_millis(1)).is_err());
        assert_eq!(
            site_lines(&name, 2),
            vec![(channel::op::RECV, line + 1), (channel::op::TRY_RECV, line)]
        );

        let name = test_support::unique("sites-condvar");
        let cv = Condvar::named(&name);
        let lock = Mutex::unobserved(());
        let mut guard = lock.lock();
        let line = line!() + 1;
        assert!(cv.wait_for(&mut guard, Duration::from_millis(1)).timed_out());
        assert_eq!(site_lines(&name, 1), vec![(condvar::op::WAIT, line)]);

        let name = test_support::unique("sites-barrier");
        let barrier = std::sync::Arc::new(Barrier::named(&name, 2));
        let other = {
            let barrier = std::sync::Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
            })
        };
        let line = line!() + 1;
        let leader = barrier.wait().is_leader();
        let helper_line = line - 5;
        other.join().unwrap();
        let expected = if leader { helper_line } else { line };
        assert_eq!(site_lines(&name, 1), vec![(barrier::op::WAIT, expected)]);
    }

    #[test]
    fn set_policy_word_only_reaches_live_instances() {
        test_support::init();
        let m = Mutex::named(&test_support::unique("policy-live"), ());
        let id = m.instance_id().unwrap();
        assert!(set_policy_word(id, PolicyWord::default().with_sample_every(2)));
        assert_eq!(
            policy_word(id),
            Some(PolicyWord::default().with_sample_every(2).0)
        );
        drop(m);
        assert!(!set_policy_word(id, 0u32));
        assert_eq!(policy_word(id), None);
    }

    #[test]
    fn accounting_counts_attempts_across_threads() {
        test_support::init();
        accounting::enable();
        let before = accounting::totals();
        let m = std::sync::Arc::new(Mutex::named(&test_support::unique("accounting"), 0u64));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let m = std::sync::Arc::clone(&m);
                std::thread::spawn(move || {
                    // Each `try_lock` is one observation (a success or a
                    // miss); uncontended `lock`s would only be counted.
                    for _ in 0..1000 {
                        if let Some(mut count) = m.try_lock() {
                            *count += 1;
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let after = accounting::totals();
        // At least the 3000 `try_lock` observations (other tests may add more).
        assert!(after.attempted - before.attempted >= 3000, "{before:?} {after:?}");
        assert_eq!(after.attempted, after.queued + after.dropped + after.lost);
    }
}
