//! md's check / repair (sync_action): mismatch_cnt in md's units for chosen corruptions,
//! check changes no member byte, repair makes a following check find nothing and restores
//! what md (and raid6check, for raid6) would, and requests keep working during a scrub.

mod common;

use common::*;
use uraid_core::geometry::{algorithm, parse_layout};
use uraid_core::*;

const MEMBER_SECTORS: u64 = 4096;
const DATA_OFFSET: u64 = 4096;

fn geo(level: Level, n: usize, layout: u32, chunk_sectors: u64) -> Geometry {
    Geometry::new(level, n, layout, chunk_sectors, &vec![MEMBER_SECTORS; n]).unwrap()
}

/// A healthy array holding random data, and that data.
fn written(g: &Geometry, seed: u64) -> (Driver, Vec<u8>) {
    let mut d = Driver::new(
        Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(),
        MemMembers::new(g.raid_disks, DATA_OFFSET + MEMBER_SECTORS * 512),
        seed,
    );
    let mut model = vec![0u8; g.array_bytes() as usize];
    Rng(seed).fill(&mut model);
    for (i, piece) in model.chunks(1 << 20).enumerate() {
        d.run_one(Request::write(i as u64 + 1, (i << 20) as u64, piece.to_vec())).expect("write");
    }
    (d, model)
}

/// Flip bits in `sectors` of `member` from data-relative `sector`.
fn corrupt(d: &mut Driver, member: usize, sector: u64, sectors: u64) {
    let a = (DATA_OFFSET + sector * 512) as usize;
    for b in &mut d.members.images[member][a..a + (sectors * 512) as usize] {
        *b ^= 0xa5;
    }
}

/// Run a check or repair to its end; the ScrubDone event carries mismatch_cnt.
fn scrub(d: &mut Driver, kind: ScrubKind, ctx: &str) -> u64 {
    d.engine.start_scrub(kind, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert_eq!(d.engine.sync_action(), kind.name(), "{ctx}");
    let st = d.engine.sync_status().expect("progress");
    assert!(st.kind == SyncKind::Scrub(kind) && st.total_sectors > 0, "{ctx}: {st:?}");
    let mut done = None;
    let mut guard = 0;
    while d.engine.sync_active() {
        d.engine.tick(d.now_ns);
        d.step();
        while let Some(e) = d.engine.pop_event() {
            match e {
                EngineEvent::ScrubDone { kind: k, mismatch_cnt_sectors } if k == kind => {
                    done = Some(mismatch_cnt_sectors)
                }
                e => panic!("{ctx}: unexpected event {e:?}"),
            }
        }
        guard += 1;
        assert!(guard < 1_000_000, "{ctx}: scrub never finished");
    }
    d.run_until_idle();
    let n = done.unwrap_or_else(|| panic!("{ctx}: no ScrubDone"));
    assert_eq!(n, d.engine.mismatch_cnt(), "{ctx}");
    assert_eq!(d.engine.sync_action(), "idle", "{ctx}");
    assert_eq!(d.engine.last_sync_action(), kind.name(), "{ctx}");
    n
}

fn read_all(d: &mut Driver, id: u64) -> Vec<u8> {
    let n = d.engine.size_bytes();
    d.run_one(Request::read(id, 0, n)).expect("read")
}

/// Check counts `want` sectors and changes nothing; repair counts the same; then a
/// check finds nothing and the array reads back `expect`.
fn check_then_repair(d: &mut Driver, want: u64, expect: &[u8], ctx: &str) {
    let before = d.members.images.clone();
    assert_eq!(scrub(d, ScrubKind::Check, ctx), want, "{ctx}: check's mismatch_cnt");
    assert!(d.members.images == before, "{ctx}: check changed member bytes");
    assert_eq!(scrub(d, ScrubKind::Repair, ctx), want, "{ctx}: repair's mismatch_cnt");
    assert_eq!(scrub(d, ScrubKind::Check, ctx), 0, "{ctx}: check after repair");
    assert!(read_all(d, 9000) == expect, "{ctx}: data after repair");
}

/// raid1 and raid10: md counts a sync bio's sectors (128, or the chunk on raid10 with more
/// members than near copies) per copy that differs from the first; repair copies the first.
#[test]
fn mirrors_count_per_sync_bio_and_copy_and_repair_from_the_first_copy() {
    for (level, n, layout, chunk, window) in [
        (Level::Raid1, 2, 0, 0, 128),
        (Level::Raid1, 3, 0, 0, 128),
        (Level::Raid10, 4, parse_layout(Level::Raid10, "n2").unwrap(), 128, 128),
        (Level::Raid10, 4, parse_layout(Level::Raid10, "n2").unwrap(), 16, 16),
        (Level::Raid10, 2, parse_layout(Level::Raid10, "n2").unwrap(), 16, 128),
        (Level::Raid10, 4, parse_layout(Level::Raid10, "f2").unwrap(), 128, 128),
        (Level::Raid10, 3, parse_layout(Level::Raid10, "o2").unwrap(), 32, 32),
    ] {
        let ctx = format!("{level:?} n={n} layout={layout:#x} chunk={chunk}");
        let g = geo(level, n, layout, chunk);
        let (mut d, model) = written(&g, 11);
        let mut copies = Vec::new();
        let mut want = 0;
        // A 4 KiB block of the second copy, and two blocks in one window (counted once).
        for s in [808u64, 1600, 1608] {
            g.copies(s, &mut copies);
            corrupt(&mut d, copies[1].member, copies[1].member_sector, 8);
        }
        want += 2 * window;
        // Every copy but the first of one block: one count per differing copy.
        g.copies(2400, &mut copies);
        for c in &copies[1..] {
            corrupt(&mut d, c.member, c.member_sector, 8);
        }
        want += window * (copies.len() as u64 - 1);
        check_then_repair(&mut d, want, &model, &ctx);
    }
}

/// md's repair copies the first copy that reads: a corrupted first copy wins (that is what
/// md does; nothing on a mirror says which copy is right).
#[test]
fn a_corrupted_first_copy_is_copied_over_the_others() {
    let g = geo(Level::Raid1, 3, 0, 0);
    let (mut d, mut model) = written(&g, 61);
    corrupt(&mut d, 0, 1000, 8);
    for b in &mut model[1000 * 512..1008 * 512] {
        *b ^= 0xa5;
    }
    check_then_repair(&mut d, 2 * 128, &model, "raid1 first copy");
}

/// raid4/5: md counts 8 sectors per inconsistent 4 KiB stripe page; repair rewrites parity,
/// so a corrupted data block stays what it is and parity is made to match it.
#[test]
fn raid5_counts_per_stripe_page_and_repair_rewrites_parity() {
    for (level, n, layout) in [
        (Level::Raid5, 4, algorithm::LEFT_SYMMETRIC),
        (Level::Raid5, 5, algorithm::RIGHT_ASYMMETRIC),
        (Level::Raid4, 4, algorithm::PARITY_N),
    ] {
        let ctx = format!("{level:?} n={n}");
        let g = geo(level, n, layout, 128);
        let (mut d, mut model) = written(&g, 21);
        // A data page: the data as read becomes the corrupted bytes.
        let a = 1000 * 8;
        let (e, _) = g.map_sector(a);
        corrupt(&mut d, e.member, e.member_sector, 8);
        for b in &mut model[(a * 512) as usize..((a + 8) * 512) as usize] {
            *b ^= 0xa5;
        }
        // A parity page, and 12 sectors straddling two pages of another parity block.
        let map = g.stripe_map(5);
        corrupt(&mut d, map.pd_idx, 5 * 128 + 40, 8);
        let map = g.stripe_map(9);
        corrupt(&mut d, map.pd_idx, 9 * 128 + 4, 12);
        check_then_repair(&mut d, 8 + 8 + 16, &model, &ctx);
    }
}

/// raid6: one corrupted data block is located by its syndrome and rebuilt (the data comes
/// back), P or Q alone is rewritten, and two bad data blocks in a page make md's repair:
/// P and Q from the data.
#[test]
fn raid6_repair_locates_a_corrupted_data_block() {
    for (n, layout) in [(5, algorithm::LEFT_SYMMETRIC), (6, algorithm::ROTATING_N_CONTINUE)] {
        let ctx = format!("raid6 n={n} layout={layout}");
        let g = geo(Level::Raid6, n, layout, 128);
        let (mut d, mut model) = written(&g, 31);
        // Single data blocks: restored.
        for a in [300u64 * 8, 1234 * 8] {
            let (e, _) = g.map_sector(a);
            corrupt(&mut d, e.member, e.member_sector, 8);
        }
        let m3 = g.stripe_map(3);
        corrupt(&mut d, m3.pd_idx, 3 * 128 + 16, 8);
        let m7 = g.stripe_map(7);
        corrupt(&mut d, m7.qd_idx.unwrap(), 7 * 128 + 64, 8);
        // Two data blocks of one page row: the data stays as corrupted.
        let m11 = g.stripe_map(11);
        for &m in &m11.data_members[..2] {
            corrupt(&mut d, m, 11 * 128 + 8, 8);
        }
        let before = d.members.images.clone();
        // The model's array bytes of those two blocks: read them as the members hold them.
        let img = read_all(&mut d, 500);
        for s in 0..g.array_sectors() {
            let (e, _) = g.map_sector(s);
            if m11.data_members[..2].contains(&e.member)
                && (11 * 128 + 8..11 * 128 + 16).contains(&e.member_sector)
            {
                let r = (s * 512) as usize..(s * 512 + 512) as usize;
                model[r.clone()].copy_from_slice(&img[r]);
            }
        }
        assert!(d.members.images == before, "{ctx}: a read changed member bytes");
        check_then_repair(&mut d, 5 * 8, &model, &ctx);
    }
}

#[test]
fn check_is_refused_on_a_degraded_array_and_while_a_resync_is_owed() {
    for (level, n, layout, chunk) in [
        (Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, 128),
        (Level::Raid1, 2, 0, 0),
        (Level::Raid10, 4, parse_layout(Level::Raid10, "n2").unwrap(), 128),
    ] {
        let g = geo(level, n, layout, chunk);
        let mut c = config(g.clone(), DATA_OFFSET);
        c.members[n - 1].state = MemberState::Missing;
        let mut e = Engine::new(c).unwrap();
        assert!(e.start_scrub(ScrubKind::Check, 0).is_err(), "{level:?}: degraded");
        assert_eq!(e.last_sync_action(), "none");
        let mut e = Engine::new(config(g.clone(), DATA_OFFSET)).unwrap();
        e.start_resync(Some(vec![(0, 64)]), 0);
        assert!(e.start_scrub(ScrubKind::Repair, 0).is_err(), "{level:?}: resync running");
    }
    let g = geo(Level::Raid0, 2, 0, 128);
    let mut e = Engine::new(config(g, DATA_OFFSET)).unwrap();
    assert!(e.start_scrub(ScrubKind::Check, 0).is_err(), "raid0");
}

/// Writes during a check (or repair) wait for the units they overlap and land; the scrub
/// counts nothing (a write racing the reads would look like a mismatch), and they read back.
#[test]
fn writes_during_a_check_land_and_count_no_mismatch() {
    for kind in [ScrubKind::Check, ScrubKind::Repair] {
        for (level, n, layout, chunk) in [
            (Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, 128),
            (Level::Raid6, 5, algorithm::LEFT_SYMMETRIC, 16),
            (Level::Raid1, 2, 0, 0),
            (Level::Raid10, 4, parse_layout(Level::Raid10, "n2").unwrap(), 16),
        ] {
            let ctx = format!("{level:?} n={n} {kind:?}");
            let g = geo(level, n, layout, chunk);
            let (mut d, mut model) = written(&g, 41);
            let mut rng = Rng(42);
            d.engine.start_scrub(kind, d.now_ns).unwrap();
            let mut id = 100;
            let mut steps = 0u64;
            while d.engine.sync_active() {
                if steps.is_multiple_of(2) {
                    let len = (1 + rng.below(16)) * 512;
                    let off = rng.below(g.array_bytes() / 512 - 16) * 512;
                    let mut data = vec![0u8; len as usize];
                    rng.fill(&mut data);
                    model[off as usize..(off + len) as usize].copy_from_slice(&data);
                    id += 1;
                    d.submit(Request::write(id, off, data));
                    d.engine.unplug(d.now_ns);
                }
                d.engine.tick(d.now_ns);
                d.step();
                steps += 1;
                assert!(steps < 1_000_000, "{ctx}: check never finished");
            }
            d.run_until_idle();
            assert!(id > 101, "{ctx}: writes were issued during the check");
            for c in d.done.drain(..) {
                assert!(c.result.is_ok(), "{ctx}: write {} failed", c.id);
            }
            assert_eq!(d.engine.mismatch_cnt(), 0, "{ctx}");
            let events: Vec<EngineEvent> = std::iter::from_fn(|| d.engine.pop_event()).collect();
            assert_eq!(events, vec![EngineEvent::ScrubDone { kind, mismatch_cnt_sectors: 0 }], "{ctx}");
            assert!(read_all(&mut d, 9001) == model, "{ctx}: data after the check");
            assert_eq!(scrub(&mut d, ScrubKind::Check, &ctx), 0, "{ctx}: a second check");
        }
    }
}

/// md's idle: a stopped check ends with SyncAborted, keeps what it counted, and a new
/// check starts over from zero.
#[test]
fn idle_stops_a_check() {
    let g = geo(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, 128);
    let (mut d, _) = written(&g, 51);
    d.engine.start_scrub(ScrubKind::Check, d.now_ns).unwrap();
    for _ in 0..3 {
        d.step();
    }
    assert!(d.engine.stop_scrub());
    d.run_until_idle();
    assert_eq!(d.engine.sync_action(), "idle");
    assert_eq!(d.engine.last_sync_action(), "check");
    let mut events = Vec::new();
    while let Some(e) = d.engine.pop_event() {
        events.push(e);
    }
    assert_eq!(events, vec![EngineEvent::SyncAborted(SyncKind::Scrub(ScrubKind::Check))]);
    assert_eq!(scrub(&mut d, ScrubKind::Check, "after idle"), 0);
}
