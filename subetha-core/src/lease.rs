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
//!
//! # Across pid namespaces
//!
//! `kill(pid, 0)` means something only in the pid namespace the pid was
//! taken in, and an application in a container cannot see the host agent's
//! pid at all (it would take the agent for dead and break its lease, making
//! two consumers). So a consumer outside the segment creator's namespace
//! ([`LeaseScope::Foreign`]) marks its words with [`FOREIGN_PID_BIT`], and:
//!
//! * a party in the creator's namespace judges a foreign *holder* by its
//!   heartbeat (alive while younger than [`FOREIGN_STALE`]) and a foreign
//!   *requester* as alive (a dead one's request, once granted, becomes a
//!   holder whose heartbeat goes stale);
//! * the foreign party judges a creator-namespace word that names the
//!   creator by the creator's host pid, and any other such word as alive
//!   (it cannot tell).
//!
//! Breaking a stale foreign lease trusts that a holder silent for
//! [`FOREIGN_STALE`] is gone; one stopped that long and resumed can overlap
//! the new holder by one scan. That is the price of a namespace the holder
//! cannot be seen from; within one namespace, a silent holder is never
//! broken. Foreign words assume all foreign parties share one pid namespace
//! (the host's).

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

/// Set in the pid half of a lease word written by a consumer outside the
/// segment creator's pid namespace (pids stay below 2^22).
pub const FOREIGN_PID_BIT: u32 = 1 << 31;

/// How long a foreign holder's heartbeat may be silent before a party in
/// the creator's namespace takes it for gone.
pub const FOREIGN_STALE: Duration = Duration::from_secs(3);

/// Where a consumer stands relative to the pid namespace of the segment's
/// creator; see the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseScope {
    /// In the same pid namespace (the sidecar; an agent beside the app).
    #[default]
    Local,
    /// Outside it, in an ancestor namespace (a host agent, the app in a
    /// container).
    Foreign {
        /// The creator's pid in its own namespace (the header's `pid`).
        owner_ns_pid: u32,
        /// The creator's pid in ours.
        owner_host_pid: u32,
    },
}

/// A fresh lease word for this process: `pid << 32 | token`, never 0.
pub fn new_word() -> u64 {
    new_word_in(LeaseScope::Local)
}

fn new_word_in(scope: LeaseScope) -> u64 {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed).max(1);
    let mut pid = std::process::id();
    if matches!(scope, LeaseScope::Foreign { .. }) {
        pid |= FOREIGN_PID_BIT;
    }
    (u64::from(pid) << 32) | u64::from(token)
}

/// The pid in a lease word (without [`FOREIGN_PID_BIT`]).
pub fn word_pid(word: u64) -> u32 {
    (word >> 32) as u32 & !FOREIGN_PID_BIT
}

/// Whether a lease word was written from outside the creator's namespace.
pub fn word_is_foreign(word: u64) -> bool {
    (word >> 32) as u32 & FOREIGN_PID_BIT != 0
}

/// What a word is being judged as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Holder,
    Requester,
}

/// Whether the party behind a nonzero `word` may still be alive, judged by
/// a party in `scope` (see the [module docs](self)).
fn word_alive(view: &SegmentView, word: u64, role: Role, scope: LeaseScope) -> bool {
    let pid = word_pid(word);
    match (word_is_foreign(word), scope) {
        (true, LeaseScope::Local) => match role {
            Role::Requester => true,
            Role::Holder => {
                let beat = view.live().consumer_heartbeat_ns.load(Ordering::Acquire);
                clock::monotonic_ns().saturating_sub(beat) < FOREIGN_STALE.as_nanos() as u64
            }
        },
        (true, LeaseScope::Foreign { .. }) => process_alive(pid),
        (false, LeaseScope::Local) => process_alive(pid),
        (
            false,
            LeaseScope::Foreign {
                owner_ns_pid,
                owner_host_pid,
            },
        ) => pid != owner_ns_pid || process_alive(owner_host_pid),
    }
}

/// Proof of holding a segment's consumer lease. Give it back with
/// [`release`](Self::release) or [`hand_over`](Self::hand_over); dropping it
/// without either keeps the word in the segment (as a crash would).
#[derive(Debug, PartialEq, Eq)]
pub struct ConsumerLease {
    word: u64,
    scope: LeaseScope,
}

impl ConsumerLease {
    /// Takes the lease of `view` if it is vacant or its holder is dead.
    pub fn acquire(view: &SegmentView) -> Result<Self, LeaseBusy> {
        Self::acquire_in(view, LeaseScope::Local)
    }

    /// [`acquire`](Self::acquire) for a consumer in `scope`.
    pub fn acquire_in(view: &SegmentView, scope: LeaseScope) -> Result<Self, LeaseBusy> {
        let word = new_word_in(scope);
        let consumer = &view.live().consumer;
        let mut current = consumer.load(Ordering::Acquire);
        loop {
            if current != 0 && word_alive(view, current, Role::Holder, scope) {
                return Err(LeaseBusy {
                    holder_pid: word_pid(current),
                });
            }
            // AcqRel: acquiring pairs with the previous holder's Release, so
            // its last `head` stores are visible before we pop.
            match consumer.compare_exchange(current, word, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let lease = Self { word, scope };
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
        if !word_alive(view, word, Role::Requester, self.scope) {
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
    scope: LeaseScope,
}

impl TakeoverRequest {
    /// Takes the lease at once if possible (vacant or dead holder), else
    /// raises a request the holder answers between two scans.
    pub fn raise(view: &SegmentView) -> Result<Result<ConsumerLease, TakeoverRequest>, TakeoverError> {
        Self::raise_in(view, LeaseScope::Local)
    }

    /// [`raise`](Self::raise) for a consumer in `scope`.
    pub fn raise_in(
        view: &SegmentView,
        scope: LeaseScope,
    ) -> Result<Result<ConsumerLease, TakeoverRequest>, TakeoverError> {
        if let Ok(lease) = ConsumerLease::acquire_in(view, scope) {
            return Ok(Ok(lease));
        }
        let word = new_word_in(scope);
        let request = &view.live().takeover_request;
        let mut current = request.load(Ordering::Acquire);
        loop {
            if current != 0 && word_alive(view, current, Role::Requester, scope) {
                return Err(TakeoverError::AnotherRequestPending {
                    requester_pid: word_pid(current),
                });
            }
            match request.compare_exchange(current, word, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Err(TakeoverRequest { word, scope })),
                Err(actual) => current = actual,
            }
        }
    }

    /// The lease, once the holder handed it over (or released it, or died).
    pub fn poll(&self, view: &SegmentView) -> Option<ConsumerLease> {
        let consumer = view.live().consumer.load(Ordering::Acquire);
        if consumer == self.word {
            return Some(ConsumerLease {
                word: self.word,
                scope: self.scope,
            });
        }
        if consumer == 0 || !word_alive(view, consumer, Role::Holder, self.scope) {
            // Vacated: take it directly with our own word.
            let taken = view
                .live()
                .consumer
                .compare_exchange(consumer, self.word, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if taken {
                self.withdraw_request(view);
                let lease = ConsumerLease {
                    word: self.word,
                    scope: self.scope,
                };
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

    /// A word from outside the creator's namespace whose pid means nothing
    /// here (a dead pid, as an app in a container would see the host
    /// agent's).
    const FOREIGN_DEAD: u64 = ((FOREIGN_PID_BIT as u64 | DEAD_PID) << 32) | 3;

    #[test]
    fn a_foreign_holder_is_judged_by_its_heartbeat_not_its_pid() {
        let segment = segment();
        let view = segment.view();
        let live = view.live();
        assert!(word_is_foreign(FOREIGN_DEAD));
        assert_eq!(word_pid(FOREIGN_DEAD), DEAD_PID as u32);
        live.consumer.store(FOREIGN_DEAD, Ordering::Release);
        live.consumer_heartbeat_ns
            .store(clock::monotonic_ns(), Ordering::Release);
        // Its pid is dead here, but it beat just now: not broken.
        assert_eq!(
            ConsumerLease::acquire(view).unwrap_err(),
            LeaseBusy {
                holder_pid: DEAD_PID as u32
            }
        );
        // Silent for longer than FOREIGN_STALE: gone.
        let stale = clock::monotonic_ns().saturating_sub(FOREIGN_STALE.as_nanos() as u64 + 1_000_000);
        live.consumer_heartbeat_ns.store(stale, Ordering::Release);
        let taken = ConsumerLease::acquire(view).unwrap();
        assert!(taken.is_held(view));
        assert!(!word_is_foreign(taken.word()));
    }

    #[test]
    fn a_foreign_request_is_granted_though_its_pid_is_not_visible() {
        let segment = segment();
        let view = segment.view();
        let holder = ConsumerLease::acquire(view).unwrap();
        view.live()
            .takeover_request
            .store(FOREIGN_DEAD, Ordering::Release);
        assert_eq!(holder.pending_request(view), Some(FOREIGN_DEAD));
        holder.hand_over(view, FOREIGN_DEAD).unwrap();
        assert_eq!(view.live().consumer.load(Ordering::Acquire), FOREIGN_DEAD);
    }

    #[test]
    fn a_foreign_consumer_marks_its_words_and_judges_the_creator_by_its_host_pid() {
        let segment = segment();
        let view = segment.view();
        let own = std::process::id();
        // The creator (pid 1 in its namespace) holds the lease; its host pid
        // is alive: busy.
        let creator = (1u64 << 32) | 5;
        view.live().consumer.store(creator, Ordering::Release);
        let alive = LeaseScope::Foreign {
            owner_ns_pid: 1,
            owner_host_pid: own,
        };
        assert!(ConsumerLease::acquire_in(view, alive).is_err());
        // Another process of that namespace (pid 2): cannot tell, busy, even
        // though pid 2 on this side might be anything.
        view.live().consumer.store((2u64 << 32) | 5, Ordering::Release);
        let dead_owner = LeaseScope::Foreign {
            owner_ns_pid: 1,
            owner_host_pid: DEAD_PID as u32,
        };
        assert!(ConsumerLease::acquire_in(view, dead_owner).is_err());
        // The creator itself, dead on the host: broken, and the new word is
        // marked foreign.
        view.live().consumer.store(creator, Ordering::Release);
        let lease = ConsumerLease::acquire_in(view, dead_owner).unwrap();
        assert!(word_is_foreign(lease.word()));
        assert_eq!(word_pid(lease.word()), own);
        // A raised request is foreign too.
        let request = TakeoverRequest::raise_in(view, alive).unwrap();
        assert!(
            request.is_err(),
            "a second foreign word waits: the live foreign holder is not broken"
        );
    }
}
