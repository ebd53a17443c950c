//! A reshape md left in progress, read from the freshest superblock (md.c
//! `super_1_validate`: raid_disks is the new count, `delta_disks` the change, `new_*` the
//! next layout, `new_offset` the signed move of each member's data offset).

use crate::geometry::Geometry;
use crate::meta::superblock::{feature, Superblock};
use crate::reshape::{unsupported, ReshapeGeometry};

/// The reshape the freshest superblock records, for an array of `member_sectors` per
/// member whose slots have `data_offsets`/`new_data_offsets` (device sectors, per slot of
/// the new count). Only what uraid handles is accepted: a raid4/5/6 growing by members or
/// changing its chunk or (raid5/6; raid5-to-raid6 after md's takeover is a raid6 layout
/// change) its layout, same level, with a moved data offset (no backup file): forwards,
/// or backwards (RESHAPE_BACKWARDS, which md writes only when the members stay the same:
/// a restripe whose data offset moved up).
pub(crate) fn from_superblock(
    sb: &Superblock,
    member_sectors: u64,
    data_offsets: Vec<u64>,
    new_data_offsets: Vec<u64>,
) -> Result<ReshapeGeometry, String> {
    use crate::geometry::Level;
    if !sb.has(feature::RESHAPE_ACTIVE) {
        return Err("no reshape is recorded".into());
    }
    let level = Level::from_md_level(sb.level)
        .filter(|l| l.has_parity())
        .ok_or_else(|| unsupported(&format!("a reshape of a raid{} array", sb.level)))?;
    if sb.new_level as i32 != sb.level {
        return Err(unsupported(&format!("a level change (raid{} to raid{})", sb.level, sb.new_level)));
    }
    if sb.new_layout != sb.layout && (level == Level::Raid4 || sb.delta_disks != 0) {
        return Err(unsupported(&format!(
            "a raid{} layout change ({} to {}){}",
            sb.level,
            sb.layout,
            sb.new_layout,
            if sb.delta_disks != 0 { " with a change of members" } else { "" }
        )));
    }
    let delta = sb.delta_disks;
    if delta < 0 {
        return Err(unsupported(&format!(
            "a reshape by {delta} members (a shrink; only growing is handled)"
        )));
    }
    if delta == 0 && sb.new_layout == sb.layout && sb.new_chunk == sb.chunksize {
        return Err(unsupported("a reshape that changes neither members, layout nor chunk"));
    }
    // md's super_1_validate: backwards when delta_disks < 0 (refused above) or the bit is
    // set, which super_1_sync writes only with delta_disks 0.
    let backwards = sb.has(feature::RESHAPE_BACKWARDS);
    if backwards && delta != 0 {
        return Err(unsupported(&format!("a backwards reshape by {delta} members")));
    }
    if !sb.has(feature::NEW_OFFSET) {
        return Err(unsupported(
            "a reshape without a moved data offset (md then relies on mdadm's backup file for the \
             critical section)",
        ));
    }
    let next_disks = sb.raid_disks as usize;
    let previous_disks = next_disks
        .checked_sub(delta as usize)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("delta_disks {delta} is more than raid_disks {next_disks}"))?;
    let (chunk, new_chunk) = (u64::from(sb.chunksize), u64::from(sb.new_chunk));
    // md's raid5 run(): the size is a whole number of both chunks.
    let member_sectors = member_sectors & !(chunk.max(new_chunk).max(1) - 1);
    let prev = Geometry::new(level, previous_disks, sb.layout, chunk, &vec![member_sectors; previous_disks])?;
    let next = Geometry::new(level, next_disks, sb.new_layout, new_chunk, &vec![member_sectors; next_disks])?;
    let r = ReshapeGeometry::new(prev, next, sb.reshape_position, backwards, data_offsets, new_data_offsets)?;
    if backwards && r.position_sectors > r.array_sectors() {
        return Err(format!(
            "reshape_position {} lies beyond the array ({} sectors) of a backwards reshape",
            r.position_sectors,
            r.array_sectors()
        ));
    }
    // raid5.c run(): "reshape_position too early for auto-recovery": the next stripe of
    // the new layout must be writable without touching what the previous layout holds.
    // (Backwards at 0 the reshape is done but for its last superblock round.)
    if (r.position_sectors != 0 || !backwards) && !r.next_stripe_is_safe() {
        return Err(unsupported(
            "the reshape's new layout overlaps data not yet copied (md would need mdadm's backup \
             file)",
        ));
    }
    Ok(r)
}
