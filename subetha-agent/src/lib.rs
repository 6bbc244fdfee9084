//! # subetha-agent
//!
//! The operator's side of subetha: a host agent that finds every process
//! linking subetha-core, takes over draining its rings (the application's
//! sidecar hands over and takes back when the agent goes away), and tells
//! operators what their primitives do and where observations were lost.
//!
//! * [`discovery`] — finding segments in `/proc` and opening them safely.
//! * [`pidns`] — a process's ids in its own pid and user namespaces.
//! * [`container`] — the container, pod and service a process belongs to.
//! * [`agent`] — the scan thread: attach, drain, exits, storms.
//! * [`diagnosis`] — why a storm happened (pure: evidence in, cause, rate,
//!   confidence and fix out); [`sched_sampler`] — the scanner's /proc
//!   scheduler counters it reads without probes.
//! * [`ring_rates`] — each ring's push rate and when the next scan is due.
//! * [`history`] — the bounded histories the scan thread keeps.
//! * [`registration`] — the socket applications announce segments on.
//! * [`model`] — the serialisable picture every output is rendered from.
//! * [`doctor`] — what the host allows; [`client`] — talking to a running agent;
//!   [`auth`] — the bearer token of `--auth-token-file`.
//! * [`top`] — the live terminal view; [`report`] — storm pictures and HTML.
//! * [`series`] — the catalogue of exported series both exporters render;
//!   [`metrics`], [`otlp`], [`export`], [`http`] — the ways out.
//! * [`config`] — `run`'s flags and config file; [`logging`] — log output
//!   and rate-limited warnings.

pub mod agent;
pub mod auth;
pub mod client;
pub mod config;
pub mod container;
pub mod diagnosis;
pub mod discovery;
pub mod doctor;
pub mod export;
pub mod history;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod otlp;
pub mod pidns;
pub mod pprof;
pub mod probes;
pub mod profile;
pub mod registration;
pub mod report;
pub mod ring_rates;
pub mod sched_sampler;
pub mod series;
pub mod sites;
pub mod top;

pub use agent::{Agent, AgentConfig, AgentHandle, ProbeMode};
pub use model::AgentSnapshot;
