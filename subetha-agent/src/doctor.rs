//! `subetha-agent doctor`: what this host and this user allow, and what the
//! agent will therefore skip.
//!
//! Advice must be true: "not mounted" only when `/proc/self/mountinfo`
//! lists no tracefs, "not readable" when it does and this user cannot read
//! it, and a probe load failure says which privilege is missing.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::probes::{PRIVILEGE_ADVICE, Privileges};

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

/// Runs every check.
pub fn run() -> Vec<Check> {
    let mut checks = Vec::new();
    let privileges = Privileges::of_this_process();
    let euid = privileges.euid;
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
    checks.push(Check::new(
        "capabilities",
        privileges.can_load(),
        if privileges.can_load() {
            format!("effective: {}", privileges.describe())
        } else {
            format!(
                "effective: {}; loading the eBPF probes {PRIVILEGE_ADVICE}",
                privileges.describe()
            )
        },
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
    let tracefs = Tracefs::find(euid);
    checks.push(Check::new(
        "tracefs",
        matches!(tracefs, Tracefs::Readable(_)),
        tracefs.describe(),
        match tracefs {
            Tracefs::Unreadable { .. } => "warn",
            _ => "missing",
        },
    ));
    for event in [
        "sched_switch",
        "sched_wakeup",
        "sched_wakeup_new",
        "sched_migrate_task",
    ] {
        let (present, detail) = match &tracefs {
            Tracefs::Readable(root) => {
                let present = root.join("events/sched").join(event).exists();
                (
                    present,
                    if present {
                        "available"
                    } else {
                        "not in this kernel"
                    }
                    .to_string(),
                )
            }
            Tracefs::Unreadable { root, .. } => (
                false,
                format!("unknown: {} is not readable by uid {euid}", root.display()),
            ),
            Tracefs::Empty(_) | Tracefs::NotMounted => (false, "unavailable (needs tracefs)".to_string()),
        };
        checks.push(Check::new(
            &format!("tracepoint sched/{event}"),
            present,
            detail,
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
    match crate::probes::LoadedProbes::load() {
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

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("Linux {}", s.trim()))
        .unwrap_or_else(|_| "unknown".into())
}

/// Where tracefs is and whether this user can read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tracefs {
    /// Mounted here, with a readable `events` directory.
    Readable(PathBuf),
    /// Mounted here (per `/proc/self/mountinfo`), but `events` cannot be
    /// read by this user (tracefs is mode 0700 by default).
    Unreadable {
        /// The mount point.
        root: PathBuf,
        /// The user.
        uid: u32,
    },
    /// Mounted here, but without an `events` directory.
    Empty(PathBuf),
    /// No tracefs mount.
    NotMounted,
}

impl Tracefs {
    /// Looks at the mounts of this process's mount namespace.
    pub fn find(uid: u32) -> Self {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self::judge(&tracefs_mounts(&mountinfo), uid, |dir| {
            std::fs::read_dir(dir).map(drop)
        })
    }

    /// The state, from the tracefs mount points and a way to try reading
    /// a directory.
    fn judge(mounts: &[PathBuf], uid: u32, read_dir: impl Fn(&Path) -> std::io::Result<()>) -> Self {
        let mut unreadable = None;
        let mut empty = None;
        for root in mounts {
            match read_dir(&root.join("events")) {
                Ok(()) => return Self::Readable(root.clone()),
                Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
                    unreadable.get_or_insert_with(|| root.clone());
                }
                Err(_) => {
                    empty.get_or_insert_with(|| root.clone());
                }
            }
        }
        match (unreadable, empty) {
            (Some(root), _) => Self::Unreadable { root, uid },
            (None, Some(root)) => Self::Empty(root),
            (None, None) => Self::NotMounted,
        }
    }

    /// The doctor's sentence.
    pub fn describe(&self) -> String {
        match self {
            Self::Readable(root) => format!("mounted at {}", root.display()),
            Self::Unreadable { root, uid } => format!(
                "tracefs is mounted at {} but not readable by uid {uid}: run as root \
                 (which the eBPF probes need anyway), or make it readable \
                 (mount -o remount,mode=0755 {})",
                root.display(),
                root.display()
            ),
            Self::Empty(root) => format!("mounted at {} but it has no events directory", root.display()),
            Self::NotMounted => "not mounted (mount -t tracefs nodev /sys/kernel/tracing)".into(),
        }
    }
}

/// The mount points of tracefs in `mountinfo` (`/proc/<pid>/mountinfo`
/// format: the fifth field is the mount point, the filesystem type follows
/// the ` - ` separator), octal escapes decoded.
fn tracefs_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            (after.split_whitespace().next()? == "tracefs").then_some(())?;
            before
                .split_whitespace()
                .nth(4)
                .map(|point| PathBuf::from(unescape(point)))
        })
        .collect()
}

/// `\040`-style octal escapes of mountinfo decoded.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = field
                .get(i + 1..i + 4)
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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

    const MOUNTINFO: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
35 24 0:12 / /sys/kernel/tracing rw,relatime shared:12 - tracefs nodev rw
36 24 0:13 / /mnt/trace\\040dir rw,relatime - tracefs tracefs rw
";

    #[test]
    fn tracefs_mounts_come_from_mountinfo() {
        assert_eq!(
            tracefs_mounts(MOUNTINFO),
            [
                PathBuf::from("/sys/kernel/tracing"),
                PathBuf::from("/mnt/trace dir")
            ]
        );
        assert!(tracefs_mounts("22 1 0:21 / /proc rw - proc proc rw\n").is_empty());
    }

    #[test]
    fn an_unreadable_tracefs_is_not_called_unmounted() {
        use std::io::{Error, ErrorKind};
        let mounts = tracefs_mounts(MOUNTINFO);
        let denied = Tracefs::judge(&mounts, 1000, |_| Err(Error::from(ErrorKind::PermissionDenied)));
        assert_eq!(
            denied,
            Tracefs::Unreadable {
                root: "/sys/kernel/tracing".into(),
                uid: 1000
            }
        );
        let text = denied.describe();
        assert!(
            text.contains("mounted at /sys/kernel/tracing but not readable by uid 1000")
                && !text.contains("not mounted"),
            "{text}"
        );
        let second = Tracefs::judge(&mounts, 0, |dir| {
            if dir.starts_with("/mnt") {
                Ok(())
            } else {
                Err(Error::from(ErrorKind::PermissionDenied))
            }
        });
        assert_eq!(second, Tracefs::Readable("/mnt/trace dir".into()));
        let empty = Tracefs::judge(&mounts, 0, |_| Err(Error::from(ErrorKind::NotFound)));
        assert_eq!(empty, Tracefs::Empty("/sys/kernel/tracing".into()));
        assert_eq!(Tracefs::judge(&[], 0, |_| Ok(())), Tracefs::NotMounted);
    }
}
