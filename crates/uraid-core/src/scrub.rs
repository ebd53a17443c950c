//! md's scrub: `echo check|repair|idle > sync_action`, `mismatch_cnt`, `last_sync_action`.
//!
//! A scrub is a background job beside resync and recovery (`SyncKind::Scrub`): it shares
//! their queue, their barrier against requests' writes and their `sync_speed_min/max`
//! pacing. raid4/5/6 units are in `stripe::scrub`; raid1/10 units are here.
//!
//! raid1/10 count as md does: per sync bio (`r1_bio` / `r10_bio`) and per copy that
//! differs from the first copy, the bio's sectors (raid1.c `process_checks`, raid10.c
//! `sync_request_write`: `atomic64_add(r1_bio->sectors, &mddev->resync_mismatches)`).
//! A sync bio holds RESYNC_PAGES (64 KiB, 128 sectors) from where the previous one ended,
//! so bios tile the array in 128-sector windows from sector 0; raid10 also cuts them at
//! chunk ends when it has more members than near copies (raid10_sync_request), so its
//! window is min(128, chunk) sectors then. md also cuts at bitmap-chunk ends; bitmap
//! chunks are powers of two of at least 64 KiB in practice (mdadm's default is 64 MiB),
//! so that cut changes nothing and is not modelled.

use crate::api::*;
use crate::config::MemberState;
use crate::engine::Mddev;
use crate::geometry::{Extent, Level};
use crate::ledger::{IoCtx, Ledger};
use crate::sync::{DirectScrub, DirectUnit, EngineEvent, OnMismatch, SyncKind, UnitStart};

pub use crate::sync::{action_name, ScrubKind};

/// md's RESYNC_PAGES in sectors: the largest raid1/10 sync bio.
const RESYNC_BIO_SECTORS: u64 = 128;

impl Mddev {
    pub(crate) fn start_scrub(
        &mut self,
        led: &mut Ledger,
        kind: ScrubKind,
        now_ns: TimeNs,
    ) -> Result<(), String> {
        self.now_ns = self.now_ns.max(now_ns);
        if !self.pers.redundant {
            return Err(format!("{} has no redundancy to check", self.pers.name));
        }
        if self.failed {
            return Err("the array has failed".into());
        }
        if let Some(j) = self.sync.as_ref() {
            return Err(match j.kind {
                SyncKind::Scrub(k) => {
                    format!("a {} is running; stop it first (`uraid action idle`)", k.name())
                }
                other => format!(
                    "a {} is running; {} once it is done (`uraid status` shows its progress)",
                    crate::sync::mdstat_name(other),
                    kind.name()
                ),
            });
        }
        if let Some((k, _)) = self.sync_queue.front() {
            return Err(format!("a {} is owed and runs first", action_name(*k)));
        }
        if self.resync_owed() {
            return Err("a resync is owed and runs first".into());
        }
        if !self.scrub_may_run() {
            return Err(format!("the array is degraded; md does not {} a degraded array", kind.name()));
        }
        self.mismatch_cnt_sectors = 0;
        self.sync_queue.push_back((SyncKind::Scrub(kind), None));
        self.wake_sync(led);
        Ok(())
    }

    pub(crate) fn stop_scrub(&mut self, led: &mut Ledger) -> bool {
        let queued = self.sync_queue.len();
        self.sync_queue.retain(|(k, _)| !matches!(k, SyncKind::Scrub(_)));
        let mut stopped = queued != self.sync_queue.len();
        if let Some(kind) = self.sync.as_ref().map(|j| j.kind).filter(|k| matches!(k, SyncKind::Scrub(_))) {
            self.sync = None;
            self.events.push_back(EngineEvent::SyncAborted(kind));
            stopped = true;
        }
        self.wake_sync(led);
        stopped
    }

    pub(crate) fn mismatch_cnt(&self) -> u64 {
        self.mismatch_cnt_sectors
    }

    pub(crate) fn sync_action(&self) -> &'static str {
        if let Some(j) = self.sync.as_ref() {
            return action_name(j.kind);
        }
        self.sync_queue.iter().find(|(k, _)| self.sync_may_start(*k)).map_or("idle", |(k, _)| action_name(*k))
    }

    pub(crate) fn last_sync_action(&self) -> &'static str {
        self.last_sync_action
    }

    /// Every member in sync and the array alive.
    pub(crate) fn scrub_may_run(&self) -> bool {
        !self.failed && self.members.iter().all(|m| m.state == MemberState::InSync)
    }

    /// md's sync bio window for raid1/10 (see the module comment).
    fn resync_bio_sectors(&self) -> u64 {
        let near_copies = (self.geo.layout & 0xff) as usize;
        if self.geo.level == Level::Raid10 && near_copies < self.geo.raid_disks {
            RESYNC_BIO_SECTORS.min(self.geo.chunk_sectors)
        } else {
            RESYNC_BIO_SECTORS
        }
    }

    /// Array sectors [start, end) cut into pieces contiguous on every copy: (array sector,
    /// sectors, copies in md's order).
    fn sync_pieces(&self, start: u64, end: u64) -> Vec<(u64, u64, Vec<Extent>)> {
        let mut pieces = Vec::new();
        let mut pos = start;
        while pos < end {
            let room = if self.geo.level == Level::Raid1 { end - pos } else { self.geo.map_sector(pos).1 };
            let n = room.min(end - pos);
            let mut copies = Vec::new();
            self.geo.copies(pos, &mut copies);
            pieces.push((pos, n, copies));
            pos += n;
        }
        pieces
    }

    /// `sync_pieces`, cut again where a copy's listed range begins or ends: a listed copy is
    /// left out of its listed sectors only, as md ends a sync request at `first_bad`.
    fn scrub_pieces(&self, start: u64, end: u64) -> Vec<(u64, u64, Vec<Extent>)> {
        let mut out = Vec::new();
        for (pos, n, copies) in self.sync_pieces(start, end) {
            let mut cuts: Vec<u64> = copies
                .iter()
                .flat_map(|c| {
                    let m = &self.members[c.member];
                    m.bad_block_edges(c.member_sector, n).into_iter().map(move |e| e - c.member_sector)
                })
                .chain([n])
                .collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut a = 0;
            for b in cuts {
                let part =
                    copies.iter().map(|c| Extent { member_sector: c.member_sector + a, ..*c }).collect();
                out.push((pos + a, b - a, part));
                a = b;
            }
        }
        out
    }

    /// Can every copy of array sectors [start, end) be read and rewritten (in sync, none
    /// of it listed bad)? Then a resync unit compares the copies as a scrub does.
    pub(crate) fn direct_copies_whole(&self, start: u64, end: u64) -> bool {
        self.sync_pieces(start, end).iter().all(|(_, n, copies)| {
            copies.iter().all(|c| {
                let m = &self.members[c.member];
                m.state == MemberState::InSync && m.readable_range(c.member_sector, *n)
            })
        })
    }

    /// Read every copy of array sectors [start, end); the caller checked the barrier.
    pub(crate) fn start_direct_scrub(
        &mut self,
        led: &mut Ledger,
        start: u64,
        end: u64,
        kind: OnMismatch,
    ) -> UnitStart {
        let pieces = self.scrub_pieces(start, end);
        let unreadable = pieces.iter().any(|(_, n, copies)| {
            copies.iter().any(|c| !self.members[c.member].readable(c.member_sector + n - 1))
        });
        if unreadable {
            return UnitStart::Unreadable;
        }
        let bufs = pieces.iter().map(|p| vec![None; p.2.len()]).collect();
        // A copy listed bad there is not read (md's sync_request leaves it out of the
        // reads): it holds data older than what was acknowledged (see `direct_scrub_compare`).
        let ios: Vec<(usize, u64, u64, u32, u32)> = pieces
            .iter()
            .enumerate()
            .flat_map(|(i, (_, n, copies))| {
                copies
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| !self.members[e.member].has_bad_block(e.member_sector, *n))
                    .map(move |(c, e)| (e.member, e.member_sector, *n, i as u32, c as u32))
            })
            .collect();
        if ios.is_empty() {
            return UnitStart::Nothing;
        }
        let reads = ios.len() as u32;
        let scrub = Box::new(DirectScrub { kind, pieces, bufs, compared: false });
        self.direct_sync = Some(DirectUnit { start, end, pending: reads, failed: false, scrub: Some(scrub) });
        for (member, sector, n, piece, copy) in ios {
            let ctx = IoCtx::ScrubDirectRead { piece, copy };
            self.issue_io(led, member, MemberIoOp::Read, sector, n, IoBytes::new(), ctx);
        }
        UnitStart::Started
    }

    pub(crate) fn direct_scrub_io_done(
        &mut self,
        led: &mut Ledger,
        ctx: IoCtx,
        member: usize,
        result: MemberIoResult,
    ) {
        let failed = result.is_err();
        // A read error stops the unit (and the job); only a lost member or a failed write
        // fails the member.
        let fail_member =
            matches!((&ctx, &result), (IoCtx::ScrubDirectWrite, Err(_)) | (_, Err(MemberIoError::Gone)));
        if let Some(u) = self.direct_sync.as_mut() {
            u.failed |= failed;
            if let (IoCtx::ScrubDirectRead { piece, copy }, Ok(data), Some(s)) =
                (&ctx, result, u.scrub.as_mut())
            {
                s.bufs[*piece as usize][*copy as usize] = Some(data);
            }
        }
        if fail_member {
            self.fail_member(led, member, self.now_ns);
        }
        let compare = self
            .direct_sync
            .as_ref()
            .is_some_and(|u| u.pending == 1 && !u.failed && u.scrub.as_ref().is_some_and(|s| !s.compared));
        // Only a running scrub (or resync) counts; a stopped one lets its unit go.
        let running = self.sync.as_ref().and_then(|j| OnMismatch::of(j.kind)).is_some();
        if compare && running {
            self.direct_scrub_compare(led);
        }
        self.direct_sync_part_done(led);
    }

    /// All copies read: compare each md sync bio window's copies with the first (a resync:
    /// with the one reads took before it), count, and on repair or resync write that copy
    /// over the others that differ (md copies from the first copy that read). A copy
    /// listed bad there was not read: it is neither the reference nor compared; repair
    /// rewrites it from the reference unless a write failed on its member this run (md
    /// skips an acknowledged bad block on a member with WriteErrorSeen).
    fn direct_scrub_compare(&mut self, led: &mut Ledger) {
        let w = self.resync_bio_sectors();
        let u = self.direct_sync.as_mut().expect("unit");
        let (start, end) = (u.start, u.end);
        let s = u.scrub.as_mut().expect("scrub unit");
        s.compared = true;
        let copies = s.pieces.first().map_or(0, |p| p.2.len());
        let mut mismatch = 0;
        let mut writes = Vec::new();
        let mut wa = start / w * w;
        while wa < end {
            let wb = (wa + w).min(end);
            for c in 0..copies {
                let mut segs = Vec::new();
                let mut differs = false;
                for (i, (pos, n, ext)) in s.pieces.iter().enumerate() {
                    let (a, b) = ((*pos).max(wa), (pos + n).min(wb));
                    let read = |k: usize| s.bufs[i][k].is_some();
                    // A resync keeps the copy reads took before it came (`Balance::Prefer`,
                    // the lowest member); check and repair md's first copy that was read.
                    let reference = match s.kind {
                        OnMismatch::Resync => (0..copies).filter(|&k| read(k)).min_by_key(|&k| ext[k].member),
                        OnMismatch::Count | OnMismatch::Repair => (0..copies).find(|&k| read(k)),
                    };
                    let Some(reference) = reference else { continue };
                    if a >= b || c == reference {
                        continue;
                    }
                    let rg = ((a - pos) * SECTOR_BYTES) as usize..((b - pos) * SECTOR_BYTES) as usize;
                    let first = &s.bufs[i][reference].as_ref().expect("read")[rg.clone()];
                    let seg = (ext[c].member, ext[c].member_sector + (a - pos), b - a, first.to_vec());
                    match s.bufs[i][c].as_ref() {
                        Some(copy) => {
                            differs |= first != &copy[rg.clone()];
                            segs.push(seg);
                        }
                        None if s.kind != OnMismatch::Count && !self.members[seg.0].write_error_seen => {
                            writes.push(seg)
                        }
                        None => {}
                    }
                }
                if differs {
                    mismatch += wb - wa.max(start);
                    if s.kind != OnMismatch::Count {
                        writes.extend(segs);
                    }
                }
            }
            wa += w;
        }
        self.mismatch_cnt_sectors += mismatch;
        for (member, sector, n, data) in writes {
            if !self.members[member].writable() {
                continue;
            }
            self.direct_sync.as_mut().expect("unit").pending += 1;
            self.issue_io(led, member, MemberIoOp::Write, sector, n, data.into(), IoCtx::ScrubDirectWrite);
        }
    }
}
