//! The instrumented primitives against what they wrap, side by side in one
//! run: `cargo bench -p subetha-core --bench primitives [-- FILTER]`.
//!
//! | group | what one element is |
//! |---|---|
//! | `uncontended` | one `lock()` + guard drop on one thread |
//! | `contended` `…/hammer/{2,4}` | one lock + increment + unlock, 2 or 4 threads hammering one lock with nothing else to do |
//! | `contended` `…/50+100ns/{2,4}` | the same with 50 ns of busy work inside the lock and 100 ns outside |
//! | `contended` `…/50+100ns-jitter/{2,4}` | the same with each length drawn from half to one and a half times its nominal (see `Pacing`) |
//! | `rwlock` `…/read/{1,2,4}` | one `read()` of a `u64` + guard drop, 1, 2 or 4 threads on one lock |
//! | `rwlock` `…/write/1` | one `write()` + increment + guard drop on one thread |
//! | `rwlock` `…/mixed/{2,4}` | 50 ns of busy work under `read()`, every 8th operation under `write()` instead, and 100 ns outside |
//! | `rwlock` `…/mixed-jitter/{2,4}` | the same jittered, the writes drawn 1 in 8 |
//! | `channel` `…/turns` | one message sent and received by the same thread (capacity 1024): the operations' own cost |
//! | `channel` `…/spsc`, `…/mpmc` | one message sent and received (capacity 1024; 1+1 or 2+2 threads) |
//! | `channel` `…/spsc-work`, `…/mpmc-work` | the same with 100 ns of busy work per message on each side, jittered |
//! | `adaptive` `…/hammer/{2,4}`, `…/<cs>+<out>ns[-jitter]/{2,4}` | as in `contended`: the hammer; one acquisition holding the lock for `<cs>` ns of busy work, then `<out>` ns of work outside it (50+100 fixed and jittered, then 500+500, 2000+2000, 20000+20000, 50000+150000) |
//!
//! Implementations: `parking_lot` / `crossbeam` (the wrapped types, the
//! baseline of each comparison), `same_again` (the baseline's type again,
//! another instance: the control, whose ratio shows how far identical code
//! at another address reads from 100% on this host), `subetha` ([`Mutex`], [`RwLock`], [`Channel`]),
//! `unobserved` (the wrapper without an instance: the same lock or channel
//! code, no ring pushes, nothing for the sidecar to drain),
//! `parking_lot_call` (`rwlock` only: `parking_lot`'s lock with its read
//! release out of line, a change that adds no work), `adaptive`
//! ([`AdaptiveMutex`] with its built-in policy) and `fixed_spin` (the same
//! lock with a pinned 16 µs spin budget).
//!
//! Two passes:
//!
//! 1. criterion, one benchmark after the other (per-benchmark statistics in
//!    `<target>/criterion/`). Skip with `SUBETHA_BENCH_CRITERION=0`.
//! 2. an *interleaved* comparison, which is what the summary table reports:
//!    every implementation of a comparison runs for a short slice in turn,
//!    for several rounds, and each round's throughput is divided by the
//!    baseline's from the same round. On a shared, loaded host this paired
//!    ratio is far steadier than comparing benchmarks run minutes apart.
//!    The table (median ns per element, median paired ratio with a 95%
//!    confidence interval and its min–max over the rounds, and for the
//!    contended and channel rows a verdict against the 95%
//!    target) is printed and saved as
//!    `<target>/subetha-bench/primitives.txt`.
//!
//! The process sidecar runs (mode `always`, so an agent on the host cannot
//! take the segment over) and drains the rings the instrumented variants
//! fill: its CPU time is part of what instrumentation costs on a 2-CPU
//! host, and it runs the adaptive policy.
//!
//! Environment: `SUBETHA_BENCH_QUICK=1` (short criterion runs, 3 rounds of
//! 100 ms; also when built as a test, without `--bench`), `SUBETHA_BENCH_ROUNDS` (default 200), `SUBETHA_BENCH_MAX_ROUNDS` (default five times that: a comparison whose judged row's interval still spans the 95% target after `SUBETHA_BENCH_ROUNDS` runs on, until it does not or this many have run), `SUBETHA_BENCH_SLICE_MS`
//! (default 10: on a VM whose speed drifts, many short slices give a
//! median within a few % in one run; between runs, the regime a
//! two-thread workload falls into can still move it further), `SUBETHA_BENCH_ADAPTIVE="cs:out,…"` (the adaptive group's paced scenarios, fixed pacing,
//! ns), `SUBETHA_BENCH_ONLY=<group>/<id>` (run that one case alone for
//! `SUBETHA_BENCH_SLICE_MS`, default 2000, and print its ns/op and, per op
//! of each instance, what the sidecar recorded: operations, contended ones,
//! and the quantiles of their waits or sampled holds; for `perf record`
//! and `strace -c`).

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use subetha_core::primitives::{PolicyWord, policy_word, set_policy_word};
use subetha_core::{AdaptiveMutex, Channel, Mutex, RwLock, SidecarMode};

#[path = "common/paired.rs"]
mod paired;
use paired::{RatioSummary, SPANS, median};

// ---------------------------------------------------------------------------
// Driving a workload: a fixed number of operations (criterion) or a time
// slice (interleaved comparison).

#[derive(Clone, Copy)]
enum Budget {
    Ops(u64),
    Time(Duration),
}

/// Operations done and wall time taken.
type Outcome = (u64, Duration);

/// Runs `op` on `threads` threads for `budget` and returns the total
/// operations and the wall time from the common start to the last finish.
fn drive(threads: usize, budget: Budget, op: impl Fn() + Send + Sync + Clone + 'static) -> Outcome {
    let start = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(Padded(AtomicBool::new(false)));
    let done = Arc::new(Padded(AtomicU64::new(0)));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (start, stop, done, op) = (
                Arc::clone(&start),
                Arc::clone(&stop),
                Arc::clone(&done),
                op.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                let mut n = 0u64;
                match budget {
                    Budget::Ops(total) => {
                        let mine = share(total, threads, i);
                        while n < mine {
                            op();
                            n += 1;
                        }
                    }
                    Budget::Time(_) => {
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..16 {
                                op();
                            }
                            n += 16;
                        }
                    }
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    if let Budget::Time(slice) = budget {
        std::thread::sleep(slice);
        stop.store(true, Ordering::Relaxed);
    }
    for h in handles {
        h.join().expect("bench thread");
    }
    (done.load(Ordering::Relaxed), began.elapsed())
}

/// A value alone in its pair of cache lines: the workers' shared `stop`
/// flag (read every 16 operations) and `done` counter must not share a line
/// with the lock under test, which would penalise whichever implementation
/// the allocator happened to put next to them.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// Thread `i`'s share of `total` operations.
fn share(total: u64, threads: usize, i: usize) -> u64 {
    total / threads as u64 + u64::from((i as u64) < total % threads as u64)
}

/// A lock around a `u64` counter.
trait CounterLock: Send + Sync + 'static {
    fn with(&self, f: impl FnOnce(&mut u64));
}

impl CounterLock for parking_lot::Mutex<u64> {
    #[inline]
    fn with(&self, f: impl FnOnce(&mut u64)) {
        f(&mut self.lock());
    }
}

impl CounterLock for Mutex<u64> {
    #[inline]
    fn with(&self, f: impl FnOnce(&mut u64)) {
        f(&mut self.lock());
    }
}

impl CounterLock for AdaptiveMutex<u64> {
    #[inline]
    fn with(&self, f: impl FnOnce(&mut u64)) {
        f(&mut self.lock());
    }
}

/// A reader-writer lock around a `u64` counter.
trait CounterRwLock: Send + Sync + 'static {
    fn read(&self, f: impl FnOnce(&u64) -> u64) -> u64;
    fn write(&self, f: impl FnOnce(&mut u64));
}

impl CounterRwLock for parking_lot::RwLock<u64> {
    #[inline]
    fn read(&self, f: impl FnOnce(&u64) -> u64) -> u64 {
        f(&parking_lot::RwLock::read(self))
    }

    #[inline]
    fn write(&self, f: impl FnOnce(&mut u64)) {
        f(&mut parking_lot::RwLock::write(self));
    }
}

impl CounterRwLock for RwLock<u64> {
    #[inline]
    fn read(&self, f: impl FnOnce(&u64) -> u64) -> u64 {
        f(&RwLock::read(self))
    }

    #[inline]
    fn write(&self, f: impl FnOnce(&mut u64)) {
        f(&mut RwLock::write(self));
    }
}

/// `parking_lot`'s raw `RwLock` with one change: the read release is a
/// call, not inlined. The `rwlock` group's `parking_lot_call` rows: what a
/// change that adds no work does to each row on this host.
struct CallReleaseRwLock(parking_lot::RawRwLock);

// SAFETY: every method forwards to `parking_lot::RawRwLock`, whose
// exclusion this is.
unsafe impl lock_api::RawRwLock for CallReleaseRwLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = Self(<parking_lot::RawRwLock as lock_api::RawRwLock>::INIT);
    type GuardMarker = lock_api::GuardNoSend;

    #[inline]
    fn lock_shared(&self) {
        lock_api::RawRwLock::lock_shared(&self.0);
    }

    #[inline]
    fn try_lock_shared(&self) -> bool {
        lock_api::RawRwLock::try_lock_shared(&self.0)
    }

    #[inline(never)]
    unsafe fn unlock_shared(&self) {
        // SAFETY: forwarded: the caller holds a shared lock.
        unsafe { lock_api::RawRwLock::unlock_shared(&self.0) }
    }

    #[inline]
    fn lock_exclusive(&self) {
        lock_api::RawRwLock::lock_exclusive(&self.0);
    }

    #[inline]
    fn try_lock_exclusive(&self) -> bool {
        lock_api::RawRwLock::try_lock_exclusive(&self.0)
    }

    #[inline]
    unsafe fn unlock_exclusive(&self) {
        // SAFETY: forwarded: the caller holds the exclusive lock.
        unsafe { lock_api::RawRwLock::unlock_exclusive(&self.0) }
    }
}

impl CounterRwLock for lock_api::RwLock<CallReleaseRwLock, u64> {
    #[inline]
    fn read(&self, f: impl FnOnce(&u64) -> u64) -> u64 {
        f(&lock_api::RwLock::read(self))
    }

    #[inline]
    fn write(&self, f: impl FnOnce(&mut u64)) {
        f(&mut lock_api::RwLock::write(self));
    }
}

/// The two ends of a bounded channel of `u64`.
trait Chan: Send + 'static {
    type Tx: Send + Clone + 'static;
    type Rx: Send + Clone + 'static;
    fn split(self) -> (Self::Tx, Self::Rx);
    fn send(tx: &Self::Tx, v: u64) -> bool;
    fn recv(rx: &Self::Rx) -> Option<u64>;
}

impl Chan for (crossbeam_channel::Sender<u64>, crossbeam_channel::Receiver<u64>) {
    type Tx = crossbeam_channel::Sender<u64>;
    type Rx = crossbeam_channel::Receiver<u64>;

    fn split(self) -> (Self::Tx, Self::Rx) {
        self
    }

    #[inline]
    fn send(tx: &Self::Tx, v: u64) -> bool {
        tx.send(v).is_ok()
    }

    #[inline]
    fn recv(rx: &Self::Rx) -> Option<u64> {
        rx.recv().ok()
    }
}

impl Chan for Channel<u64> {
    type Tx = subetha_core::primitives::Sender<u64>;
    type Rx = subetha_core::primitives::Receiver<u64>;

    fn split(self) -> (Self::Tx, Self::Rx) {
        Channel::split(self)
    }

    #[inline]
    fn send(tx: &Self::Tx, v: u64) -> bool {
        tx.send(v).is_ok()
    }

    #[inline]
    fn recv(rx: &Self::Rx) -> Option<u64> {
        rx.recv().ok()
    }
}

/// Moves messages from `producers` to `consumers` threads through a fresh
/// channel from `make`; counts messages received. `work`: busy work (ns,
/// paced) each thread does per message besides its `send` or `recv`, or
/// none.
fn drive_channel<C: Chan>(
    (producers, consumers): (usize, usize),
    work: Option<(u64, Pacing)>,
    budget: Budget,
    make: impl Fn() -> C,
) -> Outcome {
    let (tx, rx) = make().split();
    let start = Arc::new(Barrier::new(producers + consumers + 1));
    let stop = Arc::new(Padded(AtomicBool::new(false)));
    let received = Arc::new(Padded(AtomicU64::new(0)));
    let work = work.map(|(ns, pacing)| (ns * work_per_us() / 1000, pacing));
    let per_message = move || {
        if let Some((iterations, pacing)) = work {
            busy(pacing.draw(iterations, 0).0);
        }
    };
    let mut handles = Vec::new();
    for i in 0..producers {
        let (start, stop, tx) = (Arc::clone(&start), Arc::clone(&stop), tx.clone());
        handles.push(std::thread::spawn(move || {
            start.wait();
            match budget {
                Budget::Ops(total) => {
                    for k in 0..share(total, producers, i) {
                        per_message();
                        assert!(C::send(&tx, k));
                    }
                }
                Budget::Time(_) => {
                    let mut k = 0;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..64 {
                            per_message();
                            assert!(C::send(&tx, k));
                            k += 1;
                        }
                    }
                }
            }
        }));
    }
    drop(tx);
    for _ in 0..consumers {
        let (start, rx, received) = (Arc::clone(&start), rx.clone(), Arc::clone(&received));
        handles.push(std::thread::spawn(move || {
            start.wait();
            let mut n = 0;
            while C::recv(&rx).is_some() {
                per_message();
                n += 1;
            }
            received.fetch_add(n, Ordering::Relaxed);
        }));
    }
    drop(rx);
    start.wait();
    let began = Instant::now();
    if let Budget::Time(slice) = budget {
        std::thread::sleep(slice);
        stop.store(true, Ordering::Relaxed);
    }
    for h in handles {
        h.join().expect("channel thread");
    }
    (received.load(Ordering::Relaxed), began.elapsed())
}

/// One thread sending a message and receiving it, over and over, through a
/// fresh channel from `make`: one element is a `send` and a `recv` that
/// both succeed at once.
fn channel_turns_case<C: Chan>(id: &str, make: impl Fn() -> C + Send + Sync + 'static) -> Case
where
    C::Tx: Sync,
    C::Rx: Sync,
{
    Case {
        group: "channel",
        id: format!("{id}/turns"),
        set: "turns".to_owned(),
        run: Box::new(move |budget| {
            let (tx, rx) = make().split();
            drive(1, budget, move || {
                assert!(C::send(&tx, black_box(1)));
                black_box(C::recv(&rx));
            })
        }),
    }
}

// ---------------------------------------------------------------------------
// Busy work of a known length.

/// Busy-work iterations per microsecond, measured once.
fn work_per_us() -> u64 {
    static PER_US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PER_US.get_or_init(|| {
        // Best of five: the fastest run is the one least disturbed.
        let n = 1_000_000;
        let best = (0..5)
            .map(|_| {
                let started = Instant::now();
                busy(n);
                started.elapsed()
            })
            .min()
            .expect("five runs");
        ((n as f64 / (best.as_secs_f64() * 1e6)) as u64).max(1)
    })
}

/// One xorshift64 step (`x` nonzero): the bench's busy work and its
/// random draws.
#[inline(always)]
fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// `n` rounds of a dependent xorshift chain.
#[inline(never)]
fn busy(n: u64) -> u64 {
    let mut x = black_box(0x9E37_79B9_7F4A_7C15u64);
    for _ in 0..n {
        x = xorshift(x);
    }
    black_box(x)
}

/// How long one operation works inside and outside the lock.
///
/// `Fixed`: the same lengths every time. Threads that repeat a fixed
/// pattern on two vCPUs fall into step with each other, and which step
/// they settle in decides the row more than what an operation costs: a
/// `parking_lot` `RwLock` behind a wrapper whose only change is an
/// out-of-line read release (`parking_lot_call`) ran `mixed/4` at 137–145
/// ns an operation where the plain forward ran at 110–118 (one-case runs,
/// alternated, most rounds), and at 90–104% of `parking_lot` in paired
/// runs.
/// `Jittered` draws each length from half to one and a half times its
/// nominal (and the `rwlock` mixes' writes 1 in 8 at random) from a
/// per-thread xorshift generator, so no step lasts.
#[derive(Clone, Copy, PartialEq)]
enum Pacing {
    Fixed,
    Jittered,
}

impl Pacing {
    /// The set name's suffix.
    fn suffix(self) -> &'static str {
        match self {
            Self::Fixed => "",
            Self::Jittered => "-jitter",
        }
    }

    /// This operation's (inside, outside) busy lengths, and random bits
    /// for the caller's own draws (0 when fixed).
    #[inline]
    fn draw(self, inside: u64, outside: u64) -> (u64, u64, u64) {
        /// Seeds handed to threads in the order they first draw.
        static SEEDS: AtomicU64 = AtomicU64::new(0);
        thread_local!(static RNG: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });
        if self == Self::Fixed {
            return (inside, outside, 0);
        }
        let r = RNG.with(|rng| {
            let mut x = rng.get();
            if x == 0 {
                // splitmix64 of the thread's number: distinct and nonzero.
                let mut z = SEEDS
                    .fetch_add(1, Ordering::Relaxed)
                    .wrapping_add(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                x = (z ^ (z >> 31)) | 1;
            }
            x = xorshift(x);
            rng.set(x);
            x
        });
        let spread = |nominal: u64, bits: u64| nominal / 2 + bits % nominal.max(1);
        (
            spread(inside, r & 0xFFFF),
            spread(outside, (r >> 16) & 0xFFFF),
            r >> 32,
        )
    }
}

// ---------------------------------------------------------------------------
// The cases.

type Runner = Box<dyn Fn(Budget) -> Outcome>;

/// One implementation in one comparison.
struct Case {
    group: &'static str,
    /// Criterion id, e.g. `subetha/2`.
    id: String,
    /// The comparison it belongs to (its baseline comes first).
    set: String,
    run: Runner,
}

fn lock_case<L: CounterLock>(group: &'static str, id: String, set: &str, threads: usize, lock: L) -> Case {
    let lock = Arc::new(lock);
    Case {
        group,
        id,
        set: set.to_owned(),
        run: Box::new(move |budget| {
            let lock = Arc::clone(&lock);
            drive(threads, budget, move || lock.with(|n| *n += 1))
        }),
    }
}

/// `threads` threads each working `cs` ns under `lock` and `out` ns
/// outside it, paced by `pacing`.
fn paced_work_case<L: CounterLock>(
    group: &'static str,
    id: &str,
    ((cs, out), pacing, threads): ((u64, u64), Pacing, usize),
    lock: Arc<L>,
) -> Case {
    let inside = cs * work_per_us() / 1000;
    let outside = out * work_per_us() / 1000;
    let set = scenario_set((cs, out), pacing, threads);
    Case {
        group,
        id: format!("{id}/{set}"),
        set,
        run: Box::new(move |budget| {
            let lock = Arc::clone(&lock);
            drive(threads, budget, move || {
                let (inside, outside, _) = pacing.draw(inside, outside);
                lock.with(|n| *n = n.wrapping_add(busy(inside)));
                busy(outside);
            })
        }),
    }
}

/// Every 8th operation of a thread in `rwlock` `…/mixed` writes.
const RW_MIXED_WRITE_EVERY: u64 = 8;

/// One thread's operation in a case.
type Op = Box<dyn Fn() + Send + Sync>;

/// The `rwlock` group's cases of one implementation: `read/{1,2,4}`,
/// `write/1` and `mixed/{2,4}`.
fn rwlock_cases<L: CounterRwLock>(id: &str, make: impl Fn(&str) -> L) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |set: String, threads: usize, run: Box<dyn Fn(Arc<L>) -> Op>| {
        let lock = Arc::new(make(&set));
        let run = Arc::new(run);
        cases.push(Case {
            group: "rwlock",
            id: format!("{id}/{set}"),
            set,
            run: Box::new(move |budget| {
                let op: Arc<dyn Fn() + Send + Sync> = Arc::from(run(Arc::clone(&lock)));
                drive(threads, budget, move || op())
            }),
        });
    };
    for threads in [1, 2, 4] {
        add(
            format!("read/{threads}"),
            threads,
            Box::new(|lock| {
                Box::new(move || {
                    black_box(lock.read(|n| *n));
                })
            }),
        );
    }
    add(
        "write/1".to_owned(),
        1,
        Box::new(|lock| Box::new(move || lock.write(|n| *n += 1))),
    );
    let (cs, out) = CONTENDED_WORK_NS;
    let inside = cs * work_per_us() / 1000;
    let outside = out * work_per_us() / 1000;
    for pacing in [Pacing::Fixed, Pacing::Jittered] {
        for threads in [2, 4] {
            add(
                format!("mixed{}/{threads}", pacing.suffix()),
                threads,
                Box::new(move |lock| {
                    // Fixed: each thread's own operation count picks its
                    // writes; jittered: its random bits.
                    thread_local!(static NTH: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });
                    Box::new(move || {
                        let (inside, outside, bits) = pacing.draw(inside, outside);
                        let nth = match pacing {
                            Pacing::Fixed => NTH.with(|n| {
                                n.set(n.get() + 1);
                                n.get()
                            }),
                            Pacing::Jittered => bits,
                        };
                        if nth.is_multiple_of(RW_MIXED_WRITE_EVERY) {
                            lock.write(|n| *n = n.wrapping_add(busy(inside)));
                        } else {
                            black_box(lock.read(|n| n.wrapping_add(busy(inside))));
                        }
                        busy(outside);
                    })
                }),
            );
        }
    }
    cases
}

fn scenario_set((cs, out): (u64, u64), pacing: Pacing, threads: usize) -> String {
    format!("{cs}+{out}ns{}/{threads}", pacing.suffix())
}

/// The adaptive comparison's scenarios besides the hammer: (critical
/// section, work outside) in ns, and pacing.
fn adaptive_scenarios() -> Vec<((u64, u64), Pacing)> {
    if let Ok(spec) = std::env::var("SUBETHA_BENCH_ADAPTIVE") {
        return spec
            .split(',')
            .filter_map(|s| {
                let (cs, out) = s.split_once(':')?;
                Some(((cs.trim().parse().ok()?, out.trim().parse().ok()?), Pacing::Fixed))
            })
            .collect();
    }
    let mut all = vec![
        (CONTENDED_WORK_NS, Pacing::Fixed),
        (CONTENDED_WORK_NS, Pacing::Jittered),
    ];
    all.extend(
        [(500, 500), (2_000, 2_000), (20_000, 20_000), (50_000, 150_000)].map(|work| (work, Pacing::Fixed)),
    );
    all
}

/// The `contended` group's workload besides the hammer: (critical section,
/// work outside), ns.
const CONTENDED_WORK_NS: (u64, u64) = (50, 100);
/// The id of the control rows: the baseline's own type again, in a lock
/// (or channel) allocated on its own. What it reads against the baseline
/// is what this host makes of identical code at another address: on a
/// 2-vCPU VM a hammered lock's paired median moves by several per cent
/// that way, so a row within that distance of the target is not resolved.
const SAME_AGAIN: &str = "same_again";
/// The id of the rows of an [`AdaptiveMutex`] whose budget is pinned at
/// [`FIXED_SPIN_NS`]: classic fixed spin-then-park, what the adaptive
/// policy is up against besides `parking_lot`.
const FIXED_SPIN: &str = "fixed_spin";
/// The budget of the `fixed_spin` variant.
const FIXED_SPIN_NS: u64 = 16_384;

/// An [`AdaptiveMutex`] that polls for [`FIXED_SPIN_NS`] before it parks,
/// its budget pinned so the policy leaves it alone.
fn fixed_spin_mutex(name: &str) -> AdaptiveMutex<u64> {
    let fixed = AdaptiveMutex::named(name, 0);
    let word = PolicyWord::default()
        .with_spin_ns(FIXED_SPIN_NS)
        .with_spin_pinned(true);
    set_policy_word(fixed.instance_id().expect("registered"), word);
    fixed.refresh_policy();
    fixed
}
const CHANNEL_CAPACITY: usize = 1024;
/// The `channel` `…-work` rows' busy work per message on each side, ns
/// (jittered).
const CHANNEL_WORK_NS: u64 = 100;

/// Adaptive locks whose chosen budget the summary reports.
static ADAPTIVE_LOCKS: parking_lot::Mutex<Vec<(String, u32)>> = parking_lot::const_mutex(Vec::new());

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let single = |id: &str| (id.to_owned(), "1".to_owned());
    for (id, set) in [
        single("parking_lot"),
        single("unobserved"),
        single("subetha"),
        single("adaptive"),
    ] {
        let case = match id.as_str() {
            "parking_lot" => lock_case("uncontended", id, &set, 1, parking_lot::Mutex::new(0)),
            "unobserved" => lock_case("uncontended", id, &set, 1, Mutex::unobserved(0)),
            "subetha" => lock_case("uncontended", id, &set, 1, Mutex::named("bench_uncontended", 0)),
            _ => lock_case(
                "uncontended",
                id,
                &set,
                1,
                AdaptiveMutex::named("bench_uncontended_adaptive", 0),
            ),
        };
        cases.push(case);
    }
    for threads in [2, 4] {
        // The hammer: an empty critical section and nothing outside it.
        let set = format!("hammer/{threads}");
        cases.push(lock_case(
            "contended",
            format!("parking_lot/{set}"),
            &set,
            threads,
            parking_lot::Mutex::new(0),
        ));
        // The control: the baseline's own code in a lock of its own, so the
        // table shows what identical code reads against the baseline.
        cases.push(lock_case(
            "contended",
            format!("{SAME_AGAIN}/{set}"),
            &set,
            threads,
            parking_lot::Mutex::new(0),
        ));
        cases.push(lock_case(
            "contended",
            format!("subetha/{set}"),
            &set,
            threads,
            Mutex::named(&format!("bench_contended_{threads}"), 0),
        ));
        cases.push(lock_case(
            "contended",
            format!("unobserved/{set}"),
            &set,
            threads,
            Mutex::unobserved(0),
        ));
        cases.push(lock_case(
            "contended",
            format!("adaptive/{set}"),
            &set,
            threads,
            AdaptiveMutex::named(&format!("bench_contended_adaptive_{threads}"), 0),
        ));
        // Some work: a short critical section and twice that outside.
        let work = CONTENDED_WORK_NS;
        for pacing in [Pacing::Fixed, Pacing::Jittered] {
            let tag = format!("{threads}{}", pacing.suffix());
            let (group, args) = ("contended", (work, pacing, threads));
            let pl = Arc::new(parking_lot::Mutex::new(0));
            cases.push(paced_work_case(group, "parking_lot", args, pl));
            let again = Arc::new(parking_lot::Mutex::new(0));
            cases.push(paced_work_case(group, SAME_AGAIN, args, again));
            let plain = Arc::new(Mutex::named(&format!("bench_contended_work_{tag}"), 0));
            cases.push(paced_work_case(group, "subetha", args, plain));
            let unobserved = Arc::new(Mutex::unobserved(0));
            cases.push(paced_work_case(group, "unobserved", args, unobserved));
            let adaptive = AdaptiveMutex::named(&format!("bench_contended_work_adaptive_{tag}"), 0);
            cases.push(paced_work_case(group, "adaptive", args, Arc::new(adaptive)));
        }
    }
    cases.extend(rwlock_cases("parking_lot", |_| parking_lot::RwLock::new(0)));
    cases.extend(rwlock_cases(SAME_AGAIN, |_| parking_lot::RwLock::new(0)));
    cases.extend(rwlock_cases("subetha", |set| {
        RwLock::named(&format!("bench_rwlock_{set}"), 0)
    }));
    cases.extend(rwlock_cases("unobserved", |_| RwLock::unobserved(0)));
    cases.extend(rwlock_cases("parking_lot_call", |_| {
        lock_api::RwLock::<CallReleaseRwLock, u64>::new(0)
    }));
    // One thread sending and receiving in turn: each operation's own cost,
    // with no blocking regime to swing the two-thread rows.
    cases.push(channel_turns_case("crossbeam", || {
        crossbeam_channel::bounded::<u64>(CHANNEL_CAPACITY)
    }));
    cases.push(channel_turns_case("subetha", || {
        Channel::<u64>::named("bench_channel_turns", CHANNEL_CAPACITY)
    }));
    let shapes = [("spsc", (1, 1)), ("mpmc", (2, 2))];
    let workloads = [("", None), ("-work", Some((CHANNEL_WORK_NS, Pacing::Jittered)))];
    for ((shape, threads), (suffix, work)) in shapes.into_iter().flat_map(|s| workloads.map(|w| (s, w))) {
        let set = format!("{shape}{suffix}");
        let case = |id: &str, run: Runner| Case {
            group: "channel",
            id: format!("{id}/{set}"),
            set: set.clone(),
            run,
        };
        // The baseline, then its control.
        for id in ["crossbeam", SAME_AGAIN] {
            cases.push(case(
                id,
                Box::new(move |budget| {
                    drive_channel(threads, work, budget, || {
                        crossbeam_channel::bounded::<u64>(CHANNEL_CAPACITY)
                    })
                }),
            ));
        }
        let name = format!("bench_channel_{set}");
        cases.push(case(
            "subetha",
            Box::new(move |budget| {
                drive_channel(threads, work, budget, || {
                    Channel::<u64>::named(&name, CHANNEL_CAPACITY)
                })
            }),
        ));
        cases.push(case(
            "unobserved",
            Box::new(move |budget| {
                drive_channel(threads, work, budget, || {
                    Channel::<u64>::unobserved(CHANNEL_CAPACITY)
                })
            }),
        ));
    }
    // The policy against fixed spinning: a group of its own, so the
    // spinning rows do not share rounds with the `contended` group's.
    let group = "adaptive";
    for threads in [2, 4] {
        let set = format!("hammer/{threads}");
        let case = |id: &str| format!("{id}/{set}");
        let pl = parking_lot::Mutex::new(0);
        cases.push(lock_case(group, case("parking_lot"), &set, threads, pl));
        let plain = Mutex::named(&format!("bench_plain_hammer_{threads}"), 0);
        cases.push(lock_case(group, case("subetha"), &set, threads, plain));
        let adaptive = AdaptiveMutex::named(&format!("bench_adaptive_hammer_{threads}"), 0);
        ADAPTIVE_LOCKS
            .lock()
            .push((set.clone(), adaptive.instance_id().expect("registered")));
        cases.push(lock_case(group, case("adaptive"), &set, threads, adaptive));
        let fixed = fixed_spin_mutex(&format!("bench_fixed_hammer_{threads}"));
        cases.push(lock_case(group, case(FIXED_SPIN), &set, threads, fixed));
    }
    for (scenario, pacing) in adaptive_scenarios() {
        for threads in [2, 4] {
            let tag = format!("{}_{}_{threads}{}", scenario.0, scenario.1, pacing.suffix());
            let args = (scenario, pacing, threads);
            let pl = Arc::new(parking_lot::Mutex::new(0));
            cases.push(paced_work_case(group, "parking_lot", args, pl));
            let plain = Arc::new(Mutex::named(&format!("bench_plain_{tag}"), 0));
            cases.push(paced_work_case(group, "subetha", args, plain));
            let adaptive = AdaptiveMutex::named(&format!("bench_adaptive_{tag}"), 0);
            ADAPTIVE_LOCKS.lock().push((
                scenario_set(scenario, pacing, threads),
                adaptive.instance_id().expect("registered"),
            ));
            cases.push(paced_work_case(group, "adaptive", args, Arc::new(adaptive)));
            let fixed = fixed_spin_mutex(&format!("bench_fixed_{tag}"));
            cases.push(paced_work_case(group, FIXED_SPIN, args, Arc::new(fixed)));
        }
    }
    cases
}

// ---------------------------------------------------------------------------
// Pass 1: criterion.

/// Short runs: asked for, or the bench built as a test (`cargo test
/// --all-targets` runs it without `--bench`, as a smoke test).
fn quick() -> bool {
    std::env::var("SUBETHA_BENCH_QUICK").is_ok_and(|v| v == "1") || !std::env::args().any(|a| a == "--bench")
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn criterion_pass(cases: &[Case]) {
    let mut c = Criterion::default().configure_from_args();
    for group_name in ["uncontended", "contended", "rwlock", "channel", "adaptive"] {
        let mut group = c.benchmark_group(group_name);
        if quick() {
            group
                .warm_up_time(Duration::from_millis(300))
                .measurement_time(Duration::from_millis(700))
                .sample_size(10);
        } else {
            group
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(3))
                .sample_size(if group_name == "adaptive" { 10 } else { 20 });
        }
        group.throughput(Throughput::Elements(1));
        for case in cases.iter().filter(|c| c.group == group_name) {
            group.bench_function(&case.id, |b| {
                b.iter_custom(|iters| (case.run)(Budget::Ops(iters)).1)
            });
        }
        group.finish();
    }
    c.final_summary();
}

// ---------------------------------------------------------------------------
// Pass 2: interleaved comparison.

struct Row {
    group: &'static str,
    id: String,
    ns_per_op: f64,
    /// Median process CPU time (all threads, sidecar included) per op.
    cpu_ns_per_op: f64,
    /// Whether this row is its comparison's baseline.
    is_baseline: bool,
    /// Baseline ns / this ns over the rounds.
    ratio: RatioSummary,
    /// Rounds the comparison ran.
    rounds: u64,
}

/// Whether a row is judged against [`THROUGHPUT_TARGET`]: the contended,
/// `rwlock` and channel rows but the baselines and the one-thread rows
/// (those are judged by the "+5 ns", in the criterion pass).
fn judged(group: &str, id: &str, is_baseline: bool) -> bool {
    let one_thread = group == "rwlock" && id.ends_with("/1");
    matches!(group, "contended" | "rwlock" | "channel") && !is_baseline && !one_thread
}

/// Member `i`'s throughput relative to the baseline's (member 0), round
/// by round: baseline ns / member ns.
fn paired_ratios(ns: &[Vec<f64>], i: usize) -> Vec<f64> {
    ns[0].iter().zip(&ns[i]).map(|(b, x)| b / x).collect()
}

/// Whether some judged member's paired interval, after the rounds in
/// `ns`, still spans the target. Such a comparison runs more rounds: a
/// verdict is only as good as its interval, and on this VM 200 rounds
/// leave a median of about ±3%.
fn undecided(members: &[&Case], ns: &[Vec<f64>]) -> bool {
    members.iter().enumerate().skip(1).any(|(i, case)| {
        judged(case.group, &case.id, false) && {
            RatioSummary::of(paired_ratios(ns, i)).verdict(THROUGHPUT_TARGET) == SPANS
        }
    })
}

/// The throughput target for the contended and channel rows: 95%
/// of the wrapped type's.
const THROUGHPUT_TARGET: f64 = 0.95;

fn interleaved(cases: &[Case], filter: Option<&str>) -> Vec<Row> {
    let (rounds, slice) = if quick() {
        (3, Duration::from_millis(100))
    } else {
        (
            env_u64("SUBETHA_BENCH_ROUNDS", 200),
            Duration::from_millis(env_u64("SUBETHA_BENCH_SLICE_MS", 10)),
        )
    };
    let max_rounds = if quick() {
        rounds
    } else {
        env_u64("SUBETHA_BENCH_MAX_ROUNDS", 5 * rounds).max(rounds)
    };
    let mut rows = Vec::new();
    let mut sets: Vec<(&str, &str)> = Vec::new();
    for case in cases {
        if !sets.contains(&(case.group, case.set.as_str())) {
            sets.push((case.group, &case.set));
        }
    }
    for (group, set) in sets {
        let members: Vec<&Case> = cases
            .iter()
            .filter(|c| c.group == group && c.set == set)
            .collect();
        if filter.is_some_and(|f| {
            !members
                .iter()
                .any(|c| format!("{}/{}", c.group, c.id).contains(f))
        }) {
            continue;
        }
        eprintln!("interleaved: {group} {set} ({} rounds of {slice:?} each)", rounds);
        // Warm-up: one slice each (the adaptive policy gets to decide).
        for case in &members {
            (case.run)(Budget::Time(slice));
        }
        let mut ns: Vec<Vec<f64>> = vec![Vec::new(); members.len()];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); members.len()];
        let mut order: Vec<usize> = (0..members.len()).collect();
        let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
        let mut round = 0;
        while round < rounds || (round < max_rounds && undecided(&members, &ns)) {
            if round == rounds {
                eprintln!(
                    "  {group} {set}: a judged row's interval spans the target; more rounds, up to {max_rounds}"
                );
            }
            round += 1;
            // A new order every round, so no member always runs first or
            // always follows the same neighbour: with a rotation, whatever
            // one member leaves behind (a backlog for the sidecar to
            // drain, a cache or frequency state) always fell on the next.
            for k in (1..order.len()).rev() {
                rng = xorshift(rng);
                order.swap(k, (rng % (k as u64 + 1)) as usize);
            }
            for &i in &order {
                let cpu_before = process_cpu_ns();
                let (ops, elapsed) = (members[i].run)(Budget::Time(slice));
                let cpu_used = process_cpu_ns().saturating_sub(cpu_before);
                ns[i].push(elapsed.as_nanos() as f64 / ops.max(1) as f64);
                cpu[i].push(cpu_used as f64 / ops.max(1) as f64);
            }
        }
        for (i, case) in members.iter().enumerate() {
            rows.push(Row {
                group,
                id: case.id.clone(),
                ns_per_op: median(&mut ns[i].clone()),
                cpu_ns_per_op: median(&mut cpu[i].clone()),
                is_baseline: i == 0,
                ratio: RatioSummary::of(paired_ratios(&ns, i)),
                rounds: round,
            });
        }
    }
    rows
}

/// User + system CPU time of the whole process, ns.
fn process_cpu_ns() -> u64 {
    // SAFETY: `rusage` is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

fn summary(rows: &[Row], started: Instant, load_before: &str) {
    let mut out = String::from(
        "group        implementation/case            wall ns/op  CPU ns/op  thrpt vs baseline: median (95% CI) [min–max]  vs 95%\n",
    );
    for row in rows {
        let r = &row.ratio;
        let judged = judged(row.group, &row.id, row.is_baseline);
        out.push_str(&format!(
            "{:<12} {:<30} {:>10.1} {:>10.1}  {:>6.1}% ({:.1}–{:.1}%) [{:.1}–{:.1}%]  {}{}\n",
            row.group,
            row.id,
            row.ns_per_op,
            row.cpu_ns_per_op,
            100.0 * r.median,
            100.0 * r.ci.0,
            100.0 * r.ci.1,
            100.0 * r.min,
            100.0 * r.max,
            if judged { r.verdict(THROUGHPUT_TARGET) } else { "" },
            if row.is_baseline {
                format!("  {} rounds", row.rounds)
            } else {
                String::new()
            },
        ));
    }
    out.push_str(
        "(medians over the rounds; CPU = the whole process's user+system time per element, sidecar included;\n \
         throughput ratio paired per round against the first row of each comparison, parking_lot or crossbeam;\n \
         >100% = faster; the verdict compares the median's 95% interval with the issue's 95% target;\n \
         a comparison with an undecided verdict runs more rounds, up to SUBETHA_BENCH_MAX_ROUNDS, and its baseline row says how many)\n",
    );
    for (set, id) in ADAPTIVE_LOCKS.lock().iter() {
        let word = PolicyWord(policy_word(*id).unwrap_or(0));
        out.push_str(&format!(
            "adaptive {set}: budget chosen by the policy: {}\n",
            if word.spin_yields() {
                "none: waits like a plain Mutex (Y)".to_owned()
            } else {
                word.spin_ns()
                    .map_or("unset (default)".to_owned(), |ns| format!("{ns} ns"))
            }
        ));
    }
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load3 = |s: &str| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    out.push_str(&format!(
        "cpus {cpus}; loadavg before {} after {}; wall time {:.0} s; busy work {} iterations/µs\n",
        load3(load_before),
        load3(&load),
        started.elapsed().as_secs_f64(),
        work_per_us()
    ));
    println!("\n{out}");
    let dir = target_dir().join("subetha-bench");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join("primitives.txt"), &out);
    }
}

/// `SUBETHA_BENCH_ONLY=<group>/<id>`: runs just that case, for
/// `SUBETHA_BENCH_SLICE_MS` (default 2000 here) after one warm-up slice,
/// and prints its ns per element and, for every instrumented lock with
/// contended acquisitions, the waits the sidecar recorded, and how many
/// observations the sidecar drained and the rings dropped; for profilers
/// (`perf record`, `strace -c`).
fn profile_one(cases: &[Case], only: &str) {
    let Some(case) = cases.iter().find(|c| format!("{}/{}", c.group, c.id) == only) else {
        let ids: Vec<String> = cases.iter().map(|c| format!("{}/{}", c.group, c.id)).collect();
        eprintln!(
            "SUBETHA_BENCH_ONLY={only}: no such case; one of:\n  {}",
            ids.join("\n  ")
        );
        std::process::exit(2);
    };
    let slice = Duration::from_millis(env_u64("SUBETHA_BENCH_SLICE_MS", 2000));
    (case.run)(Budget::Time(Duration::from_millis(100)));
    let totals = || {
        subetha_core::process_sidecar().map(|sidecar| {
            sidecar.scan_now();
            sidecar.snapshot().totals
        })
    };
    let before = totals();
    let cpu_before = process_cpu_ns();
    let (ops, elapsed) = (case.run)(Budget::Time(slice));
    let cpu = process_cpu_ns().saturating_sub(cpu_before);
    if let (Some(before), Some(after)) = (before, totals()) {
        println!(
            "  sidecar: {} observations drained, {} dropped in the rings",
            after.drained - before.drained,
            after.dropped - before.dropped
        );
    }
    if let Some(sidecar) = subetha_core::process_sidecar() {
        sidecar.scan_now();
        let cal = subetha_core::clock::calibration();
        for r in sidecar
            .snapshot()
            .instances
            .iter()
            .filter(|r| r.stats.total_ops() > 0)
        {
            // Every op the instance saw, by its name: for a wait-timed op
            // (`lock`, `read`, `send` …) the latency is its waits, for a
            // hold-timed one (`unlock`, `read_unlock` …) its sampled holds.
            for (op, stats) in r.stats.ops_by_kind() {
                if stats.ops() == 0 {
                    continue;
                }
                let q = |x| {
                    stats
                        .latency()
                        .map_or(0, |h| cal.ticks_to_ns(h.value_at_quantile(x)))
                };
                println!(
                    "  {} {}: {} ops, {} contended, {} timed: p50 {} p90 {} p99 {} ns",
                    r.meta.name,
                    r.meta.op_name(op),
                    stats.ops(),
                    stats.contended(),
                    stats.latency().map_or(0, |h| h.count()),
                    q(0.5),
                    q(0.9),
                    q(0.99)
                );
            }
            if matches!(r.meta.kind_name.as_str(), "mutex" | "adaptive_mutex") {
                let word = PolicyWord(policy_word(r.meta.id).unwrap_or(0));
                println!(
                    "  {}: policy: spin {:?} ns, yields {}",
                    r.meta.name,
                    word.spin_ns(),
                    word.spin_yields()
                );
            }
        }
    }
    println!(
        "{only}: {:.1} ns/op wall, {:.1} ns/op CPU ({ops} ops in {elapsed:?})",
        elapsed.as_nanos() as f64 / ops.max(1) as f64,
        cpu as f64 / ops.max(1) as f64
    );
}

fn main() {
    // The sidecar drains and runs the adaptive policy; `always` keeps an
    // agent on the host from taking the segment over mid-run.
    subetha_core::set_sidecar_mode(SidecarMode::Always);
    subetha_core::process_segment().expect("process segment");
    let started = Instant::now();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    work_per_us();
    let cases = cases();
    if let Ok(only) = std::env::var("SUBETHA_BENCH_ONLY") {
        profile_one(&cases, &only);
        return;
    }
    if std::env::var("SUBETHA_BENCH_CRITERION").map_or(true, |v| v != "0") {
        criterion_pass(&cases);
    }
    // The filter criterion was given (first argument that is not a flag).
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let rows = interleaved(&cases, filter.as_deref());
    summary(&rows, started, &load_before);
}
