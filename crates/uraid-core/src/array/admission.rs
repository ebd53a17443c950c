//! Requests into the engine. A write waits until the superblocks say dirty and its
//! write-intent bits are durable on every working member (md's `md_write_start` and
//! `md_bitmap_startwrite`), and until a safe-mode flush that might mark the array clean is
//! answered. Requests not aligned to 512 bytes (NBD clients may send any byte range) are
//! widened (reads) or split into a sector-aligned middle and a read-modify-write of each
//! edge sector; a read-modify-write is ordered against every overlapping write, before
//! and after it, so no write landing between its read and its write-back is lost.

use super::rounds::Work;
use super::state::{AfterFlush, Array, Held, Internal, Rmw, Split, WriteInFlight, WRITE_TAG};
use crate::api::*;

pub(super) fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

pub(super) fn sector_span(offset_bytes: u64, len_bytes: u64) -> (u64, u64) {
    (offset_bytes / SECTOR_BYTES, (offset_bytes + len_bytes).div_ceil(SECTOR_BYTES))
}

impl Array {
    /// A caller's request: straight into the engine when it can go, else held or split.
    pub(super) fn admit(&mut self, req: Request) -> Result<(), SubmitError> {
        let aligned =
            req.offset_bytes.is_multiple_of(SECTOR_BYTES) && req.len_bytes.is_multiple_of(SECTOR_BYTES);
        let is_write = matches!(req.op, RequestOp::Write | RequestOp::Trim | RequestOp::WriteZeroes);
        if req.id > MAX_CALLER_REQUEST_ID {
            self.out_done.push_back(RequestCompletion { id: req.id, result: Err(RequestError::Invalid) });
            return Ok(());
        }
        if (aligned && !is_write) || (self.read_only && is_write) {
            // Reads and flushes; the engine refuses writes to a read-only array itself.
            return self.engine_submit(req);
        }
        if !self.has_room() {
            return Err(SubmitError::Busy(req));
        }
        if let Some(err) = self.refuse(&req) {
            self.out_done.push_back(RequestCompletion { id: req.id, result: Err(err) });
            return Ok(());
        }
        match req.op {
            RequestOp::Read => self.widened_read(req),
            RequestOp::Trim => {
                // Advisory: the whole sectors inside the range are discarded, the edges kept.
                let start = req.offset_bytes.div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
                let end = (req.offset_bytes + req.len_bytes) / SECTOR_BYTES * SECTOR_BYTES;
                if end <= start {
                    self.out_done.push_back(RequestCompletion { id: req.id, result: Ok(Vec::new()) });
                    return Ok(());
                }
                let mut trim = Request::trim(req.id | WRITE_TAG, start, end - start);
                trim.fua = req.fua;
                self.admit_write(trim);
            }
            _ if aligned => {
                let mut req = req;
                req.id |= WRITE_TAG;
                self.admit_write(req);
            }
            _ => self.split_write(req),
        }
        Ok(())
    }

    /// What the engine would refuse anyway, answered before any splitting.
    fn refuse(&self, req: &Request) -> Option<RequestError> {
        if self.engine.is_failed() {
            return Some(RequestError::ArrayFailed);
        }
        if req.op == RequestOp::Write && req.data.len() as u64 != req.len_bytes {
            return Some(RequestError::Invalid);
        }
        match req.offset_bytes.checked_add(req.len_bytes) {
            Some(end) if end <= self.size_bytes() => None,
            _ => Some(RequestError::OutOfRange),
        }
    }

    /// A sector-aligned write (its id tagged): counted in the bitmap now, into the engine
    /// once the superblocks say dirty and its bits are durable.
    pub(super) fn admit_write(&mut self, req: Request) {
        self.arrivals += 1;
        let held = self.write_intent(req, self.arrivals);
        if self.held.is_empty() && self.may_pass(&held) {
            self.pass(held);
        } else {
            self.held.push_back(held);
        }
    }

    /// What `req` must wait for: the superblocks marked dirty (by a round this write asks
    /// for, or one still in flight for an earlier write), its bitmap pages, the barrier of
    /// the start (bits counted from now, so the daemon leaves them alone).
    fn write_intent(&mut self, req: Request, arrival: u64) -> Held {
        self.write_generation += 1;
        let span = sector_span(req.offset_bytes, req.len_bytes);
        let intent = self.sbs.start_write(req.offset_bytes, req.len_bytes);
        self.bitmap_activity |= intent.sync_range.is_some();
        if self.sbs.mark_dirty() {
            self.dirty_seq = self.rounds.push(Work::Superblocks);
        }
        if !intent.pages.is_empty() {
            self.pages_seq = self.rounds.push(Work::BitmapPages(intent.pages));
        }
        // Its bits may have been set in memory by an earlier write whose page round is still
        // in flight: that round must be done too. A read-modify-write's write-back is put at
        // the head of the queue, ahead of that earlier write, so FIFO order does not cover it.
        let wait_seq = self.write_barrier.max(self.dirty_seq).max(self.pages_seq);
        Held { req, wait_seq, arrival, span, sync_range: intent.sync_range }
    }

    fn may_pass(&self, h: &Held) -> bool {
        !self.clean_flush
            && h.wait_seq <= self.rounds.done_seq()
            && !self.rmws.iter().any(|r| r.arrival < h.arrival && overlaps(r.span, h.span))
    }

    fn pass(&mut self, h: Held) {
        self.writes.insert(h.req.id, WriteInFlight { span: h.span, sync_range: h.sync_range });
        if self.to_engine.is_empty() {
            if let Err(SubmitError::Busy(req)) = self.engine_submit(h.req) {
                self.to_engine.push_back(req);
            }
        } else {
            self.to_engine.push_back(h.req);
        }
    }

    /// Held writes whose rounds are done go, in arrival order; then read-modify-writes that
    /// no earlier write overlaps any more start. Returns whether anything moved.
    pub(super) fn release_held(&mut self) -> bool {
        let mut moved = false;
        while self.held.front().is_some_and(|h| self.may_pass(h)) {
            let h = self.held.pop_front().expect("front");
            self.pass(h);
            moved = true;
        }
        moved | self.start_rmws()
    }

    /// A write the engine finished (`id` as the engine had it).
    pub(super) fn write_done(&mut self, id: RequestId, ok: bool) {
        let Some(w) = self.writes.remove(&id) else { return };
        if let Some(group) = self.engine.take_behind_group(id) {
            // Its write-mostly copies still fly: the bits stay counted until they land.
            if ok {
                self.behind.insert(group, w);
                return;
            }
        }
        self.end_write(w, ok);
    }

    /// The write-mostly copies of behind group `group` landed (`ok`: all of them).
    pub(super) fn behind_done(&mut self, group: u64, ok: bool) {
        if let Some(w) = self.behind.remove(&group) {
            self.end_write(w, ok);
        }
    }

    fn end_write(&mut self, w: WriteInFlight, ok: bool) {
        if w.sync_range.is_some() {
            // md's bitmap endwrite: a write that failed or ran degraded keeps its bits.
            let everywhere = ok && !self.engine.is_degraded();
            self.sbs.end_write(w.sync_range, everywhere);
            self.bitmap_activity = true;
        }
    }

    fn widened_read(&mut self, req: Request) {
        let (start, end) = sector_span(req.offset_bytes, req.len_bytes);
        let id = self.internal_id();
        let skip = (req.offset_bytes - start * SECTOR_BYTES) as usize;
        self.internal.insert(id, Internal::WidenedRead { caller: req.id, skip, len: req.len_bytes as usize });
        self.to_engine.push_back(Request::read(id, start * SECTOR_BYTES, (end - start) * SECTOR_BYTES));
    }

    /// An unaligned write or write-zeroes: the whole sectors inside as one write, each
    /// partly written edge sector by read-modify-write.
    fn split_write(&mut self, req: Request) {
        let (start, end) = sector_span(req.offset_bytes, req.len_bytes);
        let inner =
            (req.offset_bytes.div_ceil(SECTOR_BYTES), (req.offset_bytes + req.len_bytes) / SECTOR_BYTES);
        let mut edges = Vec::new();
        if inner.0 >= inner.1 {
            edges.push((start, end));
        } else {
            if start < inner.0 {
                edges.push((start, inner.0));
            }
            if inner.1 < end {
                edges.push((inner.1, end));
            }
        }
        let has_middle = inner.0 < inner.1;
        let parts = edges.len() as u32 + u32::from(has_middle);
        self.splits.insert(req.id, Split { parts_left: parts, error: None });
        let zero = req.op == RequestOp::WriteZeroes;
        if has_middle {
            let id = self.internal_id();
            self.internal.insert(id, Internal::Part { caller: req.id });
            let at = (inner.0 * SECTOR_BYTES - req.offset_bytes) as usize;
            let len = (inner.1 - inner.0) * SECTOR_BYTES;
            let mut middle = if zero {
                Request::write_zeroes(id | WRITE_TAG, inner.0 * SECTOR_BYTES, len)
            } else {
                Request::write(
                    id | WRITE_TAG,
                    inner.0 * SECTOR_BYTES,
                    req.data[at..at + len as usize].to_vec(),
                )
            };
            middle.fua = req.fua;
            self.admit_write(middle);
        }
        for span in edges {
            // The caller's bytes that fall in this edge span.
            let lo = (span.0 * SECTOR_BYTES).max(req.offset_bytes);
            let hi = (span.1 * SECTOR_BYTES).min(req.offset_bytes + req.len_bytes);
            let patch = (!zero).then(|| {
                let from = (lo - req.offset_bytes) as usize;
                req.data[from..from + (hi - lo) as usize].to_vec()
            });
            self.arrivals += 1;
            self.rmws.push(Rmw {
                arrival: self.arrivals,
                caller: req.id,
                span,
                patch_at: (lo - span.0 * SECTOR_BYTES) as usize,
                patch_len: (hi - lo) as usize,
                patch,
                fua: req.fua,
                started: false,
            });
        }
    }

    /// Starts the read of every read-modify-write that no earlier write or read-modify-write
    /// overlaps any more.
    fn start_rmws(&mut self) -> bool {
        let mut started = false;
        for i in 0..self.rmws.len() {
            let r = &self.rmws[i];
            if r.started {
                continue;
            }
            let blocked = self.writes.values().any(|w| overlaps(w.span, r.span))
                || self.held.iter().any(|h| h.arrival < r.arrival && overlaps(h.span, r.span))
                || self.rmws[..i].iter().any(|e| overlaps(e.span, r.span));
            if blocked {
                continue;
            }
            let (arrival, span) = (r.arrival, r.span);
            self.rmws[i].started = true;
            let id = self.internal_id();
            self.internal.insert(id, Internal::RmwRead { arrival });
            self.to_engine.push_back(Request::read(
                id,
                span.0 * SECTOR_BYTES,
                (span.1 - span.0) * SECTOR_BYTES,
            ));
            started = true;
        }
        started
    }

    /// A request of the array's own finished (`id` without the write tag).
    pub(super) fn internal_done(&mut self, id: RequestId, result: Result<Vec<u8>, RequestError>) {
        let Some(what) = self.internal.remove(&id) else { return };
        match what {
            Internal::Flush(after) => self.flush_done(after, result.is_ok()),
            Internal::WidenedRead { caller, skip, len } => {
                let result = result.map(|mut d| {
                    d.drain(..skip);
                    d.truncate(len);
                    d
                });
                self.out_done.push_back(RequestCompletion { id: caller, result });
            }
            Internal::Part { caller } => self.part_done(caller, result.err()),
            Internal::RmwRead { arrival } => self.rmw_read_done(arrival, result),
            Internal::RmwWrite { arrival } => {
                if let Some(i) = self.rmws.iter().position(|r| r.arrival == arrival) {
                    let r = self.rmws.remove(i);
                    self.part_done(r.caller, result.err());
                }
            }
        }
    }

    fn rmw_read_done(&mut self, arrival: u64, result: Result<Vec<u8>, RequestError>) {
        let Some(i) = self.rmws.iter().position(|r| r.arrival == arrival) else { return };
        let mut buf = match result {
            Ok(b) => b,
            Err(e) => {
                let r = self.rmws.remove(i);
                self.part_done(r.caller, Some(e));
                return;
            }
        };
        let r = &self.rmws[i];
        let patch = &mut buf[r.patch_at..r.patch_at + r.patch_len];
        match &r.patch {
            Some(p) => patch.copy_from_slice(p),
            None => patch.fill(0),
        }
        let (span, fua) = (r.span, r.fua);
        let id = self.internal_id();
        self.internal.insert(id, Internal::RmwWrite { arrival });
        let mut w = Request::write(id | WRITE_TAG, span.0 * SECTOR_BYTES, buf);
        w.fua = fua;
        // Arrival 0, first in line: the read-modify-write holds its span until this write
        // completes (no other write enters it meanwhile), so nothing is ahead of it.
        let held = self.write_intent(w, 0);
        self.held.push_front(held);
    }

    /// One part of a split request ended.
    fn part_done(&mut self, caller: RequestId, error: Option<RequestError>) {
        let Some(s) = self.splits.get_mut(&caller) else { return };
        s.parts_left -= 1;
        if s.error.is_none() {
            s.error = error;
        }
        if s.parts_left == 0 {
            let s = self.splits.remove(&caller).expect("present");
            let result = match s.error {
                Some(e) => Err(e),
                None => Ok(Vec::new()),
            };
            self.out_done.push_back(RequestCompletion { id: caller, result });
        }
    }

    /// Writes the array holds or has in the engine (safe mode waits for none).
    pub(super) fn writes_outstanding(&self) -> bool {
        !self.writes.is_empty() || !self.held.is_empty() || !self.rmws.is_empty() || !self.behind.is_empty()
    }

    /// Issues a flush of the array's own; `after` runs when it is answered.
    pub(super) fn flush_then(&mut self, after: AfterFlush) {
        let id = self.internal_id();
        self.internal.insert(id, Internal::Flush(after));
        self.to_engine.push_back(Request::flush(id));
    }
}
