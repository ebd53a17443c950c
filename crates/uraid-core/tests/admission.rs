//! Writes held by the array until the superblocks say dirty (md's `md_write_start`): no
//! client data reaches a member before the round marking the array active is durable,
//! the write-back of an unaligned write's read-modify-write included.

mod common;

use common::*;
use uraid_core::*;

const MEMBER_BYTES: u64 = 8 << 20;

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed).fill(&mut v);
    v
}

/// A clean array; an aligned write marks it dirty and waits for that round, which the
/// members hold back; meanwhile an unaligned write elsewhere reads its edge sector (reads
/// need no dirty marking) and builds its write-back. That write-back must wait for the
/// round too: landing before it, a crash assembles clean with no resync over stale parity.
#[test]
fn an_unaligned_writes_read_modify_write_waits_for_the_dirty_superblocks() {
    for (level, n, bitmap) in [(5, 3, false), (5, 3, true), (1, 2, false), (6, 4, true), (10, 4, false)] {
        let ctx = format!("raid{level} bitmap {bitmap}");
        let mut d = start_array(create_level(level, n, MEMBER_BYTES, bitmap), &(0..n).collect::<Vec<_>>(), 3);
        let data_at = d.members.superblock(0).data_offset * 512;
        assert_eq!(d.members.superblock(0).resync_offset, uraid_core::meta::MAX_SECTOR, "{ctx}: clean");
        let aligned = data(1, 4096);
        let edge = data(2, 10);
        d.submit(Request::write(1, 1 << 20, aligned.clone()));
        d.submit(Request::write(2, 100, edge.clone()));
        // Every member I/O performed in order, the metadata held back.
        run_in_order(&mut d, |_| usize::MAX, &|_| false, &is_meta);
        assert!(d.pending.iter().any(is_meta), "{ctx}: the dirty round is not held");
        let early: Vec<_> =
            d.members.log.iter().filter(|e| e.1 == MemberIoOp::Write && e.2 >= data_at).collect();
        assert!(
            early.is_empty(),
            "{ctx}: client data reached the members before the superblocks said dirty: {early:?}"
        );
        assert!(d.done.is_empty(), "{ctx}: a write completed before the array was marked dirty");
        d.run_until_idle();
        for id in [1, 2] {
            assert_eq!(d.take_done(id).map(|c| c.result.is_ok()), Some(true), "{ctx}: write {id}");
        }
        assert_eq!(d.run_one(Request::read(3, 1 << 20, 4096)).unwrap(), aligned, "{ctx}");
        assert_eq!(d.run_one(Request::read(4, 100, 10)).unwrap(), edge, "{ctx}");
    }
}
