//! md's write-mostly (raid1/raid10): reads avoid a write-mostly member while another
//! in-sync copy can serve them, and fall back to it when none can.

mod common;

use common::*;
use uraid_core::mirror::Balance;
use uraid_core::*;

const MEMBER_SECTORS: u64 = 2048;
const DATA_OFFSET: u64 = 4096;

fn read_all(d: &mut Driver, bytes: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, at) in (0..bytes).step_by(64 << 10).enumerate() {
        out.extend(d.run_one(Request::read(1000 + i as u64, at as u64, 64 << 10)).expect("read"));
    }
    out
}

#[test]
fn reads_avoid_a_write_mostly_member_until_it_is_the_only_copy() {
    for (level, n, layout) in [(Level::Raid1, 2, 0), (Level::Raid10, 2, 0x102)] {
        let g = Geometry::new(level, n, layout, 128, &vec![MEMBER_SECTORS; n]).unwrap();
        let mut d = Driver::new(
            Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(),
            MemMembers::new(n, DATA_OFFSET + MEMBER_SECTORS * 512),
            7,
        );
        d.engine.set_tunable("balance", Balance::RoundRobin.name()).unwrap();
        d.engine.set_write_mostly(1, true).unwrap();
        let bytes = g.array_bytes() as usize;
        let mut model = vec![0u8; bytes];
        Rng(7).fill(&mut model);
        d.run_one(Request::write(1, 0, model.clone())).expect("write");
        // Damage the write-mostly copy behind the engine's back: no read may come from it.
        let a = DATA_OFFSET as usize;
        for b in &mut d.members.images[1][a..a + bytes] {
            *b ^= 0x5a;
        }
        for _ in 0..3 {
            assert!(
                read_all(&mut d, bytes) == model,
                "{level:?}: a read was served by the write-mostly member"
            );
        }
        // With the other copy gone it is the only one left, and it serves.
        d.engine.fail_member(0, d.now_ns);
        assert!(read_all(&mut d, bytes) != model, "{level:?}: the write-mostly member was never read");
    }
    let g = Geometry::new(Level::Raid5, 3, 2, 128, &[MEMBER_SECTORS; 3]).unwrap();
    let mut e = Engine::new(config(g, DATA_OFFSET)).unwrap();
    assert!(e.set_write_mostly(0, true).is_err(), "raid5 has no write-mostly");
}
