//! The sync thread (md's md_do_sync): queued jobs start, run unit by unit within their
//! window, pace themselves and end; see `super` for the jobs' state.

use std::collections::{BTreeSet, VecDeque};

use crate::api::*;
use crate::config::MemberState;
use crate::engine::Mddev;
use crate::ledger::Ledger;

use super::*;

/// The page `sync_budget_bytes` counts per stripe cache head (a head's largest height).
const SYNC_BUDGET_PAGE_BYTES: u64 = 64 << 10;

impl Mddev {
    pub(crate) fn add_member(
        &mut self,
        led: &mut Ledger,
        slot: usize,
        data_offset_bytes: u64,
        now_ns: TimeNs,
    ) -> Result<(), String> {
        self.readd_member(led, slot, data_offset_bytes, None, now_ns)
    }

    pub(crate) fn readd_member(
        &mut self,
        led: &mut Ledger,
        slot: usize,
        data_offset_bytes: u64,
        ranges: Option<Vec<(u64, u64)>>,
        now_ns: TimeNs,
    ) -> Result<(), String> {
        self.now_ns = self.now_ns.max(now_ns);
        let m = self.members.get(slot).ok_or_else(|| format!("slot {slot} does not exist"))?;
        if self.failed {
            return Err("the array has failed; a new member cannot be rebuilt".into());
        }
        if !matches!(m.state, MemberState::Faulty | MemberState::Missing) {
            return Err(format!("slot {slot} is in use ({:?}); fail and remove it first", m.state));
        }
        if led.member_io_in_flight(slot) {
            return Err(format!("slot {slot} still has I/O in flight; try again"));
        }
        let ranges = match ranges {
            Some(r) if !self.pers.sync_in_array_sectors => merge_ranges(r),
            _ => vec![(0, u64::MAX)],
        };
        // A device back in the slot may hold an old log: the array empties the area before
        // the superblocks name the device the slot's (see `ArraySuperblocks::spare_activated`),
        // and nothing is logged there until then.
        self.ppl_member_changed(slot);
        self.ppl_wait_for_empty_area(slot);
        let member = &mut self.members[slot];
        member.data_offset_bytes = data_offset_bytes;
        member.set_state(MemberState::Recovering { recovery_offset_sectors: 0 });
        if ranges.is_empty() {
            // Nothing was written while it was away: it is in sync as it stands.
            member.set_state(MemberState::InSync);
            self.events.push_back(EngineEvent::RecoveryDone(slot));
            return Ok(());
        }
        self.queue_recovery_ranges(led, slot, ranges);
        Ok(())
    }

    fn queue_recovery_ranges(&mut self, led: &mut Ledger, slot: usize, ranges: Vec<(u64, u64)>) {
        if self
            .sync
            .as_ref()
            .is_some_and(|j| j.kind == SyncKind::Recovery { member: slot } || j.also.contains(&slot))
        {
            return;
        }
        self.events.push_back(EngineEvent::RecoveryStarted(slot));
        if !self.join_recovery(slot, &ranges) {
            self.sync_queue.push_back((SyncKind::Recovery { member: slot }, Some(ranges)));
        }
        self.wake_sync(led);
    }

    /// Does one recovery pass rebuild every member being recovered? raid6: md's
    /// handle_stripe solves two failed devices of a stripe from one read of the others.
    pub(crate) fn recovers_together(&self) -> bool {
        self.geo.level.parity_disks() >= 2 && !self.pers.sync_in_array_sectors
    }

    /// The members the running recovery writes: its own first, then those that joined it.
    pub(crate) fn recovery_targets(&self) -> Vec<usize> {
        let Some(job) = self.sync.as_ref() else { return Vec::new() };
        let SyncKind::Recovery { member } = job.kind else { return Vec::new() };
        std::iter::once(member)
            .chain(job.also.iter().copied())
            .filter(|&m| matches!(self.members[m].state, MemberState::Recovering { .. }))
            .collect()
    }

    /// `slot`'s recovery joins the running one (raid6): the pass goes on over `ranges`
    /// too, from where they start, as md restarts its recovery at the lowest
    /// recovery_offset of the devices it recovers. Units below where the running one had
    /// got rebuild its member again (the same data); its recovery_offset never goes back.
    fn join_recovery(&mut self, slot: usize, ranges: &[(u64, u64)]) -> bool {
        if !self.recovers_together() {
            return false;
        }
        let limit = self.member_data_sectors();
        let Some(job) = self.sync.as_mut().filter(|j| matches!(j.kind, SyncKind::Recovery { .. })) else {
            return false;
        };
        let unit = job.unit_sectors;
        let mut todo: SectorRanges = job.todo.drain(..).collect();
        todo.extend(ranges.iter().map(|&(a, b)| ((a.min(limit) / unit) * unit, b.min(limit))));
        let todo = merge_ranges(todo);
        let left: u64 = todo.iter().map(|&(a, b)| b - a).sum();
        job.total_sectors = job.done_sectors + job.active.len() as u64 * unit + left;
        job.todo = todo.into();
        job.also.push(slot);
        true
    }

    pub(crate) fn start_resync(&mut self, led: &mut Ledger, ranges: Option<Vec<(u64, u64)>>, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        if !self.pers.redundant {
            self.events.push_back(EngineEvent::ResyncDone);
            return;
        }
        // Ranges an earlier resync stopped short on are tried again.
        let held = std::mem::take(&mut self.resync_held);
        let ranges = ranges.map(|mut r| {
            r.extend(held);
            r
        });
        self.queue_resync(ranges, false);
        self.wake_sync(led);
    }

    pub(crate) fn resync_owed(&self) -> bool {
        self.sync.as_ref().is_some_and(|j| j.kind == SyncKind::Resync)
            || self.sync_queue.iter().any(|(k, _)| *k == SyncKind::Resync)
            || !self.resync_held.is_empty()
    }

    /// Does a resync still owe any of the job sectors [start, end) (member sectors; array
    /// sectors on raid10)? md's "at or past recovery_cp": mirrors read the first in-sync
    /// copy there, raid4/5/6 never read-modify-write.
    pub(crate) fn unsynced(&self, start: u64, end: u64) -> bool {
        let hit = |r: &[(u64, u64)]| r.iter().any(|&(a, b)| a < end && start < b);
        if let Some(j) = self.sync.as_ref().filter(|j| j.kind == SyncKind::Resync) {
            let active = j.active.range(..end).next_back().is_some_and(|&a| a + j.unit_sectors > start);
            if active || j.todo.iter().any(|&(a, b)| a < end && start < b) {
                return true;
            }
        }
        let queued =
            self.sync_queue.iter().any(|(k, r)| *k == SyncKind::Resync && r.as_ref().is_none_or(|r| hit(r)));
        queued || hit(&self.resync_held)
    }

    /// Queue a resync, merged with one already queued (so one `ResyncDone` covers both).
    fn queue_resync(&mut self, ranges: Option<SectorRanges>, front: bool) {
        if let Some((_, queued)) = self.sync_queue.iter_mut().find(|(k, _)| *k == SyncKind::Resync) {
            *queued = match (queued.take(), ranges) {
                (Some(mut a), Some(b)) => {
                    a.extend(b);
                    Some(merge_ranges(a))
                }
                _ => None,
            };
            return;
        }
        let entry = (SyncKind::Resync, ranges.map(merge_ranges));
        if front {
            self.sync_queue.push_front(entry);
        } else {
            self.sync_queue.push_back(entry);
        }
    }

    /// Can a queued job of this kind start now?
    pub(crate) fn sync_may_start(&self, kind: SyncKind) -> bool {
        kind != SyncKind::Resync || (self.pers.resync_may_run)(self)
    }

    /// What a job has not finished: its units in flight and the ranges still to start.
    fn remaining(job: &SyncJob) -> SectorRanges {
        let mut r: SectorRanges = job.active.iter().map(|&a| (a, a + job.unit_sectors)).collect();
        r.extend(job.todo.iter().copied());
        merge_ranges(r)
    }

    /// A job stopped short. A resync's remaining ranges stay owed: queued again (first)
    /// after a member failure, held otherwise (unreadable data would stop it again).
    pub(crate) fn sync_aborted(&mut self, job: SyncJob, member_failed: bool) {
        self.events.push_back(EngineEvent::SyncAborted(job.kind));
        if job.kind != SyncKind::Resync {
            return;
        }
        let rest = Self::remaining(&job);
        if rest.is_empty() {
            return;
        }
        if member_failed {
            self.queue_resync(Some(rest), true);
        } else {
            self.resync_held.extend(rest);
            self.resync_held = merge_ranges(std::mem::take(&mut self.resync_held));
        }
    }

    pub(crate) fn sync_status(&self) -> Option<SyncStatus> {
        let j = self.sync.as_ref()?;
        let recovery_offset_sectors = match j.kind {
            SyncKind::Recovery { member } => match self.members[member].state {
                MemberState::Recovering { recovery_offset_sectors } => recovery_offset_sectors,
                _ => 0,
            },
            SyncKind::Replace { slot } => {
                self.replacements[slot].as_ref().map_or(0, |r| r.recovery_offset_sectors)
            }
            SyncKind::Resync | SyncKind::Scrub(_) => 0,
        };
        let resync_offset_sectors = match j.kind {
            SyncKind::Resync => self.lowest_unsynced(j),
            SyncKind::Recovery { .. } | SyncKind::Replace { .. } | SyncKind::Scrub(_) => 0,
        };
        let also_recovering = j
            .also
            .iter()
            .filter_map(|&m| match self.members[m].state {
                MemberState::Recovering { recovery_offset_sectors } => Some((m, recovery_offset_sectors)),
                _ => None,
            })
            .collect();
        Some(SyncStatus {
            kind: j.kind,
            done_sectors: j.done_sectors,
            total_sectors: j.total_sectors,
            recovery_offset_sectors,
            resync_offset_sectors,
            also_recovering,
            share_pct: self.pacer.share_pct,
        })
    }

    pub(crate) fn pop_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// Member data sectors a sync covers on this geometry.
    fn member_data_sectors(&self) -> u64 {
        self.geo.member_sectors.iter().copied().max().unwrap_or(0)
    }

    fn begin_job(&mut self, kind: SyncKind, mut ranges: Option<Vec<(u64, u64)>>) -> Option<SyncJob> {
        // raid6: the other queued recoveries (two members resumed after a power cut, or
        // added together) run in the same pass.
        let mut also = Vec::new();
        if let SyncKind::Recovery { member } = kind {
            let recovering = |m: usize| matches!(self.members[m].state, MemberState::Recovering { .. });
            if self.recovers_together() && recovering(member) {
                while let Some(i) = self.sync_queue.iter().position(
                    |(k, _)| matches!(*k, SyncKind::Recovery { member: b } if b != member && recovering(b)),
                ) {
                    let (k, r) = self.sync_queue.remove(i).expect("queued job");
                    let SyncKind::Recovery { member: b } = k else { unreachable!("a recovery") };
                    also.push(b);
                    let mut all = ranges.take().unwrap_or_else(|| vec![(0, u64::MAX)]);
                    all.extend(r.unwrap_or_else(|| vec![(0, u64::MAX)]));
                    ranges = Some(merge_ranges(all));
                }
            }
        }
        let limit = if self.pers.sync_in_array_sectors {
            self.geo.array_sectors()
        } else {
            self.member_data_sectors()
        };
        let mut start_offset = 0;
        let ranges: Vec<(u64, u64)> = match (kind, ranges) {
            (SyncKind::Recovery { .. } | SyncKind::Replace { .. }, Some(r))
                if self.pers.sync_in_array_sectors =>
            {
                start_offset = r.first().map_or(0, |x| x.0);
                vec![(0, limit)]
            }
            (_, Some(r)) => r,
            (_, None) => vec![(0, limit)],
        };
        let unit = (self.pers.sync_unit_sectors)(self);
        let mut todo = VecDeque::new();
        let mut total = 0;
        for (a, b) in ranges {
            let a = (a.min(limit) / unit) * unit;
            let b = b.min(limit);
            if a < b {
                todo.push_back((a, b));
                total += b - a;
            }
        }
        if matches!(kind, SyncKind::Scrub(_)) && !self.scrub_may_run() {
            self.events.push_back(EngineEvent::SyncAborted(kind));
            return None;
        }
        self.last_sync_action = crate::scrub::action_name(kind);
        if kind == SyncKind::Resync {
            // md_do_sync: a resync counts what it finds inconsistent afresh (a check or
            // repair starts its count when asked for, `start_scrub`).
            self.mismatch_cnt_sectors = 0;
        }
        if let SyncKind::Recovery { member } = kind {
            if !matches!(self.members[member].state, MemberState::Recovering { .. }) {
                return None;
            }
            if let Some(&(a, _)) = todo.front() {
                if !self.pers.sync_in_array_sectors {
                    start_offset = a;
                }
            }
        }
        if let SyncKind::Replace { slot } = kind {
            // The replacement was dropped while its job waited in the queue.
            self.replacements[slot].as_ref()?;
        }
        Some(SyncJob {
            kind,
            todo,
            active: BTreeSet::new(),
            done_sectors: 0,
            total_sectors: total,
            next_allowed_ns: self.now_ns,
            unit_sectors: unit,
            window: (self.pers.sync_window_units)(self, unit),
            start_offset,
            also,
        })
    }

    /// raid4/5/6 sync units (of `unit_sectors`) worked on at once. 32 heads (2 MiB per
    /// member with 64 KiB heads) keep a fast member's queue full while the engine computes
    /// the units that arrived; that takes at most an eighth of the stripe cache, leaving
    /// the rest to requests, but never fewer than 8 heads (or one unit). The units' member
    /// buffers (a unit reads its rows of every member) stay within `sync_budget_bytes`
    /// whatever the member count, but one unit always runs.
    pub(crate) fn sync_window_units(&self, unit_sectors: u64) -> usize {
        let heads = self.sync_cache_share_heads().clamp(8, 32);
        let by_cache = (heads * self.cache_head_sectors() / unit_sectors).max(1);
        let unit_bytes = unit_sectors * SECTOR_BYTES * self.geo.raid_disks as u64;
        by_cache.min(self.sync_budget_bytes() / unit_bytes).max(1) as usize
    }

    /// Bytes of member buffers background sync (resync, recovery, check) may hold at
    /// once on raid4/5/6: `stripe_cache_size` pages of 64 KiB, 16 MiB at md's default
    /// 256, independent of the member count (md's own cache, stripe_cache_size 4 KiB
    /// pages of every member, holds as much at 16 members and grows with them). With
    /// more members the units get shorter and fewer, down to one head of one unit.
    pub(crate) fn sync_budget_bytes(&self) -> u64 {
        self.tun.stripe_cache_size as u64 * SYNC_BUDGET_PAGE_BYTES
    }

    /// Stripe heads background sync may hold at once: an eighth of the stripe cache, the
    /// rest left to requests.
    pub(crate) fn sync_cache_share_heads(&self) -> u64 {
        self.tun.stripe_cache_size as u64 / 8
    }

    /// A job was asked for outside a request or a completion: start its units and run the
    /// heads they claimed now. A claimed head waits for a handler pass, and with no unit
    /// left to pace nothing else brings the caller back (`uraid sim --seed 2000574`).
    pub(crate) fn wake_sync(&mut self, led: &mut Ledger) {
        self.pump_sync(led);
        self.run_stripes(led);
    }

    /// Start whatever background units pacing and windows allow.
    pub(crate) fn pump_sync(&mut self, led: &mut Ledger) {
        if self.failed {
            if let Some(j) = self.sync.take() {
                self.events.push_back(EngineEvent::SyncAborted(j.kind));
            }
            self.sync_queue.clear();
            return;
        }
        loop {
            if self.sync.is_none() {
                // A resync that may not run yet stays queued; a recovery queued after it goes first.
                let may_resync = (self.pers.resync_may_run)(self);
                let Some(i) = self.sync_queue.iter().position(|(k, _)| *k != SyncKind::Resync || may_resync)
                else {
                    self.pacer.idle();
                    return;
                };
                let (kind, ranges) = self.sync_queue.remove(i).expect("queued job");
                match self.begin_job(kind, ranges) {
                    Some(j) => self.sync = Some(j),
                    None => continue,
                }
            }
            let job = self.sync.as_mut().expect("job");
            if job.todo.is_empty() && job.active.is_empty() {
                let job = self.sync.take().expect("job");
                self.finish_job(job);
                continue;
            }
            if job.todo.is_empty() || job.active.len() >= job.window || self.now_ns < job.next_allowed_ns {
                return;
            }
            let (a, b) = *job.todo.front().expect("todo");
            let end = (a + job.unit_sectors).min(b);
            let unit_bytes = (end - a) * SECTOR_BYTES;
            let busy = !led.reqs.is_empty();
            let rate_kib = self.pacer.rate_kib(&self.tun, busy, self.now_ns);
            let outcome = (self.pers.sync_unit)(self, led, a, end);
            let job = self.sync.as_mut().expect("job");
            match outcome {
                UnitStart::Busy => return, // retried on completions
                UnitStart::Started => {
                    assert!(job.active.insert(a), "sync unit at {a} started while in flight");
                    assert!(job.active.len() <= job.window, "sync units in flight beyond the window");
                    self.pacer.sync_started(unit_bytes);
                    job.next_allowed_ns =
                        job.next_allowed_ns.max(self.now_ns) + unit_bytes * 1_000_000_000 / (rate_kib * 1024);
                }
                UnitStart::Nothing => job.done_sectors += end - a,
                UnitStart::Unreadable => {
                    let job = self.sync.take().expect("job");
                    self.sync_aborted(job, false);
                    continue;
                }
            }
            if end >= b {
                job.todo.pop_front();
            } else {
                job.todo.front_mut().expect("todo").0 = end;
            }
            self.update_recovery_offset();
        }
    }

    pub(crate) fn sync_next_deadline(&self) -> Option<TimeNs> {
        let j = self.sync.as_ref()?;
        (!j.todo.is_empty() && j.active.len() < j.window && j.next_allowed_ns > self.now_ns)
            .then_some(j.next_allowed_ns)
    }

    /// A unit starting at `start` finished (ok = its writes landed).
    pub(crate) fn sync_unit_done(&mut self, led: &mut Ledger, start: u64, ok: bool) {
        let Some(job) = self.sync.as_mut() else { return };
        if !job.active.contains(&start) {
            return;
        }
        if !ok {
            let job = self.sync.take().expect("job");
            self.sync_aborted(job, false);
            return;
        }
        job.active.remove(&start);
        job.done_sectors += job.unit_sectors;
        self.update_recovery_offset();
        self.pump_sync(led);
    }

    /// The lowest sector a job has not finished: its lowest unit in flight or still to do.
    fn lowest_unsynced(&self, job: &SyncJob) -> u64 {
        let lowest_active = job.active.iter().next().copied();
        let next_todo = job.todo.front().map(|t| t.0);
        match (lowest_active, next_todo) {
            (Some(a), Some(t)) => a.min(t),
            (Some(a), None) => a,
            (None, Some(t)) => t,
            (None, None) => self.member_data_sectors(),
        }
    }

    fn update_recovery_offset(&mut self) {
        let Some(job) = self.sync.as_ref() else { return };
        let offset =
            if self.pers.sync_in_array_sectors { job.start_offset } else { self.lowest_unsynced(job) };
        let members: Vec<usize> = match job.kind {
            SyncKind::Recovery { member } => {
                std::iter::once(member).chain(job.also.iter().copied()).collect()
            }
            SyncKind::Replace { slot } => return self.replacement_progress(slot, offset),
            _ => return,
        };
        for member in members {
            if let MemberState::Recovering { recovery_offset_sectors } = &mut self.members[member].state {
                *recovery_offset_sectors = (*recovery_offset_sectors).max(offset);
            }
        }
    }

    fn finish_job(&mut self, job: SyncJob) {
        match job.kind {
            SyncKind::Recovery { member } => {
                for m in std::iter::once(member).chain(job.also.iter().copied()) {
                    if matches!(self.members[m].state, MemberState::Recovering { .. }) {
                        self.members[m].set_state(MemberState::InSync);
                        self.events.push_back(EngineEvent::RecoveryDone(m));
                    }
                }
            }
            SyncKind::Replace { slot } => self.replacement_copied(slot),
            SyncKind::Resync => {
                if !self.resync_owed() {
                    self.events.push_back(EngineEvent::ResyncDone);
                }
            }
            SyncKind::Scrub(kind) => {
                self.events.push_back(EngineEvent::ScrubDone {
                    kind,
                    mismatch_cnt_sectors: self.mismatch_cnt_sectors,
                });
            }
        }
    }

    /// The member being rebuilt failed, or the array did: stop the job.
    pub(crate) fn sync_member_failed(&mut self, member: usize) {
        // A member that joined the pass leaves it; the others go on being rebuilt.
        if let Some(j) = self.sync.as_mut() {
            j.also.retain(|&m| m != member);
        }
        if self.sync.as_ref().is_some_and(|j| {
            j.kind == SyncKind::Recovery { member } || matches!(j.kind, SyncKind::Resync | SyncKind::Scrub(_))
        }) {
            let job = self.sync.take().expect("job");
            // The members that joined this pass start one of their own where they had got.
            for &m in job.also.iter().rev() {
                if let MemberState::Recovering { recovery_offset_sectors } = self.members[m].state {
                    let ranges = vec![(recovery_offset_sectors, u64::MAX)];
                    self.sync_queue.push_front((SyncKind::Recovery { member: m }, Some(ranges)));
                }
            }
            self.sync_aborted(job, true);
        }
        self.sync_queue.retain(|(k, _)| *k != SyncKind::Recovery { member });
    }
}

/// `ranges` sorted, with overlapping and touching ranges joined.
fn merge_ranges(mut ranges: SectorRanges) -> SectorRanges {
    ranges.retain(|&(a, b)| a < b);
    ranges.sort_unstable();
    let mut out: SectorRanges = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}
