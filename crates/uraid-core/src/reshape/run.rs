//! Continuing a reshape, one window at a time, as md's `reshape_request` does: the
//! window's data is read in the previous layout (at `data_offset`), written as whole
//! stripes of the next layout with their parity (at `new_data_offset`), made durable,
//! and only then is `reshape_position` moved past it in every superblock. Forwards (the
//! data offset moved down) windows go up from 0; backwards (md's RESHAPE_BACKWARDS: the
//! data offset moved up, where no room lies before the data) they go down from the end.
//! A window never reaches, on any member, old data the last checkpoint still needs (md's
//! `reshape_safe`), so a crash at any point leaves superblocks md or uraid resumes from
//! with nothing lost: the window next to the checkpoint is simply copied again.
//!
//! Pure: the caller performs the reads, writes, flushes and superblock writes in this
//! order for each window: reads, writes, flush of every member, superblocks, flush.

use crate::geometry::Geometry;
use crate::meta::superblock::{feature, Superblock};
use crate::reshape::{ReshapeExtent, ReshapeGeometry, Side};

/// Array sectors [start, end) of the next layout being moved; whole stripes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start_sectors: u64,
    pub end_sectors: u64,
}

/// One member write of a window: `data` at absolute `device_sector` of slot `member`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowWrite {
    pub member: usize,
    pub device_sector: u64,
    pub data: Vec<u8>,
}

/// A reshape being continued from its checkpoint.
#[derive(Clone, Debug)]
pub struct ReshapeRun {
    /// `position_sectors` is the checkpoint: what the superblocks record as moved.
    geo: ReshapeGeometry,
}

impl ReshapeRun {
    /// Continue `geo` from its position. Refused, with nothing started, for what the
    /// window rule does not cover: one that loses data members (md's shrink, backwards
    /// with fewer members), a backwards one that adds members, a level change other than
    /// between raid6 layouts (raid5 to raid6 goes through md's takeover first), or a
    /// checkpoint from which the next stripe cannot be written safely.
    pub fn new(geo: ReshapeGeometry) -> Result<ReshapeRun, String> {
        use super::unsupported;
        if geo.backwards && geo.next.raid_disks != geo.previous.raid_disks {
            return Err(unsupported("continuing a backwards reshape that changes the number of members"));
        }
        if geo.previous.level != geo.next.level {
            return Err(unsupported(&format!(
                "continuing a change from {:?} to {:?}",
                geo.previous.level, geo.next.level
            )));
        }
        if geo.next.data_disks() < geo.previous.data_disks() || geo.next.raid_disks < geo.previous.raid_disks
        {
            return Err(unsupported("continuing a reshape that removes members"));
        }
        if geo.previous == geo.next {
            return Err(unsupported("a reshape that changes nothing"));
        }
        let run = ReshapeRun { geo };
        if !run.is_done() && run.next_window(u64::MAX).is_none() {
            return Err(unsupported(
                "the data offset leaves no room to write the next stripe (md would need mdadm's backup file)",
            ));
        }
        Ok(run)
    }

    pub fn geometry(&self) -> &ReshapeGeometry {
        &self.geo
    }

    /// The checkpoint, in array sectors (md's `reshape_position`).
    pub fn position_sectors(&self) -> u64 {
        self.geo.position_sectors
    }

    /// Array sectors the whole reshape moves: forwards every stripe of the next layout,
    /// those past the old end zero-filled; backwards from the array's end (md's
    /// `raid5_size` with the smaller layout) down to 0.
    pub fn total_sectors(&self) -> u64 {
        if self.geo.backwards {
            self.geo.array_sectors()
        } else {
            self.geo.next.array_sectors()
        }
    }

    /// Array sectors moved so far (below the checkpoint forwards, above it backwards).
    pub fn done_sectors(&self) -> u64 {
        if self.geo.backwards {
            self.total_sectors().saturating_sub(self.geo.position_sectors)
        } else {
            self.geo.position_sectors
        }
    }

    pub fn is_done(&self) -> bool {
        if self.geo.backwards {
            self.geo.position_sectors == 0
        } else {
            self.geo.position_sectors >= self.total_sectors()
        }
    }

    /// The next window: whole stripes of the next layout next to the checkpoint (above it
    /// forwards, below it backwards), as many as md's `reshape_safe` rule allows against
    /// it, at most `max_sectors` (at least one stripe). None when done, or when not even
    /// one stripe is safe.
    pub fn next_window(&self, max_sectors: u64) -> Option<Window> {
        let at = self.geo.position_sectors;
        let stripe = self.geo.window_unit_sectors();
        let limit = max_sectors.max(stripe) / stripe;
        if self.geo.backwards {
            let fits = |n: u64| n * stripe <= at && self.geo.backwards_write_is_safe(at, at - n * stripe);
            let n = largest_fitting(limit, fits)?;
            return Some(Window { start_sectors: at - n * stripe, end_sectors: at });
        }
        let end_max = self.total_sectors();
        if at >= end_max {
            return None;
        }
        let fits = |n: u64| {
            (n == 1 || at + n * stripe <= end_max) && self.geo.forwards_write_is_safe(at, at + n * stripe)
        };
        let n = largest_fitting(limit, fits)?;
        Some(Window { start_sectors: at, end_sectors: (at + n * stripe).min(end_max) })
    }

    /// The previous layout's pieces holding the window's data (array sectors below the
    /// previous layout's size; the rest is zeros): (array sector, where to read it).
    pub fn window_reads(&self, w: Window) -> Vec<(u64, ReshapeExtent)> {
        let end = w.end_sectors.min(self.geo.previous.array_sectors());
        if w.start_sectors >= end {
            return Vec::new();
        }
        // Mapped with the position past the window: all of it on the previous side.
        let outside = if self.geo.backwards { u64::MAX } else { 0 };
        let pieces = self.geo.map_range(w.start_sectors, end - w.start_sectors, outside);
        debug_assert!(pieces.iter().all(|(_, e)| e.side == Side::Previous));
        pieces
    }

    /// Bytes of the window's data `window_reads` gives (`data.len()`: those pieces' total).
    /// Returns each member's rows of the next layout's stripes, parity computed.
    pub fn window_writes(&self, w: Window, data: &[u8]) -> Vec<WindowWrite> {
        let next: &Geometry = &self.geo.next;
        let chunk = next.chunk_sectors;
        let chunk_bytes = (chunk * 512) as usize;
        // The next layout's own stripes: a window is a whole number of them.
        let stripe = next.stripe_data_sectors();
        let first = w.start_sectors / stripe;
        let stripes = (w.end_sectors - w.start_sectors).div_ceil(stripe);
        let rows_bytes = stripes as usize * chunk_bytes;
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; rows_bytes]; next.raid_disks];
        let zero = vec![0u8; chunk_bytes];
        let mut p = vec![0u8; chunk_bytes];
        let mut q = vec![0u8; chunk_bytes];
        for i in 0..stripes {
            let map = next.stripe_map(first + i);
            let rg = i as usize * chunk_bytes..(i as usize + 1) * chunk_bytes;
            for (dd, &m) in map.data_members.iter().enumerate() {
                let at = ((first + i) * stripe + dd as u64 * chunk - w.start_sectors) * 512;
                let at = at as usize;
                if at < data.len() {
                    let n = (data.len() - at).min(chunk_bytes);
                    bufs[m][rg.start..rg.start + n].copy_from_slice(&data[at..at + n]);
                }
            }
            map.gen_parity(&bufs, rg.clone(), &zero, &mut p, &mut q);
            bufs[map.pd_idx][rg.clone()].copy_from_slice(&p);
            if let Some(qd) = map.qd_idx {
                bufs[qd][rg].copy_from_slice(&q);
            }
        }
        bufs.into_iter()
            .enumerate()
            .map(|(m, data)| WindowWrite {
                member: m,
                device_sector: self.geo.device_sector(Side::Next, m, first * chunk),
                data,
            })
            .collect()
    }

    /// The window's writes are durable on every member: the checkpoint moves past it.
    /// The caller writes `checkpoint_superblock` to every member before the next window.
    pub fn advance(&mut self, w: Window) {
        self.geo.position_sectors = self.position_after(w);
    }

    /// The checkpoint once `w` is moved: its far side in the reshape's direction.
    pub fn position_after(&self, w: Window) -> u64 {
        if self.geo.backwards {
            assert_eq!(w.end_sectors, self.geo.position_sectors, "windows are moved in order");
            w.start_sectors
        } else {
            assert_eq!(w.start_sectors, self.geo.position_sectors, "windows are moved in order");
            w.end_sectors
        }
    }

    /// A member's superblock recording the checkpoint (md's super_1_sync during a
    /// reshape): `reshape_position`, with the array's new event count. A slot the reshape
    /// rebuilds (raid5 to raid6: the new Q member) is recovered up to the checkpoint's
    /// member sector, as md's reshape_request moves its `recovery_offset`.
    pub fn checkpoint_superblock(&self, sb: &Superblock, events: u64, utime: u64) -> Superblock {
        let mut sb = sb.clone();
        sb.reshape_position = self.geo.position_sectors;
        // (Forwards only: a backwards reshape with a member to recover is refused.)
        if sb.has(feature::RECOVERY_OFFSET) && !self.geo.backwards {
            let rows = self.geo.position_sectors / self.geo.next.data_disks() as u64;
            sb.recovery_offset = sb.recovery_offset.max(rows);
        }
        sb.events = events;
        sb.utime = utime;
        sb
    }

    /// A member's superblock once the reshape is done (md's end_reshape and
    /// md_finish_reshape): the next layout is the layout, data starts at the new offset
    /// and the member's data size gains what the offset gave back.
    pub fn finished_superblock(&self, sb: &Superblock, events: u64, utime: u64) -> Superblock {
        assert!(self.is_done(), "the reshape is not done");
        let mut sb = sb.clone();
        let new_offset = sb.new_data_offset();
        let old_offset = i128::from(sb.data_offset);
        let size = i128::from(sb.data_size) + old_offset - new_offset;
        sb.data_offset = new_offset as u64;
        sb.data_size = size as u64;
        // The slot the reshape rebuilt holds every row of the next layout: in sync.
        sb.feature_map &= !(feature::RESHAPE_ACTIVE
            | feature::NEW_OFFSET
            | feature::RESHAPE_BACKWARDS
            | feature::RECOVERY_OFFSET);
        sb.recovery_offset = 0;
        sb.level = sb.new_level as i32;
        sb.layout = sb.new_layout;
        sb.chunksize = sb.new_chunk;
        sb.new_offset = 0;
        sb.delta_disks = 0;
        sb.reshape_position = 0;
        sb.events = events;
        sb.utime = utime;
        sb
    }
}

/// The largest n in 1..=limit for which `fits` holds, `fits` being monotone (true up to
/// some n, false above); None when not even 1 fits. Doubles, then backs off.
fn largest_fitting(limit: u64, fits: impl Fn(u64) -> bool) -> Option<u64> {
    if !fits(1) {
        return None;
    }
    let mut n = 1u64;
    while 2 * n <= limit && fits(2 * n) {
        n *= 2;
    }
    let mut step = n / 2;
    while step > 0 {
        if n + step <= limit && fits(n + step) {
            n += step;
        }
        step /= 2;
    }
    Some(n)
}

/// The member devices a reshape is run on: absolute device sectors of each slot.
pub trait ReshapeMembers {
    fn read(&mut self, member: usize, device_sector: u64, len_sectors: u64) -> std::io::Result<Vec<u8>>;
    fn write(&mut self, member: usize, device_sector: u64, data: &[u8]) -> std::io::Result<()>;
    /// Everything written to `member` so far is durable.
    fn flush(&mut self, member: usize) -> std::io::Result<()>;
}

/// How far `continue_reshape` got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReshapeProgress {
    /// Stopped after the checkpoint at this position (array sectors), as asked.
    Checkpointed { position_sectors: u64 },
    /// The reshape is done and the superblocks say the new geometry.
    Finished,
}

/// Runs `run` on `members` (offline: nothing else writes them meanwhile), window after
/// window, each window's writes flushed before its checkpoint is written to every
/// member's superblock (`superblocks[slot]`, updated in place) and flushed in turn.
/// Superblocks past the new layout's slots are spares' (member `slot count + i`): every
/// round writes them too, as md does, so they are not left behind as another array's. Stops
/// after `max_windows` windows if given; at the end writes the finished superblocks. An
/// I/O error stops it at once: the superblocks on disk then hold the last checkpoint.
pub fn continue_reshape(
    run: &mut ReshapeRun,
    superblocks: &mut [Superblock],
    members: &mut impl ReshapeMembers,
    window_max_sectors: u64,
    max_windows: Option<usize>,
    utime: u64,
) -> std::io::Result<ReshapeProgress> {
    let n = run.geometry().next.raid_disks;
    assert!(superblocks.len() >= n, "one superblock per slot, then the spares'");
    adopt_the_reshape(superblocks);
    let mut windows = 0;
    while let Some(w) = run.next_window(window_max_sectors) {
        if max_windows.is_some_and(|max| windows >= max) {
            return Ok(ReshapeProgress::Checkpointed { position_sectors: run.position_sectors() });
        }
        let mut data = Vec::new();
        for (_, e) in run.window_reads(w) {
            data.extend_from_slice(&members.read(e.member, e.device_sector, e.len_sectors)?);
        }
        for wr in run.window_writes(w, &data) {
            members.write(wr.member, wr.device_sector, &wr.data)?;
        }
        (0..n).try_for_each(|m| members.flush(m))?;
        run.advance(w);
        windows += 1;
        record(run, superblocks, members, utime)?;
    }
    if !run.is_done() {
        return Ok(ReshapeProgress::Checkpointed { position_sectors: run.position_sectors() });
    }
    if superblocks.iter().any(|sb| sb.has(feature::RESHAPE_ACTIVE)) {
        record(run, superblocks, members, utime)?;
    }
    Ok(ReshapeProgress::Finished)
}

/// Members that missed the round starting the reshape (a cut inside it; assembly takes
/// them back while nothing has moved) get the array's reshape fields from the freshest superblock
/// that has them, so the next round does not write their old geometry again.
fn adopt_the_reshape(superblocks: &mut [Superblock]) {
    let Some(fresh) =
        superblocks.iter().filter(|sb| sb.has(feature::RESHAPE_ACTIVE)).max_by_key(|sb| sb.events)
    else {
        return;
    };
    let fresh = fresh.clone();
    let reshape_bits = feature::RESHAPE_ACTIVE | feature::NEW_OFFSET | feature::RESHAPE_BACKWARDS;
    if !fresh.reshape_not_begun() {
        return;
    }
    let missed = |sb: &Superblock| !sb.has(feature::RESHAPE_ACTIVE) && sb.events < fresh.events;
    for sb in superblocks.iter_mut().filter(|sb| missed(sb)) {
        sb.take_array_fields(&fresh);
        // Offline every member's offset moves as the freshest's does.
        sb.feature_map = (sb.feature_map & !reshape_bits) | (fresh.feature_map & reshape_bits);
        sb.new_offset = fresh.new_offset;
        sb.max_dev = fresh.max_dev;
        sb.dev_roles = fresh.dev_roles.clone();
    }
}

/// One superblock round: the checkpoint (or, once done, the finished geometry) on every
/// member with the next event count, then flushed.
fn record(
    run: &ReshapeRun,
    superblocks: &mut [Superblock],
    members: &mut impl ReshapeMembers,
    utime: u64,
) -> std::io::Result<()> {
    let events = superblocks.iter().map(|sb| sb.events).max().unwrap_or(0) + 1;
    for (m, sb) in superblocks.iter_mut().enumerate() {
        *sb = if run.is_done() {
            run.finished_superblock(sb, events, utime)
        } else {
            run.checkpoint_superblock(sb, events, utime)
        };
        members.write(m, sb.super_offset, &sb.update_csum())?;
    }
    (0..superblocks.len()).try_for_each(|m| members.flush(m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{algorithm, Level};

    fn run(level: Level, from: usize, position: u64, offset_room: u64) -> ReshapeRun {
        let g = |n| Geometry::new(level, n, algorithm::LEFT_SYMMETRIC, 8, &vec![256; n]).unwrap();
        let n = from + 1;
        let r =
            ReshapeGeometry::new(g(from), g(n), position, false, vec![1024; n], vec![1024 - offset_room; n]);
        ReshapeRun::new(r.unwrap()).unwrap()
    }

    /// Runs the reshape over in-memory devices laid out in the previous geometry from
    /// `data`, then reads every array sector back through the final geometry.
    /// `crash`: every window is first torn (its rows scribbled over, as a power cut in the
    /// middle of its writes leaves them) and then done again from the same checkpoint, as
    /// a restart does.
    fn reshape_in_memory(level: Level, from: usize, room: u64, crash: bool) {
        let r = run(level, from, 0, room);
        reshape_run_in_memory(r, crash);
    }

    /// A reshape between `previous` and `next` (256-sector members, data at 1024, moved
    /// down by `room`), run to the end in memory as `reshape_in_memory` does.
    fn reshape_between(previous: Geometry, next: Geometry, room: u64, crash: bool) {
        let n = next.raid_disks;
        let geo = ReshapeGeometry::new(previous, next, 0, false, vec![1024; n], vec![1024 - room; n]);
        reshape_run_in_memory(ReshapeRun::new(geo.unwrap()).unwrap(), crash);
    }

    /// [`reshape_between`] backwards: the data offset moved up by `room`, md's restripe
    /// where the room lies after the data, from the array's end down.
    fn reshape_backwards_between(previous: Geometry, next: Geometry, room: u64, crash: bool) {
        let n = next.raid_disks;
        let end = previous.array_sectors().min(next.array_sectors());
        let geo = ReshapeGeometry::new(previous, next, end, true, vec![1024; n], vec![1024 + room; n]);
        reshape_run_in_memory(ReshapeRun::new(geo.unwrap()).unwrap(), crash);
    }

    fn reshape_run_in_memory(mut r: ReshapeRun, crash: bool) {
        let new_off = r.geometry().new_data_offset_sectors[0];
        let old_off = r.geometry().data_offset_sectors[0];
        let level = r.geometry().next.level;
        let old = r.geometry().previous.clone();
        let n = r.geometry().next.raid_disks;
        // 0xEE where the previous layout has no data: a new member, a missing Q.
        let g = r.geometry();
        let dev_sectors = g.data_offset_sectors.iter().chain(&g.new_data_offset_sectors).max().unwrap()
            + old.member_sectors[0].max(g.next.member_sectors[0]);
        let mut devs = vec![vec![0xEEu8; (dev_sectors * 512) as usize]; n];
        let data: Vec<u8> = (0..old.array_sectors() * 512).map(|i| (i * 7 % 251) as u8).collect();
        for s in 0..old.array_sectors() {
            let (e, _) = old.map_sector(s);
            let at = ((old_off + e.member_sector) * 512) as usize;
            devs[e.member][at..at + 512].copy_from_slice(&data[(s * 512) as usize..][..512]);
        }
        let mut windows = 0;
        // Torn windows of up to 8 stripes: more than the checkpoint rule allows at first.
        let max = if crash { 256 } else { 64 };
        while let Some(w) = r.next_window(max) {
            if crash {
                for wr in r.window_writes(w, &[]) {
                    let at = (wr.device_sector * 512) as usize;
                    devs[wr.member][at..at + wr.data.len()].fill(0x5A);
                }
            }
            let mut buf = Vec::new();
            for (_, e) in r.window_reads(w) {
                let at = (e.device_sector * 512) as usize;
                buf.extend_from_slice(&devs[e.member][at..at + (e.len_sectors * 512) as usize]);
            }
            for wr in r.window_writes(w, &buf) {
                let at = (wr.device_sector * 512) as usize;
                devs[wr.member][at..at + wr.data.len()].copy_from_slice(&wr.data);
            }
            r.advance(w);
            windows += 1;
        }
        assert!(r.is_done() && windows > 1);
        let next = r.geometry().next.clone();
        for s in 0..next.array_sectors() {
            let (e, _) = next.map_sector(s);
            let at = ((new_off + e.member_sector) * 512) as usize;
            let want: &[u8] =
                if s < old.array_sectors() { &data[(s * 512) as usize..][..512] } else { &[0u8; 512] };
            assert_eq!(&devs[e.member][at..at + 512], want, "{level:?} sector {s}");
        }
        // Every new stripe's parity agrees with its data.
        let chunk = next.chunk_sectors;
        let chunk_bytes = (chunk * 512) as usize;
        for stripe in 0..next.member_sectors[0] / chunk {
            let map = next.stripe_map(stripe);
            let rg = 0..chunk_bytes;
            let bufs: Vec<Vec<u8>> = (0..n)
                .map(|m| {
                    let at = ((new_off + stripe * chunk) * 512) as usize;
                    devs[m][at..at + chunk_bytes].to_vec()
                })
                .collect();
            let (mut p, mut q) = (vec![0u8; chunk_bytes], vec![0u8; chunk_bytes]);
            map.gen_parity(&bufs, rg, &vec![0u8; chunk_bytes], &mut p, &mut q);
            assert_eq!(p, bufs[map.pd_idx], "{level:?} stripe {stripe} P");
            if let Some(qd) = map.qd_idx {
                assert_eq!(q, bufs[qd], "{level:?} stripe {stripe} Q");
            }
        }
    }

    #[test]
    fn a_raid5_grow_run_to_the_end_reads_back_and_has_consistent_parity() {
        reshape_in_memory(Level::Raid5, 4, 32, false);
    }

    #[test]
    fn a_crash_in_any_window_loses_nothing_once_it_is_done_again() {
        reshape_in_memory(Level::Raid5, 4, 32, true);
        reshape_in_memory(Level::Raid6, 5, 16, true);
    }

    #[test]
    fn a_raid6_grow_run_to_the_end_reads_back_and_has_consistent_parity() {
        reshape_in_memory(Level::Raid6, 5, 32, false);
    }

    /// md's takeover of a raid5 of `n` into a raid6 of `n + 1` (the Q of the `-6` layout on
    /// the new, blank member), then the reshape to the plain raid6 layout.
    fn raid5_to_raid6(n: usize) -> (Geometry, Geometry) {
        let g = |layout| Geometry::new(Level::Raid6, n + 1, layout, 8, &vec![256; n + 1]).unwrap();
        (g(algorithm::LEFT_SYMMETRIC_6), g(algorithm::LEFT_SYMMETRIC))
    }

    #[test]
    fn a_raid5_to_raid6_run_reads_back_and_fills_the_new_member() {
        let (previous, next) = raid5_to_raid6(4);
        // The raid5's data lies where the -6 layout says: the takeover moves nothing.
        let raid5 = Geometry::new(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, 8, &[256; 4]).unwrap();
        assert!((0..raid5.array_sectors()).all(|s| raid5.map_sector(s) == previous.map_sector(s)));
        // mdadm's smallest move for the same data members: one chunk.
        reshape_between(previous.clone(), next.clone(), 8, false);
        reshape_between(previous, next, 32, false);
    }

    #[test]
    fn a_raid5_to_raid6_run_torn_in_any_window_loses_nothing_once_done_again() {
        let (previous, next) = raid5_to_raid6(4);
        reshape_between(previous, next, 16, true);
        let (previous, next) = raid5_to_raid6(3);
        reshape_between(previous, next, 8, true);
    }

    #[test]
    fn a_chunk_change_run_reads_back_with_consistent_parity_torn_or_not() {
        let g = |chunk| Geometry::new(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, chunk, &[256; 4]).unwrap();
        // Larger, then smaller chunks; mdadm's move: lcm of the two stripes over 3 members.
        for crash in [false, true] {
            reshape_between(g(8), g(16), 16, crash);
            reshape_between(g(16), g(8), 16, crash);
            reshape_between(g(8), g(32), 64, crash);
        }
        let g6 = |chunk| Geometry::new(Level::Raid6, 5, algorithm::LEFT_SYMMETRIC, chunk, &[256; 5]).unwrap();
        reshape_between(g6(16), g6(8), 16, true);
    }

    #[test]
    fn chunk_change_windows_are_whole_stripes_of_the_larger_chunk() {
        let g = |chunk| Geometry::new(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, chunk, &[256; 4]).unwrap();
        // To smaller chunks: a stripe of the next layout (24 sectors) would end inside one
        // of the previous layout's (48), where md's run refuses the position.
        let geo = ReshapeGeometry::new(g(16), g(8), 0, false, vec![1024; 4], vec![1024 - 64; 4]).unwrap();
        let r = ReshapeRun::new(geo).unwrap();
        let w = r.next_window(u64::MAX).unwrap();
        assert_eq!(w.end_sectors % 48, 0, "{w:?}");
        assert_eq!(r.next_window(1).unwrap().end_sectors, 48, "at least one stripe of 16-sector chunks");
    }

    #[test]
    fn a_backwards_restripe_reads_back_with_consistent_parity_torn_or_not() {
        let g = |level, n, layout, chunk| Geometry::new(level, n, layout, chunk, &vec![256; n]).unwrap();
        use algorithm::{LEFT_SYMMETRIC as LS, RIGHT_ASYMMETRIC as RA};
        for crash in [false, true] {
            reshape_backwards_between(g(Level::Raid5, 4, LS, 8), g(Level::Raid5, 4, LS, 16), 16, crash);
            reshape_backwards_between(g(Level::Raid5, 4, LS, 16), g(Level::Raid5, 4, LS, 8), 16, crash);
            reshape_backwards_between(g(Level::Raid5, 3, LS, 8), g(Level::Raid5, 3, RA, 8), 8, crash);
            reshape_backwards_between(g(Level::Raid6, 5, LS, 16), g(Level::Raid6, 5, RA, 8), 64, crash);
        }
    }

    #[test]
    fn md_s_backwards_chunk_change_of_a_1_0_array_torn_in_any_window_loses_nothing() {
        // As md left it in the VM: raid5 of 4, 28 MiB used of each member, data at 0 moved
        // up by 4096 sectors, 64 KiB chunks to 128 KiB.
        let g =
            |chunk| Geometry::new(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, chunk, &[57344; 4]).unwrap();
        let end = g(128).array_sectors();
        let geo = ReshapeGeometry::new(g(128), g(256), end, true, vec![0; 4], vec![4096; 4]).unwrap();
        reshape_run_in_memory(ReshapeRun::new(geo).unwrap(), true);
    }

    #[test]
    fn backwards_windows_go_down_from_the_end_and_never_overrun_the_checkpoint() {
        let g = |chunk| Geometry::new(Level::Raid5, 4, algorithm::LEFT_SYMMETRIC, chunk, &[256; 4]).unwrap();
        let end = g(8).array_sectors();
        let geo = ReshapeGeometry::new(g(8), g(16), end, true, vec![1024; 4], vec![1024 + 16; 4]).unwrap();
        let mut r = ReshapeRun::new(geo).unwrap();
        assert_eq!((r.done_sectors(), r.total_sectors()), (0, end));
        let mut last = end;
        while let Some(w) = r.next_window(u64::MAX) {
            assert_eq!(w.end_sectors, last, "each window ends where the last began");
            assert!(r.geometry().backwards_write_is_safe(w.end_sectors, w.start_sectors));
            if w.start_sectors >= 48 {
                assert!(!r.geometry().backwards_write_is_safe(w.end_sectors, w.start_sectors - 48), "{w:?}");
            }
            r.advance(w);
            last = w.start_sectors;
        }
        assert!(r.is_done() && r.position_sectors() == 0 && r.done_sectors() == end);
        // No room after the data: not even the last stripe can move.
        let tight = ReshapeGeometry::new(g(8), g(16), 48, true, vec![1024; 4], vec![1024; 4]).unwrap();
        assert!(ReshapeRun::new(tight).unwrap_err().contains("no room"));
    }

    #[test]
    fn the_rebuilt_slot_is_recovered_up_to_each_checkpoint_and_in_sync_at_the_end() {
        let (previous, next) = raid5_to_raid6(4);
        let geo = ReshapeGeometry::new(previous, next, 0, false, vec![1024; 5], vec![1016; 5]).unwrap();
        let mut r = ReshapeRun::new(geo).unwrap();
        let p = crate::meta::CreateParams::new(6, vec![Some(1 << 20); 5]);
        let mut sb: Superblock = crate::meta::create_array(&p).unwrap().superblocks[4].clone().unwrap();
        sb.feature_map |= feature::RECOVERY_OFFSET | feature::RESHAPE_ACTIVE;
        let w = r.next_window(u64::MAX).unwrap();
        r.advance(w);
        let cp = r.checkpoint_superblock(&sb, 2, 0);
        // md: recovery_offset is the checkpoint in member sectors of the next layout.
        assert_eq!(cp.recovery_offset, w.end_sectors / 3);
        assert!(cp.has(feature::RECOVERY_OFFSET));
        while let Some(w) = r.next_window(u64::MAX) {
            r.advance(w);
        }
        let done = r.finished_superblock(&cp, 3, 0);
        assert!(!done.has(feature::RECOVERY_OFFSET) && !done.has(feature::RESHAPE_ACTIVE), "{done:?}");
    }

    #[test]
    fn windows_never_outrun_the_checkpoint_and_grow_as_the_gap_opens() {
        let r = run(Level::Raid5, 4, 0, 32);
        let w = r.next_window(u64::MAX).unwrap();
        // 32 sectors of room = 4 chunks of 8: four new stripes fit before the old data.
        assert_eq!(w, Window { start_sectors: 0, end_sectors: 4 * 32 });
        assert!(r.geometry().forwards_write_is_safe(0, w.end_sectors));
        assert!(!r.geometry().forwards_write_is_safe(0, w.end_sectors + 32));
        let later = run(Level::Raid5, 4, 32 * 20, 32).next_window(u64::MAX).unwrap();
        assert!(later.end_sectors - later.start_sectors > 4 * 32);
    }

    #[test]
    fn no_room_to_write_is_refused_up_front() {
        let g = |n| Geometry::new(Level::Raid5, n, algorithm::LEFT_SYMMETRIC, 8, &vec![256; n]).unwrap();
        let r = ReshapeGeometry::new(g(4), g(5), 0, false, vec![1024; 5], vec![1024; 5]).unwrap();
        let e = ReshapeRun::new(r).unwrap_err();
        assert!(e.contains("no room"), "{e}");
    }
}
