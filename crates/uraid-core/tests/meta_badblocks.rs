//! md's bad-block log on disk: a log written by real md (Linux 6.1, entries put in through
//! the member's sysfs `bad_blocks` file, then `mdadm --stop`) parses to what md listed;
//! uraid writes the same bytes back; the running array's metadata rounds write the log
//! page before the superblock that points at it, with md's feature bit.

use uraid_core::array::*;
use uraid_core::meta::*;

const NOW: u64 = 1_700_000_000;

/// Bytes 4096..16384 of member /dev/vdb of a 2-member RAID1 made by mdadm 4.2 on 64 MiB
/// images (data_offset 2048, bblog_offset 16), after
/// `echo "2148 8" > .../dev-vdb/bad_blocks; echo "4096 1" > ...; mdadm --stop`.
/// `mdadm --examine-badblocks` printed "2148 for 8 sectors" and "4096 for 1 sectors".
const MD_MEMBER: &[u8] = include_bytes!("fixtures/md-raid1-badblocks-sb-and-log.bin");

#[test]
fn a_log_written_by_md_reads_as_md_listed_it_and_writes_back_the_same() {
    let sb = Superblock::parse(&MD_MEMBER[..4096], 8).unwrap();
    assert!(sb.has(feature::BAD_BLOCKS), "md sets the feature bit while the log has entries");
    assert_eq!((sb.bblog_offset, sb.bblog_size, sb.bblog_shift), (16, 8, 0));
    let at = ((sb.super_offset as i64 + i64::from(sb.bblog_offset)) * 512 - 4096) as usize;
    let log = &MD_MEMBER[at..at + 4096];
    let bb = BadBlocks::parse(&sb, log).unwrap().unwrap();
    // The sysfs sectors are device sectors: md stored them as given (data_offset 2048).
    assert_eq!(bb.entries().collect::<Vec<_>>(), vec![(2148, 8), (4096, 1)]);
    assert_eq!(bb.to_log_bytes(sb.bblog_size), log, "uraid writes md's bytes");
    assert_eq!(
        bb.examine_text("/dev/vdb"),
        "Bad-blocks on /dev/vdb:\n                2148 for 8 sectors\n                4096 for 1 sectors\n"
    );
}

fn raid1() -> ArraySuperblocks {
    let mut p = CreateParams::new(1, vec![Some(1 << 17); 2]);
    p.set_uuid = [7; 16];
    p.device_uuids = vec![[1; 16], [2; 16]];
    p.assume_clean = true;
    let c = create_array(&p).unwrap();
    let members: Vec<ArrayMember> = c
        .superblocks
        .iter()
        .enumerate()
        .map(|(slot, sb)| ArrayMember {
            key: 10 + slot as u64,
            sb: sb.clone().unwrap(),
            role: DevRole::Active { slot, recovering: false },
        })
        .collect();
    let events = members[0].sb.events;
    let mut a = ArraySuperblocks::new(members.clone(), events, false, false, None);
    for m in &members {
        a.load_bad_blocks(m.key, BadBlocks::for_superblock(&m.sb).unwrap());
    }
    a
}

fn writes(round: &MetaRound) -> Vec<(MemberKey, MetaWriteKind, u64, Vec<u8>)> {
    round
        .ios
        .iter()
        .filter_map(|io| match io {
            MetaIo::Write { key, what, offset_bytes, bytes, .. } => {
                Some((*key, *what, *offset_bytes, bytes.clone()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_recorded_range_is_written_to_the_log_before_the_superblock_and_cleared_later() {
    let mut a = raid1();
    let sb1 = a.member(11).unwrap().sb.clone();
    assert!(a.bad_blocks_recorded(1, 2048 + 64, 8));
    let round = a.write_superblocks(NOW);
    let w = writes(&round);
    let log_at = w.iter().position(|(k, what, ..)| *k == 11 && *what == MetaWriteKind::BadBlockLog);
    let sb_at = w.iter().position(|(k, what, ..)| *k == 11 && *what == MetaWriteKind::Superblock);
    assert!(matches!((log_at, sb_at), (Some(l), Some(s)) if l < s), "log page first: {w:?}");
    assert!(
        !w.iter().any(|(k, what, ..)| *k == 10 && *what == MetaWriteKind::BadBlockLog),
        "only member 1's log"
    );
    let (_, _, off, page) = &w[log_at.unwrap()];
    assert_eq!(*off, (sb1.super_offset as i64 + i64::from(sb1.bblog_offset)) as u64 * 512);
    let sb = Superblock::parse(&w[sb_at.unwrap()].3, sb1.super_offset).unwrap();
    assert!(sb.has(feature::BAD_BLOCKS));
    assert_eq!(BadBlocks::parse(&sb, page).unwrap().unwrap().entries().collect::<Vec<_>>(), vec![(2112, 8)]);
    let sb0 = writes(&round).into_iter().find(|(k, what, ..)| *k == 10 && *what == MetaWriteKind::Superblock);
    assert!(!Superblock::parse(&sb0.unwrap().3, sb1.super_offset).unwrap().has(feature::BAD_BLOCKS));
    let out = a.round_done(round, &[], NOW);
    assert!(out.newly_failed_slots.is_empty() && out.next.unwrap().is_none());
    // Cleared by a write: nothing written at once; the next superblock round carries it.
    a.bad_blocks_cleared(1, 2048 + 64, 8);
    let round = a.write_superblocks(NOW);
    let w = writes(&round);
    let page = &w.iter().find(|(k, what, ..)| *k == 11 && *what == MetaWriteKind::BadBlockLog).unwrap().3;
    assert!(page.iter().all(|&b| b == 0xff), "an empty log is all-ones");
    let sb = w.iter().find(|(k, what, ..)| *k == 11 && *what == MetaWriteKind::Superblock).unwrap();
    assert!(!Superblock::parse(&sb.3, sb1.super_offset).unwrap().has(feature::BAD_BLOCKS));
    a.round_done(round, &[], NOW);
    // Unchanged since: later rounds do not rewrite the page.
    let round = a.write_superblocks(NOW);
    assert!(!writes(&round).iter().any(|(_, what, ..)| *what == MetaWriteKind::BadBlockLog));
}
