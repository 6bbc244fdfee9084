//! Scheduler tracepoints: off-CPU intervals and migrations of watched
//! threads, with their reason.
//!
//! For a watched thread the programs keep one [`TaskState`] in `TASKS`:
//!
//! 1. `sched_switch` with the thread as `prev` (switch-out) records the
//!    time, the CPU, the masked `prev_state` (0: still runnable, i.e.
//!    preempted) and the `next` task that replaced it;
//! 2. `sched_wakeup` of the thread, if it went to sleep, records the wakeup;
//! 3. `sched_switch` with the thread as `next` (switch-in) emits one
//!    [`OffCpuEvent`] with all of the above plus the task that held the CPU
//!    longest while it was away (from [`CpuRun`], see below; the `prev` of
//!    the switch when no longer stretch is known), and clears the state.
//!
//! Every `sched_switch` also updates this CPU's [`CpuRun`]: the stretch the
//! outgoing task ran is compared with the longest one recorded since a
//! watched thread last left the CPU (a few loads and stores; the outgoing
//! task's name is read only when its stretch becomes the longest).
//!
//! Field offsets come from [`SchedConfig`] (user space reads them from
//! tracefs), and the record is read with `bpf_probe_read_kernel`, so nothing
//! depends on a hard-coded layout. Nothing is logged on these hot paths
//! except a failed state insert, which cannot happen with an LRU map short
//! of memory exhaustion.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};
use aya_log_ebpf::error;
use subetha_probes::{COMM_LEN, EventHeader, MigrateEvent, OffCpuEvent, SchedConfig, TaskState, kind};

use super::maps::{CPU_RUN, SCHED_CONFIG, TASKS, cpu, emit, now_ns, watched_role};

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
    let now = now_ns();
    let run = CPU_RUN.get_ptr_mut(0);
    if let Some(run) = run {
        // SAFETY: this CPU's value of the single-slot per-CPU array, valid
        // for the program's run; only this CPU writes it, with preemption
        // disabled in the tracepoint.
        unsafe {
            let ran = now.saturating_sub((*run).since_ns);
            let longest = (*run).longest_end_ns.saturating_sub((*run).longest_begin_ns);
            if (*run).since_ns != 0 && prev != 0 && ran > longest {
                (*run).longest_begin_ns = (*run).since_ns;
                (*run).longest_end_ns = now;
                (*run).longest_pid = prev;
                (*run).longest_comm = read_comm(&ctx, config.switch_prev_comm);
            }
            (*run).since_ns = now;
        }
    }
    if watched_role(prev).is_some() {
        switched_out(&ctx, config, prev, next);
        if let Some(run) = run {
            // SAFETY: as above. Start a new window: who holds the CPU from
            // now on is what this thread will want to know.
            unsafe {
                (*run).longest_begin_ns = 0;
                (*run).longest_end_ns = 0;
                (*run).longest_pid = 0;
            }
        }
    }
    if let Some(role) = watched_role(next) {
        let holder = run.and_then(|run| {
            // SAFETY: as above.
            let run = unsafe { *run };
            // Never name the thread itself (its own stretch before it left
            // this CPU, if its departure was not seen here).
            (run.longest_pid != 0 && run.longest_pid != next).then_some((run.longest_pid, run.longest_comm))
        });
        switched_in(&ctx, config, next, role, prev, holder);
    }
    0
}

/// `sched/sched_wakeup`.
#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn tp_sched_wakeup(ctx: TracePointContext) -> u32 {
    if let Some(config) = config() {
        woken(&ctx, config.wakeup_pid);
    }
    0
}

/// `sched/sched_wakeup_new`: a new task's first wakeup. A thread is watched
/// only once it exists, so this matters only for a tid user space watched
/// ahead of time; handled like `sched_wakeup`.
#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn tp_wakeup_new(ctx: TracePointContext) -> u32 {
    if let Some(config) = config() {
        woken(&ctx, config.wakeup_new_pid);
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
    if watched_role(tid).is_none() {
        return 0;
    }
    let (Some(orig_cpu), Some(dest_cpu)) = (
        read_u32(&ctx, config.migrate_orig_cpu),
        read_u32(&ctx, config.migrate_dest_cpu),
    ) else {
        return 0;
    };
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
    emit(&event);
    0
}

/// The configuration, once user space has filled it in.
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

/// A watched `prev` leaves the CPU: remember when, why and for whom.
#[inline(always)]
fn switched_out(ctx: &TracePointContext, config: &SchedConfig, prev: u32, next: u32) {
    // At sched_switch `current` is still `prev`.
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = if pid_tgid as u32 == prev {
        (pid_tgid >> 32) as u32
    } else {
        0
    };
    let state = TaskState {
        out_ts: now_ns(),
        wakeup_ts: 0,
        out_state: read_state(ctx, config),
        pid,
        cpu_out: cpu(),
        replaced_by_pid: next,
        _reserved: 0,
        replaced_by_comm: read_comm(ctx, config.switch_next_comm),
    };
    if let Err(code) = TASKS.insert(prev, state, 0) {
        error!(ctx, "subetha: TASKS insert for tid {} failed: {}", prev, code);
    }
}

/// A watched `next` gets the CPU back: one event for the whole interval.
#[inline(always)]
fn switched_in(
    ctx: &TracePointContext,
    config: &SchedConfig,
    next: u32,
    role: u32,
    prev: u32,
    longest: Option<(u32, [u8; COMM_LEN])>,
) {
    let Some(state) = TASKS.get_ptr_mut(next) else {
        // Not seen leaving the CPU since it was watched.
        return;
    };
    // SAFETY: a pointer to a live LRU element's value, valid for this run.
    // Only sched_switch/sched_wakeup of this tid write it, and those are
    // serialised by the scheduler for one task (the runqueue lock of the
    // CPU it is on or is being woken to).
    let TaskState {
        out_ts,
        wakeup_ts,
        out_state,
        pid,
        cpu_out,
        replaced_by_pid,
        _reserved: _,
        replaced_by_comm,
    } = unsafe { *state };
    // SAFETY: as above.
    unsafe { (*state).out_ts = 0 };
    if out_ts == 0 {
        return;
    }
    // The longest stretch since a watched thread left this CPU; if this
    // thread left another CPU (migrated), the window may be shorter than its
    // absence, but the stretch still fell while it was away.
    let (holder_pid, holder_comm) = match longest {
        Some(holder) => holder,
        None => (prev, read_comm(ctx, config.switch_prev_comm)),
    };
    let event = OffCpuEvent {
        header: EventHeader {
            kind: kind::OFF_CPU,
            cpu: cpu(),
            pid,
            tid: next,
            ts_ns: now_ns(),
        },
        out_ts,
        wakeup_ts,
        out_state,
        cpu_out,
        role,
        holder_pid,
        replaced_by_pid,
        holder_comm,
        replaced_by_comm,
    };
    emit(&event);
}

/// A watched thread that went to sleep is woken: runqueue wait starts.
#[inline(always)]
fn woken(ctx: &TracePointContext, pid_offset: u32) {
    let Some(tid) = read_u32(ctx, pid_offset) else {
        return;
    };
    if watched_role(tid).is_none() {
        return;
    }
    let Some(state) = TASKS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: see `switched_in`.
    unsafe {
        // Only a thread that is off CPU because it slept gets a wakeup time
        // (a preempted thread that had set a sleep state can be "woken"
        // while it waits on the runqueue; it never slept).
        if (*state).out_ts != 0 && (*state).out_state != 0 && (*state).wakeup_ts == 0 {
            (*state).wakeup_ts = now_ns();
        }
    }
}
