//! A deliberately small engine for testing executors, the runtime and the simulator
//! driver without the real engine: every member holds a full copy (RAID1-like, no
//! superblock). Writes go to every live member, reads to the first live one (falling over
//! to the next on an error), flush to every live member. A member that answers `Gone` is
//! failed. It also counts `unplug` and `tick` calls and can be made to answer `Busy`.

use std::collections::{BTreeMap, VecDeque};

use crate::stats::ArrayStats;
use crate::{
    MemberIo, MemberIoCompletion, MemberIoError, MemberIoOp, Request, RequestCompletion, RequestError,
    RequestOp, SubmitError, TimeNs,
};

use crate::api::ArrayEngine;

#[derive(Debug)]
struct Inflight {
    req: Request,
    pending_ios: usize,
    ok_ios: usize,
    data: Vec<u8>,
    /// For reads: members not yet tried.
    read_candidates: VecDeque<usize>,
}

#[derive(Debug)]
pub struct MirrorEngine {
    members: usize,
    member_bytes: u64,
    data_offset_bytes: u64,
    /// Requests accepted and not completed; beyond it `submit` answers Busy.
    pub max_inflight: usize,
    /// When set, `tick` is due this often (to test deadline handling).
    pub tick_interval_ns: Option<u64>,
    failed: Vec<bool>,
    next_io: u64,
    io_owner: BTreeMap<u64, (u64, usize)>,
    inflight: BTreeMap<u64, Inflight>,
    outbox: VecDeque<MemberIo>,
    done: VecDeque<RequestCompletion>,
    next_deadline: Option<u64>,
    pub unplugs: u64,
    pub ticks: u64,
    stats: ArrayStats,
}

impl MirrorEngine {
    pub fn new(members: usize, member_bytes: u64, data_offset_bytes: u64) -> Self {
        MirrorEngine {
            members,
            member_bytes,
            data_offset_bytes,
            max_inflight: 64,
            tick_interval_ns: None,
            failed: vec![false; members],
            next_io: 1,
            io_owner: BTreeMap::new(),
            inflight: BTreeMap::new(),
            outbox: VecDeque::new(),
            done: VecDeque::new(),
            next_deadline: None,
            unplugs: 0,
            ticks: 0,
            stats: ArrayStats::new(members),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.member_bytes - self.data_offset_bytes
    }

    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.members).filter(|&m| !self.failed[m])
    }

    fn issue(&mut self, req_id: u64, member: usize, op: MemberIoOp, offset: u64, len: u64, data: Vec<u8>) {
        let id = self.next_io;
        self.next_io += 1;
        self.io_owner.insert(id, (req_id, member));
        let ms = &mut self.stats.members[member];
        op.count_in(ms, len);
        let offset_bytes = if op == MemberIoOp::Flush { 0 } else { offset + self.data_offset_bytes };
        self.outbox.push_back(MemberIo { id, member, op, offset_bytes, len_bytes: len, data: data.into() });
    }

    fn finish(&mut self, req_id: u64, result: Result<Vec<u8>, RequestError>) {
        self.inflight.remove(&req_id);
        self.done.push_back(RequestCompletion { id: req_id, result });
    }
}

impl ArrayEngine for MirrorEngine {
    fn submit(&mut self, req: Request, _now_ns: TimeNs) -> Result<(), SubmitError> {
        if self.inflight.len() >= self.max_inflight {
            return Err(SubmitError::Busy(req));
        }
        self.stats.requests += 1;
        let id = req.id;
        let end = req.offset_bytes.checked_add(req.len_bytes);
        if req.op != RequestOp::Flush && end.is_none_or(|e| e > self.size_bytes()) {
            self.done.push_back(RequestCompletion { id, result: Err(RequestError::OutOfRange) });
            return Ok(());
        }
        let live: Vec<usize> = self.live().collect();
        if live.is_empty() {
            self.done.push_back(RequestCompletion { id, result: Err(RequestError::ArrayFailed) });
            return Ok(());
        }
        let (off, len) = (req.offset_bytes, req.len_bytes);
        let mut entry = Inflight {
            req: Request { data: Vec::new(), ..req.clone() },
            pending_ios: 0,
            ok_ios: 0,
            data: Vec::new(),
            read_candidates: VecDeque::new(),
        };
        match req.op {
            RequestOp::Read => {
                entry.read_candidates = live[1..].iter().copied().collect();
                entry.pending_ios = 1;
                self.inflight.insert(id, entry);
                self.issue(id, live[0], MemberIoOp::Read, off, len, Vec::new());
            }
            RequestOp::Write | RequestOp::Trim | RequestOp::WriteZeroes => {
                let data = if req.op == RequestOp::Write { req.data } else { vec![0; len as usize] };
                entry.pending_ios = live.len();
                self.inflight.insert(id, entry);
                for &m in &live {
                    self.issue(id, m, MemberIoOp::Write, off, len, data.clone());
                }
            }
            RequestOp::Flush => {
                entry.pending_ios = live.len();
                self.inflight.insert(id, entry);
                for &m in &live {
                    self.issue(id, m, MemberIoOp::Flush, 0, 0, Vec::new());
                }
            }
        }
        Ok(())
    }

    fn unplug(&mut self, _now_ns: TimeNs) {
        self.unplugs += 1;
    }

    fn pop_member_io(&mut self) -> Option<MemberIo> {
        self.outbox.pop_front()
    }

    fn complete_member_io(&mut self, completion: MemberIoCompletion, _now_ns: TimeNs) {
        let Some((req_id, member)) = self.io_owner.remove(&completion.id) else { return };
        if completion.result == Err(MemberIoError::Gone) {
            self.failed[member] = true;
        }
        if completion.result.is_err() {
            self.stats.members[member].errors += 1;
        }
        let Some(entry) = self.inflight.get_mut(&req_id) else { return };
        entry.pending_ios -= 1;
        match (entry.req.op, completion.result) {
            (RequestOp::Read, Ok(data)) => {
                entry.data = data;
                entry.ok_ios += 1;
            }
            (RequestOp::Read, Err(_)) => {
                while let Some(next) = entry.read_candidates.pop_front() {
                    if !self.failed[next] {
                        entry.pending_ios += 1;
                        let (off, len) = (entry.req.offset_bytes, entry.req.len_bytes);
                        self.issue(req_id, next, MemberIoOp::Read, off, len, Vec::new());
                        break;
                    }
                }
            }
            (_, Ok(_)) => entry.ok_ios += 1,
            (_, Err(_)) => {}
        }
        let Some(entry) = self.inflight.get_mut(&req_id) else { return };
        if entry.pending_ios == 0 {
            let result = if entry.ok_ios > 0 {
                Ok(std::mem::take(&mut entry.data))
            } else {
                Err(RequestError::ArrayFailed)
            };
            self.finish(req_id, result);
        }
    }

    fn pop_completion(&mut self) -> Option<RequestCompletion> {
        self.done.pop_front()
    }

    fn next_deadline_ns(&self) -> Option<TimeNs> {
        self.next_deadline
    }

    fn tick(&mut self, now_ns: TimeNs) {
        self.ticks += 1;
        self.next_deadline = self.tick_interval_ns.map(|i| now_ns + i);
    }

    fn fail_member(&mut self, member: usize, _now_ns: TimeNs) {
        if member < self.members {
            self.failed[member] = true;
        }
    }

    fn is_idle(&self) -> bool {
        self.inflight.is_empty() && self.outbox.is_empty() && self.done.is_empty()
    }

    fn stats_snapshot(&self) -> ArrayStats {
        self.stats.clone()
    }
}

impl MirrorEngine {
    /// Arm the first `tick` deadline (the engine asks to be ticked from `at_ns` on).
    pub fn arm_tick(&mut self, at_ns: u64) {
        self.next_deadline = Some(at_ns);
    }
}
