//! Each slot's state in the engine: in sync, recovering, failed; md's bad-block log and
//! write-mostly flag; whether the data survives the members lost.

use crate::api::*;
use crate::config::MemberState;
use crate::geometry::Level;
use crate::meta::badblocks::BadBlocks;
use crate::sync::EngineEvent;

use super::Mddev;
use crate::ledger::Ledger;

impl Mddev {
    pub(crate) fn set_write_mostly(&mut self, member: usize, on: bool) -> Result<(), String> {
        if !matches!(self.geo.level, Level::Raid1 | Level::Raid10) {
            return Err("write-mostly applies to raid1 and raid10 members only".into());
        }
        let m = self.members.get_mut(member).ok_or_else(|| format!("member {member} does not exist"))?;
        m.write_mostly = on;
        Ok(())
    }

    pub(crate) fn fail_member(&mut self, led: &mut Ledger, member: usize, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        if let Some(slot) = self.replacement_slot(member) {
            // An I/O to a replacement failed: md_error on the replacement, not the slot.
            self.fail_replacement(led, slot, now_ns);
            return;
        }
        if member >= self.members.len() || matches!(self.members[member].state, MemberState::Faulty) {
            return;
        }
        if matches!(self.members[member].state, MemberState::Missing) {
            return;
        }
        // A member failing while it is replaced ends the replacement first (md would let
        // the replacement take the slot as a recovering member; here the slot is rebuilt
        // anew, `uraid add`).
        self.fail_replacement(led, member, now_ns);
        self.members[member].set_state(MemberState::Faulty);
        // md waits on no Faulty rdev: what its I/O in flight holds is released as `Gone`.
        led.release_member(member);
        self.metadata_pending |= self.tun.hold_completions_on_member_failure;
        self.events.push_back(EngineEvent::MemberFaulty(member));
        self.sync_member_failed(member);
        if !self.data_survives() {
            self.fail_array(led);
        } else {
            self.cache_rehandle_all(led);
        }
    }

    pub(crate) fn set_bad_blocks(&mut self, slot: usize, bad_blocks: Option<BadBlocks>) {
        if let Some(m) = self.members.get_mut(slot) {
            m.bad_blocks = bad_blocks.filter(|_| self.geo.level != Level::Raid0);
        }
    }

    pub(crate) fn bad_blocks(&self, slot: usize) -> Option<&BadBlocks> {
        self.members.get(slot)?.bad_blocks.as_ref()
    }

    /// md's rdev_set_badblocks for the write being completed on `member`: its range joins
    /// the member's log and completions wait until the caller wrote the log
    /// (`EngineEvent::BadBlocksRecorded`, then `metadata_committed`). False when the
    /// member has no log or it is full: the caller fails the member (md_error).
    pub(crate) fn record_write_error(&mut self, led: &mut Ledger, member: usize) -> bool {
        let Some((sector, len)) = led.completing_write else { return false };
        if !self.record_bad_block(member, sector, len) {
            return false;
        }
        self.members[member].write_error_seen = true;
        true
    }

    /// md's rdev_set_badblocks: data-relative `[sector, sector + len)` of `member` joins
    /// its log, and completions wait until the caller wrote the log. False when the member
    /// has no log, it is full, or the member takes no writes.
    pub(crate) fn record_bad_block(&mut self, member: usize, sector: u64, len: u64) -> bool {
        let m = &mut self.members[member];
        let abs = m.data_offset_bytes / SECTOR_BYTES + sector;
        if !m.writable() || !m.bad_blocks.as_mut().is_some_and(|bb| bb.set(abs, len)) {
            return false;
        }
        self.metadata_pending |= self.tun.hold_completions_on_member_failure;
        self.events.push_back(EngineEvent::BadBlocksRecorded { slot: member, sector: abs, sectors: len });
        true
    }

    /// md's R5_MadeGood / R1BIO_MadeGood: a write landed on listed sectors, so they are
    /// good again (written to the log with the next superblock update, as md does).
    pub(super) fn made_good(&mut self, member: usize, sector: u64, len: u64) {
        let m = &mut self.members[member];
        if !m.has_bad_block(sector, len) {
            return;
        }
        let abs = m.data_offset_bytes / SECTOR_BYTES + sector;
        if m.bad_blocks.as_mut().is_some_and(|bb| bb.clear(abs, len)) {
            self.events.push_back(EngineEvent::BadBlocksCleared { slot: member, sector: abs, sectors: len });
        }
    }

    /// Does every array sector keep at least one readable copy / enough members to rebuild it?
    /// A member being recovered counts as lost, as in md (raid5's calc_degraded, raid1's and
    /// raid10's `enough` count In_sync members only): above its recovery_offset it holds
    /// nothing yet, so a failure that leaves it to cover some blocks fails the array.
    pub(crate) fn data_survives(&self) -> bool {
        self.data_survives_losing(None)
    }

    /// Would the data survive if the member in `slot` were lost too? (mdadm refuses to
    /// fail a member when the array would fail.)
    pub(crate) fn data_survives_losing(&self, slot: Option<usize>) -> bool {
        let lost: Vec<bool> = self
            .members
            .iter()
            .enumerate()
            .map(|(s, m)| m.state != MemberState::InSync || Some(s) == slot)
            .collect();
        let lost_count = lost.iter().filter(|&&l| l).count();
        match self.geo.level {
            Level::Raid0 => lost_count == 0,
            Level::Raid1 => lost_count < self.members.len(),
            Level::Raid4 | Level::Raid5 | Level::Raid6 => lost_count <= self.geo.level.parity_disks(),
            Level::Raid10 => {
                // Copy sets repeat with a period of at most raid_disks chunks (times far copies).
                let mut copies = Vec::new();
                let period = self.geo.raid_disks as u64 * 4;
                let step = self.geo.chunk_sectors;
                (0..period).all(|k| {
                    let s = (k * step) % self.geo.array_sectors();
                    self.geo.copies(s, &mut copies);
                    copies.iter().any(|e| !lost[e.member])
                })
            }
        }
    }

    /// More members lost than the level survives: every pending and later request fails.
    pub(crate) fn fail_array(&mut self, led: &mut Ledger) {
        if self.failed {
            return;
        }
        self.failed = true;
        self.events.push_back(EngineEvent::ArrayFailed);
        let ids: Vec<RequestId> = led.reqs.keys().copied().collect();
        for id in ids {
            if let Some(r) = led.reqs.get_mut(&id) {
                r.error = Some(RequestError::ArrayFailed);
            }
        }
        self.cache_rehandle_all(led);
        for f in &mut led.flushes {
            f.error = Some(RequestError::ArrayFailed);
        }
        // Requests whose I/Os are still in flight complete as those I/Os return.
        let idle: Vec<RequestId> = led
            .reqs
            .iter()
            .filter(|(_, r)| r.parts == 0 && r.fua_flushes.is_none())
            .map(|(&id, _)| id)
            .collect();
        for id in idle {
            self.finish_request(led, id);
        }
        self.progress_flushes(led);
    }
}
