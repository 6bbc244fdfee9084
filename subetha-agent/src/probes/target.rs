//! Finding the object that defines the hook symbols in a process, and the
//! file offsets the uprobes attach to.
//!
//! The executable usually links subetha-core statically and so defines the
//! hooks itself; an application that loads subetha-core as a shared object
//! defines them there instead. Both are read through `/proc/<pid>`
//! (`exe`, then the `map_files` link of each mapped file), which names the
//! exact inode the process runs even when the file on disk was replaced or
//! lives in another mount namespace. The kernel attaches uprobes to that
//! inode, so the path handed to `perf_event_open` is the same link.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use object::{Object, ObjectKind, ObjectSection, ObjectSymbol};

/// Largest object read to look for the hooks (debug builds of big
/// applications run to a few hundred MiB).
const MAX_OBJECT_BYTES: u64 = 2 << 30;

/// The object holding the hooks in one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookObject {
    /// Path the kernel resolves to the object's inode (a `/proc` link).
    pub path: PathBuf,
    /// What the process maps it as (for messages).
    pub display: String,
    /// File offset of each hook, in [`subetha_probes::program::UPROBES`]
    /// order; `None` for a hook the object does not define.
    pub offsets: [Option<u64>; 4],
}

/// Why no object with the hooks was found in a process.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `/proc/<pid>/exe` or `/proc/<pid>/maps` could not be read.
    #[error("{}: {source}", .path.display())]
    Proc {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No mapped object defines the hook symbols.
    #[error("no mapped object defines the subetha hook symbols (looked in {})", .tried.join(", "))]
    NoHooks {
        /// The objects looked in, with why each could not be read.
        tried: Vec<String>,
    },
}

/// Why an object's symbols could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The file could not be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// It is larger than [`MAX_OBJECT_BYTES`].
    #[error("{0} bytes, too large to read")]
    TooLarge(u64),
    /// It is not an object file `object` can parse.
    #[error(transparent)]
    Parse(#[from] object::Error),
}

/// Finds the object defining the hooks in process `pid`.
pub fn find_hook_object(pid: u32) -> Result<HookObject, TargetError> {
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let exe_name = std::fs::read_link(&exe)
        .map(|p| p.display().to_string())
        .map_err(|source| TargetError::Proc {
            path: exe.clone(),
            source,
        })?;
    let mut tried = Vec::new();
    match hook_offsets(&exe) {
        Ok(Some(offsets)) => {
            return Ok(HookObject {
                path: exe,
                display: exe_name,
                offsets,
            });
        }
        Ok(None) => tried.push(exe_name.clone()),
        Err(e) => tried.push(format!("{exe_name} ({e})")),
    }
    let maps_path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&maps_path).map_err(|source| TargetError::Proc {
        path: maps_path.clone().into(),
        source,
    })?;
    let mut seen = HashSet::new();
    seen.insert(exe_name.clone());
    for (range, file) in mapped_files(&maps) {
        if !seen.insert(file.to_string()) {
            continue;
        }
        let link = PathBuf::from(format!("/proc/{pid}/map_files/{range}"));
        match hook_offsets(&link) {
            Ok(Some(offsets)) => {
                return Ok(HookObject {
                    path: link,
                    display: file.to_string(),
                    offsets,
                });
            }
            Ok(None) => tried.push(file.to_string()),
            Err(e) => tried.push(format!("{file} ({e})")),
        }
    }
    Err(TargetError::NoHooks { tried })
}

/// `(address range, path)` of each executable file mapping, in order.
fn mapped_files(maps: &str) -> impl Iterator<Item = (&str, &str)> {
    maps.lines().filter_map(|line| {
        // "7f..-7f.. r-xp 00000000 08:01 1234   /usr/lib/libfoo.so"
        // The path is the rest of the line from its first '/' (no earlier
        // field has one; a path may contain spaces).
        let mut fields = line.split_whitespace();
        let range = fields.next()?;
        let perms = fields.next()?;
        let path = line.find('/').map(|at| line[at..].trim_end())?;
        (perms.contains('x') && !path.ends_with(" (deleted)")).then_some((range, path))
    })
}

/// File offsets of the four hooks in the ELF object at `path`; `None`
/// when it defines none of them.
pub fn hook_offsets(path: &Path) -> Result<Option<[Option<u64>; 4]>, ObjectError> {
    let size = std::fs::metadata(path)?.len();
    if size > MAX_OBJECT_BYTES {
        return Err(ObjectError::TooLarge(size));
    }
    let data = std::fs::read(path)?;
    let file = object::File::parse(&*data)?;
    let mut offsets = [None; 4];
    for (index, (_, symbol)) in subetha_probes::program::UPROBES.iter().enumerate() {
        offsets[index] = symbol_file_offset(&file, symbol);
    }
    Ok(offsets.iter().any(Option::is_some).then_some(offsets))
}

/// Where a defined function symbol lives in the file: its address
/// translated through its section, as uprobes want.
fn symbol_file_offset(file: &object::File<'_>, name: &str) -> Option<u64> {
    let symbol = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.is_definition() && s.name() == Ok(name))?;
    match file.kind() {
        ObjectKind::Executable | ObjectKind::Dynamic => {
            let section = file.section_by_index(symbol.section_index()?).ok()?;
            let (section_offset, _) = section.file_range()?;
            symbol
                .address()
                .checked_sub(section.address())?
                .checked_add(section_offset)
        }
        _ => Some(symbol.address()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_executable_defines_every_hook() {
        // Keep the hooks linked into this test binary.
        let _ = subetha_core::hooks::HOOK_SYMBOLS;
        subetha_core::hooks::subetha_scan_begin(0, 0);
        let object = find_hook_object(std::process::id()).unwrap();
        assert!(object.path.ends_with("exe"), "{object:?}");
        assert!(object.offsets.iter().all(Option::is_some), "{object:?}");
        let distinct: HashSet<u64> = object.offsets.iter().flatten().copied().collect();
        assert_eq!(distinct.len(), 4, "hooks must not be folded together: {object:?}");
    }

    #[test]
    fn maps_lines_yield_executable_file_mappings() {
        let maps = "\
55d0-55d1 r--p 00000000 08:01 11 /usr/bin/app
55d1-55d2 r-xp 00001000 08:01 11 /usr/bin/app
7f00-7f01 r-xp 00000000 08:01 12 /usr/lib/libsubetha.so
7f02-7f03 rw-p 00000000 00:00 0
7f04-7f05 r-xp 00000000 00:00 0 [vdso]
7f06-7f07 r-xp 00000000 08:01 13 /tmp/old.so (deleted)
7f08-7f09 r-xp 00000000 08:01 14     /opt/my app/lib.so
";
        let files: Vec<_> = mapped_files(maps).collect();
        assert_eq!(
            files,
            vec![
                ("55d1-55d2", "/usr/bin/app"),
                ("7f00-7f01", "/usr/lib/libsubetha.so"),
                ("7f08-7f09", "/opt/my app/lib.so")
            ]
        );
    }
}
