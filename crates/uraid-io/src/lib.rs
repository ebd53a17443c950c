//! Member I/O executors: real files/devices and the deterministic simulator.
//!
//! - [`real`]: members that are regular files or block devices, driven through io_uring
//!   (or a pread/pwrite thread pool where io_uring is unavailable), O_DIRECT where the file
//!   system allows it.
//! - [`runtime::ArrayRuntime`]: a thread owning an engine and the real executor, fed
//!   requests with completion callbacks (what `uraid serve` puts behind NBD); a small
//!   request runs on the submitting thread when that thread finds the engine free.
//! - [`sim`]: virtual clock, disk models, fault injection, [`sim::SimArray`].
//! - [`engine::ArrayEngine`]: the engine interface both drivers use; [`testing`] has a
//!   tiny mirror engine that implements it for tests.

pub mod bench;
pub mod cpu_bench;
pub mod engine;
pub mod engine_bench;
pub mod experiments;
pub mod real;
pub mod runtime;
pub mod sim;
pub mod testing;

pub use engine::ArrayEngine;
