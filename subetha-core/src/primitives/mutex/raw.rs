//! [`RawMutex`]: the lock protocol on the lock [`word`] and
//! `parking_lot_core`'s parking lot, with its observations.

use super::protocol::{self, ParkingLot, Unparked};
use super::word::*;
use super::*;

/// How a hold began: what its release pushes as the acquisition.
#[derive(Clone, Copy)]
pub(super) enum Acquired {
    /// An uncontended `try_lock` (or timed variant).
    TryLock,
    /// A `lock` (or timed `try_lock`, [`op::TRY_LOCK`]) that waited this
    /// many ticks; `sites` is its [`SiteWord`].
    Waited { op: u16, ticks: u64, sites: u32 },
}

/// What the slow path did.
pub(super) struct Slow {
    /// Whether the lock was taken (false: the deadline passed).
    pub(super) acquired: bool,
    /// Whether this thread slept in a park (not just tried: a park
    /// whose validation failed returns at once).
    pub(super) parked: bool,
    /// Tick at which the wait ended.
    pub(super) at: u64,
    /// Ticks from the last wake-up's call (by the releasing thread) to this
    /// thread running again; 0 if not measured (not adaptive, never woken).
    pub(super) woken_after: u64,
}

/// How the slow path waits before parking.
#[derive(Clone, Copy)]
pub(super) enum Spin {
    /// `parking_lot`'s: a few exponential rounds, only while nobody is
    /// parked.
    ParkingLot,
    /// The same for a wait nobody measures (an unobserved mutex's): no
    /// clock readings.
    Untimed,
    /// Poll until this tick (the adaptive budget), parked threads or not.
    Until(u64),
}

/// The raw lock behind [`Mutex`] and [`AdaptiveMutex`](crate::primitives::AdaptiveMutex):
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
/// | 0–15 | `sampler`, `registration`, `adaptive` | nearly nobody (a policy change) |
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
    pub(super) sampler: Sampler,
    pub(super) registration: Registration,
    /// Spin before parking with the budget from the policy word.
    pub(super) adaptive: bool,
    /// Ticks when a sampled hold began (valid with [`PENDING_SAMPLED`]).
    /// Only touched by the lock holder.
    pub(super) hold_start: Cell<u64>,
    /// The upper 32 bits of a wait of 2^32 ticks or more (valid with
    /// [`PENDING_LONG_WAIT`]). Only touched by the lock holder.
    pub(super) wait_high: Cell<u32>,
    /// This hold's [`SiteWord`]: its acquisition's call site and, after a
    /// wait, the site of the hold that ended it (valid with
    /// [`PENDING_SITE`]; see [`crate::primitives::holder`]). Only touched by the lock
    /// holder.
    pub(super) sites: Cell<u32>,
    /// A waited-for acquisition's wait in ticks, when under 2^32. Only
    /// touched by the lock holder.
    pub(super) wait: Cell<u32>,
    /// What the release pushes: a `PENDING_*` kind plus flags. Only
    /// touched by the lock holder.
    pub(super) pending: Cell<u8>,
    /// Threads between announcing a park (PARKED_BIT) and returning from
    /// it, modulo 256: what a plain `lock` reads to learn that threads are
    /// parked (see [`acquired_plain`](Self::acquired_plain)).
    pub(super) parkers: AtomicU8,
    /// The lock word: [`LOCKED_BIT`], [`PARKED_BIT`] and the count
    /// ([`COUNT_SHIFT`]).
    pub(super) state: AtomicU16,
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
pub(super) const PENDING_NOTHING: u8 = 0;
/// `pending` kind: an acquisition that is neither pushed nor counted at its
/// release (the quiet `try_lock` of `Debug`; a plain `lock` whose hold was
/// bumped, counted at the bump).
pub(super) const PENDING_QUIET: u8 = 5;
/// `pending` kind: an uncontended `try_lock`.
pub(super) const PENDING_TRY_LOCK: u8 = 2;
/// `pending` kind: a `lock` that waited (`wait` or `long_wait` ticks).
pub(super) const PENDING_WAITED_LOCK: u8 = 3;
/// `pending` kind: a timed `try_lock` that waited, then got the lock.
pub(super) const PENDING_WAITED_TRY_LOCK: u8 = 4;
/// The kind bits of `pending`.
pub(super) const PENDING_KIND: u8 = 0b111;
/// `pending` flag: this hold is sampled; it began at `hold_start`.
pub(super) const PENDING_SAMPLED: u8 = 0b1000;
/// `pending` flag: the wait's upper bits are in `wait_high`.
pub(super) const PENDING_LONG_WAIT: u8 = 0b1_0000;
/// `pending` flag: `sites` holds this hold's call sites; its release
/// stamps them for the next waiter ([`crate::primitives::holder`]).
pub(super) const PENDING_SITE: u8 = 0b10_0000;
/// `pending` flag: threads were parked when this uncontended `lock` took
/// the lock, so its release is `parking_lot`'s (see
/// [`RawMutex::release`]), not the bare atomic add.
pub(super) const PENDING_PARKED: u8 = 0b100_0000;

/// Uncontended `lock`s per draw of the hold sampler (see [`DRAWS`]).
pub(super) const HOLD_SAMPLE_EVERY: u32 = COUNT_BATCH;

/// This thread's draw of the mutexes' hold sampler ([`HoldDraw`]).
///
/// Hold sampling is decided *before* the `lock bts`, so a sampled hold's
/// first clock reading is taken before the lock is, and nothing is
/// added to the hold but two stores. Nothing of the lock can decide it
/// then (its count is only known once the lock is taken, and reading
/// its line before the `lock bts` slows a hammered lock), and a
/// per-thread countdown costs every `lock` a store, which a hammered lock
/// pays for in throughput (the `contended` group's `…/hammer` rows). So
/// the draws are scheduled by the locks' counts: a thread whose release
/// ends a batch of [`HOLD_SAMPLE_EVERY`] uncontended `lock`s of a mutex (any
/// mutex) owes a draw with weight [`HOLD_SAMPLE_EVERY`], and its next
/// `lock`, of whichever mutex, pays it. A `lock` of an unmeasured mutex
/// pays no draw.
pub(super) const DRAWS: HoldDraw = HoldDraw::MUTEX;

/// Reports the uncontended `lock`s no count covers yet, before the registration
/// (dropped after this) unregisters the instance.
impl Drop for RawMutex {
    fn drop(&mut self) {
        let rest = LockCount::of_word(*self.state.get_mut()).uncounted();
        if rest != 0 {
            self.registration.emit(op::LOCK, COUNT, u64::from(rest));
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
            .field("instance_id", &self.registration.id())
            .field("adaptive", &self.adaptive)
            .field("locked", &self.is_locked_raw())
            .finish()
    }
}

impl RawMutex {
    pub(super) const fn unobserved(adaptive: bool) -> Self {
        Self::with_probe(Registration::NONE, adaptive)
    }

    pub(super) const fn with_probe(registration: Registration, adaptive: bool) -> Self {
        Self {
            sampler: Sampler::new(),
            registration,
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
    pub(super) fn unmeasured(&self) -> bool {
        self.registration.id().is_none() && !self.adaptive
    }

    /// A raw mutex registered as an instance of `kind`.
    pub(crate) fn register(
        kind: InstanceKind,
        name: Option<&str>,
        site: &'static Location<'static>,
        adaptive: bool,
    ) -> Self {
        let raw = Self::with_probe(Registration::register(kind, name, site), adaptive);
        raw.refresh_policy();
        raw
    }

    /// The instance id, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.registration.id()
    }

    /// Re-reads the policy word now and returns it. Done every
    /// [`REFRESH_EVERY`](crate::primitives::REFRESH_EVERY) uncontended `lock`s (after
    /// the release), on contended ones at most every
    /// [`SLOW_PATH_REFRESH_NS`](crate::primitives::SLOW_PATH_REFRESH_NS), and every
    /// `REFRESH_EVERY` of a thread's other operations on the lock.
    pub fn refresh_policy(&self) -> PolicyWord {
        let word = self.registration.policy_word();
        self.sampler.apply(word);
        word
    }

    pub(super) fn is_locked_raw(&self) -> bool {
        self.state.load(Ordering::Relaxed) & LOCKED_BIT != 0
    }

    /// The uncontended acquisition: one atomic bit-test-and-set (`lock
    /// bts`), whatever the count; it fails only if the lock is held.
    /// (`parking_lot` also fails while threads are parked, then takes the
    /// free lock in its slow path: the same outcome.)
    #[inline(always)]
    pub(super) fn lock_fast(&self) -> bool {
        protocol::lock_fast(&self.state)
    }

    /// Takes the lock if it is free, parked threads or not.
    #[inline]
    pub(super) fn try_lock_raw(&self) -> bool {
        protocol::try_lock(&self.state)
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
    pub(super) unsafe fn unlock_raw(&self, fair: bool, count: u16) -> u16 {
        protocol::unlock(&ParkingLot, self.key(), &self.state, fair, count, |r, h| {
            self.wake_token(r, h)
        })
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
    pub(super) unsafe fn add_release(&self, count: u16) -> u16 {
        protocol::release(&ParkingLot, self.key(), &self.state, count, |r, h| {
            self.wake_token(r, h)
        })
    }

    /// The lock word's count (for tests: only meaningful while the lock is
    /// free and nobody takes it).
    #[cfg(test)]
    pub(super) fn count(&self) -> LockCount {
        LockCount::of_word(self.state.load(Ordering::Relaxed))
    }

    /// The unpark token of a wake-up: [`TOKEN_HANDOFF_BIT`] if `handoff`,
    /// and for an adaptive lock that wakes a thread the clock now, so the
    /// woken thread can measure its wake-up ([`op::PARK`]'s latency, the
    /// park cost its policy weighs). Read in `parking_lot_core`'s
    /// callback, under the queue lock, just before the wake-up call.
    pub(super) fn wake_token(&self, result: &Unparked, handoff: bool) -> usize {
        let sent = if self.adaptive && result.unparked {
            // Never 0 (0 = no reading): a tick count of exactly 0 reads 1.
            ((clock::ticks() as usize & TOKEN_TICKS_MASK).max(1)) << 1
        } else {
            0
        };
        sent | if handoff { TOKEN_HANDOFF_BIT } else { 0 }
    }

    /// The lock's key in the parking lot: its address, which only it parks
    /// and unparks on.
    #[inline(always)]
    pub(super) fn key(&self) -> usize {
        self as *const Self as usize
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
    pub(super) fn acquired_plain(&self, site: &'static Location<'static>) {
        if self.parkers.load(Ordering::Relaxed) != 0 {
            self.release_slowly(site);
        }
    }

    /// Bookkeeping right after any other acquisition: leaves its
    /// observation for the release to push, and every so often samples
    /// the hold or re-reads the policy word. `now` is a tick reading taken
    /// at acquisition, or 0.
    #[inline(always)]
    pub(super) fn acquired(&self, how: Acquired, now: u64) {
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
    /// hold, which its release stamps ([`crate::primitives::holder`]).
    #[cold]
    #[inline(never)]
    pub(super) fn release_slowly(&self, site: &'static Location<'static>) {
        let mut pending = self.pending.get() | PENDING_PARKED;
        if pending & PENDING_SITE == 0 {
            self.sites.set(SiteWord::own(self.registration.site_id(site)).0);
            pending |= PENDING_SITE;
        }
        self.pending.set(pending);
    }

    /// The sampling of an acquisition reported on its own (a `try_lock` or
    /// a wait), which the lock's count leaves out: by the thread's
    /// operation count instead.
    #[inline(always)]
    pub(super) fn sample_reported(&self, now: u64) {
        let n = crate::primitives::sampling::next_thread_op();
        if n & self.sampler.check_mask() == 0 {
            self.sample_or_refresh(n, now);
        }
    }

    /// Samples the hold and re-reads the policy word when operation `n` is
    /// due for either.
    #[cold]
    #[inline(never)]
    pub(super) fn sample_or_refresh(&self, n: u32, now: u64) {
        let start = self.sampler.bookkeeping(&self.registration, n, now);
        if start != 0 {
            self.hold_start.set(start);
            self.pending.set(self.pending.get() | PENDING_SAMPLED);
        }
    }

    /// Stores a wait and its [`SiteWord`] for the release; returns its
    /// `pending` value.
    #[inline(always)]
    pub(super) fn record_wait(&self, op: u16, ticks: u64, sites: u32) -> u8 {
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
    /// [`crate::primitives::holder`]). Read while holding the lock.
    #[inline]
    pub(super) fn waited_sites(&self, site: u16) -> u32 {
        let holder = match self.registration.id() {
            Some(id) => holder::holder(id, self.state.load(Ordering::Relaxed) & COUNT_BITS),
            None => 0,
        };
        SiteWord::with_holder(site, holder).0
    }

    /// Leaves this hold's site for the next waiter, just before a release
    /// that leaves the lock word's count at `count_after`.
    #[inline]
    pub(super) fn stamp_holder(&self, site: u16, count_after: u16) {
        if let Some(id) = self.registration.id() {
            holder::stamp(id, site, count_after);
        }
    }

    /// The lock word's count bits after a release that adds `count`.
    #[inline]
    pub(super) fn count_after(&self, count: u16) -> u16 {
        (self.state.load(Ordering::Relaxed) & COUNT_BITS).wrapping_add(count) & COUNT_BITS
    }

    /// The `lock` that pays the draw this thread owes (see [`DRAWS`]):
    /// draws with weight `weight`, then takes the lock, sampled or not. A
    /// sampled hold begins at a reading taken before the `lock bts`, or at
    /// the end of the wait.
    #[cold]
    #[inline(never)]
    pub(super) fn lock_drawing_a_sample(&self, weight: u32, site: &'static Location<'static>) {
        if self.unmeasured() {
            // Nothing to sample; a draw a measured mutex's count left
            // stays for the next measured `lock`, for a while.
            DRAWS.pass_by(weight);
            if self.lock_fast() {
                self.acquired_plain(site);
            } else {
                self.lock_contended(false, site);
            }
            return;
        }
        let sampled = DRAWS.pay(weight, self.sampler.mask(), HOLD_SAMPLE_EVERY);
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
        let site_id = self.registration.site_id(site);
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
    pub(super) fn lock_contended(&self, sampled: bool, site: &'static Location<'static>) {
        if self.unmeasured() {
            self.lock_slow(0, Spin::Untimed, None);
            return;
        }
        let sampled = sampled
            || self
                .sampler
                .wants_sample(crate::primitives::sampling::next_thread_op());
        // Interned before the wait, so it is not part of the measured wait.
        let site_id = self.registration.site_id(site);
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
            self.registration.emit_at(op::PARK, CONTENDED, woken_after, site);
        }
    }

    /// The contended timed `try_lock`: waits until `deadline`, records the
    /// wait (C, and M when it timed out).
    #[cold]
    #[inline(never)]
    pub(super) fn try_lock_timed(&self, deadline: Option<Instant>, site: &'static Location<'static>) -> bool {
        if self.unmeasured() {
            return self.lock_slow(0, Spin::Untimed, deadline).acquired;
        }
        let site_id = self.registration.site_id(site);
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
            self.registration.emitter().emit_sites(
                op::TRY_LOCK,
                CONTENDED | MISS,
                waited,
                SiteWord::own(site_id),
            );
        }
        acquired
    }

    /// Re-reads the policy word if a slow path has not for a while, and
    /// picks the spin.
    pub(super) fn spin_policy(&self, start: u64) -> Spin {
        let word = if self.sampler.slow_path_due(start) {
            self.refresh_policy()
        } else {
            self.sampler.word()
        };
        if self.adaptive && !word.spin_yields() {
            Spin::Until(crate::primitives::spin::spin_deadline(start, word))
        } else {
            Spin::ParkingLot
        }
    }

    /// `parking_lot`'s lock slow path ([`protocol::lock_slow`]) with this
    /// lock's choice of spin and its clock readings ([`Waiting`]). `start`
    /// is a tick reading taken just before the call.
    pub(super) fn lock_slow(&self, start: u64, spin: Spin, deadline: Option<Instant>) -> Slow {
        let mut wait = Waiting {
            timed: !matches!(spin, Spin::Untimed),
            spin,
            spinwait: SpinWait::new(),
            parked: false,
            woken_after: 0,
            at: start,
        };
        let acquired = protocol::lock_slow(
            &ParkingLot,
            self.key(),
            &self.state,
            &self.parkers,
            deadline,
            &mut wait,
        );
        Slow {
            acquired,
            parked: wait.parked,
            at: wait.at,
            woken_after: wait.woken_after,
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
    pub(super) fn unlock_slow(&self, force_fair: bool, count: u16) -> u16 {
        protocol::unlock_slow(&ParkingLot, self.key(), &self.state, force_fair, count, |r, h| {
            self.wake_token(r, h)
        })
    }

    /// After a release that counted one uncontended `lock`: from the word
    /// the release replaced, ends a count or re-reads the policy word when
    /// due. Reads nothing of the lock but the word's old value (in a
    /// register) unless one is due.
    #[inline(always)]
    pub(super) fn counted(&self, replaced: u16) {
        let count = LockCount::of_word(replaced);
        if count.may_be_due() {
            self.count_or_refresh(count);
        }
    }

    /// [`counted`](Self::counted)'s rare part, run after the release: only
    /// the registration (never written after construction; `&self` keeps the
    /// mutex alive for the call) and the atomics of the policy cache.
    #[cold]
    #[inline(never)]
    pub(super) fn count_or_refresh(&self, count: LockCount) {
        if let Some(covers) = count.due() {
            self.registration.emit(op::LOCK, COUNT, u64::from(covers));
        }
        if count.ends_a_batch() && !self.unmeasured() {
            DRAWS.owe_batch(HOLD_SAMPLE_EVERY);
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
    pub(super) unsafe fn release(&self, fair: bool) {
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
    pub(super) fn adaptive_hold_end(&self) -> u64 {
        if self.adaptive { clock::ticks() } else { 0 }
    }

    /// Pushes a sampled hold that began at `start` and ended at `ended`
    /// (0: now, after its release).
    #[cold]
    #[inline(never)]
    pub(super) fn emit_hold(&self, start: u64, ended: u64) {
        self.registration.emit(op::UNLOCK, 0, hold_ticks(start, ended));
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
    pub(super) unsafe fn release_recorded(&self, pending: u8, fair: bool) {
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
        let emitter = self.registration.emitter();
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
            emitter.emit(op::UNLOCK, 0, hold_ticks(start, ended));
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
        let draw = DRAWS.owed();
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
            self.registration.emit_at(op::TRY_LOCK, MISS, 0, site);
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
    pub(super) fn try_lock_quiet(&self) -> bool {
        let acquired = self.try_lock_raw();
        if acquired {
            self.pending.set(PENDING_QUIET);
        }
        acquired
    }
}

/// A waiting `lock`'s spin policy and clock readings, for
/// [`protocol::lock_slow`]. The wait's end (`at`) is read just before each
/// load of the lock word, not after a load finds the lock free: between that
/// load and the compare-and-swap that takes the lock nothing else runs, so
/// the clock read neither delays the hand-over nor lands in the critical
/// section. A compare-and-swap that loses a race keeps the reading of the
/// load before it, so a wait can read short by that one attempt.
pub(super) struct Waiting {
    /// Whether the wait reads the clock at all.
    timed: bool,
    spin: Spin,
    spinwait: SpinWait,
    /// Whether the thread parked.
    parked: bool,
    /// The last wake-up's latency, from the token's clock reading.
    woken_after: u64,
    /// The last clock reading.
    at: u64,
}

impl Waiting {
    fn tick(&self) -> u64 {
        if self.timed { clock::ticks() } else { 0 }
    }
}

impl protocol::Wait for Waiting {
    fn spin(&mut self, state: u16) -> bool {
        match self.spin {
            Spin::ParkingLot | Spin::Untimed => {
                state & PARKED_BIT == 0 && self.spinwait.spin() && {
                    self.at = self.tick();
                    true
                }
            }
            Spin::Until(until) => {
                for _ in 0..PAUSES_PER_POLL {
                    hint::spin_loop();
                }
                // One reading for both the budget and the wait's end.
                self.at = clock::ticks();
                self.at < until
            }
        }
    }

    fn parked(&mut self, how: protocol::Parked) {
        self.at = self.tick();
        match how {
            protocol::Parked::Woken(token) => {
                self.parked = true;
                if let Some(ticks) = wake_ticks(token, self.at) {
                    self.woken_after = ticks;
                }
            }
            protocol::Parked::TimedOut => self.parked = true,
            protocol::Parked::Invalid => {}
        }
        self.spinwait.reset();
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
