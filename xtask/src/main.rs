//! `cargo xtask`: the project's automation, in Rust so it runs wherever
//! cargo does.
//!
//! * `setup` — what a fresh machine lacks for the eBPF probes (idempotent).
//! * `ci`    — setup, then everything CI checks: formatting, clippy with
//!   warnings as errors, the whole test suite, the loom models, and the
//!   demo.
//! * `bench` — the comparative benchmarks, summarised as one table.
//! * `demo`  — the agent and an instrumented workload, with a drop storm.
//! * `fuzz`  — the cargo-fuzz targets, for a bounded time.
//! * `dist`  — the release agent, man pages, completions, systemd unit and
//!   example config in `target/dist/`.

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod demo;
mod dist;
mod fuzz;
mod setup;

#[derive(Parser)]
#[command(about = "subetha project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what a fresh machine lacks (nightly rust-src, bpf-linker, tracefs).
    Setup,
    /// Setup, then format check, clippy -D warnings, all tests, loom models, the demo.
    Ci,
    /// Run the comparative benchmarks and print one table with ratios.
    Bench(bench::BenchArgs),
    /// The agent plus an instrumented workload, with a drop storm diagnosed.
    Demo(demo::DemoArgs),
    /// Fuzz segment validation and draining for a bounded time.
    Fuzz(fuzz::FuzzArgs),
    /// Release agent, man pages, completions, systemd unit, example config in target/dist/.
    Dist(dist::DistArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Setup => setup::run(),
        Task::Ci => ci(),
        Task::Bench(args) => bench::run(&args),
        Task::Demo(args) => demo::run(&args),
        Task::Fuzz(args) => fuzz::run(&args),
        Task::Dist(args) => dist::run(&args),
    }
}

fn ci() -> Result<()> {
    setup::run()?;
    cargo(&["fmt", "--all", "--check"], &[])?;
    cargo(
        &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"],
        &[],
    )?;
    cargo(&["test", "--workspace", "--all-targets"], &[])?;
    cargo(&["test", "--workspace", "--doc"], &[])?;
    // The optional async primitives.
    cargo(
        &[
            "test",
            "-p",
            "subetha-core",
            "--features",
            "tokio",
            "--lib",
            "primitives",
        ],
        &[],
    )?;
    // loom: model-check the ring under every interleaving it allows. A
    // separate target dir keeps the cfg from invalidating the normal build.
    let loom = [("RUSTFLAGS", "--cfg loom")];
    cargo(
        &[
            "clippy",
            "-p",
            "subetha-core",
            "--lib",
            "--tests",
            "--target-dir",
            "target/loom",
            "--",
            "-D",
            "warnings",
        ],
        &loom,
    )?;
    cargo(
        &[
            "test",
            "-p",
            "subetha-core",
            "--lib",
            "--release",
            "--target-dir",
            "target/loom",
            "loom",
        ],
        &loom,
    )?;
    // The README's other command: the demo, with its storm and its books,
    // so that a change that breaks it fails here, not in a newcomer's hands.
    demo::run(&demo::DemoArgs { seconds: 6 })?;
    eprintln!("xtask ci: all checks passed");
    Ok(())
}

/// Runs `cargo <args>` from the workspace root with extra environment.
pub(crate) fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("running {cargo}"))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

pub(crate) fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}
