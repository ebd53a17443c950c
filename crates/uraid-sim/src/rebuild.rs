//! After the power cycle: every slot the re-assembly left out is brought back, as an
//! administrator would with mdadm. A stale member that answers again is re-added (only the
//! regions its bitmap says it missed where md would, else rebuilt in full); a member that
//! is gone, or gave write or flush errors, is swapped for a blank disk and recovered. A
//! second member may fail while a recovery runs (md's nightmare: the level decides whether
//! the array survives it).

use uraid_core::array::{Added, Array, DevRole, NewMember};
use uraid_core::meta::AssemblyPlan;
use uraid_core::{Level, MemberState, SyncKind};

use crate::array::{RunOutcome, SimArray};
use crate::meta::member_metadata;

/// How the rebuild ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Rebuilt {
    /// Every member in sync.
    Whole,
    /// More members lost than the level survives (expected only after a second failure
    /// during recovery that the level cannot take).
    Failed,
    /// The power is to be cut now, the recovery part way (see `RebuildPlan::cut_at`).
    PowerCut,
}

pub struct RebuildPlan<'a> {
    pub plan: &'a AssemblyPlan,
    /// Offered index -> member (see `assemble_members`).
    pub offered: &'a [usize],
    /// Members whose disk gave write or flush errors: replaced, never re-added.
    pub erroring: &'a [bool],
    /// Fail this member once the first recovery is a third of the way (`None`: no second
    /// failure).
    pub second_failure: Option<usize>,
    /// Stop for a power cut once a recovery is this far (a fraction of it), to show it
    /// resumes from its checkpoint after re-assembly.
    pub cut_at: Option<f64>,
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

/// Virtual time a rebuild step may take before the checker calls it stuck (a recovery that
/// never ends would otherwise keep `uraid sim` running for ever).
const SETTLE_LIMIT_NS: u64 = 600_000_000_000;

fn run_idle(array: &mut SimArray<Array>) -> Result<(), String> {
    match array.run_until(array.now_ns() + SETTLE_LIMIT_NS) {
        RunOutcome::Idle => Ok(()),
        RunOutcome::TimeReached => Err(format!(
            "the rebuild after the power cycle never settled: {} s of virtual time, sync {:?}, members {:?}",
            SETTLE_LIMIT_NS / 1_000_000_000,
            array.engine().engine().sync_status(),
            array.engine().engine().member_states()
        )),
        other => Err(format!("the rebuild after the power cycle ended {other:?}")),
    }
}

/// The stale member of `slot` the assembly named, if its disk answers and may come back.
fn stale_member(rp: &RebuildPlan, array: &SimArray<Array>, slot: usize) -> Option<usize> {
    let st = rp.plan.stale.iter().find(|s| s.slot == Some(slot as u32))?;
    let member = rp.offered[st.member];
    (!rp.erroring[member] && !array.disks().is_failed(member) && !held(array, member)).then_some(member)
}

/// Is the disk an active member or a spare of the array (not one it has failed)?
fn held(array: &SimArray<Array>, disk: usize) -> bool {
    array
        .engine()
        .superblocks()
        .member(disk as u64)
        .is_some_and(|m| !matches!(m.role, DevRole::Faulty { .. }))
}

/// The bay whose disk is swapped for a blank one to bring `slot` back: the one the slot
/// last used, else the first the array does not hold (a failed or a let-go disk), one
/// another slot's stale member is in last.
fn free_bay(rp: &RebuildPlan, array: &SimArray<Array>, slot: usize) -> Result<usize, String> {
    let stale: Vec<usize> = rp.plan.stale.iter().map(|s| rp.offered[s.member]).collect();
    let count = array.disks().member_count();
    let last = array.engine().engine().io_member(slot);
    let mut bays: Vec<usize> =
        std::iter::once(last).chain(0..count).filter(|&d| d < count && !held(array, d)).collect();
    bays.sort_by_key(|d| (*d != last, stale.contains(d)));
    bays.first().copied().ok_or_else(|| format!("no free bay for a disk to bring slot {slot} back"))
}

/// `uraid add` of the disk `member` (its superblock written first, as mdadm writes it):
/// the array decides whether it is rebuilt in full or only where the bitmap says it missed
/// writes. Returns what the array made of it.
pub fn add_disk(array: &mut SimArray<Array>, member: usize, returning: bool) -> Result<Added, String> {
    let m = new_member(array, member, returning)?;
    let now = array.now_ns();
    array.engine_mut().add_member(m, now)
}

/// `uraid replace` of the member in `slot` by the blank disk `bay` (its superblock written
/// first): md's want_replacement, the disk rebuilt beside the member, which stays.
pub fn replace_with_disk(array: &mut SimArray<Array>, slot: usize, bay: usize) -> Result<(), String> {
    array.engine().may_replace(slot)?;
    let m = new_member(array, bay, false)?;
    let now = array.now_ns();
    array.engine_mut().replace_member(slot, m, now)
}

/// The disk `member` made ready to join: its old metadata read (a member coming back), the
/// array's faulty entry of it removed, its new superblock and bitmap written and flushed.
fn new_member(array: &mut SimArray<Array>, member: usize, returning: bool) -> Result<NewMember, String> {
    // What the disk carries as a member coming back: its superblock and its bad-block log
    // (read before its new superblock goes over them, as `uraid add` reads them).
    let meta = returning.then(|| member_metadata(array.disks(), member));
    let previous = meta.as_ref().and_then(|m| m.offered.superblock.clone().ok());
    let bad_blocks = meta.and_then(|m| m.bad_blocks.ok().flatten());
    // The array's own entry of this disk (faulty) leaves first, as `uraid remove` does (no
    // time passes before the add: another slot failing meanwhile would take its place).
    let now = array.now_ns();
    if array.engine().superblocks().member(member as u64).is_some() {
        array.engine_mut().remove(member as u64, now)?;
    }
    let dev_sectors = array.disks().store(member).size_bytes() / 512;
    let mut uuid = [0xadu8; 16];
    uuid[..8].copy_from_slice(&(array.now_ns() ^ member as u64).to_le_bytes());
    let name = format!("member{member}");
    let sb = array.engine().new_member_superblock(dev_sectors, uuid, &name)?;
    let bitmap = array.engine().bitmap_area();
    let store = array.disks_mut().store_mut(member);
    let mut written = sb.clone();
    store.write(sb.super_offset * 512, &written.update_csum()).map_err(|e| format!("{name}: {e:?}"))?;
    if let Some((off, area)) = bitmap {
        let at = sb.super_offset.saturating_add_signed(i64::from(off)) * 512;
        store.write(at, &area).map_err(|e| format!("{name}: {e:?}"))?;
    }
    store.flush_all();
    Ok(NewMember { key: member as u64, name, sb, previous, replaces: None, bad_blocks })
}

/// What the rebuild did.
#[derive(Debug, Default)]
pub struct RebuildReport {
    /// Slots brought back (re-added or replaced), in order, repeats included.
    pub brought_back: Vec<usize>,
    /// The second failure hit while a recovery ran: members not in sync right after it.
    pub second_failure_not_in_sync: Option<usize>,
    /// The second failure was tried (it hit, or no recovery ran long enough).
    pub second_failure_tried: bool,
}

/// Brings every missing or faulty slot back and runs until the array is whole or failed.
/// `log` gets a line per step (for the report's fault list).
pub fn rebuild(
    array: &mut SimArray<Array>,
    rp: &RebuildPlan,
    report: &mut RebuildReport,
    log: &mut Vec<String>,
) -> Result<Rebuilt, String> {
    let n = array.engine().engine().member_states().len();
    let mut second_failure = rp.second_failure;
    let mut first_round = true;
    // Each round brings back every slot out; a slot fails again at most once per planned
    // failure, so n + 2 rounds are plenty.
    for _ in 0..n + 2 {
        run_idle(array)?;
        if array.engine().engine().is_failed() {
            return Ok(Rebuilt::Failed);
        }
        // A recovery a source's failure stopped short leaves its member half rebuilt:
        // failed and added again (mdadm --fail, --add), it is rebuilt from the start.
        let states = array.engine().engine().member_states();
        for (m, s) in states.iter().enumerate() {
            if matches!(s, MemberState::Recovering { .. }) && !array.engine().engine().sync_active() {
                log.push(format!("member {m} half rebuilt: failed and added again"));
                array.fail_member(m);
            }
        }
        run_idle(array)?;
        if array.engine().engine().is_failed() {
            return Ok(Rebuilt::Failed);
        }
        let out: Vec<usize> = array
            .engine()
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
        // In slot order: the array gives each the lowest free slot, which is its own.
        for &slot in &out {
            report.brought_back.push(slot);
            let stale = if first_round { stale_member(rp, array, slot) } else { None };
            let added = match stale {
                Some(member) => {
                    let added = add_disk(array, member, true)?;
                    log.push(match &added {
                        Added::Rebuilding { readd: Ok(r), .. } => {
                            format!("stale member {member} re-added from the bitmap ({} regions)", r.len())
                        }
                        _ => format!("stale member {member} re-added, rebuilt in full"),
                    });
                    added
                }
                None => {
                    let bay = free_bay(rp, array, slot)?;
                    log.push(if bay == slot {
                        format!("member {slot} replaced by a blank disk and recovered")
                    } else {
                        format!("slot {slot}: member {bay} replaced by a blank disk and recovered")
                    });
                    if array.engine().superblocks().member(bay as u64).is_some() {
                        let now = array.now_ns();
                        array.engine_mut().remove(bay as u64, now)?;
                    }
                    array.disks_mut().replace_member(bay);
                    add_disk(array, bay, false)?
                }
            };
            if !matches!(added, Added::Rebuilding { slot: s, .. } if s == slot) {
                return Err(format!("the member brought back for slot {slot} did not take it: {added:?}"));
            }
        }
        first_round = false;
        if let Some(victim) = second_failure.take() {
            report.second_failure_tried = true;
            report.second_failure_not_in_sync = fail_during_recovery(array, victim, log)?;
        }
        if let Some(frac) = rp.cut_at {
            if run_until_recovered(array, frac)? {
                return Ok(Rebuilt::PowerCut);
            }
        }
    }
    Err("the rebuild after the power cycle did not converge".into())
}

/// Runs until the recovery under way has done `frac` of its work; false when none ran
/// that long.
fn run_until_recovered(array: &mut SimArray<Array>, frac: f64) -> Result<bool, String> {
    loop {
        let Some(st) =
            array.engine().engine().sync_status().filter(|s| matches!(s.kind, SyncKind::Recovery { .. }))
        else {
            return Ok(false);
        };
        if st.done_sectors as f64 >= st.total_sectors as f64 * frac {
            return Ok(true);
        }
        match array.run_until(array.now_ns() + 200_000) {
            RunOutcome::TimeReached | RunOutcome::Idle => {}
            RunOutcome::PowerLost { .. } => return Ok(true),
            other => return Err(format!("the recovery before the power cut ended {other:?}")),
        }
    }
}

/// Runs until the recovery under way is a third done, then fails `victim` (fail-stop).
/// Returns how many members are then not in sync (the victim included), if it failed.
fn fail_during_recovery(
    array: &mut SimArray<Array>,
    victim: usize,
    log: &mut Vec<String>,
) -> Result<Option<usize>, String> {
    loop {
        let Some(st) =
            array.engine().engine().sync_status().filter(|s| matches!(s.kind, SyncKind::Recovery { .. }))
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
    let states = array.engine().engine().member_states();
    if states[victim] != MemberState::InSync {
        return Ok(None);
    }
    log.push(format!("member {victim} failed during the recovery"));
    let disk = array.engine().engine().io_member(victim);
    array.disks_mut().fail_member(disk);
    Ok(Some(states.iter().filter(|s| **s != MemberState::InSync).count() + 1))
}
