//! The `task_struct` field offsets the BTF tracepoints need, read from the
//! kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! The BTF tracepoints get `task_struct` pointers and load `pid`, `comm`,
//! `cpu`, `se.exec_start` and `sched_info`'s runqueue wait directly (and
//! the runqueue clock through `se.cfs_rq->rq->clock`); the offsets differ between kernel builds, so they are
//! looked up here at load time and handed to the programs as read-only
//! globals. Only what that needs is parsed: the type section's records (to
//! step over every kind), structs and unions with their members, and the
//! typedef/qualifier chains and arrays behind a member's type, to check the
//! field has the size the programs read.
//!
//! Why not a library: aya-obj parses BTF but keeps type lookup private to
//! the crate, and the one maintained reader on crates.io (btf-rs) is
//! LGPL-licensed, which this MIT/Apache project does not take on for a
//! hundred lines of format walking. The input is the kernel's own file, but
//! every read is still bounds-checked: a malformed blob is an error, never a
//! panic.

use std::path::{Path, PathBuf};

/// Where the running kernel publishes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Offsets in `struct task_struct`, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `pid_t pid` (4 bytes).
    pub pid: u32,
    /// `char comm[16]`.
    pub comm: u32,
    /// `unsigned int cpu` (4 bytes): the CPU the task is on.
    pub cpu: u32,
    /// `se.exec_start` (`u64`): the runqueue task clock when the task was
    /// last picked or accounted.
    pub exec_start: u32,
    /// `sched_info.run_delay` (`u64`): ns waited on runqueues so far.
    pub run_delay: u32,
    /// `sched_info.last_queued` (`u64`): the runqueue clock when queued.
    pub last_queued: u32,
    /// `sched_info.last_arrival` (`u64`): the runqueue clock when it last
    /// got a CPU.
    pub last_arrival: u32,
    /// `se.cfs_rq` (pointer).
    pub cfs_rq: u32,
    /// `rq` in `struct cfs_rq` (pointer).
    pub cfs_rq_rq: u32,
    /// `clock` in `struct rq` (`u64`).
    pub rq_clock: u32,
}

/// Why the offsets could not be read from BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be read.
    #[error("{}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A BTF file's content is not what [`TaskOffsets`] needs.
    #[error("{}: {source}", .path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with its content.
        #[source]
        source: Box<BtfError>,
    },
    /// The bytes are not well-formed BTF, or lack a struct, a member or
    /// the size expected of it (the message says which).
    #[error("{0}")]
    Content(String),
}

impl From<String> for BtfError {
    fn from(message: String) -> Self {
        Self::Content(message)
    }
}

impl From<&str> for BtfError {
    fn from(message: &str) -> Self {
        Self::Content(message.to_string())
    }
}

impl TaskOffsets {
    /// Reads the offsets from the running kernel's BTF.
    pub fn from_kernel() -> Result<TaskOffsets, BtfError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    /// Reads the offsets from a BTF file.
    pub fn from_file(path: &Path) -> Result<TaskOffsets, BtfError> {
        let bytes = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_btf(&bytes).map_err(|error| BtfError::InFile {
            path: path.to_path_buf(),
            source: Box::new(error),
        })
    }

    /// Reads the offsets from raw BTF bytes.
    pub fn from_btf(bytes: &[u8]) -> Result<TaskOffsets, BtfError> {
        let btf = Btf::parse(bytes)?;
        let task = btf.struct_by_name("task_struct")?;
        let pid = btf.field_offset(task, &["pid"], 4)?;
        let comm = btf.field_offset(task, &["comm"], 16)?;
        // `cpu` is in task_struct itself, or (x86 since 5.16) in its
        // embedded thread_info.
        let cpu = btf.field_offset(task, &["cpu"], 4).or_else(|direct| {
            btf.field_offset(task, &["thread_info", "cpu"], 4)
                .map_err(|_| direct)
        })?;
        let exec_start = btf.field_offset(task, &["se", "exec_start"], 8)?;
        let run_delay = btf.field_offset(task, &["sched_info", "run_delay"], 8)?;
        let last_queued = btf.field_offset(task, &["sched_info", "last_queued"], 8)?;
        let last_arrival = btf.field_offset(task, &["sched_info", "last_arrival"], 8)?;
        let cfs_rq = btf.field_offset(task, &["se", "cfs_rq"], 8)?;
        let cfs_rq_rq = btf.field_offset(btf.struct_by_name("cfs_rq")?, &["rq"], 8)?;
        let rq_clock = btf.field_offset(btf.struct_by_name("rq")?, &["clock"], 8)?;
        Ok(TaskOffsets {
            pid,
            comm,
            cpu,
            exec_start,
            run_delay,
            last_queued,
            last_arrival,
            cfs_rq,
            cfs_rq_rq,
            rq_clock,
        })
    }
}

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
/// Nesting followed through anonymous members and type chains.
const MAX_DEPTH: u32 = 32;

/// BTF kinds (`BTF_KIND_*`).
mod kind {
    pub const INT: u32 = 1;
    pub const PTR: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const FWD: u32 = 7;
    pub const TYPEDEF: u32 = 8;
    pub const VOLATILE: u32 = 9;
    pub const CONST: u32 = 10;
    pub const RESTRICT: u32 = 11;
    pub const FUNC: u32 = 12;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const FLOAT: u32 = 16;
    pub const DECL_TAG: u32 = 17;
    pub const TYPE_TAG: u32 = 18;
    pub const ENUM64: u32 = 19;
}

/// One type record: its common part and where its kind-specific data is.
#[derive(Clone, Copy, Debug)]
struct TypeRecord {
    name_off: u32,
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    /// `size` or `type`, depending on the kind.
    size_or_type: u32,
    /// Offset of the kind-specific data in the type section.
    data: usize,
}

#[derive(Clone, Copy, Debug)]
struct Member {
    type_id: u32,
    byte_offset: u32,
}

struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Records by type id (index 0 is the `void` placeholder).
    records: Vec<TypeRecord>,
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

impl<'a> Btf<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        let truncated = || BtfError::from("truncated BTF header");
        if u16_at(bytes, 0).ok_or_else(truncated)? != MAGIC {
            return Err("not BTF (bad magic, or not little-endian)".into());
        }
        let header_len = u32_at(bytes, 4).ok_or_else(truncated)? as usize;
        if header_len < HEADER_LEN {
            return Err(format!("BTF header of {header_len} bytes is too short").into());
        }
        let section = |off_at: usize, len_at: usize, what: &str| -> Result<&'a [u8], BtfError> {
            let off = u32_at(bytes, off_at).ok_or_else(truncated)? as usize;
            let len = u32_at(bytes, len_at).ok_or_else(truncated)? as usize;
            header_len
                .checked_add(off)
                .and_then(|start| bytes.get(start..start.checked_add(len)?))
                .ok_or_else(|| format!("BTF {what} section out of bounds").into())
        };
        let types = section(8, 12, "type")?;
        let strings = section(16, 20, "string")?;
        let mut records = vec![TypeRecord {
            name_off: 0,
            kind: 0,
            vlen: 0,
            kind_flag: false,
            size_or_type: 0,
            data: 0,
        }];
        let mut at = 0;
        while at < types.len() {
            let bad = || format!("truncated BTF type record at byte {at}");
            let name_off = u32_at(types, at).ok_or_else(bad)?;
            let info = u32_at(types, at + 4).ok_or_else(bad)?;
            let size_or_type = u32_at(types, at + 8).ok_or_else(bad)?;
            let (kind, vlen) = ((info >> 24) & 0x1f, info & 0xffff);
            let extra = match kind {
                kind::INT | kind::VAR | kind::DECL_TAG => 4,
                kind::PTR
                | kind::FWD
                | kind::TYPEDEF
                | kind::VOLATILE
                | kind::CONST
                | kind::RESTRICT
                | kind::FUNC
                | kind::FLOAT
                | kind::TYPE_TAG => 0,
                kind::ARRAY => 12,
                kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => 12 * vlen as usize,
                kind::ENUM | kind::FUNC_PROTO => 8 * vlen as usize,
                other => return Err(format!("unknown BTF kind {other} at byte {at}").into()),
            };
            records.push(TypeRecord {
                name_off,
                kind,
                vlen,
                kind_flag: info >> 31 == 1,
                size_or_type,
                data: at + 12,
            });
            at += 12 + extra;
        }
        if at != types.len() {
            return Err("BTF type section ends inside a record".into());
        }
        Ok(Btf {
            types,
            strings,
            records,
        })
    }

    fn name(&self, offset: u32) -> Result<&'a str, BtfError> {
        let tail = self
            .strings
            .get(offset as usize..)
            .ok_or_else(|| format!("BTF string offset {offset} out of bounds"))?;
        let end = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or("unterminated BTF string")?;
        std::str::from_utf8(&tail[..end]).map_err(|_| "BTF string is not UTF-8".into())
    }

    fn record(&self, id: u32) -> Result<&TypeRecord, BtfError> {
        self.records
            .get(id as usize)
            .ok_or_else(|| format!("BTF type id {id} out of range").into())
    }

    /// The one complete struct called `name` (forward declarations have no
    /// members and are skipped).
    fn struct_by_name(&self, name: &str) -> Result<u32, BtfError> {
        for (id, record) in self.records.iter().enumerate().skip(1) {
            if record.kind == kind::STRUCT && record.vlen > 0 && self.name(record.name_off)? == name {
                return Ok(id as u32);
            }
        }
        Err(format!("no struct {name} in the BTF").into())
    }

    /// Member `name` of struct/union `id`, looking into anonymous struct and
    /// union members; its offset is from the start of `id`.
    fn find_member(&self, id: u32, name: &str, depth: u32) -> Result<Option<Member>, BtfError> {
        if depth > MAX_DEPTH {
            return Err("BTF nesting too deep".into());
        }
        let record = *self.record(id)?;
        if record.kind != kind::STRUCT && record.kind != kind::UNION {
            return Ok(None);
        }
        for index in 0..record.vlen as usize {
            let at = record.data + 12 * index;
            let bad = || "truncated BTF member".to_string();
            let member_name = u32_at(self.types, at).ok_or_else(bad)?;
            let type_id = u32_at(self.types, at + 4).ok_or_else(bad)?;
            let offset = u32_at(self.types, at + 8).ok_or_else(bad)?;
            let bit_offset = if record.kind_flag {
                offset & 0x00ff_ffff
            } else {
                offset
            };
            let bitfield = record.kind_flag && offset >> 24 != 0;
            if member_name == 0 {
                if let Some(inner) = self.find_member(type_id, name, depth + 1)? {
                    return Ok(Some(Member {
                        type_id: inner.type_id,
                        byte_offset: bit_offset / 8 + inner.byte_offset,
                    }));
                }
            } else if self.name(member_name)? == name {
                if bitfield || bit_offset % 8 != 0 {
                    return Err(format!("member `{name}` is a bitfield").into());
                }
                return Ok(Some(Member {
                    type_id,
                    byte_offset: bit_offset / 8,
                }));
            }
        }
        Ok(None)
    }

    /// Offset of the field at `path` (member names, each in the struct the
    /// previous one is) in struct `id`, checking it is `size` bytes.
    fn field_offset(&self, id: u32, path: &[&str], size: u32) -> Result<u32, BtfError> {
        let dotted = path.join(".");
        let owner = self.name(self.record(id)?.name_off)?;
        let mut container = id;
        let mut offset = 0u32;
        let mut member = None;
        for name in path {
            let found = self
                .find_member(self.strip(container, 0)?, name, 0)?
                .ok_or_else(|| format!("struct {owner} has no member `{dotted}`"))?;
            offset = offset
                .checked_add(found.byte_offset)
                .ok_or("BTF offset overflows")?;
            container = found.type_id;
            member = Some(found);
        }
        let member = member.ok_or("empty field path")?;
        let actual = self.size_of(member.type_id, 0)?;
        if actual != size {
            return Err(format!("{owner}.{dotted} is {actual} bytes, expected {size}").into());
        }
        Ok(offset)
    }

    /// Type `id` without typedefs and qualifiers.
    fn strip(&self, id: u32, depth: u32) -> Result<u32, BtfError> {
        if depth > MAX_DEPTH {
            return Err("BTF type chain too long".into());
        }
        let record = *self.record(id)?;
        match record.kind {
            kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG => {
                self.strip(record.size_or_type, depth + 1)
            }
            _ => Ok(id),
        }
    }

    /// Size in bytes of type `id`, through typedefs and qualifiers.
    fn size_of(&self, id: u32, depth: u32) -> Result<u32, BtfError> {
        if depth > MAX_DEPTH {
            return Err("BTF type chain too long".into());
        }
        let record = *self.record(id)?;
        match record.kind {
            kind::INT | kind::STRUCT | kind::UNION | kind::ENUM | kind::ENUM64 | kind::FLOAT => {
                Ok(record.size_or_type)
            }
            kind::PTR => Ok(8),
            kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG => {
                self.size_of(record.size_or_type, depth + 1)
            }
            kind::ARRAY => {
                let bad = || "truncated BTF array".to_string();
                let element = u32_at(self.types, record.data).ok_or_else(bad)?;
                let count = u32_at(self.types, record.data + 8).ok_or_else(bad)?;
                self.size_of(element, depth + 1)?
                    .checked_mul(count)
                    .ok_or_else(|| "BTF array size overflows".into())
            }
            other => Err(format!("BTF type {id} (kind {other}) has no size").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BTF blob builder for the tests.
    #[derive(Default)]
    struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
        next_id: u32,
    }

    impl Builder {
        fn new() -> Self {
            Builder {
                strings: vec![0],
                next_id: 1,
                ..Default::default()
            }
        }

        fn string(&mut self, s: &str) -> u32 {
            let at = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            at
        }

        fn record(&mut self, name: &str, kind: u32, vlen: u32, size_or_type: u32, extra: &[u32]) -> u32 {
            let name_off = if name.is_empty() { 0 } else { self.string(name) };
            for word in [name_off, (kind << 24) | vlen, size_or_type].iter().chain(extra) {
                self.types.extend_from_slice(&word.to_le_bytes());
            }
            self.next_id += 1;
            self.next_id - 1
        }

        fn int(&mut self, name: &str, size: u32) -> u32 {
            self.record(name, kind::INT, 0, size, &[size * 8])
        }

        fn members(&mut self, members: &[(&str, u32, u32)]) -> Vec<u32> {
            let mut words = Vec::new();
            for &(name, type_id, byte_offset) in members {
                words.push(if name.is_empty() { 0 } else { self.string(name) });
                words.push(type_id);
                words.push(byte_offset * 8);
            }
            words
        }

        fn finish(self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.extend_from_slice(&[1, 0]);
            for word in [
                HEADER_LEN as u32,
                0,
                self.types.len() as u32,
                self.types.len() as u32,
                self.strings.len() as u32,
            ] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    /// task_struct { long state; union { int x; pid_t pid; }; char comm[16];
    /// unsigned int cpu; } with pid inside an anonymous union, plus an
    /// earlier forward declaration and an unrelated enum to step over.
    fn sample() -> Vec<u8> {
        let mut b = Builder::new();
        b.record("task_struct", kind::FWD, 0, 0, &[]);
        let int = b.int("int", 4);
        let long = b.int("long", 8);
        let uint = b.int("unsigned int", 4);
        let char_ = b.int("char", 1);
        let pid_t = b.record("pid_t", kind::TYPEDEF, 0, int, &[]);
        let comm = b.record("", kind::ARRAY, 0, 0, &[char_, int, 16]);
        let enum_values = [b.string("A"), 0, b.string("B"), 1];
        b.record("e", kind::ENUM, 2, 4, &enum_values);
        let union_members = b.members(&[("x", int, 0), ("pid", pid_t, 0)]);
        let union = b.record("", kind::UNION, 2, 4, &union_members);
        let u64_ = b.int("u64", 8);
        let runqueue = runqueues(&mut b, u64_);
        let se_members = b.members(&[
            ("load", long, 0),
            ("exec_start", u64_, 8),
            ("cfs_rq", runqueue, 16),
        ]);
        let se = b.record("sched_entity", kind::STRUCT, 3, 24, &se_members);
        let info_members = b.members(&[
            ("run_delay", u64_, 0),
            ("last_arrival", u64_, 8),
            ("last_queued", u64_, 16),
        ]);
        let info = b.record("sched_info", kind::STRUCT, 3, 24, &info_members);
        let task_members = b.members(&[
            ("state", long, 0),
            ("", union, 8),
            ("comm", comm, 16),
            ("cpu", uint, 32),
            ("se", se, 40),
            ("sched_info", info, 64),
        ]);
        b.record("task_struct", kind::STRUCT, 6, 88, &task_members);
        b.finish()
    }

    /// `struct rq { u64 pad; u64 clock; }` and `struct cfs_rq { u64 pad;
    /// struct rq *rq; }`; returns the id of `struct cfs_rq *`.
    fn runqueues(b: &mut Builder, u64_: u32) -> u32 {
        let rq_members = b.members(&[("nr_running", u64_, 0), ("clock", u64_, 8)]);
        let rq = b.record("rq", kind::STRUCT, 2, 16, &rq_members);
        let rq_ptr = b.record("", kind::PTR, 0, rq, &[]);
        let cfs_members = b.members(&[("load", u64_, 0), ("rq", rq_ptr, 8)]);
        let cfs_rq = b.record("cfs_rq", kind::STRUCT, 2, 16, &cfs_members);
        b.record("", kind::PTR, 0, cfs_rq, &[])
    }

    #[test]
    fn finds_members_through_anonymous_unions_and_checks_sizes() {
        let offsets = TaskOffsets::from_btf(&sample()).unwrap();
        assert_eq!(
            offsets,
            TaskOffsets {
                pid: 8,
                comm: 16,
                cpu: 32,
                exec_start: 48,
                run_delay: 64,
                last_queued: 80,
                last_arrival: 72,
                cfs_rq: 56,
                cfs_rq_rq: 8,
                rq_clock: 8,
            }
        );
    }

    #[test]
    fn cpu_may_live_in_the_embedded_thread_info() {
        let mut b = Builder::new();
        let int = b.int("int", 4);
        let long = b.int("long", 8);
        let char_ = b.int("char", 1);
        let comm = b.record("", kind::ARRAY, 0, 0, &[char_, int, 16]);
        let info_members = b.members(&[("flags", long, 0), ("cpu", int, 20)]);
        let info = b.record("thread_info", kind::STRUCT, 2, 24, &info_members);
        let runqueue = runqueues(&mut b, long);
        let se_members = b.members(&[("exec_start", long, 0), ("cfs_rq", runqueue, 8)]);
        let se = b.record("sched_entity", kind::STRUCT, 2, 16, &se_members);
        let sched_info_members = b.members(&[
            ("run_delay", long, 0),
            ("last_queued", long, 8),
            ("last_arrival", long, 16),
        ]);
        let sched_info = b.record("sched_info", kind::STRUCT, 3, 24, &sched_info_members);
        let task_members = b.members(&[
            ("thread_info", info, 0),
            ("pid", int, 24),
            ("comm", comm, 28),
            ("se", se, 48),
            ("sched_info", sched_info, 64),
        ]);
        b.record("task_struct", kind::STRUCT, 5, 88, &task_members);
        assert_eq!(TaskOffsets::from_btf(&b.finish()).unwrap().cpu, 20);
    }

    #[test]
    fn malformed_blobs_are_errors_not_panics() {
        let good = sample();
        for len in 0..good.len() {
            let _ = TaskOffsets::from_btf(&good[..len]);
        }
        let mut bad_magic = good.clone();
        bad_magic[0] ^= 0xff;
        assert!(
            TaskOffsets::from_btf(&bad_magic)
                .unwrap_err()
                .to_string()
                .contains("magic")
        );
        // A member pointing at a type id beyond the table.
        let mut b = Builder::new();
        let members = b.members(&[("pid", 99, 0), ("comm", 99, 4), ("cpu", 99, 20)]);
        b.record("task_struct", kind::STRUCT, 3, 24, &members);
        assert!(
            TaskOffsets::from_btf(&b.finish())
                .unwrap_err()
                .to_string()
                .contains("out of range")
        );
        // A wrong-sized field.
        let mut b = Builder::new();
        let long = b.int("long", 8);
        let members = b.members(&[("pid", long, 0)]);
        b.record("task_struct", kind::STRUCT, 1, 8, &members);
        assert!(
            TaskOffsets::from_btf(&b.finish())
                .unwrap_err()
                .to_string()
                .contains("8 bytes, expected 4")
        );
    }

    #[test]
    fn the_running_kernel_has_the_fields() {
        if !Path::new(VMLINUX_BTF).exists() {
            // CI on the project's hosts sets SUBETHA_REQUIRE_PROBES=1: there
            // a kernel without BTF is a failure, not a skip.
            assert!(
                std::env::var("SUBETHA_REQUIRE_PROBES").as_deref() != Ok("1"),
                "no {VMLINUX_BTF} but SUBETHA_REQUIRE_PROBES=1"
            );
            eprintln!("no {VMLINUX_BTF}: kernel without BTF");
            return;
        }
        let offsets = TaskOffsets::from_kernel().unwrap();
        // Distinct, and inside any plausible task_struct.
        let all = [
            offsets.pid,
            offsets.comm,
            offsets.cpu,
            offsets.exec_start,
            offsets.run_delay,
            offsets.last_queued,
            offsets.last_arrival,
            offsets.cfs_rq,
        ];
        for (i, a) in all.iter().enumerate() {
            assert!(*a < 16384, "{offsets:?}");
            assert!(all[i + 1..].iter().all(|b| b != a), "{offsets:?}");
        }
    }
}
