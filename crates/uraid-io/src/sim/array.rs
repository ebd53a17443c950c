//! [`SimArray`]: an engine driven against simulated members in virtual time.

use std::collections::{BTreeMap, HashMap, VecDeque};

use uraid_core::{MemberIoCompletion, Request, RequestCompletion, RequestId, SubmitError};

use super::disks::SimDisks;
use super::store::PowerLossPolicy;
use crate::engine::ArrayEngine;

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

pub struct SimArray<E: ArrayEngine> {
    engine: E,
    disks: SimDisks,
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
}

impl<E: ArrayEngine> SimArray<E> {
    pub fn new(engine: E, disks: SimDisks) -> Self {
        SimArray {
            engine,
            disks,
            scheduled: BTreeMap::new(),
            scheduled_seq: 0,
            backlog: VecDeque::new(),
            submitted_ns: HashMap::new(),
            completions: Vec::new(),
            scratch: Vec::new(),
            last_tick_ns: None,
            requests_completed: 0,
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.disks.now_ns()
    }
    pub fn engine(&self) -> &E {
        &self.engine
    }
    pub fn engine_mut(&mut self) -> &mut E {
        &mut self.engine
    }
    pub fn disks(&self) -> &SimDisks {
        &self.disks
    }
    pub fn disks_mut(&mut self) -> &mut SimDisks {
        &mut self.disks
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

    fn run(&mut self, limit_ns: Option<u64>) -> RunOutcome {
        loop {
            if let Some(at_ns) = self.disks.power_lost_at() {
                return RunOutcome::PowerLost { at_ns };
            }
            self.pump();
            let now = self.now_ns();
            let t_disk = self.disks.next_event_ns();
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
                if self.engine.is_idle() && self.backlog.is_empty() && self.disks.is_idle() {
                    return RunOutcome::Idle;
                }
                return RunOutcome::Stalled;
            };
            if let Some(limit) = limit_ns {
                if next > limit {
                    self.disks.advance_to(limit, &mut self.scratch);
                    debug_assert!(self.scratch.is_empty());
                    return RunOutcome::TimeReached;
                }
            }
            if t_disk == Some(next) {
                self.scratch.clear();
                self.disks.run_next(&mut self.scratch);
                let now = self.now_ns();
                for c in self.scratch.drain(..) {
                    self.engine.complete_member_io(c, now);
                }
            } else {
                self.disks.advance_to(next, &mut self.scratch);
            }
            let now = self.now_ns();
            if self.engine.next_deadline_ns().is_some_and(|d| d <= now)
                && self.disks.power_lost_at().is_none()
            {
                self.engine.tick(now);
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
            let mut progressed = false;
            while let Some(io) = self.engine.pop_member_io() {
                self.disks.submit(io);
                progressed = true;
            }
            while let Some(c) = self.engine.pop_completion() {
                let submitted_ns = self.submitted_ns.remove(&c.id).unwrap_or(now);
                self.requests_completed += 1;
                self.completions.push(TimedCompletion { completion: c, submitted_ns, completed_ns: now });
                progressed = true;
            }
            // A completion may have freed room for a request refused with Busy.
            if !progressed || self.backlog.is_empty() {
                break;
            }
        }
    }

    /// Cut the power now (or take the power loss a fault already caused): the engine is
    /// dropped mid-flight, the members keep only what was durable (plus whatever unflushed
    /// writes `policy` lets survive).
    pub fn crash(mut self, policy: &PowerLossPolicy) -> Crash {
        if self.disks.take_power_loss().is_none() {
            self.disks.power_loss(policy);
        }
        let mut unacknowledged: Vec<RequestId> = self.submitted_ns.keys().copied().collect();
        unacknowledged.extend(self.backlog.iter().map(|r| r.id));
        unacknowledged.sort_unstable();
        unacknowledged.dedup();
        Crash { disks: self.disks, completions: self.completions, unacknowledged }
    }

    /// Stop without a crash: the disks as they are (unflushed writes still volatile).
    pub fn into_disks(self) -> SimDisks {
        self.disks
    }
}
