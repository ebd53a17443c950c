//! After the power cycle: every slot the re-assembly left out is brought back, as an
//! administrator would with mdadm. A stale member that answers again is re-added (only the
//! regions its bitmap says it missed where md would, else rebuilt in full); a member that
//! is gone, or gave write or flush errors, is swapped for a blank disk and recovered. A
//! second member may fail while a recovery runs (md's nightmare: the level decides whether
//! the array survives it).

use uraid_core::meta::{feature, AssemblyPlan};
use uraid_core::{Engine, Level, MemberState, SyncKind};

use super::array::{RunOutcome, SimArray};
use super::meta::member_superblock;

/// Engine sync ranges `(start, end)`.
type SyncRanges = Vec<(u64, u64)>;

/// How the rebuild ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Rebuilt {
    /// Every member in sync.
    Whole,
    /// More members lost than the level survives (expected only after a second failure
    /// during recovery that the level cannot take).
    Failed,
}

pub struct RebuildPlan<'a> {
    pub plan: &'a AssemblyPlan,
    /// Offered index -> member (see `assemble_members`).
    pub offered: &'a [usize],
    /// Members whose disk gave write or flush errors: replaced, never re-added.
    pub erroring: &'a [bool],
    pub data_offset_bytes: u64,
    /// Fail this member once the first recovery is a third of the way (`None`: no second
    /// failure).
    pub second_failure: Option<usize>,
}

/// Does the level survive a member failing while another is being recovered? md counts a
/// recovering member as missing (raid5's calc_degraded, raid1's last in-sync member).
pub fn survives_second_failure(level: Level, raid_disks: usize, not_in_sync_after: usize) -> bool {
    match level {
        Level::Raid1 => not_in_sync_after < raid_disks,
        Level::Raid4 | Level::Raid5 | Level::Raid6 => not_in_sync_after <= level.parity_disks(),
        Level::Raid0 | Level::Raid10 => false,
    }
}

fn run_idle(array: &mut SimArray<Engine>) -> Result<(), String> {
    match array.run_until_idle() {
        RunOutcome::Idle => Ok(()),
        other => Err(format!("the rebuild after the power cycle ended {other:?}")),
    }
}

/// The stale member of `slot` the assembly named, if its disk answers: (member, its
/// bitmap re-add regions as engine ranges, or None for a full rebuild).
fn stale_readd(
    rp: &RebuildPlan,
    array: &SimArray<Engine>,
    slot: usize,
) -> Option<(usize, Option<SyncRanges>)> {
    let st = rp.plan.stale.iter().find(|s| s.slot == Some(slot as u32))?;
    let member = rp.offered[st.member];
    if member != slot || rp.erroring[member] || array.disks().is_failed(member) {
        return None;
    }
    // md's re-add: from the bitmap when the member's events are not older than the bits'
    // events_cleared and it was not itself half rebuilt; raid10 rebuilds in full.
    let old = member_superblock(array.disks(), member)?;
    let bitmap_ok = st.bitmap_recoverable && !old.has(feature::RECOVERY_OFFSET) && rp.plan.level != 10;
    let ranges = bitmap_ok
        .then(|| rp.plan.bitmap.as_ref().and_then(|b| b.write_intent()))
        .flatten()
        .map(|bm| bm.set_regions().into_iter().map(|(s, l)| (s, s + l)).collect());
    Some((member, ranges))
}

/// What the rebuild did.
#[derive(Debug, Default)]
pub struct RebuildReport {
    /// Slots brought back (re-added or replaced), in order, repeats included.
    pub brought_back: Vec<usize>,
    /// The second failure hit while a recovery ran: members not in sync right after it.
    pub second_failure_not_in_sync: Option<usize>,
}

/// Brings every missing or faulty slot back and runs until the array is whole or failed.
/// `log` gets a line per step (for the report's fault list).
pub fn rebuild(
    array: &mut SimArray<Engine>,
    rp: &RebuildPlan,
    report: &mut RebuildReport,
    log: &mut Vec<String>,
) -> Result<Rebuilt, String> {
    let n = array.engine().member_states().len();
    let mut second_failure = rp.second_failure;
    let mut first_round = true;
    // Each round brings back every slot out; a slot fails again at most once per planned
    // failure, so n + 2 rounds are plenty.
    for _ in 0..n + 2 {
        run_idle(array)?;
        if array.engine().is_failed() {
            return Ok(Rebuilt::Failed);
        }
        // A recovery a source's failure stopped short leaves its member half rebuilt:
        // failed and added again (mdadm --fail, --add), it is rebuilt from the start.
        let states = array.engine().member_states();
        let now = array.now_ns();
        for (m, s) in states.iter().enumerate() {
            if matches!(s, MemberState::Recovering { .. }) && !array.engine().sync_active() {
                log.push(format!("member {m} half rebuilt: failed and added again"));
                array.engine_mut().fail_member(m, now);
            }
        }
        if array.engine().is_failed() {
            return Ok(Rebuilt::Failed);
        }
        let out: Vec<usize> = array
            .engine()
            .member_states()
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, MemberState::Faulty | MemberState::Missing))
            .map(|(m, _)| m)
            .collect();
        if out.is_empty() {
            return Ok(Rebuilt::Whole);
        }
        for &slot in &out {
            report.brought_back.push(slot);
            let now = array.now_ns();
            let readd = if first_round { stale_readd(rp, array, slot) } else { None };
            match readd {
                Some((member, ranges)) => {
                    log.push(match &ranges {
                        Some(r) => {
                            format!("stale member {member} re-added from the bitmap ({} regions)", r.len())
                        }
                        None => format!("stale member {member} re-added, rebuilt in full"),
                    });
                    array.engine_mut().readd_member(slot, rp.data_offset_bytes, ranges, now)?;
                }
                None => {
                    log.push(format!("member {slot} replaced by a blank disk and recovered"));
                    array.disks_mut().replace_member(slot);
                    array.engine_mut().add_member(slot, rp.data_offset_bytes, now)?;
                }
            }
        }
        first_round = false;
        if let Some(victim) = second_failure.take() {
            report.second_failure_not_in_sync = fail_during_recovery(array, victim, log)?;
        }
    }
    Err("the rebuild after the power cycle did not converge".into())
}

/// Runs until the recovery under way is a third done, then fails `victim` (fail-stop).
/// Returns how many members are then not in sync (the victim included), if it failed.
fn fail_during_recovery(
    array: &mut SimArray<Engine>,
    victim: usize,
    log: &mut Vec<String>,
) -> Result<Option<usize>, String> {
    loop {
        let Some(st) = array.engine().sync_status().filter(|s| matches!(s.kind, SyncKind::Recovery { .. }))
        else {
            log.push("no recovery ran long enough for a second failure".into());
            return Ok(None);
        };
        if st.done_sectors * 3 >= st.total_sectors {
            break;
        }
        match array.run_until(array.now_ns() + 200_000) {
            RunOutcome::TimeReached | RunOutcome::Idle => {}
            other => return Err(format!("recovery before the second failure ended {other:?}")),
        }
    }
    let states = array.engine().member_states();
    if states[victim] != MemberState::InSync {
        return Ok(None);
    }
    log.push(format!("member {victim} failed during the recovery"));
    array.disks_mut().fail_member(victim);
    Ok(Some(states.iter().filter(|s| **s != MemberState::InSync).count() + 1))
}
