//! `cargo xtask bench`: runs the comparative benchmarks
//! (`subetha-core/benches/ring.rs`) and prints one table: subetha against
//! rtrb and crossbeam's `ArrayQueue`, with ratios, targets and verdicts.
//!
//! Timings come from criterion's `<target>/criterion/<group>/<id>/new/`
//! files (`estimates.json`: mean ns per iteration; `benchmark.json`: the
//! elements per iteration), the rest (drop fractions, pinning) from the
//! bench's side files in `<target>/subetha-bench/`. Only results written by
//! this run are used, so a filtered run shows `—` for what it skipped. The
//! table is also saved as `<target>/subetha-bench/table.txt`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde_json::Value;

/// Options of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// Short warm-up and measurement per benchmark (CI smoke test): numbers
    /// are indicative only.
    #[arg(long)]
    quick: bool,
    /// Print the table from the latest results on disk without running.
    #[arg(long)]
    no_run: bool,
    /// Run only the benchmarks whose id matches this regex (passed to
    /// criterion), e.g. `push_room` or `lossless/rtrb`.
    filter: Option<String>,
}

/// The three implementations, in column order.
const IMPLS: [&str; 3] = ["subetha", "rtrb", "arrayqueue"];

pub fn run(args: &BenchArgs) -> Result<()> {
    let target = target_dir();
    let criterion_home = target.join("criterion");
    let side_dir = target.join("subetha-bench");
    let mut others_busy = None;
    let since = if args.no_run {
        SystemTime::UNIX_EPOCH
    } else {
        let started = SystemTime::now();
        let before = CpuTimes::now();
        let mut cargo_args = vec!["bench", "-p", "subetha-core", "--bench", "ring", "--"];
        if let Some(filter) = &args.filter {
            cargo_args.push(filter);
        }
        let (home, side) = (path_str(&criterion_home)?, path_str(&side_dir)?);
        let env = [
            // No sidecar: it would compete for the CPUs and drain the
            // observe benchmark's ring.
            ("SUBETHA_SIDECAR", "off"),
            ("SUBETHA_BENCH_QUICK", if args.quick { "1" } else { "0" }),
            ("CRITERION_HOME", home),
            ("SUBETHA_BENCH_OUT", side),
        ];
        crate::cargo(&cargo_args, &env)?;
        others_busy = before.zip(CpuTimes::now()).map(|(b, a)| a.others_busy_since(&b));
        started
    };
    let results = Results::load(&criterion_home, &side_dir, since)?;
    let quick = results.side_bool("meta", "quick").unwrap_or(args.quick);
    let table = render(&results, quick, others_busy);
    print!("{table}");
    std::fs::create_dir_all(&side_dir).with_context(|| format!("creating {}", side_dir.display()))?;
    std::fs::write(side_dir.join("table.txt"), &table).context("saving table.txt")?;
    Ok(())
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                crate::workspace_root().join(dir)
            }
        })
        .unwrap_or_else(|| crate::workspace_root().join("target"))
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("path is not UTF-8: {}", path.display()))
}

// ---------------------------------------------------------------------------
// Reading results.

/// One criterion benchmark, per element of throughput.
#[derive(Clone, Copy, Debug)]
struct Estimate {
    /// Mean ns per element.
    ns: f64,
    /// 95% confidence interval of the mean, ns per element.
    low: f64,
    high: f64,
}

impl Estimate {
    fn overlaps(&self, other: &Estimate) -> bool {
        self.low <= other.high && other.low <= self.high
    }

    /// As a rate, million elements per second (with the interval flipped).
    fn per_second_millions(&self) -> Estimate {
        Estimate {
            ns: 1e3 / self.ns,
            low: 1e3 / self.high,
            high: 1e3 / self.low,
        }
    }
}

struct Results {
    /// `group/function` → estimate.
    estimates: BTreeMap<String, Estimate>,
    /// side-file stem → parsed object.
    side: BTreeMap<String, Value>,
}

impl Results {
    fn load(criterion_home: &Path, side_dir: &Path, since: SystemTime) -> Result<Self> {
        let mut estimates = BTreeMap::new();
        let mut dirs = Vec::new();
        find_new_dirs(criterion_home, &mut dirs);
        for dir in dirs {
            let bench_file = dir.join("benchmark.json");
            let estimates_file = dir.join("estimates.json");
            if !fresh(&estimates_file, since) {
                continue;
            }
            let bench = read_json(&bench_file)?;
            let est = read_json(&estimates_file)?;
            let id = bench["full_id"]
                .as_str()
                .with_context(|| format!("{}: no full_id", bench_file.display()))?
                .to_owned();
            let elements = bench["throughput"]["Elements"].as_f64().unwrap_or(1.0).max(1.0);
            let mean = &est["mean"];
            let number = |v: &Value| {
                v.as_f64()
                    .with_context(|| format!("{}: malformed mean", estimates_file.display()))
            };
            estimates.insert(
                id,
                Estimate {
                    ns: number(&mean["point_estimate"])? / elements,
                    low: number(&mean["confidence_interval"]["lower_bound"])? / elements,
                    high: number(&mean["confidence_interval"]["upper_bound"])? / elements,
                },
            );
        }
        let mut side = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(side_dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "json") && fresh(&path, since) {
                    let stem = path
                        .file_stem()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned();
                    side.insert(stem, read_json(&path)?);
                }
            }
        }
        Ok(Self { estimates, side })
    }

    fn get(&self, group: &str, function: &str) -> Option<Estimate> {
        self.estimates.get(&format!("{group}/{function}")).copied()
    }

    fn side_f64(&self, file: &str, field: &str) -> Option<f64> {
        self.side.get(file)?.get(field)?.as_f64()
    }

    /// A median with its quartiles (`<field>`, `<field>_q1`, `<field>_q3`)
    /// from a side file, as an estimate whose interval is the IQR.
    fn side_estimate(&self, file: &str, field: &str) -> Option<Estimate> {
        let median = self.side_f64(file, field)?;
        Some(Estimate {
            ns: median,
            low: self.side_f64(file, &format!("{field}_q1")).unwrap_or(median),
            high: self.side_f64(file, &format!("{field}_q3")).unwrap_or(median),
        })
    }

    /// A comparison the bench paired per round (`<field>`,
    /// `<field>_ci_low`, `<field>_ci_high`).
    fn side_paired(&self, file: &str, field: &str) -> Option<Paired> {
        Some(Paired {
            median: self.side_f64(file, field)?,
            low: self.side_f64(file, &format!("{field}_ci_low"))?,
            high: self.side_f64(file, &format!("{field}_ci_high"))?,
        })
    }

    fn side_bool(&self, file: &str, field: &str) -> Option<bool> {
        self.side.get(file)?.get(field)?.as_bool()
    }
}

/// Every `…/new` directory under `dir` holding a `benchmark.json`.
fn find_new_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") && path.join("benchmark.json").is_file() {
            out.push(path);
        } else {
            find_new_dirs(&path, out);
        }
    }
}

fn fresh(path: &Path, since: SystemTime) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|modified| modified >= since)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

// ---------------------------------------------------------------------------
// The table.

/// Which way is better for a row.
#[derive(Clone, Copy, PartialEq)]
enum Better {
    Lower,
    Higher,
}

/// A comparison with rtrb that the bench paired round by round: the
/// median of the per-round values and its 95% confidence interval,
/// oriented so that a larger value is better for subetha.
#[derive(Clone, Copy, Debug)]
struct Paired {
    median: f64,
    low: f64,
    high: f64,
}

impl Paired {
    /// Against `par` (the value at which subetha is exactly as good as
    /// rtrb): met when the whole interval is at or above it, missed when
    /// all of it is below, otherwise not distinguishable in this run.
    fn verdict(&self, par: f64) -> &'static str {
        if self.low >= par {
            "meets"
        } else if self.high < par {
            "MISSES"
        } else {
            "par (CI spans it)"
        }
    }
}

/// One row: values per implementation (None = not measured / not applicable).
struct Row {
    label: &'static str,
    unit: &'static str,
    values: [Option<Estimate>; 3],
    /// Decimals to print.
    decimals: usize,
    target: String,
    verdict: String,
    /// The subetha/rtrb column when the bench paired the rounds (otherwise
    /// the ratio of the two values).
    paired_ratio: Option<f64>,
}

impl Row {
    /// A row whose target is "subetha at least as good as rtrb".
    fn versus_rtrb(
        label: &'static str,
        unit: &'static str,
        values: [Option<Estimate>; 3],
        better: Better,
        decimals: usize,
    ) -> Self {
        let target = match better {
            Better::Lower => "≤ rtrb",
            Better::Higher => "≥ rtrb",
        }
        .to_owned();
        let verdict = match (values[0], values[1]) {
            (Some(ours), Some(theirs)) => {
                let meets = match better {
                    Better::Lower => ours.ns <= theirs.ns,
                    Better::Higher => ours.ns >= theirs.ns,
                };
                let mut verdict = if meets { "meets" } else { "MISSES" }.to_owned();
                if ours.overlaps(&theirs) && (ours.low != ours.high || theirs.low != theirs.high) {
                    verdict.push_str(" (CIs overlap)");
                }
                verdict
            }
            _ => "not run".to_owned(),
        };
        Self {
            label,
            unit,
            values,
            decimals,
            target,
            verdict,
            paired_ratio: None,
        }
    }

    /// Judges the row by a paired speed ratio (rtrb's time per item over
    /// subetha's, > 1 when subetha is faster) instead of by the values.
    fn judged_by_speed(mut self, speed: Option<Paired>, better: Better) -> Self {
        if let Some(p) = speed {
            self.verdict = format!(
                "{} (paired speed ×{:.2}, CI {:.2}–{:.2})",
                p.verdict(1.0),
                p.median,
                p.low,
                p.high
            );
            self.paired_ratio = Some(match better {
                Better::Lower => 1.0 / p.median,
                Better::Higher => p.median,
            });
        }
        self
    }

    fn ratio(&self) -> Option<f64> {
        if self.paired_ratio.is_some() {
            return self.paired_ratio;
        }
        match (self.values[0], self.values[1]) {
            (Some(ours), Some(theirs)) if theirs.ns != 0.0 => Some(ours.ns / theirs.ns),
            _ => None,
        }
    }
}

/// A value known exactly (no confidence interval).
fn exact(value: f64) -> Estimate {
    Estimate {
        ns: value,
        low: value,
        high: value,
    }
}

fn render(results: &Results, quick: bool, others_busy: Option<f64>) -> String {
    let per_impl = |group: &str| IMPLS.map(|name| results.get(group, name));
    let rate = |e: Option<Estimate>| e.map(|e| e.per_second_millions());
    let mut rows = Vec::new();

    rows.push(Row::versus_rtrb(
        "1a push, ring has room, no consumer",
        "ns/push",
        per_impl("push_room"),
        Better::Lower,
        2,
    ));
    rows.push(Row::versus_rtrb(
        "1b push into a full ring (drop path)",
        "ns/push",
        per_impl("push_full"),
        Better::Lower,
        2,
    ));
    // The two-thread rows: medians of interleaved rounds (side files), or
    // criterion's estimates from an older bench.
    let rounds = |group: &str| {
        IMPLS.map(|name| {
            results
                .side_estimate(&format!("{group}-{name}"), "ns_per_item")
                .or_else(|| results.get(group, name))
        })
    };
    let speed = |group: &str| results.side_paired(&format!("{group}-subetha"), "vs_rtrb_speed");
    rows.push(
        Row::versus_rtrb(
            "2a push, consumer draining (lossy)",
            "ns/push",
            rounds("lossy_concurrent"),
            Better::Lower,
            2,
        )
        .judged_by_speed(speed("lossy_concurrent"), Better::Lower),
    );
    let drop_fraction = IMPLS.map(|name| {
        let file = format!("lossy_concurrent-{name}");
        results
            .side_estimate(&file, "drop_fraction")
            .or_else(|| results.side_f64(&file, "drop_fraction").map(exact))
            .map(|f| Estimate {
                ns: f.ns * 100.0,
                low: f.low * 100.0,
                high: f.high * 100.0,
            })
    });
    let mut dropped = Row::versus_rtrb(
        "2b   dropped in 2a",
        "% of pushes",
        drop_fraction,
        Better::Lower,
        2,
    );
    if let Some(p) = results.side_paired("lossy_concurrent-subetha", "vs_rtrb_fewer_dropped_points") {
        dropped.verdict = format!(
            "{} (paired {:+.2} pp fewer, CI {:+.2}–{:+.2})",
            p.verdict(0.0),
            p.median,
            p.low,
            p.high
        );
    }
    rows.push(dropped);
    rows.push(
        Row::versus_rtrb(
            "3  lossless producer→consumer",
            "M obs/s",
            rounds("lossless").map(rate),
            Better::Higher,
            1,
        )
        .judged_by_speed(speed("lossless"), Better::Higher),
    );

    let drain = rate(results.get("drainer", "scan_cross_core"));
    rows.push(Row {
        label: "4  Drainer scan into InstanceStats",
        unit: "M obs/s",
        values: [drain, None, None],
        decimals: 1,
        target: "≥ 100".to_owned(),
        verdict: match drain {
            Some(d) if d.ns >= 100.0 => "meets".to_owned(),
            Some(_) => "MISSES".to_owned(),
            None => "not run".to_owned(),
        },
        paired_ratio: None,
    });
    let drain_warm = rate(results.get("drainer", "scan_same_core"));
    rows.push(Row {
        label: "4' (rings filled on the scanning core)",
        unit: "M obs/s",
        values: [drain_warm, None, None],
        decimals: 1,
        target: "reference".to_owned(),
        verdict: if drain_warm.is_some() { "—" } else { "not run" }.to_owned(),
        paired_ratio: None,
    });

    let observe = results.get("observe", "subetha");
    let push = results.get("push_room", "subetha");
    let (target, verdict) = match (observe, push) {
        (Some(o), Some(p)) => {
            let over = o.ns - p.ns;
            let meets = over <= 3.0;
            (
                format!("≤ 1a + 3 = {:.2}", p.ns + 3.0),
                format!("{} ({over:+.2} ns)", if meets { "meets" } else { "MISSES" }),
            )
        }
        _ => ("≤ 1a + 3 ns".to_owned(), "not run".to_owned()),
    };
    rows.push(Row {
        label: "5  Instance::observe end to end",
        unit: "ns/obs",
        values: [observe, None, None],
        decimals: 2,
        target,
        verdict,
        paired_ratio: None,
    });

    let mut out = String::new();
    let _ = writeln!(out);
    let _ = writeln!(out, "{}", machine_info(others_busy));
    let _ = writeln!(out, "{}", setup_info(results, quick));
    let _ = writeln!(out);
    let header = [
        "measurement",
        "unit",
        "subetha",
        "rtrb",
        "ArrayQueue",
        "subetha/rtrb",
        "target",
        "verdict",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|row| {
            let value =
                |v: Option<Estimate>| v.map_or("—".to_owned(), |e| format!("{:.*}", row.decimals, e.ns));
            [
                row.label.to_owned(),
                row.unit.to_owned(),
                value(row.values[0]),
                value(row.values[1]),
                value(row.values[2]),
                row.ratio().map_or("—".to_owned(), |r| format!("{r:.2}")),
                row.target.clone(),
                row.verdict.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    // Text columns left-aligned, numbers right-aligned.
    let left = [true, true, false, false, false, false, true, true];
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i] - cell.chars().count();
            if i > 0 {
                s.push_str("  ");
            }
            if left[i] {
                s.push_str(cell);
                s.extend(std::iter::repeat_n(' ', pad));
            } else {
                s.extend(std::iter::repeat_n(' ', pad));
                s.push_str(cell);
            }
        }
        s.trim_end().to_owned()
    };
    let _ = writeln!(out, "{}", line(&header.map(str::to_owned)));
    let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    let _ = writeln!(out, "{}", "─".repeat(total));
    for row in &cells {
        let _ = writeln!(out, "{}", line(row));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Per-item figures are criterion's mean per iteration divided by the items per iteration; \
         \"CIs overlap\": the 95% confidence intervals of subetha and rtrb overlap, so the \
         difference is within this run's noise. Rows 2a, 2b and 3 show the median of many short \
         rounds that alternate between the implementations (order rotating each round) and are \
         judged paired: each round of subetha against the round of rtrb beside it (speed = rtrb's \
         time per item / subetha's; pp = rtrb's drop percentage minus subetha's), by the 95% \
         confidence interval of the median: \"meets\" when all of it is on subetha's side of par, \
         \"MISSES\" when none of it is, \"par\" when it spans par. 2b counts push attempts the \
         ring refused (subetha: push returned false; rtrb, ArrayQueue: push returned Err)."
    );
    out
}

fn machine_info(others_busy: Option<f64>) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, m)| m.trim())
        })
        .unwrap_or("unknown CPU")
        .to_owned();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    let mut info = format!("machine: {model}, {cpus} CPUs, Linux {kernel}");
    if let Some(busy) = others_busy {
        let _ = write!(
            info,
            "\nload:    other processes used {:.0}% of the CPU time during the run",
            busy * 100.0
        );
        if busy > 0.05 {
            info.push_str(
                "\nwarning: the machine was not quiet; the two-thread rows (2a, 2b, 3, 4) are the most \
                 affected: rerun on an idle machine before trusting them",
            );
        }
    }
    info
}

/// System-wide CPU time from `/proc/stat` and this process's waited-for
/// children's (the benchmark) from `getrusage`, in seconds.
struct CpuTimes {
    busy: f64,
    total: f64,
    children: f64,
}

impl CpuTimes {
    fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<f64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal
        let (idle, total): (f64, f64) = (fields[3] + fields[4], fields.iter().sum());
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `usage` is a valid, writable rusage.
        if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 || hz <= 0.0 {
            return None;
        }
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Some(Self {
            busy: (total - idle) / hz,
            total: total / hz,
            children: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        })
    }

    /// Fraction of all CPUs' time since `before` spent by processes other
    /// than our children (cargo and the benchmark).
    fn others_busy_since(&self, before: &Self) -> f64 {
        let total = self.total - before.total;
        if total <= 0.0 {
            return 0.0;
        }
        let others = (self.busy - before.busy) - (self.children - before.children);
        (others / total).clamp(0.0, 1.0)
    }
}

fn setup_info(results: &Results, quick: bool) -> String {
    let main_pinned = results.side_bool("meta", "main_pinned");
    let helper_pinned = IMPLS
        .iter()
        .filter_map(|name| results.side_bool(&format!("lossy_concurrent-{name}"), "pinned"))
        .chain(results.side_bool("drainer", "filler_pinned"))
        .reduce(|a, b| a && b);
    let pinning = match (main_pinned, helper_pinned) {
        (Some(true), Some(true) | None) => {
            "bench thread pinned to CPU 0, consumer / producer / filler threads to CPU 1"
        }
        (Some(true), Some(false)) => "bench thread pinned to CPU 0; helper threads NOT pinned",
        _ => "threads NOT pinned (fewer than 2 CPUs or sched_setaffinity refused)",
    };
    let mode = if quick {
        "quick (0.2 s warm-up, 0.6 s measurement per benchmark: indicative only)"
    } else {
        "full (1 s warm-up, 3 s measurement per benchmark)"
    };
    let rounds = match (
        results.side_f64("meta", "threaded_rounds"),
        results.side_f64("meta", "threaded_items_per_round"),
    ) {
        (Some(r), Some(n)) => format!("; two-thread rows: {r} interleaved rounds of {n} items each"),
        _ => String::new(),
    };
    format!(
        "setup:   {pinning}\n         payload: 24-byte Observation in every ring; capacity 4096; \
         1024 pushes per timed batch; consumers copy out 256 at a time\n\
         mode:    {mode}{rounds}"
    )
}
