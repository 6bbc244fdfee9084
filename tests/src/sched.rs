//! CPU affinity and scheduling class for tests that stage scheduler events
//! (a SCHED_FIFO hog on the scanner's CPU): shared by the storm-cause and
//! storm-picture tests.

/// The CPUs this thread may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is valid for writes of its own size.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, within the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
pub fn pin_to(cpu: usize) {
    assert!(cpu < libc::CPU_SETSIZE as usize);
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (asserted).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set is valid for reads of its own size; 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
}

/// Makes the calling thread SCHED_FIFO at `priority`.
pub fn set_fifo(priority: i32) -> Result<(), String> {
    set_thread_fifo(0, priority)
}

/// Makes thread `tid` (0: the calling thread) SCHED_FIFO at `priority`.
pub fn set_thread_fifo(tid: u32, priority: i32) -> Result<(), String> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is valid for the call; a tid that does not exist is
    // an ESRCH error, not undefined behaviour.
    let rc = unsafe { libc::sched_setscheduler(tid as libc::pid_t, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "sched_setscheduler({tid}): {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// The threads of process `pid` named `name` (their `comm`).
pub fn threads_named(pid: u32, name: &str) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| {
            let task = task.ok()?;
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            (comm.trim_end() == name).then(|| task.file_name().to_str()?.parse().ok())?
        })
        .collect()
}

/// Pins the calling thread to one CPU and restores its affinity on drop.
pub struct AffinityGuard(libc::cpu_set_t);

impl AffinityGuard {
    pub fn pin_current(cpu: usize) -> Self {
        // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
        let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set is valid for writes of its own size.
        let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut old) };
        assert_eq!(rc, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
        pin_to(cpu);
        Self(old)
    }
}

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        // SAFETY: the set is valid for reads of its own size; 0 is this thread.
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &self.0) };
    }
}

/// The hog's thread id and the window it held the CPU (CLOCK_MONOTONIC ns).
#[derive(Clone, Copy, Debug)]
pub struct HogRun {
    /// The hog thread's id.
    pub tid: u32,
    /// When it started spinning.
    pub begin_ns: u64,
    /// When it stopped.
    pub end_ns: u64,
}

/// Runs a `SCHED_FIFO` (priority 50) busy loop named `subetha-hog` on
/// `cpu` for `window_ns` and waits for it to finish. The caller must not be
/// on `cpu`. Bounded by time; the kernel's RT throttling bounds it too.
pub fn run_hog(cpu: usize, window_ns: u64) -> HogRun {
    let (tx, rx) = std::sync::mpsc::channel();
    let hog = std::thread::Builder::new()
        .name("subetha-hog".into())
        .spawn(move || {
            // Real-time first, then onto the CPU: it takes the CPU from
            // whatever CFS task (the scanner) runs there at once.
            let fifo = set_fifo(50);
            pin_to(cpu);
            let begin_ns = subetha_core::clock::monotonic_ns();
            if fifo.is_ok() {
                while subetha_core::clock::monotonic_ns() - begin_ns < window_ns {
                    std::hint::spin_loop();
                }
            }
            let end_ns = subetha_core::clock::monotonic_ns();
            tx.send(fifo.map(|()| HogRun {
                tid: crate::gettid(),
                begin_ns,
                end_ns,
            }))
            .unwrap();
        })
        .expect("spawn the hog");
    hog.join().expect("the hog thread");
    rx.recv()
        .unwrap()
        .unwrap_or_else(|e| panic!("SCHED_FIFO for the hog: {e}"))
}
