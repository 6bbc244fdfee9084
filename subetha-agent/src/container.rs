//! Which container and service a process belongs to, from `/proc`.
//!
//! Container runtimes put each container in a cgroup whose path names it:
//! the agent reads `/proc/<pid>/cgroup` (seen from the host's cgroup
//! namespace, so the whole path) and recognises the layouts of docker,
//! containerd (Kubernetes' CRI and plain), cri-o and podman, with either
//! cgroup driver (`cgroupfs`: `/docker/<id>`, `/kubepods/…/pod<uid>/<id>`;
//! `systemd`: `docker-<id>.scope`, `cri-containerd-<id>.scope`,
//! `crio-<id>.scope`, `libpod-<id>.scope`), as the Parca and Pyroscope
//! agents and Tetragon do. A Kubernetes pod's uid is in the same path
//! (`pod<uid>`, or `pod<uid with _ for ->` under the systemd driver). The
//! service is what the application says it is (`SUBETHA_SERVICE` in its
//! environment) or its executable's name.
//!
//! Everything read here was written by (or for) another user's process:
//! reads are bounded, ids must have the exact shape of one, names are cut
//! and control characters replaced.

use std::io::Read as _;

/// Longest cgroup file read (a v1 system lists a dozen hierarchies).
const CGROUP_MAX_BYTES: u64 = 16 * 1024;
/// Longest environment read while looking for `SUBETHA_SERVICE`.
const ENVIRON_MAX_BYTES: u64 = 256 * 1024;
/// Longest name kept (cgroup paths: 256).
const NAME_MAX: usize = 64;
const CGROUP_PATH_MAX: usize = 256;

/// The environment variable an application names its service with.
pub const SERVICE_ENV: &str = "SUBETHA_SERVICE";

/// `--label-from`: where processes' container labels come from.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LabelFrom {
    /// `/proc/<pid>/cgroup`: cgroup, container id, pod uid.
    #[default]
    Cgroup,
    /// No container labels (nothing read).
    None,
}

/// What identifies a process beyond its pid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// Its executable's file name.
    pub exe: String,
    /// Its cgroup path (empty: not read or unknown).
    pub cgroup: String,
    /// The container its cgroup names.
    pub container_id: Option<String>,
    /// The Kubernetes pod its cgroup names.
    pub pod_uid: Option<String>,
    /// `SUBETHA_SERVICE`, else the executable's name.
    pub service: Option<String>,
}

impl Identity {
    /// Reads `pid`'s identity; parts that cannot be read stay empty.
    pub fn of(pid: u32, label_from: LabelFrom) -> Self {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .map(|n| sanitize(n.trim_end_matches(" (deleted)"), NAME_MAX))
            .unwrap_or_default();
        let mut identity = Self {
            service: service_from_environ(&read_bounded(&format!("/proc/{pid}/environ"), ENVIRON_MAX_BYTES))
                .or_else(|| (!exe.is_empty()).then(|| exe.clone())),
            exe,
            ..Self::default()
        };
        if label_from == LabelFrom::Cgroup {
            let text =
                String::from_utf8_lossy(&read_bounded(&format!("/proc/{pid}/cgroup"), CGROUP_MAX_BYTES))
                    .into_owned();
            identity.cgroup = sanitize(&cgroup_path(&text), CGROUP_PATH_MAX);
            identity.container_id = container_id(&identity.cgroup);
            identity.pod_uid = pod_uid(&identity.cgroup);
        }
        identity
    }
}

fn read_bounded(path: &str, max: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(max).read_to_end(&mut bytes);
    }
    bytes
}

/// The cgroup path that best names the process's container, from the text
/// of `/proc/<pid>/cgroup`: the v2 (`0::`) path, else the first v1
/// hierarchy whose path names a container, else the `name=systemd` one,
/// else the first.
pub fn cgroup_path(text: &str) -> String {
    let entries: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            Some((controllers, path))
        })
        .collect();
    if let Some((_, path)) = entries.iter().find(|(c, p)| c.is_empty() && *p != "/") {
        return (*path).to_string();
    }
    entries
        .iter()
        .find(|(_, p)| container_id(p).is_some())
        .or_else(|| entries.iter().find(|(c, _)| *c == "name=systemd"))
        .or_else(|| entries.first())
        .map(|(_, p)| (*p).to_string())
        .unwrap_or_default()
}

/// Prefixes a runtime gives a container's systemd scope.
const SCOPE_PREFIXES: [&str; 6] = [
    "docker-",
    "cri-containerd-",
    "crio-",
    "libpod-",
    "containerd-",
    "nerdctl-",
];

/// The container id a cgroup path names: its innermost component that is
/// a 64-digit hex id, bare or as `<runtime>-<id>.scope` (not a runtime's
/// monitor scope, `crio-conmon-…`, `libpod-conmon-…`).
pub fn container_id(path: &str) -> Option<String> {
    path.split('/').rev().find_map(|component| {
        if component.contains("conmon-") {
            return None;
        }
        let stem = component.strip_suffix(".scope").unwrap_or(component);
        let id = SCOPE_PREFIXES
            .iter()
            .find_map(|prefix| stem.strip_prefix(prefix))
            .unwrap_or(stem);
        is_container_id(id).then(|| id.to_ascii_lowercase())
    })
}

fn is_container_id(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The Kubernetes pod uid a cgroup path names (`pod<uid>` under cgroupfs,
/// `…-pod<uid with _ for ->.slice` under systemd), lower case with dashes.
pub fn pod_uid(path: &str) -> Option<String> {
    path.split('/').rev().find_map(|component| {
        let stem = component.strip_suffix(".slice").unwrap_or(component);
        let at = stem.rfind("pod")?;
        let uid = stem[at + 3..].replace('_', "-");
        is_uid(&uid).then(|| uid.to_ascii_lowercase())
    })
}

/// `8-4-4-4-12` hex digits.
fn is_uid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `SUBETHA_SERVICE` from a `/proc/<pid>/environ` (NUL-separated), if set
/// and not empty, sanitised.
pub fn service_from_environ(environ: &[u8]) -> Option<String> {
    let key = format!("{SERVICE_ENV}=");
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(key.as_bytes()))
        .map(|value| sanitize(&String::from_utf8_lossy(value), NAME_MAX))
        .filter(|value| !value.is_empty())
}

fn sanitize(text: &str, max: usize) -> String {
    text.trim()
        .chars()
        .take(max)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c6b0f2a6f9a1e5f3d1c2b3a4958677a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d";

    #[test]
    fn container_ids_of_each_runtime_and_driver() {
        let cases = [
            // docker, cgroupfs driver (v1 and v2).
            (format!("/docker/{ID}"), Some(ID)),
            // docker, systemd driver.
            (format!("/system.slice/docker-{ID}.scope"), Some(ID)),
            // rootless docker.
            (
                format!("/user.slice/user-1000.slice/user@1000.service/docker-{ID}.scope"),
                Some(ID),
            ),
            // containerd under Kubernetes, cgroupfs driver.
            (
                format!("/kubepods/burstable/pod6f8a9e3c-1b2d-4c5e-8f9a-0b1c2d3e4f5a/{ID}"),
                Some(ID),
            ),
            // containerd under Kubernetes, systemd driver.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f8a9e3c_1b2d_4c5e_8f9a_0b1c2d3e4f5a.slice/cri-containerd-{ID}.scope"
                ),
                Some(ID),
            ),
            // cri-o, and its monitor (not the container).
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d_4e5f_6a7b_8c9d_0e1f2a3b4c5d.slice/crio-{ID}.scope"
                ),
                Some(ID),
            ),
            (format!("/kubepods.slice/crio-conmon-{ID}.scope"), None),
            // podman, root and rootless (the container's own sub-cgroup).
            (format!("/machine.slice/libpod-{ID}.scope"), Some(ID)),
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
                ),
                Some(ID),
            ),
            (format!("/machine.slice/libpod-conmon-{ID}.scope"), None),
            // Plain containerd (namespace "default", cgroupfs).
            (format!("/default/{ID}"), Some(ID)),
            // Not containers.
            ("/user.slice/user-1000.slice/session-3.scope".to_string(), None),
            ("/system.slice/ssh.service".to_string(), None),
            ("/".to_string(), None),
            (format!("/docker/{}", &ID[..63]), None),
            (format!("/docker/{}z", &ID[..63]), None),
        ];
        for (path, expected) in cases {
            assert_eq!(container_id(&path).as_deref(), expected, "{path}");
        }
        // Upper-case hex is normalised.
        assert_eq!(
            container_id(&format!("/docker/{}", ID.to_ascii_uppercase())).as_deref(),
            Some(ID)
        );
    }

    #[test]
    fn pod_uids_under_both_drivers() {
        let uid = "6f8a9e3c-1b2d-4c5e-8f9a-0b1c2d3e4f5a";
        assert_eq!(
            pod_uid(&format!("/kubepods/burstable/pod{uid}/{ID}")).as_deref(),
            Some(uid)
        );
        assert_eq!(
            pod_uid(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
                uid.replace('-', "_")
            ))
            .as_deref(),
            Some(uid)
        );
        // Guaranteed QoS pods sit directly under kubepods.
        assert_eq!(
            pod_uid(&format!(
                "/kubepods.slice/kubepods-pod{}.slice",
                uid.replace('-', "_")
            ))
            .as_deref(),
            Some(uid)
        );
        assert_eq!(pod_uid(&format!("/docker/{ID}")), None);
        assert_eq!(pod_uid("/kubepods/burstable/podnot-a-uid"), None);
    }

    #[test]
    fn the_cgroup_that_names_the_container() {
        // cgroup v2: one line.
        assert_eq!(
            cgroup_path(&format!("0::/system.slice/docker-{ID}.scope\n")),
            format!("/system.slice/docker-{ID}.scope")
        );
        // cgroup v1: the hierarchy naming the container wins.
        let v1 = format!(
            "12:pids:/user.slice\n11:memory:/docker/{ID}\n1:name=systemd:/system.slice/docker.service\n0::/\n"
        );
        assert_eq!(cgroup_path(&v1), format!("/docker/{ID}"));
        // No container: the systemd hierarchy.
        assert_eq!(
            cgroup_path("3:cpu:/\n1:name=systemd:/user.slice/session-1.scope\n0::/\n"),
            "/user.slice/session-1.scope"
        );
        assert_eq!(cgroup_path(""), "");
        assert_eq!(cgroup_path("garbage"), "");
    }

    #[test]
    fn service_from_the_environment() {
        assert_eq!(
            service_from_environ(b"PATH=/bin\0SUBETHA_SERVICE=checkout\0HOME=/\0").as_deref(),
            Some("checkout")
        );
        assert_eq!(service_from_environ(b"PATH=/bin\0SUBETHA_SERVICE=\0"), None);
        assert_eq!(service_from_environ(b"XSUBETHA_SERVICE=no\0"), None);
        let hostile = service_from_environ(b"SUBETHA_SERVICE=\x1b[31mred\nline\0").unwrap();
        assert!(!hostile.chars().any(char::is_control), "{hostile:?}");
        let long = [b"SUBETHA_SERVICE=".as_slice(), &[b'a'; 500]].concat();
        assert_eq!(service_from_environ(&long).unwrap().len(), NAME_MAX);
    }

    #[test]
    fn our_own_identity() {
        let me = Identity::of(std::process::id(), LabelFrom::Cgroup);
        assert!(!me.exe.is_empty());
        assert!(me.cgroup.starts_with('/'), "{me:?}");
        assert!(me.service.is_some());
        let none = Identity::of(std::process::id(), LabelFrom::None);
        assert_eq!(
            (none.cgroup.as_str(), none.container_id, none.pod_uid),
            ("", None, None)
        );
    }
}
