//! Optional OTLP metrics export (`--otlp-endpoint`).
//!
//! (Being built: issue 6.)

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::AgentSnapshot;

/// Where the snapshot comes from: the running agent's latest.
pub type SnapshotSource = Arc<dyn Fn() -> Arc<AgentSnapshot> + Send + Sync>;

/// Starts exporting to `endpoint` every `interval`; the returned guard
/// flushes and stops on drop.
pub fn start(_endpoint: &str, _interval: Duration, _source: SnapshotSource) -> Result<OtlpExporter> {
    bail!("OTLP export is not built yet")
}

/// A running OTLP exporter.
pub struct OtlpExporter {}
