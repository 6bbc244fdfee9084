//! Telling a running agent about a new segment, so it attaches at once
//! instead of at its next `/proc` scan.
//!
//! When the process segment is created, [`announce`] connects to the
//! agent's registration socket and passes the memfd with `SCM_RIGHTS`. It is
//! best effort: no agent, a refused connection or a full socket buffer just
//! leaves discovery to the agent's `/proc` scan. It never blocks and never
//! fails the application.
//!
//! Socket paths, tried in order: `$SUBETHA_AGENT_SOCKET` if set; otherwise
//! the per-user path ([`user_socket_path`]) and then the system agent's
//! `/run/subetha/agent.sock`.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// The system (root) agent's socket.
pub const SYSTEM_SOCKET: &str = "/run/subetha/agent.sock";

/// First bytes of every announcement.
pub const MESSAGE_PREFIX: &[u8] = b"subetha-segment v1";

/// The per-user agent socket: `$XDG_RUNTIME_DIR/subetha/agent.sock`, or
/// `/tmp/subetha-<uid>/agent.sock` without a runtime dir. Root's is
/// [`SYSTEM_SOCKET`].
pub fn user_socket_path() -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("subetha/agent.sock"),
        _ => PathBuf::from(format!("/tmp/subetha-{uid}/agent.sock")),
    }
}

/// The socket paths an application tries, in order.
pub fn socket_paths() -> Vec<PathBuf> {
    if let Some(path) = std::env::var_os("SUBETHA_AGENT_SOCKET") {
        return vec![PathBuf::from(path)];
    }
    let user = user_socket_path();
    let mut paths = vec![user.clone()];
    if user != std::path::Path::new(SYSTEM_SOCKET) {
        paths.push(PathBuf::from(SYSTEM_SOCKET));
    }
    paths
}

/// Passes `fd` to every listening agent found. Returns how many took it.
pub fn announce(fd: BorrowedFd<'_>) -> usize {
    socket_paths()
        .iter()
        .filter(|path| path.exists())
        .filter(|path| send_to(path, fd).is_ok())
        .count()
}

fn send_to(path: &std::path::Path, fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let stream = UnixStream::connect(path)?;
    stream.set_nonblocking(true)?;
    send_fd(&stream, fd, MESSAGE_PREFIX)
}

/// Sends `payload` with `fd` attached (`SCM_RIGHTS`).
pub fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>, payload: &[u8]) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // Space for one cmsghdr carrying one int, suitably aligned.
    let mut control = [0u64; 4];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
    assert!(space <= size_of_val(&control));
    // SAFETY: a zeroed msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `control`, large enough for one header
    // with one int (asserted above), so CMSG_FIRSTHDR is non-null and the
    // header and its data lie inside `control`.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as _;
        libc::CMSG_DATA(header)
            .cast::<libc::c_int>()
            .write_unaligned(fd.as_raw_fd());
    }
    // SAFETY: `msg` describes valid buffers that outlive the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One message received with [`recv_fds`].
#[derive(Debug)]
pub struct Received {
    /// Payload bytes written into the caller's buffer.
    pub len: usize,
    /// Every descriptor that came with it (owned: dropped ones are closed).
    pub fds: Vec<std::os::fd::OwnedFd>,
    /// The payload or the descriptors did not fit (`MSG_TRUNC`/`MSG_CTRUNC`).
    pub truncated: bool,
}

/// Receives one message and any descriptors attached to it (`SCM_RIGHTS`,
/// up to 8), close-on-exec. The peer is untrusted: every descriptor is taken
/// into ownership so none leaks, whatever the caller keeps.
pub fn recv_fds(stream: &UnixStream, buf: &mut [u8]) -> std::io::Result<Received> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control) as _;
    // SAFETY: `msg` points at buffers that outlive the call. MSG_CMSG_CLOEXEC
    // keeps received descriptors from leaking into children.
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: iterating the control headers the kernel wrote into
    // `control`, within msg_controllen; each SCM_RIGHTS payload is an array
    // of ints whose count follows from cmsg_len.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<libc::c_int>();
                let bytes = ((*header).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..bytes / size_of::<libc::c_int>() {
                    let fd = data.add(i).read_unaligned();
                    if fd >= 0 {
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    Ok(Received {
        len: n as usize,
        fds,
        truncated: msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_override_wins() {
        // Read-only check of the default order (the env var is not set in
        // tests).
        if std::env::var_os("SUBETHA_AGENT_SOCKET").is_none() {
            let paths = socket_paths();
            assert_eq!(paths[0], user_socket_path());
            assert_eq!(paths.last().unwrap(), std::path::Path::new(SYSTEM_SOCKET));
        }
    }

    #[test]
    fn passes_a_descriptor() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        send_fd(&a, std::os::fd::AsFd::as_fd(&file), MESSAGE_PREFIX).unwrap();
        let mut buf = [0u8; 64];
        let got = recv_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..got.len], MESSAGE_PREFIX);
        assert!(!got.truncated);
        assert_eq!(got.fds.len(), 1);
        let received = got.fds[0].as_raw_fd();
        let link = std::fs::read_link(format!("/proc/self/fd/{received}")).unwrap();
        assert!(link.to_string_lossy().ends_with("/stat"), "{link:?}");
    }
}
