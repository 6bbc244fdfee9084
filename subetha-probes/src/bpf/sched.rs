//! Scheduler tracepoints: off-CPU intervals and migrations of watched
//! threads, with their reason.
//!
//! Two sets of front ends feed the same logic:
//!
//! * BTF tracepoints (`tp_btf`, preferred) on `sched_switch` and
//!   `sched_migrate_task`: raw tracepoints, so the kernel formats no record
//!   for them. They get the `task_struct` pointers and read `pid`, `comm`,
//!   `cpu`, `se.exec_start` and `sched_info` directly, at offsets user space
//!   found in the kernel's BTF and set as read-only globals (constants to
//!   the verifier). A woken thread's runqueue wait is read from its
//!   `sched_info` when it gets the CPU back, so no wakeup tracepoint runs;
//! * classic tracepoints (the fallback on kernels without BTF) on those two
//!   and on `sched_wakeup`/`sched_wakeup_new`: the kernel fills each
//!   tracepoint record, whose field offsets user space read from tracefs
//!   into [`SchedConfig`], the fields are read with `bpf_probe_read_kernel`,
//!   and the wakeup programs record when a sleeping watched thread is woken.
//!
//! For a watched thread the programs keep one [`TaskState`] in its
//! [`WatchedTask`] slot:
//!
//! 1. `sched_switch` with the thread as `prev` (switch-out) records the
//!    time, the CPU, the reported state (0: still runnable, i.e. preempted),
//!    the `next` task that replaced it and (BTF) its accumulated runqueue
//!    wait;
//! 2. (classic only) `sched_wakeup` of the thread, if it went to sleep,
//!    records the wakeup;
//! 3. `sched_switch` with the thread as `next` (switch-in) closes the
//!    interval: one [`OffCpuEvent`] with all of the above plus the task that
//!    held the CPU longest while it was away (from [`CpuRun`], see below; the
//!    `prev` of the switch when no longer stretch is known), unless the
//!    [`OffCpuFilter`] user space set says the interval is unremarkable.
//!
//! Not every switch has its tracepoint: on the Firecracker guests this
//! project runs on, no trace of ours (BPF or ftrace) ever showed a switch
//! away from a thread of the guest's init process, so a watched thread that
//! takes the CPU from one comes back unseen. Its next switch-out finds it
//! still marked off CPU and closes the interval first, flagged
//! [`SWITCH_IN_UNSEEN`](subetha_probes::off_cpu_flag::SWITCH_IN_UNSEEN):
//! the BTF programs read the switch-in time back from
//! `sched_info.last_arrival` and the runqueue wait from
//! `sched_info.run_delay`; the classic ones take the last switch seen on
//! the CPU as the switch-in (no later than the real one). Without this the
//! new switch-out would overwrite the interval: a 50 ms preemption of the
//! scanner once went unreported that way.
//!
//! Every `sched_switch` also updates this CPU's [`CpuRun`]: the stretch the
//! outgoing task ran is compared with the longest one recorded since a
//! watched thread last left the CPU (a few loads and stores; the outgoing
//! task's name is read only when its stretch becomes the longest).
//!
//! What runs for a thread nobody watches is kept to a minimum: one inlined
//! array load per task to find it is not watched, and (BTF) no clock read
//! and no wakeup program at all.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use subetha_probes::{
    COMM_LEN, CpuRun, EventHeader, MigrateEvent, OffCpuEvent, OffCpuFilter, SchedConfig, TaskState,
    WatchedTask, kind, off_cpu_flag, role,
};

use super::maps::{
    CPU_RUN, OFF_CPU_FILTER, OFF_CPU_FILTERED, SCHED_CONFIG, bump, cpu, emit, now_ns, watched,
};

// ------------------------------------------------------------ BTF tracepoints

/// Offset of `task_struct.pid`, set by user space before loading. The
/// default is out of range on purpose: unset, the verifier rejects the
/// program instead of letting it read the wrong field.
#[unsafe(no_mangle)]
static SUBETHA_TASK_PID_OFFSET: u32 = u32::MAX;
/// Offset of `task_struct.comm` (see [`SUBETHA_TASK_PID_OFFSET`]).
#[unsafe(no_mangle)]
static SUBETHA_TASK_COMM_OFFSET: u32 = u32::MAX;
/// Offset of `task_struct.cpu` (see [`SUBETHA_TASK_PID_OFFSET`]).
#[unsafe(no_mangle)]
static SUBETHA_TASK_CPU_OFFSET: u32 = u32::MAX;
/// Offset of `task_struct.se.exec_start` (see [`SUBETHA_TASK_PID_OFFSET`]).
#[unsafe(no_mangle)]
static SUBETHA_TASK_EXEC_START_OFFSET: u32 = u32::MAX;
/// Offset of `task_struct.sched_info.run_delay` (see
/// [`SUBETHA_TASK_PID_OFFSET`]).
#[unsafe(no_mangle)]
static SUBETHA_TASK_RUN_DELAY_OFFSET: u32 = u32::MAX;
/// Offset of `task_struct.sched_info.last_queued`.
#[unsafe(no_mangle)]
static SUBETHA_TASK_LAST_QUEUED_OFFSET: u32 = u32::MAX;
/// Offset of `task_struct.sched_info.last_arrival`.
#[unsafe(no_mangle)]
static SUBETHA_TASK_LAST_ARRIVAL_OFFSET: u32 = u32::MAX;
/// Offset of `task_struct.se.cfs_rq`.
#[unsafe(no_mangle)]
static SUBETHA_TASK_CFS_RQ_OFFSET: u32 = u32::MAX;
/// Offset of `cfs_rq.rq`.
#[unsafe(no_mangle)]
static SUBETHA_CFS_RQ_RQ_OFFSET: u32 = u32::MAX;
/// Offset of `rq.clock`.
#[unsafe(no_mangle)]
static SUBETHA_RQ_CLOCK_OFFSET: u32 = u32::MAX;

/// A `u32` field of a task, read directly through the BTF-typed pointer.
#[inline(always)]
fn task_u32(task: *const u8, offset: &'static u32) -> u32 {
    // SAFETY: `offset` is a read-only global; a volatile read keeps the
    // compiler from folding its placeholder value.
    let offset = unsafe { core::ptr::read_volatile(offset) };
    // SAFETY: `task` is a `task_struct` argument of a BTF tracepoint and
    // `offset` the offset of a 4-byte field in it (from the kernel's BTF).
    // The verifier checks the access against the BTF and the JIT makes it a
    // fault-tolerant load.
    unsafe { core::ptr::read(task.add(offset as usize).cast::<u32>()) }
}

/// A `u64` field of a kernel object, read directly through its BTF-typed
/// pointer (see `task_u32`).
#[inline(always)]
fn field_u64(object: *const u8, offset: &'static u32) -> u64 {
    // SAFETY: as in `task_u32`.
    let offset = unsafe { core::ptr::read_volatile(offset) };
    // SAFETY: as in `task_u32`, for an 8-byte field.
    unsafe { core::ptr::read(object.add(offset as usize).cast::<u64>()) }
}

/// A pointer field of a kernel object: the verifier types the result from
/// the BTF, so it can be followed the same way (a null or stale pointer
/// makes the fault-tolerant load read 0).
#[inline(always)]
fn field_ptr(object: *const u8, offset: &'static u32) -> *const u8 {
    // SAFETY: as in `task_u32`.
    let offset = unsafe { core::ptr::read_volatile(offset) };
    // SAFETY: as in `task_u32`, for a pointer field.
    unsafe { core::ptr::read(object.add(offset as usize).cast::<*const u8>()) }
}

/// How long `next`, about to run, waited on runqueues since it left a CPU
/// with `run_delay_out` in its `sched_info.run_delay`: what the kernel has
/// settled since (a migration settles the part on the old CPU) plus the
/// wait still open, from `sched_info.last_queued` to its runqueue's clock
/// now. `sched_info` is what `/proc/<tid>/schedstat` reports; reading it
/// here is what makes `sched_wakeup` tracepoints unnecessary.
#[inline(always)]
fn runqueue_wait(next: *const u8, run_delay_out: u64) -> u64 {
    let settled = field_u64(next, &SUBETHA_TASK_RUN_DELAY_OFFSET).saturating_sub(run_delay_out);
    let queued = field_u64(next, &SUBETHA_TASK_LAST_QUEUED_OFFSET);
    if queued == 0 {
        return settled;
    }
    settled.saturating_add(runqueue_clock(next).saturating_sub(queued))
}

/// The clock of `task`'s runqueue (the one `sched_info` is kept in), as
/// `__schedule` last updated it.
#[inline(always)]
fn runqueue_clock(task: *const u8) -> u64 {
    let cfs_rq = field_ptr(task, &SUBETHA_TASK_CFS_RQ_OFFSET);
    let rq = field_ptr(cfs_rq, &SUBETHA_CFS_RQ_RQ_OFFSET);
    field_u64(rq, &SUBETHA_RQ_CLOCK_OFFSET)
}

/// How long ago (ns) `prev`, about to leave its CPU, got it: its
/// `sched_info.last_arrival` against its runqueue's clock, which
/// `__schedule` updated just before this tracepoint (`sched_info` moves on
/// only after it). `None` when the kernel keeps no arrival.
#[inline(always)]
fn running_for(prev: *const u8) -> Option<u64> {
    let arrival = field_u64(prev, &SUBETHA_TASK_LAST_ARRIVAL_OFFSET);
    let clock = runqueue_clock(prev);
    (arrival != 0 && clock >= arrival).then(|| clock - arrival)
}

/// A task's `comm`, as two direct 8-byte loads (cheaper than a helper
/// call; the verifier allows loads anywhere inside the `char[16]` member).
#[inline(always)]
fn task_comm(task: *const u8) -> [u8; COMM_LEN] {
    // SAFETY: as in `task_u32`.
    let offset = unsafe { core::ptr::read_volatile(&SUBETHA_TASK_COMM_OFFSET) };
    // SAFETY: as in `task_u32`, for the two halves of `comm`.
    let (low, high) = unsafe {
        let comm = task.add(offset as usize);
        (
            core::ptr::read_unaligned(comm.cast::<u64>()),
            core::ptr::read_unaligned(comm.add(8).cast::<u64>()),
        )
    };
    let mut out = [0; COMM_LEN];
    out[..8].copy_from_slice(&low.to_ne_bytes());
    out[8..].copy_from_slice(&high.to_ne_bytes());
    out
}

/// The running task's `comm` (at `sched_switch`, `prev`'s).
#[inline(always)]
fn current_comm() -> [u8; COMM_LEN] {
    bpf_get_current_comm().unwrap_or([0; COMM_LEN])
}

/// The state `prev` left in, as the classic tracepoint reports it
/// (`__trace_sched_switch_state`): 0 when preempted, else the bit of its
/// highest task state among `TASK_REPORT`, `0x80` for `TASK_IDLE`, and
/// `TASK_RTLOCK_WAIT` reported as uninterruptible.
#[inline(always)]
fn reported_state(preempt: bool, prev_state: u32) -> u64 {
    const TASK_REPORT: u32 = 0x7f;
    const TASK_IDLE: u32 = 0x402;
    const TASK_RTLOCK_WAIT: u32 = 0x1000;
    if preempt {
        return 0;
    }
    match prev_state {
        TASK_IDLE => 0x80,
        TASK_RTLOCK_WAIT => 2,
        state => {
            let state = state & TASK_REPORT;
            if state == 0 {
                0
            } else {
                1u64 << (31 - state.leading_zeros())
            }
        }
    }
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct
/// *next, unsigned int prev_state)`.
#[btf_tracepoint(function = "sched_switch")]
pub fn bt_sched_switch(ctx: BtfTracePointContext) -> u32 {
    let preempt: u64 = ctx.arg(0);
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    let next_pid = task_u32(next, &SUBETHA_TASK_PID_OFFSET);
    let switch = Switch {
        prev: task_u32(prev, &SUBETHA_TASK_PID_OFFSET),
        next: next_pid,
        out_state: reported_state(preempt & 1 == 1, prev_state as u32),
        // The runqueue's task clock now: `next` was just picked (its
        // exec_start set), except the idle task, which keeps none; then
        // `prev`, which was just accounted. Saves a clock read per switch.
        run_clock: field_u64(
            if next_pid != 0 { next } else { prev },
            &SUBETHA_TASK_EXEC_START_OFFSET,
        ),
    };
    on_switch(
        &ctx,
        &switch,
        Reads {
            prev_comm: current_comm,
            next_comm: || task_comm(next),
            prev_run_delay: || Some(field_u64(prev, &SUBETHA_TASK_RUN_DELAY_OFFSET)),
            prev_running_for: || running_for(prev),
            next_wait: |run_delay_out| Some(runqueue_wait(next, run_delay_out)),
        },
    );
    0
}

/// `sched_migrate_task(struct task_struct *p, int dest_cpu)`: called
/// before the move, so `p`'s CPU is still the original one.
#[btf_tracepoint(function = "sched_migrate_task")]
pub fn bt_migrate_task(ctx: BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    let dest_cpu: u64 = ctx.arg(1);
    let tid = task_u32(task, &SUBETHA_TASK_PID_OFFSET);
    if watched(tid).is_some() {
        migrated(
            &ctx,
            tid,
            task_u32(task, &SUBETHA_TASK_CPU_OFFSET),
            dest_cpu as u32,
        );
    }
    0
}

// ------------------------------------------------------ classic tracepoints

/// `sched/sched_switch`.
#[tracepoint(category = "sched", name = "sched_switch")]
pub fn tp_sched_switch(ctx: TracePointContext) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    let (Some(prev), Some(next)) = (
        read_u32(&ctx, config.switch_prev_pid),
        read_u32(&ctx, config.switch_next_pid),
    ) else {
        return 0;
    };
    let switch = Switch {
        prev,
        next,
        out_state: read_state(&ctx, config),
        run_clock: now_ns(),
    };
    on_switch(
        &ctx,
        &switch,
        Reads {
            prev_comm: || read_comm(&ctx, config.switch_prev_comm),
            next_comm: || read_comm(&ctx, config.switch_next_comm),
            // No task to read: the wakeup tracepoints record wakeups.
            prev_run_delay: || None,
            prev_running_for: || None,
            next_wait: |_| None,
        },
    );
    0
}

/// `sched/sched_wakeup`.
#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn tp_sched_wakeup(ctx: TracePointContext) -> u32 {
    if let Some(config) = config()
        && let Some(tid) = read_u32(&ctx, config.wakeup_pid)
    {
        woken(tid);
    }
    0
}

/// `sched/sched_wakeup_new`: a new task's first wakeup. A thread is watched
/// only once it exists, so this matters only for a tid user space watched
/// ahead of time; handled like `sched_wakeup`.
#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn tp_wakeup_new(ctx: TracePointContext) -> u32 {
    if let Some(config) = config()
        && let Some(tid) = read_u32(&ctx, config.wakeup_new_pid)
    {
        woken(tid);
    }
    0
}

/// `sched/sched_migrate_task`.
#[tracepoint(category = "sched", name = "sched_migrate_task")]
pub fn tp_migrate_task(ctx: TracePointContext) -> u32 {
    let Some(config) = config() else {
        return 0;
    };
    let Some(tid) = read_u32(&ctx, config.migrate_pid) else {
        return 0;
    };
    if watched(tid).is_none() {
        return 0;
    }
    if let (Some(orig_cpu), Some(dest_cpu)) = (
        read_u32(&ctx, config.migrate_orig_cpu),
        read_u32(&ctx, config.migrate_dest_cpu),
    ) {
        migrated(&ctx, tid, orig_cpu, dest_cpu);
    }
    0
}

/// The classic tracepoints' configuration, once user space has filled it in.
#[inline(always)]
fn config() -> Option<&'static SchedConfig> {
    let config = SCHED_CONFIG.get(0)?;
    (config.enabled == 1).then_some(config)
}

#[inline(always)]
fn read_u32(ctx: &TracePointContext, offset: u32) -> Option<u32> {
    // SAFETY: bpf_probe_read_kernel of 4 bytes of the tracepoint record;
    // the helper faults safely (returns an error) on a bad address.
    unsafe { ctx.read_at::<u32>(offset as usize) }.ok()
}

#[inline(always)]
fn read_comm(ctx: &TracePointContext, offset: u32) -> [u8; COMM_LEN] {
    // SAFETY: as in `read_u32`, 16 bytes.
    unsafe { ctx.read_at::<[u8; COMM_LEN]>(offset as usize) }.unwrap_or([0; COMM_LEN])
}

#[inline(always)]
fn read_state(ctx: &TracePointContext, config: &SchedConfig) -> u64 {
    let raw = if config.switch_prev_state_size == 8 {
        // SAFETY: as in `read_u32`, 8 bytes.
        unsafe { ctx.read_at::<u64>(config.switch_prev_state as usize) }.unwrap_or(0)
    } else {
        read_u32(ctx, config.switch_prev_state).map_or(0, u64::from)
    };
    raw & config.state_mask
}

// ------------------------------------------------------------ shared logic

/// Longer than any stretch one task holds a CPU without a switch (an hour):
/// a larger difference of run clocks is a clock that went backwards.
const MAX_STRETCH: u64 = 3_600_000_000_000;

/// What a `sched_switch` says, however it was read.
struct Switch {
    prev: u32,
    next: u32,
    /// `prev`'s reported state: 0 when it left runnable (preempted).
    out_state: u64,
    /// This CPU's run clock (see `CpuRun::since`).
    run_clock: u64,
}

/// How a front end reads what the shared logic may need, only when it
/// needs it: the two tasks' names, `prev`'s accumulated runqueue wait, how
/// long `prev` has held the CPU and, given the accumulated wait from its
/// switch-out, how long `next` waited on runqueues. `None` where the front
/// end cannot know (the classic programs record wakeups instead).
struct Reads<PC, NC, PD, PR, NW> {
    prev_comm: PC,
    next_comm: NC,
    prev_run_delay: PD,
    prev_running_for: PR,
    next_wait: NW,
}

/// One `sched_switch`: the CPU's run stretch, then a watched `prev`
/// leaving and a watched `next` coming back. The names are read only when
/// needed.
#[inline(always)]
fn on_switch<C: EbpfContext, PC, NC, PD, PR, NW>(ctx: &C, switch: &Switch, reads: Reads<PC, NC, PD, PR, NW>)
where
    PC: Fn() -> [u8; COMM_LEN],
    NC: Fn() -> [u8; COMM_LEN],
    PD: Fn() -> Option<u64>,
    PR: Fn() -> Option<u64>,
    NW: Fn(u64) -> Option<u64>,
{
    let Reads {
        prev_comm,
        next_comm,
        prev_run_delay,
        prev_running_for,
        next_wait,
    } = reads;
    let &Switch {
        prev,
        next,
        out_state,
        run_clock,
    } = switch;
    let prev_entry = watched(prev).filter(|&entry| followed(entry));
    let next_entry = watched(next).filter(|&entry| followed(entry));
    // A watched `prev` still off CPU by its state: the kernel reported no
    // switch-in for it (see `off_cpu_flag::SWITCH_IN_UNSEEN`). Since the
    // last switch seen here this CPU ran some unseen task, then `prev`.
    // SAFETY: `entry` comes from `watched` (see there); a u64 read.
    let switch_in_unseen = prev_entry.is_some_and(|entry| unsafe { (*entry).state.out_ts } != 0);
    let run = CPU_RUN.get_ptr_mut(0);
    let mut last_switch = 0;
    if let Some(run) = run {
        // SAFETY: this CPU's value of the single-slot per-CPU array, valid
        // for the program's run; only this CPU writes it, with preemption
        // disabled in the tracepoint.
        unsafe {
            last_switch = (*run).since;
            let ran = run_clock.wrapping_sub(last_switch);
            // A clock that went backwards (the idle task's stale clock, a
            // program switch) gives a huge `ran`: not a stretch. Nor is
            // what ran since an unseen switch-in: two tasks' time.
            if last_switch != 0 && prev != 0 && !switch_in_unseen && ran > (*run).longest && ran < MAX_STRETCH
            {
                (*run).longest = ran;
                (*run).longest_pid = prev;
                (*run).longest_comm = prev_comm();
            }
            (*run).since = run_clock;
        }
    }
    if prev_entry.is_none() && next_entry.is_none() {
        return;
    }
    let now = now_ns();
    if let Some(entry) = prev_entry {
        if switch_in_unseen {
            // When `prev` got the CPU: what the scheduler says or, failing
            // that, no earlier than the last switch seen on this CPU.
            let since_last_switch = run_clock.wrapping_sub(last_switch);
            let in_ts = match prev_running_for() {
                Some(running_for) => now.saturating_sub(running_for),
                None if last_switch != 0 && since_last_switch < MAX_STRETCH => {
                    now.saturating_sub(since_last_switch)
                }
                None => 0,
            };
            let holder = longest_stretch(run, prev).unwrap_or((0, [0; COMM_LEN]));
            let wait = |run_delay_out: u64| prev_run_delay().map(|delay| delay.saturating_sub(run_delay_out));
            let at = Closing {
                tid: prev,
                in_ts,
                now,
                holder,
                flags: off_cpu_flag::SWITCH_IN_UNSEEN,
            };
            switched_in(ctx, entry, &at, &wait);
        }
        let run_delay_out = prev_run_delay().unwrap_or(0);
        switched_out(entry, prev, next, out_state, now, &next_comm, run_delay_out);
        if let Some(run) = run {
            // SAFETY: as above. Start a new window: who holds the CPU from
            // now on is what this thread will want to know.
            unsafe {
                (*run).longest = 0;
                (*run).longest_pid = 0;
            }
        }
    }
    if let Some(entry) = next_entry {
        let at = Closing {
            tid: next,
            in_ts: now,
            now,
            holder: longest_stretch(run, next).unwrap_or_else(|| (prev, prev_comm())),
            flags: 0,
        };
        switched_in(ctx, entry, &at, &next_wait);
    }
}

/// The task that ran the longest stretch on this CPU since the window
/// began, unless none did or it is `tid` itself (its own stretch before it
/// left this CPU, if its departure was not seen here).
#[inline(always)]
fn longest_stretch(run: Option<*mut CpuRun>, tid: u32) -> Option<(u32, [u8; COMM_LEN])> {
    let run = run?;
    // SAFETY: as in `on_switch`.
    let (pid, comm) = unsafe { ((*run).longest_pid, (*run).longest_comm) };
    (pid != 0 && pid != tid).then_some((pid, comm))
}

/// A watched thread leaves the CPU: remember when, why and for whom.
#[inline(always)]
fn switched_out(
    entry: *mut WatchedTask,
    prev: u32,
    next: u32,
    out_state: u64,
    now: u64,
    next_comm: &impl Fn() -> [u8; COMM_LEN],
    run_delay_out: u64,
) {
    // SAFETY: `entry` comes from `watched` (see there).
    let mut pid = unsafe { (*entry).pid };
    if pid == 0 {
        // User space did not know the process; at sched_switch `current`
        // is still `prev`.
        let pid_tgid = bpf_get_current_pid_tgid();
        if pid_tgid as u32 == prev {
            pid = (pid_tgid >> 32) as u32;
        }
    }
    let state = TaskState {
        out_ts: now,
        wakeup_ts: 0,
        out_state,
        pid,
        cpu_out: cpu(),
        replaced_by_pid: next,
        _reserved: 0,
        replaced_by_comm: next_comm(),
        run_delay_out,
    };
    // SAFETY: `entry` comes from `watched` (see there for why this thread's
    // state has no concurrent writer).
    unsafe { (*entry).state = state };
}

/// How an off-CPU interval of `tid` closes: at `in_ts` (0: unknown),
/// noticed at `now`, with `holder` having held the CPU meanwhile.
struct Closing {
    tid: u32,
    in_ts: u64,
    now: u64,
    holder: (u32, [u8; COMM_LEN]),
    flags: u32,
}

/// A watched thread got the CPU back: one event for the whole interval,
/// unless the filter drops it. `wait` says how long it waited on
/// runqueues, given its accumulated wait at switch-out, when the program
/// can read that from the task.
#[inline(always)]
fn switched_in<C: EbpfContext>(
    ctx: &C,
    entry: *mut WatchedTask,
    at: &Closing,
    wait: &impl Fn(u64) -> Option<u64>,
) {
    // SAFETY: as in `switched_out`.
    let (role, mut state) = unsafe { ((*entry).role, (*entry).state) };
    // SAFETY: as above.
    unsafe { (*entry).state.out_ts = 0 };
    if state.out_ts == 0 {
        // Not seen leaving the CPU since it was watched.
        return;
    }
    // Not `clamp`: it may panic, which the verifier refuses.
    let in_ts = at.in_ts.max(state.out_ts).min(at.now);
    // With the task at hand (BTF programs), a sleeper's wakeup is when its
    // runqueue wait began; the classic programs recorded it at the wakeup.
    if state.out_state != 0
        && let Some(wait) = wait(state.run_delay_out)
    {
        state.wakeup_ts = in_ts.saturating_sub(wait).max(state.out_ts);
    }
    let cpu_in = cpu();
    if let Some(filter) = OFF_CPU_FILTER.get(0)
        && filter.enabled == 1
        && !remarkable(filter, &state, in_ts, cpu_in)
    {
        bump(&OFF_CPU_FILTERED, 0);
        return;
    }
    let event = OffCpuEvent {
        header: EventHeader {
            kind: kind::OFF_CPU,
            cpu: cpu_in,
            pid: state.pid,
            tid: at.tid,
            ts_ns: at.now,
        },
        out_ts: state.out_ts,
        in_ts,
        wakeup_ts: state.wakeup_ts,
        out_state: state.out_state,
        cpu_out: state.cpu_out,
        role,
        holder_pid: at.holder.0,
        replaced_by_pid: state.replaced_by_pid,
        flags: at.flags,
        _reserved: 0,
        holder_comm: at.holder.1,
        replaced_by_comm: state.replaced_by_comm,
    };
    emit(ctx, &event);
}

/// Whether a watched thread's off-CPU intervals are followed: a scanner's
/// always, a producer's unless the filter leaves producers out.
#[inline(always)]
fn followed(entry: *mut WatchedTask) -> bool {
    // SAFETY: `entry` comes from `watched` (see there); a u32 read.
    if unsafe { (*entry).role } != role::PRODUCER {
        return true;
    }
    OFF_CPU_FILTER
        .get(0)
        .is_none_or(|filter| filter.enabled != 1 || filter.producers == 1)
}

/// Whether an interval passes the filter: the same runqueue-wait and
/// asleep split as user space's `OffCpuInterval`.
#[inline(always)]
fn remarkable(filter: &OffCpuFilter, state: &TaskState, in_ts: u64, cpu_in: u32) -> bool {
    let runnable_since = if state.out_state == 0 {
        state.out_ts
    } else if state.wakeup_ts == 0 {
        in_ts
    } else {
        // Not `clamp`: it may panic, which the verifier refuses.
        state.wakeup_ts.max(state.out_ts).min(in_ts)
    };
    in_ts.saturating_sub(runnable_since) >= filter.min_wait_ns
        || runnable_since.saturating_sub(state.out_ts) > filter.min_sleep_ns
        || (filter.cpu_change == 1 && cpu_in != state.cpu_out)
}

/// A watched thread that went to sleep is woken: runqueue wait starts.
#[inline(always)]
fn woken(tid: u32) {
    let Some(entry) = watched(tid).filter(|&entry| followed(entry)) else {
        return;
    };
    // SAFETY: as in `switched_out`.
    unsafe {
        // Only a thread that is off CPU because it slept gets a wakeup time
        // (a preempted thread that had set a sleep state can be "woken"
        // while it waits on the runqueue; it never slept).
        let state = &mut (*entry).state;
        if state.out_ts != 0 && state.out_state != 0 && state.wakeup_ts == 0 {
            state.wakeup_ts = now_ns();
        }
    }
}

/// A watched thread moves from `orig_cpu` to `dest_cpu`.
#[inline(always)]
fn migrated<C: EbpfContext>(ctx: &C, tid: u32, orig_cpu: u32, dest_cpu: u32) {
    let event = MigrateEvent {
        header: EventHeader {
            kind: kind::MIGRATE,
            cpu: cpu(),
            // The migrating task is usually not the current one; user space
            // knows the process of every thread it watches.
            pid: 0,
            tid,
            ts_ns: now_ns(),
        },
        orig_cpu,
        dest_cpu,
    };
    emit(ctx, &event);
}
