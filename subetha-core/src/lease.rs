//! The consumer lease: who may drain a segment's rings, and how that role
//! changes hands without ever having two consumers or losing an
//! observation.
//!
//! Rings are single-consumer, so at any instant at most one party may pop
//! from a segment. That party holds the lease: the header word
//! `consumer = pid << 32 | token` (0 when vacant). Every change of the word
//! is a compare-and-swap, so exactly one party holds it. The holder
//! refreshes `consumer_heartbeat_ns` on every scan.
//!
//! # Hand-over protocol
//!
//! * **Vacant**: anyone takes it with a CAS from 0 ([`ConsumerLease::acquire`]).
//! * **Takeover** (an agent wants a segment its application's sidecar
//!   drains): the agent writes its own word into `takeover_request`
//!   ([`TakeoverRequest::raise`]). The sidecar, between two scans — never in
//!   the middle of one — swaps `consumer` from its word to the requester's
//!   ([`ConsumerLease::hand_over`]) and clears the request. The agent sees
//!   its word in `consumer` ([`TakeoverRequest::poll`]) and starts draining.
//!   Everything the sidecar popped happened before its swap (Release), and
//!   the agent's first pop after it (Acquire): no overlap, and whatever is
//!   still in a ring stays there for the agent.
//! * **Hand-back**: an agent stopping cleanly sets the word back to 0; the
//!   waiting sidecar takes it again.
//! * **Crash**: a holder killed without releasing leaves its word behind.
//!   [`ConsumerLease::acquire`] breaks a lease whose holder process no longer
//!   exists (checked with `kill(pid, 0)`); a dead process cannot be in the
//!   middle of a pop, so breaking it cannot create a second consumer. A
//!   holder that is alive but silent (stopped, or stuck) is *not* broken:
//!   its heartbeat age is reported instead, because it may resume mid-pop.
//!   Pids are compared in the segment creator's pid namespace; an agent and
//!   an application in different pid namespaces are not supported.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::clock;
use crate::segment::SegmentView;

/// The lease is held by a live process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("segment is already drained by pid {holder_pid}")]
pub struct LeaseBusy {
    /// The holder.
    pub holder_pid: u32,
}

/// Why a takeover did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TakeoverError {
    /// Another party's takeover request is pending.
    #[error("another takeover (pid {requester_pid}) is pending")]
    AnotherRequestPending {
        /// Who asked.
        requester_pid: u32,
    },
    /// The holder did not hand over in time (a stopped process, or a
    /// sidecar in `always` mode, or another agent).
    #[error("pid {holder_pid} did not hand the lease over within {waited_ms} ms")]
    NotHandedOver {
        /// The holder.
        holder_pid: u32,
        /// How long we waited.
        waited_ms: u64,
    },
}

static NEXT_TOKEN: AtomicU32 = AtomicU32::new(1);

/// A fresh lease word for this process: `pid << 32 | token`, never 0.
pub fn new_word() -> u64 {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed).max(1);
    (u64::from(std::process::id()) << 32) | u64::from(token)
}

/// The pid in a lease word.
pub fn word_pid(word: u64) -> u32 {
    (word >> 32) as u32
}

/// Proof of holding a segment's consumer lease. Give it back with
/// [`release`](Self::release) or [`hand_over`](Self::hand_over); dropping it
/// without either keeps the word in the segment (as a crash would).
#[derive(Debug, PartialEq, Eq)]
pub struct ConsumerLease {
    word: u64,
}

impl ConsumerLease {
    /// Takes the lease of `view` if it is vacant or its holder is dead.
    pub fn acquire(view: &SegmentView) -> Result<Self, LeaseBusy> {
        let word = new_word();
        let consumer = &view.live().consumer;
        let mut current = consumer.load(Ordering::Acquire);
        loop {
            if current != 0 && process_alive(word_pid(current)) {
                return Err(LeaseBusy {
                    holder_pid: word_pid(current),
                });
            }
            // AcqRel: acquiring pairs with the previous holder's Release, so
            // its last `head` stores are visible before we pop.
            match consumer.compare_exchange(current, word, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let lease = Self { word };
                    lease.heartbeat(view, clock::monotonic_ns());
                    return Ok(lease);
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

    /// Records a heartbeat (the drainer does this once per scan).
    pub fn heartbeat(&self, view: &SegmentView, now_ns: u64) {
        view.live().consumer_heartbeat_ns.store(now_ns, Ordering::Release);
    }

    /// Gives the lease back (the word becomes 0).
    pub fn release(self, view: &SegmentView) {
        // Release: our last `head` stores happen before the next holder's
        // acquisition. A failed exchange means it was no longer ours.
        let _ = view
            .live()
            .consumer
            .compare_exchange(self.word, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// The takeover request pending on `view`, if any (and from a live
    /// process; a dead requester's request is cleared).
    pub fn pending_request(&self, view: &SegmentView) -> Option<u64> {
        let request = &view.live().takeover_request;
        let word = request.load(Ordering::Acquire);
        if word == 0 {
            return None;
        }
        if !process_alive(word_pid(word)) {
            let _ = request.compare_exchange(word, 0, Ordering::AcqRel, Ordering::Relaxed);
            return None;
        }
        Some(word)
    }

    /// Hands the lease to the requester `to` (between scans only). Returns
    /// the lease back if it was no longer ours.
    pub fn hand_over(self, view: &SegmentView, to: u64) -> Result<(), Self> {
        let live = view.live();
        // Release: every pop we made happens before the requester's first.
        match live
            .consumer
            .compare_exchange(self.word, to, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => {
                let _ = live
                    .takeover_request
                    .compare_exchange(to, 0, Ordering::AcqRel, Ordering::Relaxed);
                Ok(())
            }
            Err(_) => Err(self),
        }
    }

    /// `pid << 32 | token`.
    pub fn word(&self) -> u64 {
        self.word
    }
}

/// A pending request to take a segment's lease over from its holder.
#[derive(Debug)]
pub struct TakeoverRequest {
    word: u64,
}

impl TakeoverRequest {
    /// Takes the lease at once if possible (vacant or dead holder), else
    /// raises a request the holder answers between two scans.
    pub fn raise(view: &SegmentView) -> Result<Result<ConsumerLease, TakeoverRequest>, TakeoverError> {
        if let Ok(lease) = ConsumerLease::acquire(view) {
            return Ok(Ok(lease));
        }
        let word = new_word();
        let request = &view.live().takeover_request;
        let mut current = request.load(Ordering::Acquire);
        loop {
            if current != 0 && process_alive(word_pid(current)) {
                return Err(TakeoverError::AnotherRequestPending {
                    requester_pid: word_pid(current),
                });
            }
            match request.compare_exchange(current, word, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Err(TakeoverRequest { word })),
                Err(actual) => current = actual,
            }
        }
    }

    /// The lease, once the holder handed it over (or released it, or died).
    pub fn poll(&self, view: &SegmentView) -> Option<ConsumerLease> {
        let consumer = view.live().consumer.load(Ordering::Acquire);
        if consumer == self.word {
            return Some(ConsumerLease { word: self.word });
        }
        if consumer == 0 || !process_alive(word_pid(consumer)) {
            // Vacated: take it directly with our own word.
            let taken = view
                .live()
                .consumer
                .compare_exchange(consumer, self.word, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if taken {
                self.withdraw_request(view);
                let lease = ConsumerLease { word: self.word };
                lease.heartbeat(view, clock::monotonic_ns());
                return Some(lease);
            }
        }
        None
    }

    /// Polls until granted or `timeout` passes; withdraws the request on
    /// timeout.
    pub fn wait(self, view: &SegmentView, timeout: Duration) -> Result<ConsumerLease, TakeoverError> {
        let start = Instant::now();
        loop {
            if let Some(lease) = self.poll(view) {
                return Ok(lease);
            }
            if start.elapsed() >= timeout {
                self.withdraw_request(view);
                // A hand-over may have raced the withdrawal.
                if let Some(lease) = self.poll(view) {
                    return Ok(lease);
                }
                return Err(TakeoverError::NotHandedOver {
                    holder_pid: word_pid(view.live().consumer.load(Ordering::Acquire)),
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn withdraw_request(&self, view: &SegmentView) {
        let _ =
            view.live()
                .takeover_request
                .compare_exchange(self.word, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// Whether a process with `pid` exists (signal 0 probes without sending).
pub fn process_alive(pid: u32) -> bool {
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

    /// A pid above the kernel's pid_max, which cannot exist.
    const DEAD_PID: u64 = 4_194_305;

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
        view.live()
            .consumer
            .store((DEAD_PID << 32) | 7, Ordering::Release);
        let lease = ConsumerLease::acquire(view).unwrap();
        assert!(lease.is_held(view));
    }

    #[test]
    fn takeover_is_granted_between_scans_and_handed_back() {
        let segment = segment();
        let view = segment.view();
        let holder = ConsumerLease::acquire(view).unwrap();
        let request = match TakeoverRequest::raise(view).unwrap() {
            Ok(_) => panic!("lease is held, must not be granted at once"),
            Err(request) => request,
        };
        assert!(request.poll(view).is_none());
        assert!(matches!(
            TakeoverRequest::raise(view),
            Err(TakeoverError::AnotherRequestPending { .. })
        ));
        let pending = holder.pending_request(view).expect("request visible to holder");
        holder.hand_over(view, pending).unwrap();
        let taken = request.poll(view).expect("granted");
        assert!(taken.is_held(view));
        assert_eq!(view.live().takeover_request.load(Ordering::Acquire), 0);
        taken.release(view);
        assert_eq!(view.live().consumer.load(Ordering::Acquire), 0);
    }

    #[test]
    fn takeover_times_out_and_withdraws() {
        let segment = segment();
        let view = segment.view();
        let _holder = ConsumerLease::acquire(view).unwrap();
        let Err(request) = TakeoverRequest::raise(view).unwrap() else {
            panic!("held");
        };
        let err = request.wait(view, Duration::from_millis(5)).unwrap_err();
        assert!(matches!(err, TakeoverError::NotHandedOver { .. }), "{err}");
        assert_eq!(view.live().takeover_request.load(Ordering::Acquire), 0);
    }

    #[test]
    fn dead_requesters_are_ignored() {
        let segment = segment();
        let view = segment.view();
        let holder = ConsumerLease::acquire(view).unwrap();
        view.live()
            .takeover_request
            .store(DEAD_PID << 32 | 1, Ordering::Release);
        assert_eq!(holder.pending_request(view), None);
        assert_eq!(view.live().takeover_request.load(Ordering::Acquire), 0);
    }
}
