//! [`LoadedProbes`] in a build without the eBPF object: loading always answers
//! [`ProbesError::NotBuiltIn`], so no value of the type ever exists and the
//! other methods are unreachable. The API is the same as the real one, so
//! callers need no cfg of their own.

use std::convert::Infallible;

use super::{HookHits, OffCpuFilter, ProbeEvent, ProbeStatus, ProbesError, Role, SchedPrograms};

const REASON: &str = if cfg!(feature = "probes") {
    "built with AYA_BUILD_SKIP=1"
} else {
    "built without the `probes` feature"
};

/// The probes; cannot be loaded in this build.
#[derive(Debug)]
pub struct LoadedProbes {
    never: Infallible,
}

impl LoadedProbes {
    /// Always [`ProbesError::NotBuiltIn`].
    pub fn load() -> Result<LoadedProbes, ProbesError> {
        Err(ProbesError::NotBuiltIn(REASON))
    }

    /// Always [`ProbesError::NotBuiltIn`].
    pub fn load_with(_sched: SchedPrograms) -> Result<LoadedProbes, ProbesError> {
        Err(ProbesError::NotBuiltIn(REASON))
    }

    /// Unreachable.
    pub fn attach_scanner(&mut self, _pid: u32, _tid: u32) -> Result<(), ProbesError> {
        match self.never {}
    }

    /// Unreachable.
    pub fn attach_producer_process(&mut self, _pid: u32) -> Result<(), ProbesError> {
        match self.never {}
    }

    /// Unreachable.
    pub fn detach_process(&mut self, _pid: u32) {
        match self.never {}
    }

    /// Unreachable.
    pub fn watch(&mut self, _tid: u32, _role: Role) -> Result<(), ProbesError> {
        match self.never {}
    }

    /// Unreachable.
    pub fn unwatch(&mut self, _tid: u32) {
        match self.never {}
    }

    /// Unreachable.
    pub fn watched(&self) -> Vec<(u32, Role)> {
        match self.never {}
    }

    /// Unreachable.
    pub fn drain_events(&mut self, _out: &mut Vec<ProbeEvent>) -> usize {
        match self.never {}
    }

    /// Unreachable.
    pub fn undecodable(&self) -> u64 {
        match self.never {}
    }

    /// Unreachable.
    pub fn hook_hits(&self) -> HookHits {
        match self.never {}
    }

    /// Unreachable.
    pub fn hook_hits_for_process(&self, _pid: u32) -> HookHits {
        match self.never {}
    }

    /// Unreachable.
    pub fn hook_hits_for_thread(&self, _tid: u32) -> HookHits {
        match self.never {}
    }

    /// Unreachable.
    pub fn losses(&self) -> u64 {
        match self.never {}
    }

    /// Unreachable.
    pub fn set_off_cpu_filter(&mut self, _filter: Option<OffCpuFilter>) -> Result<(), ProbesError> {
        match self.never {}
    }

    /// Unreachable.
    pub fn off_cpu_filtered(&self) -> u64 {
        match self.never {}
    }

    /// Unreachable.
    pub fn status(&self) -> Vec<ProbeStatus> {
        match self.never {}
    }

    /// Unreachable.
    pub fn sched_active(&self) -> bool {
        match self.never {}
    }

    /// Unreachable.
    pub fn summary(&self) -> String {
        match self.never {}
    }
}
