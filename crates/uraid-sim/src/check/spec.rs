//! One run's spec, shape and report: what `uraid sim` asks for, the plan the seed draws
//! (shared by the workload and the power cycle), and what the run found.

use uraid_core::rng::Rng;
use uraid_core::*;

/// Where the data starts on a member without a partial parity log.
pub(super) const DATA_OFFSET_BYTES: u64 = 1 << 20;
/// md superblock 1.2: 4 KiB from the member's start.
pub(super) const SUPERBLOCK_OFFSET_BYTES: u64 = 4096;
/// The bitmap area a write-error fault covers (header and every page the sim's arrays use).
pub(super) const BITMAP_AREA_BYTES: u64 = 64 << 10;

/// A choice of `n` made by the seed alone, apart from the workload's rng stream (so a new
/// fault kind leaves every seed's workload as it was). `tag` separates the choices.
pub(super) fn seed_pick(seed: u64, tag: u64, n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    Rng::derive(seed, tag).below(n)
}

#[derive(Clone, Debug, Default)]
pub struct SimSpec {
    pub seed: u64,
    pub level: Option<Level>,
    pub raid_devices: Option<usize>,
    pub layout: Option<String>,
    pub chunk_bytes: Option<u64>,
    pub ops: usize,
    pub queue_depth: Option<usize>,
    pub profile: String,
    pub member_bytes: u64,
    pub faults: bool,
    pub plant_bug: bool,
}

#[derive(Clone, Debug, Default)]
pub struct SimReport {
    pub seed: u64,
    pub level: i32,
    pub raid_devices: usize,
    pub layout: String,
    pub chunk_bytes: u64,
    pub queue_depth: usize,
    pub requests: u64,
    pub member_ios: u64,
    pub trace_hash: String,
    pub faults: Vec<String>,
    pub power_cycles: u32,
    pub write_hole_exposures: u64,
    /// Sectors silent corruption damaged where md's repair cannot tell the good copy (a
    /// RAID4/5 data block, a RAID1/10 first copy): md's loss, counted, not a failure.
    pub corruption_exposures: u64,
    /// A second failure during recovery took more than the level survives, and the
    /// array failed as md's would (served nothing wrong before or after).
    pub array_failed_as_expected: bool,
    /// What the re-assembly after the power cycle resynced: "none", "full from N" or
    /// "bitmap: R regions, S sectors" (sync space).
    pub resync_after_power_cycle: String,
    /// A second power cut fell during the rebuild, and the recovery resumed from the
    /// checkpoint its superblock recorded (member sectors), if it had one.
    pub resumed_from_sectors: Option<u64>,
    /// The draws of the newer kinds this run made (for `uraid sim --seeds N`'s counts):
    /// see [`DRAWS`].
    pub draws: Vec<&'static str>,
    /// Sectors that answered EIO after the power cycle (only rows with latent sectors
    /// beyond the redundancy may).
    pub unreadable_sectors: u64,
    pub ok: bool,
    pub failure: Option<String>,
    pub reproduce: String,
}

/// The newer draws a run may make, as counted in `SimReport::draws`.
pub const DRAWS: &[&str] = &[
    "unaligned writes",
    "latent sectors beyond the redundancy during recovery",
    "member I/Os that never complete",
    "scrub check/repair while writes run",
    "hot spares",
    "partial parity log (RAID5)",
    "replace (a replacement rebuilt beside its member)",
    "re-add with a bad-block log",
    "member failures during metadata rounds",
    "write-behind to a write-mostly member (RAID1)",
    "reshape while serving (a grow by a member or a restripe)",
    "reshape finished",
    "power cut mid-reshape",
    "member failure mid-reshape",
    "restripe while serving (chunk, layout, raid5 to raid6)",
];

/// A member whose writes fail on a data range for a while (its bad-block log lists what
/// failed, it stays in sync), then failed (`uraid fail`) and re-added (`uraid add`, which
/// loads the device's log and keeps it), all at request counts.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReaddBadBlocks {
    pub(super) member: usize,
    /// The member byte range whose writes fail.
    pub(super) offset_bytes: u64,
    pub(super) len_bytes: u64,
    pub(super) errors_at: usize,
    pub(super) fail_at: usize,
    pub(super) readd_at: usize,
}

/// The executor's member timeout (`uraid serve --member-timeout`, 30 s, the SCSI layer's
/// default) scaled a thousandfold as the upkeep clocks are (`meta::SIM_UPKEEP`).
pub(super) const MEMBER_TIMEOUT_NS: u64 = 30_000_000;

/// One run's shape and fault plan, shared by its phases.
#[derive(Clone)]
pub(super) struct Run<'a> {
    pub(super) spec: &'a SimSpec,
    pub(super) level: Level,
    pub(super) n: usize,
    pub(super) layout: u32,
    pub(super) geo: Geometry,
    /// The chunk the shape drew (a raid1 draws one too; it sizes the workload's requests).
    pub(super) chunk_sectors: u64,
    pub(super) tunables: Tunables,
    /// Members the level survives losing at once.
    pub(super) redundancy: usize,
    pub(super) planned_failures: usize,
    pub(super) latent_planted: bool,
    /// Disks (by index, spares included) whose disk gives write or flush errors (replaced,
    /// never re-added).
    pub(super) erroring: Vec<bool>,
    /// Members dropped while running (they come back at the power cycle).
    pub(super) dropped: Vec<bool>,
    /// Hot spares (disks `n..n + spares`), added as `uraid add` adds them to a whole array:
    /// a failing member's slot is taken and recovered by one, as md does.
    pub(super) spares: usize,
    /// RAID5 with md's partial parity log (no bitmap): replayed at every dirty start.
    pub(super) ppl: bool,
    /// `uraid replace` of the member in a slot onto the disk after the spares, asked for
    /// once this many requests were issued: (request, slot).
    pub(super) replace: Option<(usize, usize)>,
    /// Where the data starts on each member: 1 MiB, 2 MiB with a partial parity log (its
    /// 1 MiB area sits between the superblock and the data).
    pub(super) data_offset_bytes: u64,
    /// Half the writes and a third of the reads are byte-granular (unaligned, sub-sector):
    /// the array read-modify-writes their edge sectors.
    pub(super) unaligned: bool,
    /// md's `check` or `repair` asked for once this many requests were issued.
    pub(super) scrub: Option<(usize, ScrubKind)>,
    /// Requests in flight.
    pub(super) queue_depth: usize,
    /// A member with entries in its bad-block log failed and re-added while writes run.
    pub(super) readd_bad_blocks: Option<ReaddBadBlocks>,
    /// A planned failure that falls on a metadata I/O, a round in flight.
    pub(super) meta_trap: Option<crate::array::MetaTrap>,
    /// An online grow by one member while the workload runs.
    pub(super) grow: Option<GrowDraw>,
    /// The shape the grow ends in, once it started.
    pub(super) grown: Option<Grown>,
}

/// The grow a seed drew: asked for once this many requests were issued, onto its own disk
/// (when it takes one).
#[derive(Clone, Copy, Debug)]
pub(super) struct GrowDraw {
    pub(super) at_request: usize,
    pub(super) disk: usize,
    pub(super) kind: GrowKind,
}

/// What a drawn reshape changes (mdadm --grow's options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GrowKind {
    /// `--raid-devices N+1 --add NEW`.
    Members,
    /// `--chunk`: the chunk halved or doubled.
    Chunk(u64),
    /// `--layout`: md's algorithm number.
    Layout(u32),
    /// raid5 `--level 6 --add NEW`.
    Raid6,
}

impl GrowKind {
    /// It adds a member (a new disk joins as a spare first).
    pub(super) fn takes_disk(self) -> bool {
        matches!(self, GrowKind::Members | GrowKind::Raid6)
    }
}

/// The shape once the grow is done: one member more, the data offset moved down by
/// mdadm's `min_offset_change` (how uraid grows without a backup file).
#[derive(Clone, Debug)]
pub(super) struct Grown {
    pub(super) geo: Geometry,
    pub(super) data_offset_bytes: u64,
}
