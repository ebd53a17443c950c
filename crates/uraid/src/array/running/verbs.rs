//! The control socket's verbs (mdadm --fail, --remove, --add, --replace, --action, sysfs
//! writes). The array decides and refuses (`uraid_core::array`); here the devices are
//! opened, checked for another array's superblock and for another holder, and a new
//! member's own superblock is written before the array takes it, as mdadm does. Every
//! refusal comes before the first write; a verb returns once the superblocks record it.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use uraid_core::array::{role_text, Added, ArrayView, DevRole, MemberKey, NewMember};
use uraid_core::meta::{feature, BadBlocks, Superblock};
use uraid_core::ScrubKind;
use uraid_io::real::Member;

use super::{exec_open_options, RunningArray};
use crate::array::member::MemberDev;
use crate::array::report::{count, human_bytes};
use crate::array::IoContext;

/// A device about to join the array, checked and claimed, its superblock not yet written.
struct Joining {
    dev: MemberDev,
    sb: Superblock,
    previous: Option<Superblock>,
    /// The bad-block log a member of this array coming back keeps (md's re-add), moved to
    /// where `sb` puts it; None for a device new to the array.
    bad_blocks: Option<BadBlocks>,
    /// The array's entry of this same device (a failed member coming back).
    replaces: Option<MemberKey>,
    /// The executor's index of this device when it was offered but left out (stale): it
    /// joins under a new one, and the old one is closed.
    left_out: Option<MemberKey>,
}

impl RunningArray {
    fn role_of(view: &ArrayView, key: MemberKey) -> Option<(DevRole, String)> {
        view.members.iter().find(|m| m.key == key).map(|m| (m.role, m.name.clone()))
    }

    /// mdadm --fail; a member whose loss would fail the array only with `force`.
    pub fn fail(&self, what: &str, force: bool) -> anyhow::Result<String> {
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let key = self.find_member(what)?;
        let mark = self
            .call(move |a, _, now| a.fail(key, force, now).map(|()| a.metadata_mark()))?
            .map_err(|e| anyhow!(e))?;
        self.wait_metadata(mark)?;
        let name = Self::role_of(&self.view()?, key).map_or_else(|| what.to_string(), |(_, n)| n);
        Ok(format!("uraid: set {name} faulty in {}\n", self.name))
    }

    /// mdadm --remove: a failed member or a spare leaves the array's superblocks.
    pub fn remove(&self, what: &str) -> anyhow::Result<String> {
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let key = self.find_member(what)?;
        let name = Self::role_of(&self.view()?, key).map_or_else(|| what.to_string(), |(_, n)| n);
        let mark = self
            .call(move |a, _, now| a.remove(key, now).map(|()| a.metadata_mark()))?
            .map_err(|e| anyhow!(e))?;
        self.wait_metadata(mark)?;
        Ok(format!("uraid: hot removed {name} from {}\n", self.name))
    }

    /// Opens `path` as a device to join the array: refused when it is in the array
    /// already, holds another array's superblock (unless `force`), is held by another
    /// process or is too small; claimed once accepted. Nothing is written.
    fn joining(&self, path: &str, force: bool, verb: &str) -> anyhow::Result<Joining> {
        let view = self.view()?;
        let mut dev = MemberDev::open(&PathBuf::from(path), true)?;
        let (mut replaces, mut left_out) = (None, None);
        let held = {
            let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
            members.iter().find(|(_, d)| d.identity == dev.identity).map(|(k, _)| *k)
        };
        if let Some(key) = held {
            match Self::role_of(&view, key) {
                Some((DevRole::Faulty { .. }, _)) if verb == "add" => replaces = Some(key),
                Some((role, name)) => {
                    bail!("{name} is already in the array ({}); nothing was written", role_text(role))
                }
                // A stale member left out at the start, still held open by this process.
                None => left_out = Some(key),
            }
        }
        let meta = dev.metadata();
        let previous = meta.offered.superblock.ok();
        if let Some(sb) = &previous {
            if sb.set_uuid != view.sb.set_uuid && !force {
                let doing = if verb == "replace" { "replacing" } else { "adding" };
                bail!(
                    "{} holds the superblock of another array ({}, {}): {doing} it would overwrite \
                     that array's member; use `uraid {verb} --force` if that is what you want \
                     (nothing was written)",
                    dev.name,
                    uraid_core::meta::format_uuid(&sb.set_uuid),
                    sb.name()
                );
            }
        }
        let (dev_sectors, name) = (dev.dev_sectors(), dev.name.clone());
        let uuid = crate::array::random_uuid()?;
        let mut sb = self
            .call(move |a, _, _| a.new_member_superblock(dev_sectors, uuid, &name))?
            .map_err(|e| anyhow!("{e}; nothing was written"))?;
        // A member of this array coming back keeps its bad-block log, as md's re-add does:
        // what a failed write left there is stale, and a bitmap re-add does not rebuild it.
        let returning = verb == "add" && previous.as_ref().is_some_and(|p| p.set_uuid == view.sb.set_uuid);
        let bad_blocks = match meta.bad_blocks {
            Ok(Some(bb)) if returning && !bb.is_empty() => bb.moved_to(&sb),
            _ => None,
        };
        if bad_blocks.is_some() {
            sb.feature_map |= feature::BAD_BLOCKS;
        }
        // This process's own descriptor of the device goes first: its flock would refuse
        // the claim below.
        if let Some(key) = held {
            self.members.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        }
        dev.claim()?;
        Ok(Joining { dev, sb, previous, bad_blocks, replaces, left_out })
    }

    /// Writes the joining device's own metadata (its bad-block log: the one it keeps, or
    /// an empty one; the bitmap area; its superblock), then gives it to the executor: its key.
    fn write_joining(&self, j: &Joining) -> anyhow::Result<Member> {
        let (dev, sb) = (&j.dev, &j.sb);
        if sb.bblog_size > 0 {
            let at = sb.super_offset.saturating_add_signed(i64::from(sb.bblog_offset)) * 512;
            let log = match &j.bad_blocks {
                Some(bb) => bb.to_log_bytes(sb.bblog_size),
                None => vec![0u8; usize::from(sb.bblog_size) * 512],
            };
            dev.write_at(at, &log).io_context(|| format!("{}: writing its bad-block log", dev.name))?;
        }
        if let Some((offset, area)) = self.call(|a, _, _| a.bitmap_area())? {
            dev.write_at(sb.super_offset.saturating_add_signed(i64::from(offset)) * 512, &area)
                .io_context(|| format!("{}: writing its bitmap", dev.name))?;
        }
        let mut written = sb.clone();
        dev.write_at(sb.super_offset * 512, &written.update_csum())
            .io_context(|| format!("{}: writing its superblock", dev.name))?;
        dev.sync().io_context(|| format!("{}: fdatasync", dev.name))?;
        dev.exec_member(&exec_open_options(false)).io_context(|| format!("{}: opening for I/O", dev.name))
    }

    /// mdadm --add: rebuild into a missing or failed slot (only what the bitmap says it
    /// missed, for a member coming back in time), or become a hot spare. `force` lets a
    /// member of another array be overwritten.
    pub fn add(&self, what: &str, force: bool) -> anyhow::Result<String> {
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        self.call(|a, _, _| a.may_add("added"))?.map_err(|e| anyhow!("{e}; nothing was written"))?;
        let j = self.joining(what, force, "add")?;
        let member = self.write_joining(&j)?;
        let name = j.dev.name.clone();
        let nm = NewMember {
            key: 0,
            name: name.clone(),
            sb: j.sb.clone(),
            previous: j.previous.clone(),
            replaces: j.replaces,
            bad_blocks: j.bad_blocks.clone(),
        };
        let left_out = j.left_out;
        let (key, added, mark) = self
            .call(move |a, ex, now| -> Result<_, String> {
                let key = ex.attach_member(member).map_err(|e| format!("giving it to the executor: {e}"))?
                    as MemberKey;
                if let Some(old) = left_out {
                    if let Ok(p) = super::placeholder() {
                        let _ = ex.replace_member(old as usize, p);
                    }
                }
                let added = a.add_member(NewMember { key, ..nm }, now)?;
                Ok((key, added, a.metadata_mark()))
            })?
            .map_err(|e| anyhow!("{name}: {e}"))?;
        self.members.lock().unwrap_or_else(|e| e.into_inner()).insert(key, j.dev);
        self.wait_metadata(mark)?;
        Ok(match added {
            Added::Spare => format!("uraid: added {name} to {} as a hot spare\n", self.name),
            Added::Rebuilding { slot, readd: Ok(ranges) } => {
                let sectors: u64 = ranges.iter().map(|(a, b)| b - a).sum();
                format!(
                    "uraid: re-added {name} to {} in slot {slot}: only the {} written while it was \
                     away ({}) {} rebuilt, from the write-intent bitmap\n",
                    self.name,
                    count(ranges.len(), "region"),
                    human_bytes(sectors * 512),
                    if ranges.len() == 1 { "is" } else { "are" }
                )
            }
            Added::Rebuilding { slot, readd: Err(why) } => {
                format!(
                    "uraid: added {name} to {} in slot {slot}; full recovery started ({why})\n",
                    self.name
                )
            }
        })
    }

    /// md's want_replacement: `new` is rebuilt from `what` (an active, in-sync member)
    /// while `what` stays in the array; when done `new` takes its slot and `what` is released.
    pub fn replace(&self, what: &str, new: &str, force: bool) -> anyhow::Result<String> {
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let key = self.find_member(what)?;
        let (role, old_name) = Self::role_of(&self.view()?, key)
            .ok_or_else(|| anyhow!("{what} is not a member of this array"))?;
        let slot = match role {
            DevRole::Active { slot, recovering: false } => slot,
            role => bail!(
                "{old_name} is not active and in sync ({}): only such a member is replaced; nothing was written",
                role_text(role)
            ),
        };
        self.call(move |a, _, _| a.may_replace(slot))?.map_err(|e| anyhow!("{e}; nothing was written"))?;
        let j = self.joining(new, force, "replace")?;
        let member = self.write_joining(&j)?;
        let name = j.dev.name.clone();
        let nm = NewMember {
            key: 0,
            name: name.clone(),
            sb: j.sb.clone(),
            previous: None,
            replaces: None,
            bad_blocks: None,
        };
        let (new_key, mark) = self
            .call(move |a, ex, now| -> Result<_, String> {
                let key = ex.attach_member(member).map_err(|e| format!("giving it to the executor: {e}"))?
                    as MemberKey;
                a.replace_member(slot, NewMember { key, ..nm }, now)?;
                Ok((key, a.metadata_mark()))
            })?
            .map_err(|e| anyhow!("{name} could not start replacing {old_name}: {e}"))?;
        self.members.lock().unwrap_or_else(|e| e.into_inner()).insert(new_key, j.dev);
        self.wait_metadata(mark)?;
        Ok(format!(
            "uraid: {name} is being rebuilt to replace {old_name} (slot {slot}) in {}; {old_name} \
             stays active until the copy is done, then it is released (`uraid status` shows the progress)\n",
            self.name
        ))
    }

    /// md's sync_action: `check` (count mismatches, change nothing), `repair` (rewrite what
    /// is inconsistent), `idle` (stop a check or repair).
    pub fn action(&self, what: &str) -> anyhow::Result<String> {
        let kind = match what {
            "check" => Some(ScrubKind::Check),
            "repair" => Some(ScrubKind::Repair),
            "idle" => None,
            other => bail!("unknown action {other:?}: use check, repair or idle"),
        };
        self.call(move |a, _, now| a.scrub(kind, now))?.map_err(|e| anyhow!(e))?;
        Ok(match kind {
            Some(k) => format!("uraid: {} started on {}\n", k.name(), self.name),
            None => format!("uraid: {} is idle\n", self.name),
        })
    }

    /// Change a tunable while I/O runs (md's /sys/block/mdX/md/NAME; the table is
    /// `uraid_core::tunables::TUNABLES`); an empty name lists them. Answers the values now.
    pub fn set_tunable(&self, name: &str, value: &str) -> anyhow::Result<String> {
        let (name, value) = (name.to_string(), value.to_string());
        self.call(move |a, _, _| a.set_tunable(&name, &value))?.map_err(|e| anyhow!(e))
    }
}
