//! raid4/5/6: the stripe cache, the stripe queue (write batching), the RMW/RCW planner,
//! degraded reconstruction and read-error correction.
//!
//! A stripe head covers `head_sectors` rows (at most one chunk, at most 64 KiB) across every
//! member. Per member (`R5Dev`, md's `r5dev`) it keeps a cache block mirroring what the
//! member holds once in-flight writes land (`valid` rows) and the rows being read, failed or
//! rewritten; beside them the new data not yet being written (`towrite`) and the batch being
//! written. Blocks hold bytes where they already are (see [`Block`]): a 4 KiB
//! read-modify-write adopts its three reads and carries the request's own bytes, so it
//! copies nothing. Each event marks heads dirty; `run_stripes` re-analyses them, as md's
//! `handle_stripe`: serve readers, advance the write batch, start a new one when the stripe
//! queue policy says so.

use std::collections::VecDeque;

use crate::detmap::DetMap;

use std::sync::Arc;

use crate::api::*;
use crate::block::Block;
use crate::geometry::{Geometry, StripeMap};
use crate::ledger::IoCtx;
use crate::meta::ppl::PplEntry;
use crate::sectors::{rows, runs, SectorMask};

mod analyse;
mod cache;
mod completion;
mod head_sync;
mod ppl;
mod queue;
mod row_sync;
mod scrub;
mod write;

/// md's IO_THRESHOLD: delayed partial stripes start only while fewer stripes than this are
/// pre-reading.
const IO_THRESHOLD: usize = 1;
/// Stripe maps the cache keeps at most (every residue up to 32 members).
const MAP_CACHE_SLOTS: u64 = 1024;
/// Largest stripe head height in sectors (64 KiB).
const MAX_HEAD_SECTORS: u64 = 128;

/// One member's rows of a stripe head, shared with the member writes that carry it (see
/// [`Block`]): a pool buffer of the full height, a member read adopted as it came, or a
/// window onto a request's payload (md's skip_copy; dropped from the cache once written).
type Buf = Block;

/// A stripe map and each member's logical data index under it, shared by every head of
/// the same residue.
type SharedMap = (Arc<StripeMap>, Arc<Vec<Option<usize>>>);

/// Background work on one stripe head.
struct SyncOp {
    /// Member sector where the unit starts (the job's key for it).
    unit: u64,
    kind: crate::sync::SyncKind,
    writing: Option<u32>,
    /// The head was made for this unit (not cached for requests before): it is evicted as
    /// soon as the unit is done, so a rebuild streaming through the array neither pushes
    /// requests' heads out of the cache nor grows memory to the whole cache's worth.
    own_head: bool,
    /// Claimed by a row unit (`row_sync`): no batch starts here until the unit is done.
    row: bool,
    /// Row units: this head has no batch left (counted once in the unit).
    ready: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Every data row overwritten: parity from the new data alone, no reads.
    Full,
    ReadModifyWrite,
    ReconstructWrite,
}

struct ReadWaiter {
    req: RequestId,
    member: usize,
    rows: SectorMask,
    dest_off: usize,
}

struct Batch {
    data: Vec<Option<Buf>>,
    mask: Vec<SectorMask>,
    reqs: Vec<RequestId>,
    mode: WriteMode,
    span: SectorMask,
    /// None while pre-reading; Some(writes outstanding) once writing.
    writing: Option<u32>,
    counted_preread: bool,
    /// The slot whose partial parity log holds this batch (see `ppl`).
    log_slot: Option<usize>,
    /// Computed, waiting for its log write before its member writes go out.
    log_wait: bool,
}

/// One member's rows of a stripe head (md's `struct r5dev`): its cached block and the
/// state of each row.
#[derive(Default)]
struct R5Dev {
    /// What the member holds once in-flight writes land, for the `valid` rows.
    block: Option<Buf>,
    valid: SectorMask,
    /// Rows a member read is fetching.
    reading: SectorMask,
    /// Rows that failed to read and await read-error correction.
    bad: SectorMask,
    /// Rows being rewritten by read-error correction: no batch may write them meanwhile,
    /// or the older data could land last.
    rewriting: SectorMask,
}

pub(crate) struct Stripe {
    /// Member sector (data-relative) of row 0.
    base_sector: u64,
    /// Shared by every head whose stripe number has the same residue (see `StripeCache::maps`).
    map: Arc<StripeMap>,
    /// Role of each member: Some(logical data index) or None for P/Q.
    dd_of: Arc<Vec<Option<usize>>>,
    /// Each member's rows of the head, by member.
    dev: Vec<R5Dev>,
    /// The writes gathering for the next batch, by member (they move into it whole).
    towrite: Vec<Option<Buf>>,
    towrite_mask: Vec<SectorMask>,
    towrite_reqs: Vec<RequestId>,
    batch: Option<Batch>,
    sync: Option<SyncOp>,
    readers: Vec<ReadWaiter>,
    inflight: u32,
    delayed_until: Option<TimeNs>,
    force: bool,
    queued: bool,
    lru_stamp: u64,
}

enum Piece {
    Read { req: RequestId, key: u64, dd: usize, rows: SectorMask, dest_off: usize },
    Write { req: RequestId, key: u64, dd: usize, rows: SectorMask, src_off: usize, zero: bool },
}

impl Piece {
    fn key(&self) -> u64 {
        match self {
            Piece::Read { key, .. } | Piece::Write { key, .. } => *key,
        }
    }
}

pub(crate) struct StripeCache {
    /// Boxed so the handler's take-out/put-back moves a pointer, not the head.
    heads: DetMap<u64, Box<Stripe>>,
    /// Evicted heads kept for reuse (their vectors keep their allocations); boxed like
    /// `heads`, so reuse moves a pointer.
    #[allow(clippy::vec_box)]
    free_heads: Vec<Box<Stripe>>,
    /// Stripe maps by `stripe % map_period`: every raid4/5/6 layout's map depends only on
    /// the stripe number modulo raid_disks or raid_disks - 1, so `raid_disks * (raid_disks - 1)`
    /// covers them all. Filled on first use, and direct-mapped into at most
    /// `MAP_CACHE_SLOTS` slots (each tagged with its residue): a map is as long as the
    /// member count and there are its square of residues, so keeping every one would
    /// grow as the cube of the member count (about 500 MiB at 256 members).
    maps: Vec<Option<(u64, SharedMap)>>,
    map_period: u64,
    head_sectors: u64,
    heads_per_chunk: u64,
    full_mask: SectorMask,
    /// (stamp, key) of heads as they went idle, oldest first, for eviction. An entry is
    /// stale once its head has been used again (the head's `lru_stamp` no longer matches):
    /// stale entries are skipped, and compacted away when they outnumber the heads.
    lru: VecDeque<(u64, u64)>,
    lru_clock: u64,
    dirty: VecDeque<u64>,
    /// Pieces waiting for a stripe head (FIFO keeps writes in order).
    waiting: VecDeque<Piece>,
    delayed: Vec<u64>,
    preread_active: usize,
    bypass_count: u32,
    pool: Vec<IoBytes>,
    /// Buffers shorter than a head, by their rows (index = rows): a partial fill reads into
    /// one instead of the executor allocating, so a small read-modify-write allocates
    /// nothing for its reads. Bounded by `fill_pool_bytes` (see `recycle_buf`).
    fill_pool: Vec<Vec<IoBytes>>,
    fill_pool_bytes: usize,
    /// Scratch for `advance_batch` (kept to avoid allocating per call).
    scratch_mask: Vec<SectorMask>,
    scratch_needs: Vec<(usize, SectorMask)>,
    /// Emptied (data, mask, reqs) vectors of finished batches.
    #[allow(clippy::type_complexity)]
    spare_batches: Vec<(Vec<Option<Buf>>, Vec<SectorMask>, Vec<RequestId>)>,
    /// A head's height of zeroes: the absent blocks of short syndromes, and the source of
    /// zeroing write pieces (shared, never written).
    zero: IoBytes,
    running: bool,
    /// Row units of the running sync, by unit start (member sector).
    rows: DetMap<u64, RowUnit>,
    /// Job units handed to per-head syncs, by unit start.
    heads_left: DetMap<u64, HeadsLeft>,
    /// Check/repair units of the running scrub, by unit start (member sector).
    scrubs: DetMap<u64, ScrubUnit>,
    /// Row units' read buffers for reuse; a zeroed row for syndrome gaps (DDF layouts).
    row_pool: Vec<Vec<u8>>,
    row_zero: Vec<u8>,
}

impl StripeCache {
    /// Heads in the cache, and those of them with work on them.
    pub(crate) fn occupancy(&self) -> (usize, usize) {
        (self.heads.len(), self.heads.values().filter(|h| !h.idle()).count())
    }

    pub(crate) fn new(geo: &Geometry) -> Self {
        let head_sectors = if geo.level.has_parity() { geo.chunk_sectors.min(MAX_HEAD_SECTORS) } else { 8 };
        let n = geo.raid_disks as u64;
        let map_period = if geo.level.has_parity() { n * (n - 1).max(1) } else { 1 };
        StripeCache {
            heads: DetMap::default(),
            free_heads: Vec::new(),
            maps: vec![None; map_period.min(MAP_CACHE_SLOTS) as usize],
            map_period,
            head_sectors,
            heads_per_chunk: if geo.level.has_parity() { geo.chunk_sectors / head_sectors } else { 1 },
            full_mask: rows(0, head_sectors),
            lru: Default::default(),
            lru_clock: 0,
            dirty: VecDeque::new(),
            waiting: VecDeque::new(),
            delayed: Vec::new(),
            preread_active: 0,
            bypass_count: 0,
            pool: Vec::new(),
            fill_pool: Vec::new(),
            fill_pool_bytes: 0,
            scratch_mask: Vec::new(),
            scratch_needs: Vec::new(),
            spare_batches: Vec::new(),
            zero: IoBytes::from(vec![0u8; (head_sectors * SECTOR_BYTES) as usize]),
            running: false,
            rows: DetMap::default(),
            heads_left: DetMap::default(),
            scrubs: DetMap::default(),
            row_pool: Vec::new(),
            row_zero: Vec::new(),
        }
    }

    /// A buffer of the full head height (contents unspecified).
    fn buf(&mut self) -> IoBytes {
        self.pool.pop().unwrap_or_else(|| IoBytes::from(vec![0u8; self.zero.len()]))
    }

    /// A buffer of `n_rows` rows for a member read to fill, when one is pooled; else
    /// empty, and the executor allocates.
    fn fill_buf(&mut self, n_rows: u64) -> IoBytes {
        match self.fill_pool.get_mut(n_rows as usize).and_then(Vec::pop) {
            Some(b) => {
                self.fill_pool_bytes -= b.len();
                b
            }
            None => IoBytes::new(),
        }
    }

    fn mark(&mut self, key: u64) {
        if let Some(st) = self.heads.get_mut(&key) {
            queue_head(&mut self.dirty, key, st);
        }
    }
}

/// Put head `key` on the dirty queue unless it is there already.
fn queue_head(dirty: &mut VecDeque<u64>, key: u64, st: &mut Stripe) {
    if !st.queued {
        st.queued = true;
        dirty.push_back(key);
    }
}

fn bytes(r0: u64, n: u64) -> std::ops::Range<usize> {
    (r0 * SECTOR_BYTES) as usize..((r0 + n) * SECTOR_BYTES) as usize
}

fn copy_rows(dst: &mut Block, src: &Block, mask: SectorMask) {
    for (r0, n) in runs(mask) {
        dst.rows_mut(bytes(r0, n)).copy_from_slice(src.rows(bytes(r0, n)));
    }
}

impl Stripe {
    fn idle(&self) -> bool {
        self.inflight == 0
            && self.batch.is_none()
            && self.sync.is_none()
            && self.readers.is_empty()
            && self.towrite_reqs.is_empty()
            && self.towrite_mask.iter().all(|&m| m == 0)
            && self.dev.iter().all(|d| d.bad == 0)
    }
}

enum Ensure {
    Ready,
    Pending,
    Lost,
}

// ---- the state of row recovery units (`row_sync`), scrub units (`scrub`), the log (`ppl`)

/// A recovery unit over consecutive heads of one chunk row.
pub(crate) struct RowUnit {
    /// The members being rebuilt (raid6: up to two, from one read of the others).
    targets: Vec<usize>,
    /// Keys of the claimed heads, in order.
    heads: Vec<u64>,
    /// Heads that have no write batch left and have stopped taking new ones.
    heads_ready: usize,
    /// The survivors' reads were issued (the unit no longer waits for its heads).
    started: bool,
    /// Member I/Os in flight (reads, then the write).
    pending: u32,
    /// Each survivor's range, once read.
    bufs: Vec<Option<Vec<u8>>>,
    /// A survivor read failed: the per-head path redoes the unit.
    read_failed: bool,
    /// The rebuilt ranges being written, kept to reuse their buffers once written.
    written: Vec<Arc<Vec<u8>>>,
}

/// Per-head syncs standing in for one job unit (a row unit's fallback): the unit is done
/// when the last of them is.
pub(crate) struct HeadsLeft {
    left: u32,
    ok: bool,
}

/// A raid4/5/6 scrub unit over consecutive heads (see `scrub`).
pub(crate) struct ScrubUnit {
    /// Keys of the claimed heads, in order.
    heads: Vec<u64>,
    heads_ready: usize,
    /// The members' reads were issued.
    started: bool,
    /// Member I/Os in flight (reads, then repair writes).
    pending: u32,
    bufs: Vec<Option<Vec<u8>>>,
    failed: bool,
    /// Members repair wrote: the claimed heads' cached rows of them are dropped.
    written: Vec<bool>,
}

/// Every member's log (md's `ppl_conf`).
pub(crate) struct Ppl {
    signature: u32,
    /// md's `seq`: the generation of the last io_unit made, over all logs.
    seq: u64,
    /// Per slot; None where the member has no area.
    logs: Vec<Option<PplLog>>,
}

/// One member's log (md's `ppl_log`).
struct PplLog {
    /// Absolute first sector of the area on the slot's device, and its size as md uses it.
    area_sector: u64,
    area_sectors: u64,
    entry_space_bytes: u64,
    multiple: bool,
    next_io_sector: u64,
    /// A device newly in the slot: its area may hold an old log, which a replay must never
    /// take for this one, so the next log write covers the whole area (md's
    /// `ppl_write_empty_header` when a member is added).
    reset_pending: bool,
    /// False from a device joining the slot by a recovery until the array has emptied its
    /// area (`Engine::ppl_area_emptied`): nothing is logged there before, so a log write
    /// cannot race the array's and be wiped by it.
    area_ready: bool,
    /// io_units, oldest first: only the first is ever being written; the last gathers.
    units: VecDeque<IoUnit>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UnitState {
    /// Gathering batches (or waiting its turn).
    Open,
    /// The log write, then its flush (md writes it FUA).
    Logging,
    /// The batches' member writes were released.
    Logged,
    /// Every batch landed; flushes of the members they wrote outstanding.
    Flushing(u32),
}

/// md's `ppl_io_unit`: one log write.
struct IoUnit {
    generation: u64,
    /// `checksum` holds the running CRC register until the unit is written.
    entries: Vec<PplEntry>,
    pp: Vec<u8>,
    heads: Vec<u64>,
    /// Heads whose member writes have not landed yet.
    pending_heads: u32,
    /// Members the heads write (md's `disk_flush_bitmap`).
    written: u128,
    state: UnitState,
    /// The last row group logged: (member sector, first and last data index, full), for
    /// md's rule that the next row of the same data members joins the last entry.
    last: Option<(u64, usize, usize, bool)>,
}

/// One 4 KiB row group of a batch, as it is logged.
struct Group {
    /// Data-relative member sector of the group's first row.
    member_sector: u64,
    /// Logical data indices the entry covers (written ones and any between them).
    lo: usize,
    hi: usize,
    /// Every data member covered: no partial parity (md's STRIPE_FULL_WRITE).
    full: bool,
}

/// What a batch logs: its groups, their partial parity (4 KiB per group that is not
/// full, in order) and the members it writes.
pub(super) struct PplBatch {
    groups: Vec<Group>,
    pp: Vec<u8>,
    written: u128,
}
