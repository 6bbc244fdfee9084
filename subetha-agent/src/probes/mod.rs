//! The eBPF probes, from user space: loading, attaching, watching threads
//! and reading what the programs report.
//!
//! The programs (crate `subetha-probes`, built by this crate's build script
//! with aya-build) are:
//!
//! * uprobes on the four hook symbols of subetha-core — `subetha_drop_begin`
//!   / `subetha_drop_end` in each producer process, `subetha_scan_begin` /
//!   `subetha_scan_end` in whichever process drains (the agent itself or an
//!   application's sidecar). Each is attached per process (`perf_event_open`
//!   with that pid) to the object that defines the symbols: the executable,
//!   or the shared object found through `/proc/<pid>/maps`. Every call emits
//!   a [`ProbeEvent`] and counts a hit ([`HookHits`]);
//! * BTF tracepoints (`tp_btf`) on `sched_switch` and `sched_migrate_task`
//!   (where the kernel has no BTF, classic tracepoints on those and on
//!   `sched_wakeup`/`sched_wakeup_new`), filtered in the kernel by a map of
//!   watched thread ids ([`LoadedProbes::watch`]), that report off-CPU intervals
//!   of a watched thread with their reason ([`OffCpuInterval`]; which ones
//!   is set by [`LoadedProbes::set_off_cpu_filter`]) and each of its migrations.
//!   The BTF programs read `task_struct` fields at offsets found in the
//!   kernel's BTF at load time, a woken thread's runqueue wait included.
//!
//! Events go through one ring buffer submitted without wakeups; the agent
//! drains it on its own timer ([`LoadedProbes::drain_events`]). Events that did
//! not fit are counted ([`LoadedProbes::losses`]).
//!
//! The probes are optional. Without the `probes` cargo feature (or when the
//! build ran with `AYA_BUILD_SKIP=1`) [`LoadedProbes::load`] answers
//! [`ProbesError::NotBuiltIn`]; on a host that does not allow eBPF it
//! answers another error. Once loaded, every program and every attach
//! succeeds or fails on its own: [`LoadedProbes::status`] says which.

mod events;

#[cfg(all(feature = "probes", not(subetha_probes_skipped)))]
mod btf;
#[cfg(all(feature = "probes", not(subetha_probes_skipped)))]
mod loader;
#[cfg(all(feature = "probes", not(subetha_probes_skipped)))]
mod target;
#[cfg(all(feature = "probes", not(subetha_probes_skipped)))]
mod tracefs;

#[cfg(not(all(feature = "probes", not(subetha_probes_skipped))))]
mod stub;

#[cfg(test)]
mod tests;

pub use events::{OffCpuInterval, ProbeEvent, decode_event};
#[cfg(all(feature = "probes", not(subetha_probes_skipped)))]
pub use loader::LoadedProbes;
#[cfg(not(all(feature = "probes", not(subetha_probes_skipped))))]
pub use stub::LoadedProbes;

/// Whether this build carries the eBPF object.
pub const BUILT_IN: bool = cfg!(all(feature = "probes", not(subetha_probes_skipped)));

/// What a watched thread is, for the sched tracepoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A consumer's scan thread.
    Scanner,
    /// An instrumented producer thread.
    Producer,
}

impl Role {
    /// The value stored in the kernel's watched-thread map.
    pub const fn code(self) -> u32 {
        match self {
            Role::Scanner => subetha_probes::role::SCANNER,
            Role::Producer => subetha_probes::role::PRODUCER,
        }
    }

    /// The role of a kernel map value.
    pub const fn from_code(code: u32) -> Option<Role> {
        match code {
            subetha_probes::role::SCANNER => Some(Role::Scanner),
            subetha_probes::role::PRODUCER => Some(Role::Producer),
            _ => None,
        }
    }

    /// `scanner` / `producer`.
    pub const fn name(self) -> &'static str {
        match self {
            Role::Scanner => "scanner",
            Role::Producer => "producer",
        }
    }
}

/// Which scheduler programs [`LoadedProbes::load_with`] attaches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SchedPrograms {
    /// The BTF tracepoints, each falling back to its classic tracepoint when
    /// it cannot be loaded or attached (what [`LoadedProbes::load`] does).
    #[default]
    Auto,
    /// Only the classic tracepoints (as on a kernel without BTF).
    Classic,
}

/// Which off-CPU intervals of watched threads the kernel turns into events
/// ([`LoadedProbes::set_off_cpu_filter`]); the others are only counted
/// ([`LoadedProbes::off_cpu_filtered`]). An interval is reported when any
/// criterion holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuFilter {
    /// Report a runqueue wait (runnable, not running) at least this long.
    pub min_runqueue_wait_ns: u64,
    /// Report a sleep longer than this.
    pub min_sleep_ns: u64,
    /// Report every interval that ends on another CPU than it began on.
    pub cpu_change: bool,
    /// Follow producers' off-CPU intervals too (else only scanners'; a
    /// producer's CPU then comes from its migrations and drop hooks, and
    /// its context switches cost what an unwatched thread's do).
    pub producer_intervals: bool,
}

impl OffCpuFilter {
    /// A runqueue wait long enough to explain part of a storm.
    pub const SIGNIFICANT_WAIT_NS: u64 = 500_000;

    /// What the agent asks for: its scanners' waits of at least
    /// [`SIGNIFICANT_WAIT_NS`](Self::SIGNIFICANT_WAIT_NS), sleeps beyond
    /// twice its longest scan pause (a scanner's ordinary pauses are not
    /// news) and changes of CPU; producers only through their migrations
    /// and drop hooks (where a producer runs is all a diagnosis needs of
    /// it).
    pub const fn for_agent(max_scan_interval_ns: u64) -> OffCpuFilter {
        OffCpuFilter {
            min_runqueue_wait_ns: Self::SIGNIFICANT_WAIT_NS,
            min_sleep_ns: max_scan_interval_ns.saturating_mul(2),
            cpu_change: true,
            producer_intervals: false,
        }
    }
}

/// One program load or one attachment, and how it went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeStatus {
    /// Program name (`bt_sched_switch`, `up_drop_begin`, ...).
    pub program: String,
    /// What it is attached to: `sched/sched_switch (tp_btf)`, or `pid 123:
    /// /proc/123/exe` for a uprobe.
    pub target: String,
    /// Whether it is attached now.
    pub attached: bool,
    /// Why not, when it is not.
    pub error: Option<String>,
}

/// Hook hits, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HookHits {
    /// `subetha_drop_begin` calls.
    pub drop_begin: u64,
    /// `subetha_drop_end` calls.
    pub drop_end: u64,
    /// `subetha_scan_begin` calls.
    pub scan_begin: u64,
    /// `subetha_scan_end` calls.
    pub scan_end: u64,
}

impl HookHits {
    /// The counter of hook index `hook` ([`subetha_probes::hook`]).
    pub fn get(&self, hook: u32) -> u64 {
        match hook {
            subetha_probes::hook::DROP_BEGIN => self.drop_begin,
            subetha_probes::hook::DROP_END => self.drop_end,
            subetha_probes::hook::SCAN_BEGIN => self.scan_begin,
            subetha_probes::hook::SCAN_END => self.scan_end,
            _ => 0,
        }
    }

    fn get_mut(&mut self, hook: u32) -> Option<&mut u64> {
        match hook {
            subetha_probes::hook::DROP_BEGIN => Some(&mut self.drop_begin),
            subetha_probes::hook::DROP_END => Some(&mut self.drop_end),
            subetha_probes::hook::SCAN_BEGIN => Some(&mut self.scan_begin),
            subetha_probes::hook::SCAN_END => Some(&mut self.scan_end),
            _ => None,
        }
    }

    /// Adds `count` to hook `hook`'s counter (unknown hooks are ignored).
    pub fn add(&mut self, hook: u32, count: u64) {
        if let Some(counter) = self.get_mut(hook) {
            *counter = counter.saturating_add(count);
        }
    }
}

/// Linux capability numbers (`linux/capability.h`).
pub mod cap {
    /// `CAP_SYS_PTRACE`.
    pub const SYS_PTRACE: u32 = 19;
    /// `CAP_SYS_ADMIN`.
    pub const SYS_ADMIN: u32 = 21;
    /// `CAP_SYS_RESOURCE`.
    pub const SYS_RESOURCE: u32 = 24;
    /// `CAP_PERFMON` (Linux 5.8).
    pub const PERFMON: u32 = 38;
    /// `CAP_BPF` (Linux 5.8).
    pub const BPF: u32 = 39;
}

/// What loading the probes needs, in one sentence (doctor and errors).
pub const PRIVILEGE_ADVICE: &str = "needs root, or CAP_BPF + CAP_PERFMON (and CAP_SYS_ADMIN for the uprobes)";

/// This process's effective uid and capabilities, as far as loading the
/// probes is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Privileges {
    /// Effective uid.
    pub euid: u32,
    /// The `CapEff` bit set of `/proc/self/status`.
    pub effective: u64,
}

impl Privileges {
    /// This process's.
    pub fn of_this_process() -> Self {
        let effective = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
            .unwrap_or(0);
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        Self { euid, effective }
    }

    /// Whether capability `bit` is effective.
    pub fn has(&self, bit: u32) -> bool {
        bit < 64 && self.effective & (1u64 << bit) != 0
    }

    /// Whether the kernel can let this process create eBPF maps and load
    /// tracing programs: CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON.
    /// Without either, every map creation fails with EPERM.
    pub fn can_load(&self) -> bool {
        self.has(cap::SYS_ADMIN) || (self.has(cap::BPF) && self.has(cap::PERFMON))
    }

    /// The capabilities among those the agent cares about that are
    /// effective, by name.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (cap::SYS_PTRACE, "CAP_SYS_PTRACE"),
            (cap::SYS_ADMIN, "CAP_SYS_ADMIN"),
            (cap::PERFMON, "CAP_PERFMON"),
            (cap::BPF, "CAP_BPF"),
            (cap::SYS_RESOURCE, "CAP_SYS_RESOURCE"),
        ]
        .into_iter()
        .filter(|(bit, _)| self.has(*bit))
        .map(|(_, name)| name)
        .collect()
    }

    /// `none`, or the effective capabilities [`names`](Self::names) lists.
    pub fn describe(&self) -> String {
        let names = self.names();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }
}

/// A cause kept with its type (aya's errors exist only in builds with the
/// probes).
pub type BoxedError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why the probes could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ProbesError {
    /// This build has no eBPF object.
    #[error("probes not built in ({0})")]
    NotBuiltIn(&'static str),
    /// This process lacks the capabilities (checked before trying, so the
    /// answer names no map or program, whose creation order varies).
    #[error(
        "loading the eBPF probes failed: {PRIVILEGE_ADVICE}; uid {} has effective capabilities: {}",
        .0.euid,
        .0.describe()
    )]
    Privileges(Privileges),
    /// The object could not be loaded (no privileges, no BPF support, ...).
    /// The message is complete on its own (log lines print only it);
    /// `source` is aya's error, for callers that look deeper.
    #[error("loading the eBPF probes failed: {message}")]
    Load {
        /// aya's error with its causes, and what to do about it.
        message: String,
        /// aya's error.
        #[source]
        source: BoxedError,
    },
    /// A map the programs need is missing or unusable.
    #[error("eBPF map {map}: {source}")]
    Map {
        /// Map name.
        map: &'static str,
        /// What went wrong (aya's map error, or what the object lacks).
        #[source]
        source: BoxedError,
    },
    /// The process has no object defining the hook symbols, or its
    /// executable and mappings could not be read.
    #[error("process {pid}: {reason}")]
    Target {
        /// Process id.
        pid: u32,
        /// What went wrong.
        reason: String,
    },
    /// Some uprobes could not be attached (the others were).
    #[error("process {pid}: {}", .failures.join("; "))]
    Attach {
        /// Process id.
        pid: u32,
        /// One readable line per failed program.
        failures: Vec<String>,
    },
}
