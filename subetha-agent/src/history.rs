//! A bounded history: the newest `capacity` items, oldest first.
//!
//! The scan thread keeps many histories (scans, scheduler samples, off-CPU
//! intervals, storms, refused segments...) and none may grow without bound:
//! the agent maps memory that other processes write, and a busy host would
//! otherwise grow it forever. Pushing into a full history forgets its oldest
//! item. Reading goes through the underlying [`VecDeque`] (it derefs to one),
//! so the history can only grow by [`BoundedHistory::push`].

use std::collections::VecDeque;
use std::ops::Deref;

/// The newest `capacity` items pushed, oldest first.
#[derive(Clone, Debug)]
pub struct BoundedHistory<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> BoundedHistory<T> {
    /// An empty history keeping at most `capacity` items (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            items: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// How many items it keeps at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends `item` as the newest, forgetting the oldest if full. Returns
    /// the item forgotten.
    pub fn push(&mut self, item: T) -> Option<T> {
        let forgotten = if self.items.len() >= self.capacity {
            self.items.pop_front()
        } else {
            None
        };
        self.items.push_back(item);
        forgotten
    }

    /// Removes and returns the oldest item.
    pub fn pop_oldest(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    /// The items as one slice, oldest first (rearranges the storage once).
    pub fn make_contiguous(&mut self) -> &[T] {
        self.items.make_contiguous()
    }

    /// The items, mutably, oldest first.
    pub fn iter_mut(&mut self) -> std::collections::vec_deque::IterMut<'_, T> {
        self.items.iter_mut()
    }

    /// Keeps only the items `keep` accepts.
    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.items.retain(keep);
    }
}

impl<T> Deref for BoundedHistory<T> {
    type Target = VecDeque<T>;

    fn deref(&self) -> &VecDeque<T> {
        &self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_capacity_items_oldest_first() {
        let mut history = BoundedHistory::new(3);
        assert_eq!(history.push(1), None);
        assert_eq!(history.push(2), None);
        assert_eq!(history.push(3), None);
        assert_eq!(history.push(4), Some(1));
        assert_eq!(history.iter().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(history.make_contiguous(), &[2, 3, 4]);
        assert_eq!((history.len(), history.capacity()), (3, 3));
        assert_eq!(history.pop_oldest(), Some(2));
        history.push(5);
        history.push(6);
        assert_eq!(history.iter().copied().collect::<Vec<_>>(), vec![4, 5, 6]);
    }

    #[test]
    fn a_zero_capacity_keeps_one() {
        let mut history = BoundedHistory::new(0);
        history.push('a');
        assert_eq!(history.push('b'), Some('a'));
        assert_eq!(history.len(), 1);
    }

    #[test]
    fn retain_and_iter_mut_edit_in_place() {
        let mut history = BoundedHistory::new(4);
        for i in 0..6 {
            history.push(i);
        }
        history.retain(|&i| i % 2 == 0);
        for i in history.iter_mut() {
            *i *= 10;
        }
        assert_eq!(history.iter().copied().collect::<Vec<_>>(), vec![20, 40]);
    }
}
