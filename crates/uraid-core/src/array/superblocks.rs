//! [`ArraySuperblocks`]: the superblock and bitmap state of a running array. A transition
//! (a member failed, a recovery checkpoint, dirty or clean) changes the state only; the
//! caller then asks for the [`MetaRound`] that writes it ([`ArraySuperblocks::write_superblocks`]),
//! built when it is performed, so a round always carries everything changed before it.
//! [`ArraySuperblocks::round_done`] takes the members that failed a round, records them
//! faulty (md_error) and returns the next round (events + 1) until one succeeds on every
//! working member.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::meta::{
    array_range_to_sync_range, feature, has_ppl, ppl_area, ppl_signature, role, BadBlocks, BitmapPageWrite,
    PplHeader, Superblock, WriteIntentBitmap, MAX_DEV_LIMIT, MAX_SECTOR,
};

/// The caller's name for a member (an index into its own table of files or disks).
pub type MemberKey = u64;

/// What one member is to the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevRole {
    Active {
        slot: usize,
        recovering: bool,
    },
    Spare,
    /// Failed and not yet removed: its superblock is no longer written.
    Faulty {
        slot: usize,
    },
    /// Being rebuilt to replace the active member of `slot` (md's want_replacement): the
    /// same dev_roles entry as that member, MD_FEATURE_REPLACEMENT and recovery_offset in
    /// its own superblock. Not the slot's member until [`ArraySuperblocks::replacement_done`].
    Replacement {
        slot: usize,
    },
}

impl DevRole {
    /// Not faulty: its superblock and bitmap are kept up to date.
    pub fn working(self) -> bool {
        !matches!(self, DevRole::Faulty { .. })
    }

    /// The slot of an active member.
    pub fn active_slot(self) -> Option<usize> {
        match self {
            DevRole::Active { slot, .. } => Some(slot),
            _ => None,
        }
    }
}

/// One member as the array's metadata sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayMember {
    pub key: MemberKey,
    pub sb: Superblock,
    pub role: DevRole,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaWriteKind {
    BitmapPage {
        page: u64,
    },
    /// The member's bad-block log page (written before its superblock, which says
    /// whether to read it).
    BadBlockLog,
    Superblock,
    /// The member's partial parity log area (emptied at start, and when a device joins a
    /// slot).
    PplArea,
}

/// One member I/O of a metadata round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaIo {
    /// Write `bytes` at member byte `offset_bytes`, then flush the member (md writes its
    /// metadata with FUA/preflush: the next step may rely on it being durable).
    Write {
        key: MemberKey,
        /// The member's slot when active (for fault injection and messages).
        slot: Option<usize>,
        what: MetaWriteKind,
        offset_bytes: u64,
        bytes: Vec<u8>,
    },
    /// Flush the member: everything written to it so far, data included, is durable.
    Flush { key: MemberKey, slot: Option<usize> },
}

impl MetaIo {
    pub fn key(&self) -> MemberKey {
        match self {
            MetaIo::Write { key, .. } | MetaIo::Flush { key, .. } => *key,
        }
    }
}

/// What the state machine does when a round completes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum RoundKind {
    /// Every working member's superblock (after bitmap page 0, which carries events).
    Superblocks,
    /// Bitmap pages with newly set bits (before a write) or cleared bits.
    BitmapPages { pages: Vec<BitmapPageWrite> },
    /// The daemon's flush of every member before the nominated bits may be cleared.
    DaemonFlush { candidates: Vec<u64> },
}

/// Member I/Os to perform in order, then hand back to [`ArraySuperblocks::round_done`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRound {
    pub ios: Vec<MetaIo>,
    /// The events count the round's superblocks carry.
    pub events: u64,
    kind: RoundKind,
}

impl MetaRound {
    /// Performs the round with `io` (true: done and flushed) in order. Once an I/O failed
    /// on a member, its later I/Os of the round are skipped (its superblock is not written
    /// over a bitmap that failed). Returns the members that failed.
    pub fn execute(&self, mut io: impl FnMut(&MetaIo) -> bool) -> Vec<MemberKey> {
        let mut failed = Vec::new();
        for op in &self.ios {
            if failed.contains(&op.key()) {
                continue;
            }
            if !io(op) {
                failed.push(op.key());
            }
        }
        failed
    }

    /// Whether the round writes the superblocks (and so advances events).
    pub fn writes_superblocks(&self) -> bool {
        matches!(self.kind, RoundKind::Superblocks)
    }

    /// Whether the round only writes bitmap pages: independent of each other, so one flush
    /// per member after the last of them makes them all durable (md writes the pages of an
    /// unplug side by side and waits once).
    pub fn writes_bitmap_pages_only(&self) -> bool {
        matches!(self.kind, RoundKind::BitmapPages { .. })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaError {
    /// Every member failed its metadata write: nothing records the array any more.
    NoWorkingMember,
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaError::NoWorkingMember => write!(f, "the superblock write failed on every member"),
        }
    }
}

impl std::error::Error for MetaError {}

/// What [`ArraySuperblocks::round_done`] decided.
#[derive(Debug)]
pub struct RoundOutcome {
    /// Active slots that failed in this round: the caller fails them in the engine.
    pub newly_failed_slots: Vec<usize>,
    /// Slots whose newly joined device had its partial parity log area emptied by this
    /// round: the caller lets the engine log there (`Engine::ppl_area_emptied`).
    pub ppl_emptied_slots: Vec<usize>,
    /// The next round to perform, none when done, or the array lost every member.
    pub next: Result<Option<MetaRound>, MetaError>,
}

/// A write's bitmap range (sync space) and the pages to persist before it is issued
/// (see [`ArraySuperblocks::bitmap_pages_round`]).
#[derive(Debug)]
pub struct WriteIntent {
    /// Hand back to [`ArraySuperblocks::end_write`].
    pub sync_range: Option<SyncRanges>,
    pub pages: Vec<BitmapPageWrite>,
}

/// The sync-space ranges `(start, len)` a write counts in the bitmap: one, or during a
/// reshape one per layout. md counts the layout the write lands in; the position may pass
/// a write between its count and its issue, so both are counted (a bit set too many costs
/// a resync of its chunk, one too few a stripe left inconsistent after a crash).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncRanges {
    first: (u64, u64),
    second: Option<(u64, u64)>,
}

impl SyncRanges {
    fn iter(&self) -> impl Iterator<Item = (u64, u64)> {
        std::iter::once(self.first).chain(self.second)
    }
}

/// What the bitmap's sync space is counted by: md's level, raid_disks and chunk.
type SyncShape = (i32, u32, u32);

/// The superblocks and write-intent bitmap of a running array.
#[derive(Clone, Debug)]
pub struct ArraySuperblocks {
    /// The freshest superblock first: new members copy its fields.
    members: Vec<ArrayMember>,
    events: u64,
    /// Active (md's `in_sync == 0`): written as resync_offset != MAX_SECTOR. The state the
    /// next superblock round writes, set by [`ArraySuperblocks::mark_dirty`] and
    /// [`ArraySuperblocks::mark_clean`] (the caller holds writes until it is durable).
    dirty: bool,
    /// A resync is due or running: the array may not be marked clean.
    resync_pending: bool,
    /// Where a stopped resync left everything below it in sync and flushed: written as
    /// resync_offset instead of 0 so the next start resumes there.
    resync_checkpoint_sectors: Option<u64>,
    /// More members lost than the level survives.
    failed: bool,
    bitmap: Option<WriteIntentBitmap>,
    bitmap_offset_sectors: i32,
    level: i32,
    raid_disks: u32,
    chunk_sectors: u32,
    /// During a reshape: the previous and the next layout's shapes (see [`SyncRanges`]).
    reshape_shapes: Option<[SyncShape; 2]>,
    /// md's per-member bad-block logs, by member key (members without a log are absent).
    bad_blocks: BTreeMap<MemberKey, BadBlocks>,
    /// Logs changed since they were last written (md's `badblocks.changed`).
    bad_blocks_changed: BTreeSet<MemberKey>,
    /// Devices that joined a slot of a RAID5 with a partial parity log and whose log area
    /// the next superblock round empties, before their own superblock (md's
    /// `ppl_write_empty_header` when a device is added): an old log there would be
    /// replayed after a crash. Then those the round in flight empties, with their slot.
    ppl_wipe: BTreeSet<MemberKey>,
    ppl_wipe_in_round: Vec<(MemberKey, usize)>,
}

/// A device's partial parity log area emptied, as md's ppl_write_empty_header leaves it
/// (zeroes, an empty header first): (byte offset, bytes). None without an area.
pub(super) fn empty_ppl_area(sb: &Superblock) -> Option<(u64, Vec<u8>)> {
    let (start, sectors) = ppl_area(sb)?;
    let header = PplHeader::empty(ppl_signature(&sb.set_uuid)).serialize().ok()?;
    let mut area = vec![0u8; (sectors * 512) as usize];
    area[..header.len()].copy_from_slice(&header);
    Some((start * 512, area))
}

/// The previous and the next layout's shapes of the reshape `sb` records (md's
/// `super_1_validate`: raid_disks is the new count, `delta_disks` the change).
fn reshape_shapes(sb: &Superblock) -> Option<[SyncShape; 2]> {
    if !sb.has(feature::RESHAPE_ACTIVE) {
        return None;
    }
    let previous_disks = sb.raid_disks.checked_add_signed(-sb.delta_disks)?;
    Some([(sb.level, previous_disks, sb.chunksize), (sb.new_level as i32, sb.raid_disks, sb.new_chunk)])
}

impl ArraySuperblocks {
    /// `members` as assembled (freshest superblock first), `bitmap` with its offset from
    /// the superblock in sectors.
    pub fn new(
        members: Vec<ArrayMember>,
        events: u64,
        dirty: bool,
        resync_pending: bool,
        bitmap: Option<(WriteIntentBitmap, i32)>,
    ) -> ArraySuperblocks {
        assert!(!members.is_empty(), "an array has at least one member");
        let sb = &members[0].sb;
        let (level, raid_disks, chunk_sectors) = (sb.level, sb.raid_disks, sb.chunksize);
        let bitmap_offset_sectors = bitmap.as_ref().map_or(0, |(_, o)| *o);
        let reshape_shapes = reshape_shapes(sb);
        ArraySuperblocks {
            members,
            events,
            dirty,
            resync_pending,
            resync_checkpoint_sectors: None,
            failed: false,
            bitmap: bitmap.map(|(b, _)| b),
            bitmap_offset_sectors,
            level,
            raid_disks,
            chunk_sectors,
            reshape_shapes,
            bad_blocks: BTreeMap::new(),
            bad_blocks_changed: BTreeSet::new(),
            ppl_wipe: BTreeSet::new(),
            ppl_wipe_in_round: Vec::new(),
        }
    }

    /// The bad-block log read from member `key` at assembly (see [`BadBlocks::parse`]).
    pub fn load_bad_blocks(&mut self, key: MemberKey, bad_blocks: BadBlocks) {
        self.bad_blocks.insert(key, bad_blocks);
    }

    pub fn bad_blocks(&self, key: MemberKey) -> Option<&BadBlocks> {
        self.bad_blocks.get(&key)
    }

    fn key_of_slot(&self, slot: usize) -> Option<MemberKey> {
        self.members.iter().find(|m| m.role.active_slot() == Some(slot)).map(|m| m.key)
    }

    /// The engine recorded a failed write of device sectors `[sector, sector + sectors)`
    /// in the log of the member in `slot` (`EngineEvent::BadBlocksRecorded`): the next
    /// superblock round writes its log page, then every superblock (md's md_update_sb for
    /// MD_SB_CHANGE_PENDING); the write's completion waits for it. False when the log does
    /// not take the range after all: the caller fails the member instead (md_error).
    pub fn bad_blocks_recorded(&mut self, slot: usize, sector: u64, sectors: u64) -> bool {
        let Some(key) = self.key_of_slot(slot) else { return true };
        let fits = self.bad_blocks.get_mut(&key).is_some_and(|bb| bb.set(sector, sectors));
        if fits {
            self.bad_blocks_changed.insert(key);
        }
        fits
    }

    /// A write made listed sectors good (`EngineEvent::BadBlocksCleared`): the log page
    /// changes with the next superblock round, as md's rdev_clear_badblocks leaves it.
    pub fn bad_blocks_cleared(&mut self, slot: usize, sector: u64, sectors: u64) {
        let Some(key) = self.key_of_slot(slot) else { return };
        if self.bad_blocks.get_mut(&key).is_some_and(|bb| bb.clear(sector, sectors)) {
            self.bad_blocks_changed.insert(key);
        }
    }

    pub fn members(&self) -> &[ArrayMember] {
        &self.members
    }

    pub fn member(&self, key: MemberKey) -> Option<&ArrayMember> {
        self.members.iter().find(|m| m.key == key)
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    pub fn resync_pending(&self) -> bool {
        self.resync_pending
    }

    pub fn failed(&self) -> bool {
        self.failed
    }

    pub fn bitmap(&self) -> Option<&WriteIntentBitmap> {
        self.bitmap.as_ref()
    }

    /// Whether the superblocks would be written clean now (md's safe mode condition).
    fn clean_now(&self) -> bool {
        !self.dirty && !self.resync_pending && !self.failed
    }

    fn max_dev(&self) -> u32 {
        self.members
            .iter()
            .map(|m| m.sb.dev_number + 1)
            .max()
            .unwrap_or(0)
            .max(self.members[0].sb.max_dev)
            .min(MAX_DEV_LIMIT)
    }

    /// Member byte offset of the bitmap area on a member.
    fn bitmap_offset_bytes(&self, m: &ArrayMember) -> Option<u64> {
        self.bitmap.as_ref()?;
        m.sb.super_offset.checked_add_signed(i64::from(self.bitmap_offset_sectors)).map(|s| s * 512)
    }

    /// Bitmap page writes to every working member, page by page.
    fn bitmap_page_ios(&self, pages: &[BitmapPageWrite]) -> Vec<MetaIo> {
        let Some(bm) = &self.bitmap else { return Vec::new() };
        let mut ios = Vec::new();
        for w in pages {
            let bytes = bm.page_bytes(w);
            for m in self.members.iter().filter(|m| m.role.working()) {
                if let Some(at) = self.bitmap_offset_bytes(m) {
                    ios.push(MetaIo::Write {
                        key: m.key,
                        slot: m.role.active_slot(),
                        what: MetaWriteKind::BitmapPage { page: w.page },
                        offset_bytes: at + w.offset_bytes,
                        bytes: bytes.clone(),
                    });
                }
            }
        }
        ios
    }

    /// events + 1, then bitmap page 0 (its header carries events) and the superblock of
    /// every working member. `clean` decides resync_offset.
    fn superblock_round(&mut self, now_seconds: u64) -> MetaRound {
        let clean = self.clean_now();
        self.events += 1;
        let events = self.events;
        let max_dev = self.max_dev();
        let mut roles = vec![role::SPARE; max_dev as usize];
        for m in &self.members {
            if let Some(r) = roles.get_mut(m.sb.dev_number as usize) {
                *r = match m.role {
                    DevRole::Active { slot, .. } | DevRole::Replacement { slot } => slot as u16,
                    DevRole::Spare => role::SPARE,
                    DevRole::Faulty { .. } => role::FAULTY,
                };
            }
        }
        let mut ios = Vec::new();
        if let Some(bm) = &mut self.bitmap {
            bm.superblock_mut().events = events;
            let page0 = bm.page_write(0);
            ios = self.bitmap_page_ios(&[page0]);
        }
        let resync_offset = if clean { MAX_SECTOR } else { self.resync_checkpoint_sectors.unwrap_or(0) };
        for m in self.members.iter_mut().filter(|m| m.role.working()) {
            let sb = &mut m.sb;
            sb.events = events;
            sb.utime = now_seconds;
            sb.resync_offset = resync_offset;
            sb.max_dev = max_dev;
            sb.dev_roles = roles.clone();
            match m.role {
                DevRole::Active { recovering: true, .. } => {
                    sb.feature_map |= feature::RECOVERY_OFFSET;
                    sb.feature_map &= !feature::REPLACEMENT;
                }
                // md's super_1_sync: a replacement says so, and how far it is rebuilt.
                DevRole::Replacement { .. } => {
                    sb.feature_map |= feature::RECOVERY_OFFSET | feature::REPLACEMENT
                }
                _ => {
                    sb.feature_map &= !(feature::RECOVERY_OFFSET | feature::REPLACEMENT);
                    sb.recovery_offset = 0;
                }
            }
            // md's super_1_sync: the feature bit while the log has entries; a changed log
            // page goes out before the superblock that points at it.
            if let Some(bb) = self.bad_blocks.get(&m.key) {
                if bb.is_empty() {
                    sb.feature_map &= !feature::BAD_BLOCKS;
                } else {
                    sb.feature_map |= feature::BAD_BLOCKS;
                }
                let at = sb.super_offset.checked_add_signed(i64::from(sb.bblog_offset));
                if let (true, Some(at)) = (self.bad_blocks_changed.remove(&m.key), at) {
                    ios.push(MetaIo::Write {
                        key: m.key,
                        slot: m.role.active_slot(),
                        what: MetaWriteKind::BadBlockLog,
                        offset_bytes: at * 512,
                        bytes: bb.to_log_bytes(sb.bblog_size),
                    });
                }
            }
            // A device new in its slot: its partial parity log area emptied before its
            // superblock says it holds the slot (so an old log there is never replayed).
            if let (Some(slot), true) = (m.role.active_slot(), self.ppl_wipe.contains(&m.key)) {
                if let Some((offset_bytes, bytes)) = empty_ppl_area(sb) {
                    let what = MetaWriteKind::PplArea;
                    ios.push(MetaIo::Write { key: m.key, slot: Some(slot), what, offset_bytes, bytes });
                }
                self.ppl_wipe.remove(&m.key);
                self.ppl_wipe_in_round.push((m.key, slot));
            }
            ios.push(MetaIo::Write {
                key: m.key,
                slot: m.role.active_slot(),
                what: MetaWriteKind::Superblock,
                offset_bytes: sb.super_offset * 512,
                bytes: sb.update_csum().to_vec(),
            });
        }
        MetaRound { ios, events, kind: RoundKind::Superblocks }
    }

    /// md_error for members whose metadata I/O failed: an active member becomes faulty,
    /// a spare leaves. Returns the slots that newly failed.
    fn fail_members(&mut self, keys: &[MemberKey]) -> Vec<usize> {
        let mut slots = Vec::new();
        self.members.retain_mut(|m| {
            if !keys.contains(&m.key) {
                return true;
            }
            match m.role {
                DevRole::Active { slot, .. } => {
                    m.role = DevRole::Faulty { slot };
                    slots.push(slot);
                    true
                }
                // A spare, or a replacement, whose write failed leaves the array; the
                // slot's member stays.
                DevRole::Spare | DevRole::Replacement { .. } => false,
                DevRole::Faulty { .. } => true,
            }
        });
        if let (false, Some(bm)) = (slots.is_empty(), &mut self.bitmap) {
            bm.member_lost();
        }
        slots
    }

    /// The caller performed `round`; `failed` lists the members where an I/O of it failed.
    pub fn round_done(&mut self, round: MetaRound, failed: &[MemberKey], now_seconds: u64) -> RoundOutcome {
        if let (RoundKind::BitmapPages { pages }, Some(bm)) = (&round.kind, &mut self.bitmap) {
            // Writes gated on these pages may go: the bits are durable on every member
            // still working (the others are failed just below).
            bm.pages_written(pages);
        }
        let ppl_emptied_slots = match round.kind {
            RoundKind::Superblocks => std::mem::take(&mut self.ppl_wipe_in_round)
                .into_iter()
                .filter(|(key, _)| !failed.contains(key))
                .map(|(_, slot)| slot)
                .collect(),
            _ => Vec::new(),
        };
        if !failed.is_empty() {
            let newly_failed_slots = self.fail_members(failed);
            if !self.members.iter().any(|m| m.role.working()) {
                return RoundOutcome {
                    newly_failed_slots,
                    ppl_emptied_slots,
                    next: Err(MetaError::NoWorkingMember),
                };
            }
            // Record the failure in the others' superblocks; a daemon pass clears nothing,
            // as the failed member's writes may not be durable.
            let next = self.superblock_round(now_seconds);
            return RoundOutcome { newly_failed_slots, ppl_emptied_slots, next: Ok(Some(next)) };
        }
        let next = match round.kind {
            RoundKind::Superblocks | RoundKind::BitmapPages { .. } => None,
            RoundKind::DaemonFlush { candidates } => self.clear_flushed(&candidates),
        };
        RoundOutcome { newly_failed_slots: Vec::new(), ppl_emptied_slots, next: Ok(next) }
    }

    fn clear_flushed(&mut self, candidates: &[u64]) -> Option<MetaRound> {
        // md moves events_cleared only while every slot has a working member: a member
        // away keeps its claim on the bits set since it left (its re-add reads them).
        let whole = (0..self.raid_disks as usize).all(|s| {
            self.members
                .iter()
                .any(|m| matches!(m.role, DevRole::Active { slot, recovering: false } if slot == s))
        });
        let events = if whole { Some(self.events) } else { None };
        let pages = self.bitmap.as_mut()?.clear_flushed(candidates, events);
        if pages.is_empty() {
            return None;
        }
        let ios = self.bitmap_page_ios(&pages);
        Some(MetaRound { ios, events: self.events, kind: RoundKind::BitmapPages { pages } })
    }

    /// Before the first write after a clean start or a clean marking: the superblocks are
    /// to say dirty (resync_offset 0) before any data changes. True when it was clean: the
    /// caller writes the superblocks and holds writes until that round is done.
    pub fn mark_dirty(&mut self) -> bool {
        let was_clean = !self.dirty;
        self.dirty = true;
        was_clean
    }

    /// md's safe mode, after writes stopped and a flush of every member: the superblocks
    /// are to say clean. False (nothing changed) when already clean, a resync is owed or
    /// the array failed; true: the caller writes the superblocks, holding writes meanwhile.
    pub fn mark_clean(&mut self) -> bool {
        if !self.dirty || self.resync_pending || self.failed {
            return false;
        }
        self.dirty = false;
        true
    }

    /// Shutdown after the final flush: clean unless a resync is owed or the array failed
    /// (then the superblocks are written).
    pub fn stop(&mut self) {
        self.dirty = self.resync_pending || self.failed;
    }

    /// The round that writes every superblock as the state is now (bitmap page 0 first).
    pub fn write_superblocks(&mut self, now_seconds: u64) -> MetaRound {
        self.superblock_round(now_seconds)
    }

    /// The engine failed the member in `slot` (md_error): recorded as faulty, and the set
    /// bits are kept for its re-add (see [`WriteIntentBitmap::member_lost`]).
    pub fn member_failed(&mut self, slot: usize) {
        let mut lost = false;
        for m in &mut self.members {
            if m.role.active_slot() == Some(slot) {
                m.role = DevRole::Faulty { slot };
                lost = true;
            }
        }
        if let (true, Some(bm)) = (lost, &mut self.bitmap) {
            bm.member_lost();
        }
    }

    /// More members lost than the level survives: never marked clean again.
    pub fn array_failed(&mut self) {
        self.failed = true;
    }

    /// Records how far the recovery into `slot` got, without writing (the next round
    /// carries it, e.g. the one of [`ArraySuperblocks::stop`]).
    pub fn record_recovery_offset(&mut self, slot: usize, recovery_offset_sectors: u64) {
        for m in &mut self.members {
            if m.role == (DevRole::Active { slot, recovering: true }) {
                m.sb.recovery_offset = recovery_offset_sectors;
            }
        }
    }

    /// The recovery into `slot` finished and was flushed: the member is in sync.
    pub fn recovery_done(&mut self, slot: usize) {
        for m in &mut self.members {
            if let DevRole::Active { slot: s, recovering } = &mut m.role {
                if *s == slot {
                    *recovering = false;
                }
            }
        }
    }

    /// A spare (or a just added member) takes `slot` and is rebuilt from sector 0.
    pub fn spare_activated(&mut self, key: MemberKey, slot: usize) {
        if let Some(m) = self.members.iter_mut().find(|m| m.key == key) {
            m.role = DevRole::Active { slot, recovering: true };
            m.sb.recovery_offset = 0;
            if has_ppl(&m.sb) {
                self.ppl_wipe.insert(key);
            }
        }
    }

    /// Every active member moves to the slot `to` gives it (md's takeovers between raid0
    /// and raid10 renumber the members: `new_raid_disk`).
    pub fn renumber_slots(&mut self, to: impl Fn(usize) -> usize) {
        for m in &mut self.members {
            if let DevRole::Active { slot, .. } = &mut m.role {
                *slot = to(*slot);
            }
        }
    }

    /// The member of `slot` leaves its slot and stays as a spare (md's takeover of a raid6
    /// into raid5 drops the Q slot).
    pub fn slot_to_spare(&mut self, slot: usize) {
        for m in &mut self.members {
            if m.role.active_slot() == Some(slot) {
                m.role = DevRole::Spare;
                m.sb.recovery_offset = 0;
            }
        }
    }

    /// A spare (or a just added member) starts replacing the active member of `slot`
    /// (md's want_replacement), rebuilt from `recovery_offset_sectors`.
    pub fn replacement_started(&mut self, key: MemberKey, slot: usize, recovery_offset_sectors: u64) {
        if let Some(m) = self.members.iter_mut().find(|m| m.key == key) {
            m.role = DevRole::Replacement { slot };
            m.sb.recovery_offset = recovery_offset_sectors;
        }
    }

    /// Records how far the replacement of `slot` got (written by the next round).
    pub fn record_replacement_offset(&mut self, slot: usize, recovery_offset_sectors: u64) {
        for m in &mut self.members {
            if m.role == (DevRole::Replacement { slot }) {
                m.sb.recovery_offset = recovery_offset_sectors;
            }
        }
    }

    /// The replacement of `slot` is copied and flushed: it becomes the slot's member, and
    /// the member it replaced leaves the array (md sets it Faulty and removes it; its
    /// superblock is not written again, and its older events keep it out of a later
    /// assembly). Returns the key of the member that left.
    pub fn replacement_done(&mut self, slot: usize) -> Option<MemberKey> {
        if !self.members.iter().any(|m| m.role == (DevRole::Replacement { slot })) {
            return None;
        }
        let old = self.members.iter().find(|m| m.role.active_slot() == Some(slot)).map(|m| m.key);
        self.members.retain(|m| Some(m.key) != old);
        for m in &mut self.members {
            if m.role == (DevRole::Replacement { slot }) {
                m.role = DevRole::Active { slot, recovering: false };
                // The slot's log moves to it (md's log_modify when the replacement takes over).
                if has_ppl(&m.sb) {
                    self.ppl_wipe.insert(m.key);
                }
            }
        }
        old
    }

    /// The replacement of `slot` failed or was given up: it leaves the array; the slot's
    /// member stays.
    pub fn replacement_failed(&mut self, slot: usize) {
        self.members.retain(|m| m.role != (DevRole::Replacement { slot }));
    }

    /// md's raid_disks changed (a grow of a mirror count): every superblock says so.
    pub fn set_raid_disks(&mut self, raid_disks: u32) {
        self.raid_disks = raid_disks;
        for m in &mut self.members {
            m.sb.raid_disks = raid_disks;
        }
    }

    /// A reshape starts (`reshape::start`'s superblocks, which record it): each member's
    /// superblock replaced, members given a slot become active in it, in sync (md's
    /// raid5_start_reshape marks devices past the old raid_disks In_sync) unless their
    /// superblock records a recovery (a slot below them: the reshape recovers it).
    pub fn reshape_started(&mut self, updates: Vec<(MemberKey, Superblock, Option<usize>)>, raid_disks: u32) {
        self.raid_disks = raid_disks;
        if let Some((_, sb, _)) = updates.first() {
            self.reshape_shapes = reshape_shapes(sb);
        }
        for (key, sb, slot) in updates {
            if let Some(m) = self.members.iter_mut().find(|m| m.key == key) {
                m.sb = sb;
                // A slot the reshape recovers as it goes (raid5 to raid6's Q) says so.
                if let Some(slot) = slot {
                    m.role = DevRole::Active { slot, recovering: m.sb.has(feature::RECOVERY_OFFSET) };
                }
            }
        }
    }

    /// The reshape moved everything below `position_sectors` (md's reshape_position,
    /// written by the next round).
    pub fn set_reshape_position(&mut self, position_sectors: u64) {
        for m in &mut self.members {
            m.sb.reshape_position = position_sectors;
        }
    }

    /// The reshape is done: every superblock as `finished` makes it (the next layout is
    /// the layout, data at the new offset).
    pub fn reshape_finished(&mut self, finished: impl Fn(&Superblock) -> Superblock) {
        for m in &mut self.members {
            m.sb = finished(&m.sb);
        }
        // The shape from a member the reshape's rounds wrote: a faulty one still listed keeps
        // the superblock it failed with (its old member count would misplace bitmap bits).
        let written = self.members.iter().find(|m| m.role.working()).or(self.members.first());
        if let Some(m) = written {
            (self.level, self.raid_disks, self.chunk_sectors) = (m.sb.level, m.sb.raid_disks, m.sb.chunksize);
        }
        self.reshape_shapes = None;
    }

    /// A new member joins (as a spare until [`ArraySuperblocks::spare_activated`]).
    pub fn member_added(&mut self, member: ArrayMember) {
        assert!(self.member(member.key).is_none(), "member keys are unique");
        // Its log was zeroed as it was added: empty, with the room its superblock gives (a
        // returning member's own is put back by `keep_bad_blocks`).
        if let Some(bb) = BadBlocks::for_superblock(&member.sb) {
            self.bad_blocks.insert(member.key, bb);
        }
        self.members.push(member);
    }

    /// Member `key`, just added, comes back with the bad-block log `log` it carried as a
    /// member (md's re-add keeps it): its entries replace the empty log and are written,
    /// with the feature bit, by the next superblock round. False (nothing kept) when its
    /// superblock has no log or the log no room for them.
    pub fn keep_bad_blocks(&mut self, key: MemberKey, log: &BadBlocks) -> bool {
        let Some(bb) = self.member(key).and_then(|m| log.moved_to(&m.sb)) else { return false };
        self.bad_blocks.insert(key, bb);
        self.bad_blocks_changed.insert(key);
        true
    }

    /// A faulty member or a spare leaves the array's superblocks (mdadm --remove).
    pub fn member_removed(&mut self, key: MemberKey) {
        self.members.retain(|m| m.key != key);
        self.bad_blocks.remove(&key);
        self.bad_blocks_changed.remove(&key);
        self.ppl_wipe.remove(&key);
    }

    /// The resync finished: the array may be marked clean again (no write of its own).
    pub fn resync_done(&mut self) {
        self.resync_pending = false;
        // Everything is in sync now: a later unclean stop resyncs from the start.
        self.resync_checkpoint_sectors = None;
    }

    /// Why the component size cannot become `to_sectors`: the bitmap would outgrow the
    /// pages it has (md would take a larger bitmap chunk; uraid does not yet).
    pub fn may_set_component_size(&self, to_sectors: u64) -> Result<(), String> {
        let Some(bm) = &self.bitmap else { return Ok(()) };
        let page = crate::meta::bitmap::BITMAP_PAGE_BYTES as u64;
        let sb = bm.superblock();
        let (now, then) = (
            sb.bytes_on_disk(page),
            crate::meta::bitmap::bitmap_bytes_on_disk(to_sectors, sb.chunksize, page),
        );
        if then > now {
            return Err(format!(
                "the write-intent bitmap would need {then} bytes, more than the {now} it has (md would take \
                 a larger bitmap chunk; uraid does not yet)"
            ));
        }
        Ok(())
    }

    /// md's update_size: each member's data grows to `to_sectors` (what the caller checked
    /// they have room for), and the space from `from_sectors` on is owed a resync (md's
    /// resync_offset at the old size) and set in the bitmap. Returns the bitmap pages to
    /// persist before the superblocks.
    pub fn set_component_size(&mut self, from_sectors: u64, to_sectors: u64) -> Vec<BitmapPageWrite> {
        for m in &mut self.members {
            m.sb.size = to_sectors;
            m.sb.data_size = m.sb.data_size.max(to_sectors);
        }
        self.resync_pending = true;
        self.resync_checkpoint_sectors = Some(from_sectors);
        self.bitmap.as_mut().map(|bm| bm.grow(from_sectors, to_sectors)).unwrap_or_default()
    }

    /// A resync stopped at `resync_offset_sectors` with everything below it in sync and
    /// flushed: written as resync_offset while dirty.
    pub fn record_resync_checkpoint(&mut self, resync_offset_sectors: u64) {
        self.resync_checkpoint_sectors = Some(resync_offset_sectors);
    }

    /// Sync-space ranges of an array byte range (what the bitmap counts in).
    fn sync_ranges(&self, offset_bytes: u64, len_bytes: u64) -> SyncRanges {
        let start = offset_bytes / 512;
        let end = (offset_bytes + len_bytes).div_ceil(512);
        let range = |(level, disks, chunk): SyncShape| {
            array_range_to_sync_range(level, disks, chunk, start, end - start)
        };
        match self.reshape_shapes {
            Some([previous, next]) => {
                let (first, second) = (range(previous), range(next));
                // A layout change keeps the rows: counted once.
                SyncRanges { first, second: (second != first).then_some(second) }
            }
            None => {
                SyncRanges { first: range((self.level, self.raid_disks, self.chunk_sectors)), second: None }
            }
        }
    }

    /// Before a data write of array bytes `[offset, offset + len)`: counts it in the
    /// bitmap and returns the pages whose new bits must be durable before it is issued
    /// (written by [`ArraySuperblocks::bitmap_pages_round`]). Call
    /// [`ArraySuperblocks::mark_dirty`] first.
    pub fn start_write(&mut self, offset_bytes: u64, len_bytes: u64) -> WriteIntent {
        if self.bitmap.is_none() {
            return WriteIntent { sync_range: None, pages: Vec::new() };
        }
        let ranges = self.sync_ranges(offset_bytes, len_bytes);
        let Some(bm) = &mut self.bitmap else { unreachable!() };
        let mut pages: Vec<BitmapPageWrite> = Vec::new();
        for (s, l) in ranges.iter() {
            for p in bm.start_write(s, l).pages_to_write {
                if !pages.contains(&p) {
                    pages.push(p);
                }
            }
        }
        WriteIntent { sync_range: Some(ranges), pages }
    }

    /// The round that writes bitmap `pages` as they are now to every working member.
    pub fn bitmap_pages_round(&self, pages: Vec<BitmapPageWrite>) -> MetaRound {
        MetaRound {
            ios: self.bitmap_page_ios(&pages),
            events: self.events,
            kind: RoundKind::BitmapPages { pages },
        }
    }

    /// After the data write completed; `reached_all_members` false (an error, or the
    /// array is degraded) keeps its bits until a resync.
    pub fn end_write(&mut self, sync_range: Option<SyncRanges>, reached_all_members: bool) {
        if let (Some(bm), Some(ranges)) = (&mut self.bitmap, sync_range) {
            for (s, l) in ranges.iter() {
                bm.end_write(s, l, reached_all_members);
            }
        }
    }

    /// One pass of md's bitmap daemon: nominates bits idle for two passes. The round
    /// flushes every working member; only when it succeeds everywhere are the bits
    /// cleared (and the pages holding them written, in the round that follows).
    pub fn bitmap_daemon(&mut self) -> Option<MetaRound> {
        let candidates = self.bitmap.as_mut()?.daemon_pass();
        if candidates.is_empty() {
            return None;
        }
        let ios = self
            .members
            .iter()
            .filter(|m| m.role.working() && self.bitmap_offset_bytes(m).is_some())
            .map(|m| MetaIo::Flush { key: m.key, slot: m.role.active_slot() })
            .collect();
        Some(MetaRound { ios, events: self.events, kind: RoundKind::DaemonFlush { candidates } })
    }

    /// A resync or a recovery brought the whole array in sync: no bit is needed any more.
    pub fn bitmap_all_synced(&mut self) {
        if let Some(bm) = &mut self.bitmap {
            let total = bm.superblock().sync_size;
            bm.sync_done(0, total);
        }
    }

    /// The bitmap area as it should be on a new member, with its offset from the
    /// superblock in sectors.
    pub fn bitmap_area(&self) -> Option<(i32, Vec<u8>)> {
        Some((self.bitmap_offset_sectors, self.bitmap.as_ref()?.area_bytes()))
    }
}
