//! `/metrics`: an [`AgentSnapshot`] in the Prometheus exposition formats.
//!
//! Every value comes from the snapshot, nothing is incremented live: a
//! [`Collector`] turns the snapshot into `ConstCounter`/`ConstGauge`/info
//! series on each scrape, so a process that left the snapshot (its
//! retention ran out) simply stops having series.
//!
//! Two formats, chosen by [`Format::negotiate`] from the `Accept` header:
//! OpenMetrics 1.0 (what Prometheus asks for) and the classic text format
//! 0.0.4 (what `curl … | promtool check metrics` gets).
//!
//! # Conventions
//!
//! Checked by `promtool check metrics` (promlint) in the tests below and
//! end to end against a real Prometheus in `tests/tests/agent_prometheus_e2e.rs`:
//! every family is prefixed `subetha_` and has HELP and TYPE (and UNIT in
//! OpenMetrics); counters end in `_total`, and only counters do; times are
//! in seconds (`_seconds`), sizes in bytes (`_bytes`); states and causes
//! are labels of one family (`subetha_processes{state}`,
//! `subetha_storms_total{cause}`), never part of a name; facts about a
//! thing that are not numbers are `_info` series. Labels: `pid`, `comm` on
//! everything about a process (its container identity is on
//! `subetha_process_info`, to join on); `instance_id`, `instance_name`,
//! `kind` for an instance, `op` for its op kind. The example alerts and
//! dashboard in `contrib/` are built on these names and a test fails when
//! one of theirs is not served.
//!
//! # Bounded series
//!
//! A fleet's Prometheus must not grow with its applications' threads, so
//! nothing is labelled by thread or ring slot by default: the ring counters
//! (`subetha_observations_drained_total`, `_dropped_total`,
//! `subetha_drop_episodes_total`) are per process. Per-thread detail is in
//! the JSON API, `top` and storms. [`MetricsOptions::per_thread`]
//! (`--metrics-per-thread on`) brings back one series per ring slot with
//! `slot`, `tid` and `thread`, at the cost of a series per thread that ever
//! held a slot. Series of an exited process go when its retention ends (it
//! leaves the snapshot). `tests/tests/agent_cardinality.rs` holds the count
//! under thread churn to the bound the README states.
//!
//! The families, their names, help and labels are the catalogue's
//! ([`crate::series`]), which [`crate::otlp`] renders too.
//!
//! # Histograms
//!
//! Latency and scan timing are classic histograms on one fixed layout,
//! [`BUCKET_BOUNDS_NS`] (100 ns to 10 s, 1 and 3 per decade, in seconds as
//! `le`), with `_sum` and `_count`, so that they aggregate across instances,
//! processes and hosts (`histogram_quantile(0.99, sum by (le) (rate(…_bucket[5m])))`),
//! which quantiles cannot. The agent's own log-linear histograms (about 3%
//! wide buckets, in TSC ticks converted with each process's calibration)
//! are re-bucketed onto the layout in the model ([`Buckets`]); the exact
//! quantiles stay in the JSON API and the exact maximum is a gauge
//! (`…_max_seconds`). Families: `subetha_scan_duration_seconds`,
//! `subetha_scan_gap_seconds`, `subetha_instance_latency_seconds` (20
//! series per op kind with samples).
//!
//! # Label names
//!
//! Instances are labelled `instance_id` and `instance_name`, not
//! `instance`: Prometheus attaches its own `instance` (the scrape target) and
//! would rename ours to `exported_instance`. The id keeps two instances of a
//! process that share a name apart.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelValue, EncodeMetric,
    LabelValueEncoder, MetricEncoder, NoLabelSet, prometheus_text, text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use crate::model::{AgentSnapshot, BUCKET_BOUNDS_NS, Buckets};
use crate::series::{self, Kind, Labels, ProcessView, Series, Value, process_states, seconds, views};

/// `Content-Type` of the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `Content-Type` of the classic Prometheus text format.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// An exposition format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (ends with `# EOF`).
    OpenMetrics,
    /// Prometheus text format 0.0.4.
    PrometheusText,
}

impl Format {
    /// The `Content-Type` to answer with.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::PrometheusText => PROMETHEUS_TEXT_CONTENT_TYPE,
        }
    }

    /// The format an `Accept` header prefers: OpenMetrics when it is asked
    /// for with a quality at least that of `text/plain` (or `*/*`), the
    /// classic text format otherwise (also without a header).
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Format::PrometheusText;
        };
        let mut openmetrics = 0.0f32;
        let mut plain = 0.0f32;
        for range in accept.split(',') {
            let mut params = range.split(';');
            let media = params.next().unwrap_or("").trim().to_ascii_lowercase();
            let quality = params
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .and_then(|(_, v)| v.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
                "text/plain" | "text/*" | "*/*" => plain = plain.max(quality),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= plain {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }
}

/// What the exports include beyond the bounded default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsOptions {
    /// The ring counters (`subetha_observations_drained`, `_dropped`,
    /// `subetha_drop_episodes`) per ring slot, labelled `slot`, `tid` and
    /// `thread`, instead of one series per process: `--metrics-per-thread`.
    /// Costly: every thread that ever held a slot adds a series until its
    /// process leaves the snapshot, so thread churn grows a scraper's
    /// series without bound.
    pub per_thread: bool,
}

/// Renders `snapshot` in `format` with the default (per-process) series.
pub fn render(snapshot: &Arc<AgentSnapshot>, format: Format) -> Result<String, fmt::Error> {
    render_with(snapshot, format, MetricsOptions::default())
}

/// Renders `snapshot` in `format` with `options`.
pub fn render_with(
    snapshot: &Arc<AgentSnapshot>,
    format: Format,
    options: MetricsOptions,
) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(Arc::clone(snapshot), options)));
    let mut out = String::with_capacity(16 * 1024);
    match format {
        Format::OpenMetrics => text::encode_registry(&mut out, &registry)?,
        Format::PrometheusText => prometheus_text::encode(&mut out, &registry)?,
    }
    if format == Format::OpenMetrics {
        text::encode_eof(&mut out)?;
    }
    Ok(out)
}

impl EncodeLabelValue for Value<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        match self {
            Value::Str(s) => EncodeLabelValue::encode(s, encoder),
            Value::Num(n) => EncodeLabelValue::encode(n, encoder),
        }
    }
}

/// The Prometheus unit of a catalogue unit.
fn unit(series: &Series) -> Option<&'static Unit> {
    match series.unit {
        series::Unit::Count => None,
        series::Unit::Seconds => Some(&Unit::Seconds),
        series::Unit::Bytes => Some(&Unit::Bytes),
    }
}

/// Writes a counter family; nothing when empty.
fn counter<'a, V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    family: &Series,
    options: MetricsOptions,
    series: impl IntoIterator<Item = (Labels<'a>, V)>,
) -> fmt::Result {
    debug_assert_eq!(family.kind, Kind::Counter, "{}", family.name);
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let help = family.help_for(options.per_thread);
    let mut metric = encoder.encode_descriptor(family.name, &help, None, MetricType::Counter)?;
    for (labels, value) in series {
        ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes a gauge family; nothing when empty.
fn gauge<'a, V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    family: &Series,
    options: MetricsOptions,
    series: impl IntoIterator<Item = (Labels<'a>, V)>,
) -> fmt::Result {
    debug_assert_eq!(family.kind, Kind::Gauge, "{}", family.name);
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let help = family.help_for(options.per_thread);
    let mut metric = encoder.encode_descriptor(family.name, &help, unit(family), MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes an info family; nothing when empty.
fn info<'a>(
    encoder: &mut DescriptorEncoder,
    family: &Series,
    options: MetricsOptions,
    series: impl IntoIterator<Item = Labels<'a>>,
) -> fmt::Result {
    debug_assert_eq!(family.kind, Kind::Info, "{}", family.name);
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let help = family.help_for(options.per_thread);
    let mut metric = encoder.encode_descriptor(family.name, &help, None, MetricType::Info)?;
    for labels in series {
        metric.encode_info(&labels)?;
    }
    Ok(())
}

/// A histogram on [`BUCKET_BOUNDS_NS`] from a snapshot's [`Buckets`], in
/// seconds.
#[derive(Debug)]
struct ConstHistogram<'a>(&'a Buckets);

impl EncodeMetric for ConstHistogram<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let buckets: Vec<(f64, u64)> = BUCKET_BOUNDS_NS
            .iter()
            .map(|&bound| seconds(bound))
            .chain([f64::INFINITY])
            .enumerate()
            .map(|(i, bound)| (bound, self.0.counts.get(i).copied().unwrap_or(0)))
            .collect();
        encoder.encode_histogram::<NoLabelSet>(seconds(self.0.sum_ns), self.0.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Writes a histogram family in seconds; nothing when empty.
fn histogram<'a>(
    encoder: &mut DescriptorEncoder,
    family: &Series,
    options: MetricsOptions,
    series: impl IntoIterator<Item = (Labels<'a>, &'a Buckets)>,
) -> fmt::Result {
    debug_assert_eq!(family.kind, Kind::Histogram, "{}", family.name);
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let help = family.help_for(options.per_thread);
    let mut metric = encoder.encode_descriptor(family.name, &help, unit(family), MetricType::Histogram)?;
    for (labels, buckets) in series {
        ConstHistogram(buckets).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The counter and gauge families of one snapshot.
#[derive(Debug)]
struct SnapshotCollector(Arc<AgentSnapshot>, MetricsOptions);

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let snapshot = &*self.0;
        let options = self.1;
        let agent = &snapshot.agent;
        let views = views(snapshot);
        let e = &mut encoder;

        info(
            e,
            &series::AGENT,
            options,
            [vec![("version", Value::Str(&agent.version))]],
        )?;
        counter(e, &series::AGENT_SCANS, options, [(vec![], agent.scans)])?;
        counter(e, &series::PROBE_EVENTS, options, [(vec![], agent.probe_events)])?;
        counter(
            e,
            &series::PROBE_LOST_EVENTS,
            options,
            [(vec![], agent.probe_losses)],
        )?;
        counter(
            e,
            &series::PROBE_FILTERED,
            options,
            [(vec![], agent.probe_filtered)],
        )?;
        gauge(
            e,
            &series::SCAN_INTERVAL,
            options,
            [(vec![], agent.scan_interval_us as f64 / 1e6)],
        )?;
        gauge(
            e,
            &series::SCAN_DURATION_MAX,
            options,
            [(vec![], seconds(agent.scan_duration_ns.max))],
        )?;
        gauge(
            e,
            &series::SCAN_GAP_MAX,
            options,
            [(vec![], seconds(agent.scan_gap_ns.max))],
        )?;
        gauge(
            e,
            &series::SEGMENTS_REFUSED,
            options,
            [(vec![], snapshot.refused.len() as u64)],
        )?;

        let states = process_states(&views);
        gauge(
            e,
            &series::PROCESSES,
            options,
            states
                .into_iter()
                .map(|(state, n)| (vec![("state", Value::Str(state))], n)),
        )?;
        info(
            e,
            &series::PROCESS_INFO,
            options,
            views.iter().map(|v| {
                let process = v.process;
                let mut labels = v.labels();
                labels.push(("uid", Value::Num(process.uid.into())));
                labels.push(("state", Value::Str(&process.state)));
                // Container identity: here only, to join on (`* on (pid)
                // group_left (container_id) subetha_process_info`).
                for (key, value) in [
                    ("service", process.service.as_deref()),
                    ("container_id", process.container_id.as_deref()),
                    ("pod_uid", process.pod_uid.as_deref()),
                ] {
                    if let Some(value) = value {
                        labels.push((key, Value::Str(value)));
                    }
                }
                labels
            }),
        )?;
        gauge(
            e,
            &series::SEGMENT_SIZE,
            options,
            views.iter().map(|v| (v.labels(), v.process.segment_bytes)),
        )?;
        gauge(
            e,
            &series::SEGMENT_RESIDENT,
            options,
            views
                .iter()
                .map(|v| (v.labels(), v.process.segment_resident_bytes)),
        )?;
        counter(
            e,
            &series::LOST_NO_RING,
            options,
            views.iter().map(|v| (v.labels(), v.process.lost_no_ring)),
        )?;
        counter(
            e,
            &series::UNATTRIBUTED,
            options,
            views.iter().map(|v| (v.labels(), v.process.unattributed)),
        )?;

        gauge(
            e,
            &series::RINGS,
            options,
            views.iter().flat_map(ProcessView::ring_states),
        )?;
        gauge(
            e,
            &series::RINGS_CORRUPT,
            options,
            views.iter().map(|v| (v.labels(), v.corrupt_rings())),
        )?;
        counter(
            e,
            &series::DRAINED,
            options,
            views
                .iter()
                .flat_map(|v| v.ring_counter(options.per_thread, |r| r.drained, None)),
        )?;
        counter(
            e,
            &series::DROPPED,
            options,
            views
                .iter()
                .flat_map(|v| v.ring_counter(options.per_thread, |r| r.dropped, None)),
        )?;
        counter(
            e,
            &series::DROP_EPISODES,
            options,
            views
                .iter()
                .flat_map(|v| v.ring_counter(options.per_thread, |r| r.episodes, Some(v.process.episodes))),
        )?;

        let ops = || views.iter().flat_map(ProcessView::ops);
        counter(
            e,
            &series::INSTANCE_OPS,
            options,
            ops().map(|(l, _, op)| (l, op.ops)),
        )?;
        counter(
            e,
            &series::INSTANCE_CONTENDED,
            options,
            ops().map(|(l, _, op)| (l, op.contended)),
        )?;
        counter(
            e,
            &series::INSTANCE_MISSES,
            options,
            ops().map(|(l, _, op)| (l, op.misses)),
        )?;
        gauge(
            e,
            &series::INSTANCE_THREADS,
            options,
            ops().map(|(l, _, op)| (l, op.threads)),
        )?;
        gauge(
            e,
            &series::INSTANCE_LATENCY_MAX,
            options,
            ops()
                .filter(|(_, _, op)| op.latency_ns.count > 0)
                .map(|(l, _, op)| (l, seconds(op.latency_ns.max))),
        )?;
        counter(
            e,
            &series::DROPS_ATTRIBUTED,
            options,
            views.iter().flat_map(|v| {
                v.instances
                    .iter()
                    .map(move |(i, _)| (v.instance_labels(i), i.drops_attributed))
            }),
        )?;

        counter(
            e,
            &series::STORMS_BEGUN,
            options,
            views.iter().map(|v| (v.labels(), v.process.storms)),
        )?;
        counter(
            e,
            &series::STORMS,
            options,
            views.iter().flat_map(ProcessView::storm_causes),
        )?;
        gauge(
            e,
            &series::STORMS_ACTIVE,
            options,
            views.iter().map(|v| (v.labels(), v.open_storms(snapshot))),
        )?;

        histogram(
            e,
            &series::SCAN_DURATION,
            options,
            [(vec![], &agent.scan_duration_buckets)],
        )?;
        histogram(e, &series::SCAN_GAP, options, [(vec![], &agent.scan_gap_buckets)])?;
        histogram(
            e,
            &series::INSTANCE_LATENCY,
            options,
            ops()
                .filter(|(_, _, op)| op.latency_buckets.count > 0)
                .map(|(labels, _, op)| (labels, &op.latency_buckets)),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::model::{
        AgentInfo, InstanceReport, OpReport, ProcessReport, Quantiles, RingReport, StormReport,
    };
    use subetha_core::stats::LatencyHistogram;

    /// The export buckets of `values` (ns).
    fn b(values: &[(u64, u64)]) -> Buckets {
        let mut histogram = LatencyHistogram::new();
        for &(value, n) in values {
            histogram.record_n(value, n);
        }
        Buckets::from_histogram(&histogram, |v| v)
    }

    fn q(count: u64, base_ns: u64) -> Quantiles {
        Quantiles {
            count,
            p50: base_ns,
            p90: base_ns * 2,
            p99: base_ns * 4,
            p999: base_ns * 8,
            max: base_ns * 10,
        }
    }

    pub(crate) fn sample() -> AgentSnapshot {
        AgentSnapshot {
            agent: AgentInfo {
                pid: 1,
                version: "0.1.0".into(),
                taken_mono_ns: 0,
                taken_unix_ms: 1_700_000_000_000,
                scans: 1234,
                scan_interval_us: 500,
                scan_duration_ns: q(1234, 20_000),
                scan_gap_ns: q(1233, 500_000),
                scan_duration_buckets: b(&[(8_000, 1000), (50_000, 234)]),
                scan_gap_buckets: b(&[(500_000, 1233)]),
                probes: "off".into(),
                probe_events: 0,
                probe_losses: 0,
                probe_filtered: 0,
            },
            processes: vec![ProcessReport {
                pid: 4242,
                comm: "app".into(),
                uid: 1000,
                state: "attached".into(),
                note: None,
                attached_mono_ns: 1,
                exited_mono_ns: None,
                segment_bytes: 1 << 20,
                segment_resident_bytes: 65536,
                lost_no_ring: 3,
                unattributed: 1,
                drained: 1500,
                dropped: 40,
                episodes: 2,
                nspid: vec![4242, 1],
                pid_ns: 4026532511,
                exe: "app-server".into(),
                cgroup: "/system.slice/docker-4f1c6b0f2a6f9a1e5f3d1c2b3a4958677a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d.scope"
                    .into(),
                container_id: Some("4f1c6b0f2a6f9a1e5f3d1c2b3a4958677a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d".into()),
                pod_uid: None,
                service: Some("checkout".into()),
                storms: 2,
                storm_causes: [("producer_burst".to_string(), 1)].into(),
                rings: vec![
                    RingReport {
                        slot: 0,
                        state: "active".into(),
                        generation: 1,
                        tid: 4242,
                        ns_tid: 4242,
                        thread_name: "main".into(),
                        drained: 1000,
                        dropped: 0,
                        episodes: 0,
                        corrupt: None,
                    },
                    RingReport {
                        slot: 1,
                        state: "active".into(),
                        generation: 1,
                        tid: 4243,
                        ns_tid: 4243,
                        thread_name: "worker-1".into(),
                        drained: 500,
                        dropped: 40,
                        episodes: 2,
                        corrupt: None,
                    },
                ],
                instances: vec![
                    InstanceReport {
                        id: 1,
                        kind: "mutex".into(),
                        name: "state".into(),
                        ops: 1000,
                        contended: 10,
                        latency_ns: q(10, 1000),
                        threads: 2,
                        per_op: vec![OpReport {
                            op: 1,
                            name: "lock".into(),
                            ops: 1000,
                            contended: 10,
                            misses: 0,
                            latency_ns: q(10, 1000),
                            latency_buckets: b(&[(800, 5), (2_000, 4), (9_000, 1)]),
                            threads: 2,
                        }],
                        ..Default::default()
                    },
                    InstanceReport {
                        id: 2,
                        kind: "channel".into(),
                        name: "jobs".into(),
                        ops: 500,
                        misses: 7,
                        drops_attributed: 40,
                        threads: 1,
                        per_op: vec![
                            OpReport {
                                op: 1,
                                name: "send".into(),
                                ops: 300,
                                threads: 1,
                                ..Default::default()
                            },
                            OpReport {
                                op: 2,
                                name: "recv".into(),
                                ops: 200,
                                misses: 7,
                                threads: 1,
                                ..Default::default()
                            },
                        ],
                        ..Default::default()
                    },
                ],
            }],
            storms: vec![
                StormReport {
                    id: 1,
                    pid: 4242,
                    comm: "app".into(),
                    slot: 1,
                    tid: 4243,
                    ns_tid: 4243,
                    thread_name: "worker-1".into(),
                    begin_mono_ns: 100,
                    end_mono_ns: Some(200),
                    duration_ns: 100,
                    dropped: 30,
                    ..Default::default()
                },
                StormReport {
                    id: 2,
                    pid: 4242,
                    comm: "app".into(),
                    slot: 1,
                    tid: 4243,
                    ns_tid: 4243,
                    thread_name: "worker-1".into(),
                    begin_mono_ns: 300,
                    dropped: 10,
                    ..Default::default()
                },
                // A process whose retention ran out: no series.
                StormReport {
                    id: 3,
                    pid: 999,
                    comm: "gone".into(),
                    ..Default::default()
                },
            ],
            refused: vec![],
        }
    }

    fn render_text(snapshot: AgentSnapshot, format: Format) -> String {
        render(&Arc::new(snapshot), format).unwrap()
    }

    fn assert_lines(out: &str, expected: &[&str]) {
        let lines: HashSet<&str> = out.lines().collect();
        for line in expected {
            assert!(lines.contains(line), "missing line {line:?} in\n{out}");
        }
    }

    const LOCK: &str =
        r#"pid="4242",comm="app",instance_id="1",instance_name="state",kind="mutex",op="lock""#;

    #[test]
    fn prometheus_text_lines() {
        let out = render_text(sample(), Format::PrometheusText);
        let lock = |name: &str, extra: &str, value: &str| format!("{name}{{{LOCK}{extra}}} {value}");
        let expected = [
            "# HELP subetha_agent_scans_total Scans of all attached segments completed.".to_string(),
            "# TYPE subetha_agent_scans_total counter".into(),
            "subetha_agent_scans_total 1234".into(),
            "subetha_probe_events_total 0".into(),
            "subetha_probe_lost_events_total 0".into(),
            "subetha_probe_filtered_intervals_total 0".into(),
            "subetha_agent_info{version=\"0.1.0\"} 1".into(),
            "subetha_agent_scan_interval_seconds 0.0005".into(),
            "# TYPE subetha_processes gauge".into(),
            "subetha_processes{state=\"attached\"} 1".into(),
            "subetha_processes{state=\"waiting\"} 0".into(),
            "subetha_processes{state=\"exited\"} 0".into(),
            "subetha_process_info{pid=\"4242\",comm=\"app\",uid=\"1000\",state=\"attached\",service=\"checkout\",\
             container_id=\"4f1c6b0f2a6f9a1e5f3d1c2b3a4958677a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d\"} 1"
                .into(),
            "# TYPE subetha_segment_resident_bytes gauge".into(),
            "subetha_segment_resident_bytes{pid=\"4242\",comm=\"app\"} 65536".into(),
            "subetha_segment_size_bytes{pid=\"4242\",comm=\"app\"} 1048576".into(),
            "subetha_observations_lost_no_ring_total{pid=\"4242\",comm=\"app\"} 3".into(),
            "subetha_observations_unattributed_total{pid=\"4242\",comm=\"app\"} 1".into(),
            "subetha_rings{pid=\"4242\",comm=\"app\",state=\"active\"} 2".into(),
            "subetha_rings{pid=\"4242\",comm=\"app\",state=\"free\"} 0".into(),
            "subetha_rings_corrupt{pid=\"4242\",comm=\"app\"} 0".into(),
            // Ring counters per process by default: the rings' sums.
            "# TYPE subetha_observations_drained_total counter".into(),
            "subetha_observations_drained_total{pid=\"4242\",comm=\"app\"} 1500".into(),
            "subetha_observations_dropped_total{pid=\"4242\",comm=\"app\"} 40".into(),
            "subetha_drop_episodes_total{pid=\"4242\",comm=\"app\"} 2".into(),
            lock("subetha_instance_ops_total", "", "1000"),
            lock("subetha_instance_contended_total", "", "10"),
            lock("subetha_instance_misses_total", "", "0"),
            lock("subetha_instance_threads", "", "2"),
            lock("subetha_instance_latency_max_seconds", "", "0.00001"),
            "subetha_instance_misses_total{pid=\"4242\",comm=\"app\",instance_id=\"2\",instance_name=\"jobs\",\
             kind=\"channel\",op=\"recv\"} 7"
                .into(),
            "subetha_instance_drops_attributed_total{pid=\"4242\",comm=\"app\",instance_id=\"2\",\
             instance_name=\"jobs\",kind=\"channel\"} 40"
                .into(),
            "subetha_storms_begun_total{pid=\"4242\",comm=\"app\"} 2".into(),
            "subetha_storms_total{pid=\"4242\",comm=\"app\",cause=\"producer_burst\"} 1".into(),
            "subetha_storms_active{pid=\"4242\",comm=\"app\"} 1".into(),
            // Histograms on BUCKET_BOUNDS_NS, cumulative.
            "# TYPE subetha_scan_duration_seconds histogram".into(),
            "subetha_scan_duration_seconds_bucket{le=\"3e-06\"} 0".into(),
            "subetha_scan_duration_seconds_bucket{le=\"1e-05\"} 1000".into(),
            "subetha_scan_duration_seconds_bucket{le=\"3e-05\"} 1000".into(),
            "subetha_scan_duration_seconds_bucket{le=\"0.0001\"} 1234".into(),
            "subetha_scan_duration_seconds_bucket{le=\"+Inf\"} 1234".into(),
            "subetha_scan_duration_seconds_sum 0.0197".into(),
            "subetha_scan_duration_seconds_count 1234".into(),
            "subetha_scan_gap_seconds_bucket{le=\"0.0003\"} 0".into(),
            "subetha_scan_gap_seconds_bucket{le=\"0.001\"} 1233".into(),
            "subetha_scan_gap_seconds_count 1233".into(),
            "subetha_scan_duration_max_seconds 0.0002".into(),
            "# TYPE subetha_instance_latency_seconds histogram".into(),
            lock("subetha_instance_latency_seconds_bucket", ",le=\"3e-07\"", "0"),
            lock("subetha_instance_latency_seconds_bucket", ",le=\"1e-06\"", "5"),
            lock("subetha_instance_latency_seconds_bucket", ",le=\"3e-06\"", "9"),
            lock("subetha_instance_latency_seconds_bucket", ",le=\"1e-05\"", "10"),
            lock("subetha_instance_latency_seconds_bucket", ",le=\"+Inf\"", "10"),
            lock("subetha_instance_latency_seconds_sum", "", "0.000021"),
            lock("subetha_instance_latency_seconds_count", "", "10"),
        ];
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        assert_lines(&out, &expected);
        // Every bucket of the layout, and +Inf: 18 per series.
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("subetha_instance_latency_seconds_bucket{"))
                .count(),
            BUCKET_BOUNDS_NS.len() + 1
        );
        assert!(!out.contains("quantile="), "no summaries any more");
        // No latency samples: no histogram series, no max gauge.
        assert!(
            !out.contains(
                "subetha_instance_latency_seconds_count{pid=\"4242\",comm=\"app\",instance_id=\"2\""
            )
        );
        assert!(
            !out.contains("subetha_instance_latency_max_seconds{pid=\"4242\",comm=\"app\",instance_id=\"2\"")
        );
        // Storms of a process that is no longer reported have no series.
        assert!(!out.contains("pid=\"999\""));
        // Nothing per thread or per slot by default.
        for label in ["tid=", "thread=", "slot="] {
            assert!(!out.contains(label), "{label} in the default series:\n{out}");
        }
        assert!(!out.contains("# EOF"));
        assert!(!out.contains("# UNIT"));
    }

    #[test]
    fn per_thread_series_only_when_asked_for() {
        let per_thread = MetricsOptions { per_thread: true };
        let out = render_with(&Arc::new(sample()), Format::PrometheusText, per_thread).unwrap();
        assert_lines(
            &out,
            &[
                "subetha_observations_drained_total{pid=\"4242\",comm=\"app\",slot=\"0\",tid=\"4242\",thread=\"main\"} 1000",
                "subetha_observations_drained_total{pid=\"4242\",comm=\"app\",slot=\"1\",tid=\"4243\",thread=\"worker-1\"} 500",
                "subetha_observations_dropped_total{pid=\"4242\",comm=\"app\",slot=\"1\",tid=\"4243\",thread=\"worker-1\"} 40",
                "subetha_drop_episodes_total{pid=\"4242\",comm=\"app\",slot=\"1\",tid=\"4243\",thread=\"worker-1\"} 2",
            ],
        );
        assert!(!out.contains("subetha_observations_drained_total{pid=\"4242\",comm=\"app\"} "));
        // Many threads of one process: one series each per thread, one in
        // all by default.
        let mut churned = sample();
        let template = churned.processes[0].rings[1].clone();
        churned.processes[0].rings = (0..500)
            .map(|i| RingReport {
                slot: i,
                tid: 10_000 + i,
                ns_tid: 10_000 + i,
                ..template.clone()
            })
            .collect();
        let count = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with("subetha_observations_dropped_total"))
                .count()
        };
        let churned = Arc::new(churned);
        assert_eq!(
            count(&render_with(&churned, Format::PrometheusText, per_thread).unwrap()),
            500
        );
        assert_eq!(count(&render(&churned, Format::PrometheusText).unwrap()), 1);
    }

    #[test]
    fn every_family_has_help_and_type_and_conventional_names() {
        for format in [Format::PrometheusText, Format::OpenMetrics] {
            let out = render_text(sample(), format);
            let mut helps = HashSet::new();
            let mut types = Vec::new();
            for line in out.lines() {
                if let Some(rest) = line.strip_prefix("# HELP ") {
                    let name = rest.split(' ').next().unwrap();
                    assert!(helps.insert(name.to_string()), "duplicate family {name}");
                } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                    let mut parts = rest.split(' ');
                    types.push((
                        parts.next().unwrap().to_string(),
                        parts.next().unwrap().to_string(),
                    ));
                }
            }
            for (name, kind) in &types {
                assert!(helps.contains(name), "{name} has no HELP");
                assert!(name.starts_with("subetha_"), "{name}");
                if format == Format::PrometheusText {
                    assert_eq!(kind == "counter", name.ends_with("_total"), "{name} {kind}");
                } else {
                    assert!(!name.ends_with("_total"), "{name}");
                }
            }
            // Every sample belongs to the family declared just before it.
            let mut current = String::new();
            for line in out.lines() {
                if let Some(rest) = line.strip_prefix("# TYPE ") {
                    current = rest.split(' ').next().unwrap().to_string();
                } else if !line.starts_with('#') {
                    let name = line.split(['{', ' ']).next().unwrap();
                    assert!(name.starts_with(&current), "{name} outside family {current}");
                }
            }
        }
    }

    #[test]
    fn openmetrics_shape() {
        let out = render_text(sample(), Format::OpenMetrics);
        assert!(out.ends_with("# EOF\n"));
        assert_eq!(out.matches("# EOF").count(), 1);
        assert_lines(
            &out,
            &[
                "# TYPE subetha_agent_scans counter",
                "subetha_agent_scans_total 1234",
                "# TYPE subetha_agent info",
                "subetha_agent_info{version=\"0.1.0\"} 1",
                "# TYPE subetha_segment_resident_bytes gauge",
                "# UNIT subetha_segment_resident_bytes bytes",
                "# TYPE subetha_scan_duration_seconds histogram",
                "# UNIT subetha_scan_duration_seconds seconds",
                "subetha_scan_duration_seconds_count 1234",
                "subetha_scan_duration_seconds_bucket{le=\"0.00001\"} 1000",
                "subetha_scan_duration_seconds_bucket{le=\"+Inf\"} 1234",
            ],
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut snapshot = sample();
        let hostile = "a\"b\\c\nd} x{y=\"1";
        snapshot.processes[0].comm = hostile.into();
        snapshot.processes[0].rings[0].thread_name = hostile.into();
        snapshot.processes[0].instances[0].name = hostile.into();
        let escaped = r#"a\"b\\c\nd} x{y=\"1"#;
        for format in [Format::PrometheusText, Format::OpenMetrics] {
            let out = render_text(snapshot.clone(), format);
            assert_lines(
                &out,
                &[
                    &format!("subetha_segment_size_bytes{{pid=\"4242\",comm=\"{escaped}\"}} 1048576"),
                    &format!("subetha_observations_drained_total{{pid=\"4242\",comm=\"{escaped}\"}} 1500"),
                    &format!(
                        "subetha_instance_latency_seconds_count{{pid=\"4242\",comm=\"{escaped}\",instance_id=\"1\",\
                         instance_name=\"{escaped}\",kind=\"mutex\",op=\"lock\"}} 10"
                    ),
                ],
            );
            // No raw newline made it into a sample line.
            for line in out.lines() {
                assert!(
                    line.starts_with("# ") || line.starts_with("subetha_"),
                    "bad line {line:?}"
                );
            }
        }
    }

    #[test]
    fn duplicates_do_not_make_duplicate_series() {
        let mut snapshot = sample();
        let mut exited = snapshot.processes[0].clone();
        exited.state = "exited".into();
        exited.comm = "old".into();
        snapshot.processes.insert(0, exited);
        let mut retired = snapshot.processes[1].instances[0].clone();
        retired.retired = true;
        retired.name = "old".into();
        snapshot.processes[1].instances.push(retired);
        let out = render_text(snapshot, Format::PrometheusText);
        let samples: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        let keys: HashSet<&str> = samples.iter().map(|l| l.rsplit_once(' ').unwrap().0).collect();
        assert_eq!(keys.len(), samples.len(), "duplicate series in\n{out}");
        assert!(!out.contains("comm=\"old\""));
        assert!(!out.contains("instance_name=\"old\""));
    }

    #[test]
    fn empty_snapshot_renders() {
        let out = render_text(AgentSnapshot::default(), Format::PrometheusText);
        assert_lines(
            &out,
            &[
                "subetha_agent_scans_total 0",
                "subetha_processes{state=\"attached\"} 0",
                "subetha_scan_duration_seconds_count 0",
            ],
        );
        assert!(!out.contains("subetha_scan_duration_seconds{"));
    }

    #[test]
    fn negotiation() {
        use Format::*;
        assert_eq!(Format::negotiate(None), PrometheusText);
        assert_eq!(Format::negotiate(Some("*/*")), PrometheusText);
        assert_eq!(Format::negotiate(Some("text/plain")), PrometheusText);
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                 text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            PrometheusText
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0.2, text/plain")),
            PrometheusText
        );
    }

    /// `promtool check metrics` (classic text only), from Debian's
    /// `prometheus` package. CI installs it and sets
    /// `SUBETHA_REQUIRE_TOOLS=1`, which turns a missing promtool into a
    /// failure instead of a skip.
    #[test]
    fn promtool_accepts_the_text_format() {
        use std::io::Write as _;
        use std::process::{Command, Stdio};
        let mut snapshot = sample();
        snapshot.processes[0].comm = "a\"b\\c\nd".into();
        for snapshot in [snapshot, AgentSnapshot::default()] {
            let text = render_text(snapshot, Format::PrometheusText);
            let child = Command::new("promtool")
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            let Ok(mut child) = child else {
                assert!(
                    std::env::var_os("SUBETHA_REQUIRE_TOOLS").is_none(),
                    "promtool is required (SUBETHA_REQUIRE_TOOLS is set) but not installed"
                );
                eprintln!("promtool not installed: skipped");
                return;
            };
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "promtool: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}
