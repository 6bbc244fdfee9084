//! eBPF probes for subetha and the `no_std` types they share with user space.
//!
//! The programs themselves live in the crate's binary target (`src/main.rs`,
//! built for `bpfel-unknown-none` by the agent's build script through
//! aya-build). This library holds what both sides must agree on, byte for
//! byte: the map names, the event records the programs write into the
//! [`EVENTS_MAP`] ring buffer, the scheduler tracepoint configuration user
//! space writes into [`SCHED_CONFIG_MAP`] and [`OFF_CPU_FILTER_MAP`], the
//! `task_struct` offsets it sets as [`global`]s, and the per-thread state
//! kept in [`WATCHED_MAP`].
//!
//! Every record is `#[repr(C)]`, 8-byte aligned and free of padding, so it
//! can be copied in and out of maps and ring buffers as plain bytes. With the
//! `user` feature the records derive `bytemuck::Pod` for user space.
//!
//! # Events
//!
//! Each event starts with an [`EventHeader`] whose `kind` is one of the
//! [`kind`] constants:
//!
//! | kind | record | emitted by |
//! | --- | --- | --- |
//! | `DROP_BEGIN`, `DROP_END`, `SCAN_BEGIN`, `SCAN_END` | [`HookEvent`] | the four uprobes |
//! | `OFF_CPU` | [`OffCpuEvent`] | `sched_switch`, when a watched thread gets back on a CPU |
//! | `MIGRATE` | [`MigrateEvent`] | `sched_migrate_task`, for a watched thread |
//!
//! Timestamps are `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
#![no_std]

/// Name of the events ring buffer (`BPF_MAP_TYPE_RINGBUF`).
pub const EVENTS_MAP: &str = "EVENTS";
/// Size of the events ring buffer in bytes (a power-of-two number of pages).
pub const EVENTS_BYTES: u32 = 1 << 20;
/// Name of the per-hook hit counters (`PERCPU_ARRAY<u64>`, [`HOOK_COUNT`]
/// entries indexed by [`hook`]).
pub const HITS_MAP: &str = "HITS";
/// Name of the per-process hit counters (`LRU_PERCPU_HASH<[u32; 2], u64>`,
/// key `[tgid, hook]`).
pub const HITS_BY_PID_MAP: &str = "HITS_BY_PID";
/// Name of the per-thread hit counters (`LRU_PERCPU_HASH<[u32; 2], u64>`,
/// key `[tid, hook]`).
pub const HITS_BY_TID_MAP: &str = "HITS_BY_TID";
/// Entries of each of the per-process and per-thread hit maps.
pub const HITS_BY_TASK_ENTRIES: u32 = 4096;
/// Name of the loss counter (`PERCPU_ARRAY<u64>`, one entry): events that
/// could not be written to the ring buffer.
pub const LOSSES_MAP: &str = "LOSSES";
/// Name of the watched-thread slots (`ARRAY<WatchedTask>`,
/// [`WATCHED_ENTRIES`] entries). User space fills a slot (tid, role,
/// process, zeroed state) before publishing it in [`WATCHED_INDEX_MAP`] and
/// zeroes the tid after unpublishing it; the programs only update the state
/// of a slot whose tid matches, in place.
pub const WATCHED_MAP: &str = "WATCHED";
/// Threads that can be watched at once (slots of [`WATCHED_MAP`]).
pub const WATCHED_ENTRIES: u32 = 4096;
/// Name of the watched-thread index (`ARRAY<u64>`,
/// [`WATCHED_INDEX_WORDS`] entries of four `u16` each): for every residue
/// `tid % 65536`, [`index::NONE`], a slot of [`WATCHED_MAP`] plus one, or
/// [`index::OVERFLOW`] when two watched threads share the residue (then
/// [`WATCHED_OVERFLOW_MAP`] says which slot). Finding out that a thread is
/// not watched, what nearly every scheduler event asks, costs one inlined
/// array load, and finding a watched thread's slot a second one: no hash
/// lookup on the scheduler's hot path.
pub const WATCHED_INDEX_MAP: &str = "WATCHED_INDEX";
/// Words of [`WATCHED_INDEX_MAP`].
pub const WATCHED_INDEX_WORDS: u32 = 16384;
/// Name of the slots of watched threads whose residue is shared
/// (`HASH<u32 tid, u32 slot>`, [`WATCHED_ENTRIES`] entries).
pub const WATCHED_OVERFLOW_MAP: &str = "WATCHED_OVERFLOW";
/// Name of the tracepoint configuration (`ARRAY<SchedConfig>`, one entry).
pub const SCHED_CONFIG_MAP: &str = "SCHED_CONFIG";
/// Name of the off-CPU event filter (`ARRAY<OffCpuFilter>`, one entry).
pub const OFF_CPU_FILTER_MAP: &str = "OFF_CPU_FILTER";

/// Values of the `u16` entries of [`WATCHED_INDEX_MAP`].
pub mod index {
    /// No watched thread has this residue.
    pub const NONE: u16 = 0;
    /// Several do: look the tid up in the overflow map.
    pub const OVERFLOW: u16 = u16::MAX;
    /// Residues per index word.
    pub const PER_WORD: u32 = 4;

    /// The residue of `tid`: which index entry stands for it.
    pub const fn residue(tid: u32) -> u32 {
        tid % (super::WATCHED_INDEX_WORDS * PER_WORD)
    }

    /// The word of the index and the bit shift of `residue`'s entry in it.
    pub const fn position(residue: u32) -> (u32, u32) {
        (residue / PER_WORD, (residue % PER_WORD) * 16)
    }
}

/// Names of the read-only globals user space sets before loading: the
/// `task_struct` field offsets the BTF tracepoints read, from the kernel's
/// BTF. Read-only data is frozen at load, so the verifier knows each value
/// as a constant and accepts a direct load at `task + offset`.
pub mod global {
    /// `u32`: offset of `pid` (`pid_t`) in `task_struct`.
    pub const TASK_PID_OFFSET: &str = "SUBETHA_TASK_PID_OFFSET";
    /// `u32`: offset of `comm` (`char[16]`) in `task_struct`.
    pub const TASK_COMM_OFFSET: &str = "SUBETHA_TASK_COMM_OFFSET";
    /// `u32`: offset of the CPU a task is on (`unsigned int`) in
    /// `task_struct`.
    pub const TASK_CPU_OFFSET: &str = "SUBETHA_TASK_CPU_OFFSET";
    /// `u32`: offset of `se.exec_start` (`u64`) in `task_struct`: the
    /// runqueue task clock when the task last started or was last
    /// accounted, which at `sched_switch` is "now" for `next` (just picked)
    /// and for `prev` (just accounted).
    pub const TASK_EXEC_START_OFFSET: &str = "SUBETHA_TASK_EXEC_START_OFFSET";
    /// `u32`: offset of `sched_info.run_delay` (`u64`, ns a task waited on
    /// runqueues, updated when it gets a CPU or leaves a runqueue) in
    /// `task_struct`.
    pub const TASK_RUN_DELAY_OFFSET: &str = "SUBETHA_TASK_RUN_DELAY_OFFSET";
    /// `u32`: offset of `sched_info.last_queued` (`u64`, the runqueue clock
    /// when it was queued; 0 while running or asleep) in `task_struct`.
    pub const TASK_LAST_QUEUED_OFFSET: &str = "SUBETHA_TASK_LAST_QUEUED_OFFSET";
    /// `u32`: offset of `sched_info.last_arrival` (`u64`, the runqueue
    /// clock when the task last got a CPU) in `task_struct`.
    pub const TASK_LAST_ARRIVAL_OFFSET: &str = "SUBETHA_TASK_LAST_ARRIVAL_OFFSET";
    /// `u32`: offset of `se.cfs_rq` (a pointer to the task's CFS runqueue)
    /// in `task_struct`.
    pub const TASK_CFS_RQ_OFFSET: &str = "SUBETHA_TASK_CFS_RQ_OFFSET";
    /// `u32`: offset of `rq` (a pointer to the CPU's runqueue) in `cfs_rq`.
    pub const CFS_RQ_RQ_OFFSET: &str = "SUBETHA_CFS_RQ_RQ_OFFSET";
    /// `u32`: offset of `clock` (`u64`, the runqueue clock that
    /// `sched_info` uses) in `rq`.
    pub const RQ_CLOCK_OFFSET: &str = "SUBETHA_RQ_CLOCK_OFFSET";
}

/// The eBPF programs, by the name aya knows them (at most 15 bytes: the
/// kernel keeps that much of a program name).
pub mod program {
    /// uprobe on `subetha_drop_begin`.
    pub const DROP_BEGIN: &str = "up_drop_begin";
    /// uprobe on `subetha_drop_end`.
    pub const DROP_END: &str = "up_drop_end";
    /// uprobe on `subetha_scan_begin`.
    pub const SCAN_BEGIN: &str = "up_scan_begin";
    /// uprobe on `subetha_scan_end`.
    pub const SCAN_END: &str = "up_scan_end";
    /// tracepoint `sched/sched_switch`.
    pub const SCHED_SWITCH: &str = "tp_sched_switch";
    /// tracepoint `sched/sched_wakeup`.
    pub const SCHED_WAKEUP: &str = "tp_sched_wakeup";
    /// tracepoint `sched/sched_wakeup_new`.
    pub const SCHED_WAKEUP_NEW: &str = "tp_wakeup_new";
    /// tracepoint `sched/sched_migrate_task`.
    pub const SCHED_MIGRATE: &str = "tp_migrate_task";
    /// BTF tracepoint (`tp_btf`) `sched_switch`. It reads a woken thread's
    /// runqueue wait from its `sched_info`, so with it no wakeup
    /// tracepoint is attached.
    pub const BTF_SCHED_SWITCH: &str = "bt_sched_switch";
    /// BTF tracepoint `sched_migrate_task`.
    pub const BTF_SCHED_MIGRATE: &str = "bt_migrate_task";

    /// The uprobes with the hook symbol each attaches to, in [`super::hook`]
    /// order.
    pub const UPROBES: [(&str, &str); 4] = [
        (DROP_BEGIN, "subetha_drop_begin"),
        (DROP_END, "subetha_drop_end"),
        (SCAN_BEGIN, "subetha_scan_begin"),
        (SCAN_END, "subetha_scan_end"),
    ];

    /// The scheduler tracepoints: `(BTF program, classic program,
    /// category, name)`. The BTF programs (raw tracepoints: no record is
    /// formatted for them) are preferred; the classic ones are the fallback
    /// on a kernel without BTF. The wakeup tracepoints have no BTF program:
    /// they are attached only with the classic `sched_switch`.
    pub const TRACEPOINTS: [(Option<&str>, &str, &str, &str); 4] = [
        (Some(BTF_SCHED_SWITCH), SCHED_SWITCH, "sched", "sched_switch"),
        (None, SCHED_WAKEUP, "sched", "sched_wakeup"),
        (None, SCHED_WAKEUP_NEW, "sched", "sched_wakeup_new"),
        (
            Some(BTF_SCHED_MIGRATE),
            SCHED_MIGRATE,
            "sched",
            "sched_migrate_task",
        ),
    ];
}

/// Hook indices into [`HITS_MAP`] (and the second half of the hit keys).
pub mod hook {
    /// `subetha_drop_begin`.
    pub const DROP_BEGIN: u32 = 0;
    /// `subetha_drop_end`.
    pub const DROP_END: u32 = 1;
    /// `subetha_scan_begin`.
    pub const SCAN_BEGIN: u32 = 2;
    /// `subetha_scan_end`.
    pub const SCAN_END: u32 = 3;
}

/// Number of hooks (entries of [`HITS_MAP`]).
pub const HOOK_COUNT: u32 = 4;

/// Event kinds ([`EventHeader::kind`]).
pub mod kind {
    /// [`HookEvent`](super::HookEvent): `args = [ring, instance_id, dropped_total]`.
    pub const DROP_BEGIN: u32 = 1;
    /// [`HookEvent`](super::HookEvent): `args = [ring, dropped_in_episode, 0]`.
    pub const DROP_END: u32 = 2;
    /// [`HookEvent`](super::HookEvent): `args = [segment, scan_seq, 0]`.
    pub const SCAN_BEGIN: u32 = 3;
    /// [`HookEvent`](super::HookEvent): `args = [segment, scan_seq, drained]`.
    pub const SCAN_END: u32 = 4;
    /// [`OffCpuEvent`](super::OffCpuEvent).
    pub const OFF_CPU: u32 = 5;
    /// [`MigrateEvent`](super::MigrateEvent).
    pub const MIGRATE: u32 = 6;

    /// The event kind a hook emits.
    pub const fn of_hook(hook: u32) -> u32 {
        hook + 1
    }
}

/// Bits of [`OffCpuEvent::flags`].
pub mod off_cpu_flag {
    /// The kernel reported no `sched_switch` for the switch-in: the event
    /// was made at the thread's next switch-out, `in_ts` is when the
    /// scheduler says the thread got the CPU (`sched_info.last_arrival`,
    /// BTF programs) or the last switch seen on that CPU before (classic
    /// programs, an early bound), and the holder is the longest stretch
    /// seen on the CPU (0 when none was). Some kernels leave out the
    /// tracepoint for switches away from some tasks (seen on a Firecracker
    /// guest for threads of its init process).
    pub const SWITCH_IN_UNSEEN: u32 = 1;
}

/// Roles of watched threads ([`WatchedTask::role`]).
pub mod role {
    /// A consumer's scan thread.
    pub const SCANNER: u32 = 1;
    /// An instrumented producer thread.
    pub const PRODUCER: u32 = 2;
}

/// `flags` for `bpf_ringbuf_output`: do not wake a poller; user space drains
/// the ring buffer on a timer.
pub const BPF_RB_NO_WAKEUP: u64 = 1;

/// Length of a kernel task name (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;

/// The common start of every event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct EventHeader {
    /// One of [`kind`].
    pub kind: u32,
    /// CPU the event was recorded on.
    pub cpu: u32,
    /// Process (tgid) of the thread the event is about (0 when unknown).
    pub pid: u32,
    /// Thread (kernel pid) the event is about.
    pub tid: u32,
    /// `bpf_ktime_get_ns()` when recorded.
    pub ts_ns: u64,
}

/// A hook fired. `header.pid`/`tid` are the calling thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct HookEvent {
    /// `kind` is `DROP_BEGIN`..=`SCAN_END`.
    pub header: EventHeader,
    /// The hook's arguments, in order, zero-extended to 64 bits; unused
    /// trailing arguments are 0.
    pub args: [u64; 3],
}

/// A watched thread got back on a CPU after being off it.
///
/// `header.ts_ns` is when the event was made, `header.cpu` the CPU it got
/// back on, `header.tid` the thread and `header.pid` its process (recorded
/// at switch-out). Normally the event is made at the switch-in and `in_ts
/// == ts_ns`; when the kernel reported no `sched_switch` for the switch-in
/// (see [`off_cpu_flag::SWITCH_IN_UNSEEN`]) it is made at the thread's
/// next switch-out and `in_ts` is reconstructed. Runqueue wait is `in_ts -
/// out_ts` when `out_state == 0` (preempted while runnable) and `in_ts -
/// wakeup_ts` otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct OffCpuEvent {
    /// `kind` is `OFF_CPU`.
    pub header: EventHeader,
    /// When it was switched out.
    pub out_ts: u64,
    /// When it was switched back in (see the type's docs).
    pub in_ts: u64,
    /// When it was woken (0 if it never slept: preempted while runnable).
    pub wakeup_ts: u64,
    /// `prev_state` at switch-out masked to the task state bits: 0 when it
    /// was still runnable (preempted or yielded), else the sleep state
    /// (`1` S, `2` D, `0x80` I, ...).
    pub out_state: u64,
    /// CPU it was switched out of.
    pub cpu_out: u32,
    /// Its role ([`role`]).
    pub role: u32,
    /// The task that held the CPU longest while it was away (see
    /// [`CpuRun`]); the `prev` of the switch-in when no stretch is known.
    pub holder_pid: u32,
    /// The task that replaced it at switch-out (`next` of the switch-out).
    pub replaced_by_pid: u32,
    /// [`off_cpu_flag`] bits.
    pub flags: u32,
    /// Reserved (0).
    pub _reserved: u32,
    /// `holder_pid`'s task name, NUL-padded.
    pub holder_comm: [u8; COMM_LEN],
    /// `replaced_by_pid`'s task name, NUL-padded.
    pub replaced_by_comm: [u8; COMM_LEN],
}

/// A watched thread was moved to another CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct MigrateEvent {
    /// `kind` is `MIGRATE`; `header.tid` the migrated thread, `header.pid`
    /// its process when known (0 otherwise), `header.cpu` where the
    /// migration was decided.
    pub header: EventHeader,
    /// CPU it was on.
    pub orig_cpu: u32,
    /// CPU it goes to.
    pub dest_cpu: u32,
}

/// Scheduler state of a watched thread that is off CPU (part of
/// [`WatchedTask`]), recorded at switch-out and completed by a wakeup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct TaskState {
    /// Switch-out time (0: not off CPU).
    pub out_ts: u64,
    /// Wakeup time (0: not woken yet / never slept).
    pub wakeup_ts: u64,
    /// Masked `prev_state` at switch-out.
    pub out_state: u64,
    /// Its process (tgid).
    pub pid: u32,
    /// CPU it left.
    pub cpu_out: u32,
    /// The task that replaced it.
    pub replaced_by_pid: u32,
    /// Reserved (0).
    pub _reserved: u32,
    /// That task's name.
    pub replaced_by_comm: [u8; COMM_LEN],
    /// Its `sched_info.run_delay` at switch-out (BTF programs): the
    /// runqueue wait it accumulates while away (a migration settles part of
    /// it early) is what this grows by, plus the wait still open at
    /// switch-in.
    pub run_delay_out: u64,
}

/// A watched thread (a slot of [`WATCHED_MAP`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct WatchedTask {
    /// The thread (0: a free slot).
    pub tid: u32,
    /// Its role ([`role`]).
    pub role: u32,
    /// Its process (0 when unknown).
    pub pid: u32,
    /// Reserved (0).
    pub _reserved: u32,
    /// Its off-CPU state (zero when user space (re)watches it).
    pub state: TaskState,
}

/// Which off-CPU intervals become events (value of [`OFF_CPU_FILTER_MAP`]).
/// All zero (the default) emits every interval. Otherwise an interval is
/// emitted when any of the three says so; the rest are counted in
/// [`OFF_CPU_FILTERED_MAP`] and dropped in the kernel, so a watched thread
/// that switches thousands of times a second costs a map update per
/// switch, not an event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct OffCpuFilter {
    /// 1 to filter; 0 emits every interval.
    pub enabled: u32,
    /// 1 to emit every interval that ends on another CPU than it began.
    pub cpu_change: u32,
    /// Emit when the runqueue wait (runnable, not running) is at least this.
    pub min_wait_ns: u64,
    /// Emit when the time asleep is more than this.
    pub min_sleep_ns: u64,
    /// 1 to follow producers' off-CPU intervals too; 0 follows only
    /// scanners (a producer's CPU is then known from its migrations and its
    /// drop hooks, and its switches cost no more than an unwatched
    /// thread's).
    pub producers: u32,
    /// Reserved (0).
    pub _reserved: u32,
}

/// Name of the count of off-CPU intervals the filter kept out of the ring
/// buffer (`PERCPU_ARRAY<u64>`, one entry).
pub const OFF_CPU_FILTERED_MAP: &str = "OFF_CPU_FILTERED";

/// What one CPU has been running (value of the per-CPU `CPU_RUN` map): when
/// the current task got the CPU, and the longest stretch any task held it
/// since a watched thread last left this CPU. At a watched thread's
/// switch-in that stretch names who kept it off the CPU, which the `prev` of
/// the switch (whoever ran last, often a short kworker) does not.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct CpuRun {
    /// When the current task was switched in, on this CPU's run clock: the
    /// runqueue's task clock read from the tasks (BTF programs; no clock
    /// read of their own on the hot path) or `bpf_ktime_get_ns` (classic
    /// programs). Only differences on one CPU are ever taken.
    pub since: u64,
    /// Length of the longest stretch since the reset, in the same clock.
    pub longest: u64,
    /// Reserved (0).
    pub _reserved0: u64,
    /// The task that ran it.
    pub longest_pid: u32,
    /// Reserved (0).
    pub _reserved: u32,
    /// Its name.
    pub longest_comm: [u8; COMM_LEN],
}

/// Where the tracepoint fields are, read by user space from
/// `/sys/kernel/tracing/events/sched/<event>/format` (value of
/// [`SCHED_CONFIG_MAP`]). Offsets are from the start of the tracepoint
/// record; sizes are in bytes.
///
/// The programs do nothing until `enabled` is 1, so a missing or partial
/// configuration never yields wrong events.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SchedConfig {
    /// 1 when every offset below is valid.
    pub enabled: u32,
    /// `sched_switch`: `char prev_comm[16]`.
    pub switch_prev_comm: u32,
    /// `sched_switch`: `pid_t prev_pid`.
    pub switch_prev_pid: u32,
    /// `sched_switch`: `long prev_state`.
    pub switch_prev_state: u32,
    /// Size of `prev_state` (4 or 8).
    pub switch_prev_state_size: u32,
    /// `sched_switch`: `char next_comm[16]`.
    pub switch_next_comm: u32,
    /// `sched_switch`: `pid_t next_pid`.
    pub switch_next_pid: u32,
    /// `sched_wakeup` / `sched_wakeup_new`: `pid_t pid`.
    pub wakeup_pid: u32,
    /// `sched_wakeup_new`: `pid_t pid` (same layout as `sched_wakeup` on
    /// every kernel so far, kept separate all the same).
    pub wakeup_new_pid: u32,
    /// `sched_migrate_task`: `pid_t pid`.
    pub migrate_pid: u32,
    /// `sched_migrate_task`: `int orig_cpu`.
    pub migrate_orig_cpu: u32,
    /// `sched_migrate_task`: `int dest_cpu`.
    pub migrate_dest_cpu: u32,
    /// Mask applied to `prev_state` to keep the task state bits (`0xff` on
    /// kernels since 4.14: the preempted marker `TASK_REPORT_MAX`, `0x100`,
    /// is dropped, so a preempted task reads as runnable, 0).
    pub state_mask: u64,
}

const _: () = {
    assert!(size_of::<EventHeader>() == 24);
    assert!(size_of::<HookEvent>() == 48);
    assert!(size_of::<OffCpuEvent>() == 112);
    assert!(size_of::<MigrateEvent>() == 32);
    assert!(size_of::<TaskState>() == 64);
    assert!(size_of::<WatchedTask>() == 80);
    assert!(size_of::<OffCpuFilter>() == 32);
    assert!(size_of::<CpuRun>() == 48);
    assert!(size_of::<SchedConfig>() == 56);
    assert!(align_of::<OffCpuEvent>() == 8);
};
