//! Per-member and per-array accounting, so a test can say what a request cost.

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    /// Sum over this member's I/Os of (completion time - issue time).
    pub busy_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArrayStats {
    pub members: Vec<MemberStats>,
    pub requests: u64,
    pub full_stripe_writes: u64,
    pub rmw_writes: u64,
    pub rcw_writes: u64,
    pub reconstruct_writes: u64,
    pub degraded_reads: u64,
    pub aligned_read_bypass: u64,
    pub read_errors_corrected: u64,
    pub stripe_cache_hits: u64,
    /// md's partial parity log: log writes (one per io_unit).
    pub ppl_log_writes: u64,
    /// raid1 write-behind: writes acknowledged before their write-mostly copies landed
    /// (or that were allowed to be).
    pub write_behind_requests: u64,
}

impl ArrayStats {
    pub fn new(members: usize) -> Self {
        ArrayStats { members: vec![MemberStats::default(); members], ..Default::default() }
    }
    pub fn member_reads(&self) -> u64 {
        self.members.iter().map(|m| m.reads).sum()
    }
    pub fn member_writes(&self) -> u64 {
        self.members.iter().map(|m| m.writes).sum()
    }
}

/// The stripe cache of a raid4/5/6 array, as md's sysfs shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StripeCacheUsage {
    /// md's stripe_cache_size: the most stripe heads the cache holds.
    pub size: usize,
    /// Heads in the cache now, busy or kept idle for a later hit.
    pub heads: usize,
    /// md's stripe_cache_active: heads with work on them (requests, member I/O, a sync).
    pub active: usize,
}
