//! [`RwLock`]: `parking_lot::RwLock` with observations.
//!
//! Its cost against `parking_lot::RwLock` is what the `rwlock` group of
//! `benches/primitives.rs` shows.
//!
//! Kind code 2 (`rwlock`). Ops: `read` (1), `try_read` (2), `write` (3),
//! `try_write` (4), `read_unlock` (5, sampled read hold), `write_unlock` (6,
//! sampled write hold), `upgrade` (7). See the [table](super#op-kinds).
//!
//! Built on [`lock_api`] with [`RawRwLock`] over [`parking_lot::RawRwLock`],
//! so recursive reads, upgradable reads, `upgrade`/`downgrade`, the fair
//! unlocks, the timed variants and guard mapping all work. Upgradable and
//! recursive reads count as `read`/`try_read`; an upgradable hold itself is
//! not sampled, a write hold reached through `upgrade` is.
//!
//! Uncontended `read`s and `write`s are counted, not pushed one by one
//! (see [`op_counts`](super::op_counts)): a count at the 1st, 2nd, 4th …
//! 64th, then every 64th, per thread stripe, and the rest when the lock is
//! dropped. Waits, `try_*`s and sampled holds are pushed one by one. (A push
//! per operation would have the sidecar drain an observation per operation,
//! CPU time it takes from the lock's threads on a small host: the `rwlock`
//! group's `…/mixed/{2,4}` rows of `benches/primitives.rs`.)
//!
//! Nothing is counted or pushed inside a read or write hold (a wait's end
//! is read off the clock in it, as the acquisition returns): an
//! uncontended one is counted after its release, one that waited, like a
//! `try_read`, a `try_write` or an upgrade, is pushed after it.
//! (Upgradable reads are pushed as they acquire.) A hold whose release
//! reports more than a count leaves a record in a per-thread table keyed
//! by the lock's address, one table for reads and one for writes, beside
//! a count of them, so the release of a hold that needs no record looks
//! at nothing but that thread-local count. Apart from the bias's changes
//! and a policy refresh at most once a millisecond, no acquisition or
//! release writes to the lock outside `parking_lot`'s word (see
//! [`RawRwLock`]). (Guards are not `Send`, as in `parking_lot`, so a hold
//! ends on the thread that began it. A guard leaked with `mem::forget`
//! leaves its record behind; a later lock at the same address would
//! report it once. A write lock released by another thread through
//! `force_unlock_write` is counted there as a plain `write`; a record it
//! had stays with the thread that took it, as a leaked guard's does.)
//! A read's release counts on the lock the thread last took shared,
//! remembered in a thread-local at the acquisition, not by reading the
//! lock again once it is let go: that read would pull the lock's cache
//! line back from the thread taking it next.
//!
//! Hold sampling is decided before the acquisition, as the
//! [`Mutex`](super::Mutex)'s is: a count that covers `k` uncontended
//! operations leaves its thread a draw of weight `k` (`RW_HOLD_DRAW`), and
//! the thread's next acquisition of an observed `RwLock` pays it (up to
//! 64 acquisitions of unobserved locks in between leave it be): sampled
//! with probability `k` / the lock's level, its clock read before the
//! atomic operation. So holds are sampled at the lock's level in
//! expectation, at random, the common acquisition reads one thread-local
//! and stores none, and nothing is decided inside the hold. A sampled hold
//! runs from that reading (or the end of its wait) to just after the
//! release. Levels finer than 1 in 64 are exact for a thread that keeps
//! taking the lock, lower (down to 1 in 64) for one that takes other
//! observed locks in between.
//! Acquisitions reported one by one (`try_*`, timed, waited, upgrades)
//! are not counted, so they bring no draws: they are sampled by the
//! thread's operation number as well, out of line, and re-read the policy
//! word every 1,024 of them, so a lock only ever taken that way still
//! follows its level.
//!
//! An observed lock is *reader-biased* most of the time (BRAVO; the
//! crate's private `reader_bias` module has the protocol): a `read` then
//! stores the lock's name into its thread's own reader slot instead of
//! adding to `parking_lot`'s lock word, so readers on different cores share no cache line, and a
//! writer, once it holds the word, clears the bias and waits for the
//! readers in slots to leave. A writer that had to wait for them reports
//! a contended `write` (or `upgrade`) with that wait; a `try_write` that
//! finds one misses. After a revocation the lock reads through its word
//! for a while, longer the sooner the bias was revoked again, so a lock
//! written often behaves like `parking_lot`'s. (The `rwlock` group's
//! `…/read/{2,4}` rows show what the bias gives readers, its `…/mixed` rows
//! what a lock also written keeps.) A thread holds at most one lock through
//! its slot (further holds of that lock count there, so a recursive read never
//! waits for a writer that waits for it); its holds of other locks go through
//! their words as before.
//!
//! An unobserved lock ([`RwLock::unobserved`], the raw `INIT`) is never
//! biased and reads no clock even when it waits; its blocking `read` and
//! `write` are `parking_lot`'s own.

use std::cell::Cell;
use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_api::{
    GuardNoSend, RawRwLock as _, RawRwLockFair as _, RawRwLockRecursive as _, RawRwLockTimed as _,
    RawRwLockUpgrade as _, RawRwLockUpgradeDowngrade as _, RawRwLockUpgradeTimed as _,
};

use super::held::{HoldRecord, Records, hold_records};
use super::op_counts::{BATCH, OpCounts};
use super::reader_bias::{self, BiasPolicy, RevokeWait};
use super::{
    CONTENDED, COUNT, MISS, PolicyWord, Probe, Sampler, draw_paid, next_hold_random, next_thread_op, since,
    unobserved_lock_drops_draw,
};
use crate::clock;
use crate::registry::InstanceKind;
use crate::site::SiteWord;

/// The kind [`RwLock`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 2,
    name: "rwlock",
    ops: &[
        "read",
        "try_read",
        "write",
        "try_write",
        "read_unlock",
        "write_unlock",
        "upgrade",
    ],
};

/// Op kinds of [`RwLock`].
pub mod op {
    /// Blocking shared acquisition (also recursive and upgradable).
    pub const READ: u16 = 1;
    /// Non-blocking or timed shared acquisition.
    pub const TRY_READ: u16 = 2;
    /// Blocking exclusive acquisition.
    pub const WRITE: u16 = 3;
    /// Non-blocking or timed exclusive acquisition.
    pub const TRY_WRITE: u16 = 4;
    /// A sampled shared release; latency = hold time.
    pub const READ_UNLOCK: u16 = 5;
    /// A sampled exclusive release (or downgrade); latency = hold time.
    pub const WRITE_UNLOCK: u16 = 6;
    /// Upgradable → exclusive.
    pub const UPGRADE: u16 = 7;
}

/// A hold whose release reports more than a count, left on the holding
/// thread by its acquisition; the release, once the lock is let go,
/// reports it (pushing it while the lock is held would lengthen the hold).
/// A shared one: a `read` that waited, a `try_read`, a sampled hold, or
/// the shared end of a downgrade. An exclusive one: a `write` that
/// waited, a `try_write`, an upgrade, or a sampled hold.
///
/// Exclusive holds keep theirs here too, not in the lock: every reader
/// loads the lock's bookkeeping, and a store there by a writer takes that
/// line from all of them. (Kept in the lock, the writer's store would make the
/// lock's speed depend on whether its bookkeeping shares a line with the word;
/// kept here, it does not: the `rwlock` group's `…/mixed-jitter/4` rows.)
#[derive(Clone, Copy, Debug)]
struct HoldReport {
    /// The lock's address.
    lock: usize,
    /// The acquisition the release reports: 0 = none (the hold was not
    /// acquired by a `read` or `write`: the shared end of a downgrade);
    /// the side's [`PLAIN`](Side::PLAIN) op with `flags` 0 = an
    /// uncontended acquisition (of a sampled hold), counted; anything else
    /// is pushed.
    op: u16,
    flags: u16,
    latency: u64,
    /// Ticks when a sampled hold began; 0 = not sampled.
    hold_start: u64,
    /// The acquisition's [`SiteWord`] (a wait's call site), pushed with it.
    sites: u32,
}

impl HoldRecord for HoldReport {
    fn lock(&self) -> usize {
        self.lock
    }
}

hold_records! {
    /// This thread's outstanding [`HoldReport`]s of shared holds (see
    /// [`held`](super::held)).
    struct Reads: HoldReport;
}

hold_records! {
    /// This thread's outstanding [`HoldReport`]s of exclusive holds.
    struct Writes: HoldReport;
}

/// A kind of hold and its table of reports.
trait Side: Records<Record = HoldReport> {
    /// The op an uncontended acquisition is counted as.
    const PLAIN: u16;
    /// The op a sampled hold is pushed as.
    const UNLOCK: u16;
}

impl Side for Reads {
    const PLAIN: u16 = op::READ;
    const UNLOCK: u16 = op::READ_UNLOCK;
}

impl Side for Writes {
    const PLAIN: u16 = op::WRITE;
    const UNLOCK: u16 = op::WRITE_UNLOCK;
}

thread_local! {
    /// The lock this thread last took shared, and its counts (null when
    /// unobserved): what a read unlock counts on. Read from the lock
    /// itself just after the release, the pointer would pull the lock's
    /// line back from the thread taking the lock next.
    static LAST_READ: Cell<(usize, *const OpCounts<2>)> = const { Cell::new((0, std::ptr::null())) };
    /// A draw of the hold sampler this thread owes its next acquisition
    /// of an observed `RwLock`, as its weight (0: none; see the module
    /// docs), or [`FIRST_DRAW`].
    static RW_HOLD_DRAW: Cell<u64> = const { Cell::new(FIRST_DRAW) };
    /// The [`SiteWord`] of the wait being recorded, set by the slow paths
    /// around their `acquired_*` call for [`RawRwLock::record`] to take
    /// (so the fast paths' reports need no site argument).
    static WAIT_SITES: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` (an `acquired_*` of a wait) with `sites` left for `record`.
#[inline]
fn with_wait_sites(sites: u32, f: impl FnOnce()) {
    WAIT_SITES.set(sites);
    f();
    WAIT_SITES.set(0);
}

/// `RW_HOLD_DRAW` of a thread that has taken no observed `RwLock` yet: its
/// first acquisition of one draws with weight 1. An unobserved lock that
/// finds it clears it, so a thread that takes only unobserved locks reads
/// one thread-local and no more; a draw that counts left, it leaves for a
/// while (see [`unobserved_lock_drops_draw`]).
const FIRST_DRAW: u64 = u64::MAX;

/// Decided before an acquisition's atomic operation: whether its hold is
/// sampled, and if so a clock reading the hold can start from.
#[derive(Clone, Copy)]
struct Ticket {
    /// Ticks just before the acquisition of a sampled hold; 0 = not
    /// sampled.
    start: u64,
    /// The draw found the lock unbiased: a shared acquisition through the
    /// lock word may bias it again (see [`reader_bias`]).
    rebias: bool,
}

impl Ticket {
    /// The ticket of an acquisition reported on its own (a `try_*`, a
    /// timed one, an upgrade): it pays no draw, and its hold is sampled
    /// by [`RawRwLock::sample_reported`]. Also the ticket of an
    /// acquisition with no draw due.
    const REPORTED: Ticket = Ticket {
        start: 0,
        rebias: false,
    };

    /// The start of the hold this ticket began if it is sampled (the end
    /// of its wait, `now`, when it waited), else 0.
    #[inline(always)]
    fn hold_start(self, now: u64) -> u64 {
        match (self.start, now) {
            (0, _) => 0,
            (start, 0) => start,
            (_, now) => now,
        }
    }
}

/// What only an observed lock needs, out of line: the counts of
/// uncontended operations, and the reader bias's policy.
struct Observed {
    /// Uncontended [`op::READ`]s (index 0) and [`op::WRITE`]s (1).
    counts: OpCounts<2>,
    /// When the reader bias may be set again.
    bias_policy: BiasPolicy,
}

/// The raw lock behind [`RwLock`]: a [`parking_lot::RawRwLock`] plus the
/// bookkeeping of one instance.
///
/// `repr(C)`, 40 bytes, with `parking_lot`'s lock word last: `lock_api`
/// puts the data right after the raw lock, and the allocator promises
/// only 16-byte alignment, so the word and the first 8 bytes of the data
/// share the one 16-byte chunk that is always in a single cache line, as
/// they do in `parking_lot::RwLock` (see [`RawMutex`](super::RawMutex)
/// for the same reasoning). (With the word first, 48 bytes, a `u64` behind an
/// `Arc` would sit on the next line, one more line moved per hand-over: the
/// `rwlock` group's `unobserved/mixed/2` row.)
///
/// | bytes | fields | read | written |
/// |---|---|---|---|
/// | 0–15 | `sampler`, `probe`, `bias` | `bias`: every operation; the rest every 64th and slow paths | the bias's changes; a policy refresh, at most once a millisecond |
/// | 16–31 | `observed` | every operation | never |
/// | 32–39 (+ data) | `parking_lot`'s word | every operation | every operation |
///
/// Otherwise no operation writes outside the word: what a write hold's release
/// reports waits on the holder's thread (`HoldReport`). (Where `bias` sits in
/// the first chunk moves the uncontended biased `read`, the `rwlock` group's
/// `subetha/read/1` row, with the same code and one load moved, for a reason
/// not yet found; it sits where that row is fastest.)
#[repr(C)]
pub struct RawRwLock {
    sampler: Sampler,
    probe: Probe,
    /// Set: reads may take the lock through their thread's reader slot,
    /// without touching the lock word (see [`reader_bias`]). Only ever
    /// set on an observed lock, by a reader holding the word shared.
    bias: AtomicBool,
    /// Unused: keeps the word in the chunk the data starts in (see the
    /// table).
    _spare: [u8; 8],
    /// `None` when unobserved. Boxed: the count stripes take 512 bytes,
    /// and a lock nobody observes should stay the size of `parking_lot`'s
    /// plus a few words.
    observed: Option<Box<Observed>>,
    inner: parking_lot::RawRwLock,
}

/// How long a writer that holds the word waits for biased readers to
/// leave.
#[derive(Clone, Copy)]
enum Revocation {
    /// Not at all (a `try_*`).
    Now,
    /// As long as it takes.
    Wait,
    /// Until then.
    Until(Instant),
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<RawRwLock>() == 40);
    // The lock word in the last 16-byte chunk, which data aligned to 8
    // bytes or less starts in.
    assert!(offset_of!(RawRwLock, inner) / 16 == size_of::<RawRwLock>() / 16);
};

/// Reports the uncontended `read`s and `write`s no count covers yet,
/// before the probe (dropped after this) unregisters the instance.
impl Drop for RawRwLock {
    fn drop(&mut self) {
        let Some(observed) = self.observed.as_mut() else {
            return;
        };
        reader_bias::forget_lock(std::ptr::from_ref(&observed.counts).addr());
        let [read, write] = observed.counts.take_uncounted();
        for (op, rest) in [(op::READ, read), (op::WRITE, write)] {
            if rest != 0 {
                self.probe.emit(op, COUNT, rest);
            }
        }
    }
}

impl fmt::Debug for RawRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawRwLock")
            .field("instance_id", &self.probe.id())
            .field("locked", &self.inner.is_locked())
            .finish()
    }
}

impl RawRwLock {
    const fn unobserved() -> Self {
        Self {
            inner: <parking_lot::RawRwLock as lock_api::RawRwLock>::INIT,
            _spare: [0; 8],
            bias: AtomicBool::new(false),
            sampler: Sampler::new(),
            probe: Probe::NONE,
            observed: None,
        }
    }

    fn register(name: Option<&str>, site: &'static Location<'static>) -> Self {
        let probe = Probe::register(KIND, name, site);
        // A lock the instance table had no room for stays unobserved.
        let observed = probe.id().map(|_| {
            Box::new(Observed {
                counts: OpCounts::new(),
                bias_policy: BiasPolicy::new(),
            })
        });
        let mut raw = Self::unobserved();
        raw.probe = probe;
        raw.observed = observed;
        raw.refresh_policy();
        raw
    }

    /// The instance id, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.probe.id()
    }

    /// Re-reads the policy word now and returns it.
    pub fn refresh_policy(&self) -> PolicyWord {
        let word = self.probe.policy_word();
        self.sampler.apply(word);
        word
    }

    fn addr(&self) -> usize {
        self as *const Self as usize
    }

    /// The lock's counts, read while it is held, for after its release.
    #[inline(always)]
    fn counts(&self) -> Option<&OpCounts<2>> {
        self.observed.as_deref().map(|observed| &observed.counts)
    }

    /// Takes a [`Ticket`] for the acquisition about to be tried: one
    /// thread-local read, and out of line the draw this thread owes.
    #[inline(always)]
    fn ticket(&self) -> Ticket {
        let weight = RW_HOLD_DRAW.with(Cell::get);
        if weight != 0 {
            self.drawn_ticket(weight)
        } else {
            Ticket::REPORTED
        }
    }

    /// [`ticket`](Self::ticket) of the acquisition that pays this thread's
    /// draw: sampled with probability `weight` / the lock's level (certain
    /// once the weight covers it), its clock read now, before the lock is
    /// taken. A lock sampled finer than a count's batch leaves the next
    /// acquisition a draw of weight 1.
    /// An unobserved lock pays no draw (see
    /// [`unobserved_lock_drops_draw`]).
    #[cold]
    #[inline(never)]
    fn drawn_ticket(&self, weight: u64) -> Ticket {
        if self.observed.is_none() {
            if unobserved_lock_drops_draw(weight == FIRST_DRAW) {
                RW_HOLD_DRAW.with(|draw| draw.set(0));
            }
            return Ticket::REPORTED;
        }
        draw_paid();
        let weight = if weight == FIRST_DRAW { 1 } else { weight };
        let mask = self.sampler.mask();
        let fine = mask != Sampler::OFF && u64::from(mask) < BATCH - 1;
        RW_HOLD_DRAW.with(|draw| draw.set(u64::from(fine)));
        let sampled = mask != Sampler::OFF && u64::from(next_hold_random() & mask) < weight;
        Ticket {
            start: if sampled { clock::ticks().max(1) } else { 0 },
            rebias: !self.bias.load(Ordering::Relaxed),
        }
    }

    /// Counts an uncontended `read` or `write` (`op`), after its release.
    #[inline(always)]
    fn count(&self, counts: Option<&OpCounts<2>>, op: u16) {
        let counter = usize::from(op == op::WRITE);
        if let Some(counts) = counts
            && let Some(covered) = counts.add(counter)
        {
            self.emit_count(op, covered);
        }
    }

    /// Whether the hold of an acquisition reported on its own (a `try_*`,
    /// a timed or waited acquisition, an upgrade) is sampled, by the
    /// thread's operation number, as the [`Mutex`](super::Mutex) samples
    /// its `try_lock`s and waits: no count covers these, so no draw would
    /// come for a lock only ever taken that way. Also re-reads the policy
    /// word when due (such a lock has no counts to do it). Returns the
    /// hold's start (`now` if the acquisition read the clock, else the
    /// clock now) or 0.
    fn sample_reported(&self, now: u64) -> u64 {
        self.sampler.bookkeeping(&self.probe, next_thread_op(), now)
    }

    /// Pushes a count, out of line so the acquisition stays short; leaves
    /// this thread a draw of the hold sampler for the operations it covers
    /// and picks up a new policy word.
    #[cold]
    #[inline(never)]
    fn emit_count(&self, op: u16, covered: u64) {
        self.probe.emit(op, COUNT, covered);
        RW_HOLD_DRAW.with(|draw| {
            // (`FIRST_DRAW` only until the thread's first acquisition of an
            // observed lock, which comes before any count of one.)
            let owed = if draw.get() == FIRST_DRAW { 1 } else { draw.get() };
            draw.set(owed.saturating_add(covered).min(FIRST_DRAW - 1));
        });
        self.refresh_policy();
    }

    /// A shared hold has begun: leaves what its release reports (`op`
    /// with `flags` and `latency`, see [`HoldReport`]) on this thread,
    /// unless that is an unsampled, uncontended `read` (its release
    /// counts it). `now` is a clock reading at the acquisition, 0 if none.
    #[inline(always)]
    fn acquired_shared(&self, op: u16, flags: u16, latency: u64, ticket: Ticket, now: u64) {
        self.remember_shared_hold();
        self.leave_read_record(op, flags, latency, ticket, now);
    }

    /// [`acquired_shared`](Self::acquired_shared) after
    /// [`remember_shared_hold`](Self::remember_shared_hold).
    #[inline(always)]
    fn leave_read_record(&self, op: u16, flags: u16, latency: u64, ticket: Ticket, now: u64) {
        self.leave_report(Reads, op, flags, latency, ticket, now);
    }

    /// After an acquisition on `side`: leaves what its release reports,
    /// unless that is a count (an uncontended acquisition whose hold is not
    /// sampled). `now` is a clock reading at the acquisition, 0 if none.
    #[inline(always)]
    fn leave_report<S: Side>(&self, side: S, op: u16, flags: u16, latency: u64, ticket: Ticket, now: u64) {
        let hold_start = ticket.hold_start(now);
        if op != S::PLAIN || flags != 0 || hold_start != 0 {
            let report = HoldReport {
                lock: self.addr(),
                op,
                flags,
                latency,
                hold_start,
                sites: 0,
            };
            self.record(side, report, now);
        }
    }

    /// Leaves this lock in `LAST_READ` for the release of the shared hold
    /// about to be taken; returns its counts (null when unobserved).
    #[inline(always)]
    fn remember_shared_hold(&self) -> *const OpCounts<2> {
        let counts = self.counts_ptr();
        LAST_READ.with(|last| last.set((self.addr(), counts)));
        counts
    }

    /// [`counts`](Self::counts) as a pointer, null when unobserved. Its
    /// address is also the lock's name in reader slots: it stays put when
    /// the lock moves, and is freed only with the lock.
    #[inline(always)]
    fn counts_ptr(&self) -> *const OpCounts<2> {
        self.counts().map_or(std::ptr::null(), std::ptr::from_ref)
    }

    /// A shared acquisition through this thread's reader slot, tried while
    /// the lock is biased. `counts`: [`counts_ptr`](Self::counts_ptr).
    #[inline(always)]
    fn read_biased(&self, counts: *const OpCounts<2>) -> bool {
        self.bias.load(Ordering::Relaxed) && reader_bias::try_enter(counts.addr(), &self.bias)
    }

    /// [`read_biased`](Self::read_biased) for a recursive read: also a
    /// further hold of a lock this thread holds through its slot while a
    /// writer revokes the bias (through the word it would wait for that
    /// writer, which waits for this thread).
    #[inline(always)]
    fn read_biased_recursive(&self, counts: *const OpCounts<2>) -> bool {
        !counts.is_null() && (reader_bias::reenter(counts.addr()) || self.read_biased(counts))
    }

    /// After a shared acquisition through the lock word: biases the lock
    /// again if the ticket's draw found it unbiased and its policy allows.
    /// The caller holds the word shared, so no writer holds the lock.
    #[inline(always)]
    fn rebias_if_due(&self, ticket: Ticket) {
        if ticket.rebias {
            self.rebias();
        }
    }

    #[cold]
    #[inline(never)]
    fn rebias(&self) {
        let Some(observed) = &self.observed else {
            return;
        };
        let now = clock::ticks();
        if !self.bias.load(Ordering::Relaxed) && observed.bias_policy.may_enable(now) {
            observed.bias_policy.enabled(now);
            // Release: a reader that enters through its slot sees what
            // this one sees, the last writer's stores.
            self.bias.store(true, Ordering::Release);
        }
    }

    /// Clears the bias, if set, and waits for the readers inside as
    /// `deadline` allows. The caller holds the word exclusively. Returns
    /// how long it waited for readers (0: none were inside), or `Err` when
    /// the deadline passed with a reader still inside.
    #[inline(always)]
    fn exclude_biased_readers(&self, deadline: Revocation) -> Result<u64, ()> {
        if !self.bias.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.revoke_bias(deadline)
    }

    #[cold]
    #[inline(never)]
    fn revoke_bias(&self, deadline: Revocation) -> Result<u64, ()> {
        let start = clock::ticks();
        let mut wait = RevokeWait::new();
        let found = reader_bias::revoke_lock(self.counts_ptr().addr(), &self.bias, || match deadline {
            Revocation::Now => false,
            Revocation::Wait => {
                wait.wait();
                true
            }
            Revocation::Until(deadline) => {
                let more = Instant::now() < deadline;
                if more {
                    wait.wait();
                }
                more
            }
        });
        let end = clock::ticks();
        if let Some(observed) = &self.observed {
            observed.bias_policy.revoked(start, end);
        }
        match found {
            Ok(true) => Ok(end.saturating_sub(start).max(1)),
            Ok(false) => Ok(0),
            Err(()) => Err(()),
        }
    }

    /// [`exclude_biased_readers`](Self::exclude_biased_readers) for an
    /// acquisition that may fail: when a reader is still inside at
    /// `deadline`, gives the exclusive hold back, to the upgradable hold
    /// it came from if `upgraded`, else by unlocking the word.
    ///
    /// # Safety
    ///
    /// The caller holds the word exclusively (through an upgrade if
    /// `upgraded`).
    #[inline(always)]
    unsafe fn excluded_or_given_back(&self, deadline: Revocation, upgraded: bool) -> bool {
        if self.exclude_biased_readers(deadline).is_ok() {
            return true;
        }
        // SAFETY: forwarded.
        unsafe {
            if upgraded {
                self.inner.downgrade_to_upgradable();
            } else {
                self.inner.unlock_exclusive();
            }
        }
        false
    }

    /// After a blocking `op` took the word at once: waits for the biased
    /// readers, and reports the acquisition as contended if any were
    /// inside (with that wait), else as immediate.
    #[inline(always)]
    #[track_caller]
    fn exclude_then_report(&self, op: u16, ticket: Ticket) {
        match self.exclude_biased_readers(Revocation::Wait) {
            Ok(0) => self.acquired_exclusive(op, 0, 0, ticket, 0),
            waited => {
                let sites = SiteWord::own(self.probe.site_id(Location::caller())).0;
                with_wait_sites(sites, || {
                    self.acquired_exclusive(op, CONTENDED, waited.unwrap_or(1), ticket, 0)
                });
            }
        }
    }

    /// A `try_write`'s acquisition: the word if free, and no biased reader
    /// inside.
    #[inline(always)]
    fn try_write_now(&self) -> bool {
        // SAFETY: `try_lock_exclusive` just took the word exclusively.
        self.inner.try_lock_exclusive() && unsafe { self.excluded_or_given_back(Revocation::Now, false) }
    }

    /// A timed `try_write` once its immediate attempt failed: waits for
    /// the word, then for the biased readers, until `deadline`.
    #[track_caller]
    fn write_until(&self, ticket: Ticket, deadline: Instant) -> bool {
        self.timed(op::TRY_WRITE, true, ticket, |inner| {
            // SAFETY: a successful `try_lock_exclusive_until` holds the
            // word exclusively.
            inner.try_lock_exclusive_until(deadline)
                && unsafe { self.excluded_or_given_back(Revocation::Until(deadline), false) }
        })
    }

    /// A timed upgrade (`None`: a deadline too far to represent).
    ///
    /// # Safety
    ///
    /// The caller holds an upgradable lock.
    #[track_caller]
    unsafe fn upgrade_until(&self, deadline: Option<Instant>) -> bool {
        let ticket = Ticket::REPORTED;
        // SAFETY: the caller holds an upgradable lock; a successful
        // `try_upgrade` holds the word exclusively.
        if unsafe { self.inner.try_upgrade() && self.excluded_or_given_back(Revocation::Now, true) } {
            return self.try_exclusive(op::UPGRADE, ticket, true);
        }
        self.timed(op::UPGRADE, true, ticket, |inner| match deadline {
            // SAFETY: as above, with `try_upgrade_until`.
            Some(deadline) => unsafe {
                inner.try_upgrade_until(deadline)
                    && self.excluded_or_given_back(Revocation::Until(deadline), true)
            },
            None => {
                // SAFETY: the caller holds an upgradable lock.
                self.exclusive_then_exclude(|inner| unsafe { inner.upgrade() });
                true
            }
        })
    }

    /// A blocking exclusive acquisition through `lock` (the word's
    /// `lock_exclusive`, `upgrade` or the like), then the biased readers'
    /// exclusion: a wait like any other.
    #[inline(always)]
    fn exclusive_then_exclude(&self, lock: impl FnOnce(&parking_lot::RawRwLock)) {
        lock(&self.inner);
        let waited = self.exclude_biased_readers(Revocation::Wait);
        debug_assert!(waited.is_ok(), "a waiting revocation gave up");
    }

    /// Leaves `report` for this thread's release of the hold, sampled by
    /// [`sample_reported`](Self::sample_reported) if it is reported on its
    /// own and no draw sampled it. `now`: as for
    /// [`leave_report`](Self::leave_report).
    #[cold]
    #[inline(never)]
    fn record<S: Side>(&self, side: S, mut report: HoldReport, now: u64) {
        if self.observed.is_none() {
            return;
        }
        // (op 0, the shared end of a downgrade, reports nothing: not sampled.)
        if report.hold_start == 0 && report.op != 0 && (report.op != S::PLAIN || report.flags != 0) {
            report.hold_start = self.sample_reported(now);
        }
        if report.flags & CONTENDED != 0 {
            report.sites = WAIT_SITES.get();
        }
        // Refused only when this thread's table is gone (a thread-local's
        // destructor is taking the lock): the release then counts a plain
        // acquisition, and that is what this hold is reported as,
        // unsampled.
        let _ = side.push(report);
    }

    /// Ends a shared hold (`fair`: through `unlock_shared_fair`), then
    /// reports it: a count for an uncontended `read`, its record for any
    /// other.
    ///
    /// # Safety
    ///
    /// The caller holds a shared lock.
    #[inline(always)]
    unsafe fn end_read_hold(&self, fair: bool) {
        let (last, last_counts) = LAST_READ.with(Cell::get);
        let counts = if last == self.addr() {
            last_counts
        } else {
            self.counts_ptr()
        };
        // Released first: what the release reports is on this thread.
        // SAFETY: forwarded: the caller holds a shared lock.
        unsafe { self.release_shared(fair, counts) };
        if Reads.held() == 0 {
            // SAFETY: `counts` is this lock's (or null), and the lock is
            // alive (the caller's borrow of it lasts through this call).
            // Read off the lock itself, that is plain; taken from
            // `LAST_READ`, this thread took the hold just released itself
            // (read guards are not `Send`), and every shared acquisition,
            // observed or not, waited or not, leaves `LAST_READ` with the
            // acquiring lock's address and counts, so a `LAST_READ`
            // naming this address was left by this lock, whose counts
            // live as long as it does.
            self.count(unsafe { counts.as_ref() }, op::READ);
        } else {
            self.report_recorded(Reads, self.counts());
        }
    }

    /// Lets a shared hold go: through this thread's reader slot if it
    /// took the lock that way, else through the word. `counts`:
    /// [`counts_ptr`](Self::counts_ptr).
    ///
    /// # Safety
    ///
    /// The caller holds a shared lock.
    #[inline(always)]
    unsafe fn release_shared(&self, fair: bool, counts: *const OpCounts<2>) {
        if !counts.is_null() && reader_bias::leave_if_held(counts.addr()) {
            return;
        }
        // SAFETY: the caller holds a shared lock, and not through its
        // reader slot (a thread holds one lock at most that way).
        unsafe {
            if fair {
                self.inner.unlock_shared_fair();
            } else {
                self.inner.unlock_shared();
            }
        }
    }

    /// The report of a hold's release on `side`, after it, while this
    /// thread has reports there, perhaps of this hold.
    #[cold]
    #[inline(never)]
    fn report_recorded<S: Side>(&self, side: S, counts: Option<&OpCounts<2>>) {
        let Some(report) = side.take(self.addr()) else {
            self.count(counts, S::PLAIN);
            return;
        };
        match (report.op, report.flags) {
            (0, _) => {}
            (op, 0) if op == S::PLAIN => self.count(counts, op),
            (op, flags) => self
                .probe
                .emitter()
                .emit_sites(op, flags, report.latency, SiteWord(report.sites)),
        }
        if report.hold_start != 0 {
            self.probe.emit(S::UNLOCK, 0, since(report.hold_start));
        }
    }

    /// After an exclusive acquisition: see
    /// [`leave_report`](Self::leave_report). Nothing is counted or pushed
    /// inside the hold.
    #[inline(always)]
    fn acquired_exclusive(&self, op: u16, flags: u16, latency: u64, ticket: Ticket, now: u64) {
        self.leave_report(Writes, op, flags, latency, ticket, now);
    }

    /// After a write hold's release (or downgrade): counts an uncontended
    /// `write`; else reports this thread's record of the hold. `counts`
    /// was read before the release, so nothing here reads the lock's own
    /// line but the probe of a push.
    #[inline(always)]
    fn report_write_end(&self, counts: Option<&OpCounts<2>>) {
        if Writes.held() == 0 {
            self.count(counts, op::WRITE);
        } else {
            self.report_recorded(Writes, counts);
        }
    }

    /// Ends the current write hold through `release` (an unlock or a
    /// downgrade of `parking_lot`'s lock), then reports it.
    ///
    /// # Safety
    ///
    /// The caller holds the exclusive lock, and `release` lets it go.
    #[inline(always)]
    unsafe fn end_write_hold(&self, release: impl FnOnce(&parking_lot::RawRwLock)) {
        let counts = self.counts();
        release(&self.inner);
        self.report_write_end(counts);
    }

    /// The shared hold a downgrade leaves is not a `read`: its release
    /// must not count one.
    fn downgraded_to_shared(&self) {
        self.remember_shared_hold();
        let report = HoldReport {
            lock: self.addr(),
            op: 0,
            flags: 0,
            latency: 0,
            hold_start: 0,
            sites: 0,
        };
        self.record(Reads, report, 0);
    }

    /// Blocks in `wait` and records the wait as a contended `op`. An
    /// unobserved lock just waits: no clock, no record.
    #[cold]
    #[inline(never)]
    #[track_caller]
    fn wait_for(&self, op: u16, exclusive: bool, ticket: Ticket, wait: impl FnOnce(&parking_lot::RawRwLock)) {
        if self.observed.is_none() {
            wait(&self.inner);
            if !exclusive {
                self.remember_shared_hold();
            }
            return;
        }
        // Interned before the wait, so it is not part of the measured wait.
        let sites = SiteWord::own(self.probe.site_id(Location::caller())).0;
        let start = clock::ticks();
        if self.sampler.slow_path_due(start) {
            self.refresh_policy();
        }
        wait(&self.inner);
        let now = clock::ticks();
        let waited = now.saturating_sub(start).max(1);
        with_wait_sites(sites, || {
            if exclusive {
                self.acquired_exclusive(op, CONTENDED, waited, ticket, now);
            } else {
                self.acquired_shared(op, CONTENDED, waited, ticket, now);
            }
        });
    }

    /// A timed acquisition's slow path: C + wait, M when it timed out.
    #[cold]
    #[inline(never)]
    #[track_caller]
    fn timed(
        &self,
        op: u16,
        exclusive: bool,
        ticket: Ticket,
        wait: impl FnOnce(&parking_lot::RawRwLock) -> bool,
    ) -> bool {
        if self.observed.is_none() {
            let acquired = wait(&self.inner);
            if acquired && !exclusive {
                self.remember_shared_hold();
            }
            return acquired;
        }
        let sites = SiteWord::own(self.probe.site_id(Location::caller()));
        let start = clock::ticks();
        if self.sampler.slow_path_due(start) {
            self.refresh_policy();
        }
        let acquired = wait(&self.inner);
        let now = clock::ticks();
        let waited = now.saturating_sub(start).max(1);
        match (acquired, exclusive) {
            (true, true) => with_wait_sites(sites.0, || {
                self.acquired_exclusive(op, CONTENDED, waited, ticket, now)
            }),
            (true, false) => with_wait_sites(sites.0, || {
                self.acquired_shared(op, CONTENDED, waited, ticket, now)
            }),
            (false, _) => self
                .probe
                .emitter()
                .emit_sites(op, CONTENDED | MISS, waited, sites),
        }
        acquired
    }

    #[inline(always)]
    #[track_caller]
    fn try_shared(&self, op: u16, ticket: Ticket, acquired: bool) -> bool {
        if acquired {
            self.acquired_shared(op, 0, 0, ticket, 0);
        } else {
            self.probe.emit_at(op, MISS, 0, Location::caller());
        }
        acquired
    }

    #[inline(always)]
    #[track_caller]
    fn try_exclusive(&self, op: u16, ticket: Ticket, acquired: bool) -> bool {
        if acquired {
            self.acquired_exclusive(op, 0, 0, ticket, 0);
        } else {
            self.probe.emit_at(op, MISS, 0, Location::caller());
        }
        acquired
    }
}

// SAFETY: exclusion is `parking_lot::RawRwLock`'s: every method acquires or
// releases through it exactly as its own implementation would.
unsafe impl lock_api::RawRwLock for RawRwLock {
    /// An unobserved raw lock (no instance).
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = Self::unobserved();
    type GuardMarker = GuardNoSend;

    #[inline(always)]
    #[track_caller]
    fn lock_shared(&self) {
        // Unobserved: nothing to tell apart, so `parking_lot`'s own
        // acquisition, not a `try` first. (Its `try` retries at once a
        // compare-and-swap that lost to another reader's, where its `lock`
        // backs off first, which readers hammering the lock pay for: the
        // `rwlock` group's `unobserved/read/{2,4}` rows.)
        if self.observed.is_none() {
            self.remember_shared_hold();
            self.inner.lock_shared();
            return;
        }
        let ticket = self.ticket();
        // Remembered before the hold: between the acquisition's atomic
        // operation and the release's, the other reader's next attempt
        // can take the lock word's line away, and the release waits for
        // it back.
        let counts = self.remember_shared_hold();
        if self.read_biased(counts) {
            self.leave_read_record(op::READ, 0, 0, ticket, 0);
        } else if self.inner.try_lock_shared() {
            self.rebias_if_due(ticket);
            self.leave_read_record(op::READ, 0, 0, ticket, 0);
        } else {
            self.wait_for(op::READ, false, ticket, |inner| inner.lock_shared());
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_shared(&self) -> bool {
        let ticket = Ticket::REPORTED;
        let acquired = self.read_biased(self.counts_ptr()) || self.inner.try_lock_shared();
        self.try_shared(op::TRY_READ, ticket, acquired)
    }

    #[inline(always)]
    unsafe fn unlock_shared(&self) {
        // SAFETY: forwarded: the caller holds a shared lock.
        unsafe { self.end_read_hold(false) }
    }

    #[inline(always)]
    #[track_caller]
    fn lock_exclusive(&self) {
        // Nothing of the lock is read before the compare-and-swap: a load of
        // its line there costs the swap its exclusive ownership, as the
        // `Mutex`'s does (the `rwlock` group's `…/mixed/2` rows).
        let ticket = self.ticket();
        if self.inner.try_lock_exclusive() {
            // An unobserved lock is never biased and reports nothing.
            if self.observed.is_some() {
                self.exclude_then_report(op::WRITE, ticket);
            }
        } else {
            self.wait_for(op::WRITE, true, ticket, |_| {
                self.exclusive_then_exclude(|inner| inner.lock_exclusive());
            });
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_exclusive(&self) -> bool {
        let ticket = Ticket::REPORTED;
        self.try_exclusive(op::TRY_WRITE, ticket, self.try_write_now())
    }

    #[inline(always)]
    unsafe fn unlock_exclusive(&self) {
        // SAFETY: the caller holds the exclusive lock, which the closure
        // releases.
        unsafe { self.end_write_hold(|inner| inner.unlock_exclusive()) }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.inner.is_locked()
            || (self.bias.load(Ordering::Relaxed) && reader_bias::any_reader_of(self.counts_ptr().addr()))
    }

    #[inline]
    fn is_locked_exclusive(&self) -> bool {
        self.inner.is_locked_exclusive()
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockFair for RawRwLock {
    #[inline]
    unsafe fn unlock_shared_fair(&self) {
        // SAFETY: forwarded: the caller holds a shared lock.
        unsafe { self.end_read_hold(true) }
    }

    #[inline]
    unsafe fn unlock_exclusive_fair(&self) {
        // SAFETY: the caller holds the exclusive lock, which the closure
        // releases.
        unsafe { self.end_write_hold(|inner| inner.unlock_exclusive_fair()) }
    }

    /// The hold's record (on this thread) stays with it. A hold through
    /// the thread's reader slot yields only to a writer revoking the bias,
    /// and only if it is the thread's one hold there: it leaves the slot
    /// and waits on the word.
    #[inline]
    unsafe fn bump_shared(&self) {
        let counts = self.counts_ptr();
        if !counts.is_null() && reader_bias::holds(counts.addr()) {
            // Recursive: if this thread also holds the word, a writer
            // waiting for it must not hold this one up.
            if !self.bias.load(Ordering::Relaxed) && reader_bias::leave_last(counts.addr()) {
                self.inner.lock_shared_recursive();
            }
            return;
        }
        // SAFETY: forwarded: the caller holds a shared lock, through the
        // word.
        unsafe { self.inner.bump_shared() }
    }

    #[inline]
    unsafe fn bump_exclusive(&self) {
        // The hold goes on: its record, if any, stays on this thread.
        // SAFETY: forwarded: the caller holds the exclusive lock.
        unsafe { self.inner.bump_exclusive() }
        // A reader may have biased the lock while it was let go.
        let excluded = self.exclude_biased_readers(Revocation::Wait);
        debug_assert!(excluded.is_ok(), "a waiting revocation gave up");
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockDowngrade for RawRwLock {
    #[inline]
    unsafe fn downgrade(&self) {
        // SAFETY: the caller holds the exclusive lock, which the closure
        // turns into a shared one.
        unsafe { self.end_write_hold(|inner| inner.downgrade()) }
        self.downgraded_to_shared();
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockTimed for RawRwLock {
    type Duration = Duration;
    type Instant = Instant;

    #[inline]
    #[track_caller]
    fn try_lock_shared_for(&self, timeout: Duration) -> bool {
        let ticket = Ticket::REPORTED;
        if self.read_biased(self.counts_ptr()) || self.inner.try_lock_shared() {
            return self.try_shared(op::TRY_READ, ticket, true);
        }
        self.timed(op::TRY_READ, false, ticket, |inner| {
            inner.try_lock_shared_for(timeout)
        })
    }

    #[inline]
    #[track_caller]
    fn try_lock_shared_until(&self, timeout: Instant) -> bool {
        let ticket = Ticket::REPORTED;
        if self.read_biased(self.counts_ptr()) || self.inner.try_lock_shared() {
            return self.try_shared(op::TRY_READ, ticket, true);
        }
        self.timed(op::TRY_READ, false, ticket, |inner| {
            inner.try_lock_shared_until(timeout)
        })
    }

    #[inline]
    #[track_caller]
    fn try_lock_exclusive_for(&self, timeout: Duration) -> bool {
        let ticket = Ticket::REPORTED;
        if self.try_write_now() {
            return self.try_exclusive(op::TRY_WRITE, ticket, true);
        }
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.write_until(ticket, deadline),
            None => self.timed(op::TRY_WRITE, true, ticket, |_| {
                self.exclusive_then_exclude(|inner| inner.lock_exclusive());
                true
            }),
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_exclusive_until(&self, timeout: Instant) -> bool {
        let ticket = Ticket::REPORTED;
        if self.try_write_now() {
            return self.try_exclusive(op::TRY_WRITE, ticket, true);
        }
        self.write_until(ticket, timeout)
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockRecursive for RawRwLock {
    #[inline]
    #[track_caller]
    fn lock_shared_recursive(&self) {
        let ticket = self.ticket();
        // Remembered before the hold: between the acquisition's atomic
        // operation and the release's, the other reader's next attempt
        // can take the lock word's line away, and the release waits for
        // it back.
        let counts = self.remember_shared_hold();
        if self.read_biased_recursive(counts) {
            self.leave_read_record(op::READ, 0, 0, ticket, 0);
        } else if self.inner.try_lock_shared_recursive() {
            self.rebias_if_due(ticket);
            self.leave_read_record(op::READ, 0, 0, ticket, 0);
        } else {
            self.wait_for(op::READ, false, ticket, |inner| inner.lock_shared_recursive());
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_shared_recursive(&self) -> bool {
        let ticket = Ticket::REPORTED;
        let acquired =
            self.read_biased_recursive(self.counts_ptr()) || self.inner.try_lock_shared_recursive();
        self.try_shared(op::TRY_READ, ticket, acquired)
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockRecursiveTimed for RawRwLock {
    #[inline]
    #[track_caller]
    fn try_lock_shared_recursive_for(&self, timeout: Duration) -> bool {
        let ticket = Ticket::REPORTED;
        if self.read_biased_recursive(self.counts_ptr()) || self.inner.try_lock_shared_recursive() {
            return self.try_shared(op::TRY_READ, ticket, true);
        }
        self.timed(op::TRY_READ, false, ticket, |inner| {
            inner.try_lock_shared_recursive_for(timeout)
        })
    }

    #[inline]
    #[track_caller]
    fn try_lock_shared_recursive_until(&self, timeout: Instant) -> bool {
        let ticket = Ticket::REPORTED;
        if self.read_biased_recursive(self.counts_ptr()) || self.inner.try_lock_shared_recursive() {
            return self.try_shared(op::TRY_READ, ticket, true);
        }
        self.timed(op::TRY_READ, false, ticket, |inner| {
            inner.try_lock_shared_recursive_until(timeout)
        })
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockUpgrade for RawRwLock {
    /// Pushed at once, in the hold: an upgradable hold is rarer than a
    /// read, and its release is not a read unlock.
    #[inline]
    #[track_caller]
    fn lock_upgradable(&self) {
        if self.inner.try_lock_upgradable() {
            self.probe.emit(op::READ, 0, 0);
        } else {
            let site = Location::caller();
            let start = clock::ticks();
            self.inner.lock_upgradable();
            self.probe.emit_at(op::READ, CONTENDED, since(start), site);
        }
    }

    #[inline]
    #[track_caller]
    fn try_lock_upgradable(&self) -> bool {
        let acquired = self.inner.try_lock_upgradable();
        if acquired {
            self.probe.emit(op::TRY_READ, 0, 0);
        } else {
            self.probe.emit_at(op::TRY_READ, MISS, 0, Location::caller());
        }
        acquired
    }

    #[inline]
    unsafe fn unlock_upgradable(&self) {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.inner.unlock_upgradable() }
    }

    #[inline]
    #[track_caller]
    unsafe fn upgrade(&self) {
        let ticket = Ticket::REPORTED;
        // SAFETY: forwarded: the caller holds an upgradable lock.
        if unsafe { self.inner.try_upgrade() } {
            self.exclude_then_report(op::UPGRADE, ticket);
        } else {
            self.wait_for(op::UPGRADE, true, ticket, |_| {
                // SAFETY: forwarded: the caller holds an upgradable lock.
                self.exclusive_then_exclude(|inner| unsafe { inner.upgrade() });
            });
        }
    }

    #[inline]
    #[track_caller]
    unsafe fn try_upgrade(&self) -> bool {
        let ticket = Ticket::REPORTED;
        // SAFETY: forwarded: the caller holds an upgradable lock; a
        // successful `try_upgrade` holds the word exclusively.
        let upgraded =
            unsafe { self.inner.try_upgrade() && self.excluded_or_given_back(Revocation::Now, true) };
        self.try_exclusive(op::UPGRADE, ticket, upgraded)
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockUpgradeFair for RawRwLock {
    #[inline]
    unsafe fn unlock_upgradable_fair(&self) {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.inner.unlock_upgradable_fair() }
    }

    #[inline]
    unsafe fn bump_upgradable(&self) {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.inner.bump_upgradable() }
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockUpgradeDowngrade for RawRwLock {
    #[inline]
    unsafe fn downgrade_upgradable(&self) {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.inner.downgrade_upgradable() }
        self.downgraded_to_shared();
    }

    #[inline]
    unsafe fn downgrade_to_upgradable(&self) {
        // SAFETY: the caller holds the exclusive lock, which the closure
        // turns into an upgradable one.
        unsafe { self.end_write_hold(|inner| inner.downgrade_to_upgradable()) }
    }
}

// SAFETY: forwards to `parking_lot::RawRwLock`.
unsafe impl lock_api::RawRwLockUpgradeTimed for RawRwLock {
    #[inline]
    #[track_caller]
    fn try_lock_upgradable_for(&self, timeout: Duration) -> bool {
        if self.inner.try_lock_upgradable() {
            self.probe.emit(op::TRY_READ, 0, 0);
            return true;
        }
        let start = clock::ticks();
        let acquired = self.inner.try_lock_upgradable_for(timeout);
        let flags = if acquired { CONTENDED } else { CONTENDED | MISS };
        self.probe
            .emit_at(op::TRY_READ, flags, since(start), Location::caller());
        acquired
    }

    #[inline]
    #[track_caller]
    fn try_lock_upgradable_until(&self, timeout: Instant) -> bool {
        if self.inner.try_lock_upgradable() {
            self.probe.emit(op::TRY_READ, 0, 0);
            return true;
        }
        let start = clock::ticks();
        let acquired = self.inner.try_lock_upgradable_until(timeout);
        let flags = if acquired { CONTENDED } else { CONTENDED | MISS };
        self.probe
            .emit_at(op::TRY_READ, flags, since(start), Location::caller());
        acquired
    }

    #[inline]
    #[track_caller]
    unsafe fn try_upgrade_for(&self, timeout: Duration) -> bool {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.upgrade_until(Instant::now().checked_add(timeout)) }
    }

    #[inline]
    #[track_caller]
    unsafe fn try_upgrade_until(&self, timeout: Instant) -> bool {
        // SAFETY: forwarded: the caller holds an upgradable lock.
        unsafe { self.upgrade_until(Some(timeout)) }
    }
}

/// A shared guard of [`RwLock`].
pub type RwLockReadGuard<'a, T> = lock_api::RwLockReadGuard<'a, RawRwLock, T>;
/// An exclusive guard of [`RwLock`].
pub type RwLockWriteGuard<'a, T> = lock_api::RwLockWriteGuard<'a, RawRwLock, T>;
/// An upgradable shared guard of [`RwLock`].
pub type RwLockUpgradableReadGuard<'a, T> = lock_api::RwLockUpgradableReadGuard<'a, RawRwLock, T>;
/// A shared guard mapped to a part of the data.
pub type MappedRwLockReadGuard<'a, T> = lock_api::MappedRwLockReadGuard<'a, RawRwLock, T>;
/// An exclusive guard mapped to a part of the data.
pub type MappedRwLockWriteGuard<'a, T> = lock_api::MappedRwLockWriteGuard<'a, RawRwLock, T>;

/// A reader-writer lock, `parking_lot::RwLock` with observations (kind 2).
///
/// ```
/// use subetha_core::RwLock;
/// use subetha_core::primitives::RwLockUpgradableReadGuard;
///
/// let config = RwLock::named("config", String::from("v1"));
/// assert_eq!(config.read().as_str(), "v1");
/// let up = config.upgradable_read();
/// let mut w = RwLockUpgradableReadGuard::upgrade(up);
/// w.push('!');
/// drop(w);
/// assert_eq!(config.into_inner(), "v1!");
/// ```
pub struct RwLock<T: ?Sized> {
    inner: lock_api::RwLock<RawRwLock, T>,
}

impl<T> RwLock<T> {
    /// A lock named after its creation site.
    #[track_caller]
    pub fn new(value: T) -> Self {
        Self {
            inner: lock_api::RwLock::from_raw(RawRwLock::register(None, Location::caller()), value),
        }
    }

    /// A lock named `name`.
    #[track_caller]
    pub fn named(name: &str, value: T) -> Self {
        Self {
            inner: lock_api::RwLock::from_raw(RawRwLock::register(Some(name), Location::caller()), value),
        }
    }

    /// A lock without an instance (nothing observed); `const`.
    pub const fn unobserved(value: T) -> Self {
        Self {
            inner: lock_api::RwLock::from_raw(RawRwLock::unobserved(), value),
        }
    }

    /// Consumes the lock (unregistering its instance) and returns the data.
    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, blocking while a writer holds the lock. A wait is attributed to the caller's line ([`crate::site`]).
    #[inline]
    #[track_caller]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        let raw = self.raw();
        lock_api::RawRwLock::lock_shared(raw);
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_read_guard_unchecked() }
    }

    /// Shared access if available now.
    #[inline]
    #[track_caller]
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLock::try_lock_shared(raw) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Shared access, waiting at most `timeout`.
    #[inline]
    #[track_caller]
    pub fn try_read_for(&self, timeout: Duration) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockTimed::try_lock_shared_for(raw, timeout) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Shared access, waiting until `deadline` at most.
    #[inline]
    #[track_caller]
    pub fn try_read_until(&self, deadline: Instant) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockTimed::try_lock_shared_until(raw, deadline) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Shared access that succeeds even with writers waiting, if this thread
    /// already reads (see `parking_lot::RwLock::read_recursive`).
    #[inline]
    #[track_caller]
    pub fn read_recursive(&self) -> RwLockReadGuard<'_, T> {
        let raw = self.raw();
        lock_api::RawRwLockRecursive::lock_shared_recursive(raw);
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_read_guard_unchecked() }
    }

    /// Non-blocking [`RwLock::read_recursive`].
    #[inline]
    #[track_caller]
    pub fn try_read_recursive(&self) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockRecursive::try_lock_shared_recursive(raw) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Timed [`RwLock::read_recursive`].
    #[inline]
    #[track_caller]
    pub fn try_read_recursive_for(&self, timeout: Duration) -> Option<RwLockReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockRecursiveTimed::try_lock_shared_recursive_for(raw, timeout) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_read_guard_unchecked() })
        } else {
            None
        }
    }

    /// Exclusive access, blocking while anyone holds the lock.
    #[inline]
    #[track_caller]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        let raw = self.raw();
        lock_api::RawRwLock::lock_exclusive(raw);
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_write_guard_unchecked() }
    }

    /// Exclusive access if available now.
    #[inline]
    #[track_caller]
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLock::try_lock_exclusive(raw) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_write_guard_unchecked() })
        } else {
            None
        }
    }

    /// Exclusive access, waiting at most `timeout`.
    #[inline]
    #[track_caller]
    pub fn try_write_for(&self, timeout: Duration) -> Option<RwLockWriteGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockTimed::try_lock_exclusive_for(raw, timeout) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_write_guard_unchecked() })
        } else {
            None
        }
    }

    /// Exclusive access, waiting until `deadline` at most.
    #[inline]
    #[track_caller]
    pub fn try_write_until(&self, deadline: Instant) -> Option<RwLockWriteGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockTimed::try_lock_exclusive_until(raw, deadline) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_write_guard_unchecked() })
        } else {
            None
        }
    }

    /// Upgradable shared access (one at a time; upgrade with
    /// [`RwLockUpgradableReadGuard::upgrade`], whose wait is attributed to
    /// `lock_api`'s line: the guard's methods are `lock_api`'s).
    #[inline]
    #[track_caller]
    pub fn upgradable_read(&self) -> RwLockUpgradableReadGuard<'_, T> {
        let raw = self.raw();
        lock_api::RawRwLockUpgrade::lock_upgradable(raw);
        // SAFETY: the lock was just acquired by this thread.
        unsafe { self.inner.make_upgradable_guard_unchecked() }
    }

    /// Non-blocking [`RwLock::upgradable_read`].
    #[inline]
    #[track_caller]
    pub fn try_upgradable_read(&self) -> Option<RwLockUpgradableReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockUpgrade::try_lock_upgradable(raw) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_upgradable_guard_unchecked() })
        } else {
            None
        }
    }

    /// Timed [`RwLock::upgradable_read`].
    #[inline]
    #[track_caller]
    pub fn try_upgradable_read_for(&self, timeout: Duration) -> Option<RwLockUpgradableReadGuard<'_, T>> {
        let raw = self.raw();
        if lock_api::RawRwLockUpgradeTimed::try_lock_upgradable_for(raw, timeout) {
            // SAFETY: the lock was just acquired by this thread.
            Some(unsafe { self.inner.make_upgradable_guard_unchecked() })
        } else {
            None
        }
    }

    /// Whether anyone holds the lock (racy hint, not observed).
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.inner.is_locked()
    }

    /// Whether a writer holds the lock (racy hint, not observed).
    #[inline]
    pub fn is_locked_exclusive(&self) -> bool {
        self.inner.is_locked_exclusive()
    }

    /// The data through exclusive access (no locking, not observed).
    #[inline]
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }

    /// A raw pointer to the data.
    #[inline]
    pub fn data_ptr(&self) -> *mut T {
        self.inner.data_ptr()
    }

    /// Releases a shared lock whose guard was forgotten.
    ///
    /// # Safety
    ///
    /// See `lock_api::RwLock::force_unlock_read`.
    #[inline]
    pub unsafe fn force_unlock_read(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.force_unlock_read() }
    }

    /// Releases an exclusive lock whose guard was forgotten.
    ///
    /// # Safety
    ///
    /// See `lock_api::RwLock::force_unlock_write`.
    #[inline]
    pub unsafe fn force_unlock_write(&self) {
        // SAFETY: forwarded to the caller.
        unsafe { self.inner.force_unlock_write() }
    }

    /// The underlying `lock_api` lock.
    pub fn as_lock_api(&self) -> &lock_api::RwLock<RawRwLock, T> {
        &self.inner
    }

    fn raw(&self) -> &RawRwLock {
        // SAFETY: the raw lock is used for its instance id, its policy
        // cache and acquisitions whose success is turned into a guard at
        // once, so no guard's view of the lock is invalidated.
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

impl<T: Default> Default for RwLock<T> {
    #[track_caller]
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> From<T> for RwLock<T> {
    #[track_caller]
    fn from(value: T) -> Self {
        Self::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    /// Shows the data if no writer holds the lock; records nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RwLock");
        let raw = self.raw();
        if raw.inner.try_lock_shared() {
            // SAFETY: the shared lock was just acquired (unobserved) and is
            // released right below, also unobserved; no writer can exist.
            let data = unsafe { &*self.inner.data_ptr() };
            d.field("data", &data);
            // SAFETY: acquired just above.
            unsafe { raw.inner.unlock_shared() };
        } else {
            d.field("data", &format_args!("<locked>"));
        }
        d.field("instance_id", &self.instance_id()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier as StdBarrier};

    use super::super::set_policy_word;
    use super::super::test_support::{op, unique, wait_for};
    use super::*;

    fn every_hold<T>(l: &RwLock<T>) {
        assert!(set_policy_word(
            l.instance_id().unwrap(),
            PolicyWord::default().with_sample_every(1)
        ));
        l.refresh_policy();
    }

    #[test]
    fn lock_word_and_small_data_share_a_cache_line_wherever_the_allocator_puts_them() {
        // `lock_api::RwLock` puts the data right after the raw lock.
        let l = RwLock::unobserved(0u64);
        let word = std::mem::offset_of!(RawRwLock, inner);
        let data = l.data_ptr() as usize - &l as *const _ as usize;
        assert_eq!(
            data,
            std::mem::size_of::<RawRwLock>(),
            "data follows the raw lock"
        );
        // Allocations are at least 16-byte aligned; try every such placement
        // within a line, also behind an `Arc`'s two counters.
        for base in (0..64).step_by(16) {
            let line = |offset: usize| (base + offset) / 64;
            assert_eq!(line(word), line(word + 7), "placement {base}: the word splits");
            assert_eq!(line(word), line(data), "placement {base}: word and data split");
            assert_eq!(
                line(data),
                line(data + 7),
                "placement {base}: a u64 of data splits"
            );
        }
    }

    /// Whether `l` is biased, after a first read (whose draw biases a
    /// fresh observed lock).
    fn biased_after_a_read<T>(l: &RwLock<T>) -> bool {
        drop(l.read());
        l.raw().bias.load(Ordering::Relaxed)
    }

    /// Whether some thread holds `l` shared through its reader slot.
    fn read_through_a_slot<T>(l: &RwLock<T>) -> bool {
        reader_bias::any_reader_of(l.raw().counts_ptr().addr())
    }

    /// Runs `write` on another thread, which must block while this thread
    /// holds its read guard, and finishes once the guard is dropped.
    fn blocked_until_dropped<T: Send + Sync + 'static, G>(
        l: &Arc<RwLock<T>>,
        guard: G,
        write: impl FnOnce(&RwLock<T>) + Send + 'static,
    ) {
        let done = Arc::new(AtomicBool::new(false));
        let writer = std::thread::spawn({
            let (l, done) = (Arc::clone(l), Arc::clone(&done));
            move || {
                write(&l);
                done.store(true, Ordering::SeqCst);
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!done.load(Ordering::SeqCst), "the writer got in past a reader");
        drop(guard);
        writer.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn a_biased_read_leaves_the_word_alone_and_writers_wait_for_it() {
        let name = unique("rwlock-bias");
        let l = Arc::new(RwLock::named(&name, 0u64));
        assert!(
            biased_after_a_read(&l),
            "a fresh lock is biased by its first read"
        );
        let guard = l.read();
        assert!(read_through_a_slot(&l));
        assert!(!l.raw().inner.is_locked(), "the biased read took the word");
        assert!(l.is_locked(), "a biased reader is a reader");
        assert!(l.try_write().is_none());
        assert!(
            l.raw().bias.load(Ordering::Relaxed),
            "a failed try leaves the bias set"
        );
        assert!(l.try_write_for(Duration::from_millis(5)).is_none());
        assert!(l.try_write().is_none(), "a timed-out write forgot the reader");
        blocked_until_dropped(&l, guard, |l| *l.write() += 1);
        assert_eq!(*l.read(), 1);
        assert!(!read_through_a_slot(&l));
        // The waited write was reported as contended.
        let r = wait_for(&name, |r| op(r, op::WRITE).0 >= 1);
        assert_eq!(op(&r, op::WRITE).1, 1, "the write that waited is contended");
        assert_eq!(op(&r, op::TRY_WRITE).2, 3, "every try missed");
    }

    #[test]
    fn upgrades_and_bumps_wait_for_biased_readers() {
        let l = Arc::new(RwLock::named(&unique("rwlock-bias-upgrade"), 0u64));
        assert!(biased_after_a_read(&l));
        let guard = l.read();
        assert!(read_through_a_slot(&l));
        blocked_until_dropped(&l, guard, |l| {
            let up = l.upgradable_read();
            *RwLockUpgradableReadGuard::upgrade(up) += 1;
        });
        // Bias again (the revocation inhibits it for a while), then a
        // reader in; a timed upgrade gives up and keeps its upgradable hold.
        while !biased_after_a_read(&l) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let guard = l.read();
        assert!(read_through_a_slot(&l));
        let up = l.upgradable_read();
        let up = RwLockUpgradableReadGuard::try_upgrade_for(up, Duration::from_millis(5))
            .expect_err("a biased reader is inside");
        drop(up);
        // A biased reader bumped while a writer waits lets it in.
        let writer = std::thread::spawn({
            let l = Arc::clone(&l);
            move || *l.write() += 1
        });
        let mut guard = guard;
        // The writer holds the word, then clears the bias: only then does
        // it wait for this reader.
        while !l.raw().inner.is_locked_exclusive() || l.raw().bias.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
        RwLockReadGuard::bump(&mut guard);
        assert_eq!(*guard, 2, "the bump let the waiting writer in");
        drop(guard);
        writer.join().unwrap();
    }

    #[test]
    fn a_thread_reads_one_lock_through_its_slot_and_the_rest_through_words() {
        let a = Arc::new(RwLock::named(&unique("rwlock-bias-a"), 0u64));
        let b = RwLock::named(&unique("rwlock-bias-b"), 0u64);
        assert!(biased_after_a_read(&a) && biased_after_a_read(&b));
        let first = a.read();
        let again = a.read_recursive();
        let other = b.read();
        assert!(read_through_a_slot(&a));
        assert!(!a.raw().inner.is_locked(), "the second hold counts in the slot");
        assert!(b.raw().inner.is_locked(), "another lock went through its word");
        // Either release may come first; the slot is free after both.
        drop(first);
        assert!(read_through_a_slot(&a), "one hold is still out");
        blocked_until_dropped(&a, again, |l| *l.write() += 1);
        assert!(!read_through_a_slot(&a));
        drop(other);
        assert!(!b.is_locked());
    }

    /// Readers and writers on four threads: a writer changes two halves
    /// together, and no reader ever sees them differ.
    #[test]
    fn readers_never_see_a_write_half_done() {
        let l = Arc::new(RwLock::named(&unique("rwlock-bias-stress"), (0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let l = Arc::clone(&l);
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        if (i + t) % 16 == 0 {
                            let mut w = l.write();
                            w.0 += 1;
                            std::hint::black_box(&mut *w);
                            w.1 += 1;
                        } else {
                            let r = l.read();
                            assert_eq!(r.0, r.1, "a reader saw half a write");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (a, b) = *l.read();
        assert_eq!((a, b), (5_000, 5_000));
    }

    /// A thread that holds a biased read takes it again recursively while
    /// a writer is revoking the bias and waiting for that thread's slot:
    /// through the word it would wait for the writer, which waits for it.
    #[test]
    fn a_recursive_read_does_not_wait_for_a_writer_that_waits_for_it() {
        let l = Arc::new(RwLock::named(&unique("rwlock-bias-recursive"), 0u64));
        assert!(biased_after_a_read(&l));
        let outer = l.read();
        assert!(read_through_a_slot(&l));
        let writer = std::thread::spawn({
            let l = Arc::clone(&l);
            move || *l.write() += 1
        });
        // The writer holds the word and has revoked the bias.
        while l.raw().bias.load(Ordering::Relaxed) || !l.raw().inner.is_locked_exclusive() {
            std::thread::yield_now();
        }
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let reader = std::thread::scope(|_| {
            let inner = l.read_recursive();
            let again = l.try_read_recursive().expect("a further hold of the slot's lock");
            done_tx.send(()).unwrap();
            (*inner, *again)
        });
        done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the recursive read waited for the writer");
        assert_eq!(reader, (0, 0));
        assert!(read_through_a_slot(&l), "the first hold still holds the slot");
        drop(outer);
        writer.join().unwrap();
        assert_eq!(*l.read(), 1);
    }

    /// Every way in, on four threads at once, while the bias comes and
    /// goes: a writer (however it got the lock) changes two halves
    /// together, and no reader (however it got in) sees them differ.
    #[test]
    fn every_acquisition_excludes_writers_while_the_bias_comes_and_goes() {
        let l = Arc::new(RwLock::named(&unique("rwlock-bias-every"), (0u64, 0u64)));
        let write = |w: &mut (u64, u64)| {
            w.0 += 1;
            std::hint::black_box(&mut *w);
            w.1 += 1;
        };
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let l = Arc::clone(&l);
                std::thread::spawn(move || {
                    let mut writes = 0u64;
                    for i in 0..10_000u64 {
                        let check = |r: &(u64, u64)| assert_eq!(r.0, r.1, "a reader saw half a write");
                        match (i * 7 + t) % 23 {
                            0 => {
                                write(&mut l.write());
                                writes += 1;
                            }
                            1 => {
                                if let Some(mut w) = l.try_write() {
                                    write(&mut w);
                                    writes += 1;
                                }
                            }
                            2 => {
                                if let Some(mut w) = l.try_write_for(Duration::from_micros(50)) {
                                    write(&mut w);
                                    writes += 1;
                                }
                            }
                            3 => {
                                let up = l.upgradable_read();
                                check(&up);
                                write(&mut RwLockUpgradableReadGuard::upgrade(up));
                                writes += 1;
                            }
                            4 => {
                                let up = l.upgradable_read();
                                if let Ok(mut w) = RwLockUpgradableReadGuard::try_upgrade(up) {
                                    write(&mut w);
                                    writes += 1;
                                }
                            }
                            5 => check(&l.read_recursive()),
                            6 => {
                                if let Some(r) = l.try_read() {
                                    check(&r);
                                }
                            }
                            7 => {
                                let outer = l.read();
                                let inner = l.read_recursive();
                                check(&outer);
                                drop(outer);
                                check(&inner);
                            }
                            _ => check(&l.read()),
                        }
                    }
                    writes
                })
            })
            .collect();
        let writes: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(*l.read(), (writes, writes));
    }

    #[test]
    fn reads_writes_and_misses() {
        let name = unique("rwlock-basic");
        let l = RwLock::named(&name, 0u32);
        every_hold(&l);
        {
            let a = l.read();
            let b = l.read();
            assert_eq!(*a + *b, 0);
            assert!(l.try_write().is_none());
            assert!(l.try_write_for(Duration::from_millis(1)).is_none());
            assert!(l.try_read().is_some());
        }
        *l.write() += 1;
        {
            let _w = l.write();
            assert!(l.try_read().is_none());
        }
        let r = wait_for(&name, |r| r.stats.total_ops() >= 11);
        assert_eq!(op(&r, op::READ), (2, 0, 0, 0));
        assert_eq!(op(&r, op::TRY_READ), (2, 0, 1, 0));
        assert_eq!(op(&r, op::WRITE), (2, 0, 0, 0));
        assert_eq!(op(&r, op::TRY_WRITE), (2, 1, 2, 1));
        // Every hold sampled: 3 successful read holds, 2 write holds.
        assert_eq!(op(&r, op::READ_UNLOCK), (3, 0, 0, 3));
        assert_eq!(op(&r, op::WRITE_UNLOCK), (2, 0, 0, 2));
    }

    /// Uncontended reads and writes are counted: while the lock lives the
    /// consumer sees the counts that have ended (1, 2, 4 … 64, then every
    /// 64), and once it is dropped, every operation.
    #[test]
    fn uncontended_reads_and_writes_are_counted_and_a_dropped_lock_reports_the_rest() {
        for n in [1u64, 3, 63, 64, 65, 200] {
            let name = unique("rwlock-count");
            let l = RwLock::named(&name, ());
            for _ in 0..n {
                drop(l.read());
            }
            for _ in 0..n {
                drop(l.write());
            }
            // What the counts that ended cover: the highest power of two
            // up to 64, then whole batches of 64.
            let counted = if n < 64 { 1 << n.ilog2() } else { n - n % 64 };
            let live = wait_for(&name, |r| op(r, op::WRITE).0 >= counted);
            assert_eq!(op(&live, op::READ), (counted, 0, 0, 0), "n = {n}");
            assert_eq!(op(&live, op::WRITE), (counted, 0, 0, 0), "n = {n}");
            drop(l);
            let r = wait_for(&name, |r| {
                r.meta.retired_mono_ns.is_some() && op(r, op::WRITE).0 >= n
            });
            assert_eq!(op(&r, op::READ), (n, 0, 0, 0), "n = {n}");
            assert_eq!(op(&r, op::WRITE), (n, 0, 0, 0), "n = {n}");
        }
    }

    /// Four threads reading and writing one lock: the data shows the
    /// writes were exclusive, and after the drop the consumer's totals are
    /// exactly the operations done, contended (pushed one by one) or not
    /// (counted per thread stripe). Few enough that no ring can fill.
    #[test]
    fn every_read_and_write_is_reported_once_under_contention() {
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 3000;
        let name = unique("rwlock-stress");
        let l = Arc::new(RwLock::named(&name, 0u64));
        let start = Arc::new(StdBarrier::new(THREADS as usize));
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (l, start) = (Arc::clone(&l), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..PER_THREAD {
                        if i % 4 == 0 {
                            let mut w = l.write();
                            let seen = *w;
                            std::hint::spin_loop();
                            *w = seen + 1;
                        } else {
                            let r = l.read();
                            std::hint::black_box(*r);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let l = Arc::into_inner(l).unwrap();
        let writes = THREADS * PER_THREAD / 4;
        assert_eq!(*l.read(), writes);
        drop(l);
        // The final read above is one more.
        let reads = THREADS * PER_THREAD - writes + 1;
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 >= reads && op(r, op::WRITE).0 >= writes
        });
        assert_eq!(op(&r, op::READ).0, reads);
        assert_eq!(op(&r, op::WRITE).0, writes);
    }

    #[test]
    fn blocked_writer_and_blocked_reader_record_their_waits() {
        let name = unique("rwlock-contended");
        let l = Arc::new(RwLock::named(&name, 0u32));
        let ready = Arc::new(StdBarrier::new(2));
        // A writer blocks behind a reader …
        let read = l.read();
        let writer = {
            let (l, ready) = (Arc::clone(&l), Arc::clone(&ready));
            std::thread::spawn(move || {
                ready.wait();
                *l.write() += 1;
            })
        };
        ready.wait();
        std::thread::sleep(Duration::from_millis(20));
        drop(read);
        writer.join().unwrap();
        // … and a reader behind a writer.
        let write = l.write();
        let reader = {
            let (l, ready) = (Arc::clone(&l), Arc::clone(&ready));
            std::thread::spawn(move || {
                ready.wait();
                assert_eq!(*l.read(), 1);
            })
        };
        ready.wait();
        std::thread::sleep(Duration::from_millis(20));
        drop(write);
        reader.join().unwrap();
        let r = wait_for(&name, |r| op(r, op::WRITE).1 >= 1 && op(r, op::READ).1 >= 1);
        assert_eq!(op(&r, op::WRITE), (2, 1, 0, 1));
        assert_eq!(op(&r, op::READ), (2, 1, 0, 1));
        let ms15 = crate::clock::calibration().ns_to_ticks(15_000_000);
        for k in [op::WRITE, op::READ] {
            let waited = r.stats.op(k).unwrap().latency().unwrap().max();
            assert!(waited >= ms15, "op {k} waited {waited} ticks");
        }
    }

    /// A thread's records of write holds are kept per lock: holding a
    /// waited-for lock and a plain one, and releasing them in either
    /// order, each release reports its own hold.
    #[test]
    fn write_holds_of_two_locks_report_their_own_records() {
        for release_waited_first in [false, true] {
            let (waited_name, plain_name) = (unique("rwlock-two-waited"), unique("rwlock-two-plain"));
            let waited = Arc::new(RwLock::named(&waited_name, 0u32));
            let plain = RwLock::named(&plain_name, 0u32);
            // Its hold never sampled, so its release needs no record.
            assert!(set_policy_word(
                plain.instance_id().unwrap(),
                PolicyWord::default().with_sample_every(0)
            ));
            plain.refresh_policy();
            let ready = Arc::new(StdBarrier::new(2));
            let reader = {
                let (waited, ready) = (Arc::clone(&waited), Arc::clone(&ready));
                std::thread::spawn(move || {
                    let read = waited.read();
                    ready.wait();
                    std::thread::sleep(Duration::from_millis(20));
                    drop(read);
                })
            };
            ready.wait();
            let first = waited.write();
            let second = plain.write();
            assert_eq!(Writes.held(), 1, "only the waited hold leaves a record");
            if release_waited_first {
                drop(first);
                drop(second);
            } else {
                drop(second);
                drop(first);
            }
            assert_eq!(Writes.held(), 0);
            reader.join().unwrap();
            let r = wait_for(&waited_name, |r| op(r, op::WRITE).1 == 1);
            assert_eq!(op(&r, op::WRITE), (1, 1, 0, 1), "the waited lock's write");
            drop(plain);
            let r = wait_for(&plain_name, |r| op(r, op::WRITE).0 == 1);
            assert_eq!(op(&r, op::WRITE).1, 0, "the plain lock's write did not wait");
        }
    }

    /// Write holds ended by a downgrade or a fair unlock are counted once,
    /// and a bump that hands the lock to a waiting writer keeps each hold's
    /// record apart: the holder's sample and count survive the other
    /// writer's waited, sampled hold.
    #[test]
    fn downgraded_fair_and_bumped_write_holds_are_reported_once() {
        let name = unique("rwlock-bump");
        let l = Arc::new(RwLock::named(&name, 0u32));
        every_hold(&l);
        drop(RwLockWriteGuard::downgrade(l.write()));
        RwLockWriteGuard::unlock_fair(l.write());
        let mut held = l.write();
        let ready = Arc::new(StdBarrier::new(2));
        let waiter = {
            let (l, ready) = (Arc::clone(&l), Arc::clone(&ready));
            std::thread::spawn(move || {
                ready.wait();
                *l.write() += 1;
            })
        };
        ready.wait();
        // Let the waiter park, then hand it the lock and take it back.
        std::thread::sleep(Duration::from_millis(20));
        RwLockWriteGuard::bump(&mut held);
        assert_eq!(*held, 1, "the waiter wrote during the bump");
        drop(held);
        waiter.join().unwrap();
        // The third uncontended write is counted when the lock goes.
        drop(Arc::into_inner(l).unwrap());
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::WRITE).0 >= 4 && op(r, op::WRITE_UNLOCK).0 >= 4
        });
        // Three uncontended writes (counted), one that waited (pushed).
        assert_eq!(op(&r, op::WRITE), (4, 1, 0, 1));
        assert_eq!(op(&r, op::WRITE_UNLOCK), (4, 0, 0, 4));
        // The downgrade's shared hold is not a `read`.
        assert_eq!(op(&r, op::READ).0, 0);
    }

    #[test]
    fn upgrade_downgrade_and_recursive_reads() {
        let name = unique("rwlock-upgrade");
        let l = RwLock::named(&name, vec![1]);
        every_hold(&l);
        let up = l.upgradable_read();
        let r1 = l.read_recursive();
        drop(r1);
        let mut w = RwLockUpgradableReadGuard::upgrade(up);
        w.push(2);
        let rd = RwLockWriteGuard::downgrade(w);
        assert_eq!(*rd, vec![1, 2]);
        drop(rd);
        let up = l.upgradable_read();
        let other = l.read();
        let up = RwLockUpgradableReadGuard::try_upgrade(up).expect_err("a reader is in");
        drop(other);
        let w = RwLockUpgradableReadGuard::try_upgrade(up).expect("alone now");
        drop(w);
        let r = wait_for(&name, |r| op(r, op::UPGRADE).0 >= 3);
        // 2 upgradable + 1 recursive + 1 plain read.
        assert_eq!(op(&r, op::READ).0, 4);
        assert_eq!(op(&r, op::UPGRADE), (3, 0, 1, 0));
        // Write holds reached by upgrade are sampled (downgrade ends one).
        assert_eq!(op(&r, op::WRITE_UNLOCK).0, 2);
        // The recursive read and the plain read were sampled.
        assert_eq!(op(&r, op::READ_UNLOCK).0, 2);
    }

    /// Every shared hold that needs a record gets one, however many a
    /// thread has outstanding, and each release reports its own: ten
    /// `try_read`s held at once, sampled, and two locks read in turn and
    /// released out of order, each counted on its own lock.
    #[test]
    fn outstanding_read_holds_are_each_reported_at_their_release() {
        let name = unique("rwlock-records");
        let other_name = unique("rwlock-records-other");
        let l = RwLock::named(&name, 0u32);
        let other = RwLock::named(&other_name, 0u32);
        // Both sampled at every hold: a thread that takes a lock sampled
        // more coarsely in between samples the next one less often.
        every_hold(&l);
        every_hold(&other);
        let held: Vec<_> = (0..10).map(|_| l.try_read().expect("only readers")).collect();
        assert_eq!(Reads.held(), 10);
        drop(held);
        assert_eq!(Reads.held(), 0);
        for _ in 0..5 {
            let a = l.read();
            let b = other.read();
            drop(a);
            drop(b);
        }
        // An upgradable hold downgraded to a shared one is one `read`.
        drop(RwLockUpgradableReadGuard::downgrade(l.upgradable_read()));
        assert_eq!(Reads.held(), 0);
        drop(l);
        drop(other);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 >= 6
        });
        assert_eq!(op(&r, op::TRY_READ), (10, 0, 0, 0));
        assert_eq!(op(&r, op::READ), (6, 0, 0, 0));
        // Ten `try_read` holds and five `read` holds, all sampled; the
        // downgraded hold is not a read hold of its own.
        assert_eq!(op(&r, op::READ_UNLOCK), (15, 0, 0, 15));
        let o = wait_for(&other_name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 >= 5
        });
        assert_eq!(op(&o, op::READ), (5, 0, 0, 0));
        assert_eq!(op(&o, op::READ_UNLOCK), (5, 0, 0, 5));
    }

    /// An unobserved lock waits like `parking_lot`'s, and leaves no
    /// record behind.
    #[test]
    fn an_unobserved_lock_records_nothing_even_when_it_waits() {
        let l = Arc::new(RwLock::unobserved(0u32));
        let ready = Arc::new(StdBarrier::new(2));
        let write = l.write();
        let reader = {
            let (l, ready) = (Arc::clone(&l), Arc::clone(&ready));
            std::thread::spawn(move || {
                ready.wait();
                let guard = l.read();
                // Its release counts on nothing: the waited read left this
                // lock, uncounted, where the release looks first.
                let remembered = LAST_READ.with(Cell::get) == (l.raw().addr(), std::ptr::null());
                (*guard, Reads.held(), remembered)
            })
        };
        ready.wait();
        std::thread::sleep(Duration::from_millis(10));
        drop(write);
        assert_eq!(reader.join().unwrap(), (0, 0, true));
        let _read = l.try_read().unwrap();
        assert_eq!(Reads.held(), 0);
    }

    /// At the default level (1 in 256) holds are sampled at random, at
    /// that rate in expectation, and a thread alternating between two
    /// locks samples each at its own level (a fixed interval would land
    /// on one of them). Bounds are over four standard deviations; the
    /// thread's draws are seeded by its id, so a run repeats.
    #[test]
    fn read_holds_are_sampled_at_each_locks_level_in_expectation() {
        const ROUNDS: u64 = 64_000;
        let (name_a, name_b) = (unique("rwlock-level-a"), unique("rwlock-level-b"));
        let (a, b) = (RwLock::named(&name_a, ()), RwLock::named(&name_b, ()));
        assert!(set_policy_word(
            b.instance_id().unwrap(),
            PolicyWord::default().with_sample_every(512)
        ));
        b.refresh_policy();
        let mut done = 0;
        while done < ROUNDS {
            for _ in 0..1000 {
                drop(a.read());
                drop(b.read());
            }
            done += 1000;
            // Let the sidecar keep up, so no ring fills (counts come every
            // 64th read, and 1000 is 40 past a multiple of 64).
            wait_for(&name_a, |r| op(r, op::READ).0 >= done - done % 64);
        }
        drop((a, b));
        let ra = wait_for(&name_a, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 == ROUNDS
        });
        let rb = wait_for(&name_b, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 == ROUNDS
        });
        // 250 ± 16 and 125 ± 11 expected.
        let (sa, sb) = (op(&ra, op::READ_UNLOCK).0, op(&rb, op::READ_UNLOCK).0);
        assert!((185..=315).contains(&sa), "a: {sa} of {ROUNDS} sampled");
        assert!((80..=170).contains(&sb), "b: {sb} of {ROUNDS} sampled");
    }

    /// Plain `read`s and `write`s pick up a level a consumer sets when
    /// their counts are pushed, without an explicit refresh: sampling
    /// turned off, then every hold, then off again.
    #[test]
    fn counted_reads_and_writes_follow_a_level_set_by_the_consumer() {
        let name = unique("rwlock-count-refresh");
        let l = RwLock::named(&name, ());
        let id = l.instance_id().unwrap();
        for every in [0, 1, 0] {
            assert!(set_policy_word(
                id,
                PolicyWord::default().with_sample_every(every)
            ));
            for _ in 0..640 {
                drop(l.read());
                drop(l.write());
            }
        }
        drop(l);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 == 1920 && op(r, op::WRITE).0 == 1920
        });
        let (reads, writes) = (op(&r, op::READ_UNLOCK).0, op(&r, op::WRITE_UNLOCK).0);
        // The first 128 rounds after a change may still run at the old
        // level (the new one comes with a count): at least the last 512
        // of the 640 sampled holds, at most all 640 and 128 after.
        assert!((512..=768).contains(&reads), "{reads} read holds sampled");
        assert!((512..=768).contains(&writes), "{writes} write holds sampled");
    }

    /// A draw that an observed lock's count leaves waits for that thread's
    /// next acquisition of an observed lock: writes to an unobserved lock
    /// in between do not take it. At a level of 1 in 64 each count's draw
    /// (weight 64) samples the next observed hold for certain.
    #[test]
    fn unobserved_writes_leave_an_observed_locks_draws_alone() {
        const ROUNDS: u64 = 6400;
        let name = unique("rwlock-draws-kept");
        let observed = RwLock::named(&name, ());
        let unobserved = RwLock::unobserved(());
        assert!(set_policy_word(
            observed.instance_id().unwrap(),
            PolicyWord::default().with_sample_every(64)
        ));
        observed.refresh_policy();
        for _ in 0..ROUNDS {
            drop(observed.read());
            drop(unobserved.write());
        }
        drop(observed);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 == ROUNDS
        });
        // The counts at the 128th, 192nd ... 6,336th read cover 64 each:
        // 98 certain samples. The counts at the 1st, 2nd, 4th ... 64th
        // cover 64 between them, and the first read draws with weight 1:
        // one more in expectation, eight at most. (Taken by the writes,
        // the draws would leave none.)
        let samples = op(&r, op::READ_UNLOCK).0;
        assert!(
            (98..=106).contains(&samples),
            "{samples} of {ROUNDS} read holds sampled"
        );
    }

    /// A lock only ever taken by `try_read` and `try_write` has no counts,
    /// so no draws: its holds are sampled by the thread's operation
    /// number, and it re-reads its policy word on its own (every 1,024
    /// operations of the thread), without an explicit refresh.
    #[test]
    fn a_lock_taken_only_by_try_is_sampled_and_follows_its_policy() {
        let name = unique("rwlock-try-only");
        let l = RwLock::named(&name, ());
        assert!(set_policy_word(
            l.instance_id().unwrap(),
            PolicyWord::default().with_sample_every(1)
        ));
        for _ in 0..1100 {
            drop(l.try_read().expect("free"));
        }
        for _ in 0..100 {
            drop(l.try_read().expect("free"));
            drop(l.try_write().expect("free"));
        }
        drop(l);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::TRY_WRITE).0 == 100
        });
        assert_eq!(op(&r, op::TRY_READ).0, 1200);
        // Every hold once the new level was read (by the 1,024th operation
        // at the latest), a few at the default level before.
        let read_samples = op(&r, op::READ_UNLOCK).0;
        assert!(
            (176..=200).contains(&read_samples),
            "{read_samples} of 1200 read holds sampled"
        );
        assert_eq!(op(&r, op::WRITE_UNLOCK), (100, 0, 0, 100));
    }

    #[test]
    fn read_hold_samples_follow_the_policy_and_drop_unregisters() {
        let name = unique("rwlock-sampling");
        let l = RwLock::named(&name, ());
        let id = l.instance_id().unwrap();
        assert!(set_policy_word(id, PolicyWord::default().with_sample_every(0)));
        l.refresh_policy();
        // A multiple of 64: the last read's count leaves this thread a
        // draw, so the next read draws at the level set below.
        for _ in 0..3008 {
            drop(l.read());
        }
        assert!(set_policy_word(id, PolicyWord::default().with_sample_every(1)));
        l.refresh_policy();
        for _ in 0..10 {
            let _a = l.read();
            let _b = l.read();
        }
        drop(l);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && op(r, op::READ).0 >= 3028
        });
        // None of the 3,008 while sampling was off, every one since.
        assert_eq!(op(&r, op::READ_UNLOCK), (20, 0, 0, 20));
        assert_eq!(super::super::policy_word(id), None);
    }
}
