//! mdadm 4.2 creation rules beyond the 16 MiB fixtures.

use uraid_core::meta::*;

#[test]
fn data_offset_rule() {
    let v12 = SuperblockVersion::V1_2;
    // The fixtures: 16 MiB members.
    assert_eq!(default_data_offset(v12, 32768, 64), 2048);
    assert_eq!(default_data_offset(v12, 32768, 32), 2048);
    assert_eq!(default_data_offset(v12, 32768, 0), 2048);
    assert_eq!(default_data_offset(v12, 32768, 512), 4096);
    // Large members get the full 128 MiB headroom: 264192 sectors (129 MiB), the value
    // mdadm 4.2 is known for on disks of 128 GiB and more.
    assert_eq!(default_data_offset(v12, 1 << 31, 512), 264192);
    assert_eq!(default_data_offset(v12, 1 << 28, 512), 264192);
    // About 0.1% in between.
    assert_eq!(default_data_offset(v12, 1 << 24, 512), 18432);
    assert_eq!(default_data_offset(SuperblockVersion::V1_0, 1 << 24, 512), 0);
}

#[test]
fn max_dev_rule() {
    assert_eq!(default_max_dev(2), 128);
    assert_eq!(default_max_dev(128), 128);
    assert_eq!(default_max_dev(129), 384);
}

#[test]
fn names_and_layouts() {
    let n = make_set_name(Some("host"), "data");
    assert_eq!(&n[..10], b"host:data\0");
    let n = make_set_name(Some("host"), "a:b");
    assert_eq!(&n[..4], b"a:b\0");
    let long = "x".repeat(40);
    let n = make_set_name(Some("host"), &long);
    assert_eq!(n[30], b'x');
    assert_eq!(n[31], 0);
    assert_eq!(default_layout(0), 1);
    assert_eq!(default_layout(5), 2);
    assert_eq!(default_layout(6), 2);
    assert_eq!(default_layout(10), 0x102);
    assert_eq!(default_layout(1), 0);
}

fn params(level: i32, sizes: Vec<Option<u64>>) -> CreateParams {
    let mut p = CreateParams::new(level, sizes);
    p.set_uuid = [9; 16];
    p.device_uuids = (0..p.member_dev_sectors.len()).map(|i| [i as u8; 16]).collect();
    p
}

#[test]
fn every_level_creates_superblocks_md_accepts_and_assembles() {
    let dev = 1u64 << 22; // 2 GiB
    for (level, n) in [(0, 3), (1, 2), (4, 4), (5, 4), (6, 6), (10, 4), (-1, 2)] {
        for bitmap in [false, true] {
            if bitmap && level <= 0 {
                continue;
            }
            let mut p = params(level, vec![Some(dev); n]);
            p.bitmap = bitmap;
            let c = create_array(&p).unwrap_or_else(|e| panic!("raid{level}: {e}"));
            let members: Vec<OfferedMember> = c
                .superblocks
                .iter()
                .enumerate()
                .map(|(i, sb)| {
                    let bytes = sb.as_ref().unwrap().serialize();
                    OfferedMember {
                        name: format!("m{i}"),
                        dev_sectors: dev,
                        superblock: Superblock::parse_member(&bytes, SuperblockVersion::V1_2, dev),
                        bitmap: c.bitmap.as_ref().map(|b| b.area.clone()),
                    }
                })
                .collect();
            let plan = plan_assembly(&members, &AssembleOptions::default())
                .unwrap_or_else(|e| panic!("raid{level} bitmap {bitmap}: {e}"));
            assert_eq!(plan.level, level);
            assert_eq!(plan.raid_disks, n as u32);
            let expect_resync = matches!(level, 1 | 6 | 10);
            match (&plan.resync, expect_resync, bitmap) {
                (ResyncNeed::None, false, _) => {}
                (ResyncNeed::Full { from_sector: 0 }, true, false) => {}
                (ResyncNeed::Bitmap { regions }, true, true) => assert!(!regions.is_empty()),
                other => panic!("raid{level} bitmap {bitmap}: {other:?}"),
            }
            if matches!(level, 4 | 5) {
                // mdadm's way: the last member is recovered rather than the array resynced.
                let last = plan.slots[n - 1].as_ref().unwrap();
                assert_eq!(last.recovery_offset_sectors, Some(0));
                assert_eq!(last.dev_number, n as u32);
                assert_eq!(plan.degraded_slots, vec![n as u32 - 1]);
            } else {
                assert!(plan.degraded_slots.is_empty());
            }
            if bitmap {
                let bm = c.bitmap.as_ref().unwrap();
                let sync = if level == 10 { plan.array_sectors } else { plan.size_sectors };
                assert_eq!(bm.sb.sync_size, sync, "raid{level}");
                assert_eq!(bm.sb.chunksize, 64 << 20);
            }
        }
    }
}

#[test]
fn assume_clean_missing_and_size() {
    let dev = 1u64 << 22;
    let mut p = params(6, vec![Some(dev), None, Some(dev), Some(dev)]);
    let c = create_array(&p).unwrap();
    assert!(c.superblocks[1].is_none());
    let sb = c.superblocks[0].clone().unwrap();
    assert_eq!(sb.resync_offset, MAX_SECTOR, "degraded create recovers, no resync");
    assert_eq!(sb.dev_roles[1], role::SPARE);
    p.member_dev_sectors[1] = Some(dev);
    p.assume_clean = true;
    p.size_kib = Some(1000);
    let c = create_array(&p).unwrap();
    let sb = c.superblocks[0].clone().unwrap();
    assert_eq!(sb.resync_offset, MAX_SECTOR);
    assert_eq!(sb.size, 512 * 2, "size rounded down to the 512 KiB chunk");
    p.size_kib = Some(100);
    assert!(matches!(create_array(&p), Err(CreateError::SizeBelowChunk { .. })));
    // raid0 cannot have missing members; bitmaps are meaningless there.
    let p0 = params(0, vec![Some(dev), None]);
    assert!(create_array(&p0).is_err());
    let mut p0 = params(0, vec![Some(dev), Some(dev)]);
    p0.bitmap = true;
    assert!(create_array(&p0).is_err());
    // raid0 of unequal members records its layout.
    let p0 = params(0, vec![Some(dev), Some(dev * 2)]);
    let sb = create_array(&p0).unwrap().superblocks[0].clone().unwrap();
    assert!(sb.has(feature::RAID0_LAYOUT));
    // Too small a member.
    let p1 = params(1, vec![Some(dev), Some(1000)]);
    let e = create_array(&p1).unwrap_err();
    assert!(e.to_string().contains("slot 1"), "{e}");
}

/// `uraid create` takes no --data-offset: what create says names only what it can do.
/// Members too large for any bitmap chunk md records (a 32-bit field) and members too
/// small for the metadata say so without pointing at an option create lacks.
#[test]
fn create_refusals_advise_only_what_create_takes() {
    let huge = 1u64 << 52; // 2 EiB of sectors: more bits than md's largest chunk allows
    let mut p = params(1, vec![Some(huge), Some(huge)]);
    p.bitmap = true;
    let e = create_array(&p).unwrap_err().to_string();
    assert!(e.contains("--bitmap none") && !e.contains("--data-offset"), "{e}");
    let tiny = params(1, vec![Some(200), Some(200)]);
    let e = create_array(&tiny).unwrap_err().to_string();
    assert!(e.contains("too small") && !e.contains("--data-offset"), "{e}");
}

/// `create --assume-clean` says the members are in sync: the bitmap starts with no bit
/// set (every bit set made a crash in the first seconds resync the whole array). Without
/// it, every bit is set, as mdadm's write_bitmap1 writes it, for the initial resync.
#[test]
fn an_assume_clean_bitmap_starts_clean() {
    for assume_clean in [true, false] {
        let mut p = params(5, vec![Some(1 << 22); 3]);
        p.bitmap = true;
        p.bitmap_chunk_bytes = Some(1 << 20);
        p.assume_clean = assume_clean;
        let c = create_array(&p).unwrap();
        let bm = c.bitmap.unwrap();
        let bits = &bm.area[BITMAP_SUPER_BYTES..];
        let chunks = bm.sb.sync_size.div_ceil(u64::from(bm.sb.chunksize) / 512);
        let set = (0..chunks).filter(|&i| test_bit_le(bits, i)).count() as u64;
        assert_eq!(set, if assume_clean { 0 } else { chunks }, "assume_clean {assume_clean}");
    }
}

/// A member re-added in full (or a spare) is given its slot to be rebuilt in a superblock
/// round; a power cut in that round can leave it, with some members or alone, one event
/// ahead of a member that still lists it as the spare it was. That member only missed the
/// round: md takes it back within the event margin (super_1_validate; mdadm --force too),
/// so the array starts with the re-added member recovering. Before: the recovering
/// member's superblock, the freshest offered first, was the reference, the member one
/// event behind "recorded it as failed" and was left out, and a raid10 near=2 on three
/// members could not start (`uraid sim` re-add with a bad-block log draw, seed 6008236).
/// A member that lists it as faulty still has diverged and stays out.
#[test]
fn a_member_that_missed_the_round_activating_a_readded_member_is_taken_back() {
    let mut p = CreateParams::new(level::RAID10, vec![Some(32768); 3]);
    p.layout = Some(0x102); // near=2
    p.assume_clean = true;
    p.set_uuid = [5; 16];
    p.device_uuids = vec![[1; 16], [2; 16], [3; 16]];
    let created: Vec<Superblock> = create_array(&p).unwrap().superblocks.into_iter().flatten().collect();
    // Round 24 took member 1 (re-added, a spare at round 23) into slot 1 to be rebuilt.
    let at = |m: usize, events: u64| {
        let mut sb = created[m].clone();
        sb.events = events;
        if events == 23 {
            sb.dev_roles[1] = role::SPARE;
        }
        if m == 1 {
            sb.feature_map |= feature::RECOVERY_OFFSET;
            sb.recovery_offset = 0;
        }
        sb.update_csum();
        sb
    };
    let offer = |sbs: &[(usize, Superblock)]| -> Vec<OfferedMember> {
        sbs.iter()
            .map(|(m, sb)| OfferedMember {
                name: format!("d{m}"),
                dev_sectors: 32768,
                superblock: Ok(sb.clone()),
                bitmap: None,
            })
            .collect()
    };
    let cases = [
        // Member 0 missed round 24; member 1's superblock offered before member 2's.
        vec![(0, at(0, 23)), (1, at(1, 24)), (2, at(2, 24))],
        vec![(1, at(1, 24)), (0, at(0, 23)), (2, at(2, 24))],
        vec![(2, at(2, 24)), (1, at(1, 24)), (0, at(0, 23))],
        // Only member 1's superblock got round 24.
        vec![(0, at(0, 23)), (1, at(1, 24)), (2, at(2, 23))],
    ];
    for sbs in &cases {
        let ctx = format!("{:?}", sbs.iter().map(|(m, sb)| (*m, sb.events)).collect::<Vec<_>>());
        let offered = offer(sbs);
        let plan =
            plan_assembly(&offered, &AssembleOptions::default()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let held: Vec<(String, Option<u64>)> = plan
            .slots
            .iter()
            .map(|s| {
                let s = s.as_ref().expect("every slot held");
                (offered[s.member].name.clone(), s.recovery_offset_sectors)
            })
            .collect();
        let want = vec![("d0".to_string(), None), ("d1".to_string(), Some(0)), ("d2".to_string(), None)];
        assert_eq!(held, want, "{ctx}: {:?}", plan.warnings);
        assert!(plan.stale.is_empty(), "{ctx}: {:?}", plan.warnings);
    }
    // Listed as faulty instead, the re-added member was failed by a member that ran on
    // without it: that member diverged and is left out, even forced.
    let mut faulty = at(0, 23);
    faulty.dev_roles[1] = role::FAULTY;
    faulty.update_csum();
    let offered = offer(&[(0, faulty), (1, at(1, 24)), (2, at(2, 23))]);
    let forced = AssembleOptions { run: true, force: true, ..Default::default() };
    match plan_assembly(&offered, &forced) {
        Err(e) => assert!(e.to_string().contains("not enough members"), "{e}"),
        Ok(plan) => panic!("a member recording the freshest as failed was taken: {:?}", plan.warnings),
    }
}

/// A member failed and re-added to its own slot (md's --re-add, bitmap-guided) goes from
/// faulty straight to recovering in one superblock round; a power cut in that round (a slow
/// member's write not landed) leaves a member one event behind that still lists it as
/// faulty. It only missed the round: md takes it back within the event margin. Before:
/// the re-added member's superblock, offered first, was the reference, the member behind
/// "recorded it as failed" and was left out, and a dirty raid4 on six members had 4 of 6
/// in sync and could not start (`uraid sim --seed 70017 --ops 2000 --profile nvme`).
/// Two members of the same event count that list it differently still diverged.
#[test]
fn a_member_that_missed_the_round_readding_a_failed_member_is_taken_back() {
    let mut p = CreateParams::new(level::RAID4, vec![Some(32768); 4]);
    p.assume_clean = true;
    p.set_uuid = [6; 16];
    p.device_uuids = vec![[1; 16], [2; 16], [3; 16], [4; 16]];
    let created: Vec<Superblock> = create_array(&p).unwrap().superblocks.into_iter().flatten().collect();
    // Round 8 recorded member 0 failed; round 9 re-added it to slot 0 to be recovered.
    let at = |m: usize, events: u64| {
        let mut sb = created[m].clone();
        sb.events = events;
        sb.resync_offset = 0; // dirty: a degraded start would need --force
        if events == 8 {
            sb.dev_roles[0] = role::FAULTY;
        }
        if m == 0 {
            sb.feature_map |= feature::RECOVERY_OFFSET;
            sb.recovery_offset = 0;
        }
        sb.update_csum();
        sb
    };
    let offer = |sbs: &[(usize, Superblock)]| -> Vec<OfferedMember> {
        sbs.iter()
            .map(|(m, sb)| OfferedMember {
                name: format!("d{m}"),
                dev_sectors: 32768,
                superblock: Ok(sb.clone()),
                bitmap: None,
            })
            .collect()
    };
    let forced = AssembleOptions { run: true, force: true, ..Default::default() };
    let cases = [
        // Member 3 missed round 9; the re-added member's superblock offered first or not.
        vec![(0, at(0, 9)), (1, at(1, 9)), (2, at(2, 9)), (3, at(3, 8))],
        vec![(3, at(3, 8)), (2, at(2, 9)), (1, at(1, 9)), (0, at(0, 9))],
        // Only the re-added member's superblock got round 9.
        vec![(0, at(0, 9)), (1, at(1, 8)), (2, at(2, 8)), (3, at(3, 8))],
    ];
    for sbs in &cases {
        let ctx = format!("{:?}", sbs.iter().map(|(m, sb)| (*m, sb.events)).collect::<Vec<_>>());
        let offered = offer(sbs);
        let plan = plan_assembly(&offered, &forced).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let held: Vec<(String, Option<u64>)> = plan
            .slots
            .iter()
            .map(|s| {
                let s = s.as_ref().expect("every slot held");
                (offered[s.member].name.clone(), s.recovery_offset_sectors)
            })
            .collect();
        let want: Vec<(String, Option<u64>)> =
            (0..4).map(|m| (format!("d{m}"), (m == 0).then_some(0))).collect();
        assert_eq!(held, want, "{ctx}: {:?}", plan.warnings);
        assert!(plan.stale.is_empty(), "{ctx}: {:?}", plan.warnings);
    }
    // A member of event count 8 that lists member 0 in its slot: the two views of round 8
    // differ, so the member listing it faulty diverged and stays out, even forced.
    let mut other_view = at(2, 8);
    other_view.dev_roles[0] = 0;
    other_view.update_csum();
    let offered = offer(&[(0, at(0, 9)), (1, at(1, 9)), (2, other_view), (3, at(3, 8))]);
    match plan_assembly(&offered, &forced) {
        Err(e) => assert!(e.to_string().contains("not enough members"), "{e}"),
        Ok(plan) => panic!("a member whose view of its round differs was taken: {:?}", plan.warnings),
    }
}

/// A power cut during a superblock round while a replacement copies can leave the
/// replacement's superblock one event ahead of the member it replaces. Assembly keeps the
/// member in the slot (it holds all the data; the replacement only what the copy reached)
/// and leaves the replacement out, however the two are ordered. Before: the fresher
/// superblock won, the half-copied replacement took the slot as recovering and the in-sync
/// member was left out, so the array started degraded (`uraid sim` replace draw, seeds
/// 3002292, 3005440, 3006304, 3006310, 3009526, 3009888).
#[test]
fn an_unfinished_replacement_one_event_ahead_never_takes_the_members_slot() {
    let mut p = CreateParams::new(level::RAID5, vec![Some(32768); 3]);
    p.assume_clean = true;
    p.set_uuid = [7; 16];
    p.device_uuids = vec![[1; 16], [2; 16], [3; 16]];
    let mut sbs: Vec<Superblock> = create_array(&p).unwrap().superblocks.into_iter().flatten().collect();
    for sb in &mut sbs {
        sb.max_dev = sb.max_dev.max(4);
        sb.dev_roles.resize(sb.max_dev as usize, role::SPARE);
        sb.dev_roles[3] = 1;
        sb.events = 10;
        sb.update_csum();
    }
    let mut repl = sbs[1].clone();
    repl.dev_number = 3;
    repl.device_uuid = [4; 16];
    repl.feature_map |= feature::REPLACEMENT | feature::RECOVERY_OFFSET;
    repl.recovery_offset = 4096;
    repl.events = 11;
    repl.update_csum();
    let offer = |order: &[usize]| -> Vec<OfferedMember> {
        let all = [&sbs[0], &sbs[1], &sbs[2], &repl];
        order
            .iter()
            .map(|&i| OfferedMember {
                name: format!("d{i}"),
                dev_sectors: 32768,
                superblock: Ok(all[i].clone()),
                bitmap: None,
            })
            .collect()
    };
    // Cut earlier in the round that listed it: the members' superblocks do not list the
    // replacement yet, the replacement's own does; it is still not the reference.
    let mut unlisted = sbs.clone();
    for sb in &mut unlisted {
        sb.dev_roles[3] = role::SPARE;
        sb.update_csum();
    }
    let early: Vec<OfferedMember> = [&unlisted[0], &unlisted[1], &unlisted[2], &repl]
        .iter()
        .enumerate()
        .map(|(i, sb)| OfferedMember {
            name: format!("d{i}"),
            dev_sectors: 32768,
            superblock: Ok((*sb).clone()),
            bitmap: None,
        })
        .collect();
    let plan = plan_assembly(&early, &AssembleOptions::default()).unwrap_or_else(|e| panic!("unlisted: {e}"));
    let held: Vec<Option<usize>> = plan.slots.iter().map(|s| s.as_ref().map(|m| m.member)).collect();
    assert_eq!(held, vec![Some(0), Some(1), Some(2)], "unlisted: {:?}", plan.warnings);
    for order in [[0, 1, 2, 3], [0, 3, 2, 1]] {
        let offered = offer(&order);
        let plan = plan_assembly(&offered, &AssembleOptions { run: true, ..Default::default() })
            .unwrap_or_else(|e| panic!("{order:?}: {e}"));
        let holder = plan.slots[1].as_ref().expect("slot 1 held");
        assert_eq!(offered[holder.member].name, "d1", "{order:?}: {:?}", plan.warnings);
        assert_eq!(holder.recovery_offset_sectors, None, "{order:?}");
        assert!(
            plan.warnings.iter().any(|w| w.contains("d3 left out (an unfinished replacement)")),
            "{order:?}: {:?}",
            plan.warnings
        );
    }
}
