//! Cross-crate and multi-process integration tests live in `tests/tests/`
//! (one process per file); this library holds what several of them share:
//! polling with a deadline, `/proc` inspection, running checks in a
//! `fork()`ed child ([`forking`]), re-executing the test binary in a child
//! role ([`rerun_self`]), driving the `subetha-child` helper process
//! ([`child`]), reading ELF symbol tables ([`elf`]), and running the agent
//! (binary or library) against the `subetha-workload` helper ([`agent`]).
//!
//! | file | what it proves |
//! |------|----------------|
//! | `fork.rs` | a forked child gets its own segment, memfd and thread ids; the parent's rings get nothing from it |
//! | `fork_with_sidecar.rs` | child and grandchild (forked before first use) each get their own sidecar and exact counts |
//! | `fork_race.rs` | racing first uses in a forked child share one segment (currently a known bug) |
//! | `hook_symbols.rs` | the four uprobe hooks are global, distinct FUNC symbols not starting with LOCK |
//! | `memory.rs` | 10,000 short-lived threads reuse ≤ 8 slots; touched memory bounded; conservation |
//! | `pipeline.rs` | exact sidecar statistics end to end, policies, retirement, slot reuse |
//! | `ring_table_full.rs` | `RingTableFull`, `lost_no_ring`, and re-claiming a freed slot |
//! | `sidecar_lease.rs` | the auto sidecar's lease refuses a second consumer |
//! | `cross_process.rs` | another process drains a segment through `/proc/<pid>/fd`, exactly; leases across processes |
//! | `thread_exit.rs` | observations from thread-exit destructors: delivered or counted lost |
//! | `consumer_change.rs` | a new consumer does not blame a slot's new thread for old drops (currently a known bug) |
//! | `agent_conservation.rs` | the agent's books balance exactly: bursts and storms, agent SIGKILLed and restarted, workload SIGKILLed, thread churn, late attach (a known bug, ignored) |
//! | `agent_adaptive_policy.rs` | the agent runs the adaptive-mutex policy for a process it drains (and leaves the word alone when told to) |
//! | `agent_handover.rs` | sidecar ⇄ agent hand-over and hand-back without loss; `SUBETHA_SIDECAR=always` is left alone |
//! | `agent_hostile.rs` | hostile segments: one refusal each, the rest served, corrupt ring, names sanitised, bounded memory (two known bugs, ignored) |
//! | `agent_cli.rs` | the real binary: bad command lines, busy port, closed port, SIGTERM, registration socket (`--pid` with registrations: a known bug, ignored) |
//! | `agent_idle_cpu.rs` | budget: ≤ 1% of a core with 100 idle rings (release agent; currently over, ignored) |
//! | `agent_rss.rs` | budget: VmRSS ≤ 64 MiB with 1,000 instances (release agent) |
//! | `agent_top.rs` | `top` in tmux: live rates, sorting, drill-down, storms; q / Ctrl-C / SIGTERM / panic restore the terminal; dead agent shown; no tty refused |
//! | `agent_report.rs` | storm pictures: a staged preemption drawn as SVG, PNG and HTML with its lanes and the hog named |
//! | `agent_prometheus_e2e.rs` | a real Prometheus scrapes the agent; its query API has the exact counts |
//! | `agent_otlp.rs` | OTLP export decoded by an in-test collector: exact counts, per-process resources with semantic conventions, latency histograms, final export, failures not fatal |
//! | `agent_pidns.rs` | apps in their own pid / pid+mount+user / nested pid namespaces: attached, host tids, balanced books; lying segments refused by check; registration from a container; a rootless container and a same-user agent |
//! | `agent_cardinality.rs` | `/metrics` series stay under the stated bound with thread churn; per-thread series only on request; exited processes' series expire |
//! | `agent_container.rs` | a process in a docker-shaped cgroup is labelled with its container id and service everywhere; `--label-from none` |
//! | `contrib_rules.rs` | promtool checks and unit-tests the alert rules; dashboard and rule metric names exist in a real scrape |
//! | `agent_config.rs` | the TOML config: unknown keys named, file values used, flags override |
//! | `agent_service.rs` | sd_notify READY/STATUS/WATCHDOG/STOPPING, the systemd unit verified, man pages and completions |
//!
//! Test files that depend on process-global state (the process segment, the
//! auto sidecar) hold one `#[test]` each.

use std::fmt::Display;
use std::time::{Duration, Instant};

pub mod agent;
pub mod child;
pub mod elf;
pub mod fleet;
pub mod forking;
pub mod procfs;
pub mod prometheus;
pub mod sched;
pub mod staging;
pub mod tmux;

/// Generous deadline for anything that waits on another thread or process.
/// Waits poll; a timeout is a failure, never an assumption about timing.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Polls `check` until it returns `Some`, sleeping briefly in between.
/// Panics after `timeout`, describing what was awaited and the last state
/// `describe` reports.
pub fn wait_for<T>(
    timeout: Duration,
    what: impl Display,
    mut check: impl FnMut() -> Option<T>,
    describe: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}; last state: {}",
                describe()
            );
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// The calling thread's OS thread id.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// The real uid of this process.
pub fn getuid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Environment variable naming the role a re-executed test binary plays.
pub const ROLE_ENV: &str = "SUBETHA_TEST_ROLE";

/// The role this process was re-executed for, if any.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// Runs the current test binary again, restricted to the single test
/// `test_name` (its full path inside the file, e.g. `ring_table_full`), with
/// [`ROLE_ENV`] set to `role` and `env` added. Panics unless the child ran
/// exactly that one test and it passed; returns its combined output.
pub fn rerun_self(test_name: &str, role: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("current_exe");
    let mut command = std::process::Command::new(exe);
    command
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env_remove("SUBETHA_SIDECAR")
        .env_remove("SUBETHA_RING_SLOTS")
        .env_remove("SUBETHA_INSTANCES");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("spawn the test binary again");
    let text = format!(
        "--- child stdout ---\n{}\n--- child stderr ---\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "child role {role:?} failed ({}):\n{text}",
        output.status
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("1 passed"),
        "child role {role:?} did not run exactly one test:\n{text}"
    );
    text
}
