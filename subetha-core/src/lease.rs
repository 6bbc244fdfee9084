//! The consumer lease: who may drain a segment's rings.
//!
//! Rings are single-consumer, so at any instant at most one party may pop
//! from a segment. That party holds the lease: the header word
//! `consumer = pid << 32 | token` (0 when vacant), claimed by
//! compare-and-swap and released on drop. A holder refreshes
//! `consumer_heartbeat_ns` on every scan.
//!
//! A holder that died without releasing (SIGKILL) leaves its word behind;
//! [`ConsumerLease::acquire`] breaks such a lease when the holder's pid no
//! longer exists. The cooperative hand-over between a sidecar and an agent
//! (takeover requests, stale heartbeats) builds on this word.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::clock;
use crate::segment::SegmentView;

/// The lease is held by a live process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("segment is already drained by pid {holder_pid}")]
pub struct LeaseBusy {
    /// The holder.
    pub holder_pid: u32,
}

static NEXT_TOKEN: AtomicU32 = AtomicU32::new(1);

/// Proof of holding a segment's consumer lease. Released on drop.
#[derive(Debug)]
pub struct ConsumerLease {
    word: u64,
}

impl ConsumerLease {
    /// Takes the lease of `view`, breaking it if its holder is dead.
    pub fn acquire(view: &SegmentView) -> Result<Self, LeaseBusy> {
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed).max(1);
        let word = (u64::from(std::process::id()) << 32) | u64::from(token);
        let consumer = &view.live().consumer;
        let mut current = consumer.load(Ordering::Acquire);
        loop {
            if current != 0 && process_alive(holder_pid(current)) {
                return Err(LeaseBusy {
                    holder_pid: holder_pid(current),
                });
            }
            // AcqRel: acquiring pairs with the previous holder's Release on
            // drop, so its last `head` stores are visible before we pop.
            match consumer.compare_exchange(current, word, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    view.live()
                        .consumer_heartbeat_ns
                        .store(clock::monotonic_ns(), Ordering::Release);
                    return Ok(Self { word });
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Whether `view`'s lease is still ours (a hostile or confused peer may
    /// have overwritten it).
    pub fn is_held(&self, view: &SegmentView) -> bool {
        view.live().consumer.load(Ordering::Acquire) == self.word
    }

    /// Records a heartbeat (done by the drainer once per scan).
    pub fn heartbeat(&self, view: &SegmentView, now_ns: u64) {
        view.live().consumer_heartbeat_ns.store(now_ns, Ordering::Release);
    }

    /// Gives the lease back.
    pub fn release(self, view: &SegmentView) {
        // Release: our last `head` stores happen before the next holder's
        // acquisition. A failed exchange means it was no longer ours.
        let _ = view
            .live()
            .consumer
            .compare_exchange(self.word, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// `pid << 32 | token`.
    pub fn word(&self) -> u64 {
        self.word
    }
}

fn holder_pid(word: u64) -> u32 {
    (word >> 32) as u32
}

/// Whether a process with `pid` exists (signal 0 probes without sending).
pub(crate) fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{Segment, SegmentConfig};

    fn segment() -> Segment {
        Segment::create(SegmentConfig {
            instances: 1,
            ring_slots: 1,
        })
        .unwrap()
    }

    #[test]
    fn one_holder_at_a_time() {
        let segment = segment();
        let view = segment.view();
        let first = ConsumerLease::acquire(view).unwrap();
        assert!(first.is_held(view));
        assert_eq!(
            ConsumerLease::acquire(view).unwrap_err(),
            LeaseBusy {
                holder_pid: std::process::id()
            }
        );
        first.release(view);
        let second = ConsumerLease::acquire(view).unwrap();
        assert!(second.is_held(view));
    }

    #[test]
    fn dead_holder_is_broken() {
        let segment = segment();
        let view = segment.view();
        // A pid above pid_max cannot exist.
        view.live()
            .consumer
            .store((4_194_305u64 << 32) | 7, Ordering::Release);
        let lease = ConsumerLease::acquire(view).unwrap();
        assert!(lease.is_held(view));
    }
}
