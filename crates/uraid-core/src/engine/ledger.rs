//! The requests and member I/Os in flight: a request's parts and read buffer, member I/O
//! issued and routed back by why it was issued, flushes and FUA that wait for the writes
//! before them.

use crate::api::*;
use crate::stripe::IoCtx;

use super::Engine;

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

pub(crate) struct FlushWait {
    pub req: RequestId,
    /// The flush covers every write submitted before this sequence number.
    pub seq: u64,
    /// Member flushes outstanding, once issued.
    pub pending: Option<u32>,
    pub error: Option<RequestError>,
}

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
        ms.count(op, len_bytes);
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
