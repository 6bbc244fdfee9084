//! What a hold's release reports, left on the holding thread by its
//! acquisition ([`HoldReport`]), and the thread's hold-sampler draw.

use super::*;

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
pub(super) struct HoldReport {
    /// The lock's address.
    pub(super) lock: usize,
    /// The acquisition the release reports: 0 = none (the hold was not
    /// acquired by a `read` or `write`: the shared end of a downgrade);
    /// the side's [`PLAIN`](Side::PLAIN) op with `flags` 0 = an
    /// uncontended acquisition (of a sampled hold), counted; anything else
    /// is pushed.
    pub(super) op: u16,
    pub(super) flags: u16,
    pub(super) latency: u64,
    /// Ticks when a sampled hold began; 0 = not sampled.
    pub(super) hold_start: u64,
    /// The acquisition's [`SiteWord`] (a wait's call site), pushed with it.
    pub(super) sites: u32,
}

impl HoldRecord for HoldReport {
    fn lock(&self) -> usize {
        self.lock
    }
}

hold_records! {
    /// This thread's outstanding [`HoldReport`]s of shared holds (see
    /// [`held`](mod@crate::primitives::held)).
    pub(super) struct Reads: HoldReport;
}

hold_records! {
    /// This thread's outstanding [`HoldReport`]s of exclusive holds.
    pub(super) struct Writes: HoldReport;
}

/// A kind of hold and its table of reports.
pub(super) trait Side: Records<Record = HoldReport> {
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
    pub(super) static LAST_READ: Cell<(usize, *const OpCounts<2>)> = const { Cell::new((0, std::ptr::null())) };
    /// The [`SiteWord`] of the wait being recorded, set by the slow paths
    /// around their `acquired_*` call for [`RawRwLock::record`] to take
    /// (so the fast paths' reports need no site argument).
    pub(super) static WAIT_SITES: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` (an `acquired_*` of a wait) with `sites` left for `record`.
#[inline]
pub(super) fn with_wait_sites(sites: u32, f: impl FnOnce()) {
    WAIT_SITES.set(sites);
    f();
    WAIT_SITES.set(0);
}

/// This thread's draw of the `RwLock`s' hold sampler ([`HoldDraw`]; see the
/// module docs), paid by its next acquisition of an observed `RwLock`.
pub(super) const DRAWS: HoldDraw = HoldDraw::RWLOCK;
