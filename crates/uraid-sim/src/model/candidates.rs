//! The commands a disk holds, in the orders the head's pick scans them.

use super::io::QueuedIo;

/// A queued command as the pick sees it. Its place on the platters is worked out once,
/// when it joins the queue, not at every pick it waits through.
#[derive(Clone, Copy, Debug)]
pub(super) struct Candidate {
    pub(super) io: QueuedIo,
    pub(super) cylinder: f64,
    pub(super) angle: f64,
    /// `angle` in ns of a turn past the index mark.
    pub(super) angle_ns: f64,
    /// The pick that last weighed it (see `HddModel::picks`).
    pub(super) weighed_by: u64,
}

/// The commands the device holds, in two orders the pick scans: by offset (so by
/// cylinder, see `HddModel::prune`) and by angle. The orders carry their keys, so a
/// search over them reads one small array.
#[derive(Default)]
pub(super) struct CandidateSet {
    pub(super) slots: Vec<Candidate>,
    pub(super) free: Vec<u32>,
    /// By (offset, seq).
    pub(super) by_offset: Vec<ByOffset>,
    /// By (angle_ns, seq).
    pub(super) by_angle: Vec<ByAngle>,
    /// Commands per MiB of offset (taken modulo the array's length): a range that covers
    /// only empty ones holds no command, which spares its search.
    pub(super) per_mib: Vec<u32>,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct ByOffset {
    pub(super) offset_bytes: u64,
    pub(super) cylinder: f64,
    pub(super) slot: u32,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct ByAngle {
    pub(super) angle_ns: f64,
    pub(super) slot: u32,
}

const PER_MIB_BUCKETS: u64 = 256;

impl CandidateSet {
    pub(super) fn len(&self) -> usize {
        self.by_offset.len()
    }
    pub(super) fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.by_offset.clear();
        self.by_angle.clear();
        self.per_mib.clear();
    }
    pub(super) fn bucket(offset_bytes: u64) -> usize {
        ((offset_bytes >> 20) % PER_MIB_BUCKETS) as usize
    }
    /// Whether some command may start in `[lo, hi]` (false: certainly none does).
    pub(super) fn may_hold(&self, lo: u64, hi: u64) -> bool {
        if self.per_mib.is_empty() || (hi >> 20) - (lo >> 20) >= PER_MIB_BUCKETS - 1 {
            return true;
        }
        ((lo >> 20)..=(hi >> 20)).any(|mib| self.per_mib[Self::bucket(mib << 20)] != 0)
    }
    pub(super) fn seq(&self, slot: u32) -> u64 {
        self.slots[slot as usize].io.seq
    }
    pub(super) fn insert(&mut self, c: Candidate) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = c;
                s
            }
            None => {
                self.slots.push(c);
                (self.slots.len() - 1) as u32
            }
        };
        let (offset, seq) = (c.io.offset_bytes, c.io.seq);
        let at = self.by_offset.partition_point(|e| {
            e.offset_bytes < offset || (e.offset_bytes == offset && self.seq(e.slot) < seq)
        });
        self.by_offset.insert(at, ByOffset { offset_bytes: offset, cylinder: c.cylinder, slot });
        let at = self.by_angle.partition_point(|e| {
            e.angle_ns < c.angle_ns || (e.angle_ns == c.angle_ns && self.seq(e.slot) < seq)
        });
        self.by_angle.insert(at, ByAngle { angle_ns: c.angle_ns, slot });
        if self.per_mib.is_empty() {
            self.per_mib = vec![0; PER_MIB_BUCKETS as usize];
        }
        self.per_mib[Self::bucket(offset)] += 1;
    }
    pub(super) fn remove(&mut self, slot: u32) {
        if let Some(at) = self.by_offset.iter().position(|e| e.slot == slot) {
            self.by_offset.remove(at);
        }
        if let Some(at) = self.by_angle.iter().position(|e| e.slot == slot) {
            self.by_angle.remove(at);
        }
        self.per_mib[Self::bucket(self.slots[slot as usize].io.offset_bytes)] -= 1;
        self.free.push(slot);
    }
    pub(super) fn retain_seq_up_to(&mut self, last_seq: u64) {
        let gone: Vec<u32> =
            self.by_offset.iter().map(|e| e.slot).filter(|&s| self.seq(s) > last_seq).collect();
        for s in gone {
            self.remove(s);
        }
    }
}

/// The pick's best so far: lowest cost, then oldest (what a scan in queue order keeps).
#[derive(Clone, Copy, Debug)]
pub(super) struct Best {
    pub(super) cost: f64,
    pub(super) seq: u64,
    pub(super) slot: u32,
}

impl Best {
    pub(super) fn offer(&mut self, cost: f64, seq: u64, slot: u32) {
        if cost < self.cost || (cost == self.cost && seq < self.seq) {
            *self = Best { cost, seq, slot };
        }
    }
}
