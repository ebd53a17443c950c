//! Metadata rounds performed as member I/O. A round's writes go to each member in order,
//! each followed by a flush of that member (md writes its metadata with FUA), the members
//! side by side; a member whose I/O fails skips the rest of its part (its superblock is not
//! written over a bitmap page that failed). Rounds run one at a time, in the order they were
//! asked for, and each is built only when it starts, from the state as it is then.

use std::collections::VecDeque;

use super::superblocks::{MemberKey, MetaIo, MetaRound, MetaWriteKind};
use crate::api::{IoBytes, MemberIo, MemberIoId, MemberIoOp, ARRAY_META_IO_ID_BASE};
use crate::meta::BitmapPageWrite;

/// What a queued round will write.
#[derive(Clone, Debug)]
pub(super) enum Work {
    /// Every working member's superblock, as the state is when the round starts.
    Superblocks,
    /// Bitmap pages holding newly set bits, before the writes they cover.
    BitmapPages(Vec<BitmapPageWrite>),
    /// md's bitmap daemon: a flush of every member, then the pages of the bits it clears.
    BitmapDaemon,
    /// Writes outside the superblock state (each active member's PPL area emptied at start).
    Raw(Vec<MetaIo>),
}

/// A round's sequence number: a caller waits until [`Rounds::done_seq`] reaches it.
pub(super) type RoundSeq = u64;

/// One step of a member's part: an I/O, and what it is for (for the operator).
type Step = (MemberIoOp, u64, IoBytes, &'static str);

/// One member's part of the round in flight.
struct Chain {
    key: MemberKey,
    steps: VecDeque<Step>,
    in_flight: Option<(MemberIoId, &'static str)>,
}

/// The round in flight.
pub(super) struct Running {
    pub seq: RoundSeq,
    /// The round as `ArraySuperblocks` built it (None for `Work::Raw`).
    pub round: Option<MetaRound>,
    chains: Vec<Chain>,
    /// Members whose I/O failed, with what that I/O was for.
    pub failed: Vec<(MemberKey, &'static str)>,
}

impl Running {
    pub(super) fn finished(&self) -> bool {
        self.chains.iter().all(|c| c.in_flight.is_none())
    }
}

fn purpose(io: &MetaIo) -> &'static str {
    match io {
        MetaIo::Write { what: MetaWriteKind::Superblock, .. } => "writing the superblock",
        MetaIo::Write { what: MetaWriteKind::BitmapPage { .. }, .. } => "writing a bitmap page",
        MetaIo::Write { what: MetaWriteKind::BadBlockLog, .. } => "writing the bad-block log",
        MetaIo::Write { what: MetaWriteKind::PplArea, .. } => "emptying the partial parity log",
        MetaIo::Flush { .. } => "flushing before clearing bitmap bits",
    }
}

#[derive(Default)]
pub(super) struct Rounds {
    queue: VecDeque<(RoundSeq, Work)>,
    running: Option<Running>,
    last_seq: RoundSeq,
    done_seq: RoundSeq,
    next_io: u64,
    out: VecDeque<MemberIo>,
    /// Metadata I/O of failed members the rounds stopped waiting on (`member_gone`), until
    /// the device answers it after all.
    late: Vec<(MemberIoId, MemberKey)>,
}

impl Rounds {
    /// Queues `work`; returns the sequence number that says when it is done.
    pub(super) fn push(&mut self, work: Work) -> RoundSeq {
        // A superblock round last in the queue covers this one: it is built when it starts.
        if let (Work::Superblocks, Some((seq, Work::Superblocks))) = (&work, self.queue.back()) {
            return *seq;
        }
        // So does a bitmap page round last in the queue, given this one's pages too: the
        // page bytes are taken when it starts, with every bit set by then (md's unplug
        // writes the bits of a whole batch of writes at once).
        if let (Work::BitmapPages(new), Some((seq, Work::BitmapPages(queued)))) =
            (&work, self.queue.back_mut())
        {
            for w in new {
                match queued.iter_mut().find(|q| q.page == w.page) {
                    Some(q) => {
                        let end = (q.offset_bytes + q.len_bytes).max(w.offset_bytes + w.len_bytes);
                        q.offset_bytes = q.offset_bytes.min(w.offset_bytes);
                        q.len_bytes = end - q.offset_bytes;
                    }
                    None => queued.push(*w),
                }
            }
            return *seq;
        }
        self.last_seq += 1;
        self.queue.push_back((self.last_seq, work));
        self.last_seq
    }

    /// The last round asked for.
    pub(super) fn last_seq(&self) -> RoundSeq {
        self.last_seq
    }

    /// Every round up to this one is done.
    pub(super) fn done_seq(&self) -> RoundSeq {
        self.done_seq
    }

    /// (queued, running with members still writing, I/Os not yet taken).
    pub(super) fn describe(&self) -> String {
        let running = self.running.as_ref().map(|r| {
            let busy: Vec<(MemberKey, Option<MemberIoId>, usize)> =
                r.chains.iter().map(|c| (c.key, c.in_flight.map(|(i, _)| i), c.steps.len())).collect();
            format!("seq {} {busy:?}", r.seq)
        });
        format!(
            "queued {:?}, running {running:?}, out {}",
            self.queue.iter().map(|q| q.0).collect::<Vec<_>>(),
            self.out.len()
        )
    }

    pub(super) fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_none() && self.out.is_empty()
    }

    /// Nothing is being written; the next round may start.
    pub(super) fn ready_for_next(&self) -> bool {
        self.running.is_none()
    }

    pub(super) fn pop_queued(&mut self) -> Option<(RoundSeq, Work)> {
        self.queue.pop_front()
    }

    /// Starts `round` (or raw `ios`) as round `seq`: the first I/O of every member's part
    /// is issued. A round with no I/O is finished at once (see [`Rounds::take_finished`]).
    pub(super) fn start(&mut self, seq: RoundSeq, round: Option<MetaRound>, raw: Vec<MetaIo>) {
        assert!(self.running.is_none(), "one metadata round at a time");
        let ios = round.as_ref().map_or(&raw[..], |r| &r.ios[..]);
        let flush_once = round.as_ref().is_some_and(MetaRound::writes_bitmap_pages_only);
        let mut chains: Vec<Chain> = Vec::new();
        for io in ios {
            let key = io.key();
            let at = match chains.iter().position(|c| c.key == key) {
                Some(i) => i,
                None => {
                    chains.push(Chain { key, steps: VecDeque::new(), in_flight: None });
                    chains.len() - 1
                }
            };
            let steps = &mut chains[at].steps;
            let why = purpose(io);
            if let MetaIo::Write { offset_bytes, bytes, .. } = io {
                steps.push_back((MemberIoOp::Write, *offset_bytes, IoBytes::from(bytes.clone()), why));
            }
            // A write's own flush (md's FUA) is part of the same step for the operator.
            if !flush_once {
                steps.push_back((MemberIoOp::Flush, 0, IoBytes::new(), why));
            }
        }
        if flush_once {
            for c in &mut chains {
                c.steps.push_back((MemberIoOp::Flush, 0, IoBytes::new(), "writing a bitmap page"));
            }
        }
        let mut running = Running { seq, round, chains, failed: Vec::new() };
        for c in &mut running.chains {
            Self::issue_next(c, &mut self.next_io, &mut self.out);
        }
        self.running = Some(running);
    }

    fn issue_next(c: &mut Chain, next_io: &mut u64, out: &mut VecDeque<MemberIo>) {
        let Some((op, offset_bytes, data, why)) = c.steps.pop_front() else {
            c.in_flight = None;
            return;
        };
        // Ids wrap inside the reserved range; a round has a handful of I/Os in flight.
        let id = ARRAY_META_IO_ID_BASE + (*next_io % ARRAY_META_IO_ID_BASE);
        *next_io += 1;
        let len_bytes = if op == MemberIoOp::Write { data.len() as u64 } else { 0 };
        out.push_back(MemberIo { id, member: c.key as usize, op, offset_bytes, len_bytes, data });
        c.in_flight = Some((id, why));
    }

    pub(super) fn pop_io(&mut self) -> Option<MemberIo> {
        self.out.pop_front()
    }

    /// A metadata I/O completed. False when `id` is not the round's (a duplicate).
    pub(super) fn complete(&mut self, id: MemberIoId, ok: bool) -> bool {
        if let Some(at) = self.late.iter().position(|&(i, _)| i == id) {
            self.late.swap_remove(at);
            return false;
        }
        let Some(r) = self.running.as_mut() else { return false };
        let Some(c) = r.chains.iter_mut().find(|c| c.in_flight.is_some_and(|(i, _)| i == id)) else {
            return false;
        };
        if ok {
            Self::issue_next(c, &mut self.next_io, &mut self.out);
        } else {
            let why = c.in_flight.map_or("a metadata write", |(_, w)| w);
            r.failed.push((c.key, why));
            c.steps.clear();
            c.in_flight = None;
        }
        true
    }

    /// Member `key` was failed: the round stops waiting on it. Its I/O in flight counts as
    /// failed (its completion, if it comes, is a duplicate) and the rest of its part, the
    /// I/O not yet taken by the driver included, is dropped.
    pub(super) fn member_gone(&mut self, key: MemberKey) {
        let mut untaken = Vec::new();
        self.out.retain(|io| {
            let keep = io.member as MemberKey != key;
            if !keep {
                untaken.push(io.id);
            }
            keep
        });
        let Some(r) = self.running.as_mut() else { return };
        for c in r.chains.iter_mut().filter(|c| c.key == key) {
            c.steps.clear();
            if let Some((id, why)) = c.in_flight.take() {
                r.failed.push((key, why));
                if !untaken.contains(&id) {
                    self.late.push((id, key));
                }
            }
        }
    }

    /// The running round once every member's part ended.
    pub(super) fn take_finished(&mut self) -> Option<Running> {
        if self.running.as_ref().is_some_and(Running::finished) {
            return self.running.take();
        }
        None
    }

    /// Round `seq` and what it led to are done.
    pub(super) fn mark_done(&mut self, seq: RoundSeq) {
        assert!(seq > self.done_seq, "rounds finish in order");
        self.done_seq = seq;
    }

    /// Members whose metadata I/O is in flight (not to be dropped from the executor yet).
    pub(super) fn busy_with(&self, key: MemberKey) -> bool {
        self.running.as_ref().is_some_and(|r| r.chains.iter().any(|c| c.key == key && c.in_flight.is_some()))
            || self.late.iter().any(|&(_, k)| k == key)
    }
}
