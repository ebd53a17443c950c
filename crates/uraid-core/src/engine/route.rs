//! Issue, route, complete and flush: the engine's side of the ledger (`crate::ledger`).

use crate::api::*;
use crate::ledger::IoCtx;

use super::Engine;

impl Engine {
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

    /// Queue an I/O at absolute byte `offset_bytes` of the device in `slot` (never its
    /// replacement): metadata the engine keeps itself, the partial parity log.
    pub(crate) fn issue_raw_io(
        &mut self,
        slot: usize,
        op: MemberIoOp,
        offset_bytes: u64,
        data: IoBytes,
        ctx: IoCtx,
    ) {
        let len_sectors = data.len() as u64 / SECTOR_BYTES;
        self.push_io_at(slot, op, Some(offset_bytes), 0, len_sectors, data, ctx);
    }

    /// Queue one member I/O to engine member `member`: a slot, or a replacement.
    pub(super) fn push_io(
        &mut self,
        member: usize,
        op: MemberIoOp,
        member_sector: u64,
        len_sectors: u64,
        data: IoBytes,
        ctx: IoCtx,
    ) -> MemberIoId {
        self.push_io_at(member, op, None, member_sector, len_sectors, data, ctx)
    }

    /// `raw_offset_bytes`: an absolute device offset instead of data-relative
    /// `member_sector` (and no bad-block bookkeeping for a write there).
    #[allow(clippy::too_many_arguments)]
    fn push_io_at(
        &mut self,
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

    pub(super) fn fua_flush_done(&mut self, id: RequestId, member: usize, ok: bool) {
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

    pub(super) fn finish_request(&mut self, id: RequestId) {
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

    pub(super) fn progress_flushes(&mut self) {
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

    pub(super) fn member_flush_done(&mut self, flush: RequestId, member: usize, ok: bool) {
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

    pub(super) fn io_done(&mut self, ctx: IoCtx, member: usize, result: Result<Vec<u8>, MemberIoError>) {
        (self.pers.io_done)(self, ctx, member, result);
    }
}
