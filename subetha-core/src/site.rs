//! Call sites: the `file:line:column` that an operation which waited or
//! missed was called from, interned in a bounded table in the segment.
//!
//! # How a site travels
//!
//! Every acquiring method of the instrumented primitives is
//! `#[track_caller]`. Only their slow paths (a wait, a miss, a sampled hold)
//! look at the caller's [`Location`]: they intern it here, once per site and
//! thread, and put the id into the observation's otherwise unused
//! `_reserved` word (the seed's 24-byte layout and field offsets stay as
//! they are). The word is [`SiteWord`]: bits 0–15 the operation's own call
//! site, bits 16–31 the *holder* site, the call site of the hold whose
//! release ended the wait (only [`Mutex`](crate::Mutex) and
//! [`AdaptiveMutex`](crate::AdaptiveMutex) `lock`s fill it; see
//! `primitives::holder`). Id 0 is "none / not known"; [`OVERFLOW`] marks an
//! operation whose site found the table full, and each such operation is
//! counted in [`SiteTableHead::overflowed`].
//!
//! # The table
//!
//! At the layout's `site_table_offset`: a 64-byte [`SiteTableHead`], then
//! `site_capacity` [`SiteEntry`]s of 128 bytes; entry `i` is id `i + 1`.
//! A producer reserves an entry with one `fetch_add` on `next`, fills it
//! and publishes it by storing [`SITE_READY`] with `Release`. Two threads
//! interning the same new site at once may both append it: consumers merge
//! sites by their text, never by id, so a duplicate costs an entry, not a
//! wrong number. Entries are never freed (a process has a bounded number
//! of call sites), so a consumer can resolve an id at any later time,
//! including after the process exited, from its own cache.
//!
//! # Interning cost
//!
//! `#[track_caller]` rules out a `static` per call site, so each thread
//! keeps a direct-mapped cache of [`CACHE_SLOTS`] `(&'static Location, id)`
//! pairs keyed by the `Location`'s address: a hit is a thread-local load
//! and a compare, no shared line touched, no lock and no atomic
//! read-modify-write. A miss (a thread's first use of a site, or a
//! collision) searches the segment's table by content and appends if
//! absent. Nothing here runs on an uncontended fast path; the
//! `primitives` bench's uncontended rows show it.
//!
//! # Reading
//!
//! [`read_site`] is the consumer's side and treats the table as hostile:
//! ids are range-checked against the validated capacity and the clamped
//! `next`, an unpublished entry is reported as such, lengths beyond the
//! field, a NUL inside the text, line 0 and invalid UTF-8 are errors
//! ([`SiteError`]), and text is copied out before it is looked at.

use std::cell::Cell;
use std::panic::Location;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

/// Longest file path stored per site, in bytes (longer paths are cut from
/// the left, at a `/` where possible).
pub const SITE_FILE_MAX: usize = 112;
/// Sites in a new segment's table unless `SUBETHA_SITES` says otherwise.
pub const DEFAULT_SITES: u32 = 1024;
/// Largest site table: ids are 16 bits, with 0 and [`OVERFLOW`] reserved.
pub const MAX_SITES: u32 = 0xFFFE;
/// Site id: none, or not known.
pub const NONE: u16 = 0;
/// Site id: the operation's site did not fit in the table.
pub const OVERFLOW: u16 = 0xFFFF;
/// [`SiteEntry::state`]: filled in and published.
pub const SITE_READY: u32 = 1;
/// Per-thread cache entries (a power of two).
pub const CACHE_SLOTS: usize = 64;
const _: () = assert!(CACHE_SLOTS.is_power_of_two());

/// The table's live header.
#[repr(C, align(64))]
pub struct SiteTableHead {
    /// Entries reserved so far (may exceed the capacity: clamp it).
    pub next: AtomicU32,
    _pad0: u32,
    /// Operations whose site found the table full (they carry [`OVERFLOW`]).
    pub overflowed: AtomicU64,
    _pad1: [u8; 48],
}

/// One call site. 128 bytes.
#[repr(C)]
pub struct SiteEntry {
    /// 0 while being filled in, [`SITE_READY`] once published.
    pub state: AtomicU32,
    /// `Location::line()` (≥ 1).
    pub line: AtomicU32,
    /// `Location::column()`.
    pub column: AtomicU32,
    /// Bytes used in `file`.
    pub file_len: AtomicU32,
    /// UTF-8 path, `file_len` bytes, NUL-padded.
    pub file: [AtomicU8; SITE_FILE_MAX],
}

const _: () = {
    assert!(size_of::<SiteTableHead>() == 64);
    assert!(size_of::<SiteEntry>() == 128);
};

/// Bytes of a table of `capacity` sites.
pub const fn table_len(capacity: u32) -> usize {
    size_of::<SiteTableHead>() + capacity as usize * size_of::<SiteEntry>()
}

/// The observation word that carries site ids (`Observation::_reserved`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SiteWord(pub u32);

impl SiteWord {
    /// No site.
    pub const NONE: SiteWord = SiteWord(0);

    /// The operation's own site, no holder.
    pub const fn own(site: u16) -> Self {
        Self(site as u32)
    }

    /// The operation's own site and the site of the hold that ended its wait.
    pub const fn with_holder(site: u16, holder: u16) -> Self {
        Self(site as u32 | (holder as u32) << 16)
    }

    /// Bits 0–15: the operation's call site.
    pub const fn site(self) -> u16 {
        self.0 as u16
    }

    /// Bits 16–31: the holder's call site (0: none or not known).
    pub const fn holder(self) -> u16 {
        (self.0 >> 16) as u16
    }
}

/// A resolved call site.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site {
    /// Source path (as the compiler recorded it, maybe cut from the left).
    pub file: String,
    /// Line, 1-based.
    pub line: u32,
    /// Column, 1-based.
    pub column: u32,
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// What is wrong with a site id or its entry in a (possibly hostile) table.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SiteError {
    /// The segment has no site table (an older producer).
    #[error("the segment has no site table")]
    NoTable,
    /// Id 0 or [`OVERFLOW`]: no entry to read.
    #[error("site id {0} names no entry")]
    Reserved(u16),
    /// Beyond the table or the entries handed out so far.
    #[error("site id {id} out of range (table holds {len} of {capacity})")]
    OutOfRange {
        /// The id.
        id: u16,
        /// Entries handed out (clamped).
        len: u32,
        /// Table capacity.
        capacity: u32,
    },
    /// Reserved but not (yet) published.
    #[error("site id {0} is not published")]
    NotPublished(u16),
    /// `file_len` beyond the field.
    #[error("site id {id}: file length {len} exceeds the {SITE_FILE_MAX}-byte field")]
    BadLength {
        /// The id.
        id: u16,
        /// The length it claims.
        len: u32,
    },
    /// The path is empty, holds a NUL or is not UTF-8.
    #[error("site id {0}: path is empty, unterminated or not UTF-8")]
    BadText(u16),
    /// Line 0 (no `Location` has it).
    #[error("site id {0}: line 0")]
    BadLine(u16),
}

/// The site table of a validated segment: head and entries.
#[derive(Clone, Copy)]
pub struct SiteTable<'a> {
    /// Live header.
    pub head: &'a SiteTableHead,
    /// The entries.
    pub entries: &'a [SiteEntry],
}

impl SiteTable<'_> {
    /// Entries handed out, clamped to the capacity.
    pub fn len(&self) -> u32 {
        self.head
            .next
            .load(Ordering::Acquire)
            .min(self.entries.len() as u32)
    }

    /// Whether no entry was handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Operations that found the table full.
    pub fn overflowed(&self) -> u64 {
        self.head.overflowed.load(Ordering::Relaxed)
    }
}

/// Reads site `id` of `table` (hostile memory: see the module docs).
pub fn read_site(table: Option<SiteTable<'_>>, id: u16) -> Result<Site, SiteError> {
    let table = table.ok_or(SiteError::NoTable)?;
    if id == NONE || id == OVERFLOW {
        return Err(SiteError::Reserved(id));
    }
    let len = table.len();
    let capacity = table.entries.len() as u32;
    let index = u32::from(id) - 1;
    if index >= len {
        return Err(SiteError::OutOfRange { id, len, capacity });
    }
    let entry = &table.entries[index as usize];
    // Acquire: pairs with the producer's Release of SITE_READY.
    if entry.state.load(Ordering::Acquire) != SITE_READY {
        return Err(SiteError::NotPublished(id));
    }
    let file_len = entry.file_len.load(Ordering::Relaxed);
    if file_len as usize > SITE_FILE_MAX {
        return Err(SiteError::BadLength { id, len: file_len });
    }
    let raw: Vec<u8> = entry.file[..file_len as usize]
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    if raw.is_empty() || raw.contains(&0) {
        return Err(SiteError::BadText(id));
    }
    let file = String::from_utf8(raw).map_err(|_| SiteError::BadText(id))?;
    let line = entry.line.load(Ordering::Relaxed);
    if line == 0 {
        return Err(SiteError::BadLine(id));
    }
    let file = file
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    Ok(Site {
        file,
        line,
        column: entry.column.load(Ordering::Relaxed),
    })
}

/// `location`'s path as an entry stores it: cut from the left (at a `/`
/// where possible) to fit the field.
fn stored_path(file: &str) -> &str {
    if file.len() <= SITE_FILE_MAX {
        return file;
    }
    let mut cut = file.len() - SITE_FILE_MAX;
    while !file.is_char_boundary(cut) {
        cut += 1;
    }
    let tail = &file[cut..];
    match tail.find('/') {
        Some(slash) if slash + 1 < tail.len() => &tail[slash..],
        _ => tail,
    }
}

fn entry_matches(entry: &SiteEntry, line: u32, column: u32, path: &str) -> bool {
    entry.state.load(Ordering::Acquire) == SITE_READY
        && entry.line.load(Ordering::Relaxed) == line
        && entry.column.load(Ordering::Relaxed) == column
        && entry.file_len.load(Ordering::Relaxed) as usize == path.len()
        && entry.file[..path.len()]
            .iter()
            .zip(path.bytes())
            .all(|(a, b)| a.load(Ordering::Relaxed) == b)
}

/// Finds `location` in `table` or appends it; [`OVERFLOW`] (counted) when
/// the table is full.
pub(crate) fn intern_in(table: SiteTable<'_>, location: &Location<'_>) -> u16 {
    let path = stored_path(location.file());
    let (line, column) = (location.line().max(1), location.column());
    let seen = table.len();
    for (index, entry) in table.entries[..seen as usize].iter().enumerate() {
        if entry_matches(entry, line, column, path) {
            return index as u16 + 1;
        }
    }
    let index = table.head.next.fetch_add(1, Ordering::Relaxed);
    if index >= table.entries.len() as u32 {
        // Keep `next` from wrapping under a flood of overflowing sites.
        table
            .head
            .next
            .store(table.entries.len() as u32, Ordering::Relaxed);
        table.head.overflowed.fetch_add(1, Ordering::Relaxed);
        return OVERFLOW;
    }
    let entry = &table.entries[index as usize];
    entry.line.store(line, Ordering::Relaxed);
    entry.column.store(column, Ordering::Relaxed);
    let written = crate::segment::write_text(&entry.file, path);
    entry.file_len.store(written, Ordering::Relaxed);
    // Release: a reader that sees READY sees the fields.
    entry.state.store(SITE_READY, Ordering::Release);
    index as u16 + 1
}

#[derive(Clone, Copy)]
struct Cached {
    location: usize,
    id: u16,
    generation: u32,
}

thread_local! {
    static CACHE: [Cell<Cached>; CACHE_SLOTS] = const {
        [const { Cell::new(Cached { location: 0, id: 0, generation: 0 }) }; CACHE_SLOTS]
    };
}

/// The id of `location` in this process's segment ([`NONE`] if there is
/// none; [`OVERFLOW`], counted, when the table is full). For slow paths
/// only.
#[cold]
#[inline(never)]
pub(crate) fn intern(location: &'static Location<'static>) -> u16 {
    let key = location as *const Location<'static> as usize;
    let generation = crate::registry::fork_generation();
    let slot = (key >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - CACHE_SLOTS.trailing_zeros());
    let cached = CACHE.try_with(|cache| cache[slot].get()).unwrap_or(Cached {
        location: 0,
        id: 0,
        generation: 0,
    });
    if cached.location == key && cached.generation == generation && cached.id != NONE {
        if cached.id == OVERFLOW {
            count_overflow();
        }
        return cached.id;
    }
    let Ok(segment) = crate::registry::process_segment() else {
        return NONE;
    };
    let Some(table) = segment.view().sites() else {
        return NONE;
    };
    let id = intern_in(table, location);
    let _ = CACHE.try_with(|cache| {
        cache[slot].set(Cached {
            location: key,
            id,
            generation,
        })
    });
    id
}

#[cold]
fn count_overflow() {
    if let Ok(segment) = crate::registry::process_segment()
        && let Some(table) = segment.view().sites()
    {
        table.head.overflowed.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    fn table(capacity: usize) -> (Box<SiteTableHead>, Vec<SiteEntry>) {
        // SAFETY: both types are atomics and padding: all-zero is valid.
        let head: Box<SiteTableHead> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: as above.
        let entries = (0..capacity).map(|_| unsafe { std::mem::zeroed() }).collect();
        (head, entries)
    }

    #[test]
    fn layout_is_fixed() {
        assert_eq!(offset_of!(SiteTableHead, overflowed), 8);
        assert_eq!(offset_of!(SiteEntry, file_len), 12);
        assert_eq!(offset_of!(SiteEntry, file), 16);
        assert_eq!(table_len(2), 64 + 256);
    }

    #[test]
    fn sites_intern_once_read_back_and_overflow_is_counted() {
        let (head, entries) = table(2);
        let t = SiteTable {
            head: &head,
            entries: &entries,
        };
        let a = Location::caller();
        let b = Location::caller();
        let id_a = intern_in(t, a);
        assert_eq!(id_a, 1);
        assert_eq!(intern_in(t, a), 1, "found by content");
        let id_b = intern_in(t, b);
        assert_eq!(id_b, 2);
        let site = read_site(Some(t), id_a).unwrap();
        assert_eq!((site.line, site.column), (a.line(), a.column()));
        assert!(site.file.ends_with("site.rs"), "{site}");
        let c = Location::caller();
        assert_eq!(intern_in(t, c), OVERFLOW);
        assert_eq!(intern_in(t, c), OVERFLOW);
        assert_eq!(t.overflowed(), 2);
        assert_eq!(t.len(), 2, "next is clamped");
        assert_eq!(read_site(Some(t), id_b).unwrap().line, b.line());
    }

    #[test]
    fn hostile_entries_get_clear_errors() {
        let (head, entries) = table(4);
        let t = SiteTable {
            head: &head,
            entries: &entries,
        };
        intern_in(t, Location::caller());
        assert_eq!(read_site(None, 1), Err(SiteError::NoTable));
        assert_eq!(read_site(Some(t), 0), Err(SiteError::Reserved(0)));
        assert_eq!(read_site(Some(t), OVERFLOW), Err(SiteError::Reserved(OVERFLOW)));
        assert!(matches!(
            read_site(Some(t), 2),
            Err(SiteError::OutOfRange { id: 2, .. })
        ));
        head.next.store(u32::MAX, Ordering::Relaxed);
        assert_eq!(t.len(), 4, "a hostile next is clamped");
        assert!(matches!(read_site(Some(t), 9), Err(SiteError::OutOfRange { .. })));
        assert_eq!(read_site(Some(t), 2), Err(SiteError::NotPublished(2)));
        entries[1].state.store(SITE_READY, Ordering::Relaxed);
        entries[1]
            .file_len
            .store(SITE_FILE_MAX as u32 + 1, Ordering::Relaxed);
        assert!(matches!(read_site(Some(t), 2), Err(SiteError::BadLength { .. })));
        entries[1].file_len.store(0, Ordering::Relaxed);
        assert_eq!(read_site(Some(t), 2), Err(SiteError::BadText(2)), "empty");
        entries[1].file_len.store(3, Ordering::Relaxed);
        entries[1].file[0].store(b'a', Ordering::Relaxed);
        assert_eq!(read_site(Some(t), 2), Err(SiteError::BadText(2)), "NUL inside");
        entries[1].file[1].store(0xFF, Ordering::Relaxed);
        entries[1].file[2].store(b'c', Ordering::Relaxed);
        assert_eq!(read_site(Some(t), 2), Err(SiteError::BadText(2)), "not UTF-8");
        entries[1].file[1].store(b'\n', Ordering::Relaxed);
        assert_eq!(read_site(Some(t), 2), Err(SiteError::BadLine(2)));
        entries[1].line.store(7, Ordering::Relaxed);
        assert_eq!(read_site(Some(t), 2).unwrap().to_string(), "a?c:7:0", "sanitised");
    }

    #[test]
    fn long_paths_are_cut_from_the_left() {
        let long = format!("/{}/src/lib.rs", "d".repeat(300));
        let cut = stored_path(&long);
        assert!(
            cut.len() <= SITE_FILE_MAX && cut.ends_with("/src/lib.rs"),
            "{cut}"
        );
        assert_eq!(stored_path("src/a.rs"), "src/a.rs");
    }

    #[test]
    fn site_words_pack_both_ids() {
        let w = SiteWord::with_holder(3, 0xFFFF);
        assert_eq!((w.site(), w.holder()), (3, 0xFFFF));
        assert_eq!(SiteWord::own(9).holder(), 0);
    }
}
