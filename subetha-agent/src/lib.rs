//! The subetha agent: finds instrumented processes, takes their segments'
//! consumer role and serves what their primitives do.
//!
//! Not built out yet (see the agent issue); today it only re-exports the
//! core pipeline it will drive.

pub use subetha_core as core;
