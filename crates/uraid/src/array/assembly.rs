//! From member paths to an assembly plan: read every member's metadata, let
//! `uraid_core::meta::plan_assembly` decide. Nothing here writes to a member.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use uraid_core::array::StartMember;
use uraid_core::meta::{AssembleOptions, AssemblyPlan, MemberMetadata, Superblock};
use uraid_core::Geometry;

use super::member::{open_members, MemberDev};

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
    let plan = uraid_core::meta::plan_assembly(&offered, &AssembleOptions { run, uuid: None, force })
        .map_err(|e| anyhow!("{e}"))?;
    // plan_assembly refuses any member whose superblock does not parse.
    let superblocks: Vec<Superblock> = offered
        .into_iter()
        .map(|o| o.superblock.map_err(|e| anyhow!("{}", e)))
        .collect::<anyhow::Result<_>>()?;
    let geometry = plan.geometry().map_err(|e| anyhow!("{e}; refusing to start (nothing was written)"))?;
    Ok(Assembled { members, metadata, superblocks, plan, geometry })
}
