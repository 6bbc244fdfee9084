//! Stable attach points for uprobes: the edges of drop episodes and scans.
//!
//! Each hook is `#[no_mangle] #[inline(never)] extern "C"`, so its symbol is
//! in every binary that uses it — the drop hooks wherever rings are pushed
//! into, the scan hooks wherever a consumer drains (every application that
//! registers an instance links both through its sidecar) — and a uprobe can
//! be attached to it by name. With no probe attached a call costs a few cycles, and hooks
//! are called on *edges* only — once per drop episode or per scan, never
//! once per drop or per observation.
//!
//! The bodies are deliberately trivial. An empty body is not enough: LLVM
//! may delete calls to functions it proves have no effect, and its function
//! merging may fold identical bodies into one address, so that a probe on
//! one hook would fire for all four. Each body is therefore an empty inline
//! `asm!` block with a distinct comment: opaque to the optimiser, distinct in
//! the IR, and compiled to a bare `ret` (never a LOCK-prefixed instruction,
//! which uprobes cannot single-step on x86). The arguments sit in the ABI
//! argument registers at the probe point, where an eBPF program reads them.

/// A ring started dropping: the first full-ring drop after a successful push.
///
/// `ring` is the ring's address in the producer's address space,
/// `instance_id` the instance whose observation was dropped, and
/// `dropped_total` the ring's drop counter including this drop.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn subetha_drop_begin(ring: usize, instance_id: u32, dropped_total: u64) {
    // SAFETY: an empty asm block: it reads its register inputs, touches no
    // memory and no stack, and preserves flags.
    unsafe {
        core::arch::asm!(
            "/* subetha_drop_begin {0} {1} {2} */",
            in(reg) ring,
            in(reg) u64::from(instance_id),
            in(reg) dropped_total,
            options(nomem, nostack, preserves_flags)
        )
    }
}

/// A ring stopped dropping: the first successful push after drops (or the
/// owning thread exited during an episode). `dropped_in_episode` is how many
/// observations the episode lost.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn subetha_drop_end(ring: usize, dropped_in_episode: u64) {
    // SAFETY: an empty asm block, as in `subetha_drop_begin`.
    unsafe {
        core::arch::asm!(
            "/* subetha_drop_end {0} {1} */",
            in(reg) ring,
            in(reg) dropped_in_episode,
            options(nomem, nostack, preserves_flags)
        )
    }
}

/// A consumer's scan of a segment reached its first ring with work (scans
/// that find every ring idle call neither scan hook). `segment` is the
/// segment's address in the consumer's address space, `scan_seq` the
/// consumer's scan counter.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn subetha_scan_begin(segment: usize, scan_seq: u64) {
    // SAFETY: an empty asm block, as in `subetha_drop_begin`.
    unsafe {
        core::arch::asm!(
            "/* subetha_scan_begin {0} {1} */",
            in(reg) segment,
            in(reg) scan_seq,
            options(nomem, nostack, preserves_flags)
        )
    }
}

/// A consumer finished a scan; `drained` observations were moved into stats.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn subetha_scan_end(segment: usize, scan_seq: u64, drained: u64) {
    // SAFETY: an empty asm block, as in `subetha_drop_begin`.
    unsafe {
        core::arch::asm!(
            "/* subetha_scan_end {0} {1} {2} */",
            in(reg) segment,
            in(reg) scan_seq,
            in(reg) drained,
            options(nomem, nostack, preserves_flags)
        )
    }
}

/// The hook symbol names, for probes and for checking a binary exports them.
pub const HOOK_SYMBOLS: [&str; 4] = [
    "subetha_drop_begin",
    "subetha_drop_end",
    "subetha_scan_begin",
    "subetha_scan_end",
];
