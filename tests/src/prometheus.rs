//! Prometheus's own tools in tests: finding `prometheus`/`promtool`
//! ([`tool`]), a real Prometheus server on loopback scraping given targets
//! ([`PrometheusServer`], killed on drop) and its HTTP query API, and the
//! sample names of a `/metrics` scrape ([`sample_names`]).
//!
//! The tools come from Debian's `prometheus` package. CI installs it and
//! sets `SUBETHA_REQUIRE_TOOLS=1`, which turns a missing tool into a test
//! failure; elsewhere a test without them says so on stderr and skips.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::agent::free_port;
use crate::{TIMEOUT, wait_for};

/// Environment variable that makes a missing external tool a failure.
pub const REQUIRE_TOOLS_ENV: &str = "SUBETHA_REQUIRE_TOOLS";

/// The path of executable `name` on `PATH`. `None` (after saying so on
/// stderr) when it is missing, unless `SUBETHA_REQUIRE_TOOLS=1`, which
/// makes it a panic: a test needing the tool skips only outside CI.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable(candidate))
    });
    if found.is_none() {
        assert!(
            std::env::var(REQUIRE_TOOLS_ENV).as_deref() != Ok("1"),
            "{name} is required ({REQUIRE_TOOLS_ENV}=1) but not on PATH (Debian package `prometheus`)"
        );
        eprintln!("SKIPPED: {name} is not installed (Debian package `prometheus`)");
    }
    found
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// One sample of an instant-query result.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its labels (`__name__` included when the query keeps it).
    pub labels: BTreeMap<String, String>,
    /// Unix time of the sample, seconds.
    pub timestamp: f64,
    /// Its value.
    pub value: f64,
}

/// A `prometheus` server on a free loopback port, with its TSDB and log in
/// a directory the caller owns. SIGKILLed and reaped on drop.
pub struct PrometheusServer {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl PrometheusServer {
    /// Writes `dir/prometheus.yml` scraping `targets` (job `subetha`) every
    /// `scrape_interval` (a Prometheus duration such as `1s`), starts
    /// `exe` on it with its TSDB in `dir/tsdb`, and waits until it is
    /// ready.
    pub fn start(exe: &Path, dir: &Path, targets: &[SocketAddr], scrape_interval: &str) -> Self {
        let config = dir.join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {scrape_interval}\n  scrape_timeout: {scrape_interval}\n\
                 scrape_configs:\n  - job_name: subetha\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .expect("write prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = dir.join("prometheus.log");
        let stderr = File::create(&log).expect("create the Prometheus log");
        let child = Command::new(exe)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
        let server = std::cell::RefCell::new(Self { child, addr, log });
        wait_for(
            TIMEOUT,
            "Prometheus to be ready",
            || {
                let exited = server.borrow_mut().child.try_wait();
                if let Ok(Some(status)) = exited {
                    panic!("Prometheus exited with {status}; log:\n{}", server.borrow().log());
                }
                subetha_agent::client::get(addr, "/-/ready").ok()
            },
            || server.borrow().log(),
        );
        server.into_inner()
    }

    /// Its log (stderr) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs the instant query `expr`: its vector result, or why not.
    pub fn query(&self, expr: &str) -> Result<Vec<Sample>, String> {
        let path = format!("/api/v1/query?query={}", url_encode(expr));
        let body = subetha_agent::client::get(self.addr, &path).map_err(|e| format!("{e:#}"))?;
        let reply: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if reply["status"] != "success" {
            return Err(format!("query {expr:?} failed: {body}"));
        }
        if reply["data"]["resultType"] != "vector" {
            return Err(format!("query {expr:?} is not a vector: {body}"));
        }
        let result = reply["data"]["result"].as_array().ok_or_else(|| body.clone())?;
        result
            .iter()
            .map(|sample| {
                let labels = sample["metric"]
                    .as_object()
                    .ok_or_else(|| format!("no labels in {sample}"))?
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let timestamp = sample["value"][0]
                    .as_f64()
                    .ok_or_else(|| format!("no timestamp in {sample}"))?;
                let value = sample["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("no value in {sample}"))?;
                Ok(Sample {
                    labels,
                    timestamp,
                    value,
                })
            })
            .collect()
    }

    /// The health of each scrape target, as `/api/v1/targets` reports it.
    pub fn target_health(&self) -> Result<Vec<(String, String, String)>, String> {
        let body = subetha_agent::client::get(self.addr, "/api/v1/targets").map_err(|e| format!("{e:#}"))?;
        let reply: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        Ok(reply["data"]["activeTargets"]
            .as_array()
            .map(|targets| {
                targets
                    .iter()
                    .map(|t| {
                        let text = |key: &str| t[key].as_str().unwrap_or_default().to_owned();
                        (text("scrapeUrl"), text("health"), text("lastError"))
                    })
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The sample names of a scrape in the classic text format (`name` of
/// every `name{…} value` line).
pub fn sample_names(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The `subetha_…` metric names an expression (or any text) mentions.
pub fn subetha_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("subetha_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // Part of a longer identifier (e.g. `my_subetha_x`) is not a name.
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_expressions() {
        let names = subetha_names(
            "sum by (pid) (rate(subetha_instance_ops_total{kind=\"mutex\"}[5m])) / \
             ignoring(x) subetha_scan_duration_seconds{quantile=\"0.99\"} + my_subetha_other",
        );
        let expected: BTreeSet<String> = ["subetha_instance_ops_total", "subetha_scan_duration_seconds"]
            .map(String::from)
            .into();
        assert_eq!(names, expected);
    }

    #[test]
    fn names_in_a_scrape() {
        let names = sample_names("# HELP a_total x\n# TYPE a_total counter\na_total 1\nb{x=\"1 2\"} 3\n\n");
        let expected: BTreeSet<String> = ["a_total", "b"].map(String::from).into();
        assert_eq!(names, expected);
    }

    #[test]
    fn encoding() {
        assert_eq!(url_encode("sum(a{b=\"c d\"})"), "sum%28a%7Bb%3D%22c%20d%22%7D%29");
    }
}
