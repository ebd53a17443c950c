//! uraid-core: the sans-IO RAID engine. No threads, no syscalls, no clock.

pub mod api;
pub mod array;
mod behind;
mod block;
pub mod config;
pub mod detmap;
mod direct;
mod direct_sync;
pub mod drive;
pub mod engine;
pub mod explain;
pub mod geometry;
mod inflight;
#[cfg(test)]
mod layering;
mod ledger;
pub mod meta;
pub mod mirror;
mod personality;
pub mod queue;
mod rdev;
pub mod replace;
pub mod reshape;
pub mod rng;
pub mod scrub;
pub mod sectors;
pub mod stats;
pub mod stripe;
pub mod sync;
pub mod testing;
pub mod tunables;

pub use api::*;
pub use config::{ArrayConfig, ConfigError, MemberConfig, MemberState, SyncPolicy, Tunables};
pub use engine::Engine;
pub use geometry::{Geometry, Level};
pub use replace::ReplacementStatus;
pub use scrub::ScrubKind;
pub use sync::{EngineEvent, SyncKind, SyncStatus};
