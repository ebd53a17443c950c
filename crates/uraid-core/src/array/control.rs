//! The operator's verbs on a running array (mdadm --fail, --remove, --add, --replace, md's
//! sync_action and sysfs tunables). Every refusal comes before anything changes; a verb
//! that goes through changes the superblocks in the round it queues. Writing a new
//! member's own superblock first is the caller's (mdadm writes it from user space).

use super::state::Array;
use super::superblocks::{ArrayMember, DevRole, MemberKey};
use crate::api::*;
use crate::config::MemberState;
use crate::geometry::Level;
use crate::meta::{feature, role, BadBlocks, Superblock, SuperblockVersion};
use crate::scrub::ScrubKind;
use crate::sync::SyncKind;

/// A device joining the array, its own superblock already written by the caller.
#[derive(Clone, Debug)]
pub struct NewMember {
    /// The caller's index of the device (its member I/O goes there).
    pub key: MemberKey,
    pub name: String,
    /// The superblock written on it (see [`Array::new_member_superblock`]).
    pub sb: Superblock,
    /// What the device held before, if it was one of this array's members (a re-add).
    pub previous: Option<Superblock>,
    /// The bad-block log the device carries, read with `previous` before its new
    /// superblock was written. A member of this array coming back keeps it (md loads a
    /// re-added device's log): the ranges a write failed on while it was a member still
    /// hold old data, and a bitmap re-add does not rebuild them.
    pub bad_blocks: Option<BadBlocks>,
    /// The array's faulty entry of this same device, which it replaces.
    pub replaces: Option<MemberKey>,
}

/// What [`Array::add_member`] made of a new member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Added {
    Spare,
    Rebuilding {
        slot: usize,
        /// The regions a bitmap re-add rebuilds (engine ranges), or why it is rebuilt in full.
        readd: Result<Vec<(u64, u64)>, String>,
    },
}

/// What a superblock says of the array's shape: level, layout, members, chunk, component
/// size, and the reshape under way (not its checkpoint).
fn shape_of(sb: &Superblock) -> (i32, u32, u32, u32, u64, bool, u32, i32) {
    let reshaping = sb.has(feature::RESHAPE_ACTIVE);
    (sb.level, sb.layout, sb.raid_disks, sb.chunksize, sb.size, reshaping, sb.new_level, sb.delta_disks)
}

impl Array {
    fn level_name(&self) -> String {
        format!("raid{}", self.engine.geometry().level.md_level())
    }

    /// Refusals every verb that adds a device shares (`what`: "added", "replaced"); the
    /// caller asks before it writes anything to the device.
    pub fn may_add(&self, what: &str) -> Result<(), String> {
        if self.read_only {
            return Err(format!("the array is served read-only: members cannot be {what}"));
        }
        if self.engine.geometry().level == Level::Raid0 && !self.raid0_grow_adds {
            return Err(
                "raid0 has no redundancy to rebuild a member from (take it over to raid4 or raid5 first: \
                        `uraid grow --level 4`, then add the member for the parity slot)"
                    .into(),
            );
        }
        if self.engine.is_failed() {
            return Err(format!(
                "the array has failed (more members lost than {} survives): a new member cannot be \
                 rebuilt from it",
                self.level_name()
            ));
        }
        Ok(())
    }

    /// Why the devices `--add`ed for `plan` cannot join now. A raid0 takes them (as spares
    /// until the grow takes them, in the same command) only for a grow by members.
    pub fn may_add_for_grow(&mut self, plan: &super::grow::GrowPlan) -> Result<(), String> {
        let raid0_grow = matches!(plan, super::grow::GrowPlan::Reshape(t)
            if t.level == Level::Raid0 && self.engine.geometry().level == Level::Raid0);
        self.raid0_grow_adds = raid0_grow;
        self.may_add("added")
    }

    /// The superblock of a device joining the array: the array's fields, its own identity
    /// (`device_uuid`), a free dev_number, its size. Refused when too small.
    pub fn new_member_superblock(
        &self,
        dev_sectors: u64,
        device_uuid: [u8; 16],
        name: &str,
    ) -> Result<Superblock, String> {
        let reference = &self.sbs.members()[0].sb;
        let used: Vec<u32> = self.sbs.members().iter().map(|m| m.sb.dev_number).collect();
        let dev_number = reference.free_dev_number(&used);
        let version = match reference.super_offset {
            0 => SuperblockVersion::V1_1,
            8 => SuperblockVersion::V1_2,
            _ => SuperblockVersion::V1_0,
        };
        let mut sb = reference.clone();
        sb.device_uuid = device_uuid;
        sb.dev_number = dev_number;
        sb.feature_map |= feature::RECOVERY_OFFSET;
        sb.feature_map &= !(feature::REPLACEMENT | feature::BAD_BLOCKS);
        sb.recovery_offset = 0;
        sb.cnt_corrected_read = 0;
        sb.devflags = 0;
        let too_small = || {
            format!(
                "{name} is too small: {dev_sectors} sectors, the array needs {} sectors of data after \
                 the {}-sector data offset",
                reference.size, reference.data_offset
            )
        };
        match version {
            SuperblockVersion::V1_0 => {
                let sb_at = version.sb_offset_sectors(dev_sectors).ok_or_else(too_small)?;
                // Keep the reference's room between data end and superblock (bitmap, bblog).
                let room = reference.super_offset.saturating_sub(reference.data_offset + reference.data_size);
                sb.super_offset = sb_at;
                sb.data_size = sb_at.checked_sub(room + sb.data_offset).ok_or_else(too_small)?;
            }
            _ => sb.data_size = dev_sectors.checked_sub(sb.data_offset).ok_or_else(too_small)?,
        }
        if sb.data_size < reference.size {
            return Err(too_small());
        }
        if sb.max_dev <= dev_number {
            sb.max_dev = dev_number + 1;
            sb.dev_roles.resize(sb.max_dev as usize, role::SPARE);
        }
        if let Some(r) = sb.dev_roles.get_mut(dev_number as usize) {
            *r = role::SPARE;
        }
        Ok(sb)
    }

    /// The bitmap area as it should be on a new member, with its offset from the
    /// superblock in sectors.
    pub fn bitmap_area(&self) -> Option<(i32, Vec<u8>)> {
        self.sbs.bitmap_area()
    }

    /// A joining device's superblock is made in an earlier call (`new_member_superblock`):
    /// a takeover, reshape or resize since then gave the array another shape, which the
    /// rounds would then keep writing on that member.
    fn joining_shape_is_current(&self, m: &NewMember) -> Result<(), String> {
        if shape_of(&m.sb) != shape_of(&self.sbs.members()[0].sb) {
            return Err(format!(
                "the array changed shape (level, layout, members, chunk or size) while {} was being \
                 prepared; add it again",
                m.name
            ));
        }
        Ok(())
    }

    /// mdadm --add: the device rebuilds a missing or failed slot (only what the bitmap
    /// says it missed, when it is a member returning in time), or becomes a hot spare.
    pub fn add_member(&mut self, m: NewMember, now_ns: TimeNs) -> Result<Added, String> {
        self.now_ns = self.now_ns.max(now_ns);
        self.may_add("added")?;
        if self.sbs.member(m.key).is_some() {
            return Err(format!("{} is already in the array", m.name));
        }
        self.joining_shape_is_current(&m)?;
        if let Some(old) = m.replaces {
            self.sbs.member_removed(old);
            self.released.push(old);
        }
        let data_offset_bytes = m.sb.data_offset * SECTOR_BYTES;
        self.names.insert(m.key, m.name.clone());
        let returning = m.previous.as_ref().is_some_and(|p| p.set_uuid == self.sbs.members()[0].sb.set_uuid);
        let kept_log = m.bad_blocks.filter(|bb| returning && !bb.is_empty());
        self.sbs.member_added(ArrayMember { key: m.key, sb: m.sb, role: DevRole::Spare });
        // md's re-add keeps the device's log; one its new superblock has no room for is
        // lost, so the device is then rebuilt in full (a bitmap re-add would read the
        // ranges the log listed as good).
        let log_lost = kept_log.is_some_and(|bb| !self.sbs.keep_bad_blocks(m.key, &bb));
        self.write_superblocks_then(None);
        let states = self.engine.member_states();
        let slot = (0..states.len()).find(|&s| {
            matches!(states[s], MemberState::Missing | MemberState::Faulty)
                && !self.sbs.members().iter().any(|a| a.role.active_slot() == Some(s))
        });
        let added = match slot {
            None => Added::Spare,
            Some(slot) if self.engine.member_io_in_flight(slot) => {
                // The failed member's last I/O is still draining: it takes the slot after.
                self.spare_wanted.push(slot);
                Added::Spare
            }
            Some(slot) => {
                let readd = if log_lost {
                    Err("its bad-block log does not fit in its new superblock's".into())
                } else {
                    self.readd_ranges(m.previous.as_ref(), slot, data_offset_bytes / SECTOR_BYTES)
                };
                match self.rebuild_into(slot, m.key, data_offset_bytes, readd.as_ref().ok().cloned()) {
                    Ok(()) => Added::Rebuilding { slot, readd },
                    Err(e) => {
                        self.notice(format!("{} could not take slot {slot} ({e}); it stays a spare", m.name));
                        Added::Spare
                    }
                }
            }
        };
        self.settle();
        Ok(added)
    }

    /// md's re-add: the regions (engine ranges) a returning member missed, from the
    /// bitmap's set bits; or why it must be rebuilt in full.
    fn readd_ranges(
        &self,
        old: Option<&Superblock>,
        slot: usize,
        data_offset: u64,
    ) -> Result<Vec<(u64, u64)>, String> {
        let array = &self.sbs.members()[0].sb;
        let old = old.filter(|o| o.set_uuid == array.set_uuid).ok_or("it is new to the array")?;
        if old.role() as usize != slot || old.data_offset != data_offset {
            return Err(format!("it was not slot {slot}'s member with this data offset"));
        }
        if old.has(feature::RECOVERY_OFFSET) {
            return Err("it left while it was being rebuilt".into());
        }
        // The bitmap counts writes, not the stripes a reshape moves: a member back while
        // one runs, or whose superblock names another shape or a reshape under way, missed
        // windows no bit names.
        if self.reshaping.is_some() {
            return Err(
                "a reshape is running: the stripes it moved since the member left are in no bitmap bit"
                    .into(),
            );
        }
        if shape_of(old) != shape_of(array) {
            return Err("the array was reshaped or resized since it left".into());
        }
        if self.engine.geometry().level == Level::Raid10 {
            return Err("raid10 re-adds are rebuilt in full".into());
        }
        let bm = self.sbs.bitmap().ok_or("the array has no write-intent bitmap")?;
        let cleared = bm.superblock().events_cleared;
        if old.events < cleared {
            return Err(format!(
                "its events {} are older than the bitmap's events_cleared {cleared}: bits were cleared since it left",
                old.events
            ));
        }
        Ok(bm.set_regions().into_iter().map(|(s, l)| (s, s + l)).collect())
    }

    /// md's want_replacement: the device is rebuilt from the active, in-sync member of
    /// `slot`, which stays; once copied and flushed the device takes the slot and the
    /// member is released.
    pub fn replace_member(&mut self, slot: usize, m: NewMember, now_ns: TimeNs) -> Result<(), String> {
        self.now_ns = self.now_ns.max(now_ns);
        self.may_replace(slot)?;
        if self.sbs.member(m.key).is_some() {
            return Err(format!("{} is already in the array", m.name));
        }
        self.joining_shape_is_current(&m)?;
        let data_offset_bytes = m.sb.data_offset * SECTOR_BYTES;
        self.engine.start_replacement(slot, m.key as usize, data_offset_bytes, 0, self.now_ns)?;
        self.names.insert(m.key, m.name);
        self.sbs.member_added(ArrayMember { key: m.key, sb: m.sb, role: DevRole::Spare });
        self.sbs.replacement_started(m.key, slot, 0);
        self.write_superblocks_then(None);
        self.settle();
        Ok(())
    }

    /// Why the member of `slot` cannot be replaced now, if it cannot (asked before the
    /// caller writes anything to the new device).
    pub fn may_replace(&self, slot: usize) -> Result<(), String> {
        self.may_add("replaced")?;
        if self.reshaping.is_some() {
            return Err("a reshape is running: replace the member once it is done".into());
        }
        let states = self.engine.member_states();
        if states.iter().any(|s| *s != MemberState::InSync) {
            return Err(format!(
                "the array is degraded ({} of {} members in sync): md rebuilds the missing member first, \
                 so use `uraid add`",
                states.iter().filter(|s| **s == MemberState::InSync).count(),
                states.len()
            ));
        }
        if let Some(sync) = self.engine.sync_status() {
            return Err(format!(
                "a {} is running: replace once it is done (`uraid status`)",
                crate::scrub::action_name(sync.kind)
            ));
        }
        if !self.engine.replacements().is_empty() {
            return Err("a replacement is already being rebuilt".into());
        }
        match self.sbs.members().iter().find(|m| m.role.active_slot() == Some(slot)) {
            Some(m) if m.role == (DevRole::Active { slot, recovering: false }) => Ok(()),
            Some(m) => Err(format!(
                "{} is not active and in sync ({}): only such a member is replaced",
                self.name_of(m.key),
                role_text(m.role)
            )),
            None => Err(format!("slot {slot} has no member to replace")),
        }
    }

    /// The last metadata round asked for so far: once [`Array::metadata_done`] says it is
    /// done, every change made until now is in the superblocks.
    pub fn metadata_mark(&self) -> u64 {
        self.rounds.last_seq()
    }

    pub fn metadata_done(&self, mark: u64) -> bool {
        self.rounds.done_seq() >= mark || self.read_only
    }

    /// mdadm --fail: the active member `key` is failed (a replacement is given up). As
    /// mdadm does, a member whose loss would fail the array is refused, nothing changed,
    /// unless `force`.
    pub fn fail(&mut self, key: MemberKey, force: bool, now_ns: TimeNs) -> Result<(), String> {
        self.now_ns = self.now_ns.max(now_ns);
        let name = self.name_of(key);
        match self.sbs.member(key).map(|m| m.role) {
            Some(DevRole::Active { slot, .. }) => {
                if !force && !self.engine.is_failed() && !self.engine.survives_losing(slot) {
                    let states = self.engine.member_states();
                    return Err(format!(
                        "failing {name} would fail the array: {} cannot serve its data without it \
                         ({} of {} members in sync); nothing changed. mdadm refuses this too; \
                         `uraid fail --force` insists",
                        self.level_name(),
                        states.iter().filter(|s| **s == MemberState::InSync).count(),
                        states.len()
                    ));
                }
                self.engine.fail_member(slot, self.now_ns)
            }
            Some(DevRole::Replacement { slot }) => self.engine.fail_replacement(slot, self.now_ns),
            Some(role) => {
                return Err(format!(
                    "{name} is not active in the array ({}); nothing to fail",
                    role_text(role)
                ))
            }
            None => return Err(format!("{name} is not a member of the array")),
        }
        self.settle();
        Ok(())
    }

    /// mdadm --remove: a failed member or a spare leaves the array's superblocks.
    pub fn remove(&mut self, key: MemberKey, now_ns: TimeNs) -> Result<(), String> {
        self.now_ns = self.now_ns.max(now_ns);
        if self.read_only {
            return Err("the array is served read-only: members cannot be removed".into());
        }
        let name = self.name_of(key);
        match self.sbs.member(key).map(|m| m.role) {
            Some(DevRole::Faulty { .. } | DevRole::Spare) => {}
            Some(DevRole::Active { .. }) => {
                return Err(format!("{name} is active: fail it first (`uraid fail {name}`)"))
            }
            Some(DevRole::Replacement { .. }) => {
                return Err(format!(
                    "{name} is being rebuilt as a replacement: fail it first (`uraid fail {name}`)"
                ))
            }
            None => return Err(format!("{name} is not a member of the array")),
        }
        self.sbs.member_removed(key);
        self.released.push(key);
        self.write_superblocks_then(None);
        self.settle();
        Ok(())
    }

    /// md's sync_action: `check` or `repair` (None: `idle`, stop one). `idle` stops a
    /// check or repair only; a resync or recovery goes on (md restarts one at once), and
    /// `idle` then answers an error saying so.
    pub fn scrub(&mut self, kind: Option<ScrubKind>, now_ns: TimeNs) -> Result<(), String> {
        self.now_ns = self.now_ns.max(now_ns);
        if self.read_only && kind == Some(ScrubKind::Repair) {
            return Err("the array is served read-only: `repair` would write; use `check`".into());
        }
        let stopped = match kind {
            Some(_) if self.reshaping.is_some() => {
                return Err("a reshape is running: md checks an array once its reshape is done".into())
            }
            Some(k) => {
                self.engine.start_scrub(k, self.now_ns)?;
                false
            }
            None => self.engine.stop_scrub(),
        };
        self.settle();
        match (kind, self.sync_kind()) {
            (None, Some(job)) if !matches!(job, SyncKind::Scrub(_)) => Err(format!(
                "{}a {} is running and goes on: `idle` stops a check or repair, not a {} (md restarts \
                 one at once); `uraid status` shows its progress",
                if stopped { "the queued check/repair is stopped, but " } else { "" },
                crate::sync::mdstat_name(job),
                crate::sync::mdstat_name(job),
            )),
            _ => Ok(()),
        }
    }

    /// md's sysfs write of tunable `name` (an empty name changes nothing); answers the
    /// values now.
    pub fn set_tunable(&mut self, name: &str, value: &str) -> Result<String, String> {
        if !name.is_empty() {
            self.engine.set_tunable(name, value)?;
        }
        Ok(self.engine.tunables().describe(self.engine.geometry().level))
    }

    /// The running sync's kind, if any (what `replace` and `status` look at).
    pub fn sync_kind(&self) -> Option<SyncKind> {
        self.engine.sync_status().map(|s| s.kind)
    }
}

/// A member's role as mdadm --detail words it.
pub fn role_text(role: DevRole) -> String {
    match role {
        DevRole::Active { slot, recovering: false } => format!("active in slot {slot}"),
        DevRole::Active { slot, recovering: true } => format!("rebuilding into slot {slot}"),
        DevRole::Spare => "a spare".to_string(),
        DevRole::Faulty { slot } => format!("faulty in slot {slot}"),
        DevRole::Replacement { slot } => format!("replacing slot {slot}'s member"),
    }
}
