//! Request latency histograms of a served array, per operation: from the moment the NBD
//! server hands a request to the array until the array completes it (the network and the
//! reply are not in it). Recording one request is two clock reads and two relaxed atomic
//! adds (its bucket, the sum): no lock, no allocation, so the hot path stays as it was.
//! `uraid serve --metrics` reads them (see docs/metrics.md).

use std::sync::atomic::{AtomicU64, Ordering};

/// The operations timed, in the order of [`Op`].
pub const OPS: [&str; 5] = ["read", "write", "flush", "trim", "write_zeroes"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read = 0,
    Write = 1,
    Flush = 2,
    Trim = 3,
    WriteZeroes = 4,
}

/// Upper bounds of the buckets, ns (Prometheus' `le`, inclusive); a last bucket holds
/// what is slower than the last bound. 10 µs (a 4 KiB read of a tmpfs member) to 10 s (a
/// member timing out).
pub const BOUNDS_NS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// One operation's histogram, on cache lines of its own so two operations completing on
/// two threads do not share one.
#[repr(align(128))]
#[derive(Default)]
struct OpHistogram {
    /// Non-cumulative counts: bucket `i` holds the requests in (BOUNDS_NS[i-1], BOUNDS_NS[i]].
    buckets: [AtomicU64; BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

/// One operation's histogram as read at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Non-cumulative, as [`OpHistogram::buckets`].
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// (upper bound in seconds, requests in the bucket), the last bound `+Inf`; not
    /// cumulative (the encoder sums them into Prometheus' `le` buckets).
    pub fn buckets_seconds(&self) -> Vec<(f64, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, &n)| (BOUNDS_NS.get(i).map_or(f64::INFINITY, |&b| b as f64 / 1e9), n))
            .collect()
    }
}

#[derive(Default)]
pub struct Latency {
    ops: [OpHistogram; OPS.len()],
}

impl Latency {
    /// Counts one request of `op` that took `ns`.
    #[inline]
    pub fn record(&self, op: Op, ns: u64) {
        let h = &self.ops[op as usize];
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        h.buckets[i].fetch_add(1, Ordering::Relaxed);
        h.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Every operation's histogram, in the order of [`OPS`].
    pub fn snapshot(&self) -> Vec<HistogramSnapshot> {
        self.ops
            .iter()
            .map(|h| HistogramSnapshot {
                buckets: h.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
                sum_ns: h.sum_ns.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_lands_in_the_first_bucket_whose_bound_holds_it() {
        let l = Latency::default();
        l.record(Op::Read, 10_000);
        l.record(Op::Read, 10_001);
        l.record(Op::Read, 20_000_000_000);
        l.record(Op::Flush, 1);
        let s = l.snapshot();
        let read = &s[Op::Read as usize];
        assert_eq!((read.buckets[0], read.buckets[1], read.buckets[BOUNDS_NS.len()]), (1, 1, 1));
        assert_eq!((read.count(), read.sum_ns), (3, 20_000_020_001));
        let b = read.buckets_seconds();
        assert_eq!((b[0], b[1], b[2]), ((10e-6, 1), (25e-6, 1), (50e-6, 0)));
        assert_eq!(b[BOUNDS_NS.len()], (f64::INFINITY, 1));
        assert_eq!(s[Op::Flush as usize].count(), 1);
        assert_eq!(s[Op::Write as usize].count(), 0);
    }

    /// What timing one request costs (two clock reads, one record), by hand:
    /// `cargo test --release -p uraid --bin uraid -- --ignored --nocapture timing_cost`.
    #[test]
    #[ignore]
    fn timing_cost() {
        let l = Latency::default();
        let n = 10_000_000u64;
        let t = std::time::Instant::now();
        for _ in 0..n {
            let t0 = std::time::Instant::now();
            l.record(Op::Read, std::hint::black_box(t0.elapsed().as_nanos() as u64));
        }
        let per = t.elapsed().as_nanos() as f64 / n as f64;
        println!("timing one request: {per:.1} ns");
        assert_eq!(l.snapshot()[0].count(), n);
    }
}
