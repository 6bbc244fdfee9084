//! Budget: an agent watching 100 idle rings uses at most 1% of a core.
//!
//! A workload with 100 threads that each observed once and then park; the
//! real (release) `subetha-agent run` with its default scan, discovery and
//! publish settings, limited to that pid (`--pid`) and with its own
//! registration socket. Once it drains all 100 rings, its CPU time
//! (`utime + stime` of `/proc/<pid>/stat`, every thread) is measured over
//! 10 s of idleness. The number is printed (run with `--nocapture`).

use std::time::{Duration, Instant};

use subetha_tests::agent::{
    AgentProcess, ScratchDir, Workload, agent_exe_release, clock_ticks_per_sec, cpu_ticks, process,
    schedstat_ns,
};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");
const RINGS: u64 = 100;
const WINDOW: Duration = Duration::from_secs(10);
/// 1% of one core.
const BUDGET: f64 = 0.01;

#[test]
fn idle_agent_with_100_rings_uses_at_most_1_percent_of_a_core() {
    let scratch = ScratchDir::new("agent-idle-cpu");
    let mut workload = Workload::spawn(WORKLOAD, &["idle", "--threads", &RINGS.to_string()], &[]);
    let pid = workload.pid();
    let socket = scratch.join("agent.sock");
    let pid_arg = pid.to_string();
    let agent = AgentProcess::start(
        agent_exe_release(),
        &["--pid", &pid_arg, "--socket", socket.to_str().unwrap()],
        scratch.join("agent.log"),
    );
    let report = agent.wait_snapshot("the agent to drain all 100 rings", |s| {
        process(s, pid)
            .filter(|p| p.state == "attached" && p.drained == RINGS)
            .cloned()
    });
    assert_eq!(report.rings.len() as u64, RINGS);
    let hz = clock_ticks_per_sec();
    let (ticks0, sched0, t0) = (cpu_ticks(agent.pid()), schedstat_ns(agent.pid()), Instant::now());
    // The measurement window (not a wait for an event).
    std::thread::sleep(WINDOW);
    let (ticks1, sched1, elapsed) = (cpu_ticks(agent.pid()), schedstat_ns(agent.pid()), t0.elapsed());
    let fraction = (ticks1 - ticks0) as f64 / hz as f64 / elapsed.as_secs_f64();
    let sched_fraction = sched1.saturating_sub(sched0) as f64 / 1e9 / elapsed.as_secs_f64();
    let snapshot = agent.snapshot().expect("snapshot");
    eprintln!(
        "idle agent, {RINGS} rings: {:.3}% of a core by utime+stime ({} ticks at {hz} Hz over {elapsed:?}), \
         {:.3}% by schedstat; scan interval {} µs, {} scans, scan p50 {} ns p99 {} ns",
        fraction * 100.0,
        ticks1 - ticks0,
        sched_fraction * 100.0,
        snapshot.agent.scan_interval_us,
        snapshot.agent.scans,
        snapshot.agent.scan_duration_ns.p50,
        snapshot.agent.scan_duration_ns.p99,
    );
    assert!(
        fraction <= BUDGET,
        "idle agent used {:.3}% of a core (budget {:.1}%)",
        fraction * 100.0,
        BUDGET * 100.0
    );
    assert!(
        sched_fraction <= BUDGET,
        "schedstat: {:.3}%",
        sched_fraction * 100.0
    );
    workload.close();
}
