//! The spin budget of a contended acquisition: the policy word's `SPIN`
//! field ([`PolicyWord::spin_ns`]) in clock ticks. The [`Mutex`](super::Mutex)
//! of an [`AdaptiveMutex`](super::AdaptiveMutex) spins until
//! [`spin_deadline`] before it parks.

use std::sync::OnceLock;

use super::PolicyWord;
use crate::clock;

/// Spin budget while the policy word's `SPIN` field is unset.
pub const DEFAULT_SPIN_NS: u64 = 1024;

/// The tick until which a contended acquisition that started at `start`
/// may spin under `word` (`start` itself when the budget is 0).
#[inline]
pub(crate) fn spin_deadline(start: u64, word: PolicyWord) -> u64 {
    let budget_ns = word.spin_ns().unwrap_or(DEFAULT_SPIN_NS);
    start.saturating_add(budget_ns / PolicyWord::SPIN_UNIT_NS * ticks_per_spin_unit())
}

/// Ticks per [`PolicyWord::SPIN_UNIT_NS`], measured once.
pub(crate) fn ticks_per_spin_unit() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| clock::calibration().ns_to_ticks(PolicyWord::SPIN_UNIT_NS).max(1))
}
