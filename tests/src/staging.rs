//! Staging drop storms with known causes, for the storm-cause tests
//! (`probes_storm_causes.rs`, `storm_accuracy.rs`).
//!
//! A producer (`subetha-flood`, pinned to CPU 0, `SUBETHA_SIDECAR=off` so
//! only the agent drains) pushes into one ring while the agent's scan
//! thread is pinned to CPU 1; a `SCHED_FIFO` hog can take CPU 1 for a known
//! window. [`stage_with`] runs one such scenario, waits for every storm's
//! cause to settle and checks the books against the flood's ground truth.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};

use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::agent::{AgentProcess, ScratchDir, Truth, agent_exe, assert_conserved, process, storms_of};
use crate::sched::{AffinityGuard, HogRun, allowed_cpus, run_hog, set_thread_fifo, threads_named};
use crate::{TIMEOUT, getuid};
use subetha_agent::model::{Cause, StormReport};
use subetha_agent::{AgentConfig, AgentHandle, AgentSnapshot, ProbeMode};

/// The producer's CPU and the scanner's (and the hog's).
pub const PRODUCER_CPU: usize = 0;
pub const SCANNER_CPU: usize = 1;
/// How long the hog holds the scanner's CPU.
pub const HOG_WINDOW_NS: u64 = 50_000_000;
/// The steady producer rate: a 4096-slot ring fills in ~2 ms.
pub const RATE: &str = "2000000";
/// A storm's cause settles 2 s after it ends; this leaves room for a slow
/// machine.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(15);
pub const MS: f64 = 1e6;
/// The first walk of `/proc` runs when the agent starts (the flood is
/// already waiting). The walks run on a thread of their own, not the
/// scanner's, but still take CPU time from whatever shares their CPU: once
/// a second keeps them out of the staged storms' way.
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(1);

static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn probes_required() -> bool {
    getuid() == 0 || std::env::var("SUBETHA_REQUIRE_PROBES").is_ok_and(|v| v == "1")
}

/// Whether a probe test may run here; `false` (with a message) only for an
/// unprivileged run that does not require the probes.
pub fn probes_possible(test: &str) -> bool {
    if probes_required() {
        return true;
    }
    eprintln!(
        "skipping {test}: not root, and SUBETHA_REQUIRE_PROBES is not 1 (the eBPF probes need root here)"
    );
    false
}

/// Whether this process may make a thread `SCHED_FIFO` at priority 50 (the
/// hog); if not, `false` (with a message) only when nothing requires it.
pub fn fifo_possible(test: &str) -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is valid for writes for the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_RTPRIO, &mut limit) };
    if getuid() == 0 || (rc == 0 && limit.rlim_cur >= 50) || probes_required() {
        return true;
    }
    eprintln!("skipping {test}: not root and RLIMIT_RTPRIO < 50: no SCHED_FIFO hog possible");
    false
}

/// The staged tests need CPUs 0 and 1.
pub fn require_two_cpus(test: &str) {
    let cpus = allowed_cpus();
    assert!(
        cpus.contains(&PRODUCER_CPU) && cpus.contains(&SCANNER_CPU),
        "{test} needs CPUs {PRODUCER_CPU} and {SCANNER_CPU}; this process may use {cpus:?}"
    );
}

// ---------------------------------------------------------------- the flood

/// A running `subetha-flood`.
pub struct Flood {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub stdout: BufReader<ChildStdout>,
    /// Its pid here.
    pub pid: u32,
    /// Its pid in its own pid namespace (what it reports).
    pub ns_pid: u32,
}

/// The flood's JSON ground truth.
#[derive(Clone, Copy, Debug)]
pub struct FloodTruth {
    pub tid: u32,
    pub attempted: u64,
    pub queued: u64,
    pub dropped: u64,
    pub lost: u64,
    pub begin_mono_ns: u64,
    pub end_mono_ns: u64,
    pub achieved_rate: f64,
}

impl FloodTruth {
    pub fn truth(&self) -> Truth {
        Truth {
            attempted: self.attempted,
            queued: self.queued,
            dropped: self.dropped,
            lost: self.lost,
            threads: 1,
            bursts: 0,
        }
    }
}

impl Flood {
    /// Starts `subetha-flood <args>` (sidecar off, no agent socket) under
    /// `wrapper` (e.g. `unshare ...`, or nothing) and waits for `ready`.
    pub fn spawn(wrapper: &[&str], args: &[&str]) -> Self {
        let mut command = match wrapper.split_first() {
            None => Command::new(flood_exe()),
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(flood_exe());
                command
            }
        };
        let mut child = command
            .args(args)
            .env("SUBETHA_SIDECAR", "off")
            .env("SUBETHA_AGENT_SOCKET", "/nonexistent/subetha-test.sock")
            .env_remove("SUBETHA_RING_SLOTS")
            .env_remove("SUBETHA_INSTANCES")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", flood_exe().display()));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut flood = Self {
            child,
            stdin,
            stdout,
            pid: 0,
            ns_pid: 0,
        };
        let ready = flood.line("ready");
        flood.ns_pid = ready
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("flood said {ready:?}"));
        flood.pid = if wrapper.is_empty() {
            assert_eq!(flood.ns_pid, flood.child.id());
            flood.ns_pid
        } else {
            let root = flood.child.id();
            crate::procfs::descendants(root)
                .into_iter()
                .find(|&pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == flood_exe()))
                .unwrap_or_else(|| {
                    panic!("no subetha-flood among the descendants of {wrapper:?} (pid {root})")
                })
        };
        flood
    }

    fn line(&mut self, waiting_for: &str) -> String {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("read from the flood");
        assert!(
            n > 0,
            "the flood exited while we waited for {waiting_for:?}: {:?}",
            self.child.try_wait()
        );
        line.trim_end().to_owned()
    }

    /// Starts the flood; returns when it began (CLOCK_MONOTONIC ns).
    pub fn go(&mut self) -> u64 {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "go")
            .and_then(|()| stdin.flush())
            .expect("send go");
        let line = self.line("flooding");
        line.strip_prefix("flooding ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("flood said {line:?}"))
    }

    /// Waits for the ground truth line and a clean exit.
    pub fn finish(&mut self) -> FloodTruth {
        let line = self.line("the ground truth");
        let json: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("flood truth {line:?}: {e}"));
        let n = |key: &str| {
            json[key]
                .as_u64()
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        };
        let truth = FloodTruth {
            tid: n("tid") as u32,
            attempted: n("attempted"),
            queued: n("queued"),
            dropped: n("dropped"),
            lost: n("lost"),
            begin_mono_ns: n("begin_mono_ns"),
            end_mono_ns: n("end_mono_ns"),
            achieved_rate: json["achieved_rate"].as_f64().unwrap_or(0.0),
        };
        assert_eq!(n("pid") as u32, self.ns_pid);
        assert_eq!(
            truth.attempted,
            truth.queued + truth.dropped + truth.lost,
            "the flood's own books: {line}"
        );
        let deadline = Instant::now() + TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "the flood did not exit");
            std::thread::sleep(Duration::from_millis(2));
        };
        assert!(status.success(), "the flood exited with {status}");
        truth
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------- the agent

/// The agent under test: the library on a thread of this process, or the
/// real binary (see the module docs for when).
pub enum AgentUnderTest {
    Library(AgentHandle),
    Binary(AgentProcess, ScratchDir),
}

impl AgentUnderTest {
    /// An agent draining only `pid`, its scanner pinned to CPU 1 and
    /// pausing between `scan.0` and `scan.1` between scans.
    pub fn start(test: &str, pid: u32, probes: ProbeMode, scan: (Duration, Duration)) -> Self {
        let binary = match std::env::var("SUBETHA_PROBES_TEST_AGENT").as_deref() {
            Ok("binary") => true,
            Ok("library") => false,
            _ => probes == ProbeMode::On && !subetha_agent::probes::BUILT_IN,
        };
        if binary {
            eprintln!(
                "{test}: running the subetha-agent binary (library probes built in: {})",
                subetha_agent::probes::BUILT_IN
            );
            Self::start_binary(test, pid, probes, scan)
        } else {
            let config = AgentConfig {
                pids: Some(vec![pid]),
                discovery_interval: DISCOVERY_INTERVAL,
                min_scan_interval: scan.0,
                max_scan_interval: scan.1,
                publish_interval: Duration::from_millis(20),
                scanner_cpu: Some(SCANNER_CPU),
                probes,
                ..AgentConfig::default()
            };
            match subetha_agent::Agent::new(config).spawn() {
                Ok(handle) => Self::Library(handle),
                Err(error) => panic!("{test}: the agent did not start with probes {probes:?}: {error}"),
            }
        }
    }

    /// The process the agent runs in.
    pub fn pid(&self) -> u32 {
        match self {
            Self::Library(_) => std::process::id(),
            Self::Binary(process, _) => process.pid(),
        }
    }

    pub fn start_binary(test: &str, pid: u32, probes: ProbeMode, scan: (Duration, Duration)) -> Self {
        let (min, max) = (
            format!("{}us", scan.0.as_micros()),
            format!("{}us", scan.1.as_micros()),
        );
        let scratch = ScratchDir::new(test);
        let pid = pid.to_string();
        let cpu = SCANNER_CPU.to_string();
        let mode = match probes {
            ProbeMode::On => "on",
            ProbeMode::Off => "off",
            ProbeMode::Auto => "auto",
        };
        let args = [
            "--pid",
            pid.as_str(),
            "--no-socket",
            "--discovery-interval",
            "1s",
            "--min-scan-interval",
            &min,
            "--max-scan-interval",
            &max,
            "--scanner-cpu",
            cpu.as_str(),
            "--probes",
            mode,
        ];
        let mut agent = AgentProcess::start(agent_exe(), &args, scratch.join("agent.log"));
        // Up, or failed to start (e.g. `--probes on` without probes).
        let deadline = Instant::now() + TIMEOUT;
        while agent.snapshot().is_none() {
            if let Some(status) = agent.try_exit() {
                panic!(
                    "{test}: subetha-agent {args:?} exited with {status}:\n{}",
                    agent.log()
                );
            }
            assert!(Instant::now() < deadline, "{test}: the agent does not answer");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self::Binary(agent, scratch)
    }

    pub fn snapshot(&self) -> Option<AgentSnapshot> {
        match self {
            Self::Library(handle) => Some((*handle.snapshot()).clone()),
            Self::Binary(agent, _) => agent.snapshot(),
        }
    }

    pub fn log(&self) -> String {
        match self {
            Self::Library(_) => String::new(),
            Self::Binary(agent, _) => format!("\n--- agent log ---\n{}", agent.log()),
        }
    }

    /// Polls snapshots until `check` accepts one.
    pub fn wait<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&AgentSnapshot) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(snapshot) = self.snapshot() {
                if let Some(found) = check(&snapshot) {
                    return found;
                }
                last = Some(snapshot);
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; last snapshot: {last:#?}{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn stop(self) {
        match self {
            Self::Library(handle) => {
                handle.stop();
            }
            Self::Binary(mut agent, _scratch) => {
                agent.signal(libc::SIGTERM);
                let status = agent.wait_exit(TIMEOUT);
                assert!(status.success(), "agent exit {status}:{}", agent.log_text());
            }
        }
    }
}

/// `AgentProcess` helpers this file needs.
trait AgentProcessExt {
    fn try_exit(&mut self) -> Option<std::process::ExitStatus>;
    fn log_text(&self) -> String;
}

impl AgentProcessExt for AgentProcess {
    fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        // Still running: kill(pid, 0) succeeds for a live or zombie child;
        // a zombie is reaped by wait_exit.
        // SAFETY: signal 0 only checks the pid, which is our unreaped child.
        let alive = unsafe { libc::kill(self.pid() as libc::pid_t, 0) } == 0;
        let zombie = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .map(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
            .unwrap_or(true);
        (!alive || zombie).then(|| self.wait_exit(TIMEOUT))
    }

    fn log_text(&self) -> String {
        self.log()
    }
}

// ----------------------------------------------------------- the scenarios

/// What one staged run saw.
pub struct Staged {
    pub pid: u32,
    pub truth: FloodTruth,
    pub snapshot: AgentSnapshot,
    pub hog: Option<HogRun>,
}

/// Runs the flood (`flood_args`) under an agent with `probes`, optionally
/// with the hog after 300 ms; waits for the flood's exit and for every
/// storm of its process to have a settled cause; checks conservation.
pub fn stage(test: &str, probes: ProbeMode, flood_args: &[&str], with_hog: bool) -> Staged {
    let disturbance = if with_hog {
        Disturbance::Hog
    } else {
        Disturbance::None
    };
    stage_with(
        test,
        probes,
        &[],
        flood_args,
        disturbance,
        false,
        PREEMPTION_SCANS,
    )
}

/// What keeps the scanner from scanning, 300 ms into the flood.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disturbance {
    /// Nothing.
    None,
    /// The `SCHED_FIFO` hog takes the scanner's CPU for [`HOG_WINDOW_NS`]
    /// (the scanner is preempted).
    Hog,
    /// The agent's process is stopped (`SIGSTOP`) for [`HOG_WINDOW_NS`]
    /// and continued: the scanner sleeps (it is blocked). Runs the agent
    /// binary, never the library (which would stop this test).
    StopAgent,
}

/// The scans of the preemption tests: every 100 µs, a ring-full at the
/// flood's 2 M obs/s taking 20 pauses.
pub const PREEMPTION_SCANS: (Duration, Duration) = (Duration::from_micros(100), Duration::from_micros(100));
/// The agent's default pacing (adaptive between 100 µs and 20 ms).
pub const DEFAULT_SCANS: (Duration, Duration) = (Duration::from_micros(100), Duration::from_millis(20));

/// [`stage`]; with `unhindered_scanner` the agent's scan thread is made
/// `SCHED_FIFO` (priority 20) once it runs, so that nothing on this host
/// but higher real-time work can keep it off its CPU: the "unhindered
/// scanner" of the burst tests, whatever else loads the machine.
pub fn stage_with(
    test: &str,
    probes: ProbeMode,
    wrapper: &[&str],
    flood_args: &[&str],
    disturbance: Disturbance,
    unhindered_scanner: bool,
    scan: (Duration, Duration),
) -> Staged {
    require_two_cpus(test);
    // The test thread (flood control, snapshots, the hog's start and join)
    // stays on CPU 0.
    let _affinity = AffinityGuard::pin_current(PRODUCER_CPU);
    let mut flood = Flood::spawn(wrapper, flood_args);
    let pid = flood.pid;
    let agent = if disturbance == Disturbance::StopAgent {
        AgentUnderTest::start_binary(test, pid, probes, scan)
    } else {
        AgentUnderTest::start(test, pid, probes, scan)
    };
    agent.wait(TIMEOUT, "the agent to attach the flood", |s| {
        process(s, pid).filter(|p| p.state == "attached").map(|_| ())
    });
    if probes == ProbeMode::On {
        let snapshot = agent.snapshot().expect("snapshot");
        assert!(
            snapshot
                .agent
                .probes
                .starts_with("on: 2/2 sched tracepoints (tp_btf)")
                || snapshot.agent.probes.starts_with("on: 4/4 sched tracepoints"),
            "{test}: probes not fully on: {:?}{}",
            snapshot.agent.probes,
            agent.log()
        );
    }
    if unhindered_scanner {
        let scanners = threads_named(agent.pid(), "subetha-scan");
        assert_eq!(
            scanners.len(),
            1,
            "{test}: one scan thread in pid {}: {scanners:?}",
            agent.pid()
        );
        set_thread_fifo(scanners[0], 20).unwrap_or_else(|e| panic!("{test}: {e}"));
    }
    let began = flood.go();
    let hog = (disturbance != Disturbance::None).then(|| {
        // Steady state first: the producer thread is watched, the rate held.
        std::thread::sleep(Duration::from_millis(300));
        match disturbance {
            Disturbance::StopAgent => stop_for(agent.pid(), HOG_WINDOW_NS),
            _ => run_hog(SCANNER_CPU, HOG_WINDOW_NS),
        }
    });
    let truth = flood.finish();
    eprintln!(
        "{test}: flood pid {pid} tid {}: {} attempted at {:.2} M/s over {:.1} ms, {} dropped; began {:.1} ms \
         after `go`{}",
        truth.tid,
        truth.attempted,
        truth.achieved_rate / 1e6,
        (truth.end_mono_ns - truth.begin_mono_ns) as f64 / MS,
        truth.dropped,
        (truth.begin_mono_ns.saturating_sub(began)) as f64 / MS,
        hog.map(|h| format!(
            "; hog tid {} held CPU {SCANNER_CPU} for {:.3} ms from +{:.3} ms ({:.3} ms)",
            h.tid,
            (h.end_ns - h.begin_ns) as f64 / MS,
            (h.begin_ns - truth.begin_mono_ns) as f64 / MS,
            h.begin_ns as f64 / MS,
        ))
        .unwrap_or_default()
    );
    // The verdicts each storm went through before settling, for the log.
    let mut verdicts: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let snapshot = agent.wait(
        SETTLE_TIMEOUT,
        "the flood's exit and settled causes for all its storms",
        |s| {
            for storm in storms_of(s, pid) {
                if let Some(cause) = &storm.cause {
                    let seen = verdicts.entry(storm.id).or_default();
                    let now = format!("{} ({})", cause.kind, cause.confidence);
                    if seen.last() != Some(&now) {
                        seen.push(now);
                    }
                }
            }
            let report = process(s, pid)?;
            let storms = storms_of(s, pid);
            (report.state == "exited" && storms.iter().all(|st| st.cause_settled)).then(|| s.clone())
        },
    );
    for (id, seen) in &verdicts {
        if seen.len() > 1 {
            eprintln!("{test}: storm #{id}'s verdict went {}", seen.join(" → "));
        }
    }
    let report = process(&snapshot, pid).unwrap();
    assert_conserved(report, &truth.truth(), test);
    let storms = storms_of(&snapshot, pid);
    let storm_drops: u64 = storms.iter().map(|s| s.dropped).sum();
    assert_eq!(
        storm_drops, report.dropped,
        "every drop is in one storm: {storms:#?}"
    );
    for storm in &storms {
        eprintln!("{test}: {}", describe(storm));
    }
    if probes == ProbeMode::On {
        eprintln!(
            "{test}: probes {:?}, {} events, {} lost",
            snapshot.agent.probes, snapshot.agent.probe_events, snapshot.agent.probe_losses
        );
    }
    agent.stop();
    Staged {
        pid,
        truth,
        snapshot,
        hog,
    }
}

pub fn describe(storm: &StormReport) -> String {
    let cause = storm.cause.as_ref();
    format!(
        "storm #{} tid {} at {:.3} ms for {:.3} ms{}{}: {} dropped, longest gap {:.3} ms; cause {} ({}): {}; \
         interval {:?}; evidence {:?}",
        storm.id,
        storm.tid,
        storm.begin_mono_ns as f64 / MS,
        storm.duration_ns as f64 / MS,
        if storm.end_estimated {
            " (end estimated)"
        } else {
            ""
        },
        if storm.merged > 0 {
            format!(" ({} merged)", storm.merged)
        } else {
            String::new()
        },
        storm.dropped,
        storm.max_scan_gap_ns as f64 / MS,
        cause.map_or("-", |c| c.kind.as_str()),
        cause.map_or("-", |c| c.confidence.as_str()),
        cause.map_or("-", |c| c.summary.as_str()),
        cause.and_then(|c| c.interval),
        cause.map(|c| &c.evidence),
    )
}

/// The storms during the hog's window (at least one): those whose known
/// extent overlaps it. A storm whose end is estimated (another episode
/// began before the agent saw it end, so the agent only knows it ended by
/// the next scan) is taken to have ended where it began.
pub fn hog_storms<'a>(staged: &'a Staged, hog: &HogRun) -> Vec<&'a StormReport> {
    let storms = storms_of(&staged.snapshot, staged.pid);
    let during: Vec<&StormReport> = storms
        .iter()
        .copied()
        .filter(|s| {
            let end = match s.end_mono_ns {
                Some(_) if s.end_estimated => s.begin_mono_ns,
                Some(end) => end,
                None => u64::MAX,
            };
            s.begin_mono_ns <= hog.end_ns && end >= hog.begin_ns
        })
        .collect();
    assert!(
        !during.is_empty(),
        "no storm during the hog's window {hog:?} (flood {:?}): {storms:#?}",
        staged.truth
    );
    during
}

pub fn cause_of(storm: &StormReport) -> &Cause {
    storm
        .cause
        .as_ref()
        .unwrap_or_else(|| panic!("storm without a cause: {storm:#?}"))
}

/// Share of `[begin, end]` covered by `[a, b]`.
pub fn coverage(a: u64, b: u64, begin: u64, end: u64) -> f64 {
    let overlap = b.min(end).saturating_sub(a.max(begin));
    overlap as f64 / (end - begin).max(1) as f64
}

/// The `subetha-flood` helper built beside the running test binary
/// (`target/<profile>/subetha-flood`; cargo builds a package's binaries
/// for its integration tests).
pub fn flood_exe() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    dir.join("subetha-flood")
}

/// Stops process `pid` for `window_ns` and continues it; the window as the
/// test measured it (tid 0: no task took the CPU).
fn stop_for(pid: u32, window_ns: u64) -> HogRun {
    let begin_ns = subetha_core::clock::monotonic_ns();
    signal(pid, libc::SIGSTOP);
    std::thread::sleep(Duration::from_nanos(window_ns));
    let end_ns = subetha_core::clock::monotonic_ns();
    signal(pid, libc::SIGCONT);
    HogRun {
        tid: 0,
        begin_ns,
        end_ns,
    }
}

/// Sends `signal` to process `pid` (panics if it cannot).
fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory preconditions; `pid` is the agent this
    // test started.
    let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(
        rc,
        0,
        "signal {signal} to {pid}: {}",
        std::io::Error::last_os_error()
    );
}
