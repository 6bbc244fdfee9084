//! The set of distinct producer threads an op kind saw, capped at
//! [`DISTINCT_THREADS_CAP`].

use super::*;

/// Number of distinct producer threads seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DistinctThreads {
    /// Exact count while `saturated` is false; otherwise the cap, and the
    /// true count is larger.
    pub count: usize,
    /// Whether more distinct threads were seen than could be tracked.
    pub saturated: bool,
}

/// Sorted set of thread ids, capped at `DISTINCT_THREADS_CAP`.
#[derive(Clone, Debug, Default)]
pub(super) struct ThreadSet {
    pub(super) ids: Vec<u32>,
    pub(super) saturated: bool,
}

impl ThreadSet {
    pub(super) const fn new() -> Self {
        Self {
            ids: Vec::new(),
            saturated: false,
        }
    }

    pub(super) fn insert(&mut self, id: u32) {
        if let Err(pos) = self.ids.binary_search(&id) {
            if self.ids.len() < DISTINCT_THREADS_CAP {
                self.ids.insert(pos, id);
            } else {
                self.saturated = true;
            }
        }
    }

    pub(super) fn union(&mut self, other: &ThreadSet) {
        self.saturated |= other.saturated;
        if other.ids.is_empty() {
            return;
        }
        let mut merged = Vec::with_capacity(self.ids.len() + other.ids.len());
        let (mut a, mut b) = (self.ids.iter().peekable(), other.ids.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&x), Some(&&y)) if x < y => a.next(),
                (Some(&&x), Some(&&y)) if x > y => b.next(),
                (Some(_), Some(_)) => {
                    b.next();
                    a.next()
                }
                (Some(_), None) => a.next(),
                (None, Some(_)) => b.next(),
                (None, None) => break,
            };
            merged.extend(next.copied());
        }
        if merged.len() > DISTINCT_THREADS_CAP {
            merged.truncate(DISTINCT_THREADS_CAP);
            self.saturated = true;
        }
        self.ids = merged;
    }

    pub(super) fn distinct(&self) -> DistinctThreads {
        DistinctThreads {
            count: self.ids.len(),
            saturated: self.saturated,
        }
    }
}
