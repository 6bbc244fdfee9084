//! Tracepoint record layouts, read from tracefs, for the sched programs'
//! configuration map.

use std::io;
use std::path::{Path, PathBuf};

use subetha_probes::SchedConfig;

/// Where tracefs usually is.
const TRACEFS_PATHS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Task state bits kept from `sched_switch`'s `prev_state` (everything up
/// to `TASK_REPORT_IDLE`, 0x80; the preempted marker `TASK_REPORT_MAX`,
/// 0x100, is dropped so a preempted task reads as runnable).
const STATE_MASK: u64 = 0xff;

/// The tracefs root with an `events` directory, mounting tracefs on
/// `/sys/kernel/tracing` when nothing is there yet (root only; a failure
/// just means no tracefs).
pub fn tracefs_root() -> io::Result<PathBuf> {
    if let Some(root) = find_root() {
        return Ok(root);
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: all pointers are NUL-terminated C strings that outlive the
    // call; no data argument.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        tracing::info!("mounted tracefs on /sys/kernel/tracing");
    }
    find_root().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "tracefs not found (tried {}; mounting it: {})",
                TRACEFS_PATHS.join(", "),
                if rc == 0 {
                    "mounted but empty".to_string()
                } else {
                    io::Error::last_os_error().to_string()
                }
            ),
        )
    })
}

fn find_root() -> Option<PathBuf> {
    TRACEFS_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|root| root.join("events").is_dir())
}

/// One field of a tracepoint record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Field name.
    pub name: String,
    /// Offset from the start of the record.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

/// Parses the `format` file of a tracepoint: its fields.
pub fn parse_format(text: &str) -> Vec<Field> {
    text.lines().filter_map(parse_field_line).collect()
}

fn parse_field_line(line: &str) -> Option<Field> {
    // "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;"
    let mut declaration = None;
    let mut offset = None;
    let mut size = None;
    for part in line.trim().split(';') {
        let part = part.trim();
        if let Some(rest) = part.strip_prefix("field:") {
            declaration = Some(rest);
        } else if let Some(rest) = part.strip_prefix("offset:") {
            offset = rest.trim().parse().ok();
        } else if let Some(rest) = part.strip_prefix("size:") {
            size = rest.trim().parse().ok();
        }
    }
    let declaration = declaration?;
    // The name is the last word, without an array suffix: "char comm[16]",
    // "__data_loc char[] comm", "pid_t pid".
    let last = declaration.split_whitespace().last()?;
    let name = last.split('[').next()?.trim_start_matches('*');
    if name.is_empty() {
        return None;
    }
    Some(Field {
        name: name.to_string(),
        offset: offset?,
        size: size?,
    })
}

/// Why the sched tracepoints' record layout is unknown.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// A `format` file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// An event lacks a field.
    #[error("{event}: no field {field}")]
    NoField {
        /// The event.
        event: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A field has a size the programs cannot read.
    #[error("{event}: field {field} has size {size}, expected {expected:?}")]
    Size {
        /// The event.
        event: &'static str,
        /// The field.
        field: &'static str,
        /// Its size.
        size: u32,
        /// The sizes the programs read.
        expected: &'static [u32],
    },
}

fn read_format(root: &Path, category: &str, event: &str) -> Result<Vec<Field>, LayoutError> {
    let path = root.join("events").join(category).join(event).join("format");
    let text = std::fs::read_to_string(&path).map_err(|source| LayoutError::Read { path, source })?;
    Ok(parse_format(&text))
}

fn field(
    fields: &[Field],
    event: &'static str,
    name: &'static str,
    sizes: &'static [u32],
) -> Result<Field, LayoutError> {
    let found = fields
        .iter()
        .find(|f| f.name == name)
        .ok_or(LayoutError::NoField { event, field: name })?;
    if !sizes.contains(&found.size) {
        return Err(LayoutError::Size {
            event,
            field: name,
            size: found.size,
            expected: sizes,
        });
    }
    Ok(found.clone())
}

/// The sched programs' configuration from the four `format` files, with
/// `enabled` set.
pub fn sched_config(root: &Path) -> Result<SchedConfig, LayoutError> {
    let switch = read_format(root, "sched", "sched_switch")?;
    let wakeup = read_format(root, "sched", "sched_wakeup")?;
    let wakeup_new = read_format(root, "sched", "sched_wakeup_new")?;
    let migrate = read_format(root, "sched", "sched_migrate_task")?;
    sched_config_from(&switch, &wakeup, &wakeup_new, &migrate)
}

/// [`sched_config`] from parsed formats.
pub fn sched_config_from(
    switch: &[Field],
    wakeup: &[Field],
    wakeup_new: &[Field],
    migrate: &[Field],
) -> Result<SchedConfig, LayoutError> {
    let prev_state = field(switch, "sched_switch", "prev_state", &[4, 8])?;
    Ok(SchedConfig {
        enabled: 1,
        switch_prev_comm: field(switch, "sched_switch", "prev_comm", &[16])?.offset,
        switch_prev_pid: field(switch, "sched_switch", "prev_pid", &[4])?.offset,
        switch_prev_state: prev_state.offset,
        switch_prev_state_size: prev_state.size,
        switch_next_comm: field(switch, "sched_switch", "next_comm", &[16])?.offset,
        switch_next_pid: field(switch, "sched_switch", "next_pid", &[4])?.offset,
        wakeup_pid: field(wakeup, "sched_wakeup", "pid", &[4])?.offset,
        wakeup_new_pid: field(wakeup_new, "sched_wakeup_new", "pid", &[4])?.offset,
        migrate_pid: field(migrate, "sched_migrate_task", "pid", &[4])?.offset,
        migrate_orig_cpu: field(migrate, "sched_migrate_task", "orig_cpu", &[4])?.offset,
        migrate_dest_cpu: field(migrate, "sched_migrate_task", "dest_cpu", &[4])?.offset,
        state_mask: STATE_MASK,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCH: &str = "name: sched_switch
ID: 372
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;

print fmt: \"prev_comm=%s prev_pid=%d\", REC->prev_comm, REC->prev_pid
";

    const WAKEUP: &str = "format:
\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:int target_cpu;\toffset:32;\tsize:4;\tsigned:1;
";

    const MIGRATE: &str = "format:
\tfield:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:16;\tsize:4;\tsigned:1;
\tfield:int orig_cpu;\toffset:20;\tsize:4;\tsigned:1;
\tfield:int dest_cpu;\toffset:24;\tsize:4;\tsigned:1;
";

    #[test]
    fn parses_formats_into_offsets() {
        let switch = parse_format(SWITCH);
        assert_eq!(switch.len(), 11);
        assert_eq!(
            switch[4],
            Field {
                name: "prev_comm".into(),
                offset: 8,
                size: 16
            }
        );
        let migrate = parse_format(MIGRATE);
        assert_eq!(migrate[0].name, "comm");
        let wakeup = parse_format(WAKEUP);
        let config = sched_config_from(&switch, &wakeup, &wakeup, &migrate).unwrap();
        assert_eq!(config.enabled, 1);
        assert_eq!(
            (
                config.switch_prev_comm,
                config.switch_prev_pid,
                config.switch_prev_state
            ),
            (8, 24, 32)
        );
        assert_eq!(config.switch_prev_state_size, 8);
        assert_eq!((config.switch_next_comm, config.switch_next_pid), (40, 56));
        assert_eq!((config.wakeup_pid, config.wakeup_new_pid), (24, 24));
        assert_eq!(
            (
                config.migrate_pid,
                config.migrate_orig_cpu,
                config.migrate_dest_cpu
            ),
            (12, 20, 24)
        );
        let error = sched_config_from(&switch, &switch, &wakeup, &migrate).unwrap_err();
        assert!(error.to_string().contains("sched_wakeup"), "{error}");
    }

    #[test]
    fn this_hosts_formats_parse() {
        let Ok(root) = tracefs_root() else {
            eprintln!("skipping: no tracefs here");
            return;
        };
        let config = sched_config(&root).unwrap();
        assert_eq!(config.enabled, 1);
    }
}
