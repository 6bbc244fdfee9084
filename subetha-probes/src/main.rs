//! The subetha eBPF programs.
//!
//! Built for `bpfel-unknown-none` (by subetha-agent's build script, through
//! aya-build) this is a `no_std`, `no_main` object holding:
//!
//! * four uprobes on the hook symbols of subetha-core ([`bpf::hooks`]), each
//!   emitting one event and counting one hit per call;
//! * four classic tracepoints on the scheduler ([`bpf::sched`]), filtered
//!   in the kernel by the watched-thread map, that turn switch-out, wakeup
//!   and switch-in of a watched thread into one off-CPU interval with its
//!   reason, plus its migrations.
//!
//! Built for the host it is an empty program, so `cargo build --workspace`
//! and clippy need no eBPF toolchain.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]

#[cfg(target_arch = "bpf")]
mod bpf;

#[cfg(not(target_arch = "bpf"))]
fn main() {}
