//! `--export-jsonl`: storms and periodic snapshots as JSON lines.
//!
//! Each line is one JSON object with a `type`:
//!
//! * `{"type":"storm","final":false,"observed_unix_ms":…, …StormReport}` —
//!   written once when a storm is first seen, and once more with
//!   `"final":true` when it has ended (a storm first seen already ended is
//!   written once, final). `observed_unix_ms` is the wall-clock time of the
//!   snapshot it was seen in (the storm's own times are CLOCK_MONOTONIC).
//! * `{"type":"snapshot", …AgentSnapshot}` — the whole snapshot, at most once
//!   per `snapshot_every` of snapshot time (`agent.taken_mono_ns`), never
//!   twice for the same snapshot, and not for the placeholder the agent
//!   serves before it published anything (`taken_mono_ns` 0).
//!
//! Memory stays bounded: storm ids increase, so the exporter keeps only the
//! highest id written and the ids of storms written while still open (at
//! most the agent's storm history; ids that left the history are
//! forgotten, and such a storm gets no final line).

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::model::{AgentSnapshot, StormReport};

/// Writes storms and throttled snapshots as JSON lines.
#[derive(Debug)]
pub struct JsonlExporter<W: Write> {
    writer: W,
    snapshot_every_ns: u64,
    /// `taken_mono_ns` of the last snapshot written.
    last_snapshot_ns: Option<u64>,
    /// Highest storm id written.
    last_storm_id: u64,
    /// Storms written while open, waiting for their final line.
    open_storms: BTreeSet<u64>,
}

#[derive(Serialize)]
struct StormLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(rename = "final")]
    is_final: bool,
    observed_unix_ms: u64,
    #[serde(flatten)]
    storm: &'a StormReport,
}

#[derive(Serialize)]
struct SnapshotLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    snapshot: &'a AgentSnapshot,
}

impl JsonlExporter<Box<dyn Write + Send>> {
    /// An exporter appending to the file at `target` (created if missing),
    /// or writing to stdout when `target` is `-`.
    pub fn open(target: impl AsRef<Path>, snapshot_every: Duration) -> io::Result<Self> {
        let target = target.as_ref();
        let writer: Box<dyn Write + Send> = if target == Path::new("-") {
            Box::new(io::stdout())
        } else {
            let file = OpenOptions::new()
                .append(true)
                .create(true)
                .open(target)
                .map_err(|error| {
                    io::Error::new(error.kind(), format!("cannot open {}: {error}", target.display()))
                })?;
            Box::new(BufWriter::new(file))
        };
        Ok(Self::new(writer, snapshot_every))
    }
}

impl<W: Write> JsonlExporter<W> {
    /// An exporter writing to `writer`, a snapshot line at most every
    /// `snapshot_every` (`Duration::ZERO`: every new snapshot;
    /// `Duration::MAX`: only the first and forced ones).
    pub fn new(writer: W, snapshot_every: Duration) -> Self {
        Self {
            writer,
            snapshot_every_ns: u64::try_from(snapshot_every.as_nanos()).unwrap_or(u64::MAX),
            last_snapshot_ns: None,
            last_storm_id: 0,
            open_storms: BTreeSet::new(),
        }
    }

    /// Writes the storms of `snapshot` not yet written (or newly ended), and
    /// the snapshot itself when `snapshot_every` has passed since the last
    /// one. Flushes.
    pub fn export(&mut self, snapshot: &AgentSnapshot) -> io::Result<()> {
        self.export_inner(snapshot, false)
    }

    /// Like [`export`](Self::export), but writes the snapshot line whatever
    /// the period (unless this very snapshot was already written): for the
    /// final snapshot at shutdown.
    pub fn export_final(&mut self, snapshot: &AgentSnapshot) -> io::Result<()> {
        self.export_inner(snapshot, true)
    }

    /// Flushes and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.writer.flush()?;
        Ok(self.writer)
    }

    /// The writer.
    pub fn get_ref(&self) -> &W {
        &self.writer
    }

    fn export_inner(&mut self, snapshot: &AgentSnapshot, force_snapshot: bool) -> io::Result<()> {
        let observed_unix_ms = snapshot.agent.taken_unix_ms;
        let mut highest = self.last_storm_id;
        for storm in &snapshot.storms {
            let ended = storm.end_mono_ns.is_some();
            let write = if storm.id > self.last_storm_id {
                highest = highest.max(storm.id);
                if !ended {
                    self.open_storms.insert(storm.id);
                }
                true
            } else {
                ended && self.open_storms.remove(&storm.id)
            };
            if write {
                let line = StormLine {
                    kind: "storm",
                    is_final: ended,
                    observed_unix_ms,
                    storm,
                };
                self.write_line(&line)?;
            }
        }
        self.last_storm_id = highest;
        if !self.open_storms.is_empty() {
            let present: BTreeSet<u64> = snapshot.storms.iter().map(|s| s.id).collect();
            self.open_storms.retain(|id| present.contains(id));
        }

        let taken = snapshot.agent.taken_mono_ns;
        let due = match self.last_snapshot_ns {
            // Nothing published yet (the agent's placeholder snapshot).
            _ if taken == 0 => false,
            None => true,
            Some(last) if taken == last => false,
            Some(last) => force_snapshot || taken < last || taken - last >= self.snapshot_every_ns,
        };
        if due {
            self.write_line(&SnapshotLine {
                kind: "snapshot",
                snapshot,
            })?;
            self.last_snapshot_ns = Some(taken);
        }
        self.writer.flush()
    }

    fn write_line(&mut self, line: &impl Serialize) -> io::Result<()> {
        serde_json::to_writer(&mut self.writer, line)?;
        self.writer.write_all(b"\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AgentInfo;
    use serde_json::Value;

    fn storm(id: u64, ended: bool) -> StormReport {
        StormReport {
            id,
            pid: 7,
            comm: "app".into(),
            slot: 1,
            begin_mono_ns: id * 100,
            end_mono_ns: ended.then_some(id * 100 + 50),
            dropped: id,
            ..Default::default()
        }
    }

    fn snapshot(taken_ms: u64, storms: Vec<StormReport>) -> AgentSnapshot {
        AgentSnapshot {
            agent: AgentInfo {
                taken_mono_ns: (taken_ms + 1) * 1_000_000,
                taken_unix_ms: 1_700_000_000_000 + taken_ms,
                ..Default::default()
            },
            storms,
            ..Default::default()
        }
    }

    fn lines(exporter: &JsonlExporter<Vec<u8>>) -> Vec<Value> {
        std::str::from_utf8(exporter.get_ref())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn storm_lines(lines: &[Value]) -> Vec<(u64, bool)> {
        lines
            .iter()
            .filter(|l| l["type"] == "storm")
            .map(|l| (l["id"].as_u64().unwrap(), l["final"].as_bool().unwrap()))
            .collect()
    }

    #[test]
    fn storms_once_then_final_and_snapshots_throttled() {
        let mut exporter = JsonlExporter::new(Vec::new(), Duration::from_secs(10));
        exporter
            .export(&snapshot(0, vec![storm(1, true), storm(2, false)]))
            .unwrap();
        let first = lines(&exporter);
        assert_eq!(storm_lines(&first), [(1, true), (2, false)]);
        assert_eq!(first.iter().filter(|l| l["type"] == "snapshot").count(), 1);
        assert_eq!(first[0]["comm"], "app");
        assert_eq!(first[0]["observed_unix_ms"], 1_700_000_000_000u64);
        assert_eq!(first[2]["agent"]["taken_unix_ms"], 1_700_000_000_000u64);
        assert_eq!(first[2]["storms"].as_array().unwrap().len(), 2);

        // Same storms, nothing new; within the period: nothing written.
        exporter
            .export(&snapshot(1_000, vec![storm(1, true), storm(2, false)]))
            .unwrap();
        assert_eq!(lines(&exporter).len(), 3);

        // Storm 2 ends, storm 3 begins; storm 1 left the history.
        exporter
            .export(&snapshot(2_000, vec![storm(2, true), storm(3, false)]))
            .unwrap();
        exporter
            .export(&snapshot(3_000, vec![storm(2, true), storm(3, false)]))
            .unwrap();
        // Period passed: a snapshot line; the same snapshot again: none.
        exporter
            .export(&snapshot(10_000, vec![storm(2, true), storm(3, false)]))
            .unwrap();
        exporter
            .export(&snapshot(10_000, vec![storm(2, true), storm(3, false)]))
            .unwrap();
        // Storm 3 left the history while open: forgotten, no final line.
        exporter.export(&snapshot(11_000, vec![storm(4, false)])).unwrap();
        assert!(exporter.open_storms.iter().eq([4].iter()));
        // Forced final snapshot within the period.
        exporter
            .export_final(&snapshot(12_000, vec![storm(4, true)]))
            .unwrap();

        let all = lines(&exporter);
        assert_eq!(
            storm_lines(&all),
            [
                (1, true),
                (2, false),
                (2, true),
                (3, false),
                (4, false),
                (4, true)
            ]
        );
        let snapshots: Vec<u64> = all
            .iter()
            .filter(|l| l["type"] == "snapshot")
            .map(|l| l["agent"]["taken_mono_ns"].as_u64().unwrap() / 1_000_000 - 1)
            .collect();
        assert_eq!(snapshots, [0, 10_000, 12_000]);
        assert!(exporter.open_storms.is_empty());
        let out = exporter.finish().unwrap();
        assert!(out.ends_with(b"\n"));
    }

    #[test]
    fn the_placeholder_snapshot_is_not_written() {
        let mut exporter = JsonlExporter::new(Vec::new(), Duration::ZERO);
        exporter.export(&AgentSnapshot::default()).unwrap();
        assert!(exporter.get_ref().is_empty());
        exporter.export(&snapshot(0, vec![])).unwrap();
        assert_eq!(lines(&exporter).len(), 1);
    }

    #[test]
    fn open_appends_to_a_file() {
        let dir = std::env::temp_dir().join(format!("subetha-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.jsonl");
        let _ = std::fs::remove_file(&path);
        for run in 0..2 {
            let mut exporter = JsonlExporter::open(&path, Duration::ZERO).unwrap();
            exporter.export(&snapshot(run, vec![storm(1, false)])).unwrap();
            exporter.finish().unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
