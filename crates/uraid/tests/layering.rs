//! The `uraid` crate's files import one another without a circle: uraid-core's
//! `layering` walk (docs/architecture.md, "Rooms") over this crate's `src`.

#[path = "../../uraid-core/src/layering.rs"]
mod layering;
