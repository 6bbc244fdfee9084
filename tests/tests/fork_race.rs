//! In a forked child, several threads whose first subetha call happens at
//! the same moment race to create the child's segment. Each one copies the
//! inherited instance table out of the parent's (still mapped) segment; the
//! winner then unmaps that segment. A loser still copying must not be left
//! reading unmapped memory: the child must survive, end up with exactly one
//! segment, and attribute every observation.
//!
//! Sidecar off, so the counts are exact. One `#[test]`: forking a process
//! with other tests running in it would fork them too.

use std::sync::Barrier;

use subetha_core::{
    Drainer, Instance, InstanceKind, SidecarMode, process_segment, process_sidecar, set_sidecar_mode,
};
use subetha_tests::forking::in_forked_child;
use subetha_tests::procfs;

/// Enough live instances that copying the table takes a while.
const INSTANCES: usize = 3000;
const THREADS: usize = 8;
const ROUNDS: usize = 20;

#[test]
fn racing_first_uses_in_a_forked_child_share_one_segment() {
    set_sidecar_mode(SidecarMode::Off);
    let instances: Vec<Instance> = (0..INSTANCES)
        .map(|i| Instance::register(InstanceKind::CUSTOM, &format!("race-{i}")).unwrap())
        .collect();
    assert!(
        process_sidecar().is_none(),
        "sidecar mode off (is SUBETHA_SIDECAR set?)"
    );
    assert!(instances[0].observe(1, 0, 0).unwrap());
    let target = instances.last().unwrap();

    for round in 0..ROUNDS {
        let report = in_forked_child(|| {
            let start = Barrier::new(THREADS);
            std::thread::scope(|s| {
                for _ in 0..THREADS {
                    s.spawn(|| {
                        start.wait();
                        assert!(target.observe(2, 0, 0).unwrap());
                    });
                }
            });
            let segment = process_segment().unwrap();
            assert_eq!(segment.view().layout().pid, std::process::id());
            assert_eq!(
                procfs::subetha_memfds("self").len(),
                1,
                "one segment in the child"
            );
            let mut drainer = Drainer::attach(segment.view()).unwrap();
            let report = drainer.scan();
            assert_eq!(report.drained, THREADS as u64);
            let record = drainer
                .instances()
                .find(|r| r.meta.id == target.id())
                .expect("inherited instance attributed");
            assert_eq!(record.stats.op(2).unwrap().ops(), THREADS as u64);
            assert_eq!(drainer.instances().count(), INSTANCES);
            assert_eq!(drainer.totals().unattributed, 0);
            String::new()
        });
        assert_eq!(report, "", "round {round}");
    }
}
