//! What `/proc` says about a process's descriptors and mappings.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Prefix of the `/proc/<pid>/fd/<n>` link of a subetha segment's memfd.
pub const MEMFD_LINK_PREFIX: &str = "/memfd:subetha";

/// A file's identity: `(st_dev, st_ino)`.
pub type FileId = (u64, u64);

/// `pid`'s open descriptors with their link targets (`"self"` for this
/// process). Descriptors that vanish while listing are skipped.
pub fn fds(pid: &str) -> Vec<(i32, PathBuf)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Ok(target) = std::fs::read_link(entry.path()) {
            out.push((fd, target));
        }
    }
    out.sort();
    out
}

/// Descriptors of `pid` whose link starts with [`MEMFD_LINK_PREFIX`].
pub fn subetha_memfds(pid: &str) -> Vec<i32> {
    fds(pid)
        .into_iter()
        .filter(|(_, target)| target.to_string_lossy().starts_with(MEMFD_LINK_PREFIX))
        .map(|(fd, _)| fd)
        .collect()
}

/// The identity of the file behind `/proc/<pid>/fd/<fd>`, if it is open.
pub fn fd_file_id(pid: &str, fd: i32) -> Option<FileId> {
    let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// Identities of every file `pid` has open (descriptors only).
pub fn open_file_ids(pid: &str) -> Vec<(i32, FileId)> {
    fds(pid)
        .into_iter()
        .filter_map(|(fd, _)| fd_file_id(pid, fd).map(|id| (fd, id)))
        .collect()
}

/// Lines of `/proc/<pid>/maps` that map the file with inode `ino` whose
/// path contains `name` (e.g. `memfd:subetha`).
pub fn maps_of_inode(pid: &str, name: &str, ino: u64) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter(|line| line.contains(name))
        .filter(|line| {
            line.split_ascii_whitespace()
                .nth(4)
                .and_then(|i| i.parse::<u64>().ok())
                == Some(ino)
        })
        .map(str::to_owned)
        .collect()
}

/// Every process descended from `root` (children first, then theirs),
/// from the parent pids in `/proc/*/stat`.
pub fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // Field 4 (ppid) is the second after the command's ')'.
            let ppid = stat[stat.rfind(')')? + 1..]
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        found.extend(
            parents
                .iter()
                .filter(|&&(_, ppid)| ppid == parent)
                .map(|&(pid, _)| pid),
        );
        index += 1;
    }
    found.remove(0);
    found
}
