//! The power cycle: the cut, what the members durably hold re-assembled as `uraid serve`
//! would, every slot brought back (maybe a second member lost meanwhile, maybe the power
//! cut again part way through the recovery, which then resumes from its checkpoint), and
//! the checks: every sector holds what was acknowledged, every member agrees with the
//! others once whole and resynced, and silent corruption is found by md's repair.

use std::collections::BTreeSet;

use uraid_core::array::Array;
use uraid_core::geometry::layout_name;
use uraid_core::meta::ResyncNeed;
use uraid_core::rng::Rng;
use uraid_core::*;

use super::model::{failed_array_serves_nothing_wrong, read_all_split, settle, Inflight, Model, SECTOR};
use super::spec::{seed_pick, Run, SimReport, BITMAP_AREA_BYTES, DRAWS, SUPERBLOCK_OFFSET_BYTES};
use crate::array::{RunOutcome, SimArray};
use crate::corruption::corrupt_and_repair;
use crate::meta::{assemble_members, failure_recorded, member_metadata, replay_ppl, slot_disks, start_array};
use crate::rebuild::{rebuild, survives_second_failure, RebuildPlan, RebuildReport, Rebuilt};
use crate::store::PowerLossPolicy;
use crate::verify::{direct_digests, members_agree, sector_digest};

/// Fraction of a recovery after which the second power cut falls.
const SECOND_CUT_AT: f64 = 0.4;

fn stripe_of(geo: &Geometry, s: u64) -> u64 {
    if geo.level.has_parity() {
        geo.parity_locate(s).0
    } else {
        s
    }
}

pub(super) fn power_cycle(
    run: &Run,
    array: SimArray<Array>,
    model: &mut Model,
    mut inflight: Inflight,
    rng: &mut Rng,
    report: &mut SimReport,
    mut next_id: u64,
) -> Result<(), String> {
    let (spec, level) = (run.spec, run.level);
    let mut buf = vec![0u8; SECTOR as usize];
    if let Some(said) = meta_trap_hit(&array) {
        report.draws.push(DRAWS[8]);
        report.faults.push(said);
    }
    let states = array.engine().engine().member_states();
    // Slots at the cut: one more than `run.n` once a grow's engines were swapped.
    let n_crash = states.len();
    // The disk in each slot at the cut (a hot spare may have taken one).
    let at_crash = slot_disks(array.engine());
    for (slot, &d) in at_crash.iter().enumerate().filter(|(slot, &d)| d != *slot) {
        report
            .faults
            .push(format!("member {d} (a hot spare or a replacement) in slot {slot} at the power cut"));
    }
    for r in array.engine().engine().replacements() {
        report.faults.push(format!(
            "power cut while member {} replaced slot {} ({} sectors copied)",
            r.io_member, r.slot, r.recovery_offset_sectors
        ));
    }
    let degraded_at_crash =
        states.iter().zip(&at_crash).any(|(s, &d)| *s != MemberState::InSync || array.disks().is_failed(d));
    // What was acknowledged before a completed flush must survive.
    let crash = array.crash(&PowerLossPolicy::default());
    report.power_cycles += 1;
    for c in crash.completions {
        settle(model, &mut inflight, c.completion, &mut buf)?;
    }
    let mut disks = crash.disks;
    disks.cancel_power_loss();
    // A dropped member answers again after the power cycle, with its old superblock.
    let revived: Vec<bool> =
        (0..disks.member_count()).map(|m| run.dropped[m] && disks.is_failed(m)).collect();
    for m in (0..disks.member_count()).filter(|&m| revived[m]) {
        disks.revive_member(m);
        report.faults.push(format!("member {m} back after the power cycle, stale"));
    }
    // Sectors unreadable at the cut, by absolute member sector (latent, or listed in a
    // bad-block log because a write failed there): a resync must rebuild them from parity, which is stale where
    // writes were in flight (md's write hole, with no member lost).
    let latent_at_crash: BTreeSet<(usize, u64)> = (0..n_crash)
        .flat_map(|m| {
            let d = at_crash[m];
            let mut ranges: Vec<(u64, u64)> = disks.store(d).latent_error_ranges().collect();
            let listed = member_metadata(&disks, d).bad_blocks.ok().flatten();
            ranges.extend(listed.iter().flat_map(|bb| bb.entries()).map(|(s, l)| (s, s + l)));
            ranges.into_iter().flat_map(move |(a, b)| (a..b).map(move |s| (m, s)))
        })
        .collect();
    let mut lost = 0;
    let mut lost_at_crash = vec![false; n_crash.max(run.n + usize::from(run.grown.is_some()))];
    for m in 0..n_crash {
        let d = at_crash[m];
        if states[m] != MemberState::InSync || disks.is_failed(d) || revived[d] {
            lost += 1;
            lost_at_crash[m] = true;
        }
    }
    let mut lost_after_crash = false;
    // Not over ranges a member lists bad after the planned re-add's write errors: they
    // are lost on that member as latent sectors are.
    if spec.faults
        && lost.max(run.planned_failures)
            + usize::from(run.latent_planted)
            + usize::from(run.readd_bad_blocks.is_some())
            < run.redundancy
        && level.has_parity()
        && rng.below(2) == 0
    {
        let m = (0..n_crash).find(|&m| !lost_at_crash[m]).expect("a member");
        disks.fail_member(at_crash[m]);
        lost_at_crash[m] = true;
        lost_after_crash = true;
        report.faults.push(format!("member {m} lost after the power cut, before resync"));
    }
    // md may take a lost member back in sync only while no superblock records its loss:
    // then nothing acknowledged depended on it (completions wait for the record).
    let unrecorded: Vec<bool> =
        (0..disks.member_count()).map(|m| !disks.is_failed(m) && !failure_recorded(&disks, m)).collect();
    // Re-assembly from what the members durably hold, as `uraid serve` does: the
    // superblocks decide who is in, the bitmap (or resync_offset) what is resynced.
    let (mut plan, mut offered) = assemble_members(&disks).map_err(|e| format!("re-assembly: {e}"))?;
    if let Some(said) = replay_ppl(&mut disks, &mut plan, &offered)? {
        report.faults.push(said);
    }
    // A grow whose start the superblocks recorded goes on from their checkpoint; one they
    // did not record never happened (the disk is a spare).
    // The layout a resumed reshape had not reached yet at the cut is the one before it.
    let (geo_before, data_offset_before) = (run.geo.clone(), run.data_offset_bytes);
    let grown_run;
    let run = match &run.grown {
        Some(g) if reshape_recorded(&plan, &g.geo) => {
            grown_run = Run {
                n: g.geo.raid_disks,
                geo: g.geo.clone(),
                data_offset_bytes: g.data_offset_bytes,
                // raid5 to raid6: what the array survives from here on is raid6's.
                level: g.geo.level,
                layout: g.geo.layout,
                redundancy: g.geo.redundancy(),
                ..run.clone()
            };
            &grown_run
        }
        _ => run,
    };
    let level = run.level;
    let (n, geo) = (run.n, &run.geo);
    let sectors = geo.array_sectors();
    let old_sectors = run.grown.as_ref().map(|_| model.sectors());
    if (plan.array_sectors != sectors && Some(plan.array_sectors) != old_sectors)
        || plan.raid_disks as usize != n
    {
        return Err(format!(
            "re-assembly: the superblocks give {} sectors on {}",
            plan.array_sectors, plan.raid_disks
        ));
    }
    report.resync_after_power_cycle = match &plan.resync {
        ResyncNeed::None => "none".into(),
        ResyncNeed::Full { from_sector } => format!("full from {from_sector}"),
        ResyncNeed::Bitmap { regions } => {
            format!("bitmap: {} regions, {} sectors", regions.len(), regions.iter().map(|r| r.1).sum::<u64>())
        }
    };
    let members2 = plan.member_configs();
    for (m, st) in members2.iter().enumerate() {
        let same_disk = plan.slots[m].as_ref().is_some_and(|s| Some(&offered[s.member]) == at_crash.get(m));
        if st.state == MemberState::InSync && same_disk && lost_at_crash[m] && !unrecorded[at_crash[m]] {
            return Err(format!("re-assembly took member {m} back in sync although its loss is recorded"));
        }
    }
    let degraded_start = members2.iter().any(|m| m.state != MemberState::InSync);
    // The same start as the first one and as `uraid serve`'s: the resync the superblocks
    // ask for, their members and spares, their bitmap.
    let second = start_array(&disks, &plan, &offered, run.tunables.clone())
        .map_err(|e| format!("re-assembly: {e}"))?;
    // md's start_dirty_degraded: a dirty raid4/5/6 started degraded owes its resync until
    // it is whole again; nothing may drop it.
    if plan.resync.engine_ranges().is_some() && level.has_parity() && degraded_start && !second.resync_owed()
    {
        return Err("a dirty degraded start dropped the resync it owes".into());
    }
    let mut array2 = SimArray::new(second, disks);
    // Taken before a resumed reshape runs: a member it loses (and a hot spare that takes
    // the slot once it ends) is a loss after the start, as one during the resync is.
    let started_with = slot_disks(array2.engine());
    let resumed_from = match grown_run_resumes(&mut array2, model, report)? {
        Resumed::None => None,
        Resumed::Finished(from) => Some(*from),
        Resumed::ArrayFailed { from, at } => {
            // As during the recovery below: planned faults firing during the resumed
            // reshape while a slot is still out (a cut inside a grow's start round that
            // missed the new member: seed 99000197) fail md's array too.
            if !planned_losses_beyond_redundancy(run, &array2, &members2) {
                return Err(format!(
                    "the array failed during the reshape resumed at sector {from} (at {at:?}), with losses \
                     no planned fault explains or within the redundancy"
                ));
            }
            report
                .faults
                .push(format!("the array failed during the reshape resumed at sector {from}, as md's would"));
            report.array_failed_as_expected = true;
            return failed_array_serves_nothing_wrong(&mut array2, model, &mut next_id, &mut buf);
        }
    };
    if array2.engine().engine().geometry() != geo {
        return Err(format!(
            "the array has {:?} after the power cycle, not {geo:?}",
            array2.engine().engine().geometry()
        ));
    }
    // The grow may have ended in the superblocks only as the power went (its last round
    // durable, not yet acknowledged): the new space reads zeroes either way.
    model.grow_to(sectors);
    // Every slot left out comes back (re-added or replaced, then recovered); maybe a second
    // member fails while that runs. Not raid10 (whether it survives depends on which copies
    // the failure takes), and not with a latent sector planted or a bad-block range listed
    // (that would be a third loss there on raid6).
    let bad_blocks_listed = (0..array2.disks().member_count())
        .any(|m| member_metadata(array2.disks(), m).bad_blocks.ok().flatten().is_some_and(|b| !b.is_empty()));
    // Latent sectors beyond the redundancy during the recovery: the same rows unreadable on
    // as many in-sync members as, with the slots being brought back, the level cannot
    // spare. The recovery records them bad on its target and finishes; reads of those rows
    // may then fail (EIO), never return anything wrong, and every other sector reads back.
    let beyond = plant_beyond_redundancy(run, &mut array2, &members2, degraded_start, bad_blocks_listed);
    if let Some((m0, m1, members)) = &beyond {
        report.draws.push(DRAWS[1]);
        report.faults.push(format!(
            "latent sectors beyond the redundancy: member sectors {m0}..{m1} on members {members:?} before the recovery"
        ));
    }
    let second_failure = (spec.faults
        && beyond.is_none()
        && degraded_start
        && level != Level::Raid10
        && !run.latent_planted
        && !bad_blocks_listed
        && seed_pick(spec.seed, 0x5ec0, 3) == 0)
        .then(|| {
            let start = seed_pick(spec.seed, 0x5ec1, n as u64) as usize;
            (0..n).map(|k| (start + k) % n).find(|&m| {
                members2[m].state == MemberState::InSync
                    && !run.erroring[array2.engine().engine().io_member(m)]
            })
        })
        .flatten();
    // For some seeds the power is cut again part way through the recovery (not with a
    // second failure: the two would be one more loss than this checks).
    let mut cut_at =
        (spec.faults && second_failure.is_none() && beyond.is_none() && seed_pick(spec.seed, 0x2c07, 3) == 0)
            .then_some(SECOND_CUT_AT);
    let mut rebuilt = RebuildReport::default();
    let outcome = loop {
        let rp = RebuildPlan {
            plan: &plan,
            offered: &offered,
            erroring: &run.erroring,
            second_failure: second_failure.filter(|_| !rebuilt.second_failure_tried),
            cut_at: cut_at.take(),
        };
        match rebuild(&mut array2, &rp, &mut rebuilt, &mut report.faults)? {
            Rebuilt::PowerCut => {
                let crash = array2.crash(&PowerLossPolicy::default());
                report.power_cycles += 1;
                let mut disks = crash.disks;
                disks.cancel_power_loss();
                (plan, offered) = assemble_members(&disks).map_err(|e| format!("second re-assembly: {e}"))?;
                if let Some(said) = replay_ppl(&mut disks, &mut plan, &offered)? {
                    report.faults.push(said);
                }
                let from = plan.slots.iter().flatten().filter_map(|s| s.recovery_offset_sectors).max();
                report.resumed_from_sectors = from;
                report.faults.push(match from {
                    Some(f) => format!("power cut during the recovery; it resumes from sector {f}"),
                    None => "power cut during the rebuild; re-assembled".into(),
                });
                let again = start_array(&disks, &plan, &offered, run.tunables.clone())
                    .map_err(|e| format!("second re-assembly: {e}"))?;
                array2 = SimArray::new(again, disks);
            }
            other => break other,
        }
    };
    // Judged by what the engine knows in the end: a source found gone only by the
    // recovery's reads counts too.
    let lost_now =
        array2.engine().engine().member_states().iter().filter(|s| **s != MemberState::InSync).count();
    let second_failure_fatal = rebuilt.second_failure_not_in_sync.is_some()
        && !survives_second_failure(level, n, lost_now.max(rebuilt.second_failure_not_in_sync.unwrap_or(0)));
    // A planned fault firing only after the power cycle (write or flush errors, a disk the
    // simulator fails) while a slot is still being brought back: as many losses as a second
    // failure, and md fails the array too (a cut inside a grow's start round that missed the
    // new member leaves its slot to recover after the resumed reshape: seed 99001578).
    let planned_loss_fatal = rebuilt.second_failure_not_in_sync.is_none()
        && planned_losses_beyond_redundancy(run, &array2, &members2);
    match (outcome, second_failure_fatal || planned_loss_fatal) {
        (Rebuilt::Failed, true) => {
            if !second_failure_fatal {
                report.faults.push(
                    "the array failed during the rebuild after the power cycle, by planned faults \
                     beyond the redundancy, as md's would"
                        .into(),
                );
            }
            report.array_failed_as_expected = true;
            return failed_array_serves_nothing_wrong(&mut array2, model, &mut next_id, &mut buf);
        }
        (Rebuilt::Failed, false) => {
            return Err("the array failed during the rebuild after the power cycle".into())
        }
        (Rebuilt::Whole, true) => {
            return Err(format!(
                "the array ran on after a second failure during recovery that {} cannot survive",
                layout_name(level, run.layout)
            ))
        }
        (Rebuilt::Whole, false) => {}
        (Rebuilt::PowerCut, _) => unreachable!("handled above"),
    }
    // A member lost during the resync (a planned fault firing, or the second failure):
    // stripes its resync had not reached were rebuilt from stale parity, md's write hole.
    // A hot spare that took a slot during the resync counts as one brought back.
    let now_in = slot_disks(array2.engine());
    let lost_during_resync = rebuilt.brought_back.iter().any(|&m| !lost_at_crash[m])
        || (0..n).any(|m| now_in[m] != started_with[m] && !lost_at_crash[m]);
    let write_hole_possible =
        level.has_parity() && (degraded_at_crash || lost_after_crash || lost_during_resync);
    // Where each sector was at the cut: a resumed reshape moved the sectors on the previous
    // layout's side of its checkpoint (above it forwards, below it backwards) out of that
    // layout, reading its stripes as the cut left them (a stale one, degraded, moves its
    // write hole into the new layout).
    let before_reshape = |s: u64| {
        resumed_from.as_ref().is_some_and(|r| {
            s < geo_before.array_sectors()
                && r.side_of(s, r.position_sectors) == uraid_core::reshape::Side::Previous
        })
    };
    let layout_at_cut = |s: u64| {
        if before_reshape(s) {
            (&geo_before, data_offset_before)
        } else {
            (geo, run.data_offset_bytes)
        }
    };
    let stripe_at_cut = |s: u64| (before_reshape(s), stripe_of(layout_at_cut(s).0, s));
    // Every sector: the durable value or one of the writes since.
    let stale_stripes: BTreeSet<(bool, u64)> = if level.has_parity() {
        (0..sectors).filter(|&s| !model.since[s as usize].is_empty()).map(stripe_at_cut).collect()
    } else {
        Default::default()
    };
    // md's partial parity log works in 4 KiB rows (a page of every member of a stripe):
    // the rows a write since the last flush touched.
    let row = |s: u64| (stripe_of(geo, s), geo.map_sector(s).0.member_sector / 8);
    let written_rows: BTreeSet<(u64, u64)> = if run.ppl {
        (0..sectors).filter(|&s| !model.since[s as usize].is_empty()).map(row).collect()
    } else {
        Default::default()
    };
    let exposed = |s: u64| {
        let stale = stale_stripes.contains(&stripe_at_cut(s));
        let latent = || {
            let (geo, data_offset_bytes) = layout_at_cut(s);
            let (at, _) = geo.map_sector(s);
            latent_at_crash.contains(&(at.member, data_offset_bytes / SECTOR + at.member_sector))
        };
        // md's partial parity log closes the hole but for the rows being written: a sector
        // in a row nothing wrote since the last flush must hold its contents.
        let written = || !run.ppl || written_rows.contains(&row(s));
        stale && ((write_hole_possible && written()) || latent())
    };
    // What the array holds after the power cycle, sector by sector, as read through it.
    let mut image = Vec::with_capacity(sectors as usize);
    let mut exposures = 0;
    // Sectors that answered EIO: only rows with latent sectors beyond the redundancy may.
    let mut unreadable = BTreeSet::new();
    let finished = read_all_split(&mut array2, &mut next_id, beyond.is_some(), |off, r| {
        let data = match (r, &beyond) {
            (Ok(data), _) => data,
            (Err(e), Some((m0, m1, _))) => {
                let (at, _) = geo.map_sector(off);
                if !(*m0..*m1).contains(&at.member_sector) {
                    return Err(format!(
                        "post-crash read of sector {off} (member {}, sector {}) failed outside the rows \
                         unreadable beyond the redundancy: {e}",
                        at.member, at.member_sector
                    ));
                }
                unreadable.insert(off);
                image.push(0);
                return Ok(());
            }
            (Err(e), None) => return Err(format!("post-crash read at sector {off}: {e}")),
        };
        for (k, got) in data.chunks(SECTOR as usize).enumerate() {
            let s = off + k as u64;
            image.push(sector_digest(got));
            if model.holds_durable_or_later(s, got, &mut buf) {
                continue;
            }
            if !exposed(s) {
                let (at, _) = geo.map_sector(s);
                return Err(format!(
                    "after the power cycle sector {s} holds neither its durable contents (write {}) nor a \
                     later write {:?} (member {}, sector {})",
                    model.durable[s as usize], model.since[s as usize], at.member, at.member_sector
                ));
            }
            exposures += 1;
        }
        Ok(())
    })?;
    if !finished {
        return Err("the power was lost during the read-back".into());
    }
    report.write_hole_exposures += exposures;
    report.unreadable_sectors = unreadable.len() as u64;
    // A fault planned before the cut may have fired during the read-back: whole again
    // first (the members are compared with what the array served).
    let late = RebuildPlan {
        plan: &plan,
        offered: &offered,
        erroring: &run.erroring,
        second_failure: None,
        cut_at: None,
    };
    if rebuild(&mut array2, &late, &mut RebuildReport::default(), &mut report.faults)? != Rebuilt::Whole {
        return Err("the array failed while a member was rebuilt after the read-back".into());
    }
    // Whole and resynced: every member agrees with the others, read member by member, and
    // each sector's primary location holds what the array served.
    if !array2.engine().engine().resync_owed() {
        let slots = slot_disks(array2.engine());
        members_agree(array2.disks(), &slots, geo, run.data_offset_bytes)
            .map_err(|e| format!("after the resync and rebuild the members disagree: {e}"))?;
        let direct = direct_digests(array2.disks(), &slots, geo, run.data_offset_bytes);
        if let Some(s) = (0..sectors as usize)
            .find(|&s| !unreadable.contains(&(s as u64)) && direct[s].is_some_and(|d| d != image[s]))
        {
            return Err(format!("sector {s} on its member differs from what the array served"));
        }
        // Not over latent sectors: how a scrub meets a read error is not what this checks.
        let latent_left =
            (0..array2.disks().member_count()).any(|m| array2.disks().store(m).latent_error_sectors() > 0);
        if spec.faults && level != Level::Raid0 && !latent_left && seed_pick(spec.seed, 0xc0de, 2) == 0 {
            let pick = |tag: u64, n: u64| seed_pick(spec.seed, 0xc0de + tag, n);
            match corrupt_and_repair(&mut array2, geo, &image, run.data_offset_bytes, &pick)? {
                Some(r) => {
                    report.faults.push(format!(
                        "silent corruption of {}, repair mismatch_cnt {}",
                        r.what, r.mismatch_cnt
                    ));
                    report.corruption_exposures += r.exposures;
                }
                None => report.faults.push("silent corruption: a member failed during the repair".into()),
            }
        }
    }
    report.member_ios = array2.disks().completed_ios();
    report.trace_hash = format!("{:016x}", array2.disks().trace_hash());
    Ok(())
}

/// Draws (one seed in two that can) latent sectors beyond the redundancy before the
/// recovery after the power cycle: the same member rows made unreadable on the in-sync
/// members the level would need there, RAID1/4/5/6 (their rows share member sectors), not
/// with other latent sectors or listed ranges, whose losses would add to these. Returns the
/// rows (member sectors, data-relative) and the members.
fn plant_beyond_redundancy(
    run: &Run,
    array: &mut SimArray<Array>,
    members: &[uraid_core::config::MemberConfig],
    degraded_start: bool,
    bad_blocks_listed: bool,
) -> Option<(u64, u64, Vec<usize>)> {
    let (spec, geo, n) = (run.spec, &run.geo, run.n);
    if !(spec.faults
        && degraded_start
        && matches!(run.level, Level::Raid1 | Level::Raid4 | Level::Raid5 | Level::Raid6)
        && !run.latent_planted
        && !bad_blocks_listed
        && seed_pick(spec.seed, 0x1a7e, 2) == 0)
    {
        return None;
    }
    let missing = members.iter().filter(|m| m.state != MemberState::InSync).count();
    let slots = slot_disks(array.engine());
    let sources: Vec<usize> = (0..n)
        .filter(|&m| {
            let d = slots[m];
            members[m].state == MemberState::InSync && !run.erroring[d] && !array.disks().is_failed(d)
        })
        .collect();
    // Losses in a row beyond what the level survives: redundancy + 1 in all.
    let need = (geo.redundancy() + 1).checked_sub(missing).filter(|&k| k >= 1 && k <= sources.len())?;
    let start = seed_pick(spec.seed, 0x1a7f, sources.len() as u64) as usize;
    let chosen: Vec<usize> = (0..need).map(|k| sources[(start + k) % sources.len()]).collect();
    let member_sectors = geo.member_sectors[0];
    let m0 = seed_pick(spec.seed, 0x1a80, member_sectors - 64);
    let m1 = m0 + 1 + seed_pick(spec.seed, 0x1a81, 16);
    for &m in &chosen {
        array
            .disks_mut()
            .store_mut(slots[m])
            .add_latent_error(run.data_offset_bytes + m0 * SECTOR, (m1 - m0) * SECTOR);
    }
    Some((m0, m1, chosen))
}

/// What the planned failure on a metadata I/O fell on, if it fell (see `MetaTrap`).
fn meta_trap_hit(array: &SimArray<Array>) -> Option<String> {
    let hit = array.meta_trap_hit()?;
    let sb = crate::meta::member_superblock(array.disks(), hit.member);
    let bitmap_at = sb.as_ref().and_then(|sb| sb.bitmap_sector()).map(|s| s * SECTOR);
    let what = match (hit.op, hit.offset_bytes) {
        (MemberIoOp::Flush, _) => "a metadata flush".to_string(),
        (_, SUPERBLOCK_OFFSET_BYTES) => "a superblock write".to_string(),
        (_, o) if bitmap_at.is_some_and(|b| (b..b + BITMAP_AREA_BYTES).contains(&o)) => {
            "a bitmap page write".to_string()
        }
        (_, o) => format!("a metadata write at byte {o} (bad-block log or PPL area)"),
    };
    Some(format!("member {} failed on {what} of a metadata round at {} ns", hit.member, hit.at_ns))
}

/// Members lost since the re-assembly's start (in sync then, not now) that are all disks a
/// planned fault fails (write or flush errors, or failed by the simulator), and beyond the
/// level's redundancy with the slots still out: md fails the array too. A loss no planned
/// fault explains, or one the level survives, is not.
fn planned_losses_beyond_redundancy(
    run: &Run,
    array: &SimArray<Array>,
    members: &[uraid_core::config::MemberConfig],
) -> bool {
    let engine = array.engine().engine();
    let states_now = engine.member_states();
    let lost_now = states_now.iter().filter(|s| **s != MemberState::InSync).count();
    let failed_since_start: Vec<usize> = (0..run.n.min(states_now.len()).min(members.len()))
        .filter(|&m| states_now[m] != MemberState::InSync && members[m].state == MemberState::InSync)
        .map(|m| engine.io_member(m))
        .collect();
    !failed_since_start.is_empty()
        && failed_since_start.iter().all(|&d| run.erroring[d] || array.disks().is_failed(d))
        && !survives_second_failure(run.level, run.n, lost_now)
}

/// How a reshape the re-assembly resumed ended.
enum Resumed {
    None,
    /// It ran to its end: the reshape as it resumed (its checkpoint then).
    Finished(Box<uraid_core::reshape::ReshapeGeometry>),
    /// The array failed on the way (the reshape stops there, as md's does), having resumed
    /// at sector `from` and reached `at`.
    ArrayFailed {
        from: u64,
        at: Option<(u64, u64)>,
    },
}

/// A reshape the re-assembly resumed runs to its end before the recovery (md recovers no
/// member while it reshapes); the model then takes the new size.
fn grown_run_resumes(
    array: &mut SimArray<Array>,
    model: &mut Model,
    report: &mut SimReport,
) -> Result<Resumed, String> {
    let Some(resumed) = array.engine().reshape_geometry().cloned() else {
        return Ok(Resumed::None);
    };
    let from = resumed.position_sectors;
    let mut rounds = 0;
    while array.engine().is_reshaping() {
        match array.run_until_idle() {
            RunOutcome::Idle | RunOutcome::Stalled => {}
            other => return Err(format!("the resumed reshape ended {other:?}")),
        }
        rounds += 1;
        if array.engine().is_reshaping() && array.engine().engine().is_failed() {
            return Ok(Resumed::ArrayFailed { from, at: array.engine().reshape_progress() });
        }
        if array.engine().is_reshaping() && (rounds > 1000 || !array.engine().reshape_running()) {
            return Err(format!(
                "the reshape resumed at sector {from} did not finish (at {:?})",
                array.engine().reshape_progress()
            ));
        }
    }
    let sectors = array.engine().engine().size_bytes() / SECTOR;
    model.grow_to(sectors);
    report.faults.push(format!("the reshape resumed at sector {from} after the power cycle and finished"));
    if !report.draws.contains(&DRAWS[11]) {
        report.draws.push(DRAWS[11]);
    }
    Ok(Resumed::Finished(Box::new(resumed)))
}

/// The superblocks recorded the start of the reshape to `next` (mid-way or done): one that
/// they did not record never happened.
fn reshape_recorded(plan: &uraid_core::meta::AssemblyPlan, next: &Geometry) -> bool {
    let shape = |g: &Geometry| (g.level, g.raid_disks, g.layout, g.chunk_sectors);
    // Mid-reshape the superblocks' own fields still give the previous layout.
    let now = plan.reshape.as_ref().map(|r| r.next.clone()).or_else(|| plan.geometry().ok());
    now.is_some_and(|g| shape(&g) == shape(next))
}
