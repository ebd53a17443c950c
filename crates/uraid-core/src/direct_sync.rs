//! md's raid1/raid10 sync_request: background units of array sectors (recovery, resync,
//! replacement copies) read from one good copy and written to the others. Requests writing
//! into the unit in flight wait for it (md's barrier; see `direct_write_blocked`).

use crate::api::*;
use crate::engine::Mddev;
use crate::geometry::{Extent, Level};
use crate::ledger::{IoCtx, Ledger};
use crate::mirror::{choose_copy, Balance};
use crate::sync::{DirectUnit, OnMismatch, SyncKind, UnitStart};

impl Mddev {
    pub(crate) fn start_direct_sync(&mut self, led: &mut Ledger, start: u64, end: u64) -> UnitStart {
        // Behind writes too: a unit reading a write-mostly copy before its behind write
        // landed would see (and repair) a difference that is only late.
        if self.direct_sync.is_some()
            || led.direct_write_ranges.values().any(|&(a, b)| a < end && start < b)
            || self.behind_write_in(start, end)
        {
            return UnitStart::Busy;
        }
        let kind = self.sync.as_ref().expect("job").kind;
        match (kind, OnMismatch::of(kind)) {
            (SyncKind::Scrub(_), Some(mode)) => return self.start_direct_scrub(led, start, end, mode),
            // md's raid10 resync reads every copy and writes only those that differ
            // (sync_request_write); raid1's here too, so thin members stay thin. Where a
            // copy cannot be read, one good copy is read and written over the others.
            (SyncKind::Resync, Some(mode)) if self.direct_copies_whole(start, end) => {
                return self.start_direct_scrub(led, start, end, mode)
            }
            (SyncKind::Replace { slot }, _) => return self.start_direct_replace(led, slot, start, end),
            _ => {}
        }
        self.start_direct_copy(led, kind, start, end)
    }

    /// A recovery or resync unit that reads one good copy of each piece and writes it to
    /// the copies that need it.
    fn start_direct_copy(&mut self, led: &mut Ledger, kind: SyncKind, start: u64, end: u64) -> UnitStart {
        let mut copies = Vec::new();
        let mut pos = start;
        let mut reads = Vec::new();
        while pos < end {
            let room = if self.geo.level == Level::Raid1 { end - pos } else { self.geo.map_sector(pos).1 };
            let n = room.min(end - pos);
            self.geo.copies(pos, &mut copies);
            let (needs_write, exclude) = match kind {
                SyncKind::Recovery { member } => {
                    (copies.iter().any(|c| c.member == member), crate::direct::bit(member))
                }
                // Only where two copies take writes (a degraded mirror has pieces with one).
                SyncKind::Resync => {
                    (copies.iter().filter(|c| self.members[c.member].writable()).count() > 1, 0)
                }
                SyncKind::Scrub(_) => unreachable!("scrub units start in start_direct_scrub"),
                SyncKind::Replace { .. } => unreachable!("replace units start in start_direct_replace"),
            };
            if needs_write {
                match (
                    choose_copy(
                        Balance::Prefer,
                        &self.members,
                        &copies,
                        n,
                        exclude,
                        &mut self.rr_next,
                        self.now_ns,
                    ),
                    kind,
                ) {
                    (Some(i), _) => reads.push((copies[i], pos, n)),
                    // md's fix_sync_read_error: what no copy can read (listed bad on
                    // every source) is recorded bad on the member rebuilt; the rest goes on.
                    (None, SyncKind::Recovery { member }) => {
                        if !self.readable_pieces(pos, n, member, &mut reads) {
                            return UnitStart::Unreadable;
                        }
                    }
                    (None, _) => return UnitStart::Unreadable,
                }
            }
            pos += n;
        }
        self.start_direct_reads(led, start, end, reads, |array_sector, len_sectors| IoCtx::SyncRead {
            array_sector,
            len_sectors,
            read_errors: 0,
        })
    }

    /// Starts a raid1/10 sync unit's reads `(source, array sector, sectors)`, each with the
    /// context `ctx` makes of its piece.
    fn start_direct_reads(
        &mut self,
        led: &mut Ledger,
        start: u64,
        end: u64,
        reads: Vec<(Extent, u64, u64)>,
        ctx: impl Fn(u64, u64) -> IoCtx,
    ) -> UnitStart {
        if reads.is_empty() {
            return UnitStart::Nothing;
        }
        self.direct_sync =
            Some(DirectUnit { start, end, pending: reads.len() as u32, failed: false, scrub: None });
        for (src, pos, n) in reads {
            self.issue_io(
                led,
                src.member,
                MemberIoOp::Read,
                src.member_sector,
                n,
                IoBytes::new(),
                ctx(pos, n),
            );
        }
        UnitStart::Started
    }

    pub(crate) fn direct_sync_io_done(
        &mut self,
        led: &mut Ledger,
        ctx: IoCtx,
        member: usize,
        result: MemberIoResult,
    ) {
        match ctx {
            IoCtx::SyncRead { array_sector, len_sectors, read_errors } => {
                let kind = self.sync.as_ref().map(|j| j.kind);
                match result {
                    Ok(data) => {
                        let data = IoBytes::from(data);
                        let mut copies = Vec::new();
                        self.geo.copies(array_sector, &mut copies);
                        for c in copies {
                            // Copies that failed to read are rewritten from this one (md's
                            // fix_sync_read_error).
                            let target = crate::direct::bit(c.member) & read_errors != 0
                                || match kind {
                                    Some(SyncKind::Recovery { member: r }) => c.member == r,
                                    Some(SyncKind::Resync) => c.member != member,
                                    Some(SyncKind::Scrub(_) | SyncKind::Replace { .. }) | None => false,
                                };
                            if target && self.members[c.member].writable() {
                                if let Some(u) = self.direct_sync.as_mut() {
                                    u.pending += 1;
                                }
                                self.issue_io(
                                    led,
                                    c.member,
                                    MemberIoOp::Write,
                                    c.member_sector,
                                    len_sectors,
                                    data.clone(),
                                    IoCtx::SyncWrite,
                                );
                            }
                        }
                    }
                    Err(e) => {
                        // A member that is gone is failed (md_error), as a request's read
                        // or a raid4/5/6 sync read does; a latent sector error is not.
                        if e == MemberIoError::Gone {
                            self.fail_member(led, member, self.now_ns);
                        }
                        // Another in-sync copy serves the piece, as md's sync read tries
                        // every mirror before giving up.
                        let read_errors = read_errors | crate::direct::bit(member);
                        if self.retry_sync_read(led, array_sector, len_sectors, read_errors) {
                            return;
                        }
                        // No copy reads all of it: a recovery reads its halves apart, down
                        // to the sectors no copy can read, which are recorded bad on the
                        // member rebuilt (md's fix_sync_read_error); this read's part ends.
                        let recorded = match kind {
                            Some(SyncKind::Recovery { member: target }) => {
                                self.split_sync_read(led, array_sector, len_sectors, target)
                            }
                            _ => false,
                        };
                        if !recorded {
                            if let Some(u) = self.direct_sync.as_mut() {
                                u.failed = true;
                            }
                        }
                    }
                }
                self.direct_sync_part_done(led);
            }
            IoCtx::ReplaceRead { array_sector, len_sectors, tried } => {
                self.direct_replace_read_done(led, array_sector, len_sectors, tried, member, result)
            }
            IoCtx::SyncWrite => {
                if result.is_err() {
                    self.fail_member(led, member, self.now_ns);
                    if let Some(u) = self.direct_sync.as_mut() {
                        u.failed = true;
                    }
                }
                self.direct_sync_part_done(led);
            }
            _ => {}
        }
    }

    /// Reads a sync unit's piece from a copy not yet tried; false when none is left. The
    /// unit's pending count carries over to the new read.
    fn retry_sync_read(
        &mut self,
        led: &mut Ledger,
        array_sector: u64,
        len_sectors: u64,
        read_errors: u128,
    ) -> bool {
        let exclude = match self.sync.as_ref().map(|j| j.kind) {
            Some(SyncKind::Recovery { member }) => read_errors | crate::direct::bit(member),
            _ => read_errors,
        };
        let mut copies = Vec::new();
        self.geo.copies(array_sector, &mut copies);
        let Some(i) = choose_copy(
            Balance::Prefer,
            &self.members,
            &copies,
            len_sectors,
            exclude,
            &mut self.rr_next,
            self.now_ns,
        ) else {
            return false;
        };
        let src = copies[i];
        let ctx = IoCtx::SyncRead { array_sector, len_sectors, read_errors };
        self.issue_io(led, src.member, MemberIoOp::Read, src.member_sector, len_sectors, IoBytes::new(), ctx);
        true
    }

    /// The recovery of `target` over array `[pos, pos + n)`: the parts some other copy
    /// can read whole join `reads`, found by halving; each sector none can is recorded
    /// bad on `target`. False when the target's log cannot take one.
    fn readable_pieces(
        &mut self,
        pos: u64,
        n: u64,
        target: usize,
        reads: &mut Vec<(Extent, u64, u64)>,
    ) -> bool {
        let mut copies = Vec::new();
        self.geo.copies(pos, &mut copies);
        let exclude = crate::direct::bit(target);
        match choose_copy(Balance::Prefer, &self.members, &copies, n, exclude, &mut self.rr_next, self.now_ns)
        {
            Some(i) => {
                reads.push((copies[i], pos, n));
                true
            }
            None if n > 1 => {
                let half = n / 2;
                self.readable_pieces(pos, half, target, reads)
                    && self.readable_pieces(pos + half, n - half, target, reads)
            }
            None => self.record_recovery_loss(pos, n, target),
        }
    }

    /// A recovery read of array `[pos, pos + n)` failed on every copy: its halves are read
    /// apart (the unit waits for them too), a single sector is recorded bad on `target`.
    /// False when the target's log cannot take it.
    fn split_sync_read(&mut self, led: &mut Ledger, pos: u64, n: u64, target: usize) -> bool {
        if n == 1 {
            return self.record_recovery_loss(pos, n, target);
        }
        let mut reads = Vec::new();
        let half = n / 2;
        if !(self.readable_pieces(pos, half, target, &mut reads)
            && self.readable_pieces(pos + half, n - half, target, &mut reads))
        {
            return false;
        }
        for (src, at, len) in reads {
            if let Some(u) = self.direct_sync.as_mut() {
                u.pending += 1;
            }
            let ctx = IoCtx::SyncRead { array_sector: at, len_sectors: len, read_errors: 0 };
            self.issue_io(led, src.member, MemberIoOp::Read, src.member_sector, len, IoBytes::new(), ctx);
        }
        true
    }

    /// Array `[pos, pos + n)`, which no copy can supply, is recorded bad on `target`'s copy
    /// of it.
    fn record_recovery_loss(&mut self, pos: u64, n: u64, target: usize) -> bool {
        let mut copies = Vec::new();
        self.geo.copies(pos, &mut copies);
        match copies.iter().find(|c| c.member == target) {
            Some(c) => self.record_bad_block(target, c.member_sector, n),
            None => true,
        }
    }

    /// A raid1/10 replacement unit: each piece holding a copy of `slot` is read from the
    /// member (see `replace_source`) and written to the replacement.
    fn start_direct_replace(&mut self, led: &mut Ledger, slot: usize, start: u64, end: u64) -> UnitStart {
        let mut copies = Vec::new();
        let mut reads = Vec::new();
        let mut pos = start;
        while pos < end {
            let room = if self.geo.level == Level::Raid1 { end - pos } else { self.geo.map_sector(pos).1 };
            let n = room.min(end - pos);
            self.geo.copies(pos, &mut copies);
            if copies.iter().any(|c| c.member == slot) {
                match self.replace_source(slot, &copies, n, 0) {
                    Some(src) => reads.push((src, pos, n)),
                    None => return UnitStart::Unreadable,
                }
            }
            pos += n;
        }
        self.start_direct_reads(led, start, end, reads, |array_sector, len_sectors| IoCtx::ReplaceRead {
            array_sector,
            len_sectors,
            tried: 0,
        })
    }

    /// A raid1/10 replacement read came back. A failed read is tried on another copy; the
    /// good data then goes to the replacement and back over the copies that failed it
    /// (md's fix_sync_read_error). A write to the slot's member reaches the replacement
    /// too, so when the member itself failed the read, that rewrite carries the copy.
    fn direct_replace_read_done(
        &mut self,
        led: &mut Ledger,
        array_sector: u64,
        len_sectors: u64,
        tried: u128,
        member: usize,
        result: MemberIoResult,
    ) {
        let Some(SyncKind::Replace { slot }) = self.sync.as_ref().map(|j| j.kind) else {
            return self.direct_sync_part_done(led);
        };
        let mut copies = Vec::new();
        self.geo.copies(array_sector, &mut copies);
        let data = match result {
            Ok(data) => IoBytes::from(data),
            Err(e) => {
                if e == MemberIoError::Gone {
                    self.fail_member(led, member, self.now_ns);
                }
                let tried = tried | crate::direct::bit(member);
                match self.replace_source(slot, &copies, len_sectors, tried) {
                    Some(src) if self.replacements[slot].is_some() => {
                        // The unit's part count carries over to the retry.
                        let ctx = IoCtx::ReplaceRead { array_sector, len_sectors, tried };
                        self.issue_io(
                            led,
                            src.member,
                            MemberIoOp::Read,
                            src.member_sector,
                            len_sectors,
                            IoBytes::new(),
                            ctx,
                        );
                    }
                    _ => {
                        if let Some(u) = self.direct_sync.as_mut() {
                            u.failed = true;
                        }
                        self.direct_sync_part_done(led);
                    }
                }
                return;
            }
        };
        let rewrite_slot = tried & crate::direct::bit(slot) != 0 && self.members[slot].writable();
        let mut writes = Vec::new();
        for c in &copies {
            let failed_here = tried & crate::direct::bit(c.member) != 0 && self.members[c.member].writable();
            if failed_here {
                writes.push((c.member, c.member_sector));
            }
            if c.member == slot && !rewrite_slot && self.replacements[slot].is_some() {
                writes.push((self.replacement_index(slot), c.member_sector));
            }
        }
        for (target, sector) in writes {
            if let Some(u) = self.direct_sync.as_mut() {
                u.pending += 1;
            }
            if self.replacement_slot(target).is_none() {
                self.stats.read_errors_corrected += 1;
            }
            self.issue_io(
                led,
                target,
                MemberIoOp::Write,
                sector,
                len_sectors,
                data.clone(),
                IoCtx::SyncWrite,
            );
        }
        self.direct_sync_part_done(led);
    }

    pub(crate) fn direct_sync_part_done(&mut self, led: &mut Ledger) {
        let Some(u) = self.direct_sync.as_mut() else { return };
        u.pending -= 1;
        if u.pending > 0 {
            return;
        }
        let u = self.direct_sync.take().expect("unit");
        let mut ok = !u.failed;
        let resync_on =
            self.sync.as_ref().is_some_and(|j| j.kind == SyncKind::Resync && j.unit_in_flight(u.start));
        if !ok && resync_on && u.scrub.as_ref().is_some_and(|s| s.kind == OnMismatch::Resync) {
            // A copy of a comparing resync unit did not read: the unit is done again the
            // copying way, which tries each copy and rewrites those that failed (md's
            // fix_sync_read_error). Writes waiting for the unit go on waiting.
            match self.start_direct_copy(led, SyncKind::Resync, u.start, u.end) {
                UnitStart::Started => return,
                UnitStart::Nothing => ok = true,
                UnitStart::Busy | UnitStart::Unreadable => {}
            }
        }
        self.sync_unit_done(led, u.start, ok);
        // Writes that waited for this unit go now.
        self.release_blocked_writes(led);
    }

    /// Does a request writing [sector, sector+len) have to wait for the sync unit in flight
    /// or a read-error fix (see `mirror::ReadFix`)?
    pub(crate) fn direct_write_blocked(&self, sector: u64, len: u64) -> bool {
        self.direct_sync.as_ref().is_some_and(|u| u.start < sector + len && sector < u.end)
            || self.read_fixes.iter().any(|f| f.overlaps(sector, len))
    }
}
