//! The maps shared with user space, and the small helpers around them.
//!
//! Counters are per-CPU and incremented with a plain load and store: bpfel
//! has no 64-bit atomic read-modify-write, and a per-CPU slot has a single
//! writer at a time (tracepoints run with preemption disabled; the uprobes
//! fire at most once per drop episode or scan, so the theoretical race of two
//! tasks hitting the same hook on one CPU within a few instructions is not a
//! concern for exact counts in practice). User space sums over CPUs.

use aya_ebpf::{
    EbpfContext,
    helpers::generated::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
};
use aya_log_ebpf::warn;
use subetha_probes::{
    BPF_RB_NO_WAKEUP, CpuRun, EVENTS_BYTES, HITS_BY_TASK_ENTRIES, HOOK_COUNT, OffCpuFilter, SchedConfig,
    WATCHED_ENTRIES, WATCHED_INDEX_WORDS, WatchedTask, index,
};

/// Every event, drained by user space on a timer (no wakeups).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Hits per hook, per CPU.
#[map]
pub static HITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(HOOK_COUNT, 0);

/// Hits per `[tgid, hook]`, per CPU.
#[map]
pub static HITS_BY_PID: LruPerCpuHashMap<[u32; 2], u64> =
    LruPerCpuHashMap::with_max_entries(HITS_BY_TASK_ENTRIES, 0);

/// Hits per `[tid, hook]`, per CPU.
#[map]
pub static HITS_BY_TID: LruPerCpuHashMap<[u32; 2], u64> =
    LruPerCpuHashMap::with_max_entries(HITS_BY_TASK_ENTRIES, 0);

/// Events that could not be written to [`EVENTS`] (full), per CPU.
#[map]
pub static LOSSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Watched threads' slots (see `subetha_probes::WATCHED_MAP`).
#[map]
pub static WATCHED: Array<WatchedTask> = Array::with_max_entries(WATCHED_ENTRIES, 0);

/// Residue -> slot index of [`WATCHED`] (see
/// `subetha_probes::WATCHED_INDEX_MAP`).
#[map]
pub static WATCHED_INDEX: Array<u64> = Array::with_max_entries(WATCHED_INDEX_WORDS, 0);

/// tid -> slot, for residues several watched threads share.
#[map]
pub static WATCHED_OVERFLOW: HashMap<u32, u32> = HashMap::with_max_entries(WATCHED_ENTRIES, 0);

/// Which off-CPU intervals become events; written by user space.
#[map]
pub static OFF_CPU_FILTER: Array<OffCpuFilter> = Array::with_max_entries(1, 0);

/// Off-CPU intervals the filter kept out of [`EVENTS`], per CPU.
#[map]
pub static OFF_CPU_FILTERED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: who runs since when, and the longest stretch since a watched
/// thread last left the CPU.
#[map]
pub static CPU_RUN: PerCpuArray<CpuRun> = PerCpuArray::with_max_entries(1, 0);

/// Tracepoint field offsets, written by user space before attaching.
#[map]
pub static SCHED_CONFIG: Array<SchedConfig> = Array::with_max_entries(1, 0);

/// CLOCK_MONOTONIC nanoseconds.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: a helper without arguments, callable from every program type.
    unsafe { bpf_ktime_get_ns() }
}

/// The CPU this program runs on.
#[inline(always)]
pub fn cpu() -> u32 {
    // SAFETY: a helper without arguments, callable from every program type.
    unsafe { bpf_get_smp_processor_id() }
}

/// Adds one to this CPU's slot `index` of a per-CPU array.
#[inline(always)]
pub fn bump(map: &PerCpuArray<u64>, index: u32) {
    if let Some(slot) = map.get_ptr_mut(index) {
        // SAFETY: the pointer is this CPU's value of an existing array slot,
        // valid for the program's run; only this CPU writes it.
        unsafe { *slot += 1 };
    }
}

/// Adds one to this CPU's value for `key` of a per-CPU hash, creating it.
#[inline(always)]
pub fn bump_keyed(map: &LruPerCpuHashMap<[u32; 2], u64>, key: [u32; 2]) {
    match map.get_ptr_mut(key) {
        // SAFETY: the pointer is this CPU's value of a live element, valid
        // for the program's run; only this CPU writes it.
        Some(slot) => unsafe { *slot += 1 },
        // A new element gets 1 on this CPU and 0 on the others. When another
        // CPU raced us creating it, BPF_ANY overwrites only our (zero) slot.
        None => {
            let _ = map.insert(key, 1u64, 0);
        }
    }
}

/// Writes `event` to the ring buffer without waking a poller. When it is
/// full the event is counted as lost, and the first loss on a CPU is also
/// logged (aya-log), so a reader of the agent's log learns the probes are
/// losing events without a log line per loss.
#[inline(always)]
pub fn emit<C: EbpfContext, T>(ctx: &C, event: &T) {
    if EVENTS.output::<T>(event, BPF_RB_NO_WAKEUP).is_ok() {
        return;
    }
    if let Some(lost) = LOSSES.get_ptr_mut(0) {
        // SAFETY: as in `bump`.
        let first = unsafe {
            *lost += 1;
            *lost == 1
        };
        if first {
            warn!(
                ctx,
                "subetha: event ring buffer full on CPU {}; further losses are only counted",
                cpu()
            );
        }
    }
}

/// The slot of a watched thread, or `None`: one inlined array load for an
/// unwatched thread (nearly every call), two for a watched one, and a hash
/// lookup only when its residue is shared.
///
/// The pointer is to a slot of an array map, valid for the program's run.
/// Its state is written only by the scheduler events of the one thread whose
/// tid it holds, which the scheduler serialises (a task is switched in only
/// after its switch-out completed, and woken only while it is off CPU).
#[inline(always)]
pub fn watched(tid: u32) -> Option<*mut WatchedTask> {
    if tid == 0 {
        // The idle task is never watched (and has one "tid 0" per CPU).
        return None;
    }
    let (word, shift) = index::position(index::residue(tid));
    let entry = (*WATCHED_INDEX.get(word)? >> shift) as u16;
    let slot = match entry {
        index::NONE => return None,
        index::OVERFLOW => *WATCHED_OVERFLOW.get_ptr(tid).map(|slot| {
            // SAFETY: a pointer to a live element's value, valid for the
            // program's run; a u32 read cannot tear.
            unsafe { &*slot }
        })?,
        slot => u32::from(slot) - 1,
    };
    let task = WATCHED.get_ptr_mut(slot)?;
    // SAFETY: a slot of an array map, valid for the program's run. User
    // space writes a slot's tid only while no index entry points to it.
    (unsafe { (*task).tid } == tid).then_some(task)
}
