//! md's write-behind for raid1 (`raid1_write_request` with `R1BIO_BehindIO`): a client
//! write to an array with write-mostly members completes once every other member has it;
//! the write-mostly copies land later, from a buffer of their own, at most
//! `max_write_behind` requests at a time (the bitmap superblock's `write_behind`).
//!
//! Safety rules, each kept here:
//! - a request goes behind only when an in-sync member that is not write-mostly takes
//!   its write, and if that write fails the request waits for its behind copies after all;
//! - its bitmap bits stay until the behind copies land (the array ends the write then,
//!   `EngineEvent::BehindWriteDone`), so a crash or a failed behind member resyncs it;
//! - a flush waits for the behind writes taken in before it (their write order number
//!   stays in flight);
//! - writes to a write-mostly member overlapping a behind write there wait for it, so a
//!   later write never lands before an earlier one (md's `wait_for_serialization`);
//! - a read sent to a write-mostly member waits while a behind write overlaps it, and no
//!   new write goes behind while a read waits (md's `behind_wait`);
//! - while no in-sync member that is not write-mostly is left, nothing is acknowledged
//!   until the behind writes landed: acknowledged data is never only in flight.

use crate::api::*;
use crate::detmap::DetMap;
use crate::ledger::IoCtx;

mod ops;

/// One copy of a request's write to a write-mostly member, in flight or waiting for an
/// earlier overlapping one on that member.
#[derive(Debug)]
pub(crate) struct MemberWrite {
    pub member: usize,
    pub member_sector: u64,
    pub len_sectors: u64,
    pub data: IoBytes,
    pub ctx: IoCtx,
    pub issued: bool,
}

/// A request some of whose copies are behind.
#[derive(Debug)]
pub(crate) struct Group {
    pub req: RequestId,
    /// Behind copies not yet landed.
    pub pending: u32,
    /// The request's write order number, kept in flight for flushes until they land.
    pub seq: Option<u64>,
    /// The request finished (the client has its answer): the array hears of the end.
    pub finished: bool,
    /// The request waits for its behind copies (a copy that was not behind failed).
    pub counted: bool,
    pub ok: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Behind {
    /// md's max_write_behind; 0 = off.
    pub max: u32,
    next_id: u64,
    /// Writes to write-mostly members that must stay in order, by id (ids grow in issue order).
    pub writes: std::collections::BTreeMap<u64, MemberWrite>,
    /// Behind groups by id.
    pub groups: DetMap<u64, Group>,
    /// The live request's group.
    pub by_req: DetMap<RequestId, u64>,
    /// Reads waiting for a behind write on the write-mostly copy they go to:
    /// (request, request start sector, piece start, piece length).
    pub reads: Vec<(RequestId, u64, u64, u64)>,
    /// Completions held while no in-sync member that is not write-mostly is left.
    pub held: Vec<RequestId>,
    /// Finished requests whose behind copies are in flight: their group, for the array.
    pub finished: DetMap<RequestId, u64>,
}

impl Behind {
    fn overlaps(&self, member: usize, sector: u64, len: u64, before: u64) -> bool {
        self.writes.range(..before).any(|(_, w)| {
            w.member == member && w.member_sector < sector + len && sector < w.member_sector + w.len_sectors
        })
    }

    /// Groups whose copies are still in flight.
    pub fn active(&self) -> usize {
        self.groups.values().filter(|g| g.pending > 0).count()
    }
}
