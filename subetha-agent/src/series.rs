//! The catalogue of exported series, and the label sets they carry.
//!
//! Each [`Series`] names one family once: its Prometheus name, kind, unit,
//! help and labels, and its OpenTelemetry name and unit. Both encoders,
//! `/metrics` ([`crate::metrics`]) and OTLP ([`crate::otlp`]), render these
//! entries from the agent's model ([`crate::model`]) through the same
//! [`ProcessView`]s (duplicates removed), so they carry the same series
//! with the same words, and neither imports the other. [`ALL`] lists every
//! entry; a test checks that each appears in both outputs.
//!
//! Prometheus names are given without their suffixes: the encoder adds
//! `_total` to counters, the unit (`_seconds`, `_bytes`) to gauges and
//! histograms and `_info` to infos. OTLP attributes are the labels without
//! `pid` and `comm`, which the process's resource carries.

use std::borrow::Cow;
use std::collections::HashSet;

use crate::model::{AgentSnapshot, InstanceReport, OpReport, ProcessReport, RingReport};

/// What a family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A cumulative count (Prometheus counter, OTLP monotonic sum).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Facts that are not numbers, as labels of a constant 1 (Prometheus
    /// only: OTLP carries them as resource attributes).
    Info,
    /// A cumulative histogram on [`crate::model::BUCKET_BOUNDS_NS`], in seconds.
    Histogram,
}

/// The unit of a family's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A count of things (the OTLP unit names them).
    Count,
    /// Seconds.
    Seconds,
    /// Bytes.
    Bytes,
}

/// A family's OpenTelemetry form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Otlp {
    /// Dotted name, no `_total`, no unit suffix.
    pub name: &'static str,
    /// UCUM unit (`s`, `By`) or an annotation (`{scan}`).
    pub unit: &'static str,
}

/// One exported family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Series {
    /// Prometheus name without suffixes.
    pub name: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// Its unit.
    pub unit: Unit,
    /// Its help text. `{per}` stands for what a ring counter is summed
    /// over ([`Series::help_for`]).
    pub help: &'static str,
    /// The labels every series of the family has (per-thread ring counters
    /// add `slot`, `tid`, `thread`; `subetha_process_info` adds the
    /// container identity where known).
    pub labels: &'static [&'static str],
    /// Its OTLP form; `None` where OTLP carries the fact otherwise (named
    /// in [`Series::otlp_elsewhere`]).
    pub otlp: Option<Otlp>,
}

impl Series {
    /// The help text, `{per}` filled in: `ring slot` for per-thread ring
    /// counters, `process` otherwise.
    pub fn help_for(&self, per_thread: bool) -> Cow<'static, str> {
        if self.help.contains("{per}") {
            Cow::Owned(
                self.help
                    .replace("{per}", if per_thread { "ring slot" } else { "process" }),
            )
        } else {
            Cow::Borrowed(self.help)
        }
    }

    /// Where OTLP carries a family it has no metric for.
    pub fn otlp_elsewhere(&self) -> Option<&'static str> {
        match (self.otlp, self.kind) {
            (Some(_), _) => None,
            (None, Kind::Info) => Some("resource attributes"),
            (None, _) => Some("the maximum of the matching OTLP histogram"),
        }
    }
}

const NO_LABELS: &[&str] = &[];
const PROCESS: &[&str] = &["pid", "comm"];
const INSTANCE: &[&str] = &["pid", "comm", "instance_id", "instance_name", "kind"];
const OP: &[&str] = &["pid", "comm", "instance_id", "instance_name", "kind", "op"];

macro_rules! series {
    ($(#[$doc:meta])* $id:ident: $kind:ident $name:literal, $unit:ident, $labels:expr, $otlp:expr, $help:literal) => {
        $(#[$doc])*
        pub const $id: Series = Series {
            name: $name,
            kind: Kind::$kind,
            unit: Unit::$unit,
            help: $help,
            labels: $labels,
            otlp: $otlp,
        };
    };
}

const fn otlp(name: &'static str, unit: &'static str) -> Option<Otlp> {
    Some(Otlp { name, unit })
}

series!(/** The agent itself. */ AGENT: Info "subetha_agent", Count, &["version"], None,
    "The subetha agent serving these metrics.");
series!(/** Scans completed. */ AGENT_SCANS: Counter "subetha_agent_scans", Count, NO_LABELS,
    otlp("subetha.agent.scans", "{scan}"), "Scans of all attached segments completed.");
series!(/** Probe events read. */ PROBE_EVENTS: Counter "subetha_probe_events", Count, NO_LABELS,
    otlp("subetha.probe.events", "{event}"), "Events read from the eBPF probes.");
series!(/** Probe events lost. */ PROBE_LOST_EVENTS: Counter "subetha_probe_lost_events", Count, NO_LABELS,
    otlp("subetha.probe.lost_events", "{event}"),
    "Events the eBPF probes could not deliver (ring buffer full).");
series!(/** Off-CPU intervals filtered in the kernel. */ PROBE_FILTERED: Counter "subetha_probe_filtered_intervals",
    Count, NO_LABELS, otlp("subetha.probe.filtered_intervals", "{interval}"),
    "Off-CPU intervals the eBPF probes' in-kernel filter kept back as unremarkable.");
series!(/** The scan pause. */ SCAN_INTERVAL: Gauge "subetha_agent_scan_interval", Seconds, NO_LABELS,
    otlp("subetha.agent.scan_interval", "s"), "Current pause between scans (adapts to ring fill).");
series!(/** Longest scan. */ SCAN_DURATION_MAX: Gauge "subetha_scan_duration_max", Seconds, NO_LABELS, None,
    "Longest scan of all attached segments.");
series!(/** Longest gap. */ SCAN_GAP_MAX: Gauge "subetha_scan_gap_max", Seconds, NO_LABELS, None,
    "Longest gap between the end of a scan and the start of the next.");
series!(/** Refused segments. */ SEGMENTS_REFUSED: Gauge "subetha_segments_refused", Count, NO_LABELS,
    otlp("subetha.segments.refused", "{segment}"), "Segments found but refused as invalid (bounded history).");
series!(/** Processes by state. */ PROCESSES: Gauge "subetha_processes", Count, &["state"],
    otlp("subetha.processes", "{process}"),
    "Instrumented processes by state (attached, waiting, exited and retained).");
series!(/** A process and its identity. */ PROCESS_INFO: Info "subetha_process", Count, &["pid", "comm", "uid", "state"],
    None, "An instrumented process the agent knows, with its owner and state.");
series!(/** Segment size. */ SEGMENT_SIZE: Gauge "subetha_segment_size", Bytes, PROCESS,
    otlp("subetha.segment.size", "By"), "Size of the process's shared-memory segment.");
series!(/** Segment resident size. */ SEGMENT_RESIDENT: Gauge "subetha_segment_resident", Bytes, PROCESS,
    otlp("subetha.segment.resident", "By"), "Resident (touched) part of the process's shared-memory segment.");
series!(/** Lost for want of a ring. */ LOST_NO_RING: Counter "subetha_observations_lost_no_ring", Count, PROCESS,
    otlp("subetha.observations.lost_no_ring", "{observation}"),
    "Observations lost because their thread found no free ring slot.");
series!(/** Unattributed observations. */ UNATTRIBUTED: Counter "subetha_observations_unattributed", Count, PROCESS,
    otlp("subetha.observations.unattributed", "{observation}"),
    "Drained observations whose instance id matched no registered instance.");
series!(/** Ring slots by state. */ RINGS: Gauge "subetha_rings", Count, &["pid", "comm", "state"],
    otlp("subetha.rings", "{ring}"), "Ring slots of the process by state.");
series!(/** Corrupt ring slots. */ RINGS_CORRUPT: Gauge "subetha_rings_corrupt", Count, PROCESS,
    otlp("subetha.rings.corrupt", "{ring}"),
    "Ring slots whose indices were impossible (corrupt or hostile segment).");
series!(/** Drained observations. */ DRAINED: Counter "subetha_observations_drained", Count, PROCESS,
    otlp("subetha.observations.drained", "{observation}"),
    "Observations drained from the {per}'s rings, by any consumer.");
series!(/** Dropped observations. */ DROPPED: Counter "subetha_observations_dropped", Count, PROCESS,
    otlp("subetha.observations.dropped", "{observation}"),
    "Observations dropped because a ring of the {per} was full.");
series!(/** Drop episodes. */ DROP_EPISODES: Counter "subetha_drop_episodes", Count, PROCESS,
    otlp("subetha.drop_episodes", "{episode}"),
    "Drop episodes (runs of consecutive drops) seen on the {per}'s rings by this agent.");
series!(/** Operations. */ INSTANCE_OPS: Counter "subetha_instance_ops", Count, OP,
    otlp("subetha.instance.ops", "{operation}"), "Operations on the instance, by op kind.");
series!(/** Operations that waited. */ INSTANCE_CONTENDED: Counter "subetha_instance_contended", Count, OP,
    otlp("subetha.instance.contended", "{operation}"), "Operations on the instance that had to wait, by op kind.");
series!(/** Operations that found nothing. */ INSTANCE_MISSES: Counter "subetha_instance_misses", Count, OP,
    otlp("subetha.instance.misses", "{operation}"),
    "Operations on the instance that found nothing (empty or full, timed out), by op kind.");
series!(/** Producer threads. */ INSTANCE_THREADS: Gauge "subetha_instance_threads", Count, OP,
    otlp("subetha.instance.threads", "{thread}"),
    "Distinct producer threads seen operating on the instance, by op kind.");
series!(/** Longest latency. */ INSTANCE_LATENCY_MAX: Gauge "subetha_instance_latency_max", Seconds, OP, None,
    "Longest measured operation latency on the instance, by op kind.");
series!(/** Drops attributed. */ DROPS_ATTRIBUTED: Counter "subetha_instance_drops_attributed", Count, INSTANCE,
    otlp("subetha.instance.drops_attributed", "{observation}"),
    "Ring drops attributed to the instance (first dropped observation of an episode).");
series!(/** Storms begun. */ STORMS_BEGUN: Counter "subetha_storms_begun", Count, PROCESS,
    otlp("subetha.storms.begun", "{storm}"), "Drop storms begun in the process since the agent attached.");
series!(/** Storms by cause. */ STORMS: Counter "subetha_storms", Count, &["pid", "comm", "cause"],
    otlp("subetha.storms", "{storm}"),
    "Drop storms whose cause is settled, by cause (begun minus these are still being diagnosed).");
series!(/** Ongoing storms. */ STORMS_ACTIVE: Gauge "subetha_storms_active", Count, PROCESS,
    otlp("subetha.storms.active", "{storm}"), "Drop storms of the process still going on.");
series!(/** Scan durations. */ SCAN_DURATION: Histogram "subetha_scan_duration", Seconds, NO_LABELS,
    otlp("subetha.scan.duration", "s"), "Duration of one scan of all attached segments.");
series!(/** Scan gaps. */ SCAN_GAP: Histogram "subetha_scan_gap", Seconds, NO_LABELS,
    otlp("subetha.scan.gap", "s"), "Gap between the end of a scan and the start of the next.");
series!(/** Operation latency. */ INSTANCE_LATENCY: Histogram "subetha_instance_latency", Seconds, OP,
    otlp("subetha.instance.latency", "s"),
    "Measured operation latency on the instance (contended and sampled paths), by op kind.");

/// Every family, in the order `/metrics` serves them.
pub const ALL: &[&Series] = &[
    &AGENT,
    &AGENT_SCANS,
    &PROBE_EVENTS,
    &PROBE_LOST_EVENTS,
    &PROBE_FILTERED,
    &SCAN_INTERVAL,
    &SCAN_DURATION_MAX,
    &SCAN_GAP_MAX,
    &SEGMENTS_REFUSED,
    &PROCESSES,
    &PROCESS_INFO,
    &SEGMENT_SIZE,
    &SEGMENT_RESIDENT,
    &LOST_NO_RING,
    &UNATTRIBUTED,
    &RINGS,
    &RINGS_CORRUPT,
    &DRAINED,
    &DROPPED,
    &DROP_EPISODES,
    &INSTANCE_OPS,
    &INSTANCE_CONTENDED,
    &INSTANCE_MISSES,
    &INSTANCE_THREADS,
    &INSTANCE_LATENCY_MAX,
    &DROPS_ATTRIBUTED,
    &STORMS_BEGUN,
    &STORMS,
    &STORMS_ACTIVE,
    &SCAN_DURATION,
    &SCAN_GAP,
    &INSTANCE_LATENCY,
];

/// Process states always reported by [`PROCESSES`], even at zero.
const PROCESS_STATES: [&str; 3] = ["attached", "waiting", "exited"];

/// Ring states always reported by [`RINGS`], even at zero.
const RING_STATES: [&str; 4] = ["active", "orphaned", "claimed", "free"];

/// A label value: borrowed text or a number.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    /// Text.
    Str(&'a str),
    /// A number.
    Num(u64),
}

/// Label names and values of one series, in order.
pub type Labels<'a> = Vec<(&'static str, Value<'a>)>;

/// One process with its rings, instances and op kinds, duplicates removed so
/// no two series of a family share a label set: what both encoders render.
pub struct ProcessView<'a> {
    /// The process.
    pub process: &'a ProcessReport,
    /// Its ring slots, one entry per slot.
    pub rings: Vec<&'a RingReport>,
    /// Its instances, one per id, each with its op kinds, one per name.
    pub instances: Vec<(&'a InstanceReport, Vec<&'a OpReport>)>,
}

impl<'a> ProcessView<'a> {
    /// `pid`, `comm`.
    pub fn labels(&self) -> Labels<'a> {
        vec![
            ("pid", Value::Num(self.process.pid.into())),
            ("comm", Value::Str(&self.process.comm)),
        ]
    }

    /// The process's labels and `slot`, `tid`, `thread`.
    pub fn ring_labels(&self, ring: &'a RingReport) -> Labels<'a> {
        let mut labels = self.labels();
        labels.extend([
            ("slot", Value::Num(ring.slot.into())),
            ("tid", Value::Num(ring.tid.into())),
            ("thread", Value::Str(&ring.thread_name)),
        ]);
        labels
    }

    /// The process's labels and `instance_id`, `instance_name`, `kind`.
    pub fn instance_labels(&self, instance: &'a InstanceReport) -> Labels<'a> {
        let mut labels = self.labels();
        labels.extend([
            ("instance_id", Value::Num(instance.id.into())),
            ("instance_name", Value::Str(&instance.name)),
            ("kind", Value::Str(&instance.kind)),
        ]);
        labels
    }

    /// The instance's labels and `op`.
    pub fn op_labels(&self, instance: &'a InstanceReport, op: &'a OpReport) -> Labels<'a> {
        let mut labels = self.instance_labels(instance);
        labels.push(("op", Value::Str(&op.name)));
        labels
    }

    /// `(labels with state, ring slots in that state)` for every state of
    /// [`RING_STATES`], zeros included.
    pub fn ring_states(&self) -> impl Iterator<Item = (Labels<'a>, u64)> + '_ {
        RING_STATES.iter().map(move |state| {
            let mut labels = self.labels();
            labels.push(("state", Value::Str(state)));
            let count = self.rings.iter().filter(|r| r.state == *state).count() as u64;
            (labels, count)
        })
    }

    /// One ring counter: per ring slot (`per_thread`, ring labels) or the
    /// process's total (its labels). `total` is the process-wide value
    /// where the sum over rings would not be monotonic.
    pub fn ring_counter(
        &self,
        per_thread: bool,
        value: fn(&RingReport) -> u64,
        total: Option<u64>,
    ) -> Vec<(Labels<'a>, u64)> {
        if per_thread {
            self.rings
                .iter()
                .map(|r| (self.ring_labels(r), value(r)))
                .collect()
        } else {
            let sum = total.unwrap_or_else(|| self.rings.iter().map(|r| value(r)).sum());
            vec![(self.labels(), sum)]
        }
    }

    /// Ring slots whose indices were impossible.
    pub fn corrupt_rings(&self) -> u64 {
        self.rings.iter().filter(|r| r.corrupt.is_some()).count() as u64
    }

    /// Storms of this process in `snapshot` that have not ended.
    pub fn open_storms(&self, snapshot: &AgentSnapshot) -> u64 {
        let pid = self.process.pid;
        snapshot
            .storms
            .iter()
            .filter(|s| s.pid == pid && s.end_mono_ns.is_none())
            .count() as u64
    }

    /// `(labels with cause, storms)` for every settled cause.
    pub fn storm_causes(&self) -> impl Iterator<Item = (Labels<'a>, u64)> + '_ {
        self.process.storm_causes.iter().map(move |(cause, count)| {
            let mut labels = self.labels();
            labels.push(("cause", Value::Str(cause)));
            (labels, *count)
        })
    }

    /// `(labels, instance, op)` for every op kind of every instance.
    pub fn ops(&self) -> impl Iterator<Item = (Labels<'a>, &'a InstanceReport, &'a OpReport)> + '_ {
        self.instances.iter().flat_map(move |(instance, ops)| {
            ops.iter()
                .map(move |op| (self.op_labels(instance, op), *instance, *op))
        })
    }
}

/// Processes by state, the states of [`PROCESS_STATES`] always present.
pub fn process_states<'a>(views: &[ProcessView<'a>]) -> Vec<(&'a str, u64)> {
    let mut states: Vec<(&str, u64)> = PROCESS_STATES.iter().map(|s| (*s, 0)).collect();
    for view in views {
        match states.iter_mut().find(|(s, _)| *s == view.process.state) {
            Some((_, n)) => *n += 1,
            None => states.push((&view.process.state, 1)),
        }
    }
    states
}

/// The processes of `snapshot`, a pid reported twice (reused while the
/// exited one is retained) keeping its live entry, an instance id reported
/// twice keeping its live entry, an op name reported twice its first entry.
pub fn views(snapshot: &AgentSnapshot) -> Vec<ProcessView<'_>> {
    let live: HashSet<u32> = snapshot
        .processes
        .iter()
        .filter(|p| p.state != "exited")
        .map(|p| p.pid)
        .collect();
    let mut seen = HashSet::new();
    let mut views = Vec::with_capacity(snapshot.processes.len());
    for process in &snapshot.processes {
        if (process.state == "exited" && live.contains(&process.pid)) || !seen.insert(process.pid) {
            continue;
        }
        let mut slots = HashSet::new();
        let rings = process.rings.iter().filter(|r| slots.insert(r.slot)).collect();
        let live_ids: HashSet<u32> = process
            .instances
            .iter()
            .filter(|i| !i.retired)
            .map(|i| i.id)
            .collect();
        let mut ids = HashSet::new();
        let instances = process
            .instances
            .iter()
            .filter(|i| !(i.retired && live_ids.contains(&i.id)) && ids.insert(i.id))
            .map(|instance| {
                let mut names = HashSet::new();
                let ops = instance
                    .per_op
                    .iter()
                    .filter(|op| names.insert(op.name.as_str()))
                    .collect();
                (instance, ops)
            })
            .collect();
        views.push(ProcessView {
            process,
            rings,
            instances,
        });
    }
    views
}

/// Nanoseconds as seconds.
pub fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use opentelemetry_proto::tonic::metrics::v1::metric::Data;

    use super::*;
    use crate::metrics::{self, Format};

    /// The OpenMetrics family name of a catalogue entry.
    fn family_name(series: &Series) -> String {
        match (series.kind, series.unit) {
            (Kind::Gauge | Kind::Histogram, Unit::Seconds) => format!("{}_seconds", series.name),
            (Kind::Gauge | Kind::Histogram, Unit::Bytes) => format!("{}_bytes", series.name),
            _ => series.name.to_string(),
        }
    }

    /// `family → (type, label names seen on its samples)` of an
    /// OpenMetrics exposition.
    fn families(text: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
        let mut out: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                current = name.to_string();
                out.insert(current.clone(), (kind.to_string(), BTreeSet::new()));
            } else if !line.starts_with('#')
                && let Some((_, labels)) = line.split_once('{')
            {
                let labels = labels.split_once('}').unwrap().0;
                let entry = &mut out.get_mut(&current).unwrap().1;
                for pair in labels.split("\",") {
                    if let Some((key, _)) = pair.split_once('=') {
                        entry.insert(key.to_string());
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_catalogue_series_is_in_both_outputs_and_nothing_else_is() {
        let snapshot = metrics::tests::sample();
        let text = metrics::render(&Arc::new(snapshot.clone()), Format::OpenMetrics).unwrap();
        let served = families(&text);
        let mut names = HashSet::new();
        for series in ALL {
            assert!(
                names.insert(series.name),
                "{} twice in the catalogue",
                series.name
            );
            let name = family_name(series);
            let (kind, labels) = served
                .get(&name)
                .unwrap_or_else(|| panic!("{name} is catalogued but not on /metrics:\n{text}"));
            let expected = match series.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Info => "info",
                Kind::Histogram => "histogram",
            };
            assert_eq!(kind, expected, "{name}");
            for label in series.labels {
                assert!(labels.contains(*label), "{name} lacks label {label}: {labels:?}");
            }
            if series.labels.is_empty() && series.kind != Kind::Histogram {
                assert!(labels.is_empty(), "{name} has labels {labels:?}");
            }
        }
        let catalogued: BTreeSet<String> = ALL.iter().map(|s| family_name(s)).collect();
        let extra: Vec<&String> = served.keys().filter(|n| !catalogued.contains(*n)).collect();
        assert!(extra.is_empty(), "served but not catalogued: {extra:?}");

        let request = crate::otlp::request(&snapshot, 1, Some("host"));
        let mut exported: BTreeMap<String, (&'static str, String)> = BTreeMap::new();
        for resource in &request.resource_metrics {
            for scope in &resource.scope_metrics {
                for metric in &scope.metrics {
                    let kind = match &metric.data {
                        Some(Data::Sum(sum)) if sum.is_monotonic => "counter",
                        Some(Data::Gauge(_)) => "gauge",
                        Some(Data::Histogram(_)) => "histogram",
                        other => panic!("{}: unexpected data {other:?}", metric.name),
                    };
                    let help = ALL
                        .iter()
                        .find(|s| s.otlp.is_some_and(|o| o.name == metric.name))
                        .map(|s| s.help_for(false));
                    assert_eq!(
                        help.as_deref(),
                        Some(metric.description.as_str()),
                        "{}",
                        metric.name
                    );
                    exported.insert(metric.name.clone(), (kind, metric.unit.clone()));
                }
            }
        }
        for series in ALL {
            match series.otlp {
                Some(otlp) => {
                    let (kind, unit) = exported.get(otlp.name).unwrap_or_else(|| {
                        panic!("{} is catalogued but not exported: {exported:?}", otlp.name)
                    });
                    let expected = match series.kind {
                        Kind::Counter => "counter",
                        Kind::Gauge => "gauge",
                        Kind::Histogram => "histogram",
                        Kind::Info => unreachable!("an info has no OTLP metric"),
                    };
                    assert_eq!(*kind, expected, "{}", otlp.name);
                    assert_eq!(unit, otlp.unit, "{}", otlp.name);
                }
                None => assert!(series.otlp_elsewhere().is_some(), "{}", series.name),
            }
        }
        let catalogued: BTreeSet<&str> = ALL.iter().filter_map(|s| s.otlp.map(|o| o.name)).collect();
        let extra: Vec<&String> = exported
            .keys()
            .filter(|n| !catalogued.contains(n.as_str()))
            .collect();
        assert!(extra.is_empty(), "exported but not catalogued: {extra:?}");
    }

    #[test]
    fn ring_counter_help_says_what_it_is_summed_over() {
        assert_eq!(
            DRAINED.help_for(false),
            "Observations drained from the process's rings, by any consumer."
        );
        assert_eq!(
            DRAINED.help_for(true),
            "Observations drained from the ring slot's rings, by any consumer."
        );
        assert_eq!(AGENT_SCANS.help_for(true), AGENT_SCANS.help);
    }
}
