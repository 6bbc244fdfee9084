//! Stable attach points for uprobes: the edges of drop episodes and scans.
//!
//! Each hook is a `#[no_mangle] extern "C"` naked function (never inlined),
//! so its symbol is in every binary that uses it — the drop hooks wherever rings are pushed
//! into, the scan hooks wherever a consumer drains (every application that
//! registers an instance links both through its sidecar) — and a uprobe can
//! be attached to it by name. With no probe attached a call costs a few cycles, and hooks
//! are called on *edges* only — once per drop episode or per scan, never
//! once per drop or per observation.
//!
//! The bodies are deliberately trivial. An empty body is not enough: LLVM
//! may delete calls to functions it proves have no effect, and its function
//! merging may fold identical bodies into one address, so that a probe on
//! one hook would fire for all four; and an ordinary function may spill its
//! arguments before its body (debug builds do). Each hook is therefore a
//! naked function whose whole body is a `naked_asm!` block with a distinct
//! comment: opaque to the optimiser, distinct in the IR, and exactly a
//! 5-byte NOP and `ret` on x86_64 in every profile (a bare `ret` elsewhere;
//! never a LOCK-prefixed instruction, which uprobes cannot single-step on
//! x86). The NOP sits at the symbol address, where the probes
//! attach: Linux 6.18 turns a uprobe on it into a call to a trampoline after
//! the first hit, much cheaper than the int3 trap of other uprobes. The
//! arguments sit in the ABI argument registers at the probe point, where an
//! eBPF program reads them.

/// The body's first instruction on x86_64: the 5-byte NOP `nopl
/// 0x0(%rax,%rax,1)` (`0f 1f 44 00 00`). Linux 6.18+ optimises a uprobe on
/// such a NOP: after its first (int3) hit the kernel rewrites it into a call
/// to a uprobe trampoline that enters the kernel with the `uprobe` syscall,
/// which costs far less than the int3 trap and single-step of an ordinary
/// uprobe. Elsewhere nothing. Ends with a newline.
#[cfg(target_arch = "x86_64")]
macro_rules! nop5 {
    () => {
        ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
    };
}
#[cfg(not(target_arch = "x86_64"))]
macro_rules! nop5 {
    () => {
        ""
    };
}

/// A ring started dropping: the first full-ring drop after a successful push.
///
/// `ring` is the ring's address in the producer's address space,
/// `instance_id` the instance whose observation was dropped, and
/// `dropped_total` the ring's drop counter including this drop.
#[unsafe(no_mangle)]
// SAFETY: the body is a NOP (x86_64) and `ret`: it follows the C ABI (it
// returns with every callee-saved register, the stack and the flags the
// caller left) and touches no memory.
#[unsafe(naked)]
pub extern "C" fn subetha_drop_begin(ring: usize, instance_id: u32, dropped_total: u64) {
    core::arch::naked_asm!(concat!(nop5!(), "ret /* subetha_drop_begin */"))
}

/// A ring stopped dropping: the first successful push after drops (or the
/// owning thread exited during an episode). `dropped_in_episode` is how many
/// observations the episode lost.
#[unsafe(no_mangle)]
// SAFETY: the body is a NOP (x86_64) and `ret`: it follows the C ABI (it
// returns with every callee-saved register, the stack and the flags the
// caller left) and touches no memory.
#[unsafe(naked)]
pub extern "C" fn subetha_drop_end(ring: usize, dropped_in_episode: u64) {
    core::arch::naked_asm!(concat!(nop5!(), "ret /* subetha_drop_end */"))
}

/// A consumer's scan of a segment reached its first ring with work (scans
/// that find every ring idle call neither scan hook). `segment` is the
/// segment's address in the consumer's address space, `scan_seq` the
/// consumer's scan counter.
#[unsafe(no_mangle)]
// SAFETY: the body is a NOP (x86_64) and `ret`: it follows the C ABI (it
// returns with every callee-saved register, the stack and the flags the
// caller left) and touches no memory.
#[unsafe(naked)]
pub extern "C" fn subetha_scan_begin(segment: usize, scan_seq: u64) {
    core::arch::naked_asm!(concat!(nop5!(), "ret /* subetha_scan_begin */"))
}

/// A consumer finished a scan; `drained` observations were moved into stats.
#[unsafe(no_mangle)]
// SAFETY: the body is a NOP (x86_64) and `ret`: it follows the C ABI (it
// returns with every callee-saved register, the stack and the flags the
// caller left) and touches no memory.
#[unsafe(naked)]
pub extern "C" fn subetha_scan_end(segment: usize, scan_seq: u64, drained: u64) {
    core::arch::naked_asm!(concat!(nop5!(), "ret /* subetha_scan_end */"))
}

/// The hook symbol names, for probes and for checking a binary exports them.
pub const HOOK_SYMBOLS: [&str; 4] = [
    "subetha_drop_begin",
    "subetha_drop_end",
    "subetha_scan_begin",
    "subetha_scan_end",
];
