//! Disk timing models behind one trait. A model only says how long things take and which
//! queued command goes next; contents live in [`crate::store::MemberStore`].
//!
//! Everything is a pure function of the commands and the virtual time, so runs are
//! reproducible: rotational position, for one, comes from the time and a per-member
//! spindle phase drawn from the seed, never from a random draw per I/O.

use uraid_core::MemberIoOp;

use crate::profile::{DiskProfile, HddProfile};

mod candidates;
mod io;
mod ssd;

use candidates::{Best, Candidate, CandidateSet};
pub use io::{DiskModel, QueuedIo};
pub use ssd::SsdModel;

pub fn model_for(profile: &DiskProfile, spindle_phase_ns: u64) -> Box<dyn DiskModel> {
    match profile {
        DiskProfile::Hdd(p) => Box::new(HddModel::new(p.clone(), spindle_phase_ns)),
        DiskProfile::Ssd(p) => Box::new(SsdModel::new(p.clone())),
    }
}

#[derive(Clone, Debug)]
struct Zone {
    start_bytes: u64,
    end_bytes: u64,
    first_cylinder: f64,
    cylinder_bytes: f64,
    track_bytes: f64,
    rate_bytes_per_ns: f64,
}

/// A read-ahead buffer segment: bytes `[start, end)` are in the buffer. The segment the
/// head is streaming into also grows with time until `limit`.
#[derive(Clone, Copy, Debug)]
struct Segment {
    start: u64,
    end: u64,
    streaming: Option<Stream>,
    /// Ranges `[lo, hi)` of it the host has read, for a drive that does not serve a range
    /// twice (`keeps_read_data = false`); empty (lo == hi) otherwise. A few, because the
    /// host reads the same stream in more than one place at once (md's re-reads follow
    /// its bypassed reads).
    consumed: [(u64, u64); CONSUMED_RANGES],
}

const CONSUMED_RANGES: usize = 4;

#[derive(Clone, Copy, Debug)]
struct Stream {
    since_ns: u64,
    limit: u64,
    rate_bytes_per_ns: f64,
}

impl Segment {
    fn consumed_overlaps(&self, lo: u64, hi: u64) -> bool {
        self.consumed.iter().any(|&(a, b)| lo < b && a < hi)
    }

    /// The host read `[lo, hi)` from it: grows a consumed range it touches (reads of one
    /// stream, even reordered, touch each other), or replaces the lowest one.
    fn consume(&mut self, lo: u64, hi: u64) {
        if let Some(r) = self.consumed.iter_mut().find(|(a, b)| a < b && lo <= *b && *a <= hi) {
            *r = (r.0.min(lo), r.1.max(hi));
            return;
        }
        let lowest =
            self.consumed.iter_mut().min_by_key(|(a, b)| if a < b { *b } else { 0 }).expect("ranges");
        *lowest = (lo, hi);
    }

    fn filled_end(&self, now_ns: u64) -> u64 {
        match self.streaming {
            Some(s) => {
                let grown = (now_ns.saturating_sub(s.since_ns) as f64 * s.rate_bytes_per_ns) as u64;
                (self.end + grown).min(s.limit)
            }
            None => self.end,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Whole range in the buffer.
    Buffer,
    /// Continues the head's current stream: no seek, no rotational wait.
    Stream,
    Mechanical,
}

/// Hard disk after Ruemmler & Wilkes 1994 (see the profile fields).
pub struct HddModel {
    p: HddProfile,
    zones: Vec<Zone>,
    /// The zone `zone` found last: most lookups fall in it again (a member smaller than a
    /// zone never leaves it).
    last_zone: std::cell::Cell<usize>,
    rotation_ns: u64,
    spindle_phase_ns: u64,
    /// Short seeks: a + b*sqrt(d); long: c + e*d (ns, d in cylinders).
    seek_a: f64,
    seek_b: f64,
    seek_c: f64,
    seek_e: f64,
    seek_boundary_cylinders: f64,
    bus_bytes_per_ns: f64,
    head_cylinder: f64,
    /// Where and when the last command left the head, for streaming writes.
    last_end_bytes: u64,
    last_done_ns: u64,
    last_was_write: bool,
    /// Most recently used first.
    segments: Vec<Segment>,
    /// Scratch for `pick_by_full_scan`: per segment, the byte range a read must start in to possibly
    /// hit it (a superset of `classify`'s hits, so misses skip the exact test).
    hit_ranges: Vec<(u64, u64)>,
    /// The commands `start` was last given, less the one it picked.
    candidates: CandidateSet,
    /// Every command with a lower seq has been put into `candidates` (or picked).
    next_unadded_seq: u64,
    /// Picks so far (marks what one pick has weighed).
    picks: u64,
    /// Which of the pick's two scans ended the last pick.
    angle_scan_ends_first: bool,
    /// Whether the pick may stop before weighing every command: the cylinder never falls
    /// as the offset rises, no seek is negative, and the seek time never falls by more
    /// than `seek_slack_ns` as the distance grows.
    prune: bool,
    seek_slack_ns: f64,
}

impl HddModel {
    pub fn new(p: HddProfile, spindle_phase_ns: u64) -> Self {
        let rotation_ns = 60_000_000_000u64 / p.rpm as u64;
        let zones_n = p.zones as usize;
        let outer = p.outer_rate_bytes_per_s as f64;
        let inner = p.inner_rate_bytes_per_s as f64;
        let rates: Vec<f64> =
            (0..zones_n)
                .map(|z| {
                    if zones_n == 1 {
                        outer
                    } else {
                        outer + (inner - outer) * z as f64 / (zones_n - 1) as f64
                    }
                })
                .collect();
        let rate_sum: f64 = rates.iter().sum();
        let cylinders_per_zone = p.cylinders as f64 / zones_n as f64;
        let mut zones = Vec::with_capacity(zones_n);
        let mut start = 0u64;
        for (z, &rate) in rates.iter().enumerate() {
            // Bytes per zone follow the rate: same cylinders, denser outer tracks.
            let end = if z + 1 == zones_n {
                p.capacity_bytes
            } else {
                start + (p.capacity_bytes as f64 * rate / rate_sum) as u64
            };
            zones.push(Zone {
                start_bytes: start,
                end_bytes: end,
                first_cylinder: z as f64 * cylinders_per_zone,
                cylinder_bytes: (end - start) as f64 / cylinders_per_zone,
                track_bytes: rate * rotation_ns as f64 / 1e9,
                rate_bytes_per_ns: rate / 1e9,
            });
            start = end;
        }
        let t1 = p.seek_track_to_track_ns as f64;
        let t3 = p.seek_third_stroke_ns as f64;
        let tf = p.seek_full_stroke_ns as f64;
        let boundary = p.cylinders as f64 / 3.0;
        let seek_b = (t3 - t1) / (boundary.sqrt() - 1.0);
        let seek_a = t1 - seek_b;
        let seek_e = (tf - t3) / (p.cylinders as f64 - boundary);
        let seek_c = t3 - seek_e * boundary;
        HddModel {
            zones,
            last_zone: std::cell::Cell::new(0),
            rotation_ns,
            spindle_phase_ns: spindle_phase_ns % rotation_ns.max(1),
            seek_a,
            seek_b,
            seek_c,
            seek_e,
            seek_boundary_cylinders: boundary,
            bus_bytes_per_ns: p.bus_rate_bytes_per_s as f64 / 1e9,
            head_cylinder: 0.0,
            last_end_bytes: u64::MAX,
            last_done_ns: 0,
            last_was_write: false,
            segments: Vec::new(),
            hit_ranges: Vec::new(),
            candidates: CandidateSet::default(),
            next_unadded_seq: 0,
            picks: 0,
            angle_scan_ends_first: true,
            prune: false,
            seek_slack_ns: 0.0,
            p,
        }
        .with_pruning_checked()
    }

    /// Sets `prune` and `seek_slack_ns` from the profile's curves. Within a zone the
    /// cylinder is a floor of a rising quotient and each seek piece is a rising function,
    /// so only the joints can go wrong: zone boundaries, the jump to the linear piece, and
    /// the step from no seek to the shortest one.
    fn with_pruning_checked(mut self) -> Self {
        let cylinders_rise = self
            .zones
            .iter()
            .filter(|z| z.start_bytes > 0 && z.start_bytes < self.p.capacity_bytes)
            .all(|z| self.locate(z.start_bytes - 1).0 <= self.locate(z.start_bytes).0);
        let b = self.seek_boundary_cylinders;
        let short_at_boundary = self.seek_a + self.seek_b * b.sqrt();
        let long_at_boundary = self.seek_c + self.seek_e * b;
        let shortest = self.seek_a + self.seek_b * 0.5f64.sqrt();
        let pieces_rise =
            self.seek_b >= 0.0 && self.seek_e >= 0.0 && shortest >= 0.0 && long_at_boundary >= 0.0;
        let jump = (short_at_boundary - long_at_boundary).max(0.0);
        self.prune = cylinders_rise && pieces_rise && jump.is_finite();
        // Twice the jump and a nanosecond besides: room for the rounding of the bound
        // itself, at no cost worth measuring next to millisecond positioning times.
        self.seek_slack_ns = 2.0 * jump + 1.0;
        self
    }

    fn zone(&self, offset_bytes: u64) -> &Zone {
        // Zones are contiguous, so one holding the offset is the one the search finds.
        let last = &self.zones[self.last_zone.get()];
        if last.start_bytes <= offset_bytes && offset_bytes < last.end_bytes {
            return last;
        }
        let i = self.zones.partition_point(|z| z.end_bytes <= offset_bytes).min(self.zones.len() - 1);
        self.last_zone.set(i);
        &self.zones[i]
    }

    /// Cylinder and angular position (fraction of a turn) of a byte.
    fn locate(&self, offset_bytes: u64) -> (f64, f64) {
        let z = self.zone(offset_bytes);
        let in_zone = offset_bytes.saturating_sub(z.start_bytes) as f64;
        let cylinder = z.first_cylinder + (in_zone / z.cylinder_bytes).floor();
        let in_track = (in_zone % z.cylinder_bytes) % z.track_bytes;
        (cylinder, in_track / z.track_bytes)
    }

    pub fn seek_ns(&self, distance_cylinders: f64) -> f64 {
        if distance_cylinders < 0.5 {
            0.0
        } else if distance_cylinders <= self.seek_boundary_cylinders {
            self.seek_a + self.seek_b * distance_cylinders.sqrt()
        } else {
            self.seek_c + self.seek_e * distance_cylinders
        }
    }

    /// Where the head is in its turn at `t_ns`, in ns since the index mark.
    fn turn_at(&self, t_ns: u64) -> u64 {
        (t_ns + self.spindle_phase_ns) % self.rotation_ns
    }

    /// Media transfer time for a range, integrating across zone boundaries.
    fn media_ns(&self, offset_bytes: u64, len_bytes: u64) -> f64 {
        let mut t = 0.0;
        let mut pos = offset_bytes;
        let end = offset_bytes + len_bytes;
        while pos < end {
            let z = self.zone(pos);
            let n = end.min(z.end_bytes.max(pos + 1)) - pos;
            t += n as f64 / z.rate_bytes_per_ns;
            pos += n;
        }
        t
    }

    /// Seek time from the head to cylinder `cyl` (write settle included).
    fn seek_to_ns(&self, cyl: f64, write: bool) -> f64 {
        let mut seek = self.seek_ns((cyl - self.head_cylinder).abs());
        if write {
            seek += self.p.write_settle_ns as f64;
        }
        seek
    }

    /// Seek plus rotational wait (never negative), given the seek and `turn_at` the start
    /// time. The turn is reduced by subtraction, so weighing many commands from one start
    /// costs one division, not one each.
    fn positioning_after_seek(&self, seek: f64, target_angle: f64, turn_at_t: u64) -> f64 {
        let mut turn = turn_at_t + seek as u64;
        while turn >= self.rotation_ns {
            turn -= self.rotation_ns;
        }
        let mut wait = target_angle - turn as f64 / self.rotation_ns as f64;
        if wait < 0.0 {
            wait += 1.0;
        }
        seek + wait * self.rotation_ns as f64
    }

    fn classify(&self, io: &QueuedIo, now_ns: u64) -> (Access, Option<usize>) {
        let end = io.offset_bytes + io.len_bytes;
        match io.op {
            MemberIoOp::Read => {
                for (i, s) in self.segments.iter().enumerate() {
                    if io.offset_bytes < s.start || s.consumed_overlaps(io.offset_bytes, end) {
                        continue;
                    }
                    if end <= s.filled_end(now_ns) {
                        return (Access::Buffer, Some(i));
                    }
                    if let Some(st) = s.streaming {
                        if io.offset_bytes <= st.limit && now_ns < self.stream_stop_ns(s) {
                            return (Access::Stream, Some(i));
                        }
                    }
                }
                (Access::Mechanical, None)
            }
            MemberIoOp::Write => {
                // The write cache turns a back-to-back sequential write into a stream.
                let streaming = self.p.write_cache
                    && self.last_was_write
                    && io.offset_bytes == self.last_end_bytes
                    && now_ns.saturating_sub(self.last_done_ns) <= self.rotation_ns;
                (if streaming { Access::Stream } else { Access::Mechanical }, None)
            }
            MemberIoOp::Flush => (Access::Buffer, None),
        }
    }

    /// When read-ahead into a streaming segment stops (its limit reached).
    fn stream_stop_ns(&self, s: &Segment) -> u64 {
        match s.streaming {
            Some(st) => st.since_ns + ((st.limit - s.end) as f64 / st.rate_bytes_per_ns) as u64,
            None => 0,
        }
    }

    fn freeze_streams(&mut self, now_ns: u64) {
        for s in &mut self.segments {
            let end = s.filled_end(now_ns);
            s.end = end;
            s.streaming = None;
        }
    }

    /// Which of `queued` goes next: shortest positioning time first when `reorder`, else
    /// the oldest. Same choice as `pick_by_full_scan`, which weighs every command in queue
    /// order; this one weighs the few the head can reach in time (see `best_candidate`).
    /// Also returns the picked command's `locate`, when known.
    fn pick(&mut self, queued: &[QueuedIo], now_ns: u64, reorder: bool) -> (usize, Option<(f64, f64)>) {
        if queued.len() == 1 && self.candidates.len() == 0 {
            // Nothing to choose from and nothing kept: keeping this one would only be undone.
            self.next_unadded_seq = queued[0].seq.wrapping_add(1);
            return (0, None);
        }
        if self.sync_candidates(queued) {
            let slot = if reorder { self.best_candidate(now_ns) } else { self.slot_of(queued[0].seq) };
            if let Some(slot) = slot {
                let c = self.candidates.slots[slot as usize];
                let i = queued.partition_point(|q| q.seq < c.io.seq);
                if queued.get(i).is_some_and(|q| q.seq == c.io.seq) {
                    self.candidates.remove(slot);
                    return (i, Some((c.cylinder, c.angle)));
                }
            }
        }
        // `queued` is not the queue the candidates were kept for: start over.
        self.candidates.clear();
        self.next_unadded_seq = 0;
        (if reorder { self.pick_by_full_scan(queued, now_ns) } else { 0 }, None)
    }

    fn slot_of(&self, seq: u64) -> Option<u32> {
        self.candidates.by_offset.iter().map(|e| e.slot).find(|&s| self.candidates.seq(s) == seq)
    }

    /// Brings `candidates` in line with `queued`: drops what fell off its back (a flush
    /// now cuts it shorter), adds what joined. False if they then disagree in number.
    fn sync_candidates(&mut self, queued: &[QueuedIo]) -> bool {
        let last_seq = queued[queued.len() - 1].seq;
        if last_seq < self.next_unadded_seq {
            self.candidates.retain_seq_up_to(last_seq);
        }
        let new_from =
            queued.len() - queued.iter().rev().take_while(|q| q.seq >= self.next_unadded_seq).count();
        for q in &queued[new_from..] {
            let (cylinder, angle) = self.locate(q.offset_bytes);
            self.candidates.insert(Candidate {
                io: *q,
                cylinder,
                angle,
                angle_ns: angle * self.rotation_ns as f64,
                weighed_by: 0,
            });
        }
        self.next_unadded_seq = last_seq.wrapping_add(1);
        self.candidates.len() == queued.len()
    }

    /// Per segment, the byte range a read must start in to possibly hit it (a superset of
    /// `classify`'s hits), sorted by start with each end raised to the running maximum, so
    /// whether an offset is in any of them is decided by the last range starting at or
    /// below it.
    fn fill_hit_ranges(&mut self, now_ns: u64) {
        let mut ranges = std::mem::take(&mut self.hit_ranges);
        ranges.clear();
        ranges.extend(self.segments.iter().map(|s| {
            let mut hi = s.filled_end(now_ns);
            if let Some(st) = s.streaming {
                if now_ns < self.stream_stop_ns(s) {
                    hi = hi.max(st.limit);
                }
            }
            (s.start, hi)
        }));
        ranges.sort_unstable_by_key(|&(lo, _)| lo);
        let mut reach = 0;
        for r in ranges.iter_mut() {
            reach = reach.max(r.1);
            r.1 = reach;
        }
        self.hit_ranges = ranges;
    }

    /// What the pick weighs: no time for a command the buffer or a stream serves, else seek
    /// plus rotational wait. `seek_ns` is `seek_ns` of the distance from the head.
    fn cost(
        &self,
        io: &QueuedIo,
        maybe_hit: bool,
        seek_ns: f64,
        angle: f64,
        now_ns: u64,
        turn_at_t: u64,
    ) -> f64 {
        let access = if maybe_hit { self.classify(io, now_ns).0 } else { Access::Mechanical };
        match access {
            Access::Buffer | Access::Stream => 0.0,
            Access::Mechanical => {
                let settle = if io.op == MemberIoOp::Write { self.p.write_settle_ns as f64 } else { 0.0 };
                self.positioning_after_seek(seek_ns + settle, angle, turn_at_t)
            }
        }
    }

    /// The candidate of the lowest cost, oldest first among equals.
    ///
    /// Commands the buffer or a write stream may serve can cost nothing wherever they are,
    /// so they are weighed first. Every other cost is at least its seek, and at least the
    /// time until the platter brings its angle under the head (the rotational wait counts
    /// from where the seek ends, and the seek takes no negative time). So the rest are
    /// weighed along two scans, from the nearest cylinder outward and from the head's angle
    /// onward, and the pick stops once either scan's bound exceeds the best cost found:
    /// everything not yet weighed costs at least that bound.
    fn best_candidate(&mut self, now_ns: u64) -> Option<u32> {
        self.picks += 1;
        let pick_id = self.picks;
        let turn_at_t = self.turn_at(now_ns + self.p.command_overhead_ns);
        let mut set = std::mem::take(&mut self.candidates);
        let head = self.head_cylinder;
        let mut best = Best { cost: f64::INFINITY, seq: u64::MAX, slot: u32::MAX };
        // A read may hit a segment if it starts in [start, max(filled end, live stream's
        // limit)] (a superset of `classify`'s hits): few segments, each a binary search.
        for s in &self.segments {
            let mut hi = s.filled_end(now_ns);
            if let Some(st) = s.streaming {
                if now_ns < self.stream_stop_ns(s) {
                    hi = hi.max(st.limit);
                }
            }
            if hi < s.start || !set.may_hold(s.start, hi) {
                continue;
            }
            let from = set.by_offset.partition_point(|e| e.offset_bytes < s.start);
            for e in &set.by_offset[from..] {
                if e.offset_bytes > hi {
                    break;
                }
                let slot = e.slot;
                let c = &mut set.slots[slot as usize];
                if c.io.op == MemberIoOp::Read && c.weighed_by != pick_id {
                    c.weighed_by = pick_id;
                    let seek = self.seek_ns((c.cylinder - head).abs());
                    best.offer(self.cost(&c.io, true, seek, c.angle, now_ns, turn_at_t), c.io.seq, slot);
                }
            }
        }
        if self.p.write_cache && self.last_was_write {
            let from = set.by_offset.partition_point(|e| e.offset_bytes < self.last_end_bytes);
            for e in &set.by_offset[from..] {
                if e.offset_bytes != self.last_end_bytes {
                    break;
                }
                let slot = e.slot;
                let c = &mut set.slots[slot as usize];
                if c.io.op == MemberIoOp::Write {
                    c.weighed_by = pick_id;
                    let seek = self.seek_ns((c.cylinder - head).abs());
                    best.offer(self.cost(&c.io, true, seek, c.angle, now_ns, turn_at_t), c.io.seq, slot);
                }
            }
        }
        // What is not weighed yet neither hits a segment nor continues a write stream.
        let weigh = |c: &Candidate, seek: f64| self.cost(&c.io, false, seek, c.angle, now_ns, turn_at_t);
        let n = set.len();
        if !self.prune {
            for e in &set.by_offset {
                let (slot, c) = (e.slot, &set.slots[e.slot as usize]);
                if c.weighed_by != pick_id {
                    best.offer(weigh(c, self.seek_ns((c.cylinder - head).abs())), c.io.seq, slot);
                }
            }
            self.candidates = set;
            return Some(best.slot);
        }
        // Cylinder scan: the next candidate is the nearer of the two beside the head.
        let mut above = set.by_offset.partition_point(|e| e.cylinder < head);
        let mut below = above;
        // Angle scan: from the head's angle onward round the turn. `ANGLE_SLACK_NS` keeps
        // the bounds below the computed costs when a target lies a rounding error behind
        // the head (its cost may come out as almost nothing or as almost a whole turn) or
        // the seek ends a rounding error before it (the seek is truncated to whole ns).
        const ANGLE_SLACK_NS: f64 = 4.0;
        let rotation = self.rotation_ns as f64;
        let from_ns = turn_at_t as f64 - ANGLE_SLACK_NS;
        let first = set.by_angle.partition_point(|e| e.angle_ns < from_ns);
        let mut angle_steps = 0;
        // Which scan ends first depends on whether seeks or rotation dominate the costs
        // (wide or narrow spread of cylinders), which changes slowly: the scan that ended
        // the last pick takes three steps to the other's one.
        let mut step = 0u32;
        loop {
            step += 1;
            let angle_turn = self.angle_scan_ends_first != step.is_multiple_of(4);
            let slot = if angle_turn {
                if angle_steps == n {
                    self.angle_scan_ends_first = true;
                    break;
                }
                let e = set.by_angle[(first + angle_steps) % n];
                angle_steps += 1;
                let mut ahead = e.angle_ns - from_ns;
                if ahead < 0.0 {
                    ahead += rotation;
                }
                if ahead - ANGLE_SLACK_NS > best.cost {
                    self.angle_scan_ends_first = true;
                    break;
                }
                e.slot
            } else {
                let down = if below > 0 { head - set.by_offset[below - 1].cylinder } else { f64::INFINITY };
                let up = if above < n { set.by_offset[above].cylinder - head } else { f64::INFINITY };
                let (slot, distance) = if down <= up {
                    if below == 0 {
                        self.angle_scan_ends_first = false;
                        break;
                    }
                    below -= 1;
                    (set.by_offset[below].slot, down)
                } else {
                    above += 1;
                    (set.by_offset[above - 1].slot, up)
                };
                if self.seek_ns(distance) - self.seek_slack_ns > best.cost {
                    self.angle_scan_ends_first = false;
                    break;
                }
                slot
            };
            let c = &mut set.slots[slot as usize];
            if c.weighed_by != pick_id {
                c.weighed_by = pick_id;
                let seek = self.seek_ns((c.cylinder - head).abs());
                // Its own bound first, sparing the division for most: the wait counts from
                // the end of the seek, so a target the head passes while seeking costs a
                // further turn.
                let mut ahead = c.angle_ns - from_ns;
                if ahead < 0.0 {
                    ahead += rotation;
                }
                let by_angle = ahead - ANGLE_SLACK_NS;
                let bound = if seek >= ahead + ANGLE_SLACK_NS { by_angle + rotation } else { by_angle };
                if bound.max(seek) <= best.cost {
                    best.offer(weigh(c, seek), c.io.seq, slot);
                }
            }
        }
        self.candidates = set;
        Some(best.slot)
    }

    /// The plain shortest-positioning-time-first pick: every command weighed in queue
    /// order, the first of the lowest cost kept. The reference `pick` must agree with.
    fn pick_by_full_scan(&mut self, queued: &[QueuedIo], now_ns: u64) -> usize {
        let turn_at_t = self.turn_at(now_ns + self.p.command_overhead_ns);
        self.fill_hit_ranges(now_ns);
        let ranges = &self.hit_ranges;
        let (mut pick, mut best) = (0, f64::INFINITY);
        for (i, io) in queued.iter().enumerate() {
            let maybe_hit = io.op != MemberIoOp::Read || {
                let below = ranges.partition_point(|&(lo, _)| lo <= io.offset_bytes);
                below > 0 && ranges[below - 1].1 >= io.offset_bytes
            };
            let (cyl, angle) = self.locate(io.offset_bytes);
            let cost = self.cost(
                io,
                maybe_hit,
                self.seek_ns((cyl - self.head_cylinder).abs()),
                angle,
                now_ns,
                turn_at_t,
            );
            if cost < best {
                best = cost;
                pick = i;
            }
        }
        pick
    }

    /// `place`: `locate(io.offset_bytes)` if the caller has it.
    fn service(&mut self, io: &QueuedIo, place: Option<(f64, f64)>, now_ns: u64) -> u64 {
        let overhead = self.p.command_overhead_ns as f64;
        let end = io.offset_bytes + io.len_bytes;
        if io.op == MemberIoOp::Flush {
            return self.p.flush_ns + self.p.command_overhead_ns;
        }
        let (access, seg) = self.classify(io, now_ns);
        let t = match access {
            Access::Buffer => overhead + io.len_bytes as f64 / self.bus_bytes_per_ns,
            Access::Stream if io.op == MemberIoOp::Read => {
                let s = self.segments[seg.unwrap_or(0)];
                let st = s.streaming.expect("stream segment");
                // The range is in the buffer once the media has passed its end; the bus
                // transfer overlaps the media read.
                let ready = st.since_ns as f64 + (end - s.end) as f64 / st.rate_bytes_per_ns;
                (ready - now_ns as f64).max(0.0) + overhead
            }
            Access::Stream => overhead + self.media_ns(io.offset_bytes, io.len_bytes),
            Access::Mechanical => {
                let (cyl, angle) = place.unwrap_or_else(|| self.locate(io.offset_bytes));
                let seek = self.seek_to_ns(cyl, io.op == MemberIoOp::Write);
                let pos = self.positioning_after_seek(seek, angle, self.turn_at(now_ns + overhead as u64));
                overhead + pos + self.media_ns(io.offset_bytes, io.len_bytes)
            }
        };
        let service_ns = t.max(1.0) as u64;
        let done = now_ns + service_ns;
        match io.op {
            MemberIoOp::Read => {
                let ra = self.p.readahead_bytes;
                if access != Access::Buffer {
                    // A stream never stopped: what it buffered by `done` stays buffered.
                    let streamed_end = match (access, seg) {
                        (Access::Stream, Some(i)) => Some(self.segments[i].filled_end(done).max(end)),
                        _ => None,
                    };
                    self.freeze_streams(now_ns);
                    let (idx, new_end) = match (streamed_end, seg) {
                        (Some(e), Some(i)) => (i, e),
                        _ => {
                            if self.segments.len() >= self.p.cache_segments.max(1) as usize {
                                self.segments.pop();
                            }
                            self.segments.insert(
                                0,
                                Segment {
                                    start: io.offset_bytes,
                                    end,
                                    streaming: None,
                                    consumed: [(0, 0); CONSUMED_RANGES],
                                },
                            );
                            (0, end)
                        }
                    };
                    let rate =
                        self.zone(new_end.min(self.p.capacity_bytes.saturating_sub(1))).rate_bytes_per_ns;
                    let mut s = self.segments.remove(idx);
                    // A segment holds a bounded window behind the newest data.
                    s.start = s.start.max(end.saturating_sub(ra.max(io.len_bytes)));
                    if !self.p.keeps_read_data {
                        s.consume(io.offset_bytes, end);
                    }
                    s.end = new_end;
                    let limit = (end + ra).max(new_end).min(self.p.capacity_bytes);
                    s.streaming = (limit > new_end).then_some(Stream {
                        since_ns: done,
                        limit,
                        rate_bytes_per_ns: rate,
                    });
                    self.segments.insert(0, s);
                    self.head_cylinder = self.locate(end.saturating_sub(1)).0;
                } else if let Some(i) = seg {
                    let mut s = self.segments.remove(i);
                    if !self.p.keeps_read_data {
                        s.consume(io.offset_bytes, end);
                    }
                    // Reading from a live stream pushes its read-ahead further.
                    let live = now_ns < self.stream_stop_ns(&s);
                    if let (true, Some(st)) = (live, s.streaming.as_mut()) {
                        st.limit = st.limit.max((end + ra).min(self.p.capacity_bytes));
                    }
                    self.segments.insert(0, s);
                }
                if self.p.cache_segments == 0 {
                    self.segments.clear();
                }
                self.last_was_write = false;
            }
            MemberIoOp::Write => {
                self.freeze_streams(now_ns);
                self.segments.retain(|s| end <= s.start || io.offset_bytes >= s.end);
                self.head_cylinder = self.locate(end.saturating_sub(1)).0;
                self.last_was_write = true;
            }
            MemberIoOp::Flush => {}
        }
        self.last_end_bytes = end;
        self.last_done_ns = done;
        service_ns
    }
}

impl DiskModel for HddModel {
    fn channels(&self) -> usize {
        1
    }
    fn queue_depth(&self) -> usize {
        self.p.ncq_depth as usize
    }
    fn reorders(&self) -> bool {
        self.p.ncq_depth > 1
    }
    fn start(&mut self, queued: &[QueuedIo], now_ns: u64) -> (usize, u64) {
        let starving = queued[0].arrival_ns.saturating_add(self.p.max_queue_wait_ns) <= now_ns;
        let (pick, place) = self.pick(queued, now_ns, queued.len() > 1 && !starving);
        let service = self.service(&queued[pick], place, now_ns);
        (pick, service)
    }
    fn power_cycle(&mut self) {
        self.segments.clear();
        self.candidates.clear();
        self.last_end_bytes = u64::MAX;
        self.last_was_write = false;
    }
}

#[cfg(test)]
mod tests;
