//! Drives the `subetha-child` helper binary: an instrumented process that
//! registers, observes and spawns threads on command, one command per line
//! on its stdin, one reply per line on its stdout.
//!
//! | command                                      | reply                                 |
//! |----------------------------------------------|---------------------------------------|
//! | `info`                                       | `ok <pid> <memfd fd> <base> <slots> <sidecar 0/1>` |
//! | `register <name>`                            | `ok <id>`                             |
//! | `drop <name>`                                | `ok`                                  |
//! | `spawn <thread>`                             | `ok <os tid> <thread_id>`             |
//! | `observe <thread> <name> <n> <op> <flags> <latency>` | `ok <queued> <dropped> <lost>` |
//! | `join <thread>`                              | `ok`                                  |
//! | `quit`                                       | `ok`, then exit 0                     |
//!
//! `<thread>` `main` is the helper's main thread. Failures reply `err ...`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// A running helper process. Killed on drop if still running.
pub struct Helper {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// Counts from one `observe` command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Calls that returned `Ok(true)`.
    pub queued: u64,
    /// Calls that returned `Ok(false)` (ring full).
    pub dropped: u64,
    /// Calls that returned `Err` (no ring).
    pub lost: u64,
}

/// What `info` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    /// The helper's pid.
    pub pid: u32,
    /// Its segment's memfd descriptor number.
    pub memfd: i32,
    /// Its segment's base address.
    pub base: usize,
    /// Ring slots in its segment.
    pub ring_slots: u32,
    /// Whether it runs an in-process sidecar.
    pub sidecar: bool,
}

impl Helper {
    /// Starts the helper at `exe` (pass `env!("CARGO_BIN_EXE_subetha-child")`)
    /// with `env` added to a cleaned environment.
    pub fn spawn(exe: &str, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(exe);
        command
            .env_remove("SUBETHA_SIDECAR")
            .env_remove("SUBETHA_RING_SLOTS")
            .env_remove("SUBETHA_INSTANCES")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap_or_else(|e| panic!("spawn {exe}: {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Self { child, stdin, stdout }
    }

    /// The helper's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command and returns the words of its `ok` reply. Panics on
    /// `err` or if the helper died.
    pub fn cmd(&mut self, line: &str) -> Vec<String> {
        writeln!(self.stdin, "{line}").unwrap_or_else(|e| panic!("send {line:?}: {e}"));
        self.stdin.flush().expect("flush");
        let mut reply = String::new();
        let n = self.stdout.read_line(&mut reply).expect("read reply");
        assert!(
            n > 0,
            "helper exited before answering {line:?}: {:?}",
            self.child.try_wait()
        );
        let mut words = reply.split_ascii_whitespace().map(str::to_owned);
        match words.next().as_deref() {
            Some("ok") => words.collect(),
            _ => panic!("helper answered {line:?} with {reply:?}"),
        }
    }

    /// `info`.
    pub fn info(&mut self) -> Info {
        let w = self.cmd("info");
        Info {
            pid: w[0].parse().unwrap(),
            memfd: w[1].parse().unwrap(),
            base: w[2].parse().unwrap(),
            ring_slots: w[3].parse().unwrap(),
            sidecar: w[4] == "1",
        }
    }

    /// `register`: returns the instance id.
    pub fn register(&mut self, name: &str) -> u32 {
        self.cmd(&format!("register {name}"))[0].parse().unwrap()
    }

    /// `spawn`: returns `(os tid, thread_id)`.
    pub fn spawn_thread(&mut self, thread: &str) -> (u32, u32) {
        let w = self.cmd(&format!("spawn {thread}"));
        (w[0].parse().unwrap(), w[1].parse().unwrap())
    }

    /// `observe`.
    pub fn observe(
        &mut self,
        thread: &str,
        name: &str,
        n: u64,
        op: u16,
        flags: u16,
        latency: u64,
    ) -> Observed {
        let w = self.cmd(&format!("observe {thread} {name} {n} {op} {flags} {latency}"));
        Observed {
            queued: w[0].parse().unwrap(),
            dropped: w[1].parse().unwrap(),
            lost: w[2].parse().unwrap(),
        }
    }

    /// Asks the helper to exit and waits for it; panics unless it exits 0.
    pub fn quit(mut self) {
        self.cmd("quit");
        let status = self.child.wait().expect("wait for helper");
        assert!(status.success(), "helper exited with {status}");
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
