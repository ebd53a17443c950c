//! `uraid replace MEMBER --with NEW` (md's want_replacement, mdadm --replace): the
//! control verb, the metadata around the engine's copy (see `uraid_core::replace`), and
//! how `status`/`detail` show it. Every refusal comes before the first write.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use uraid_core::meta::feature;
use uraid_core::MemberState;
use uraid_io::real::Member;

use super::{exec_open_options, new_member_superblock, role_text, RunningArray};
use crate::array::member::MemberDev;
use crate::array::meta::DevRole;
use crate::array::report::{DetailInfo, DeviceRow};

/// A replacement as `status` and `detail` show it.
pub(super) struct ReplacementView {
    pub slot: usize,
    pub dev_number: u32,
    pub name: String,
}

impl RunningArray {
    /// md's want_replacement: `new` is rebuilt from `what` (an active, in-sync member) while
    /// `what` stays in the array; when done `new` takes its slot and `what` is released.
    pub fn replace(&self, what: &str, new: &str, force: bool) -> anyhow::Result<String> {
        if self.read_only {
            bail!("the array is served read-only: members cannot be replaced");
        }
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let level = self.geometry.level.md_level();
        if level == 0 {
            bail!("raid0 has no redundancy: a member cannot be replaced while it runs; nothing was written");
        }
        let snap = self.snapshot();
        if snap.failed {
            bail!("{} has failed: nothing can be replaced; nothing was written", self.name);
        }
        if snap.states.iter().any(|s| !matches!(s, MemberState::InSync)) {
            bail!(
                "{} is degraded ({} of {} members in sync): md rebuilds the missing member first, \
                 so use `uraid add {new}`; nothing was written",
                self.name,
                snap.states.iter().filter(|s| matches!(s, MemberState::InSync)).count(),
                snap.states.len()
            );
        }
        if let Some(sync) = &snap.sync {
            bail!(
                "a {} is running on {}: replace once it is done (`uraid status`); nothing was written",
                uraid_core::scrub::action_name(sync.kind),
                self.name
            );
        }
        let i = self.find_dev(what)?;
        let (old_role, old_name) = {
            let devs = self.meta.lock().devs();
            (devs[i].role, devs[i].name.clone())
        };
        let slot = match old_role {
            DevRole::Active { slot, recovering: false }
                if matches!(snap.states.get(slot), Some(MemberState::InSync)) =>
            {
                slot
            }
            role => bail!(
                "{old_name} is not active and in sync ({}): only such a member is replaced; nothing was written",
                role_text(role)
            ),
        };
        if !snap.replacements.is_empty() {
            bail!("a replacement is already being rebuilt in {}; nothing was written", self.name);
        }
        let path = PathBuf::from(new);
        let mut dev = MemberDev::open(&path, true)?;
        let reference = {
            let devs = self.meta.lock().devs();
            if let Some(d) = devs.iter().find(|d| d.identity == dev.identity) {
                bail!("{} is already in the array ({}); nothing was written", d.name, role_text(d.role));
            }
            devs[0].sb.clone()
        };
        if let Ok(sb) = dev.read_metadata().0 {
            if sb.set_uuid != reference.set_uuid && !force {
                bail!(
                    "{} holds the superblock of another array ({}, {}): replacing with it would \
                     overwrite that array's member; use `uraid replace --force` if that is what you \
                     want (nothing was written)",
                    dev.name,
                    uraid_core::meta::format_uuid(&sb.set_uuid),
                    sb.name()
                );
            }
        }
        let dev_number = {
            let devs = self.meta.lock().devs();
            let used: Vec<u32> = devs.iter().map(|d| d.sb.dev_number).collect();
            (0u32..).find(|n| !used.contains(n)).unwrap_or(0)
        };
        // Too small: refused here, before the claim and any write.
        let mut sb = new_member_superblock(&reference, &dev, dev_number, self.used_dev_sectors)?;
        dev.claim()?;
        sb.feature_map |= feature::REPLACEMENT;
        // Its own superblock first (a replacement of `slot`, nothing copied), so a crash
        // leaves it recognisable and never taken for the slot's member (assembly prefers
        // the in-sync member of a slot over an unfinished replacement).
        self.write_new_member(&dev, &sb, DevRole::Active { slot, recovering: true })?;
        let name = dev.name.clone();
        self.keep_new_member(&dev, &sb)?;
        let key = self
            .meta
            .lock()
            .devs()
            .into_iter()
            .find(|d| d.identity == dev.identity)
            .map(|d| d.key)
            .ok_or_else(|| anyhow!("{name} left the array while it was being added"))?;
        let member = Member::open(&dev.path, &exec_open_options(false))
            .with_context(|| format!("{name}: opening for I/O"))?;
        let data_offset_bytes = sb.data_offset * 512;
        // The metadata says "replacement" before the engine writes any data to it.
        self.meta.update(|st, now| st.core.replacement_started(key, slot, 0, now))?;
        let started = self.poll_locked(move |e, ex, now| {
            let index =
                ex.attach_member(member).map_err(|err| format!("giving it to the executor: {err}"))?;
            e.start_replacement(slot, index, data_offset_bytes, 0, now)
        });
        if let Err(e) = started {
            self.meta.update(|st, now| st.core.replacement_failed(slot, now))?;
            return Err(e.context(format!("{name} could not start replacing {old_name}")));
        }
        Ok(format!(
            "uraid: {name} is being rebuilt to replace {old_name} (slot {slot}) in {}; {old_name} \
             stays active until the copy is done, then it is released (`uraid status` shows the progress)\n",
            self.name
        ))
    }

    /// The engine copied the replacement of `slot`; writes still reach both. In md's order:
    /// flush, the superblocks say the replacement holds the slot (and the member is gone),
    /// and only then the member stops getting writes, so a crash at any point leaves a
    /// slot member that has every acknowledged write.
    pub(super) fn replacement_copied(&self, slot: usize) -> anyhow::Result<()> {
        let devs = self.meta.lock().devs();
        let Some(new) = devs.iter().find(|d| d.role == (DevRole::Replacement { slot })) else {
            return Ok(()); // dropped meanwhile
        };
        let old = devs
            .iter()
            .find(|d| d.role.active_slot() == Some(slot))
            .ok_or_else(|| anyhow!("slot {slot} has no active member in the metadata"))?;
        if !self.flush() {
            // Retried by the monitor's next checkpoint pass (the replacement stays copied).
            return Ok(());
        }
        // The superblocks of a slot's member go through the executor's index `slot` (see
        // `MetaKeeper::perform_io`): the new device is put there before it is recorded as
        // the slot's, and the engine keeps reaching the old member through an index of its own.
        let new_member = Member::open(&new.path, &exec_open_options(false))
            .with_context(|| format!("{}: opening for I/O", new.name))?;
        let old_member = Member::open(&old.path, &exec_open_options(false))
            .with_context(|| format!("{}: opening for I/O", old.name))?;
        // Under the keeper's lock, so that no other round writes the old member's superblock
        // through index `slot` once the new device is there. The old member leaves the
        // core's members, so the keeper closes its file: its claim (flock) is dropped, as
        // `remove` would.
        let mut moved = Ok(());
        self.meta.update(|st, now| {
            moved = self
                .handle
                .control(move |e, ex, _| -> Result<(), String> {
                    let old_index = ex.attach_member(old_member).map_err(|err| err.to_string())?;
                    ex.replace_member(slot, new_member).map_err(|err| err.to_string())?;
                    super::engine_of(e).set_io_member(slot, old_index)
                })
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            match moved {
                Ok(()) => st.core.replacement_done(slot, now).0,
                // Nothing moved: the superblocks are written as they are.
                Err(_) => st.core.write_superblocks(now),
            }
        })?;
        moved.map_err(|e| anyhow!("moving the replacement into slot {slot}: {e}"))?;
        self.handle
            .control(move |e, _, now| super::engine_of(e).promote_replacement(slot, slot, now))
            .map_err(|e| anyhow!("{e}"))?
            .map_err(|e| anyhow!("promoting the replacement of slot {slot}: {e}"))?;
        self.set_slot_path(slot, Some(new.name.clone()));
        eprintln!(
            "uraid: {}: {} replaced {} in slot {slot}; {} is faulty and released",
            self.name, new.name, old.name, old.name
        );
        Ok(())
    }

    /// The replacement of `slot` failed (or was given up): it leaves the array.
    pub(super) fn replacement_failed(&self, slot: usize) -> anyhow::Result<()> {
        eprintln!(
            "uraid: {}: the replacement of slot {slot} failed; it leaves the array, the member stays",
            self.name
        );
        self.meta.update(|st, now| st.core.replacement_failed(slot, now))
    }

    /// Records how far the copy got, after a flush made that much durable.
    pub(super) fn checkpoint_replacement(&self, slot: usize, offset: u64) -> anyhow::Result<()> {
        if !self.flush() {
            return Ok(());
        }
        self.meta.update(|st, now| st.core.replacement_checkpoint(slot, offset, now))
    }

    pub(super) fn replacement_views(&self) -> Vec<ReplacementView> {
        self.meta
            .lock()
            .devs()
            .into_iter()
            .filter_map(|d| match d.role {
                DevRole::Replacement { slot } => {
                    Some(ReplacementView { slot, dev_number: d.sb.dev_number, name: d.name })
                }
                _ => None,
            })
            .collect()
    }

    /// mdadm --detail's "spare rebuilding ... replacement" rows.
    pub(super) fn add_replacement_rows(&self, info: &mut DetailInfo) {
        for r in self.replacement_views() {
            info.rows.push(DeviceRow {
                number: r.dev_number.to_string(),
                slot: r.slot.to_string(),
                state: "spare rebuilding replacement".into(),
                path: r.name,
            });
            info.working += 1;
            info.spares += 1;
        }
    }
}
