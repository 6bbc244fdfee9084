//! Instance ids: what an [`Observation`](crate::observation::Observation)
//! names its instance by.
//!
//! An id is `generation << 16 | (entry index + 1)`: the low 16 bits pick the
//! instance table entry (0 is no instance), the high 16 bits the entry's
//! generation, which the registry bumps each time it reuses the entry, so an
//! id of a retired instance never names its entry's next occupant. Every
//! layer that meets an id (the registry minting it, the drain and the
//! primitives checking it against the table) decodes it here.

/// The bits of an id (and of an entry's generation word) that hold the
/// generation.
const GENERATION_BITS: u32 = 0xFFFF;

/// The id of table entry `index` in `generation` (only the generation's low
/// 16 bits count).
pub const fn compose(index: u32, generation: u32) -> u32 {
    ((generation & GENERATION_BITS) << 16) | (index + 1)
}

/// Splits an instance id into its table index (None for id 0).
pub const fn entry_index(id: u32) -> Option<u32> {
    (id & 0xFFFF).checked_sub(1)
}

/// [`entry_index`] for a lookup that bounds-checks anyway: id 0 gives
/// `u32::MAX`, which no table has.
#[inline(always)]
pub const fn index_unchecked(id: u32) -> u32 {
    (id & 0xFFFF).wrapping_sub(1)
}

/// The generation bits of an instance id.
pub const fn id_generation(id: u32) -> u32 {
    id >> 16
}

/// The generation an entry's `generation` word holds (the id's high bits).
pub const fn entry_generation(word: u32) -> u32 {
    word & GENERATION_BITS
}

/// Whether `id` names the entry whose `generation` word is `word` (given the
/// entry at [`entry_index`]`(id)`): the one check that an id is not stale.
pub const fn names(id: u32, word: u32) -> bool {
    entry_generation(word) == id_generation(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_stale_ones_are_refused() {
        let id = compose(4, 7);
        assert_eq!((entry_index(id), id_generation(id)), (Some(4), 7));
        assert!(names(id, 7));
        assert!(names(id, 0x1_0007), "only the low 16 bits of the word count");
        assert!(!names(id, 8), "a reused entry");
        assert_eq!(entry_index(0), None);
        assert_eq!(index_unchecked(0), u32::MAX);
        assert_eq!(compose(0, 0x1_0000), 1, "the generation wraps at 16 bits");
    }
}
