//! The producer side of the process's segment: instances, and the ring
//! slot each observing thread claims.
//!
//! # What it promises
//!
//! * The process segment is created on first use ([`process_segment`]) and
//!   lives as long as the process. A forked child never touches its
//!   parent's segment: a `pthread_atfork` child handler closes the inherited
//!   descriptor and forgets the parent's rings, and the child's first use
//!   creates its own segment, seeded with the parent's live instance entries
//!   so the ids the child inherited keep meaning the same instances.
//! * A thread's first [`Instance::observe`] claims a free ring slot (lowest
//!   index first, so slots freed by exited threads are reused before new
//!   memory is touched); every later call reaches the ring through one
//!   thread-local read, without lookup, lock or allocation. When the thread
//!   exits its slot is marked orphaned; the consumer drains what is left and
//!   frees it. A thread that finds no free slot adopts an orphaned one
//!   (its leftovers stay queued ahead of the new thread's observations), so
//!   threads that come and go faster than the consumer scans never run out
//!   of slots while fewer threads than slots are alive.
//! * Nothing here blocks or panics on a full table: registration returns
//!   [`RegistryError`], and an observation that cannot get a ring is counted
//!   in the header's `lost_no_ring` and reported as an error.

use std::cell::{Cell, RefCell};
use std::num::NonZeroU32;
use std::ptr;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use crate::clock;
use crate::instance_id;
use crate::observation::{Observation, thread_id};
use crate::ring::ObservationRing;
use crate::segment::{
    INSTANCE_NAME_MAX, InstanceEntry, OP_KINDS, RingSlot, SHORT_NAME_MAX, Segment, SegmentConfig,
    SegmentError, SegmentLive, SegmentView, instance_state, slot_state, write_text,
};

/// What the layers above the registry do when the process's segment changes.
/// The registry knows only this type; the crate root fills it in
/// ([`PROCESS_HOOKS`](crate::PROCESS_HOOKS)), so that the registry imports
/// nothing from its consumers.
pub(crate) struct ProcessHooks {
    /// Right after this process created its segment (the consumer starts).
    pub created: fn(&'static Segment),
    /// In a forked child, on the forking thread, before anything else runs
    /// (the parent's consumer thread does not exist here).
    pub forked: fn(),
}

/// Why a registration or an observation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Every instance entry is in use.
    #[error("instance table full ({capacity} entries; raise SUBETHA_INSTANCES)")]
    InstanceTableFull {
        /// Entries in the table.
        capacity: u32,
    },
    /// Every ring slot is in use; the observation was dropped and counted.
    #[error("ring table full ({capacity} slots; raise SUBETHA_RING_SLOTS); observation counted as lost")]
    RingTableFull {
        /// Slots in the table.
        capacity: u32,
    },
    /// The thread is exiting (its thread-locals are gone); the observation
    /// was dropped and counted.
    #[error("thread is exiting; observation counted as lost")]
    ThreadExiting,
    /// Instance names must be 1..=64 bytes without control characters.
    #[error("invalid instance name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The segment could not be created at all.
    #[error("cannot create the subetha segment: {0}")]
    Segment(#[from] SegmentError),
}

/// What kind of primitive an instance is, and the names of its op kinds.
///
/// Published in the segment so consumers show `lock`, `try_lock`, ...
/// instead of numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceKind {
    /// A code unique per kind (built-in primitives use 1..=255).
    pub code: u16,
    /// Short name, ≤ 16 bytes (longer is cut).
    pub name: &'static str,
    /// Names of op kinds 1..=N (N ≤ 7; each ≤ 16 bytes).
    pub ops: &'static [&'static str],
}

impl InstanceKind {
    /// A kind for user code with no fixed op names.
    pub const CUSTOM: InstanceKind = InstanceKind {
        code: 0,
        name: "custom",
        ops: &[],
    };
}

/// The process segment, once created. Replaced (and the old one leaked, its
/// mapping removed) in a forked child.
static CURRENT: AtomicPtr<Segment> = AtomicPtr::new(ptr::null_mut());
/// A parent's segment inherited through fork, kept until the child's own
/// segment copies its instance table.
static INHERITED: AtomicPtr<Segment> = AtomicPtr::new(ptr::null_mut());
/// Bumped in every forked child; ring guards from before the fork belong to
/// the parent and must not touch its slots.
static FORK_GENERATION: AtomicU32 = AtomicU32::new(0);
static ATFORK: Once = Once::new();
/// Held while the process segment is being created.
static CREATING: AtomicBool = AtomicBool::new(false);

/// The thread's ring, read on every observation. Kept apart from the guard
/// below because a thread-local without a destructor is a plain
/// `fs:`-relative load.
#[derive(Clone, Copy)]
struct Producer {
    ring: *const ObservationRing,
    thread_id: u32,
}

thread_local! {
    static PRODUCER: Cell<Producer> = const {
        Cell::new(Producer { ring: ptr::null(), thread_id: 0 })
    };
    /// Owns the slot; its destructor orphans it when the thread exits.
    static SLOT_GUARD: RefCell<Option<SlotGuard>> = const { RefCell::new(None) };
    /// `ring_free_epoch` when a claim last failed: retry only after the
    /// consumer frees a slot, not on every observation.
    static FAILED_CLAIM_EPOCH: Cell<Option<u32>> = const { Cell::new(None) };
}

struct SlotGuard {
    slot: *const RingSlot,
    live: *const SegmentLive,
    fork_generation: u32,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        // Later observations from other thread-local destructors must not
        // push into a slot we are about to hand back.
        PRODUCER.set(Producer {
            ring: ptr::null(),
            thread_id: 0,
        });
        if self.fork_generation != FORK_GENERATION.load(Ordering::Acquire) {
            return; // the slot is the parent's, inherited through fork
        }
        // SAFETY: the slot lives in the process segment, which is never
        // unmapped while this process (not a forked child, checked above)
        // runs.
        let slot = unsafe { &*self.slot };
        slot.ring.close_episode();
        slot.orphaned_mono_ns
            .store(clock::monotonic_ns(), Ordering::Relaxed);
        // Release: the consumer that sees ORPHANED sees every push and
        // counter this thread made.
        slot.state.store(slot_state::ORPHANED, Ordering::Release);
        // An orphaned slot can be adopted: threads that found the table
        // full look again.
        // SAFETY: the header of the same segment as `slot`, mapped for as
        // long as this (not forked, checked above) process runs.
        let live = unsafe { &*self.live };
        live.ring_free_epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// Bumped in every forked child (thread-local caches of segment contents
/// compare it).
pub(crate) fn fork_generation() -> u32 {
    FORK_GENERATION.load(Ordering::Acquire)
}

/// This process's segment, created on first use with
/// [`SegmentConfig::from_env`].
pub fn process_segment() -> Result<&'static Segment, RegistryError> {
    let current = CURRENT.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: segments stored in CURRENT are leaked boxes, never freed.
        return Ok(unsafe { &*current });
    }
    create_process_segment()
}

#[cold]
fn create_process_segment() -> Result<&'static Segment, RegistryError> {
    ATFORK.call_once(|| {
        // SAFETY: registering a handler with no preconditions; the handler
        // only touches atomics, thread-locals and makes system calls.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
        }
    });
    // One creator at a time: the creator copies the inherited instance
    // table and then unmaps it, which must not happen under another thread's
    // copy. A spin lock rather than a mutex so the atfork handler can reset
    // it (it runs once per process, for the few milliseconds creation takes).
    while CREATING
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    let result = create_locked();
    CREATING.store(false, Ordering::Release);
    let (segment, created) = result?;
    if created {
        (crate::PROCESS_HOOKS.created)(segment);
        if let Some(fd) = segment.fd() {
            crate::announce::announce(fd);
        }
    }
    Ok(segment)
}

/// Creates the process segment unless another thread did meanwhile; holds
/// `CREATING`. Returns the segment and whether this call created it.
fn create_locked() -> Result<(&'static Segment, bool), RegistryError> {
    let current = CURRENT.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: segments stored in CURRENT are leaked boxes, never freed.
        return Ok((unsafe { &*current }, false));
    }
    let segment = Segment::create(SegmentConfig::from_env())?;
    let inherited = INHERITED.swap(ptr::null_mut(), Ordering::AcqRel);
    if !inherited.is_null() {
        // SAFETY: the parent's segment, leaked in this child and still
        // mapped; we hold CREATING, so nobody else reads it, and no
        // reference to it survives the fork (the thread-locals pointing into
        // it were cleared by the atfork handler). Freed after the copy.
        let parent = unsafe { Box::from_raw(inherited) };
        copy_live_instances(parent.view(), segment.view());
        drop(parent);
    }
    let fresh: &'static Segment = Box::leak(Box::new(segment));
    CURRENT.store(fresh as *const Segment as *mut Segment, Ordering::Release);
    Ok((fresh, true))
}

/// Runs in the child after `fork`, on the forking thread (the only one).
extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::AcqRel);
    // A parent thread creating the segment at the fork does not exist here.
    CREATING.store(false, Ordering::Release);
    PRODUCER.set(Producer {
        ring: ptr::null(),
        thread_id: 0,
    });
    FAILED_CLAIM_EPOCH.set(None);
    let parent = CURRENT.swap(ptr::null_mut(), Ordering::AcqRel);
    if !parent.is_null() {
        // SAFETY: CURRENT held a leaked segment; after the fork only this
        // thread exists, so we have it to ourselves. Closing the inherited
        // memfd keeps agents from finding the parent's segment in us.
        unsafe { (*parent).forget_fd() };
        let older = INHERITED.swap(parent, Ordering::AcqRel);
        if !older.is_null() {
            // An inherited segment never replaced (fork of a fork before
            // first use): keep the newer one only.
            // SAFETY: leaked, referenced by nothing else.
            drop(unsafe { Box::from_raw(older) });
        }
    }
    (crate::PROCESS_HOOKS.forked)();
}

fn copy_live_instances(from: &SegmentView, to: &SegmentView) {
    let count = from.instances_in_use().min(to.layout().instance_capacity);
    for index in 0..count {
        let (Some(src), Some(dst)) = (from.instance(index), to.instance(index)) else {
            break;
        };
        if src.state.load(Ordering::Acquire) != instance_state::LIVE {
            continue;
        }
        dst.generation
            .store(src.generation.load(Ordering::Relaxed), Ordering::Relaxed);
        dst.kind
            .store(src.kind.load(Ordering::Relaxed), Ordering::Relaxed);
        dst.policy
            .store(src.policy.load(Ordering::Relaxed), Ordering::Relaxed);
        dst.name_len
            .store(src.name_len.load(Ordering::Relaxed), Ordering::Relaxed);
        dst.op_mask
            .store(src.op_mask.load(Ordering::Relaxed), Ordering::Relaxed);
        dst.registered_mono_ns
            .store(clock::monotonic_ns(), Ordering::Relaxed);
        copy_bytes(&src.name, &dst.name);
        copy_bytes(&src.kind_name, &dst.kind_name);
        for (s, d) in src.op_names.iter().zip(&dst.op_names) {
            copy_bytes(s, d);
        }
        dst.state.store(instance_state::LIVE, Ordering::Release);
        to.live()
            .instances_high_water
            .fetch_max(index + 1, Ordering::AcqRel);
    }
}

fn copy_bytes(from: &[std::sync::atomic::AtomicU8], to: &[std::sync::atomic::AtomicU8]) {
    for (s, d) in from.iter().zip(to) {
        d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// A registered instance: any primitive or piece of user code whose
/// operations are observed. Unregisters on drop; the consumer keeps its
/// final statistics.
#[derive(Debug)]
pub struct Instance {
    // Never 0 (the entry index is stored + 1), which keeps
    // `Option<Instance>` at 4 bytes inside the primitives.
    id: NonZeroU32,
}

impl Instance {
    /// Registers an instance of `kind` named `name` (1..=64 bytes of UTF-8,
    /// no control characters) in the process segment.
    pub fn register(kind: InstanceKind, name: &str) -> Result<Instance, RegistryError> {
        validate_name(name)?;
        let segment = process_segment()?;
        let id = register_in(segment.view(), kind, name)?;
        let id = NonZeroU32::new(id).expect("instance ids carry the entry index + 1, never 0");
        Ok(Instance { id })
    }

    /// The id observations carry: entry index + 1 in the low 16 bits, the
    /// entry's generation in the high 16.
    pub fn id(&self) -> u32 {
        self.id.get()
    }

    /// Pushes one observation into the calling thread's ring.
    ///
    /// `Ok(true)`: queued. `Ok(false)`: the ring was full; dropped and
    /// counted. `Err`: no ring could be had; dropped and counted as lost.
    /// Never blocks.
    #[inline]
    pub fn observe(&self, op_kind: u16, flags: u16, latency_ticks: u64) -> Result<bool, RegistryError> {
        observe_as(self.id, op_kind, flags, latency_ticks)
    }

    /// The id to pass to [`observe_as`], for a caller that must read it
    /// before an observation it pushes later (a lock reads it while it
    /// still holds the lock: the id sits near the lock word, which the
    /// next holder may own by the time of the push).
    #[inline(always)]
    pub(crate) fn raw_id(&self) -> NonZeroU32 {
        self.id
    }

    /// The policy word a consumer set for this instance (0 by default).
    pub fn policy(&self) -> u32 {
        self.entry().map_or(0, |e| e.policy.load(Ordering::Relaxed))
    }

    fn entry(&self) -> Option<&'static InstanceEntry> {
        let segment = process_segment().ok()?;
        let entry = segment.view().instance(entry_index(self.id.get())?)?;
        Some(entry)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(entry) = process_segment()
            .ok()
            .and_then(|s| s.view().instance_of(self.id.get()))
        {
            entry
                .retired_mono_ns
                .store(clock::monotonic_ns(), Ordering::Relaxed);
            // Release: a consumer that sees RETIRED sees every observation
            // pushed for this instance before (see drain docs).
            entry.state.store(instance_state::RETIRED, Ordering::Release);
        }
    }
}

pub use crate::instance_id::{entry_index, id_generation};

fn validate_name(name: &str) -> Result<(), RegistryError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() > INSTANCE_NAME_MAX {
        "longer than 64 bytes"
    } else if name.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(RegistryError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

/// Registers an instance in an arbitrary segment (one this process created
/// with [`Segment::create`], e.g. for tests and benchmarks) and returns its
/// id. [`Instance::register`] does this on the process segment.
pub fn register_instance(view: &SegmentView, kind: InstanceKind, name: &str) -> Result<u32, RegistryError> {
    validate_name(name)?;
    register_in(view, kind, name)
}

/// Claims a free entry in `view`'s instance table and fills it in.
pub(crate) fn register_in(view: &SegmentView, kind: InstanceKind, name: &str) -> Result<u32, RegistryError> {
    let capacity = view.layout().instance_capacity;
    for index in 0..capacity {
        let entry = view.instance(index).expect("index < capacity");
        if entry.state.load(Ordering::Relaxed) != instance_state::FREE
            || entry
                .state
                .compare_exchange(
                    instance_state::FREE,
                    instance_state::CLAIMED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            continue;
        }
        entry.kind.store(u32::from(kind.code), Ordering::Relaxed);
        entry.policy.store(0, Ordering::Relaxed);
        entry
            .name_len
            .store(write_text(&entry.name, name), Ordering::Relaxed);
        write_text(&entry.kind_name, kind.name);
        let mut op_mask = 0;
        for (k, field) in entry.op_names.iter().enumerate() {
            let op_name = kind.ops.get(k).copied().unwrap_or("");
            write_text(field, op_name);
            if !op_name.is_empty() {
                op_mask |= 1 << k;
            }
        }
        entry.op_mask.store(op_mask, Ordering::Relaxed);
        entry
            .registered_mono_ns
            .store(clock::monotonic_ns(), Ordering::Relaxed);
        entry.retired_mono_ns.store(0, Ordering::Relaxed);
        let generation = instance_id::entry_generation(entry.generation.load(Ordering::Relaxed));
        // Release: publishes the fields above before the id can appear in
        // any ring.
        entry.state.store(instance_state::LIVE, Ordering::Release);
        view.live()
            .instances_high_water
            .fetch_max(index + 1, Ordering::AcqRel);
        return Ok(instance_id::compose(index, generation));
    }
    Err(RegistryError::InstanceTableFull { capacity })
}

const _: () = assert!(OP_KINDS == Observation::MAX_OP_KIND as usize && SHORT_NAME_MAX == 16);

/// [`Instance::observe`] by the instance's raw id.
#[inline]
pub(crate) fn observe_as(
    id: NonZeroU32,
    op_kind: u16,
    flags: u16,
    latency_ticks: u64,
) -> Result<bool, RegistryError> {
    observe_with_sites(id, op_kind, flags, latency_ticks, 0)
}

/// [`observe_as`] with a [`SiteWord`](crate::site::SiteWord) in the
/// observation's `_reserved` word.
#[inline(always)]
pub(crate) fn observe_with_sites(
    id: NonZeroU32,
    op_kind: u16,
    flags: u16,
    latency_ticks: u64,
    sites: u32,
) -> Result<bool, RegistryError> {
    let producer = PRODUCER.get();
    if !producer.ring.is_null() {
        let obs = Observation {
            instance_id: id.get(),
            op_kind,
            flags,
            latency_ticks,
            producer_thread_id: producer.thread_id,
            _reserved: sites,
        };
        // SAFETY: the pointer was set by `claim_ring` to a ring in the
        // process segment, which stays mapped for the process's life; this
        // thread is its only producer until the guard clears the pointer at
        // thread exit or fork.
        return Ok(unsafe { &*producer.ring }.push_stamped(obs));
    }
    observe_slow(Observation {
        _reserved: sites,
        ..Observation::new(id.get(), op_kind, flags, latency_ticks)
    })
}

#[cold]
#[inline(never)]
fn observe_slow(obs: Observation) -> Result<bool, RegistryError> {
    let segment = process_segment()?;
    let live = segment.view().live();
    let lost = |error: RegistryError| {
        live.lost_no_ring.fetch_add(1, Ordering::Relaxed);
        Err(error)
    };
    let producer = match claim_ring(segment) {
        Ok(producer) => producer,
        Err(error) => return lost(error),
    };
    // SAFETY: as in `Instance::observe`: a ring in the mapped segment that
    // this thread just claimed.
    let ring = unsafe { &*producer.ring };
    Ok(ring.push_stamped(Observation {
        producer_thread_id: producer.thread_id,
        ..obs
    }))
}

/// Claims a ring slot for the calling thread and installs it.
fn claim_ring(segment: &'static Segment) -> Result<Producer, RegistryError> {
    let view = segment.view();
    let capacity = view.layout().ring_slot_capacity;
    let free_epoch = view.live().ring_free_epoch.load(Ordering::Acquire);
    // Installing the guard registers its destructor; this fails once the
    // thread's destructors have started.
    let guard_ok = SLOT_GUARD.try_with(|_| ()).is_ok();
    if !guard_ok {
        return Err(RegistryError::ThreadExiting);
    }
    if FAILED_CLAIM_EPOCH.get() == Some(free_epoch) {
        return Err(RegistryError::RingTableFull { capacity });
    }
    for look in 0..2 {
        // A free slot already touched first; then an exited thread's whose
        // ring is empty (nothing to inherit: under churn this keeps the
        // table as small as the threads alive at once); then an untouched
        // free slot; and only when there is none an exited thread's with
        // leftovers: an adopter starts on them, and on a full ring it would
        // drop its own first observations.
        let touched = view.live().rings_high_water.load(Ordering::Acquire).min(capacity);
        if let Some(producer) = claim_first(view, 0..touched, slot_state::FREE) {
            return Ok(producer);
        }
        if let Some(producer) = adopt_emptiest(view, touched, 0) {
            return Ok(producer);
        }
        if let Some(producer) = claim_first(view, touched..capacity, slot_state::FREE) {
            return Ok(producer);
        }
        // Read after the free pass: a slot claimed meanwhile may be orphaned
        // now.
        let high_water = view.live().rings_high_water.load(Ordering::Acquire).min(capacity);
        if let Some(producer) = adopt_emptiest(view, high_water, usize::MAX) {
            return Ok(producer);
        }
        if look == 0 {
            // Under thread churn a slot is often a moment from ORPHANED (its
            // thread is running its exit destructors) or FREE (a consumer is
            // freeing it): give them the CPU once before counting a loss.
            std::thread::yield_now();
        }
    }
    FAILED_CLAIM_EPOCH.set(Some(free_epoch));
    // Once per failed look at the table (not per lost observation).
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    view.live().lost_no_ring_tid.store(tid, Ordering::Relaxed);
    Err(RegistryError::RingTableFull { capacity })
}

/// Claims the first slot in `range` found in state `wanted`.
fn claim_first(view: &'static SegmentView, range: std::ops::Range<u32>, wanted: u32) -> Option<Producer> {
    for index in range {
        let slot = view.ring_slot(index).expect("index < capacity");
        if slot.state.load(Ordering::Relaxed) == wanted && try_claim(slot, wanted) {
            return Some(install(view, slot, index));
        }
    }
    None
}

/// Adopts the orphaned slot below `high_water` whose ring holds the fewest
/// leftovers (so a thread does not start on a nearly full ring), if any
/// holds at most `most_leftovers`.
fn adopt_emptiest(view: &'static SegmentView, high_water: u32, most_leftovers: usize) -> Option<Producer> {
    // Another thread may adopt the chosen slot first: look again, a bounded
    // number of times (each miss means another thread got a ring).
    for _ in 0..16 {
        let mut best: Option<(usize, u32)> = None;
        for index in 0..high_water {
            let slot = view.ring_slot(index).expect("index < high water <= capacity");
            if slot.state.load(Ordering::Relaxed) != slot_state::ORPHANED {
                continue;
            }
            let queued = slot.ring.len();
            if best.is_none_or(|(fewest, _)| queued < fewest) {
                best = Some((queued, index));
                if queued == 0 {
                    break;
                }
            }
        }
        let (_, index) = best.filter(|&(queued, _)| queued <= most_leftovers)?;
        let slot = view.ring_slot(index).expect("index < capacity");
        if try_claim(slot, slot_state::ORPHANED) {
            return Some(install(view, slot, index));
        }
    }
    None
}

/// Moves `slot` from `from` to CLAIMED. Acquire: sees what the slot's last
/// owner (a freeing consumer, an exited thread) published with Release.
fn try_claim(slot: &RingSlot, from: u32) -> bool {
    slot.state
        .compare_exchange(from, slot_state::CLAIMED, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

/// Sets up `slot` (just claimed: `CLAIMED`) for the calling thread and
/// installs it as the thread's ring.
///
/// An adopted slot (it was `ORPHANED`) may still hold observations its
/// exited thread pushed: the ring stays one ring with one producer at a
/// time, so the consumer drains them from `head` as before, then the new
/// thread's. Each observation carries its own producer's thread id; only
/// the slot's metadata names the new occupant.
fn install(view: &SegmentView, slot: &'static RingSlot, index: u32) -> Producer {
    let thread_id = thread_id();
    slot.generation.fetch_add(1, Ordering::Relaxed);
    slot.thread_id.store(thread_id, Ordering::Relaxed);
    // SAFETY: gettid has no preconditions.
    slot.os_tid
        .store(unsafe { libc::gettid() } as u32, Ordering::Relaxed);
    let name = std::thread::current()
        .name()
        .map(str::to_owned)
        .unwrap_or_default();
    slot.thread_name_len
        .store(write_text(&slot.thread_name, &name), Ordering::Relaxed);
    slot.claimed_mono_ns
        .store(clock::monotonic_ns(), Ordering::Relaxed);
    slot.orphaned_mono_ns.store(0, Ordering::Relaxed);
    let previous = slot.ring.producer_counters();
    slot.dropped_at_claim.store(previous.dropped, Ordering::Relaxed);
    slot.episodes_at_claim.store(previous.episodes, Ordering::Relaxed);
    // Release: the consumer that sees ACTIVE sees the metadata above.
    slot.state.store(slot_state::ACTIVE, Ordering::Release);
    view.live()
        .rings_high_water
        .fetch_max(index + 1, Ordering::AcqRel);
    let producer = Producer {
        ring: &slot.ring,
        thread_id,
    };
    SLOT_GUARD.with(|guard| {
        *guard.borrow_mut() = Some(SlotGuard {
            slot,
            live: view.live(),
            fork_generation: FORK_GENERATION.load(Ordering::Acquire),
        });
    });
    PRODUCER.set(producer);
    FAILED_CLAIM_EPOCH.set(None);
    producer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::SegmentConfig;

    fn private_view(instances: u32) -> Segment {
        Segment::create(SegmentConfig {
            instances,
            ring_slots: 1,
        })
        .unwrap()
    }

    #[test]
    fn ids_encode_index_and_generation() {
        let segment = private_view(4);
        let view = segment.view();
        let a = register_in(view, InstanceKind::CUSTOM, "a").unwrap();
        let b = register_in(view, InstanceKind::CUSTOM, "b").unwrap();
        assert_eq!((entry_index(a), entry_index(b)), (Some(0), Some(1)));
        assert_eq!(id_generation(a), 0);
        assert_eq!(entry_index(0), None);
        let entry = view.instance(1).unwrap();
        assert_eq!(
            crate::segment::read_text(&entry.name, entry.name_len.load(Ordering::Relaxed)),
            "b"
        );
        // A freed entry comes back with the next generation.
        entry.state.store(instance_state::FREE, Ordering::Relaxed);
        entry.generation.store(1, Ordering::Relaxed);
        let again = register_in(view, InstanceKind::CUSTOM, "c").unwrap();
        assert_eq!((entry_index(again), id_generation(again)), (Some(1), 1));
        assert_ne!(again, b);
    }

    #[test]
    fn full_instance_table_is_an_error() {
        let segment = private_view(2);
        register_in(segment.view(), InstanceKind::CUSTOM, "a").unwrap();
        register_in(segment.view(), InstanceKind::CUSTOM, "b").unwrap();
        let err = register_in(segment.view(), InstanceKind::CUSTOM, "c").unwrap_err();
        assert!(
            matches!(err, RegistryError::InstanceTableFull { capacity: 2 }),
            "{err}"
        );
    }

    #[test]
    fn kind_and_op_names_are_published() {
        let segment = private_view(2);
        const KIND: InstanceKind = InstanceKind {
            code: 42,
            name: "queue",
            ops: &["push", "pop"],
        };
        let id = register_in(segment.view(), KIND, "jobs").unwrap();
        let entry = segment.view().instance(entry_index(id).unwrap()).unwrap();
        assert_eq!(entry.kind.load(Ordering::Relaxed), 42);
        assert_eq!(crate::segment::read_padded_text(&entry.kind_name), "queue");
        assert_eq!(crate::segment::read_padded_text(&entry.op_names[1]), "pop");
        assert_eq!(entry.op_mask.load(Ordering::Relaxed), 0b11);
    }

    #[test]
    fn bad_names_are_rejected() {
        for name in ["", "a\nb", &"x".repeat(65)] {
            assert!(
                matches!(validate_name(name), Err(RegistryError::InvalidName { .. })),
                "{name:?}"
            );
        }
        validate_name(&"é".repeat(32)).unwrap();
    }
}
