//! The running array's metadata state machine: events and dev_roles after each
//! transition, md_error on a failed metadata write, safe mode, and the write-intent
//! bitmap's ordering (bits durable before the write, cleared only after a flush).

use uraid_core::array::*;
use uraid_core::meta::*;

const NOW: u64 = 1_700_000_000;
const DEV_SECTORS: u64 = 1 << 21; // 1 GiB

/// A clean 3-member RAID5 with an internal bitmap (1 MiB bitmap chunks), keys 10, 11, 12
/// in slots 0, 1, 2.
fn raid5(bitmap: bool) -> ArraySuperblocks {
    let mut p = CreateParams::new(5, vec![Some(DEV_SECTORS); 3]);
    p.set_uuid = [7; 16];
    p.device_uuids = (0..3).map(|i| [i as u8 + 1; 16]).collect();
    p.bitmap = bitmap;
    p.bitmap_chunk_bytes = Some(1 << 20);
    p.assume_clean = true;
    let c = create_array(&p).unwrap();
    let members = c
        .superblocks
        .iter()
        .enumerate()
        .map(|(slot, sb)| ArrayMember {
            key: 10 + slot as u64,
            sb: sb.clone().unwrap(),
            role: DevRole::Active { slot, recovering: false },
        })
        .collect();
    let events = c.superblocks[0].as_ref().unwrap().events;
    let bm = c.bitmap.map(|b| (WriteIntentBitmap::new(b.sb), b.offset_from_sb_sectors));
    ArraySuperblocks::new(members, events, false, false, bm)
}

/// Performs a round where `failing` fails every I/O; returns the outcome.
fn run(a: &mut ArraySuperblocks, round: MetaRound, failing: &[MemberKey]) -> RoundOutcome {
    let failed = round.execute(|io| !failing.contains(&io.key()));
    a.round_done(round, &failed, NOW)
}

/// Performs `round` and every retry with no failure; returns the last round performed.
fn run_ok(a: &mut ArraySuperblocks, round: MetaRound) -> MetaRound {
    let last = round.clone();
    let out = run(a, round, &[]);
    assert!(out.newly_failed_slots.is_empty());
    match out.next.unwrap() {
        Some(next) => run_ok(a, next),
        None => last,
    }
}

/// The superblocks a round writes, parsed back, by member key.
fn superblocks(round: &MetaRound) -> Vec<(MemberKey, Superblock)> {
    round
        .ios
        .iter()
        .filter_map(|io| match io {
            MetaIo::Write { key, what: MetaWriteKind::Superblock, offset_bytes, bytes, .. } => {
                assert_eq!(*offset_bytes, 8 * 512, "superblock 1.2 is 4 KiB from the start");
                Some((*key, Superblock::parse(bytes, 8).unwrap()))
            }
            _ => None,
        })
        .collect()
}

fn roles(round: &MetaRound) -> Vec<u16> {
    let sbs = superblocks(round);
    let roles = sbs[0].1.dev_roles.clone();
    assert!(sbs.iter().all(|(_, sb)| sb.dev_roles == roles && sb.events == round.events));
    roles
}

#[test]
fn events_and_dev_roles_follow_each_transition() {
    let mut a = raid5(false);
    let e0 = a.events();
    assert!(!a.mark_clean(), "already clean");
    assert!(a.mark_dirty());
    let r = a.write_superblocks(NOW);
    assert_eq!(r.events, e0 + 1);
    assert_eq!(roles(&r)[..3], [0, 1, 2]);
    run_ok(&mut a, r);
    assert!(a.is_dirty() && !a.mark_dirty());

    // md_error on slot 1: FAULTY in dev_roles, and its own superblock is not written.
    a.member_failed(1);
    let r = a.write_superblocks(NOW);
    assert_eq!(r.events, e0 + 2);
    assert_eq!(roles(&r)[..3], [0, role::FAULTY, 2]);
    assert!(superblocks(&r).iter().all(|(k, _)| *k != 11));
    run_ok(&mut a, r);

    // A new member arrives as a spare, then takes slot 1 and is rebuilt.
    let mut sb = a.members()[0].sb.clone();
    sb.dev_number = 3;
    sb.device_uuid = [9; 16];
    a.member_added(ArrayMember { key: 13, sb, role: DevRole::Spare });
    let r = a.write_superblocks(NOW);
    assert_eq!(r.events, e0 + 3);
    assert_eq!(roles(&r)[..4], [0, role::FAULTY, 2, role::SPARE]);
    run_ok(&mut a, r);
    a.spare_activated(13, 1);
    let r = a.write_superblocks(NOW);
    assert_eq!(roles(&r)[..4], [0, role::FAULTY, 2, 1]);
    let new = superblocks(&r).into_iter().find(|(k, _)| *k == 13).unwrap().1;
    assert!(new.has(feature::RECOVERY_OFFSET) && new.recovery_offset == 0);
    run_ok(&mut a, r);
    a.record_recovery_offset(1, 4096);
    let r = a.write_superblocks(NOW);
    let new = superblocks(&r).into_iter().find(|(k, _)| *k == 13).unwrap().1;
    assert_eq!(new.recovery_offset, 4096);
    run_ok(&mut a, r);
    a.recovery_done(1);
    let r = a.write_superblocks(NOW);
    assert_eq!(r.events, e0 + 6);
    let new = superblocks(&r).into_iter().find(|(k, _)| *k == 13).unwrap().1;
    assert!(!new.has(feature::RECOVERY_OFFSET) && new.recovery_offset == 0);
    run_ok(&mut a, r);

    // The failed member is removed: its dev_roles entry is free again.
    a.member_removed(11);
    let r = a.write_superblocks(NOW);
    assert_eq!(roles(&r)[..4], [0, role::SPARE, 2, 1]);
    run_ok(&mut a, r);
    assert_eq!(a.events(), e0 + 7);
    assert_eq!(a.members().len(), 3);
}

#[test]
fn a_failed_superblock_write_fails_the_member_and_the_retry_records_it() {
    let mut a = raid5(true);
    let e0 = a.events();
    assert!(a.mark_dirty());
    let r = a.write_superblocks(NOW);
    let out = run(&mut a, r, &[12]);
    assert_eq!(out.newly_failed_slots, vec![2]);
    let retry = out.next.unwrap().unwrap();
    assert!(retry.writes_superblocks());
    assert_eq!(retry.events, e0 + 2);
    assert_eq!(roles(&retry)[..3], [0, 1, role::FAULTY]);
    assert!(retry.ios.iter().all(|io| io.key() != 12), "a faulty member is not written");
    assert!(superblocks(&retry).iter().all(|(_, sb)| sb.resync_offset == 0), "still marking dirty");
    run_ok(&mut a, retry);
    assert!(a.is_dirty());
    assert_eq!(a.members()[2].role, DevRole::Faulty { slot: 2 });

    // A failure of the bitmap page skips that member's superblock in the same round.
    let r = a.write_superblocks(NOW);
    let skipped = r.execute(|io| {
        !(io.key() == 11 && matches!(io, MetaIo::Write { what: MetaWriteKind::BitmapPage { .. }, .. }))
    });
    assert_eq!(skipped, vec![11]);

    // The last working members failing too is an error, with the slots still reported.
    let out = a.round_done(r, &[10, 11], NOW);
    assert_eq!(out.newly_failed_slots, vec![0, 1]);
    assert_eq!(out.next.unwrap_err(), MetaError::NoWorkingMember);
}

#[test]
fn a_failed_spare_leaves_the_array() {
    let mut a = raid5(false);
    let mut sb = a.members()[0].sb.clone();
    sb.dev_number = 3;
    a.member_added(ArrayMember { key: 13, sb, role: DevRole::Spare });
    let r = a.write_superblocks(NOW);
    let out = run(&mut a, r, &[13]);
    assert!(out.newly_failed_slots.is_empty(), "a spare has no slot to fail in the engine");
    let retry = out.next.unwrap().unwrap();
    assert_eq!(roles(&retry)[..4], [0, 1, 2, role::SPARE]);
    run_ok(&mut a, retry);
    assert!(a.member(13).is_none());
}

#[test]
fn resync_offset_is_max_sector_only_when_clean() {
    let mut a = raid5(false);
    assert!(a.mark_dirty());
    let r = a.write_superblocks(NOW);
    assert!(superblocks(&r).iter().all(|(_, sb)| sb.resync_offset == 0));
    run_ok(&mut a, r);
    assert!(a.mark_clean());
    let r = a.write_superblocks(NOW);
    assert!(superblocks(&r).iter().all(|(_, sb)| sb.resync_offset == MAX_SECTOR));
    run_ok(&mut a, r);
    assert!(!a.is_dirty());
    // A clean array's other updates stay clean.
    a.record_recovery_offset(0, 0);
    let r = a.write_superblocks(NOW);
    assert!(superblocks(&r).iter().all(|(_, sb)| sb.resync_offset == MAX_SECTOR));
    run_ok(&mut a, r);

    // A resync owed: safe mode does not mark clean, a stop leaves it dirty at the
    // checkpoint the resync reached.
    let mut a = ArraySuperblocks::new(a.members().to_vec(), a.events(), true, true, None);
    assert!(!a.mark_clean());
    a.record_resync_checkpoint(8192);
    a.stop();
    let r = a.write_superblocks(NOW);
    assert!(superblocks(&r).iter().all(|(_, sb)| sb.resync_offset == 8192));
    run_ok(&mut a, r);
    assert!(a.is_dirty());
    a.resync_done();
    assert!(a.mark_clean());
    let r = a.write_superblocks(NOW);
    assert!(superblocks(&r).iter().all(|(_, sb)| sb.resync_offset == MAX_SECTOR));
    run_ok(&mut a, r);

    // A failed array is never written clean, not even at stop.
    a.array_failed();
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);
    assert!(!a.mark_clean());
    a.stop();
    let r = a.write_superblocks(NOW);
    assert!(superblocks(&r).iter().all(|(_, sb)| sb.resync_offset != MAX_SECTOR));
}

/// The bit of `chunk` as the page writes of `round` put it on member `key`.
fn bit_written(round: &MetaRound, key: MemberKey, chunk: u64) -> Option<bool> {
    let bit_byte = BITMAP_SUPER_BYTES as u64 + chunk / 8;
    round.ios.iter().rev().find_map(|io| match io {
        MetaIo::Write { key: k, what: MetaWriteKind::BitmapPage { page }, bytes, .. } if *k == key => {
            let at = bit_byte.checked_sub(page * 4096)? as usize;
            bytes.get(at).map(|b| b & (1 << (chunk % 8)) != 0)
        }
        _ => None,
    })
}

#[test]
fn bitmap_bits_are_written_before_the_write_and_cleared_only_after_a_flush() {
    let mut a = raid5(true);
    assert!(a.mark_dirty());
    let r = a.write_superblocks(NOW);
    // Bitmap page 0 (with events) goes before the superblocks on every member.
    let first_sb =
        r.ios.iter().position(|io| matches!(io, MetaIo::Write { what: MetaWriteKind::Superblock, .. }));
    assert_eq!(first_sb, Some(3));
    run_ok(&mut a, r);

    // RAID5 of 3: array bytes 0.. map to member sectors 0.., so chunk 0 of the bitmap.
    let w = a.start_write(0, 4096);
    assert!(!w.pages.is_empty(), "a new bit is persisted before the write");
    let round = a.bitmap_pages_round(w.pages.clone());
    assert!(!round.writes_superblocks());
    for key in [10, 11, 12] {
        assert_eq!(bit_written(&round, key, 0), Some(true));
    }
    assert!(round
        .ios
        .iter()
        .all(|io| matches!(io, MetaIo::Write { offset_bytes, .. } if *offset_bytes >= 8 * 512 + 8 * 512)));
    run_ok(&mut a, round);
    // The bit is durable: the next write to the chunk goes at once.
    let w2 = a.start_write(8192, 4096);
    assert!(w2.pages.is_empty());
    a.end_write(w2.sync_range, true);
    a.end_write(w.sync_range, true);

    // The daemon nominates on the second idle pass; the bit is cleared only after the
    // flush round succeeded, and then written cleared.
    assert!(a.bitmap_daemon().is_none());
    let flush = a.bitmap_daemon().expect("idle for two passes");
    assert!(flush.ios.iter().all(|io| matches!(io, MetaIo::Flush { .. })));
    assert_eq!(flush.ios.len(), 3);
    assert!(a.bitmap().unwrap().is_set(0), "not cleared before the flush");
    let out = run(&mut a, flush, &[]);
    let clear = out.next.unwrap().expect("cleared bits are written");
    assert!(!a.bitmap().unwrap().is_set(0));
    assert_eq!(bit_written(&clear, 10, 0), Some(false));
    run_ok(&mut a, clear);
    assert_eq!(a.bitmap().unwrap().superblock().events_cleared, a.events());
}

#[test]
fn a_failed_daemon_flush_clears_nothing_and_fails_the_member() {
    let mut a = raid5(true);
    assert!(a.mark_dirty());
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);
    let w = a.start_write(0, 4096);
    let r = a.bitmap_pages_round(w.pages.clone());
    run_ok(&mut a, r);
    a.end_write(w.sync_range, true);
    assert!(a.bitmap_daemon().is_none());
    let flush = a.bitmap_daemon().unwrap();
    let events = a.events();
    let out = run(&mut a, flush, &[11]);
    assert_eq!(out.newly_failed_slots, vec![1]);
    let retry = out.next.unwrap().unwrap();
    assert!(retry.writes_superblocks(), "the failure is recorded, no bit cleared");
    assert_eq!(retry.events, events + 1);
    assert!(a.bitmap().unwrap().is_set(0));
    run_ok(&mut a, retry);
    assert!(a.bitmap().unwrap().is_set(0));
    // Nor does a later pass: the flush never reached member 1, its copy may be lost.
    for _ in 0..3 {
        assert!(a.bitmap_daemon().is_none(), "a daemon pass over a bit member 1 may have lost");
    }

    // A failed bitmap page write before a data write fails that member too; the write
    // may still go (the bit is durable on every member still working).
    let w = a.start_write(64 << 20, 4096);
    let r = a.bitmap_pages_round(w.pages);
    let out = run(&mut a, r, &[12]);
    assert_eq!(out.newly_failed_slots, vec![2]);
    let retry = out.next.unwrap().unwrap();
    assert_eq!(roles(&retry)[..3], [0, role::FAULTY, role::FAULTY]);
    run_ok(&mut a, retry);
    assert!(a.start_write(64 << 20, 4096).pages.is_empty());
}

/// Member 2's copy of the write may sit in its volatile cache only: no flush reached it
/// before it failed, so the bit stays for its re-add (and events_cleared stays too).
#[test]
fn bits_stay_set_while_degraded_for_a_re_add() {
    let mut a = raid5(true);
    assert!(a.mark_dirty());
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);
    let w = a.start_write(0, 4096);
    let r = a.bitmap_pages_round(w.pages.clone());
    run_ok(&mut a, r);
    a.end_write(w.sync_range, true);
    let cleared_before = a.bitmap().unwrap().superblock().events_cleared;
    // Member 2 leaves: the array is degraded from here.
    a.member_failed(2);
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);
    for _ in 0..3 {
        assert!(a.bitmap_daemon().is_none(), "a daemon pass while the bit is needed for the re-add");
    }
    assert!(a.bitmap().unwrap().is_set(0), "the bit of a write member 2 may have lost was cleared");
    assert_eq!(
        a.bitmap().unwrap().superblock().events_cleared,
        cleared_before,
        "events_cleared moved while degraded: the member that left could no longer be re-added from the bitmap"
    );
}

#[test]
fn a_replacement_shares_its_slot_until_done_then_the_old_member_leaves() {
    let mut a = raid5(false);
    let e0 = a.events();
    let mut sb = a.members()[0].sb.clone();
    sb.dev_number = 3;
    sb.device_uuid = [9; 16];
    a.member_added(ArrayMember { key: 13, sb, role: DevRole::Spare });
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);

    // md's want_replacement: the same dev_roles entry as slot 1's member; its own
    // superblock carries MD_FEATURE_REPLACEMENT and recovery_offset; slot 1's does not.
    a.replacement_started(13, 1, 0);
    let r = a.write_superblocks(NOW);
    assert_eq!(roles(&r)[..4], [0, 1, 2, 1]);
    let sbs = superblocks(&r);
    let new = &sbs.iter().find(|(k, _)| *k == 13).unwrap().1;
    assert!(new.has(feature::REPLACEMENT) && new.has(feature::RECOVERY_OFFSET) && new.recovery_offset == 0);
    let old = &sbs.iter().find(|(k, _)| *k == 11).unwrap().1;
    assert!(!old.has(feature::REPLACEMENT) && !old.has(feature::RECOVERY_OFFSET));
    run_ok(&mut a, r);

    a.record_replacement_offset(1, 8192);
    let r = a.write_superblocks(NOW);
    let new = superblocks(&r).into_iter().find(|(k, _)| *k == 13).unwrap().1;
    assert_eq!(new.recovery_offset, 8192);
    run_ok(&mut a, r);

    // Done: the replacement is slot 1's member, in sync; the old member is gone from the
    // array and its superblock is not written (its events fall behind).
    let left = a.replacement_done(1);
    assert_eq!(left, Some(11));
    let r = a.write_superblocks(NOW);
    assert_eq!(roles(&r)[..4], [0, role::SPARE, 2, 1]);
    assert!(superblocks(&r).iter().all(|(k, _)| *k != 11));
    let new = superblocks(&r).into_iter().find(|(k, _)| *k == 13).unwrap().1;
    assert!(!new.has(feature::REPLACEMENT) && !new.has(feature::RECOVERY_OFFSET));
    run_ok(&mut a, r);
    assert_eq!(a.member(13).unwrap().role, DevRole::Active { slot: 1, recovering: false });
    assert!(a.member(11).is_none());
    assert!(a.events() > e0);
}

#[test]
fn a_failed_replacement_leaves_and_the_member_keeps_its_slot() {
    let mut a = raid5(false);
    let mut sb = a.members()[0].sb.clone();
    sb.dev_number = 3;
    sb.device_uuid = [9; 16];
    a.member_added(ArrayMember { key: 13, sb, role: DevRole::Spare });
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);
    a.replacement_started(13, 2, 0);
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);
    // Its superblock write fails: md_error on the replacement, never on slot 2's member.
    let r = a.write_superblocks(NOW);
    let out = run(&mut a, r, &[13]);
    assert!(out.newly_failed_slots.is_empty(), "the slot's member was failed");
    run_ok(&mut a, out.next.unwrap().unwrap());
    assert!(a.member(13).is_none());
    assert_eq!(a.member(12).unwrap().role, DevRole::Active { slot: 2, recovering: false });
    // And given up on purpose.
    let mut sb = a.members()[0].sb.clone();
    sb.dev_number = 4;
    a.member_added(ArrayMember { key: 14, sb, role: DevRole::Spare });
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);
    a.replacement_started(14, 0, 0);
    let r = a.write_superblocks(NOW);
    run_ok(&mut a, r);
    a.replacement_failed(0);
    let r = a.write_superblocks(NOW);
    assert_eq!(roles(&r)[..3], [0, 1, 2]);
    run_ok(&mut a, r);
    assert!(a.member(14).is_none());
}
