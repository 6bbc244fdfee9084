//! [`Channel`]: a bounded MPMC channel over `crossbeam-channel`, with
//! observations.
//!
//! Kind code 5 (`channel`). Ops: `send` (1, C + wait when the channel was
//! full and the sender blocked; M when the channel was disconnected or a
//! timed send timed out), `recv` (2, C + wait when it was empty and the
//! receiver blocked; M likewise), `try_send` (3, M when full or
//! disconnected), `try_recv` (4, M when empty or disconnected).
//!
//! A blocking `send`/`recv` first tries the non-blocking operation and only
//! when that fails reads the clock and blocks in crossbeam's own `send` /
//! `recv`. Operations that succeed at once (`send`, `recv`, `try_send`,
//! `try_recv` without waiting) are counted, not pushed one by one
//! ([`op_counts`](super::op_counts): a count at the 1st, 2nd, 4th … 64th,
//! then every 64th, per thread stripe; the rest when the channel goes
//! away), so the uncontended path costs crossbeam's operation plus one
//! uncontended atomic add. Waits, misses and disconnections are pushed one
//! by one. (One push per operation, two per message, would out-run the sidecar
//! on a small host and make the rings drop: the `channel` group's `…/spsc` and
//! `…/mpmc` rows of `benches/primitives.rs`.) One instance covers the whole
//! channel: every [`Sender`] and
//! [`Receiver`] clone shares it, and it is unregistered, with its counts
//! complete, when the last end is dropped. Disconnection semantics are
//! crossbeam's (all senders gone: receivers drain what is left, then get
//! errors; all receivers gone: sends fail).
//!
//! `select!` needs crossbeam's own ends: [`Sender::as_crossbeam`] and
//! [`Receiver::as_crossbeam`] give them out, unobserved.

use std::fmt;
use std::panic::Location;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crossbeam_channel::{
    RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError, TrySendError,
};

use super::op_counts::OpCounts;
use super::{CONTENDED, COUNT, MISS, Registration};
use crate::clock;
use crate::registry::InstanceKind;

/// The kind [`Channel`] registers.
pub const KIND: InstanceKind = InstanceKind {
    code: 5,
    name: "channel",
    ops: &["send", "recv", "try_send", "try_recv"],
};

/// Op kinds of [`Channel`].
pub mod op {
    /// Blocking (or timed) send.
    pub const SEND: u16 = 1;
    /// Blocking (or timed) receive.
    pub const RECV: u16 = 2;
    /// Non-blocking send.
    pub const TRY_SEND: u16 = 3;
    /// Non-blocking receive.
    pub const TRY_RECV: u16 = 4;
}

/// The sending end of a [`Channel`]; clone it for more producers.
pub struct Sender<T> {
    inner: crossbeam_channel::Sender<T>,
    registration: Arc<Observed>,
}

/// What every end of one channel shares: the instance, and the counts of
/// operations that succeeded at once. The sending and receiving sides
/// count on separate lines, so a producer and a consumer thread never
/// share one.
struct Observed {
    registration: Registration,
    /// [`op::SEND`], [`op::TRY_SEND`].
    sends: OpCounts<2>,
    /// [`op::RECV`], [`op::TRY_RECV`].
    recvs: OpCounts<2>,
}

impl Observed {
    fn new(registration: Registration) -> Self {
        Self {
            registration,
            sends: OpCounts::new(),
            recvs: OpCounts::new(),
        }
    }

    /// The counters of `op` and its index there.
    fn counts_of(&self, op: u16) -> (&OpCounts<2>, usize) {
        match op {
            op::SEND => (&self.sends, 0),
            op::TRY_SEND => (&self.sends, 1),
            op::RECV => (&self.recvs, 0),
            _ => (&self.recvs, 1),
        }
    }

    /// An operation that succeeded at once: counted, and the count pushed
    /// when one is due.
    #[inline(always)]
    fn done_at_once(&self, op: u16) {
        if self.registration.id().is_none() {
            return;
        }
        let (counts, index) = self.counts_of(op);
        if let Some(covered) = counts.add(index) {
            self.emit_count(op, covered);
        }
    }

    /// Pushes a count: out of line, so the operation's own path stays a few
    /// instructions. (With the push inlined, `done_at_once` was a call that
    /// saved registers, which the `channel` group's `…/turns` rows show.)
    #[cold]
    #[inline(never)]
    fn emit_count(&self, op: u16, covered: u64) {
        self.registration.emit(op, COUNT, covered);
    }

    fn id(&self) -> Option<u32> {
        self.registration.id()
    }

    /// Emits a wait or a miss made at `site`, carrying its id.
    fn emit_at(&self, op_kind: u16, flags: u16, latency_ticks: u64, site: &'static Location<'static>) {
        self.registration.emit_at(op_kind, flags, latency_ticks, site);
    }
}

/// Reports what no count covers yet, before the registration (dropped after this)
/// unregisters the instance.
impl Drop for Observed {
    fn drop(&mut self) {
        let [send, try_send] = self.sends.take_uncounted();
        let [recv, try_recv] = self.recvs.take_uncounted();
        for (op, rest) in [
            (op::SEND, send),
            (op::TRY_SEND, try_send),
            (op::RECV, recv),
            (op::TRY_RECV, try_recv),
        ] {
            if rest != 0 {
                self.registration.emit(op, COUNT, rest);
            }
        }
    }
}

/// The receiving end of a [`Channel`]; clone it for more consumers.
pub struct Receiver<T> {
    inner: crossbeam_channel::Receiver<T>,
    registration: Arc<Observed>,
}

/// A bounded multi-producer multi-consumer channel (kind 5): both ends in
/// one value, usable by reference from many threads. [`Channel::split`]
/// gives separate ends (needed to observe disconnection).
///
/// ```
/// use subetha_core::Channel;
///
/// let jobs = Channel::named("jobs", 64);
/// jobs.send(1u32).unwrap();
/// assert_eq!(jobs.try_recv(), Ok(1));
/// let (tx, rx) = jobs.split();
/// std::thread::spawn(move || tx.send(2).unwrap());
/// assert_eq!(rx.recv(), Ok(2));
/// ```
pub struct Channel<T> {
    tx: Sender<T>,
    rx: Receiver<T>,
}

impl<T> fmt::Debug for Channel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("instance_id", &self.instance_id())
            .finish()
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("instance_id", &self.registration.id())
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("instance_id", &self.registration.id())
            .finish_non_exhaustive()
    }
}

impl<T> Channel<T> {
    /// A channel holding up to `capacity` messages (0: rendezvous), named
    /// after its creation site.
    #[track_caller]
    pub fn bounded(capacity: usize) -> Self {
        Self::build(capacity, Registration::register(KIND, None, Location::caller()))
    }

    /// A channel holding up to `capacity` messages, named `name`.
    #[track_caller]
    pub fn named(name: &str, capacity: usize) -> Self {
        Self::build(
            capacity,
            Registration::register(KIND, Some(name), Location::caller()),
        )
    }

    /// A channel without an instance (nothing observed).
    pub fn unobserved(capacity: usize) -> Self {
        Self::build(capacity, Registration::NONE)
    }

    fn build(capacity: usize, registration: Registration) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        let registration = Arc::new(Observed::new(registration));
        Self {
            tx: Sender {
                inner: tx,
                registration: Arc::clone(&registration),
            },
            rx: Receiver {
                inner: rx,
                registration,
            },
        }
    }

    /// Separate ends; the channel disconnects when all ends of one side are
    /// dropped.
    pub fn split(self) -> (Sender<T>, Receiver<T>) {
        (self.tx, self.rx)
    }

    /// A new sending end.
    pub fn sender(&self) -> Sender<T> {
        self.tx.clone()
    }

    /// A new receiving end.
    pub fn receiver(&self) -> Receiver<T> {
        self.rx.clone()
    }

    /// See [`Sender::send`].
    #[inline]
    #[track_caller]
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        self.tx.send(msg)
    }

    /// See [`Sender::try_send`].
    #[inline]
    #[track_caller]
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.tx.try_send(msg)
    }

    /// See [`Sender::send_timeout`].
    #[track_caller]
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.tx.send_timeout(msg, timeout)
    }

    /// See [`Receiver::recv`].
    #[inline]
    #[track_caller]
    pub fn recv(&self) -> Result<T, RecvError> {
        self.rx.recv()
    }

    /// See [`Receiver::try_recv`].
    #[inline]
    #[track_caller]
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv()
    }

    /// See [`Receiver::recv_timeout`].
    #[track_caller]
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    /// Messages queued.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no message is queued.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// Whether the channel is full.
    pub fn is_full(&self) -> bool {
        self.rx.is_full()
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.rx.capacity()
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.tx.registration.id()
    }
}

impl<T> Sender<T> {
    /// Sends `msg`, blocking while the channel is full. Fails (giving the
    /// message back) once every receiver is gone.
    #[inline]
    #[track_caller]
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        match self.inner.try_send(msg) {
            Ok(()) => {
                self.registration.done_at_once(op::SEND);
                Ok(())
            }
            Err(TrySendError::Full(msg)) => self.send_blocking(msg, Location::caller()),
            Err(TrySendError::Disconnected(msg)) => {
                self.registration.emit_at(op::SEND, MISS, 0, Location::caller());
                Err(SendError(msg))
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn send_blocking(&self, msg: T, site: &'static Location<'static>) -> Result<(), SendError<T>> {
        let start = clock::ticks();
        let result = self.inner.send(msg);
        let flags = if result.is_ok() {
            CONTENDED
        } else {
            CONTENDED | MISS
        };
        self.registration
            .emit_at(op::SEND, flags, super::since(start), site);
        result
    }

    /// Sends `msg` if there is room now.
    #[inline]
    #[track_caller]
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let result = self.inner.try_send(msg);
        if result.is_ok() {
            self.registration.done_at_once(op::TRY_SEND);
        } else {
            self.registration
                .emit_at(op::TRY_SEND, MISS, 0, Location::caller());
        }
        result
    }

    /// Sends `msg`, waiting at most `timeout` for room.
    #[track_caller]
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.send_deadline(msg, deadline),
            None => self
                .send(msg)
                .map_err(|SendError(m)| SendTimeoutError::Disconnected(m)),
        }
    }

    /// Sends `msg`, waiting until `deadline` at most for room.
    #[track_caller]
    pub fn send_deadline(&self, msg: T, deadline: Instant) -> Result<(), SendTimeoutError<T>> {
        let msg = match self.inner.try_send(msg) {
            Ok(()) => {
                self.registration.done_at_once(op::SEND);
                return Ok(());
            }
            Err(TrySendError::Disconnected(msg)) => {
                self.registration.emit_at(op::SEND, MISS, 0, Location::caller());
                return Err(SendTimeoutError::Disconnected(msg));
            }
            Err(TrySendError::Full(msg)) => msg,
        };
        let start = clock::ticks();
        let result = self.inner.send_deadline(msg, deadline);
        let flags = if result.is_ok() {
            CONTENDED
        } else {
            CONTENDED | MISS
        };
        self.registration
            .emit_at(op::SEND, flags, super::since(start), Location::caller());
        result
    }

    /// Messages queued.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether no message is queued.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Whether the channel is full.
    pub fn is_full(&self) -> bool {
        self.inner.is_full()
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.inner.capacity().unwrap_or(0)
    }

    /// crossbeam's sender (for `select!`); operations on it are not observed.
    pub fn as_crossbeam(&self) -> &crossbeam_channel::Sender<T> {
        &self.inner
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.registration.id()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            registration: Arc::clone(&self.registration),
        }
    }
}

impl<T> Receiver<T> {
    /// Receives a message, blocking while the channel is empty. Fails once
    /// it is empty and every sender is gone.
    #[inline]
    #[track_caller]
    pub fn recv(&self) -> Result<T, RecvError> {
        match self.inner.try_recv() {
            Ok(msg) => {
                self.registration.done_at_once(op::RECV);
                Ok(msg)
            }
            Err(TryRecvError::Empty) => self.recv_blocking(Location::caller()),
            Err(TryRecvError::Disconnected) => {
                self.registration.emit_at(op::RECV, MISS, 0, Location::caller());
                Err(RecvError)
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn recv_blocking(&self, site: &'static Location<'static>) -> Result<T, RecvError> {
        let start = clock::ticks();
        let result = self.inner.recv();
        let flags = if result.is_ok() {
            CONTENDED
        } else {
            CONTENDED | MISS
        };
        self.registration
            .emit_at(op::RECV, flags, super::since(start), site);
        result
    }

    /// Receives a message if one is queued.
    #[inline]
    #[track_caller]
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let result = self.inner.try_recv();
        if result.is_ok() {
            self.registration.done_at_once(op::TRY_RECV);
        } else {
            self.registration
                .emit_at(op::TRY_RECV, MISS, 0, Location::caller());
        }
        result
    }

    /// Receives a message, waiting at most `timeout`.
    #[track_caller]
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.recv_deadline(deadline),
            None => self.recv().map_err(|RecvError| RecvTimeoutError::Disconnected),
        }
    }

    /// Receives a message, waiting until `deadline` at most.
    #[track_caller]
    pub fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        match self.inner.try_recv() {
            Ok(msg) => {
                self.registration.done_at_once(op::RECV);
                return Ok(msg);
            }
            Err(TryRecvError::Disconnected) => {
                self.registration.emit_at(op::RECV, MISS, 0, Location::caller());
                return Err(RecvTimeoutError::Disconnected);
            }
            Err(TryRecvError::Empty) => {}
        }
        let start = clock::ticks();
        let result = self.inner.recv_deadline(deadline);
        let flags = if result.is_ok() {
            CONTENDED
        } else {
            CONTENDED | MISS
        };
        self.registration
            .emit_at(op::RECV, flags, super::since(start), Location::caller());
        result
    }

    /// A blocking iterator: `recv` until the channel is disconnected.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || self.recv().ok())
    }

    /// A non-blocking iterator over what is queued now.
    pub fn try_iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || self.try_recv().ok())
    }

    /// Messages queued.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether no message is queued.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Whether the channel is full.
    pub fn is_full(&self) -> bool {
        self.inner.is_full()
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.inner.capacity().unwrap_or(0)
    }

    /// crossbeam's receiver (for `select!`); operations on it are not
    /// observed.
    pub fn as_crossbeam(&self) -> &crossbeam_channel::Receiver<T> {
        &self.inner
    }

    /// The instance id observations carry, `None` when unobserved.
    pub fn instance_id(&self) -> Option<u32> {
        self.registration.id()
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            registration: Arc::clone(&self.registration),
        }
    }
}

/// The owning blocking iterator of a [`Receiver`].
#[derive(Debug)]
pub struct IntoIter<T>(Receiver<T>);

impl<T> Iterator for IntoIter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.0.recv().ok()
    }
}

impl<T> IntoIterator for Receiver<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;

    fn into_iter(self) -> IntoIter<T> {
        IntoIter(self)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{op, unique, wait_for};
    use super::*;

    #[test]
    fn fast_paths_misses_and_disconnection() {
        let name = unique("channel-basic");
        let ch = Channel::named(&name, 2);
        ch.send(1).unwrap();
        ch.try_send(2).unwrap();
        assert!(matches!(ch.try_send(3), Err(TrySendError::Full(3))));
        assert_eq!(ch.recv(), Ok(1));
        assert_eq!(ch.try_recv(), Ok(2));
        assert_eq!(ch.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(
            ch.recv_timeout(Duration::from_millis(2)),
            Err(RecvTimeoutError::Timeout)
        );
        let (tx, rx) = ch.split();
        drop(rx);
        assert!(tx.send(4).is_err());
        drop(tx);
        let r = wait_for(&name, |r| {
            r.meta.retired_mono_ns.is_some() && r.stats.total_ops() >= 8
        });
        assert_eq!(op(&r, op::SEND), (2, 0, 1, 0));
        assert_eq!(op(&r, op::TRY_SEND), (2, 0, 1, 0));
        assert_eq!(op(&r, op::RECV), (2, 1, 1, 1));
        assert_eq!(op(&r, op::TRY_RECV), (2, 0, 1, 0));
    }

    #[test]
    fn operations_done_at_once_are_counted_and_exact_when_the_channel_is_gone() {
        const PRODUCERS: u64 = 3;
        // Every thread's observations fit its ring even if the sidecar does
        // not drain at all meanwhile (each producer pushes at most one per
        // `send`, the receiving thread one per `recv` plus a few counts):
        // with 10,000 each, a loaded CI host's rings dropped 2,825 sends.
        const EACH: u64 = 1_000;
        const _: () = assert!(PRODUCERS * EACH + 64 < crate::ObservationRing::CAPACITY as u64);
        let name = unique("channel-counted");
        let (tx, rx) = Channel::named(&name, 64).split();
        // One thread's `try_*`s: its stripe's counts end at the 1st, 2nd,
        // 4th … 64th, then every 64th, so 1000 show as 960 while alive.
        for i in 0..1000 {
            tx.try_send(i).unwrap();
            assert_eq!(rx.try_recv(), Ok(i));
        }
        let r = wait_for(&name, |r| op(r, op::TRY_RECV).0 >= 960);
        assert_eq!(op(&r, op::TRY_SEND), (960, 0, 0, 0));
        assert_eq!(op(&r, op::TRY_RECV), (960, 0, 0, 0));
        // Several producers, some of their sends blocking on the small
        // channel: at once or not, every operation is reported once.
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|_| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        tx.send(i).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        for _ in 0..PRODUCERS * EACH {
            rx.recv().unwrap();
        }
        for producer in producers {
            producer.join().unwrap();
        }
        drop(rx);
        let r = wait_for(&name, |r| r.meta.retired_mono_ns.is_some());
        assert_eq!(op(&r, op::SEND).0, PRODUCERS * EACH);
        assert_eq!(op(&r, op::RECV).0, PRODUCERS * EACH);
        assert_eq!(op(&r, op::TRY_SEND), (1000, 0, 0, 0));
        assert_eq!(op(&r, op::TRY_RECV), (1000, 0, 0, 0));
    }

    #[test]
    fn blocked_senders_and_receivers_record_waits() {
        let name = unique("channel-blocking");
        let (tx, rx) = Channel::named(&name, 1).split();
        tx.send(0u32).unwrap();
        // A sender blocks on the full channel …
        let sender = {
            let tx = tx.clone();
            std::thread::spawn(move || tx.send(1).unwrap())
        };
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(rx.recv(), Ok(0));
        sender.join().unwrap();
        assert_eq!(rx.recv(), Ok(1));
        // … and a receiver on the empty one.
        let receiver = {
            let rx = rx.clone();
            std::thread::spawn(move || rx.recv().unwrap())
        };
        std::thread::sleep(Duration::from_millis(20));
        tx.send(2).unwrap();
        assert_eq!(receiver.join().unwrap(), 2);
        drop(tx);
        assert_eq!(rx.iter().count(), 0);
        let r = wait_for(&name, |r| op(r, op::RECV).0 >= 4);
        assert_eq!(op(&r, op::SEND), (3, 1, 0, 1));
        // Three received (one after blocking) and the final disconnect miss.
        assert_eq!(op(&r, op::RECV), (4, 1, 1, 1));
        let ms15 = crate::clock::calibration().ns_to_ticks(15_000_000);
        for k in [op::SEND, op::RECV] {
            let waited = r.stats.op(k).unwrap().latency().unwrap().max();
            assert!(waited >= ms15, "op {k} waited {waited} ticks");
        }
    }
}
