//! Test harness shared by the engine's integration tests: members in RAM, a reference model,
//! a seeded PRNG, and a driver that completes member I/Os in a shuffled order.

#![allow(dead_code)]

use std::collections::HashSet;

use uraid_core::*;

pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Members held in memory, with fail-stop, latent-error, write-error and flush-error faults.
pub struct MemMembers {
    pub images: Vec<Vec<u8>>,
    pub gone: Vec<bool>,
    /// (member, first byte, end byte) that fail reads until rewritten.
    pub latent: Vec<(usize, u64, u64)>,
    /// (member, first byte, end byte) where writes fail.
    pub write_errors: Vec<(usize, u64, u64)>,
    /// Members whose flushes fail.
    pub flush_errors: Vec<usize>,
    pub reads: u64,
    pub writes: u64,
    /// Every I/O performed, in order: (member, op, offset, len, ok).
    pub log: Vec<(usize, MemberIoOp, u64, u64, bool)>,
}

impl MemMembers {
    pub fn new(n: usize, bytes: u64) -> Self {
        MemMembers {
            images: vec![vec![0u8; bytes as usize]; n],
            gone: vec![false; n],
            latent: Vec::new(),
            write_errors: Vec::new(),
            flush_errors: Vec::new(),
            reads: 0,
            writes: 0,
            log: Vec::new(),
        }
    }

    /// A blank member more (its index is returned).
    pub fn add_member(&mut self, bytes: u64) -> usize {
        self.images.push(vec![0u8; bytes as usize]);
        self.gone.push(false);
        self.images.len() - 1
    }

    pub fn perform(&mut self, io: MemberIo) -> MemberIoCompletion {
        let m = io.member;
        let (a, b) = (io.offset_bytes, io.offset_bytes + io.len_bytes);
        if self.gone[m] {
            self.log.push((m, io.op, a, io.len_bytes, false));
            return MemberIoCompletion { id: io.id, result: Err(MemberIoError::Gone) };
        }
        let write_fails = self.write_errors.iter().any(|&(wm, wa, wb)| wm == m && wa < b && a < wb);
        let img = &mut self.images[m];
        let result = match io.op {
            MemberIoOp::Flush if self.flush_errors.contains(&m) => Err(MemberIoError::Io),
            MemberIoOp::Flush => Ok(Vec::new()),
            _ if b as usize > img.len() => Err(MemberIoError::Io),
            MemberIoOp::Write if write_fails => Err(MemberIoError::Io),
            MemberIoOp::Read => {
                self.reads += 1;
                if self.latent.iter().any(|&(lm, la, lb)| lm == m && la < b && a < lb) {
                    Err(MemberIoError::Io)
                } else {
                    Ok(img[a as usize..b as usize].to_vec())
                }
            }
            MemberIoOp::Write => {
                self.writes += 1;
                assert_eq!(io.data.len() as u64, io.len_bytes, "write payload length");
                img[a as usize..b as usize].copy_from_slice(&io.data);
                self.latent.retain(|&(lm, la, lb)| !(lm == m && a <= la && lb <= b));
                Ok(Vec::new())
            }
        };
        self.log.push((m, io.op, a, io.len_bytes, result.is_ok()));
        MemberIoCompletion { id: io.id, result }
    }
}

impl MemMembers {
    /// Member `m`'s metadata as assembly reads it (`uraid_core::meta::read_member`).
    pub fn metadata(&self, m: usize) -> uraid_core::meta::MemberMetadata {
        let img = &self.images[m];
        uraid_core::meta::read_member(&format!("m{m}"), img.len() as u64 / 512, &mut |off, len| {
            let a = (off as usize).min(img.len());
            img[a..(a + len).min(img.len())].to_vec()
        })
    }
}

/// Drives an engine (or an array) over `MemMembers`, completing I/Os in a seeded shuffled
/// order.
pub struct Driver<E: ArrayEngine = Engine> {
    pub engine: E,
    pub members: MemMembers,
    pub rng: Rng,
    pub now_ns: u64,
    pub pending: Vec<MemberIo>,
    pub done: Vec<RequestCompletion>,
}

impl<E: ArrayEngine> Driver<E> {
    pub fn new(engine: E, members: MemMembers, seed: u64) -> Self {
        Driver { engine, members, rng: Rng(seed), now_ns: 0, pending: Vec::new(), done: Vec::new() }
    }

    pub fn submit(&mut self, req: Request) {
        self.engine.submit(req, self.now_ns).expect("engine accepted");
    }

    /// One pass of the shared driver (`uraid_core::drive::pump`), completing a random
    /// handful of the member I/Os outstanding; when nothing moved, the clock goes on to the
    /// engine's next deadline. False when nothing was left to do.
    pub fn step(&mut self) -> bool {
        self.now_ns += 10_000;
        let now = self.now_ns;
        let mut ex = Shuffled { members: &mut self.members, rng: &mut self.rng, pending: &mut self.pending };
        let done = &mut self.done;
        let pumped = drive::pump(&mut self.engine, &mut ex, &mut || now, &mut Vec::new(), |c| done.push(c));
        if pumped.any() {
            return true;
        }
        match self.engine.next_deadline_ns() {
            Some(d) => {
                self.now_ns = self.now_ns.max(d);
                self.engine.tick(self.now_ns);
                true
            }
            None => false,
        }
    }

    pub fn run_until_idle(&mut self) {
        self.engine.unplug(self.now_ns);
        let mut guard = 0;
        while self.step() {
            guard += 1;
            assert!(guard < 10_000_000, "engine never went idle");
        }
        assert!(self.engine.is_idle(), "engine reports work outstanding after the driver drained it");
    }

    /// Submit one request and run to completion; return its result.
    pub fn run_one(&mut self, req: Request) -> Result<Vec<u8>, RequestError> {
        let id = req.id;
        self.submit(req);
        self.run_until_idle();
        let i = self.done.iter().position(|c| c.id == id).expect("request completed");
        self.done.swap_remove(i).result
    }

    pub fn take_done(&mut self, id: RequestId) -> Option<RequestCompletion> {
        let i = self.done.iter().position(|c| c.id == id)?;
        Some(self.done.swap_remove(i))
    }
}

/// `MemMembers` as the driver's executor: I/Os wait in `pending` and a seeded random
/// handful of them completes, in a random order, each time the driver polls.
struct Shuffled<'a> {
    members: &'a mut MemMembers,
    rng: &'a mut Rng,
    pending: &'a mut Vec<MemberIo>,
}

impl drive::MemberExecutor for Shuffled<'_> {
    fn issue(&mut self, io: MemberIo) {
        self.pending.push(io);
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        if self.pending.is_empty() {
            return;
        }
        let k = 1 + self.rng.below(self.pending.len() as u64) as usize;
        for _ in 0..k {
            let i = self.rng.below(self.pending.len() as u64) as usize;
            out.push(self.members.perform(self.pending.swap_remove(i)));
        }
    }
}

/// `MemMembers` performing member I/Os in the order they were issued: each poll completes
/// the oldest `take(outstanding)` of them (all of them: `usize::MAX`); those `fail` picks
/// fail with an I/O error instead.
pub struct InOrder<'a> {
    pub members: &'a mut MemMembers,
    pub pending: &'a mut Vec<MemberIo>,
    pub take: fn(usize) -> usize,
    pub fail: &'a dyn Fn(&MemberIo) -> bool,
}

impl<'a> InOrder<'a> {
    pub fn all(members: &'a mut MemMembers, pending: &'a mut Vec<MemberIo>) -> Self {
        InOrder { members, pending, take: |_| usize::MAX, fail: &|_| false }
    }
}

impl drive::MemberExecutor for InOrder<'_> {
    fn issue(&mut self, io: MemberIo) {
        self.pending.push(io);
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        let k = (self.take)(self.pending.len()).min(self.pending.len());
        for io in self.pending.drain(..k) {
            out.push(if (self.fail)(&io) {
                MemberIoCompletion { id: io.id, result: Err(MemberIoError::Io) }
            } else {
                self.members.perform(io)
            });
        }
    }
}

pub fn config(geo: Geometry, data_offset_bytes: u64) -> ArrayConfig {
    let n = geo.raid_disks;
    ArrayConfig {
        geometry: geo,
        members: vec![MemberConfig { data_offset_bytes, state: MemberState::InSync }; n],
        tunables: Tunables::default(),
        read_only: false,
    }
}

pub fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

pub type Inflight = HashSet<(u64, u64, u64)>;
