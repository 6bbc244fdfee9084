//! Model check of ring-slot adoption against the consumer's free. Under
//! loom the segment, registry and drainer are not compiled, so this models
//! their protocol: the same state transitions and orderings as the
//! registry's `SlotGuard::drop` and `try_claim` and the drainer's
//! `free_slot`, on loom atomics around a real ring.
//! `RUSTFLAGS="--cfg loom" cargo test -p subetha-core --lib --release loom`.
use crate::observation::Observation;
use crate::ring::ObservationRing;
/// The values of `segment::slot_state`.
mod slot_state {
    pub const FREE: u32 = 0;
    pub const CLAIMED: u32 = 1;
    pub const ACTIVE: u32 = 2;
    pub const ORPHANED: u32 = 3;
}
use crate::sync::{AtomicU32, Ordering};
use loom::sync::Arc;

struct Slot {
    state: AtomicU32,
    owner: AtomicU32,
    ring: ObservationRing,
}

fn obs(seq: u32) -> Observation {
    Observation {
        instance_id: seq,
        op_kind: 1,
        flags: 0,
        latency_ticks: 0,
        producer_thread_id: seq,
        _reserved: 0,
    }
}

/// An exited thread's pushes, a thread adopting its slot and pushing,
/// and a consumer draining and trying to free the slot: every push is
/// drained exactly once in order, the slot is freed only when empty and
/// unadopted, and an adopted slot keeps its new owner.
#[test]
fn loom_adoption_races_the_consumers_free() {
    loom::model(|| {
        let slot = Arc::new(Slot {
            state: AtomicU32::new(slot_state::ACTIVE),
            owner: AtomicU32::new(1),
            ring: ObservationRing::new(),
        });
        // The first thread pushes and exits (orphans with Release).
        assert!(slot.ring.push(obs(1)));
        slot.state.store(slot_state::ORPHANED, Ordering::Release);
        let adopter = {
            let slot = Arc::clone(&slot);
            loom::thread::spawn(move || {
                let claimed = slot
                    .state
                    .compare_exchange(
                        slot_state::ORPHANED,
                        slot_state::CLAIMED,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok();
                if claimed {
                    slot.owner.store(2, Ordering::Relaxed);
                    slot.state.store(slot_state::ACTIVE, Ordering::Release);
                    assert!(slot.ring.push(obs(2)));
                }
                claimed
            })
        };
        let mut seen = Vec::new();
        let mut freed = false;
        for _ in 0..2 {
            let state = slot.state.load(Ordering::Acquire);
            while let Some(o) = slot.ring.pop() {
                seen.push(o.instance_id);
            }
            if state == slot_state::ORPHANED
                && slot.ring.is_empty()
                && slot
                    .state
                    .compare_exchange(
                        slot_state::ORPHANED,
                        slot_state::CLAIMED,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                slot.owner.store(0, Ordering::Relaxed);
                slot.state.store(slot_state::FREE, Ordering::Release);
                freed = true;
                break;
            }
        }
        let adopted = adopter.join().unwrap();
        while let Some(o) = slot.ring.pop() {
            seen.push(o.instance_id);
        }
        assert!(!(freed && adopted), "freed and adopted at once");
        let expected: Vec<u32> = if adopted { vec![1, 2] } else { vec![1] };
        assert_eq!(seen, expected);
        let state = slot.state.load(Ordering::Acquire);
        if adopted {
            assert_eq!(
                (state, slot.owner.load(Ordering::Relaxed)),
                (slot_state::ACTIVE, 2)
            );
        } else if freed {
            assert_eq!((state, slot.owner.load(Ordering::Relaxed)), (slot_state::FREE, 0));
        }
    });
}
