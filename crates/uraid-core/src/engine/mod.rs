//! The array engine: a state machine fed requests, member-I/O completions and time.
//!
//! Requests on raid0/1/10 become member I/Os directly (`direct.rs`); on raid4/5/6 they go
//! through stripe heads (`stripe/`) unless a chunk-aligned read may bypass the cache.
//! Every event ends by re-analysing what it touched, as md's `handle_stripe` does.
//!
//! This file holds the public `Engine` (the ledger of what is in flight, `crate::ledger`,
//! beside `Mddev`, the array's state) and the personality table's shape; `entry` takes
//! requests, completions and time; `route` issues member I/O into the ledger and ends
//! requests and flushes; `members` changes each slot's state (`crate::rdev`). State types
//! sit in leaf files that import no room, so no file imports in a circle (see
//! `crate::layering`).

use std::collections::VecDeque;

use crate::api::*;
use crate::config::{ArrayConfig, ConfigError, MemberState, Tunables};
use crate::geometry::Geometry;
use crate::ledger::{IoCtx, Ledger};
use crate::meta::badblocks::BadBlocks;
use crate::mirror::ReadFix;
use crate::rdev::{MemberRt, Replacement, ReplacementStatus};
use crate::reshape::ReshapeGeometry;
use crate::stats::ArrayStats;
use crate::stripe::{Ppl, StripeCache};
use crate::sync::{
    DirectUnit, EngineEvent, ScrubKind, SectorRanges, SyncJob, SyncKind, SyncStatus, UnitStart,
};

mod entry;
mod members;
mod route;

/// The engine: the ledger of requests and member I/Os in flight, and the array they run
/// on. Every room takes the ledger as an argument (see docs/architecture.md).
pub struct Engine {
    pub(crate) led: Ledger,
    pub(crate) md: Mddev,
}

/// md's `struct mddev` with its personality's private state (`conf`): everything but
/// the ledger.
pub(crate) struct Mddev {
    pub(crate) geo: Geometry,
    /// What this level does differently (see `personality`).
    pub(crate) pers: &'static Personality,
    pub(crate) members: Vec<MemberRt>,
    pub(crate) tun: Tunables,
    read_only: bool,
    pub(crate) failed: bool,
    pub(crate) now_ns: TimeNs,
    pub(crate) cache: StripeCache,
    pub(crate) stats: ArrayStats,
    pub(crate) rr_next: usize,
    pub(crate) sync: Option<SyncJob>,
    pub(crate) sync_queue: VecDeque<(SyncKind, Option<SectorRanges>)>,
    /// Resync ranges a job stopped short on (unreadable data): still owed, retried by the
    /// next `start_resync`.
    pub(crate) resync_held: SectorRanges,
    pub(crate) events: VecDeque<EngineEvent>,
    pub(crate) direct_sync: Option<DirectUnit>,
    /// raid1/10 writes waiting for the sync unit or read-error fix they overlap:
    /// (request, sector, len, zero).
    pub(crate) blocked_writes: Vec<(RequestId, u64, u64, bool)>,
    /// raid1/10 read-error corrections under way, and the next one's id.
    pub(crate) read_fixes: Vec<ReadFix>,
    pub(crate) next_read_fix: u64,
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
    /// Work queued at construction (a recovery resumed from its checkpoint) waits for the
    /// first call after the caller has set the engine up (member indices, bad-block logs,
    /// write-mostly): `next_deadline_ns` asks for a tick now until then.
    start_pending: bool,
    /// md's partial parity log (RAID5 with PPL; see `stripe::ppl`). Boxed and None
    /// otherwise, so arrays without it pay one pointer check per stripe write.
    pub(crate) ppl: Option<Box<Ppl>>,
    /// How fast background work runs under load (`sync_policy`).
    pub(crate) pacer: crate::sync::pacing::Pacer,
    /// A reshape md left in progress: reads are mapped by its two geometries (`geo` is
    /// the next one). Boxed and None otherwise.
    pub(crate) reshape: Option<Box<ReshapeGeometry>>,
    /// raid1 write-behind (see `behind`).
    pub(crate) behind: crate::behind::Behind,
}

/// md's `struct md_personality`: what a level does differently, one static table per level
/// (`crate::personality`), chosen when the engine is built.
pub(crate) struct Personality {
    /// md's name for it, as /proc/mdstat prints it.
    pub name: &'static str,
    /// md's make_request for a read of [sector, sector + len) array sectors.
    pub read: fn(&mut Mddev, &mut Ledger, RequestId, u64, u64),
    /// md's make_request for a write (`zero`: write zeroes or discard, no payload).
    pub write: fn(&mut Mddev, &mut Ledger, RequestId, u64, u64, bool),
    /// The end of one of the personality's member I/Os (md's `end_request` callbacks).
    pub io_done: fn(&mut Mddev, &mut Ledger, IoCtx, usize, MemberIoResult),
    /// md's sync_request: start one background unit [start, end) of the job's sectors.
    pub sync_unit: fn(&mut Mddev, &mut Ledger, u64, u64) -> UnitStart,
    /// Sectors a background unit covers.
    pub sync_unit_sectors: fn(&Mddev) -> u64,
    /// Background units worked on at once.
    pub sync_window_units: fn(&Mddev, u64) -> usize,
    /// May a resync run with the members as they are?
    pub resync_may_run: fn(&Mddev) -> bool,
    /// Background jobs walk array sectors rather than member sectors (raid10, whose copies
    /// of one member's data are spread over the array's address space).
    pub sync_in_array_sectors: bool,
    /// The level keeps redundancy: there is something to resync and bad blocks to list.
    pub redundant: bool,
}

impl Engine {
    pub fn new(config: ArrayConfig) -> Result<Self, ConfigError> {
        Ok(Engine { led: Ledger::default(), md: Mddev::new(config)? })
    }

    /// Sabotage for testing the testers: with `on`, read-modify-write skips the parity
    /// update, so the simulator's checker must catch the damage once a member is lost.
    #[doc(hidden)]
    pub fn plant_bug_skip_rmw_parity(&mut self, on: bool) {
        self.md.plant_bug_skip_rmw_parity(on)
    }

    pub fn geometry(&self) -> &Geometry {
        self.md.geometry()
    }

    pub fn tunables(&self) -> &Tunables {
        self.md.tunables()
    }

    /// md's sysfs write: tunable `name` (see [`crate::tunables::TUNABLES`]) set to `value`
    /// while I/O runs; refused (nothing changed) when out of range or not of this level.
    pub fn set_tunable(&mut self, name: &str, value: &str) -> Result<(), String> {
        self.md.set_tunable(&mut self.led, name, value)
    }

    /// Every tunable at once (tests, experiments); a smaller stripe cache evicts only idle
    /// stripe heads.
    pub fn set_tunables(&mut self, t: Tunables) -> Result<(), ConfigError> {
        self.md.set_tunables(&mut self.led, t)
    }

    /// Bytes of array address space.
    pub fn size_bytes(&self) -> u64 {
        self.md.size_bytes()
    }

    /// True once more members are lost than the level survives.
    pub fn is_failed(&self) -> bool {
        self.md.is_failed()
    }

    pub fn is_degraded(&self) -> bool {
        self.md.is_degraded()
    }

    /// The array emptied the partial parity log area of the device that joined `slot`
    /// (see `ArraySuperblocks::spare_activated`): the slot's log may be written again.
    pub fn ppl_area_emptied(&mut self, slot: usize) {
        self.md.ppl_area_emptied(&mut self.led, slot)
    }

    /// Would the array still hold its data if the member in `slot` failed too?
    pub fn survives_losing(&self, slot: usize) -> bool {
        self.md.data_survives_losing(Some(slot))
    }

    /// Hand a request to the engine. Back-pressure returns it untouched.
    pub fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        self.md.submit(&mut self.led, req, now_ns)
    }

    /// The caller has no more requests to submit right now (md's unplug): partial stripes
    /// waiting for more writes may be started.
    pub fn unplug(&mut self, now_ns: TimeNs) {
        self.md.unplug(&mut self.led, now_ns)
    }

    /// Next member I/O the caller must perform.
    pub fn pop_member_io(&mut self) -> Option<MemberIo> {
        self.led.out_ios.pop_front()
    }

    /// Report a member I/O's result.
    pub fn complete_member_io(&mut self, completion: MemberIoCompletion, now_ns: TimeNs) {
        self.md.complete_member_io(&mut self.led, completion, now_ns)
    }

    /// Next finished request.
    pub fn pop_completion(&mut self) -> Option<RequestCompletion> {
        self.md.pop_completion(&mut self.led)
    }

    /// The caller has made the member failures it was told of (`EngineEvent::MemberFaulty`)
    /// durable in the superblocks: held completions may go (see
    /// `Tunables::hold_completions_on_member_failure`).
    pub fn metadata_committed(&mut self) {
        self.md.metadata_committed()
    }

    /// Are completions held until `metadata_committed`?
    pub fn metadata_pending(&self) -> bool {
        self.md.metadata_pending()
    }

    /// When `tick` must next be called even if nothing else happens.
    pub fn next_deadline_ns(&self) -> Option<TimeNs> {
        self.md.next_deadline_ns()
    }

    /// Let time-driven work (batching deadlines) run.
    pub fn tick(&mut self, now_ns: TimeNs) {
        self.md.tick(&mut self.led, now_ns)
    }

    pub fn member_states(&self) -> Vec<MemberState> {
        self.md.member_states()
    }

    pub fn stats(&self) -> &ArrayStats {
        self.md.stats()
    }

    /// The stripe cache's size and occupancy (raid4/5/6; None on other levels). Walks the
    /// cache's heads: for a look now and then, not per request.
    pub fn stripe_cache_usage(&self) -> Option<crate::stats::StripeCacheUsage> {
        if !self.md.geo.level.has_parity() {
            return None;
        }
        let (heads, active) = self.md.cache.occupancy();
        Some(crate::stats::StripeCacheUsage { size: self.md.tun.stripe_cache_size, heads, active })
    }

    /// Reset the accounting (e.g. between the phases of an experiment).
    pub fn reset_stats(&mut self) {
        self.md.reset_stats()
    }

    /// The counters go on in the engine that takes over from `other` (a reshape's).
    pub(crate) fn carry_stats_from(&mut self, other: &Engine) {
        self.md.stats = other.md.stats.clone();
    }

    /// No request, member I/O or queued work outstanding (background sync aside).
    pub fn is_idle(&self) -> bool {
        self.md.is_idle(&self.led)
    }

    /// Is a resync or recovery running, or queued and able to start? (A resync waiting for
    /// a degraded array's recovery is not; see `resync_owed`.)
    pub fn sync_active(&self) -> bool {
        self.md.sync_active()
    }

    /// What holds the engine busy, for a report of a hang.
    pub fn describe_outstanding(&self) -> String {
        let led = &self.led;
        let reqs: Vec<_> = led.reqs.iter().map(|(id, r)| (*id, r.op, r.parts, r.write_seq)).take(8).collect();
        let flushes: Vec<_> = led.flushes.iter().map(|f| (f.req, f.seq, f.pending)).collect();
        format!(
            "requests {} {reqs:?}, member I/Os {} (to issue {}), flushes {flushes:?}, writes in flight {:?}, twins {}, metadata pending {}, {}",
            led.reqs.len(),
            led.ios.values().count(),
            led.out_ios.len(),
            led.inflight_writes.iter().take(8).collect::<Vec<_>>(),
            led.twins.len(),
            self.metadata_pending(),
            self.md.cache_describe()
        )
    }

    /// Requests accepted and not yet completed.
    pub fn inflight_requests(&self) -> usize {
        self.led.reqs.len()
    }

    /// Start replacing the member in `slot` by a device the caller reaches as `io_member`
    /// (md's want_replacement). `from_sectors` resumes a copy from its recovery_offset.
    /// Refused, with nothing changed, where md refuses.
    pub fn start_replacement(
        &mut self,
        slot: usize,
        io_member: usize,
        data_offset_bytes: u64,
        from_sectors: u64,
        now_ns: TimeNs,
    ) -> Result<(), String> {
        self.md.start_replacement(&mut self.led, slot, io_member, data_offset_bytes, from_sectors, now_ns)
    }

    /// The replacements being rebuilt.
    pub fn replacements(&self) -> Vec<ReplacementStatus> {
        self.md.replacements()
    }

    /// Stop replacing `slot` (its replacement failed, or the caller gave up): the member
    /// stays. Nothing happens if there is no replacement.
    pub fn fail_replacement(&mut self, slot: usize, now_ns: TimeNs) {
        self.md.fail_replacement(&mut self.led, slot, now_ns);
        self.release_gone();
    }

    /// A member just failed had I/O in flight: what waits on it goes on now (see
    /// `Ledger::release_member`), as after any other event.
    fn release_gone(&mut self) {
        if !self.led.gone.is_empty() {
            self.md.after_event(&mut self.led);
        }
    }

    /// The copied replacement of `slot` takes the slot, reached from now on as
    /// `io_member`; the member that was there gets no more I/O (md marks it Faulty and
    /// removes it). Returns the caller's index of that member. The slot stays in sync.
    pub fn promote_replacement(
        &mut self,
        slot: usize,
        io_member: usize,
        now_ns: TimeNs,
    ) -> Result<usize, String> {
        self.md.promote_replacement(&mut self.led, slot, io_member, now_ns)
    }

    /// The caller's index of the device in `slot` (what its member I/O carries).
    pub fn io_member(&self, slot: usize) -> usize {
        self.md.io_member(slot)
    }

    /// The caller reaches the slot's device through another of its member indices (a
    /// spare taking the slot, say).
    pub fn set_io_member(&mut self, slot: usize, io_member: usize) -> Result<(), String> {
        self.md.set_io_member(slot, io_member)
    }

    /// Start md's `check` or `repair`. Refused, as md refuses it, on raid0, on a failed or
    /// degraded array, and while another job runs or a resync/recovery is owed.
    pub fn start_scrub(&mut self, kind: ScrubKind, now_ns: TimeNs) -> Result<(), String> {
        self.md.start_scrub(&mut self.led, kind, now_ns)
    }

    /// md's `idle`: stop a running or queued check/repair. Units in flight finish (their
    /// rewrites land) but count nothing more. True if there was one to stop.
    pub fn stop_scrub(&mut self) -> bool {
        self.md.stop_scrub(&mut self.led)
    }

    /// md's mismatch_cnt, in sectors: what the last (or running) check/repair found.
    pub fn mismatch_cnt(&self) -> u64 {
        self.md.mismatch_cnt()
    }

    /// md's sync_action: the job running, else one queued that may start, else "idle".
    pub fn sync_action(&self) -> &'static str {
        self.md.sync_action()
    }

    /// md's last_sync_action: the last job started ("none" before any).
    pub fn last_sync_action(&self) -> &'static str {
        self.md.last_sync_action()
    }

    /// md's write-mostly flag of a mirror member (raid1/raid10): reads avoid it while
    /// another in-sync copy can serve them; writes go to it as to every copy.
    pub fn set_write_mostly(&mut self, member: usize, on: bool) -> Result<(), String> {
        self.md.set_write_mostly(member, on)
    }

    /// md's max_write_behind (the bitmap superblock's `write_behind`): up to this many
    /// raid1 writes may complete before their write-mostly copies land; 0 = off. The
    /// caller sets it only for an array with a write-intent bitmap (it keeps the bits of
    /// a behind write until its copies land: see `take_behind_group`).
    pub fn set_write_behind(&mut self, max: u32) -> Result<(), String> {
        if max > 0 && self.md.geo.level != crate::geometry::Level::Raid1 {
            return Err("write-behind applies to raid1 only".into());
        }
        self.md.behind.max = max;
        Ok(())
    }

    pub fn write_behind(&self) -> u32 {
        self.md.behind.max
    }

    /// Writes whose write-mostly copies are still in flight after they completed.
    pub fn behind_writes_in_flight(&self) -> usize {
        self.md.behind.active()
    }

    /// Write `id` just completed while its write-mostly copies still fly: the group whose
    /// `EngineEvent::BehindWriteDone` says they landed. None: nothing of it is behind.
    pub fn take_behind_group(&mut self, id: RequestId) -> Option<u64> {
        self.md.take_behind_group(id)
    }

    /// Mark a member faulty (mdadm --fail); the array continues degraded if it can. Its
    /// member I/Os in flight are answered `Gone` at once for whatever waits on them, and
    /// their completions, if the device still answers later, are dropped.
    pub fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        self.md.fail_member(&mut self.led, member, now_ns);
        self.release_gone();
    }

    /// md's bad-block log of the member in `slot` as read at assembly (device sectors):
    /// reads avoid its ranges, a write error there joins it instead of failing the
    /// member. None (the default): no log. raid0 keeps none, as md's raid0 ignores it.
    pub fn set_bad_blocks(&mut self, slot: usize, bad_blocks: Option<BadBlocks>) {
        self.md.set_bad_blocks(slot, bad_blocks)
    }

    pub fn bad_blocks(&self, slot: usize) -> Option<&BadBlocks> {
        self.md.bad_blocks(slot)
    }

    /// md's `ppl_init_log`: log partial parity before every RAID5 stripe write, to each
    /// slot's PPL area, `areas[slot]` = (absolute first sector, sectors) as its superblock
    /// gives them. The areas must be empty (`Array::start` empties them first). Nothing
    /// changes for other levels, or for chunks md could not log (below 4 KiB).
    pub fn enable_ppl(&mut self, signature: u32, areas: &[Option<(u64, u64)>]) {
        self.md.enable_ppl(signature, areas)
    }

    /// Serve an array md left mid-reshape (see `reshape`): the engine's geometry must be
    /// the reshape's next one and the engine read-only (uraid does not yet continue a
    /// reshape, and a write would have to land on the right side of it).
    pub fn set_reshape(&mut self, reshape: ReshapeGeometry) -> Result<(), String> {
        self.md.set_reshape(reshape)
    }

    /// The reshape md left in progress, if any.
    pub fn reshape(&self) -> Option<&ReshapeGeometry> {
        self.md.reshape.as_deref()
    }

    /// Does this engine log partial parity?
    pub fn ppl_enabled(&self) -> bool {
        self.md.ppl_enabled()
    }

    /// Put a replacement into a `Faulty` or `Missing` slot and start rebuilding it
    /// (mdadm --add). `data_offset_bytes` is where data starts on the new member.
    pub fn add_member(&mut self, slot: usize, data_offset_bytes: u64, now_ns: TimeNs) -> Result<(), String> {
        self.md.add_member(&mut self.led, slot, data_offset_bytes, now_ns)
    }

    /// md's re-add with a write-intent bitmap: a member that left the array comes back
    /// into `slot` and only `ranges` (the sync-space regions whose bits were set while it
    /// was away) are rebuilt; `None` rebuilds it all. raid10's bitmap counts array sectors
    /// while its recovery walks member sectors, so raid10 always rebuilds in full.
    pub fn readd_member(
        &mut self,
        slot: usize,
        data_offset_bytes: u64,
        ranges: Option<Vec<(u64, u64)>>,
        now_ns: TimeNs,
    ) -> Result<(), String> {
        self.md.readd_member(&mut self.led, slot, data_offset_bytes, ranges, now_ns)
    }

    /// Has `slot` member I/O in flight (a failed member's last I/O still draining)?
    pub fn member_io_in_flight(&self, slot: usize) -> bool {
        self.led.member_io_in_flight(slot)
    }

    /// Resync the given member-sector ranges (a bitmap's dirty regions), or everything.
    /// On raid4/5/6 a resync waits while the array is degraded and runs once recovery is
    /// done (md keeps recovery_cp); raid1/10 resync among their in-sync copies while two
    /// of each remain. See `resync_owed`.
    pub fn start_resync(&mut self, ranges: Option<Vec<(u64, u64)>>, now_ns: TimeNs) {
        self.md.start_resync(&mut self.led, ranges, now_ns)
    }

    /// Does the array still owe a resync: one running, queued, waiting for recovery to end,
    /// or stopped short by unreadable data? While it does, a finished recovery does not make
    /// the array in sync: the caller must keep the write-intent bits (and md's resync_offset).
    pub fn resync_owed(&self) -> bool {
        self.md.resync_owed()
    }

    pub fn sync_status(&self) -> Option<SyncStatus> {
        self.md.sync_status()
    }

    /// Next event for the caller (superblock updates, monitoring).
    pub fn pop_event(&mut self) -> Option<EngineEvent> {
        self.md.pop_event()
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
