//! The engine's own cost, in process: RAID6 8+2 on members held in RAM (no executor, no
//! syscalls), next to the raw parity work the same bytes need, measured in the same run.
//!
//! Engine time is wall time minus two things that are not the engine's: the RAM members'
//! copies (the executor's work) and building each request's payload (the caller's buffer).
//! Both are timed and reported. glibc's malloc is told to keep 1 MiB buffers on its heap
//! (`M_MMAP_THRESHOLD`/`M_TRIM_THRESHOLD`, see [`crate::real::keep_large_buffers_on_heap`]), as a
//! long-running server would, so page faults of fresh mmaps do not dominate.

use std::time::Instant;

use uraid_core::geometry::algorithm;
use uraid_core::*;

#[derive(Clone, Debug)]
pub struct EngineBenchRow {
    /// `randwrite-4k` or `seqwrite-1m`.
    pub workload: &'static str,
    pub requests: u64,
    /// Requests per second of wall time (engine, members and caller together).
    pub requests_per_s: f64,
    /// Bytes written per second of engine time.
    pub gbps: f64,
    /// Engine time per request (planning, bookkeeping and its parity), member copies and
    /// the caller's payload building excluded.
    pub engine_ns_per_request: f64,
    /// RAM members' copies per request (excluded above).
    pub member_ns_per_request: f64,
    /// Building the request payload per request (excluded above).
    pub caller_ns_per_request: f64,
    /// Full-stripe writes only: the peer, measured in the same run, copying the same
    /// requests' bytes into stripe buffers and computing P/Q with no engine.
    pub peer_gbps: Option<f64>,
    /// `gbps / peer_gbps`.
    pub ratio: Option<f64>,
}

impl EngineBenchRow {
    /// The figure the target is about, smaller being better: engine time per request, or
    /// the ratio to the peer (negated).
    fn target_figure(&self) -> f64 {
        self.ratio.map_or(self.engine_ns_per_request, |r| -r)
    }

    /// The issue's target for this workload, and whether this run met it.
    pub fn target(&self) -> (&'static str, bool) {
        match self.ratio {
            Some(r) => (">= 0.7x peer", r >= 0.7),
            None => ("< 2000 ns/req", self.engine_ns_per_request < 2000.0),
        }
    }
}

struct RamMembers {
    images: Vec<Vec<u8>>,
}

impl RamMembers {
    /// `n` members of `bytes`, every page touched up front so no member copy page-faults.
    fn new(n: usize, bytes: u64) -> Self {
        RamMembers { images: (0..n).map(|_| vec![0x11u8; bytes as usize]).collect() }
    }

    fn perform(&mut self, io: MemberIo) -> MemberIoCompletion {
        let img = &mut self.images[io.member];
        let (a, b) = (io.offset_bytes as usize, (io.offset_bytes + io.len_bytes) as usize);
        let result = match io.op {
            // Into the spare buffer the engine hands over, as the real executor reads.
            MemberIoOp::Read => Ok(match io.data.try_into_unique_vec() {
                Ok(mut v) if v.capacity() >= b - a => {
                    v.clear();
                    v.extend_from_slice(&img[a..b]);
                    v
                }
                _ => img[a..b].to_vec(),
            }),
            MemberIoOp::Write => {
                img[a..b].copy_from_slice(&io.data);
                Ok(Vec::new())
            }
            MemberIoOp::Flush => Ok(Vec::new()),
        };
        MemberIoCompletion { id: io.id, result }
    }
}

/// Pick the parity kernel (a short benchmark at first use, as at md's boot) before any timing.
fn warm_up_parity() {
    let _ = uraid_parity::selected_kernel();
}

fn engine(member_bytes: u64) -> Engine {
    let n = 10;
    let geo = Geometry::new(Level::Raid6, n, algorithm::LEFT_SYMMETRIC, 128, &vec![member_bytes / 512; n])
        .expect("geometry");
    let members = vec![MemberConfig { data_offset_bytes: 0, state: MemberState::InSync }; n];
    Engine::new(ArrayConfig { geometry: geo, members, tunables: Tunables::default(), read_only: false })
        .expect("engine")
}

struct Timing {
    total_s: f64,
    engine_s: f64,
    member_s: f64,
    caller_s: f64,
}

/// Run `requests` writes of `len` bytes at queue depth 32; offsets from `next_offset`.
fn drive(
    engine: &mut Engine,
    members: &mut RamMembers,
    requests: u64,
    len: u64,
    mut next_offset: impl FnMut(u64) -> u64,
) -> Timing {
    let qd = 32u64;
    let payload = vec![0x5au8; len as usize];
    let mut submitted = 0u64;
    let mut done = 0u64;
    let mut caller_ns = 0u128;
    let mut scratch = Vec::new();
    let mut ex = TimedMembers { members, issued: Vec::new(), member_ns: 0 };
    let start = Instant::now();
    let mut now = 0u64;
    while done < requests {
        while submitted < requests && submitted - done < qd {
            let t = Instant::now();
            let req = Request::write(submitted, next_offset(submitted), payload.clone());
            caller_ns += t.elapsed().as_nanos();
            engine.submit(req, now).expect("queue depth stays under the engine's limit");
            submitted += 1;
        }
        engine.unplug(now);
        now += 1;
        let pumped = uraid_core::drive::pump(engine, &mut ex, &mut || now, &mut scratch, |c| {
            assert!(c.result.is_ok(), "bench write failed: {:?}", c.result);
            done += 1;
        });
        if !pumped.any() {
            if let Some(d) = engine.next_deadline_ns() {
                now = now.max(d);
                engine.tick(now);
            }
        }
    }
    let total_s = start.elapsed().as_secs_f64();
    let (member_s, caller_s) = (ex.member_ns as f64 / 1e9, caller_ns as f64 / 1e9);
    Timing { total_s, engine_s: total_s - member_s - caller_s, member_s, caller_s }
}

/// The members as the bench's executor: what a pass issued is performed when the driver
/// polls, in one batch timed apart from the engine's work.
struct TimedMembers<'a> {
    members: &'a mut RamMembers,
    issued: Vec<MemberIo>,
    member_ns: u128,
}

impl uraid_core::drive::MemberExecutor for TimedMembers<'_> {
    fn issue(&mut self, io: MemberIo) {
        self.issued.push(io);
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        if self.issued.is_empty() {
            return;
        }
        let t = Instant::now();
        out.extend(self.issued.drain(..).map(|io| self.members.perform(io)));
        self.member_ns += t.elapsed().as_nanos();
    }
}

/// The work a full-stripe write cannot avoid, with no engine: for each request of `len`
/// bytes, a fresh copy of the payload (built untimed, as the engine's caller builds it, so
/// the input is as warm as the engine's), copied into one set of stripe buffers (8 x 64 KiB,
/// always the same, so warm) and P/Q computed over it.
fn peer_gbps(requests: u64, len: u64) -> f64 {
    let chunk = 64 << 10;
    let payload = vec![0x5au8; len as usize];
    let mut data: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; chunk]).collect();
    let (mut p, mut q) = (vec![0u8; chunk], vec![0u8; chunk]);
    let mut timed = std::time::Duration::ZERO;
    for _ in 0..requests {
        let src = payload.clone();
        let t = Instant::now();
        for stripe in src.chunks(8 * chunk) {
            for (d, s) in data.iter_mut().zip(stripe.chunks(chunk)) {
                d[..s.len()].copy_from_slice(s);
            }
            let refs: [&[u8]; 8] = std::array::from_fn(|i| data[i].as_slice());
            uraid_parity::gen_syndrome(&refs, &mut p, &mut q);
        }
        timed += t.elapsed();
        std::hint::black_box((&p, &src));
    }
    (requests * len) as f64 / timed.as_secs_f64() / 1e9
}

const MEMBER_BYTES: u64 = 64 << 20;

fn row(workload: &'static str, requests: u64, len: u64, t: &Timing, peer: Option<f64>) -> EngineBenchRow {
    let gbps = requests as f64 * len as f64 / t.engine_s / 1e9;
    let per = |s: f64| s * 1e9 / requests as f64;
    EngineBenchRow {
        workload,
        requests,
        requests_per_s: requests as f64 / t.total_s,
        gbps,
        engine_ns_per_request: per(t.engine_s),
        member_ns_per_request: per(t.member_s),
        caller_ns_per_request: per(t.caller_s),
        peer_gbps: peer,
        ratio: peer.map(|p| gbps / p),
    }
}

/// 4 KiB random writes: read-modify-write of one block per request.
pub fn randwrite_4k(scale: f64) -> EngineBenchRow {
    crate::real::keep_large_buffers_on_heap();
    warm_up_parity();
    let mut e = engine(MEMBER_BYTES);
    let mut m = RamMembers::new(10, MEMBER_BYTES);
    let array_bytes = MEMBER_BYTES * 8;
    let requests = ((200_000.0 * scale) as u64).max(1);
    let mut x = 0x9e3779b97f4a7c15u64;
    let t = drive(&mut e, &mut m, requests, 4096, |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % (array_bytes / 4096)) * 4096
    });
    row("randwrite-4k", requests, 4096, &t, None)
}

/// 1 MiB sequential writes: two full stripes each.
pub fn seqwrite_1m(scale: f64) -> EngineBenchRow {
    crate::real::keep_large_buffers_on_heap();
    warm_up_parity();
    let mut e = engine(MEMBER_BYTES);
    let mut m = RamMembers::new(10, MEMBER_BYTES);
    let array_bytes = MEMBER_BYTES * 8;
    let len = 1u64 << 20;
    let requests = ((4000.0 * scale) as u64).max(1);
    let t = drive(&mut e, &mut m, requests, len, |i| (i * len) % array_bytes);
    row("seqwrite-1m", requests, len, &t, Some(peer_gbps(requests, len)))
}

/// Every workload, each the median of `runs` runs by the figure its target is about;
/// `scale` 1.0 is a few seconds per run.
pub fn run(scale: f64, runs: usize) -> Vec<EngineBenchRow> {
    let workloads: [fn(f64) -> EngineBenchRow; 2] = [randwrite_4k, seqwrite_1m];
    workloads
        .into_iter()
        .map(|workload| {
            let all: Vec<EngineBenchRow> = (0..runs.max(1)).map(|_| workload(scale)).collect();
            crate::bench::median_by(all, EngineBenchRow::target_figure).expect("at least one run")
        })
        .collect()
}
