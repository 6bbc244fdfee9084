//! The count schedule: when a counted primitive reports its uncontended
//! operations. Per counter, a count ends at the 1st, 2nd, 4th … [`BATCH`]th
//! operation (so a new primitive shows up at once), then at every
//! [`BATCH`]th; each count covers the operations since the last, and what no
//! count covers yet is reported when the primitive goes away, so totals are
//! exact. The [`Mutex`](super::Mutex) keeps its counter in its lock word
//! (`mutex::word`), the other primitives in [`OpCounts`](super::op_counts)
//! stripes; both follow this schedule.

/// Operations per count once a counter is past its first [`BATCH`].
pub const BATCH: u64 = 64;

/// How many operations the count ending at the `nth` operation of a counter
/// covers, if one ends there: the 1st, 2nd, 4th … [`BATCH`]th, then every
/// [`BATCH`]th.
pub(crate) fn count_ending_at(nth: u64) -> Option<u64> {
    if nth <= BATCH {
        nth.is_power_of_two().then(|| nth - nth / 2)
    } else {
        nth.is_multiple_of(BATCH).then_some(BATCH)
    }
}

/// How many of a counter's first `total` operations no count covers.
pub(crate) fn uncounted(total: u64) -> u64 {
    if total < BATCH {
        // The last count ended at the highest power of two ≤ total.
        total.checked_ilog2().map_or(0, |log| total - (1 << log))
    } else {
        total % BATCH
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn counts_and_the_rest_cover_every_operation_exactly_once() {
        for total in 0..1000 {
            let counted: u64 = (1..=total).filter_map(count_ending_at).sum();
            assert_eq!(counted + uncounted(total), total, "total {total}");
        }
        let ends: Vec<u64> = (1..=200).filter(|&n| count_ending_at(n).is_some()).collect();
        assert_eq!(ends, [1, 2, 4, 8, 16, 32, 64, 128, 192]);
    }
}
