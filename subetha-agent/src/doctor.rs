//! `subetha-agent doctor`: what this host and this user allow, and what the
//! agent will therefore skip.

use serde::Serialize;

/// One fact about the host.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// `ok`, `warn` (works with limits) or `missing`.
    pub status: String,
    /// What was found, and what it means.
    pub detail: String,
}

impl Check {
    fn new(name: &str, ok: bool, detail: impl Into<String>, if_not: &str) -> Self {
        Self {
            name: name.into(),
            status: if ok { "ok" } else { if_not }.into(),
            detail: detail.into(),
        }
    }
}

/// Linux capability numbers the agent cares about.
const CAPS: [(u32, &str); 5] = [
    (19, "CAP_SYS_PTRACE"),
    (21, "CAP_SYS_ADMIN"),
    (38, "CAP_PERFMON"),
    (39, "CAP_BPF"),
    (24, "CAP_SYS_RESOURCE"),
];

/// Runs every check.
pub fn run() -> Vec<Check> {
    let mut checks = Vec::new();
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    checks.push(Check::new(
        "user",
        euid == 0,
        if euid == 0 {
            "running as root: every process's segment is visible".to_string()
        } else {
            format!("running as uid {euid}: only this user's processes can be drained")
        },
        "warn",
    ));
    let effective = effective_caps();
    let names: Vec<&str> = CAPS
        .iter()
        .filter(|(bit, _)| effective & (1u64 << bit) != 0)
        .map(|(_, name)| *name)
        .collect();
    let bpf_ok = effective & (1 << 21) != 0 || (effective & (1 << 39) != 0 && effective & (1 << 38) != 0);
    checks.push(Check::new(
        "capabilities",
        bpf_ok,
        format!(
            "effective: {}",
            if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            }
        ),
        "warn",
    ));
    checks.push(Check::new("kernel", true, kernel_release(), "ok"));
    let btf = std::path::Path::new("/sys/kernel/btf/vmlinux").exists();
    checks.push(Check::new(
        "btf",
        btf,
        if btf {
            "/sys/kernel/btf/vmlinux present"
        } else {
            "no kernel BTF: tp_btf programs unavailable"
        },
        "missing",
    ));
    let tracefs = tracefs_root();
    checks.push(Check::new(
        "tracefs",
        tracefs.is_some(),
        match &tracefs {
            Some(root) => format!("mounted at {root}"),
            None => "not mounted (mount -t tracefs nodev /sys/kernel/tracing)".into(),
        },
        "missing",
    ));
    for event in [
        "sched_switch",
        "sched_wakeup",
        "sched_wakeup_new",
        "sched_migrate_task",
    ] {
        let present = tracefs
            .as_ref()
            .is_some_and(|root| std::path::Path::new(&format!("{root}/events/sched/{event}")).exists());
        checks.push(Check::new(
            &format!("tracepoint sched/{event}"),
            present,
            if present {
                "available"
            } else {
                "unavailable (needs tracefs)"
            },
            "missing",
        ));
    }
    let uprobes = std::path::Path::new("/sys/bus/event_source/devices/uprobe").exists();
    checks.push(Check::new(
        "uprobes",
        uprobes,
        if uprobes {
            "uprobe PMU present"
        } else {
            "no uprobe PMU: drop/scan hooks cannot be probed"
        },
        "missing",
    ));
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    checks.push(Check::new("perf_event_paranoid", true, paranoid, "ok"));
    // The real test: load them, and report each program and attachment.
    match crate::probes::Probes::load() {
        Ok(mut probes) => {
            // SAFETY: getpid/gettid cannot fail.
            let (pid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
            let scan_hooks = probes.attach_scanner(pid, tid);
            for status in probes.status() {
                checks.push(Check::new(
                    &format!("probe {}", status.program),
                    status.attached,
                    match &status.error {
                        None => format!("attached to {}", status.target),
                        Some(error) => format!("{}: {error}", status.target),
                    },
                    "missing",
                ));
            }
            checks.push(Check::new(
                "probes",
                scan_hooks.is_ok() && probes.sched_active(),
                match scan_hooks {
                    Ok(()) => format!("loaded: {}", probes.summary()),
                    Err(error) => format!("loaded, but scan hooks failed here: {error}"),
                },
                "warn",
            ));
        }
        Err(error) => checks.push(Check::new(
            "probes",
            false,
            format!("{error}; storms get a lower-confidence cause from /proc"),
            "warn",
        )),
    }
    checks
}

/// Writes the checks as aligned text.
pub fn print(out: &mut impl std::io::Write, checks: &[Check]) -> std::io::Result<()> {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for check in checks {
        writeln!(
            out,
            "{:<7} {:<width$}  {}",
            check.status, check.name, check.detail
        )?;
    }
    Ok(())
}

fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("Linux {}", s.trim()))
        .unwrap_or_else(|_| "unknown".into())
}

/// Where tracefs is mounted, if it is.
pub fn tracefs_root() -> Option<String> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .find(|root| std::path::Path::new(&format!("{root}/events")).exists())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_area() {
        let checks = run();
        for name in [
            "user",
            "capabilities",
            "kernel",
            "btf",
            "tracefs",
            "uprobes",
            "probes",
        ] {
            assert!(checks.iter().any(|c| c.name == name), "missing {name}");
        }
        assert!(
            checks
                .iter()
                .all(|c| ["ok", "warn", "missing"].contains(&c.status.as_str()))
        );
    }
}
