//! mdadm --grow on a running array: what it may change, refused as md refuses, and the
//! changes that move no data. [`plan`] is the pure check (mdadm's `Grow.c` and the
//! kernel's `update_raid_disks` / `*_check_reshape`); [`Array::grow`] does what the plan
//! says: a raid1 gains mirror slots (spares take them and are recovered, as md's
//! `raid1_reshape` then `remove_and_add_spares`) or loses empty ones; the members' data
//! grows into room they gained (md's `update_size`, raid1/4/5/6), the new space resynced.
//! A change that moves
//! data (a parity level's raid-devices, level, chunk or layout) goes to
//! [`Array::start_reshape`], the one hook where the reshape process starts. A refusal
//! changes nothing.

use super::state::Array;
use super::superblocks::DevRole;
use crate::api::*;
use crate::config::MemberState;
use crate::geometry::{parse_layout, Geometry, Level};
use crate::reshape::start::Restripe;

/// The component size asked for (mdadm's `--size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrowSize {
    /// All the room the smallest member has.
    Max,
    /// Sectors of each member's data.
    Sectors(u64),
}

/// What `uraid grow` asks for, as mdadm's options give it (None: unchanged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrowRequest {
    pub raid_disks: Option<usize>,
    pub level: Option<Level>,
    pub chunk_sectors: Option<u64>,
    /// md's layout name or number, read for the level the array will have.
    pub layout: Option<String>,
    pub size: Option<GrowSize>,
    /// Devices given with `--add`: they join as spares before the grow.
    pub adding: usize,
    /// mdadm's `--force`: grow a mirror count without the spares to fill it (degraded).
    pub force: bool,
}

impl GrowRequest {
    fn reshapes(&self) -> bool {
        self.raid_disks.is_some()
            || self.level.is_some()
            || self.chunk_sectors.is_some()
            || self.layout.is_some()
    }
}

/// The array as a grow looks at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowCurrent {
    pub level: Level,
    pub raid_disks: usize,
    pub layout: u32,
    pub chunk_sectors: u64,
    /// md's `size`: data sectors used on each member.
    pub component_sectors: u64,
    /// The data sectors the smallest member has room for now.
    pub room_sectors: u64,
    pub spares: usize,
    /// Per slot: a device holds it (active, rebuilding, or failed and not yet removed).
    pub slot_held: Vec<bool>,
    /// Slots with no working member (missing or failed): the array is degraded.
    pub degraded_slots: usize,
    pub failed: bool,
    pub read_only: bool,
    /// The background job running or owed (md's sync_action), if any.
    pub busy: Option<String>,
}

/// What a grow that md allows does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrowPlan {
    /// Nothing differs from the array as it is (mdadm: "no change requested").
    Unchanged(String),
    /// raid1: slots `from..to` are added; spares take them and are recovered.
    AddMirrors { from: usize, to: usize },
    /// raid1: the empty slots `to..from` go.
    DropMirrors { from: usize, to: usize },
    /// Each member's data grows from `from_sectors` to `to_sectors` (mdadm --size).
    Resize { from_sectors: u64, to_sectors: u64 },
    /// Data moves to a new geometry: see [`Array::start_reshape`].
    Reshape(ReshapeTarget),
}

/// The geometry a reshape goes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReshapeTarget {
    pub level: Level,
    pub raid_disks: usize,
    pub layout: u32,
    pub chunk_sectors: u64,
}

/// Why md refuses a grow: one sentence, what was wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowRefusal(pub String);

impl std::fmt::Display for GrowRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn refuse<T>(text: impl Into<String>) -> Result<T, GrowRefusal> {
    Err(GrowRefusal(text.into()))
}

fn name(level: Level) -> String {
    format!("raid{}", level.md_level())
}

/// md's raid10 layout word: far or offset copies (md's raid10 reshape refuses both).
fn raid10_far_or_offset(layout: u32) -> bool {
    (layout >> 8) & 0xff > 1 || layout & 0x10000 != 0
}

/// The smallest count of members each level runs with (md's `*_check_reshape` minimums).
fn min_raid_disks(level: Level) -> usize {
    match level {
        Level::Raid0 | Level::Raid1 => 1,
        Level::Raid4 | Level::Raid5 | Level::Raid10 => 2,
        Level::Raid6 => 4,
    }
}

/// The level changes md makes (its personalities' `takeover`), else why not.
fn level_change(cur: &GrowCurrent, level: Level) -> Result<(), GrowRefusal> {
    let allowed: &[Level] = match cur.level {
        // raid5's takeover_raid1 (two mirrors), raid0_takeover_raid1.
        Level::Raid1 => &[Level::Raid5, Level::Raid0],
        // mdadm reshapes a raid0 through raid4 (raid5's takeover_raid0), then back.
        Level::Raid0 => &[Level::Raid4, Level::Raid5, Level::Raid10],
        // raid0_takeover_raid10: the near-2 layout only (checked in `plan_raid10`).
        Level::Raid10 => &[Level::Raid0],
        Level::Raid4 => &[Level::Raid5, Level::Raid0],
        Level::Raid5 => &[Level::Raid6, Level::Raid4, Level::Raid0, Level::Raid1],
        Level::Raid6 => &[Level::Raid5],
    };
    if level == cur.level || allowed.contains(&level) {
        return Ok(());
    }
    let names: Vec<String> = allowed.iter().map(|&l| name(l)).collect();
    refuse(format!(
        "md cannot turn a {} into {}: only into {}",
        name(cur.level),
        name(level),
        names.join(", ")
    ))
}

/// The levels whose component size uraid grows: their mapping does not depend on it (a
/// raid10's far copies do, and its sync walks array sectors).
fn resizable(level: Level) -> bool {
    matches!(level, Level::Raid1 | Level::Raid4 | Level::Raid5 | Level::Raid6)
}

/// mdadm --grow's checks, in its order: refused (nothing to change) or the plan to carry out.
pub fn plan(cur: &GrowCurrent, req: &GrowRequest) -> Result<GrowPlan, GrowRefusal> {
    if !req.reshapes() && req.size.is_none() {
        return refuse(
            "nothing to grow: give --raid-devices, --level, --chunk, --layout or --size (with --add for new members)",
        );
    }
    if cur.read_only {
        return refuse("the array is served read-only: it cannot grow; serve it read-write first");
    }
    if cur.failed {
        return refuse(format!(
            "the array has failed (more members lost than {} survives): it cannot grow",
            name(cur.level)
        ));
    }
    if req.size.is_some() && req.reshapes() {
        // mdadm Grow.c: a size change goes alone, so its result can be checked first.
        return refuse(
            "the component size cannot change in the same grow as raid-devices, level, chunk or layout \
             (mdadm refuses this too): change the size first, check the data, then the rest",
        );
    }
    // md's raid0_takeover_raid45 drops a resync owed (a degraded raid4 waits for one it
    // cannot run): checked with the members' states at the start.
    let to_raid0 = req.level == Some(Level::Raid0) && matches!(cur.level, Level::Raid4 | Level::Raid5);
    if let Some(job) = cur.busy.as_ref().filter(|j| !(to_raid0 && *j == "resync")) {
        // md's update_raid_disks and mdadm answer EBUSY while a sync thread runs.
        return refuse(format!(
            "the array is performing resync/recovery ({job} running) and cannot be reshaped (md refuses \
             this too): wait until `uraid status` shows it done, or stop a check with `uraid action idle`"
        ));
    }
    if let Some(size) = req.size {
        return plan_size(cur, size);
    }
    let level = req.level.unwrap_or(cur.level);
    level_change(cur, level)?;
    // mdadm: raid5 to raid6 takes one more member (the Q), raid6 to raid5 gives one up.
    let raid_disks = req.raid_disks.unwrap_or(match (cur.level, level) {
        (Level::Raid4 | Level::Raid5, Level::Raid6) => cur.raid_disks + 1,
        // md's takeover_raid0: a parity slot more, missing until a spare fills it.
        (Level::Raid0, Level::Raid4 | Level::Raid5) => cur.raid_disks + 1,
        (Level::Raid6, Level::Raid5) => cur.raid_disks - 1,
        // raid0_takeover_raid45: the (missing) parity slot goes.
        (Level::Raid4 | Level::Raid5, Level::Raid0) => cur.raid_disks - 1,
        // raid10_takeover_raid0 and raid0_takeover_raid10: a mirror slot per member, or not.
        (Level::Raid0, Level::Raid10) => cur.raid_disks * 2,
        (Level::Raid10, Level::Raid0) => cur.raid_disks / 2,
        // raid0_takeover_raid1: the one mirror left is a raid0 of one.
        (Level::Raid1, Level::Raid0) => 1,
        _ => cur.raid_disks,
    });
    let layout = match (&req.layout, cur.level, level) {
        // mdadm's `--layout=preserve`: raid5 to raid6 by md's takeover, Q on a new last
        // member (no restripe).
        (Some(text), Level::Raid5, Level::Raid6) if text == "preserve" => {
            crate::geometry::algorithm::raid6_with_q_last(cur.layout).ok_or_else(|| {
                GrowRefusal(format!(
                    "--layout preserve: md has no raid6 layout keeping the data of a raid5 of layout {}",
                    crate::geometry::layout_name(Level::Raid5, cur.layout)
                ))
            })?
        }
        (Some(text), _, _) => parse_layout(level, text).map_err(|e| GrowRefusal(format!("--layout: {e}")))?,
        // md's takeovers between raid4 and raid5 set the layout (parity last either way).
        (None, Level::Raid4, Level::Raid5) => crate::geometry::algorithm::PARITY_N,
        (None, Level::Raid5, Level::Raid4) => 0,
        (None, _, _) => cur.layout,
    };
    let chunk_sectors = req.chunk_sectors.unwrap_or(cur.chunk_sectors);
    if raid_disks < min_raid_disks(level) {
        return refuse(format!(
            "{} needs at least {} members; --raid-devices {raid_disks} is too few",
            name(level),
            min_raid_disks(level)
        ));
    }
    if req.level.is_some_and(|l| l != cur.level) && req.chunk_sectors.is_some_and(|c| c != cur.chunk_sectors)
    {
        return refuse(
            "cannot change the array level in the same operation as the chunk size (mdadm refuses this \
             too): change the level first, then the chunk",
        );
    }
    if let Some(c) = req.chunk_sectors {
        if cur.level == Level::Raid1 && level == Level::Raid1 {
            return refuse("raid1 has no chunk: --chunk applies to raid0, raid4/5/6 and raid10");
        }
        if c < 8 || !c.is_power_of_two() {
            return refuse(format!("--chunk {}K: md needs a power of two of at least 4K", c / 2));
        }
    }
    let target = ReshapeTarget { level, raid_disks, layout, chunk_sectors };
    let same = level == cur.level
        && raid_disks == cur.raid_disks
        && layout == cur.layout
        && chunk_sectors == cur.chunk_sectors;
    if same {
        return Ok(GrowPlan::Unchanged("no change requested".into()));
    }
    match cur.level {
        Level::Raid1 if level == Level::Raid1 => plan_raid1(cur, req, raid_disks),
        Level::Raid1 => match level {
            // md's raid5 takeover of a raid1 (takeover_raid1), and raid0's (raid0_takeover_raid1).
            Level::Raid5 if cur.raid_disks == 2 => Ok(GrowPlan::Reshape(target)),
            Level::Raid5 => refuse(format!(
                "md turns a raid1 into raid5 only from two mirrors; this one has {}: first \
                 `uraid grow --raid-devices 2` (fail and remove the others)",
                cur.raid_disks
            )),
            _ => Ok(GrowPlan::Reshape(target)),
        },
        Level::Raid10 => plan_raid10(cur, req, target),
        Level::Raid0 => {
            if raid_disks < cur.raid_disks {
                return refuse(shrink_first(cur, raid_disks));
            }
            let wanted = raid_disks.saturating_sub(cur.raid_disks);
            if level == Level::Raid0 && wanted > cur.spares + req.adding {
                // A raid0 cannot run without a member: there is no growing it degraded.
                return refuse(format!(
                    "raid0 to {raid_disks} members needs {wanted} new device{}, and {} {} given: give them \
                     with --add",
                    if wanted == 1 { "" } else { "s" },
                    cur.spares + req.adding,
                    if cur.spares + req.adding == 1 { "was" } else { "were" }
                ));
            }
            Ok(GrowPlan::Reshape(target))
        }
        Level::Raid4 | Level::Raid5 | Level::Raid6 => {
            let data_disks = |l: Level, n: usize| if l == Level::Raid1 { 1 } else { n - l.parity_disks() };
            if data_disks(level, raid_disks) < data_disks(cur.level, cur.raid_disks) {
                return refuse(shrink_first(cur, raid_disks));
            }
            if level == Level::Raid1 && cur.raid_disks != 2 {
                return refuse("md turns a raid5 into raid1 only from two members");
            }
            // A parity level gains members from spares (raid5 to raid6 takes one more).
            check_spares(cur, req, raid_disks.saturating_sub(cur.raid_disks))?;
            Ok(GrowPlan::Reshape(target))
        }
    }
}

/// mdadm: a reshape that makes the array smaller wants `--array-size` first.
fn shrink_first(cur: &GrowCurrent, raid_disks: usize) -> String {
    format!(
        "{} members down to {raid_disks} would reduce the size of the array: md wants the array truncated \
         first (mdadm --grow --array-size), which uraid does not do yet; nothing changed",
        cur.raid_disks
    )
}

/// mdadm: "Need N spares to avoid degraded array, and only have M" unless --force.
fn check_spares(cur: &GrowCurrent, req: &GrowRequest, wanted: usize) -> Result<(), GrowRefusal> {
    let have = cur.spares + req.adding;
    if wanted > have && !req.force {
        return refuse(format!(
            "need {wanted} spare{} to avoid a degraded array, and only have {have} (mdadm refuses this too): \
             give the new members with --add (or `uraid add` them first), or --force to grow degraded",
            if wanted == 1 { "" } else { "s" }
        ));
    }
    Ok(())
}

fn plan_raid1(cur: &GrowCurrent, req: &GrowRequest, raid_disks: usize) -> Result<GrowPlan, GrowRefusal> {
    if req.layout.is_some() {
        return refuse("raid1 has no layout: --layout applies to raid0, raid4/5/6 and raid10");
    }
    if raid_disks > cur.raid_disks {
        // md gives a spare to a missing slot first (and is then busy with its recovery),
        // so the new slots would stay empty.
        if cur.degraded_slots > 0 && !req.force {
            return refuse(format!(
                "the array is degraded ({} of {} slots without a working member): md rebuilds those \
                 first; `uraid add` a device, let it recover, then grow (or --force to grow degraded)",
                cur.degraded_slots, cur.raid_disks
            ));
        }
        check_spares(cur, req, raid_disks - cur.raid_disks)?;
        return Ok(GrowPlan::AddMirrors { from: cur.raid_disks, to: raid_disks });
    }
    // md's raid1_reshape: refused (EBUSY) while more slots hold a device than remain.
    let held = cur.slot_held.iter().filter(|h| **h).count();
    if held > raid_disks {
        return refuse(format!(
            "{held} slots hold a member, more than --raid-devices {raid_disks} keeps (md refuses this too): \
             `uraid fail` and `uraid remove` {} of them first",
            held - raid_disks
        ));
    }
    // md then moves the members left into the low slots; uraid only drops empty ones.
    if cur.slot_held[raid_disks..].iter().any(|h| *h) {
        return refuse(format!(
            "a member holds a slot at or above {raid_disks}: md would move it down, uraid does not yet; \
             `uraid fail` and `uraid remove` it, then `uraid add` it back after the grow"
        ));
    }
    Ok(GrowPlan::DropMirrors { from: cur.raid_disks, to: raid_disks })
}

fn plan_raid10(cur: &GrowCurrent, req: &GrowRequest, target: ReshapeTarget) -> Result<GrowPlan, GrowRefusal> {
    if target.level != Level::Raid10 {
        // md's raid0_takeover_raid10: a near-2 raid10 becomes a raid0 of half its members.
        if cur.layout != 0x102 {
            return refuse("md turns a raid10 into raid0 only from the near-2 layout");
        }
        return Ok(GrowPlan::Reshape(target));
    }
    if req.layout.is_some() && raid10_far_or_offset(target.layout) {
        return refuse("md cannot reshape raid10 to a far or offset layout (mdadm: \"Cannot reshape RAID10 to far-mode\")");
    }
    if raid10_far_or_offset(cur.layout) {
        return refuse(
            "md cannot reshape a raid10 of far or offset layout: its copies would move over each other",
        );
    }
    if target.layout >> 8 & 0xff != cur.layout >> 8 & 0xff || target.layout & 0xff != cur.layout & 0xff {
        return refuse("md cannot change the number of copies of a raid10");
    }
    if target.raid_disks < cur.raid_disks {
        return refuse(shrink_first(cur, target.raid_disks));
    }
    check_spares(cur, req, target.raid_disks - cur.raid_disks)?;
    Ok(GrowPlan::Reshape(target))
}

fn plan_size(cur: &GrowCurrent, size: GrowSize) -> Result<GrowPlan, GrowRefusal> {
    if cur.level == Level::Raid0 {
        return refuse("md cannot change the component size of a raid0 (it has no resize): nothing changed");
    }
    // md keeps the size a whole number of chunks (of 4 KiB pages for raid1).
    let unit = cur.chunk_sectors.max(8);
    let to_sectors = match size {
        GrowSize::Max => cur.room_sectors / unit * unit,
        GrowSize::Sectors(s) if s > cur.room_sectors => {
            return refuse(format!(
                "--size {}K is more than the members have room for ({}K each): make them bigger first",
                s / 2,
                cur.room_sectors / 2
            ))
        }
        GrowSize::Sectors(s) => s / unit * unit,
    };
    if to_sectors == cur.component_sectors {
        return Ok(GrowPlan::Unchanged(format!("component size unchanged at {}K", to_sectors / 2)));
    }
    if to_sectors < cur.component_sectors {
        // md allows it and cuts off the data above; uraid will not.
        return refuse(format!(
            "--size {}K is smaller than the component size now ({}K): the data above it would be lost; \
             uraid does not shrink an array",
            to_sectors / 2,
            cur.component_sectors / 2
        ));
    }
    Ok(GrowPlan::Resize { from_sectors: cur.component_sectors, to_sectors })
}

impl Array {
    /// The array as [`plan`] looks at it; `room_sectors`: the data sectors the smallest
    /// member has room for (the caller knows the devices' sizes).
    pub fn grow_current(&self, room_sectors: u64) -> GrowCurrent {
        let geo = self.engine.geometry();
        let sb = &self.sbs.members()[0].sb;
        let mut slot_held = vec![false; geo.raid_disks];
        for m in self.sbs.members() {
            if let DevRole::Active { slot, .. } | DevRole::Faulty { slot } = m.role {
                if let Some(h) = slot_held.get_mut(slot) {
                    *h = true;
                }
            }
        }
        let busy = match (self.engine.sync_status(), self.engine.replacements().is_empty()) {
            (Some(s), _) => Some(crate::sync::mdstat_name(s.kind).to_string()),
            (None, false) => Some("replacement".into()),
            (None, true) if self.engine.sync_active() || self.engine.resync_owed() => Some("resync".into()),
            _ => None,
        };
        GrowCurrent {
            level: geo.level,
            raid_disks: geo.raid_disks,
            layout: geo.layout,
            chunk_sectors: geo.chunk_sectors,
            component_sectors: sb.size,
            room_sectors,
            spares: self.sbs.members().iter().filter(|m| m.role == DevRole::Spare).count(),
            slot_held,
            degraded_slots: self
                .engine
                .member_states()
                .iter()
                .filter(|s| matches!(s, MemberState::Missing | MemberState::Faulty))
                .count(),
            failed: self.engine.is_failed(),
            read_only: self.read_only,
            busy,
        }
    }

    /// Why a plan cannot be carried out now, asked before anything is written (the
    /// `--add`ed devices included).
    pub fn may_grow(&self, plan: &GrowPlan) -> Result<(), GrowRefusal> {
        match plan {
            GrowPlan::Resize { from_sectors, to_sectors } => {
                let level = self.engine.geometry().level;
                if !resizable(level) {
                    return refuse(format!(
                        "growing the component size ({}K to {}K) of a {} is not built in uraid yet (raid1, \
                         raid4/5/6 only): stop the array, `mdadm --grow --size` it under Linux md, then serve \
                         it again",
                        from_sectors / 2,
                        to_sectors / 2,
                        name(level)
                    ));
                }
                self.sbs.may_set_component_size(*to_sectors).map_err(GrowRefusal)
            }
            GrowPlan::Reshape(target) => self.may_start_reshape(target).map_err(GrowRefusal),
            // A failed member's last I/O may still be draining from a slot to drop.
            GrowPlan::DropMirrors { from, to }
                if (*to..*from).any(|s| self.engine.member_io_in_flight(s)) =>
            {
                refuse("a slot to drop still has I/O of its failed member in flight: try again in a moment")
            }
            _ => Ok(()),
        }
    }

    /// Carries out a plan (from [`plan`] on [`Array::grow_current`], with any `--add`ed
    /// members already spares). Answers what was done, in a sentence.
    pub fn grow(&mut self, plan: &GrowPlan, now_ns: TimeNs) -> Result<String, String> {
        self.now_ns = self.now_ns.max(now_ns);
        self.raid0_grow_adds = false;
        let done = match plan {
            GrowPlan::Unchanged(why) => return Ok(why.clone()),
            GrowPlan::AddMirrors { from, to } => self.set_mirror_count(*from, *to)?,
            GrowPlan::DropMirrors { from, to } => self.set_mirror_count(*from, *to)?,
            GrowPlan::Resize { from_sectors, to_sectors } => {
                self.may_grow(plan).map_err(|e| e.0)?;
                self.set_component_size(*from_sectors, *to_sectors)?
            }
            GrowPlan::Reshape(target) => {
                self.start_reshape(target)?;
                let what = match () {
                    _ if self.raid0_grow.is_some() => "grow (by way of raid4, as md does)",
                    _ if self.taking_over() => "takeover",
                    _ => "reshape",
                };
                format!("{what} to {} of {} members started", name(target.level), target.raid_disks)
            }
        };
        self.settle();
        Ok(done)
    }

    /// THE hook where a reshape (data moving to a new geometry) starts, with the new
    /// members already spares. Nothing has changed when it answers an error.
    pub fn start_reshape(&mut self, target: &ReshapeTarget) -> Result<(), String> {
        self.may_start_reshape(target)?;
        if is_raid0_grow(self.engine.geometry(), target) {
            return self.start_raid0_grow(target.raid_disks);
        }
        if is_takeover(self.engine.geometry(), target) {
            return self.start_takeover(target);
        }
        match restripe_of(self.engine.geometry(), target) {
            Some(change) => self.start_online_restripe(change),
            None => self.start_online_grow(target.raid_disks),
        }
    }

    /// Why the reshape to `target` cannot start now (asked before the `--add`ed devices
    /// are written). A raid4/5/6 grow by members, chunk or layout change runs while serving
    /// (`reshape_ops`); level changes are not built.
    pub fn may_start_reshape(&self, target: &ReshapeTarget) -> Result<(), String> {
        let geo = self.engine.geometry();
        let grow_by_members = geo.level.has_parity()
            && target.level == geo.level
            && target.chunk_sectors == geo.chunk_sectors
            && target.layout == geo.layout
            && target.raid_disks > geo.raid_disks;
        if grow_by_members {
            // The spares it takes may be `--add`ed after this check (the plan counted them).
            return self.may_start_online_grow(target.raid_disks, false);
        }
        if is_raid0_grow(geo, target) {
            return self.may_start_raid0_grow(target.raid_disks);
        }
        if is_takeover(geo, target) {
            return self.may_take_over(target).map(|_| ());
        }
        if let Some(change) = restripe_of(geo, target) {
            return self.may_start_online_restripe(change);
        }
        Err(format!(
            "the reshape of {} (to {} of {} members, {}K chunk, layout {}) is not built yet in uraid: stop the \
             array and `mdadm --grow` it under Linux md (uraid assembles the result once md finished)",
            name(geo.level),
            name(target.level),
            target.raid_disks,
            target.chunk_sectors / 2,
            target.layout
        ))
    }

    /// md's update_size then the level's resize (raid1_resize, raid5_resize): each member's data grows, the superblocks (and
    /// the bitmap's new bits) say so before the new space is resynced.
    fn set_component_size(&mut self, from: u64, to: u64) -> Result<String, String> {
        self.engine.set_component_sectors(to)?;
        let pages = self.sbs.set_component_size(from, to);
        if !pages.is_empty() {
            self.pages_seq = self.rounds.push(super::rounds::Work::BitmapPages(pages));
        }
        self.write_superblocks_then(None);
        self.engine.start_resync(Some(vec![(from, to)]), self.now_ns);
        Ok(format!(
            "component size set to {}K (was {}K); the new space is resynced. NBD has no resize notice: \
             a client sees the new size on its next connection",
            to / 2,
            from / 2
        ))
    }

    /// md's raid1_reshape: the mirror count becomes `to`. New slots start missing and
    /// hot spares take them (a recovery each); dropped slots are empty (see [`plan`]).
    fn set_mirror_count(&mut self, from: usize, to: usize) -> Result<String, String> {
        let states = self.engine.member_states();
        if to < from && states[to..].iter().any(|s| !matches!(s, MemberState::Missing | MemberState::Faulty))
        {
            return Err("a slot to drop holds a member".into());
        }
        self.engine.set_mirror_count(to)?;
        self.sbs.set_raid_disks(to as u32);
        self.write_superblocks_then(None);
        for slot in from..to {
            if !self.spare_wanted.contains(&slot) {
                self.spare_wanted.push(slot);
            }
        }
        self.spare_wanted.retain(|&s| s < to);
        Ok(format!("raid_disks set to {to} (was {from})"))
    }
}

/// md's takeovers that move no data: raid1 of two to raid5, raid0 to raid4 or raid5, raid6
/// to raid5, raid4 or raid5 without its parity member to raid0, a raid1 down to one mirror
/// to raid0, raid5 to raid6 with Q on a new last member (see `takeover`), as mdadm
/// asks them (no other change in the same grow).
fn is_takeover(geo: &Geometry, target: &ReshapeTarget) -> bool {
    match (geo.level, target.level) {
        (Level::Raid4 | Level::Raid5, Level::Raid0) => target.raid_disks + 1 == geo.raid_disks,
        // The layout md's takeover gives (the plan's default): another is a restripe after.
        (Level::Raid4, Level::Raid5) => {
            target.raid_disks == geo.raid_disks && target.layout == crate::geometry::algorithm::PARITY_N
        }
        (Level::Raid5, Level::Raid4) => target.raid_disks == geo.raid_disks && target.layout == 0,
        (Level::Raid5, Level::Raid1) => target.raid_disks == geo.raid_disks,
        (Level::Raid0, Level::Raid10) => target.raid_disks == geo.raid_disks * 2,
        (Level::Raid10, Level::Raid0) => target.raid_disks * 2 == geo.raid_disks,
        (Level::Raid1, Level::Raid5) => target.raid_disks == geo.raid_disks,
        (Level::Raid1, Level::Raid0) => target.raid_disks == 1,
        (Level::Raid6, Level::Raid5) => target.raid_disks + 1 == geo.raid_disks,
        // A parity-last raid5 keeps its layout number either way (raid6's parity-last has
        // the same data and P): that stays the restripe it always was (see `restripe_of`).
        (Level::Raid5, Level::Raid6) => {
            target.raid_disks == geo.raid_disks + 1
                && target.chunk_sectors == geo.chunk_sectors
                && target.layout != geo.layout
                && Some(target.layout) == crate::geometry::algorithm::raid6_with_q_last(geo.layout)
        }
        (Level::Raid0, Level::Raid4 | Level::Raid5) => {
            target.raid_disks == geo.raid_disks + 1 && target.chunk_sectors == geo.chunk_sectors
        }
        _ => false,
    }
}

/// A raid0 gaining members: mdadm's way through raid4 (see `raid0_grow`).
fn is_raid0_grow(geo: &Geometry, target: &ReshapeTarget) -> bool {
    geo.level == Level::Raid0
        && target.level == Level::Raid0
        && target.raid_disks > geo.raid_disks
        && target.chunk_sectors == geo.chunk_sectors
}

/// The restripe `target` asks of a raid4/5/6 on the same data members: a chunk or a
/// layout change, one at a time as mdadm makes them, or raid5 to raid6 with one new
/// member (None: not a restripe).
fn restripe_of(geo: &Geometry, target: &ReshapeTarget) -> Option<Restripe> {
    let to_raid6 = geo.level == Level::Raid5
        && target.level == Level::Raid6
        && target.raid_disks == geo.raid_disks + 1
        && (target.layout, target.chunk_sectors) == (geo.layout, geo.chunk_sectors);
    if to_raid6 {
        // The start takes a spare for it.
        return Some(Restripe::Raid6 { member: crate::reshape::start::GrowMember::STANDIN });
    }
    let same = geo.level.has_parity() && target.level == geo.level && target.raid_disks == geo.raid_disks;
    match (target.chunk_sectors != geo.chunk_sectors, target.layout != geo.layout) {
        (true, false) if same => Some(Restripe::Chunk { chunk_sectors: target.chunk_sectors }),
        (false, true) if same => Some(Restripe::Layout { layout: target.layout }),
        (true, true) if same => {
            Some(Restripe::ChunkAndLayout { chunk_sectors: target.chunk_sectors, layout: target.layout })
        }
        _ => None,
    }
}

impl crate::engine::Engine {
    /// Each member's data becomes `to_sectors` (the array's size with it).
    pub(crate) fn set_component_sectors(&mut self, to_sectors: u64) -> Result<(), String> {
        let g = &self.md.geo;
        if !resizable(g.level) {
            return Err(format!("resizing a raid{} is not built", g.level.md_level()));
        }
        self.md.geo =
            Geometry::new(g.level, g.raid_disks, g.layout, g.chunk_sectors, &vec![to_sectors; g.raid_disks])?;
        Ok(())
    }

    /// A raid1's slots become `to`: new ones missing, dropped ones empty. Refused while a
    /// replacement runs (its engine index is `raid_disks + slot`) or on another level.
    pub(crate) fn set_mirror_count(&mut self, to: usize) -> Result<(), String> {
        let md = &mut self.md;
        if md.geo.level != Level::Raid1 {
            return Err(format!("raid{} is not a mirror", md.geo.level.md_level()));
        }
        if md.replacements.iter().any(Option::is_some) {
            return Err("a replacement is being rebuilt".into());
        }
        let member_sectors = md.geo.member_sectors[0];
        md.geo = Geometry::new(Level::Raid1, to, md.geo.layout, 0, &vec![member_sectors; to])?;
        let data_offset_bytes = md.members[0].data_offset_bytes;
        // No I/O goes to a missing slot; a spare taking it sets its own index.
        let new_slot = |slot| crate::rdev::MemberRt::new(slot, MemberState::Missing, data_offset_bytes);
        let kept = md.members.len().min(to);
        md.members.truncate(kept);
        md.members.extend((kept..to).map(new_slot));
        md.replacements = vec![None; to];
        // Replacement accounting sat at `raid_disks + slot`: it starts again.
        md.stats.members.resize(to, Default::default());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raid(level: Level, n: usize) -> GrowCurrent {
        GrowCurrent {
            level,
            raid_disks: n,
            layout: match level {
                Level::Raid10 => 0x102,
                Level::Raid5 | Level::Raid6 => 2,
                _ => 0,
            },
            chunk_sectors: if level == Level::Raid1 { 0 } else { 1024 },
            component_sectors: 100_000,
            room_sectors: 100_000,
            spares: 0,
            slot_held: vec![true; n],
            degraded_slots: 0,
            failed: false,
            read_only: false,
            busy: None,
        }
    }

    fn ask(f: impl FnOnce(&mut GrowRequest)) -> GrowRequest {
        let mut r = GrowRequest::default();
        f(&mut r);
        r
    }

    fn refused(cur: &GrowCurrent, req: &GrowRequest, words: &str) {
        match plan(cur, req) {
            Err(GrowRefusal(text)) => assert!(text.contains(words), "{text:?} should say {words:?}"),
            Ok(p) => panic!("{req:?} on {cur:?} should be refused, planned {p:?}"),
        }
    }

    #[test]
    fn raid1_gains_mirrors_from_spares_or_added_members_only() {
        let mut cur = raid(Level::Raid1, 2);
        let three = ask(|r| r.raid_disks = Some(3));
        refused(&cur, &three, "need 1 spare to avoid a degraded array, and only have 0");
        assert_eq!(
            plan(
                &cur,
                &ask(|r| {
                    r.raid_disks = Some(3);
                    r.adding = 1
                })
            ),
            Ok(GrowPlan::AddMirrors { from: 2, to: 3 })
        );
        assert_eq!(
            plan(
                &cur,
                &ask(|r| {
                    r.raid_disks = Some(3);
                    r.force = true
                })
            ),
            Ok(GrowPlan::AddMirrors { from: 2, to: 3 })
        );
        cur.spares = 1;
        assert_eq!(plan(&cur, &three), Ok(GrowPlan::AddMirrors { from: 2, to: 3 }));
        refused(&cur, &ask(|r| r.raid_disks = Some(4)), "need 2 spares");
        assert!(matches!(plan(&cur, &ask(|r| r.raid_disks = Some(2))), Ok(GrowPlan::Unchanged(_))));
        // Degraded: the added device would rebuild the empty slot, not fill a new one.
        cur.degraded_slots = 1;
        refused(
            &cur,
            &ask(|r| {
                r.raid_disks = Some(3);
                r.adding = 1
            }),
            "the array is degraded (1 of 2 slots",
        );
        let forced = ask(|r| {
            r.raid_disks = Some(3);
            r.force = true
        });
        assert_eq!(plan(&cur, &forced), Ok(GrowPlan::AddMirrors { from: 2, to: 3 }));
    }

    #[test]
    fn raid1_drops_only_empty_slots() {
        let mut cur = raid(Level::Raid1, 3);
        refused(&cur, &ask(|r| r.raid_disks = Some(2)), "3 slots hold a member");
        cur.slot_held = vec![true, true, false];
        assert_eq!(
            plan(&cur, &ask(|r| r.raid_disks = Some(2))),
            Ok(GrowPlan::DropMirrors { from: 3, to: 2 })
        );
        cur.slot_held = vec![true, false, true];
        refused(&cur, &ask(|r| r.raid_disks = Some(2)), "md would move it down");
        refused(&cur, &ask(|r| r.raid_disks = Some(0)), "at least 1 members");
    }

    #[test]
    fn a_running_sync_or_a_read_only_or_failed_array_refuses() {
        let mut cur = raid(Level::Raid1, 2);
        cur.spares = 1;
        cur.busy = Some("check".into());
        refused(&cur, &ask(|r| r.raid_disks = Some(3)), "performing resync/recovery (check running)");
        cur.busy = None;
        cur.read_only = true;
        refused(&cur, &ask(|r| r.raid_disks = Some(3)), "read-only");
        cur.read_only = false;
        cur.failed = true;
        refused(&cur, &ask(|r| r.raid_disks = Some(3)), "has failed");
        refused(&raid(Level::Raid1, 2), &GrowRequest::default(), "nothing to grow");
    }

    #[test]
    fn raid1_has_no_chunk_or_layout_and_turns_into_raid5_only_from_two() {
        let cur = raid(Level::Raid1, 2);
        refused(&cur, &ask(|r| r.chunk_sectors = Some(128)), "raid1 has no chunk");
        refused(&cur, &ask(|r| r.layout = Some("left-symmetric".into())), "raid1 has no layout");
        assert!(matches!(plan(&cur, &ask(|r| r.level = Some(Level::Raid5))), Ok(GrowPlan::Reshape(_))));
        refused(&raid(Level::Raid1, 3), &ask(|r| r.level = Some(Level::Raid5)), "only from two mirrors");
        refused(&cur, &ask(|r| r.level = Some(Level::Raid6)), "md cannot turn a raid1 into raid6");
        // raid0_takeover_raid1: a raid0 of the one mirror left (the states are checked as it starts).
        let to_raid0 = plan(&raid(Level::Raid1, 3), &ask(|r| r.level = Some(Level::Raid0)));
        assert!(
            matches!(to_raid0, Ok(GrowPlan::Reshape(ReshapeTarget { raid_disks: 1, .. }))),
            "{to_raid0:?}"
        );
    }

    #[test]
    fn raid5_to_raid6_with_layout_preserve_is_mds_takeover_to_the_minus_6_layout() {
        let mut cur = raid(Level::Raid5, 4);
        let preserve = ask(|r| {
            r.level = Some(Level::Raid6);
            r.layout = Some("preserve".into())
        });
        refused(&cur, &preserve, "need 1 spare");
        cur.spares = 1;
        let Ok(GrowPlan::Reshape(target)) = plan(&cur, &preserve) else {
            panic!("{:?}", plan(&cur, &preserve))
        };
        assert_eq!((target.raid_disks, target.layout), (5, crate::geometry::algorithm::LEFT_SYMMETRIC_6));
        let geo = Geometry::new(Level::Raid5, 4, 2, 1024, &[100_000; 4]).unwrap();
        assert!(is_takeover(&geo, &target), "no restripe");
        // Without --layout the data is restriped onto the raid5's own layout.
        let Ok(GrowPlan::Reshape(restripe)) = plan(&cur, &ask(|r| r.level = Some(Level::Raid6))) else {
            panic!()
        };
        assert!(!is_takeover(&geo, &restripe));
    }

    #[test]
    fn parity_levels_refuse_as_mdadm_does() {
        let cur = raid(Level::Raid5, 3);
        refused(&cur, &ask(|r| r.raid_disks = Some(4)), "need 1 spare");
        refused(&cur, &ask(|r| r.raid_disks = Some(2)), "reduce the size of the array");
        refused(
            &cur,
            &ask(|r| {
                r.level = Some(Level::Raid6);
                r.chunk_sectors = Some(256);
                r.adding = 1
            }),
            "level in the same operation as the chunk size",
        );
        refused(&cur, &ask(|r| r.level = Some(Level::Raid6)), "need 1 spare");
        refused(&cur, &ask(|r| r.level = Some(Level::Raid10)), "cannot turn a raid5 into raid10");
        refused(&cur, &ask(|r| r.chunk_sectors = Some(24)), "power of two");
        refused(&cur, &ask(|r| r.layout = Some("f2".into())), "--layout: unknown raid5 layout");
        let grow = ask(|r| {
            r.raid_disks = Some(4);
            r.adding = 1
        });
        assert_eq!(
            plan(&cur, &grow),
            Ok(GrowPlan::Reshape(ReshapeTarget {
                level: Level::Raid5,
                raid_disks: 4,
                layout: 2,
                chunk_sectors: 1024
            }))
        );
        let rs = ask(|r| {
            r.layout = Some("right-symmetric".into());
            r.chunk_sectors = Some(256)
        });
        assert!(matches!(plan(&cur, &rs), Ok(GrowPlan::Reshape(_))));
        refused(&raid(Level::Raid6, 4), &ask(|r| r.raid_disks = Some(3)), "raid6 needs at least 4");
        // raid5 to raid6 takes one more member, raid6 to raid5 gives one up: the size stays.
        let to6 = ask(|r| {
            r.level = Some(Level::Raid6);
            r.adding = 1
        });
        assert!(matches!(plan(&cur, &to6), Ok(GrowPlan::Reshape(ReshapeTarget { raid_disks: 4, .. }))));
        let to5 = ask(|r| r.level = Some(Level::Raid5));
        assert!(matches!(
            plan(&raid(Level::Raid6, 5), &to5),
            Ok(GrowPlan::Reshape(ReshapeTarget { raid_disks: 4, .. }))
        ));
    }

    #[test]
    fn raid10_and_raid0_changes_md_does_not_make() {
        let cur = raid(Level::Raid10, 4);
        refused(&cur, &ask(|r| r.layout = Some("f2".into())), "far or offset layout");
        refused(&cur, &ask(|r| r.layout = Some("n3".into())), "number of copies");
        refused(
            &cur,
            &ask(|r| r.level = Some(Level::Raid5)),
            "cannot turn a raid10 into raid5: only into raid0",
        );
        let mut far = cur.clone();
        far.layout = 0x201;
        refused(
            &far,
            &ask(|r| {
                r.raid_disks = Some(5);
                r.adding = 1
            }),
            "far or offset layout",
        );
        assert!(matches!(plan(&cur, &ask(|r| r.chunk_sectors = Some(256))), Ok(GrowPlan::Reshape(_))));
        let r0 = raid(Level::Raid0, 2);
        refused(&r0, &ask(|r| r.size = Some(GrowSize::Max)), "component size of a raid0");
        refused(&r0, &ask(|r| r.level = Some(Level::Raid6)), "cannot turn a raid0 into raid6");
        // A raid0 grows only with its new members (no growing it degraded).
        refused(&r0, &ask(|r| r.raid_disks = Some(3)), "needs 1 new device");
        let grow = ask(|r| {
            r.raid_disks = Some(3);
            r.adding = 1
        });
        assert!(matches!(plan(&r0, &grow), Ok(GrowPlan::Reshape(_))));
    }

    #[test]
    fn size_alone_within_the_members_room() {
        let mut cur = raid(Level::Raid1, 2);
        refused(
            &cur,
            &ask(|r| {
                r.size = Some(GrowSize::Max);
                r.raid_disks = Some(3)
            }),
            "same grow",
        );
        assert!(matches!(plan(&cur, &ask(|r| r.size = Some(GrowSize::Max))), Ok(GrowPlan::Unchanged(_))));
        cur.room_sectors = 150_003;
        assert_eq!(
            plan(&cur, &ask(|r| r.size = Some(GrowSize::Max))),
            Ok(GrowPlan::Resize { from_sectors: 100_000, to_sectors: 150_000 })
        );
        refused(&cur, &ask(|r| r.size = Some(GrowSize::Sectors(200_000))), "more than the members have room");
        refused(&cur, &ask(|r| r.size = Some(GrowSize::Sectors(50_000))), "does not shrink");
    }
}
