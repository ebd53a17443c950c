//! The random-workload checker behind `uraid sim`: a random workload with random faults
//! against any level, layout and member count on simulated disks, every read checked
//! against a reference model (`model.rs`), then a power cycle: crash, re-assemble, rebuild,
//! maybe a second power cut during the rebuild, and a full check again (`cycle.rs`).
//!
//! The array runs as under `uraid serve`: created as `uraid create` does, started from
//! what the members hold through the same assembly and `uraid_core::array::Array`, its
//! superblock, bitmap and log writes member I/O beside the data's, so faults and power
//! cuts fall on them too.
//!
//! md's RAID5/6 write hole is the one known exception: a power loss while degraded, or a
//! member lost after it before resync restored parity, can damage other blocks of a stripe
//! that was being written. Exactly that combination is counted as write-hole exposure, not
//! as a failure.

use uraid_core::array::Array;
use uraid_core::geometry::{algorithm, layout_name, parse_layout};
use uraid_core::rng::Rng;
use uraid_core::*;

use super::array::{MetaTrap, MetaTrapHow, RunOutcome, SimArray};
use super::disks::{Fault, FaultKind, FaultTrigger, SimDisks, SimMemberConfig};
use super::meta::{assemble_members, create_on_disks, member_superblock, start_array};
use super::store::PowerLossPolicy;
use model::{pattern, settle, verify_all, Inflight, Model, SECTOR};

mod cycle;
mod grow;
mod members;
mod model;
mod spec;
#[cfg(test)]
mod tests;

use spec::{
    seed_pick, Run, BITMAP_AREA_BYTES, DATA_OFFSET_BYTES, MEMBER_TIMEOUT_NS, SUPERBLOCK_OFFSET_BYTES,
};
pub use spec::{SimReport, SimSpec, DRAWS};

/// No request completing for this long in virtual time is a hang: the member timeout fails
/// a silent member, and a retry or a round after it, long before.
const NO_PROGRESS_LIMIT_NS: u64 = 60_000_000_000;

/// Uniform pick from `v`.
fn pick<T: Copy>(rng: &mut Rng, v: &[T]) -> T {
    v[rng.below(v.len() as u64) as usize]
}

fn choose_shape(spec: &SimSpec, rng: &mut Rng) -> Result<(Level, usize, u32, u64), String> {
    let level = spec.level.unwrap_or_else(|| {
        pick(rng, &[Level::Raid0, Level::Raid1, Level::Raid10, Level::Raid4, Level::Raid5, Level::Raid6])
    });
    let n = spec.raid_devices.unwrap_or_else(|| match level {
        Level::Raid0 => 2 + rng.below(4) as usize,
        Level::Raid1 => 2 + rng.below(2) as usize,
        Level::Raid10 => 3 + rng.below(4) as usize,
        Level::Raid4 | Level::Raid5 => 3 + rng.below(4) as usize,
        Level::Raid6 => 4 + rng.below(5) as usize,
    });
    let layout = match &spec.layout {
        Some(l) => parse_layout(level, l)?,
        None => match level {
            Level::Raid0 => uraid_core::geometry::RAID0_ORIG_LAYOUT,
            Level::Raid1 => 0,
            Level::Raid10 => parse_layout(level, pick(rng, &["n2", "f2", "o2"]))?,
            Level::Raid4 => algorithm::PARITY_N,
            Level::Raid5 => rng.below(6) as u32,
            Level::Raid6 => pick(rng, &[0u32, 1, 2, 3, 4, 5, 8, 9, 10, 16, 17, 18, 19, 20]),
        },
    };
    let chunk = spec.chunk_bytes.unwrap_or_else(|| 4096 << rng.below(6));
    Ok((level, n, layout, chunk))
}

fn survivable(level: Level, geo: &Geometry) -> usize {
    match level {
        Level::Raid10 => 1.min(geo.redundancy()),
        _ => geo.redundancy(),
    }
}

pub fn run_sim(spec: &SimSpec) -> SimReport {
    let mut rng = Rng::derive(spec.seed, 0x5eed);
    let mut report = SimReport { seed: spec.seed, ..SimReport::default() };
    let result = run_inner(spec, &mut rng, &mut report);
    report.ok = result.is_ok();
    report.failure = result.err();
    let mut cmd = format!("uraid sim --seed {} --ops {} --profile {}", spec.seed, spec.ops, spec.profile);
    if let Some(l) = spec.level {
        cmd += &format!(" --level {}", l.md_level());
    }
    if let Some(n) = spec.raid_devices {
        cmd += &format!(" --raid-devices {n}");
    }
    if let Some(l) = &spec.layout {
        cmd += &format!(" --layout {l}");
    }
    if let Some(c) = spec.chunk_bytes {
        cmd += &format!(" --chunk {}K", c >> 10);
    }
    if let Some(q) = spec.queue_depth {
        cmd += &format!(" --queue-depth {q}");
    }
    if spec.member_bytes != 16 << 20 {
        cmd += &format!(" --member-size {}", spec.member_bytes);
    }
    if !spec.faults {
        cmd += " --no-faults";
    }
    if spec.plant_bug {
        cmd += " --plant-bug";
    }
    report.reproduce = cmd;
    report
}

fn run_inner(spec: &SimSpec, rng: &mut Rng, report: &mut SimReport) -> Result<(), String> {
    let (level, n, layout, chunk_bytes) = choose_shape(spec, rng)?;
    // Three seeds in four get an internal bitmap with small chunks (so it limits the
    // resync after the power cycle); decided by the seed, not the rng, which keeps the
    // workload of each seed as it was.
    let bitmap_chunk = (level != Level::Raid0 && !spec.seed.is_multiple_of(4)).then_some(64 << 10);
    // Half the RAID5 seeds without a bitmap keep md's partial parity log instead.
    let ppl = level == Level::Raid5 && bitmap_chunk.is_none() && seed_pick(spec.seed, 0x9971, 2) == 0;
    let data_offset_bytes = if ppl { 2 * DATA_OFFSET_BYTES } else { DATA_OFFSET_BYTES };
    // Half the restripes (by the seed alone) run on members whose component size leaves
    // twice the data offset unused after the data: mdadm then moves the data up and md
    // reshapes backwards.
    let room_after = grow::draw_room_after(spec, level, ppl);
    let unused_after = if room_after { 2 * DATA_OFFSET_BYTES } else { 0 };
    let member_sectors = (spec.member_bytes - data_offset_bytes - unused_after) / SECTOR;
    let geo = Geometry::new(level, n, layout, chunk_bytes / SECTOR, &vec![member_sectors; n])?;
    report.level = level.md_level();
    report.raid_devices = n;
    report.layout = layout_name(level, layout);
    report.chunk_bytes = if level == Level::Raid1 { 0 } else { chunk_bytes };
    let qd = spec.queue_depth.unwrap_or_else(|| 1 + rng.below(16) as usize);
    report.queue_depth = qd;
    let tunables = Tunables {
        stripe_cache_size: pick(rng, &[17usize, 32, 256]),
        rmw_level: rng.below(3) as u8,
        write_batching: rng.below(4) != 0,
        balance: pick(
            rng,
            &[
                mirror::Balance::Load,
                mirror::Balance::RoundRobin,
                mirror::Balance::LoadTime,
                mirror::Balance::Split,
                mirror::Balance::Prefer,
            ],
        ),
        // md's pacing in one seed in four, the adaptive default in the rest (by the seed).
        sync_policy: if seed_pick(spec.seed, 0x5c01, 4) == 0 { SyncPolicy::Md } else { SyncPolicy::Adaptive },
        ..Tunables::default()
    };
    // One seed in four with redundancy has one or two hot spares (by the seed alone).
    let spares = if level != Level::Raid0 && seed_pick(spec.seed, 0x5a4e, 4) == 0 {
        1 + seed_pick(spec.seed, 0x5a4f, 2) as usize
    } else {
        0
    };
    // One seed in five with redundancy replaces a member while the workload runs (`uraid
    // replace`, md's want_replacement) onto a blank disk of its own, after the spares.
    let replace = (level != Level::Raid0 && seed_pick(spec.seed, 0x7e91, 5) == 0).then(|| {
        (
            spec.ops / 8 + seed_pick(spec.seed, 0x7e92, spec.ops as u64 / 2) as usize,
            seed_pick(spec.seed, 0x7e93, n as u64) as usize,
        )
    });
    // Its own disk, after the replacement's.
    let grow = grow::draw(
        spec,
        level,
        geo.layout,
        geo.chunk_sectors,
        ppl,
        n + spares + usize::from(replace.is_some()),
    );
    let disk_count =
        n + spares + usize::from(replace.is_some()) + usize::from(grow.is_some_and(|g| g.kind.takes_disk()));
    let sims: Vec<SimMemberConfig> = (0..disk_count)
        .map(|_| SimMemberConfig::builtin(&spec.profile, spec.member_bytes))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut disks = SimDisks::new(sims, spec.seed).map_err(|e| e.to_string())?;
    // Half the RAID1 seeds with a bitmap make their last member write-mostly with md's
    // write-behind, up to 1..=8 writes (by the seed alone, as above).
    let write_behind =
        (level == Level::Raid1 && bitmap_chunk.is_some() && seed_pick(spec.seed, 0x3b1d, 2) == 0)
            .then(|| (n - 1, 1 + seed_pick(spec.seed, 0x3b1e, 8) as u32));
    if write_behind.is_some() {
        report.draws.push(DRAWS[9]);
    }
    create_on_disks(
        &mut disks,
        &geo,
        spec.member_bytes,
        data_offset_bytes,
        bitmap_chunk,
        ppl,
        spec.seed,
        write_behind,
    )?;
    // Started as `uraid serve` starts it: from what the members hold.
    let (plan0, offered0) = assemble_members(&disks).map_err(|e| format!("assembly: {e}"))?;
    let mut first = start_array(&disks, &plan0, &offered0, tunables.clone())?;
    first.engine_mut().plant_bug_skip_rmw_parity(spec.plant_bug);
    let redundancy = survivable(level, &geo);
    let mut run = Run {
        spec,
        level,
        n,
        layout,
        geo,
        chunk_sectors: chunk_bytes / SECTOR,
        tunables,
        redundancy,
        planned_failures: 0,
        latent_planted: false,
        erroring: vec![false; disk_count],
        dropped: vec![false; disk_count],
        replace,
        spares,
        ppl,
        data_offset_bytes,
        queue_depth: qd,
        // One seed in three, by the seed alone (no rng draw: the others keep their runs).
        unaligned: seed_pick(spec.seed, 0x0da1, 3) == 0,
        // One seed in four with redundancy (by the seed alone, as above).
        scrub: (level != Level::Raid0 && seed_pick(spec.seed, 0x5c2b, 4) == 0).then(|| {
            let at = spec.ops / 8 + seed_pick(spec.seed, 0x5c2c, spec.ops as u64 / 2) as usize;
            (at, if seed_pick(spec.seed, 0x5c2d, 2) == 0 { ScrubKind::Check } else { ScrubKind::Repair })
        }),
        readd_bad_blocks: None,
        meta_trap: None,
        grow,
        grown: None,
    };
    if run.unaligned {
        report.draws.push(DRAWS[0]);
    }
    if run.ppl {
        report.draws.push(DRAWS[5]);
    }
    let mut power_loss_at_request = plan_faults(&mut run, &mut disks, rng, report);
    run.readd_bad_blocks = members::plan_readd_bad_blocks(&run);
    if let Some((wm, _)) = write_behind.filter(|(wm, _)| run.readd_bad_blocks.is_none_or(|r| r.member != *wm))
    {
        // The write-mostly leg is the slow (remote) one: its behind writes stay in flight
        // long enough for flushes, bitmap passes, failures and the power cut to meet them.
        // Not when the re-add draw fails and re-adds it: its late I/O would still drain
        // then, and the array rightly keeps it a spare until it has.
        let latency_percent = 1000 + 1000 * seed_pick(spec.seed, 0x3b1f, 5) as u32;
        disks.schedule(Fault {
            trigger: FaultTrigger::AtNs(0),
            member: wm,
            kind: FaultKind::Slow { latency_percent },
        });
        report.faults.push(format!("write-mostly member {wm} slow (x{})", latency_percent / 100));
    }
    if let Some(r) = run.readd_bad_blocks {
        report.faults.push(format!(
            "data write errors member {} bytes {}+{} from request {} to {}, then failed and re-added at \
             request {}",
            r.member, r.offset_bytes, r.len_bytes, r.errors_at, r.fail_at, r.readd_at
        ));
    }
    if let Some(at) = members::cut_during_replace(&run) {
        power_loss_at_request = Some(power_loss_at_request.map_or(at, |p| p.min(at)));
        report.faults.push(format!("power loss at request {at} (during the replacement)"));
    }
    let mut model = Model::new(run.geo.array_sectors());
    let mut array = SimArray::new(first, disks);
    if let Some(trap) = run.meta_trap {
        array.set_meta_trap(trap);
    }
    members::add_spares(&run, &mut array, report)?;
    // Member queues merge what the engine sends at once (as under md): splitting the merged
    // completions back is checked here too.
    array.set_member_merging(true);
    let mut next_id = 1u64;
    let (crashed, inflight) =
        workload(&mut run, &mut array, &mut model, rng, power_loss_at_request, &mut next_id, report)?;
    report.requests = next_id - 1;
    if array.engine().engine().is_failed() {
        return Err("the array failed although faults stayed within its redundancy".into());
    }
    if !crashed && array.engine().sync_kind().is_some_and(|k| matches!(k, SyncKind::Scrub(_))) {
        // A check or repair still running ends before the read-back, and is judged.
        match array.run_until_idle() {
            RunOutcome::Idle => scrub_judged(&array, report)?,
            RunOutcome::PowerLost { .. } => {}
            other => return Err(format!("the scrub after the workload ended {other:?}")),
        }
    }
    if !crashed {
        // The whole array must read back as the model says, then the power is cut anyway.
        let mut buf = vec![0u8; SECTOR as usize];
        verify_all(&mut array, &model, &mut next_id, &mut buf)?;
    }
    grow::note_at_cut(&array, report);
    cycle::power_cycle(&run, array, &mut model, inflight, rng, report, next_id)
}

/// Faults within what the level survives: members that fail (stop, drop out, give write
/// or flush errors), a latent sector, a slow member, and where the power is cut (at a
/// request, returned, or at a member-I/O count, scheduled).
fn plan_faults(run: &mut Run, disks: &mut SimDisks, rng: &mut Rng, report: &mut SimReport) -> Option<usize> {
    let (spec, n) = (run.spec, run.n);
    let member_sectors = run.geo.member_sectors[0];
    let bitmap_at = member_superblock(disks, 0).and_then(|sb| sb.bitmap_sector()).map(|s| s * SECTOR);
    if spec.faults && run.redundancy > 0 {
        run.planned_failures = rng.below(run.redundancy as u64 + 1) as usize;
        let mut victims: Vec<usize> = (0..n).collect();
        for k in 0..run.planned_failures {
            let i = k + rng.below((n - k) as u64) as usize;
            victims.swap(k, i);
            let at = 50 + rng.below(spec.ops as u64);
            let m = victims[k];
            // The first failure falls on one of the member's metadata I/Os instead, for one
            // seed in three (by the seed alone): a round in flight meets it.
            if k == 0 && seed_pick(spec.seed, 0x3e7a, 3) == 0 {
                let how = match seed_pick(spec.seed, 0x3e7b, 3) {
                    0 => {
                        run.erroring[m] = true;
                        MetaTrapHow::WriteError
                    }
                    1 => MetaTrapHow::FailStop,
                    _ => {
                        run.dropped[m] = true;
                        MetaTrapHow::Dropped
                    }
                };
                // With a second failure planned, half count only once another member
                // failed: the round that records that failure meets this one.
                let after_failure = run.planned_failures >= 2 && seed_pick(spec.seed, 0x3e7c, 2) == 0;
                // Half count only superblock writes (most metadata I/O is the bitmap's):
                // the first is the dirty-marking round's, or the one recording the failure.
                let superblocks = after_failure || seed_pick(spec.seed, 0x3e7e, 2) == 0;
                let skip = match (after_failure, superblocks) {
                    (true, _) => 0,
                    (false, true) => seed_pick(spec.seed, 0x3e7d, 4),
                    (false, false) => seed_pick(spec.seed, 0x3e7d, 40),
                };
                let only_at = superblocks.then_some(SUPERBLOCK_OFFSET_BYTES);
                run.meta_trap = Some(MetaTrap { member: m, skip, how, after_failure, only_at });
                report.faults.push(format!(
                    "{how:?} on member {m} at its {} {skip}{}",
                    if superblocks { "superblock write" } else { "metadata I/O" },
                    if after_failure { " after another member failed" } else { "" }
                ));
                continue;
            }
            // How the member goes, by the seed (no rng draw: each seed keeps its workload).
            let (kind, what) = match seed_pick(spec.seed, 0xfa11 + k as u64, 8) {
                // One fail-stop in three is a member that stops answering instead: its I/Os
                // are held until the member timeout answers them `Gone` and fails it.
                0..=2 if seed_pick(spec.seed, 0x4a96 + k as u64, 3) == 0 => {
                    if !report.draws.contains(&DRAWS[2]) {
                        report.draws.push(DRAWS[2]);
                    }
                    (
                        FaultKind::Hang { timeout_ns: MEMBER_TIMEOUT_NS },
                        format!("I/Os never completing (failed after a {MEMBER_TIMEOUT_NS} ns timeout) on"),
                    )
                }
                0..=2 => (FaultKind::FailStop, "fail-stop".to_string()),
                3 => {
                    run.dropped[m] = true;
                    (FaultKind::Dropped, "dropped (comes back at the power cycle)".to_string())
                }
                7 => {
                    run.erroring[m] = true;
                    (FaultKind::FlushErrors, "flush errors on".to_string())
                }
                choice => {
                    run.erroring[m] = true;
                    let (offset_bytes, len_bytes, area) = match (choice, bitmap_at) {
                        // Half of the data area, where the seed says.
                        (4, _) => {
                            let half = (member_sectors / 2) * SECTOR;
                            let at = seed_pick(spec.seed, 0xda7a + k as u64, member_sectors / 2) * SECTOR;
                            (run.data_offset_bytes + at, half, "data")
                        }
                        (6, Some(at)) => (at, BITMAP_AREA_BYTES, "bitmap"),
                        _ => (SUPERBLOCK_OFFSET_BYTES, 4096, "superblock"),
                    };
                    (FaultKind::WriteErrors { offset_bytes, len_bytes }, format!("{area} write errors on"))
                }
            };
            disks.schedule(Fault { trigger: FaultTrigger::AfterMemberIos(at), member: m, kind });
            report.faults.push(format!("{what} member {m} after {at} I/Os"));
        }
        if run.planned_failures < run.redundancy && rng.below(2) == 0 {
            run.latent_planted = true;
            let m = rng.below(n as u64) as usize;
            let off = run.data_offset_bytes + rng.below(member_sectors - 64) * SECTOR;
            let len = SECTOR * (1 + rng.below(16));
            disks.schedule(Fault {
                trigger: FaultTrigger::AtNs(0),
                member: m,
                kind: FaultKind::LatentErrors { offset_bytes: off, len_bytes: len },
            });
            report.faults.push(format!("latent errors member {m} bytes {off}+{len}"));
        }
        if rng.below(3) == 0 {
            let m = rng.below(n as u64) as usize;
            disks.schedule(Fault {
                trigger: FaultTrigger::AtNs(0),
                member: m,
                kind: FaultKind::Slow { latency_percent: 400 },
            });
            report.faults.push(format!("slow member {m} (x4)"));
        }
    }
    // The power is cut mid-workload (requests in flight) or, failing that, after it.
    let at_request = (spec.faults && rng.below(2) == 0)
        .then(|| spec.ops / 4 + rng.below(spec.ops as u64 * 3 / 4) as usize);
    if let Some(at) = at_request {
        report.faults.push(format!("power loss at request {at}"));
    } else if spec.faults && spec.seed.is_multiple_of(3) {
        // Or at a member-I/O count, which can fall inside a metadata round (decided by
        // the seed, not the rng, which keeps each seed's workload as it was).
        let at = 20 + spec.seed.wrapping_mul(7919) % 1500;
        disks.schedule(Fault {
            trigger: FaultTrigger::AfterMemberIos(at),
            member: 0,
            kind: FaultKind::PowerLoss(PowerLossPolicy::default()),
        });
        report.faults.push(format!("power loss after {at} member I/Os"));
    }
    at_request
}

/// A check or repair that ran while writes went on, on an array created consistent, every
/// member in sync throughout and nothing listed bad: it must find nothing (a mismatch there
/// is a write it raced, or a block it misread). Otherwise it is only recorded.
fn scrub_judged(array: &SimArray<Array>, report: &mut SimReport) -> Result<(), String> {
    if !report.faults.iter().any(|f| f.starts_with("scrub ") && f.ends_with("started")) {
        return Ok(());
    }
    let engine = array.engine().engine();
    let whole = engine.member_states().iter().all(|s| *s == MemberState::InSync)
        && (0..array.disks().member_count()).all(|m| !array.disks().is_failed(m))
        && (0..array.disks().member_count()).all(|m| {
            crate::meta::member_metadata(array.disks(), m)
                .bad_blocks
                .ok()
                .flatten()
                .is_none_or(|b| b.is_empty())
        });
    let mismatches = engine.mismatch_cnt();
    report.faults.push(format!("scrub finished, mismatch_cnt {mismatches}"));
    if whole && mismatches > 0 {
        return Err(format!(
            "a check/repair of a consistent array, run while writes went on, counted {mismatches} mismatched sectors"
        ));
    }
    Ok(())
}

/// The random workload up to `spec.ops` requests (fewer when the power is cut first),
/// every read checked against the model. Returns whether the power was cut, and the
/// requests still in flight (their completions may come out of the crash).
fn workload(
    run: &mut Run,
    array: &mut SimArray<Array>,
    model: &mut Model,
    rng: &mut Rng,
    power_loss_at_request: Option<usize>,
    next_id: &mut u64,
    report: &mut SimReport,
) -> Result<(bool, Inflight), String> {
    let (spec, qd) = (run.spec, run.queue_depth);
    let stripe_sectors = run.chunk_sectors * run.n as u64;
    let mut inflight: Inflight = Vec::new();
    let mut issued = 0usize;
    let mut buf = vec![0u8; SECTOR as usize];
    // The byte-granular requests' own stream: the main one draws as it did without them.
    let mut urng = Rng::derive(spec.seed, 0x0da2);
    // Bytes `[off, off + len)` within sectors `[s0, s0 + len)`, cut short at either end.
    let mut unaligned = |s0: u64, len: u64, one_in: u64| {
        (run.unaligned && urng.below(one_in) == 0).then(|| {
            let head = urng.below(SECTOR);
            let tail = urng.below(SECTOR - if len == 1 { head } else { 0 });
            (s0 * SECTOR + head, len * SECTOR - head - tail)
        })
    };
    let mut scrub = run.scrub;
    let mut scrubbing = false;
    let mut replace = run.replace;
    let mut readd = run.readd_bad_blocks.map(|r| (r, members::ReaddStep::Planned));
    let mut grow = run.grow;
    // A request that waits this long in virtual time waits forever (the member timeout
    // fails a silent member long before): a hang is reported, not spun on.
    let mut last_progress_ns = array.now_ns();
    let mut grow_added = false;
    loop {
        if let Some(g) = grow.filter(|g| issued >= g.at_request) {
            // Asked for again while md would refuse it (degraded, a sync or a replacement
            // running), up to three quarters of the workload; the spare joins a whole array.
            if issued >= spec.ops * 3 / 4 {
                grow = None;
                report.faults.push("the grow never started".into());
            } else if !array.engine().engine().is_degraded()
                && grow::try_start(run, &g, &mut grow_added, array, report)?
            {
                grow = None;
                run.grown = Some(grow::grown_shape(run, &g, array.engine()));
            }
        }
        if let Some((plan, step)) = &mut readd {
            members::readd_step(plan, step, array, issued, report)?;
        }
        if let Some((at, slot)) = replace.filter(|&(at, _)| issued >= at) {
            replace = None;
            members::start_replace(run, array, at, slot, report);
        }
        if let Some((at, kind)) = scrub.filter(|&(at, _)| issued >= at) {
            scrub = None;
            report.draws.push(DRAWS[3]);
            let now = array.now_ns();
            // md refuses one while a resync or recovery runs, or on a degraded array.
            match array.engine_mut().scrub(Some(kind), now) {
                Ok(()) => {
                    scrubbing = true;
                    report.faults.push(format!("scrub {kind:?} at request {at} started"));
                }
                Err(e) => report.faults.push(format!("scrub {kind:?} at request {at} refused: {e}")),
            }
        }
        if scrubbing && !array.engine().sync_kind().is_some_and(|k| matches!(k, SyncKind::Scrub(_))) {
            scrubbing = false;
            scrub_judged(array, report)?;
        }
        // Top up to the queue depth; flushes wait for an empty queue (barriers).
        while inflight.len() < qd && issued < spec.ops {
            if inflight.iter().any(|x| x.3 == RequestOp::Flush) {
                break;
            }
            let roll = rng.below(100);
            if roll < 4 {
                if !inflight.is_empty() {
                    break;
                }
                array.submit(Request::flush(*next_id));
                inflight.push((*next_id, 0, 0, RequestOp::Flush));
                *next_id += 1;
                issued += 1;
                break;
            }
            let sectors = model.sectors();
            let len = match rng.below(4) {
                0 => 1 + rng.below(8),
                1 => 8,
                2 => 1 + rng.below(64),
                _ => 1 + rng.below(2 * stripe_sectors),
            }
            .min(sectors);
            let s0 = rng.below(sectors - len + 1);
            if inflight.iter().any(|&(_, a, b, op)| op != RequestOp::Flush && a < s0 + len && s0 < b) {
                break;
            }
            let id = *next_id;
            *next_id += 1;
            issued += 1;
            let op = match roll {
                4..=49 => RequestOp::Read,
                50..=89 => RequestOp::Write,
                90..=94 => RequestOp::Trim,
                _ => RequestOp::WriteZeroes,
            };
            let req = match op {
                RequestOp::Read => match unaligned(s0, len, 3) {
                    Some((off, bytes)) => {
                        model.unaligned_reads.insert(id, (off, bytes));
                        Request::read(id, off, bytes)
                    }
                    None => Request::read(id, s0 * SECTOR, len * SECTOR),
                },
                RequestOp::Write => {
                    let w = id as u32;
                    let mut data = vec![0u8; (len * SECTOR) as usize];
                    for (k, c) in data.chunks_mut(SECTOR as usize).enumerate() {
                        pattern(w, s0 + k as u64, c);
                    }
                    let mut r = match unaligned(s0, len, 2) {
                        Some((off, bytes)) => {
                            model.write_bytes(w, off, bytes);
                            let at = (off - s0 * SECTOR) as usize;
                            Request::write(id, off, data[at..at + bytes as usize].to_vec())
                        }
                        None => {
                            model.write(w, s0, len);
                            Request::write(id, s0 * SECTOR, data)
                        }
                    };
                    r.fua = rng.below(20) == 0;
                    r
                }
                RequestOp::Trim => {
                    model.write(0, s0, len);
                    Request::trim(id, s0 * SECTOR, len * SECTOR)
                }
                _ => match unaligned(s0, len, 2) {
                    Some((off, bytes)) => {
                        model.write_bytes(0, off, bytes);
                        Request::write_zeroes(id, off, bytes)
                    }
                    None => {
                        model.write(0, s0, len);
                        Request::write_zeroes(id, s0 * SECTOR, len * SECTOR)
                    }
                },
            };
            array.submit(req);
            inflight.push((id, s0, s0 + len, op));
        }
        if inflight.is_empty() && issued >= spec.ops {
            return Ok((false, inflight));
        }
        if power_loss_at_request.is_some_and(|at| issued >= at) {
            return Ok((true, inflight));
        }
        let outcome = array.run_until(array.now_ns() + 200_000);
        let done = array.take_completions();
        if !done.is_empty() || inflight.is_empty() {
            last_progress_ns = array.now_ns();
        } else if array.now_ns() - last_progress_ns > NO_PROGRESS_LIMIT_NS {
            return Err(format!(
                "requests made no progress for {} s of virtual time: {:?} ({})",
                NO_PROGRESS_LIMIT_NS / 1_000_000_000,
                inflight.iter().map(|x| x.0).collect::<Vec<_>>(),
                array.engine().outstanding()
            ));
        }
        for c in done {
            settle(model, &mut inflight, c.completion, &mut buf)?;
        }
        if run.grown.is_some() {
            grow::note_progress(array, model, report);
        }
        match outcome {
            RunOutcome::PowerLost { .. } => return Ok((true, inflight)),
            RunOutcome::Stalled => {
                return Err(format!(
                    "the array stalled: work held, nothing asked for ({})",
                    array.engine().outstanding()
                ))
            }
            RunOutcome::Idle if !inflight.is_empty() => {
                return Err(format!(
                    "requests never completed: {:?}",
                    inflight.iter().map(|x| x.0).collect::<Vec<_>>()
                ))
            }
            _ => {}
        }
    }
}
