//! A background sync's memory is bounded independently of the member count (issue 26): the
//! bytes of member I/O a resync or a recovery of a wide raid6 has in flight stay within
//! the sync's budget (`stripe_cache_size` pages of 64 KiB, 16 MiB at the default 256),
//! where they used to be four units of 512 KiB of every member (256 MiB at 128 members).

mod common;

use common::*;
use uraid_core::*;

/// 512 KiB chunks (mdadm's default), as the server's arrays have.
const CHUNK_SECTORS: u64 = 1024;
const DATA_OFFSET: u64 = 4096;
/// The default stripe_cache_size (256) times 64 KiB.
const BUDGET: u64 = 16 << 20;

fn driver(n: usize, member_sectors: u64) -> Driver {
    let g = Geometry::new(Level::Raid6, n, 2, CHUNK_SECTORS, &vec![member_sectors; n]).unwrap();
    let mut d = Driver::new(
        Engine::new(config(g, DATA_OFFSET)).unwrap(),
        MemMembers::new(n, DATA_OFFSET + member_sectors * 512),
        7,
    );
    // Unpaced: the window alone bounds what is in flight.
    d.engine.set_tunable("sync_speed_max", "1000000000").unwrap();
    d
}

/// Run the sync to its end; the most bytes of member reads and writes in flight at once.
fn peak_in_flight(d: &mut Driver, ctx: &str) -> u64 {
    let mut peak = 0;
    let mut guard = 0;
    while d.engine.sync_active() {
        d.engine.tick(d.now_ns);
        d.step();
        let bytes: u64 = d.pending.iter().map(|io| io.len_bytes).sum();
        peak = peak.max(bytes);
        guard += 1;
        assert!(guard < 1_000_000, "{ctx}: the sync never finished");
    }
    d.run_until_idle();
    peak
}

#[test]
fn a_resync_of_128_members_keeps_its_buffers_within_the_budget() {
    let n = 128;
    let mut d = driver(n, 2 * CHUNK_SECTORS);
    d.engine.start_resync(None, 0);
    let peak = peak_in_flight(&mut d, "resync");
    let mut events = Vec::new();
    while let Some(e) = d.engine.pop_event() {
        events.push(e);
    }
    assert!(events.contains(&EngineEvent::ResyncDone), "{events:?}");
    assert!(peak > 0, "the resync read nothing");
    assert!(
        peak <= BUDGET,
        "a resync of {n} members had {} KiB in flight (budget {} KiB)",
        peak >> 10,
        BUDGET >> 10
    );
}

#[test]
fn a_recovery_of_64_members_keeps_its_buffers_within_the_budget() {
    let n = 64;
    let mut d = driver(n, 2 * CHUNK_SECTORS);
    let victim = 3;
    d.engine.fail_member(victim, d.now_ns);
    d.run_until_idle();
    d.engine.add_member(victim, DATA_OFFSET, d.now_ns).expect("add");
    let peak = peak_in_flight(&mut d, "recovery");
    assert_eq!(d.engine.member_states()[victim], MemberState::InSync);
    assert!(peak > 0, "the recovery read nothing");
    assert!(
        peak <= BUDGET,
        "a recovery of {n} members had {} KiB in flight (budget {} KiB)",
        peak >> 10,
        BUDGET >> 10
    );
}

/// On a narrow array the window is what it was (4 units of 512 KiB of 8 members): more
/// than one unit is in flight at once.
#[test]
fn a_resync_of_8_members_keeps_its_window() {
    let n = 8;
    let mut d = driver(n, 16 * CHUNK_SECTORS);
    d.engine.start_resync(None, 0);
    let peak = peak_in_flight(&mut d, "resync");
    let unit = CHUNK_SECTORS * 512 * n as u64;
    assert!(peak > unit, "a resync of 8 members had only {} KiB in flight", peak >> 10);
    assert!(peak <= BUDGET, "a resync of 8 members had {} KiB in flight", peak >> 10);
}

/// The stripe maps are cached in at most 1024 slots (every layout's map repeats every
/// `n * (n - 1)` stripes, too many to keep on wide arrays): on 34 members (1122 residues)
/// stripes sharing a slot still find their own map, healthy and with two members lost.
#[test]
fn stripes_sharing_a_map_slot_find_their_own_map() {
    let n = 34;
    let chunk = 8;
    let member_sectors = 1200 * chunk;
    let g = Geometry::new(Level::Raid6, n, 2, chunk, &vec![member_sectors; n]).unwrap();
    let size = g.array_bytes() as usize;
    let mut d = Driver::new(
        Engine::new(config(g, DATA_OFFSET)).unwrap(),
        MemMembers::new(n, DATA_OFFSET + member_sectors * 512),
        11,
    );
    let mut model = vec![0u8; size];
    Rng(12).fill(&mut model);
    for (i, piece) in model.chunks(1 << 20).enumerate() {
        d.run_one(Request::write(i as u64 + 1, (i << 20) as u64, piece.to_vec())).expect("write");
    }
    let mut id = 1000;
    let mut check = |d: &mut Driver, ctx: &str| {
        for (i, piece) in model.chunks(1 << 20).enumerate() {
            id += 1;
            let got = d.run_one(Request::read(id, (i << 20) as u64, piece.len() as u64)).expect("read");
            assert!(got == piece, "{ctx}: MiB {i} reads back wrong");
        }
    };
    check(&mut d, "healthy");
    for m in [5, 20] {
        d.members.gone[m] = true;
        d.engine.fail_member(m, d.now_ns);
    }
    d.run_until_idle();
    check(&mut d, "two members lost");
}
