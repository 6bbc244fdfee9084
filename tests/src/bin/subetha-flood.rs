//! `subetha-flood`: one producer thread flooding one instance, for the
//! storm-cause tests (`tests/tests/probes_*.rs`).
//!
//! ```text
//! subetha-flood [--cpu C] (--rate OBS_PER_SEC --duration-ms MS [--burst N --burst-every-ms B] | --burst N)
//! ```
//!
//! Registers one instance (`flood`, kind `custom`), pins itself to CPU `C`
//! (default 0; `--cpu none` leaves the affinity alone), and prints
//! `ready <pid>`. Then it waits for a `go` line on stdin (so the test can
//! attach its agent first: run it with `SUBETHA_SIDECAR=off` and nobody
//! drains before that), prints `flooding <CLOCK_MONOTONIC ns>` and pushes,
//! all on its main thread:
//!
//! * `--rate R --duration-ms D`: R observations a second for D ms, in
//!   batches of `--batch` (default 32), spinning between batches to hold
//!   the rate. A producer that falls behind (preempted, or slower than R)
//!   does not catch up in a burst: its schedule restarts from now, so the
//!   only storms are the ones the consumer causes. With `--burst N
//!   --burst-every-ms B` it also pushes N back to back every B ms (the
//!   first B ms in), then returns to the rate.
//! * `--burst N`: N observations back to back, as fast as it can.
//!
//! At the end it prints one JSON line of exact ground truth and exits 0:
//! `{"pid", "tid", "attempted", "queued", "dropped", "lost", "begin_mono_ns",
//! "end_mono_ns", "achieved_rate"}` (`queued`: `observe` returned
//! `Ok(true)`, `dropped`: `Ok(false)` (ring full), `lost`: `Err` (no ring)).

use std::io::{BufRead, Write};

use subetha_core::clock::monotonic_ns;
use subetha_core::{Instance, InstanceKind};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| -> Option<&str> {
        let flag = format!("--{name}");
        let i = args.iter().position(|a| *a == flag)?;
        Some(
            args.get(i + 1)
                .unwrap_or_else(|| usage(&format!("{flag} needs a value"))),
        )
    };
    let num = |name: &str| -> Option<u64> {
        opt(name).map(|v| {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("--{name}: {v:?} is not a number")))
        })
    };
    let mode = match (num("rate"), num("duration-ms"), num("burst")) {
        (Some(rate), Some(ms), burst) if rate > 0 => Mode::Rate {
            rate,
            duration_ns: ms * 1_000_000,
            batch: num("batch").unwrap_or(32).max(1),
            bursts: match (burst, num("burst-every-ms")) {
                (Some(n), Some(every)) if every > 0 => Some((n, every * 1_000_000)),
                (None, None) => None,
                _ => usage("--burst with --rate needs --burst-every-ms B (B > 0)"),
            },
        },
        (None, None, Some(n)) => Mode::Burst(n),
        _ => usage("give either --rate R --duration-ms D or --burst N"),
    };
    match opt("cpu") {
        Some("none") => {}
        Some(cpu) => pin_to(
            cpu.parse()
                .unwrap_or_else(|_| usage("--cpu: a CPU number or none")),
        ),
        None => pin_to(0),
    }

    let instance = Instance::register(InstanceKind::CUSTOM, "flood").unwrap_or_else(|e| {
        eprintln!("subetha-flood: cannot register: {e}");
        std::process::exit(1)
    });
    say(&format!("ready {}", std::process::id()));
    let mut line = String::new();
    let stdin = std::io::stdin();
    loop {
        line.clear();
        if stdin.lock().read_line(&mut line).unwrap_or(0) == 0 {
            // The test went away before `go`.
            std::process::exit(3);
        }
        if line.trim() == "go" {
            break;
        }
    }

    let begin = monotonic_ns();
    say(&format!("flooding {begin}"));
    let mut counts = Counts::default();
    match mode {
        Mode::Rate {
            rate,
            duration_ns,
            batch,
            bursts,
        } => {
            let deadline = begin + duration_ns;
            let mut next_burst = bursts.map(|(_, every)| begin + every);
            // Observations pushed since `epoch`, whose schedule they follow.
            let (mut epoch, mut since_epoch) = (begin, 0u64);
            loop {
                for _ in 0..batch {
                    counts.observe(&instance);
                }
                since_epoch += batch;
                let due = epoch + since_epoch * 1_000_000_000 / rate;
                let mut now = monotonic_ns();
                if now >= deadline {
                    break;
                }
                if let (Some(at), Some((n, every))) = (next_burst, bursts)
                    && now >= at
                {
                    for _ in 0..n {
                        counts.observe(&instance);
                    }
                    next_burst = Some(at + every);
                    // The rate resumes from here, not catching up.
                    now = monotonic_ns();
                    (epoch, since_epoch) = (now, 0);
                    continue;
                }
                if now > due + 1_000_000 {
                    // More than 1 ms behind: start a new schedule rather
                    // than burst to catch up.
                    (epoch, since_epoch) = (now, 0);
                }
                while now < due.min(deadline) {
                    std::hint::spin_loop();
                    now = monotonic_ns();
                }
            }
        }
        Mode::Burst(n) => {
            for _ in 0..n {
                counts.observe(&instance);
            }
        }
    }
    let end = monotonic_ns();
    let seconds = (end - begin).max(1) as f64 / 1e9;
    say(&format!(
        "{{\"pid\":{},\"tid\":{},\"attempted\":{},\"queued\":{},\"dropped\":{},\"lost\":{},\
         \"begin_mono_ns\":{begin},\"end_mono_ns\":{end},\"achieved_rate\":{:.0}}}",
        std::process::id(),
        gettid(),
        counts.attempted,
        counts.queued,
        counts.dropped,
        counts.lost,
        counts.attempted as f64 / seconds,
    ));
}

enum Mode {
    Rate {
        rate: u64,
        duration_ns: u64,
        batch: u64,
        /// (observations, every ns) pushed back to back on top of the rate.
        bursts: Option<(u64, u64)>,
    },
    Burst(u64),
}

/// What `observe` returned (one thread: plain integers).
#[derive(Default)]
struct Counts {
    attempted: u64,
    queued: u64,
    dropped: u64,
    lost: u64,
}

impl Counts {
    #[inline]
    fn observe(&mut self, instance: &Instance) {
        self.attempted += 1;
        match instance.observe(1, 0, 0) {
            Ok(true) => self.queued += 1,
            Ok(false) => self.dropped += 1,
            Err(_) => self.lost += 1,
        }
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .expect("stdout");
}

fn usage(error: &str) -> ! {
    eprintln!(
        "subetha-flood: {error}\nusage: subetha-flood [--cpu C|none] \
         (--rate OBS_PER_SEC --duration-ms MS [--batch N] [--burst N --burst-every-ms B] | --burst N)"
    );
    std::process::exit(2)
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Pins the calling thread to `cpu` (exits on failure: the tests rely on it).
fn pin_to(cpu: usize) {
    if cpu >= libc::CPU_SETSIZE as usize {
        usage("--cpu out of range");
    }
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set is valid for reads of its own size; 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        eprintln!(
            "subetha-flood: cannot pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
        std::process::exit(1);
    }
}
