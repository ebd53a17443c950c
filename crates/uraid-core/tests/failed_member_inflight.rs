//! A member failed while its I/O is in flight (`uraid fail`, `Engine::fail_member`, a
//! failure another I/O found) releases everything that waits on that I/O: its I/Os count as
//! `Gone` for the writes, reads, flushes, metadata rounds and the close behind them, as
//! md's stripe handling treats a Faulty device's blocks as failed; their completions, when
//! the device answers after all, are dropped.

mod common;

use common::*;
use uraid_core::array::Array;
use uraid_core::*;

const MEMBER_BYTES: u64 = 8 << 20;
/// md's role of a faulty device in `dev_roles`.
const ROLE_FAULTY: u16 = 0xfffe;

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed).fill(&mut v);
    v
}

/// How the member is failed.
#[derive(Clone, Copy, Debug)]
enum Fail {
    /// `uraid fail --force` (`Array::fail`).
    Command,
    /// The engine's `fail_member`, as the runtime calls it when a member's I/O timed out.
    Engine,
    /// One of the held I/Os answered `Gone` (the executor's answer past `--member-timeout`):
    /// the others stay held.
    OtherIo,
}

/// Drives `d` with every I/O to member `victim` held (never performed nor completed).
fn run_holding(d: &mut Driver<Array>, victim: usize) {
    run_in_order(d, |_| usize::MAX, &|_| false, &|io: &MemberIo| io.member == victim);
}

/// Drives `d` with the data I/O to member `victim` held, its metadata I/O too if `meta`.
fn run_holding_data(d: &mut Driver<Array>, victim: usize, meta: bool) {
    run_in_order(d, |_| usize::MAX, &|_| false, &|io: &MemberIo| {
        io.member == victim && (meta || !is_meta(io))
    });
}

/// `finish_close` with the victim's I/O still held.
fn close_holding(d: &mut Driver<Array>, victim: usize) -> Option<Result<(), RequestError>> {
    let hold = |io: &MemberIo| io.member == victim;
    for _ in 0..10_000 {
        if let Some(r) = d.engine.finish_close(Ok(()), d.now_ns) {
            return Some(r);
        }
        run_in_order(d, |_| usize::MAX, &|_| false, &hold);
    }
    None
}

fn expect_ok(d: &mut Driver<Array>, id: RequestId, ctx: &str) -> Vec<u8> {
    match d.take_done(id) {
        Some(c) => c.result.unwrap_or_else(|e| panic!("{ctx}: request {id} failed: {e:?}")),
        None => panic!("{ctx}: request {id} never completed; outstanding: {}", d.engine.outstanding()),
    }
}

/// `meta`: the victim holds its superblock and bitmap writes too (the round marking the
/// array dirty waits on it, so the writes wait in admission); else only its data I/O (the
/// writes wait in the engine, on their stripes or mirror copies).
fn member_held_forever_is_failed_and_nothing_waits_on_it(
    level: i32,
    n: usize,
    victim: usize,
    how: Fail,
    meta: bool,
) {
    let ctx = format!("raid{level} on {n}, member {victim} held (metadata too: {meta}), failed by {how:?}");
    let mut d = start_array(create_level(level, n, MEMBER_BYTES, true), &(0..n).collect::<Vec<_>>(), 11);
    let victim_dev = d.members.superblock(victim).dev_number as usize;

    // The whole first MiB written while every member answers.
    let base = data(1, 1 << 20);
    assert!(d.run_one(Request::write(1, 0, base.clone())).is_ok(), "{ctx}: first write");

    // From now on the victim answers nothing. Writes over every member, a read of each
    // chunk and a flush: some of them wait on its I/O.
    let w1 = data(2, 256 << 10);
    d.submit(Request::write(10, 0, w1.clone()));
    let w1b = data(3, 64 << 10);
    d.submit(Request::write(11, 512 << 10, w1b.clone()));
    for c in 0..4u64 {
        d.submit(Request::read(20 + c, (768 << 10) + c * (64 << 10), 64 << 10));
    }
    d.submit(Request::flush(30));
    run_holding_data(&mut d, victim, meta);
    let mut held: Vec<MemberIoId> =
        d.pending.iter().filter(|io| io.member == victim).map(|io| io.id).collect();
    assert!(!held.is_empty(), "{ctx}: no I/O of the victim is held");
    assert!(
        d.done.iter().all(|c| c.id != 10 && c.id != 30),
        "{ctx}: the write or the flush completed although they wait on the held member"
    );

    match how {
        Fail::Command => d.engine.fail(victim as u64, true, d.now_ns).expect("fail accepted"),
        Fail::Engine => ArrayEngine::fail_member(&mut d.engine, victim, d.now_ns),
        Fail::OtherIo => {
            let id = held.remove(0);
            let at = d.pending.iter().position(|io| io.id == id).expect("held");
            d.pending.remove(at);
            let gone = MemberIoCompletion { id, result: Err(MemberIoError::Gone) };
            d.engine.complete_member_io(gone, d.now_ns);
        }
    }
    let mark = d.engine.metadata_mark();
    run_holding(&mut d, victim);
    let issued: Vec<_> = d.pending.iter().filter(|io| !held.contains(&io.id)).map(|io| io.id).collect();
    assert!(issued.is_empty(), "{ctx}: I/O issued to the failed member: {issued:?}");

    // Everything answers, degraded, while the held I/Os are still held.
    assert!(held.iter().all(|id| d.pending.iter().any(|io| io.id == *id)), "{ctx}: held I/O was performed");
    assert_eq!(expect_ok(&mut d, 10, &ctx).len(), 0);
    expect_ok(&mut d, 11, &ctx);
    for c in 0..4u64 {
        let at = (768 << 10) + c as usize * (64 << 10);
        assert!(expect_ok(&mut d, 20 + c, &ctx) == base[at..at + (64 << 10)], "{ctx}: read {c} wrong");
    }
    expect_ok(&mut d, 30, &ctx);
    assert!(d.engine.metadata_done(mark), "{ctx}: the round recording the failure never finished");
    for m in (0..n).filter(|&m| m != victim) {
        let sb = d.members.superblock(m);
        assert_eq!(
            sb.dev_roles[victim_dev], ROLE_FAULTY,
            "{ctx}: member {m}'s superblock: victim not faulty"
        );
    }

    // New work never waits on the victim.
    let w2 = data(4, 128 << 10);
    d.submit(Request::write(40, 2 << 20, w2.clone()));
    d.submit(Request::read(41, 0, 256 << 10));
    d.submit(Request::flush(42));
    run_holding(&mut d, victim);
    expect_ok(&mut d, 40, &ctx);
    assert!(
        expect_ok(&mut d, 41, &ctx) == w1,
        "{ctx}: the write made while the victim hung reads back wrong"
    );
    expect_ok(&mut d, 42, &ctx);
    assert!(d.done.is_empty(), "{ctx}: completions no request waits for: {:?}", d.done.len());

    // The victim answers after all: every held I/O completes (reads with stale bytes). The
    // completions are dropped: nothing completes twice, nothing reads them.
    let late_data = d.pending.iter().any(|io| !is_meta(io));
    // As md keeps an rdev until its `nr_pending` drained, the slot takes no other device
    // while the victim's old I/O may still land.
    assert!(d.engine.engine().member_io_in_flight(victim) || !late_data, "{ctx}: slot not draining");
    let late: Vec<MemberIo> = std::mem::take(&mut d.pending);
    assert!(late.iter().all(|io| io.member == victim), "{ctx}: only the victim's I/O is left");
    for io in late {
        let result = match io.op {
            MemberIoOp::Read => Ok(vec![0xee; io.len_bytes as usize]),
            _ => Ok(Vec::new()),
        };
        d.now_ns += 1000;
        d.engine.complete_member_io(MemberIoCompletion { id: io.id, result }, d.now_ns);
    }
    d.run_until_idle();
    assert!(d.done.is_empty(), "{ctx}: a late completion answered a request again");
    assert!(!d.engine.engine().member_io_in_flight(victim), "{ctx}: the slot still drains");
    let mut want = base;
    want[..256 << 10].copy_from_slice(&w1);
    want[512 << 10..576 << 10].copy_from_slice(&w1b);
    assert!(
        d.run_one(Request::read(50, 0, 1 << 20)).unwrap() == want,
        "{ctx}: the first MiB reads back wrong"
    );
    assert!(d.run_one(Request::read(51, 2 << 20, 128 << 10)).unwrap() == w2, "{ctx}: second write");

    // The close answers, and the others say clean.
    assert_eq!(close_holding(&mut d, victim), Some(Ok(())), "{ctx}: the close");
    for m in (0..n).filter(|&m| m != victim) {
        assert_eq!(d.members.superblock(m).resync_offset, u64::MAX, "{ctx}: member {m} not clean");
    }
}

#[test]
fn a_raid1_member_failed_with_io_held_forever_holds_no_request_round_or_close() {
    for how in [Fail::Command, Fail::Engine, Fail::OtherIo] {
        for meta in [false, true] {
            member_held_forever_is_failed_and_nothing_waits_on_it(1, 2, 0, how, meta);
        }
        for meta in [false, true] {
            member_held_forever_is_failed_and_nothing_waits_on_it(1, 3, 1, how, meta);
        }
    }
}

#[test]
fn a_raid5_member_failed_with_io_held_forever_holds_no_request_round_or_close() {
    for how in [Fail::Command, Fail::Engine, Fail::OtherIo] {
        for meta in [false, true] {
            member_held_forever_is_failed_and_nothing_waits_on_it(5, 3, 1, how, meta);
        }
        for meta in [false, true] {
            member_held_forever_is_failed_and_nothing_waits_on_it(5, 4, 3, how, meta);
        }
    }
}

#[test]
fn a_raid6_member_failed_with_io_held_forever_holds_no_request_round_or_close() {
    for how in [Fail::Command, Fail::Engine, Fail::OtherIo] {
        for meta in [false, true] {
            member_held_forever_is_failed_and_nothing_waits_on_it(6, 4, 2, how, meta);
        }
        for meta in [false, true] {
            member_held_forever_is_failed_and_nothing_waits_on_it(6, 5, 0, how, meta);
        }
    }
}

#[test]
fn a_raid10_member_failed_with_io_held_forever_holds_no_request_round_or_close() {
    for how in [Fail::Command, Fail::Engine, Fail::OtherIo] {
        for meta in [false, true] {
            member_held_forever_is_failed_and_nothing_waits_on_it(10, 4, 1, how, meta);
        }
    }
}

/// `mdadm --replace` under way: every slot write has a twin on the replacement. The
/// replacement stops answering and is given up (`fail_replacement`): the slot writes whose
/// twins are held complete, and the twins' late completions are dropped.
#[test]
fn a_replacement_given_up_with_its_twin_writes_held_forever_holds_no_slot_write() {
    const SECTORS: u64 = 8192;
    const OFFSET: u64 = 4096;
    const SLOT: usize = 1;
    for (level, n, layout) in
        [(Level::Raid1, 2, 0), (Level::Raid5, 3, 2), (Level::Raid6, 4, 2), (Level::Raid10, 4, 0x102)]
    {
        let ctx = format!("{level:?} on {n}");
        let g = Geometry::new(level, n, layout, 128, &vec![SECTORS; n]).unwrap();
        let members = MemMembers::new(n + 1, OFFSET + SECTORS * 512);
        let mut d = Driver::new(Engine::new(config(g.clone(), OFFSET)).unwrap(), members, 5);
        let base = data(7, 1 << 20);
        d.run_one(Request::write(1, 0, base.clone())).expect("initial write");
        d.engine.start_replacement(SLOT, n, OFFSET, 0, d.now_ns).expect("replacement starts");
        let held_member = |io: &MemberIo| io.member == n;
        let w = data(8, 512 << 10);
        d.submit(Request::write(10, 0, w.clone()));
        d.submit(Request::flush(11));
        run_in_order(&mut d, |_| usize::MAX, &|_| false, &held_member);
        assert!(d.pending.iter().any(|io| io.op == MemberIoOp::Write), "{ctx}: no twin write held");
        assert!(d.take_done(10).is_none(), "{ctx}: the write completed before its twin");

        d.engine.fail_replacement(SLOT, d.now_ns);
        run_in_order(&mut d, |_| usize::MAX, &|_| false, &held_member);
        for id in [10, 11] {
            let r = d.take_done(id).unwrap_or_else(|| panic!("{ctx}: request {id} never completed"));
            assert!(r.result.is_ok(), "{ctx}: request {id}: {:?}", r.result);
        }
        assert!(d.engine.replacements().is_empty(), "{ctx}: the replacement stays");
        assert!(d.engine.member_states().iter().all(|s| *s == MemberState::InSync), "{ctx}: degraded");

        for io in std::mem::take(&mut d.pending) {
            let result = match io.op {
                MemberIoOp::Read => Ok(vec![0xee; io.len_bytes as usize]),
                _ => Ok(Vec::new()),
            };
            d.engine.complete_member_io(MemberIoCompletion { id: io.id, result }, d.now_ns);
        }
        d.run_until_idle();
        assert!(d.done.is_empty(), "{ctx}: a late completion answered a request again");
        let mut want = base;
        want[..512 << 10].copy_from_slice(&w);
        assert!(d.run_one(Request::read(20, 0, 1 << 20)).unwrap() == want, "{ctx}: reads back wrong");
    }
}
