//! The unit of observation: one 24-byte record per primitive operation, and
//! the process-local thread ids that stamp it.
//!
//! An [`Observation`] says which instance did what (`instance_id`,
//! `op_kind`), whether it had to wait or missed (`flags`), how long it took in
//! raw clock ticks (`latency_ticks`, 0 when not measured) and which thread
//! produced it. At 24 bytes, eight observations fill three 64-byte cache
//! lines (the spec's "three per cache line, no straddling" cannot hold for
//! contiguous 24-byte slots: two of every eight cross a line boundary; the
//! spec's own layout — slots back to back from byte 128 — is what we keep).
//! The layout is `#[repr(C)]`, free of
//! padding holes and `bytemuck::Pod`: observations are copied through shared
//! memory between processes, and every bit pattern is a valid value.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

/// One primitive operation, as pushed into an [`ObservationRing`].
///
/// [`ObservationRing`]: crate::ObservationRing
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct Observation {
    /// Who emitted it: an id handed out by [`Instance::register`](crate::Instance::register).
    pub instance_id: u32,
    /// What was done. Primitive-specific, `1..=7` ([`Observation::MAX_OP_KIND`]).
    pub op_kind: u16,
    /// [`Observation::FLAG_CONTENDED`] and/or [`Observation::FLAG_MISS`].
    pub flags: u16,
    /// Raw clock ticks (see [`crate::clock`]); 0 when no latency was measured.
    pub latency_ticks: u64,
    /// [`thread_id()`] of the producer; stamped by `push` when 0.
    pub producer_thread_id: u32,
    /// Call-site ids of a slow-path operation, 0 otherwise: bits 0–15 its
    /// own site, bits 16–31 the holder's (a [`SiteWord`](crate::site::SiteWord);
    /// see [`crate::site`]). The spec's alignment padding, so the layout
    /// and offsets are the seed's.
    pub _reserved: u32,
}

impl Observation {
    /// The observation's 24 bytes as three `u64`s in memory order (what
    /// `bytemuck::cast` gives), built from the fields with shifts, so the
    /// ring can write a slot with three 8-byte stores. Left to itself the
    /// compiler writes the fields one by one (five stores) and may keep a
    /// copy on the stack; a producer whose lines the consumer keeps taking
    /// waits on every store it queues.
    #[cfg(target_endian = "little")]
    #[inline(always)]
    pub(crate) fn to_words(self) -> [u64; 3] {
        [
            u64::from(self.instance_id) | u64::from(self.op_kind) << 32 | u64::from(self.flags) << 48,
            self.latency_ticks,
            u64::from(self.producer_thread_id) | u64::from(self._reserved) << 32,
        ]
    }

    /// See the little-endian version.
    #[cfg(not(target_endian = "little"))]
    #[inline(always)]
    pub(crate) fn to_words(self) -> [u64; 3] {
        bytemuck::cast(self)
    }

    /// All fields zero.
    pub const ZERO: Self = Self {
        instance_id: 0,
        op_kind: 0,
        flags: 0,
        latency_ticks: 0,
        producer_thread_id: 0,
        _reserved: 0,
    };

    /// Flag bit 0: the operation had to wait (lock contended, queue full, ...).
    pub const FLAG_CONTENDED: u16 = 1 << 0;
    /// Flag bit 1: the operation found nothing (`try_lock` failed, queue empty, ...).
    pub const FLAG_MISS: u16 = 1 << 1;
    /// Flag bit 2: a *count*, not one operation: `latency_ticks` operations
    /// of this op kind, none contended or missed, no latency measured. A
    /// primitive reports its uncontended fast-path operations this way
    /// instead of one observation each (see `subetha_core::primitives`).
    /// Other flags on a count are ignored.
    pub const FLAG_COUNT: u16 = 1 << 2;
    /// The largest valid `op_kind`; kinds are `1..=MAX_OP_KIND`.
    pub const MAX_OP_KIND: u16 = 7;

    /// An observation with the producer thread left for `push` to stamp.
    #[inline]
    pub const fn new(instance_id: u32, op_kind: u16, flags: u16, latency_ticks: u64) -> Self {
        Self {
            instance_id,
            op_kind,
            flags,
            latency_ticks,
            producer_thread_id: 0,
            _reserved: 0,
        }
    }

    /// Whether [`Observation::FLAG_CONTENDED`] is set.
    #[inline]
    pub const fn is_contended(&self) -> bool {
        self.flags & Self::FLAG_CONTENDED != 0
    }

    /// Whether [`Observation::FLAG_MISS`] is set.
    #[inline]
    pub const fn is_miss(&self) -> bool {
        self.flags & Self::FLAG_MISS != 0
    }

    /// The operation's call-site id (0: none; see [`crate::site`]).
    #[inline]
    pub const fn site_id(&self) -> u16 {
        self._reserved as u16
    }

    /// The call-site id of the hold whose release ended this wait (0: none).
    #[inline]
    pub const fn holder_site_id(&self) -> u16 {
        (self._reserved >> 16) as u16
    }

    /// Whether [`Observation::FLAG_COUNT`] is set.
    #[inline]
    pub const fn is_count(&self) -> bool {
        self.flags & Self::FLAG_COUNT != 0
    }
}

/// Next id to hand out. Starts at 1 so 0 can mean "not stamped".
static NEXT_THREAD_ID: AtomicU32 = AtomicU32::new(1);

thread_local! {
    static THREAD_ID: Cell<u32> = const { Cell::new(0) };
}

/// This thread's process-local sequential id: the first thread to ask gets 1,
/// the next 2, and so on. Stable for the thread's lifetime, distinct across
/// live and past threads of the process, never 0.
///
/// Not valid across `fork`: the child keeps the parent's counter, so the
/// forking thread keeps its id and new threads in the child get fresh ones.
#[inline]
pub fn thread_id() -> u32 {
    THREAD_ID.with(|id| {
        let current = id.get();
        if current != 0 {
            return current;
        }
        let fresh = assign_thread_id();
        id.set(fresh);
        fresh
    })
}

#[cold]
fn assign_thread_id() -> u32 {
    loop {
        // Relaxed: the counter only has to hand out distinct values.
        let id = NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed);
        // After 2^32 threads the counter wraps; 0 stays reserved.
        if id != 0 {
            return id;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! The six invariants of the normative spec (`seed/observation-ring.txt`),
    //! plus the layout the spec fixes.
    use super::*;
    use crate::ObservationRing;
    use std::collections::HashSet;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn observation_layout_is_24_bytes_in_spec_order() {
        assert_eq!(size_of::<Observation>(), 24);
        assert_eq!(align_of::<Observation>(), 8);
        assert_eq!(offset_of!(Observation, instance_id), 0);
        assert_eq!(offset_of!(Observation, op_kind), 4);
        assert_eq!(offset_of!(Observation, flags), 6);
        assert_eq!(offset_of!(Observation, latency_ticks), 8);
        assert_eq!(offset_of!(Observation, producer_thread_id), 16);
        assert_eq!(offset_of!(Observation, _reserved), 20);
        assert_eq!(bytemuck::bytes_of(&Observation::ZERO), &[0u8; 24]);
    }

    /// The words the ring stores are the observation's own bytes, for
    /// every field at its extremes (each byte distinct, so a swapped or
    /// shifted field shows).
    #[test]
    fn words_are_the_observation_bytes() {
        let distinct = Observation {
            instance_id: 0x0403_0201,
            op_kind: 0x0605,
            flags: 0x0807,
            latency_ticks: 0x100f_0e0d_0c0b_0a09,
            producer_thread_id: 0x1413_1211,
            _reserved: 0x1817_1615,
        };
        let all_ones = Observation {
            instance_id: u32::MAX,
            op_kind: u16::MAX,
            flags: u16::MAX,
            latency_ticks: u64::MAX,
            producer_thread_id: u32::MAX,
            _reserved: u32::MAX,
        };
        for obs in [
            distinct,
            all_ones,
            Observation::ZERO,
            Observation::new(7, 1, 2, 3),
        ] {
            assert_eq!(
                obs.to_words(),
                bytemuck::cast::<Observation, [u64; 3]>(obs),
                "{obs:?}"
            );
        }
    }

    #[test]
    fn push_pop_round_trip_preserves_fields() {
        let ring = Box::<ObservationRing>::default();
        let obs = Observation {
            instance_id: 0xDEAD_BEEF,
            op_kind: 7,
            flags: Observation::FLAG_CONTENDED | Observation::FLAG_MISS,
            latency_ticks: u64::MAX - 3,
            producer_thread_id: 4242,
            _reserved: 0,
        };
        assert!(ring.push(obs));
        assert_eq!(ring.pop(), Some(obs));
        assert_eq!(ring.pop(), None);
    }

    #[test]
    fn push_auto_stamps_thread_id_when_zero() {
        let ring = Box::<ObservationRing>::default();
        // Both stamping paths (out of line) carry every other field over.
        assert!(ring.push(Observation::new(3, 1, 2, 99)));
        assert!(ring.try_push(Observation::new(4, 5, 1, u64::MAX)).is_ok());
        let stamped = |instance_id, op_kind, flags, latency_ticks| Observation {
            instance_id,
            op_kind,
            flags,
            latency_ticks,
            producer_thread_id: thread_id(),
            _reserved: 0,
        };
        assert_ne!(thread_id(), 0);
        assert_eq!(ring.pop(), Some(stamped(3, 1, 2, 99)));
        assert_eq!(ring.pop(), Some(stamped(4, 5, 1, u64::MAX)));
    }

    #[test]
    fn ring_fills_exactly_at_capacity() {
        let ring = Box::<ObservationRing>::default();
        for i in 0..ObservationRing::CAPACITY {
            assert!(ring.push(Observation::new(i as u32, 1, 0, 0)), "push {i}");
        }
        assert!(!ring.push(Observation::new(9999, 1, 0, 0)), "4097th push");
        assert_eq!(ring.dropped(), 1);
        // Making room makes the next push succeed again.
        assert_eq!(ring.pop().map(|o| o.instance_id), Some(0));
        assert!(ring.push(Observation::new(10_000, 1, 0, 0)));
    }

    #[test]
    fn thread_id_is_stable_within_a_thread() {
        let first = thread_id();
        for _ in 0..1000 {
            assert_eq!(thread_id(), first);
        }
    }

    #[test]
    fn thread_id_is_distinct_across_threads_and_never_zero() {
        let mut ids: Vec<u32> = (0..16)
            .map(|_| std::thread::spawn(thread_id).join().unwrap())
            .collect();
        ids.push(thread_id());
        assert!(ids.iter().all(|&id| id != 0));
        let unique: HashSet<u32> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "ids: {ids:?}");
    }
}
