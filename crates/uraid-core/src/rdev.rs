//! md's rdev: each slot's runtime state in the engine (in sync, recovering, failed; the
//! bad-block log, write-mostly, the I/O in flight) and the device replacing it, if any.

use crate::api::*;
use crate::config::MemberState;
use crate::meta::badblocks::BadBlocks;

/// Runtime state of one raid slot.
#[derive(Clone, Debug)]
pub(crate) struct MemberRt {
    pub state: MemberState,
    pub data_offset_bytes: u64,
    pub inflight: u32,
    /// Member sector just past the last I/O sent (for read balancing).
    pub last_end_sector: u64,
    pub last_dispatch_ns: TimeNs,
    /// How long the member's last completed I/O took (gmirror's `d_delay`, for `load-time`).
    pub last_delay_ns: TimeNs,
    /// md's write-mostly: read only when no other copy can serve.
    pub write_mostly: bool,
    /// md's bad-block log of this member (device sectors); None: no log, so a write error
    /// fails the member.
    pub bad_blocks: Option<BadBlocks>,
    /// md's WriteErrorSeen: a write failed here this run, so a listed range is not
    /// rewritten after a read reconstructed it (md only retries ranges read errors listed).
    pub write_error_seen: bool,
    /// The caller's index of the device in this slot (`MemberIo::member`): the slot itself
    /// unless a replacement took the slot (see `replace`).
    pub io_member: usize,
}

impl MemberRt {
    /// A slot as the engine starts it: no I/O yet, reached as the caller's `io_member`.
    pub(crate) fn new(io_member: usize, state: MemberState, data_offset_bytes: u64) -> MemberRt {
        MemberRt {
            io_member,
            state,
            data_offset_bytes,
            inflight: 0,
            last_end_sector: 0,
            last_dispatch_ns: 0,
            last_delay_ns: 0,
            write_mostly: false,
            bad_blocks: None,
            write_error_seen: false,
        }
    }

    /// The slot's state moves only as md moves an rdev's: a working member fails, a free
    /// slot takes a device to rebuild, a rebuilt one joins. Anything else is an engine bug.
    pub(crate) fn set_state(&mut self, to: MemberState) {
        use MemberState::*;
        let legal = matches!(
            (self.state, to),
            (InSync | Recovering { .. }, Faulty)
                | (Faulty | Missing, Recovering { .. })
                | (Recovering { .. }, InSync)
        );
        assert!(legal, "member state {:?} -> {to:?}: not a move md makes", self.state);
        self.state = to;
    }

    /// May this member be read at data-relative `sector`?
    pub fn readable(&self, sector: u64) -> bool {
        match self.state {
            MemberState::InSync => true,
            MemberState::Recovering { recovery_offset_sectors } => sector < recovery_offset_sectors,
            _ => false,
        }
    }
    /// md's is_badblock: is any of data-relative `[sector, sector + len)` listed bad?
    pub fn has_bad_block(&self, sector: u64, len: u64) -> bool {
        self.bad_blocks.as_ref().is_some_and(|bb| {
            !bb.is_empty() && bb.overlaps(self.data_offset_bytes / SECTOR_BYTES + sector, len)
        })
    }

    /// Data-relative sectors strictly inside `(sector, sector + len)` where a listed range
    /// begins or ends, in order.
    pub fn bad_block_edges(&self, sector: u64, len: u64) -> Vec<u64> {
        let first = self.data_offset_bytes / SECTOR_BYTES;
        self.bad_blocks
            .as_ref()
            .map_or_else(Vec::new, |bb| bb.edges_within(first + sector, len).map(|e| e - first).collect())
    }

    /// May `[sector, sector + len)` be read here: readable and none of it listed bad.
    pub fn readable_range(&self, sector: u64, len: u64) -> bool {
        self.readable(sector + len.max(1) - 1) && !self.has_bad_block(sector, len)
    }

    /// Does this member receive writes?
    pub fn writable(&self) -> bool {
        matches!(self.state, MemberState::InSync | MemberState::Recovering { .. })
    }
}

/// The device being rebuilt to replace a slot's member.
#[derive(Clone, Debug)]
pub(crate) struct Replacement {
    /// The caller's member index for its I/O (`MemberIo::member`).
    pub io_member: usize,
    pub data_offset_bytes: u64,
    /// Member data sectors below this are copied (md's recovery_offset).
    pub recovery_offset_sectors: u64,
    /// The copy is done; it waits for `promote_replacement`.
    pub copied: bool,
}

/// A replacement as the caller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplacementStatus {
    pub slot: usize,
    pub io_member: usize,
    pub recovery_offset_sectors: u64,
    /// Copied in full and waiting for `Engine::promote_replacement`.
    pub copied: bool,
}
