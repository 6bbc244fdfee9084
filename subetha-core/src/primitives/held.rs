//! Per-thread records of the holds whose release reports more than a
//! count.
//!
//! An acquisition that must tell its release something (the wait to push,
//! that the hold is sampled, that it is the shared end of a downgrade)
//! leaves it here, on the acquiring thread, keyed by the lock's address.
//! [`RwLock`](super::RwLock) read holds use it: readers share the lock, so
//! there is no holder-only field in the lock to keep it in.
//!
//! Guards of the locks that use this are not `Send` (as in `parking_lot`),
//! so a hold ends on the thread that began it, and a release finds its
//! record in its own thread's table. The first record a thread leaves
//! goes in a single slot, a few plain stores; only while that is taken do
//! more go in a `Vec`, as long as the thread's outstanding records (a
//! guard leaked with `mem::forget` leaves its record behind; a later lock
//! at the same address would report it once). A count of the records is
//! what a release tests first: with no records, it looks at nothing else.
//! The slot and the count are thread-locals without destructors, usable
//! until the thread is gone.
//!
//! (The [`Mutex`](super::Mutex) keeps its hold's record in the lock, beside
//! the word: moved here, the few more instructions in every waited hold
//! tipped two threads sharing a mutex for 50 ns critical sections from
//! alternating into colliding, 190 ns per operation against 120.)

use std::cell::{Cell, RefCell};
use std::thread::LocalKey;

/// A record of one hold.
pub(crate) trait HoldRecord: Copy {
    /// The address of the lock held.
    fn lock(&self) -> usize;
}

/// One kind of record: its slot, table and count, all thread-locals,
/// declared with [`hold_records!`]. The keys are associated constants, so
/// every access is a direct thread-local access the compiler can inline
/// (held in a `static` instead, they were called through pointers, which
/// made a contended `Mutex` release slower than storing the record in the
/// lock).
pub(crate) trait Records: 'static {
    type Record: HoldRecord;
    const SLOT: &'static LocalKey<Cell<Option<Self::Record>>>;
    const TABLE: &'static LocalKey<RefCell<Vec<Self::Record>>>;
    const HELD: &'static LocalKey<Cell<u32>>;

    /// How many records the calling thread has outstanding.
    #[inline(always)]
    fn held(&self) -> u32 {
        Self::HELD.with(Cell::get)
    }

    /// Leaves `record`; `Err(record)` when the thread's table is gone (a
    /// thread-local's destructor is taking the lock).
    #[inline]
    fn push(&self, record: Self::Record) -> Result<(), Self::Record> {
        let kept = Self::SLOT.with(|slot| {
            let free = slot.get().is_none();
            if free {
                slot.set(Some(record));
            }
            free
        }) || Self::TABLE
            .try_with(|table| table.borrow_mut().push(record))
            .is_ok();
        if !kept {
            return Err(record);
        }
        Self::HELD.with(|held| held.set(held.get() + 1));
        Ok(())
    }

    /// Takes a record of `lock`, if the thread has one. (A thread that
    /// holds one lock twice, as recursive reads do, may get the other
    /// hold's record; each is still taken once.)
    #[inline]
    fn take(&self, lock: usize) -> Option<Self::Record> {
        if self.held() == 0 {
            return None;
        }
        let in_slot = Self::SLOT.with(|slot| match slot.get() {
            Some(record) if record.lock() == lock => slot.take(),
            _ => None,
        });
        let record = in_slot.or_else(|| take_from_table(Self::TABLE, lock));
        if record.is_some() {
            Self::HELD.with(|held| held.set(held.get() - 1));
        }
        record
    }
}

/// The table part of [`Records::take`], out of line: the slot serves
/// a thread that holds one recorded lock at a time.
#[cold]
#[inline(never)]
fn take_from_table<R: HoldRecord>(table: &'static LocalKey<RefCell<Vec<R>>>, lock: usize) -> Option<R> {
    table
        .try_with(|table| {
            let mut table = table.borrow_mut();
            let at = table.iter().rposition(|r| r.lock() == lock)?;
            Some(table.swap_remove(at))
        })
        .ok()
        .flatten()
}

/// Declares a unit struct implementing [`Records`] for `$record`, with
/// its thread-locals.
macro_rules! hold_records {
    ($(#[$doc:meta])* $vis:vis struct $name:ident: $record:ty;) => {
        $(#[$doc])*
        $vis struct $name;
        const _: () = {
            use ::std::cell::{Cell, RefCell};
            thread_local! {
                static SLOT: Cell<Option<$record>> = const { Cell::new(None) };
                static TABLE: RefCell<Vec<$record>> = const { RefCell::new(Vec::new()) };
                static HELD: Cell<u32> = const { Cell::new(0) };
            }
            impl $crate::primitives::held::Records for $name {
                type Record = $record;
                const SLOT: &'static ::std::thread::LocalKey<Cell<Option<$record>>> = &SLOT;
                const TABLE: &'static ::std::thread::LocalKey<RefCell<Vec<$record>>> = &TABLE;
                const HELD: &'static ::std::thread::LocalKey<Cell<u32>> = &HELD;
            }
        };
    };
}
pub(crate) use hold_records;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Rec(usize, u32);

    impl HoldRecord for Rec {
        fn lock(&self) -> usize {
            self.0
        }
    }

    hold_records! {
        struct TestRecords: Rec;
    }
    const RECORDS: TestRecords = TestRecords;

    #[test]
    fn records_are_taken_once_per_lock_and_counted() {
        assert_eq!(RECORDS.take(1), None);
        for i in 0..20 {
            RECORDS.push(Rec(i % 4 + 1, i as u32)).unwrap();
        }
        assert_eq!(RECORDS.held(), 20);
        // Five of lock 2, each taken once.
        let mut of_two: Vec<_> = std::iter::from_fn(|| RECORDS.take(2)).map(|r| r.1).collect();
        of_two.sort();
        assert_eq!(of_two, vec![1, 5, 9, 13, 17]);
        assert_eq!(RECORDS.held(), 15);
        assert_eq!(RECORDS.take(2), None);
        let threes = std::iter::from_fn(|| RECORDS.take(3)).count();
        assert_eq!(threes, 5);
        assert_eq!(RECORDS.held(), 10);
        // Another thread starts with none.
        std::thread::spawn(|| assert_eq!(RECORDS.held(), 0))
            .join()
            .unwrap();
    }
}
