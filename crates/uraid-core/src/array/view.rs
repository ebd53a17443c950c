//! A running array as `status` and `detail` show it: taken in one look, so what they print
//! is the array at one moment, not pieces of several.

use super::state::Array;
use super::superblocks::{DevRole, MemberKey};
use crate::config::MemberState;
use crate::meta::Superblock;
use crate::replace::ReplacementStatus;
use crate::sync::SyncStatus;

#[derive(Clone, Debug)]
pub struct MemberView {
    pub key: MemberKey,
    pub name: String,
    pub role: DevRole,
    pub dev_number: u32,
    /// md's bad-block log entries (device sectors, length).
    pub bad_blocks: Vec<(u64, u64)>,
}

#[derive(Clone, Debug)]
pub struct ArrayView {
    /// The freshest superblock as it stands (the array's fields).
    pub sb: Superblock,
    /// Per slot.
    pub states: Vec<MemberState>,
    pub members: Vec<MemberView>,
    pub sync: Option<SyncStatus>,
    /// Sectors per second over the last few seconds.
    pub sync_speed_sectors: Option<f64>,
    pub replacements: Vec<ReplacementStatus>,
    pub failed: bool,
    pub dirty: bool,
    pub read_only: bool,
    pub has_bitmap: bool,
    pub sync_action: String,
    pub last_sync_action: String,
    pub mismatch_cnt: u64,
    pub array_sectors: u64,
    /// md's max_write_behind in effect (0: off).
    pub write_behind: u32,
    /// Completed writes whose write-mostly copies are still in flight.
    pub behind_writes_in_flight: usize,
    /// Writes so far that were allowed to complete before their write-mostly copies.
    pub write_behind_requests: u64,
    /// A reshape while serving: its checkpoint and its end, array sectors of the new layout.
    pub reshape: Option<(u64, u64)>,
    /// Its speed since this server started it or took it on, sectors per second.
    pub reshape_speed_sectors: Option<f64>,
    /// The reshape's share of the bytes moved while clients did I/O, percent (as a sync's).
    pub reshape_share_pct: Option<u8>,
}

impl ArrayView {
    /// The member in `slot` (active or faulty there).
    pub fn slot_member(&self, slot: usize) -> Option<&MemberView> {
        self.members.iter().find(|m| match m.role {
            DevRole::Active { slot: s, .. } | DevRole::Faulty { slot: s } => s == slot,
            DevRole::Spare | DevRole::Replacement { .. } => false,
        })
    }

    pub fn degraded(&self) -> bool {
        self.states.iter().any(|s| *s != MemberState::InSync)
    }
}

impl Array {
    pub fn view(&self) -> ArrayView {
        let members = self
            .sbs
            .members()
            .iter()
            .map(|m| MemberView {
                key: m.key,
                name: self.name_of(m.key),
                role: m.role,
                dev_number: m.sb.dev_number,
                bad_blocks: self.sbs.bad_blocks(m.key).map(|bb| bb.entries().collect()).unwrap_or_default(),
            })
            .collect();
        // The first working member's superblock is the one the rounds keep up to date.
        let sb =
            self.sbs.members().iter().find(|m| m.role.working()).unwrap_or(&self.sbs.members()[0]).sb.clone();
        ArrayView {
            sb,
            states: self.engine.member_states(),
            members,
            sync: self.engine.sync_status(),
            sync_speed_sectors: self.sync_speed_sectors(),
            replacements: self.engine.replacements(),
            failed: self.engine.is_failed(),
            dirty: self.sbs.is_dirty(),
            read_only: self.read_only,
            has_bitmap: self.sbs.bitmap().is_some(),
            // md's sync_action reads `reshape` while one runs.
            sync_action: if self.reshape_running() { "reshape" } else { self.engine.sync_action() }
                .to_string(),
            last_sync_action: self.engine.last_sync_action().to_string(),
            mismatch_cnt: self.engine.mismatch_cnt(),
            array_sectors: self.size_bytes() / 512,
            write_behind: self.engine.write_behind(),
            behind_writes_in_flight: self.engine.behind_writes_in_flight(),
            write_behind_requests: self.engine.stats().write_behind_requests,
            reshape: self.reshape_progress(),
            reshape_speed_sectors: self.reshape_speed_sectors(),
            reshape_share_pct: self.reshaping.as_deref().and_then(|r| r.pacer.share_pct),
        }
    }

    /// See [`crate::Engine::stripe_cache_usage`].
    pub fn stripe_cache_usage(&self) -> Option<crate::stats::StripeCacheUsage> {
        self.engine.stripe_cache_usage()
    }

    /// Whether nothing is left to write: no request, no metadata round, no upkeep owed
    /// soon (a test waits for this before reading the members).
    pub fn quiet(&self) -> bool {
        crate::api::ArrayEngine::is_idle(self) && !self.engine.sync_active() && !self.reshape_running()
    }
}
