//! `subetha-agent doctor` as an unprivileged user gives true advice: it
//! runs as `nobody` (uid/gid 65534, no supplementary groups; when the test
//! is not root, as the test's own user) from a copy of the binary that
//! user can execute.
//!
//! * tracefs: when `/proc/self/mountinfo` lists a tracefs mount, doctor
//!   never says "not mounted"; when that user cannot read its `events`
//!   directory (mode 0700, the default), doctor says it is mounted there
//!   but not readable by that uid, and what to do;
//! * the probes: without the capabilities, the failure says "needs root,
//!   or CAP_BPF + CAP_PERFMON" and is the same sentence on every run (no
//!   map name that changes with the kernel's creation order).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use subetha_tests::agent::{ScratchDir, agent_exe};
use subetha_tests::getuid;

const NOBODY: u32 = 65534;

fn unprivileged(command: &mut Command) -> &mut Command {
    if getuid() == 0 {
        command.uid(NOBODY).gid(NOBODY);
    }
    command
}

/// Copies the agent into `dir` (mode 755), so the unprivileged user can run it.
fn installed(dir: &ScratchDir) -> PathBuf {
    std::fs::set_permissions(dir.join(""), std::fs::Permissions::from_mode(0o755)).expect("chmod the dir");
    let copy = dir.join("subetha-agent");
    std::fs::copy(agent_exe(), &copy).expect("copy the agent");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).expect("chmod 755");
    copy
}

/// `doctor --json` run unprivileged: (name, status, detail) per check.
fn doctor(exe: &Path) -> Vec<(String, String, String)> {
    doctor_with(exe, &[])
}

/// [`doctor`], under `wrapper` (a command line ending where the agent's
/// begins) instead of dropping to `nobody` itself.
fn doctor_with(exe: &Path, wrapper: &[&str]) -> Vec<(String, String, String)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let output = loop {
        let mut command = match wrapper.split_first() {
            None => Command::new(exe),
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(exe);
                command
            }
        };
        command
            .args(["doctor", "--json"])
            .current_dir("/")
            .env("SUBETHA_LOG", "warn")
            .stdin(Stdio::null());
        if wrapper.is_empty() {
            unprivileged(&mut command);
        }
        match command.output() {
            // The fresh copy may still be open for writing in a child another
            // test thread forked meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other.expect("run doctor"),
        }
    };
    assert!(
        output.status.success(),
        "doctor: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let checks: serde_json::Value = serde_json::from_slice(&output.stdout).expect("doctor --json parses");
    checks
        .as_array()
        .expect("a list of checks")
        .iter()
        .map(|c| {
            let field = |name: &str| c[name].as_str().unwrap_or_default().to_string();
            (field("name"), field("status"), field("detail"))
        })
        .collect()
}

fn check<'a>(checks: &'a [(String, String, String)], name: &str) -> &'a (String, String, String) {
    checks
        .iter()
        .find(|(n, _, _)| n == name)
        .unwrap_or_else(|| panic!("no {name} check: {checks:#?}"))
}

/// The tracefs mount points, as the test (root or not) sees them.
fn tracefs_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            (after.split_whitespace().next()? == "tracefs").then_some(())?;
            before.split_whitespace().nth(4).map(PathBuf::from)
        })
        .collect()
}

/// Whether the unprivileged user can list `dir`.
fn readable_unprivileged(dir: &Path) -> bool {
    let mut command = Command::new("ls");
    command
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .current_dir("/");
    unprivileged(&mut command).status().expect("run ls").success()
}

#[test]
fn doctor_as_a_user_tells_the_truth_about_tracefs_and_privileges() {
    let scratch = ScratchDir::new("doctor-unprivileged");
    let exe = installed(&scratch);
    let first = doctor(&exe);
    let uid = if getuid() == 0 { NOBODY } else { getuid() };

    let (_, status, detail) = check(&first, "tracefs");
    let mounts = tracefs_mounts();
    eprintln!("tracefs mounts {mounts:?}; doctor: {status} {detail}");
    if !mounts.is_empty() {
        assert!(
            !detail.contains("not mounted"),
            "tracefs is mounted at {mounts:?}: {detail}"
        );
        let readable = mounts
            .iter()
            .any(|root| readable_unprivileged(&root.join("events")));
        if readable {
            assert_eq!(status, "ok", "{detail}");
            assert!(detail.starts_with("mounted at "), "{detail}");
        } else {
            assert_eq!(status, "warn", "{detail}");
            let root = mounts[0].display().to_string();
            assert!(
                detail.contains(&format!(
                    "tracefs is mounted at {root} but not readable by uid {uid}"
                )),
                "{detail}"
            );
            assert!(detail.contains("run as root"), "{detail}");
            let (_, _, switch) = check(&first, "tracepoint sched/sched_switch");
            assert!(switch.contains("not readable"), "{switch}");
        }
    } else {
        assert!(detail.contains("not mounted"), "{detail}");
    }

    if getuid() == 0 {
        // nobody has no capabilities: the sentence says which are needed.
        let (_, status, probes) = check(&first, "probes");
        assert_eq!(status, "warn", "{probes}");
        assert!(
            probes.contains("needs root, or CAP_BPF + CAP_PERFMON"),
            "{probes}"
        );
        assert!(
            probes.contains(&format!("uid {uid} has effective capabilities: none")),
            "{probes}"
        );
        let (_, _, caps) = check(&first, "capabilities");
        assert!(caps.contains("needs root, or CAP_BPF + CAP_PERFMON"), "{caps}");
        for _ in 0..3 {
            let again = doctor(&exe);
            assert_eq!(&check(&again, "probes").2, probes, "the same advice on every run");
        }
    } else {
        eprintln!("not root: the probes' privilege advice is checked only when the test runs as root");
    }
}

/// With CAP_BPF + CAP_PERFMON but not CAP_SYS_ADMIN (ambient capabilities
/// of `nobody`, through setpriv), the probes load; a uprobe the kernel
/// refuses says what uprobes need.
#[test]
fn doctor_with_bpf_and_perfmon_says_what_uprobes_need() {
    if getuid() != 0 {
        eprintln!("not root: cannot grant capabilities to another user; nothing checked");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("SUBETHA_REQUIRE_TOOLS").is_none(),
            "setpriv (util-linux) is required (SUBETHA_REQUIRE_TOOLS is set)"
        );
        eprintln!("*** SKIPPING: setpriv is not installed ***");
        return;
    }
    let scratch = ScratchDir::new("doctor-bpf-perfmon");
    let exe = installed(&scratch);
    let wrapper = [
        "setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--inh-caps",
        "+bpf,+perfmon",
        "--ambient-caps",
        "+bpf,+perfmon",
    ];
    let checks = doctor_with(&exe, &wrapper);
    let (_, _, caps) = check(&checks, "capabilities");
    if !(caps.contains("CAP_BPF") && caps.contains("CAP_PERFMON")) {
        panic!("setpriv did not grant CAP_BPF + CAP_PERFMON: {caps}");
    }
    let (_, _, probes) = check(&checks, "probes");
    assert!(
        !probes.contains("needs root, or CAP_BPF + CAP_PERFMON;"),
        "the capabilities suffice to load: {probes}"
    );
    let programs: Vec<&(String, String, String)> = checks
        .iter()
        .filter(|(n, _, _)| n.starts_with("probe "))
        .collect();
    assert!(
        !programs.is_empty(),
        "the probes loaded, so each program has a line: {checks:#?}"
    );
    for (name, status, detail) in &programs {
        let denied = detail.contains("Permission denied") || detail.contains("Operation not permitted");
        if name.starts_with("probe up_") && denied {
            assert_eq!(status, "missing", "{name}: {detail}");
            assert!(
                detail.contains("uprobes need root or CAP_SYS_ADMIN"),
                "{name}: {detail}"
            );
        }
    }
    eprintln!("{probes}");
}
