//! The state of a reshape run while the array serves (see `reshape_ops`): the engine of
//! the previous geometry beside the array's engine (the next geometry), the checkpoint,
//! the window being moved, and the requests that wait for it; and of a takeover (see
//! `takeover`). A leaf: it names no other room of the array, so `state`, `reshape_ops`
//! and `takeover` may all name it.

use std::collections::VecDeque;

use crate::api::*;
use crate::detmap::DetMap;
use crate::engine::Engine;
use crate::geometry::Geometry;
use crate::reshape::run::{ReshapeRun, Window};
use crate::sync::pacing::Pacer;

/// Set on the ids of the pieces a request across the reshape position is split into.
pub(super) const PART_TAG: RequestId = 1 << 59;
/// Set on the ids of the reshape's own reads, writes and flushes.
pub(super) const RESHAPE_TAG: RequestId = 1 << 60;
/// Set on the member I/O ids of the previous geometry's engine (the ledgers of the two
/// engines count from zero each; array metadata I/O sits at `ARRAY_META_IO_ID_BASE`).
pub(super) const PREV_IO_TAG: MemberIoId = 1 << 56;

/// Largest request the reshape reads or writes at once.
pub(super) const RESHAPE_IO_MAX_BYTES: u64 = 1 << 20;
/// Largest window moved between two checkpoints.
pub(super) const WINDOW_MAX_SECTORS: u64 = 4 << 11;

/// A change of the array's shape, as `Array::shape_change_blocked` weighs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ShapeChange {
    /// A grow or restripe; `parity_slot_empty_ok`: of a raid4 whose only missing member is
    /// its empty parity slot (mdadm's raid0 grow passes through it).
    Reshape { parity_slot_empty_ok: bool },
    /// A takeover; `to_raid0`: to raid0, which needs that empty parity slot.
    Takeover { to_raid0: bool },
}

/// Where the window being moved stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The reshape's superblocks are being written (a start from a running array: the
    /// engines are swapped once they are durable). Every request waits.
    Starting,
    /// Between windows: the next one starts at `not_before_ns` (paced as a resync is).
    Ready,
    /// Requests in the previous engine overlapping the window are finishing.
    Draining(Window),
    /// The window's data is being read in the previous layout.
    Reading(Window),
    /// ...and written as whole stripes of the next one.
    Writing(Window),
    /// The next layout's writes are being made durable.
    Flushing(Window),
    /// The checkpoint at the window's end is being written to every superblock.
    Checkpointing(Window),
    /// Every sector is in the next layout: requests in the previous engine finish.
    Finishing,
    /// The finished superblocks are being written.
    Completing,
    /// Stopped (an error, or the array closing): requests are served, no window moves.
    Stopped,
}

/// A caller's request split at the reshape position: its pieces' results gathered.
pub(super) struct Parts {
    pub parent: RequestId,
    pub left: u32,
    pub error: Option<RequestError>,
    /// A read's bytes, the pieces placed at their offsets.
    pub data: Vec<u8>,
}

pub(super) struct Reshaping {
    /// The previous geometry at the old data offset. None while `Starting`.
    pub prev: Option<Box<Engine>>,
    pub run: ReshapeRun,
    pub step: Step,
    /// Requests that wait for the start or for the window they overlap, in arrival order.
    pub waiting: VecDeque<Request>,
    /// Requests in the previous engine, by id: their sector spans (a window waits for
    /// those it overlaps).
    pub prev_spans: DetMap<RequestId, (u64, u64)>,
    pub parts: DetMap<RequestId, Parts>,
    /// Each piece's request and where its bytes go in it.
    pub piece_of: DetMap<RequestId, (RequestId, usize)>,
    pub next_part: u64,
    /// The reshape's own requests not yet taken by an engine, and those out.
    pub to_issue: VecDeque<Request>,
    pub out: u32,
    pub failed: bool,
    /// The window's bytes (array sectors from its start), as read.
    pub data: Vec<u8>,
    pub not_before_ns: TimeNs,
    pub window_started_ns: TimeNs,
    /// The windows' pace: md's `sync_speed_min` under client I/O and `sync_speed_max`
    /// idle, or the adaptive policy's rate between them (`sync_policy`), timed on the
    /// callers' requests while the reshape runs.
    pub pacer: Pacer,
    /// When the first window of this run started, and the checkpoint then (its speed).
    pub began: Option<(TimeNs, u64)>,
    /// The start's superblock round is done (`Starting`).
    pub start_recorded: bool,
    /// The array was unclean when the reshape resumed: resync it once done (md resyncs
    /// after the reshape, which rewrites every stripe it moves with fresh parity).
    pub resync_after: bool,
    /// The array is closing: no new window starts.
    pub stopping: bool,
}

impl Step {
    /// The window's own I/O under way in this step, by what it does ("read", ...).
    pub fn window_io(&self) -> Option<&'static str> {
        match self {
            Step::Reading(_) => Some("read"),
            Step::Writing(_) => Some("written"),
            Step::Flushing(_) => Some("flushed"),
            _ => None,
        }
    }
}

impl Reshaping {
    pub fn new(prev: Option<Box<Engine>>, run: ReshapeRun, step: Step) -> Reshaping {
        Reshaping {
            prev,
            run,
            step,
            waiting: VecDeque::new(),
            prev_spans: DetMap::default(),
            parts: DetMap::default(),
            piece_of: DetMap::default(),
            next_part: 0,
            to_issue: VecDeque::new(),
            out: 0,
            failed: false,
            data: Vec::new(),
            not_before_ns: 0,
            window_started_ns: 0,
            pacer: Pacer::default(),
            began: None,
            start_recorded: false,
            resync_after: false,
            stopping: false,
        }
    }

    /// The array sectors client requests may not enter now: the window being moved, up
    /// to the end of its checkpoint; everything while the reshape starts.
    pub fn blocked(&self) -> Option<(u64, u64)> {
        match &self.step {
            Step::Starting => Some((0, u64::MAX)),
            Step::Draining(w)
            | Step::Reading(w)
            | Step::Writing(w)
            | Step::Flushing(w)
            | Step::Checkpointing(w) => Some((w.start_sectors, w.end_sectors)),
            _ => None,
        }
    }

    /// A window (or the start) is under way: a close waits for its checkpoint.
    pub fn busy(&self) -> bool {
        self.blocked().is_some() || matches!(self.step, Step::Finishing | Step::Completing)
    }

    pub fn part_id(&mut self) -> RequestId {
        self.next_part = (self.next_part + 1) % PART_TAG;
        PART_TAG | self.next_part
    }
}

/// A takeover under way (see `takeover`): the geometry it gives and the requests that
/// wait for it.
pub(super) struct Takeover {
    pub(super) geometry: Geometry,
    /// The superblocks say the new level.
    pub(super) recorded: bool,
    /// The new engine has the members; `waiting` goes to it.
    pub(super) swapped: bool,
    pub(super) waiting: VecDeque<Request>,
}

impl Takeover {
    pub(super) fn new(geometry: Geometry) -> Takeover {
        Takeover { geometry, recorded: false, swapped: false, waiting: VecDeque::new() }
    }
}
