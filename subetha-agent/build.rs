//! Builds the eBPF probes (`subetha-probes`' binary target) into `OUT_DIR`
//! when the `probes` feature is on.
//!
//! aya-build runs `cargo build --package subetha-probes --bins --release
//! --target bpfel-unknown-none -Z build-std=core` under `rustup run nightly`
//! (user space stays on the toolchain that runs this script) with its own
//! target directory under `OUT_DIR`, and copies the linked object to
//! `OUT_DIR/subetha-probes`, which `probes::loader` embeds. That needs the
//! nightly toolchain with `rust-src` and `bpf-linker` (`cargo xtask setup`).
//!
//! aya-build reports every line of that nested build as a cargo warning,
//! which cargo would then replay on every later build. So this script runs
//! aya-build in a copy of itself and passes on only what matters: the
//! rerun directives, real compiler diagnostics, and everything when the
//! build fails.
//!
//! `AYA_BUILD_SKIP=1` builds nothing; the agent is then built without the
//! object and reports the probes as not built in (cfg
//! `subetha_probes_skipped`), exactly like a build without the feature.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(subetha_probes_skipped)");
    #[cfg(feature = "probes")]
    probes::build();
}

#[cfg(feature = "probes")]
mod probes {
    use std::env;
    use std::path::PathBuf;
    use std::process::Command;

    /// Set in the copy of this script that runs aya-build.
    const CHILD: &str = "SUBETHA_AYA_BUILD_CHILD";

    pub fn build() {
        if env::var_os(CHILD).is_some() {
            run_aya_build();
            return;
        }
        println!("cargo::rerun-if-env-changed=AYA_BUILD_SKIP");
        let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        if skip {
            println!("cargo::rustc-cfg=subetha_probes_skipped");
            println!("cargo::warning=AYA_BUILD_SKIP is set: subetha-agent is built without its eBPF probes");
            return;
        }
        if let Some(linker) = find_in_path("bpf-linker") {
            // Rebuild the probes when bpf-linker is rebuilt (a nightly update).
            println!("cargo::rerun-if-changed={}", linker.display());
        }
        let script = env::current_exe().expect("build script path");
        let output = Command::new(script)
            .env(CHILD, "1")
            .output()
            .expect("running the eBPF build");
        let ok = output.status.success();
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let warning = line
                .strip_prefix("cargo:warning=")
                .or_else(|| line.strip_prefix("cargo::warning="));
            match warning {
                Some(message) if ok && is_progress(message) => {}
                Some(message) => println!("cargo::warning={message}"),
                None => println!("{line}"),
            }
        }
        if !ok {
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
            panic!(
                "building the eBPF probes failed (see the warnings above). They need the nightly \
                 toolchain with rust-src and bpf-linker built against nightly's LLVM (`cargo xtask \
                 setup` installs both). To build the agent without probes, use \
                 `--no-default-features` or set AYA_BUILD_SKIP=1."
            );
        }
    }

    /// The nested cargo's progress lines, not worth a warning.
    fn is_progress(message: &str) -> bool {
        let message = message.trim_start();
        message.is_empty()
            || [
                "Compiling ",
                "Finished ",
                "Downloaded ",
                "Downloading ",
                "Updating ",
                "Locking ",
                "Blocking ",
                "Fresh ",
                "Checking ",
                "Adding ",
            ]
            .iter()
            .any(|prefix| message.starts_with(prefix))
    }

    /// In the child: aya-build, printing its directives for the parent.
    fn run_aya_build() {
        let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
        let probes_dir = manifest_dir.join("..").join("subetha-probes");
        let probes_dir = probes_dir.canonicalize().unwrap_or(probes_dir);
        let root_dir = probes_dir.to_str().expect("subetha-probes path is not UTF-8");
        let package = aya_build::Package {
            name: "subetha-probes",
            root_dir,
            ..Default::default()
        };
        if let Err(error) = aya_build::build_ebpf([package], aya_build::Toolchain::default()) {
            println!("cargo:warning={error:#}");
            std::process::exit(1);
        }
    }

    fn find_in_path(name: &str) -> Option<PathBuf> {
        env::split_paths(&env::var_os("PATH")?)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    }
}
