//! Background work on one head at a time: a recovery, a replacement copy or a resync
//! of the rows a unit covers (row units and scrubs have rooms of their own).

use crate::engine::Mddev;
use crate::ledger::Ledger;

use super::*;

impl Mddev {
    pub(crate) fn cache_head_sectors(&self) -> u64 {
        self.cache.head_sectors
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
        // (block to write, engine member to write it to)
        let targets: Vec<(usize, usize)> = match kind {
            crate::sync::SyncKind::Recovery { member } => {
                if !self.members[member].writable() {
                    st.sync = None;
                    self.head_sync_done(led, unit, false);
                    return;
                }
                match self.ensure(led, key, st, member, full) {
                    Ensure::Pending => return,
                    Ensure::Lost => {
                        st.sync = None;
                        self.head_sync_done(led, unit, false);
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
                    Ensure::Ready => vec![(slot, self.replacement_index(slot))],
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
                parity.into_iter().map(|m| (m, m)).collect()
            }
        };
        let mut writes = 0;
        for (block, m) in targets {
            if !self.target_writable(m) {
                continue;
            }
            let data = st.dev[block].block.as_ref().expect("rebuilt").view(bytes(0, self.cache.head_sectors));
            if block == m {
                st.dev[m].bad = 0; // the whole head is rewritten
            }
            writes += 1;
            st.inflight += 1;
            let n = self.cache.head_sectors;
            self.issue_io(led, m, MemberIoOp::Write, st.base_sector, n, data, IoCtx::StripeSyncWrite { key });
        }
        if writes == 0 {
            st.sync = None;
            self.head_sync_done(led, unit, true);
        } else {
            st.sync.as_mut().expect("sync").writing = Some(writes);
        }
    }
}
