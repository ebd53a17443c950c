//! md's write-behind for raid1 (`raid1_write_request` with `R1BIO_BehindIO`): a client
//! write to an array with write-mostly members completes once every other member has it;
//! the write-mostly copies land later, from a buffer of their own, at most
//! `max_write_behind` requests at a time (the bitmap superblock's `write_behind`).
//!
//! Safety rules, each kept here:
//! - a request goes behind only when an in-sync member that is not write-mostly takes
//!   its write, and if that write fails the request waits for its behind copies after all;
//! - its bitmap bits stay until the behind copies land (the array ends the write then,
//!   `EngineEvent::BehindWriteDone`), so a crash or a failed behind member resyncs it;
//! - a flush waits for the behind writes taken in before it (their write order number
//!   stays in flight);
//! - writes to a write-mostly member overlapping a behind write there wait for it, so a
//!   later write never lands before an earlier one (md's `wait_for_serialization`);
//! - a read sent to a write-mostly member waits while a behind write overlaps it, and no
//!   new write goes behind while a read waits (md's `behind_wait`);
//! - while no in-sync member that is not write-mostly is left, nothing is acknowledged
//!   until the behind writes landed: acknowledged data is never only in flight.

use crate::api::*;
use crate::detmap::DetMap;
use crate::engine::Mddev;
use crate::ledger::{IoCtx, Ledger};
use crate::mirror::Balance;

/// One copy of a request's write to a write-mostly member, in flight or waiting for an
/// earlier overlapping one on that member.
#[derive(Debug)]
pub(crate) struct MemberWrite {
    pub member: usize,
    pub member_sector: u64,
    pub len_sectors: u64,
    pub data: IoBytes,
    pub ctx: IoCtx,
    pub issued: bool,
}

/// A request some of whose copies are behind.
#[derive(Debug)]
pub(crate) struct Group {
    pub req: RequestId,
    /// Behind copies not yet landed.
    pub pending: u32,
    /// The request's write order number, kept in flight for flushes until they land.
    pub seq: Option<u64>,
    /// The request finished (the client has its answer): the array hears of the end.
    pub finished: bool,
    /// The request waits for its behind copies (a copy that was not behind failed).
    pub counted: bool,
    pub ok: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Behind {
    /// md's max_write_behind; 0 = off.
    pub max: u32,
    next_id: u64,
    /// Writes to write-mostly members that must stay in order, by id (ids grow in issue order).
    pub writes: std::collections::BTreeMap<u64, MemberWrite>,
    /// Behind groups by id.
    pub groups: DetMap<u64, Group>,
    /// The live request's group.
    pub by_req: DetMap<RequestId, u64>,
    /// Reads waiting for a behind write on the write-mostly copy they go to:
    /// (request, request start sector, piece start, piece length).
    pub reads: Vec<(RequestId, u64, u64, u64)>,
    /// Completions held while no in-sync member that is not write-mostly is left.
    pub held: Vec<RequestId>,
    /// Finished requests whose behind copies are in flight: their group, for the array.
    pub finished: DetMap<RequestId, u64>,
}

impl Behind {
    fn overlaps(&self, member: usize, sector: u64, len: u64, before: u64) -> bool {
        self.writes.range(..before).any(|(_, w)| {
            w.member == member && w.member_sector < sector + len && sector < w.member_sector + w.len_sectors
        })
    }

    /// Groups whose copies are still in flight.
    pub fn active(&self) -> usize {
        self.groups.values().filter(|g| g.pending > 0).count()
    }
}

impl Mddev {
    /// May request `id`'s write go behind: write-behind on, a write-mostly member to delay,
    /// an in-sync member that is not write-mostly to hold it meanwhile, under the limit, and
    /// no read waiting for behind writes.
    pub(crate) fn behind_allowed(&self, led: &Ledger, id: RequestId) -> bool {
        self.behind.max > 0
            && self.geo.level == crate::geometry::Level::Raid1
            && !led.reqs.get(&id).is_some_and(|r| r.fua)
            && self.behind.reads.is_empty()
            && (self.behind.active() as u32) < self.behind.max
            && self.members.iter().any(|m| m.write_mostly && m.writable())
            && self.fast_copy_left()
    }

    /// Is an in-sync member that is not write-mostly left?
    fn fast_copy_left(&self) -> bool {
        self.members.iter().any(|m| !m.write_mostly && m.state == crate::config::MemberState::InSync)
    }

    /// A new behind group for request `id`.
    pub(crate) fn behind_group(&mut self, led: &Ledger, id: RequestId) -> u64 {
        self.behind.next_id += 1;
        let g = self.behind.next_id;
        let seq = led.reqs.get(&id).and_then(|r| r.write_seq);
        let group = Group { req: id, pending: 0, seq, finished: false, counted: false, ok: true };
        self.behind.groups.insert(g, group);
        self.behind.by_req.insert(id, g);
        self.stats.write_behind_requests += 1;
        g
    }

    /// Request `id`'s copies are all issued: a group none of whose copies went behind
    /// (none was writable) is dropped.
    pub(crate) fn behind_group_issued(&mut self, g: u64) {
        if let Some(group) = self.behind.groups.get(&g).filter(|gr| gr.pending == 0) {
            let req = group.req;
            self.behind.groups.remove(&g);
            if self.behind.by_req.get(&req) == Some(&g) {
                self.behind.by_req.remove(&req);
            }
        }
    }

    /// A write to member `member`: behind writes (ctx `BehindWrite`) and writes to a
    /// write-mostly member that overlap one still in flight there wait their turn.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ordered_write(
        &mut self,
        led: &mut Ledger,
        member: usize,
        member_sector: u64,
        len_sectors: u64,
        data: IoBytes,
        ctx: IoCtx,
    ) {
        let is_behind = matches!(ctx, IoCtx::BehindWrite { .. });
        if !is_behind && !self.members[member].write_mostly {
            return self.issue_io(led, member, MemberIoOp::Write, member_sector, len_sectors, data, ctx);
        }
        self.behind.next_id += 1;
        let id = self.behind.next_id;
        let ctx = match ctx {
            IoCtx::BehindWrite { group, .. } => IoCtx::BehindWrite { group, write: id },
            c => c,
        };
        let w = MemberWrite { member, member_sector, len_sectors, data, ctx, issued: false };
        self.behind.writes.insert(id, w);
        self.issue_ordered(led);
    }

    /// Issues the waiting writes no earlier one on their member overlaps any more; one for
    /// a member that failed meanwhile is answered `Gone` at once.
    fn issue_ordered(&mut self, led: &mut Ledger) {
        loop {
            let ready: Vec<u64> = self
                .behind
                .writes
                .iter()
                .filter(|(&id, w)| {
                    !w.issued && !self.behind.overlaps(w.member, w.member_sector, w.len_sectors, id)
                })
                .map(|(&id, _)| id)
                .collect();
            let mut gone = Vec::new();
            for id in ready {
                let w = self.behind.writes.get_mut(&id).expect("present");
                w.issued = true;
                let (member, sector, len, data) = (w.member, w.member_sector, w.len_sectors, w.data.clone());
                let ctx = match w.ctx {
                    IoCtx::BehindWrite { .. } => w.ctx.clone(),
                    // A write the request waits for: it leaves the order list when it lands.
                    _ => IoCtx::OrderedWrite { write: id },
                };
                if self.members[member].writable() {
                    self.issue_io(led, member, MemberIoOp::Write, sector, len, data, ctx);
                } else {
                    gone.push((ctx, member));
                }
            }
            if gone.is_empty() {
                return;
            }
            for (ctx, member) in gone {
                match ctx {
                    IoCtx::BehindWrite { group, write } => {
                        self.behind_write_done(led, group, write, member, Err(MemberIoError::Gone))
                    }
                    IoCtx::OrderedWrite { write } => {
                        self.ordered_write_done(led, write, member, Err(MemberIoError::Gone))
                    }
                    _ => {}
                }
            }
        }
    }

    /// A write that waited for order (not behind) landed: handled as the write it is.
    pub(crate) fn ordered_write_done(
        &mut self,
        led: &mut Ledger,
        write: u64,
        member: usize,
        result: MemberIoResult,
    ) {
        let Some(w) = self.behind.writes.remove(&write) else { return };
        self.issue_ordered(led);
        self.direct_io_done(led, w.ctx, member, result);
    }

    /// One behind copy landed (or failed: the member's failure or bad-block entry keeps
    /// the region dirty, as for any write).
    pub(crate) fn behind_write_done(
        &mut self,
        led: &mut Ledger,
        group: u64,
        write: u64,
        member: usize,
        result: MemberIoResult,
    ) {
        self.behind.writes.remove(&write);
        if let Err(e) = result {
            if !(e == MemberIoError::Io && self.record_write_error(led, member)) {
                self.fail_member(led, member, self.now_ns);
            }
        }
        let mut counted_req = None;
        if let Some(g) = self.behind.groups.get_mut(&group) {
            g.pending -= 1;
            g.ok &= result.is_ok();
            counted_req = g.counted.then_some(g.req);
            if g.pending == 0 {
                let g = self.behind.groups.remove(&group).expect("present");
                if self.behind.by_req.get(&g.req) == Some(&group) {
                    self.behind.by_req.remove(&g.req);
                }
                self.behind.finished.retain(|_, v| *v != group);
                if g.finished {
                    if let Some(seq) = g.seq {
                        led.inflight_writes.remove(&seq);
                    }
                    self.events.push_back(crate::sync::EngineEvent::BehindWriteDone { group, ok: g.ok });
                }
            }
        }
        if let Some(req) = counted_req {
            self.part_done(led, req, None);
        }
        self.issue_ordered(led);
        self.behind_progress(led);
    }

    /// A copy of request `req` that was not behind failed: the request now waits for its
    /// behind copies (they may be the only ones left).
    pub(crate) fn behind_count_in(&mut self, led: &mut Ledger, req: RequestId) {
        let Some(&g) = self.behind.by_req.get(&req) else { return };
        let Some(group) = self.behind.groups.get_mut(&g) else { return };
        if group.counted || group.finished {
            return;
        }
        group.counted = true;
        let pending = group.pending;
        if let Some(r) = led.reqs.get_mut(&req) {
            r.parts += pending;
        }
    }

    /// Is a write-mostly write that must stay in order in flight within member sectors
    /// `[start, end)` of any member (raid1: array sectors)?
    pub(crate) fn behind_write_in(&self, start: u64, end: u64) -> bool {
        self.behind.writes.values().any(|w| w.member_sector < end && start < w.member_sector + w.len_sectors)
    }

    /// Is this read piece bound for a write-mostly copy a behind write overlaps?
    pub(crate) fn read_waits_for_behind(&self, member: usize, member_sector: u64, len: u64) -> bool {
        // Not by the flag: a member whose write-mostly flag was just cleared may still have
        // behind writes in flight.
        !self.behind.writes.is_empty() && self.behind.overlaps(member, member_sector, len, u64::MAX)
    }

    /// Request `id` is about to finish: its write order number stays in flight while its
    /// behind copies do; while no fast copy is left, the completion waits for them.
    /// Returns whether it finishes now.
    pub(crate) fn behind_finish(&mut self, id: RequestId) -> bool {
        if self.behind.groups.is_empty() {
            return true;
        }
        if !self.fast_copy_left() && self.behind.active() > 0 {
            if !self.behind.held.contains(&id) {
                self.behind.held.push(id);
            }
            return false;
        }
        if let Some(g) = self.behind.by_req.remove(&id) {
            if let Some(group) = self.behind.groups.get_mut(&g) {
                group.finished = true;
                self.behind.finished.insert(id, g);
            }
        }
        true
    }

    /// After `led.finish`: a finished request whose behind copies fly keeps its order number.
    pub(crate) fn behind_after_finish(&mut self, led: &mut Ledger, id: RequestId) {
        if let Some(&g) = self.behind.finished.get(&id) {
            if let Some(seq) = self.behind.groups.get(&g).and_then(|g| g.seq) {
                led.inflight_writes.insert(seq);
            }
        }
    }

    /// The array takes the behind group of finished write `id`, if its copies still fly.
    pub(crate) fn take_behind_group(&mut self, id: RequestId) -> Option<u64> {
        self.behind.finished.remove(&id)
    }

    /// Waiting reads go, held completions are answered, flushes move, once nothing blocks them.
    fn behind_progress(&mut self, led: &mut Ledger) {
        for (id, sector, pos, n) in std::mem::take(&mut self.behind.reads) {
            let balance = if self.unsynced(pos, pos + n) { Balance::Prefer } else { self.tun.balance };
            self.direct_read_piece(led, id, sector, pos, n, balance);
            self.part_done(led, id, None);
        }
        if self.behind.active() == 0 || self.fast_copy_left() {
            for id in std::mem::take(&mut self.behind.held) {
                self.finish_request(led, id);
            }
        }
        if !self.read_fixes.is_empty() {
            self.start_read_fixes(led);
        }
        self.progress_flushes(led);
    }
}
