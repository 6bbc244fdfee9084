//! The eBPF side: maps, hook uprobes, scheduler tracepoints.

pub mod hooks;
pub mod maps;
pub mod sched;

/// eBPF programs cannot unwind or report a panic. Nothing in these programs
/// panics (every fallible step is handled), and a reachable panic would
/// leave this infinite loop in the object, which the verifier rejects at
/// load time rather than letting it run.
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
