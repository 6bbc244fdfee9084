//! Comparative benchmarks: subetha's [`ObservationRing`] against `rtrb` and
//! crossbeam's `ArrayQueue`, all carrying the same 24-byte [`Observation`],
//! plus the [`Drainer`] and [`Instance::observe`] end to end.
//!
//! `cargo xtask bench` runs this and prints one table; `cargo bench -p
//! subetha-core --bench ring` runs it bare. Groups (criterion ids):
//!
//! | group              | what one iteration is                                     |
//! |--------------------|-----------------------------------------------------------|
//! | `push_room`        | [`BATCH`] pushes into an empty ring (drained untimed)     |
//! | `push_full`        | [`BATCH`] pushes into a full ring (every one dropped)     |
//! | `drainer`          | one `Drainer::scan` of 8 full rings (8 × 4096 obs)        |
//! | `observe`          | [`BATCH`] `Instance::observe` calls (drained untimed)     |
//!
//! Every group declares `Throughput::Elements`, so per-item figures are
//! `mean / elements`.
//!
//! The two-thread measurements are not criterion groups (see
//! [`threaded_rows`] for why): `lossy_concurrent` (push attempts while a
//! consumer thread drains) and `lossless` (items moved producer → consumer,
//! the producer retrying on full) run in many short rounds (200 of 2¹⁸
//! items; `SUBETHA_BENCH_ROUNDS` sets the number) that alternate between
//! the implementations. Their medians and quartiles go to side files, with
//! subetha's comparison to rtrb paired round by round: the median of
//! rtrb's time over ours and of the drop fractions' difference, each with a
//! 95% confidence interval. A filter argument selects them by the same ids
//! (`lossless/rtrb`; `|` separates alternatives, each matched as a
//! substring). What criterion cannot express (drop fractions, whether
//! threads were pinned) goes to small JSON files in `$SUBETHA_BENCH_OUT`
//! (default `target/subetha-bench/`).
//!
//! Threads: the bench (main) thread is pinned to CPU 0 and every helper
//! thread (consumer, producer or ring filler) to CPU 1 when the machine has
//! two CPUs and `sched_setaffinity` allows it.
//!
//! `SUBETHA_BENCH_QUICK=1` shortens warm-up and measurement (CI smoke).

use std::fmt::Write as _;
use std::hint::{black_box, spin_loop};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use crossbeam_queue::ArrayQueue;
use subetha_core::segment::{RingSlot, slot_state};
use subetha_core::{
    Drainer, Instance, InstanceKind, Observation, ObservationRing, Segment, SegmentConfig, SegmentView,
    SidecarMode,
};

#[path = "common/paired.rs"]
mod paired;
use paired::RatioSummary;

/// Slots in every ring under test.
const CAPACITY: usize = ObservationRing::CAPACITY;
/// Pushes per timed batch (and per criterion iteration) in the push groups.
const BATCH: usize = 1024;
/// Observations a consumer copies out per call (the Drainer's batch size).
const POP_BATCH: usize = subetha_core::drain::POP_BATCH;
/// CPU of the bench thread (producer, or consumer in `lossless`).
const MAIN_CPU: usize = 0;
/// CPU of helper threads.
const HELPER_CPU: usize = 1;

// ---------------------------------------------------------------------------
// The three rings behind one producer / consumer interface.

/// Producer side: `push` returns false when the item was not accepted.
trait Prod {
    /// Lossy push: false when full (ours counts the drop).
    fn push(&mut self, obs: Observation) -> bool;
    /// Push for a producer that retries: false when full, nothing counted.
    fn try_push(&mut self, obs: Observation) -> bool {
        self.push(obs)
    }
}

/// Consumer side: copies up to `out.len()` items out, returns how many.
trait Cons: Send {
    fn pop_batch(&mut self, out: &mut [Observation]) -> usize;
}

/// Our ring placed as in a segment: every ring slot's ring starts on a
/// 128-byte boundary, so `head` (byte 0) and `tail` (byte 64) share one
/// 128-byte pair of lines, as they do in production. (A plain
/// `Arc<ObservationRing>` lands 64 or 128 bytes into the allocation,
/// depending on the allocator: two layouts from run to run.)
#[repr(C, align(128))]
struct SegmentPlaced(ObservationRing);

impl Prod for Arc<SegmentPlaced> {
    #[inline(always)]
    fn push(&mut self, obs: Observation) -> bool {
        ObservationRing::push(&self.0, obs)
    }

    #[inline(always)]
    fn try_push(&mut self, obs: Observation) -> bool {
        ObservationRing::try_push(&self.0, obs).is_ok()
    }
}

impl Cons for Arc<SegmentPlaced> {
    #[inline(always)]
    fn pop_batch(&mut self, out: &mut [Observation]) -> usize {
        ObservationRing::pop_batch(&self.0, out)
    }
}

impl Prod for rtrb::Producer<Observation> {
    #[inline(always)]
    fn push(&mut self, obs: Observation) -> bool {
        rtrb::Producer::push(self, obs).is_ok()
    }
}

impl Cons for rtrb::Consumer<Observation> {
    #[inline(always)]
    fn pop_batch(&mut self, out: &mut [Observation]) -> usize {
        // rtrb's batch copy-out: one head publish per call, like ours.
        self.pop_partial_slice(out).0.len()
    }
}

impl Prod for Arc<ArrayQueue<Observation>> {
    #[inline(always)]
    fn push(&mut self, obs: Observation) -> bool {
        ArrayQueue::push(self, obs).is_ok()
    }
}

impl Cons for Arc<ArrayQueue<Observation>> {
    #[inline(always)]
    fn pop_batch(&mut self, out: &mut [Observation]) -> usize {
        // ArrayQueue has no batch pop: one `pop` per item.
        let mut n = 0;
        while n < out.len() {
            match ArrayQueue::pop(self) {
                Some(obs) => {
                    out[n] = obs;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }
}

fn subetha_pair() -> (Arc<SegmentPlaced>, Arc<SegmentPlaced>) {
    let ring = Arc::new(SegmentPlaced(ObservationRing::new()));
    (Arc::clone(&ring), ring)
}

fn rtrb_pair() -> (rtrb::Producer<Observation>, rtrb::Consumer<Observation>) {
    rtrb::RingBuffer::new(CAPACITY)
}

fn arrayqueue_pair() -> (Arc<ArrayQueue<Observation>>, Arc<ArrayQueue<Observation>>) {
    let queue = Arc::new(ArrayQueue::new(CAPACITY));
    (Arc::clone(&queue), queue)
}

/// Runs `$body` once per ring kind with `$name` bound to its id and
/// `($p, $c)` to a fresh producer / consumer pair.
macro_rules! for_each_ring {
    (|$name:ident, $p:ident, $c:ident| $body:block) => {{
        {
            let $name = "subetha";
            let ($p, $c) = subetha_pair();
            $body
        }
        {
            let $name = "rtrb";
            let ($p, $c) = rtrb_pair();
            $body
        }
        {
            let $name = "arrayqueue";
            let ($p, $c) = arrayqueue_pair();
            $body
        }
    }};
}

/// The payload template: a realistic observation with the thread id already
/// stamped (so `ObservationRing::push` does not look it up).
fn template() -> Observation {
    Observation {
        instance_id: 1,
        op_kind: 1,
        flags: 0,
        latency_ticks: 0,
        producer_thread_id: subetha_core::thread_id(),
        _reserved: 0,
    }
}

/// Payload `i`: the template with one field varied per push, so the
/// compiler can hoist nothing.
#[inline(always)]
fn payload(base: &Observation, i: usize) -> Observation {
    Observation {
        latency_ticks: i as u64,
        ..*base
    }
}

/// Pushes `n` payloads; returns how many were accepted.
#[inline(always)]
fn push_n<P: Prod>(p: &mut P, n: usize) -> usize {
    let base = black_box(template());
    let mut accepted = 0;
    for i in 0..n {
        accepted += usize::from(p.push(payload(&base, i)));
    }
    accepted
}

/// Pushes `n` payloads, spinning while the ring is full (lossless use).
#[inline(always)]
fn push_n_retrying<P: Prod>(p: &mut P, n: usize) {
    let base = black_box(template());
    for i in 0..n {
        let obs = payload(&base, i);
        while !p.try_push(obs) {
            spin_loop();
        }
    }
}

/// Empties a ring from the consumer side.
fn drain_all<C: Cons>(c: &mut C) -> usize {
    let mut buf = [Observation::ZERO; POP_BATCH];
    let mut total = 0;
    loop {
        let n = c.pop_batch(&mut buf);
        if n == 0 {
            return total;
        }
        black_box(&buf[..n]);
        total += n;
    }
}

// ---------------------------------------------------------------------------
// Settings, pinning, side files.

fn quick() -> bool {
    std::env::var_os("SUBETHA_BENCH_QUICK").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Applies the run's timing to a group.
fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    let (warm_up, measure, samples) = if quick() { (0.2, 0.6, 20) } else { (1.0, 3.0, 60) };
    group
        .warm_up_time(Duration::from_secs_f64(warm_up))
        .measurement_time(Duration::from_secs_f64(measure))
        .sample_size(samples);
}

/// CPUs this process may use, counted before any thread is pinned (a
/// pinned thread's `available_parallelism` is 1, and threads inherit it).
static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn cpus() -> usize {
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Pins the calling thread to `cpu`; false when that is not possible.
fn pin_to(cpu: usize) -> bool {
    if cpus() < 2 {
        return false;
    }
    // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < 2 ≤ CPU_SETSIZE, so the bit is inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid, initialised
    // cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// Where the side files go.
fn out_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SUBETHA_BENCH_OUT") {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")));
    target.join("subetha-bench")
}

/// Writes `target/subetha-bench/<name>.json` (a flat object of numbers and
/// booleans; hand-formatted to keep serde out of the library's dev-deps).
/// Only in a real benchmark run (`cargo bench` passes `--bench`), not when
/// `cargo test` runs each benchmark once as a smoke test.
fn write_side_file(name: &str, fields: &[(&str, String)]) {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = out_dir();
    let body = fields
        .iter()
        .map(|(k, v)| format!("  \"{k}\": {v}"))
        .collect::<Vec<_>>()
        .join(",\n");
    let result = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join(format!("{name}.json")), format!("{{\n{body}\n}}\n")));
    if let Err(error) = result {
        eprintln!("bench: cannot write {}: {error}", dir.display());
    }
}

// ---------------------------------------------------------------------------
// (1) Push with no consumer.

/// Steady-state push into a ring with room: `BATCH` pushes timed, then the
/// ring is emptied outside the timed region.
fn push_room(c: &mut Criterion) {
    let mut group = c.benchmark_group("push_room");
    configure(&mut group);
    group.throughput(Throughput::Elements(BATCH as u64));
    for_each_ring!(|name, p, c| {
        let (mut p, mut c) = (p, c);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let accepted = push_n(&mut p, BATCH);
                    total += start.elapsed();
                    assert_eq!(accepted, BATCH, "{name}: ring had room");
                    drain_all(&mut c);
                }
                total
            })
        });
    });
    group.finish();
}

/// The drop path: every push finds the ring full.
fn push_full(c: &mut Criterion) {
    let mut group = c.benchmark_group("push_full");
    configure(&mut group);
    group.throughput(Throughput::Elements(BATCH as u64));
    for_each_ring!(|name, p, c| {
        let (mut p, _c) = (p, c);
        assert_eq!(push_n(&mut p, CAPACITY), CAPACITY, "{name}: fill");
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    let accepted = push_n(&mut p, BATCH);
                    assert_eq!(accepted, 0, "{name}: ring is full");
                }
                start.elapsed()
            })
        });
    });
    group.finish();
}

// ---------------------------------------------------------------------------
// (2) and (3): the two-thread rows, in interleaved rounds.
//
// These are not criterion groups. On the 2-vCPU VMs this runs on, a
// two-thread figure moves by ±30% over seconds (where the host puts the two
// vCPUs, what else it runs), and it is bimodal: a lossy producer either
// races a consumer that keeps the ring nearly empty (slow pushes, few
// drops) or runs into a full ring (cheap drops, many of them). Criterion
// measures one implementation for 4 s, then the next, always in the same
// order, so a drift between those blocks lands on whichever ran in the bad
// stretch. Here every implementation runs one round in turn, the order
// rotating each round, and the table reports the median round with its
// interquartile range: a drift hits all of them alike.
//
// Each round spawns the helper thread afresh (as criterion's samples did)
// and lets both threads run `warm` items untimed before the clock starts,
// so thread wake-up and vCPU wake-up are not measured. A round starts after
// a quiet 100 ms (waiting at most 2 s) and is run again (up to 3 times) when
// other processes used the CPUs during it: on two CPUs a compile next door
// halves a two-thread figure.

/// Rounds per implementation and items per round.
fn round_plan() -> (usize, usize, usize) {
    // (rounds, timed items per round, untimed warm-up items per round).
    // Many short rounds (a few ms each): the paired ratio's interval
    // narrows with their number, and each pair of rounds sits in one of
    // the VM's speed regimes.
    if !std::env::args().any(|a| a == "--bench") {
        (1, 1 << 16, 1 << 12) // `cargo test` smoke run
    } else if quick() {
        (20, 1 << 17, 1 << 12)
    } else {
        let rounds = std::env::var("SUBETHA_BENCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        (rounds, 1 << 18, 1 << 14)
    }
}

/// A producer/consumer pair behind one object, so rounds can alternate
/// between ring kinds. Each side is boxed on its own 128-byte-aligned
/// block: rtrb keeps its cached indices in the `Producer` / `Consumer`
/// values, and on the bench thread's stack they could share a cache line
/// with each other or with the other thread's hot data (our ring keeps
/// them in the ring itself).
trait Pair {
    /// `warm + n` lossy pushes while a consumer drains; returns the time and
    /// the accepted count of the last `n`, and whether the consumer was
    /// pinned.
    fn lossy_round(&mut self, warm: usize, n: usize) -> (Duration, usize, bool);
    /// Moves `warm + n` items producer → consumer, timing the last `n` at
    /// the consumer; returns the time and whether the producer was pinned.
    fn lossless_round(&mut self, warm: usize, n: usize) -> (Duration, bool);
}

#[repr(align(128))]
struct Padded<T>(T);

struct PairOf<P, C> {
    p: Box<Padded<P>>,
    c: Box<Padded<C>>,
}

fn boxed_pair<P: Prod + Send + 'static, C: Cons + 'static>((p, c): (P, C)) -> Box<dyn Pair> {
    Box::new(PairOf {
        p: Box::new(Padded(p)),
        c: Box::new(Padded(c)),
    })
}

impl<P: Prod + Send, C: Cons> Pair for PairOf<P, C> {
    fn lossy_round(&mut self, warm: usize, n: usize) -> (Duration, usize, bool) {
        let (p, c) = (&mut self.p.0, &mut self.c.0);
        let ready = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let consumer = s.spawn(|| {
                let pinned = pin_to(HELPER_CPU);
                let mut buf = [Observation::ZERO; POP_BATCH];
                ready.store(true, Ordering::Release);
                loop {
                    let got = c.pop_batch(&mut buf);
                    if got == 0 {
                        if stop.load(Ordering::Acquire) {
                            drain_all(c);
                            return pinned;
                        }
                        spin_loop();
                    } else {
                        black_box(&buf[..got]);
                    }
                }
            });
            while !ready.load(Ordering::Acquire) {
                spin_loop();
            }
            push_n(p, warm);
            let start = Instant::now();
            let accepted = push_n(p, n);
            let elapsed = start.elapsed();
            stop.store(true, Ordering::Release);
            (elapsed, accepted, consumer.join().expect("consumer thread"))
        })
    }

    fn lossless_round(&mut self, warm: usize, n: usize) -> (Duration, bool) {
        let (p, c) = (&mut self.p.0, &mut self.c.0);
        let ready = AtomicBool::new(false);
        let go = AtomicBool::new(false);
        std::thread::scope(|s| {
            let producer = s.spawn(|| {
                let pinned = pin_to(HELPER_CPU);
                ready.store(true, Ordering::Release);
                while !go.load(Ordering::Acquire) {
                    spin_loop();
                }
                push_n_retrying(p, warm + n);
                pinned
            });
            while !ready.load(Ordering::Acquire) {
                spin_loop();
            }
            let mut buf = [Observation::ZERO; POP_BATCH];
            go.store(true, Ordering::Release);
            // The producer pushes exactly `warm + n`: take the warm-up part
            // exactly, then time the rest.
            let mut receive = |count: usize| {
                let mut received = 0;
                while received < count {
                    let got = c.pop_batch(&mut buf[..POP_BATCH.min(count - received)]);
                    if got == 0 {
                        spin_loop();
                    } else {
                        black_box(&buf[..got]);
                        received += got;
                    }
                }
            };
            receive(warm);
            let start = Instant::now();
            receive(n);
            let elapsed = start.elapsed();
            (elapsed, producer.join().expect("producer thread"))
        })
    }
}

/// CPU time (jiffies) used by all processes and by this one, from
/// `/proc/stat` and `/proc/self/stat`; `None` where those are unreadable.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal: busy = all - idle - iowait
    let busy = fields.iter().sum::<u64>() - fields.get(3)? - fields.get(4)?;
    let me = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name: Vec<&str> = me.get(me.rfind(')')? + 2..)?.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the whole line.
    let own = after_name.get(11)?.parse::<u64>().ok()? + after_name.get(12)?.parse::<u64>().ok()?;
    Some((busy, own))
}

/// Jiffies other processes used between two `cpu_jiffies` readings.
fn others_between(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> u64 {
    match (before, after) {
        (Some((b0, o0)), Some((b1, o1))) => (b1 - b0).saturating_sub(o1 - o0),
        _ => 0,
    }
}

/// Waits (at most `budget`) for a 100 ms stretch in which other processes
/// used no CPU time worth a jiffy, so a round does not start amid a
/// compile. Returns the time waited.
fn wait_for_quiet(budget: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < budget {
        let before = cpu_jiffies();
        std::thread::sleep(Duration::from_millis(100));
        if others_between(before, cpu_jiffies()) == 0 {
            break;
        }
    }
    start.elapsed()
}

/// Median and quartiles (nearest rank) of `values`.
fn quartiles(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

/// The criterion-style filter (first free argument): runs `id` when there
/// is none or `id` contains one of its `|`-separated alternatives.
fn selected(id: &str) -> bool {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    filter.is_none_or(|f| f.split('|').any(|alt| id.contains(alt)))
}

fn threaded_rows() {
    let (rounds, n, warm) = round_plan();
    for (group, lossy) in [("lossy_concurrent", true), ("lossless", false)] {
        let mut pairs: Vec<(&str, Box<dyn Pair>)> = Vec::new();
        for name in ["subetha", "rtrb", "arrayqueue"] {
            if !selected(&format!("{group}/{name}")) {
                continue;
            }
            let pair = match name {
                "subetha" => boxed_pair(subetha_pair()),
                "rtrb" => boxed_pair(rtrb_pair()),
                _ => boxed_pair(arrayqueue_pair()),
            };
            pairs.push((name, pair));
        }
        if pairs.is_empty() {
            continue;
        }
        // Per implementation: ns per item and drop fraction of each round.
        let mut ns = vec![Vec::new(); pairs.len()];
        let mut fractions = vec![Vec::new(); pairs.len()];
        let mut drops = vec![0u64; pairs.len()];
        let mut pinned = true;
        // Rounds during which other processes ran (others compile on these
        // machines) are run again, up to `RETRIES` times each, after a wait
        // for a quiet moment; what could not be run quietly is kept and
        // counted.
        const RETRIES: usize = 3;
        let (mut rerun, mut disturbed, mut waited) = (0usize, 0usize, Duration::ZERO);
        let smoke = rounds == 1;
        if !smoke {
            waited += wait_for_quiet(Duration::from_secs(2));
        }
        for round in 0..rounds {
            for k in 0..pairs.len() {
                let i = (round + k) % pairs.len();
                let pair = &mut pairs[i].1;
                for attempt in 0..=RETRIES {
                    let before = cpu_jiffies();
                    let (elapsed, accepted, helper_pinned) = if lossy {
                        pair.lossy_round(warm, n)
                    } else {
                        let (elapsed, helper_pinned) = pair.lossless_round(warm, n);
                        (elapsed, n, helper_pinned)
                    };
                    let quiet = smoke || others_between(before, cpu_jiffies()) <= 1;
                    if !quiet && attempt < RETRIES {
                        rerun += 1;
                        waited += wait_for_quiet(Duration::from_secs(2));
                        continue;
                    }
                    disturbed += usize::from(!quiet);
                    ns[i].push(elapsed.as_nanos() as f64 / n as f64);
                    fractions[i].push((n - accepted) as f64 / n as f64);
                    drops[i] += (n - accepted) as u64;
                    pinned &= helper_pinned;
                    break;
                }
            }
        }
        println!(
            "{group}: {rerun} rounds rerun because other processes ran, {disturbed} kept although \
             disturbed; waited {:.1} s for quiet",
            waited.as_secs_f64()
        );
        let index_of = |name: &str| pairs.iter().position(|(n, _)| *n == name);
        let vs_rtrb = match (index_of("subetha"), index_of("rtrb")) {
            (Some(ours), Some(rtrb)) => Some((ours, rtrb)),
            _ => None,
        };
        for (i, (name, _)) in pairs.iter().enumerate() {
            let (median, q1, q3) = quartiles(&ns[i]);
            let unit = if lossy { "ns/push" } else { "ns/item" };
            let mut line = format!(
                "{group}/{name}: median {median:.2} {unit} (IQR {q1:.2} .. {q3:.2}) over {rounds} rounds"
            );
            let mut fields = vec![
                ("rounds", rounds.to_string()),
                ("items_per_round", n.to_string()),
                ("ns_per_item", format!("{median:.6}")),
                ("ns_per_item_q1", format!("{q1:.6}")),
                ("ns_per_item_q3", format!("{q3:.6}")),
                ("pinned", pinned.to_string()),
                ("rounds_rerun", rerun.to_string()),
                ("rounds_disturbed", disturbed.to_string()),
            ];
            if lossy {
                let (f, f1, f3) = quartiles(&fractions[i]);
                let _ = write!(
                    line,
                    "; dropped median {:.2}% (IQR {:.2} .. {:.2})",
                    f * 100.0,
                    f1 * 100.0,
                    f3 * 100.0
                );
                let attempts = (rounds * n) as u64;
                fields.extend([
                    ("attempts", attempts.to_string()),
                    ("drops", drops[i].to_string()),
                    ("drop_fraction", format!("{f:.6}")),
                    ("drop_fraction_q1", format!("{f1:.6}")),
                    ("drop_fraction_q3", format!("{f3:.6}")),
                    (
                        "drop_fraction_overall",
                        format!("{:.6}", drops[i] as f64 / attempts as f64),
                    ),
                ]);
            }
            if let Some((ours, rtrb)) = vs_rtrb.filter(|&(ours, _)| ours == i) {
                // Paired per round and judged against "as good as rtrb":
                // rtrb's time per item over ours (> 1: ours is faster), and
                // rtrb's drop fraction minus ours in percentage points
                // (> 0: ours drops less).
                let speed = RatioSummary::of(ns[rtrb].iter().zip(&ns[ours]).map(|(r, o)| r / o).collect());
                let _ = write!(
                    line,
                    "\n{group}/{name}: speed vs rtrb (rtrb's time / ours), paired per round: median {:.3} \
                     (95% CI {:.3} .. {:.3}) [{:.3} .. {:.3}]: {}",
                    speed.median,
                    speed.ci.0,
                    speed.ci.1,
                    speed.min,
                    speed.max,
                    speed.verdict(1.0)
                );
                fields.extend([
                    ("vs_rtrb_speed", format!("{:.6}", speed.median)),
                    ("vs_rtrb_speed_ci_low", format!("{:.6}", speed.ci.0)),
                    ("vs_rtrb_speed_ci_high", format!("{:.6}", speed.ci.1)),
                ]);
                if lossy {
                    let fewer = RatioSummary::of(
                        fractions[rtrb]
                            .iter()
                            .zip(&fractions[ours])
                            .map(|(r, o)| (r - o) * 100.0)
                            .collect(),
                    );
                    let _ = write!(
                        line,
                        "\n{group}/{name}: points of pushes dropped fewer than rtrb, paired per round: \
                         median {:+.2} (95% CI {:+.2} .. {:+.2}): {}",
                        fewer.median,
                        fewer.ci.0,
                        fewer.ci.1,
                        fewer.verdict(0.0)
                    );
                    fields.extend([
                        ("vs_rtrb_fewer_dropped_points", format!("{:.6}", fewer.median)),
                        (
                            "vs_rtrb_fewer_dropped_points_ci_low",
                            format!("{:.6}", fewer.ci.0),
                        ),
                        (
                            "vs_rtrb_fewer_dropped_points_ci_high",
                            format!("{:.6}", fewer.ci.1),
                        ),
                    ]);
                }
            }
            println!("{line}");
            write_side_file(&format!("{group}-{name}"), &fields);
        }
    }
}

// ---------------------------------------------------------------------------
// (6) An outsider's harness: long rounds, three consumer shapes.
//
// Rows 2 and 3 are our own harness (short rounds, the consumer in `Cons`
// shape). A user comparing us with rtrb writes something simpler: one
// fresh ring per round, the producer on CPU 0 and the consumer on CPU 1,
// rounds of 10 M items, subetha and rtrb alternating round by round, and a
// consumer written the obvious way for each API. These rows are that
// harness, so our table cannot disagree with theirs.

/// How the consumer thread of an outsider's harness takes items out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// One `pop` per item, busy-polling (no pause when empty).
    PerItem,
    /// Batches of [`POP_BATCH`] (`pop_batch` / rtrb `read_chunk`), a
    /// `spin_loop` pause when empty.
    BatchPause,
    /// The same batches, no pause when empty.
    BatchSpin,
}

impl Shape {
    const ALL: [Shape; 3] = [Shape::PerItem, Shape::BatchPause, Shape::BatchSpin];

    /// The id used in filters and side-file names (`harness_<id>`).
    fn id(self) -> &'static str {
        match self {
            Shape::PerItem => "per_item",
            Shape::BatchPause => "batch_pause",
            Shape::BatchSpin => "batch_spin",
        }
    }
}

/// The consumer calls an outsider would write against each API.
trait OutsiderCons: Send {
    /// One item, if any.
    fn pop_one(&mut self) -> Option<Observation>;
    /// Up to `out.len()` items, the API's batch way; returns how many.
    fn pop_chunk(&mut self, out: &mut [Observation]) -> usize;
}

impl OutsiderCons for Arc<SegmentPlaced> {
    #[inline(always)]
    fn pop_one(&mut self) -> Option<Observation> {
        ObservationRing::pop(&self.0)
    }

    #[inline(always)]
    fn pop_chunk(&mut self, out: &mut [Observation]) -> usize {
        ObservationRing::pop_batch(&self.0, out)
    }
}

impl OutsiderCons for rtrb::Consumer<Observation> {
    #[inline(always)]
    fn pop_one(&mut self) -> Option<Observation> {
        rtrb::Consumer::pop(self).ok()
    }

    #[inline(always)]
    fn pop_chunk(&mut self, out: &mut [Observation]) -> usize {
        // The documented way: ask how many slots are readable, take a chunk
        // of up to `out.len()`, copy it out, commit.
        let n = self.slots().min(out.len());
        if n == 0 {
            return 0;
        }
        let chunk = self.read_chunk(n).expect("slots() said readable");
        let (first, second) = chunk.as_slices();
        out[..first.len()].copy_from_slice(first);
        out[first.len()..n].copy_from_slice(second);
        chunk.commit_all();
        n
    }
}

/// Runs the consumer loop of `shape` until `stop` (then empties the ring)
/// or until `limit` items were taken; returns how many were taken.
#[inline(never)]
fn outsider_consume<C: OutsiderCons>(c: &mut C, shape: Shape, stop: &AtomicBool, limit: usize) -> usize {
    let mut buf = [Observation::ZERO; POP_BATCH];
    let mut taken = 0usize;
    loop {
        let got = match shape {
            Shape::PerItem => match c.pop_one() {
                Some(obs) => {
                    black_box(obs);
                    1
                }
                None => 0,
            },
            Shape::BatchPause | Shape::BatchSpin => {
                let got = c.pop_chunk(&mut buf);
                black_box(&buf[..got]);
                got
            }
        };
        taken += got;
        if taken >= limit {
            return taken;
        }
        if got == 0 {
            if stop.load(Ordering::Acquire) {
                // The producer finished: whatever is left is taken now.
                loop {
                    let got = c.pop_chunk(&mut buf);
                    if got == 0 {
                        return taken;
                    }
                    taken += got;
                }
            }
            if shape == Shape::BatchPause {
                spin_loop();
            }
        }
    }
}

/// One round of the outsider's harness on a fresh pair: the calling thread
/// (CPU 0) produces, a consumer thread (CPU 1) consumes in `shape`.
/// Lossy: times `n` `push`es, returns (time, accepted). Lossless: times
/// `n` items from the first `try_push` until the consumer has them all,
/// returns (time, n).
fn outsider_round<P: Prod + Send, C: OutsiderCons>(
    (p, c): (P, C),
    shape: Shape,
    lossy: bool,
    n: usize,
) -> (Duration, usize, bool) {
    let (mut p, mut c) = (Box::new(Padded(p)), Box::new(Padded(c)));
    let ready = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let consumer = s.spawn(|| {
            let pinned = pin_to(HELPER_CPU);
            ready.store(true, Ordering::Release);
            let limit = if lossy { usize::MAX } else { n };
            (outsider_consume(&mut c.0, shape, &stop, limit), pinned)
        });
        while !ready.load(Ordering::Acquire) {
            spin_loop();
        }
        let start = Instant::now();
        let (elapsed, accepted) = if lossy {
            let accepted = push_n(&mut p.0, n);
            (start.elapsed(), accepted)
        } else {
            push_n_retrying(&mut p.0, n);
            let (taken, _) = consumer.join().expect("consumer thread");
            // The consumer returns when it has all `n`: that is the end.
            let elapsed = start.elapsed();
            assert_eq!(taken, n, "lossless round moved every item");
            return (elapsed, n, true);
        };
        stop.store(true, Ordering::Release);
        let (taken, pinned) = consumer.join().expect("consumer thread");
        assert_eq!(taken, accepted, "the consumer took every accepted item");
        (elapsed, accepted, pinned)
    })
}

/// Rounds and items per round of the outsider's harness.
fn outsider_plan() -> (usize, usize) {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    if !std::env::args().any(|a| a == "--bench") {
        (1, 1 << 16) // `cargo test` smoke run
    } else if quick() {
        (3, 1 << 20)
    } else {
        (
            env("SUBETHA_HARNESS_ROUNDS").unwrap_or(5),
            env("SUBETHA_HARNESS_ITEMS").unwrap_or(10_000_000),
        )
    }
}

fn outsider_rows() {
    let (rounds, n) = outsider_plan();
    for shape in Shape::ALL {
        let group = format!("harness_{}", shape.id());
        if !selected(&format!("{group}/subetha")) && !selected(&format!("{group}/rtrb")) {
            continue;
        }
        // Per implementation (0 = subetha, 1 = rtrb) and round.
        let mut push_ns = [Vec::new(), Vec::new()];
        let mut fractions = [Vec::new(), Vec::new()];
        let mut lossless_ns = [Vec::new(), Vec::new()];
        let (mut pinned, mut disturbed) = (true, 0usize);
        for round in 0..rounds {
            for lossy in [true, false] {
                for k in 0..2 {
                    // Alternate which goes first, round by round.
                    let which = (round + k) % 2;
                    let before = cpu_jiffies();
                    let (elapsed, accepted, helper_pinned) = if which == 0 {
                        outsider_round(subetha_pair(), shape, lossy, n)
                    } else {
                        outsider_round(rtrb_pair(), shape, lossy, n)
                    };
                    disturbed += usize::from(others_between(before, cpu_jiffies()) > 1);
                    pinned &= helper_pinned;
                    let ns = elapsed.as_nanos() as f64 / n as f64;
                    if lossy {
                        push_ns[which].push(ns);
                        fractions[which].push((n - accepted) as f64 / n as f64);
                    } else {
                        lossless_ns[which].push(ns);
                    }
                }
            }
        }
        let paired = |v: &[Vec<f64>; 2], f: fn(f64, f64) -> f64| {
            RatioSummary::of(v[0].iter().zip(&v[1]).map(|(&o, &r)| f(o, r)).collect())
        };
        // Oriented as subetha / rtrb: push time, drop fraction, throughput.
        let push_ratio = paired(&push_ns, |o, r| o / r);
        let drop_ratio = paired(&fractions, |o, r| {
            if r > 0.0 {
                o / r
            } else if o > 0.0 {
                f64::INFINITY
            } else {
                1.0
            }
        });
        let lossless_ratio = paired(&lossless_ns, |o, r| r / o);
        println!(
            "{group}: {rounds} rounds of {n} items, {disturbed} of {} runs disturbed by other processes",
            rounds * 4
        );
        for (which, name) in ["subetha", "rtrb"].into_iter().enumerate() {
            let (p, p1, p3) = quartiles(&push_ns[which]);
            let (f, f1, f3) = quartiles(&fractions[which]);
            let (l, l1, l3) = quartiles(&lossless_ns[which]);
            println!(
                "{group}/{name}: push {p:.2} ns (IQR {p1:.2} .. {p3:.2}), dropped {:.2}% (IQR {:.2} .. {:.2}), \
                 lossless {:.1} M obs/s (IQR {:.1} .. {:.1})",
                f * 100.0,
                f1 * 100.0,
                f3 * 100.0,
                1e3 / l,
                1e3 / l3,
                1e3 / l1
            );
            let mut fields: Vec<(String, String)> = [
                ("rounds", rounds.to_string()),
                ("items_per_round", n.to_string()),
                ("pinned", pinned.to_string()),
                ("runs_disturbed", disturbed.to_string()),
                ("push_ns", format!("{p:.6}")),
                ("push_ns_q1", format!("{p1:.6}")),
                ("push_ns_q3", format!("{p3:.6}")),
                ("drop_fraction", format!("{f:.6}")),
                ("drop_fraction_q1", format!("{f1:.6}")),
                ("drop_fraction_q3", format!("{f3:.6}")),
                ("lossless_ns", format!("{l:.6}")),
                ("lossless_ns_q1", format!("{l1:.6}")),
                ("lossless_ns_q3", format!("{l3:.6}")),
            ]
            .map(|(k, v)| (k.to_owned(), v))
            .into();
            if which == 0 {
                println!(
                    "{group}: subetha/rtrb paired per round: push time ×{:.3} [{:.3} .. {:.3}], drop fraction \
                     ×{:.3} [{:.3} .. {:.3}], lossless throughput ×{:.3} [{:.3} .. {:.3}]",
                    push_ratio.median,
                    push_ratio.min,
                    push_ratio.max,
                    drop_ratio.median,
                    drop_ratio.min,
                    drop_ratio.max,
                    lossless_ratio.median,
                    lossless_ratio.min,
                    lossless_ratio.max
                );
                for (key, r) in [
                    ("vs_rtrb_push_time", push_ratio),
                    ("vs_rtrb_drop_fraction", drop_ratio),
                    ("vs_rtrb_lossless_speed", lossless_ratio),
                ] {
                    // JSON has no infinity: a ratio against zero drops is
                    // written as a large number.
                    let finite = |x: f64| if x.is_finite() { x } else { 1e9 };
                    fields.push((key.to_owned(), format!("{:.6}", finite(r.median))));
                    fields.push((format!("{key}_min"), format!("{:.6}", finite(r.min))));
                    fields.push((format!("{key}_max"), format!("{:.6}", finite(r.max))));
                }
            }
            let fields: Vec<(&str, String)> = fields.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            write_side_file(&format!("{group}-{name}"), &fields);
        }
    }
}

// ---------------------------------------------------------------------------
// (4) Drainer into InstanceStats.

const DRAIN_RINGS: u32 = 8;
const DRAIN_INSTANCES: u32 = 16;

/// Registers one instance in the private segment. Returns its id.
fn register(view: &SegmentView, index: u32) -> u32 {
    const MUTEX: InstanceKind = InstanceKind {
        code: 1,
        name: "mutex",
        ops: &["lock", "try_lock", "unlock"],
    };
    subetha_core::registry::register_instance(view, MUTEX, &format!("bench-{index}")).expect("register")
}

/// Claims ring slot `index` by hand, as a thread's first observation would.
fn activate(view: &SegmentView, index: u32, thread_id: u32) -> &RingSlot {
    let slot = view.ring_slot(index).expect("slot in table");
    slot.generation.fetch_add(1, Ordering::Relaxed);
    slot.thread_id.store(thread_id, Ordering::Relaxed);
    slot.os_tid.store(10_000 + thread_id, Ordering::Relaxed);
    slot.state.store(slot_state::ACTIVE, Ordering::Release);
    view.live()
        .rings_high_water
        .fetch_max(index + 1, Ordering::AcqRel);
    slot
}

/// One ring-full of a realistic mix for thread `thread_id`: instances
/// chosen at random, op kinds 1..=3, ~30% with a measured (contended)
/// latency spread over five decades, ~5% misses.
fn observation_mix(ids: &[u32], thread_id: u32, seed: u64) -> Vec<Observation> {
    let mut state = seed | 1;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    (0..CAPACITY)
        .map(|_| {
            let r = next();
            let instance_id = ids[(r % ids.len() as u64) as usize];
            let op_kind = 1 + ((r >> 8) % 3) as u16;
            let roll = (r >> 16) % 100;
            let (flags, latency_ticks) = if roll < 30 {
                let magnitude = 6 + (r >> 24) % 17; // 64 .. 8M ticks
                (
                    Observation::FLAG_CONTENDED,
                    (1u64 << magnitude) + ((r >> 32) & ((1 << magnitude) - 1)),
                )
            } else if roll < 35 {
                (Observation::FLAG_MISS, 0)
            } else {
                (0, 0)
            };
            Observation {
                instance_id,
                op_kind,
                flags,
                latency_ticks,
                producer_thread_id: thread_id,
                _reserved: 0,
            }
        })
        .collect()
}

fn fill_rings(slots: &[&RingSlot], mixes: &[Vec<Observation>]) {
    for (slot, mix) in slots.iter().zip(mixes) {
        for obs in mix {
            assert!(slot.ring.push(*obs), "ring was drained");
        }
    }
}

fn drainer(c: &mut Criterion) {
    let segment = Segment::create(SegmentConfig {
        instances: 64,
        ring_slots: DRAIN_RINGS,
    })
    .expect("private segment");
    let view = segment.view();
    let ids: Vec<u32> = (0..DRAIN_INSTANCES).map(|i| register(view, i)).collect();
    let slots: Vec<&RingSlot> = (0..DRAIN_RINGS).map(|i| activate(view, i, 1000 + i)).collect();
    let mixes: Vec<Vec<Observation>> = (0..DRAIN_RINGS)
        .map(|i| observation_mix(&ids, 1000 + i, 0x5EED + u64::from(i)))
        .collect();
    let per_scan = u64::from(DRAIN_RINGS) * CAPACITY as u64;
    let mut drainer = Drainer::attach(view).expect("private segment lease");
    // Prime: first sight of instances and threads allocates; keep that out.
    fill_rings(&slots, &mixes);
    assert_eq!(drainer.scan().drained, per_scan);

    let mut group = c.benchmark_group("drainer");
    configure(&mut group);
    group.throughput(Throughput::Elements(per_scan));
    let timed_scan = |drainer: &mut Drainer<&SegmentView>| {
        let start = Instant::now();
        let report = drainer.scan();
        let elapsed = start.elapsed();
        assert_eq!(report.drained, per_scan, "scan drained every ring");
        elapsed
    };

    // The rings were filled by a thread on the other CPU, as an
    // application's would be: the scan pays the cross-core cache traffic.
    let filler_pinned = std::thread::scope(|s| {
        let (request, requests) = mpsc::sync_channel::<bool>(0);
        let (done, dones) = mpsc::sync_channel::<()>(0);
        let (slots, mixes) = (&slots, &mixes);
        let filler = s.spawn(move || {
            let pinned = pin_to(HELPER_CPU);
            while let Ok(true) = requests.recv() {
                fill_rings(slots, mixes);
                done.send(()).expect("bench thread waits");
            }
            pinned
        });
        group.bench_function("scan_cross_core", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    request.send(true).expect("filler runs");
                    dones.recv().expect("filler runs");
                    total += timed_scan(&mut drainer);
                }
                total
            })
        });
        request.send(false).expect("filler runs");
        filler.join().expect("filler thread")
    });
    // Same-core fill: the rings are warm in this core's caches. Shown for
    // reference (a best case the sidecar rarely sees).
    group.bench_function("scan_same_core", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                fill_rings(&slots, &mixes);
                total += timed_scan(&mut drainer);
            }
            total
        })
    });
    group.finish();
    let totals = drainer.totals();
    assert_eq!(totals.unattributed, 0, "every observation had an instance");
    assert_eq!(totals.dropped, 0);
    write_side_file(
        "drainer",
        &[
            ("rings", DRAIN_RINGS.to_string()),
            ("instances", DRAIN_INSTANCES.to_string()),
            ("observations_per_scan", per_scan.to_string()),
            ("filler_pinned", filler_pinned.to_string()),
        ],
    );
}

// ---------------------------------------------------------------------------
// (5) Instance::observe end to end.

fn observe(c: &mut Criterion) {
    let instance = Instance::register(InstanceKind::CUSTOM, "bench.observe").expect("register");
    // The first observation claims this thread's ring.
    assert!(instance.observe(1, 0, 0).expect("ring claimed"));
    let view = subetha_core::process_segment().expect("process segment").view();
    let me = subetha_core::thread_id();
    let slot = (0..view.rings_in_use())
        .filter_map(|i| view.ring_slot(i))
        .find(|s| {
            s.state.load(Ordering::Acquire) == slot_state::ACTIVE && s.thread_id.load(Ordering::Relaxed) == me
        })
        .expect("this thread's ring slot");
    // This thread acts as the consumer of its own ring between batches,
    // which is only allowed while nobody else drains the process segment.
    if subetha_core::process_sidecar().is_some() {
        eprintln!("bench observe: skipped, the sidecar is running (unset SUBETHA_SIDECAR)");
        return;
    }
    let ring = &slot.ring;
    let mut buf = [Observation::ZERO; POP_BATCH];
    let mut empty = || while ring.pop_batch(&mut buf) > 0 {};
    empty();

    let mut group = c.benchmark_group("observe");
    configure(&mut group);
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("subetha", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let base = black_box(template());
                let start = Instant::now();
                let mut accepted = 0usize;
                for i in 0..BATCH {
                    let obs = payload(&base, i);
                    accepted += usize::from(matches!(
                        instance.observe(obs.op_kind, obs.flags, obs.latency_ticks),
                        Ok(true)
                    ));
                }
                total += start.elapsed();
                assert_eq!(accepted, BATCH, "ring had room");
                empty();
            }
            total
        })
    });
    group.finish();
}

fn main() {
    // Before the process segment exists: no sidecar competing for the CPU
    // or for our ring (SUBETHA_SIDECAR in the environment still wins).
    subetha_core::set_sidecar_mode(SidecarMode::Off);
    let cpus = cpus();
    let pinned = pin_to(MAIN_CPU);
    write_side_file(
        "meta",
        &[
            ("cpus", cpus.to_string()),
            ("main_pinned", pinned.to_string()),
            ("main_cpu", MAIN_CPU.to_string()),
            ("helper_cpu", HELPER_CPU.to_string()),
            ("batch", BATCH.to_string()),
            ("pop_batch", POP_BATCH.to_string()),
            ("quick", quick().to_string()),
            ("threaded_rounds", round_plan().0.to_string()),
            ("threaded_items_per_round", round_plan().1.to_string()),
        ],
    );
    let mut criterion = Criterion::default();
    if quick() {
        criterion = criterion.nresamples(10_000);
    }
    let mut criterion = criterion.configure_from_args();
    push_room(&mut criterion);
    push_full(&mut criterion);
    observe(&mut criterion);
    threaded_rows();
    outsider_rows();
    drainer(&mut criterion);
    criterion.final_summary();
}
