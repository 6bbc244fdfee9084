//! What the eBPF probes cost the code they watch.
//!
//! **Scheduler tracepoints.** Two threads ping-pong one byte through a pair
//! of pipes ([`ROUND_TRIPS`] round trips per iteration, each one two
//! context switches per thread), either on one CPU (every hand-off is a
//! direct switch between them) or on two. Measured with the probes not
//! loaded, then loaded and:
//!
//! * nobody watched: every `sched_switch`/`sched_wakeup` on the host runs
//!   the programs and their index rejects it. What any workload on a host
//!   running the agent pays: this is the row the ≤ 5% target is about;
//! * both threads watched as producers, with the agent's off-CPU filter:
//!   what an instrumented application's threads pay (the agent follows
//!   producers through their migrations and drop hooks only);
//! * both threads watched as scanners, with the agent's filter: every
//!   switch updates the thread's state (a scan thread switches at most a
//!   few thousand times a second, so this is a worst case, not a workload);
//! * both watched, every interval an event in the ring buffer (no filter).
//!
//! Events are drained between iterations, outside the timing (the 1 MiB
//! ring buffer holds an iteration's ~8,000 events; no event is lost, which
//! is checked).
//!
//! **Drop-hook uprobes.** A producer pushes into an [`ObservationRing`]
//! (the same `push` the instrumented primitives use; the ring's consumer is
//! the same thread), with the probes loaded and the uprobes on
//! `subetha_drop_begin`/`subetha_drop_end` attached to this process or not:
//!
//! * `storm_100k` / `storm_1m`: one storm per iteration — one slot is
//!   freed, then 100,000 (1,000,000) pushes: the first is queued (ending
//!   the previous episode), every other one is dropped. Two hook calls per
//!   iteration, whatever the storm's length: a storm of N drops costs the
//!   producer two uprobe hits, so the relative overhead depends only on how
//!   long the storm lasts (the report prints the cost of one hit);
//! * `fill_drain_1` / `fill_drain_64`: [`CYCLES`] cycles of "pop k, push
//!   2k": k queued, k dropped, so every cycle ends one episode and begins
//!   another — two hook calls per 2k pushes. k = 1 is the worst case for
//!   the hooks (an episode every two pushes).
//!
//! | id (group)                                 | one iteration                 |
//! |--------------------------------------------|-------------------------------|
//! | `probes_sched/pingpong_{same_cpu,two_cpus}/{unloaded,loaded_unwatched,watched_producers,watched_scanners,watched_every_interval}` | 4,000 round trips |
//! | `probes_uprobes/{storm_100k,storm_1m,fill_drain_64,fill_drain_1}/{detached,attached}` | see above |
//!
//! After criterion (with `--bench`), a plain A/B measurement alternates the
//! configurations round by round and prints the ratios against the targets:
//! context switches slowed by ≤ 5%, and producer
//! throughput during a storm with the uprobes attached ≥ 95% of without.
//!
//! Needs root (the probes). Where they cannot load the loaded variants are
//! skipped with a message, unless `SUBETHA_REQUIRE_PROBES=1`.
//!
//! `cargo bench -p subetha-agent --bench probes`; `SUBETHA_BENCH_QUICK=1`
//! shortens it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use subetha_agent::AgentConfig;
use subetha_agent::probes::{LoadedProbes, OffCpuFilter, Role};
use subetha_core::{Observation, ObservationRing};

/// Round trips per ping-pong iteration: ~8,000 off-CPU events when both
/// threads are watched, which the 1 MiB event ring holds (104 bytes each).
const ROUND_TRIPS: u64 = 4_000;
/// Fill/drain cycles per iteration.
const CYCLES: u64 = 4_096;
const SLOWDOWN_TARGET: f64 = 0.05;
const THROUGHPUT_TARGET: f64 = 0.95;

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

fn cpus_online() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Pins the calling thread to `cpu` (no-op beyond the online CPUs).
fn pin_to(cpu: usize) {
    if cpu >= cpus_online() || cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set is valid for reads of its own size; 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
}

/// A pipe: (read end, write end).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is valid for two ints.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by no one else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    (File::from(read), File::from(write))
}

// ----------------------------------------------------------------- probes

/// The probes, or `None` (with a message) where they cannot load and the
/// environment does not require them.
fn load_probes() -> Option<LoadedProbes> {
    match LoadedProbes::load() {
        Ok(probes) => Some(probes),
        Err(error) => {
            if std::env::var("SUBETHA_REQUIRE_PROBES").is_ok_and(|v| v == "1") {
                panic!("the eBPF probes must load here (SUBETHA_REQUIRE_PROBES=1): {error}");
            }
            eprintln!("probes bench: skipping the loaded variants: {error}");
            None
        }
    }
}

/// Drains the probes' events (untimed); returns how many.
fn drain(probes: &mut LoadedProbes) -> u64 {
    let mut events = Vec::new();
    let mut total = 0;
    loop {
        let n = probes.drain_events(&mut events);
        total += n as u64;
        events.clear();
        if n == 0 {
            return total;
        }
    }
}

// --------------------------------------------------------------- ping-pong

/// The bench thread and an echo thread bouncing one byte.
struct PingPong {
    to_echo: Option<File>,
    from_echo: File,
    echo: Option<JoinHandle<()>>,
    echo_tid: u32,
    /// Probe events drained by [`time`](Self::time).
    events: u64,
}

impl PingPong {
    /// An echo thread pinned to `cpu`.
    fn new(cpu: usize) -> Self {
        let (echo_in, to_echo) = pipe();
        let (from_echo, echo_out) = pipe();
        let (tid_tx, tid_rx) = mpsc::channel();
        let echo = std::thread::Builder::new()
            .name("pingpong-echo".into())
            .spawn(move || {
                pin_to(cpu);
                tid_tx.send(gettid()).unwrap();
                let (mut input, mut output) = (echo_in, echo_out);
                let mut byte = [0u8; 1];
                while input.read(&mut byte).is_ok_and(|n| n == 1) {
                    output.write_all(&byte).expect("echo");
                }
            })
            .expect("spawn the echo thread");
        let echo_tid = tid_rx.recv().expect("echo tid");
        Self {
            to_echo: Some(to_echo),
            from_echo,
            echo: Some(echo),
            echo_tid,
            events: 0,
        }
    }

    fn run(&mut self, round_trips: u64) {
        let to_echo = self.to_echo.as_mut().expect("open");
        let mut byte = [7u8; 1];
        for _ in 0..round_trips {
            to_echo.write_all(&byte).expect("ping");
            self.from_echo.read_exact(&mut byte).expect("pong");
        }
    }

    /// Times `iters` iterations, draining `probes` after each (untimed).
    fn time(&mut self, iters: u64, mut probes: Option<&mut LoadedProbes>) -> Duration {
        let mut timed = Duration::ZERO;
        for _ in 0..iters {
            let start = Instant::now();
            self.run(ROUND_TRIPS);
            timed += start.elapsed();
            if let Some(probes) = probes.as_deref_mut() {
                self.events += drain(probes);
            }
        }
        timed
    }
}

impl Drop for PingPong {
    fn drop(&mut self) {
        drop(self.to_echo.take());
        if let Some(echo) = self.echo.take() {
            let _ = echo.join();
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sched {
    Unloaded,
    LoadedUnwatched,
    /// Both threads watched as producers, with the agent's filter.
    Producers,
    /// Both threads watched as scanners, with the agent's filter.
    Scanners,
    /// Both threads watched, every off-CPU interval an event.
    EveryInterval,
}

impl Sched {
    const ALL: [Sched; 5] = [
        Sched::Unloaded,
        Sched::LoadedUnwatched,
        Sched::Producers,
        Sched::Scanners,
        Sched::EveryInterval,
    ];

    fn name(self) -> &'static str {
        match self {
            Sched::Unloaded => "unloaded",
            Sched::LoadedUnwatched => "loaded_unwatched",
            Sched::Producers => "watched_producers",
            Sched::Scanners => "watched_scanners",
            Sched::EveryInterval => "watched_every_interval",
        }
    }

    /// The row of the A/B report.
    fn label(self) -> &'static str {
        match self {
            Sched::Unloaded => "unloaded",
            Sched::LoadedUnwatched => "loaded, unwatched",
            Sched::Producers => "watched as producers",
            Sched::Scanners => "watched as scanners",
            Sched::EveryInterval => "watched, every interval",
        }
    }
}

/// The filter the agent sets with its default scan interval bounds.
fn agent_filter() -> OffCpuFilter {
    OffCpuFilter::for_agent(AgentConfig::default().max_scan_interval.as_nanos() as u64)
}

/// Puts the probes into `state` for the threads of `pp` (loading or
/// dropping them as needed). `None` when the probes cannot load.
fn set_sched(probes: &mut Option<LoadedProbes>, state: Sched, pp: &PingPong) -> Option<()> {
    if state == Sched::Unloaded {
        *probes = None;
        return Some(());
    }
    if probes.is_none() {
        *probes = Some(load_probes()?);
    }
    let p = probes.as_mut()?;
    let filter = (state != Sched::EveryInterval).then(agent_filter);
    p.set_off_cpu_filter(filter).expect("set the off-CPU filter");
    for tid in [gettid(), pp.echo_tid] {
        match state {
            Sched::Unloaded | Sched::LoadedUnwatched => p.unwatch(tid),
            Sched::Producers | Sched::EveryInterval => p.watch(tid, Role::Producer).expect("watch a thread"),
            Sched::Scanners => p.watch(tid, Role::Scanner).expect("watch a thread"),
        }
    }
    drain(p);
    Some(())
}

/// Lets the work a change of probes leaves behind (maps and programs freed
/// after an RCU grace period, JIT memory) finish before a measurement, then
/// warms the ping-pong up.
fn settle(pp: &mut PingPong) {
    std::thread::sleep(Duration::from_millis(50));
    pp.run(ROUND_TRIPS);
}

fn pingpong_layouts() -> Vec<(&'static str, usize)> {
    let mut layouts = vec![("same_cpu", 0)];
    if cpus_online() >= 2 {
        layouts.push(("two_cpus", 1));
    }
    layouts
}

fn bench_sched(group: &mut BenchmarkGroup<'_, WallTime>, probes: &mut Option<LoadedProbes>) {
    group.throughput(Throughput::Elements(ROUND_TRIPS));
    for (layout, cpu) in pingpong_layouts() {
        let mut pp = PingPong::new(cpu);
        for state in Sched::ALL {
            if set_sched(probes, state, &pp).is_none() {
                continue;
            }
            let losses = probes.as_ref().map_or(0, LoadedProbes::losses);
            group.bench_function(format!("pingpong_{layout}/{}", state.name()), |b| {
                b.iter_custom(|iters| pp.time(iters, probes.as_mut()))
            });
            if let Some(p) = probes.as_ref() {
                assert_eq!(p.losses(), losses, "events lost: raise the drain frequency");
            }
        }
        if let Some(p) = probes.as_mut() {
            p.unwatch(gettid());
            p.unwatch(pp.echo_tid);
        }
    }
}

// ----------------------------------------------------------------- storms

#[derive(Clone, Copy)]
enum Pattern {
    /// One storm of this many pushes.
    Storm(u64),
    /// Pop k, push 2k, [`CYCLES`] times.
    FillDrain(u64),
}

impl Pattern {
    fn name(self) -> String {
        match self {
            Pattern::Storm(n) if n % 1_000_000 == 0 => format!("storm_{}m", n / 1_000_000),
            Pattern::Storm(n) => format!("storm_{}k", n / 1_000),
            Pattern::FillDrain(k) => format!("fill_drain_{k}"),
        }
    }

    fn pushes(self) -> u64 {
        match self {
            Pattern::Storm(n) => n,
            Pattern::FillDrain(k) => CYCLES * 2 * k,
        }
    }

    /// Hook calls per iteration.
    fn hooks(self) -> u64 {
        match self {
            Pattern::Storm(_) => 2,
            Pattern::FillDrain(_) => 2 * CYCLES,
        }
    }

    /// One iteration on a full `ring`; leaves it full. Returns the pushes
    /// that were queued.
    fn run(self, ring: &ObservationRing) -> u64 {
        let obs = Observation::new(7, 1, 0, 0);
        let mut queued = 0;
        match self {
            Pattern::Storm(n) => {
                std::hint::black_box(ring.pop());
                for _ in 0..n {
                    queued += u64::from(ring.push(std::hint::black_box(obs)));
                }
            }
            Pattern::FillDrain(k) => {
                for _ in 0..CYCLES {
                    for _ in 0..k {
                        std::hint::black_box(ring.pop());
                    }
                    for _ in 0..2 * k {
                        queued += u64::from(ring.push(std::hint::black_box(obs)));
                    }
                }
            }
        }
        queued
    }

    fn expected_queued(self) -> u64 {
        match self {
            Pattern::Storm(_) => 1,
            Pattern::FillDrain(k) => CYCLES * k,
        }
    }
}

/// A full ring (in an episode: the last push was dropped).
fn full_ring() -> Box<ObservationRing> {
    let ring = Box::new(ObservationRing::new());
    let obs = Observation::new(7, 1, 0, 0);
    while ring.push(obs) {}
    ring
}

fn time_pattern(
    pattern: Pattern,
    ring: &ObservationRing,
    iters: u64,
    mut probes: Option<&mut LoadedProbes>,
) -> Duration {
    let mut timed = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        let queued = pattern.run(ring);
        timed += start.elapsed();
        assert_eq!(queued, pattern.expected_queued());
        if let Some(probes) = probes.as_deref_mut() {
            drain(probes);
        }
    }
    timed
}

fn set_uprobes(probes: &mut LoadedProbes, attached: bool) {
    let pid = std::process::id();
    if attached {
        probes
            .attach_producer_process(pid)
            .expect("attach the drop-hook uprobes to this process");
    } else {
        probes.detach_process(pid);
    }
}

const PATTERNS: [Pattern; 4] = [
    Pattern::Storm(100_000),
    Pattern::Storm(1_000_000),
    Pattern::FillDrain(64),
    Pattern::FillDrain(1),
];

fn bench_uprobes(group: &mut BenchmarkGroup<'_, WallTime>, probes: &mut LoadedProbes) {
    let ring = full_ring();
    for pattern in PATTERNS {
        group.throughput(Throughput::Elements(pattern.pushes()));
        for attached in [false, true] {
            set_uprobes(probes, attached);
            let before = probes.hook_hits();
            let losses = probes.losses();
            let mut ran = false;
            group.bench_function(
                format!(
                    "{}/{}",
                    pattern.name(),
                    if attached { "attached" } else { "detached" }
                ),
                |b| {
                    b.iter_custom(|iters| {
                        ran = true;
                        time_pattern(pattern, &ring, iters, Some(&mut *probes))
                    })
                },
            );
            // (Unless a filter skipped it.)
            if ran {
                let hits = probes.hook_hits();
                assert_eq!(
                    hits.drop_begin > before.drop_begin,
                    attached,
                    "the uprobes fire exactly when attached"
                );
            }
            assert_eq!(probes.losses(), losses, "events lost");
        }
    }
    set_uprobes(probes, false);
}

// ------------------------------------------------------------ A/B report

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Rounds alternating the configurations; per-round ratios, medians.
fn report(probes: &mut Option<LoadedProbes>, quick: bool) {
    let rounds = if quick { 5 } else { 15 };
    eprintln!("\nprobes A/B ({rounds} rounds each, medians of per-round ratios):");
    eprintln!(
        "{:<44} {:>12} {:>12} {:>9} {:>7}",
        "workload", "without", "with", "ratio", "target"
    );
    for (layout, cpu) in pingpong_layouts() {
        let mut pp = PingPong::new(cpu);
        let per_rt = |d: Duration, iters: u64| d.as_nanos() as f64 / (iters * ROUND_TRIPS) as f64;
        // Across CPUs a round trip takes ~30× longer (idle wakeups): fewer
        // iterations give each measurement a similar duration.
        let iters = match (quick, cpu) {
            (true, 0) => 5,
            (false, 0) => 20,
            (true, _) => 1,
            (false, _) => 2,
        };
        let mut base = Vec::new();
        // Per watched state: ratios to the unloaded run, events per round trip.
        let mut ratios: [Vec<f64>; 4] = Default::default();
        let mut events: [Vec<f64>; 4] = Default::default();
        for round in 0..rounds {
            set_sched(probes, Sched::Unloaded, &pp);
            settle(&mut pp);
            let unloaded = per_rt(pp.time(iters, None), iters);
            base.push(unloaded);
            // Each round starts the loaded states at another one, so that
            // whatever follows a load (the kernel freeing the previous
            // object's maps, cold caches) does not always fall on the same
            // state.
            for k in 0..ratios.len() {
                let i = (round + k) % ratios.len();
                let state = &Sched::ALL[1 + i];
                if set_sched(probes, *state, &pp).is_none() {
                    eprintln!("pingpong_{layout}: {unloaded:.0} ns/round trip; probes unavailable");
                    return;
                }
                settle(&mut pp);
                drain(probes.as_mut().unwrap());
                let losses = probes.as_ref().unwrap().losses();
                pp.events = 0;
                let with = per_rt(pp.time(iters, probes.as_mut()), iters);
                assert_eq!(probes.as_ref().unwrap().losses(), losses, "events lost");
                ratios[i].push(with / unloaded);
                events[i].push(pp.events as f64 / (iters * ROUND_TRIPS) as f64);
            }
        }
        let base = median(base);
        for ((state, ratios), events) in Sched::ALL[1..].iter().zip(ratios).zip(events) {
            let name = state.label();
            let ratio = median(ratios);
            let slowdown = ratio - 1.0;
            // The target is for workloads; the scanner and unfiltered rows
            // are worst cases shown for what they cost.
            let (target, verdict) = match state {
                Sched::LoadedUnwatched | Sched::Producers if slowdown <= SLOWDOWN_TARGET => {
                    ("≤ +5%", "meets")
                }
                Sched::LoadedUnwatched | Sched::Producers => ("≤ +5%", "MISSES"),
                _ => ("(worst)", "info"),
            };
            eprintln!(
                "{:<44} {:>9.0} ns {:>9.0} ns {:>+8.1}% {:>7} {:<6} {:.2} events/round trip",
                format!("pingpong_{layout}: {name}"),
                base,
                base * ratio,
                slowdown * 100.0,
                target,
                verdict,
                median(events)
            );
        }
    }
    let Some(p) = probes.as_mut() else {
        return;
    };
    // The storms measure the uprobes alone: nothing left watched from the
    // ping-pong (this thread was), the agent's filter back.
    for (tid, _) in p.watched() {
        p.unwatch(tid);
    }
    p.set_off_cpu_filter(Some(agent_filter()))
        .expect("set the off-CPU filter");
    let ring = full_ring();
    for pattern in PATTERNS {
        // Some 10 M pushes a measurement (3 M quick): a short one (a 100k
        // storm takes ~0.1 ms) is at the mercy of a single interrupt.
        let iters = ((if quick { 3_000_000 } else { 10_000_000 }) / pattern.pushes()).max(3);
        let (mut base, mut ratios) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut measure = |attached: bool| {
                set_uprobes(p, attached);
                // Warm up (the first hits also let the kernel turn the
                // uprobes into trampoline calls), then let whatever the
                // (de)attachment left behind finish before timing.
                pattern.run(&ring);
                std::thread::sleep(Duration::from_millis(50));
                drain(p);
                time_pattern(pattern, &ring, iters, Some(&mut *p))
            };
            // Alternate which goes first.
            let (without, with) = if round % 2 == 0 {
                let without = measure(false);
                (without, measure(true))
            } else {
                let with = measure(true);
                (measure(false), with)
            };
            base.push(without.as_nanos() as f64 / iters as f64);
            ratios.push(without.as_secs_f64() / with.as_secs_f64());
        }
        set_uprobes(p, false);
        let base_ns = median(base);
        let ratio = median(ratios);
        let rate = |ns: f64| pattern.pushes() as f64 / ns * 1e3;
        let per_hook_us = (base_ns / ratio - base_ns) / pattern.hooks() as f64 / 1e3;
        let storm = matches!(pattern, Pattern::Storm(_));
        eprintln!(
            "{:<44} {:>8.1} M/s {:>8.1} M/s {:>8.1}% {:>7} {:<6} {:.2} µs per hook call",
            format!("{}: pushes/s", pattern.name()),
            rate(base_ns),
            rate(base_ns / ratio),
            ratio * 100.0,
            if storm { "≥ 95%" } else { "(worst)" },
            if !storm {
                "info"
            } else if ratio >= THROUGHPUT_TARGET {
                "meets"
            } else {
                "MISSES"
            },
            per_hook_us
        );
    }
}

fn main() {
    pin_to(0);
    let quick = std::env::var("SUBETHA_BENCH_QUICK").is_ok_and(|v| v == "1");
    let benching = std::env::args().any(|a| a == "--bench");
    let mut criterion = Criterion::default().configure_from_args();
    let mut probes: Option<LoadedProbes> = None;
    {
        let mut group = criterion.benchmark_group("probes_sched");
        group.sample_size(if quick { 10 } else { 30 });
        group.warm_up_time(Duration::from_millis(if quick { 200 } else { 1000 }));
        group.measurement_time(Duration::from_secs(if quick { 1 } else { 4 }));
        bench_sched(&mut group, &mut probes);
        group.finish();
    }
    if probes.is_none() {
        probes = load_probes();
    }
    if let Some(p) = probes.as_mut() {
        let mut group = criterion.benchmark_group("probes_uprobes");
        group.sample_size(if quick { 10 } else { 30 });
        group.warm_up_time(Duration::from_millis(if quick { 200 } else { 1000 }));
        group.measurement_time(Duration::from_secs(if quick { 1 } else { 4 }));
        bench_uprobes(&mut group, p);
        group.finish();
    }
    criterion.final_summary();
    if benching {
        report(&mut probes, quick);
    }
}
