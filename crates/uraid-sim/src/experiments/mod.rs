//! The seeds' experiments on simulated disks: a small fio/tiobench-like job runner
//! ([`sim_job::run_job`]) and the five reproductions ([`tables`]).
//!
//! The files import one another in one direction: this one the jobs' types, `sim_job`
//! the simulated run of a job (and `SimRunner`), `report` the tables' types, `fidelity`
//! the scores, `tables` the experiments over all of them.
//!
//! Time is virtual (the disks are simulated), and so is CPU: with a CPU profile of the
//! seed's era (`sim::cpu`), the submitters' work and md's threads' work take virtual time
//! on modelled cores, and "CPU" columns are that modelled time. Every call into the engine
//! is also timed on the host (`engine_cpu_ns`), and seed 002's queue is replayed on the
//! host as a cross-check of the modelled queue.

pub mod fidelity;
pub mod report;
pub mod sim_job;
pub mod tables;

use std::time::Instant;

use uraid_core::queue::{QueueStats, RequestQueue};
use uraid_core::stats::ArrayStats;
use uraid_core::*;

use uraid_core::ArrayEngine;

/// An engine whose every call is timed on the host.
pub struct TimedEngine<E> {
    pub inner: E,
    pub cpu_ns: u64,
}

impl<E: ArrayEngine> TimedEngine<E> {
    fn timed<T>(&mut self, f: impl FnOnce(&mut E) -> T) -> T {
        let t = Instant::now();
        let r = f(&mut self.inner);
        self.cpu_ns += t.elapsed().as_nanos() as u64;
        r
    }
}

impl<E: ArrayEngine> ArrayEngine for TimedEngine<E> {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        self.timed(|e| e.submit(req, now_ns))
    }
    fn unplug(&mut self, now_ns: TimeNs) {
        self.timed(|e| e.unplug(now_ns))
    }
    fn pop_member_io(&mut self) -> Option<MemberIo> {
        self.timed(|e| e.pop_member_io())
    }
    fn complete_member_io(&mut self, c: MemberIoCompletion, now_ns: TimeNs) {
        self.timed(|e| e.complete_member_io(c, now_ns))
    }
    fn pop_completion(&mut self) -> Option<RequestCompletion> {
        self.timed(|e| e.pop_completion())
    }
    fn next_deadline_ns(&self) -> Option<TimeNs> {
        self.inner.next_deadline_ns()
    }
    fn tick(&mut self, now_ns: TimeNs) {
        self.timed(|e| e.tick(now_ns))
    }
    fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        self.inner.fail_member(member, now_ns)
    }
    fn is_idle(&self) -> bool {
        self.inner.is_idle()
    }
    fn stats_snapshot(&self) -> ArrayStats {
        self.inner.stats_snapshot()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Sequential,
    Random,
}

/// A fio-like job: `threads` workers, each keeping `queue_depth` requests in flight.
#[derive(Clone, Debug)]
pub struct Job {
    pub op: RequestOp,
    pub access: Access,
    pub block_bytes: u64,
    pub threads: usize,
    pub queue_depth: usize,
    /// Measured virtual time (after `warmup_ns`).
    pub duration_ns: u64,
    pub warmup_ns: u64,
    /// Bytes of the array the job works in (from offset 0); 0 = the whole array.
    pub region_bytes: u64,
    /// Put a request queue with this `nomerges` in front of the engine (the simulated
    /// runner always has one: `None` there is nomerges 2, plugging without merges).
    pub nomerges: Option<u8>,
    /// CPU profile of the simulated runner (`sim::cpu`): an era's name, `host` or `none`.
    pub cpu: String,
    /// Buffered I/O: the submitter copies each request's bytes through the page cache.
    pub buffered: bool,
    /// md threads handling stripes (md's raid5d alone: 1; `group_thread_cnt` workers).
    pub md_threads: usize,
    /// Also time the run's request stream through the queue on the host (seed 002's
    /// cross-check of the modelled queue).
    pub queue_replay: bool,
}

impl Job {
    /// `threads` submitters of `block_bytes` requests at `queue_depth` each, on the whole
    /// array, direct I/O, one md thread, a queue without merges; measured for 1 s after
    /// 100 ms (set `duration_ns` and `warmup_ns` for the experiment's own).
    pub fn new(
        op: RequestOp,
        access: Access,
        block_bytes: u64,
        threads: usize,
        queue_depth: usize,
        cpu: &str,
    ) -> Job {
        Job {
            op,
            access,
            block_bytes,
            threads,
            queue_depth,
            duration_ns: 1_000_000_000,
            warmup_ns: 100_000_000,
            region_bytes: 0,
            nomerges: None,
            cpu: cpu.to_string(),
            buffered: false,
            md_threads: 1,
            queue_replay: false,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct JobResult {
    pub ios: u64,
    pub bytes: u64,
    pub mbps: f64,
    pub iops: f64,
    /// Host time spent inside the engine during the measured window's run, ns.
    pub engine_cpu_ns: u64,
    /// Host time spent in the request queue, ns (fastest replay of the run's request stream).
    pub queue_cpu_ns: u64,
    /// How far the median replay was above the fastest: the measurement's resolution, ns.
    pub queue_cpu_noise_ns: u64,
    pub queue: QueueStats,
    pub member_reads: u64,
    pub member_writes: u64,
    pub virtual_ns: u64,
    /// The CPU profile the run was modelled with (empty on real members).
    pub cpu: String,
    pub cores: u32,
    /// Modelled time the submitting threads worked (system calls, block layer, md's
    /// make_request, their own member requests), ns of the measured window.
    pub submit_cpu_ns: u64,
    /// Modelled time the request queue in front of the array worked (part of the
    /// submitters' time, kept apart for seed 002).
    pub queue_model_ns: u64,
    /// Modelled time md's threads worked.
    pub md_cpu_ns: u64,
    pub md_stripe_passes: u64,
    pub md_page_bios: u64,
}

impl JobResult {
    /// Whether the CPU figures are modelled (a CPU profile other than `none`).
    pub fn cpu_modelled(&self) -> bool {
        !self.cpu.is_empty() && self.cpu != "none"
    }

    /// CPU used as a percentage of one core over the virtual time: the modelled threads'
    /// work, or without a model the engine's host time (plus the queue's replay).
    pub fn cpu_percent(&self) -> f64 {
        let ns = if self.cpu_modelled() {
            self.submit_cpu_ns + self.queue_model_ns + self.md_cpu_ns
        } else {
            self.engine_cpu_ns + self.queue_cpu_ns
        };
        ns as f64 * 100.0 / self.virtual_ns.max(1) as f64
    }
}

struct Worker {
    outstanding: usize,
    cursor: u64,
    start: u64,
    end: u64,
}

/// The client side of a job, shared by the simulated and the real runner: the workers,
/// where each reads or writes next, and the optional request queue in front of the array.
pub struct JobDriver {
    workers: Vec<Worker>,
    rng: u64,
    region: u64,
    next_id: RequestId,
    owner: std::collections::HashMap<RequestId, usize>,
    payload: Vec<u8>,
    queue: Option<RequestQueue>,
    /// The queue's CPU is measured afterwards by replaying this request stream (one timer
    /// around many requests: per-request timers would cost more than the queue itself).
    trace: Vec<Vec<(RequestOp, u64, u64)>>,
}

impl JobDriver {
    /// Workers over the first `region` bytes of the array, each sequential one in its own slice.
    pub fn new(job: &Job, region: u64, seed: u64) -> Self {
        let span = region / job.threads as u64 / job.block_bytes * job.block_bytes;
        JobDriver {
            workers: (0..job.threads as u64)
                .map(|t| Worker { outstanding: 0, cursor: t * span, start: t * span, end: (t + 1) * span })
                .collect(),
            rng: seed ^ 0x6a09e667f3bcc909,
            region,
            next_id: 1,
            owner: Default::default(),
            payload: vec![0xa5u8; job.block_bytes as usize],
            queue: job.nomerges.map(RequestQueue::new),
            trace: Vec::new(),
        }
    }

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Requests that bring every worker up to the job's queue depth, through the request
    /// queue when the job has one: hand them to the array as they are.
    pub fn top_up(&mut self, job: &Job) -> Vec<Request> {
        let bs = job.block_bytes;
        let mut batch = Vec::new();
        for w in 0..self.workers.len() {
            while self.workers[w].outstanding < job.queue_depth {
                let off = match job.access {
                    Access::Sequential => {
                        let worker = &mut self.workers[w];
                        if worker.cursor + bs > worker.end {
                            worker.cursor = worker.start;
                        }
                        worker.cursor += bs;
                        worker.cursor - bs
                    }
                    Access::Random => (self.next_random() % (self.region / bs).max(1)) * bs,
                };
                let id = self.next_id;
                self.next_id += 1;
                batch.push(match job.op {
                    RequestOp::Write => Request::write(id, off, self.payload.clone()),
                    _ => Request::read(id, off, bs),
                });
                self.owner.insert(id, w);
                self.workers[w].outstanding += 1;
            }
        }
        match self.queue.as_mut() {
            Some(q) if !batch.is_empty() => {
                self.trace.push(batch.iter().map(|r| (r.op, r.offset_bytes, r.len_bytes)).collect());
                for r in batch {
                    q.add(r);
                }
                q.unplug()
            }
            _ => batch,
        }
    }

    /// An array completion: how many of the workers' requests it finished (a merged one
    /// finishes several), or the first error.
    pub fn complete(&mut self, c: RequestCompletion) -> Result<u64, String> {
        let comps = match self.queue.as_mut() {
            Some(q) => q.complete(c),
            None => vec![c],
        };
        let mut finished = 0;
        for c in comps {
            if let Err(e) = c.result {
                return Err(format!("request {} failed: {e}", c.id));
            }
            let Some(w) = self.owner.remove(&c.id) else { continue };
            self.workers[w].outstanding -= 1;
            finished += 1;
        }
        Ok(finished)
    }

    /// The queue's figures into `r` (its CPU scaled to `r.ios`).
    pub fn finish(&self, r: &mut JobResult) {
        let Some(q) = &self.queue else { return };
        let total: usize = self.trace.iter().map(|b| b.len()).sum();
        let (fastest, median) = replay_queue_ns(q.nomerges(), &self.trace);
        r.queue_cpu_ns = (fastest / total.max(1) as f64 * r.ios as f64) as u64;
        r.queue_cpu_noise_ns = ((median - fastest) / total.max(1) as f64 * r.ios as f64) as u64;
        r.queue = q.stats;
    }
}

/// Runs one job of an experiment's grid on an array described by `config` (geometry,
/// tunables, missing members). The simulator takes `profile`, `member_bytes` and `seed` as
/// they are; a runner on real members keeps the level, layout, chunk, tunables and member
/// states, and sizes the array from its own members.
pub trait JobRunner {
    fn run(
        &mut self,
        config: ArrayConfig,
        profile: &str,
        member_bytes: u64,
        job: &Job,
        seed: u64,
    ) -> Result<JobResult, String>;
}

/// Host time for the request stream `trace` through a fresh queue (adds, unplug, and the
/// completion of every dispatched request): (fastest, median) of several replays, in ns.
pub(crate) fn replay_queue_ns(nomerges: u8, trace: &[Vec<(RequestOp, u64, u64)>]) -> (f64, f64) {
    let mut times = Vec::new();
    for _ in 0..15 {
        let mut q = RequestQueue::new(nomerges);
        let mut id = 0;
        let t = Instant::now();
        for batch in trace {
            for &(op, off, len) in batch {
                id += 1;
                q.add(Request { id, op, offset_bytes: off, len_bytes: len, fua: false, data: Vec::new() });
            }
            for r in q.unplug() {
                std::hint::black_box(q.complete(RequestCompletion { id: r.id, result: Ok(Vec::new()) }));
            }
        }
        times.push(t.elapsed().as_nanos() as f64);
    }
    times.sort_by(f64::total_cmp);
    (times[0], times[times.len() / 2])
}

/// Members for an experiment: all in sync, data at 1 MiB, except the `missing` slots.
pub fn array_config(geometry: uraid_core::Geometry, tunables: Tunables, missing: &[usize]) -> ArrayConfig {
    let members = (0..geometry.raid_disks)
        .map(|m| MemberConfig {
            data_offset_bytes: 1 << 20,
            state: if missing.contains(&m) { MemberState::Missing } else { MemberState::InSync },
        })
        .collect();
    ArrayConfig { geometry, members, tunables, read_only: false }
}
