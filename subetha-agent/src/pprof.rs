//! Contention profiles in pprof's format, shaped like Go's `mutex` and
//! `block` profiles, so `go tool pprof`, Parca and Pyroscope read them
//! unchanged.
//!
//! * [`ProfileKind::Mutex`]: waits charged to the call site of the hold the
//!   waiter waited for (the holder rows of [`crate::sites`]).
//! * [`ProfileKind::Block`]: waits charged to the call site that waited
//!   (the waiter rows).
//!
//! Sample types are Go's: `contentions/count` and `delay/nanoseconds`. Each
//! sample's stack is two frames: the call site (leaf; function name
//! `file:line:column`, file and line filled in) under a root frame naming
//! the instance (`mutex orders_lock`), so a flame graph groups sites by
//! lock. Labels: `instance`, `kind`, `op`, `pid`, `comm`. Values are totals
//! since the agent attached, or, from [`delta`], over a window.
//!
//! The messages below are written with `prost`'s derive against the field
//! numbers of pprof's `profile.proto` (`perftools.profiles`, as published
//! in the `google/pprof` repository, `proto/profile.proto`); only the
//! fields this profile uses are declared (a reader skips none it needs:
//! proto3 decoders ignore absent fields). A test decodes the output back,
//! and the integration test `agent_pprof` has `go tool pprof` read it.

use std::collections::BTreeMap;
use std::io::Write as _;

use crate::model::AgentSnapshot;
use crate::sites::SiteView;

/// `perftools.profiles.Profile` (the fields used here).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// Field 1.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// Field 2.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Field 4.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Field 5.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Field 6; entry 0 is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Field 9: collection start, ns since the epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Field 10.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// Field 11.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Field 12.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Field 14.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `perftools.profiles.ValueType`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ValueType {
    /// Field 1: string index.
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// Field 2: string index.
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `perftools.profiles.Sample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Field 1: leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// Field 2: one per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Field 3.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `perftools.profiles.Label`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Label {
    /// Field 1: string index.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// Field 2: string index.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Field 3.
    #[prost(int64, tag = "3")]
    pub num: i64,
}

/// `perftools.profiles.Location`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Field 1: nonzero.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Field 4.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `perftools.profiles.Line`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Line {
    /// Field 1.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Field 2.
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `perftools.profiles.Function`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Function {
    /// Field 1: nonzero.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Field 2: string index.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Field 3: string index.
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Field 4: string index.
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// Which of Go's two contention profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileKind {
    /// Waits by the holder's call site.
    Mutex,
    /// Waits by the waiter's call site.
    Block,
}

impl ProfileKind {
    fn view(self) -> SiteView {
        match self {
            Self::Mutex => SiteView::Holder,
            Self::Block => SiteView::Waiter,
        }
    }
}

/// One sample's identity.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SampleKey {
    /// Process.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// Instance kind (`mutex`, …).
    pub kind: String,
    /// Instance name.
    pub instance: String,
    /// Op name.
    pub op: String,
    /// The site's text (`file:line:column` or a `<…>` note).
    pub site: String,
    /// Source file ("" when unknown).
    pub file: String,
    /// Line (0 when unknown).
    pub line: u32,
}

/// Contentions and delay (ns) per sample.
pub type Samples = BTreeMap<SampleKey, (u64, u64)>;

/// The samples of `kind` in `snapshot` (totals since attach).
pub fn samples(snapshot: &AgentSnapshot, kind: ProfileKind) -> Samples {
    let mut out = Samples::new();
    for process in &snapshot.processes {
        for instance in &process.instances {
            for row in instance
                .sites
                .iter()
                .filter(|r| r.view == kind.view() && r.contended > 0)
            {
                let key = SampleKey {
                    pid: process.pid,
                    comm: process.comm.clone(),
                    kind: instance.kind.clone(),
                    instance: instance.name.clone(),
                    op: row.op_name.clone(),
                    site: row.site.clone(),
                    file: row.file.clone(),
                    line: row.line,
                };
                let entry = out.entry(key).or_default();
                entry.0 = entry.0.saturating_add(row.contended);
                entry.1 = entry.1.saturating_add(row.wait_total_ns);
            }
        }
    }
    out
}

/// What `after` added to `before` (samples that did not grow are left out).
pub fn delta(before: &Samples, after: &Samples) -> Samples {
    after
        .iter()
        .filter_map(|(key, &(count, ns))| {
            let (c0, n0) = before.get(key).copied().unwrap_or_default();
            let grown = (count.saturating_sub(c0), ns.saturating_sub(n0));
            (grown.0 > 0).then(|| (key.clone(), grown))
        })
        .collect()
}

/// Builds the profile of `samples`; `duration_ns` is the window (0: totals
/// since attach), `time_ns` the collection start since the epoch.
pub fn profile(samples: &Samples, time_ns: i64, duration_ns: i64) -> Profile {
    let mut strings = Strings::default();
    let contentions = strings.id("contentions");
    let count = strings.id("count");
    let delay = strings.id("delay");
    let nanoseconds = strings.id("nanoseconds");
    let mut p = Profile {
        sample_type: vec![
            ValueType {
                r#type: contentions,
                unit: count,
            },
            ValueType {
                r#type: delay,
                unit: nanoseconds,
            },
        ],
        time_nanos: time_ns,
        duration_nanos: duration_ns,
        period_type: Some(ValueType {
            r#type: contentions,
            unit: count,
        }),
        period: 1,
        default_sample_type: delay,
        ..Profile::default()
    };
    // One location (and function) per distinct frame text.
    let mut frames: BTreeMap<(String, String, u32), u64> = BTreeMap::new();
    let mut frame = |p: &mut Profile, strings: &mut Strings, name: &str, file: &str, line: u32| -> u64 {
        let next = frames.len() as u64 + 1;
        let id = *frames
            .entry((name.to_string(), file.to_string(), line))
            .or_insert(next);
        if id == next {
            let name = strings.id(name);
            p.function.push(Function {
                id,
                name,
                system_name: name,
                filename: strings.id(file),
            });
            p.location.push(Location {
                id,
                line: vec![Line {
                    function_id: id,
                    line: i64::from(line),
                }],
            });
        }
        id
    };
    let keys = ["instance", "kind", "op", "pid", "comm"].map(|k| strings.id(k));
    for (key, &(n, ns)) in samples {
        let leaf = frame(&mut p, &mut strings, &key.site, &key.file, key.line);
        let root = frame(
            &mut p,
            &mut strings,
            &format!("{} {}", key.kind, key.instance),
            "",
            0,
        );
        let label = |key: i64, str: i64| Label { key, str, num: 0 };
        let labels = vec![
            label(keys[0], strings.id(&key.instance)),
            label(keys[1], strings.id(&key.kind)),
            label(keys[2], strings.id(&key.op)),
            Label {
                key: keys[3],
                str: 0,
                num: i64::from(key.pid),
            },
            label(keys[4], strings.id(&key.comm)),
        ];
        p.sample.push(Sample {
            location_id: vec![leaf, root],
            value: vec![clamp(n), clamp(ns)],
            label: labels,
        });
    }
    p.string_table = strings.table;
    p
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The profile, protobuf-encoded and gzipped (what pprof clients expect).
pub fn encode_gzip(profile: &Profile) -> Vec<u8> {
    let raw = prost::Message::encode_to_vec(profile);
    let mut gz =
        flate2::write::GzEncoder::new(Vec::with_capacity(raw.len() / 2), flate2::Compression::default());
    gz.write_all(&raw).expect("writing to a Vec cannot fail");
    gz.finish().expect("writing to a Vec cannot fail")
}

/// Decodes a (gzipped or plain) profile: for tests and `profile --format`.
pub fn decode(bytes: &[u8]) -> anyhow::Result<Profile> {
    use std::io::Read as _;
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut out)?;
        out
    } else {
        bytes.to_vec()
    };
    Ok(prost::Message::decode(raw.as_slice())?)
}

/// The profile as collapsed stacks (`root;leaf value` per line, the input
/// of flame graph tools), valued by delay in ns (`by_count`: contentions).
pub fn collapsed(profile: &Profile, by_count: bool) -> String {
    let name = |location: u64| -> &str {
        profile
            .location
            .iter()
            .find(|l| l.id == location)
            .and_then(|l| l.line.first())
            .and_then(|line| profile.function.iter().find(|f| f.id == line.function_id))
            .and_then(|f| profile.string_table.get(f.name as usize))
            .map_or("?", String::as_str)
    };
    let mut lines: BTreeMap<String, i64> = BTreeMap::new();
    for sample in &profile.sample {
        let stack: Vec<&str> = sample
            .location_id
            .iter()
            .rev()
            .map(|&id| name(id))
            .map(|n| if n.is_empty() { "?" } else { n })
            .collect();
        let value = sample
            .value
            .get(if by_count { 0 } else { 1 })
            .copied()
            .unwrap_or(0);
        // `;` separates frames and the last space the value: keep both out
        // of frame names.
        let stack = stack
            .iter()
            .map(|f| f.replace(';', ":").replace(' ', "_"))
            .collect::<Vec<_>>()
            .join(";");
        *lines.entry(stack).or_default() += value;
    }
    lines
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(stack, v)| format!("{stack} {v}\n"))
        .collect()
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: BTreeMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if self.table.is_empty() {
            self.table.push(String::new());
            self.index.insert(String::new(), 0);
        }
        if let Some(&id) = self.index.get(s) {
            return id;
        }
        let id = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{InstanceReport, ProcessReport};
    use crate::sites::SiteReport;

    fn snapshot(waits: u64, ns: u64) -> AgentSnapshot {
        let row = |view, site: &str, line| SiteReport {
            view,
            op: 1,
            op_name: "lock".into(),
            site: site.into(),
            file: "src/app.rs".into(),
            line,
            contended: waits,
            wait_total_ns: ns,
            ..SiteReport::default()
        };
        AgentSnapshot {
            processes: vec![ProcessReport {
                pid: 42,
                comm: "app".into(),
                instances: vec![InstanceReport {
                    kind: "mutex".into(),
                    name: "orders".into(),
                    sites: vec![
                        row(SiteView::Waiter, "src/app.rs:10:5", 10),
                        row(SiteView::Holder, "src/app.rs:20:9", 20),
                    ],
                    ..InstanceReport::default()
                }],
                ..ProcessReport::default()
            }],
            ..AgentSnapshot::default()
        }
    }

    fn leaf_name(p: &Profile, s: &Sample) -> String {
        let loc = p.location.iter().find(|l| l.id == s.location_id[0]).unwrap();
        let f = p
            .function
            .iter()
            .find(|f| f.id == loc.line[0].function_id)
            .unwrap();
        p.string_table[f.name as usize].clone()
    }

    #[test]
    fn a_profile_round_trips_with_gos_sample_types_and_labels() {
        let snap = snapshot(3, 3_000_000);
        let mutex = profile(&samples(&snap, ProfileKind::Mutex), 1, 0);
        let decoded = decode(&encode_gzip(&mutex)).unwrap();
        assert_eq!(decoded, mutex);
        let st = |i: i64| decoded.string_table[i as usize].as_str();
        let types: Vec<_> = decoded
            .sample_type
            .iter()
            .map(|t| (st(t.r#type), st(t.unit)))
            .collect();
        assert_eq!(types, [("contentions", "count"), ("delay", "nanoseconds")]);
        assert_eq!(decoded.sample.len(), 1);
        let s = &decoded.sample[0];
        assert_eq!(s.value, [3, 3_000_000]);
        assert_eq!(
            leaf_name(&decoded, s),
            "src/app.rs:20:9",
            "the holder view names the holder"
        );
        let labels: Vec<_> = s.label.iter().map(|l| (st(l.key), st(l.str), l.num)).collect();
        assert!(labels.contains(&("instance", "orders", 0)), "{labels:?}");
        assert!(labels.contains(&("kind", "mutex", 0)), "{labels:?}");
        assert!(labels.contains(&("pid", "", 42)), "{labels:?}");
        let block = profile(&samples(&snap, ProfileKind::Block), 1, 0);
        assert_eq!(leaf_name(&block, &block.sample[0]), "src/app.rs:10:5");
        assert_eq!(collapsed(&block, false), "mutex_orders;src/app.rs:10:5 3000000\n");
    }

    #[test]
    fn a_delta_keeps_only_what_grew() {
        let before = samples(&snapshot(3, 3_000), ProfileKind::Block);
        let after = samples(&snapshot(5, 9_000), ProfileKind::Block);
        let d = delta(&before, &after);
        assert_eq!(d.values().copied().collect::<Vec<_>>(), [(2, 6_000)]);
        assert!(delta(&after, &after).is_empty());
    }
}
