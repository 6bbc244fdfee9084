//! Where `top` gets its snapshots: a running agent over HTTP, or an agent
//! attached in-process. The UI sees only [`Update`]s arriving on a channel
//! from a [`Fetcher`] thread, so a slow or dead agent never freezes the
//! screen or the keyboard.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::{AgentConfig, AgentHandle, AgentSnapshot, client};

/// Something that can produce the agent's current snapshot.
pub trait SnapshotSource: Send {
    /// The latest snapshot, or why there is none right now.
    fn fetch(&mut self) -> Result<AgentSnapshot>;
    /// A short description for the screen (`127.0.0.1:9464`, `attached`).
    fn describe(&self) -> String;
    /// How long quitting may wait for this source to wind down (an attached
    /// agent hands its leases back; a hung HTTP request is abandoned).
    fn stop_grace(&self) -> Duration;
}

/// A running agent's `/api/v1/snapshot`.
pub struct HttpSource {
    agent: client::AgentClient,
}

impl HttpSource {
    /// Polls `agent`.
    pub fn new(agent: client::AgentClient) -> Self {
        Self { agent }
    }
}

impl SnapshotSource for HttpSource {
    fn fetch(&mut self) -> Result<AgentSnapshot> {
        let body = self
            .agent
            .get("/api/v1/snapshot")
            .with_context(|| format!("no agent answering on {}", self.agent.addr()))?;
        serde_json::from_str(&body).context("the agent sent an unreadable snapshot")
    }

    fn describe(&self) -> String {
        self.agent.addr().to_string()
    }

    fn stop_grace(&self) -> Duration {
        Duration::from_millis(500)
    }
}

/// An agent running inside this process (`top --attach`).
pub struct AttachedSource {
    agent: AgentHandle,
}

impl AttachedSource {
    /// Starts the scan thread with `config`.
    pub fn start(config: AgentConfig) -> Result<Self> {
        let agent = crate::Agent::new(config)
            .spawn()
            .context("starting the in-process agent's scan thread")?;
        Ok(Self { agent })
    }
}

impl SnapshotSource for AttachedSource {
    fn fetch(&mut self) -> Result<AgentSnapshot> {
        Ok(AgentSnapshot::clone(&self.agent.snapshot()))
    }

    fn describe(&self) -> String {
        "attached (in-process agent)".into()
    }

    fn stop_grace(&self) -> Duration {
        // Dropping the handle drains once more and hands every lease back.
        Duration::from_secs(30)
    }
}

/// One fetch's outcome, stamped with when it arrived.
#[derive(Debug)]
pub struct Update {
    /// The snapshot, or the error's text.
    pub result: std::result::Result<AgentSnapshot, String>,
    /// When the fetch finished.
    pub at: Instant,
}

/// A thread fetching from a [`SnapshotSource`] every interval.
pub struct Fetcher {
    updates: Receiver<Update>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    grace: Duration,
}

impl Fetcher {
    /// Starts fetching from `source` now and then every `interval`.
    pub fn start(mut source: Box<dyn SnapshotSource>, interval: Duration) -> Result<Self> {
        let (update_tx, updates) = mpsc::channel();
        let (stop, stop_rx) = mpsc::channel::<()>();
        let grace = source.stop_grace();
        let thread = std::thread::Builder::new()
            .name("top-fetch".into())
            .spawn(move || {
                loop {
                    let result = source.fetch().map_err(|e| format!("{e:#}"));
                    let update = Update {
                        result,
                        at: Instant::now(),
                    };
                    if update_tx.send(update).is_err() {
                        break;
                    }
                    match stop_rx.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                drop(source);
            })
            .context("starting the fetch thread")?;
        Ok(Self {
            updates,
            stop: Some(stop),
            thread: Some(thread),
            grace,
        })
    }

    /// Updates that arrived since the last call; `Err` when the fetch thread
    /// is gone (it panicked).
    pub fn poll(&self) -> Result<Vec<Update>> {
        let mut out = Vec::new();
        loop {
            match self.updates.try_recv() {
                Ok(update) => out.push(update),
                Err(mpsc::TryRecvError::Empty) => return Ok(out),
                Err(mpsc::TryRecvError::Disconnected) => {
                    anyhow::bail!("the snapshot fetch thread died")
                }
            }
        }
    }

    /// Asks the thread to stop and waits for it up to the source's grace.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        drop(self.stop.take());
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + self.grace;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if thread.is_finished() {
            let _ = thread.join();
        }
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counting {
        fetched: u64,
        fail_every_other: bool,
    }

    impl SnapshotSource for Counting {
        fn fetch(&mut self) -> Result<AgentSnapshot> {
            self.fetched += 1;
            if self.fail_every_other && self.fetched.is_multiple_of(2) {
                anyhow::bail!("refused {}", self.fetched);
            }
            let mut snapshot = AgentSnapshot::default();
            snapshot.agent.scans = self.fetched;
            Ok(snapshot)
        }

        fn describe(&self) -> String {
            "counting".into()
        }

        fn stop_grace(&self) -> Duration {
            Duration::from_secs(10)
        }
    }

    #[test]
    fn fetcher_delivers_snapshots_and_errors_in_order_then_stops() {
        let source = Counting {
            fetched: 0,
            fail_every_other: true,
        };
        let fetcher = Fetcher::start(Box::new(source), Duration::from_millis(1)).unwrap();
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.len() < 4 {
            assert!(Instant::now() < deadline, "only {seen:?} within 60 s");
            seen.extend(fetcher.poll().unwrap());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(seen[0].result.as_ref().unwrap().agent.scans, 1);
        assert_eq!(seen[1].result.as_ref().unwrap_err(), "refused 2");
        assert_eq!(seen[2].result.as_ref().unwrap().agent.scans, 3);
        assert!(seen[1].at <= seen[2].at);
        let started = Instant::now();
        fetcher.stop();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "stop waits for the thread only"
        );
    }

    #[test]
    fn http_source_names_the_address_it_cannot_reach() {
        // A port bound and immediately released: nobody listens there.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let error = HttpSource::new(client::AgentClient::new(addr, None))
            .fetch()
            .unwrap_err();
        assert!(format!("{error:#}").contains(&addr.to_string()), "{error:#}");
    }
}
