//! From member paths to an engine configuration: read every superblock, let
//! `uraid_core::meta::plan_assembly` decide, and turn its plan into an [`ArrayConfig`].
//! Nothing here writes to a member.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use uraid_core::meta::{AssembleOptions, AssemblyPlan, Superblock};
use uraid_core::{ArrayConfig, Geometry, Level, Tunables};

use super::member::{open_members, MemberDev};

pub struct Assembled {
    /// Offered members, in the order given.
    pub members: Vec<MemberDev>,
    /// Each offered member's superblock (all parsed: assembly refuses otherwise).
    pub superblocks: Vec<Superblock>,
    pub plan: AssemblyPlan,
    pub config: ArrayConfig,
    /// Per slot: the offered member in it.
    pub slot_member: Vec<Option<usize>>,
}

/// Opens, checks and plans. `writable` decides how the files are opened (and claims
/// them); `force` is mdadm's `--force` (see `AssembleOptions::force`).
pub fn assemble(paths: &[PathBuf], run: bool, force: bool, writable: bool) -> anyhow::Result<Assembled> {
    if paths.is_empty() {
        bail!("no members given: name the array's member files or devices");
    }
    let members = open_members(paths, writable)?;
    let offered: Vec<_> = members.iter().map(MemberDev::offered).collect();
    let plan = uraid_core::meta::plan_assembly(&offered, &AssembleOptions { run, uuid: None, force })
        .map_err(|e| anyhow!("{e}"))?;
    // plan_assembly refuses any member whose superblock does not parse.
    let superblocks: Vec<Superblock> = offered
        .into_iter()
        .map(|o| o.superblock.map_err(|e| anyhow!("{}", e)))
        .collect::<anyhow::Result<_>>()?;
    let level = Level::from_md_level(plan.level).ok_or_else(|| {
        anyhow!("raid level {} is not supported by the engine (0, 1, 4, 5, 6, 10 are)", plan.level)
    })?;
    let member_sectors: Vec<u64> = plan
        .slots
        .iter()
        .map(|s| match (level, s) {
            (Level::Raid0, Some(m)) => m.data_size_sectors,
            _ => plan.size_sectors,
        })
        .collect();
    let geometry = Geometry::new(
        level,
        plan.raid_disks as usize,
        plan.layout,
        u64::from(plan.chunk_sectors),
        &member_sectors,
    )
    .map_err(|e| anyhow!("the superblocks describe an impossible geometry: {e}; nothing was written"))?;
    if geometry.array_sectors() != plan.array_sectors {
        bail!(
            "array size disagreement: the superblocks give {} sectors, the geometry {}; refusing to \
             start (nothing was written)",
            plan.array_sectors,
            geometry.array_sectors()
        );
    }
    let slot_member = plan.slots.iter().map(|s| s.as_ref().map(|m| m.member)).collect();
    let config = ArrayConfig {
        geometry,
        members: plan.member_configs(),
        tunables: Tunables::default(),
        read_only: false,
    };
    Ok(Assembled { members, superblocks, plan, config, slot_member })
}
