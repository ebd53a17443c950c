//! What every disk model is: a queue of commands it is handed ([`QueuedIo`]) and the
//! trait that says how long each takes ([`DiskModel`]). A leaf: the models import it.

use uraid_core::MemberIoOp;

/// A command the device holds, as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuedIo {
    pub op: MemberIoOp,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub arrival_ns: u64,
    /// Arrival number on this device, rising with every command submitted to it. A model
    /// may keep its own view of the queue from one `start` to the next by it; one that
    /// finds its view disagreeing with `queued` rebuilds it.
    pub seq: u64,
}

pub trait DiskModel: Send {
    /// Commands served at the same time (1 for a disk arm, flash channels for an SSD).
    fn channels(&self) -> usize;
    /// Commands the device holds, in service or waiting (NCQ depth).
    fn queue_depth(&self) -> usize;
    /// Whether `start` may pick other than the oldest command; if not, callers pass one.
    fn reorders(&self) -> bool;
    /// Start one of `queued` (oldest first, so `seq` rising; never empty; a `Flush` only
    /// ever alone) at `now_ns`: its index and its service time in ns. `queued` is the
    /// device's queue from its front: the commands not picked stay and are passed again,
    /// and new ones join at the back.
    fn start(&mut self, queued: &[QueuedIo], now_ns: u64) -> (usize, u64);
    /// The power went away: buffers are empty, the head is wherever it stopped.
    fn power_cycle(&mut self);
}
