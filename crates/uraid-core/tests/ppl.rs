//! md's partial parity log on a running RAID5 (`Array` over members in RAM): every stripe
//! write logs its partial parity to the parity member first, and after a power cut the
//! replay (`meta::ppl_recover`) makes every stripe's parity agree with its data again, so
//! a degraded array rebuilds the data nobody wrote as it was (the write hole closed).

mod common;

use common::*;
use uraid_core::array::*;
use uraid_core::meta::*;
use uraid_core::*;

const MEMBER_BYTES: u64 = 8 << 20;
const CHUNK: u64 = 64 << 10;

/// `uraid create --assume-clean --consistency-policy ppl` of a RAID5 of `n` in RAM.
fn create(n: usize) -> MemMembers {
    let mut p = CreateParams::new(5, vec![Some(MEMBER_BYTES / 512); n]);
    p.ppl = true;
    p.bitmap = false;
    p.assume_clean = true;
    p.set_uuid = [9; 16];
    p.device_uuids = (0..n).map(|i| [i as u8 + 1; 16]).collect();
    p.ctime_seconds = EPOCH_S;
    p.name = "ppl".into();
    p.chunk_kib = Some((CHUNK / 1024) as u32);
    create_in_ram(&p, MEMBER_BYTES)
}

/// Plans the members `keys` as `uraid serve --run` does; with `replay`, replays the log
/// into the images first as `uraid serve` does. Returns the plan and the recovery.
fn plan(mm: &mut MemMembers, keys: &[usize], replay: bool) -> (AssemblyPlan, PplRecovery) {
    let metas: Vec<MemberMetadata> = keys.iter().map(|&k| mm.metadata(k)).collect();
    let offered: Vec<OfferedMember> = metas.iter().map(|m| m.offered.clone()).collect();
    let mut plan = plan_assembly(&offered, &AssembleOptions { run: true, uuid: None, force: false }).unwrap();
    if !replay {
        return (plan, PplRecovery::default());
    }
    let sbs: Vec<Superblock> = offered.iter().map(|o| o.superblock.clone().unwrap()).collect();
    let images = &mm.images;
    let rec = ppl_recover(&plan, &sbs, &mut |m, off, len| {
        let img = &images[keys[m]];
        Ok(img[off as usize..off as usize + len].to_vec())
    })
    .unwrap();
    for w in &rec.writes {
        let img = &mut mm.images[keys[w.member]];
        img[w.offset_bytes as usize..w.offset_bytes as usize + w.bytes.len()].copy_from_slice(&w.bytes);
    }
    plan.apply_ppl_recovery(&rec);
    (plan, rec)
}

fn start(mm: MemMembers, keys: &[usize], plan: &AssemblyPlan, seed: u64) -> Driver<Array> {
    let start: Vec<StartMember> =
        keys.iter().map(|&k| StartMember::from_metadata(k as u64, mm.metadata(k)).unwrap()).collect();
    let opts = ArrayOptions { epoch_seconds: EPOCH_S, ..ArrayOptions::default() };
    Driver::new(Array::start(plan, start, opts).unwrap(), mm, seed)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed).fill(&mut v);
    v
}

/// Performs the oldest member I/O when `perform` is set; the ones `hold` matches are never
/// performed (the power cut loses them).
struct HoldBack<'a> {
    members: &'a mut MemMembers,
    pending: &'a mut Vec<MemberIo>,
    held: usize,
    hold: &'a dyn Fn(&MemberIo) -> bool,
    perform: bool,
}

impl drive::MemberExecutor for HoldBack<'_> {
    fn issue(&mut self, io: MemberIo) {
        if (self.hold)(&io) {
            self.held += 1;
        } else {
            self.pending.push(io);
        }
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        if self.perform && !self.pending.is_empty() {
            out.push(self.members.perform(self.pending.remove(0)));
        }
    }
}

/// Performs the array's member I/O in the order it comes, holding back every write for
/// which `hold` says so, until `done` says the cut has come; then the power goes: what
/// was not performed is lost. Returns the ids of the requests completed before.
fn run_until_cut(
    d: &mut Driver<Array>,
    hold: &dyn Fn(&MemberIo) -> bool,
    done: &dyn Fn(&MemMembers) -> bool,
) -> Vec<RequestId> {
    d.engine.unplug(d.now_ns);
    let mut completed = Vec::new();
    let mut ex = HoldBack { members: &mut d.members, pending: &mut d.pending, held: 0, hold, perform: false };
    let mut scratch = Vec::new();
    for _ in 0..1_000_000 {
        d.now_ns += 10_000;
        let now = d.now_ns;
        let mut finished = |c: RequestCompletion| {
            assert!(c.result.is_ok(), "{:?}", c.result);
            completed.push(c.id);
        };
        // The cut is judged between two completions: issue and answer what is due, look,
        // then perform one I/O.
        ex.perform = false;
        drive::exchange(&mut d.engine, &mut ex, &mut || now, &mut scratch, &mut finished);
        if done(ex.members) {
            return completed;
        }
        if ex.pending.is_empty() {
            match d.engine.next_deadline_ns() {
                Some(t) => {
                    d.now_ns = d.now_ns.max(t);
                    d.engine.tick(d.now_ns);
                    continue;
                }
                None => panic!("the cut never came: {} writes held, nothing else to do", ex.held),
            }
        }
        ex.perform = true;
        drive::exchange(&mut d.engine, &mut ex, &mut || now, &mut scratch, &mut finished);
    }
    panic!("the cut never came");
}

/// A degraded RAID5 of 3 (slot 2 missing) with PPL: a 4 KiB write lands on its data
/// member (slot 0) and the power goes before the stripe's parity (slot 1) is written.
/// Slot 2's block of that row was never written, and is rebuilt from parity: with the log
/// replayed it reads back as it was; without the replay it reads back as garbage, the
/// write hole this closes.
#[test]
fn a_power_cut_between_data_and_parity_on_a_degraded_raid5_with_ppl_loses_nothing_after_replay() {
    const REGION: usize = 1 << 20;
    let mut mm = create(3);
    let (p, _) = plan(&mut mm, &[0, 1, 2], true);
    let mut d = start(mm, &[0, 1, 2], &p, 1);
    let before = pattern(1, REGION);
    d.run_one(Request::write(1, 0, before.clone())).unwrap();
    let data_offset = d.members.metadata(0).offered.superblock.unwrap().data_offset * 512;
    let mut mm = d.members;

    // Slot 2 is gone from now on; some writes are acknowledged, then the torn one.
    let keys = [0, 1];
    let (p, _) = plan(&mut mm, &keys, true);
    let mut d = start(mm, &keys, &p, 2);
    let mut want = before.clone();
    for (id, at) in [(10u64, 4096u64), (11, 200 << 10), (12, 300 << 10)] {
        let w = pattern(id, 8192);
        d.run_one(Request::write(id, at, w.clone())).unwrap();
        want[at as usize..at as usize + w.len()].copy_from_slice(&w);
    }
    // Stripe 0's parity member is the missing one: nothing to log there (md's R5_Insync).
    assert_eq!(d.engine.engine().stats().ppl_log_writes, 2, "each stripe write with its parity logs first");
    // Stripe 1 of a left-symmetric RAID5 of 3: parity on slot 1, data index 0 on slot 2
    // (array bytes 128K..192K), data index 1 on slot 0 (192K..256K).
    let torn_at = 3 * CHUNK + 8192;
    let torn = pattern(99, 4096);
    d.submit(Request::write(13, torn_at, torn.clone()));
    let member_at = data_offset + CHUNK + 8192;
    let parity_write =
        |io: &MemberIo| io.member == 1 && io.op == MemberIoOp::Write && io.offset_bytes == member_at;
    let landed = |m: &MemMembers| m.images[0][member_at as usize..member_at as usize + 4096] == torn[..];
    let completed = run_until_cut(&mut d, &parity_write, &landed);
    assert!(!completed.contains(&13), "the torn write was acknowledged before its parity landed");
    let crashed = d.members;

    for replay in [true, false] {
        let mut mm = MemMembers::new(3, MEMBER_BYTES);
        mm.images = crashed.images.clone();
        let (p, rec) = plan(&mut mm, &keys, replay);
        if replay {
            assert!(rec.recovered_entries > 0 && rec.mismatch_count == 0, "{rec:?}");
            assert_eq!(p.resync, ResyncNeed::None, "a replayed log leaves no resync owed");
        }
        let mut d = start(mm, &keys, &p, 3);
        let got = d.run_one(Request::read(20, 0, REGION as u64)).unwrap();
        let torn_rg = torn_at as usize..torn_at as usize + 4096;
        let others_ok =
            got[..torn_rg.start] == want[..torn_rg.start] && got[torn_rg.end..] == want[torn_rg.end..];
        let torn_ok = got[torn_rg.clone()] == torn[..] || got[torn_rg.clone()] == want[torn_rg];
        if replay {
            assert!(torn_ok, "the write in flight reads back neither old nor new");
            let first_bad = (0..REGION)
                .find(|&i| got[i] != want[i] && !(torn_at as usize..torn_at as usize + 4096).contains(&i));
            assert!(
                others_ok,
                "data nobody wrote changed after the replay, first at array byte {first_bad:?}"
            );
        } else {
            let never_written = (2 * CHUNK + 8192) as usize..(2 * CHUNK + 12288) as usize;
            assert_ne!(
                got[never_written.clone()],
                want[never_written],
                "without the replay the write hole should show in slot 2's block of the torn row"
            );
        }
    }
}

/// Every parity row of the first `region` array bytes agrees with its data, member by
/// member (a RAID5 of `n`, all present). Returns the first row that does not.
fn first_inconsistent_row(mm: &MemMembers, n: usize, data_offset: u64, region: u64) -> Option<u64> {
    let data_disks = n as u64 - 1;
    let member_bytes = region / data_disks;
    (0..member_bytes / 512).find(|&row| {
        let at = (data_offset + row * 512) as usize;
        let mut x = [0u8; 512];
        for img in &mm.images[..n] {
            x.iter_mut().zip(&img[at..at + 512]).for_each(|(a, b)| *a ^= b);
        }
        x.iter().any(|&b| b != 0)
    })
}

/// Random writes (sub-page and multi-chunk, read-modify-write and reconstruct-write) on a
/// RAID5 with PPL, member I/O completed in a random order, power cut at a random point:
/// after the replay every stripe's parity agrees with its data again and every
/// acknowledged write reads back. Without the replay some seed leaves a stripe torn.
#[test]
fn after_a_power_cut_anywhere_the_replay_leaves_every_stripe_consistent() {
    // 3 members mostly reconstruct-write, 5 mostly read-modify-write.
    for (n, seeds) in [(3usize, 15u64), (5, 30)] {
        power_cuts(n, seeds);
    }
}

fn power_cuts(n: usize, seeds: u64) {
    const SLOT: u64 = 96 << 10;
    let region = 3 << 20;
    let mut torn_seeds = 0;
    for seed in 0..seeds {
        let mut mm = create(n);
        let keys: Vec<usize> = (0..n).collect();
        let (p, _) = plan(&mut mm, &keys, true);
        let mut d = start(mm, &keys, &p, seed);
        let data_offset = d.members.metadata(0).offered.superblock.unwrap().data_offset * 512;
        // Old data and parity that are not zero: a partial parity that left out the old
        // parity would go unnoticed over zeroes.
        d.run_one(Request::write(1000, 0, pattern(seed + 500, region as usize))).unwrap();
        let mut rng = Rng(seed * 7 + 1);
        let mut writes = Vec::new();
        let mut slots: Vec<u64> = (0..region / SLOT).collect();
        for id in 1..=24u64 {
            let k = rng.below(slots.len() as u64) as usize;
            let slot = slots.swap_remove(k);
            let start_sector = rng.below(SLOT / 512 - 1);
            let len_sectors = 1 + rng.below(SLOT / 512 - start_sector);
            let at = slot * SLOT + start_sector * 512;
            let data = pattern(seed * 1000 + id, (len_sectors * 512) as usize);
            d.submit(Request::write(id, at, data.clone()));
            writes.push((id, at, data));
        }
        d.engine.unplug(d.now_ns);
        let cut_after = 1 + rng.below(60);
        let mut performed = 0;
        while performed < cut_after && d.step() {
            performed += 1;
        }
        let acked: Vec<RequestId> = d.done.iter().filter(|c| c.result.is_ok()).map(|c| c.id).collect();
        let mut mm = MemMembers::new(n, MEMBER_BYTES);
        mm.images = d.members.images.clone();
        if first_inconsistent_row(&mm, n, data_offset, region).is_some() {
            torn_seeds += 1;
        }
        let (p, rec) = plan(&mut mm, &keys, true);
        assert_eq!(rec.mismatch_count, 0, "{n} members, seed {seed}: {rec:?}");
        if let Some(row) = first_inconsistent_row(&mm, n, data_offset, region) {
            panic!("{n} members, seed {seed}: member row {row} is inconsistent after the replay ({rec:?})");
        }
        let mut d = start(mm, &keys, &p, seed);
        for (id, at, data) in writes.iter().filter(|w| acked.contains(&w.0)) {
            let got = d.run_one(Request::read(100 + id, *at, data.len() as u64)).unwrap();
            assert!(got == *data, "{n} members, seed {seed}: acknowledged write {id} lost");
        }
    }
    assert!(torn_seeds > 0, "{n} members: no power cut tore a stripe, the test shows nothing");
}

/// The newest log in `member`'s area, as md's scan finds it.
fn newest_log(mm: &MemMembers, member: usize) -> Option<(u64, PplHeader)> {
    let sb = mm.metadata(member).offered.superblock.unwrap();
    let (start, sectors) = ppl_area(&sb).unwrap();
    let img = &mm.images[member];
    latest_ppl_header(ppl_usable_sectors(sectors).unwrap(), ppl_signature(&sb.set_uuid), &mut |off| {
        let at = ((start + off) * 512) as usize;
        Ok(img[at..at + PPL_HEADER_SIZE].to_vec())
    })
    .unwrap()
}

/// What the log holds, read before any data lands (the data writes held back): md's
/// entries, one per run of rows writing the same data members; members between two
/// written ones count as written (md makes such writes wait instead); the partial parity
/// is the XOR of the members left alone, and a write to every data member logs none.
#[test]
fn the_log_names_each_row_run_and_its_partial_parity_as_md_writes_them() {
    const N: usize = 5;
    let mut mm = create(N);
    let keys: Vec<usize> = (0..N).collect();
    let (p, _) = plan(&mut mm, &keys, true);
    let mut d = start(mm, &keys, &p, 5);
    let old = pattern(7, (4 * CHUNK) as usize);
    d.run_one(Request::write(1, 0, old.clone())).unwrap();
    let sb = d.members.metadata(0).offered.superblock.unwrap();
    let data_offset = sb.data_offset * 512;
    // Stripe 0 (parity on slot 4): data indices 0 and 2 at rows 8K..12K in one batch,
    // and data index 1 alone at rows 16K..24K.
    let a = pattern(8, 4096);
    let b = pattern(9, 4096);
    let c = pattern(10, 8192);
    d.submit(Request::write(2, 8192, a.clone()));
    d.submit(Request::write(3, 2 * CHUNK + 8192, b.clone()));
    d.submit(Request::write(4, CHUNK + 16384, c.clone()));
    let data_write = |io: &MemberIo| io.op == MemberIoOp::Write && io.offset_bytes >= data_offset;
    let logged = |m: &MemMembers| newest_log(m, 4).is_some_and(|(_, h)| h.generation == 2);
    run_until_cut(&mut d, &data_write, &logged);
    let (offset, h) = newest_log(&d.members, 4).unwrap();
    assert_eq!(offset, 8, "right after the first log, whose full-stripe entries carry no partial parity");
    let rows = |e: &PplEntry| (e.data_sector, e.data_size, e.pp_size, e.parity_disk);
    let got: Vec<_> = h.entries.iter().map(rows).collect();
    assert_eq!(
        got,
        vec![(16, 3 * 4096, 4096, 4), (CHUNK / 512 + 32, 2 * 4096, 2 * 4096, 4)],
        "one entry for data indices 0..=2 of rows 8K..12K, one for index 1 of rows 16K..24K"
    );
    // The partial parity follows the header in entry order.
    let sb4 = d.members.metadata(4).offered.superblock.unwrap();
    let (start, _) = ppl_area(&sb4).unwrap();
    let at = ((start + offset) * 512) as usize + PPL_HEADER_SIZE;
    let logged_pp = &d.members.images[4][at..at + 3 * 4096];
    let xor = |parts: &[&[u8]]| -> Vec<u8> {
        let mut x = vec![0u8; parts[0].len()];
        parts.iter().for_each(|p| x.iter_mut().zip(*p).for_each(|(a, b)| *a ^= b));
        x
    };
    let chunk = CHUNK as usize;
    let want_first = old[3 * chunk + 8192..3 * chunk + 12288].to_vec();
    let rows_16k = 16384..24576;
    let want_second = xor(&[
        &old[rows_16k.start..rows_16k.end],
        &old[2 * chunk + rows_16k.start..2 * chunk + rows_16k.end],
        &old[3 * chunk + rows_16k.start..3 * chunk + rows_16k.end],
    ]);
    assert_eq!(&logged_pp[..4096], &want_first[..], "partial parity: data index 3, left alone");
    assert_eq!(&logged_pp[4096..], &want_second[..], "partial parity: data indices 0, 2 and 3");
    assert_eq!(h.entries[0].checksum, crc32c(&logged_pp[..4096]));
    assert_eq!(h.entries[1].checksum, crc32c(&logged_pp[4096..]));
}

/// A device that joins a slot may carry a log of an older life in its area, with higher
/// generations than this run's: md's scan would take it for the newest and replay it over
/// parity written since. So the slot's first log write covers the whole area (md's
/// `ppl_write_empty_header` when a member is added).
#[test]
fn a_member_that_joins_has_its_old_log_wiped_by_its_first_log_write() {
    let mut mm = create(3);
    let keys = [0usize, 1, 2];
    let (p, _) = plan(&mut mm, &keys, true);
    let mut d = start(mm, &keys, &p, 9);
    d.run_one(Request::write(1, 0, pattern(1, 1 << 20))).unwrap();
    d.members.gone[2] = true;
    d.run_one(Request::write(2, 0, pattern(2, 4096))).unwrap();
    d.run_until_idle();
    assert_eq!(d.engine.engine().member_states()[2], MemberState::Faulty);

    let key = d.members.add_member(MEMBER_BYTES);
    let sb = d.engine.new_member_superblock(MEMBER_BYTES / 512, [0x66; 16], "new").unwrap();
    let mut sb_w = sb.clone();
    let at = (sb.super_offset * 512) as usize;
    d.members.images[key][at..at + SB_BYTES].copy_from_slice(&sb_w.update_csum());
    // An old log: a header at the area's start and a far newer one where this run's
    // second header would go.
    let (start, _) = ppl_area(&sb).unwrap();
    let sig = ppl_signature(&sb.set_uuid);
    for (off, generation) in [(0u64, 1u64), (16, 900)] {
        let e = PplEntry {
            data_sector: 0,
            pp_size: 4096,
            data_size: 4096,
            parity_disk: 2,
            checksum: crc32c(&[0; 4096]),
        };
        let h = PplHeader { signature: sig, generation, entries: vec![e] }.serialize().unwrap();
        let at = ((start + off) * 512) as usize;
        d.members.images[key][at..at + PPL_HEADER_SIZE].copy_from_slice(&h);
    }
    assert_eq!(newest_log(&d.members, key).map(|(off, h)| (off, h.generation)), Some((16, 900)));
    let new = NewMember {
        key: key as u64,
        name: "new".into(),
        sb,
        previous: None,
        replaces: None,
        bad_blocks: None,
    };
    assert!(matches!(d.engine.add_member(new, d.now_ns).unwrap(), Added::Rebuilding { slot: 2, .. }));
    d.run_until_idle();
    assert!(d.engine.engine().member_states().iter().all(|s| *s == MemberState::InSync));
    // Stripe 0's parity is on slot 2: this write logs to the new member.
    d.run_one(Request::write(3, 8192, pattern(3, 4096))).unwrap();
    let (off, h) = newest_log(&d.members, key).expect("a log");
    assert_eq!(off, 0);
    assert!(h.generation < 900 && h.entries.len() == 1, "the old log was taken for the newest: {h:?}");
    let area_end = ((start + 2048) * 512) as usize;
    let after = ((start + 16) * 512) as usize;
    assert!(d.members.images[key][after..area_end].iter().all(|&b| b == 0), "the old log is still there");
}

/// A device joining a slot is given an empty log before the array uses it in the slot (md's
/// `ppl_write_empty_header` in raid5_add_disk, via log_modify): a former member carrying an
/// old log of this array, rebuilt, then crashed dirty before its slot logged anything, must
/// not have those old entries replayed over the parity its recovery wrote (the replay
/// finding entries also skips the resync, so nothing would repair it).
#[test]
fn a_device_joining_a_slot_has_its_old_log_emptied_before_a_crash_can_replay_it() {
    const REGION: u64 = 1 << 20;
    let mut mm = create(3);
    let keys = [0usize, 1, 2];
    let (p, _) = plan(&mut mm, &keys, true);
    let mut d = start(mm, &keys, &p, 4);
    d.run_one(Request::write(1, 0, pattern(1, REGION as usize))).unwrap();
    let data_offset = d.members.metadata(0).offered.superblock.unwrap().data_offset * 512;
    // Slot 2 fails and is removed; its device comes back, carrying a log of this array:
    // an entry for stripe 0's first rows (whose parity slot 2 holds), with a generation
    // newer than anything this run wrote there.
    d.members.gone[2] = true;
    d.run_one(Request::write(2, 4096, pattern(2, 4096))).unwrap();
    d.run_until_idle();
    d.engine.remove(2, d.now_ns).unwrap();
    d.run_until_idle();
    d.members.gone[2] = false;
    let sb = d.engine.new_member_superblock(MEMBER_BYTES / 512, [0x67; 16], "back").unwrap();
    let mut sb_w = sb.clone();
    let at = (sb.super_offset * 512) as usize;
    d.members.images[2][at..at + SB_BYTES].copy_from_slice(&sb_w.update_csum());
    let (start_sector, _) = ppl_area(&sb).unwrap();
    let pp = pattern(3, 4096);
    let e =
        PplEntry { data_sector: 0, pp_size: 4096, data_size: 4096, parity_disk: 2, checksum: crc32c(&pp) };
    let h = PplHeader { signature: ppl_signature(&sb.set_uuid), generation: 900, entries: vec![e] };
    let h = h.serialize().unwrap();
    let at = (start_sector * 512) as usize;
    d.members.images[2][at..at + PPL_HEADER_SIZE].copy_from_slice(&h);
    d.members.images[2][at + PPL_HEADER_SIZE..at + PPL_HEADER_SIZE + 4096].copy_from_slice(&pp);
    assert_eq!(newest_log(&d.members, 2).map(|(_, h)| h.generation), Some(900));
    let new = NewMember { key: 2, name: "back".into(), sb, previous: None, replaces: None, bad_blocks: None };
    assert!(matches!(d.engine.add_member(new, d.now_ns).unwrap(), Added::Rebuilding { slot: 2, .. }));
    d.run_until_idle();
    assert!(d.engine.engine().member_states().iter().all(|s| *s == MemberState::InSync));
    assert_eq!(first_inconsistent_row(&d.members, 3, data_offset, REGION), None, "rebuilt");
    // A write to stripe 1 (parity on slot 1: slot 2 logs nothing) marks the array dirty;
    // the power goes once it is acknowledged, before the array is marked clean again.
    d.submit(Request::write(3, 2 * CHUNK + 8192, pattern(4, 4096)));
    d.engine.unplug(d.now_ns);
    while d.take_done(3).is_none() {
        assert!(d.step(), "the write never completed");
    }
    let mut mm = MemMembers::new(3, MEMBER_BYTES);
    mm.images = d.members.images.clone();
    assert_ne!(mm.superblock(0).resync_offset, MAX_SECTOR, "crashed dirty");
    let (p, rec) = plan(&mut mm, &keys, true);
    assert_eq!(
        first_inconsistent_row(&mm, 3, data_offset, REGION),
        None,
        "the replay put the joining device's old log over rebuilt parity ({rec:?}, resync {:?})",
        p.resync
    );
}
