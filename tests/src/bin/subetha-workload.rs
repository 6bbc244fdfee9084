//! `subetha-workload`: instrumented processes for the agent's multi-process
//! tests, each printing exact ground truth. The protocol is documented in
//! `subetha_tests::agent` (the test side); in short, the first argument is
//! the role:
//!
//! * `run [--threads N] [--rate OPS] [--burst N] [--burst-every-ms MS]
//!   [--churn K] [--churn-ops N] [--hold]`: worker threads observe three instances;
//!   worker 0 optionally bursts; a churn thread optionally keeps spawning
//!   batches of K short-lived observing threads. Prints `ready <pid>` once
//!   the segment exists, then obeys `go`, `progress`, `pause`, `resume`,
//!   `stop` on stdin (one reply line each). `pause` parks every thread at a
//!   quiescent point (no `observe` in flight) and answers the exact counts.
//!   `--hold` prints `hold <pid>` before creating the segment and creates
//!   it (answering `ok <pid>`) on `register`.
//! * `idle --threads N`: N threads observe once each and park.
//! * `many --instances N --threads T --per-instance K`: registers N
//!   instances, T threads observe each of their share K times with varying
//!   latencies, then park.
//! * `hostile [--uninit | --max-geometry]`: publishes hand-made `memfd:subetha` segments, some
//!   invalid, some valid with corrupt contents (see `hostile`), and prints
//!   one `seg <case> <fd>` line each, then `ready <pid>`. `--uninit` makes
//!   only one segment whose magic is not yet written; `publish` writes it.
//!   `--max-geometry [--segments N]` makes N valid segments of the largest
//!   geometry a consumer accepts, with high-water marks at `u32::MAX`.
//!   `--liars` makes only segments whose header lies about one part of the
//!   creator's identity (`other_pid`, `other_pid_ns`, `other_start_time`,
//!   `other_uid`) and one that tells the truth (`truthful`, one instance
//!   `truthful-a`), for namespace tests.
//!
//! * `sites [--holds N] [--hold-us U]`: one `subetha_core::Mutex`
//!   (`contention_demo`, every hold sampled) taken at two call sites: a
//!   holder thread holds it U µs (default 1000) N times (default 200); the
//!   main thread takes it briefly in between and measures each `lock()`.
//!   Prints `ready <pid> <waiter_line> <holder_line>`, runs on `go`
//!   (answering `ok`), drops the mutex, answers `truth` with
//!   `ok <waiter_wait_ns> <waiter_locks>`, then parks.
//!
//! Truth lines are `ok <attempted> <queued> <dropped> <lost> <threads>
//! <bursts>`: every `observe` call, and what each returned (queued, ring
//! full, no ring), over the whole process.
//!
//! Parked roles exit when stdin closes.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use subetha_core::{Instance, InstanceKind, Observation};

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let role = args.first().cloned().unwrap_or_default();
    let opts = Opts(args.get(1..).unwrap_or_default().to_vec());
    match role.as_str() {
        "run" => run(&opts),
        "idle" => idle(&opts),
        "many" => many(&opts),
        "hostile" => hostile::main(&opts),
        "sites" => sites(&opts),
        other => {
            eprintln!("subetha-workload: unknown role {other:?} (run, idle, many, hostile)");
            std::process::exit(2);
        }
    }
}

/// The `sites` role (see the module docs).
fn sites(opts: &Opts) {
    let holds = opts.num("holds", 200);
    let hold = Duration::from_micros(opts.num("hold-us", 1000));
    let m = Arc::new(subetha_core::Mutex::named("contention_demo", 0u64));
    let id = m.instance_id().expect("registered");
    // Every hold sampled: every holder's call site is known.
    let word = subetha_core::PolicyWord::default().with_sample_every(1);
    assert!(subetha_core::primitives::set_policy_word(id, word));
    m.refresh_policy();
    let (waiter_line, holder_line) = (line!() + 27, line!() + 15);
    reply(&format!(
        "ready {} {waiter_line} {holder_line}",
        std::process::id()
    ));
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line).is_ok_and(|n| n > 0) && line.trim() != "go" {
        line.clear();
    }
    reply("ok");
    let done = Arc::new(AtomicBool::new(false));
    let holder = {
        let (m, done) = (Arc::clone(&m), Arc::clone(&done));
        std::thread::spawn(move || {
            for _ in 0..holds {
                let mut guard = m.lock();
                *guard += 1;
                std::thread::sleep(hold);
                drop(guard);
                std::thread::sleep(hold / 4);
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let (mut waited, mut locks) = (Duration::ZERO, 0u64);
    while !done.load(Ordering::SeqCst) {
        let start = Instant::now();
        let mut guard = m.lock();
        waited += start.elapsed();
        *guard += 1;
        drop(guard);
        locks += 1;
        std::thread::sleep(hold / 5);
    }
    holder.join().expect("holder");
    drop(m);
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line).is_ok_and(|n| n > 0) && line.trim() != "truth" {
        line.clear();
    }
    reply(&format!("ok {} {locks}", waited.as_nanos()));
    park_until_stdin_closes();
}

/// `--name value` options.
struct Opts(Vec<String>);

impl Opts {
    fn num(&self, name: &str, default: u64) -> u64 {
        let flag = format!("--{name}");
        match self.0.iter().position(|a| *a == flag) {
            Some(i) => self
                .0
                .get(i + 1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} needs a number")),
            None => default,
        }
    }

    fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| *a == format!("--{name}"))
    }
}

fn reply(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .expect("stdout");
}

/// Blocks until stdin closes (the test dropped its end).
fn park_until_stdin_closes() {
    let mut sink = String::new();
    while std::io::stdin().lock().read_line(&mut sink).is_ok_and(|n| n > 0) {
        sink.clear();
    }
}

/// What `observe` calls returned, per thread (no shared cache line).
#[derive(Default)]
#[repr(align(128))]
struct Counts {
    attempted: AtomicU64,
    queued: AtomicU64,
    dropped: AtomicU64,
    lost: AtomicU64,
}

impl Counts {
    fn observe(&self, instance: &Instance, op: u16, flags: u16, latency: u64) {
        self.attempted.fetch_add(1, Ordering::Relaxed);
        let counter = match instance.observe(op, flags, latency) {
            Ok(true) => &self.queued,
            Ok(false) => &self.dropped,
            Err(_) => &self.lost,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn add_to(&self, sum: &mut [u64; 4]) {
        sum[0] += self.attempted.load(Ordering::Relaxed);
        sum[1] += self.queued.load(Ordering::Relaxed);
        sum[2] += self.dropped.load(Ordering::Relaxed);
        sum[3] += self.lost.load(Ordering::Relaxed);
    }
}

struct Shared {
    orders: Instance,
    cache: Instance,
    jobs: Instance,
    /// One per worker, then one for the churn threads.
    counts: Vec<Counts>,
    threads_spawned: AtomicU64,
    bursts: AtomicU64,
    stop: AtomicBool,
    pause_requested: AtomicBool,
    /// Threads parked at the pause point.
    parked: Mutex<usize>,
    parked_changed: Condvar,
    resumed: Condvar,
}

impl Shared {
    /// Parks at the pause point while a pause is requested.
    fn pause_point(&self) {
        if !self.pause_requested.load(Ordering::Acquire) {
            return;
        }
        let mut parked = self.parked.lock().unwrap();
        *parked += 1;
        self.parked_changed.notify_all();
        while self.pause_requested.load(Ordering::Acquire) {
            parked = self.resumed.wait(parked).unwrap();
        }
        *parked -= 1;
    }

    /// One unit of work: a lock (sometimes contended, with a latency), a
    /// try_lock (sometimes a miss), a channel send or receive.
    fn work_once(&self, counts: &Counts, seq: u64) {
        if seq.is_multiple_of(8) {
            counts.observe(&self.orders, 1, Observation::FLAG_CONTENDED, 100 + seq % 5000);
        } else {
            counts.observe(&self.orders, 1, 0, 0);
        }
        let miss = if seq.is_multiple_of(3) {
            Observation::FLAG_MISS
        } else {
            0
        };
        counts.observe(&self.cache, 2, miss, 0);
        counts.observe(&self.jobs, 1 + (seq % 4) as u16, 0, seq % 7);
    }

    fn truth(&self) -> String {
        let mut sum = [0u64; 4];
        for counts in &self.counts {
            counts.add_to(&mut sum);
        }
        format!(
            "ok {} {} {} {} {} {}",
            sum[0],
            sum[1],
            sum[2],
            sum[3],
            self.threads_spawned.load(Ordering::Relaxed),
            self.bursts.load(Ordering::Relaxed)
        )
    }
}

struct RunOpts {
    threads: usize,
    rate: u64,
    burst: u64,
    burst_every: Duration,
    churn: usize,
    churn_ops: u64,
}

fn worker(shared: &Shared, index: usize, opts: &RunOpts) {
    let counts = &shared.counts[index];
    // Work in 1 ms slices of `rate / 1000` units (0: no pause at all).
    let per_slice = (opts.rate / 1000).max(1);
    let mut seq = 0u64;
    let mut next_burst = Instant::now() + opts.burst_every / 2;
    let mut next_slice = Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        shared.pause_point();
        for _ in 0..per_slice {
            shared.work_once(counts, seq);
            seq += 1;
        }
        if opts.burst > 0 && index == 0 && Instant::now() >= next_burst {
            // Far more than a ring holds, as fast as the producer can go.
            for _ in 0..opts.burst {
                counts.observe(&shared.orders, 1, 0, 0);
            }
            shared.bursts.fetch_add(1, Ordering::Relaxed);
            next_burst = Instant::now() + opts.burst_every;
        }
        if opts.rate > 0 {
            next_slice += Duration::from_millis(1);
            let now = Instant::now();
            if next_slice > now {
                std::thread::sleep(next_slice - now);
            } else if now - next_slice > Duration::from_millis(50) {
                next_slice = now;
            }
        }
    }
}

fn churn(shared: &Arc<Shared>, opts: &RunOpts) {
    let counts_index = opts.threads;
    let mut generation = 0u64;
    while !shared.stop.load(Ordering::Acquire) {
        shared.pause_point();
        let batch: Vec<_> = (0..opts.churn)
            .map(|i| {
                let shared = Arc::clone(shared);
                let ops = opts.churn_ops;
                std::thread::Builder::new()
                    .name(format!("short-{generation}-{i}"))
                    .spawn(move || {
                        for seq in 0..ops {
                            shared.work_once(&shared.counts[counts_index], seq);
                        }
                    })
                    .expect("spawn a short-lived thread")
            })
            .collect();
        for handle in batch {
            handle.join().expect("short-lived thread");
        }
        shared
            .threads_spawned
            .fetch_add(opts.churn as u64, Ordering::Relaxed);
        generation += 1;
    }
}

fn run(opts: &Opts) {
    let run_opts = Arc::new(RunOpts {
        threads: opts.num("threads", 4) as usize,
        rate: opts.num("rate", 20_000),
        burst: opts.num("burst", 0),
        burst_every: Duration::from_millis(opts.num("burst-every-ms", 100)),
        churn: opts.num("churn", 0) as usize,
        churn_ops: opts.num("churn-ops", 20),
    });
    let hold = opts.flag("hold");
    if hold {
        // No segment yet: the test starts an agent first, then says when.
        reply(&format!("hold {}", std::process::id()));
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).expect("stdin");
        assert_eq!(line.trim(), "register", "expected `register`");
    }
    let shared = Arc::new(Shared {
        orders: Instance::register(MUTEX, "orders_lock").expect("register"),
        cache: Instance::register(MUTEX, "cache_lock").expect("register"),
        jobs: Instance::register(CHANNEL, "jobs").expect("register"),
        counts: (0..=run_opts.threads).map(|_| Counts::default()).collect(),
        threads_spawned: AtomicU64::new(0),
        bursts: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        pause_requested: AtomicBool::new(false),
        parked: Mutex::new(0),
        parked_changed: Condvar::new(),
        resumed: Condvar::new(),
    });
    reply(&format!(
        "{} {}",
        if hold { "ok" } else { "ready" },
        std::process::id()
    ));
    let mut handles = Vec::new();
    let participants = run_opts.threads + usize::from(run_opts.churn > 0);
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "go" if handles.is_empty() => {
                for index in 0..run_opts.threads {
                    let (shared, o) = (Arc::clone(&shared), Arc::clone(&run_opts));
                    handles.push(
                        std::thread::Builder::new()
                            .name(format!("worker-{index}"))
                            .spawn(move || worker(&shared, index, &o))
                            .expect("spawn a worker"),
                    );
                }
                shared
                    .threads_spawned
                    .fetch_add(run_opts.threads as u64, Ordering::Relaxed);
                if run_opts.churn > 0 {
                    let (shared, o) = (Arc::clone(&shared), Arc::clone(&run_opts));
                    handles.push(
                        std::thread::Builder::new()
                            .name("churn".into())
                            .spawn(move || churn(&shared, &o))
                            .expect("spawn the churn thread"),
                    );
                }
                reply("ok");
            }
            "progress" => reply(&shared.truth()),
            "pause" => {
                shared.pause_requested.store(true, Ordering::Release);
                let mut parked = shared.parked.lock().unwrap();
                while *parked < participants.min(handles.len()) {
                    parked = shared.parked_changed.wait(parked).unwrap();
                }
                drop(parked);
                reply(&shared.truth());
            }
            "resume" => {
                let _parked = shared.parked.lock().unwrap();
                shared.pause_requested.store(false, Ordering::Release);
                shared.resumed.notify_all();
                reply("ok");
            }
            "stop" => {
                shared.stop.store(true, Ordering::Release);
                {
                    let _parked = shared.parked.lock().unwrap();
                    shared.pause_requested.store(false, Ordering::Release);
                    shared.resumed.notify_all();
                }
                for handle in handles.drain(..) {
                    handle.join().expect("worker");
                }
                reply(&shared.truth());
                return;
            }
            other => reply(&format!("err unknown command {other:?}")),
        }
    }
}

/// Parks until the barrier is released (stdin closes).
struct Gate {
    open: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            open: Mutex::new(false),
            changed: Condvar::new(),
        })
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.changed.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.changed.notify_all();
    }
}

fn idle(opts: &Opts) {
    let threads = opts.num("threads", 100);
    let instance = Arc::new(Instance::register(MUTEX, "idle").expect("register"));
    let counts = Arc::new(Counts::default());
    let gate = Gate::new();
    let (observed_tx, observed_rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (instance, counts, gate, tx) = (
                Arc::clone(&instance),
                Arc::clone(&counts),
                Arc::clone(&gate),
                observed_tx.clone(),
            );
            std::thread::Builder::new()
                .name(format!("idle-{i}"))
                .spawn(move || {
                    counts.observe(&instance, 1, 0, 0);
                    tx.send(()).expect("main waits");
                    gate.wait();
                })
                .expect("spawn")
        })
        .collect();
    for _ in 0..threads {
        observed_rx.recv().expect("every thread observed");
    }
    let mut sum = [0; 4];
    counts.add_to(&mut sum);
    reply(&format!(
        "ready {} {} {} {} {}",
        std::process::id(),
        sum[0],
        sum[1],
        sum[2],
        sum[3]
    ));
    park_until_stdin_closes();
    gate.open();
    for handle in handles {
        let _ = handle.join();
    }
}

fn many(opts: &Opts) {
    let instances = opts.num("instances", 1000) as usize;
    let threads = opts.num("threads", 8) as usize;
    let per_instance = opts.num("per-instance", 32);
    let registered: Arc<Vec<Instance>> = Arc::new(
        (0..instances)
            .map(|i| Instance::register(MUTEX, &format!("many-{i:04}")).expect("register"))
            .collect(),
    );
    let counts: Arc<Vec<Counts>> = Arc::new((0..threads).map(|_| Counts::default()).collect());
    let gate = Gate::new();
    let (observed_tx, observed_rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (registered, counts, gate, tx) = (
                Arc::clone(&registered),
                Arc::clone(&counts),
                Arc::clone(&gate),
                observed_tx.clone(),
            );
            std::thread::Builder::new()
                .name(format!("many-{t}"))
                .spawn(move || {
                    for (i, instance) in registered.iter().enumerate().skip(t).step_by(threads) {
                        for k in 0..per_instance {
                            let op = 1 + (k % 3) as u16;
                            let flags = if k % 4 == 0 {
                                Observation::FLAG_CONTENDED
                            } else {
                                0
                            };
                            // Latencies spread over five decades.
                            let latency = 10 + (i as u64 * 7919 + k * 104_729) % 10_000_000;
                            counts[t].observe(instance, op, flags, latency);
                        }
                    }
                    tx.send(()).expect("main waits");
                    gate.wait();
                })
                .expect("spawn")
        })
        .collect();
    for _ in 0..threads {
        observed_rx.recv().expect("every thread observed");
    }
    let mut sum = [0; 4];
    for c in counts.iter() {
        c.add_to(&mut sum);
    }
    reply(&format!(
        "ready {} {} {} {} {}",
        std::process::id(),
        sum[0],
        sum[1],
        sum[2],
        sum[3]
    ));
    park_until_stdin_closes();
    gate.open();
    for handle in handles {
        let _ = handle.join();
    }
}

/// Hand-made segments, each a `memfd:subetha` kept open in this process.
mod hostile {
    use std::mem::offset_of;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use subetha_core::registry::register_instance;
    use subetha_core::segment::{RingSlot, SegmentLayout, slot_state};
    use subetha_core::{Observation, ObservationRing, Segment, SegmentConfig, SegmentView};

    use super::{MUTEX, Opts, park_until_stdin_closes, reply};

    /// Observations in the valid segment's ring: 1000 op 1, 200 op 2
    /// contended with latency 500.
    pub const VALID_OPS: (u64, u64) = (1000, 200);

    fn small() -> Segment {
        Segment::create(SegmentConfig {
            instances: 8,
            ring_slots: 4,
        })
        .expect("create a segment")
    }

    /// Writes `value` at byte `offset` of the segment's header.
    fn poke_u32(view: &SegmentView, offset: usize, value: u32) {
        // SAFETY: `offset` comes from offset_of! on the 128-byte layout at
        // the start of the header page, which this process maps read-write
        // and owns; the field is 4-aligned. Other readers of the shared
        // memory read it atomically or by copying, as hostile input.
        unsafe { (*((view.base_addr() + offset) as *const AtomicU32)).store(value, Ordering::Release) }
    }

    fn poke_u64(view: &SegmentView, offset: usize, value: u64) {
        // SAFETY: as in `poke_u32`, for an 8-aligned u64 field.
        unsafe { (*((view.base_addr() + offset) as *const AtomicU64)).store(value, Ordering::Release) }
    }

    /// Claims ring slot `index` by hand, as a thread's first push would.
    fn activate<'a>(view: &'a SegmentView, index: u32, name: &[u8]) -> &'a RingSlot {
        let slot = view.ring_slot(index).expect("slot in range");
        slot.generation.fetch_add(1, Ordering::Relaxed);
        slot.thread_id.store(100 + index, Ordering::Relaxed);
        slot.os_tid.store(4_000_000 + index, Ordering::Relaxed);
        for (i, byte) in slot.thread_name.iter().enumerate() {
            byte.store(name.get(i).copied().unwrap_or(0), Ordering::Relaxed);
        }
        slot.thread_name_len.store(name.len() as u32, Ordering::Relaxed);
        slot.state.store(slot_state::ACTIVE, Ordering::Release);
        view.live()
            .rings_high_water
            .fetch_max(index + 1, Ordering::AcqRel);
        slot
    }

    fn push(slot: &RingSlot, id: u32, n: u64, op: u16, flags: u16, latency: u64) {
        for _ in 0..n {
            assert!(
                slot.ring.push(Observation::new(id, op, flags, latency)),
                "ring full"
            );
        }
    }

    fn announce(case: &str, fd: i32) {
        reply(&format!("seg {case} {fd}"));
    }

    fn fd_of(segment: &Segment) -> i32 {
        segment.fd().expect("memfd-backed").as_raw_fd()
    }

    /// An unsealed memfd named `subetha` holding a copy of `model`'s bytes.
    fn unsealed_copy(model: &Segment) -> OwnedFd {
        let name = c"subetha";
        // SAFETY: a valid NUL-terminated name and valid flags; checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = model.view().layout().total_size as usize;
        // SAFETY: the model's mapping is `len` bytes long and readable; we
        // write it into our own descriptor (its first page is what matters).
        let written = unsafe { libc::pwrite(fd.as_raw_fd(), model.view().base_addr() as *const _, 4096, 0) };
        assert_eq!(written, 4096);
        // SAFETY: ftruncate on our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }, 0);
        fd
    }

    /// A sealed memfd named `subetha` of `len` bytes with `header` at its start.
    fn sealed_file(header: &[u8], len: usize) -> OwnedFd {
        let name = c"subetha";
        // SAFETY: as in `unsealed_copy`.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: writing a buffer we own into our descriptor, then sizing
        // and sealing it.
        unsafe {
            let n = header.len().min(len);
            assert_eq!(
                libc::pwrite(fd.as_raw_fd(), header.as_ptr().cast(), n, 0),
                n as isize
            );
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
        }
        fd
    }

    /// Segments each lying about one identity field, and a truthful one.
    fn liars() {
        let mut keep: Vec<Segment> = Vec::new();
        let lies: [(&str, usize, u64); 4] = [
            ("other_pid", offset_of!(SegmentLayout, pid), 1),
            ("other_pid_ns", offset_of!(SegmentLayout, pid_ns_inode), 1),
            ("other_start_time", offset_of!(SegmentLayout, start_time_ticks), 1),
            ("other_uid", offset_of!(SegmentLayout, uid), 1),
        ];
        for (case, offset, delta) in lies {
            let segment = small();
            let layout = segment.view().layout();
            match case {
                "other_pid" => poke_u32(segment.view(), offset, layout.pid + delta as u32),
                "other_uid" => poke_u32(segment.view(), offset, layout.uid + delta as u32),
                "other_pid_ns" => poke_u64(segment.view(), offset, layout.pid_ns_inode + delta),
                _ => poke_u64(segment.view(), offset, layout.start_time_ticks + delta),
            }
            announce(case, fd_of(&segment));
            keep.push(segment);
        }
        let truthful = small();
        register_instance(truthful.view(), MUTEX, "truthful-a").expect("register");
        announce("truthful", fd_of(&truthful));
        keep.push(truthful);
        reply(&format!("ready {}", std::process::id()));
        park_until_stdin_closes();
        drop(keep);
    }

    pub fn main(opts: &Opts) {
        if opts.flag("uninit") {
            return uninit();
        }
        if opts.flag("max-geometry") {
            return max_geometry(opts.num("segments", 1));
        }
        if opts.flag("liars") {
            return liars();
        }
        let mut keep: Vec<Segment> = Vec::new();
        let mut keep_fds: Vec<OwnedFd> = Vec::new();
        let magic = offset_of!(SegmentLayout, magic);

        // Refused: not a subetha segment.
        let bad_magic = small();
        poke_u64(bad_magic.view(), magic, 0x4142_4344_4546_4748);
        announce("bad_magic", fd_of(&bad_magic));
        keep.push(bad_magic);

        // Refused: the header's total size is not the file's size.
        let bad_size = small();
        let total = bad_size.view().layout().total_size;
        poke_u64(
            bad_size.view(),
            offset_of!(SegmentLayout, total_size),
            total + 4096,
        );
        announce("bad_total_size", fd_of(&bad_size));
        keep.push(bad_size);

        // Refused: a valid header in a file that could shrink under a reader.
        let model = small();
        let unsealed = unsealed_copy(&model);
        drop(model);
        announce("unsealed", unsealed.as_raw_fd());
        keep_fds.push(unsealed);

        // Refused: smaller than a header (sealed).
        let tiny = sealed_file(b"SUBETHA\0", 100);
        announce("too_small", tiny.as_raw_fd());
        keep_fds.push(tiny);

        // Refused: an absurd instance capacity in the header.
        let huge_capacity = small();
        poke_u32(
            huge_capacity.view(),
            offset_of!(SegmentLayout, instance_capacity),
            u32::MAX,
        );
        announce("huge_capacity", fd_of(&huge_capacity));
        keep.push(huge_capacity);

        // Refused: the ring table overlaps the instance table.
        let overlap = small();
        let instance_table = overlap.view().layout().instance_table_offset;
        poke_u64(
            overlap.view(),
            offset_of!(SegmentLayout, ring_table_offset),
            instance_table,
        );
        announce("overlapping_tables", fd_of(&overlap));
        keep.push(overlap);

        // Refused: an ABI this build does not read.
        let abi = small();
        poke_u32(abi.view(), offset_of!(SegmentLayout, abi_version), 77);
        announce("bad_abi", fd_of(&abi));
        keep.push(abi);

        // Refused: the header names another process (pid 1).
        let wrong_pid = small();
        poke_u32(wrong_pid.view(), offset_of!(SegmentLayout, pid), 1);
        announce("wrong_pid", fd_of(&wrong_pid));
        keep.push(wrong_pid);

        // Served: a valid segment with exact contents.
        let valid = small();
        {
            let view = valid.view();
            let id = register_instance(view, MUTEX, "valid-a").expect("register");
            let slot = activate(view, 0, b"valid-thread");
            push(slot, id, VALID_OPS.0, 1, 0, 0);
            push(slot, id, VALID_OPS.1, 2, Observation::FLAG_CONTENDED, 500);
        }
        announce("valid", fd_of(&valid));
        keep.push(valid);

        // Served, one ring corrupt: head and tail a million apart in slot 0;
        // slot 1 holds 300 good observations.
        let corrupt = small();
        {
            let view = corrupt.view();
            let id = register_instance(view, MUTEX, "corrupt-seg").expect("register");
            let bad = activate(view, 0, b"bad-ring");
            push(bad, id, 3, 1, 0, 0);
            let tail = (&bad.ring as *const ObservationRing as usize + 64) as *const AtomicU32;
            // SAFETY: `tail` is the ring's producer index, at byte 64 of the
            // ring (its layout is fixed and asserted in the ring's tests);
            // storing to an atomic is sound.
            unsafe { &*tail }.store(1_000_000, Ordering::Release);
            let good = activate(view, 1, b"good-ring");
            push(good, id, 300, 1, 0, 0);
        }
        announce("corrupt_ring", fd_of(&corrupt));
        keep.push(corrupt);

        // Served, clamped: high-water marks at u32::MAX; 250 observations.
        let huge_counts = small();
        {
            let view = huge_counts.view();
            let id = register_instance(view, MUTEX, "huge-counts").expect("register");
            let slot = activate(view, 0, b"huge");
            push(slot, id, 250, 1, 0, 0);
            view.live()
                .instances_high_water
                .store(u32::MAX, Ordering::Release);
            view.live().rings_high_water.store(u32::MAX, Ordering::Release);
        }
        announce("huge_counts", fd_of(&huge_counts));
        keep.push(huge_counts);

        // Served, names sanitised: every name field full (no terminator),
        // with control characters and a length far beyond the field.
        let names = small();
        {
            let view = names.view();
            let id = register_instance(view, MUTEX, "placeholder").expect("register");
            let entry = view.instance(0).expect("entry 0");
            let evil = b"\x1b[2J\x1b[31mEVIL\x07\r\n\t\x00";
            for (i, byte) in entry.name.iter().enumerate() {
                byte.store(if i % 9 == 0 { 0x1b } else { b'N' }, Ordering::Relaxed);
            }
            entry.name_len.store(u32::MAX, Ordering::Relaxed);
            for (i, byte) in entry.kind_name.iter().enumerate() {
                byte.store(evil[i % (evil.len() - 1)], Ordering::Relaxed);
            }
            for op in &entry.op_names {
                for byte in op.iter() {
                    byte.store(0x07, Ordering::Relaxed);
                }
            }
            let slot = activate(view, 0, &[0x1b, b'[', b'K', b'T', 0x0a, 0x0d, 0x7f, 0x9b, 0xff]);
            for byte in slot.thread_name.iter() {
                byte.store(0x1b, Ordering::Relaxed);
            }
            slot.thread_name_len.store(u32::MAX, Ordering::Relaxed);
            push(slot, id, 40, 1, 0, 0);
        }
        announce("bad_names", fd_of(&names));
        keep.push(names);

        reply(&format!("ready {}", std::process::id()));
        park_until_stdin_closes();
        drop(keep_fds);
        drop(keep);
    }

    /// `count` segments of the largest geometry a consumer accepts (65,535
    /// instances, 16,384 ring slots: 1.6 GB each, sparse), one instance
    /// and one ring of 10 observations each, high-water marks at `u32::MAX`.
    fn max_geometry(count: u64) {
        let segments: Vec<Segment> = (0..count)
            .map(|i| {
                let segment = Segment::create(SegmentConfig {
                    instances: subetha_core::segment::MAX_INSTANCES,
                    ring_slots: subetha_core::segment::MAX_RING_SLOTS,
                })
                .expect("create a segment");
                let view = segment.view();
                let id = register_instance(view, MUTEX, &format!("max-{i}")).expect("register");
                let slot = activate(view, 0, b"max");
                push(slot, id, 10, 1, 0, 0);
                view.live()
                    .instances_high_water
                    .store(u32::MAX, Ordering::Release);
                view.live().rings_high_water.store(u32::MAX, Ordering::Release);
                announce("max_geometry", fd_of(&segment));
                segment
            })
            .collect();
        reply(&format!("ready {}", std::process::id()));
        park_until_stdin_closes();
        drop(segments);
    }

    /// A sealed segment whose header is complete except for the magic, as
    /// a process's segment looks while it is being created; `publish` on
    /// stdin writes the magic.
    fn uninit() {
        let segment = small();
        let view = segment.view();
        let id = register_instance(view, MUTEX, "late-init").expect("register");
        let slot = activate(view, 0, b"late");
        push(slot, id, 77, 1, 0, 0);
        poke_u64(view, offset_of!(SegmentLayout, magic), 0);
        announce("uninit", fd_of(&segment));
        reply(&format!("ready {}", std::process::id()));
        let stdin = std::io::stdin();
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut stdin.lock(), &mut line).is_ok_and(|n| n > 0) {
            if line.trim() == "publish" {
                poke_u64(
                    view,
                    offset_of!(SegmentLayout, magic),
                    subetha_core::segment::MAGIC,
                );
                reply("ok");
            }
            line.clear();
        }
        drop(segment);
    }
}
