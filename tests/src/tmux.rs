//! Driving a full-screen terminal program in a detached tmux session: start
//! it at a fixed size, read what the screen shows (`capture-pane`), type
//! keys (`send-keys`), and ask tmux about the pane (whether it is in the
//! alternate screen, its shell's pid).
//!
//! Every [`Tmux`] runs its own tmux server on a unique socket (`tmux -L`),
//! so tests never see each other's or a user's sessions, and kills that
//! server when dropped (also while a failed test unwinds).
//!
//! tmux is a required tool under `SUBETHA_REQUIRE_TOOLS=1` (CI); elsewhere
//! a missing tmux makes [`Tmux::available`] say so loudly and the test
//! skips.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::{TIMEOUT, wait_for};

/// A tmux server with one session running one program.
pub struct Tmux {
    socket: String,
}

/// Distinguishes the servers of one test process.
static NEXT: AtomicU32 = AtomicU32::new(0);

impl Tmux {
    /// Whether tmux can be used. Without it: panics when
    /// `SUBETHA_REQUIRE_TOOLS` is set, else prints why `test` is skipped.
    pub fn available(test: &str) -> bool {
        let found = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            assert!(
                std::env::var_os("SUBETHA_REQUIRE_TOOLS").is_none(),
                "{test}: tmux is required (SUBETHA_REQUIRE_TOOLS is set) but not installed"
            );
            eprintln!(
                "\n*** SKIPPING {test}: tmux is not installed (apt-get install tmux); \
                 set SUBETHA_REQUIRE_TOOLS=1 to make this a failure ***\n"
            );
        }
        found
    }

    /// Starts `argv` in a new detached session of `width`×`height` cells
    /// on a fresh server.
    pub fn start(name: &str, width: u16, height: u16, argv: &[&str]) -> Self {
        let socket = format!(
            "subetha-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let tmux = Self { socket };
        let (width, height) = (width.to_string(), height.to_string());
        let mut args = vec!["new-session", "-d", "-s", "main", "-x", &width, "-y", &height];
        args.extend_from_slice(argv);
        tmux.run(&args);
        // Keep the pane at the requested size whatever clients attach.
        tmux.run(&["set-option", "-g", "window-size", "manual"]);
        tmux
    }

    fn command(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .env_remove("TMUX")
            .output()
            .expect("run tmux")
    }

    fn run(&self, args: &[&str]) -> String {
        let output = self.command(args);
        assert!(
            output.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// What the pane shows now, one line per row (trailing blanks trimmed).
    pub fn capture(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "main"])
    }

    /// Types `keys` (tmux key names: `q`, `Enter`, `Escape`, `C-c`, `BTab`).
    /// Each is sent on its own, with a short pause, so that an escape key
    /// is not read as the start of the next key's sequence.
    pub fn send_keys(&self, keys: &[&str]) {
        for key in keys {
            self.run(&["send-keys", "-t", "main", key]);
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Kills the session's window: its pane's terminal hangs up, as when an
    /// ssh connection drops or a terminal window is closed.
    pub fn kill_window(&self) {
        self.run(&["kill-window", "-t", "main"]);
    }

    /// A tmux format about the pane (e.g. `#{alternate_on}`).
    pub fn display(&self, format: &str) -> String {
        self.run(&["display-message", "-p", "-t", "main", format])
            .trim()
            .to_owned()
    }

    /// The pid of the pane's first process.
    pub fn pane_pid(&self) -> u32 {
        self.display("#{pane_pid}").parse().expect("pane_pid is a number")
    }

    /// Whether the pane is in the alternate screen.
    pub fn alternate_screen(&self) -> bool {
        self.display("#{alternate_on}") == "1"
    }

    /// Polls the screen until `check` accepts it; panics with the last
    /// screen and `context()` after [`TIMEOUT`].
    pub fn wait_screen<T>(
        &self,
        what: &str,
        mut check: impl FnMut(&str) -> Option<T>,
        context: impl Fn() -> String,
    ) -> T {
        let last = std::cell::RefCell::new(String::new());
        wait_for(
            TIMEOUT,
            what,
            || {
                std::thread::sleep(Duration::from_millis(50));
                let screen = self.capture();
                let found = check(&screen);
                *last.borrow_mut() = screen;
                found
            },
            || {
                format!(
                    "\n--- screen ---\n{}\n--- context ---\n{}",
                    last.borrow(),
                    context()
                )
            },
        )
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]);
    }
}
