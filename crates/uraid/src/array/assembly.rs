//! From member paths to an assembly plan: read every member's metadata, let
//! `uraid_core::meta::plan_assembly` decide. Nothing here writes to a member.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use uraid_core::array::StartMember;
use uraid_core::meta::{AssembleOptions, AssemblyPlan, MemberMetadata, ResyncNeed, Superblock};
use uraid_core::Geometry;

use super::member::{open_members, MemberDev};
use super::report::{binary_bytes, count, resync_whole_sectors, sector_of};

pub struct Assembled {
    /// Offered members, in the order given.
    pub members: Vec<MemberDev>,
    /// Each offered member's metadata as read.
    pub metadata: Vec<MemberMetadata>,
    /// Each offered member's superblock (all parsed: assembly refuses otherwise).
    pub superblocks: Vec<Superblock>,
    pub plan: AssemblyPlan,
    pub geometry: Geometry,
}

impl Assembled {
    /// What `Array::start` takes: each offered member under its index, which is also its
    /// index in the executor.
    pub fn start_members(&self) -> anyhow::Result<Vec<StartMember>> {
        self.members
            .iter()
            .zip(&self.metadata)
            .zip(&self.superblocks)
            .enumerate()
            .map(|(key, ((m, meta), sb))| {
                Ok(StartMember {
                    key: key as u64,
                    name: m.name.clone(),
                    sb: sb.clone(),
                    bad_blocks: meta.bad_blocks.clone().map_err(|e| anyhow!("{e}"))?,
                })
            })
            .collect()
    }

    /// A dirty RAID5 with a partial parity log: md replays the log before it starts.
    pub fn ppl_replay_due(&self) -> bool {
        let fresh = &self.superblocks[self.plan.freshest];
        uraid_core::meta::has_ppl(fresh) && self.plan.resync_offset != uraid_core::meta::MAX_SECTOR
    }

    /// md's ppl_recover before a dirty RAID5 with a partial parity log starts: the parity
    /// of the stripes its logs name is rewritten and made durable before `Array::start`
    /// empties the logs. Returns what to tell the operator (None: nothing to replay).
    pub fn replay_ppl(&mut self) -> anyhow::Result<Option<String>> {
        if !self.ppl_replay_due() {
            return Ok(None);
        }
        let members = &self.members;
        let rec = uraid_core::meta::ppl_recover(&self.plan, &self.superblocks, &mut |m, offset, len| {
            let dev = &members[m];
            match dev.read_at(offset, len) {
                Ok(b) if b.len() == len => Ok(b),
                Ok(_) => Err(format!("{}: short read at byte {offset}", dev.name)),
                Err(e) => Err(format!("{}: reading byte {offset}: {e}", dev.name)),
            }
        })
        .map_err(|e| anyhow!("replaying the partial parity log: {e}; nothing was written"))?;
        let mut written = std::collections::BTreeSet::new();
        for w in &rec.writes {
            let dev = &self.members[w.member];
            dev.write_at(w.offset_bytes, &w.bytes).map_err(|e| {
                anyhow!("{}: writing recovered parity at byte {}: {e}", dev.name, w.offset_bytes)
            })?;
            written.insert(w.member);
        }
        // Durable before the logs that describe it are emptied.
        for m in written {
            let dev = &self.members[m];
            dev.sync().map_err(|e| anyhow!("{}: flushing recovered parity: {e}", dev.name))?;
        }
        Ok(Some(self.plan.apply_ppl_recovery(&rec)))
    }
}

/// How `plan_assembly`'s warning of a dirty start begins.
const UNCLEAN: &str = "array was not shut down cleanly";
const NEW_ARRAY: &str = "new array";

/// How much a start's resync covers: "resync of 3 bitmap chunks (192.00 MiB)", "resync of
/// the whole array (16.00 TiB of each member)", "resync from sector N (45.2%) to the end".
pub fn resync_words(plan: &AssemblyPlan) -> Option<String> {
    let whole = resync_whole_sectors(plan.level, plan.size_sectors, plan.array_sectors);
    let each = if plan.level == 10 { "of the array" } else { "of each member" };
    match &plan.resync {
        ResyncNeed::None => None,
        ResyncNeed::Full { from_sector: 0 } => {
            Some(format!("resync of the whole array ({} {each})", binary_bytes(whole * 512)))
        }
        ResyncNeed::Full { from_sector } => {
            Some(format!("resync from {} to the end", sector_of(*from_sector, whole)))
        }
        ResyncNeed::Bitmap { regions } => {
            let sectors: u64 = regions.iter().map(|(_, len)| len).sum();
            let chunk_sectors =
                plan.bitmap.as_ref().and_then(|b| b.chunk_bytes).map_or(0, |b| u64::from(b) / 512).max(1);
            let chunks: u64 = regions.iter().map(|(_, len)| len.div_ceil(chunk_sectors)).sum();
            Some(format!(
                "resync of {} ({} {each})",
                count(chunks as usize, "bitmap chunk"),
                binary_bytes(sectors * 512)
            ))
        }
    }
}

/// Opens, checks and plans. `writable` decides how the files are opened (and claims
/// them); `force` is mdadm's `--force` (see `AssembleOptions::force`).
pub fn assemble(paths: &[PathBuf], run: bool, force: bool, writable: bool) -> anyhow::Result<Assembled> {
    if paths.is_empty() {
        bail!("no members given: name the array's member files or devices");
    }
    let members = open_members(paths, writable)?;
    let metadata: Vec<MemberMetadata> = members.iter().map(MemberDev::metadata).collect();
    let offered: Vec<_> = metadata.iter().map(|m| m.offered.clone()).collect();
    let mut plan = uraid_core::meta::plan_assembly(&offered, &AssembleOptions { run, uuid: None, force })
        .map_err(|e| anyhow!("{e}"))?;
    // The plan says a resync is due; the operator is told how much.
    if let Some(words) = resync_words(&plan) {
        for lead in [UNCLEAN, NEW_ARRAY] {
            // Only the resync's own line ("new array: slot 2 is built ..." stays as it is).
            if let Some(w) =
                plan.warnings.iter_mut().find(|w| w.starts_with(lead) && w.ends_with("resync needed"))
            {
                *w = format!("{lead}: {words}");
            }
        }
    }
    // plan_assembly refuses any member whose superblock does not parse.
    let superblocks: Vec<Superblock> = offered
        .into_iter()
        .map(|o| o.superblock.map_err(|e| anyhow!("{}", e)))
        .collect::<anyhow::Result<_>>()?;
    let geometry = plan.geometry().map_err(|e| anyhow!("{e}; refusing to start (nothing was written)"))?;
    Ok(Assembled { members, metadata, superblocks, plan, geometry })
}
