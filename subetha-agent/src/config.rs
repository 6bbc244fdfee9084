//! The settings of `subetha-agent run`: its command-line flags, the TOML
//! config file, and how the two combine into one [`RunSettings`].
//!
//! # The file
//!
//! `--config PATH` names it; without the flag `/etc/subetha/agent.toml`
//! ([`DEFAULT_CONFIG_PATH`]) is read when it exists (a missing default file
//! is fine, a missing file given with `--config` is an error). Every `run`
//! flag has a key of the same name in snake case (`--max-scan-interval` →
//! `max_scan_interval`, `--pid` → `pids`, a list), plus `log_format`.
//! Durations are strings in humantime syntax (`"10ms"`, `"1m 30s"`).
//!
//! # Promises
//!
//! * Precedence: built-in defaults < the file < flags given on the command
//!   line. A flag's clap default never overrides the file: only a flag the
//!   user typed ([`clap::parser::ValueSource::CommandLine`]) or set through
//!   an environment variable does.
//! * An unknown key is an error naming the key and the file; so is a value
//!   of the wrong type or syntax.
//! * Validation errors name the setting as the user wrote it: `--flag` when
//!   it came from the command line, `key (in FILE)` when from the file.

use std::collections::BTreeMap;
use std::convert::identity;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::agent::{AgentConfig, ProbeMode};
use crate::client::AgentAddr;
use crate::container::LabelFrom;
use crate::logging::LogFormat;

/// The config file read when `--config` is not given (if it exists).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/subetha/agent.toml";

/// `--probes auto|on|off` / `probes = "auto"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbesSetting {
    /// Load them when privileges and kernel allow; else one warning.
    #[default]
    Auto,
    /// Load them or refuse to start.
    On,
    /// Never load them.
    Off,
}

impl From<ProbesSetting> for ProbeMode {
    fn from(probes: ProbesSetting) -> Self {
        match probes {
            ProbesSetting::Auto => ProbeMode::Auto,
            ProbesSetting::On => ProbeMode::On,
            ProbesSetting::Off => ProbeMode::Off,
        }
    }
}

/// `--adaptive-policy on|off` / `adaptive_policy = "on"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    /// Enabled.
    #[default]
    On,
    /// Disabled.
    Off,
}

/// What to scan and how often (shared by `run` and `snapshot`).
#[derive(clap::Args, Clone, Debug)]
pub struct ScanArgs {
    /// Only these processes (repeatable).
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Pause between /proc scans for new processes.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub discovery_interval: Duration,
    /// Longest pause between scans (the interval adapts below it).
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub max_scan_interval: Duration,
    /// Shortest pause between scans.
    #[arg(long, default_value = "100us", value_parser = humantime::parse_duration)]
    pub min_scan_interval: Duration,
    /// How long exited processes' final stats are kept.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// Pin the scan thread to this CPU.
    #[arg(long)]
    pub scanner_cpu: Option<usize>,
    /// eBPF probes: auto (load when privileges and kernel allow), on (fail
    /// without them), off.
    #[arg(long, value_enum, default_value_t = ProbesSetting::Auto)]
    pub probes: ProbesSetting,
}

impl ScanArgs {
    /// The agent configuration these flags ask for (the `snapshot`
    /// command's; `run` goes through [`RunSettings`]).
    pub fn agent_config(&self) -> Result<AgentConfig> {
        check_intervals(
            self.min_scan_interval,
            self.max_scan_interval,
            self.discovery_interval,
            |key| format!("--{}", key.replace('_', "-")),
        )?;
        Ok(AgentConfig {
            pids: (!self.pids.is_empty()).then(|| self.pids.clone()),
            discovery_interval: self.discovery_interval,
            min_scan_interval: self.min_scan_interval,
            max_scan_interval: self.max_scan_interval,
            retention: self.retention,
            scanner_cpu: self.scanner_cpu,
            probes: self.probes.into(),
            ..AgentConfig::default()
        })
    }
}

/// The flags of `run` (and of `config check`, which shows what `run` would
/// use).
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// Config file (TOML). Without this flag /etc/subetha/agent.toml is read
    /// if it exists. Flags given on the command line override it.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub scan: ScanArgs,
    /// Address for /metrics and the JSON API: HOST:PORT, or unix:PATH for
    /// a unix socket of mode 0600. Loopback by default; binding another
    /// interface must be asked for explicitly.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub listen: AgentAddr,
    /// Require `Authorization: Bearer <token>` on every HTTP request but
    /// /healthz, the token being the one line in PATH (read once at start,
    /// so it never shows in `ps`).
    #[arg(long, value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,
    /// Write storms and periodic snapshots as JSON lines to PATH (or - for
    /// stdout).
    #[arg(long, value_name = "PATH|-")]
    pub export_jsonl: Option<String>,
    /// Snapshot period in the JSON-lines export.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub export_interval: Duration,
    /// Registration socket applications announce new segments on
    /// (default: /run/subetha/agent.sock for root, else
    /// $XDG_RUNTIME_DIR/subetha/agent.sock).
    #[arg(long, value_name = "PATH", conflicts_with = "no_socket")]
    pub socket: Option<PathBuf>,
    /// Do not listen for registrations; discover through /proc only.
    #[arg(long)]
    pub no_socket: bool,
    /// Also push metrics to this OTLP/HTTP collector endpoint
    /// (e.g. http://127.0.0.1:4318/v1/metrics).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// The built-in adaptive-mutex policy: on (set the spin budgets of the
    /// drained processes' adaptive mutexes from what they are observed
    /// doing, as their own sidecar would) or off (leave policy words alone).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub adaptive_policy: Switch,
    /// Period of the OTLP export.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub otlp_interval: Duration,
    /// Ring counters on /metrics per thread (labels slot, tid, thread)
    /// instead of per process: costly, every thread that ever held a ring
    /// slot adds series, so thread churn grows a scraper's series without
    /// bound. The JSON API, top and storms always have per-thread detail.
    #[arg(long, value_enum, default_value_t = Switch::Off)]
    pub metrics_per_thread: Switch,
    /// Where processes' container labels come from: cgroup (container id
    /// and Kubernetes pod uid from /proc/<pid>/cgroup) or none.
    #[arg(long, value_enum, default_value_t = LabelFrom::Cgroup)]
    pub label_from: LabelFrom,
}

/// A duration written as a humantime string (`"10ms"`) in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"10ms\" or \"1m 30s\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<HumanDuration, E> {
                humantime::parse_duration(text)
                    .map(HumanDuration)
                    .map_err(|error| {
                        E::custom(format!(
                            "{text:?} is not a duration ({error}); write e.g. \"10ms\""
                        ))
                    })
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

/// The config file as written: every key optional, unknown keys refused.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `--listen`.
    pub listen: Option<AgentAddr>,
    /// `--auth-token-file`.
    pub auth_token_file: Option<PathBuf>,
    /// `--pid`, as a list.
    pub pids: Option<Vec<u32>>,
    /// `--discovery-interval`.
    pub discovery_interval: Option<HumanDuration>,
    /// `--max-scan-interval`.
    pub max_scan_interval: Option<HumanDuration>,
    /// `--min-scan-interval`.
    pub min_scan_interval: Option<HumanDuration>,
    /// `--retention`.
    pub retention: Option<HumanDuration>,
    /// `--scanner-cpu`.
    pub scanner_cpu: Option<usize>,
    /// `--probes`.
    pub probes: Option<ProbesSetting>,
    /// `--adaptive-policy`.
    pub adaptive_policy: Option<Switch>,
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--no-socket`.
    pub no_socket: Option<bool>,
    /// `--export-jsonl`.
    pub export_jsonl: Option<String>,
    /// `--export-interval`.
    pub export_interval: Option<HumanDuration>,
    /// `--otlp-endpoint`.
    pub otlp_endpoint: Option<String>,
    /// `--otlp-interval`.
    pub otlp_interval: Option<HumanDuration>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
    /// `--metrics-per-thread`.
    pub metrics_per_thread: Option<Switch>,
    /// `--label-from`.
    pub label_from: Option<LabelFrom>,
}

impl FileConfig {
    /// Parses `text`, read from `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        toml::from_str(text).map_err(|error| {
            anyhow::anyhow!("config file {}: {}", path.display(), error.to_string().trim_end())
        })
    }

    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text, path)
    }

    /// The file `run` uses: `explicit` (which must exist) or, without it,
    /// the default path if a file is there. `None`: no file.
    pub fn load(explicit: Option<&Path>) -> Result<Option<(PathBuf, Self)>> {
        Self::load_from(explicit, Path::new(DEFAULT_CONFIG_PATH))
    }

    fn load_from(explicit: Option<&Path>, default: &Path) -> Result<Option<(PathBuf, Self)>> {
        let path = match explicit {
            Some(path) => path,
            None if default.exists() => default,
            None => return Ok(None),
        };
        Ok(Some((path.to_path_buf(), Self::read(path)?)))
    }
}

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Nobody set it: the built-in default.
    Default,
    /// The config file.
    File,
    /// A flag (or its environment variable) on the command line.
    Flag,
}

/// What `run` does: every setting resolved, and where each came from.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSettings {
    /// HTTP address.
    pub listen: AgentAddr,
    /// The file holding the bearer token HTTP requests must carry.
    pub auth_token_file: Option<PathBuf>,
    /// Only these pids (empty: every process).
    pub pids: Vec<u32>,
    /// Pause between `/proc` scans.
    pub discovery_interval: Duration,
    /// Longest pause between scans.
    pub max_scan_interval: Duration,
    /// Shortest pause between scans.
    pub min_scan_interval: Duration,
    /// How long exited processes are kept.
    pub retention: Duration,
    /// CPU for the scan thread.
    pub scanner_cpu: Option<usize>,
    /// eBPF probes.
    pub probes: ProbesSetting,
    /// The adaptive-mutex policy.
    pub adaptive_policy: Switch,
    /// Ring counters per thread on /metrics.
    pub metrics_per_thread: Switch,
    /// Where container labels come from.
    pub label_from: LabelFrom,
    /// Registration socket path (None with `no_socket`: the default path).
    pub socket: Option<PathBuf>,
    /// No registration socket.
    pub no_socket: bool,
    /// JSON-lines export target.
    pub export_jsonl: Option<String>,
    /// JSON-lines snapshot period.
    pub export_interval: Duration,
    /// OTLP/HTTP endpoint.
    pub otlp_endpoint: Option<String>,
    /// OTLP export period.
    pub otlp_interval: Duration,
    /// Log format.
    pub log_format: LogFormat,
    /// The config file read, if any.
    pub config_file: Option<PathBuf>,
    /// Where each key's value came from.
    pub origins: BTreeMap<&'static str, Origin>,
}

/// Whether the user set argument `id` (rather than clap defaulting it).
fn given(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// The flag spelling of a key.
fn flag_name(key: &str) -> String {
    match key {
        "pids" => "--pid".into(),
        key => format!("--{}", key.replace('_', "-")),
    }
}

impl RunSettings {
    /// Combines `args` (parsed from `matches`, the `run` subcommand's
    /// matches) with `file`. `log_format` is the global flag's value and
    /// whether it was given.
    pub fn resolve(
        args: &RunArgs,
        matches: &ArgMatches,
        file: Option<(PathBuf, FileConfig)>,
        log_format: (LogFormat, bool),
    ) -> Result<Self> {
        let (config_file, file) = match file {
            Some((path, file)) => (Some(path), file),
            None => (None, FileConfig::default()),
        };
        let mut origins = BTreeMap::new();
        // `$key`: flag value if given, else the file's, else the flag's
        // default. `$wrap` turns the file's value into the flag's type.
        macro_rules! pick {
            ($key:ident, $flag:expr, $wrap:expr, given = $given:expr) => {{
                let key = stringify!($key);
                if $given {
                    origins.insert(key, Origin::Flag);
                    $flag
                } else if let Some(value) = file.$key.clone() {
                    origins.insert(key, Origin::File);
                    $wrap(value)
                } else {
                    origins.insert(key, Origin::Default);
                    $flag
                }
            }};
            ($key:ident, $flag:expr, $wrap:expr) => {
                pick!($key, $flag, $wrap, given = given(matches, stringify!($key)))
            };
        }
        let duration = |value: HumanDuration| value.0;
        let scan = &args.scan;
        let mut settings = Self {
            listen: pick!(listen, args.listen.clone(), identity),
            auth_token_file: pick!(auth_token_file, args.auth_token_file.clone(), Some),
            pids: pick!(pids, scan.pids.clone(), identity),
            discovery_interval: pick!(discovery_interval, scan.discovery_interval, duration),
            max_scan_interval: pick!(max_scan_interval, scan.max_scan_interval, duration),
            min_scan_interval: pick!(min_scan_interval, scan.min_scan_interval, duration),
            retention: pick!(retention, scan.retention, duration),
            scanner_cpu: pick!(scanner_cpu, scan.scanner_cpu, Some),
            probes: pick!(probes, scan.probes, identity),
            adaptive_policy: pick!(adaptive_policy, args.adaptive_policy, identity),
            metrics_per_thread: pick!(metrics_per_thread, args.metrics_per_thread, identity),
            label_from: pick!(label_from, args.label_from, identity),
            socket: pick!(socket, args.socket.clone(), Some),
            no_socket: pick!(no_socket, args.no_socket, identity),
            export_jsonl: pick!(export_jsonl, args.export_jsonl.clone(), Some),
            export_interval: pick!(export_interval, args.export_interval, duration),
            otlp_endpoint: pick!(otlp_endpoint, args.otlp_endpoint.clone(), Some),
            otlp_interval: pick!(otlp_interval, args.otlp_interval, duration),
            log_format: pick!(log_format, log_format.0, identity, given = log_format.1),
            config_file,
            origins,
        };
        // `--socket` and `--no-socket` exclude each other on the command
        // line (clap) and in the file (below); a flag beats the file's other one.
        match (
            settings.origin("socket").clone(),
            settings.origin("no_socket").clone(),
        ) {
            (Origin::Flag, Origin::File) => {
                settings.no_socket = false;
                settings.origins.insert("no_socket", Origin::Flag);
            }
            (Origin::File, Origin::Flag) => {
                settings.socket = None;
                settings.origins.insert("socket", Origin::Flag);
            }
            (Origin::File, Origin::File) if settings.no_socket => {
                bail!(
                    "{} and {} exclude each other",
                    settings.name("socket"),
                    settings.name("no_socket")
                );
            }
            _ => {}
        }
        settings.validate()?;
        Ok(settings)
    }

    /// Where `key` came from.
    pub fn origin(&self, key: &str) -> &Origin {
        self.origins.get(key).unwrap_or(&Origin::Default)
    }

    /// `key` as the user wrote it: `--flag`, or `key (in FILE)`.
    pub fn name(&self, key: &str) -> String {
        match (self.origin(key), &self.config_file) {
            (Origin::File, Some(path)) => format!("{key} (in {})", path.display()),
            (Origin::Flag, _) if key == "log_format" => "--log-format".into(),
            (Origin::Flag, _) => flag_name(key),
            _ => key.to_string(),
        }
    }

    fn validate(&self) -> Result<()> {
        check_intervals(
            self.min_scan_interval,
            self.max_scan_interval,
            self.discovery_interval,
            |key| self.name(key),
        )?;
        for (key, value) in [
            ("export_interval", self.export_interval),
            ("otlp_interval", self.otlp_interval),
        ] {
            if value.is_zero() {
                bail!("{} must be greater than zero", self.name(key));
            }
        }
        if let Some(target) = &self.export_jsonl
            && target.is_empty()
        {
            bail!("{} must be a path or -", self.name("export_jsonl"));
        }
        if let Some(endpoint) = &self.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            bail!(
                "{} must be an http:// or https:// URL, not {endpoint:?}",
                self.name("otlp_endpoint")
            );
        }
        Ok(())
    }

    /// The start-up warning `run` logs about who can read its HTTP
    /// answers, when there is something to warn about: a non-loopback TCP
    /// address (without a token: anyone who reaches it reads everything;
    /// with one: the token crosses the network in clear text).
    pub fn listen_warning(&self) -> Option<String> {
        let AgentAddr::Tcp(addr) = &self.listen else {
            return None;
        };
        if addr.ip().is_loopback() {
            return None;
        }
        Some(match self.auth_token_file {
            None => format!(
                "listening on {addr}, beyond loopback, without authentication: anyone who can \
                 reach this address reads the pids, uids, thread names and commands of every \
                 drained process; keep it on 127.0.0.1 (or a unix: socket) unless a scraper on \
                 another host needs it, and then set --auth-token-file and firewall the port"
            ),
            Some(_) => format!(
                "listening on {addr}, beyond loopback: requests need the bearer token, which \
                 crosses the network unencrypted (plain HTTP); firewall the port or put a TLS \
                 proxy in front"
            ),
        })
    }

    /// What `/metrics` serves beyond the default.
    pub fn metrics_options(&self) -> crate::metrics::MetricsOptions {
        crate::metrics::MetricsOptions {
            per_thread: self.metrics_per_thread == Switch::On,
        }
    }

    /// The scan thread's configuration.
    pub fn agent_config(&self) -> AgentConfig {
        AgentConfig {
            pids: (!self.pids.is_empty()).then(|| self.pids.clone()),
            discovery_interval: self.discovery_interval,
            min_scan_interval: self.min_scan_interval,
            max_scan_interval: self.max_scan_interval,
            retention: self.retention,
            scanner_cpu: self.scanner_cpu,
            probes: self.probes.into(),
            adaptive_policy: self.adaptive_policy == Switch::On,
            label_from: self.label_from,
            registration_socket: (!self.no_socket).then(|| {
                self.socket
                    .clone()
                    .unwrap_or_else(subetha_core::announce::user_socket_path)
            }),
            ..AgentConfig::default()
        }
    }

    /// The effective settings as a config file, each key annotated with
    /// where its value came from (what `config check` prints). Unset
    /// optional keys are shown commented out.
    pub fn to_toml(&self) -> String {
        let file = FileConfig {
            listen: Some(self.listen.clone()),
            auth_token_file: self.auth_token_file.clone(),
            pids: Some(self.pids.clone()),
            discovery_interval: Some(HumanDuration(self.discovery_interval)),
            max_scan_interval: Some(HumanDuration(self.max_scan_interval)),
            min_scan_interval: Some(HumanDuration(self.min_scan_interval)),
            retention: Some(HumanDuration(self.retention)),
            scanner_cpu: self.scanner_cpu,
            probes: Some(self.probes),
            adaptive_policy: Some(self.adaptive_policy),
            metrics_per_thread: Some(self.metrics_per_thread),
            label_from: Some(self.label_from),
            socket: self.socket.clone(),
            no_socket: Some(self.no_socket),
            export_jsonl: self.export_jsonl.clone(),
            export_interval: Some(HumanDuration(self.export_interval)),
            otlp_endpoint: self.otlp_endpoint.clone(),
            otlp_interval: Some(HumanDuration(self.otlp_interval)),
            log_format: Some(self.log_format),
        };
        let table = toml::Table::try_from(&file).expect("the settings serialise as a TOML table");
        let mut out = match &self.config_file {
            Some(path) => format!("# effective `run` settings; config file {}\n", path.display()),
            None => "# effective `run` settings; no config file\n".to_string(),
        };
        for key in FileConfig::KEYS {
            let from = match self.origin(key) {
                Origin::Default => "default".to_string(),
                Origin::File => "config file".to_string(),
                Origin::Flag => format!("command line ({})", self.name(key)),
            };
            match table.get(*key) {
                Some(value) => out.push_str(&format!("{key} = {value}  # {from}\n")),
                None => out.push_str(&format!("# {key} is unset  # {from}\n")),
            }
        }
        out
    }
}

impl FileConfig {
    /// Every key, in the order they are documented.
    pub const KEYS: &'static [&'static str] = &[
        "listen",
        "auth_token_file",
        "pids",
        "discovery_interval",
        "max_scan_interval",
        "min_scan_interval",
        "retention",
        "scanner_cpu",
        "probes",
        "adaptive_policy",
        "socket",
        "no_socket",
        "export_jsonl",
        "export_interval",
        "otlp_endpoint",
        "otlp_interval",
        "log_format",
        "metrics_per_thread",
        "label_from",
    ];
}

/// The scan intervals must be positive and ordered; `name` spells a key
/// for the message.
fn check_intervals(
    min: Duration,
    max: Duration,
    discovery: Duration,
    name: impl Fn(&str) -> String,
) -> Result<()> {
    for (key, value) in [
        ("min_scan_interval", min),
        ("max_scan_interval", max),
        ("discovery_interval", discovery),
    ] {
        if value.is_zero() {
            bail!("{} must be greater than zero", name(key));
        }
    }
    if min > max {
        bail!(
            "{} must not exceed {}",
            name("min_scan_interval"),
            name("max_scan_interval")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::*;

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        run: RunArgs,
    }

    /// Resolves `flags` against a file with `toml` in it.
    fn resolve(flags: &[&str], toml: Option<&str>) -> Result<RunSettings> {
        let matches = TestCli::command()
            .try_get_matches_from(std::iter::once("run").chain(flags.iter().copied()))
            .expect("flags parse");
        let cli = TestCli::from_arg_matches(&matches).expect("flags parse");
        let path = PathBuf::from("/test/agent.toml");
        let file = match toml {
            Some(text) => Some((path.clone(), FileConfig::parse(text, &path)?)),
            None => None,
        };
        RunSettings::resolve(&cli.run, &matches, file, (LogFormat::Text, false))
    }

    #[test]
    fn without_file_or_flags_the_flag_defaults_apply() {
        let settings = resolve(&[], None).unwrap();
        assert_eq!(settings.listen, "127.0.0.1:9464".parse().unwrap());
        assert_eq!(settings.max_scan_interval, Duration::from_millis(20));
        // The flag's default is the library's.
        assert_eq!(
            settings.max_scan_interval,
            crate::agent::DEFAULT_MAX_SCAN_INTERVAL
        );
        assert_eq!(settings.min_scan_interval, Duration::from_micros(100));
        assert_eq!(settings.retention, Duration::from_secs(600));
        assert_eq!(settings.probes, ProbesSetting::Auto);
        assert_eq!(settings.adaptive_policy, Switch::On);
        assert!(settings.agent_config().adaptive_policy);
        assert!(settings.origins.values().all(|o| *o == Origin::Default));
        assert_eq!(
            settings.origins.len(),
            FileConfig::KEYS.len(),
            "every key is resolved"
        );
    }

    #[test]
    fn only_listening_beyond_loopback_is_warned_about() {
        let quiet = resolve(&[], None).unwrap();
        assert_eq!(quiet.listen_warning(), None);
        let unix = resolve(&["--listen", "unix:/run/subetha/http.sock"], None).unwrap();
        assert_eq!(unix.listen_warning(), None);
        let ipv6_loopback = resolve(&["--listen", "[::1]:9464"], None).unwrap();
        assert_eq!(ipv6_loopback.listen_warning(), None);
        let open = resolve(&["--listen", "0.0.0.0:9464"], None).unwrap();
        let warning = open.listen_warning().expect("a warning");
        assert!(
            warning.contains("without authentication") && warning.contains("--auth-token-file"),
            "{warning}"
        );
        let tokened = resolve(&["--listen", "0.0.0.0:9464", "--auth-token-file", "/t"], None).unwrap();
        let warning = tokened.listen_warning().expect("a warning");
        assert!(
            warning.contains("unencrypted") && !warning.contains("without authentication"),
            "{warning}"
        );
    }

    #[test]
    fn every_key_is_read_from_the_file() {
        let text = r#"
            listen = "unix:/run/subetha/http.sock"
            auth_token_file = "/etc/subetha/token"
            pids = [7, 8]
            discovery_interval = "2s"
            max_scan_interval = "5ms"
            min_scan_interval = "1ms"
            retention = "1m"
            scanner_cpu = 1
            probes = "off"
            adaptive_policy = "off"
            socket = "/tmp/s.sock"
            no_socket = false
            export_jsonl = "-"
            export_interval = "3s"
            otlp_endpoint = "http://127.0.0.1:4318/v1/metrics"
            otlp_interval = "4s"
            log_format = "json"
            metrics_per_thread = "on"
            label_from = "none"
        "#;
        let settings = resolve(&[], Some(text)).unwrap();
        assert_eq!(settings.listen, AgentAddr::Unix("/run/subetha/http.sock".into()));
        assert_eq!(
            settings.auth_token_file,
            Some(PathBuf::from("/etc/subetha/token"))
        );
        assert_eq!(settings.pids, vec![7, 8]);
        assert_eq!(settings.discovery_interval, Duration::from_secs(2));
        assert_eq!(settings.max_scan_interval, Duration::from_millis(5));
        assert_eq!(settings.min_scan_interval, Duration::from_millis(1));
        assert_eq!(settings.retention, Duration::from_secs(60));
        assert_eq!(settings.scanner_cpu, Some(1));
        assert_eq!(settings.probes, ProbesSetting::Off);
        assert_eq!(settings.adaptive_policy, Switch::Off);
        assert!(!settings.agent_config().adaptive_policy);
        assert_eq!(settings.socket, Some(PathBuf::from("/tmp/s.sock")));
        assert!(!settings.no_socket);
        assert_eq!(settings.export_jsonl.as_deref(), Some("-"));
        assert_eq!(settings.export_interval, Duration::from_secs(3));
        assert_eq!(
            settings.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/metrics")
        );
        assert_eq!(settings.otlp_interval, Duration::from_secs(4));
        assert_eq!(settings.log_format, LogFormat::Json);
        assert_eq!(settings.metrics_per_thread, Switch::On);
        assert!(settings.metrics_options().per_thread);
        assert_eq!(settings.agent_config().label_from, LabelFrom::None);
        for key in FileConfig::KEYS {
            assert_eq!(settings.origin(key), &Origin::File, "{key}");
        }
        // Every key of the file is in KEYS and back.
        let table: toml::Table = text.parse().expect("valid TOML");
        assert_eq!(table.len(), FileConfig::KEYS.len(), "the test sets every key");
    }

    #[test]
    fn given_flags_override_the_file_and_clap_defaults_do_not() {
        let text = r#"
            max_scan_interval = "5ms"
            retention = "1m"
            listen = "127.0.0.1:1234"
            pids = [7]
        "#;
        let settings = resolve(&["--retention", "2m", "--pid", "9", "--pid", "10"], Some(text)).unwrap();
        assert_eq!(settings.retention, Duration::from_secs(120), "the flag wins");
        assert_eq!(settings.origin("retention"), &Origin::Flag);
        assert_eq!(settings.pids, vec![9, 10], "a list flag replaces the file's list");
        assert_eq!(
            settings.max_scan_interval,
            Duration::from_millis(5),
            "file beats default"
        );
        assert_eq!(settings.listen, "127.0.0.1:1234".parse().unwrap());
        assert_eq!(settings.discovery_interval, Duration::from_secs(1), "default");
        // A flag given with its default value still beats the file.
        let settings = resolve(&["--max-scan-interval", "20ms"], Some(text)).unwrap();
        assert_eq!(settings.max_scan_interval, Duration::from_millis(20));
    }

    #[test]
    fn log_format_flag_beats_the_file() {
        let path = PathBuf::from("/f.toml");
        let file = FileConfig::parse("log_format = \"json\"", &path).unwrap();
        let matches = TestCli::command().try_get_matches_from(["run"]).unwrap();
        let cli = TestCli::from_arg_matches(&matches).unwrap();
        let from_file = RunSettings::resolve(
            &cli.run,
            &matches,
            Some((path.clone(), file.clone())),
            (LogFormat::Text, false),
        )
        .unwrap();
        assert_eq!(from_file.log_format, LogFormat::Json);
        let from_flag =
            RunSettings::resolve(&cli.run, &matches, Some((path, file)), (LogFormat::Text, true)).unwrap();
        assert_eq!(from_flag.log_format, LogFormat::Text);
    }

    #[test]
    fn socket_flags_beat_the_files_opposite() {
        let settings = resolve(&["--no-socket"], Some("socket = \"/tmp/a.sock\"")).unwrap();
        assert!(settings.no_socket);
        assert_eq!(settings.agent_config().registration_socket, None);
        let settings = resolve(&["--socket", "/tmp/b.sock"], Some("no_socket = true")).unwrap();
        assert!(!settings.no_socket);
        assert_eq!(
            settings.agent_config().registration_socket,
            Some(PathBuf::from("/tmp/b.sock"))
        );
        let error = resolve(&[], Some("socket = \"/tmp/a.sock\"\nno_socket = true"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("socket (in /test/agent.toml)"), "{error}");
        assert!(error.contains("no_socket (in /test/agent.toml)"), "{error}");
    }

    #[test]
    fn unknown_keys_are_errors_naming_key_and_file() {
        let error = resolve(
            &[],
            Some("listen = \"127.0.0.1:1\"\nmax_scan_intervall = \"5ms\"\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("max_scan_intervall"), "{error}");
        assert!(error.contains("/test/agent.toml"), "{error}");
        assert!(error.contains("unknown field"), "{error}");
    }

    #[test]
    fn bad_values_name_the_key() {
        for (text, key, phrase) in [
            ("retention = \"soon\"", "retention", "soon"),
            ("retention = 5", "retention", "duration"),
            ("listen = \"nowhere\"", "listen", "nowhere"),
            ("probes = \"maybe\"", "probes", "maybe"),
            ("pids = [-1]", "pids", "-1"),
            ("log_format = \"xml\"", "log_format", "xml"),
        ] {
            let error = resolve(&[], Some(text)).unwrap_err().to_string();
            assert!(error.contains(key), "{text}: {error}");
            assert!(error.contains(phrase), "{text}: {error}");
            assert!(error.contains("/test/agent.toml"), "{text}: {error}");
        }
    }

    #[test]
    fn validation_names_where_the_value_came_from() {
        let error = resolve(&[], Some("max_scan_interval = \"0s\""))
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "max_scan_interval (in /test/agent.toml) must be greater than zero"
        );
        let error = resolve(
            &["--min-scan-interval", "20ms"],
            Some("max_scan_interval = \"5ms\""),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            error,
            "--min-scan-interval must not exceed max_scan_interval (in /test/agent.toml)"
        );
        let error = resolve(&["--otlp-interval", "0s"], None).unwrap_err().to_string();
        assert_eq!(error, "--otlp-interval must be greater than zero");
        let error = resolve(&[], Some("otlp_endpoint = \"127.0.0.1:4318\""))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("otlp_endpoint (in /test/agent.toml) must be an http"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_explicit_file_is_an_error_and_a_missing_default_is_not() {
        let missing = Path::new("/nonexistent/subetha/agent.toml");
        let error = FileConfig::load_from(Some(missing), Path::new("/nonexistent/default.toml")).unwrap_err();
        let text = format!("{error:#}");
        assert!(text.contains("/nonexistent/subetha/agent.toml"), "{text}");
        assert!(
            FileConfig::load_from(None, Path::new("/nonexistent/default.toml"))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_printed_settings_read_back_as_the_same_settings() {
        let settings = resolve(
            &[
                "--pid",
                "3",
                "--max-scan-interval",
                "7ms",
                "--otlp-endpoint",
                "http://x:1/v1/metrics",
            ],
            Some("retention = \"90s\"\nscanner_cpu = 0"),
        )
        .unwrap();
        let printed = settings.to_toml();
        assert!(
            printed.contains("max_scan_interval = \"7ms\"  # command line (--max-scan-interval)"),
            "{printed}"
        );
        assert!(
            printed.contains("retention = \"1m 30s\"  # config file"),
            "{printed}"
        );
        assert!(printed.contains("# socket is unset  # default"), "{printed}");
        let again = resolve(&[], Some(&printed)).unwrap();
        assert_eq!(again.pids, settings.pids);
        assert_eq!(again.max_scan_interval, settings.max_scan_interval);
        assert_eq!(again.retention, settings.retention);
        assert_eq!(again.scanner_cpu, settings.scanner_cpu);
        assert_eq!(again.otlp_endpoint, settings.otlp_endpoint);
        assert_eq!(again.listen, settings.listen);
    }

    #[test]
    fn every_flag_of_run_has_a_key() {
        let command = TestCli::command();
        let mut flags: Vec<String> = command
            .get_arguments()
            .filter(|arg| arg.get_long().is_some() && !["config", "help"].contains(&arg.get_id().as_str()))
            .map(|arg| arg.get_id().to_string())
            .collect();
        flags.sort();
        let mut keys: Vec<String> = FileConfig::KEYS
            .iter()
            .filter(|key| **key != "log_format") // a global flag, outside RunArgs
            .map(|key| key.to_string())
            .collect();
        keys.sort();
        assert_eq!(flags, keys);
    }
}
