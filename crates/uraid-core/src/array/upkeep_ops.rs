//! What md.c does around the engine while an array runs: an engine event becomes a
//! superblock change (md_error, a recovery's end, a bad-block range), held completions go
//! once the change is durable, a hot spare takes a failed slot, and on md's clocks the
//! array is marked clean (safe mode), the bitmap daemon clears idle bits after a flush,
//! and a recovery's position is checkpointed after a flush. Closing writes the superblocks
//! clean after a last flush and bitmap pass.

use super::rounds::{RoundSeq, Running, Work};
use super::state::{AfterFlush, AfterRound, Array, Closing, SYNC_SAMPLE_NS, SYNC_SPEED_WINDOW_NS};
use super::superblocks::{DevRole, MemberKey, MetaError};
use super::upkeep::UpkeepDue;
use crate::api::*;
use crate::config::MemberState;
use crate::sync::{EngineEvent, SyncKind};

impl Array {
    /// Queues a superblock round; `after` runs once it is done.
    pub(super) fn write_superblocks_then(&mut self, after: Option<AfterRound>) -> RoundSeq {
        let seq = self.rounds.push(Work::Superblocks);
        if let Some(a) = after {
            self.after.entry(seq).or_default().push(a);
        }
        seq
    }

    /// A failure (or a bad-block range) to record before held completions may go.
    fn record_failure(&mut self) {
        self.records_pending += 1;
        self.write_superblocks_then(Some(AfterRound::FailureRecorded));
    }

    /// The engine's events, each turned into what md does. Returns whether there were any.
    pub(super) fn service_events(&mut self) -> bool {
        let mut any = false;
        while let Some(ev) = self.engine.pop_event() {
            any = true;
            self.on_event(ev);
        }
        if !self.spare_wanted.is_empty() {
            self.try_spares();
        }
        any
    }

    fn on_event(&mut self, ev: EngineEvent) {
        match ev {
            EngineEvent::MemberFaulty(slot) => {
                self.notice(format!("member in slot {slot} failed; the array runs degraded"));
                self.reshape_member_failed(slot);
                // Its metadata I/O in flight holds no round (the engine released its data I/O).
                self.rounds.member_gone(self.engine.io_member(slot) as MemberKey);
                if self.read_only {
                    return;
                }
                self.sbs.member_failed(slot);
                self.record_failure();
                if !self.spare_wanted.contains(&slot) {
                    self.spare_wanted.push(slot);
                }
            }
            EngineEvent::BadBlocksRecorded { slot, sector, sectors } => {
                self.notice(format!(
                    "write error on the member in slot {slot}: sectors {sector}+{sectors} recorded in \
                     its bad-block log; the member stays in the array"
                ));
                if !self.sbs.bad_blocks_recorded(slot, sector, sectors) {
                    // The log did not take it after all: md_error.
                    self.engine.fail_member(slot, self.now_ns);
                }
                self.record_failure();
            }
            EngineEvent::BehindWriteDone { group, ok } => self.behind_done(group, ok),
            EngineEvent::BadBlocksCleared { slot, sector, sectors } => {
                self.sbs.bad_blocks_cleared(slot, sector, sectors)
            }
            EngineEvent::RecoveryStarted(slot) => {
                self.notice(format!("recovery of slot {slot} started"));
            }
            EngineEvent::RecoveryDone(slot) => {
                self.notice(format!("recovery of slot {slot} done"));
                if !self.read_only {
                    self.flush_then(AfterFlush::RecoveryDone { slot });
                }
            }
            EngineEvent::ResyncDone => {
                self.notice("resync done".into());
                self.sbs.resync_done();
                // A degraded mirror resyncs its in-sync copies; the bits stay for the rebuild.
                if self.all_in_sync() {
                    self.sbs.bitmap_all_synced();
                    self.bitmap_activity = true;
                }
            }
            EngineEvent::SyncAborted(kind) => {
                self.notice(format!(
                    "{} stopped short (a source or its target failed, or it was stopped)",
                    crate::scrub::action_name(kind)
                ));
            }
            EngineEvent::ArrayFailed => {
                self.notice("the array has FAILED: more members lost than the level survives".into());
                self.sbs.array_failed();
                if !self.read_only {
                    self.write_superblocks_then(None);
                }
            }
            EngineEvent::ScrubDone { kind, mismatch_cnt_sectors } => {
                self.notice(format!("{} done, mismatch_cnt {mismatch_cnt_sectors}", kind.name()));
            }
            EngineEvent::ReplacementCopied(slot) => {
                if !self.read_only && !self.promoting.contains(&slot) {
                    self.promoting.push(slot);
                    self.flush_then(AfterFlush::ReplacementCopied { slot });
                }
            }
            EngineEvent::ReplacementFaulty(slot) => {
                self.notice(format!(
                    "the replacement of slot {slot} failed; it leaves the array, the member stays"
                ));
                self.promoting.retain(|&s| s != slot);
                if let Some(key) = self.replacement_key(slot) {
                    self.rounds.member_gone(key);
                    self.released.push(key);
                }
                self.sbs.replacement_failed(slot);
                if !self.read_only {
                    self.write_superblocks_then(None);
                }
            }
        }
    }

    pub(super) fn all_in_sync(&self) -> bool {
        self.engine.member_states().iter().all(|s| *s == MemberState::InSync)
    }

    fn replacement_key(&self, slot: usize) -> Option<MemberKey> {
        self.sbs.members().iter().find(|m| m.role == DevRole::Replacement { slot }).map(|m| m.key)
    }

    /// A hot spare takes each failed slot once the failed member's I/O has drained.
    fn try_spares(&mut self) {
        // md recovers only after a reshape ends (`reshape_done` asks again then).
        if self.reshaping.is_some() {
            return;
        }
        let wanted = std::mem::take(&mut self.spare_wanted);
        for slot in wanted {
            if self.engine.is_failed()
                || !matches!(self.engine.member_states()[slot], MemberState::Faulty | MemberState::Missing)
            {
                continue;
            }
            let Some(spare) = self.sbs.members().iter().find(|m| m.role == DevRole::Spare) else { continue };
            if self.engine.member_io_in_flight(slot) {
                self.spare_wanted.push(slot);
                continue;
            }
            let (key, data_offset_bytes) = (spare.key, spare.sb.data_offset * SECTOR_BYTES);
            if let Err(e) = self.rebuild_into(slot, key, data_offset_bytes, None) {
                let name = self.name_of(key);
                self.notice(format!("hot spare {name} could not take slot {slot}: {e}"));
                continue;
            }
            self.notice(format!("hot spare {} takes slot {slot}", self.name_of(key)));
        }
    }

    /// Member `key` (a spare, or one just added) takes `slot` and is rebuilt, in full or
    /// over `ranges` (a bitmap re-add).
    pub(super) fn rebuild_into(
        &mut self,
        slot: usize,
        key: MemberKey,
        data_offset_bytes: u64,
        ranges: Option<Vec<(u64, u64)>>,
    ) -> Result<(), String> {
        // The engine reaches the slot through the member before its recovery issues any I/O.
        let before = self.engine.io_member(slot);
        let log = self.sbs.bad_blocks(key).cloned();
        let old_log = self.engine.bad_blocks(slot).cloned();
        self.engine.set_io_member(slot, key as usize)?;
        self.engine.set_bad_blocks(slot, log);
        if let Err(e) = self.engine.readd_member(slot, data_offset_bytes, ranges, self.now_ns) {
            self.engine.set_io_member(slot, before)?;
            self.engine.set_bad_blocks(slot, old_log);
            return Err(e);
        }
        self.sbs.spare_activated(key, slot);
        self.write_superblocks_then(None);
        Ok(())
    }

    /// Starts queued rounds and handles finished ones. Returns whether anything moved.
    pub(super) fn pump_rounds(&mut self) -> bool {
        let mut progress = false;
        loop {
            if let Some(done) = self.rounds.take_finished() {
                self.round_finished(done);
                progress = true;
                continue;
            }
            if !self.rounds.ready_for_next() {
                break;
            }
            let Some((seq, work)) = self.rounds.pop_queued() else { break };
            progress = true;
            let now_s = self.now_seconds();
            match work {
                Work::Superblocks => {
                    let r = self.sbs.write_superblocks(now_s);
                    self.rounds.start(seq, Some(r), Vec::new());
                }
                Work::BitmapPages(pages) => {
                    let r = self.sbs.bitmap_pages_round(pages);
                    self.rounds.start(seq, Some(r), Vec::new());
                }
                Work::BitmapDaemon => {
                    self.daemon_queued = false;
                    self.bitmap_activity = false;
                    let r = self.sbs.bitmap_daemon();
                    self.rounds.start(seq, r, Vec::new());
                }
                Work::Raw(ios) => self.rounds.start(seq, None, ios),
            }
        }
        progress
    }

    fn round_finished(&mut self, done: Running) {
        let Running { seq, round, failed, .. } = done;
        let now = self.now_ns;
        for &(key, why) in &failed {
            let Some(m) = self.sbs.member(key) else { continue };
            let name = self.name_of(key);
            match m.role {
                DevRole::Replacement { slot } => {
                    self.notice(format!("{name}: {why} failed; the replacement of slot {slot} stops"));
                    self.released.push(key);
                    self.engine.fail_replacement(slot, now);
                }
                DevRole::Spare => {
                    self.notice(format!("{name}: {why} failed; the spare leaves the array"));
                    self.released.push(key);
                }
                DevRole::Active { slot, .. } => {
                    self.notice(format!("{name}: {why} failed; failing the member in slot {slot}"));
                    if round.is_none() {
                        self.engine.fail_member(slot, now);
                    }
                }
                DevRole::Faulty { .. } => {}
            }
        }
        if let Some(round) = round {
            let failed: Vec<MemberKey> = failed.iter().map(|&(k, _)| k).collect();
            let out = self.sbs.round_done(round, &failed, self.now_seconds());
            for slot in out.newly_failed_slots {
                self.engine.fail_member(slot, now);
            }
            for slot in out.ppl_emptied_slots {
                self.engine.ppl_area_emptied(slot);
            }
            match out.next {
                Ok(Some(next)) => {
                    // The failure is recorded by the next round, under the same number.
                    self.rounds.start(seq, Some(next), Vec::new());
                    return;
                }
                Ok(None) => {}
                Err(MetaError::NoWorkingMember) => {
                    self.notice(
                        "no member took the superblock write: nothing records the array any more".into(),
                    );
                    // A close in progress cannot end clean: no member holds the clean state.
                    if self.closing.is_some() {
                        self.closing = Some(Closing::Done(Err(RequestError::Io)));
                    }
                }
            }
        }
        self.rounds.mark_done(seq);
        let later = self.after.split_off(&(seq + 1));
        let due = std::mem::replace(&mut self.after, later);
        for after in due.into_values().flatten() {
            self.after_round(after);
        }
    }

    fn after_round(&mut self, after: AfterRound) {
        match after {
            AfterRound::Reshape => self.reshape_round_done(),
            AfterRound::Takeover => self.takeover_round_done(),
            AfterRound::FailureRecorded => {
                self.records_pending -= 1;
                if self.records_pending == 0 {
                    self.engine.metadata_committed();
                }
            }
            AfterRound::Promote { slot } => {
                self.promoting.retain(|&s| s != slot);
                let Some(r) = self.engine.replacements().into_iter().find(|r| r.slot == slot) else { return };
                match self.engine.promote_replacement(slot, r.io_member, self.now_ns) {
                    Ok(old) => {
                        let (new_name, old_name) =
                            (self.name_of(r.io_member as MemberKey), self.name_of(old as MemberKey));
                        self.notice(format!(
                            "{new_name} replaced {old_name} in slot {slot}; {old_name} is faulty and released"
                        ));
                        self.released.push(old as MemberKey);
                    }
                    Err(e) => self.notice(format!("promoting the replacement of slot {slot}: {e}")),
                }
            }
            AfterRound::Closed => {
                if !matches!(self.closing, Some(Closing::Done(_))) {
                    self.closing = Some(Closing::Done(Ok(())));
                }
            }
        }
    }

    /// A flush of the array's own was answered.
    pub(super) fn flush_done(&mut self, after: AfterFlush, ok: bool) {
        match after {
            AfterFlush::MarkClean { generation } => {
                self.clean_flush = false;
                let idle = generation == self.write_generation && !self.writes_outstanding();
                if ok && idle && self.closing.is_none() && self.sbs.mark_clean() {
                    self.write_superblocks_then(None);
                }
            }
            AfterFlush::RecoveryDone { slot } => {
                if !ok {
                    // Recorded as recovering from its last checkpoint until a flush succeeds.
                    self.recovery_unrecorded.push(slot);
                    return;
                }
                self.sbs.recovery_done(slot);
                if self.all_in_sync() && !self.engine.resync_owed() {
                    self.sbs.bitmap_all_synced();
                    self.bitmap_activity = true;
                }
                self.write_superblocks_then(None);
            }
            AfterFlush::Checkpoint { sync } => {
                self.checkpoint_out = false;
                if !ok {
                    return;
                }
                match sync.kind {
                    SyncKind::Recovery { member } => {
                        self.sbs.record_recovery_offset(member, sync.recovery_offset_sectors);
                        for &(m, offset) in &sync.also_recovering {
                            self.sbs.record_recovery_offset(m, offset);
                        }
                    }
                    SyncKind::Replace { slot } => {
                        self.sbs.record_replacement_offset(slot, sync.recovery_offset_sectors)
                    }
                    SyncKind::Resync | SyncKind::Scrub(_) => return,
                }
                self.write_superblocks_then(None);
            }
            AfterFlush::ReplacementCopied { slot } => {
                if !ok {
                    // Tried again at the next checkpoint; writes still reach both.
                    self.promoting.retain(|&s| s != slot);
                    return;
                }
                // md's order: the superblocks say the replacement holds the slot (the
                // member gone), and only then does the member stop getting writes.
                if self.sbs.replacement_done(slot).is_some() {
                    self.write_superblocks_then(Some(AfterRound::Promote { slot }));
                } else {
                    self.promoting.retain(|&s| s != slot);
                }
            }
            AfterFlush::Close { sync } => {
                if !ok {
                    self.closing = Some(Closing::Done(Err(RequestError::Io)));
                    return;
                }
                // What lies below each position is flushed: the next start resumes there.
                if let Some(s) = sync {
                    match s.kind {
                        SyncKind::Recovery { member } => {
                            self.sbs.record_recovery_offset(member, s.recovery_offset_sectors);
                            for &(m, offset) in &s.also_recovering {
                                self.sbs.record_recovery_offset(m, offset);
                            }
                        }
                        SyncKind::Replace { slot } => {
                            self.sbs.record_replacement_offset(slot, s.recovery_offset_sectors)
                        }
                        SyncKind::Resync if s.resync_offset_sectors > 0 => {
                            self.sbs.record_resync_checkpoint(s.resync_offset_sectors)
                        }
                        _ => {}
                    }
                }
                // md_bitmap_flush: passes with no wait, so every bit whose writes reached
                // all members is cleared and the next start begins clean.
                if self.sbs.bitmap().is_some() {
                    for _ in 0..3 {
                        self.rounds.push(Work::BitmapDaemon);
                    }
                }
                self.sbs.stop();
                self.write_superblocks_then(Some(AfterRound::Closed));
                self.closing = Some(Closing::Writing);
            }
        }
    }

    /// The driver's closing, once its final flush is answered (see `ArrayEngine::finish_close`).
    pub(super) fn close_step(&mut self, flush: Result<(), RequestError>) -> Option<Result<(), RequestError>> {
        if self.closing.is_none() && self.reshape_holds_close() {
            return None;
        }
        if self.closing.is_none() {
            if self.read_only || flush.is_err() {
                // A failed flush leaves the superblocks dirty: the next start resyncs.
                self.closing = Some(Closing::Done(flush));
            } else {
                let sync = self.engine.sync_status();
                self.flush_then(AfterFlush::Close { sync });
                self.closing = Some(Closing::Flushing);
            }
        }
        match &self.closing {
            Some(Closing::Done(r)) => Some(*r),
            _ => None,
        }
    }

    /// What of md's clocks has work to do, and when it is next due.
    pub(super) fn upkeep_deadline_ns(&self) -> Option<TimeNs> {
        if self.read_only || self.closing.is_some() {
            return None;
        }
        let armed = self.upkeep_armed();
        let upkeep = self.upkeep.next_due_ns(armed);
        let sample = self.engine.sync_active().then_some(self.last_sample_ns + SYNC_SAMPLE_NS);
        match (upkeep, sample) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn upkeep_armed(&self) -> UpkeepDue {
        let bitmap =
            self.sbs.bitmap().is_some_and(|b| b.any_set() && (self.bitmap_activity || b.may_clear()));
        let copied = self.engine.replacements().iter().any(|r| r.copied && !self.promoting.contains(&r.slot));
        let syncing = self
            .engine
            .sync_status()
            .is_some_and(|s| matches!(s.kind, SyncKind::Recovery { .. } | SyncKind::Replace { .. }));
        UpkeepDue {
            safe_mode_check: self.sbs.is_dirty() && !self.sbs.resync_pending() && !self.sbs.failed(),
            bitmap_daemon: bitmap && !self.daemon_queued,
            recovery_checkpoint: syncing || copied || !self.recovery_unrecorded.is_empty(),
        }
    }

    /// md's clocks at `now_ns`: safe mode, the bitmap daemon, recovery checkpoints.
    pub(super) fn upkeep_tick(&mut self) {
        if self.engine.sync_active() && self.now_ns >= self.last_sample_ns + SYNC_SAMPLE_NS {
            self.sample_sync();
        }
        if self.read_only || self.closing.is_some() {
            return;
        }
        let armed = self.upkeep_armed();
        let due = self.upkeep.due(self.now_ns);
        if due.safe_mode_check && armed.safe_mode_check {
            let idle = self.write_generation == self.seen_generation && !self.writes_outstanding();
            if idle && !self.clean_flush && self.records_pending == 0 {
                self.clean_flush = true;
                self.flush_then(AfterFlush::MarkClean { generation: self.write_generation });
            }
        }
        if due.safe_mode_check {
            self.seen_generation = self.write_generation;
        }
        if due.bitmap_daemon && armed.bitmap_daemon {
            self.daemon_queued = true;
            self.rounds.push(Work::BitmapDaemon);
        }
        if due.recovery_checkpoint && armed.recovery_checkpoint && !self.checkpoint_out {
            self.checkpoint();
        }
    }

    fn checkpoint(&mut self) {
        for slot in std::mem::take(&mut self.recovery_unrecorded) {
            if self.engine.member_states().get(slot) == Some(&MemberState::InSync) {
                self.flush_then(AfterFlush::RecoveryDone { slot });
            }
        }
        for r in self.engine.replacements() {
            if r.copied && !self.promoting.contains(&r.slot) {
                self.promoting.push(r.slot);
                self.flush_then(AfterFlush::ReplacementCopied { slot: r.slot });
            }
        }
        if let Some(sync) = self.engine.sync_status() {
            if matches!(sync.kind, SyncKind::Recovery { .. } | SyncKind::Replace { .. }) {
                self.checkpoint_out = true;
                self.flush_then(AfterFlush::Checkpoint { sync });
            }
        }
    }

    fn sample_sync(&mut self) {
        self.last_sample_ns = self.now_ns;
        let Some(s) = self.engine.sync_status() else {
            self.sync_samples.clear();
            return;
        };
        if self.sync_samples.back().is_some_and(|&(_, done)| done > s.done_sectors) {
            self.sync_samples.clear(); // another job began
        }
        self.sync_samples.push_back((self.now_ns, s.done_sectors));
        while self.sync_samples.front().is_some_and(|&(t, _)| self.now_ns - t > SYNC_SPEED_WINDOW_NS) {
            self.sync_samples.pop_front();
        }
    }

    /// The running sync's speed over the last few seconds, sectors per second.
    pub fn sync_speed_sectors(&self) -> Option<f64> {
        let &(t0, d0) = self.sync_samples.front()?;
        let &(t1, d1) = self.sync_samples.back()?;
        let dt = (t1 - t0) as f64 / 1e9;
        (dt > 0.2 && d1 >= d0).then(|| (d1 - d0) as f64 / dt)
    }
}
