//! Issue, route, complete and flush: the engine's side of the ledger (`crate::ledger`).

use crate::api::*;
use crate::ledger::{IoCtx, Ledger};

use super::Mddev;

impl Mddev {
    // ---- member I/O issue ------------------------------------------------------------

    /// Queue a data I/O at data-relative `member_sector`.
    #[allow(clippy::too_many_arguments)] // a bio's fields, and the ledger it joins
    pub(crate) fn issue_io(
        &mut self,
        led: &mut Ledger,
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
        let primary = self.push_io_at(led, member, op, None, member_sector, len_sectors, data, ctx);
        if let Some(data) = twin {
            led.twins.insert(primary, None);
            let r = self.replacement_index(member);
            let twin_ctx = IoCtx::ReplaceTwin { primary };
            self.push_io_at(led, r, op, None, member_sector, len_sectors, data, twin_ctx);
        }
    }

    /// Queue an I/O at absolute byte `offset_bytes` of the device in `slot` (never its
    /// replacement): metadata the engine keeps itself, the partial parity log.
    pub(crate) fn issue_raw_io(
        &mut self,
        led: &mut Ledger,
        slot: usize,
        op: MemberIoOp,
        offset_bytes: u64,
        data: IoBytes,
        ctx: IoCtx,
    ) {
        let len_sectors = data.len() as u64 / SECTOR_BYTES;
        self.push_io_at(led, slot, op, Some(offset_bytes), 0, len_sectors, data, ctx);
    }

    /// Queue a read of `len_sectors` at absolute byte `offset_bytes` of the device in `slot`:
    /// data laid out from another data offset than the member's (a reshape's two layouts).
    pub(crate) fn issue_raw_read(
        &mut self,
        led: &mut Ledger,
        slot: usize,
        offset_bytes: u64,
        len_sectors: u64,
        ctx: IoCtx,
    ) {
        self.push_io_at(led, slot, MemberIoOp::Read, Some(offset_bytes), 0, len_sectors, IoBytes::new(), ctx);
    }

    /// Queue one member I/O to engine member `member` (a slot, or a replacement).
    /// `raw_offset_bytes`: an absolute device offset instead of data-relative
    /// `member_sector` (and no bad-block bookkeeping for a write there).
    #[allow(clippy::too_many_arguments)]
    fn push_io_at(
        &mut self,
        led: &mut Ledger,
        member: usize,
        op: MemberIoOp,
        raw_offset_bytes: Option<u64>,
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
        op.count_in(ms, len_bytes);
        let offset_bytes = match raw_offset_bytes {
            _ if op == MemberIoOp::Flush => 0,
            Some(at) => at,
            None => data_offset_bytes + member_sector * SECTOR_BYTES,
        };
        let write_range =
            (op == MemberIoOp::Write && raw_offset_bytes.is_none()).then_some((member_sector, len_sectors));
        let len_bytes = if op == MemberIoOp::Flush { 0 } else { len_bytes };
        led.issue((ctx, member, self.now_ns, write_range), |id| MemberIo {
            id,
            member: io_member,
            op,
            offset_bytes,
            len_bytes,
            data,
        })
    }

    // ---- request completion ----------------------------------------------------------

    /// A member read of `len_sectors` landed for request `req` at `dest_off`: that part is done.
    pub(crate) fn read_part_done(
        &mut self,
        led: &mut Ledger,
        req: RequestId,
        dest_off: usize,
        len_sectors: u64,
        data: Vec<u8>,
    ) {
        if let Some(r) = led.reqs.get_mut(&req) {
            r.deliver(dest_off, data, (len_sectors * SECTOR_BYTES) as usize);
        }
        self.part_done(led, req, None);
    }

    /// One part of request `id` finished (with an error, maybe).
    pub(crate) fn part_done(&mut self, led: &mut Ledger, id: RequestId, error: Option<RequestError>) {
        let Some(r) = led.reqs.get_mut(&id) else { return };
        if error.is_some() && r.error.is_none() {
            r.error = error;
        }
        r.parts = r.parts.saturating_sub(1);
        if r.parts > 0 {
            return;
        }
        if r.fua && r.error.is_none() && r.fua_flushes.is_none() && r.op != RequestOp::Read {
            let targets = self.flush_targets();
            led.reqs.get_mut(&id).expect("present").fua_flushes = Some(targets.len() as u32);
            for m in targets {
                self.issue_io(led, m, MemberIoOp::Flush, 0, 0, IoBytes::new(), IoCtx::FuaFlush { req: id });
            }
            return;
        }
        if r.fua_flushes.is_some() {
            return;
        }
        self.finish_request(led, id);
    }

    pub(super) fn fua_flush_done(&mut self, led: &mut Ledger, id: RequestId, member: usize, ok: bool) {
        if !ok {
            self.fail_member(led, member, self.now_ns);
        }
        let Some(r) = led.reqs.get_mut(&id) else { return };
        let left = r.fua_flushes.unwrap_or(1).saturating_sub(1);
        r.fua_flushes = Some(left);
        if left == 0 {
            if self.failed && r.error.is_none() {
                r.error = Some(RequestError::ArrayFailed);
            }
            self.finish_request(led, id);
        }
    }

    pub(crate) fn finish_request(&mut self, led: &mut Ledger, id: RequestId) {
        if !self.behind_finish(id) {
            return;
        }
        let finished = led.finish(id);
        self.behind_after_finish(led, id);
        if finished == Some(true) {
            self.progress_flushes(led);
            if !self.read_fixes.is_empty() {
                // A read-error fix may have waited for this write to land.
                self.start_read_fixes(led);
            }
        }
    }

    // ---- flush ------------------------------------------------------------------------

    pub(crate) fn progress_flushes(&mut self, led: &mut Ledger) {
        let oldest_write = led.inflight_writes.iter().next().copied();
        let mut i = 0;
        while i < led.flushes.len() {
            let f = &led.flushes[i];
            if let Some(err) = f.error {
                if f.pending.is_none_or(|p| p == 0) {
                    let f = led.flushes.remove(i);
                    led.out_done.push_back(RequestCompletion { id: f.req, result: Err(err) });
                    continue;
                }
            } else if f.pending.is_none() && oldest_write.is_none_or(|w| w >= f.seq) {
                let targets = self.flush_targets();
                let flush_id = f.req;
                led.flushes[i].pending = Some(targets.len() as u32);
                for m in targets {
                    self.issue_io(
                        led,
                        m,
                        MemberIoOp::Flush,
                        0,
                        0,
                        IoBytes::new(),
                        IoCtx::MemberFlush { flush: flush_id },
                    );
                }
                if led.flushes[i].pending == Some(0) {
                    let f = led.flushes.remove(i);
                    led.out_done.push_back(RequestCompletion { id: f.req, result: Ok(Vec::new()) });
                    continue;
                }
            }
            i += 1;
        }
    }

    pub(super) fn member_flush_done(&mut self, led: &mut Ledger, flush: RequestId, member: usize, ok: bool) {
        if !ok {
            self.fail_member(led, member, self.now_ns);
        }
        let Some(i) = led.flushes.iter().position(|f| f.req == flush) else { return };
        let f = &mut led.flushes[i];
        let left = f.pending.unwrap_or(1).saturating_sub(1);
        f.pending = Some(left);
        if left == 0 {
            let f = led.flushes.remove(i);
            let result = match (f.error, self.failed) {
                (Some(e), _) => Err(e),
                (None, true) => Err(RequestError::ArrayFailed),
                (None, false) => Ok(Vec::new()),
            };
            led.out_done.push_back(RequestCompletion { id: f.req, result });
        }
    }

    pub(super) fn io_done(&mut self, led: &mut Ledger, ctx: IoCtx, member: usize, result: MemberIoResult) {
        (self.pers.io_done)(self, led, ctx, member, result);
    }
}
