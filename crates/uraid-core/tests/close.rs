//! The clean close: what `uraid serve` reports after SIGTERM must be what the members hold.

mod common;

use common::*;
use uraid_core::*;

fn close(d: &mut Driver<uraid_core::array::Array>) -> Option<Result<(), RequestError>> {
    for _ in 0..100_000 {
        if let Some(r) = d.engine.finish_close(Ok(()), d.now_ns) {
            return Some(r);
        }
        d.step();
    }
    None
}

/// A closing superblock round that no member takes leaves nothing marked clean: the close
/// must fail (the server then says so instead of "stopped cleanly").
#[test]
fn a_close_whose_superblock_writes_all_fail_is_not_clean() {
    let mut d = start_array(create_level(5, 3, 8 << 20, true), &[0, 1, 2], 1);
    d.submit(Request::write(1, 0, vec![7u8; 65536]));
    d.run_until_idle();
    // From now on every write to the metadata area fails (the data area lies beyond it).
    let data_offset_bytes = d.members.superblock(0).data_offset * 512;
    for m in 0..3 {
        d.members.write_errors.push((m, 0, data_offset_bytes));
    }
    let r = close(&mut d).expect("the close never answered");
    assert!(r.is_err(), "the close reported clean although no superblock was written");
}

#[test]
fn a_close_with_one_member_failing_its_superblock_write_is_still_clean_on_the_others() {
    let mut d = start_array(create_level(5, 3, 8 << 20, true), &[0, 1, 2], 2);
    d.submit(Request::write(1, 0, vec![7u8; 65536]));
    d.run_until_idle();
    let data_offset_bytes = d.members.superblock(0).data_offset * 512;
    d.members.write_errors.push((1, 0, data_offset_bytes));
    assert_eq!(close(&mut d), Some(Ok(())));
    for m in [0, 2] {
        assert_eq!(d.members.superblock(m).resync_offset, u64::MAX, "member {m} not clean");
    }
}
