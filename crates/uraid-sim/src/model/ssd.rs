//! Flash behind the same trait as the disks.

use uraid_core::MemberIoOp;

use super::io::{DiskModel, QueuedIo};
use crate::profile::SsdProfile;

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
