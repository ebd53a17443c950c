//! An online reshape while the workload runs: a grow by one member (`mdadm --add` then
//! `mdadm --grow --raid-devices N+1`: a blank disk joins as a spare and the raid4/5/6
//! reshapes onto it), or a restripe on the same members (`--chunk`, `--layout`, or raid5
//! `--level 6` with a new member), while requests go on, member failures, latent sectors and
//! power cuts falling where they fall. Drawn by the seed alone, so the workload of every
//! other seed stays as it was.

use uraid_core::array::{grow_plan, Added, Array, GrowRequest};
use uraid_core::*;

use super::spec::{seed_pick, GrowDraw, GrowKind, Grown, Run, SimReport, SimSpec, DRAWS};
use crate::array::SimArray;
use crate::disks::{Fault, FaultKind, FaultTrigger};
use crate::rebuild::add_disk;
use crate::store::PowerLossPolicy;

/// Half the raid4/5/6 seeds without a partial parity log (which the online reshape
/// refuses) grow by a member, and half of the rest restripe (chunk, layout, or raid5 to
/// raid6), early enough that much of the workload meets it. A bitmap is carried along.
pub(super) fn draw(
    spec: &SimSpec,
    level: Level,
    layout: u32,
    chunk_sectors: u64,
    ppl: bool,
    disk: usize,
) -> Option<GrowDraw> {
    use uraid_core::geometry::algorithm;
    let seed = spec.seed;
    if !level.has_parity() || ppl {
        return None;
    }
    let kind = if seed_pick(seed, 0x960e, 2) == 0 {
        GrowKind::Members
    } else if seed_pick(seed, 0x9617, 2) == 0 {
        let rotating = [
            algorithm::LEFT_ASYMMETRIC,
            algorithm::RIGHT_ASYMMETRIC,
            algorithm::LEFT_SYMMETRIC,
            algorithm::RIGHT_SYMMETRIC,
        ];
        let others: Vec<u32> = rotating.into_iter().filter(|&l| l != layout).collect();
        match (level, seed_pick(seed, 0x9613, 3)) {
            (Level::Raid5, 0) => GrowKind::Raid6,
            (Level::Raid5 | Level::Raid6, 1) => {
                GrowKind::Layout(others[seed_pick(seed, 0x9614, others.len() as u64) as usize])
            }
            _ if chunk_sectors > 8 && seed_pick(seed, 0x9615, 2) == 0 => GrowKind::Chunk(chunk_sectors / 2),
            _ => GrowKind::Chunk(chunk_sectors * 2),
        }
    } else {
        return None;
    };
    Some(GrowDraw {
        at_request: spec.ops / 16 + seed_pick(seed, 0x960f, spec.ops as u64 / 4) as usize,
        disk,
        kind,
    })
}

/// Whether the seed's members keep room after the data: half the seeds [`draw`] gives a
/// restripe without a new member (chunk or layout), by the seed alone. A restripe there
/// moves the data offset up and runs backwards (md's RESHAPE_BACKWARDS).
pub(super) fn draw_room_after(spec: &SimSpec, level: Level, ppl: bool) -> bool {
    // The draw's own shape inputs do not change which kind it is: any layout and chunk.
    let kind = draw(spec, level, 0, 16, ppl, 0).map(|g| g.kind);
    matches!(kind, Some(GrowKind::Chunk(_) | GrowKind::Layout(_))) && seed_pick(spec.seed, 0x9620, 2) == 0
}

/// The geometry the reshape ends in (the engine's geometry once it is done must be this),
/// and where the data then starts: for a grow mdadm's `min_offset_change` below the old
/// offset; for a restripe where the start put it (mdadm's `choose_offset`), as the engine
/// says, bounded here by what the members have room for.
pub(super) fn grown_shape(run: &Run, g: &GrowDraw, array: &Array) -> Grown {
    let geo = &run.geo;
    let (level, raid_disks, layout, chunk) = match g.kind {
        GrowKind::Members => (geo.level, geo.raid_disks + 1, geo.layout, geo.chunk_sectors),
        GrowKind::Chunk(c) => (geo.level, geo.raid_disks, geo.layout, c),
        GrowKind::Layout(l) => (geo.level, geo.raid_disks, l, geo.chunk_sectors),
        // md's takeover keeps the raid5's layout number, which raid6 reads as rotating P and Q.
        GrowKind::Raid6 => (Level::Raid6, geo.raid_disks + 1, geo.layout, geo.chunk_sectors),
    };
    let next = Geometry::new(level, raid_disks, layout, chunk, &vec![geo.member_sectors[0]; raid_disks])
        .expect("the reshaped geometry of a valid one");
    let data_offset_bytes = match g.kind {
        GrowKind::Members => {
            let parity = geo.level.parity_disks() as u64;
            let d = geo.raid_disks as u64 - parity;
            let moved = uraid_core::reshape::start::min_offset_change_sectors(geo.chunk_sectors, d, d + 1);
            run.data_offset_bytes - moved * 512
        }
        _ => {
            let r = array.reshape_geometry().expect("the restripe started");
            let at = r.new_data_offset_sectors[0] * 512;
            // Down forwards, up backwards (room only after the data).
            assert!(
                (at < run.data_offset_bytes) != r.backwards && at != run.data_offset_bytes,
                "a restripe moves the data offset down, or up when it runs backwards"
            );
            at
        }
    };
    Grown { geo: next, data_offset_bytes }
}

/// Tries the grow: asked for, and if md would run it the disk added as a spare (once) and
/// the grow started. md refuses it on a degraded array, while a sync or a replacement runs:
/// then it is asked for again later. Returns whether it started. Half the grows that start get a power cut a little
/// later, counted in member I/Os, most often while windows move.
pub(super) fn try_start(
    run: &Run,
    g: &GrowDraw,
    added: &mut bool,
    array: &mut SimArray<Array>,
    report: &mut SimReport,
) -> Result<bool, String> {
    let n = run.n;
    let array_engine = array.engine_mut();
    let cur = array_engine.grow_current(run.geo.member_sectors[0]);
    // Asked before the disk is added (as `uraid grow --add` asks): a spare added for a grow
    // md refuses would take the slot of the next member to fail. Planning refuses too while
    // md would (a check or repair running): asked again later.
    let adding = usize::from(!*added && g.kind.takes_disk());
    let req = match g.kind {
        GrowKind::Members => GrowRequest { raid_disks: Some(n + 1), ..Default::default() },
        GrowKind::Chunk(c) => GrowRequest { chunk_sectors: Some(c), ..Default::default() },
        GrowKind::Layout(l) => GrowRequest {
            layout: Some(uraid_core::geometry::layout_name(run.geo.level, l)),
            ..Default::default()
        },
        GrowKind::Raid6 => GrowRequest { level: Some(Level::Raid6), ..Default::default() },
    };
    let planned = grow_plan(&cur, &GrowRequest { adding, ..req });
    let refusal = match &planned {
        Ok(plan) => array_engine.may_grow(plan).err(),
        Err(e) => Some(e.clone()),
    };
    if let Some(e) = refusal {
        if report.faults.last().is_none_or(|f| !f.ends_with(&e.0)) {
            report.faults.push(format!("grow refused for now: {}", e.0));
        }
        return Ok(false);
    }
    if !*added && g.kind.takes_disk() {
        match add_disk(array, g.disk, false)? {
            Added::Spare => {}
            other => return Err(format!("the disk for the grow was not kept spare: {other:?}")),
        }
        *added = true;
    }
    let plan = planned.map_err(|e| e.0)?;
    let now = array.now_ns();
    array.engine_mut().grow(&plan, now)?;
    report.draws.push(DRAWS[10]);
    if g.kind == GrowKind::Members {
        report.faults.push(format!("grow {n} -> {} members started (disk {})", n + 1, g.disk));
    } else {
        report.draws.push(DRAWS[14]);
        let backwards = array.engine().reshape_geometry().is_some_and(|r| r.backwards);
        let way = if backwards { ", backwards (room after the data)" } else { "" };
        report.faults.push(format!("grow (restripe) {:?} started{way}", g.kind));
    }
    let seed = run.spec.seed;
    if run.spec.faults && seed_pick(seed, 0x9610, 2) == 0 {
        let at = array.disks().completed_ios() + 1 + seed_pick(seed, 0x9611, 1500);
        array.disks_mut().schedule(Fault {
            trigger: FaultTrigger::AfterMemberIos(at),
            member: 0,
            kind: FaultKind::PowerLoss(PowerLossPolicy::default()),
        });
        report.faults.push(format!("power loss after {at} member I/Os (during the grow)"));
    }
    Ok(true)
}

/// What the run had from the reshape: a power cut while it ran, and the members that
/// failed while it ran.
pub(super) fn note_at_cut(array: &SimArray<Array>, report: &mut SimReport) {
    if array.engine().is_reshaping()
        && report.draws.contains(&DRAWS[10])
        && !report.draws.contains(&DRAWS[12])
    {
        report.draws.push(DRAWS[12]);
        let at = array.engine().reshape_progress().map_or(0, |(p, e)| p * 100 / e.max(1));
        report.faults.push(format!("power cut mid-reshape ({at}% moved)"));
    }
}

/// After each step of the workload: a member lost while the reshape runs is noted, and
/// once it is done the model takes the new size.
pub(super) fn note_progress(
    array: &SimArray<Array>,
    model: &mut super::model::Model,
    report: &mut SimReport,
) {
    let engine = array.engine();
    if engine.is_reshaping() {
        if engine.engine().is_degraded() && !report.draws.contains(&DRAWS[13]) {
            report.draws.push(DRAWS[13]);
            report.faults.push("a member failed while the reshape ran".into());
        }
        return;
    }
    let sectors = engine.engine().size_bytes() / super::model::SECTOR;
    if sectors > model.sectors() {
        model.grow_to(sectors);
    }
    if !report.draws.contains(&DRAWS[11]) {
        report.draws.push(DRAWS[11]);
        report.faults.push(format!("reshape finished: {sectors} sectors"));
    }
}
