//! Optional OTLP metrics export (`--otlp-endpoint`): the facts of
//! `/metrics`, pushed to an OpenTelemetry collector over OTLP/HTTP
//! (protobuf), so a fleet with a collector needs no scraping.
//!
//! # What it promises
//!
//! * Every export carries the latest [`AgentSnapshot`]: the instruments are
//!   *observable* (counters and gauges with callbacks), fed on each
//!   collection from the snapshot source, never incremented live. The series
//!   are the ones `/metrics` has (the same de-duplicated processes,
//!   instances and op kinds, see [`crate::metrics`]), under OpenTelemetry
//!   names: dots instead of underscores, the unit as the instrument's unit
//!   (`s`, `By`, `{operation}`…) rather than a suffix, and no `_total`. A
//!   collector's Prometheus exporter maps them back to the `/metrics`
//!   names (`subetha.instance.ops` with unit `{operation}` becomes
//!   `subetha_instance_ops_total`).
//! * Counters are cumulative (the snapshot's totals are), so a lost export
//!   loses resolution, not counts.
//! * Latency and scan-time summaries become one gauge per quantile
//!   (`subetha.instance.latency.p50` … `.p999`, `.max`, in seconds) and a
//!   sample counter (`subetha.instance.latency.samples`): the snapshot holds
//!   quantiles, not buckets, and OpenTelemetry has no summary instrument.
//!   The two info series of `/metrics` are not repeated: the agent's
//!   version is the resource's `service.version`, and a process's uid and
//!   state are in the JSON API.
//! * The resource says `service.name=subetha-agent`, `service.version`,
//!   `host.name` (plus whatever `OTEL_RESOURCE_ATTRIBUTES` adds).
//! * An export that fails (collector down, refused, timed out) is logged —
//!   once when exports start failing, once when they recover — and never
//!   stops the agent; the next period tries again.
//! * Dropping the [`OtlpExporter`] collects and exports one last time, then
//!   stops: counts made just before a shutdown reach the collector.
//!
//! Within one export, instruments read the latest snapshot each; two of them
//! may see consecutive snapshots (the agent publishes one every few
//! milliseconds), never a snapshot older than the export.
//!
//! The exporter is `opentelemetry-otlp`'s HTTP exporter with its blocking
//! `reqwest` client, driven by the SDK's `PeriodicReader` on its own thread:
//! no async runtime is involved, so [`start`] can be called outside one and
//! the guard can be dropped anywhere but inside an async task.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_otlp::{MetricExporter, Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};

use crate::AgentSnapshot;
use crate::metrics::{Labels, MetricsOptions, ProcessView, Value, process_states, seconds, views};
use crate::model::Quantiles;

/// Where the snapshot comes from: the running agent's latest.
pub type SnapshotSource = Arc<dyn Fn() -> Arc<AgentSnapshot> + Send + Sync>;

/// The path OTLP/HTTP collectors receive metrics on; appended to an
/// endpoint given without a path.
pub const METRICS_PATH: &str = "/v1/metrics";

/// Longest an export may take (connect, send, retries) before it counts as
/// failed; also bounds how long the final export can delay a shutdown.
const MAX_EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts exporting to `endpoint` every `interval`; the returned guard
/// flushes and stops on drop.
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
    let exporter = MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .with_timeout(timeout)
        .with_temporality(Temporality::Cumulative)
        .build()
        .with_context(|| format!("building the OTLP exporter for {url}"))?;
    let exporter = LoggingExporter {
        inner: exporter,
        url: url.clone(),
        failing: AtomicBool::new(false),
    };
    let reader = PeriodicReader::builder(exporter).with_interval(interval).build();
    let provider = SdkMeterProvider::builder()
        .with_resource(resource())
        .with_reader(reader)
        .build();
    register_instruments(&provider.meter("subetha-agent"), &source);
    tracing::info!(%url, ?interval, "exporting metrics over OTLP/HTTP");
    Ok(OtlpExporter { provider, url })
}

/// A running OTLP exporter. Dropping it exports once more and stops.
pub struct OtlpExporter {
    provider: SdkMeterProvider,
    url: String,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter").field("url", &self.url).finish()
    }
}

impl Drop for OtlpExporter {
    fn drop(&mut self) {
        // The reader's shutdown collects and exports a last time; a failure
        // was already logged by `LoggingExporter`.
        if let Err(error) = self.provider.shutdown() {
            tracing::debug!(%error, "OTLP exporter shutdown");
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

/// `service.name`, `service.version`, `host.name`.
fn resource() -> Resource {
    let mut builder = Resource::builder()
        .with_service_name("subetha-agent")
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if let Some(host) = host_name() {
        builder = builder.with_attribute(KeyValue::new("host.name", host));
    }
    builder.build()
}

/// The kernel's host name (`/proc/sys/kernel/hostname`).
fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// The OTLP exporter, logging when exports start and stop failing (the SDK
/// itself only reports through its own internal logs, which are off).
struct LoggingExporter {
    inner: MetricExporter,
    url: String,
    failing: AtomicBool,
}

impl std::fmt::Debug for LoggingExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoggingExporter").field("url", &self.url).finish()
    }
}

impl PushMetricExporter for LoggingExporter {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        match &result {
            Err(error) if !self.failing.swap(true, Ordering::Relaxed) => {
                tracing::warn!(url = %self.url, %error, "OTLP export failed; retrying every period");
            }
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!(url = %self.url, "OTLP export works again");
            }
            _ => {}
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// OpenTelemetry attributes of a `/metrics` label set.
fn attributes(labels: &Labels<'_>) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(key, value)| match value {
            Value::Str(s) => KeyValue::new(*key, s.to_string()),
            Value::Num(n) => KeyValue::new(*key, i64::try_from(*n).unwrap_or(i64::MAX)),
        })
        .collect()
}

/// Points of one instrument: `(value, labels)`.
type Points<'a, V> = Vec<(V, Labels<'a>)>;

/// Points of one instrument as OpenTelemetry wants them.
type Observed<V> = Vec<(V, Vec<KeyValue>)>;

/// What an instrument observes, from the snapshot and its process views.
type PointsFn<V> = fn(&AgentSnapshot, &[ProcessView<'_>]) -> Observed<V>;

/// [`PointsFn`] of a seconds gauge, which may capture what it picks.
type SecondsFn = Box<dyn Fn(&AgentSnapshot, &[ProcessView<'_>]) -> Observed<f64> + Send + Sync>;

/// Picks one number out of [`Quantiles`].
type Pick = fn(&Quantiles) -> u64;

/// Registers the observable instruments; they live as long as `meter`'s
/// provider.
fn register_instruments(meter: &Meter, source: &SnapshotSource) {
    let counter = |name: &'static str, unit: &'static str, help: &'static str, points: PointsFn<u64>| {
        let source = Arc::clone(source);
        meter
            .u64_observable_counter(name)
            .with_unit(unit)
            .with_description(help)
            .with_callback(move |observer| {
                let snapshot = source();
                for (value, attrs) in points(&snapshot, &views(&snapshot)) {
                    observer.observe(value, &attrs);
                }
            })
            .build();
    };
    let u64_gauge = |name: &'static str, unit: &'static str, help: &'static str, points: PointsFn<u64>| {
        let source = Arc::clone(source);
        meter
            .u64_observable_gauge(name)
            .with_unit(unit)
            .with_description(help)
            .with_callback(move |observer| {
                let snapshot = source();
                for (value, attrs) in points(&snapshot, &views(&snapshot)) {
                    observer.observe(value, &attrs);
                }
            })
            .build();
    };
    let seconds_gauge = |name: String, help: String, points: SecondsFn| {
        let source = Arc::clone(source);
        meter
            .f64_observable_gauge(name)
            .with_unit("s")
            .with_description(help)
            .with_callback(move |observer| {
                let snapshot = source();
                for (value, attrs) in points(&snapshot, &views(&snapshot)) {
                    observer.observe(value, &attrs);
                }
            })
            .build();
    };
    fn owned<V>(points: Points<'_, V>) -> Observed<V> {
        points.into_iter().map(|(v, l)| (v, attributes(&l))).collect()
    }

    // The agent.
    counter(
        "subetha.agent.scans",
        "{scan}",
        "Scans of all attached segments completed.",
        |s, _| vec![(s.agent.scans, vec![])],
    );
    counter(
        "subetha.probe.events",
        "{event}",
        "Events read from the eBPF probes.",
        |s, _| vec![(s.agent.probe_events, vec![])],
    );
    counter(
        "subetha.probe.lost_events",
        "{event}",
        "Events the eBPF probes could not deliver (ring buffer full).",
        |s, _| vec![(s.agent.probe_losses, vec![])],
    );
    counter(
        "subetha.probe.filtered_intervals",
        "{interval}",
        "Off-CPU intervals the eBPF probes' in-kernel filter kept back as unremarkable.",
        |s, _| vec![(s.agent.probe_filtered, vec![])],
    );
    seconds_gauge(
        "subetha.agent.scan_interval".into(),
        "Current pause between scans (adapts to ring fill).".into(),
        Box::new(|s, _| vec![(s.agent.scan_interval_us as f64 / 1e6, vec![])]),
    );
    u64_gauge(
        "subetha.segments.refused",
        "{segment}",
        "Segments found but refused as invalid (bounded history).",
        |s, _| vec![(s.refused.len() as u64, vec![])],
    );
    quantile_gauges(
        &seconds_gauge,
        "subetha.scan.duration",
        "Duration of one scan of all attached segments",
        |s, _| vec![(s.agent.scan_duration_ns, vec![])],
    );
    quantile_gauges(
        &seconds_gauge,
        "subetha.scan.gap",
        "Gap between the end of a scan and the start of the next",
        |s, _| vec![(s.agent.scan_gap_ns, vec![])],
    );
    counter(
        "subetha.scan.duration.samples",
        "{scan}",
        "Scans timed for subetha.scan.duration.",
        |s, _| vec![(s.agent.scan_duration_ns.count, vec![])],
    );

    // Processes.
    u64_gauge(
        "subetha.processes",
        "{process}",
        "Instrumented processes by state (attached, waiting, exited and retained).",
        |_, v| {
            process_states(v)
                .into_iter()
                .map(|(state, n)| (n, vec![KeyValue::new("state", state.to_owned())]))
                .collect()
        },
    );
    u64_gauge(
        "subetha.segment.size",
        "By",
        "Size of the process's shared-memory segment.",
        |_, v| owned(v.iter().map(|p| (p.process.segment_bytes, p.labels())).collect()),
    );
    u64_gauge(
        "subetha.segment.resident",
        "By",
        "Resident (touched) part of the process's shared-memory segment.",
        |_, v| {
            owned(
                v.iter()
                    .map(|p| (p.process.segment_resident_bytes, p.labels()))
                    .collect(),
            )
        },
    );
    counter(
        "subetha.observations.lost_no_ring",
        "{observation}",
        "Observations lost because their thread found no free ring slot.",
        |_, v| owned(v.iter().map(|p| (p.process.lost_no_ring, p.labels())).collect()),
    );
    counter(
        "subetha.observations.unattributed",
        "{observation}",
        "Drained observations whose instance id matched no registered instance.",
        |_, v| owned(v.iter().map(|p| (p.process.unattributed, p.labels())).collect()),
    );

    // Rings.
    u64_gauge(
        "subetha.rings",
        "{ring}",
        "Ring slots of the process by state.",
        |_, v| {
            owned(
                v.iter()
                    .flat_map(|p| p.ring_states().map(|(l, n)| (n, l)))
                    .collect(),
            )
        },
    );
    u64_gauge(
        "subetha.rings.corrupt",
        "{ring}",
        "Ring slots whose indices were impossible (corrupt or hostile segment).",
        |_, v| owned(v.iter().map(|p| (p.corrupt_rings(), p.labels())).collect()),
    );
    counter(
        "subetha.observations.drained",
        "{observation}",
        "Observations drained from the process's rings, by any consumer.",
        |_, v| owned(rings(v, |r| r.drained, |_| None)),
    );
    counter(
        "subetha.observations.dropped",
        "{observation}",
        "Observations dropped because a ring of the process was full.",
        |_, v| owned(rings(v, |r| r.dropped, |_| None)),
    );
    counter(
        "subetha.drop_episodes",
        "{episode}",
        "Drop episodes (runs of consecutive drops) seen on the process's rings by this agent.",
        |_, v| owned(rings(v, |r| r.episodes, |p| Some(p.episodes))),
    );

    // Instances.
    counter(
        "subetha.instance.ops",
        "{operation}",
        "Operations on the instance, by op kind.",
        |_, v| owned(ops(v, |op| Some(op.ops))),
    );
    counter(
        "subetha.instance.contended",
        "{operation}",
        "Operations on the instance that had to wait, by op kind.",
        |_, v| owned(ops(v, |op| Some(op.contended))),
    );
    counter(
        "subetha.instance.misses",
        "{operation}",
        "Operations on the instance that found nothing (empty or full, timed out), by op kind.",
        |_, v| owned(ops(v, |op| Some(op.misses))),
    );
    u64_gauge(
        "subetha.instance.threads",
        "{thread}",
        "Distinct producer threads seen operating on the instance, by op kind.",
        |_, v| owned(ops(v, |op| Some(op.threads))),
    );
    counter(
        "subetha.instance.drops_attributed",
        "{observation}",
        "Ring drops attributed to the instance (first dropped observation of an episode).",
        |_, v| {
            owned(
                v.iter()
                    .flat_map(|p| {
                        p.instances
                            .iter()
                            .map(move |(i, _)| (i.drops_attributed, p.instance_labels(i)))
                    })
                    .collect(),
            )
        },
    );
    quantile_gauges(
        &seconds_gauge,
        "subetha.instance.latency",
        "Measured operation latency on the instance (contended and sampled paths), by op kind",
        |_, v| {
            v.iter()
                .flat_map(ProcessView::ops)
                .filter(|(_, _, op)| op.latency_ns.count > 0)
                .map(|(labels, _, op)| (op.latency_ns, attributes(&labels)))
                .collect()
        },
    );
    counter(
        "subetha.instance.latency.samples",
        "{operation}",
        "Operations whose latency went into subetha.instance.latency, by op kind.",
        |_, v| {
            owned(ops(v, |op| {
                (op.latency_ns.count > 0).then_some(op.latency_ns.count)
            }))
        },
    );

    // Storms.
    counter(
        "subetha.storms.begun",
        "{storm}",
        "Drop storms begun in the process since the agent attached.",
        |_, v| owned(v.iter().map(|p| (p.process.storms, p.labels())).collect()),
    );
    counter(
        "subetha.storms",
        "{storm}",
        "Drop storms whose cause is settled, by cause (begun minus these are still being diagnosed).",
        |_, v| {
            owned(
                v.iter()
                    .flat_map(|p| p.storm_causes().map(|(l, n)| (n, l)))
                    .collect(),
            )
        },
    );
    u64_gauge(
        "subetha.storms.active",
        "{storm}",
        "Drop storms of the process still going on.",
        |s, v| owned(v.iter().map(|p| (p.open_storms(s), p.labels())).collect()),
    );
}

/// `(value, process labels)` of a ring counter for every process: the
/// rings' sum, or `total` where that is not monotonic. Never per thread
/// (see [`MetricsOptions`]).
fn rings<'a>(
    views: &[ProcessView<'a>],
    value: fn(&crate::model::RingReport) -> u64,
    total: fn(&crate::model::ProcessReport) -> Option<u64>,
) -> Points<'a, u64> {
    views
        .iter()
        .flat_map(|p| {
            p.ring_counter(MetricsOptions::default(), value, total(p.process))
                .into_iter()
                .map(|(labels, n)| (n, labels))
        })
        .collect()
}

/// `(value, op labels)` for every op kind of every instance `value` has one
/// for.
fn ops<'a>(views: &[ProcessView<'a>], value: fn(&crate::model::OpReport) -> Option<u64>) -> Points<'a, u64> {
    views
        .iter()
        .flat_map(|p| p.ops().filter_map(|(labels, _, op)| Some((value(op)?, labels))))
        .collect()
}

/// The quantiles and maximum of each series `points` gives, one gauge
/// each (`<name>.p50` … `.p999`, `.max`, seconds), for series with samples.
fn quantile_gauges(
    seconds_gauge: &impl Fn(String, String, SecondsFn),
    name: &str,
    help: &str,
    points: PointsFn<Quantiles>,
) {
    let pick: [(&str, &str, Pick); 5] = [
        ("p50", "median", |q| q.p50),
        ("p90", "90th percentile", |q| q.p90),
        ("p99", "99th percentile", |q| q.p99),
        ("p999", "99.9th percentile", |q| q.p999),
        ("max", "maximum", |q| q.max),
    ];
    for (suffix, what, value) in pick {
        seconds_gauge(
            format!("{name}.{suffix}"),
            format!("{help}: {what}."),
            Box::new(move |s, v| {
                points(s, v)
                    .into_iter()
                    .filter(|(q, _)| q.count > 0)
                    .map(|(q, attrs)| (seconds(value(&q)), attrs))
                    .collect()
            }),
        );
    }
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

    #[test]
    fn zero_interval_is_refused() {
        let source: SnapshotSource = Arc::new(|| Arc::new(AgentSnapshot::default()));
        let error = start("http://127.0.0.1:9/v1/metrics", Duration::ZERO, source).unwrap_err();
        assert!(error.to_string().contains("interval"), "{error}");
    }
}
