//! Waiting for keys without spinning on a terminal that went away.
//!
//! crossterm's reader loops on `read(2)` until it gets a key or
//! `EWOULDBLOCK`; on a hung-up terminal (ssh drop, tmux window killed) or at
//! end of input `read` answers 0 or `EIO` at once, forever, and the loop
//! never returns: the process spins on a CPU and never looks at its signal
//! flag again. So `top` asks `poll(2)` first and hands the descriptor to
//! crossterm only when bytes are really waiting ([`Input::Ready`]); a
//! hang-up, an error or end of input is [`Input::Gone`], and the UI quits.
//! Tested by `tests/tests/agent_top.rs` (killing the tmux window, closing
//! the pane's input).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// What [`TtyInput::wait`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Bytes are waiting: crossterm can read them without blocking.
    Ready,
    /// Nothing within the timeout (or a signal arrived).
    Idle,
    /// The terminal hung up, failed, or reached end of input: nothing will
    /// ever be typed again.
    Gone,
}

/// The descriptor crossterm reads keys from: stdin when it is a terminal,
/// else `/dev/tty` (crossterm makes the same choice).
pub struct TtyInput {
    fd: RawFd,
    /// Keeps `/dev/tty` open when that is the descriptor.
    _tty: Option<File>,
}

impl TtyInput {
    /// Stdin if it is a terminal, else the controlling terminal.
    pub fn open() -> io::Result<Self> {
        if io::IsTerminal::is_terminal(&io::stdin()) {
            return Ok(Self {
                fd: libc::STDIN_FILENO,
                _tty: None,
            });
        }
        let tty = File::open("/dev/tty")?;
        Ok(Self {
            fd: tty.as_raw_fd(),
            _tty: Some(tty),
        })
    }

    /// Waits up to `timeout` for input.
    pub fn wait(&self, timeout: Duration) -> io::Result<Input> {
        wait_fd(self.fd, timeout)
    }
}

/// [`TtyInput::wait`] on any descriptor.
pub fn wait_fd(fd: RawFd, timeout: Duration) -> io::Result<Input> {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one pollfd that lives on this stack frame for the call.
    let ready = unsafe { libc::poll(&mut poll, 1, millis) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::Interrupted {
            Ok(Input::Idle)
        } else {
            Err(error)
        };
    }
    if ready == 0 {
        return Ok(Input::Idle);
    }
    if poll.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return Ok(Input::Gone);
    }
    if poll.revents & libc::POLLIN == 0 {
        return Ok(Input::Idle);
    }
    // Readable with nothing to read is end of input.
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int into `waiting`, which outlives the
    // call.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut waiting) };
    if rc < 0 || waiting <= 0 {
        return Ok(Input::Gone);
    }
    Ok(Input::Ready)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::{FromRawFd, OwnedFd};

    use super::*;

    fn pipe() -> (File, File) {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both are fresh descriptors nobody else owns.
        unsafe {
            (
                File::from(OwnedFd::from_raw_fd(fds[0])),
                File::from(OwnedFd::from_raw_fd(fds[1])),
            )
        }
    }

    #[test]
    fn idle_ready_and_gone() {
        let (read, mut write) = pipe();
        let fd = read.as_raw_fd();
        assert_eq!(wait_fd(fd, Duration::from_millis(10)).unwrap(), Input::Idle);
        write.write_all(b"q").unwrap();
        assert_eq!(wait_fd(fd, Duration::from_millis(10)).unwrap(), Input::Ready);
        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut &read, &mut byte).unwrap();
        assert_eq!(wait_fd(fd, Duration::from_millis(10)).unwrap(), Input::Idle);
        // The other side hung up: gone, even with a key still unread
        // (nobody is there to see what it would do).
        write.write_all(b"q").unwrap();
        drop(write);
        assert_eq!(wait_fd(fd, Duration::from_millis(10)).unwrap(), Input::Gone);
    }

    #[test]
    fn a_terminal_whose_other_side_closed_is_gone() {
        // SAFETY: posix_openpt returns a fresh descriptor or -1.
        let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
        assert!(master >= 0);
        // SAFETY: fresh descriptor, owned from here.
        let master = unsafe { OwnedFd::from_raw_fd(master) };
        // SAFETY: grantpt/unlockpt/ptsname on the master we own; ptsname's
        // buffer is copied before any other call.
        let name = unsafe {
            assert_eq!(libc::grantpt(master.as_raw_fd()), 0);
            assert_eq!(libc::unlockpt(master.as_raw_fd()), 0);
            std::ffi::CStr::from_ptr(libc::ptsname(master.as_raw_fd()))
                .to_string_lossy()
                .into_owned()
        };
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&name)
            .unwrap();
        assert_eq!(
            wait_fd(slave.as_raw_fd(), Duration::from_millis(10)).unwrap(),
            Input::Idle
        );
        drop(master);
        assert_eq!(
            wait_fd(slave.as_raw_fd(), Duration::from_millis(10)).unwrap(),
            Input::Gone
        );
    }
}
