//! What uraid's own work costs on this machine: the figures the simulator's CPU model
//! ([`crate::cpu`]) scales to the seeds' CPUs. `uraid bench cpu` prints them in the
//! form of `profiles/cpu-host.toml`.
//!
//! Each figure is a difference between two runs of the real engine (or queue) that differ
//! in one unit of work only, with member I/Os completed in process at once (no executor,
//! no syscalls); every run is repeated and the fastest kept, so other load on the machine
//! inflates nothing. Units follow md's: the engine is given 4 KiB chunks, so its stripe
//! heads are md's 4 KiB stripe_heads and each member I/O one md page bio.

use std::time::Instant;

use uraid_core::geometry::algorithm;
use uraid_core::queue::RequestQueue;
use uraid_core::*;

use crate::cpu::HostCpuFigures;

/// Fastest of `runs` timings of `f`, in ns.
fn fastest_ns(runs: usize, mut f: impl FnMut() -> u64) -> f64 {
    (0..runs).map(|_| f()).min().unwrap_or(0) as f64
}

fn engine_for(level: Level, n: usize, chunk_bytes: u64, tunables: Tunables) -> Engine {
    let member_bytes = 1u64 << 30;
    let layout = if level == Level::Raid0 { 0 } else { algorithm::LEFT_SYMMETRIC };
    let geo =
        Geometry::new(level, n, layout, chunk_bytes / 512, &vec![member_bytes / 512; n]).expect("geometry");
    let members = vec![MemberConfig { data_offset_bytes: 0, state: MemberState::InSync }; n];
    Engine::new(ArrayConfig { geometry: geo, members, tunables, read_only: false }).expect("engine")
}

/// Host ns for `requests` requests from `make` (by index) through `engine`, `depth` at a
/// time; member I/Os complete at once (reads with zeroes). Only engine calls are timed.
fn engine_run_ns(engine: &mut Engine, requests: u64, depth: u64, make: &dyn Fn(u64) -> Request) -> u64 {
    let mut timed = 0u64;
    let mut next = 0u64;
    let mut done = 0u64;
    let mut now = 0u64;
    let mut ex = ZeroMembers::default();
    let mut scratch = Vec::new();
    while done < requests {
        let batch: Vec<Request> = (0..depth.min(requests - next))
            .map(|_| {
                next += 1;
                make(next)
            })
            .collect();
        let t = Instant::now();
        for r in batch {
            engine.submit(r, now).expect("engine accepts");
        }
        engine.unplug(now);
        timed += t.elapsed().as_nanos() as u64;
        loop {
            now += 1_000;
            let t = Instant::now();
            let pumped = drive::pump(engine, &mut ex, &mut || now, &mut scratch, |_| done += 1);
            timed += t.elapsed().as_nanos() as u64;
            if !pumped.any() {
                break;
            }
            ex.answer();
        }
    }
    timed
}

/// Members that answer at once (reads with zeroes). The answers are made between the
/// driver's passes, outside the timed part, so only the engine's work is timed.
#[derive(Default)]
struct ZeroMembers {
    issued: Vec<MemberIo>,
    done: Vec<MemberIoCompletion>,
}

impl ZeroMembers {
    fn answer(&mut self) {
        self.done.extend(self.issued.drain(..).map(|io| {
            let data = if io.op == MemberIoOp::Read { vec![0u8; io.len_bytes as usize] } else { Vec::new() };
            MemberIoCompletion { id: io.id, result: Ok(data) }
        }));
    }
}

impl drive::MemberExecutor for ZeroMembers {
    fn issue(&mut self, io: MemberIo) {
        self.issued.push(io);
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        out.append(&mut self.done);
    }
}

/// ns per request of `make`'s requests on a fresh engine from `engine`, fastest of `runs`.
fn per_request_ns(
    runs: usize,
    requests: u64,
    new: &dyn Fn() -> Engine,
    make: &dyn Fn(u64) -> Request,
) -> f64 {
    fastest_ns(runs, || {
        let mut e = new();
        engine_run_ns(&mut e, requests, 32, make)
    }) / requests as f64
}

/// Bytes per second of one thread copying `len`-byte buffers, `total` bytes in all.
fn copy_rate(runs: usize, len: usize, total: u64) -> f64 {
    let src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    let rounds = (total / len as u64).max(1);
    let ns = fastest_ns(runs, || {
        let t = Instant::now();
        for _ in 0..rounds {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        t.elapsed().as_nanos() as u64
    });
    (rounds * len as u64) as f64 / (ns / 1e9)
}

/// Data bytes per second of gen_syndrome over 8 data blocks of 64 KiB with the AVX2 kernel
/// (0 where the host has none).
fn parity_avx2_rate(runs: usize) -> f64 {
    let Some(kernel) = uraid_parity::Kernel::from_name("avx2").filter(|k| k.is_available()) else {
        return 0.0;
    };
    let block = 64 << 10;
    let data: Vec<Vec<u8>> = (0..8).map(|i| vec![i as u8 + 1; block]).collect();
    let slots: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let (mut p, mut q) = (vec![0u8; block], vec![0u8; block]);
    let rounds = 512u64;
    let ns = fastest_ns(runs, || {
        let t = Instant::now();
        for _ in 0..rounds {
            kernel.gen_syndrome(std::hint::black_box(&slots), &mut p, &mut q);
        }
        t.elapsed().as_nanos() as u64
    });
    (rounds * 8 * block as u64) as f64 / (ns / 1e9)
}

/// Host ns for a stream of random 4 KiB reads (batches of 32, the way seed 002's jobs
/// arrive) through a fresh queue: added, dispatched and each dispatched one completed.
fn queue_run_ns(nomerges: u8, batches: u64) -> (u64, u64) {
    let mut q = RequestQueue::new(nomerges);
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut id = 0;
    let t = Instant::now();
    for _ in 0..batches {
        for _ in 0..32 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            id += 1;
            q.add(Request::read(id, (rng % (1 << 25)) * 4096, 4096));
        }
        for r in q.unplug() {
            std::hint::black_box(q.complete(RequestCompletion { id: r.id, result: Ok(Vec::new()) }));
        }
    }
    (t.elapsed().as_nanos() as u64, q.stats.merge_attempts)
}

/// Measure every figure; `scale` shortens the runs (1.0: about ten seconds).
pub fn measure(scale: f64) -> HostCpuFigures {
    let _ = uraid_parity::selected_kernel();
    let runs = 7;
    let n = ((20_000.0 * scale) as u64).max(500);
    let raid0 = || engine_for(Level::Raid0, 4, 4096, Tunables::default());
    let write =
        |bytes: u64| move |i: u64| Request::write(i, (i * 7919 % 50_000) * 65536, vec![0x5a; bytes as usize]);
    // raid0 with 4 KiB chunks: a 4 KiB write is one member I/O, a 16 KiB write four.
    let one = per_request_ns(runs, n, &raid0, &write(4096));
    let four = per_request_ns(runs, n, &raid0, &write(16384));
    let member_io = ((four - one) / 3.0).max(0.0);
    let request = (one - member_io).max(0.0);
    // raid5 with 4 KiB chunks through the stripe cache: a 4 KiB read is one stripe head,
    // handled when it arrives and when its read completes, one member I/O, one 4 KiB copy.
    let cached = Tunables { aligned_read_bypass: false, ..Tunables::default() };
    let raid5 = || engine_for(Level::Raid5, 4, 4096, cached.clone());
    let read = |i: u64| Request::read(i, (i * 7919 % 100_000) * 4096, 4096);
    let via_cache = per_request_ns(runs, n, &raid5, &read);
    // The engine's 4 KiB copy is of data in the cache; md's copies (below) are of memory.
    let cached_copy = copy_rate(runs, 4096, 256 << 20);
    let stripe = ((via_cache - request - member_io - 4096.0 / cached_copy * 1e9) / 2.0).max(0.0);
    let copy = copy_rate(runs, 64 << 20, 256 << 20);
    let batches = (n / 8).max(100);
    let q = |nm: u8| {
        let mut attempts = 0;
        let ns = fastest_ns(runs, || {
            let (ns, a) = queue_run_ns(nm, batches);
            attempts = a;
            ns
        });
        (ns / (batches * 32) as f64, attempts as f64 / (batches * 32) as f64)
    };
    let (q2, _) = q(2);
    let (q1, a1) = q(1);
    let (q0, a0) = q(0);
    let attempt = ((q1 - q2) / a1.max(1e-9)).max(0.0);
    // nomerges 0 adds a back and a front lookup per request and two insertions per held one.
    let hash = ((q0 - q1 - (a0 - a1) * attempt) / 4.0).max(0.0);
    HostCpuFigures {
        engine_request_ns: request,
        engine_member_io_ns: member_io,
        engine_stripe_ns: stripe,
        copy_bytes_per_s: copy,
        parity_avx2_bytes_per_s: parity_avx2_rate(runs),
        queue_request_ns: q2,
        queue_merge_attempt_ns: attempt,
        queue_hash_ns: hash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every figure comes out positive and in a plausible range on any machine.
    #[test]
    fn figures_are_measured() {
        let f = measure(0.05);
        assert!(f.engine_request_ns > 0.0 && f.engine_request_ns < 100_000.0, "{f:?}");
        assert!(f.engine_stripe_ns > 0.0, "{f:?}");
        assert!(f.copy_bytes_per_s > 1e8, "{f:?}");
        assert!(f.queue_request_ns > 0.0, "{f:?}");
    }
}
