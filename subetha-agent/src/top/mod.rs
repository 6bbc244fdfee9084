//! `subetha-agent top`: a live terminal view of a running agent.
//!
//! It polls a running agent's `/api/v1/snapshot` (`--addr`) every
//! `--interval`, or runs an agent in-process (`--attach`), and shows
//! processes, instances (sortable by ops/s, contention %, p99 wait, drops),
//! drill-downs into one process (rings) or one instance (op kinds), and the
//! drop storms with their causes and evidence. Rates are per second between
//! two successive snapshots.
//!
//! Promises: the terminal (raw mode, alternate screen, cursor) is restored
//! on quit, on error, on panic and on SIGINT/SIGTERM/SIGHUP; a terminal that
//! goes away (hang-up, end of input) ends `top` within a frame, restoring
//! what still can be; a UI that does not wind down within [`STUCK_GRACE`]
//! of a termination signal is ended by the signal thread; an agent that
//! stops answering is reported on screen and retried, never a crash; stdout
//! that is not a terminal is refused with a clear error.
//!
//! * [`source`] — where snapshots come from (HTTP or in-process), on a
//!   thread of its own.
//! * [`rates`] — per-second rates from two snapshots.
//! * [`state`] — the UI state and the keys.
//! * [`render`] — drawing it; [`columns`] — fitting tables to the width.
//! * [`input`] — waiting for keys, noticing a terminal that went away.
//! * [`terminal`] — taking the terminal and giving it back.

pub mod columns;
pub mod input;
pub mod rates;
pub mod render;
pub mod source;
pub mod state;
pub mod terminal;

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crossterm::event::{self, Event, KeyEventKind};

use self::input::{Input, TtyInput};
use self::source::{AttachedSource, Fetcher, HttpSource, SnapshotSource};
use self::state::{App, Flow};
use self::terminal::{Signals, TerminalGuard};
use crate::{AgentConfig, ProbeMode};

/// Set to `1` to make `top` panic right after its first frame: lets the
/// tests prove the panic path restores the terminal.
pub const TEST_PANIC_ENV: &str = "SUBETHA_TOP_TEST_PANIC";

/// Arguments of `subetha-agent top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub agent: crate::client::AgentArgs,
    /// Refresh period (rates are computed over it).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Run an agent in this process instead of asking a running one (needs
    /// the privileges `run` needs; no other agent may be draining).
    #[arg(long, conflicts_with_all = ["addr", "auth_token_file"])]
    pub attach: bool,
    /// With --attach: only these processes (repeatable).
    #[arg(long = "pid", requires = "attach")]
    pub pids: Vec<u32>,
    /// With --attach: eBPF probes (auto, on, off).
    #[arg(long, value_enum, default_value_t = TopProbes::Auto, requires = "attach")]
    pub probes: TopProbes,
    /// With --attach: where the in-process agent's log goes while the
    /// screen is in use (default: a file in the temporary directory, named
    /// on exit when anything was logged).
    #[arg(long, value_name = "PATH", requires = "attach")]
    pub log_file: Option<std::path::PathBuf>,
}

/// `--probes` of `top --attach`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TopProbes {
    /// Load them when privileges and kernel allow.
    Auto,
    /// Load them or fail.
    On,
    /// Never.
    Off,
}

/// Shortest `--interval`.
const MIN_INTERVAL: Duration = Duration::from_millis(50);
/// How often the screen is redrawn and keys/signals are checked.
const FRAME: Duration = Duration::from_millis(100);
/// How long after a termination signal the UI may take to return before
/// the signal thread restores the terminal and exits the process.
pub const STUCK_GRACE: Duration = Duration::from_secs(3);

/// Runs the terminal view until the user quits (or a signal arrives).
pub fn run(args: TopArgs) -> Result<()> {
    if args.interval < MIN_INTERVAL {
        bail!("--interval must be at least {MIN_INTERVAL:?}");
    }
    // Refuse before starting anything when there is no terminal.
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        bail!("`top` needs a terminal, and stdout is not one (for text output use `subetha-agent status`)");
    }
    let signals = Signals::catch()?;
    signals.exit_if_stuck(STUCK_GRACE)?;
    let mut log_file = None;
    let source: Box<dyn SnapshotSource> = if args.attach {
        let path = args
            .log_file
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("subetha-top-{}.log", std::process::id())));
        terminal::redirect_stderr(&path)?;
        log_file = Some((path, args.log_file.is_some()));
        let config = AgentConfig {
            pids: (!args.pids.is_empty()).then(|| args.pids.clone()),
            probes: match args.probes {
                TopProbes::Auto => ProbeMode::Auto,
                TopProbes::On => ProbeMode::On,
                TopProbes::Off => ProbeMode::Off,
            },
            ..AgentConfig::default()
        };
        match AttachedSource::start(config) {
            Ok(source) => Box::new(source),
            Err(error) => {
                terminal::restore();
                return Err(error);
            }
        }
    } else {
        Box::new(HttpSource::new(args.agent.client()?))
    };
    let description = source.describe();
    let result = Fetcher::start(source, args.interval).and_then(|fetcher| {
        let result = ui(App::new(description, args.interval), &fetcher, &signals);
        // The screen is given back first; an attached agent then hands its
        // leases back while the user already has their shell.
        terminal::restore();
        fetcher.stop();
        result
    });
    terminal::restore();
    if let Some((path, explicit)) = log_file {
        let logged = std::fs::metadata(&path).map(|m| m.len() > 0).unwrap_or(false);
        if logged || explicit {
            // Not eprintln!: stderr may be a terminal that hung up.
            let _ = writeln!(
                std::io::stderr(),
                "subetha-agent top: the attached agent's log is in {}",
                path.display()
            );
        } else {
            let _ = std::fs::remove_file(&path);
        }
    }
    result
}

fn ui(mut app: App, fetcher: &Fetcher, signals: &Signals) -> Result<()> {
    let result = ui_loop(&mut app, fetcher, signals);
    signals.ui_returned();
    result
}

fn ui_loop(app: &mut App, fetcher: &Fetcher, signals: &Signals) -> Result<()> {
    let input = TtyInput::open().context("opening the terminal for reading keys")?;
    let mut screen = TerminalGuard::enter()?;
    let test_panic = std::env::var(TEST_PANIC_ENV).is_ok_and(|v| v == "1");
    loop {
        if signals.caught() {
            return Ok(());
        }
        for update in fetcher.poll()? {
            app.apply(update);
        }
        screen
            .terminal()
            .draw(|frame| render::draw(frame, app, Instant::now()))
            .context("drawing the screen")?;
        if test_panic {
            panic!("{TEST_PANIC_ENV}=1: panicking on purpose after the first frame");
        }
        match input.wait(FRAME).context("waiting for the keyboard")? {
            Input::Idle => {}
            // Nobody will type again, and nobody sees the screen.
            Input::Gone => return Ok(()),
            Input::Ready => {
                // Bytes are waiting, so crossterm's read cannot spin; take
                // every event they hold.
                while event::poll(Duration::ZERO).context("reading the keyboard")? {
                    match event::read().context("reading the keyboard")? {
                        Event::Key(key)
                            if key.kind != KeyEventKind::Release && app.handle_key(key) == Flow::Quit =>
                        {
                            return Ok(());
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
