//! The shared-memory segment: one per instrumented process, holding a
//! versioned header, the instance table and the ring slots.
//!
//! # Layout (ABI version 1)
//!
//! ```text
//! offset 0                      SegmentHeader (one page)
//!   0..128   SegmentLayout      immutable after creation: magic, ABI, sizes,
//!                               pid/uid/start time, table geometry, clock
//!                               calibration
//!   128..    SegmentLive        atomics: high-water marks, lost counters,
//!                               the consumer lease
//! instance_table_offset         [InstanceEntry; instance_capacity] (256 B each)
//! ring_table_offset             [RingSlot; ring_slot_capacity] (64 B meta +
//!                               64 B consumer accounting + ObservationRing)
//! sites.offset (header @256)    SiteTableHead (64 B) + [SiteEntry; sites.capacity]
//!                               (128 B each; see crate::site)
//! ```
//!
//! Every struct is `#[repr(C)]` with explicit padding and is asserted in
//! tests, because another process (the agent, perhaps built from another
//! commit) reads the same bytes. A reader checks `magic`, `abi_version` and
//! every size before it trusts an offset.
//!
//! # Creation
//!
//! [`Segment::create`] makes a `memfd_create` file named `subetha`, sizes it
//! once, seals it against shrinking and growing (so a reader that mapped it
//! can never take `SIGBUS`) and maps it shared. Pages are committed on first
//! touch: reserving 256 ring slots costs only the rings threads actually
//! use. The header's `magic` is written last, with `Release`, so a reader
//! that sees the magic sees a complete header. Without memfd the segment
//! falls back to anonymous memory (one warning; the process still runs, it
//! just cannot be drained by another process).
//!
//! # Reading
//!
//! [`SegmentView`] is the consumer's handle. It copies the immutable layout
//! out once, validates it ([`SegmentError`] names what is wrong) and from then
//! on computes every address from that validated copy, never from live
//! memory. Live values (high-water marks, states, lengths) are clamped before
//! use, so memory rewritten by a hostile process can produce wrong numbers
//! but never an out-of-bounds access.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence};

use crate::clock::{self, Calibration};
use crate::ring::ObservationRing;

/// `b"SUBETHA\0"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SUBETHA\0");
/// Version of this layout. Bumped on any incompatible change.
pub const ABI_VERSION: u32 = 1;
/// The memfd name; `/proc/<pid>/fd/<n>` links read `/memfd:subetha (deleted)`.
pub const MEMFD_NAME: &str = "subetha";
/// Size of the header region: one page.
pub const HEADER_SIZE: usize = 4096;
/// Longest instance name, in bytes.
pub const INSTANCE_NAME_MAX: usize = 64;
/// Longest kind or op name, in bytes.
pub const SHORT_NAME_MAX: usize = 16;
/// Longest thread name stored per ring slot, in bytes (longer names are cut).
pub const THREAD_NAME_MAX: usize = 24;
/// Op kinds per instance (`1..=7`).
pub const OP_KINDS: usize = 7;
/// Largest instance table: ids carry the index in 16 bits.
pub const MAX_INSTANCES: u32 = 0xFFFF;
/// Largest ring table.
pub const MAX_RING_SLOTS: u32 = 16_384;
/// Default number of instance entries.
pub const DEFAULT_INSTANCES: u32 = 4096;
/// Default number of ring slots (threads that observe at once).
pub const DEFAULT_RING_SLOTS: u32 = 256;

const PAGE: usize = 4096;

/// Immutable part of the header, written once before `magic` is published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct SegmentLayout {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// Size of the header region ([`HEADER_SIZE`]).
    pub header_size: u32,
    /// Size of the whole segment in bytes.
    pub total_size: u64,
    /// Process that created the segment.
    pub pid: u32,
    /// Real uid of that process.
    pub uid: u32,
    /// The creator's start time, field 22 of `/proc/<pid>/stat` (clock ticks
    /// since boot): tells a reused pid from the original process.
    pub start_time_ticks: u64,
    /// Entries in the instance table.
    pub instance_capacity: u32,
    /// Slots in the ring table.
    pub ring_slot_capacity: u32,
    /// Byte offset of the instance table.
    pub instance_table_offset: u64,
    /// Byte offset of the ring table.
    pub ring_table_offset: u64,
    /// `size_of::<InstanceEntry>()`.
    pub instance_entry_size: u32,
    /// `size_of::<RingSlot>()`.
    pub ring_slot_size: u32,
    /// `ObservationRing::CAPACITY`.
    pub ring_capacity: u32,
    /// `size_of::<Observation>()`.
    pub observation_size: u32,
    /// Clock calibration for converting `latency_ticks` and tick instants.
    pub calibration: Calibration,
    /// CLOCK_MONOTONIC nanoseconds at creation.
    pub created_mono_ns: u64,
    /// Inode of the creator's pid namespace (`stat /proc/self/ns/pid`), so
    /// that a consumer in another namespace checks `pid` in the right one;
    /// 0 when unknown (no `/proc`, or a writer older than this field, which
    /// was reserved and zero).
    pub pid_ns_inode: u64,
}

/// Live, atomically accessed part of the header.
#[repr(C, align(64))]
pub struct SegmentLive {
    /// One past the highest instance index ever claimed.
    pub instances_high_water: AtomicU32,
    /// One past the highest ring slot index ever claimed.
    pub rings_high_water: AtomicU32,
    /// Observations lost because their thread could not get a ring slot
    /// (table full, or the thread was exiting).
    pub lost_no_ring: AtomicU64,
    /// Bumped each time a ring slot becomes claimable (the consumer freed
    /// it, or its thread exited and it may be adopted), so threads that
    /// found the table full know when to look again.
    pub ring_free_epoch: AtomicU32,
    /// OS thread id of the latest thread that found no ring slot (0: none
    /// yet): a consumer names it in its `no_ring` storm.
    pub lost_no_ring_tid: AtomicU32,
    _pad0: [u8; 40],
    /// The consumer lease: `pid << 32 | token` of the consumer draining the
    /// segment, 0 when nobody does. See [`ConsumerLease`](crate::lease).
    pub consumer: AtomicU64,
    /// CLOCK_MONOTONIC ns of the consumer's latest scan.
    pub consumer_heartbeat_ns: AtomicU64,
    /// A would-be consumer's `pid << 32 | token` asking for the lease.
    pub takeover_request: AtomicU64,
    /// Sidecar mode chosen by the application (0 off, 1 auto, 2 always).
    pub sidecar_mode: AtomicU32,
    _pad1: [u8; 36],
}

/// The header page.
#[repr(C, align(64))]
pub struct SegmentHeader {
    /// Written once at creation.
    pub layout: SegmentLayout,
    /// Atomics.
    pub live: SegmentLive,
    /// Where the call-site table is (immutable, written before `magic`).
    pub sites: SiteTableLayout,
    _reserved: [u8; HEADER_SIZE - 128 - 128 - 8],
}

/// The call-site table's place in the segment, at byte 256 of the header
/// page ([`crate::site`]). All zero in a segment without one (a writer
/// older than the table, whose header page was zero there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct SiteTableLayout {
    /// Byte offset of the table; 0 when `capacity` is 0.
    pub offset: u32,
    /// Entries (0: none).
    pub capacity: u32,
}

/// Byte offset of [`SiteTableLayout`] in the header page.
const SITE_LAYOUT_OFFSET: usize = 256;

/// Instance entry states.
pub mod instance_state {
    /// Unused.
    pub const FREE: u32 = 0;
    /// Being filled in by a registering thread.
    pub const CLAIMED: u32 = 1;
    /// Registered; observations may carry its id.
    pub const LIVE: u32 = 2;
    /// Unregistered; the consumer drains, keeps final stats, then frees it.
    pub const RETIRED: u32 = 3;
}

/// One registered instance (a mutex, a channel, ...). 256 bytes.
#[repr(C, align(64))]
pub struct InstanceEntry {
    /// An [`instance_state`] value.
    pub state: AtomicU32,
    /// Bumped when the entry is freed; the low 16 bits are part of the id.
    pub generation: AtomicU32,
    /// Kind code ([`crate::InstanceKind::code`]).
    pub kind: AtomicU32,
    /// Policy word: written by the consumer, read by the primitive.
    pub policy: AtomicU32,
    /// Bytes used in `name`.
    pub name_len: AtomicU32,
    /// Bit `k - 1` set when op kind `k` has a name.
    pub op_mask: AtomicU32,
    /// CLOCK_MONOTONIC ns at registration.
    pub registered_mono_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns at unregistration (0 while live).
    pub retired_mono_ns: AtomicU64,
    _pad0: [u8; 24],
    /// UTF-8 name, `name_len` bytes.
    pub name: [AtomicU8; INSTANCE_NAME_MAX],
    /// Kind name, NUL-padded.
    pub kind_name: [AtomicU8; SHORT_NAME_MAX],
    /// Names of op kinds 1..=7, NUL-padded.
    pub op_names: [[AtomicU8; SHORT_NAME_MAX]; OP_KINDS],
}

/// Ring slot states.
pub mod slot_state {
    /// Unused; a thread may claim it.
    pub const FREE: u32 = 0;
    /// Being set up by a claiming thread.
    pub const CLAIMED: u32 = 1;
    /// Owned by a live thread that pushes into it.
    pub const ACTIVE: u32 = 2;
    /// Its thread exited; the consumer drains what is left and frees it,
    /// unless a thread that found no free slot adopts it first.
    pub const ORPHANED: u32 = 3;
}

/// A ring and what the consumer needs to know about its producer.
#[repr(C, align(64))]
pub struct RingSlot {
    /// A [`slot_state`] value.
    pub state: AtomicU32,
    /// Bumped at each claim.
    pub generation: AtomicU32,
    /// The producer's OS thread id (`gettid`).
    pub os_tid: AtomicU32,
    /// The producer's [`crate::thread_id`].
    pub thread_id: AtomicU32,
    /// CLOCK_MONOTONIC ns at claim.
    pub claimed_mono_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns when the thread exited (0 while active).
    pub orphaned_mono_ns: AtomicU64,
    /// Bytes used in `thread_name`.
    pub thread_name_len: AtomicU32,
    _pad0: [u8; 4],
    /// The producer thread's name, cut to [`THREAD_NAME_MAX`] bytes.
    pub thread_name: [AtomicU8; THREAD_NAME_MAX],
    /// Consumer-owned: observations drained from this slot over its whole
    /// life (all generations). Its low 32 bits track the ring's `head`, so a
    /// consumer that crashed between publishing `head` and updating this is
    /// reconciled by the next one ([`RingSlot::reconcile_drained`]).
    pub drained_total: AtomicU64,
    /// The ring's drop counter when the current occupant claimed the slot
    /// (written by the claiming thread before it publishes ACTIVE): a
    /// consumer attaching later charges the occupant only drops after it.
    pub dropped_at_claim: AtomicU64,
    /// The ring's episode counter at claim, likewise.
    pub episodes_at_claim: AtomicU32,
    _pad1: [u8; 44],
    /// The ring itself.
    pub ring: ObservationRing,
}

impl RingSlot {
    /// Consumer: brings `drained_total` in line with the ring's `head`
    /// (authoritative) and returns it.
    pub fn reconcile_drained(&self) -> u64 {
        let total = self.drained_total.load(Ordering::Relaxed);
        let head = self.ring.head();
        let behind = head.wrapping_sub(total as u32);
        if behind == 0 {
            return total;
        }
        // Wrapping: the word may have been overwritten by a hostile process.
        let fixed = total.wrapping_add(u64::from(behind));
        self.drained_total.store(fixed, Ordering::Relaxed);
        fixed
    }
}

/// What is wrong with a segment another process published.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// Smaller than a header.
    #[error("segment is {0} bytes, smaller than its {HEADER_SIZE}-byte header")]
    TooSmall(usize),
    /// Wrong magic.
    #[error("bad magic {0:#018x} (not a subetha segment, or not initialised yet)")]
    BadMagic(u64),
    /// ABI version this build does not read.
    #[error("ABI version {found}, this build reads {ABI_VERSION}")]
    AbiMismatch {
        /// The segment's version.
        found: u32,
    },
    /// A size field disagrees with this build or with the mapping.
    #[error("{field} is {found}, expected {expected}")]
    BadSize {
        /// Which field.
        field: &'static str,
        /// What the segment says.
        found: u64,
        /// What it must be.
        expected: u64,
    },
    /// A table does not fit, overlaps another or is misaligned.
    #[error("{0} table is out of bounds, misaligned or overlapping")]
    BadTable(&'static str),
    /// Capacity beyond what this build accepts.
    #[error("{field} capacity {found} exceeds {max}")]
    TooLarge {
        /// Which table.
        field: &'static str,
        /// What the segment says.
        found: u32,
        /// The limit.
        max: u32,
    },
    /// The calibration is garbage.
    #[error("clock calibration invalid: {0}")]
    BadCalibration(String),
    /// The header names another process than the one it was found in.
    #[error("segment claims pid {found}, found in pid {expected}")]
    PidMismatch {
        /// Header pid.
        found: u32,
        /// The process it was found in.
        expected: u32,
    },
    /// The pid was reused: start times differ.
    #[error("segment's process start time {found} differs from pid's {expected} (pid reused?)")]
    StartTimeMismatch {
        /// Header value.
        found: u64,
        /// `/proc/<pid>/stat` value.
        expected: u64,
    },
    /// The header names another pid namespace than the process's.
    #[error("segment claims pid namespace {found}, process lives in pid namespace {expected}")]
    PidNamespaceMismatch {
        /// Header inode.
        found: u64,
        /// `/proc/<pid>/ns/pid` inode.
        expected: u64,
    },
    /// The header's uid is not the process's owner.
    #[error("segment claims uid {found}, process belongs to uid {expected}")]
    UidMismatch {
        /// Header uid.
        found: u32,
        /// The process's uid.
        expected: u32,
    },
    /// The file is not sealed against shrinking: mapping it could SIGBUS.
    #[error("memfd is not sealed against shrinking (seals {0:#x})")]
    NotSealed(i32),
    /// A system call failed.
    #[error("{call}: {source}")]
    Os {
        /// Which call.
        call: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl SegmentError {
    fn os(call: &'static str) -> Self {
        SegmentError::Os {
            call,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// Table sizes for a new segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentConfig {
    /// Instance entries (≤ [`MAX_INSTANCES`]).
    pub instances: u32,
    /// Ring slots (≤ [`MAX_RING_SLOTS`]).
    pub ring_slots: u32,
}

impl Default for SegmentConfig {
    fn default() -> Self {
        Self {
            instances: DEFAULT_INSTANCES,
            ring_slots: DEFAULT_RING_SLOTS,
        }
    }
}

impl SegmentConfig {
    /// Defaults overridden by `SUBETHA_INSTANCES` and `SUBETHA_RING_SLOTS`
    /// (clamped to 1..=limit; unparsable values are ignored with a warning).
    pub fn from_env() -> Self {
        let mut config = Self::default();
        if let Some(n) = env_u32("SUBETHA_INSTANCES") {
            config.instances = n.clamp(1, MAX_INSTANCES);
        }
        if let Some(n) = env_u32("SUBETHA_RING_SLOTS") {
            config.ring_slots = n.clamp(1, MAX_RING_SLOTS);
        }
        config
    }

    /// The geometry with a call-site table of `sites` entries.
    fn geometry_with_sites(&self, sites: u32) -> Geometry {
        let instances = self.instances.clamp(1, MAX_INSTANCES);
        let ring_slots = self.ring_slots.clamp(1, MAX_RING_SLOTS);
        let instance_table_offset = HEADER_SIZE;
        let instance_table_len = instances as usize * size_of::<InstanceEntry>();
        let ring_table_offset = round_up(instance_table_offset + instance_table_len, PAGE);
        let site_table_offset = round_up(
            ring_table_offset + ring_slots as usize * size_of::<RingSlot>(),
            PAGE,
        );
        let sites = sites.min(crate::site::MAX_SITES);
        let total_size = round_up(site_table_offset + crate::site::table_len(sites), PAGE);
        Geometry {
            instances,
            ring_slots,
            sites,
            instance_table_offset,
            ring_table_offset,
            site_table_offset,
            total_size,
        }
    }
}

fn env_u32(key: &str) -> Option<u32> {
    let value = std::env::var(key).ok()?;
    match value.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => {
            tracing::warn!(%key, %value, "ignoring unparsable subetha setting");
            None
        }
    }
}

struct Geometry {
    instances: u32,
    ring_slots: u32,
    sites: u32,
    instance_table_offset: usize,
    ring_table_offset: usize,
    site_table_offset: usize,
    total_size: usize,
}

const fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// How the segment's memory was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A sealed memfd another process can open through `/proc/<pid>/fd`.
    Memfd,
    /// Anonymous memory: memfd was unavailable. Only in-process consumers.
    Anonymous,
}

/// A mapping this process owns; unmapped on drop.
#[derive(Debug)]
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn map(fd: Option<BorrowedFd<'_>>, len: usize) -> Result<Self, SegmentError> {
        let (flags, raw_fd) = match fd {
            Some(fd) => (libc::MAP_SHARED, fd.as_raw_fd()),
            None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr null); no
        // existing memory is affected. The result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw_fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(SegmentError::os("mmap"));
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| SegmentError::os("mmap"))?;
        Ok(Self { base, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is a mapping this value created and owns;
        // every reference into it is tied to the lifetime of its owner.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

// SAFETY: the mapping is plain memory accessed through atomics; the raw
// pointer is only an address.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

/// A segment this process created: owns the mapping and the memfd.
#[derive(Debug)]
pub struct Segment {
    view: SegmentView,
    fd: Option<OwnedFd>,
    backing: Backing,
}

impl Segment {
    /// Creates, sizes, seals and maps a new segment for this process.
    /// Falls back to anonymous memory (one warning) when memfd fails.
    pub fn create(config: SegmentConfig) -> Result<Self, SegmentError> {
        let sites =
            env_u32("SUBETHA_SITES").map_or(crate::site::DEFAULT_SITES, |n| n.min(crate::site::MAX_SITES));
        let geometry = config.geometry_with_sites(sites);
        let (fd, backing) = match create_sealed_memfd(geometry.total_size) {
            Ok(fd) => (Some(fd), Backing::Memfd),
            Err(error) => {
                tracing::warn!(
                    %error,
                    "subetha: memfd unavailable, using anonymous memory; \
                     an external agent cannot drain this process"
                );
                (None, Backing::Anonymous)
            }
        };
        let mapping = Mapping::map(fd.as_ref().map(AsFd::as_fd), geometry.total_size)?;
        let layout = SegmentLayout {
            magic: MAGIC,
            abi_version: ABI_VERSION,
            header_size: HEADER_SIZE as u32,
            total_size: geometry.total_size as u64,
            pid: std::process::id(),
            // SAFETY: getuid has no preconditions and cannot fail.
            uid: unsafe { libc::getuid() },
            start_time_ticks: own_start_time().unwrap_or(0),
            instance_capacity: geometry.instances,
            ring_slot_capacity: geometry.ring_slots,
            instance_table_offset: geometry.instance_table_offset as u64,
            ring_table_offset: geometry.ring_table_offset as u64,
            instance_entry_size: size_of::<InstanceEntry>() as u32,
            ring_slot_size: size_of::<RingSlot>() as u32,
            ring_capacity: ObservationRing::CAPACITY as u32,
            observation_size: size_of::<crate::Observation>() as u32,
            calibration: *clock::calibration(),
            created_mono_ns: clock::monotonic_ns(),
            pid_ns_inode: own_pid_ns_inode().unwrap_or(0),
        };
        let header = mapping.base.as_ptr().cast::<SegmentLayout>();
        // SAFETY: the mapping is at least HEADER_SIZE bytes, page-aligned and
        // private to us until `magic` is published; write everything but the
        // magic (left 0 by the fresh mapping) and then publish the magic.
        unsafe {
            header.write(SegmentLayout { magic: 0, ..layout });
            header
                .cast::<u8>()
                .add(SITE_LAYOUT_OFFSET)
                .cast::<SiteTableLayout>()
                .write(SiteTableLayout {
                    offset: geometry.site_table_offset as u32,
                    capacity: geometry.sites,
                });
            fence(Ordering::Release);
            (*header.cast::<AtomicU64>()).store(MAGIC, Ordering::Release);
        }
        let mut view = SegmentView::from_mapping(mapping, &Expectations::default())
            .expect("a segment this build just wrote is valid");
        view.presence = fd.as_ref().map(AsRawFd::as_raw_fd);
        Ok(Self { view, fd, backing })
    }

    /// The consumer's view of this segment (the sidecar drains through it).
    pub fn view(&self) -> &SegmentView {
        &self.view
    }

    /// The memfd, when backed by one.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// How the memory was obtained.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Closes the memfd but keeps the mapping. Used in a forked child, whose
    /// inherited descriptor would otherwise make it look like the parent's
    /// segment belonged to it.
    pub(crate) fn forget_fd(&mut self) {
        self.fd = None;
        self.view.presence = None;
    }
}

/// Marks the open description `fd` of a segment's memfd as mapped by a
/// consumer outside the creator's pid namespace (see
/// [`SegmentView::foreign_consumer_present`]). The shared lock lives with
/// the open description, which a mapping keeps open: it stays while the
/// segment is mapped, even after `fd` is closed, and goes when it is
/// unmapped or the process dies. `fd` must be the consumer's own open
/// description (opened through `/proc`), never one shared with the creator
/// (a descriptor received over a socket is the creator's description: its
/// test would convert and drop the lock).
pub fn announce_presence(fd: BorrowedFd<'_>) -> Result<(), SegmentError> {
    // Blocking: the creator's exclusive test holds its lock for two calls.
    // SAFETY: flock on a descriptor we borrow; no memory involved.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_SH) } != 0 {
        return Err(SegmentError::os("flock(LOCK_SH)"));
    }
    Ok(())
}

fn create_sealed_memfd(len: usize) -> Result<OwnedFd, SegmentError> {
    let name = std::ffi::CString::new(MEMFD_NAME).expect("no NUL in the name");
    // SAFETY: `name` is a valid NUL-terminated string; the flags are valid.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(SegmentError::os("memfd_create"));
    }
    // SAFETY: `raw` is a descriptor we just opened and own exclusively.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(SegmentError::os("ftruncate"));
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on our own descriptor with a valid command.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(SegmentError::os("fcntl(F_ADD_SEALS)"));
    }
    Ok(fd)
}

/// Field 22 of `/proc/self/stat`.
///
/// Read through `/proc/self`, not `/proc/<getpid()>`: in a pid namespace
/// whose `/proc` was not remounted, the pid `getpid` returns names another
/// process (or none) in the `/proc` this process sees.
fn own_start_time() -> Option<u64> {
    stat_start_time(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// The inode of this process's pid namespace.
fn own_pid_ns_inode() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// Field 22 (`starttime`, clock ticks since boot) of `/proc/<pid>/stat`.
pub fn process_start_time(pid: u32) -> Option<u64> {
    stat_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 of the text of a `/proc/<pid>/stat` file.
fn stat_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: skip to
    // the last ')'. Field 3 is then the first after it; field 22 the 20th.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// What a consumer expects of a segment found in another process. Fields
/// left `None` are not checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expectations {
    /// The pid it was found in.
    pub pid: Option<u32>,
    /// That process's start time (`/proc/<pid>/stat` field 22).
    pub start_time_ticks: Option<u64>,
    /// That process's uid.
    pub uid: Option<u32>,
    /// The inode of that process's pid namespace, checked against
    /// [`SegmentLayout::pid_ns_inode`] unless the header left it 0.
    pub pid_ns_inode: Option<u64>,
}

/// A validated handle on a segment's memory: the consumer side.
///
/// All addresses derive from a copy of the layout taken and validated at
/// construction; see the [module docs](self).
#[derive(Debug)]
pub struct SegmentView {
    base: NonNull<u8>,
    layout: SegmentLayout,
    sites: SiteTableLayout,
    _mapping: Option<Mapping>,
    /// The creator's own descriptor of the memfd, to test for [consumers
    /// outside its pid namespace](Self::foreign_consumer_present); `None` in
    /// consumers. Borrowed from the [`Segment`] that owns both it and this
    /// view (not a duplicate: discovery expects one `memfd:subetha`
    /// descriptor per process), and cleared before that descriptor closes.
    presence: Option<std::os::fd::RawFd>,
}

// SAFETY: the view only hands out shared references to atomics in the
// mapping, which any thread may use.
unsafe impl Send for SegmentView {}
// SAFETY: as above.
unsafe impl Sync for SegmentView {}

impl SegmentView {
    /// Maps the memfd `fd` (e.g. opened through `/proc/<pid>/fd/<n>`) and
    /// validates it against `expect`. Refuses files not sealed against
    /// shrinking. The mapping is shared and writable (a consumer publishes
    /// `head` and the lease), so `fd` must be open for reading and writing.
    pub fn map_fd(fd: BorrowedFd<'_>, expect: &Expectations) -> Result<Self, SegmentError> {
        // SAFETY: fcntl F_GET_SEALS on a descriptor we borrow.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(SegmentError::os("fcntl(F_GET_SEALS)"));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(SegmentError::NotSealed(seals));
        }
        // SAFETY: fstat into a zeroed stat buffer we own.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(SegmentError::os("fstat"));
        }
        let len = usize::try_from(stat.st_size).unwrap_or(0);
        if len < HEADER_SIZE {
            return Err(SegmentError::TooSmall(len));
        }
        if len > max_segment_size() {
            return Err(SegmentError::BadSize {
                field: "file size",
                found: len as u64,
                expected: max_segment_size() as u64,
            });
        }
        let mapping = Mapping::map(Some(fd), len)?;
        Self::from_mapping(mapping, expect)
    }

    /// Validates memory this process already maps (e.g. its own segment).
    ///
    /// # Safety
    ///
    /// `base..base + len` must be mapped readable and writable, aligned to a
    /// page, and stay mapped for the life of the returned view.
    pub unsafe fn from_raw(
        base: NonNull<u8>,
        len: usize,
        expect: &Expectations,
    ) -> Result<Self, SegmentError> {
        let layout = Self::read_layout(base, len)?;
        validate(&layout, len, expect)?;
        let sites = Self::read_site_layout(base, &layout)?;
        Ok(Self {
            base,
            layout,
            sites,
            _mapping: None,
            presence: None,
        })
    }

    fn from_mapping(mapping: Mapping, expect: &Expectations) -> Result<Self, SegmentError> {
        let layout = Self::read_layout(mapping.base, mapping.len)?;
        validate(&layout, mapping.len, expect)?;
        let sites = Self::read_site_layout(mapping.base, &layout)?;
        Ok(Self {
            base: mapping.base,
            layout,
            sites,
            _mapping: Some(mapping),
            presence: None,
        })
    }

    /// Copies the site table's place out of a header already validated
    /// (so the page is mapped) and checks it against `layout`.
    fn read_site_layout(base: NonNull<u8>, layout: &SegmentLayout) -> Result<SiteTableLayout, SegmentError> {
        // SAFETY: the header page is mapped (validated: len ≥ HEADER_SIZE),
        // the offset is 8-aligned within it, and the type is Pod. Volatile:
        // one copy of bytes that may change under us.
        let sites = unsafe {
            std::ptr::read_volatile(base.as_ptr().add(SITE_LAYOUT_OFFSET).cast::<SiteTableLayout>())
        };
        validate_sites(layout, &sites)?;
        Ok(sites)
    }

    fn read_layout(base: NonNull<u8>, len: usize) -> Result<SegmentLayout, SegmentError> {
        if len < HEADER_SIZE {
            return Err(SegmentError::TooSmall(len));
        }
        // Acquire on the magic: pairs with the creator's Release, so a
        // published header is complete.
        // SAFETY: the mapping is at least a page and page-aligned, so the
        // first 8 bytes are an aligned u64 we may read atomically.
        let magic = unsafe { (*base.as_ptr().cast::<AtomicU64>()).load(Ordering::Acquire) };
        if magic != MAGIC {
            return Err(SegmentError::BadMagic(magic));
        }
        // SAFETY: in bounds (len ≥ HEADER_SIZE > size_of::<SegmentLayout>()),
        // aligned, and SegmentLayout is Pod so any bytes are a valid value.
        // Volatile: the bytes may change under us; we want one copy.
        Ok(unsafe { std::ptr::read_volatile(base.as_ptr().cast::<SegmentLayout>()) })
    }

    /// Whether a consumer outside the creator's pid namespace maps this
    /// segment, asked by the creator: such a consumer holds a shared `flock`
    /// on its own open description of the memfd ([`announce_presence`])
    /// for as long as it maps it, and the kernel drops that lock when the
    /// consumer unmaps or dies, however it dies. An exclusive try-lock on
    /// the creator's description fails exactly while one is held. `None`
    /// when this view is not the creator's or the test itself fails.
    ///
    /// Why a lock: the creator cannot see a host agent's pid from inside a
    /// container, and a heartbeat cannot tell a stopped consumer (which may
    /// resume mid-pop) from a dead one.
    pub fn foreign_consumer_present(&self) -> Option<bool> {
        let fd = self.presence?;
        // SAFETY: flock on a descriptor this view owns; no memory involved.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            // SAFETY: as above; releases the lock just taken.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
            return Some(false);
        }
        (std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)).then_some(true)
    }

    /// The validated layout copy.
    pub fn layout(&self) -> &SegmentLayout {
        &self.layout
    }

    /// The segment's base address in this process (for the scan hooks).
    pub fn base_addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// The live header fields.
    pub fn live(&self) -> &SegmentLive {
        // SAFETY: validated: the header page is in bounds; SegmentLive sits
        // at offset 128, 64-aligned, and consists of atomics and padding, for
        // which every bit pattern is valid.
        unsafe { &*self.base.as_ptr().add(128).cast::<SegmentLive>() }
    }

    /// Instance entry `index`, if within the table.
    pub fn instance(&self, index: u32) -> Option<&InstanceEntry> {
        if index >= self.layout.instance_capacity {
            return None;
        }
        let offset = self.layout.instance_table_offset as usize + index as usize * size_of::<InstanceEntry>();
        // SAFETY: validated: the instance table lies within the mapping and
        // is 64-aligned; index < capacity keeps the entry inside it; the
        // entry is atomics and padding only.
        Some(unsafe { &*self.base.as_ptr().add(offset).cast::<InstanceEntry>() })
    }

    /// The entry instance `id` names, if the id is in the table and not
    /// stale (its generation is the entry's; [`crate::instance_id::names`]).
    /// Whatever its state: a caller that needs it live checks
    /// [`InstanceEntry::state`].
    pub fn instance_of(&self, id: u32) -> Option<&InstanceEntry> {
        let entry = self.instance(crate::instance_id::entry_index(id)?)?;
        crate::instance_id::names(id, entry.generation.load(Ordering::Relaxed)).then_some(entry)
    }

    /// Ring slot `index`, if within the table.
    pub fn ring_slot(&self, index: u32) -> Option<&RingSlot> {
        if index >= self.layout.ring_slot_capacity {
            return None;
        }
        let offset = self.layout.ring_table_offset as usize + index as usize * size_of::<RingSlot>();
        // SAFETY: validated: the ring table lies within the mapping and is
        // 64-aligned; index < capacity keeps the slot inside it. A RingSlot
        // is atomics, padding and an ObservationRing, whose slots are Pod:
        // every bit pattern is valid.
        Some(unsafe { &*self.base.as_ptr().add(offset).cast::<RingSlot>() })
    }

    /// The call-site table, if the segment has one.
    pub fn sites(&self) -> Option<crate::site::SiteTable<'_>> {
        let capacity = self.sites.capacity as usize;
        if capacity == 0 {
            return None;
        }
        let offset = self.sites.offset as usize;
        // SAFETY: validated: the head and `capacity` entries lie within the
        // mapping, page-aligned (so the 64-aligned head and the 4-aligned
        // entries after it are aligned), apart from the other tables; both
        // types are atomics and padding, valid for every bit pattern.
        unsafe {
            let head = &*self
                .base
                .as_ptr()
                .add(offset)
                .cast::<crate::site::SiteTableHead>();
            let first = self
                .base
                .as_ptr()
                .add(offset + size_of::<crate::site::SiteTableHead>())
                .cast::<crate::site::SiteEntry>();
            Some(crate::site::SiteTable {
                head,
                entries: std::slice::from_raw_parts(first, capacity),
            })
        }
    }

    /// Number of instance entries worth looking at (high-water mark,
    /// clamped to the capacity).
    pub fn instances_in_use(&self) -> u32 {
        self.live()
            .instances_high_water
            .load(Ordering::Acquire)
            .min(self.layout.instance_capacity)
    }

    /// Number of ring slots worth looking at (clamped high-water mark).
    pub fn rings_in_use(&self) -> u32 {
        self.live()
            .rings_high_water
            .load(Ordering::Acquire)
            .min(self.layout.ring_slot_capacity)
    }

    /// Whether any page of `offset..offset + len` (clamped to the segment)
    /// is in memory, i.e. was ever written by someone (or swapped back in).
    /// A consumer asks before reading table entries a hostile high-water
    /// mark points at: reading untouched memfd pages would allocate them,
    /// charged to the reader.
    pub fn is_resident(&self, offset: usize, len: usize) -> bool {
        let total = self.layout.total_size as usize;
        if offset >= total || len == 0 {
            return false;
        }
        let first = offset / PAGE * PAGE;
        let end = (offset + len).min(total);
        let pages = (end - first).div_ceil(PAGE);
        let mut small = [0u8; 32];
        let mut large;
        let vec: &mut [u8] = if pages <= small.len() {
            &mut small[..pages]
        } else {
            large = vec![0u8; pages];
            &mut large
        };
        // SAFETY: `first..first + pages * PAGE` lies within our validated
        // mapping (page-aligned, clamped to total_size rounded up to a page,
        // which the mapping covers); `vec` has one byte per page.
        let rc = unsafe {
            libc::mincore(
                self.base.as_ptr().add(first).cast(),
                end - first,
                vec.as_mut_ptr(),
            )
        };
        // On error assume resident: reading is then merely costly, not wrong.
        rc != 0 || vec.iter().any(|&b| b & 1 != 0)
    }

    /// Byte offset of instance entry `index` (unchecked).
    pub fn instance_offset(&self, index: u32) -> usize {
        self.layout.instance_table_offset as usize + index as usize * size_of::<InstanceEntry>()
    }

    /// Byte offset of ring slot `index` (unchecked).
    pub fn ring_slot_offset(&self, index: u32) -> usize {
        self.layout.ring_table_offset as usize + index as usize * size_of::<RingSlot>()
    }

    /// Bytes of the segment backed by memory right now (pages touched),
    /// from `mincore`. For memory-budget tests and the agent's reports.
    pub fn resident_bytes(&self) -> std::io::Result<usize> {
        let len = self.layout.total_size as usize;
        let pages = len.div_ceil(PAGE);
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is our validated mapping; `vec` has one byte per
        // page as mincore requires.
        let rc = unsafe { libc::mincore(self.base.as_ptr().cast(), len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count() * PAGE)
    }
}

/// Largest segment a consumer maps: the largest this build creates.
fn max_segment_size() -> usize {
    SegmentConfig {
        instances: MAX_INSTANCES,
        ring_slots: MAX_RING_SLOTS,
    }
    .geometry_with_sites(crate::site::MAX_SITES)
    .total_size
}

fn validate(layout: &SegmentLayout, mapped_len: usize, expect: &Expectations) -> Result<(), SegmentError> {
    if layout.abi_version != ABI_VERSION {
        return Err(SegmentError::AbiMismatch {
            found: layout.abi_version,
        });
    }
    let sizes: [(&'static str, u64, u64); 6] = [
        ("header_size", layout.header_size.into(), HEADER_SIZE as u64),
        ("total_size", layout.total_size, mapped_len as u64),
        (
            "instance_entry_size",
            layout.instance_entry_size.into(),
            size_of::<InstanceEntry>() as u64,
        ),
        (
            "ring_slot_size",
            layout.ring_slot_size.into(),
            size_of::<RingSlot>() as u64,
        ),
        (
            "ring_capacity",
            layout.ring_capacity.into(),
            ObservationRing::CAPACITY as u64,
        ),
        (
            "observation_size",
            layout.observation_size.into(),
            size_of::<crate::Observation>() as u64,
        ),
    ];
    for (field, found, expected) in sizes {
        if found != expected {
            return Err(SegmentError::BadSize {
                field,
                found,
                expected,
            });
        }
    }
    if layout.instance_capacity > MAX_INSTANCES {
        return Err(SegmentError::TooLarge {
            field: "instance",
            found: layout.instance_capacity,
            max: MAX_INSTANCES,
        });
    }
    if layout.ring_slot_capacity > MAX_RING_SLOTS {
        return Err(SegmentError::TooLarge {
            field: "ring",
            found: layout.ring_slot_capacity,
            max: MAX_RING_SLOTS,
        });
    }
    let total = layout.total_size;
    let instance_table = table_range(
        layout.instance_table_offset,
        layout.instance_capacity,
        size_of::<InstanceEntry>(),
        total,
    )
    .ok_or(SegmentError::BadTable("instance"))?;
    let ring_table = table_range(
        layout.ring_table_offset,
        layout.ring_slot_capacity,
        size_of::<RingSlot>(),
        total,
    )
    .ok_or(SegmentError::BadTable("ring"))?;
    if instance_table.start < HEADER_SIZE as u64 || ring_table.start < HEADER_SIZE as u64 {
        return Err(SegmentError::BadTable("header-overlapping"));
    }
    if instance_table.start < ring_table.end && ring_table.start < instance_table.end {
        return Err(SegmentError::BadTable("instance and ring"));
    }
    layout
        .calibration
        .validate()
        .map_err(|e| SegmentError::BadCalibration(e.to_string()))?;
    if let Some(pid) = expect.pid
        && layout.pid != pid
    {
        return Err(SegmentError::PidMismatch {
            found: layout.pid,
            expected: pid,
        });
    }
    if let Some(start) = expect.start_time_ticks
        && layout.start_time_ticks != start
    {
        return Err(SegmentError::StartTimeMismatch {
            found: layout.start_time_ticks,
            expected: start,
        });
    }
    if let Some(inode) = expect.pid_ns_inode
        && layout.pid_ns_inode != 0
        && layout.pid_ns_inode != inode
    {
        return Err(SegmentError::PidNamespaceMismatch {
            found: layout.pid_ns_inode,
            expected: inode,
        });
    }
    if let Some(uid) = expect.uid
        && layout.uid != uid
    {
        return Err(SegmentError::UidMismatch {
            found: layout.uid,
            expected: uid,
        });
    }
    Ok(())
}

/// Checks the site table's place against the validated `layout`: within
/// the segment, page-aligned, after the header, apart from the other tables.
fn validate_sites(layout: &SegmentLayout, sites: &SiteTableLayout) -> Result<(), SegmentError> {
    let total = layout.total_size;
    let instance_table = table_range(
        layout.instance_table_offset,
        layout.instance_capacity,
        size_of::<InstanceEntry>(),
        total,
    )
    .ok_or(SegmentError::BadTable("instance"))?;
    let ring_table = table_range(
        layout.ring_table_offset,
        layout.ring_slot_capacity,
        size_of::<RingSlot>(),
        total,
    )
    .ok_or(SegmentError::BadTable("ring"))?;
    if sites.capacity > crate::site::MAX_SITES {
        return Err(SegmentError::TooLarge {
            field: "site",
            found: sites.capacity,
            max: crate::site::MAX_SITES,
        });
    }
    if sites.capacity != 0 {
        let offset = u64::from(sites.offset);
        let len = crate::site::table_len(sites.capacity) as u64;
        let range = (offset.is_multiple_of(PAGE as u64) && offset >= HEADER_SIZE as u64)
            .then(|| offset.checked_add(len))
            .flatten()
            .filter(|&end| end <= total)
            .map(|end| offset..end)
            .ok_or(SegmentError::BadTable("site"))?;
        let overlaps = |other: &std::ops::Range<u64>| range.start < other.end && other.start < range.end;
        if overlaps(&instance_table) || overlaps(&ring_table) {
            return Err(SegmentError::BadTable("site and instance or ring"));
        }
    }
    Ok(())
}

/// The byte range of a table, if it is page-aligned and fits in `total`.
fn table_range(offset: u64, count: u32, entry: usize, total: u64) -> Option<std::ops::Range<u64>> {
    if !offset.is_multiple_of(PAGE as u64) {
        return None;
    }
    let end = offset.checked_add(u64::from(count).checked_mul(entry as u64)?)?;
    (end <= total).then_some(offset..end)
}

/// Copies a length-prefixed text field out of shared memory, cut to the
/// field and at the first NUL, with invalid UTF-8 replaced and control characters turned into
/// `?`: names are hostile input for the agent.
pub fn read_text(bytes: &[AtomicU8], len: u32) -> String {
    let len = (len as usize).min(bytes.len());
    let raw: Vec<u8> = bytes[..len]
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .take_while(|&b| b != 0)
        .collect();
    sanitize(&raw)
}

/// Copies a NUL-padded text field out of shared memory (see [`read_text`]).
pub fn read_padded_text(bytes: &[AtomicU8]) -> String {
    let raw: Vec<u8> = bytes
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .take_while(|&b| b != 0)
        .collect();
    sanitize(&raw)
}

fn sanitize(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Writes `text` into a text field, cut at a char boundary to fit; returns
/// the bytes written. Remaining bytes are zeroed.
pub(crate) fn write_text(field: &[AtomicU8], text: &str) -> u32 {
    let mut cut = text.len().min(field.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    for (i, slot) in field.iter().enumerate() {
        let byte = text.as_bytes().get(i).copied().filter(|_| i < cut).unwrap_or(0);
        slot.store(byte, Ordering::Relaxed);
    }
    cut as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of};

    #[test]
    fn layouts_are_fixed() {
        assert_eq!(size_of::<SegmentLayout>(), 128);
        assert_eq!(offset_of!(SegmentLayout, calibration), 80);
        assert_eq!(size_of::<SegmentLive>(), 128);
        assert_eq!(offset_of!(SegmentLive, consumer), 64);
        assert_eq!(size_of::<SegmentHeader>(), HEADER_SIZE);
        assert_eq!(offset_of!(SegmentHeader, live), 128);
        assert_eq!(size_of::<InstanceEntry>(), 256);
        assert_eq!(offset_of!(InstanceEntry, name), 64);
        assert_eq!(offset_of!(InstanceEntry, kind_name), 128);
        assert_eq!(offset_of!(InstanceEntry, op_names), 144);
        assert_eq!(offset_of!(RingSlot, drained_total), 64);
        assert_eq!(offset_of!(RingSlot, ring), 128);
        assert_eq!(size_of::<RingSlot>(), 128 + size_of::<ObservationRing>());
        assert_eq!(align_of::<RingSlot>(), 64);
    }

    #[test]
    fn created_segment_is_sealed_memfd_and_validates() {
        let segment = Segment::create(SegmentConfig {
            instances: 16,
            ring_slots: 4,
        })
        .unwrap();
        assert_eq!(segment.backing(), Backing::Memfd);
        let layout = *segment.view().layout();
        assert_eq!(layout.magic, MAGIC);
        assert_eq!(layout.pid, std::process::id());
        assert_eq!(layout.instance_capacity, 16);
        assert_eq!(layout.ring_slot_capacity, 4);
        assert_eq!(layout.start_time_ticks, own_start_time().unwrap());
        let fd = segment.fd().unwrap();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert!(link.to_string_lossy().starts_with("/memfd:subetha"), "{link:?}");
        // A second, independent mapping validates against our identity.
        let expect = Expectations {
            pid: Some(std::process::id()),
            start_time_ticks: own_start_time(),
            // SAFETY: getuid cannot fail.
            uid: Some(unsafe { libc::getuid() }),
            pid_ns_inode: None,
        };
        let other = SegmentView::map_fd(fd, &expect).unwrap();
        assert_eq!(other.layout(), &layout);
        // Writes through one mapping are visible through the other.
        segment
            .view()
            .ring_slot(3)
            .unwrap()
            .ring
            .push(crate::Observation::new(9, 1, 0, 0));
        assert_eq!(
            other.ring_slot(3).unwrap().ring.pop().map(|o| o.instance_id),
            Some(9)
        );
        assert!(other.ring_slot(4).is_none());
        assert!(other.instance(16).is_none());
        // The seals hold: the file cannot shrink or grow.
        // SAFETY: ftruncate on a descriptor we own; expected to fail.
        assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        let grow = layout.total_size as i64 * 2;
        // SAFETY: as above.
        let grown = unsafe { libc::ftruncate(fd.as_raw_fd(), grow) };
        assert_ne!(grown, 0);
    }

    #[test]
    fn expectations_are_enforced() {
        let segment = Segment::create(SegmentConfig {
            instances: 4,
            ring_slots: 1,
        })
        .unwrap();
        let fd = segment.fd().unwrap();
        let wrong_pid = Expectations {
            pid: Some(1),
            ..Default::default()
        };
        assert!(matches!(
            SegmentView::map_fd(fd, &wrong_pid),
            Err(SegmentError::PidMismatch { expected: 1, .. })
        ));
        let wrong_start = Expectations {
            start_time_ticks: Some(12345),
            ..Default::default()
        };
        assert!(matches!(
            SegmentView::map_fd(fd, &wrong_start),
            Err(SegmentError::StartTimeMismatch { .. })
        ));
        let ours = own_pid_ns_inode().expect("/proc/self/ns/pid");
        assert_eq!(segment.view().layout().pid_ns_inode, ours);
        let right_ns = Expectations {
            pid_ns_inode: Some(ours),
            ..Default::default()
        };
        assert!(SegmentView::map_fd(fd, &right_ns).is_ok());
        let wrong_ns = Expectations {
            pid_ns_inode: Some(ours + 1),
            ..Default::default()
        };
        assert!(matches!(
            SegmentView::map_fd(fd, &wrong_ns),
            Err(SegmentError::PidNamespaceMismatch { .. })
        ));
    }

    #[test]
    fn text_fields_are_cut_and_sanitised() {
        let field: [AtomicU8; 8] = Default::default();
        assert_eq!(write_text(&field, "héllöö"), 7, "cut before a split char");
        assert_eq!(read_text(&field, 7), "héllö");
        assert_eq!(read_text(&field, 1000), "héllö", "length clamped to the field");
        write_text(&field, "a\u{1b}[2Jb");
        assert_eq!(read_text(&field, 6), "a?[2Jb");
        assert_eq!(read_padded_text(&field), "a?[2Jb");
    }

    #[test]
    fn process_start_time_parses_odd_comm() {
        // Our own is known to parse; pid 1 always exists.
        assert!(process_start_time(std::process::id()).is_some());
        assert!(process_start_time(1).is_some());
        assert!(process_start_time(u32::MAX).is_none());
    }
}
