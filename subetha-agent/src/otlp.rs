//! Optional OTLP metrics export (`--otlp-endpoint`): the facts of
//! `/metrics`, pushed to an OpenTelemetry collector over OTLP/HTTP
//! (protobuf), so a fleet with a collector needs no scraping.
//!
//! # What it promises
//!
//! * Every export carries the latest [`AgentSnapshot`], never values
//!   incremented live. The series are the catalogue's ([`crate::series`],
//!   which `/metrics` renders too: the same de-duplicated processes,
//!   instances and op kinds; ring counters per process, never per thread),
//!   under OpenTelemetry names: dots instead of underscores, the unit as
//!   the metric's unit (`s`, `By`, `{operation}`…) rather than a suffix, and
//!   no `_total`.
//! * Counters are cumulative monotonic sums from the process's attachment
//!   (the agent's start for its own), so a lost export loses resolution,
//!   not counts.
//! * Latency and scan times are explicit-bucket histograms on the layout
//!   of `/metrics` ([`BUCKET_BOUNDS_NS`], in seconds) with count, sum and
//!   maximum: they aggregate across processes and hosts as quantiles
//!   cannot.
//! * Resources follow the OpenTelemetry semantic conventions: one for the
//!   agent (`service.name=subetha-agent`, `service.version`, `host.name`,
//!   `process.pid`, plus `OTEL_RESOURCE_ATTRIBUTES`), and one per
//!   instrumented process (`host.name`, `process.pid`,
//!   `process.executable.name`, `process.command`… see
//!   [`process_resource`], with `container.id` and `k8s.pod.uid` when its
//!   cgroup names them and `service.name` from `SUBETHA_SERVICE` or its
//!   executable), whose metrics then carry only what varies inside it
//!   (`instance_id`, `instance_name`, `kind`, `op`, `state`, `cause`).
//! * An export that fails (collector down, refused, timed out) is logged —
//!   once when exports start failing, once when they recover — and never
//!   stops the agent; the next period tries again.
//! * Dropping the [`OtlpExporter`] exports one last time, then stops:
//!   counts made just before a shutdown reach the collector.
//!
//! # Why not the OpenTelemetry SDK's instruments
//!
//! The snapshot already holds cumulative histograms; the SDK's observable
//! instruments can only report counters and gauges (a histogram must be
//! fed sample by sample), and one SDK provider has one resource where each
//! process needs its own. So the request is built here from the
//! `opentelemetry-proto` messages, encoded with `prost`, and posted with
//! `reqwest`'s blocking client on a thread of its own (no async runtime),
//! so [`start`] can be called outside one and the guard can be dropped
//! anywhere but inside an async task.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumberValue;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;

use crate::AgentSnapshot;
use crate::model::{BUCKET_BOUNDS_NS, Buckets, ProcessReport};
use crate::series::{self, Labels, ProcessView, Series, Value, process_states, seconds, views};

/// Where the snapshot comes from: the running agent's latest.
pub type SnapshotSource = Arc<dyn Fn() -> Arc<AgentSnapshot> + Send + Sync>;

/// The path OTLP/HTTP collectors receive metrics on; appended to an
/// endpoint given without a path.
pub const METRICS_PATH: &str = "/v1/metrics";

/// Longest an export may take (connect, send) before it counts as failed;
/// also bounds how long the final export can delay a shutdown.
const MAX_EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The semantic conventions the resources follow.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.26.0";

/// Starts exporting to `endpoint` every `interval`; the returned guard
/// exports once more and stops on drop.
///
/// `endpoint` is an `http://` or `https://` URL; without a path (or with
/// `/`), [`METRICS_PATH`] is appended, so `http://collector:4318` works as
/// well as `http://collector:4318/v1/metrics`. Must not be called from
/// inside an async task (the blocking HTTP client would refuse).
pub fn start(endpoint: &str, interval: Duration, source: SnapshotSource) -> Result<OtlpExporter> {
    if interval.is_zero() {
        bail!("the OTLP export interval must be longer than zero");
    }
    let url = metrics_url(endpoint)?;
    let timeout = interval.clamp(Duration::from_secs(1), MAX_EXPORT_TIMEOUT);
    let client = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .build()
        .with_context(|| format!("building the OTLP HTTP client for {url}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let started_unix_ns = unix_ns(SystemTime::now());
    let thread = std::thread::Builder::new()
        .name("subetha-otlp".into())
        .spawn({
            let (url, stop) = (url.clone(), Arc::clone(&stop));
            move || {
                let mut sender = Sender {
                    client,
                    url,
                    failing: false,
                };
                let mut next = Instant::now() + interval;
                while !stop.load(Ordering::Acquire) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::park_timeout(next - now);
                        continue;
                    }
                    next += interval;
                    sender.send(&request(&source(), started_unix_ns, host_name().as_deref()));
                }
                // The final export.
                sender.send(&request(&source(), started_unix_ns, host_name().as_deref()));
            }
        })
        .context("starting the OTLP export thread")?;
    tracing::info!(%url, ?interval, "exporting metrics over OTLP/HTTP");
    Ok(OtlpExporter {
        stop,
        thread: Some(thread),
        url,
    })
}

/// A running OTLP exporter. Dropping it exports once more and stops.
pub struct OtlpExporter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    url: String,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter").field("url", &self.url).finish()
    }
}

impl Drop for OtlpExporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// Posts requests, logging when exports start and stop failing.
struct Sender {
    client: reqwest::blocking::Client,
    url: String,
    failing: bool,
}

impl Sender {
    fn send(&mut self, request: &ExportMetricsServiceRequest) {
        let result = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
            .body(request.encode_to_vec())
            .send()
            .map_err(|e| e.to_string())
            .and_then(|response| {
                let status = response.status();
                if status.is_success() {
                    Ok(())
                } else {
                    Err(format!("the collector answered {status}"))
                }
            });
        match result {
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::warn!(url = %self.url, %error, "OTLP export failed; retrying every period");
            }
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(url = %self.url, "OTLP export works again");
            }
            _ => {}
        }
    }
}

/// The full metrics URL of `endpoint`, or why it is not one.
fn metrics_url(endpoint: &str) -> Result<String> {
    let endpoint = endpoint.trim();
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        bail!("OTLP endpoint {endpoint:?} is not an http:// or https:// URL (http://host:port[/path])");
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        bail!("OTLP endpoint {endpoint:?}: the scheme must be http or https, not {scheme:?}");
    }
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        bail!("OTLP endpoint {endpoint:?} has no valid host");
    }
    let base = endpoint.trim_end_matches('/');
    if path.is_empty() || path == "/" {
        Ok(format!("{base}{METRICS_PATH}"))
    } else {
        Ok(endpoint.to_owned())
    }
}

/// The kernel's host name (`/proc/sys/kernel/hostname`).
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

fn unix_ns(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

fn string(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(AnyValueKind::StringValue(value.into())),
        }),
        ..KeyValue::default()
    }
}

fn int(key: &str, value: u64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(AnyValueKind::IntValue(i64::try_from(value).unwrap_or(i64::MAX))),
        }),
        ..KeyValue::default()
    }
}

/// A point's attributes from a catalogue label set, without the labels
/// its process's resource carries (`pid`, `comm`).
fn attributes(labels: &Labels<'_>) -> Vec<KeyValue> {
    labels
        .iter()
        .filter(|(key, _)| !matches!(*key, "pid" | "comm"))
        .map(|(key, value)| match value {
            Value::Str(s) => string(key, *s),
            Value::Num(n) => int(key, *n),
        })
        .collect()
}

/// `OTEL_RESOURCE_ATTRIBUTES` (`key=value,key=value`, values
/// percent-decoded as far as `%2C`, `%3D` and `%25` go), for the agent's
/// resource.
fn env_resource_attributes() -> Vec<KeyValue> {
    let Ok(text) = std::env::var("OTEL_RESOURCE_ATTRIBUTES") else {
        return Vec::new();
    };
    text.split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| string(k, v.replace("%2C", ",").replace("%3D", "=").replace("%25", "%")))
        .collect()
}

/// The agent's own resource.
fn agent_resource(snapshot: &AgentSnapshot, host: Option<&str>) -> Resource {
    let mut attributes = vec![
        string("service.name", "subetha-agent"),
        string("service.version", snapshot.agent.version.clone()),
        int("process.pid", snapshot.agent.pid.into()),
    ];
    if let Some(host) = host {
        attributes.push(string("host.name", host));
    }
    for extra in env_resource_attributes() {
        attributes.retain(|a| a.key != extra.key);
        attributes.push(extra);
    }
    Resource {
        attributes,
        ..Resource::default()
    }
}

/// An instrumented process's resource: `host.name`, `process.pid`,
/// `process.executable.name`, `process.command` (its `comm`),
/// `process.real_user.id`, `service.name` (its `SUBETHA_SERVICE` or
/// executable, `unknown_service:<exe>` otherwise, as the conventions ask),
/// and `container.id`, `k8s.pod.uid` when known; plus
/// `subetha.process.nspid` (its pid in its own namespace) for a process in
/// a container.
pub fn process_resource(process: &ProcessReport, host: Option<&str>) -> Resource {
    let exe = if process.exe.is_empty() {
        &process.comm
    } else {
        &process.exe
    };
    let mut attributes = vec![
        string(
            "service.name",
            process
                .service
                .clone()
                .unwrap_or_else(|| format!("unknown_service:{exe}")),
        ),
        int("process.pid", process.pid.into()),
        string("process.executable.name", exe.clone()),
        string("process.command", process.comm.clone()),
        int("process.real_user.id", process.uid.into()),
    ];
    if let Some(host) = host {
        attributes.push(string("host.name", host));
    }
    if let Some(id) = &process.container_id {
        attributes.push(string("container.id", id.clone()));
    }
    if let Some(uid) = &process.pod_uid {
        attributes.push(string("k8s.pod.uid", uid.clone()));
    }
    if process.nspid.len() > 1
        && let Some(&own) = process.nspid.last()
    {
        attributes.push(int("subetha.process.nspid", own.into()));
    }
    Resource {
        attributes,
        ..Resource::default()
    }
}

/// Metrics of one resource, all points stamped with one time and start.
struct Metrics {
    start_ns: u64,
    time_ns: u64,
    out: Vec<Metric>,
}

impl Metrics {
    fn new(start_ns: u64, time_ns: u64) -> Self {
        Self {
            start_ns,
            time_ns,
            out: Vec::new(),
        }
    }

    fn point(&self, attributes: Vec<KeyValue>, value: NumberValue) -> NumberDataPoint {
        NumberDataPoint {
            attributes,
            start_time_unix_nano: self.start_ns,
            time_unix_nano: self.time_ns,
            value: Some(value),
            ..NumberDataPoint::default()
        }
    }

    fn push(&mut self, family: &Series, data: Data, empty: bool) {
        if empty {
            return;
        }
        let otlp = family
            .otlp
            .unwrap_or_else(|| panic!("{} has no OTLP form", family.name));
        self.out.push(Metric {
            name: otlp.name.to_owned(),
            description: family.help_for(false).into_owned(),
            unit: otlp.unit.to_owned(),
            data: Some(data),
            ..Metric::default()
        });
    }

    /// A cumulative monotonic sum; nothing without points.
    fn counter(&mut self, family: &Series, points: Vec<(Vec<KeyValue>, u64)>) {
        debug_assert_eq!(family.kind, series::Kind::Counter, "{}", family.name);
        let data_points: Vec<_> = points
            .into_iter()
            .map(|(attrs, n)| self.point(attrs, NumberValue::AsInt(i64::try_from(n).unwrap_or(i64::MAX))))
            .collect();
        let empty = data_points.is_empty();
        let data = Data::Sum(Sum {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        });
        self.push(family, data, empty);
    }

    fn gauge(&mut self, family: &Series, points: Vec<(Vec<KeyValue>, NumberValue)>) {
        debug_assert_eq!(family.kind, series::Kind::Gauge, "{}", family.name);
        let data_points: Vec<_> = points
            .into_iter()
            .map(|(attrs, value)| NumberDataPoint {
                start_time_unix_nano: 0,
                ..self.point(attrs, value)
            })
            .collect();
        let empty = data_points.is_empty();
        self.push(family, Data::Gauge(Gauge { data_points }), empty);
    }

    fn int_gauge(&mut self, family: &Series, points: Vec<(Vec<KeyValue>, u64)>) {
        let points = points
            .into_iter()
            .map(|(a, n)| (a, NumberValue::AsInt(i64::try_from(n).unwrap_or(i64::MAX))))
            .collect();
        self.gauge(family, points);
    }

    /// A cumulative explicit-bucket histogram in seconds on
    /// [`BUCKET_BOUNDS_NS`]; `max_ns` per point where known.
    fn histogram(&mut self, family: &Series, points: Vec<(Vec<KeyValue>, &Buckets, Option<u64>)>) {
        debug_assert_eq!(family.kind, series::Kind::Histogram, "{}", family.name);
        let data_points: Vec<_> = points
            .into_iter()
            .map(|(attributes, buckets, max_ns)| HistogramDataPoint {
                attributes,
                start_time_unix_nano: self.start_ns,
                time_unix_nano: self.time_ns,
                count: buckets.count,
                sum: Some(seconds(buckets.sum_ns)),
                bucket_counts: (0..=BUCKET_BOUNDS_NS.len())
                    .map(|i| buckets.counts.get(i).copied().unwrap_or(0))
                    .collect(),
                explicit_bounds: BUCKET_BOUNDS_NS.iter().map(|&b| seconds(b)).collect(),
                max: max_ns.filter(|_| buckets.count > 0).map(seconds),
                ..HistogramDataPoint::default()
            })
            .collect();
        let empty = data_points.is_empty();
        let data = Data::Histogram(Histogram {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        });
        self.push(family, data, empty);
    }

    fn into_resource(self, resource: Resource) -> ResourceMetrics {
        ResourceMetrics {
            resource: Some(resource),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "subetha-agent".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                metrics: self.out,
                schema_url: String::new(),
            }],
            schema_url: SCHEMA_URL.into(),
        }
    }
}

/// The export request for `snapshot`: the agent's resource first, then
/// one per process. `agent_start_ns` (Unix ns) starts the agent's sums.
pub fn request(
    snapshot: &AgentSnapshot,
    agent_start_ns: u64,
    host: Option<&str>,
) -> ExportMetricsServiceRequest {
    let agent = &snapshot.agent;
    let now_ns = agent.taken_unix_ms.saturating_mul(1_000_000);
    let views = views(snapshot);
    let mut own = Metrics::new(agent_start_ns.min(now_ns), now_ns);
    let none = Vec::new;
    own.counter(&series::AGENT_SCANS, vec![(none(), agent.scans)]);
    own.counter(&series::PROBE_EVENTS, vec![(none(), agent.probe_events)]);
    own.counter(&series::PROBE_LOST_EVENTS, vec![(none(), agent.probe_losses)]);
    own.counter(&series::PROBE_FILTERED, vec![(none(), agent.probe_filtered)]);
    own.gauge(
        &series::SCAN_INTERVAL,
        vec![(none(), NumberValue::AsDouble(agent.scan_interval_us as f64 / 1e6))],
    );
    own.int_gauge(
        &series::SEGMENTS_REFUSED,
        vec![(none(), snapshot.refused.len() as u64)],
    );
    own.int_gauge(
        &series::PROCESSES,
        process_states(&views)
            .into_iter()
            .map(|(state, n)| (vec![string("state", state)], n))
            .collect(),
    );
    own.histogram(
        &series::SCAN_DURATION,
        vec![(
            none(),
            &agent.scan_duration_buckets,
            Some(agent.scan_duration_ns.max),
        )],
    );
    own.histogram(
        &series::SCAN_GAP,
        vec![(none(), &agent.scan_gap_buckets, Some(agent.scan_gap_ns.max))],
    );
    let mut resources = vec![own.into_resource(agent_resource(snapshot, host))];
    for view in &views {
        let process = view.process;
        let attached_ns = now_ns.saturating_sub(agent.taken_mono_ns.saturating_sub(process.attached_mono_ns));
        let mut m = Metrics::new(attached_ns, now_ns);
        process_metrics(&mut m, snapshot, view);
        resources.push(m.into_resource(process_resource(process, host)));
    }
    ExportMetricsServiceRequest {
        resource_metrics: resources,
    }
}

/// The metrics of one process's resource.
fn process_metrics(m: &mut Metrics, snapshot: &AgentSnapshot, view: &ProcessView<'_>) {
    let process = view.process;
    let none = Vec::new;
    m.int_gauge(&series::SEGMENT_SIZE, vec![(none(), process.segment_bytes)]);
    m.int_gauge(
        &series::SEGMENT_RESIDENT,
        vec![(none(), process.segment_resident_bytes)],
    );
    m.counter(&series::LOST_NO_RING, vec![(none(), process.lost_no_ring)]);
    m.counter(&series::UNATTRIBUTED, vec![(none(), process.unattributed)]);
    m.int_gauge(
        &series::RINGS,
        view.ring_states().map(|(l, n)| (attributes(&l), n)).collect(),
    );
    m.int_gauge(&series::RINGS_CORRUPT, vec![(none(), view.corrupt_rings())]);
    let ring = |value: fn(&crate::model::RingReport) -> u64, total: Option<u64>| {
        view.ring_counter(false, value, total)
            .into_iter()
            .map(|(l, n)| (attributes(&l), n))
            .collect::<Vec<_>>()
    };
    m.counter(&series::DRAINED, ring(|r| r.drained, None));
    m.counter(&series::DROPPED, ring(|r| r.dropped, None));
    m.counter(
        &series::DROP_EPISODES,
        ring(|r| r.episodes, Some(process.episodes)),
    );
    let ops = |value: fn(&crate::model::OpReport) -> u64| {
        view.ops()
            .map(|(l, _, op)| (attributes(&l), value(op)))
            .collect::<Vec<_>>()
    };
    m.counter(&series::INSTANCE_OPS, ops(|op| op.ops));
    m.counter(&series::INSTANCE_CONTENDED, ops(|op| op.contended));
    m.counter(&series::INSTANCE_MISSES, ops(|op| op.misses));
    m.int_gauge(&series::INSTANCE_THREADS, ops(|op| op.threads));
    m.counter(
        &series::DROPS_ATTRIBUTED,
        view.instances
            .iter()
            .map(|(i, _)| (attributes(&view.instance_labels(i)), i.drops_attributed))
            .collect(),
    );
    m.histogram(
        &series::INSTANCE_LATENCY,
        view.ops()
            .filter(|(_, _, op)| op.latency_buckets.count > 0)
            .map(|(l, _, op)| (attributes(&l), &op.latency_buckets, Some(op.latency_ns.max)))
            .collect(),
    );
    m.counter(&series::STORMS_BEGUN, vec![(none(), process.storms)]);
    m.counter(
        &series::STORMS,
        view.storm_causes().map(|(l, n)| (attributes(&l), n)).collect(),
    );
    m.int_gauge(&series::STORMS_ACTIVE, vec![(none(), view.open_storms(snapshot))]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_urls() {
        assert_eq!(
            metrics_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/metrics"
        );
        assert_eq!(
            metrics_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(
            metrics_url("https://otel.example/otlp/v1/metrics").unwrap(),
            "https://otel.example/otlp/v1/metrics"
        );
        for (bad, phrase) in [
            ("collector:4318", "not an http:// or https:// URL"),
            ("ftp://collector/v1/metrics", "scheme"),
            ("http:///v1/metrics", "no valid host"),
            ("http://", "no valid host"),
        ] {
            let error = metrics_url(bad).unwrap_err().to_string();
            assert!(error.contains(phrase), "{bad}: {error}");
        }
    }

    fn text(kvs: &[KeyValue], key: &str) -> Option<String> {
        kvs.iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                AnyValueKind::StringValue(s) => Some(s.clone()),
                AnyValueKind::IntValue(n) => Some(n.to_string()),
                _ => None,
            })
    }

    #[test]
    fn a_request_decodes_with_histograms_and_semantic_conventions() {
        let snapshot = crate::metrics::tests::sample();
        let bytes = request(&snapshot, 1, Some("node-7")).encode_to_vec();
        let decoded = ExportMetricsServiceRequest::decode(bytes.as_slice()).expect("a valid protobuf");
        assert_eq!(decoded.resource_metrics.len(), 2, "the agent, then one process");
        let agent = decoded.resource_metrics[0].resource.as_ref().unwrap();
        assert_eq!(
            text(&agent.attributes, "service.name").as_deref(),
            Some("subetha-agent")
        );
        assert_eq!(text(&agent.attributes, "host.name").as_deref(), Some("node-7"));
        let process = &decoded.resource_metrics[1];
        let attrs = &process.resource.as_ref().unwrap().attributes;
        for (key, value) in [
            ("process.pid", "4242"),
            ("process.executable.name", "app-server"),
            ("process.command", "app"),
            ("service.name", "checkout"),
            ("host.name", "node-7"),
            (
                "container.id",
                "4f1c6b0f2a6f9a1e5f3d1c2b3a4958677a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d",
            ),
            ("subetha.process.nspid", "1"),
        ] {
            assert_eq!(text(attrs, key).as_deref(), Some(value), "{key} in {attrs:?}");
        }
        assert_eq!(text(attrs, "k8s.pod.uid"), None, "no pod: no attribute");
        assert_eq!(process.schema_url, SCHEMA_URL);
        let metrics = &process.scope_metrics[0].metrics;
        let metric = |name: &str| {
            metrics
                .iter()
                .find(|m| m.name == name)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let Some(Data::Histogram(latency)) = &metric("subetha.instance.latency").data else {
            panic!("latency is not a histogram");
        };
        assert_eq!(
            latency.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let point = &latency.data_points[0];
        assert_eq!(point.count, 10);
        assert_eq!(point.explicit_bounds.len(), BUCKET_BOUNDS_NS.len());
        assert_eq!(point.explicit_bounds[2], 1e-6);
        assert_eq!(point.bucket_counts.len(), BUCKET_BOUNDS_NS.len() + 1);
        assert_eq!(point.bucket_counts.iter().sum::<u64>(), point.count);
        assert_eq!(&point.bucket_counts[..5], &[0, 0, 5, 4, 1]);
        assert_eq!(point.sum, Some(0.000021));
        assert_eq!(point.max, Some(0.00001));
        assert_eq!(text(&point.attributes, "op").as_deref(), Some("lock"));
        assert_eq!(
            text(&point.attributes, "pid"),
            None,
            "the process is the resource"
        );
        let Some(Data::Sum(ops)) = &metric("subetha.instance.ops").data else {
            panic!("ops is not a sum");
        };
        assert!(ops.is_monotonic);
        assert!(
            ops.data_points
                .iter()
                .all(|p| p.start_time_unix_nano > 0 && p.start_time_unix_nano <= p.time_unix_nano)
        );
        assert!(
            metrics
                .iter()
                .all(|m| !m.name.ends_with(".p99") && !m.name.ends_with(".p50")),
            "no gauge per quantile"
        );
        let Some(Data::Sum(dropped)) = &metric("subetha.observations.dropped").data else {
            panic!("dropped is not a sum");
        };
        assert_eq!(dropped.data_points.len(), 1, "per process, not per thread");
        let agent_metrics = &decoded.resource_metrics[0].scope_metrics[0].metrics;
        assert!(
            agent_metrics
                .iter()
                .any(|m| m.name == "subetha.scan.duration" && matches!(m.data, Some(Data::Histogram(_))))
        );
    }

    #[test]
    fn zero_interval_is_refused() {
        let source: SnapshotSource = Arc::new(|| Arc::new(AgentSnapshot::default()));
        let error = start("http://127.0.0.1:9/v1/metrics", Duration::ZERO, source).unwrap_err();
        assert!(error.to_string().contains("interval"), "{error}");
    }
}
