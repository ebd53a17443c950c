//! The engine's side of write-behind (see `super`): what `Mddev` does with it.

use crate::api::*;
use crate::engine::Mddev;
use crate::ledger::{IoCtx, Ledger};
use crate::mirror::Balance;

use super::*;

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
