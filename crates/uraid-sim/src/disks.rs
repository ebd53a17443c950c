//! Simulated members in virtual time: queues, timing models, contents, faults, statistics
//! and the trace hash. [`SimDisks`] is an executor for `MemberIo`s: submit at the current
//! virtual time, then let events run; completions come out at their virtual times.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use uraid_core::{MemberIo, MemberIoCompletion, MemberIoError, MemberIoOp};

use crate::model::{model_for, DiskModel, QueuedIo};
use crate::profile::{DiskProfile, ProfileError};
use crate::store::{MemberStore, PowerLossPolicy, PowerLossReport};
use crate::trace::TraceHasher;
use uraid_core::rng::Rng;

/// Queue depths at or above this share the histogram's last bucket.
pub const QUEUE_DEPTH_BUCKETS: usize = 65;

#[derive(Clone, Debug, PartialEq)]
pub struct SimMemberConfig {
    pub profile: DiskProfile,
    /// At most the profile's capacity; a smaller member sits at the drive's outer start.
    pub size_bytes: u64,
}

impl SimMemberConfig {
    pub fn new(profile: DiskProfile, size_bytes: u64) -> Self {
        SimMemberConfig { profile, size_bytes }
    }
    pub fn builtin(profile_name: &str, size_bytes: u64) -> Result<Self, ProfileError> {
        Ok(SimMemberConfig { profile: DiskProfile::builtin(profile_name)?, size_bytes })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimMemberStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    /// Virtual time with at least one command in service.
    pub busy_ns: u64,
    /// Sum over completed I/Os of completion minus submission time.
    pub latency_ns_total: u64,
    pub max_queue_depth: u64,
    /// Virtual time spent at each queue depth (submitted, not completed); index = depth,
    /// the last bucket holds all deeper ones.
    pub queue_depth_time_ns: Vec<u64>,
}

impl SimMemberStats {
    pub fn ios(&self) -> u64 {
        self.reads + self.writes + self.flushes
    }
    /// Time-weighted mean queue depth over the time the histogram covers.
    pub fn mean_queue_depth(&self) -> f64 {
        let total: u64 = self.queue_depth_time_ns.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let weighted: f64 =
            self.queue_depth_time_ns.iter().enumerate().map(|(d, &t)| d as f64 * t as f64).sum();
        weighted / total as f64
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FaultKind {
    /// The member disappears: every queued and later I/O fails with `Gone`.
    FailStop,
    /// As `FailStop`, but only the link is lost: the drive keeps power and its write cache
    /// reaches the media. Such a member can come back ([`SimDisks::revive_member`]) with
    /// everything it acknowledged, stale only by what was written after it left.
    Dropped,
    /// Reads touching the range fail with `Io` until its sectors are rewritten.
    LatentErrors { offset_bytes: u64, len_bytes: u64 },
    /// Bits flipped in the stored data of the range; reads succeed with the damage.
    Corrupt { offset_bytes: u64, len_bytes: u64, bit_flips: u32 },
    /// Service times multiplied by `latency_percent / 100` from now on.
    Slow { latency_percent: u32 },
    /// Power cut to every member (the fault's `member` is ignored). See [`SimDisks::power_loss`].
    PowerLoss(PowerLossPolicy),
    /// Writes touching the member byte range fail with `Io` from now on and change nothing
    /// (a range over the data, the superblock or the bitmap: md fails the member either way).
    WriteErrors { offset_bytes: u64, len_bytes: u64 },
    /// Every flush of the member fails with `Io` from now on and makes nothing durable
    /// (a cache flush error: md fails the member as for a failed write).
    FlushErrors,
    /// The member stops answering (a wedged disk, a dead path): no I/O in flight or sent
    /// later completes, until `timeout_ns` later the executor's member timeout answers
    /// `Gone` for every one it holds and the member is failed (as `FailStop` then).
    Hang { timeout_ns: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTrigger {
    AtNs(u64),
    /// When the member (all members, for power loss) has completed this many I/Os.
    AfterMemberIos(u64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fault {
    pub trigger: FaultTrigger,
    pub member: usize,
    pub kind: FaultKind,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FaultRecord {
    pub at_ns: u64,
    pub fault: Fault,
    /// For `Corrupt`: the byte offsets damaged. Empty otherwise.
    pub corrupted_offsets: Vec<u64>,
    /// For `PowerLoss`: what happened on each member.
    pub power_loss: Vec<PowerLossReport>,
}

#[derive(Debug)]
struct Pending {
    io: MemberIo,
    arrival_ns: u64,
}

#[derive(Debug)]
struct Active {
    io: MemberIo,
    arrival_ns: u64,
    flush_mark: u64,
}

struct Member {
    store: MemberStore,
    model: Box<dyn DiskModel>,
    channels: usize,
    queue_depth: usize,
    reorders: bool,
    queue: VecDeque<Pending>,
    /// `queue` as the model sees it, entry for entry: handed to it as a slice, so a start
    /// copies nothing.
    queued: Vec<QueuedIo>,
    /// Flushes in `queue`: with none, nothing cuts the model's slice short.
    flushes_queued: usize,
    active: Vec<Option<Active>>,
    active_count: usize,
    failed: bool,
    /// Member byte ranges `[start, end)` whose writes fail (`FaultKind::WriteErrors`).
    write_error_ranges: Vec<(u64, u64)>,
    /// `FaultKind::FlushErrors` fired.
    flush_errors: bool,
    /// `FaultKind::Hang` fired and its timeout has not yet failed the member: nothing
    /// starts, nothing in flight completes.
    hung: bool,
    latency_percent: u32,
    completed_ios: u64,
    stats: SimMemberStats,
    last_account_ns: u64,
    /// Commands submitted so far: the next one's `QueuedIo::seq`.
    submitted: u64,
}

impl Member {
    /// A blank disk; `phase` picks its spindle's rotational phase (spindles of an array
    /// are not synchronised: each gets its own).
    fn new(c: &SimMemberConfig, seed: u64, phase: u64) -> Member {
        let phase_ns = Rng::derive(seed, 0x5EED_0000 + phase).next_u64();
        let model = model_for(&c.profile, phase_ns);
        Member {
            store: MemberStore::new(c.size_bytes, c.profile.write_cache()),
            channels: model.channels(),
            queue_depth: model.queue_depth().max(1),
            reorders: model.reorders(),
            active: (0..model.channels()).map(|_| None).collect(),
            model,
            queue: VecDeque::new(),
            queued: Vec::new(),
            flushes_queued: 0,
            active_count: 0,
            failed: false,
            write_error_ranges: Vec::new(),
            flush_errors: false,
            hung: false,
            latency_percent: 100,
            completed_ios: 0,
            stats: SimMemberStats { queue_depth_time_ns: vec![0; QUEUE_DEPTH_BUCKETS], ..Default::default() },
            last_account_ns: 0,
            submitted: 0,
        }
    }

    fn write_fails(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        self.write_error_ranges.iter().any(|&(a, b)| offset_bytes < b && a < offset_bytes + len_bytes)
    }

    fn depth(&self) -> usize {
        self.queue.len() + self.active_count
    }

    /// Charge the time since the last change to the current queue depth and busy state.
    fn account(&mut self, now_ns: u64) {
        let dt = now_ns - self.last_account_ns;
        if dt > 0 {
            let d = self.depth().min(QUEUE_DEPTH_BUCKETS - 1);
            self.stats.queue_depth_time_ns[d] += dt;
            if self.active_count > 0 {
                self.stats.busy_ns += dt;
            }
            self.last_account_ns = now_ns;
        }
    }
}

#[derive(Debug)]
enum EventKind {
    Done { member: usize, channel: usize },
    Immediate { member: usize, completion: MemberIoCompletion, op: MemberIoOp },
    Fault(usize),
}

#[derive(Debug)]
struct Event {
    at_ns: u64,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ns, self.seq) == (other.at_ns, other.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_ns, self.seq).cmp(&(other.at_ns, other.seq))
    }
}

const TAG_SUBMIT: u64 = 1;
const TAG_COMPLETE: u64 = 2;
const TAG_FAULT: u64 = 3;

fn op_code(op: MemberIoOp) -> u64 {
    match op {
        MemberIoOp::Read => 0,
        MemberIoOp::Write => 1,
        MemberIoOp::Flush => 2,
    }
}

fn result_code<T>(r: &Result<T, MemberIoError>) -> u64 {
    match r {
        Ok(_) => 0,
        Err(MemberIoError::Io) => 1,
        Err(MemberIoError::Gone) => 2,
    }
}

/// The simulated members of one array, with their virtual clock and event queue.
pub struct SimDisks {
    /// Each bay's disk profile, for a replacement disk put in it.
    configs: Vec<SimMemberConfig>,
    members: Vec<Member>,
    events: BinaryHeap<Reverse<Event>>,
    seq: u64,
    now_ns: u64,
    seed: u64,
    trace: TraceHasher,
    faults: Vec<Option<Fault>>,
    count_faults_pending: usize,
    fired: Vec<FaultRecord>,
    power_lost_at: Option<u64>,
    total_completed: u64,
    in_flight: usize,
}

impl SimDisks {
    pub fn new(configs: Vec<SimMemberConfig>, seed: u64) -> Result<Self, ProfileError> {
        let mut members = Vec::with_capacity(configs.len());
        for (i, c) in configs.iter().enumerate() {
            if c.size_bytes > c.profile.capacity_bytes() {
                return Err(ProfileError(format!(
                    "member {i}: {} bytes exceed profile {}'s capacity of {} bytes",
                    c.size_bytes,
                    c.profile.name(),
                    c.profile.capacity_bytes()
                )));
            }
            members.push(Member::new(c, seed, i as u64));
        }
        Ok(SimDisks {
            configs,
            members,
            events: BinaryHeap::new(),
            seq: 0,
            now_ns: 0,
            seed,
            trace: TraceHasher::new(),
            faults: Vec::new(),
            count_faults_pending: 0,
            fired: Vec::new(),
            power_lost_at: None,
            total_completed: 0,
            in_flight: 0,
        })
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }
    pub fn member_count(&self) -> usize {
        self.members.len()
    }
    pub fn store(&self, member: usize) -> &MemberStore {
        &self.members[member].store
    }
    /// For building initial images (e.g. writing superblocks before the engine starts).
    pub fn store_mut(&mut self, member: usize) -> &mut MemberStore {
        &mut self.members[member].store
    }
    pub fn is_failed(&self, member: usize) -> bool {
        self.members[member].failed
    }
    pub fn stats(&mut self, member: usize) -> &SimMemberStats {
        let now = self.now_ns;
        let m = &mut self.members[member];
        m.account(now);
        &m.stats
    }
    pub fn all_stats(&mut self) -> Vec<SimMemberStats> {
        (0..self.members.len()).map(|i| self.stats(i).clone()).collect()
    }
    /// Member I/Os completed (with any result) on all members.
    pub fn completed_ios(&self) -> u64 {
        self.total_completed
    }
    pub fn trace_hash(&self) -> u64 {
        self.trace.value()
    }
    pub fn trace_events(&self) -> u64 {
        self.trace.events()
    }
    /// Faults that have fired, in order.
    pub fn fault_log(&self) -> &[FaultRecord] {
        &self.fired
    }
    /// Submitted member I/Os not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
    /// Nothing submitted is outstanding (scheduled faults do not count).
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0
    }
    /// Set when a power-loss fault fired; cleared by `take_power_loss`.
    pub fn power_lost_at(&self) -> Option<u64> {
        self.power_lost_at
    }
    pub fn take_power_loss(&mut self) -> Option<u64> {
        self.power_lost_at.take()
    }

    /// Drops power-loss faults that have not fired (after a power cycle, the next run
    /// must not lose power again at a count the crashed run did not reach).
    pub fn cancel_power_loss(&mut self) {
        for f in self.faults.iter_mut() {
            if let Some(Fault { kind: FaultKind::PowerLoss(_), trigger, .. }) = *f {
                if matches!(trigger, FaultTrigger::AfterMemberIos(_)) {
                    self.count_faults_pending -= 1;
                }
                *f = None;
            }
        }
    }

    fn push_event(&mut self, at_ns: u64, kind: EventKind) {
        self.seq += 1;
        self.events.push(Reverse(Event { at_ns, seq: self.seq, kind }));
    }

    pub fn schedule(&mut self, fault: Fault) {
        let idx = self.faults.len();
        self.faults.push(Some(fault));
        match fault.trigger {
            FaultTrigger::AtNs(t) => self.push_event(t.max(self.now_ns), EventKind::Fault(idx)),
            FaultTrigger::AfterMemberIos(_) => {
                self.count_faults_pending += 1;
                self.check_count_faults(fault.member);
            }
        }
    }

    /// A fail-stopped member answers again (a pulled cable plugged back in, typically
    /// across a power cycle) with what it durably held; its error faults stay.
    pub fn revive_member(&mut self, member: usize) {
        let now = self.now_ns;
        let m = &mut self.members[member];
        m.account(now);
        m.failed = false;
        self.trace.event(TAG_FAULT, &[now, member as u64, 8]);
    }

    /// A new blank disk of the same profile in `member`'s bay (the old one, failed or
    /// not, is pulled with whatever was queued on it): the replacement mdadm --add
    /// rebuilds. Faults scheduled for the bay and not yet fired still apply to it.
    pub fn replace_member(&mut self, member: usize) {
        assert!(self.members[member].depth() == 0, "a disk is replaced with nothing queued on it");
        let now = self.now_ns;
        // A phase of its own, unlike any first disk's.
        let phase = (self.members.len() + member) as u64;
        let mut fresh = Member::new(&self.configs[member], self.seed, phase);
        // Its queue-depth accounting starts now; its I/O count goes on, as count-triggered
        // faults of the bay count from the run's start.
        fresh.last_account_ns = now;
        fresh.completed_ios = self.members[member].completed_ios;
        self.members[member] = fresh;
        self.trace.event(TAG_FAULT, &[now, member as u64, 9]);
    }

    /// Fail-stop a member now.
    pub fn fail_member(&mut self, member: usize) {
        self.schedule(Fault { trigger: FaultTrigger::AtNs(self.now_ns), member, kind: FaultKind::FailStop });
        self.fire_due_faults_now();
    }

    /// Fire a fault on `member` now (a fail-stop, a link lost, write errors from now on).
    pub fn fault_now(&mut self, member: usize, kind: FaultKind) {
        self.schedule(Fault { trigger: FaultTrigger::AtNs(self.now_ns), member, kind });
        self.fire_due_faults_now();
    }

    /// The member's write errors end (a transient fault: a remapped sector, a cable
    /// reseated); what they failed stays as it was.
    pub fn clear_write_errors(&mut self, member: usize) {
        self.members[member].write_error_ranges.clear();
        self.trace.event(TAG_FAULT, &[self.now_ns, member as u64, 11]);
    }

    fn fire_due_faults_now(&mut self) {
        while let Some(Reverse(e)) = self.events.peek() {
            if e.at_ns > self.now_ns || !matches!(e.kind, EventKind::Fault(_)) {
                break;
            }
            if let Some(Reverse(Event { kind: EventKind::Fault(i), .. })) = self.events.pop() {
                self.fire(i);
            }
        }
    }

    /// I/Os the member (its bay) has completed, with any result.
    pub fn member_completed_ios(&self, member: usize) -> u64 {
        self.members[member].completed_ios
    }

    /// Hand a member I/O to its member at the current virtual time.
    pub fn submit(&mut self, io: MemberIo) {
        let now = self.now_ns;
        self.trace.event(TAG_SUBMIT, &[now, io.member as u64, op_code(io.op), io.offset_bytes, io.len_bytes]);
        self.in_flight += 1;
        if io.member >= self.members.len() || self.members[io.member].failed {
            let completion = MemberIoCompletion { id: io.id, result: Err(MemberIoError::Gone) };
            self.push_event(now, EventKind::Immediate { member: io.member, completion, op: io.op });
            return;
        }
        let member = io.member;
        let m = &mut self.members[member];
        m.account(now);
        m.queued.push(QueuedIo {
            op: io.op,
            offset_bytes: io.offset_bytes,
            len_bytes: io.len_bytes,
            arrival_ns: now,
            seq: m.submitted,
        });
        m.flushes_queued += usize::from(io.op == MemberIoOp::Flush);
        m.queue.push_back(Pending { io, arrival_ns: now });
        m.submitted += 1;
        let depth = m.depth() as u64;
        m.stats.max_queue_depth = m.stats.max_queue_depth.max(depth);
        self.try_start(member);
    }

    /// Start queued commands on free channels, within the device's queue depth.
    fn try_start(&mut self, member: usize) {
        let now = self.now_ns;
        loop {
            let m = &mut self.members[member];
            if m.failed || m.hung || m.queue.is_empty() || m.active_count >= m.channels {
                return;
            }
            let Some(channel) = m.active.iter().position(|a| a.is_none()) else { return };
            let front_is_flush = m.queue.front().is_some_and(|p| p.io.op == MemberIoOp::Flush);
            // FLUSH CACHE is not queued: it waits for the device to drain, and nothing
            // passes it.
            if front_is_flush && m.active_count > 0 {
                return;
            }
            let offered = if front_is_flush || !m.reorders {
                1
            } else {
                let room = m.queue_depth.saturating_sub(m.active_count).max(1).min(m.queued.len());
                let flush = if m.flushes_queued > 0 {
                    m.queued[..room].iter().position(|q| q.op == MemberIoOp::Flush)
                } else {
                    None
                };
                flush.unwrap_or(room)
            };
            let (pick, service_ns) = m.model.start(&m.queued[..offered], now);
            let service_ns = if m.latency_percent == 100 {
                service_ns
            } else {
                service_ns.saturating_mul(m.latency_percent as u64) / 100
            };
            m.account(now);
            let Some(p) = m.queue.remove(pick) else { return };
            m.queued.remove(pick);
            m.flushes_queued -= usize::from(p.io.op == MemberIoOp::Flush);
            let flush_mark = m.store.flush_mark();
            m.active[channel] = Some(Active { io: p.io, arrival_ns: p.arrival_ns, flush_mark });
            m.active_count += 1;
            self.push_event(now + service_ns.max(1), EventKind::Done { member, channel });
        }
    }

    /// Time of the next event (completion or timed fault), if any.
    pub fn next_event_ns(&self) -> Option<u64> {
        if self.power_lost_at.is_some() {
            return None;
        }
        self.events.peek().map(|Reverse(e)| e.at_ns)
    }

    /// Move the clock to `t_ns`, running every event due by then; completions are appended
    /// to `out`. Stops early (clock at the fault's time) when a power loss fires.
    pub fn advance_to(&mut self, t_ns: u64, out: &mut Vec<MemberIoCompletion>) {
        while let Some(next) = self.next_event_ns() {
            if next > t_ns {
                break;
            }
            self.run_next(out);
        }
        if self.power_lost_at.is_none() {
            self.now_ns = self.now_ns.max(t_ns);
        }
    }

    /// Run every event of the earliest pending time; returns that time, or `None` if no event
    /// is pending (or power was lost).
    pub fn run_next(&mut self, out: &mut Vec<MemberIoCompletion>) -> Option<u64> {
        let t = self.next_event_ns()?;
        self.now_ns = self.now_ns.max(t);
        while let Some(Reverse(e)) = self.events.peek() {
            if e.at_ns != t || self.power_lost_at.is_some() {
                break;
            }
            let Some(Reverse(e)) = self.events.pop() else { break };
            match e.kind {
                EventKind::Done { member, channel } => self.complete(member, channel, out),
                EventKind::Immediate { member, completion, op } => {
                    self.finish(member, op, completion, None, out);
                }
                EventKind::Fault(i) => self.fire(i),
            }
        }
        Some(t)
    }

    fn complete(&mut self, member: usize, channel: usize, out: &mut Vec<MemberIoCompletion>) {
        let now = self.now_ns;
        let m = &mut self.members[member];
        if m.hung {
            // Never answered: held in its channel until the timeout answers it `Gone`.
            return;
        }
        m.account(now);
        let Some(a) = m.active[channel].take() else { return };
        m.active_count -= 1;
        let mut io = a.io;
        let result = match io.op {
            MemberIoOp::Read => m.store.read(io.offset_bytes, io.len_bytes),
            MemberIoOp::Write => {
                if io.data.len() as u64 != io.len_bytes || m.write_fails(io.offset_bytes, io.len_bytes) {
                    Err(MemberIoError::Io)
                } else {
                    let data = std::mem::take(&mut io.data);
                    m.store.write_owned(io.offset_bytes, data.into_vec()).map(|()| Vec::new())
                }
            }
            MemberIoOp::Flush if m.flush_errors => Err(MemberIoError::Io),
            MemberIoOp::Flush => {
                m.store.flush_complete(a.flush_mark);
                Ok(Vec::new())
            }
        };
        let s = &mut m.stats;
        s.latency_ns_total += now - a.arrival_ns;
        if result.is_ok() {
            match io.op {
                MemberIoOp::Read => {
                    s.reads += 1;
                    s.read_bytes += io.len_bytes;
                }
                MemberIoOp::Write => {
                    s.writes += 1;
                    s.write_bytes += io.len_bytes;
                }
                MemberIoOp::Flush => s.flushes += 1,
            }
        }
        let completion = MemberIoCompletion { id: io.id, result };
        self.finish(member, io.op, completion, Some((io.offset_bytes, io.len_bytes)), out);
        self.try_start(member);
    }

    fn finish(
        &mut self,
        member: usize,
        op: MemberIoOp,
        completion: MemberIoCompletion,
        range: Option<(u64, u64)>,
        out: &mut Vec<MemberIoCompletion>,
    ) {
        let (offset, len) = range.unwrap_or((u64::MAX, 0));
        self.trace.event(
            TAG_COMPLETE,
            &[
                self.now_ns,
                member as u64,
                completion.id,
                op_code(op),
                offset,
                len,
                result_code(&completion.result),
            ],
        );
        if completion.result.is_err() {
            if let Some(m) = self.members.get_mut(member) {
                m.stats.errors += 1;
            }
        }
        if let Some(m) = self.members.get_mut(member) {
            m.completed_ios += 1;
        }
        self.in_flight -= 1;
        self.total_completed += 1;
        out.push(completion);
        if self.count_faults_pending > 0 {
            self.check_count_faults(member);
        }
    }

    fn check_count_faults(&mut self, member: usize) {
        for i in 0..self.faults.len() {
            let Some(f) = self.faults[i] else { continue };
            let FaultTrigger::AfterMemberIos(n) = f.trigger else { continue };
            let done = match f.kind {
                FaultKind::PowerLoss(_) => self.total_completed,
                _ if f.member == member => self.members.get(member).map_or(0, |m| m.completed_ios),
                _ => continue,
            };
            if done >= n {
                self.count_faults_pending -= 1;
                self.fire(i);
            }
        }
    }

    fn fire(&mut self, idx: usize) {
        let Some(fault) = self.faults.get_mut(idx).and_then(Option::take) else { return };
        if self.power_lost_at.is_some() {
            return;
        }
        let now = self.now_ns;
        let kind_code = match fault.kind {
            FaultKind::FailStop => 0,
            FaultKind::LatentErrors { .. } => 1,
            FaultKind::Corrupt { .. } => 2,
            FaultKind::Slow { .. } => 3,
            FaultKind::PowerLoss(_) => 4,
            FaultKind::WriteErrors { .. } => 5,
            FaultKind::FlushErrors => 6,
            FaultKind::Dropped => 7,
            FaultKind::Hang { .. } => 10,
        };
        self.trace.event(TAG_FAULT, &[now, fault.member as u64, kind_code]);
        let mut record =
            FaultRecord { at_ns: now, fault, corrupted_offsets: Vec::new(), power_loss: Vec::new() };
        let mut rng = Rng::derive(self.seed, 0xFA17_0000 + idx as u64);
        match fault.kind {
            FaultKind::PowerLoss(policy) => {
                record.power_loss = self.power_loss_with(&policy, &mut rng);
                self.power_lost_at = Some(now);
            }
            _ if fault.member >= self.members.len() => {}
            FaultKind::FailStop | FaultKind::Dropped => {
                let m = &mut self.members[fault.member];
                m.account(now);
                m.failed = true;
                m.hung = false;
                if fault.kind == FaultKind::Dropped {
                    m.store.flush_all();
                }
                let mut doomed: Vec<(MemberIoCompletion, MemberIoOp)> = Vec::new();
                for a in m.active.iter_mut().filter_map(Option::take) {
                    doomed.push((
                        MemberIoCompletion { id: a.io.id, result: Err(MemberIoError::Gone) },
                        a.io.op,
                    ));
                }
                m.queued.clear();
                m.flushes_queued = 0;
                for p in m.queue.drain(..) {
                    doomed.push((
                        MemberIoCompletion { id: p.io.id, result: Err(MemberIoError::Gone) },
                        p.io.op,
                    ));
                }
                m.active_count = 0;
                for (completion, op) in doomed {
                    self.push_event(now, EventKind::Immediate { member: fault.member, completion, op });
                }
            }
            FaultKind::LatentErrors { offset_bytes, len_bytes } => {
                self.members[fault.member].store.add_latent_error(offset_bytes, len_bytes);
            }
            FaultKind::Corrupt { offset_bytes, len_bytes, bit_flips } => {
                record.corrupted_offsets =
                    self.members[fault.member].store.corrupt(offset_bytes, len_bytes, bit_flips, &mut rng);
            }
            FaultKind::Slow { latency_percent } => {
                self.members[fault.member].latency_percent = latency_percent.max(1);
            }
            FaultKind::WriteErrors { offset_bytes, len_bytes } => {
                let end = offset_bytes.saturating_add(len_bytes);
                self.members[fault.member].write_error_ranges.push((offset_bytes, end));
            }
            FaultKind::FlushErrors => self.members[fault.member].flush_errors = true,
            FaultKind::Hang { timeout_ns } => {
                self.members[fault.member].hung = true;
                let at = now.saturating_add(timeout_ns);
                self.schedule(Fault {
                    trigger: FaultTrigger::AtNs(at),
                    member: fault.member,
                    kind: FaultKind::FailStop,
                });
            }
        }
        self.fired.push(record);
    }

    /// Cut the power now: every member loses its unflushed writes as `policy` says (choices
    /// from the run's seed), commands in flight never complete, and the member queues are
    /// emptied. Timed faults stay scheduled. Afterwards each store holds what its platters
    /// or flash hold; build a new engine on them and go on (the clock keeps running).
    pub fn power_loss(&mut self, policy: &PowerLossPolicy) -> Vec<PowerLossReport> {
        let mut rng = Rng::derive(self.seed, 0x90E4_0000 + self.fired.len() as u64);
        let now = self.now_ns;
        self.trace.event(TAG_FAULT, &[now, u64::MAX, 4]);
        let reports = self.power_loss_with(policy, &mut rng);
        self.fired.push(FaultRecord {
            at_ns: now,
            fault: Fault {
                trigger: FaultTrigger::AtNs(now),
                member: usize::MAX,
                kind: FaultKind::PowerLoss(*policy),
            },
            corrupted_offsets: Vec::new(),
            power_loss: reports.clone(),
        });
        reports
    }

    fn power_loss_with(&mut self, policy: &PowerLossPolicy, rng: &mut Rng) -> Vec<PowerLossReport> {
        let now = self.now_ns;
        let mut reports = Vec::with_capacity(self.members.len());
        for m in &mut self.members {
            m.account(now);
            let active: Vec<Active> = m.active.iter_mut().filter_map(Option::take).collect();
            let in_flight: Vec<(u64, &[u8])> = active
                .iter()
                .filter(|a| a.io.op == MemberIoOp::Write && a.io.data.len() as u64 == a.io.len_bytes)
                .map(|a| (a.io.offset_bytes, &a.io.data[..]))
                .collect();
            reports.push(m.store.power_loss(policy, rng, &in_flight));
            m.queue.clear();
            m.queued.clear();
            m.flushes_queued = 0;
            m.active_count = 0;
            m.model.power_cycle();
        }
        // Completions of the lost commands must never arrive; timed faults stay.
        let events = std::mem::take(&mut self.events);
        self.events = events.into_iter().filter(|Reverse(e)| matches!(e.kind, EventKind::Fault(_))).collect();
        self.in_flight = 0;
        reports
    }
}
