//! [`Array`]: the engine with md's upkeep around it, as one sans-IO state machine. Requests,
//! member-I/O completions and the time go in; member I/O (the engine's and the array's own
//! superblock, bitmap and log writes) and request completions come out. The drivers (the
//! runtime over real members, the simulator over simulated ones) run it as they run a bare
//! engine, so every fault path runs under simulation as it does under `uraid serve`.
//!
//! The rooms: [`super::admission`] (writes held for the metadata, unaligned requests),
//! [`super::upkeep_ops`] (engine events, safe mode, the bitmap daemon, checkpoints, spares,
//! closing), [`super::control`] (fail, remove, add, replace), [`super::start`] (from an
//! assembly plan), [`super::view`] (what status and detail show).

use std::collections::{BTreeMap, VecDeque};

use super::rounds::{RoundSeq, Rounds};
use super::superblocks::{ArraySuperblocks, MemberKey, SyncRanges};
use super::upkeep::UpkeepClock;
use crate::api::*;
use crate::detmap::DetMap;
use crate::engine::Engine;
use crate::stats::ArrayStats;
use crate::sync::SyncStatus;

/// What to do once a metadata round is done.
#[derive(Clone, Debug)]
pub(super) enum AfterRound {
    /// A member failure (or a bad-block range) is in the superblocks: held completions may go.
    FailureRecorded,
    /// The replacement of `slot` is recorded as the slot's member: the engine switches to it.
    Promote { slot: usize },
    /// The closing superblocks are written.
    Closed,
    /// A superblock round of the reshape (its start, a checkpoint, its end).
    Reshape,
    /// The superblocks say a takeover's new level.
    Takeover,
}

/// What a flush the array issued itself is for.
#[derive(Clone, Debug)]
pub(super) enum AfterFlush {
    /// md's safe mode: no write since `generation`, so the superblocks may say clean.
    MarkClean {
        generation: u64,
    },
    RecoveryDone {
        slot: usize,
    },
    Checkpoint {
        sync: SyncStatus,
    },
    ReplacementCopied {
        slot: usize,
    },
    /// The close's own flush, with the sync position taken before it.
    Close {
        sync: Option<SyncStatus>,
    },
}

/// Where closing stands (see `ArrayEngine::finish_close`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Closing {
    Flushing,
    Writing,
    Done(Result<(), RequestError>),
}

pub struct Array {
    pub(super) engine: Engine,
    pub(super) sbs: ArraySuperblocks,
    pub(super) read_only: bool,
    pub(super) now_ns: TimeNs,
    /// Wall-clock seconds at `now_ns == 0` (superblock utime).
    pub(super) epoch_seconds: u64,
    pub(super) upkeep: UpkeepClock,
    pub(super) rounds: Rounds,
    pub(super) after: BTreeMap<RoundSeq, Vec<AfterRound>>,
    /// Writes wait for this round too (the PPL areas emptied at start).
    pub(super) write_barrier: RoundSeq,
    /// The round that marks the superblocks dirty: every write waits for it, also one
    /// admitted while it is in flight (after `mark_dirty` already said dirty).
    pub(super) dirty_seq: RoundSeq,
    /// The last round that writes bitmap pages: a write whose bits were already set in
    /// memory still waits for it (they may not be on disk yet).
    pub(super) pages_seq: RoundSeq,
    // Admission (see `admission`).
    pub(super) held: VecDeque<Held>,
    pub(super) writes: DetMap<RequestId, WriteInFlight>,
    /// raid1 write-behind: completed writes whose write-mostly copies still fly, by the
    /// engine's group: their bits end when the copies land (md's `md_bitmap_endwrite`
    /// from the behind write's end).
    pub(super) behind: DetMap<u64, WriteInFlight>,
    pub(super) rmws: Vec<Rmw>,
    pub(super) splits: DetMap<RequestId, Split>,
    pub(super) internal: DetMap<RequestId, Internal>,
    pub(super) next_internal: RequestId,
    pub(super) arrivals: u64,
    /// Requests of the array's own (and writes it released) waiting for room in the engine.
    pub(super) to_engine: VecDeque<Request>,
    pub(super) out_done: VecDeque<RequestCompletion>,
    // Upkeep (see `upkeep_ops`).
    /// Failures and bad-block ranges not yet in the superblocks.
    pub(super) records_pending: u32,
    pub(super) write_generation: u64,
    pub(super) seen_generation: u64,
    /// A safe-mode flush is out: writes wait until it is answered.
    pub(super) clean_flush: bool,
    pub(super) checkpoint_out: bool,
    pub(super) daemon_queued: bool,
    /// Bitmap activity since the daemon's last pass (a pass may then find bits to clear).
    pub(super) bitmap_activity: bool,
    pub(super) recovery_unrecorded: Vec<usize>,
    /// Slots a hot spare should take as soon as the engine lets it (I/O still draining).
    pub(super) spare_wanted: Vec<usize>,
    /// Replacement slots whose flush or promotion is under way.
    pub(super) promoting: Vec<usize>,
    pub(super) closing: Option<Closing>,
    pub(super) notices: VecDeque<String>,
    /// Members the array no longer uses: the caller may close them.
    pub(super) released: Vec<MemberKey>,
    pub(super) names: BTreeMap<MemberKey, String>,
    /// (time, done sectors) of the running sync, for its speed.
    pub(super) sync_samples: VecDeque<(TimeNs, u64)>,
    pub(super) last_sample_ns: TimeNs,
    /// A reshape while serving (see `reshape_ops`). Boxed and None otherwise.
    pub(super) reshaping: Option<Box<super::reshaping::Reshaping>>,
    /// A level takeover while serving (see `takeover`). Boxed and None otherwise.
    pub(super) takeover: Option<Box<super::reshaping::Takeover>>,
    /// A raid0 grow under way (see `raid0_grow`): the raid0 member count it ends at.
    pub(super) raid0_grow: Option<usize>,
    /// Devices are being `--add`ed to a raid0 for its grow (`may_add_for_grow`).
    pub(super) raid0_grow_adds: bool,
}

/// How often the running sync's position is sampled for its speed.
pub(super) const SYNC_SAMPLE_NS: TimeNs = 500_000_000;
/// The window the sync speed is averaged over.
pub(super) const SYNC_SPEED_WINDOW_NS: TimeNs = 5_000_000_000;

impl Array {
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, for tests and tunables that act on it directly.
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    pub fn superblocks(&self) -> &ArraySuperblocks {
        &self.sbs
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// A line for the operator (a member failed, a recovery ended), oldest first.
    pub fn pop_notice(&mut self) -> Option<String> {
        self.notices.pop_front()
    }

    /// Members the array stopped using (removed, replaced, a failed spare): the caller may
    /// close them and drop its claim.
    pub fn take_released(&mut self) -> Vec<MemberKey> {
        self.released.sort_unstable();
        self.released.dedup();
        let (busy, out): (Vec<MemberKey>, Vec<MemberKey>) =
            self.released.iter().partition(|&&k| self.rounds.busy_with(k));
        self.released = busy;
        out
    }

    /// Superblock time: the caller's wall clock at start plus the time since.
    pub(super) fn now_seconds(&self) -> u64 {
        self.epoch_seconds + self.now_ns / 1_000_000_000
    }

    pub(super) fn notice(&mut self, text: String) {
        // Bounded: an operator who never reads them must not grow the array's memory.
        if self.notices.len() >= 256 {
            self.notices.pop_front();
        }
        self.notices.push_back(text);
    }

    pub(super) fn name_of(&self, key: MemberKey) -> String {
        self.names.get(&key).cloned().unwrap_or_else(|| format!("member {key}"))
    }

    /// A fresh id for a request of the array's own.
    pub(super) fn internal_id(&mut self) -> RequestId {
        self.next_internal = (self.next_internal + 1) % WRITE_TAG;
        INTERNAL_TAG | self.next_internal
    }

    /// Room for one more request, in the engine and in the array's own queues.
    pub(super) fn has_room(&self) -> bool {
        let max = self.engine.tunables().max_inflight_requests;
        self.engine.inflight_requests() < max
            && self.held.len() + self.to_engine.len() + self.rmws.len() + self.splits.len() < max
    }

    /// Requests of the array's own, and released writes, into the engine while it has room.
    pub(super) fn feed_engine(&mut self) {
        while let Some(req) = self.to_engine.pop_front() {
            if let Err(SubmitError::Busy(req)) = self.engine_submit(req) {
                self.to_engine.push_front(req);
                break;
            }
        }
    }

    /// The engine's completions: the callers' to `out_done`, the array's own handled.
    fn drain_completions(&mut self) -> bool {
        let mut any = false;
        while let Some(c) = self.pop_engine_completion() {
            any = true;
            if c.id & (WRITE_TAG | INTERNAL_TAG) == 0 {
                self.out_done.push_back(c);
                continue;
            }
            if c.id & WRITE_TAG != 0 {
                self.write_done(c.id, c.result.is_ok());
            }
            let id = c.id & !WRITE_TAG;
            if id & INTERNAL_TAG == 0 {
                self.out_done.push_back(RequestCompletion { id, result: c.result });
            } else {
                self.internal_done(id, c.result);
            }
        }
        any
    }

    /// After every entry point: the engine's completions (the array's own handled here, so
    /// what they lead to is out before the driver looks for member I/O), engine events,
    /// rounds, held writes, the array's requests.
    pub(super) fn settle(&mut self) {
        loop {
            let mut progress = self.drain_completions();
            progress |= self.service_prev_events();
            progress |= self.service_events();
            progress |= self.pump_rounds();
            progress |= self.pump_reshape();
            progress |= self.pump_takeover();
            progress |= self.pump_raid0_grow();
            progress |= self.release_held();
            self.feed_engine();
            if !progress {
                break;
            }
        }
    }
}

impl ArrayEngine for Array {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        self.now_ns = self.now_ns.max(now_ns);
        let timed = (req.op != RequestOp::Flush).then_some((req.id, req.len_bytes));
        let r = self.admit(req);
        if let (Ok(()), Some((id, len)), Some(reshaping)) = (&r, timed, self.reshaping.as_deref_mut()) {
            reshaping.pacer.admitted(id, len, self.now_ns);
        }
        self.settle();
        r
    }

    fn unplug(&mut self, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        self.engine.unplug(now_ns);
        self.reshape_unplug(now_ns);
        self.settle();
    }

    fn pop_member_io(&mut self) -> Option<MemberIo> {
        if let Some(io) = self.rounds.pop_io() {
            return Some(io);
        }
        self.engine.pop_member_io().or_else(|| self.pop_prev_member_io())
    }

    fn complete_member_io(&mut self, completion: MemberIoCompletion, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        if is_array_meta_io(completion.id) {
            if self.rounds.complete(completion.id, completion.result.is_ok()) {
                self.settle();
            }
            return;
        }
        if Array::is_prev_member_io(completion.id) {
            self.complete_prev_member_io(completion, now_ns);
        } else {
            self.engine.complete_member_io(completion, now_ns);
        }
        self.settle();
    }

    fn pop_completion(&mut self) -> Option<RequestCompletion> {
        let c = self.out_done.pop_front()?;
        if let Some(r) = self.reshaping.as_deref_mut() {
            r.pacer.completed(c.id, self.now_ns);
        }
        Some(c)
    }

    fn next_deadline_ns(&self) -> Option<TimeNs> {
        [self.engine.next_deadline_ns(), self.upkeep_deadline_ns(), self.reshape_deadline_ns()]
            .into_iter()
            .flatten()
            .min()
    }

    fn tick(&mut self, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        if self.engine.next_deadline_ns().is_some_and(|d| d <= now_ns) {
            self.engine.tick(now_ns);
        }
        self.reshape_tick(now_ns);
        self.upkeep_tick();
        self.settle();
    }

    fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        self.engine.fail_member(member, now_ns);
        self.reshape_member_failed(member);
        self.settle();
    }

    fn is_idle(&self) -> bool {
        self.engine.is_idle()
            && self.rounds.is_idle()
            && self.held.is_empty()
            && self.to_engine.is_empty()
            && self.rmws.is_empty()
            && self.internal.is_empty()
            && self.out_done.is_empty()
            && self.reshape_idle()
            && self.takeover.is_none()
    }

    fn outstanding(&self) -> String {
        format!(
            "engine {}, rounds {} (done {}), held {}, to_engine {}, rmws {}, internal {}, out_done {}, \
             records {}, closing {:?}, reshape {:?}, takeover {:?}",
            if self.engine.is_idle() { "idle".to_string() } else { self.engine.describe_outstanding() },
            self.rounds.describe(),
            self.rounds.done_seq(),
            self.held.len(),
            self.to_engine.len(),
            self.rmws.len(),
            self.internal.len(),
            self.out_done.len(),
            self.records_pending,
            self.closing,
            self.reshaping.as_deref().map(|r| (
                &r.step,
                r.out,
                r.failed,
                r.waiting.len(),
                r.prev.as_deref().map(|p| p.describe_outstanding())
            )),
            self.takeover.as_deref().map(|t| (t.recorded, t.swapped, t.waiting.len()))
        )
    }

    fn stats_snapshot(&self) -> ArrayStats {
        self.engine.stats().clone()
    }

    fn finish_close(
        &mut self,
        flush: Result<(), RequestError>,
        now_ns: TimeNs,
    ) -> Option<Result<(), RequestError>> {
        self.now_ns = self.now_ns.max(now_ns);
        let r = self.close_step(flush);
        self.settle();
        r
    }
}

/// Set on the ids of writes the array hands the engine (callers' ids stay below it).
pub(super) const WRITE_TAG: RequestId = 1 << 57;
/// Set on the ids of the array's own requests.
pub(super) const INTERNAL_TAG: RequestId = 1 << 58;

/// A write held until round `wait_seq` is done.
pub(super) struct Held {
    pub req: Request,
    pub wait_seq: RoundSeq,
    pub arrival: u64,
    /// Array sectors `[start, end)`.
    pub span: (u64, u64),
    pub sync_range: Option<SyncRanges>,
}

/// A write in the engine (by the id the engine has).
pub(super) struct WriteInFlight {
    pub span: (u64, u64),
    pub sync_range: Option<SyncRanges>,
}

/// A caller's request split into several of the array's own.
pub(super) struct Split {
    pub parts_left: u32,
    pub error: Option<RequestError>,
}

/// A read-modify-write of the edge sectors `span` of a caller's unaligned write.
pub(super) struct Rmw {
    pub arrival: u64,
    pub caller: RequestId,
    pub span: (u64, u64),
    /// Where the caller's bytes go in the span, and what they are (None: zeroes).
    pub patch_at: usize,
    pub patch_len: usize,
    pub patch: Option<Vec<u8>>,
    pub fua: bool,
    pub started: bool,
}

/// A request of the array's own, by its id.
pub(super) enum Internal {
    Flush(AfterFlush),
    /// An unaligned read, widened to whole sectors: the caller's id, bytes to drop in front,
    /// the caller's length.
    WidenedRead {
        caller: RequestId,
        skip: usize,
        len: usize,
    },
    /// The sector-aligned middle of a caller's unaligned write.
    Part {
        caller: RequestId,
    },
    RmwRead {
        arrival: u64,
    },
    RmwWrite {
        arrival: u64,
    },
}
