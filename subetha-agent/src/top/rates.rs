//! Per-second rates from two successive snapshots.
//!
//! The agent reports totals; `top` shows how fast they move. A rate is the
//! difference of a counter between two snapshots divided by the time
//! between them, measured on the agent's own clock (`taken_mono_ns`), so a
//! late HTTP answer does not inflate it. A rate is *unknown* (not zero) for
//! anything absent from the earlier snapshot, for a counter that went
//! backwards (a different process under a reused pid, a restarted agent),
//! and for the contention share of an interval without operations.

use std::collections::HashMap;
use std::time::Duration;

use crate::model::{AgentSnapshot, InstanceReport, ProcessReport};

/// Identifies one process across snapshots: a pid reused by a new process
/// gets a new attach time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessKey {
    /// Process id.
    pub pid: u32,
    /// When the agent attached to it.
    pub attached_mono_ns: u64,
}

impl ProcessKey {
    /// The key of `process`.
    pub fn of(process: &ProcessReport) -> Self {
        Self {
            pid: process.pid,
            attached_mono_ns: process.attached_mono_ns,
        }
    }
}

/// Identifies one instance across snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceKey {
    /// Its process.
    pub process: ProcessKey,
    /// Instance id within the process.
    pub id: u32,
}

impl InstanceKey {
    /// The key of `instance` in `process`.
    pub fn of(process: &ProcessReport, instance: &InstanceReport) -> Self {
        Self {
            process: ProcessKey::of(process),
            id: instance.id,
        }
    }
}

/// Rates of one instance (or of one of its op kinds).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CounterRates {
    /// Operations per second.
    pub ops: f64,
    /// Contended operations per second.
    pub contended: f64,
    /// Misses per second.
    pub misses: f64,
    /// Drops attributed per second (instances only; 0 for op kinds).
    pub drops: f64,
    /// Contended share of the interval's operations (None: no operations).
    pub contention: Option<f64>,
}

/// Rates of one process's rings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessRates {
    /// Observations drained per second.
    pub drained: f64,
    /// Observations dropped per second.
    pub dropped: f64,
    /// Σ over its instances.
    pub instances: CounterRates,
}

/// Rates of one ring slot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RingRates {
    /// Drained per second.
    pub drained: f64,
    /// Dropped per second.
    pub dropped: f64,
}

/// Every rate between two snapshots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rates {
    /// Time between the two snapshots (agent clock).
    pub interval: Duration,
    processes: HashMap<ProcessKey, ProcessRates>,
    instances: HashMap<InstanceKey, CounterRates>,
    ops: HashMap<(InstanceKey, u16), CounterRates>,
    rings: HashMap<(ProcessKey, u32, u32), RingRates>,
}

/// `(later - earlier) / seconds`, or None when the counter went backwards.
fn per_second(earlier: u64, later: u64, seconds: f64) -> Option<f64> {
    later.checked_sub(earlier).map(|d| d as f64 / seconds)
}

fn share(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

impl Rates {
    /// Rates from `earlier` to `later`; None when they are not two moments
    /// of the same agent in that order.
    pub fn between(earlier: &AgentSnapshot, later: &AgentSnapshot) -> Option<Self> {
        if earlier.agent.pid != later.agent.pid || later.agent.taken_mono_ns <= earlier.agent.taken_mono_ns {
            return None;
        }
        let nanos = later.agent.taken_mono_ns - earlier.agent.taken_mono_ns;
        let seconds = nanos as f64 / 1e9;
        let mut rates = Self {
            interval: Duration::from_nanos(nanos),
            ..Self::default()
        };
        let before: HashMap<ProcessKey, &ProcessReport> =
            earlier.processes.iter().map(|p| (ProcessKey::of(p), p)).collect();
        for process in &later.processes {
            let key = ProcessKey::of(process);
            let Some(old) = before.get(&key) else { continue };
            let old_instances: HashMap<u32, &InstanceReport> =
                old.instances.iter().map(|i| (i.id, i)).collect();
            let (mut d_ops, mut d_contended, mut d_misses, mut d_drops) = (0u64, 0u64, 0u64, 0u64);
            for instance in &process.instances {
                let Some(old) = old_instances.get(&instance.id) else {
                    continue;
                };
                let (Some(ops), Some(contended), Some(misses), Some(drops)) = (
                    instance.ops.checked_sub(old.ops),
                    instance.contended.checked_sub(old.contended),
                    instance.misses.checked_sub(old.misses),
                    instance.drops_attributed.checked_sub(old.drops_attributed),
                ) else {
                    continue;
                };
                (d_ops, d_contended, d_misses, d_drops) = (
                    d_ops + ops,
                    d_contended + contended,
                    d_misses + misses,
                    d_drops + drops,
                );
                let instance_key = InstanceKey {
                    process: key,
                    id: instance.id,
                };
                rates.instances.insert(
                    instance_key,
                    CounterRates {
                        ops: ops as f64 / seconds,
                        contended: contended as f64 / seconds,
                        misses: misses as f64 / seconds,
                        drops: drops as f64 / seconds,
                        contention: share(contended, ops),
                    },
                );
                for op in &instance.per_op {
                    let Some(old_op) = old.per_op.iter().find(|o| o.op == op.op) else {
                        continue;
                    };
                    let (Some(ops), Some(contended), Some(misses)) = (
                        op.ops.checked_sub(old_op.ops),
                        op.contended.checked_sub(old_op.contended),
                        op.misses.checked_sub(old_op.misses),
                    ) else {
                        continue;
                    };
                    rates.ops.insert(
                        (instance_key, op.op),
                        CounterRates {
                            ops: ops as f64 / seconds,
                            contended: contended as f64 / seconds,
                            misses: misses as f64 / seconds,
                            drops: 0.0,
                            contention: share(contended, ops),
                        },
                    );
                }
            }
            for ring in &process.rings {
                let Some(old_ring) = old
                    .rings
                    .iter()
                    .find(|r| r.slot == ring.slot && r.generation == ring.generation)
                else {
                    continue;
                };
                if let (Some(drained), Some(dropped)) = (
                    per_second(old_ring.drained, ring.drained, seconds),
                    per_second(old_ring.dropped, ring.dropped, seconds),
                ) {
                    rates
                        .rings
                        .insert((key, ring.slot, ring.generation), RingRates { drained, dropped });
                }
            }
            if let (Some(drained), Some(dropped)) = (
                per_second(old.drained, process.drained, seconds),
                per_second(old.dropped, process.dropped, seconds),
            ) {
                rates.processes.insert(
                    key,
                    ProcessRates {
                        drained,
                        dropped,
                        instances: CounterRates {
                            ops: d_ops as f64 / seconds,
                            contended: d_contended as f64 / seconds,
                            misses: d_misses as f64 / seconds,
                            drops: d_drops as f64 / seconds,
                            contention: share(d_contended, d_ops),
                        },
                    },
                );
            }
        }
        Some(rates)
    }

    /// Rates of a process, if known.
    pub fn process(&self, key: ProcessKey) -> Option<&ProcessRates> {
        self.processes.get(&key)
    }

    /// Rates of an instance, if known.
    pub fn instance(&self, key: InstanceKey) -> Option<&CounterRates> {
        self.instances.get(&key)
    }

    /// Rates of one op kind of an instance, if known.
    pub fn op(&self, key: InstanceKey, op: u16) -> Option<&CounterRates> {
        self.ops.get(&(key, op))
    }

    /// Rates of a ring slot's current occupant, if known.
    pub fn ring(&self, process: ProcessKey, slot: u32, generation: u32) -> Option<&RingRates> {
        self.rings.get(&(process, slot, generation))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{OpReport, Quantiles, RingReport};

    /// `(id, name, ops, contended, drops attributed, p99 ns)` of one instance.
    pub(crate) type InstanceSpec<'a> = (u32, &'a str, u64, u64, u64, u64);

    /// A snapshot of agent `agent_pid` taken at `at_s` seconds holding one
    /// process `pid` with instances `(id, name, ops, contended, drops, p99)`.
    pub(crate) fn snapshot(
        agent_pid: u32,
        at_s: f64,
        processes: &[(u32, &str, &[InstanceSpec<'_>])],
    ) -> AgentSnapshot {
        let mut snapshot = AgentSnapshot::default();
        snapshot.agent.pid = agent_pid;
        snapshot.agent.taken_mono_ns = (at_s * 1e9) as u64;
        for &(pid, comm, instances) in processes {
            let mut process = ProcessReport {
                pid,
                comm: comm.into(),
                state: "attached".into(),
                attached_mono_ns: 1,
                ..ProcessReport::default()
            };
            for &(id, name, ops, contended, drops, p99) in instances {
                process.instances.push(InstanceReport {
                    id,
                    kind: "mutex".into(),
                    name: name.into(),
                    ops,
                    contended,
                    drops_attributed: drops,
                    latency_ns: Quantiles {
                        count: ops,
                        p50: p99 / 2,
                        p99,
                        max: p99 * 2,
                        ..Quantiles::default()
                    },
                    per_op: vec![
                        OpReport {
                            op: 1,
                            name: "lock".into(),
                            ops: ops - ops / 4,
                            contended,
                            ..OpReport::default()
                        },
                        OpReport {
                            op: 2,
                            name: "try_lock".into(),
                            ops: ops / 4,
                            misses: ops / 8,
                            ..OpReport::default()
                        },
                    ],
                    ..InstanceReport::default()
                });
                process.drained += ops;
                process.dropped += drops;
            }
            process.rings.push(RingReport {
                slot: 0,
                state: "active".into(),
                generation: 1,
                tid: pid + 1,
                ns_tid: pid + 1,
                thread_name: "worker-0".into(),
                drained: process.drained,
                dropped: process.dropped,
                episodes: u64::from(process.dropped > 0),
                corrupt: None,
            });
            snapshot.processes.push(process);
        }
        snapshot
    }

    fn key(pid: u32, id: u32) -> InstanceKey {
        InstanceKey {
            process: ProcessKey {
                pid,
                attached_mono_ns: 1,
            },
            id,
        }
    }

    #[test]
    fn rates_are_differences_over_the_agents_clock() {
        let a = snapshot(7, 10.0, &[(100, "app", &[(1, "m", 1000, 100, 0, 5)])]);
        let b = snapshot(7, 12.0, &[(100, "app", &[(1, "m", 5000, 1100, 40, 5)])]);
        let rates = Rates::between(&a, &b).unwrap();
        assert_eq!(rates.interval, Duration::from_secs(2));
        let m = rates.instance(key(100, 1)).unwrap();
        assert_eq!(m.ops, 2000.0);
        assert_eq!(m.contended, 500.0);
        assert_eq!(m.drops, 20.0);
        assert_eq!(
            m.contention,
            Some(0.25),
            "contention over the interval, not overall"
        );
        let p = rates.process(key(100, 1).process).unwrap();
        assert_eq!(p.drained, 2000.0);
        assert_eq!(p.dropped, 20.0);
        assert_eq!(p.instances.ops, 2000.0);
        let lock = rates.op(key(100, 1), 1).unwrap();
        assert_eq!(lock.ops, (3750.0 - 750.0) / 2.0);
        let ring = rates.ring(key(100, 1).process, 0, 1).unwrap();
        assert_eq!(ring.drained, 2000.0);
    }

    #[test]
    fn unknown_rather_than_wrong() {
        let a = snapshot(7, 10.0, &[(100, "app", &[(1, "m", 1000, 0, 0, 5)])]);
        // A new instance and a new process: no rate yet.
        let b = snapshot(
            7,
            11.0,
            &[
                (100, "app", &[(1, "m", 1000, 0, 0, 5), (2, "new", 50, 0, 0, 5)]),
                (200, "other", &[(1, "x", 10, 0, 0, 5)]),
            ],
        );
        let rates = Rates::between(&a, &b).unwrap();
        assert_eq!(rates.instance(key(100, 1)).unwrap().ops, 0.0);
        assert_eq!(
            rates.instance(key(100, 1)).unwrap().contention,
            None,
            "no ops, no share"
        );
        assert!(rates.instance(key(100, 2)).is_none());
        assert!(rates.instance(key(200, 1)).is_none());
        assert!(rates.process(key(200, 1).process).is_none());
        // A counter going backwards (another process under the same pid).
        let c = snapshot(7, 12.0, &[(100, "app", &[(1, "m", 10, 0, 0, 5)])]);
        assert!(Rates::between(&b, &c).unwrap().instance(key(100, 1)).is_none());
        // Another agent, or time not moving forwards: no rates at all.
        assert!(Rates::between(&a, &snapshot(8, 12.0, &[])).is_none());
        assert!(Rates::between(&b, &a).is_none());
        assert!(Rates::between(&a, &a).is_none());
    }
}
