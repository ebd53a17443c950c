//! The request queue in front of the engine: plugging and merging of adjacent requests, with
//! Linux's `nomerges` (0 = every merge, 1 = only the one-hit "last merge" cache, 2 = none).
//!
//! Requests are plugged (held) until `unplug`; while held, a request that continues or
//! precedes a held one of the same kind is merged into it. The merged request goes to the
//! engine once; its completion is split back into one completion per original request.
//! Seed 002 measured what the merge attempts cost a random workload that never merges; the
//! queue counts its attempts and merges, and its caller (who owns a clock) times it.

use std::collections::VecDeque;

use crate::api::*;
use crate::detmap::DetMap;

/// Largest merged request (Linux's default max_sectors_kb is 512 KiB or more; 1 MiB here).
pub const MAX_MERGED_BYTES: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub requests: u64,
    pub merge_attempts: u64,
    pub merges: u64,
    /// Requests handed to the engine (after merging).
    pub dispatched: u64,
}

/// One original request inside a (possibly merged) dispatched request.
#[derive(Clone, Copy, Debug)]
struct Part {
    id: RequestId,
    /// Byte offset of this part within the merged request.
    at: u64,
    len: u64,
}

#[derive(Debug)]
struct Held {
    req: Request,
    parts: Vec<Part>,
}

pub struct RequestQueue {
    nomerges: u8,
    held: Vec<Option<Held>>,
    order: VecDeque<usize>,
    /// End offset -> held index, for back merges (nomerges 0).
    by_end: DetMap<(RequestOp, u64), usize>,
    /// Start offset -> held index, for front merges (nomerges 0).
    by_start: DetMap<(RequestOp, u64), usize>,
    /// The one-hit cache: the request most recently added or merged into.
    last: Option<usize>,
    /// Dispatched id -> its parts (only for merged requests).
    merged: DetMap<RequestId, Vec<Part>>,
    next_id: RequestId,
    pub stats: QueueStats,
}

/// Dispatched ids of merged requests live far above callers' ids.
const MERGED_ID_BASE: RequestId = 1 << 62;

impl RequestQueue {
    pub fn new(nomerges: u8) -> Self {
        RequestQueue {
            nomerges: nomerges.min(2),
            held: Vec::new(),
            order: VecDeque::new(),
            by_end: DetMap::default(),
            by_start: DetMap::default(),
            last: None,
            merged: DetMap::default(),
            next_id: MERGED_ID_BASE,
            stats: QueueStats::default(),
        }
    }

    pub fn nomerges(&self) -> u8 {
        self.nomerges
    }

    pub fn set_nomerges(&mut self, nomerges: u8) {
        self.nomerges = nomerges.min(2);
    }

    fn mergeable(op: RequestOp) -> bool {
        matches!(op, RequestOp::Read | RequestOp::Write)
    }

    /// Hold `req` (plugged), merging it into a held neighbour when the policy allows.
    pub fn add(&mut self, req: Request) {
        self.stats.requests += 1;
        if self.nomerges < 2 && Self::mergeable(req.op) && !req.fua {
            // The one-hit cache first, as Linux's elv_merge does.
            if let Some(i) = self.last {
                self.stats.merge_attempts += 1;
                if self.try_merge(i, &req) {
                    self.absorb(i, req);
                    return;
                }
            }
            if self.nomerges == 0 {
                self.stats.merge_attempts += 1;
                let back = self.by_end.get(&(req.op, req.offset_bytes)).copied();
                let front = self.by_start.get(&(req.op, req.offset_bytes + req.len_bytes)).copied();
                for i in back.into_iter().chain(front) {
                    if self.try_merge(i, &req) {
                        self.absorb(i, req);
                        return;
                    }
                }
            }
        }
        let idx = self.held.len();
        if Self::mergeable(req.op) && self.nomerges == 0 {
            self.by_end.insert((req.op, req.offset_bytes + req.len_bytes), idx);
            self.by_start.insert((req.op, req.offset_bytes), idx);
        }
        let parts = vec![Part { id: req.id, at: 0, len: req.len_bytes }];
        self.held.push(Some(Held { req, parts }));
        self.order.push_back(idx);
        self.last = Some(idx);
    }

    fn try_merge(&self, i: usize, req: &Request) -> bool {
        let Some(h) = self.held.get(i).and_then(|h| h.as_ref()) else { return false };
        let r = &h.req;
        r.op == req.op
            && !r.fua
            && r.len_bytes + req.len_bytes <= MAX_MERGED_BYTES
            && (r.offset_bytes + r.len_bytes == req.offset_bytes
                || req.offset_bytes + req.len_bytes == r.offset_bytes)
    }

    fn absorb(&mut self, i: usize, req: Request) {
        self.stats.merges += 1;
        let h = self.held[i].as_mut().expect("held");
        let r = &mut h.req;
        if self.nomerges == 0 {
            self.by_end.remove(&(r.op, r.offset_bytes + r.len_bytes));
            self.by_start.remove(&(r.op, r.offset_bytes));
        }
        if r.offset_bytes + r.len_bytes == req.offset_bytes {
            // Back merge: the new request continues the held one.
            h.parts.push(Part { id: req.id, at: r.len_bytes, len: req.len_bytes });
            if r.op == RequestOp::Write {
                r.data.extend_from_slice(&req.data);
            }
        } else {
            // Front merge: the new request comes first; shift the others.
            for p in &mut h.parts {
                p.at += req.len_bytes;
            }
            h.parts.insert(0, Part { id: req.id, at: 0, len: req.len_bytes });
            r.offset_bytes = req.offset_bytes;
            if r.op == RequestOp::Write {
                let mut data = req.data;
                data.extend_from_slice(&r.data);
                r.data = data;
            }
        }
        r.len_bytes += req.len_bytes;
        if self.nomerges == 0 {
            self.by_end.insert((r.op, r.offset_bytes + r.len_bytes), i);
            self.by_start.insert((r.op, r.offset_bytes), i);
        }
        self.last = Some(i);
    }

    /// Requests held so far.
    pub fn held(&self) -> usize {
        self.order.len()
    }

    /// Unplug: every held request, in arrival order, ready for `Engine::submit`. Merged ones
    /// carry ids of the queue's own; pass their completions through `complete`.
    pub fn unplug(&mut self) -> Vec<Request> {
        let mut out = Vec::with_capacity(self.order.len());
        for idx in self.order.drain(..) {
            let Some(mut h) = self.held[idx].take() else { continue };
            if h.parts.len() > 1 {
                let id = self.next_id;
                self.next_id += 1;
                h.req.id = id;
                self.merged.insert(id, h.parts);
            }
            out.push(h.req);
        }
        self.held.clear();
        self.by_end.clear();
        self.by_start.clear();
        self.last = None;
        self.stats.dispatched += out.len() as u64;
        out
    }

    /// Turn an engine completion into the completions of the original requests.
    pub fn complete(&mut self, c: RequestCompletion) -> Vec<RequestCompletion> {
        if c.id < MERGED_ID_BASE {
            return vec![c];
        }
        let Some(parts) = self.merged.remove(&c.id) else {
            return vec![c];
        };
        parts
            .into_iter()
            .map(|p| RequestCompletion {
                id: p.id,
                result: match &c.result {
                    Ok(data) if !data.is_empty() => Ok(data[p.at as usize..(p.at + p.len) as usize].to_vec()),
                    Ok(_) => Ok(Vec::new()),
                    Err(e) => Err(*e),
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rd(id: u64, off: u64) -> Request {
        Request::read(id, off * 4096, 4096)
    }

    #[test]
    fn back_and_front_merges_and_the_split() {
        let mut q = RequestQueue::new(0);
        q.add(rd(1, 10));
        q.add(rd(2, 11)); // back merge via the one-hit cache
        q.add(rd(3, 5));
        q.add(rd(4, 9)); // front merge into 10..12 (not the last one added)
        let out = q.unplug();
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].offset_bytes, out[0].len_bytes), (9 * 4096, 3 * 4096));
        let data: Vec<u8> = (0..3 * 4096).map(|i| (i / 4096) as u8).collect();
        let parts = q.complete(RequestCompletion { id: out[0].id, result: Ok(data) });
        let ids: Vec<(u64, u8)> = parts.iter().map(|c| (c.id, c.result.as_ref().unwrap()[0])).collect();
        assert_eq!(ids, vec![(4, 0), (1, 1), (2, 2)]);
        assert_eq!(q.stats.merges, 2);
    }

    #[test]
    fn nomerges_one_takes_only_the_one_hit_merge() {
        let mut q = RequestQueue::new(1);
        q.add(rd(1, 10));
        q.add(rd(2, 11));
        q.add(rd(3, 5));
        q.add(rd(4, 9)); // would need the front-merge lookup
        assert_eq!(q.unplug().len(), 3);
        assert_eq!(q.stats.merges, 1);
    }

    #[test]
    fn nomerges_two_never_tries() {
        let mut q = RequestQueue::new(2);
        q.add(rd(1, 10));
        q.add(rd(2, 11));
        assert_eq!(q.unplug().len(), 2);
        assert_eq!((q.stats.merge_attempts, q.stats.merges), (0, 0));
    }

    #[test]
    fn writes_merge_their_payloads_in_order() {
        let mut q = RequestQueue::new(0);
        q.add(Request::write(1, 4096, vec![1; 4096]));
        q.add(Request::write(2, 0, vec![2; 4096]));
        q.add(Request::write(3, 8192, vec![3; 4096]));
        let out = q.unplug();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].offset_bytes, 0);
        assert_eq!(&out[0].data[..4096], &[2; 4096][..]);
        assert_eq!(&out[0].data[4096..8192], &[1; 4096][..]);
        assert_eq!(&out[0].data[8192..], &[3; 4096][..]);
        let done = q.complete(RequestCompletion { id: out[0].id, result: Ok(Vec::new()) });
        assert_eq!(done.len(), 3);
    }

    #[test]
    fn fua_and_flush_never_merge() {
        let mut q = RequestQueue::new(0);
        let mut w = Request::write(1, 0, vec![0; 512]);
        w.fua = true;
        q.add(w);
        q.add(Request::write(2, 512, vec![0; 512]));
        q.add(Request::flush(3));
        assert_eq!(q.unplug().len(), 3);
    }
}
