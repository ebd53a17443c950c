//! The running array as one state machine (`uraid_core::array::Array`) over members in
//! RAM: the superblocks say dirty before the first write lands and clean after writes
//! stop; a member failure (a data, superblock, bitmap or flush error) is in the others'
//! superblocks before any completion is released; bitmap bits are durable before their
//! writes and cleared only after a flush; a hot spare takes a failed slot; closing marks
//! the array clean; a read-modify-write of a partial sector loses no overlapping write.

mod common;

use common::*;
use uraid_core::array::*;
use uraid_core::meta::*;
use uraid_core::*;

const MEMBER_BYTES: u64 = 8 << 20;
const SB_AT: u64 = 8 * 512;

/// `uraid create --assume-clean` of `level` on `n` members in RAM (64 KiB chunks; with a
/// bitmap of 64 KiB bitmap chunks).
fn create(level: i32, n: usize, bitmap: bool) -> MemMembers {
    create_level(level, n, MEMBER_BYTES, bitmap)
}

/// Assembles the members `keys` as `uraid serve` does and starts the array on them.
fn start(mm: MemMembers, keys: &[usize]) -> Driver<Array> {
    start_array(mm, keys, 11)
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed).fill(&mut v);
    v
}

/// Index in the log of the first data write (beyond the metadata area).
fn first_data_write(mm: &MemMembers, data_offset_bytes: u64) -> usize {
    mm.log.iter().position(|e| e.1 == MemberIoOp::Write && e.2 >= data_offset_bytes).expect("a data write")
}

#[test]
fn the_superblocks_say_dirty_before_a_write_lands_and_clean_once_writes_stop() {
    for seed in 0..10 {
        dirty_before_the_first_write(seed);
    }
}

fn dirty_before_the_first_write(seed: u64) {
    let mut d = start(create(5, 3, false), &[0, 1, 2]);
    d.rng = Rng(seed);
    let sb0 = d.members.superblock(0);
    assert_eq!(sb0.resync_offset, MAX_SECTOR, "created clean");
    d.run_one(Request::write(1, 0, data(1, 8192))).unwrap();
    let first = first_data_write(&d.members, sb0.data_offset * 512);
    for m in 0..3 {
        let sb_write = d.members.log[..first]
            .iter()
            .position(|e| e.0 == m && e.1 == MemberIoOp::Write && e.2 == SB_AT)
            .unwrap_or_else(|| panic!("member {m}'s superblock was not written before the first data write"));
        assert!(
            d.members.log[sb_write..first].iter().any(|e| e.0 == m && e.1 == MemberIoOp::Flush),
            "member {m}'s dirty superblock was not flushed before the first data write"
        );
    }
    // run_one ran until idle: time went on until md's safe mode marked the array clean.
    for m in 0..3 {
        let sb = d.members.superblock(m);
        assert_eq!(sb.resync_offset, MAX_SECTOR, "member {m} not marked clean after writes stopped");
        assert_eq!(sb.events, sb0.events + 2, "dirty, then clean");
    }
    assert!(d.engine.is_idle());
    assert!(d.engine.next_deadline_ns().is_none(), "an idle clean array is not woken");
}

/// Runs until idle, checking at every step that no completion is released after the
/// engine failed `slot` and before member `witness`'s superblock records the failure.
fn run_checking_record(d: &mut Driver<Array>, slot: usize, witness: usize) {
    d.engine.unplug(d.now_ns);
    let mut guard = 0;
    loop {
        let before = d.done.len();
        let more = d.step();
        // The driver collects completions at the end of its step: the engine holds them
        // from the failure on, so any collected after it must wait for the record.
        let failed = d.engine.engine().member_states()[slot] == MemberState::Faulty;
        if d.done.len() > before && failed {
            let sb = d.members.superblock(witness);
            assert_eq!(
                sb.dev_roles[slot],
                role::FAULTY,
                "a completion went out before the superblocks recorded slot {slot}'s failure"
            );
        }
        if !more {
            break;
        }
        guard += 1;
        assert!(guard < 1_000_000);
    }
}

#[test]
fn a_member_failure_is_recorded_before_any_completion_is_released() {
    for (what, level, n) in [("data", 5, 3), ("data", 1, 2), ("superblock", 6, 4), ("flush", 10, 4)] {
        let mut d = start(create(level, n, false), &(0..n).collect::<Vec<_>>());
        d.run_one(Request::write(1, 0, data(1, 65536))).unwrap();
        let victim = 1;
        match what {
            "data" => d.members.gone[victim] = true,
            "superblock" => d.members.write_errors.push((victim, 0, SB_AT + 4096)),
            _ => d.members.flush_errors.push(victim),
        }
        for id in 2..10u64 {
            d.submit(Request::write(id, id * 65536, data(id, 65536)));
        }
        d.submit(Request::flush(10));
        run_checking_record(&mut d, victim, 0);
        for id in 2..=10 {
            let c = d.take_done(id).unwrap_or_else(|| panic!("{what}: request {id} never completed"));
            assert!(c.result.is_ok(), "{what}: the client saw {:?}", c.result);
        }
        assert_eq!(d.engine.engine().member_states()[victim], MemberState::Faulty, "{what}");
        for m in (0..n).filter(|&m| m != victim) {
            assert_eq!(d.members.superblock(m).dev_roles[victim], role::FAULTY, "{what}: member {m}");
        }
        // Everything reads back through the others.
        for id in 1..10u64 {
            let back =
                d.run_one(Request::read(100 + id, (id % 10) * 65536 * u64::from(id > 1), 65536)).unwrap();
            assert_eq!(back, data(id, 65536), "{what}: write {id} lost");
        }
    }
}

#[test]
fn bitmap_bits_are_durable_before_their_write_and_cleared_after_a_flush() {
    let mut d = start(create(1, 2, true), &[0, 1]);
    let sb = d.members.superblock(0);
    let bitmap_at = sb.bitmap_sector().unwrap() * 512;
    let data_at = sb.data_offset * 512;
    d.run_one(Request::write(1, 0, data(1, 4096))).unwrap();
    let log = &d.members.log;
    let first = first_data_write(&d.members, data_at);
    for m in 0..2 {
        let page = log[..first]
            .iter()
            .rposition(|e| e.0 == m && e.1 == MemberIoOp::Write && e.2 >= bitmap_at && e.2 < data_at)
            .unwrap_or_else(|| panic!("member {m}: no bitmap page written before the data"));
        assert!(log[page..first].iter().any(|e| e.0 == m && e.1 == MemberIoOp::Flush));
    }
    // Idle since: the daemon cleared the bit, after a flush of each member that followed
    // the data writes.
    let last_data = log.iter().rposition(|e| e.1 == MemberIoOp::Write && e.2 >= data_at).unwrap();
    let image = d.members.metadata(0).offered.bitmap.unwrap();
    let bits = BitmapImage::parse(&image).unwrap();
    assert_eq!(bits.dirty_count(), 0, "the bit was never cleared");
    let clear =
        log.iter().rposition(|e| e.0 == 0 && e.1 == MemberIoOp::Write && e.2 >= bitmap_at && e.2 < data_at);
    let clear = clear.unwrap();
    for m in 0..2 {
        assert!(
            log[last_data..clear].iter().any(|e| e.0 == m && e.1 == MemberIoOp::Flush),
            "member {m} was not flushed between the data write and the cleared bit"
        );
    }
}

#[test]
fn a_hot_spare_takes_a_failed_slot_and_is_rebuilt() {
    let mut d = start(create(5, 3, false), &[0, 1, 2]);
    let blocks: Vec<Vec<u8>> = (0..16).map(|i| data(i, 65536)).collect();
    for (i, b) in blocks.iter().enumerate() {
        d.run_one(Request::write(i as u64 + 1, i as u64 * 65536, b.clone())).unwrap();
    }
    let new = prepare_new_member(&mut d, MEMBER_BYTES, 0x55);
    let key = new.key as usize;
    assert_eq!(d.engine.add_member(new, d.now_ns).unwrap(), Added::Spare);
    d.run_until_idle();
    assert_eq!(d.members.superblock(key).dev_roles[3], role::SPARE);
    d.members.gone[1] = true;
    d.run_one(Request::write(100, 0, blocks[0].clone())).unwrap();
    d.run_until_idle();
    assert!(d.engine.engine().member_states().iter().all(|s| *s == MemberState::InSync));
    let sb = d.members.superblock(key);
    assert_eq!(sb.role(), 1, "the spare holds slot 1");
    assert!(!sb.has(feature::RECOVERY_OFFSET), "rebuilt in full");
    assert_eq!(d.members.superblock(0).dev_roles[sb.dev_number as usize], 1);
    // Without member 0 now, everything still reads back (the spare carries slot 1).
    d.members.gone[0] = true;
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(&d.run_one(Request::read(200 + i as u64, i as u64 * 65536, 65536)).unwrap(), b);
    }
}

#[test]
fn closing_marks_the_superblocks_clean_after_a_flush() {
    let mut d = start(create(6, 4, true), &[0, 1, 2, 3]);
    d.submit(Request::write(1, 0, data(1, 65536)));
    // Not idle yet: close while the array is dirty.
    while d.done.is_empty() {
        d.step();
    }
    assert_ne!(d.members.superblock(0).resync_offset, MAX_SECTOR, "dirty while writing");
    let mut result = None;
    for _ in 0..100_000 {
        result = d.engine.finish_close(Ok(()), d.now_ns);
        if result.is_some() {
            break;
        }
        d.step();
    }
    assert_eq!(result, Some(Ok(())));
    for m in 0..4 {
        let sb = d.members.superblock(m);
        assert_eq!(sb.resync_offset, MAX_SECTOR, "member {m} not clean after the close");
    }
    let bits = BitmapImage::parse(&d.members.metadata(0).offered.bitmap.unwrap()).unwrap();
    assert_eq!(bits.dirty_count(), 0, "the close clears bits whose writes reached every member");
}

/// Concurrent overlapping writes may land in either order (as on any block device; on a
/// mirror two such whole-sector writes may even leave the copies different, as md's do, so
/// the bursts keep whole-sector parts apart), but a read-modify-write of an edge sector
/// must never put back stale bytes over a write it does not itself cover: every byte ends
/// as one of the writes that covered it, or as it was when none did.
#[test]
fn a_read_modify_write_loses_no_overlapping_write() {
    for seed in 0..30u64 {
        let (level, n) = [(5, 3), (1, 2), (10, 3)][seed as usize % 3];
        let mut d = start(create(level, n, seed % 2 == 0), &(0..n).collect::<Vec<_>>());
        let mut rng = Rng(seed);
        let mut image = vec![0u8; 1 << 16];
        let mut id = 1;
        for burst in 0..20 {
            let mut writes: Vec<(usize, Vec<u8>)> = Vec::new();
            let mut whole_parts: Vec<(u64, u64)> = Vec::new();
            while writes.len() < 8 {
                let off = rng.below(60_000);
                let len = 1 + rng.below(3000);
                let aligned = rng.below(2) == 0;
                let (off, len) =
                    if aligned { (off / 512 * 512, len.div_ceil(512) * 512) } else { (off, len) };
                let whole = (off.div_ceil(512), (off + len) / 512);
                if whole.0 < whole.1 && whole_parts.iter().any(|&p| overlaps(p, whole)) {
                    continue;
                }
                whole_parts.push(whole);
                let bytes = data(seed * 1000 + id, len as usize);
                d.submit(Request::write(id, off, bytes.clone()));
                writes.push((off as usize, bytes));
                id += 1;
            }
            d.run_until_idle();
            for c in d.done.drain(..) {
                assert!(c.result.is_ok(), "seed {seed}: request {} failed", c.id);
            }
            let back = d.run_one(Request::read(id, 0, 1 << 16)).unwrap();
            id += 1;
            for (b, &got) in back.iter().enumerate() {
                let mut covering = writes.iter().filter(|(o, w)| *o <= b && b < o + w.len()).peekable();
                let ok = if covering.peek().is_none() {
                    got == image[b]
                } else {
                    covering.any(|(o, w)| w[b - o] == got)
                };
                assert!(
                    ok,
                    "seed {seed} burst {burst}: byte {b} holds a value no write of the burst put there"
                );
            }
            image = back;
        }
        // An unaligned read.
        let back = d.run_one(Request::read(id, 1001, 3333)).unwrap();
        assert_eq!(back, image[1001..1001 + 3333]);
    }
}

/// mdadm --fail refuses a member whose loss would fail the array (md's MD_BROKEN, mdadm's
/// "array will be failed"): nothing changes, the data still reads; `force` insists.
#[test]
fn failing_the_last_redundant_member_is_refused_unless_forced() {
    for (level, n, already_lost) in [(5, 3, 1), (1, 2, 1), (6, 4, 2), (10, 4, 1), (0, 2, 0)] {
        let mut d = start(create(level, n, false), &(0..n).collect::<Vec<_>>());
        let block = data(level as u64, 65536);
        d.run_one(Request::write(1, 0, block.clone())).unwrap();
        for key in 0..already_lost {
            d.engine.fail(key as u64, false, d.now_ns).unwrap_or_else(|e| panic!("raid{level}: {e}"));
            d.run_until_idle();
        }
        // raid10 near-2 on 4: slot 1 holds slot 0's copies.
        let victim = if level == 10 { 1 } else { already_lost };
        let before: Vec<Superblock> = (0..n).map(|m| d.members.superblock(m)).collect();
        let e =
            d.engine.fail(victim as u64, false, d.now_ns).expect_err(&format!("raid{level}: fail accepted"));
        assert!(e.contains("would fail") && e.contains("--force"), "raid{level}: {e}");
        d.run_until_idle();
        assert!(!d.engine.engine().is_failed(), "raid{level}: {e}");
        assert_eq!(d.engine.engine().member_states()[victim], MemberState::InSync, "raid{level}");
        let after: Vec<Superblock> = (0..n).map(|m| d.members.superblock(m)).collect();
        assert_eq!(before, after, "raid{level}: a refused fail changed the superblocks");
        assert_eq!(d.run_one(Request::read(2, 0, 65536)).unwrap(), block, "raid{level}");
        // --force: md fails the member and with it the array.
        d.engine.fail(victim as u64, true, d.now_ns).unwrap();
        d.run_until_idle();
        assert!(d.engine.engine().is_failed(), "raid{level}: forced fail did not fail the array");
    }
}

/// md's unplug: the bits of writes that wait together for the bitmap go to disk in one
/// page round (one write of each page and one flush per member), not one round per write.
/// Before: each write into a clean chunk queued a round of its own, run one after another,
/// so random writes into clean chunks went one bitmap write + flush at a time.
/// A device added to a running array takes the first free dev_number from raid_disks up, as
/// md's bind_rdev_to_array (seen in the md VM: raid5 of 4, member 1 failed and removed, the
/// device added got number 4, the next 5), not the number the missing member left.
#[test]
fn an_added_device_numbers_from_raid_disks_up_as_md_does() {
    let d = start(create(5, 4, true), &[0, 2, 3]);
    let sb = d.engine.new_member_superblock(MEMBER_BYTES / 512, [0x55; 16], "new").unwrap();
    assert_eq!(sb.dev_number, 4, "member 1's number is not reused");
}

#[test]
fn writes_waiting_for_bitmap_bits_share_one_page_round() {
    let mut d = start(create(1, 2, true), &[0, 1]);
    let sb = d.members.superblock(0);
    let bitmap_at = sb.bitmap_sector().unwrap() * 512;
    let data_at = sb.data_offset * 512;
    let writes = 16u64;
    // Sixteen 4 KiB writes, each in a chunk of its own (64 KiB bitmap chunks), all at once.
    for i in 0..writes {
        d.submit(Request::write(i + 1, i * 65536 + 4096, data(i, 4096)));
    }
    d.run_until_idle();
    assert_eq!(d.done.len(), writes as usize, "every write completed");
    assert!(d.done.iter().all(|c| c.result.is_ok()), "{:?}", d.done);
    let log = &d.members.log;
    let last_data = log.iter().rposition(|e| e.1 == MemberIoOp::Write && e.2 >= data_at).unwrap();
    let page_writes = log[..last_data]
        .iter()
        .filter(|e| e.0 == 0 && e.1 == MemberIoOp::Write && e.2 >= bitmap_at && e.2 < data_at)
        .count();
    let flushes = log[..last_data].iter().filter(|e| e.0 == 0 && e.1 == MemberIoOp::Flush).count();
    // The first write's round starts at once; the fifteen that arrive while it runs share
    // the next. (The superblocks' dirty round writes page 0's header too.)
    assert!(page_writes <= 4, "{page_writes} bitmap writes on member 0 for {writes} writes");
    assert!(flushes <= 4, "{flushes} flushes on member 0 before the last data write");
    for i in 0..writes {
        assert_eq!(d.run_one(Request::read(100 + i, i * 65536 + 4096, 4096)).unwrap(), data(i, 4096));
    }
}
