//! raid1/raid10 read-error correction (md's `fix_read_error`) against client writes: the
//! good copy's data is written over the copy that failed to read, and a write of newer
//! data to the same sectors must never be overwritten by it. md freezes the array for the
//! fix; here writes overlapping the range wait for it, and it reads the good copy again
//! once the writes in flight there have landed.

mod common;

use common::*;
use uraid_core::*;

const MEMBER_SECTORS: u64 = 2048;
const DATA_OFFSET: u64 = 4096;

fn mirrors() -> Vec<Geometry> {
    let s = |n: usize| vec![MEMBER_SECTORS; n];
    vec![
        Geometry::new(Level::Raid1, 2, 0, 0, &s(2)).unwrap(),
        Geometry::new(Level::Raid10, 4, 0x102, 16, &s(4)).unwrap(),
    ]
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed).fill(&mut v);
    v
}

/// One pass of the shared driver: what the engine issued joins `d.pending`, then the
/// oldest `take` I/Os of it are performed.
fn pass(d: &mut Driver, take: fn(usize) -> usize) {
    d.engine.unplug(d.now_ns);
    d.now_ns += 10_000;
    let now = d.now_ns;
    let mut ex = InOrder {
        members: &mut d.members,
        pending: &mut d.pending,
        take,
        fail: &|_| false,
        hold: &|_| false,
    };
    let done = &mut d.done;
    drive::exchange(&mut d.engine, &mut ex, &mut || now, &mut Vec::new(), |c| done.push(c));
}

/// Member `m`'s bytes of data-relative sectors [sector, sector + n).
fn on_member(d: &Driver, m: usize, sector: u64, n: u64) -> Vec<u8> {
    let at = (DATA_OFFSET + sector * 512) as usize;
    d.members.images[m][at..at + (n * 512) as usize].to_vec()
}

/// A read fails on one copy and is served by the other's old data D0; a write of D1 to
/// the same sectors is acknowledged; whenever the correction's write lands, both copies
/// must hold D1. Two orders: the write issued while the good copy is being read (the
/// correction then lands after it, in issue order), and the write submitted once the
/// correction is under way, the correction's write performed only after the write
/// completed (members reorder overlapping writes).
#[test]
fn a_read_error_correction_never_overwrites_a_newer_write() {
    let mut stale = Vec::new();
    for g in mirrors() {
        for late_write in [false, true] {
            let ctx = format!("{:?} late write {late_write}", g.level);
            let mut d = Driver::new(
                Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(),
                MemMembers::new(g.raid_disks, DATA_OFFSET + MEMBER_SECTORS * 512),
                1,
            );
            let (d0, d1) = (pattern(1, 4096), pattern(2, 4096));
            d.run_one(Request::write(1, 0, d0.clone())).unwrap();
            // The read goes to one copy, whose sectors then fail to read.
            d.submit(Request::read(2, 0, 4096));
            pass(&mut d, |_| 0);
            let first = d.pending[0].clone();
            assert_eq!(first.op, MemberIoOp::Read, "{ctx}");
            let bad = first.member;
            d.members.latent.push((bad, first.offset_bytes, first.offset_bytes + 4096));
            // It fails there; the engine reads the other copy.
            pass(&mut d, |_| 1);
            pass(&mut d, |_| 0);
            assert!(d.pending.iter().any(|io| io.op == MemberIoOp::Read && io.member != bad), "{ctx}");
            if !late_write {
                d.submit(Request::write(3, 0, d1.clone()));
                pass(&mut d, |_| 0);
                // The good copy answers D0 before the write lands there; then all in order.
                run_in_order(&mut d, |_| 1, &|_| false, &|_| false);
            } else {
                // The good copy answers D0; the correction is under way.
                pass(&mut d, |_| 1);
                d.submit(Request::write(3, 0, d1.clone()));
                // Writes of D0 (the correction's) wait until the client's write completed.
                let old = d0.clone();
                run_in_order(&mut d, |_| 1, &|_| false, &|io: &MemberIo| {
                    io.op == MemberIoOp::Write && io.data[..] == old[..]
                });
                d.run_until_idle();
            }
            assert_eq!(d.take_done(2).map(|c| c.result.is_ok()), Some(true), "{ctx}: the read");
            assert_eq!(d.take_done(3).map(|c| c.result.is_ok()), Some(true), "{ctx}: the write");
            let mut copies = Vec::new();
            g.copies(0, &mut copies);
            for c in copies {
                if on_member(&d, c.member, c.member_sector, 8) != d1 {
                    stale.push(format!(
                        "{ctx}: member {} ({}) does not hold the acknowledged write",
                        c.member,
                        if c.member == bad { "the copy that failed the read" } else { "the good copy" }
                    ));
                }
            }
        }
    }
    assert!(stale.is_empty(), "{stale:#?}");
}
