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
//! `recv`; the uncontended path costs crossbeam's operation plus one ring
//! push. One instance covers the whole channel: every [`Sender`] and
//! [`Receiver`] clone shares it, and it is unregistered when the last end is
//! dropped. Disconnection semantics are crossbeam's (all senders gone:
//! receivers drain what is left, then get errors; all receivers gone:
//! sends fail).
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

use super::{CONTENDED, MISS, Probe};
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
    probe: Arc<Probe>,
}

/// The receiving end of a [`Channel`]; clone it for more consumers.
pub struct Receiver<T> {
    inner: crossbeam_channel::Receiver<T>,
    probe: Arc<Probe>,
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
            .field("instance_id", &self.probe.id())
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("instance_id", &self.probe.id())
            .finish_non_exhaustive()
    }
}

impl<T> Channel<T> {
    /// A channel holding up to `capacity` messages (0: rendezvous), named
    /// after its creation site.
    #[track_caller]
    pub fn bounded(capacity: usize) -> Self {
        Self::build(capacity, Probe::register(KIND, None, Location::caller()))
    }

    /// A channel holding up to `capacity` messages, named `name`.
    #[track_caller]
    pub fn named(name: &str, capacity: usize) -> Self {
        Self::build(capacity, Probe::register(KIND, Some(name), Location::caller()))
    }

    /// A channel without an instance (nothing observed).
    pub fn unobserved(capacity: usize) -> Self {
        Self::build(capacity, Probe::NONE)
    }

    fn build(capacity: usize, probe: Probe) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        let probe = Arc::new(probe);
        Self {
            tx: Sender {
                inner: tx,
                probe: Arc::clone(&probe),
            },
            rx: Receiver { inner: rx, probe },
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
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        self.tx.send(msg)
    }

    /// See [`Sender::try_send`].
    #[inline]
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.tx.try_send(msg)
    }

    /// See [`Sender::send_timeout`].
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.tx.send_timeout(msg, timeout)
    }

    /// See [`Receiver::recv`].
    #[inline]
    pub fn recv(&self) -> Result<T, RecvError> {
        self.rx.recv()
    }

    /// See [`Receiver::try_recv`].
    #[inline]
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv()
    }

    /// See [`Receiver::recv_timeout`].
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
        self.tx.probe.id()
    }
}

impl<T> Sender<T> {
    /// Sends `msg`, blocking while the channel is full. Fails (giving the
    /// message back) once every receiver is gone.
    #[inline]
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        match self.inner.try_send(msg) {
            Ok(()) => {
                self.probe.emit(op::SEND, 0, 0);
                Ok(())
            }
            Err(TrySendError::Full(msg)) => self.send_blocking(msg),
            Err(TrySendError::Disconnected(msg)) => {
                self.probe.emit(op::SEND, MISS, 0);
                Err(SendError(msg))
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn send_blocking(&self, msg: T) -> Result<(), SendError<T>> {
        let start = clock::ticks();
        let result = self.inner.send(msg);
        let flags = if result.is_ok() {
            CONTENDED
        } else {
            CONTENDED | MISS
        };
        self.probe.emit(op::SEND, flags, super::since(start));
        result
    }

    /// Sends `msg` if there is room now.
    #[inline]
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let result = self.inner.try_send(msg);
        self.probe
            .emit(op::TRY_SEND, if result.is_ok() { 0 } else { MISS }, 0);
        result
    }

    /// Sends `msg`, waiting at most `timeout` for room.
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.send_deadline(msg, deadline),
            None => self
                .send(msg)
                .map_err(|SendError(m)| SendTimeoutError::Disconnected(m)),
        }
    }

    /// Sends `msg`, waiting until `deadline` at most for room.
    pub fn send_deadline(&self, msg: T, deadline: Instant) -> Result<(), SendTimeoutError<T>> {
        let msg = match self.inner.try_send(msg) {
            Ok(()) => {
                self.probe.emit(op::SEND, 0, 0);
                return Ok(());
            }
            Err(TrySendError::Disconnected(msg)) => {
                self.probe.emit(op::SEND, MISS, 0);
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
        self.probe.emit(op::SEND, flags, super::since(start));
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
        self.probe.id()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            probe: Arc::clone(&self.probe),
        }
    }
}

impl<T> Receiver<T> {
    /// Receives a message, blocking while the channel is empty. Fails once
    /// it is empty and every sender is gone.
    #[inline]
    pub fn recv(&self) -> Result<T, RecvError> {
        match self.inner.try_recv() {
            Ok(msg) => {
                self.probe.emit(op::RECV, 0, 0);
                Ok(msg)
            }
            Err(TryRecvError::Empty) => self.recv_blocking(),
            Err(TryRecvError::Disconnected) => {
                self.probe.emit(op::RECV, MISS, 0);
                Err(RecvError)
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn recv_blocking(&self) -> Result<T, RecvError> {
        let start = clock::ticks();
        let result = self.inner.recv();
        let flags = if result.is_ok() {
            CONTENDED
        } else {
            CONTENDED | MISS
        };
        self.probe.emit(op::RECV, flags, super::since(start));
        result
    }

    /// Receives a message if one is queued.
    #[inline]
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let result = self.inner.try_recv();
        self.probe
            .emit(op::TRY_RECV, if result.is_ok() { 0 } else { MISS }, 0);
        result
    }

    /// Receives a message, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.recv_deadline(deadline),
            None => self.recv().map_err(|RecvError| RecvTimeoutError::Disconnected),
        }
    }

    /// Receives a message, waiting until `deadline` at most.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        match self.inner.try_recv() {
            Ok(msg) => {
                self.probe.emit(op::RECV, 0, 0);
                return Ok(msg);
            }
            Err(TryRecvError::Disconnected) => {
                self.probe.emit(op::RECV, MISS, 0);
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
        self.probe.emit(op::RECV, flags, super::since(start));
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
        self.probe.id()
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            probe: Arc::clone(&self.probe),
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
