//! raid4/5/6: the stripe cache, the stripe queue (write batching), the RMW/RCW planner,
//! degraded reconstruction and read-error correction.
//!
//! A stripe head covers `head_sectors` rows (at most one chunk, at most 64 KiB) across every
//! member. Per member it keeps a cache block mirroring what the member holds once in-flight
//! writes land (`valid` rows), new data not yet being written (`towrite`), and the batch being
//! written. Blocks hold bytes where they already are (see [`Block`]): a 4 KiB read-modify-write
//! adopts its three reads and carries the request's own bytes, so it copies nothing. Each event marks heads dirty; `run_stripes` re-analyses them, as md's
//! `handle_stripe`: serve readers, advance the write batch, start a new one when the stripe
//! queue policy says so.

use std::collections::VecDeque;

use crate::detmap::DetMap;

use std::sync::Arc;

use crate::api::*;
use crate::block::Block;
use crate::engine::Engine;
use crate::geometry::{Geometry, StripeMap};
use crate::sectors::{rows, runs, span, SectorMask};

mod row_sync;
mod scrub;

/// md's IO_THRESHOLD: delayed partial stripes start only while fewer stripes than this are
/// pre-reading.
const IO_THRESHOLD: usize = 1;
/// Largest stripe head height in sectors (64 KiB).
const MAX_HEAD_SECTORS: u64 = 128;

/// One member's rows of a stripe head, shared with the member writes that carry it (see
/// [`Block`]): a pool buffer of the full height, a member read adopted as it came, or a
/// window onto a request's payload (md's skip_copy; dropped from the cache once written).
type Buf = Block;

/// A stripe map and each member's logical data index under it, shared by every head of
/// the same residue.
type SharedMap = (Arc<StripeMap>, Arc<Vec<Option<usize>>>);

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
    /// Read-error correction: rewrite rows that failed to read (key u64::MAX = no stripe;
    /// then `req` is the read that waits for it, as md completes a read only after fixing).
    Rewrite {
        key: u64,
        rows: SectorMask,
        req: Option<RequestId>,
    },
    MemberFlush {
        flush: RequestId,
    },
    FuaFlush {
        req: RequestId,
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
}

/// Background work on one stripe head.
struct SyncOp {
    /// Member sector where the unit starts (the job's key for it).
    unit: u64,
    kind: crate::sync::SyncKind,
    writing: Option<u32>,
    /// The head was made for this unit (not cached for requests before): it is evicted as
    /// soon as the unit is done, so a rebuild streaming through the array neither pushes
    /// requests' heads out of the cache nor grows memory to the whole cache's worth.
    own_head: bool,
    /// Claimed by a row unit (`row_sync`): no batch starts here until the unit is done.
    row: bool,
    /// Row units: this head has no batch left (counted once in the unit).
    ready: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Every data row overwritten: parity from the new data alone, no reads.
    Full,
    ReadModifyWrite,
    ReconstructWrite,
}

struct ReadWaiter {
    req: RequestId,
    member: usize,
    rows: SectorMask,
    dest_off: usize,
}

struct Batch {
    data: Vec<Option<Buf>>,
    mask: Vec<SectorMask>,
    reqs: Vec<RequestId>,
    mode: WriteMode,
    span: SectorMask,
    /// None while pre-reading; Some(writes outstanding) once writing.
    writing: Option<u32>,
    counted_preread: bool,
}

pub(crate) struct Stripe {
    /// Member sector (data-relative) of row 0.
    base_sector: u64,
    /// Shared by every head whose stripe number has the same residue (see `StripeCache::maps`).
    map: Arc<StripeMap>,
    /// Role of each member: Some(logical data index) or None for P/Q.
    dd_of: Arc<Vec<Option<usize>>>,
    cache: Vec<Option<Buf>>,
    valid: Vec<SectorMask>,
    reading: Vec<SectorMask>,
    /// Rows that failed to read and await read-error correction.
    bad: Vec<SectorMask>,
    /// Rows being rewritten by read-error correction: no batch may write them meanwhile,
    /// or the older data could land last.
    rewriting: Vec<SectorMask>,
    towrite: Vec<Option<Buf>>,
    towrite_mask: Vec<SectorMask>,
    towrite_reqs: Vec<RequestId>,
    batch: Option<Batch>,
    sync: Option<SyncOp>,
    readers: Vec<ReadWaiter>,
    inflight: u32,
    delayed_until: Option<TimeNs>,
    force: bool,
    queued: bool,
    lru_stamp: u64,
}

enum Piece {
    Read { req: RequestId, key: u64, dd: usize, rows: SectorMask, dest_off: usize },
    Write { req: RequestId, key: u64, dd: usize, rows: SectorMask, src_off: usize, zero: bool },
}

impl Piece {
    fn key(&self) -> u64 {
        match self {
            Piece::Read { key, .. } | Piece::Write { key, .. } => *key,
        }
    }
}

pub(crate) struct StripeCache {
    /// Boxed so the handler's take-out/put-back moves a pointer, not the head.
    heads: DetMap<u64, Box<Stripe>>,
    /// Evicted heads kept for reuse (their vectors keep their allocations); boxed like
    /// `heads`, so reuse moves a pointer.
    #[allow(clippy::vec_box)]
    free_heads: Vec<Box<Stripe>>,
    /// Stripe maps by `stripe % map_period`: every raid4/5/6 layout's map depends only on
    /// the stripe number modulo raid_disks or raid_disks - 1, so `raid_disks * (raid_disks - 1)`
    /// covers them all. Filled on first use.
    maps: Vec<Option<SharedMap>>,
    map_period: u64,
    head_sectors: u64,
    heads_per_chunk: u64,
    full_mask: SectorMask,
    /// (stamp, key) of heads as they went idle, oldest first, for eviction. An entry is
    /// stale once its head has been used again (the head's `lru_stamp` no longer matches):
    /// stale entries are skipped, and compacted away when they outnumber the heads.
    lru: VecDeque<(u64, u64)>,
    lru_clock: u64,
    dirty: VecDeque<u64>,
    /// Pieces waiting for a stripe head (FIFO keeps writes in order).
    waiting: VecDeque<Piece>,
    delayed: Vec<u64>,
    preread_active: usize,
    bypass_count: u32,
    pool: Vec<IoBytes>,
    /// Scratch for `advance_batch` (kept to avoid allocating per call).
    scratch_mask: Vec<SectorMask>,
    scratch_needs: Vec<(usize, SectorMask)>,
    /// Emptied (data, mask, reqs) vectors of finished batches.
    #[allow(clippy::type_complexity)]
    spare_batches: Vec<(Vec<Option<Buf>>, Vec<SectorMask>, Vec<RequestId>)>,
    /// A head's height of zeroes: the absent blocks of short syndromes, and the source of
    /// zeroing write pieces (shared, never written).
    zero: IoBytes,
    running: bool,
    /// Row units of the running sync, by unit start (member sector).
    rows: DetMap<u64, row_sync::RowUnit>,
    /// Job units handed to per-head syncs, by unit start.
    heads_left: DetMap<u64, row_sync::HeadsLeft>,
    /// Check/repair units of the running scrub, by unit start (member sector).
    scrubs: DetMap<u64, scrub::ScrubUnit>,
    /// Row units' read buffers for reuse; a zeroed row for syndrome gaps (DDF layouts).
    row_pool: Vec<Vec<u8>>,
    row_zero: Vec<u8>,
}

impl StripeCache {
    pub(crate) fn new(geo: &Geometry) -> Self {
        let head_sectors = if geo.level.has_parity() { geo.chunk_sectors.min(MAX_HEAD_SECTORS) } else { 8 };
        let n = geo.raid_disks as u64;
        let map_period = if geo.level.has_parity() { n * (n - 1).max(1) } else { 1 };
        StripeCache {
            heads: DetMap::default(),
            free_heads: Vec::new(),
            maps: vec![None; map_period as usize],
            map_period,
            head_sectors,
            heads_per_chunk: if geo.level.has_parity() { geo.chunk_sectors / head_sectors } else { 1 },
            full_mask: rows(0, head_sectors),
            lru: Default::default(),
            lru_clock: 0,
            dirty: VecDeque::new(),
            waiting: VecDeque::new(),
            delayed: Vec::new(),
            preread_active: 0,
            bypass_count: 0,
            pool: Vec::new(),
            scratch_mask: Vec::new(),
            scratch_needs: Vec::new(),
            spare_batches: Vec::new(),
            zero: IoBytes::from(vec![0u8; (head_sectors * SECTOR_BYTES) as usize]),
            running: false,
            rows: DetMap::default(),
            heads_left: DetMap::default(),
            scrubs: DetMap::default(),
            row_pool: Vec::new(),
            row_zero: Vec::new(),
        }
    }

    /// A buffer of the full head height (contents unspecified).
    fn buf(&mut self) -> IoBytes {
        self.pool.pop().unwrap_or_else(|| IoBytes::from(vec![0u8; self.zero.len()]))
    }

    fn mark(&mut self, key: u64) {
        if let Some(st) = self.heads.get_mut(&key) {
            queue_head(&mut self.dirty, key, st);
        }
    }
}

/// Put head `key` on the dirty queue unless it is there already.
fn queue_head(dirty: &mut VecDeque<u64>, key: u64, st: &mut Stripe) {
    if !st.queued {
        st.queued = true;
        dirty.push_back(key);
    }
}

fn bytes(r0: u64, n: u64) -> std::ops::Range<usize> {
    (r0 * SECTOR_BYTES) as usize..((r0 + n) * SECTOR_BYTES) as usize
}

fn copy_rows(dst: &mut Block, src: &Block, mask: SectorMask) {
    for (r0, n) in runs(mask) {
        dst.rows_mut(bytes(r0, n)).copy_from_slice(src.rows(bytes(r0, n)));
    }
}

impl Stripe {
    fn idle(&self) -> bool {
        self.inflight == 0
            && self.batch.is_none()
            && self.sync.is_none()
            && self.readers.is_empty()
            && self.towrite_reqs.is_empty()
            && self.towrite_mask.iter().all(|&m| m == 0)
            && self.bad.iter().all(|&b| b == 0)
    }
}

impl Engine {
    fn head_key(&self, sector: u64) -> (u64, usize, u64, u64) {
        let (stripe, dd, off) = self.geo.parity_locate(sector);
        let h = self.cache.head_sectors;
        let key = stripe * self.cache.heads_per_chunk + off / h;
        let row = off % h;
        (key, dd, row, h - row)
    }

    /// The stripe map of `stripe` (and each member's data index), computed once per residue.
    fn cached_map(&mut self, stripe: u64) -> SharedMap {
        let slot = (stripe % self.cache.map_period) as usize;
        if let Some((map, dd_of)) = &self.cache.maps[slot] {
            debug_assert_eq!(**map, self.geo.stripe_map(stripe));
            return (map.clone(), dd_of.clone());
        }
        let map = self.geo.stripe_map(stripe);
        let mut dd_of = vec![None; self.geo.raid_disks];
        for (dd, &m) in map.data_members.iter().enumerate() {
            dd_of[m] = Some(dd);
        }
        let entry = (Arc::new(map), Arc::new(dd_of));
        self.cache.maps[slot] = Some(entry.clone());
        entry
    }

    fn new_stripe(&mut self, key: u64) -> Box<Stripe> {
        let n = self.geo.raid_disks;
        let (map, dd_of) = self.cached_map(key / self.cache.heads_per_chunk);
        let base_sector = key * self.cache.head_sectors;
        if let Some(mut st) = self.cache.free_heads.pop() {
            // Evicted heads are idle: only the per-member vectors need resetting.
            debug_assert!(st.idle() && st.cache.len() == n);
            st.base_sector = base_sector;
            st.map = map;
            st.dd_of = dd_of;
            for v in [&mut st.valid, &mut st.reading, &mut st.bad, &mut st.rewriting, &mut st.towrite_mask] {
                v.iter_mut().for_each(|m| *m = 0);
            }
            debug_assert!(st.cache.iter().chain(&st.towrite).all(Option::is_none));
            st.delayed_until = None;
            st.force = false;
            st.queued = false;
            st.lru_stamp = 0;
            return st;
        }
        Box::new(Stripe {
            base_sector,
            map,
            dd_of,
            cache: (0..n).map(|_| None).collect(),
            valid: vec![0; n],
            reading: vec![0; n],
            bad: vec![0; n],
            rewriting: vec![0; n],
            towrite: (0..n).map(|_| None).collect(),
            towrite_mask: vec![0; n],
            towrite_reqs: Vec::new(),
            batch: None,
            sync: None,
            readers: Vec::new(),
            inflight: 0,
            delayed_until: None,
            force: false,
            queued: false,
            lru_stamp: 0,
        })
    }

    /// Get the head for `key`, allocating (and evicting an idle one) if needed.
    fn get_stripe(&mut self, key: u64) -> bool {
        if let Some(st) = self.cache.heads.get_mut(&key) {
            st.lru_stamp = 0; // busy again: its LRU entry goes stale
            return true;
        }
        if self.cache.heads.len() >= self.tun.stripe_cache_size {
            let Some(victim) = self.least_recently_used() else {
                return false;
            };
            self.evict(victim);
        }
        let st = self.new_stripe(key);
        self.cache.heads.insert(key, st);
        true
    }

    /// Keep an unshared head buffer for reuse; the pool holds at most one stripe cache's
    /// worth (`stripe_cache_size` heads of every member), so memory stays bounded.
    fn recycle_buf(&mut self, b: Buf) {
        let cap = self.tun.stripe_cache_size * self.geo.raid_disks;
        if let Some(b) = b.into_sole_buffer() {
            if b.len() == self.cache.zero.len() && self.cache.pool.len() < cap {
                self.cache.pool.push(b);
            }
        }
    }

    /// Make `slot` hold at least the head's bytes `rg`: a fresh buffer of the full height,
    /// or its window widened into one.
    fn cover(&mut self, slot: &mut Option<Buf>, rg: std::ops::Range<usize>) {
        match slot {
            Some(b) if b.covers(rg) => {}
            Some(b) => b.widen_into(self.cache.buf()),
            None => *slot = Some(Block::window(0, self.cache.buf())),
        }
    }

    fn evict(&mut self, key: u64) {
        if let Some(mut st) = self.cache.heads.remove(&key) {
            for b in st.cache.iter_mut().chain(st.towrite.iter_mut()).filter_map(Option::take) {
                self.recycle_buf(b);
            }
            if self.cache.free_heads.len() < self.tun.stripe_cache_size {
                self.cache.free_heads.push(st);
            }
        }
    }

    /// Take the idle head unused longest out of the LRU order.
    fn least_recently_used(&mut self) -> Option<u64> {
        while let Some((stamp, key)) = self.cache.lru.pop_front() {
            if self.cache.heads.get(&key).is_some_and(|h| h.lru_stamp == stamp) {
                return Some(key);
            }
        }
        None
    }

    /// Put an idle head at the young end of the LRU order.
    fn mark_idle(&mut self, key: u64) {
        self.cache.lru_clock += 1;
        let stamp = self.cache.lru_clock;
        self.cache.heads.get_mut(&key).expect("idle head").lru_stamp = stamp;
        self.cache.lru.push_back((stamp, key));
        if self.cache.lru.len() > 2 * self.cache.heads.len() + 64 {
            let heads = &self.cache.heads;
            self.cache.lru.retain(|(stamp, key)| heads.get(key).is_some_and(|h| h.lru_stamp == *stamp));
        }
    }

    pub(crate) fn shrink_cache(&mut self) {
        while self.cache.heads.len() > self.tun.stripe_cache_size {
            let Some(victim) = self.least_recently_used() else { break };
            self.evict(victim);
        }
        self.run_stripes();
    }

    fn place(&mut self, piece: Piece) {
        if !self.cache.waiting.is_empty() || !self.get_stripe(piece.key()) {
            self.cache.waiting.push_back(piece);
            // Pressure: start every delayed stripe so heads free up.
            self.cache_force_all();
            return;
        }
        self.place_in_stripe(piece);
    }

    fn place_in_stripe(&mut self, piece: Piece) {
        let key = piece.key();
        let hb = self.cache.zero.len();
        match piece {
            Piece::Read { req, dd, rows, dest_off, .. } => {
                let st = self.cache.heads.get_mut(&key).expect("placed stripe");
                let member = st.map.data_members[dd];
                st.readers.push(ReadWaiter { req, member, rows, dest_off });
            }
            Piece::Write { req, dd, rows, src_off, zero, .. } => {
                let r = self.reqs.get_mut(&req).expect("request");
                let fua = r.fua;
                let (r0, n) = runs(rows).next().expect("non-empty piece");
                let rg = bytes(r0, n);
                debug_assert!(rg.end <= hb);
                // skip_copy: the piece is a window onto the payload (or onto zeroes).
                let src = if zero {
                    self.cache.zero.view(rg.clone())
                } else {
                    IoBytes::slice(&r.shared_payload(), src_off..src_off + rg.len())
                };
                let st = self.cache.heads.get_mut(&key).expect("placed stripe");
                let member = st.map.data_members[dd];
                let mut slot = st.towrite[member].take();
                if slot.is_none() {
                    slot = Some(Block::window(rg.start, src));
                } else {
                    // Joining pieces already queued: into a buffer of the full height.
                    self.cover(&mut slot, 0..hb);
                    slot.as_mut().expect("covered").rows_mut(rg).copy_from_slice(&src);
                }
                let st = self.cache.heads.get_mut(&key).expect("placed stripe");
                st.towrite[member] = slot;
                st.towrite_mask[member] |= rows;
                st.towrite_reqs.push(req);
                if fua {
                    st.force = true;
                }
            }
        }
        self.cache.mark(key);
    }

    fn parity_pieces(&self, sector: u64, len: u64) -> Vec<(u64, usize, SectorMask, u64)> {
        let mut out = Vec::new();
        let mut pos = sector;
        let end = sector + len;
        while pos < end {
            let (key, dd, row, room) = self.head_key(pos);
            let n = room.min(end - pos);
            out.push((key, dd, rows(row, row + n), pos - sector));
            pos += n;
        }
        out
    }

    pub(crate) fn stripe_read(&mut self, id: RequestId, sector: u64, len: u64) {
        let optimal = self.members.iter().all(|m| matches!(m.state, crate::config::MemberState::InSync));
        // md since 4.1 bypasses only on an optimal array (seed 001); the old behaviour, bypass
        // whenever the target member can serve the read, stays available to measure.
        let allowed = optimal || self.tun.degraded_read_bypass;
        if !(self.tun.aligned_read_bypass && allowed) {
            self.stripe_read_via_cache(id, sector, len, 0);
            return;
        }
        // md's chunk_aligned_read splits a read at chunk boundaries and sends each piece
        // straight to its member when it can; a piece it cannot goes through the cache.
        let chunk = self.geo.chunk_sectors;
        let end = sector + len;
        let mut pos = sector;
        while pos < end {
            let n = ((pos / chunk + 1) * chunk).min(end) - pos;
            let dest_off = ((pos - sector) * SECTOR_BYTES) as usize;
            if !self.bypass_read(id, pos, n, dest_off) {
                self.stripe_read_via_cache(id, pos, n, dest_off);
            }
            pos += n;
        }
    }

    /// Reads `len` sectors inside one chunk straight from the member holding them (md's
    /// raid5_read_one_chunk), if that member can serve them and the cache holds nothing
    /// newer for them. Returns whether it did.
    fn bypass_read(&mut self, id: RequestId, sector: u64, len: u64, dest_off: usize) -> bool {
        let (key, ..) = self.head_key(sector);
        let (key_end, ..) = self.head_key(sector + len - 1);
        let (ext, _) = self.geo.map_sector(sector);
        let target_ok = self.members[ext.member].readable_range(ext.member_sector, len);
        // A cached head may be bypassed only while nothing is queued or being written in it:
        // then the member holds what the cache holds.
        let quiet = |k: u64| {
            self.cache.heads.get(&k).is_none_or(|h| {
                h.batch.is_none() && h.sync.is_none() && h.towrite_mask.iter().all(|&m| m == 0)
            })
        };
        if !target_ok || !(key..=key_end).all(quiet) {
            return false;
        }
        self.stats.aligned_read_bypass += 1;
        self.reqs.get_mut(&id).expect("request").parts += 1;
        let ctx = IoCtx::BypassRead { req: id, array_sector: sector, len_sectors: len, dest_off };
        self.issue_io(ext.member, MemberIoOp::Read, ext.member_sector, len, IoBytes::new(), ctx);
        true
    }

    fn stripe_read_via_cache(&mut self, id: RequestId, sector: u64, len: u64, dest_base: usize) {
        for (key, dd, rows, rel) in self.parity_pieces(sector, len) {
            self.reqs.get_mut(&id).expect("request").parts += 1;
            let dest_off = dest_base + (rel * SECTOR_BYTES) as usize;
            self.place(Piece::Read { req: id, key, dd, rows, dest_off });
        }
        self.run_stripes();
    }

    pub(crate) fn stripe_write(&mut self, id: RequestId, sector: u64, len: u64, zero: bool) {
        for (key, dd, rows, rel) in self.parity_pieces(sector, len) {
            self.reqs.get_mut(&id).expect("request").parts += 1;
            let src_off = (rel * SECTOR_BYTES) as usize;
            self.place(Piece::Write { req: id, key, dd, rows, src_off, zero });
        }
        self.run_stripes();
    }

    // ---- stripe queue policy ------------------------------------------------------------

    pub(crate) fn cache_force_all(&mut self) {
        let keys: Vec<u64> = std::mem::take(&mut self.cache.delayed);
        for key in keys {
            if let Some(st) = self.cache.heads.get_mut(&key) {
                st.force = true;
                st.delayed_until = None;
            }
            self.cache.mark(key);
        }
        let keys: Vec<u64> = self
            .cache
            .heads
            .iter()
            .filter(|(_, st)| st.towrite_mask.iter().any(|&m| m != 0))
            .map(|(&k, _)| k)
            .collect();
        for key in keys {
            self.cache.heads.get_mut(&key).expect("head").force = true;
            self.cache.mark(key);
        }
    }

    fn activate_delayed(&mut self, now: Option<TimeNs>) {
        let keys = std::mem::take(&mut self.cache.delayed);
        for key in keys {
            let Some(st) = self.cache.heads.get_mut(&key) else { continue };
            let due = match (now, st.delayed_until) {
                (None, _) => true,
                (Some(t), Some(d)) => d <= t,
                (Some(_), None) => true,
            };
            if due {
                st.force = true;
                st.delayed_until = None;
                self.cache.mark(key);
            } else {
                self.cache.delayed.push(key);
            }
        }
    }

    pub(crate) fn cache_unplug(&mut self) {
        if self.cache.preread_active < IO_THRESHOLD {
            self.activate_delayed(None);
        }
        self.run_stripes();
    }

    pub(crate) fn cache_next_deadline(&self) -> Option<TimeNs> {
        self.cache.delayed.iter().filter_map(|k| self.cache.heads.get(k)?.delayed_until).min()
    }

    pub(crate) fn cache_tick(&mut self) {
        self.activate_delayed(Some(self.now_ns));
        self.run_stripes();
    }

    /// A member or the whole array failed: every head re-analyses what it can still do.
    pub(crate) fn cache_rehandle_all(&mut self) {
        let keys: Vec<u64> = self.cache.heads.keys().copied().collect();
        for k in keys {
            self.cache.mark(k);
        }
        self.run_stripes();
    }

    // ---- the handler ---------------------------------------------------------------------

    /// Re-analyse every head marked dirty until nothing changes.
    pub(crate) fn run_stripes(&mut self) {
        if self.cache.running {
            return; // the outer loop picks up what this call would do
        }
        self.cache.running = true;
        loop {
            while let Some(key) = self.cache.dirty.pop_front() {
                let Some(mut st) = self.cache.heads.remove(&key) else { continue };
                st.queued = false;
                self.handle_stripe(key, &mut st);
                let idle = st.idle();
                self.cache.heads.insert(key, st);
                if idle {
                    self.mark_idle(key);
                }
            }
            // Heads may have freed up: place waiting pieces in order.
            let mut placed = false;
            while let Some(piece) = self.cache.waiting.front() {
                if !self.get_stripe(piece.key()) {
                    break;
                }
                let piece = self.cache.waiting.pop_front().expect("front");
                self.place_in_stripe(piece);
                placed = true;
            }
            if !placed && self.cache.dirty.is_empty() {
                break;
            }
        }
        self.cache.running = false;
    }

    fn handle_stripe(&mut self, key: u64, st: &mut Stripe) {
        if self.failed {
            for r in std::mem::take(&mut st.readers) {
                self.part_done(r.req, Some(RequestError::ArrayFailed));
            }
            for req in std::mem::take(&mut st.towrite_reqs) {
                self.part_done(req, Some(RequestError::ArrayFailed));
            }
            st.towrite_mask.iter_mut().for_each(|m| *m = 0);
            if st.sync.as_ref().is_some_and(|s| s.row) {
                self.row_head_failed(key, st);
            }
            if st.sync.as_ref().is_some_and(|s| s.writing.is_none()) {
                let op = st.sync.take().expect("sync");
                self.head_sync_done(op.unit, false);
            }
            if st.batch.as_ref().is_some_and(|b| b.writing.is_none()) {
                let b = st.batch.take().expect("batch");
                if b.counted_preread {
                    self.cache.preread_active -= 1;
                }
                for req in b.reqs {
                    self.part_done(req, Some(RequestError::ArrayFailed));
                }
            }
            return;
        }
        self.serve_readers(key, st);
        if st.batch.is_some() {
            self.advance_batch(key, st);
        }
        if st.batch.is_none() && st.sync.is_some() {
            self.advance_sync(key, st);
        }
        let sync_writing = st.sync.as_ref().is_some_and(|s| s.writing.is_some());
        if st.batch.is_none() && !sync_writing && st.towrite_mask.iter().any(|&m| m != 0) {
            let full = st.map.data_members.iter().all(|&m| st.towrite_mask[m] == self.cache.full_mask);
            if full || !self.tun.write_batching || st.force {
                if full && !self.cache.delayed.is_empty() {
                    // md's preread_bypass_threshold: full stripes may pass delayed ones only so often.
                    self.cache.bypass_count += 1;
                    if self.cache.bypass_count > self.tun.preread_bypass_threshold {
                        self.cache.bypass_count = 0;
                        self.activate_delayed(None);
                    }
                }
                self.start_batch(st);
                self.advance_batch(key, st);
            } else if st.delayed_until.is_none() {
                st.delayed_until = Some(self.now_ns + self.tun.stripe_batch_deadline_ns);
                // It starts at the caller's next unplug if nothing is pre-reading, or at the deadline.
                self.cache.delayed.push(key);
            }
        }
    }

    fn serve_readers(&mut self, key: u64, st: &mut Stripe) {
        let mut i = 0;
        while i < st.readers.len() {
            let r = &st.readers[i];
            let (member, want) = (r.member, r.rows);
            // Once the batch is writing, its rows are in the cache (and its buffers recycled).
            let batch_mask = st.batch.as_ref().filter(|b| b.writing.is_none()).map_or(0, |b| b.mask[member]);
            let from_cache = want & !st.towrite_mask[member] & !batch_mask;
            match self.ensure(key, st, member, from_cache) {
                Ensure::Pending => i += 1,
                Ensure::Lost => {
                    let r = st.readers.swap_remove(i);
                    self.part_done(r.req, Some(RequestError::Io));
                }
                Ensure::Ready => {
                    let r = st.readers.swap_remove(i);
                    if from_cache == want {
                        self.stats.stripe_cache_hits += 1;
                    }
                    if let Some(req) = self.reqs.get_mut(&r.req) {
                        let (r0, n) = runs(want).next().expect("non-empty");
                        let dest =
                            &mut req.read_target()[r.dest_off..r.dest_off + (n * SECTOR_BYTES) as usize];
                        let shift = |src: &Block, mask: SectorMask, dest: &mut [u8]| {
                            for (a, len) in runs(mask & want) {
                                let off = ((a - r0) * SECTOR_BYTES) as usize;
                                dest[off..off + (len * SECTOR_BYTES) as usize]
                                    .copy_from_slice(src.rows(bytes(a, len)));
                            }
                        };
                        if from_cache != 0 {
                            shift(st.cache[member].as_ref().expect("valid cache"), from_cache, dest);
                        }
                        if let Some(b) = &st.batch {
                            if let Some(buf) = &b.data[member] {
                                shift(buf, batch_mask, dest);
                            }
                        }
                        if let Some(buf) = &st.towrite[member] {
                            shift(buf, st.towrite_mask[member], dest);
                        }
                    }
                    self.part_done(r.req, None);
                }
            }
        }
    }

    /// Make `need` rows of `member` valid in the cache: read them, or reconstruct them when
    /// the member cannot be read there.
    fn ensure(&mut self, key: u64, st: &mut Stripe, member: usize, need: SectorMask) -> Ensure {
        let missing = need & !st.valid[member];
        if missing == 0 {
            return Ensure::Ready;
        }
        if self.readable_rows(st, member, missing) {
            self.fill(key, st, member, missing);
            return Ensure::Pending;
        }
        self.reconstruct(key, st, missing)
    }

    fn readable_rows(&self, st: &Stripe, member: usize, rows_wanted: SectorMask) -> bool {
        let hi = 128 - rows_wanted.leading_zeros() as u64;
        st.bad[member] & rows_wanted == 0
            && self.members[member].readable(st.base_sector + hi.saturating_sub(1))
            && self.listed_bad_rows(st, member, rows_wanted) == 0
    }

    /// The rows of `rows_wanted` in `member`'s bad-block log: never read (md's
    /// analyse_stripe treats the block as not in sync), rebuilt from the others instead.
    fn listed_bad_rows(&self, st: &Stripe, member: usize, rows_wanted: SectorMask) -> SectorMask {
        let m = &self.members[member];
        if m.bad_blocks.as_ref().is_none_or(|bb| bb.is_empty()) {
            return 0;
        }
        let mut bad = 0;
        for (r0, n) in runs(rows_wanted) {
            if m.has_bad_block(st.base_sector + r0, n) {
                for r in r0..r0 + n {
                    if m.has_bad_block(st.base_sector + r, 1) {
                        bad |= rows(r, r + 1);
                    }
                }
            }
        }
        bad
    }

    fn fill(&mut self, key: u64, st: &mut Stripe, member: usize, missing: SectorMask) {
        let to_read = missing & !st.reading[member];
        if to_read == 0 {
            return;
        }
        if to_read == self.cache.full_mask && st.valid[member] == 0 {
            // A whole head into a slot holding nothing: hand the executor a buffer to read
            // into (the slot's, or a pooled one) rather than making it allocate one; the
            // completion adopts it as the cache (see `stripe_io_done`).
            let head_bytes = self.cache.zero.len();
            let spare = st.cache[member]
                .take()
                .and_then(Block::into_sole_buffer)
                .filter(|b| b.len() == head_bytes)
                .unwrap_or_else(|| self.cache.buf());
            st.reading[member] |= to_read;
            st.inflight += 1;
            let ctx = IoCtx::Fill { key, rows: to_read };
            self.issue_io(member, MemberIoOp::Read, st.base_sector, self.cache.head_sectors, spare, ctx);
            return;
        }
        for (r0, n) in runs(to_read) {
            st.reading[member] |= rows(r0, r0 + n);
            st.inflight += 1;
            let ctx = IoCtx::Fill { key, rows: rows(r0, r0 + n) };
            self.issue_io(member, MemberIoOp::Read, st.base_sector + r0, n, IoBytes::new(), ctx);
        }
    }

    /// Rebuild `want` rows of every member that cannot supply them from the others.
    fn reconstruct(&mut self, key: u64, st: &mut Stripe, want: SectorMask) -> Ensure {
        let n = self.geo.raid_disks;
        let lost: Vec<usize> = (0..n)
            .filter(|&o| want & !st.valid[o] != 0 && !self.readable_rows(st, o, want & !st.valid[o]))
            .collect();
        if lost.len() > self.geo.level.parity_disks() {
            return Ensure::Lost;
        }
        // A lost member's other rows may still be being read (the halves of a failed fill):
        // wait for them, so every row that fails is known and rewritten below, not only the
        // first (`uraid sim --seed 9936` left latent sectors under rebuilt parity).
        let mut pending = lost.iter().any(|&o| st.reading[o] & want != 0);
        for o in 0..n {
            if !lost.contains(&o) && want & !st.valid[o] != 0 {
                self.fill(key, st, o, want & !st.valid[o]);
                pending = true;
            }
        }
        if pending {
            return Ensure::Pending;
        }
        let head_bytes = self.cache.zero.len();
        for &o in &lost {
            self.cover(&mut st.cache[o], 0..head_bytes);
        }
        // Row by row, only the members that lack the row are solved for: a member lost
        // for some rows (a latent sector) keeps the rows it read, which take part as known
        // data (md rebuilds only the failed blocks). Solving it everywhere put a stale
        // stripe's reconstruction over good rows that are never written back, so parity
        // computed later disagreed with the member (`uraid sim --seed 9936`).
        let mut r = 0;
        while r < 128 {
            if want & rows(r, r + 1) == 0 {
                r += 1;
                continue;
            }
            let lacking = |r: u64| -> Vec<usize> {
                lost.iter().copied().filter(|&o| st.valid[o] & rows(r, r + 1) == 0).collect()
            };
            let here = lacking(r);
            let mut end = r + 1;
            while end < 128 && want & rows(end, end + 1) != 0 && lacking(end) == here {
                end += 1;
            }
            if !here.is_empty() {
                self.compute_lost(st, &here, bytes(r, end - r));
            }
            r = end;
        }
        self.stats.degraded_reads += 1;
        for &o in &lost {
            st.valid[o] |= want;
            // md's read-error correction: a readable member that failed these rows gets them back;
            // so do its listed rows unless a write failed there this run (md's R5_ReadError
            // without WriteErrorSeen). The rewrite clears them from the log as it lands.
            let mut bad = st.bad[o] & want;
            if !self.members[o].write_error_seen {
                bad |= self.listed_bad_rows(st, o, want);
            }
            if bad != 0 && self.members[o].writable() {
                for (r0, n) in runs(bad) {
                    let data = st.cache[o].as_ref().expect("rebuilt").view(bytes(r0, n));
                    st.inflight += 1;
                    st.rewriting[o] |= rows(r0, r0 + n);
                    let ctx = IoCtx::Rewrite { key, rows: rows(r0, r0 + n), req: None };
                    self.issue_io(o, MemberIoOp::Write, st.base_sector + r0, n, data, ctx);
                }
            }
        }
        Ensure::Ready
    }

    /// Compute the byte range `rg` of the `lost` members from the others (all valid there).
    fn compute_lost(&self, st: &mut Stripe, lost: &[usize], rg: std::ops::Range<usize>) {
        let map = &st.map;
        let pd = map.pd_idx;
        let qd = map.qd_idx;
        let lost_data: Vec<usize> = lost.iter().copied().filter(|&m| st.dd_of[m].is_some()).collect();
        let mut outs: Vec<(usize, Buf)> =
            lost_data.iter().map(|&m| (m, st.cache[m].take().expect("allocated"))).collect();
        {
            let mut outs: Vec<(usize, &mut [u8])> =
                outs.iter_mut().map(|(m, b)| (*m, b.rows_mut(rg.clone()))).collect();
            let zero = &self.cache.zero[..rg.len()];
            let mut slots: Vec<&[u8]> = vec![zero; map.syndrome_disks];
            for (dd, &m) in map.data_members.iter().enumerate() {
                if let Some(b) = &st.cache[m] {
                    slots[map.syndrome_slot[dd]] = b.rows(rg.clone());
                } else {
                    slots[map.syndrome_slot[dd]] = &[];
                }
            }
            let slot_of = |m: usize| map.syndrome_slot[st.dd_of[m].expect("data member")];
            let p = st.cache[pd].as_ref().filter(|_| !lost.contains(&pd)).map(|b| b.rows(rg.clone()));
            let q = qd
                .and_then(|q| st.cache[q].as_ref().filter(|_| !lost.contains(&q)))
                .map(|b| b.rows(rg.clone()));
            match outs.as_mut_slice() {
                [] => {}
                [(a, out)] => {
                    if let Some(p) = p {
                        uraid_parity::recover_data_from_p(&slots, slot_of(*a), p, out);
                    } else {
                        let q = q.expect("Q survives when P is lost with one data block");
                        uraid_parity::recover_data_from_q(&slots, slot_of(*a), q, out);
                    }
                }
                [(a, out_a), (b, out_b)] => {
                    let (p, q) = (p.expect("P survives"), q.expect("Q survives"));
                    uraid_parity::recover_2data(&slots, slot_of(*a), slot_of(*b), p, q, out_a, out_b);
                }
                _ => unreachable!("at most two members are rebuilt"),
            }
        }
        for (m, b) in outs {
            st.cache[m] = Some(b);
        }
        let p_lost = lost.contains(&pd);
        let q_lost = qd.is_some_and(|q| lost.contains(&q));
        if p_lost || q_lost {
            self.compute_parity(st, rg, p_lost, q_lost);
        }
    }

    /// Recompute P and/or Q over byte range `rg` from the data blocks (all valid there).
    fn compute_parity(&self, st: &mut Stripe, rg: std::ops::Range<usize>, want_p: bool, want_q: bool) {
        let map = &st.map;
        let mut p = st.cache[map.pd_idx].take();
        let mut q = map.qd_idx.and_then(|q| st.cache[q].take());
        {
            let zero = &self.cache.zero[..rg.len()];
            let mut slots: Vec<&[u8]> = vec![zero; map.syndrome_disks];
            for (dd, &m) in map.data_members.iter().enumerate() {
                slots[map.syndrome_slot[dd]] = st.cache[m].as_ref().expect("data valid").rows(rg.clone());
            }
            match q.as_mut() {
                Some(q) if want_q => {
                    let q = q.rows_mut(rg.clone());
                    if want_p {
                        uraid_parity::gen_syndrome(&slots, p.as_mut().expect("P buffer").rows_mut(rg), q);
                    } else {
                        let mut tmp = vec![0u8; rg.len()];
                        uraid_parity::gen_syndrome(&slots, &mut tmp, q);
                    }
                }
                _ => uraid_parity::xor_gen(&slots, p.as_mut().expect("P buffer").rows_mut(rg)),
            }
        }
        st.cache[map.pd_idx] = p;
        if let Some(qd) = map.qd_idx {
            st.cache[qd] = q;
        }
    }

    // ---- writes -------------------------------------------------------------------------

    /// Choose how to write the queued data: full stripe, read-modify-write or reconstruct-write.
    pub(crate) fn plan_write_mode(&self, st: &Stripe, mask: &[SectorMask]) -> WriteMode {
        let full = st.map.data_members.iter().all(|&m| mask[m] == self.cache.full_mask);
        if full {
            return WriteMode::Full;
        }
        let sp = span(mask.iter().fold(0, |a, &m| a | m));
        let parity = || std::iter::once(st.map.pd_idx).chain(st.map.qd_idx);
        let written = || st.map.data_members.iter().copied().filter(|&m| mask[m] != 0);
        let rmw_possible = written()
            .all(|m| self.readable_rows(st, m, mask[m] & !st.valid[m]) || mask[m] & !st.valid[m] == 0)
            && parity().all(|p| self.readable_rows(st, p, sp & !st.valid[p]) || sp & !st.valid[p] == 0);
        let count = |m: usize, need: SectorMask| (need & !st.valid[m]).count_ones() as u64;
        let rmw_cost: u64 =
            written().map(|m| count(m, mask[m])).sum::<u64>() + parity().map(|p| count(p, sp)).sum::<u64>();
        let mut rcw_cost = 0u64;
        let mut rcw_needs_rebuild = false;
        for &m in &st.map.data_members {
            let need = sp & !mask[m] & !st.valid[m];
            if need != 0 && !self.readable_rows(st, m, need) {
                rcw_needs_rebuild = true;
            }
            rcw_cost += need.count_ones() as u64;
        }
        // Parity not resynced yet may not match the data: rebuild it from the data (md's
        // handle_stripe_dirtying past recovery_cp), unless a member must be rebuilt for that.
        let head_end = st.base_sector + self.cache.head_sectors;
        if !rcw_needs_rebuild && self.unsynced(st.base_sector, head_end) {
            return WriteMode::ReconstructWrite;
        }
        let prefer_rmw = match self.tun.rmw_level {
            0 => false,
            1 => rmw_cost < rcw_cost,
            _ => rmw_cost <= rcw_cost,
        };
        if rmw_possible && (prefer_rmw || rcw_needs_rebuild) {
            WriteMode::ReadModifyWrite
        } else {
            WriteMode::ReconstructWrite
        }
    }

    fn start_batch(&mut self, st: &mut Stripe) {
        let n = self.geo.raid_disks;
        // Fresh (empty) vectors for the next gathering, recycled from finished batches.
        let spare = self.cache.spare_batches.pop();
        let (fresh_data, fresh_mask, fresh_reqs) =
            spare.unwrap_or_else(|| ((0..n).map(|_| None).collect(), vec![0; n], Vec::new()));
        let data = std::mem::replace(&mut st.towrite, fresh_data);
        let mask = std::mem::replace(&mut st.towrite_mask, fresh_mask);
        let reqs = std::mem::replace(&mut st.towrite_reqs, fresh_reqs);
        let mode = self.plan_write_mode(st, &mask);
        match mode {
            WriteMode::Full => self.stats.full_stripe_writes += 1,
            WriteMode::ReadModifyWrite => self.stats.rmw_writes += 1,
            WriteMode::ReconstructWrite => self.stats.rcw_writes += 1,
        }
        let sp = if mode == WriteMode::Full {
            self.cache.full_mask
        } else {
            span(mask.iter().fold(0, |a, &m| a | m))
        };
        st.batch = Some(Batch { data, mask, reqs, mode, span: sp, writing: None, counted_preread: false });
        st.force = false;
        if st.delayed_until.take().is_some() {
            self.cache.delayed.retain(|&k| k != st.base_sector / self.cache.head_sectors);
        }
    }

    fn advance_batch(&mut self, key: u64, st: &mut Stripe) {
        let Some(b) = st.batch.as_ref() else { return };
        if b.writing.is_some() {
            return;
        }
        // Scratch vectors kept by the cache, so no allocation per call.
        let mut mask = std::mem::take(&mut self.cache.scratch_mask);
        let mut needs = std::mem::take(&mut self.cache.scratch_needs);
        mask.clone_from(&b.mask);
        needs.clear();
        self.advance_batch_with(key, st, &mask, &mut needs);
        self.cache.scratch_mask = mask;
        self.cache.scratch_needs = needs;
    }

    fn advance_batch_with(
        &mut self,
        key: u64,
        st: &mut Stripe,
        mask: &[SectorMask],
        needs: &mut Vec<(usize, SectorMask)>,
    ) {
        let b = st.batch.as_ref().expect("batch");
        let (mode, sp) = (b.mode, b.span);
        // Pre-read what the mode needs.
        match mode {
            WriteMode::Full => {}
            WriteMode::ReadModifyWrite => {
                for &m in &st.map.data_members {
                    if mask[m] != 0 {
                        needs.push((m, mask[m]));
                    }
                }
                needs.push((st.map.pd_idx, sp));
                if let Some(q) = st.map.qd_idx {
                    needs.push((q, sp));
                }
            }
            WriteMode::ReconstructWrite => {
                for &m in &st.map.data_members {
                    needs.push((m, sp & !mask[m]));
                }
            }
        }
        let mut ready = true;
        for &(m, need) in needs.iter() {
            match self.ensure(key, st, m, need) {
                Ensure::Ready => {}
                Ensure::Pending => ready = false,
                Ensure::Lost => {
                    let b = st.batch.take().expect("batch");
                    if b.counted_preread {
                        self.cache.preread_active -= 1;
                    }
                    for req in b.reqs {
                        self.part_done(req, Some(RequestError::Io));
                    }
                    return;
                }
            }
        }
        if !ready {
            let b = st.batch.as_mut().expect("batch");
            if !b.counted_preread {
                b.counted_preread = true;
                self.cache.preread_active += 1;
            }
            return;
        }
        let write_rows = |m: usize| if st.dd_of[m].is_some() { mask[m] } else { sp };
        if (0..self.geo.raid_disks).any(|m| st.rewriting[m] & write_rows(m) != 0) {
            return; // the rewrite's completion marks the stripe again
        }
        let mut b = st.batch.take().expect("batch");
        if b.counted_preread {
            b.counted_preread = false;
            self.cache.preread_active -= 1;
            if self.cache.preread_active < IO_THRESHOLD {
                self.activate_delayed(None);
            }
        }
        self.compute_batch(st, &mut b);
        // Issue the writes.
        let mut writes = 0u32;
        needs.clear();
        needs.extend(
            st.map
                .data_members
                .iter()
                .map(|&m| (m, mask[m]))
                .chain(std::iter::once((st.map.pd_idx, sp)))
                .chain(st.map.qd_idx.map(|q| (q, sp))),
        );
        for &(m, rws) in needs.iter() {
            if rws == 0 || !self.members[m].writable() {
                continue;
            }
            // A write remaps latent sectors: rows that failed to read are readable again.
            st.bad[m] &= !rws;
            for (r0, n) in runs(rws) {
                let data = st.cache[m].as_ref().expect("written rows cached").view(bytes(r0, n));
                writes += 1;
                st.inflight += 1;
                self.issue_io(m, MemberIoOp::Write, st.base_sector + r0, n, data, IoCtx::StripeWrite { key });
            }
        }
        for buf in b.data.iter_mut().filter_map(Option::take) {
            self.recycle_buf(buf);
        }
        b.writing = Some(writes);
        st.batch = Some(b);
        if writes == 0 {
            self.finish_batch(st);
        }
    }

    /// Fold the batch's new data into the cache and bring P (and Q) up to date.
    fn compute_batch(&mut self, st: &mut Stripe, b: &mut Batch) {
        let sp = b.span;
        let pd = st.map.pd_idx;
        for m in std::iter::once(pd).chain(st.map.qd_idx) {
            for (r0, n) in runs(sp) {
                self.cover(&mut st.cache[m], bytes(r0, n));
            }
        }
        match b.mode {
            WriteMode::ReadModifyWrite => {
                let map = st.map.clone();
                let mut p_blk = st.cache[pd].take().expect("P");
                let mut q_blk = map.qd_idx.map(|q| st.cache[q].take().expect("Q"));
                for (dd, &m) in map.data_members.iter().enumerate() {
                    let mk = b.mask[m];
                    if mk == 0 {
                        continue;
                    }
                    let new = b.data[m].as_ref().expect("new data");
                    let old = st.cache[m].as_ref().expect("old data");
                    for (r0, n) in runs(mk) {
                        let rg = bytes(r0, n);
                        if self.planted_skip_rmw_parity {
                            continue;
                        }
                        let (old, new) = (old.rows(rg.clone()), new.rows(rg.clone()));
                        let p = p_blk.rows_mut(rg.clone());
                        match q_blk.as_mut() {
                            Some(q) => {
                                uraid_parity::rmw_update(map.syndrome_slot[dd], old, new, p, q.rows_mut(rg))
                            }
                            None => {
                                for ((pp, o), nn) in p.iter_mut().zip(old).zip(new) {
                                    *pp ^= o ^ nn;
                                }
                            }
                        }
                    }
                    self.take_new_data(st, b, m);
                }
                st.cache[pd] = Some(p_blk);
                if let (Some(qd), Some(q)) = (st.map.qd_idx, q_blk) {
                    st.cache[qd] = Some(q);
                }
            }
            WriteMode::Full | WriteMode::ReconstructWrite => {
                let map = st.map.clone();
                for &m in &map.data_members {
                    if b.mask[m] != 0 {
                        self.take_new_data(st, b, m);
                    }
                }
                for (r0, n) in runs(sp) {
                    self.compute_parity(st, bytes(r0, n), true, true);
                }
                st.valid[pd] |= sp;
                if let Some(q) = st.map.qd_idx {
                    st.valid[q] |= sp;
                }
            }
        }
    }

    /// The batch's new rows of member `m` become the cache's: when nothing else of the
    /// member is cached, its block simply replaces the cached one (no copy); otherwise they
    /// are copied in.
    fn take_new_data(&mut self, st: &mut Stripe, b: &mut Batch, m: usize) {
        let mk = b.mask[m];
        if st.valid[m] & !mk == 0 && st.reading[m] & mk == 0 {
            if let Some(old) = std::mem::replace(&mut st.cache[m], b.data[m].take()) {
                self.recycle_buf(old);
            }
        } else {
            self.cover(&mut st.cache[m], 0..self.cache.zero.len());
            copy_rows(st.cache[m].as_mut().expect("covered"), b.data[m].as_ref().expect("new data"), mk);
        }
        st.valid[m] |= mk;
    }

    fn finish_batch(&mut self, st: &mut Stripe) {
        let mut b = st.batch.take().expect("batch");
        // Payload views (skip_copy) leave the cache once on the member, so the cache does not
        // pin the caller's buffers; the rows are read back if wanted. A fill still in flight
        // would land in the emptied slot, so such a view is copied instead (rare).
        for &m in &st.map.data_members {
            if st.cache[m].as_ref().is_some_and(Block::borrows_larger_buffer) {
                if st.reading[m] == 0 {
                    st.cache[m] = None;
                    st.valid[m] = 0;
                } else {
                    st.cache[m].as_mut().expect("view").detach();
                }
            }
        }
        // Drop-behind for streaming full-stripe writes: with no data cached, the head's parity
        // only helps a later partial write of these very rows, and its buffers are worth more
        // back in the pool, still warm, for the next head.
        let parity = std::iter::once(st.map.pd_idx).chain(st.map.qd_idx);
        if b.mode == WriteMode::Full
            && st.map.data_members.iter().all(|&m| st.cache[m].is_none())
            && parity.clone().all(|p| st.reading[p] == 0)
        {
            for p in parity {
                st.valid[p] = 0;
                if let Some(buf) = st.cache[p].take() {
                    self.recycle_buf(buf);
                }
            }
        }
        let err = if self.failed { Some(RequestError::ArrayFailed) } else { None };
        for &req in &b.reqs {
            self.part_done(req, err);
        }
        // Keep the vectors for the next batch (bounded like the cache itself).
        if self.cache.spare_batches.len() < 64 {
            b.data.iter_mut().for_each(|d| *d = None);
            b.mask.iter_mut().for_each(|m| *m = 0);
            b.reqs.clear();
            self.cache.spare_batches.push((b.data, b.mask, b.reqs));
        }
    }

    // ---- background sync ---------------------------------------------------------------

    pub(crate) fn cache_head_sectors(&self) -> u64 {
        self.cache.head_sectors
    }

    fn advance_sync(&mut self, key: u64, st: &mut Stripe) {
        let Some(op) = st.sync.as_mut() else { return };
        if op.row {
            // A row unit does the I/O; it only waits for the head's batch and rewrites.
            if !op.ready && st.batch.is_none() && st.rewriting.iter().all(|&r| r == 0) {
                op.ready = true;
                let unit = op.unit;
                self.row_head_ready(unit);
            }
            return;
        }
        if op.writing.is_some() {
            return;
        }
        let (unit, kind) = (op.unit, op.kind);
        let full = self.cache.full_mask;
        // (block to write, engine member to write it to)
        let targets: Vec<(usize, usize)> = match kind {
            crate::sync::SyncKind::Recovery { member } => {
                if !self.members[member].writable() {
                    st.sync = None;
                    self.head_sync_done(unit, false);
                    return;
                }
                match self.ensure(key, st, member, full) {
                    Ensure::Pending => return,
                    Ensure::Lost => {
                        st.sync = None;
                        self.head_sync_done(unit, false);
                        return;
                    }
                    Ensure::Ready => vec![(member, member)],
                }
            }
            // The member's own block, read from it (a failed read is rebuilt from the others
            // and rewritten to it by `ensure`), goes to the replacement.
            crate::sync::SyncKind::Replace { slot } => {
                if self.replacements[slot].is_none() {
                    st.sync = None;
                    self.head_sync_done(unit, false);
                    return;
                }
                match self.ensure(key, st, slot, full) {
                    Ensure::Pending => return,
                    Ensure::Lost => {
                        st.sync = None;
                        self.head_sync_done(unit, false);
                        return;
                    }
                    // Not while the rebuilt rows are being rewritten to the member: the
                    // rewrite reaches the replacement too, and must not land after this copy.
                    Ensure::Ready if st.rewriting[slot] != 0 => return,
                    Ensure::Ready => vec![(slot, self.replacement_index(slot))],
                }
            }
            // Scrub units always claim their heads as a row (see `stripe::scrub`).
            crate::sync::SyncKind::Scrub(_) => {
                st.sync = None;
                self.head_sync_done(unit, false);
                return;
            }
            crate::sync::SyncKind::Resync => {
                let mut ready = true;
                for &m in &st.map.data_members.clone() {
                    match self.ensure(key, st, m, full) {
                        Ensure::Ready => {}
                        Ensure::Pending => ready = false,
                        Ensure::Lost => {
                            st.sync = None;
                            self.head_sync_done(unit, false);
                            return;
                        }
                    }
                }
                if !ready {
                    return;
                }
                for m in std::iter::once(st.map.pd_idx).chain(st.map.qd_idx) {
                    self.cover(&mut st.cache[m], bytes(0, self.cache.head_sectors));
                }
                self.compute_parity(st, bytes(0, self.cache.head_sectors), true, true);
                let parity: Vec<usize> = std::iter::once(st.map.pd_idx).chain(st.map.qd_idx).collect();
                for &m in &parity {
                    st.valid[m] |= full;
                }
                parity.into_iter().map(|m| (m, m)).collect()
            }
        };
        let mut writes = 0;
        for (block, m) in targets {
            if !self.target_writable(m) {
                continue;
            }
            let data = st.cache[block].as_ref().expect("rebuilt").view(bytes(0, self.cache.head_sectors));
            if block == m {
                st.bad[m] = 0; // the whole head is rewritten
            }
            writes += 1;
            st.inflight += 1;
            let n = self.cache.head_sectors;
            self.issue_io(m, MemberIoOp::Write, st.base_sector, n, data, IoCtx::StripeSyncWrite { key });
        }
        if writes == 0 {
            st.sync = None;
            self.head_sync_done(unit, true);
        } else {
            st.sync.as_mut().expect("sync").writing = Some(writes);
        }
    }

    // ---- completions --------------------------------------------------------------------

    pub(crate) fn stripe_io_done(
        &mut self,
        ctx: IoCtx,
        member: usize,
        result: Result<Vec<u8>, MemberIoError>,
    ) {
        match ctx {
            IoCtx::BypassRead { req, array_sector, len_sectors, dest_off } => match result {
                Ok(data) => {
                    if let Some(r) = self.reqs.get_mut(&req) {
                        r.deliver(dest_off, data, (len_sectors * SECTOR_BYTES) as usize);
                    }
                    self.part_done(req, None);
                }
                Err(e) => {
                    // md retries a failed aligned read through the stripe cache.
                    if e == MemberIoError::Gone {
                        self.fail_member(member, self.now_ns);
                    }
                    if let Some(r) = self.reqs.get_mut(&req) {
                        r.parts -= 1;
                    }
                    self.stripe_read_via_cache(req, array_sector, len_sectors, dest_off);
                    return;
                }
            },
            IoCtx::Fill { key, rows: rws } => {
                let Some(st) = self.cache.heads.get_mut(&key) else { return };
                st.inflight -= 1;
                st.reading[member] &= !rws;
                let gone = matches!(result, Err(MemberIoError::Gone));
                let (r0, n) = runs(rws).next().expect("a fill reads one run of rows");
                let read_rg = bytes(r0, n);
                let mut retry = None;
                match result {
                    Ok(data) if st.valid[member] == 0 && data.len() == read_rg.len() => {
                        // Read into a slot holding nothing valid: the read's buffer is adopted
                        // as it came (no copy); the slot's old buffer is recycled.
                        let fresh = Block::window(read_rg.start, IoBytes::from(data));
                        st.valid[member] = rws;
                        if let Some(old) = st.cache[member].replace(fresh) {
                            self.recycle_buf(old);
                        }
                    }
                    Ok(data) => {
                        let fresh = rws & !st.valid[member];
                        let mut slot = st.cache[member].take();
                        self.cover(&mut slot, read_rg.clone());
                        let blk = slot.as_mut().expect("covered");
                        for (a, len) in runs(fresh) {
                            let src = bytes(a, len);
                            blk.rows_mut(src.clone())
                                .copy_from_slice(&data[src.start - read_rg.start..src.end - read_rg.start]);
                        }
                        let st = self.cache.heads.get_mut(&key).expect("head");
                        st.cache[member] = slot;
                        st.valid[member] |= fresh;
                    }
                    // Only the failing sectors may be rebuilt (from parity a resync may not
                    // have reached yet): the halves are read again until they are found.
                    Err(MemberIoError::Io)
                        if n > 1 && self.members[member].readable(st.base_sector + r0 + n - 1) =>
                    {
                        retry = Some((r0, n));
                    }
                    Err(MemberIoError::Io) => st.bad[member] |= rws,
                    Err(MemberIoError::Gone) => {}
                }
                if let Some((r0, n)) = retry {
                    let half = n / 2;
                    for (a, len) in [(r0, half), (r0 + half, n - half)] {
                        let st = self.cache.heads.get_mut(&key).expect("head");
                        st.reading[member] |= rows(a, a + len);
                        st.inflight += 1;
                        let base = st.base_sector;
                        let ctx = IoCtx::Fill { key, rows: rows(a, a + len) };
                        self.issue_io(member, MemberIoOp::Read, base + a, len, IoBytes::new(), ctx);
                    }
                }
                // A write batch waits for all its reads: while others are in flight, and no
                // reader or sync could use these rows alone, the head has nothing to do yet.
                let st = self.cache.heads.get_mut(&key).expect("head");
                let waiting_on_more =
                    st.reading.iter().any(|&r| r != 0) && st.readers.is_empty() && st.sync.is_none();
                if gone || !waiting_on_more {
                    queue_head(&mut self.cache.dirty, key, st);
                }
                if gone {
                    self.fail_member(member, self.now_ns);
                }
            }
            IoCtx::StripeWrite { key } => {
                let Some(st) = self.cache.heads.get_mut(&key) else { return };
                st.inflight -= 1;
                let b = st.batch.as_mut().expect("a write belongs to a batch");
                let left = b.writing.unwrap_or(1) - 1;
                b.writing = Some(left);
                // md's R5_WriteError: the rows join the member's bad-block log if it has room
                // (the cache and parity hold them), else the member fails.
                if result.is_err() && !(result == Err(MemberIoError::Io) && self.record_write_error(member)) {
                    self.fail_member(member, self.now_ns);
                }
                // Until the batch's last write lands the head cannot move on: no re-analysis.
                if left == 0 {
                    let mut st = self.cache.heads.remove(&key).expect("head");
                    self.finish_batch(&mut st);
                    self.cache.heads.insert(key, st);
                    self.cache.mark(key);
                }
            }
            IoCtx::StripeSyncWrite { key } => {
                let Some(st) = self.cache.heads.get_mut(&key) else { return };
                st.inflight -= 1;
                let op = st.sync.as_mut().expect("a sync write belongs to a sync op");
                let left = op.writing.unwrap_or(1) - 1;
                op.writing = Some(left);
                let (unit, own_head) = (op.unit, op.own_head);
                if left == 0 {
                    st.sync = None;
                }
                if left == 0 && own_head && result.is_ok() && st.idle() {
                    // Nothing else uses the head: its buffers go back to the pool for the
                    // next units' reads (see `SyncOp::own_head`).
                    self.evict(key);
                } else {
                    self.cache.mark(key);
                }
                if result.is_err() {
                    self.fail_member(member, self.now_ns);
                }
                if left == 0 {
                    self.head_sync_done(unit, result.is_ok() && !self.failed);
                }
            }
            IoCtx::RowSyncRead { unit } => self.row_read_done(unit, member, result),
            IoCtx::RowSyncWrite { unit } => self.row_write_done(unit, member, result),
            IoCtx::ScrubStripeRead { unit } => self.scrub_read_done(unit, member, result),
            IoCtx::ScrubStripeWrite { unit } => self.scrub_write_done(unit, member, result),
            IoCtx::Rewrite { key, rows: rws, .. } => {
                if let Some(st) = self.cache.heads.get_mut(&key) {
                    st.inflight -= 1;
                    st.rewriting[member] &= !rws;
                    if result.is_ok() {
                        st.bad[member] &= !rws;
                    }
                }
                if result.is_ok() {
                    self.stats.read_errors_corrected += 1;
                } else {
                    if !(result == Err(MemberIoError::Io) && self.record_write_error(member)) {
                        self.fail_member(member, self.now_ns);
                    }
                    if let Some(st) = self.cache.heads.get_mut(&key) {
                        st.bad[member] &= !rws;
                    }
                }
                self.cache.mark(key);
            }
            _ => {}
        }
        self.run_stripes();
    }
}

enum Ensure {
    Ready,
    Pending,
    Lost,
}
