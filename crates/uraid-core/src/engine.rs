//! The array engine: a state machine fed requests, member-I/O completions and time.
//!
//! Requests on raid0/1/10 become member I/Os directly (`direct.rs`); on raid4/5/6 they go
//! through stripe heads (`stripe.rs`) unless a chunk-aligned read may bypass the cache.
//! Every event ends by re-analysing what it touched, as md's `handle_stripe` does.

use std::collections::{BTreeSet, VecDeque};

use crate::detmap::DetMap;

use crate::api::*;
use crate::config::{ArrayConfig, ConfigError, MemberState, Tunables};
use crate::geometry::{Geometry, Level};
use crate::meta::BadBlocks;
use crate::stats::ArrayStats;
use crate::stripe::{IoCtx, StripeCache};
use crate::sync::{DirectUnit, EngineEvent, SyncJob, SyncKind};

/// Runtime state of one raid slot.
#[derive(Clone, Debug)]
pub(crate) struct MemberRt {
    pub state: MemberState,
    pub data_offset_bytes: u64,
    pub inflight: u32,
    /// Member sector just past the last I/O sent (for read balancing).
    pub last_end_sector: u64,
    pub last_dispatch_ns: TimeNs,
    /// md's write-mostly: read only when no other copy can serve.
    pub write_mostly: bool,
    /// md's bad-block log of this member (device sectors); None: no log, so a write error
    /// fails the member.
    pub bad_blocks: Option<BadBlocks>,
    /// md's WriteErrorSeen: a write failed here this run, so a listed range is not
    /// rewritten after a read reconstructed it (md only retries ranges read errors listed).
    pub write_error_seen: bool,
    /// The caller's index of the device in this slot (`MemberIo::member`): the slot itself
    /// unless a replacement took the slot (see `replace`).
    pub io_member: usize,
}

impl MemberRt {
    /// May this member be read at data-relative `sector`?
    pub fn readable(&self, sector: u64) -> bool {
        match self.state {
            MemberState::InSync => true,
            MemberState::Recovering { recovery_offset_sectors } => sector < recovery_offset_sectors,
            _ => false,
        }
    }
    /// md's is_badblock: is any of data-relative `[sector, sector + len)` listed bad?
    pub fn has_bad_block(&self, sector: u64, len: u64) -> bool {
        self.bad_blocks.as_ref().is_some_and(|bb| {
            !bb.is_empty() && bb.overlaps(self.data_offset_bytes / SECTOR_BYTES + sector, len)
        })
    }

    /// May `[sector, sector + len)` be read here: readable and none of it listed bad.
    pub fn readable_range(&self, sector: u64, len: u64) -> bool {
        self.readable(sector + len.max(1) - 1) && !self.has_bad_block(sector, len)
    }

    /// Does this member receive writes?
    pub fn writable(&self) -> bool {
        matches!(self.state, MemberState::InSync | MemberState::Recovering { .. })
    }
}

#[derive(Debug)]
pub(crate) struct ReqState {
    pub op: RequestOp,
    pub fua: bool,
    /// Read: the data being gathered (allocated on first use: a read served by one member
    /// I/O takes that I/O's buffer instead). Write: the payload.
    pub buf: Vec<u8>,
    pub len_bytes: u64,
    /// Write payload shared with member writes (raid0/1/10: no copy per piece or mirror).
    pub shared: Option<std::sync::Arc<Vec<u8>>>,
    /// Outstanding parts; the request completes when this reaches zero.
    pub parts: u32,
    pub error: Option<RequestError>,
    /// Writes: order number for flush accounting.
    pub write_seq: Option<u64>,
    /// FUA writes: member flushes still outstanding after the data landed.
    pub fua_flushes: Option<u32>,
    /// Read: byte ranges `[start, end)` that `deliver` wrote into `buf`'s spare capacity
    /// while `buf` is still empty; see `deliver`.
    pub gathered: Vec<(usize, usize)>,
}

impl ReqState {
    /// The read buffer as a whole: allocated zeroed the first time a part lands in it, or
    /// completed from what `deliver` gathered (the gaps zeroed).
    pub fn read_target(&mut self) -> &mut [u8] {
        let total = self.len_bytes as usize;
        if self.buf.len() != total {
            self.buf.clear();
            self.buf.reserve_exact(total);
            let mut pos = 0;
            for &(start, end) in covered(&mut self.gathered) {
                self.buf.spare_capacity_mut()[pos..start].fill(std::mem::MaybeUninit::new(0));
                pos = end;
            }
            self.buf.spare_capacity_mut()[pos..total].fill(std::mem::MaybeUninit::new(0));
            // SAFETY: every byte below `total` is either gathered (written by `deliver`)
            // or was just zeroed.
            unsafe { self.buf.set_len(total) };
            self.gathered.clear();
        }
        &mut self.buf
    }

    /// Put a member read's data at `dest_off`; a read that is one member I/O keeps its buffer.
    /// The pieces of a read made of several member reads (a read across chunks, a RAID0
    /// stripe) land in the buffer's spare capacity and are not zeroed first: the pieces
    /// cover it all, and zeroing 1 MiB before copying 1 MiB over it cost as much as the copy.
    pub fn deliver(&mut self, dest_off: usize, mut data: Vec<u8>, len: usize) {
        let total = self.len_bytes as usize;
        if dest_off == 0 && len == total && self.buf.is_empty() && data.len() >= len {
            data.truncate(len);
            self.buf = data;
            return;
        }
        let n = len.min(data.len()).min(total.saturating_sub(dest_off));
        if self.buf.len() == total {
            self.buf[dest_off..dest_off + n].copy_from_slice(&data[..n]);
            return;
        }
        if self.gathered.is_empty() {
            self.buf.clear();
            self.buf.reserve_exact(total);
        }
        let spare = &mut self.buf.spare_capacity_mut()[dest_off..dest_off + n];
        // SAFETY: `spare` is n bytes of this vector's capacity, disjoint from `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), spare.as_mut_ptr().cast::<u8>(), n) };
        self.gathered.push((dest_off, dest_off + n));
        if covered(&mut self.gathered) == [(0, total)] {
            // SAFETY: the gathered ranges cover every byte below `total`.
            unsafe { self.buf.set_len(total) };
            self.gathered.clear();
        }
    }

    /// A finished read's data.
    pub fn into_read_data(mut self) -> Vec<u8> {
        if !self.gathered.is_empty() {
            self.read_target();
        }
        self.buf
    }

    /// The write payload as a shared buffer (taken out of `buf` the first time).
    pub fn shared_payload(&mut self) -> std::sync::Arc<Vec<u8>> {
        self.shared.get_or_insert_with(|| std::sync::Arc::new(std::mem::take(&mut self.buf))).clone()
    }
}

/// `ranges` sorted and merged into their union (touching ranges join).
fn covered(ranges: &mut Vec<(usize, usize)>) -> &[(usize, usize)] {
    ranges.sort_unstable();
    // In place: `next` joins `prev` when it starts inside or right after it.
    ranges.dedup_by(|next, prev| {
        let joins = next.0 <= prev.1;
        if joins {
            prev.1 = prev.1.max(next.1);
        }
        joins
    });
    ranges
}

struct FlushWait {
    req: RequestId,
    /// The flush covers every write submitted before this sequence number.
    seq: u64,
    /// Member flushes outstanding, once issued.
    pending: Option<u32>,
    error: Option<RequestError>,
}

/// A member I/O in flight: why, which member, when issued, and the data-relative
/// (sector, len) of a write (a success there clears listed bad blocks).
pub(crate) type InflightIo = (IoCtx, usize, TimeNs, Option<(u64, u64)>);

/// Member-sector ranges [start, end) a background job covers.
pub(crate) type SectorRanges = Vec<(u64, u64)>;

pub struct Engine {
    pub(crate) geo: Geometry,
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
    pub(crate) replacements: Vec<Option<crate::replace::Replacement>>,
    /// Writes to a slot with a replacement whose twin write is still in flight, with the
    /// slot write's completion once it came (it is handled when both landed).
    twins: DetMap<MemberIoId, crate::replace::HeldCompletion>,
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
                write_mostly: false,
                bad_blocks: None,
                write_error_seen: false,
            })
            .collect();
        let mut engine = Engine {
            cache: StripeCache::new(&geo),
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
        };
        if !engine.data_survives() {
            let missing = engine.members.iter().filter(|m| !m.writable()).count();
            return Err(ConfigError::TooDegraded { missing, survivable: engine.geo.redundancy() });
        }
        for slot in 0..engine.members.len() {
            if let MemberState::Recovering { recovery_offset_sectors } = engine.members[slot].state {
                engine.queue_recovery(slot, recovery_offset_sectors);
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
        if self.geo.level.has_parity() {
            self.stripe_read(id, sector, len);
        } else {
            self.direct_read(id, sector, len);
        }
    }

    fn start_write(&mut self, id: RequestId, op: RequestOp, offset_bytes: u64, len_bytes: u64) {
        let sector = offset_bytes / SECTOR_BYTES;
        let len = len_bytes / SECTOR_BYTES;
        let zero = op != RequestOp::Write;
        if self.geo.level.has_parity() {
            self.stripe_write(id, sector, len, zero);
        } else {
            self.direct_write(id, sector, len, zero);
        }
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
        if let Some(m) = self.members.get_mut(member) {
            m.inflight = m.inflight.saturating_sub(1);
        }
        let busy_ns = self.now_ns.saturating_sub(issued_ns);
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

    /// Mark a member faulty (mdadm --fail); the array continues degraded if it can.
    /// md's write-mostly flag of a mirror member (raid1/raid10): reads avoid it while
    /// another in-sync copy can serve them; writes go to it as to every copy.
    pub fn set_write_mostly(&mut self, member: usize, on: bool) -> Result<(), String> {
        if !matches!(self.geo.level, Level::Raid1 | Level::Raid10) {
            return Err("write-mostly applies to raid1 and raid10 members only".into());
        }
        let m = self.members.get_mut(member).ok_or_else(|| format!("member {member} does not exist"))?;
        m.write_mostly = on;
        Ok(())
    }

    pub fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        if let Some(slot) = self.replacement_slot(member) {
            // An I/O to a replacement failed: md_error on the replacement, not the slot.
            self.fail_replacement(slot, now_ns);
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
        self.fail_replacement(member, now_ns);
        self.members[member].state = MemberState::Faulty;
        self.metadata_pending |= self.tun.hold_completions_on_member_failure;
        self.events.push_back(EngineEvent::MemberFaulty(member));
        self.sync_member_failed(member);
        if !self.data_survives() {
            self.fail_array();
        } else {
            self.cache_rehandle_all();
        }
    }

    /// md's bad-block log of the member in `slot` as read at assembly (device sectors):
    /// reads avoid its ranges, a write error there joins it instead of failing the
    /// member. None (the default): no log. raid0 keeps none, as md's raid0 ignores it.
    pub fn set_bad_blocks(&mut self, slot: usize, bad_blocks: Option<BadBlocks>) {
        if let Some(m) = self.members.get_mut(slot) {
            m.bad_blocks = bad_blocks.filter(|_| self.geo.level != Level::Raid0);
        }
    }

    pub fn bad_blocks(&self, slot: usize) -> Option<&BadBlocks> {
        self.members.get(slot)?.bad_blocks.as_ref()
    }

    /// md's rdev_set_badblocks for the write being completed on `member`: its range joins
    /// the member's log and completions wait until the caller wrote the log
    /// (`EngineEvent::BadBlocksRecorded`, then `metadata_committed`). False when the
    /// member has no log or it is full: the caller fails the member (md_error).
    pub(crate) fn record_write_error(&mut self, member: usize) -> bool {
        let Some((sector, len)) = self.completing_write else { return false };
        let m = &mut self.members[member];
        let abs = m.data_offset_bytes / SECTOR_BYTES + sector;
        if !m.writable() || !m.bad_blocks.as_mut().is_some_and(|bb| bb.set(abs, len)) {
            return false;
        }
        m.write_error_seen = true;
        self.metadata_pending |= self.tun.hold_completions_on_member_failure;
        self.events.push_back(EngineEvent::BadBlocksRecorded { slot: member, sector: abs, sectors: len });
        true
    }

    /// md's R5_MadeGood / R1BIO_MadeGood: a write landed on listed sectors, so they are
    /// good again (written to the log with the next superblock update, as md does).
    fn made_good(&mut self, member: usize, sector: u64, len: u64) {
        let m = &mut self.members[member];
        if !m.has_bad_block(sector, len) {
            return;
        }
        let abs = m.data_offset_bytes / SECTOR_BYTES + sector;
        if m.bad_blocks.as_mut().is_some_and(|bb| bb.clear(abs, len)) {
            self.events.push_back(EngineEvent::BadBlocksCleared { slot: member, sector: abs, sectors: len });
        }
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
        self.reqs.is_empty() && self.ios.is_empty() && self.out_ios.is_empty() && self.flushes.is_empty()
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

    /// Does every array sector keep at least one readable copy / enough members to rebuild it?
    /// A member being recovered counts as lost, as in md (raid5's calc_degraded, raid1's and
    /// raid10's `enough` count In_sync members only): above its recovery_offset it holds
    /// nothing yet, so a failure that leaves it to cover some blocks fails the array.
    pub(crate) fn data_survives(&self) -> bool {
        let lost: Vec<bool> = self.members.iter().map(|m| m.state != MemberState::InSync).collect();
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
    pub(crate) fn fail_array(&mut self) {
        if self.failed {
            return;
        }
        self.failed = true;
        self.events.push_back(EngineEvent::ArrayFailed);
        let ids: Vec<RequestId> = self.reqs.keys().copied().collect();
        for id in ids {
            if let Some(r) = self.reqs.get_mut(&id) {
                r.error = Some(RequestError::ArrayFailed);
            }
        }
        self.cache_rehandle_all();
        for f in &mut self.flushes {
            f.error = Some(RequestError::ArrayFailed);
        }
        // Requests whose I/Os are still in flight complete as those I/Os return.
        let idle: Vec<RequestId> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.parts == 0 && r.fua_flushes.is_none())
            .map(|(&id, _)| id)
            .collect();
        for id in idle {
            self.finish_request(id);
        }
        self.progress_flushes();
    }

    // ---- member I/O issue ------------------------------------------------------------

    /// Queue a data I/O at data-relative `member_sector`.
    pub(crate) fn issue_io(
        &mut self,
        member: usize,
        op: MemberIoOp,
        member_sector: u64,
        len_sectors: u64,
        data: IoBytes,
        ctx: IoCtx,
    ) {
        // A write to a slot being replaced goes to the replacement too (see `replace`).
        let twin = (op == MemberIoOp::Write)
            .then(|| self.replacements.get(member).and_then(|r| r.as_ref()).map(|_| data.clone()))
            .flatten();
        let primary = self.push_io(member, op, member_sector, len_sectors, data, ctx);
        if let Some(data) = twin {
            self.twins.insert(primary, None);
            let r = self.replacement_index(member);
            self.push_io(r, op, member_sector, len_sectors, data, IoCtx::ReplaceTwin { primary });
        }
    }

    /// Queue one member I/O to engine member `member`: a slot, or a replacement.
    fn push_io(
        &mut self,
        member: usize,
        op: MemberIoOp,
        member_sector: u64,
        len_sectors: u64,
        data: IoBytes,
        ctx: IoCtx,
    ) -> MemberIoId {
        let (io_member, data_offset_bytes) = match self.replacement_slot(member) {
            Some(slot) => {
                let r = self.replacements[slot].as_ref().expect("I/O only to a present replacement");
                (r.io_member, r.data_offset_bytes)
            }
            None => {
                let m = &mut self.members[member];
                m.inflight += 1;
                m.last_end_sector = member_sector + len_sectors;
                m.last_dispatch_ns = self.now_ns;
                (m.io_member, m.data_offset_bytes)
            }
        };
        let len_bytes = len_sectors * SECTOR_BYTES;
        let ms = self.member_stats_mut(member);
        match op {
            MemberIoOp::Read => {
                ms.reads += 1;
                ms.read_bytes += len_bytes;
            }
            MemberIoOp::Write => {
                ms.writes += 1;
                ms.write_bytes += len_bytes;
            }
            MemberIoOp::Flush => ms.flushes += 1,
        }
        let offset_bytes =
            if op == MemberIoOp::Flush { 0 } else { data_offset_bytes + member_sector * SECTOR_BYTES };
        let write_range = (op == MemberIoOp::Write).then_some((member_sector, len_sectors));
        let id = self.ios.insert((ctx, member, self.now_ns, write_range));
        self.out_ios.push_back(MemberIo {
            id,
            member: io_member,
            op,
            offset_bytes,
            len_bytes: if op == MemberIoOp::Flush { 0 } else { len_bytes },
            data,
        });
        id
    }

    // ---- request completion ----------------------------------------------------------

    /// One part of request `id` finished (with an error, maybe).
    pub(crate) fn part_done(&mut self, id: RequestId, error: Option<RequestError>) {
        let Some(r) = self.reqs.get_mut(&id) else { return };
        if error.is_some() && r.error.is_none() {
            r.error = error;
        }
        r.parts = r.parts.saturating_sub(1);
        if r.parts > 0 {
            return;
        }
        if r.fua && r.error.is_none() && r.fua_flushes.is_none() && r.op != RequestOp::Read {
            let targets = self.flush_targets();
            self.reqs.get_mut(&id).expect("present").fua_flushes = Some(targets.len() as u32);
            for m in targets {
                self.issue_io(m, MemberIoOp::Flush, 0, 0, IoBytes::new(), IoCtx::FuaFlush { req: id });
            }
            return;
        }
        if r.fua_flushes.is_some() {
            return;
        }
        self.finish_request(id);
    }

    fn fua_flush_done(&mut self, id: RequestId, member: usize, ok: bool) {
        if !ok {
            self.fail_member(member, self.now_ns);
        }
        let Some(r) = self.reqs.get_mut(&id) else { return };
        let left = r.fua_flushes.unwrap_or(1).saturating_sub(1);
        r.fua_flushes = Some(left);
        if left == 0 {
            if self.failed && r.error.is_none() {
                r.error = Some(RequestError::ArrayFailed);
            }
            self.finish_request(id);
        }
    }

    fn finish_request(&mut self, id: RequestId) {
        let Some(r) = self.reqs.remove(&id) else { return };
        let write_seq = r.write_seq;
        if let Some(seq) = write_seq {
            self.inflight_writes.remove(&seq);
        }
        let result = match r.error {
            Some(e) => Err(e),
            None if r.op == RequestOp::Read => Ok(r.into_read_data()),
            None => Ok(Vec::new()),
        };
        self.out_done.push_back(RequestCompletion { id, result });
        self.direct_write_ranges.remove(&id);
        if write_seq.is_some() {
            self.progress_flushes();
        }
    }

    // ---- flush ------------------------------------------------------------------------

    fn progress_flushes(&mut self) {
        let oldest_write = self.inflight_writes.iter().next().copied();
        let mut i = 0;
        while i < self.flushes.len() {
            let f = &self.flushes[i];
            if let Some(err) = f.error {
                if f.pending.is_none_or(|p| p == 0) {
                    let f = self.flushes.remove(i);
                    self.out_done.push_back(RequestCompletion { id: f.req, result: Err(err) });
                    continue;
                }
            } else if f.pending.is_none() && oldest_write.is_none_or(|w| w >= f.seq) {
                let targets = self.flush_targets();
                let flush_id = f.req;
                self.flushes[i].pending = Some(targets.len() as u32);
                for m in targets {
                    self.issue_io(
                        m,
                        MemberIoOp::Flush,
                        0,
                        0,
                        IoBytes::new(),
                        IoCtx::MemberFlush { flush: flush_id },
                    );
                }
                if self.flushes[i].pending == Some(0) {
                    let f = self.flushes.remove(i);
                    self.out_done.push_back(RequestCompletion { id: f.req, result: Ok(Vec::new()) });
                    continue;
                }
            }
            i += 1;
        }
    }

    fn member_flush_done(&mut self, flush: RequestId, member: usize, ok: bool) {
        if !ok {
            self.fail_member(member, self.now_ns);
        }
        let Some(i) = self.flushes.iter().position(|f| f.req == flush) else { return };
        let f = &mut self.flushes[i];
        let left = f.pending.unwrap_or(1).saturating_sub(1);
        f.pending = Some(left);
        if left == 0 {
            let f = self.flushes.remove(i);
            let result = match (f.error, self.failed) {
                (Some(e), _) => Err(e),
                (None, true) => Err(RequestError::ArrayFailed),
                (None, false) => Ok(Vec::new()),
            };
            self.out_done.push_back(RequestCompletion { id: f.req, result });
        }
    }

    fn io_done(&mut self, ctx: IoCtx, member: usize, result: Result<Vec<u8>, MemberIoError>) {
        if self.geo.level.has_parity() {
            self.stripe_io_done(ctx, member, result);
        } else {
            self.direct_io_done(ctx, member, result);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn read_state(len: usize) -> ReqState {
        ReqState {
            op: RequestOp::Read,
            fua: false,
            buf: Vec::new(),
            len_bytes: len as u64,
            shared: None,
            parts: 0,
            error: None,
            write_seq: None,
            fua_flushes: None,
            gathered: Vec::new(),
        }
    }

    #[test]
    fn pieces_delivered_in_any_order_make_the_whole_read() {
        let want: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let mut r = read_state(4096);
        r.deliver(3072, want[3072..].to_vec(), 1024);
        r.deliver(0, want[..1024].to_vec(), 1024);
        assert!(r.buf.is_empty(), "not whole yet");
        r.deliver(1024, want[1024..3072].to_vec(), 2048);
        assert_eq!(r.buf, want, "whole once the pieces cover it");
        assert!(r.gathered.is_empty());
    }

    #[test]
    fn a_cache_copy_between_pieces_keeps_them_and_zeroes_only_the_gaps() {
        let mut r = read_state(3000);
        r.deliver(2000, vec![7; 1000], 1000);
        r.deliver(0, vec![5; 500], 500);
        // The cache path needs the whole buffer: gathered bytes stay, the gap is zeroed.
        let whole = r.read_target();
        assert_eq!(&whole[..500], &[5; 500][..]);
        assert_eq!(&whole[500..2000], &[0; 1500][..]);
        assert_eq!(&whole[2000..], &[7; 1000][..]);
        whole[500..2000].fill(9);
        r.deliver(0, vec![6; 500], 500);
        let mut want = vec![6u8; 500];
        want.extend([9; 1500]);
        want.extend([7; 1000]);
        assert_eq!(r.into_read_data(), want);
    }

    #[test]
    fn a_read_finished_with_gaps_has_them_zeroed() {
        let mut r = read_state(100);
        r.deliver(50, vec![1; 50], 50);
        r.deliver(60, vec![2; 10], 10);
        let mut want = vec![0u8; 50];
        want.extend([1; 10]);
        want.extend([2; 10]);
        want.extend([1; 30]);
        assert_eq!(r.into_read_data(), want);
    }
}
