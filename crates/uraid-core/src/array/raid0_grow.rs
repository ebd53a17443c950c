//! mdadm's raid0 grow by members (Grow.c: md's raid0 has no reshape of its own): the raid0
//! is taken over as a raid4 with its parity slot empty (md's takeover_raid0), grown by the
//! new members (the first in the empty parity slot, recovered by the reshape as it goes;
//! the new parity slot empty in turn), and taken back to raid0 (raid0_takeover_raid45).
//! Every step leaves superblocks md assembles. A restart between steps serves the raid4,
//! as md does once mdadm's grow process is gone: `uraid grow --level 0` ends it. See
//! docs/operations.md "Grow and reshape while serving".

use super::grow::ReshapeTarget;
use super::state::Array;
use crate::geometry::{algorithm, Level};
use crate::reshape::start::{start_grow_into_empty_parity_slot, GrowMember};

impl Array {
    /// The raid4 a raid0 of this geometry is taken over as.
    fn raid4_of_this_raid0(&self) -> ReshapeTarget {
        let geo = self.engine.geometry();
        ReshapeTarget {
            level: Level::Raid4,
            raid_disks: geo.raid_disks + 1,
            layout: algorithm::PARITY_N,
            chunk_sectors: geo.chunk_sectors,
        }
    }

    /// Why the raid0 cannot grow to `to_disks` members now: the takeover's rules, and the
    /// room the raid4's grow needs to move the data offset (asked with stand-ins for the
    /// new members, which may be `--add`ed after this check). Nothing is written.
    pub(super) fn may_start_raid0_grow(&self, to_disks: usize) -> Result<(), String> {
        let raid4 = self.raid4_of_this_raid0();
        let geo4 = self.may_take_over(&raid4)?;
        let (slot_sbs, _, _) = self.grow_superblocks()?;
        // As the takeover will write them (a raid0's `size` may be 0).
        let as_raid4: Vec<_> = slot_sbs
            .into_iter()
            .map(|mut sb| {
                (sb.level, sb.layout, sb.raid_disks) = (4, raid4.layout, raid4.raid_disks as u32);
                sb.size = geo4.member_sectors[0];
                sb
            })
            .collect();
        let new = vec![GrowMember::STANDIN; to_disks - (raid4.raid_disks - 1)];
        start_grow_into_empty_parity_slot(&as_raid4, &[], &new, self.now_seconds())
            .map(|_| ())
            .map_err(|e| e.trim_end_matches("; nothing was written").to_string())
    }

    /// Starts the first step (the takeover to raid4); `pump_raid0_grow` takes the others.
    pub(super) fn start_raid0_grow(&mut self, to_disks: usize) -> Result<(), String> {
        self.may_start_raid0_grow(to_disks)?;
        let need = to_disks - self.engine.geometry().raid_disks;
        let spares = self.sbs.members().iter().filter(|m| m.role.active_slot().is_none()).count();
        if spares < need {
            return Err(format!(
                "cannot grow the raid0: {need} new member(s) are needed and {spares} were given: give them with --add"
            ));
        }
        self.raid0_grow = Some(to_disks);
        let raid4 = self.raid4_of_this_raid0();
        self.start_takeover(&raid4).inspect_err(|_| self.raid0_grow = None)
    }

    /// The raid0 grow's next step once the one before ended: the raid4 grows, then goes
    /// back to raid0. Returns whether anything moved.
    pub(super) fn pump_raid0_grow(&mut self) -> bool {
        let Some(to) = self.raid0_grow else { return false };
        if self.takeover.is_some() || self.reshaping.is_some() || self.closing.is_some() {
            return false;
        }
        let geo = self.engine.geometry().clone();
        let step = match geo.level {
            Level::Raid0 => {
                self.raid0_grow = None;
                self.notice(format!("raid0 grow done: {} members", geo.raid_disks));
                return true;
            }
            Level::Raid4 if geo.raid_disks < to + 1 => self.start_online_grow(to + 1),
            Level::Raid4 => {
                let raid0 = ReshapeTarget {
                    level: Level::Raid0,
                    raid_disks: to,
                    layout: 0,
                    chunk_sectors: geo.chunk_sectors,
                };
                self.start_takeover(&raid0)
            }
            other => Err(format!("the array became raid{}", other.md_level())),
        };
        if let Err(e) = step {
            self.raid0_grow = None;
            self.notice(format!(
                "the raid0 grow stopped: {e}; the array serves on as raid{} of {} members: `uraid grow --level 0` \
                 takes it back to raid0 once no reshape runs",
                geo.level.md_level(),
                geo.raid_disks
            ));
        }
        true
    }
}
