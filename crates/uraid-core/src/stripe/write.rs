//! Writes: the RMW/RCW plan (`rmw_level`), the batch's reads, its parity and its member
//! writes, and what finishes it.

use crate::block::Block;
use crate::engine::Mddev;
use crate::ledger::Ledger;
use crate::sectors::{runs, span, SectorMask};

use super::*;

impl Mddev {
    /// Choose how to write the queued data: full stripe, read-modify-write or reconstruct-write.
    pub(crate) fn plan_write_mode(&self, st: &Stripe, mask: &[SectorMask]) -> WriteMode {
        let full = st.map.data_members.iter().all(|&m| mask[m] == self.cache.full_mask);
        if full {
            return WriteMode::Full;
        }
        let sp = span(mask.iter().fold(0, |a, &m| a | m));
        let parity = || std::iter::once(st.map.pd_idx).chain(st.map.qd_idx);
        let written = || st.map.data_members.iter().copied().filter(|&m| mask[m] != 0);
        let rmw_possible = written().all(|m| {
            self.readable_rows(st, m, mask[m] & !st.dev[m].valid) || mask[m] & !st.dev[m].valid == 0
        }) && parity()
            .all(|p| self.readable_rows(st, p, sp & !st.dev[p].valid) || sp & !st.dev[p].valid == 0);
        let count = |m: usize, need: SectorMask| (need & !st.dev[m].valid).count_ones() as u64;
        let rmw_cost: u64 =
            written().map(|m| count(m, mask[m])).sum::<u64>() + parity().map(|p| count(p, sp)).sum::<u64>();
        let mut rcw_cost = 0u64;
        let mut rcw_needs_rebuild = false;
        for &m in &st.map.data_members {
            let need = sp & !mask[m] & !st.dev[m].valid;
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

    pub(super) fn start_batch(&mut self, st: &mut Stripe) {
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
        st.batch = Some(Batch {
            data,
            mask,
            reqs,
            mode,
            span: sp,
            writing: None,
            counted_preread: false,
            log_slot: None,
            log_wait: false,
        });
        st.force = false;
        if st.delayed_until.take().is_some() {
            self.cache.delayed.retain(|&k| k != st.base_sector / self.cache.head_sectors);
        }
    }

    pub(super) fn advance_batch(&mut self, led: &mut Ledger, key: u64, st: &mut Stripe) {
        let Some(b) = st.batch.as_ref() else { return };
        if b.writing.is_some() {
            return;
        }
        // Scratch vectors kept by the cache, so no allocation per call.
        let mut mask = std::mem::take(&mut self.cache.scratch_mask);
        let mut needs = std::mem::take(&mut self.cache.scratch_needs);
        mask.clone_from(&b.mask);
        needs.clear();
        self.advance_batch_with(led, key, st, &mask, &mut needs);
        self.cache.scratch_mask = mask;
        self.cache.scratch_needs = needs;
    }

    pub(super) fn advance_batch_with(
        &mut self,
        led: &mut Ledger,
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
        if self.ppl.is_some() {
            self.ppl_add_needs(st, mode, mask, needs);
        }
        let mut ready = true;
        for &(m, need) in needs.iter() {
            match self.ensure(led, key, st, m, need) {
                Ensure::Ready => {}
                Ensure::Pending => ready = false,
                Ensure::Lost => {
                    let b = st.batch.take().expect("batch");
                    if b.counted_preread {
                        self.cache.preread_active -= 1;
                    }
                    for req in b.reqs {
                        self.part_done(led, req, Some(RequestError::Io));
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
        if (0..self.geo.raid_disks).any(|m| st.dev[m].rewriting & write_rows(m) != 0) {
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
        // md's partial parity comes from the stripe as it is before the write.
        let logged = if self.ppl.is_some() { self.ppl_prepare(st, &b) } else { None };
        self.compute_batch(st, &mut b);
        for buf in b.data.iter_mut().filter_map(Option::take) {
            self.recycle_buf(buf);
        }
        let waits = logged.is_some_and(|lb| self.ppl_log_batch(key, st, &mut b, lb));
        st.batch = Some(b);
        if !waits {
            self.issue_batch_writes(led, key, st);
        }
    }

    /// The computed batch's member writes: the new data rows and the parity span.
    pub(super) fn issue_batch_writes(&mut self, led: &mut Ledger, key: u64, st: &mut Stripe) {
        let mut b = st.batch.take().expect("batch");
        let sp = b.span;
        let mut writes = 0u32;
        let n_data = st.map.data_members.len();
        let targets = n_data + 1 + usize::from(st.map.qd_idx.is_some());
        for i in 0..targets {
            let (m, rws) = match i {
                _ if i < n_data => (st.map.data_members[i], b.mask[st.map.data_members[i]]),
                _ if i == n_data => (st.map.pd_idx, sp),
                _ => (st.map.qd_idx.expect("Q"), sp),
            };
            if rws == 0 || !self.members[m].writable() {
                continue;
            }
            // A write remaps latent sectors: rows that failed to read are readable again.
            st.dev[m].bad &= !rws;
            for (r0, n) in runs(rws) {
                let data = st.dev[m].block.as_ref().expect("written rows cached").view(bytes(r0, n));
                writes += 1;
                st.inflight += 1;
                self.issue_io(
                    led,
                    m,
                    MemberIoOp::Write,
                    st.base_sector + r0,
                    n,
                    data,
                    IoCtx::StripeWrite { key },
                );
            }
        }
        b.writing = Some(writes);
        st.batch = Some(b);
        if writes == 0 {
            self.finish_batch(led, st);
        }
    }

    /// Fold the batch's new data into the cache and bring P (and Q) up to date.
    pub(super) fn compute_batch(&mut self, st: &mut Stripe, b: &mut Batch) {
        let sp = b.span;
        let pd = st.map.pd_idx;
        for m in std::iter::once(pd).chain(st.map.qd_idx) {
            for (r0, n) in runs(sp) {
                self.cover(&mut st.dev[m].block, bytes(r0, n));
            }
        }
        match b.mode {
            WriteMode::ReadModifyWrite => {
                let map = st.map.clone();
                let mut p_blk = st.dev[pd].block.take().expect("P");
                let mut q_blk = map.qd_idx.map(|q| st.dev[q].block.take().expect("Q"));
                for (dd, &m) in map.data_members.iter().enumerate() {
                    let mk = b.mask[m];
                    if mk == 0 {
                        continue;
                    }
                    let new = b.data[m].as_ref().expect("new data");
                    let old = st.dev[m].block.as_ref().expect("old data");
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
                st.dev[pd].block = Some(p_blk);
                if let (Some(qd), Some(q)) = (st.map.qd_idx, q_blk) {
                    st.dev[qd].block = Some(q);
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
                st.dev[pd].valid |= sp;
                if let Some(q) = st.map.qd_idx {
                    st.dev[q].valid |= sp;
                }
            }
        }
    }

    /// The batch's new rows of member `m` become the cache's: when nothing else of the
    /// member is cached, its block simply replaces the cached one (no copy); otherwise they
    /// are copied in.
    pub(super) fn take_new_data(&mut self, st: &mut Stripe, b: &mut Batch, m: usize) {
        let mk = b.mask[m];
        if st.dev[m].valid & !mk == 0 && st.dev[m].reading & mk == 0 {
            if let Some(old) = std::mem::replace(&mut st.dev[m].block, b.data[m].take()) {
                self.recycle_buf(old);
            }
        } else {
            self.cover(&mut st.dev[m].block, 0..self.cache.zero.len());
            copy_rows(st.dev[m].block.as_mut().expect("covered"), b.data[m].as_ref().expect("new data"), mk);
        }
        st.dev[m].valid |= mk;
    }

    pub(super) fn finish_batch(&mut self, led: &mut Ledger, st: &mut Stripe) {
        let mut b = st.batch.take().expect("batch");
        if let Some(slot) = b.log_slot {
            self.ppl_batch_written(led, slot);
        }
        // Payload views (skip_copy) leave the cache once on the member, so the cache does not
        // pin the caller's buffers; the rows are read back if wanted. A fill still in flight
        // would land in the emptied slot, so such a view is copied instead (rare).
        for &m in &st.map.data_members {
            if st.dev[m].block.as_ref().is_some_and(Block::borrows_larger_buffer) {
                if st.dev[m].reading == 0 {
                    st.dev[m].block = None;
                    st.dev[m].valid = 0;
                } else {
                    st.dev[m].block.as_mut().expect("view").detach();
                }
            }
        }
        // Drop-behind for streaming full-stripe writes: with no data cached, the head's parity
        // only helps a later partial write of these very rows, and its buffers are worth more
        // back in the pool, still warm, for the next head.
        let parity = std::iter::once(st.map.pd_idx).chain(st.map.qd_idx);
        if b.mode == WriteMode::Full
            && st.map.data_members.iter().all(|&m| st.dev[m].block.is_none())
            && parity.clone().all(|p| st.dev[p].reading == 0)
        {
            for p in parity {
                st.dev[p].valid = 0;
                if let Some(buf) = st.dev[p].block.take() {
                    self.recycle_buf(buf);
                }
            }
        }
        let err = if self.failed { Some(RequestError::ArrayFailed) } else { None };
        for &req in &b.reqs {
            self.part_done(led, req, err);
        }
        // Keep the vectors for the next batch (bounded like the cache itself).
        if self.cache.spare_batches.len() < 64 {
            b.data.iter_mut().for_each(|d| *d = None);
            b.mask.iter_mut().for_each(|m| *m = 0);
            b.reqs.clear();
            self.cache.spare_batches.push((b.data, b.mask, b.reqs));
        }
    }
}
