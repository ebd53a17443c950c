//! What an engine is built from: the array's geometry, its members' state, and md's tunables.

use crate::geometry::Geometry;

/// State of one raid slot at engine start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Holds valid data for the whole array.
    InSync,
    /// Slot empty (mdadm's "missing", or a removed member).
    Missing,
    /// Present but failed: never read or written again.
    Faulty,
    /// Being rebuilt: data below `recovery_offset_sectors` (member data sectors) is valid.
    Recovering { recovery_offset_sectors: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberConfig {
    /// Where array data starts on this member (md's data_offset), in bytes.
    pub data_offset_bytes: u64,
    pub state: MemberState,
}

/// md's tunables, with md's names and defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tunables {
    /// Stripe heads in the stripe cache (md default 256).
    pub stripe_cache_size: usize,
    /// 0 = reconstruct-write only, 1 = read-modify-write where cheaper, 2 = RMW where equal too.
    pub rmw_level: u8,
    /// Full-stripe writes allowed to pass a queued partial stripe before it is forced out (md default 1).
    pub preread_bypass_threshold: u32,
    /// How long a partial-stripe write may wait for the rest of its stripe, in nanoseconds.
    pub stripe_batch_deadline_ns: u64,
    /// Requests accepted but not yet completed; beyond this `submit` answers Busy.
    pub max_inflight_requests: usize,
    /// false = the 1:1 model: every write is handled immediately, no gathering into stripes.
    pub write_batching: bool,
    /// Chunk-aligned reads go straight to the member on an optimal array.
    pub aligned_read_bypass: bool,
    /// Bypass also on a degraded array, for reads whose member is working (md before 4.1).
    pub degraded_read_bypass: bool,
    /// After a member fails, hold request completions until the caller has recorded the
    /// failure in the superblocks and called `Engine::metadata_committed` (md's
    /// MD_SB_CHANGE_PENDING): otherwise a crash could bring the failed member back as in sync.
    pub hold_completions_on_member_failure: bool,
    /// Read balancing for mirrors (raid1, raid10).
    pub balance: Balance,
    /// Background resync/recovery floor while other I/O runs, KiB/s per member (md default 1000).
    pub sync_speed_min_kib: u64,
    /// Background resync/recovery ceiling when the array is otherwise idle, KiB/s (md default 200000).
    pub sync_speed_max_kib: u64,
    /// Under load: md's floor, or a rate that keeps the clients' p99 latency within
    /// `sync_p99_limit_pct` of its value without background work (`sync::pacing`).
    pub sync_policy: SyncPolicy,
    /// The adaptive policy's limit on the clients' p99 latency, percent of the baseline.
    pub sync_p99_limit_pct: u64,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            stripe_cache_size: 256,
            rmw_level: 1,
            preread_bypass_threshold: 1,
            stripe_batch_deadline_ns: 2_000_000,
            max_inflight_requests: 4096,
            write_batching: true,
            aligned_read_bypass: true,
            degraded_read_bypass: false,
            hold_completions_on_member_failure: false,
            balance: Balance::Load,
            sync_speed_min_kib: 1000,
            sync_speed_max_kib: 200_000,
            sync_policy: SyncPolicy::Adaptive,
            sync_p99_limit_pct: 130,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayConfig {
    pub geometry: Geometry,
    /// One entry per raid slot (`geometry.raid_disks`).
    pub members: Vec<MemberConfig>,
    pub tunables: Tunables,
    pub read_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    Geometry(String),
    Members(String),
    Tunable(String),
    /// More members missing or faulty than the level survives.
    TooDegraded {
        missing: usize,
        survivable: usize,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Geometry(m) => write!(f, "impossible geometry: {m}"),
            ConfigError::Members(m) => write!(f, "member list: {m}"),
            ConfigError::Tunable(m) => write!(f, "tunable: {m}"),
            ConfigError::TooDegraded { missing, survivable } => write!(
                f,
                "{missing} members missing or faulty but the level survives only {survivable}; \
                 the array cannot start"
            ),
        }
    }
}
impl std::error::Error for ConfigError {}

/// md has no read balancing tunable; gmirror's `balance` (see `mirror`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Balance {
    /// Outstanding queue depth plus distance from the member's last position; a sequential
    /// stream stays on its member.
    #[default]
    Load,
    /// gmirror's original `load` (FreeBSD 7): the member whose last request answered
    /// fastest, unless one was not sent anything for `LOAD_TIME_IDLE_NS`.
    LoadTime,
    RoundRobin,
    /// Reads of at least `SPLIT_SLICE_BYTES` are split across members.
    Split,
    /// Lowest-numbered working member first.
    Prefer,
}

impl Balance {
    pub const NAMES: &'static [(&'static str, Balance)] = &[
        ("load", Balance::Load),
        ("load-time", Balance::LoadTime),
        ("round-robin", Balance::RoundRobin),
        ("split", Balance::Split),
        ("prefer", Balance::Prefer),
    ];
    pub fn parse(text: &str) -> Result<Balance, String> {
        Self::NAMES.iter().find(|(n, _)| *n == text).map(|&(_, b)| b).ok_or_else(|| {
            format!("unknown balance {text:?}: use load, load-time, round-robin, split or prefer")
        })
    }
    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, b)| *b == self).map(|(n, _)| *n).unwrap_or("load")
    }
}

/// md's policy, or the latency-driven one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncPolicy {
    Md,
    #[default]
    Adaptive,
}

impl SyncPolicy {
    pub fn name(self) -> &'static str {
        match self {
            SyncPolicy::Md => "md",
            SyncPolicy::Adaptive => "adaptive",
        }
    }

    pub fn parse(s: &str) -> Result<SyncPolicy, String> {
        match s.trim() {
            "md" => Ok(SyncPolicy::Md),
            "adaptive" => Ok(SyncPolicy::Adaptive),
            other => Err(format!("sync_policy {other:?}: use md or adaptive")),
        }
    }
}
