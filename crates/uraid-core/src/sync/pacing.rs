//! How fast background work runs while clients use the array. md's policy (`sync_policy
//! md`): `sync_speed_min` whenever other I/O runs, `sync_speed_max` when idle, so a rebuild
//! under any load crawls at the floor. The adaptive policy (the default) measures what the
//! rebuild costs the clients instead: their requests completed per second and their mean
//! time in the engine, in short periods, against a baseline taken in periods where the
//! rebuild is held at the floor. It raises the rate while the clients keep more than
//! 100/`sync_latency_limit_pct` of their pace and their latency stays within twice the
//! limit, and halves it otherwise (see `Clients::over`). `sync_speed_min/max` stay the
//! bounds. Deterministic: it sees only the engine's clock. Method and figures:
//! docs/performance.md, "Rebuild under load".

use crate::api::{RequestId, TimeNs};
use crate::config::{SyncPolicy, Tunables};
use crate::detmap::DetMap;

/// One measuring period.
pub(crate) const PERIOD_NS: TimeNs = 100_000_000;
/// How often the baseline is measured again (clients change what they do).
const PROBE_EVERY_NS: TimeNs = 5_000_000_000;
/// A probe holds the floor this many periods and measures the last (the first lets the
/// rebuild's queued member I/O drain).
const PROBE_PERIODS: u32 = 2;
/// A rise in the clients' latency below this is not held against the job (see `end_period`).
const LATENCY_SLACK_NS: u64 = 100_000;
/// Fewer completions in a period say little about their latency.
const MIN_SAMPLES: u32 = 32;
/// The clients' latency in one period: its mean is what a closed-loop client's IOPS follow
/// (IOPS = requests in flight / mean latency), and it is steady where a p99 of a short
/// period on a shared machine jumps with every scheduling hiccup.
#[derive(Clone, Debug, Default)]
struct Latencies {
    sum_ns: u64,
    n: u32,
}

impl Latencies {
    fn add(&mut self, ns: u64) {
        self.sum_ns += ns;
        self.n += 1;
    }

    fn mean_ns(&self) -> Option<u64> {
        (self.n >= MIN_SAMPLES).then(|| self.sum_ns / u64::from(self.n))
    }
}

/// What the clients got in a period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Clients {
    /// Their requests' mean time in the engine.
    lat_ns: u64,
    /// Their requests completed per second.
    per_s: u64,
}

impl Clients {
    fn mean(self, other: Clients) -> Clients {
        Clients { lat_ns: (self.lat_ns + other.lat_ns) / 2, per_s: (self.per_s + other.per_s) / 2 }
    }

    /// The job costs the clients too much: they complete fewer than 100/limit of what they
    /// did at the floor (a client that waits for each answer, as fio at an iodepth, slows
    /// down by as much as its latency grows), or their latency grew past twice the limit
    /// (a client that does not wait). A rise within LATENCY_SLACK_NS is never held against
    /// the job: on memory-backed members the engine's share of a request's time is tens of
    /// microseconds and swings by as much at the floor.
    fn over(self, base: Clients, limit_pct: u64) -> bool {
        let lat_cap = (base.lat_ns * 2 * limit_pct / 100).max(base.lat_ns + 4 * LATENCY_SLACK_NS);
        self.per_s * limit_pct < base.per_s * 100 || self.lat_ns > lat_cap
    }

    /// Within half the allowed loss and rise.
    fn well_within(self, base: Clients, limit_pct: u64) -> bool {
        let half_pct = (100 + limit_pct) / 2;
        let lat_ok = self.lat_ns <= (base.lat_ns * half_pct / 100).max(base.lat_ns + LATENCY_SLACK_NS);
        lat_ok && self.per_s * half_pct >= base.per_s * 100
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
    /// The clients at the floor (the last probe).
    baseline: Option<Clients>,
    /// What the last judgement used (smoothed).
    last: Option<Clients>,
    /// Periods left of the probe under way (the floor held).
    probe_left: u32,
    next_probe_ns: TimeNs,
    /// The job's share of the bytes moved in the last period with client I/O, percent.
    pub(crate) share_pct: Option<u8>,
    last_admitted_ns: Option<TimeNs>,
}

impl Pacer {
    /// A client read or write admitted (timed only while a job runs).
    pub(crate) fn admitted(&mut self, id: RequestId, bytes: u64, now_ns: TimeNs) {
        self.last_admitted_ns = Some(now_ns);
        self.admitted.insert(id, (now_ns, bytes));
    }

    /// A request left the engine.
    pub(crate) fn completed(&mut self, id: RequestId, now_ns: TimeNs) {
        // Without a job nothing is timed: no lookup per request.
        if self.admitted.is_empty() {
            return;
        }
        if let Some((t0, bytes)) = self.admitted.remove(&id) {
            self.lat.add(now_ns.saturating_sub(t0));
            self.client_bytes += bytes;
        }
    }

    /// Client requests in flight, or admitted since `since_ns` (md's is_mddev_idle looks at
    /// the I/O since its last look, not at one instant: a client between two requests is
    /// not idle).
    pub(crate) fn clients_since(&self, since_ns: TimeNs) -> bool {
        !self.admitted.is_empty() || self.last_admitted_ns.is_some_and(|t| t >= since_ns)
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
            self.end_period(min, max, tun.sync_latency_limit_pct, now_ns);
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
        let elapsed_ns = now_ns - self.period_start_ns;
        let clients = self.lat.mean_ns().map(|lat_ns| Clients {
            lat_ns,
            per_s: u64::from(self.lat.n) * 1_000_000_000 / elapsed_ns.max(1),
        });
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
                if let Some(c) = clients {
                    self.baseline = Some(c);
                    self.last = None;
                }
            }
        } else if now_ns >= self.next_probe_ns {
            self.probe_left = PROBE_PERIODS;
            self.next_probe_ns = now_ns + PROBE_EVERY_NS;
        } else if let (Some(c), true) = (clients, self.rate_kib <= min) {
            // A period at the floor measures what a probe measures: it becomes the baseline.
            // Else a device that slowed down after the probe (a shared disk, a neighbour)
            // would look like the job's doing and hold the job at the floor until the next
            // probe.
            self.baseline = Some(c);
            self.last = None;
            self.rate_kib = (min * 2).min(max);
        } else {
            // Judged on the mean of this period and the last: one period's hiccup on a
            // shared machine does not halve the rate.
            let now = clients.map(|c| self.last.map_or(c, |last| c.mean(last)));
            self.last = now;
            let raised = match (now, self.baseline) {
                (Some(c), Some(base)) if c.over(base, limit_pct) => None,
                (Some(c), Some(base)) if !c.well_within(base, limit_pct) => {
                    Some(self.rate_kib + self.rate_kib / 4 + 1)
                }
                // Well within, or too few client requests to tell: double (a rebuild reaches
                // its ceiling in a few periods when the clients do not feel it).
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

    /// How the model's clients behave.
    #[derive(Clone, Copy)]
    enum Model {
        /// Each waits for its answer (fio at an iodepth): they complete fewer as their
        /// latency grows.
        Waiting,
        /// They send at a fixed rate whatever the latency.
        Fixed,
    }

    /// Runs the pacer against a model of a device shared by the job and clients: each
    /// period the job moves what its rate allows, and the clients' latency grows with the
    /// job's share of `capacity_kib` (`slope`: latency added at the full capacity, as a
    /// multiple of the base, a disk-like 2 ms). Returns the rate of each period.
    fn run(tun: &Tunables, capacity_kib: u64, slope: f64, model: Model, seconds: u64) -> Vec<u64> {
        let mut p = Pacer::default();
        let step_ns = PERIOD_NS / 10;
        let mut rates = Vec::new();
        let mut id = 0u64;
        let mut t = 1_000_000_000u64;
        while t < seconds * 1_000_000_000 {
            let rate = p.rate_kib(tun, true, t);
            let moved_kib = rate.min(capacity_kib) * step_ns / 1_000_000_000;
            p.sync_started(moved_kib * 1024);
            let base_us = 2000.0;
            let stretch = 1.0 + slope * rate.min(capacity_kib) as f64 / capacity_kib as f64;
            let lat_us = base_us * stretch;
            let n = match model {
                Model::Waiting => (100.0 / stretch) as u64,
                Model::Fixed => 100,
            };
            for _ in 0..n {
                id += 1;
                p.admitted(id, 4096, t);
                p.completed(id, t + (lat_us * 1000.0) as u64);
            }
            if t.is_multiple_of(PERIOD_NS) {
                rates.push(rate);
            }
            t += step_ns;
        }
        rates
    }

    fn tail_mean(rates: &[u64]) -> u64 {
        let tail = &rates[rates.len() - 200..];
        tail.iter().sum::<u64>() / tail.len() as u64
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
        let rates = run(&tun, 1_000_000, 0.0, Model::Waiting, 20);
        let last = rates[rates.len() - 5..].iter().max().copied().unwrap();
        assert_eq!(last, tun.sync_speed_max_kib, "{rates:?}");
        // Probes hold the floor now and then: the baseline stays current.
        assert!(rates[50..].contains(&tun.sync_speed_min_kib), "{rates:?}");
    }

    #[test]
    fn the_job_settles_where_waiting_clients_lose_what_the_limit_allows() {
        // Latency doubles at the device's full capacity: clients that wait for each answer
        // keep 1/1.3 of their pace up to about 30% of it.
        let tun = Tunables::default();
        let capacity = 150_000;
        let mean = tail_mean(&run(&tun, capacity, 1.0, Model::Waiting, 60));
        assert!(mean > capacity / 10 && mean < capacity * 35 / 100, "mean {mean}");
        // md's policy would have given the floor.
        assert!(mean > 10 * tun.sync_speed_min_kib, "{mean}");
    }

    #[test]
    fn clients_at_a_fixed_pace_are_held_to_twice_the_latency_limit() {
        // Latency 5x at full capacity: 2.6x (twice 1.3) allows about 40% of it.
        let tun = Tunables::default();
        let capacity = 150_000;
        let mean = tail_mean(&run(&tun, capacity, 4.0, Model::Fixed, 60));
        assert!(mean > capacity / 10 && mean < capacity * 45 / 100, "mean {mean}");
    }

    #[test]
    fn a_period_at_the_floor_is_a_new_baseline() {
        // The probe saw 4000 completions a second; the device then slowed to 2000 whatever
        // the job does. At the floor that is the clients' pace without the job: the rate
        // rises again instead of waiting for the next probe.
        let base = Clients { lat_ns: 1_000_000, per_s: 4000 };
        let mut p = Pacer { rate_kib: 5000, baseline: Some(base), ..Pacer::default() };
        p.next_probe_ns = u64::MAX;
        for i in 0..200 {
            p.admitted(i, 4096, 0);
            p.completed(i, 2_000_000);
        }
        p.end_period(5000, 20_000, 130, PERIOD_NS);
        assert_eq!(p.baseline, Some(Clients { lat_ns: 2_000_000, per_s: 2000 }));
        assert_eq!(p.rate_kib, 10_000);
    }

    #[test]
    fn the_bounds_hold_and_clients_over_the_limit_halve_the_rate() {
        let tun = Tunables { sync_speed_min_kib: 5000, sync_speed_max_kib: 20_000, ..Tunables::default() };
        let rates = run(&tun, 1_000_000, 0.0, Model::Waiting, 10);
        assert!(rates.iter().all(|&r| (5000..=20_000).contains(&r)), "{rates:?}");
        // 400 completions a period at the floor; 40 now, at the same latency: halved.
        let base = Clients { lat_ns: 1_000_000, per_s: 4000 };
        let mut p = Pacer { rate_kib: 16_000, baseline: Some(base), ..Pacer::default() };
        p.next_probe_ns = u64::MAX;
        for i in 0..40 {
            p.admitted(i, 4096, 0);
            p.completed(i, 1_000_000);
        }
        p.end_period(5000, 20_000, 130, PERIOD_NS);
        assert_eq!(p.rate_kib, 8000);
        // The same pace with a latency rise under the slack: raised.
        p.baseline = Some(Clients { lat_ns: 950_000, per_s: 400 });
        p.last = None;
        for i in 0..40 {
            p.admitted(i, 4096, PERIOD_NS);
            p.completed(i, PERIOD_NS + 1_000_000);
        }
        p.end_period(5000, 20_000, 130, 2 * PERIOD_NS);
        assert!(p.rate_kib > 8000, "{}", p.rate_kib);
    }
}
