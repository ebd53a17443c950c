//! Member-I/O completions of the stripe machine, routed by why they were issued.

use crate::api::*;
use crate::block::Block;
use crate::engine::Mddev;
use crate::ledger::Ledger;
use crate::sectors::{rows, runs};

use super::*;

impl Mddev {
    pub(crate) fn stripe_io_done(
        &mut self,
        led: &mut Ledger,
        ctx: IoCtx,
        member: usize,
        result: MemberIoResult,
    ) {
        match ctx {
            IoCtx::BypassRead { req, array_sector, len_sectors, dest_off } => match result {
                Ok(data) => {
                    self.read_part_done(led, req, dest_off, len_sectors, data);
                }
                Err(e) => {
                    // md retries a failed aligned read through the stripe cache.
                    if e == MemberIoError::Gone {
                        self.fail_member(led, member, self.now_ns);
                    }
                    if let Some(r) = led.reqs.get_mut(&req) {
                        r.parts -= 1;
                    }
                    self.stripe_read_via_cache(led, req, array_sector, len_sectors, dest_off);
                    return;
                }
            },
            IoCtx::Fill { key, rows: rws } => {
                let Some(st) = self.cache.heads.get_mut(&key) else { return };
                st.inflight -= 1;
                st.dev[member].reading &= !rws;
                let gone = matches!(result, Err(MemberIoError::Gone));
                let (r0, n) = runs(rws).next().expect("a fill reads one run of rows");
                let read_rg = bytes(r0, n);
                let mut retry = None;
                match result {
                    Ok(data) if st.dev[member].valid == 0 && data.len() == read_rg.len() => {
                        // Read into a slot holding nothing valid: the read's buffer is adopted
                        // as it came (no copy); the slot's old buffer is recycled.
                        let fresh = Block::window(read_rg.start, IoBytes::from(data));
                        st.dev[member].valid = rws;
                        if let Some(old) = st.dev[member].block.replace(fresh) {
                            self.recycle_buf(old);
                        }
                    }
                    Ok(data) => {
                        let fresh = rws & !st.dev[member].valid;
                        let mut slot = st.dev[member].block.take();
                        self.cover(&mut slot, read_rg.clone());
                        let blk = slot.as_mut().expect("covered");
                        for (a, len) in runs(fresh) {
                            let src = bytes(a, len);
                            blk.rows_mut(src.clone())
                                .copy_from_slice(&data[src.start - read_rg.start..src.end - read_rg.start]);
                        }
                        let st = self.cache.heads.get_mut(&key).expect("head");
                        st.dev[member].block = slot;
                        st.dev[member].valid |= fresh;
                        self.recycle_buf(Block::window(0, IoBytes::from(data)));
                    }
                    // Only the failing sectors may be rebuilt (from parity a resync may not
                    // have reached yet): the halves are read again until they are found.
                    Err(MemberIoError::Io)
                        if n > 1 && self.members[member].readable(st.base_sector + r0 + n - 1) =>
                    {
                        retry = Some((r0, n));
                    }
                    Err(MemberIoError::Io) => st.dev[member].bad |= rws,
                    Err(MemberIoError::Gone) => {}
                }
                if let Some((r0, n)) = retry {
                    let half = n / 2;
                    for (a, len) in [(r0, half), (r0 + half, n - half)] {
                        let st = self.cache.heads.get_mut(&key).expect("head");
                        st.dev[member].reading |= rows(a, a + len);
                        st.inflight += 1;
                        let base = st.base_sector;
                        let ctx = IoCtx::Fill { key, rows: rows(a, a + len) };
                        self.issue_io(led, member, MemberIoOp::Read, base + a, len, IoBytes::new(), ctx);
                    }
                }
                // A write batch waits for all its reads: while others are in flight, and no
                // reader or sync could use these rows alone, the head has nothing to do yet.
                let st = self.cache.heads.get_mut(&key).expect("head");
                let waiting_on_more =
                    st.dev.iter().any(|d| d.reading != 0) && st.readers.is_empty() && st.sync.is_none();
                if gone || !waiting_on_more {
                    queue_head(&mut self.cache.dirty, key, st);
                }
                if gone {
                    self.fail_member(led, member, self.now_ns);
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
                if result.is_err()
                    && !(result == Err(MemberIoError::Io) && self.record_write_error(led, member))
                {
                    self.fail_member(led, member, self.now_ns);
                }
                // Until the batch's last write lands the head cannot move on: no re-analysis.
                if left == 0 {
                    let mut st = self.cache.heads.remove(&key).expect("head");
                    self.finish_batch(led, &mut st);
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
                    self.fail_member(led, member, self.now_ns);
                }
                // A recovery target that failed left the job (raid6 rebuilds two at once):
                // the unit counts while the job still runs it.
                let job_runs_it = self.sync.as_ref().is_some_and(|j| {
                    j.unit_in_flight(unit) && matches!(j.kind, crate::sync::SyncKind::Recovery { .. })
                });
                if left == 0 {
                    self.head_sync_done(led, unit, (result.is_ok() || job_runs_it) && !self.failed);
                }
            }
            IoCtx::PplLog { .. } | IoCtx::PplLogFlush { .. } | IoCtx::PplFlush { .. } => {
                self.ppl_io_done(led, ctx, member, result.is_ok())
            }
            IoCtx::RowSyncRead { unit } => self.row_read_done(led, unit, member, result),
            IoCtx::RowSyncWrite { unit } => self.row_write_done(led, unit, member, result),
            IoCtx::ScrubStripeRead { unit } => self.scrub_read_done(led, unit, member, result),
            IoCtx::ScrubStripeWrite { unit } => self.scrub_write_done(led, unit, member, result),
            IoCtx::Rewrite { key, rows: rws, .. } => {
                if let Some(st) = self.cache.heads.get_mut(&key) {
                    st.inflight -= 1;
                    st.dev[member].rewriting &= !rws;
                    if result.is_ok() {
                        st.dev[member].bad &= !rws;
                    }
                }
                if result.is_ok() {
                    self.stats.read_errors_corrected += 1;
                } else {
                    if !(result == Err(MemberIoError::Io) && self.record_write_error(led, member)) {
                        self.fail_member(led, member, self.now_ns);
                    }
                    if let Some(st) = self.cache.heads.get_mut(&key) {
                        st.dev[member].bad &= !rws;
                    }
                }
                self.cache.mark(key);
            }
            _ => {}
        }
        self.run_stripes(led);
    }
}
