//! The array engine: a state machine fed requests, member-I/O completions and time.
//!
//! Requests on raid0/1/10 become member I/Os directly (`direct.rs`); on raid4/5/6 they go
//! through stripe heads (`stripe/`) unless a chunk-aligned read may bypass the cache.
//! Every event ends by re-analysing what it touched, as md's `handle_stripe` does.
//!
//! Rooms: this file holds the engine's state and its entry points; `route` issues member
//! I/O and routes completions through the ledger of requests and member I/Os in flight
//! (`crate::ledger`); `members` changes each slot's state (`crate::rdev`: failure, bad-block
//! log, write-mostly, whether the data survives). State types sit in leaf files that import
//! no room, so no file imports in a circle (see `crate::layering`).

use std::collections::{BTreeSet, VecDeque};

use crate::detmap::DetMap;

use crate::api::*;
use crate::config::{ArrayConfig, ConfigError, MemberState, Tunables};
use crate::geometry::Geometry;
use crate::ledger::{FlushWait, HeldCompletion, InflightIo, IoCtx, ReqState};
use crate::rdev::{MemberRt, Replacement};
use crate::stats::ArrayStats;
use crate::stripe::{Ppl, StripeCache};
use crate::sync::{DirectUnit, EngineEvent, SectorRanges, SyncJob, SyncKind, UnitStart};

mod members;
mod route;

pub struct Engine {
    pub(crate) geo: Geometry,
    /// What this level does differently (see `personality`).
    pub(crate) pers: &'static Personality,
    pub(crate) members: Vec<MemberRt>,
    pub(crate) tun: Tunables,
    read_only: bool,
    pub(crate) failed: bool,
    pub(crate) now_ns: TimeNs,
    pub(crate) reqs: DetMap<RequestId, ReqState>,
    pub(crate) ios: crate::inflight::InflightIos<InflightIo>,
    /// The member range of the write whose completion is being handled (see
    /// `record_write_error`).
    completing_write: Option<(u64, u64)>,
    out_ios: VecDeque<MemberIo>,
    out_done: VecDeque<RequestCompletion>,
    pub(crate) cache: StripeCache,
    next_write_seq: u64,
    inflight_writes: BTreeSet<u64>,
    flushes: Vec<FlushWait>,
    pub(crate) stats: ArrayStats,
    pub(crate) rr_next: usize,
    pub(crate) sync: Option<SyncJob>,
    pub(crate) sync_queue: VecDeque<(SyncKind, Option<SectorRanges>)>,
    /// Resync ranges a job stopped short on (unreadable data): still owed, retried by the
    /// next `start_resync`.
    pub(crate) resync_held: SectorRanges,
    pub(crate) events: VecDeque<EngineEvent>,
    pub(crate) direct_sync: Option<DirectUnit>,
    /// raid1/10 writes waiting for the sync unit they overlap: (request, sector, len, zero).
    pub(crate) blocked_writes: Vec<(RequestId, u64, u64, bool)>,
    /// raid1/10 writes in flight, in array sectors, so a sync unit never overlaps one.
    pub(crate) direct_write_ranges: DetMap<RequestId, (u64, u64)>,
    /// Test-only sabotage: read-modify-write leaves P and Q untouched (see `plant_bug`).
    pub(crate) planted_skip_rmw_parity: bool,
    /// A member failed and the caller has not yet committed that to the metadata.
    metadata_pending: bool,
    /// md's mismatch_cnt (sectors): kept after a check/repair, reset when one starts.
    pub(crate) mismatch_cnt_sectors: u64,
    /// md's last_sync_action: the name of the last job started ("none" before any).
    pub(crate) last_sync_action: &'static str,
    /// Per slot: the device being rebuilt to replace its member (see `replace`).
    pub(crate) replacements: Vec<Option<Replacement>>,
    /// Writes to a slot with a replacement whose twin write is still in flight, with the
    /// slot write's completion once it came (it is handled when both landed).
    twins: DetMap<MemberIoId, HeldCompletion>,
    /// Work queued at construction (a recovery resumed from its checkpoint) waits for the
    /// first call after the caller has set the engine up (member indices, bad-block logs,
    /// write-mostly): `next_deadline_ns` asks for a tick now until then.
    start_pending: bool,
    /// md's partial parity log (RAID5 with PPL; see `stripe::ppl`). Boxed and None
    /// otherwise, so arrays without it pay one pointer check per stripe write.
    pub(crate) ppl: Option<Box<Ppl>>,
}

/// md's `struct md_personality`: what a level does differently, one static table per level
/// (`crate::personality`), chosen when the engine is built.
pub(crate) struct Personality {
    /// md's name for it, as /proc/mdstat prints it.
    pub name: &'static str,
    /// md's make_request for a read of [sector, sector + len) array sectors.
    pub read: fn(&mut Engine, RequestId, u64, u64),
    /// md's make_request for a write (`zero`: write zeroes or discard, no payload).
    pub write: fn(&mut Engine, RequestId, u64, u64, bool),
    /// The end of one of the personality's member I/Os (md's `end_request` callbacks).
    pub io_done: fn(&mut Engine, IoCtx, usize, Result<Vec<u8>, MemberIoError>),
    /// md's sync_request: start one background unit [start, end) of the job's sectors.
    pub sync_unit: fn(&mut Engine, u64, u64) -> UnitStart,
    /// Sectors a background unit covers.
    pub sync_unit_sectors: fn(&Engine) -> u64,
    /// Background units worked on at once.
    pub sync_window_units: fn(&Engine, u64) -> usize,
    /// May a resync run with the members as they are?
    pub resync_may_run: fn(&Engine) -> bool,
    /// Background jobs walk array sectors rather than member sectors (raid10, whose copies
    /// of one member's data are spread over the array's address space).
    pub sync_in_array_sectors: bool,
    /// The level keeps redundancy: there is something to resync and bad blocks to list.
    pub redundant: bool,
}

impl Engine {
    pub fn new(config: ArrayConfig) -> Result<Self, ConfigError> {
        let geo = config.geometry;
        if config.members.len() != geo.raid_disks {
            return Err(ConfigError::Members(format!(
                "{} members given for {} raid devices",
                config.members.len(),
                geo.raid_disks
            )));
        }
        config.tunables.check().map_err(ConfigError::Tunable)?;
        let members: Vec<MemberRt> = config
            .members
            .iter()
            .enumerate()
            .map(|(slot, m)| MemberRt {
                io_member: slot,
                state: m.state,
                data_offset_bytes: m.data_offset_bytes,
                inflight: 0,
                last_end_sector: 0,
                last_dispatch_ns: 0,
                last_delay_ns: 0,
                write_mostly: false,
                bad_blocks: None,
                write_error_seen: false,
            })
            .collect();
        let mut engine = Engine {
            cache: StripeCache::new(&geo),
            pers: Personality::of(geo.level),
            geo,
            members,
            tun: config.tunables,
            read_only: config.read_only,
            failed: false,
            now_ns: 0,
            reqs: DetMap::default(),
            ios: Default::default(),
            completing_write: None,
            out_ios: VecDeque::new(),
            out_done: VecDeque::new(),
            next_write_seq: 0,
            inflight_writes: BTreeSet::new(),
            flushes: Vec::new(),
            stats: ArrayStats::new(config.members.len()),
            rr_next: 0,
            sync: None,
            sync_queue: VecDeque::new(),
            resync_held: Vec::new(),
            events: VecDeque::new(),
            direct_sync: None,
            blocked_writes: Vec::new(),
            direct_write_ranges: DetMap::default(),
            planted_skip_rmw_parity: false,
            metadata_pending: false,
            mismatch_cnt_sectors: 0,
            last_sync_action: "none",
            replacements: vec![None; config.members.len()],
            twins: DetMap::default(),
            start_pending: false,
            ppl: None,
        };
        if !engine.data_survives() {
            let missing = engine.members.iter().filter(|m| !m.writable()).count();
            return Err(ConfigError::TooDegraded { missing, survivable: engine.geo.redundancy() });
        }
        for slot in 0..engine.members.len() {
            if let MemberState::Recovering { recovery_offset_sectors } = engine.members[slot].state {
                engine.sync_queue.push_back((
                    SyncKind::Recovery { member: slot },
                    Some(vec![(recovery_offset_sectors, u64::MAX)]),
                ));
                engine.events.push_back(EngineEvent::RecoveryStarted(slot));
                engine.start_pending = true;
            }
        }
        Ok(engine)
    }

    /// Sabotage for testing the testers: with `on`, read-modify-write skips the parity
    /// update, so the simulator's checker must catch the damage once a member is lost.
    #[doc(hidden)]
    pub fn plant_bug_skip_rmw_parity(&mut self, on: bool) {
        self.planted_skip_rmw_parity = on;
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub fn tunables(&self) -> &Tunables {
        &self.tun
    }

    /// md's sysfs write: tunable `name` (see [`crate::tunables::TUNABLES`]) set to `value`
    /// while I/O runs; refused (nothing changed) when out of range or not of this level.
    pub fn set_tunable(&mut self, name: &str, value: &str) -> Result<(), String> {
        let mut t = self.tun.clone();
        t.set_named(self.geo.level, name, value)?;
        self.set_tunables(t).map_err(|e| e.to_string())
    }

    /// Every tunable at once (tests, experiments); a smaller stripe cache evicts only idle
    /// stripe heads.
    pub fn set_tunables(&mut self, t: Tunables) -> Result<(), ConfigError> {
        t.check().map_err(ConfigError::Tunable)?;
        let shrink = t.stripe_cache_size < self.tun.stripe_cache_size;
        self.tun = t;
        if shrink {
            self.shrink_cache();
        }
        Ok(())
    }

    /// Bytes of array address space.
    pub fn size_bytes(&self) -> u64 {
        self.geo.array_bytes()
    }

    /// True once more members are lost than the level survives.
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    pub fn is_degraded(&self) -> bool {
        self.members.iter().any(|m| !matches!(m.state, MemberState::InSync))
    }

    /// Hand a request to the engine. Back-pressure returns it untouched.
    pub fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        self.now_ns = self.now_ns.max(now_ns);
        if self.reqs.len() >= self.tun.max_inflight_requests {
            return Err(SubmitError::Busy(req));
        }
        self.stats.requests += 1;
        if let Some(err) = self.check_request(&req) {
            self.out_done.push_back(RequestCompletion { id: req.id, result: Err(err) });
            return Ok(());
        }
        let id = req.id;
        let is_write = matches!(req.op, RequestOp::Write | RequestOp::Trim | RequestOp::WriteZeroes);
        let write_seq = if is_write {
            self.next_write_seq += 1;
            self.inflight_writes.insert(self.next_write_seq);
            Some(self.next_write_seq)
        } else {
            None
        };
        if req.op == RequestOp::Flush {
            self.flushes.push(FlushWait {
                req: id,
                seq: self.next_write_seq + 1,
                pending: None,
                error: None,
            });
            self.cache_force_all();
            self.progress_flushes();
            return Ok(());
        }
        let buf = req.data;
        self.reqs.insert(
            id,
            ReqState {
                op: req.op,
                fua: req.fua,
                buf,
                len_bytes: req.len_bytes,
                shared: None,
                parts: 1,
                error: None,
                write_seq,
                fua_flushes: None,
                gathered: Vec::new(),
            },
        );
        if req.len_bytes > 0 {
            match req.op {
                RequestOp::Read => self.start_read(id, req.offset_bytes, req.len_bytes),
                op => self.start_write(id, op, req.offset_bytes, req.len_bytes),
            }
        }
        self.part_done(id, None);
        self.after_event();
        Ok(())
    }

    /// Every entry point ends here: background work may start, dirty stripes are handled.
    fn after_event(&mut self) {
        self.start_pending = false;
        self.pump_sync();
        self.run_stripes();
    }

    fn check_request(&self, req: &Request) -> Option<RequestError> {
        if self.failed {
            return Some(RequestError::ArrayFailed);
        }
        let writes = matches!(req.op, RequestOp::Write | RequestOp::Trim | RequestOp::WriteZeroes);
        if writes && self.read_only {
            return Some(RequestError::ReadOnly);
        }
        if req.op == RequestOp::Flush {
            return None;
        }
        if req.op == RequestOp::Write && req.data.len() as u64 != req.len_bytes {
            return Some(RequestError::Invalid);
        }
        let end = req.offset_bytes.checked_add(req.len_bytes);
        if end.is_none_or(|e| e > self.size_bytes()) {
            return Some(RequestError::OutOfRange);
        }
        if !req.offset_bytes.is_multiple_of(SECTOR_BYTES) || !req.len_bytes.is_multiple_of(SECTOR_BYTES) {
            // Sub-sector requests are widened by the caller (the NBD server does RMW at the edges).
            return Some(RequestError::Invalid);
        }
        if req.op == RequestOp::Read && req.len_bytes > (1 << 30) {
            return Some(RequestError::Invalid);
        }
        None
    }

    fn start_read(&mut self, id: RequestId, offset_bytes: u64, len_bytes: u64) {
        let sector = offset_bytes / SECTOR_BYTES;
        let len = len_bytes / SECTOR_BYTES;
        (self.pers.read)(self, id, sector, len);
    }

    fn start_write(&mut self, id: RequestId, op: RequestOp, offset_bytes: u64, len_bytes: u64) {
        let sector = offset_bytes / SECTOR_BYTES;
        let len = len_bytes / SECTOR_BYTES;
        let zero = op != RequestOp::Write;
        (self.pers.write)(self, id, sector, len, zero);
    }

    /// The caller has no more requests to submit right now (md's unplug): partial stripes
    /// waiting for more writes may be started.
    pub fn unplug(&mut self, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        self.cache_unplug();
        self.after_event();
    }

    /// Next member I/O the caller must perform.
    pub fn pop_member_io(&mut self) -> Option<MemberIo> {
        self.out_ios.pop_front()
    }

    /// Report a member I/O's result.
    pub fn complete_member_io(&mut self, completion: MemberIoCompletion, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        let Some((ctx, member, issued_ns, write_range)) = self.ios.remove(completion.id) else {
            return; // unknown or duplicate completion: nothing to do
        };
        let busy_ns = self.now_ns.saturating_sub(issued_ns);
        if let Some(m) = self.members.get_mut(member) {
            assert!(m.inflight > 0, "member {member}: a completion with no I/O in flight");
            m.inflight -= 1;
            m.last_delay_ns = busy_ns;
        }
        let ms = self.member_stats_mut(member);
        ms.busy_ns += busy_ns;
        if completion.result.is_err() {
            ms.errors += 1;
        }
        if let IoCtx::ReplaceTwin { primary } = ctx {
            // The replacement's copy of a slot write: a failure drops the replacement, never
            // the write; the slot write completes once both landed.
            if completion.result.is_err() {
                if let Some(slot) = self.replacement_slot(member) {
                    self.fail_replacement(slot, self.now_ns);
                }
            }
            if let Some(Some((ctx, member, result, write_range))) = self.twins.remove(&primary) {
                self.dispatch_completion(ctx, member, result, write_range);
            }
            self.after_event();
            return;
        }
        // Twins exist only while a replacement runs: no map lookup per completion otherwise.
        if let Some(held) = (!self.twins.is_empty()).then(|| self.twins.get_mut(&completion.id)).flatten() {
            *held = Some((ctx, member, completion.result, write_range));
            return;
        }
        self.dispatch_completion(ctx, member, completion.result, write_range);
        self.after_event();
    }

    /// `write_range`: a write's member sectors, which clear bad-block entries once written.
    fn dispatch_completion(
        &mut self,
        ctx: IoCtx,
        member: usize,
        result: Result<Vec<u8>, MemberIoError>,
        write_range: Option<(u64, u64)>,
    ) {
        if let (Some((sector, len)), Ok(_)) = (write_range, &result) {
            if member < self.members.len() {
                self.made_good(member, sector, len);
            }
        }
        self.completing_write = write_range;
        match ctx {
            IoCtx::MemberFlush { flush } => self.member_flush_done(flush, member, result.is_ok()),
            IoCtx::FuaFlush { req } => self.fua_flush_done(req, member, result.is_ok()),
            ctx => self.io_done(ctx, member, result),
        }
        self.completing_write = None;
    }

    /// The accounting of engine member `member` (a slot, or a replacement: see `replace`).
    fn member_stats_mut(&mut self, member: usize) -> &mut crate::stats::MemberStats {
        if member >= self.stats.members.len() {
            self.stats.members.resize(member + 1, Default::default());
        }
        &mut self.stats.members[member]
    }

    /// Next finished request.
    pub fn pop_completion(&mut self) -> Option<RequestCompletion> {
        if self.metadata_pending {
            return None;
        }
        self.out_done.pop_front()
    }

    /// The caller has made the member failures it was told of (`EngineEvent::MemberFaulty`)
    /// durable in the superblocks: held completions may go (see
    /// `Tunables::hold_completions_on_member_failure`).
    pub fn metadata_committed(&mut self) {
        self.metadata_pending = false;
    }

    /// Are completions held until `metadata_committed`?
    pub fn metadata_pending(&self) -> bool {
        self.metadata_pending
    }

    /// When `tick` must next be called even if nothing else happens.
    pub fn next_deadline_ns(&self) -> Option<TimeNs> {
        if self.start_pending {
            return Some(self.now_ns);
        }
        match (self.cache_next_deadline(), self.sync_next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Let time-driven work (batching deadlines) run.
    pub fn tick(&mut self, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        self.cache_tick();
        self.after_event();
    }

    pub fn member_states(&self) -> Vec<MemberState> {
        self.members.iter().map(|m| m.state).collect()
    }

    pub fn stats(&self) -> &ArrayStats {
        &self.stats
    }

    /// Reset the accounting (e.g. between the phases of an experiment).
    pub fn reset_stats(&mut self) {
        self.stats = ArrayStats::new(self.members.len());
    }

    /// No request, member I/O or queued work outstanding (background sync aside).
    pub fn is_idle(&self) -> bool {
        self.reqs.is_empty()
            && self.ios.is_empty()
            && self.out_ios.is_empty()
            && self.flushes.is_empty()
            && self.ppl_idle()
    }

    /// Is a resync or recovery running, or queued and able to start? (A resync waiting for
    /// a degraded array's recovery is not; see `resync_owed`.)
    pub fn sync_active(&self) -> bool {
        self.sync.is_some() || self.sync_queue.iter().any(|(k, _)| self.sync_may_start(*k))
    }

    /// Requests accepted and not yet completed.
    pub fn inflight_requests(&self) -> usize {
        self.reqs.len()
    }
}

impl crate::api::ArrayEngine for Engine {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        Engine::submit(self, req, now_ns)
    }
    fn unplug(&mut self, now_ns: TimeNs) {
        Engine::unplug(self, now_ns)
    }
    fn pop_member_io(&mut self) -> Option<MemberIo> {
        Engine::pop_member_io(self)
    }
    fn complete_member_io(&mut self, completion: MemberIoCompletion, now_ns: TimeNs) {
        Engine::complete_member_io(self, completion, now_ns)
    }
    fn pop_completion(&mut self) -> Option<RequestCompletion> {
        Engine::pop_completion(self)
    }
    fn next_deadline_ns(&self) -> Option<TimeNs> {
        Engine::next_deadline_ns(self)
    }
    fn tick(&mut self, now_ns: TimeNs) {
        Engine::tick(self, now_ns)
    }
    fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        Engine::fail_member(self, member, now_ns)
    }
    fn is_idle(&self) -> bool {
        Engine::is_idle(self)
    }
    fn stats_snapshot(&self) -> crate::stats::ArrayStats {
        Engine::stats(self).clone()
    }
}
