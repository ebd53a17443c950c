//! Property test against a flat reference model: every level and layout, random reads,
//! writes, trims, write-zeroes and flushes from 512 B to several stripes, unaligned to chunks,
//! with member I/Os completed in shuffled order, random member failures within the level's
//! redundancy and latent sector errors. Every read must equal the model.

mod common;

use common::*;
use uraid_core::geometry::{algorithm, parse_layout};
use uraid_core::*;

struct Case {
    level: Level,
    raid_disks: usize,
    layout: u32,
    chunk_sectors: u64,
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for n in [2usize, 3, 4] {
        v.push(Case { level: Level::Raid0, raid_disks: n, layout: 0, chunk_sectors: 16 });
    }
    for n in [2usize, 3] {
        v.push(Case { level: Level::Raid1, raid_disks: n, layout: 0, chunk_sectors: 0 });
    }
    for (l, n) in [("n2", 4), ("n2", 3), ("f2", 4), ("o2", 4), ("n3", 3), ("f2", 5)] {
        v.push(Case {
            level: Level::Raid10,
            raid_disks: n,
            layout: parse_layout(Level::Raid10, l).unwrap(),
            chunk_sectors: 16,
        });
    }
    v.push(Case { level: Level::Raid4, raid_disks: 4, layout: algorithm::PARITY_N, chunk_sectors: 16 });
    for layout in 0..=5 {
        v.push(Case { level: Level::Raid5, raid_disks: 4, layout, chunk_sectors: 16 });
    }
    v.push(Case { level: Level::Raid5, raid_disks: 3, layout: 2, chunk_sectors: 256 });
    for layout in [0u32, 1, 2, 3, 4, 5, 8, 9, 10, 16, 17, 18, 19, 20] {
        v.push(Case { level: Level::Raid6, raid_disks: 5, layout, chunk_sectors: 16 });
    }
    v.push(Case { level: Level::Raid6, raid_disks: 6, layout: 2, chunk_sectors: 256 });
    v
}

/// How many members this test may fail for the case without losing the array.
fn failable(case: &Case) -> usize {
    match case.level {
        Level::Raid0 => 0,
        Level::Raid1 => case.raid_disks - 1,
        Level::Raid10 => 1,
        l => l.parity_disks(),
    }
}

fn run_case(case: &Case, seed: u64, ops: usize) {
    let member_sectors = 2048u64; // 1 MiB
    let data_offset_bytes = 4096u64;
    let geo = Geometry::new(
        case.level,
        case.raid_disks,
        case.layout,
        case.chunk_sectors,
        &vec![member_sectors; case.raid_disks],
    )
    .expect("geometry");
    let size = geo.array_bytes();
    let mut cfg = config(geo, data_offset_bytes);
    cfg.tunables.stripe_cache_size = 17 + (seed % 3) as usize * 8;
    cfg.tunables.rmw_level = (seed % 3) as u8;
    cfg.tunables.balance = uraid_core::mirror::Balance::NAMES[(seed % 5) as usize].1;
    cfg.tunables.write_batching = seed % 4 != 3;
    cfg.tunables.degraded_read_bypass = seed % 2 == 1;
    let engine = Engine::new(cfg).expect("engine");
    let members = MemMembers::new(case.raid_disks, data_offset_bytes + member_sectors * 512);
    let mut d = Driver::new(engine, members, seed);
    let mut model = vec![0u8; size as usize];
    let mut rng = Rng(seed ^ 0xabcdef);
    let mut inflight: Vec<(u64, u64, u64, RequestOp)> = Vec::new(); // id, start, end
    let mut failed = 0usize;
    let stripe_bytes = (case.chunk_sectors.max(8) * 512) * case.raid_disks as u64;
    let ctx = format!(
        "{:?} n={} layout={} chunk={} seed={seed}",
        case.level, case.raid_disks, case.layout, case.chunk_sectors
    );
    for op_no in 0..ops as u64 {
        let id = op_no + 1;
        // Occasionally fail a member or plant a latent error, within redundancy.
        if rng.below(60) == 0
            && failed + d.members.latent.iter().map(|l| l.0).collect::<std::collections::HashSet<_>>().len()
                < failable(case)
        {
            let m = rng.below(case.raid_disks as u64) as usize;
            if !d.members.gone[m] {
                if rng.below(2) == 0 {
                    d.members.gone[m] = true;
                } else {
                    d.engine.fail_member(m, d.now_ns);
                    d.members.gone[m] = true;
                }
                failed += 1;
            }
        }
        let latent_members = {
            let mut v: Vec<usize> = d.members.latent.iter().map(|l| l.0).collect();
            v.sort();
            v.dedup();
            v.len()
        };
        if rng.below(40) == 0 && failable(case) > failed + latent_members && case.level != Level::Raid0 {
            let m = rng.below(case.raid_disks as u64) as usize;
            let a = data_offset_bytes + rng.below(member_sectors) * 512;
            d.members.latent.push((m, a, a + 512 * (1 + rng.below(8))));
        }
        // md lets stripe_cache_size change under load: nothing queued may be lost.
        if rng.below(50) == 0 {
            let t =
                Tunables { stripe_cache_size: 17 + rng.below(64) as usize, ..d.engine.tunables().clone() };
            d.engine.set_tunables(t).expect("a valid size");
        }
        let len_sectors = match rng.below(5) {
            0 => 1 + rng.below(8),
            1 => 1 + rng.below(64),
            2 => 1 + rng.below(3 * stripe_bytes / 512),
            3 => 1 + rng.below(600),
            _ => 8,
        };
        let len = (len_sectors * 512).min(size);
        let off = rng.below((size - len) / 512 + 1) * 512;
        let kind = rng.below(100);
        let op = match kind {
            0..=44 => RequestOp::Read,
            45..=84 => RequestOp::Write,
            85..=89 => RequestOp::Trim,
            90..=94 => RequestOp::WriteZeroes,
            _ => RequestOp::Flush,
        };
        // Keep overlapping requests ordered, as a file system would.
        while inflight.iter().any(|&(_, a, b, o)| o != RequestOp::Flush && overlaps((a, b), (off, off + len)))
        {
            assert!(d.step() || !inflight.is_empty());
            settle(&mut d, &mut inflight, &model, &ctx);
            if !d.step() {
                d.engine.unplug(d.now_ns);
            }
        }
        let req = match op {
            RequestOp::Read => Request::read(id, off, len),
            RequestOp::Write => {
                let mut data = vec![0u8; len as usize];
                rng.fill(&mut data);
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
                let mut r = Request::write(id, off, data);
                r.fua = rng.below(10) == 0;
                r
            }
            RequestOp::Trim => {
                model[off as usize..(off + len) as usize].fill(0);
                Request::trim(id, off, len)
            }
            RequestOp::WriteZeroes => {
                model[off as usize..(off + len) as usize].fill(0);
                Request::write_zeroes(id, off, len)
            }
            RequestOp::Flush => Request::flush(id),
        };
        let expect = if op == RequestOp::Read {
            model[off as usize..(off + len) as usize].to_vec()
        } else {
            Vec::new()
        };
        d.submit(req);
        inflight.push((id, off, off + len, op));
        EXPECT.with(|e| e.borrow_mut().insert(id, expect));
        if rng.below(4) == 0 {
            d.engine.unplug(d.now_ns);
        }
        for _ in 0..rng.below(4) {
            d.step();
        }
        settle(&mut d, &mut inflight, &model, &ctx);
    }
    d.run_until_idle();
    settle(&mut d, &mut inflight, &model, &ctx);
    assert!(inflight.is_empty(), "{ctx}: requests never completed: {inflight:?}");
    assert!(!d.engine.is_failed(), "{ctx}: array failed within redundancy");
    // Read the whole array back, in pieces.
    let mut off = 0;
    let mut id = 1_000_000;
    while off < size {
        let len = (64 * 1024).min(size - off);
        let got = d
            .run_one(Request::read(id, off, len))
            .unwrap_or_else(|e| panic!("{ctx}: final read at {off}: {e}"));
        if got != model[off as usize..(off + len) as usize] {
            let first = got.iter().zip(&model[off as usize..]).position(|(a, b)| a != b).unwrap() as u64;
            let bad_end = got.iter().zip(&model[off as usize..]).rposition(|(a, b)| a != b).unwrap() as u64;
            let s = (off + first) / 512;
            panic!(
                "{ctx}: final read at {off} differs from the model at bytes {first}..={bad_end} (sector {s}, maps to {:?}); gone {:?} latent {:?} states {:?}",
                d.engine.geometry().map_sector(s),
                d.members.gone,
                d.members.latent,
                d.engine.member_states()
            );
        }
        off += len;
        id += 1;
    }
}

thread_local! {
    static EXPECT: std::cell::RefCell<std::collections::HashMap<u64, Vec<u8>>> = Default::default();
}

fn settle(d: &mut Driver, inflight: &mut Vec<(u64, u64, u64, RequestOp)>, _model: &[u8], ctx: &str) {
    for c in std::mem::take(&mut d.done) {
        let pos = inflight
            .iter()
            .position(|x| x.0 == c.id)
            .unwrap_or_else(|| panic!("{ctx}: unknown completion {}", c.id));
        let (id, off, _, op) = inflight.swap_remove(pos);
        let expect = EXPECT.with(|e| e.borrow_mut().remove(&id)).unwrap_or_default();
        match c.result {
            Ok(data) if op == RequestOp::Read => {
                if data != expect {
                    let first = data.iter().zip(&expect).position(|(a, b)| a != b).unwrap_or(0);
                    panic!(
                        "{ctx}: read id {id} at {off} len {} differs from the model at byte {first}",
                        expect.len()
                    );
                }
            }
            Ok(_) => {}
            Err(e) => panic!("{ctx}: request {id} ({op:?} at {off}) failed: {e}"),
        }
    }
}

#[test]
fn every_level_and_layout_matches_the_model() {
    let seeds: u64 = std::env::var("URAID_MODEL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let only: Option<String> = std::env::var("URAID_MODEL_CASE").ok();
    for case in cases() {
        if only.as_ref().is_some_and(|o| *o != format!("{:?}/{}", case.level, case.layout)) {
            continue;
        }
        for seed in 0..seeds {
            let seed = std::env::var("URAID_MODEL_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(seed * 7919 + case.layout as u64);
            let ops = std::env::var("URAID_MODEL_OPS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
            run_case(&case, seed, ops);
        }
    }
}

/// `split` divides large mirror reads: every byte of the request must still be read
/// (a floor division once dropped the tail).
#[test]
fn split_balance_reads_the_whole_request() {
    for n in [2usize, 3] {
        let geo = Geometry::new(Level::Raid1, n, 0, 0, &vec![4096; n]).unwrap();
        let mut cfg = config(geo, 0);
        cfg.tunables.balance = uraid_core::mirror::Balance::Split;
        let mut d = Driver::new(Engine::new(cfg).unwrap(), MemMembers::new(n, 4096 * 512), 1);
        let mut rng = Rng(11);
        let mut model = vec![0u8; 4096 * 512];
        rng.fill(&mut model);
        d.run_one(Request::write(1, 0, model.clone())).unwrap();
        for (k, len_sectors) in (257u64..=300).enumerate() {
            let off = (k as u64 * 7) * 512;
            let len = len_sectors * 512;
            let got = d.run_one(Request::read(10 + k as u64, off, len)).unwrap();
            assert!(
                got == model[off as usize..(off + len) as usize],
                "n={n} read of {len_sectors} sectors at {off}"
            );
        }
    }
}

/// raid0 chunks that follow each other on one member (a one-member array) are one member
/// I/O: a 1 MiB request there was cut at every chunk, and its read then zero-filled a
/// buffer of its own and copied each chunk in. Other member counts still split per chunk.
#[test]
fn raid0_contiguous_chunks_are_one_member_io() {
    for (n, expect_ios) in [(1usize, 1usize), (2, 4)] {
        let geo = Geometry::new(Level::Raid0, n, 0, 16, &vec![4096; n]).unwrap();
        let mut engine = Engine::new(config(geo, 0)).unwrap();
        let mut members = MemMembers::new(n, 4096 * 512);
        let data: Vec<u8> = (0..64 * 512).map(|i| (i % 251) as u8).collect();
        for req in [Request::write(1, 0, data.clone()), Request::read(2, 0, 64 * 512)] {
            let id = req.id;
            engine.submit(req, 0).unwrap();
            engine.unplug(0);
            let (mut pending, mut done) = (Vec::new(), None);
            let mut ex = InOrder::all(&mut members, &mut pending);
            let moved = drive::exchange(&mut engine, &mut ex, &mut || 0, &mut Vec::new(), |c| done = Some(c));
            assert_eq!(moved.issued as usize, expect_ios, "{n} members: member I/Os of request {id}");
            let done = done.expect("completed");
            assert_eq!(done.id, id);
            if id == 2 {
                assert!(done.result.unwrap() == data, "{n} members: read back differs");
            }
        }
    }
}
