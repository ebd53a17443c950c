//! md's per-member bad-block log: the set of member sectors md will not read, and its
//! on-disk page.
//!
//! The log sits `bblog_offset` sectors from the superblock and is `bblog_size` sectors
//! (at most 8: one page). Each little-endian u64 entry is
//! `(sector >> bblog_shift) << 10 | len`, `len` in 10 bits in units of `1 << bblog_shift`
//! sectors; an all-ones entry ends the list [md.c super_1_load, super_1_sync]. Sectors are
//! device sectors as md stores them: `rdev_set_badblocks` adds `data_offset`. The log is
//! read only while the superblock's `MD_FEATURE_BAD_BLOCKS` bit is set.

use std::fmt;

use super::superblock::{feature, Superblock};

/// md's BB_MAX_LEN: the longest range one entry holds, in blocks.
pub const BB_MAX_LEN: u64 = 512;
/// md's MAX_BADBLOCKS: entries in one page.
pub const MAX_BADBLOCKS: usize = 4096 / 8;
/// md refuses a log larger than a page (super_1_load).
pub const MAX_BBLOG_SECTORS: u16 = 8;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadBlocksError {
    /// `bblog_size` over a page, or a zero offset with the feature bit set.
    BadLog { bblog_size: u16, bblog_offset: i32 },
    /// Fewer bytes than `bblog_size` sectors were handed in.
    Truncated { len: usize, needed: usize },
    /// The entries read do not fit md's one page (md's `md_set_badblocks` fails the load).
    TooManyEntries { entries: usize, capacity: usize },
}

impl fmt::Display for BadBlocksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadBlocksError::BadLog { bblog_size, bblog_offset } => write!(
                f,
                "the superblock says bad blocks are logged, but its log ({bblog_size} sectors at offset \
                 {bblog_offset}) is not one md can read (at most 8 sectors, offset not 0)"
            ),
            BadBlocksError::Truncated { len, needed } => {
                write!(f, "bad-block log truncated: {len} bytes read, {needed} needed")
            }
            BadBlocksError::TooManyEntries { entries, capacity } => write!(
                f,
                "bad-block log lists {entries} entries; md holds at most {capacity} (md refuses this member too)"
            ),
        }
    }
}

impl std::error::Error for BadBlocksError {}

/// One member's bad sectors: sorted, disjoint `[start, end)` ranges of device sectors,
/// with md's limits (granularity `1 << shift`, `capacity` entries of at most
/// [`BB_MAX_LEN`] blocks each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadBlocks {
    shift: u8,
    capacity: usize,
    ranges: Vec<(u64, u64)>,
}

impl BadBlocks {
    /// An empty set for a log of `bblog_size` sectors (entries beyond what those sectors
    /// hold would never reach the disk, so they count against the room).
    pub fn new(bblog_shift: u8, bblog_size: u16) -> BadBlocks {
        let capacity = (usize::from(bblog_size.min(MAX_BBLOG_SECTORS)) * 512 / 8).min(MAX_BADBLOCKS);
        BadBlocks { shift: bblog_shift.min(32), capacity, ranges: Vec::new() }
    }

    /// The log a member's superblock describes, empty; None when it has none
    /// (`bblog_offset` 0: md then fails the member on its first write error).
    pub fn for_superblock(sb: &Superblock) -> Option<BadBlocks> {
        (sb.bblog_offset != 0 && sb.bblog_size > 0).then(|| BadBlocks::new(sb.bblog_shift, sb.bblog_size))
    }

    /// The same entries in the log `sb` describes (a device's new superblock may place
    /// and size its log differently); None when it has no log or no room for them.
    pub fn moved_to(&self, sb: &Superblock) -> Option<BadBlocks> {
        let mut bb = BadBlocks::for_superblock(sb)?;
        self.entries().all(|(sector, sectors)| bb.set(sector, sectors)).then_some(bb)
    }

    /// Parses a member's log page as md's super_1_load does. `log` holds at least
    /// `bblog_size` sectors read at `super_offset + bblog_offset`. Without the feature bit
    /// the log is not read: an empty set.
    pub fn parse(sb: &Superblock, log: &[u8]) -> Result<Option<BadBlocks>, BadBlocksError> {
        let has = sb.feature_map & feature::BAD_BLOCKS != 0;
        if has && (sb.bblog_size > MAX_BBLOG_SECTORS || sb.bblog_offset == 0) {
            return Err(BadBlocksError::BadLog { bblog_size: sb.bblog_size, bblog_offset: sb.bblog_offset });
        }
        let Some(mut bb) = BadBlocks::for_superblock(sb) else { return Ok(None) };
        if !has {
            return Ok(Some(bb));
        }
        let needed = usize::from(sb.bblog_size) * 512;
        if log.len() < needed {
            return Err(BadBlocksError::Truncated { len: log.len(), needed });
        }
        for raw in log[..needed].chunks_exact(8) {
            let e = u64::from_le_bytes(raw.try_into().expect("8 bytes"));
            if e == u64::MAX {
                break;
            }
            let start = (e >> 10) << bb.shift;
            let len = (e & 0x3ff) << bb.shift;
            if len == 0 {
                continue;
            }
            if !bb.set(start, len) {
                return Err(BadBlocksError::TooManyEntries {
                    entries: bb.entry_count() + 1,
                    capacity: bb.capacity,
                });
            }
        }
        Ok(Some(bb))
    }

    /// The log's `bblog_size` sectors as md's super_1_sync writes them: the entries, then
    /// all-ones.
    pub fn to_log_bytes(&self, bblog_size: u16) -> Vec<u8> {
        let mut out = vec![0xffu8; usize::from(bblog_size) * 512];
        for (i, (start, len)) in self.entries().enumerate().take(out.len() / 8) {
            let e = ((start >> self.shift) << 10) | (len >> self.shift);
            out[i * 8..i * 8 + 8].copy_from_slice(&e.to_le_bytes());
        }
        out
    }

    /// The entries as md lists them: (first sector, sectors), each at most
    /// [`BB_MAX_LEN`] blocks.
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let max = BB_MAX_LEN << self.shift;
        self.ranges.iter().flat_map(move |&(s, e)| {
            (0..(e - s).div_ceil(max)).map(move |k| {
                let a = s + k * max;
                (a, (e - a).min(max))
            })
        })
    }

    fn count_of(ranges: &[(u64, u64)], shift: u8) -> usize {
        let max = BB_MAX_LEN << shift;
        ranges.iter().map(|&(s, e)| (e - s).div_ceil(max) as usize).sum()
    }

    pub fn entry_count(&self) -> usize {
        Self::count_of(&self.ranges, self.shift)
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn shift(&self) -> u8 {
        self.shift
    }

    fn block(&self) -> u64 {
        1u64 << self.shift
    }

    /// md's badblocks_set: `[sector, sector + sectors)`, widened to whole blocks, joins the
    /// set. False (and nothing changed) when the result would not fit the log: md then
    /// fails the member.
    pub fn set(&mut self, sector: u64, sectors: u64) -> bool {
        if sectors == 0 {
            return true;
        }
        let b = self.block();
        let start = sector / b * b;
        let end = (sector.saturating_add(sectors)).div_ceil(b).saturating_mul(b);
        let mut next = Vec::with_capacity(self.ranges.len() + 1);
        let (mut s, mut e) = (start, end);
        for &(a, z) in &self.ranges {
            if z < s || a > e {
                next.push((a, z));
            } else {
                // Overlapping or touching: one range.
                s = s.min(a);
                e = e.max(z);
            }
        }
        let at = next.partition_point(|&(a, _)| a < s);
        next.insert(at, (s, e));
        if Self::count_of(&next, self.shift) > self.capacity {
            return false;
        }
        self.ranges = next;
        true
    }

    /// md's badblocks_clear: the whole blocks inside `[sector, sector + sectors)` are good
    /// again. False (nothing changed) when splitting a range would overflow the log.
    pub fn clear(&mut self, sector: u64, sectors: u64) -> bool {
        let b = self.block();
        // Only whole blocks are cleared: a part of a block stays bad.
        let start = sector.div_ceil(b).saturating_mul(b);
        let end = sector.saturating_add(sectors) / b * b;
        if start >= end || !self.overlaps(start, end - start) {
            return true;
        }
        let mut next = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, z) in &self.ranges {
            if z <= start || a >= end {
                next.push((a, z));
                continue;
            }
            if a < start {
                next.push((a, start));
            }
            if z > end {
                next.push((end, z));
            }
        }
        if Self::count_of(&next, self.shift) > self.capacity {
            return false;
        }
        self.ranges = next;
        true
    }

    /// md's is_badblock: does any listed sector lie in `[sector, sector + sectors)`?
    pub fn overlaps(&self, sector: u64, sectors: u64) -> bool {
        let end = sector.saturating_add(sectors);
        let i = self.ranges.partition_point(|&(_, z)| z <= sector);
        self.ranges.get(i).is_some_and(|&(a, _)| a < end)
    }

    /// Where a listed range begins or ends strictly inside `(sector, sector + sectors)`,
    /// in order: the places md's sync_request cuts a request at (`first_bad`, `min_bad`).
    pub fn edges_within(&self, sector: u64, sectors: u64) -> impl Iterator<Item = u64> + '_ {
        let end = sector.saturating_add(sectors);
        let i = self.ranges.partition_point(|&(_, z)| z <= sector);
        self.ranges[i..]
            .iter()
            .take_while(move |&&(a, _)| a < end)
            .flat_map(|&(a, z)| [a, z])
            .filter(move |&e| sector < e && e < end)
    }

    /// mdadm --examine-badblocks's listing for `devname`.
    pub fn examine_text(&self, devname: &str) -> String {
        let mut s = format!("Bad-blocks on {devname}:\n");
        for (start, len) in self.entries() {
            s.push_str(&format!("{start:>20} for {len} sectors\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb_with_log(entries: bool) -> Superblock {
        let p = crate::meta::CreateParams::new(1, vec![Some(1 << 20); 2]);
        let mut sb = crate::meta::create_array(&p).unwrap().superblocks[0].clone().unwrap();
        sb.bblog_size = 8;
        sb.bblog_offset = 16;
        if entries {
            sb.feature_map |= feature::BAD_BLOCKS;
        }
        sb
    }

    #[test]
    fn entries_encode_as_md_stores_them_and_round_trip() {
        let mut bb = BadBlocks::new(0, 8);
        assert!(bb.set(2048 + 100, 8));
        assert!(bb.set(4096, 1));
        let page = bb.to_log_bytes(8);
        assert_eq!(page.len(), 4096);
        // (sector << 10) | len, little-endian; then all-ones.
        assert_eq!(u64::from_le_bytes(page[0..8].try_into().unwrap()), (2148 << 10) | 8);
        assert_eq!(u64::from_le_bytes(page[8..16].try_into().unwrap()), (4096 << 10) | 1);
        assert!(page[16..].iter().all(|&b| b == 0xff));
        let back = BadBlocks::parse(&sb_with_log(true), &page).unwrap().unwrap();
        assert_eq!(back, bb);
        assert_eq!(back.entries().collect::<Vec<_>>(), vec![(2148, 8), (4096, 1)]);
    }

    #[test]
    fn without_the_feature_bit_the_page_is_not_read() {
        let mut bb = BadBlocks::new(0, 8);
        bb.set(10, 10);
        let page = bb.to_log_bytes(8);
        let back = BadBlocks::parse(&sb_with_log(false), &page).unwrap().unwrap();
        assert!(back.is_empty());
        let mut none = sb_with_log(false);
        none.bblog_offset = 0;
        assert_eq!(BadBlocks::parse(&none, &page).unwrap(), None, "no log: md fails the member instead");
    }

    #[test]
    fn shift_scales_sector_and_length() {
        let mut sb = sb_with_log(true);
        sb.bblog_shift = 3;
        let mut page = vec![0xffu8; 4096];
        page[..8].copy_from_slice(&((5u64 << 10) | 2).to_le_bytes());
        let bb = BadBlocks::parse(&sb, &page).unwrap().unwrap();
        assert_eq!(bb.entries().collect::<Vec<_>>(), vec![(40, 16)]);
        assert_eq!(bb.to_log_bytes(8), page);
    }

    #[test]
    fn touching_ranges_merge_and_long_ones_split_at_512() {
        let mut bb = BadBlocks::new(0, 8);
        bb.set(0, 300);
        bb.set(300, 300);
        assert_eq!(bb.entries().collect::<Vec<_>>(), vec![(0, 512), (512, 88)]);
        bb.set(1000, 4);
        assert!(bb.overlaps(1003, 10) && !bb.overlaps(600, 400) && !bb.overlaps(1004, 1));
        bb.clear(100, 50);
        assert_eq!(bb.entries().collect::<Vec<_>>(), vec![(0, 100), (150, 450), (1000, 4)]);
        bb.clear(0, 2000);
        assert!(bb.is_empty());
    }

    #[test]
    fn a_full_log_refuses_and_keeps_what_it_had() {
        let mut bb = BadBlocks::new(0, 1); // 64 entries
        for k in 0..64 {
            assert!(bb.set(k * 10, 1));
        }
        let before = bb.clone();
        assert!(!bb.set(10_000, 1), "a 65th entry does not fit");
        assert_eq!(bb, before);
        assert!(bb.set(631, 2), "joining an existing range needs no new entry");
        let before = bb.clone();
        assert!(!bb.clear(631, 1), "splitting a range needs a 65th entry");
        assert_eq!(bb, before);
    }

    #[test]
    fn clearing_part_of_a_block_leaves_it_bad() {
        let mut bb = BadBlocks::new(3, 8);
        bb.set(9, 1);
        assert_eq!(bb.entries().collect::<Vec<_>>(), vec![(8, 8)]);
        bb.clear(9, 7);
        assert_eq!(bb.entries().collect::<Vec<_>>(), vec![(8, 8)]);
        bb.clear(8, 8);
        assert!(bb.is_empty());
    }

    #[test]
    fn examine_text_is_mdadms() {
        let mut bb = BadBlocks::new(0, 8);
        bb.set(2148, 8);
        assert_eq!(
            bb.examine_text("/dev/vdb"),
            "Bad-blocks on /dev/vdb:\n                2148 for 8 sectors\n"
        );
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let mut sb = sb_with_log(true);
        assert!(matches!(BadBlocks::parse(&sb, &[0u8; 100]), Err(BadBlocksError::Truncated { .. })));
        sb.bblog_size = 9;
        assert!(matches!(BadBlocks::parse(&sb, &[0u8; 9 * 512]), Err(BadBlocksError::BadLog { .. })));
        // 64 entries of 1000 sectors in a one-sector log: 128 of md's entries (at most 512
        // sectors each) where 64 fit.
        let mut sb = sb_with_log(true);
        sb.bblog_size = 1;
        let mut page = vec![0u8; 512];
        for k in 0..64u64 {
            page[k as usize * 8..k as usize * 8 + 8]
                .copy_from_slice(&(((k * 2000) << 10) | 1000).to_le_bytes());
        }
        assert!(matches!(BadBlocks::parse(&sb, &page), Err(BadBlocksError::TooManyEntries { .. })));
    }
}
