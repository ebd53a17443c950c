//! What md.c does for a running array, sans-IO: clean/active (safe mode), events,
//! dev_roles, failure recording (md_error), recovery checkpoints, spares and the
//! write-intent bitmap's set-before-write / clear-after-flush.
//!
//! The state machine only decides: every change comes back as a [`MetaRound`] of member
//! writes (each followed by a flush of that member) that the caller performs, on real
//! files or on simulated disks, and reports back with the members that failed.
//! [`UpkeepClock`] says when the periodic parts (safe mode, bitmap daemon, recovery
//! checkpoints) are due.

mod superblocks;
mod upkeep;

pub use superblocks::{
    ArrayMember, ArraySuperblocks, DevRole, MemberKey, MetaError, MetaIo, MetaRound, MetaWriteKind,
    RoundOutcome, WriteIntent,
};
pub use upkeep::{UpkeepClock, UpkeepDue, UpkeepPeriods};
