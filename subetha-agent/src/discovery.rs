//! Finding instrumented processes and opening their segments safely.
//!
//! A segment is a memfd named `subetha`; its owner keeps a descriptor open,
//! so `/proc/<pid>/fd/<n>` links to `/memfd:subetha (deleted)`. Opening that
//! path gives the agent its own descriptor on the same file. Before mapping,
//! [`open_segment`] pins the process with a pidfd (so a pid reused later
//! cannot be confused with it), checks that the file's owner is the
//! process's owner, and lets [`SegmentView::map_fd`] validate the header
//! against the pid, its start time and its uid.
//!
//! A process in a container created its segment with the ids of its own
//! namespaces: the header is checked against the pid the process has in
//! its own pid namespace (the last `NSpid:` entry), that namespace's inode,
//! and the uid its user namespace maps the owner's uid to ([`crate::pidns`]).
//! A header that disagrees with any of them is refused with the check
//! named ([`AttachError::Identity`]).

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

use subetha_core::segment::{Expectations, MEMFD_NAME, SegmentError, SegmentView, process_start_time};

use crate::pidns::{PidNamespace, UidMap};

/// A descriptor in some process that looks like a subetha segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// The process.
    pub pid: u32,
    /// The descriptor number in that process.
    pub fd: u32,
    /// The inode of the memfd (identifies the segment across scans).
    pub inode: u64,
}

impl Candidate {
    /// `/proc/<pid>/fd/<fd>` (or a note for a segment received over the
    /// registration socket, whose `fd` is `u32::MAX`).
    pub fn path(&self) -> PathBuf {
        if self.fd == u32::MAX {
            return PathBuf::from(format!("registration from pid {}", self.pid));
        }
        PathBuf::from(format!("/proc/{}/fd/{}", self.pid, self.fd))
    }
}

/// Lists candidate segments in `/proc`, limited to `pids` when given. Our
/// own process and other agents ([`is_other_agent`]) are skipped: a
/// segment descriptor in another agent is an application's segment that
/// agent drains, found again through the application itself. Processes we
/// may not inspect are skipped silently (an unprivileged agent sees only
/// its user's processes).
pub fn scan_proc(pids: Option<&[u32]>) -> Vec<Candidate> {
    let own = std::process::id();
    let mut found = Vec::new();
    let pid_list: Vec<u32> = match pids {
        Some(pids) => pids.to_vec(),
        None => match std::fs::read_dir("/proc") {
            Ok(dir) => dir
                .flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect(),
            Err(_) => return found,
        },
    };
    let prefix = format!("/memfd:{MEMFD_NAME}");
    for pid in pid_list {
        if pid == own {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let mut other_agent = None;
        for entry in fds.flatten() {
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            let target = target.as_os_str().to_string_lossy();
            // The memfd name is exactly `subetha`: accept "/memfd:subetha" and
            // "/memfd:subetha (deleted)" but not "/memfd:subetha-other".
            let rest = target.strip_prefix(prefix.as_str());
            if !matches!(rest, Some("") | Some(" (deleted)")) {
                continue;
            }
            let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            // Asked only of processes holding a segment: one more read per
            // such process, none for the rest of the host.
            if *other_agent.get_or_insert_with(|| is_other_agent(pid)) {
                break;
            }
            let inode = std::fs::metadata(entry.path()).map(|m| m.ino()).unwrap_or(0);
            found.push(Candidate { pid, fd, inode });
        }
    }
    found
}

/// Walks `/proc` for segments ([`scan_proc`]) on a thread of its own, every
/// `interval`, and hands each walk's candidates to the scan thread.
///
/// A walk reads a link per open descriptor of every process: tens of
/// milliseconds on a busy host, and milliseconds even for one process in a
/// debug build. Done on the scan thread between two scans, it left the
/// rings undrained that long, long enough for a busy ring to fill.
/// Stopped (and joined) when dropped.
pub(crate) struct ProcWalker {
    found: Receiver<Vec<Candidate>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProcWalker {
    /// Starts walking now, limited to `pids` when given.
    pub(crate) fn start(pids: Option<Vec<u32>>, interval: Duration) -> std::io::Result<Self> {
        // One walk waits at most: a walk the scan thread has not taken yet
        // is no older than one interval, and the next one follows.
        let (send, found) = std::sync::mpsc::sync_channel(1);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("subetha-discover".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || {
                    while !stop.load(Ordering::Acquire) {
                        match send.try_send(scan_proc(pids.as_deref())) {
                            Ok(()) | Err(TrySendError::Full(_)) => {}
                            Err(TrySendError::Disconnected(_)) => return,
                        }
                        std::thread::park_timeout(interval);
                    }
                }
            })?;
        Ok(Self {
            found,
            stop,
            thread: Some(thread),
        })
    }

    /// The candidates of every walk finished since the last call, oldest
    /// first. Never blocks.
    pub(crate) fn take(&self) -> impl Iterator<Item = Vec<Candidate>> + '_ {
        self.found.try_iter()
    }
}

impl Drop for ProcWalker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// Why a candidate could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The process went away while we looked.
    #[error("process {0} exited")]
    Gone(u32),
    /// We may not open it (not root and not its owner).
    #[error("permission denied opening {0}")]
    Permission(String),
    /// The memfd belongs to another user than the process.
    #[error("memfd owner uid {file_uid} differs from process uid {process_uid}")]
    OwnerMismatch {
        /// The file's uid.
        file_uid: u32,
        /// The process's real uid.
        process_uid: u32,
    },
    /// The segment failed validation.
    #[error(transparent)]
    Invalid(#[from] SegmentError),
    /// The header's identity disagrees with the process's: `check` names
    /// which (`pid`, `pid namespace`, `start time`, `uid`).
    #[error("{check} check failed: {detail}")]
    Identity {
        /// The check.
        check: &'static str,
        /// What the header said and what the process is.
        detail: String,
    },
    /// A system call failed.
    #[error("{0}: {1}")]
    Os(&'static str, std::io::Error),
}

/// An opened, validated segment and the process it belongs to.
#[derive(Debug)]
pub struct OpenedSegment {
    /// The validated mapping.
    pub view: SegmentView,
    /// A pidfd on the process: readable once it exits.
    pub pidfd: OwnedFd,
    /// Process id.
    pub pid: u32,
    /// Its start time (`/proc/<pid>/stat` field 22).
    pub start_time_ticks: u64,
    /// Its real uid.
    pub uid: u32,
    /// Its command name, sanitised.
    pub comm: String,
    /// Its pid namespace.
    pub ns: PidNamespace,
}

/// Opens and validates a candidate; see the module docs.
pub fn open_segment(candidate: &Candidate) -> Result<OpenedSegment, AttachError> {
    let pid = candidate.pid;
    let path = candidate.path();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => AttachError::Permission(path.display().to_string()),
            std::io::ErrorKind::NotFound => AttachError::Gone(pid),
            _ => AttachError::Os("open", e),
        })?;
    validate_file(pid, &file)
}

/// Validates a segment file said to belong to `pid` (opened from `/proc`, or
/// received over the registration socket) and maps it.
pub fn validate_file(pid: u32, file: &std::fs::File) -> Result<OpenedSegment, AttachError> {
    let pidfd = pidfd_open(pid)?;
    // Bind the pidfd to the process we inspect: read the start time after
    // opening it; a pid reused in between would show a different one.
    let start_time_ticks = process_start_time(pid).ok_or(AttachError::Gone(pid))?;
    let uid = process_uid(pid).ok_or(AttachError::Gone(pid))?;
    let file_uid = file.metadata().map_err(|e| AttachError::Os("fstat", e))?.uid();
    if file_uid != uid {
        return Err(AttachError::OwnerMismatch {
            file_uid,
            process_uid: uid,
        });
    }
    let ns = PidNamespace::of(pid).ok_or(AttachError::Gone(pid))?;
    let uid_map = UidMap::of(pid);
    let ns_uid = uid_map.to_inside(uid).ok_or_else(|| AttachError::Identity {
        check: "uid",
        detail: format!("process uid {uid} is not mapped into its user namespace"),
    })?;
    let expect = Expectations {
        pid: Some(ns.own_pid()),
        start_time_ticks: Some(start_time_ticks),
        uid: Some(ns_uid),
        pid_ns_inode: Some(ns.inode),
    };
    // For an app in another pid namespace, map through an open description
    // of our own, locked: the app's sidecar judges a lease we hold by that
    // lock, which lives as long as our mapping (see
    // `SegmentView::foreign_consumer_present`). Never the descriptor itself:
    // one received over the registration socket shares the app's own
    // description, whose test would take the lock back.
    let own;
    let mapped = if ns.foreign {
        own = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(|e| AttachError::Os("reopen the segment", e))?;
        subetha_core::segment::announce_presence(own.as_fd())?;
        &own
    } else {
        file
    };
    let view =
        SegmentView::map_fd(mapped.as_fd(), &expect).map_err(|e| identity_error(e, pid, &ns, uid, ns_uid))?;
    if process_start_time(pid) != Some(start_time_ticks) || PidNamespace::of(pid).as_ref() != Some(&ns) {
        return Err(AttachError::Gone(pid));
    }
    Ok(OpenedSegment {
        view,
        pidfd,
        pid,
        start_time_ticks,
        uid,
        comm: process_comm(pid),
        ns,
    })
}

/// Names the failed check of an identity mismatch, with the namespace ids
/// that explain it; other validation errors pass through.
fn identity_error(error: SegmentError, pid: u32, ns: &PidNamespace, uid: u32, ns_uid: u32) -> AttachError {
    // Where the process's own ids come from, for a process in a container.
    let nested = ns.nspid.len() > 1;
    let where_ = format!("pid namespace {} (NSpid {})", ns.inode, ns.describe());
    let (check, detail) = match error {
        SegmentError::PidMismatch { found, expected } if nested => (
            "pid",
            format!("segment claims pid {found}, but pid {pid} is pid {expected} in its {where_}"),
        ),
        SegmentError::PidMismatch { found, expected } => (
            "pid",
            format!("segment claims pid {found}, found in pid {expected}"),
        ),
        SegmentError::PidNamespaceMismatch { found, .. } => (
            "pid namespace",
            format!("segment claims pid namespace {found}, pid {pid} lives in {where_}"),
        ),
        SegmentError::StartTimeMismatch { found, expected } => (
            "start time",
            format!("segment's process start time {found} differs from pid {pid}'s {expected} (pid reused?)"),
        ),
        SegmentError::UidMismatch { found, .. } if ns_uid != uid => (
            "uid",
            format!(
                "segment claims uid {found}, process is uid {ns_uid} in its user namespace (uid {uid} here)"
            ),
        ),
        SegmentError::UidMismatch { found, expected } => (
            "uid",
            format!("segment claims uid {found}, process belongs to uid {expected}"),
        ),
        other => return AttachError::Invalid(other),
    };
    AttachError::Identity { check, detail }
}

/// `pidfd_open(pid, 0)`.
pub fn pidfd_open(pid: u32) -> Result<OwnedFd, AttachError> {
    // SAFETY: the pidfd_open system call with a pid and no flags; the result
    // is checked before use.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if raw < 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ESRCH) => AttachError::Gone(pid),
            _ => AttachError::Os("pidfd_open", err),
        });
    }
    // SAFETY: a descriptor the kernel just gave us, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// Whether the process behind `pidfd` has exited (non-blocking).
pub fn has_exited(pidfd: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let rc = unsafe { libc::poll(&mut poll, 1, 0) };
    rc > 0 && poll.revents & libc::POLLIN != 0
}

/// Real uid of `pid` from `/proc/<pid>/status`.
pub fn process_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The command name `subetha-agent run` (and `top --attach`) runs under.
pub const AGENT_COMM: &str = "subetha-agent";

/// Whether `pid` is another subetha agent (by its command name), not us.
pub fn is_other_agent(pid: u32) -> bool {
    pid != 0 && pid != std::process::id() && process_comm(pid) == AGENT_COMM
}

/// The note of a process drained by another agent (`agent_pid`), which an
/// agent waits out rather than asking for the lease: an agent hands a
/// lease back to the application's sidecar only when it exits.
pub fn drained_by_another_agent(agent_pid: u32, pid: u32) -> String {
    format!(
        "another agent (pid {agent_pid}) is draining pid {pid}; this agent waits and takes over when that agent exits"
    )
}

/// `/proc/<pid>/comm`, sanitised; empty if unreadable.
pub fn process_comm(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/comm"))
        .map(|bytes| sanitize(OsStr::new(&String::from_utf8_lossy(&bytes).into_owned())))
        .unwrap_or_default()
}

fn sanitize(text: &OsStr) -> String {
    text.to_string_lossy()
        .trim_end_matches('\n')
        .chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walker_walks_at_once_and_stops_without_waiting_out_its_interval() {
        // A pid that cannot exist: every walk finds nothing, quickly.
        let walker = ProcWalker::start(Some(vec![u32::MAX]), Duration::from_secs(3600)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let walks = loop {
            let walks: Vec<_> = walker.take().collect();
            if !walks.is_empty() {
                break walks;
            }
            assert!(std::time::Instant::now() < deadline, "no walk within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(walks, vec![Vec::<Candidate>::new()]);
        let stopping = std::time::Instant::now();
        drop(walker);
        assert!(
            stopping.elapsed() < Duration::from_secs(10),
            "dropping the walker waited out its interval"
        );
    }

    #[test]
    fn reads_own_identity() {
        let pid = std::process::id();
        // SAFETY: getuid cannot fail.
        assert_eq!(process_uid(pid), Some(unsafe { libc::getuid() }));
        assert!(!process_comm(pid).is_empty());
        let pidfd = pidfd_open(pid).unwrap();
        assert!(!has_exited(&pidfd));
        assert!(matches!(pidfd_open(4_194_305), Err(AttachError::Gone(_))));
    }
}
