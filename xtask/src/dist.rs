//! `cargo xtask dist`: what an operator installs, in `target/dist/`.
//!
//! ```text
//! target/dist/
//!   bin/subetha-agent                      release build (with the eBPF probes)
//!   share/man/man1/subetha-agent*.1        one page per (sub)command
//!   share/bash-completion/completions/subetha-agent
//!   share/zsh/site-functions/_subetha-agent
//!   share/fish/vendor_completions.d/subetha-agent.fish
//!   lib/systemd/system/subetha-agent.service
//!   etc/subetha/agent.toml.example
//! ```
//!
//! xtask does not link the agent (its build needs the eBPF toolchain set
//! up first): it builds it, then runs the fresh binary's hidden
//! `generate man|completions` commands, and checks the example config with
//! the binary's own `config check`. The directory is recreated each time,
//! so nothing stale is shipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{cargo, workspace_root};

#[derive(clap::Args)]
pub struct DistArgs {
    /// Build the agent without the eBPF probes (no nightly/bpf-linker needed;
    /// storms then get causes inferred from /proc only).
    #[arg(long)]
    no_probes: bool,
}

pub fn run(args: &DistArgs) -> Result<()> {
    let mut build = vec![
        "build",
        "--release",
        "-p",
        "subetha-agent",
        "--bin",
        "subetha-agent",
    ];
    if args.no_probes {
        build.push("--no-default-features");
    } else {
        crate::setup::run().context("the eBPF toolchain (or use `cargo xtask dist --no-probes`)")?;
    }
    cargo(&build, &[])?;
    let target = target_dir();
    let built = target.join("release/subetha-agent");
    let dist = target.join("dist");
    if dist.exists() {
        std::fs::remove_dir_all(&dist).with_context(|| format!("removing the old {}", dist.display()))?;
    }
    let contrib = workspace_root().join("subetha-agent/contrib");

    let bin = install(&built, &dist.join("bin/subetha-agent"))?;
    agent(
        &bin,
        &["generate", "man", "--out-dir"],
        &dist.join("share/man/man1"),
    )?;
    let completions = dist.join("completions.tmp");
    agent(&bin, &["generate", "completions", "--out-dir"], &completions)?;
    for (file, destination) in [
        (
            "subetha-agent.bash",
            "share/bash-completion/completions/subetha-agent",
        ),
        ("_subetha-agent", "share/zsh/site-functions/_subetha-agent"),
        (
            "subetha-agent.fish",
            "share/fish/vendor_completions.d/subetha-agent.fish",
        ),
    ] {
        install(&completions.join(file), &dist.join(destination))?;
    }
    std::fs::remove_dir_all(&completions)?;
    install(
        &contrib.join("systemd/subetha-agent.service"),
        &dist.join("lib/systemd/system/subetha-agent.service"),
    )?;
    let example = install(
        &contrib.join("agent.toml.example"),
        &dist.join("etc/subetha/agent.toml.example"),
    )?;
    // The shipped example must be a valid config.
    let check = Command::new(&bin)
        .args(["config", "check", "--config"])
        .arg(&example)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !check.status.success() {
        bail!(
            "the example config is invalid:\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
    eprintln!("xtask dist: wrote {}", dist.display());
    for entry in walk(&dist)? {
        eprintln!("  {}", entry.strip_prefix(&dist).unwrap_or(&entry).display());
    }
    Ok(())
}

/// `$CARGO_TARGET_DIR` or the workspace's `target/`.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("target"),
    }
}

/// Copies `from` to `to` (creating its directory), keeping the mode.
fn install(from: &Path, to: &Path) -> Result<PathBuf> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(to.to_path_buf())
}

/// Runs `bin args dir`.
fn agent(bin: &Path, args: &[&str], dir: &Path) -> Result<()> {
    let status = Command::new(bin)
        .args(args)
        .arg(dir)
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!(
            "{} {} {} failed ({status})",
            bin.display(),
            args.join(" "),
            dir.display()
        );
    }
    Ok(())
}

/// Every file under `dir`, sorted.
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}
