//! uraid-core: the sans-IO RAID engine. No threads, no syscalls, no clock.

pub mod api;
pub mod geometry;
pub mod meta;

pub use api::*;
