//! Silent corruption and md's repair. md cannot see a flipped bit when it reads: only a
//! scrub (`echo repair > sync_action`) finds it, by comparing copies or parity. What repair
//! can put right depends on the level: RAID6 locates the culprit block from P and Q (as
//! mdadm's raid6check does) and restores it; P or Q corruption is rewritten on any parity
//! level; mirrors are made to agree with md's first copy. A RAID4/5 data block or a RAID1/10
//! first copy that was corrupted cannot be told from a good one: repair makes the rest
//! agree with the damage. That loss is md's, counted as exposure, never passed silently.

use std::collections::BTreeSet;

use uraid_core::array::Array;
use uraid_core::{Geometry, Level, ScrubKind};

use crate::array::{RunOutcome, SimArray};
use crate::disks::{Fault, FaultKind, FaultTrigger};
use crate::meta::{member_metadata, slot_disks};
use crate::verify::{direct_digests, members_agree};

const SECTOR: u64 = 512;

/// What a corruption and its repair came to.
#[derive(Debug)]
pub struct Repaired {
    /// Which block was damaged, for the report.
    pub what: String,
    /// md's mismatch_cnt of the repair.
    pub mismatch_cnt: u64,
    /// Sectors that read back damaged after the repair, where md cannot tell (see above).
    pub exposures: u64,
}

/// The block a seed corrupts: (member, member sector, sectors, description).
fn choose_block(geo: &Geometry, seed_pick: &dyn Fn(u64, u64) -> u64) -> (usize, u64, u64, String) {
    let s = seed_pick(1, geo.array_sectors() - 8);
    let (at, room) = geo.map_sector(s);
    let len = room.min(8);
    if geo.level.has_parity() {
        let (stripe, _, off) = geo.parity_locate(s);
        let map = geo.stripe_map(stripe);
        let member_sector = stripe * geo.chunk_sectors + off;
        return match seed_pick(2, 1 + geo.level.parity_disks() as u64) {
            0 => (at.member, at.member_sector, len, format!("data of array sector {s}")),
            1 => (map.pd_idx, member_sector, len, format!("P of array sector {s}")),
            _ => (map.qd_idx.expect("raid6"), member_sector, len, format!("Q of array sector {s}")),
        };
    }
    let mut copies = Vec::new();
    geo.copies(s, &mut copies);
    let k = seed_pick(3, copies.len() as u64) as usize;
    let c = copies[k];
    (c.member, c.member_sector, len, format!("copy {k} of array sector {s}"))
}

/// Flips bits in one block the seed picks, runs md's repair, then checks what the members
/// hold against `image` (each sector's digest before the damage). The array must be whole,
/// resynced and idle. `None` when a member failed during the repair.
pub fn corrupt_and_repair(
    array: &mut SimArray<Array>,
    geo: &Geometry,
    image: &[u64],
    data_offset_bytes: u64,
    seed_pick: &dyn Fn(u64, u64) -> u64,
) -> Result<Option<Repaired>, String> {
    let (member, member_sector, len, what) = choose_block(geo, seed_pick);
    let offset_bytes = data_offset_bytes + member_sector * SECTOR;
    let at = array.now_ns();
    let disk = slot_disks(array.engine())[member];
    array.disks_mut().schedule(Fault {
        trigger: FaultTrigger::AtNs(at),
        member: disk,
        kind: FaultKind::Corrupt { offset_bytes, len_bytes: len * SECTOR, bit_flips: 4 },
    });
    if array.run_until_idle() != RunOutcome::Idle {
        return Err("planting the corruption did not finish".into());
    }
    let record =
        array.disks().fault_log().last().filter(|r| matches!(r.fault.kind, FaultKind::Corrupt { .. }));
    let damaged: BTreeSet<u64> = record
        .map(|r| r.corrupted_offsets.iter().map(|&b| (b - data_offset_bytes) / SECTOR).collect())
        .unwrap_or_default();
    // Bits flipped: the members now disagree somewhere, which the repair must find.
    let visible = !damaged.is_empty();
    let now = array.now_ns();
    let before = slot_disks(array.engine());
    array.engine_mut().scrub(Some(ScrubKind::Repair), now)?;
    if array.run_until_idle() != RunOutcome::Idle {
        return Err("the repair did not finish".into());
    }
    // A fault planned before the power cut may fire now: md stops the repair (it does not
    // repair a degraded array), and there is nothing more to judge. A hot spare that took
    // the failed member's slot was rebuilt from the damage meanwhile.
    if array.engine().engine().member_states().iter().any(|s| *s != uraid_core::MemberState::InSync)
        || slot_disks(array.engine()) != before
    {
        return Ok(None);
    }
    let mismatch_cnt = array.engine().engine().mismatch_cnt();
    // A member lists these rows bad (its writes failed there): md's repair counts that block
    // failed (analyse_stripe) and never reads it. Listed on another member, the page holds
    // more faults than the level can tell apart, and the repair may find nothing or solve
    // the listed block from the damage, as md's does; listed on the damaged member itself,
    // the damage is in a block md never takes for good. Either way the rows are counted as
    // an exposure, and everything outside them must be untouched.
    let slots = slot_disks(array.engine());
    let first = data_offset_bytes / SECTOR;
    // In whole 4 KiB pages: md's stripe works page by page, so a listed sector anywhere in
    // the damaged block's pages puts them beyond what the repair can tell apart.
    let rows = member_sector / 8 * 8..(member_sector + len).div_ceil(8) * 8;
    let rows_listed = slots.iter().any(|&d| {
        member_metadata(array.disks(), d).bad_blocks.ok().flatten().is_some_and(|bb| {
            bb.entries().any(|(s, l)| {
                s.saturating_sub(first) < rows.end && (s + l).saturating_sub(first) > rows.start
            })
        })
    });
    if visible && mismatch_cnt == 0 && !rows_listed {
        return Err(format!("repair found nothing although the members disagree ({what} corrupted)"));
    }
    if !rows_listed {
        members_agree(array.disks(), &slots, geo, data_offset_bytes)
            .map_err(|e| format!("after repairing {what} the members still disagree: {e}"))?;
    }
    // Which array sectors had the damaged block as their data or a copy (or, where a member
    // lists the rows bad, any block in those rows).
    let unidentifiable = matches!(geo.level, Level::Raid1 | Level::Raid10 | Level::Raid4 | Level::Raid5);
    let mut copies = Vec::new();
    let mut exposures = 0;
    let direct = direct_digests(array.disks(), &slots, geo, data_offset_bytes);
    for (s, (&now, &before)) in direct.iter().zip(image).enumerate() {
        if now.is_none_or(|d| d == before) {
            continue;
        }
        geo.copies(s as u64, &mut copies);
        let exposed = if rows_listed {
            copies.iter().any(|c| rows.contains(&c.member_sector))
        } else {
            unidentifiable && copies.iter().any(|c| c.member == member && damaged.contains(&c.member_sector))
        };
        if !exposed {
            return Err(format!("after repairing {what} array sector {s} holds something it never held"));
        }
        exposures += 1;
    }
    let what = if rows_listed { format!("{what}, rows listed bad") } else { what };
    Ok(Some(Repaired { what, mismatch_cnt, exposures }))
}
