//! A `subetha-agent run` draining two workloads whose counts are known
//! exactly, for the tests of what the agent exports (Prometheus end to end,
//! OTLP, the contrib dashboard's metric names):
//!
//! * `many`: `subetha-workload many` with [`MANY_INSTANCES`] mutex
//!   instances (`many-0000`, …) observed [`PER_INSTANCE`] times each by one
//!   thread, no sidecar — every observation waits for the agent, so each
//!   instance's ops total is exactly [`PER_INSTANCE`]; it stays alive
//!   (parked) until the [`Fleet`] is dropped.
//! * `bursty`: `subetha-workload run` with a burst that overruns a ring
//!   every 100 ms, stopped after a few bursts, with its exact final truth:
//!   drops, and drop storms whose causes the agent has settled.
//!
//! [`Fleet::start`] returns once the agent's snapshot agrees with both
//! ground truths exactly, so anything exported from then on must carry them.

use std::time::SystemTime;

use subetha_agent::AgentSnapshot;

use crate::agent::{AgentProcess, ScratchDir, SegmentProbe, Truth, Workload, agent_exe, process};

/// Instances of the `many` workload.
pub const MANY_INSTANCES: u64 = 3;
/// Observations per instance of the `many` workload.
pub const PER_INSTANCE: u64 = 1000;

/// The agent and its two workloads (see the module docs).
pub struct Fleet {
    /// The agent (SIGKILLed on drop unless stopped).
    pub agent: AgentProcess,
    /// The `many` workload, parked.
    pub many: Workload,
    /// The `bursty` workload's pid (it has exited).
    pub bursty_pid: u32,
    /// The `bursty` workload's exact final truth.
    pub bursty_truth: Truth,
    /// The first snapshot that agreed with both truths.
    pub snapshot: AgentSnapshot,
    /// Wall-clock time just after that snapshot was fetched: a `/metrics`
    /// scrape started later carries the final counts.
    pub settled_at: SystemTime,
}

impl Fleet {
    /// Starts both workloads and an agent limited to them (probes off,
    /// `extra_args` appended to `run`), runs `bursty` to its end, and waits
    /// until the agent has every observation of both.
    pub fn start(workload_exe: &str, scratch: &ScratchDir, extra_args: &[&str]) -> Self {
        let many = Workload::spawn(
            workload_exe,
            &[
                "many",
                "--instances",
                &MANY_INSTANCES.to_string(),
                "--threads",
                "1",
                "--per-instance",
                &PER_INSTANCE.to_string(),
            ],
            &[("SUBETHA_SIDECAR", "off")],
        );
        let many_truth: Vec<u64> = many.ready[1..]
            .iter()
            .map(|w| w.parse().expect("a count"))
            .collect();
        assert_eq!(
            many_truth,
            [MANY_INSTANCES * PER_INSTANCE, MANY_INSTANCES * PER_INSTANCE, 0, 0],
            "many: attempted, queued, dropped, lost (one thread, fewer observations than a ring holds)"
        );
        let mut bursty = Workload::spawn(
            workload_exe,
            &[
                "run",
                "--threads",
                "2",
                "--rate",
                "2000",
                "--burst",
                "50000",
                "--burst-every-ms",
                "100",
            ],
            &[],
        );
        let (many_pid, bursty_pid) = (many.pid().to_string(), bursty.pid().to_string());
        let mut args = vec![
            "--pid",
            many_pid.as_str(),
            "--pid",
            bursty_pid.as_str(),
            "--no-socket",
            "--probes",
            "off",
            "--discovery-interval",
            "50ms",
            // At most one scan per 2 ms: a 50,000-observation burst
            // overruns a 4096-slot ring whatever the producer's speed.
            "--min-scan-interval",
            "2ms",
            "--max-scan-interval",
            "10ms",
        ];
        args.extend_from_slice(extra_args);
        let agent = AgentProcess::start(agent_exe(), &args, scratch.join("agent.log"));
        SegmentProbe::open(bursty.pid()).wait_lease(agent.pid(), "the agent takes over from the sidecar");
        bursty.cmd("go");
        bursty.wait_progress("three bursts", |t| t.bursts >= 3);
        let bursty_truth = bursty.stop();
        assert!(
            bursty_truth.dropped > 0,
            "bursts must overrun a ring: {bursty_truth:?}"
        );
        let (many_pid, bursty_pid) = (many.pid(), bursty.pid());
        let snapshot = agent.wait_snapshot("the agent to drain both workloads and settle the storms", |s| {
            let report = process(s, bursty_pid)?;
            let settled: u64 = report.storm_causes.values().sum();
            let done = report.state == "exited"
                && report.drained == bursty_truth.queued
                && report.dropped == bursty_truth.dropped
                && report.lost_no_ring == bursty_truth.lost
                && report.instances.iter().map(|i| i.ops).sum::<u64>() == bursty_truth.queued
                && report.storms > 0
                && settled == report.storms;
            let many = process(s, many_pid)?;
            let many_done = many.instances.len() as u64 == MANY_INSTANCES
                && many.instances.iter().all(|i| i.ops == PER_INSTANCE);
            (done && many_done).then(|| s.clone())
        });
        Self {
            agent,
            many,
            bursty_pid,
            bursty_truth,
            snapshot,
            settled_at: SystemTime::now(),
        }
    }

    /// The `many` workload's pid.
    pub fn many_pid(&self) -> u32 {
        self.many.pid()
    }
}
