//! Running checks in a real `fork()`ed child.

use std::io::Read;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use crate::TIMEOUT;

/// Forks. The child runs `check` (panics caught), writes `OK <report>` or
/// `FAIL <panic message>` into a pipe and leaves with `_exit(0)` or
/// `_exit(1)`, never returning into the caller or the test harness. The
/// parent waits for it (bounded, then kills it) and returns
/// the report, panicking if the child failed. The wait is three times
/// [`TIMEOUT`], so a child (or grandchild) whose own polling timed out
/// reports that failure before the parent gives up on it.
///
/// Whatever `check` captures by move belongs to the child: in the parent
/// those values are forgotten, never dropped (an `Instance` moved in stays
/// registered in the parent).
pub fn in_forked_child(check: impl FnOnce() -> String) -> String {
    let check = ManuallyDrop::new(check);
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just opened and are owned by us alone.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fork has no memory-safety preconditions; the child runs only
    // `check` and leaves through _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        drop(read_end);
        let check = ManuallyDrop::into_inner(check);
        let (code, message) = match catch_unwind(AssertUnwindSafe(check)) {
            Ok(report) => (0, format!("OK {report}")),
            Err(panic) => {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "non-string panic".into());
                (1, format!("FAIL {text}"))
            }
        };
        // SAFETY: writing a buffer we own to a descriptor we own, then
        // leaving without running atexit handlers or returning into the
        // harness of the process we were forked from.
        unsafe {
            libc::write(write_end.as_raw_fd(), message.as_ptr().cast(), message.len());
            libc::_exit(code);
        }
    }
    drop(write_end);
    let limit = 3 * TIMEOUT;
    let deadline = Instant::now() + limit;
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(rc >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if rc == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: killing our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("forked child {pid} hung for {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut report = String::new();
    std::fs::File::from(read_end)
        .read_to_string(&mut report)
        .expect("read the child's report");
    let how = if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit status {}", libc::WEXITSTATUS(status))
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 && report.starts_with("OK "),
        "forked child {pid} failed ({how}): {report}"
    );
    report["OK ".len()..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_report_reaches_the_parent() {
        let pid = std::process::id();
        let report = in_forked_child(|| format!("{} {}", std::process::id() != pid, 6 * 7));
        assert_eq!(report, "true 42");
    }

    #[test]
    fn failing_child_fails_the_parent() {
        let outcome = catch_unwind(|| in_forked_child(|| panic!("boom {}", 7)));
        let message = outcome.expect_err("the parent must fail");
        let text = message.downcast_ref::<String>().unwrap();
        assert!(text.contains("FAIL boom 7"), "{text}");
    }
}
