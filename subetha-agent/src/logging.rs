//! The agent's logs: a `tracing` subscriber writing text or JSON lines to
//! stderr, and a rate limiter for warnings that could otherwise repeat on
//! every scan.
//!
//! Text lines are coloured only when stderr is a terminal and `NO_COLOR` is
//! unset or empty (<https://no-color.org>): a file, a pipe or the journal
//! gets plain text ([`colour`]; tested by `tests/tests/agent_cli.rs`).
//!
//! # Rate-limited warnings
//!
//! Some warnings are about one process's segment and can recur as fast as
//! the agent scans (a workload that storms continuously, a sidecar that
//! never hands its lease over, a hostile process creating segment after
//! segment). [`throttle`] lets each `(kind, subject)` pair — `subject` is
//! usually the pid that owns the segment — through at most once per
//! [`WINDOW`]; the repeats in between are counted, and the next message that
//! gets through says how many were suppressed:
//!
//! ```text
//! WARN drop storm (37 similar suppressed in the last 61s) storm=4 pid=1234 …
//! ```
//!
//! Promises: the first warning of a kind for a subject is always logged at
//! once; nothing about a subject is logged more than once per window per
//! kind; suppressed repeats are never silently forgotten while their entry
//! lives (they are reported with the next message); the limiter's memory is
//! bounded ([`MAX_TRACKED`] entries — past that, entries whose window has
//! passed are dropped first, and their pending counts with them). The
//! limiter only decides whether to *log*: what the agent records (storms,
//! refusals) is unaffected.

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// How the log lines on stderr look (`--log-format`, `log_format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process-wide subscriber: level filter from `SUBETHA_LOG`
/// (default `info`), lines on stderr in `format`, coloured per [`colour`].
/// Call once, first thing.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SUBETHA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Whether log lines get ANSI colour: only on a terminal, and not when
/// `NO_COLOR` is set to anything but the empty string.
pub fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// At most one message per key per this long.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Keys the limiter remembers at most.
pub const MAX_TRACKED: usize = 4096;

/// Where the limiter reads the time; tests substitute their own.
pub trait Clock {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The real monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Permission to log one message, with what was held back before it.
/// Its `Display` is the suffix to append to the message: empty when nothing
/// was suppressed, else ` (N similar suppressed in the last Ss)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permit {
    /// Messages of this key suppressed since the last one logged.
    pub suppressed: u64,
    /// How long ago the last one was logged (zero for a first message).
    pub since_last: Duration,
}

impl fmt::Display for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.suppressed == 0 {
            return Ok(());
        }
        write!(
            f,
            " ({} similar suppressed in the last {}s)",
            self.suppressed,
            self.since_last.as_secs()
        )
    }
}

#[derive(Debug)]
struct Entry {
    last_logged: Instant,
    suppressed: u64,
}

/// Lets each key through once per window and counts the rest.
#[derive(Debug)]
pub struct RateLimiter<C: Clock = MonotonicClock> {
    window: Duration,
    clock: C,
    entries: HashMap<(&'static str, u64), Entry>,
}

impl RateLimiter<MonotonicClock> {
    /// A limiter on the real clock.
    pub fn new(window: Duration) -> Self {
        Self::with_clock(window, MonotonicClock)
    }
}

impl<C: Clock> RateLimiter<C> {
    /// A limiter reading the time from `clock`.
    pub fn with_clock(window: Duration, clock: C) -> Self {
        Self {
            window,
            clock,
            entries: HashMap::new(),
        }
    }

    /// `Some` when a message of `kind` about `subject` may be logged now
    /// (the first one, or the first after a whole window); `None` when it
    /// is to be suppressed (and is counted).
    pub fn check(&mut self, kind: &'static str, subject: impl Hash) -> Option<Permit> {
        let now = self.clock.now();
        let key = (kind, subject_hash(subject));
        if let Some(entry) = self.entries.get_mut(&key) {
            let since_last = now.saturating_duration_since(entry.last_logged);
            if since_last < self.window {
                entry.suppressed += 1;
                return None;
            }
            let permit = Permit {
                suppressed: entry.suppressed,
                since_last,
            };
            *entry = Entry {
                last_logged: now,
                suppressed: 0,
            };
            return Some(permit);
        }
        if self.entries.len() >= MAX_TRACKED {
            self.prune(now);
        }
        self.entries.insert(
            key,
            Entry {
                last_logged: now,
                suppressed: 0,
            },
        );
        Some(Permit {
            suppressed: 0,
            since_last: Duration::ZERO,
        })
    }

    /// Keys remembered now.
    pub fn tracked(&self) -> usize {
        self.entries.len()
    }

    /// Makes room: first drops keys whose window has passed (a new message
    /// for them would be logged anyway); if that is not enough, forgets all.
    fn prune(&mut self, now: Instant) {
        let window = self.window;
        self.entries
            .retain(|_, entry| now.saturating_duration_since(entry.last_logged) < window);
        if self.entries.len() >= MAX_TRACKED {
            self.entries.clear();
        }
    }
}

fn subject_hash(subject: impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    subject.hash(&mut hasher);
    hasher.finish()
}

static WARNINGS: LazyLock<Mutex<RateLimiter>> = LazyLock::new(|| Mutex::new(RateLimiter::new(WINDOW)));

/// The process-wide limiter for warnings: `Some(permit)` to log now (append
/// the permit to the message), `None` to stay quiet. `kind` names the
/// message (use the message text); `subject` is what it is about, usually
/// the pid owning the segment.
///
/// ```
/// # let pid = 1234u32;
/// if let Some(permit) = subetha_agent::logging::throttle("takeover not granted", pid) {
///     tracing::warn!(pid, "takeover not granted{permit}");
/// }
/// ```
pub fn throttle(kind: &'static str, subject: impl Hash) -> Option<Permit> {
    WARNINGS.lock().check(kind, subject)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A clock the test moves by hand.
    #[derive(Clone)]
    struct ManualClock {
        start: Instant,
        offset: Rc<Cell<Duration>>,
    }

    impl ManualClock {
        fn new() -> Self {
            Self {
                start: Instant::now(),
                offset: Rc::new(Cell::new(Duration::ZERO)),
            }
        }

        fn advance(&self, by: Duration) {
            self.offset.set(self.offset.get() + by);
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> Instant {
            self.start + self.offset.get()
        }
    }

    fn limiter() -> (RateLimiter<ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        (RateLimiter::with_clock(WINDOW, clock.clone()), clock)
    }

    #[test]
    fn first_message_passes_and_repeats_within_the_window_are_counted() {
        let (mut limiter, clock) = limiter();
        let first = limiter
            .check("drop storm", 42u32)
            .expect("the first one is logged");
        assert_eq!(first.suppressed, 0);
        assert_eq!(first.to_string(), "", "nothing suppressed: no suffix");
        for _ in 0..37 {
            clock.advance(Duration::from_secs(1));
            assert_eq!(limiter.check("drop storm", 42u32), None, "within the window");
        }
        clock.advance(Duration::from_secs(24)); // 61 s after the first
        let next = limiter.check("drop storm", 42u32).expect("a window later");
        assert_eq!(next.suppressed, 37);
        assert_eq!(next.since_last, Duration::from_secs(61));
        assert_eq!(next.to_string(), " (37 similar suppressed in the last 61s)");
        // The count starts over.
        assert_eq!(limiter.check("drop storm", 42u32), None);
        clock.advance(WINDOW);
        assert_eq!(limiter.check("drop storm", 42u32).map(|p| p.suppressed), Some(1));
    }

    #[test]
    fn the_window_boundary_is_exact() {
        let (mut limiter, clock) = limiter();
        assert!(limiter.check("k", 1u32).is_some());
        clock.advance(WINDOW - Duration::from_nanos(1));
        assert!(limiter.check("k", 1u32).is_none(), "one ns short of the window");
        clock.advance(Duration::from_nanos(1));
        assert!(limiter.check("k", 1u32).is_some(), "exactly one window later");
    }

    #[test]
    fn subjects_and_kinds_are_limited_separately() {
        let (mut limiter, _clock) = limiter();
        assert!(limiter.check("drop storm", 1u32).is_some());
        assert!(limiter.check("drop storm", 2u32).is_some(), "another segment");
        assert!(
            limiter.check("takeover not granted", 1u32).is_some(),
            "another kind"
        );
        assert!(limiter.check("drop storm", 1u32).is_none());
        assert!(limiter.check("drop storm", 2u32).is_none());
        assert_eq!(limiter.tracked(), 3);
    }

    #[test]
    fn memory_is_bounded_when_every_key_is_live() {
        let (mut limiter, _clock) = limiter();
        for pid in 0..MAX_TRACKED as u32 {
            assert!(limiter.check("drop storm", pid).is_some());
        }
        assert_eq!(limiter.tracked(), MAX_TRACKED);
        // All still within their window: a new key forgets them rather than
        // growing the table.
        assert!(limiter.check("takeover not granted", 0u32).is_some());
        assert_eq!(limiter.tracked(), 1);
    }

    #[test]
    fn pruning_drops_expired_keys_first() {
        let (mut limiter, clock) = limiter();
        for pid in 0..(MAX_TRACKED - 1) as u32 {
            assert!(limiter.check("old", pid).is_some());
        }
        clock.advance(WINDOW);
        assert!(limiter.check("recent", 1u32).is_some());
        assert_eq!(limiter.tracked(), MAX_TRACKED);
        assert!(limiter.check("new", 2u32).is_some());
        assert_eq!(limiter.tracked(), 2, "only the expired keys were dropped");
        assert!(
            limiter.check("recent", 1u32).is_none(),
            "a key within its window survives the prune"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None), "a file, pipe or journal: plain");
        assert!(!colour(false, Some(OsStr::new("1"))));
    }

    #[test]
    fn the_global_limiter_limits() {
        // A subject no other test uses.
        let subject = ("logging test", std::process::id());
        assert!(throttle("global test", subject).is_some());
        assert!(throttle("global test", subject).is_none());
    }
}
