//! [`RawRwLock`]: `parking_lot::RawRwLock` with the reader bias, the
//! counts and the observations of one instance.

use super::hold::*;
use super::*;

/// Decided before an acquisition's atomic operation: whether its hold is
/// sampled, and if so a clock reading the hold can start from.
#[derive(Clone, Copy)]
pub(super) struct Ticket {
    /// Ticks just before the acquisition of a sampled hold; 0 = not
    /// sampled.
    pub(super) start: u64,
    /// The draw found the lock unbiased: a shared acquisition through the
    /// lock word may bias it again (see [`reader_bias`]).
    pub(super) rebias: bool,
}

impl Ticket {
    /// The ticket of an acquisition reported on its own (a `try_*`, a
    /// timed one, an upgrade): it pays no draw, and its hold is sampled
    /// by [`RawRwLock::sample_reported`]. Also the ticket of an
    /// acquisition with no draw due.
    pub(super) const REPORTED: Ticket = Ticket {
        start: 0,
        rebias: false,
    };

    /// The start of the hold this ticket began if it is sampled (the end
    /// of its wait, `now`, when it waited), else 0.
    #[inline(always)]
    pub(super) fn hold_start(self, now: u64) -> u64 {
        match (self.start, now) {
            (0, _) => 0,
            (start, 0) => start,
            (_, now) => now,
        }
    }
}

/// What only an observed lock needs, out of line: the counts of
/// uncontended operations, and the reader bias's policy.
pub(super) struct Observed {
    /// Uncontended [`op::READ`]s (index 0) and [`op::WRITE`]s (1).
    pub(super) counts: OpCounts<2>,
    /// When the reader bias may be set again.
    pub(super) bias_policy: BiasPolicy,
}

/// The raw lock behind [`RwLock`]: a [`parking_lot::RawRwLock`] plus the
/// bookkeeping of one instance.
///
/// `repr(C)`, 40 bytes, with `parking_lot`'s lock word last: `lock_api`
/// puts the data right after the raw lock, and the allocator promises
/// only 16-byte alignment, so the word and the first 8 bytes of the data
/// share the one 16-byte chunk that is always in a single cache line, as
/// they do in `parking_lot::RwLock` (see [`RawMutex`](crate::primitives::RawMutex)
/// for the same reasoning). (With the word first, 48 bytes, a `u64` behind an
/// `Arc` would sit on the next line, one more line moved per hand-over: the
/// `rwlock` group's `unobserved/mixed/2` row.)
///
/// | bytes | fields | read | written |
/// |---|---|---|---|
/// | 0–15 | `sampler`, `registration`, `bias` | `bias`: every operation; the rest every 64th and slow paths | the bias's changes; a policy refresh, at most once a millisecond |
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
    pub(super) sampler: Sampler,
    pub(super) registration: Registration,
    /// Set: reads may take the lock through their thread's reader slot,
    /// without touching the lock word (see [`reader_bias`]). Only ever
    /// set on an observed lock, by a reader holding the word shared.
    pub(super) bias: AtomicBool,
    /// Unused: keeps the word in the chunk the data starts in (see the
    /// table).
    pub(super) _spare: [u8; 8],
    /// `None` when unobserved. Boxed: the count stripes take 512 bytes,
    /// and a lock nobody observes should stay the size of `parking_lot`'s
    /// plus a few words.
    pub(super) observed: Option<Box<Observed>>,
    pub(super) inner: parking_lot::RawRwLock,
}

/// How long a writer that holds the word waits for biased readers to
/// leave.
#[derive(Clone, Copy)]
pub(super) enum Revocation {
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
/// before the registration (dropped after this) unregisters the instance.
impl Drop for RawRwLock {
    fn drop(&mut self) {
        let Some(observed) = self.observed.as_mut() else {
            return;
        };
        reader_bias::forget_lock(std::ptr::from_ref(&observed.counts).addr());
        let [read, write] = observed.counts.take_uncounted();
        for (op, rest) in [(op::READ, read), (op::WRITE, write)] {
            if rest != 0 {
                self.registration.emit(op, COUNT, rest);
            }
        }
    }
}

impl fmt::Debug for RawRwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawRwLock")
            .field("instance_id", &self.registration.id())
            .field("locked", &self.inner.is_locked())
            .finish()
    }
}

impl RawRwLock {
    pub(super) const fn unobserved() -> Self {
        Self {
            inner: <parking_lot::RawRwLock as lock_api::RawRwLock>::INIT,
            _spare: [0; 8],
            bias: AtomicBool::new(false),
            sampler: Sampler::new(),
            registration: Registration::NONE,
            observed: None,
        }
    }

    pub(super) fn register(name: Option<&str>, site: &'static Location<'static>) -> Self {
        let registration = Registration::register(KIND, name, site);
        // A lock the instance table had no room for stays unobserved.
        let observed = registration.id().map(|_| {
            Box::new(Observed {
                counts: OpCounts::new(),
                bias_policy: BiasPolicy::new(),
            })
        });
        let mut raw = Self::unobserved();
        raw.registration = registration;
        raw.observed = observed;
        raw.refresh_policy();
        raw
    }

    /// The instance id, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.registration.id()
    }

    /// Re-reads the policy word now and returns it.
    pub fn refresh_policy(&self) -> PolicyWord {
        let word = self.registration.policy_word();
        self.sampler.apply(word);
        word
    }

    pub(super) fn addr(&self) -> usize {
        self as *const Self as usize
    }

    /// The lock's counts, read while it is held, for after its release.
    #[inline(always)]
    pub(super) fn counts(&self) -> Option<&OpCounts<2>> {
        self.observed.as_deref().map(|observed| &observed.counts)
    }

    /// Takes a [`Ticket`] for the acquisition about to be tried: one
    /// thread-local read, and out of line the draw this thread owes.
    #[inline(always)]
    pub(super) fn ticket(&self) -> Ticket {
        let weight = DRAWS.owed();
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
    /// An unobserved lock pays no draw ([`HoldDraw::pass_by`]).
    #[cold]
    #[inline(never)]
    pub(super) fn drawn_ticket(&self, weight: u32) -> Ticket {
        if self.observed.is_none() {
            DRAWS.pass_by(weight);
            return Ticket::REPORTED;
        }
        let sampled = DRAWS.pay(weight, self.sampler.mask(), BATCH as u32);
        Ticket {
            start: if sampled { clock::ticks().max(1) } else { 0 },
            rebias: !self.bias.load(Ordering::Relaxed),
        }
    }

    /// Counts an uncontended `read` or `write` (`op`), after its release.
    #[inline(always)]
    pub(super) fn count(&self, counts: Option<&OpCounts<2>>, op: u16) {
        let counter = usize::from(op == op::WRITE);
        if let Some(counts) = counts
            && let Some(covered) = counts.add(counter)
        {
            self.emit_count(op, covered);
        }
    }

    /// Whether the hold of an acquisition reported on its own (a `try_*`,
    /// a timed or waited acquisition, an upgrade) is sampled, by the
    /// thread's operation number, as the [`Mutex`](crate::primitives::Mutex) samples
    /// its `try_lock`s and waits: no count covers these, so no draw would
    /// come for a lock only ever taken that way. Also re-reads the policy
    /// word when due (such a lock has no counts to do it). Returns the
    /// hold's start (`now` if the acquisition read the clock, else the
    /// clock now) or 0.
    pub(super) fn sample_reported(&self, now: u64) -> u64 {
        self.sampler
            .bookkeeping(&self.registration, next_thread_op(), now)
    }

    /// Pushes a count, out of line so the acquisition stays short; leaves
    /// this thread a draw of the hold sampler for the operations it covers
    /// and picks up a new policy word.
    #[cold]
    #[inline(never)]
    pub(super) fn emit_count(&self, op: u16, covered: u64) {
        self.registration.emit(op, COUNT, covered);
        DRAWS.owe(u32::try_from(covered).unwrap_or(u32::MAX));
        self.refresh_policy();
    }

    /// A shared hold has begun: leaves what its release reports (`op`
    /// with `flags` and `latency`, see [`HoldReport`]) on this thread,
    /// unless that is an unsampled, uncontended `read` (its release
    /// counts it). `now` is a clock reading at the acquisition, 0 if none.
    #[inline(always)]
    pub(super) fn acquired_shared(&self, op: u16, flags: u16, latency: u64, ticket: Ticket, now: u64) {
        self.remember_shared_hold();
        self.leave_read_record(op, flags, latency, ticket, now);
    }

    /// [`acquired_shared`](Self::acquired_shared) after
    /// [`remember_shared_hold`](Self::remember_shared_hold).
    #[inline(always)]
    pub(super) fn leave_read_record(&self, op: u16, flags: u16, latency: u64, ticket: Ticket, now: u64) {
        self.leave_report(Reads, op, flags, latency, ticket, now);
    }

    /// After an acquisition on `side`: leaves what its release reports,
    /// unless that is a count (an uncontended acquisition whose hold is not
    /// sampled). `now` is a clock reading at the acquisition, 0 if none.
    #[inline(always)]
    pub(super) fn leave_report<S: Side>(
        &self,
        side: S,
        op: u16,
        flags: u16,
        latency: u64,
        ticket: Ticket,
        now: u64,
    ) {
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
    pub(super) fn remember_shared_hold(&self) -> *const OpCounts<2> {
        let counts = self.counts_ptr();
        LAST_READ.with(|last| last.set((self.addr(), counts)));
        counts
    }

    /// [`counts`](Self::counts) as a pointer, null when unobserved. Its
    /// address is also the lock's name in reader slots: it stays put when
    /// the lock moves, and is freed only with the lock.
    #[inline(always)]
    pub(super) fn counts_ptr(&self) -> *const OpCounts<2> {
        self.counts().map_or(std::ptr::null(), std::ptr::from_ref)
    }

    /// A shared acquisition through this thread's reader slot, tried while
    /// the lock is biased. `counts`: [`counts_ptr`](Self::counts_ptr).
    #[inline(always)]
    pub(super) fn read_biased(&self, counts: *const OpCounts<2>) -> bool {
        self.bias.load(Ordering::Relaxed) && reader_bias::try_enter(counts.addr(), &self.bias)
    }

    /// [`read_biased`](Self::read_biased) for a recursive read: also a
    /// further hold of a lock this thread holds through its slot while a
    /// writer revokes the bias (through the word it would wait for that
    /// writer, which waits for this thread).
    #[inline(always)]
    pub(super) fn read_biased_recursive(&self, counts: *const OpCounts<2>) -> bool {
        !counts.is_null() && (reader_bias::reenter(counts.addr()) || self.read_biased(counts))
    }

    /// After a shared acquisition through the lock word: biases the lock
    /// again if the ticket's draw found it unbiased and its policy allows.
    /// The caller holds the word shared, so no writer holds the lock.
    #[inline(always)]
    pub(super) fn rebias_if_due(&self, ticket: Ticket) {
        if ticket.rebias {
            self.rebias();
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn rebias(&self) {
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
    pub(super) fn exclude_biased_readers(&self, deadline: Revocation) -> Result<u64, ()> {
        if !self.bias.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.revoke_bias(deadline)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn revoke_bias(&self, deadline: Revocation) -> Result<u64, ()> {
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
    pub(super) unsafe fn excluded_or_given_back(&self, deadline: Revocation, upgraded: bool) -> bool {
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
    pub(super) fn exclude_then_report(&self, op: u16, ticket: Ticket) {
        match self.exclude_biased_readers(Revocation::Wait) {
            Ok(0) => self.acquired_exclusive(op, 0, 0, ticket, 0),
            waited => {
                let sites = SiteWord::own(self.registration.site_id(Location::caller())).0;
                with_wait_sites(sites, || {
                    self.acquired_exclusive(op, CONTENDED, waited.unwrap_or(1), ticket, 0)
                });
            }
        }
    }

    /// A `try_write`'s acquisition: the word if free, and no biased reader
    /// inside.
    #[inline(always)]
    pub(super) fn try_write_now(&self) -> bool {
        // SAFETY: `try_lock_exclusive` just took the word exclusively.
        self.inner.try_lock_exclusive() && unsafe { self.excluded_or_given_back(Revocation::Now, false) }
    }

    /// A timed `try_write` once its immediate attempt failed: waits for
    /// the word, then for the biased readers, until `deadline`.
    #[track_caller]
    pub(super) fn write_until(&self, ticket: Ticket, deadline: Instant) -> bool {
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
    pub(super) unsafe fn upgrade_until(&self, deadline: Option<Instant>) -> bool {
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
    pub(super) fn exclusive_then_exclude(&self, lock: impl FnOnce(&parking_lot::RawRwLock)) {
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
    pub(super) fn record<S: Side>(&self, side: S, mut report: HoldReport, now: u64) {
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
    pub(super) unsafe fn end_read_hold(&self, fair: bool) {
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
    pub(super) unsafe fn release_shared(&self, fair: bool, counts: *const OpCounts<2>) {
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
    pub(super) fn report_recorded<S: Side>(&self, side: S, counts: Option<&OpCounts<2>>) {
        let Some(report) = side.take(self.addr()) else {
            self.count(counts, S::PLAIN);
            return;
        };
        match (report.op, report.flags) {
            (0, _) => {}
            (op, 0) if op == S::PLAIN => self.count(counts, op),
            (op, flags) => {
                self.registration
                    .emitter()
                    .emit_sites(op, flags, report.latency, SiteWord(report.sites))
            }
        }
        if report.hold_start != 0 {
            self.registration.emit(S::UNLOCK, 0, since(report.hold_start));
        }
    }

    /// After an exclusive acquisition: see
    /// [`leave_report`](Self::leave_report). Nothing is counted or pushed
    /// inside the hold.
    #[inline(always)]
    pub(super) fn acquired_exclusive(&self, op: u16, flags: u16, latency: u64, ticket: Ticket, now: u64) {
        self.leave_report(Writes, op, flags, latency, ticket, now);
    }

    /// After a write hold's release (or downgrade): counts an uncontended
    /// `write`; else reports this thread's record of the hold. `counts`
    /// was read before the release, so nothing here reads the lock's own
    /// line but the registration of a push.
    #[inline(always)]
    pub(super) fn report_write_end(&self, counts: Option<&OpCounts<2>>) {
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
    pub(super) unsafe fn end_write_hold(&self, release: impl FnOnce(&parking_lot::RawRwLock)) {
        let counts = self.counts();
        release(&self.inner);
        self.report_write_end(counts);
    }

    /// The shared hold a downgrade leaves is not a `read`: its release
    /// must not count one.
    pub(super) fn downgraded_to_shared(&self) {
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
    pub(super) fn wait_for(
        &self,
        op: u16,
        exclusive: bool,
        ticket: Ticket,
        wait: impl FnOnce(&parking_lot::RawRwLock),
    ) {
        if self.observed.is_none() {
            wait(&self.inner);
            if !exclusive {
                self.remember_shared_hold();
            }
            return;
        }
        // Interned before the wait, so it is not part of the measured wait.
        let sites = SiteWord::own(self.registration.site_id(Location::caller())).0;
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
    pub(super) fn timed(
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
        let sites = SiteWord::own(self.registration.site_id(Location::caller()));
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
                .registration
                .emitter()
                .emit_sites(op, CONTENDED | MISS, waited, sites),
        }
        acquired
    }

    #[inline(always)]
    #[track_caller]
    pub(super) fn try_shared(&self, op: u16, ticket: Ticket, acquired: bool) -> bool {
        if acquired {
            self.acquired_shared(op, 0, 0, ticket, 0);
        } else {
            self.registration.emit_at(op, MISS, 0, Location::caller());
        }
        acquired
    }

    #[inline(always)]
    #[track_caller]
    pub(super) fn try_exclusive(&self, op: u16, ticket: Ticket, acquired: bool) -> bool {
        if acquired {
            self.acquired_exclusive(op, 0, 0, ticket, 0);
        } else {
            self.registration.emit_at(op, MISS, 0, Location::caller());
        }
        acquired
    }
}
