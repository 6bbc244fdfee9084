//! A second agent on the same host, as an operator meets it: the first
//! agent drains a workload; the second, which also sees the first agent's
//! descriptor of the workload's segment, says once, plainly and not as an
//! ERROR, that another agent (by pid) is draining the workload and that
//! it waits and takes over when that agent exits; its snapshot shows the
//! process waiting with that note. When the first agent stops, the second
//! takes the lease.

use std::time::Duration;

use subetha_tests::agent::{AgentProcess, ScratchDir, SegmentProbe, Workload, agent_exe, process};

const WORKLOAD: &str = env!("CARGO_BIN_EXE_subetha-workload");

#[test]
fn a_second_agent_says_who_drains_and_takes_over_when_it_exits() {
    let scratch = ScratchDir::new("two-agents");
    let mut workload = Workload::spawn(WORKLOAD, &["run", "--threads", "1", "--rate", "2000"], &[]);
    let pid = workload.pid();
    let pid_arg = pid.to_string();
    let probe = SegmentProbe::open(pid);
    probe.wait_lease(pid, "the sidecar drains first");
    assert!(workload.cmd("go").is_empty());

    let common = ["--no-socket", "--probes", "off", "--discovery-interval", "100ms"];
    let mut first_args = vec!["--pid", pid_arg.as_str()];
    first_args.extend_from_slice(&common);
    let mut first = AgentProcess::start(agent_exe(), &first_args, scratch.join("agent-1.log"));
    probe.wait_lease(first.pid(), "agent 1 takes over");

    // The second agent looks at the workload and at the first agent, as an
    // agent draining every process would.
    let first_pid = first.pid().to_string();
    let mut second_args = vec!["--pid", pid_arg.as_str(), "--pid", first_pid.as_str()];
    second_args.extend_from_slice(&common);
    let mut second = AgentProcess::start(agent_exe(), &second_args, scratch.join("agent-2.log"));
    let note = second.wait_snapshot("agent 2 to report the process waiting for agent 1", |s| {
        process(s, pid)
            .filter(|p| p.state == "waiting")
            .and_then(|p| p.note.clone())
            .filter(|note| note.contains(&format!("another agent (pid {})", first.pid())))
    });
    assert!(note.contains("exits"), "{note}");
    // Several discovery rounds and lease retries later, still one message
    // and no error.
    std::thread::sleep(Duration::from_secs(3));
    let log = second.log();
    let said: Vec<&str> = log.lines().filter(|l| l.contains("another agent (pid")).collect();
    assert_eq!(said.len(), 1, "said once:\n{log}");
    assert!(
        said[0].contains(" INFO ") || said[0].contains(" WARN "),
        "{}",
        said[0]
    );
    assert!(
        said[0].contains(&format!("pid {pid}")),
        "names the drained process: {}",
        said[0]
    );
    assert!(!log.contains("ERROR"), "no error:\n{log}");
    assert!(!log.contains("refusing subetha segment"), "{log}");
    assert!(!log.contains("did not hand the lease over"), "{log}");
    assert_eq!(probe.lease_pid(), first.pid(), "agent 1 keeps draining");

    first.signal(libc::SIGINT);
    let status = first.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "agent 1: {status}\n{}", first.log());
    probe.wait_lease(second.pid(), "agent 2 takes over once agent 1 is gone");
    second.wait_snapshot("agent 2 to report the process attached", |s| {
        process(s, pid).filter(|p| p.state == "attached").map(|_| ())
    });
    assert!(!second.log().contains("ERROR"), "{}", second.log());
    workload.stop();
    second.signal(libc::SIGINT);
    assert!(second.wait_exit(Duration::from_secs(10)).success());
}
