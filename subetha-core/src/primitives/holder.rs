//! Holder attribution: which call site held the [`Mutex`](super::Mutex)
//! whose release ended a wait (Go's mutex profile, "blame the slow critical
//! section"), without a single store on the uncontended path.
//!
//! A hold whose acquisition site is known — it waited, was a `try_lock`, was
//! hold-sampled, or began while threads were parked — leaves a *stamp* when
//! it is released: its site and the lock word's count just after the
//! release, in a per-instance word of this process (not in the lock, whose
//! layout keeps the lock word and the data in one cache line). A plain
//! uncontended hold leaves none, but its release adds one to the lock
//! word's count. A waiter that gets the lock compares the count it finds
//! with the stamp's: equal means the hold just before it was the stamped
//! one, and its wait is charged to that site; otherwise the holder is not
//! known (site 0). The count is 14 bits, so a stale stamp is taken for the
//! last hold only if exactly a multiple of 16,384 plain holds came between.
//!
//! What that means for users: holder sites are exact when every hold is
//! sampled (policy level 1, see [`PolicyWord`](super::PolicyWord)) and
//! otherwise cover the sampled share of holds (1 in 256 by default); the
//! rest is reported as an unknown holder, never guessed. A wait is charged
//! whole to the hold released just before the waiter took the lock, even
//! if it also waited through earlier holds (with more than two threads, Go
//! charges each release only the wait since the previous one; a hand-off
//! is charged to the releasing hold like any other release).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::registry::{entry_index, id_generation};

const VALID: u64 = 1 << 63;

fn stamps() -> Option<&'static [AtomicU64]> {
    static STAMPS: OnceLock<Box<[AtomicU64]>> = OnceLock::new();
    let table = STAMPS.get_or_init(|| {
        let capacity = crate::registry::process_segment().map_or(0, |s| s.view().layout().instance_capacity);
        (0..capacity).map(|_| AtomicU64::new(0)).collect()
    });
    Some(&table[..])
}

fn slot(id: u32) -> Option<&'static AtomicU64> {
    stamps()?.get(entry_index(id)? as usize)
}

fn pack(id: u32, site: u16, count: u16) -> u64 {
    VALID | u64::from(id_generation(id)) << 32 | u64::from(count) << 16 | u64::from(site)
}

/// The hold of instance `id` acquired at `site` is being released; the lock
/// word's count bits will read `count_after`. Called by the holder before
/// the release (whose `Release` publishes it).
pub(crate) fn stamp(id: u32, site: u16, count_after: u16) {
    if let Some(slot) = slot(id) {
        slot.store(pack(id, site, count_after), Ordering::Relaxed);
    }
}

/// A waiter that just took the lock of instance `id`, whose count bits read
/// `count_now`: the site of the hold released just before, or 0.
pub(crate) fn holder(id: u32, count_now: u16) -> u16 {
    let Some(slot) = slot(id) else { return 0 };
    let stamp = slot.load(Ordering::Relaxed);
    let matches = stamp & VALID != 0
        && (stamp >> 32) as u16 == id_generation(id) as u16
        && (stamp >> 16) as u16 == count_now;
    if matches { stamp as u16 } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_names_the_hold_only_while_the_count_matches() {
        super::super::test_support::init();
        let m = crate::Mutex::named(&super::super::test_support::unique("holder-stamp"), ());
        let id = m.instance_id().unwrap();
        assert_eq!(holder(id, 4), 0, "no stamp yet");
        stamp(id, 7, 4);
        assert_eq!(holder(id, 4), 7);
        assert_eq!(holder(id, 8), 0, "a plain hold came between");
        let other_generation = id ^ (1 << 16);
        assert_eq!(
            holder(other_generation, 4),
            0,
            "an entry reused by another instance"
        );
    }
}
