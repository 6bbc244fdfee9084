//! Reader bias for [`RwLock`](super::RwLock): shared holds that write no
//! cache line another thread uses.
//!
//! Every `read` of a `parking_lot` lock adds to and subtracts from the one
//! lock word, so readers on different cores pass its cache line back and
//! forth on every acquisition and every release: two threads that only
//! read one lock run at a fraction of one thread's speed. This module is
//! the reader-bias scheme of BRAVO (Dice and Kogan, "BRAVO: Biased
//! Locking for Reader-Writer Locks", USENIX ATC 2019), with one change: a
//! thread owns its slot instead of hashing into a shared one.
//!
//! # The protocol
//!
//! * The process has [`READER_SLOTS`] *reader slots*, each on a cache line
//!   of its own. A thread claims one the first time it reads a biased
//!   lock and gives it back when it exits; only it stores to that slot
//!   (besides a dropped lock clearing what a leaked guard left there).
//! * A lock has a *bias* flag. While it is set, a `read` stores the lock's
//!   name (an address only it uses) into the thread's slot, then checks
//!   the flag again
//!   ([`enter`]); if still set, the thread holds the lock shared without
//!   touching the lock word, and its release stores 0 into the slot.
//! * A writer first takes the lock word exclusively, as without bias, so
//!   no new reader gets in through the word. If the bias is set it clears
//!   it, then waits until no slot holds the lock's name ([`revoke`]).
//!   Readers arriving meanwhile see the flag clear and go through the word.
//! * The flag is set again only by a reader that holds the lock word
//!   shared, so never while a writer holds the lock.
//!
//! The reader's store to its slot and its second load of the flag, and
//! the writer's store to the flag and its loads of the slots, are
//! sequentially consistent: in their single total order either the
//! reader's load comes after the writer's store (the reader sees the flag
//! clear and backs out) or the writer's load of that slot comes after the
//! reader's store (the writer waits for it). This is Dekker's handshake;
//! `loom_tests` model-checks it. (Loom treats SeqCst accesses as AcqRel
//! but models SeqCst fences, so under loom each side also issues the
//! fence that SeqCst implies.)
//!
//! A thread holds at most one lock through its slot. Further shared holds
//! of that lock only count in a thread-local depth (so a recursive read
//! never waits on the word behind a writer that is waiting for this very
//! slot: found by a stress test that hung); holds of other locks go
//! through their words. The releases of one thread's shared holds of one
//! lock are interchangeable, so the slot is freed by whichever comes
//! last.
//!
//! # What it costs writers
//!
//! A revocation reads the slots up to the highest ever claimed (one line
//! each, about as many as the most threads that read biased locks at
//! once) and waits for the readers it finds. The lock then stays unbiased for a while (see [`BiasPolicy`]),
//! so a lock that is written often reads through its word like
//! `parking_lot`'s.

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Reader slots in the process. A thread that finds none free reads
/// through the lock word.
pub(crate) const READER_SLOTS: usize = 1024;

/// A reader slot: the address of the lock its thread holds shared through
/// the bias, or 0.
pub(crate) type Slot = CachePadded<AtomicUsize>;

/// The reader's half of the handshake: publishes `lock` in the thread's
/// own `slot` (free before the call), then checks `bias`. True: the
/// thread now holds `lock` shared. False: the slot is free again and the
/// caller must go through the lock word.
///
/// The load of `bias` is (at least) Acquire: the bias was set by a reader
/// that held the lock word after the last writer released it, so the
/// reader sees everything that writer wrote.
#[inline(always)]
pub(crate) fn enter(slot: &AtomicUsize, lock: usize, bias: &AtomicBool) -> bool {
    slot.swap(lock, Ordering::SeqCst);
    #[cfg(loom)]
    crate::sync::fence(Ordering::SeqCst);
    if bias.load(Ordering::SeqCst) {
        return true;
    }
    slot.store(0, Ordering::Release);
    false
}

/// Ends a shared hold taken through `slot`. Release: the critical section
/// happens before a revoking writer's load that finds the slot free.
#[inline(always)]
pub(crate) fn leave(slot: &AtomicUsize) {
    slot.store(0, Ordering::Release);
}

/// The writer's half: clears `bias`, then waits until no slot of those
/// `slots` returns (called after the clear) holds `lock`, calling `wait`
/// between looks (it returns false to give up). The caller holds the lock
/// word exclusively.
///
/// Returns whether a reader was still inside (the writer had to wait).
/// When `wait` gives up it returns `Err(())` and sets the bias again: a
/// cleared bias tells the next writer that no reader is inside, and one
/// is. (Safe because the caller still holds the word exclusively and
/// writes nothing before it lets it go; Release, so a reader entering
/// after this sees what the last writer wrote.)
pub(crate) fn revoke<'a>(
    lock: usize,
    bias: &AtomicBool,
    slots: impl FnOnce() -> &'a [Slot],
    mut wait: impl FnMut() -> bool,
) -> Result<bool, ()> {
    bias.store(false, Ordering::SeqCst);
    #[cfg(loom)]
    crate::sync::fence(Ordering::SeqCst);
    let mut found = false;
    for slot in slots() {
        while slot.load(Ordering::SeqCst) == lock {
            found = true;
            if !wait() {
                bias.store(true, Ordering::Release);
                return Err(());
            }
        }
    }
    Ok(found)
}

/// When a revoked lock may be biased again: BRAVO's inhibition, adapted.
///
/// After a revocation that took `t`, the bias stays off for `scale × t`.
/// `scale` doubles (up to [`MAX_SCALE`](Self::MAX_SCALE)) when the bias
/// it ends lasted less than 64 revocations' time, so a lock written
/// between every few reads settles on reading through its word, and
/// halves (down to [`MIN_SCALE`](Self::MIN_SCALE), BRAVO's fixed 9)
/// otherwise. (A fixed 9 biases a lock written one in eight operations again
/// too soon, and each bias costs a revocation: the `rwlock` group's `…/mixed`
/// rows of `benches/primitives.rs`.)
/// All times in clock ticks; the fields are only hints, so Relaxed.
#[derive(Debug)]
pub(crate) struct BiasPolicy {
    enabled_at: AtomicU64,
    scale: AtomicU64,
    inhibited_until: AtomicU64,
}

impl BiasPolicy {
    const MIN_SCALE: u64 = 9;
    const MAX_SCALE: u64 = 1 << 16;

    pub(crate) fn new() -> Self {
        Self {
            enabled_at: AtomicU64::new(0),
            scale: AtomicU64::new(Self::MIN_SCALE),
            inhibited_until: AtomicU64::new(0),
        }
    }

    /// Whether the bias may be set again at `now`.
    pub(crate) fn may_enable(&self, now: u64) -> bool {
        now >= self.inhibited_until.load(Ordering::Relaxed)
    }

    /// The bias was set at `now`.
    pub(crate) fn enabled(&self, now: u64) {
        self.enabled_at.store(now, Ordering::Relaxed);
    }

    /// A revocation ran from `start` to `end`.
    pub(crate) fn revoked(&self, start: u64, end: u64) {
        let took = end.saturating_sub(start).max(1);
        let lasted = start.saturating_sub(self.enabled_at.load(Ordering::Relaxed));
        let scale = self.scale.load(Ordering::Relaxed);
        let scale = if lasted < took.saturating_mul(64) {
            (scale * 2).min(Self::MAX_SCALE)
        } else {
            (scale / 2).max(Self::MIN_SCALE)
        };
        self.scale.store(scale, Ordering::Relaxed);
        self.inhibited_until
            .store(end.saturating_add(took.saturating_mul(scale)), Ordering::Relaxed);
    }
}

#[cfg(not(loom))]
pub(crate) use process::*;

/// The process's reader slots and this thread's claim on one.
#[cfg(not(loom))]
mod process {
    use std::cell::Cell;

    use crossbeam_utils::{Backoff, CachePadded};

    use super::{READER_SLOTS, Slot};
    use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    /// The slots, which threads hold them, and how far they have ever
    /// been handed out (a revocation looks no further).
    struct Slots {
        slots: [Slot; READER_SLOTS],
        /// Bit `k % 64` of word `k / 64` set: slot `k` is held.
        taken: [AtomicU64; READER_SLOTS / 64],
        /// One past the highest slot ever claimed.
        high: AtomicUsize,
    }

    static SLOTS: Slots = Slots {
        slots: [const { CachePadded::new(AtomicUsize::new(0)) }; READER_SLOTS],
        taken: [const { AtomicU64::new(0) }; READER_SLOTS / 64],
        high: AtomicUsize::new(0),
    };

    impl Slots {
        /// Takes a free slot, if any. Acquire: the stores of the thread
        /// that held it before happen before this thread's. Raises `high`
        /// before returning, so a revocation that could miss this thread's
        /// later entries reads `high` after them (see
        /// [`claimed`](Self::claimed)).
        fn claim(&self) -> Option<usize> {
            for (word_index, word) in self.taken.iter().enumerate() {
                let mut taken = word.load(Ordering::Relaxed);
                while taken != u64::MAX {
                    let bit = (!taken).trailing_zeros();
                    match word.compare_exchange_weak(
                        taken,
                        taken | 1 << bit,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => {
                            let slot = word_index * 64 + bit as usize;
                            self.high.fetch_max(slot + 1, Ordering::SeqCst);
                            return Some(slot);
                        }
                        Err(now) => taken = now,
                    }
                }
            }
            None
        }

        /// Gives `slot` back. Release: see [`claim`](Self::claim).
        fn release(&self, slot: usize) {
            self.taken[slot / 64].fetch_and(!(1 << (slot % 64)), Ordering::Release);
        }

        /// The slots handed out so far. SeqCst, read after the revoking
        /// writer's store to the bias: a reader's claim precedes its
        /// entry, so a reader whose entry the writer must see was claimed
        /// before the writer's load in the SeqCst order.
        fn claimed(&self) -> &[Slot] {
            &self.slots[..self.high.load(Ordering::SeqCst)]
        }
    }

    /// `READER_SLOT` before the thread's first biased read.
    const UNCLAIMED: u16 = u16::MAX;
    /// `READER_SLOT` of a thread without a slot (none was free, or it is
    /// exiting).
    const NO_SLOT: u16 = u16::MAX - 1;
    const _: () = assert!(READER_SLOTS < NO_SLOT as usize);

    thread_local! {
        /// The slot `SLOT_HELD` holds, or [`UNCLAIMED`] / [`NO_SLOT`]: a
        /// copy without a destructor, one load on the read path.
        static READER_SLOT: Cell<u16> = const { Cell::new(UNCLAIMED) };
        /// Shared holds of the lock in this thread's slot beyond the first
        /// (a recursive read must not wait behind a writer that waits for
        /// this thread's slot).
        static SLOT_DEPTH: Cell<u32> = const { Cell::new(0) };
        /// Gives the slot back when the thread exits.
        static SLOT_HELD: HeldSlot = HeldSlot(SLOTS.claim());
    }

    /// A thread's reader slot.
    struct HeldSlot(Option<usize>);

    impl Drop for HeldSlot {
        fn drop(&mut self) {
            match self.0 {
                Some(slot) if SLOTS.slots[slot].load(Ordering::Relaxed) != 0 => {
                    // A hold is still out: a guard leaked with
                    // `mem::forget`, which keeps its lock held shared as
                    // `parking_lot`'s does, or one that another
                    // thread-local's destructor will release through this
                    // slot. The slot stays this thread's and is never
                    // handed out again.
                }
                Some(slot) => {
                    READER_SLOT.with(|index| index.set(NO_SLOT));
                    SLOTS.release(slot);
                }
                None => READER_SLOT.with(|index| index.set(NO_SLOT)),
            }
        }
    }

    /// This thread's slot, claiming one at the first call.
    #[inline(always)]
    fn my_slot() -> Option<&'static Slot> {
        let index = READER_SLOT.with(Cell::get);
        if usize::from(index) < READER_SLOTS {
            Some(&SLOTS.slots[usize::from(index)])
        } else {
            claim_slot(index)
        }
    }

    #[cold]
    #[inline(never)]
    fn claim_slot(index: u16) -> Option<&'static Slot> {
        if index != UNCLAIMED {
            return None;
        }
        // `try_with` fails once the thread has begun to exit.
        let slot = SLOT_HELD.try_with(|held| held.0).ok().flatten();
        READER_SLOT.with(|cell| cell.set(slot.map_or(NO_SLOT, |slot| slot as u16)));
        slot.map(|slot| &SLOTS.slots[slot])
    }

    /// Tries to take `lock` shared through this thread's slot while its
    /// `bias` is set: a first hold enters, a further hold of the lock
    /// already in the slot only counts. Refused when the thread has no
    /// slot or holds another lock through it.
    #[inline(always)]
    pub(crate) fn try_enter(lock: usize, bias: &AtomicBool) -> bool {
        let Some(slot) = my_slot() else {
            return false;
        };
        // Only this thread stores to its slot, except a dropped lock
        // clearing what a leaked guard left, which makes it 0.
        match slot.load(Ordering::Relaxed) {
            0 => super::enter(slot, lock, bias),
            held if held == lock => {
                SLOT_DEPTH.with(|depth| depth.set(depth.get() + 1));
                true
            }
            _ => false,
        }
    }

    /// A further shared hold of `lock` if this thread already holds it
    /// through its slot, whatever the bias: a revoking writer waits for
    /// the slot anyway, and a recursive read must not wait for it.
    #[inline(always)]
    pub(crate) fn reenter(lock: usize) -> bool {
        if !holds(lock) {
            return false;
        }
        SLOT_DEPTH.with(|depth| depth.set(depth.get() + 1));
        true
    }

    /// Whether this thread holds `lock` shared through its slot.
    pub(crate) fn holds(lock: usize) -> bool {
        let index = READER_SLOT.with(Cell::get);
        usize::from(index) < READER_SLOTS && SLOTS.slots[usize::from(index)].load(Ordering::Relaxed) == lock
    }

    /// Ends this thread's shared hold of `lock` through its slot, if it
    /// has one; false if the hold went through the lock word.
    #[inline(always)]
    pub(crate) fn leave_if_held(lock: usize) -> bool {
        let index = READER_SLOT.with(Cell::get);
        if usize::from(index) >= READER_SLOTS {
            return false;
        }
        let slot = &SLOTS.slots[usize::from(index)];
        if slot.load(Ordering::Relaxed) != lock {
            return false;
        }
        let depth = SLOT_DEPTH.with(Cell::get);
        if depth == 0 {
            super::leave(slot);
        } else {
            SLOT_DEPTH.with(|cell| cell.set(depth - 1));
        }
        true
    }

    /// Ends this thread's only shared hold of `lock` through its slot;
    /// false (and nothing done) if it holds it there more than once or
    /// not at all.
    pub(crate) fn leave_last(lock: usize) -> bool {
        SLOT_DEPTH.with(Cell::get) == 0 && leave_if_held(lock)
    }

    /// How a revoking writer waits for a reader to leave its slot: spins,
    /// then yields (a reader that was preempted inside gets the CPU back
    /// soonest that way on a busy host), then naps, for a reader that
    /// holds the lock for long. Readers do not wake writers: their release
    /// stays one store.
    pub(crate) struct RevokeWait {
        backoff: Backoff,
        yields: u32,
    }

    impl RevokeWait {
        /// Yields before the naps begin (about a millisecond's worth).
        const YIELDS: u32 = 1024;
        /// One nap. (A sleep that short lasts the thread's timer slack,
        /// 50 µs by default.)
        const NAP: std::time::Duration = std::time::Duration::from_micros(50);

        pub(crate) fn new() -> Self {
            Self {
                backoff: Backoff::new(),
                yields: 0,
            }
        }

        pub(crate) fn wait(&mut self) {
            if !self.backoff.is_completed() {
                self.backoff.snooze();
            } else if self.yields < Self::YIELDS {
                self.yields += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(Self::NAP);
            }
        }
    }

    /// [`revoke`](super::revoke) over the process's claimed slots.
    pub(crate) fn revoke_lock(
        lock: usize,
        bias: &AtomicBool,
        wait: impl FnMut() -> bool,
    ) -> Result<bool, ()> {
        super::revoke(lock, bias, || SLOTS.claimed(), wait)
    }

    /// Whether any thread holds `lock` shared through its slot.
    pub(crate) fn any_reader_of(lock: usize) -> bool {
        SLOTS
            .claimed()
            .iter()
            .any(|slot| slot.load(Ordering::SeqCst) == lock)
    }

    /// Clears what leaked guards of `lock`, which is being dropped, left
    /// in reader slots: a later lock at the same address must not wait
    /// for them.
    pub(crate) fn forget_lock(lock: usize) {
        for slot in SLOTS.claimed() {
            let _ = slot.compare_exchange(lock, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_thread_enters_through_its_slot_only_while_biased_and_once() {
            let bias = AtomicBool::new(false);
            let lock = 0x1000;
            assert!(!try_enter(lock, &bias), "entered an unbiased lock");
            assert!(!any_reader_of(lock));
            bias.store(true, Ordering::SeqCst);
            assert!(try_enter(lock, &bias));
            assert!(any_reader_of(lock));
            assert!(!try_enter(0x2000, &bias), "a second lock through the same slot");
            // Further holds of the same lock count, biased or not.
            assert!(try_enter(lock, &bias));
            bias.store(false, Ordering::SeqCst);
            assert!(reenter(lock));
            assert!(!reenter(0x2000));
            assert!(!leave_last(lock), "left with two more holds out");
            assert!(leave_if_held(lock) && leave_if_held(lock));
            assert!(any_reader_of(lock), "the first hold still holds the slot");
            assert!(!leave_if_held(0x2000), "left a lock it never entered");
            assert!(leave_if_held(lock));
            assert!(!any_reader_of(lock));
            assert!(!leave_if_held(lock), "left twice");
        }

        #[test]
        fn a_writer_waits_for_the_reader_inside_and_times_out_when_told() {
            let bias = std::sync::Arc::new(AtomicBool::new(true));
            let lock = 0x3000;
            let (entered_tx, entered_rx) = std::sync::mpsc::channel();
            let (leave_tx, leave_rx) = std::sync::mpsc::channel::<()>();
            let reader = std::thread::spawn({
                let bias = std::sync::Arc::clone(&bias);
                move || {
                    assert!(try_enter(lock, &bias));
                    entered_tx.send(()).unwrap();
                    leave_rx.recv().unwrap();
                    assert!(leave_if_held(lock));
                }
            });
            entered_rx.recv().unwrap();
            let mut looks = 0;
            assert_eq!(
                revoke_lock(lock, &bias, || {
                    looks += 1;
                    looks < 3
                }),
                Err(())
            );
            assert!(
                bias.load(Ordering::SeqCst),
                "a revocation that gave up sets the bias again"
            );
            leave_tx.send(()).unwrap();
            let mut wait = RevokeWait::new();
            let found = revoke_lock(lock, &bias, || {
                wait.wait();
                true
            });
            reader.join().unwrap();
            assert!(found.is_ok());
            assert!(!any_reader_of(lock));
        }

        #[test]
        fn a_dropped_lock_forgets_what_a_leaked_guard_left() {
            let bias = AtomicBool::new(true);
            let lock = 0x5000;
            std::thread::spawn(move || assert!(try_enter(lock, &bias)))
                .join()
                .unwrap();
            assert!(any_reader_of(lock), "the exited thread's leaked hold is kept");
            forget_lock(lock);
            assert!(!any_reader_of(lock));
        }

        #[test]
        fn the_policy_inhibits_longer_while_the_bias_does_not_pay() {
            let policy = super::super::BiasPolicy::new();
            policy.enabled(1_000);
            // Revoked 100 ticks after it was set, the revocation taking 10:
            // inhibited for 18 × 10 from its end.
            policy.revoked(1_100, 1_110);
            assert!(!policy.may_enable(1_110 + 179));
            assert!(policy.may_enable(1_110 + 180));
            // A bias that lasted long: the scale halves back to 9.
            policy.enabled(2_000);
            policy.revoked(100_000, 100_010);
            assert!(policy.may_enable(100_010 + 90));
            assert!(!policy.may_enable(100_010 + 89));
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Model check: `RUSTFLAGS="--cfg loom" cargo test -p subetha-core --lib loom`.
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// One reader tries to enter through its slot while a writer (holding
    /// the lock word, so no reader gets in through it) revokes the bias
    /// and writes. In every interleaving the reader either backs out or
    /// finishes reading before the writer writes: loom flags any overlap of
    /// the reader's access and the writer's as a data race.
    #[test]
    fn a_revoking_writer_never_overlaps_a_reader_inside() {
        loom::model(|| {
            let bias = Arc::new(AtomicBool::new(true));
            let slots: Arc<[Slot; 2]> = Arc::new([
                CachePadded::new(AtomicUsize::new(0)),
                CachePadded::new(AtomicUsize::new(0)),
            ]);
            let data = Arc::new(UnsafeCell::new(0u64));
            const LOCK: usize = 0x40;
            let reader = loom::thread::spawn({
                let (bias, slots, data) = (Arc::clone(&bias), Arc::clone(&slots), Arc::clone(&data));
                move || {
                    if enter(&slots[1], LOCK, &bias) {
                        // SAFETY: loom checks this read against the
                        // writer's write; overlapping, it reports a race.
                        let seen = data.with(|value| unsafe { *value });
                        leave(&slots[1]);
                        Some(seen)
                    } else {
                        None
                    }
                }
            });
            let found = revoke(
                LOCK,
                &bias,
                || &slots[..],
                || {
                    loom::thread::yield_now();
                    true
                },
            );
            assert!(found.is_ok());
            // SAFETY: as for the reader's read.
            data.with_mut(|value| unsafe { *value = 1 });
            let seen = reader.join().unwrap();
            // A reader that got in read the value from before the write.
            assert!(matches!(seen, None | Some(0)));
        });
    }

    /// The policy's arithmetic under loom's atomics (no concurrency).
    #[test]
    fn bias_policy_constructs_under_loom() {
        loom::model(|| {
            let policy = BiasPolicy::new();
            policy.enabled(10);
            policy.revoked(20, 30);
            assert!(!policy.may_enable(30));
        });
    }
}
