//! raid4/5/6 recovery a row at a time: one member I/O per member for up to 16 stripe heads
//! of one chunk row, instead of one per head.
//!
//! Rebuilding through the stripe cache costs one member I/O per 64 KiB head and member;
//! on fast members the per-I/O cost (queueing, a worker's wake-up, a completion) then
//! weighs more than the copy itself. A row unit claims every head of its range, waits until
//! none of them has a write batch in flight, reads each survivor's whole range into one
//! buffer, computes the lost member's range straight from those buffers and writes it with
//! one I/O. The claimed heads start no write batch until the unit is done (the barrier
//! md's sync keeps per stripe): requests' writes queue in the heads meanwhile, so the
//! survivors never change under the unit, and the rebuilt data lands before any newer
//! write to the same rows.
//!
//! Whatever the fast path does not cover falls back to the per-head sync of each claimed
//! head (see `Engine::advance_sync`), which knows read-error correction and a second lost
//! member: a unit where some other member is not fully readable, and a unit whose survivor
//! read failed. A resync claims its heads the same way, as a scrub unit that compares parity
//! and writes only what is wrong (`stripe::scrub`), or per head where a member cannot be read.

use std::sync::Arc;

use super::{HeadsLeft, IoCtx, RowUnit, SyncOp};
use crate::api::*;
use crate::engine::Mddev;
use crate::geometry::StripeMap;
use crate::ledger::Ledger;
use crate::sync::SyncKind;

/// Heads a row unit covers at most (1 MiB of each member with 64 KiB heads).
pub(crate) const MAX_ROW_HEADS: u64 = 16;

/// How a sync unit claims its heads.
enum Claim {
    /// A recovery row unit rebuilding these members.
    Row(Vec<usize>),
    /// A scrub unit (check, repair, or a comparing resync).
    Scrub,
}

/// A claimed head leaves its unit before the unit started (the array failed while it
/// waited for its batch); true when the unit has no head left.
pub(super) fn drop_claimed_head(
    heads: &mut Vec<u64>,
    heads_ready: &mut usize,
    key: u64,
    st: &mut super::Stripe,
) -> bool {
    if st.sync.as_ref().is_some_and(|s| s.ready) {
        *heads_ready -= 1;
    }
    heads.retain(|&k| k != key);
    st.sync = None;
    heads.is_empty()
}

impl Mddev {
    /// Member sectors of one sync job unit on raid4/5/6: the heads of a chunk row, up to
    /// `MAX_ROW_HEADS` of them and an eighth of the stripe cache (always inside one chunk,
    /// so inside one stripe), and short enough that two units' buffers of every member fit
    /// in the sync's budget (`sync_budget_bytes`): on wide arrays a unit is fewer heads.
    pub(crate) fn stripe_sync_unit_sectors(&self) -> u64 {
        let cache_share = self.sync_cache_share_heads().max(1);
        let per_chunk = self.cache.heads_per_chunk;
        let head_row_bytes = self.cache.head_sectors * SECTOR_BYTES * self.geo.raid_disks as u64;
        let by_budget = self.sync_budget_bytes() / (2 * head_row_bytes);
        // A divisor of the heads per chunk, so units tile chunks and never straddle two.
        let mut heads = per_chunk.min(MAX_ROW_HEADS).min(cache_share).min(by_budget).max(1);
        while !per_chunk.is_multiple_of(heads) {
            heads -= 1;
        }
        self.cache.head_sectors * heads
    }

    /// Claim the heads of member sectors [start, end) for the running sync job: a row unit
    /// for recovery where every other member is readable over the range, per-head syncs
    /// otherwise. False (nothing claimed) when some head cannot be had now.
    pub(crate) fn start_stripe_sync(&mut self, start: u64, end: u64) -> bool {
        let Some(kind) = self.sync.as_ref().map(|j| j.kind) else { return false };
        let h = self.cache.head_sectors;
        let keys: Vec<u64> = (start / h..end.div_ceil(h)).collect();
        if !self.cache.waiting.is_empty()
            || keys.iter().any(|k| self.cache.heads.get(k).is_some_and(|st| st.sync.is_some()))
        {
            return false;
        }
        // Heads of a unit are claimed all together: room for all of them first (idle heads
        // of the unit itself leave the LRU when claimed, so they are no room for the rest).
        let free_room = self.tun.stripe_cache_size.saturating_sub(self.cache.heads.len())
            + self.cache.heads.iter().filter(|(k, st)| st.lru_stamp != 0 && !keys.contains(k)).count();
        if keys.iter().filter(|k| !self.cache.heads.contains_key(k)).count() > free_room {
            return false;
        }
        let row = match kind {
            SyncKind::Recovery { member } => {
                let last = end - 1;
                let targets = self.recovery_targets();
                // A listed bad block on another member leaves the unit to the per-head path,
                // which rebuilds around it (a row unit reads every other member whole).
                let others_whole = (0..self.geo.raid_disks).all(|m| {
                    targets.contains(&m)
                        || self.members[m].state == crate::config::MemberState::InSync
                            && !self.members[m].has_bad_block(start, end - start)
                });
                let writable = targets.iter().all(|&t| self.members[t].writable());
                let unbuilt = targets.iter().any(|&t| !self.members[t].readable(last));
                (others_whole && targets.contains(&member) && writable && unbuilt)
                    .then_some(Claim::Row(targets))
            }
            // md's resync compares parity and writes it only where it is wrong: a scrub
            // unit (see `stripe::scrub`) where every member can be read over the range,
            // the per-head path otherwise.
            SyncKind::Resync => (0..self.geo.raid_disks)
                .all(|m| {
                    self.members[m].state == crate::config::MemberState::InSync
                        && !self.members[m].has_bad_block(start, end - start)
                })
                .then_some(Claim::Scrub),
            // Replacement copies read one member per head: the per-head path (see `replace`).
            SyncKind::Replace { .. } => None,
            // A scrub unit claims its heads like a row unit: no batch starts on them until
            // its reads are compared and its rewrites have landed (md's sync barrier).
            SyncKind::Scrub(_) => Some(Claim::Scrub),
        };
        for (i, &key) in keys.iter().enumerate() {
            let own_head = !self.cache.heads.contains_key(&key);
            if !self.get_stripe(key) {
                // Room was checked, so this should not happen; if it does, let go of the
                // heads claimed so far and try the unit again later.
                for k in &keys[..i] {
                    if let Some(st) = self.cache.heads.get_mut(k) {
                        st.sync = None;
                    }
                    self.cache.mark(*k);
                }
                return false;
            }
            let st = self.cache.heads.get_mut(&key).expect("head");
            // A row unit's heads count as writing from the start: no batch starts on them.
            let writing = row.as_ref().map(|_| 0);
            st.sync = Some(SyncOp { unit: start, kind, writing, own_head, row: row.is_some(), ready: false });
            self.cache.mark(key);
        }
        match row {
            Some(Claim::Scrub) => self.new_scrub_unit(start, keys),
            Some(Claim::Row(targets)) => {
                let unit = RowUnit {
                    targets,
                    heads: keys,
                    heads_ready: 0,
                    started: false,
                    pending: 0,
                    bufs: vec![None; self.geo.raid_disks],
                    read_failed: false,
                    written: Vec::new(),
                };
                self.cache.rows.insert(start, unit);
            }
            None if keys.len() > 1 => {
                self.cache.heads_left.insert(start, HeadsLeft { left: keys.len() as u32, ok: true });
            }
            None => {}
        }
        true
    }

    /// A head's per-head sync finished (ok = its writes landed).
    pub(crate) fn head_sync_done(&mut self, led: &mut Ledger, unit: u64, ok: bool) {
        // A unit handed to the per-head path is done with its last head.
        let ok = match self.cache.heads_left.get_mut(&unit) {
            Some(hl) => {
                hl.left -= 1;
                hl.ok &= ok;
                if hl.left > 0 {
                    return;
                }
                let ok = hl.ok;
                self.cache.heads_left.remove(&unit);
                ok
            }
            None => ok,
        };
        self.sync_unit_done(led, unit, ok);
    }

    /// Called by the head handler for a head claimed by a row unit that has no batch in
    /// flight: once all of the unit's heads are so, the unit reads its survivors.
    pub(super) fn row_head_ready(&mut self, led: &mut Ledger, unit: u64) {
        if self.cache.scrubs.contains_key(&unit) {
            return self.scrub_head_ready(led, unit);
        }
        let Some(u) = self.cache.rows.get_mut(&unit) else { return };
        u.heads_ready += 1;
        if u.heads_ready < u.heads.len() {
            return;
        }
        let (targets, n_heads) = (u.targets.clone(), u.heads.len() as u64);
        let len_sectors = n_heads * self.cache.head_sectors;
        let len = (len_sectors * SECTOR_BYTES) as usize;
        // With one target one survivor is not needed: a lost data block or P comes from the
        // data and P, a lost Q from the data alone. md reads every member during a sync;
        // raid6 recovery reads one member in five (of six) less here.
        let (map, _) = self.cached_map(unit / self.geo.chunk_sectors);
        let unneeded = match targets[..] {
            [target] => map.qd_idx.map(|q| if target == q { map.pd_idx } else { q }),
            _ => None,
        };
        let mut reads = 0;
        for m in 0..self.geo.raid_disks {
            if targets.contains(&m) || Some(m) == unneeded {
                continue;
            }
            let spare = self.row_buf(len);
            reads += 1;
            self.issue_io(
                led,
                m,
                MemberIoOp::Read,
                unit,
                len_sectors,
                spare.into(),
                IoCtx::RowSyncRead { unit },
            );
        }
        let u = self.cache.rows.get_mut(&unit).expect("row unit");
        u.pending = reads;
        u.started = true;
    }

    /// The array failed while `key`, claimed by a row unit that has not started reading,
    /// waited for its batch: release it (a unit already reading is released by its
    /// completions).
    pub(super) fn row_head_failed(&mut self, led: &mut Ledger, key: u64, st: &mut super::Stripe) {
        let Some(unit) = st.sync.as_ref().map(|s| s.unit) else { return };
        if self.cache.scrubs.contains_key(&unit) {
            return self.scrub_head_failed(led, key, st);
        }
        let Some(u) = self.cache.rows.get_mut(&unit) else { return };
        if !u.started && drop_claimed_head(&mut u.heads, &mut u.heads_ready, key, st) {
            self.cache.rows.remove(&unit);
            self.sync_unit_done(led, unit, false);
        }
    }

    /// A recycled row buffer of `len` bytes (its contents are overwritten by the read).
    pub(super) fn row_buf(&mut self, len: usize) -> Vec<u8> {
        match self.cache.row_pool.pop() {
            Some(v) if v.len() == len => v,
            _ => vec![0; len],
        }
    }

    /// Keep a row buffer for the next units: as many as the sync's budget holds (the
    /// units in flight never need more), at least a unit's worth.
    pub(super) fn recycle_row_buf(&mut self, v: Vec<u8>) {
        let cap = (self.sync_budget_bytes() / v.len().max(1) as u64) as usize;
        if self.cache.row_pool.len() < cap.max(self.geo.raid_disks + 1) {
            self.cache.row_pool.push(v);
        }
    }

    pub(super) fn row_read_done(
        &mut self,
        led: &mut Ledger,
        unit: u64,
        member: usize,
        result: MemberIoResult,
    ) {
        let Some(u) = self.cache.rows.get_mut(&unit) else { return };
        u.pending -= 1;
        let gone = matches!(result, Err(MemberIoError::Gone));
        match result {
            Ok(data) => u.bufs[member] = Some(data),
            Err(_) => u.read_failed = true,
        }
        let last = u.pending == 0;
        if gone {
            self.fail_member(led, member, self.now_ns);
        }
        if !last {
            return;
        }
        let u = self.cache.rows.get_mut(&unit).expect("row unit");
        let targets = u.targets.clone();
        let job_targets = self.recovery_targets();
        let job_on = targets.iter().all(|t| job_targets.contains(t) && self.members[*t].writable());
        let u = self.cache.rows.get_mut(&unit).expect("row unit");
        if u.read_failed || self.failed || !job_on {
            self.row_fall_back(unit);
            return;
        }
        let mut bufs = std::mem::take(&mut u.bufs);
        let len = bufs.iter().flatten().next().expect("survivors read").len();
        let mut outs: Vec<Vec<u8>> = targets.iter().map(|_| self.row_buf(len)).collect();
        self.compute_row(unit, &targets, &bufs, &mut outs);
        for v in bufs.iter_mut().filter_map(Option::take) {
            self.recycle_row_buf(v);
        }
        let outs: Vec<Arc<Vec<u8>>> = outs.into_iter().map(Arc::new).collect();
        let u = self.cache.rows.get_mut(&unit).expect("row unit");
        u.pending = targets.len() as u32;
        u.written = outs.clone();
        let len_sectors = len as u64 / SECTOR_BYTES;
        for (&target, out) in targets.iter().zip(&outs) {
            let data = IoBytes::slice(out, 0..len);
            self.issue_io(
                led,
                target,
                MemberIoOp::Write,
                unit,
                len_sectors,
                data,
                IoCtx::RowSyncWrite { unit },
            );
        }
    }

    /// The lost members' ranges (one, or two on raid6) from the survivors' (all of the
    /// stripe's other members, but one not needed for a single target).
    fn compute_row(&mut self, unit: u64, targets: &[usize], bufs: &[Option<Vec<u8>>], outs: &mut [Vec<u8>]) {
        let (map, dd_of) = self.cached_map(unit / self.geo.chunk_sectors);
        let len = outs[0].len();
        if self.cache.row_zero.len() < len {
            self.cache.row_zero = vec![0; len];
        }
        let mut scratch =
            self.cache.row_pool.pop().filter(|v| v.len() == len).unwrap_or_else(|| vec![0; len]);
        let zero = &self.cache.row_zero[..len];
        let mut slots: Vec<&[u8]> = vec![zero; map.syndrome_disks];
        for (dd, &m) in map.data_members.iter().enumerate() {
            if !targets.contains(&m) {
                slots[map.syndrome_slot[dd]] = bufs[m].as_deref().expect("survivor read");
            }
        }
        let slot_of = |m: usize| dd_of[m].map(|dd| map.syndrome_slot[dd]);
        let is_p = |m: usize| m == map.pd_idx;
        match (targets, &mut outs[..]) {
            (&[t], [out]) => match slot_of(t) {
                Some(z) => {
                    let p = bufs[map.pd_idx].as_deref().expect("P read");
                    uraid_parity::recover_data_from_p(&slots, z, p, out);
                }
                None if is_p(t) => uraid_parity::xor_gen(&slots, out),
                // Q: the syndrome also yields P, into a scratch buffer.
                None => uraid_parity::gen_syndrome(&slots, &mut scratch, out),
            },
            (&[a, b], [out_a, out_b]) => match (slot_of(a), slot_of(b)) {
                (Some(za), Some(zb)) => {
                    let p = bufs[map.pd_idx].as_deref().expect("P read");
                    let q = bufs[map.qd_idx.expect("raid6")].as_deref().expect("Q read");
                    uraid_parity::recover_2data(&slots, za, zb, p, q, out_a, out_b);
                }
                // Both syndromes: from the data alone.
                (None, None) if is_p(a) => uraid_parity::gen_syndrome(&slots, out_a, out_b),
                (None, None) => uraid_parity::gen_syndrome(&slots, out_b, out_a),
                // One data block and a syndrome: the block from the surviving syndrome, then
                // the lost syndrome from the data.
                (Some(z), None) => Self::data_and_syndrome(&map, &mut slots, z, is_p(b), bufs, out_a, out_b),
                (None, Some(z)) => Self::data_and_syndrome(&map, &mut slots, z, is_p(a), bufs, out_b, out_a),
            },
            _ => unreachable!("one or two members rebuilt at once"),
        }
        self.cache.row_pool.push(scratch);
    }

    /// Data slot `z` and one syndrome (P when `p_lost`, else Q) rebuilt: the block from the
    /// surviving syndrome and the other data, then the lost syndrome from all the data.
    fn data_and_syndrome<'a>(
        map: &StripeMap,
        slots: &mut Vec<&'a [u8]>,
        z: usize,
        p_lost: bool,
        bufs: &[Option<Vec<u8>>],
        out_data: &'a mut [u8],
        out_syndrome: &mut [u8],
    ) {
        let mut scratch = vec![0u8; out_syndrome.len()];
        if p_lost {
            let q = bufs[map.qd_idx.expect("raid6")].as_deref().expect("Q read");
            uraid_parity::recover_data_from_q(slots, z, q, out_data);
            slots[z] = &*out_data;
            uraid_parity::gen_syndrome(slots, out_syndrome, &mut scratch);
        } else {
            let p = bufs[map.pd_idx].as_deref().expect("P read");
            uraid_parity::recover_data_from_p(slots, z, p, out_data);
            slots[z] = &*out_data;
            uraid_parity::gen_syndrome(slots, &mut scratch, out_syndrome);
        }
    }

    pub(super) fn row_write_done(
        &mut self,
        led: &mut Ledger,
        unit: u64,
        member: usize,
        result: MemberIoResult,
    ) {
        let Some(u) = self.cache.rows.get_mut(&unit) else { return };
        u.pending -= 1;
        let last = u.pending == 0;
        // A target whose write failed is failed, which takes it out of the job (or stops
        // the job, its own member failing); the unit is done once every write is.
        if result.is_err() {
            self.fail_member(led, member, self.now_ns);
        }
        if !last {
            return;
        }
        let Some(mut u) = self.cache.rows.remove(&unit) else { return };
        // The executor has let go of the written bytes: the buffers serve the next units.
        for v in std::mem::take(&mut u.written).into_iter().filter_map(|b| Arc::try_unwrap(b).ok()) {
            self.recycle_row_buf(v);
        }
        // Failed targets left the job; the unit counts while one of them is still rebuilt.
        let ok = u.targets.iter().any(|&t| self.members[t].writable());
        for key in u.heads {
            let Some(st) = self.cache.heads.get_mut(&key) else { continue };
            let own_head = st.sync.as_ref().is_some_and(|s| s.own_head);
            st.sync = None;
            if ok && own_head && st.idle() {
                self.evict(key);
            } else {
                self.cache.mark(key);
            }
        }
        self.sync_unit_done(led, unit, ok && !self.failed);
    }

    /// Hand the unit to the per-head path: each claimed head syncs on its own, and the job
    /// unit is done when the last of them is.
    fn row_fall_back(&mut self, unit: u64) {
        let Some(u) = self.cache.rows.remove(&unit) else { return };
        for v in u.bufs.into_iter().flatten() {
            self.recycle_row_buf(v);
        }
        self.heads_to_per_head(unit, u.heads, SyncKind::Recovery { member: u.targets[0] });
    }

    /// The claimed `heads` of a unit each sync on their own as `kind`; the job unit is
    /// done when the last of them is.
    pub(super) fn heads_to_per_head(&mut self, unit: u64, heads: Vec<u64>, kind: SyncKind) {
        let n = heads.len() as u32;
        self.cache.heads_left.insert(unit, HeadsLeft { left: n, ok: true });
        for key in heads {
            let st = self.cache.heads.get_mut(&key).expect("claimed head");
            let op = st.sync.as_mut().expect("claimed head");
            op.kind = kind;
            op.writing = None;
            op.row = false;
            self.cache.mark(key);
        }
    }
}
