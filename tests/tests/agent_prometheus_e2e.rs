//! `/metrics` end to end through a real Prometheus server: the agent drains
//! two workloads with exact ground truth ([`subetha_tests::fleet`]), a
//! Prometheus (Debian's `prometheus` package) on loopback scrapes it every
//! second, and its query API must return the workloads' counts exactly —
//! per-instance ops and contended operations, drained, dropped and ops
//! totals of the bursty process, its storms by cause — plus a healthy
//! target and the agent's own series.
//!
//! Values are compared only from a scrape that started after the agent's
//! snapshot agreed with the truth (sample timestamp after
//! [`Fleet::settled_at`]), so a pass cannot come from a lucky moment and a
//! wrong value cannot be waited out.
//!
//! Without `prometheus` on `PATH` the test skips loudly, unless
//! `SUBETHA_REQUIRE_TOOLS=1` (CI), which makes that a failure.

use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

use subetha_tests::agent::{ScratchDir, process};
use subetha_tests::fleet::{Fleet, MANY_INSTANCES, PER_INSTANCE};
use subetha_tests::prometheus::{PrometheusServer, Sample, tool};
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

/// Waits until `expr` has a result whose every sample was scraped after
/// `after` (Unix seconds) and there are `expected_series` of them.
fn query_fresh(prometheus: &PrometheusServer, expr: &str, after: f64, expected_series: usize) -> Vec<Sample> {
    let last = std::cell::RefCell::new(String::new());
    wait_for(
        TIMEOUT,
        format!("Prometheus to have {expected_series} fresh series for {expr}"),
        || {
            let result = prometheus.query(expr);
            *last.borrow_mut() = format!("{result:?}");
            let samples = result.ok()?;
            (samples.len() == expected_series && samples.iter().all(|s| s.timestamp > after))
                .then_some(samples)
        },
        || {
            format!(
                "last result {}; targets {:?}; Prometheus log:\n{}",
                last.borrow(),
                prometheus.target_health(),
                prometheus.log()
            )
        },
    )
}

/// The value of a single-series query, from a fresh scrape.
fn fresh_value(prometheus: &PrometheusServer, expr: &str, after: f64) -> u64 {
    let samples = query_fresh(prometheus, expr, after, 1);
    let value = samples[0].value;
    assert!(
        value >= 0.0 && value.fract() == 0.0,
        "{expr}: a count, got {value}"
    );
    value as u64
}

/// `label value → value` of a query grouped by `label`.
fn by_label(samples: &[Sample], label: &str) -> BTreeMap<String, u64> {
    samples
        .iter()
        .map(|s| {
            let key = s
                .labels
                .get(label)
                .unwrap_or_else(|| panic!("no {label} in {s:?}"))
                .clone();
            (key, s.value as u64)
        })
        .collect()
}

#[test]
fn prometheus_scrapes_the_agent_and_has_the_exact_counts() {
    let Some(prometheus_exe) = tool("prometheus") else {
        return;
    };
    let scratch = ScratchDir::new("prometheus-e2e");
    let fleet = Fleet::start(WORKLOAD, &scratch, &[]);
    let prometheus = PrometheusServer::start(&prometheus_exe, &scratch.join(""), &[fleet.agent.addr()], "1s");
    let after = fleet.settled_at.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();

    // The many workload: every instance's ops and contended counts exactly.
    let many = fleet.many_pid();
    let ops = query_fresh(
        &prometheus,
        &format!("sum by (instance_name) (subetha_instance_ops_total{{pid=\"{many}\"}})"),
        after,
        MANY_INSTANCES as usize,
    );
    let expected: BTreeMap<String, u64> = (0..MANY_INSTANCES)
        .map(|i| (format!("many-{i:04}"), PER_INSTANCE))
        .collect();
    assert_eq!(by_label(&ops, "instance_name"), expected, "ops per instance");
    // The workload marks every fourth observation of an instance contended.
    let contended = query_fresh(
        &prometheus,
        &format!("sum by (instance_name) (subetha_instance_contended_total{{pid=\"{many}\"}})"),
        after,
        MANY_INSTANCES as usize,
    );
    let every_fourth = (0..PER_INSTANCE).filter(|k| k % 4 == 0).count() as u64;
    let expected: BTreeMap<String, u64> = (0..MANY_INSTANCES)
        .map(|i| (format!("many-{i:04}"), every_fourth))
        .collect();
    assert_eq!(
        by_label(&contended, "instance_name"),
        expected,
        "contended per instance"
    );
    // Three op kinds, in turn.
    let per_op = query_fresh(
        &prometheus,
        &format!("sum by (op) (subetha_instance_ops_total{{pid=\"{many}\"}})"),
        after,
        3,
    );
    let per_op = by_label(&per_op, "op");
    assert_eq!(
        per_op.values().sum::<u64>(),
        MANY_INSTANCES * PER_INSTANCE,
        "{per_op:?}"
    );
    assert_eq!(
        per_op.keys().map(String::as_str).collect::<Vec<_>>(),
        ["lock", "try_lock", "unlock"],
        "op labels are the kind's op names"
    );

    // The bursty workload: the exact books, with drops.
    let truth = fleet.bursty_truth;
    let bursty = fleet.bursty_pid;
    let value = |expr: String| fresh_value(&prometheus, &expr, after);
    assert_eq!(
        value(format!(
            "sum(subetha_observations_drained_total{{pid=\"{bursty}\"}})"
        )),
        truth.queued,
        "drained = queued, {truth:?}"
    );
    assert_eq!(
        value(format!(
            "sum(subetha_observations_dropped_total{{pid=\"{bursty}\"}})"
        )),
        truth.dropped,
        "dropped, {truth:?}"
    );
    assert_eq!(
        value(format!(
            "sum(subetha_observations_lost_no_ring_total{{pid=\"{bursty}\"}})"
        )),
        truth.lost,
        "lost for want of a ring, {truth:?}"
    );
    assert_eq!(
        value(format!("sum(subetha_instance_ops_total{{pid=\"{bursty}\"}})")),
        truth.queued,
        "every drained observation reached its instance, {truth:?}"
    );
    assert_eq!(
        value(format!(
            "sum(subetha_instance_drops_attributed_total{{pid=\"{bursty}\"}})"
        )),
        truth.dropped,
        "every drop attributed to an instance, {truth:?}"
    );
    // Storms: as many as the agent counted, every one with its settled
    // cause, and the per-cause counts as the snapshot has them.
    let report = process(&fleet.snapshot, bursty).expect("the bursty process is reported");
    assert_eq!(
        value(format!("subetha_storms_begun_total{{pid=\"{bursty}\"}}")),
        report.storms
    );
    let causes = query_fresh(
        &prometheus,
        &format!("subetha_storms_total{{pid=\"{bursty}\"}}"),
        after,
        report.storm_causes.len(),
    );
    let causes = by_label(&causes, "cause");
    assert_eq!(
        causes,
        report
            .storm_causes
            .clone()
            .into_iter()
            .collect::<BTreeMap<_, _>>()
    );
    assert_eq!(causes.values().sum::<u64>(), report.storms);

    // The process is reported as exited, the many one as attached.
    let states = query_fresh(&prometheus, "subetha_processes", after, 3);
    let states = by_label(&states, "state");
    assert_eq!(states.get("exited"), Some(&1), "{states:?}");
    assert_eq!(states.get("attached"), Some(&1), "{states:?}");

    // The agent's own series, and a healthy target.
    let agent_info = query_fresh(&prometheus, "subetha_agent_info", after, 1);
    assert_eq!(
        agent_info[0].labels.get("version").map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
    // Scan times are a histogram: its quantile over all scans so far.
    let scan_p99 = query_fresh(
        &prometheus,
        "histogram_quantile(0.99, subetha_scan_duration_seconds_bucket)",
        after,
        1,
    );
    assert!(
        scan_p99[0].value > 0.0 && scan_p99[0].value < 10.0,
        "a scan takes more than nothing, less than forever: {scan_p99:?}"
    );
    assert!(value("subetha_agent_scans_total".into()) > 0);
    assert!(value("subetha_scan_duration_seconds_count".into()) > 0);
    let health = prometheus.target_health().expect("the targets API answers");
    assert_eq!(health.len(), 1, "{health:?}");
    assert_eq!(health[0].1, "up", "target health: {health:?}");
}
