//! `subetha-agent`: the command line.
//!
//! `run` combines its flags with the config file (see
//! [`subetha_agent::config`]), logs in text or JSON
//! ([`subetha_agent::logging`]) and, under systemd (`NOTIFY_SOCKET` set),
//! reports readiness, status, watchdog pings and shutdown through
//! `sd_notify`. The unlisted `generate` command writes the man pages and
//! shell completions `cargo xtask dist` ships.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use subetha_agent::config::{FileConfig, RunArgs, RunSettings, ScanArgs};
use subetha_agent::export::JsonlExporter;
use subetha_agent::logging::{self, LogFormat};
use subetha_agent::{Agent, AgentConfig, AgentSnapshot, client, doctor, http};

#[derive(Parser)]
#[command(
    name = "subetha-agent",
    version,
    about = "Drain subetha rings of every instrumented process and serve their statistics",
    after_long_help = "\
Settings of `run` come from /etc/subetha/agent.toml (or --config PATH) when it exists: every \
flag has a key of the same name in snake case, and flags given on the command line override \
the file. `subetha-agent config check` prints the effective settings.

Run as root, the agent listens for applications announcing their segments on \
/run/subetha/agent.sock.

SUBETHA_LOG sets the log filter (default `info`). Under systemd (Type=notify, NOTIFY_SOCKET \
set) readiness, status and shutdown are reported through sd_notify; WATCHDOG_USEC turns on \
watchdog pings, sent while the scan thread makes progress."
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: discover, drain, serve HTTP until SIGINT/SIGTERM.
    Run(RunArgs),
    /// Attach, drain for a while, print one snapshot, exit.
    Snapshot(SnapshotArgs),
    /// Ask a running agent for its state.
    Status(StatusArgs),
    /// Drop storms of a running agent, newest first (with `--json` too; the
    /// JSON API's `/api/v1/storms` and a snapshot's `storms` list them
    /// oldest first, for polling with `?since=`).
    Storms(StatusArgs),
    /// Live terminal view of a running agent.
    Top(subetha_agent::top::TopArgs),
    /// Storm timeline pictures (SVG/PNG) or an HTML report of recent storms.
    Report(subetha_agent::report::ReportArgs),
    /// Attach, drain for a while, write the contention profile (pprof,
    /// collapsed stacks or a flame graph).
    Profile(subetha_agent::profile::ProfileArgs),
    /// What this host and user allow, and what will be skipped.
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The config file of `run`.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print shell completions.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `subetha-agent generate man|completions --out-dir DIR`: packaging's
/// command (`cargo xtask dist`), kept out of [`Cli`] so that neither the
/// man pages nor the completions offer it.
#[derive(Parser)]
#[command(
    name = "subetha-agent-generate",
    bin_name = "subetha-agent generate",
    about = "Write man pages or shell completions into a directory"
)]
struct GenerateCli {
    #[command(subcommand)]
    what: GenerateCommand,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate the config file together with `run` flags and print the
    /// settings `run` would use, each with where it came from.
    Check(RunArgs),
}

#[derive(Subcommand)]
enum GenerateCommand {
    /// Man pages: subetha-agent.1 and one per subcommand.
    Man {
        /// Directory to write them into (created if missing).
        #[arg(long)]
        out_dir: PathBuf,
    },
    /// Completions for bash, zsh and fish.
    Completions {
        /// Directory to write them into (created if missing).
        #[arg(long)]
        out_dir: PathBuf,
    },
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
    #[command(flatten)]
    agent: client::AgentArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> std::process::ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|arg| arg == "generate") {
        args.remove(1);
        return exit_code(generate(GenerateCli::parse_from(args).what));
    }
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    exit_code(start(cli, &matches))
}

/// Success, a quiet success when stdout's reader went away (`storms |
/// head`: the reader has what it wanted), or the error on stderr and
/// failure. Never panics on a closed stdout or stderr.
fn exit_code(result: Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) if is_broken_pipe(&error) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "subetha-agent: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Whether `error` comes from writing to a pipe whose reader has closed it.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        let kind = cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| {
                cause
                    .downcast_ref::<serde_json::Error>()
                    .and_then(serde_json::Error::io_error_kind)
            });
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// Resolves `run`'s settings (they choose the log format), starts logging,
/// runs the command.
fn start(cli: Cli, matches: &ArgMatches) -> Result<()> {
    let (_, sub_matches) = matches.subcommand().expect("a subcommand is required");
    let log_format_given = [matches, sub_matches]
        .iter()
        .any(|m| matches!(m.value_source("log_format"), Some(ValueSource::CommandLine)));
    let settings = |args: &RunArgs, run_matches: &ArgMatches| {
        let file = FileConfig::load(args.config.as_deref())?;
        RunSettings::resolve(args, run_matches, file, (cli.log_format, log_format_given))
    };
    match cli.command {
        Command::Run(args) => {
            let settings = settings(&args, sub_matches)?;
            logging::init(settings.log_format);
            run(settings)
        }
        Command::Config(ConfigCommand::Check(args)) => {
            let (_, check_matches) = sub_matches.subcommand().expect("config has a subcommand");
            let settings = settings(&args, check_matches)?;
            let mut out = std::io::stdout().lock();
            out.write_all(settings.to_toml().as_bytes())?;
            out.flush()?;
            Ok(())
        }
        command => {
            logging::init(cli.log_format);
            dispatch(command)
        }
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Run(_) | Command::Config(_) => unreachable!("handled in start()"),
        Command::Snapshot(args) => snapshot(args),
        Command::Status(args) => status(args, false),
        Command::Storms(args) => status(args, true),
        Command::Top(args) => subetha_agent::top::run(args),
        Command::Report(args) => subetha_agent::report::run(args),
        Command::Profile(args) => subetha_agent::profile::run(args),
        Command::Doctor { json } => {
            let checks = doctor::run();
            let mut out = std::io::stdout().lock();
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&checks)?)?;
            } else {
                doctor::print(&mut out, &checks)?;
            }
            out.flush()?;
            Ok(())
        }
        Command::Completions { shell } => {
            // Generated into memory first: clap_complete panics on a write
            // error, and a closed stdout must not be a panic.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "subetha-agent", &mut script);
            let mut out = std::io::stdout().lock();
            out.write_all(&script)?;
            out.flush()?;
            Ok(())
        }
    }
}

fn generate(what: GenerateCommand) -> Result<()> {
    match what {
        GenerateCommand::Man { out_dir } => generate_man(&out_dir),
        GenerateCommand::Completions { out_dir } => generate_completions(&out_dir),
    }
}

/// `subetha-agent.1` plus `subetha-agent-<sub>[-<subsub>].1` for every
/// visible subcommand.
fn generate_man(out_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    clap_mangen::generate_to(Cli::command(), out_dir)
        .with_context(|| format!("writing man pages into {}", out_dir.display()))?;
    writeln!(std::io::stdout(), "man pages written to {}", out_dir.display())?;
    Ok(())
}

/// `subetha-agent.bash`, `_subetha-agent` (zsh), `subetha-agent.fish`.
fn generate_completions(out_dir: &Path) -> Result<()> {
    use clap_complete::Shell;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut Cli::command(), "subetha-agent", out_dir)
            .with_context(|| format!("writing {shell} completions into {}", out_dir.display()))?;
        writeln!(
            std::io::stdout(),
            "{shell} completions written to {}",
            path.display()
        )?;
    }
    Ok(())
}

/// Talks to systemd when it started us with `Type=notify` (`NOTIFY_SOCKET`
/// set); does nothing otherwise. A failure to notify is logged once and
/// further notifications are dropped (systemd then times the start out,
/// which is the right outcome for a broken notify socket).
struct ServiceManager {
    enabled: bool,
    /// Half the watchdog period systemd asked for, if it asked.
    watchdog_every: Option<Duration>,
    last_ping: Instant,
    /// The scan thread's last published snapshot time at the last ping: a
    /// ping is sent only when it has moved, so a hung scan thread gets the
    /// agent restarted.
    last_scan_progress: u64,
    last_status: String,
    next_status: Instant,
}

impl ServiceManager {
    fn from_env() -> Self {
        let enabled = std::env::var_os("NOTIFY_SOCKET").is_some();
        Self {
            enabled,
            watchdog_every: enabled
                .then(sd_notify::watchdog_enabled)
                .flatten()
                .map(|period| period / 2),
            last_ping: Instant::now(),
            last_scan_progress: 0,
            last_status: String::new(),
            next_status: Instant::now(),
        }
    }

    fn notify(&mut self, states: &[sd_notify::NotifyState]) {
        if !self.enabled {
            return;
        }
        if let Err(error) = sd_notify::notify(states) {
            tracing::warn!(%error, "cannot notify the service manager (NOTIFY_SOCKET); giving up on it");
            self.enabled = false;
        }
    }

    fn ready(&mut self) {
        self.notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status("started; discovering instrumented processes"),
        ]);
    }

    /// Called every tick: a status line every few seconds when it changed,
    /// a watchdog ping when due and the scan thread has made progress.
    fn tick(&mut self, snapshot: &AgentSnapshot) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if now >= self.next_status {
            self.next_status = now + Duration::from_secs(5);
            let count = |state: &str| snapshot.processes.iter().filter(|p| p.state == state).count();
            let draining = count("attached");
            let status = format!(
                "draining {draining} process{}, {} waiting for a lease; {} storms recorded",
                if draining == 1 { "" } else { "es" },
                count("waiting"),
                snapshot.storms.len(),
            );
            if status != self.last_status {
                self.notify(&[sd_notify::NotifyState::Status(&status)]);
                self.last_status = status;
            }
        }
        if let Some(every) = self.watchdog_every
            && now.duration_since(self.last_ping) >= every
        {
            let progress = snapshot.agent.taken_mono_ns;
            if progress != self.last_scan_progress {
                self.last_scan_progress = progress;
                self.last_ping = now;
                self.notify(&[sd_notify::NotifyState::Watchdog]);
            } else if let Some(permit) = logging::throttle("scan thread not publishing", ()) {
                tracing::warn!("scan thread has published nothing since the last watchdog ping{permit}");
            }
        }
    }

    fn stopping(&mut self) {
        self.notify(&[
            sd_notify::NotifyState::Stopping,
            sd_notify::NotifyState::Status("shutting down: handing leases back"),
        ]);
    }
}

fn run(settings: RunSettings) -> Result<()> {
    let mut service = ServiceManager::from_env();
    if let Some(path) = &settings.config_file {
        tracing::info!(path = %path.display(), "config file read");
    }
    let config = settings.agent_config();
    let mut exporter = match settings.export_jsonl.as_deref() {
        None => None,
        Some(target) => Some(JsonlExporter::open(target, settings.export_interval)?),
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
    // Read the token and bind before starting the scan thread so a bad
    // token file or a busy port fails fast.
    let auth = match &settings.auth_token_file {
        None => None,
        Some(path) => {
            use subetha_agent::auth::BearerToken;
            if let Some(warning) = BearerToken::permission_warning(path) {
                tracing::warn!("{warning}");
            }
            Some(BearerToken::read(path)?)
        }
    };
    let listener = runtime
        .block_on(http::bind(&settings.listen))
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    tracing::info!(
        addr = %settings.listen,
        auth = if auth.is_some() { "bearer token" } else { "none" },
        "serving /metrics and /api/v1"
    );
    if let Some(warning) = settings.listen_warning() {
        tracing::warn!("{warning}");
    }
    let agent = Agent::new(config).spawn().context("starting the scan thread")?;
    let agent = Arc::new(agent);
    let source: Arc<dyn Fn() -> Arc<AgentSnapshot> + Send + Sync> = {
        let agent = Arc::clone(&agent);
        Arc::new(move || agent.snapshot())
    };
    let otlp = match settings.otlp_endpoint.as_deref() {
        None => None,
        Some(endpoint) => Some(
            subetha_agent::otlp::start(endpoint, settings.otlp_interval, Arc::clone(&source))
                .with_context(|| format!("starting the OTLP export to {endpoint}"))?,
        ),
    };
    runtime.block_on(async {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(http::serve_with(
            listener,
            Arc::clone(&source),
            http::ServeOptions {
                metrics: settings.metrics_options(),
                auth,
            },
            {
                let mut stop_rx = stop_rx.clone();
                async move {
                    let _ = stop_rx.changed().await;
                }
            },
        ));
        // The listener is bound (connections queue from now on) and the
        // scan thread runs: ready.
        service.ready();
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let signals = shutdown_signal(signals);
        tokio::pin!(signals);
        loop {
            tokio::select! {
                _ = &mut signals => break,
                _ = tick.tick() => {
                    let snapshot = source();
                    service.tick(&snapshot);
                    if let Some(error) = exporter.as_mut().and_then(|e| e.export(&snapshot).err()) {
                        tracing::error!(%error, "JSON-lines export failed; disabling it");
                        exporter = None;
                    }
                }
            }
        }
        service.stopping();
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
        ..args.scan.agent_config()?
    };
    let agent = Agent::new(config).spawn().context("starting the scan thread")?;
    std::thread::sleep(args.duration);
    let snapshot = agent.stop();
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &snapshot)?;
        writeln!(out)?;
    } else {
        print_summary(&mut out, &snapshot, View::Summary)?;
    }
    out.flush()?;
    Ok(())
}

fn status(args: StatusArgs, storms_only: bool) -> Result<()> {
    let agent = args.agent.client()?;
    let body = agent.get("/api/v1/snapshot").with_context(|| {
        format!(
            "no agent answering on {} (is `subetha-agent run` running?)",
            agent.addr()
        )
    })?;
    let snapshot: AgentSnapshot = serde_json::from_str(&body).context("agent sent an unreadable snapshot")?;
    let mut out = std::io::stdout().lock();
    if args.json {
        if storms_only {
            writeln!(out, "{}", serde_json::to_string_pretty(&newest_first(&snapshot))?)?;
        } else {
            writeln!(out, "{body}")?;
        }
    } else {
        print_summary(
            &mut out,
            &snapshot,
            if storms_only { View::Storms } else { View::Summary },
        )?;
    }
    out.flush()?;
    Ok(())
}

/// A snapshot's storms (kept oldest first), newest first.
fn newest_first(snapshot: &AgentSnapshot) -> Vec<&subetha_agent::model::StormReport> {
    snapshot.storms.iter().rev().collect()
}

/// Which text form [`print_summary`] prints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    /// `status`, `snapshot`: processes and instances, then the newest
    /// storms one line each.
    Summary,
    /// `storms`: every storm with its cause and all of its evidence.
    Storms,
}

/// Storms `status` lists (one line each) before pointing to `storms`.
const SUMMARY_STORMS: usize = 10;

/// A readable summary: processes, instances, storms (newest first).
fn print_summary(out: &mut impl Write, snapshot: &AgentSnapshot, view: View) -> std::io::Result<()> {
    if view == View::Summary {
        let a = &snapshot.agent;
        writeln!(
            out,
            "agent pid {} · {} scans · interval {} µs · scan p99 {} µs · gap p99 {} µs",
            a.pid,
            a.scans,
            a.scan_interval_us,
            a.scan_duration_ns.p99 / 1000,
            a.scan_gap_ns.p99 / 1000
        )?;
        for p in &snapshot.processes {
            writeln!(
                out,
                "\nprocess {} ({}) {} — drained {} dropped {} lost {}{}",
                p.pid,
                p.comm,
                p.state,
                p.drained,
                p.dropped,
                p.lost_no_ring,
                p.note.as_deref().map(|n| format!(" — {n}")).unwrap_or_default()
            )?;
            if let Some(identity) = identity_line(p) {
                writeln!(out, "  {identity}")?;
            }
            writeln!(
                out,
                "  {:<24} {:<10} {:>12} {:>10} {:>10} {:>10} {:>10}",
                "instance", "kind", "ops", "contended", "misses", "p50 ns", "p99 ns"
            )?;
            for i in &p.instances {
                writeln!(
                    out,
                    "  {:<24} {:<10} {:>12} {:>10} {:>10} {:>10} {:>10}{}",
                    truncate(&i.name, 24),
                    truncate(&i.kind, 10),
                    i.ops,
                    i.contended,
                    i.misses,
                    i.latency_ns.p50,
                    i.latency_ns.p99,
                    if i.retired { " (retired)" } else { "" }
                )?;
            }
        }
        for r in &snapshot.refused {
            writeln!(out, "\nrefused {} (pid {}): {}", r.path, r.pid, r.reason)?;
        }
    }
    writeln!(out, "\nstorms ({}):", snapshot.storms.len())?;
    let shown = match view {
        View::Summary => SUMMARY_STORMS,
        View::Storms => usize::MAX,
    };
    for s in newest_first(snapshot).into_iter().take(shown) {
        match view {
            View::Summary => writeln!(out, "  {}", storm_line(s))?,
            View::Storms => print_storm(out, s)?,
        }
    }
    if view == View::Summary {
        let older = snapshot.storms.len().saturating_sub(SUMMARY_STORMS);
        if older > 0 {
            writeln!(out, "  … and {older} older")?;
        }
        if !snapshot.storms.is_empty() {
            writeln!(out, "  (causes and evidence: subetha-agent storms)")?;
        }
    }
    Ok(())
}

/// A storm in one line: where, how much, and the cause's sentence.
fn storm_line(s: &subetha_agent::model::StormReport) -> String {
    format!(
        "#{} pid {} ({}{}) thread {}: {} dropped over {:.3} ms{} — {}",
        s.id,
        s.pid,
        s.comm,
        container_suffix(s),
        s.tid,
        s.dropped,
        s.duration_ns as f64 / 1e6,
        if s.end_mono_ns.is_none() { " (ongoing)" } else { "" },
        s.cause
            .as_ref()
            .map_or("cause not known yet", |cause| cause.summary.as_str()),
    )
}

/// `, container <short id>` for a storm in a container.
fn container_suffix(s: &subetha_agent::model::StormReport) -> String {
    s.container_id
        .as_deref()
        .map(|id| format!(", container {}", short_id(id)))
        .unwrap_or_default()
}

/// A storm with everything known about it.
fn print_storm(out: &mut impl Write, s: &subetha_agent::model::StormReport) -> std::io::Result<()> {
    writeln!(
        out,
        "  #{} pid {} ({}{}) thread {} [{}] slot {}: {} dropped over {:.3} ms{}; first instance {}; longest scan gap {:.3} ms",
        s.id,
        s.pid,
        s.comm,
        container_suffix(s),
        s.tid,
        s.thread_name,
        s.slot,
        s.dropped,
        s.duration_ns as f64 / 1e6,
        if s.end_mono_ns.is_none() { " (ongoing)" } else { "" },
        s.first_instance.as_deref().unwrap_or("?"),
        s.max_scan_gap_ns as f64 / 1e6,
    )?;
    if let Some(cause) = &s.cause {
        writeln!(
            out,
            "      cause ({} confidence): {}",
            cause.confidence, cause.summary
        )?;
        for line in &cause.evidence {
            writeln!(out, "        - {line}")?;
        }
    }
    Ok(())
}

/// `service … · container … · pod … · cgroup … · pid N in its namespace`,
/// the parts that are known; None for a plain host process without a
/// service name.
fn identity_line(p: &subetha_agent::model::ProcessReport) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(service) = &p.service {
        parts.push(format!("service {service}"));
    }
    if let Some(id) = &p.container_id {
        parts.push(format!("container {}", short_id(id)));
    }
    if let Some(uid) = &p.pod_uid {
        parts.push(format!("pod {uid}"));
    }
    if p.container_id.is_some() && !p.cgroup.is_empty() {
        parts.push(format!("cgroup {}", p.cgroup));
    }
    if p.nspid.len() > 1
        && let Some(own) = p.nspid.last()
    {
        parts.push(format!("pid {own} in its namespace"));
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// A container id as `docker ps` shows it (12 digits).
fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
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
