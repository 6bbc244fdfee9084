//! The [`Drainer`]: moves every ring of a segment into per-instance
//! statistics. The in-process sidecar and the out-of-process agent use the
//! same code.
//!
//! # One scan
//!
//! 1. Refreshes its picture of the instance table (names, kinds, op names of
//!    new entries; which entries were retired).
//! 2. Drains each in-use ring in batches of [`POP_BATCH`] (one `tail` read, one
//!    copy, one `head` publish per batch; at most two ring-fulls per ring per
//!    scan so a busy producer cannot starve the others), attributing each
//!    observation to its instance if the id's index *and generation* match a
//!    known entry. An observation whose entry step 1 did not know yet (the
//!    instance registered while the scan ran, and at once pushed) is set
//!    aside and, after the rings, its entry is read again; only if that
//!    still does not match is it counted as unattributed.
//! 3. Reads each ring's producer-owned drop counter and episode state:
//!    new drops are added to the ring's and (where the episode names it) the
//!    instance's totals, new drop episodes enter a bounded history.
//! 4. Frees ring slots whose thread exited once they are empty, and
//!    instance entries that were retired before the scan began (their
//!    observations were all pushed before the retirement, so this scan has
//!    drained them); their final statistics move to a bounded list.
//!
//! The scan hooks bracket the scans that find work: [`subetha_scan_begin`]
//! is called when the first ring with something to drain or account is
//! reached, and [`subetha_scan_end`] when such a scan ends. A pass over idle
//! rings calls neither, so a probe attached to them costs nothing while
//! nothing happens (a uprobe trap costs tens of microseconds on a VM; at 100
//! idle scans a second that alone would be half a percent of a core).
//!
//! [`subetha_scan_begin`]: crate::hooks::subetha_scan_begin
//! [`subetha_scan_end`]: crate::hooks::subetha_scan_end
//!
//! # Hostile memory
//!
//! A Drainer may read a segment written by an untrusted process. Every
//! index comes from a validated [`SegmentView`]; live counts are clamped;
//! each observation is copied out before it is looked at; a ring whose
//! indices are impossible is reported as corrupt and not drained again;
//! history and retired lists are bounded. Wrong data yields wrong numbers,
//! never a crash, a hang or unbounded memory.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::clock::{self, Calibration};
use crate::hooks;
use crate::instance_id::{self, entry_index, id_generation};
use crate::lease::{ConsumerLease, LeaseBusy};
use crate::observation::Observation;
use crate::ring::{ObservationRing, RingCorrupt};
use crate::segment::{
    InstanceEntry, OP_KINDS, RingSlot, SegmentView, instance_state, read_padded_text, read_text, slot_state,
};
use crate::site::{Site, SiteError};
use crate::site_stats::SiteStats;
use crate::stats::InstanceStats;

/// Observations copied out of a ring per `head` publish.
pub const POP_BATCH: usize = 256;
/// Most observations drained from one ring in one scan.
const MAX_PER_RING_PER_SCAN: usize = 2 * ObservationRing::CAPACITY;
/// Drop episodes kept in the history.
pub const EPISODE_HISTORY: usize = 4096;
/// Retired instances whose final stats are kept.
pub const RETIRED_HISTORY: usize = 4096;
/// Scans between re-checks of table pages never seen written.
const UNTOUCHED_RECHECK: u64 = 64;
/// Instance entries per page.
const INSTANCES_PER_PAGE: u32 = (4096 / size_of::<InstanceEntry>()) as u32;

/// What a consumer knows about an instance, read from its table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceMeta {
    /// The id observations carry.
    pub id: u32,
    /// Kind code.
    pub kind: u16,
    /// Kind name (`"mutex"`, ...).
    pub kind_name: String,
    /// Instance name.
    pub name: String,
    /// Names of op kinds 1..=7 (empty when unnamed).
    pub op_names: [String; OP_KINDS],
    /// CLOCK_MONOTONIC ns at registration.
    pub registered_mono_ns: u64,
    /// CLOCK_MONOTONIC ns at unregistration, once retired.
    pub retired_mono_ns: Option<u64>,
}

impl InstanceMeta {
    /// The name of op kind `op` (1-based), or its number.
    pub fn op_name(&self, op: u16) -> String {
        usize::from(op)
            .checked_sub(1)
            .and_then(|i| self.op_names.get(i))
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| format!("op{op}"))
    }

    fn read(entry: &InstanceEntry, index: u32, generation: u32) -> Self {
        Self {
            id: (generation << 16) | (index + 1),
            kind: entry.kind.load(Ordering::Relaxed) as u16,
            kind_name: read_padded_text(&entry.kind_name),
            name: read_text(&entry.name, entry.name_len.load(Ordering::Relaxed)),
            op_names: std::array::from_fn(|k| read_padded_text(&entry.op_names[k])),
            registered_mono_ns: entry.registered_mono_ns.load(Ordering::Relaxed),
            retired_mono_ns: None,
        }
    }
}

/// An instance's metadata and statistics.
#[derive(Clone, Debug)]
pub struct InstanceRecord {
    /// From the table.
    pub meta: InstanceMeta,
    /// Accumulated by this consumer.
    pub stats: InstanceStats,
    /// Per call site, from the site ids of contended and missed
    /// observations (resolve them with [`Drainer::resolve_site`]).
    pub sites: SiteStats,
}

/// What a consumer knows about one ring slot and its current producer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingRecord {
    /// Slot index in the ring table.
    pub slot: u32,
    /// Claim generation of the slot.
    pub generation: u32,
    /// A [`slot_state`] value.
    pub state: u32,
    /// Producer's OS thread id in this consumer's pid namespace: the one
    /// `gettid` gave the producer, unless the drainer was told the producer
    /// lives in another namespace ([`Drainer::set_foreign_tids`]); then 0
    /// until [`Drainer::map_thread_ids`] finds it.
    pub os_tid: u32,
    /// Producer's OS thread id as the producer saw it (its own pid
    /// namespace's).
    pub ns_tid: u32,
    /// Producer's subetha thread id.
    pub thread_id: u32,
    /// Producer's thread name (sanitised).
    pub thread_name: String,
    /// Observations this consumer drained from the current occupant.
    pub drained: u64,
    /// Drops this consumer accounted for the current occupant.
    pub dropped: u64,
    /// Drop episodes this consumer saw begin for the current occupant.
    pub episodes: u64,
    /// Observations drained from the slot over its life, by any consumer.
    pub slot_drained_total: u64,
    /// The slot's cumulative drop counter (all occupants).
    pub slot_dropped_total: u64,
    /// Set when the ring's indices were found impossible.
    pub corrupt: Option<RingCorrupt>,
    dropped_seen: u64,
    episodes_seen: u32,
    open_episode: Option<u64>,
    /// The totals above reflect the slot as of a full pass.
    synced: bool,
}

/// One run of drops on one ring, with the user-space facts about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropEpisode {
    /// Unique (per drainer) id, increasing.
    pub seq: u64,
    /// Ring slot.
    pub slot: u32,
    /// Producer's OS thread id in this consumer's pid namespace (see
    /// [`RingRecord::os_tid`]; 0 while unknown).
    pub os_tid: u32,
    /// Producer's OS thread id in its own pid namespace.
    pub ns_tid: u32,
    /// Producer's thread name.
    pub thread_name: String,
    /// CLOCK_MONOTONIC ns when the first drop happened.
    pub begin_mono_ns: u64,
    /// CLOCK_MONOTONIC ns of the next successful push; `None` while going.
    pub end_mono_ns: Option<u64>,
    /// True when the end is the scan time at which the end was noticed, not
    /// the producer's own timestamp (a later episode overwrote it).
    pub end_estimated: bool,
    /// Observations lost in the episode (so far).
    pub dropped: u64,
    /// Instance of the first dropped observation.
    pub first_instance: u32,
    /// Episodes folded into this record because several began between two
    /// scans: `dropped` counts all of them, the times are the latest's.
    pub merged: u32,
    begin_dropped: u64,
}

/// Totals over the life of a drainer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainTotals {
    /// Scans completed.
    pub scans: u64,
    /// Observations drained.
    pub drained: u64,
    /// Drops accounted.
    pub dropped: u64,
    /// Drop episodes seen begin.
    pub episodes: u64,
    /// Drained observations whose instance id matched no known instance.
    pub unattributed: u64,
    /// Rings found corrupt.
    pub corrupt_rings: u64,
    /// Ring slots freed after their thread exited.
    pub freed_slots: u64,
    /// Instance entries freed after unregistration.
    pub freed_instances: u64,
}

/// What one scan did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Scan number (1-based).
    pub seq: u64,
    /// CLOCK_MONOTONIC ns at scan start.
    pub started_mono_ns: u64,
    /// Scan duration.
    pub duration_ns: u64,
    /// Observations drained.
    pub drained: u64,
    /// New drops seen.
    pub dropped: u64,
    /// Drop episodes that began.
    pub episodes_begun: u64,
    /// Rings that still held observations when the per-scan cap was hit.
    pub rings_left_full: u32,
    /// Highest fill level (observations) met at the start of a ring's drain.
    pub max_fill: u32,
    /// Rings newly found corrupt.
    pub corrupt_rings: u32,
    /// Slots freed.
    pub freed_slots: u32,
    /// Instances freed.
    pub freed_instances: u32,
}

impl ScanReport {
    /// Folds `other` (a scan of another segment in the same pass) into
    /// this report's load: what a [`ScanPacer`] reads.
    pub fn merge_load(&mut self, other: &ScanReport) {
        self.drained += other.drained;
        self.dropped += other.dropped;
        self.rings_left_full += other.rings_left_full;
        self.max_fill = self.max_fill.max(other.max_fill);
    }
}

/// Paces a consumer's scans by how full its rings were found.
///
/// Every wake-up of a scan thread takes a CPU from the threads it observes (on
/// a small host, frequent scans show in the `contended` group of
/// `benches/primitives.rs`, whose sidecar drains the rings), while a scan that
/// comes too late lets a ring fill and drop. So the pause follows the fullest
/// ring a
/// scan met: more than half full, the pause halves; under an eighth, it
/// grows by half; in between it stays. A scan that found drops or had to
/// leave a ring full goes back to the shortest pause at once, and a scan
/// that found nothing at all doubles it, so an idle process pays a few
/// hundred wake-ups a second. Between `min` and `max` always.
///
/// A steady producer thus meets its consumer while its ring is between an
/// eighth and a half full, leaving room for a burst of at least twice its
/// rate; a faster burst drops (counted, as every drop is) and brings the
/// next scan at `min`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanPacer {
    min: Duration,
    max: Duration,
    pause: Duration,
}

impl ScanPacer {
    /// A pacer starting at `min`; `max` below `min` is taken as `min`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            pause: min,
        }
    }

    /// The pause before the next scan.
    pub fn pause(&self) -> Duration {
        self.pause
    }

    /// Sets the pause after a scan that met `load` (see
    /// [`ScanReport::merge_load`] for a pass over several segments) and
    /// returns it.
    pub fn after_scan(&mut self, load: &ScanReport) -> Duration {
        let capacity = ObservationRing::CAPACITY as u32;
        let pause = self.pause;
        let next = if load.dropped != 0 || load.rings_left_full != 0 {
            self.min
        } else if load.max_fill > capacity / 2 {
            pause / 2
        } else if load.drained == 0 && load.max_fill == 0 {
            pause.saturating_mul(2)
        } else if load.max_fill < capacity / 8 {
            pause.saturating_add(pause / 2)
        } else {
            pause
        };
        self.pause = next.clamp(self.min, self.max);
        self.pause
    }
}

#[derive(Clone, Debug)]
struct Tracked {
    generation: u32,
    retiring: bool,
    /// The scan time `record` was last touched at: each instance is
    /// touched once per scan, not once per observation.
    touched_at: u64,
    record: InstanceRecord,
}

impl Tracked {
    /// Adds `obs` (of this instance) to the statistics, in a scan that
    /// started at `now`.
    #[inline(always)]
    fn account(&mut self, obs: &Observation, now: u64) {
        let stats = &mut self.record.stats;
        stats.record(obs.op_kind, obs.flags, obs.latency_ticks, obs.producer_thread_id);
        if obs._reserved != 0 {
            self.record.sites.record(obs);
        }
        if self.touched_at != now {
            self.touched_at = now;
            stats.touch(now);
        }
    }
}

/// Drains one segment. Holds the segment's consumer lease while it lives.
pub struct Drainer<V: AsRef<SegmentView>> {
    view: V,
    lease: Option<ConsumerLease>,
    calibration: Calibration,
    instances: Vec<Option<Box<Tracked>>>,
    /// Per instance-table page / ring slot: seen written at least once. Until
    /// then it is only looked at if `mincore` says its page is in memory
    /// (rechecked every `UNTOUCHED_RECHECK` scans): a hostile high-water mark
    /// must not make the consumer fault in (and pay for) untouched pages.
    instance_pages_touched: Vec<bool>,
    slots_touched: Vec<bool>,
    retired: VecDeque<InstanceRecord>,
    rings: Vec<RingRecord>,
    episodes: VecDeque<DropEpisode>,
    next_episode_seq: u64,
    totals: DrainTotals,
    batch: Box<[Observation; POP_BATCH]>,
    /// Observations of entries this scan's table refresh did not know, to
    /// be attributed after the rings (at most [`LATE_PER_SCAN`]).
    late: Vec<Observation>,
    /// Call sites resolved so far (entries are never rewritten by a sane
    /// producer, so a resolved id stays resolved).
    sites: parking_lot::Mutex<std::collections::HashMap<u16, Site>>,
    /// The producers live in another pid namespace: their `gettid` values
    /// are not ours.
    foreign_tids: bool,
    /// Records or episodes whose `os_tid` is still unknown.
    unmapped_tids: bool,
}

/// Whether a refresh of an instance entry may mark a retired one for freeing
/// at the end of this scan.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retirement {
    /// At the start of a scan: a retirement seen now happened before this
    /// scan drained any ring, so the scan drains all it pushed.
    Note,
    /// After the rings: the entry may have retired after some of its rings
    /// were drained; the next scan's start notes it.
    NextScan,
}

/// Observations per scan whose entry is read again before they count as
/// unattributed: enough for instances registered during a scan, and a
/// bound on what a hostile segment full of bad ids can make a scan do.
const LATE_PER_SCAN: usize = 1024;

impl<V: AsRef<SegmentView>> std::fmt::Debug for Drainer<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drainer")
            .field("segment_pid", &self.view().layout().pid)
            .field("totals", &self.totals)
            .finish_non_exhaustive()
    }
}

impl<V: AsRef<SegmentView>> Drainer<V> {
    /// Takes `view`'s consumer lease and prepares to drain it.
    pub fn attach(view: V) -> Result<Self, LeaseBusy> {
        let lease = ConsumerLease::acquire(view.as_ref())?;
        Ok(Self::with_lease(view, Some(lease)))
    }

    /// A drainer for `view` that drains only while it holds `lease` (which
    /// may come later: [`try_acquire`](Self::try_acquire),
    /// [`set_lease`](Self::set_lease)).
    pub fn with_lease(view: V, lease: Option<ConsumerLease>) -> Self {
        let calibration = view.as_ref().layout().calibration;
        Self {
            view,
            lease,
            calibration,
            instances: Vec::new(),
            instance_pages_touched: Vec::new(),
            slots_touched: Vec::new(),
            retired: VecDeque::new(),
            rings: Vec::new(),
            episodes: VecDeque::new(),
            next_episode_seq: 1,
            totals: DrainTotals::default(),
            batch: Box::new([Observation::ZERO; POP_BATCH]),
            late: Vec::new(),
            sites: parking_lot::Mutex::new(std::collections::HashMap::new()),
            foreign_tids: false,
            unmapped_tids: false,
        }
    }

    /// The call site `id` names in this segment's site table (validated as
    /// hostile input; see [`crate::site::read_site`]). Resolved ids are
    /// cached, so they stay resolvable after the process is gone.
    pub fn resolve_site(&self, id: u16) -> Result<Site, SiteError> {
        let mut cache = self.sites.lock();
        if let Some(site) = cache.get(&id) {
            return Ok(site.clone());
        }
        let site = crate::site::read_site(self.view.as_ref().sites(), id)?;
        cache.insert(id, site.clone());
        Ok(site)
    }

    /// Operations whose call site found the segment's site table full.
    pub fn sites_overflowed(&self) -> u64 {
        self.view.as_ref().sites().map_or(0, |t| t.overflowed())
    }

    /// The producers' thread ids are in another pid namespace than ours
    /// (the segment's creator lives in a container): records and episodes
    /// keep them as `ns_tid` and leave `os_tid` 0 until
    /// [`map_thread_ids`](Self::map_thread_ids) maps them. Call before the
    /// first scan.
    pub fn set_foreign_tids(&mut self) {
        self.foreign_tids = true;
    }

    /// Whether some record or episode waits for its `os_tid`.
    pub fn has_unmapped_tids(&self) -> bool {
        self.unmapped_tids
    }

    /// Fills in `os_tid` where it is unknown from `map(ns_tid)` (None: not
    /// known yet, asked again next time). Only does work while
    /// [`has_unmapped_tids`](Self::has_unmapped_tids).
    pub fn map_thread_ids(&mut self, mut map: impl FnMut(u32) -> Option<u32>) {
        if !self.unmapped_tids {
            return;
        }
        let mut missing = false;
        for record in &mut self.rings {
            if record.os_tid == 0 && record.ns_tid != 0 {
                match map(record.ns_tid) {
                    Some(tid) => record.os_tid = tid,
                    None => missing |= record.state == slot_state::ACTIVE,
                }
            }
        }
        for episode in self.episodes.iter_mut().rev() {
            if episode.os_tid == 0 && episode.ns_tid != 0 {
                match map(episode.ns_tid) {
                    Some(tid) => episode.os_tid = tid,
                    // An episode whose thread left unmapped stays so; only
                    // open ones keep asking.
                    None => missing |= episode.end_mono_ns.is_none(),
                }
            }
        }
        self.unmapped_tids = missing;
    }

    /// The segment.
    pub fn view(&self) -> &SegmentView {
        self.view.as_ref()
    }

    /// The handle the drainer was built with (e.g. an `Arc<SegmentView>`).
    pub fn view_handle(&self) -> &V {
        &self.view
    }

    /// Whether this drainer holds the lease now. A drainer that does not
    /// (never had it, handed it over, or a peer overwrote the word) does not
    /// drain: [`scan`](Self::scan) returns an empty report.
    pub fn holds_lease(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| l.is_held(self.view.as_ref()))
    }

    /// Takes the lease if it is vacant or its holder died; true if held now.
    pub fn try_acquire(&mut self) -> bool {
        if self.holds_lease() {
            return true;
        }
        match ConsumerLease::acquire(self.view.as_ref()) {
            Ok(lease) => {
                self.lease = Some(lease);
                true
            }
            Err(_) => false,
        }
    }

    /// Installs a lease obtained elsewhere (e.g. a granted takeover).
    pub fn set_lease(&mut self, lease: ConsumerLease) {
        self.lease = Some(lease);
    }

    /// If a live party asked for the lease, hands it over (call between
    /// scans) and returns its pid.
    pub fn hand_over_if_requested(&mut self) -> Option<u32> {
        let lease = self.lease.take()?;
        let Some(to) = lease.pending_request(self.view.as_ref()) else {
            self.lease = Some(lease);
            return None;
        };
        match lease.hand_over(self.view.as_ref(), to) {
            Ok(()) => Some(crate::lease::word_pid(to)),
            Err(lease) => {
                self.lease = Some(lease);
                None
            }
        }
    }

    /// Gives the lease back (word 0) if held.
    pub fn release_lease(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release(self.view.as_ref());
        }
    }

    /// Runs one scan; see the [module docs](self).
    pub fn scan(&mut self) -> ScanReport {
        let started = clock::monotonic_ns();
        self.totals.scans += 1;
        let mut report = ScanReport {
            seq: self.totals.scans,
            started_mono_ns: started,
            ..ScanReport::default()
        };
        if !self.holds_lease() {
            return report;
        }
        let base = self.view().base_addr();
        let mut hooked = false;
        if let Some(lease) = &self.lease {
            lease.heartbeat(self.view.as_ref(), started);
        }
        self.refresh_instances();
        let rings = self.view().rings_in_use();
        if self.rings.len() < rings as usize {
            let old = self.rings.len() as u32;
            self.rings.extend((old..rings).map(|slot| RingRecord {
                slot,
                ..RingRecord::default()
            }));
        }
        for index in 0..rings {
            self.scan_ring(index, started, &mut report, &mut hooked);
        }
        self.attribute_late(started);
        report.freed_instances = self.free_retired_instances();
        report.duration_ns = clock::monotonic_ns().saturating_sub(started);
        self.totals.drained += report.drained;
        if hooked {
            hooks::subetha_scan_end(base, report.seq, report.drained);
        }
        report
    }

    /// Whether table bytes at `offset` (page `page` of a `touched` list) may
    /// be read: seen written before, or in memory now.
    fn may_read(
        view: &SegmentView,
        touched: &mut Vec<bool>,
        page: usize,
        offset: usize,
        len: usize,
        recheck: bool,
    ) -> bool {
        if touched.len() <= page {
            touched.resize(page + 1, false);
            // First sight: check now.
            let resident = view.is_resident(offset, len);
            touched[page] = resident;
            return resident;
        }
        if touched[page] {
            return true;
        }
        if recheck && view.is_resident(offset, len) {
            touched[page] = true;
        }
        touched[page]
    }

    fn refresh_instances(&mut self) {
        let count = self.view().instances_in_use();
        let recheck = self.totals.scans % UNTOUCHED_RECHECK == 1;
        for index in 0..count {
            if !self.refresh_instance(index, recheck, Retirement::Note) {
                break;
            }
        }
    }

    /// Brings the picture of instance entry `index` up to date. Returns
    /// false if the table has no such entry.
    fn refresh_instance(&mut self, index: u32, recheck: bool, retirement: Retirement) -> bool {
        if self.instances.len() <= index as usize {
            let count = self.view().instances_in_use();
            if index >= count {
                return false;
            }
            self.instances.resize_with(count as usize, || None);
        }
        let page = (index / INSTANCES_PER_PAGE) as usize;
        let offset = self.view.as_ref().instance_offset(index);
        if !Self::may_read(
            self.view.as_ref(),
            &mut self.instance_pages_touched,
            page,
            offset,
            size_of::<InstanceEntry>(),
            recheck,
        ) {
            return true; // never written: FREE
        }
        let Some(entry) = self.view.as_ref().instance(index) else {
            return false;
        };
        // Acquire: pairs with the registrar's Release of LIVE / RETIRED.
        let state = entry.state.load(Ordering::Acquire);
        let generation = instance_id::entry_generation(entry.generation.load(Ordering::Relaxed));
        let tracked = &mut self.instances[index as usize];
        let known = tracked.as_ref().is_some_and(|t| t.generation == generation);
        match state {
            instance_state::LIVE | instance_state::RETIRED => {
                if !known {
                    if let Some(old) = tracked.take() {
                        Self::keep_retired(&mut self.retired, old.record);
                    }
                    *tracked = Some(Box::new(Tracked {
                        generation,
                        retiring: false,
                        touched_at: 0,
                        record: InstanceRecord {
                            meta: InstanceMeta::read(entry, index, generation),
                            stats: InstanceStats::new(),
                            sites: SiteStats::default(),
                        },
                    }));
                }
                if state == instance_state::RETIRED
                    && retirement == Retirement::Note
                    && let Some(t) = tracked
                {
                    t.retiring = true;
                }
            }
            _ => {
                if let Some(old) = tracked.take() {
                    Self::keep_retired(&mut self.retired, old.record);
                }
            }
        }
        true
    }

    /// Attributes the observations set aside during the ring drains: reads
    /// each one's entry again (it may have registered after this scan's
    /// refresh) and counts it as unattributed only if that does not match.
    fn attribute_late(&mut self, now: u64) {
        let mut late = std::mem::take(&mut self.late);
        // One entry read per distinct id, however many observations carry it.
        late.sort_unstable_by_key(|obs| obs.instance_id);
        let mut refreshed = None;
        for obs in &late {
            let index = instance_id::index_unchecked(obs.instance_id);
            let generation = id_generation(obs.instance_id);
            if refreshed != Some(obs.instance_id) {
                refreshed = Some(obs.instance_id);
                self.refresh_instance(index, true, Retirement::NextScan);
            }
            match self.instances.get_mut(index as usize).and_then(Option::as_mut) {
                Some(t) if t.generation == generation => t.account(obs, now),
                _ => self.totals.unattributed += 1,
            }
        }
        late.clear();
        self.late = late;
    }

    fn keep_retired(retired: &mut VecDeque<InstanceRecord>, mut record: InstanceRecord) {
        if record.meta.retired_mono_ns.is_none() {
            record.meta.retired_mono_ns = Some(clock::monotonic_ns());
        }
        if retired.len() == RETIRED_HISTORY {
            retired.pop_front();
        }
        retired.push_back(record);
    }

    fn free_retired_instances(&mut self) -> u32 {
        let mut freed = 0;
        for (index, tracked) in self.instances.iter_mut().enumerate() {
            if !tracked.as_ref().is_some_and(|t| t.retiring) {
                continue;
            }
            let Some(entry) = self.view.as_ref().instance(index as u32) else {
                continue;
            };
            let t = tracked.take().expect("checked above");
            let mut record = t.record;
            record.meta.retired_mono_ns = Some(entry.retired_mono_ns.load(Ordering::Relaxed));
            Self::keep_retired(&mut self.retired, record);
            entry.generation.store(
                instance_id::entry_generation(t.generation.wrapping_add(1)),
                Ordering::Relaxed,
            );
            // Release: the generation bump is visible to the next registrar.
            entry.state.store(instance_state::FREE, Ordering::Release);
            freed += 1;
        }
        self.totals.freed_instances += u64::from(freed);
        freed
    }

    fn scan_ring(&mut self, index: u32, now: u64, report: &mut ScanReport, hooked: &mut bool) {
        let recheck = self.totals.scans % UNTOUCHED_RECHECK == 1;
        let offset = self.view.as_ref().ring_slot_offset(index);
        if !Self::may_read(
            self.view.as_ref(),
            &mut self.slots_touched,
            index as usize,
            offset,
            64,
            recheck,
        ) {
            return; // never claimed: FREE, nothing in it
        }
        let Some(slot) = self.view.as_ref().ring_slot(index) else {
            return;
        };
        // Acquire: pairs with the producer's Release of ACTIVE / ORPHANED,
        // making its metadata and (for ORPHANED) its last pushes visible.
        let state = slot.state.load(Ordering::Acquire);
        let generation = slot.generation.load(Ordering::Relaxed);
        let record = &mut self.rings[index as usize];
        if !matches!(state, slot_state::ACTIVE | slot_state::ORPHANED) {
            // A free slot's totals are final; a consumer that attached after
            // it was freed still counts what earlier occupants pushed.
            record.state = state;
            record.slot = index;
            record.generation = generation;
            if state == slot_state::FREE {
                record.slot_drained_total = slot.reconcile_drained();
                record.slot_dropped_total = slot.ring.dropped();
                if record.thread_id == 0 {
                    // Never followed an occupant of it: what it dropped so
                    // far was before this consumer's time.
                    record.dropped_seen = record.slot_dropped_total;
                    record.episodes_seen = slot.ring.producer_counters().episodes;
                }
            }
            return;
        }
        if record.generation != generation || record.thread_id == 0 {
            if record.thread_id != 0 {
                // A thread adopted the slot of one we were following (see
                // the registry): the drops its exited thread made after our
                // last look are that thread's, counted before moving on.
                let at_claim = slot.dropped_at_claim.load(Ordering::Relaxed);
                let unseen = at_claim.saturating_sub(record.dropped_seen);
                self.totals.dropped += unseen;
                report.dropped += unseen;
                // The ring's latest episode is the previous occupant's while
                // the new one has begun none: it names the instance.
                let counters = slot.ring.producer_counters();
                if unseen > 0 && counters.episodes == slot.episodes_at_claim.load(Ordering::Relaxed) {
                    let first = counters.episode_first_instance;
                    let tracked = entry_index(first)
                        .and_then(|i| self.instances.get_mut(i as usize))
                        .and_then(Option::as_mut)
                        .filter(|t| t.generation == id_generation(first));
                    if let Some(t) = tracked {
                        t.record.stats.add_attributed_drops(unseen);
                    }
                }
                if let Some(seq) = record.open_episode
                    && let Some(episode) = self.episodes.iter_mut().rev().find(|e| e.seq == seq)
                {
                    episode.dropped = at_claim.saturating_sub(episode.begin_dropped);
                    if episode.end_mono_ns.is_none() {
                        episode.end_mono_ns = Some(now);
                        episode.end_estimated = true;
                    }
                }
            }
            // The slot's counters are cumulative over occupants. Charge the
            // new occupant only what happened after its claim, even if this
            // consumer never saw the earlier occupants (it attached later):
            // at its first scan. A slot first met later was first used (or
            // last seen free) in this consumer's time, so its earlier
            // occupants' drops (threads that came, overran it and went
            // between two scans, each adopting it from the last) are counted.
            let met_later = record.thread_id == 0 && self.totals.scans > 1;
            let dropped_seen = if met_later {
                record.dropped_seen
            } else {
                record
                    .dropped_seen
                    .max(slot.dropped_at_claim.load(Ordering::Relaxed))
            };
            let claim_episodes = slot.episodes_at_claim.load(Ordering::Relaxed);
            // The later of the two on the wrapping counter.
            let episodes_seen = if met_later {
                record.episodes_seen
            } else if claim_episodes.wrapping_sub(record.episodes_seen) < u32::MAX / 2 {
                claim_episodes
            } else {
                record.episodes_seen
            };
            let ns_tid = slot.os_tid.load(Ordering::Relaxed);
            self.unmapped_tids |= self.foreign_tids && ns_tid != 0;
            *record = RingRecord {
                slot: index,
                generation,
                os_tid: if self.foreign_tids { 0 } else { ns_tid },
                ns_tid,
                thread_id: slot.thread_id.load(Ordering::Relaxed),
                thread_name: read_text(&slot.thread_name, slot.thread_name_len.load(Ordering::Relaxed)),
                dropped_seen,
                episodes_seen,
                ..RingRecord::default()
            };
        }
        record.state = state;
        if record.corrupt.is_some() {
            return;
        }
        // Idle fast path: nothing pushed and nothing dropped since the last
        // scan means nothing to do (two loads instead of a dozen; scanning
        // many idle rings is most of an idle consumer's cost).
        if state == slot_state::ACTIVE
            && record.synced
            && record.open_episode.is_none()
            && slot.ring.is_empty()
            && slot.ring.dropped() == record.dropped_seen
        {
            return;
        }
        if !*hooked {
            *hooked = true;
            hooks::subetha_scan_begin(self.view.as_ref().base_addr(), report.seq);
        }
        let fill = slot.ring.len() as u32;
        report.max_fill = report.max_fill.max(fill);
        match drain_ring(
            slot,
            &mut self.batch,
            &mut self.instances,
            &mut self.late,
            now,
            &mut self.totals,
        ) {
            Ok((drained, left_full)) => {
                record.drained += drained;
                report.drained += drained;
                if left_full {
                    report.rings_left_full += 1;
                }
            }
            Err(corrupt) => {
                record.corrupt = Some(corrupt);
                report.corrupt_rings += 1;
                self.totals.corrupt_rings += 1;
                return;
            }
        }
        record.slot_drained_total = slot.reconcile_drained();
        record.synced = true;
        let finished = state == slot_state::ORPHANED && slot.ring.is_empty();
        self.account_drops(index, now, report);
        if finished && self.free_slot(index) {
            report.freed_slots += 1;
        }
    }

    fn account_drops(&mut self, index: u32, now: u64, report: &mut ScanReport) {
        let slot = self.view.as_ref().ring_slot(index).expect("scanned slot exists");
        let counters = slot.ring.producer_counters();
        let record = &mut self.rings[index as usize];
        record.slot_dropped_total = counters.dropped;
        let previously_seen = record.dropped_seen;
        let new_drops = counters.dropped.saturating_sub(previously_seen);
        record.dropped_seen = counters.dropped;
        // Drops before this point are covered by earlier episode records.
        let mut accounted_until = previously_seen;
        let begun = counters.episodes.wrapping_sub(record.episodes_seen);
        record.episodes_seen = counters.episodes;
        if new_drops == 0 && begun == 0 && record.open_episode.is_none() {
            return;
        }
        record.dropped += new_drops;
        record.episodes += u64::from(begun);
        report.dropped += new_drops;
        report.episodes_begun += u64::from(begun);
        self.totals.dropped += new_drops;
        self.totals.episodes += u64::from(begun);
        let calibration = self.calibration;
        let to_mono = |ticks: u64| calibration.ticks_to_monotonic_ns(ticks);
        if let Some(seq) = record.open_episode {
            let episode = self.episodes.iter_mut().rev().find(|e| e.seq == seq);
            if let Some(episode) = episode {
                if begun > 0 {
                    // It ended and others began; its own end time was
                    // overwritten by theirs.
                    episode.end_mono_ns = Some(now);
                    episode.end_estimated = true;
                    episode.dropped = counters
                        .episode_begin_dropped
                        .saturating_sub(episode.begin_dropped);
                    accounted_until = counters.episode_begin_dropped;
                } else {
                    episode.dropped = counters.dropped.saturating_sub(episode.begin_dropped);
                    if !counters.in_episode {
                        episode.end_mono_ns = Some(to_mono(counters.episode_end_ticks));
                    }
                }
                if episode.end_mono_ns.is_some() {
                    record.open_episode = None;
                }
            } else {
                record.open_episode = None;
            }
        }
        if begun > 0 {
            let seq = self.next_episode_seq;
            self.next_episode_seq += 1;
            let episode = DropEpisode {
                seq,
                slot: index,
                os_tid: record.os_tid,
                ns_tid: record.ns_tid,
                thread_name: record.thread_name.clone(),
                begin_mono_ns: to_mono(counters.episode_begin_ticks),
                end_mono_ns: (!counters.in_episode).then(|| to_mono(counters.episode_end_ticks)),
                end_estimated: false,
                // Covers every drop not in an earlier record, so that merged
                // episodes' drops are counted here.
                dropped: counters.dropped.saturating_sub(accounted_until),
                first_instance: counters.episode_first_instance,
                merged: begun - 1,
                begin_dropped: accounted_until,
            };
            if episode.end_mono_ns.is_none() {
                record.open_episode = Some(seq);
            }
            if self.episodes.len() == EPISODE_HISTORY {
                self.episodes.pop_front();
            }
            self.episodes.push_back(episode);
        }
        if new_drops > 0 {
            let tracked = entry_index(counters.episode_first_instance)
                .and_then(|i| self.instances.get_mut(i as usize))
                .and_then(Option::as_mut)
                .filter(|t| t.generation == id_generation(counters.episode_first_instance));
            if let Some(t) = tracked {
                t.record.stats.add_attributed_drops(new_drops);
            }
        }
    }

    fn free_slot(&mut self, index: u32) -> bool {
        let slot = self.view.as_ref().ring_slot(index).expect("scanned slot exists");
        // A thread that found no free slot may adopt an orphaned one (see
        // the registry) at any time: take the slot with a compare-exchange
        // (CLAIMED keeps claimers away while we reset it), and leave it to
        // its new occupant if one came first. Acquire: pairs with the
        // orphaning thread's Release, as the state load of the scan did.
        if slot
            .state
            .compare_exchange(
                slot_state::ORPHANED,
                slot_state::CLAIMED,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        slot.os_tid.store(0, Ordering::Relaxed);
        slot.thread_id.store(0, Ordering::Relaxed);
        slot.thread_name_len.store(0, Ordering::Relaxed);
        // Release: our head stores and the reset above happen before a new
        // producer claims the slot (its claim CAS Acquires).
        slot.state.store(slot_state::FREE, Ordering::Release);
        self.view().live().ring_free_epoch.fetch_add(1, Ordering::AcqRel);
        let record = &mut self.rings[index as usize];
        record.state = slot_state::FREE;
        record.open_episode = None;
        self.totals.freed_slots += 1;
        true
    }

    /// Live instances and their statistics.
    pub fn instances(&self) -> impl Iterator<Item = &InstanceRecord> {
        self.instances.iter().flatten().map(|t| &t.record)
    }

    /// Unregistered instances' final statistics, oldest first (bounded).
    pub fn retired(&self) -> impl Iterator<Item = &InstanceRecord> {
        self.retired.iter()
    }

    /// Ring slots seen so far.
    pub fn rings(&self) -> &[RingRecord] {
        &self.rings
    }

    /// Drop episodes, oldest first (bounded history).
    pub fn episodes(&self) -> impl DoubleEndedIterator<Item = &DropEpisode> {
        self.episodes.iter()
    }

    /// Lifetime totals.
    pub fn totals(&self) -> DrainTotals {
        self.totals
    }

    /// Sets the policy word of the live instance `id`; false if unknown.
    pub fn set_policy(&self, id: u32, word: u32) -> bool {
        let Some(entry) = self.view().instance_of(id) else {
            return false;
        };
        if entry.state.load(Ordering::Acquire) != instance_state::LIVE {
            return false;
        }
        entry.policy.store(word, Ordering::Relaxed);
        true
    }

    /// The current policy word of instance `id`, if it is live.
    pub fn policy(&self, id: u32) -> Option<u32> {
        let entry = self.view().instance_of(id)?;
        Some(entry.policy.load(Ordering::Relaxed))
    }

    /// Gives the lease back and returns what was accumulated.
    pub fn detach(mut self) -> (Vec<InstanceRecord>, DrainTotals) {
        self.release_lease();
        let records = self.instances.drain(..).flatten().map(|t| t.record).collect();
        (records, self.totals)
    }
}

impl<V: AsRef<SegmentView>> Drop for Drainer<V> {
    fn drop(&mut self) {
        self.release_lease();
    }
}

/// Drains one ring into the instances' stats. Returns the count drained and
/// whether the per-scan cap left observations behind.
fn drain_ring(
    slot: &RingSlot,
    batch: &mut [Observation; POP_BATCH],
    instances: &mut [Option<Box<Tracked>>],
    late: &mut Vec<Observation>,
    now: u64,
    totals: &mut DrainTotals,
) -> Result<(u64, bool), RingCorrupt> {
    let mut drained = 0usize;
    while drained < MAX_PER_RING_PER_SCAN {
        let n = slot.ring.try_pop_batch(batch)?;
        if n == 0 {
            return Ok((drained as u64, false));
        }
        drained += n;
        for obs in &batch[..n] {
            let index = instance_id::index_unchecked(obs.instance_id) as usize;
            match instances.get_mut(index).and_then(Option::as_mut) {
                Some(t) if t.generation == id_generation(obs.instance_id) => t.account(obs, now),
                _ if late.len() < LATE_PER_SCAN => late.push(*obs),
                _ => totals.unattributed += 1,
            }
        }
    }
    Ok((drained as u64, !slot.ring.is_empty()))
}

impl AsRef<SegmentView> for SegmentView {
    fn as_ref(&self) -> &SegmentView {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{InstanceKind, register_in};
    use crate::segment::{Segment, SegmentConfig};

    const MUTEX: InstanceKind = InstanceKind {
        code: 1,
        name: "mutex",
        ops: &["lock", "try_lock", "unlock"],
    };

    fn segment(ring_slots: u32) -> Segment {
        Segment::create(SegmentConfig {
            instances: 8,
            ring_slots,
        })
        .unwrap()
    }

    /// A scan's load: `drained` observations, the fullest ring at `fill`.
    fn load(drained: u64, fill: u32) -> ScanReport {
        ScanReport {
            drained,
            max_fill: fill,
            ..ScanReport::default()
        }
    }

    #[test]
    fn the_pacer_follows_the_fullest_ring_between_its_bounds() {
        let (min, max) = (Duration::from_micros(200), Duration::from_millis(5));
        let capacity = ObservationRing::CAPACITY as u32;
        let mut pacer = ScanPacer::new(min, max);
        assert_eq!(pacer.pause(), min);
        // Rings under an eighth full: the pause grows by half each scan,
        // then stops at `max`.
        assert_eq!(
            pacer.after_scan(&load(100, capacity / 16)),
            Duration::from_micros(300)
        );
        assert_eq!(
            pacer.after_scan(&load(100, capacity / 16)),
            Duration::from_micros(450)
        );
        for _ in 0..20 {
            pacer.after_scan(&load(100, capacity / 16));
        }
        assert_eq!(pacer.pause(), max);
        // Between an eighth and a half: it stays.
        assert_eq!(pacer.after_scan(&load(3000, capacity / 4)), max);
        assert_eq!(pacer.after_scan(&load(3000, capacity / 2)), max);
        // Over half full: it halves.
        assert_eq!(pacer.after_scan(&load(3000, capacity / 2 + 1)), max / 2);
        assert_eq!(pacer.after_scan(&load(3000, capacity)), max / 4);
        // Drops, or a ring left full by the per-scan cap: straight to `min`.
        pacer = ScanPacer::new(min, max);
        for _ in 0..20 {
            pacer.after_scan(&load(1, 1));
        }
        let dropped = ScanReport {
            dropped: 1,
            ..load(0, 0)
        };
        assert_eq!(pacer.after_scan(&dropped), min);
        for _ in 0..20 {
            pacer.after_scan(&load(1, 1));
        }
        let left_full = ScanReport {
            rings_left_full: 1,
            ..load(2 * capacity as u64, capacity)
        };
        assert_eq!(pacer.after_scan(&left_full), min);
        // Idle: it doubles, up to `max`.
        assert_eq!(pacer.after_scan(&load(0, 0)), 2 * min);
        assert_eq!(pacer.after_scan(&load(0, 0)), 4 * min);
        for _ in 0..10 {
            pacer.after_scan(&load(0, 0));
        }
        assert_eq!(pacer.pause(), max);
        // Halving never goes under `min`; a `max` under `min` is `min`.
        pacer = ScanPacer::new(min, max);
        assert_eq!(pacer.after_scan(&load(4000, capacity)), min);
        assert_eq!(ScanPacer::new(min, Duration::ZERO).after_scan(&load(0, 0)), min);
    }

    #[test]
    fn a_pass_over_several_segments_is_paced_by_all_of_them() {
        let mut pass = load(10, 5);
        pass.merge_load(&ScanReport {
            dropped: 3,
            rings_left_full: 1,
            ..load(20, 4000)
        });
        pass.merge_load(&load(0, 7));
        assert_eq!(
            (pass.drained, pass.dropped, pass.rings_left_full, pass.max_fill),
            (30, 3, 1, 4000)
        );
    }

    /// Claims slot `index` by hand, as a thread's first push would.
    fn activate(view: &SegmentView, index: u32, thread_id: u32) -> &RingSlot {
        let slot = view.ring_slot(index).unwrap();
        slot.generation.fetch_add(1, Ordering::Relaxed);
        slot.thread_id.store(thread_id, Ordering::Relaxed);
        slot.os_tid.store(1000 + thread_id, Ordering::Relaxed);
        slot.state.store(slot_state::ACTIVE, Ordering::Release);
        view.live()
            .rings_high_water
            .fetch_max(index + 1, Ordering::AcqRel);
        slot
    }

    fn push(slot: &RingSlot, id: u32, op: u16, flags: u16, latency: u64) -> bool {
        slot.ring.push(Observation {
            producer_thread_id: slot.thread_id.load(Ordering::Relaxed),
            ..Observation::new(id, op, flags, latency)
        })
    }

    #[test]
    fn foreign_thread_ids_wait_for_their_mapping() {
        let segment = segment(2);
        let view = segment.view();
        activate(view, 0, 7);
        activate(view, 1, 8);
        // Same namespace: the producer's tid is ours.
        let mut local = Drainer::attach(view).unwrap();
        local.scan();
        assert_eq!(local.rings()[0].os_tid, 1007);
        assert_eq!(local.rings()[0].ns_tid, 1007);
        assert!(!local.has_unmapped_tids());
        local.release_lease();
        let mut drainer = Drainer::attach(view).unwrap();
        drainer.set_foreign_tids();
        drainer.scan();
        let tids =
            |d: &Drainer<&SegmentView>| d.rings().iter().map(|r| (r.ns_tid, r.os_tid)).collect::<Vec<_>>();
        assert_eq!(tids(&drainer), vec![(1007, 0), (1008, 0)]);
        assert!(drainer.has_unmapped_tids());
        // One found now, the other later.
        drainer.map_thread_ids(|ns| (ns == 1007).then_some(51007));
        assert_eq!(tids(&drainer), vec![(1007, 51007), (1008, 0)]);
        assert!(drainer.has_unmapped_tids());
        drainer.map_thread_ids(|ns| Some(ns + 50000));
        assert_eq!(tids(&drainer), vec![(1007, 51007), (1008, 51008)]);
        assert!(!drainer.has_unmapped_tids());
        // A mapping that is never asked again does no work.
        drainer.map_thread_ids(|_| panic!("asked though everything is mapped"));
    }

    #[test]
    fn drains_into_per_instance_stats() {
        let segment = segment(2);
        let view = segment.view();
        let a = register_in(view, MUTEX, "a").unwrap();
        let b = register_in(view, MUTEX, "b").unwrap();
        let ring0 = activate(view, 0, 7);
        let ring1 = activate(view, 1, 8);
        for _ in 0..1000 {
            push(ring0, a, 1, 0, 0);
        }
        for i in 0..500 {
            push(ring1, a, 1, Observation::FLAG_CONTENDED, 100 + i);
            push(ring1, b, 2, Observation::FLAG_MISS, 0);
        }
        push(ring1, 0xFFFF_0003, 1, 0, 0); // no such instance
        let mut drainer = Drainer::attach(view).unwrap();
        let report = drainer.scan();
        assert_eq!(report.drained, 2001);
        let stats_of = |id: u32| {
            drainer
                .instances()
                .find(|r| r.meta.id == id)
                .map(|r| r.stats.clone())
                .unwrap()
        };
        let sa = stats_of(a);
        assert_eq!(sa.op(1).unwrap().ops(), 1500);
        assert_eq!(sa.op(1).unwrap().contended(), 500);
        assert_eq!(sa.op(1).unwrap().latency().unwrap().count(), 500);
        assert_eq!(sa.distinct_threads().count, 2);
        let sb = stats_of(b);
        assert_eq!((sb.op(2).unwrap().ops(), sb.op(2).unwrap().misses()), (500, 500));
        assert_eq!(drainer.totals().unattributed, 1);
        let meta = &drainer.instances().next().unwrap().meta;
        assert_eq!(
            (meta.kind_name.as_str(), meta.op_name(2).as_str()),
            ("mutex", "try_lock")
        );
        assert_eq!(ring0.drained_total.load(Ordering::Relaxed), 1000);
        assert!(ring0.ring.is_empty() && ring1.ring.is_empty());
    }

    /// An instance that registers after a scan has read the table, and
    /// pushes at once, does not lose those observations to "unattributed":
    /// the scan reads its entry again before giving up on them. Ids that
    /// match no entry still count as unattributed, once each.
    #[test]
    fn an_instance_registered_during_a_scan_keeps_its_observations() {
        let segment = segment(2);
        let view = segment.view();
        let ring = activate(view, 0, 7);
        let mut drainer = Drainer::attach(view).unwrap();
        let early = register_in(view, MUTEX, "early").unwrap();
        push(ring, early, 1, 0, 0);
        drainer.scan();
        // A scan's first step (the table) has run; then the registration
        // and its pushes land; then the scan's rings are drained.
        drainer.refresh_instances();
        let late = register_in(view, MUTEX, "late").unwrap();
        push(ring, late, 1, 0, 0);
        push(ring, late, 2, Observation::FLAG_MISS, 0);
        push(ring, 0xFFFF_0005, 1, 0, 0); // no such instance
        push(ring, 0xFFFF_0005, 1, 0, 0);
        let (mut report, mut hooked) = (ScanReport::default(), false);
        let now = clock::monotonic_ns();
        drainer.scan_ring(0, now, &mut report, &mut hooked);
        assert_eq!(report.drained, 4);
        drainer.attribute_late(now);
        let record = drainer.instances().find(|r| r.meta.id == late).unwrap();
        assert_eq!(record.meta.name, "late");
        assert_eq!(record.stats.total_ops(), 2);
        assert_eq!(drainer.totals().unattributed, 2);
        // An instance that registered and retired while a scan ran keeps its
        // entry until a scan that starts after the retirement: another of its
        // threads' rings may hold pushes this scan drained too early to see.
        drainer.refresh_instances();
        let brief = register_in(view, MUTEX, "brief").unwrap();
        push(ring, brief, 1, 0, 0);
        drainer.scan_ring(0, now + 1, &mut report, &mut hooked);
        let entry = view.instance(entry_index(brief).unwrap()).unwrap();
        entry.state.store(instance_state::RETIRED, Ordering::Release);
        drainer.attribute_late(now + 1);
        assert_eq!(drainer.free_retired_instances(), 0);
        assert!(drainer.instances().any(|r| r.meta.id == brief));
        let ring1 = activate(view, 1, 8);
        push(ring1, brief, 2, 0, 0);
        let report = drainer.scan();
        assert_eq!(report.freed_instances, 1);
        let record = drainer.retired().find(|r| r.meta.id == brief).unwrap();
        assert_eq!(record.stats.total_ops(), 2);
        // The next full scan finds nothing left over and does not count the
        // late instance twice.
        drainer.scan();
        let record = drainer.instances().find(|r| r.meta.id == late).unwrap();
        assert_eq!(record.stats.total_ops(), 2);
        assert_eq!(drainer.totals().unattributed, 2);
    }

    #[test]
    fn drops_and_episodes_are_accounted_and_attributed() {
        let segment = segment(1);
        let view = segment.view();
        let a = register_in(view, MUTEX, "a").unwrap();
        let ring = activate(view, 0, 3);
        let mut drainer = Drainer::attach(view).unwrap();
        for _ in 0..ObservationRing::CAPACITY + 10 {
            push(ring, a, 1, 0, 0);
        }
        let first = drainer.scan();
        assert_eq!(
            (first.drained, first.dropped, first.episodes_begun),
            (4096, 10, 1)
        );
        let episode = drainer.episodes().next().unwrap().clone();
        assert_eq!(
            (episode.dropped, episode.first_instance, episode.os_tid),
            (10, a, 1003)
        );
        assert_eq!(episode.end_mono_ns, None, "no successful push yet");
        // A successful push ends the episode; the next scan closes it.
        assert!(push(ring, a, 1, 0, 0));
        drainer.scan();
        let closed = drainer.episodes().next().unwrap();
        let end = closed.end_mono_ns.expect("closed");
        assert!(end >= closed.begin_mono_ns && !closed.end_estimated);
        let record = &drainer.rings()[0];
        assert_eq!((record.drained, record.dropped, record.episodes), (4097, 10, 1));
        let stats = &drainer.instances().next().unwrap().stats;
        assert_eq!(stats.drops_attributed(), 10);
        // Conservation: attempts = drained + dropped.
        assert_eq!(record.drained + record.dropped, 4096 + 10 + 1);
    }

    #[test]
    fn orphaned_slot_is_drained_then_freed() {
        let segment = segment(1);
        let view = segment.view();
        let a = register_in(view, MUTEX, "a").unwrap();
        let ring = activate(view, 0, 5);
        for _ in 0..10 {
            push(ring, a, 1, 0, 0);
        }
        ring.state.store(slot_state::ORPHANED, Ordering::Release);
        let mut drainer = Drainer::attach(view).unwrap();
        let report = drainer.scan();
        assert_eq!((report.drained, report.freed_slots), (10, 1));
        assert_eq!(ring.state.load(Ordering::Acquire), slot_state::FREE);
        assert_eq!(view.live().ring_free_epoch.load(Ordering::Acquire), 1);
        assert_eq!(ring.drained_total.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn retired_instance_keeps_final_stats_and_entry_is_reused() {
        let segment = segment(1);
        let view = segment.view();
        let a = register_in(view, MUTEX, "short-lived").unwrap();
        let ring = activate(view, 0, 5);
        for _ in 0..3 {
            push(ring, a, 3, 0, 50);
        }
        let entry = view.instance(0).unwrap();
        entry.state.store(instance_state::RETIRED, Ordering::Release);
        let mut drainer = Drainer::attach(view).unwrap();
        let report = drainer.scan();
        assert_eq!(report.freed_instances, 1);
        let retired: Vec<_> = drainer.retired().collect();
        assert_eq!(retired.len(), 1);
        assert_eq!(retired[0].meta.name, "short-lived");
        assert_eq!(retired[0].stats.op(3).unwrap().ops(), 3);
        assert_eq!(drainer.instances().count(), 0);
        // The entry comes back with a new generation; stale ids are not
        // attributed to the new occupant.
        let b = register_in(view, MUTEX, "next").unwrap();
        assert_eq!(entry_index(b), Some(0));
        assert_ne!(a, b);
        push(ring, a, 1, 0, 0);
        push(ring, b, 1, 0, 0);
        drainer.scan();
        assert_eq!(drainer.totals().unattributed, 1);
        assert_eq!(drainer.instances().next().unwrap().stats.total_ops(), 1);
    }

    #[test]
    fn corrupt_ring_is_reported_and_skipped() {
        let segment = segment(2);
        let view = segment.view();
        let a = register_in(view, MUTEX, "a").unwrap();
        let bad = activate(view, 0, 1);
        let good = activate(view, 1, 2);
        // Simulate a hostile writer: tail far beyond head.
        for _ in 0..3 {
            push(bad, a, 1, 0, 0);
        }
        // SAFETY-free corruption through the public consumer API is not
        // possible; write the tail word directly (it is at byte 64).
        let tail = (&bad.ring as *const ObservationRing as usize + 64) as *const std::sync::atomic::AtomicU32;
        // SAFETY: `tail` points at the ring's tail atomic (layout asserted
        // in ring tests); storing to an atomic is always sound.
        unsafe { &*tail }.store(1_000_000, Ordering::Release);
        push(good, a, 1, 0, 0);
        let mut drainer = Drainer::attach(view).unwrap();
        let report = drainer.scan();
        assert_eq!((report.corrupt_rings, report.drained), (1, 1));
        assert!(drainer.rings()[0].corrupt.is_some());
        assert_eq!(drainer.scan().corrupt_rings, 0, "reported once");
    }

    #[test]
    fn second_drainer_is_refused_while_first_holds_the_lease() {
        let segment = segment(1);
        let first = Drainer::attach(segment.view()).unwrap();
        assert!(Drainer::attach(segment.view()).is_err());
        drop(first);
        assert!(Drainer::attach(segment.view()).is_ok());
    }

    #[test]
    fn policy_words_round_trip_for_live_instances_only() {
        let segment = segment(1);
        let view = segment.view();
        let a = register_in(view, MUTEX, "a").unwrap();
        let drainer = Drainer::attach(view).unwrap();
        assert!(drainer.set_policy(a, 42));
        assert_eq!(drainer.policy(a), Some(42));
        assert!(!drainer.set_policy(a + (1 << 16), 1), "wrong generation");
        assert!(!drainer.set_policy(0, 1));
    }
}
