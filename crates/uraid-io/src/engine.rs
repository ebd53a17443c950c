//! The engine interface the executors drive: [`uraid_core::ArrayEngine`], implemented by
//! `uraid_core::Engine` and `uraid_core::array::Array`, and by
//! `uraid_core::testing::MirrorEngine`, a tiny stand-in that lets the runtime and the
//! simulator driver be tested on their own.

pub use uraid_core::ArrayEngine;
