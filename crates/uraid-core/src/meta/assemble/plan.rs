//! What assembly decided: the plan an array is started from (`plan_assembly` makes it).

use crate::meta::bitmap::{BitmapImage, WriteIntentBitmap};

/// The member chosen for a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotMember {
    /// Index into the offered list.
    pub member: usize,
    pub dev_number: u32,
    pub sb_offset_sectors: u64,
    pub data_offset_sectors: u64,
    /// Where data starts once a reshape that moves it ends (md's `new_data_offset`);
    /// `data_offset_sectors` when none is recorded.
    pub new_data_offset_sectors: u64,
    pub data_size_sectors: u64,
    /// `Some(sector)`: rebuilt only up to this member sector (relative to data_offset);
    /// the rest must be recovered. `None`: in sync.
    pub recovery_offset_sectors: Option<u64>,
    pub write_mostly: bool,
}

/// A member left out because its data is older than the array's; it can be re-added and
/// recovered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleMember {
    pub member: usize,
    /// The slot it claims.
    pub slot: Option<u32>,
    pub events: u64,
    /// Its events are at or after the bitmap's events_cleared: a re-add can be caught up
    /// from the bitmap instead of a full recovery.
    pub bitmap_recoverable: bool,
    /// The array still lists it in its slot (only behind in events): `uraid serve` may
    /// re-add it (md's re-add). Else the array let it go (replaced, removed, or it
    /// diverged): it is never written unless the user adds it by name.
    pub re_addable: bool,
}

/// What resync the array needs when it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResyncNeed {
    None,
    /// No (usable) bitmap: resync everything from this sync-space sector.
    Full {
        from_sector: u64,
    },
    /// Only these sync-space regions `(start, len)` (from the bitmap).
    Bitmap {
        regions: Vec<(u64, u64)>,
    },
}

impl ResyncNeed {
    /// The argument of `Engine::start_resync` (`(start, end)` ranges, `None` for all), or
    /// `None` when no resync is due.
    pub fn engine_ranges(&self) -> Option<Option<Vec<(u64, u64)>>> {
        match self {
            ResyncNeed::None => None,
            ResyncNeed::Full { from_sector: 0 } => Some(None),
            ResyncNeed::Full { from_sector } => Some(Some(vec![(*from_sector, u64::MAX)])),
            ResyncNeed::Bitmap { regions } if regions.is_empty() => None,
            // The bitmap's regions are (start, len); the engine takes (start, end).
            ResyncNeed::Bitmap { regions } => {
                Some(Some(regions.iter().map(|&(s, len)| (s, s + len)).collect()))
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapPlan {
    /// Signed sectors from each member's superblock.
    pub offset_from_sb_sectors: i32,
    pub chunk_bytes: Option<u32>,
    pub sync_size_sectors: Option<u64>,
    pub events_cleared: Option<u64>,
    /// The bitmap's events are behind the array's: its bits cannot be trusted.
    pub stale: bool,
    /// The parsed bitmap when the caller supplied its bytes.
    pub image: Option<BitmapImage>,
    /// The sector md starts honouring set bits from (`md_bitmap_load`'s `start`).
    pub resync_start_sector: u64,
}

impl BitmapPlan {
    /// In-memory bookkeeping loaded from the image, as md does at start.
    pub fn write_intent(&self) -> Option<WriteIntentBitmap> {
        self.image.clone().map(|img| WriteIntentBitmap::from_image(img, self.stale, self.resync_start_sector))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssemblyPlan {
    pub uuid: [u8; 16],
    pub name: String,
    pub level: i32,
    /// The layout md runs with (raid0: the effective zone layout, 1 = original).
    pub layout: u32,
    pub chunk_sectors: u32,
    pub raid_disks: u32,
    /// Per slot: the member chosen, or `None` (missing).
    pub slots: Vec<Option<SlotMember>>,
    /// Used sectors of each member (md's `dev_sectors` after the personality's rounding).
    pub size_sectors: u64,
    pub array_sectors: u64,
    /// The array's event count (the freshest member's).
    pub events: u64,
    /// Index of the member whose superblock is authoritative.
    pub freshest: usize,
    pub resync_offset: u64,
    pub resync: ResyncNeed,
    pub bitmap: Option<BitmapPlan>,
    /// Members with the spare role, usable for recovery.
    pub spares: Vec<usize>,
    pub stale: Vec<StaleMember>,
    pub degraded_slots: Vec<u32>,
    pub warnings: Vec<String>,
    /// A reshape md left in progress (raid_disks, geometry and slots above are the new
    /// layout's; `array_sectors` is what md serves until it ends).
    pub reshape: Option<crate::reshape::ReshapeGeometry>,
}

impl AssemblyPlan {
    /// The engine's geometry, checked against the array size the superblocks give.
    pub fn geometry(&self) -> Result<crate::geometry::Geometry, String> {
        use crate::geometry::{Geometry, Level};
        let level = Level::from_md_level(self.level).ok_or_else(|| {
            format!("raid level {} is not supported by the engine (0, 1, 4, 5, 6, 10 are)", self.level)
        })?;
        let member_sectors: Vec<u64> = self
            .slots
            .iter()
            .map(|s| match (level, s) {
                (Level::Raid0, Some(m)) => m.data_size_sectors,
                _ => self.size_sectors,
            })
            .collect();
        let geometry = Geometry::new(
            level,
            self.raid_disks as usize,
            self.layout,
            u64::from(self.chunk_sectors),
            &member_sectors,
        )
        .map_err(|e| format!("the superblocks describe an impossible geometry: {e}"))?;
        let served = self.reshape.as_ref().map_or(geometry.array_sectors(), |r| r.array_sectors());
        if served != self.array_sectors {
            return Err(format!(
                "array size disagreement: the superblocks give {} sectors, the geometry {}",
                self.array_sectors, served
            ));
        }
        Ok(geometry)
    }

    /// The engine's view of each slot: missing, in sync, or recovering from its
    /// `recovery_offset`, with the member's data offset.
    pub fn member_configs(&self) -> Vec<crate::config::MemberConfig> {
        use crate::config::{MemberConfig, MemberState};
        self.slots
            .iter()
            .map(|s| match s {
                None => MemberConfig { data_offset_bytes: 0, state: MemberState::Missing },
                Some(m) => MemberConfig {
                    data_offset_bytes: m.data_offset_sectors * 512,
                    state: match m.recovery_offset_sectors {
                        None => MemberState::InSync,
                        Some(off) => MemberState::Recovering { recovery_offset_sectors: off },
                    },
                },
            })
            .collect()
    }
}
