//! Events the probes report, decoded from the ring buffer's raw records.

use subetha_probes::{COMM_LEN, EventHeader, HookEvent, MigrateEvent, OffCpuEvent, kind, off_cpu_flag};

use super::Role;

/// One thing the probes saw. Timestamps are CLOCK_MONOTONIC nanoseconds
/// (`bpf_ktime_get_ns`), the clock the agent's model uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeEvent {
    /// A ring started dropping (`subetha_drop_begin`).
    DropBegin {
        /// Producer process.
        pid: u32,
        /// Producer thread.
        tid: u32,
        /// CPU it ran on.
        cpu: u32,
        /// When.
        ts_ns: u64,
        /// The ring's address in the producer's address space.
        ring: u64,
        /// Instance of the first dropped observation.
        instance_id: u32,
        /// The ring's drop counter including this drop.
        dropped_total: u64,
    },
    /// A ring stopped dropping (`subetha_drop_end`).
    DropEnd {
        /// Producer process.
        pid: u32,
        /// Producer thread.
        tid: u32,
        /// CPU it ran on.
        cpu: u32,
        /// When.
        ts_ns: u64,
        /// The ring's address in the producer's address space.
        ring: u64,
        /// Observations the episode lost.
        dropped_in_episode: u64,
    },
    /// A consumer started a scan (`subetha_scan_begin`).
    ScanBegin {
        /// Consumer process.
        pid: u32,
        /// Scanning thread.
        tid: u32,
        /// CPU it ran on.
        cpu: u32,
        /// When.
        ts_ns: u64,
        /// The segment's address in the consumer's address space.
        segment: u64,
        /// The consumer's scan counter.
        scan_seq: u64,
    },
    /// A consumer finished a scan (`subetha_scan_end`).
    ScanEnd {
        /// Consumer process.
        pid: u32,
        /// Scanning thread.
        tid: u32,
        /// CPU it ran on.
        cpu: u32,
        /// When.
        ts_ns: u64,
        /// The segment's address in the consumer's address space.
        segment: u64,
        /// The consumer's scan counter.
        scan_seq: u64,
        /// Observations drained by the scan.
        drained: u64,
    },
    /// A watched thread was off its CPU and got back on.
    OffCpu(OffCpuInterval),
    /// A watched thread moved to another CPU.
    Migrate {
        /// Its process (0 when unknown).
        pid: u32,
        /// The thread.
        tid: u32,
        /// CPU it left.
        orig_cpu: u32,
        /// CPU it goes to.
        dest_cpu: u32,
        /// When.
        ts_ns: u64,
    },
}

impl ProbeEvent {
    /// When it happened (for an off-CPU interval: when it ended).
    pub fn ts_ns(&self) -> u64 {
        match self {
            ProbeEvent::DropBegin { ts_ns, .. }
            | ProbeEvent::DropEnd { ts_ns, .. }
            | ProbeEvent::ScanBegin { ts_ns, .. }
            | ProbeEvent::ScanEnd { ts_ns, .. }
            | ProbeEvent::Migrate { ts_ns, .. } => *ts_ns,
            ProbeEvent::OffCpu(interval) => interval.in_ts,
        }
    }

    /// The thread it is about.
    pub fn tid(&self) -> u32 {
        match self {
            ProbeEvent::DropBegin { tid, .. }
            | ProbeEvent::DropEnd { tid, .. }
            | ProbeEvent::ScanBegin { tid, .. }
            | ProbeEvent::ScanEnd { tid, .. }
            | ProbeEvent::Migrate { tid, .. } => *tid,
            ProbeEvent::OffCpu(interval) => interval.tid,
        }
    }
}

/// One off-CPU interval of a watched thread: from its switch-out to its
/// switch-in, with why it left and who had the CPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffCpuInterval {
    /// The thread.
    pub tid: u32,
    /// Its process (0 when unknown).
    pub pid: u32,
    /// Its role when it was watched (None if the kernel reported an unknown
    /// code).
    pub role: Option<Role>,
    /// Switch-out time.
    pub out_ts: u64,
    /// Switch-in time.
    pub in_ts: u64,
    /// The kernel reported no tracepoint for the switch-in: `in_ts` is
    /// reconstructed and the interval was reported at the thread's next
    /// switch-out (see [`subetha_probes::off_cpu_flag::SWITCH_IN_UNSEEN`]).
    pub switch_in_unseen: bool,
    /// 0 when it left while runnable (preempted), else the sleep state bits
    /// (`1` S interruptible, `2` D uninterruptible, `0x80` I idle, ...).
    pub out_state: u64,
    /// When it was woken (0 if it never slept).
    pub wakeup_ts: u64,
    /// CPU it left.
    pub cpu_out: u32,
    /// CPU it came back on.
    pub cpu_in: u32,
    /// The task that held the CPU right before it got back on.
    pub holder_pid: u32,
    /// That task's name.
    pub holder_comm: String,
    /// The task that took its CPU when it left.
    pub replaced_by_pid: u32,
    /// That task's name.
    pub replaced_by_comm: String,
}

impl OffCpuInterval {
    /// Whether it left while still runnable (preempted or yielded).
    pub fn preempted(&self) -> bool {
        self.out_state == 0
    }

    /// Time off the CPU, ns.
    pub fn off_cpu_ns(&self) -> u64 {
        self.in_ts.saturating_sub(self.out_ts)
    }

    /// When it became runnable: at switch-out if preempted, else at wakeup
    /// (clamped into the interval).
    pub fn runnable_since(&self) -> u64 {
        if self.preempted() || self.wakeup_ts == 0 {
            if self.preempted() { self.out_ts } else { self.in_ts }
        } else {
            self.wakeup_ts.clamp(self.out_ts, self.in_ts)
        }
    }

    /// Runqueue wait: runnable but not running, ns.
    pub fn runqueue_wait_ns(&self) -> u64 {
        self.in_ts.saturating_sub(self.runnable_since())
    }

    /// Time asleep, ns (0 if preempted).
    pub fn asleep_ns(&self) -> u64 {
        self.runnable_since().saturating_sub(self.out_ts)
    }
}

/// A task name from a NUL-padded kernel `comm`: up to the first NUL,
/// non-printable bytes replaced.
pub(crate) fn comm_to_string(comm: &[u8; COMM_LEN]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    comm[..len]
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

fn read<T: bytemuck::Pod>(bytes: &[u8]) -> Option<T> {
    bytemuck::try_pod_read_unaligned(bytes.get(..size_of::<T>())?).ok()
}

/// Decodes one ring-buffer record. `None` for a record too short for its
/// kind or of an unknown kind (a newer object than this agent).
pub fn decode_event(bytes: &[u8]) -> Option<ProbeEvent> {
    let header: EventHeader = read(bytes)?;
    let EventHeader {
        kind,
        cpu,
        pid,
        tid,
        ts_ns,
    } = header;
    Some(match kind {
        kind::DROP_BEGIN | kind::DROP_END | kind::SCAN_BEGIN | kind::SCAN_END => {
            let HookEvent { args, .. } = read(bytes)?;
            match kind {
                kind::DROP_BEGIN => ProbeEvent::DropBegin {
                    pid,
                    tid,
                    cpu,
                    ts_ns,
                    ring: args[0],
                    instance_id: args[1] as u32,
                    dropped_total: args[2],
                },
                kind::DROP_END => ProbeEvent::DropEnd {
                    pid,
                    tid,
                    cpu,
                    ts_ns,
                    ring: args[0],
                    dropped_in_episode: args[1],
                },
                kind::SCAN_BEGIN => ProbeEvent::ScanBegin {
                    pid,
                    tid,
                    cpu,
                    ts_ns,
                    segment: args[0],
                    scan_seq: args[1],
                },
                _ => ProbeEvent::ScanEnd {
                    pid,
                    tid,
                    cpu,
                    ts_ns,
                    segment: args[0],
                    scan_seq: args[1],
                    drained: args[2],
                },
            }
        }
        kind::OFF_CPU => {
            let event: OffCpuEvent = read(bytes)?;
            ProbeEvent::OffCpu(OffCpuInterval {
                tid,
                pid,
                role: Role::from_code(event.role),
                out_ts: event.out_ts,
                // Inside the interval the event closes, whatever the record
                // says.
                in_ts: event.in_ts.clamp(event.out_ts.min(ts_ns), ts_ns),
                switch_in_unseen: event.flags & off_cpu_flag::SWITCH_IN_UNSEEN != 0,
                out_state: event.out_state,
                wakeup_ts: event.wakeup_ts,
                cpu_out: event.cpu_out,
                cpu_in: cpu,
                holder_pid: event.holder_pid,
                holder_comm: comm_to_string(&event.holder_comm),
                replaced_by_pid: event.replaced_by_pid,
                replaced_by_comm: comm_to_string(&event.replaced_by_comm),
            })
        }
        kind::MIGRATE => {
            let event: MigrateEvent = read(bytes)?;
            ProbeEvent::Migrate {
                pid,
                tid,
                orig_cpu: event.orig_cpu,
                dest_cpu: event.dest_cpu,
                ts_ns,
            }
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm(name: &str) -> [u8; COMM_LEN] {
        let mut out = [0; COMM_LEN];
        out[..name.len()].copy_from_slice(name.as_bytes());
        out
    }

    #[test]
    fn decodes_every_kind_and_rejects_short_or_unknown_records() {
        let header = |kind, ts_ns| EventHeader {
            kind,
            cpu: 1,
            pid: 10,
            tid: 11,
            ts_ns,
        };
        let hook = HookEvent {
            header: header(kind::DROP_BEGIN, 5),
            args: [0x1000, 7, 4097],
        };
        assert_eq!(
            decode_event(bytemuck::bytes_of(&hook)),
            Some(ProbeEvent::DropBegin {
                pid: 10,
                tid: 11,
                cpu: 1,
                ts_ns: 5,
                ring: 0x1000,
                instance_id: 7,
                dropped_total: 4097
            })
        );
        let end = HookEvent {
            header: header(kind::SCAN_END, 6),
            args: [0x2000, 3, 99],
        };
        assert_eq!(
            decode_event(bytemuck::bytes_of(&end)),
            Some(ProbeEvent::ScanEnd {
                pid: 10,
                tid: 11,
                cpu: 1,
                ts_ns: 6,
                segment: 0x2000,
                scan_seq: 3,
                drained: 99
            })
        );
        let off = OffCpuEvent {
            header: header(kind::OFF_CPU, 3_000),
            out_ts: 1_000,
            in_ts: 3_000,
            wakeup_ts: 2_500,
            out_state: 1,
            cpu_out: 0,
            role: subetha_probes::role::SCANNER,
            holder_pid: 88,
            replaced_by_pid: 89,
            holder_comm: comm("kworker/1:2"),
            replaced_by_comm: comm("bad\x01name"),
            ..OffCpuEvent::default()
        };
        let Some(ProbeEvent::OffCpu(interval)) = decode_event(bytemuck::bytes_of(&off)) else {
            panic!("not an off-CPU event");
        };
        assert_eq!(interval.role, Some(Role::Scanner));
        assert_eq!((interval.cpu_out, interval.cpu_in), (0, 1));
        assert_eq!(interval.holder_comm, "kworker/1:2");
        assert_eq!(interval.replaced_by_comm, "bad?name");
        assert_eq!(interval.off_cpu_ns(), 2_000);
        assert_eq!(interval.asleep_ns(), 1_500);
        assert_eq!(interval.runqueue_wait_ns(), 500);
        let preempted = OffCpuInterval {
            out_state: 0,
            wakeup_ts: 0,
            ..interval.clone()
        };
        assert!(preempted.preempted());
        assert_eq!(preempted.runqueue_wait_ns(), 2_000);
        assert!(!interval.switch_in_unseen);
        // Reported at a later switch-out: the reconstructed switch-in
        // stands, an impossible one is pulled into the interval.
        let late = OffCpuEvent {
            header: header(kind::OFF_CPU, 9_000),
            in_ts: 3_000,
            flags: subetha_probes::off_cpu_flag::SWITCH_IN_UNSEEN,
            ..off
        };
        let Some(ProbeEvent::OffCpu(late_interval)) = decode_event(bytemuck::bytes_of(&late)) else {
            panic!("not an off-CPU event");
        };
        assert!(late_interval.switch_in_unseen);
        assert_eq!((late_interval.in_ts, late_interval.off_cpu_ns()), (3_000, 2_000));
        for (in_ts, decoded) in [(99_000, 9_000), (10, 1_000)] {
            let odd = OffCpuEvent { in_ts, ..late };
            let Some(ProbeEvent::OffCpu(odd)) = decode_event(bytemuck::bytes_of(&odd)) else {
                panic!("not an off-CPU event");
            };
            assert_eq!(odd.in_ts, decoded);
        }
        let migrate = MigrateEvent {
            header: header(kind::MIGRATE, 9),
            orig_cpu: 0,
            dest_cpu: 1,
        };
        assert!(matches!(
            decode_event(bytemuck::bytes_of(&migrate)),
            Some(ProbeEvent::Migrate {
                orig_cpu: 0,
                dest_cpu: 1,
                ..
            })
        ));
        assert_eq!(decode_event(&bytemuck::bytes_of(&off)[..60]), None);
        assert_eq!(decode_event(bytemuck::bytes_of(&header(99, 0))), None);
        assert_eq!(decode_event(&[1, 2, 3]), None);
    }
}
