//! `subetha-demo`: an instrumented workload for trying the agent.
//!
//! Worker threads share two mutex-protected maps and a bounded job channel,
//! all of them subetha primitives (`subetha_core::Mutex`,
//! `subetha_core::Channel`), so every operation is observed by the
//! primitive itself (with its wait time when it had to wait, and sampled
//! hold times; uncontended `lock`s as counts). `--burst` makes one thread
//! poll `try_lock` on a lock it holds — a long uninterrupted run of failed
//! `try_lock`s, more than a ring holds — every `--burst-every`, so the
//! consumer sees a drop storm.
//! `--churn` keeps spawning short-lived threads that use the same
//! primitives.
//!
//! At exit it prints one JSON line of ground truth from
//! [`subetha_core::primitives::accounting`]: every observation the
//! primitives attempted (`observations_attempted`) and what became of it
//! (queued, dropped because the ring was full, or lost for want of a ring).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use subetha_core::primitives::accounting;
use subetha_core::primitives::channel::TrySendError;
use subetha_core::{Channel, Mutex};

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

struct Shared {
    orders: Mutex<HashMap<u64, u64>>,
    cache: Mutex<Vec<u64>>,
    jobs: Channel<u64>,
    stop: AtomicBool,
}

impl Shared {
    fn work_once(&self, seq: u64) {
        // `lock` (contended + wait when it had to wait), sampled `unlock`.
        *self.orders.lock().entry(seq % 1024).or_default() += 1;
        // `try_lock`, a miss when another worker holds the cache.
        if seq.is_multiple_of(4)
            && let Some(mut cache) = self.cache.try_lock()
        {
            cache.push(seq);
            if cache.len() > 256 {
                cache.clear();
            }
        }
        // `try_send` (a miss when full); when full, drain one job with a
        // timed `recv`.
        if let Err(TrySendError::Full(_)) = self.jobs.try_send(seq) {
            let _ = self.jobs.recv_timeout(Duration::from_millis(1));
        }
        // `try_recv`, a miss when empty.
        if seq % 2 == 1 {
            let _ = self.jobs.try_recv();
        }
    }

    /// Holds the cache lock and polls `try_lock` on it `size` times: every
    /// poll is one failed `try_lock` observation, as fast as the producer
    /// can go — far more than a ring holds.
    fn burst(&self, size: u64) {
        let _held = self.cache.lock();
        for i in 0..size {
            let polled = self.cache.try_lock();
            debug_assert!(polled.is_none());
            if i % 1024 == 0 && self.stop.load(Ordering::Relaxed) {
                break;
            }
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
            shared.burst(args.burst_size);
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
    // Before the first primitive: every observation is counted.
    accounting::enable();
    let shared = Arc::new(Shared {
        orders: Mutex::named("orders_lock", HashMap::new()),
        cache: Mutex::named("cache_lock", Vec::new()),
        jobs: Channel::named("jobs", 256),
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
    // Dropping the primitives reports what they still held back (a mutex's
    // last count of uncontended locks); every thread that observed has
    // been joined: the tally is exact.
    drop(shared);
    let truth = accounting::totals();
    if args.report
        && let Some(sidecar) = subetha_core::process_sidecar()
    {
        sidecar.scan_now();
        let snapshot = sidecar.snapshot();
        eprintln!("in-process sidecar (draining: {}):", snapshot.draining);
        for record in snapshot.instances.iter().chain(&snapshot.retired) {
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
            "observations_attempted": truth.attempted,
            "queued": truth.queued,
            "dropped": truth.dropped,
            "lost_no_ring": truth.lost,
            "threads": args.threads,
            "duration_ms": started.elapsed().as_millis() as u64,
        })
    );
    Ok(())
}
