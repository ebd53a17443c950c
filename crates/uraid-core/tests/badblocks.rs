//! md's bad-block log in the engine: a listed range is never read (mirrors read another
//! copy, raid4/5/6 rebuild it and, as md does for ranges it did not see a write fail on,
//! rewrite it), a write error joins the log instead of failing the member while the log
//! has room, and a write landing on listed sectors clears them.

mod common;

use common::*;
use uraid_core::geometry::algorithm;
use uraid_core::meta::BadBlocks;
use uraid_core::mirror::Balance;
use uraid_core::*;

const MEMBER_SECTORS: u64 = 2048;
const DATA_OFFSET: u64 = 4096;
const DATA_OFFSET_SECTORS: u64 = DATA_OFFSET / 512;

fn arrays() -> Vec<Geometry> {
    let s = |n: usize| vec![MEMBER_SECTORS; n];
    vec![
        Geometry::new(Level::Raid1, 2, 0, 0, &s(2)).unwrap(),
        Geometry::new(Level::Raid10, 4, 0x102, 16, &s(4)).unwrap(),
        Geometry::new(Level::Raid5, 3, algorithm::LEFT_SYMMETRIC, 16, &s(3)).unwrap(),
        Geometry::new(Level::Raid6, 4, algorithm::LEFT_SYMMETRIC, 16, &s(4)).unwrap(),
    ]
}

fn driver(g: &Geometry, seed: u64) -> Driver {
    driver_with_spares(g, seed, 0)
}

/// As [`driver`], with `spares` more blank devices after the members (for a replacement).
fn driver_with_spares(g: &Geometry, seed: u64, spares: usize) -> Driver {
    let mut cfg = config(g.clone(), DATA_OFFSET);
    cfg.tunables.hold_completions_on_member_failure = true;
    let mut d = Driver::new(
        Engine::new(cfg).unwrap(),
        MemMembers::new(g.raid_disks + spares, DATA_OFFSET + MEMBER_SECTORS * 512),
        seed,
    );
    let t = Tunables { balance: Balance::RoundRobin, ..d.engine.tunables().clone() };
    d.engine.set_tunables(t).unwrap();
    for slot in 0..g.raid_disks {
        d.engine.set_bad_blocks(slot, Some(BadBlocks::new(0, 8)));
    }
    d
}

fn read_all(d: &mut Driver, bytes: usize) -> Result<Vec<u8>, RequestError> {
    let mut out = Vec::new();
    for (i, at) in (0..bytes).step_by(16 << 10).enumerate() {
        out.extend(d.run_one(Request::read(10_000 + i as u64, at as u64, 16 << 10))?);
    }
    Ok(out)
}

/// Random bytes over the whole array, written and returned as the model.
fn write_whole(d: &mut Driver, bytes: usize, seed: u64) -> Vec<u8> {
    let mut model = vec![0u8; bytes];
    Rng(seed).fill(&mut model);
    d.run_one(Request::write(1, 0, model.clone())).expect("write");
    model
}

/// A log listing `n` sectors from data-relative `sector`.
fn listed(sector: u64, n: u64) -> Option<BadBlocks> {
    let mut bb = BadBlocks::new(0, 8);
    assert!(bb.set(DATA_OFFSET_SECTORS + sector, n));
    Some(bb)
}

/// The whole array written with `seed`, then again with `seed + 1` while member 0's
/// writes to data sectors 64-80 fail: those end in its bad-block log, holding the first
/// write's data. Returns the second write's bytes, what every read must give.
fn write_over_a_failing_range(d: &mut Driver, bytes: usize, seed: u64, ctx: &str) -> Vec<u8> {
    write_whole(d, bytes, seed);
    let mut model = vec![0u8; bytes];
    Rng(seed + 1).fill(&mut model);
    let fail = [(0, DATA_OFFSET + 64 * 512, DATA_OFFSET + 80 * 512)];
    d.submit(Request::write(2, 0, model.clone()));
    drain_failing_writes(d, &fail);
    d.engine.metadata_committed();
    drain_failing_writes(d, &[]);
    assert_eq!(d.take_done(2).map(|c| c.result), Some(Ok(Vec::new())), "{ctx}");
    assert!(d.engine.bad_blocks(0).is_some_and(|bb| !bb.is_empty()), "{ctx}: nothing listed");
    model
}

/// Ticks the engine until its resync, recovery, scrub or copy is over, then settles.
fn run_sync_to_end(d: &mut Driver, ctx: &str) {
    let mut guard = 0;
    while d.engine.sync_active() {
        d.engine.tick(d.now_ns);
        d.step();
        guard += 1;
        assert!(guard < 1_000_000, "{ctx}: the sync never finished");
    }
    d.run_until_idle();
}

/// Empties the stripe cache, so that reads go to the members, not to what writes left.
fn drop_stripe_cache(d: &mut Driver) {
    let t = d.engine.tunables().clone();
    d.engine.set_tunables(Tunables { stripe_cache_size: 17, ..t.clone() }).unwrap();
    d.engine.set_tunables(t).unwrap();
}

fn events(d: &mut Driver) -> Vec<EngineEvent> {
    std::iter::from_fn(|| d.engine.pop_event()).collect()
}

/// Completes every member I/O, one at a time in issue order, through the shared driver;
/// writes to `member` overlapping member bytes `[a, b)` (each of `fail`) fail with an I/O
/// error.
fn drain_failing_writes(d: &mut Driver, fail: &[(usize, u64, u64)]) {
    let hit = |io: &MemberIo| {
        let (a, b) = (io.offset_bytes, io.offset_bytes + io.len_bytes);
        io.op == MemberIoOp::Write && fail.iter().any(|&(m, fa, fb)| m == io.member && fa < b && a < fb)
    };
    run_in_order(d, |_| 1, &hit, &|_| false);
}

#[test]
fn a_listed_range_is_never_read_and_raid456_rewrite_it() {
    for g in arrays() {
        let ctx = format!("{:?}", g.level);
        let mut d = driver(&g, 5);
        let bytes = g.array_bytes() as usize;
        let model = write_whole(&mut d, bytes, 11);
        // Member 1's sectors 4..12 are listed bad, and hold garbage behind the engine's back
        // (data, not parity, on raid5/6: a read needs them).
        let (s, n) = (4u64, 8u64);
        d.engine.set_bad_blocks(1, listed(s, n));
        let a = (DATA_OFFSET + s * 512) as usize;
        d.members.images[1][a..a + (n * 512) as usize].fill(0xee);
        assert!(read_all(&mut d, bytes).unwrap() == model, "{ctx}: a listed sector was read");
        // Round-robin would send every other read of the first chunk to member 1.
        for k in 0..4 {
            let got = d.run_one(Request::read(100 + k, 0, 8192)).unwrap();
            assert!(got[..] == model[..8192], "{ctx} read {k}: a listed sector was read");
        }
        let ev = events(&mut d);
        assert!(ev.iter().all(|e| !matches!(e, EngineEvent::MemberFaulty(_))), "{ctx}: {ev:?}");
        let cleared = ev.iter().any(|e| matches!(e, EngineEvent::BadBlocksCleared { slot: 1, .. }));
        // md rewrites a range it rebuilt (R5_ReadError) but a mirror only reads another copy.
        assert_eq!(cleared, g.level.has_parity(), "{ctx}: {ev:?}");
        // Writing everything again lands on every listed sector: the log empties.
        d.run_one(Request::write(2, 0, model.clone())).expect("rewrite");
        assert!(d.engine.bad_blocks(1).unwrap().is_empty(), "{ctx}: {:?}", d.engine.bad_blocks(1));
        assert!(d.members.images[1][a..a + (n * 512) as usize].iter().any(|&b| b != 0xee), "{ctx}");
        assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync), "{ctx}");
    }
}

#[test]
fn a_failed_write_is_recorded_instead_of_failing_the_member() {
    for g in arrays() {
        let ctx = format!("{:?}", g.level);
        let mut d = driver(&g, 9);
        let bytes = g.array_bytes() as usize;
        let mut old = vec![0u8; bytes];
        Rng(1).fill(&mut old);
        d.run_one(Request::write(1, 0, old)).expect("first write");
        let mut model = vec![0u8; bytes];
        Rng(2).fill(&mut model);
        let fail = [(1, DATA_OFFSET + 64 * 512, DATA_OFFSET + 72 * 512)];
        d.submit(Request::write(2, 0, model.clone()));
        drain_failing_writes(&mut d, &fail);
        assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync), "{ctx}: a member failed");
        assert!(d.take_done(2).is_none(), "{ctx}: the write completed before its bad block was recorded");
        let ev = events(&mut d);
        let recorded: Vec<_> = ev
            .iter()
            .filter_map(|e| match *e {
                EngineEvent::BadBlocksRecorded { slot, sector, sectors } => Some((slot, sector, sectors)),
                _ => None,
            })
            .collect();
        assert!(!recorded.is_empty() && recorded.iter().all(|r| r.0 == 1), "{ctx}: {ev:?}");
        // Device sectors, as md stores them: data_offset included.
        let bb = d.engine.bad_blocks(1).unwrap().clone();
        assert!(
            bb.overlaps(DATA_OFFSET_SECTORS + 64, 8) && !bb.overlaps(0, DATA_OFFSET_SECTORS),
            "{ctx}: {bb:?}"
        );
        d.engine.metadata_committed();
        drain_failing_writes(&mut d, &[]);
        assert_eq!(d.take_done(2).map(|c| c.result), Some(Ok(Vec::new())), "{ctx}");
        // Member 1 still holds the old data there; no read may return it.
        assert!(read_all(&mut d, bytes).unwrap() == model, "{ctx}: a read served the range that failed");
    }
}

#[test]
fn a_full_log_or_none_fails_the_member_as_md_does() {
    let g = Geometry::new(Level::Raid1, 2, 0, 0, &[MEMBER_SECTORS; 2]).unwrap();
    for full in [true, false] {
        let mut d = driver(&g, 3);
        let log = full.then(|| {
            let mut bb = BadBlocks::new(0, 1);
            for k in 0..64 {
                assert!(bb.set(100_000 + k * 10, 1));
            }
            bb
        });
        d.engine.set_bad_blocks(1, log);
        d.submit(Request::write(1, 0, vec![7; 64 << 10]));
        drain_failing_writes(&mut d, &[(1, DATA_OFFSET, DATA_OFFSET + 512)]);
        assert_eq!(d.engine.member_states()[1], MemberState::Faulty, "full log {full}");
        assert_eq!(events(&mut d), vec![EngineEvent::MemberFaulty(1)], "full log {full}");
    }
}

#[test]
fn a_write_that_no_copy_holds_fails() {
    let g = Geometry::new(Level::Raid1, 2, 0, 0, &[MEMBER_SECTORS; 2]).unwrap();
    let mut d = driver(&g, 3);
    let fail = [(0, DATA_OFFSET, DATA_OFFSET + 512), (1, DATA_OFFSET, DATA_OFFSET + 512)];
    d.submit(Request::write(1, 0, vec![7; 4096]));
    drain_failing_writes(&mut d, &fail);
    d.engine.metadata_committed();
    drain_failing_writes(&mut d, &[]);
    assert_eq!(d.take_done(1).map(|c| c.result), Some(Err(RequestError::Io)));
    assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync));
    // Nothing can serve those sectors now: the read fails rather than returning stale data.
    assert_eq!(d.run_one(Request::read(2, 0, 4096)), Err(RequestError::Io));
    assert_eq!(d.run_one(Request::read(3, 4096, 4096)).map(|v| v.len()), Ok(4096));
}

/// A recovery reads the other members to rebuild the lost one; a range listed bad on one of
/// them holds nothing (its write failed) and must be rebuilt around, never read: before, a
/// recovery unit that found every other member in sync read them whole, bad ranges
/// included, and wrote what it computed from stale data onto the new member (found by
/// `uraid sim --seed 7 --level 6` once the simulator loaded md's bad-block logs).
#[test]
fn a_recovery_never_reads_a_range_listed_bad_on_another_member() {
    // raid6: a listed range on one member and a lost member are within what it survives.
    for g in arrays().into_iter().filter(|g| g.level == Level::Raid6) {
        let ctx = format!("{:?}", g.level);
        let mut d = driver(&g, 7);
        let bytes = g.array_bytes() as usize;
        let model = write_whole(&mut d, bytes, 3);
        // Member 1's sectors 4..12 are listed bad and hold stale bytes (their write failed).
        let (s, n) = (4u64, 8u64);
        d.engine.set_bad_blocks(1, listed(s, n));
        let a = (DATA_OFFSET + s * 512) as usize;
        let range = a..a + (n * 512) as usize;
        let good = d.members.images[1][range.clone()].to_vec();
        d.members.images[1][range.clone()].fill(0xee);
        // The last member is lost and rebuilt onto a blank disk.
        let lost = g.raid_disks - 1;
        d.engine.fail_member(lost, d.now_ns);
        d.engine.metadata_committed();
        d.run_until_idle();
        d.members.images[lost].fill(0);
        d.engine.add_member(lost, DATA_OFFSET, d.now_ns).unwrap();
        d.run_until_idle();
        assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync), "{ctx}");
        // Put member 1's true bytes back (as a repair would) and lose member 1 itself: the
        // rebuilt member must carry what the lost one held for the stripes to rebuild it.
        d.members.images[1][range].copy_from_slice(&good);
        d.engine.set_bad_blocks(1, None);
        d.engine.fail_member(1, d.now_ns);
        d.engine.metadata_committed();
        let got = read_all(&mut d, bytes).expect("read without member 1");
        assert!(got == model, "{ctx}: the rebuild used the stale bytes of a listed range");
    }
}

/// A recovery resumed from its checkpoint (after a power cut) whose first rows are listed
/// bad on another member: the engine queued the recovery when it was built and started its
/// first unit there, before the caller gave it the bad-block logs, so that unit read the
/// listed rows (`uraid sim --seed 1265`, raid6 parity-last). Queued work now starts at the
/// first call after the set-up.
#[test]
fn a_resumed_recovery_rebuilds_around_a_listed_range_at_its_start() {
    use uraid_core::geometry::algorithm;
    let member_sectors = 4096u64;
    let g = Geometry::new(Level::Raid6, 7, algorithm::PARITY_N, 32, &[member_sectors; 7]).unwrap();
    let bytes = g.array_bytes() as usize;
    let mut model = vec![0u8; bytes];
    Rng(5).fill(&mut model);
    // Written whole first, on an array in sync.
    let cfg = config(g.clone(), DATA_OFFSET);
    let mut d = Driver::new(
        Engine::new(cfg.clone()).unwrap(),
        MemMembers::new(7, DATA_OFFSET + member_sectors * 512),
        3,
    );
    d.run_one(Request::write(1, 0, model.clone())).expect("write");
    let mut images = d.members;
    // Member 2 lost everything from row 1984 on; member 1's rows 1984..2016 are listed bad
    // and stale.
    let resume = 1984u64;
    let a2 = (DATA_OFFSET + resume * 512) as usize;
    images.images[2][a2..].fill(0);
    let a1 = (DATA_OFFSET + resume * 512) as usize;
    images.images[1][a1..a1 + 32 * 512].fill(0xee);
    let mut cfg2 = cfg.clone();
    cfg2.members[2].state = MemberState::Recovering { recovery_offset_sectors: resume };
    cfg2.tunables.hold_completions_on_member_failure = true;
    let mut e = Engine::new(cfg2).unwrap();
    e.set_bad_blocks(1, listed(resume, 32));
    let mut d = Driver::new(e, images, 4);
    d.run_until_idle();
    assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync));
    let got = read_all(&mut d, bytes).expect("read");
    assert!(got == model, "a sector differs after the resumed recovery");
    // And with member 1 gone, member 2 must carry its part.
    d.engine.fail_member(0, d.now_ns);
    d.engine.metadata_committed();
    let got = read_all(&mut d, bytes).expect("read");
    assert!(got == model, "a sector differs without member 0");
}

/// A resync of a stripe left inconsistent (a write in flight at a power cut) where one
/// member lists a few rows bad: the member's other rows are read, never rebuilt from the
/// stale parity, so the parity the resync writes agrees with what every member holds
/// (`uraid sim --seed 1622`: the whole member was rebuilt from parity, good rows included,
/// and the parity written from that disagreed with the member's own rows).
#[test]
fn a_resync_reads_the_good_rows_of_a_member_with_listed_bad_rows() {
    for g in arrays().into_iter().filter(|g| g.level.has_parity()) {
        let ctx = format!("{:?}", g.level);
        let mut d = driver(&g, 11);
        let bytes = g.array_bytes() as usize;
        write_whole(&mut d, bytes, 7);
        // Stripe 0 left inconsistent: the first chunk's member changed behind the parity's
        // back (a write that landed on it alone before the cut), and it lists two other
        // rows of that chunk bad.
        let m = g.map_sector(0).0.member;
        let a = DATA_OFFSET as usize;
        for b in &mut d.members.images[m][a..a + 4 * 512] {
            *b ^= 0x5a;
        }
        d.engine.set_bad_blocks(m, listed(8, 2));
        d.engine.start_resync(Some(vec![(0, 16)]), d.now_ns);
        d.run_until_idle();
        assert!(!d.engine.resync_owed(), "{ctx}");
        // Every row of stripe 0 now agrees with parity: losing the member reads back what
        // it holds in its readable rows.
        let held: Vec<u8> = d.members.images[m][a..a + 16 * 512].to_vec();
        d.engine.set_bad_blocks(m, None);
        d.engine.fail_member(m, d.now_ns);
        d.engine.metadata_committed();
        let got = d.run_one(Request::read(9, 0, 16 * 512)).expect("read");
        for r in (0..16).filter(|r| !(8..10).contains(r)) {
            assert!(
                got[r * 512..(r + 1) * 512] == held[r * 512..(r + 1) * 512],
                "{ctx}: row {r} rebuilt from the parity the resync wrote differs from what member {m} holds"
            );
        }
    }
}

/// md's `repair` after a member's write failed and its range joined the log: the listed
/// range holds data older than what was acknowledged, and is never taken as good. A
/// raid4/5/6 repair solves it from the others instead of recomputing parity from it, a
/// mirror's repair never copies it over the other copies; on a member that saw a write
/// error it is not rewritten either (md skips an acknowledged bad block). Before, reads
/// after the repair served the old data (`uraid sim --seed 2000741`, 2006006, 2006120, 76).
#[test]
fn a_repair_never_takes_a_range_listed_bad_for_good() {
    for g in arrays() {
        let ctx = format!("{:?}", g.level);
        let mut d = driver(&g, 21);
        let bytes = g.array_bytes() as usize;
        // Member 0 holds the first copy of its mirror pieces (what md's repair copies from).
        let model = write_over_a_failing_range(&mut d, bytes, 3, &ctx);
        assert!(read_all(&mut d, bytes).unwrap() == model, "{ctx}: before the repair");
        events(&mut d);

        d.engine.start_scrub(ScrubKind::Repair, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        run_sync_to_end(&mut d, &ctx);
        let ev = events(&mut d);
        assert!(ev.iter().any(|e| matches!(e, EngineEvent::ScrubDone { .. })), "{ctx}: {ev:?}");
        assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync), "{ctx}");
        assert!(
            d.engine.bad_blocks(0).unwrap().overlaps(DATA_OFFSET_SECTORS + 64, 16),
            "{ctx}: the repair wrote over the range listed after a write error"
        );
        // Out of the stripe cache, which still holds what the write put there.
        drop_stripe_cache(&mut d);
        assert!(
            read_all(&mut d, bytes).unwrap() == model,
            "{ctx}: a read after the repair served the old data"
        );
    }
}

/// md's replace on a mirror copies a range the member lists bad (where its writes failed
/// it holds older data) from another copy, never from the member. Before, the replacement
/// took the member's old data there unlisted, and once it held the slot a read served it
/// (`uraid sim --seed 3004493`, 3006274, 4001414: RAID1).
#[test]
fn a_replacement_never_copies_a_range_its_member_lists_bad() {
    for g in arrays().into_iter().filter(|g| matches!(g.level, Level::Raid1 | Level::Raid10)) {
        let ctx = format!("{:?}", g.level);
        let n = g.raid_disks;
        let mut d = driver_with_spares(&g, 5, 1);
        let bytes = g.array_bytes() as usize;
        let model = write_over_a_failing_range(&mut d, bytes, 7, &ctx);
        events(&mut d);

        d.engine.start_replacement(0, n, DATA_OFFSET, 0, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        run_sync_to_end(&mut d, &ctx);
        let r = d.engine.replacements();
        assert!(r.len() == 1 && r[0].copied, "{ctx}: {r:?}");
        d.engine.promote_replacement(0, n, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        // The slot's log is now the replacement's own (empty), as the array sets it.
        d.engine.set_bad_blocks(0, Some(BadBlocks::new(0, 8)));
        // Only the replacement holds slot 0's copies now: the other copy's member goes.
        d.members.gone[1] = true;
        d.engine.fail_member(1, d.now_ns);
        d.engine.metadata_committed();
        d.run_until_idle();
        drop_stripe_cache(&mut d);
        assert!(
            read_all(&mut d, bytes).unwrap() == model,
            "{ctx}: the replacement holds the member's old data"
        );
    }
}

/// md's raid1/10 sync_request ends a check or repair request where a copy's listed range
/// begins (`good_sectors = first_bad - sector_nr`), so that copy is still read and compared
/// up to it. Before, a copy listed bad anywhere in a unit was left out of the whole unit:
/// check counted nothing, and repair took the next copy as the reference there and wrote a
/// flip on it over the first copy too (`uraid sim --seed 96000762 --profile ssd-sata`).
#[test]
fn a_scrub_compares_the_copies_up_to_a_range_listed_bad_in_the_same_unit() {
    for g in arrays().into_iter().filter(|g| matches!(g.level, Level::Raid1 | Level::Raid10)) {
        let ctx = format!("{:?}", g.level);
        let mut d = driver(&g, 9);
        let bytes = g.array_bytes() as usize;
        let model = write_whole(&mut d, bytes, 11);
        // Member 0 lists sectors 100-104 (its data there is good; only the listing counts);
        // member 1, its mirror, gets bits flipped at 96-100, in the same chunk and unit.
        d.engine.set_bad_blocks(0, listed(100, 4));
        for at in (96..100).map(|s| (DATA_OFFSET + s * 512 + 7) as usize) {
            d.members.images[1][at] ^= 0x5a;
        }

        d.engine.start_scrub(ScrubKind::Check, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        run_sync_to_end(&mut d, &ctx);
        assert!(d.engine.mismatch_cnt() > 0, "{ctx}: check found nothing although the copies disagree");

        d.engine.start_scrub(ScrubKind::Repair, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        run_sync_to_end(&mut d, &ctx);
        assert!(d.engine.mismatch_cnt() > 0, "{ctx}: repair found nothing although the copies disagree");
        assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync), "{ctx}");
        let copy = |m: usize| d.members.images[m][DATA_OFFSET as usize..].to_vec();
        assert!(copy(0) == copy(1), "{ctx}: after the repair the copies still disagree");
        assert!(
            read_all(&mut d, bytes).unwrap() == model,
            "{ctx}: the repair spread the flip over the first copy"
        );
    }
}
