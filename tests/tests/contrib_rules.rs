//! The contrib files shipped for fleets (`subetha-agent/contrib/`) stay
//! valid and in step with `/metrics`:
//!
//! * `promtool check rules` accepts the alerting rules, and `promtool test
//!   rules` runs their unit tests (each alert fires on a bad synthetic
//!   series and stays quiet on a healthy one);
//! * every `subetha_…` metric the Grafana dashboard and the rules mention
//!   exists in a real scrape of an agent draining workloads (with drops
//!   and settled storms, so the families that only appear then are there):
//!   a rename in `metrics.rs` fails here instead of blanking a panel;
//! * the dashboard is importable (a Prometheus datasource input every panel
//!   uses, unique panel ids) and covers ops, contention, latency, drops,
//!   storms, scans and probe losses;
//! * with a real Prometheus scraping that agent, every dashboard query
//!   (Grafana's variables substituted) parses and returns data.
//!
//! Without `promtool`/`prometheus` the parts needing them skip loudly,
//! unless `SUBETHA_REQUIRE_TOOLS=1` (CI), which makes that a failure.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use subetha_tests::agent::ScratchDir;
use subetha_tests::fleet::Fleet;
use subetha_tests::prometheus::{PrometheusServer, sample_names, subetha_names, tool};
use subetha_tests::{TIMEOUT, wait_for};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

fn contrib() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../subetha-agent/contrib")
}

fn rules_dir() -> PathBuf {
    contrib().join("prometheus")
}

fn dashboard() -> Value {
    let path = contrib().join("grafana/subetha-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        out.push(panel);
        if let Some(nested) = panel["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// Every PromQL expression of the dashboard: panel targets and variable
/// queries (`label_values(…)` unwrapped to its selector).
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    let mut exprs: Vec<String> = panels(dashboard)
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .map(|t| t["expr"].as_str().expect("every target has an expr").to_owned())
        .collect();
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(query) = variable["query"]["query"].as_str().or(variable["query"].as_str()) {
            exprs.push(query.to_owned());
        }
    }
    exprs
}

/// Runs `promtool args` in the rules directory; its output, after
/// asserting success.
fn promtool(promtool: &PathBuf, args: &[&str]) -> String {
    let output = Command::new(promtool)
        .args(args)
        .current_dir(rules_dir())
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn promtool_accepts_the_alerting_rules() {
    let Some(exe) = tool("promtool") else {
        return;
    };
    let out = promtool(&exe, &["check", "rules", "subetha-alerts.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn the_alerts_unit_tests_pass() {
    let Some(exe) = tool("promtool") else {
        return;
    };
    let out = promtool(&exe, &["test", "rules", "subetha-alerts.test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
    // The unit tests cover every alert the rules define.
    let rules = std::fs::read_to_string(rules_dir().join("subetha-alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(rules_dir().join("subetha-alerts.test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect();
    assert!(alerts.len() >= 5, "{alerts:?}");
    for alert in alerts {
        assert!(
            tests.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - exp_labels"
            )),
            "no unit test shows {alert} firing"
        );
    }
}

#[test]
fn the_dashboard_is_importable_and_covers_the_essentials() {
    let dashboard = dashboard();
    let inputs = dashboard["__inputs"].as_array().expect("__inputs");
    assert!(
        inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS"
            && i["type"] == "datasource"
            && i["pluginId"] == "prometheus"),
        "a Prometheus datasource input: {inputs:?}"
    );
    let uses_input = |ds: &Value| ds["type"] == "prometheus" && ds["uid"] == "${DS_PROMETHEUS}";
    let mut ids = HashSet::new();
    for panel in panels(&dashboard) {
        let id = panel["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "duplicate panel id {id}");
        for key in ["x", "y", "w", "h"] {
            assert!(
                panel["gridPos"][key].is_u64(),
                "gridPos.{key} of {}",
                panel["title"]
            );
        }
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            uses_input(&panel["datasource"]),
            "panel {} datasource",
            panel["title"]
        );
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for target in targets {
            assert!(uses_input(&target["datasource"]), "{target}");
            assert!(
                !target["expr"].as_str().unwrap_or_default().trim().is_empty(),
                "{target}"
            );
        }
    }
    let names: BTreeSet<String> = dashboard_exprs(&dashboard)
        .iter()
        .flat_map(|e| subetha_names(e))
        .collect();
    for essential in [
        "subetha_instance_ops_total",
        "subetha_instance_contended_total",
        "subetha_instance_latency_seconds_bucket",
        "subetha_observations_dropped_total",
        "subetha_observations_drained_total",
        "subetha_storms_total",
        "subetha_scan_duration_seconds_bucket",
        "subetha_probe_lost_events_total",
    ] {
        assert!(
            names.contains(essential),
            "the dashboard shows {essential}: {names:?}"
        );
    }
}

/// Grafana's variables, as a query against all agents would have them.
fn substitute_grafana_variables(expr: &str) -> String {
    let expr = expr
        .replace("$__rate_interval", "1m")
        .replace("$__range", "5m")
        .replace("$instance", ".*")
        .replace("$job", ".*");
    match expr
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        // label_values(selector, label): the selector is the query.
        Some(args) => args
            .rsplit_once(',')
            .map_or(args, |(selector, _)| selector)
            .to_owned(),
        None => expr,
    }
}

#[test]
fn dashboard_and_rules_use_only_metrics_the_agent_serves() {
    let scratch = ScratchDir::new("contrib-names");
    let fleet = Fleet::start(WORKLOAD, &scratch, &[]);
    let scrape = subetha_agent::client::get(fleet.agent.addr(), "/metrics").expect("scrape /metrics");
    let served = sample_names(&scrape);

    let dashboard = dashboard();
    let exprs = dashboard_exprs(&dashboard);
    let rules = std::fs::read_to_string(rules_dir().join("subetha-alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(rules_dir().join("subetha-alerts.test.yml")).unwrap();
    for (source, text) in [
        ("the dashboard", exprs.join("\n")),
        ("the alerting rules", rules),
        ("the alerts' unit tests", tests),
    ] {
        let used = subetha_names(&text);
        assert!(!used.is_empty(), "{source} uses no subetha metric?");
        let missing: Vec<&String> = used.difference(&served).collect();
        assert!(
            missing.is_empty(),
            "{source} uses metrics the agent does not serve: {missing:?}\nserved: {served:?}"
        );
    }

    // Every dashboard query parses and returns data from a real Prometheus.
    let Some(prometheus_exe) = tool("prometheus") else {
        return;
    };
    let prometheus = PrometheusServer::start(&prometheus_exe, &scratch.join(""), &[fleet.agent.addr()], "1s");
    for expr in &exprs {
        let query = substitute_grafana_variables(expr);
        let last = std::cell::RefCell::new(String::new());
        wait_for(
            TIMEOUT,
            format!("data for {query}"),
            || {
                let result = prometheus.query(&query);
                *last.borrow_mut() = format!("{result:?}");
                match result {
                    Ok(samples) => (!samples.is_empty()).then_some(()),
                    Err(error) if error.contains(" 400 ") => panic!("{query} does not parse: {error}"),
                    Err(_) => None,
                }
            },
            || {
                format!(
                    "last result {}; Prometheus log:\n{}",
                    last.borrow(),
                    prometheus.log()
                )
            },
        );
    }
}
