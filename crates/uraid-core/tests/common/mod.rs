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
/// fail with an I/O error instead; those `hold` picks stay outstanding, in their place,
/// while it says so (the others pass them).
pub struct InOrder<'a> {
    pub members: &'a mut MemMembers,
    pub pending: &'a mut Vec<MemberIo>,
    pub take: fn(usize) -> usize,
    pub fail: &'a dyn Fn(&MemberIo) -> bool,
    pub hold: &'a dyn Fn(&MemberIo) -> bool,
}

impl<'a> InOrder<'a> {
    pub fn all(members: &'a mut MemMembers, pending: &'a mut Vec<MemberIo>) -> Self {
        InOrder { members, pending, take: |_| usize::MAX, fail: &|_| false, hold: &|_| false }
    }
}

impl drive::MemberExecutor for InOrder<'_> {
    fn issue(&mut self, io: MemberIo) {
        self.pending.push(io);
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        let mut k = (self.take)(self.pending.len()).min(self.pending.len());
        let mut i = 0;
        while k > 0 && i < self.pending.len() {
            if (self.hold)(&self.pending[i]) {
                i += 1;
                continue;
            }
            let io = self.pending.remove(i);
            k -= 1;
            out.push(if (self.fail)(&io) {
                MemberIoCompletion { id: io.id, result: Err(MemberIoError::Io) }
            } else {
                self.members.perform(io)
            });
        }
    }
}

/// Runs `d` through the shared driver with its member I/O performed by [`InOrder`]
/// (`take`, `fail` and `hold` as there) until nothing moves and the engine asks for no
/// time, or only held I/O is left and a hundred of the engine's deadlines in a row moved
/// nothing; I/O still held stays in `d.pending` (a later `run_until_idle` performs it).
pub fn run_in_order<E: ArrayEngine>(
    d: &mut Driver<E>,
    take: fn(usize) -> usize,
    fail: &dyn Fn(&MemberIo) -> bool,
    hold: &dyn Fn(&MemberIo) -> bool,
) {
    d.engine.unplug(d.now_ns);
    let mut ex = InOrder { members: &mut d.members, pending: &mut d.pending, take, fail, hold };
    let mut scratch = Vec::new();
    let mut idle_ticks = 0;
    for _ in 0..10_000_000 {
        d.now_ns += 10_000;
        let now = d.now_ns;
        let done = &mut d.done;
        if drive::exchange(&mut d.engine, &mut ex, &mut || now, &mut scratch, |c| done.push(c)).any() {
            idle_ticks = 0;
            continue;
        }
        if !ex.pending.is_empty() && ex.pending.iter().all(hold) {
            idle_ticks += 1;
            if idle_ticks > 100 {
                return;
            }
        }
        match d.engine.next_deadline_ns() {
            Some(t) => {
                d.now_ns = d.now_ns.max(t);
                d.engine.tick(d.now_ns);
            }
            None => return,
        }
    }
    panic!("the engine never settled");
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

/// Wall-clock seconds the arrays of these tests were created at (superblock ctime/utime).
pub const EPOCH_S: u64 = 1_700_000_000;

/// `uraid create` of `p` on members in RAM of `member_bytes` each, written as `uraid
/// create` writes them: each superblock, the bitmap area, an empty partial parity log.
pub fn create_in_ram(p: &uraid_core::meta::CreateParams, member_bytes: u64) -> MemMembers {
    use uraid_core::meta::{create_array, ppl_area, ppl_signature, PplHeader};
    let c = create_array(p).unwrap();
    let mut mm = MemMembers::new(c.superblocks.len(), member_bytes);
    for (i, sb) in c.superblocks.iter().enumerate() {
        let Some(sb) = sb else { continue };
        mm.write_at(i, sb.super_offset * 512, &sb.serialize());
        if let (Some(b), Some(at)) = (&c.bitmap, sb.bitmap_sector()) {
            mm.write_at(i, at * 512, &b.area);
        }
        if let (true, Some((start, _))) = (p.ppl, ppl_area(sb)) {
            let h = PplHeader::empty(ppl_signature(&sb.set_uuid)).serialize().unwrap();
            mm.write_at(i, start * 512, &h);
        }
    }
    mm
}

/// `create_in_ram` of an array of `level` on `n` members of `member_bytes`, --assume-clean,
/// 64 KiB chunks, with a bitmap of 64 KiB chunks when `bitmap`.
pub fn create_level(level: i32, n: usize, member_bytes: u64, bitmap: bool) -> MemMembers {
    let mut p = uraid_core::meta::CreateParams::new(level, vec![Some(member_bytes / 512); n]);
    p.bitmap = bitmap;
    p.bitmap_chunk_bytes = bitmap.then_some(64 << 10);
    p.assume_clean = true;
    p.set_uuid = [7; 16];
    p.device_uuids = (0..n).map(|i| [i as u8 + 1; 16]).collect();
    p.ctime_seconds = EPOCH_S;
    p.name = "t".into();
    if level != 1 {
        p.chunk_kib = Some(64);
    }
    create_in_ram(&p, member_bytes)
}

impl MemMembers {
    /// `bytes` put at byte `at` of member `m` (outside the engine: what a tool writes).
    pub fn write_at(&mut self, m: usize, at: u64, bytes: &[u8]) {
        self.images[m][at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    }

    /// Member `m`'s superblock as assembly reads it.
    pub fn superblock(&self, m: usize) -> uraid_core::meta::Superblock {
        self.metadata(m).offered.superblock.unwrap()
    }
}

/// Assembles the members `keys` as `uraid serve --run --force` does (no partial parity
/// log replayed) and starts the array on them; the driver shuffles completions by `seed`.
pub fn start_array(mm: MemMembers, keys: &[usize], seed: u64) -> Driver<uraid_core::array::Array> {
    use uraid_core::array::{Array, ArrayOptions, StartMember};
    use uraid_core::meta::{plan_assembly, AssembleOptions, MemberMetadata, OfferedMember};
    let metas: Vec<MemberMetadata> = keys.iter().map(|&k| mm.metadata(k)).collect();
    let offered: Vec<OfferedMember> = metas.iter().map(|m| m.offered.clone()).collect();
    let plan = plan_assembly(&offered, &AssembleOptions { run: true, uuid: None, force: true }).unwrap();
    let start: Vec<StartMember> =
        metas.into_iter().zip(keys).map(|(m, &k)| StartMember::from_metadata(k as u64, m).unwrap()).collect();
    let opts = ArrayOptions { epoch_seconds: EPOCH_S, ..ArrayOptions::default() };
    Driver::new(Array::start(&plan, start, opts).unwrap(), mm, seed)
}

/// A blank device of `bytes` more, with the superblock a new member gets written on it
/// and the bitmap area, as `uraid add` writes them before the array takes it.
pub fn prepare_new_member(
    d: &mut Driver<uraid_core::array::Array>,
    bytes: u64,
    uuid: u8,
) -> uraid_core::array::NewMember {
    let key = d.members.add_member(bytes);
    let sb = d.engine.new_member_superblock(bytes / 512, [uuid; 16], "new").unwrap();
    let mut sb_w = sb.clone();
    d.members.write_at(key, sb.super_offset * 512, &sb_w.update_csum());
    if let Some((off, area)) = d.engine.bitmap_area() {
        d.members.write_at(key, (sb.super_offset as i64 + i64::from(off)) as u64 * 512, &area);
    }
    uraid_core::array::NewMember {
        key: key as u64,
        name: format!("m{key}"),
        sb,
        previous: None,
        replaces: None,
        bad_blocks: None,
    }
}

/// Is the I/O one of the array's own metadata (superblock, bitmap, logs, their flushes)?
pub fn is_meta(io: &MemberIo) -> bool {
    is_array_meta_io(io.id)
}
