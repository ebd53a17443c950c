//! raid4/5/6 check and repair (md's sync_action `check` / `repair`), a row unit at a time.
//!
//! A scrub unit claims the heads of its range as a recovery row unit does (no write batch
//! starts on them until the unit is done: md's sync barrier), waits until none of them has
//! a batch or a rewrite in flight, then reads every member's range from the members
//! themselves, not from the cache: what is checked is what the disks hold. Parity is
//! compared per 4 KiB page, md's stripe_head, and `mismatch_cnt` grows by md's
//! STRIPE_SECTORS (8) for each page whose P (or Q) disagrees with the data
//! (raid5.c `handle_parity_checks5` / `handle_parity_checks6`).
//!
//! Repair rewrites the inconsistent pages: raid4/5 the parity; raid6 the one data block
//! the syndrome points at (mdadm's raid6check), else whichever of P and Q is wrong.
//!
//! A resync where every member is readable runs as a scrub unit too, as md's resync
//! checks parity and writes it only where it is wrong (`handle_parity_checks5/6`): P
//! and/or Q are rewritten from the data, and an array already in sync (a new one on
//! zeroed, sparse or thin members) is read and not written.

use std::sync::Arc;

use super::{IoCtx, ScrubUnit};
use crate::api::*;
use crate::engine::Mddev;
use crate::geometry::StripeMap;
use crate::ledger::Ledger;
use crate::sync::{OnMismatch, SyncKind};

/// md's STRIPE_SECTORS: a stripe_head covers one 4 KiB page of each member, and a
/// stripe_head found inconsistent adds that many sectors to resync_mismatches.
pub(crate) const STRIPE_PAGE_SECTORS: u64 = 8;
const PAGE_BYTES: usize = (STRIPE_PAGE_SECTORS * SECTOR_BYTES) as usize;

impl Mddev {
    pub(super) fn new_scrub_unit(&mut self, unit: u64, heads: Vec<u64>) {
        let n = self.geo.raid_disks;
        let u = ScrubUnit {
            heads,
            heads_ready: 0,
            started: false,
            pending: 0,
            bufs: vec![None; n],
            failed: false,
            written: vec![false; n],
        };
        self.cache.scrubs.insert(unit, u);
    }

    /// A claimed head has no batch left: once all are so, read every member's range.
    pub(super) fn scrub_head_ready(&mut self, led: &mut Ledger, unit: u64) {
        let head_sectors = self.cache.head_sectors;
        let u = self.cache.scrubs.get_mut(&unit).expect("scrub unit");
        u.heads_ready += 1;
        if u.heads_ready < u.heads.len() {
            return;
        }
        let len_sectors = u.heads.len() as u64 * head_sectors;
        u.started = true;
        u.pending = self.geo.raid_disks as u32;
        let len = (len_sectors * SECTOR_BYTES) as usize;
        for m in 0..self.geo.raid_disks {
            let spare = self.row_buf(len);
            self.issue_io(
                led,
                m,
                MemberIoOp::Read,
                unit,
                len_sectors,
                spare.into(),
                IoCtx::ScrubStripeRead { unit },
            );
        }
    }

    /// The array failed while `key` waited for its batch: release it (as `row_head_failed`).
    pub(super) fn scrub_head_failed(&mut self, led: &mut Ledger, key: u64, st: &mut super::Stripe) {
        let Some(unit) = st.sync.as_ref().map(|s| s.unit) else { return };
        let Some(u) = self.cache.scrubs.get_mut(&unit) else { return };
        if !u.started && super::row_sync::drop_claimed_head(&mut u.heads, &mut u.heads_ready, key, st) {
            self.cache.scrubs.remove(&unit);
            self.sync_unit_done(led, unit, false);
        }
    }

    pub(super) fn scrub_read_done(
        &mut self,
        led: &mut Ledger,
        unit: u64,
        member: usize,
        result: MemberIoResult,
    ) {
        let Some(u) = self.cache.scrubs.get_mut(&unit) else { return };
        u.pending -= 1;
        let gone = matches!(result, Err(MemberIoError::Gone));
        match result {
            Ok(data) => u.bufs[member] = Some(data),
            Err(_) => u.failed = true,
        }
        let (last, failed) = (u.pending == 0, u.failed);
        if gone {
            self.fail_member(led, member, self.now_ns);
        }
        if !last {
            return;
        }
        let job = self.sync.as_ref().filter(|j| j.unit_in_flight(unit)).map(|j| j.kind);
        if failed && !self.failed && job == Some(SyncKind::Resync) {
            // A resync unit that could not read a member: the per-head path redoes it,
            // rebuilding what did not read and rewriting it (md's read-error correction).
            return self.scrub_fall_back(unit);
        }
        // A stopped scrub (md's idle) only lets go of its heads.
        let Some(mode) = job.and_then(OnMismatch::of).filter(|_| !failed && !self.failed) else {
            self.scrub_unit_end(led, unit, !failed);
            return;
        };
        let u = self.cache.scrubs.get_mut(&unit).expect("scrub unit");
        let mut bufs: Vec<Vec<u8>> =
            u.bufs.iter_mut().map(|b| b.take().expect("every member read")).collect();
        let dirty = self.scrub_compare(unit, mode, &mut bufs);
        let mut writes = Vec::new();
        for (m, pages) in dirty.iter().enumerate() {
            if pages.is_empty() || !self.members[m].writable() {
                continue;
            }
            let buf = Arc::new(std::mem::take(&mut bufs[m]));
            let mut i = 0;
            while i < pages.len() {
                // Consecutive pages go in one write.
                let mut j = i + 1;
                while j < pages.len() && pages[j] == pages[j - 1] + 1 {
                    j += 1;
                }
                writes.push((m, pages[i], (j - i) as u64, buf.clone()));
                i = j;
            }
        }
        for v in bufs.into_iter().filter(|v| !v.is_empty()) {
            self.recycle_row_buf(v);
        }
        let u = self.cache.scrubs.get_mut(&unit).expect("scrub unit");
        u.pending = writes.len() as u32;
        for &(m, ..) in &writes {
            u.written[m] = true;
        }
        if writes.is_empty() {
            self.scrub_unit_end(led, unit, true);
            return;
        }
        for (m, page, n_pages, buf) in writes {
            let a = page as usize * PAGE_BYTES;
            let data = IoBytes::slice(&buf, a..a + n_pages as usize * PAGE_BYTES);
            let sector = unit + page * STRIPE_PAGE_SECTORS;
            let ctx = IoCtx::ScrubStripeWrite { unit };
            self.issue_io(led, m, MemberIoOp::Write, sector, n_pages * STRIPE_PAGE_SECTORS, data, ctx);
        }
    }

    /// Compare each page's parity with its data, count md's mismatches and, on repair or
    /// resync, fix the pages in `bufs`. Returns, per member, the pages to write back.
    ///
    /// A page a member lists bad holds data older than what was acknowledged there (a
    /// write failed): as md's analyse_stripe counts that block failed, it is solved from the
    /// others, never compared nor used to compute parity, and rewritten only when no write
    /// failed on the member this run (md skips an acknowledged bad block on a member with
    /// WriteErrorSeen). A page more members list than parity covers is left as it is.
    fn scrub_compare(&mut self, unit: u64, mode: OnMismatch, bufs: &mut [Vec<u8>]) -> Vec<Vec<u64>> {
        let (map, _) = self.cached_map(unit / self.geo.chunk_sectors);
        let mut dirty: Vec<Vec<u64>> = vec![Vec::new(); bufs.len()];
        let zero = [0u8; PAGE_BYTES];
        let (mut p, mut q) = ([0u8; PAGE_BYTES], [0u8; PAGE_BYTES]);
        let pages = bufs[map.pd_idx].len() / PAGE_BYTES;
        let listed = |e: &Self, m: usize, page: usize| {
            e.members[m].has_bad_block(unit + page as u64 * STRIPE_PAGE_SECTORS, STRIPE_PAGE_SECTORS)
        };
        for page in 0..pages {
            let rg = page * PAGE_BYTES..(page + 1) * PAGE_BYTES;
            let lost: Vec<usize> = (0..bufs.len()).filter(|&m| listed(self, m, page)).collect();
            if lost.len() > self.geo.level.parity_disks() {
                continue;
            }
            if !lost.is_empty() {
                solve_lost(&map, bufs, rg.clone(), &lost);
                if mode != OnMismatch::Count {
                    for &m in &lost {
                        dirty[m].push(page as u64);
                    }
                }
            }
            map.gen_parity(bufs, rg.clone(), &zero, &mut p, &mut q);
            let p_bad = p[..] != bufs[map.pd_idx][rg.clone()];
            let q_bad = map.qd_idx.is_some_and(|qd| q[..] != bufs[qd][rg.clone()]);
            if !p_bad && !q_bad {
                continue;
            }
            self.mismatch_cnt_sectors += STRIPE_PAGE_SECTORS;
            if mode == OnMismatch::Count {
                continue;
            }
            let mut fix = |m: usize, bytes: &[u8], bufs: &mut [Vec<u8>]| {
                bufs[m][rg.clone()].copy_from_slice(bytes);
                dirty[m].push(page as u64);
            };
            match (map.qd_idx, p_bad, q_bad) {
                (Some(qd), true, true) if mode == OnMismatch::Repair => {
                    // P' = P ^ P(data) and Q' = Q ^ Q(data) point at one data block when
                    // Q' = g^z * P' throughout: that block is rebuilt from P.
                    let dp: Vec<u8> =
                        p.iter().zip(&bufs[map.pd_idx][rg.clone()]).map(|(a, b)| a ^ b).collect();
                    let dq: Vec<u8> = q.iter().zip(&bufs[qd][rg.clone()]).map(|(a, b)| a ^ b).collect();
                    let culprit = culprit_slot(&dp, &dq)
                        .and_then(|z| map.syndrome_slot.iter().position(|&s| s == z))
                        .map(|dd| map.data_members[dd]);
                    match culprit {
                        Some(m) => {
                            let fixed: Vec<u8> =
                                bufs[m][rg.clone()].iter().zip(&dp).map(|(a, b)| a ^ b).collect();
                            fix(m, &fixed, bufs);
                        }
                        // md's repair: both syndromes rewritten from the data.
                        None => {
                            fix(map.pd_idx, &p, bufs);
                            fix(qd, &q, bufs);
                        }
                    }
                }
                // md's resync: P and Q from the data.
                (Some(qd), true, true) => {
                    fix(map.pd_idx, &p, bufs);
                    fix(qd, &q, bufs);
                }
                (Some(qd), false, true) => fix(qd, &q, bufs),
                _ => fix(map.pd_idx, &p, bufs),
            }
        }
        for (m, pages) in dirty.iter_mut().enumerate() {
            pages.sort_unstable();
            pages.dedup();
            if self.members[m].write_error_seen {
                pages.retain(|&page| !listed(self, m, page as usize));
            }
        }
        dirty
    }

    pub(super) fn scrub_write_done(
        &mut self,
        led: &mut Ledger,
        unit: u64,
        member: usize,
        result: MemberIoResult,
    ) {
        let Some(u) = self.cache.scrubs.get_mut(&unit) else { return };
        u.pending -= 1;
        if result.is_err() {
            u.failed = true;
        }
        let (last, ok) = (u.pending == 0, !u.failed);
        if result.is_err() {
            self.fail_member(led, member, self.now_ns);
        }
        if last {
            self.scrub_unit_end(led, unit, ok);
        }
    }

    /// Hand a resync unit that could not read every member to the per-head path.
    fn scrub_fall_back(&mut self, unit: u64) {
        let Some(mut u) = self.cache.scrubs.remove(&unit) else { return };
        for v in u.bufs.iter_mut().filter_map(Option::take) {
            self.recycle_row_buf(v);
        }
        self.heads_to_per_head(unit, u.heads, SyncKind::Resync);
    }

    /// Release the unit's heads (dropping cached rows of members repair rewrote, which may
    /// no longer match) and report the job unit.
    fn scrub_unit_end(&mut self, led: &mut Ledger, unit: u64, ok: bool) {
        let Some(mut u) = self.cache.scrubs.remove(&unit) else { return };
        for v in u.bufs.iter_mut().filter_map(Option::take) {
            self.recycle_row_buf(v);
        }
        for key in u.heads {
            let Some(st) = self.cache.heads.get_mut(&key) else { continue };
            let own_head = st.sync.as_ref().is_some_and(|s| s.own_head);
            st.sync = None;
            for (m, _) in u.written.iter().enumerate().filter(|(_, w)| **w) {
                st.dev[m].valid = 0;
            }
            if ok && own_head && st.idle() {
                self.evict(key);
            } else {
                self.cache.mark(key);
            }
        }
        self.sync_unit_done(led, unit, ok && !self.failed);
    }
}

/// The byte range `rg` of the `lost` members (no more than the parity covers) solved
/// from the others' in `bufs`: lost data from P (or Q, or both), then lost P and Q from
/// the data.
fn solve_lost(map: &StripeMap, bufs: &mut [Vec<u8>], rg: std::ops::Range<usize>, lost: &[usize]) {
    let lost_dd: Vec<usize> =
        (0..map.data_members.len()).filter(|&dd| lost.contains(&map.data_members[dd])).collect();
    let zero = vec![0u8; rg.len()];
    let mut outs = vec![vec![0u8; rg.len()]; lost_dd.len()];
    {
        let mut slots: Vec<&[u8]> = vec![&zero; map.syndrome_disks];
        for (dd, &m) in map.data_members.iter().enumerate() {
            slots[map.syndrome_slot[dd]] = &bufs[m][rg.clone()];
        }
        let p = (!lost.contains(&map.pd_idx)).then(|| &bufs[map.pd_idx][rg.clone()]);
        let q = map.qd_idx.filter(|q| !lost.contains(q)).map(|q| &bufs[q][rg.clone()]);
        let slot = |dd: usize| map.syndrome_slot[dd];
        match (lost_dd.as_slice(), outs.as_mut_slice()) {
            ([], _) => {}
            ([a], [out]) => match p {
                Some(p) => uraid_parity::recover_data_from_p(&slots, slot(*a), p, out),
                None => uraid_parity::recover_data_from_q(&slots, slot(*a), q.expect("Q survives"), out),
            },
            ([a, b], [out_a, out_b]) => {
                let (p, q) = (p.expect("P survives"), q.expect("Q survives"));
                uraid_parity::recover_2data(&slots, slot(*a), slot(*b), p, q, out_a, out_b);
            }
            _ => unreachable!("at most two members are solved for"),
        }
    }
    for (&dd, out) in lost_dd.iter().zip(&outs) {
        bufs[map.data_members[dd]][rg.clone()].copy_from_slice(out);
    }
    let p_lost = lost.contains(&map.pd_idx);
    let q_lost = map.qd_idx.is_some_and(|q| lost.contains(&q));
    if !p_lost && !q_lost {
        return;
    }
    let (mut p, mut q) = (vec![0u8; rg.len()], vec![0u8; rg.len()]);
    map.gen_parity(bufs, rg.clone(), &zero, &mut p, &mut q);
    if p_lost {
        bufs[map.pd_idx][rg.clone()].copy_from_slice(&p);
    }
    if let Some(qd) = map.qd_idx.filter(|_| q_lost) {
        bufs[qd][rg].copy_from_slice(&q);
    }
}

/// The syndrome slot z of the single data block whose corruption explains a page: with
/// dp = P ^ P(data) and dq = Q ^ Q(data), a bad block at slot z gives dq = g^z * dp at
/// every byte (mdadm's raid6check). None when no one slot explains every byte.
fn culprit_slot(dp: &[u8], dq: &[u8]) -> Option<usize> {
    let log = gf_log();
    let mut z = None;
    for (&a, &b) in dp.iter().zip(dq) {
        match (a, b) {
            (0, 0) => continue,
            (0, _) | (_, 0) => return None,
            _ => {
                let zb = (log[b as usize] as usize + 255 - log[a as usize] as usize) % 255;
                if z.is_some_and(|z| z != zb) {
                    return None;
                }
                z = Some(zb);
            }
        }
    }
    z
}

/// log base g = 2 in GF(2^8) with md's polynomial 0x11d.
fn gf_log() -> &'static [u8; 256] {
    static LOG: std::sync::OnceLock<[u8; 256]> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let mut log = [0u8; 256];
        let mut x: u8 = 1;
        for i in 0..255u8 {
            log[x as usize] = i;
            x = (x << 1) ^ if x & 0x80 != 0 { 0x1d } else { 0 };
        }
        log
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_syndrome_points_at_the_corrupted_slot() {
        let n = 5;
        let data: Vec<Vec<u8>> = (0..n).map(|i| (0..64).map(|b| (b * 7 + i * 31) as u8).collect()).collect();
        let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
        let (mut p, mut q) = (vec![0u8; 64], vec![0u8; 64]);
        uraid_parity::gen_syndrome(&refs, &mut p, &mut q);
        for z in 0..n {
            let mut bad = data.clone();
            bad[z][3] ^= 0x5a;
            bad[z][40] ^= 0x01;
            let refs: Vec<&[u8]> = bad.iter().map(|v| v.as_slice()).collect();
            let (mut p2, mut q2) = (vec![0u8; 64], vec![0u8; 64]);
            uraid_parity::gen_syndrome(&refs, &mut p2, &mut q2);
            let dp: Vec<u8> = p.iter().zip(&p2).map(|(a, b)| a ^ b).collect();
            let dq: Vec<u8> = q.iter().zip(&q2).map(|(a, b)| a ^ b).collect();
            assert_eq!(culprit_slot(&dp, &dq), Some(z));
        }
        // P alone wrong: no data slot explains it.
        let mut dp = vec![0u8; 64];
        dp[9] = 1;
        assert_eq!(culprit_slot(&dp, &[0u8; 64]), None);
    }
}
