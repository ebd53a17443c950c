//! Members that join a running array: hot spares added to a whole array (`uraid add`), and
//! a replacement rebuilt beside the member it replaces (`uraid replace`, md's
//! want_replacement), maybe with the power cut while it copies.

use uraid_core::array::{Added, Array};

use super::spec::{seed_pick, Run, SimReport, DRAWS};
use crate::array::SimArray;
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
