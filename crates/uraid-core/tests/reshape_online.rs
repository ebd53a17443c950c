//! A grow by members while the array serves: reads and writes go on throughout (each
//! checked against a model of what was acknowledged), the reshape ends with the new size,
//! md's `check` finds every stripe consistent, and a fresh assembly reads the same bytes.
//! A power cut at any point of the reshape (member I/O in flight dropped) followed by a
//! restart resumes it from the checkpoint and loses no acknowledged write.

mod common;

use common::*;
use uraid_core::api::*;
use uraid_core::array::{grow_plan, Array, GrowRequest, NewMember};
use uraid_core::meta::superblock::feature;
use uraid_core::{MemberState, ScrubKind};

const MEMBER_BYTES: u64 = 8 << 20;

/// A raid of `level` on `n` members with random data written through it (the model).
fn array_with_data(level: i32, n: usize, seed: u64) -> (Driver<Array>, Vec<u8>) {
    array_on(create_level(level, n, MEMBER_BYTES, false), n, seed)
}

/// [`array_with_spare`] on members with room after the data and none before: md's 1.0
/// superblock at the end (data at 0), the component size 1 MiB short of the member. A
/// restripe there moves the data offset up and runs backwards (mdadm's choice).
fn array_with_room_after(level: i32, n: usize, seed: u64) -> (Driver<Array>, Vec<u8>) {
    let mut p = uraid_core::meta::CreateParams::new(level, vec![Some(MEMBER_BYTES / 512); n]);
    p.version = uraid_core::meta::SuperblockVersion::V1_0;
    p.size_kib = Some((MEMBER_BYTES >> 10) - 1024);
    p.assume_clean = true;
    p.set_uuid = [7; 16];
    p.device_uuids = (0..n).map(|i| [i as u8 + 1; 16]).collect();
    p.ctime_seconds = EPOCH_S;
    p.name = "t".into();
    p.chunk_kib = Some(64);
    let (mut d, model) = array_on(create_in_ram(&p, MEMBER_BYTES), n, seed);
    let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xA0);
    d.engine.add_member(new, d.now_ns).unwrap();
    d.run_until_idle();
    (d, model)
}

/// The array on the `n` members of `mm`, random data written through it (the model).
fn array_on(mm: MemMembers, n: usize, seed: u64) -> (Driver<Array>, Vec<u8>) {
    let keys: Vec<usize> = (0..n).collect();
    let mut d = start_array(mm, &keys, seed);
    let size = d.engine.engine().size_bytes() as usize;
    let mut model = vec![0u8; size];
    Rng(seed ^ 0x5eed).fill(&mut model);
    for (i, chunk) in model.chunks(1 << 20).enumerate() {
        let r = d.run_one(Request::write(1000 + i as u64, (i << 20) as u64, chunk.to_vec()));
        assert!(r.is_ok(), "{r:?}");
    }
    (d, model)
}

/// A raid of `level` on `n` members with data written through it, and one spare added.
fn array_with_spare(level: i32, n: usize, seed: u64) -> (Driver<Array>, Vec<u8>) {
    let (mut d, model) = array_with_data(level, n, seed);
    let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xA0);
    d.engine.add_member(new, d.now_ns).unwrap();
    d.run_until_idle();
    (d, model)
}

/// `sync_speed_min` raised to `sync_speed_max`: the reshape at its ceiling whatever the
/// clients do. These tests are about the data; a paced reshape is
/// `a_reshape_is_paced_as_md_paces_a_resync`'s. (At the floor, 1 MB/s, a reshape of these
/// members takes tens of seconds of the driver's clock, 10 us a step.)
fn at_the_ceiling(d: &mut Driver<Array>) {
    let max = d.engine.engine().tunables().sync_speed_max_kib;
    d.engine.set_tunable("sync_speed_min", &max.to_string()).unwrap();
}

/// The reshape `req` asks for, started while the array serves (at its ceiling).
fn start_reshape(d: &mut Driver<Array>, req: GrowRequest) {
    at_the_ceiling(d);
    let cur = d.engine.grow_current(MEMBER_BYTES / 512);
    let plan = grow_plan(&cur, &req).unwrap();
    d.engine.may_grow(&plan).unwrap();
    d.engine.grow(&plan, d.now_ns).unwrap();
    assert!(d.engine.is_reshaping());
}

fn grow_to(d: &mut Driver<Array>, raid_disks: usize) {
    start_reshape(d, GrowRequest { raid_disks: Some(raid_disks), ..Default::default() });
}

/// Client requests (`Clients`, seeded by `seed`) until the reshape is done and every one of
/// Runs `d` with no clients until its reshape ends (`what` names it if it never does).
fn run_until_reshaped(d: &mut Driver<Array>, what: &str) {
    let mut guard = 0;
    while d.engine.is_reshaping() {
        d.run_until_idle();
        guard += 1;
        assert!(guard < 1000, "{what}: the reshape never ended");
    }
    d.run_until_idle();
}

/// them has ended, `model` kept as they are acknowledged.
fn serve_until_reshaped(d: &mut Driver<Array>, model: &mut [u8], seed: u64) {
    let size = model.len() as u64;
    let mut clients = Clients::new(seed);
    let mut steps = 0u64;
    while d.engine.is_reshaping() {
        clients.issue(d, size);
        d.engine.unplug(d.now_ns);
        assert!(d.step() || d.engine.is_reshaping(), "the driver stalled");
        let _ = clients.collect(d, model);
        steps += 1;
        assert!(steps < 20_000_000, "the reshape never ended");
    }
    while !clients.out.is_empty() {
        d.run_until_idle();
        let _ = clients.collect(d, model);
    }
}

fn change_chunk(d: &mut Driver<Array>, chunk_sectors: u64) {
    start_reshape(d, GrowRequest { chunk_sectors: Some(chunk_sectors), ..Default::default() });
}

fn to_raid6(d: &mut Driver<Array>) {
    start_reshape(d, GrowRequest { level: Some(uraid_core::geometry::Level::Raid6), ..Default::default() });
}

fn change_layout(d: &mut Driver<Array>, layout: &str) {
    start_reshape(d, GrowRequest { layout: Some(layout.into()), ..Default::default() });
}

/// Client requests (`Clients`, seeded by `seed`) until the array is `level` and for at
/// least 2000 steps, then until every one of them has ended, `model` kept as they are
/// acknowledged (a takeover while serving).
fn serve_until_level(
    d: &mut Driver<Array>,
    model: &mut [u8],
    seed: u64,
    level: uraid_core::geometry::Level,
    what: &str,
) {
    let size = model.len() as u64;
    let mut clients = Clients::new(seed);
    let mut steps = 0;
    while d.engine.engine().geometry().level != level || steps < 2000 {
        clients.issue(d, size);
        d.engine.unplug(d.now_ns);
        d.step();
        let _ = clients.collect(d, model);
        steps += 1;
        assert!(steps < 1_000_000, "{what}: the takeover never happened");
    }
    while !clients.out.is_empty() {
        d.run_until_idle();
        let _ = clients.collect(d, model);
    }
}

/// Client requests while the reshape runs: up to eight at once on spans that do not
/// overlap, writes of new random bytes and reads checked against the model at their end.
/// `out`: (id, offset, length, a write's bytes) of those in flight.
struct Clients {
    rng: Rng,
    next_id: u64,
    out: Vec<(u64, u64, u64, Option<Vec<u8>>)>,
}

impl Clients {
    fn new(seed: u64) -> Clients {
        Clients { rng: Rng(seed), next_id: 1, out: Vec::new() }
    }

    /// Half of them near the reshape's checkpoint, where the layouts meet.
    fn issue(&mut self, d: &mut Driver<Array>, size: u64) {
        let hot = d.engine.reshape_progress().map(|(p, _)| (p * 512).min(size));
        while self.out.len() < 8 {
            let len = (1 + self.rng.below(32)) * 4096;
            let at = match hot {
                Some(h) if self.rng.below(2) == 0 => {
                    let lo = h.saturating_sub(2 << 20).min(size - len);
                    let hi = (h + (4 << 20)).min(size - len);
                    (lo + self.rng.below(hi - lo + 1)) / 4096 * 4096
                }
                _ => self.rng.below((size - len) / 4096) * 4096,
            };
            if self.out.iter().any(|&(_, a, l, _)| overlaps((a, a + l), (at, at + len))) {
                return;
            }
            let id = self.next_id;
            self.next_id += 1;
            let req = if self.rng.below(2) == 0 {
                let mut data = vec![0u8; len as usize];
                self.rng.fill(&mut data);
                self.out.push((id, at, len, Some(data.clone())));
                Request::write(id, at, data)
            } else {
                self.out.push((id, at, len, None));
                Request::read(id, at, len)
            };
            if let Err(SubmitError::Busy(_)) = d.engine.submit(req, d.now_ns) {
                self.out.pop();
                return;
            }
        }
    }

    /// Takes the requests that ended; returns the spans of the writes among them.
    fn collect(&mut self, d: &mut Driver<Array>, model: &mut [u8]) -> Vec<(u64, u64)> {
        let mut written = Vec::new();
        let mut i = 0;
        while i < self.out.len() {
            let (id, at, len, ref data) = self.out[i];
            let Some(c) = d.take_done(id) else {
                i += 1;
                continue;
            };
            let got = c.result.unwrap_or_else(|e| panic!("request {id} at {at}+{len} failed: {e:?}"));
            let span = at as usize..(at + len) as usize;
            match data {
                Some(data) => {
                    model[span].copy_from_slice(data);
                    written.push((at, at + len));
                }
                None => assert!(got == model[span], "read {id} at {at}+{len} returned other bytes"),
            }
            self.out.swap_remove(i);
        }
        written
    }
}

/// The driver's step with the array's metadata I/O slow: it completes only every 16th
/// step, so a superblock round takes long against the data I/O around it (a client write
/// that lands while a checkpoint is still being written is then often cut).
fn step_slow_metadata(d: &mut Driver<Array>, tick: u64) {
    struct SlowMeta<'a> {
        members: &'a mut MemMembers,
        rng: &'a mut Rng,
        pending: &'a mut Vec<MemberIo>,
        meta_due: bool,
    }
    impl uraid_core::drive::MemberExecutor for SlowMeta<'_> {
        fn issue(&mut self, io: MemberIo) {
            self.pending.push(io);
        }
        fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
            let ready: Vec<usize> =
                (0..self.pending.len()).filter(|&i| self.meta_due || !is_meta(&self.pending[i])).collect();
            if ready.is_empty() {
                return;
            }
            let i = ready[self.rng.below(ready.len() as u64) as usize];
            out.push(self.members.perform(self.pending.swap_remove(i)));
        }
    }
    d.now_ns += 10_000;
    let now = d.now_ns;
    let mut ex = SlowMeta {
        members: &mut d.members,
        rng: &mut d.rng,
        pending: &mut d.pending,
        meta_due: tick.is_multiple_of(16),
    };
    let done = &mut d.done;
    let pumped =
        uraid_core::drive::pump(&mut d.engine, &mut ex, &mut || now, &mut Vec::new(), |c| done.push(c));
    if !pumped.any() {
        if let Some(at) = d.engine.next_deadline_ns() {
            d.now_ns = d.now_ns.max(at);
            d.engine.tick(d.now_ns);
        }
    }
}

fn read_all(d: &mut Driver<Array>, len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, at) in (0..len).step_by(1 << 20).enumerate() {
        out.extend(d.run_one(Request::read(9000 + i as u64, at, (len - at).min(1 << 20))).unwrap());
    }
    out
}

fn check_finished(d: &mut Driver<Array>, model: &[u8], raid_disks: usize) {
    assert_eq!(d.engine.engine().geometry().raid_disks, raid_disks);
    assert!(d.engine.engine().size_bytes() > model.len() as u64, "the new size is served");
    assert!(read_all(d, model.len() as u64) == model, "data after the reshape");
    d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
    d.run_until_idle();
    assert_eq!(d.engine.engine().mismatch_cnt(), 0, "md's check after the reshape");
}

/// A power cut: member I/O not yet performed never happens; the members assembled again,
/// a resumed reshape run to its end, and every sector checked: what was acknowledged, or
/// what a write still in flight at the cut put there. The restarted driver and what it
/// reads.
fn restart_after_cut(
    mut d: Driver<Array>,
    clients: &Clients,
    keys: &[usize],
    seed: u64,
    model: &[u8],
    what: &str,
) -> (Driver<Array>, Vec<u8>) {
    d.pending.clear();
    let in_flight: Vec<(u64, Vec<u8>)> =
        clients.out.iter().filter_map(|(_, at, _, data)| data.clone().map(|b| (*at, b))).collect();
    let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    let mut d = start_array(members, keys, seed);
    run_until_reshaped(&mut d, what);
    let size = model.len() as u64;
    let got = read_all(&mut d, size);
    for s in 0..size / 512 {
        let r = (s * 512) as usize..(s * 512 + 512) as usize;
        if got[r.clone()] == model[r.clone()] {
            continue;
        }
        let written = in_flight.iter().any(|(at, b)| {
            let at = *at as usize;
            r.start >= at && r.end <= at + b.len() && got[r.clone()] == b[r.start - at..r.end - at]
        });
        assert!(written, "{what}: sector {s} lost an acknowledged write");
    }
    (d, got)
}

#[test]
fn a_raid5_and_a_raid6_grow_while_serving_reads_and_writes() {
    for (level, n, seed) in [(5, 4, 1u64), (6, 5, 2), (5, 3, 3), (4, 4, 4)] {
        let (mut d, mut model) = array_with_spare(level, n, seed);
        let size = model.len() as u64;
        grow_to(&mut d, n + 1);
        serve_until_reshaped(&mut d, &mut model, seed * 77);
        check_finished(&mut d, &model, n + 1);
        // The members assembled afresh: the new layout, the same bytes.
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut again = start_array(members, &(0..=n).collect::<Vec<_>>(), seed + 100);
        assert!(!again.engine.is_reshaping());
        assert!(read_all(&mut again, size) == model, "raid{level} {n}->{}: after assembly", n + 1);
    }
}

/// Sectors a raid5 grow from 4 to 5 members moves in `secs` of the driver's clock under
/// `policy` (md's defaults otherwise: sync_speed_min 1000, max 200 000 KiB/s), with
/// clients reading and writing throughout (all of it if it ends sooner); and the
/// reshape's share of the I/O as `status` last showed it.
fn reshape_sectors_under_clients(policy: &str, secs: u64) -> (u64, Option<u8>) {
    let (mut d, mut model) = array_with_spare(5, 4, 90);
    d.engine.set_tunable("sync_policy", policy).unwrap();
    let cur = d.engine.grow_current(MEMBER_BYTES / 512);
    let plan = grow_plan(&cur, &GrowRequest { raid_disks: Some(5), ..Default::default() }).unwrap();
    d.engine.grow(&plan, d.now_ns).unwrap();
    let mut clients = Clients::new(91);
    let size = model.len() as u64;
    let (start_ns, mut moved, mut share) = (d.now_ns, 0, None);
    while d.now_ns < start_ns + secs * 1_000_000_000 && d.engine.is_reshaping() {
        clients.issue(&mut d, size);
        d.engine.unplug(d.now_ns);
        d.step();
        let _ = clients.collect(&mut d, &mut model);
        if let Some((done, _)) = d.engine.reshape_progress() {
            moved = done;
            share = d.engine.view().reshape_share_pct.or(share);
        }
    }
    while !clients.out.is_empty() {
        d.run_until_idle();
        let _ = clients.collect(&mut d, &mut model);
    }
    // Idle: at sync_speed_max, done within a second of the clock.
    let idle_from = d.now_ns;
    run_until_reshaped(&mut d, policy);
    assert!(
        d.now_ns - idle_from < 1_000_000_000,
        "{policy}: idle, the reshape took {} ns",
        d.now_ns - idle_from
    );
    check_finished(&mut d, &model, 5);
    (moved, share)
}

#[test]
fn a_reshape_is_paced_as_md_paces_a_resync() {
    // md's md_do_sync paces a reshape as a resync: with client I/O, sync_speed_min (1000
    // KiB/s, 2000 sectors a second); idle, sync_speed_max. Before, a reshape ran at
    // sync_speed_max whatever the clients did (all 28 MiB of this grow in well under a
    // second).
    let (md, _) = reshape_sectors_under_clients("md", 1);
    assert!((1000..=2000 + 1024).contains(&md), "md's policy moved {md} sectors in 1 s under load");
    // The adaptive policy (the default) raises the pace while the clients keep theirs: on
    // memory they do, so it leaves the floor (after its probe at the floor and a doubling a
    // period); its share is shown as a resync's.
    let (adaptive, share) = reshape_sectors_under_clients("adaptive", 2);
    assert!(adaptive > 4 * md, "adaptive {adaptive} sectors against md's {md}");
    // (A small share here: the driver's clients move hundreds of MB in a second of its clock.)
    assert!(share.is_some(), "the reshape's share of the I/O");
}

#[test]
fn a_power_cut_anywhere_in_an_online_grow_loses_no_acknowledged_write() {
    // A grow by a member, a chunk change (64 KiB to 32 KiB) and a layout change on the same
    // members; restripes with room only after the data (backwards) last.
    let cases = [
        (5, 4, None, None, false),
        (6, 5, None, None, false),
        (5, 4, Some(64u64), None, false),
        (5, 4, None, Some("right-asymmetric"), false),
        (6, 5, None, Some("right-symmetric"), false),
        (5, 4, None, Some("raid6"), false),
        (5, 4, Some(64u64), None, true),
        (6, 5, None, Some("right-symmetric"), true),
    ];
    for (level, n, to_chunk, to_layout, room_after) in cases {
        let raid6 = to_layout == Some("raid6");
        let restripe = (to_chunk.is_some() || to_layout.is_some()) && !raid6;
        let disks = if restripe { n } else { n + 1 };
        for cut in 0..8u64 {
            let seed = 40 + cut;
            let (mut d, mut model) = if room_after {
                array_with_room_after(level, n, seed)
            } else {
                array_with_spare(level, n, seed)
            };
            let size = model.len() as u64;
            match (to_chunk, to_layout) {
                (Some(c), _) => change_chunk(&mut d, c),
                (_, Some("raid6")) => to_raid6(&mut d),
                (_, Some(l)) => change_layout(&mut d, l),
                _ => grow_to(&mut d, n + 1),
            }
            let mut clients = Clients::new(seed);
            let mut rng = Rng(seed * 3);
            // Spread over the reshape: past a tenth more of it each time, then just after a
            // write near the checkpoint was acknowledged (where a write in a window moved
            // but not yet checkpointed would be lost).
            let mut steps = 0;
            let mut armed = false;
            while d.engine.is_reshaping() {
                armed |= d.engine.reshape_progress().is_some_and(|(p, e)| p * 10 >= e * cut);
                clients.issue(&mut d, size);
                d.engine.unplug(d.now_ns);
                step_slow_metadata(&mut d, steps);
                let geo = d.engine.reshape_geometry().cloned();
                let pos = geo.as_ref().map_or(0, |g| g.position_sectors * 512);
                let near = (pos.saturating_sub(4 << 20), pos + (4 << 20));
                let written = clients.collect(&mut d, &mut model);
                // A write acknowledged on the new layout's side of the checkpoint (below
                // it forwards, at and above it backwards): the superblocks on the members
                // must already say so (else a restart would copy the window again from
                // the old layout, over it).
                if let Some(g) = d.engine.reshape_geometry() {
                    assert_eq!(g.backwards, room_after, "raid{level}: the direction mdadm would take");
                    let positions = (0..=n).map(|m| d.members.superblock(m).reshape_position);
                    let p = g.position_sectors * 512;
                    if g.backwards {
                        let durable = positions.min().unwrap() * 512;
                        for w in written.iter().filter(|w| w.1 >= p) {
                            assert!(w.1 >= durable, "raid{level}: write {w:?} acknowledged in the new layout below the durable checkpoint {durable}");
                        }
                    } else {
                        let durable = positions.max().unwrap() * 512;
                        for w in written.iter().filter(|w| w.1 <= p) {
                            assert!(w.1 <= durable, "raid{level}: write {w:?} acknowledged in the new layout past the durable checkpoint {durable}");
                        }
                    }
                }
                steps += 1;
                if armed && written.iter().any(|w| overlaps(*w, near)) && rng.below(3) == 0 {
                    break;
                }
            }
            // The cut: member I/O not yet performed never happens.
            let at = d.engine.reshape_progress().map(|(p, e)| p * 100 / e);
            eprintln!(
                "raid{level} cut {cut}: step {steps}, reshape at {at:?}%, {} I/Os dropped",
                d.pending.len()
            );
            assert!(at.is_some(), "the cut falls inside the reshape");
            let what = format!("raid{level} cut {cut} (step {steps})");
            let keys: Vec<usize> = (0..=n).collect();
            let (mut d, _) = restart_after_cut(d, &clients, &keys, seed + 1000, &model, &what);
            assert_eq!(d.engine.engine().geometry().raid_disks, disks);
            assert_eq!(d.engine.engine().geometry().chunk_sectors, to_chunk.unwrap_or(128));
            let geo = d.engine.engine().geometry();
            match to_layout {
                Some("raid6") => assert_eq!((geo.level.md_level(), geo.layout), (6, 2), "raid5 to raid6"),
                Some(l) => assert_eq!(geo.layout, uraid_core::geometry::parse_layout(geo.level, l).unwrap()),
                None => {}
            }
            d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
            d.run_until_idle();
            assert_eq!(
                d.engine.engine().mismatch_cnt(),
                0,
                "raid{level} cut {cut}: check after the resumed reshape"
            );
        }
    }
}

#[test]
fn a_member_gone_mid_reshape_leaves_it_to_end_degraded_with_the_data_intact() {
    for (level, n, lost) in [(5, 4, 1usize), (6, 5, 4), (5, 4, 4)] {
        let (mut d, mut model) = array_with_spare(level, n, 60 + lost as u64);
        let size = model.len() as u64;
        grow_to(&mut d, n + 1);
        let mut clients = Clients::new(61);
        let mut steps = 0u64;
        while d.engine.is_reshaping() {
            if steps == 300 {
                // The device goes away (fail-stop): member `lost`, an old slot or the new one.
                d.members.gone[lost] = true;
            }
            clients.issue(&mut d, size);
            d.engine.unplug(d.now_ns);
            d.step();
            let _ = clients.collect(&mut d, &mut model);
            steps += 1;
            assert!(steps < 5_000_000, "the reshape never ended");
        }
        assert!(steps > 300, "raid{level}: the member was lost mid-reshape");
        while !clients.out.is_empty() {
            d.run_until_idle();
            let _ = clients.collect(&mut d, &mut model);
        }
        let states = d.engine.engine().member_states();
        assert_eq!(states.len(), n + 1);
        assert_eq!(
            states.iter().filter(|s| **s != MemberState::InSync).count(),
            1,
            "raid{level}: {states:?}"
        );
        assert!(read_all(&mut d, size) == model, "raid{level} lost {lost}: data after a degraded reshape");
        // Assembled afresh without the lost member: the new layout, degraded, the same bytes.
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let keys: Vec<usize> = (0..=n).filter(|&k| k != lost).collect();
        let mut again = start_array(members, &keys, 62);
        assert!(!again.engine.is_reshaping());
        assert_eq!(again.engine.engine().geometry().raid_disks, n + 1);
        assert!(read_all(&mut again, size) == model, "raid{level} lost {lost}: after assembly");
    }
}

#[test]
fn a_write_error_in_the_old_layout_fails_the_member_in_the_new_one_too() {
    let (mut d, _) = array_with_spare(5, 4, 70);
    d.engine.set_tunable("sync_speed_max", "1000").unwrap();
    grow_to(&mut d, 5);
    while d.engine.reshape_progress().is_some_and(|(p, _)| p == 0) {
        d.step();
    }
    // Writes to member 1 fail far ahead of the checkpoint, where only the old layout writes.
    d.members.write_errors.push((1, MEMBER_BYTES * 3 / 4, MEMBER_BYTES));
    let size = d.engine.size_bytes();
    let at = size - (1 << 20);
    d.submit(Request::write(5, at, vec![0x77; 1 << 20]));
    let mut steps = 0;
    let r = loop {
        d.step();
        if let Some(c) = d.take_done(5) {
            break c.result;
        }
        steps += 1;
        assert!(steps < 100_000, "the write never completed");
    };
    assert!(r.is_ok(), "the write completes degraded: {r:?}");
    for _ in 0..50 {
        d.step();
    }
    assert!(d.engine.is_reshaping(), "the write landed while the reshape runs");
    assert_eq!(d.engine.engine().member_states()[1], MemberState::Faulty, "the array's engine failed it too");
    let sb = d.members.superblock(0);
    assert_eq!(sb.dev_roles[d.members.superblock(1).dev_number as usize], 0xfffe, "recorded faulty on disk");
}

#[test]
fn a_member_lost_between_windows_leaves_no_window_stalled() {
    // The previous layout's engine holds its completions until the failure is recorded;
    // once it may release them the array must drain them (else the window's reads are
    // never counted and requests to the window wait for ever).
    let (mut d, model) = array_with_spare(5, 4, 80);
    let size = model.len() as u64;
    d.engine.set_tunable("sync_speed_max", "2000").unwrap();
    grow_to(&mut d, 5);
    while d.engine.reshape_progress().is_some_and(|(p, _)| p == 0) {
        d.step();
    }
    d.members.gone[2] = true;
    let mut steps = 0;
    while d.engine.is_reshaping() {
        d.step();
        steps += 1;
        assert!(steps < 200_000, "the reshape stalled: {}", d.engine.outstanding());
    }
    assert_eq!(d.engine.engine().member_states()[2], MemberState::Faulty);
    assert!(read_all(&mut d, size) == model, "the data after the degraded reshape");
}

#[test]
fn a_small_write_to_the_old_layout_goes_at_the_unplug_not_at_a_deadline() {
    // md unplugs every queue at once; the previous layout's engine holds small writes for
    // the unplug as the array's does, and must get it (else they wait for the delay timer).
    let (mut d, model) = array_with_spare(5, 4, 81);
    let size = model.len() as u64;
    d.engine.set_tunable("sync_speed_max", "2000").unwrap();
    grow_to(&mut d, 5);
    while d.engine.reshape_progress().is_some_and(|(p, _)| p == 0) || !d.engine.is_idle() {
        d.step();
    }
    let (p, _) = d.engine.reshape_progress().unwrap();
    assert!(p * 512 < size - 4096, "the write lands in the old layout");
    // A first write marks the array dirty (its superblock round holds it), so the one
    // measured goes straight to the engines.
    d.submit(Request::write(8999, size - 8192, vec![6u8; 4096]));
    while d.take_done(8999).is_none() {
        d.step();
    }
    d.submit(Request::write(9000, size - 4096, vec![7u8; 4096]));
    d.engine.unplug(d.now_ns);
    let ios: Vec<MemberIo> = std::iter::from_fn(|| d.engine.pop_member_io()).collect();
    assert!(
        ios.iter().any(|io| !is_meta(io)),
        "no member I/O for the write at the unplug: {}",
        d.engine.outstanding()
    );
    d.pending.extend(ios);
    d.run_until_idle();
    assert!(d.take_done(9000).is_some_and(|c| c.result.is_ok()));
}

#[test]
fn a_chunk_change_while_serving_reads_and_writes() {
    for (level, n, to_chunk, seed) in [(5, 4, 64u64, 5u64), (6, 5, 32, 6), (4, 3, 16, 7)] {
        let (mut d, mut model) = array_with_spare(level, n, seed);
        let size = model.len() as u64;
        let from_chunk = d.engine.engine().geometry().chunk_sectors;
        change_chunk(&mut d, to_chunk);
        serve_until_reshaped(&mut d, &mut model, seed * 77);
        let geo = d.engine.engine().geometry().clone();
        assert_eq!((geo.chunk_sectors, geo.raid_disks), (to_chunk, n), "from {from_chunk}");
        assert_eq!(d.engine.engine().size_bytes(), size, "a chunk change keeps the size");
        assert!(read_all(&mut d, size) == model, "raid{level} chunk {from_chunk}->{to_chunk}: data");
        d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
        d.run_until_idle();
        assert_eq!(d.engine.engine().mismatch_cnt(), 0, "md's check after the chunk change");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut again = start_array(members, &(0..=n).collect::<Vec<_>>(), seed + 100);
        assert!(!again.engine.is_reshaping());
        assert_eq!(again.engine.engine().geometry().chunk_sectors, to_chunk);
        assert!(
            read_all(&mut again, size) == model,
            "raid{level} chunk {from_chunk}->{to_chunk}: after assembly"
        );
    }
}

/// mdadm `--grow --chunk --layout` in one reshape, as md runs it.
#[test]
fn a_chunk_and_layout_change_at_once_while_serving() {
    use uraid_core::geometry::parse_layout;
    for (level, n, chunk, layout, seed) in
        [(5, 4, 256u64, "right-asymmetric", 12u64), (6, 5, 64, "left-symmetric", 13)]
    {
        let (mut d, mut model) = array_with_spare(level, n, seed);
        let size = model.len() as u64;
        let lvl = d.engine.engine().geometry().level;
        let want = parse_layout(lvl, layout).unwrap();
        let what = format!("raid{level} of {n} to {}K {layout}", chunk / 2);
        start_reshape(
            &mut d,
            GrowRequest { chunk_sectors: Some(chunk), layout: Some(layout.into()), ..Default::default() },
        );
        serve_until_reshaped(&mut d, &mut model, seed * 77);
        let geo = d.engine.engine().geometry().clone();
        assert_eq!((geo.layout, geo.chunk_sectors, geo.raid_disks), (want, chunk, n), "{what}");
        assert_eq!(d.engine.engine().size_bytes(), size, "{what}: the size stays");
        assert!(read_all(&mut d, size) == model, "{what}: data");
        d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
        d.run_until_idle();
        assert_eq!(d.engine.engine().mismatch_cnt(), 0, "{what}: md's check");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut again = start_array(members, &(0..=n).collect::<Vec<_>>(), seed + 100);
        let geo = again.engine.engine().geometry().clone();
        assert_eq!((geo.layout, geo.chunk_sectors), (want, chunk), "{what}: after assembly");
        assert!(read_all(&mut again, size) == model, "{what}: after assembly");
    }
}

#[test]
fn a_layout_change_while_serving_reads_and_writes() {
    use uraid_core::geometry::{layout_name, parse_layout};
    let cases = [
        (5, 4, "right-asymmetric", 8u64),
        (5, 3, "parity-last", 9),
        (6, 5, "left-asymmetric", 10),
        (6, 4, "ddf-N-continue", 11),
    ];
    for (level, n, to, seed) in cases {
        let (mut d, mut model) = array_with_spare(level, n, seed);
        let size = model.len() as u64;
        let from = d.engine.engine().geometry().layout;
        let lvl = d.engine.engine().geometry().level;
        let want = parse_layout(lvl, to).unwrap();
        let what = format!("raid{level} of {n}, {} -> {to}", layout_name(lvl, from));
        change_layout(&mut d, to);
        serve_until_reshaped(&mut d, &mut model, seed * 77);
        let geo = d.engine.engine().geometry().clone();
        assert_eq!((geo.layout, geo.raid_disks, geo.chunk_sectors), (want, n, 128), "{what}");
        assert_eq!(d.engine.engine().size_bytes(), size, "{what}: a layout change keeps the size");
        assert!(read_all(&mut d, size) == model, "{what}: data");
        d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
        d.run_until_idle();
        assert_eq!(d.engine.engine().mismatch_cnt(), 0, "{what}: md's check after the layout change");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut again = start_array(members, &(0..=n).collect::<Vec<_>>(), seed + 100);
        assert!(!again.engine.is_reshaping());
        assert_eq!(again.engine.engine().geometry().layout, want, "{what}");
        assert!(read_all(&mut again, size) == model, "{what}: after assembly");
    }
}

#[test]
fn a_restripe_with_room_only_after_the_data_runs_backwards_while_serving() {
    use uraid_core::geometry::parse_layout;
    let cases = [
        (5, 4, Some(256u64), None, 21u64),
        (6, 5, None, Some("right-asymmetric"), 22),
        (5, 3, Some(64), None, 23),
    ];
    for (level, n, chunk, layout, seed) in cases {
        let (mut d, mut model) = array_with_room_after(level, n, seed);
        let size = model.len() as u64;
        let what = format!("raid{level} of {n}, chunk {chunk:?} layout {layout:?}");
        start_reshape(
            &mut d,
            GrowRequest { chunk_sectors: chunk, layout: layout.map(String::from), ..Default::default() },
        );
        while !d.members.superblock(0).has(feature::RESHAPE_ACTIVE) {
            assert!(d.step(), "{what}: the start's superblock round");
        }
        let sb = d.members.superblock(0);
        assert!(sb.has(feature::RESHAPE_BACKWARDS) && sb.has(feature::NEW_OFFSET), "{what}: {sb:?}");
        assert!(sb.new_offset > 0 && sb.data_offset == 0, "{what}: the data moves up: {sb:?}");
        assert_eq!(
            sb.reshape_position * 512,
            size,
            "{what}: md starts a backwards reshape at the array's end"
        );
        // Serve, watching the checkpoint on the members fall.
        let mut clients = Clients::new(seed * 77);
        let mut positions = vec![sb.reshape_position];
        while d.engine.is_reshaping() {
            clients.issue(&mut d, size);
            d.engine.unplug(d.now_ns);
            assert!(d.step() || d.engine.is_reshaping(), "the driver stalled");
            let _ = clients.collect(&mut d, &mut model);
            let sb = d.members.superblock(0);
            if sb.has(feature::RESHAPE_ACTIVE) && Some(&sb.reshape_position) != positions.last() {
                positions.push(sb.reshape_position);
            }
        }
        while !clients.out.is_empty() {
            d.run_until_idle();
            let _ = clients.collect(&mut d, &mut model);
        }
        assert!(positions.len() > 3 && positions.windows(2).all(|w| w[1] < w[0]), "{what}: {positions:?}");
        let geo = d.engine.engine().geometry().clone();
        let lvl = geo.level;
        assert_eq!(geo.chunk_sectors, chunk.unwrap_or(128), "{what}");
        assert_eq!(geo.layout, layout.map_or(2, |l| parse_layout(lvl, l).unwrap()), "{what}");
        assert_eq!(d.engine.engine().size_bytes(), size, "{what}: a restripe keeps the size");
        assert!(read_all(&mut d, size) == model, "{what}: data");
        d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
        d.run_until_idle();
        assert_eq!(d.engine.engine().mismatch_cnt(), 0, "{what}: md's check after the restripe");
        let sb = d.members.superblock(0);
        assert!(!sb.has(feature::RESHAPE_ACTIVE) && !sb.has(feature::RESHAPE_BACKWARDS), "{what}: {sb:?}");
        assert!(sb.data_offset > 0 && sb.data_offset + sb.data_size <= sb.super_offset, "{what}: {sb:?}");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut again = start_array(members, &(0..=n).collect::<Vec<_>>(), seed + 100);
        assert!(!again.engine.is_reshaping());
        assert!(read_all(&mut again, size) == model, "{what}: after assembly");
    }
}

#[test]
fn raid5_to_raid6_while_serving_reads_and_writes_and_recovers_the_q_member() {
    for (n, seed) in [(4usize, 12u64), (3, 13)] {
        let (mut d, mut model) = array_with_spare(5, n, seed);
        let size = model.len() as u64;
        to_raid6(&mut d);
        let mut seen_mid = false;
        let mut clients = Clients::new(seed * 77);
        while d.engine.is_reshaping() {
            clients.issue(&mut d, size);
            d.engine.unplug(d.now_ns);
            assert!(d.step() || d.engine.is_reshaping(), "the driver stalled");
            let _ = clients.collect(&mut d, &mut model);
            // The new member is recovered by the reshape from 0 (md's takeover), its
            // recovery_offset following the checkpoint (md's reshape_request).
            let sb = d.members.superblock(0);
            let q = d.members.superblock(n);
            if sb.has(feature::RESHAPE_ACTIVE) && q.has(feature::RESHAPE_ACTIVE) {
                assert!(q.has(feature::RECOVERY_OFFSET), "{q:?}");
                assert_eq!(q.recovery_offset, q.reshape_position / (n as u64 - 1), "{q:?}");
                seen_mid |= sb.reshape_position > 0;
            }
        }
        while !clients.out.is_empty() {
            d.run_until_idle();
            let _ = clients.collect(&mut d, &mut model);
        }
        assert!(seen_mid, "a checkpoint was seen mid-way");
        let geo = d.engine.engine().geometry().clone();
        assert_eq!((geo.level.md_level(), geo.raid_disks, geo.layout), (6, n + 1, 2));
        assert_eq!(d.engine.engine().size_bytes(), size, "raid5 to raid6 keeps the size");
        assert!(read_all(&mut d, size) == model, "raid5 of {n} to raid6: data");
        d.run_until_idle();
        let q = d.members.superblock(n);
        assert!(!q.has(feature::RECOVERY_OFFSET) && !q.has(feature::RESHAPE_ACTIVE), "{q:?}");
        d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
        d.run_until_idle();
        assert_eq!(d.engine.engine().mismatch_cnt(), 0, "md's check: P and Q after raid5 to raid6");
        // Q holds: with two members gone the data still reads back.
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut again = start_array(members, &(2..=n).collect::<Vec<_>>(), seed + 100);
        assert!(!again.engine.is_reshaping());
        assert!(read_all(&mut again, size) == model, "raid5 of {n} to raid6: two members gone");
    }
}

/// A cut inside a checkpoint round of raid5 to raid6 that reached every member but the
/// new Q (`uraid sim --seed 99000715 --level 5`): its superblock keeps the previous
/// `recovery_offset`, behind the others' `reshape_position`. The window was flushed before
/// that round, so Q holds its rows: md's raid5_run takes the member at any recovery_offset
/// and its reshape goes on, raising it at the next checkpoint; so does uraid.
#[test]
fn a_q_member_that_missed_a_checkpoint_round_lets_raid5_to_raid6_go_on() {
    let n = 3;
    let (mut d, model) = array_with_spare(5, n, 61);
    let size = model.len() as u64;
    to_raid6(&mut d);
    let mut steps = 0;
    let mut before = d.members.superblock(n);
    loop {
        let q = d.members.superblock(n);
        if q.has(feature::RESHAPE_ACTIVE) && q.reshape_position > 0 {
            break;
        }
        before = q;
        d.step();
        steps += 1;
        assert!(steps < 1_000_000, "no checkpoint reached the Q member");
    }
    // The round reaches the others too.
    while !(0..n).all(|m| d.members.superblock(m).reshape_position > 0) {
        d.step();
        steps += 1;
        assert!(steps < 1_000_000, "the checkpoint round never ended");
    }
    let mut behind = before;
    let now = d.members.superblock(n);
    assert!(behind.has(feature::RESHAPE_ACTIVE) && behind.has(feature::RECOVERY_OFFSET), "{behind:?}");
    assert_eq!(behind.events + 1, now.events, "one round behind");
    assert!(behind.recovery_offset * (n as u64 - 1) < d.members.superblock(0).reshape_position);
    // The cut: nothing in flight lands, and Q keeps the superblock of the round before.
    d.pending.clear();
    let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    members.write_at(n, behind.super_offset * 512, &behind.update_csum());
    let keys: Vec<usize> = (0..=n).collect();
    let mut d = start_array(members, &keys, 62);
    assert!(d.engine.is_reshaping(), "the reshape resumes");
    run_until_reshaped(&mut d, "raid5 to raid6 resumed");
    assert!(read_all(&mut d, size) == model, "the data after the resumed reshape");
    assert_eq!(d.engine.engine().member_states(), vec![MemberState::InSync; n + 1]);
    d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
    d.run_until_idle();
    assert_eq!(d.engine.engine().mismatch_cnt(), 0, "md's check: P and Q after the resumed reshape");
    // Q's rows below the checkpoint it missed are there: two members gone, the data reads.
    let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    let mut again = start_array(members, &(2..=n).collect::<Vec<_>>(), 63);
    assert!(read_all(&mut again, size) == model, "raid6 with two members gone");
}

/// A spare whose bad-block log has entries (a member re-added as a spare with its log,
/// `uraid sim --seed 52000024 --profile ssd-sata`) holds nothing of either layout: a restart
/// mid-reshape serves the array writable and goes on, as md does.
#[test]
fn a_spares_bad_block_entries_do_not_stop_a_reshape_resumed_after_a_cut() {
    use uraid_core::meta::BadBlocks;
    let (mut d, mut model) = array_with_spare(5, 4, 21);
    let size = model.len() as u64;
    let extra = prepare_new_member(&mut d, MEMBER_BYTES, 0xB0);
    d.engine.add_member(extra, d.now_ns).unwrap();
    d.run_until_idle();
    grow_to(&mut d, 5);
    let mut steps = 0;
    while d.members.superblock(0).reshape_position == 0 {
        d.engine.unplug(d.now_ns);
        d.step();
        steps += 1;
        assert!(steps < 1_000_000, "no checkpoint");
    }
    d.pending.clear();
    let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    // The second spare (key 5) lists a bad range.
    let mut sb = members.superblock(5);
    assert_eq!(sb.slot(), None, "still a spare: {sb:?}");
    let mut bb = BadBlocks::for_superblock(&sb).unwrap();
    assert!(bb.set(sb.data_offset + 64, 8));
    let at = ((sb.super_offset as i64 + i64::from(sb.bblog_offset)) * 512) as usize;
    let log = bb.to_log_bytes(sb.bblog_size);
    members.images[5][at..at + log.len()].copy_from_slice(&log);
    sb.feature_map |= feature::BAD_BLOCKS;
    let bytes = sb.clone().update_csum();
    let at = (sb.super_offset * 512) as usize;
    members.images[5][at..at + bytes.len()].copy_from_slice(&bytes);

    let mut d = start_array(members, &(0..=5).collect::<Vec<_>>(), 22);
    assert!(d.engine.is_reshaping(), "served writable, the reshape goes on");
    serve_until_reshaped(&mut d, &mut model, 23);
    assert_eq!(d.engine.engine().geometry().raid_disks, 5);
    assert!(read_all(&mut d, size) == model, "the data after the resumed reshape");
}

/// A power cut inside the round that starts a grow: members 1 and the new member (still a
/// spare in its own superblock) keep the superblock from before, one event behind. Assembly
/// takes the reshape from the freshest and it resumes; the superblocks written from then on
/// must carry the array's fields on every member (md's super_1_sync writes them from the
/// array), else the round ending the reshape makes a superblock of level 0 and chunk 0 of
/// theirs and the next assembly loses them. The spare is recovered once the reshape ends.
#[test]
fn members_that_missed_the_grows_start_round_are_assembled_again_after_it_ends() {
    let (mut d, model) = array_with_spare(5, 4, 31);
    let size = model.len() as u64;
    let before: Vec<_> = (0..=4).map(|m| d.members.superblock(m)).collect();
    grow_to(&mut d, 5);
    let mut steps = 0;
    while (0..=4).any(|m| d.members.superblock(m).raid_disks != 5) {
        d.step();
        steps += 1;
        assert!(steps < 1_000_000, "the start round never ended");
    }
    assert_eq!(d.members.superblock(0).reshape_position, 0, "no window checkpointed yet");
    d.pending.clear();
    let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    for m in [1, 4] {
        let mut sb = before[m].clone();
        members.write_at(m, sb.super_offset * 512, &sb.update_csum());
    }
    let keys: Vec<usize> = (0..=4).collect();
    let mut d = start_array(members, &keys, 32);
    assert!(d.engine.is_reshaping(), "the reshape the freshest superblocks record goes on");
    while d.engine.is_reshaping() || !d.engine.engine().is_idle() {
        d.run_until_idle();
    }
    d.run_until_idle();
    assert!(read_all(&mut d, size) == model, "the data after the resumed reshape");
    let offset = d.members.superblock(0).data_offset;
    for m in keys.iter().copied() {
        let sb = d.members.superblock(m);
        assert_eq!((sb.level, sb.raid_disks, sb.chunksize), (5, 5, 128), "member {m}'s superblock");
        // mdadm's grow moves every device's data offset by the same change, spares' too.
        assert_eq!(sb.data_offset, offset, "member {m}'s data offset");
    }
    // Assembled afresh: every member in its slot of the new layout, the same bytes.
    let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    let mut again = start_array(members, &keys, 33);
    again.run_until_idle();
    assert!(!again.engine.is_reshaping());
    assert_eq!(again.engine.engine().member_states(), vec![MemberState::InSync; 5]);
    assert!(read_all(&mut again, size) == model, "the data after a fresh assembly");
    again.engine.scrub(Some(ScrubKind::Check), again.now_ns).unwrap();
    again.run_until_idle();
    assert_eq!(again.engine.engine().mismatch_cnt(), 0, "md's check after the fresh assembly");
}

/// A power cut inside the round that ends a grow: member 1 keeps the superblock of the last
/// checkpoint (reshape active, one event behind). Assembly reads it at its new offset; the
/// rounds written from then on must say the reshape is over on it too, else at the same
/// event count as the others it contradicts them and the next assembly is refused.
#[test]
fn a_member_that_missed_the_round_ending_a_grow_is_assembled_again_after_the_next_round() {
    let (mut d, mut model) = array_with_spare(5, 4, 35);
    let size = model.len() as u64;
    grow_to(&mut d, 5);
    let mut steps = 0;
    while !d.members.superblock(1).has(feature::RESHAPE_ACTIVE) {
        d.step();
        steps += 1;
        assert!(steps < 1_000_000, "the start round never ended");
    }
    let mut last_reshaping = None;
    while !(0..=4).all(|m| !d.members.superblock(m).has(feature::RESHAPE_ACTIVE)) {
        let sb = d.members.superblock(1);
        if sb.has(feature::RESHAPE_ACTIVE) {
            last_reshaping = Some(sb);
        }
        d.step();
        steps += 1;
        assert!(steps < 1_000_000, "the reshape never ended");
    }
    let mut behind = last_reshaping.expect("member 1 recorded the reshape");
    assert_eq!(behind.events + 1, d.members.superblock(1).events, "one round behind");
    d.run_until_idle();
    let mut members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    members.write_at(1, behind.super_offset * 512, &behind.update_csum());
    let keys: Vec<usize> = (0..=4).collect();
    let mut d = start_array(members, &keys, 36);
    assert!(!d.engine.is_reshaping());
    // A write: the array marks itself active, a superblock round on every member.
    let data = vec![0x5a; 4096];
    d.run_one(Request::write(1, 8192, data.clone())).unwrap();
    model[8192..8192 + 4096].copy_from_slice(&data);
    d.run_until_idle();
    let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    let mut again = start_array(members, &keys, 37);
    again.run_until_idle();
    assert_eq!(again.engine.engine().member_states(), vec![MemberState::InSync; 5]);
    assert!(read_all(&mut again, size) == model, "the data after a fresh assembly");
}

/// md's takeovers while serving: a raid1 of two becomes a raid5 of two, a raid0 a raid4 or
/// raid5 (parity last) with its parity slot missing until a spare is recovered into it, a
/// raid6 restriped to left-symmetric-6 a raid5 of the others with a spare.
/// Requests go on throughout, the data reads back, md's check is clean once whole, and a
/// fresh assembly reads the new level.
/// md's raid10_takeover_raid0 and raid0_takeover_raid10 while serving: a raid0 of two
/// becomes a near-2 raid10 of four (each member in slot 2i, its mirror missing), spares
/// are recovered into the mirrors, one member of each pair is failed and removed, and the
/// raid10 goes back to a raid0 of the others.
#[test]
fn a_raid0_becomes_raid10_and_back_while_serving() {
    use uraid_core::geometry::Level;
    let (mut d, mut model) = array_with_data(0, 2, 41);
    let size = model.len() as u64;
    let take_over = |d: &mut Driver<Array>, to: Level| {
        let cur = d.engine.grow_current(MEMBER_BYTES / 512);
        let plan = grow_plan(&cur, &GrowRequest { level: Some(to), ..Default::default() }).unwrap();
        d.engine.may_grow(&plan).map_err(|e| e.0)?;
        d.engine.grow(&plan, d.now_ns)
    };
    let said = take_over(&mut d, Level::Raid10).unwrap();
    assert!(said.contains("takeover"), "{said}");
    serve_until_level(&mut d, &mut model, 43, Level::Raid10, "raid0 to raid10");
    let geo = d.engine.engine().geometry().clone();
    assert_eq!((geo.raid_disks, geo.layout), (4, 0x102), "{geo:?}");
    assert_eq!(d.engine.engine().size_bytes(), size, "the size stays");
    let states = d.engine.engine().member_states();
    assert!(
        matches!(states[1], MemberState::Missing) && matches!(states[3], MemberState::Missing),
        "{states:?}"
    );
    assert!(read_all(&mut d, size) == model, "raid10 with its mirrors missing: data");
    // While the mirrors are missing, back to raid0 is possible; first the mirrors.
    for i in 0..2u8 {
        let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xD0 + i);
        d.engine.add_member(new, d.now_ns).unwrap();
        d.run_until_idle();
    }
    assert!(!d.engine.engine().is_degraded(), "the mirrors recovered");
    d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
    d.run_until_idle();
    assert_eq!(d.engine.engine().mismatch_cnt(), 0, "md's check of the raid10");
    // Whole, md refuses raid0: one of each pair must go first.
    let e = take_over(&mut d, Level::Raid0).unwrap_err();
    assert!(e.contains("one member of each mirror pair"), "{e}");
    let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    let sb = members.superblock(0);
    assert_eq!((sb.level, sb.raid_disks, sb.layout), (10, 4, 0x102), "{sb:?}");
    assert_eq!(sb.slot(), Some(0), "member 0 stays in slot 0");
    assert_eq!(
        members.superblock(1).slot(),
        Some(2),
        "member 1 moved to slot 2: {:?}",
        members.superblock(1)
    );
    // The raid10 of four assembled without the members of slots 0 and 3 (mirrors of the
    // others): back to raid0 from slots 1 and 2.
    let slot_of = |m: usize| members.superblock(m).slot();
    let keep: Vec<usize> =
        (0..members.images.len()).filter(|&m| matches!(slot_of(m), Some(1) | Some(2))).collect();
    assert_eq!(keep.len(), 2);
    let mut d = start_array(members, &keep, 44);
    assert_eq!(d.engine.engine().geometry().level, Level::Raid10);
    assert!(read_all(&mut d, size) == model, "raid10 missing one of each pair");
    let said = take_over(&mut d, Level::Raid0).unwrap();
    assert!(said.contains("takeover"), "{said}");
    d.run_until_idle();
    let geo = d.engine.engine().geometry().clone();
    let notices: Vec<String> = std::iter::from_fn(|| d.engine.pop_notice()).collect();
    assert_eq!((geo.level, geo.raid_disks), (Level::Raid0, 2), "{geo:?} {notices:?}");
    assert!(read_all(&mut d, size) == model, "back to raid0: data");
    let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
    for &m in &keep {
        let sb = members.superblock(m);
        assert_eq!((sb.level, sb.raid_disks), (0, 2), "{sb:?}");
        assert_eq!(sb.data_size, sb.size, "{sb:?}");
    }
    let mut again = start_array(members, &keep, 45);
    assert_eq!(again.engine.engine().geometry().level, Level::Raid0);
    assert!(read_all(&mut again, size) == model, "raid0 after assembly");
}

/// md's raid0_takeover_raid1 while serving: a raid1 down to one mirror in sync (the others
/// missing) becomes a raid0 of that member, in slot 0 whichever slot it had, with md's
/// chunk; refused while another mirror is there. Superblocks as md wrote them in the VM
/// (raid1 of two, slot 0 failed and removed, `mdadm --grow --level=0`): level 0, raid_disks
/// 1, 64K chunk, the member "Active device 0" keeping its dev_number.
#[test]
fn a_raid1_down_to_one_mirror_becomes_raid0_while_serving() {
    use uraid_core::geometry::Level;
    for (n, keep, seed) in [(2usize, 1usize, 51u64), (3, 0, 52)] {
        let (mut d, mut model) = array_with_data(1, n, seed);
        let size = model.len() as u64;
        let take_over = |d: &mut Driver<Array>| {
            let cur = d.engine.grow_current(MEMBER_BYTES / 512);
            let plan =
                grow_plan(&cur, &GrowRequest { level: Some(Level::Raid0), ..Default::default() }).unwrap();
            d.engine.may_grow(&plan).map_err(|e| e.0)?;
            d.engine.grow(&plan, d.now_ns)
        };
        let e = take_over(&mut d).unwrap_err();
        assert!(e.contains("one mirror is left"), "{e}");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let mut d = start_array(members, &[keep], seed + 100);
        assert!(read_all(&mut d, size) == model, "raid1 of {n} with only slot {keep}");
        let said = take_over(&mut d).unwrap();
        assert!(said.contains("takeover"), "{said}");
        serve_until_level(&mut d, &mut model, seed + 200, Level::Raid0, "raid1 to raid0");
        let geo = d.engine.engine().geometry().clone();
        assert_eq!((geo.raid_disks, geo.chunk_sectors), (1, 128), "{geo:?}");
        assert_eq!(d.engine.engine().size_bytes(), size, "the size stays");
        assert!(read_all(&mut d, size) == model, "raid0 of the mirror left: data");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let sb = members.superblock(keep);
        assert_eq!((sb.level, sb.raid_disks, sb.chunksize, sb.slot()), (0, 1, 128, Some(0)), "{sb:?}");
        assert_eq!(sb.dev_number, keep as u32, "the member keeps its dev_number");
        assert_eq!(sb.data_size, sb.size, "{sb:?}");
        let mut again = start_array(members, &[keep], seed + 300);
        assert_eq!(again.engine.engine().geometry().level, Level::Raid0);
        assert!(read_all(&mut again, size) == model, "raid0 after assembly");
    }
}

/// md's raid6_takeover while serving (mdadm's `--level 6 --layout preserve`): a raid5 is
/// the raid6 of one more member with Q on it (the `-6` layout of its own), so nothing is
/// restriped; the Q slot is missing until the spare is recovered into it. Refused without a
/// spare, as mdadm's "need 1 spare".
#[test]
fn raid5_to_raid6_by_takeover_recovers_q_onto_a_spare_while_serving() {
    use uraid_core::geometry::Level;
    // The second with an internal bitmap: kept, and no help to the Q member's recovery
    // (a device new to the slot is recovered whole); and with --force and no spare, as
    // mdadm's "Use --force to over-ride": the Q slot stays missing until a device is added.
    for (n, seed, bitmap) in [(4usize, 61u64, false), (3, 62, true)] {
        let forced = bitmap;
        let (mut d, mut model) = array_on(create_level(5, n, MEMBER_BYTES, bitmap), n, seed);
        let size = model.len() as u64;
        let raid5_layout = d.engine.engine().geometry().layout;
        let ask = GrowRequest {
            level: Some(Level::Raid6),
            layout: Some("preserve".into()),
            force: forced,
            ..Default::default()
        };
        if !forced {
            let unforced = GrowRequest { force: false, ..ask.clone() };
            let e = grow_plan(&d.engine.grow_current(MEMBER_BYTES / 512), &unforced).unwrap_err().0;
            assert!(e.contains("need 1 spare"), "{e}");
        }
        let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xE0 + n as u8);
        let mut new_key = new.key as usize;
        let mut new = Some(new);
        if !forced {
            d.engine.add_member(new.take().unwrap(), d.now_ns).unwrap();
            d.run_until_idle();
        }
        let plan = grow_plan(&d.engine.grow_current(MEMBER_BYTES / 512), &ask).unwrap();
        d.engine.may_grow(&plan).map_err(|e| e.0).unwrap();
        let said = d.engine.grow(&plan, d.now_ns).unwrap();
        assert!(said.contains("takeover"), "{said}");
        serve_until_level(&mut d, &mut model, seed + 200, Level::Raid6, "raid5 to raid6 by takeover");
        d.run_until_idle();
        if let Some(stale) = new {
            assert!(d.engine.engine().is_degraded(), "forced: the Q slot is missing");
            assert!(read_all(&mut d, size) == model, "raid6 without its Q: data");
            // Its superblock was made for the raid5: refused, else the rounds would keep
            // writing the raid5's shape on it.
            let e = d.engine.add_member(stale, d.now_ns).unwrap_err();
            assert!(e.contains("changed shape"), "{e}");
            let fresh = prepare_new_member(&mut d, MEMBER_BYTES, 0xF0 + n as u8);
            new_key = fresh.key as usize;
            d.engine.add_member(fresh, d.now_ns).unwrap();
            d.run_until_idle();
        }
        let geo = d.engine.engine().geometry().clone();
        assert_eq!((geo.raid_disks, geo.layout), (n + 1, raid5_layout + 16), "the -6 layout: {geo:?}");
        assert_eq!(d.engine.engine().size_bytes(), size, "the size stays");
        assert!(!d.engine.engine().is_degraded(), "the spare recovered into the Q slot");
        assert!(read_all(&mut d, size) == model, "raid6: data");
        d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
        d.run_until_idle();
        assert_eq!(d.engine.engine().mismatch_cnt(), 0, "md's check of the raid6");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let sb = members.superblock(new_key);
        assert_eq!((sb.level, sb.raid_disks as usize, sb.slot()), (6, n + 1, Some(n as u32)), "{sb:?}");
        assert_eq!(sb.bitmap_sector().is_some(), bitmap, "the bitmap stays: {sb:?}");
        // Two members lost: the recovered Q and P/data carry the data.
        let keep: Vec<usize> = (2..n).chain([new_key]).collect();
        let mut again = start_array(members, &keep, seed + 300);
        assert_eq!(again.engine.engine().geometry().level, Level::Raid6);
        assert!(read_all(&mut again, size) == model, "raid6 without two members");
    }
}

#[test]
fn takeovers_while_serving_keep_the_data() {
    use uraid_core::geometry::Level;
    let cases = [
        (1, 2usize, Level::Raid5, 31u64),
        (0, 3, Level::Raid4, 32),
        (0, 4, Level::Raid5, 33),
        (6, 5, Level::Raid5, 34),
        (4, 4, Level::Raid5, 35),
        (5, 4, Level::Raid4, 36),
        (5, 2, Level::Raid1, 37),
    ];
    for (level, n, to, seed) in cases {
        let (mut d, mut model) = array_with_data(level, n, seed);
        let size = model.len() as u64;
        let what = format!("raid{level} of {n} to {to:?}");
        // md's way back from raid6 (Q onto the last member) and to raid4 (parity onto the
        // last member): a restripe first, then the takeover.
        let first_layout = match (level, to) {
            (6, _) => Some("left-symmetric-6"),
            (5, Level::Raid4) => Some("parity-last"),
            _ => None,
        };
        if let Some(layout) = first_layout {
            let cur = d.engine.grow_current(MEMBER_BYTES / 512);
            let early = grow_plan(&cur, &GrowRequest { level: Some(to), ..Default::default() }).unwrap();
            let e = d.engine.may_grow(&early).unwrap_err().to_string();
            assert!(e.contains(&format!("--layout {layout}")), "{what}: {e}");
            change_layout(&mut d, layout);
            serve_until_reshaped(&mut d, &mut model, seed * 3);
        }
        let cur = d.engine.grow_current(MEMBER_BYTES / 512);
        let plan = grow_plan(&cur, &GrowRequest { level: Some(to), ..Default::default() }).unwrap();
        d.engine.may_grow(&plan).unwrap();
        let said = d.engine.grow(&plan, d.now_ns).unwrap();
        assert!(said.contains("takeover"), "{what}: {said}");
        serve_until_level(&mut d, &mut model, seed * 5, to, &what);
        let geo = d.engine.engine().geometry().clone();
        let slots = match level {
            0 => n + 1,
            6 => n - 1,
            _ => n,
        };
        assert_eq!(geo.raid_disks, slots, "{what}");
        assert_eq!(d.engine.engine().size_bytes(), size, "{what}: the size stays");
        assert!(read_all(&mut d, size) == model, "{what}: data");
        if level == 0 {
            // The parity slot is missing until a spare is recovered into it.
            assert!(d.engine.engine().is_degraded(), "{what}");
            let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xC0);
            d.engine.add_member(new, d.now_ns).unwrap();
            d.run_until_idle();
            assert!(!d.engine.engine().is_degraded(), "{what}: recovered");
        }
        d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
        d.run_until_idle();
        assert_eq!(d.engine.engine().mismatch_cnt(), 0, "{what}: md's check");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let sb = members.superblock(0);
        assert_eq!((sb.level, sb.raid_disks as usize), (to.md_level(), slots), "{what}: {sb:?}");
        let keys: Vec<usize> = (0..members.images.len()).collect();
        let mut again = start_array(members, &keys, seed + 100);
        assert_eq!(again.engine.engine().geometry().level, to, "{what}");
        assert!(!again.engine.engine().is_degraded(), "{what}");
        assert!(read_all(&mut again, size) == model, "{what}: after assembly");
        if level == 6 {
            // The member Q was on stays, as a spare.
            let spares =
                again.engine.view().members.iter().filter(|m| m.role.active_slot().is_none()).count();
            assert_eq!(spares, 1, "{what}");
        }
    }
}

/// mdadm's raid0 grow while serving: `new` members `--add`ed, then raid0 to raid4 (parity
/// slot empty), the raid4 grown (the first new member in the old parity slot), raid4 back
/// to raid0.
fn grow_raid0(d: &mut Driver<Array>, new: usize) {
    let n = d.engine.engine().geometry().raid_disks;
    let cur = d.engine.grow_current(MEMBER_BYTES / 512);
    let req = GrowRequest { raid_disks: Some(n + new), adding: new, ..Default::default() };
    let plan = grow_plan(&cur, &req).unwrap();
    at_the_ceiling(d);
    d.engine.may_grow(&plan).unwrap();
    d.engine.may_add_for_grow(&plan).unwrap();
    for i in 0..new {
        let m = prepare_new_member(d, MEMBER_BYTES, 0xB0 + i as u8);
        d.engine.add_member(m, d.now_ns).unwrap();
    }
    let said = d.engine.grow(&plan, d.now_ns).unwrap();
    assert!(said.contains("by way of raid4"), "{said}");
}

#[test]
fn a_raid0_grows_by_members_while_serving_by_way_of_raid4() {
    use uraid_core::geometry::Level;
    for (n, new, seed) in [(3usize, 1usize, 61u64), (2, 2, 62), (4, 1, 63)] {
        let (mut d, mut model) = array_with_data(0, n, seed);
        let size = model.len() as u64;
        let what = format!("raid0 of {n} + {new}");
        // Adding to a raid0 is refused outside a grow.
        let m = prepare_new_member(&mut d, MEMBER_BYTES, 0xAF);
        assert!(d.engine.add_member(m, d.now_ns).unwrap_err().contains("raid0"), "{what}");
        grow_raid0(&mut d, new);
        let mut clients = Clients::new(seed * 7);
        let mut steps = 0u64;
        let mut saw = (false, false);
        loop {
            let geo = d.engine.engine().geometry();
            saw.0 |= geo.level == Level::Raid4;
            saw.1 |= d.engine.is_reshaping();
            if geo.level == Level::Raid0 && geo.raid_disks == n + new {
                break;
            }
            clients.issue(&mut d, size);
            d.engine.unplug(d.now_ns);
            d.step();
            let _ = clients.collect(&mut d, &mut model);
            steps += 1;
            assert!(steps < 20_000_000, "{what}: the grow never ended");
        }
        while !clients.out.is_empty() {
            d.run_until_idle();
            let _ = clients.collect(&mut d, &mut model);
        }
        d.run_until_idle();
        assert_eq!(saw, (true, true), "{what}: raid4 and a reshape on the way");
        assert!(!d.engine.engine().is_degraded(), "{what}");
        assert_eq!(d.engine.engine().size_bytes(), size / n as u64 * (n + new) as u64, "{what}: new size");
        assert!(read_all(&mut d, size) == model, "{what}: data");
        // The new space takes writes.
        let tail = vec![0x5au8; 1 << 20];
        assert!(d.run_one(Request::write(7777, size, tail.clone())).is_ok(), "{what}");
        assert!(d.run_one(Request::read(7778, size, 1 << 20)).unwrap() == tail, "{what}");
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        // Image `n` is the device refused above.
        let keys: Vec<usize> = (0..n).chain(n + 1..=n + new).collect();
        for (slot, &m) in keys.iter().enumerate() {
            let sb = members.superblock(m);
            assert_eq!((sb.level, sb.raid_disks as usize), (0, n + new), "{what}: member {m}: {sb:?}");
            assert!(!sb.has(feature::RESHAPE_ACTIVE) && !sb.has(feature::RECOVERY_OFFSET), "{what}: {sb:?}");
            assert_eq!(sb.slot(), Some(slot as u32), "{what}: member {m}");
            // raid0_takeover_raid45: the members' data is the component size.
            assert_eq!(sb.data_size, sb.size, "{what}: member {m}");
        }
        let mut again = start_array(members, &keys, seed + 100);
        assert_eq!(again.engine.engine().geometry().level, Level::Raid0, "{what}");
        assert!(read_all(&mut again, size) == model, "{what}: after assembly");
    }
}

#[test]
fn a_power_cut_anywhere_in_a_raid0_grow_loses_no_acknowledged_write() {
    use uraid_core::geometry::Level;
    for (n, new, cut) in (0..11u64).map(|c| (3usize, 1usize, c)).chain((0..11).map(|c| (2, 2, c))) {
        let seed = 70 + cut + 100 * new as u64;
        let (mut d, mut model) = array_with_data(0, n, seed);
        let size = model.len() as u64;
        grow_raid0(&mut d, new);
        let mut clients = Clients::new(seed);
        let mut rng = Rng(seed * 5);
        // Cut 0 and 1 in the takeover to raid4 or the grow's start; the others spread
        // over the reshape, 9 at its end, 10 in the takeover back to raid0.
        let mut steps = 0u64;
        loop {
            let geo = d.engine.engine().geometry();
            let at = match (geo.level, d.engine.reshape_progress()) {
                (Level::Raid0, _) if geo.raid_disks == n => 0,
                (Level::Raid4, None) if geo.raid_disks == n + 1 => 1,
                (Level::Raid4, Some((p, e))) => 2 + p * 7 / e.max(1),
                // Reshape done: the takeover back to raid0 under way.
                (Level::Raid4, None) => 10,
                _ => 9,
            };
            let done = geo.level == Level::Raid0 && geo.raid_disks == n + new;
            if done || (at >= cut && rng.below(4) == 0) {
                break;
            }
            clients.issue(&mut d, size);
            d.engine.unplug(d.now_ns);
            step_slow_metadata(&mut d, steps);
            let _ = clients.collect(&mut d, &mut model);
            steps += 1;
            assert!(steps < 20_000_000, "cut {cut}: the grow never ended");
        }
        let geo = d.engine.engine().geometry();
        eprintln!(
            "raid0 grow cut {cut}: step {steps}, raid{} of {}, reshape {:?}, {} I/Os dropped",
            geo.level.md_level(),
            geo.raid_disks,
            d.engine.reshape_progress(),
            d.pending.len()
        );
        let keys: Vec<usize> = (0..n + new).collect();
        let (mut d, got) =
            restart_after_cut(d, &clients, &keys, seed + 1000, &model, &format!("cut {cut} (step {steps})"));
        // What the restart serves: the raid0 (before or after), or the raid4 the grow
        // passed through (md leaves it so too), which `--level 0` takes back to raid0 once
        // its parity slot is empty.
        let geo = d.engine.engine().geometry().clone();
        match geo.level {
            Level::Raid0 => assert!(geo.raid_disks == n || geo.raid_disks == n + new, "cut {cut}: {geo:?}"),
            Level::Raid4 if geo.raid_disks == n + new + 1 => {
                assert!(d.engine.engine().is_degraded(), "cut {cut}: the parity slot stays empty");
                let cur = d.engine.grow_current(MEMBER_BYTES / 512);
                let req = GrowRequest { level: Some(Level::Raid0), ..Default::default() };
                let plan = grow_plan(&cur, &req).unwrap();
                d.engine.may_grow(&plan).unwrap();
                d.engine.grow(&plan, d.now_ns).unwrap();
                d.run_until_idle();
                let geo = d.engine.engine().geometry();
                assert_eq!((geo.level, geo.raid_disks), (Level::Raid0, n + new), "cut {cut}");
                assert!(read_all(&mut d, size) == got, "cut {cut}: the takeover back to raid0");
            }
            // Cut before the grow's start was durable: the spare took the parity slot.
            Level::Raid4 => {
                assert_eq!(geo.raid_disks, n + 1, "cut {cut}");
                d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
                d.run_until_idle();
                assert_eq!(d.engine.engine().mismatch_cnt(), 0, "cut {cut}: md's check");
            }
            other => panic!("cut {cut}: raid{}", other.md_level()),
        }
    }
}

/// Whether member `m`'s bitmap on disk has the chunk holding sync-space sector `sector` set.
fn bit_on_disk(d: &Driver<Array>, m: usize, sector: u64) -> bool {
    let bytes = d.members.metadata(m).offered.bitmap.expect("the member has a bitmap");
    let image = uraid_core::meta::bitmap::BitmapImage::parse(&bytes).unwrap();
    image.is_dirty(sector / u64::from(image.sb.chunksize / 512))
}

#[test]
fn a_write_during_a_grow_with_a_bitmap_sets_its_bits_in_both_layouts() {
    use uraid_core::meta::bitmap::array_range_to_sync_range;
    let mm = create_level(5, 4, MEMBER_BYTES, true);
    let mut d = start_array(mm, &[0, 1, 2, 3], 71);
    let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xA0);
    d.engine.add_member(new, d.now_ns).unwrap();
    d.run_until_idle();
    let size = d.engine.engine().size_bytes();
    grow_to(&mut d, 5);
    let mut steps = 0;
    while d.engine.reshape_progress().is_none_or(|(p, _)| p == 0) {
        d.step();
        steps += 1;
        assert!(steps < 1_000_000, "no window was checkpointed");
    }
    // Far ahead of the position, where the previous layout holds it: the two layouts put
    // it in different bitmap chunks (rows of 3 and of 4 data chunks).
    let at = size / 4 * 3 / 4096 * 4096;
    let (p, _) = d.engine.reshape_progress().unwrap();
    assert!(at / 512 > p + (4 << 11), "the write lies ahead of the reshape");
    let previous = array_range_to_sync_range(5, 4, 128, at / 512, 8).0;
    let next = array_range_to_sync_range(5, 5, 128, at / 512, 8).0;
    assert_ne!(previous / 128, next / 128, "the test needs the layouts' chunks apart");
    d.submit(Request::write(77, at, vec![0x5a; 4096]));
    while d.take_done(77).is_none() {
        d.step();
    }
    // md would resync the chunk of whichever layout the write landed in after a crash;
    // both bits were durable before the write went out.
    for m in 0..5 {
        assert!(bit_on_disk(&d, m, previous), "member {m}: the previous layout's bit");
        assert!(bit_on_disk(&d, m, next), "member {m}: the next layout's bit");
    }
}

/// A raid5 of 4 whose member 0 failed and stays listed (faulty) with a hot spare recovered
/// into its slot, and a device prepared to join it (not yet added).
fn raid5_with_a_failed_member_still_listed(seed: u64) -> (Driver<Array>, NewMember) {
    let mm = create_level(5, 4, MEMBER_BYTES, true);
    let mut d = start_array(mm, &[0, 1, 2, 3], seed);
    let spare = prepare_new_member(&mut d, MEMBER_BYTES, 0xA0);
    d.engine.add_member(spare, d.now_ns).unwrap();
    d.run_until_idle();
    d.engine.fail(0, false, d.now_ns).unwrap();
    d.run_until_idle();
    assert_eq!(d.engine.engine().member_states(), vec![MemberState::InSync; 4]);
    let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xA1);
    (d, new)
}

/// A failed member stays listed (faulty, its superblock as it was when it failed) until it
/// is removed. The grow's end must take the array's new shape from the members it wrote,
/// not from that one: with the old member count the bitmap counted a write after the grow
/// in the wrong rows (or past its end), so a cut before a flush left a stripe nothing
/// resynced (`uraid sim --seed 99001543 --level 5`: P disagreed after the power cycle).
#[test]
fn after_a_grow_a_write_sets_the_bit_of_the_new_layout_with_a_failed_member_still_listed() {
    use uraid_core::meta::bitmap::array_range_to_sync_range;
    let (mut d, new) = raid5_with_a_failed_member_still_listed(73);
    d.engine.add_member(new, d.now_ns).unwrap();
    d.run_until_idle();
    grow_to(&mut d, 5);
    run_until_reshaped(&mut d, "the grow");
    // Near the end of the grown array: rows of 4 data chunks put it in member sectors that
    // rows of 3 would place past the bitmap's end.
    let size = d.engine.engine().size_bytes();
    let at = (size - (1 << 20)) / 4096 * 4096;
    let sync = array_range_to_sync_range(5, 5, 128, at / 512, 8).0;
    let write = 77;
    d.submit(Request::write(write, at, vec![0x5a; 4096]));
    while d.take_done(write).is_none() {
        d.step();
    }
    for m in 1..=5 {
        assert!(bit_on_disk(&d, m, sync), "member {m}: the bit of the grown layout's rows");
    }
}

/// A spare taken by a grow keeps its own dev_number, as md keeps an rdev's desc_nr (read
/// from its superblock) through raid5_start_reshape, and never takes the number of a failed
/// member still listed in dev_roles. uraid gave it the lowest number no slot held: the
/// failed member's, so the round starting the grow wrote the new slot over that member's
/// faulty entry, and the spare's own entry stayed a spare nobody was.
#[test]
fn a_spare_joining_a_grow_keeps_its_dev_number_beside_a_failed_member_still_listed() {
    use uraid_core::meta::superblock::role;
    let (mut d, new) = raid5_with_a_failed_member_still_listed(74);
    let (key, own) = (new.key as usize, new.sb.dev_number);
    assert_ne!(own, 0, "the failed member's number is still listed");
    d.engine.add_member(new, d.now_ns).unwrap();
    d.run_until_idle();
    // The grow runs to its end; every round from its start on wrote these entries.
    grow_to(&mut d, 5);
    d.run_until_idle();
    assert!(!d.engine.is_reshaping());
    assert_eq!(d.members.superblock(key).dev_number, own, "the joining spare's own dev_number");
    for k in 1..=key {
        let sb = d.members.superblock(k);
        assert_eq!(sb.dev_roles[0], role::FAULTY, "member {k}: the failed member's entry");
        assert_eq!(sb.dev_roles[own as usize], 4, "member {k}: the joining spare's entry");
    }
}

#[test]
fn a_grow_with_a_bitmap_serves_throughout_survives_a_cut_and_keeps_its_bitmap() {
    let seed = 72;
    let mm = create_level(6, 5, MEMBER_BYTES, true);
    let mut d = start_array(mm, &[0, 1, 2, 3, 4], seed);
    let size = d.engine.engine().size_bytes() as usize;
    let mut model = vec![0u8; size];
    Rng(seed).fill(&mut model);
    for (i, chunk) in model.chunks(1 << 20).enumerate() {
        assert!(d.run_one(Request::write(1000 + i as u64, (i << 20) as u64, chunk.to_vec())).is_ok());
    }
    let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xA0);
    d.engine.add_member(new, d.now_ns).unwrap();
    d.run_until_idle();
    grow_to(&mut d, 6);
    // Clients until the reshape is half done, then the power goes.
    let mut clients = Clients::new(seed);
    let mut steps = 0;
    while d.engine.reshape_progress().is_some_and(|(p, e)| p * 2 < e) {
        clients.issue(&mut d, size as u64);
        d.engine.unplug(d.now_ns);
        step_slow_metadata(&mut d, steps);
        let _ = clients.collect(&mut d, &mut model);
        steps += 1;
    }
    let keys: Vec<usize> = (0..6).collect();
    let (mut d, got) = restart_after_cut(d, &clients, &keys, seed + 1000, &model, "raid6 grow with a bitmap");
    assert_eq!(d.engine.engine().geometry().raid_disks, 6);
    d.engine.scrub(Some(ScrubKind::Check), d.now_ns).unwrap();
    d.run_until_idle();
    assert_eq!(d.engine.engine().mismatch_cnt(), 0, "check after the resumed reshape");
    // The bitmap is still there, for md and for the next start.
    let sb = d.members.superblock(5);
    assert!(sb.bitmap_sector().is_some() && !sb.has(feature::RESHAPE_ACTIVE), "{sb:?}");
    let mut again = start_array(std::mem::replace(&mut d.members, MemMembers::new(0, 0)), &keys, seed + 2);
    assert!(read_all(&mut again, size as u64) == got, "a fresh assembly reads the same bytes");
}

#[test]
fn a_write_error_logged_as_a_reshape_starts_fails_the_member_rather_than_lose_the_range() {
    // A write in flight when the grow is asked for fails on member 1, whose bad-block log
    // takes the range while the old engine still runs; the reshape's engines carry no logs,
    // so that member must leave the array, or its stale range would be read (and copied
    // into the new layout).
    struct IssueOnly<'a>(&'a mut Vec<MemberIo>);
    impl uraid_core::drive::MemberExecutor for IssueOnly<'_> {
        fn issue(&mut self, io: MemberIo) {
            self.0.push(io);
        }
        fn poll(&mut self, _: &mut Vec<MemberIoCompletion>) {}
    }
    let (mut d, _) = array_with_spare(5, 4, 73);
    d.engine.set_tunable("sync_speed_max", "1000").unwrap();
    let data = vec![0x77u8; 1 << 20];
    // The array marked dirty first, so the write's own member I/O goes out at once.
    d.submit(Request::write(8, 0, vec![1; 4096]));
    while d.take_done(8).is_none() {
        d.step();
    }
    d.submit(Request::write(9, 4 << 20, data.clone()));
    let now = d.now_ns;
    let done = &mut d.done;
    uraid_core::drive::pump(
        &mut d.engine,
        &mut IssueOnly(&mut d.pending),
        &mut || now,
        &mut Vec::new(),
        |c| done.push(c),
    );
    assert!(!d.pending.is_empty(), "the write's member I/O is out");
    grow_to(&mut d, 5);
    // Member 1's data writes fail, not its superblock's.
    let data_start = d.members.superblock(1).data_offset * 512;
    d.members.write_errors.push((1, data_start, MEMBER_BYTES));
    let mut steps = 0;
    while d.take_done(9).is_none() {
        d.step();
        steps += 1;
        assert!(steps < 100_000, "the write never completed");
    }
    d.members.write_errors.clear();
    let mut notices = Vec::new();
    while let Some(n) = d.engine.pop_notice() {
        notices.push(n);
    }
    assert!(notices.iter().any(|n| n.contains("member in slot 1 failed")), "the write failed: {notices:?}");
    d.submit(Request::read(10, 4 << 20, 1 << 20));
    let got = loop {
        if let Some(c) = d.take_done(10) {
            break c.result.unwrap();
        }
        d.step();
    };
    assert!(d.engine.is_reshaping(), "read while the reshape runs");
    assert!(got == data, "the write reads back while the reshape runs");
    assert_eq!(d.engine.engine().member_states()[1], MemberState::Faulty, "{notices:?}");
}

#[test]
fn a_member_back_during_or_after_a_grow_is_rebuilt_in_full_not_from_the_bitmap() {
    // The bitmap counts writes, not the rows a reshape moves: a member that was away for
    // part of a grow (here: it comes back with what it held a quarter of the way in, its
    // superblock still naming its slot) missed windows no bit names, whether it comes back
    // while the grow still runs or after it ended. (Seen: back while it ran, it was re-added
    // from the bitmap with nothing to copy.)
    for back_after_the_end in [false, true] {
        member_back_from_part_way_through_a_grow(back_after_the_end);
    }
}

fn member_back_from_part_way_through_a_grow(back_after_the_end: bool) {
    let mm = create_level(5, 4, MEMBER_BYTES, true);
    let mut d = start_array(mm, &[0, 1, 2, 3], 74);
    let size = d.engine.engine().size_bytes() as usize;
    let mut model = vec![0u8; size];
    Rng(74).fill(&mut model);
    assert!(d.run_one(Request::write(1, 0, model.clone())).is_ok());
    let new = prepare_new_member(&mut d, MEMBER_BYTES, 0xA0);
    d.engine.add_member(new, d.now_ns).unwrap();
    d.run_until_idle();
    d.engine.set_tunable("sync_speed_max", "2000").unwrap();
    grow_to(&mut d, 5);
    while d.engine.reshape_progress().is_none_or(|(p, e)| p * 4 < e) {
        d.step();
    }
    let away = d.members.images[2].clone();
    while d.engine.reshape_progress().is_none_or(|(p, e)| p * 2 < e) {
        d.step();
    }
    d.engine.fail(2, false, d.now_ns).unwrap();
    for _ in 0..200 {
        d.step();
    }
    d.engine.remove(2, d.now_ns).unwrap();
    if back_after_the_end {
        d.run_until_idle();
    } else {
        for _ in 0..200 {
            d.step();
        }
    }
    assert_eq!(d.engine.is_reshaping(), !back_after_the_end);
    d.members.images[2] = away;
    let previous = d.members.metadata(2);
    let old_sb = previous.offered.superblock.clone().unwrap();
    assert_eq!(old_sb.role(), 2, "it comes back naming its slot");
    let sb = d.engine.new_member_superblock(MEMBER_BYTES / 512, old_sb.device_uuid, "m2").unwrap();
    let mut sb_w = sb.clone();
    d.members.write_at(2, sb.super_offset * 512, &sb_w.update_csum());
    let (off, area) = d.engine.bitmap_area().unwrap();
    d.members.write_at(2, (sb.super_offset as i64 + i64::from(off)) as u64 * 512, &area);
    let back = uraid_core::array::NewMember {
        key: 2,
        name: "m2".into(),
        sb,
        previous: Some(old_sb),
        replaces: None,
        bad_blocks: previous.bad_blocks.unwrap(),
    };
    let added = d.engine.add_member(back, d.now_ns).unwrap();
    assert!(
        !matches!(&added, uraid_core::array::Added::Rebuilding { readd: Ok(_), .. }),
        "rebuilt from the bitmap (back after the end: {back_after_the_end}): {added:?}"
    );
    d.run_until_idle();
    assert!(!d.engine.is_reshaping());
    assert!(d.engine.engine().member_states().iter().all(|s| *s == MemberState::InSync));
    // Member 2 must now stand for the others.
    d.engine.fail(0, false, d.now_ns).unwrap();
    d.run_until_idle();
    assert!(read_all(&mut d, size as u64) == model, "the member back is a full copy ({back_after_the_end})");
}

#[test]
fn takeovers_keep_an_internal_bitmap_and_count_writes_in_it() {
    use uraid_core::geometry::Level;
    use uraid_core::meta::bitmap::array_range_to_sync_range;
    // md keeps the bitmap through these (raid1 of two to raid5 and back, raid6 to raid5
    // once Q is on the last member); raid0 cannot keep one.
    for (level, n, to, seed) in
        [(1, 2usize, Level::Raid5, 41u64), (5, 2, Level::Raid1, 42), (6, 5, Level::Raid5, 43)]
    {
        let mm = create_level(level, n, MEMBER_BYTES, true);
        let keys: Vec<usize> = (0..n).collect();
        let mut d = start_array(mm, &keys, seed);
        let size = d.engine.engine().size_bytes() as usize;
        let mut model = vec![0u8; size];
        Rng(seed).fill(&mut model);
        assert!(d.run_one(Request::write(1, 0, model.clone())).is_ok());
        let what = format!("raid{level} of {n} to {to:?} with a bitmap");
        if level == 6 {
            change_layout(&mut d, "left-symmetric-6");
            serve_until_reshaped(&mut d, &mut model, seed * 3);
        }
        let cur = d.engine.grow_current(MEMBER_BYTES / 512);
        let plan = grow_plan(&cur, &GrowRequest { level: Some(to), ..Default::default() }).unwrap();
        d.engine.may_grow(&plan).unwrap_or_else(|e| panic!("{what}: {e:?}"));
        d.engine.grow(&plan, d.now_ns).unwrap();
        serve_until_level(&mut d, &mut model, seed * 5, to, &what);
        // A write now counts in the bitmap by the new level's rows.
        let at = size as u64 / 2 / 4096 * 4096;
        d.submit(Request::write(2, at, vec![0x3c; 4096]));
        while d.take_done(2).is_none() {
            d.step();
        }
        model[at as usize..at as usize + 4096].fill(0x3c);
        let g = d.engine.engine().geometry().clone();
        let (s, _) = array_range_to_sync_range(
            g.level.md_level(),
            g.raid_disks as u32,
            g.chunk_sectors as u32,
            at / 512,
            8,
        );
        assert!(bit_on_disk(&d, 0, s), "{what}: the write's bit");
        d.run_until_idle();
        let members = std::mem::replace(&mut d.members, MemMembers::new(0, 0));
        let sb = members.superblock(0);
        assert!(sb.level == to.md_level() && sb.bitmap_sector().is_some(), "{what}: {sb:?}");
        let keys: Vec<usize> = (0..members.images.len()).collect();
        let mut again = start_array(members, &keys, seed + 100);
        assert!(read_all(&mut again, size as u64) == model, "{what}: after assembly");
    }
    // raid4 without its parity member to raid0: refused while the bitmap is there.
    let d = start_array(create_level(4, 4, MEMBER_BYTES, true), &[0, 1, 2], 44);
    let cur = d.engine.grow_current(MEMBER_BYTES / 512);
    let plan = grow_plan(&cur, &GrowRequest { level: Some(Level::Raid0), ..Default::default() }).unwrap();
    let e = d.engine.may_grow(&plan).unwrap_err();
    assert!(format!("{e:?}").contains("bitmap"), "{e:?}");
}
