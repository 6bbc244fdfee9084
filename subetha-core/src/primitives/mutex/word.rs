//! The lock word of [`RawMutex`]: `parking_lot`'s lock and
//! parked bits, then a count of uncontended `lock`s, and the wake token.

use crate::primitives::counting;

pub(super) use super::protocol::{
    COUNT_BITS, COUNT_MAX, COUNT_ONE, COUNT_SHIFT, LOCKED_BIT, PARKED_BIT, TOKEN_HANDOFF_BIT,
};
/// The clock bits of an unpark token (the tick reading, truncated).
pub(super) const TOKEN_TICKS_MASK: usize = usize::MAX >> 1;

/// Ticks from the clock reading a wake-up's `token` carries to `now`, at
/// least 1; `None` if it carries none, or if `now` reads before it (clocks
/// of two CPUs out of step). Wraps with the token's width, which only a
/// 32-bit target (2^31 ticks, under a second) could reach.
pub(super) fn wake_ticks(token: usize, now: u64) -> Option<u64> {
    let sent = token >> 1;
    if sent == 0 {
        return None;
    }
    let elapsed = (now as usize & TOKEN_TICKS_MASK).wrapping_sub(sent) & TOKEN_TICKS_MASK;
    (elapsed <= TOKEN_TICKS_MASK / 2).then(|| (elapsed as u64).max(1))
}
/// `pause`s between two polls of the lock word while an adaptive lock spins
/// (~40 ns on current x86): a release is seen at once, and the spinning
/// waiter only reads the word, so it does not steal the line from the owner.
pub(super) const PAUSES_PER_POLL: u32 = 4;

/// Uncontended `lock`s per count observation once a lock is past its first
/// 64 (see the module docs). A power of two that divides the lock word's
/// count range.
pub const COUNT_BATCH: u32 = crate::primitives::counting::BATCH as u32;
const _: () = assert!(COUNT_BATCH.is_power_of_two() && COUNT_BATCH <= COUNT_MAX as u32 + 1);

/// The lock word's count of uncontended `lock`s (modulo 2^14), read from the
/// word a release replaced: which counts are due is decided after the release,
/// from the value its atomic add returns, so the hold itself does no
/// bookkeeping. (Any work inside the every-64th hold, even one `rdtsc`, makes
/// an occasional hold longer, and an occasional longer hold can tip two
/// threads from alternating into colliding; see the module docs.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LockCount(pub(super) u16);

impl LockCount {
    /// The count in a lock word.
    pub(super) fn of_word(word: u16) -> Self {
        Self(word >> COUNT_SHIFT)
    }

    /// In the first [`COUNT_BATCH`] of the word's count: of the lock's
    /// life, or of a wrap of the 14-bit count, which starts the early
    /// counts again (they add up to one batch, so totals stay exact).
    pub(super) fn young(self) -> bool {
        u32::from(self.0) < COUNT_BATCH
    }

    /// The cheap test a release runs: may [`due`](Self::due) or a policy
    /// refresh be due for the `lock` taken at this count?
    #[inline(always)]
    pub(super) fn may_be_due(self) -> bool {
        u32::from(self.0) % COUNT_BATCH == COUNT_BATCH - 1 || self.young()
    }

    /// Whether the uncontended `lock` taken at this count (the
    /// `self.0 + 1`-th of the word's count) ends a count: the 1st, 2nd,
    /// 4th … 64th of the lock's life, then every [`COUNT_BATCH`]th.
    /// Returns how many `lock`s the count covers.
    /// (The [`counting`] schedule, on the
    /// word's count.)
    pub(super) fn due(self) -> Option<u32> {
        counting::count_ending_at(u64::from(self.0) + 1).map(|n| n as u32)
    }

    /// Whether the `lock` taken at this count is the last of a batch of
    /// [`COUNT_BATCH`] (it schedules a hold-sampler draw, see [`HoldDraw`]).
    pub(super) fn ends_a_batch(self) -> bool {
        u32::from(self.0) % COUNT_BATCH == COUNT_BATCH - 1
    }

    /// Whether the `lock` taken at this count is due to re-read the policy
    /// word (every [`REFRESH_EVERY`](crate::primitives::REFRESH_EVERY)th).
    pub(super) fn refresh_due(self) -> bool {
        u32::from(self.0) % crate::primitives::REFRESH_EVERY == crate::primitives::REFRESH_EVERY - 1
    }

    /// How many of the `lock`s counted so far no count covers yet.
    pub(super) fn uncounted(self) -> u32 {
        counting::uncounted(u64::from(self.0)) as u32
    }

    /// The count after one more `lock`.
    #[cfg(test)]
    pub(super) fn next(self) -> Self {
        Self(if self.0 == COUNT_MAX { 0 } else { self.0 + 1 })
    }
}

const _: () = assert!(crate::primitives::REFRESH_EVERY.is_multiple_of(COUNT_BATCH));
