//! The registration socket: applications pass their new segment's memfd
//! here (see `subetha_core::announce`) so the agent attaches at once; the
//! `/proc` scan remains the fallback.
//!
//! A listener thread accepts connections, reads one message with the
//! descriptor attached (`SCM_RIGHTS`) and the sender's kernel-verified
//! credentials (`SO_PEERCRED`), and hands `(pid, file)` to the scan thread,
//! which validates it exactly like a segment found in `/proc`. Everything a
//! peer sends is untrusted: unknown messages, missing or extra descriptors
//! are dropped (extra descriptors closed), and each connection is read with
//! a short timeout so a silent peer cannot stall the listener.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

use subetha_core::announce::{MESSAGE_PREFIX, Received, SYSTEM_SOCKET, recv_fds};

/// A segment an application announced.
#[derive(Debug)]
pub struct Registered {
    /// The sender's pid (from `SO_PEERCRED`, not from the message).
    pub pid: u32,
    /// The memfd.
    pub file: File,
}

/// The listening socket; removes its path when dropped.
pub struct Registration {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Registration {
    /// Binds `path` and starts the listener thread. Fails if another agent
    /// already answers on it.
    pub fn start(path: &Path, sink: Sender<Registered>) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
            let mode = if path == Path::new(SYSTEM_SOCKET) {
                0o755
            } else {
                0o700
            };
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode));
        }
        if path.exists() {
            if let Ok(stream) = UnixStream::connect(path) {
                let who = match peer_pid(&stream) {
                    Ok(pid) => format!("another agent (pid {pid})"),
                    Err(_) => "another agent".to_string(),
                };
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{who} is listening on {}", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        // The system socket accepts any user's segment (each is validated);
        // a per-user socket only its owner's.
        let mode = if path == Path::new(SYSTEM_SOCKET) {
            0o666
        } else {
            0o600
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("subetha-register".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || listen(&listener, &sink, &stop)
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn listen(listener: &UnixListener, sink: &Sender<Registered>, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => match receive(&stream) {
                Ok(Some(registered)) => {
                    if sink.send(registered).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(error) => tracing::debug!(%error, "ignoring a registration"),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Sleep in the kernel until a peer connects (or 250 ms pass,
                // to notice `stop`): no busy polling.
                let mut fd = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut fd, 1, 250) };
            }
            Err(error) => {
                if let Some(permit) = crate::logging::throttle("registration socket accept failed", ()) {
                    tracing::warn!(%error, "registration socket accept failed{permit}");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Reads one announcement. `Ok(None)` for a message that is not one.
fn receive(stream: &UnixStream) -> io::Result<Option<Registered>> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let pid = peer_pid(stream)?;
    let mut buf = [0u8; 64];
    let Received {
        len,
        mut fds,
        truncated,
    } = recv_fds(stream, &mut buf)?;
    if truncated || !buf[..len].starts_with(MESSAGE_PREFIX) || fds.len() != 1 {
        return Ok(None); // dropping `fds` closes whatever came
    }
    Ok(Some(Registered {
        pid,
        file: File::from(fds.remove(0)),
    }))
}

fn peer_pid(stream: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(cred.pid).map_err(|_| io::Error::other("peer has no pid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receives_an_announced_descriptor_with_the_senders_pid() {
        let dir = std::env::temp_dir().join(format!("subetha-reg-test-{}", std::process::id()));
        let path = dir.join("agent.sock");
        let (tx, rx) = std::sync::mpsc::channel();
        let registration = Registration::start(&path, tx).unwrap();
        let file = File::open("/proc/self/stat").unwrap();
        let stream = UnixStream::connect(registration.path()).unwrap();
        subetha_core::announce::send_fd(&stream, std::os::fd::AsFd::as_fd(&file), MESSAGE_PREFIX).unwrap();
        let got = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(got.pid, std::process::id());
        // A second agent on the same path is refused.
        let (tx2, _rx2) = std::sync::mpsc::channel();
        let busy = Registration::start(&path, tx2).err().expect("refused");
        assert_eq!(busy.kind(), io::ErrorKind::AddrInUse);
        // It names the listener (here: this process).
        let named = format!("another agent (pid {}) is listening on", std::process::id());
        assert!(busy.to_string().contains(&named), "{busy}");
        // Garbage without a descriptor is ignored, and the listener survives.
        let mut junk = UnixStream::connect(registration.path()).unwrap();
        io::Write::write_all(&mut junk, b"hello").unwrap();
        drop(junk);
        let stream = UnixStream::connect(registration.path()).unwrap();
        subetha_core::announce::send_fd(&stream, std::os::fd::AsFd::as_fd(&file), MESSAGE_PREFIX).unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(5)).is_ok());
        drop(registration);
        assert!(!path.exists());
        let _ = std::fs::remove_dir(&dir);
    }
}
