//! `--detail` of an array, offline (from its members' superblocks) or running (from the
//! engine's member states).

use uraid_core::meta::{Superblock, MAX_SECTOR};
use uraid_core::{MemberState, ScrubKind, SyncKind, SyncStatus};

use super::assembly::Assembled;
use super::detail_info::{DetailInfo, DeviceRow, ScrubView, SyncProgress};
use super::report::percent;

/// One raid slot as the detail shows it.
#[derive(Clone, Debug)]
pub struct SlotView {
    pub dev_number: Option<u32>,
    pub path: Option<String>,
    pub state: MemberState,
}

pub struct DetailInput<'a> {
    pub sb: &'a Superblock,
    pub array_sectors: u64,
    pub used_dev_sectors: u64,
    pub slots: &'a [SlotView],
    /// (dev_number, path) of hot spares.
    pub spares: &'a [(u32, String)],
    /// (dev_number, path) of failed members not yet removed whose slot another device
    /// holds now (md's faulty rows outside the slots, counted in Failed Devices).
    pub faulty: &'a [(u32, String)],
    /// Other devices offered that the array does not use (stale ones left out): (state, path).
    pub others: &'a [(String, String)],
    pub sync: Option<SyncStatus>,
    pub dirty: bool,
    pub failed: bool,
    pub read_only: bool,
    /// md's sysfs scrub view of a running array: sync_action, last_sync_action, mismatch_cnt.
    pub scrub: Option<ScrubView>,
}

/// "Rebuild Status : 0.3% complete": mdadm's line with mdstat's one decimal (a whole
/// percent of a 16 TiB member is 14 minutes of an hour-long wait).
pub fn sync_line(s: &SyncStatus) -> String {
    let pct = percent(s.done_sectors, s.total_sectors);
    let what = match s.kind {
        SyncKind::Recovery { .. } | SyncKind::Replace { .. } => "Rebuild",
        SyncKind::Resync => "Resync",
        SyncKind::Scrub(ScrubKind::Check) => "Check",
        SyncKind::Scrub(ScrubKind::Repair) => "Repair",
    };
    format!("{what} Status : {pct} complete")
}

/// How /proc/mdstat names a running sync ("recovery", where sysfs says "recover"); the
/// others by `sync_action`'s names.
pub fn sync_word(kind: SyncKind) -> &'static str {
    match kind {
        SyncKind::Recovery { .. } | SyncKind::Replace { .. } => "recovery",
        other => uraid_core::scrub::action_name(other),
    }
}

pub fn build(d: &DetailInput<'_>) -> DetailInfo {
    let mut state = vec![if d.dirty { "active" } else { "clean" }.to_string()];
    let degraded = d.slots.iter().any(|s| !matches!(s.state, MemberState::InSync));
    if d.failed {
        state.push("FAILED".into());
    } else if degraded {
        state.push("degraded".into());
    }
    if let Some(s) = &d.sync {
        state.push(match s.kind {
            SyncKind::Recovery { .. } | SyncKind::Replace { .. } => "recovering".into(),
            SyncKind::Resync => "resyncing".into(),
            SyncKind::Scrub(ScrubKind::Check) => "checking".into(),
            SyncKind::Scrub(ScrubKind::Repair) => "repairing".into(),
        });
    }
    if d.read_only {
        state.push("read-only".into());
    }
    let mut rows = Vec::new();
    for (slot, v) in d.slots.iter().enumerate() {
        let (number, path) = match &v.path {
            Some(p) => (v.dev_number, p.clone()),
            None => (None, "-".to_string()),
        };
        let st = match v.state {
            MemberState::InSync => "active sync",
            MemberState::Missing => "removed",
            MemberState::Faulty => "faulty",
            MemberState::Recovering { .. } => "spare rebuilding",
        };
        let path = if matches!(v.state, MemberState::Missing) { "-".to_string() } else { path };
        rows.push(DeviceRow { number, slot: Some(slot), state: st.into(), path });
    }
    for (n, p) in d.spares {
        rows.push(DeviceRow { number: Some(*n), slot: None, state: "spare".into(), path: p.clone() });
    }
    for (n, p) in d.faulty {
        rows.push(DeviceRow { number: Some(*n), slot: None, state: "faulty".into(), path: p.clone() });
    }
    for (what, p) in d.others {
        rows.push(DeviceRow { number: None, slot: None, state: what.clone(), path: p.clone() });
    }
    let count = |f: fn(&MemberState) -> bool| d.slots.iter().filter(|s| f(&s.state)).count();
    DetailInfo {
        sb: d.sb.clone(),
        array_sectors: d.array_sectors,
        used_dev_sectors: d.used_dev_sectors,
        state: state.join(", "),
        active: count(|s| matches!(s, MemberState::InSync)),
        working: count(|s| matches!(s, MemberState::InSync | MemberState::Recovering { .. }))
            + d.spares.len(),
        failed: count(|s| matches!(s, MemberState::Faulty)) + d.faulty.len(),
        spares: d.spares.len() + count(|s| matches!(s, MemberState::Recovering { .. })),
        rows,
        progress: d.sync.as_ref().map(sync_line),
        sync: d.sync.as_ref().map(|s| SyncProgress {
            action: sync_word(s.kind),
            done_sectors: s.done_sectors,
            total_sectors: s.total_sectors,
            speed_kib_per_s: None,
            eta_s: None,
        }),
        scrub: d.scrub.clone(),
        bad_blocks: Vec::new(),
        write_behind: 0,
        behind_writes_in_flight: None,
        write_behind_requests: None,
    }
}

/// The detail of an assembled (not running) array.
pub fn offline(a: &Assembled) -> DetailInfo {
    let sb = &a.superblocks[a.plan.freshest];
    let slots: Vec<SlotView> = a
        .plan
        .member_configs()
        .iter()
        .zip(&a.plan.slots)
        .map(|(m, s)| SlotView {
            dev_number: s.as_ref().map(|s| a.superblocks[s.member].dev_number),
            path: s.as_ref().map(|s| a.members[s.member].name.clone()),
            state: m.state,
        })
        .collect();
    let spares: Vec<(u32, String)> =
        a.plan.spares.iter().map(|&i| (a.superblocks[i].dev_number, a.members[i].name.clone())).collect();
    let others: Vec<(String, String)> = a
        .plan
        .stale
        .iter()
        .map(|s| ("stale (left out)".to_string(), a.members[s.member].name.clone()))
        .collect();
    let mut info = build(&DetailInput {
        sb,
        array_sectors: a.plan.array_sectors,
        used_dev_sectors: a.plan.size_sectors,
        slots: &slots,
        spares: &spares,
        faulty: &[],
        others: &others,
        sync: None,
        dirty: a.plan.resync_offset != MAX_SECTOR,
        failed: false,
        read_only: false,
        scrub: None,
    });
    info.write_behind =
        a.plan.bitmap.as_ref().and_then(|b| b.image.as_ref()).map_or(0, |img| img.sb.write_behind);
    for (m, meta) in a.members.iter().zip(&a.metadata) {
        if let Ok(Some(bb)) = &meta.bad_blocks {
            if !bb.is_empty() {
                info.bad_blocks.push((m.name.clone(), bb.entries().collect()));
            }
        }
    }
    info
}
