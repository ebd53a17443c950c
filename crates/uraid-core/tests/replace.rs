//! md's want_replacement (`mdadm --replace`): a new device is rebuilt for a slot while the
//! slot's member stays active, under writes, and then takes the slot; the array is never
//! degraded. A read error on the member during the copy is repaired from the others.

mod common;

use common::*;
use uraid_core::*;

const MEMBER_SECTORS: u64 = 8192;
const DATA_OFFSET: u64 = 4096;
/// The replacement's data starts elsewhere on its device than the members' (as on a
/// device of another size): the copy must honour it.
const NEW_DATA_OFFSET: u64 = 8192;
const SLOT: usize = 1;

fn levels() -> Vec<(Level, usize, u32)> {
    vec![(Level::Raid1, 2, 0), (Level::Raid5, 3, 2), (Level::Raid6, 4, 2), (Level::Raid10, 4, 0x102)]
}

struct Run {
    d: Driver,
    model: Vec<u8>,
    next_id: u64,
    rng: Rng,
}

impl Run {
    fn new(level: Level, n: usize, layout: u32, seed: u64) -> Run {
        let g = Geometry::new(level, n, layout, 128, &vec![MEMBER_SECTORS; n]).unwrap();
        // Member n is the new device.
        let mut members = MemMembers::new(n + 1, DATA_OFFSET + MEMBER_SECTORS * 512);
        members.images[n] = vec![0xee; (NEW_DATA_OFFSET + MEMBER_SECTORS * 512) as usize];
        // A small stripe cache, so the copy reads the member rather than finding the
        // initial write's heads still cached.
        let mut cfg = config(g.clone(), DATA_OFFSET);
        cfg.tunables.stripe_cache_size = 17;
        let mut d = Driver::new(Engine::new(cfg).unwrap(), members, seed);
        let mut model = vec![0u8; g.array_bytes() as usize];
        Rng(seed).fill(&mut model);
        d.run_one(Request::write(1, 0, model.clone())).expect("initial write");
        Run { d, model, next_id: 100, rng: Rng(seed + 1) }
    }

    /// A random 4-64 KiB write, recorded in the model.
    fn submit_write(&mut self) -> u64 {
        let len = (1 + self.rng.below(16)) * 4096;
        let at = self.rng.below((self.model.len() as u64 - len) / 4096) * 4096;
        let mut data = vec![0u8; len as usize];
        self.rng.fill(&mut data);
        self.model[at as usize..(at + len) as usize].copy_from_slice(&data);
        self.next_id += 1;
        self.d.submit(Request::write(self.next_id, at, data));
        self.next_id
    }

    /// Runs the replacement to its end with writes going on; asserts every slot stays in
    /// sync at every step and every write succeeds.
    fn replace_under_writes(&mut self, ctx: &str) -> Vec<EngineEvent> {
        let mut writes = Vec::new();
        let mut events = Vec::new();
        let mut guard = 0;
        while self.d.engine.sync_active() || !self.d.engine.is_idle() {
            if guard % 7 == 0 && writes.len() < 60 {
                writes.push(self.submit_write());
            }
            self.d.engine.unplug(self.d.now_ns);
            self.d.step();
            while let Some(ev) = self.d.engine.pop_event() {
                events.push(ev);
            }
            let states = self.d.engine.member_states();
            assert!(
                states.iter().all(|s| *s == MemberState::InSync),
                "{ctx}: degraded during the copy: {states:?}"
            );
            assert!(!self.d.engine.is_degraded(), "{ctx}");
            guard += 1;
            assert!(guard < 2_000_000, "{ctx}: the replacement never finished");
        }
        self.d.run_until_idle();
        while let Some(ev) = self.d.engine.pop_event() {
            events.push(ev);
        }
        for id in writes {
            let c = self.d.take_done(id).unwrap_or_else(|| panic!("{ctx}: write {id} never completed"));
            assert!(c.result.is_ok(), "{ctx}: write {id} failed: {:?}", c.result);
        }
        events
    }

    /// What the caller does once the copy is done (after a flush and the superblocks).
    fn promote(&mut self, n: usize, ctx: &str) {
        // Copied: the member still takes every write until the caller says so.
        let r = self.d.engine.replacements();
        assert!(r.len() == 1 && r[0].copied, "{ctx}: {r:?}");
        let old = self.d.engine.promote_replacement(SLOT, n, self.d.now_ns).expect("promote");
        assert_eq!(old, SLOT, "{ctx}");
        assert!(self.d.engine.replacements().is_empty(), "{ctx}");
    }

    /// Reads the whole array with the old member gone and one more slot failed, so
    /// the data must come through the device that took `SLOT`.
    fn check_through_replacement(&mut self, n: usize, ctx: &str) {
        self.d.members.gone[SLOT] = true;
        self.d.engine.fail_member(0, self.d.now_ns);
        self.d.engine.metadata_committed();
        let len = self.model.len() as u64;
        let back = self.d.run_one(Request::read(7, 0, len)).expect("read");
        assert!(back == self.model, "{ctx}: the replacement does not hold the slot's data");
        // And a write after the swap reaches it, never the old device.
        let writes_to_old = self.d.members.writes;
        self.next_id += 1;
        let id = self.next_id;
        let data = vec![0x5a; 8192];
        self.model[..8192].copy_from_slice(&data);
        self.d.run_one(Request::write(id, 0, data)).expect("write after the swap");
        let back = self.d.run_one(Request::read(8, 0, len)).expect("read");
        assert!(back == self.model, "{ctx}: a write after the swap is lost");
        assert!(self.d.members.writes > writes_to_old, "{ctx}");
        let _ = n;
    }
}

#[test]
fn a_member_is_replaced_under_writes_and_the_array_is_never_degraded() {
    for (level, n, layout) in levels() {
        let ctx = format!("{level:?}");
        let mut run = Run::new(level, n, layout, 11);
        run.d.engine.start_replacement(SLOT, n, NEW_DATA_OFFSET, 0, run.d.now_ns).expect("replace");
        assert_eq!(run.d.engine.replacements().len(), 1, "{ctx}");
        let events = run.replace_under_writes(&ctx);
        assert!(events.contains(&EngineEvent::ReplacementCopied(SLOT)), "{ctx}: {events:?}");
        assert!(!events.iter().any(|e| matches!(e, EngineEvent::MemberFaulty(_))), "{ctx}: {events:?}");
        run.promote(n, &ctx);
        // The copy went to the new device's data area, not over its head.
        let head = &run.d.members.images[n][..NEW_DATA_OFFSET as usize];
        assert!(head.iter().all(|&b| b == 0xee), "{ctx}: written below the replacement's data offset");
        run.check_through_replacement(n, &ctx);
    }
}

#[test]
fn a_read_error_on_the_member_during_the_copy_is_repaired_from_the_others() {
    for (level, n, layout) in levels() {
        let ctx = format!("{level:?}");
        let mut run = Run::new(level, n, layout, 21);
        // Latent errors on the member being replaced, in two places.
        let base = DATA_OFFSET;
        run.d.members.latent.push((SLOT, base + 64 * 1024, base + 72 * 1024));
        run.d.members.latent.push((SLOT, base + 1024 * 1024, base + 1024 * 1024 + 512));
        run.d.engine.start_replacement(SLOT, n, NEW_DATA_OFFSET, 0, run.d.now_ns).expect("replace");
        let events = run.replace_under_writes(&ctx);
        assert!(
            events.contains(&EngineEvent::ReplacementCopied(SLOT)),
            "{ctx}: the copy stopped at the read error: {events:?}"
        );
        assert!(run.d.engine.stats().read_errors_corrected > 0, "{ctx}: nothing was repaired");
        run.promote(n, &ctx);
        // md rewrites what it rebuilt over the sectors that failed: they read again.
        assert!(
            !run.d.members.latent.iter().any(|&(m, _, _)| m == SLOT),
            "{ctx}: the member's bad sectors were not rewritten: {:?}",
            run.d.members.latent
        );
        run.check_through_replacement(n, &ctx);
    }
}

#[test]
fn a_failing_replacement_is_dropped_and_the_member_stays() {
    for (level, n, layout) in levels() {
        let ctx = format!("{level:?}");
        let mut run = Run::new(level, n, layout, 31);
        for name in ["sync_speed_min", "sync_speed_max"] {
            run.d.engine.set_tunable(name, "1000").unwrap();
        }
        run.d.engine.start_replacement(SLOT, n, NEW_DATA_OFFSET, 0, run.d.now_ns).expect("replace");
        run.d.members.gone[n] = true;
        let w = run.submit_write();
        run.d.run_until_idle();
        let mut events = Vec::new();
        while let Some(ev) = run.d.engine.pop_event() {
            events.push(ev);
        }
        assert!(events.contains(&EngineEvent::ReplacementFaulty(SLOT)), "{ctx}: {events:?}");
        assert!(!events.iter().any(|e| matches!(e, EngineEvent::MemberFaulty(_))), "{ctx}: {events:?}");
        assert!(
            run.d.take_done(w).expect("write").result.is_ok(),
            "{ctx}: the client saw the replacement's failure"
        );
        assert!(run.d.engine.member_states().iter().all(|s| *s == MemberState::InSync), "{ctx}");
        assert!(run.d.engine.replacements().is_empty(), "{ctx}");
        let len = run.model.len() as u64;
        assert!(run.d.run_one(Request::read(9, 0, len)).expect("read") == run.model, "{ctx}");
    }
}

#[test]
fn replacement_is_refused_where_md_refuses_and_nothing_is_issued() {
    // raid0: no redundancy to copy under.
    let g = Geometry::new(Level::Raid0, 2, 0, 128, &[MEMBER_SECTORS; 2]).unwrap();
    let mut e = Engine::new(config(g, DATA_OFFSET)).unwrap();
    let err = e.start_replacement(0, 2, DATA_OFFSET, 0, 0).unwrap_err();
    assert!(err.contains("raid0"), "{err}");
    assert!(e.pop_member_io().is_none());

    // A degraded array: the missing member comes first; a member not in sync is refused.
    let g = Geometry::new(Level::Raid5, 3, 2, 128, &[MEMBER_SECTORS; 3]).unwrap();
    let mut e = Engine::new(config(g, DATA_OFFSET)).unwrap();
    e.fail_member(2, 0);
    let err = e.start_replacement(0, 3, DATA_OFFSET, 0, 0).unwrap_err();
    assert!(err.contains("degraded"), "{err}");
    let err = e.start_replacement(2, 3, DATA_OFFSET, 0, 0).unwrap_err();
    assert!(err.contains("not active and in sync"), "{err}");
    assert!(e.replacements().is_empty());
    assert!(e.pop_member_io().is_none(), "a refused replacement issued I/O");

    // A second replacement of the same slot, and a slot's own index as the new device.
    let g = Geometry::new(Level::Raid1, 2, 0, 128, &[MEMBER_SECTORS; 2]).unwrap();
    let mut e = Engine::new(config(g, DATA_OFFSET)).unwrap();
    let err = e.start_replacement(0, 1, DATA_OFFSET, 0, 0).unwrap_err();
    assert!(err.contains("slot's"), "{err}");
    e.start_replacement(0, 2, DATA_OFFSET, 0, 0).unwrap();
    let err = e.start_replacement(0, 3, DATA_OFFSET, 0, 0).unwrap_err();
    assert!(err.contains("already"), "{err}");
    // Not before the copy is done.
    let err = e.promote_replacement(0, 2, 0).unwrap_err();
    assert!(err.contains("not copied"), "{err}");
}

#[test]
fn a_resumed_replacement_copies_only_from_its_offset() {
    let (level, n, layout) = (Level::Raid5, 3, 2);
    let mut run = Run::new(level, n, layout, 41);
    // The first half was copied before a restart: it is on the new device already.
    let half = MEMBER_SECTORS / 2;
    let (a, b) = (DATA_OFFSET as usize, (DATA_OFFSET + half * 512) as usize);
    let (na, nb) = (NEW_DATA_OFFSET as usize, (NEW_DATA_OFFSET + half * 512) as usize);
    let copied = run.d.members.images[SLOT][a..b].to_vec();
    run.d.members.images[n][na..nb].copy_from_slice(&copied);
    let writes_before = run.d.members.writes;
    run.d.engine.start_replacement(SLOT, n, NEW_DATA_OFFSET, half, run.d.now_ns).unwrap();
    let st = run.d.engine.sync_status().expect("running");
    assert_eq!(st.kind, SyncKind::Replace { slot: SLOT });
    assert_eq!(st.total_sectors, MEMBER_SECTORS - half);
    assert!(st.recovery_offset_sectors >= half);
    let mut guard = 0;
    while run.d.engine.sync_active() {
        run.d.step();
        guard += 1;
        assert!(guard < 1_000_000, "the resumed replacement never finished");
    }
    run.d.run_until_idle();
    // 64 KiB heads: the second half of a member is 32 heads, one write each.
    let copy_writes = run.d.members.writes - writes_before;
    assert_eq!(copy_writes, 32, "copied from somewhere else than its offset");
    run.promote(n, "resumed");
    run.check_through_replacement(n, "resumed");
}
