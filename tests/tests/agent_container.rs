//! Container identity end to end: a workload moved into a real cgroup laid
//! out as docker's systemd driver names a container
//! (`…/docker-<64 hex>.scope`), with `SUBETHA_SERVICE` set, is shown by the
//! real agent with that container id, its cgroup and its service — in the
//! JSON API, on `subetha_process_info`, on its storms and in `status` —
//! and with `--label-from none` without any of the container labels.
//!
//! Making a cgroup needs root and a writable cgroup file system (v1
//! `pids` hierarchy or v2); without them the test says so and does
//! nothing, unless `SUBETHA_REQUIRE_TOOLS=1` (CI) makes that a failure.
//! The parsers themselves are unit-tested on real-world paths of every
//! runtime in `subetha-agent/src/container.rs`.

use std::path::{Path, PathBuf};

use subetha_tests::agent::{AgentProcess, ScratchDir, Workload, agent_exe, process, run_agent, storms_of};
use subetha_tests::getuid;

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");
const ID: &str = "5e7a1c0d9b8f6e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b";

/// A cgroup made for the test, the process moved back out and the
/// directory removed on drop.
struct FakeContainer {
    root: PathBuf,
    dir: PathBuf,
    top: PathBuf,
}

impl FakeContainer {
    /// `<hierarchy>/subetha-test-<pid>/docker-<ID>.scope`, in the first
    /// writable hierarchy.
    fn make() -> Option<Self> {
        let roots = ["/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"];
        for root in roots.map(Path::new) {
            if !root.join("cgroup.procs").exists() {
                continue;
            }
            let top = root.join(format!("subetha-test-{}", std::process::id()));
            let dir = top.join(format!("docker-{ID}.scope"));
            if std::fs::create_dir_all(&dir).is_ok() && dir.join("cgroup.procs").exists() {
                return Some(Self {
                    root: root.to_path_buf(),
                    dir,
                    top,
                });
            }
            let _ = std::fs::remove_dir(&top);
        }
        None
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_dir(&self.top);
    }
}

fn fake_container() -> Option<FakeContainer> {
    let made = (getuid() == 0).then(FakeContainer::make).flatten();
    if made.is_none() {
        assert!(
            std::env::var("SUBETHA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "SUBETHA_REQUIRE_TOOLS=1: this test needs root and a writable cgroup file system"
        );
        eprintln!("skipped: cannot make a cgroup here (needs root and a writable cgroup file system)");
    }
    made
}

#[test]
fn a_process_in_a_container_cgroup_is_labelled_with_its_container_and_service() {
    let Some(container) = fake_container() else {
        return;
    };
    let mut workload = Workload::spawn(
        WORKLOAD,
        &[
            "run",
            "--threads",
            "2",
            "--rate",
            "20000",
            "--burst",
            "200000",
            "--burst-every-ms",
            "100",
        ],
        &[("SUBETHA_SERVICE", "checkout")],
    );
    let pid = workload.pid();
    container.enter(pid);
    let scratch = ScratchDir::new("container");
    let pid_text = pid.to_string();
    let agent = AgentProcess::start(
        agent_exe(),
        &[
            "--pid",
            &pid_text,
            "--no-socket",
            "--probes",
            "off",
            "--max-scan-interval",
            "10ms",
        ],
        scratch.join("agent.log"),
    );
    let report = agent.wait_snapshot("the agent to attach", |s| {
        process(s, pid).filter(|p| p.state == "attached").cloned()
    });
    assert_eq!(report.container_id.as_deref(), Some(ID), "{report:#?}");
    assert!(
        report.cgroup.ends_with(&format!("/docker-{ID}.scope")),
        "{}",
        report.cgroup
    );
    assert_eq!(report.service.as_deref(), Some("checkout"));
    assert_eq!(report.exe, "subetha-workload");
    assert_eq!(report.pod_uid, None);

    let metrics = subetha_agent::client::get(agent.addr(), "/metrics").expect("scrape");
    let info = metrics
        .lines()
        .find(|l| l.starts_with("subetha_process_info{") && l.contains(&format!("pid=\"{pid}\"")))
        .unwrap_or_else(|| panic!("no process info in {metrics}"));
    assert!(info.contains(&format!("container_id=\"{ID}\"")), "{info}");
    assert!(info.contains("service=\"checkout\""), "{info}");

    workload.cmd("go");
    workload.wait_progress("two bursts", |t| t.bursts >= 2);
    let storm = agent.wait_snapshot("a storm", |s| storms_of(s, pid).first().map(|s| (*s).clone()));
    assert_eq!(storm.container_id.as_deref(), Some(ID), "{storm:#?}");
    let addr = agent.addr().to_string();
    let status = run_agent(&["status", "--addr", &addr]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!("service checkout · container {}", &ID[..12])),
        "status shows the container: {text}"
    );
    workload.stop();
    drop(agent);

    // --label-from none: no container labels, the service still there.
    let mut workload = Workload::spawn(WORKLOAD, &["run", "--threads", "1", "--rate", "1000"], &[]);
    let pid = workload.pid();
    container.enter(pid);
    let pid_text = pid.to_string();
    let agent = AgentProcess::start(
        agent_exe(),
        &[
            "--pid",
            &pid_text,
            "--no-socket",
            "--probes",
            "off",
            "--label-from",
            "none",
        ],
        scratch.join("agent-none.log"),
    );
    let report = agent.wait_snapshot("the agent to attach", |s| {
        process(s, pid).filter(|p| p.state == "attached").cloned()
    });
    assert_eq!(
        (report.container_id.as_deref(), report.cgroup.as_str()),
        (None, "")
    );
    assert_eq!(
        report.service.as_deref(),
        Some("subetha-workload"),
        "the executable's name"
    );
    workload.stop();
}
