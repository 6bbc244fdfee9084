//! [`LoadedProbes`]: the loaded eBPF object, its attachments and its readers.

use std::collections::HashMap;
use std::num::NonZeroU32;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope};
use aya::programs::{BtfTracePoint, TracePoint, UProbe};
use aya::{Btf, Ebpf, EbpfLoader};
use subetha_probes::{
    EVENTS_MAP, HITS_BY_PID_MAP, HITS_BY_TID_MAP, HITS_MAP, HOOK_COUNT, LOSSES_MAP, OFF_CPU_FILTER_MAP,
    OFF_CPU_FILTERED_MAP, SCHED_CONFIG_MAP, SchedConfig, WATCHED_ENTRIES, WATCHED_INDEX_MAP, WATCHED_MAP,
    WATCHED_OVERFLOW_MAP, WatchedTask, global, index, program,
};

use super::btf::{BtfError, TaskOffsets};
use super::events::{ProbeEvent, decode_event};
use super::target::{HookObject, TargetError, find_hook_object};
use super::{HookHits, OffCpuFilter, ProbeStatus, ProbesError, Role, SchedPrograms, tracefs};

/// At most this many records are decoded per [`LoadedProbes::drain_events`] call,
/// so a flood cannot keep the caller in the loop forever.
const MAX_EVENTS_PER_DRAIN: usize = 1 << 16;
/// Error texts (verifier logs can be long) are cut to this many bytes.
const MAX_ERROR_LEN: usize = 4096;

/// The eBPF object, linked into this binary by the build script.
fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/subetha-probes"))
}

/// A shared `#[repr(C)]` record as an aya map value.
#[repr(transparent)]
#[derive(Clone, Copy)]
struct Plain<T>(T);

// SAFETY: `T: bytemuck::Pod` is plain data without padding for which every
// bit pattern is valid, and `repr(transparent)` gives `Plain<T>` exactly
// its layout: what aya's `Pod` requires to copy it to and from map bytes.
unsafe impl<T: bytemuck::Pod> aya::Pod for Plain<T> {}

/// Why a map of the object could not be used.
#[derive(Debug, thiserror::Error)]
pub(super) enum MapFailure {
    /// The object has no map of that name.
    #[error("missing from the object")]
    Missing,
    /// aya could not open, read or write it.
    #[error(transparent)]
    Aya(#[from] MapError),
    /// Every watched-thread slot is taken.
    #[error("all {WATCHED_ENTRIES} watched-thread slots in use")]
    Full,
    /// A test's expectation of a slot's content does not hold.
    #[cfg(test)]
    #[error("{0}")]
    Unexpected(String),
}

impl MapFailure {
    fn of(self, map: &'static str) -> ProbesError {
        ProbesError::Map {
            map,
            source: Box::new(self),
        }
    }
}

/// Why a program could not be loaded, attached or detached. Its text (with
/// its causes, [`error_text`]) is what [`ProbeStatus::error`] reports.
#[derive(Debug, thiserror::Error)]
enum ProgramFailure {
    /// The object has no program of that name.
    #[error("program {0} missing from the object")]
    Missing(String),
    /// aya refused (wrong type, verifier, attach).
    #[error(transparent)]
    Aya(#[from] aya::programs::ProgramError),
}

/// The uprobes of one process.
struct ProcessUprobes {
    /// Where its hooks are (resolved on first use, retried while failing).
    object: Result<HookObject, TargetError>,
    /// Per hook, in [`program::UPROBES`] order.
    hooks: [HookAttach; 4],
}

#[derive(Default)]
struct HookAttach {
    /// Asked for (by `attach_scanner` or `attach_producer_process`).
    wanted: bool,
    link: Option<UProbeLinkId>,
    error: Option<String>,
}

#[derive(Clone, Copy)]
struct Watched {
    role: Role,
    /// Its process, when `/proc` said.
    pid: u32,
    /// Its slot in the kernel's watched-thread array.
    slot: u32,
}

/// The loaded probes. Dropping it detaches and unloads everything.
///
/// Not shared between threads: the agent's scan thread owns it, attaches
/// processes as it discovers them and drains events on its timer.
pub struct LoadedProbes {
    ebpf: Ebpf,
    events: RingBuf<MapData>,
    logger: Option<aya_log::EbpfLogger<TracingLog>>,
    /// Load errors of the uprobe programs, by name.
    uprobe_load_errors: HashMap<&'static str, String>,
    tracepoints: Vec<ProbeStatus>,
    processes: HashMap<u32, ProcessUprobes>,
    watched: HashMap<u32, Watched>,
    /// Free slots of the kernel's watched-thread array (popped from the end).
    free_slots: Vec<u32>,
    undecodable: u64,
}

impl std::fmt::Debug for LoadedProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedProbes")
            .field("processes", &self.processes.keys().collect::<Vec<_>>())
            .field("watched", &self.watched.len())
            .finish_non_exhaustive()
    }
}

impl LoadedProbes {
    /// Loads the object, loads every program, configures and attaches the
    /// four sched tracepoints (mounting tracefs on `/sys/kernel/tracing`
    /// first if it is not mounted anywhere). Tries to raise RLIMIT_MEMLOCK
    /// and only warns when that is refused. Fails only when the object
    /// itself cannot be loaded (no privileges, no BPF); a program or
    /// tracepoint that fails is reported by [`status`](Self::status) and
    /// the rest work.
    pub fn load() -> Result<LoadedProbes, ProbesError> {
        Self::load_with(SchedPrograms::Auto)
    }

    /// [`load`](Self::load), choosing the scheduler programs.
    pub fn load_with(sched: SchedPrograms) -> Result<LoadedProbes, ProbesError> {
        let privileges = super::Privileges::of_this_process();
        if !privileges.can_load() {
            return Err(ProbesError::Privileges(privileges));
        }
        let memlock = raise_memlock();
        // The BTF tracepoints read task_struct fields at these offsets; an
        // unset offset makes the verifier refuse them, and the classic
        // tracepoints stand in.
        let offsets = TaskOffsets::from_kernel();
        let mut loader = EbpfLoader::new();
        if let Ok(offsets) = &offsets {
            loader
                .override_global(global::TASK_PID_OFFSET, &offsets.pid, true)
                .override_global(global::TASK_COMM_OFFSET, &offsets.comm, true)
                .override_global(global::TASK_CPU_OFFSET, &offsets.cpu, true)
                .override_global(global::TASK_EXEC_START_OFFSET, &offsets.exec_start, true)
                .override_global(global::TASK_RUN_DELAY_OFFSET, &offsets.run_delay, true)
                .override_global(global::TASK_LAST_QUEUED_OFFSET, &offsets.last_queued, true)
                .override_global(global::TASK_LAST_ARRIVAL_OFFSET, &offsets.last_arrival, true)
                .override_global(global::TASK_CFS_RQ_OFFSET, &offsets.cfs_rq, true)
                .override_global(global::CFS_RQ_RQ_OFFSET, &offsets.cfs_rq_rq, true)
                .override_global(global::RQ_CLOCK_OFFSET, &offsets.rq_clock, true);
        }
        let mut ebpf = loader
            .load(object())
            .map_err(|e| load_failure(e, memlock.as_ref()))?;
        let logger = match aya_log::EbpfLogger::init_with_logger(&mut ebpf, TracingLog) {
            Ok(logger) => Some(logger),
            Err(error) => {
                tracing::warn!(error = %error_text(&error), "eBPF probe diagnostics unavailable");
                None
            }
        };
        let events = ebpf
            .take_map(EVENTS_MAP)
            .ok_or_else(|| MapFailure::Missing.of(EVENTS_MAP))?;
        let events = RingBuf::try_from(events).map_err(|e| MapFailure::from(e).of(EVENTS_MAP))?;
        let mut uprobe_load_errors = HashMap::new();
        for (name, _) in program::UPROBES {
            if let Err(error) = load_uprobe(&mut ebpf, name) {
                let error = error_text(&error);
                tracing::warn!(program = name, %error, "eBPF uprobe program not loaded");
                uprobe_load_errors.insert(name, error);
            }
        }
        let mut probes = LoadedProbes {
            ebpf,
            events,
            logger,
            uprobe_load_errors,
            tracepoints: Vec::new(),
            processes: HashMap::new(),
            watched: HashMap::new(),
            free_slots: (0..WATCHED_ENTRIES).rev().collect(),
            undecodable: 0,
        };
        let offsets = match sched {
            SchedPrograms::Auto => offsets,
            SchedPrograms::Classic => Err(BtfError::from("classic tracepoints asked for")),
        };
        probes.start_sched(offsets, sched);
        Ok(probes)
    }

    /// Attaches the sched programs, each on its own: the BTF tracepoint
    /// where the kernel has BTF and the offsets were found, else the
    /// classic one configured from tracefs.
    fn start_sched(&mut self, offsets: Result<TaskOffsets, BtfError>, sched: SchedPrograms) {
        let btf = offsets
            .map_err(|e| error_text(&e))
            .and_then(|_| Btf::from_sys_fs().map_err(|e| error_text(&e)));
        let mut classic_config: Option<Result<(), String>> = None;
        // With the BTF sched_switch, a woken thread's runqueue wait comes
        // from its sched_info: the wakeup tracepoints are not needed.
        let mut btf_switch = false;
        for (btf_name, classic_name, category, event) in program::TRACEPOINTS {
            let btf_error = match (btf_name, &btf) {
                (None, _) if btf_switch => continue,
                (None, _) => None,
                (Some(name), Ok(btf)) => match attach_btf_tracepoint(&mut self.ebpf, name, event, btf)
                    .map_err(|e| error_text(&e))
                {
                    Ok(()) => {
                        btf_switch |= name == program::BTF_SCHED_SWITCH;
                        self.tracepoints.push(ProbeStatus {
                            program: name.to_string(),
                            target: format!("{category}/{event} (tp_btf)"),
                            attached: true,
                            error: None,
                        });
                        continue;
                    }
                    Err(error) => Some(error),
                },
                (Some(_), Err(error)) => Some(format!("no kernel BTF: {error}")),
            };
            if let (Some(error), SchedPrograms::Auto) = (&btf_error, sched) {
                tracing::warn!(program = btf_name, %error, "BTF tracepoint unavailable; trying the classic one");
            }
            let config = classic_config
                .get_or_insert_with(|| {
                    tracefs::tracefs_root()
                        .map_err(|e| e.to_string())
                        .and_then(|root| tracefs::sched_config(&root).map_err(|e| error_text(&e)))
                        .and_then(|config| self.set_sched_config(config).map_err(|e| error_text(&e)))
                })
                .clone();
            let result = config
                .map_err(|e| format!("tracepoint layout unknown: {e}"))
                .and_then(|()| {
                    attach_tracepoint(&mut self.ebpf, classic_name, category, event)
                        .map_err(|e| error_text(&e))
                })
                .map_err(|classic_error| match &btf_error {
                    Some(btf_error) => format!("tp_btf: {btf_error}; classic: {classic_error}"),
                    None => classic_error,
                });
            if let Err(error) = &result {
                tracing::warn!(program = classic_name, %error, "eBPF sched tracepoint not attached");
            }
            self.tracepoints.push(ProbeStatus {
                program: classic_name.to_string(),
                target: format!("{category}/{event}"),
                attached: result.is_ok(),
                error: result.err(),
            });
        }
    }

    /// Sets which off-CPU intervals of watched threads become events:
    /// `None` reports every one (the default after loading).
    pub fn set_off_cpu_filter(&mut self, filter: Option<OffCpuFilter>) -> Result<(), ProbesError> {
        let value = filter.map_or_else(subetha_probes::OffCpuFilter::default, |f| {
            subetha_probes::OffCpuFilter {
                enabled: 1,
                cpu_change: u32::from(f.cpu_change),
                min_wait_ns: f.min_runqueue_wait_ns,
                min_sleep_ns: f.min_sleep_ns,
                producers: u32::from(f.producer_intervals),
                _reserved: 0,
            }
        });
        let map_error = |failure: MapFailure| failure.of(OFF_CPU_FILTER_MAP);
        let map = self
            .ebpf
            .map_mut(OFF_CPU_FILTER_MAP)
            .ok_or_else(|| map_error(MapFailure::Missing))?;
        let mut array = Array::<_, Plain<subetha_probes::OffCpuFilter>>::try_from(map)
            .map_err(|e| map_error(e.into()))?;
        array.set(0, Plain(value), 0).map_err(|e| map_error(e.into()))
    }

    /// Off-CPU intervals the filter kept out of the event stream, summed
    /// over CPUs.
    pub fn off_cpu_filtered(&self) -> u64 {
        self.per_cpu_sum(OFF_CPU_FILTERED_MAP)
    }

    fn set_sched_config(&mut self, config: SchedConfig) -> Result<(), ProbesError> {
        let map = self
            .ebpf
            .map_mut(SCHED_CONFIG_MAP)
            .ok_or_else(|| MapFailure::Missing.of(SCHED_CONFIG_MAP))?;
        let mut array = Array::<_, Plain<SchedConfig>>::try_from(map)
            .map_err(|e| MapFailure::from(e).of(SCHED_CONFIG_MAP))?;
        array
            .set(0, Plain(config), 0)
            .map_err(|e| MapFailure::from(e).of(SCHED_CONFIG_MAP))
    }

    /// Attaches the scan-hook uprobes in process `pid` (the agent itself or
    /// an application whose sidecar drains) and watches its scan thread
    /// `tid` as a scanner. Idempotent; a failed attach is retried.
    pub fn attach_scanner(&mut self, pid: u32, tid: u32) -> Result<(), ProbesError> {
        let attached = self.attach_hooks(
            pid,
            &[subetha_probes::hook::SCAN_BEGIN, subetha_probes::hook::SCAN_END],
        );
        let watched = self.watch(tid, Role::Scanner);
        attached.and(watched)
    }

    /// Attaches the drop-hook uprobes in producer process `pid`, scoped to
    /// it. Idempotent; a failed attach is retried.
    pub fn attach_producer_process(&mut self, pid: u32) -> Result<(), ProbesError> {
        self.attach_hooks(
            pid,
            &[subetha_probes::hook::DROP_BEGIN, subetha_probes::hook::DROP_END],
        )
    }

    fn attach_hooks(&mut self, pid: u32, hooks: &[u32]) -> Result<(), ProbesError> {
        let Some(scope) = NonZeroU32::new(pid) else {
            return Err(ProbesError::Target {
                pid,
                reason: "pid 0".into(),
            });
        };
        let Self {
            ebpf,
            processes,
            uprobe_load_errors,
            ..
        } = self;
        let process = processes.entry(pid).or_insert_with(|| ProcessUprobes {
            object: Err(TargetError::NoHooks { tried: Vec::new() }),
            hooks: Default::default(),
        });
        if process.object.is_err() {
            process.object = find_hook_object(pid);
        }
        for &hook in hooks {
            process.hooks[hook as usize].wanted = true;
        }
        let object = match &process.object {
            Ok(object) => object.clone(),
            Err(reason) => {
                let reason = error_text(reason);
                for &hook in hooks {
                    process.hooks[hook as usize].error = Some(reason.clone());
                }
                return Err(ProbesError::Target { pid, reason });
            }
        };
        let mut failures = Vec::new();
        for &hook in hooks {
            let state = &mut process.hooks[hook as usize];
            if state.link.is_some() {
                continue;
            }
            let (name, symbol) = program::UPROBES[hook as usize];
            let result = match (uprobe_load_errors.get(name), object.offsets[hook as usize]) {
                (Some(error), _) => Err(format!("program not loaded: {error}")),
                (None, None) => Err(format!("{} does not define {symbol}", object.display)),
                (None, Some(offset)) => uprobe(ebpf, name)
                    .and_then(|program| {
                        Ok(program.attach(
                            UProbeAttachLocation::AbsoluteOffset(offset),
                            &object.path,
                            UProbeScope::OneProcess(scope),
                        )?)
                    })
                    .map_err(|e| uprobe_attach_text(&e)),
            };
            match result {
                Ok(link) => {
                    state.link = Some(link);
                    state.error = None;
                }
                Err(error) => {
                    failures.push(format!("{name}: {error}"));
                    state.error = Some(error);
                }
            }
        }
        if failures.is_empty() {
            tracing::debug!(pid, object = %object.display, ?hooks, "subetha hook uprobes attached");
            Ok(())
        } else {
            Err(ProbesError::Attach { pid, failures })
        }
    }

    /// Detaches every uprobe of process `pid` and stops watching its
    /// threads. Nothing happens for an unknown pid.
    pub fn detach_process(&mut self, pid: u32) {
        if let Some(process) = self.processes.remove(&pid) {
            for (hook, state) in process.hooks.into_iter().enumerate() {
                let Some(link) = state.link else {
                    continue;
                };
                let name = program::UPROBES[hook].0;
                if let Err(error) = uprobe(&mut self.ebpf, name).and_then(|p| Ok(p.detach(link)?)) {
                    tracing::debug!(pid, program = name, error = %error_text(&error), "uprobe detach failed");
                }
            }
        }
        let threads: Vec<u32> = self
            .watched
            .iter()
            .filter(|(_, watched)| watched.pid == pid)
            .map(|(&tid, _)| tid)
            .collect();
        for tid in threads {
            self.unwatch(tid);
        }
    }

    /// Watches thread `tid` in the sched tracepoints. Forgets any state the
    /// kernel kept for an earlier thread with that id.
    pub fn watch(&mut self, tid: u32, role: Role) -> Result<(), ProbesError> {
        if tid == 0 {
            return Err(ProbesError::Target {
                pid: 0,
                reason: "tid 0 (the idle task) cannot be watched".into(),
            });
        }
        // Re-watching starts from a clean slot.
        self.unwatch(tid);
        let slot = self
            .free_slots
            .pop()
            .ok_or_else(|| MapFailure::Full.of(WATCHED_MAP))?;
        let pid = tgid_of(tid).unwrap_or(0);
        let entry = WatchedTask {
            tid,
            role: role.code(),
            pid,
            ..WatchedTask::default()
        };
        // The slot is filled before the index points to it.
        let published = self
            .write_slot(slot, entry)
            .map_err(|error| (WATCHED_MAP, error))
            .and_then(|()| {
                self.watched.insert(tid, Watched { role, pid, slot });
                self.publish_residue(index::residue(tid))
            });
        if let Err((map, error)) = published {
            self.watched.remove(&tid);
            let _ = self.publish_residue(index::residue(tid));
            let _ = self.write_slot(slot, WatchedTask::default());
            self.free_slots.push(slot);
            return Err(error.of(map));
        }
        Ok(())
    }

    /// Stops watching thread `tid` (nothing happens if it was not).
    pub fn unwatch(&mut self, tid: u32) {
        let Some(watched) = self.watched.remove(&tid) else {
            return;
        };
        // Unpublished before the slot is cleared and reused.
        if let Err((map, error)) = self.publish_residue(index::residue(tid)) {
            tracing::debug!(tid, map, error = %error_text(&error), "watched-thread index not updated");
        }
        if let Some(map) = self.ebpf.map_mut(WATCHED_OVERFLOW_MAP)
            && let Ok(mut overflow) = BpfHashMap::<_, u32, u32>::try_from(map)
        {
            let _ = overflow.remove(&tid);
        }
        match self.write_slot(watched.slot, WatchedTask::default()) {
            Ok(()) => self.free_slots.push(watched.slot),
            // A slot that could not be cleared is not reused.
            Err(error) => {
                tracing::debug!(tid, error = %error_text(&error), "watched-thread slot not cleared")
            }
        }
    }

    fn write_slot(&mut self, slot: u32, entry: WatchedTask) -> Result<(), MapFailure> {
        let map = self.ebpf.map_mut(WATCHED_MAP).ok_or(MapFailure::Missing)?;
        let mut slots = Array::<_, Plain<WatchedTask>>::try_from(map)?;
        Ok(slots.set(slot, Plain(entry), 0)?)
    }

    /// Makes the kernel's index entry for `residue` (and the overflow map
    /// for it) say what [`watched`](Self::watched) says: nobody, one slot,
    /// or several threads to look up by tid.
    fn publish_residue(&mut self, residue: u32) -> Result<(), (&'static str, MapFailure)> {
        let sharing: Vec<(u32, u32)> = self
            .watched
            .iter()
            .filter(|&(&tid, _)| index::residue(tid) == residue)
            .map(|(&tid, w)| (tid, w.slot))
            .collect();
        if sharing.len() > 1 {
            let map = self
                .ebpf
                .map_mut(WATCHED_OVERFLOW_MAP)
                .ok_or((WATCHED_OVERFLOW_MAP, MapFailure::Missing))?;
            let mut overflow =
                BpfHashMap::<_, u32, u32>::try_from(map).map_err(|e| (WATCHED_OVERFLOW_MAP, e.into()))?;
            for &(tid, slot) in &sharing {
                overflow
                    .insert(tid, slot, 0)
                    .map_err(|e| (WATCHED_OVERFLOW_MAP, e.into()))?;
            }
        }
        // The whole word: the entries of the residues beside this one.
        let (word, _) = index::position(residue);
        let mut value = 0u64;
        for other in word * index::PER_WORD..(word + 1) * index::PER_WORD {
            let mut tids = self
                .watched
                .iter()
                .filter(|&(&tid, _)| index::residue(tid) == other);
            let entry = match (tids.next(), tids.next()) {
                (None, _) => index::NONE,
                (Some((_, w)), None) => (w.slot + 1) as u16,
                (Some(_), Some(_)) => index::OVERFLOW,
            };
            value |= u64::from(entry) << index::position(other).1;
        }
        let map = self
            .ebpf
            .map_mut(WATCHED_INDEX_MAP)
            .ok_or((WATCHED_INDEX_MAP, MapFailure::Missing))?;
        let mut array = Array::<_, u64>::try_from(map).map_err(|e| (WATCHED_INDEX_MAP, e.into()))?;
        array
            .set(word, value, 0)
            .map_err(|e| (WATCHED_INDEX_MAP, e.into()))?;
        if sharing.len() == 1
            && let Some(map) = self.ebpf.map_mut(WATCHED_OVERFLOW_MAP)
            && let Ok(mut overflow) = BpfHashMap::<_, u32, u32>::try_from(map)
        {
            // Alone again: the index names its slot directly.
            let _ = overflow.remove(&sharing[0].0);
        }
        Ok(())
    }

    /// Test support: makes the kernel's state of watched thread `tid` say
    /// it is still off CPU since `out_ts`, as if its last switch-in, which
    /// left the rest of that state as its switch-out recorded it, had not
    /// been reported. Its next switch-out must then report the interval
    /// (see `off_cpu_flag::SWITCH_IN_UNSEEN`).
    #[cfg(test)]
    pub(super) fn forget_switch_in(&mut self, tid: u32, out_ts: u64) -> Result<(), MapFailure> {
        let slot = self
            .watched
            .get(&tid)
            .ok_or_else(|| MapFailure::Unexpected(format!("{tid} is not watched")))?
            .slot;
        let map = self.ebpf.map(WATCHED_MAP).ok_or(MapFailure::Missing)?;
        let slots = Array::<_, Plain<WatchedTask>>::try_from(map)?;
        let Plain(mut entry) = slots.get(&slot, 0)?;
        if entry.tid != tid || entry.state.out_ts != 0 {
            return Err(MapFailure::Unexpected(format!(
                "slot {slot} is not {tid} on a CPU: {entry:?}"
            )));
        }
        entry.state.out_ts = out_ts;
        self.write_slot(slot, entry)
    }

    /// The watched threads and their roles.
    pub fn watched(&self) -> Vec<(u32, Role)> {
        let mut out: Vec<(u32, Role)> = self.watched.iter().map(|(&tid, w)| (tid, w.role)).collect();
        out.sort_unstable_by_key(|&(tid, _)| tid);
        out
    }

    /// Moves every event the programs wrote since the last call into `out`
    /// (at most 65536 per call) without blocking, and returns how many.
    /// Also forwards the programs' diagnostics to `tracing`.
    pub fn drain_events(&mut self, out: &mut Vec<ProbeEvent>) -> usize {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
        let Self {
            events,
            watched,
            undecodable,
            ..
        } = self;
        let mut count = 0;
        while count < MAX_EVENTS_PER_DRAIN {
            let Some(item) = events.next() else {
                break;
            };
            let Some(mut event) = decode_event(&item) else {
                *undecodable += 1;
                continue;
            };
            drop(item);
            // The kernel does not always know the process of the thread an
            // event is about; we know it for the threads we watch.
            match &mut event {
                ProbeEvent::Migrate { pid, tid, .. } if *pid == 0 => {
                    *pid = watched.get(tid).map_or(0, |w| w.pid);
                }
                ProbeEvent::OffCpu(interval) if interval.pid == 0 => {
                    interval.pid = watched.get(&interval.tid).map_or(0, |w| w.pid);
                }
                _ => {}
            }
            out.push(event);
            count += 1;
        }
        count
    }

    /// Records the ring buffer held that were not events this agent knows
    /// (a newer object), since load.
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// Hook hits since load, all attached processes together.
    pub fn hook_hits(&self) -> HookHits {
        let mut hits = HookHits::default();
        let Some(map) = self.ebpf.map(HITS_MAP) else {
            return hits;
        };
        let Ok(array) = PerCpuArray::<_, u64>::try_from(map) else {
            return hits;
        };
        for hook in 0..HOOK_COUNT {
            if let Ok(values) = array.get(&hook, 0) {
                hits.add(hook, values.iter().sum());
            }
        }
        hits
    }

    /// Hook hits since load in process `pid` (counters of processes not
    /// hit recently may have been evicted: the map holds 4096 keys).
    pub fn hook_hits_for_process(&self, pid: u32) -> HookHits {
        self.keyed_hits(HITS_BY_PID_MAP, pid)
    }

    /// Hook hits since load by thread `tid` (same eviction caveat).
    pub fn hook_hits_for_thread(&self, tid: u32) -> HookHits {
        self.keyed_hits(HITS_BY_TID_MAP, tid)
    }

    fn keyed_hits(&self, map: &str, id: u32) -> HookHits {
        let mut hits = HookHits::default();
        let Some(map) = self.ebpf.map(map) else {
            return hits;
        };
        let Ok(counters) = PerCpuHashMap::<_, [u32; 2], u64>::try_from(map) else {
            return hits;
        };
        for hook in 0..HOOK_COUNT {
            match counters.get(&[id, hook], 0) {
                Ok(values) => hits.add(hook, values.iter().sum()),
                Err(MapError::KeyNotFound) => {}
                Err(error) => tracing::debug!(error = %error_text(&error), "reading hook hits failed"),
            }
        }
        hits
    }

    /// Events the programs could not write because the ring buffer was
    /// full, since load.
    pub fn losses(&self) -> u64 {
        self.per_cpu_sum(LOSSES_MAP)
    }

    /// Entry 0 of a per-CPU `u64` array, summed over CPUs (0 if unreadable).
    fn per_cpu_sum(&self, map: &str) -> u64 {
        self.ebpf
            .map(map)
            .and_then(|map| PerCpuArray::<_, u64>::try_from(map).ok())
            .and_then(|array| array.get(&0, 0).ok())
            .map_or(0, |values| values.iter().sum())
    }

    /// Every program load and attachment: the sched tracepoints, uprobe
    /// programs that failed to load, and each asked-for uprobe of each
    /// process.
    pub fn status(&self) -> Vec<ProbeStatus> {
        let mut out = self.tracepoints.clone();
        for (name, _) in program::UPROBES {
            if let Some(error) = self.uprobe_load_errors.get(name) {
                out.push(ProbeStatus {
                    program: name.to_string(),
                    target: "(load)".into(),
                    attached: false,
                    error: Some(error.clone()),
                });
            }
        }
        let mut pids: Vec<&u32> = self.processes.keys().collect();
        pids.sort_unstable();
        for pid in pids {
            let process = &self.processes[pid];
            let target = match &process.object {
                Ok(object) => format!("pid {pid}: {}", object.display),
                Err(_) => format!("pid {pid}"),
            };
            for (hook, state) in process.hooks.iter().enumerate() {
                if state.wanted {
                    out.push(ProbeStatus {
                        program: program::UPROBES[hook].0.to_string(),
                        target: target.clone(),
                        attached: state.link.is_some(),
                        error: state.error.clone(),
                    });
                }
            }
        }
        out
    }

    /// Whether every sched tracepoint needed is attached (off-CPU
    /// intervals are then complete for watched threads): `sched_switch` and
    /// `sched_migrate_task`, and with the classic `sched_switch` the two
    /// wakeup tracepoints too.
    pub fn sched_active(&self) -> bool {
        !self.tracepoints.is_empty() && self.tracepoints.iter().all(|s| s.attached)
    }

    /// One line for status displays, e.g. `on: 2/2 sched tracepoints (tp_btf),
    /// uprobes in 2 processes, 3 watched threads, 0 lost events`.
    pub fn summary(&self) -> String {
        let attached = self.tracepoints.iter().filter(|s| s.attached).count();
        let processes = self
            .processes
            .values()
            .filter(|p| p.hooks.iter().any(|h| h.link.is_some()))
            .count();
        let kind = if self.tracepoints.iter().any(|s| s.target.ends_with("(tp_btf)")) {
            " (tp_btf)"
        } else {
            ""
        };
        format!(
            "on: {attached}/{} sched tracepoints{kind}, uprobes in {processes} processes, {} watched threads, {} lost events",
            self.tracepoints.len(),
            self.watched.len(),
            self.losses()
        )
    }
}

/// Program `name` of the object as its type `T`.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, ProgramFailure>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    Ok(ebpf
        .program_mut(name)
        .ok_or_else(|| ProgramFailure::Missing(name.to_string()))?
        .try_into()?)
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, ProgramFailure> {
    program(ebpf, name)
}

fn load_uprobe(ebpf: &mut Ebpf, name: &str) -> Result<(), ProgramFailure> {
    Ok(uprobe(ebpf, name)?.load()?)
}

fn attach_btf_tracepoint(ebpf: &mut Ebpf, name: &str, event: &str, btf: &Btf) -> Result<(), ProgramFailure> {
    let tracepoint: &mut BtfTracePoint = program(ebpf, name)?;
    tracepoint.load(event, btf)?;
    Ok(tracepoint.attach().map(drop)?)
}

fn attach_tracepoint(ebpf: &mut Ebpf, name: &str, category: &str, event: &str) -> Result<(), ProgramFailure> {
    let tracepoint: &mut TracePoint = program(ebpf, name)?;
    tracepoint.load()?;
    Ok(tracepoint.attach(category, event).map(drop)?)
}

/// Raises RLIMIT_MEMLOCK for kernels that still charge BPF memory to it;
/// the refusal, if it was refused. Where that is not allowed (EPERM here;
/// memcg accounting makes it unnecessary since 5.11) nothing is said unless
/// a load then fails in a way the limit can explain ([`load_advice`]).
fn raise_memlock() -> Option<std::io::Error> {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit only reads the struct, which lives for the call.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
    if rc == 0 {
        return None;
    }
    let error = std::io::Error::last_os_error();
    tracing::debug!(%error, "could not raise RLIMIT_MEMLOCK (harmless where the cgroup accounts eBPF memory)");
    Some(error)
}

/// A load failure's text with what to do about it: the privileges a
/// permission error asks for, and the memlock limit when it was not raised
/// and the failure is one it can cause (EPERM, ENOMEM). The errno is taken
/// from the first OS error in `cause`'s chain; the text is searched only
/// where aya kept none (a verifier log).
pub fn load_advice(
    mut text: String,
    cause: &(dyn std::error::Error + 'static),
    memlock: Option<&std::io::Error>,
) -> String {
    let errno = os_error(cause);
    let denied = matches!(errno, Some(libc::EPERM | libc::EACCES))
        || (errno.is_none()
            && ["EPERM", "EACCES", "Operation not permitted", "Permission denied"]
                .iter()
                .any(|needle| text.contains(needle)));
    let no_memory = errno == Some(libc::ENOMEM)
        || (errno.is_none()
            && ["ENOMEM", "Cannot allocate memory"]
                .iter()
                .any(|needle| text.contains(needle)));
    if denied {
        text.push_str(&format!(" ({})", super::PRIVILEGE_ADVICE));
    }
    if let Some(error) = memlock
        && (denied || no_memory)
    {
        text.push_str(&format!(
            "; RLIMIT_MEMLOCK could not be raised ({error}), which limits eBPF memory on kernels before 5.11"
        ));
    }
    text
}

/// A failed object load as a [`ProbesError::Load`]. A map the kernel
/// refused to create is not named: aya creates the maps in hash order, so
/// the name would change from run to run while the cause (every map is
/// refused alike) does not; aya's error, name included, stays the source.
fn load_failure(error: aya::EbpfError, memlock: Option<&std::io::Error>) -> ProbesError {
    let text = match &error {
        aya::EbpfError::MapError(MapError::CreateError { io_error, .. }) => {
            format!("the kernel refused to create the eBPF maps: {io_error}")
        }
        other => error_text(other),
    };
    ProbesError::Load {
        message: load_advice(text, &error, memlock),
        source: Box::new(error),
    }
}

/// A failed uprobe attach's text; a permission error says what uprobes
/// need beyond what the sched tracepoints do.
fn uprobe_attach_text(error: &ProgramFailure) -> String {
    let mut text = error_text(error);
    if matches!(os_error(error), Some(libc::EPERM | libc::EACCES)) {
        text.push_str(" (uprobes need root or CAP_SYS_ADMIN)");
    }
    text
}

/// The errno of the first `std::io::Error` in `error`'s chain.
fn os_error(error: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(code) = error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
        {
            return Some(code);
        }
        next = error.source();
    }
    None
}

/// The process (tgid) of thread `tid`, from `/proc/<tid>/status`.
fn tgid_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// An error with its sources, cut to a readable length.
fn error_text(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    if text.len() > MAX_ERROR_LEN {
        // Keep the head (what failed) and the tail (a verifier log ends with
        // its reason).
        let mut head = MAX_ERROR_LEN / 4;
        while !text.is_char_boundary(head) {
            head -= 1;
        }
        let mut tail = text.len() - (MAX_ERROR_LEN - head);
        while !text.is_char_boundary(tail) {
            tail += 1;
        }
        text = format!("{} … {}", &text[..head], &text[tail..]);
    }
    text
}

/// Forwards aya-log records from the programs to `tracing`.
struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _metadata: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "subetha_probes", "{message}"),
            log::Level::Warn => tracing::warn!(target: "subetha_probes", "{message}"),
            log::Level::Info => tracing::info!(target: "subetha_probes", "{message}"),
            log::Level::Debug => tracing::debug!(target: "subetha_probes", "{message}"),
            log::Level::Trace => tracing::trace!(target: "subetha_probes", "{message}"),
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod advice_tests {
    use super::load_advice;

    #[test]
    fn memlock_is_named_only_when_it_can_explain_the_failure() {
        #[derive(Debug, thiserror::Error)]
        #[error("{0}")]
        struct Text(&'static str);
        #[derive(Debug, thiserror::Error)]
        #[error("creating map events")]
        struct Wrapped(#[source] std::io::Error);
        let refused = std::io::Error::from_raw_os_error(libc::EPERM);
        let verifier_text = "the BPF_PROG_LOAD syscall failed: invalid argument";
        let verifier = load_advice(verifier_text.into(), &Text(verifier_text), Some(&refused));
        assert!(!verifier.contains("RLIMIT_MEMLOCK"), "{verifier}");
        let enomem = Wrapped(std::io::Error::from_raw_os_error(libc::ENOMEM));
        let advice = load_advice("creating map events".into(), &enomem, Some(&refused));
        assert!(advice.contains("RLIMIT_MEMLOCK"), "{advice}");
        let eperm = Wrapped(std::io::Error::from_raw_os_error(libc::EPERM));
        let advice = load_advice("creating map events".into(), &eperm, None);
        assert!(
            advice.contains("CAP_BPF + CAP_PERFMON") && !advice.contains("RLIMIT_MEMLOCK"),
            "{advice}"
        );
        // A refused map is not named (the order maps are created in varies),
        // but the typed source still names it.
        let refused_map = |name: &str| {
            super::load_failure(
                aya::EbpfError::MapError(aya::maps::MapError::CreateError {
                    name: name.into(),
                    io_error: std::io::Error::from_raw_os_error(libc::EPERM),
                }),
                None,
            )
        };
        let (a, b) = (refused_map("HITS"), refused_map("CPU_RUN"));
        assert_eq!(a.to_string(), b.to_string());
        assert!(!a.to_string().contains("HITS"), "{a}");
        assert!(a.to_string().contains("CAP_BPF + CAP_PERFMON"), "{a}");
        assert!(format!("{:?}", std::error::Error::source(&a)).contains("HITS"));
        // The errno decides, not words in a message.
        let einval = Wrapped(std::io::Error::from_raw_os_error(libc::EINVAL));
        let advice = load_advice("map `Permission denied` creation failed".into(), &einval, None);
        assert!(!advice.contains("CAP_BPF"), "{advice}");
    }
}
