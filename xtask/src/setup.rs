//! `cargo xtask setup`: installs what a fresh machine lacks to build and run
//! the eBPF probes, idempotently.
//!
//! * the nightly toolchain and its `rust-src` (aya-build compiles the probes
//!   with `-Z build-std=core`);
//! * `bpf-linker`, built against nightly's own LLVM (a plain `cargo install
//!   bpf-linker` cannot find `-lLLVM`). A stamp file records which libLLVM it
//!   was built against; when that nightly is gone or updated, it is rebuilt;
//! * tracefs mounted at `/sys/kernel/tracing` (root only; without root the
//!   sched tracepoints are skipped at run time and `doctor` says so).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

const NIGHTLY: &str = "nightly";

pub fn run() -> Result<()> {
    ensure_nightly()?;
    ensure_bpf_linker()?;
    ensure_tracefs();
    eprintln!("xtask setup: done");
    Ok(())
}

fn rustup(args: &[&str]) -> Result<()> {
    let status = Command::new("rustup")
        .args(args)
        .status()
        .context("running rustup")?;
    if !status.success() {
        bail!("rustup {} failed", args.join(" "));
    }
    Ok(())
}

fn ensure_nightly() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["run", NIGHTLY, "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        eprintln!("xtask setup: installing the nightly toolchain");
        rustup(&["toolchain", "install", NIGHTLY, "--profile", "minimal"])?;
    }
    let components = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", NIGHTLY])
        .output()
        .context("listing nightly components")?;
    if !String::from_utf8_lossy(&components.stdout)
        .lines()
        .any(|l| l.starts_with("rust-src"))
    {
        eprintln!("xtask setup: adding rust-src to nightly");
        rustup(&["component", "add", "rust-src", "--toolchain", NIGHTLY])?;
    }
    Ok(())
}

/// The nightly sysroot's `libLLVM.so.*`.
fn nightly_libllvm() -> Result<PathBuf> {
    let sysroot = Command::new("rustup")
        .args(["run", NIGHTLY, "rustc", "--print", "sysroot"])
        .output()
        .context("asking nightly for its sysroot")?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    let lib = sysroot.join("lib");
    let found = std::fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        });
    found.with_context(|| format!("no libLLVM.so.* in {}", lib.display()))
}

/// LLVM major version from a name like `libLLVM.so.22.1-rust-1.97.0-nightly`.
fn llvm_major(lib: &Path) -> Result<u32> {
    let name = lib.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.trim_start_matches("libLLVM.so.")
        .split(['.', '-'])
        .next()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("cannot read the LLVM version from {name}"))
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"))
}

fn ensure_bpf_linker() -> Result<()> {
    let libllvm = nightly_libllvm()?;
    let stamp_path = cargo_home().join("bpf-linker.subetha-stamp");
    let stamp = libllvm.display().to_string();
    let linker = cargo_home().join("bin/bpf-linker");
    let current = std::fs::read_to_string(&stamp_path).unwrap_or_default();
    let works = Command::new(&linker)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    // Built by hand with the same recipe? Then the loader resolves libLLVM
    // to nightly's copy.
    let file_name = libllvm.file_name().context("libLLVM has a name")?;
    let linked_to_nightly = Command::new("ldd")
        .arg(&linker)
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(file_name.to_string_lossy().as_ref()));
    if works && (current.trim() == stamp || linked_to_nightly) {
        eprintln!("xtask setup: bpf-linker is built against {}", libllvm.display());
        return Ok(());
    }
    let major = llvm_major(&libllvm)?;
    eprintln!("xtask setup: building bpf-linker against nightly's LLVM {major} (about a minute)");
    // An LLVM "prefix" whose lib/ holds nightly's libLLVM, for bpf-linker's
    // build script (in CARGO_HOME, so no root is needed).
    let prefix = cargo_home().join("subetha-rustllvm");
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib).with_context(|| format!("creating {}", prefix_lib.display()))?;
    for link in [prefix_lib.join("libLLVM.so"), prefix_lib.join(file_name)] {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("linking {} to {}", link.display(), libllvm.display()))?;
    }
    let status = Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--force",
            "--no-default-features",
            "--features",
        ])
        .arg(format!("llvm-{major}"))
        .env("LLVM_PREFIX", &prefix)
        .status()
        .context("running cargo install bpf-linker")?;
    if !status.success() {
        bail!("building bpf-linker failed");
    }
    std::fs::write(&stamp_path, &stamp).context("writing the bpf-linker stamp")?;
    Ok(())
}

fn ensure_tracefs() {
    let root = Path::new("/sys/kernel/tracing");
    if root.join("events").exists() {
        return;
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "xtask setup: tracefs is not mounted and we are not root: sched tracepoints will be skipped"
        );
        return;
    }
    let status = Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status();
    match status {
        Ok(s) if s.success() => eprintln!("xtask setup: mounted tracefs"),
        _ => eprintln!("xtask setup: mounting tracefs failed: sched tracepoints will be skipped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llvm_major() {
        let lib = Path::new("/x/libLLVM.so.22.1-rust-1.97.0-nightly");
        assert_eq!(llvm_major(lib).unwrap(), 22);
        assert!(llvm_major(Path::new("/x/libLLVM.so.")).is_err());
    }
}
