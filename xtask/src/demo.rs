//! `cargo xtask demo`: the agent and an instrumented workload, with a drop
//! storm found and the books balanced.
//!
//! Builds the release binaries, starts `subetha-agent run` on a free
//! loopback port, starts `subetha-demo --burst`, shows the agent's live view
//! while the workload runs, then the storms it found, and checks that every
//! observation the workload attempted is accounted for (drained + dropped +
//! lost). Children are killed on any error; the agent is stopped with
//! SIGINT so it hands the leases back.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, workspace_root};

/// Options of `cargo xtask demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// How long the workload runs.
    #[arg(long, default_value = "6")]
    pub(crate) seconds: u64,
}

/// Kills the child when dropped (unless it already exited).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn run(args: &DemoArgs) -> Result<()> {
    // The eBPF toolchain is optional for the demo: without it (e.g. no
    // network for bpf-linker) the agent is built without probes.
    match crate::setup::run() {
        Ok(()) => cargo(&["build", "--release", "-p", "subetha-agent", "--bins"], &[])?,
        Err(error) => {
            eprintln!("demo: eBPF toolchain unavailable ({error:#}); building the agent without probes");
            cargo(
                &[
                    "build",
                    "--release",
                    "-p",
                    "subetha-agent",
                    "--bins",
                    "--no-default-features",
                ],
                &[],
            )?;
        }
    }
    let bin = workspace_root().join("target/release");
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    // As root on a multi-CPU host, also stage a preemption: a SCHED_FIFO
    // busy loop on the scanner's CPU, so one storm's cause is the kernel
    // scheduling something else instead of the scanner.
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let stage_hog = root && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    let log_path = workspace_root().join("target/subetha-demo-agent.log");
    let log = std::fs::File::create(&log_path).context("creating the agent log")?;
    eprintln!(
        "demo: starting subetha-agent on {addr} (log: {})",
        log_path.display()
    );
    let agent = Guard(
        Command::new(bin.join("subetha-agent"))
            .args(["run", "--listen", &addr, "--discovery-interval", "200ms"])
            .args(stage_hog.then_some(["--scanner-cpu", "1"]).into_iter().flatten())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting subetha-agent")?,
    );
    wait_for_agent(&bin, &addr)?;
    eprintln!("demo: starting subetha-demo --burst for {} s", args.seconds);
    let demo = Guard(
        Command::new(bin.join("subetha-demo"))
            .args([
                "--burst",
                "--threads",
                "4",
                "--duration",
                &format!("{}s", args.seconds),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .context("starting subetha-demo")?,
    );
    let demo_pid = demo.0.id();
    let started = Instant::now();
    let hog = stage_hog.then(|| {
        std::thread::Builder::new().name("demo-hog".into()).spawn(|| {
            std::thread::sleep(Duration::from_millis(2500));
            hog_cpu(1, Duration::from_millis(150))
        })
    });
    if stage_hog {
        eprintln!("demo: at +2.5 s a SCHED_FIFO thread `demo-hog` will hold the scanner's CPU 1 for 150 ms");
    }
    let mut demo = demo;
    loop {
        std::thread::sleep(Duration::from_secs(2));
        if demo.0.try_wait()?.is_some() {
            break;
        }
        println!(
            "\n===== live view after {:.0} s =====",
            started.elapsed().as_secs_f64()
        );
        let _ = Command::new(bin.join("subetha-agent"))
            .args(["status", "--addr", &addr])
            .status();
    }
    let output = std::mem::replace(&mut demo.0, Command::new("true").spawn()?).wait_with_output()?;
    if !output.status.success() {
        bail!("subetha-demo failed: {}", output.status);
    }
    let truth = String::from_utf8_lossy(&output.stdout);
    let truth = truth.lines().last().unwrap_or_default().to_string();
    println!("\n===== workload ground truth =====\n{truth}");
    // Let the agent notice the exit and drain the leftovers.
    std::thread::sleep(Duration::from_millis(800));
    println!("\n===== storms found by the agent =====");
    let _ = Command::new(bin.join("subetha-agent"))
        .args(["storms", "--addr", &addr])
        .status();
    let json = Command::new(bin.join("subetha-agent"))
        .args(["status", "--json", "--addr", &addr])
        .output()?;
    if let Some(Ok(hog)) = hog
        && let Ok(Err(error)) = hog.join()
    {
        eprintln!("demo: the staged preemption did not run: {error:#}");
    }
    check_conservation(&String::from_utf8_lossy(&json.stdout), &truth, demo_pid)?;
    stop_agent(agent)?;
    Ok(())
}

/// Busy-loops for `window` as a SCHED_FIFO thread pinned to `cpu`.
fn hog_cpu(cpu: usize, window: Duration) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set, CPU_SET stays in bounds
    // (cpu < CPU_SETSIZE), and both calls affect only the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("pinning the hog: {}", std::io::Error::last_os_error());
        }
        let param = libc::sched_param { sched_priority: 50 };
        if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) != 0 {
            bail!("SCHED_FIFO for the hog: {}", std::io::Error::last_os_error());
        }
    }
    let start = Instant::now();
    while start.elapsed() < window {
        std::hint::spin_loop();
    }
    Ok(())
}

fn wait_for_agent(bin: &std::path::Path, addr: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let ok = Command::new(bin.join("subetha-agent"))
            .args(["status", "--json", "--addr", addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?
            .success();
        if ok {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the agent did not come up on {addr}")
}

/// Compares the agent's books for the demo process with its ground truth.
fn check_conservation(status_json: &str, truth_json: &str, pid: u32) -> Result<()> {
    let status: serde_json::Value = serde_json::from_str(status_json).context("agent status JSON")?;
    let truth: serde_json::Value = serde_json::from_str(truth_json).context("demo ground truth JSON")?;
    let attempted = truth["observations_attempted"]
        .as_u64()
        .context("observations_attempted")?;
    let process = status["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"].as_u64() == Some(u64::from(pid))))
        .context("the agent never saw the demo process")?;
    let drained = process["drained"].as_u64().unwrap_or(0);
    let dropped = process["dropped"].as_u64().unwrap_or(0);
    let lost = process["lost_no_ring"].as_u64().unwrap_or(0);
    let storms = status["storms"].as_array().map_or(0, |s| {
        s.iter()
            .filter(|s| s["pid"].as_u64() == Some(u64::from(pid)))
            .count()
    });
    println!(
        "\n===== books =====\nattempted {attempted} = drained {drained} + dropped {dropped} + lost {lost} ({})\nstorms: {storms}",
        if drained + dropped + lost == attempted {
            "balanced"
        } else {
            "NOT balanced"
        }
    );
    if drained + dropped + lost != attempted {
        bail!(
            "observations unaccounted for: {}",
            attempted as i128 - (drained + dropped + lost) as i128
        );
    }
    if storms == 0 {
        bail!("the burst produced no drop storm");
    }
    Ok(())
}

fn stop_agent(mut agent: Guard) -> Result<()> {
    // SAFETY: sending SIGINT to our own child process.
    unsafe {
        libc::kill(agent.0.id() as libc::pid_t, libc::SIGINT);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(status) = agent.0.try_wait()? {
            if !status.success() {
                bail!("subetha-agent exited with {status}");
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("subetha-agent did not stop within 10 s of SIGINT")
}
