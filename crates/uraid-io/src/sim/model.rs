//! Disk timing models behind one trait. A model only says how long things take and which
//! queued command goes next; contents live in [`super::store::MemberStore`].
//!
//! Everything is a pure function of the commands and the virtual time, so runs are
//! reproducible: rotational position, for one, comes from the time and a per-member
//! spindle phase drawn from the seed, never from a random draw per I/O.

use uraid_core::MemberIoOp;

use super::profile::{DiskProfile, HddProfile, SsdProfile};

/// A command the device holds, as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuedIo {
    pub op: MemberIoOp,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub arrival_ns: u64,
}

pub trait DiskModel: Send {
    /// Commands served at the same time (1 for a disk arm, flash channels for an SSD).
    fn channels(&self) -> usize;
    /// Commands the device holds, in service or waiting (NCQ depth).
    fn queue_depth(&self) -> usize;
    /// Whether `start` may pick other than the oldest command; if not, callers pass one.
    fn reorders(&self) -> bool;
    /// Start one of `queued` (oldest first, never empty; a `Flush` only ever alone) at
    /// `now_ns`: its index and its service time in ns.
    fn start(&mut self, queued: &[QueuedIo], now_ns: u64) -> (usize, u64);
    /// The power went away: buffers are empty, the head is wherever it stopped.
    fn power_cycle(&mut self);
}

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
}

#[derive(Clone, Copy, Debug)]
struct Stream {
    since_ns: u64,
    limit: u64,
    rate_bytes_per_ns: f64,
}

impl Segment {
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
    /// Scratch for `start`: per segment, the byte range a read must start in to possibly
    /// hit it (a superset of `classify`'s hits, so misses skip the exact test).
    hit_ranges: Vec<(u64, u64)>,
    /// `locate` results by offset (256 slots, direct-mapped; u64::MAX = empty).
    locate_memo: Box<[(u64, f64, f64); 256]>,
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
            locate_memo: Box::new([(u64::MAX, 0.0, 0.0); 256]),
            p,
        }
    }

    fn zone(&self, offset_bytes: u64) -> &Zone {
        let i = self.zones.partition_point(|z| z.end_bytes <= offset_bytes);
        &self.zones[i.min(self.zones.len() - 1)]
    }

    /// `locate`, remembered for recently asked offsets.
    fn locate_memo(&mut self, offset_bytes: u64) -> (f64, f64) {
        let i = ((offset_bytes >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize;
        let e = self.locate_memo[i];
        if e.0 == offset_bytes {
            return (e.1, e.2);
        }
        let (cyl, angle) = self.locate(offset_bytes);
        self.locate_memo[i] = (offset_bytes, cyl, angle);
        (cyl, angle)
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

    /// Seek plus rotational wait from the head's state at `t_ns` to the start of `offset_bytes`.
    fn positioning_ns(&self, offset_bytes: u64, t_ns: u64, write: bool) -> f64 {
        let (cyl, target_angle) = self.locate(offset_bytes);
        let seek = self.seek_to_ns(cyl, write);
        self.positioning_after_seek(seek, target_angle, self.turn_at(t_ns))
    }

    /// The seek part of `positioning_ns` (write settle included).
    fn seek_to_ns(&self, cyl: f64, write: bool) -> f64 {
        let mut seek = self.seek_ns((cyl - self.head_cylinder).abs());
        if write {
            seek += self.p.write_settle_ns as f64;
        }
        seek
    }

    /// `positioning_ns` given its seek part and `turn_at` the start time: adds the
    /// rotational wait (never negative). The turn is reduced by subtraction, so weighing
    /// many commands from one start costs one division, not one each.
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
                    if io.offset_bytes < s.start {
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

    fn service(&mut self, io: &QueuedIo, now_ns: u64) -> u64 {
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
                let pos = self.positioning_ns(
                    io.offset_bytes,
                    now_ns + overhead as u64,
                    io.op == MemberIoOp::Write,
                );
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
                            self.segments.insert(0, Segment { start: io.offset_bytes, end, streaming: None });
                            (0, end)
                        }
                    };
                    let rate =
                        self.zone(new_end.min(self.p.capacity_bytes.saturating_sub(1))).rate_bytes_per_ns;
                    let mut s = self.segments.remove(idx);
                    // A segment holds a bounded window behind the newest data.
                    s.start = s.start.max(end.saturating_sub(ra.max(io.len_bytes)));
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
        let mut pick = 0;
        let starving = queued[0].arrival_ns.saturating_add(self.p.max_queue_wait_ns) <= now_ns;
        if queued.len() > 1 && !starving {
            // Shortest positioning time first among the queued commands.
            let t = now_ns + self.p.command_overhead_ns;
            let mut best = f64::INFINITY;
            // A read can only hit a segment if it starts in [start, max(filled end, stream
            // limit)]; computing those once per call spares `classify` for most commands.
            // Sorted by start with a running maximum of the ends, a command's test is one
            // binary search instead of a pass over every segment.
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
            // Where the head is in its turn at `t` (positions after a seek add to it).
            let turn_at_t = self.turn_at(t);
            for (i, io) in queued.iter().enumerate() {
                let maybe_hit = io.op != MemberIoOp::Read || {
                    let below = ranges.partition_point(|&(lo, _)| lo <= io.offset_bytes);
                    below > 0 && ranges[below - 1].1 >= io.offset_bytes
                };
                let access = if maybe_hit { self.classify(io, now_ns).0 } else { Access::Mechanical };
                let cost = match access {
                    Access::Buffer | Access::Stream => 0.0,
                    Access::Mechanical => {
                        // Same arithmetic as `positioning_ns`, with the position memoised (a
                        // queued command is weighed at every start until it runs) and the
                        // rotational wait skipped when the seek alone cannot beat the best.
                        let (cyl, angle) = self.locate_memo(io.offset_bytes);
                        let seek = self.seek_to_ns(cyl, io.op == MemberIoOp::Write);
                        if seek >= best {
                            continue;
                        }
                        self.positioning_after_seek(seek, angle, turn_at_t)
                    }
                };
                if cost < best {
                    best = cost;
                    pick = i;
                }
            }
            self.hit_ranges = ranges;
        }
        let service = self.service(&queued[pick], now_ns);
        (pick, service)
    }
    fn power_cycle(&mut self) {
        self.segments.clear();
        self.last_end_bytes = u64::MAX;
        self.last_was_write = false;
    }
}

/// Flash: `channels` commands at once, fixed latencies, transfers one after another on
/// the shared host link.
pub struct SsdModel {
    p: SsdProfile,
    link_bytes_per_ns: f64,
    link_free_ns: u64,
}

impl SsdModel {
    pub fn new(p: SsdProfile) -> Self {
        SsdModel { link_bytes_per_ns: p.link_rate_bytes_per_s as f64 / 1e9, link_free_ns: 0, p }
    }
}

impl DiskModel for SsdModel {
    fn channels(&self) -> usize {
        self.p.channels as usize
    }
    fn queue_depth(&self) -> usize {
        self.p.queue_depth as usize
    }
    fn reorders(&self) -> bool {
        false
    }
    fn start(&mut self, queued: &[QueuedIo], now_ns: u64) -> (usize, u64) {
        let io = &queued[0];
        let xfer_ns = (io.len_bytes as f64 / self.link_bytes_per_ns) as u64;
        let done = match io.op {
            MemberIoOp::Read => {
                let ready = now_ns + self.p.read_latency_ns;
                let start = ready.max(self.link_free_ns);
                self.link_free_ns = start + xfer_ns;
                self.link_free_ns
            }
            MemberIoOp::Write => {
                let start = now_ns.max(self.link_free_ns);
                self.link_free_ns = start + xfer_ns;
                self.link_free_ns + self.p.write_latency_ns
            }
            MemberIoOp::Flush => now_ns + self.p.flush_ns,
        };
        (0, (done - now_ns).max(1))
    }
    fn power_cycle(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdd() -> HddModel {
        match DiskProfile::builtin("hdd-7200-2009").unwrap() {
            DiskProfile::Hdd(p) => HddModel::new(p, 0),
            _ => unreachable!(),
        }
    }

    #[test]
    fn seek_curve_is_continuous_and_monotonic() {
        let m = hdd();
        let b = m.seek_boundary_cylinders;
        assert!((m.seek_ns(b) - (m.seek_c + m.seek_e * b)).abs() < 1.0);
        let mut last = 0.0;
        for d in [1.0, 10.0, 100.0, 1000.0, b, b + 1.0, 100_000.0, 119_999.0] {
            let t = m.seek_ns(d);
            assert!(t >= last, "seek({d}) = {t} < {last}");
            last = t;
        }
        assert!((m.seek_ns(1.0) - 800_000.0).abs() < 1.0);
    }

    #[test]
    fn outer_zone_is_faster() {
        let m = hdd();
        let outer = m.media_ns(0, 1 << 20);
        let inner = m.media_ns(m.p.capacity_bytes - (1 << 20), 1 << 20);
        assert!(inner > outer * 1.5);
    }
}
