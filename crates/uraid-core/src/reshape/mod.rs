//! md's reshape of a raid4/5/6 array: the previous geometry, the next one, and the boundary
//! between them (`reshape_position`).
//!
//! Follows the kernel's `raid5.c`: `raid5_compute_sector(conf, sector, previous, ...)` maps
//! with the previous or the next geometry, `make_stripe_request`/`ahead_of_reshape` choose
//! which (forwards: array sectors at and above the position still lie in the previous
//! layout), `run`'s "reshape_position too early for auto-recovery" and `reshape_request`'s
//! `reshape_safe` rule say when the moved data offset keeps the new copy off old data that
//! is not yet checkpointed. Member sectors of the previous layout count from `data_offset`,
//! those of the next from `new_data_offset` (`use_new_offset`).

use crate::geometry::Geometry;

mod io;
pub mod run;
pub mod start;

/// Which geometry an array sector is mapped by during a reshape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The layout the data had before the reshape (md's `previous`), at `data_offset`.
    Previous,
    /// The layout being reshaped to, at `new_data_offset`.
    Next,
}

/// An array in the middle of a reshape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReshapeGeometry {
    pub previous: Geometry,
    pub next: Geometry,
    /// md's `reshape_position`: array sectors; forwards, [0, position) is in `next`.
    pub position_sectors: u64,
    /// md's RESHAPE_BACKWARDS: [position, end) is in `next` instead.
    pub backwards: bool,
    /// Per slot of `next`: where the previous layout's data starts (md's `data_offset`),
    /// device sectors.
    pub data_offset_sectors: Vec<u64>,
    /// Per slot of `next`: where the next layout's data starts (md's `new_data_offset`).
    pub new_data_offset_sectors: Vec<u64>,
}

/// A piece of an array range placed by the reshape: `len_sectors` at absolute device
/// sector `device_sector` of slot `member`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReshapeExtent {
    pub side: Side,
    pub member: usize,
    /// Relative to the side's data offset, as `Geometry` gives it.
    pub member_sector: u64,
    pub device_sector: u64,
    pub len_sectors: u64,
}

impl ReshapeGeometry {
    /// Check and build. Refuses what md would not run: a position off the next layout's
    /// stripe boundary, offsets for the wrong number of slots, levels without parity.
    pub fn new(
        previous: Geometry,
        next: Geometry,
        position_sectors: u64,
        backwards: bool,
        data_offset_sectors: Vec<u64>,
        new_data_offset_sectors: Vec<u64>,
    ) -> Result<ReshapeGeometry, String> {
        if !previous.level.has_parity() || !next.level.has_parity() {
            return Err("only a raid4/5/6 reshape has a previous and a next stripe layout".into());
        }
        let slots = previous.raid_disks.max(next.raid_disks);
        if data_offset_sectors.len() != slots || new_data_offset_sectors.len() != slots {
            return Err(format!(
                "{} data offsets and {} new data offsets for {slots} slots",
                data_offset_sectors.len(),
                new_data_offset_sectors.len()
            ));
        }
        // raid5.c run(): the position must lie on a stripe boundary of the new layout, in
        // units of the larger chunk.
        let stripe = window_unit(&previous, &next);
        if !position_sectors.is_multiple_of(stripe) {
            return Err(format!(
                "reshape_position {position_sectors} is not on a stripe boundary of the new layout \
                 ({stripe} sectors)"
            ));
        }
        let r = ReshapeGeometry {
            previous,
            next,
            position_sectors,
            backwards,
            data_offset_sectors,
            new_data_offset_sectors,
        };
        if position_sectors > r.next.array_sectors().max(r.previous.array_sectors()) {
            return Err(format!("reshape_position {position_sectors} lies beyond the array"));
        }
        Ok(r)
    }

    /// The unit a reshape moves: a stripe of the next layout in chunks of the larger of the
    /// two chunk sizes (md's reshape_sectors), whole stripes of both layouts' rows.
    pub fn window_unit_sectors(&self) -> u64 {
        window_unit(&self.previous, &self.next)
    }

    /// The array size md serves while the reshape runs: the smaller of the two layouts'
    /// (raid5_size with the smaller raid_disks; a grow shows its new size only at the end).
    pub fn array_sectors(&self) -> u64 {
        self.previous.array_sectors().min(self.next.array_sectors())
    }

    /// md's `ahead_of_reshape`: the side that holds array `sector` at `position_sectors`.
    pub fn side_of(&self, sector: u64, position_sectors: u64) -> Side {
        let ahead = if self.backwards { sector < position_sectors } else { sector >= position_sectors };
        if ahead {
            Side::Previous
        } else {
            Side::Next
        }
    }

    pub fn geometry(&self, side: Side) -> &Geometry {
        match side {
            Side::Previous => &self.previous,
            Side::Next => &self.next,
        }
    }

    /// Device sector of `member_sector` (relative to the side's data offset) on `member`.
    pub fn device_sector(&self, side: Side, member: usize, member_sector: u64) -> u64 {
        let base = match side {
            Side::Previous => self.data_offset_sectors[member],
            Side::Next => self.new_data_offset_sectors[member],
        };
        base + member_sector
    }

    /// Where array `sector` lives at `position_sectors`, and how many sectors from it stay
    /// contiguous on that member and on that side of the position.
    pub fn map_sector(&self, sector: u64, position_sectors: u64) -> ReshapeExtent {
        let side = self.side_of(sector, position_sectors);
        let (ext, room) = self.geometry(side).map_sector(sector);
        let to_boundary = if sector < position_sectors { position_sectors - sector } else { u64::MAX };
        ReshapeExtent {
            side,
            member: ext.member,
            member_sector: ext.member_sector,
            device_sector: self.device_sector(side, ext.member, ext.member_sector),
            len_sectors: room.min(to_boundary),
        }
    }

    /// Split [sector, sector + len) into contiguous per-member pieces, each on one side.
    pub fn map_range(
        &self,
        sector: u64,
        len_sectors: u64,
        position_sectors: u64,
    ) -> Vec<(u64, ReshapeExtent)> {
        let mut out = Vec::new();
        let end = sector + len_sectors;
        let mut pos = sector;
        while pos < end {
            let mut e = self.map_sector(pos, position_sectors);
            e.len_sectors = e.len_sectors.min(end - pos);
            out.push((pos, e));
            pos += e.len_sectors;
        }
        out
    }

    /// md's `reshape_safe` rule for a forwards reshape: may the next layout hold array
    /// sectors [0, progress) while the superblocks record only `safe_sectors`? True when,
    /// on every member, the highest device sector written for the next layout stays below
    /// the lowest one the previous layout still needs (its data at `safe_sectors` and
    /// above, which a restart reads again). A crash then loses nothing.
    pub fn forwards_write_is_safe(&self, safe_sectors: u64, progress_sectors: u64) -> bool {
        if self.backwards {
            return false;
        }
        // The next layout's rows below `progress`; the previous layout's rows from the
        // stripe holding `safe` up.
        let write_end = member_rows(&self.next, progress_sectors, true);
        let read_start = member_rows(&self.previous, safe_sectors, false);
        (0..self.new_data_offset_sectors.len()).all(|m| {
            let in_previous = m < self.previous.raid_disks;
            // A slot the previous layout did not have holds nothing to preserve.
            !in_previous
                || self.new_data_offset_sectors[m] + write_end <= self.data_offset_sectors[m] + read_start
        })
    }

    /// The same rule for a backwards reshape (md's RESHAPE_BACKWARDS: the data offset moved
    /// up, stripes moved from the end down): may the next layout hold [from, end) while the
    /// superblocks record only `safe_sectors` (at or above `from`)? True when, on every
    /// member both layouts use, the lowest device sector written for the next layout stays
    /// at or above the highest one the previous layout still needs (its data below
    /// `safe_sectors`).
    pub fn backwards_write_is_safe(&self, safe_sectors: u64, from_sectors: u64) -> bool {
        if !self.backwards {
            return false;
        }
        // The next layout's rows from `from` up; the previous layout's rows below `safe`.
        let write_start = member_rows(&self.next, from_sectors, false);
        let read_end = member_rows(&self.previous, safe_sectors, true);
        (0..self.new_data_offset_sectors.len()).all(|m| {
            let both = m < self.previous.raid_disks && m < self.next.raid_disks;
            !both || self.new_data_offset_sectors[m] + write_start >= self.data_offset_sectors[m] + read_end
        })
    }

    /// May the next stripe from the checkpoint be written, in the reshape's direction
    /// (md's `run`: "reshape_position too early for auto-recovery" when not)?
    pub fn next_stripe_is_safe(&self) -> bool {
        let stripe = self.window_unit_sectors();
        let p = self.position_sectors;
        if self.backwards {
            p >= stripe && self.backwards_write_is_safe(p, p - stripe)
        } else {
            self.forwards_write_is_safe(p, p + stripe)
        }
    }
}

fn window_unit(previous: &Geometry, next: &Geometry) -> u64 {
    previous.chunk_sectors.max(next.chunk_sectors) * next.data_disks() as u64
}

/// Member sectors (relative to the layout's data offset) of `geo`'s stripes before array
/// `sector`: rounded up, the rows holding everything below it; down, the first row holding
/// it (so everything at or above it lies at or above that on every member).
fn member_rows(geo: &Geometry, sector: u64, round_up: bool) -> u64 {
    let stripe_data = geo.stripe_data_sectors();
    let stripes = if round_up { sector.div_ceil(stripe_data) } else { sector / stripe_data };
    stripes * geo.chunk_sectors
}

/// Why a reshape cannot be taken on: what was wrong, what to do.
pub fn unsupported(what: &str) -> String {
    format!(
        "{what}: uraid cannot run this reshape; let Linux md finish it (mdadm --assemble, then \
         wait for the reshape in /proc/mdstat) and assemble with uraid afterwards; nothing was written"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{algorithm, Level};

    /// The array md left in the VM: raid5 left-symmetric, 64 KiB chunk, 4 to 5 members,
    /// 63488 sectors each, data_offset 2048, new_offset -512.
    fn md_grow(position: u64) -> ReshapeGeometry {
        let g = |n| Geometry::new(Level::Raid5, n, algorithm::LEFT_SYMMETRIC, 128, &vec![63488; n]).unwrap();
        ReshapeGeometry::new(g(4), g(5), position, false, vec![2048; 5], vec![1536; 5]).unwrap()
    }

    #[test]
    fn forwards_sectors_below_the_position_use_the_new_layout_and_offset() {
        let r = md_grow(46592);
        assert_eq!(r.array_sectors(), 63488 * 3);
        // 46592 = 91 stripes of the new layout (4 data chunks of 128 sectors).
        let below = r.map_sector(46591, 46592);
        assert_eq!(below.side, Side::Next);
        let (e, _) = r.next.map_sector(46591);
        assert_eq!((below.member, below.member_sector), (e.member, e.member_sector));
        assert_eq!(below.device_sector, 1536 + e.member_sector);
        assert_eq!(below.len_sectors, 1, "a piece stops at the position");
        let at = r.map_sector(46592, 46592);
        assert_eq!(at.side, Side::Previous);
        let (e, room) = r.previous.map_sector(46592);
        assert_eq!(at.device_sector, 2048 + e.member_sector);
        assert_eq!(at.len_sectors, room);
    }

    #[test]
    fn a_range_across_the_position_splits_there() {
        let r = md_grow(512);
        let pieces = r.map_range(400, 300, 512);
        assert_eq!(pieces.iter().map(|(_, e)| e.len_sectors).sum::<u64>(), 300);
        let split = pieces.iter().position(|(_, e)| e.side == Side::Previous).unwrap();
        assert_eq!(pieces[split].0, 512);
        assert!(pieces[..split].iter().all(|(_, e)| e.side == Side::Next));
    }

    #[test]
    fn each_sector_has_one_home_and_homes_never_collide() {
        // The mapping at any position is a bijection onto device sectors.
        let g = |n| Geometry::new(Level::Raid6, n, algorithm::LEFT_SYMMETRIC, 8, &vec![64; n]).unwrap();
        let r = ReshapeGeometry::new(g(5), g(6), 0, false, vec![40; 6], vec![24; 6]).unwrap();
        for position in (0..=r.array_sectors()).step_by(32) {
            let mut seen = std::collections::HashSet::new();
            for s in 0..r.array_sectors() {
                let e = r.map_sector(s, position);
                assert!(seen.insert((e.member, e.device_sector)), "position {position} sector {s}");
            }
        }
    }

    #[test]
    fn the_safe_rule_holds_with_the_moved_offset_and_fails_without_it() {
        let r = md_grow(0);
        // The first new stripe (128 member sectors) lands 512 sectors lower: safe while the
        // checkpoint is at 0.
        assert!(r.forwards_write_is_safe(0, 512));
        // Far ahead of the checkpoint the new rows reach old data not yet recorded as copied.
        assert!(!r.forwards_write_is_safe(0, 512 * 40));
        // Checkpointed where md stopped, the next new stripe is safe to write.
        assert!(r.forwards_write_is_safe(46592, 46592 + 512));
        let mut no_room = md_grow(0);
        no_room.new_data_offset_sectors = vec![2048; 5];
        assert!(!no_room.forwards_write_is_safe(0, 512), "same offset: the first stripe overlaps");
        // What is on disk is consistent, but the next stripe cannot be written: md's "too
        // early for auto-recovery".
        assert!(no_room.forwards_write_is_safe(512, 512));
        assert!(!no_room.forwards_write_is_safe(512, 1024));
    }

    #[test]
    fn a_position_off_a_new_stripe_boundary_is_refused() {
        let g = |n| Geometry::new(Level::Raid5, n, algorithm::LEFT_SYMMETRIC, 128, &vec![4096; n]).unwrap();
        let e = ReshapeGeometry::new(g(4), g(5), 384, false, vec![2048; 5], vec![1536; 5]).unwrap_err();
        assert!(e.contains("stripe boundary"), "{e}");
    }
}
