//! Resync of an unclean array (md's recovery_cp): a resync asked for while the array is
//! degraded is kept and runs, one stopped by a member failure resumes, and until a region
//! is resynced mirrors read one copy there and raid4/5/6 never read-modify-write it.

mod common;

use common::*;
use uraid_core::geometry::{algorithm, parse_layout};
use uraid_core::*;

const MEMBER_SECTORS: u64 = 4096;
const DATA_OFFSET: u64 = 4096;

fn geo(level: Level, n: usize, layout: u32) -> Geometry {
    Geometry::new(level, n, layout, 16, &vec![MEMBER_SECTORS; n]).unwrap()
}

fn member_bytes(m: &MemMembers, member: usize, sector: u64, n: u64) -> &[u8] {
    let a = (DATA_OFFSET + sector * 512) as usize;
    &m.images[member][a..a + (n * 512) as usize]
}

/// Members holding `model` written through a healthy array.
fn written(g: &Geometry, seed: u64) -> (MemMembers, Vec<u8>) {
    let n = g.raid_disks;
    let mut d = Driver::new(
        Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(),
        MemMembers::new(n, DATA_OFFSET + MEMBER_SECTORS * 512),
        seed,
    );
    let mut model = vec![0u8; g.array_bytes() as usize];
    Rng(seed).fill(&mut model);
    for (i, piece) in model.chunks(1 << 20).enumerate() {
        d.run_one(Request::write(i as u64 + 1, (i << 20) as u64, piece.to_vec())).expect("write");
    }
    (std::mem::replace(&mut d.members, MemMembers::new(0, 0)), model)
}

/// A crash tore redundancy: every parity block, or every copy but the first, scribbled
/// (on the members in `on`).
fn tear(g: &Geometry, m: &mut MemMembers, on: &[usize], rng: &mut Rng) {
    let mut copies = Vec::new();
    if g.level.has_parity() {
        for stripe in 0..MEMBER_SECTORS / 16 {
            let map = g.stripe_map(stripe);
            for p in std::iter::once(map.pd_idx).chain(map.qd_idx).filter(|p| on.contains(p)) {
                let a = (DATA_OFFSET + stripe * 16 * 512) as usize;
                rng.fill(&mut m.images[p][a..a + 16 * 512]);
            }
        }
    } else {
        for s in (0..g.array_sectors()).step_by(8) {
            g.copies(s, &mut copies);
            let first = copies.iter().map(|c| c.member).min().unwrap();
            for c in copies.iter().filter(|c| c.member != first && on.contains(&c.member)) {
                let a = (DATA_OFFSET + c.member_sector * 512) as usize;
                rng.fill(&mut m.images[c.member][a..a + 8 * 512]);
            }
        }
    }
}

/// Redundancy is consistent on every member in `on`: parity matches the data, copies agree.
fn assert_consistent(g: &Geometry, m: &MemMembers, on: &[usize], ctx: &str) {
    let mut copies = Vec::new();
    if g.level.has_parity() {
        for stripe in 0..MEMBER_SECTORS / 16 {
            let map = g.stripe_map(stripe);
            let mut slots: Vec<Vec<u8>> = vec![vec![0u8; 16 * 512]; map.syndrome_disks];
            for (dd, &d) in map.data_members.iter().enumerate() {
                slots[map.syndrome_slot[dd]] = member_bytes(m, d, stripe * 16, 16).to_vec();
            }
            let refs: Vec<&[u8]> = slots.iter().map(|v| v.as_slice()).collect();
            let (mut p, mut q) = (vec![0u8; 16 * 512], vec![0u8; 16 * 512]);
            uraid_parity::gen_syndrome(&refs, &mut p, &mut q);
            assert!(p == member_bytes(m, map.pd_idx, stripe * 16, 16), "{ctx}: stripe {stripe} P");
            if let Some(qd) = map.qd_idx {
                assert!(q == member_bytes(m, qd, stripe * 16, 16), "{ctx}: stripe {stripe} Q");
            }
        }
    } else {
        for s in (0..g.array_sectors()).step_by(8) {
            g.copies(s, &mut copies);
            let on_copies: Vec<&[u8]> = copies
                .iter()
                .filter(|c| on.contains(&c.member))
                .map(|c| member_bytes(m, c.member, c.member_sector, 8))
                .collect();
            assert!(on_copies.windows(2).all(|w| w[0] == w[1]), "{ctx}: copies of sector {s} differ");
        }
    }
}

fn run_sync(d: &mut Driver, events: &mut Vec<(EngineEvent, bool)>, ctx: &str) {
    let mut guard = 0;
    while d.engine.sync_active() {
        d.engine.tick(d.now_ns);
        d.step();
        while let Some(e) = d.engine.pop_event() {
            events.push((e, d.engine.resync_owed()));
        }
        guard += 1;
        assert!(guard < 1_000_000, "{ctx}: sync never finished");
    }
    d.run_until_idle();
    while let Some(e) = d.engine.pop_event() {
        events.push((e, d.engine.resync_owed()));
    }
}

/// One array of each redundant level (raid4/5/6, a three-way mirror, raid10 near 2).
fn shapes() -> [(Level, usize, u32); 5] {
    [
        (Level::Raid5, 4, algorithm::LEFT_SYMMETRIC),
        (Level::Raid6, 5, algorithm::LEFT_SYMMETRIC),
        (Level::Raid4, 4, algorithm::PARITY_N),
        (Level::Raid1, 3, 0),
        (Level::Raid10, 4, parse_layout(Level::Raid10, "n2").unwrap()),
    ]
}

/// Every MiB of the array reads back as `model` holds it.
fn assert_reads_back(d: &mut Driver, model: &[u8], ctx: &str) {
    for (i, piece) in model.chunks(1 << 20).enumerate() {
        let got = d.run_one(Request::read(100 + i as u64, (i << 20) as u64, piece.len() as u64));
        assert!(got.expect("read") == piece, "{ctx}: MiB {i} differs from what was written");
    }
}

/// A dirty start with a member missing: the resync is kept (raid4/5/6 and two-copy mirrors:
/// until a replacement is rebuilt; a three-way mirror resyncs its two copies at once) and
/// runs, and the recovery's end does not say the array is in sync while a resync is owed.
#[test]
fn a_resync_asked_for_while_degraded_runs_and_is_owed_until_done() {
    for (level, n, layout) in shapes() {
        let ctx = format!("{level:?} n={n}");
        let g = geo(level, n, layout);
        let (mut members, _) = written(&g, 3);
        let victim = n - 1;
        let others: Vec<usize> = (0..n).filter(|&m| m != victim).collect();
        tear(&g, &mut members, &others, &mut Rng(4));
        members.gone[victim] = true;
        let mut c = config(g.clone(), DATA_OFFSET);
        c.members[victim].state = MemberState::Missing;
        let mut d = Driver::new(Engine::new(c).unwrap(), members, 5);
        d.engine.start_resync(None, 0);
        assert!(d.engine.resync_owed(), "{ctx}");
        let mut events = Vec::new();
        run_sync(&mut d, &mut events, &ctx);
        let resync_degraded = level == Level::Raid1;
        if resync_degraded {
            assert!(events.iter().any(|(e, _)| *e == EngineEvent::ResyncDone), "{ctx}: {events:?}");
            assert_consistent(&g, &d.members, &others, &ctx);
        } else {
            assert!(d.engine.resync_owed(), "{ctx}: the resync was dropped: {events:?}");
        }
        // A replacement arrives and is rebuilt.
        d.members.gone[victim] = false;
        d.members.images[victim].fill(0);
        d.engine.add_member(victim, DATA_OFFSET, d.now_ns).unwrap();
        run_sync(&mut d, &mut events, &ctx);
        let recovered = events.iter().position(|(e, _)| *e == EngineEvent::RecoveryDone(victim));
        let resynced = events.iter().position(|(e, _)| *e == EngineEvent::ResyncDone);
        let (Some(recovered), Some(resynced)) = (recovered, resynced) else {
            panic!("{ctx}: {events:?}");
        };
        if !resync_degraded {
            assert!(recovered < resynced, "{ctx}: {events:?}");
            assert!(events[recovered].1, "{ctx}: the resync was not owed when recovery ended");
        }
        assert!(!d.engine.resync_owed(), "{ctx}");
        assert_consistent(&g, &d.members, &(0..n).collect::<Vec<_>>(), &ctx);
    }
}

/// A member failure stops a resync; the rest is resumed, not lost: a three-way mirror goes
/// on with its two copies left, a raid5 once the replacement is rebuilt.
#[test]
fn a_resync_stopped_by_a_member_failure_resumes() {
    for (level, n, layout) in [(Level::Raid1, 3, 0), (Level::Raid5, 4, algorithm::LEFT_SYMMETRIC)] {
        let ctx = format!("{level:?} n={n}");
        let g = geo(level, n, layout);
        let (mut members, _) = written(&g, 6);
        let victim = n - 1;
        tear(&g, &mut members, &(0..n).collect::<Vec<_>>(), &mut Rng(7));
        let mut d = Driver::new(Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(), members, 8);
        d.engine.start_resync(None, 0);
        // Part of the way in, the victim fails.
        let mut guard = 0;
        while d.engine.sync_status().is_none_or(|s| s.resync_offset_sectors < MEMBER_SECTORS / 4) {
            d.engine.tick(d.now_ns);
            d.step();
            guard += 1;
            assert!(guard < 1_000_000, "{ctx}: resync never got going");
        }
        d.members.gone[victim] = true;
        d.engine.fail_member(victim, d.now_ns);
        assert!(d.engine.resync_owed(), "{ctx}: the rest of the resync was dropped");
        let mut events = Vec::new();
        run_sync(&mut d, &mut events, &ctx);
        if level.has_parity() {
            // Waits for the replacement's recovery.
            assert!(d.engine.resync_owed(), "{ctx}: {events:?}");
            d.members.gone[victim] = false;
            d.members.images[victim].fill(0);
            d.engine.add_member(victim, DATA_OFFSET, d.now_ns).unwrap();
            run_sync(&mut d, &mut events, &ctx);
        }
        assert!(events.iter().any(|(e, _)| *e == EngineEvent::ResyncDone), "{ctx}: {events:?}");
        assert!(!d.engine.resync_owed(), "{ctx}");
        let in_sync: Vec<usize> =
            if level.has_parity() { (0..n).collect() } else { (0..n).filter(|&m| m != victim).collect() };
        assert_consistent(&g, &d.members, &in_sync, &ctx);
    }
}

/// Submit one request and complete member I/Os in order, without letting time pass (the
/// paced resync makes no progress beyond what is in flight).
fn run_frozen(d: &mut Driver, req: Request) -> Result<Vec<u8>, RequestError> {
    let id = req.id;
    d.engine.submit(req, d.now_ns).unwrap();
    d.engine.unplug(d.now_ns);
    let now = d.now_ns;
    for _ in 0..10_000 {
        let mut ex = InOrder::all(&mut d.members, &mut d.pending);
        let done = &mut d.done;
        drive::exchange(&mut d.engine, &mut ex, &mut || now, &mut Vec::new(), |c| done.push(c));
        if let Some(c) = d.take_done(id) {
            return c.result;
        }
    }
    panic!("request {id} never completed");
}

/// Before the resync reaches a region, a mirror's copies may differ: every read there
/// comes from the same copy (md's read_balance past recovery_cp), whatever the balance.
#[test]
fn mirrors_read_one_copy_where_the_resync_has_not_been() {
    for balance in [mirror::Balance::RoundRobin, mirror::Balance::Load, mirror::Balance::Split] {
        let g = geo(Level::Raid1, 2, 0);
        let (mut members, model) = written(&g, 11);
        tear(&g, &mut members, &[1], &mut Rng(12));
        let mut c = config(g.clone(), DATA_OFFSET);
        c.tunables.balance = balance;
        let mut d = Driver::new(Engine::new(c).unwrap(), members, 13);
        d.engine.set_tunable("sync_speed_min", "1").unwrap();
        d.engine.set_tunable("sync_speed_max", "1").unwrap();
        d.engine.start_resync(None, 0);
        // Far past the first resync unit.
        let (off, len) = (3072 * 512, 256 * 512);
        for id in 1..=4 {
            let got = run_frozen(&mut d, Request::read(id, off, len)).expect("read");
            assert!(got == model[off as usize..(off + len) as usize], "{balance:?}: read {id} differs");
        }
        assert!(d.engine.resync_owed());
    }
}

/// Before the resync reaches a stripe its parity may not match the data: a partial write
/// there rebuilds parity from the data (reconstruct-write), never read-modify-write.
#[test]
fn no_read_modify_write_where_the_resync_has_not_been() {
    for (level, n) in [(Level::Raid5, 6), (Level::Raid6, 7)] {
        let g = geo(level, n, algorithm::LEFT_SYMMETRIC);
        let (members, _) = written(&g, 21);
        let mut d = Driver::new(Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(), members, 22);
        // Resynced already: one sector is a read-modify-write.
        let far = 3000 * (n as u64 - level.parity_disks() as u64) * 512;
        run_frozen(&mut d, Request::write(1, far, vec![1; 512])).expect("write");
        assert_eq!((d.engine.stats().rmw_writes, d.engine.stats().rcw_writes), (1, 0), "{level:?}");
        d.engine.set_tunable("sync_speed_min", "1").unwrap();
        d.engine.set_tunable("sync_speed_max", "1").unwrap();
        d.engine.start_resync(None, 0);
        d.engine.reset_stats();
        run_frozen(&mut d, Request::write(2, far + 4096, vec![2; 512])).expect("write");
        assert_eq!((d.engine.stats().rmw_writes, d.engine.stats().rcw_writes), (0, 1), "{level:?}");
    }
}

/// md's resync reads and compares: parity (raid4/5/6) or a copy (raid10; raid1 here too)
/// is written only where it disagrees, so a fresh array on sparse or thin members is not
/// written whole. Where it disagrees, the resync still makes it right, and counts the
/// disagreeing stripes in mismatch_cnt as md's handle_parity_checks5/6 do.
#[test]
fn a_resync_writes_only_the_redundancy_that_disagrees() {
    for (level, n, layout) in shapes() {
        let ctx = format!("{level:?} n={n}");
        let g = geo(level, n, layout);
        let (members, model) = written(&g, 31);
        let mut d = Driver::new(Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(), members, 32);
        let all: Vec<usize> = (0..n).collect();
        // In sync already: the resync reads, and writes nothing.
        let logged = d.members.log.len();
        d.engine.start_resync(None, 0);
        let mut events = Vec::new();
        run_sync(&mut d, &mut events, &ctx);
        assert!(events.iter().any(|(e, _)| *e == EngineEvent::ResyncDone), "{ctx}: {events:?}");
        let writes = d.members.log[logged..].iter().filter(|e| e.1 == MemberIoOp::Write).count();
        assert_eq!(writes, 0, "{ctx}: a resync of an array in sync wrote {writes} times");
        assert_eq!(d.engine.mismatch_cnt(), 0, "{ctx}");
        // Redundancy torn on one member: only that member is written, and made right
        // (raid4's parity is all on its last member).
        let torn = if level == Level::Raid4 { n - 1 } else { 1 };
        tear(&g, &mut d.members, &[torn], &mut Rng(33));
        let logged = d.members.log.len();
        d.engine.start_resync(None, d.now_ns);
        run_sync(&mut d, &mut events, &ctx);
        let written_to: Vec<usize> =
            d.members.log[logged..].iter().filter(|e| e.1 == MemberIoOp::Write).map(|e| e.0).collect();
        assert!(!written_to.is_empty(), "{ctx}: the torn redundancy was not rewritten");
        assert!(written_to.iter().all(|&m| m == torn), "{ctx}: wrote to {written_to:?}");
        assert!(d.engine.mismatch_cnt() > 0, "{ctx}: the resync counted no mismatch");
        assert_consistent(&g, &d.members, &all, &ctx);
        assert_reads_back(&mut d, &model, &ctx);
    }
}

/// A comparing resync unit that cannot read a member is redone the way that rebuilds what
/// did not read and rewrites it (md's read-error correction): the resync ends, the array
/// is consistent and the data as written.
#[test]
fn a_resync_that_cannot_read_a_member_rebuilds_and_rewrites_it() {
    for (level, n, layout) in [
        (Level::Raid5, 4, algorithm::LEFT_SYMMETRIC),
        (Level::Raid6, 5, algorithm::LEFT_SYMMETRIC),
        (Level::Raid1, 2, 0),
        (Level::Raid10, 4, parse_layout(Level::Raid10, "n2").unwrap()),
    ] {
        let ctx = format!("{level:?} n={n}");
        let g = geo(level, n, layout);
        let (mut members, model) = written(&g, 41);
        tear(&g, &mut members, &[1], &mut Rng(42));
        // 4 KiB of the torn member unreadable, a little way in (a write of all of it
        // clears it); every other member holds what it should there.
        let bad = (1, DATA_OFFSET + 256 * 512, DATA_OFFSET + 264 * 512);
        members.latent.push(bad);
        let mut d = Driver::new(Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(), members, 43);
        d.engine.start_resync(None, 0);
        let mut events = Vec::new();
        run_sync(&mut d, &mut events, &ctx);
        assert!(events.iter().any(|(e, _)| *e == EngineEvent::ResyncDone), "{ctx}: {events:?}");
        assert!(!d.engine.resync_owed(), "{ctx}");
        assert!(d.members.latent.is_empty(), "{ctx}: the unreadable sectors were not rewritten");
        assert_consistent(&g, &d.members, &(0..n).collect::<Vec<_>>(), &ctx);
        assert_reads_back(&mut d, &model, &ctx);
    }
}

/// A resync (or a re-added member's recovery) of one region, on an array nothing else
/// happens to, runs to its end driven only by the caller's usual loop: completions, and
/// `tick` when `next_deadline_ns` says so. Its first units used to claim their stripe
/// heads and wait there for a handler pass that only another request would have started
/// (`uraid sim --seed 2000574`: a bitmap resync of 128 sectors stuck at 0 of 128).
#[test]
fn a_resync_with_nothing_else_to_do_runs_to_its_end() {
    for (level, n, layout) in shapes() {
        let ctx = format!("{level:?} n={n}");
        let g = geo(level, n, layout);
        let (members, model) = written(&g, 51);
        let mut d = Driver::new(Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(), members, 53);
        // One sync unit (a chunk row of 16 sectors on raid4/5/6): no later unit's pacing
        // deadline brings the caller back.
        d.engine.start_resync(Some(vec![(256, 272)]), 0);
        let mut events = Vec::new();
        let mut guard = 0;
        while d.step() {
            guard += 1;
            assert!(guard < 1_000_000, "{ctx}: the driver never went idle");
        }
        while let Some(e) = d.engine.pop_event() {
            events.push(e);
        }
        assert!(!d.engine.sync_active(), "{ctx}: the resync never ended: {:?}", d.engine.sync_status());
        assert!(events.contains(&EngineEvent::ResyncDone), "{ctx}: {events:?}");
        assert_reads_back(&mut d, &model, &ctx);

        // A member back with a bitmap's few regions to rebuild.
        let victim = n - 1;
        d.engine.fail_member(victim, d.now_ns);
        while d.step() {}
        d.engine.readd_member(victim, DATA_OFFSET, Some(vec![(512, 528)]), d.now_ns).unwrap();
        guard = 0;
        while d.step() {
            guard += 1;
            assert!(guard < 1_000_000, "{ctx}: the driver never went idle");
        }
        assert!(!d.engine.sync_active(), "{ctx}: the recovery never ended: {:?}", d.engine.sync_status());
        assert_eq!(d.engine.member_states()[victim], MemberState::InSync, "{ctx}");
    }
}
