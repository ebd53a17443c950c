//! md's personalities (`struct md_personality`: raid0, raid1, raid10, raid456) as one table
//! of functions per level, chosen when the engine is built, in the shape of SPDK's
//! `raid_bdev_module`. What differs between the levels is read here, not branched on
//! inside the shared rooms (ledger, sync, members). See docs/architecture.md.

use crate::config::MemberState;
use crate::engine::{Mddev, Personality};
use crate::geometry::Level;
use crate::sync::UnitStart;

/// raid0/1/10 background unit, in array sectors (raid1: member sectors, the same thing).
const DIRECT_UNIT_SECTORS: u64 = 2048;

impl Personality {
    /// The personality of `level`.
    pub(crate) fn of(level: Level) -> &'static Personality {
        match level {
            Level::Raid0 => &RAID0,
            Level::Raid1 => &RAID1,
            Level::Raid10 => &RAID10,
            Level::Raid4 | Level::Raid5 | Level::Raid6 => &RAID456,
        }
    }
}

static RAID0: Personality = Personality {
    name: "raid0",
    redundant: false,
    sync_in_array_sectors: true,
    resync_may_run: |_| false,
    ..DIRECT
};

static RAID1: Personality = Personality { name: "raid1", sync_in_array_sectors: false, ..DIRECT };

static RAID10: Personality = Personality { name: "raid10", ..DIRECT };

/// raid0, raid1 and raid10: requests map straight onto member I/Os (`direct.rs`); on the
/// mirrors background work copies units of array sectors one at a time (`direct_sync.rs`).
const DIRECT: Personality = Personality {
    name: "raid10",
    read: Mddev::direct_read,
    write: Mddev::direct_write,
    io_done: Mddev::direct_io_done,
    sync_unit: Mddev::start_direct_sync,
    sync_unit_sectors: |_| DIRECT_UNIT_SECTORS,
    sync_window_units: |_, _| 1,
    resync_may_run: mirrors_may_resync,
    sync_in_array_sectors: true,
    redundant: true,
};

/// raid4, raid5, raid6: everything through stripe heads (`stripe/`), background work a
/// window of stripe units at a time (`stripe/row_sync.rs`).
static RAID456: Personality = Personality {
    name: "raid456",
    read: Mddev::stripe_read,
    write: Mddev::stripe_write,
    io_done: Mddev::stripe_io_done,
    sync_unit: |e, _, start, end| {
        if e.start_stripe_sync(start, end) {
            UnitStart::Started
        } else {
            UnitStart::Busy
        }
    },
    sync_unit_sectors: Mddev::stripe_sync_unit_sectors,
    sync_window_units: Mddev::sync_window_units,
    resync_may_run: |e| e.members.iter().all(|m| m.state == MemberState::InSync),
    sync_in_array_sectors: false,
    redundant: true,
};

/// Mirrors resync among their in-sync copies while two of every block remain.
fn mirrors_may_resync(e: &Mddev) -> bool {
    let not_in_sync = e.members.iter().filter(|m| m.state != MemberState::InSync).count();
    let mut copies = Vec::new();
    e.geo.copies(0, &mut copies);
    not_in_sync + 2 <= copies.len()
}
