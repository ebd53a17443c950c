//! The handler: every marked head re-analysed as md's `handle_stripe` does: readers
//! served, rows made valid by reading or reconstructing them, failed rows rewritten.

use crate::api::*;
use crate::block::Block;
use crate::engine::Mddev;
use crate::ledger::Ledger;
use crate::sectors::{rows, runs, SectorMask};

use super::*;

impl Mddev {
    /// Re-analyse every head marked dirty until nothing changes.
    pub(crate) fn run_stripes(&mut self, led: &mut Ledger) {
        if self.cache.running {
            return; // the outer loop picks up what this call would do
        }
        self.cache.running = true;
        loop {
            while let Some(key) = self.cache.dirty.pop_front() {
                let Some(mut st) = self.cache.heads.remove(&key) else { continue };
                st.queued = false;
                self.handle_stripe(led, key, &mut st);
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
                self.place_in_stripe(led, piece);
                placed = true;
            }
            // md's log_write_stripe_run: the batches logged in this pass go out together.
            if self.ppl.is_some() {
                self.ppl_submit_all(led);
            }
            if !placed && self.cache.dirty.is_empty() {
                break;
            }
        }
        self.cache.running = false;
    }

    pub(super) fn handle_stripe(&mut self, led: &mut Ledger, key: u64, st: &mut Stripe) {
        if self.failed {
            for r in std::mem::take(&mut st.readers) {
                self.part_done(led, r.req, Some(RequestError::ArrayFailed));
            }
            for req in std::mem::take(&mut st.towrite_reqs) {
                self.part_done(led, req, Some(RequestError::ArrayFailed));
            }
            st.towrite_mask.iter_mut().for_each(|m| *m = 0);
            if st.sync.as_ref().is_some_and(|s| s.row) {
                self.row_head_failed(led, key, st);
            }
            if st.sync.as_ref().is_some_and(|s| s.writing.is_none()) {
                let op = st.sync.take().expect("sync");
                self.head_sync_done(led, op.unit, false);
            }
            if st.batch.as_ref().is_some_and(|b| b.writing.is_none()) {
                let b = st.batch.take().expect("batch");
                if b.counted_preread {
                    self.cache.preread_active -= 1;
                }
                for req in b.reqs {
                    self.part_done(led, req, Some(RequestError::ArrayFailed));
                }
            }
            return;
        }
        self.serve_readers(led, key, st);
        if st.batch.is_some() {
            self.advance_batch(led, key, st);
        }
        if st.batch.is_none() && st.sync.is_some() {
            self.advance_sync(led, key, st);
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
                self.advance_batch(led, key, st);
            } else if st.delayed_until.is_none() {
                st.delayed_until = Some(self.now_ns + self.tun.stripe_batch_deadline_ns);
                // It starts at the caller's next unplug if nothing is pre-reading, or at the deadline.
                self.cache.delayed.push(key);
            }
        }
    }

    pub(super) fn serve_readers(&mut self, led: &mut Ledger, key: u64, st: &mut Stripe) {
        let mut i = 0;
        while i < st.readers.len() {
            let r = &st.readers[i];
            let (member, want) = (r.member, r.rows);
            // Once the batch is writing, its rows are in the cache (and its buffers recycled).
            let batch_mask = st.batch.as_ref().filter(|b| b.writing.is_none()).map_or(0, |b| b.mask[member]);
            let from_cache = want & !st.towrite_mask[member] & !batch_mask;
            match self.ensure(led, key, st, member, from_cache) {
                Ensure::Pending => i += 1,
                Ensure::Lost => {
                    let r = st.readers.swap_remove(i);
                    self.part_done(led, r.req, Some(RequestError::Io));
                }
                Ensure::Ready => {
                    let r = st.readers.swap_remove(i);
                    if from_cache == want {
                        self.stats.stripe_cache_hits += 1;
                    }
                    if let Some(req) = led.reqs.get_mut(&r.req) {
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
                            shift(st.dev[member].block.as_ref().expect("valid cache"), from_cache, dest);
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
                    self.part_done(led, r.req, None);
                }
            }
        }
    }

    /// Make `need` rows of `member` valid in the cache: read them, or reconstruct them when
    /// the member cannot be read there.
    pub(super) fn ensure(
        &mut self,
        led: &mut Ledger,
        key: u64,
        st: &mut Stripe,
        member: usize,
        need: SectorMask,
    ) -> Ensure {
        let missing = need & !st.dev[member].valid;
        if missing == 0 {
            return Ensure::Ready;
        }
        if self.readable_rows(st, member, missing) {
            self.fill(led, key, st, member, missing);
            return Ensure::Pending;
        }
        self.reconstruct(led, key, st, missing)
    }

    pub(super) fn readable_rows(&self, st: &Stripe, member: usize, rows_wanted: SectorMask) -> bool {
        self.unreadable_rows(st, member, rows_wanted) == 0
    }

    /// The rows of `rows_wanted` that `member` cannot supply: all of them when it is gone,
    /// those at or past its recovery_offset while it is rebuilt, those that failed to read,
    /// and those its bad-block log lists.
    pub(super) fn unreadable_rows(&self, st: &Stripe, member: usize, rows_wanted: SectorMask) -> SectorMask {
        if rows_wanted == 0 {
            return 0;
        }
        let m = &self.members[member];
        let hi = 128 - rows_wanted.leading_zeros() as u64;
        let mut out = st.dev[member].bad & rows_wanted;
        if !m.readable(st.base_sector + hi.saturating_sub(1)) {
            if !m.readable(st.base_sector) {
                return rows_wanted;
            }
            // Recovering: the rows from its recovery_offset on hold nothing yet.
            let first_unbuilt = (0..hi).find(|&r| !m.readable(st.base_sector + r)).unwrap_or(hi);
            out |= rows_wanted & !rows(0, first_unbuilt);
        }
        out | self.listed_bad_rows(st, member, rows_wanted & !out)
    }

    /// The rows of `rows_wanted` in `member`'s bad-block log: never read (md's
    /// analyse_stripe treats the block as not in sync), rebuilt from the others instead.
    pub(super) fn listed_bad_rows(&self, st: &Stripe, member: usize, rows_wanted: SectorMask) -> SectorMask {
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

    pub(super) fn fill(
        &mut self,
        led: &mut Ledger,
        key: u64,
        st: &mut Stripe,
        member: usize,
        missing: SectorMask,
    ) {
        let to_read = missing & !st.dev[member].reading;
        if to_read == 0 {
            return;
        }
        if to_read == self.cache.full_mask && st.dev[member].valid == 0 {
            // A whole head into a slot holding nothing: hand the executor a buffer to read
            // into (the slot's, or a pooled one) rather than making it allocate one; the
            // completion adopts it as the cache (see `stripe_io_done`).
            let head_bytes = self.cache.zero.len();
            let spare = st.dev[member]
                .block
                .take()
                .and_then(Block::into_sole_buffer)
                .filter(|b| b.len() == head_bytes)
                .unwrap_or_else(|| self.cache.buf());
            st.dev[member].reading |= to_read;
            st.inflight += 1;
            let ctx = IoCtx::Fill { key, rows: to_read };
            self.issue_io(led, member, MemberIoOp::Read, st.base_sector, self.cache.head_sectors, spare, ctx);
            return;
        }
        for (r0, n) in runs(to_read) {
            st.dev[member].reading |= rows(r0, r0 + n);
            st.inflight += 1;
            let ctx = IoCtx::Fill { key, rows: rows(r0, r0 + n) };
            let spare = self.cache.fill_buf(n);
            self.issue_io(led, member, MemberIoOp::Read, st.base_sector + r0, n, spare, ctx);
        }
    }

    /// Rebuild `want` rows of every member that cannot supply them from the others. Every
    /// row a member can supply is read, its own lost ones included: a member lost for a few
    /// rows (a latent or listed bad sector) keeps the rest as known data, never rebuilt
    /// from parity a resync may not have reached (`uraid sim --seed 1622`).
    pub(super) fn reconstruct(
        &mut self,
        led: &mut Ledger,
        key: u64,
        st: &mut Stripe,
        want: SectorMask,
    ) -> Ensure {
        let unreadable = self.unreadable_by_member(st, want);
        let n = self.geo.raid_disks;
        let lost: Vec<usize> = (0..n).filter(|&o| unreadable[o] != 0).collect();
        // Lost when some row lacks more members than parity covers.
        if lost.len() > self.geo.level.parity_disks() && self.rows_over_parity(&unreadable, want) != 0 {
            return Ensure::Lost;
        }
        // A lost member's other rows may still be being read (the halves of a failed fill):
        // wait for them, so every row that fails is known and rewritten below, not only the
        // first (`uraid sim --seed 9936` left latent sectors under rebuilt parity).
        let mut pending = lost.iter().any(|&o| st.dev[o].reading & want != 0);
        for (o, &lacks) in unreadable.iter().enumerate() {
            let readable = want & !st.dev[o].valid & !lacks;
            if readable != 0 {
                self.fill(led, key, st, o, readable);
                pending = true;
            }
        }
        if pending {
            return Ensure::Pending;
        }
        let head_bytes = self.cache.zero.len();
        for &o in &lost {
            self.cover(&mut st.dev[o].block, 0..head_bytes);
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
                lost.iter().copied().filter(|&o| st.dev[o].valid & rows(r, r + 1) == 0).collect()
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
            st.dev[o].valid |= want;
            // md's read-error correction: a readable member that failed these rows gets them back;
            // so do its listed rows unless a write failed there this run (md's R5_ReadError
            // without WriteErrorSeen). The rewrite clears them from the log as it lands.
            let mut bad = st.dev[o].bad & want;
            if !self.members[o].write_error_seen {
                bad |= self.listed_bad_rows(st, o, want);
            }
            if bad != 0 && self.members[o].writable() {
                for (r0, n) in runs(bad) {
                    let data = st.dev[o].block.as_ref().expect("rebuilt").view(bytes(r0, n));
                    st.inflight += 1;
                    st.dev[o].rewriting |= rows(r0, r0 + n);
                    let ctx = IoCtx::Rewrite { key, rows: rows(r0, r0 + n) };
                    self.issue_io(led, o, MemberIoOp::Write, st.base_sector + r0, n, data, ctx);
                }
            }
        }
        Ensure::Ready
    }

    /// Per member, the rows of `want` it lacks in the cache and cannot supply.
    fn unreadable_by_member(&self, st: &Stripe, want: SectorMask) -> Vec<SectorMask> {
        (0..self.geo.raid_disks).map(|o| self.unreadable_rows(st, o, want & !st.dev[o].valid)).collect()
    }

    /// The rows of `want` that more members lack (`unreadable`, per member) than parity
    /// covers: nothing rebuilds them.
    fn rows_over_parity(&self, unreadable: &[SectorMask], want: SectorMask) -> SectorMask {
        let parity = self.geo.level.parity_disks();
        (0..128u64)
            .map(|r| rows(r, r + 1))
            .filter(|&row| want & row != 0 && unreadable.iter().filter(|&&u| u & row != 0).count() > parity)
            .fold(0, |acc, row| acc | row)
    }

    /// The rows of `want` no reconstruction can give (see `reconstruct`'s `Ensure::Lost`).
    pub(super) fn rows_beyond_redundancy(&self, st: &Stripe, want: SectorMask) -> SectorMask {
        self.rows_over_parity(&self.unreadable_by_member(st, want), want)
    }

    /// Compute the byte range `rg` of the `lost` members from the others (all valid there).
    pub(super) fn compute_lost(&self, st: &mut Stripe, lost: &[usize], rg: std::ops::Range<usize>) {
        let map = &st.map;
        let pd = map.pd_idx;
        let qd = map.qd_idx;
        let lost_data: Vec<usize> = lost.iter().copied().filter(|&m| st.dd_of[m].is_some()).collect();
        let mut outs: Vec<(usize, Buf)> =
            lost_data.iter().map(|&m| (m, st.dev[m].block.take().expect("allocated"))).collect();
        {
            let mut outs: Vec<(usize, &mut [u8])> =
                outs.iter_mut().map(|(m, b)| (*m, b.rows_mut(rg.clone()))).collect();
            let zero = &self.cache.zero[..rg.len()];
            let mut slots: Vec<&[u8]> = vec![zero; map.syndrome_disks];
            for (dd, &m) in map.data_members.iter().enumerate() {
                if let Some(b) = &st.dev[m].block {
                    slots[map.syndrome_slot[dd]] = b.rows(rg.clone());
                } else {
                    slots[map.syndrome_slot[dd]] = &[];
                }
            }
            let slot_of = |m: usize| map.syndrome_slot[st.dd_of[m].expect("data member")];
            let p = st.dev[pd].block.as_ref().filter(|_| !lost.contains(&pd)).map(|b| b.rows(rg.clone()));
            let q = qd
                .and_then(|q| st.dev[q].block.as_ref().filter(|_| !lost.contains(&q)))
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
            st.dev[m].block = Some(b);
        }
        let p_lost = lost.contains(&pd);
        let q_lost = qd.is_some_and(|q| lost.contains(&q));
        if p_lost || q_lost {
            self.compute_parity(st, rg, p_lost, q_lost);
        }
    }

    /// Recompute P and/or Q over byte range `rg` from the data blocks (all valid there).
    pub(super) fn compute_parity(
        &self,
        st: &mut Stripe,
        rg: std::ops::Range<usize>,
        want_p: bool,
        want_q: bool,
    ) {
        let map = &st.map;
        let mut p = st.dev[map.pd_idx].block.take();
        let mut q = map.qd_idx.and_then(|q| st.dev[q].block.take());
        {
            let zero = &self.cache.zero[..rg.len()];
            let mut slots: Vec<&[u8]> = vec![zero; map.syndrome_disks];
            for (dd, &m) in map.data_members.iter().enumerate() {
                slots[map.syndrome_slot[dd]] = st.dev[m].block.as_ref().expect("data valid").rows(rg.clone());
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
        st.dev[map.pd_idx].block = p;
        if let Some(qd) = map.qd_idx {
            st.dev[qd].block = q;
        }
    }
}
