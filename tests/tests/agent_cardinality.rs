//! `/metrics` keeps a bounded number of series under thread churn and
//! process restarts, as a fleet's Prometheus needs:
//!
//! * the real agent drains `subetha-workload run --churn 8` (batches of
//!   eight short-lived threads, forever) for 10 s, scraped every second: the
//!   distinct series over all scrapes stay under the bound the README
//!   states (see [`bound`]), none carries a `tid`, `thread` or `slot` label,
//!   no series appears in one scrape and is gone by the last (nothing keyed
//!   by a thread), and `promtool check metrics` accepts the scrape;
//! * the same with `--metrics-per-thread on` exceeds that bound within
//!   seconds (what the default avoids, and proof the count can fail);
//! * with `--retention 2s`, an exited workload's series are gone once its
//!   retention ran out, leaving only the agent's own: a restarted process's
//!   old `pid` series last one retention (so series track the processes
//!   alive plus those that exited within the retention).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use subetha_agent::AgentSnapshot;
use subetha_tests::agent::{AgentProcess, ScratchDir, Workload, agent_exe, process};
use subetha_tests::prometheus::tool;
use subetha_tests::wait_for;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

/// Series the agent has of itself: 12 counters and gauges (its info, scan
/// and probe counters, scan interval and maxima, refused segments,
/// `subetha_processes` in its three states) and the two scan-time
/// histograms (18 buckets, `_sum`, `_count`: 20 each).
const AGENT_SERIES: usize = 12 + 2 * 20;
/// Series per process, whatever its threads: the info series, segment
/// size and residency, the lost and unattributed counters, four ring
/// states, corrupt rings, drained, dropped, episodes, storms begun, storms
/// active (15), and one per settled storm cause (at most 12 kinds).
const PROCESS_SERIES: usize = 15 + 12;
/// Series per instance (its attributed drops) and per op kind of it: ops,
/// contended, misses, threads, and once a latency is measured its maximum
/// and its histogram (20).
const INSTANCE_SERIES: usize = 1;
const OP_SERIES: usize = 4 + 1 + 20;

/// The bound on distinct series for `snapshot`'s processes: the README's
/// formula, `AGENT + Σ_processes (PROCESS + Σ_instances (INSTANCE + OP ×
/// ops))`.
fn bound(snapshot: &AgentSnapshot) -> usize {
    AGENT_SERIES
        + snapshot
            .processes
            .iter()
            .map(|p| {
                PROCESS_SERIES
                    + p.instances
                        .iter()
                        .map(|i| INSTANCE_SERIES + OP_SERIES * i.per_op.len())
                        .sum::<usize>()
            })
            .sum::<usize>()
}

/// The series (name and labels) of a classic-text scrape.
fn series(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.rsplit_once(' ').map_or(l, |(series, _)| series).to_owned())
        .collect()
}

fn scrape(agent: &AgentProcess) -> String {
    subetha_agent::client::get(agent.addr(), "/metrics").expect("scrape /metrics")
}

fn start_agent(scratch: &ScratchDir, pid: u32, extra: &[&str]) -> AgentProcess {
    let pid = pid.to_string();
    let mut args = vec!["--pid", pid.as_str(), "--no-socket", "--probes", "off"];
    args.extend_from_slice(extra);
    let agent = AgentProcess::start(agent_exe(), &args, scratch.join("agent.log"));
    agent.wait_snapshot("the agent to attach the workload", |s| {
        process(s, pid.parse().unwrap())
            .filter(|p| p.state == "attached")
            .map(|_| ())
    });
    agent
}

fn churning_workload() -> Workload {
    let mut workload = Workload::spawn(
        WORKLOAD,
        &[
            "run",
            "--threads",
            "2",
            "--rate",
            "20000",
            "--churn",
            "8",
            "--churn-ops",
            "200",
        ],
        &[],
    );
    workload.cmd("go");
    workload
}

/// Scrapes every second for `seconds`; returns every series seen, the last
/// scrape and the largest bound over the snapshots taken meanwhile.
fn scrape_for(agent: &AgentProcess, seconds: u64) -> (BTreeSet<String>, String, usize) {
    let mut seen = BTreeSet::new();
    let mut last = String::new();
    let mut max_bound = 0;
    let start = Instant::now();
    for second in 1..=seconds {
        last = scrape(agent);
        seen.extend(series(&last));
        max_bound = max_bound.max(bound(&agent.snapshot().expect("snapshot")));
        let next = start + Duration::from_secs(second);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    (seen, last, max_bound)
}

#[test]
fn thread_churn_does_not_grow_the_series() {
    let scratch = ScratchDir::new("cardinality");
    let mut workload = churning_workload();
    let agent = start_agent(&scratch, workload.pid(), &[]);
    let (seen, last, max_bound) = scrape_for(&agent, 10);
    let threads = workload.truth("pause").threads;
    workload.cmd("resume");
    assert!(threads >= 80, "the churn made threads: {threads}");
    eprintln!(
        "{} distinct series over 10 scrapes ({} in the last) with {threads} threads started; bound {max_bound}",
        seen.len(),
        series(&last).len()
    );
    assert!(
        seen.len() <= max_bound,
        "{} distinct series exceed the bound {max_bound}: {seen:#?}",
        seen.len()
    );
    for label in ["tid=", "thread=", "slot="] {
        let labelled: Vec<_> = seen.iter().filter(|s| s.contains(label)).collect();
        assert!(labelled.is_empty(), "series with {label}: {labelled:#?}");
    }
    let now = series(&last);
    let gone: Vec<_> = seen.difference(&now).collect();
    assert!(gone.is_empty(), "series that came and went: {gone:#?}");
    if let Some(promtool) = tool("promtool") {
        use std::io::Write as _;
        let mut child = std::process::Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run promtool");
        child.stdin.take().unwrap().write_all(last.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    workload.stop();
}

#[test]
fn per_thread_series_grow_with_churn_when_asked_for() {
    let scratch = ScratchDir::new("cardinality-per-thread");
    let mut workload = churning_workload();
    let agent = start_agent(&scratch, workload.pid(), &["--metrics-per-thread", "on"]);
    let (seen, _, max_bound) = scrape_for(&agent, 4);
    eprintln!(
        "--metrics-per-thread on: {} distinct series in 4 s; bound {max_bound}",
        seen.len()
    );
    assert!(seen.iter().any(|s| s.contains("tid=")));
    assert!(
        seen.len() > max_bound,
        "per-thread series under churn should exceed the default's bound {max_bound}: {}",
        seen.len()
    );
    workload.stop();
}

#[test]
fn restarted_processes_series_expire_after_retention() {
    let scratch = ScratchDir::new("cardinality-restarts");
    let mut workload = Workload::spawn(WORKLOAD, &["run", "--threads", "2", "--rate", "5000"], &[]);
    workload.cmd("go");
    let first = workload.pid();
    let agent = start_agent(&scratch, first, &["--retention", "2s"]);
    let series_of = |text: &str, pid: u32| {
        let needle = format!("pid=\"{pid}\"");
        series(text).into_iter().filter(|s| s.contains(&needle)).count()
    };
    let per_process = series_of(&scrape(&agent), first);
    assert!(per_process > 0);
    workload.stop();
    // Exited, then gone after the retention.
    wait_for(
        Duration::from_secs(30),
        "the exited process's series to expire",
        || (series_of(&scrape(&agent), first) == 0).then_some(()),
        || scrape(&agent),
    );
    let text = scrape(&agent);
    assert!(
        series(&text).len() <= AGENT_SERIES,
        "only the agent's own series are left: {text}"
    );
}
