//! `cargo xtask fuzz`: runs the cargo-fuzz targets for a bounded time.
//!
//! cargo-fuzz needs a nightly toolchain (libFuzzer's sanitizer flags); the
//! fuzz crate lives in `subetha-core/fuzz`, outside the workspace. Installs
//! cargo-fuzz when it is missing.

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::workspace_root;

/// Options of `cargo xtask fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds to fuzz each target.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

const TARGETS: [&str; 1] = ["hostile_segment"];

pub fn run(args: &FuzzArgs) -> Result<()> {
    let has_fuzz = Command::new("rustup")
        .args(["run", "nightly", "cargo", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_fuzz {
        eprintln!("xtask fuzz: installing cargo-fuzz");
        let status = Command::new("cargo")
            .args(["install", "cargo-fuzz", "--locked"])
            .status()
            .context("running cargo install")?;
        if !status.success() {
            bail!("cargo install cargo-fuzz failed");
        }
    }
    for target in TARGETS {
        eprintln!("xtask fuzz: {target} for {} s", args.seconds);
        let status = Command::new("rustup")
            .args([
                "run",
                "nightly",
                "cargo",
                "fuzz",
                "run",
                "--fuzz-dir",
                "subetha-core/fuzz",
                target,
                "--",
            ])
            .arg(format!("-max_total_time={}", args.seconds))
            .arg("-rss_limit_mb=2048")
            .arg("-timeout=10")
            .current_dir(workspace_root())
            .status()
            .context("running cargo fuzz")?;
        if !status.success() {
            bail!("fuzz target {target} found a failure (see subetha-core/fuzz/artifacts/{target})");
        }
    }
    Ok(())
}
