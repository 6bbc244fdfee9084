use super::*;
use super::{histogram::*, instance::*, op::*, threads::*, window::*};
use crate::observation::Observation;

/// xorshift64* PRNG.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

const QS: [f64; 16] = [
    0.0, 0.0001, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 0.99999, 1.0,
];

fn exact_quantile(sorted: &[u64], q: f64) -> u64 {
    let n = sorted.len() as u64;
    let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
    sorted[rank as usize - 1]
}

/// Checks every quantile of `QS` against the exact one; returns the
/// largest relative error seen for in-range values.
fn check_against_exact(name: &str, values: &[u64]) -> f64 {
    let mut h = LatencyHistogram::new();
    for &v in values {
        h.record(v);
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    assert_eq!(h.count(), values.len() as u64);
    assert_eq!(h.min(), sorted[0], "{name}: min");
    assert_eq!(h.max(), *sorted.last().unwrap(), "{name}: max");
    let exact_sum = values.iter().fold(0u64, |a, &v| a.saturating_add(v));
    assert_eq!(h.sum(), exact_sum, "{name}: sum");
    let mut worst = 0.0f64;
    for q in QS {
        let exact = exact_quantile(&sorted, q);
        let got = h.value_at_quantile(q);
        if exact <= LatencyHistogram::HIGHEST_TRACKABLE {
            if exact < 32 {
                assert_eq!(got, exact, "{name}: small value at q={q}");
            }
            let err = got.abs_diff(exact) as f64 / exact.max(1) as f64;
            worst = worst.max(err);
            assert!(
                err < LatencyHistogram::MAX_RELATIVE_ERROR,
                "{name}: q={q} exact={exact} got={got} err={err}"
            );
        } else {
            // Clamped into the top bucket: reported within it, or as max.
            let (top_low, _) = LatencyHistogram::bucket_bounds(LatencyHistogram::BUCKETS - 1);
            assert!(got >= top_low && got <= h.max(), "{name}: q={q} got={got}");
        }
    }
    let q = h.quantiles();
    assert_eq!(q.max, h.max());
    assert_eq!(q.p50, h.value_at_quantile(0.5));
    assert_eq!(q.p999, h.value_at_quantile(0.999));
    eprintln!("{name}: worst relative error {:.4}%", worst * 100.0);
    worst
}

fn distributions() -> Vec<(&'static str, Vec<u64>)> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let n = 200_000;
    let mut d = Vec::new();
    d.push(("uniform small", (0..n).map(|_| rng.below(100)).collect()));
    d.push(("uniform 10k", (0..n).map(|_| rng.below(10_000)).collect()));
    d.push(("uniform to 2^40", (0..n).map(|_| rng.below(1 << 40)).collect()));
    d.push((
        "exponential mean 5000",
        (0..n).map(|_| (-rng.unit().ln() * 5000.0) as u64).collect(),
    ));
    d.push((
        "pareto alpha 1.1",
        (0..n)
            .map(|_| (100.0 / rng.unit().powf(1.0 / 1.1)) as u64)
            .collect(),
    ));
    d.push((
        "log-uniform 1..2^39",
        (0..n).map(|_| 2f64.powf(rng.unit() * 39.0) as u64).collect(),
    ));
    d.push((
        "near 2^40",
        (0..n).map(|_| (1u64 << 40) - 1 - rng.below(1 << 36)).collect(),
    ));
    d.push((
        "log-uniform to 2^46 (clamped tail)",
        (0..n).map(|_| 2f64.powf(rng.unit() * 46.0) as u64).collect(),
    ));
    d.push(("u64::MAX mixed", {
        let mut v: Vec<u64> = (0..n).map(|_| rng.below(1000) + 1).collect();
        v.push(u64::MAX);
        v.push(1 << 50);
        v
    }));
    d
}

#[test]
fn size_is_small() {
    assert_eq!(LatencyHistogram::BUCKETS, 592);
    assert_eq!(size_of::<LatencyHistogram>(), 592 * 8 + 32);
    assert!(size_of::<LatencyHistogram>() <= 8 * 1024);
    assert!(
        size_of::<InstanceStats>() <= 1024,
        "{}",
        size_of::<InstanceStats>()
    );
    eprintln!(
        "LatencyHistogram: {} bytes, InstanceStats: {} bytes, OpStats: {} bytes",
        size_of::<LatencyHistogram>(),
        size_of::<InstanceStats>(),
        size_of::<OpStats>()
    );
}

#[test]
fn bucket_layout_is_contiguous_and_tight() {
    let mut expected_low = 0u64;
    for index in 0..LatencyHistogram::BUCKETS {
        let (low, high) = LatencyHistogram::bucket_bounds(index);
        assert_eq!(low, expected_low, "bucket {index}");
        assert!(high >= low);
        assert_eq!(LatencyHistogram::bucket_index(low), index);
        assert_eq!(LatencyHistogram::bucket_index(high), index);
        if index < 32 {
            assert_eq!((low, high), (index as u64, index as u64));
        } else {
            // Width is 1/16 of the power of two the bucket lives in.
            let width = high - low + 1;
            assert!(width.is_power_of_two());
            assert!(width * 16 <= low, "bucket {index}: {low}..={high}");
            let rep = LatencyHistogram::bucket_representative(index);
            // Relative to the value itself, at both ends of the bucket.
            let err = ((rep - low) as f64 / low as f64).max((high - rep) as f64 / high as f64);
            assert!(err < LatencyHistogram::MAX_RELATIVE_ERROR);
        }
        expected_low = high + 1;
    }
    assert_eq!(expected_low, 1 << 40);
    assert_eq!(
        LatencyHistogram::bucket_index(u64::MAX),
        LatencyHistogram::BUCKETS - 1
    );
    assert_eq!(
        LatencyHistogram::bucket_index(1 << 40),
        LatencyHistogram::BUCKETS - 1
    );
    // Spot values.
    assert_eq!(LatencyHistogram::bucket_index(0), 0);
    assert_eq!(LatencyHistogram::bucket_index(15), 15);
    assert_eq!(LatencyHistogram::bucket_index(16), 16);
    assert_eq!(LatencyHistogram::bucket_index(31), 31);
    assert_eq!(LatencyHistogram::bucket_index(32), 32);
    assert_eq!(LatencyHistogram::bucket_index(33), 32);
    assert_eq!(LatencyHistogram::bucket_index(34), 33);
    assert_eq!(LatencyHistogram::bucket_bounds(32), (32, 33));
    assert_eq!(LatencyHistogram::bucket_bounds(48), (64, 67));
}

#[test]
fn small_values_are_exact() {
    let mut h = LatencyHistogram::new();
    for v in 0..32u64 {
        h.record_n(v, v + 1);
    }
    let buckets: Vec<Bucket> = h.buckets().collect();
    assert_eq!(buckets.len(), 32);
    for (v, b) in buckets.iter().enumerate() {
        let v = v as u64;
        assert_eq!(
            *b,
            Bucket {
                low: v,
                high: v,
                count: v + 1
            }
        );
    }
    // Every quantile of values < 32 is exact.
    let mut sorted = Vec::new();
    for v in 0..32u64 {
        sorted.extend(std::iter::repeat_n(v, v as usize + 1));
    }
    for i in 0..=1000 {
        let q = i as f64 / 1000.0;
        assert_eq!(h.value_at_quantile(q), exact_quantile(&sorted, q), "q={q}");
    }
}

#[test]
fn representative_error_is_bounded_for_every_value() {
    // Exhaustive over a range, then random samples up to 2^40.
    let mut worst = 0.0f64;
    let mut check = |v: u64| {
        let rep = LatencyHistogram::bucket_representative(LatencyHistogram::bucket_index(v));
        let err = rep.abs_diff(v) as f64 / v as f64;
        worst = worst.max(err);
        assert!(err < LatencyHistogram::MAX_RELATIVE_ERROR, "v={v} rep={rep}");
    };
    for v in 1..300_000 {
        check(v);
    }
    let mut rng = Rng(7);
    for _ in 0..300_000 {
        let bits = rng.below(41) as u32;
        check((rng.next_u64() >> (64 - bits.max(1))).max(1));
    }
    for e in 5..40 {
        check(1 << e);
        check((1 << e) - 1);
    }
    eprintln!("per-value worst relative error {:.6}%", worst * 100.0);
    assert!(worst > 0.03, "bound should be nearly reached: {worst}");
}

#[test]
fn quantiles_within_error_bound_for_distributions() {
    let mut worst = 0.0f64;
    for (name, values) in distributions() {
        worst = worst.max(check_against_exact(name, &values));
    }
    eprintln!("overall worst quantile relative error {:.4}%", worst * 100.0);
    assert!(worst < LatencyHistogram::MAX_RELATIVE_ERROR);
}

#[test]
fn clamped_values_keep_exact_max() {
    let mut h = LatencyHistogram::new();
    h.record(5);
    h.record(u64::MAX);
    h.record(1 << 45);
    assert_eq!(h.max(), u64::MAX);
    assert_eq!(h.min(), 5);
    assert_eq!(h.value_at_quantile(1.0), u64::MAX);
    assert_eq!(h.value_at_quantile(0.0), 5);
    assert_eq!(h.sum(), u64::MAX, "sum saturates");
    let top = h.buckets().last().unwrap();
    assert_eq!(top.count, 2);
    assert_eq!(top.high, LatencyHistogram::HIGHEST_TRACKABLE);
    // Middle sample (1<<45) is clamped into the top bucket.
    let mid = h.value_at_quantile(0.5);
    assert_eq!(
        mid,
        LatencyHistogram::bucket_representative(LatencyHistogram::BUCKETS - 1)
    );
}

#[test]
fn empty_and_edge_quantiles() {
    let mut h = LatencyHistogram::new();
    assert!(h.is_empty());
    assert_eq!(h.value_at_quantile(0.5), 0);
    assert_eq!((h.min(), h.max(), h.mean()), (0, 0, 0.0));
    assert_eq!(h.quantiles(), LatencyQuantiles::default());
    h.record(1000);
    for q in [-1.0, 0.0, 0.5, 1.0, 2.0, f64::NAN, f64::INFINITY] {
        assert_eq!(h.value_at_quantile(q), 1000, "q={q}");
    }
    h.record_n(7, 0);
    assert_eq!((h.count(), h.min()), (1, 1000));
    h.record_n(2000, 3);
    assert_eq!(h.count(), 4);
    assert_eq!(h.sum(), 7000);
    assert_eq!(h.mean(), 1750.0);
    h.reset();
    assert_eq!(h, LatencyHistogram::new());
}

#[test]
fn merge_equals_union() {
    let mut rng = Rng(42);
    let a: Vec<u64> = (0..50_000).map(|_| rng.below(1 << 20)).collect();
    let b: Vec<u64> = (0..30_000).map(|_| (-rng.unit().ln() * 1e6) as u64).collect();
    let (mut ha, mut hb, mut hu) = (
        LatencyHistogram::new(),
        LatencyHistogram::new(),
        LatencyHistogram::new(),
    );
    for &v in &a {
        ha.record(v);
        hu.record(v);
    }
    for &v in &b {
        hb.record(v);
        hu.record(v);
    }
    let mut merged = ha.clone();
    merged.merge(&hb);
    assert_eq!(merged, hu);
    assert_eq!(merged.quantiles(), hu.quantiles());
    // Merging an empty histogram is the identity, both ways.
    let mut e = LatencyHistogram::new();
    e.merge(&ha);
    assert_eq!(e, ha);
    let mut a2 = ha.clone();
    a2.merge(&LatencyHistogram::new());
    assert_eq!(a2, ha);
}

#[test]
fn saturating_sub_gives_window() {
    let mut rng = Rng(3);
    let first: Vec<u64> = (0..40_000).map(|_| rng.below(100_000) + 1).collect();
    let second: Vec<u64> = (0..25_000).map(|_| rng.below(50_000) + 200).collect();
    let mut h = LatencyHistogram::new();
    let mut window_only = LatencyHistogram::new();
    for &v in &first {
        h.record(v);
    }
    let snapshot = h.clone();
    for &v in &second {
        h.record(v);
        window_only.record(v);
    }
    let w = h.saturating_sub(&snapshot);
    assert_eq!(w.count(), 25_000);
    assert_eq!(w.sum(), window_only.sum());
    assert!(w.buckets().eq(window_only.buckets()));
    // Max/min were not new records: estimated within the error bound.
    let rel = |a: u64, b: u64| a.abs_diff(b) as f64 / b as f64;
    assert!(rel(w.max(), window_only.max()) < LatencyHistogram::MAX_RELATIVE_ERROR);
    assert!(rel(w.min(), window_only.min()) < LatencyHistogram::MAX_RELATIVE_ERROR);
    let mut sorted = second.clone();
    sorted.sort_unstable();
    for q in QS {
        let exact = exact_quantile(&sorted, q);
        let got = w.value_at_quantile(q);
        assert!(
            rel(got, exact) < LatencyHistogram::MAX_RELATIVE_ERROR,
            "q={q} exact={exact} got={got}"
        );
    }
    // A new max in the window is exact.
    let snap2 = h.clone();
    h.record(10_000_000);
    h.record(300);
    let w2 = h.saturating_sub(&snap2);
    assert_eq!((w2.count(), w2.max()), (2, 10_000_000));
    assert_eq!(w2.value_at_quantile(1.0), 10_000_000);
    // 300 is not a new all-time minimum: estimated by its bucket.
    let min_est = w2.value_at_quantile(0.0);
    assert_eq!(
        min_est,
        LatencyHistogram::bucket_representative(LatencyHistogram::bucket_index(300))
    );
    assert!(rel(min_est, 300) < LatencyHistogram::MAX_RELATIVE_ERROR);
    // Empty window, and the first window (earlier empty) is exact.
    assert!(h.saturating_sub(&h).is_empty());
    assert_eq!(h.saturating_sub(&LatencyHistogram::new()), h);
    // Not-actually-earlier input saturates instead of wrapping.
    assert!(snapshot.saturating_sub(&h).is_empty());
}

#[test]
fn quantiles_map_converts_units() {
    let q = LatencyQuantiles {
        p50: 30,
        p90: 60,
        p99: 90,
        p999: 300,
        max: 3000,
    };
    let ns = q.map(|ticks| ticks as f64 / 3.0);
    assert_eq!(
        ns,
        LatencyQuantiles {
            p50: 10.0,
            p90: 20.0,
            p99: 30.0,
            p999: 100.0,
            max: 1000.0
        }
    );
}

#[test]
fn matches_hdrhistogram_reference() {
    use hdrhistogram::Histogram;
    // hdrhistogram with 3 significant digits reports the highest
    // equivalent value of its bucket: relative error <= 2^-10 above exact.
    let hdr_err = 1.0 / 1024.0;
    let mut worst = 0.0f64;
    let mut compared = 0;
    for (name, values) in distributions() {
        let mut ours = LatencyHistogram::new();
        let mut hdr = Histogram::<u64>::new_with_bounds(1, 1 << 41, 3).unwrap();
        for &v in values
            .iter()
            .filter(|&&v| v <= LatencyHistogram::HIGHEST_TRACKABLE)
        {
            // hdrhistogram's lowest discernible value is 1: feed both
            // the same data, with 0 raised to 1.
            let v = v.max(1);
            ours.record(v);
            hdr.record(v).unwrap();
        }
        compared += 1;
        assert_eq!(ours.count(), hdr.len(), "{name}");
        // hdrhistogram reports min/max as the edges of their buckets.
        let near = |exact: u64, hdr_value: u64| exact.abs_diff(hdr_value) as f64 <= exact as f64 * hdr_err;
        assert!(near(ours.max(), hdr.max()), "{name}");
        assert!(near(ours.min(), hdr.min()), "{name}");
        for q in QS {
            let a = ours.value_at_quantile(q);
            let b = hdr.value_at_quantile(q);
            let err = a.abs_diff(b) as f64 / b as f64;
            worst = worst.max(err);
            assert!(
                err <= LatencyHistogram::MAX_RELATIVE_ERROR + hdr_err,
                "{name}: q={q} ours={a} hdr={b}"
            );
        }
    }
    assert_eq!(compared, distributions().len());
    eprintln!("worst difference vs hdrhistogram {:.4}%", worst * 100.0);
}

// --- InstanceStats ----------------------------------------------------

#[test]
fn counts_per_op_kind_and_flags() {
    let mut s = InstanceStats::new();
    for i in 0..100u32 {
        s.record(1, 0, 0, 1);
        if i % 2 == 0 {
            s.record(2, Observation::FLAG_CONTENDED, 50, 1);
        }
        if i % 4 == 0 {
            s.record(7, Observation::FLAG_MISS, 0, 1);
        }
        if i % 10 == 0 {
            // Bits above Observation::FLAG_COUNT mean nothing (yet) and are ignored.
            s.record(
                3,
                Observation::FLAG_CONTENDED | Observation::FLAG_MISS | 0xfff8,
                10,
                1,
            );
        }
    }
    let get = |k: u16| {
        let o = s.op(k).unwrap();
        (o.ops(), o.contended(), o.misses())
    };
    assert_eq!(get(1), (100, 0, 0));
    assert_eq!(get(2), (50, 50, 0));
    assert_eq!(get(3), (10, 10, 10));
    assert_eq!(get(7), (25, 0, 25));
    assert_eq!(get(4), (0, 0, 0));
    assert_eq!(s.total_ops(), 185);
    assert_eq!(s.total_contended(), 60);
    assert_eq!(s.total_misses(), 35);
    assert_eq!(s.invalid_op_kind(), 0);
    assert!(s.op(0).is_none() && s.op(8).is_none());
    let kinds: Vec<u16> = s.ops_by_kind().map(|(k, _)| k).collect();
    assert_eq!(kinds, vec![1, 2, 3, 4, 5, 6, 7]);
}

/// A `Observation::FLAG_COUNT` observation adds its count to the op and nothing
/// else (other flags on it are ignored, no latency is recorded), its
/// thread is seen, and a hostile count saturates instead of wrapping.
#[test]
fn count_observations_add_uncontended_operations() {
    let mut s = InstanceStats::new();
    s.record(1, 0, 0, 1);
    s.record(1, Observation::FLAG_COUNT, 64, 2);
    s.record(
        1,
        Observation::FLAG_COUNT | Observation::FLAG_CONTENDED | Observation::FLAG_MISS,
        5,
        3,
    );
    s.record(1, Observation::FLAG_CONTENDED, 40, 1);
    let op = s.op(1).unwrap();
    assert_eq!((op.ops(), op.contended(), op.misses()), (71, 1, 0));
    assert_eq!(op.latency().unwrap().count(), 1, "only the real wait");
    assert_eq!(op.distinct_threads().count, 3);
    s.record(2, Observation::FLAG_COUNT, u64::MAX - 1, 1);
    s.record(2, Observation::FLAG_COUNT, 10, 1);
    assert_eq!(s.op(2).unwrap().ops(), u64::MAX);
    assert!(s.op(2).unwrap().latency().is_none());
}

#[test]
fn invalid_op_kinds_are_only_counted() {
    let mut s = InstanceStats::new();
    for k in [0u16, 8, 9, 100, u16::MAX] {
        s.record(k, Observation::FLAG_CONTENDED | Observation::FLAG_MISS, 1234, 9);
    }
    assert_eq!(s.invalid_op_kind(), 5);
    assert_eq!(s.total_ops(), 0);
    assert_eq!(s.total_contended(), 0);
    assert_eq!(s.total_misses(), 0);
    assert!(s.latency().is_none());
    assert_eq!(s.distinct_threads(), DistinctThreads::default());
    assert!(!s.is_empty());
    assert_eq!(s.heap_bytes(), 0);
}

#[test]
fn zero_latency_not_recorded_and_histograms_are_lazy() {
    let mut s = InstanceStats::new();
    s.record(1, 0, 0, 1);
    s.record(1, 0, 0, 1);
    assert!(s.op(1).unwrap().latency().is_none());
    assert!(s.op(1).unwrap().max_latency().is_none());
    assert!(s.max_latency().is_none());
    s.record(1, 0, 40, 1);
    s.record(1, 0, 0, 1);
    let h = s.op(1).unwrap().latency().unwrap();
    assert_eq!((h.count(), h.min(), h.max()), (1, 40, 40));
    assert_eq!(s.op(1).unwrap().ops(), 4);
    // Only op kind 1 has a histogram.
    assert!((2..=7).all(|k| s.op(k).unwrap().latency().is_none()));
    assert!(s.heap_bytes() >= size_of::<LatencyHistogram>());
    assert!(s.heap_bytes() < 2 * size_of::<LatencyHistogram>());
}

#[test]
fn max_latency_with_thread() {
    let mut s = InstanceStats::new();
    s.record(2, 0, 100, 10);
    s.record(2, 0, 900, 11);
    s.record(2, 0, 900, 12); // tie: first producer kept
    s.record(2, 0, 500, 13);
    s.record(4, 0, 700, 14);
    s.record(4, 0, 5000, 15);
    s.record(4, 0, 0, 16);
    assert_eq!(
        s.op(2).unwrap().max_latency(),
        Some(MaxLatency {
            ticks: 900,
            thread_id: 11
        })
    );
    assert_eq!(
        s.max_latency(),
        Some((
            4,
            MaxLatency {
                ticks: 5000,
                thread_id: 15
            }
        ))
    );
    let all = s.latency().unwrap();
    assert_eq!((all.count(), all.max(), all.min()), (6, 5000, 100));
}

#[test]
fn distinct_threads_exact_then_saturating() {
    let mut s = InstanceStats::new();
    // Batches per thread, threads revisited: still counted once.
    for _ in 0..3 {
        for t in [5u32, 3, 9, 3, 0, u32::MAX] {
            for _ in 0..10 {
                s.record(1, 0, 1, t);
            }
        }
    }
    s.record(2, 0, 1, 77);
    let o = s.op(1).unwrap();
    assert_eq!(
        o.distinct_threads(),
        DistinctThreads {
            count: 5,
            saturated: false
        }
    );
    assert_eq!(o.thread_ids(), &[0, 3, 5, 9, u32::MAX]);
    assert_eq!(
        s.distinct_threads(),
        DistinctThreads {
            count: 6,
            saturated: false
        }
    );

    let mut big = InstanceStats::new();
    for t in 0..(DISTINCT_THREADS_CAP as u32 + 100) {
        big.record(3, 0, 0, t * 7);
    }
    assert_eq!(
        big.op(3).unwrap().distinct_threads(),
        DistinctThreads {
            count: DISTINCT_THREADS_CAP,
            saturated: true
        }
    );
    // Exactly at the cap is not saturated.
    let mut at_cap = InstanceStats::new();
    for t in 0..DISTINCT_THREADS_CAP as u32 {
        at_cap.record(3, 0, 0, t);
        at_cap.record(3, 0, 0, t);
    }
    assert_eq!(
        at_cap.op(3).unwrap().distinct_threads(),
        DistinctThreads {
            count: DISTINCT_THREADS_CAP,
            saturated: false
        }
    );
    // Union over the cap saturates; union of overlapping sets is exact.
    let mut other = InstanceStats::new();
    other.record(3, 0, 0, 1_000_000);
    let mut merged = at_cap.clone();
    merged.merge(&other);
    assert!(merged.op(3).unwrap().distinct_threads().saturated);
    let mut overlap = at_cap.clone();
    overlap.merge(&at_cap);
    assert_eq!(
        overlap.op(3).unwrap().distinct_threads(),
        DistinctThreads {
            count: DISTINCT_THREADS_CAP,
            saturated: false
        }
    );
}

#[test]
fn touch_and_drops() {
    let mut s = InstanceStats::new();
    assert!(s.is_empty());
    assert_eq!((s.first_seen_ns(), s.last_seen_ns()), (None, None));
    s.touch(1000);
    s.touch(5000);
    s.touch(3000); // never moves back
    assert_eq!((s.first_seen_ns(), s.last_seen_ns()), (Some(1000), Some(5000)));
    s.add_attributed_drops(3);
    s.add_attributed_drops(4);
    assert_eq!(s.drops_attributed(), 7);
    assert!(!s.is_empty());
}

fn feed(s: &mut InstanceStats, rng: &mut Rng, n: usize) {
    for _ in 0..n {
        let kind = rng.below(9) as u16; // includes invalid 0 and 8
        let flags = rng.below(4) as u16;
        let lat = if rng.below(3) == 0 { 0 } else { rng.below(1 << 24) };
        let thread = rng.below(20) as u32;
        s.record(kind, flags, lat, thread);
    }
}

fn assert_same(a: &InstanceStats, b: &InstanceStats) {
    for k in 1..=7 {
        let (x, y) = (a.op(k).unwrap(), b.op(k).unwrap());
        assert_eq!(
            (x.ops(), x.contended(), x.misses()),
            (y.ops(), y.contended(), y.misses())
        );
        assert_eq!(x.latency(), y.latency(), "kind {k}");
        assert_eq!(x.max_latency().map(|m| m.ticks), y.max_latency().map(|m| m.ticks));
        assert_eq!(x.thread_ids(), y.thread_ids());
        assert_eq!(x.distinct_threads(), y.distinct_threads());
    }
    assert_eq!(a.invalid_op_kind(), b.invalid_op_kind());
    assert_eq!(a.drops_attributed(), b.drops_attributed());
    assert_eq!(a.first_seen_ns(), b.first_seen_ns());
    assert_eq!(a.last_seen_ns(), b.last_seen_ns());
}

#[test]
fn instance_merge_equals_union() {
    let (mut a, mut b, mut u) = (InstanceStats::new(), InstanceStats::new(), InstanceStats::new());
    let mut rng = Rng(11);
    feed(&mut a, &mut rng, 20_000);
    a.touch(2000);
    a.add_attributed_drops(5);
    let mut rng = Rng(11);
    feed(&mut u, &mut rng, 20_000);
    let mut rng = Rng(12);
    feed(&mut b, &mut rng, 15_000);
    b.touch(1000);
    b.touch(1500);
    b.add_attributed_drops(2);
    let mut rng = Rng(12);
    feed(&mut u, &mut rng, 15_000);
    u.touch(1000);
    u.touch(2000);
    u.add_attributed_drops(7);
    let mut m = a.clone();
    m.merge(&b);
    assert_same(&m, &u);
    // Max thread follows the larger max.
    let mut x = InstanceStats::new();
    x.record(5, 0, 10, 1);
    let mut y = InstanceStats::new();
    y.record(5, 0, 20, 2);
    x.merge(&y);
    assert_eq!(
        x.max_latency(),
        Some((
            5,
            MaxLatency {
                ticks: 20,
                thread_id: 2
            }
        ))
    );
    let mut z = InstanceStats::new();
    z.merge(&y);
    assert_eq!(
        z.max_latency(),
        Some((
            5,
            MaxLatency {
                ticks: 20,
                thread_id: 2
            }
        ))
    );
}

#[test]
fn window_rates_with_known_elapsed_time() {
    let mut s = InstanceStats::new();
    s.touch(0);
    for _ in 0..1000 {
        s.record(1, Observation::FLAG_CONTENDED, 100, 1);
    }
    s.add_attributed_drops(10);
    let mut w = StatsWindow::new(0);
    let r0 = w.advance(&s, 1_000_000_000);
    assert_eq!(r0.elapsed_ns, 1_000_000_000);
    assert_eq!(r0.ops_per_sec, 1000.0);
    assert_eq!(
        r0.new_max_latency,
        Some((
            1,
            MaxLatency {
                ticks: 100,
                thread_id: 1
            }
        ))
    );

    // Second window: 2 s long.
    for i in 0..4000u32 {
        s.record(1, 0, 200, 2);
        if i % 4 == 0 {
            s.record(2, Observation::FLAG_MISS | Observation::FLAG_CONTENDED, 0, 3);
        }
    }
    s.record(0, 0, 0, 0);
    s.record(9, 0, 0, 0);
    s.add_attributed_drops(40);
    let r = w.advance(&s, 3_000_000_000);
    assert_eq!(r.elapsed_ns, 2_000_000_000);
    assert_eq!(r.op(1).unwrap().ops, 4000);
    assert_eq!(r.op(1).unwrap().ops_per_sec, 2000.0);
    assert_eq!(r.op(1).unwrap().contended_per_sec, 0.0);
    assert_eq!(r.op(2).unwrap().ops_per_sec, 500.0);
    assert_eq!(r.op(2).unwrap().misses_per_sec, 500.0);
    assert_eq!(r.ops_per_sec, 2500.0);
    assert_eq!(r.contended_per_sec, 500.0);
    assert_eq!(r.misses_per_sec, 500.0);
    assert_eq!(r.drops_per_sec, 20.0);
    assert_eq!(r.invalid_per_sec, 1.0);
    // Window latency only covers this window's 200s, not the earlier 100s.
    let q = r.op(1).unwrap().latency.unwrap();
    assert_eq!(
        q.p50,
        LatencyHistogram::bucket_representative(LatencyHistogram::bucket_index(200)).clamp(100, 200)
    );
    assert_eq!(q.max, 200, "new max in window is exact");
    assert_eq!(r.latency.unwrap().max, 200);
    assert!(r.op(2).unwrap().latency.is_none());
    assert_eq!(
        r.new_max_latency,
        Some((
            1,
            MaxLatency {
                ticks: 200,
                thread_id: 2
            }
        ))
    );

    // Idle window.
    let idle = w.advance(&s, 4_000_000_000);
    assert_eq!(idle.ops_per_sec, 0.0);
    assert!(idle.latency.is_none());
    assert!(idle.new_max_latency.is_none());
    // Zero-length window: no division by zero.
    let z = s.delta_since(&InstanceStats::new()).rates(0);
    assert_eq!(z.ops_per_sec, 0.0);

    // delta_since directly.
    let d = s.delta_since(&InstanceStats::new());
    assert_eq!(d.total_ops(), 6000);
    assert_eq!(d.op(1).unwrap().contended, 1000);
    assert_eq!(d.invalid_op_kind, 2);
    assert_eq!(d.drops_attributed, 50);
    assert_eq!(d.latency().unwrap().count(), 5000);
    // A window started from the current state sees only what follows.
    let mut later = StatsWindow::starting_at(&s, 10_000_000_000);
    s.record(3, 0, 0, 1);
    s.record(3, 0, 0, 1);
    let r = later.advance(&s, 10_500_000_000);
    assert_eq!(r.elapsed_ns, 500_000_000);
    assert_eq!(r.ops_per_sec, 4.0);
    assert_eq!(r.op(3).unwrap().ops, 2);
    assert_eq!(r.op(1).unwrap().ops, 0);
}
