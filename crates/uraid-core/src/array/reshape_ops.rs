//! A reshape while the array serves (md's reshape_request under make_request; see
//! docs/operations.md "Grow and reshape while serving"). Two engines run side by side: the array's own
//! in the next geometry at `new_data_offset`, and one in the previous geometry at
//! `data_offset`. A request goes to the engine whose layout holds its sectors, split at
//! the checkpoint when it spans it (md's `ahead_of_reshape`). One window of whole new
//! stripes at a time is moved: requests in it wait, those already in the previous engine
//! finish, the window is read through the previous engine (degraded reads included),
//! written through the next one as full stripes, flushed, and only then is its end
//! written to every superblock as `reshape_position`; requests that waited go on after
//! that round, so none lands in the next layout before a crash would keep it there.
//! Windows obey md's `reshape_safe` rule (`ReshapeRun::next_window`).

use super::admission::{overlaps, sector_span};
use super::reshaping::{
    Parts, Reshaping, ShapeChange, Step, PART_TAG, PREV_IO_TAG, RESHAPE_IO_MAX_BYTES, RESHAPE_TAG,
    WINDOW_MAX_SECTORS,
};
use super::state::{AfterRound, Array};
use super::superblocks::{DevRole, MemberKey};
use crate::api::*;
use crate::config::{ArrayConfig, MemberConfig, MemberState, Tunables};
use crate::engine::Engine;
use crate::geometry::Geometry;
use crate::meta::Superblock;
use crate::reshape::run::ReshapeRun;
use crate::reshape::start::{
    start_grow_into_empty_parity_slot, start_grow_with_spares, start_restripe, GrowMember, Restripe,
};
use crate::reshape::ReshapeGeometry;
use crate::sync::pacing::PERIOD_NS;

fn span_of(req: &Request) -> (u64, u64) {
    sector_span(req.offset_bytes, req.len_bytes)
}

/// An engine for one side of a reshape: `geo` at `offsets_sectors` (per slot), each slot's
/// state and device as given. No bad-block log: a write error fails the member, since a
/// log entry's sectors would mean different data on the two sides.
fn side_engine(
    geo: Geometry,
    offsets_sectors: &[u64],
    states: &[MemberState],
    io_members: &[Option<usize>],
    tunables: Tunables,
) -> Result<Engine, String> {
    let members = (0..geo.raid_disks)
        .map(|slot| MemberConfig {
            data_offset_bytes: offsets_sectors[slot] * SECTOR_BYTES,
            state: states[slot],
        })
        .collect();
    let config = ArrayConfig { geometry: geo, members, tunables, read_only: false };
    let mut engine =
        Engine::new(config).map_err(|e| format!("the engine refused the reshape's layout: {e}"))?;
    for (slot, io) in io_members.iter().enumerate().take(engine.geometry().raid_disks) {
        if let Some(io) = io {
            engine.set_io_member(slot, *io)?;
        }
    }
    Ok(engine)
}

/// The reshape of this array to run while it serves, or what keeps uraid from it.
/// `states`: each slot's member state as assembled.
fn may_run(
    geo: &ReshapeGeometry,
    any_bad_blocks: bool,
    states: &[MemberState],
) -> Result<ReshapeRun, String> {
    use crate::reshape::unsupported;
    if any_bad_blocks {
        return Err(unsupported("a reshape of members with bad-block log entries"));
    }
    // The two engines hold the same members in their slots: a grow by members, or a
    // restripe (chunk or layout) on the same members.
    let (p, n) = (&geo.previous, &geo.next);
    if p.level != n.level {
        return Err(unsupported("continuing a level change while serving"));
    }
    let grow = n.raid_disks > p.raid_disks && p.chunk_sectors == n.chunk_sectors && p.layout == n.layout;
    let restripe =
        n.raid_disks == p.raid_disks && (p.chunk_sectors != n.chunk_sectors || p.layout != n.layout);
    if !grow && !restripe {
        return Err(unsupported(
            "continuing a reshape that neither adds members nor only changes the chunk or layout while serving",
        ));
    }
    // A member the reshape recovers as it goes (raid5 to raid6's Q, a raid4 grow's member
    // in the old parity slot). Its recovery_offset may lag the checkpoint by the round a cut
    // ended early on it: the window was flushed before that round, so the rows are there;
    // md's raid5_run takes it at any offset and reshape_request raises it at the next one.
    for (slot, s) in states.iter().enumerate() {
        let MemberState::Recovering { .. } = *s else { continue };
        if !recovered_by_reshape(geo, slot) || geo.backwards {
            return Err(unsupported(&format!("a reshape while slot {slot} is being recovered")));
        }
    }
    ReshapeRun::new(geo.clone())
}

/// Slot `slot` holds nothing in the previous layout and is written by the reshape: the Q
/// of md's raid5-to-raid6 takeover (a `-6` layout going to one that is not), or the empty
/// parity slot of a raid4 (or parity-last raid5) that a grow makes a data slot (md's
/// raid5_start_reshape puts the first new member there: mdadm's raid0 grow).
fn recovered_by_reshape(geo: &ReshapeGeometry, slot: usize) -> bool {
    let (p, n) = (&geo.previous, &geo.next);
    let takeover = |layout: u32| layout >= crate::geometry::algorithm::LEFT_ASYMMETRIC_6;
    let q = n.raid_disks == p.raid_disks && takeover(p.layout) && !takeover(n.layout);
    let parity_slot = n.raid_disks > p.raid_disks && parity_last(p);
    (q || parity_slot) && slot + 1 == p.raid_disks
}

/// Parity on the last member: raid4, or raid5's parity-last layout.
pub(super) fn parity_last(geo: &Geometry) -> bool {
    use crate::geometry::{algorithm, Level};
    geo.level == Level::Raid4 || (geo.level == Level::Raid5 && geo.layout == algorithm::PARITY_N)
}

/// Each side's member states from the assembled ones: the Q a raid5-to-raid6 reshape
/// recovers is absent from the previous layout and, below the checkpoint where the next
/// engine is used, in sync in the next.
fn side_states(states: &[MemberState]) -> (Vec<MemberState>, Vec<MemberState>) {
    let side = |recovering| {
        states
            .iter()
            .map(|s| if matches!(s, MemberState::Recovering { .. }) { recovering } else { *s })
            .collect()
    };
    (side(MemberState::Missing), side(MemberState::InSync))
}

/// A window's size at a pace: what it moves in one of the pacer's periods (so a slow pace
/// is measured and changed as often as a fast one), whole stripes, at most
/// `WINDOW_MAX_SECTORS`.
fn window_sectors_at(rate_kib: u64) -> u64 {
    (rate_kib * 2 * PERIOD_NS / 1_000_000_000).min(WINDOW_MAX_SECTORS)
}

impl Array {
    /// The array's size while it serves: mid-reshape, the smaller of the two layouts' (md
    /// shows a grow's new size once it is done).
    pub fn size_bytes(&self) -> u64 {
        match &self.reshaping {
            Some(r) => r.run.geometry().array_sectors() * SECTOR_BYTES,
            None => self.engine.size_bytes(),
        }
    }

    pub fn is_reshaping(&self) -> bool {
        self.reshaping.is_some()
    }

    /// Sectors a second moved since this run of the reshape began (None before a second).
    pub fn reshape_speed_sectors(&self) -> Option<f64> {
        let r = self.reshaping.as_deref()?;
        let (t0, p0) = r.began?;
        let secs = self.now_ns.saturating_sub(t0) as f64 / 1e9;
        (secs >= 1.0).then(|| r.run.done_sectors().saturating_sub(p0) as f64 / secs)
    }

    /// A resync is owed: the engine's, or one a reshape holds until it is done (md
    /// resyncs after the reshape).
    pub fn resync_owed(&self) -> bool {
        self.engine.resync_owed() || self.reshaping.as_deref().is_some_and(|r| r.resync_after)
    }

    /// A reshape has windows left to move (not stopped).
    pub fn reshape_running(&self) -> bool {
        self.reshaping.as_deref().is_some_and(|r| r.step != Step::Stopped)
    }

    /// The reshape's geometries and data offsets, while one runs.
    pub fn reshape_geometry(&self) -> Option<&ReshapeGeometry> {
        self.reshaping.as_deref().map(|r| r.run.geometry())
    }

    /// The reshape's sectors moved and its whole extent, array sectors of the next layout,
    /// while one runs (forwards the first is the checkpoint).
    pub fn reshape_progress(&self) -> Option<(u64, u64)> {
        self.reshaping.as_ref().map(|r| (r.run.done_sectors(), r.run.total_sectors()))
    }

    // ---- routing ------------------------------------------------------------------------

    /// A request into the engine whose layout holds its sectors.
    pub(super) fn engine_submit(&mut self, req: Request) -> Result<(), SubmitError> {
        if let Some(t) = self.takeover.as_deref_mut() {
            t.waiting.push_back(req);
            return Ok(());
        }
        let Some(r) = self.reshaping.as_deref_mut() else {
            return self.engine.submit(req, self.now_ns);
        };
        let now = self.now_ns;
        let engine = &mut self.engine;
        if r.prev.is_none() {
            r.waiting.push_back(req);
            return Ok(());
        }
        if req.op == RequestOp::Flush {
            // The next engine flushes every member: the previous engine's completed writes too.
            return engine.submit(req, now);
        }
        let span = span_of(&req);
        if r.blocked().is_some_and(|b| overlaps(b, span)) {
            r.waiting.push_back(req);
            return Ok(());
        }
        let pos = r.run.position_sectors();
        // md's ahead_of_reshape: forwards the next layout holds what lies below the
        // checkpoint, backwards what lies at and above it.
        let backwards = r.run.geometry().backwards;
        let (next_only, prev_only) =
            if backwards { (span.0 >= pos, span.1 <= pos) } else { (span.1 <= pos, span.0 >= pos) };
        if next_only {
            return engine.submit(req, now);
        }
        if prev_only {
            let id = req.id;
            r.prev.as_deref_mut().expect("the previous engine").submit(req, now)?;
            r.prev_spans.insert(id, span);
            return Ok(());
        }
        let max = engine.tunables().max_inflight_requests;
        let prev_full = r.prev.as_deref().is_some_and(|p| p.inflight_requests() >= max);
        if engine.inflight_requests() >= max || prev_full {
            return Err(SubmitError::Busy(req));
        }
        // Across the checkpoint: a piece for each side.
        let cut = ((pos - span.0) * SECTOR_BYTES) as usize;
        let mut pieces = Vec::new();
        for (at, len) in [(0, cut), (cut, req.len_bytes as usize - cut)] {
            let mut p = Request {
                id: r.part_id(),
                op: req.op,
                offset_bytes: req.offset_bytes + at as u64,
                len_bytes: len as u64,
                fua: req.fua,
                data: Vec::new(),
            };
            if req.op == RequestOp::Write {
                p.data = req.data[at..at + len].to_vec();
            }
            r.piece_of.insert(p.id, (req.id, at));
            pieces.push(p);
        }
        let data = if req.op == RequestOp::Read { vec![0u8; req.len_bytes as usize] } else { Vec::new() };
        r.parts.insert(req.id, Parts { parent: req.id, left: 2, error: None, data });
        let above = pieces.pop().expect("two pieces");
        let below = pieces.pop().expect("two pieces");
        let (to_next, to_prev) = if backwards { (above, below) } else { (below, above) };
        if let Err(SubmitError::Busy(p)) = engine.submit(to_next, now) {
            r.waiting.push_back(p);
        }
        let (id, prev_span) = (to_prev.id, span_of(&to_prev));
        match r.prev.as_deref_mut().expect("the previous engine").submit(to_prev, now) {
            Ok(()) => {
                r.prev_spans.insert(id, prev_span);
            }
            Err(SubmitError::Busy(p)) => r.waiting.push_back(p),
        }
        Ok(())
    }

    /// The engines' next completion for the array: pieces gathered into their request,
    /// the reshape's own requests handled here.
    pub(super) fn pop_engine_completion(&mut self) -> Option<RequestCompletion> {
        loop {
            let c = match self.engine.pop_completion() {
                Some(c) if self.reshaping.is_none() => return Some(c),
                Some(c) => c,
                None => {
                    let r = self.reshaping.as_deref_mut()?;
                    let c = r.prev.as_deref_mut()?.pop_completion()?;
                    r.prev_spans.remove(&c.id);
                    c
                }
            };
            if c.id & RESHAPE_TAG != 0 {
                self.reshape_io_done(c);
                continue;
            }
            if c.id & PART_TAG != 0 {
                if let Some(done) = self.piece_done(c) {
                    return Some(done);
                }
                continue;
            }
            return Some(c);
        }
    }

    fn piece_done(&mut self, c: RequestCompletion) -> Option<RequestCompletion> {
        let r = self.reshaping.as_deref_mut()?;
        let (parent, at) = r.piece_of.remove(&c.id)?;
        let p = r.parts.get_mut(&parent)?;
        match c.result {
            Ok(data) if !data.is_empty() => p.data[at..at + data.len()].copy_from_slice(&data),
            Ok(_) => {}
            Err(e) => p.error = Some(e),
        }
        p.left -= 1;
        if p.left > 0 {
            return None;
        }
        let p = r.parts.remove(&parent)?;
        Some(RequestCompletion { id: p.parent, result: p.error.map_or(Ok(p.data), Err) })
    }

    /// The member I/O of the previous engine, tagged so its completion finds it.
    pub(super) fn pop_prev_member_io(&mut self) -> Option<MemberIo> {
        let mut io = self.reshaping.as_deref_mut()?.prev.as_deref_mut()?.pop_member_io()?;
        io.id |= PREV_IO_TAG;
        Some(io)
    }

    /// Is this member I/O completion the previous engine's (tagged by `pop_prev_member_io`)?
    pub(super) fn is_prev_member_io(id: MemberIoId) -> bool {
        id & PREV_IO_TAG != 0
    }

    /// A completion of the previous engine's member I/O; once the reshape is done its
    /// engine is gone and a late answer finds nothing.
    pub(super) fn complete_prev_member_io(&mut self, mut c: MemberIoCompletion, now_ns: TimeNs) {
        c.id &= !PREV_IO_TAG;
        if let Some(prev) = self.reshaping.as_deref_mut().and_then(|r| r.prev.as_deref_mut()) {
            prev.complete_member_io(c, now_ns);
        }
    }

    /// The previous engine's deadline (its member-I/O timeouts) and the next window's.
    pub(super) fn reshape_deadline_ns(&self) -> Option<TimeNs> {
        let r = self.reshaping.as_deref()?;
        let prev = r.prev.as_deref().and_then(|p| p.next_deadline_ns());
        let window = (r.step == Step::Ready && !r.stopping).then_some(r.not_before_ns);
        match (prev, window) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The previous engine's held small writes go at the array's unplug (md unplugs one
    /// queue for both layouts), not at its delay deadline.
    pub(super) fn reshape_unplug(&mut self, now_ns: TimeNs) {
        if let Some(prev) = self.reshaping.as_deref_mut().and_then(|r| r.prev.as_deref_mut()) {
            prev.unplug(now_ns);
        }
    }

    pub(super) fn reshape_tick(&mut self, now_ns: TimeNs) {
        if let Some(prev) = self.reshaping.as_deref_mut().and_then(|r| r.prev.as_deref_mut()) {
            if prev.next_deadline_ns().is_some_and(|d| d <= now_ns) {
                prev.tick(now_ns);
            }
        }
    }

    /// Nothing of the reshape is under way (its next window may still be due).
    pub(super) fn reshape_idle(&self) -> bool {
        self.reshaping.as_deref().is_none_or(|r| {
            !r.busy()
                && r.waiting.is_empty()
                && r.to_issue.is_empty()
                && r.out == 0
                && r.parts.is_empty()
                && r.prev.as_deref().is_none_or(|p| p.is_idle())
        })
    }

    /// A member failed in one engine: the other stops using it too (md has one rdev for
    /// both layouts). The next engine's failure is what the array records.
    pub(super) fn reshape_member_failed(&mut self, slot: usize) {
        let now = self.now_ns;
        if let Some(prev) = self.reshaping.as_deref_mut().and_then(|r| r.prev.as_deref_mut()) {
            if slot < prev.geometry().raid_disks && prev.member_states()[slot] != MemberState::Faulty {
                prev.fail_member(slot, now);
            }
        }
    }

    /// Failures the previous engine saw, passed to the array's engine; the previous
    /// engine's held completions go when the array's do.
    pub(super) fn service_prev_events(&mut self) -> bool {
        let Some(prev) = self.reshaping.as_deref_mut().and_then(|r| r.prev.as_deref_mut()) else {
            return false;
        };
        let mut failed = Vec::new();
        while let Some(ev) = prev.pop_event() {
            if let crate::sync::EngineEvent::MemberFaulty(slot) = ev {
                failed.push(slot);
            }
        }
        let mut any = !failed.is_empty();
        for slot in failed {
            if self.engine.member_states().get(slot).is_some_and(|s| *s != MemberState::Faulty) {
                self.engine.fail_member(slot, self.now_ns);
            }
        }
        if !self.engine.metadata_pending() {
            if let Some(prev) = self.reshaping.as_deref_mut().and_then(|r| r.prev.as_deref_mut()) {
                if prev.metadata_pending() {
                    // Its held completions may go now: the array must drain them.
                    prev.metadata_committed();
                    any = true;
                }
            }
        }
        any
    }

    // ---- starting -----------------------------------------------------------------------

    /// Why a grow of this running raid4/5/6 by members cannot start now.
    /// `count_spares`: whether the spares it takes must be there already.
    pub(super) fn may_start_online_grow(&self, to_disks: usize, count_spares: bool) -> Result<(), String> {
        // md grows a raid4 whose parity member is missing (mdadm's raid0 grow does).
        self.may_reshape_now(true)?;
        let geo = self.engine.geometry();
        let refuse = |why: &str| Err(format!("cannot start the reshape: {why}"));
        let spares = self.sbs.members().iter().filter(|m| m.role == DevRole::Spare).count();
        let need = to_disks.saturating_sub(geo.raid_disks);
        if count_spares && spares < need {
            return refuse(&format!(
                "{need} new member(s) are needed and the array has {spares} spare(s): give them with --add"
            ));
        }
        // What the members allow (room to move the data offset): asked of the start itself
        // with stand-ins for the new members, before any of them is written.
        let (slot_sbs, _, _) = self.grow_superblocks()?;
        self.start_grow_superblocks(&slot_sbs, &[], &vec![GrowMember::STANDIN; need])
            .map(|_| ())
            .map_err(|e| e.trim_end_matches("; nothing was written").to_string())
    }

    /// Why a chunk or layout change of this running raid4/5/6 cannot start now: the grow's
    /// rules, and what mdadm asks of the new chunk or layout and of the room to move the data.
    /// For raid5 to raid6 the new member may be `--add`ed after this check.
    pub(super) fn may_start_online_restripe(&self, change: Restripe) -> Result<(), String> {
        self.may_reshape_now(false)?;
        let (slot_sbs, _, _) = self.grow_superblocks()?;
        let mut states = self.engine.member_states();
        if matches!(change, Restripe::Raid6 { .. }) {
            states.push(MemberState::Recovering { recovery_offset_sectors: 0 });
        }
        start_restripe(&slot_sbs, &[], change, self.now_seconds(), self.bitmap_sectors())
            .and_then(|(_, _, geo)| may_run(&geo, false, &states).map(|_| ()))
            .map_err(|e| e.trim_end_matches("; nothing was written").to_string())
    }

    /// What keeps any reshape from starting now (md's checks before `start_reshape`).
    /// `parity_slot_empty_ok`: see [`ShapeChange::Reshape`].
    fn may_reshape_now(&self, parity_slot_empty_ok: bool) -> Result<(), String> {
        // The caller says that nothing was written.
        let refuse = |why: &str| Err(format!("cannot start the reshape: {why}"));
        if let Some(why) = self.shape_change_blocked(ShapeChange::Reshape { parity_slot_empty_ok }) {
            return refuse(why);
        }
        if self.engine.ppl_enabled() {
            return refuse("the array keeps a partial parity log: switch to resync first");
        }
        if self.sbs.members().iter().any(|m| self.sbs.bad_blocks(m.key).is_some_and(|b| !b.is_empty())) {
            return refuse("a member has bad-block log entries");
        }
        Ok(())
    }

    /// Parity on the last slot, which is empty, and every other member in sync: a raid0
    /// taken over (md's takeover_raid0), the state mdadm's raid0 grow passes through.
    pub(super) fn parity_slot_empty(&self) -> bool {
        let states = self.engine.member_states();
        let Some((last, rest)) = states.split_last() else { return false };
        let held = self.sbs.members().iter().any(|m| m.role.active_slot() == Some(states.len() - 1));
        parity_last(self.engine.geometry())
            && matches!(last, MemberState::Missing)
            && !held
            && rest.iter().all(|s| matches!(s, MemberState::InSync))
    }

    /// What keeps the array's shape from changing now by `change`.
    pub(super) fn shape_change_blocked(&self, change: ShapeChange) -> Option<&'static str> {
        // A raid4 degraded only by its empty parity slot may change: a grow (mdadm's raid0
        // grow), or the takeover to raid0 that needs it so, which also drops a resync it
        // owes (md's raid0_takeover_raid45 sets recovery_cp to MaxSector: no parity is
        // left to sync).
        let (parity_slot_empty_ok, resync_owed_ok) = match change {
            ShapeChange::Reshape { parity_slot_empty_ok } => (parity_slot_empty_ok, false),
            ShapeChange::Takeover { to_raid0 } => (to_raid0, to_raid0),
        };
        if self.read_only {
            return Some("the array is read-only");
        }
        if self.reshaping.is_some() || self.takeover.is_some() {
            return Some("a reshape or takeover is already running");
        }
        let degraded = self.engine.is_degraded() && !(parity_slot_empty_ok && self.parity_slot_empty());
        if degraded || self.engine.is_failed() {
            return Some("the array is degraded: rebuild it first (md refuses too)");
        }
        let owed = (self.engine.resync_owed() || self.sbs.resync_pending())
            && !(resync_owed_ok && parity_slot_empty_ok && self.parity_slot_empty());
        if self.engine.sync_active() || owed {
            return Some("a resync, recovery or check is running or owed: let it finish first");
        }
        if !self.engine.replacements().is_empty() {
            return Some("a replacement is running: let it finish first");
        }
        // The other takeovers keep the bitmap as md does: each keeps the member size and
        // the rows the bitmap counts in.
        if change == (ShapeChange::Takeover { to_raid0: true }) && self.sbs.bitmap().is_some() {
            return Some(
                "the array has a write-intent bitmap, which raid0 cannot keep: remove it first \
                 (mdadm --grow --bitmap=none)",
            );
        }
        None
    }

    /// The superblocks a grow starts from: the slots' in slot order (with their keys), and
    /// the spares' (keys with them), as of a clean array at this event count.
    #[allow(clippy::type_complexity)]
    pub(super) fn grow_superblocks(
        &self,
    ) -> Result<(Vec<Superblock>, Vec<MemberKey>, Vec<(MemberKey, Superblock)>), String> {
        let from = self.engine.geometry().raid_disks;
        let events = self.sbs.events();
        let as_clean = |sb: &Superblock| {
            let mut sb = sb.clone();
            sb.resync_offset = crate::meta::MAX_SECTOR;
            sb.events = events;
            sb
        };
        // An empty parity slot has no superblock to start from (a raid4 grow puts the first
        // new member there).
        let present = if self.parity_slot_empty() { from - 1 } else { from };
        let mut slot_keys = vec![None; present];
        for m in self.sbs.members() {
            if let DevRole::Active { slot, .. } = m.role {
                if let Some(k) = slot_keys.get_mut(slot) {
                    *k = Some(m.key);
                }
            }
        }
        let slot_keys: Vec<MemberKey> =
            slot_keys.into_iter().collect::<Option<_>>().ok_or("a slot has no member: rebuild it first")?;
        let slot_sbs = slot_keys.iter().map(|k| as_clean(&self.sbs.member(*k).expect("member").sb)).collect();
        let spares = self
            .sbs
            .members()
            .iter()
            .filter(|m| m.role == DevRole::Spare)
            .map(|m| (m.key, as_clean(&m.sb)))
            .collect();
        Ok((slot_sbs, slot_keys, spares))
    }

    /// The superblocks a grow by `new_members` starts with (see `reshape::start`).
    #[allow(clippy::type_complexity)]
    fn start_grow_superblocks(
        &self,
        slot_sbs: &[Superblock],
        spare_sbs: &[Superblock],
        new_members: &[GrowMember],
    ) -> Result<(Vec<Superblock>, Vec<Superblock>, ReshapeGeometry), String> {
        if self.parity_slot_empty() {
            start_grow_into_empty_parity_slot(slot_sbs, spare_sbs, new_members, self.now_seconds())
        } else {
            start_grow_with_spares(
                slot_sbs,
                spare_sbs,
                new_members,
                self.now_seconds(),
                self.bitmap_sectors(),
            )
        }
    }

    /// The internal bitmap's size on the members, which a moved data offset must stay
    /// clear of.
    fn bitmap_sectors(&self) -> Option<u64> {
        self.sbs.bitmap().map(|b| b.superblock().reserved_sectors())
    }

    /// md's raid5_start_reshape for a grow by members: spares take the new slots, every
    /// superblock records the reshape at position 0 with the data offset moved down
    /// (mdadm's way without a backup file); once that round is durable and the engine is
    /// idle, the engines are swapped and windows move.
    pub(super) fn start_online_grow(&mut self, to_disks: usize) -> Result<(), String> {
        self.may_start_online_grow(to_disks, true)?;
        let from = self.engine.geometry().raid_disks;
        let (slot_sbs, slot_keys, spares) = self.grow_superblocks()?;
        let (taking, staying) = spares.split_at(to_disks - from);
        let new_members: Vec<GrowMember> = taking
            .iter()
            .map(|(_, sb)| GrowMember {
                dev_sectors: sb.data_offset + sb.data_size,
                device_uuid: sb.device_uuid,
                dev_number: Some(sb.dev_number),
            })
            .collect();
        let staying_sbs: Vec<Superblock> = staying.iter().map(|(_, sb)| sb.clone()).collect();
        let (all, spare_sbs, geo) = self.start_grow_superblocks(&slot_sbs, &staying_sbs, &new_members)?;
        let run = ReshapeRun::new(geo)?;
        let mut updates: Vec<(MemberKey, Superblock, Option<usize>)> = Vec::new();
        for (slot, key) in slot_keys.iter().enumerate() {
            updates.push((*key, all[slot].clone(), None));
        }
        // The first new member takes the empty parity slot, if there is one.
        let first_new = slot_sbs.len();
        for (i, (key, _)) in taking.iter().enumerate() {
            updates.push((*key, all[first_new + i].clone(), Some(first_new + i)));
        }
        for ((key, _), sb) in staying.iter().zip(spare_sbs) {
            updates.push((*key, sb, None));
        }
        self.begin_reshape(updates, to_disks, run, format!("reshape to {to_disks} members started"));
        Ok(())
    }

    /// The start's round: every superblock records the reshape (`updates`: key, superblock,
    /// the slot a spare takes); the engines swap once it is durable (`Step::Starting`).
    fn begin_reshape(
        &mut self,
        updates: Vec<(MemberKey, Superblock, Option<usize>)>,
        raid_disks: usize,
        run: ReshapeRun,
        notice: String,
    ) {
        self.sbs.reshape_started(updates, raid_disks as u32);
        // The reshape's engines carry no bad-block logs (the start refuses logs with
        // entries): from here on a write error fails its member (md_error), also one in
        // flight now, whose range would otherwise be logged, then read as good and copied
        // into the new layout.
        for slot in 0..self.engine.geometry().raid_disks {
            self.engine.set_bad_blocks(slot, None);
        }
        self.reshaping = Some(Box::new(Reshaping::new(None, run, Step::Starting)));
        self.write_superblocks_then(Some(AfterRound::Reshape));
        self.notice(notice);
    }

    /// md's raid5_start_reshape for a chunk or layout change, or raid5 to raid6 (mdadm
    /// moved the data offset down): every superblock records the reshape, then windows as
    /// for a grow. For raid6 the first spare takes the new last slot (the Q of md's
    /// takeover), recovered by the reshape as it goes; `change`'s member is not used.
    pub(super) fn start_online_restripe(&mut self, change: Restripe) -> Result<(), String> {
        // start_restripe and may_run check the rest, on the superblocks they start from.
        self.may_reshape_now(false)?;
        let (slot_sbs, slot_keys, mut spares) = self.grow_superblocks()?;
        let mut states = self.engine.member_states();
        let (change, taking) = match change {
            Restripe::Raid6 { .. } => {
                if spares.is_empty() {
                    return Err(
                        "cannot start the reshape: raid5 to raid6 takes a new member: give it with --add"
                            .into(),
                    );
                }
                let (key, sb) = spares.remove(0);
                let member = GrowMember {
                    dev_sectors: sb.data_offset + sb.data_size,
                    device_uuid: sb.device_uuid,
                    dev_number: Some(sb.dev_number),
                };
                states.push(MemberState::Recovering { recovery_offset_sectors: 0 });
                (Restripe::Raid6 { member }, Some(key))
            }
            other => (other, None),
        };
        let spare_sbs: Vec<Superblock> = spares.iter().map(|(_, sb)| sb.clone()).collect();
        let (all, spare_sbs, geo) =
            start_restripe(&slot_sbs, &spare_sbs, change, self.now_seconds(), self.bitmap_sectors())?;
        let run = may_run(&geo, false, &states)?;
        let raid_disks = all.len();
        let mut updates: Vec<(MemberKey, Superblock, Option<usize>)> =
            slot_keys.iter().copied().zip(all.iter().cloned()).map(|(key, sb)| (key, sb, None)).collect();
        if let Some(key) = taking {
            updates.push((key, all[raid_disks - 1].clone(), Some(raid_disks - 1)));
        }
        updates.extend(spares.iter().map(|(key, _)| *key).zip(spare_sbs).map(|(key, sb)| (key, sb, None)));
        let notice = match change {
            Restripe::Chunk { chunk_sectors } => format!("reshape to a {}K chunk started", chunk_sectors / 2),
            Restripe::Layout { layout } => {
                format!("reshape to layout {} started", crate::geometry::layout_name(geo.next.level, layout))
            }
            Restripe::Raid6 { .. } => format!("reshape to raid6 of {raid_disks} members started"),
            Restripe::ChunkAndLayout { chunk_sectors, layout } => format!(
                "reshape to a {}K chunk and layout {} started",
                chunk_sectors / 2,
                crate::geometry::layout_name(geo.next.level, layout)
            ),
        };
        self.begin_reshape(updates, raid_disks, run, notice);
        Ok(())
    }

    /// The start's superblocks are durable and the engine idle: the engine becomes the
    /// previous layout's, a new one takes the next layout.
    fn swap_engines(&mut self) -> Result<(), String> {
        let r = self.reshaping.as_deref().expect("a reshape");
        let geo = r.run.geometry().clone();
        let n = geo.next.raid_disks;
        let old = self.engine.geometry().raid_disks;
        let old_states = self.engine.member_states();
        // In the next layout: the old slots as they are; a slot the start gave a member
        // that the old layout had not (new, or the reshape recovers it) is written by the
        // reshape below the checkpoint, where the next engine serves; any other missing.
        let mut states = vec![MemberState::Missing; n];
        let mut io: Vec<Option<usize>> = vec![None; n];
        for slot in 0..old {
            (states[slot], io[slot]) = (old_states[slot], Some(self.engine.io_member(slot)));
        }
        for m in self.sbs.members() {
            if let DevRole::Active { slot, .. } = m.role {
                if slot >= old || matches!(old_states[slot], MemberState::Missing) {
                    (states[slot], io[slot]) = (MemberState::InSync, Some(m.key as usize));
                }
            }
        }
        let mut next = side_engine(
            geo.next.clone(),
            &geo.new_data_offset_sectors,
            &states,
            &io,
            self.engine.tunables().clone(),
        )?;
        next.carry_stats_from(&self.engine);
        let prev = std::mem::replace(&mut self.engine, next);
        let r = self.reshaping.as_deref_mut().expect("a reshape");
        r.prev = Some(Box::new(prev));
        r.step = Step::Ready;
        r.not_before_ns = self.now_ns;
        Ok(())
    }

    /// An array assembled mid-reshape, served writable: the engine of the next layout
    /// (the array's) and the previous one's, and the windows go on from the checkpoint.
    /// `dirty`: resynced once the reshape is done.
    pub(super) fn resume_reshape(
        engine_config: &ArrayConfig,
        geo: &ReshapeGeometry,
        io_members: &[Option<usize>],
        any_bad_blocks: bool,
        dirty: bool,
    ) -> Result<(Engine, Box<Reshaping>), String> {
        let states: Vec<MemberState> = engine_config.members.iter().map(|m| m.state).collect();
        let run = may_run(geo, any_bad_blocks, &states)?;
        let t = engine_config.tunables.clone();
        let (prev_states, next_states) = side_states(&states);
        let next =
            side_engine(geo.next.clone(), &geo.new_data_offset_sectors, &next_states, io_members, t.clone())?;
        let prev = side_engine(geo.previous.clone(), &geo.data_offset_sectors, &prev_states, io_members, t)?;
        let mut r = Reshaping::new(Some(Box::new(prev)), run, Step::Ready);
        r.resync_after = dirty;
        Ok((next, Box::new(r)))
    }

    // ---- windows ------------------------------------------------------------------------

    /// Moves the reshape along: the reshape's own requests into the engines, requests
    /// that waited back in, and the window's next step. Returns whether anything moved.
    pub(super) fn pump_reshape(&mut self) -> bool {
        if self.reshaping.is_none() {
            return false;
        }
        let mut progress = self.issue_reshape_io();
        progress |= self.release_waiting();
        progress |= self.step_reshape();
        progress
    }

    fn issue_reshape_io(&mut self) -> bool {
        let now = self.now_ns;
        let Some(r) = self.reshaping.as_deref_mut() else { return false };
        let mut progress = false;
        while let Some(req) = r.to_issue.pop_front() {
            let to = match (req.op, r.prev.as_deref_mut()) {
                (RequestOp::Read, Some(prev)) => prev,
                _ => &mut self.engine,
            };
            if let Err(SubmitError::Busy(req)) = to.submit(req, now) {
                r.to_issue.push_front(req);
                break;
            }
            r.out += 1;
            progress = true;
        }
        progress
    }

    fn release_waiting(&mut self) -> bool {
        let Some(r) = self.reshaping.as_deref_mut() else { return false };
        if r.waiting.is_empty() || r.prev.is_none() {
            return false;
        }
        if let Some(b) = r.blocked() {
            if r.waiting.iter().all(|q| q.op != RequestOp::Flush && overlaps(span_of(q), b)) {
                return false;
            }
        }
        let waiting = std::mem::take(&mut r.waiting);
        let before = waiting.len();
        let mut rest = waiting.into_iter();
        while let Some(req) = rest.next() {
            if let Err(SubmitError::Busy(req)) = self.engine_submit(req) {
                let r = self.reshaping.as_deref_mut().expect("a reshape");
                r.waiting.push_back(req);
                r.waiting.extend(rest);
                break;
            }
        }
        self.reshaping.as_deref().is_some_and(|r| r.waiting.len() != before)
    }

    fn step_reshape(&mut self) -> bool {
        let now = self.now_ns;
        let closing = self.closing.is_some();
        let Some(r) = self.reshaping.as_deref_mut() else { return false };
        // A window's reads, writes or flush: the next step once all are back.
        if let Some(what) = r.step.window_io() {
            if r.out > 0 || !r.to_issue.is_empty() {
                return false;
            }
            if r.failed {
                self.stop_reshape(&format!("the window could not be {what}"));
                return true;
            }
        }
        match r.step.clone() {
            Step::Starting => {
                if r.start_recorded && self.engine.is_idle() {
                    if let Err(e) = self.swap_engines() {
                        // The superblocks say reshape: a restart continues it; stop here.
                        self.notice(format!("reshape could not start its engines: {e}"));
                        self.stop_reshape("its engines could not start");
                    }
                    return true;
                }
                false
            }
            Step::Ready => {
                if r.stopping || closing || r.failed || now < r.not_before_ns {
                    return false;
                }
                if r.run.is_done() {
                    r.step = Step::Finishing;
                    return true;
                }
                // md's md_do_sync paces a reshape as a resync: sync_speed_min while clients
                // do I/O, sync_speed_max when idle; or the adaptive policy between them.
                let busy = r.pacer.clients_since(r.window_started_ns);
                let rate_kib = r.pacer.rate_kib(self.engine.tunables(), busy, now).max(1);
                let Some(w) = r.run.next_window(window_sectors_at(rate_kib)) else {
                    self.stop_reshape("no room to write the next stripe");
                    return true;
                };
                r.window_started_ns = now;
                // The next window waits until this one's bytes took their time at the pace.
                let kib = (w.end_sectors - w.start_sectors) / 2;
                r.not_before_ns = now + kib * 1_000_000_000 / rate_kib;
                r.pacer.sync_started(kib * 1024);
                r.began.get_or_insert((now, r.run.done_sectors()));
                r.step = Step::Draining(w);
                true
            }
            Step::Draining(w) => {
                let span = (w.start_sectors, w.end_sectors);
                if r.prev_spans.values().any(|s| overlaps(*s, span)) {
                    return false;
                }
                let old_end = r.run.geometry().previous.array_sectors().min(w.end_sectors);
                r.data = vec![0u8; ((w.end_sectors - w.start_sectors) * SECTOR_BYTES) as usize];
                let mut at = w.start_sectors;
                while at < old_end {
                    let len = (old_end - at).min(RESHAPE_IO_MAX_BYTES / SECTOR_BYTES);
                    let off = at - w.start_sectors;
                    r.to_issue.push_back(Request::read(
                        RESHAPE_TAG | off,
                        at * SECTOR_BYTES,
                        len * SECTOR_BYTES,
                    ));
                    at += len;
                }
                r.step = Step::Reading(w);
                true
            }
            Step::Reading(w) => {
                let next = &r.run.geometry().next;
                let stripe = next.chunk_sectors * next.data_disks() as u64;
                let per = (RESHAPE_IO_MAX_BYTES / SECTOR_BYTES / stripe).max(1) * stripe;
                let data = std::mem::take(&mut r.data);
                let mut at = w.start_sectors;
                while at < w.end_sectors {
                    let len = (w.end_sectors - at).min(per);
                    let off = ((at - w.start_sectors) * SECTOR_BYTES) as usize;
                    let bytes = data[off..off + (len * SECTOR_BYTES) as usize].to_vec();
                    r.to_issue.push_back(Request::write(
                        RESHAPE_TAG | (at - w.start_sectors),
                        at * SECTOR_BYTES,
                        bytes,
                    ));
                    at += len;
                }
                r.step = Step::Writing(w);
                true
            }
            Step::Writing(w) => {
                r.to_issue.push_back(Request::flush(RESHAPE_TAG | (1 << 40)));
                r.step = Step::Flushing(w);
                true
            }
            Step::Flushing(w) => {
                r.step = Step::Checkpointing(w);
                let position = r.run.position_after(w);
                self.sbs.set_reshape_position(position);
                // md's reshape_request: a member not in sync is recovered as far as the
                // checkpoint (raid5 to raid6's Q; forwards only, see `may_run`).
                if !r.run.geometry().backwards {
                    let rows = position / r.run.geometry().next.data_disks() as u64;
                    for slot in 0..r.run.geometry().next.raid_disks {
                        self.sbs.record_recovery_offset(slot, rows);
                    }
                }
                self.write_superblocks_then(Some(AfterRound::Reshape));
                true
            }
            Step::Checkpointing(_) | Step::Completing | Step::Stopped => false,
            Step::Finishing => {
                let prev_idle = r.prev.as_deref().is_none_or(|p| p.is_idle());
                if !r.prev_spans.is_empty() || !prev_idle || !r.parts.is_empty() {
                    return false;
                }
                let run = r.run.clone();
                r.step = Step::Completing;
                self.sbs.reshape_finished(|sb| run.finished_superblock(sb, sb.events, sb.utime));
                for slot in 0..run.geometry().next.raid_disks {
                    self.sbs.recovery_done(slot);
                }
                self.write_superblocks_then(Some(AfterRound::Reshape));
                true
            }
        }
    }

    /// A superblock round the reshape asked for is done.
    pub(super) fn reshape_round_done(&mut self) {
        let Some(r) = self.reshaping.as_deref_mut() else { return };
        match r.step.clone() {
            Step::Starting => r.start_recorded = true,
            Step::Checkpointing(w) => {
                r.run.advance(w);
                r.step = if r.stopping { Step::Stopped } else { Step::Ready };
            }
            Step::Completing => self.reshape_done(),
            _ => {}
        }
    }

    fn reshape_done(&mut self) {
        let Some(r) = self.reshaping.take() else { return };
        let geo = r.run.geometry();
        self.notice(format!(
            "reshape done: {} members, array size {} KiB (NBD clients see it on their next connection)",
            geo.next.raid_disks,
            self.engine.size_bytes() / 1024
        ));
        if r.resync_after && self.parity_slot_empty() {
            // No parity member to make consistent: md's sync_request skips the resync of
            // an array degraded as far as it goes, and the array is clean.
            self.sbs.resync_done();
        } else if r.resync_after {
            self.engine.start_resync(None, self.now_ns);
        }
        let states = self.engine.member_states();
        // A raid0 grow's next step is the takeover back to raid0, which needs the parity
        // slot empty.
        let wanted = states.iter().enumerate().filter(|_| self.raid0_grow.is_none());
        for (slot, s) in wanted {
            if matches!(s, MemberState::Missing | MemberState::Faulty) && !self.spare_wanted.contains(&slot) {
                self.spare_wanted.push(slot);
            }
        }
    }

    /// The reshape's own request ended.
    fn reshape_io_done(&mut self, c: RequestCompletion) {
        let Some(r) = self.reshaping.as_deref_mut() else { return };
        r.out = r.out.saturating_sub(1);
        match c.result {
            Ok(data) => {
                if let Step::Reading(_) = r.step {
                    let at = ((c.id & !RESHAPE_TAG) * SECTOR_BYTES) as usize;
                    r.data[at..at + data.len()].copy_from_slice(&data);
                }
            }
            Err(_) => r.failed = true,
        }
    }

    /// No window moves any more (the array keeps serving; the superblocks hold the last
    /// checkpoint, from which a restart goes on).
    fn stop_reshape(&mut self, why: &str) {
        let Some(r) = self.reshaping.as_deref_mut() else { return };
        let at = r.run.position_sectors();
        r.step = Step::Stopped;
        r.to_issue.clear();
        self.notice(format!(
            "reshape stopped at sector {at}: {why}; the array serves on and a restart continues from there"
        ));
    }

    /// A close waits for the window under way to be checkpointed; no new one starts.
    pub(super) fn reshape_holds_close(&mut self) -> bool {
        let Some(r) = self.reshaping.as_deref_mut() else { return false };
        r.stopping = true;
        r.busy()
    }
}
