//! In-memory member contents with a durable/volatile split.
//!
//! The current image (what a read returns) lives in sparse 4 KiB pages, so a 1 TB member
//! costs nothing until written and unwritten bytes read as zeroes. With a write-back cache
//! every completed write is also logged with the bytes it overwrote (its pre-image) until
//! a flush makes it durable. At power loss the log is rolled back to the durable image and
//! each unflushed write is then kept or dropped independently (so later writes may survive
//! where earlier ones did not: "applied out of order"), and a kept multi-sector write may be
//! torn (only some of its sectors land). Sectors are atomic: every sector ends up holding
//! either its old or its new contents, never a mix.

use std::collections::{BTreeMap, HashMap, VecDeque};

use uraid_core::{MemberIoError, SECTOR_BYTES};

use uraid_core::rng::Rng;

/// Small pages: a random 4 KiB write then zero-fills 4 KiB, not 64 KiB (the simulator's
/// speed is dominated by this on random-write workloads).
pub const PAGE_BYTES: u64 = 4096;

/// Page numbers are already well spread; SipHash would cost more than the page copy.
#[derive(Clone, Copy, Debug, Default)]
pub struct PageHasher(u64);

impl std::hash::Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 ^= self.0 >> 32;
    }
}

/// Page number -> index of the page in the [`PageArena`].
type PageMap = HashMap<u64, u32, std::hash::BuildHasherDefault<PageHasher>>;

/// Arena slabs grow from `FIRST_SLAB_PAGES` (256 KiB), doubling, to `MAX_SLAB_PAGES` (8 MiB),
/// so a small simulated member stays small and a big one makes few allocations.
const FIRST_SLAB_PAGES: usize = 64;
const MAX_SLAB_PAGES: usize = 2048;
/// Slabs before the first full-size one (64, 128, ..., 1024 pages) and the pages they hold.
const GROWING_SLABS: usize = 5;
const GROWING_PAGES: usize = FIRST_SLAB_PAGES * ((1 << GROWING_SLABS) - 1);

/// Full-size slabs of dropped arenas, kept for the next simulated member in this process
/// (a run of experiments or seeds makes many): a slab fresh from the kernel costs a page
/// fault, a kernel zeroing and accounting per 4 KiB page (most of a disk-only run's time),
/// a reused one a 4 KiB memset per page handed out. At most `SLAB_POOL_MAX` (1 GiB) kept.
static SLAB_POOL: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
const SLAB_POOL_MAX: usize = 128;

/// The member's pages, allocated in slabs and never freed individually (a page once
/// written stays resident, as before). Each slab is populated in one `madvise` (where the
/// kernel has `MADV_POPULATE_WRITE`) instead of one page fault per 4 KiB page written, or
/// comes from `SLAB_POOL`.
#[derive(Clone, Debug, Default)]
struct PageArena {
    slabs: Vec<Vec<u8>>,
    /// Slabs from the pool hold old pages: each is zeroed as it is handed out.
    recycled: Vec<bool>,
    used: usize,
}

impl Drop for PageArena {
    fn drop(&mut self) {
        let full = MAX_SLAB_PAGES * PAGE_BYTES as usize;
        let mut pool = SLAB_POOL.lock().unwrap_or_else(|e| e.into_inner());
        for slab in self.slabs.drain(..).filter(|s| s.len() == full) {
            if pool.len() >= SLAB_POOL_MAX {
                break;
            }
            pool.push(slab);
        }
    }
}

impl PageArena {
    /// Slab and page-within-slab of page index `i`.
    fn place(i: usize) -> (usize, usize) {
        if i < GROWING_PAGES {
            let k = (i / FIRST_SLAB_PAGES + 1).ilog2() as usize;
            (k, i - FIRST_SLAB_PAGES * ((1 << k) - 1))
        } else {
            let j = i - GROWING_PAGES;
            (GROWING_SLABS + j / MAX_SLAB_PAGES, j % MAX_SLAB_PAGES)
        }
    }

    /// A new zero page; returns its index.
    fn alloc(&mut self) -> u32 {
        let (slab, _) = Self::place(self.used);
        if slab == self.slabs.len() && slab >= GROWING_SLABS {
            if let Some(v) = SLAB_POOL.lock().unwrap_or_else(|e| e.into_inner()).pop() {
                self.slabs.push(v);
                self.recycled.push(true);
            }
        }
        if slab == self.slabs.len() {
            let pages = if slab < GROWING_SLABS { FIRST_SLAB_PAGES << slab } else { MAX_SLAB_PAGES };
            let v = vec![0u8; pages * PAGE_BYTES as usize];
            #[cfg(target_os = "linux")]
            {
                // madvise takes whole pages only (EINVAL otherwise), and the allocator's
                // header puts the vector 16 bytes past a page boundary: advise the pages
                // inside it. (Unaligned, neither call ever took effect, and every page
                // was faulted in one by one when first written.)
                let start = (v.as_ptr() as usize).next_multiple_of(PAGE_BYTES as usize);
                let end = (v.as_ptr() as usize + v.len()) / PAGE_BYTES as usize * PAGE_BYTES as usize;
                if end > start {
                    // SAFETY: advice on whole pages inside memory this vector owns; populating
                    // keeps its zero contents.
                    unsafe {
                        let (ptr, len) = (start as *mut libc::c_void, end - start);
                        libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
                        libc::madvise(ptr, len, libc::MADV_POPULATE_WRITE);
                    }
                }
            }
            self.slabs.push(v);
            self.recycled.push(false);
        }
        self.used += 1;
        let page = u32::try_from(self.used - 1).expect("fewer than 2^32 pages");
        if self.recycled[slab] {
            self.page_mut(page).fill(0);
        }
        page
    }
    fn page(&self, i: u32) -> &[u8] {
        let (slab, p) = Self::place(i as usize);
        let at = p * PAGE_BYTES as usize;
        &self.slabs[slab][at..at + PAGE_BYTES as usize]
    }
    fn page_mut(&mut self, i: u32) -> &mut [u8] {
        let (slab, p) = Self::place(i as usize);
        let at = p * PAGE_BYTES as usize;
        &mut self.slabs[slab][at..at + PAGE_BYTES as usize]
    }
}

#[derive(Clone, Debug)]
struct VolatileWrite {
    seq: u64,
    offset_bytes: u64,
    data: Vec<u8>,
    pre_image: Vec<u8>,
}

/// What a power loss does to unflushed writes; the choices are drawn from the run's seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PowerLossPolicy {
    /// Probability that one unflushed (or in-flight) write survives.
    pub keep_probability: f64,
    /// Probability that a surviving multi-sector write is torn: each of its sectors then
    /// lands with probability 1/2.
    pub torn_probability: f64,
}

impl Default for PowerLossPolicy {
    fn default() -> Self {
        PowerLossPolicy { keep_probability: 0.5, torn_probability: 0.25 }
    }
}

impl PowerLossPolicy {
    /// Every unflushed write is lost: the harshest legal outcome for an engine that flushes.
    pub fn drop_all() -> Self {
        PowerLossPolicy { keep_probability: 0.0, torn_probability: 0.0 }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerLossReport {
    pub dropped_writes: u64,
    pub kept_writes: u64,
    pub torn_writes: u64,
}

#[derive(Clone, Debug)]
pub struct MemberStore {
    size_bytes: u64,
    write_cache: bool,
    pages: PageMap,
    arena: PageArena,
    volatile: VecDeque<VolatileWrite>,
    volatile_bytes: u64,
    next_seq: u64,
    /// Latent sector errors as disjoint sector ranges: start -> end (exclusive).
    bad_sectors: BTreeMap<u64, u64>,
}

impl MemberStore {
    pub fn new(size_bytes: u64, write_cache: bool) -> Self {
        MemberStore {
            size_bytes,
            write_cache,
            pages: PageMap::default(),
            arena: PageArena::default(),
            volatile: VecDeque::new(),
            volatile_bytes: 0,
            next_seq: 0,
            bad_sectors: BTreeMap::new(),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    pub fn write_cache(&self) -> bool {
        self.write_cache
    }

    /// Bytes held in pages: what the member costs in memory.
    pub fn resident_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE_BYTES
    }

    pub fn unflushed_writes(&self) -> usize {
        self.volatile.len()
    }

    pub fn unflushed_bytes(&self) -> u64 {
        self.volatile_bytes
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), MemberIoError> {
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(MemberIoError::Io),
        }
    }

    /// Read as a device would: beyond the end or over a latent sector error is `Io`.
    pub fn read(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, MemberIoError> {
        self.check_range(offset_bytes, len_bytes)?;
        if self.has_bad_sector(offset_bytes, len_bytes) {
            return Err(MemberIoError::Io);
        }
        Ok(self.read_vec(offset_bytes, len_bytes as usize))
    }

    /// The stored bytes as a new vector, built page by page rather than zeroed and then
    /// overwritten: reads and write pre-images are most of the simulator's data traffic.
    fn read_vec(&self, offset_bytes: u64, len: usize) -> Vec<u8> {
        let mut buf = Vec::with_capacity(len);
        self.for_each_piece(offset_bytes, len, |piece, n| match piece {
            Some(bytes) => buf.extend_from_slice(bytes),
            None => buf.resize(buf.len() + n, 0),
        });
        buf
    }

    /// The stored bytes, ignoring latent errors: for checkers and crash images.
    pub fn peek(&self, offset_bytes: u64, buf: &mut [u8]) {
        let len = (buf.len() as u64).min(self.size_bytes.saturating_sub(offset_bytes)) as usize;
        buf[len..].fill(0);
        self.read_raw(offset_bytes, &mut buf[..len]);
    }

    fn read_raw(&self, offset_bytes: u64, buf: &mut [u8]) {
        let mut done = 0usize;
        self.for_each_piece(offset_bytes, buf.len(), |piece, n| {
            match piece {
                Some(bytes) => buf[done..done + n].copy_from_slice(bytes),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        });
    }

    /// The stored bytes of `[offset_bytes, offset_bytes + len)` in order, a page at most at
    /// a time: `(Some(bytes), n)` where a page is resident, `(None, n)` for `n` unwritten
    /// (zero) bytes.
    fn for_each_piece(&self, offset_bytes: u64, len: usize, mut f: impl FnMut(Option<&[u8]>, usize)) {
        let mut done = 0usize;
        while done < len {
            let pos = offset_bytes + done as u64;
            let (page, in_page) = (pos / PAGE_BYTES, (pos % PAGE_BYTES) as usize);
            let n = (PAGE_BYTES as usize - in_page).min(len - done);
            f(self.pages.get(&page).map(|&p| &self.arena.page(p)[in_page..in_page + n]), n);
            done += n;
        }
    }

    fn write_raw(&mut self, offset_bytes: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset_bytes + done as u64;
            let page = pos / PAGE_BYTES;
            let in_page = (pos % PAGE_BYTES) as usize;
            let n = (PAGE_BYTES as usize - in_page).min(data.len() - done);
            let src = &data[done..done + n];
            match self.pages.get(&page) {
                Some(&p) => self.arena.page_mut(p)[in_page..in_page + n].copy_from_slice(src),
                // Zeroes into an absent page keep it absent: trims and zero-fills stay free.
                None if src.iter().all(|&b| b == 0) => {}
                None => {
                    let p = self.arena.alloc();
                    self.arena.page_mut(p)[in_page..in_page + n].copy_from_slice(src);
                    self.pages.insert(page, p);
                }
            }
            done += n;
        }
    }

    /// A completed write: visible to reads now, durable only after a flush (with a write cache).
    pub fn write(&mut self, offset_bytes: u64, data: &[u8]) -> Result<(), MemberIoError> {
        if self.write_cache {
            return self.write_owned(offset_bytes, data.to_vec());
        }
        self.check_range(offset_bytes, data.len() as u64)?;
        self.clear_bad_sectors(offset_bytes, data.len() as u64);
        self.write_raw(offset_bytes, data);
        Ok(())
    }

    /// As `write`, keeping the buffer for the volatile log instead of copying it.
    pub fn write_owned(&mut self, offset_bytes: u64, data: Vec<u8>) -> Result<(), MemberIoError> {
        self.check_range(offset_bytes, data.len() as u64)?;
        self.clear_bad_sectors(offset_bytes, data.len() as u64);
        if !self.write_cache {
            self.write_raw(offset_bytes, &data);
            return Ok(());
        }
        let pre_image = self.read_vec(offset_bytes, data.len());
        self.write_raw(offset_bytes, &data);
        self.volatile_bytes += data.len() as u64;
        self.volatile.push_back(VolatileWrite { seq: self.next_seq, offset_bytes, data, pre_image });
        self.next_seq += 1;
        Ok(())
    }

    /// Taken when a flush is issued: the flush covers writes completed before this point.
    pub fn flush_mark(&self) -> u64 {
        self.next_seq
    }

    /// The flush issued at `mark` has completed: the writes it covers are durable.
    pub fn flush_complete(&mut self, mark: u64) {
        while let Some(w) = self.volatile.front() {
            if w.seq >= mark {
                break;
            }
            self.volatile_bytes -= w.data.len() as u64;
            self.volatile.pop_front();
        }
    }

    /// Make everything durable now (e.g. building an initial image).
    pub fn flush_all(&mut self) {
        self.flush_complete(u64::MAX);
    }

    /// Power is cut: unflushed writes (and `in_flight` writes the device had not finished)
    /// survive or not as `policy` and `rng` decide. Afterwards the current image is what the
    /// platters hold.
    pub fn power_loss(
        &mut self,
        policy: &PowerLossPolicy,
        rng: &mut Rng,
        in_flight: &[(u64, &[u8])],
    ) -> PowerLossReport {
        let mut report = PowerLossReport::default();
        let log: Vec<VolatileWrite> = self.volatile.drain(..).collect();
        self.volatile_bytes = 0;
        // Newest first, so each pre-image restores exactly what the previous write left.
        for w in log.iter().rev() {
            self.write_raw(w.offset_bytes, &w.pre_image);
        }
        let candidates =
            log.iter().map(|w| (w.offset_bytes, w.data.as_slice())).chain(in_flight.iter().copied());
        let mut survivors: Vec<(u64, &[u8], bool)> = Vec::new();
        for (offset_bytes, data) in candidates {
            if !rng.chance(policy.keep_probability) {
                report.dropped_writes += 1;
                continue;
            }
            let torn = data.len() as u64 > SECTOR_BYTES && rng.chance(policy.torn_probability);
            report.kept_writes += 1;
            report.torn_writes += torn as u64;
            survivors.push((offset_bytes, data, torn));
        }
        for (offset_bytes, data, torn) in survivors {
            if !torn {
                self.write_raw(offset_bytes, data);
                continue;
            }
            for (i, sector) in data.chunks(SECTOR_BYTES as usize).enumerate() {
                if rng.chance(0.5) {
                    self.write_raw(offset_bytes + i as u64 * SECTOR_BYTES, sector);
                }
            }
        }
        report
    }

    /// Reads touching these sectors fail with `Io` until the sectors are rewritten.
    pub fn add_latent_error(&mut self, offset_bytes: u64, len_bytes: u64) {
        let start = offset_bytes / SECTOR_BYTES;
        let end = offset_bytes.saturating_add(len_bytes).div_ceil(SECTOR_BYTES).max(start + 1);
        // Merge with every overlapping or touching range so the map stays disjoint.
        let mut new_start = start;
        let mut new_end = end;
        let overlapping: Vec<u64> =
            self.bad_sectors.range(..=end).filter(|(_, &e)| e >= start).map(|(&s, _)| s).collect();
        for s in overlapping {
            let e = self.bad_sectors.remove(&s).unwrap_or(s);
            new_start = new_start.min(s);
            new_end = new_end.max(e);
        }
        self.bad_sectors.insert(new_start, new_end);
    }

    /// The sectors that fail reads, as `[start, end)` ranges of 512-byte member sectors.
    pub fn latent_error_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.bad_sectors.iter().map(|(&s, &e)| (s, e))
    }

    pub fn latent_error_sectors(&self) -> u64 {
        self.bad_sectors.iter().map(|(s, e)| e - s).sum()
    }

    fn has_bad_sector(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        if self.bad_sectors.is_empty() {
            return false;
        }
        let start = offset_bytes / SECTOR_BYTES;
        let end = (offset_bytes + len_bytes).div_ceil(SECTOR_BYTES);
        self.bad_sectors.range(..end).next_back().is_some_and(|(_, &e)| e > start)
    }

    /// A write remaps the sectors it covers completely (a drive reallocates on write).
    fn clear_bad_sectors(&mut self, offset_bytes: u64, len_bytes: u64) {
        if self.bad_sectors.is_empty() {
            return;
        }
        let start = offset_bytes.div_ceil(SECTOR_BYTES);
        let end = (offset_bytes + len_bytes) / SECTOR_BYTES;
        if start >= end {
            return;
        }
        let hit: Vec<(u64, u64)> =
            self.bad_sectors.range(..end).filter(|(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in hit {
            self.bad_sectors.remove(&s);
            if s < start {
                self.bad_sectors.insert(s, start);
            }
            if e > end {
                self.bad_sectors.insert(end, e);
            }
        }
    }

    /// Silent corruption: flip `bit_flips` bits chosen by `rng` inside the range of the stored
    /// data. Reads succeed and return the damaged bytes. Returns the byte offsets touched.
    pub fn corrupt(&mut self, offset_bytes: u64, len_bytes: u64, bit_flips: u32, rng: &mut Rng) -> Vec<u64> {
        let end = offset_bytes.saturating_add(len_bytes).min(self.size_bytes);
        let mut touched = Vec::new();
        if end <= offset_bytes {
            return touched;
        }
        for _ in 0..bit_flips {
            let pos = offset_bytes + rng.below(end - offset_bytes);
            let bit = rng.below(8) as u8;
            let mut b = [0u8];
            self.read_raw(pos, &mut b);
            b[0] ^= 1 << bit;
            // Force a page even for a zero result, so an absent page can hold the damage.
            self.write_raw_forced(pos, &b);
            touched.push(pos);
        }
        touched
    }

    fn write_raw_forced(&mut self, offset_bytes: u64, data: &[u8]) {
        let page = offset_bytes / PAGE_BYTES;
        if !self.pages.contains_key(&page) {
            let p = self.arena.alloc();
            self.pages.insert(page, p);
        }
        self.write_raw(offset_bytes, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_reads_are_zero_and_cost_nothing() {
        let s = MemberStore::new(1 << 40, true);
        assert_eq!(s.read(123 << 20, 4096).unwrap(), vec![0; 4096]);
        assert_eq!(s.resident_bytes(), 0);
        assert_eq!(s.read((1 << 40) - 512, 1024), Err(MemberIoError::Io));
    }

    #[test]
    fn arena_slabs_tile_the_page_indices() {
        let mut next = (0usize, 0usize);
        for i in 0..GROWING_PAGES + 3 * MAX_SLAB_PAGES {
            let (slab, p) = PageArena::place(i);
            if (slab, p) != next {
                assert_eq!((slab, p), (next.0 + 1, 0), "page {i}");
            }
            let size = if slab < GROWING_SLABS { FIRST_SLAB_PAGES << slab } else { MAX_SLAB_PAGES };
            assert!(p < size, "page {i}");
            next = (slab, p + 1);
        }
        let mut s = MemberStore::new(1 << 34, false);
        for k in 0..5000u64 {
            s.write(k * 7 * PAGE_BYTES, &[(k % 251) as u8 + 1; 512]).unwrap();
        }
        for k in 0..5000u64 {
            assert_eq!(s.read(k * 7 * PAGE_BYTES, 512).unwrap(), vec![(k % 251) as u8 + 1; 512]);
        }
    }

    #[test]
    fn write_spanning_pages_reads_back() {
        let mut s = MemberStore::new(1 << 30, false);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        s.write(PAGE_BYTES - 100, &data).unwrap();
        assert_eq!(s.read(PAGE_BYTES - 100, data.len() as u64).unwrap(), data);
    }
}
