//! raid0, raid1 and raid10: requests become member I/Os with no stripe cache.

use crate::api::*;
use crate::engine::Mddev;
use crate::geometry::{Extent, Level};
use crate::ledger::{IoCtx, Ledger};
use crate::mirror::{choose_copy, Balance, FixPhase, ReadFix, SPLIT_SLICE_BYTES};

/// Largest single member I/O a raid1 request is cut into.
const MAX_MIRROR_IO_SECTORS: u64 = 2048;

impl Mddev {
    /// Array pieces of [sector, sector+len) that each map contiguously on every copy.
    fn direct_pieces(&self, sector: u64, len: u64) -> Vec<(u64, u64)> {
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        // raid0: where the last piece's last sector lies on its member.
        let mut last_sector_at: Option<Extent> = None;
        let mut pos = sector;
        let end = sector + len;
        while pos < end {
            let (at, room) = match self.geo.level {
                Level::Raid1 => (None, MAX_MIRROR_IO_SECTORS - pos % MAX_MIRROR_IO_SECTORS),
                _ => {
                    let (ext, room) = self.geo.map_sector(pos);
                    (Some(ext), room)
                }
            };
            let n = room.min(end - pos);
            // raid0: a chunk that continues the previous piece on the same member (a
            // one-member array, or a zone of one device) joins it, so a large request
            // there is one member I/O, and a read keeps that I/O's buffer instead of
            // zero-filling its own and copying every chunk in.
            let continues = self.geo.level == Level::Raid0
                && matches!((last_sector_at, at), (Some(a), Some(b))
                    if a.member == b.member && a.member_sector + 1 == b.member_sector);
            match pieces.last_mut() {
                Some((_, len)) if continues => *len += n,
                _ => pieces.push((pos, n)),
            }
            last_sector_at = at.map(|e| Extent { member_sector: e.member_sector + n - 1, ..e });
            pos += n;
        }
        pieces
    }

    pub(crate) fn direct_read(&mut self, led: &mut Ledger, id: RequestId, sector: u64, len: u64) {
        let mut pieces = self.direct_pieces(sector, len);
        if self.geo.level == Level::Raid1
            && self.tun.balance == Balance::Split
            && len * SECTOR_BYTES >= SPLIT_SLICE_BYTES
        {
            // Split evenly (in 4 KiB units) across the readable mirrors.
            let readable = self.members.iter().filter(|m| m.readable(sector + len - 1)).count().max(1) as u64;
            let share = len.div_ceil(readable).div_ceil(8) * 8;
            pieces = (0..readable)
                .map(|k| (sector + k * share, share.min((sector + len).saturating_sub(sector + k * share))))
                .filter(|&(_, n)| n > 0)
                .collect();
        }
        for (pos, n) in pieces {
            let balance = if self.unsynced(pos, pos + n) {
                // Not resynced yet: copies may differ, so always the copy the resync copies from.
                Balance::Prefer
            } else if self.tun.balance == Balance::Split {
                Balance::RoundRobin
            } else {
                self.tun.balance
            };
            self.direct_read_piece(led, id, sector, pos, n, balance);
        }
    }

    /// One piece of a read from one copy. When bad-block logs leave no copy clean for the
    /// whole piece, its halves are tried apart (md's read_balance shortens the read to
    /// where a copy is good); a sector no copy can serve fails the request.
    pub(crate) fn direct_read_piece(
        &mut self,
        led: &mut Ledger,
        id: RequestId,
        sector: u64,
        pos: u64,
        n: u64,
        balance: Balance,
    ) {
        let mut copies = Vec::new();
        self.geo.copies(pos, &mut copies);
        let Some(i) = choose_copy(balance, &self.members, &copies, n, 0, &mut self.rr_next, self.now_ns)
        else {
            let listed = copies.iter().any(|e| self.members[e.member].has_bad_block(e.member_sector, n));
            if listed && n > 1 {
                let half = n / 2;
                self.direct_read_piece(led, id, sector, pos, half, balance);
                self.direct_read_piece(led, id, sector, pos + half, n - half, balance);
                return;
            }
            let err = if listed { RequestError::Io } else { RequestError::ArrayFailed };
            led.reqs.get_mut(&id).expect("request").error = Some(err);
            return;
        };
        let e = copies[i];
        led.reqs.get_mut(&id).expect("request").parts += 1;
        if self.read_waits_for_behind(e.member, e.member_sector, n) {
            // md's wait_behind_writes: that copy is older than what was acknowledged.
            self.behind.reads.push((id, sector, pos, n));
            return;
        }
        let dest_off = ((pos - sector) * SECTOR_BYTES) as usize;
        let ctx = IoCtx::DirectRead {
            req: id,
            array_sector: pos,
            len_sectors: n,
            dest_off,
            tried: bit(e.member),
            errored: 0,
        };
        self.issue_io(led, e.member, MemberIoOp::Read, e.member_sector, n, IoBytes::new(), ctx);
    }

    pub(crate) fn direct_write(
        &mut self,
        led: &mut Ledger,
        id: RequestId,
        sector: u64,
        len: u64,
        zero: bool,
    ) {
        led.direct_write_ranges.insert(id, (sector, sector + len));
        if self.direct_write_blocked(sector, len) {
            // Waits for the sync unit over this range (md's barrier); one part holds it open.
            led.reqs.get_mut(&id).expect("request").parts += 1;
            self.blocked_writes.push((id, sector, len, zero));
            return;
        }
        self.direct_write_now(led, id, sector, len, zero);
    }

    pub(crate) fn direct_write_now(
        &mut self,
        led: &mut Ledger,
        id: RequestId,
        sector: u64,
        len: u64,
        zero: bool,
    ) {
        if !led.reqs.contains_key(&id) {
            return;
        }
        let mut copies = Vec::new();
        // raid1 write-behind: the write-mostly copies of this write go behind (see `behind`).
        let group = self.behind_allowed(led, id).then(|| self.behind_group(led, id));
        for (pos, n) in self.direct_pieces(sector, len) {
            self.geo.copies(pos, &mut copies);
            let src_off = ((pos - sector) * SECTOR_BYTES) as usize;
            let bytes = (n * SECTOR_BYTES) as usize;
            let targets: Vec<Extent> =
                copies.iter().copied().filter(|e| self.members[e.member].writable()).collect();
            if targets.is_empty() {
                led.reqs.get_mut(&id).expect("request").error = Some(RequestError::ArrayFailed);
                continue;
            }
            let data: IoBytes = if zero {
                vec![0u8; bytes].into()
            } else {
                let payload = led.reqs.get_mut(&id).expect("request").shared_payload();
                IoBytes::slice(&payload, src_off..src_off + bytes)
            };
            for e in targets {
                let data = data.clone();
                let ctx = IoCtx::DirectWrite { req: id, array_sector: pos, len_sectors: n };
                if self.behind.max == 0 {
                    led.reqs.get_mut(&id).expect("request").parts += 1;
                    self.issue_io(led, e.member, MemberIoOp::Write, e.member_sector, n, data, ctx);
                    continue;
                }
                let behind_group = group
                    .filter(|_| self.members[e.member].write_mostly)
                    .and_then(|g| self.behind.groups.get_mut(&g).map(|gr| (g, gr)));
                let ctx = match behind_group {
                    Some((g, gr)) => {
                        // The request does not wait for it; `data` keeps its own reference
                        // to the payload, which outlives the request.
                        gr.pending += 1;
                        IoCtx::BehindWrite { group: g, write: 0 }
                    }
                    _ => {
                        led.reqs.get_mut(&id).expect("request").parts += 1;
                        ctx
                    }
                };
                self.ordered_write(led, e.member, e.member_sector, n, data, ctx);
            }
        }
        if let Some(g) = group {
            self.behind_group_issued(g);
        }
    }

    pub(crate) fn direct_io_done(
        &mut self,
        led: &mut Ledger,
        ctx: IoCtx,
        member: usize,
        result: MemberIoResult,
    ) {
        match ctx {
            IoCtx::SyncRead { .. } | IoCtx::SyncWrite | IoCtx::ReplaceRead { .. } => {
                self.direct_sync_io_done(led, ctx, member, result)
            }
            IoCtx::ScrubDirectRead { .. } | IoCtx::ScrubDirectWrite => {
                self.direct_scrub_io_done(led, ctx, member, result)
            }
            IoCtx::FixRead { fix, tried } => self.fix_read_done(led, fix, tried, member, result),
            IoCtx::FixWrite { fix } => self.fix_write_done(led, fix, member, result),
            IoCtx::DirectRead { req, array_sector, len_sectors, dest_off, tried, errored } => match result {
                Ok(data) => {
                    if errored != 0 {
                        self.queue_read_fix(led, req, array_sector, len_sectors, errored);
                    }
                    self.read_part_done(led, req, dest_off, len_sectors, data);
                }
                Err(e) => {
                    if e == MemberIoError::Gone && self.geo.level != Level::Raid0 {
                        self.fail_member(led, member, self.now_ns);
                    }
                    let tried = tried | bit(member);
                    let errored = if e == MemberIoError::Io { errored | bit(member) } else { errored };
                    let mut copies = Vec::new();
                    self.geo.copies(array_sector, &mut copies);
                    match choose_copy(
                        Balance::Prefer,
                        &self.members,
                        &copies,
                        len_sectors,
                        tried,
                        &mut self.rr_next,
                        self.now_ns,
                    ) {
                        Some(i)
                            if !self.failed
                                && self.read_waits_for_behind(
                                    copies[i].member,
                                    copies[i].member_sector,
                                    len_sectors,
                                ) =>
                        {
                            // The copy left is older than what was acknowledged: wait for
                            // its behind write (this piece's part holds the request open).
                            let start = array_sector - dest_off as u64 / SECTOR_BYTES;
                            self.behind.reads.push((req, start, array_sector, len_sectors));
                        }
                        Some(i) if !self.failed => {
                            let c = copies[i];
                            let ctx = IoCtx::DirectRead {
                                req,
                                array_sector,
                                len_sectors,
                                dest_off,
                                tried: tried | bit(c.member),
                                errored,
                            };
                            self.issue_io(
                                led,
                                c.member,
                                MemberIoOp::Read,
                                c.member_sector,
                                len_sectors,
                                IoBytes::new(),
                                ctx,
                            );
                        }
                        _ => {
                            let err = if self.failed { RequestError::ArrayFailed } else { RequestError::Io };
                            self.part_done(led, req, Some(err));
                        }
                    }
                }
            },
            IoCtx::BehindWrite { group, write } => self.behind_write_done(led, group, write, member, result),
            IoCtx::OrderedWrite { write } => self.ordered_write_done(led, write, member, result),
            IoCtx::DirectWrite { req, array_sector, len_sectors } => {
                if result.is_err() {
                    // This copy may have been the one that let the request skip its behind copies.
                    self.behind_count_in(led, req);
                }
                if let Err(e) = result {
                    if self.geo.level == Level::Raid0 {
                        self.part_done(led, req, Some(RequestError::Io));
                        return;
                    }
                    if e == MemberIoError::Io && self.record_write_error(led, member) {
                        // md completes the write if a copy holds it; with every copy listed
                        // bad there, the data is nowhere and the write failed.
                        let held = self.some_copy_readable(array_sector, len_sectors);
                        self.part_done(led, req, (!held).then_some(RequestError::Io));
                        return;
                    }
                    self.fail_member(led, member, self.now_ns);
                }
                self.part_done(led, req, None);
            }
            _ => {}
        }
    }

    /// Can some copy of array `[sector, sector + len)` be read whole (written there and
    /// not listed bad)? Checked per sector, as a read may combine copies.
    fn some_copy_readable(&self, sector: u64, len: u64) -> bool {
        let mut copies = Vec::new();
        (sector..sector + len).all(|s| {
            self.geo.copies(s, &mut copies);
            copies.iter().any(|e| self.members[e.member].readable_range(e.member_sector, 1))
        })
    }

    /// md's read-error correction (fix_read_error): the copies in `errored` failed to read
    /// array `[sector, sector + len)`, another copy served it. The fix is queued, and the
    /// read `req` completes once it is done.
    fn queue_read_fix(&mut self, led: &mut Ledger, req: RequestId, sector: u64, len: u64, errored: u128) {
        let Some(r) = led.reqs.get_mut(&req) else { return };
        r.parts += 1;
        self.next_read_fix += 1;
        let fix = ReadFix {
            id: self.next_read_fix,
            start: sector,
            len,
            bad: errored,
            req,
            phase: FixPhase::Waiting,
        };
        self.read_fixes.push(fix);
        self.start_read_fixes(led);
    }

    /// Fixes waiting for the client writes in flight in their range start once none is
    /// (writes waiting for a barrier are not in flight). A write arriving meanwhile waits
    /// for the fix (`direct_write_blocked`), so a fix's wait ends.
    pub(crate) fn start_read_fixes(&mut self, led: &mut Ledger) {
        let ready: Vec<u64> = self
            .read_fixes
            .iter()
            .filter(|f| f.phase == FixPhase::Waiting)
            // A write-mostly copy with a behind write in flight there must not be the good
            // copy read (it is older than what was acknowledged), nor be rewritten under it.
            .filter(|f| !self.behind_write_in(f.start, f.start + f.len))
            .filter(|f| {
                !led.direct_write_ranges.iter().any(|(id, &(a, b))| {
                    f.overlaps(a, b - a) && !self.blocked_writes.iter().any(|w| w.0 == *id)
                })
            })
            .map(|f| f.id)
            .collect();
        for id in ready {
            self.fix_read(led, id, 0);
        }
    }

    fn fix_index(&self, id: u64) -> Option<usize> {
        self.read_fixes.iter().position(|f| f.id == id)
    }

    /// Reads fix `id`'s range from a copy that neither failed it nor is in `tried`; with
    /// none left, the fix gives up (the copies stay as they are, as in md).
    fn fix_read(&mut self, led: &mut Ledger, id: u64, tried: u128) {
        let Some(i) = self.fix_index(id) else { return };
        let (start, len, bad) = (self.read_fixes[i].start, self.read_fixes[i].len, self.read_fixes[i].bad);
        let mut copies = Vec::new();
        self.geo.copies(start, &mut copies);
        let pick = (!self.failed)
            .then(|| {
                choose_copy(
                    Balance::Prefer,
                    &self.members,
                    &copies,
                    len,
                    bad | tried,
                    &mut self.rr_next,
                    self.now_ns,
                )
            })
            .flatten();
        let Some(c) = pick.map(|k| copies[k]) else {
            return self.fix_done(led, id);
        };
        self.read_fixes[i].phase = FixPhase::Reading;
        let ctx = IoCtx::FixRead { fix: id, tried: tried | bit(c.member) };
        self.issue_io(led, c.member, MemberIoOp::Read, c.member_sector, len, IoBytes::new(), ctx);
    }

    fn fix_read_done(
        &mut self,
        led: &mut Ledger,
        id: u64,
        tried: u128,
        member: usize,
        result: MemberIoResult,
    ) {
        let Some(i) = self.fix_index(id) else { return };
        let data = match result {
            Ok(data) => IoBytes::from(data),
            Err(e) => {
                if e == MemberIoError::Gone {
                    self.fail_member(led, member, self.now_ns);
                } else {
                    // This copy has a latent error there too: it is fixed with the others.
                    self.read_fixes[i].bad |= bit(member);
                }
                return self.fix_read(led, id, tried);
            }
        };
        let (start, len, bad) = (self.read_fixes[i].start, self.read_fixes[i].len, self.read_fixes[i].bad);
        let mut copies = Vec::new();
        self.geo.copies(start, &mut copies);
        let targets: Vec<_> = copies
            .into_iter()
            .filter(|c| c.member < 128 && bad & bit(c.member) != 0 && self.members[c.member].writable())
            .collect();
        if targets.is_empty() {
            return self.fix_done(led, id);
        }
        self.read_fixes[i].phase = FixPhase::Writing(targets.len() as u32);
        for c in targets {
            let ctx = IoCtx::FixWrite { fix: id };
            self.issue_io(led, c.member, MemberIoOp::Write, c.member_sector, len, data.clone(), ctx);
        }
    }

    fn fix_write_done(&mut self, led: &mut Ledger, id: u64, member: usize, result: MemberIoResult) {
        if result.is_ok() {
            self.stats.read_errors_corrected += 1;
        } else if !(result == Err(MemberIoError::Io) && self.record_write_error(led, member)) {
            self.fail_member(led, member, self.now_ns);
        }
        let Some(i) = self.fix_index(id) else { return };
        if let FixPhase::Writing(left) = &mut self.read_fixes[i].phase {
            *left -= 1;
            if *left > 0 {
                return;
            }
        }
        self.fix_done(led, id);
    }

    /// Fix `id` ended: its read completes and the writes it held go.
    fn fix_done(&mut self, led: &mut Ledger, id: u64) {
        let Some(i) = self.fix_index(id) else { return };
        let fix = self.read_fixes.remove(i);
        self.part_done(led, fix.req, None);
        self.release_blocked_writes(led);
    }

    /// Writes that waited for a sync unit or a fix go, unless another still covers them.
    pub(crate) fn release_blocked_writes(&mut self, led: &mut Ledger) {
        for (id, sector, len, zero) in std::mem::take(&mut self.blocked_writes) {
            if self.direct_write_blocked(sector, len) {
                self.blocked_writes.push((id, sector, len, zero));
                continue;
            }
            self.direct_write_now(led, id, sector, len, zero);
            self.part_done(led, id, None);
        }
    }
}

pub(crate) fn bit(member: usize) -> u128 {
    if member < 128 {
        1u128 << member
    } else {
        0
    }
}
