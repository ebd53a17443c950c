//! The stripe cache's heads: finding, making, evicting and recycling them, and placing
//! read and write pieces of requests on them (chunk-aligned reads bypass the cache).

use crate::api::*;
use crate::block::Block;
use crate::engine::Mddev;
use crate::ledger::Ledger;
use crate::sectors::{rows, runs, SectorMask};

use super::*;

impl Mddev {
    pub(super) fn head_key(&self, sector: u64) -> (u64, usize, u64, u64) {
        let (stripe, dd, off) = self.geo.parity_locate(sector);
        let h = self.cache.head_sectors;
        let key = stripe * self.cache.heads_per_chunk + off / h;
        let row = off % h;
        (key, dd, row, h - row)
    }

    /// The stripe map of `stripe` (and each member's data index), computed once per residue
    /// while its slot of the map cache keeps it.
    pub(super) fn cached_map(&mut self, stripe: u64) -> SharedMap {
        let residue = stripe % self.cache.map_period;
        let slot = (residue % self.cache.maps.len() as u64) as usize;
        if let Some((r, (map, dd_of))) = &self.cache.maps[slot] {
            if *r == residue {
                debug_assert_eq!(**map, self.geo.stripe_map(stripe));
                return (map.clone(), dd_of.clone());
            }
        }
        let map = self.geo.stripe_map(stripe);
        let mut dd_of = vec![None; self.geo.raid_disks];
        for (dd, &m) in map.data_members.iter().enumerate() {
            dd_of[m] = Some(dd);
        }
        let entry = (Arc::new(map), Arc::new(dd_of));
        self.cache.maps[slot] = Some((residue, entry.clone()));
        entry
    }

    pub(super) fn new_stripe(&mut self, key: u64) -> Box<Stripe> {
        let n = self.geo.raid_disks;
        let (map, dd_of) = self.cached_map(key / self.cache.heads_per_chunk);
        let base_sector = key * self.cache.head_sectors;
        if let Some(mut st) = self.cache.free_heads.pop() {
            // Evicted heads are idle: only the per-member vectors need resetting.
            assert!(st.idle() && st.dev.len() == n, "a recycled stripe head still busy");
            st.base_sector = base_sector;
            st.map = map;
            st.dd_of = dd_of;
            assert!(
                st.dev.iter().all(|d| d.block.is_none()) && st.towrite.iter().all(Option::is_none),
                "a recycled stripe head holds buffers"
            );
            st.dev.iter_mut().for_each(|d| *d = R5Dev::default());
            st.towrite_mask.iter_mut().for_each(|m| *m = 0);
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
            dev: (0..n).map(|_| R5Dev::default()).collect(),
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
    pub(super) fn get_stripe(&mut self, key: u64) -> bool {
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
    pub(super) fn recycle_buf(&mut self, b: Buf) {
        let cap = self.tun.stripe_cache_size * self.geo.raid_disks;
        let Some(b) = b.into_sole_buffer() else { return };
        let head_bytes = self.cache.zero.len();
        if b.len() == head_bytes {
            if self.cache.pool.len() < cap {
                self.cache.pool.push(b);
            }
            return;
        }
        // Shorter buffers (partial fills, small write payloads) feed later partial fills,
        // within md's own stripe-cache memory: a 4 KiB page per member per head.
        let rows = b.len() / SECTOR_BYTES as usize;
        let fits = self.cache.fill_pool_bytes + b.len() <= cap * 4096;
        if b.len() % SECTOR_BYTES as usize == 0 && rows > 0 && fits {
            if self.cache.fill_pool.len() <= rows {
                self.cache.fill_pool.resize_with(rows + 1, Vec::new);
            }
            self.cache.fill_pool_bytes += b.len();
            self.cache.fill_pool[rows].push(b);
        }
    }

    /// Make `slot` hold at least the head's bytes `rg`: a fresh buffer of the full height,
    /// or its window widened into one.
    pub(super) fn cover(&mut self, slot: &mut Option<Buf>, rg: std::ops::Range<usize>) {
        match slot {
            Some(b) if b.covers(rg) => {}
            Some(b) => {
                let former = b.widen_into(self.cache.buf());
                self.recycle_buf(former);
            }
            None => *slot = Some(Block::window(0, self.cache.buf())),
        }
    }

    pub(super) fn evict(&mut self, key: u64) {
        if let Some(mut st) = self.cache.heads.remove(&key) {
            let blocks = st.dev.iter_mut().map(|d| &mut d.block);
            for b in blocks.chain(st.towrite.iter_mut()).filter_map(Option::take) {
                self.recycle_buf(b);
            }
            if self.cache.free_heads.len() < self.tun.stripe_cache_size {
                self.cache.free_heads.push(st);
            }
        }
    }

    /// Take the idle head unused longest out of the LRU order.
    pub(super) fn least_recently_used(&mut self) -> Option<u64> {
        while let Some((stamp, key)) = self.cache.lru.pop_front() {
            if self.cache.heads.get(&key).is_some_and(|h| h.lru_stamp == stamp) {
                return Some(key);
            }
        }
        None
    }

    /// Put an idle head at the young end of the LRU order.
    pub(super) fn mark_idle(&mut self, key: u64) {
        self.cache.lru_clock += 1;
        let stamp = self.cache.lru_clock;
        self.cache.heads.get_mut(&key).expect("idle head").lru_stamp = stamp;
        self.cache.lru.push_back((stamp, key));
        if self.cache.lru.len() > 2 * self.cache.heads.len() + 64 {
            let heads = &self.cache.heads;
            self.cache.lru.retain(|(stamp, key)| heads.get(key).is_some_and(|h| h.lru_stamp == *stamp));
        }
    }

    pub(crate) fn shrink_cache(&mut self, led: &mut Ledger) {
        while self.cache.heads.len() > self.tun.stripe_cache_size {
            let Some(victim) = self.least_recently_used() else { break };
            self.evict(victim);
        }
        self.run_stripes(led);
    }

    pub(super) fn place(&mut self, led: &mut Ledger, piece: Piece) {
        if !self.cache.waiting.is_empty() || !self.get_stripe(piece.key()) {
            self.cache.waiting.push_back(piece);
            // Pressure: start every delayed stripe so heads free up.
            self.cache_force_all();
            return;
        }
        self.place_in_stripe(led, piece);
    }

    pub(super) fn place_in_stripe(&mut self, led: &mut Ledger, piece: Piece) {
        let key = piece.key();
        let hb = self.cache.zero.len();
        match piece {
            Piece::Read { req, dd, rows, dest_off, .. } => {
                let st = self.cache.heads.get_mut(&key).expect("placed stripe");
                let member = st.map.data_members[dd];
                st.readers.push(ReadWaiter { req, member, rows, dest_off });
            }
            Piece::Write { req, dd, rows, src_off, zero, .. } => {
                let r = led.reqs.get_mut(&req).expect("request");
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

    pub(super) fn parity_pieces(&self, sector: u64, len: u64) -> Vec<(u64, usize, SectorMask, u64)> {
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

    pub(crate) fn stripe_read(&mut self, led: &mut Ledger, id: RequestId, sector: u64, len: u64) {
        let optimal = self.members.iter().all(|m| matches!(m.state, crate::config::MemberState::InSync));
        // md since 4.1 bypasses only on an optimal array (seed 001); the old behaviour, bypass
        // whenever the target member can serve the read, stays available to measure.
        let allowed = optimal || self.tun.degraded_read_bypass;
        if !(self.tun.aligned_read_bypass && allowed) {
            self.stripe_read_via_cache(led, id, sector, len, 0);
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
            if !self.bypass_read(led, id, pos, n, dest_off) {
                self.stripe_read_via_cache(led, id, pos, n, dest_off);
            }
            pos += n;
        }
    }

    /// Reads `len` sectors inside one chunk straight from the member holding them (md's
    /// raid5_read_one_chunk), if that member can serve them and the cache holds nothing
    /// newer for them. Returns whether it did.
    pub(super) fn bypass_read(
        &mut self,
        led: &mut Ledger,
        id: RequestId,
        sector: u64,
        len: u64,
        dest_off: usize,
    ) -> bool {
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
        led.reqs.get_mut(&id).expect("request").parts += 1;
        let ctx = IoCtx::BypassRead { req: id, array_sector: sector, len_sectors: len, dest_off };
        self.issue_io(led, ext.member, MemberIoOp::Read, ext.member_sector, len, IoBytes::new(), ctx);
        true
    }

    pub(super) fn stripe_read_via_cache(
        &mut self,
        led: &mut Ledger,
        id: RequestId,
        sector: u64,
        len: u64,
        dest_base: usize,
    ) {
        for (key, dd, rows, rel) in self.parity_pieces(sector, len) {
            led.reqs.get_mut(&id).expect("request").parts += 1;
            let dest_off = dest_base + (rel * SECTOR_BYTES) as usize;
            self.place(led, Piece::Read { req: id, key, dd, rows, dest_off });
        }
        self.run_stripes(led);
    }

    pub(crate) fn stripe_write(
        &mut self,
        led: &mut Ledger,
        id: RequestId,
        sector: u64,
        len: u64,
        zero: bool,
    ) {
        for (key, dd, rows, rel) in self.parity_pieces(sector, len) {
            led.reqs.get_mut(&id).expect("request").parts += 1;
            let src_off = (rel * SECTOR_BYTES) as usize;
            self.place(led, Piece::Write { req: id, key, dd, rows, src_off, zero });
        }
        self.run_stripes(led);
    }
}
