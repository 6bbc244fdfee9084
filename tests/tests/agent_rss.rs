//! Budget: the agent's resident memory stays within 80 MiB while it keeps
//! statistics for 1,000 instances.
//!
//! The budget was 64 MiB while latency went out as three-line summaries.
//! With classic histograms (21 series per measured op) this test's
//! `/metrics` is about 11.5 MB, and encoding it took the peak to 65.6 MiB;
//! a streaming encoder would bring it back down.
//!
//! A workload (no sidecar, so every observation waits for the agent)
//! registers 1,000 instances; 8 threads observe each of their 125 instances
//! 32 times with latencies spread over five decades, then park. The real
//! (release) `subetha-agent run`, limited to that pid, drains them all; the
//! test scrapes `/metrics` and the JSON API like an operator would, then
//! reads the agent's `VmRSS` (and peak `VmHWM`). Printed with `--nocapture`.

use subetha_tests::agent::{AgentProcess, ScratchDir, Workload, agent_exe_release, process, status_kib};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");
const INSTANCES: u64 = 1000;
const PER_INSTANCE: u64 = 32;
const BUDGET_KIB: u64 = 80 * 1024;

#[test]
fn agent_with_1000_instances_stays_within_80_mib() {
    let scratch = ScratchDir::new("agent-rss");
    let mut workload = Workload::spawn(
        WORKLOAD,
        &[
            "many",
            "--instances",
            &INSTANCES.to_string(),
            "--threads",
            "8",
            "--per-instance",
            &PER_INSTANCE.to_string(),
        ],
        &[("SUBETHA_SIDECAR", "off")],
    );
    let pid = workload.pid();
    let queued: u64 = workload.ready[2].parse().unwrap();
    assert_eq!(
        queued,
        INSTANCES * PER_INSTANCE,
        "every observation fit in a ring"
    );
    let socket = scratch.join("agent.sock");
    let pid_arg = pid.to_string();
    let agent = AgentProcess::start(
        agent_exe_release(),
        &["--pid", &pid_arg, "--socket", socket.to_str().unwrap()],
        scratch.join("agent.log"),
    );
    let report = agent.wait_snapshot("the agent to drain 1000 instances", |s| {
        process(s, pid)
            .filter(|p| p.instances.len() as u64 == INSTANCES && p.drained == queued)
            .cloned()
    });
    let ops: u64 = report.instances.iter().map(|i| i.ops).sum();
    assert_eq!(
        ops,
        queued,
        "every drained observation reached its instance: {} unattributed, state {}, log:\n{}",
        report.unattributed,
        report.state,
        agent.log()
    );
    assert!(
        report
            .instances
            .iter()
            .all(|i| i.latency_ns.count == PER_INSTANCE)
    );
    // Scrape like an operator would, a few times.
    let mut metrics_bytes = 0;
    for _ in 0..3 {
        metrics_bytes = subetha_agent::client::get(agent.addr(), "/metrics")
            .expect("/metrics")
            .len();
        agent.snapshot().expect("/api/v1/snapshot");
    }
    let agent_pid = agent.pid().to_string();
    let rss = status_kib(&agent_pid, "VmRSS");
    let hwm = status_kib(&agent_pid, "VmHWM");
    let shmem = status_kib(&agent_pid, "RssShmem");
    eprintln!(
        "agent with {INSTANCES} instances: VmRSS {rss} kB ({:.1} MiB; RssShmem {shmem} kB), \
         VmHWM {hwm} kB ({:.1} MiB); /metrics is {metrics_bytes} bytes",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    assert!(rss <= BUDGET_KIB, "VmRSS {rss} kB exceeds 80 MiB");
    assert!(hwm <= BUDGET_KIB, "VmHWM {hwm} kB exceeds 80 MiB");
    workload.close();
}
