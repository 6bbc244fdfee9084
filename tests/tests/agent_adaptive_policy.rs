//! The agent runs the adaptive-mutex policy for the processes it drains.
//!
//! A child process (this test binary re-executed in the `contender` role,
//! with `SUBETHA_SIDECAR=off`, so nothing in it drains or decides) hammers
//! one `AdaptiveMutex` from two threads with short holds. An in-process
//! agent limited to the child's pid is its only consumer:
//!
//! 1. with `adaptive_policy: false` it drains plenty of contended
//!    acquisitions (far more than a decision needs) and the policy word
//!    stays 0 — the control: nothing else writes the word;
//! 2. with the policy on, a second agent takes the lease and writes a spin
//!    budget (with the policy's tag) into the word, which the agent's
//!    report shows and the child reads back from its own segment and
//!    applies to the lock.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use subetha_agent::AgentSnapshot;
use subetha_agent::model::InstanceReport;
use subetha_core::primitives::policy_word;
use subetha_core::{AdaptiveMutex, PolicyWord};
use subetha_tests::agent::{in_process_agent, process, wait_agent};
use subetha_tests::{ROLE_ENV, TIMEOUT, role};

const TEST: &str = "agent_runs_the_adaptive_policy_only_when_enabled";
const ROLE: &str = "contender";
const LOCK_NAME: &str = "agent-adaptive-lock";
/// Contended acquisitions the agent must have drained before the control
/// phase concludes that it did not decide: ~100 times what a decision needs
/// (16 contended in a window with 8 sampled holds).
const CONTROL_CONTENDED: u64 = 2_000;

#[test]
fn agent_runs_the_adaptive_policy_only_when_enabled() {
    if role().as_deref() == Some(ROLE) {
        contender();
        return;
    }
    let mut child = Contender::spawn();
    let pid = child.pid();
    assert_eq!(child.initial_word, 0, "no consumer has written the word yet");

    // 1. Policy off: the agent drains, the word stays as it was.
    let agent = in_process_agent(&[pid], |config| config.adaptive_policy = false);
    let drained = wait_agent(&agent, "the agent to drain contended acquisitions", |s| {
        lock_report(s, pid, child.id).filter(|r| r.contended >= CONTROL_CONTENDED)
    });
    // A few policy intervals more, in case a decision were merely late.
    std::thread::sleep(Duration::from_millis(200));
    let last = agent.stop();
    let report = lock_report(&last, pid, child.id).expect("the lock is reported");
    assert_eq!(
        report.policy, 0,
        "with the policy off the agent left the word alone (drained {} contended)",
        drained.contended
    );

    // 2. Policy on: the agent decides a spin budget.
    let agent = in_process_agent(&[pid], |config| assert!(config.adaptive_policy, "on by default"));
    let word = wait_agent(&agent, "the agent's policy to set a spin budget", |s| {
        let word = PolicyWord(lock_report(s, pid, child.id)?.policy);
        (word.tag() != 0 && word.spin_ns().is_some()).then_some(word)
    });
    let budget = word.spin_ns().expect("checked above");
    assert!(budget <= PolicyWord::MAX_SPIN_NS, "{word:?}");
    // The child sees the same word in its segment and its lock applies it.
    let (segment_word, applied_word) = child.stop();
    drop(agent);
    assert_eq!(
        PolicyWord(segment_word).spin_ns(),
        Some(budget),
        "{segment_word:#x}"
    );
    assert_eq!(
        PolicyWord(applied_word).spin_ns(),
        Some(budget),
        "{applied_word:#x}"
    );
}

/// The report on the contended lock of `pid`, once it has contended locks.
fn lock_report(snapshot: &AgentSnapshot, pid: u32, id: u32) -> Option<InstanceReport> {
    let report = process(snapshot, pid)?
        .instances
        .iter()
        .find(|i| i.id == id && !i.retired)?
        .clone();
    (report.contended > 0).then_some(report)
}

/// The child process and its lock's instance id.
struct Contender {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The child's stdout, line by line (read on a thread, so a silent
    /// child cannot hang the test).
    lines: Receiver<String>,
    id: u32,
    initial_word: u32,
}

impl Contender {
    fn spawn() -> Self {
        let mut child = Command::new(std::env::current_exe().expect("current_exe"))
            .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, ROLE)
            .env("SUBETHA_SIDECAR", "off")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the contender");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let fields = read_tagged(&lines, "ready");
        Self {
            child,
            stdin,
            lines,
            id: fields[0],
            initial_word: fields[1],
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the contender; returns the policy word as its segment holds it
    /// and as its lock applied it.
    fn stop(&mut self) -> (u32, u32) {
        drop(self.stdin.take()); // EOF: stop
        let fields = read_tagged(&self.lines, "word");
        let status = self.child.wait().expect("wait for the contender");
        let rest: Vec<String> = self.lines.try_iter().collect();
        assert!(
            status.success(),
            "contender failed ({status}):\n{}",
            rest.join("\n")
        );
        (fields[0], fields[1])
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        // Normally reaped by `stop`; after a failure, never leave it
        // spinning.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits (at most [`TIMEOUT`]) for a line with `<tag> <u32> <u32>` in it
/// (the test harness prints its own text too, on the same line: `test
/// NAME ... ready 1 0`) and returns the two numbers.
fn read_tagged(lines: &Receiver<String>, tag: &str) -> Vec<u32> {
    let deadline = Instant::now() + TIMEOUT;
    let mut seen = String::new();
    loop {
        let line = match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                panic!("no `{tag}` from the contender in {TIMEOUT:?}; it printed:\n{seen}")
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("the contender exited before `{tag}`; it printed:\n{seen}")
            }
        };
        seen.push_str(&line);
        seen.push('\n');
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(at) = words.iter().position(|w| *w == tag)
            && let Some([a, b]) = words.get(at + 1..at + 3).map(|w| [w[0], w[1]])
            && let (Ok(a), Ok(b)) = (a.parse(), b.parse())
        {
            return vec![a, b];
        }
    }
}

/// The child: two threads contend for one adaptive mutex (short holds,
/// short pauses) until stdin closes; prints `ready <id> <word>` first and
/// `word <segment word> <applied word>` last.
fn contender() {
    let lock = Arc::new(AdaptiveMutex::named(LOCK_NAME, 0u64));
    let id = lock.instance_id().expect("registered");
    println!("ready {id} {}", policy_word(id).expect("live"));
    std::io::stdout().flush().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (lock, stop) = (Arc::clone(&lock), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    {
                        // Holds of 1,000 dependent adds through memory
                        // (about 1 µs here): a spin budget, not the plain
                        // mutex's wait the policy picks under 128 ns.
                        let mut guard = lock.lock();
                        for _ in 0..1_000 {
                            *guard = std::hint::black_box(*guard + 1);
                        }
                    }
                    for _ in 0..200 {
                        std::hint::black_box(0u32);
                    }
                }
            })
        })
        .collect();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().expect("contender thread");
    }
    let segment_word = policy_word(id).expect("live");
    let applied = lock.refresh_policy().0;
    println!("word {segment_word} {applied}");
    std::io::stdout().flush().unwrap();
}
