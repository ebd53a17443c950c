//! The requests and member I/Os in flight: a request's parts and read buffer, member I/O
//! issued and routed back by why it was issued, flushes and FUA that wait for the writes
//! before them.

use std::collections::{BTreeSet, VecDeque};

use crate::api::*;
use crate::detmap::DetMap;
use crate::inflight::InflightIos;
use crate::sectors::SectorMask;

/// Every request and member I/O in flight, and what waits on them. The engine's rooms (the
/// stripe machine, the direct path, the sync processes) take it as an argument: what they
/// issue and finish goes through here, and nothing else of theirs is shared through it.
#[derive(Default)]
pub(crate) struct Ledger {
    pub reqs: DetMap<RequestId, ReqState>,
    pub ios: InflightIos<InflightIo>,
    /// Member I/Os issued and not yet handed to the caller.
    pub out_ios: VecDeque<MemberIo>,
    /// Finished requests not yet handed to the caller.
    pub out_done: VecDeque<RequestCompletion>,
    next_write_seq: u64,
    /// Sequence numbers of the writes in flight (a flush waits for the ones before it).
    pub inflight_writes: BTreeSet<u64>,
    pub flushes: Vec<FlushWait>,
    /// Writes to a slot with a replacement whose twin write is still in flight, with the
    /// slot write's completion once it came (it is handled when both landed).
    pub twins: DetMap<MemberIoId, HeldCompletion>,
    /// The member range of the write whose completion is being handled (see
    /// `record_write_error`).
    pub completing_write: Option<(u64, u64)>,
    /// raid1/10 writes in flight, in array sectors, so a sync unit never overlaps one.
    pub direct_write_ranges: DetMap<RequestId, (u64, u64)>,
    /// Member I/Os of a member declared failed while they were in flight: each is answered
    /// `Gone` for whatever waits on it (`Mddev::release_gone`), and its own completion,
    /// if the device ever answers, finds nothing (md stops waiting on a Faulty rdev).
    pub gone: VecDeque<MemberIoId>,
    /// Those I/Os once answered `Gone`, by id, with their engine member, until the device
    /// answers them after all: a slot takes no other device while its old I/O may still
    /// land (md removes an rdev only once its `nr_pending` drained).
    pub late: DetMap<MemberIoId, usize>,
}

impl Ledger {
    /// Takes a checked request in: a write gets its order number; a flush waits for the
    /// writes taken in before it.
    #[inline]
    pub fn admit(&mut self, req: Request) {
        let write_seq =
            matches!(req.op, RequestOp::Write | RequestOp::Trim | RequestOp::WriteZeroes).then(|| {
                self.next_write_seq += 1;
                self.inflight_writes.insert(self.next_write_seq);
                self.next_write_seq
            });
        if req.op == RequestOp::Flush {
            self.flushes.push(FlushWait {
                req: req.id,
                seq: self.next_write_seq + 1,
                pending: None,
                error: None,
            });
            return;
        }
        let state = ReqState {
            op: req.op,
            fua: req.fua,
            buf: req.data,
            len_bytes: req.len_bytes,
            shared: None,
            parts: 1,
            error: None,
            write_seq,
            fua_flushes: None,
            gathered: Vec::new(),
        };
        self.reqs.insert(req.id, state);
    }

    /// Queues the member I/O `io` makes of its id for the caller, remembering why it went
    /// (`why`); returns the id.
    #[inline]
    pub fn issue(&mut self, why: InflightIo, io: impl FnOnce(MemberIoId) -> MemberIo) -> MemberIoId {
        let id = self.ios.insert(why);
        self.out_ios.push_back(io(id));
        id
    }

    /// Request `id` is done: its completion is queued for the caller. Returns whether it
    /// was a write (flushes waiting for it may go on), None for an unknown id.
    #[inline]
    pub fn finish(&mut self, id: RequestId) -> Option<bool> {
        let r = self.reqs.remove(&id)?;
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
        Some(write_seq.is_some())
    }

    /// Engine member `member` was declared failed: its I/Os in flight are to be answered
    /// `Gone` at once rather than waited for.
    pub fn release_member(&mut self, member: usize) {
        let ids = self.ios.ids_where(|(_, m, _, _)| *m == member);
        self.gone.extend(ids);
    }

    /// Has engine member `member` I/O in flight (a failed member's last I/O still draining)?
    pub fn member_io_in_flight(&self, member: usize) -> bool {
        self.ios.values().any(|(_, m, _, _)| *m == member) || self.late.values().any(|m| *m == member)
    }
}

/// Why a member I/O was issued; routes its completion.
#[derive(Clone, Debug)]
pub(crate) enum IoCtx {
    DirectRead {
        req: RequestId,
        array_sector: u64,
        len_sectors: u64,
        dest_off: usize,
        tried: u128,
        errored: u128,
    },
    DirectWrite {
        req: RequestId,
        array_sector: u64,
        len_sectors: u64,
    },
    /// raid1 write-behind: a copy to a write-mostly member the request did not wait for
    /// (`behind`); `write` is its place in the member's write order.
    BehindWrite {
        group: u64,
        write: u64,
    },
    /// A `DirectWrite` to a write-mostly member that waited for an overlapping behind write.
    OrderedWrite {
        write: u64,
    },
    /// raid4/5/6 read-error correction: rewrite the rows of stripe head `key` that failed
    /// to read.
    Rewrite {
        key: u64,
        rows: SectorMask,
    },
    /// raid1/10 read-error correction (see `mirror::ReadFix`): the good copy read again
    /// (`tried`: the members that failed it), then written over the copies that failed.
    FixRead {
        fix: u64,
        tried: u128,
    },
    FixWrite {
        fix: u64,
    },
    MemberFlush {
        flush: RequestId,
    },
    FuaFlush {
        req: RequestId,
    },
    /// A read of an array md left mid-reshape, at an absolute device offset (`reshape`).
    ReshapeRead {
        req: RequestId,
        len_sectors: u64,
        dest_off: usize,
    },
    BypassRead {
        req: RequestId,
        array_sector: u64,
        len_sectors: u64,
        dest_off: usize,
    },
    Fill {
        key: u64,
        rows: SectorMask,
    },
    StripeWrite {
        key: u64,
    },
    /// raid1/10 sync: read the good copy of a unit's piece. `read_errors`: the members
    /// whose copy of it failed to read already (tried again elsewhere, then rewritten).
    SyncRead {
        array_sector: u64,
        len_sectors: u64,
        read_errors: u128,
    },
    SyncWrite,
    /// raid1/10 replacement copy: a piece read from the member being replaced, or from
    /// another copy once the members in `tried` failed it (see `replace`).
    ReplaceRead {
        array_sector: u64,
        len_sectors: u64,
        tried: u128,
    },
    /// The replacement's copy of the slot write `primary` (see `replace`).
    ReplaceTwin {
        primary: MemberIoId,
    },
    /// raid4/5/6 sync: a rebuilt member block or recomputed parity of a stripe head.
    StripeSyncWrite {
        key: u64,
    },
    /// raid4/5/6 recovery of a row unit (see `row_sync`): a survivor's range, the rebuilt range.
    RowSyncRead {
        unit: u64,
    },
    RowSyncWrite {
        unit: u64,
    },
    /// raid4/5/6 check/repair of a row unit (see `stripe::scrub`): every member's range,
    /// then the rewritten pages.
    ScrubStripeRead {
        unit: u64,
    },
    ScrubStripeWrite {
        unit: u64,
    },
    /// raid1/10 check/repair (see `scrub`): copy `copy` of piece `piece`, then a rewrite.
    ScrubDirectRead {
        piece: u32,
        copy: u32,
    },
    ScrubDirectWrite,
    /// md's partial parity log (see `stripe::ppl`): the log write to `slot`'s area, its
    /// flush, and the flushes of the members a finished io_unit's batches wrote.
    PplLog {
        slot: usize,
    },
    PplLogFlush {
        slot: usize,
    },
    PplFlush {
        slot: usize,
    },
}

/// A member I/O in flight: why, which member, when issued, and the data-relative
/// (sector, len) of a write (a success there clears listed bad blocks).
pub(crate) type InflightIo = (IoCtx, usize, TimeNs, Option<(u64, u64)>);

/// A write to a slot with a replacement: its twin write to the replacement is in flight;
/// the slot write's completion, if it came first, waits here (with the write's member
/// sectors, for the bad-block log).
pub(crate) type HeldCompletion = Option<(IoCtx, usize, MemberIoResult, Option<(u64, u64)>)>;

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
