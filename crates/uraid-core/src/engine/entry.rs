//! The engine's entry points as md's request and completion paths see them: a request
//! admitted and started through the personality, a member I/O's completion routed back,
//! time passing; every one ends by letting background work start and stripes run.

use std::collections::VecDeque;

use crate::api::*;
use crate::config::{ArrayConfig, ConfigError, MemberState, SyncPolicy, Tunables};
use crate::geometry::Geometry;
use crate::ledger::{InflightIo, IoCtx, Ledger};
use crate::rdev::MemberRt;
use crate::stats::ArrayStats;
use crate::stripe::StripeCache;
use crate::sync::{EngineEvent, SyncKind};

use super::{Mddev, Personality};

impl Mddev {
    pub(crate) fn new(config: ArrayConfig) -> Result<Self, ConfigError> {
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
            .map(|(slot, m)| MemberRt::new(slot, m.state, m.data_offset_bytes))
            .collect();
        let mut engine = Mddev {
            cache: StripeCache::new(&geo),
            pers: Personality::of(geo.level),
            geo,
            members,
            tun: config.tunables,
            read_only: config.read_only,
            failed: false,
            now_ns: 0,
            stats: ArrayStats::new(config.members.len()),
            rr_next: 0,
            sync: None,
            sync_queue: VecDeque::new(),
            resync_held: Vec::new(),
            events: VecDeque::new(),
            direct_sync: None,
            blocked_writes: Vec::new(),
            read_fixes: Vec::new(),
            next_read_fix: 0,
            planted_skip_rmw_parity: false,
            metadata_pending: false,
            mismatch_cnt_sectors: 0,
            last_sync_action: "none",
            replacements: vec![None; config.members.len()],
            start_pending: false,
            ppl: None,
            pacer: Default::default(),
            reshape: None,
            behind: Default::default(),
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

    pub(crate) fn plant_bug_skip_rmw_parity(&mut self, on: bool) {
        self.planted_skip_rmw_parity = on;
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub(crate) fn tunables(&self) -> &Tunables {
        &self.tun
    }

    pub(crate) fn set_tunable(&mut self, led: &mut Ledger, name: &str, value: &str) -> Result<(), String> {
        let mut t = self.tun.clone();
        t.set_named(self.geo.level, name, value)?;
        self.set_tunables(led, t).map_err(|e| e.to_string())
    }

    pub(crate) fn set_tunables(&mut self, led: &mut Ledger, t: Tunables) -> Result<(), ConfigError> {
        t.check().map_err(ConfigError::Tunable)?;
        let shrink = t.stripe_cache_size < self.tun.stripe_cache_size;
        self.tun = t;
        if shrink {
            self.shrink_cache(led);
        }
        Ok(())
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        match &self.reshape {
            Some(r) => r.array_sectors() * SECTOR_BYTES,
            None => self.geo.array_bytes(),
        }
    }

    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.failed
    }

    pub(crate) fn is_degraded(&self) -> bool {
        self.members.iter().any(|m| !matches!(m.state, MemberState::InSync))
    }

    pub(crate) fn submit(
        &mut self,
        led: &mut Ledger,
        req: Request,
        now_ns: TimeNs,
    ) -> Result<(), SubmitError> {
        self.now_ns = self.now_ns.max(now_ns);
        if led.reqs.len() >= self.tun.max_inflight_requests {
            return Err(SubmitError::Busy(req));
        }
        self.stats.requests += 1;
        if let Some(err) = self.check_request(&req) {
            led.out_done.push_back(RequestCompletion { id: req.id, result: Err(err) });
            return Ok(());
        }
        let (id, op, offset_bytes, len_bytes) = (req.id, req.op, req.offset_bytes, req.len_bytes);
        led.admit(req);
        if self.sync.is_some() && self.tun.sync_policy == SyncPolicy::Adaptive && op != RequestOp::Flush {
            self.pacer.admitted(id, len_bytes, self.now_ns);
        }
        if op == RequestOp::Flush {
            // The writes before it may sit in delayed heads: forced, they must also be run,
            // or the flush waits on heads no later event may ever handle.
            self.cache_force_all();
            self.progress_flushes(led);
            self.after_event(led);
            return Ok(());
        }
        if len_bytes > 0 {
            match op {
                RequestOp::Read => self.start_read(led, id, offset_bytes, len_bytes),
                op => self.start_write(led, id, op, offset_bytes, len_bytes),
            }
        }
        self.part_done(led, id, None);
        self.after_event(led);
        Ok(())
    }

    /// Every entry point ends here: background work may start, dirty stripes are handled.
    /// The I/Os of a member that failed meanwhile are answered first (`release_gone`).
    pub(crate) fn after_event(&mut self, led: &mut Ledger) {
        self.start_pending = false;
        loop {
            self.release_gone(led);
            self.pump_sync(led);
            self.run_stripes(led);
            if led.gone.is_empty() {
                break;
            }
        }
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

    fn start_read(&mut self, led: &mut Ledger, id: RequestId, offset_bytes: u64, len_bytes: u64) {
        let sector = offset_bytes / SECTOR_BYTES;
        let len = len_bytes / SECTOR_BYTES;
        if self.reshape.is_some() {
            self.reshape_read(led, id, sector, len);
            return;
        }
        (self.pers.read)(self, led, id, sector, len);
    }

    fn start_write(
        &mut self,
        led: &mut Ledger,
        id: RequestId,
        op: RequestOp,
        offset_bytes: u64,
        len_bytes: u64,
    ) {
        let sector = offset_bytes / SECTOR_BYTES;
        let len = len_bytes / SECTOR_BYTES;
        let zero = op != RequestOp::Write;
        (self.pers.write)(self, led, id, sector, len, zero);
    }

    pub(crate) fn unplug(&mut self, led: &mut Ledger, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        self.cache_unplug(led);
        self.after_event(led);
    }

    pub(crate) fn complete_member_io(
        &mut self,
        led: &mut Ledger,
        completion: MemberIoCompletion,
        now_ns: TimeNs,
    ) {
        self.now_ns = self.now_ns.max(now_ns);
        let Some(io) = led.ios.remove(completion.id) else {
            // Unknown or duplicate, or the late answer of a member failed meanwhile (its
            // I/O was answered `Gone` then): nothing waits on it any more.
            led.late.remove(&completion.id);
            return;
        };
        if self.member_io_ended(led, completion, io) {
            self.after_event(led);
        }
    }

    /// Member I/O `io`, taken out of the ledger, ended with `completion`: its accounting,
    /// and what waits on it. False when it only waits for its twin (nothing moved).
    fn member_io_ended(&mut self, led: &mut Ledger, completion: MemberIoCompletion, io: InflightIo) -> bool {
        let (ctx, member, issued_ns, write_range) = io;
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
                    self.fail_replacement(led, slot, self.now_ns);
                }
            }
            if let Some(Some((ctx, member, result, write_range))) = led.twins.remove(&primary) {
                self.dispatch_completion(led, ctx, member, result, write_range);
            }
            return true;
        }
        // Twins exist only while a replacement runs: no map lookup per completion otherwise.
        if let Some(held) = (!led.twins.is_empty()).then(|| led.twins.get_mut(&completion.id)).flatten() {
            *held = Some((ctx, member, completion.result, write_range));
            return false;
        }
        self.dispatch_completion(led, ctx, member, completion.result, write_range);
        true
    }

    /// The I/Os of members declared failed while they were in flight (`Ledger::gone`) end
    /// now as `Gone`, as md's stripe handling and raid1/10 treat a Faulty device's
    /// outstanding blocks as failed: writes complete on the others, reads go elsewhere,
    /// flushes and metadata stop waiting. Their own completions, if the device answers
    /// later, find nothing in the ledger.
    fn release_gone(&mut self, led: &mut Ledger) {
        while let Some(id) = led.gone.pop_front() {
            let Some(io) = led.ios.remove(id) else { continue };
            led.late.insert(id, io.1);
            self.member_io_ended(led, MemberIoCompletion { id, result: Err(MemberIoError::Gone) }, io);
        }
    }

    /// `write_range`: a write's member sectors, which clear bad-block entries once written.
    fn dispatch_completion(
        &mut self,
        led: &mut Ledger,
        ctx: IoCtx,
        member: usize,
        result: MemberIoResult,
        write_range: Option<(u64, u64)>,
    ) {
        if let (Some((sector, len)), Ok(_)) = (write_range, &result) {
            if member < self.members.len() {
                self.made_good(member, sector, len);
            }
        }
        led.completing_write = write_range;
        match ctx {
            IoCtx::MemberFlush { flush } => self.member_flush_done(led, flush, member, result.is_ok()),
            IoCtx::FuaFlush { req } => self.fua_flush_done(led, req, member, result.is_ok()),
            IoCtx::ReshapeRead { req, len_sectors, dest_off } => {
                self.reshape_read_done(led, req, member, len_sectors, dest_off, result)
            }
            ctx => self.io_done(led, ctx, member, result),
        }
        led.completing_write = None;
    }

    /// The accounting of engine member `member` (a slot, or a replacement: see `replace`).
    pub(super) fn member_stats_mut(&mut self, member: usize) -> &mut crate::stats::MemberStats {
        if member >= self.stats.members.len() {
            self.stats.members.resize(member + 1, Default::default());
        }
        &mut self.stats.members[member]
    }

    pub(crate) fn pop_completion(&mut self, led: &mut Ledger) -> Option<RequestCompletion> {
        if self.metadata_pending {
            return None;
        }
        let c = led.out_done.pop_front()?;
        self.pacer.completed(c.id, self.now_ns);
        Some(c)
    }

    pub(crate) fn metadata_committed(&mut self) {
        self.metadata_pending = false;
    }

    pub(crate) fn metadata_pending(&self) -> bool {
        self.metadata_pending
    }

    pub(crate) fn next_deadline_ns(&self) -> Option<TimeNs> {
        if self.start_pending {
            return Some(self.now_ns);
        }
        match (self.cache_next_deadline(), self.sync_next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn tick(&mut self, led: &mut Ledger, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        self.cache_tick(led);
        self.after_event(led);
    }

    pub(crate) fn member_states(&self) -> Vec<MemberState> {
        self.members.iter().map(|m| m.state).collect()
    }

    pub(crate) fn stats(&self) -> &ArrayStats {
        &self.stats
    }

    pub(crate) fn reset_stats(&mut self) {
        self.stats = ArrayStats::new(self.members.len());
    }

    pub(crate) fn is_idle(&self, led: &Ledger) -> bool {
        led.reqs.is_empty()
            && led.ios.is_empty()
            && led.out_ios.is_empty()
            && led.flushes.is_empty()
            && self.ppl_idle()
    }

    pub(crate) fn sync_active(&self) -> bool {
        self.sync.is_some() || self.sync_queue.iter().any(|(k, _)| self.sync_may_start(*k))
    }
}
