//! The md metadata code against arrays made by real Linux md (shared/fixtures/md):
//! every member superblock parses and matches `mdadm --examine`, serializes back to the
//! same bytes, assembles into the right plan, and `create_array` with the same arguments
//! gives the same fields mdadm wrote.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;

use uraid_core::meta::*;

/// Bytes of each member image decoded: superblock (4 KiB at 4 KiB) and bitmap (at 8 KiB
/// after the superblock) are well inside.
const HEAD_BYTES: usize = 64 * 1024;
const MEMBER_SECTORS: u64 = 16 * 1024 * 1024 / 512;

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/md")
}

fn read_head(fixture: &str, member: usize) -> Vec<u8> {
    let path = fixtures_dir().join(format!("{fixture}/member{member}.img.zst"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut dec = ruzstd::StreamingDecoder::new(std::io::BufReader::new(file)).unwrap();
    let mut buf = vec![0u8; HEAD_BYTES];
    dec.read_exact(&mut buf).unwrap();
    buf
}

#[derive(Debug)]
struct Fixture {
    name: String,
    members: usize,
    create_args: String,
    md_size_bytes: u64,
    stale: Vec<bool>,
}

/// Just enough JSON reading for manifest.json's flat keys (no serde in core).
fn manifest() -> Vec<Fixture> {
    let text = std::fs::read_to_string(fixtures_dir().join("manifest.json")).unwrap();
    let mut out: Vec<Fixture> = Vec::new();
    let value = |line: &str| -> String {
        let v = line.split_once(':').unwrap().1.trim().trim_end_matches(',');
        v.trim_matches('"').replace("\\\"", "\"")
    };
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("\"name\":") {
            out.push(Fixture {
                name: value(t),
                members: 0,
                create_args: String::new(),
                md_size_bytes: 0,
                stale: Vec::new(),
            });
        } else if let Some(f) = out.last_mut() {
            if t.starts_with("\"file\":") {
                f.members += 1;
            } else if t.starts_with("\"stale\":") {
                f.stale.push(value(t) == "true");
            } else if t.starts_with("\"create_args\":") {
                f.create_args = value(t);
            } else if t.starts_with("\"md_size_bytes\":") {
                f.md_size_bytes = value(t).parse().unwrap();
            }
        }
    }
    assert_eq!(out.len(), 7, "fixtures in manifest");
    out
}

fn examine(fixture: &str, file: &str) -> HashMap<String, String> {
    let text = std::fs::read_to_string(fixtures_dir().join(fixture).join(file)).unwrap();
    text.lines()
        .filter_map(|l| l.split_once(" : "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn first_num(s: &str) -> u64 {
    s.split(|c: char| !c.is_ascii_digit()).find(|w| !w.is_empty()).unwrap().parse().unwrap()
}

fn level_of(name: &str) -> i32 {
    match name {
        "raid0" => 0,
        "raid1" => 1,
        "raid4" => 4,
        "raid5" => 5,
        "raid6" => 6,
        "raid10" => 10,
        "linear" => -1,
        other => panic!("level {other}"),
    }
}

fn layout_of(level: i32, name: &str) -> u32 {
    if level == 10 {
        let (kind, n) = name.split_once('=').unwrap();
        let n: u32 = n.parse().unwrap();
        return match kind {
            "near" => 0x100 + n,
            "far" => 1 + (n << 8),
            "offset" => 0x10000 + (n << 8) + 1,
            _ => panic!("{name}"),
        };
    }
    match name {
        "left-asymmetric" => 0,
        "right-asymmetric" => 1,
        "left-symmetric" => 2,
        "right-symmetric" => 3,
        "parity-first" => 4,
        "parity-last" => 5,
        _ => panic!("layout {name}"),
    }
}

fn parse_member(fixture: &str, member: usize) -> (Vec<u8>, Superblock) {
    let head = read_head(fixture, member);
    let sb = Superblock::parse_member(&head[4096..8192], SuperblockVersion::V1_2, MEMBER_SECTORS)
        .unwrap_or_else(|e| panic!("{fixture} member{member}: {e}"));
    (head, sb)
}

#[test]
fn every_member_superblock_matches_mdadm_examine() {
    for fx in manifest() {
        for m in 0..fx.members {
            let (head, sb) = parse_member(&fx.name, m);
            let ex = examine(&fx.name, &format!("member{m}-examine.txt"));
            let ctx = format!("{} member{m}", fx.name);
            assert_eq!(ex["Magic"], "a92b4efc", "{ctx}");
            assert_eq!(ex["Version"], "1.2", "{ctx}");
            assert_eq!(ex["Feature Map"], format!("{:#x}", sb.feature_map), "{ctx} feature map");
            assert_eq!(ex["Array UUID"], format_uuid(&sb.set_uuid), "{ctx}");
            assert_eq!(ex["Device UUID"], format_uuid(&sb.device_uuid), "{ctx}");
            assert_eq!(ex["Name"].split("  ").next().unwrap(), sb.name(), "{ctx}");
            assert_eq!(level_of(&ex["Raid Level"]), sb.level, "{ctx}");
            assert_eq!(first_num(&ex["Raid Devices"]), u64::from(sb.raid_disks), "{ctx}");
            assert_eq!(first_num(&ex["Avail Dev Size"]), sb.data_size, "{ctx}");
            assert_eq!(first_num(&ex["Data Offset"]), sb.data_offset, "{ctx}");
            assert_eq!(first_num(&ex["Super Offset"]), sb.super_offset, "{ctx}");
            assert_eq!(first_num(&ex["Events"]), sb.events, "{ctx}");
            let (csum, verdict) = ex["Checksum"].split_once(" - ").unwrap();
            assert_eq!(verdict, "correct", "{ctx}");
            assert_eq!(u32::from_str_radix(csum, 16).unwrap(), sb.sb_csum, "{ctx}");
            match ex.get("Chunk Size") {
                Some(c) => assert_eq!(first_num(c) * 2, u64::from(sb.chunksize), "{ctx}"),
                None => assert_eq!(sb.chunksize, 0, "{ctx}"),
            }
            if let Some(l) = ex.get("Layout") {
                assert_eq!(layout_of(sb.level, l), sb.layout, "{ctx}");
            }
            // "Bad Block Log : 512 entries available at offset 16 sectors"
            let bbl = &ex["Bad Block Log"];
            assert_eq!(first_num(bbl), u64::from(sb.bblog_size) * 512 / 8, "{ctx}");
            let off: i64 = bbl.split("offset ").nth(1).map(first_num).unwrap() as i64;
            assert_eq!(off, i64::from(sb.bblog_offset), "{ctx}");
            let role_text = &ex["Device Role"];
            assert_eq!(role_text, &format!("Active device {}", sb.slot().unwrap()), "{ctx}");
            // Array State: 'A' for every slot some dev_roles entry holds.
            let state: String = (0..sb.raid_disks)
                .map(|s| if sb.dev_roles.iter().any(|&r| u32::from(r) == s) { 'A' } else { '.' })
                .collect();
            assert_eq!(ex["Array State"].split(' ').next().unwrap(), state, "{ctx}");
            if let Some(size) = ex.get("Array Size") {
                let plan_kib = first_num(size);
                let expect = match sb.level {
                    1 => sb.size,
                    5 => sb.size * u64::from(sb.raid_disks - 1),
                    6 => sb.size * u64::from(sb.raid_disks - 2),
                    10 => raid10_sizes(sb.size, sb.raid_disks, sb.layout, sb.chunksize).1,
                    _ => unreachable!(),
                } / 2;
                assert_eq!(plan_kib, expect, "{ctx} array size");
            }
            if sb.has(feature::BITMAP_OFFSET) {
                let text = &ex["Internal Bitmap"];
                assert_eq!(first_num(text), sb.bitmap_offset as u64, "{ctx}");
                check_bitmap_against_examine(&fx.name, m, &head, &sb);
            } else {
                assert!(!ex.contains_key("Internal Bitmap"), "{ctx}");
            }
        }
    }
}

fn check_bitmap_against_examine(fixture: &str, m: usize, head: &[u8], sb: &Superblock) {
    let at = (sb.bitmap_sector().unwrap() * 512) as usize;
    let img = BitmapImage::parse(&head[at..]).unwrap();
    let ex = examine(fixture, &format!("member{m}-examine-bitmap.txt"));
    let ctx = format!("{fixture} member{m} bitmap");
    assert_eq!(ex["Magic"], format!("{:x}", img.sb.magic), "{ctx}");
    assert_eq!(first_num(&ex["Version"]), u64::from(img.sb.version), "{ctx}");
    assert_eq!(ex["UUID"], format_uuid(&img.sb.uuid), "{ctx}");
    assert_eq!(img.sb.uuid, sb.set_uuid, "{ctx}");
    assert_eq!(first_num(&ex["Events"]), img.sb.events, "{ctx}");
    assert_eq!(first_num(&ex["Events Cleared"]), img.sb.events_cleared, "{ctx}");
    assert_eq!(ex["State"], "OK", "{ctx}");
    assert!(ex["Chunksize"].ends_with("MB"), "{ctx}");
    assert_eq!(first_num(&ex["Chunksize"]) << 20, u64::from(img.sb.chunksize), "{ctx}");
    assert_eq!(first_num(&ex["Daemon"]), u64::from(img.sb.daemon_sleep), "{ctx}");
    assert_eq!(first_num(&ex["Sync Size"]) * 2, img.sb.sync_size, "{ctx}");
    // "Bitmap : 1 bits (chunks), 0 dirty (0.0%)"
    let bits_text = &ex["Bitmap"];
    assert_eq!(first_num(bits_text), img.sb.bits(), "{ctx}");
    let dirty = first_num(bits_text.split("), ").nth(1).unwrap());
    assert_eq!(dirty, img.dirty_count(), "{ctx}");
    assert!(img.sb.check_against_array(&sb.set_uuid, sb.events).is_ok());
    // md writes bit 0 as the least significant bit of the first byte after the header:
    // mdadm filled the area with ones and md cleared chunk 0 only.
    assert_eq!(head[at + BITMAP_SUPER_BYTES], 0xfe, "{ctx} bit order");
    assert_eq!(img.sb.serialize()[..], head[at..at + BITMAP_SUPER_BYTES], "{ctx}");
}

#[test]
fn serialize_parse_round_trips_every_fixture_superblock() {
    for fx in manifest() {
        for m in 0..fx.members {
            let (head, sb) = parse_member(&fx.name, m);
            assert_eq!(sb.serialize()[..], head[4096..8192], "{} member{m}", fx.name);
            let mut copy = sb.clone();
            copy.sb_csum = 0;
            assert_eq!(copy.update_csum()[..], head[4096..8192]);
            assert_eq!(copy, sb);
        }
    }
}

fn arg<'a>(args: &'a str, key: &str) -> Option<&'a str> {
    args.split_whitespace().find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn params_from_create_args(args: &str, members: usize) -> CreateParams {
    let level: i32 = arg(args, "--level").unwrap().parse().unwrap();
    let mut p = CreateParams::new(level, vec![Some(MEMBER_SECTORS); members]);
    assert_eq!(arg(args, "--raid-devices").unwrap().parse::<usize>().unwrap(), members);
    p.chunk_kib = arg(args, "--chunk").map(|c| c.parse().unwrap());
    p.layout = arg(args, "--layout").map(|l| match l {
        "n2" => 0x102,
        other => layout_of(level, other),
    });
    p.bitmap = arg(args, "--bitmap") == Some("internal");
    p.homehost = arg(args, "--homehost").map(str::to_string);
    p.name = arg(args, "--name").unwrap().to_string();
    p.set_uuid = parse_uuid(arg(args, "--uuid").unwrap()).unwrap();
    p.device_uuids = (0..members).map(|i| [i as u8 + 1; 16]).collect();
    p.ctime_seconds = 1_700_000_000;
    p
}

#[test]
fn create_gives_the_fields_mdadm_wrote() {
    for fx in manifest() {
        let p = params_from_create_args(&fx.create_args, fx.members);
        let created = create_array(&p).unwrap_or_else(|e| panic!("{}: {e}", fx.name));
        let degraded = fx.stale.iter().any(|&s| s);
        for m in 0..fx.members {
            let (head, disk) = parse_member(&fx.name, m);
            let ours = created.superblocks[m].clone().unwrap();
            let ctx = format!("{} member{m}", fx.name);
            // Our superblock is itself valid for md.
            let bytes = ours.serialize();
            let reparsed = Superblock::parse_member(&bytes, SuperblockVersion::V1_2, MEMBER_SECTORS)
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(reparsed, ours, "{ctx}");

            assert_eq!(ours.magic, disk.magic, "{ctx}");
            assert_eq!(ours.major_version, disk.major_version, "{ctx}");
            // The kernel drops RECOVERY_OFFSET once raid5's initial recovery is done.
            assert_eq!(ours.feature_map & !feature::RECOVERY_OFFSET, disk.feature_map, "{ctx} feature_map");
            assert_eq!(ours.set_uuid, disk.set_uuid, "{ctx}");
            assert_eq!(ours.set_name, disk.set_name, "{ctx} set_name");
            assert_eq!(ours.level, disk.level, "{ctx}");
            assert_eq!(ours.layout, disk.layout, "{ctx} layout");
            assert_eq!(ours.size, disk.size, "{ctx} size");
            assert_eq!(ours.chunksize, disk.chunksize, "{ctx} chunk");
            assert_eq!(ours.raid_disks, disk.raid_disks, "{ctx}");
            assert_eq!(ours.bitmap_offset, disk.bitmap_offset, "{ctx} bitmap_offset");
            assert_eq!(ours.new_level, disk.new_level, "{ctx}");
            assert_eq!(ours.reshape_position, disk.reshape_position, "{ctx}");
            assert_eq!(ours.delta_disks, disk.delta_disks, "{ctx}");
            assert_eq!(ours.new_layout, disk.new_layout, "{ctx}");
            assert_eq!(ours.new_chunk, disk.new_chunk, "{ctx}");
            assert_eq!(ours.new_offset, disk.new_offset, "{ctx}");
            assert_eq!(ours.data_offset, disk.data_offset, "{ctx} data_offset");
            assert_eq!(ours.data_size, disk.data_size, "{ctx} data_size");
            assert_eq!(ours.super_offset, disk.super_offset, "{ctx}");
            assert_eq!(ours.dev_number, disk.dev_number, "{ctx} dev_number");
            assert_eq!(ours.cnt_corrected_read, disk.cnt_corrected_read, "{ctx}");
            assert_eq!(ours.devflags, disk.devflags, "{ctx}");
            assert_eq!(ours.bblog_shift, disk.bblog_shift, "{ctx}");
            assert_eq!(ours.bblog_size, disk.bblog_size, "{ctx} bblog_size");
            assert_eq!(ours.bblog_offset, disk.bblog_offset, "{ctx} bblog_offset");
            assert_eq!(ours.max_dev, disk.max_dev, "{ctx} max_dev");
            assert_eq!(ours.pad0, disk.pad0, "{ctx}");
            assert_eq!(ours.pad3, disk.pad3, "{ctx}");
            if !degraded {
                assert_eq!(ours.dev_roles, disk.dev_roles, "{ctx} dev_roles");
            }
            assert_eq!(created.size_sectors, disk.size, "{ctx}");

            match (&created.bitmap, disk.bitmap_sector()) {
                (None, None) => {}
                (Some(bm), Some(sector)) => {
                    let at = (sector * 512) as usize;
                    let on_disk = BitmapSuper::parse(&head[at..]).unwrap();
                    assert_eq!(bm.sb.magic, on_disk.magic, "{ctx}");
                    assert_eq!(bm.sb.version, on_disk.version, "{ctx}");
                    assert_eq!(bm.sb.uuid, on_disk.uuid, "{ctx}");
                    assert_eq!(bm.sb.chunksize, on_disk.chunksize, "{ctx} bitmap chunk");
                    assert_eq!(bm.sb.sync_size, on_disk.sync_size, "{ctx} sync_size");
                    assert_eq!(bm.sb.daemon_sleep, on_disk.daemon_sleep, "{ctx}");
                    assert_eq!(bm.sb.write_behind, on_disk.write_behind, "{ctx}");
                    assert_eq!(bm.sb.sectors_reserved, on_disk.sectors_reserved, "{ctx}");
                    assert_eq!(bm.sb.nodes, on_disk.nodes, "{ctx}");
                    assert_eq!(bm.offset_from_sb_sectors, disk.bitmap_offset, "{ctx}");
                    assert_eq!(bm.area.len(), 4096, "{ctx}");
                    // Past chunk 0, which md cleared, the bits are still mdadm's ones.
                    assert_eq!(bm.area[BITMAP_SUPER_BYTES + 1..], head[at + 257..at + 4096]);
                }
                other => panic!("{ctx}: bitmap mismatch {other:?}"),
            }
        }
    }
}

fn offered(fixture: &str, members: usize) -> Vec<OfferedMember> {
    (0..members)
        .map(|m| {
            let head = read_head(fixture, m);
            let sb = Superblock::parse_member(&head[4096..8192], SuperblockVersion::V1_2, MEMBER_SECTORS);
            let bitmap = sb
                .as_ref()
                .ok()
                .and_then(|s| s.bitmap_sector())
                .map(|sector| head[(sector * 512) as usize..][..4096].to_vec());
            OfferedMember {
                name: format!("{fixture}/member{m}"),
                dev_sectors: MEMBER_SECTORS,
                superblock: sb,
                bitmap,
            }
        })
        .collect()
}

#[test]
fn every_fixture_assembles_to_the_right_plan() {
    for fx in manifest() {
        let members = offered(&fx.name, fx.members);
        let plan = plan_assembly(&members, &AssembleOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", fx.name));
        let ctx = fx.name.clone();
        let detail = examine(&fx.name, "mdadm-detail.txt");
        assert_eq!(plan.array_sectors * 512, fx.md_size_bytes, "{ctx} array size");
        assert_eq!(first_num(&detail["Array Size"]) * 2, plan.array_sectors, "{ctx}");
        assert_eq!(level_of(&detail["Raid Level"]), plan.level, "{ctx}");
        assert_eq!(first_num(&detail["Raid Devices"]), u64::from(plan.raid_disks));
        assert_eq!(first_num(&detail["Events"]), plan.events, "{ctx}");
        assert_eq!(detail["UUID"], format_uuid(&plan.uuid), "{ctx}");
        assert_eq!(detail["Name"].split("  ").next().unwrap(), plan.name, "{ctx}");
        if let Some(used) = detail.get("Used Dev Size") {
            assert_eq!(first_num(used) * 2, plan.size_sectors, "{ctx}");
        }
        assert_eq!(plan.slots.len(), fx.members);
        for (slot, choice) in plan.slots.iter().enumerate() {
            if fx.stale[slot] {
                assert!(choice.is_none(), "{ctx}: stale member{slot} must be left out");
                assert_eq!(plan.stale.len(), 1, "{ctx}");
                assert_eq!(plan.stale[0].member, slot);
                assert_eq!(plan.stale[0].slot, Some(slot as u32));
                assert_eq!(plan.degraded_slots, vec![slot as u32]);
            } else {
                let c = choice.as_ref().unwrap();
                assert_eq!(c.member, slot, "{ctx}");
                assert_eq!(c.data_offset_sectors, if fx.name.starts_with("raid10") { 4096 } else { 2048 });
                assert_eq!(c.recovery_offset_sectors, None);
            }
        }
        assert_eq!(plan.resync, ResyncNeed::None, "{ctx}");
        assert!(plan.spares.is_empty());
        if fx.name.contains("bitmap") {
            let bm = plan.bitmap.as_ref().unwrap();
            assert_eq!(bm.offset_from_sb_sectors, 8);
            assert_eq!(bm.chunk_bytes, Some(64 << 20));
            assert_eq!(bm.sync_size_sectors, Some(30720));
            assert_eq!(bm.events_cleared, Some(19));
            assert!(!bm.stale);
            let wib = bm.write_intent().unwrap();
            assert_eq!(wib.chunks(), 1);
            assert!(wib.dirty_regions().is_empty());
        } else {
            assert!(plan.bitmap.is_none());
        }
        // Members in any order give the same plan, up to indexes.
        let mut rev = members.clone();
        rev.reverse();
        let plan_rev = plan_assembly(&rev, &AssembleOptions::default()).unwrap();
        assert_eq!(plan_rev.array_sectors, plan.array_sectors);
        for (a, b) in plan.slots.iter().zip(&plan_rev.slots) {
            assert_eq!(
                a.as_ref().map(|c| c.member),
                b.as_ref().map(|c| fx.members - 1 - c.member),
                "{ctx} reversed"
            );
        }
    }
}

#[test]
fn fixture_specific_layouts_and_sizes() {
    let plan = |name: &str, n: usize| plan_assembly(&offered(name, n), &AssembleOptions::default()).unwrap();
    let r0 = plan("raid0-3dev-32k", 3);
    assert_eq!((r0.level, r0.layout, r0.chunk_sectors), (0, 1, 64));
    let r10 = plan("raid10-n2-4dev", 4);
    assert_eq!((r10.layout, r10.chunk_sectors, r10.size_sectors), (0x102, 1024, 28672));
    let r6 = plan("raid6-6dev-64k-degraded", 6);
    assert!(r6.warnings.iter().any(|w| w.contains("member2") && w.contains("stale")));
    // The degraded fixture was stopped degraded: mdadm starts it without --run.
    assert_eq!(r6.degraded_slots, vec![2]);
}

#[test]
fn assembly_refuses_bad_members_by_name() {
    let base = offered("raid5-4dev-64k-ls", 4);

    // A member of another array.
    let mut mixed = base.clone();
    mixed[2] = offered("raid6-6dev-64k", 1).remove(0);
    let err = plan_assembly(&mixed, &AssembleOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("raid6-6dev-64k/member0") && msg.contains("another array"), "{msg}");

    // A bad checksum.
    let mut head = read_head("raid5-4dev-64k-ls", 1);
    head[4096 + 100] ^= 1;
    let mut bad = base.clone();
    bad[1].superblock = Superblock::parse_member(&head[4096..8192], SuperblockVersion::V1_2, MEMBER_SECTORS);
    let msg = plan_assembly(&bad, &AssembleOptions::default()).unwrap_err().to_string();
    assert!(msg.contains("member1") && msg.contains("checksum"), "{msg}");

    // The same device twice.
    let mut twice = base.clone();
    twice.push(base[0].clone());
    let msg = plan_assembly(&twice, &AssembleOptions::default()).unwrap_err().to_string();
    assert!(msg.contains("offered twice"), "{msg}");

    // A member too small for its data_size.
    let mut small = base.clone();
    small[3].dev_sectors = 20000;
    let msg = plan_assembly(&small, &AssembleOptions::default()).unwrap_err().to_string();
    assert!(msg.contains("member3") && msg.contains("does not fit"), "{msg}");
}

#[test]
fn degraded_start_needs_run_and_too_few_is_an_error() {
    let base = offered("raid5-4dev-64k-ls", 4);
    let three: Vec<_> = base[1..].to_vec();
    let err = plan_assembly(&three, &AssembleOptions::default()).unwrap_err();
    assert!(matches!(err, AssemblyError::NeedsRun { .. }), "{err}");
    assert!(err.to_string().contains("--run"));
    let plan = plan_assembly(&three, &AssembleOptions { run: true, ..Default::default() }).unwrap();
    assert_eq!(plan.degraded_slots, vec![0]);
    assert!(plan.slots[0].is_none());

    let two: Vec<_> = base[2..].to_vec();
    let err = plan_assembly(&two, &AssembleOptions { run: true, ..Default::default() }).unwrap_err();
    assert!(matches!(err, AssemblyError::TooFewMembers { .. }), "{err}");

    // raid6 survives two missing members with --run.
    let r6 = offered("raid6-6dev-64k", 6);
    let four: Vec<_> = r6[2..].to_vec();
    let plan = plan_assembly(&four, &AssembleOptions { run: true, ..Default::default() }).unwrap();
    assert_eq!(plan.degraded_slots, vec![0, 1]);

    // raid0 cannot lose any.
    let r0 = offered("raid0-3dev-32k", 3);
    let err = plan_assembly(&r0[..2], &AssembleOptions { run: true, ..Default::default() }).unwrap_err();
    assert!(matches!(err, AssemblyError::TooFewMembers { .. }));
}

#[test]
fn unclean_shutdown_with_and_without_bitmap() {
    // Mark the raid5 array dirty (resync_offset 0), as md writes while active.
    let dirty = |fixture: &str| -> Vec<OfferedMember> {
        let mut v = offered(fixture, 4);
        for m in &mut v {
            let sb = m.superblock.as_mut().unwrap();
            sb.resync_offset = 0;
            sb.update_csum();
        }
        v
    };
    let plan = plan_assembly(&dirty("raid5-4dev-64k-ls"), &AssembleOptions::default()).unwrap();
    assert_eq!(plan.resync, ResyncNeed::Full { from_sector: 0 });

    let mut with_bitmap = dirty("raid5-4dev-64k-bitmap");
    let plan = plan_assembly(&with_bitmap, &AssembleOptions::default()).unwrap();
    assert_eq!(plan.resync, ResyncNeed::Bitmap { regions: vec![] });
    // Set bit 0 in the freshest member's bitmap: exactly that region is resynced.
    let f = plan.freshest;
    with_bitmap[f].bitmap.as_mut().unwrap()[BITMAP_SUPER_BYTES] = 0xff;
    let plan = plan_assembly(&with_bitmap, &AssembleOptions::default()).unwrap();
    assert_eq!(plan.resync, ResyncNeed::Bitmap { regions: vec![(0, 30720)] });
}

#[test]
fn force_starts_a_dirty_degraded_raid5_and_takes_back_members_only_events_behind() {
    let base = offered("raid5-4dev-64k-ls", 4);
    let dirty: Vec<OfferedMember> = base
        .iter()
        .cloned()
        .map(|mut m| {
            let sb = m.superblock.as_mut().unwrap();
            sb.resync_offset = 0;
            sb.update_csum();
            m
        })
        .collect();
    // Dirty and degraded: refused (md's write hole), and the message names --force.
    let err = plan_assembly(&dirty[1..], &AssembleOptions { run: true, ..Default::default() }).unwrap_err();
    assert!(matches!(err, AssemblyError::TooFewMembers { clean: false, .. }), "{err}");
    assert!(err.to_string().contains("--force"), "{err}");
    let forced = AssembleOptions { run: true, force: true, ..Default::default() };
    let plan = plan_assembly(&dirty[1..], &forced).unwrap();
    assert_eq!(plan.degraded_slots, vec![0]);
    assert_eq!(plan.resync, ResyncNeed::Full { from_sector: 0 }, "the resync stays owed");
    assert!(plan.warnings.iter().any(|w| w.contains("write hole")), "{:?}", plan.warnings);

    // Two members two events behind the others: too few current ones to start.
    let behind: Vec<OfferedMember> = base
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, mut m)| {
            let sb = m.superblock.as_mut().unwrap();
            sb.events += if i < 2 { 2 } else { 0 };
            sb.update_csum();
            m
        })
        .collect();
    let err = plan_assembly(&behind, &AssembleOptions { run: true, ..Default::default() }).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
    let plan = plan_assembly(&behind, &forced).unwrap();
    let taken = plan.slots.iter().flatten().count();
    assert_eq!(taken, 3, "force takes back one member, as many as the array needs to start");
    assert_eq!(plan.stale.len(), 1);
    assert!(plan.warnings.iter().any(|w| w.starts_with("forced:")), "{:?}", plan.warnings);
}
