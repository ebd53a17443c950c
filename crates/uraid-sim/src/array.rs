//! [`SimArray`]: an engine driven against simulated members in virtual time.

use std::collections::{BTreeMap, HashMap, VecDeque};

use uraid_core::{
    MemberIo, MemberIoCompletion, MemberIoOp, Request, RequestCompletion, RequestId, SubmitError,
};

/// The parts of a merged member I/O: (original id, byte offset in the merged I/O, length).
type MergedParts = Vec<(u64, u64, u64)>;

/// Largest member I/O a merge builds (Linux's default max_sectors_kb is 1280 KiB on SATA).
pub const MAX_MERGED_MEMBER_IO_BYTES: u64 = 1 << 20;

use crate::disks::{FaultKind, SimDisks};
use crate::store::PowerLossPolicy;
use uraid_core::{drive, ArrayEngine};

/// A finished request with its virtual times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedCompletion {
    pub completion: RequestCompletion,
    /// When the request was handed to `SimArray` (its scheduled time for `submit_at`).
    pub submitted_ns: u64,
    pub completed_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Nothing left to do: no request, member I/O, engine deadline or scheduled submission.
    Idle,
    /// `run_until`'s time was reached with work still pending.
    TimeReached,
    /// A scheduled power-loss fault fired at this time. The engine must not run on:
    /// call [`SimArray::crash`] and build a new engine on the disks.
    PowerLost { at_ns: u64 },
    /// The engine holds work but asks for nothing (no member I/O, no deadline): an engine bug.
    Stalled,
}

/// What a crash leaves behind.
pub struct Crash {
    /// The members after the power cut: durable contents only, queues empty, same clock.
    pub disks: SimDisks,
    /// Completions not yet taken with `take_completions`.
    pub completions: Vec<TimedCompletion>,
    /// Requests handed in but never acknowledged: their writes may be in any state.
    pub unacknowledged: Vec<RequestId>,
}

/// The simulated members as the driver's executor (`uraid_core::drive`): what the engine
/// issues at one instant waits in `issued` until `unplug` hands it to the disks, and the
/// disks' completions wait in `done` for the driver's poll.
struct SimMembers {
    disks: SimDisks,
    issued: Vec<MemberIo>,
    done: Vec<MemberIoCompletion>,
    /// Merge adjacent member I/Os issued at the same instant, as the member's block-layer
    /// queue does under a plug (Linux's elevator below md).
    merge_member_ios: bool,
    /// Merged member I/O -> its parts (original id, byte offset in the merged I/O, length).
    merged: HashMap<u64, MergedParts>,
    next_merged_id: u64,
    /// A member failure set to fall on a metadata I/O of the array's (see [`MetaTrap`]).
    meta_trap: Option<MetaTrap>,
    meta_trap_hit: Option<MetaTrapHit>,
}

/// How a [`MetaTrap`] fails its member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaTrapHow {
    /// The metadata write fails (the member's writes to that area fail from then on).
    WriteError,
    /// The member stops (fail-stop) with the I/O in flight.
    FailStop,
    /// The member's link is lost with the I/O in flight (it comes back later, stale).
    Dropped,
}

/// A member failure that falls on one of the array's metadata I/Os (a superblock, bitmap
/// or bad-block-log write or its flush) as it is issued, so a metadata round is in flight:
/// the `skip + 1`-th such I/O to `member` (writes only for `WriteError`, only at `only_at`
/// when given), counted only once another member has failed when `after_failure` (a
/// failure-recording round).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaTrap {
    pub member: usize,
    pub skip: u64,
    pub how: MetaTrapHow,
    pub after_failure: bool,
    /// Count only the metadata I/Os at this member byte offset (the superblock's: the
    /// dirty-marking, clean-marking and failure-recording rounds).
    pub only_at: Option<u64>,
}

/// The metadata I/O a [`MetaTrap`] fell on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaTrapHit {
    pub member: usize,
    pub op: MemberIoOp,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub at_ns: u64,
}

impl drive::MemberExecutor for SimMembers {
    fn issue(&mut self, io: MemberIo) {
        self.issued.push(io);
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        out.append(&mut self.done);
    }
}

impl SimMembers {
    /// Hands what was issued at this instant to the disks, merged as a plugged queue would.
    fn unplug(&mut self) {
        let ios = std::mem::take(&mut self.issued);
        let fail_after = self.spring_meta_trap(&ios);
        self.submit_all(ios);
        if let Some((member, kind)) = fail_after {
            self.disks.fault_now(member, kind);
        }
    }

    /// Checks `ios` against the metadata trap: a write error is set before they go, a
    /// member failure is returned to fire once they went.
    fn spring_meta_trap(&mut self, ios: &[MemberIo]) -> Option<(usize, FaultKind)> {
        let trap = self.meta_trap.as_mut()?;
        if trap.after_failure
            && !(0..self.disks.member_count()).any(|d| d != trap.member && self.disks.is_failed(d))
        {
            return None;
        }
        for io in ios {
            if io.member != trap.member
                || !uraid_core::is_array_meta_io(io.id)
                || (trap.how == MetaTrapHow::WriteError && io.op != MemberIoOp::Write)
                || trap.only_at.is_some_and(|at| io.op != MemberIoOp::Write || io.offset_bytes != at)
            {
                continue;
            }
            if trap.skip > 0 {
                trap.skip -= 1;
                continue;
            }
            let trap = self.meta_trap.take().expect("armed");
            self.meta_trap_hit = Some(MetaTrapHit {
                member: trap.member,
                op: io.op,
                offset_bytes: io.offset_bytes,
                len_bytes: io.len_bytes,
                at_ns: self.disks.now_ns(),
            });
            return match trap.how {
                MetaTrapHow::WriteError => {
                    let kind =
                        FaultKind::WriteErrors { offset_bytes: io.offset_bytes, len_bytes: io.len_bytes };
                    self.disks.fault_now(trap.member, kind);
                    None
                }
                MetaTrapHow::FailStop => Some((trap.member, FaultKind::FailStop)),
                MetaTrapHow::Dropped => Some((trap.member, FaultKind::Dropped)),
            };
        }
        None
    }

    fn submit_all(&mut self, ios: Vec<MemberIo>) {
        if !self.merge_member_ios {
            for io in ios {
                self.disks.submit(io);
            }
            return;
        }
        // (merged io, its parts); `open[member]` is the run still growing on that member.
        let mut out: Vec<(MemberIo, MergedParts, Vec<u8>)> = Vec::new();
        let mut open: HashMap<usize, usize> = HashMap::new();
        for io in ios {
            let mergeable = matches!(io.op, MemberIoOp::Read | MemberIoOp::Write);
            if mergeable {
                if let Some(&i) = open.get(&io.member) {
                    let (m, parts, data) = &mut out[i];
                    if m.op == io.op
                        && m.offset_bytes + m.len_bytes == io.offset_bytes
                        && m.len_bytes + io.len_bytes <= MAX_MERGED_MEMBER_IO_BYTES
                    {
                        parts.push((io.id, m.len_bytes, io.len_bytes));
                        if io.op == MemberIoOp::Write {
                            if data.is_empty() {
                                data.extend_from_slice(&m.data);
                            }
                            data.extend_from_slice(&io.data);
                        }
                        m.len_bytes += io.len_bytes;
                        continue;
                    }
                }
            }
            let parts = vec![(io.id, 0, io.len_bytes)];
            if mergeable {
                open.insert(io.member, out.len());
            } else {
                open.remove(&io.member);
            }
            out.push((io, parts, Vec::new()));
        }
        for (mut io, parts, data) in out {
            if parts.len() > 1 {
                let id = self.next_merged_id;
                self.next_merged_id += 1;
                io.id = id;
                if io.op == MemberIoOp::Write {
                    io.data = data.into();
                }
                self.merged.insert(id, parts);
            }
            self.disks.submit(io);
        }
    }

    /// A disk's completion, split back into the engine's I/Os if it was a merge.
    fn completed(&mut self, c: MemberIoCompletion) {
        let Some(parts) = self.merged.remove(&c.id) else {
            self.done.push(c);
            return;
        };
        for (id, at, len) in parts {
            let result = match &c.result {
                Ok(data) if !data.is_empty() => Ok(data[at as usize..(at + len) as usize].to_vec()),
                Ok(_) => Ok(Vec::new()),
                Err(e) => Err(*e),
            };
            self.done.push(MemberIoCompletion { id, result });
        }
    }
}

pub struct SimArray<E: ArrayEngine> {
    engine: E,
    members: SimMembers,
    /// (time, sequence) -> request, so equal times keep submission order.
    scheduled: BTreeMap<(u64, u64), Request>,
    scheduled_seq: u64,
    /// Refused with Busy (or queued behind one that was): retried in order.
    backlog: VecDeque<Request>,
    submitted_ns: HashMap<RequestId, u64>,
    completions: Vec<TimedCompletion>,
    scratch: Vec<MemberIoCompletion>,
    last_tick_ns: Option<u64>,
    /// Requests completed per member I/O, for reporting.
    requests_completed: u64,
    /// `run_until_completion`: return as soon as a request completion is waiting.
    stop_on_completion: bool,
}

impl<E: ArrayEngine> SimArray<E> {
    pub fn new(engine: E, disks: SimDisks) -> Self {
        SimArray {
            engine,
            members: SimMembers {
                disks,
                issued: Vec::new(),
                done: Vec::new(),
                merge_member_ios: false,
                merged: HashMap::new(),
                next_merged_id: 1 << 62,
                meta_trap: None,
                meta_trap_hit: None,
            },
            scheduled: BTreeMap::new(),
            scheduled_seq: 0,
            backlog: VecDeque::new(),
            submitted_ns: HashMap::new(),
            completions: Vec::new(),
            scratch: Vec::new(),
            last_tick_ns: None,
            requests_completed: 0,
            stop_on_completion: false,
        }
    }

    /// Merge adjacent reads (and writes) the engine issues to one member at one instant,
    /// up to `MAX_MERGED_MEMBER_IO_BYTES`, like a member disk's request queue under a plug.
    pub fn set_member_merging(&mut self, on: bool) {
        self.members.merge_member_ios = on;
    }

    pub fn now_ns(&self) -> u64 {
        self.members.disks.now_ns()
    }

    /// Arms a member failure to fall on a metadata I/O (see [`MetaTrap`]).
    pub fn set_meta_trap(&mut self, trap: MetaTrap) {
        self.members.meta_trap = Some(trap);
    }

    /// The metadata I/O the trap fell on, if it did.
    pub fn meta_trap_hit(&self) -> Option<MetaTrapHit> {
        self.members.meta_trap_hit
    }
    pub fn engine(&self) -> &E {
        &self.engine
    }
    pub fn engine_mut(&mut self) -> &mut E {
        &mut self.engine
    }
    pub fn disks(&self) -> &SimDisks {
        &self.members.disks
    }
    pub fn disks_mut(&mut self) -> &mut SimDisks {
        &mut self.members.disks
    }
    pub fn requests_completed(&self) -> u64 {
        self.requests_completed
    }
    /// Requests handed in and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.submitted_ns.len() + self.scheduled.len()
    }

    /// Hand a request in at the current virtual time (taken by the engine on the next run).
    pub fn submit(&mut self, req: Request) {
        let now = self.now_ns();
        self.submit_at(now, req);
    }

    /// Hand a request in at a virtual time (not earlier than now).
    pub fn submit_at(&mut self, at_ns: u64, req: Request) {
        let at = at_ns.max(self.now_ns());
        self.scheduled_seq += 1;
        self.scheduled.insert((at, self.scheduled_seq), req);
    }

    /// mdadm --fail: the engine marks the member faulty (the simulated disk stays healthy).
    pub fn fail_member(&mut self, member: usize) {
        let now = self.now_ns();
        self.engine.fail_member(member, now);
    }

    /// Completions so far, in completion order.
    pub fn completions(&self) -> &[TimedCompletion] {
        &self.completions
    }
    pub fn take_completions(&mut self) -> Vec<TimedCompletion> {
        std::mem::take(&mut self.completions)
    }

    pub fn run_until_idle(&mut self) -> RunOutcome {
        self.run(None)
    }

    /// Run until virtual time `t_ns` (the clock ends there unless idle or power was lost first).
    pub fn run_until(&mut self, t_ns: u64) -> RunOutcome {
        self.run(Some(t_ns))
    }

    /// As `run_until`, but return (with `TimeReached`) as soon as a request completion is
    /// waiting in `completions`, the clock at its time: for a caller that reacts to each
    /// completion when it happens.
    pub fn run_until_completion(&mut self, t_ns: u64) -> RunOutcome {
        self.stop_on_completion = true;
        let outcome = self.run(Some(t_ns));
        self.stop_on_completion = false;
        outcome
    }

    fn run(&mut self, limit_ns: Option<u64>) -> RunOutcome {
        loop {
            if let Some(at_ns) = self.members.disks.power_lost_at() {
                return RunOutcome::PowerLost { at_ns };
            }
            self.pump();
            if self.stop_on_completion && !self.completions.is_empty() {
                return RunOutcome::TimeReached;
            }
            let now = self.now_ns();
            let t_disk = self.members.disks.next_event_ns();
            let t_sub =
                if self.backlog.is_empty() { self.scheduled.keys().next().map(|k| k.0) } else { None };
            let t_dead = self.engine.next_deadline_ns().map(|d| {
                // An engine that leaves its deadline in the past after a tick at this very
                // instant would spin the loop: look at it again one nanosecond later.
                if d <= now && self.last_tick_ns == Some(now) {
                    now + 1
                } else {
                    d.max(now)
                }
            });
            let next = [t_disk, t_sub, t_dead].into_iter().flatten().min();
            let Some(next) = next else {
                if self.engine.is_idle() && self.backlog.is_empty() && self.members.disks.is_idle() {
                    return RunOutcome::Idle;
                }
                return RunOutcome::Stalled;
            };
            if let Some(limit) = limit_ns {
                if next > limit {
                    self.members.disks.advance_to(limit, &mut self.scratch);
                    debug_assert!(self.scratch.is_empty());
                    return RunOutcome::TimeReached;
                }
            }
            if t_disk == Some(next) {
                self.scratch.clear();
                self.members.disks.run_next(&mut self.scratch);
                for c in self.scratch.drain(..) {
                    self.members.completed(c);
                }
            } else {
                self.members.disks.advance_to(next, &mut self.scratch);
            }
            let now = self.now_ns();
            if self.members.disks.power_lost_at().is_some() {
                // What landed before the cut still reaches the engine; no timer runs after it.
                for c in std::mem::take(&mut self.members.done) {
                    self.engine.complete_member_io(c, now);
                }
                continue;
            }
            let pumped =
                drive::pump(&mut self.engine, &mut self.members, &mut || now, &mut self.scratch, |c| {
                    self.requests_completed += 1;
                    let submitted_ns = self.submitted_ns.remove(&c.id).unwrap_or(now);
                    self.completions.push(TimedCompletion { completion: c, submitted_ns, completed_ns: now });
                });
            if pumped.ticked {
                self.last_tick_ns = Some(now);
            }
        }
    }

    /// Everything that happens at one instant without the clock moving.
    fn pump(&mut self) {
        let now = self.now_ns();
        let mut submitted = false;
        loop {
            while let Some(req) = self.backlog.pop_front() {
                match self.engine.submit(req, now) {
                    Ok(()) => submitted = true,
                    Err(SubmitError::Busy(req)) => {
                        self.backlog.push_front(req);
                        break;
                    }
                }
            }
            if self.backlog.is_empty() {
                while let Some(entry) = self.scheduled.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let ((at, _), req) = entry.remove_entry();
                    self.submitted_ns.insert(req.id, at);
                    match self.engine.submit(req, now) {
                        Ok(()) => submitted = true,
                        Err(SubmitError::Busy(req)) => {
                            self.backlog.push_back(req);
                            break;
                        }
                    }
                }
            }
            if submitted {
                self.engine.unplug(now);
                submitted = false;
            }
            let (completions, submitted_ns, requests_completed) =
                (&mut self.completions, &mut self.submitted_ns, &mut self.requests_completed);
            let pumped =
                drive::exchange(&mut self.engine, &mut self.members, &mut || now, &mut self.scratch, |c| {
                    *requests_completed += 1;
                    let submitted_ns = submitted_ns.remove(&c.id).unwrap_or(now);
                    completions.push(TimedCompletion { completion: c, submitted_ns, completed_ns: now });
                });
            self.members.unplug();
            let progressed = pumped.any();
            // A completion may have freed room for a request refused with Busy, or led the
            // engine to issue more (an array's metadata round after a flush it waited for).
            if !progressed {
                break;
            }
        }
    }

    /// Cut the power now (or take the power loss a fault already caused): the engine is
    /// dropped mid-flight, the members keep only what was durable (plus whatever unflushed
    /// writes `policy` lets survive).
    pub fn crash(mut self, policy: &PowerLossPolicy) -> Crash {
        if self.members.disks.take_power_loss().is_none() {
            self.members.disks.power_loss(policy);
        }
        let mut unacknowledged: Vec<RequestId> = self.submitted_ns.keys().copied().collect();
        unacknowledged.extend(self.backlog.iter().map(|r| r.id));
        unacknowledged.sort_unstable();
        unacknowledged.dedup();
        Crash { disks: self.members.disks, completions: self.completions, unacknowledged }
    }

    /// Stop without a crash: the disks as they are (unflushed writes still volatile).
    pub fn into_disks(self) -> SimDisks {
        self.members.disks
    }
}
