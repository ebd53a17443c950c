//! Background work that shares the request machinery: recovery (rebuilding a member) and
//! resync (making redundancy consistent after an unclean shutdown), paced by md's
//! `sync_speed_min` / `sync_speed_max`.
//!
//! raid4/5/6 work one stripe head at a time through the stripe cache, so a head being
//! rebuilt is never written by a request at the same moment. raid1/10 work in units of
//! array sectors, and requests writing into the unit in flight wait for it (md's barrier).

use std::collections::{BTreeSet, VecDeque};

use crate::api::*;
use crate::geometry::Extent;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// Rebuild `member` from the others.
    Recovery { member: usize },
    /// Copy `slot`'s member to its replacement (md's want_replacement; see `replace`).
    Replace { slot: usize },
    /// Rewrite redundancy (parity, mirror copies) from the data.
    Resync,
    /// md's `check` / `repair` (see `scrub`): read everything, count mismatches, and on
    /// repair rewrite what is inconsistent.
    Scrub(ScrubKind),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncStatus {
    pub kind: SyncKind,
    pub done_sectors: u64,
    pub total_sectors: u64,
    /// Recovery: member data sectors below this are rebuilt (md's recovery_offset).
    pub recovery_offset_sectors: u64,
    /// Resync: everything below this (in the job's sectors: member sectors, array sectors
    /// for raid10) is in sync; what a stopped resync records as md's resync_offset.
    pub resync_offset_sectors: u64,
    /// Recovery: the other members the same pass rebuilds (raid6: md recovers every failed
    /// device a stripe meets), each with its recovery_offset.
    pub also_recovering: Vec<(usize, u64)>,
    /// The adaptive policy's measure: the job's share of the bytes moved lately while
    /// clients ran, percent (`None` with md's policy, or before clients ran).
    pub share_pct: Option<u8>,
}

/// Things the caller acts on (superblock updates, monitor messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineEvent {
    MemberFaulty(usize),
    RecoveryStarted(usize),
    RecoveryDone(usize),
    /// The replacement of `slot` is copied; writes still go to both. The caller flushes,
    /// records it, and calls `Engine::promote_replacement`.
    ReplacementCopied(usize),
    /// The replacement of `slot` failed or was given up; the slot's member stays.
    ReplacementFaulty(usize),
    ResyncDone,
    /// A background job stopped short (its target failed, data was unreadable, or a
    /// scrub was stopped by `stop_scrub`, md's `idle`).
    SyncAborted(SyncKind),
    /// A check or repair ran to the end; `mismatch_cnt_sectors` is md's mismatch_cnt.
    ScrubDone {
        kind: ScrubKind,
        mismatch_cnt_sectors: u64,
    },
    ArrayFailed,
    /// md's rdev_set_badblocks: a write to `slot` failed and device sectors
    /// `[sector, sector + sectors)` joined its bad-block log instead of failing the
    /// member. Completions are held until the log is written (`metadata_committed`).
    BadBlocksRecorded {
        slot: usize,
        sector: u64,
        sectors: u64,
    },
    /// md's rdev_clear_badblocks: a write landed on listed sectors of `slot`; the log
    /// changes with the next superblock update (nothing waits for it).
    BadBlocksCleared {
        slot: usize,
        sector: u64,
        sectors: u64,
    },
    /// raid1 write-behind: the write-mostly copies of a finished write (`group`, named by
    /// `Engine::take_behind_group`) landed; `ok`: all of them. Its bitmap bits may go now.
    BehindWriteDone {
        group: u64,
        ok: bool,
    },
}

pub(crate) struct SyncJob {
    pub kind: SyncKind,
    /// Ranges still to start: member sectors (raid4/5/6) or array sectors (raid1/10).
    todo: VecDeque<(u64, u64)>,
    /// Unit starts in flight.
    active: BTreeSet<u64>,
    pub done_sectors: u64,
    pub total_sectors: u64,
    next_allowed_ns: TimeNs,
    unit_sectors: u64,
    window: usize,
    /// Where recovery began (raid10 reports this until the end, its units not being in member order).
    start_offset: u64,
    /// A recovery's other members rebuilt by the same pass (raid6 only, see `join_recovery`).
    pub also: Vec<usize>,
}

impl SyncJob {
    /// Is the unit starting at `start` in flight?
    pub(crate) fn unit_in_flight(&self, start: u64) -> bool {
        self.active.contains(&start)
    }
}

pub(crate) enum UnitStart {
    Started,
    /// Nothing to do there (raid10 units holding no copy of the member being rebuilt).
    Nothing,
    /// Not now: no stripe head free, or a request holds the range.
    Busy,
    /// No readable source: the job cannot go on.
    Unreadable,
}

pub(crate) struct DirectUnit {
    pub start: u64,
    pub end: u64,
    pub pending: u32,
    pub failed: bool,
    /// A check/repair unit's copies and their reads (see `scrub`).
    pub scrub: Option<Box<DirectScrub>>,
}

pub(crate) mod pacing;
mod thread;

/// Member-sector ranges [start, end) a background job covers.
pub(crate) type SectorRanges = Vec<(u64, u64)>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScrubKind {
    /// Read and compare everything, change nothing (md's `check`).
    Check,
    /// As check, and rewrite what is inconsistent (md's `repair`).
    Repair,
}

impl ScrubKind {
    /// md's sync_action word.
    pub fn name(self) -> &'static str {
        match self {
            ScrubKind::Check => "check",
            ScrubKind::Repair => "repair",
        }
    }
}

/// How /proc/mdstat names a job ("recovery", where sysfs says "recover").
pub fn mdstat_name(kind: SyncKind) -> &'static str {
    match kind {
        SyncKind::Recovery { .. } | SyncKind::Replace { .. } => "recovery",
        other => action_name(other),
    }
}

/// md's sync_action / last_sync_action word for a job.
pub fn action_name(kind: SyncKind) -> &'static str {
    match kind {
        // md's sync_action says "recover" while a replacement is rebuilt too.
        SyncKind::Recovery { .. } | SyncKind::Replace { .. } => "recover",
        SyncKind::Resync => "resync",
        SyncKind::Scrub(k) => k.name(),
    }
}

/// What a sync unit that reads and compares every member does where the redundancy
/// disagrees with the data: md's check, repair, and its resync (which writes parity, or a
/// raid10 copy, only where it disagrees, so a fresh array on thin members stays thin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnMismatch {
    /// md's check: count it, write nothing.
    Count,
    /// md's repair: rewrite it; raid6 first looks for one bad data block (raid6check).
    Repair,
    /// md's resync: rewrite the redundancy from the data (P and/or Q, the later copies).
    Resync,
}

impl OnMismatch {
    /// The comparing mode of a job, if it compares.
    pub(crate) fn of(kind: SyncKind) -> Option<OnMismatch> {
        match kind {
            SyncKind::Scrub(ScrubKind::Check) => Some(OnMismatch::Count),
            SyncKind::Scrub(ScrubKind::Repair) => Some(OnMismatch::Repair),
            SyncKind::Resync => Some(OnMismatch::Resync),
            SyncKind::Recovery { .. } | SyncKind::Replace { .. } => None,
        }
    }
}

/// A raid1/10 scrub unit (or resync unit that compares): its pieces (each contiguous on
/// every copy) and every copy's read.
pub(crate) struct DirectScrub {
    pub kind: OnMismatch,
    /// (array sector, sectors, copies in md's order).
    pub pieces: Vec<(u64, u64, Vec<Extent>)>,
    /// bufs[piece][copy].
    pub bufs: Vec<Vec<Option<Vec<u8>>>>,
    pub compared: bool,
}
