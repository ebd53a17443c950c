//! md's internal write-intent bitmap (linux drivers/md/md-bitmap.[ch], mdadm bitmap.c):
//! the 256-byte `bitmap_super_t`, the on-disk bit array that follows it, the size rules,
//! and [`WriteIntentBitmap`], the in-memory bookkeeping the engine drives.

use std::collections::BTreeSet;
use std::fmt;

/// `BITMAP_MAGIC` ("bitm").
pub const BITMAP_MAGIC: u32 = 0x6d74_6962;
/// `BITMAP_MAJOR_LO`/`BITMAP_MAJOR_HOSTENDIAN`: bits in host order (little-endian here).
pub const BITMAP_MAJOR_HOSTENDIAN: u32 = 3;
/// `BITMAP_MAJOR_HI`: bits little-endian. What mdadm writes.
pub const BITMAP_MAJOR_HI: u32 = 4;
/// `BITMAP_MAJOR_CLUSTERED`.
pub const BITMAP_MAJOR_CLUSTERED: u32 = 5;
/// `sizeof(bitmap_super_t)`; the bits start right after it.
pub const BITMAP_SUPER_BYTES: usize = 256;
/// The kernel moves the bitmap to and from disk a page at a time.
pub const BITMAP_PAGE_BYTES: usize = 4096;
/// mdadm's `DEFAULT_BITMAP_DELAY` (seconds between daemon passes that clear bits).
pub const DEFAULT_DAEMON_SLEEP_SECONDS: u32 = 5;
/// `COUNTER_MAX` of md-bitmap.h: bound of write_behind.
pub const COUNTER_MAX: u32 = 0x3fff;

/// `state` bits of the bitmap superblock.
pub mod state {
    pub const STALE: u32 = 1 << 1;
    pub const WRITE_ERROR: u32 = 1 << 2;
    pub const HOSTENDIAN: u32 = 1 << 15;
}

/// `bitmap_super_t`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapSuper {
    pub magic: u32,
    pub version: u32,
    pub uuid: [u8; 16],
    pub events: u64,
    pub events_cleared: u64,
    /// Sectors covered: per-member size for raid1/4/5/6, array size for raid10.
    pub sync_size: u64,
    pub state: u32,
    /// Bytes covered by one bit.
    pub chunksize: u32,
    pub daemon_sleep: u32,
    pub write_behind: u32,
    pub sectors_reserved: u32,
    pub nodes: u32,
    pub cluster_name: [u8; 64],
    pub pad: [u8; 120],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BitmapError {
    Truncated { len: usize, needed: usize },
    BadMagic { found: u32 },
    UnknownVersion { version: u32 },
    ChunkTooSmall { chunksize: u32 },
    ChunkNotPowerOfTwo { chunksize: u32 },
    DaemonSleepOutOfRange { daemon_sleep: u32 },
    WriteBehindOutOfRange { write_behind: u32 },
    UuidMismatch,
}

impl fmt::Display for BitmapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use BitmapError::*;
        match self {
            Truncated { len, needed } => write!(
                f,
                "bitmap buffer is {len} bytes, {needed} needed: the member is truncated or \
                 the read was short"
            ),
            BadMagic { found } => write!(
                f,
                "no bitmap superblock (magic {found:#010x}): the bitmap area is corrupted; \
                 assemble without the bitmap (full resync) and re-create it"
            ),
            UnknownVersion { version } => {
                write!(f, "unrecognized bitmap version {version} (3, 4 and 5 are known)")
            }
            ChunkTooSmall { chunksize } => {
                write!(f, "bitmap chunksize {chunksize} bytes is below 512: corrupted")
            }
            ChunkNotPowerOfTwo { chunksize } => {
                write!(f, "bitmap chunksize {chunksize} bytes is not a power of two: corrupted")
            }
            DaemonSleepOutOfRange { daemon_sleep } => {
                write!(f, "bitmap daemon sleep {daemon_sleep} s is out of range: corrupted")
            }
            WriteBehindOutOfRange { write_behind } => {
                write!(f, "bitmap write-behind {write_behind} exceeds {COUNTER_MAX}: corrupted")
            }
            UuidMismatch => write!(
                f,
                "bitmap uuid differs from the array uuid: the bitmap belongs to another array; \
                 assemble without it (full resync)"
            ),
        }
    }
}

impl std::error::Error for BitmapError {}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

impl BitmapSuper {
    /// A fresh bitmap superblock as mdadm's `add_internal_bitmap1` writes it.
    pub fn new(set_uuid: [u8; 16], sync_size_sectors: u64, chunksize_bytes: u32) -> Self {
        BitmapSuper {
            magic: BITMAP_MAGIC,
            version: BITMAP_MAJOR_HI,
            uuid: set_uuid,
            events: 0,
            events_cleared: 0,
            sync_size: sync_size_sectors,
            state: 0,
            chunksize: chunksize_bytes,
            daemon_sleep: DEFAULT_DAEMON_SLEEP_SECONDS,
            write_behind: 0,
            sectors_reserved: 0,
            nodes: 0,
            cluster_name: [0; 64],
            pad: [0; 120],
        }
    }

    /// Parses and checks the fields as `md_bitmap_read_sb` does. The uuid and events are
    /// checked against the array by [`BitmapSuper::check_against_array`].
    pub fn parse(buf: &[u8]) -> Result<Self, BitmapError> {
        if buf.len() < BITMAP_SUPER_BYTES {
            return Err(BitmapError::Truncated { len: buf.len(), needed: BITMAP_SUPER_BYTES });
        }
        let sb = BitmapSuper {
            magic: le32(buf, 0),
            version: le32(buf, 4),
            uuid: buf[8..24].try_into().unwrap(),
            events: le64(buf, 24),
            events_cleared: le64(buf, 32),
            sync_size: le64(buf, 40),
            state: le32(buf, 48),
            chunksize: le32(buf, 52),
            daemon_sleep: le32(buf, 56),
            write_behind: le32(buf, 60),
            sectors_reserved: le32(buf, 64),
            nodes: le32(buf, 68),
            cluster_name: buf[72..136].try_into().unwrap(),
            pad: buf[136..256].try_into().unwrap(),
        };
        if sb.magic != BITMAP_MAGIC {
            return Err(BitmapError::BadMagic { found: sb.magic });
        }
        if !(BITMAP_MAJOR_HOSTENDIAN..=BITMAP_MAJOR_CLUSTERED).contains(&sb.version) {
            return Err(BitmapError::UnknownVersion { version: sb.version });
        }
        if sb.chunksize < 512 {
            return Err(BitmapError::ChunkTooSmall { chunksize: sb.chunksize });
        }
        if !sb.chunksize.is_power_of_two() {
            return Err(BitmapError::ChunkNotPowerOfTwo { chunksize: sb.chunksize });
        }
        // The kernel bounds daemon_sleep * HZ by MAX_SCHEDULE_TIMEOUT; a day is plenty and
        // keeps the value meaningful on every HZ.
        if sb.daemon_sleep < 1 || sb.daemon_sleep > 86_400 {
            return Err(BitmapError::DaemonSleepOutOfRange { daemon_sleep: sb.daemon_sleep });
        }
        if sb.write_behind > COUNTER_MAX {
            return Err(BitmapError::WriteBehindOutOfRange { write_behind: sb.write_behind });
        }
        Ok(sb)
    }

    /// The uuid must be the array's. Returns whether the bitmap is stale: its events are
    /// behind the array's, so md ignores its bits and does a full resync/recovery.
    pub fn check_against_array(&self, set_uuid: &[u8; 16], array_events: u64) -> Result<bool, BitmapError> {
        if &self.uuid != set_uuid {
            return Err(BitmapError::UuidMismatch);
        }
        Ok(self.events < array_events || self.state & state::STALE != 0)
    }

    pub fn serialize(&self) -> [u8; BITMAP_SUPER_BYTES] {
        let mut b = [0u8; BITMAP_SUPER_BYTES];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..24].copy_from_slice(&self.uuid);
        b[24..32].copy_from_slice(&self.events.to_le_bytes());
        b[32..40].copy_from_slice(&self.events_cleared.to_le_bytes());
        b[40..48].copy_from_slice(&self.sync_size.to_le_bytes());
        b[48..52].copy_from_slice(&self.state.to_le_bytes());
        b[52..56].copy_from_slice(&self.chunksize.to_le_bytes());
        b[56..60].copy_from_slice(&self.daemon_sleep.to_le_bytes());
        b[60..64].copy_from_slice(&self.write_behind.to_le_bytes());
        b[64..68].copy_from_slice(&self.sectors_reserved.to_le_bytes());
        b[68..72].copy_from_slice(&self.nodes.to_le_bytes());
        b[72..136].copy_from_slice(&self.cluster_name);
        b[136..256].copy_from_slice(&self.pad);
        b
    }

    /// Number of bits (bitmap chunks) covering `sync_size`.
    pub fn bits(&self) -> u64 {
        bitmap_bits(self.sync_size, self.chunksize)
    }

    /// Bytes of superblock + bits, rounded up to `boundary` (mdadm `calc_bitmap_size`).
    pub fn bytes_on_disk(&self, boundary: u64) -> u64 {
        bitmap_bytes_on_disk(self.sync_size, self.chunksize, boundary)
    }

    /// Sectors the bitmap takes on a member as mdadm counts them when it moves the data
    /// offset (getinfo_super1's `earliest`: superblock and bits in whole 4 KiB).
    pub fn reserved_sectors(&self) -> u64 {
        self.bytes_on_disk(4096) / 512
    }

    /// Whether the bits are in host order (version 3 or HOSTENDIAN state); on a
    /// little-endian host that is the same order, so only a big-endian writer differs.
    pub fn host_endian(&self) -> bool {
        self.version == BITMAP_MAJOR_HOSTENDIAN || self.state & state::HOSTENDIAN != 0
    }
}

/// mdadm `bitmap_bits`: `ceil(sync_size * 512 / chunksize)`.
pub fn bitmap_bits(sync_size_sectors: u64, chunksize_bytes: u32) -> u64 {
    if chunksize_bytes == 0 {
        return 0;
    }
    (u128::from(sync_size_sectors) * 512).div_ceil(u128::from(chunksize_bytes)) as u64
}

/// mdadm `calc_bitmap_size`: 256-byte header plus the bits, rounded up to `boundary`.
pub fn bitmap_bytes_on_disk(sync_size_sectors: u64, chunksize_bytes: u32, boundary: u64) -> u64 {
    let bytes = bitmap_bits(sync_size_sectors, chunksize_bytes).div_ceil(8) + BITMAP_SUPER_BYTES as u64;
    bytes.div_ceil(boundary.max(1)) * boundary.max(1)
}

/// mdadm `choose_bm_space`: sectors reserved between superblock and data for a bitmap.
pub fn choose_bm_space(dev_sectors: u64) -> u64 {
    if dev_sectors < 64 * 2 {
        0
    } else if dev_sectors - 64 * 2 >= 200 * 1024 * 1024 * 2 {
        128 * 2
    } else if dev_sectors - 4 * 2 > 8 * 1024 * 1024 * 2 {
        64 * 2
    } else {
        4 * 2
    }
}

/// mdadm's bitmap chunk when none is asked for (`add_internal_bitmap1`): the smallest
/// power of two from 4 KiB whose bits fit in `room_sectors` (capped at 128 KiB when the
/// chunk is not given), and never below 64 MiB. `None` when there is no room.
pub fn default_bitmap_chunk(sync_size_sectors: u64, room_sectors: u64) -> Option<u32> {
    let min_chunk = min_bitmap_chunk(sync_size_sectors, room_sectors.min(128 * 2))?;
    Some(min_chunk.max(64 * 1024 * 1024))
}

/// The smallest bitmap chunk (bytes) whose bits fit in `room_sectors` after the header.
pub fn min_bitmap_chunk(sync_size_sectors: u64, room_sectors: u64) -> Option<u32> {
    if room_sectors <= 1 {
        return None;
    }
    let max_bits = (room_sectors * 512 - BITMAP_SUPER_BYTES as u64) * 8;
    let mut min_chunk: u64 = 4096;
    let mut bits = sync_size_sectors.saturating_mul(512) / min_chunk + 1;
    while bits > max_bits {
        min_chunk *= 2;
        bits = bits.div_ceil(2);
    }
    u32::try_from(min_chunk).ok()
}

/// Bit `index` of an on-disk bit array (little-endian bit order, as md writes version 4).
pub fn test_bit_le(bits: &[u8], index: u64) -> bool {
    let byte = (index / 8) as usize;
    byte < bits.len() && bits[byte] & (1 << (index % 8)) != 0
}

fn set_bit_le(bits: &mut [u8], index: u64, value: bool) {
    let byte = (index / 8) as usize;
    let mask = 1u8 << (index % 8);
    if value {
        bits[byte] |= mask;
    } else {
        bits[byte] &= !mask;
    }
}

/// Counts set bits among the first `nbits` of a little-endian bit array; bits missing
/// from a short buffer count as dirty, as mdadm's examine does.
pub fn count_dirty_bits(bits: &[u8], nbits: u64) -> u64 {
    let have = (bits.len() as u64 * 8).min(nbits);
    let set: u64 = (0..have).filter(|&i| test_bit_le(bits, i)).count() as u64;
    set + (nbits - have)
}

/// A parsed on-disk bitmap: header plus the bit array that follows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapImage {
    pub sb: BitmapSuper,
    /// `ceil(bits / 8)` bytes of bits (bit `i` covers bitmap chunk `i`).
    pub bits: Vec<u8>,
}

impl BitmapImage {
    /// Parses a buffer read at the bitmap's location (header + bits). A buffer shorter than
    /// the bit array is an error: md would refuse it too ("bitmap file too short").
    pub fn parse(buf: &[u8]) -> Result<Self, BitmapError> {
        let sb = BitmapSuper::parse(buf)?;
        let nbits = sb.bits();
        let nbytes = nbits.div_ceil(8);
        let needed = (BITMAP_SUPER_BYTES as u64).saturating_add(nbytes);
        if (buf.len() as u64) < needed {
            return Err(BitmapError::Truncated {
                len: buf.len(),
                needed: usize::try_from(needed).unwrap_or(usize::MAX),
            });
        }
        let mut bits = buf[BITMAP_SUPER_BYTES..needed as usize].to_vec();
        // Bits past the last chunk are padding (mdadm fills them with ones); drop them so
        // they never read as dirty regions.
        if nbits % 8 != 0 {
            if let Some(last) = bits.last_mut() {
                *last &= (1u8 << (nbits % 8)) - 1;
            }
        }
        Ok(BitmapImage { sb, bits })
    }

    pub fn is_dirty(&self, chunk: u64) -> bool {
        test_bit_le(&self.bits, chunk)
    }

    pub fn dirty_count(&self) -> u64 {
        count_dirty_bits(&self.bits, self.sb.bits())
    }

    /// Dirty regions in sync-space sectors, merged, clipped to `sync_size`.
    pub fn dirty_regions(&self) -> Vec<(u64, u64)> {
        dirty_regions_of(&self.bits, self.sb.bits(), self.sb.chunksize, self.sb.sync_size)
    }
}

fn dirty_regions_of(bits: &[u8], nbits: u64, chunksize: u32, sync_size: u64) -> Vec<(u64, u64)> {
    let chunk_sectors = u64::from(chunksize / 512).max(1);
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut i = 0;
    while i < nbits {
        // Skip clean bytes quickly: bitmaps are mostly clean.
        if i % 8 == 0 && bits.get((i / 8) as usize).is_some_and(|&b| b == 0) {
            i += 8;
            continue;
        }
        if test_bit_le(bits, i) {
            let start = i * chunk_sectors;
            let end = ((i + 1) * chunk_sectors).min(sync_size);
            match out.last_mut() {
                Some((s, l)) if *s + *l == start => *l = end - *s,
                _ => out.push((start, end.saturating_sub(start))),
            }
        }
        i += 1;
    }
    out
}

/// Maps a range of array sectors to the bitmap's sync space (what `sync_size` counts):
/// member sectors for raid1/4/5/6, array sectors for raid10. For raid4/5/6 the result
/// covers whole stripe rows, a superset of what md marks, which is always safe.
pub fn array_range_to_sync_range(
    level: i32,
    raid_disks: u32,
    chunk_sectors: u32,
    start_sector: u64,
    len_sectors: u64,
) -> (u64, u64) {
    let end = start_sector.saturating_add(len_sectors);
    let data_disks = match level {
        4 | 5 => raid_disks.saturating_sub(1),
        6 => raid_disks.saturating_sub(2),
        _ => return (start_sector, len_sectors),
    };
    let chunk = u64::from(chunk_sectors.max(1));
    let row = chunk * u64::from(data_disks.max(1));
    let first = start_sector / row * chunk;
    let last = end.div_ceil(row) * chunk;
    (first, last - first)
}

/// One write of the bit array to persist: bytes `[offset_bytes, offset_bytes + len_bytes)`
/// of the bitmap area (header included), i.e. at member byte
/// `bitmap_sector * 512 + offset_bytes` on every member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitmapPageWrite {
    pub page: u64,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

/// What `start_write` asks of the caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteGate {
    /// Pages that must be written (and flushed) on every member before the data write may
    /// be issued. Empty: the write may proceed at once.
    pub pages_to_write: Vec<BitmapPageWrite>,
}

/// In-memory write-intent bookkeeping, like md-bitmap's counters: a bit is set and
/// persisted before a write to its chunk is issued, and cleared lazily, two daemon passes
/// after the last write to the chunk finished, so a chunk written steadily is not flipped
/// on disk for every write. An unclean shutdown then leaves set only the bits of chunks
/// that may differ between members.
#[derive(Clone, Debug)]
pub struct WriteIntentBitmap {
    sb: BitmapSuper,
    chunk_shift: u32,
    nbits: u64,
    /// The bit array as it is (or will be, once pending pages are written) on disk.
    bits: Vec<u8>,
    /// Writes in flight per chunk.
    pending: Vec<u32>,
    /// Chunks that must stay set until a resync clears them (a write failed or ran
    /// degraded, a member left while the bit was set, or the bit was found set at load).
    needed: Vec<bool>,
    /// Daemon passes seen idle, per set chunk; cleared on the second.
    idle_passes: Vec<u8>,
    /// Pages with new set bits not yet persisted.
    dirty_pages: BTreeSet<u64>,
    /// Set bits (kept so an idle array need not scan the bitmap).
    set_count: u64,
    /// Set bits the last daemon pass found idle (so a later pass may clear them).
    idle_seen: u64,
}

impl WriteIntentBitmap {
    /// A bitmap with every bit clear (e.g. after `--assume-clean`).
    pub fn new(sb: BitmapSuper) -> Self {
        let nbits = sb.bits();
        let bits = vec![0u8; nbits.div_ceil(8) as usize];
        Self::with_bits(sb, bits, false)
    }

    /// Loads the on-disk state as `md_bitmap_init_from_disk` does: a set bit is needed
    /// (must be resynced) when its chunk ends at or after `resync_start_sector`; md passes
    /// the array's resync_offset when it is not degraded (or events_cleared equals the
    /// array events), else 0. Set bits that are not needed are cleared lazily. With
    /// `stale` (bitmap events behind the array's) every chunk is needed: md's full resync.
    pub fn from_image(image: BitmapImage, stale: bool, resync_start_sector: u64) -> Self {
        let BitmapImage { sb, bits } = image;
        let mut bm = Self::with_bits(sb, bits, stale);
        if !stale {
            let cs = bm.chunk_sectors();
            for c in 0..bm.nbits {
                let chunk_end = (c + 1).saturating_mul(cs);
                bm.needed[c as usize] = bm.is_set(c) && chunk_end >= resync_start_sector;
            }
        }
        bm
    }

    fn with_bits(sb: BitmapSuper, mut bits: Vec<u8>, all_needed: bool) -> Self {
        let nbits = sb.bits();
        let n = nbits as usize;
        bits.resize(nbits.div_ceil(8) as usize, 0);
        let chunk_sectors = u64::from(sb.chunksize / 512).max(1);
        if all_needed {
            for i in 0..nbits {
                set_bit_le(&mut bits, i, true);
            }
        }
        WriteIntentBitmap {
            chunk_shift: chunk_sectors.trailing_zeros(),
            nbits,
            bits,
            pending: vec![0; n],
            needed: vec![all_needed; n],
            idle_passes: vec![0; n],
            sb,
            dirty_pages: BTreeSet::new(),
            set_count: 0,
            // Unknown until the first pass: it may find bits to clear.
            idle_seen: u64::MAX,
        }
        .with_set_count()
    }

    fn with_set_count(mut self) -> Self {
        self.set_count = count_dirty_bits(&self.bits, self.nbits);
        self
    }

    pub fn superblock(&self) -> &BitmapSuper {
        &self.sb
    }

    pub fn superblock_mut(&mut self) -> &mut BitmapSuper {
        &mut self.sb
    }

    pub fn chunks(&self) -> u64 {
        self.nbits
    }

    pub fn chunk_sectors(&self) -> u64 {
        1 << self.chunk_shift
    }

    /// Bitmap chunk of a sync-space sector.
    pub fn chunk_of(&self, sector: u64) -> u64 {
        sector >> self.chunk_shift
    }

    /// Chunks touched by `[start, start + len)` in sync space, clipped to the bitmap.
    pub fn chunks_of(&self, start_sector: u64, len_sectors: u64) -> std::ops::Range<u64> {
        if len_sectors == 0 {
            return 0..0;
        }
        let first = self.chunk_of(start_sector).min(self.nbits);
        let last =
            self.chunk_of(start_sector.saturating_add(len_sectors - 1)).saturating_add(1).min(self.nbits);
        first..last
    }

    /// The 4 KiB page of the bitmap area holding chunk's bit (the header shares page 0).
    pub fn page_of_chunk(chunk: u64) -> u64 {
        (chunk + BITMAP_SUPER_BYTES as u64 * 8) / (BITMAP_PAGE_BYTES as u64 * 8)
    }

    pub fn is_set(&self, chunk: u64) -> bool {
        test_bit_le(&self.bits, chunk)
    }

    /// Bytes of the bitmap area (header + bits) as they should be on disk.
    pub fn area_bytes(&self) -> Vec<u8> {
        let mut v = self.sb.serialize().to_vec();
        v.extend_from_slice(&self.bits);
        v
    }

    /// The extent of `page` to write: whole 4 KiB pages except the last, which stops at
    /// the end of the bits rounded up to a sector.
    pub fn page_write(&self, page: u64) -> BitmapPageWrite {
        let total = (BITMAP_SUPER_BYTES as u64 + self.bits.len() as u64).div_ceil(512) * 512;
        let offset = page * BITMAP_PAGE_BYTES as u64;
        BitmapPageWrite {
            page,
            offset_bytes: offset,
            len_bytes: total.saturating_sub(offset).min(BITMAP_PAGE_BYTES as u64),
        }
    }

    /// Bytes to write for `w`, taken from [`WriteIntentBitmap::area_bytes`], zero-padded.
    pub fn page_bytes(&self, w: &BitmapPageWrite) -> Vec<u8> {
        let area = self.area_bytes();
        let mut out = vec![0u8; w.len_bytes as usize];
        let start = (w.offset_bytes as usize).min(area.len());
        let end = (start + out.len()).min(area.len());
        out[..end - start].copy_from_slice(&area[start..end]);
        out
    }

    /// Before a write of sync-space `[start, start+len)`: counts it in flight, sets the
    /// bits not yet set, and returns the pages to persist before the write is issued.
    pub fn start_write(&mut self, start_sector: u64, len_sectors: u64) -> WriteGate {
        let mut pages = BTreeSet::new();
        for c in self.chunks_of(start_sector, len_sectors) {
            let i = c as usize;
            self.pending[i] = self.pending[i].saturating_add(1);
            self.idle_passes[i] = 0;
            if !self.is_set(c) {
                set_bit_le(&mut self.bits, c, true);
                self.set_count += 1;
                pages.insert(Self::page_of_chunk(c));
            }
        }
        // A page already queued (set by an earlier write still waiting) must be waited on
        // too: this write's bit lives there.
        for c in self.chunks_of(start_sector, len_sectors) {
            let p = Self::page_of_chunk(c);
            if self.dirty_pages.contains(&p) {
                pages.insert(p);
            }
        }
        self.dirty_pages.extend(pages.iter().copied());
        WriteGate { pages_to_write: pages.into_iter().map(|p| self.page_write(p)).collect() }
    }

    /// The caller persisted these pages (on every member): writes gated on them may go.
    pub fn pages_written(&mut self, pages: &[BitmapPageWrite]) {
        for p in pages {
            self.dirty_pages.remove(&p.page);
        }
    }

    /// Whether any bit is set (the daemon has work only then).
    pub fn any_set(&self) -> bool {
        self.set_count > 0
    }

    /// Whether the daemon's last pass found set bits idle: another pass may clear them.
    /// (A bit kept for a resync, or whose writes run, is not; a write's end may make it so.)
    pub fn may_clear(&self) -> bool {
        self.set_count > 0 && self.idle_seen > 0
    }

    /// Whether any set bit awaits persistence on this page.
    pub fn page_pending(&self, page: u64) -> bool {
        self.dirty_pages.contains(&page)
    }

    /// After the data write finished. `reached_all_members` false (an error, or the array
    /// is degraded) keeps the bits set until a resync, like md's `success == 0`; md then
    /// also stops advancing events_cleared, so a returning member can be caught up from
    /// the bitmap.
    pub fn end_write(&mut self, start_sector: u64, len_sectors: u64, reached_all_members: bool) {
        for c in self.chunks_of(start_sector, len_sectors) {
            let i = c as usize;
            self.pending[i] = self.pending[i].saturating_sub(1);
            if !reached_all_members {
                self.needed[i] = true;
            }
        }
    }

    /// A slot's member left: every set bit is needed until a resync or recovery. Its
    /// writes under those bits may have reached only its volatile cache (the daemon's flush
    /// did not reach it), so a re-add from the bitmap must still find them set.
    pub fn member_lost(&mut self) {
        for c in 0..self.nbits {
            if self.is_set(c) {
                self.needed[c as usize] = true;
            }
        }
    }

    /// One pass of md's bitmap daemon (every `daemon_sleep` seconds): counts idle passes
    /// and returns the chunks idle for two passes and not needed. Nothing is cleared yet:
    /// the caller flushes every member first, so the writes those bits covered are durable,
    /// then calls [`WriteIntentBitmap::clear_flushed`] (md writes cleared bits with a
    /// preflush).
    pub fn daemon_pass(&mut self) -> Vec<u64> {
        let mut candidates = Vec::new();
        self.idle_seen = 0;
        if self.set_count == 0 {
            return candidates;
        }
        for c in 0..self.nbits {
            let i = c as usize;
            if !self.is_set(c) || self.pending[i] > 0 || self.needed[i] {
                continue;
            }
            if self.dirty_pages.contains(&Self::page_of_chunk(c)) {
                continue;
            }
            self.idle_passes[i] = self.idle_passes[i].saturating_add(1);
            self.idle_seen += 1;
            if self.idle_passes[i] >= 2 {
                candidates.push(c);
            }
        }
        candidates
    }

    /// After a flush issued after [`WriteIntentBitmap::daemon_pass`] returned `candidates`:
    /// clears those still idle (a write since then reset their idle count, and its data
    /// may postdate the flush) and returns the pages to write. `events` is recorded as
    /// events_cleared when something was cleared (None while the array is degraded: md
    /// keeps events_cleared then, so a member that left can still be re-added from it).
    pub fn clear_flushed(&mut self, candidates: &[u64], events: Option<u64>) -> Vec<BitmapPageWrite> {
        let mut pages = BTreeSet::new();
        for &c in candidates {
            let i = c as usize;
            if c >= self.nbits
                || !self.is_set(c)
                || self.pending[i] > 0
                || self.needed[i]
                || self.idle_passes[i] < 2
            {
                continue;
            }
            set_bit_le(&mut self.bits, c, false);
            self.set_count -= 1;
            self.idle_passes[i] = 0;
            pages.insert(Self::page_of_chunk(c));
        }
        if let (false, Some(events)) = (pages.is_empty(), events) {
            self.sb.events_cleared = events;
            // events_cleared lives in the header on page 0.
            pages.insert(0);
        }
        pages.into_iter().map(|p| self.page_write(p)).collect()
    }

    /// Chunks a bitmap-driven resync must cover (needed ones), as merged sync-space
    /// regions.
    pub fn dirty_regions(&self) -> Vec<(u64, u64)> {
        let mut bits = vec![0u8; self.bits.len()];
        for (i, &n) in self.needed.iter().enumerate() {
            if n {
                set_bit_le(&mut bits, i as u64, true);
            }
        }
        dirty_regions_of(&bits, self.nbits, self.sb.chunksize, self.sb.sync_size)
    }

    /// Chunks whose bit is set, needed or not, as merged sync-space (start, len) regions:
    /// what a member that left since `events_cleared` may have missed (md's re-add).
    pub fn set_regions(&self) -> Vec<(u64, u64)> {
        dirty_regions_of(&self.bits, self.nbits, self.sb.chunksize, self.sb.sync_size)
    }

    /// md_bitmap_resize with the chunk kept: the bitmap covers `sync_size_sectors` now, and
    /// every chunk holding sectors from `from_sectors` on is set and needed, so the grown
    /// space is resynced even after a crash. Returns the pages to persist.
    pub fn grow(&mut self, from_sectors: u64, sync_size_sectors: u64) -> Vec<BitmapPageWrite> {
        self.sb.sync_size = sync_size_sectors;
        self.nbits = self.sb.bits();
        let n = self.nbits as usize;
        self.bits.resize(self.nbits.div_ceil(8) as usize, 0);
        self.pending.resize(n, 0);
        self.needed.resize(n, false);
        self.idle_passes.resize(n, 0);
        let mut pages = BTreeSet::new();
        for c in self.chunks_of(from_sectors, sync_size_sectors.saturating_sub(from_sectors)) {
            if !self.is_set(c) {
                set_bit_le(&mut self.bits, c, true);
                self.set_count += 1;
            }
            self.needed[c as usize] = true;
            pages.insert(Self::page_of_chunk(c));
        }
        self.idle_seen = u64::MAX;
        pages.into_iter().map(|p| self.page_write(p)).collect()
    }

    /// Whether a region needs resync (md's `md_bitmap_start_sync`).
    pub fn needs_sync(&self, start_sector: u64, len_sectors: u64) -> bool {
        self.chunks_of(start_sector, len_sectors).any(|c| self.needed[c as usize])
    }

    /// A resync/recovery brought `[start, start+len)` in sync on every member: the chunks
    /// fully inside it are no longer needed and clear lazily.
    pub fn sync_done(&mut self, start_sector: u64, len_sectors: u64) {
        let cs = self.chunk_sectors();
        let end = start_sector.saturating_add(len_sectors);
        for c in self.chunks_of(start_sector, len_sectors) {
            let chunk_start = c * cs;
            let chunk_end = (chunk_start + cs).min(self.sb.sync_size);
            if chunk_start >= start_sector && chunk_end <= end {
                self.needed[c as usize] = false;
            }
        }
    }
}
