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

use crate::instance_id::{entry_index, id_generation};

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
    use super::super::test_support::{init, unique, wait_for};
    use super::*;
    use crate::primitives::{PolicyWord, mutex, set_policy_word};
    use crate::site::read_site;
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    fn site_line(id: u16) -> u32 {
        let segment = crate::registry::process_segment().unwrap();
        read_site(segment.view().sites(), id).unwrap().line
    }

    #[test]
    fn a_wait_names_its_own_line_and_the_line_whose_hold_it_waited_for() {
        init();
        let name = unique("holder-lines");
        let m = Arc::new(crate::Mutex::named(&name, ()));
        // Every hold sampled: every holder site known.
        assert!(set_policy_word(
            m.instance_id().unwrap(),
            PolicyWord::default().with_sample_every(1)
        ));
        m.refresh_policy();
        let step = Arc::new(Barrier::new(2));
        let holder_line = line!() + 5;
        let holder = {
            let (m, step) = (Arc::clone(&m), Arc::clone(&step));
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let guard = m.lock();
                    step.wait();
                    std::thread::sleep(Duration::from_millis(3));
                    drop(guard);
                    step.wait();
                }
            })
        };
        let waiter_line = line!() + 3;
        for _ in 0..5 {
            step.wait();
            drop(m.lock());
            step.wait();
        }
        holder.join().unwrap();
        let r = wait_for(&name, |r| {
            r.sites.waiters.iter().any(|(&(op, id), row)| {
                op == mutex::op::LOCK && site_line(id) == waiter_line && row.contended >= 5
            })
        });
        let (&(_, waiter), row) = r
            .sites
            .waiters
            .iter()
            .find(|((_, id), _)| site_line(*id) == waiter_line)
            .unwrap();
        assert_eq!(row.contended, 5, "{:?}", r.sites);
        let (_, charged) = r
            .sites
            .holders
            .iter()
            .find(|((op, id), _)| *op == mutex::op::LOCK && *id != 0 && site_line(*id) == holder_line)
            .unwrap_or_else(|| panic!("no holder row for line {holder_line}: {:?}", r.sites));
        assert_eq!(charged.waits, 5, "{:?}", r.sites);
        assert_eq!(
            charged.wait_ticks,
            row.wait_ticks(),
            "the same waits, charged to the holder"
        );
        let ms = crate::clock::calibration().ticks_to_ns(row.wait_ticks()) / 1_000_000;
        assert!(ms >= 10, "five waits behind 3 ms holds: {ms} ms");
        assert_ne!(waiter, 0);
    }

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
