//! uprobes on the four hook symbols of subetha-core.
//!
//! Each one reads the hook's arguments from the argument registers, counts
//! a hit (globally, per process, per thread) and emits one [`HookEvent`].
//! The hooks fire on episode and scan edges only, so this is cheap.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::uprobe, programs::ProbeContext};
use subetha_probes::{EventHeader, HookEvent, hook, kind};

use super::maps::{HITS, HITS_BY_PID, HITS_BY_TID, bump, bump_keyed, cpu, emit, now_ns};

/// `subetha_drop_begin(ring: usize, instance_id: u32, dropped_total: u64)`.
#[uprobe]
pub fn up_drop_begin(ctx: ProbeContext) -> u32 {
    let ring: u64 = ctx.arg(0).unwrap_or(0);
    let instance_id: u32 = ctx.arg(1).unwrap_or(0);
    let dropped_total: u64 = ctx.arg(2).unwrap_or(0);
    on_hook(
        &ctx,
        hook::DROP_BEGIN,
        [ring, u64::from(instance_id), dropped_total],
    );
    0
}

/// `subetha_drop_end(ring: usize, dropped_in_episode: u64)`.
#[uprobe]
pub fn up_drop_end(ctx: ProbeContext) -> u32 {
    let ring: u64 = ctx.arg(0).unwrap_or(0);
    let dropped_in_episode: u64 = ctx.arg(1).unwrap_or(0);
    on_hook(&ctx, hook::DROP_END, [ring, dropped_in_episode, 0]);
    0
}

/// `subetha_scan_begin(segment: usize, scan_seq: u64)`.
#[uprobe]
pub fn up_scan_begin(ctx: ProbeContext) -> u32 {
    let segment: u64 = ctx.arg(0).unwrap_or(0);
    let scan_seq: u64 = ctx.arg(1).unwrap_or(0);
    on_hook(&ctx, hook::SCAN_BEGIN, [segment, scan_seq, 0]);
    0
}

/// `subetha_scan_end(segment: usize, scan_seq: u64, drained: u64)`.
#[uprobe]
pub fn up_scan_end(ctx: ProbeContext) -> u32 {
    let segment: u64 = ctx.arg(0).unwrap_or(0);
    let scan_seq: u64 = ctx.arg(1).unwrap_or(0);
    let drained: u64 = ctx.arg(2).unwrap_or(0);
    on_hook(&ctx, hook::SCAN_END, [segment, scan_seq, drained]);
    0
}

#[inline(always)]
fn on_hook(ctx: &ProbeContext, hook: u32, args: [u64; 3]) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    bump(&HITS, hook);
    bump_keyed(&HITS_BY_PID, [pid, hook]);
    bump_keyed(&HITS_BY_TID, [tid, hook]);
    let event = HookEvent {
        header: EventHeader {
            kind: kind::of_hook(hook),
            cpu: cpu(),
            pid,
            tid,
            ts_ns: now_ns(),
        },
        args,
    };
    emit(ctx, &event);
}
