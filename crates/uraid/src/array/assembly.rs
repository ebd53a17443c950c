//! From member paths to an engine configuration: read every superblock, let
//! `uraid_core::meta::plan_assembly` decide, and turn its plan into an [`ArrayConfig`].
//! Nothing here writes to a member.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use uraid_core::meta::{AssembleOptions, AssemblyPlan, ResyncNeed, Superblock};
use uraid_core::{ArrayConfig, Geometry, Level, MemberConfig, MemberState, Tunables};

use super::member::{open_members, MemberDev};

/// What a started engine must resync, in the engine's sync space (member sectors for
/// raid4/5/6, array sectors for raid1/10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartResync {
    None,
    /// Everything (no usable bitmap).
    Full {
        from_sector: u64,
    },
    /// The bitmap's dirty regions `(start, len)`.
    Regions(Vec<(u64, u64)>),
}

impl StartResync {
    /// The argument of `Engine::start_resync` (`(start, end)` pairs), or `None` when no
    /// resync is due.
    pub fn engine_ranges(&self) -> Option<Option<Vec<(u64, u64)>>> {
        match self {
            StartResync::None => None,
            StartResync::Full { from_sector: 0 } => Some(None),
            StartResync::Full { from_sector } => Some(Some(vec![(*from_sector, u64::MAX)])),
            StartResync::Regions(r) if r.is_empty() => None,
            // The bitmap's regions are (start, len); the engine takes (start, end).
            StartResync::Regions(r) => Some(Some(r.iter().map(|&(s, len)| (s, s + len)).collect())),
        }
    }
}

pub struct Assembled {
    /// Offered members, in the order given.
    pub members: Vec<MemberDev>,
    /// Each offered member's superblock (all parsed: assembly refuses otherwise).
    pub superblocks: Vec<Superblock>,
    pub plan: AssemblyPlan,
    pub config: ArrayConfig,
    /// Per slot: the offered member in it.
    pub slot_member: Vec<Option<usize>>,
    pub resync: StartResync,
}

/// Opens, checks and plans. `writable` only decides how the files are opened.
pub fn assemble(paths: &[PathBuf], run: bool, writable: bool) -> anyhow::Result<Assembled> {
    if paths.is_empty() {
        bail!("no members given: name the array's member files or devices");
    }
    let members = open_members(paths, writable)?;
    let offered: Vec<_> = members.iter().map(MemberDev::offered).collect();
    let plan = uraid_core::meta::plan_assembly(&offered, &AssembleOptions { run, uuid: None, force: false })
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
    let mut slot_member = Vec::with_capacity(plan.slots.len());
    let mut configs = Vec::with_capacity(plan.slots.len());
    for slot in &plan.slots {
        match slot {
            None => {
                slot_member.push(None);
                configs.push(MemberConfig { data_offset_bytes: 0, state: MemberState::Missing });
            }
            Some(m) => {
                slot_member.push(Some(m.member));
                let state = match m.recovery_offset_sectors {
                    None => MemberState::InSync,
                    Some(off) => MemberState::Recovering { recovery_offset_sectors: off },
                };
                configs.push(MemberConfig { data_offset_bytes: m.data_offset_sectors * 512, state });
            }
        }
    }
    let resync = match &plan.resync {
        ResyncNeed::None => StartResync::None,
        ResyncNeed::Full { from_sector } => StartResync::Full { from_sector: *from_sector },
        ResyncNeed::Bitmap { regions } => StartResync::Regions(regions.clone()),
    };
    let config = ArrayConfig { geometry, members: configs, tunables: Tunables::default(), read_only: false };
    Ok(Assembled { members, superblocks, plan, config, slot_member, resync })
}

#[cfg(test)]
mod tests {
    use super::StartResync;

    #[test]
    fn bitmap_regions_become_engine_start_end_ranges() {
        // Before: (start, len) went through as (start, end), so a region whose length is
        // less than its start was an empty range and never resynced.
        let r = StartResync::Regions(vec![(0, 128), (4096, 128)]);
        assert_eq!(r.engine_ranges(), Some(Some(vec![(0, 128), (4096, 4224)])));
        assert_eq!(StartResync::Full { from_sector: 0 }.engine_ranges(), Some(None));
        assert_eq!(StartResync::Full { from_sector: 64 }.engine_ranges(), Some(Some(vec![(64, u64::MAX)])));
        assert_eq!(StartResync::Regions(vec![]).engine_ranges(), None);
    }
}
