//! [`run_job`]: a job on simulated disks, with the submitters and md's threads as modelled
//! threads on modelled cores ([`crate::cpu`]).
//!
//! Each of the job's workers is a thread of its own (fio's job thread, tiobench's): it
//! reaps the completions that arrived, then submits as many requests as bring it back to
//! its queue depth through the block layer's request queue, each reaching the array when
//! the thread has done its work. Completions that arrive while it works wait for its next
//! round, as fio's do. With the `none` model every cost is zero and the workers react
//! at the instant of each completion.

use std::collections::HashMap;

use uraid_core::queue::RequestQueue;
use uraid_core::*;

use super::{Access, Job, JobResult, JobRunner, TimedEngine};
use crate::array::{RunOutcome, SimArray};
use crate::cpu::{Cores, CpuCosts, Thread};
use crate::disks::{SimDisks, SimMemberConfig};
use crate::md_threads::{MdLayout, MdThreads, MdWork};

struct Worker {
    thread: Thread,
    outstanding: usize,
    /// Completions that arrived and wait to be reaped.
    arrived: usize,
    cursor: u64,
    start: u64,
    end: u64,
}

/// What one request costs its submitter: the request through the system calls and the
/// block layer to md, md's make_request, and the member requests it sends itself.
pub fn submit_cost_ns(cpu: &CpuCosts, layout: &MdLayout, job: &Job, req: &Request) -> f64 {
    let plan = layout.plan(req);
    let buffered = if job.buffered { cpu.copy_ns(req.len_bytes) } else { 0.0 };
    cpu.submit_request_ns
        + cpu.bio_ns
        + cpu.md_request_ns
        + plan.direct_pieces as f64 * (cpu.bio_ns + cpu.member_request_ns)
        + plan.stripe_pages as f64 * cpu.md_page_ns
        + buffered
}

/// The request queue's work for what `before` to `after` added, in ns.
fn queue_cost_ns(cpu: &CpuCosts, nomerges: u8, before: &queue::QueueStats, after: &queue::QueueStats) -> f64 {
    let added = (after.requests - before.requests) as f64;
    let attempts = (after.merge_attempts - before.merge_attempts) as f64;
    let merges = (after.merges - before.merges) as f64;
    // nomerges 0 looks a request's neighbours up by end and start, files each request it
    // holds under both, and refiles a request it grows.
    let hash_ops = if nomerges == 0 { 2.0 * added + 2.0 * (added - merges) + 4.0 * merges } else { 0.0 };
    added * cpu.queue_request_ns + attempts * cpu.queue_merge_attempt_ns + hash_ops * cpu.queue_hash_ns
}

struct Busy {
    submit_ns: u64,
    queue_ns: f64,
}

/// Counters at the end of the warm-up, subtracted from the final ones.
struct AtWarmup {
    busy: Busy,
    md: MdWork,
    engine_host_ns: u64,
    member_reads: u64,
    member_writes: u64,
}

/// Run `job` against an engine built from `config` on simulated members of `profile`,
/// with the CPU model `cpu`.
pub fn run_job(
    config: ArrayConfig,
    profile: &str,
    member_bytes: u64,
    job: &Job,
    seed: u64,
    cpu: &CpuCosts,
) -> Result<JobResult, String> {
    let n = config.geometry.raid_disks;
    let layout = MdLayout::new(&config);
    let engine = Engine::new(config.clone()).map_err(|e| e.to_string())?;
    let size = engine.size_bytes();
    let sims: Vec<SimMemberConfig> = (0..n)
        .map(|_| SimMemberConfig::builtin(profile, member_bytes))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let disks = SimDisks::new(sims, seed).map_err(|e| e.to_string())?;
    let cores = Cores::shared(cpu.cores);
    let md = MdThreads::new(
        TimedEngine { inner: engine, cpu_ns: 0 },
        &config,
        cpu.clone(),
        cores.clone(),
        job.md_threads,
    );
    let mut array = SimArray::new(md, disks);
    // Member disks sit behind a block-layer queue that merges what md sends them at once.
    array.set_member_merging(true);
    let region = if job.region_bytes == 0 { size } else { job.region_bytes.min(size) };
    let bs = job.block_bytes;
    let span = region / job.threads as u64 / bs * bs;
    if span == 0 {
        return Err(format!("the array ({size} bytes) is too small for this job"));
    }
    let mut workers: Vec<Worker> = (0..job.threads as u64)
        .map(|t| Worker {
            thread: Thread::default(),
            outstanding: 0,
            arrived: 0,
            cursor: t * span,
            start: t * span,
            end: (t + 1) * span,
        })
        .collect();
    let nomerges = job.nomerges.unwrap_or(2);
    let mut queue = RequestQueue::new(nomerges);
    let mut rng = seed ^ 0x6a09e667f3bcc909;
    let mut next_id: RequestId = 1;
    let mut owner: HashMap<RequestId, usize> = HashMap::new();
    let payload = vec![0xa5u8; bs as usize];
    let mut trace: Vec<Vec<(RequestOp, u64, u64)>> = Vec::new();
    let end_ns = job.warmup_ns + job.duration_ns;
    let mut result = JobResult { cpu: cpu.name.clone(), cores: cpu.cores, ..JobResult::default() };
    let mut busy = Busy { submit_ns: 0, queue_ns: 0.0 };
    let mut at_warmup: Option<AtWarmup> = None;
    loop {
        let now = array.now_ns();
        if at_warmup.is_none() && now >= job.warmup_ns {
            let s = array.engine().inner().inner.stats();
            at_warmup = Some(AtWarmup {
                busy: Busy { submit_ns: busy.submit_ns, queue_ns: busy.queue_ns },
                md: array.engine().work.clone(),
                engine_host_ns: array.engine().inner().cpu_ns,
                member_reads: s.member_reads(),
                member_writes: s.member_writes(),
            });
        }
        // Workers whose thread is free reap what arrived and fill up again.
        #[allow(clippy::needless_range_loop)] // the loop body borrows `workers[w]` anew, piecewise
        for w in 0..workers.len() {
            let refill = now < end_ns && workers[w].outstanding < job.queue_depth;
            if workers[w].thread.free_at_ns > now || (workers[w].arrived == 0 && !refill) {
                continue;
            }
            workers[w].arrived = 0;
            if !refill {
                continue;
            }
            let mut batch = Vec::new();
            while workers[w].outstanding < job.queue_depth {
                let off = match job.access {
                    Access::Sequential => {
                        let wk = &mut workers[w];
                        if wk.cursor + bs > wk.end {
                            wk.cursor = wk.start;
                        }
                        wk.cursor += bs;
                        wk.cursor - bs
                    }
                    Access::Random => {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        (rng % (region / bs).max(1)) * bs
                    }
                };
                let id = next_id;
                next_id += 1;
                let req = match job.op {
                    RequestOp::Write => Request::write(id, off, payload.clone()),
                    _ => Request::read(id, off, bs),
                };
                let cost = submit_cost_ns(cpu, &layout, job, &req);
                owner.insert(id, w);
                workers[w].outstanding += 1;
                batch.push((req, cost));
            }
            // fio submits each I/O as soon as it is ready, under a plug of its own
            // (iodepth_batch_submit=1); the page cache's writeback submits its batch under
            // one plug.
            let plugs: Vec<Vec<(Request, f64)>> =
                if job.buffered { vec![batch] } else { batch.into_iter().map(|rc| vec![rc]).collect() };
            for plug in plugs {
                if job.queue_replay {
                    trace.push(plug.iter().map(|(r, _)| (r.op, r.offset_bytes, r.len_bytes)).collect());
                }
                let before = queue.stats;
                let cost: f64 = plug.iter().map(|(_, c)| c).sum();
                for (r, _) in plug {
                    queue.add(r);
                }
                let dispatched = queue.unplug();
                let qcost = queue_cost_ns(cpu, nomerges, &before, &queue.stats);
                let end = workers[w].thread.run(&cores, now, cost + qcost);
                busy.submit_ns += cost.round() as u64;
                busy.queue_ns += qcost;
                for r in dispatched {
                    array.submit_at(end, r);
                }
            }
        }
        if now >= end_ns {
            break;
        }
        // Next: a worker's thread freeing with work to do, a completion, or the end.
        let wake = workers
            .iter()
            .filter(|w| w.thread.free_at_ns > now && (w.arrived > 0 || w.outstanding < job.queue_depth))
            .map(|w| w.thread.free_at_ns)
            .min()
            .unwrap_or(end_ns)
            .min(end_ns);
        let limit = if at_warmup.is_none() { wake.min(job.warmup_ns.max(now)) } else { wake };
        let outcome = array.run_until_completion(limit.max(now + 1));
        for tc in array.take_completions() {
            for c in queue.complete(tc.completion) {
                if let Err(e) = c.result {
                    return Err(format!("request {} failed: {e}", c.id));
                }
                let Some(w) = owner.remove(&c.id) else { continue };
                workers[w].outstanding -= 1;
                workers[w].arrived += 1;
                if tc.completed_ns >= job.warmup_ns && tc.completed_ns < end_ns {
                    result.ios += 1;
                    result.bytes += bs;
                }
            }
        }
        match outcome {
            RunOutcome::Stalled => return Err("the engine stalled".into()),
            RunOutcome::PowerLost { .. } => return Err("unexpected power loss".into()),
            RunOutcome::Idle if array.now_ns() < limit => {
                // Nothing in flight: the clock moves on to the next worker's wake-up.
                let mut none = Vec::new();
                array.disks_mut().advance_to(limit, &mut none);
            }
            _ => {}
        }
    }
    let w0 = at_warmup.unwrap_or(AtWarmup {
        busy: Busy { submit_ns: 0, queue_ns: 0.0 },
        md: MdWork::default(),
        engine_host_ns: 0,
        member_reads: 0,
        member_writes: 0,
    });
    let md = &array.engine().work;
    result.submit_cpu_ns = busy.submit_ns - w0.busy.submit_ns;
    result.queue_model_ns = (busy.queue_ns - w0.busy.queue_ns).round() as u64;
    result.md_cpu_ns = md.busy_ns - w0.md.busy_ns;
    result.md_stripe_passes = md.stripe_passes - w0.md.stripe_passes;
    result.md_page_bios = md.page_bios - w0.md.page_bios;
    result.engine_cpu_ns = array.engine().inner().cpu_ns - w0.engine_host_ns;
    let s = array.engine().inner().inner.stats();
    result.member_reads = s.member_reads() - w0.member_reads;
    result.member_writes = s.member_writes() - w0.member_writes;
    result.queue = queue.stats;
    if job.queue_replay {
        let total: usize = trace.iter().map(|b| b.len()).sum();
        let (fastest, median) = super::replay_queue_ns(nomerges, &trace);
        result.queue_cpu_ns = (fastest / total.max(1) as f64 * result.ios as f64) as u64;
        result.queue_cpu_noise_ns = ((median - fastest) / total.max(1) as f64 * result.ios as f64) as u64;
    }
    result.virtual_ns = job.duration_ns;
    let secs = job.duration_ns as f64 / 1e9;
    result.mbps = result.bytes as f64 / secs / 1e6;
    result.iops = result.ios as f64 / secs;
    Ok(result)
}

/// [`run_job`] on simulated disks with the job's CPU model: `uraid reproduce`.
pub struct SimRunner;

impl JobRunner for SimRunner {
    fn run(
        &mut self,
        config: ArrayConfig,
        profile: &str,
        member_bytes: u64,
        job: &Job,
        seed: u64,
    ) -> Result<JobResult, String> {
        let cpu = crate::cpu::CpuCosts::named(&job.cpu).map_err(|e| e.to_string())?;
        run_job(config, profile, member_bytes, job, seed, &cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::array_config;
    use crate::RunOutcome;
    use uraid_core::testing::MirrorEngine;

    /// `run_until_completion` stops at the first completion, at its time.
    #[test]
    fn run_until_completion_stops_at_each_completion() {
        let disks =
            SimDisks::new((0..2).map(|_| SimMemberConfig::builtin("nvme", 1 << 30).unwrap()).collect(), 1)
                .unwrap();
        let mut a = SimArray::new(MirrorEngine::new(2, 1 << 30, 0), disks);
        a.submit_at(0, Request::read(1, 0, 4096));
        a.submit_at(5_000_000, Request::read(2, 0, 4096));
        assert_eq!(a.run_until_completion(1_000_000_000), RunOutcome::TimeReached);
        let first = a.take_completions();
        assert_eq!(first.len(), 1);
        assert!(a.now_ns() < 5_000_000 && a.now_ns() == first[0].completed_ns);
        a.run_until_completion(1_000_000_000);
        assert_eq!(a.take_completions()[0].completion.id, 2);
    }

    fn job(threads: usize, cpu: &str) -> Job {
        Job {
            duration_ns: 50_000_000,
            warmup_ns: 5_000_000,
            nomerges: Some(2),
            ..Job::new(RequestOp::Read, Access::Random, 4096, threads, 8, cpu)
        }
    }

    /// A submitter that spends 50 µs per request does no more than 20 000 a second, and
    /// two of them on one core no more than that together.
    #[test]
    fn submitters_are_bound_by_their_cpu() {
        let g = Geometry::new(Level::Raid0, 2, 0, 128, &[((1 << 30) - (1 << 20)) / 512; 2]).unwrap();
        let config = || array_config(g.clone(), Tunables::default(), &[]);
        let slow =
            CpuCosts { name: "test".into(), cores: 2, submit_request_ns: 50_000.0, ..CpuCosts::none() };
        let one = run_job(config(), "nvme", 1 << 30, &job(1, "test"), 1, &slow).unwrap();
        assert!((one.iops - 20_000.0).abs() < 600.0, "{}", one.iops);
        assert!(one.submit_cpu_ns > 40_000_000, "{}", one.submit_cpu_ns);
        let free = run_job(config(), "nvme", 1 << 30, &job(1, "none"), 1, &CpuCosts::none()).unwrap();
        assert!(free.iops > 60_000.0, "{}", free.iops);
        let one_core = CpuCosts { cores: 1, ..slow.clone() };
        let two = run_job(config(), "nvme", 1 << 30, &job(2, "test"), 1, &one_core).unwrap();
        assert!((two.iops - 20_000.0).abs() < 600.0, "{}", two.iops);
        let two_cores = run_job(config(), "nvme", 1 << 30, &job(2, "test"), 1, &slow).unwrap();
        assert!((two_cores.iops - 40_000.0).abs() < 1200.0, "{}", two_cores.iops);
    }
}
