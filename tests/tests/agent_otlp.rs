//! OTLP metrics export (`--otlp-endpoint`) from the real agent binary to a
//! collector played by this test: a plain HTTP/1.1 server on loopback that
//! accepts `POST /v1/metrics` and decodes each body as an
//! `ExportMetricsServiceRequest` (protobuf).
//!
//! * Periodic exports carry the workloads' exact counts
//!   ([`subetha_tests::fleet`]): every instance's ops, the bursty process's
//!   drained and dropped observations and storms, as cumulative monotonic
//!   sums; the agent's resource names the service and host, and each
//!   process is a resource of its own with OpenTelemetry's semantic
//!   conventions (`process.pid`, `process.executable.name`, `service.name`,
//!   `host.name`); latencies are explicit-bucket histograms whose buckets
//!   add up to their count, not gauges per quantile.
//! * SIGTERM exports one last time: with an hour-long period nothing is
//!   sent before the signal, and the final counts arrive before exit 0.
//! * A collector that is not there is logged, not fatal: the agent keeps
//!   serving and still exits 0.
//! * A malformed endpoint fails at start-up with a clear message.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::metrics::v1::AggregationTemporality;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as NumberValue;
use prost::Message as _;
use subetha_tests::agent::{AgentProcess, ScratchDir, agent_exe, free_port};
use subetha_tests::fleet::{Fleet, MANY_INSTANCES, PER_INSTANCE};
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");
/// Above the kernel's pid_max: no such process.
const NO_PID: &str = "4194305";

/// One request the collector received.
struct Received {
    at: SystemTime,
    path: String,
    content_type: String,
    request: Result<ExportMetricsServiceRequest, String>,
}

/// A minimal OTLP/HTTP collector on a free loopback port; its threads end
/// with the test process.
struct Collector {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    /// The HTTP status it answers with (200 unless a test makes it fail).
    status: Arc<AtomicU16>,
}

impl Collector {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the collector");
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(AtomicU16::new(200));
        let (sink, answer) = (Arc::clone(&received), Arc::clone(&status));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (sink, answer) = (Arc::clone(&sink), Arc::clone(&answer));
                std::thread::spawn(move || serve(stream, &sink, &answer));
            }
        });
        Self {
            addr,
            received,
            status,
        }
    }

    /// Decoded requests received after `after`.
    fn requests_after(&self, after: SystemTime) -> Vec<ExportMetricsServiceRequest> {
        let received = self.received.lock().unwrap();
        received
            .iter()
            .filter(|r| r.at > after)
            .map(|r| {
                assert_eq!(r.path, "/v1/metrics", "OTLP/HTTP metrics path");
                assert_eq!(r.content_type, "application/x-protobuf", "OTLP/HTTP protobuf");
                r.request
                    .clone()
                    .unwrap_or_else(|e| panic!("undecodable export: {e}"))
            })
            .collect()
    }

    fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }
}

/// Serves HTTP/1.1 requests on one connection until it closes.
fn serve(stream: TcpStream, sink: &Mutex<Vec<Received>>, status: &AtomicU16) {
    let mut writer = stream.try_clone().expect("clone the stream");
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).map_or(true, |n| n == 0) {
            return;
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let path = parts.next().unwrap_or_default().to_owned();
        let mut length = 0usize;
        let mut content_type = String::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).map_or(true, |n| n == 0) {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().expect("content-length"),
                    "content-type" => content_type = value.trim().to_owned(),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let request = if method == "POST" {
            ExportMetricsServiceRequest::decode(body.as_slice()).map_err(|e| e.to_string())
        } else {
            Err(format!("{method} instead of POST"))
        };
        sink.lock().unwrap().push(Received {
            at: SystemTime::now(),
            path,
            content_type,
            request,
        });
        // 200: an empty ExportMetricsServiceResponse, full success.
        let reply = match status.load(Ordering::Relaxed) {
            200 => "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
                .to_owned(),
            code => format!("HTTP/1.1 {code} Failing\r\nContent-Length: 0\r\n\r\n"),
        };
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// One number data point, flattened; its attributes include its
/// resource's.
#[derive(Debug)]
struct Point {
    name: String,
    unit: String,
    attributes: BTreeMap<String, String>,
    value: f64,
    /// `Some(true)` for a cumulative monotonic sum, `None` for a gauge.
    cumulative_monotonic: Option<bool>,
}

fn text(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

/// Every number data point of `request` (histograms are checked by
/// [`histograms`]).
fn points(request: &ExportMetricsServiceRequest) -> Vec<Point> {
    let mut out = Vec::new();
    for resource in &request.resource_metrics {
        let resource_attributes = attributes(&resource.resource.as_ref().expect("a resource").attributes);
        for scope in &resource.scope_metrics {
            for metric in &scope.metrics {
                let (data_points, cumulative_monotonic) = match &metric.data {
                    Some(Data::Histogram(_)) => continue,
                    Some(Data::Sum(sum)) => (
                        &sum.data_points,
                        Some(
                            sum.is_monotonic
                                && sum.aggregation_temporality == AggregationTemporality::Cumulative as i32,
                        ),
                    ),
                    Some(Data::Gauge(gauge)) => (&gauge.data_points, None),
                    other => panic!("{}: unexpected data {other:?}", metric.name),
                };
                for point in data_points {
                    let value = match point.value {
                        Some(NumberValue::AsInt(i)) => i as f64,
                        Some(NumberValue::AsDouble(d)) => d,
                        None => panic!("{}: a point without a value", metric.name),
                    };
                    let mut merged = resource_attributes.clone();
                    merged.extend(attributes(&point.attributes));
                    out.push(Point {
                        name: metric.name.clone(),
                        unit: metric.unit.clone(),
                        attributes: merged,
                        value,
                        cumulative_monotonic,
                    });
                }
            }
        }
    }
    out
}

/// Σ of `metric`'s points of process `pid`, grouped by attribute `by`
/// (`""`: one group).
fn sum_by(points: &[Point], metric: &str, pid: u32, by: &str) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    for point in points.iter().filter(|p| p.name == metric) {
        if point.attributes.get("process.pid") != Some(&pid.to_string()) {
            continue;
        }
        let key = if by.is_empty() {
            String::new()
        } else {
            point.attributes.get(by).cloned().unwrap_or_default()
        };
        *sums.entry(key).or_insert(0) += point.value as u64;
    }
    sums
}

/// Asserts one export carries the fleet's exact counts and the expected
/// resource.
fn assert_export_matches(request: &ExportMetricsServiceRequest, fleet: &Fleet) {
    let resource = attributes(
        &request.resource_metrics[0]
            .resource
            .as_ref()
            .expect("a resource")
            .attributes,
    );
    assert_eq!(
        resource.get("service.name").map(String::as_str),
        Some("subetha-agent"),
        "{resource:?}"
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(
        resource.get("host.name").map(String::as_str),
        Some(host.trim()),
        "{resource:?}"
    );
    assert!(resource.contains_key("service.version"), "{resource:?}");

    let points = points(request);
    let ops: Vec<&Point> = points
        .iter()
        .filter(|p| p.name == "subetha.instance.ops")
        .collect();
    assert!(!ops.is_empty(), "no subetha.instance.ops in the export");
    for point in &ops {
        assert_eq!(point.cumulative_monotonic, Some(true), "{point:?}");
        assert_eq!(point.unit, "{operation}", "{point:?}");
        for key in [
            "process.pid",
            "process.executable.name",
            "service.name",
            "host.name",
            "instance_id",
            "instance_name",
            "kind",
            "op",
        ] {
            assert!(point.attributes.contains_key(key), "{key} missing: {point:?}");
        }
    }
    let expected: BTreeMap<String, u64> = (0..MANY_INSTANCES)
        .map(|i| (format!("many-{i:04}"), PER_INSTANCE))
        .collect();
    assert_eq!(
        sum_by(&points, "subetha.instance.ops", fleet.many_pid(), "instance_name"),
        expected,
        "ops per instance of the many workload"
    );
    let truth = fleet.bursty_truth;
    let total = |metric: &str| {
        sum_by(&points, metric, fleet.bursty_pid, "")
            .get("")
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(total("subetha.instance.ops"), truth.queued, "{truth:?}");
    assert_eq!(total("subetha.observations.drained"), truth.queued, "{truth:?}");
    assert_eq!(total("subetha.observations.dropped"), truth.dropped, "{truth:?}");
    let report = subetha_tests::agent::process(&fleet.snapshot, fleet.bursty_pid).unwrap();
    assert_eq!(total("subetha.storms.begun"), report.storms);
    let causes = sum_by(&points, "subetha.storms", fleet.bursty_pid, "cause");
    assert_eq!(
        causes,
        report
            .storm_causes
            .clone()
            .into_iter()
            .collect::<BTreeMap<_, _>>()
    );
    assert!(
        points.iter().all(|p| !p.name.contains(".latency.p")),
        "no gauge per quantile"
    );
    // Latencies are cumulative explicit-bucket histograms in seconds whose
    // buckets add up, matching the snapshot's sample counts.
    let mut latency_samples = 0;
    for resource in &request.resource_metrics {
        for metric in resource.scope_metrics.iter().flat_map(|s| &s.metrics) {
            let Some(Data::Histogram(histogram)) = &metric.data else {
                continue;
            };
            assert_eq!(metric.unit, "s", "{}", metric.name);
            assert_eq!(
                histogram.aggregation_temporality,
                AggregationTemporality::Cumulative as i32
            );
            for point in &histogram.data_points {
                assert_eq!(
                    point.bucket_counts.len(),
                    point.explicit_bounds.len() + 1,
                    "{point:?}"
                );
                assert_eq!(point.bucket_counts.iter().sum::<u64>(), point.count, "{point:?}");
                assert!(point.explicit_bounds.windows(2).all(|w| w[0] < w[1]), "{point:?}");
                if metric.name == "subetha.instance.latency" {
                    latency_samples += point.count;
                }
            }
        }
    }
    let snapshot_samples: u64 = fleet
        .snapshot
        .processes
        .iter()
        .flat_map(|p| &p.instances)
        .flat_map(|i| &i.per_op)
        .map(|op| op.latency_ns.count)
        .sum();
    assert!(snapshot_samples > 0, "the fleet measured latencies");
    assert!(
        latency_samples >= snapshot_samples,
        "the histograms hold the latencies: {latency_samples} < {snapshot_samples}"
    );
}

#[test]
fn periodic_exports_carry_the_exact_counts() {
    let scratch = ScratchDir::new("otlp-periodic");
    let collector = Collector::start();
    // No path: the agent appends /v1/metrics.
    let endpoint = format!("http://{}", collector.addr);
    let fleet = Fleet::start(
        WORKLOAD,
        &scratch,
        &["--otlp-endpoint", &endpoint, "--otlp-interval", "500ms"],
    );
    // The first export made after the agent had everything.
    let request = wait_for(
        TIMEOUT,
        "an OTLP export after the agent drained both workloads",
        || collector.requests_after(fleet.settled_at).into_iter().next(),
        || {
            format!(
                "{} requests so far; agent log:\n{}",
                collector.count(),
                fleet.agent.log()
            )
        },
    );
    assert_export_matches(&request, &fleet);
    // And it keeps exporting.
    let before = collector.count();
    wait_for(
        TIMEOUT,
        "two more periodic exports",
        || (collector.count() >= before + 2).then_some(()),
        || fleet.agent.log(),
    );
    assert!(
        !fleet.agent.log().contains("OTLP export failed"),
        "{}",
        fleet.agent.log()
    );
}

#[test]
fn sigterm_flushes_a_final_export() {
    let scratch = ScratchDir::new("otlp-final");
    let collector = Collector::start();
    let endpoint = format!("http://{}/v1/metrics", collector.addr);
    let mut fleet = Fleet::start(
        WORKLOAD,
        &scratch,
        &["--otlp-endpoint", &endpoint, "--otlp-interval", "1h"],
    );
    assert_eq!(collector.count(), 0, "nothing is exported before the first hour");
    fleet.agent.signal(libc::SIGTERM);
    let status = fleet.agent.wait_exit(TIMEOUT);
    assert!(
        status.success(),
        "exit 0 after SIGTERM, got {status}; log:\n{}",
        fleet.agent.log()
    );
    let requests = collector.requests_after(fleet.settled_at);
    assert_eq!(requests.len(), 1, "exactly the final export");
    assert_export_matches(&requests[0], &fleet);
}

#[test]
fn an_absent_collector_is_logged_not_fatal() {
    let scratch = ScratchDir::new("otlp-absent");
    let endpoint = format!("http://127.0.0.1:{}/v1/metrics", free_port());
    let mut agent = AgentProcess::start(
        agent_exe(),
        &[
            "--pid",
            NO_PID,
            "--no-socket",
            "--probes",
            "off",
            "--otlp-endpoint",
            &endpoint,
            "--otlp-interval",
            "200ms",
        ],
        scratch.join("agent.log"),
    );
    wait_for(
        TIMEOUT,
        "the failed export to be logged",
        || agent.log().contains("OTLP export failed").then_some(()),
        || agent.log(),
    );
    // Still serving, still scanning.
    let scans = agent.wait_snapshot("a scan", |s| (s.agent.scans > 0).then_some(s.agent.scans));
    agent.wait_snapshot("more scans", |s| (s.agent.scans > scans).then_some(()));
    subetha_agent::client::get(agent.addr(), "/metrics").expect("/metrics answers");
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(TIMEOUT);
    assert!(status.success(), "exit 0, got {status}; log:\n{}", agent.log());
}

#[test]
fn a_failing_collector_is_reported_once_and_its_recovery_too() {
    let scratch = ScratchDir::new("otlp-failing");
    let collector = Collector::start();
    collector.status.store(500, Ordering::Relaxed);
    let endpoint = format!("http://{}/v1/metrics", collector.addr);
    let mut agent = AgentProcess::start(
        agent_exe(),
        &[
            "--pid",
            NO_PID,
            "--no-socket",
            "--probes",
            "off",
            "--otlp-endpoint",
            &endpoint,
            "--otlp-interval",
            "200ms",
        ],
        scratch.join("agent.log"),
    );
    wait_for(
        TIMEOUT,
        "five refused exports",
        || (collector.count() >= 5).then_some(()),
        || agent.log(),
    );
    let log = agent.log();
    assert_eq!(
        log.matches("OTLP export failed").count(),
        1,
        "a failing collector is reported once, not every period:\n{log}"
    );
    collector.status.store(200, Ordering::Relaxed);
    wait_for(
        TIMEOUT,
        "the recovery to be logged",
        || agent.log().contains("OTLP export works again").then_some(()),
        || agent.log(),
    );
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(TIMEOUT);
    assert!(status.success(), "exit 0, got {status}; log:\n{}", agent.log());
    assert_eq!(
        agent.log().matches("OTLP export failed").count(),
        1,
        "{}",
        agent.log()
    );
}

#[test]
fn a_malformed_endpoint_fails_at_start_up() {
    let listen = format!("127.0.0.1:{}", free_port());
    for (endpoint, phrase) in [
        ("ftp://127.0.0.1:4318/v1/metrics", "https"),
        ("127.0.0.1:4318", "https"),
    ] {
        let output = Command::new(agent_exe())
            .args([
                "run",
                "--pid",
                NO_PID,
                "--no-socket",
                "--probes",
                "off",
                "--listen",
                &listen,
            ])
            .args(["--otlp-endpoint", endpoint])
            .output()
            .expect("run the agent");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{endpoint} must be refused; stderr:\n{stderr}"
        );
        assert!(
            stderr.contains(phrase) && stderr.contains(endpoint),
            "{endpoint}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
