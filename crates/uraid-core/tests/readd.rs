//! md's re-add with a write-intent bitmap: a member that left and comes back is rebuilt
//! only over the regions written while it was away, and is then a full copy again.

mod common;

use common::*;
use uraid_core::meta::array_range_to_sync_range;
use uraid_core::*;

const MEMBER_SECTORS: u64 = 4096;
const DATA_OFFSET: u64 = 4096;

#[test]
fn a_returning_member_is_rebuilt_only_where_it_missed_writes() {
    for (level, n, layout) in [(Level::Raid5, 3, 2), (Level::Raid6, 4, 2), (Level::Raid1, 2, 0)] {
        let ctx = format!("{level:?}");
        let g = Geometry::new(level, n, layout, 128, &vec![MEMBER_SECTORS; n]).unwrap();
        let mut d = Driver::new(
            Engine::new(config(g.clone(), DATA_OFFSET)).unwrap(),
            MemMembers::new(n, DATA_OFFSET + MEMBER_SECTORS * 512),
            3,
        );
        let bytes = g.array_bytes() as usize;
        let mut model = vec![0u8; bytes];
        Rng(3).fill(&mut model);
        d.run_one(Request::write(1, 0, model.clone())).expect("write");
        // Member 1 leaves; 64 KiB are written while it is away.
        d.engine.fail_member(1, d.now_ns);
        let at = 256 * 1024u64;
        let mut fresh = vec![0u8; 64 << 10];
        Rng(4).fill(&mut fresh);
        d.run_one(Request::write(2, at, fresh.clone())).expect("degraded write");
        model[at as usize..at as usize + fresh.len()].copy_from_slice(&fresh);
        // It comes back with its old contents; the bitmap names the region written.
        let (s, l) =
            array_range_to_sync_range(level.md_level(), n as u32, 128, at / 512, fresh.len() as u64 / 512);
        let writes_before = d.members.writes;
        d.engine.readd_member(1, DATA_OFFSET, Some(vec![(s, s + l)]), d.now_ns).unwrap();
        let mut guard = 0;
        while d.engine.sync_active() {
            d.engine.tick(d.now_ns);
            d.step();
            guard += 1;
            assert!(guard < 1_000_000, "{ctx}: the re-add never finished");
        }
        d.run_until_idle();
        assert_eq!(d.engine.member_states()[1], MemberState::InSync, "{ctx}");
        let rebuilt = d.members.writes - writes_before;
        assert!(rebuilt <= 4, "{ctx}: {rebuilt} member writes to catch up 64 KiB: rebuilt in full?");
        // It now stands for the others: lose member 0 and read everything through it.
        d.engine.fail_member(0, d.now_ns);
        let back = d.run_one(Request::read(3, 0, bytes as u64)).expect("read");
        assert!(back == model, "{ctx}: the re-added member is not a full copy");
    }
}
