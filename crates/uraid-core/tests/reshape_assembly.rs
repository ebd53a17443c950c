//! Assembly of an array md left mid-reshape: a forwards raid5 grow with a moved data
//! offset is taken on (the plan carries both geometries and md's old size); every other
//! reshape is refused with what was wrong and what to do, never guessed.

use uraid_core::meta::*;
use uraid_core::reshape::Side;

const DEV_SECTORS: u64 = 65536;

/// Superblocks as md leaves a raid5 grow from 4 to 5 members at `position` (array
/// sectors): raid_disks is the new count, the data offset moves 512 sectors down.
fn mid_grow(position: u64) -> Vec<Superblock> {
    let mut p = CreateParams::new(5, vec![Some(DEV_SECTORS); 5]);
    p.name = "t".into();
    p.set_uuid = [7; 16];
    p.device_uuids = (0..5).map(|i| [i as u8; 16]).collect();
    p.chunk_kib = Some(64);
    p.assume_clean = true;
    let sbs: Vec<Superblock> =
        create_array(&p).unwrap().superblocks.into_iter().map(Option::unwrap).collect();
    sbs.into_iter()
        .map(|mut sb| {
            sb.feature_map |= feature::RESHAPE_ACTIVE | feature::NEW_OFFSET;
            sb.delta_disks = 1;
            sb.new_level = 5;
            sb.new_layout = sb.layout;
            sb.new_chunk = sb.chunksize;
            sb.new_offset = -512;
            sb.reshape_position = position;
            sb.events = 40;
            sb
        })
        .collect()
}

fn offer(sbs: &[Superblock]) -> Vec<OfferedMember> {
    sbs.iter()
        .enumerate()
        .map(|(i, sb)| OfferedMember {
            name: format!("m{i}"),
            dev_sectors: DEV_SECTORS,
            superblock: Superblock::parse(&sb.serialize(), sb.super_offset),
            bitmap: None,
        })
        .collect()
}

#[test]
fn a_forwards_grow_with_a_moved_offset_assembles_with_both_geometries() {
    let sbs = mid_grow(512 * 10);
    let plan = plan_assembly(&offer(&sbs), &AssembleOptions::default()).unwrap();
    let r = plan.reshape.as_ref().expect("the reshape is in the plan");
    assert_eq!((r.previous.raid_disks, r.next.raid_disks), (4, 5));
    assert_eq!(plan.raid_disks, 5);
    // md serves the old size until the reshape ends.
    assert_eq!(plan.array_sectors, r.previous.array_sectors());
    assert!(plan.array_sectors < r.next.array_sectors());
    assert_eq!(plan.geometry().unwrap(), r.next);
    let data_offset = sbs[0].data_offset;
    assert_eq!(r.data_offset_sectors, vec![data_offset; 5]);
    assert_eq!(r.new_data_offset_sectors, vec![data_offset - 512; 5]);
    assert_eq!(r.side_of(512 * 10 - 1, r.position_sectors), Side::Next);
    assert_eq!(r.side_of(512 * 10, r.position_sectors), Side::Previous);
}

#[test]
fn every_reshape_uraid_does_not_handle_is_refused_saying_what_to_do() {
    type Craft = fn(&mut Superblock);
    let cases: [(&str, Craft); 7] = [
        ("backwards", |sb| sb.feature_map |= feature::RESHAPE_BACKWARDS),
        ("level change", |sb| sb.new_level = 6),
        ("chunk change with a grow", |sb| sb.new_chunk *= 2),
        ("layout change with a grow", |sb| sb.new_layout = 3),
        ("by -1 members", |sb| sb.delta_disks = -1),
        ("backup file", |sb| {
            sb.feature_map &= !feature::NEW_OFFSET;
            sb.new_offset = 0;
        }),
        ("not on a stripe boundary", |sb| sb.reshape_position = 700),
    ];
    for (what, craft) in cases {
        let mut sbs = mid_grow(512 * 10);
        sbs.iter_mut().for_each(craft);
        let e = plan_assembly(&offer(&sbs), &AssembleOptions::default()).unwrap_err();
        let t = e.to_string();
        assert!(matches!(e, AssemblyError::ReshapeInProgress { .. }), "{what}: {e:?}");
        assert!(t.contains("reshape"), "{what}: {t}");
        if what != "not on a stripe boundary" {
            assert!(t.contains("let Linux md finish it"), "{what}: {t}");
        }
    }
    // The data offset not moved far enough for the next stripe: md's "too early for
    // auto-recovery" (it would need mdadm's backup file).
    let mut sbs = mid_grow(0);
    sbs.iter_mut().for_each(|sb| sb.new_offset = -8);
    let t = plan_assembly(&offer(&sbs), &AssembleOptions::default()).unwrap_err().to_string();
    assert!(t.contains("overlaps data not yet copied"), "{t}");
}

#[test]
fn a_degraded_reshape_is_assembled_degraded() {
    // md goes on with a reshape that lost a member (served writable, uraid does too:
    // tests/reshape_online.rs); the missing slot takes the array's offsets.
    let sbs = mid_grow(512 * 10);
    let plan =
        plan_assembly(&offer(&sbs[..4]), &AssembleOptions { run: true, ..Default::default() }).unwrap();
    let r = plan.reshape.as_ref().expect("the reshape");
    assert!(plan.slots[4].is_none(), "slot 4 missing");
    assert_eq!(r.data_offset_sectors[4], r.data_offset_sectors[0]);
    assert_eq!(r.new_data_offset_sectors[4], r.new_data_offset_sectors[0]);
    // Without --run it is refused as any degraded start is.
    assert!(plan_assembly(&offer(&sbs[..4]), &AssembleOptions::default()).is_err());
}

/// `sb` as the round that ends the reshape writes it (md_finish_reshape).
fn finished(sb: &Superblock) -> Superblock {
    let mut f = sb.clone();
    f.feature_map &= !(feature::RESHAPE_ACTIVE | feature::NEW_OFFSET);
    f.data_offset = (f.data_offset as i64 + i64::from(f.new_offset)) as u64;
    f.data_size += 512;
    f.new_offset = 0;
    f.delta_disks = 0;
    f.events += 1;
    f
}

#[test]
fn a_member_that_missed_the_round_ending_the_reshape_is_read_at_its_new_offset() {
    // A crash inside the last superblock round: three members say done, two still say
    // reshaping (one event behind). Their data was moved before that round began.
    let mid = mid_grow(512 * 10);
    let mut sbs: Vec<Superblock> = mid.iter().take(3).map(finished).collect();
    sbs.extend(mid[3..].iter().cloned());
    let plan = plan_assembly(&offer(&sbs), &AssembleOptions::default()).unwrap();
    assert!(plan.reshape.is_none());
    let new_offset = mid[0].data_offset - 512;
    for slot in plan.slots.iter().map(|s| s.as_ref().unwrap()) {
        assert_eq!(slot.data_offset_sectors, new_offset, "member {}", slot.member);
        assert_eq!(slot.data_size_sectors, mid[0].data_size + 512);
    }
    assert!(plan.warnings.iter().any(|w| w.contains("missed the superblock round")), "{:?}", plan.warnings);

    // The same event count on both sides is no crash md or uraid makes: refused.
    let mut sbs: Vec<Superblock> = mid.iter().take(3).map(finished).collect();
    sbs.extend(mid[3..].iter().cloned().map(|mut sb| {
        sb.events += 1;
        sb
    }));
    let e = plan_assembly(&offer(&sbs), &AssembleOptions::default()).unwrap_err();
    assert!(e.to_string().contains("disagree"), "{e}");
}

#[test]
fn a_member_that_dropped_out_before_the_reshape_is_left_out_not_a_refusal_of_the_array() {
    // Member 3 failed before the grow's start round: its superblock is older and has the
    // shape from before. md kicks it and assembles the rest (degraded); it must not stop
    // the array from starting.
    let mut sbs = mid_grow(512 * 10);
    let old = &mut sbs[3];
    old.feature_map &= !(feature::RESHAPE_ACTIVE | feature::NEW_OFFSET);
    old.raid_disks = 4;
    old.delta_disks = 0;
    old.new_offset = 0;
    old.reshape_position = 0;
    old.events = 30;
    let plan =
        plan_assembly(&offer(&sbs), &AssembleOptions { run: true, ..Default::default() }).expect("assembles");
    assert!(plan.slots[3].is_none(), "the older member is left out");
    assert!(plan.stale.iter().any(|s| s.member == 3 && !s.re_addable), "{:?}", plan.stale);
    assert!(
        plan.warnings.iter().any(|w| w.contains("m3") && w.contains("before a reshape")),
        "{:?}",
        plan.warnings
    );
    // The same superblock as fresh as the others contradicts them: still refused.
    sbs[3].events = 40;
    let e = plan_assembly(&offer(&sbs), &AssembleOptions { run: true, ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("refusing to mix"), "{e}");
}
