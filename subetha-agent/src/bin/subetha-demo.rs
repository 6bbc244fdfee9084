//! `subetha-demo`: an instrumented workload for trying the agent.
//!
//! Worker threads share two mutex-protected maps and a bounded job channel,
//! each registered as a subetha instance; every operation is observed (with
//! its wait time when it had to wait). `--burst` makes one thread emit a
//! long uninterrupted run of observations every `--burst-every`, more than a
//! ring holds, so the consumer sees a drop storm. `--churn` keeps spawning
//! short-lived observing threads.
//!
//! At exit it prints one JSON line of ground truth: every `observe` call it
//! made (`observations_attempted`) and what each returned (queued, dropped
//! because the ring was full, or lost for want of a ring).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use subetha_core::{Instance, InstanceKind, Observation, clock};

#[derive(Parser)]
#[command(about = "An instrumented workload for the subetha agent")]
struct Args {
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Operations per second per worker (0: as fast as possible).
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// How long to run.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Overrun a ring periodically with a burst of observations.
    #[arg(long)]
    burst: bool,
    /// Observations per burst.
    #[arg(long, default_value_t = 40_000)]
    burst_size: u64,
    /// Pause between bursts.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    burst_every: Duration,
    /// Keep spawning short-lived observing threads (this many at a time).
    #[arg(long, default_value_t = 0)]
    churn: usize,
    /// Print the in-process sidecar's view at exit (when it drained).
    #[arg(long)]
    report: bool,
}

const MUTEX: InstanceKind = InstanceKind {
    code: 1,
    name: "mutex",
    ops: &["lock", "try_lock", "unlock"],
};
const CHANNEL: InstanceKind = InstanceKind {
    code: 5,
    name: "channel",
    ops: &["send", "recv", "try_send", "try_recv"],
};
const LOCK: u16 = 1;
const TRY_LOCK: u16 = 2;
const RECV: u16 = 2;
const TRY_SEND: u16 = 3;
const TRY_RECV: u16 = 4;

/// Ground truth: what every `observe` call returned.
#[derive(Default)]
struct Truth {
    attempted: AtomicU64,
    queued: AtomicU64,
    dropped: AtomicU64,
    lost: AtomicU64,
}

impl Truth {
    fn observe(&self, instance: &Instance, op: u16, flags: u16, latency: u64) {
        self.attempted.fetch_add(1, Ordering::Relaxed);
        let counter = match instance.observe(op, flags, latency) {
            Ok(true) => &self.queued,
            Ok(false) => &self.dropped,
            Err(_) => &self.lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

struct Shared {
    orders: Mutex<HashMap<u64, u64>>,
    orders_lock: Instance,
    cache: Mutex<Vec<u64>>,
    cache_lock: Instance,
    jobs_tx: SyncSender<u64>,
    jobs_rx: Mutex<Receiver<u64>>,
    jobs: Instance,
    truth: Truth,
    stop: AtomicBool,
}

impl Shared {
    fn lock_observed<'a, T>(&self, mutex: &'a Mutex<T>, instance: &Instance) -> std::sync::MutexGuard<'a, T> {
        if let Ok(guard) = mutex.try_lock() {
            self.truth.observe(instance, LOCK, 0, 0);
            return guard;
        }
        let start = clock::ticks();
        let guard = mutex.lock().unwrap_or_else(|p| p.into_inner());
        let waited = clock::ticks().saturating_sub(start).max(1);
        self.truth.observe(instance, LOCK, Observation::FLAG_CONTENDED, waited);
        guard
    }

    fn work_once(&self, seq: u64) {
        {
            let mut orders = self.lock_observed(&self.orders, &self.orders_lock);
            *orders.entry(seq % 1024).or_default() += 1;
        }
        if seq.is_multiple_of(4) {
            match self.cache.try_lock() {
                Ok(mut cache) => {
                    self.truth.observe(&self.cache_lock, TRY_LOCK, 0, 0);
                    cache.push(seq);
                    if cache.len() > 256 {
                        cache.clear();
                    }
                }
                Err(_) => self
                    .truth
                    .observe(&self.cache_lock, TRY_LOCK, Observation::FLAG_MISS, 0),
            }
        }
        match self.jobs_tx.try_send(seq) {
            Ok(()) => self.truth.observe(&self.jobs, TRY_SEND, 0, 0),
            Err(TrySendError::Full(_)) => {
                self.truth.observe(&self.jobs, TRY_SEND, Observation::FLAG_CONTENDED, 0);
                if let Ok(rx) = self.jobs_rx.try_lock() {
                    let start = clock::ticks();
                    let got = rx.recv_timeout(Duration::from_millis(1)).is_ok();
                    let waited = clock::ticks().saturating_sub(start).max(1);
                    self.truth
                        .observe(&self.jobs, RECV, if got { 0 } else { Observation::FLAG_MISS }, waited);
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
        if seq % 2 == 1
            && let Ok(rx) = self.jobs_rx.try_lock()
        {
            let flags = if rx.try_recv().is_ok() { 0 } else { Observation::FLAG_MISS };
            self.truth.observe(&self.jobs, TRY_RECV, flags, 0);
        }
    }
}

fn worker(shared: &Shared, index: usize, args: &Args) {
    let period = (args.rate > 0).then(|| Duration::from_nanos(1_000_000_000 / args.rate));
    let mut next = Instant::now();
    let mut next_burst = Instant::now() + args.burst_every / 2;
    let mut seq = index as u64 * 1_000_000_000;
    while !shared.stop.load(Ordering::Relaxed) {
        shared.work_once(seq);
        seq += 1;
        if args.burst && index == 0 && Instant::now() >= next_burst {
            // Far more than a ring holds, as fast as the producer can go.
            for i in 0..args.burst_size {
                shared.truth.observe(&shared.orders_lock, LOCK, 0, 0);
                if i % 1024 == 0 && shared.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            next_burst = Instant::now() + args.burst_every;
        }
        if let Some(period) = period {
            next += period;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else if now - next > Duration::from_millis(100) {
                next = now; // don't try to catch up after a stall
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.threads == 0 {
        anyhow::bail!("--threads must be at least 1");
    }
    let (jobs_tx, jobs_rx) = sync_channel(256);
    let shared = Arc::new(Shared {
        orders: Mutex::new(HashMap::new()),
        orders_lock: Instance::register(MUTEX, "orders_lock")?,
        cache: Mutex::new(Vec::new()),
        cache_lock: Instance::register(MUTEX, "cache_lock")?,
        jobs_tx,
        jobs_rx: Mutex::new(jobs_rx),
        jobs: Instance::register(CHANNEL, "jobs")?,
        truth: Truth::default(),
        stop: AtomicBool::new(false),
    });
    let started = Instant::now();
    let args = Arc::new(args);
    let mut handles = Vec::new();
    for index in 0..args.threads {
        let (shared, args) = (Arc::clone(&shared), Arc::clone(&args));
        handles.push(
            std::thread::Builder::new()
                .name(format!("worker-{index}"))
                .spawn(move || worker(&shared, index, &args))?,
        );
    }
    if args.churn > 0 {
        let (shared, args) = (Arc::clone(&shared), Arc::clone(&args));
        handles.push(std::thread::Builder::new().name("churn".into()).spawn(move || {
            let mut generation = 0u64;
            while !shared.stop.load(Ordering::Relaxed) {
                let batch: Vec<_> = (0..args.churn)
                    .map(|i| {
                        let shared = Arc::clone(&shared);
                        std::thread::Builder::new()
                            .name(format!("short-{generation}-{i}"))
                            .spawn(move || {
                                for seq in 0..50 {
                                    shared.work_once(seq);
                                }
                            })
                    })
                    .collect();
                for handle in batch.into_iter().flatten() {
                    let _ = handle.join();
                }
                generation += 1;
            }
        })?);
    }
    std::thread::sleep(args.duration);
    shared.stop.store(true, Ordering::Relaxed);
    for handle in handles {
        let _ = handle.join();
    }
    let truth = &shared.truth;
    if args.report
        && let Some(sidecar) = subetha_core::process_sidecar()
    {
        sidecar.scan_now();
        let snapshot = sidecar.snapshot();
        eprintln!("in-process sidecar (draining: {}):", snapshot.draining);
        for record in &snapshot.instances {
            eprintln!(
                "  {:<12} {:<8} ops {:>10} contended {:>8} misses {:>8} drops {:>8}",
                record.meta.name,
                record.meta.kind_name,
                record.stats.total_ops(),
                record.stats.total_contended(),
                record.stats.total_misses(),
                record.stats.drops_attributed()
            );
        }
        for episode in &snapshot.episodes {
            eprintln!(
                "  drop episode on thread {} ({}): {} dropped",
                episode.os_tid, episode.thread_name, episode.dropped
            );
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "pid": std::process::id(),
            "observations_attempted": truth.attempted.load(Ordering::Relaxed),
            "queued": truth.queued.load(Ordering::Relaxed),
            "dropped": truth.dropped.load(Ordering::Relaxed),
            "lost_no_ring": truth.lost.load(Ordering::Relaxed),
            "threads": args.threads,
            "duration_ms": started.elapsed().as_millis() as u64,
        })
    );
    Ok(())
}
