//! The scan thread's scheduler counters, sampled cheaply: the I/O half of
//! storm diagnosis when the sched probes do not run ([`crate::diagnosis`]
//! stays pure and reads the samples this takes).
//!
//! One `pread` of `/proc/thread-self/schedstat` through a descriptor kept
//! open and one `getrusage(RUSAGE_THREAD)` per sample: cheap enough for the
//! scan thread every 10 ms.

use crate::diagnosis::SchedSample;

/// Samples the *calling* thread's scheduler counters cheaply: the run delay
/// from `/proc/thread-self/schedstat` through a descriptor kept open (one
/// `pread` per sample) and the involuntary switches from
/// `getrusage(RUSAGE_THREAD)`.
#[derive(Debug)]
pub struct SchedSampler {
    schedstat: std::fs::File,
}

impl SchedSampler {
    /// Opens the calling thread's schedstat; samples must then be taken on
    /// this same thread.
    pub fn for_current_thread() -> Option<Self> {
        Some(Self {
            schedstat: std::fs::File::open("/proc/thread-self/schedstat").ok()?,
        })
    }

    /// One sample stamped `now_ns`.
    pub fn sample(&self, now_ns: u64) -> Option<SchedSample> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let n = self.schedstat.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let run_delay_ns = text.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: getrusage fills the zeroed struct we pass.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_THREAD reports the calling thread.
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
            return None;
        }
        Some(SchedSample {
            at_ns: now_ns,
            run_delay_ns,
            involuntary_switches: usage.ru_nivcsw as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_own_scheduler_counters() {
        let sampler = SchedSampler::for_current_thread().expect("schedstat readable");
        let first = sampler.sample(1).expect("sample");
        // Burn a little CPU and yield so the counters can move.
        for _ in 0..100 {
            std::thread::yield_now();
        }
        let second = sampler.sample(2).expect("sample");
        assert_eq!((first.at_ns, second.at_ns), (1, 2));
        assert!(second.run_delay_ns >= first.run_delay_ns);
        assert!(second.involuntary_switches >= first.involuntary_switches);
    }
}
