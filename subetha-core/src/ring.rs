//! [`ObservationRing`]: the lossy single-producer single-consumer ring each
//! instrumented thread pushes into.
//!
//! # Contract
//!
//! * One producer and one consumer at any instant. The producer is the thread
//!   that owns the ring (see [`crate::registry`]); the consumer is whoever
//!   holds the segment's consumer role (the in-process sidecar or an agent).
//!   Callers serialise each side; the two sides run concurrently.
//! * [`push`](ObservationRing::push) never blocks. When the ring is full the
//!   observation is dropped and `false` is returned: sampling, not
//!   coordination. Every drop is counted in a producer-owned counter, and
//!   consecutive drops form an *episode* whose edges call the probe hooks
//!   [`subetha_drop_begin`](crate::hooks::subetha_drop_begin) and
//!   [`subetha_drop_end`](crate::hooks::subetha_drop_end) once each.
//! * `head` and `tail` are free-running `u32` counters; a slot index is the
//!   counter masked by `CAPACITY - 1`. `tail - head` (wrapping) is the fill
//!   level, and can never exceed `CAPACITY` unless the memory was corrupted,
//!   which the consumer detects ([`RingCorrupt`]) instead of trusting.
//! * The all-zero bit pattern is a valid empty ring, so a ring can live in
//!   freshly mapped shared memory without a constructor running.
//!
//! # Memory ordering
//!
//! The producer writes a slot, then publishes it with a `Release` store of
//! `tail`; the consumer's `Acquire` load of `tail` therefore sees the slot's
//! contents. Symmetrically the consumer copies a slot out, then frees it with
//! a `Release` store of `head`; the producer's `Acquire` load of `head`
//! guarantees the copy finished before the slot is overwritten.
//!
//! The producer keeps a private copy of `head` (`cached_head`) and reloads
//! the shared one only when the cached value says the ring is full. A cached
//! value was obtained by an `Acquire` load, so every slot it reports free was
//! already released by the consumer; it can only under-estimate free space.
//! This saves the cross-core cache miss on `head` for 4095 of 4096 pushes.
//!
//! While a drop episode is open, `cached_head` holds a marker instead,
//! `tail - (CAPACITY + 1)`: older than any real head, so it reports no slot
//! free and sends every push to the slow path, where a drop recognises the
//! open episode from the marker (no extra load on the drop path) and the
//! first successful push closes the episode. The fast path has no episode
//! test at all.
//!
//! The consumer likewise keeps `cached_tail` (a `tail` it loaded with
//! `Acquire`, so every slot it covers is published) and reads the
//! producer's line only when that copy does not cover the batch it wants.
//! It stores the copy with `Release` and loads it with `Acquire`, so a
//! consumer that takes over the role from another inherits the guarantee.
//!
//! # Layout
//!
//! `head` starts cache line 0, followed by the consumer-owned extras
//! (`cached_tail`); `tail` starts cache line 1, followed by the
//! producer-owned extras (cached head, drop counter, episode state), and the
//! 4096 slots start at byte 128: each side writes only its own line, so they
//! never false-share.

use crate::clock;
use crate::hooks;
use crate::observation::{Observation, thread_id};
use crate::sync::{AtomicU32, AtomicU64, Ordering, OwnerLoad, UnsafeCell};

/// Slots per ring. The spec fixes 4096; loom models use a tiny ring so they
/// can explore the full and wrapped states.
#[cfg(not(loom))]
const CAPACITY: usize = 4096;
#[cfg(loom)]
const CAPACITY: usize = 4;

const INDEX_MASK: u32 = (CAPACITY as u32) - 1;

/// `tail - cached_head` while a drop episode is open: one more than a full
/// ring can ever be (see [`ObservationRing::begin_episode`]).
const EPISODE_MARK: u32 = CAPACITY as u32 + 1;
const _: () = assert!(CAPACITY.is_power_of_two() && CAPACITY <= 1 << 31);

/// A fixed-capacity, lossy, single-producer single-consumer ring of
/// [`Observation`]s. See the [module docs](self) for the contract.
#[repr(C, align(64))]
pub struct ObservationRing {
    // Cache line 0: written by the consumer only.
    head: AtomicU32,
    cached_tail: AtomicU32,
    _pad0: [u8; 56],
    // Cache line 1: written by the producer only.
    tail: AtomicU32,
    cached_head: AtomicU32,
    dropped: AtomicU64,
    episode_begin_ticks: AtomicU64,
    episode_end_ticks: AtomicU64,
    episode_begin_dropped: AtomicU64,
    episodes: AtomicU32,
    in_episode: AtomicU32,
    episode_first_instance: AtomicU32,
    _pad1: [u8; 12],
    buf: [UnsafeCell<Observation>; CAPACITY],
}

// SAFETY: every slot is accessed by one side at a time: the producer writes
// only slots in `[tail, head + CAPACITY)` and the consumer reads only slots in
// `[head, tail)`, with the Release/Acquire pairs on `head` and `tail`
// (module docs) ordering the hand-over of each slot. Everything else is
// atomic.
unsafe impl Sync for ObservationRing {}
// SAFETY: the ring owns plain-old-data only; moving it between threads is
// fine.
unsafe impl Send for ObservationRing {}

/// The consumer found `tail - head` larger than the capacity: the ring's
/// memory was corrupted (or written by a hostile process). Nothing was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "ring corrupt: head {head} and tail {tail} are more than {} apart",
    ObservationRing::CAPACITY
)]
pub struct RingCorrupt {
    /// The consumer index that was read.
    pub head: u32,
    /// The producer index that was read.
    pub tail: u32,
}

/// The producer-owned counters of a ring, as read by the consumer. Values are
/// individually atomic but not a consistent snapshot while the producer runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProducerCounters {
    /// Free-running count of successful pushes (mod 2^32).
    pub tail: u32,
    /// Total observations dropped because the ring was full.
    pub dropped: u64,
    /// Drop episodes begun (a run of drops between successful pushes).
    pub episodes: u32,
    /// Whether the latest episode is still going (no successful push since).
    pub in_episode: bool,
    /// Clock ticks ([`crate::clock::ticks`]) when the latest episode began.
    pub episode_begin_ticks: u64,
    /// Clock ticks when the latest finished episode ended.
    pub episode_end_ticks: u64,
    /// `dropped` just before the latest episode began.
    pub episode_begin_dropped: u64,
    /// Instance whose observation was the first dropped in the latest episode.
    pub episode_first_instance: u32,
}

impl ObservationRing {
    /// Number of slots (4096).
    pub const CAPACITY: usize = CAPACITY;

    /// An empty ring. All-zero, so it is `const` and valid in zeroed memory.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self {
            head: AtomicU32::new(0),
            cached_tail: AtomicU32::new(0),
            _pad0: [0; 56],
            tail: AtomicU32::new(0),
            cached_head: AtomicU32::new(0),
            dropped: AtomicU64::new(0),
            episode_begin_ticks: AtomicU64::new(0),
            episode_end_ticks: AtomicU64::new(0),
            episode_begin_dropped: AtomicU64::new(0),
            episodes: AtomicU32::new(0),
            in_episode: AtomicU32::new(0),
            episode_first_instance: AtomicU32::new(0),
            _pad1: [0; 12],
            buf: [const { UnsafeCell::new(Observation::ZERO) }; CAPACITY],
        }
    }

    /// An empty ring (loom build: loom's atomics are not `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            head: AtomicU32::new(0),
            cached_tail: AtomicU32::new(0),
            _pad0: [0; 56],
            tail: AtomicU32::new(0),
            cached_head: AtomicU32::new(0),
            dropped: AtomicU64::new(0),
            episode_begin_ticks: AtomicU64::new(0),
            episode_end_ticks: AtomicU64::new(0),
            episode_begin_dropped: AtomicU64::new(0),
            episodes: AtomicU32::new(0),
            in_episode: AtomicU32::new(0),
            episode_first_instance: AtomicU32::new(0),
            _pad1: [0; 12],
            buf: std::array::from_fn(|_| UnsafeCell::new(Observation::ZERO)),
        }
    }

    /// Producer: appends `obs`, stamping `producer_thread_id` with
    /// [`thread_id()`] when it is 0. Returns `false` (and counts the drop)
    /// when the ring is full. Never blocks.
    ///
    /// Only one thread may push at a time.
    #[inline]
    pub fn push(&self, obs: Observation) -> bool {
        self.stamp_then(obs, Self::push_stamped)
    }

    /// Calls `then` with `obs`, stamped with [`thread_id()`] first if its
    /// thread id is 0.
    #[inline(always)]
    fn stamp_then<R>(&self, obs: Observation, then: impl FnOnce(&Self, Observation) -> R) -> R {
        if obs.producer_thread_id != 0 {
            return then(self, obs);
        }
        let Observation {
            instance_id,
            op_kind,
            flags,
            latency_ticks,
            _reserved,
            ..
        } = obs;
        self.stamp_then_cold(instance_id, op_kind, flags, latency_ticks, _reserved, then)
    }

    /// [`stamp_then`](Self::stamp_then)'s stamping, out of line and handed
    /// the fields one by one, so they travel in registers (a 24-byte
    /// `Observation` argument would travel through memory).
    ///
    /// With the stamping (a possible call) inline, a loop of pushes kept part
    /// of the observation on the stack: one more store per push, and while a
    /// consumer drains, stores are what a push waits for (`cargo bench -p
    /// subetha-core --bench ring -- lossy_concurrent`, against rtrb).
    #[cold]
    #[inline(never)]
    fn stamp_then_cold<R>(
        &self,
        instance_id: u32,
        op_kind: u16,
        flags: u16,
        latency_ticks: u64,
        _reserved: u32,
        then: impl FnOnce(&Self, Observation) -> R,
    ) -> R {
        let obs = Observation {
            instance_id,
            op_kind,
            flags,
            latency_ticks,
            producer_thread_id: thread_id(),
            _reserved,
        };
        then(self, obs)
    }

    /// [`push`](Self::push) for callers that already stamped the thread id.
    #[inline]
    pub(crate) fn push_stamped(&self, obs: Observation) -> bool {
        match self.reserve() {
            Ok(tail) => {
                self.publish(tail, obs);
                true
            }
            Err(ahead) => {
                // Counted inline (a plain load + store: the producer is the
                // only writer, so no LOCK-prefixed read-modify-write).
                let dropped = self.dropped.owner_load();
                self.dropped.store(dropped + 1, Ordering::Relaxed);
                // The one episode test on the drop path, on a value already
                // in a register: inside an episode `cached_head` holds the
                // marker `tail - (CAPACITY + 1)` (see `begin_episode`). Only
                // the first drop of an episode leaves the hot path.
                if ahead != EPISODE_MARK {
                    self.begin_episode(obs.instance_id, dropped);
                }
                false
            }
        }
    }

    /// Producer: appends `obs` if there is room, else hands it back without
    /// counting a drop — for callers that wait for room themselves (a
    /// lossless producer). Stamps the thread id like [`push`](Self::push).
    #[inline]
    pub fn try_push(&self, obs: Observation) -> Result<(), Observation> {
        self.stamp_then(obs, Self::try_push_stamped)
    }

    #[inline(always)]
    fn try_push_stamped(&self, obs: Observation) -> Result<(), Observation> {
        match self.reserve() {
            Ok(tail) => {
                self.publish(tail, obs);
                Ok(())
            }
            Err(_) => Err(obs),
        }
    }

    /// The producer's next free index, or, when the ring is full, how far
    /// `tail` is ahead of `cached_head` (`EPISODE_MARK` inside a drop
    /// episode).
    #[inline(always)]
    fn reserve(&self) -> Result<u32, u32> {
        // The producer is the only writer of `tail` and `cached_head`.
        let tail = self.tail.owner_load();
        let ahead = tail.wrapping_sub(self.cached_head.owner_load());
        if ahead >= CAPACITY as u32 {
            return self.reserve_slow(tail, ahead);
        }
        Ok(tail)
    }

    /// `reserve` when the cached head says full (once per `CAPACITY` pushes
    /// while the consumer keeps up, and on every drop): refresh the head.
    /// Inlined into the push paths: the drop path runs through here.
    #[inline(always)]
    fn reserve_slow(&self, tail: u32, ahead: u32) -> Result<u32, u32> {
        // Acquire: pairs with the consumer's Release of `head`, so its
        // copies out of the slots we are about to reuse are complete.
        let head = self.head.load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= CAPACITY as u32 {
            // Really full. Nothing to refresh: `cached_head` is either the
            // current head (a full ring is exactly CAPACITY ahead of both)
            // or the episode marker, which must stay until a push succeeds.
            return Err(ahead);
        }
        if ahead == EPISODE_MARK {
            // The first successful push after drops: close the episode
            // here, off the fast path (the marker routes it through here).
            self.end_episode();
        }
        self.cached_head.store(head, Ordering::Relaxed);
        Ok(tail)
    }

    /// Writes `obs` at `tail` (from [`reserve`](Self::reserve)) and
    /// publishes it.
    #[inline(always)]
    fn publish(&self, tail: u32, obs: Observation) {
        let words = obs.to_words();
        self.buf[(tail & INDEX_MASK) as usize].with_mut(|slot| {
            // SAFETY: `reserve` saw `tail - head < CAPACITY`, so slot `tail`
            // is outside the consumer's readable range `[head, tail)` and, by
            // its Acquire (now or when `cached_head` was loaded), the consumer
            // has finished reading it. Only this producer writes slots. An
            // `Observation` is 24 bytes aligned to 8 (it holds a `u64`; see
            // the layout test), so the slot holds three aligned `u64`s.
            unsafe {
                let slot = slot.cast::<u64>();
                slot.write(words[0]);
                slot.add(1).write(words[1]);
                slot.add(2).write(words[2]);
            }
        });
        // Release: publishes the slot written above to the consumer.
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
    }

    /// Opens a drop episode (the first drop after a successful push).
    /// `dropped_before` is the drop counter before this drop. Producer only.
    #[cold]
    #[inline(never)]
    fn begin_episode(&self, instance_id: u32, dropped_before: u64) {
        // Park `cached_head` on the marker: `tail - marker` is CAPACITY + 1,
        // so every push goes through `reserve_slow`, where later drops see
        // they are inside this episode and the first success closes it. The
        // marker is older than any real head, so it never reports a slot
        // free (an under-estimate, like every cached head).
        let tail = self.tail.owner_load();
        self.cached_head
            .store(tail.wrapping_sub(EPISODE_MARK), Ordering::Relaxed);
        if self.in_episode.owner_load() != 0 {
            // Already open: `cached_head` was not the marker, which only a
            // corrupt or hand-edited ring does. Re-arm the marker, but fire
            // no second `drop_begin` for the same episode.
            return;
        }
        self.episode_begin_ticks.store(clock::ticks(), Ordering::Relaxed);
        self.episode_begin_dropped
            .store(dropped_before, Ordering::Relaxed);
        self.episode_first_instance.store(instance_id, Ordering::Relaxed);
        self.in_episode.store(1, Ordering::Relaxed);
        let episodes = self.episodes.owner_load().wrapping_add(1);
        // Release: a consumer that sees the new count sees the fields above.
        self.episodes.store(episodes, Ordering::Release);
        hooks::subetha_drop_begin(self as *const Self as usize, instance_id, dropped_before + 1);
    }

    /// Closes the open drop episode, if one is open (the marker and the
    /// flag agree unless the ring was corrupted; the flag decides). The
    /// caller refreshes `cached_head` afterwards. Producer only.
    #[cold]
    #[inline(never)]
    fn end_episode(&self) {
        if self.in_episode.owner_load() == 0 {
            return;
        }
        self.episode_end_ticks.store(clock::ticks(), Ordering::Relaxed);
        // Release: a consumer that sees the episode closed sees its end time.
        self.in_episode.store(0, Ordering::Release);
        let in_episode = self
            .dropped
            .owner_load()
            .wrapping_sub(self.episode_begin_dropped.owner_load());
        hooks::subetha_drop_end(self as *const Self as usize, in_episode);
    }

    /// Producer: closes an open drop episode without a successful push, e.g.
    /// when the owning thread exits in the middle of one.
    pub fn close_episode(&self) {
        if self.in_episode.owner_load() != 0 {
            self.end_episode();
            // Leave the marker: a real (Acquire-loaded) head again.
            let head = self.head.load(Ordering::Acquire);
            self.cached_head.store(head, Ordering::Relaxed);
        }
    }

    /// Consumer: removes the oldest observation, or `None` if the ring is
    /// empty (or corrupt: see [`try_pop_batch`](Self::try_pop_batch)).
    ///
    /// Only one thread may pop at a time.
    #[inline]
    pub fn pop(&self) -> Option<Observation> {
        let mut one = [Observation::ZERO];
        match self.try_pop_batch(&mut one) {
            Ok(1) => Some(one[0]),
            _ => None,
        }
    }

    /// Consumer: copies up to `out.len()` of the oldest observations into
    /// `out` and frees their slots with one `head` update. Returns how many
    /// were copied; 0 when empty or corrupt.
    #[inline]
    pub fn pop_batch(&self, out: &mut [Observation]) -> usize {
        self.try_pop_batch(out).unwrap_or(0)
    }

    /// Consumer: [`pop_batch`](Self::pop_batch) that reports a corrupt ring
    /// (`tail - head > CAPACITY`) instead of treating it as empty. It reads
    /// `tail` at most once (not at all when the consumer's cached copy
    /// already covers `out`), copies the batch out (at most two copies), and
    /// publishes `head` once.
    #[inline]
    pub fn try_pop_batch(&self, out: &mut [Observation]) -> Result<usize, RingCorrupt> {
        // The consumer is the only writer of `head`.
        let head = self.head.owner_load();
        // First the consumer's own copy of `tail` (line 0): when it already
        // covers the whole batch, the producer's line is not touched at all.
        // Acquire: pairs with the Release below, possibly by an earlier
        // consumer (the role is handed over): whoever stored it had loaded
        // `tail` with Acquire, so the slots it covers are published to us.
        let cached = self.cached_tail.load(Ordering::Acquire);
        let mut available = cached.wrapping_sub(head);
        let mut fresh = None;
        if available < out.len() as u32 || available > CAPACITY as u32 {
            // Acquire: pairs with the producer's Release of `tail`, so the
            // slots in `[head, tail)` hold the observations it wrote.
            let tail = self.tail.load(Ordering::Acquire);
            available = tail.wrapping_sub(head);
            if available > CAPACITY as u32 {
                return Err(RingCorrupt { head, tail });
            }
            if tail != cached {
                fresh = Some(tail);
            }
        }
        let count = out.len().min(available as usize);
        self.copy_out(head, &mut out[..count]);
        if let Some(tail) = fresh {
            // Stored next to `head`, after the copy: both stores go to line
            // 0 back to back, so a producer reading `head` meanwhile costs
            // one transfer of the line, not two. Stored before `head`
            // advances, so `head <= cached_tail <= tail` holds at every
            // instant (a crash between the stores leaves a valid copy).
            // Release: passes the Acquire above on to a later consumer that
            // trusts this copy (see the load above).
            self.cached_tail.store(tail, Ordering::Release);
        }
        if count > 0 {
            // Release: the copies above finish before the producer may reuse
            // the slots.
            self.head
                .store(head.wrapping_add(count as u32), Ordering::Release);
        }
        Ok(count)
    }

    /// Copies `out.len()` slots starting at index `head` into `out`.
    /// Consumer only, for slots in `[head, tail)` (see `try_pop_batch`).
    #[cfg(not(loom))]
    #[inline(always)]
    fn copy_out(&self, head: u32, out: &mut [Observation]) {
        // At most two contiguous runs (before and after the wrap): wide
        // copies instead of a per-slot loop, which also keeps the consumer's
        // reads of each cache line short while the producer writes nearby.
        let start = (head & INDEX_MASK) as usize;
        let first = out.len().min(CAPACITY - start);
        let (front, back) = out.split_at_mut(first);
        // SAFETY: `UnsafeCell<Observation>` is `repr(transparent)` over
        // `Observation`, so `buf` is an array of observations. The source
        // ranges `[start, start + first)` and `[0, back.len())` are within
        // the buffer (first ≤ CAPACITY - start, back.len() ≤ start since
        // out.len() ≤ CAPACITY) and hold slots in `[head, tail)`, which the
        // producer published (Acquire on `tail` in the caller) and will not
        // write until we release `head`. `out` does not overlap the ring.
        unsafe {
            let base = self.buf.as_ptr().cast::<Observation>();
            std::ptr::copy_nonoverlapping(base.add(start), front.as_mut_ptr(), front.len());
            std::ptr::copy_nonoverlapping(base, back.as_mut_ptr(), back.len());
        }
    }

    /// Loom build: the same copy slot by slot, so the model checker sees
    /// each cell access.
    #[cfg(loom)]
    fn copy_out(&self, head: u32, out: &mut [Observation]) {
        for (offset, dest) in out.iter_mut().enumerate() {
            let index = (head.wrapping_add(offset as u32) & INDEX_MASK) as usize;
            *dest = self.buf[index].with(|slot| {
                // SAFETY: as in the non-loom copy: a published slot in
                // `[head, tail)` the producer does not write until released.
                unsafe { slot.read() }
            });
        }
    }

    /// Observations waiting to be popped, as seen now (clamped to capacity).
    pub fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire);
        (tail.wrapping_sub(head) as usize).min(CAPACITY)
    }

    /// Whether no observation is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total observations dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }

    /// The consumer index: free-running count of popped observations (mod 2^32).
    pub fn head(&self) -> u32 {
        self.head.load(Ordering::Acquire)
    }

    /// The producer-owned counters (drops and drop episodes).
    pub fn producer_counters(&self) -> ProducerCounters {
        // Acquire on the episode words pairs with their Release stores.
        let episodes = self.episodes.load(Ordering::Acquire);
        let in_episode = self.in_episode.load(Ordering::Acquire) != 0;
        ProducerCounters {
            tail: self.tail.load(Ordering::Acquire),
            dropped: self.dropped.load(Ordering::Acquire),
            episodes,
            in_episode,
            episode_begin_ticks: self.episode_begin_ticks.load(Ordering::Relaxed),
            episode_end_ticks: self.episode_end_ticks.load(Ordering::Relaxed),
            episode_begin_dropped: self.episode_begin_dropped.load(Ordering::Relaxed),
            episode_first_instance: self.episode_first_instance.load(Ordering::Relaxed),
        }
    }
}

impl Default for ObservationRing {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ObservationRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservationRing")
            .field("head", &self.head.load(Ordering::Relaxed))
            .field("tail", &self.tail.load(Ordering::Relaxed))
            .field("dropped", &self.dropped.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};
    use std::sync::Arc;

    #[test]
    fn layout_matches_the_spec() {
        assert_eq!(align_of::<ObservationRing>(), 64);
        assert_eq!(size_of::<ObservationRing>(), 128 + 4096 * 24);
        assert_eq!(offset_of!(ObservationRing, head), 0);
        assert_eq!(offset_of!(ObservationRing, tail), 64);
        assert_eq!(offset_of!(ObservationRing, buf), 128);
        // Consumer extras stay on the consumer's line.
        assert!((4..64).contains(&offset_of!(ObservationRing, cached_tail)));
        // Producer extras stay on the producer's line.
        for offset in [
            offset_of!(ObservationRing, cached_head),
            offset_of!(ObservationRing, dropped),
            offset_of!(ObservationRing, episode_begin_ticks),
            offset_of!(ObservationRing, episode_end_ticks),
            offset_of!(ObservationRing, episode_begin_dropped),
            offset_of!(ObservationRing, episodes),
            offset_of!(ObservationRing, in_episode),
            offset_of!(ObservationRing, episode_first_instance),
        ] {
            assert!((64..128).contains(&offset), "offset {offset}");
        }
    }

    #[test]
    fn zeroed_memory_is_an_empty_ring() {
        let ring: Box<ObservationRing> = Box::<ObservationRing>::default();
        // SAFETY: reading the ring's bytes; it contains no padding holes
        // (all fields are integers/atomics/arrays laid out back to back).
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&*ring as *const ObservationRing).cast::<u8>(),
                size_of::<ObservationRing>(),
            )
        };
        assert!(bytes.iter().all(|&b| b == 0));
        assert!(ring.is_empty());
    }

    #[test]
    fn batch_pop_preserves_order_across_wrap() {
        let ring = Box::<ObservationRing>::default();
        let mut out = vec![Observation::ZERO; 1000];
        let mut next_push = 0u32;
        let mut next_pop = 0u32;
        for _ in 0..20 {
            for _ in 0..1000 {
                assert!(ring.push(Observation::new(next_push, 1, 0, 0)));
                next_push += 1;
            }
            let n = ring.pop_batch(&mut out);
            assert_eq!(n, 1000);
            for obs in &out[..n] {
                assert_eq!(obs.instance_id, next_pop);
                next_pop += 1;
            }
        }
        assert!(ring.is_empty());
        assert_eq!(ring.dropped(), 0);
    }

    #[test]
    fn drop_episodes_count_runs_not_drops() {
        let ring = Box::<ObservationRing>::default();
        for _ in 0..ObservationRing::CAPACITY {
            assert!(ring.push(Observation::new(1, 1, 0, 0)));
        }
        for _ in 0..10 {
            assert!(!ring.push(Observation::new(2, 1, 0, 0)));
        }
        let during = ring.producer_counters();
        assert_eq!(
            (during.dropped, during.episodes, during.in_episode),
            (10, 1, true)
        );
        assert_eq!(during.episode_first_instance, 2);
        assert_eq!(during.episode_begin_dropped, 0);
        assert!(ring.pop().is_some());
        assert!(ring.push(Observation::new(3, 1, 0, 0)));
        let after = ring.producer_counters();
        assert_eq!((after.dropped, after.episodes, after.in_episode), (10, 1, false));
        assert!(after.episode_end_ticks >= after.episode_begin_ticks);
        // A second run of drops is a second episode.
        assert!(!ring.push(Observation::new(4, 1, 0, 0)));
        let again = ring.producer_counters();
        assert_eq!(
            (again.dropped, again.episodes, again.episode_begin_dropped),
            (11, 2, 10)
        );
    }

    /// The episode marker in `cached_head`: later drops stay in the episode,
    /// a successful `try_push` closes it, `close_episode` leaves it, and a
    /// ring with an episode closed by either pushes normally again.
    #[test]
    fn episode_marker_edges() {
        let ring = Box::<ObservationRing>::default();
        let fill = |ring: &ObservationRing| {
            while ring.try_push(Observation::new(1, 1, 0, 0)).is_ok() {}
        };
        fill(&ring);
        assert!(!ring.push(Observation::new(1, 1, 0, 0)));
        assert_eq!(ring.producer_counters().episodes, 1);
        // Still full: try_push neither counts nor closes.
        assert!(ring.try_push(Observation::new(1, 1, 0, 0)).is_err());
        assert!(ring.producer_counters().in_episode);
        assert!(ring.pop().is_some());
        assert!(ring.try_push(Observation::new(1, 1, 0, 0)).is_ok());
        let closed = ring.producer_counters();
        assert_eq!(
            (closed.episodes, closed.in_episode, closed.dropped),
            (1, false, 1)
        );
        // Second episode, closed by the owning thread's exit.
        for _ in 0..3 {
            assert!(!ring.push(Observation::new(2, 1, 0, 0)));
        }
        ring.close_episode();
        let exited = ring.producer_counters();
        assert_eq!(
            (exited.episodes, exited.in_episode, exited.dropped),
            (2, false, 4)
        );
        ring.close_episode();
        assert_eq!(ring.producer_counters().episodes, 2, "no second close");
        // Room again: pushes succeed and open no episode; a full ring opens
        // the third.
        let mut out = vec![Observation::ZERO; 100];
        assert_eq!(ring.pop_batch(&mut out), 100);
        for _ in 0..100 {
            assert!(ring.push(Observation::new(3, 1, 0, 0)));
        }
        assert!(!ring.push(Observation::new(3, 1, 0, 0)));
        let third = ring.producer_counters();
        assert_eq!((third.episodes, third.in_episode, third.dropped), (3, true, 5));
    }

    /// The consumer's cached tail: a batch it covers does not need the
    /// producer's line, and it never hands out more than was published.
    #[test]
    fn cached_tail_never_runs_ahead() {
        let ring = Box::<ObservationRing>::default();
        for i in 0..10 {
            assert!(ring.push(Observation::new(i, 1, 0, 0)));
        }
        let mut two = [Observation::ZERO; 2];
        assert_eq!(ring.pop_batch(&mut two), 2);
        assert_eq!(ring.cached_tail.load(Ordering::Relaxed), 10);
        for i in 10..20 {
            assert!(ring.push(Observation::new(i, 1, 0, 0)));
        }
        // Covered by the cached copy (8 left of 10): served without a reload.
        let mut eight = [Observation::ZERO; 8];
        assert_eq!(ring.pop_batch(&mut eight), 8);
        assert_eq!(ring.cached_tail.load(Ordering::Relaxed), 10);
        assert_eq!(eight[7].instance_id, 9);
        // Not covered: reloads and sees the rest.
        let mut many = [Observation::ZERO; 64];
        assert_eq!(ring.pop_batch(&mut many), 10);
        assert_eq!(many[0].instance_id, 10);
        assert_eq!(ring.pop_batch(&mut many), 0);
        // A hostile cached copy more than CAPACITY ahead is not trusted.
        ring.cached_tail.store(20 + 5000, Ordering::Relaxed);
        assert_eq!(ring.pop_batch(&mut two), 0);
    }

    #[test]
    fn try_push_hands_back_without_counting_a_drop() {
        let ring = Box::<ObservationRing>::default();
        for i in 0..ObservationRing::CAPACITY {
            assert!(ring.try_push(Observation::new(i as u32, 1, 0, 0)).is_ok());
        }
        let back = ring.try_push(Observation::new(7, 2, 0, 9)).unwrap_err();
        assert_eq!((back.instance_id, back.op_kind, back.latency_ticks), (7, 2, 9));
        assert_ne!(back.producer_thread_id, 0, "stamped");
        let counters = ring.producer_counters();
        assert_eq!((counters.dropped, counters.episodes), (0, 0));
    }

    #[test]
    fn corrupt_indices_are_reported_not_trusted() {
        let ring = Box::<ObservationRing>::default();
        ring.tail.store(5000, Ordering::Relaxed);
        let mut out = [Observation::ZERO; 8];
        assert_eq!(
            ring.try_pop_batch(&mut out),
            Err(RingCorrupt { head: 0, tail: 5000 })
        );
        assert_eq!(ring.pop(), None);
        assert_eq!(ring.head(), 0, "nothing consumed from a corrupt ring");
    }

    #[test]
    fn indices_wrap_around_u32() {
        let ring = Box::<ObservationRing>::default();
        let start = u32::MAX - 10;
        ring.head.store(start, Ordering::Relaxed);
        ring.tail.store(start, Ordering::Relaxed);
        ring.cached_head.store(start, Ordering::Relaxed);
        ring.cached_tail.store(start, Ordering::Relaxed);
        for i in 0..100 {
            assert!(ring.push(Observation::new(i, 1, 0, 0)));
        }
        let mut out = [Observation::ZERO; 128];
        assert_eq!(ring.pop_batch(&mut out), 100);
        assert!(
            out[..100]
                .iter()
                .enumerate()
                .all(|(i, o)| o.instance_id == i as u32)
        );
    }

    /// Two real threads: every pushed observation is popped exactly once and
    /// in order, and attempts = popped + dropped.
    #[test]
    fn two_thread_stress_conserves_every_observation() {
        const ATTEMPTS: u32 = 2_000_000;
        let ring = Arc::new(ObservationRing::new());
        let producer = {
            let ring = Arc::clone(&ring);
            std::thread::spawn(move || {
                let mut pushed = 0u64;
                for seq in 0..ATTEMPTS {
                    if ring.push(Observation::new(seq, 1, 0, u64::from(seq) * 3)) {
                        pushed += 1;
                    }
                }
                pushed
            })
        };
        let mut popped = 0u64;
        let mut last_seq: Option<u32> = None;
        let mut out = vec![Observation::ZERO; 97];
        let mut use_batch = false;
        loop {
            let done = producer.is_finished();
            use_batch = !use_batch;
            let got = if use_batch {
                ring.pop_batch(&mut out)
            } else {
                ring.pop()
                    .map(|o| {
                        out[0] = o;
                        1
                    })
                    .unwrap_or(0)
            };
            for obs in &out[..got] {
                assert_eq!(obs.latency_ticks, u64::from(obs.instance_id) * 3);
                if let Some(last) = last_seq {
                    assert!(
                        obs.instance_id > last,
                        "out of order: {last} then {}",
                        obs.instance_id
                    );
                }
                last_seq = Some(obs.instance_id);
            }
            popped += got as u64;
            if done && got == 0 && ring.is_empty() {
                break;
            }
        }
        let pushed = producer.join().unwrap();
        assert_eq!(popped, pushed);
        assert_eq!(pushed + ring.dropped(), u64::from(ATTEMPTS));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Model checks: `RUSTFLAGS="--cfg loom" cargo test -p subetha-core --lib loom`.
    use super::*;
    use loom::sync::Arc;

    fn obs(seq: u32) -> Observation {
        Observation {
            instance_id: seq,
            op_kind: 1,
            flags: 0,
            latency_ticks: u64::from(seq) + 100,
            producer_thread_id: 1,
            _reserved: 0,
        }
    }

    /// Producer overruns the 4-slot ring while the consumer pops one at a
    /// time: order, contents and conservation hold in every interleaving.
    #[test]
    fn push_pop_conserves_and_orders() {
        loom::model(|| {
            let ring = Arc::new(ObservationRing::new());
            let producer = {
                let ring = Arc::clone(&ring);
                loom::thread::spawn(move || (0..6).filter(|&s| ring.push(obs(s))).count() as u64)
            };
            let mut seen = Vec::new();
            for _ in 0..3 {
                if let Some(o) = ring.pop() {
                    seen.push(o);
                }
            }
            let pushed = producer.join().unwrap();
            while let Some(o) = ring.pop() {
                seen.push(o);
            }
            assert_eq!(seen.len() as u64, pushed);
            assert_eq!(pushed + ring.dropped(), 6);
            // Episodes are runs of drops (the marker in `cached_head` and
            // the consumer's `cached_tail` in every interleaving): at least
            // one if anything dropped, never more than the drops.
            let counters = ring.producer_counters();
            assert_eq!(counters.episodes > 0, counters.dropped > 0);
            assert!(u64::from(counters.episodes) <= counters.dropped);
            assert!(seen.windows(2).all(|w| w[0].instance_id < w[1].instance_id));
            assert!(
                seen.iter()
                    .all(|o| o.latency_ticks == u64::from(o.instance_id) + 100)
            );
        });
    }

    /// Same with batch pops racing the producer's wrap-around.
    #[test]
    fn batch_pop_conserves_and_orders() {
        loom::model(|| {
            let ring = Arc::new(ObservationRing::new());
            let producer = {
                let ring = Arc::clone(&ring);
                loom::thread::spawn(move || (0..7).filter(|&s| ring.push(obs(s))).count() as u64)
            };
            let mut seen = Vec::new();
            let mut out = [Observation::ZERO; 3];
            for _ in 0..2 {
                let n = ring.pop_batch(&mut out);
                seen.extend_from_slice(&out[..n]);
            }
            let pushed = producer.join().unwrap();
            loop {
                let n = ring.pop_batch(&mut out);
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&out[..n]);
            }
            assert_eq!(seen.len() as u64, pushed);
            assert_eq!(pushed + ring.dropped(), 7);
            let counters = ring.producer_counters();
            assert_eq!(counters.episodes > 0, counters.dropped > 0);
            assert!(u64::from(counters.episodes) <= counters.dropped);
            assert!(seen.windows(2).all(|w| w[0].instance_id < w[1].instance_id));
            assert!(
                seen.iter()
                    .all(|o| o.latency_ticks == u64::from(o.instance_id) + 100)
            );
        });
    }
}
