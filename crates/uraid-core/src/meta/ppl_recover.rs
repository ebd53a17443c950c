//! md's `ppl_recover` at the start of a dirty RAID5 with a partial parity log: for every
//! entry of each member's newest log, the parity of the stripes it names is recomputed
//! from the logged partial parity and the data the stripes hold now, so parity agrees
//! with the data whichever of the stripe's writes landed before the crash (the write
//! hole closed, degraded or not). Sans-IO: the caller supplies the reads and performs the
//! parity writes this returns, then makes them durable before the logs are emptied
//! (`Array::start` empties them, as md's `ppl_write_empty_header`).

use super::assemble::plan::{AssemblyPlan, ResyncNeed};
use super::ppl::{crc32c_update, latest_ppl_header, ppl_area, ppl_signature, ppl_usable_sectors, PplEntry};
use super::superblock::{feature, level, Superblock, MAX_SECTOR};
use crate::geometry::Geometry;

/// One parity block to write: `bytes` at `offset_bytes` (absolute) of the offered member
/// `member`, the member in `slot`.
#[derive(Clone, PartialEq, Eq)]
pub struct PplParityWrite {
    pub slot: usize,
    pub member: usize,
    pub offset_bytes: u64,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for PplParityWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "slot {} (member {}) {} bytes at byte {}",
            self.slot,
            self.member,
            self.bytes.len(),
            self.offset_bytes
        )
    }
}

/// What the replay found and what it asks to be written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PplRecovery {
    /// The parity writes, in md's order (slot by slot, entry by entry).
    pub writes: Vec<PplParityWrite>,
    /// Entries replayed (md's `recovered_entries`).
    pub recovered_entries: u32,
    /// Logs or entries that could not be used: no valid header, a partial parity checksum
    /// that does not match (a torn log write), an entry naming another parity member
    /// (md's `mismatch_count`). Any of these keeps the resync the array owes.
    pub mismatch_count: u32,
    /// Entry rows left as they are because a data member they modified is missing (its
    /// data is gone, so no parity can be computed for them, as in md).
    pub skipped_rows: u32,
}

/// Reads `len` bytes at absolute byte `offset` of offered member `member`.
pub type PplRead<'a> = dyn FnMut(usize, u64, usize) -> Result<Vec<u8>, String> + 'a;

/// Does this array keep a partial parity log md would replay?
pub fn has_ppl(sb: &Superblock) -> bool {
    sb.level == level::RAID5 && sb.feature_map & (feature::PPL | feature::MULTIPLE_PPLS) != 0
}

/// md's ppl_load + ppl_recover for the array `plan` assembles (`superblocks` in the plan's
/// offered order). Nothing is recovered from a clean array (md replays only when
/// `recovery_cp` is not MaxSector), nor from a read-only start (the caller's choice).
pub fn ppl_recover(
    plan: &AssemblyPlan,
    superblocks: &[Superblock],
    read: &mut PplRead<'_>,
) -> Result<PplRecovery, String> {
    let mut out = PplRecovery::default();
    let Some(fresh) = superblocks.get(plan.freshest) else { return Ok(out) };
    if !has_ppl(fresh) || plan.resync_offset == MAX_SECTOR {
        return Ok(out);
    }
    let geo = plan.geometry()?;
    let signature = ppl_signature(&plan.uuid);
    for (slot, s) in plan.slots.iter().enumerate() {
        let Some(s) = s else { continue };
        let sb = superblocks.get(s.member).ok_or("the plan names a member that was not offered")?;
        let Some((area_sector, area_sectors)) = ppl_area(sb) else { continue };
        let Some(usable) = ppl_usable_sectors(area_sectors) else {
            out.mismatch_count += 1;
            continue;
        };
        let name = |e: String| format!("slot {slot}'s partial parity log: {e}");
        let latest = latest_ppl_header(usable, signature, &mut |off| {
            read(s.member, (area_sector + off) * 512, super::ppl::PPL_HEADER_SIZE)
        })
        .map_err(name)?;
        let Some((offset, header)) = latest else {
            out.mismatch_count += 1;
            continue;
        };
        let mut pp_sector = area_sector + offset + (super::ppl::PPL_HEADER_SIZE / 512) as u64;
        for e in &header.entries {
            let pp = read(s.member, pp_sector * 512, e.pp_size as usize).map_err(name)?;
            pp_sector += u64::from(e.pp_size) / 512;
            if pp.len() != e.pp_size as usize || !crc32c_update(!0, &pp) != e.checksum {
                // A torn log write: its stripes were not written yet, so nothing to do.
                out.mismatch_count += 1;
                continue;
            }
            match recover_entry(plan, &geo, slot, e, &pp, read, &mut out) {
                Ok(()) => out.recovered_entries += 1,
                Err(EntryError::Mismatch) => out.mismatch_count += 1,
                Err(EntryError::Io(err)) => return Err(name(err)),
            }
        }
    }
    Ok(out)
}

enum EntryError {
    /// The entry does not describe stripes this log's member holds the parity of.
    Mismatch,
    Io(String),
}

/// md's `ppl_recover_entry`: the entry's rows, each the XOR of the data of the modified
/// members (the `data_disks` logical data blocks from `data_sector`'s) and of the logged
/// partial parity, written as the row's parity.
fn recover_entry(
    plan: &AssemblyPlan,
    geo: &Geometry,
    log_slot: usize,
    e: &PplEntry,
    pp: &[u8],
    read: &mut PplRead<'_>,
    out: &mut PplRecovery,
) -> Result<(), EntryError> {
    let chunk = geo.chunk_sectors;
    let all_data = geo.data_disks() as u64;
    let pp_sectors = u64::from(e.pp_size) / 512;
    let data_sectors = u64::from(e.data_size) / 512;
    let first = e.data_sector;
    let (data_disks, strip_sectors, last) = if pp_sectors < chunk {
        let (disks, strip) = match e.data_size.checked_div(e.pp_size) {
            Some(disks) => (u64::from(disks), pp_sectors),
            None => (all_data, data_sectors / all_data),
        };
        (disks, strip, first + disks.saturating_sub(1) * chunk + strip)
    } else {
        (all_data, chunk, first + data_sectors)
    };
    if data_disks == 0 || data_disks > all_data || strip_sectors == 0 || last > geo.array_sectors() {
        return Err(EntryError::Mismatch);
    }
    // md reads and writes whole pages when the entry starts and ends on one.
    let block = if first.is_multiple_of(8) && last.is_multiple_of(8) { 8 } else { 1 };
    let bytes = (block * 512) as usize;
    let mut i = 0;
    while i < strip_sectors {
        let mut parity = vec![0u8; bytes];
        let mut update = false;
        for disk in 0..data_disks {
            let r = first + i + disk * chunk;
            if r >= last {
                continue;
            }
            update = true;
            let (ext, _) = geo.map_sector(r);
            let usable = plan
                .slots
                .get(ext.member)
                .and_then(|s| s.as_ref())
                .filter(|m| m.recovery_offset_sectors.is_none_or(|off| ext.member_sector < off));
            let Some(m) = usable else {
                // A modified member is missing: its rows cannot be given parity.
                update = false;
                out.skipped_rows += 1;
                break;
            };
            let at = (m.data_offset_sectors + ext.member_sector) * 512;
            let data = read(m.member, at, bytes).map_err(EntryError::Io)?;
            if data.len() != bytes {
                return Err(EntryError::Io(format!("short read of member {} at byte {at}", m.member)));
            }
            parity.iter_mut().zip(&data).for_each(|(p, d)| *p ^= d);
        }
        if update {
            if e.pp_size > 0 {
                let at = (i * 512) as usize;
                let pp_block = pp.get(at..at + bytes).ok_or(EntryError::Mismatch)?;
                parity.iter_mut().zip(pp_block).for_each(|(p, d)| *p ^= d);
            }
            let (stripe, _, off) = geo.parity_locate(first + i);
            let pd = geo.stripe_map(stripe).pd_idx;
            if pd != e.parity_disk as usize || pd != log_slot {
                return Err(EntryError::Mismatch);
            }
            // The log's own member holds this parity, so it is present.
            let m = plan.slots[pd].as_ref().ok_or(EntryError::Mismatch)?;
            out.writes.push(PplParityWrite {
                slot: pd,
                member: m.member,
                offset_bytes: (m.data_offset_sectors + stripe * chunk + off) * 512,
                bytes: parity,
            });
        }
        i += block;
    }
    Ok(())
}

impl AssemblyPlan {
    /// After md's ppl_recover: when it replayed entries and found every log sound, the
    /// stripes that were being written are consistent again and the array starts clean,
    /// with no resync (md's `ppl_init_log` sets `recovery_cp = MaxSector` then). Returns
    /// what to tell the operator.
    pub fn apply_ppl_recovery(&mut self, r: &PplRecovery) -> String {
        let rows = r.writes.len();
        let mut msg = format!(
            "partial parity log replayed: {} entr{} recovered, {rows} parity block{} rewritten",
            r.recovered_entries,
            if r.recovered_entries == 1 { "y" } else { "ies" },
            if rows == 1 { "" } else { "s" },
        );
        if r.skipped_rows > 0 {
            msg += &format!(
                ", {} row{} left as they were (a member they wrote is missing)",
                r.skipped_rows,
                if r.skipped_rows == 1 { "" } else { "s" }
            );
        }
        if r.recovered_entries > 0 && r.mismatch_count == 0 && self.resync_offset == 0 {
            self.resync = ResyncNeed::None;
            self.resync_offset = MAX_SECTOR;
            self.warnings.retain(|w| !w.contains("resync"));
            msg += "; the array is consistent, no resync needed";
        } else if self.resync != ResyncNeed::None {
            let why = if r.mismatch_count > 0 {
                format!(
                    "{} log or entr{} unusable",
                    r.mismatch_count,
                    if r.mismatch_count == 1 { "y" } else { "ies" }
                )
            } else if r.recovered_entries == 0 {
                "the logs name no stripe".to_string()
            } else {
                "a resync was already under way".to_string()
            };
            msg += &format!("; the resync stays owed ({why}), as md does");
        }
        msg
    }
}
