//! What md.c does for a running array, sans-IO, around the engine: clean/active (safe
//! mode), events, dev_roles, failure recording (md_error) before held completions go,
//! recovery checkpoints, hot spares, replacements, the write-intent bitmap's
//! set-before-write and clear-after-flush, and the close that marks the superblocks clean.
//!
//! [`ArraySuperblocks`] holds the superblock and bitmap state; [`Array`] is the whole
//! running array, driven like a bare engine (`ArrayEngine`): its metadata writes and
//! flushes come out as member I/O beside the engine's, so the simulator and the real
//! runtime run the same code. See docs/architecture.md.

mod admission;
mod control;
mod grow;
mod raid0_grow;
mod reshape_ops;
mod reshaping;
mod rounds;
mod start;
mod state;
mod superblocks;
mod takeover;
mod upkeep;
mod upkeep_ops;
mod view;

pub use control::{role_text, Added, NewMember};
pub use grow::{plan as grow_plan, GrowCurrent, GrowPlan, GrowRefusal, GrowRequest, GrowSize, ReshapeTarget};
pub use start::{ArrayOptions, StartMember};
pub use state::Array;
pub use superblocks::{
    ArrayMember, ArraySuperblocks, DevRole, MemberKey, MetaError, MetaIo, MetaRound, MetaWriteKind,
    RoundOutcome, WriteIntent,
};
pub use upkeep::{UpkeepClock, UpkeepDue, UpkeepPeriods};
pub use view::{ArrayView, MemberView};
