//! How fast background work runs while clients use the array. md's policy (`sync_policy
//! md`): `sync_speed_min` whenever other I/O runs, `sync_speed_max` when idle, so a rebuild
//! under any load crawls at the floor. The adaptive policy (the default) measures what the
//! rebuild costs the clients instead: the p99 latency of their reads and writes in short
//! periods, against a baseline taken in periods where the rebuild is held at the floor,
//! and raises the rate while the p99 stays within `sync_p99_limit_pct` of the baseline
//! (halving it when it does not). `sync_speed_min/max` stay the bounds. Deterministic: it
//! sees only the engine's clock. Method and figures: docs/performance.md, "Rebuild under
//! load".

use crate::api::{RequestId, TimeNs};
use crate::config::{SyncPolicy, Tunables};
use crate::detmap::DetMap;

/// One measuring period.
const PERIOD_NS: TimeNs = 100_000_000;
/// How often the baseline is measured again (clients change what they do).
const PROBE_EVERY_NS: TimeNs = 5_000_000_000;
/// A probe holds the floor this many periods and measures the last (the first lets the
/// rebuild's queued member I/O drain).
const PROBE_PERIODS: u32 = 2;
/// Fewer completions in a period say nothing about a p99.
const MIN_SAMPLES: u32 = 32;
/// Latency buckets: a quarter octave each from 1 us (4 per doubling, 2^16 us at the top).
const BUCKETS: usize = 64;

#[derive(Clone, Debug)]
struct Latencies {
    counts: [u32; BUCKETS],
    n: u32,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies { counts: [0; BUCKETS], n: 0 }
    }
}

impl Latencies {
    fn bucket(ns: u64) -> usize {
        let us = (ns / 1000).max(1);
        let octave = 63 - us.leading_zeros() as usize;
        // The two bits below the top one place it within its octave.
        let quarter = if octave >= 2 { (us >> (octave - 2)) & 3 } else { (us << (2 - octave)) & 3 } as usize;
        (octave * 4 + quarter).min(BUCKETS - 1)
    }

    /// The bucket's upper edge, in ns.
    fn upper_ns(b: usize) -> u64 {
        let (octave, quarter) = (b / 4, (b % 4) as u64);
        ((1u64 << octave) * (5 + quarter)).div_ceil(4) * 1000
    }

    fn add(&mut self, ns: u64) {
        self.counts[Self::bucket(ns)] += 1;
        self.n += 1;
    }

    fn p99_ns(&self) -> Option<u64> {
        if self.n < MIN_SAMPLES {
            return None;
        }
        let want = self.n - self.n / 100;
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(Self::upper_ns(b));
            }
        }
        None
    }
}

/// The adaptive policy's state; md's needs none.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    /// Client reads and writes admitted while a job runs: (admitted at, bytes).
    admitted: DetMap<RequestId, (TimeNs, u64)>,
    period_start_ns: TimeNs,
    lat: Latencies,
    /// Bytes the clients' requests and the job moved this period (the job's share).
    client_bytes: u64,
    sync_bytes: u64,
    /// The rate the job runs at under load, KiB/s; 0 until the first period.
    rate_kib: u64,
    baseline_p99_ns: Option<u64>,
    /// Periods left of the probe under way (the floor held).
    probe_left: u32,
    next_probe_ns: TimeNs,
    /// The job's share of the bytes moved in the last period with client I/O, percent.
    pub(crate) share_pct: Option<u8>,
}

impl Pacer {
    /// A client read or write admitted (timed only while a job runs).
    pub(crate) fn admitted(&mut self, id: RequestId, bytes: u64, now_ns: TimeNs) {
        self.admitted.insert(id, (now_ns, bytes));
    }

    /// A request left the engine.
    pub(crate) fn completed(&mut self, id: RequestId, now_ns: TimeNs) {
        if let Some((t0, bytes)) = self.admitted.remove(&id) {
            self.lat.add(now_ns.saturating_sub(t0));
            self.client_bytes += bytes;
        }
    }

    pub(crate) fn sync_started(&mut self, bytes: u64) {
        self.sync_bytes += bytes;
    }

    /// No job runs: nothing to time, and the next job measures its baseline first.
    pub(crate) fn idle(&mut self) {
        if self.rate_kib != 0 || !self.admitted.is_empty() {
            *self = Pacer::default();
        }
    }

    /// The rate for the next unit, KiB/s, within `sync_speed_min/max`; `busy`: client
    /// requests are in flight.
    pub(crate) fn rate_kib(&mut self, tun: &Tunables, busy: bool, now_ns: TimeNs) -> u64 {
        let min = tun.sync_speed_min_kib;
        let max = tun.sync_speed_max_kib.max(min);
        if tun.sync_policy == SyncPolicy::Md {
            return if busy { min } else { max };
        }
        if self.rate_kib == 0 {
            self.start(min, now_ns);
        }
        if now_ns >= self.period_start_ns + PERIOD_NS {
            self.end_period(min, max, tun.sync_p99_limit_pct, now_ns);
        }
        match (busy, self.probe_left) {
            // Idle, md's ceiling: no client to measure or to spare.
            (false, _) => max,
            (true, 0) => self.rate_kib.clamp(min, max),
            (true, _) => min,
        }
    }

    fn start(&mut self, min: u64, now_ns: TimeNs) {
        self.rate_kib = min.max(1);
        self.period_start_ns = now_ns;
        self.probe_left = PROBE_PERIODS;
        self.next_probe_ns = now_ns + PROBE_EVERY_NS;
    }

    fn end_period(&mut self, min: u64, max: u64, limit_pct: u64, now_ns: TimeNs) {
        let p99 = self.lat.p99_ns();
        let elapsed_ns = now_ns - self.period_start_ns;
        let moved = self.client_bytes + self.sync_bytes;
        if self.client_bytes > 0 {
            self.share_pct = Some((self.sync_bytes * 100 / moved.max(1)) as u8);
        }
        // What the job really did: a rate far above it only delays the cut once clients
        // suffer, so a raise starts from twice what was achieved.
        let achieved_kib = self.sync_bytes * 1_000_000_000 / elapsed_ns.max(1) / 1024;
        if self.probe_left > 0 {
            self.probe_left -= 1;
            if self.probe_left == 0 {
                if let Some(p) = p99 {
                    self.baseline_p99_ns = Some(p);
                }
            }
        } else if now_ns >= self.next_probe_ns {
            self.probe_left = PROBE_PERIODS;
            self.next_probe_ns = now_ns + PROBE_EVERY_NS;
        } else {
            // Over the limit: halve. Within half the allowed rise: double (a rebuild reaches
            // its ceiling in a few periods when clients do not feel it). Else a quarter more.
            let raised = match (p99, self.baseline_p99_ns) {
                (Some(p), Some(base)) if p * 100 > base * limit_pct => None,
                (Some(p), Some(base)) if p * 200 > base * (100 + limit_pct) => {
                    Some(self.rate_kib + self.rate_kib / 4 + 1)
                }
                // Well within the limit, or too few client requests to tell.
                _ => Some(self.rate_kib * 2),
            };
            self.rate_kib = match raised {
                None => (self.rate_kib / 2).max(min),
                Some(r) => r.min(achieved_kib.max(min) * 2).max(self.rate_kib).min(max),
            };
        }
        self.period_start_ns = now_ns;
        self.lat = Latencies::default();
        self.client_bytes = 0;
        self.sync_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the pacer against a model of a device shared by the job and clients: each
    /// period the job moves what its rate allows, and the clients' latency grows with the
    /// job's share of `capacity_kib` (`slope`: latency added at the full capacity, as a
    /// multiple of the base). Returns the rate of each period.
    fn run(tun: &Tunables, capacity_kib: u64, slope: f64, seconds: u64) -> Vec<u64> {
        let mut p = Pacer::default();
        let step_ns = PERIOD_NS / 10;
        let mut rates = Vec::new();
        let mut id = 0u64;
        let mut t = 1_000_000_000u64;
        while t < seconds * 1_000_000_000 {
            let rate = p.rate_kib(tun, true, t);
            let moved_kib = rate.min(capacity_kib) * step_ns / 1_000_000_000;
            p.sync_started(moved_kib * 1024);
            let base_us = 200.0;
            let lat_us = base_us * (1.0 + slope * rate.min(capacity_kib) as f64 / capacity_kib as f64);
            for k in 0..50u64 {
                id += 1;
                p.admitted(id, 4096, t);
                // A spread: most at the latency, a few at twice it.
                let l = if k % 50 == 0 { 2.0 * lat_us } else { lat_us };
                p.completed(id, t + (l * 1000.0) as u64);
            }
            if t.is_multiple_of(PERIOD_NS) {
                rates.push(rate);
            }
            t += step_ns;
        }
        rates
    }

    #[test]
    fn md_holds_the_floor_under_load_and_the_ceiling_idle() {
        let tun = Tunables { sync_policy: SyncPolicy::Md, ..Tunables::default() };
        let mut p = Pacer::default();
        assert_eq!(p.rate_kib(&tun, true, 0), tun.sync_speed_min_kib);
        assert_eq!(p.rate_kib(&tun, false, 0), tun.sync_speed_max_kib);
    }

    #[test]
    fn clients_that_do_not_suffer_let_the_job_reach_its_ceiling() {
        let tun = Tunables::default();
        let rates = run(&tun, 1_000_000, 0.0, 20);
        let last = rates[rates.len() - 5..].iter().max().copied().unwrap();
        assert_eq!(last, tun.sync_speed_max_kib, "{rates:?}");
        // Probes hold the floor now and then: the baseline stays current.
        assert!(rates[50..].contains(&tun.sync_speed_min_kib), "{rates:?}");
    }

    #[test]
    fn the_job_settles_where_the_clients_p99_meets_the_limit() {
        // Latency doubles at the device's full capacity: 1.3x allows about 30% of it.
        let tun = Tunables::default();
        let capacity = 150_000;
        let rates = run(&tun, capacity, 1.0, 60);
        let tail = &rates[rates.len() - 200..];
        let mean = tail.iter().sum::<u64>() / tail.len() as u64;
        assert!(mean > capacity / 10 && mean < capacity * 35 / 100, "mean {mean}: {tail:?}");
        // md's policy would have given the floor.
        assert!(mean > 10 * tun.sync_speed_min_kib, "{mean}");
    }

    #[test]
    fn the_bounds_hold_and_a_p99_over_the_limit_halves_the_rate() {
        let tun = Tunables { sync_speed_min_kib: 5000, sync_speed_max_kib: 20_000, ..Tunables::default() };
        let rates = run(&tun, 1_000_000, 0.0, 10);
        assert!(rates.iter().all(|&r| (5000..=20_000).contains(&r)), "{rates:?}");
        let mut p = Pacer { rate_kib: 16_000, baseline_p99_ns: Some(100_000), ..Pacer::default() };
        p.next_probe_ns = u64::MAX;
        for i in 0..40 {
            p.admitted(i, 4096, 0);
            p.completed(i, 1_000_000);
        }
        p.end_period(5000, 20_000, 130, PERIOD_NS);
        assert_eq!(p.rate_kib, 8000);
    }

    #[test]
    fn latency_buckets_bound_what_they_hold() {
        for us in [1u64, 3, 5, 7, 100, 999, 1000, 1023, 65_000] {
            let b = Latencies::bucket(us * 1000);
            assert!(Latencies::upper_ns(b) >= us * 1000, "{us} us in bucket {b}");
            assert!(b == 0 || Latencies::upper_ns(b - 1) <= us * 1000 + 1000, "{us} us in bucket {b}");
        }
    }
}
