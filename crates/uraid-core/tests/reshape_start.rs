//! uraid starting a raid5 grow as mdadm does without a backup file: the superblocks it
//! writes assemble as a reshape at position 0, and every grow it cannot do safely is
//! refused, saying what to do, with nothing to write.

use uraid_core::meta::*;
use uraid_core::reshape::start::{start_grow, GrowMember};

const DEV_SECTORS: u64 = 65536;

fn array(bitmap: bool) -> Vec<Superblock> {
    let mut p = CreateParams::new(5, vec![Some(DEV_SECTORS); 4]);
    p.name = "t".into();
    p.set_uuid = [7; 16];
    p.device_uuids = (0..4).map(|i| [i as u8; 16]).collect();
    p.chunk_kib = Some(64);
    p.assume_clean = true;
    p.bitmap = bitmap;
    create_array(&p).unwrap().superblocks.into_iter().map(Option::unwrap).collect()
}

const NEW: GrowMember = GrowMember { dev_sectors: DEV_SECTORS, device_uuid: [9; 16], dev_number: None };

#[test]
fn a_grow_by_one_member_writes_superblocks_that_assemble_mid_reshape() {
    let old = array(false);
    let (sbs, geo) = start_grow(&old, &[NEW], 1).unwrap();
    assert_eq!(sbs.len(), 5);
    for sb in &sbs {
        assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.has(feature::NEW_OFFSET));
        assert_eq!((sb.raid_disks, sb.delta_disks, sb.new_offset, sb.reshape_position), (5, 1, -512, 0));
        assert_eq!(sb.events, old[0].events + 1);
        assert_eq!(sb.dev_roles[sbs[4].dev_number as usize], 4, "every member lists the new one");
    }
    assert_eq!(sbs[4].device_uuid, [9; 16]);
    assert!(!sbs[4].has(feature::RECOVERY_OFFSET), "md counts a grown-into slot in sync");
    let offered: Vec<OfferedMember> = sbs
        .iter()
        .enumerate()
        .map(|(i, sb)| OfferedMember {
            name: format!("m{i}"),
            dev_sectors: DEV_SECTORS,
            superblock: Superblock::parse(&sb.serialize(), 8),
            bitmap: None,
        })
        .collect();
    let plan = plan_assembly(&offered, &AssembleOptions::default()).unwrap();
    assert_eq!(plan.reshape.as_ref(), Some(&geo));
    assert_eq!(plan.array_sectors, geo.previous.array_sectors());
}

#[test]
fn grows_uraid_cannot_do_safely_are_refused_saying_what_to_do() {
    let ok = array(false);
    let mut dirty = ok.clone();
    dirty.iter_mut().for_each(|sb| sb.resync_offset = 0);
    let mut cramped = ok.clone();
    cramped.iter_mut().for_each(|sb| {
        sb.data_offset = 128;
        sb.data_size = DEV_SECTORS - 128;
    });
    let small = GrowMember { dev_sectors: DEV_SECTORS / 2, device_uuid: [9; 16], dev_number: None };
    let cases: Vec<(&str, Vec<Superblock>, Vec<GrowMember>, &str)> = vec![
        ("bitmap", array(true), vec![NEW], "bitmap=none"),
        ("degraded", ok[..3].to_vec(), vec![NEW], "rebuild it first"),
        ("dirty", dirty, vec![NEW], "resync"),
        ("no head room", cramped, vec![NEW], "backup-file"),
        ("small new member", ok.clone(), vec![small], "larger device"),
        ("nothing to add", ok.clone(), vec![], "devices to add"),
        ("out of order", ok.iter().rev().cloned().collect(), vec![NEW], "slot order"),
    ];
    for (what, sbs, new, hint) in cases {
        let e = start_grow(&sbs, &new, 1).unwrap_err();
        assert!(e.contains(hint) && e.contains("nothing was written"), "{what}: {e}");
    }
}

#[test]
fn a_cut_inside_the_round_starting_the_grow_leaves_an_array_that_assembles_mid_reshape() {
    // The new member's superblock (and one old member's) written, the others not yet.
    let old = array(false);
    let (sbs, geo) = start_grow(&old, &[NEW], 1).unwrap();
    let on_disk = [old[0].clone(), sbs[1].clone(), old[2].clone(), old[3].clone(), sbs[4].clone()];
    let offered: Vec<OfferedMember> = on_disk
        .iter()
        .enumerate()
        .map(|(i, sb)| OfferedMember {
            name: format!("m{i}"),
            dev_sectors: DEV_SECTORS,
            superblock: Superblock::parse(&sb.serialize(), 8),
            bitmap: None,
        })
        .collect();
    let plan = plan_assembly(&offered, &AssembleOptions::default()).unwrap();
    assert_eq!(plan.reshape.as_ref(), Some(&geo), "{:?}", plan.warnings);
    assert!(plan.slots.iter().all(|s| s.is_some()));
}

#[test]
fn a_spare_keeps_its_dev_number_and_role_and_records_the_reshape_too() {
    let old = array(false);
    // A spare as md adds one: the next dev_number, the spare role in every dev_roles.
    let mut spare = old[0].clone();
    spare.dev_number = 4;
    spare.device_uuid = [8; 16];
    spare.dev_roles.resize(5, role::SPARE);
    spare.dev_roles[4] = role::SPARE;
    spare.max_dev = spare.max_dev.max(5);
    let old: Vec<Superblock> = old
        .into_iter()
        .map(|mut sb| {
            sb.dev_roles.resize(spare.dev_roles.len(), role::SPARE);
            sb.max_dev = spare.max_dev;
            sb
        })
        .collect();
    let (sbs, spares, _) =
        uraid_core::reshape::start::start_grow_with_spares(&old, &[spare.clone()], &[NEW], 1, None).unwrap();
    assert_ne!(sbs[4].dev_number, 4, "the new member does not take the spare's dev_number");
    let sp = &spares[0];
    assert_eq!((sp.dev_number, sp.slot()), (4, None), "still the spare");
    assert_eq!((sp.events, sp.raid_disks, sp.delta_disks, sp.new_offset), (sbs[0].events, 5, 1, -512));
    assert!(sp.has(feature::RESHAPE_ACTIVE));
    assert_eq!(sp.dev_roles, sbs[0].dev_roles, "the spare's roles are the members'");
    assert_eq!(sbs[0].dev_roles[sbs[4].dev_number as usize], 4);
    // A spare of another array is refused.
    let mut stranger = spare;
    stranger.set_uuid = [1; 16];
    let e =
        uraid_core::reshape::start::start_grow_with_spares(&old, &[stranger], &[NEW], 1, None).unwrap_err();
    assert!(e.contains("spare") && e.contains("nothing was written"), "{e}");
}

#[test]
fn a_grow_with_a_bitmap_moves_the_data_offset_only_down_to_the_bitmap_end() {
    use uraid_core::reshape::start::start_grow_with_spares;
    let old = array(true);
    let bitmap_at = old[0].bitmap_sector().expect("an internal bitmap");
    // Without its size the bitmap is not known to be clear of the new offset.
    let e = start_grow_with_spares(&old, &[], &[NEW], 1, None).unwrap_err();
    assert!(e.contains("bitmap") && e.contains("nothing was written"), "{e}");
    let (sbs, _, geo) = start_grow_with_spares(&old, &[], &[NEW], 1, Some(8)).unwrap();
    for (sb, &new_offset) in sbs.iter().zip(&geo.new_data_offset_sectors) {
        assert!(sb.bitmap_sector() == Some(bitmap_at), "the bitmap stays where it is");
        assert!(new_offset >= bitmap_at + 8, "data moved onto the bitmap: {new_offset}");
    }
    // A bitmap reaching so far that the data cannot move down by a stripe: refused.
    let room = old[0].data_offset - bitmap_at;
    let e = start_grow_with_spares(&old, &[], &[NEW], 1, Some(room - 1)).unwrap_err();
    assert!(e.contains("backup-file") && e.contains("nothing was written"), "{e}");
}

#[test]
fn a_member_joining_by_a_grow_gets_an_empty_bad_block_log_where_the_others_have_theirs() {
    // A recovery onto a blank disk later copies a member's superblock; without a log it
    // could not record the rows it cannot rebuild, and failed its target over and over.
    let old = array(false);
    assert!(old[0].bblog_size > 0, "the array's members have a log");
    let (sbs, _) = start_grow(&old, &[NEW], 1).unwrap();
    let new = &sbs[4];
    assert_eq!((new.bblog_offset, new.bblog_size), (old[0].bblog_offset, old[0].bblog_size));
    assert!(!new.has(feature::BAD_BLOCKS), "empty: md reads no page without the feature bit");
}

/// A device new to the array (an offline grow's) numbers as `uraid add` and md's
/// bind_rdev_to_array number it: from raid_disks up, past the numbers devices hold, never a
/// removed member's number below raid_disks. Here slot 1's first device (number 1) was
/// replaced by a spare that was number 4; the grow gave the new device 1 before.
#[test]
fn a_device_new_to_the_array_numbers_from_raid_disks_up_past_a_removed_members_number() {
    let old: Vec<Superblock> = array(false)
        .into_iter()
        .map(|mut sb| {
            sb.max_dev = sb.max_dev.max(5);
            sb.dev_roles.resize(sb.max_dev as usize, role::SPARE);
            sb.dev_roles[1] = role::SPARE;
            sb.dev_roles[4] = 1;
            if sb.dev_number == 1 {
                sb.dev_number = 4;
            }
            sb
        })
        .collect();
    let (sbs, _) = start_grow(&old, &[NEW], 1).unwrap();
    assert_eq!(sbs[4].dev_number, 5, "the first free number from raid_disks (4) up");
    for sb in &sbs {
        assert_eq!(
            (sb.dev_roles[1], sb.dev_roles[4], sb.dev_roles[5]),
            (role::SPARE, 1, 4),
            "dev {}",
            sb.dev_number
        );
    }
}
