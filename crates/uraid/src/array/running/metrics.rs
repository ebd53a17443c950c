//! What `uraid serve --metrics` exports, taken in one trip to the array thread (the array,
//! its counters, the executor's and the stripe cache's) and then read off it: the
//! snapshot is plain data that the metrics thread encodes and sends at its own pace.

use uraid_core::array::DevRole;
use uraid_core::stats::{ArrayStats, MemberStats, StripeCacheUsage};
use uraid_core::{ArrayEngine, MemberState, ScrubKind, SyncKind};

use super::{failed_out_of_slot, RunningArray};
use crate::array::latency::HistogramSnapshot;
use crate::array::report::level_name;

/// The array as the metrics show it.
#[derive(Clone, Debug)]
pub struct MetricsSnapshot {
    pub name: String,
    pub level: String,
    /// md's raid_disks: node_md_disks_required.
    pub raid_disks: usize,
    /// /proc/mdstat's counts as node_exporter reads them: slots in sync (the `m` of
    /// `[n/m]`), faulty members (F) and hot spares (S).
    pub disks_active: usize,
    pub disks_failed: usize,
    pub disks_spare: usize,
    /// md's sysfs `degraded`: slots without an in-sync member.
    pub degraded: usize,
    /// node_md_state's label that is 1: active, recovering, resync or check; None when
    /// the array has failed (node_exporter then finds none of its states either).
    pub state: Option<&'static str>,
    pub failed: bool,
    pub read_only: bool,
    /// KiB of the array, and of it in sync (all of it unless a sync runs: then the sync
    /// line's done count, as node_exporter reads /proc/mdstat).
    pub blocks: u64,
    pub blocks_synced: u64,
    /// md's sync_action, and the running sync's speed in bytes a second (0 without one).
    pub sync_action: String,
    pub sync_speed_bytes: f64,
    /// md's mismatch_cnt (sectors).
    pub mismatch_cnt: u64,
    pub stripe_cache: Option<StripeCacheUsage>,
    pub array: ArrayStats,
    pub members: Vec<MemberMetrics>,
    /// Per operation, in the order of `latency::OPS`.
    pub latency: Vec<HistogramSnapshot>,
}

#[derive(Clone, Debug)]
pub struct MemberMetrics {
    pub name: String,
    /// active, rebuilding, spare, faulty or replacement.
    pub state: &'static str,
    pub io: MemberStats,
    /// I/Os the member did not answer within --member-timeout.
    pub timeouts: u64,
}

/// The states `uraid_member_state` lists, one of them 1 for each member.
pub const MEMBER_STATES: [&str; 5] = ["active", "rebuilding", "spare", "faulty", "replacement"];

impl RunningArray {
    pub fn metrics(&self) -> anyhow::Result<MetricsSnapshot> {
        let (mut view, stats, exec, stripe_cache) =
            self.call(|a, ex, _| (a.view(), a.stats_snapshot(), ex.member_stats(), a.stripe_cache_usage()))?;
        let io = self.note(&mut view, &stats);
        let latency = self.device.latency.snapshot();
        let count = |f: fn(&MemberState) -> bool| view.states.iter().filter(|s| f(s)).count();
        let disks_failed = count(|s| matches!(s, MemberState::Faulty)) + failed_out_of_slot(&view).count();
        let members = view
            .members
            .iter()
            .zip(io)
            .map(|(m, (_, io))| MemberMetrics {
                name: m.name.clone(),
                state: match m.role {
                    DevRole::Active { slot, recovering } => {
                        if recovering || !matches!(view.states.get(slot), Some(MemberState::InSync)) {
                            "rebuilding"
                        } else {
                            "active"
                        }
                    }
                    DevRole::Spare => "spare",
                    DevRole::Faulty { .. } => "faulty",
                    DevRole::Replacement { .. } => "replacement",
                },
                io,
                timeouts: exec.get(m.key as usize).map_or(0, |x| x.timed_out_ios),
            })
            .collect();
        let blocks = view.array_sectors / 2;
        let state = match &view.sync {
            _ if view.failed => None,
            None => Some("active"),
            Some(s) => Some(match s.kind {
                SyncKind::Recovery { .. } | SyncKind::Replace { .. } => "recovering",
                // md's mdstat calls a repair a resync.
                SyncKind::Resync | SyncKind::Scrub(ScrubKind::Repair) => "resync",
                SyncKind::Scrub(ScrubKind::Check) => "check",
            }),
        };
        Ok(MetricsSnapshot {
            name: self.name.clone(),
            level: level_name(view.sb.level),
            raid_disks: view.states.len(),
            disks_active: count(|s| matches!(s, MemberState::InSync)),
            disks_failed,
            disks_spare: view.members.iter().filter(|m| m.role == DevRole::Spare).count(),
            degraded: count(|s| !matches!(s, MemberState::InSync)),
            state,
            failed: view.failed,
            read_only: view.read_only,
            blocks,
            blocks_synced: view.sync.as_ref().map_or(blocks, |s| s.done_sectors / 2),
            sync_action: view.sync_action.clone(),
            sync_speed_bytes: match (&view.sync, view.sync_speed_sectors) {
                (Some(_), Some(v)) => v * 512.0,
                _ => 0.0,
            },
            mismatch_cnt: view.mismatch_cnt,
            stripe_cache,
            array: stats,
            members,
            latency,
        })
    }
}
