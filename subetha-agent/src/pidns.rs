//! Pid and user namespaces: what a process's ids are in its own namespaces,
//! so that a segment created in a container is checked against the ids it
//! was created with, and its threads are shown by the ids the agent (and the
//! kernel's probes) know.
//!
//! The agent lives in the host pid namespace; an application in a container
//! sees other numbers. `/proc/<pid>/status` lists them: `NSpid:` holds the
//! process's pid in every pid namespace from the reader's down to its own
//! (the last is what `getpid` returned to it, and what its segment header
//! says), `/proc/<pid>/ns/pid` names its namespace by inode, and
//! `/proc/<pid>/uid_map` translates its user namespace's uids to ours. A
//! thread's `/proc/<pid>/task/<tid>/status` has the same `NSpid:` line,
//! which is how [`TidMap`] turns the `gettid` values a producer recorded
//! into host thread ids. All of it is read from `/proc`: no namespace is
//! entered and nothing has to be mounted.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// A process's place in the pid namespaces, as read from `/proc/<pid>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidNamespace {
    /// `NSpid:`: the pid in our namespace first, in its own last (one entry
    /// when it shares ours).
    pub nspid: Vec<u32>,
    /// The inode of its pid namespace (`/proc/<pid>/ns/pid`).
    pub inode: u64,
    /// Whether that is another namespace than the agent's.
    pub foreign: bool,
}

impl PidNamespace {
    /// Reads `pid`'s namespace facts. `None` if the process is gone or not
    /// ours to inspect.
    pub fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        // Kernels before 4.1 have no NSpid line: no namespaces to speak of.
        let nspid = parse_nspid(&status).unwrap_or_else(|| vec![pid]);
        let inode = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino();
        let own = std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino());
        Some(Self {
            foreign: own != Some(inode) || nspid.len() > 1,
            nspid,
            inode,
        })
    }

    /// The pid the process has in its own namespace (what its segment
    /// header records).
    pub fn own_pid(&self) -> u32 {
        self.nspid.last().copied().unwrap_or(0)
    }

    /// `NSpid` as `/proc` prints it (`19577 1`).
    pub fn describe(&self) -> String {
        let ids: Vec<String> = self.nspid.iter().map(u32::to_string).collect();
        ids.join(" ")
    }
}

/// The ids of the `NSpid:` line of a `/proc/<pid>/status` text.
pub fn parse_nspid(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let ids: Option<Vec<u32>> = line.split_whitespace().map(|w| w.parse().ok()).collect();
    ids.filter(|ids| !ids.is_empty())
}

/// One line of a `uid_map`: `count` ids from `inside` map to `outside`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    inside: u32,
    outside: u32,
    count: u32,
}

/// A user namespace's `uid_map` as the agent reads it: the first column is
/// the process's uid, the second ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UidMap(Vec<Extent>);

impl UidMap {
    /// `/proc/<pid>/uid_map` (identity if unreadable: no user namespaces).
    pub fn of(pid: u32) -> Self {
        std::fs::read_to_string(format!("/proc/{pid}/uid_map"))
            .ok()
            .and_then(|text| Self::parse(&text))
            .unwrap_or_else(Self::identity)
    }

    /// The map of the initial user namespace.
    pub fn identity() -> Self {
        Self(vec![Extent {
            inside: 0,
            outside: 0,
            count: u32::MAX,
        }])
    }

    /// Parses `uid_map` text; `None` if a line is malformed.
    pub fn parse(text: &str) -> Option<Self> {
        let mut extents = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut words = line.split_whitespace().map(|w| w.parse::<u32>().ok());
            let (Some(Some(inside)), Some(Some(outside)), Some(Some(count)), None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return None;
            };
            extents.push(Extent {
                inside,
                outside,
                count,
            });
        }
        Some(Self(extents))
    }

    /// The process's uid for our uid `outside`, if its namespace maps it.
    pub fn to_inside(&self, outside: u32) -> Option<u32> {
        self.0.iter().find_map(|e| {
            let offset = outside.checked_sub(e.outside)?;
            (offset < e.count).then(|| e.inside + offset)
        })
    }

    /// Whether this is the identity map (the process shares our user
    /// namespace's ids).
    pub fn is_identity(&self) -> bool {
        self.0.iter().all(|e| e.inside == e.outside)
    }
}

/// Threads whose mapping is remembered after they are gone (their storms
/// are still shown) before stale entries are dropped.
const TID_HISTORY: usize = 4096;
/// Shortest pause between two walks of a process's tasks on a miss.
const TID_REFRESH: Duration = Duration::from_millis(20);

/// Maps the thread ids a process in another pid namespace recorded
/// (`gettid` there) to ours, from `/proc/<pid>/task/*/status`.
///
/// A walk reads the status of each task not mapped yet (a readdir plus one
/// small read per new thread) and happens only on a miss, at most every
/// [`TID_REFRESH`]: a thread that lives shorter than that may stay
/// unmapped, and is then shown with its namespace tid only.
#[derive(Debug)]
pub struct TidMap {
    pid: u32,
    to_host: HashMap<u32, u32>,
    host_seen: HashSet<u32>,
    last_walk: Option<Instant>,
    /// Walks made (for tests and the cost statement above).
    pub walks: u64,
}

impl TidMap {
    /// An empty map for host pid `pid`.
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            to_host: HashMap::new(),
            host_seen: HashSet::new(),
            last_walk: None,
            walks: 0,
        }
    }

    /// Our tid for the thread the process knows as `ns_tid`.
    pub fn host_tid(&mut self, ns_tid: u32) -> Option<u32> {
        if let Some(&tid) = self.to_host.get(&ns_tid) {
            return Some(tid);
        }
        if self.last_walk.is_some_and(|at| at.elapsed() < TID_REFRESH) {
            return None;
        }
        self.walk();
        self.to_host.get(&ns_tid).copied()
    }

    fn walk(&mut self) {
        self.last_walk = Some(Instant::now());
        self.walks += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return;
        };
        let mut live = HashSet::new();
        for task in tasks.flatten() {
            let Some(host) = task.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            live.insert(host);
            if self.host_seen.contains(&host) {
                continue;
            }
            let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
                continue;
            };
            // The first entry is the tid in our namespace: it must be the
            // directory's name, or this is not the thread we think.
            if let Some(ids) = parse_nspid(&status)
                && ids.first() == Some(&host)
                && let Some(&inner) = ids.last()
            {
                self.to_host.insert(inner, host);
                self.host_seen.insert(host);
            }
        }
        if self.to_host.len() > TID_HISTORY {
            self.to_host.retain(|_, host| live.contains(host));
            self.host_seen.retain(|host| live.contains(host));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lines_from_real_status_files() {
        // A host process, one in a container, one nested two deep.
        assert_eq!(
            parse_nspid("Name:\tbash\nNSpid:\t812\nNSpgid:\t812\n"),
            Some(vec![812])
        );
        assert_eq!(
            parse_nspid("Tgid:\t19577\nNgid:\t0\nPid:\t19577\nPPid:\t19576\nNSpid:\t19577\t1\n"),
            Some(vec![19577, 1])
        );
        assert_eq!(parse_nspid("NSpid:\t30211\t57\t1\n"), Some(vec![30211, 57, 1]));
        // No line (kernel < 4.1), or garbage: nothing.
        assert_eq!(parse_nspid("Name:\tx\nPid:\t5\n"), None);
        assert_eq!(parse_nspid("NSpid:\t12\tx\n"), None);
        assert_eq!(parse_nspid("NSpid:\n"), None);
    }

    #[test]
    fn our_own_namespace_is_not_foreign() {
        let own = PidNamespace::of(std::process::id()).unwrap();
        assert_eq!(own.nspid.first(), Some(&std::process::id()));
        // The test runs on the host (CI) or in a container: either way our
        // namespace is ours.
        assert_eq!(own.inode, std::fs::metadata("/proc/self/ns/pid").unwrap().ino());
        assert_eq!(own.foreign, own.nspid.len() > 1);
        assert!(PidNamespace::of(4_194_305).is_none());
    }

    #[test]
    fn uid_maps_translate_only_what_they_map() {
        let host = UidMap::parse("         0          0 4294967295\n").unwrap();
        assert!(host.is_identity());
        assert_eq!(host.to_inside(1000), Some(1000));
        // Rootless podman: the user's uid is root inside, subuids follow.
        let rootless = UidMap::parse("0 1000 1\n1 100000 65536\n").unwrap();
        assert!(!rootless.is_identity());
        assert_eq!(rootless.to_inside(1000), Some(0));
        assert_eq!(rootless.to_inside(100_000), Some(1));
        assert_eq!(rootless.to_inside(165_535), Some(65536));
        assert_eq!(rootless.to_inside(165_536), None);
        assert_eq!(rootless.to_inside(0), None);
        // `unshare --user --map-user=1000` run by root.
        assert_eq!(UidMap::parse("1000 0 1").unwrap().to_inside(0), Some(1000));
        assert_eq!(UidMap::parse("0 0"), None);
        assert_eq!(UidMap::parse("0 0 1 9"), None);
    }

    #[test]
    fn our_own_threads_map_to_themselves() {
        let pid = std::process::id();
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            // SAFETY: as above.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = stop_rx.recv();
        });
        let other_tid = rx.recv().unwrap();
        let mut map = TidMap::new(pid);
        // In our own namespace the innermost tid is the host tid.
        let own_ns = PidNamespace::of(pid).unwrap();
        if own_ns.nspid.len() == 1 {
            assert_eq!(map.host_tid(me), Some(me));
            assert_eq!(map.host_tid(other_tid), Some(other_tid));
            assert_eq!(map.walks, 1, "the second lookup is served from the first walk");
        }
        // A miss walks at most every TID_REFRESH.
        let walks = map.walks;
        assert_eq!(map.host_tid(4_194_305), None);
        assert_eq!(map.host_tid(4_194_305), None);
        assert!(map.walks <= walks + 1);
        stop_tx.send(()).unwrap();
        other.join().unwrap();
    }
}
