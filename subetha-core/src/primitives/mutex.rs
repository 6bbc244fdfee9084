//! [`Mutex`]: `parking_lot::Mutex` with observations.
//!
//! Its cost against `parking_lot::Mutex` is what the `uncontended` and
//! `contended` groups of `benches/primitives.rs` show.
//!
//! Kind code 1 (`mutex`). Ops: `lock` (1, C + wait when it had to wait),
//! `try_lock` (2, M when it failed; the timed variants set C and record the
//! wait, M when they time out), `unlock` (3, sampled hold time). See the
//! [table](super#op-kinds).
//!
//! Built on [`lock_api`] with [`RawMutex`], whose lock bits and slow path
//! are `parking_lot`'s (the same algorithm, on `parking_lot_core`, so the
//! two behave alike under contention: a brief exponential spin while nobody
//! is parked, then parking, with `parking_lot`'s eventual fairness; one
//! difference, for speed: a thread that parks *during* a plain hold is woken
//! just after that hold's release rather than just before). Guards
//! are `lock_api` guards, so `map`, `unlocked`, `unlock_fair`, `bump` and
//! `leak` all work. The uncontended `lock` is a test of a thread-local
//! (does this thread owe a hold-sampler draw?), one atomic test-and-set of
//! the lock bit, and a test for parked threads; its release is one atomic
//! add that clears the lock bit and counts the `lock`, and a test of the
//! count it replaced (is a count due?). No clock read, no ring push, no
//! other store. Only when the test-and-set finds the lock held does the
//! slow path take a timestamp, and it records the whole wait when it gets
//! the lock.
//!
//! Nothing of the bookkeeping runs inside the hold: counts are decided after
//! the release, and hold sampling before the acquisition (see `HOLD_DRAW`).
//! Any work inside even an occasional hold (one `rdtsc` in every 64th) can tip
//! two threads sharing a lock from alternating into colliding; the `contended`
//! group's `…/50+100ns/2` rows of `benches/primitives.rs` show the lock
//! against `parking_lot`'s.
//!
//! Uncontended `lock`s are reported as counts
//! ([`Observation::FLAG_COUNT`](crate::Observation::FLAG_COUNT)): one
//! observation for the 1st, 2nd, 4th, … 64th of the lock's life (so a lock
//! shows up at once), then one per [`COUNT_BATCH`], and the rest when the
//! mutex is dropped. (The early counts start again after each wrap of the
//! lock word's 14-bit count, every 16,384 `lock`s; they add up to one
//! batch, so the total stays exact.) A consumer's `lock` count may
//! therefore lag a live mutex by up to 63 uncontended acquisitions; it is
//! exact once the mutex is gone. Contended `lock`s, `try_lock`s and sampled
//! holds are reported one by one. (Counting keeps a push per uncontended
//! `lock`, and the sidecar's draining of it, off a hammered lock: see the
//! `contended` group's `…/hammer` rows.)
//!
//! An acquisition's observation is pushed when the lock is released, just
//! after the release, so the ring push is not part of the critical section
//! (a lock held for a long time shows its `lock` only at release; the
//! recorded wait is still measured at acquisition).
//!
//! Hold times are sampled at the level in the instance's policy word (1 in
//! 256 by default) in expectation, at random, not every 256th acquisition
//! (an acquisition reported on its own, a `lock` that waited or a
//! `try_lock`, is sampled by its thread's operation number instead): a
//! sampled hold runs from a clock reading just before the acquisition (or
//! the end of its wait) to one just after the release, so it includes the
//! acquiring instruction (a few ns, more when another core holds the lock
//! word's line). [`AdaptiveMutex`](super::AdaptiveMutex), whose policy needs
//! the critical section alone, reads the clock once the lock is taken. Levels finer than 1
//! in 64 are exact for a thread that keeps taking the mutex, lower (down to
//! 1 in 64) for one that takes other mutexes in between.
//!
//! `lock_api::Mutex::<RawMutex, T>::new` (the raw `INIT`) and
//! [`Mutex::unobserved`] build an unobserved mutex (no instance), usable in
//! `static`s. It measures nothing: its waits read no clock, and its holds
//! store nothing but the lock word, so it runs as `parking_lot`'s does (the
//! `unobserved` rows of the `contended` group).

use std::cell::Cell;
use std::fmt;
use std::hint;
use std::panic::Location;
use std::sync::atomic::{AtomicU8, AtomicU16, Ordering};
use std::time::{Duration, Instant};

use lock_api::GuardNoSend;
use parking_lot_core::{DEFAULT_PARK_TOKEN, ParkResult, SpinWait, UnparkResult, UnparkToken};

use super::{
    CONTENDED, COUNT, MISS, PolicyWord, Probe, Sampler, adaptive, draw_paid, held, holder, next_hold_random,
    unobserved_lock_drops_draw,
};
use crate::clock;
use crate::registry::InstanceKind;
use crate::site::SiteWord;

/// The kind [`Mutex`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 1,
    name: "mutex",
    ops: &["lock", "try_lock", "unlock"],
};

/// Op kinds of [`Mutex`] (and [`AdaptiveMutex`](super::AdaptiveMutex)).
pub mod op {
    /// Blocking acquisition.
    pub const LOCK: u16 = 1;
    /// `try_lock` and its timed variants.
    pub const TRY_LOCK: u16 = 2;
    /// A sampled release; latency = hold time.
    pub const UNLOCK: u16 = 3;
    /// ([`AdaptiveMutex`](crate::AdaptiveMutex) only) the spin budget ran
    /// out and the thread slept in a park; latency = its (last) wake-up:
    /// from the releasing thread's call to wake it to it running again
    /// (none if the two CPUs' clocks disagreed, the waker's reading later
    /// than the woken thread's).
    pub const PARK: u16 = 4;
}

/// The lock word's bits: `parking_lot`'s two, then the count.
const LOCKED_BIT: u16 = 0b01;
/// Some thread is (or may be) parked on the lock.
const PARKED_BIT: u16 = 0b10;
/// Bits 2–15 of the lock word: the uncontended `lock`s released so far,
/// modulo 2^14. A plain hold's release adds [`COUNT_ONE`] in the same
/// atomic operation that clears [`LOCKED_BIT`], so counting costs the
/// fast path no store of its own. Only the lock holder changes them.
const COUNT_SHIFT: u32 = 2;
/// One uncontended `lock` in the lock word.
const COUNT_ONE: u16 = 1 << COUNT_SHIFT;
/// The count bits of the lock word.
const COUNT_BITS: u16 = !(LOCKED_BIT | PARKED_BIT);
/// The largest count the lock word holds; the next `lock` wraps it to 0.
const COUNT_MAX: u16 = COUNT_BITS >> COUNT_SHIFT;
/// Unpark token bit: the lock was handed to the woken thread, still
/// locked (clear: try to take it again). The token's other bits carry, for
/// an adaptive lock, the waker's clock (see [`RawMutex::wake_token`]).
const TOKEN_HANDOFF_BIT: usize = 1;
/// The clock bits of an unpark token (the tick reading, truncated).
const TOKEN_TICKS_MASK: usize = usize::MAX >> 1;

/// Ticks from the clock reading a wake-up's `token` carries to `now`, at
/// least 1; `None` if it carries none, or if `now` reads before it (clocks
/// of two CPUs out of step). Wraps with the token's width, which only a
/// 32-bit target (2^31 ticks, under a second) could reach.
fn wake_ticks(token: UnparkToken, now: u64) -> Option<u64> {
    let sent = token.0 >> 1;
    if sent == 0 {
        return None;
    }
    let elapsed = (now as usize & TOKEN_TICKS_MASK).wrapping_sub(sent) & TOKEN_TICKS_MASK;
    (elapsed <= TOKEN_TICKS_MASK / 2).then(|| (elapsed as u64).max(1))
}
/// `pause`s between two polls of the lock word while an adaptive lock spins
/// (~40 ns on current x86): a release is seen at once, and the spinning
/// waiter only reads the word, so it does not steal the line from the owner.
const PAUSES_PER_POLL: u32 = 4;

/// Uncontended `lock`s per count observation once a lock is past its first
/// 64 (see the module docs). A power of two that divides the lock word's
/// count range.
pub const COUNT_BATCH: u32 = 64;
const _: () = assert!(COUNT_BATCH.is_power_of_two() && COUNT_BATCH <= COUNT_MAX as u32 + 1);

/// The lock word's count of uncontended `lock`s (modulo 2^14), read from the
/// word a release replaced: which counts are due is decided after the release,
/// from the value its atomic add returns, so the hold itself does no
/// bookkeeping. (Any work inside the every-64th hold, even one `rdtsc`, makes
/// an occasional hold longer, and an occasional longer hold can tip two
/// threads from alternating into colliding; see the module docs.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LockCount(u16);

impl LockCount {
    /// The count in a lock word.
    fn of_word(word: u16) -> Self {
        Self(word >> COUNT_SHIFT)
    }

    /// In the first [`COUNT_BATCH`] of the word's count: of the lock's
    /// life, or of a wrap of the 14-bit count, which starts the early
    /// counts again (they add up to one batch, so totals stay exact).
    fn young(self) -> bool {
        u32::from(self.0) < COUNT_BATCH
    }

    /// The cheap test a release runs: may [`due`](Self::due) or a policy
    /// refresh be due for the `lock` taken at this count?
    #[inline(always)]
    fn may_be_due(self) -> bool {
        u32::from(self.0) % COUNT_BATCH == COUNT_BATCH - 1 || self.young()
    }

    /// Whether the uncontended `lock` taken at this count (the
    /// `self.0 + 1`-th of the word's count) ends a count: the 1st, 2nd,
    /// 4th … 64th of the lock's life, then every [`COUNT_BATCH`]th.
    /// Returns how many `lock`s the count covers.
    fn due(self) -> Option<u32> {
        let nth = u32::from(self.0) % COUNT_BATCH + 1;
        if nth == COUNT_BATCH {
            Some(if self.young() {
                COUNT_BATCH / 2
            } else {
                COUNT_BATCH
            })
        } else if self.young() && nth.is_power_of_two() {
            Some(nth - nth / 2)
        } else {
            None
        }
    }

    /// Whether the `lock` taken at this count is the last of a batch of
    /// [`COUNT_BATCH`] (it schedules a hold-sampler draw, see `HOLD_DRAW`).
    fn ends_a_batch(self) -> bool {
        u32::from(self.0) % COUNT_BATCH == COUNT_BATCH - 1
    }

    /// Whether the `lock` taken at this count is due to re-read the policy
    /// word (every [`REFRESH_EVERY`](super::REFRESH_EVERY)th).
    fn refresh_due(self) -> bool {
        u32::from(self.0) % super::REFRESH_EVERY == super::REFRESH_EVERY - 1
    }

    /// How many of the `lock`s counted so far no count covers yet.
    fn uncounted(self) -> u32 {
        let done = u32::from(self.0) % COUNT_BATCH;
        if !self.young() {
            done
        } else if done == 0 {
            0
        } else {
            // The last count ended at the highest power of two ≤ done.
            done - (1 << done.ilog2())
        }
    }

    /// The count after one more `lock`.
    #[cfg(test)]
    fn next(self) -> Self {
        Self(if self.0 == COUNT_MAX { 0 } else { self.0 + 1 })
    }
}

const _: () = assert!(super::REFRESH_EVERY.is_multiple_of(COUNT_BATCH));

/// How a hold began: what its release pushes as the acquisition.
#[derive(Clone, Copy)]
enum Acquired {
    /// An uncontended `try_lock` (or timed variant).
    TryLock,
    /// A `lock` (or timed `try_lock`, [`op::TRY_LOCK`]) that waited this
    /// many ticks; `sites` is its [`SiteWord`].
    Waited { op: u16, ticks: u64, sites: u32 },
}

/// What the slow path did.
struct Slow {
    /// Whether the lock was taken (false: the deadline passed).
    acquired: bool,
    /// Whether this thread slept in a park (not just tried: a park
    /// whose validation failed returns at once).
    parked: bool,
    /// Tick at which the wait ended.
    at: u64,
    /// Ticks from the last wake-up's call (by the releasing thread) to this
    /// thread running again; 0 if not measured (not adaptive, never woken).
    woken_after: u64,
}

/// How the slow path waits before parking.
#[derive(Clone, Copy)]
enum Spin {
    /// `parking_lot`'s: a few exponential rounds, only while nobody is
    /// parked.
    ParkingLot,
    /// The same for a wait nobody measures (an unobserved mutex's): no
    /// clock readings.
    Untimed,
    /// Poll until this tick (the adaptive budget), parked threads or not.
    Until(u64),
}

/// The raw lock behind [`Mutex`] and [`AdaptiveMutex`](super::AdaptiveMutex):
/// `parking_lot`'s lock word plus the bookkeeping of one instance.
///
/// The layout is deliberate: whatever every acquisition writes shares a
/// cache line with the lock word, whatever the allocation's address.
/// `lock_api::Mutex` places the data right after the raw lock, and the
/// allocator only promises 16-byte alignment, so the one region that is
/// always in a single cache line is the 16-byte-aligned chunk holding the
/// end of this struct and the start of the data. The struct is `repr(C)`,
/// 40 bytes, in three 16-byte chunks:
///
/// | bytes | fields | written by |
/// |---|---|---|
/// | 0–15 | `sampler`, `probe`, `adaptive` | nearly nobody (a policy change) |
/// | 16–31 | `hold_start`, `wait_high`, `sites` | the holder of a sampled hold, of a wait, or of a hold begun while threads were parked |
/// | 32–39 (+ data) | `wait`, `pending`, `parkers`, `state` | acquisitions that are not plain uncontended `lock`s, parking waiters, and every release |
///
/// A line the first two chunks share with the third is then written rarely, so
/// every hand-over, contended or not, moves one line between cores, as with
/// `parking_lot`; reading the instance id or the sampling mask from the first
/// chunk finds it in cache. (Bookkeeping placed where an allocation's address
/// can split it from the word, `pending` at byte 8, say, makes the lock's
/// speed depend on its placement, each hand-over moving a second line in the
/// split ones: the `contended` group's `subetha/…/50+100ns` rows.) For data
/// aligned to more than 8 bytes the data starts in the next chunk; the
/// bookkeeping still shares the word's.
///
/// A plain uncontended `lock` writes nothing but the lock word: its count
/// lives in the word's upper bits and the release's atomic add counts it. (A
/// counter in a field of its own would cost every `lock` one more store, which
/// a hammered lock pays for in throughput: the `contended` group's
/// `…/hammer/2` rows.)
#[repr(C)]
pub struct RawMutex {
    sampler: Sampler,
    probe: Probe,
    /// Spin before parking with the budget from the policy word.
    adaptive: bool,
    /// Ticks when a sampled hold began (valid with [`PENDING_SAMPLED`]).
    /// Only touched by the lock holder.
    hold_start: Cell<u64>,
    /// The upper 32 bits of a wait of 2^32 ticks or more (valid with
    /// [`PENDING_LONG_WAIT`]). Only touched by the lock holder.
    wait_high: Cell<u32>,
    /// This hold's [`SiteWord`]: its acquisition's call site and, after a
    /// wait, the site of the hold that ended it (valid with
    /// [`PENDING_SITE`]; see [`super::holder`]). Only touched by the lock
    /// holder.
    sites: Cell<u32>,
    /// A waited-for acquisition's wait in ticks, when under 2^32. Only
    /// touched by the lock holder.
    wait: Cell<u32>,
    /// What the release pushes: a `PENDING_*` kind plus flags. Only
    /// touched by the lock holder.
    pending: Cell<u8>,
    /// Threads between announcing a park (PARKED_BIT) and returning from
    /// it, modulo 256: what a plain `lock` reads to learn that threads are
    /// parked (see [`acquired_plain`](Self::acquired_plain)).
    parkers: AtomicU8,
    /// The lock word: [`LOCKED_BIT`], [`PARKED_BIT`] and the count
    /// ([`COUNT_SHIFT`]).
    state: AtomicU16,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<RawMutex>() == 40);
    // Every per-acquisition write in the lock word's 16-byte chunk, which
    // also holds the first bytes of the data.
    let chunk = offset_of!(RawMutex, state) / 16;
    assert!(chunk == size_of::<RawMutex>() / 16);
    assert!(offset_of!(RawMutex, wait) / 16 == chunk);
    assert!(offset_of!(RawMutex, pending) / 16 == chunk);
    assert!(offset_of!(RawMutex, parkers) / 16 == chunk);
    // Beside the word, not in it: see `acquired_plain`.
    assert!(offset_of!(RawMutex, parkers) + 1 == offset_of!(RawMutex, state));
};

/// `pending` kind: an uncontended `lock`, counted by its release (see
/// [`COUNT_SHIFT`]), not pushed. Zero, the value every release leaves
/// behind, so that the uncontended `lock` need not write it.
const PENDING_NOTHING: u8 = 0;
/// `pending` kind: an acquisition that is neither pushed nor counted at its
/// release (the quiet `try_lock` of `Debug`; a plain `lock` whose hold was
/// bumped, counted at the bump).
const PENDING_QUIET: u8 = 5;
/// `pending` kind: an uncontended `try_lock`.
const PENDING_TRY_LOCK: u8 = 2;
/// `pending` kind: a `lock` that waited (`wait` or `long_wait` ticks).
const PENDING_WAITED_LOCK: u8 = 3;
/// `pending` kind: a timed `try_lock` that waited, then got the lock.
const PENDING_WAITED_TRY_LOCK: u8 = 4;
/// The kind bits of `pending`.
const PENDING_KIND: u8 = 0b111;
/// `pending` flag: this hold is sampled; it began at `hold_start`.
const PENDING_SAMPLED: u8 = 0b1000;
/// `pending` flag: the wait's upper bits are in `wait_high`.
const PENDING_LONG_WAIT: u8 = 0b1_0000;
/// `pending` flag: `sites` holds this hold's call sites; its release
/// stamps them for the next waiter ([`super::holder`]).
const PENDING_SITE: u8 = 0b10_0000;
/// `pending` flag: threads were parked when this uncontended `lock` took
/// the lock, so its release is `parking_lot`'s (see
/// [`RawMutex::release`]), not the bare atomic add.
const PENDING_PARKED: u8 = 0b100_0000;

/// Uncontended `lock`s per draw of the hold sampler (see `HOLD_DRAW`).
const HOLD_SAMPLE_EVERY: u32 = COUNT_BATCH;

thread_local! {
    /// A draw of the hold sampler this thread owes, as its weight (0: none).
    ///
    /// Hold sampling is decided *before* the `lock bts`, so a sampled hold's
    /// first clock reading is taken before the lock is, and nothing is
    /// added to the hold but two stores. Nothing of the lock can decide it
    /// then (its count is only known once the lock is taken, and reading
    /// its line before the `lock bts` slows a hammered lock), and a
    /// per-thread countdown costs every `lock` a store, which a hammered lock
    /// pays for in throughput (the `contended` group's `…/hammer` rows). So
    /// the draws are scheduled by
    /// the locks' counts: a thread whose release ends a batch of
    /// [`HOLD_SAMPLE_EVERY`] uncontended `lock`s of a mutex (any mutex) owes
    /// a draw with weight [`HOLD_SAMPLE_EVERY`], and its next `lock`, of
    /// whichever mutex, pays it: sampled with probability weight / level of
    /// that mutex. Draws thus come at one per [`HOLD_SAMPLE_EVERY`]
    /// uncontended `lock`s, and each mutex is sampled at its level in
    /// expectation. A mutex with a finer level leaves a draw of weight 1
    /// owed, so the thread's next `lock` draws again, with probability
    /// 1 / level: exact for a thread that keeps taking that mutex, lower
    /// (down to 1 in [`HOLD_SAMPLE_EVERY`]) while it takes others. A
    /// `lock` of an unmeasured mutex pays no draw. [`FIRST_DRAW`] until the
    /// thread's first `lock` of a measured one.
    static HOLD_DRAW: Cell<u32> = const { Cell::new(FIRST_DRAW) };
}

/// `HOLD_DRAW` of a thread that has locked no measured mutex yet: its
/// first `lock` of one draws with weight 1. An unmeasured mutex that finds
/// it clears it, so a thread that takes only unmeasured mutexes reads one
/// thread-local per `lock` and no more; a draw that counts left, it
/// leaves for a while (see [`unobserved_lock_drops_draw`]).
const FIRST_DRAW: u32 = u32::MAX;

/// Reports the uncontended `lock`s no count covers yet, before the probe
/// (dropped after this) unregisters the instance.
impl Drop for RawMutex {
    fn drop(&mut self) {
        let rest = LockCount::of_word(*self.state.get_mut()).uncounted();
        if rest != 0 {
            self.probe.emit(op::LOCK, COUNT, u64::from(rest));
        }
    }
}

// SAFETY: the `Cell` fields are only read and written by the thread that
// holds the lock (after acquiring it, before releasing it), so accesses
// from different threads are ordered by the lock word's Acquire/Release;
// all other fields are `Sync`.
unsafe impl Sync for RawMutex {}

impl fmt::Debug for RawMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawMutex")
            .field("instance_id", &self.probe.id())
            .field("adaptive", &self.adaptive)
            .field("locked", &self.is_locked_raw())
            .finish()
    }
}

impl RawMutex {
    const fn unobserved(adaptive: bool) -> Self {
        Self::with_probe(Probe::NONE, adaptive)
    }

    const fn with_probe(probe: Probe, adaptive: bool) -> Self {
        Self {
            sampler: Sampler::new(),
            probe,
            adaptive,
            hold_start: Cell::new(0),
            wait_high: Cell::new(0),
            sites: Cell::new(0),
            wait: Cell::new(0),
            pending: Cell::new(PENDING_NOTHING),
            parkers: AtomicU8::new(0),
            state: AtomicU16::new(0),
        }
    }

    /// Whether nothing of this mutex is measured: no instance, and no
    /// adaptive policy to feed. Its waits read no clock, and nothing is
    /// stored in its holds but the lock word.
    #[inline]
    fn unmeasured(&self) -> bool {
        self.probe.id().is_none() && !self.adaptive
    }

    /// A raw mutex registered as an instance of `kind`.
    pub(crate) fn register(
        kind: InstanceKind,
        name: Option<&str>,
        site: &'static Location<'static>,
        adaptive: bool,
    ) -> Self {
        let raw = Self::with_probe(Probe::register(kind, name, site), adaptive);
        raw.refresh_policy();
        raw
    }

    /// The instance id, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.probe.id()
    }

    /// Re-reads the policy word now and returns it. Done every
    /// [`REFRESH_EVERY`](super::REFRESH_EVERY) uncontended `lock`s (after
    /// the release), on contended ones at most every
    /// [`SLOW_PATH_REFRESH_NS`](super::SLOW_PATH_REFRESH_NS), and every
    /// `REFRESH_EVERY` of a thread's other operations on the lock.
    pub fn refresh_policy(&self) -> PolicyWord {
        let word = self.probe.policy_word();
        self.sampler.apply(word);
        word
    }

    fn is_locked_raw(&self) -> bool {
        self.state.load(Ordering::Relaxed) & LOCKED_BIT != 0
    }

    /// The uncontended acquisition: one atomic bit-test-and-set (`lock
    /// bts`), whatever the count; it fails only if the lock is held.
    /// (`parking_lot` also fails while threads are parked, then takes the
    /// free lock in its slow path: the same outcome.)
    #[inline(always)]
    fn lock_fast(&self) -> bool {
        self.state.fetch_or(LOCKED_BIT, Ordering::Acquire) & LOCKED_BIT == 0
    }

    /// Takes the lock if it is free, parked threads or not.
    #[inline]
    fn try_lock_raw(&self) -> bool {
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & LOCKED_BIT != 0 {
                return false;
            }
            match self.state.compare_exchange_weak(
                state,
                state | LOCKED_BIT,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => state = now,
            }
        }
    }

    /// `parking_lot`'s release: with threads parked, wakes one while the
    /// lock is still held and may hand it over ([`unlock_slow`](Self::unlock_slow));
    /// otherwise [`add_release`](Self::add_release). Adds `count` (0 or
    /// [`COUNT_ONE`]) to the lock word's count either way, and returns the
    /// word it replaced.
    ///
    /// # Safety
    ///
    /// The caller holds the lock.
    #[inline(always)]
    unsafe fn unlock_raw(&self, fair: bool, count: u16) -> u16 {
        if self.state.load(Ordering::Relaxed) & PARKED_BIT != 0 {
            return self.unlock_slow(fair, count);
        }
        // SAFETY: forwarded: the caller holds the lock.
        unsafe { self.add_release(count) }
    }

    /// Releases the lock in one atomic add that also adds `count` to the
    /// lock word's count; wakes a thread that parked meanwhile. Returns
    /// the word it replaced.
    ///
    /// It does not load the word first: the release of a plain uncontended
    /// `lock` that saw no parked thread is this alone. (A load before the add
    /// would lengthen the uncontended `lock`+`unlock`, the `uncontended`
    /// group's `subetha` row against `parking_lot`'s, and a hammered lock runs
    /// at about its uncontended ratio to `parking_lot`.)
    ///
    /// # Safety
    ///
    /// The caller holds the lock.
    #[inline(always)]
    unsafe fn add_release(&self, count: u16) -> u16 {
        // LOCKED_BIT is set, so adding `count - LOCKED_BIT` clears it and
        // carries nothing into PARKED_BIT: one `lock xadd`, whose Release
        // publishes the critical section.
        let before = self
            .state
            .fetch_add(count.wrapping_sub(LOCKED_BIT), Ordering::Release);
        if before & PARKED_BIT != 0 {
            self.wake_one_released();
        }
        before
    }

    /// The lock word's count (for tests: only meaningful while the lock is
    /// free and nobody takes it).
    #[cfg(test)]
    fn count(&self) -> LockCount {
        LockCount::of_word(self.state.load(Ordering::Relaxed))
    }

    /// The unpark token of a wake-up: [`TOKEN_HANDOFF_BIT`] if `handoff`,
    /// and for an adaptive lock that wakes a thread the clock now, so the
    /// woken thread can measure its wake-up ([`op::PARK`]'s latency, the
    /// park cost its policy weighs). Read in `parking_lot_core`'s
    /// callback, under the queue lock, just before the wake-up call.
    fn wake_token(&self, result: &UnparkResult, handoff: bool) -> UnparkToken {
        let sent = if self.adaptive && result.unparked_threads != 0 {
            // Never 0 (0 = no reading): a tick count of exactly 0 reads 1.
            ((clock::ticks() as usize & TOKEN_TICKS_MASK).max(1)) << 1
        } else {
            0
        };
        UnparkToken(sent | if handoff { TOKEN_HANDOFF_BIT } else { 0 })
    }

    /// Wakes one parked thread after a release that found PARKED_BIT set
    /// (a thread parked during the hold); clears the bit if nobody else
    /// waits.
    ///
    /// When `parking_lot_core` says this wake-up is due to be fair (about
    /// every 0.5 ms), the callback takes the lock back for the woken thread
    /// if it is still free and hands it over locked, as `unlock_slow`
    /// would. If another thread took it in the meantime, the woken thread
    /// competes as after any other wake-up, and the next holder, which
    /// finds PARKED_BIT set when it takes the lock, releases through
    /// `unlock_slow`.
    #[cold]
    #[inline(never)]
    fn wake_one_released(&self) {
        let addr = self as *const Self as usize;
        let callback = |result: UnparkResult| {
            // Atomic updates: the lock is free or someone else's now. A
            // thread about to park re-validates the word under the queue
            // lock, after this callback, so it cannot park on a cleared bit.
            let parked = if result.have_more_threads { PARKED_BIT } else { 0 };
            if result.unparked_threads != 0 && result.be_fair {
                let mut state = self.state.load(Ordering::Relaxed);
                while state & LOCKED_BIT == 0 {
                    // Acquire: the woken thread's hold follows whatever
                    // holder released the lock last; the unpark's own
                    // synchronisation carries that on to the woken thread.
                    match self.state.compare_exchange_weak(
                        state,
                        (state & !PARKED_BIT) | parked | LOCKED_BIT,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return self.wake_token(&result, true),
                        Err(now) => state = now,
                    }
                }
            }
            if parked == 0 {
                self.state.fetch_and(!PARKED_BIT, Ordering::Relaxed);
            }
            self.wake_token(&result, false)
        };
        // SAFETY: `addr` is this lock's address (see `lock_slow`); the
        // callback only updates the lock word and does not panic or call
        // into `parking_lot_core`.
        unsafe {
            parking_lot_core::unpark_one(addr, callback);
        }
    }

    /// Right after an uncontended `lock`: `pending` is already
    /// PENDING_NOTHING (see `release`) and the release counts this `lock`,
    /// so nothing is written unless threads are parked.
    ///
    /// Parked threads are learnt from `parkers`, the byte beside the lock
    /// word, not from the word's PARKED_BIT: a load of the bytes the `lock
    /// bts` has just written costs the fast path more than a load of the byte
    /// beside them (the `uncontended` group's rows, and the `contended`
    /// group's `unobserved/hammer/2` row). A parker counts itself before its
    /// Release
    /// compare-and-swap sets PARKED_BIT, and this `lock bts` is an Acquire
    /// in that word's release sequence, so a `lock` that finds the bit set
    /// finds the count too. A count that reads 0 anyway (256 parkers, or a
    /// thread requeued by a condition variable) costs only the fair
    /// hand-off: the release's atomic add still sees PARKED_BIT and wakes
    /// a thread.
    #[inline(always)]
    fn acquired_plain(&self, site: &'static Location<'static>) {
        if self.parkers.load(Ordering::Relaxed) != 0 {
            self.release_slowly(site);
        }
    }

    /// Bookkeeping right after any other acquisition: leaves its
    /// observation for the release to push, and every so often samples
    /// the hold or re-reads the policy word. `now` is a tick reading taken
    /// at acquisition, or 0.
    #[inline(always)]
    fn acquired(&self, how: Acquired, now: u64) {
        if self.unmeasured() {
            return;
        }
        match how {
            Acquired::TryLock => {
                self.pending.set(PENDING_TRY_LOCK);
                self.sample_reported(now);
            }
            Acquired::Waited { op, ticks, sites } => {
                self.pending.set(self.record_wait(op, ticks, sites));
                self.sample_reported(now);
            }
        }
    }

    /// Marks an uncontended `lock` taken while threads were parked: its
    /// release goes through `parking_lot`'s, which may hand the lock over.
    /// Its call site is kept too: the threads parked on it wait for this
    /// hold, which its release stamps ([`super::holder`]).
    #[cold]
    #[inline(never)]
    fn release_slowly(&self, site: &'static Location<'static>) {
        let mut pending = self.pending.get() | PENDING_PARKED;
        if pending & PENDING_SITE == 0 {
            self.sites.set(SiteWord::own(self.probe.site_id(site)).0);
            pending |= PENDING_SITE;
        }
        self.pending.set(pending);
    }

    /// The sampling of an acquisition reported on its own (a `try_lock` or
    /// a wait), which the lock's count leaves out: by the thread's
    /// operation count instead.
    #[inline(always)]
    fn sample_reported(&self, now: u64) {
        let n = super::next_thread_op();
        if n & self.sampler.check_mask() == 0 {
            self.sample_or_refresh(n, now);
        }
    }

    /// Samples the hold and re-reads the policy word when operation `n` is
    /// due for either.
    #[cold]
    #[inline(never)]
    fn sample_or_refresh(&self, n: u32, now: u64) {
        let start = self.sampler.bookkeeping(&self.probe, n, now);
        if start != 0 {
            self.hold_start.set(start);
            self.pending.set(self.pending.get() | PENDING_SAMPLED);
        }
    }

    /// Stores a wait and its [`SiteWord`] for the release; returns its
    /// `pending` value.
    #[inline(always)]
    fn record_wait(&self, op: u16, ticks: u64, sites: u32) -> u8 {
        let kind = if op == op::TRY_LOCK {
            PENDING_WAITED_TRY_LOCK
        } else {
            PENDING_WAITED_LOCK
        };
        self.sites.set(sites);
        self.wait.set(ticks as u32);
        if ticks >> 32 == 0 {
            kind | PENDING_SITE
        } else {
            self.wait_high.set((ticks >> 32) as u32);
            kind | PENDING_SITE | PENDING_LONG_WAIT
        }
    }

    /// The [`SiteWord`] of a wait at `site` that just took the lock: the
    /// site and the holder whose release ended the wait (see
    /// [`super::holder`]). Read while holding the lock.
    #[inline]
    fn waited_sites(&self, site: u16) -> u32 {
        let holder = match self.probe.id() {
            Some(id) => holder::holder(id, self.state.load(Ordering::Relaxed) & COUNT_BITS),
            None => 0,
        };
        SiteWord::with_holder(site, holder).0
    }

    /// Leaves this hold's site for the next waiter, just before a release
    /// that leaves the lock word's count at `count_after`.
    #[inline]
    fn stamp_holder(&self, site: u16, count_after: u16) {
        if let Some(id) = self.probe.id() {
            holder::stamp(id, site, count_after);
        }
    }

    /// The lock word's count bits after a release that adds `count`.
    #[inline]
    fn count_after(&self, count: u16) -> u16 {
        (self.state.load(Ordering::Relaxed) & COUNT_BITS).wrapping_add(count) & COUNT_BITS
    }

    /// The `lock` that pays the draw this thread owes (see [`HOLD_DRAW`]):
    /// draws with weight `weight`, then takes the lock, sampled or not. A
    /// sampled hold begins at a reading taken before the `lock bts`, or at
    /// the end of the wait.
    #[cold]
    #[inline(never)]
    fn lock_drawing_a_sample(&self, weight: u32, site: &'static Location<'static>) {
        if self.unmeasured() {
            // Nothing to sample; a draw a measured mutex's count left
            // stays for the next measured `lock`, for a while.
            if unobserved_lock_drops_draw(weight == FIRST_DRAW) {
                HOLD_DRAW.with(|draw| draw.set(0));
            }
            if self.lock_fast() {
                self.acquired_plain(site);
            } else {
                self.lock_contended(false, site);
            }
            return;
        }
        draw_paid();
        let weight = if weight == FIRST_DRAW { 1 } else { weight };
        let mask = self.sampler.mask();
        // Probability weight / level (certain once the weight covers it).
        let sampled = mask != Sampler::OFF && next_hold_random() & mask < weight;
        let fine = mask != Sampler::OFF && mask < HOLD_SAMPLE_EVERY - 1;
        HOLD_DRAW.with(|draw| draw.set(if fine { 1 } else { 0 }));
        if !sampled {
            if self.lock_fast() {
                self.acquired_plain(site);
            } else {
                self.lock_contended(false, site);
            }
            return;
        }
        // A sampled hold's site is known, so its release can stamp it for
        // the next waiter (interned before the lock is taken).
        let site_id = self.probe.site_id(site);
        // An adaptive lock's policy needs the critical section alone: it reads
        // the clock once the lock is taken. (Read before the `lock bts`, a
        // hammered lock's samples would include the wait for the lock word's
        // line, enough to make the policy stop the yielding that suits a
        // hammered lock: the `adaptive` group's `…/hammer` rows.) A plain
        // `Mutex` keeps its hold free of clock reads, at the price of samples
        // that include that acquisition.
        let before = if self.adaptive { 0 } else { clock::ticks() };
        if self.lock_fast() {
            self.sites.set(SiteWord::own(site_id).0);
            self.acquired_plain(site);
            self.hold_start
                .set(if self.adaptive { clock::ticks() } else { before });
            self.pending.set(self.pending.get() | PENDING_SAMPLED);
        } else {
            self.lock_contended(true, site);
        }
    }

    /// The contended `lock`: waits, then records the wait. `sampled`: a draw
    /// already chose to sample this hold; otherwise it is sampled by the
    /// thread's operation number, as a `try_lock` is (a contended `lock` is
    /// reported on its own, so it brings the thread no draw; without this, a
    /// lock taken mostly after waits would have its holds sampled far below
    /// its level). Decided before the wait, so the hold itself only stores its
    /// start.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self, sampled: bool, site: &'static Location<'static>) {
        if self.unmeasured() {
            self.lock_slow(0, Spin::Untimed, None);
            return;
        }
        let sampled = sampled || self.sampler.wants_sample(super::next_thread_op());
        // Interned before the wait, so it is not part of the measured wait.
        let site_id = self.probe.site_id(site);
        let start = clock::ticks();
        let spin = self.spin_policy(start);
        let Slow {
            parked,
            at: now,
            woken_after,
            ..
        } = self.lock_slow(start, spin, None);
        let sites = self.waited_sites(site_id);
        let mut pending = self.record_wait(op::LOCK, now.saturating_sub(start).max(1), sites);
        if sampled {
            // The wait's end is read before the compare-and-swap that takes
            // the lock, which is slow on a contended line: an adaptive lock,
            // whose policy needs the critical section alone (see
            // `lock_drawing_a_sample`), reads the clock again once it holds
            // the lock. (With `now`, a hammered adaptive lock's sampled holds
            // would include that compare-and-swap and could read above the
            // yield threshold, and the policy would poll where it should
            // yield.)
            self.hold_start
                .set(if self.adaptive { clock::ticks() } else { now });
            pending |= PENDING_SAMPLED;
        }
        self.pending.set(pending);
        if parked && self.adaptive {
            self.probe.emit_at(op::PARK, CONTENDED, woken_after, site);
        }
    }

    /// The contended timed `try_lock`: waits until `deadline`, records the
    /// wait (C, and M when it timed out).
    #[cold]
    #[inline(never)]
    fn try_lock_timed(&self, deadline: Option<Instant>, site: &'static Location<'static>) -> bool {
        if self.unmeasured() {
            return self.lock_slow(0, Spin::Untimed, deadline).acquired;
        }
        let site_id = self.probe.site_id(site);
        let start = clock::ticks();
        let spin = self.spin_policy(start);
        let Slow {
            acquired, at: now, ..
        } = self.lock_slow(start, spin, deadline);
        let waited = now.saturating_sub(start).max(1);
        if acquired {
            let sites = self.waited_sites(site_id);
            self.acquired(
                Acquired::Waited {
                    op: op::TRY_LOCK,
                    ticks: waited,
                    sites,
                },
                now,
            );
        } else {
            self.probe
                .emitter()
                .emit_sites(op::TRY_LOCK, CONTENDED | MISS, waited, SiteWord::own(site_id));
        }
        acquired
    }

    /// Re-reads the policy word if a slow path has not for a while, and
    /// picks the spin.
    fn spin_policy(&self, start: u64) -> Spin {
        let word = if self.sampler.slow_path_due(start) {
            self.refresh_policy()
        } else {
            self.sampler.word()
        };
        if self.adaptive && !word.spin_yields() {
            Spin::Until(adaptive::spin_deadline(start, word))
        } else {
            Spin::ParkingLot
        }
    }

    /// `parking_lot`'s lock slow path with a choice of spin. `start` is a
    /// tick reading taken just before the call.
    ///
    /// The wait's end (`at`) is read just before each load of the lock
    /// word, not after a load finds the lock free: between that load and
    /// the compare-and-swap that takes the lock nothing else runs, so the
    /// clock read neither delays the hand-over nor lands in the critical
    /// section. A compare-and-swap that loses a race keeps the reading of
    /// the load before it, so a wait can read short by that one attempt.
    fn lock_slow(&self, start: u64, spin: Spin, deadline: Option<Instant>) -> Slow {
        let timed = !matches!(spin, Spin::Untimed);
        let tick = || if timed { clock::ticks() } else { 0 };
        let mut spinwait = SpinWait::new();
        let mut parked = false;
        let mut woken_after = 0;
        let mut at = start;
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            // Take the lock if it is free, even if others are parked.
            if state & LOCKED_BIT == 0 {
                match self.state.compare_exchange_weak(
                    state,
                    state | LOCKED_BIT,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        return Slow {
                            acquired: true,
                            parked,
                            at,
                            woken_after,
                        };
                    }
                    Err(now) => state = now,
                }
                continue;
            }
            let spin_more = match spin {
                Spin::ParkingLot | Spin::Untimed => {
                    state & PARKED_BIT == 0 && spinwait.spin() && {
                        at = tick();
                        true
                    }
                }
                Spin::Until(until) => {
                    for _ in 0..PAUSES_PER_POLL {
                        hint::spin_loop();
                    }
                    // One reading for both the budget and the wait's end.
                    at = clock::ticks();
                    at < until
                }
            };
            if spin_more {
                state = self.state.load(Ordering::Relaxed);
                continue;
            }
            // Announce a parked thread, then park. Counted in `parkers`
            // first: the Release below publishes the count with the bit.
            self.parkers.fetch_add(1, Ordering::Relaxed);
            if state & PARKED_BIT == 0
                && let Err(now) = self.state.compare_exchange_weak(
                    state,
                    state | PARKED_BIT,
                    Ordering::Release,
                    Ordering::Relaxed,
                )
            {
                self.parkers.fetch_sub(1, Ordering::Relaxed);
                state = now;
                continue;
            }
            let addr = self as *const Self as usize;
            let validate = || self.state.load(Ordering::Relaxed) & !COUNT_BITS == LOCKED_BIT | PARKED_BIT;
            let timed_out = |_, was_last_thread| {
                // Clear the parked bit if we were the last parked thread.
                if was_last_thread {
                    self.state.fetch_and(!PARKED_BIT, Ordering::Relaxed);
                }
            };
            // SAFETY: `addr` is this lock's address, which only this lock
            // parks and unparks on; `validate` and `timed_out` only touch
            // the lock word (they neither panic nor call into
            // `parking_lot_core`), and the empty `before_sleep` does not
            // park.
            let result = unsafe {
                parking_lot_core::park(addr, validate, || {}, timed_out, DEFAULT_PARK_TOKEN, deadline)
            };
            self.parkers.fetch_sub(1, Ordering::Relaxed);
            at = tick();
            match result {
                ParkResult::Unparked(token) => {
                    parked = true;
                    if let Some(ticks) = wake_ticks(token, at) {
                        woken_after = ticks;
                    }
                    // The unlocking thread handed the lock over, still locked.
                    if token.0 & TOKEN_HANDOFF_BIT != 0 {
                        return Slow {
                            acquired: true,
                            parked,
                            at,
                            woken_after,
                        };
                    }
                }
                ParkResult::Invalid => {}
                ParkResult::TimedOut => {
                    parked = true;
                    return Slow {
                        acquired: false,
                        parked,
                        at,
                        woken_after,
                    };
                }
            }
            spinwait.reset();
            state = self.state.load(Ordering::Relaxed);
        }
    }

    /// Wakes one parked thread while the lock is still held; with
    /// `force_fair` (or `parking_lot_core`'s periodic fairness) hands it
    /// the lock directly. Adds `count` to the lock word's count either way,
    /// and returns the word it replaced.
    /// The release, with threads parked, of every hold but a plain
    /// uncontended `lock` that found none parked (see [`release`](Self::release)),
    /// and of `bump`.
    #[cold]
    #[inline(never)]
    fn unlock_slow(&self, force_fair: bool, count: u16) -> u16 {
        let addr = self as *const Self as usize;
        let mut replaced = 0;
        let callback = |result: UnparkResult| {
            // Plain stores, as in `parking_lot`: the lock is still ours and
            // the queue is locked, so the one concurrent change is a waiter
            // setting PARKED_BIT before it parks, and its park re-validates
            // the word under the queue lock after this callback. (Another
            // thread's `lock bts` finds the bit set and changes nothing; an
            // earlier holder's `wake_one_released` runs under the same
            // queue lock.) The count bits are only changed by the holder.
            replaced = self.state.load(Ordering::Relaxed);
            let counted = (replaced & COUNT_BITS).wrapping_add(count);
            let parked = if result.have_more_threads { PARKED_BIT } else { 0 };
            if result.unparked_threads != 0 && (force_fair || result.be_fair) {
                // Keep the lock locked for the woken thread.
                self.state.store(counted | parked | LOCKED_BIT, Ordering::Relaxed);
                return self.wake_token(&result, true);
            }
            self.state.store(counted | parked, Ordering::Release);
            self.wake_token(&result, false)
        };
        // SAFETY: `addr` is this lock's address (see `lock_slow`); the
        // callback only stores to the lock word and a local, and does not
        // panic or call into `parking_lot_core`.
        unsafe {
            parking_lot_core::unpark_one(addr, callback);
        }
        replaced
    }

    /// After a release that counted one uncontended `lock`: from the word
    /// the release replaced, ends a count or re-reads the policy word when
    /// due. Reads nothing of the lock but the word's old value (in a
    /// register) unless one is due.
    #[inline(always)]
    fn counted(&self, replaced: u16) {
        let count = LockCount::of_word(replaced);
        if count.may_be_due() {
            self.count_or_refresh(count);
        }
    }

    /// [`counted`](Self::counted)'s rare part, run after the release: only
    /// the probe (never written after construction; `&self` keeps the
    /// mutex alive for the call) and the atomics of the policy cache.
    #[cold]
    #[inline(never)]
    fn count_or_refresh(&self, count: LockCount) {
        if let Some(covers) = count.due() {
            self.probe.emit(op::LOCK, COUNT, u64::from(covers));
        }
        if count.ends_a_batch() && !self.unmeasured() {
            HOLD_DRAW.with(|draw| {
                // (`FIRST_DRAW` only until the thread's first measured
                // `lock`, which comes before any count.)
                if draw.get() == 0 || draw.get() == FIRST_DRAW {
                    draw.set(HOLD_SAMPLE_EVERY);
                }
            });
        }
        if count.refresh_due() {
            self.refresh_policy();
        }
    }

    /// Releases the lock, then pushes what the hold recorded.
    ///
    /// A plain uncontended `lock` that found no thread parked is released
    /// by the bare atomic add ([`add_release`](Self::add_release)); every
    /// other hold by `parking_lot`'s release ([`unlock_raw`](Self::unlock_raw)),
    /// so a thread that was parked before the hold began can be handed the
    /// lock (`parking_lot`'s eventual fairness).
    ///
    /// Everything the pushes need from the lock's own line is read before
    /// the release: after it, the next holder may own that line, and a
    /// read would both wait for it and take it away again. The counts and
    /// the clock reading that ends a sampled hold come after the release,
    /// out of the critical section.
    ///
    /// # Safety
    ///
    /// The caller holds the lock.
    #[inline(always)]
    unsafe fn release(&self, fair: bool) {
        let pending = self.pending.get();
        if pending == PENDING_NOTHING && !fair {
            // An uncontended `lock` that saw no parked thread: counted
            // here, not pushed, and released by the bare add. A thread
            // that parked during the hold is woken after the release.
            // SAFETY: forwarded: the caller holds the lock.
            let replaced = unsafe { self.add_release(COUNT_ONE) };
            self.counted(replaced);
        } else if pending == PENDING_SAMPLED && !fair {
            // The same, sampled: the hold ends at the release, and its
            // clock reading and push come after it. Its site is known
            // (see `lock_drawing_a_sample`): left for the next waiter.
            let start = self.hold_start.get();
            self.pending.set(PENDING_NOTHING);
            self.stamp_holder(SiteWord(self.sites.get()).site(), self.count_after(COUNT_ONE));
            let ended = self.adaptive_hold_end();
            // SAFETY: forwarded: the caller holds the lock.
            let replaced = unsafe { self.add_release(COUNT_ONE) };
            self.counted(replaced);
            self.emit_hold(start, ended);
        } else if pending == PENDING_NOTHING {
            // SAFETY: forwarded: the caller holds the lock.
            let replaced = unsafe { self.unlock_raw(true, COUNT_ONE) };
            self.counted(replaced);
        } else {
            // SAFETY: forwarded: the caller holds the lock.
            unsafe { self.release_recorded(pending, fair) }
        }
    }

    /// Where an adaptive lock's sampled hold ends: just before its release
    /// (0 for a plain `Mutex`, whose hold ends after it).
    ///
    /// The policy needs the critical section alone, as at the hold's start
    /// (see [`lock_drawing_a_sample`](Self::lock_drawing_a_sample)): the
    /// release's `lock xadd` waits for the lock word's line whenever a waiter
    /// has read it, so on a hammered lock a hold that ends after it measures
    /// the line's hand-off, not the section. (Measured that way, an empty
    /// section's samples can read above the policy's yield threshold, and it
    /// would poll where it should yield: the `adaptive` group's `…/hammer`
    /// rows.)
    #[inline(always)]
    fn adaptive_hold_end(&self) -> u64 {
        if self.adaptive { clock::ticks() } else { 0 }
    }

    /// Pushes a sampled hold that began at `start` and ended at `ended`
    /// (0: now, after its release).
    #[cold]
    #[inline(never)]
    fn emit_hold(&self, start: u64, ended: u64) {
        self.probe.emit(op::UNLOCK, 0, held(start, ended));
    }

    /// [`release`](Self::release) of a hold whose acquisition was not a
    /// plain uncontended `lock`, or that began with threads parked, or a
    /// sampled one released fairly.
    ///
    /// # Safety
    ///
    /// The caller holds the lock.
    #[cold]
    #[inline(never)]
    unsafe fn release_recorded(&self, pending: u8, fair: bool) {
        let waited = || {
            let high = if pending & PENDING_LONG_WAIT != 0 {
                u64::from(self.wait_high.get()) << 32
            } else {
                0
            };
            high | u64::from(self.wait.get())
        };
        let sites = if pending & PENDING_SITE != 0 {
            SiteWord(self.sites.get())
        } else {
            SiteWord::NONE
        };
        let acquisition = match pending & PENDING_KIND {
            PENDING_TRY_LOCK => Some((op::TRY_LOCK, 0, 0)),
            PENDING_WAITED_LOCK => Some((op::LOCK, CONTENDED, waited())),
            PENDING_WAITED_TRY_LOCK => Some((op::TRY_LOCK, CONTENDED, waited())),
            _ => None,
        };
        let hold_start = (pending & PENDING_SAMPLED != 0).then(|| self.hold_start.get());
        // A plain `lock` (sampled, or taken with threads parked) is
        // counted too.
        let plain = pending & PENDING_KIND == PENDING_NOTHING;
        let ended = if hold_start.is_some() {
            self.adaptive_hold_end()
        } else {
            0
        };
        // What the next uncontended `lock` expects to find.
        self.pending.set(PENDING_NOTHING);
        let count = if plain { COUNT_ONE } else { 0 };
        // Every recorded release stamps (site 0 if not known): one that
        // adds nothing to the count must not leave an older stamp standing.
        self.stamp_holder(sites.site(), self.count_after(count));
        // SAFETY: forwarded: the caller holds the lock.
        let replaced = unsafe { self.unlock_raw(fair, count) };
        if plain {
            self.counted(replaced);
        }
        let emitter = self.probe.emitter();
        if let Some((op, flags, latency)) = acquisition {
            // A waited acquisition carries its sites; a `try_lock` that
            // got the lock at once neither waited nor missed.
            let sites = if flags & CONTENDED != 0 {
                sites
            } else {
                SiteWord::NONE
            };
            emitter.emit_sites(op, flags, latency, sites);
        }
        if let Some(start) = hold_start {
            emitter.emit(op::UNLOCK, 0, held(start, ended));
        }
    }

    /// `lock`, called at `site`. The site is only looked at on the slow
    /// paths (a wait, a sampled hold, threads parked), never by the
    /// uncontended `lock`.
    #[inline(always)]
    pub(crate) fn lock_at(&self, site: &'static Location<'static>) {
        // Nothing of the lock is read before the `lock bts` (a load of its
        // line there costs a hammered lock its exclusive ownership), and
        // nothing is stored but the lock word.
        let draw = HOLD_DRAW.with(Cell::get);
        if draw != 0 {
            self.lock_drawing_a_sample(draw, site);
            return;
        }
        if self.lock_fast() {
            self.acquired_plain(site);
        } else {
            self.lock_contended(false, site);
        }
    }

    /// `try_lock`, called at `site` (carried by a miss).
    #[inline(always)]
    pub(crate) fn try_lock_at(&self, site: &'static Location<'static>) -> bool {
        if self.try_lock_raw() {
            self.acquired(Acquired::TryLock, 0);
            true
        } else {
            self.probe.emit_at(op::TRY_LOCK, MISS, 0, site);
            false
        }
    }

    /// `try_lock_until` (`None`: wait without a deadline), called at `site`.
    #[inline(always)]
    pub(crate) fn try_lock_until_at(
        &self,
        deadline: Option<Instant>,
        site: &'static Location<'static>,
    ) -> bool {
        if self.lock_fast() {
            self.acquired(Acquired::TryLock, 0);
            return true;
        }
        self.try_lock_timed(deadline, site)
    }

    /// `try_lock` without an observation (for `Debug`).
    fn try_lock_quiet(&self) -> bool {
        let acquired = self.try_lock_raw();
        if acquired {
            self.pending.set(PENDING_QUIET);
        }
        acquired
    }
}

// SAFETY: `state` implements `parking_lot`'s mutex protocol: the lock is
// held exactly while LOCKED_BIT is set by the holder's Acquire test-and-set
// or compare-and-swap that found it clear (or by a fair hand-off), and
// released by a Release add, store or compare-and-swap that clears it. The
// count bits beside it are only changed by the holder, in those releases.
unsafe impl lock_api::RawMutex for RawMutex {
    /// An unobserved raw mutex (no instance).
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = Self::unobserved(false);
    type GuardMarker = GuardNoSend;

    /// Called through `lock_api` (not [`Mutex::lock`]), the call site
    /// recorded is `lock_api`'s.
    #[inline]
    #[track_caller]
    fn lock(&self) {
        self.lock_at(Location::caller());
    }

    #[inline]
    #[track_caller]
    fn try_lock(&self) -> bool {
        self.try_lock_at(Location::caller())
    }

    #[inline]
    unsafe fn unlock(&self) {
        // SAFETY: forwarded: the caller holds the lock.
        unsafe { self.release(false) }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.is_locked_raw()
    }
}

// SAFETY: as for `RawMutex`: `parking_lot`'s fair release and bump.
unsafe impl lock_api::RawMutexFair for RawMutex {
    #[inline]
    unsafe fn unlock_fair(&self) {
        // SAFETY: forwarded: the caller holds the lock.
        unsafe { self.release(true) }
    }

    /// Hands the lock to a parked thread, if any, and takes it back,
    /// unobserved: a sampled hold keeps running across the bump.
    #[inline]
    unsafe fn bump(&self) {
        if self.state.load(Ordering::Relaxed) & PARKED_BIT != 0 {
            // The thread the lock goes to records its own hold in these
            // fields; this hold's record must survive it.
            let pending = self.pending.get();
            let (wait, wait_high, sites) = (self.wait.get(), self.wait_high.get(), self.sites.get());
            let hold_start = self.hold_start.get();
            // A plain `lock` is counted in the lock word at its release. Count
            // it at the bump's release instead: a thread that takes the lock
            // plainly in between must read the count after it, or it would
            // take this hold's place and end the same count again (its `lock`s
            // reported twice). A count it ends goes out now; its release then
            // counts nothing (`PENDING_QUIET`), and a sampled hold still goes
            // out there.
            let plain = pending & PENDING_KIND == PENDING_NOTHING;
            let count = if plain { COUNT_ONE } else { 0 };
            let site = if pending & PENDING_SITE != 0 {
                SiteWord(sites).site()
            } else {
                0
            };
            self.stamp_holder(site, self.count_after(count));
            let replaced = self.unlock_slow(true, count);
            if plain {
                self.counted(replaced);
            }
            if !self.lock_fast() {
                // Not a wait of its own (no tick reading needed): the
                // hold goes on.
                self.lock_slow(0, Spin::ParkingLot, None);
            }
            self.pending.set(if plain {
                pending & !PENDING_KIND | PENDING_QUIET
            } else {
                pending
            });
            self.wait.set(wait);
            self.wait_high.set(wait_high);
            self.sites.set(sites);
            self.hold_start.set(hold_start);
        }
    }
}

// SAFETY: as for `RawMutex`.
unsafe impl lock_api::RawMutexTimed for RawMutex {
    type Duration = Duration;
    type Instant = Instant;

    #[inline]
    #[track_caller]
    fn try_lock_for(&self, timeout: Duration) -> bool {
        self.try_lock_until_at(Instant::now().checked_add(timeout), Location::caller())
    }

    #[inline]
    #[track_caller]
    fn try_lock_until(&self, timeout: Instant) -> bool {
        self.try_lock_until_at(Some(timeout), Location::caller())
    }
}

/// A guard of [`Mutex`] (a `lock_api` guard: `map`, `unlocked`,
/// `unlock_fair`, `bump`, `leak` …).
pub type MutexGuard<'a, T> = lock_api::MutexGuard<'a, RawMutex, T>;
/// A guard of [`Mutex`] mapped to a part of the data.
pub type MappedMutexGuard<'a, T> = lock_api::MappedMutexGuard<'a, RawMutex, T>;

/// A mutual-exclusion lock, `parking_lot::Mutex` with observations (kind 1).
///
/// ```
/// use std::time::Duration;
/// use subetha_core::Mutex;
///
/// let cache = Mutex::named("cache", 0u32);
/// *cache.lock() += 1;
/// if let Some(mut g) = cache.try_lock_for(Duration::from_millis(5)) {
///     *g += 1;
/// }
/// assert_eq!(cache.into_inner(), 2);
/// ```
pub struct Mutex<T: ?Sized> {
    inner: lock_api::Mutex<RawMutex, T>,
}

impl<T> Mutex<T> {
    /// A mutex named after its creation site.
    #[track_caller]
    pub fn new(value: T) -> Self {
        Self::from_raw(RawMutex::register(KIND, None, Location::caller(), false), value)
    }

    /// A mutex named `name` (1..=64 bytes; longer is cut, control characters
    /// become `?`, empty means "name after the creation site").
    #[track_caller]
    pub fn named(name: &str, value: T) -> Self {
        Self::from_raw(
            RawMutex::register(KIND, Some(name), Location::caller(), false),
            value,
        )
    }

    /// A mutex without an instance: nothing is observed. `const`, so it can
    /// initialise a `static`.
    pub const fn unobserved(value: T) -> Self {
        Self::from_raw(RawMutex::unobserved(false), value)
    }

    pub(crate) const fn from_raw(raw: RawMutex, value: T) -> Self {
        Self {
            inner: lock_api::Mutex::from_raw(raw, value),
        }
    }

    /// Consumes the mutex (unregistering its instance) and returns the data.
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Acquires the lock, blocking while another thread holds it. A wait
    /// is attributed to the caller's line ([`crate::site`]).
    #[inline]
    #[track_caller]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.raw().lock_at(Location::caller());
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_guard_unchecked() }
    }

    /// Acquires the lock if it is free.
    #[inline]
    #[track_caller]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        if self.raw().try_lock_at(Location::caller()) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_guard_unchecked() })
        } else {
            None
        }
    }

    /// Acquires the lock, waiting at most `timeout`.
    #[inline]
    #[track_caller]
    pub fn try_lock_for(&self, timeout: Duration) -> Option<MutexGuard<'_, T>> {
        let site = Location::caller();
        if self
            .raw()
            .try_lock_until_at(Instant::now().checked_add(timeout), site)
        {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_guard_unchecked() })
        } else {
            None
        }
    }

    /// Acquires the lock, waiting until `deadline` at most.
    #[inline]
    #[track_caller]
    pub fn try_lock_until(&self, deadline: Instant) -> Option<MutexGuard<'_, T>> {
        if self.raw().try_lock_until_at(Some(deadline), Location::caller()) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_guard_unchecked() })
        } else {
            None
        }
    }

    /// Whether the lock is held (a racy hint; not observed).
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.inner.is_locked()
    }

    /// The data, through exclusive access (no locking, not observed).
    #[inline]
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// A raw pointer to the data (see `lock_api::Mutex::data_ptr`).
    #[inline]
    pub fn data_ptr(&self) -> *mut T {
        self.inner.data_ptr()
    }

    /// Releases a lock whose guard was forgotten.
    ///
    /// # Safety
    ///
    /// The lock must be held by the current context through a forgotten
    /// guard (see `lock_api::Mutex::force_unlock`).
    #[inline]
    pub unsafe fn force_unlock(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.force_unlock() }
    }

    /// Releases a lock whose guard was forgotten, fairly.
    ///
    /// # Safety
    ///
    /// As for [`Mutex::force_unlock`].
    #[inline]
    pub unsafe fn force_unlock_fair(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.force_unlock_fair() }
    }

    /// A guard for a lock the current context already holds.
    ///
    /// # Safety
    ///
    /// The lock must be held (see `lock_api::Mutex::make_guard_unchecked`).
    #[inline]
    pub unsafe fn make_guard_unchecked(&self) -> MutexGuard<'_, T> {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.make_guard_unchecked() }
    }

    /// The underlying `lock_api` mutex.
    pub fn as_lock_api(&self) -> &lock_api::Mutex<RawMutex, T> {
        &self.inner
    }

    fn raw(&self) -> &RawMutex {
        // SAFETY: the raw lock is only used for its instance id, its policy
        // cache and acquisitions (`lock`, the `try_lock`s, the try-lock of
        // `Debug`) whose success is turned into a guard at once, so no
        // guard's view of the lock is invalidated.
        unsafe { self.inner.raw() }
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.raw().instance_id()
    }

    /// Re-reads the policy word now; returns it.
    pub fn refresh_policy(&self) -> PolicyWord {
        self.raw().refresh_policy()
    }
}

impl<T: Default> Default for Mutex<T> {
    #[track_caller]
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> From<T> for Mutex<T> {
    #[track_caller]
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    /// Like `parking_lot`'s, but without recording a `try_lock`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Mutex");
        if self.raw().try_lock_quiet() {
            // SAFETY: the quiet try-lock just acquired the lock; the guard
            // releases it (through the instrumented unlock, which records
            // nothing for a hold whose `pending` is `PENDING_QUIET`).
            let guard = unsafe { self.inner.make_guard_unchecked() };
            d.field("data", &&*guard);
        } else {
            d.field("data", &format_args!("<locked>"));
        }
        d.field("instance_id", &self.instance_id()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier as StdBarrier};

    use super::super::test_support::{is_retired, op, unique, wait_for};
    use super::*;
    use crate::Observation;

    /// An unobserved mutex (the same word and slow path, nothing measured)
    /// still excludes, blocks, times out and hands over.
    #[test]
    fn an_unobserved_mutex_excludes_blocks_and_times_out() {
        let m = Arc::new(Mutex::unobserved(0u64));
        let held = m.lock();
        let waiter = {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                assert!(
                    m.try_lock_for(Duration::from_millis(5)).is_none(),
                    "the lock is held"
                );
                *m.lock() += 1;
            })
        };
        std::thread::sleep(Duration::from_millis(30));
        drop(held);
        waiter.join().unwrap();
        assert_eq!(*m.lock(), 1);
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 5000;
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    for i in 0..PER_THREAD {
                        let mut guard = if i % 16 == 0 {
                            m.try_lock_for(Duration::from_secs(10)).expect("within 10 s")
                        } else {
                            m.lock()
                        };
                        let seen = *guard;
                        std::hint::spin_loop();
                        *guard = seen + 1;
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(*m.lock(), 1 + THREADS * PER_THREAD);
    }

    #[test]
    fn lock_word_and_small_data_share_a_cache_line_wherever_the_allocator_puts_them() {
        // `lock_api::Mutex` puts the data right after the raw lock.
        let m = Mutex::unobserved(0u64);
        let state = std::mem::offset_of!(RawMutex, state);
        let data = m.data_ptr() as usize - &m as *const _ as usize;
        assert_eq!(data, std::mem::size_of::<RawMutex>(), "data follows the raw lock");
        // Allocations are at least 16-byte aligned; try every such placement
        // within a line, also behind an `Arc`'s two counters.
        let per_acquisition = [
            std::mem::offset_of!(RawMutex, wait),
            std::mem::offset_of!(RawMutex, pending),
        ];
        for base in (0..64).step_by(16) {
            let line = |offset: usize| (base + offset) / 64;
            assert_eq!(line(state), line(data), "placement {base}: state and data split");
            for field in per_acquisition {
                assert_eq!(
                    line(field),
                    line(state),
                    "placement {base}: byte {field} split from state"
                );
            }
            assert_eq!(
                line(data),
                line(data + 7),
                "placement {base}: a u64 of data splits"
            );
        }
    }

    #[test]
    fn uncontended_lock_emits_lock_without_latency_and_try_lock_misses() {
        let name = unique("mutex-basic");
        let m = Mutex::named(&name, 0u32);
        set_sampling(&m, PolicyWord::default().with_sample_every(0));
        for _ in 0..10 {
            *m.lock() += 1;
        }
        let held = m.lock();
        assert!(m.try_lock().is_none());
        assert!(m.try_lock_for(Duration::from_millis(1)).is_none());
        drop(held);
        assert!(m.try_lock().is_some());
        let r = wait_for(&name, |r| r.stats.total_ops() >= 11);
        // 11 locks, none contended, no latency: counted at the 1st, 2nd,
        // 4th and 8th, the last three not yet.
        assert_eq!(op(&r, op::LOCK), (8, 0, 0, 0));
        // try_lock: one miss, one timed-out (contended + miss, with its
        // wait), one success.
        assert_eq!(op(&r, op::TRY_LOCK), (3, 1, 2, 1));
        // Sampling off: no hold times.
        assert_eq!(op(&r, op::UNLOCK), (0, 0, 0, 0));
        let timed_out = r.stats.op(op::TRY_LOCK).unwrap().latency().unwrap();
        let ms = crate::clock::calibration().ns_to_ticks(1_000_000);
        assert!(timed_out.max() >= ms * 9 / 10, "waited {} ticks", timed_out.max());
        // Dropping the mutex counts the rest.
        drop(m);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= 11
        });
        assert_eq!(op(&r, op::LOCK), (11, 0, 0, 0));
    }

    /// Runs `steps` uncontended `lock`s from `start`, checking after each
    /// that the counts so far plus what is left uncounted cover every
    /// `lock` exactly once (from `start`'s own uncounted rest); returns the
    /// `lock`s (1-based, from `start`) at which counts were due.
    fn run_counts(start: LockCount, steps: u32) -> Vec<u32> {
        let mut count = start;
        let mut counted = 0u64;
        let mut due_at = Vec::new();
        for n in 1..=steps {
            if let Some(covers) = count.due() {
                // A count covers what was left uncounted, and this lock.
                assert_eq!(covers, count.uncounted() + 1, "at {count:?}");
                counted += u64::from(covers);
                due_at.push(n);
            }
            count = count.next();
            assert_eq!(
                counted + u64::from(count.uncounted()),
                u64::from(start.uncounted()) + u64::from(n),
                "after {n} from {start:?}"
            );
        }
        due_at
    }

    /// The counts of uncontended `lock`s: the 1st, 2nd, 4th … 64th of a
    /// lock's life, then every 64th, and the early counts again after each
    /// wrap of the lock word's 14-bit count; what they leave uncounted is
    /// what a drop reports.
    #[test]
    fn counts_cover_every_uncontended_lock_exactly_once() {
        let fresh = LockCount(0);
        let due = run_counts(fresh, 100_000);
        assert_eq!(due[..10], [1, 2, 4, 8, 16, 32, 64, 128, 192, 256]);
        assert_eq!(fresh.due(), Some(1));
        // Across the word's wrap: a full batch ends at the wrap, then the
        // early counts start again (they add up to one batch).
        let near_wrap = LockCount(COUNT_MAX - 70);
        let due = run_counts(near_wrap, 200);
        assert_eq!(due[..4], [7, 71, 72, 73]);
        assert_eq!(LockCount(COUNT_MAX).next(), LockCount(0));
        assert_eq!(LockCount(COUNT_MAX).due(), Some(COUNT_BATCH));
        assert_eq!(near_wrap.uncounted(), (u32::from(COUNT_MAX) - 70) % COUNT_BATCH);
        assert_eq!(
            (fresh.next().uncounted(), fresh.next().next().next().uncounted()),
            (0, 1)
        );
        // The release's cheap test lets every due count through.
        for n in 0..=COUNT_MAX {
            let count = LockCount(n);
            if count.due().is_some() || count.refresh_due() {
                assert!(count.may_be_due(), "{count:?}");
            }
        }
    }

    /// Through the lock itself: `n` uncontended locks, then a drop, reach
    /// the consumer as exactly `n`, whatever `n`'s place between counts.
    #[test]
    fn a_dropped_mutex_reports_every_uncontended_lock() {
        for n in [1u32, 3, 63, 64, 65, 200] {
            let name = unique("mutex-count");
            let m = Mutex::named(&name, ());
            for _ in 0..n {
                drop(m.lock());
            }
            assert_eq!(u32::from(m.raw().count().0), n);
            drop(m);
            let r = wait_for(&name, |r| {
                r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= u64::from(n)
            });
            assert_eq!(op(&r, op::LOCK), (u64::from(n), 0, 0, 0), "n = {n}");
        }
    }

    /// Four threads on one lock, with fair unlocks and bumps mixed in:
    /// the data shows mutual exclusion, and after the drop the consumer's
    /// `lock` total is exactly the `lock`s taken, contended (pushed one by
    /// one) or not (counted in the lock word). Few enough per thread that
    /// no ring can fill, so nothing may be missing.
    #[test]
    fn every_lock_is_reported_once_under_contention() {
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 2000;
        let name = unique("mutex-stress");
        let m = Arc::new(Mutex::named(&name, 0u64));
        let start = Arc::new(StdBarrier::new(THREADS as usize));
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (m, start) = (Arc::clone(&m), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..PER_THREAD {
                        let mut g = m.lock();
                        let seen = *g;
                        std::hint::spin_loop();
                        *g = seen + 1;
                        match (i + t) % 97 {
                            0 => MutexGuard::unlock_fair(g),
                            1 => {
                                MutexGuard::bump(&mut g);
                                *g += 0;
                            }
                            _ => drop(g),
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let m = Arc::into_inner(m).expect("workers are gone");
        assert_eq!(*m.lock(), THREADS * PER_THREAD, "a lost update");
        let total = THREADS * PER_THREAD + 1;
        assert_eq!(m.raw().state.load(Ordering::Relaxed) & !COUNT_BITS, 0);
        drop(m);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= total
        });
        let (ops, contended, _, _) = op(&r, op::LOCK);
        assert_eq!(ops, total, "{contended} of them contended");
    }

    /// A bump in the middle of a plain hold that ends a count: a thread that
    /// takes the lock plainly during the bump must not end the same count
    /// again (the word's count did not yet include the bumped hold, so it
    /// looked due a second time, and its `lock`s were reported twice). One
    /// thread bumps every hold; the other only takes plain `lock`s, so they
    /// meet in the gap often.
    /// the other only takes plain `lock`s, so they meet in the gap often.
    #[test]
    fn a_bumped_hold_and_a_lock_taken_during_the_bump_end_no_count_twice() {
        const PER_THREAD: u64 = 800;
        for round in 0..10 {
            let name = unique("mutex-bump-count");
            let m = Arc::new(Mutex::named(&name, 0u64));
            let start = Arc::new(StdBarrier::new(4));
            let workers: Vec<_> = [true, false, true, false]
                .into_iter()
                .map(|bumps| {
                    let (m, start) = (Arc::clone(&m), Arc::clone(&start));
                    std::thread::spawn(move || {
                        start.wait();
                        for _ in 0..PER_THREAD {
                            let mut g = m.lock();
                            *g += 1;
                            // Long enough that waiters park, so bumps hand
                            // the lock over.
                            for _ in 0..200 {
                                std::hint::spin_loop();
                            }
                            if bumps {
                                MutexGuard::bump(&mut g);
                            }
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            let m = Arc::into_inner(m).expect("workers are gone");
            assert_eq!(*m.lock(), 4 * PER_THREAD);
            drop(m);
            let total = 4 * PER_THREAD + 1;
            let r = wait_for(&name, |r| {
                r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= total
            });
            assert_eq!(op(&r, op::LOCK).0, total, "round {round}");
        }
    }

    /// Counting goes on across the wrap of the lock word's count, through
    /// the lock itself: the batch that ends at the wrap, the early counts
    /// after it, and the rest at the drop add up to every `lock`.
    #[test]
    fn counting_goes_on_across_the_wrap_of_the_lock_words_count() {
        let name = unique("mutex-wrap");
        let m = Mutex::named(&name, ());
        // As if 16,381 `lock`s had gone by: the last 61 of them were not
        // counted yet (the batch ends at 16,384).
        let near = LockCount(COUNT_MAX - 2);
        m.raw().state.store(near.0 << COUNT_SHIFT, Ordering::Relaxed);
        for _ in 0..200 {
            drop(m.lock());
        }
        assert_eq!(m.raw().count(), LockCount(197));
        assert!(!m.is_locked());
        drop(m);
        let expected = u64::from(near.uncounted()) + 200;
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::LOCK).0 >= expected
        });
        assert_eq!(op(&r, op::LOCK), (expected, 0, 0, 0));
    }

    #[test]
    fn bump_hands_over_without_recording_the_other_hold_twice() {
        let name = unique("mutex-bump");
        let m = Arc::new(Mutex::named(&name, 0u32));
        set_sampling(&m, PolicyWord::default().with_sample_every(0));
        let mut guard = m.lock();
        let waiter = spawn_parked(&m, |m| *m.lock() += 1);
        MutexGuard::bump(&mut guard);
        // The waiter had the lock in between.
        assert_eq!(*guard, 1);
        drop(guard);
        waiter.join().unwrap();
        let r = wait_for(&name, |r| r.stats.total_ops() >= 2);
        // This thread's plain lock and the waiter's contended one; the
        // waiter's is not recorded again at this thread's release.
        assert_eq!(op(&r, op::LOCK), (2, 1, 0, 1));
    }

    /// Runs `f` on a new thread that blocks on `m` (which the caller holds)
    /// and returns once that thread sits in `parking_lot_core`'s queue for the
    /// lock. PARKED_BIT alone is not enough (the thread sets it before it
    /// queues itself, and a release in between wakes nobody), nor is the
    /// thread's sleeping state: it can sleep on the queue's own lock, still
    /// unqueued. Either can mislead a test on a loaded host.
    fn spawn_parked<T: Send + 'static>(
        m: &Arc<Mutex<T>>,
        f: impl FnOnce(&Mutex<T>) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let before = queued_on(m.raw());
        let waiter = {
            let m = Arc::clone(m);
            std::thread::spawn(move || f(&m))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while queued_on(m.raw()) == before {
            assert!(Instant::now() < deadline, "the waiter never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_ne!(m.raw().state.load(Ordering::SeqCst) & PARKED_BIT, 0);
        waiter
    }

    /// `parkers` counts the threads parked on the lock, so a plain `lock`
    /// taken while they sleep releases through `parking_lot`'s slow path,
    /// and returns to 0 once they are gone: a count left behind would send
    /// every later release that way.
    #[test]
    fn parked_threads_are_counted_beside_the_word_and_uncounted_when_they_leave() {
        let m = Arc::new(Mutex::named(&unique("mutex-parkers"), 0u32));
        let held = m.lock();
        let waiters: Vec<_> = (0..3).map(|_| spawn_parked(&m, |m| *m.lock() += 1)).collect();
        assert_eq!(m.raw().parkers.load(Ordering::SeqCst), 3);
        drop(held);
        for waiter in waiters {
            waiter.join().unwrap();
        }
        assert_eq!(*m.lock(), 3);
        assert_eq!(m.raw().parkers.load(Ordering::SeqCst), 0);
        // A timed-out park leaves no count either.
        let held = m.lock();
        let timed = {
            let m = Arc::clone(&m);
            std::thread::spawn(move || m.try_lock_for(Duration::from_millis(20)).is_none())
        };
        assert!(
            timed.join().unwrap(),
            "the timed lock gave up while the lock was held"
        );
        assert_eq!(m.raw().parkers.load(Ordering::SeqCst), 0);
        drop(held);
        // And nothing sends a plain `lock` the slow way now.
        let plain = m.lock();
        assert_eq!(m.raw().pending.get() & PENDING_PARKED, 0);
        drop(plain);
    }

    /// How many threads sleep in `parking_lot_core`'s queue for `raw`,
    /// counted under the queue's lock without waking any.
    fn queued_on(raw: &RawMutex) -> usize {
        let mut queued = 0;
        // SAFETY: the key is the address `raw` parks on; the filter only
        // counts and skips, and neither it nor the callback panics or calls
        // into `parking_lot_core`. With nobody unparked, the call changes
        // neither the queue nor the bucket's fairness timer.
        unsafe {
            parking_lot_core::unpark_filter(
                raw as *const RawMutex as usize,
                |_| {
                    queued += 1;
                    parking_lot_core::FilterOp::Skip
                },
                |_| parking_lot_core::DEFAULT_UNPARK_TOKEN,
            );
        }
        queued
    }

    fn set_sampling<T>(m: &Mutex<T>, word: PolicyWord) {
        assert!(super::super::set_policy_word(m.instance_id().unwrap(), word));
        m.refresh_policy();
    }

    #[test]
    fn an_adaptive_lock_with_the_yield_bit_waits_like_a_plain_one() {
        let m = crate::AdaptiveMutex::named(&unique("adaptive-yield"), ());
        let budget = PolicyWord::default().with_spin_ns(4096);
        set_sampling(&m, budget);
        assert!(matches!(m.raw().spin_policy(clock::ticks()), Spin::Until(_)));
        set_sampling(&m, budget.with_spin_yields(true));
        assert!(matches!(m.raw().spin_policy(clock::ticks()), Spin::ParkingLot));
        let plain = Mutex::named(&unique("plain-yield"), ());
        set_sampling(&plain, budget);
        assert!(matches!(
            plain.raw().spin_policy(clock::ticks()),
            Spin::ParkingLot
        ));
    }

    /// A `lock` that waited is sampled at the lock's level too, by the
    /// thread's operation number (it brings no draw). Every one of the
    /// waiter's 128 `lock`s waits for the main thread's `try_lock` hold;
    /// at 1 in 64 each thread's 64th and 128th operations are sampled:
    /// two of the waiter's holds and two of the main thread's.
    #[test]
    fn contended_locks_are_sampled_at_the_level_too() {
        const ROUNDS: usize = 128;
        let name = unique("mutex-contended-sampling");
        let m = Arc::new(Mutex::named(&name, 0u32));
        set_sampling(&m, PolicyWord::default().with_sample_every(64));
        let (go, wants) = std::sync::mpsc::channel::<()>();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let waiter = {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                while wants.recv().is_ok() {
                    *m.lock() += 1;
                    done.send(()).unwrap();
                }
            })
        };
        for _ in 0..ROUNDS {
            let held = m.try_lock().expect("free between rounds");
            let before = queued_on(m.raw());
            go.send(()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while queued_on(m.raw()) == before {
                assert!(Instant::now() < deadline, "the waiter never parked");
                std::thread::sleep(Duration::from_micros(200));
            }
            drop(held);
            finished.recv().unwrap();
        }
        drop(go);
        waiter.join().unwrap();
        assert_eq!(*m.lock(), ROUNDS as u32);
        let r = wait_for(&name, |r| {
            op(r, op::LOCK).1 >= ROUNDS as u64 && held_samples(r) >= 4
        });
        // The waiter's, all waited for, and the check's own.
        let rounds = ROUNDS as u64;
        assert_eq!(op(&r, op::LOCK), (rounds + 1, rounds, 0, rounds));
        assert_eq!(op(&r, op::TRY_LOCK).0, rounds);
        assert_eq!(held_samples(&r), 4, "two holds of each thread");
    }

    /// An adaptive lock's `park` reports the waiter's wake-up, from the
    /// releasing thread's call to wake it to it running: a fraction of a
    /// wait that lasted as long as the 100 ms hold it queued behind.
    #[test]
    fn a_park_reports_its_wake_up_not_its_wait() {
        let name = unique("adaptive-wake");
        let raw = RawMutex::register(adaptive::KIND, Some(&name), Location::caller(), true);
        let m = Arc::new(Mutex::from_raw(raw, 0u32));
        // Park at once.
        set_sampling(&m, PolicyWord::default().with_spin_ns(0).with_spin_pinned(true));
        let held = m.lock();
        let waiter = spawn_parked(&m, |m| *m.lock() += 1);
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
        waiter.join().unwrap();
        let r = wait_for(&name, |r| op(r, op::PARK).0 >= 1 && op(r, op::LOCK).1 >= 1);
        assert_eq!(op(&r, op::PARK), (1, 1, 0, 1));
        let max_ns = |kind| {
            let h = r.stats.op(kind).and_then(|o| o.latency()).expect("a latency");
            crate::clock::calibration().ticks_to_ns(h.max())
        };
        let (waited, woken) = (max_ns(op::LOCK), max_ns(op::PARK));
        assert!(waited >= 90_000_000, "waited only {waited} ns");
        assert!(woken < waited / 4, "wake-up {woken} ns of a {waited} ns wait");
    }

    #[test]
    fn contended_lock_records_the_wait_of_a_blocked_thread() {
        let name = unique("mutex-contended");
        let m = Arc::new(Mutex::named(&name, 0u32));
        let start = Arc::new(StdBarrier::new(2));
        let guard = m.lock();
        let waiter = {
            let (m, start) = (Arc::clone(&m), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                *m.lock() += 1; // blocks until the main thread lets go
            })
        };
        start.wait();
        // Let the waiter block (spin, then park) for a while.
        std::thread::sleep(Duration::from_millis(30));
        drop(guard);
        waiter.join().unwrap();
        let r = wait_for(&name, |r| {
            r.stats.op(op::LOCK).is_some_and(|o| o.contended() >= 1)
        });
        let (ops, contended, misses, latencies) = op(&r, op::LOCK);
        assert_eq!((ops, contended, misses, latencies), (2, 1, 0, 1));
        let lock = r.stats.op(op::LOCK).unwrap();
        let waited_ns = crate::clock::calibration().ticks_to_ns(lock.latency().unwrap().max());
        assert!(waited_ns >= 25_000_000, "waited only {waited_ns} ns");
        assert_eq!(lock.distinct_threads().count, 2);
    }

    /// `parking_lot`'s eventual fairness after the bare-add release: an
    /// uncontended `lock` that finds threads parked is released by
    /// `parking_lot`'s slow path, which hands the lock to a parked thread
    /// when a fair turn is due. With the bare add the lock would be free
    /// for a moment, and a thread spinning on `try_lock` would take it.
    ///
    /// The state is built directly rather than raced for (a race that needs a
    /// woken thread to be slower than its waker is unreliable on a loaded
    /// host): a waiter parks behind the main thread's hold; the main thread
    /// clears LOCKED_BIT alone, as if it had released just before the waiter's
    /// park, so PARKED_BIT stays set with nobody woken, and takes the lock
    /// again with a plain `lock`.
    ///
    /// Three runs: the release without the hand-off loses to the thief only
    /// some of the time (the woken waiter's own attempt to take the lock on a
    /// fair turn sometimes wins anyway), so one run could miss it.
    ///
    /// The runs happen in a child process of this test binary, alone: the
    /// fair turn is due when a timer of `parking_lot_core`'s hash bucket
    /// has run out, the bucket is shared with other locks, and another
    /// test's wake-up there restarts the timer.
    #[test]
    fn a_plain_lock_taken_while_threads_park_hands_the_lock_over_when_fairness_is_due() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "primitives::mutex::tests::fair_turn_child_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(FAIR_TURN_CHILD_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
        let winners = stdout
            .lines()
            .find_map(|line| line.split_once("fair-turn winners: ").map(|(_, w)| w))
            .unwrap_or_else(|| panic!("the child reported no winners:\n{stdout}"));
        assert_eq!(
            winners,
            format!("{:?}", [FAIR_TURN_WAITER; 3]),
            "the spinning thief (2) took the lock on a fair turn"
        );
    }

    const FAIR_TURN_CHILD_ENV: &str = "SUBETHA_FAIR_TURN_CHILD";

    /// Runs in the child process started by the test above (and does
    /// nothing otherwise).
    #[test]
    #[ignore = "helper process of a_plain_lock_taken_while_threads_park_hands_the_lock_over_when_fairness_is_due"]
    fn fair_turn_child_process() {
        if std::env::var_os(FAIR_TURN_CHILD_ENV).is_none() {
            return;
        }
        let winners: Vec<u8> = (0..3).map(|_| fair_turn_winner()).collect();
        println!("fair-turn winners: {winners:?}");
    }

    const FAIR_TURN_WAITER: u8 = 1;

    /// One run of the test above; who got the lock after the plain hold.
    fn fair_turn_winner() -> u8 {
        use std::sync::atomic::AtomicU8;
        const WAITER: u8 = FAIR_TURN_WAITER;
        const THIEF: u8 = 2;
        let m = Arc::new(Mutex::named(&unique("mutex-fair-turn"), ()));
        // No sampled hold, and past the early counts (the 1st, 2nd, 4th …
        // `lock`), so nothing else sends the release the slow way.
        set_sampling(&m, PolicyWord::default().with_sample_every(0));
        for _ in 0..2 * COUNT_BATCH {
            drop(m.lock());
        }
        let first = m.lock();
        let winner = Arc::new(AtomicU8::new(0));
        let waiter = {
            let winner = Arc::clone(&winner);
            spawn_parked(&m, move |m| {
                let _hold = m.lock();
                let _ = winner.compare_exchange(0, WAITER, Ordering::SeqCst, Ordering::SeqCst);
            })
        };
        std::mem::forget(first);
        m.raw().state.fetch_and(!LOCKED_BIT, Ordering::Release);
        let plain = m.lock();
        assert_eq!(
            m.raw().pending.get(),
            PENDING_PARKED | PENDING_SITE,
            "a plain lock, threads parked (its site kept for the holder view)"
        );
        let thief = {
            let (m, winner) = (Arc::clone(&m), Arc::clone(&winner));
            std::thread::spawn(move || {
                // As tight a loop as a test build allows: the quiet
                // `try_lock` of `Debug` (no observation) on every turn.
                let raw = m.raw();
                let deadline = Instant::now() + Duration::from_secs(10);
                while winner.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
                    for _ in 0..1024 {
                        if raw.try_lock_quiet() {
                            let _ = winner.compare_exchange(0, THIEF, Ordering::SeqCst, Ordering::SeqCst);
                            // SAFETY: this thread took the lock just above,
                            // and nothing borrows its data.
                            unsafe { m.force_unlock() };
                            break;
                        }
                    }
                }
            })
        };
        // Past `parking_lot_core`'s fair interval (at most 1 ms), with the
        // thief spinning.
        std::thread::sleep(Duration::from_millis(5));
        drop(plain);
        waiter.join().unwrap();
        thief.join().unwrap();
        winner.load(Ordering::SeqCst)
    }

    /// Takes `m` `n` more times (`before` were taken so far, all on this
    /// thread) in chunks small enough for the ring, waiting after each
    /// chunk until the sidecar has every count that is due; returns the
    /// record afterwards.
    fn lock_n(m: &Mutex<()>, name: &str, before: u64, n: u64) -> crate::drain::InstanceRecord {
        let mut done = 0;
        let mut record = None;
        while done < n {
            let chunk = (n - done).min(1000);
            for _ in 0..chunk {
                drop(m.lock());
            }
            done += chunk;
            let total = before + done;
            let count = LockCount((total % (u64::from(COUNT_MAX) + 1)) as u16);
            let counted = total - u64::from(count.uncounted());
            record = Some(wait_for(name, |r| op(r, op::LOCK).0 >= counted));
        }
        record.expect("n > 0")
    }

    fn held_samples(r: &crate::drain::InstanceRecord) -> u64 {
        op(r, op::UNLOCK).0
    }

    /// Hold sampling follows the level a consumer writes into the policy
    /// word: 1 in 256 by default, every hold, 1 in 512, off. The levels at
    /// or above 1 in 64 are drawn at random per thread, so their counts
    /// are checked against bounds (over four standard deviations wide;
    /// the thread's draws are seeded by its id, so a run repeats); every
    /// hold and off are exact.
    #[test]
    fn sampling_level_follows_the_policy_word_at_runtime() {
        let name = unique("mutex-sampling");
        let m = Mutex::named(&name, ());
        let id = m.instance_id().unwrap();
        // Default: 1 in 256, about 100 of 25,600 (standard deviation 10).
        let r = lock_n(&m, &name, 0, 25_600);
        let default = held_samples(&r);
        assert!((60..=140).contains(&default), "{default} of 25600 sampled");
        // A consumer raises the level to "every hold"; the mutex picks it
        // up at its next refresh (every 1,024 `lock`s), within this round.
        assert!(super::super::set_policy_word(
            id,
            PolicyWord::default().with_sample_every(1)
        ));
        let r = lock_n(&m, &name, 25_600, 1024);
        let raised = held_samples(&r);
        let r = lock_n(&m, &name, 26_624, 100);
        assert_eq!(held_samples(&r), raised + 100, "every hold sampled");
        // 1 in 512 (applied at once by an explicit refresh): about 64 of
        // 32,768 (standard deviation 8), across a wrap of the lock word's
        // count.
        assert!(super::super::set_policy_word(
            id,
            PolicyWord::default().with_sample_every(512)
        ));
        m.refresh_policy();
        let r = lock_n(&m, &name, 26_724, 32_768);
        let rare = held_samples(&r) - (raised + 100);
        assert!((30..=100).contains(&rare), "{rare} of 32768 sampled");
        // And off.
        assert!(super::super::set_policy_word(
            id,
            PolicyWord::default().with_sample_every(0)
        ));
        m.refresh_policy();
        let before_off = held_samples(&r);
        let r = lock_n(&m, &name, 59_492, 5000);
        assert_eq!(held_samples(&r), before_off);
        // Every `lock` counted but the 44 since the last count (64,448 is
        // a multiple of 64).
        assert_eq!(op(&r, op::LOCK).0, 64_492 - 44);
        let samples = r.stats.op(op::UNLOCK).unwrap().latency().unwrap();
        assert!(samples.min() >= 1, "a hold time is never 0");
    }

    /// A thread alternating between two mutexes samples each at its own
    /// level: the draw does not favour one of them (a fixed interval of 64
    /// would always land on the same one).
    #[test]
    fn interleaved_mutexes_are_each_sampled_at_their_level() {
        const ROUNDS: u64 = 64_000;
        let (name_a, name_b) = (unique("mutex-interleave-a"), unique("mutex-interleave-b"));
        let (a, b) = (Mutex::named(&name_a, ()), Mutex::named(&name_b, ()));
        set_sampling(&b, PolicyWord::default().with_sample_every(512));
        let mut done = 0;
        while done < ROUNDS {
            for _ in 0..500 {
                drop(a.lock());
                drop(b.lock());
            }
            done += 500;
            // Let the sidecar keep up, so no ring fills.
            let counted = done - u64::from(a.raw().count().uncounted());
            wait_for(&name_a, |r| op(r, op::LOCK).0 >= counted);
        }
        let counted = ROUNDS - u64::from(b.raw().count().uncounted());
        let rb = wait_for(&name_b, |r| op(r, op::LOCK).0 >= counted);
        let ra = wait_for(&name_a, |r| op(r, op::LOCK).0 >= counted);
        // 250 ± 16 (the default, 1 in 256) and 125 ± 11 expected: bounds
        // over four deviations.
        let (sa, sb) = (held_samples(&ra), held_samples(&rb));
        assert!((185..=315).contains(&sa), "a: {sa} of {ROUNDS}");
        assert!((80..=170).contains(&sb), "b: {sb} of {ROUNDS}");
    }

    /// A draw that a measured mutex's count leaves waits for the thread's
    /// next `lock` of a measured mutex: `lock`s of an unobserved one in
    /// between do not take it. At a level of 1 in 64 each such draw
    /// (weight 64) samples the next hold for certain.
    #[test]
    fn unobserved_locks_leave_a_measured_mutexs_draws_alone() {
        const ROUNDS: u64 = 6400;
        let name = unique("mutex-draws-kept");
        let (observed, unobserved) = (Mutex::named(&name, ()), Mutex::unobserved(()));
        set_sampling(&observed, PolicyWord::default().with_sample_every(64));
        for _ in 0..ROUNDS {
            drop(observed.lock());
            drop(unobserved.lock());
        }
        let counted = ROUNDS - u64::from(observed.raw().count().uncounted());
        let r = wait_for(&name, |r| op(r, op::LOCK).0 >= counted);
        // The batches end at the 64th, 128th ... 6,336th `lock` with a
        // hold after them: 99 samples, and the first `lock` draws with
        // weight 1 (1 in 64). Taken by the unobserved mutex, the draws
        // would leave none.
        let samples = held_samples(&r);
        assert!(
            (99..=100).contains(&samples),
            "{samples} of {ROUNDS} holds sampled"
        );
    }

    /// A draw left pending survives 63 `lock`s of unobserved mutexes and
    /// goes at the 64th, so a thread that now takes only those is back on
    /// their fast path.
    #[test]
    fn a_pending_draw_outlives_64_unobserved_locks_at_most() {
        let observed = Mutex::named(&unique("mutex-draw-outlived"), ());
        let unobserved = Mutex::unobserved(());
        set_sampling(&observed, PolicyWord::default().with_sample_every(256));
        // The thread's first `lock` pays its first draw; a count that ends
        // a batch (within 64 uncontended `lock`s) leaves the next.
        drop(observed.lock());
        let mut locks = 1;
        while HOLD_DRAW.with(Cell::get) == 0 && locks < 200 {
            drop(observed.lock());
            locks += 1;
        }
        let pending = HOLD_DRAW.with(Cell::get);
        assert!(
            pending != 0 && pending != FIRST_DRAW,
            "a draw is pending: {pending}"
        );
        assert!(locks <= 65, "the draw came after {locks} locks");
        for _ in 0..63 {
            drop(unobserved.lock());
        }
        assert_eq!(HOLD_DRAW.with(Cell::get), pending, "kept for 63");
        drop(unobserved.lock());
        assert_eq!(HOLD_DRAW.with(Cell::get), 0, "dropped at the 64th");
    }

    #[test]
    fn drop_unregisters_and_final_stats_stay_visible() {
        let name = unique("mutex-drop");
        let m = Mutex::named(&name, vec![1, 2]);
        drop(m.lock());
        let id = m.instance_id().unwrap();
        assert_eq!(m.into_inner(), vec![1, 2]);
        assert!(super::super::policy_word(id).is_none(), "entry no longer live");
        let r = wait_for(&name, |r| r.meta.retired_mono_ns.is_some() && is_retired(&name));
        assert_eq!(op(&r, op::LOCK).0, 1);
    }

    #[test]
    fn guards_and_lock_api_features_work() {
        let m = Mutex::named(&unique("mutex-api"), (1u32, 2u32));
        {
            let g = m.lock();
            let mut second = MutexGuard::map(g, |pair| &mut pair.1);
            *second += 40;
        }
        let mut g = m.lock();
        MutexGuard::unlocked(&mut g, || assert!(!m.is_locked()));
        MutexGuard::bump(&mut g);
        MutexGuard::unlock_fair(g);
        assert_eq!(*m.lock(), (1, 42));
        let mut m = m;
        m.get_mut().0 = 7;
        let text = format!("{m:?}");
        assert!(text.contains("(7, 42)"), "{text}");
        let g = m.lock();
        assert!(format!("{m:?}").contains("<locked>"));
        std::mem::forget(g);
        // SAFETY: the forgotten guard's lock is held by this thread.
        unsafe { m.force_unlock() };
        assert!(!m.is_locked());
        static STATIC: Mutex<u32> = Mutex::unobserved(5);
        assert_eq!(*STATIC.lock(), 5);
        assert_eq!(STATIC.instance_id(), None);
    }

    #[test]
    fn waits_of_any_length_reach_the_observation() {
        let name = unique("mutex-long-wait");
        let m = Mutex::named(&name, 0u32);
        set_sampling(&m, PolicyWord::default().with_sample_every(0));
        let raw = m.raw();
        for ticks in [1, u64::from(u32::MAX), u64::from(u32::MAX) + 1, u64::MAX] {
            assert!(raw.try_lock_raw());
            raw.acquired(
                Acquired::Waited {
                    op: op::LOCK,
                    ticks,
                    sites: 0,
                },
                0,
            );
            // SAFETY: locked just above.
            unsafe { lock_api::RawMutex::unlock(raw) };
        }
        let r = wait_for(&name, |r| r.stats.total_ops() >= 4);
        assert_eq!(op(&r, op::LOCK), (4, 4, 0, 4));
        let latency = r.stats.op(op::LOCK).unwrap().latency().unwrap();
        assert!(
            latency.max() > u64::from(u32::MAX) * 1000,
            "max {}",
            latency.max()
        );
    }

    #[test]
    fn hold_time_of_a_sampled_hold_is_measured() {
        let name = unique("mutex-hold");
        let m = Mutex::named(&name, ());
        set_sampling(&m, PolicyWord::default().with_sample_every(1));
        // Past a batch of 64: whatever draw this thread owed has been paid,
        // and under "every hold" each `lock` since has drawn.
        for _ in 0..100 {
            drop(m.lock());
        }
        {
            let _g = m.lock();
            std::thread::sleep(Duration::from_millis(5));
        }
        let r = wait_for(&name, |r| op(r, op::UNLOCK).0 >= 1);
        let held = r.stats.op(op::UNLOCK).unwrap().latency().unwrap().max();
        let held_ns = crate::clock::calibration().ticks_to_ns(held);
        assert!(held_ns >= 4_500_000, "held {held_ns} ns");
        assert_eq!(r.stats.op(op::UNLOCK).unwrap().misses(), 0);
        let _ = Observation::FLAG_MISS;
    }
}
