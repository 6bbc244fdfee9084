//! Driving the agent and instrumented workloads in multi-process tests.
//!
//! * [`agent_exe`] / [`agent_exe_release`]: the real `subetha-agent` binary,
//!   built on first use (`cargo build -p subetha-agent --bins`), because a
//!   test of this package gets no `CARGO_BIN_EXE_*` for another package.
//! * [`AgentProcess`]: that binary running `run` on a free loopback port,
//!   its stderr kept in a log file, its snapshot fetched over HTTP.
//! * [`in_process_agent`]: the agent library on a scan thread of the test,
//!   limited to the given pids (never every process on the host: another
//!   test's sidecar must keep its lease).
//! * [`Workload`]: the `subetha-workload` helper (see its source for the
//!   roles), with exact ground truth ([`Truth`]).
//! * [`SegmentProbe`]: the test's own read-only look at a process's segment
//!   (lease word, per-slot totals, ring fill), mapped through `/proc`.
//!
//! ## `subetha-workload run` protocol (stdin → stdout, one line each)
//!
//! | command    | reply                                                        |
//! |------------|--------------------------------------------------------------|
//! | (start)    | `ready <pid>` once instances are registered                  |
//! | `register` | with `--hold` (start said `hold <pid>`): `ok <pid>`           |
//! | `go`       | `ok`: workers (and churn) start                              |
//! | `progress` | truth so far (moving)                                        |
//! | `pause`    | truth, exact: every thread parked, no `observe` in flight     |
//! | `resume`   | `ok`                                                         |
//! | `stop`     | truth, exact: threads joined; then the process exits 0        |
//!
//! Truth: `ok <attempted> <queued> <dropped> <lost> <threads> <bursts>`.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use subetha_agent::model::{ProcessReport, StormReport};
use subetha_agent::{Agent, AgentConfig, AgentHandle, AgentSnapshot, ProbeMode};
use subetha_core::SegmentView;
use subetha_core::lease::word_pid;
use subetha_core::segment::{Expectations, process_start_time};

use crate::{TIMEOUT, getuid, procfs, wait_for};

/// The `target/<profile>` directory this test binary was built into.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test>-<hash>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

fn build_agent(profile: &str) -> PathBuf {
    let profile_dir = profile_dir();
    let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let mut command = Command::new(env!("CARGO"));
    command
        .current_dir(workspace)
        .args(["build", "--quiet", "-p", "subetha-agent", "--bins"])
        .env("CARGO_TARGET_DIR", &target_dir);
    if profile != "debug" {
        command.args([
            "--profile",
            if profile == "release" { "release" } else { profile },
        ]);
    }
    let output = command.output().expect("run cargo build");
    assert!(
        output.status.success(),
        "cargo build -p subetha-agent --bins ({profile}) failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let exe = target_dir.join(profile).join("subetha-agent");
    assert!(exe.exists(), "{} missing after the build", exe.display());
    exe
}

/// The `subetha-agent` binary of this test's profile, (re)built once per
/// test process so it matches the sources.
pub fn agent_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let profile = profile_dir();
        let name = profile
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("debug")
            .to_owned();
        build_agent(&name)
    })
}

/// The release `subetha-agent` binary (for budgets that hold for what is
/// shipped, not for an unoptimised build), built once per test process.
pub fn agent_exe_release() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| build_agent("release"))
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// A fresh scratch directory for one test, removed by [`ScratchDir`]'s drop.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// `$TMPDIR/subetha-<test>-<pid>`.
    pub fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("subetha-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Self(dir)
    }

    /// `dir/name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A running `subetha-agent run`. SIGKILLed on drop if still running.
pub struct AgentProcess {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl AgentProcess {
    /// Starts `exe run --listen 127.0.0.1:<free port> <args>`, logging to
    /// `log`. Pass `--pid` (tests must not drain other tests' processes) and
    /// `--socket`/`--no-socket` (never the system socket).
    pub fn start(exe: &Path, args: &[&str], log: PathBuf) -> Self {
        Self::start_in(&[], exe, args, log)
    }

    /// [`start`](Self::start) under `wrapper` (e.g. `setpriv --reuid 1000
    /// ...`: the agent as another user); [`pid`](Self::pid) is then the
    /// wrapper's, which `exec`s the agent.
    pub fn start_in(wrapper: &[&str], exe: &Path, args: &[&str], log: PathBuf) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let listen = addr.to_string();
        let mut full = vec!["run", "--listen", listen.as_str()];
        full.extend_from_slice(args);
        let stderr = File::create(&log).expect("create the agent log");
        let mut command = match wrapper.split_first() {
            None => Command::new(exe),
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(exe);
                command
            }
        };
        let child = command
            .args(&full)
            .env("SUBETHA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
        Self { child, addr, log }
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where it serves HTTP.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's latest snapshot, if it answers.
    pub fn snapshot(&self) -> Option<AgentSnapshot> {
        let body = subetha_agent::client::get(self.addr, "/api/v1/snapshot").ok()?;
        Some(serde_json::from_str(&body).expect("the agent's snapshot parses"))
    }

    /// Polls the snapshot until `check` accepts it.
    pub fn wait_snapshot<T>(&self, what: &str, mut check: impl FnMut(&AgentSnapshot) -> Option<T>) -> T {
        let last = std::cell::RefCell::new(None);
        wait_for(
            TIMEOUT,
            what,
            || {
                let snapshot = self.snapshot()?;
                let found = check(&snapshot);
                *last.borrow_mut() = Some(snapshot);
                found
            },
            || format!("{:#?}\n--- agent log ---\n{}", last.borrow(), self.log()),
        )
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill on our own child's pid (not yet reaped: we hold it).
        let rc = unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Waits (bounded) for the agent to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agent {} did not exit within {timeout:?}; log:\n{}",
                self.pid(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The agent library on a thread of this process, draining only `pids`,
/// with `tweak` applied to otherwise default settings. Probes are off: the
/// library is built with or without them depending on what else cargo
/// builds, and the binary tests cover them.
pub fn in_process_agent(pids: &[u32], tweak: impl FnOnce(&mut AgentConfig)) -> AgentHandle {
    let mut config = AgentConfig {
        pids: Some(pids.to_vec()),
        discovery_interval: Duration::from_millis(20),
        publish_interval: Duration::from_millis(20),
        probes: ProbeMode::Off,
        ..AgentConfig::default()
    };
    tweak(&mut config);
    Agent::new(config).spawn().expect("spawn the agent's scan thread")
}

/// Polls an in-process agent's snapshot until `check` accepts it.
pub fn wait_agent<T>(
    agent: &AgentHandle,
    what: &str,
    mut check: impl FnMut(&AgentSnapshot) -> Option<T>,
) -> T {
    wait_for(
        TIMEOUT,
        what,
        || check(&agent.snapshot()),
        || format!("{:#?}", agent.snapshot()),
    )
}

/// The (single) report on `pid` in `snapshot`.
pub fn process(snapshot: &AgentSnapshot, pid: u32) -> Option<&ProcessReport> {
    let mut found = snapshot.processes.iter().filter(|p| p.pid == pid);
    let first = found.next()?;
    assert!(found.next().is_none(), "two reports on pid {pid}: {snapshot:#?}");
    Some(first)
}

/// Storms of `pid`, oldest first.
pub fn storms_of(snapshot: &AgentSnapshot, pid: u32) -> Vec<&StormReport> {
    snapshot.storms.iter().filter(|s| s.pid == pid).collect()
}

/// Exact ground truth from the workload: every `observe` call and what it
/// returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Truth {
    /// `observe` calls.
    pub attempted: u64,
    /// Returned `Ok(true)`.
    pub queued: u64,
    /// Returned `Ok(false)` (ring full).
    pub dropped: u64,
    /// Returned `Err` (no ring).
    pub lost: u64,
    /// Threads started.
    pub threads: u64,
    /// Bursts made.
    pub bursts: u64,
}

impl Truth {
    fn parse(words: &[String], exact: bool) -> Self {
        let n = |i: usize| -> u64 {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("bad truth line {words:?}"))
        };
        let truth = Self {
            attempted: n(0),
            queued: n(1),
            dropped: n(2),
            lost: n(3),
            threads: words.get(4).map_or(0, |_| n(4)),
            bursts: words.get(5).map_or(0, |_| n(5)),
        };
        if exact {
            assert_eq!(
                truth.attempted,
                truth.queued + truth.dropped + truth.lost,
                "the workload's own books: {truth:?}"
            );
        }
        truth
    }
}

/// Asserts the agent's books on a process match the truth exactly:
/// `drained + dropped + lost_no_ring == attempted`, and each term matches.
pub fn assert_conserved(report: &ProcessReport, truth: &Truth, context: &str) {
    let summary = format!(
        "{context}: agent drained {} dropped {} lost {} (sum {}), truth {truth:?}; rings {:#?}",
        report.drained,
        report.dropped,
        report.lost_no_ring,
        report.drained + report.dropped + report.lost_no_ring,
        report.rings
    );
    assert_eq!(
        report.drained + report.dropped + report.lost_no_ring,
        truth.attempted,
        "{summary}"
    );
    assert_eq!(report.drained, truth.queued, "{summary}");
    assert_eq!(report.dropped, truth.dropped, "{summary}");
    assert_eq!(report.lost_no_ring, truth.lost, "{summary}");
}

/// A running `subetha-workload`. Killed on drop if still running.
pub struct Workload {
    child: Child,
    /// The workload's own pid when `child` is a wrapper (`unshare`) that
    /// runs it in namespaces.
    inner_pid: Option<u32>,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// The words after `ready`.
    pub ready: Vec<String>,
    /// `(case, fd)` of each `seg` line before `ready` (role `hostile`).
    pub segments: Vec<(String, i32)>,
}

impl Workload {
    /// Starts `exe <args>` with `env` added to a cleaned environment and
    /// waits for its `ready` line.
    pub fn spawn(exe: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_in(&[], exe, args, env)
    }

    /// [`spawn`](Self::spawn) under `wrapper` (a command line ending where
    /// the workload's begins, e.g. `unshare --pid --fork --mount-proc
    /// --kill-child`): [`pid`](Self::pid) is then the workload's own pid (in
    /// our namespace), found among the wrapper's descendants by its
    /// executable.
    pub fn spawn_in(wrapper: &[&str], exe: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = match wrapper.split_first() {
            None => Command::new(exe),
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(exe);
                command
            }
        };
        command
            .args(args)
            .env_remove("SUBETHA_SIDECAR")
            .env_remove("SUBETHA_RING_SLOTS")
            .env_remove("SUBETHA_INSTANCES")
            .env_remove("SUBETHA_AGENT_SOCKET")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Keep the workload from announcing itself to an agent on this host
        // (another test's or the system's): only tests that want it set
        // their own socket.
        command.env("SUBETHA_AGENT_SOCKET", "/nonexistent/subetha-test.sock");
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap_or_else(|e| panic!("spawn {exe}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut workload = Self {
            child,
            inner_pid: None,
            stdin,
            stdout,
            ready: Vec::new(),
            segments: Vec::new(),
        };
        loop {
            let line = workload.read_line("ready");
            let mut words = line.split_ascii_whitespace().map(str::to_owned);
            match words.next().as_deref() {
                Some("ready") | Some("hold") => {
                    workload.ready = words.collect();
                    break;
                }
                Some("seg") => {
                    let case = words.next().expect("case");
                    let fd = words.next().and_then(|w| w.parse().ok()).expect("fd");
                    workload.segments.push((case, fd));
                }
                _ => panic!("workload said {line:?} before ready"),
            }
        }
        if !wrapper.is_empty() {
            let root = workload.child.id();
            let found = procfs::descendants(root).into_iter().find(|&pid| {
                std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == Path::new(exe))
            });
            workload.inner_pid = Some(
                found.unwrap_or_else(|| panic!("no {exe} among the descendants of {wrapper:?} (pid {root})")),
            );
        }
        workload
    }

    fn read_line(&mut self, waiting_for: &str) -> String {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("read from the workload");
        assert!(
            n > 0,
            "workload exited while we waited for {waiting_for:?}: {:?}",
            self.child.try_wait()
        );
        line.trim_end().to_owned()
    }

    /// The workload's pid (in our pid namespace).
    pub fn pid(&self) -> u32 {
        self.inner_pid.unwrap_or_else(|| self.child.id())
    }

    /// Polls `progress` until `done` accepts the (moving) truth.
    pub fn wait_progress(&mut self, what: &str, done: impl Fn(&Truth) -> bool) -> Truth {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let truth = Truth::parse(&self.cmd("progress"), false);
            if done(&truth) {
                return truth;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {TIMEOUT:?} waiting for {what}; last progress {truth:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends one command; returns the words of its `ok` reply.
    pub fn cmd(&mut self, line: &str) -> Vec<String> {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("send {line:?}: {e}"));
        let reply = self.read_line(line);
        let mut words = reply.split_ascii_whitespace().map(str::to_owned);
        match words.next().as_deref() {
            Some("ok") => words.collect(),
            _ => panic!("workload answered {line:?} with {reply:?}"),
        }
    }

    /// A command whose reply is an exact truth line (`pause`, `stop`).
    pub fn truth(&mut self, line: &str) -> Truth {
        Truth::parse(&self.cmd(line), true)
    }

    /// `stop`: joins every thread, returns the final truth and waits for a
    /// clean exit.
    pub fn stop(&mut self) -> Truth {
        let truth = self.truth("stop");
        let status = self.wait_exit(TIMEOUT);
        assert!(status.success(), "workload exited with {status}");
        truth
    }

    /// Closes stdin (parked roles exit) and waits for a clean exit.
    pub fn close(&mut self) {
        drop(self.stdin.take());
        let status = self.wait_exit(TIMEOUT);
        assert!(status.success(), "workload exited with {status}");
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the workload");
        let status = self.child.wait().expect("reap the workload");
        assert_eq!(status.code(), None, "killed by a signal: {status}");
    }

    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "workload did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The test's own mapping of another process's segment, for reading the
/// lease word and the per-slot totals (it never takes the lease or pops).
pub struct SegmentProbe {
    view: SegmentView,
}

/// Per-slot totals read straight from a segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotTotals {
    /// Σ `drained_total` (observations drained by any consumer).
    pub drained: u64,
    /// Σ ring drop counters.
    pub dropped: u64,
    /// Σ observations waiting in rings now.
    pub waiting: u64,
    /// `lost_no_ring`.
    pub lost: u64,
    /// Slots ever claimed (high-water mark).
    pub slots: u32,
}

impl SegmentProbe {
    /// Maps `pid`'s (single) segment through `/proc/<pid>/fd`.
    pub fn open(pid: u32) -> Self {
        let pid_text = pid.to_string();
        let memfds = procfs::subetha_memfds(&pid_text);
        assert_eq!(memfds.len(), 1, "pid {pid} has one subetha memfd: {memfds:?}");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/fd/{}", memfds[0]))
            .expect("open the segment");
        // A process in a container made its header with its own ids.
        let ns = subetha_agent::pidns::PidNamespace::of(pid).expect("the process's namespaces");
        let uid = subetha_agent::pidns::UidMap::of(pid).to_inside(getuid());
        let expect = Expectations {
            pid: Some(ns.own_pid()),
            start_time_ticks: process_start_time(pid),
            uid,
            pid_ns_inode: Some(ns.inode),
        };
        let view = SegmentView::map_fd(file.as_fd(), &expect).expect("the segment validates");
        Self { view }
    }

    /// The segment.
    pub fn view(&self) -> &SegmentView {
        &self.view
    }

    /// Pid in the consumer lease word (0: vacant).
    pub fn lease_pid(&self) -> u32 {
        word_pid(self.view.live().consumer.load(Ordering::Acquire))
    }

    /// Per-slot totals now.
    pub fn totals(&self) -> SlotTotals {
        let view = &self.view;
        let slots = view.rings_in_use();
        let mut totals = SlotTotals {
            lost: view.live().lost_no_ring.load(Ordering::Relaxed),
            slots,
            ..SlotTotals::default()
        };
        for index in 0..slots {
            let slot = view.ring_slot(index).expect("in range");
            // The head is authoritative for the low 32 bits (a consumer
            // killed between publishing head and the total lags by a batch).
            let total = slot.drained_total.load(Ordering::Relaxed);
            let behind = slot.ring.head().wrapping_sub(total as u32);
            totals.drained += total + u64::from(behind);
            totals.dropped += slot.ring.dropped();
            totals.waiting += slot.ring.len() as u64;
        }
        totals
    }

    /// Waits until the lease word names `pid`.
    pub fn wait_lease(&self, pid: u32, what: &str) {
        wait_for(
            TIMEOUT,
            format!("the lease to pass to pid {pid} ({what})"),
            || (self.lease_pid() == pid).then_some(()),
            || format!("lease pid {}", self.lease_pid()),
        );
    }

    /// Waits until the drained total exceeds `above`; returns it.
    pub fn wait_drained_above(&self, above: u64, what: &str) -> u64 {
        wait_for(
            TIMEOUT,
            format!("more than {above} drained ({what})"),
            || {
                let drained = self.totals().drained;
                (drained > above).then_some(drained)
            },
            || format!("{:?}, lease pid {}", self.totals(), self.lease_pid()),
        )
    }
}

/// `VmRSS` (or another `/proc/<pid>/status` field in kB) of `pid` ("self" for us).
pub fn status_kib(pid: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// utime + stime of `pid` (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // Fields 14 and 15 (1-based), i.e. 12 and 13 after the ')'.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

/// Σ over `pid`'s threads of the on-CPU time in `/proc/<pid>/task/*/schedstat`
/// (nanoseconds; live threads only).
pub fn schedstat_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Runs the agent binary with `args` to completion and returns its output;
/// kills it (and fails) if it is still running after 30 s.
pub fn run_agent(args: &[&str]) -> std::process::Output {
    let mut child = Command::new(agent_exe())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn subetha-agent");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "subetha-agent {args:?} still running after 30 s; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().expect("collect output")
}
