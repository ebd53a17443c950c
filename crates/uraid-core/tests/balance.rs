//! Mirror read balancing: `load-time` is gmirror's original `load` (FreeBSD 7, seed 003):
//! a read goes to the member whose last I/O answered fastest, unless a member was sent
//! nothing for 2 s.

mod common;

use common::*;
use uraid_core::mirror::Balance;
use uraid_core::*;

const MEMBER_SECTORS: u64 = 2048;
const DATA_OFFSET: u64 = 4096;
const MS: u64 = 1_000_000;

/// Reads 4 KiB at `at_bytes` at `now_ns` and completes it `delay_ns` later; returns the
/// member that served it.
fn read_served_by(d: &mut Driver, id: u64, at_bytes: u64, now_ns: u64, delay_ns: u64) -> usize {
    d.engine.submit(Request::read(id, at_bytes, 4096), now_ns).unwrap();
    d.engine.unplug(now_ns);
    let io = d.engine.pop_member_io().expect("one member read");
    assert!(d.engine.pop_member_io().is_none(), "a 4 KiB read is one member read");
    let member = io.member;
    let done = d.members.perform(io);
    d.engine.complete_member_io(done, now_ns + delay_ns);
    assert_eq!(d.engine.pop_completion().map(|c| c.id), Some(id));
    d.now_ns = now_ns + delay_ns;
    member
}

#[test]
fn load_time_reads_from_the_member_that_answered_fastest_unless_one_sat_idle_2_s() {
    let g = Geometry::new(Level::Raid1, 3, 0, 0, &[MEMBER_SECTORS; 3]).unwrap();
    let mut d = Driver::new(
        Engine::new(config(g, DATA_OFFSET)).unwrap(),
        MemMembers::new(3, DATA_OFFSET + MEMBER_SECTORS * 512),
        1,
    );
    d.engine.set_tunable("balance", Balance::LoadTime.name()).unwrap();
    // No member has answered yet: each in turn (a member never used has delay 0).
    assert_eq!(read_served_by(&mut d, 1, 0, 0, 10 * MS), 0);
    assert_eq!(read_served_by(&mut d, 2, 4096, 10 * MS, 2 * MS), 1);
    assert_eq!(read_served_by(&mut d, 3, 8192, 12 * MS, 5 * MS), 2);
    // Delays now 10, 2 and 5 ms: the fastest keeps the reads while it stays fastest.
    assert_eq!(read_served_by(&mut d, 4, 0, 17 * MS, 3 * MS), 1);
    assert_eq!(read_served_by(&mut d, 5, 0, 20 * MS, 6 * MS), 1);
    // Member 1 answered in 6 ms, slower than member 2's 5.
    assert_eq!(read_served_by(&mut d, 6, 0, 26 * MS, MS), 2);
    // Member 0 was sent nothing since t=0: 2 s on it gets a read however slow it was.
    assert_eq!(read_served_by(&mut d, 7, 0, 2_000 * MS, MS), 0);
}
