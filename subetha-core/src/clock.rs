//! Cheap timestamps ("ticks") and the calibration that turns them into time.
//!
//! # What a tick is
//!
//! A *tick* is one increment of the fastest cheap counter the CPU exposes to
//! user space, read by [`ticks()`]:
//!
//! * **x86_64**: the time-stamp counter (TSC, `rdtsc`). On every CPU this
//!   crate targets it is *invariant* (`constant_tsc`, `nonstop_tsc` in
//!   `/proc/cpuinfo`): it advances at a fixed rate regardless of frequency
//!   scaling or idle states, and the kernel keeps it synchronised across
//!   cores. Typical rates are 1–4 GHz (2.6 GHz on our build VMs).
//! * **aarch64**: the architected virtual counter `cntvct_el0`, typically
//!   1 MHz–1 GHz (ARMv8.6+ mandates 1 GHz).
//! * **anything else**: `CLOCK_MONOTONIC` in nanoseconds, i.e. one tick is one
//!   nanosecond.
//!
//! Observations store raw ticks (`latency_ticks`), never nanoseconds:
//! reading a counter and subtracting is all the hot path does, and the
//! conversion is paid by whoever reads the statistics.
//!
//! # Why the TSC
//!
//! A `rdtsc` costs about 20 ns on our VMs; `clock_gettime` through the vDSO
//! costs about the same *plus* the scaling arithmetic, and degrades to a
//! ~0.5–1 µs system call whenever the kernel's clocksource is not TSC-based
//! (e.g. `hpet`, or some hypervisors). Pushing an observation costs ~2 ns, so
//! a clock read dominates the cost of measuring anything; we read it only
//! where a latency is measured, and we read the cheapest counter there is.
//!
//! # How calibration lines times up across processes
//!
//! Ticks are meaningless without a rate and an origin. [`Calibration`] holds
//! both, in a fixed 32-byte `#[repr(C)]` layout that the segment creator
//! copies verbatim into the shared-memory header:
//!
//! * `ticks_per_sec` turns a tick *duration* into nanoseconds
//!   ([`Calibration::ticks_to_ns`]);
//! * the reference pair (`ref_ticks`, `ref_mono_ns`) — a tick reading and a
//!   `CLOCK_MONOTONIC` reading taken at the same instant — turns a tick
//!   *instant* into a `CLOCK_MONOTONIC` timestamp
//!   ([`Calibration::ticks_to_monotonic_ns`]).
//!
//! `CLOCK_MONOTONIC` is the one clock that every party on the machine shares:
//! other processes (the root agent), and eBPF programs, whose
//! `bpf_ktime_get_ns()` *is* `CLOCK_MONOTONIC`. The TSC is also machine-wide,
//! so a process that maps the segment can convert the producer's ticks without
//! measuring anything itself — but it must treat the header as untrusted:
//! call [`Calibration::validate`] first. Conversions never panic, whatever
//! the values.
//!
//! # Accuracy to expect
//!
//! [`Calibration::measure`] takes ~1.25 ms of busy-waiting: it brackets a
//! `CLOCK_MONOTONIC` read between two tick reads at the start and at the end
//! of a 1.25 ms window, keeping the tightest of 16 brackets at each end to
//! reject VM noise (preemption, steal time, cache misses). Measured on our
//! 2-core KVM VMs (2.6 GHz TSC, TSC clocksource), 200 calibrations against a
//! 1 s measurement: median error 0.5–2.5 ppm, p95 ≤ 3.3 ppm, worst 4.2 ppm;
//! the same with both cores saturated by other processes (wall time then
//! stretches to a few ms when preempted). So:
//!
//! * **durations** (latencies) are accurate to ~5 ppm: 5 ps on a 1 µs wait,
//!   far below the ~20 ns cost of the read itself;
//! * **instants** are exact at the reference point (±~20 ns, half the
//!   bracket) and drift by the rate error times the distance from it: up to
//!   ~5 µs per second, i.e. up to ~18 ms after an
//!   hour. `CLOCK_MONOTONIC` may also be slewed by NTP (≤ 500 ppm) after
//!   calibration. Long-lived consumers that need tight cross-process
//!   alignment should refresh the reference with a new
//!   [`Calibration::measure`] (or a longer [`Calibration::measure_over`]).
//!
//! A process caches its calibration in [`calibration()`]. After `fork()` the
//! child keeps the parent's, which is correct: same machine, same counter.

use std::sync::OnceLock;
use std::time::Duration;

/// [`Calibration::source`] value for the x86 time-stamp counter.
pub const SOURCE_TSC: u32 = 1;
/// [`Calibration::source`] value for the aarch64 virtual counter `cntvct_el0`.
pub const SOURCE_ARM_VIRTUAL_COUNTER: u32 = 2;
/// [`Calibration::source`] value for the `CLOCK_MONOTONIC` fallback (1 tick = 1 ns).
pub const SOURCE_MONOTONIC: u32 = 3;

const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Lowest `ticks_per_sec` that [`Calibration::validate`] accepts (1 MHz).
pub const MIN_TICKS_PER_SEC: u64 = 1_000_000;
/// Highest `ticks_per_sec` that [`Calibration::validate`] accepts (100 GHz).
pub const MAX_TICKS_PER_SEC: u64 = 100_000_000_000;

/// Reads the tick counter: the cheapest monotonic counter this CPU offers.
///
/// See the [module docs](self) for what a tick is on each architecture; the
/// matching [`ClockSource`] is [`ClockSource::NATIVE`]. Convert with
/// [`calibration()`].
///
/// On x86_64 this is a plain `rdtsc`, neither `rdtscp` nor `lfence; rdtsc`.
/// `rdtsc` is not serialising, so the CPU may execute it a few dozen cycles
/// earlier or later than its place in program order. We measure waits of
/// hundreds of nanoseconds or more (lock acquisitions, queue hand-offs), where
/// that skew is noise; fencing would slow every read and stall the very
/// pipeline being observed. The same reasoning applies to skipping the `isb`
/// before `mrs cntvct_el0` on aarch64.
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` has no preconditions; every x86_64 CPU implements
        // it, and Linux does not set CR4.TSD for ordinary processes.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let t: u64;
        // SAFETY: reading `cntvct_el0` only writes the output register and
        // has no side effects; Linux enables EL0 access to the virtual
        // counter (CNTKCTL_EL1.EL0VCTEN) on every aarch64 system.
        unsafe {
            core::arch::asm!("mrs {t}, cntvct_el0", t = out(reg) t,
                options(nomem, nostack, preserves_flags));
        }
        t
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        monotonic_ns()
    }
}

/// Reads `CLOCK_MONOTONIC` in nanoseconds: the clock shared with other
/// processes and with eBPF (`bpf_ktime_get_ns`).
///
/// Costs about as much as [`ticks()`] when the kernel clocksource is
/// TSC-based (vDSO), much more otherwise; don't use it on hot paths.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec`; CLOCK_MONOTONIC is
    // always supported, so the call only writes `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    (ts.tv_sec as u64)
        .wrapping_mul(NANOS_PER_SEC)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Which counter a [`Calibration`] (and [`ticks()`]) describes.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClockSource {
    /// x86 time-stamp counter (`rdtsc`).
    Tsc = SOURCE_TSC,
    /// aarch64 virtual counter (`cntvct_el0`).
    ArmVirtualCounter = SOURCE_ARM_VIRTUAL_COUNTER,
    /// `CLOCK_MONOTONIC` nanoseconds (fallback on other architectures).
    Monotonic = SOURCE_MONOTONIC,
}

impl ClockSource {
    /// The source [`ticks()`] reads in this build.
    pub const NATIVE: ClockSource = if cfg!(target_arch = "x86_64") {
        ClockSource::Tsc
    } else if cfg!(target_arch = "aarch64") {
        ClockSource::ArmVirtualCounter
    } else {
        ClockSource::Monotonic
    };
}

impl TryFrom<u32> for ClockSource {
    type Error = CalibrationError;

    fn try_from(raw: u32) -> Result<Self, Self::Error> {
        match raw {
            SOURCE_TSC => Ok(Self::Tsc),
            SOURCE_ARM_VIRTUAL_COUNTER => Ok(Self::ArmVirtualCounter),
            SOURCE_MONOTONIC => Ok(Self::Monotonic),
            other => Err(CalibrationError::UnknownSource(other)),
        }
    }
}

/// Why a [`Calibration`] was rejected by [`Calibration::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalibrationError {
    /// `source` is not one of the `SOURCE_*` constants.
    #[error("unknown clock source {0}")]
    UnknownSource(u32),
    /// `ticks_per_sec` is zero or outside `MIN_TICKS_PER_SEC..=MAX_TICKS_PER_SEC`.
    #[error("tick rate {0} Hz outside 1 MHz..=100 GHz")]
    FrequencyOutOfRange(u64),
    /// The monotonic source must tick at exactly 1 GHz.
    #[error("monotonic clock source with tick rate {0} Hz (must be 1e9)")]
    MonotonicFrequency(u64),
    /// The monotonic source's reference pair must be the identity.
    #[error("monotonic clock source with reference ticks {ticks} != ns {ns}")]
    MonotonicReference {
        /// `ref_ticks`
        ticks: u64,
        /// `ref_mono_ns`
        ns: u64,
    },
    /// The reserved word must be zero (cheap check against garbage headers).
    #[error("reserved field is {0:#x}, expected 0")]
    ReservedNonZero(u32),
}

/// Tick rate and origin, as stored in the shared-memory segment header.
///
/// Fixed 32-byte `#[repr(C)]` layout without padding (offsets 0, 8, 16, 24,
/// 28), so it can be copied verbatim and read with [`bytemuck`] by another
/// process. A value read from shared memory is untrusted: call
/// [`validate`](Self::validate) before relying on it. The conversion methods
/// never panic regardless, and saturate rather than wrap.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Calibration {
    /// Counter rate in ticks per second (1e9 for the monotonic source).
    pub ticks_per_sec: u64,
    /// Tick reading taken at the same instant as `ref_mono_ns`.
    pub ref_ticks: u64,
    /// `CLOCK_MONOTONIC` nanoseconds at the same instant as `ref_ticks`.
    pub ref_mono_ns: u64,
    /// Raw [`ClockSource`] (one of the `SOURCE_*` constants).
    pub source: u32,
    _reserved: u32,
}

const _: () = assert!(size_of::<Calibration>() == 32 && align_of::<Calibration>() == 8);

/// Default calibration window: with the sampling overhead, [`Calibration::measure`]
/// stays well under its 2 ms budget.
const CALIBRATION_WINDOW: Duration = Duration::from_micros(1250);
/// Bracketed samples taken at each end of the window; the tightest is kept.
const SAMPLES_PER_END: usize = 16;

impl Calibration {
    /// Builds a calibration from its parts (`_reserved` is zeroed).
    pub const fn new(source: ClockSource, ticks_per_sec: u64, ref_ticks: u64, ref_mono_ns: u64) -> Self {
        Self {
            ticks_per_sec,
            ref_ticks,
            ref_mono_ns,
            source: source as u32,
            _reserved: 0,
        }
    }

    /// The identity calibration of the monotonic fallback source, anchored at
    /// `now_ns` (1 tick = 1 ns, ticks == `CLOCK_MONOTONIC` ns).
    pub const fn monotonic(now_ns: u64) -> Self {
        Self::new(ClockSource::Monotonic, NANOS_PER_SEC, now_ns, now_ns)
    }

    /// The decoded `source` field.
    pub fn clock_source(&self) -> Result<ClockSource, CalibrationError> {
        ClockSource::try_from(self.source)
    }

    /// Measures [`ticks()`] against `CLOCK_MONOTONIC` over a 1.25 ms window
    /// (busy-waiting; longer if the thread is preempted): see the [module docs](self) for the
    /// method and its accuracy. Use the cached [`calibration()`] unless you
    /// need a fresh reference pair.
    pub fn measure() -> Self {
        Self::measure_over(CALIBRATION_WINDOW)
    }

    /// Like [`measure`](Self::measure) but over `window` (busy-waits that
    /// long): the rate error shrinks in proportion, ~12 ppm·ms / window.
    pub fn measure_over(window: Duration) -> Self {
        if ClockSource::NATIVE == ClockSource::Monotonic {
            return Self::monotonic(monotonic_ns());
        }
        let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        let mut cal = measure_with(ticks, ClockSource::NATIVE, window_ns);
        for _ in 0..2 {
            if cal.validate().is_ok() {
                return cal;
            }
            cal = measure_with(ticks, ClockSource::NATIVE, window_ns);
        }
        if let Err(e) = cal.validate() {
            tracing::warn!(?cal, error = %e, "tick calibration failed; tick conversions will be wrong");
        }
        cal
    }

    /// Checks that this calibration is plausible: known source, rate within
    /// 1 MHz..=100 GHz, exactly 1 GHz with an identity reference for the
    /// monotonic source, zero reserved word.
    pub fn validate(&self) -> Result<(), CalibrationError> {
        let source = self.clock_source()?;
        if self._reserved != 0 {
            return Err(CalibrationError::ReservedNonZero(self._reserved));
        }
        if !(MIN_TICKS_PER_SEC..=MAX_TICKS_PER_SEC).contains(&self.ticks_per_sec) {
            return Err(CalibrationError::FrequencyOutOfRange(self.ticks_per_sec));
        }
        if source == ClockSource::Monotonic {
            if self.ticks_per_sec != NANOS_PER_SEC {
                return Err(CalibrationError::MonotonicFrequency(self.ticks_per_sec));
            }
            if self.ref_ticks != self.ref_mono_ns {
                return Err(CalibrationError::MonotonicReference {
                    ticks: self.ref_ticks,
                    ns: self.ref_mono_ns,
                });
            }
        }
        Ok(())
    }

    /// Converts a tick *duration* to nanoseconds, rounded to nearest,
    /// saturating at `u64::MAX` (also when `ticks_per_sec` is 0).
    pub fn ticks_to_ns(&self, duration_ticks: u64) -> u64 {
        mul_div(duration_ticks, NANOS_PER_SEC, self.ticks_per_sec)
    }

    /// Converts a nanosecond duration to ticks, rounded to nearest,
    /// saturating at `u64::MAX`.
    pub fn ns_to_ticks(&self, ns: u64) -> u64 {
        mul_div(ns, self.ticks_per_sec, NANOS_PER_SEC)
    }

    /// Converts a tick *instant* (a [`ticks()`] reading) to a
    /// `CLOCK_MONOTONIC` timestamp in ns, comparable with [`monotonic_ns()`]
    /// and `bpf_ktime_get_ns()`. Instants before `ref_ticks` are handled;
    /// the result saturates at 0 and `u64::MAX`.
    pub fn ticks_to_monotonic_ns(&self, instant_ticks: u64) -> u64 {
        if instant_ticks >= self.ref_ticks {
            self.ref_mono_ns
                .saturating_add(self.ticks_to_ns(instant_ticks - self.ref_ticks))
        } else {
            self.ref_mono_ns
                .saturating_sub(self.ticks_to_ns(self.ref_ticks - instant_ticks))
        }
    }

    /// Converts a `CLOCK_MONOTONIC` timestamp to the tick instant
    /// [`ticks()`] read (or would read) at that time; saturates at 0 and
    /// `u64::MAX`.
    pub fn monotonic_ns_to_ticks(&self, mono_ns: u64) -> u64 {
        if mono_ns >= self.ref_mono_ns {
            self.ref_ticks
                .saturating_add(self.ns_to_ticks(mono_ns - self.ref_mono_ns))
        } else {
            self.ref_ticks
                .saturating_sub(self.ns_to_ticks(self.ref_mono_ns - mono_ns))
        }
    }
}

/// The process-wide calibration of [`ticks()`], measured on first use
/// (~1.25 ms, see [`Calibration::measure`]) and cached; later calls cost one
/// atomic load. Call it when creating a segment, not on a hot path.
pub fn calibration() -> &'static Calibration {
    static CAL: OnceLock<Calibration> = OnceLock::new();
    CAL.get_or_init(|| {
        let cal = Calibration::measure();
        tracing::debug!(?cal, "tick calibration");
        cal
    })
}

/// `a * b / c` rounded to nearest, saturating; `u64::MAX` if `c == 0` (and
/// `a * b != 0`). Cannot overflow: `(2^64-1)^2 + 2^63 < 2^128`.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    if c == 0 {
        return if p == 0 { 0 } else { u64::MAX };
    }
    let c = u128::from(c);
    u64::try_from((p + c / 2) / c).unwrap_or(u64::MAX)
}

/// One bracketed sample `(tick midpoint, monotonic ns, bracket width)`: the
/// tightest of `SAMPLES_PER_END` brackets `read(); monotonic_ns(); read()`.
fn bracketed_sample(read: impl Fn() -> u64) -> (u64, u64, u64) {
    let mut best = (0, 0, u64::MAX);
    for _ in 0..SAMPLES_PER_END {
        let t0 = read();
        let m = monotonic_ns();
        let t1 = read();
        let width = t1.wrapping_sub(t0);
        if width < best.2 {
            best = (t0.wrapping_add(width / 2), m, width);
        }
    }
    best
}

/// Measures the rate of `read` against `CLOCK_MONOTONIC` over `window_ns`
/// (busy-waiting); the reference pair is the end sample. May return an
/// invalid calibration (e.g. rate 0) if the counter misbehaves.
fn measure_with(read: impl Fn() -> u64 + Copy, source: ClockSource, window_ns: u64) -> Calibration {
    let (t_start, m_start, _) = bracketed_sample(read);
    let deadline = m_start.saturating_add(window_ns);
    while monotonic_ns() < deadline {
        std::hint::spin_loop();
    }
    let (t_end, m_end, _) = bracketed_sample(read);
    let rate = mul_div(
        t_end.wrapping_sub(t_start),
        NANOS_PER_SEC,
        m_end.saturating_sub(m_start),
    );
    Calibration::new(source, rate, t_end, m_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;
    use std::time::Instant;

    #[test]
    fn layout_is_fixed() {
        assert_eq!(size_of::<Calibration>(), 32);
        assert_eq!(align_of::<Calibration>(), 8);
        assert_eq!(offset_of!(Calibration, ticks_per_sec), 0);
        assert_eq!(offset_of!(Calibration, ref_ticks), 8);
        assert_eq!(offset_of!(Calibration, ref_mono_ns), 16);
        assert_eq!(offset_of!(Calibration, source), 24);
        assert_eq!(offset_of!(Calibration, _reserved), 28);
        let cal = Calibration::new(ClockSource::Tsc, 0x0102_0304_0506_0708, 2, 3);
        let bytes = bytemuck::bytes_of(&cal);
        assert_eq!(&bytes[0..8], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(&bytes[24..32], &[1, 0, 0, 0, 0, 0, 0, 0][..]);
        assert_eq!(*bytemuck::from_bytes::<Calibration>(bytes), cal);
    }

    #[test]
    fn source_roundtrip() {
        for s in [
            ClockSource::Tsc,
            ClockSource::ArmVirtualCounter,
            ClockSource::Monotonic,
        ] {
            assert_eq!(ClockSource::try_from(s as u32), Ok(s));
        }
        assert_eq!(ClockSource::try_from(0), Err(CalibrationError::UnknownSource(0)));
        assert_eq!(ClockSource::try_from(4), Err(CalibrationError::UnknownSource(4)));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(ClockSource::NATIVE, ClockSource::Tsc);
    }

    #[test]
    fn ticks_monotonic_on_one_thread() {
        let mut prev = ticks();
        let first = prev;
        for _ in 0..1_000_000 {
            let t = ticks();
            assert!(t >= prev, "ticks went backwards: {prev} -> {t}");
            prev = t;
        }
        assert!(prev > first, "ticks did not advance over 1e6 reads");
    }

    #[test]
    fn calibration_is_valid_cached_and_quick() {
        let cal = calibration();
        assert_eq!(cal.validate(), Ok(()));
        assert_eq!(cal.clock_source(), Ok(ClockSource::NATIVE));
        assert!(std::ptr::eq(cal, calibration()));
        // Best of a few: the tests share 2 cores, so one run may be preempted.
        let best = (0..5)
            .map(|_| {
                let start = Instant::now();
                let c = Calibration::measure();
                let took = start.elapsed();
                assert_eq!(c.validate(), Ok(()));
                took
            })
            .min()
            .unwrap();
        assert!(best <= Duration::from_millis(2), "measure() took {best:?}");
    }

    #[test]
    fn calibration_matches_long_measurement() {
        // Spec: within 2%; real error is a few ppm, so hold it to 0.1%.
        let long = measure_with(ticks, ClockSource::NATIVE, 200_000_000);
        let short = Calibration::measure();
        let err = short.ticks_per_sec.abs_diff(long.ticks_per_sec) as f64 / long.ticks_per_sec as f64;
        assert!(
            err < 1e-3,
            "measure() = {} Hz vs 200 ms measurement {} Hz ({:.1} ppm)",
            short.ticks_per_sec,
            long.ticks_per_sec,
            err * 1e6
        );
    }

    #[test]
    fn measure_with_monotonic_reader_finds_1ghz() {
        let cal = measure_with(monotonic_ns, ClockSource::Monotonic, 1_000_000);
        let err = cal.ticks_per_sec.abs_diff(NANOS_PER_SEC);
        assert!(
            err < NANOS_PER_SEC / 1000,
            "monotonic measured at {} Hz",
            cal.ticks_per_sec
        );
        let ident = Calibration::monotonic(12_345);
        assert_eq!(ident.validate(), Ok(()));
        assert_eq!(ident.ticks_to_monotonic_ns(99), 99);
        assert_eq!(ident.monotonic_ns_to_ticks(99), 99);
        assert_eq!(ident.ticks_to_ns(777), 777);
    }

    #[test]
    fn duration_roundtrip() {
        let cal = Calibration::new(ClockSource::Tsc, 2_599_998_000, 0, 0);
        for x in [0, 1, 7, 1_000, 123_456_789, 3_600 * NANOS_PER_SEC, u64::MAX / 4] {
            let back = cal.ticks_to_ns(cal.ns_to_ticks(x));
            assert!(back.abs_diff(x) <= 1, "{x} -> {back}");
        }
        assert_eq!(cal.ticks_to_ns(2_599_998_000), NANOS_PER_SEC);
        assert_eq!(cal.ns_to_ticks(NANOS_PER_SEC), 2_599_998_000);
        assert_eq!(cal.ticks_to_ns(u64::MAX), 7_094_907_024_432_154_031); // 2^64 / 2.599998
        assert_eq!(cal.ns_to_ticks(u64::MAX), u64::MAX); // saturates
        let slow = Calibration::new(ClockSource::ArmVirtualCounter, 24_000_000, 0, 0);
        assert_eq!(slow.ticks_to_ns(24), 1_000);
        assert_eq!(slow.ticks_to_ns(1), 42); // 41.67 rounds to 42
        assert_eq!(slow.ns_to_ticks(1_000), 24);
        assert_eq!(slow.ticks_to_ns(u64::MAX), u64::MAX); // saturates
        let live = calibration();
        let x = 5_000_000_123;
        assert!(live.ticks_to_ns(live.ns_to_ticks(x)).abs_diff(x) <= 1);
    }

    #[test]
    fn instant_conversion_lines_up_with_monotonic() {
        let cal = calibration();
        // Best of a few brackets, so one preemption cannot fail the test.
        let best = (0..10)
            .map(|_| {
                let m0 = monotonic_ns();
                let t = ticks();
                let m1 = monotonic_ns();
                cal.ticks_to_monotonic_ns(t).abs_diff(m0 / 2 + m1 / 2)
            })
            .min()
            .unwrap();
        assert!(best < 200_000, "tick instant off CLOCK_MONOTONIC by {best} ns");
        let now = monotonic_ns();
        let back = cal.monotonic_ns_to_ticks(now);
        assert!(cal.ticks_to_monotonic_ns(back).abs_diff(now) <= 1);
    }

    #[test]
    fn instant_conversion_before_and_after_reference() {
        let cal = Calibration::new(ClockSource::Tsc, 2_000_000_000, 10_000, 1_000_000);
        assert_eq!(cal.ticks_to_monotonic_ns(10_000), 1_000_000);
        assert_eq!(cal.ticks_to_monotonic_ns(12_000), 1_001_000);
        assert_eq!(cal.ticks_to_monotonic_ns(8_000), 999_000);
        assert_eq!(cal.ticks_to_monotonic_ns(0), 995_000);
        assert_eq!(cal.monotonic_ns_to_ticks(999_000), 8_000);
        assert_eq!(cal.monotonic_ns_to_ticks(1_001_000), 12_000);
        // Far before the reference saturates at 0 rather than wrapping.
        let late = Calibration::new(ClockSource::Tsc, 1_000_000, u64::MAX, 5_000_000);
        assert_eq!(late.ticks_to_monotonic_ns(0), 0);
        assert_eq!(late.monotonic_ns_to_ticks(0), u64::MAX - 5_000);
        assert_eq!(late.monotonic_ns_to_ticks(u64::MAX), u64::MAX);
    }

    #[test]
    fn hostile_calibrations_never_panic_and_are_rejected() {
        let mut max: Calibration = bytemuck::cast([u64::MAX; 4]);
        let zero_hz = Calibration::new(ClockSource::Tsc, 0, 5, 5);
        let cases = [max, zero_hz, bytemuck::Zeroable::zeroed()];
        for cal in cases {
            assert!(cal.validate().is_err(), "{cal:?} accepted");
            for x in [0, 1, 5, 1 << 40, u64::MAX - 1, u64::MAX] {
                let _ = (cal.ticks_to_ns(x), cal.ns_to_ticks(x));
                let _ = (cal.ticks_to_monotonic_ns(x), cal.monotonic_ns_to_ticks(x));
            }
        }
        assert_eq!(max.validate(), Err(CalibrationError::UnknownSource(u32::MAX)));
        max.source = SOURCE_TSC;
        assert_eq!(max.validate(), Err(CalibrationError::ReservedNonZero(u32::MAX)));
        assert_eq!(max.ticks_to_ns(u64::MAX), 1_000_000_000);
        assert_eq!(max.ns_to_ticks(u64::MAX), u64::MAX);
        assert_eq!(zero_hz.validate(), Err(CalibrationError::FrequencyOutOfRange(0)));
        assert_eq!(zero_hz.ticks_to_ns(1), u64::MAX);
        assert_eq!(zero_hz.ticks_to_ns(0), 0);
        assert_eq!(zero_hz.ns_to_ticks(u64::MAX), 0);
        assert_eq!(zero_hz.ticks_to_monotonic_ns(0), 0);
        assert_eq!(zero_hz.ticks_to_monotonic_ns(6), u64::MAX);
        let checks = [
            (
                Calibration::new(ClockSource::Tsc, 999_999, 0, 0),
                CalibrationError::FrequencyOutOfRange(999_999),
            ),
            (
                Calibration::new(ClockSource::Tsc, MAX_TICKS_PER_SEC + 1, 0, 0),
                CalibrationError::FrequencyOutOfRange(MAX_TICKS_PER_SEC + 1),
            ),
            (
                Calibration::new(ClockSource::Monotonic, 2_600_000_000, 0, 0),
                CalibrationError::MonotonicFrequency(2_600_000_000),
            ),
            (
                Calibration::new(ClockSource::Monotonic, NANOS_PER_SEC, 1, 2),
                CalibrationError::MonotonicReference { ticks: 1, ns: 2 },
            ),
        ];
        for (cal, err) in checks {
            assert_eq!(cal.validate(), Err(err));
        }
        assert_eq!(
            Calibration::new(ClockSource::Tsc, MIN_TICKS_PER_SEC, 0, 0).validate(),
            Ok(())
        );
        assert_eq!(
            Calibration::new(ClockSource::Tsc, MAX_TICKS_PER_SEC, 0, 0).validate(),
            Ok(())
        );
    }

    /// Self-check of the hot-path cost: a tick read must stay a plain
    /// counter read (tens of ns), not a system call.
    #[test]
    fn ticks_is_cheap() {
        let best = (0..20)
            .map(|_| {
                let start = Instant::now();
                let mut acc = 0u64;
                for _ in 0..1_000 {
                    acc = acc.wrapping_add(std::hint::black_box(ticks()));
                }
                std::hint::black_box(acc);
                start.elapsed() / 1_000
            })
            .min()
            .unwrap();
        assert!(best < Duration::from_nanos(200), "ticks() costs {best:?}");
    }
}
