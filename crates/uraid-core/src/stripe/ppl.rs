//! md's partial parity log on the write path (drivers/md/raid5-ppl.c), RAID5 only.
//!
//! Before a batch's data and parity go to the members, the partial parity of every
//! 4 KiB row group it writes (md's stripe_head) is logged to the PPL area of the stripe's
//! parity member: the XOR of the data the write leaves alone, in a header entry naming
//! the rows and the data members written (md's `ppl_log_stripe`). The log write is FUA;
//! only when it is durable are the batch's member writes issued. After a crash,
//! `meta::ppl_recover` rebuilds the parity of the logged rows from it.
//!
//! As in md, each member's log is a queue of io_units: the first is written while later
//! batches gather in the last; the next is written only once every batch of the one
//! before has landed and the members they wrote were flushed, because a replay reads only
//! the newest header of each area. Entries describe a contiguous run of logical data
//! members (md makes a write to members that are not contiguous wait; here the members in
//! between count as written: their data is unchanged, so the entry still gives the right
//! parity).

use std::collections::VecDeque;

use crate::engine::Mddev;
use crate::geometry::Level;
use crate::ledger::Ledger;
use crate::meta::ppl::{
    crc32c_update, ppl_entry_space_bytes, ppl_usable_sectors, ppl_uses_multiple, PplEntry, PplHeader,
    PPL_HDR_MAX_ENTRIES, PPL_HEADER_SIZE,
};
use crate::sectors::{rows, SectorMask};

use super::*;

/// md's STRIPE_SECTORS: partial parity is logged per 4 KiB row group.
const GROUP_SECTORS: u64 = 8;
const GROUP_BYTES: usize = 4096;
const HEADER_SECTORS: u64 = (PPL_HEADER_SIZE / 512) as u64;

fn bit(m: usize) -> u128 {
    1u128 << m
}

impl Mddev {
    pub(crate) fn enable_ppl(&mut self, signature: u32, areas: &[Option<(u64, u64)>]) {
        if self.geo.level != Level::Raid5 || !self.geo.chunk_sectors.is_multiple_of(GROUP_SECTORS) {
            return;
        }
        let logs = (0..self.geo.raid_disks)
            .map(|slot| {
                let (start, sectors) = areas.get(slot).copied().flatten()?;
                let usable = ppl_usable_sectors(sectors)?;
                Some(PplLog {
                    area_sector: start,
                    area_sectors: usable,
                    entry_space_bytes: ppl_entry_space_bytes(usable),
                    multiple: ppl_uses_multiple(usable),
                    next_io_sector: start,
                    reset_pending: false,
                    area_ready: true,
                    units: VecDeque::new(),
                })
            })
            .collect();
        self.ppl = Some(Box::new(Ppl { signature, seq: 0, logs }));
    }

    pub(crate) fn ppl_enabled(&self) -> bool {
        self.ppl.is_some()
    }

    pub(crate) fn ppl_idle(&self) -> bool {
        self.ppl.as_ref().is_none_or(|p| p.logs.iter().flatten().all(|l| l.units.is_empty()))
    }

    /// Another device now serves `slot`: its area is emptied by the next log write.
    pub(crate) fn ppl_member_changed(&mut self, slot: usize) {
        if let Some(Some(log)) = self.ppl.as_mut().and_then(|p| p.logs.get_mut(slot)) {
            log.reset_pending = true;
            log.next_io_sector = log.area_sector;
        }
    }

    /// A device joins `slot` by a recovery: the array empties its area (md's
    /// `ppl_write_empty_header` in raid5_add_disk) before anything is logged there.
    pub(crate) fn ppl_wait_for_empty_area(&mut self, slot: usize) {
        if let Some(Some(log)) = self.ppl.as_mut().and_then(|p| p.logs.get_mut(slot)) {
            log.area_ready = false;
        }
    }

    /// The array emptied the area of the device in `slot`: its log may be written.
    pub(crate) fn ppl_area_emptied(&mut self, led: &mut Ledger, slot: usize) {
        if let Some(Some(log)) = self.ppl.as_mut().and_then(|p| p.logs.get_mut(slot)) {
            log.area_ready = true;
            self.ppl_submit_all(led);
        }
    }

    /// Does a batch of this head get logged? md logs when the stripe's parity member is in
    /// sync there (`ppl_write_stripe`: R5_Insync on pd_idx) and has a log.
    fn ppl_logs_head(&self, st: &Stripe) -> bool {
        let pd = st.map.pd_idx;
        let Some(p) = self.ppl.as_ref() else { return false };
        let m = &self.members[pd];
        p.logs.get(pd).is_some_and(Option::is_some)
            && m.writable()
            && m.readable(st.base_sector + self.cache.head_sectors - 1)
    }

    /// The logical data indices a row group writes, as a contiguous run: (lo, hi), or None.
    fn ppl_group_range(st: &Stripe, mask: &[SectorMask], grp: SectorMask) -> Option<(usize, usize)> {
        let mut range: Option<(usize, usize)> = None;
        for (dd, &m) in st.map.data_members.iter().enumerate() {
            if mask[m] & grp != 0 {
                range = Some(range.map_or((dd, dd), |(lo, _)| (lo, dd)));
            }
        }
        range
    }

    /// The rows the partial parity is computed from, beyond what the write mode reads:
    /// whole row groups of the old parity and the covered data (read-modify-write: md's
    /// prexor result), or of the data left alone (reconstruct-write).
    pub(super) fn ppl_add_needs(
        &self,
        st: &Stripe,
        mode: WriteMode,
        mask: &[SectorMask],
        needs: &mut Vec<(usize, SectorMask)>,
    ) {
        if mode == WriteMode::Full || !self.ppl_logs_head(st) {
            return;
        }
        let data = &st.map.data_members;
        let mut add = |m: usize, rws: SectorMask| match needs.iter_mut().find(|(n, _)| *n == m) {
            Some((_, have)) => *have |= rws,
            None => needs.push((m, rws)),
        };
        for g in 0..self.cache.head_sectors / GROUP_SECTORS {
            let grp = rows(g * GROUP_SECTORS, (g + 1) * GROUP_SECTORS);
            let Some((lo, hi)) = Self::ppl_group_range(st, mask, grp) else { continue };
            if lo == 0 && hi == data.len() - 1 {
                continue;
            }
            if mode == WriteMode::ReadModifyWrite {
                add(st.map.pd_idx, grp);
                (lo..=hi).for_each(|dd| add(data[dd], grp));
            } else {
                (0..data.len()).filter(|dd| !(lo..=hi).contains(dd)).for_each(|dd| add(data[dd], grp));
            }
        }
    }

    /// md's `ops_run_partial_parity`, before the batch changes the cache: per row group,
    /// the XOR of the data members the entry does not cover, computed as the old parity
    /// XOR the covered members' old data (read-modify-write) or from the others' data
    /// (reconstruct-write). None when the batch is not logged.
    pub(super) fn ppl_prepare(&self, st: &Stripe, b: &Batch) -> Option<PplBatch> {
        if !self.ppl_logs_head(st) {
            return None;
        }
        let data = &st.map.data_members;
        let pd = st.map.pd_idx;
        let mut groups = Vec::new();
        let mut pp = Vec::new();
        let written = data.iter().filter(|&&m| b.mask[m] != 0).fold(bit(pd), |w, &m| w | bit(m));
        for g in 0..self.cache.head_sectors / GROUP_SECTORS {
            let grp = rows(g * GROUP_SECTORS, (g + 1) * GROUP_SECTORS);
            let range = if b.mode == WriteMode::Full {
                Some((0, data.len() - 1))
            } else {
                Self::ppl_group_range(st, &b.mask, grp)
            };
            let Some((lo, hi)) = range else { continue };
            let full = lo == 0 && hi == data.len() - 1;
            if !full {
                let srcs: Vec<usize> = if b.mode == WriteMode::ReadModifyWrite {
                    std::iter::once(pd).chain((lo..=hi).map(|dd| data[dd])).collect()
                } else {
                    (0..data.len()).filter(|dd| !(lo..=hi).contains(dd)).map(|dd| data[dd]).collect()
                };
                // Not read when the parity member came into sync during the batch's reads
                // (a recovery passing by): the batch goes out unlogged, as it began.
                if srcs.iter().any(|&m| st.dev[m].valid & grp != grp || st.dev[m].block.is_none()) {
                    return None;
                }
                let rg = bytes(g * GROUP_SECTORS, GROUP_SECTORS);
                let slices: Vec<&[u8]> =
                    srcs.iter().map(|&m| st.dev[m].block.as_ref().expect("valid").rows(rg.clone())).collect();
                let at = pp.len();
                pp.resize(at + GROUP_BYTES, 0);
                uraid_parity::xor_gen(&slices, &mut pp[at..]);
            }
            groups.push(Group { member_sector: st.base_sector + g * GROUP_SECTORS, lo, hi, full });
        }
        (!groups.is_empty()).then_some(PplBatch { groups, pp, written })
    }

    /// md's `ppl_log_stripe`: the batch joins the io_unit gathering in its parity member's
    /// log; its member writes wait for that unit's log write. False when it cannot be
    /// logged (then it is written at once, as md does when logging fails).
    pub(super) fn ppl_log_batch(&mut self, key: u64, st: &Stripe, b: &mut Batch, lb: PplBatch) -> bool {
        let pd = st.map.pd_idx;
        let chunk = self.geo.chunk_sectors;
        let data_disks = self.geo.data_disks() as u64;
        let Some(p) = self.ppl.as_mut() else { return false };
        let Some(log) = p.logs[pd].as_mut() else { return false };
        if lb.pp.len() as u64 > log.entry_space_bytes {
            return false;
        }
        let fits = |u: &IoUnit| {
            u.state == UnitState::Open
                && u.entries.len() + lb.groups.len() <= PPL_HDR_MAX_ENTRIES
                && (u.pp.len() + lb.pp.len()) as u64 <= log.entry_space_bytes
        };
        if !log.units.back().is_some_and(fits) {
            p.seq += 1;
            log.units.push_back(IoUnit {
                generation: p.seq,
                entries: Vec::new(),
                pp: Vec::new(),
                heads: Vec::new(),
                pending_heads: 0,
                written: 0,
                state: UnitState::Open,
                last: None,
            });
        }
        let u = log.units.back_mut().expect("a gathering unit");
        let mut pages = lb.pp.chunks_exact(GROUP_BYTES);
        for g in &lb.groups {
            let page = if g.full { None } else { pages.next() };
            let joins = u.last.is_some_and(|(ms, lo, hi, full)| {
                g.member_sector == ms + GROUP_SECTORS
                    && g.member_sector / chunk == ms / chunk
                    && (g.lo, g.hi, g.full) == (lo, hi, full)
            });
            let covered = (g.hi - g.lo + 1) as u32 * GROUP_BYTES as u32;
            if !joins {
                let (stripe, row) = (g.member_sector / chunk, g.member_sector % chunk);
                u.entries.push(PplEntry {
                    data_sector: (stripe * data_disks + g.lo as u64) * chunk + row,
                    pp_size: 0,
                    data_size: 0,
                    parity_disk: pd as u32,
                    checksum: !0,
                });
            }
            let e = u.entries.last_mut().expect("an entry");
            e.data_size += covered;
            if let Some(page) = page {
                e.pp_size += GROUP_BYTES as u32;
                e.checksum = crc32c_update(e.checksum, page);
                u.pp.extend_from_slice(page);
            }
            u.last = Some((g.member_sector, g.lo, g.hi, g.full));
        }
        u.heads.push(key);
        u.pending_heads += 1;
        u.written |= lb.written;
        b.log_slot = Some(pd);
        b.log_wait = true;
        b.writing = Some(0);
        true
    }

    /// md's `ppl_write_stripe_run`: write every log whose first io_unit waits.
    pub(crate) fn ppl_submit_all(&mut self, led: &mut Ledger) {
        let Some(p) = self.ppl.as_ref() else { return };
        let ready: Vec<usize> = (0..p.logs.len())
            .filter(|&s| {
                p.logs[s]
                    .as_ref()
                    .is_some_and(|l| l.units.front().is_some_and(|u| u.state == UnitState::Open))
            })
            .collect();
        for slot in ready {
            self.ppl_submit(led, slot);
        }
    }

    /// md's `ppl_submit_iounit`: the header (entries with their final checksums) and the
    /// partial parity in one write at the log's next place, then a flush. A log member
    /// that cannot be written releases the batches at once.
    fn ppl_submit(&mut self, led: &mut Ledger, slot: usize) {
        let writable = self.members[slot].writable();
        let p = self.ppl.as_mut().expect("ppl");
        let signature = p.signature;
        let log = p.logs[slot].as_mut().expect("a log");
        let area_ready = log.area_ready;
        let u = log.units.front_mut().expect("a unit");
        if !writable {
            u.state = UnitState::Logged;
            self.ppl_release(led, slot);
            return;
        }
        if !area_ready {
            return; // submitted by `ppl_area_emptied`
        }
        u.state = UnitState::Logging;
        let entries = u.entries.iter().map(|e| PplEntry { checksum: !e.checksum, ..*e }).collect::<Vec<_>>();
        let header = PplHeader { signature, generation: u.generation, entries }
            .serialize()
            .expect("at most PPL_HDR_MAX_ENTRIES entries");
        let used_sectors = HEADER_SECTORS + u.pp.len() as u64 / 512;
        let mut bytes = Vec::with_capacity(PPL_HEADER_SIZE + u.pp.len());
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&u.pp);
        let area_end = log.area_sector + log.area_sectors;
        if log.reset_pending {
            log.reset_pending = false;
            log.next_io_sector = log.area_sector;
            bytes.resize((log.area_sectors * 512) as usize, 0);
        } else if log.multiple && area_end - log.next_io_sector < used_sectors {
            log.next_io_sector = log.area_sector;
        }
        let at = log.next_io_sector;
        if log.multiple {
            log.next_io_sector += used_sectors;
        }
        self.stats.ppl_log_writes += 1;
        self.issue_raw_io(
            led,
            slot,
            MemberIoOp::Write,
            at * 512,
            IoBytes::from(bytes),
            IoCtx::PplLog { slot },
        );
    }

    /// Completions of the log's own I/O: the log write, its flush, and the flushes of the
    /// members a finished unit's batches wrote.
    pub(super) fn ppl_io_done(&mut self, led: &mut Ledger, ctx: IoCtx, member: usize, ok: bool) {
        if !ok {
            // md_error on the member, as md's ppl_log_endio and ppl_flush_endio do; the
            // batches go on without the log.
            self.fail_member(led, member, self.now_ns);
        }
        match ctx {
            IoCtx::PplLog { slot } if ok => {
                self.issue_io(
                    led,
                    slot,
                    MemberIoOp::Flush,
                    0,
                    0,
                    IoBytes::new(),
                    IoCtx::PplLogFlush { slot },
                );
            }
            IoCtx::PplLog { slot } | IoCtx::PplLogFlush { slot } => {
                if let Some(u) = self.ppl_front(slot) {
                    u.state = UnitState::Logged;
                }
                self.ppl_release(led, slot);
            }
            IoCtx::PplFlush { slot } => {
                let Some(u) = self.ppl_front(slot) else { return };
                if let UnitState::Flushing(left) = u.state {
                    u.state = UnitState::Flushing(left - 1);
                    if left == 1 {
                        self.ppl_unit_finished(led, slot);
                    }
                }
            }
            _ => {}
        }
    }

    fn ppl_front(&mut self, slot: usize) -> Option<&mut IoUnit> {
        self.ppl.as_mut()?.logs.get_mut(slot)?.as_mut()?.units.front_mut()
    }

    /// md's `ppl_log_endio`: the unit is on the member; its batches' writes go out.
    fn ppl_release(&mut self, led: &mut Ledger, slot: usize) {
        let Some(u) = self.ppl_front(slot) else { return };
        let heads = std::mem::take(&mut u.heads);
        if u.pending_heads == 0 {
            self.ppl_unit_written(led, slot);
        }
        for key in heads {
            let Some(mut st) = self.cache.heads.remove(&key) else {
                debug_assert!(false, "a head waiting for its log is in the cache");
                continue;
            };
            if let Some(b) = st.batch.as_mut().filter(|b| b.log_wait) {
                b.log_wait = false;
                self.issue_batch_writes(led, key, &mut st);
            }
            self.cache.heads.insert(key, st);
            self.cache.mark(key);
        }
    }

    /// A logged batch's member writes all landed (`finish_batch`).
    pub(super) fn ppl_batch_written(&mut self, led: &mut Ledger, slot: usize) {
        let Some(u) = self.ppl_front(slot) else { return };
        u.pending_heads -= 1;
        if u.pending_heads == 0 && u.state == UnitState::Logged {
            self.ppl_unit_written(led, slot);
        }
    }

    /// md's `ppl_do_flush`: every batch of the unit landed; the members they wrote are
    /// flushed before the next unit's header may supersede this one.
    fn ppl_unit_written(&mut self, led: &mut Ledger, slot: usize) {
        let targets: Vec<usize> = {
            let Some(u) = self.ppl_front(slot) else { return };
            let written = u.written;
            (0..self.geo.raid_disks)
                .filter(|&m| written & bit(m) != 0 && self.members[m].writable())
                .collect()
        };
        if targets.is_empty() {
            self.ppl_unit_finished(led, slot);
            return;
        }
        if let Some(u) = self.ppl_front(slot) {
            u.state = UnitState::Flushing(targets.len() as u32);
        }
        for m in targets {
            self.issue_io(led, m, MemberIoOp::Flush, 0, 0, IoBytes::new(), IoCtx::PplFlush { slot });
        }
    }

    /// md's `ppl_io_unit_finished`: the next unit of the log may be written.
    fn ppl_unit_finished(&mut self, led: &mut Ledger, slot: usize) {
        if let Some(log) = self.ppl.as_mut().and_then(|p| p.logs.get_mut(slot)).and_then(Option::as_mut) {
            log.units.pop_front();
        }
        self.ppl_submit_all(led);
    }
}
