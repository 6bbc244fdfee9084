//! # subetha-core
//!
//! A low-overhead observation pipeline for concurrency primitives.
//! Instrumented code pushes one 24-byte [`Observation`] per operation into
//! a thread-local [`ObservationRing`] that lives in a shared-memory
//! [segment]; a consumer — the in-process [`Sidecar`] or the
//! out-of-process agent — drains every ring into per-instance
//! [`InstanceStats`]. Pushing never blocks: a full ring drops the
//! observation and counts the drop, and the edges of each run of drops call
//! stable uprobe attach points ([`hooks`]).
//!
//! ```
//! use subetha_core::{Instance, InstanceKind, Observation};
//!
//! let queue = Instance::register(InstanceKind::CUSTOM, "jobs").unwrap();
//! // op 1, had to wait, waited 1200 ticks:
//! queue.observe(1, Observation::FLAG_CONTENDED, 1200).unwrap();
//! ```
//!
//! Module map: [`observation`] (the record, [`thread_id`]), [`instance_id`]
//! (what an observation names its instance by), [`ring`] (the
//! SPSC ring), [`clock`] (ticks and calibration), [`segment`] (shared-memory
//! layout and validation), [`registry`] (instances, per-thread rings, fork
//! safety), [`stats`] (histograms, per-instance statistics), [`drain`] (the
//! consumer's scan), [`lease`] (who may consume), [`sidecar`] (the in-process
//! consumer thread and policies), [`announce`] (telling a running agent about
//! a new segment), [`hooks`] (uprobe attach points). Modules import only
//! from below them in that order (`tests/module_layers.rs` checks it).

pub mod clock;
/// With the count schedule it follows.
#[cfg(loom)]
#[path = "primitives/counting.rs"]
#[allow(dead_code)]
mod counting;
pub mod hooks;
pub mod instance_id;
/// And the Mutex's lock protocol, for `mutex_protocol::loom_tests`.
#[cfg(loom)]
#[path = "primitives/mutex/protocol.rs"]
#[allow(dead_code)]
mod mutex_protocol;
pub mod observation;
/// Under loom only the primitives' counting protocol is compiled, for its
/// model (`op_counts::loom_tests`).
#[cfg(loom)]
#[path = "primitives/op_counts.rs"]
#[allow(dead_code)]
mod op_counts;
#[cfg(not(loom))]
pub mod primitives;
/// And the reader-bias handshake, for `reader_bias::loom_tests`.
#[cfg(loom)]
#[path = "primitives/reader_bias.rs"]
#[allow(dead_code)]
mod reader_bias;
pub mod ring;
/// The model check of ring-slot adoption (registry and drainer).
#[cfg(all(test, loom))]
mod slot_adoption;
mod sync;

#[cfg(not(loom))]
pub mod announce;
#[cfg(not(loom))]
pub mod drain;
#[cfg(not(loom))]
pub mod lease;
#[cfg(not(loom))]
pub mod registry;
#[cfg(not(loom))]
pub mod segment;
#[cfg(not(loom))]
pub mod sidecar;
#[cfg(not(loom))]
pub mod site;
#[cfg(not(loom))]
pub mod site_stats;
pub mod stats;

/// The crate root wires the layers: the registry tells the in-process
/// consumer (the [`sidecar`]) about a new process segment and a fork through
/// these hooks, whose type the registry defines, so that nothing below the
/// consumer imports it.
#[cfg(not(loom))]
pub(crate) const PROCESS_HOOKS: registry::ProcessHooks = registry::ProcessHooks {
    created: sidecar::on_process_segment_created,
    forked: sidecar::forget_after_fork,
};

pub use observation::{Observation, thread_id};
pub use ring::ObservationRing;
#[cfg(not(loom))]
pub use {
    drain::{Drainer, DropEpisode, InstanceMeta, InstanceRecord, RingRecord, ScanPacer, ScanReport},
    primitives::{AdaptiveMutex, Barrier, Channel, Condvar, Mutex, PolicyWord, RwLock, Semaphore},
    registry::{Instance, InstanceKind, RegistryError, process_segment},
    segment::{Segment, SegmentConfig, SegmentError, SegmentView},
    sidecar::{Policy, Sidecar, SidecarConfig, SidecarMode, Snapshot, process_sidecar, set_sidecar_mode},
    stats::{InstanceStats, LatencyHistogram},
};
