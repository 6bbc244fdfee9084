//! `subetha-agent report` against a real agent and a staged drop storm.
//!
//! A producer (`subetha-flood`, pinned to CPU 0, sidecar off) pushes 2 M
//! observations a second for 1 s while the `subetha-agent` binary drains it
//! from CPU 1 every 100 µs; 300 ms in, a `SCHED_FIFO` busy loop named
//! `subetha-hog` takes CPU 1 for 50 ms, so the ring overflows. Once every
//! storm of the flood has a settled cause, the test draws the storm during
//! the hog's window with `report --storm ID` as SVG, PNG and HTML and checks
//! what they hold:
//!
//! * every picture: the lanes (`scanner`, `scans`, `producer CPU`), the
//!   storm's id and its ring's thread in the legend; the PNG's magic;
//! * with the eBPF probes (root, or `SUBETHA_REQUIRE_PROBES=1` as in CI,
//!   where a probe that does not load fails the test): the scanner lane
//!   names the hog (`preempted by subetha-hog (pid <its tid>)`), and the
//!   storm's timeline (`/api/v1/storms/ID`) has a runnable-waiting span of
//!   the scanner overlapping the hog's window, a scan gap and producer CPU
//!   spans on CPU 0;
//! * without them (an unprivileged run that may still make a FIFO thread):
//!   the lanes say the states are unknown;
//! * the HTML page lists the storm with its picture inline;
//! * a storm id the agent does not have and an unknown extension fail with
//!   a message naming the problem.
//!
//! An unprivileged run that can make no `SCHED_FIFO` thread and does not
//! require the probes skips, with a message.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use subetha_agent::model::{StormDetail, StormReport};
use subetha_tests::agent::{AgentProcess, ScratchDir, agent_exe, process, storms_of};
use subetha_tests::sched::{AffinityGuard, allowed_cpus, run_hog};
use subetha_tests::{TIMEOUT, getuid};

const FLOOD: &str = env!("CARGO_BIN_EXE_subetha-flood");
const PRODUCER_CPU: usize = 0;
const SCANNER_CPU: usize = 1;
const HOG_WINDOW_NS: u64 = 50_000_000;
/// Causes settle 2 s after a storm ends; room for a slow, loaded machine.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

fn probes_required() -> bool {
    getuid() == 0 || std::env::var("SUBETHA_REQUIRE_PROBES").is_ok_and(|v| v == "1")
}

fn fifo_possible() -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is valid for writes for the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_RTPRIO, &mut limit) };
    getuid() == 0 || (rc == 0 && limit.rlim_cur >= 50)
}

/// A running `subetha-flood --cpu 0 --rate 2000000 --duration-ms 1000`.
struct Flood {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pid: u32,
}

impl Flood {
    fn spawn() -> Self {
        let mut child = Command::new(FLOOD)
            .args(["--cpu", "0", "--rate", "2000000", "--duration-ms", "1000"])
            .env("SUBETHA_SIDECAR", "off")
            .env("SUBETHA_AGENT_SOCKET", "/nonexistent/subetha-test.sock")
            .env_remove("SUBETHA_RING_SLOTS")
            .env_remove("SUBETHA_INSTANCES")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {FLOOD}: {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut flood = Self {
            child,
            stdin,
            stdout,
            pid: 0,
        };
        let ready = flood.line("ready");
        flood.pid = ready
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("flood said {ready:?}"));
        flood
    }

    fn line(&mut self, waiting_for: &str) -> String {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("read from the flood");
        assert!(n > 0, "the flood exited while we waited for {waiting_for:?}");
        line.trim_end().to_owned()
    }

    fn go(&mut self) {
        writeln!(self.stdin, "go")
            .and_then(|()| self.stdin.flush())
            .expect("send go");
        let line = self.line("flooding");
        assert!(line.starts_with("flooding "), "flood said {line:?}");
    }

    /// Waits for the ground truth line and the exit; returns the flood's tid.
    fn finish(&mut self) -> u32 {
        let line = self.line("the ground truth");
        let json: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("flood truth {line:?}: {e}"));
        let deadline = Instant::now() + TIMEOUT;
        while self.child.try_wait().expect("try_wait").is_none() {
            assert!(Instant::now() < deadline, "the flood did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        json["tid"].as_u64().expect("tid in the truth") as u32
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

/// `subetha-agent report <args>`, bounded in time.
fn report(args: &[&str]) -> Output {
    let mut child = Command::new(agent_exe())
        .arg("report")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn subetha-agent report");
    let deadline = Instant::now() + TIMEOUT;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("subetha-agent report {args:?} still running after {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("report output")
}

fn report_ok(args: &[&str]) {
    let output = report(args);
    assert!(
        output.status.success(),
        "report {args:?} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("wrote "));
}

fn report_fails(args: &[&str], phrase: &str) {
    let output = report(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "report {args:?} must fail; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains(phrase),
        "report {args:?}: stderr should say {phrase:?}:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn report_draws_a_staged_preemption_storm() {
    const TEST: &str = "report_draws_a_staged_preemption_storm";
    let probes = probes_required();
    if !probes && !fifo_possible() {
        eprintln!(
            "skipping {TEST}: not root, no RLIMIT_RTPRIO for the hog and SUBETHA_REQUIRE_PROBES is not 1"
        );
        return;
    }
    let cpus = allowed_cpus();
    assert!(
        cpus.contains(&PRODUCER_CPU) && cpus.contains(&SCANNER_CPU),
        "{TEST} needs CPUs 0 and 1; this process may use {cpus:?}"
    );
    let _affinity = AffinityGuard::pin_current(PRODUCER_CPU);
    let scratch = ScratchDir::new(TEST);
    let mut flood = Flood::spawn();
    let pid = flood.pid.to_string();
    let cpu = SCANNER_CPU.to_string();
    let args = [
        "--pid",
        pid.as_str(),
        "--no-socket",
        "--discovery-interval",
        "1s",
        "--min-scan-interval",
        "100us",
        "--max-scan-interval",
        "100us",
        "--scanner-cpu",
        cpu.as_str(),
        "--probes",
        if probes { "on" } else { "off" },
    ];
    let agent = AgentProcess::start(agent_exe(), &args, scratch.join("agent.log"));
    let addr = agent.addr().to_string();
    let probes_note = agent.wait_snapshot("the agent to attach the flood", |s| {
        process(s, flood.pid)
            .filter(|p| p.state == "attached")
            .map(|_| s.agent.probes.clone())
    });
    if probes {
        assert!(
            probes_note.starts_with("on:"),
            "probes not on: {probes_note:?}\n{}",
            agent.log()
        );
    }

    flood.go();
    std::thread::sleep(Duration::from_millis(300));
    let hog = run_hog(SCANNER_CPU, HOG_WINDOW_NS);
    let flood_tid = flood.finish();
    eprintln!(
        "{TEST}: hog tid {} held CPU {SCANNER_CPU} for {:.3} ms",
        hog.tid,
        (hog.end_ns - hog.begin_ns) as f64 / 1e6
    );

    // Every storm of the flood settled; pick the biggest one in the hog's window.
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let storm: StormReport = loop {
        let snapshot = agent.snapshot();
        if let Some(snapshot) = &snapshot
            && process(snapshot, flood.pid).is_some_and(|p| p.state == "exited")
        {
            let storms = storms_of(snapshot, flood.pid);
            if storms.iter().all(|s| s.cause_settled) {
                let during = storms
                    .iter()
                    .filter(|s| {
                        s.begin_mono_ns <= hog.end_ns && s.end_mono_ns.unwrap_or(u64::MAX) >= hog.begin_ns
                    })
                    .max_by_key(|s| s.dropped);
                break (*during
                    .unwrap_or_else(|| panic!("no storm during the hog's window {hog:?}: {storms:#?}")))
                .clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the flood's exit and settled storms; last snapshot {snapshot:#?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!(
        "{TEST}: drawing storm #{} ({} dropped, cause {:?})",
        storm.id,
        storm.dropped,
        storm.cause.as_ref().map(|c| &c.kind)
    );
    assert_eq!(storm.tid, flood_tid);
    let id = storm.id.to_string();

    let svg_path = scratch.join("storm.svg");
    let png_path = scratch.join("storm.png");
    let html_path = scratch.join("report.html");
    for path in [&svg_path, &png_path, &html_path] {
        report_ok(&["--addr", &addr, "--storm", &id, "--out", path.to_str().unwrap()]);
    }

    let svg = std::fs::read_to_string(&svg_path).expect("read the SVG");
    if let Ok(keep) = std::env::var("SUBETHA_REPORT_KEEP") {
        // For looking at them: SUBETHA_REPORT_KEEP=<dir>.
        std::fs::create_dir_all(&keep).unwrap();
        for path in [&svg_path, &png_path, &html_path] {
            std::fs::copy(path, std::path::Path::new(&keep).join(path.file_name().unwrap())).unwrap();
        }
    }
    for needle in [
        format!("Drop storm #{}", storm.id),
        "\nscanner\n".to_string(),
        "\nscans\n".to_string(),
        "\nproducer CPU\n".to_string(),
        "drop rate per ring".to_string(),
        format!("storm ring: slot {} · ", storm.slot),
        format!("(tid {flood_tid})"),
    ] {
        assert!(svg.contains(&needle), "the SVG lacks {needle:?}:\n{svg}");
    }
    let body =
        subetha_agent::client::get(agent.addr(), &format!("/api/v1/storms/{id}")).expect("storm detail");
    let detail: StormDetail = serde_json::from_str(&body).expect("storm detail parses");
    let timeline = detail.timeline.expect("the storm has a timeline");
    assert!(
        timeline
            .rings
            .first()
            .is_some_and(|r| r.storm_ring && r.samples.len() >= 2),
        "the storm ring's drops are sampled: {:?}",
        timeline.rings
    );
    assert!(!timeline.scans.is_empty(), "scans in the window");
    if probes {
        let hog_label = format!("preempted by subetha-hog (pid {})", hog.tid);
        assert!(
            svg.contains(&hog_label),
            "the scanner lane names the hog ({hog_label:?}); hog {hog:?}\ncause {:#?}\nagent {:#?}\nscanner spans {:#?}\nagent log:\n{}",
            storm.cause,
            agent.snapshot().map(|s| s.agent),
            timeline.scanner,
            agent.log()
        );
        let spans = timeline.scanner.as_ref().expect("scanner lanes with probes");
        assert!(
            spans.iter().any(|s| s.state == "runnable_waiting"
                && s.begin_mono_ns < hog.end_ns
                && s.end_mono_ns > hog.begin_ns
                && s.holder
                    .as_ref()
                    .is_some_and(|h| h.comm == "subetha-hog" && h.pid == hog.tid)),
            "a runnable wait held by the hog: {spans:#?}"
        );
        let cpus = timeline
            .producer_cpu
            .as_ref()
            .expect("producer CPU lane with probes");
        assert!(
            cpus.iter().any(|s| s.cpu == PRODUCER_CPU as u32),
            "the pinned producer ran on CPU {PRODUCER_CPU}: {cpus:?} ({})",
            timeline.producer_cpu_note
        );
    } else {
        assert!(timeline.scanner.is_none());
        assert!(svg.contains("unknown — scanner states unknown"), "{svg}");
    }

    let png = std::fs::read(&png_path).expect("read the PNG");
    assert!(png.len() > 10_000, "PNG of {} bytes", png.len());
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG magic");

    let html = std::fs::read_to_string(&html_path).expect("read the HTML");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains(&format!("<section id=\"storm-{id}\">")), "{html}");
    assert_eq!(html.matches("<svg").count(), 1, "one storm, one picture");
    assert!(html.contains("\nscanner\n"));

    report_fails(
        &[
            "--addr",
            &addr,
            "--storm",
            "999999999",
            "--out",
            svg_path.to_str().unwrap(),
        ],
        "has no storm 999999999",
    );
    report_fails(
        &[
            "--addr",
            &addr,
            "--storm",
            &id,
            "--out",
            scratch.join("x.jpg").to_str().unwrap(),
        ],
        "--out must end in .svg, .png or .html",
    );
}
