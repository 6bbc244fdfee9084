//! Taking the terminal over and always giving it back.
//!
//! [`TerminalGuard::enter`] switches to raw mode and the alternate screen
//! and hides the cursor; [`restore`] undoes all of it (and puts stderr back
//! if [`redirect_stderr`] moved it). `restore` is idempotent and runs
//!
//! * when the guard is dropped (normal exit, `?` errors),
//! * from the panic hook (before the panic message is printed, so the
//!   message lands on the normal screen),
//! * after SIGINT/SIGTERM/SIGHUP/SIGQUIT: [`Signals`] only sets a flag
//!   (async-signal-safe); the UI loop sees it within one poll and returns,
//!   and the guard's drop restores.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use crossterm::{cursor, execute, terminal};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

/// Whether raw mode and the alternate screen are on.
static TERMINAL_TAKEN: AtomicBool = AtomicBool::new(false);
/// The real stderr while it is redirected.
static SAVED_STDERR: Mutex<Option<OwnedFd>> = Mutex::new(None);
/// The panic hook is installed once per process.
static HOOK_INSTALLED: AtomicBool = AtomicBool::new(false);

/// Undoes everything this module did to the terminal and stderr. Safe to
/// call any number of times, from any thread, and from the panic hook.
pub fn restore() {
    if TERMINAL_TAKEN.swap(false, Ordering::AcqRel) {
        // Errors are ignored: there is nothing better to do (a hung-up
        // terminal cannot be restored and need not be).
        let _ = terminal::disable_raw_mode();
        let _ = execute!(std::io::stdout(), terminal::LeaveAlternateScreen, cursor::Show);
    }
    let saved = SAVED_STDERR
        .lock()
        .map(|mut s| s.take())
        .unwrap_or_else(|p| p.into_inner().take());
    if let Some(saved) = saved {
        // SAFETY: dup2 onto fd 2 from a descriptor we own; no memory is
        // involved, and fd 2 stays open throughout (dup2 is atomic).
        unsafe { libc::dup2(saved.as_raw_fd(), libc::STDERR_FILENO) };
    }
}

fn install_panic_hook() {
    if HOOK_INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
}

/// The terminal, taken over; restored on drop.
pub struct TerminalGuard {
    terminal: Terminal<CrosstermBackend<std::io::Stdout>>,
}

impl TerminalGuard {
    /// Raw mode, alternate screen, hidden cursor. Refuses when stdout is
    /// not a terminal.
    pub fn enter() -> Result<Self> {
        if !std::io::stdout().is_terminal() {
            bail!(
                "`top` needs a terminal, and stdout is not one (for text output use `subetha-agent status`)"
            );
        }
        install_panic_hook();
        TERMINAL_TAKEN.store(true, Ordering::Release);
        let guard = || -> Result<Terminal<CrosstermBackend<std::io::Stdout>>> {
            terminal::enable_raw_mode().context("switching the terminal to raw mode")?;
            execute!(std::io::stdout(), terminal::EnterAlternateScreen, cursor::Hide)
                .context("switching to the alternate screen")?;
            let mut terminal =
                Terminal::new(CrosstermBackend::new(std::io::stdout())).context("setting up the terminal")?;
            terminal.clear()?;
            Ok(terminal)
        };
        match guard() {
            Ok(terminal) => Ok(Self { terminal }),
            Err(error) => {
                restore();
                Err(error)
            }
        }
    }

    /// The ratatui terminal.
    pub fn terminal(&mut self) -> &mut Terminal<CrosstermBackend<std::io::Stdout>> {
        &mut self.terminal
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Sends stderr (fd 2) to `path` until [`restore`], so an attached agent's
/// log lines do not scribble over the screen.
pub fn redirect_stderr(path: &Path) -> Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let _ = std::io::stderr().flush();
    // SAFETY: dup of fd 2, which is open for the life of the process; the
    // result is a fresh descriptor we take ownership of right away.
    let saved = unsafe { libc::dup(libc::STDERR_FILENO) };
    if saved < 0 {
        return Err(std::io::Error::last_os_error()).context("saving stderr");
    }
    // SAFETY: `saved` is a valid descriptor nobody else owns.
    let saved = unsafe { OwnedFd::from_raw_fd(saved) };
    // SAFETY: dup2 between two descriptors we hold open; fd 2 is replaced
    // atomically.
    if unsafe { libc::dup2(file.as_raw_fd(), libc::STDERR_FILENO) } < 0 {
        return Err(std::io::Error::last_os_error()).context("redirecting stderr");
    }
    *SAVED_STDERR.lock().unwrap_or_else(|p| p.into_inner()) = Some(saved);
    Ok(())
}

/// Termination signals, noted in a flag the UI loop polls.
pub struct Signals {
    caught: Arc<AtomicBool>,
    /// Set when the UI loop has returned (see [`Signals::exit_if_stuck`]).
    ui_returned: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

/// The signals [`Signals`] catches.
const TERMINATION: [libc::c_int; 4] = [
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGQUIT,
];

impl Signals {
    /// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT from now on.
    pub fn catch() -> Result<Self> {
        let caught = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        for signal in TERMINATION {
            ids.push(
                signal_hook::flag::register(signal, Arc::clone(&caught))
                    .with_context(|| format!("installing a handler for signal {signal}"))?,
            );
        }
        Ok(Self {
            caught,
            ui_returned: Arc::new(AtomicBool::new(false)),
            ids,
        })
    }

    /// Whether one arrived.
    pub fn caught(&self) -> bool {
        self.caught.load(Ordering::Acquire)
    }

    /// Notes that the UI loop returned: from now on a signal is handled by
    /// the normal way out, and [`exit_if_stuck`](Self::exit_if_stuck)
    /// stands down.
    pub fn ui_returned(&self) {
        self.ui_returned.store(true, Ordering::Release);
    }

    /// Starts a thread that waits for a termination signal and, if the UI
    /// loop has not returned `grace` later (it is stuck somewhere it cannot
    /// see the flag), restores the terminal and exits with status 1. A
    /// last resort: the UI loop normally sees the flag within a frame.
    pub fn exit_if_stuck(&self, grace: std::time::Duration) -> Result<()> {
        let mut waiting =
            signal_hook::iterator::Signals::new(TERMINATION).context("watching for termination signals")?;
        let returned = Arc::clone(&self.ui_returned);
        std::thread::Builder::new()
            .name("top-signals".into())
            .spawn(move || {
                if waiting.forever().next().is_none() {
                    return;
                }
                std::thread::sleep(grace);
                if !returned.load(Ordering::Acquire) {
                    restore();
                    let _ = writeln!(
                        std::io::stderr(),
                        "subetha-agent top: the screen did not stop within {grace:?} of a signal; exiting"
                    );
                    std::process::exit(1);
                }
            })
            .context("starting the signal thread")?;
        Ok(())
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_sets_the_flag() {
        let signals = Signals::catch().unwrap();
        assert!(!signals.caught());
        signal_hook::low_level::raise(signal_hook::consts::SIGHUP).unwrap();
        assert!(signals.caught(), "the handler runs before raise returns");
    }

    #[test]
    fn restore_without_taking_the_terminal_is_harmless() {
        restore();
        restore();
        assert!(!TERMINAL_TAKEN.load(Ordering::Acquire));
    }
}
