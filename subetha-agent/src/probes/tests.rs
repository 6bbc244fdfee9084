//! The probes on this host, for real: loading, attaching, exact hook
//! counts, and off-CPU intervals of threads that sleep or get preempted.
//!
//! They need root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN) and a build with
//! the eBPF object. Where the probes cannot load they are skipped with a
//! message, unless `SUBETHA_REQUIRE_PROBES=1` (CI), where that is a
//! failure. They run one at a time: the scheduler tests pin threads and run
//! a SCHED_FIFO hog, and must not compete with each other for CPUs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use subetha_core::segment::{Segment, SegmentConfig};
use subetha_core::{Drainer, Observation, ObservationRing};

use super::*;

static SERIAL: Mutex<()> = Mutex::new(());

const CHILD_ENV: &str = "SUBETHA_PROBES_TEST_CHILD";
const MS: u64 = 1_000_000;

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The probes, or `None` (with a message) where they cannot load and the
/// environment does not require them.
fn load_or_skip(test: &str) -> Option<LoadedProbes> {
    match LoadedProbes::load() {
        Ok(probes) => Some(probes),
        Err(error) => {
            if std::env::var("SUBETHA_REQUIRE_PROBES").is_ok_and(|v| v == "1") {
                panic!("{test}: the eBPF probes must load on this host (SUBETHA_REQUIRE_PROBES=1): {error}");
            }
            eprintln!("skipping {test}: {error} (set SUBETHA_REQUIRE_PROBES=1 to make this a failure)");
            None
        }
    }
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

fn drain(probes: &mut LoadedProbes) -> Vec<ProbeEvent> {
    let mut events = Vec::new();
    while probes.drain_events(&mut events) > 0 {}
    events
}

/// Fills `ring`, then runs `episodes` drop episodes of `drops` drops each,
/// closing each with one successful push (after popping one slot).
fn overfill(ring: &ObservationRing, episodes: u64, drops: u64) {
    let observation = Observation::new(7, 1, 0, 0);
    for _ in 0..ObservationRing::CAPACITY {
        assert!(ring.push(observation));
    }
    for _ in 0..episodes {
        for _ in 0..drops {
            assert!(!ring.push(observation));
        }
        assert!(ring.pop().is_some());
        assert!(ring.push(observation));
    }
}

/// Checks the drop events of one producer thread against what `overfill`
/// did on the ring at `ring`.
fn check_drop_events(events: &[ProbeEvent], pid: u32, tid: u32, ring: u64, episodes: u64, drops: u64) {
    let mine: Vec<&ProbeEvent> = events
        .iter()
        .filter(|e| matches!(e, ProbeEvent::DropBegin { .. } | ProbeEvent::DropEnd { .. }) && e.tid() == tid)
        .collect();
    assert_eq!(mine.len() as u64, 2 * episodes, "{mine:#?}");
    for (episode, pair) in mine.chunks(2).enumerate() {
        let episode = episode as u64;
        match pair {
            [
                ProbeEvent::DropBegin {
                    pid: begin_pid,
                    ring: begin_ring,
                    instance_id,
                    dropped_total,
                    ts_ns: begin_ts,
                    ..
                },
                ProbeEvent::DropEnd {
                    pid: end_pid,
                    ring: end_ring,
                    dropped_in_episode,
                    ts_ns: end_ts,
                    ..
                },
            ] => {
                assert_eq!((*begin_pid, *end_pid), (pid, pid));
                assert_eq!((*begin_ring, *end_ring), (ring, ring));
                assert_eq!(*instance_id, 7);
                assert_eq!(*dropped_total, episode * drops + 1);
                assert_eq!(*dropped_in_episode, drops);
                assert!(begin_ts <= end_ts);
            }
            other => panic!("episode {episode}: expected begin then end, got {other:#?}"),
        }
    }
}

#[test]
fn probes_load_and_every_program_attaches() {
    let _serial = serial();
    let started = Instant::now();
    let Some(mut probes) = load_or_skip("probes_load_and_every_program_attaches") else {
        return;
    };
    let loaded = started.elapsed();
    let pid = std::process::id();
    let tid = gettid();
    probes.attach_producer_process(pid).unwrap();
    probes.attach_scanner(pid, tid).unwrap();
    eprintln!(
        "loaded and attached the sched tracepoints in {loaded:?}; uprobes on this process in {:?}",
        started.elapsed() - loaded
    );
    let status = probes.status();
    for s in &status {
        eprintln!(
            "{:<16} {:<30} attached={} {:?}",
            s.program, s.target, s.attached, s.error
        );
    }
    // sched_switch and sched_migrate_task as BTF tracepoints, or all four
    // classic ones; then the four uprobes.
    let sched = status.iter().filter(|s| s.target.starts_with("sched/")).count();
    assert!(sched == 2 || sched == 4, "{status:#?}");
    assert_eq!(status.len(), sched + 4, "{status:#?}");
    assert!(
        status.iter().all(|s| s.attached && s.error.is_none()),
        "{status:#?}"
    );
    assert!(probes.sched_active());
    assert_eq!(probes.watched(), vec![(tid, Role::Scanner)]);
    eprintln!("{}", probes.summary());

    // Idempotent.
    probes.attach_producer_process(pid).unwrap();
    probes.attach_scanner(pid, tid).unwrap();
    assert_eq!(probes.status().len(), sched + 4);

    probes.detach_process(pid);
    assert_eq!(probes.status().len(), sched);
    assert!(probes.watched().is_empty());
    assert_eq!(probes.losses(), 0);

    // A process without the hooks is refused, and reported.
    let error = probes.attach_producer_process(1).unwrap_err();
    assert!(matches!(error, ProbesError::Target { pid: 1, .. }), "{error}");
    assert!(
        probes
            .status()
            .iter()
            .any(|s| s.target == "pid 1" && !s.attached && s.error.is_some())
    );
}

#[test]
fn probes_drop_hooks_fire_once_per_episode_in_this_process() {
    let _serial = serial();
    let Some(mut probes) = load_or_skip("probes_drop_hooks_fire_once_per_episode_in_this_process") else {
        return;
    };
    let pid = std::process::id();
    probes.attach_producer_process(pid).unwrap();
    let before = probes.hook_hits();

    let ring = Arc::new(ObservationRing::new());
    let ring_addr = Arc::as_ptr(&ring) as u64;
    let producer = std::thread::spawn({
        let ring = Arc::clone(&ring);
        move || {
            overfill(&ring, 5, 1000);
            gettid()
        }
    });
    let tid = producer.join().unwrap();
    let counters = ring.producer_counters();
    assert_eq!((counters.episodes, counters.dropped), (5, 5000));

    let thread_hits = probes.hook_hits_for_thread(tid);
    eprintln!("thread hits {thread_hits:?}, ring episodes {}", counters.episodes);
    assert_eq!(thread_hits.drop_begin, u64::from(counters.episodes));
    assert_eq!(thread_hits.drop_end, 5);
    assert_eq!((thread_hits.scan_begin, thread_hits.scan_end), (0, 0));
    // Other tests of this binary may drop in their own threads while this
    // one runs: the global and per-process counters are at least ours (the
    // child-process test checks them exactly).
    let hits = probes.hook_hits();
    assert!(hits.drop_begin - before.drop_begin >= 5 && hits.drop_end - before.drop_end >= 5);
    assert_eq!(probes.hook_hits_for_process(pid), hits);

    let events = drain(&mut probes);
    check_drop_events(&events, pid, tid, ring_addr, 5, 1000);
    assert_eq!(probes.losses(), 0);
}

/// Runs in a child process started by
/// `probes_drop_hooks_count_exactly_in_another_process` (and does nothing
/// otherwise): announces its ring, waits for the go, then drops.
#[test]
#[ignore = "helper process of probes_drop_hooks_count_exactly_in_another_process"]
fn probes_child_drop_workload() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let ring = Box::new(ObservationRing::new());
    println!(
        "subetha-child ready {} {}",
        &*ring as *const ObservationRing as u64,
        gettid()
    );
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    overfill(&ring, 5, 1000);
    let counters = ring.producer_counters();
    println!("subetha-child done {} {}", counters.episodes, counters.dropped);
}

/// Kills the child on drop, so a failed assertion leaves no process behind.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn probes_drop_hooks_count_exactly_in_another_process() {
    let _serial = serial();
    let Some(mut probes) = load_or_skip("probes_drop_hooks_count_exactly_in_another_process") else {
        return;
    };
    let mut child = ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "probes::tests::probes_child_drop_workload",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child_pid = child.0.id();
    let (tx, lines) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        // libtest may print "test <name> ... " on the same line first.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(at) = line.find("subetha-child")
                && tx.send(line[at..].to_string()).is_err()
            {
                break;
            }
        }
    });
    let ready = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("child never got ready");
    let fields: Vec<u64> = ready
        .split_whitespace()
        .skip(2)
        .map(|f| f.parse().unwrap())
        .collect();
    let (ring, child_tid) = (fields[0], fields[1] as u32);

    probes.attach_producer_process(child_pid).unwrap();
    let status = probes.status();
    assert!(
        status
            .iter()
            .filter(|s| s.target.starts_with(&format!("pid {child_pid}:")))
            .all(|s| s.attached),
        "{status:#?}"
    );
    let mut stdin = child.0.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    let done = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("child never finished");
    let fields: Vec<u64> = done
        .split_whitespace()
        .skip(2)
        .map(|f| f.parse().unwrap())
        .collect();
    assert_eq!((fields[0], fields[1]), (5, 5000), "child ring counters");
    assert!(child.0.wait().unwrap().success());

    // Only the child's uprobes feed this instance's counters: exact.
    let hits = probes.hook_hits();
    eprintln!("hook hits {hits:?}, child ring episodes {}", fields[0]);
    assert_eq!(
        hits,
        HookHits {
            drop_begin: 5,
            drop_end: 5,
            scan_begin: 0,
            scan_end: 0
        }
    );
    assert_eq!(probes.hook_hits_for_process(child_pid), hits);
    assert_eq!(probes.hook_hits_for_thread(child_tid), hits);
    let events = drain(&mut probes);
    check_drop_events(&events, child_pid, child_tid, ring, 5, 1000);
    assert_eq!(events.len(), 10, "{events:#?}");
    probes.detach_process(child_pid);
    assert!(probes.status().iter().all(|s| !s.target.starts_with("pid")));
}

#[test]
fn probes_scan_hooks_fire_once_per_scan() {
    let _serial = serial();
    let Some(mut probes) = load_or_skip("probes_scan_hooks_fire_once_per_scan") else {
        return;
    };
    let pid = std::process::id();
    let tid = gettid();
    let segment = Segment::create(SegmentConfig {
        instances: 4,
        ring_slots: 2,
    })
    .unwrap();
    let base = segment.view().base_addr() as u64;
    // A claimed slot to give every scan work: scans of idle rings call no
    // hook.
    let slot = segment.view().ring_slot(0).unwrap();
    slot.thread_id.store(1, std::sync::atomic::Ordering::Relaxed);
    slot.state.store(
        subetha_core::segment::slot_state::ACTIVE,
        std::sync::atomic::Ordering::Release,
    );
    segment
        .view()
        .live()
        .rings_high_water
        .store(1, std::sync::atomic::Ordering::Release);
    let mut drainer = Drainer::attach(segment.view()).unwrap();
    probes.attach_scanner(pid, tid).unwrap();
    const SCANS: u64 = 25;
    let mut seqs = Vec::new();
    for i in 0..SCANS {
        assert!(slot.ring.push(subetha_core::Observation::new(1, 1, 0, i)));
        seqs.push(drainer.scan().seq);
    }
    // An idle scan calls no hook.
    drainer.scan();
    let hits = probes.hook_hits_for_thread(tid);
    assert_eq!((hits.scan_begin, hits.scan_end), (SCANS, SCANS), "{hits:?}");
    let events = drain(&mut probes);
    let begins: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            ProbeEvent::ScanBegin {
                tid: t,
                pid: p,
                segment,
                scan_seq,
                ..
            } if *t == tid && *segment == base => {
                assert_eq!(*p, pid);
                Some(*scan_seq)
            }
            _ => None,
        })
        .collect();
    let ends: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            ProbeEvent::ScanEnd {
                tid: t,
                segment,
                scan_seq,
                drained,
                ..
            } if *t == tid && *segment == base => Some((*scan_seq, *drained)),
            _ => None,
        })
        .collect();
    assert_eq!(begins, seqs);
    assert_eq!(ends, seqs.iter().map(|&s| (s, 1)).collect::<Vec<_>>());
    eprintln!(
        "{SCANS} scans -> {} ScanBegin, {} ScanEnd events",
        begins.len(),
        ends.len()
    );
    probes.unwatch(tid);
}

/// What [`watch_a_sleeper`] saw.
struct SleeperRun {
    /// The off-CPU intervals the probes reported for the sleeper.
    intervals: Vec<OffCpuInterval>,
    /// The longest of its sleeps by its own clock, from before the sleep
    /// call to after it: no off-CPU interval inside that call can be longer.
    longest_sleep: Duration,
}

/// A real-time thread, watched as a producer, sleeps each of `sleeps` in
/// turn; returns what the probes reported for it and how long it slept.
/// With `collider`, a second (nonexistent) tid sharing its index entry is
/// watched too, so the kernel must find it through the overflow map.
fn watch_a_sleeper(probes: &mut LoadedProbes, sleeps: &[Duration], collider: bool) -> SleeperRun {
    assert!(probes.sched_active(), "{:#?}", probes.status());
    let (tid_tx, tid_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let sleeps = sleeps.to_vec();
    let sleeper = std::thread::Builder::new()
        .name("subetha-sleepy".into())
        .spawn(move || {
            // Real-time, so that once woken it runs at once whatever else
            // this machine is busy with: off CPU ≈ asleep.
            tid_tx.send(set_fifo(10).map(|()| gettid())).unwrap();
            go_rx.recv().unwrap();
            sleeps
                .into_iter()
                .map(|sleep| {
                    let start = Instant::now();
                    std::thread::sleep(sleep);
                    start.elapsed()
                })
                .max()
                .unwrap_or_default()
        })
        .unwrap();
    let tid = tid_rx
        .recv()
        .unwrap()
        .expect("SCHED_FIFO for the sleeping thread");
    let shadow = tid + subetha_probes::WATCHED_INDEX_WORDS * subetha_probes::index::PER_WORD;
    if collider {
        probes.watch(shadow, Role::Producer).unwrap();
    }
    probes.watch(tid, Role::Producer).unwrap();
    go_tx.send(()).unwrap();
    let longest_sleep = sleeper.join().unwrap();
    let events = drain(probes);
    probes.unwatch(tid);
    if collider {
        probes.unwatch(shadow);
    }
    let intervals = events
        .into_iter()
        .filter_map(|e| match e {
            ProbeEvent::OffCpu(interval) if interval.tid == tid => Some(interval),
            _ => None,
        })
        .collect();
    SleeperRun {
        intervals,
        longest_sleep,
    }
}

/// Checks the one ~20 ms sleep of [`watch_a_sleeper`] among its intervals.
fn check_the_sleep(run: &SleeperRun) {
    let longest = run
        .intervals
        .iter()
        .max_by_key(|i| i.off_cpu_ns())
        .unwrap_or_else(|| panic!("no off-CPU interval for the sleeper"));
    eprintln!(
        "sleeper: off CPU {:.3} ms (asleep {:.3} ms, runqueue {:.3} ms), state {:#x}, cpu {} -> {}, \
         replaced by {} ({}), holder {} ({})",
        longest.off_cpu_ns() as f64 / 1e6,
        longest.asleep_ns() as f64 / 1e6,
        longest.runqueue_wait_ns() as f64 / 1e6,
        longest.out_state,
        longest.cpu_out,
        longest.cpu_in,
        longest.replaced_by_comm,
        longest.replaced_by_pid,
        longest.holder_comm,
        longest.holder_pid,
    );
    assert_ne!(longest.out_state, 0, "{longest:#?}");
    assert!(!longest.preempted());
    assert_eq!(longest.role, Some(Role::Producer));
    assert_eq!(longest.pid, std::process::id());
    // The upper bound is the sleep call's own length, not a fixed margin: a
    // virtual machine's timer can overshoot a 20 ms sleep by several ms.
    let slept_ns = u64::try_from(run.longest_sleep.as_nanos()).unwrap();
    assert!(
        (20 * MS..=slept_ns).contains(&longest.off_cpu_ns()),
        "expected 20 ms to {slept_ns} ns (the sleep call) off CPU: {longest:#?}"
    );
    assert!(longest.runqueue_wait_ns() < 2 * MS, "{longest:#?}");
    assert!(
        longest.out_ts < longest.wakeup_ts && longest.wakeup_ts <= longest.in_ts,
        "{longest:#?}"
    );
    assert!(longest.asleep_ns() >= 20 * MS);
}

#[test]
fn probes_sleeping_thread_reports_one_off_cpu_interval() {
    let _serial = serial();
    let Some(mut probes) = load_or_skip("probes_sleeping_thread_reports_one_off_cpu_interval") else {
        return;
    };
    // On these hosts the BTF tracepoints must be the ones attached.
    if std::env::var("SUBETHA_REQUIRE_PROBES").is_ok_and(|v| v == "1") {
        let status = probes.status();
        let btf: Vec<_> = status.iter().filter(|s| s.target.ends_with("(tp_btf)")).collect();
        assert_eq!(btf.len(), 2, "sched_switch and sched_migrate_task: {status:#?}");
        assert_eq!(
            status.len(),
            2,
            "no wakeup tracepoint with the BTF sched_switch: {status:#?}"
        );
    }
    let run = watch_a_sleeper(&mut probes, &[Duration::from_millis(20)], false);
    check_the_sleep(&run);
}

#[test]
fn probes_classic_tracepoints_report_the_sleep_too() {
    let _serial = serial();
    let Some(mut probes) = load_or_skip("probes_classic_tracepoints_report_the_sleep_too") else {
        return;
    };
    drop(probes);
    probes = LoadedProbes::load_with(SchedPrograms::Classic).expect("the probes loaded once already");
    let status = probes.status();
    for (_, classic, category, event) in subetha_probes::program::TRACEPOINTS {
        assert!(
            status
                .iter()
                .any(|s| s.program == classic && s.target == format!("{category}/{event}") && s.attached),
            "{classic} not attached: {status:#?}"
        );
    }
    let run = watch_a_sleeper(&mut probes, &[Duration::from_millis(20)], false);
    check_the_sleep(&run);
}

#[test]
fn probes_find_threads_that_share_an_index_entry() {
    let _serial = serial();
    let Some(mut probes) = load_or_skip("probes_find_threads_that_share_an_index_entry") else {
        return;
    };
    let run = watch_a_sleeper(&mut probes, &[Duration::from_millis(20)], true);
    check_the_sleep(&run);
    // Both gone: the slots are free again and a fresh watch works.
    assert!(probes.watched().is_empty());
    let run = watch_a_sleeper(&mut probes, &[Duration::from_millis(20)], false);
    check_the_sleep(&run);
}

#[test]
fn probes_filter_keeps_short_intervals_in_the_kernel() {
    let _serial = serial();
    let Some(mut probes) = load_or_skip("probes_filter_keeps_short_intervals_in_the_kernel") else {
        return;
    };
    probes
        .set_off_cpu_filter(Some(OffCpuFilter {
            min_runqueue_wait_ns: 1_000 * MS,
            min_sleep_ns: 10 * MS,
            cpu_change: false,
            producer_intervals: true,
        }))
        .unwrap();
    let filtered_before = probes.off_cpu_filtered();
    let short = Duration::from_millis(1);
    let run = watch_a_sleeper(
        &mut probes,
        &[short, short, short, Duration::from_millis(20)],
        false,
    );
    assert_eq!(
        run.intervals.len(),
        1,
        "only the long sleep passes: {:#?}",
        run.intervals
    );
    check_the_sleep(&run);
    let filtered = probes.off_cpu_filtered() - filtered_before;
    assert!(
        filtered >= 3,
        "the three short sleeps were counted as filtered: {filtered}"
    );
    // Producers left out: nothing for a producer, however long it sleeps.
    probes
        .set_off_cpu_filter(Some(OffCpuFilter {
            min_runqueue_wait_ns: 1_000 * MS,
            min_sleep_ns: 10 * MS,
            cpu_change: true,
            producer_intervals: false,
        }))
        .unwrap();
    let intervals = watch_a_sleeper(&mut probes, &[short, Duration::from_millis(20)], false).intervals;
    assert!(intervals.is_empty(), "producers are not followed: {intervals:#?}");
    // Back to every interval.
    probes.set_off_cpu_filter(None).unwrap();
    let intervals = watch_a_sleeper(
        &mut probes,
        &[short, short, short, Duration::from_millis(20)],
        false,
    )
    .intervals;
    assert!(intervals.len() >= 4, "{intervals:#?}");
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is valid for writes of its own size.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, within the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (it came from `allowed_cpus`).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set is valid for reads of its own size; 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
}

/// Makes the calling thread SCHED_FIFO at `priority`.
fn set_fifo(priority: i32) -> Result<(), String> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is valid for the call; 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

/// Pins the calling thread to one CPU and restores its affinity on drop.
struct AffinityGuard(libc::cpu_set_t);

impl AffinityGuard {
    fn pin_current(cpu: usize) -> Self {
        // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
        let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set is valid for writes of its own size.
        let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut old) };
        assert_eq!(rc, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
        pin_to(cpu);
        Self(old)
    }
}

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        // SAFETY: the set is valid for reads of its own size; 0 is this thread.
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &self.0) };
    }
}

#[test]
fn probes_preempted_thread_names_the_task_that_held_its_cpu() {
    let _serial = serial();
    if let Some(probes) = load_or_skip("probes_preempted_thread_names_the_task_that_held_its_cpu") {
        preempt_a_watched_thread(probes);
    }
}

#[test]
fn probes_classic_tracepoints_name_the_task_that_held_its_cpu_too() {
    let _serial = serial();
    if let Some(probes) = load_or_skip("probes_classic_tracepoints_name_the_task_that_held_its_cpu_too") {
        drop(probes);
        preempt_a_watched_thread(
            LoadedProbes::load_with(SchedPrograms::Classic).expect("the probes loaded once already"),
        );
    }
}

/// A watched SCHED_FIFO thread is preempted by a higher-priority hog on its
/// CPU for 50 ms: one interval naming the hog. Then the same again as if
/// the kernel had not reported the thread's return.
fn preempt_a_watched_thread(mut probes: LoadedProbes) {
    const HOG_WINDOW: Duration = Duration::from_millis(50);
    assert!(probes.sched_active(), "{:#?}", probes.status());
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        // The test thread itself would share the CPU and could be the
        // task that held it.
        eprintln!("skipping the preemption test: one CPU");
        return;
    }
    let cpu = cpus[cpus.len() - 1];
    // Keep this thread (which releases and joins the hog) off that CPU, so
    // the hog is the only task competing with the watched thread.
    let _affinity = AffinityGuard::pin_current(cpus[0]);

    // A watched thread spinning on `cpu` (for 2 s at most). It is
    // SCHED_FIFO too, at a lower priority than the hog: only the hog can
    // preempt it, and once the hog is gone it is the next to run, so
    // whatever else this machine runs cannot take its CPU in between.
    let stop = Arc::new(AtomicBool::new(false));
    let (tid_tx, tid_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let busy = std::thread::Builder::new()
        .name("subetha-busy".into())
        .spawn({
            let stop = Arc::clone(&stop);
            move || {
                pin_to(cpu);
                tid_tx.send(set_fifo(10).map(|()| gettid())).unwrap();
                go_rx.recv().unwrap();
                let deadline = Instant::now() + Duration::from_secs(2);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                // A switch-out that happens before `join` returns (the one
                // at exit may come after).
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .unwrap();
    let busy_tid = tid_rx.recv().unwrap().expect("SCHED_FIFO for the busy thread");
    probes.watch(busy_tid, Role::Scanner).unwrap();
    go_tx.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(20));

    // A higher-priority SCHED_FIFO thread on the same CPU: blocks until released, then
    // spins for HOG_WINDOW and exits by itself (RT throttling,
    // sched_rt_runtime_us, bounds it too).
    let (ready_tx, ready_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let hog = std::thread::Builder::new()
        .name("subetha-hog".into())
        .spawn(move || {
            // Real-time first, then onto the busy thread's CPU: a CFS
            // thread could not get onto it while the busy thread spins.
            let setup = set_fifo(50).map(|()| gettid());
            pin_to(cpu);
            let ok = setup.is_ok();
            ready_tx.send(setup).unwrap();
            if !ok {
                return Duration::ZERO;
            }
            release_rx.recv().unwrap();
            let started = Instant::now();
            while started.elapsed() < HOG_WINDOW {
                std::hint::spin_loop();
            }
            started.elapsed()
        })
        .unwrap();
    let hog_tid = ready_rx.recv().unwrap().expect("SCHED_FIFO for the hog thread");
    // Let the busy thread get its CPU back after the hog's setup.
    std::thread::sleep(Duration::from_millis(20));
    release_tx.send(()).unwrap();
    let hog_ran = hog.join().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // Drained while the busy thread still has its CPU back.
    let events = drain(&mut probes);

    let intervals: Vec<&OffCpuInterval> = events
        .iter()
        .filter_map(|e| match e {
            ProbeEvent::OffCpu(interval) if interval.tid == busy_tid => Some(interval),
            _ => None,
        })
        .collect();
    let longest = intervals
        .iter()
        .max_by_key(|i| i.off_cpu_ns())
        .unwrap_or_else(|| panic!("no off-CPU interval for the busy thread: {events:#?}"));
    let window = hog_ran.as_nanos() as u64;
    eprintln!(
        "busy thread (tid {busy_tid}, cpu {cpu}): {} intervals; longest off CPU {:.3} ms, runqueue {:.3} ms, \
         state {:#x}, cpu {} -> {}, replaced by {} ({}), holder {} ({}); hog (tid {hog_tid}) ran {:.3} ms",
        intervals.len(),
        longest.off_cpu_ns() as f64 / 1e6,
        longest.runqueue_wait_ns() as f64 / 1e6,
        longest.out_state,
        longest.cpu_out,
        longest.cpu_in,
        longest.replaced_by_comm,
        longest.replaced_by_pid,
        longest.holder_comm,
        longest.holder_pid,
        window as f64 / 1e6,
    );
    assert_eq!(longest.out_state, 0, "preempted while runnable: {longest:#?}");
    assert!(longest.preempted());
    assert_eq!(longest.wakeup_ts, 0);
    assert_eq!(longest.runqueue_wait_ns(), longest.off_cpu_ns());
    assert_eq!(longest.holder_comm, "subetha-hog", "{longest:#?}");
    assert_eq!(longest.holder_pid, hog_tid);
    assert_eq!(longest.replaced_by_comm, "subetha-hog", "{longest:#?}");
    assert_eq!((longest.cpu_out, longest.cpu_in), (cpu as u32, cpu as u32));
    assert_eq!(longest.role, Some(Role::Scanner));
    let off = longest.off_cpu_ns();
    assert!(
        off >= window * 8 / 10 && off <= window * 12 / 10,
        "off CPU {off} ns vs hog window {window} ns: {longest:#?}"
    );
    assert!(!longest.switch_in_unseen, "{longest:#?}");

    // Again, as if the kernel had not reported the busy thread's return
    // (some hosts leave out such switches): its next switch-out, when it
    // exits, must report the same interval from the scheduler's records.
    probes.forget_switch_in(busy_tid, longest.out_ts).unwrap();
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    let later = drain(&mut probes);
    probes.unwatch(busy_tid);
    let replayed = later
        .iter()
        .find_map(|e| match e {
            ProbeEvent::OffCpu(interval) if interval.tid == busy_tid => Some(interval),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the unseen switch-in was not reported: {later:#?}"));
    let in_error = replayed.in_ts.abs_diff(longest.in_ts);
    eprintln!(
        "unseen switch-in: reconstructed {} ns from the one reported, holder {} ({})",
        in_error, replayed.holder_comm, replayed.holder_pid
    );
    assert!(replayed.switch_in_unseen, "{replayed:#?}");
    assert_eq!(replayed.out_ts, longest.out_ts);
    assert!(replayed.preempted(), "{replayed:#?}");
    assert!(
        in_error < 100_000,
        "switch-in {in_error} ns off: {replayed:#?} vs {longest:#?}"
    );
    assert_eq!(
        (replayed.holder_pid, replayed.holder_comm.as_str()),
        (hog_tid, "subetha-hog"),
        "{replayed:#?}"
    );
    assert_eq!(replayed.replaced_by_comm, "subetha-hog");
}

#[test]
fn probes_migrations_of_watched_threads_are_reported() {
    let _serial = serial();
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("skipping probes_migrations_of_watched_threads_are_reported: one CPU");
        return;
    }
    let Some(mut probes) = load_or_skip("probes_migrations_of_watched_threads_are_reported") else {
        return;
    };
    let (tid_tx, tid_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (a, b) = (cpus[0], cpus[1]);
    let mover = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        go_rx.recv().unwrap();
        // It cannot be on both: at least one of these moves it.
        pin_to(a);
        pin_to(b);
        pin_to(a);
    });
    let tid = tid_rx.recv().unwrap();
    probes.watch(tid, Role::Producer).unwrap();
    go_tx.send(()).unwrap();
    mover.join().unwrap();
    let events = drain(&mut probes);
    probes.unwatch(tid);
    let migrations: Vec<(u32, u32, u32)> = events
        .iter()
        .filter_map(|e| match e {
            ProbeEvent::Migrate {
                pid,
                tid: t,
                orig_cpu,
                dest_cpu,
                ..
            } if *t == tid => Some((*pid, *orig_cpu, *dest_cpu)),
            _ => None,
        })
        .collect();
    eprintln!("migrations of tid {tid}: {migrations:?}");
    assert!(!migrations.is_empty(), "{events:#?}");
    for (pid, orig, dest) in migrations {
        assert_eq!(pid, std::process::id());
        assert_ne!(orig, dest);
        assert!([a as u32, b as u32].contains(&dest));
    }
}

#[test]
fn probes_are_send() {
    fn assert_send<T: Send>() {}
    assert_send::<LoadedProbes>();
}
