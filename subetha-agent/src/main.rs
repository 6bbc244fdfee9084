//! `subetha-agent`: the command line.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use subetha_agent::export::JsonlExporter;
use subetha_agent::{Agent, AgentConfig, AgentSnapshot, ProbeMode, client, doctor, http};

#[derive(Parser)]
#[command(
    name = "subetha-agent",
    version,
    about = "Drain subetha rings of every instrumented process and serve their statistics"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: discover, drain, serve HTTP until SIGINT/SIGTERM.
    Run(RunArgs),
    /// Attach, drain for a while, print one snapshot, exit.
    Snapshot(SnapshotArgs),
    /// Ask a running agent for its state.
    Status(StatusArgs),
    /// Drop storms of a running agent, newest first.
    Storms(StatusArgs),
    /// Live terminal view of a running agent.
    Top(subetha_agent::top::TopArgs),
    /// Storm timeline pictures (SVG/PNG) or an HTML report of recent storms.
    Report(subetha_agent::report::ReportArgs),
    /// What this host and user allow, and what will be skipped.
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print shell completions.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(clap::Args)]
struct ScanArgs {
    /// Only these processes (repeatable).
    #[arg(long = "pid")]
    pids: Vec<u32>,
    /// Pause between /proc scans for new processes.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    discovery_interval: Duration,
    /// Longest pause between scans (the interval adapts below it).
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    max_scan_interval: Duration,
    /// Shortest pause between scans.
    #[arg(long, default_value = "100us", value_parser = humantime::parse_duration)]
    min_scan_interval: Duration,
    /// How long exited processes' final stats are kept.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    retention: Duration,
    /// Pin the scan thread to this CPU.
    #[arg(long)]
    scanner_cpu: Option<usize>,
    /// eBPF probes: auto (load when privileges and kernel allow), on (fail
    /// without them), off.
    #[arg(long, value_enum, default_value_t = Probes::Auto)]
    probes: Probes,
}

#[derive(Clone, Copy, ValueEnum)]
enum Probes {
    Auto,
    On,
    Off,
}

impl ScanArgs {
    fn config(&self) -> Result<AgentConfig> {
        for (flag, value) in [
            ("--min-scan-interval", self.min_scan_interval),
            ("--max-scan-interval", self.max_scan_interval),
            ("--discovery-interval", self.discovery_interval),
        ] {
            if value.is_zero() {
                bail!("{flag} must be greater than zero");
            }
        }
        if self.min_scan_interval > self.max_scan_interval {
            bail!("--min-scan-interval must not exceed --max-scan-interval");
        }
        Ok(AgentConfig {
            pids: (!self.pids.is_empty()).then(|| self.pids.clone()),
            discovery_interval: self.discovery_interval,
            min_scan_interval: self.min_scan_interval,
            max_scan_interval: self.max_scan_interval,
            retention: self.retention,
            scanner_cpu: self.scanner_cpu,
            probes: match self.probes {
                Probes::Auto => ProbeMode::Auto,
                Probes::On => ProbeMode::On,
                Probes::Off => ProbeMode::Off,
            },
            ..AgentConfig::default()
        })
    }
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    scan: ScanArgs,
    /// Address for /metrics and the JSON API. Loopback by default; binding
    /// another interface must be asked for explicitly.
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: SocketAddr,
    /// Write storms and periodic snapshots as JSON lines to PATH (or - for
    /// stdout).
    #[arg(long, value_name = "PATH|-")]
    export_jsonl: Option<String>,
    /// Snapshot period in the JSON-lines export.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    export_interval: Duration,
    /// Registration socket applications announce new segments on
    /// (default: /run/subetha/agent.sock for root, else
    /// $XDG_RUNTIME_DIR/subetha/agent.sock).
    #[arg(long, value_name = "PATH", conflicts_with = "no_socket")]
    socket: Option<std::path::PathBuf>,
    /// Do not listen for registrations; discover through /proc only.
    #[arg(long)]
    no_socket: bool,
    /// Also push metrics to this OTLP/HTTP collector endpoint
    /// (e.g. http://127.0.0.1:4318/v1/metrics).
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Period of the OTLP export.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    otlp_interval: Duration,
}

#[derive(clap::Args)]
struct SnapshotArgs {
    #[command(flatten)]
    scan: ScanArgs,
    /// How long to drain before printing.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Print JSON (default: a readable summary).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct StatusArgs {
    /// Address of the running agent.
    #[arg(long, default_value = "127.0.0.1:9464")]
    addr: SocketAddr,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match dispatch(cli.command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("subetha-agent: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SUBETHA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Run(args) => run(args),
        Command::Snapshot(args) => snapshot(args),
        Command::Status(args) => status(args, false),
        Command::Storms(args) => status(args, true),
        Command::Top(args) => subetha_agent::top::run(args),
        Command::Report(args) => subetha_agent::report::run(args),
        Command::Doctor { json } => {
            let checks = doctor::run();
            if json {
                println!("{}", serde_json::to_string_pretty(&checks)?);
            } else {
                doctor::print(&checks);
            }
            Ok(())
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "subetha-agent",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    }
}

fn run(args: RunArgs) -> Result<()> {
    let config = AgentConfig {
        registration_socket: (!args.no_socket).then(|| {
            args.socket
                .clone()
                .unwrap_or_else(subetha_core::announce::user_socket_path)
        }),
        ..args.scan.config()?
    };
    let mut exporter = match args.export_jsonl.as_deref() {
        None => None,
        Some(target) => Some(JsonlExporter::open(target, args.export_interval)?),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Install the signal handlers before anything else runs, so a SIGTERM
    // right after start-up is a clean shutdown, not a kill.
    let signals = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        Ok::<_, std::io::Error>((signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?))
    })?;
    // Bind before starting the scan thread so a busy port fails fast.
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(args.listen))
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(addr = %args.listen, "serving /metrics and /api/v1");
    let agent = Agent::new(config).spawn().context("starting the scan thread")?;
    let agent = Arc::new(agent);
    let source: Arc<dyn Fn() -> Arc<AgentSnapshot> + Send + Sync> = {
        let agent = Arc::clone(&agent);
        Arc::new(move || agent.snapshot())
    };
    let otlp = match args.otlp_endpoint.as_deref() {
        None => None,
        Some(endpoint) => Some(
            subetha_agent::otlp::start(endpoint, args.otlp_interval, Arc::clone(&source))
                .with_context(|| format!("starting the OTLP export to {endpoint}"))?,
        ),
    };
    runtime.block_on(async {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(http::serve(listener, Arc::clone(&source), {
            let mut stop_rx = stop_rx.clone();
            async move {
                let _ = stop_rx.changed().await;
            }
        }));
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let signals = shutdown_signal(signals);
        tokio::pin!(signals);
        loop {
            tokio::select! {
                _ = &mut signals => break,
                _ = tick.tick() => {
                    if let Some(error) = exporter.as_mut().and_then(|e| e.export(&source()).err()) {
                        tracing::error!(%error, "JSON-lines export failed; disabling it");
                        exporter = None;
                    }
                }
            }
        }
        tracing::info!("shutting down: handing leases back");
        let _ = stop_tx.send(true);
        let _ = server.await;
    });
    drop(otlp);
    drop(source);
    let agent = Arc::try_unwrap(agent).map_err(|_| anyhow::anyhow!("agent still referenced at shutdown"))?;
    let last = agent.stop();
    if let Some(mut exporter) = exporter {
        exporter.export_final(&last)?;
        exporter.finish()?;
    }
    Ok(())
}

async fn shutdown_signal(
    (mut term, mut interrupt): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
) {
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = term.recv() => {}
    }
}

fn snapshot(args: SnapshotArgs) -> Result<()> {
    let config = AgentConfig {
        publish_interval: Duration::from_secs(3600),
        ..args.scan.config()?
    };
    let agent = Agent::new(config).spawn().context("starting the scan thread")?;
    std::thread::sleep(args.duration);
    let snapshot = agent.stop();
    if args.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &snapshot)?;
        writeln!(out)?;
    } else {
        print_summary(&snapshot, false);
    }
    Ok(())
}

fn status(args: StatusArgs, storms_only: bool) -> Result<()> {
    let body = client::get(args.addr, "/api/v1/snapshot").with_context(|| {
        format!(
            "no agent answering on {} (is `subetha-agent run` running?)",
            args.addr
        )
    })?;
    let snapshot: AgentSnapshot = serde_json::from_str(&body).context("agent sent an unreadable snapshot")?;
    if args.json {
        if storms_only {
            println!("{}", serde_json::to_string_pretty(&snapshot.storms)?);
        } else {
            println!("{body}");
        }
    } else {
        print_summary(&snapshot, storms_only);
    }
    Ok(())
}

/// A readable summary: processes, instances, storms (newest first).
fn print_summary(snapshot: &AgentSnapshot, storms_only: bool) {
    if !storms_only {
        let a = &snapshot.agent;
        println!(
            "agent pid {} · {} scans · interval {} µs · scan p99 {} µs · gap p99 {} µs",
            a.pid,
            a.scans,
            a.scan_interval_us,
            a.scan_duration_ns.p99 / 1000,
            a.scan_gap_ns.p99 / 1000
        );
        for p in &snapshot.processes {
            println!(
                "\nprocess {} ({}) {} — drained {} dropped {} lost {}{}",
                p.pid,
                p.comm,
                p.state,
                p.drained,
                p.dropped,
                p.lost_no_ring,
                p.note.as_deref().map(|n| format!(" — {n}")).unwrap_or_default()
            );
            println!(
                "  {:<24} {:<10} {:>12} {:>10} {:>10} {:>10} {:>10}",
                "instance", "kind", "ops", "contended", "misses", "p50 ns", "p99 ns"
            );
            for i in &p.instances {
                println!(
                    "  {:<24} {:<10} {:>12} {:>10} {:>10} {:>10} {:>10}{}",
                    truncate(&i.name, 24),
                    truncate(&i.kind, 10),
                    i.ops,
                    i.contended,
                    i.misses,
                    i.latency_ns.p50,
                    i.latency_ns.p99,
                    if i.retired { " (retired)" } else { "" }
                );
            }
        }
        for r in &snapshot.refused {
            println!("\nrefused {} (pid {}): {}", r.path, r.pid, r.reason);
        }
    }
    println!("\nstorms ({}):", snapshot.storms.len());
    for s in snapshot.storms.iter().rev() {
        let duration = s.duration_ns as f64 / 1e6;
        println!(
            "  #{} pid {} ({}) thread {} [{}] slot {}: {} dropped over {:.3} ms{}; first instance {}; longest scan gap {:.3} ms",
            s.id,
            s.pid,
            s.comm,
            s.tid,
            s.thread_name,
            s.slot,
            s.dropped,
            duration,
            if s.end_mono_ns.is_none() { " (ongoing)" } else { "" },
            s.first_instance.as_deref().unwrap_or("?"),
            s.max_scan_gap_ns as f64 / 1e6,
        );
        if let Some(cause) = &s.cause {
            println!("      cause ({} confidence): {}", cause.confidence, cause.summary);
            for line in &cause.evidence {
                println!("        - {line}");
            }
        }
    }
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(width - 1).collect();
        cut.push('…');
        cut
    }
}
