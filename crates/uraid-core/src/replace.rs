//! md's want_replacement (`mdadm --replace`): a second device is rebuilt for a slot while
//! the slot's member stays active and in sync, so the array is never degraded.
//!
//! What md does, and so this engine:
//! - every write to the slot goes to the member and to its replacement (raid1.c and
//!   raid10.c write to a non-faulty replacement everywhere; raid5.c's ops_run_io writes
//!   `rrdev` beside `rdev`), and completes only when both landed;
//! - reads stay on the member (it is in sync);
//! - the copy is a recovery job whose source is the member itself: raid1/10 read the
//!   member (another copy when that read fails, and the good data is written back over the
//!   failed sectors, md's fix_sync_read_error); raid4/5/6 read the member's block of each
//!   stripe head (a failed read is rebuilt from the other members and rewritten, md's
//!   read-error correction) and write it to the replacement;
//! - when the copy is done (`EngineEvent::ReplacementCopied`) writes still go to both
//!   until the caller has flushed it and recorded it in the superblocks, then
//!   `promote_replacement` gives it the slot and the member is let go (md marks it Faulty
//!   in raid5_spare_active / raid1_spare_active, and blocks writes until the superblocks
//!   say so, then *_remove_disk);
//! - a replacement whose write fails is dropped, not the array's member; a member that
//!   fails during the copy ends the replacement too (the slot is then rebuilt as usual).
//!
//! The replacement has its own engine member index, `raid_disks + slot`, so that its I/O
//! completions and failures are told apart from the slot's; the caller's member index
//! for it (`io_member`) is whatever the executor gave it.

use crate::api::*;
use crate::config::MemberState;
use crate::engine::Mddev;
use crate::geometry::Level;
use crate::ledger::Ledger;
use crate::rdev::Replacement;
use crate::sync::{EngineEvent, SyncKind};

pub use crate::rdev::ReplacementStatus;

impl Mddev {
    pub(crate) fn start_replacement(
        &mut self,
        led: &mut Ledger,
        slot: usize,
        io_member: usize,
        data_offset_bytes: u64,
        from_sectors: u64,
        now_ns: TimeNs,
    ) -> Result<(), String> {
        self.now_ns = self.now_ns.max(now_ns);
        if self.geo.level == Level::Raid0 {
            return Err("raid0 has no redundancy: a member cannot be replaced while it runs".into());
        }
        if self.failed {
            return Err("the array has failed; nothing can be replaced".into());
        }
        let m = self.members.get(slot).ok_or_else(|| format!("slot {slot} does not exist"))?;
        if m.state != MemberState::InSync {
            return Err(format!(
                "slot {slot}'s member is not active and in sync ({:?}): only an in-sync member is replaced",
                m.state
            ));
        }
        if self.is_degraded() {
            // md gives a spare to the empty slot before any replacement (raid5_add_disk).
            return Err("the array is degraded: rebuild the missing member first (`uraid add`)".into());
        }
        if self.replacements[slot].is_some() {
            return Err(format!("slot {slot} is already being replaced"));
        }
        if self.members.iter().any(|m| m.io_member == io_member) {
            return Err(format!("member index {io_member} is a slot's, not a new device's"));
        }
        self.replacements[slot] = Some(Replacement {
            io_member,
            data_offset_bytes,
            recovery_offset_sectors: from_sectors,
            copied: false,
        });
        self.sync_queue.push_back((SyncKind::Replace { slot }, Some(vec![(from_sectors, u64::MAX)])));
        self.events.push_back(EngineEvent::RecoveryStarted(slot));
        self.wake_sync(led);
        Ok(())
    }

    pub(crate) fn replacements(&self) -> Vec<ReplacementStatus> {
        self.replacements
            .iter()
            .enumerate()
            .filter_map(|(slot, r)| {
                let r = r.as_ref()?;
                Some(ReplacementStatus {
                    slot,
                    io_member: r.io_member,
                    recovery_offset_sectors: r.recovery_offset_sectors,
                    copied: r.copied,
                })
            })
            .collect()
    }

    pub(crate) fn fail_replacement(&mut self, led: &mut Ledger, slot: usize, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        if self.replacements.get_mut(slot).and_then(Option::take).is_none() {
            return;
        }
        // Its twin writes in flight hold the slot writes: they end as `Gone` (`release_gone`).
        led.release_member(self.replacement_index(slot));
        if self.sync.as_ref().is_some_and(|j| j.kind == SyncKind::Replace { slot }) {
            let job = self.sync.take().expect("job");
            self.sync_aborted(job, true);
        }
        self.sync_queue.retain(|(k, _)| *k != SyncKind::Replace { slot });
        self.events.push_back(EngineEvent::ReplacementFaulty(slot));
        self.cache_rehandle_all(led);
    }

    /// The engine member index of `slot`'s replacement.
    pub(crate) fn replacement_index(&self, slot: usize) -> usize {
        self.geo.raid_disks + slot
    }

    /// The slot whose replacement engine member index `member` is.
    pub(crate) fn replacement_slot(&self, member: usize) -> Option<usize> {
        member.checked_sub(self.geo.raid_disks).filter(|&s| s < self.geo.raid_disks)
    }

    /// Is `member` (a slot or a replacement index) written?
    pub(crate) fn target_writable(&self, member: usize) -> bool {
        match self.replacement_slot(member) {
            Some(slot) => self.replacements[slot].is_some(),
            None => self.members[member].writable(),
        }
    }

    /// Engine member indices that take flushes: writable slots and replacements.
    pub(crate) fn flush_targets(&self) -> Vec<usize> {
        let slots = (0..self.members.len()).filter(|&m| self.members[m].writable());
        let repl = (0..self.replacements.len())
            .filter(|&s| self.replacements[s].is_some())
            .map(|s| self.replacement_index(s));
        slots.chain(repl).collect()
    }

    /// The copy reached `offset` (member data sectors): recorded as the replacement's
    /// recovery_offset.
    pub(crate) fn replacement_progress(&mut self, slot: usize, offset: u64) {
        if let Some(r) = self.replacements[slot].as_mut() {
            r.recovery_offset_sectors = r.recovery_offset_sectors.max(offset);
        }
    }

    /// The copy is done: writes keep going to both until the caller, having flushed it
    /// and written the superblocks, calls `promote_replacement`.
    pub(crate) fn replacement_copied(&mut self, slot: usize) {
        let Some(r) = self.replacements[slot].as_mut() else { return };
        r.copied = true;
        r.recovery_offset_sectors = u64::MAX;
        self.events.push_back(EngineEvent::ReplacementCopied(slot));
    }

    pub(crate) fn promote_replacement(
        &mut self,
        led: &mut Ledger,
        slot: usize,
        io_member: usize,
        now_ns: TimeNs,
    ) -> Result<usize, String> {
        self.now_ns = self.now_ns.max(now_ns);
        match self.replacements.get(slot) {
            Some(Some(r)) if r.copied => {}
            Some(Some(_)) => return Err(format!("the replacement of slot {slot} is not copied yet")),
            _ => return Err(format!("slot {slot} has no replacement")),
        }
        let r = self.replacements[slot].take().expect("checked");
        let m = &mut self.members[slot];
        let old_io_member = m.io_member;
        m.io_member = io_member;
        m.data_offset_bytes = r.data_offset_bytes;
        m.last_end_sector = 0;
        self.ppl_member_changed(slot);
        self.cache_rehandle_all(led);
        Ok(old_io_member)
    }

    pub(crate) fn io_member(&self, slot: usize) -> usize {
        self.members.get(slot).map_or(slot, |m| m.io_member)
    }

    pub(crate) fn set_io_member(&mut self, slot: usize, io_member: usize) -> Result<(), String> {
        let m = self.members.get_mut(slot).ok_or_else(|| format!("slot {slot} does not exist"))?;
        m.io_member = io_member;
        self.ppl_member_changed(slot);
        Ok(())
    }

    /// raid1/10 copy of one piece: the member's own copy when readable there and none of it
    /// is listed bad (where its writes failed it holds older data), else another copy
    /// (`tried`: members whose read failed). Returns the extent to read.
    pub(crate) fn replace_source(
        &mut self,
        slot: usize,
        copies: &[crate::geometry::Extent],
        n: u64,
        tried: u128,
    ) -> Option<crate::geometry::Extent> {
        let own = copies.iter().find(|c| {
            c.member == slot
                && tried & crate::direct::bit(slot) == 0
                && self.members[slot].readable_range(c.member_sector, n)
        });
        if let Some(c) = own {
            return Some(*c);
        }
        let exclude = tried | crate::direct::bit(slot);
        let i = crate::mirror::choose_copy(
            crate::mirror::Balance::Prefer,
            &self.members,
            copies,
            n,
            exclude,
            &mut self.rr_next,
            self.now_ns,
        )?;
        Some(copies[i])
    }
}
