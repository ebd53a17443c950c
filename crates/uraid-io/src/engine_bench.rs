//! The engine's own cost, in process: RAID6 8+2 on members held in RAM (no executor, no
//! syscalls), next to the raw parity work the same bytes need, measured in the same run.

use std::time::Instant;

use uraid_core::geometry::algorithm;
use uraid_core::*;

#[derive(Clone, Debug)]
pub struct EngineBenchRow {
    /// `randwrite-4k` or `seqwrite-1m`.
    pub workload: &'static str,
    pub requests: u64,
    pub requests_per_s: f64,
    pub gbps: f64,
    /// Engine time per request (planning, bookkeeping and its parity), member copies excluded.
    pub engine_ns_per_request: f64,
    /// The peer: copying the data in and computing P/Q for it with no engine (full stripes).
    pub peer_gbps: f64,
    pub ratio: f64,
}

struct RamMembers {
    images: Vec<Vec<u8>>,
}

impl RamMembers {
    fn perform(&mut self, io: MemberIo) -> MemberIoCompletion {
        let img = &mut self.images[io.member];
        let (a, b) = (io.offset_bytes as usize, (io.offset_bytes + io.len_bytes) as usize);
        let result = match io.op {
            MemberIoOp::Read => Ok(img[a..b].to_vec()),
            MemberIoOp::Write => {
                img[a..b].copy_from_slice(&io.data);
                Ok(Vec::new())
            }
            MemberIoOp::Flush => Ok(Vec::new()),
        };
        MemberIoCompletion { id: io.id, result }
    }
}

fn engine(member_bytes: u64) -> Engine {
    let n = 10;
    let geo = Geometry::new(Level::Raid6, n, algorithm::LEFT_SYMMETRIC, 128, &vec![member_bytes / 512; n])
        .expect("geometry");
    let members = vec![MemberConfig { data_offset_bytes: 0, state: MemberState::InSync }; n];
    Engine::new(ArrayConfig { geometry: geo, members, tunables: Tunables::default(), read_only: false })
        .expect("engine")
}

/// Run `requests` writes of `len` bytes at queue depth 32; offsets from `next_offset`.
fn drive(
    engine: &mut Engine,
    members: &mut RamMembers,
    requests: u64,
    len: u64,
    mut next_offset: impl FnMut(u64) -> u64,
) -> (f64, f64) {
    let qd = 32u64;
    let payload = vec![0x5au8; len as usize];
    let mut submitted = 0u64;
    let mut done = 0u64;
    let mut member_ns = 0u128;
    let start = Instant::now();
    let mut now = 0u64;
    while done < requests {
        while submitted < requests && submitted - done < qd {
            let req = Request::write(submitted, next_offset(submitted), payload.clone());
            engine.submit(req, now).expect("queue depth stays under the engine's limit");
            submitted += 1;
        }
        engine.unplug(now);
        let mut ios = Vec::new();
        while let Some(io) = engine.pop_member_io() {
            ios.push(io);
        }
        if ios.is_empty() {
            if let Some(d) = engine.next_deadline_ns() {
                now = now.max(d);
                engine.tick(now);
            }
        }
        let t = Instant::now();
        let completions: Vec<MemberIoCompletion> = ios.into_iter().map(|io| members.perform(io)).collect();
        member_ns += t.elapsed().as_nanos();
        for c in completions {
            now += 1;
            engine.complete_member_io(c, now);
        }
        while let Some(c) = engine.pop_completion() {
            assert!(c.result.is_ok(), "bench write failed: {:?}", c.result);
            done += 1;
        }
    }
    let total_s = start.elapsed().as_secs_f64();
    let engine_s = total_s - member_ns as f64 / 1e9;
    (total_s, engine_s)
}

/// gen_syndrome + copy of the same bytes, full stripes of 8 x 64 KiB: the work a
/// full-stripe write cannot avoid.
fn peer_gbps(bytes: u64) -> f64 {
    let chunk = 64 << 10;
    let src = vec![0x5au8; 8 * chunk];
    let mut data: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; chunk]).collect();
    let (mut p, mut q) = (vec![0u8; chunk], vec![0u8; chunk]);
    let stripes = bytes / (8 * chunk as u64);
    let start = Instant::now();
    for _ in 0..stripes {
        for (i, d) in data.iter_mut().enumerate() {
            d.copy_from_slice(&src[i * chunk..(i + 1) * chunk]);
        }
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        uraid_parity::gen_syndrome(&refs, &mut p, &mut q);
    }
    std::hint::black_box(&p);
    (stripes * 8 * chunk as u64) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Both workloads; `scale` 1.0 is a few seconds.
pub fn run(scale: f64) -> Vec<EngineBenchRow> {
    let member_bytes = 64u64 << 20;
    let mut rows = Vec::new();
    let array_bytes = member_bytes * 8;
    // 4 KiB random writes: read-modify-write of one block per request.
    {
        let mut e = engine(member_bytes);
        let mut m = RamMembers { images: vec![vec![0u8; member_bytes as usize]; 10] };
        let requests = (200_000.0 * scale) as u64;
        let mut x = 0x9e3779b97f4a7c15u64;
        let (total_s, engine_s) = drive(&mut e, &mut m, requests, 4096, |_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (array_bytes / 4096)) * 4096
        });
        let peer = peer_gbps(1 << 30);
        let gbps = requests as f64 * 4096.0 / total_s / 1e9;
        rows.push(EngineBenchRow {
            workload: "randwrite-4k",
            requests,
            requests_per_s: requests as f64 / total_s,
            gbps,
            engine_ns_per_request: engine_s * 1e9 / requests as f64,
            peer_gbps: peer,
            ratio: gbps / peer,
        });
    }
    // 1 MiB sequential writes: two full stripes each.
    {
        let mut e = engine(member_bytes);
        let mut m = RamMembers { images: vec![vec![0u8; member_bytes as usize]; 10] };
        let len = 1u64 << 20;
        let requests = (4000.0 * scale) as u64;
        let (total_s, engine_s) = drive(&mut e, &mut m, requests, len, |i| (i * len) % array_bytes);
        let peer = peer_gbps(requests * len);
        let engine_gbps = requests as f64 * len as f64 / engine_s / 1e9;
        rows.push(EngineBenchRow {
            workload: "seqwrite-1m",
            requests,
            requests_per_s: requests as f64 / total_s,
            gbps: engine_gbps,
            engine_ns_per_request: engine_s * 1e9 / requests as f64,
            peer_gbps: peer,
            ratio: engine_gbps / peer,
        });
    }
    rows
}
