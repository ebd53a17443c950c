//! Member I/O on real files and devices: the executor and the runtime thread that drives
//! an engine over it (the simulator is `uraid-sim`).
//!
//! - [`real`]: members that are regular files or block devices, driven through io_uring
//!   (or a pread/pwrite thread pool where io_uring is unavailable), O_DIRECT where the file
//!   system allows it.
//! - [`runtime::ArrayRuntime`]: a thread owning an engine and the real executor, fed
//!   requests with completion callbacks (what `uraid serve` puts behind NBD); a small
//!   request runs on the submitting thread when that thread finds the engine free.
//! - [`engine_bench`]: the engine's own cost, in process, with members in RAM.
//! - [`loopdev`]: loop devices over files, block-device members for tests and benches.

pub mod bench;
pub mod engine;
pub mod engine_bench;
pub mod loopdev;
pub mod real;
pub mod runtime;

pub use engine::ArrayEngine;
