//! What `--detail` shows of an array, as data: built by `detail` (offline from the
//! superblocks, or from a running array), printed by `report` as mdadm's text or JSON. A
//! leaf, so the two need not import each other.

use uraid_core::meta::Superblock;

/// One row of `--detail`'s device table.
#[derive(Clone, Debug)]
pub struct DeviceRow {
    /// md's device number (the superblock's dev_number); none for a device not in the array.
    pub number: Option<u32>,
    /// The raid slot it holds or is rebuilt into; none for spares and failed devices.
    pub slot: Option<usize>,
    pub state: String,
    pub path: String,
}

/// Everything `--detail` prints.
#[derive(Clone, Debug)]
pub struct DetailInfo {
    /// The array's authoritative superblock.
    pub sb: Superblock,
    pub array_sectors: u64,
    pub used_dev_sectors: u64,
    pub state: String,
    pub active: usize,
    pub working: usize,
    pub failed: usize,
    pub spares: usize,
    pub rows: Vec<DeviceRow>,
    /// e.g. "Rebuild Status : 42.5% complete".
    pub progress: Option<String>,
    /// The same as numbers, for `--json`.
    pub sync: Option<SyncProgress>,
    /// Running arrays only.
    pub scrub: Option<ScrubView>,
    /// Members whose bad-block log lists entries: (device, (first sector, sectors)).
    pub bad_blocks: Vec<(String, Vec<(u64, u64)>)>,
    /// md's max_write_behind from the bitmap superblock (0: off).
    pub write_behind: u32,
    /// Running arrays: writes completed whose write-mostly copies still fly.
    pub behind_writes_in_flight: Option<usize>,
    /// Running arrays: writes so far allowed to complete before their write-mostly copies.
    pub write_behind_requests: Option<u64>,
}

/// A resync, recovery or scrub in numbers (md's `sync_completed` and `sync_speed`).
#[derive(Clone, Debug)]
pub struct SyncProgress {
    /// mdstat's word: recovery, resync, check or repair.
    pub action: &'static str,
    pub done_sectors: u64,
    pub total_sectors: u64,
    /// KiB a second over the last few seconds; running arrays only.
    pub speed_kib_per_s: Option<f64>,
    /// Seconds left at that speed.
    pub eta_s: Option<f64>,
}

/// What md shows in /sys/block/mdX/md/{sync_action,last_sync_action,mismatch_cnt}.
#[derive(Clone, Debug)]
pub struct ScrubView {
    pub sync_action: String,
    pub last_sync_action: String,
    pub mismatch_cnt: u64,
}
