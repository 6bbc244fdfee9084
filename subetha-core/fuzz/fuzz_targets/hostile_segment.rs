//! A hostile process's segment: the fuzzer rewrites arbitrary bytes of a
//! valid segment (header, instance table, ring metadata and indices, ring
//! slots, the call-site table's head and entries), then a consumer
//! validates it and, if accepted, drains it twice and resolves call-site
//! ids (every id the drain saw, and ids named by the input). Validation,
//! draining and site resolution must never panic, hang or grow without
//! bound.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use subetha_core::drain::Drainer;
use subetha_core::segment::{Expectations, Segment, SegmentConfig, SegmentView};

/// Interesting byte ranges to aim writes at, so short inputs reach the
/// tables and the ring indices rather than only the header.
fn targets(view: &SegmentView) -> [usize; 9] {
    let layout = view.layout();
    let ring0 = layout.ring_table_offset as usize;
    let sites = layout.site_table_offset as usize;
    [
        sites,                                      // site table head
        sites + 64,                                 // first site entry
        sites + 64 + 128,                           // second site entry
        0,                                          // header layout
        128,                                        // live header words
        layout.instance_table_offset as usize,      // first instance entry
        ring0,                                      // first slot's metadata
        ring0 + 128,                                // first ring's head
        ring0 + 128 + 64,                           // first ring's tail line
    ]
}

fuzz_target!(|data: &[u8]| {
    static CONFIG: OnceLock<()> = OnceLock::new();
    CONFIG.get_or_init(|| subetha_core::set_sidecar_mode(subetha_core::SidecarMode::Off));
    let segment = Segment::create(SegmentConfig { instances: 4, ring_slots: 2 }).expect("memfd");
    let fd = segment.fd().expect("memfd backing");
    let base = segment.view().base_addr() as *mut u8;
    let len = segment.view().layout().total_size as usize;
    let targets = targets(segment.view());
    // Input: a sequence of (target selector, offset, length, bytes) writes.
    let mut rest = data;
    while rest.len() >= 3 {
        let target = targets[usize::from(rest[0]) % targets.len()];
        let offset = target + usize::from(rest[1]);
        let count = usize::from(rest[2] % 32).min(rest.len() - 3);
        let bytes = &rest[3..3 + count];
        rest = &rest[3 + count..];
        if offset + bytes.len() <= len {
            // SAFETY: the range is inside our own mapping; the fuzzer plays a
            // hostile writer, which is exactly what the consumer must survive.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(offset), bytes.len()) };
        }
    }
    let view = match SegmentView::map_fd(fd, &Expectations::default()) {
        Ok(view) => view,
        Err(_) => return,
    };
    let Ok(mut drainer) = Drainer::attach(&view) else {
        return;
    };
    drainer.scan();
    drainer.scan();
    assert!(drainer.episodes().count() <= subetha_core::drain::EPISODE_HISTORY);
    let mut ids: Vec<u16> = drainer
        .instances()
        .flat_map(|r| {
            let waiters = r.sites.waiters.keys().map(|&(_, id)| id);
            let holders = r.sites.holders.keys().map(|&(_, id)| id);
            waiters.chain(holders).collect::<Vec<_>>()
        })
        .collect();
    ids.extend([0, 1, 2, 3, u16::MAX]);
    ids.extend(data.chunks_exact(2).take(8).map(|b| u16::from_le_bytes([b[0], b[1]])));
    for id in ids {
        if let Ok(site) = drainer.resolve_site(id) {
            assert!(site.line != 0 && !site.file.is_empty());
            assert!(site.file.len() <= 4 * subetha_core::site::SITE_FILE_MAX);
        }
    }
    for r in drainer.instances() {
        assert!(r.sites.waiters.len() <= subetha_core::site_stats::MAX_ROWS);
        assert!(r.sites.holders.len() <= subetha_core::site_stats::MAX_ROWS);
    }
});
