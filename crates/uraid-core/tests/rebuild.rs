//! Recovery and resync through the engine: a failed member is replaced and rebuilt while
//! requests keep coming, then the rebuilt member must carry the data on its own; a resync
//! repairs redundancy that was left inconsistent.

mod common;

use common::*;
use std::collections::HashSet;
use uraid_core::geometry::{algorithm, parse_layout, Extent};
use uraid_core::*;

fn geo(level: Level, n: usize, layout: u32) -> Geometry {
    Geometry::new(level, n, layout, 16, &vec![4096; n]).unwrap()
}

fn cases() -> Vec<(Level, usize, u32)> {
    vec![
        (Level::Raid1, 2, 0),
        (Level::Raid1, 3, 0),
        (Level::Raid10, 4, parse_layout(Level::Raid10, "n2").unwrap()),
        (Level::Raid10, 4, parse_layout(Level::Raid10, "f2").unwrap()),
        (Level::Raid10, 5, parse_layout(Level::Raid10, "o2").unwrap()),
        (Level::Raid4, 4, algorithm::PARITY_N),
        (Level::Raid5, 4, algorithm::LEFT_SYMMETRIC),
        (Level::Raid5, 5, algorithm::RIGHT_ASYMMETRIC),
        (Level::Raid6, 6, algorithm::LEFT_SYMMETRIC),
        (Level::Raid6, 5, algorithm::LEFT_ASYMMETRIC),
    ]
}

fn write_random(d: &mut Driver, model: &mut [u8], rng: &mut Rng, id: &mut u64, count: usize) {
    let size = model.len() as u64;
    for _ in 0..count {
        let len = (1 + rng.below(64)) * 512;
        let off = rng.below((size - len) / 512) * 512;
        let mut data = vec![0u8; len as usize];
        rng.fill(&mut data);
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
        *id += 1;
        d.run_one(Request::write(*id, off, data)).expect("write");
    }
}

fn read_all(d: &mut Driver, model: &[u8], id: &mut u64, ctx: &str) {
    let size = model.len() as u64;
    let mut off = 0;
    while off < size {
        let len = (128 * 1024).min(size - off);
        *id += 1;
        let got =
            d.run_one(Request::read(*id, off, len)).unwrap_or_else(|e| panic!("{ctx}: read {off}: {e}"));
        assert!(got == model[off as usize..(off + len) as usize], "{ctx}: data differs at {off}");
        off += len;
    }
}

#[test]
fn a_replaced_member_is_rebuilt_under_load_and_then_carries_the_data() {
    for (level, n, layout) in cases() {
        let ctx = format!("{level:?} n={n} layout={layout}");
        let g = geo(level, n, layout);
        let size = g.array_bytes();
        let mut d =
            Driver::new(Engine::new(config(g, 4096)).unwrap(), MemMembers::new(n, 4096 + 4096 * 512), 5);
        let mut model = vec![0u8; size as usize];
        let mut rng = Rng(99);
        let mut id = 0;
        write_random(&mut d, &mut model, &mut rng, &mut id, 60);
        let victim = 1;
        d.members.gone[victim] = true;
        write_random(&mut d, &mut model, &mut rng, &mut id, 20);
        d.engine.fail_member(victim, d.now_ns);
        write_random(&mut d, &mut model, &mut rng, &mut id, 20);
        // A blank replacement arrives.
        d.members.gone[victim] = false;
        d.members.images[victim].fill(0);
        d.engine.add_member(victim, 4096, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: add: {e}"));
        let mut rounds = 0;
        while d.engine.sync_active() {
            write_random(&mut d, &mut model, &mut rng, &mut id, 2);
            rounds += 1;
            assert!(rounds < 100_000, "{ctx}: recovery never finished");
        }
        d.run_until_idle();
        assert_eq!(d.engine.member_states()[victim], MemberState::InSync, "{ctx}");
        let mut events = Vec::new();
        while let Some(e) = d.engine.pop_event() {
            events.push(e);
        }
        assert!(events.contains(&EngineEvent::RecoveryDone(victim)), "{ctx}: {events:?}");
        // Now lose everything the rebuilt member must stand in for.
        let others: Vec<usize> = match level {
            Level::Raid1 => (0..n).filter(|&m| m != victim).collect(),
            Level::Raid10 => {
                // the members sharing copies with the victim
                let mut copies = Vec::new();
                let mut partners = std::collections::BTreeSet::new();
                for s in (0..d.engine.geometry().array_sectors()).step_by(16) {
                    d.engine.geometry().copies(s, &mut copies);
                    if copies.iter().any(|c| c.member == victim) {
                        partners.extend(copies.iter().map(|c| c.member).filter(|&m| m != victim));
                    }
                }
                // fail one partner at a time and check each alone
                let partners: Vec<usize> = partners.into_iter().collect();
                partners[..1].to_vec()
            }
            Level::Raid6 => vec![0, 2],
            _ => vec![0],
        };
        let fresh = Engine::new({
            let mut c = config(geo(level, n, layout), 4096);
            for &o in &others {
                c.members[o].state = MemberState::Missing;
            }
            c
        })
        .unwrap();
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut d2 = Driver::new(fresh, members, 6);
        for &o in &others {
            d2.members.gone[o] = true;
        }
        read_all(&mut d2, &model, &mut id, &ctx);
    }
}

/// Bytes of `member`'s data area at data-relative `sector`, `n` sectors.
/// md's sync_speed_min and sync_speed_max both set to `kib`.
fn sync_speed(d: &mut Driver, kib: u64) {
    // The floor may never pass the ceiling: lowered first, raised last.
    for (name, v) in [("sync_speed_min", 1), ("sync_speed_max", kib), ("sync_speed_min", kib)] {
        d.engine.set_tunable(name, &v.to_string()).unwrap();
    }
}

fn member_bytes(d: &Driver, member: usize, sector: u64, n: u64) -> &[u8] {
    let a = (4096 + sector * 512) as usize;
    &d.members.images[member][a..a + (n * 512) as usize]
}

#[test]
fn resync_repairs_inconsistent_redundancy() {
    for (level, n, layout) in cases() {
        let ctx = format!("{level:?} n={n} layout={layout}");
        let g = geo(level, n, layout);
        let size = g.array_bytes();
        let mut d = Driver::new(
            Engine::new(config(g.clone(), 4096)).unwrap(),
            MemMembers::new(n, 4096 + 4096 * 512),
            7,
        );
        let mut model = vec![0u8; size as usize];
        let mut rng = Rng(3);
        let mut id = 0;
        write_random(&mut d, &mut model, &mut rng, &mut id, 80);
        // A crash tore redundancy: scribble every parity block, or every non-first copy.
        let mut copies = Vec::new();
        if level.has_parity() {
            for stripe in 0..4096 / 16 {
                let map = g.stripe_map(stripe);
                for m in std::iter::once(map.pd_idx).chain(map.qd_idx) {
                    let a = (4096 + stripe * 16 * 512) as usize;
                    rng.fill(&mut d.members.images[m][a..a + 16 * 512]);
                }
            }
        } else {
            for s in (0..g.array_sectors()).step_by(8) {
                g.copies(s, &mut copies);
                let first = copies.iter().map(|c| c.member).min().unwrap();
                for c in copies.iter().filter(|c| c.member != first) {
                    let a = (4096 + c.member_sector * 512) as usize;
                    rng.fill(&mut d.members.images[c.member][a..a + 8 * 512]);
                }
            }
        }
        // A fresh start (nothing cached), then the resync.
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut d = Driver::new(Engine::new(config(g.clone(), 4096)).unwrap(), members, 8);
        d.engine.start_resync(None, 0);
        let mut guard = 0;
        while d.engine.sync_active() {
            d.engine.tick(d.now_ns);
            d.step();
            guard += 1;
            assert!(guard < 1_000_000, "{ctx}: resync never finished");
        }
        d.run_until_idle();
        assert_eq!(d.engine.pop_event(), Some(EngineEvent::ResyncDone), "{ctx}");
        if level.has_parity() {
            for stripe in 0..4096 / 16 {
                let map = g.stripe_map(stripe);
                let mut slots: Vec<Vec<u8>> = vec![vec![0u8; 16 * 512]; map.syndrome_disks];
                for (dd, &m) in map.data_members.iter().enumerate() {
                    slots[map.syndrome_slot[dd]] = member_bytes(&d, m, stripe * 16, 16).to_vec();
                }
                let refs: Vec<&[u8]> = slots.iter().map(|v| v.as_slice()).collect();
                let (mut p, mut q) = (vec![0u8; 16 * 512], vec![0u8; 16 * 512]);
                uraid_parity::gen_syndrome(&refs, &mut p, &mut q);
                assert!(p == member_bytes(&d, map.pd_idx, stripe * 16, 16), "{ctx}: stripe {stripe} P");
                if let Some(qd) = map.qd_idx {
                    assert!(q == member_bytes(&d, qd, stripe * 16, 16), "{ctx}: stripe {stripe} Q");
                }
            }
        } else {
            for s in (0..g.array_sectors()).step_by(8) {
                g.copies(s, &mut copies);
                let want = &model[(s * 512) as usize..((s + 8) * 512) as usize];
                for c in &copies {
                    assert!(
                        member_bytes(&d, c.member, c.member_sector, 8) == want,
                        "{ctx}: sector {s} copy on {}",
                        c.member
                    );
                }
            }
        }
    }
}

/// Member reads of a fresh engine whose recovery or resync is run to completion (its first
/// reads go out as the job starts, so nothing is subtracted).
fn sync_reads(d: &mut Driver) -> u64 {
    let mut guard = 0;
    while d.engine.sync_active() {
        d.engine.tick(d.now_ns);
        d.step();
        guard += 1;
        assert!(guard < 1_000_000, "sync never finished");
    }
    d.run_until_idle();
    d.engine.stats().member_reads()
}

#[test]
fn a_restarted_recovery_resumes_from_its_checkpoint() {
    for (level, n, layout) in
        [(Level::Raid6, 6, algorithm::LEFT_SYMMETRIC), (Level::Raid5, 4, 2), (Level::Raid1, 2, 0)]
    {
        let ctx = format!("{level:?} n={n}");
        let g = geo(level, n, layout);
        let size = g.array_bytes();
        let mut d = Driver::new(
            Engine::new(config(g.clone(), 4096)).unwrap(),
            MemMembers::new(n, 4096 + 4096 * 512),
            9,
        );
        let mut model = vec![0u8; size as usize];
        let mut rng = Rng(5);
        let mut id = 0;
        write_random(&mut d, &mut model, &mut rng, &mut id, 80);
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        // A full recovery of member 1, for reference.
        let full = {
            let mut c = config(g.clone(), 4096);
            c.members[1].state = MemberState::Recovering { recovery_offset_sectors: 0 };
            let mut m = MemMembers::new(n, 4096 + 4096 * 512);
            m.images = members.images.clone();
            let mut d = Driver::new(Engine::new(c).unwrap(), m, 1);
            sync_reads(&mut d)
        };
        // The checkpoint says half was rebuilt; the other half of the member is blank.
        let half = 2048u64;
        let mut c = config(g.clone(), 4096);
        c.members[1].state = MemberState::Recovering { recovery_offset_sectors: half };
        let mut m = MemMembers::new(n, 4096 + 4096 * 512);
        m.images = members.images.clone();
        m.images[1][(4096 + half * 512) as usize..].fill(0);
        let mut d = Driver::new(Engine::new(c).unwrap(), m, 2);
        let resumed = sync_reads(&mut d);
        assert!(resumed * 10 <= full * 6, "{ctx}: resumed recovery read {resumed} times, a full one {full}");
        assert!(resumed * 10 >= full * 4, "{ctx}: resumed recovery read only {resumed} times of {full}");
        assert_eq!(d.engine.member_states()[1], MemberState::InSync, "{ctx}");
        // The rebuilt member must now carry the data alone where it is needed.
        let mut c = config(g.clone(), 4096);
        let lose: Vec<usize> = match level {
            Level::Raid6 => vec![0, 2],
            Level::Raid5 => vec![0],
            _ => vec![0],
        };
        for &o in &lose {
            c.members[o].state = MemberState::Missing;
        }
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut d2 = Driver::new(Engine::new(c).unwrap(), members, 3);
        read_all(&mut d2, &model, &mut id, &ctx);
    }
}

#[test]
fn a_bitmap_resync_touches_only_the_dirty_regions() {
    for (level, n, layout) in
        [(Level::Raid6, 6, algorithm::LEFT_SYMMETRIC), (Level::Raid5, 4, 2), (Level::Raid10, 4, 0x102)]
    {
        let g = geo(level, n, layout);
        let run = |ranges: Option<Vec<(u64, u64)>>| {
            let mut d = Driver::new(
                Engine::new(config(g.clone(), 4096)).unwrap(),
                MemMembers::new(n, 4096 + 4096 * 512),
                4,
            );
            d.engine.start_resync(ranges, 0);
            sync_reads(&mut d)
        };
        let full = run(None);
        // Two dirty bitmap chunks of 128 sectors out of 4096 member sectors.
        let dirty = run(Some(vec![(0, 128), (2048, 2176)]));
        assert!(dirty > 0, "{level:?}: a dirty region must be resynced");
        assert!(
            dirty * 8 <= full,
            "{level:?}: resync of 2 dirty chunks read {dirty} times, a full one {full}"
        );
    }
}

/// md's MD_SB_CHANGE_PENDING: once a member fails, nothing is acknowledged until the caller
/// has recorded the failure (else a crash could bring the failed member back as in sync).
#[test]
fn completions_wait_for_the_failure_to_be_recorded() {
    let g = geo(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC);
    let mut cfg = config(g, 4096);
    cfg.tunables.hold_completions_on_member_failure = true;
    let mut d = Driver::new(Engine::new(cfg).unwrap(), MemMembers::new(4, 4096 + 4096 * 512), 3);
    d.run_one(Request::write(1, 0, vec![1; 65536])).unwrap();
    d.members.gone[2] = true;
    d.submit(Request::write(2, 0, vec![2; 3 * 65536]));
    d.run_until_idle();
    assert_eq!(d.engine.member_states()[2], MemberState::Faulty);
    assert!(d.take_done(2).is_none(), "a write completed before the failure was recorded");
    assert!(d.engine.metadata_pending());
    assert_eq!(d.engine.pop_event(), Some(EngineEvent::MemberFaulty(2)));
    d.engine.metadata_committed();
    d.run_until_idle();
    assert_eq!(d.take_done(2).map(|c| c.result.is_ok()), Some(true));
}

/// An executor that completes the oldest half of the member I/Os outstanding each poll, as
/// a real one would, reading into the spare buffer a read came with when it has one.
struct SpareReads<'a> {
    members: &'a mut MemMembers,
    pending: Vec<MemberIo>,
    reads: u64,
    with_spare: u64,
    buffers: HashSet<usize>,
}

impl drive::MemberExecutor for SpareReads<'_> {
    fn issue(&mut self, io: MemberIo) {
        self.pending.push(io);
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        assert!(!self.pending.is_empty(), "the recovery stalled");
        let k = self.pending.len().div_ceil(2);
        for mut io in self.pending.drain(..k).collect::<Vec<_>>() {
            if io.op == MemberIoOp::Read {
                self.reads += 1;
                if let Ok(mut v) = std::mem::take(&mut io.data).try_into_unique_vec() {
                    assert_eq!(v.len() as u64, io.len_bytes, "a spare buffer of the read's length");
                    self.with_spare += 1;
                    self.buffers.insert(v.as_ptr() as usize);
                    let (a, len) = (io.offset_bytes as usize, v.len());
                    v.copy_from_slice(&self.members.images[io.member][a..a + len]);
                    out.push(MemberIoCompletion { id: io.id, result: Ok(v) });
                    continue;
                }
            }
            out.push(self.members.perform(io));
        }
    }
}

/// A raid6 recovery hands the executor a spare buffer for nearly every read (the buffers of
/// units it finished), and its heads leave the cache once rebuilt: the buffers in use stay
/// within the sync window, however long the member, instead of growing to the whole
/// stripe cache with a fresh allocation per read.
#[test]
fn a_recovery_reads_into_recycled_buffers_and_keeps_memory_within_its_window() {
    let n = 6;
    let g = Geometry::new(Level::Raid6, n, algorithm::LEFT_SYMMETRIC, 16, &vec![16384; n]).unwrap();
    // Consistent content first, written through a whole array.
    let mut d = Driver::new(Engine::new(config(g.clone(), 0)).unwrap(), MemMembers::new(n, 16384 * 512), 2);
    let mut model = vec![0u8; g.array_bytes() as usize];
    Rng(3).fill(&mut model);
    for (i, piece) in model.chunks(1 << 20).enumerate() {
        d.run_one(Request::write(i as u64 + 1, (i << 20) as u64, piece.to_vec())).expect("write");
    }
    let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    members.images[5].fill(0);
    let mut c = config(g, 0);
    c.members[5].state = MemberState::Recovering { recovery_offset_sectors: 0 };
    let mut engine = Engine::new(c).unwrap();
    let mut ex = SpareReads {
        members: &mut members,
        pending: Vec::new(),
        reads: 0,
        with_spare: 0,
        buffers: HashSet::new(),
    };
    let mut now = 0;
    while engine.sync_active() {
        now += 10_000;
        engine.tick(now);
        drive::exchange(&mut engine, &mut ex, &mut || now, &mut Vec::new(), |_| {});
    }
    let SpareReads { reads, with_spare, buffers, .. } = ex;
    assert_eq!(engine.member_states()[5], MemberState::InSync);
    // 16384 sectors per member in heads of 16 sectors: 1024 heads, 4 reads each (of the 5
    // survivors, Q is not needed for a lost data block or P, nor P for a lost Q; member 5
    // is each of them in turn as the layout rotates).
    assert_eq!(reads, 4 * 1024);
    assert!(with_spare * 10 >= reads * 9, "only {with_spare} of {reads} reads had a spare buffer");
    // Six buffers per head in the window (32 heads), plus a head's worth of slack.
    assert!(buffers.len() <= 6 * 33, "{} distinct read buffers", buffers.len());
    // The rebuilt member carries the data: read everything without two other members.
    let mut c = config(engine.geometry().clone(), 0);
    c.members[0].state = MemberState::Missing;
    c.members[1].state = MemberState::Missing;
    let mut d = Driver::new(Engine::new(c).unwrap(), members, 4);
    read_all(&mut d, &model, &mut 1000, "raid6 without members 0 and 1");
}

/// Recovery in row units (several stripe heads per member I/O, with chunks larger than a
/// head) while writes keep landing in the rows being rebuilt, completions arrive in any
/// order, and a survivor has a latent read error (its row falls back to per-head recovery):
/// the rebuilt member then carries the data.
#[test]
fn row_units_rebuild_under_concurrent_writes_and_a_read_error() {
    for (level, n, layout) in [
        (Level::Raid6, 6, algorithm::LEFT_SYMMETRIC),
        (Level::Raid6, 5, algorithm::RIGHT_ASYMMETRIC),
        (Level::Raid5, 4, algorithm::LEFT_SYMMETRIC),
        (Level::Raid4, 4, algorithm::PARITY_N),
    ] {
        let ctx = format!("{level:?} n={n} layout={layout}");
        // 256 KiB chunks: four 64 KiB heads per row unit; 8 MiB members.
        let g = Geometry::new(level, n, layout, 512, &vec![16384; n]).unwrap();
        let mut c = config(g.clone(), 4096);
        // A small cache: two row units in flight, so writes meet them often.
        c.tunables.stripe_cache_size = 32;
        let mut d = Driver::new(Engine::new(c).unwrap(), MemMembers::new(n, 4096 + 16384 * 512), 7);
        let mut model = vec![0u8; g.array_bytes() as usize];
        Rng(11).fill(&mut model);
        let mut id = 0;
        for (i, piece) in model.chunks(1 << 20).enumerate() {
            id += 1;
            d.run_one(Request::write(id, (i << 20) as u64, piece.to_vec())).expect("write");
        }
        let victim = 1;
        d.engine.fail_member(victim, d.now_ns);
        d.members.images[victim].fill(0);
        // A latent error on a survivor, in the third row (raid6 only: with one member
        // being rebuilt, raid4/5 has no redundancy left to recover it from).
        let bad = 4096 + 2 * 512 * 512 + 8192;
        if level == Level::Raid6 {
            d.members.latent.push((2, bad, bad + 4096));
        }
        d.engine.add_member(victim, 4096, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: add: {e}"));
        let mut rng = Rng(21);
        let mut steps = 0u64;
        while d.engine.sync_active() {
            if steps.is_multiple_of(2) {
                // Mostly into the rows being rebuilt right now.
                let len = (1 + rng.below(96)) * 512;
                let at = d.engine.sync_status().map_or(0, |s| s.recovery_offset_sectors) / 512;
                let stripe_bytes = (n as u64 - level.parity_disks() as u64) * 512 * 512;
                let near = at * stripe_bytes + rng.below(3 * stripe_bytes);
                let off = if rng.below(4) == 0 { rng.below(model.len() as u64 - len) } else { near };
                let off = (off.min(model.len() as u64 - len) / 512) * 512;
                let mut data = vec![0u8; len as usize];
                rng.fill(&mut data);
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
                id += 1;
                let mut req = Request::write(id, off, data);
                loop {
                    match d.engine.submit(req, d.now_ns) {
                        Ok(()) => break,
                        Err(SubmitError::Busy(r)) => {
                            req = r;
                            d.step();
                        }
                    }
                }
                d.engine.unplug(d.now_ns);
            }
            d.step();
            steps += 1;
            assert!(steps < 2_000_000, "{ctx}: recovery never finished");
        }
        d.run_until_idle();
        assert!(d.done.iter().all(|c| c.result.is_ok()), "{ctx}: a write failed");
        assert_eq!(d.engine.member_states()[victim], MemberState::InSync, "{ctx}");
        // The row read met the latent error (and the row went the per-head way, which
        // reads again only what its heads do not hold already), unless a write covered
        // the bad sectors first.
        let met = d.engine.stats().members[2].errors > 0;
        assert!(met || d.members.latent.is_empty(), "{ctx}: the latent error was not met");
        d.members.latent.clear();
        let lose: Vec<usize> = if level == Level::Raid6 { vec![0, 2] } else { vec![0] };
        let mut c = config(g, 4096);
        for &o in &lose {
            c.members[o].state = MemberState::Missing;
        }
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut d2 = Driver::new(Engine::new(c).unwrap(), members, 8);
        read_all(&mut d2, &model, &mut id, &ctx);
    }
}

/// A mirror read straddling a recovering member's recovery_offset must not be served from
/// that member: its sectors past the offset are not rebuilt yet (garbage here).
#[test]
fn a_read_straddling_recovery_offset_is_not_served_from_unrebuilt_sectors() {
    use uraid_core::mirror::Balance;
    for (level, n, layout) in
        [(Level::Raid1, 2, 0), (Level::Raid10, 4, parse_layout(Level::Raid10, "n2").unwrap())]
    {
        for (name, balance) in Balance::NAMES {
            let ctx = format!("{level:?} n={n} balance={name}");
            let g = Geometry::new(level, n, layout, 1024, &vec![8192; n]).unwrap();
            let mut model = vec![0u8; g.array_bytes() as usize];
            Rng(17).fill(&mut model);
            let mut d =
                Driver::new(Engine::new(config(g.clone(), 0)).unwrap(), MemMembers::new(n, 8192 * 512), 1);
            d.run_one(Request::write(1, 0, model.clone())).expect("write");
            let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
            // Member 0 is rebuilt below sector 1536 only (inside a chunk); past it, garbage.
            let offset = 1536u64;
            members.images[0][(offset * 512) as usize..].fill(0xa5);
            let mut c = config(g.clone(), 0);
            c.members[0].state = MemberState::Recovering { recovery_offset_sectors: offset };
            c.tunables.balance = *balance;
            let mut engine = Engine::new(c).unwrap();
            // The recovery unit in flight must not mask the fault: complete I/Os in order,
            // so the read's member I/Os land before any rebuilt data.
            let start = offset - 64;
            let len = if level == Level::Raid1 { 512u64 } else { 128 };
            // raid10 n2 on 4: member 0 holds array chunks 0, 2, ...: its member sector s is
            // array sector (s / 1024) * 2048 + s % 1024.
            let array_start =
                if level == Level::Raid1 { start } else { (start / 1024) * 2048 + start % 1024 };
            engine.submit(Request::read(2, array_start * 512, len * 512), 0).unwrap();
            engine.unplug(0);
            let (mut got, mut pending) = (None, Vec::new());
            for _ in 0..1000 {
                let mut ex = InOrder::all(&mut members, &mut pending);
                drive::exchange(&mut engine, &mut ex, &mut || 0, &mut Vec::new(), |c| got = Some(c));
                if got.is_some() {
                    break;
                }
            }
            let got = got.expect("read completed").result.expect("read ok");
            let a = (array_start * 512) as usize;
            assert!(got == model[a..a + (len * 512) as usize], "{ctx}: read served from unrebuilt sectors");
        }
    }
}

/// A stripe head read that fails on a latent error must rebuild only the sectors that fail
/// (md reads and rebuilds per page): the readable ones, rebuilt from parity a resync has
/// not reached yet, would be replaced with garbage.
#[test]
fn a_latent_error_rebuilds_only_its_own_sectors_during_a_resync() {
    let g = geo(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC);
    let size = g.array_bytes();
    let mut d =
        Driver::new(Engine::new(config(g.clone(), 4096)).unwrap(), MemMembers::new(4, 4096 + 4096 * 512), 7);
    let mut model = vec![0u8; size as usize];
    Rng(5).fill(&mut model);
    d.run_one(Request::write(1, 0, model.clone())).expect("write");
    let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    // Stripe 0: a power cut left P stale in rows 0..4; a data member has a latent error in
    // rows 4..6 (where P is still good).
    let map = g.stripe_map(0);
    let x = map.data_members[0];
    let row = |r: usize| 4096 + r * 512;
    Rng(9).fill(&mut members.images[map.pd_idx][row(0)..row(4)]);
    members.latent.push((x, row(4) as u64, row(6) as u64));
    let before = members.images[x][row(0)..row(16)].to_vec();
    let mut d = Driver::new(Engine::new(config(g.clone(), 4096)).unwrap(), members, 8);
    d.engine.start_resync(None, 0);
    sync_reads(&mut d);
    assert!(d.members.latent.is_empty(), "the latent sectors were rewritten");
    assert!(
        member_bytes(&d, x, 0, 16) == &before[..],
        "readable sectors of the head were rebuilt from stale parity"
    );
    let mut id = 10;
    read_all(&mut d, &model, &mut id, "raid5 after resync");
}

/// md counts a member being recovered as missing (raid5's calc_degraded, raid1's and
/// raid10's `enough` look at In_sync members only): above its recovery_offset it holds
/// nothing yet. A second failure during the recovery that leaves only it to cover some
/// blocks fails the array, as md's does; a level with redundancy left runs on.
#[test]
fn a_second_failure_during_recovery_fails_the_array_only_beyond_its_redundancy() {
    for (level, n, layout) in cases() {
        if level == Level::Raid10 {
            continue; // which copies a second failure takes decides; covered by the sim
        }
        let ctx = format!("{level:?} n={n} layout={layout}");
        let g = geo(level, n, layout);
        let size = g.array_bytes();
        let mut d =
            Driver::new(Engine::new(config(g, 4096)).unwrap(), MemMembers::new(n, 4096 + 4096 * 512), 5);
        let mut model = vec![0u8; size as usize];
        let mut rng = Rng(7);
        let mut id = 0;
        write_random(&mut d, &mut model, &mut rng, &mut id, 40);
        d.engine.fail_member(1, d.now_ns);
        d.members.images[1].fill(0);
        // Slow enough that the recovery is caught half way.
        sync_speed(&mut d, 1);
        d.engine.add_member(1, 4096, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: add: {e}"));
        // A few steps: the recovery has started, not finished.
        for _ in 0..4 {
            d.step();
        }
        assert!(
            matches!(d.engine.member_states()[1], MemberState::Recovering { .. }),
            "{ctx}: the recovery finished too soon for the test"
        );
        d.engine.fail_member(0, d.now_ns);
        let survives = match level {
            Level::Raid1 => n > 2,
            _ => level.parity_disks() >= 2,
        };
        assert_eq!(!d.engine.is_failed(), survives, "{ctx}: failed={}", d.engine.is_failed());
        if survives {
            sync_speed(&mut d, 1 << 20);
            while d.engine.sync_active() {
                write_random(&mut d, &mut model, &mut rng, &mut id, 1);
            }
            read_all(&mut d, &model, &mut id, &ctx);
        }
    }
}

/// A raid1 recovery whose source is gone (not a latent sector: the device answers nothing)
/// fails that source, as a request's read or a raid4/5/6 sync read does. It used to stop
/// the recovery only, leaving a vanished member "in sync" and the array running on it.
#[test]
fn a_recovery_source_that_is_gone_is_failed() {
    for n in [2usize] {
        let g = geo(Level::Raid1, n, 0);
        let size = g.array_bytes();
        let mut d =
            Driver::new(Engine::new(config(g, 4096)).unwrap(), MemMembers::new(n, 4096 + 4096 * 512), 5);
        let mut model = vec![0u8; size as usize];
        let mut rng = Rng(3);
        let mut id = 0;
        write_random(&mut d, &mut model, &mut rng, &mut id, 20);
        d.engine.fail_member(1, d.now_ns);
        d.members.images[1].fill(0);
        sync_speed(&mut d, 1);
        d.engine.add_member(1, 4096, d.now_ns).unwrap();
        // Every source vanishes.
        for m in (0..n).filter(|&m| m != 1) {
            d.members.gone[m] = true;
        }
        sync_speed(&mut d, 1 << 20);
        d.run_until_idle();
        let states = d.engine.member_states();
        assert!(d.engine.is_failed(), "n={n}: the array runs on with every source gone: {states:?}");
    }
}

/// A raid1 recovery whose source copy has a latent sector reads that piece from another
/// in-sync copy and rewrites the bad sector, as md's sync read tries every mirror (it used
/// to stop the recovery for good: `uraid sim --seed 1265` never converged).
#[test]
fn a_recovery_reads_a_latent_sector_from_another_copy_and_rewrites_it() {
    let g = geo(Level::Raid1, 3, 0);
    let size = g.array_bytes();
    let mut d = Driver::new(Engine::new(config(g, 4096)).unwrap(), MemMembers::new(3, 4096 + 4096 * 512), 5);
    let mut model = vec![0u8; size as usize];
    let mut rng = Rng(11);
    let mut id = 0;
    write_random(&mut d, &mut model, &mut rng, &mut id, 30);
    d.engine.fail_member(2, d.now_ns);
    d.members.images[2].fill(0);
    // The first copy, which recovery reads first, has a latent sector half way.
    let at = (4096 + 512 * 2048) as u64;
    d.members.latent.push((0, at, at + 1024));
    d.engine.add_member(2, 4096, d.now_ns).unwrap();
    d.run_until_idle();
    assert_eq!(d.engine.member_states(), vec![MemberState::InSync; 3], "the recovery did not finish");
    assert!(d.members.latent.is_empty(), "the latent sectors were rewritten from the other copy");
    for m in 0..3 {
        assert!(member_bytes(&d, m, 0, 4096) == member_bytes(&d, 1, 0, 4096), "copy {m} differs");
    }
    read_all(&mut d, &model, &mut id, "raid1 after the recovery");
}

/// A degraded raid6 read, then a recovery, meet a latent sector on another data member of
/// a stripe whose parity a power cut left stale in other rows. Every row of the failed
/// fill is found (its halves all read back) and rewritten, not only the first; the
/// member's readable rows stay as read and the resync's parity agrees with the disks. (A
/// head kept cached from the recovery to the resync, where solving the member over every
/// row showed, is `uraid sim --seed 9936`, in `sim::check`'s seeds_found_failing_pass.)
#[test]
fn a_partly_unreadable_member_keeps_its_good_rows_during_a_recovery() {
    // Four stripes: the head stays cached from the recovery to the resync, as in the sim.
    let g = Geometry::new(Level::Raid6, 6, algorithm::LEFT_SYMMETRIC, 16, &[64; 6]).unwrap();
    let size = g.array_bytes();
    let mut d =
        Driver::new(Engine::new(config(g.clone(), 4096)).unwrap(), MemMembers::new(6, 4096 + 64 * 512), 7);
    let mut model = vec![0u8; size as usize];
    Rng(21).fill(&mut model);
    d.run_one(Request::write(1, 0, model.clone())).expect("write");
    let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    let map = g.stripe_map(0);
    let (target, x) = (map.data_members[0], map.data_members[1]);
    let row = |r: usize| 4096 + r * 512;
    // Stale P in rows 12..16 (a torn write), a latent range on x in rows 2..6, and the
    // target a blank disk to rebuild.
    Rng(9).fill(&mut members.images[map.pd_idx][row(12)..row(16)]);
    members.latent.push((x, row(2) as u64, row(6) as u64));
    members.images[target].fill(0);
    let x_good = members.images[x][row(6)..row(16)].to_vec();
    let mut d = Driver::new(Engine::new(config(g.clone(), 4096)).unwrap(), members, 8);
    d.engine.fail_member(target, d.now_ns);
    // A degraded read of x's block: its readable rows come from x itself, whatever the
    // stale P says (two erasures only where x failed to read).
    let block = 16 * 512;
    let got = d.run_one(Request::read(2, block as u64, block as u64)).expect("read");
    assert!(got[..] == model[block..2 * block], "x's block read back wrong while degraded");
    d.engine.add_member(target, 4096, d.now_ns).unwrap();
    d.run_until_idle();
    d.engine.start_resync(None, d.now_ns);
    d.run_until_idle();
    assert_eq!(d.engine.member_states(), vec![MemberState::InSync; 6]);
    assert!(d.members.latent.is_empty(), "the latent rows were rewritten");
    assert_eq!(&d.members.images[x][row(6)..row(16)], &x_good[..], "x's readable rows were replaced");
    // On disk, P of stripe 0 is the XOR of its data blocks, row by row.
    let mut p = vec![0u8; row(16) - row(0)];
    for &m in &map.data_members {
        for (a, b) in p.iter_mut().zip(&d.members.images[m][row(0)..row(16)]) {
            *a ^= b;
        }
    }
    assert!(p[..] == d.members.images[map.pd_idx][row(0)..row(16)], "P disagrees with the data on disk");
}

/// A recovery resumed at start reaches the member through the index the caller gives the
/// slot after building the engine (an array started from members offered in another order
/// than their slots): nothing is issued before the first call after the set-up.
#[test]
fn a_resumed_recovery_issues_nothing_until_the_caller_set_the_engine_up() {
    for (level, n, layout) in cases() {
        let ctx = format!("{level:?} n={n} layout={layout}");
        let mut cfg = config(geo(level, n, layout), 0);
        cfg.members[1].state = MemberState::Recovering { recovery_offset_sectors: 64 };
        let mut e = Engine::new(cfg).unwrap();
        assert!(e.pop_member_io().is_none(), "{ctx}: I/O issued while the engine was being built");
        e.set_io_member(1, 40).unwrap();
        assert_eq!(e.next_deadline_ns(), Some(0), "{ctx}: the queued recovery asks to be started");
        e.tick(0);
        let ios: Vec<MemberIo> = std::iter::from_fn(|| e.pop_member_io()).collect();
        assert!(!ios.is_empty(), "{ctx}: the recovery did not start");
        assert!(ios.iter().all(|io| io.member != 1), "{ctx}: I/O went to the slot's old index");
    }
}

/// md's handle_failed_sync (raid4/5/6) and fix_sync_read_error (raid1/10): a recovery
/// meeting sectors no source can supply (latent or listed beyond the redundancy) records
/// them as bad blocks on the member being rebuilt and goes on. The member ends in sync;
/// reads of those sectors fail with EIO, everything else reads back. (It used to stop
/// for good: the member stayed recovering, and a new `add` stopped at the same row.)
#[test]
fn a_recovery_records_what_no_source_can_read_as_bad_blocks_on_its_target_and_finishes() {
    let n2 = parse_layout(Level::Raid10, "n2").unwrap();
    let ls = algorithm::LEFT_SYMMETRIC;
    // (level, members, layout, the sources that cannot give sector S, besides the target)
    for (level, n, layout, latent) in [
        (Level::Raid5, 3, ls, vec![0]),
        (Level::Raid5, 4, ls, vec![2]),
        (Level::Raid6, 4, ls, vec![0, 2]),
        (Level::Raid1, 2, 0, vec![0]),
        (Level::Raid10, 4, n2, vec![0]),
    ] {
        for listed in [false, true] {
            recovery_beyond_redundancy(level, n, layout, &latent, listed);
        }
    }
}

/// The recovery of member 1 of `level` on `n` where sector `S` of each of `latent` cannot
/// be read: a latent sector, or one their bad-block logs list.
fn recovery_beyond_redundancy(level: Level, n: usize, layout: u32, latent: &[usize], listed: bool) {
    let ctx = format!("{level:?} n={n} listed {listed}");
    let g = geo(level, n, layout);
    let size = g.array_bytes();
    let target = 1;
    let mut d =
        Driver::new(Engine::new(config(g.clone(), 4096)).unwrap(), MemMembers::new(n, 4096 + 4096 * 512), 5);
    let mut model = vec![0u8; size as usize];
    Rng(17).fill(&mut model);
    d.run_one(Request::write(1, 0, model.clone())).expect("write");
    d.engine.fail_member(target, d.now_ns);
    d.members.images[target].fill(0);
    d.engine.set_bad_blocks(target, Some(uraid_core::meta::BadBlocks::new(0, 8)));
    // One sector half way down the sources, unreadable on as many as the level survives.
    const S: u64 = 2050;
    for &m in latent {
        if listed {
            let mut bb = uraid_core::meta::BadBlocks::new(0, 8);
            assert!(bb.set(8 + S, 1));
            d.engine.set_bad_blocks(m, Some(bb));
        } else {
            let at = 4096 + S * 512;
            d.members.latent.push((m, at, at + 512));
        }
    }
    d.engine.add_member(target, 4096, d.now_ns).unwrap();
    d.run_until_idle();
    assert_eq!(d.engine.member_states(), vec![MemberState::InSync; n], "{ctx}: the recovery did not finish");
    let recorded: Vec<(usize, u64, u64)> = std::iter::from_fn(|| d.engine.pop_event())
        .filter_map(|e| match e {
            EngineEvent::BadBlocksRecorded { slot, sector, sectors } => Some((slot, sector, sectors)),
            _ => None,
        })
        .collect();
    let abs = 8 + S;
    assert!(
        recorded.iter().any(|&(slot, s, l)| slot == target && s <= abs && abs < s + l),
        "{ctx}: sector {S} not recorded bad on the target: {recorded:?}"
    );
    let listed: u64 = recorded.iter().map(|r| r.2).sum();
    assert!(listed <= 8, "{ctx}: {listed} sectors recorded bad for one unreadable sector");
    // Reads: EIO exactly where every copy (or too many members of the row) is lost.
    let lost = |sector: u64| -> bool {
        let bad = |e: &Extent| e.member_sector == S && (e.member == target || latent.contains(&e.member));
        let mut copies = Vec::new();
        if matches!(level, Level::Raid1 | Level::Raid10) {
            g.copies(sector, &mut copies);
            copies.iter().all(bad)
        } else {
            bad(&g.map_sector(sector).0)
        }
    };
    let mut eio = 0;
    for (i, at) in (0..size).step_by(4096).enumerate() {
        let want_lost = (at / 512..at / 512 + 8).any(lost);
        match d.run_one(Request::read(100 + i as u64, at, 4096)) {
            Ok(got) => {
                assert!(!want_lost, "{ctx}: bytes {at}+4096 read back though no source holds them");
                assert!(got[..] == model[at as usize..at as usize + 4096], "{ctx}: bytes {at}+4096 differ");
            }
            Err(e) => {
                assert!(want_lost, "{ctx}: bytes {at}+4096: {e:?}");
                assert_eq!(e, RequestError::Io, "{ctx}");
                eio += 1;
            }
        }
    }
    assert!(eio > 0, "{ctx}: no read met the lost sector");
}

/// md's raid6 recovery rebuilds every failed device a stripe meets from one read of the
/// others: two members added together are rebuilt by one pass, with half the survivor
/// reads and half the (paced) time of rebuilding them one after the other. The members
/// are next to each other, so each stripe loses two data blocks, a data block and P or Q,
/// or P and Q; once rebuilt they carry the data with two others gone.
#[test]
fn a_raid6_rebuilds_two_members_in_one_pass() {
    for (n, layout) in [(6, algorithm::LEFT_SYMMETRIC), (5, algorithm::LEFT_ASYMMETRIC)] {
        let mut cost = Vec::new();
        for together in [true, false] {
            let ctx = format!("raid6 n={n} layout={layout} together={together}");
            let g = geo(Level::Raid6, n, layout);
            let mut d = Driver::new(
                Engine::new(config(g.clone(), 4096)).unwrap(),
                MemMembers::new(n, 4096 + 4096 * 512),
                5,
            );
            let mut model = vec![0u8; g.array_bytes() as usize];
            Rng(31).fill(&mut model);
            d.run_one(Request::write(1, 0, model.clone())).expect("write");
            let mut rng = Rng(32);
            let mut id = 1;
            write_random(&mut d, &mut model, &mut rng, &mut id, 20);
            for v in [1, 2] {
                d.engine.fail_member(v, d.now_ns);
                d.members.images[v].fill(0);
            }
            d.run_until_idle();
            sync_speed(&mut d, 100 << 10);
            d.engine.reset_stats();
            let t0 = d.now_ns;
            let mut events = Vec::new();
            let mut rebuild = |d: &mut Driver, slots: &[usize]| {
                for &v in slots {
                    d.engine.add_member(v, 4096, d.now_ns).unwrap_or_else(|e| panic!("{ctx}: add: {e}"));
                }
                let mut guard = 0;
                while d.engine.sync_active() {
                    d.step();
                    guard += 1;
                    assert!(guard < 1_000_000, "{ctx}: the recovery never finished");
                }
                d.run_until_idle();
                events.extend(std::iter::from_fn(|| d.engine.pop_event()));
            };
            if together {
                rebuild(&mut d, &[1, 2]);
            } else {
                rebuild(&mut d, &[1]);
                rebuild(&mut d, &[2]);
            }
            let done = events.iter().filter(|e| matches!(e, EngineEvent::RecoveryDone(1 | 2))).count();
            assert_eq!(done, 2, "{ctx}: {events:?}");
            assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync), "{ctx}");
            cost.push((d.engine.stats().members.iter().map(|m| m.read_bytes).sum::<u64>(), d.now_ns - t0));
            // The rebuilt members carry the data with two others gone.
            for v in [0, 3] {
                d.engine.fail_member(v, d.now_ns);
            }
            read_all(&mut d, &model, &mut id, &ctx);
        }
        let ((one_pass_bytes, one_pass_ns), (two_pass_bytes, two_pass_ns)) = (cost[0], cost[1]);
        assert!(
            one_pass_bytes * 10 <= two_pass_bytes * 6,
            "n={n}: one pass read {one_pass_bytes} bytes, two passes {two_pass_bytes}"
        );
        assert!(
            one_pass_ns * 10 <= two_pass_ns * 6,
            "n={n}: one pass took {one_pass_ns} ns, two {two_pass_ns}"
        );
    }
}

/// Two raid6 members both recovering at a start (a power cut during their recovery) are
/// rebuilt by one pass from the lower recovery_offset, as md's recovery starts at the
/// lowest offset of the devices it recovers; the higher one never goes back.
#[test]
fn a_raid6_recovery_of_two_members_resumes_as_one_pass() {
    let n = 6;
    let g = geo(Level::Raid6, n, algorithm::LEFT_SYMMETRIC);
    let mut d =
        Driver::new(Engine::new(config(g.clone(), 4096)).unwrap(), MemMembers::new(n, 4096 + 4096 * 512), 7);
    let mut model = vec![0u8; g.array_bytes() as usize];
    Rng(41).fill(&mut model);
    d.run_one(Request::write(1, 0, model.clone())).expect("write");
    let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    // Member 1 was rebuilt up to sector 2048 before the cut, member 2 up to 512.
    let (off1, off2) = (2048u64, 512u64);
    members.images[1][(4096 + off1 * 512) as usize..].fill(0);
    members.images[2][(4096 + off2 * 512) as usize..].fill(0);
    let mut c = config(g.clone(), 4096);
    c.members[1].state = MemberState::Recovering { recovery_offset_sectors: off1 };
    c.members[2].state = MemberState::Recovering { recovery_offset_sectors: off2 };
    let mut d = Driver::new(Engine::new(c).unwrap(), members, 8);
    let mut guard = 0;
    let mut jobs = HashSet::new();
    while d.engine.sync_active() {
        d.step();
        if let Some(s) = d.engine.sync_status() {
            jobs.insert(format!("{:?}", s.kind));
            if let MemberState::Recovering { recovery_offset_sectors } = d.engine.member_states()[1] {
                assert!(recovery_offset_sectors >= off1, "member 1's recovery_offset went back");
            }
        }
        guard += 1;
        assert!(guard < 1_000_000, "the recovery never finished");
    }
    d.run_until_idle();
    assert_eq!(jobs.len(), 1, "more than one pass: {jobs:?}");
    assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync));
    let mut id = 10;
    for v in [0, 3] {
        d.engine.fail_member(v, d.now_ns);
    }
    read_all(&mut d, &model, &mut id, "raid6 after one resumed pass");
}
