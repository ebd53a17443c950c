//! md's level takeovers that move no data (raid5.c `takeover_raid1`, `takeover_raid0`,
//! `takeover_raid4`, `raid4_takeover`, raid1.c `raid1_takeover`, raid0.c
//! `raid0_takeover_raid45`, `raid0_takeover_raid1` (a raid1 down to one mirror), raid5.c
//! `raid6_takeover` (a raid5 as a raid6 with its Q member missing); raid4 and parity-last raid5 are one layout, as is a raid5 of
//! two and a raid1 of two):
//! a raid1 of two is a raid5 of two (left-symmetric: each stripe's parity is its one data
//! chunk, so both members already hold it), a raid0 of one zone is a raid4, or a raid5
//! of the parity-last layout, with a new last slot for parity, missing until a spare is
//! recovered into it, and a raid6 whose Q is on its last member (a `-6` layout, which a
//! layout change gives it first) is a raid5 of the others, the last becoming a spare. While serving, as md's `mddev_suspend`: requests wait, every
//! superblock records the new level, and once that round is durable and the old engine is
//! idle a new one takes the array; the requests that waited go to it. A crash at any point
//! leaves members that read the same under the old level and the new one. See
//! docs/operations.md "Grow and reshape while serving".

use super::grow::ReshapeTarget;
use super::reshaping::{ShapeChange, Takeover};
use super::state::{AfterRound, Array};
use crate::api::*;
use crate::config::{ArrayConfig, MemberConfig, MemberState};
use crate::engine::Engine;
use crate::geometry::{algorithm, Geometry, Level};
use crate::meta::{Superblock, MAX_SECTOR};

/// md's raid10 layout word for two near copies (near 2, far 1).
const RAID10_NEAR_2: u32 = (1 << 8) + 2;

/// The slot a member of slot `slot` of a `from` array has in the `to` array (md's
/// `new_raid_disk` of the takeovers between raid0 and raid10).
fn slot_after(from: Level, to: Level, slot: usize) -> usize {
    match (from, to) {
        (Level::Raid0, Level::Raid10) => slot * 2,
        (Level::Raid10, Level::Raid0) => slot / 2,
        // raid0_takeover_raid1: the one mirror left, whichever slot it had, is slot 0 (seen
        // in the md VM: the member of slot 1 became "Active device 0").
        (Level::Raid1, Level::Raid0) => 0,
        _ => slot,
    }
}

/// The geometry md's takeover gives `geo` for `target`, or why md (or uraid) will not.
pub(super) fn takeover_geometry(geo: &Geometry, target: &ReshapeTarget) -> Result<Geometry, String> {
    match (geo.level, target.level) {
        (Level::Raid1, Level::Raid5) => {
            if geo.raid_disks != 2 {
                return Err("md turns a raid1 into raid5 only from two mirrors".into());
            }
            let chunk = raid1_chunk_sectors(geo)?;
            Geometry::new(Level::Raid5, 2, algorithm::LEFT_SYMMETRIC, chunk, &geo.member_sectors[..2])
        }
        // raid0_takeover_raid1 (one mirror left, checked with the members' states in
        // `may_take_over`): a raid0 of that member, the array's size a whole number of chunks.
        (Level::Raid1, Level::Raid0) => {
            let chunk = raid1_chunk_sectors(geo)?;
            Geometry::new(Level::Raid0, 1, 0, chunk, &[geo.array_sectors()])
        }
        (Level::Raid0, Level::Raid4 | Level::Raid5) => {
            // takeover_raid0: one zone only, every member's share the same.
            let per = geo.member_sectors.iter().map(|s| s / geo.chunk_sectors * geo.chunk_sectors);
            let per: Vec<u64> = per.collect();
            if per.iter().any(|&s| s != per[0]) {
                return Err(
                    "md takes over only a raid0 whose members are all the same size (one zone)".into()
                );
            }
            let n = geo.raid_disks + 1;
            Geometry::new(target.level, n, algorithm::PARITY_N, geo.chunk_sectors, &vec![per[0]; n])
        }
        // raid6_takeover: a raid5 is the raid6 of one more member with Q on that member
        // (a `-6` layout), missing until a spare is recovered into it (mdadm's
        // `--level 6 --layout preserve`: no restripe).
        (Level::Raid5, Level::Raid6) => {
            let layout = algorithm::raid6_with_q_last(geo.layout).ok_or_else(|| {
                format!(
                    "md turns a raid5 of layout {} into raid6 only by a restripe",
                    crate::geometry::layout_name(Level::Raid5, geo.layout)
                )
            })?;
            let n = geo.raid_disks + 1;
            Geometry::new(Level::Raid6, n, layout, geo.chunk_sectors, &vec![geo.member_sectors[0]; n])
        }
        (Level::Raid6, Level::Raid5) => {
            // takeover_raid6: Q on the last member, which leaves (a spare from then on).
            // The raid5 layout whose takeover gives this one (raid6_takeover run backwards).
            let back = (algorithm::LEFT_ASYMMETRIC..=algorithm::PARITY_N)
                .find(|&l| algorithm::raid6_with_q_last(l) == Some(geo.layout));
            let layout = match back {
                Some(l) => l,
                None => {
                    return Err(format!(
                        "md turns a raid6 into raid5 only from a layout with Q on the last member (a -6 \
                         layout or parity-last), not {}: first `uraid grow --layout {}-6` (a restripe while \
                         serving), let it finish, then --level 5",
                        crate::geometry::layout_name(Level::Raid6, geo.layout),
                        crate::geometry::layout_name(
                            Level::Raid5,
                            geo.layout.min(algorithm::RIGHT_SYMMETRIC)
                        )
                    ))
                }
            };
            let n = geo.raid_disks - 1;
            Geometry::new(Level::Raid5, n, layout, geo.chunk_sectors, &geo.member_sectors[..n])
        }
        // raid5's takeover_raid4 and raid4_takeover: parity on the last member either way.
        (Level::Raid4, Level::Raid5) => Geometry::new(
            Level::Raid5,
            geo.raid_disks,
            algorithm::PARITY_N,
            geo.chunk_sectors,
            &geo.member_sectors,
        ),
        (Level::Raid5, Level::Raid4) => {
            if geo.layout != algorithm::PARITY_N {
                return Err(format!(
                    "md turns a raid5 into raid4 only from the parity-last layout, not {}: first `uraid grow \
                     --layout parity-last` (a restripe while serving), let it finish, then --level 4",
                    crate::geometry::layout_name(Level::Raid5, geo.layout)
                ));
            }
            Geometry::new(Level::Raid4, geo.raid_disks, 0, geo.chunk_sectors, &geo.member_sectors)
        }
        // raid1_takeover: each stripe of a raid5 of two holds its one data chunk twice.
        (Level::Raid5, Level::Raid1) => {
            if geo.raid_disks != 2 {
                return Err("md turns a raid5 into raid1 only from two members".into());
            }
            Geometry::new(Level::Raid1, 2, 0, 0, &geo.member_sectors)
        }
        (Level::Raid4 | Level::Raid5, Level::Raid0) => {
            // raid0_takeover_raid45: parity on the last member, which must be missing
            // (checked with the members' states, `may_take_over`).
            if geo.level == Level::Raid5 && geo.layout != algorithm::PARITY_N {
                return Err(format!(
                    "md turns a raid5 into raid0 only from the parity-last layout, not {}",
                    crate::geometry::layout_name(Level::Raid5, geo.layout)
                ));
            }
            let n = geo.raid_disks - 1;
            Geometry::new(Level::Raid0, n, 0, geo.chunk_sectors, &geo.member_sectors[..n])
        }
        // raid10_takeover_raid0: member i becomes slot 2i of a near-2 raid10, its mirror
        // (slot 2i + 1) missing until a spare is recovered into it.
        (Level::Raid0, Level::Raid10) => {
            let per: Vec<u64> =
                geo.member_sectors.iter().map(|s| s / geo.chunk_sectors * geo.chunk_sectors).collect();
            if per.iter().any(|&s| s != per[0]) {
                return Err(
                    "md takes over only a raid0 whose members are all the same size (one zone)".into()
                );
            }
            let n = geo.raid_disks * 2;
            Geometry::new(Level::Raid10, n, RAID10_NEAR_2, geo.chunk_sectors, &vec![per[0]; n])
        }
        // raid0_takeover_raid10: one member of each mirror pair left (checked with the
        // members' states, `may_take_over`) makes a raid0 of half the members.
        (Level::Raid10, Level::Raid0) => {
            if geo.layout != RAID10_NEAR_2 || !geo.raid_disks.is_multiple_of(2) {
                return Err(
                    "md turns a raid10 into raid0 only from the near-2 layout with an even member count"
                        .into(),
                );
            }
            let n = geo.raid_disks / 2;
            Geometry::new(Level::Raid0, n, 0, geo.chunk_sectors, &geo.member_sectors[..n])
        }
        (from, to) => Err(format!("the takeover of a raid{} into raid{}", from.md_level(), to.md_level())),
    }
}

/// The chunk md gives a raid1 taken over (takeover_raid1, raid0_takeover_raid1): 64K,
/// halved until it divides the array's size, 4K at least.
fn raid1_chunk_sectors(geo: &Geometry) -> Result<u64, String> {
    let size = geo.array_sectors();
    let mut chunk = 128u64;
    while chunk >= 8 && !size.is_multiple_of(chunk) {
        chunk /= 2;
    }
    if chunk < 8 {
        return Err(format!("the array's size ({size} sectors) is not a whole number of 4K chunks"));
    }
    Ok(chunk)
}

/// A member's superblock after the takeover to `next`.
fn taken_over(sb: &Superblock, next: &Geometry, events: u64, utime: u64) -> Superblock {
    let mut sb = sb.clone();
    sb.level = next.level.md_level();
    sb.new_level = next.level.md_level() as u32;
    sb.layout = next.layout;
    sb.new_layout = next.layout;
    sb.chunksize = next.chunk_sectors as u32;
    sb.new_chunk = next.chunk_sectors as u32;
    sb.raid_disks = next.raid_disks as u32;
    if next.level == Level::Raid0 {
        // raid0_takeover_raid45: each member's data is the component size (a reshape
        // before may have left more room after a moved data offset).
        sb.data_size = sb.size;
    }
    sb.size = next.member_sectors[0];
    // takeover_raid0: "make sure it will be not marked as dirty".
    sb.resync_offset = MAX_SECTOR;
    sb.events = events;
    sb.utime = utime;
    sb
}

impl Array {
    /// A takeover is under way: requests wait for it.
    pub(super) fn taking_over(&self) -> bool {
        self.takeover.is_some()
    }

    /// Why the takeover to `target` cannot run now (nothing written).
    pub(super) fn may_take_over(&self, target: &ReshapeTarget) -> Result<Geometry, String> {
        let refuse = |why: &str| Err(format!("cannot take the array over: {why}"));
        // To raid0 the parity member must be gone (md: "raid5 must be degraded!"), and
        // nothing else.
        let to_raid0 = target.level == Level::Raid0;
        let parity = matches!(self.engine.geometry().level, Level::Raid4 | Level::Raid5);
        if to_raid0 && parity && !self.parity_slot_empty() {
            return refuse(
                "md turns a raid4 or raid5 into raid0 only when its parity member (the last slot) is missing \
                 and every other member is in sync: fail and remove the last member first",
            );
        }
        let from = self.engine.geometry().level;
        if to_raid0 && matches!(from, Level::Raid1 | Level::Raid10) {
            return self.may_take_over_degraded_mirrors(target);
        }
        if let Some(why) = self.shape_change_blocked(ShapeChange::Takeover { to_raid0 }) {
            return refuse(why);
        }
        takeover_geometry(self.engine.geometry(), target).or_else(|e| refuse(&e))
    }

    /// raid10 or raid1 to raid0 (md's raid0_takeover_raid10, raid0_takeover_raid1): exactly
    /// one member of each mirror pair (of the raid1's mirrors) in sync, the others' slots
    /// empty ("All mirrors must be already degraded!", "(N - 1) mirrors drives must be
    /// already faulty!").
    fn may_take_over_degraded_mirrors(&self, target: &ReshapeTarget) -> Result<Geometry, String> {
        let refuse = |why: &str| Err(format!("cannot take the array over: {why}"));
        let states = self.engine.member_states();
        let raid1 = self.engine.geometry().level == Level::Raid1;
        let copies = if raid1 { states.len().max(1) } else { 2 };
        let held = |slot: usize| self.sbs.members().iter().any(|m| m.role.active_slot() == Some(slot));
        let one_each = states.chunks(copies).enumerate().all(|(group, s)| {
            let in_sync = s.iter().filter(|s| matches!(s, MemberState::InSync)).count();
            let empty = (0..s.len()).filter(|&i| !held(group * copies + i)).count();
            s.len() == copies && in_sync == 1 && empty == copies - 1
        });
        if !one_each && raid1 {
            return refuse(
                "md turns a raid1 into raid0 only when one mirror is left in sync and the others are missing: \
                 fail and remove the others first",
            );
        }
        if !one_each {
            return refuse(
                "md turns a raid10 into raid0 only when one member of each mirror pair is missing and the \
                 other in sync: fail and remove one member of each pair first",
            );
        }
        if self.read_only || self.reshaping.is_some() || self.takeover.is_some() {
            return refuse("the array is read-only, or a reshape or takeover runs");
        }
        if self.engine.sync_active() || !self.engine.replacements().is_empty() {
            return refuse("a recovery, check or replacement runs: let it finish first");
        }
        if self.sbs.bitmap().is_some() {
            return refuse("the array has a write-intent bitmap, which raid0 cannot keep: remove it first");
        }
        takeover_geometry(self.engine.geometry(), target).or_else(|e| refuse(&e))
    }

    /// md's level change without moving data: every superblock says the new level; the
    /// engine changes once that is durable (`pump_takeover`).
    pub(super) fn start_takeover(&mut self, target: &ReshapeTarget) -> Result<(), String> {
        let next = self.may_take_over(target)?;
        let events = self.sbs.events() + 1;
        let utime = self.now_seconds();
        let from = self.engine.geometry().level;
        self.sbs.renumber_slots(|slot| slot_after(from, next.level, slot));
        for slot in next.raid_disks..self.engine.geometry().raid_disks {
            self.sbs.slot_to_spare(slot);
        }
        if next.level == Level::Raid0 {
            // raid0_takeover_raid45/raid10: no resync is owed (no redundancy is left).
            self.sbs.resync_done();
        }
        self.sbs.reshape_finished(|sb| taken_over(sb, &next, events, utime));
        self.notice(format!(
            "takeover of raid{} to raid{} of {} members started",
            self.engine.geometry().level.md_level(),
            next.level.md_level(),
            next.raid_disks
        ));
        self.takeover = Some(Box::new(Takeover::new(next)));
        self.write_superblocks_then(Some(AfterRound::Takeover));
        Ok(())
    }

    pub(super) fn takeover_round_done(&mut self) {
        if let Some(t) = self.takeover.as_deref_mut() {
            t.recorded = true;
        }
    }

    /// Once recorded and the old engine idle: the new engine takes the members, and the
    /// requests that waited go to it, in order. Returns whether anything moved.
    pub(super) fn pump_takeover(&mut self) -> bool {
        let now = self.now_ns;
        let Some(t) = self.takeover.as_deref_mut() else { return false };
        if !t.swapped {
            if !t.recorded || !self.engine.is_idle() {
                return false;
            }
            let next = t.geometry.clone();
            t.swapped = true;
            if let Err(e) = self.swap_to(&next) {
                // The superblocks say the new level: a restart serves it.
                self.notice(format!("takeover could not start its engine: {e}; restart the array"));
            }
            return true;
        }
        let mut moved = false;
        while let Some(req) = t.waiting.pop_front() {
            if let Err(SubmitError::Busy(req)) = self.engine.submit(req, now) {
                t.waiting.push_front(req);
                return moved;
            }
            moved = true;
        }
        self.takeover = None;
        true
    }

    fn swap_to(&mut self, next: &Geometry) -> Result<(), String> {
        let mut members = Vec::new();
        let mut io = vec![None; next.raid_disks];
        let offset_of = |slot: usize| {
            self.sbs
                .members()
                .iter()
                .find(|m| m.role.active_slot() == Some(slot))
                .map(|m| (m.key, m.sb.data_offset))
        };
        let first_offset = offset_of(0).map_or(0, |(_, o)| o);
        for (slot, io_slot) in io.iter_mut().enumerate() {
            match offset_of(slot) {
                Some((key, offset)) => {
                    members.push(MemberConfig {
                        data_offset_bytes: offset * SECTOR_BYTES,
                        state: MemberState::InSync,
                    });
                    *io_slot = Some(key);
                }
                _ => members.push(MemberConfig {
                    data_offset_bytes: first_offset * SECTOR_BYTES,
                    state: MemberState::Missing,
                }),
            }
        }
        let config = ArrayConfig {
            geometry: next.clone(),
            members,
            tunables: self.engine.tunables().clone(),
            read_only: false,
        };
        let mut engine = Engine::new(config).map_err(|e| format!("the engine refused the new level: {e}"))?;
        for (slot, key) in io.iter().enumerate() {
            if let Some(key) = key {
                engine.set_io_member(slot, *key as usize)?;
                engine.set_bad_blocks(slot, self.sbs.bad_blocks(*key).cloned());
            }
        }
        engine.carry_stats_from(&self.engine);
        self.engine = engine;
        // A raid0 grow takes its new members into the reshape, not into the parity slot.
        let missing = (0..next.raid_disks).filter(|&s| io[s].is_none());
        for slot in missing.filter(|_| self.raid0_grow.is_none()) {
            if !self.spare_wanted.contains(&slot) {
                self.spare_wanted.push(slot);
            }
        }
        Ok(())
    }
}
