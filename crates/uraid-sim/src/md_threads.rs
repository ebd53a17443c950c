//! md's raid5d (or its `group_thread_cnt` workers) as modelled threads around an engine,
//! so the array's work takes virtual time ([`crate::cpu`]).
//!
//! What md does in the submitter's context happens at once: raid0/1/10 requests, and the
//! chunk-aligned reads of raid4/5/6 that go straight to a member (md splits reads at chunk
//! boundaries, so a read is a set of such pieces). Everything that goes through the stripe
//! cache waits for its stripe's thread: requests and member completions queue in the
//! thread's inbox while it works, and when it is free it takes the whole inbox, hands it
//! to the engine in arrival order, and releases what the engine answers (member I/Os
//! under one plug, as raid5d's loop does, and request completions) when the batch's cost
//! has run. The engine's policies decide as they would without the model (the 1:1 model
//! still handles each stripe as its write arrives); only when things happen moves.
//!
//! Off by default: [`crate::SimArray`] runs any engine without it, and `uraid sim`
//! never uses it.

use std::collections::{BTreeMap, HashMap};

use uraid_core::stats::ArrayStats;
use uraid_core::{
    ArrayConfig, Geometry, Level, MemberIo, MemberIoCompletion, MemberIoOp, MemberState, Request,
    RequestCompletion, RequestId, RequestOp, SubmitError, TimeNs, Tunables,
};

use crate::cpu::{CpuCosts, SharedCores, Thread, MD_PAGE_BYTES};
use uraid_core::ArrayEngine;

/// Ids the wrapper gives the chunk pieces of split reads: above any caller's, below the
/// request queue's merged ids.
const OWN_ID_BASE: RequestId = 1 << 60;

/// How md serves a request: what its submitter does, and how much waits for an md thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestPlan {
    /// Pieces sent straight to a member in the submitter's context (bypass reads, raid0/1/10).
    pub direct_pieces: u64,
    /// 4 KiB pages md's make_request puts into stripe heads (they wait for an md thread).
    pub stripe_pages: u64,
    /// The request is split into chunk pieces.
    pub split: bool,
}

/// The layout facts the plan needs, taken once from the array's configuration.
#[derive(Clone, Debug)]
pub struct MdLayout {
    pub geo: Geometry,
    pub data_offset_bytes: u64,
    /// Members that cannot serve a read (missing or failed).
    pub unreadable: Vec<bool>,
    pub aligned_read_bypass: bool,
    pub degraded_read_bypass: bool,
}

impl MdLayout {
    pub fn new(config: &ArrayConfig) -> MdLayout {
        let unreadable: Vec<bool> = config.members.iter().map(|m| m.state != MemberState::InSync).collect();
        let t: &Tunables = &config.tunables;
        MdLayout {
            geo: config.geometry.clone(),
            data_offset_bytes: config.members.first().map_or(0, |m| m.data_offset_bytes),
            unreadable,
            aligned_read_bypass: t.aligned_read_bypass,
            degraded_read_bypass: t.degraded_read_bypass,
        }
    }

    fn degraded(&self) -> bool {
        self.unreadable.iter().any(|&u| u)
    }

    /// Chunk pieces of a read: (array offset, length, served directly).
    fn read_pieces(&self, offset_bytes: u64, len_bytes: u64) -> Vec<(u64, u64, bool)> {
        let chunk = self.geo.chunk_sectors * 512;
        let allowed = self.aligned_read_bypass && (!self.degraded() || self.degraded_read_bypass);
        let mut out = Vec::new();
        let mut pos = offset_bytes;
        let end = offset_bytes + len_bytes;
        while pos < end {
            let n = ((pos / chunk + 1) * chunk).min(end) - pos;
            let (ext, _) = self.geo.map_sector(pos / 512);
            out.push((pos, n, allowed && !self.unreadable[ext.member]));
            pos += n;
        }
        out
    }

    /// Where `req` is served: see [`RequestPlan`].
    pub fn plan(&self, req: &Request) -> RequestPlan {
        let pages = req.len_bytes.div_ceil(MD_PAGE_BYTES);
        match self.geo.level {
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                if req.op != RequestOp::Read {
                    return RequestPlan { stripe_pages: pages, ..Default::default() };
                }
                let pieces = self.read_pieces(req.offset_bytes, req.len_bytes);
                let mut plan = RequestPlan { split: pieces.len() > 1, ..Default::default() };
                for (_, len, direct) in pieces {
                    if direct {
                        plan.direct_pieces += 1;
                    } else {
                        plan.stripe_pages += len.div_ceil(MD_PAGE_BYTES);
                    }
                }
                plan
            }
            Level::Raid1 => {
                let copies = if req.op == RequestOp::Read { 1 } else { self.geo.raid_disks as u64 };
                RequestPlan { direct_pieces: copies, ..Default::default() }
            }
            _ => {
                let mut ext = Vec::new();
                self.geo.map_range(req.offset_bytes / 512, req.len_bytes.div_ceil(512), &mut ext);
                let copies = if self.geo.level == Level::Raid10 && req.op != RequestOp::Read {
                    self.geo.redundancy() as u64 + 1
                } else {
                    1
                };
                RequestPlan { direct_pieces: ext.len().max(1) as u64 * copies, ..Default::default() }
            }
        }
    }

    /// md's stripe_heads a request's data touches, as member page numbers (one per row).
    fn request_rows(&self, offset_bytes: u64, len_bytes: u64, rows: &mut Vec<u64>) {
        let mut ext = Vec::new();
        self.geo.map_range(offset_bytes / 512, len_bytes.div_ceil(512), &mut ext);
        for (_, e) in ext {
            let first = e.member_sector * 512 / MD_PAGE_BYTES;
            let last = ((e.member_sector + e.len_sectors) * 512).div_ceil(MD_PAGE_BYTES);
            rows.extend(first..last.max(first + 1));
        }
    }

    /// The member page numbers a member I/O covers.
    fn io_rows(&self, offset_bytes: u64, len_bytes: u64, rows: &mut Vec<u64>) {
        let start = offset_bytes.saturating_sub(self.data_offset_bytes);
        let first = start / MD_PAGE_BYTES;
        let last = (start + len_bytes).div_ceil(MD_PAGE_BYTES);
        rows.extend(first..last.max(first + 1));
    }

    /// Bytes the parity kernels read for this member I/O: a write of P (or of Q when P is
    /// missing) means parity computed over the data of its rows; a read of it on a
    /// degraded array means a block rebuilt from them.
    fn parity_input_bytes(&self, io: &MemberIo) -> u64 {
        if !self.geo.level.has_parity() || self.geo.chunk_sectors == 0 {
            return 0;
        }
        let sector = io.offset_bytes.saturating_sub(self.data_offset_bytes) / 512;
        let map = self.geo.stripe_map(sector / self.geo.chunk_sectors);
        let parity_member = if self.unreadable[map.pd_idx] { map.qd_idx } else { Some(map.pd_idx) };
        let counts = match io.op {
            MemberIoOp::Write => true,
            MemberIoOp::Read => self.degraded(),
            MemberIoOp::Flush => false,
        };
        if counts && parity_member == Some(io.member) {
            io.len_bytes * self.geo.data_disks() as u64
        } else {
            0
        }
    }
}

/// Counts of the work md's threads did, for the experiments' CPU columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MdWork {
    pub batches: u64,
    pub busy_ns: u64,
    pub stripe_passes: u64,
    pub page_bios: u64,
    pub member_requests: u64,
    pub copy_bytes: u64,
    pub parity_bytes: u64,
}

struct MdThread {
    thread: Thread,
    /// Requests waiting for this thread, in arrival order (refused ones, Busy, first).
    inbox: Vec<Request>,
    completions: Vec<MemberIoCompletion>,
}

/// A split read waiting for its pieces.
struct Parent {
    remaining: u32,
    data: Vec<u8>,
    error: Option<uraid_core::RequestError>,
}

pub struct MdThreads<E> {
    inner: E,
    layout: MdLayout,
    costs: CpuCosts,
    cores: SharedCores,
    threads: Vec<MdThread>,
    now_ns: TimeNs,
    seq: u64,
    held_ios: BTreeMap<(u64, u64), MemberIo>,
    held_done: BTreeMap<(u64, u64), RequestCompletion>,
    /// Member I/Os an md thread issued: (thread, offset, length), for their completions.
    thread_ios: HashMap<u64, (usize, u64, u64)>,
    /// Chunk pieces of split reads -> (parent, byte offset in it).
    pieces: HashMap<RequestId, (RequestId, u64)>,
    parents: HashMap<RequestId, Parent>,
    next_own_id: RequestId,
    pub work: MdWork,
}

impl<E: ArrayEngine> MdThreads<E> {
    /// `threads` md threads (raid5d alone: 1; md's `group_thread_cnt` workers otherwise).
    pub fn new(inner: E, config: &ArrayConfig, costs: CpuCosts, cores: SharedCores, threads: usize) -> Self {
        let threads = (0..threads.max(1))
            .map(|_| MdThread { thread: Thread::default(), inbox: Vec::new(), completions: Vec::new() })
            .collect();
        MdThreads {
            inner,
            layout: MdLayout::new(config),
            costs,
            cores,
            threads,
            now_ns: 0,
            seq: 0,
            held_ios: BTreeMap::new(),
            held_done: BTreeMap::new(),
            thread_ios: HashMap::new(),
            pieces: HashMap::new(),
            parents: HashMap::new(),
            next_own_id: OWN_ID_BASE,
            work: MdWork::default(),
        }
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }

    pub fn layout(&self) -> &MdLayout {
        &self.layout
    }

    fn own_id(&mut self) -> RequestId {
        self.next_own_id += 1;
        self.next_own_id
    }

    fn thread_of_sector(&self, array_sector: u64) -> usize {
        let n = self.threads.len() as u64;
        if n == 1 || !self.layout.geo.level.has_parity() {
            return 0;
        }
        (self.layout.geo.parity_locate(array_sector).0 % n) as usize
    }

    fn hold_io(&mut self, at: u64, io: MemberIo) {
        self.seq += 1;
        self.held_ios.insert((at, self.seq), io);
    }

    /// A request completion from the engine (or a piece's) becomes the caller's at `at`.
    fn release(&mut self, c: RequestCompletion, at: u64) {
        let Some((parent_id, at_byte)) = self.pieces.remove(&c.id) else {
            self.seq += 1;
            self.held_done.insert((at, self.seq), c);
            return;
        };
        let p = self.parents.get_mut(&parent_id).expect("parent of a piece");
        match c.result {
            Ok(data) if !data.is_empty() => {
                p.data[at_byte as usize..at_byte as usize + data.len()].copy_from_slice(&data);
            }
            Ok(_) => {}
            Err(e) => p.error = Some(e),
        }
        p.remaining -= 1;
        if p.remaining == 0 {
            let p = self.parents.remove(&parent_id).expect("parent");
            let result = match p.error {
                Some(e) => Err(e),
                None => Ok(p.data),
            };
            self.seq += 1;
            self.held_done.insert((at, self.seq), RequestCompletion { id: parent_id, result });
        }
    }

    /// Hand `req` to the engine now, as the submitter does for md's direct paths; what
    /// it answers goes out at once.
    fn deliver_direct(&mut self, req: Request, now: TimeNs) -> Result<(), SubmitError> {
        self.inner.submit(req, now)?;
        self.drain_direct(now);
        Ok(())
    }

    fn drain_direct(&mut self, now: TimeNs) {
        while let Some(io) = self.inner.pop_member_io() {
            self.hold_io(now, io);
        }
        while let Some(c) = self.inner.pop_completion() {
            self.release(c, now);
        }
    }

    /// Queue `req` for the md thread of its stripe.
    fn enqueue(&mut self, req: Request) {
        let k = self.thread_of_sector(req.offset_bytes / 512);
        self.threads[k].inbox.push(req);
    }

    /// Thread `k` takes its inbox at `t`: the engine gets it, and what the engine answers
    /// is released when the batch's cost has run.
    fn run_batch(&mut self, k: usize, t: TimeNs) {
        let reqs = std::mem::take(&mut self.threads[k].inbox);
        let completions = std::mem::take(&mut self.threads[k].completions);
        self.run_work(k, t, reqs, completions, false);
    }

    fn run_work(
        &mut self,
        k: usize,
        t: TimeNs,
        reqs: Vec<Request>,
        completions: Vec<MemberIoCompletion>,
        tick: bool,
    ) {
        let mut rows = Vec::new();
        let mut copy_bytes = 0;
        for r in &reqs {
            self.layout.request_rows(r.offset_bytes, r.len_bytes, &mut rows);
            copy_bytes += r.len_bytes;
        }
        for c in &completions {
            if let Some((_, off, len)) = self.thread_ios.remove(&c.id) {
                self.layout.io_rows(off, len, &mut rows);
            }
        }
        let delivered_any = !reqs.is_empty();
        for r in reqs {
            if let Err(SubmitError::Busy(back)) = self.inner.submit(r, t) {
                self.threads[k].inbox.push(back);
            }
        }
        for c in completions {
            self.inner.complete_member_io(c, t);
        }
        if tick {
            self.inner.tick(t);
        }
        if delivered_any {
            self.inner.unplug(t);
        }
        let mut ios = Vec::new();
        while let Some(io) = self.inner.pop_member_io() {
            ios.push(io);
        }
        let mut done = Vec::new();
        while let Some(c) = self.inner.pop_completion() {
            done.push(c);
        }
        let mut page_bios = 0;
        let mut parity_bytes = 0;
        // Member requests after the member queue's merging under the thread's plug (the
        // way SimArray merges what is issued at one instant).
        let mut member_requests = 0u64;
        let mut open: HashMap<usize, (MemberIoOp, u64)> = HashMap::new();
        for io in &ios {
            page_bios += io.len_bytes.div_ceil(MD_PAGE_BYTES);
            parity_bytes += self.layout.parity_input_bytes(io);
            let merges = matches!(io.op, MemberIoOp::Read | MemberIoOp::Write)
                && open.get(&io.member) == Some(&(io.op, io.offset_bytes));
            if !merges {
                member_requests += 1;
            }
            open.insert(io.member, (io.op, io.offset_bytes + io.len_bytes));
        }
        rows.sort_unstable();
        rows.dedup();
        let c = &self.costs;
        let cost = c.stripe_ns * rows.len() as f64
            + c.page_bio_ns * page_bios as f64
            + c.member_request_ns * member_requests as f64
            + c.md_copy_ns(copy_bytes)
            + c.parity_ns(parity_bytes);
        let end = self.threads[k].thread.run(&self.cores, t, cost);
        let w = &mut self.work;
        w.batches += 1;
        w.busy_ns += cost.round() as u64;
        w.stripe_passes += rows.len() as u64;
        w.page_bios += page_bios;
        w.member_requests += member_requests;
        w.copy_bytes += copy_bytes;
        w.parity_bytes += parity_bytes;
        for io in ios {
            self.thread_ios.insert(io.id, (k, io.offset_bytes, io.len_bytes));
            self.hold_io(end, io);
        }
        for c in done {
            self.release(c, end);
        }
    }

    /// Threads free by now with work waiting take it.
    fn run_ready(&mut self, now: TimeNs) {
        for k in 0..self.threads.len() {
            let th = &self.threads[k];
            let waiting = !th.inbox.is_empty() || !th.completions.is_empty();
            if waiting && th.thread.free_at_ns <= now {
                self.run_batch(k, now);
            }
        }
    }
}

impl<E: ArrayEngine> ArrayEngine for MdThreads<E> {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        self.now_ns = self.now_ns.max(now_ns);
        if req.op == RequestOp::Flush {
            return self.deliver_direct(req, now_ns);
        }
        let plan = self.layout.plan(&req);
        if !plan.split {
            return if plan.stripe_pages == 0 {
                self.deliver_direct(req, now_ns)
            } else {
                self.enqueue(req);
                Ok(())
            };
        }
        // md builds read bios no larger than a chunk: each piece goes its own way.
        let pieces = self.layout.read_pieces(req.offset_bytes, req.len_bytes);
        self.parents.insert(
            req.id,
            Parent { remaining: pieces.len() as u32, data: vec![0u8; req.len_bytes as usize], error: None },
        );
        for (off, len, direct) in pieces {
            let id = self.own_id();
            self.pieces.insert(id, (req.id, off - req.offset_bytes));
            let piece = Request::read(id, off, len);
            if direct {
                if let Err(SubmitError::Busy(p)) = self.deliver_direct(piece, now_ns) {
                    self.enqueue(p);
                }
            } else {
                self.enqueue(piece);
            }
        }
        Ok(())
    }

    /// The submitter's unplug releases its requests to the md threads (which unplug the
    /// engine when they take them); direct requests were sent at submission.
    fn unplug(&mut self, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
    }

    fn pop_member_io(&mut self) -> Option<MemberIo> {
        let (&key, _) = self.held_ios.first_key_value()?;
        if key.0 > self.now_ns {
            return None;
        }
        self.held_ios.remove(&key)
    }

    fn complete_member_io(&mut self, c: MemberIoCompletion, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        match self.thread_ios.get(&c.id) {
            Some(&(k, _, _)) => self.threads[k].completions.push(c),
            None => {
                // A direct piece: its bio completes in the submitter's context.
                self.inner.complete_member_io(c, now_ns);
                self.drain_direct(now_ns);
            }
        }
    }

    fn pop_completion(&mut self) -> Option<RequestCompletion> {
        let (&key, _) = self.held_done.first_key_value()?;
        if key.0 > self.now_ns {
            return None;
        }
        self.held_done.remove(&key)
    }

    fn next_deadline_ns(&self) -> Option<TimeNs> {
        let waiting = self
            .threads
            .iter()
            .filter(|th| !th.inbox.is_empty() || !th.completions.is_empty())
            .map(|th| th.thread.free_at_ns.max(self.now_ns));
        [
            // The engine's own timers run on raid5d when it is free.
            self.inner.next_deadline_ns().map(|d| d.max(self.threads[0].thread.free_at_ns)),
            self.held_ios.keys().next().map(|k| k.0),
            self.held_done.keys().next().map(|k| k.0),
            waiting.min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn tick(&mut self, now_ns: TimeNs) {
        self.now_ns = self.now_ns.max(now_ns);
        if self.inner.next_deadline_ns().is_some_and(|d| d <= now_ns)
            && self.threads[0].thread.free_at_ns <= now_ns
        {
            // The engine's own timers (a partial stripe's deadline) run on raid5d.
            self.run_work(0, now_ns, Vec::new(), Vec::new(), true);
        }
        self.run_ready(now_ns);
    }

    fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        self.inner.fail_member(member, now_ns);
        self.drain_direct(now_ns);
    }

    fn is_idle(&self) -> bool {
        self.inner.is_idle()
            && self.held_ios.is_empty()
            && self.held_done.is_empty()
            && self.threads.iter().all(|th| th.inbox.is_empty() && th.completions.is_empty())
    }

    fn stats_snapshot(&self) -> ArrayStats {
        self.inner.stats_snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::SimArray;
    use crate::cpu::Cores;
    use crate::disks::{SimDisks, SimMemberConfig};
    use uraid_core::geometry::algorithm;
    use uraid_core::{Engine, MemberConfig};

    fn config(missing: Option<usize>, degraded_bypass: bool) -> ArrayConfig {
        let n = 4;
        let member_bytes = 64u64 << 20;
        let geometry = Geometry::new(
            Level::Raid5,
            n,
            algorithm::LEFT_SYMMETRIC,
            128,
            &vec![(member_bytes - (1 << 20)) / 512; n],
        )
        .unwrap();
        let members = (0..n)
            .map(|m| MemberConfig {
                data_offset_bytes: 1 << 20,
                state: if Some(m) == missing { MemberState::Missing } else { MemberState::InSync },
            })
            .collect();
        let tunables = Tunables { degraded_read_bypass: degraded_bypass, ..Tunables::default() };
        ArrayConfig { geometry, members, tunables, read_only: false }
    }

    fn array(config: &ArrayConfig, costs: CpuCosts) -> SimArray<MdThreads<Engine>> {
        let disks =
            SimDisks::new((0..4).map(|_| SimMemberConfig::builtin("nvme", 64 << 20).unwrap()).collect(), 5)
                .unwrap();
        let engine = Engine::new(config.clone()).unwrap();
        let cores = Cores::shared(costs.cores);
        SimArray::new(MdThreads::new(engine, config, costs, cores, 1), disks)
    }

    /// Costs where only md's per-page bio costs: a millisecond each.
    fn slow_md_pages() -> CpuCosts {
        CpuCosts { name: "test".into(), cores: 4, page_bio_ns: 1_000_000.0, ..CpuCosts::none() }
    }

    fn done_at(a: &mut SimArray<MdThreads<Engine>>, id: RequestId) -> (u64, Vec<u8>) {
        assert!(matches!(a.run_until_idle(), crate::RunOutcome::Idle));
        let c = a.completions().iter().find(|c| c.completion.id == id).expect("completed").clone();
        (c.completed_ns, c.completion.result.expect("ok"))
    }

    /// A split read, some chunk pieces served straight from members and one rebuilt by
    /// an md thread, returns the data written; with and without CPU costs.
    #[test]
    fn split_reads_return_the_written_data() {
        for costs in [CpuCosts::none(), slow_md_pages()] {
            let cfg = config(Some(2), true);
            let mut a = array(&cfg, costs);
            let data: Vec<u8> = (0..(512u32 << 10)).map(|i| (i % 251) as u8).collect();
            a.submit(Request::write(1, 0, data.clone()));
            done_at(&mut a, 1);
            a.submit(Request::read(2, 0, 512 << 10));
            let (_, got) = done_at(&mut a, 2);
            assert!(got == data, "split read differs");
            assert!(a.engine().work.batches > 0);
        }
    }

    /// Stripe-cache work waits for md's thread; a chunk-aligned read on an optimal array
    /// goes straight to its member and does not.
    #[test]
    fn stripe_work_takes_md_time_and_bypass_reads_do_not() {
        let cfg = config(None, false);
        let mut a = array(&cfg, slow_md_pages());
        a.submit(Request::read(1, 0, 4096));
        let (bypass_ns, _) = done_at(&mut a, 1);
        assert!(bypass_ns < 1_000_000, "a bypass read waited for md: {bypass_ns} ns");
        let start = a.now_ns();
        // A partial-stripe write: read-modify-write of one data page and P.
        a.submit(Request::write(2, 1 << 20, vec![7; 4096]));
        let (write_ns, _) = done_at(&mut a, 2);
        assert!(write_ns - start >= 2_000_000, "md's pages took no time: {} ns", write_ns - start);
        let mut b = array(&cfg, CpuCosts::none());
        b.submit(Request::write(2, 1 << 20, vec![7; 4096]));
        let (free_ns, _) = done_at(&mut b, 2);
        assert!(free_ns < 1_000_000, "{free_ns}");
    }

    /// Degraded without md's old bypass, every read goes through the stripe cache.
    #[test]
    fn plans_follow_md() {
        let optimal = MdLayout::new(&config(None, false));
        let degraded = MdLayout::new(&config(Some(1), false));
        let old_md = MdLayout::new(&config(Some(1), true));
        let read = Request::read(1, 0, 256 << 10);
        assert_eq!(optimal.plan(&read), RequestPlan { direct_pieces: 4, stripe_pages: 0, split: true });
        assert_eq!(degraded.plan(&read), RequestPlan { direct_pieces: 0, stripe_pages: 64, split: true });
        // Chunk 1 of stripe 0 sits on member 1 (left-symmetric): only it goes through md.
        assert_eq!(old_md.plan(&read), RequestPlan { direct_pieces: 3, stripe_pages: 16, split: true });
        let write = Request::write(1, 0, vec![0; 8192]);
        assert_eq!(optimal.plan(&write), RequestPlan { direct_pieces: 0, stripe_pages: 2, split: false });
    }
}
