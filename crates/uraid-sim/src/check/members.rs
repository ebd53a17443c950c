//! Members that join a running array: hot spares added to a whole array (`uraid add`), and
//! a replacement rebuilt beside the member it replaces (`uraid replace`, md's
//! want_replacement), maybe with the power cut while it copies.

use uraid_core::array::{Added, Array};
use uraid_core::MemberState;

use super::spec::{seed_pick, ReaddBadBlocks, Run, SimReport, DRAWS};
use crate::array::SimArray;
use crate::disks::FaultKind;
use crate::meta::member_metadata;
use crate::rebuild::{add_disk, replace_with_disk};

/// `uraid add` of each hot spare to the whole array (its superblock written first); the
/// superblock round that records it runs with the workload's first requests.
pub(super) fn add_spares(
    run: &Run,
    array: &mut SimArray<Array>,
    report: &mut SimReport,
) -> Result<(), String> {
    if run.spares == 0 {
        return Ok(());
    }
    report.draws.push(DRAWS[4]);
    for disk in run.n..run.n + run.spares {
        match add_disk(array, disk, false)? {
            Added::Spare => report.faults.push(format!("member {disk} added as a hot spare")),
            other => return Err(format!("a hot spare added to a whole array was not kept spare: {other:?}")),
        }
    }
    Ok(())
}

/// The replacement's own disk: the one after the spares.
fn bay(run: &Run) -> usize {
    run.n + run.spares
}

/// `uraid replace` of `slot`'s member at request `at`. md refuses it on a degraded array or
/// while a sync runs; a refusal is only recorded.
pub(super) fn start_replace(
    run: &Run,
    array: &mut SimArray<Array>,
    at: usize,
    slot: usize,
    report: &mut SimReport,
) {
    let bay = bay(run);
    match replace_with_disk(array, slot, bay) {
        Ok(()) => {
            report.draws.push(DRAWS[6]);
            report.faults.push(format!("replace of slot {slot} by member {bay} at request {at} started"));
        }
        Err(e) => report.faults.push(format!("replace of slot {slot} at request {at} refused: {e}")),
    }
}

/// Half the seeds that replace cut the power a little after asking for it, most often
/// while the replacement is still being copied.
pub(super) fn cut_during_replace(run: &Run) -> Option<usize> {
    let (at, _) = run.replace?;
    let seed = run.spec.seed;
    (run.spec.faults && seed_pick(seed, 0x7e94, 2) == 0)
        .then(|| at + 1 + seed_pick(seed, 0x7e95, 200) as usize)
}

/// One seed in two that can (redundancy, faults, no other failure, latent sector, spare or
/// replacement that would add to the member's absence) plans a member with entries in its
/// bad-block log failed and re-added while writes run (by the seed alone).
pub(super) fn plan_readd_bad_blocks(run: &Run) -> Option<ReaddBadBlocks> {
    let (spec, seed) = (run.spec, run.spec.seed);
    if !(spec.faults
        && run.redundancy > 0
        && run.planned_failures == 0
        && !run.latent_planted
        && run.spares == 0
        && run.replace.is_none()
        && seed_pick(seed, 0xbb0a, 2) == 0)
    {
        return None;
    }
    let member = seed_pick(seed, 0xbb0b, run.n as u64) as usize;
    // A sixteenth of the member's data area, where the seed says (a 4 KiB multiple).
    let member_bytes = run.geo.member_sectors[0] * 512;
    let len_bytes = (member_bytes / 16) & !4095;
    let offset_bytes = run.data_offset_bytes + (seed_pick(seed, 0xbb0c, member_bytes - len_bytes) & !4095);
    let errors_at = spec.ops / 10 + seed_pick(seed, 0xbb0d, spec.ops as u64 / 4) as usize;
    let fail_at = errors_at + spec.ops / 8 + seed_pick(seed, 0xbb0e, spec.ops as u64 / 8) as usize;
    let readd_at = fail_at + 10 + seed_pick(seed, 0xbb0f, spec.ops as u64 / 8) as usize;
    Some(ReaddBadBlocks { member, offset_bytes, len_bytes, errors_at, fail_at, readd_at })
}

/// Where a planned re-add with a bad-block log is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReaddStep {
    Planned,
    Erroring,
    Failed,
    Done,
}

/// Moves the planned re-add on once the workload issued enough requests: the write errors
/// begin; they end and the member is failed, if its log lists anything by then (else the
/// draw is off); it is re-added, its log loaded from the device as `uraid add` loads it.
pub(super) fn readd_step(
    plan: &ReaddBadBlocks,
    step: &mut ReaddStep,
    array: &mut SimArray<Array>,
    issued: usize,
    report: &mut SimReport,
) -> Result<(), String> {
    let m = plan.member;
    match *step {
        ReaddStep::Planned if issued >= plan.errors_at => {
            let kind = FaultKind::WriteErrors { offset_bytes: plan.offset_bytes, len_bytes: plan.len_bytes };
            array.disks_mut().fault_now(m, kind);
            *step = ReaddStep::Erroring;
        }
        ReaddStep::Erroring if issued >= plan.fail_at => {
            array.disks_mut().clear_write_errors(m);
            let listed = listed_entries(array, m);
            if listed == 0 || array.engine().engine().member_states()[m] != MemberState::InSync {
                report
                    .faults
                    .push(format!("member {m}: no bad-block entries by request {issued}: no re-add"));
                *step = ReaddStep::Done;
                return Ok(());
            }
            report.faults.push(format!("member {m} failed at request {issued}, {listed} bad-block entries"));
            array.fail_member(m);
            *step = ReaddStep::Failed;
        }
        ReaddStep::Failed if issued >= plan.readd_at => {
            *step = ReaddStep::Done;
            let listed = listed_entries(array, m);
            match add_disk(array, m, true)? {
                Added::Rebuilding { slot, readd } if slot == m => {
                    report.draws.push(DRAWS[7]);
                    report.faults.push(format!(
                        "member {m} re-added at request {issued} with {listed} bad-block entries ({})",
                        match readd {
                            Ok(r) => format!("from the bitmap, {} regions", r.len()),
                            Err(e) => format!("rebuilt in full: {e}"),
                        }
                    ));
                }
                other => return Err(format!("member {m} re-added did not take its slot back: {other:?}")),
            }
        }
        _ => {}
    }
    Ok(())
}

/// Entries in the bad-block log member `m` holds.
fn listed_entries(array: &SimArray<Array>, m: usize) -> usize {
    member_metadata(array.disks(), m).bad_blocks.ok().flatten().map_or(0, |b| b.entries().count())
}
