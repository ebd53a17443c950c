//! Background work on one head at a time: a recovery, a replacement copy or a resync
//! of the rows a unit covers (row units and scrubs have rooms of their own).

use crate::engine::Mddev;
use crate::ledger::Ledger;

use super::*;

impl Mddev {
    pub(crate) fn cache_head_sectors(&self) -> u64 {
        self.cache.head_sectors
    }

    /// A recovery's head for `member`: every row made ready in the cache but those nothing
    /// can rebuild, which are returned. None while reads are pending; Some(None) when it
    /// cannot go on.
    fn recovery_ready(
        &mut self,
        led: &mut Ledger,
        key: u64,
        st: &mut Stripe,
        member: usize,
    ) -> Option<Option<SectorMask>> {
        let full = self.cache.full_mask;
        let mut lost = 0;
        loop {
            match self.ensure(led, key, st, member, full & !lost) {
                Ensure::Pending => return None,
                Ensure::Ready => return Some(Some(lost)),
                Ensure::Lost => match self.rows_beyond_redundancy(st, full & !lost & !st.dev[member].valid) {
                    0 => return Some(None),
                    more => lost |= more,
                },
            }
        }
    }

    pub(super) fn advance_sync(&mut self, led: &mut Ledger, key: u64, st: &mut Stripe) {
        let Some(op) = st.sync.as_mut() else { return };
        if op.row {
            // A row unit does the I/O; it only waits for the head's batch and rewrites.
            if !op.ready && st.batch.is_none() && st.dev.iter().all(|d| d.rewriting == 0) {
                op.ready = true;
                let unit = op.unit;
                self.row_head_ready(led, unit);
            }
            return;
        }
        if op.writing.is_some() {
            return;
        }
        let (unit, kind) = (op.unit, op.kind);
        let full = self.cache.full_mask;
        // (block to write, engine member to write it to, rows): all of them, but for a
        // recovery's rows nothing can rebuild.
        let targets: Vec<(usize, usize, SectorMask)> = match kind {
            crate::sync::SyncKind::Recovery { member } => {
                // Every member the pass rebuilds (raid6: two from one read of the others).
                let mut members = self.recovery_targets();
                if !members.contains(&member) {
                    members = vec![member];
                }
                members.retain(|&m| self.members[m].writable());
                if members.is_empty() {
                    st.sync = None;
                    self.head_sync_done(led, unit, false);
                    return;
                }
                let mut ready = Vec::with_capacity(members.len());
                for &m in &members {
                    match self.recovery_ready(led, key, st, m) {
                        None => return,
                        Some(Some(lost)) => ready.push((m, lost)),
                        Some(None) => {
                            st.sync = None;
                            self.head_sync_done(led, unit, false);
                            return;
                        }
                    }
                }
                // md's handle_failed_sync: rows more sources than parity covers cannot
                // supply are recorded as bad blocks on the member rebuilt, and the recovery
                // goes on (reads there fail, as md's do). With no room in its log to say so,
                // it stops (md's recovery_disabled): the member never looks rebuilt there.
                let mut out = Vec::with_capacity(ready.len());
                for (m, lost) in ready {
                    if !runs(lost).all(|(r0, n)| self.record_bad_block(m, st.base_sector + r0, n)) {
                        st.sync = None;
                        self.head_sync_done(led, unit, false);
                        return;
                    }
                    out.push((m, m, full & !lost));
                }
                out
            }
            // The member's own block, read from it (a failed read is rebuilt from the others
            // and rewritten to it by `ensure`), goes to the replacement.
            crate::sync::SyncKind::Replace { slot } => {
                if self.replacements[slot].is_none() {
                    st.sync = None;
                    self.head_sync_done(led, unit, false);
                    return;
                }
                match self.ensure(led, key, st, slot, full) {
                    Ensure::Pending => return,
                    Ensure::Lost => {
                        st.sync = None;
                        self.head_sync_done(led, unit, false);
                        return;
                    }
                    // Not while the rebuilt rows are being rewritten to the member: the
                    // rewrite reaches the replacement too, and must not land after this copy.
                    Ensure::Ready if st.dev[slot].rewriting != 0 => return,
                    Ensure::Ready => vec![(slot, self.replacement_index(slot), full)],
                }
            }
            // Scrub units always claim their heads as a row (see `stripe::scrub`).
            crate::sync::SyncKind::Scrub(_) => {
                st.sync = None;
                self.head_sync_done(led, unit, false);
                return;
            }
            crate::sync::SyncKind::Resync => {
                let mut ready = true;
                for &m in &st.map.data_members.clone() {
                    match self.ensure(led, key, st, m, full) {
                        Ensure::Ready => {}
                        Ensure::Pending => ready = false,
                        Ensure::Lost => {
                            st.sync = None;
                            self.head_sync_done(led, unit, false);
                            return;
                        }
                    }
                }
                if !ready {
                    return;
                }
                for m in std::iter::once(st.map.pd_idx).chain(st.map.qd_idx) {
                    self.cover(&mut st.dev[m].block, bytes(0, self.cache.head_sectors));
                }
                self.compute_parity(st, bytes(0, self.cache.head_sectors), true, true);
                let parity: Vec<usize> = std::iter::once(st.map.pd_idx).chain(st.map.qd_idx).collect();
                for &m in &parity {
                    st.dev[m].valid |= full;
                }
                parity.into_iter().map(|m| (m, m, full)).collect()
            }
        };
        let mut writes = 0;
        for (block, m, write_rows) in targets {
            if !self.target_writable(m) {
                continue;
            }
            if block == m {
                st.dev[m].bad &= !write_rows; // rewritten
            }
            for (r0, n) in runs(write_rows) {
                let data = st.dev[block].block.as_ref().expect("rebuilt").view(bytes(r0, n));
                writes += 1;
                st.inflight += 1;
                let ctx = IoCtx::StripeSyncWrite { key };
                self.issue_io(led, m, MemberIoOp::Write, st.base_sector + r0, n, data, ctx);
            }
        }
        if writes == 0 {
            st.sync = None;
            self.head_sync_done(led, unit, true);
        } else {
            st.sync.as_mut().expect("sync").writing = Some(writes);
        }
    }
}
