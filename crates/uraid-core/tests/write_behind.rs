//! md's write-behind (raid1 with a bitmap and a write-mostly member): a write completes
//! once the other members have it; the write-mostly copy lands later, its bitmap bits
//! stay until it does, flushes and reads that would see it wait for it, and overlapping
//! writes reach it in order.

mod common;

use common::*;
use uraid_core::api::*;
use uraid_core::meta::{BitmapImage, CreateParams};

const MEMBER_BYTES: u64 = 8 << 20;
const WM: usize = 1;

/// A raid1 of two members in RAM, made by `create` with a bitmap and `--write-behind
/// max`, member 1 write-mostly (its superblock's devflag, as `uraid create` sets it).
fn raid1_write_behind(max: u32) -> Driver<uraid_core::array::Array> {
    let mut p = CreateParams::new(1, vec![Some(MEMBER_BYTES / 512); 2]);
    p.bitmap = true;
    p.bitmap_chunk_bytes = Some(64 << 10);
    p.assume_clean = true;
    p.write_behind = max;
    p.set_uuid = [7; 16];
    p.device_uuids = vec![[1; 16], [2; 16]];
    p.ctime_seconds = EPOCH_S;
    p.name = "t".into();
    let mut mm = create_in_ram(&p, MEMBER_BYTES);
    let mut sb = mm.superblock(WM);
    sb.devflags |= uraid_core::meta::superblock::devflags::WRITE_MOSTLY;
    let bytes = sb.update_csum();
    mm.write_at(WM, sb.super_offset * 512, &bytes);
    start_array(mm, &[0, 1], 3)
}

/// Holds the data writes to the write-mostly member (its reads, flushes and metadata go
/// on: what waits, waits for the behind writes themselves).
fn slow(io: &MemberIo) -> bool {
    io.member == WM && io.op == MemberIoOp::Write && !is_meta(io)
}

fn data_on(d: &Driver<uraid_core::array::Array>, m: usize, at: u64, len: usize) -> Vec<u8> {
    let off = d.members.superblock(m).data_offset as usize * 512 + at as usize;
    d.members.images[m][off..off + len].to_vec()
}

/// Member 0's on-disk bitmap: is the chunk of array byte `at` set?
fn bit_set(d: &Driver<uraid_core::array::Array>, at: u64) -> bool {
    let meta = d.members.metadata(0);
    let img = BitmapImage::parse(meta.offered.bitmap.as_ref().expect("bitmap")).expect("bitmap parses");
    img.is_dirty(at / (64 << 10))
}

#[test]
fn a_write_completes_before_its_write_mostly_copy_and_keeps_its_bits_until_it_lands() {
    let mut d = raid1_write_behind(4);
    let data = vec![0xa5u8; 64 << 10];
    d.submit(Request::write(1, 1 << 20, data.clone()));
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    let c = d.take_done(1).expect("the write completed while its write-mostly copy is held");
    assert!(c.result.is_ok());
    assert_eq!(d.engine.view().behind_writes_in_flight, 1);
    assert_ne!(data_on(&d, WM, 1 << 20, data.len()), data, "the held copy has not landed");
    assert_eq!(data_on(&d, 0, 1 << 20, data.len()), data);
    // Long idle: the bitmap daemon would clear a finished write's bit by now.
    for _ in 0..5 {
        run_in_order(&mut d, |n| n, &|_| false, &slow);
    }
    assert!(bit_set(&d, 1 << 20), "the bit of a write whose behind copy flies stays set on disk");
    // A read is served by the other member, with the new data.
    d.submit(Request::read(2, 1 << 20, data.len() as u64));
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    assert_eq!(d.take_done(2).expect("read done").result.unwrap(), data);
    // A flush waits for the behind copy.
    d.submit(Request::flush(3));
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    assert!(d.take_done(3).is_none(), "a flush completed before the behind write before it landed");
    d.run_until_idle();
    assert!(d.take_done(3).expect("flush done").result.is_ok());
    assert_eq!(data_on(&d, WM, 1 << 20, data.len()), data);
    assert_eq!(d.engine.view().behind_writes_in_flight, 0);
    for _ in 0..20 {
        d.now_ns += 1_000_000_000;
        d.engine.tick(d.now_ns);
        d.run_until_idle();
    }
    assert!(!bit_set(&d, 1 << 20), "the bit clears once the behind copy landed");
}

#[test]
fn at_most_max_writes_are_behind() {
    let mut d = raid1_write_behind(2);
    for i in 0..3u64 {
        d.submit(Request::write(10 + i, i << 20, vec![i as u8 + 1; 4096]));
    }
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    let done = (10..13).filter(|&id| d.take_done(id).is_some()).count();
    assert_eq!(done, 2, "two writes behind, the third waits for its write-mostly copy");
    d.run_until_idle();
    assert!(d.take_done(12).is_some());
    assert!(d.engine.view().write_behind_requests >= 2);
}

#[test]
fn without_write_behind_a_write_waits_for_the_write_mostly_copy() {
    let mut d = raid1_write_behind(0);
    d.submit(Request::write(1, 0, vec![1; 4096]));
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    assert!(d.take_done(1).is_none(), "write-behind is off: the write waits");
    d.run_until_idle();
    assert!(d.take_done(1).is_some());
}

#[test]
fn overlapping_writes_reach_the_write_mostly_member_in_order() {
    let mut d = raid1_write_behind(8);
    d.submit(Request::write(1, 0, vec![1; 8192]));
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    assert!(d.take_done(1).is_some());
    d.submit(Request::write(2, 4096, vec![2; 8192]));
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    assert!(d.take_done(2).is_some());
    let to_wm = d.pending.iter().filter(|io| slow(io) && io.op == MemberIoOp::Write).count();
    assert_eq!(to_wm, 1, "the later overlapping write waits for the earlier one on the write-mostly member");
    // Complete the member's I/O newest first: order must still hold.
    d.pending.reverse();
    d.run_until_idle();
    let mut want = vec![1u8; 4096];
    want.extend(vec![2u8; 8192]);
    assert_eq!(data_on(&d, WM, 0, want.len()), want);
}

#[test]
fn when_the_fast_member_fails_reads_and_completions_wait_for_the_behind_copies() {
    let mut d = raid1_write_behind(4);
    let data = vec![0x3cu8; 4096];
    d.submit(Request::write(1, 0, data.clone()));
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    assert!(d.take_done(1).is_some());
    d.engine.fail(0, true, d.now_ns).expect("fail the fast member");
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    d.submit(Request::read(2, 0, 4096));
    run_in_order(&mut d, |n| n, &|_| false, &slow);
    assert!(d.take_done(2).is_none(), "a read of a region whose only copy is in flight waits");
    d.run_until_idle();
    assert_eq!(d.take_done(2).expect("read").result.unwrap(), data);
}

#[test]
fn a_write_whose_fast_copy_fails_waits_for_its_write_mostly_copy() {
    let mut d = raid1_write_behind(4);
    let data = vec![0x77u8; 4096];
    d.submit(Request::write(1, 2 << 20, data.clone()));
    let fast_write_fails = |io: &MemberIo| io.member == 0 && io.op == MemberIoOp::Write && !is_meta(io);
    run_in_order(&mut d, |n| n, &fast_write_fails, &slow);
    assert!(
        d.take_done(1).is_none(),
        "acknowledged while its only copy was in flight to the write-mostly member"
    );
    d.run_until_idle();
    assert!(d.take_done(1).expect("the write completes once its behind copy landed").result.is_ok());
    assert_eq!(data_on(&d, WM, 2 << 20, data.len()), data);
}

#[test]
fn create_keeps_write_behind_in_the_bitmap_superblock_and_refuses_it_where_md_does() {
    use uraid_core::meta::{create_array, CreateError};
    let mut p = CreateParams::new(1, vec![Some(MEMBER_BYTES / 512); 2]);
    p.write_behind = 16;
    assert_eq!(create_array(&p).unwrap_err(), CreateError::WriteBehindNeedsBitmap);
    p.bitmap = true;
    let c = create_array(&p).unwrap();
    let area = &c.bitmap.as_ref().expect("bitmap").area;
    assert_eq!(BitmapImage::parse(area).unwrap().sb.write_behind, 16);
    p.write_behind = 0x4000;
    assert_eq!(create_array(&p).unwrap_err(), CreateError::WriteBehindTooLarge { write_behind: 0x4000 });
    let mut p5 = CreateParams::new(5, vec![Some(MEMBER_BYTES / 512); 3]);
    p5.bitmap = true;
    p5.write_behind = 16;
    assert_eq!(create_array(&p5).unwrap_err(), CreateError::WriteBehindNotRaid1 { level: 5 });
}
