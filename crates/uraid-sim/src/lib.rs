//! uraid-sim: the deterministic disk simulator, the `uraid sim` checker that runs the whole
//! array on it, and the seeds' experiments (`uraid reproduce`).
//!
//! One seed reproduces a whole run: the same engine, the same submissions and the same
//! faults give the same event sequence and the same [`SimDisks::trace_hash`] on every
//! machine (integers only in the hash, no hash-map iteration, no wall clock, randomness
//! only from [`Rng`] streams derived from the seed).
//!
//! # Pieces
//! - [`profile`]: disk profiles as TOML data (`hdd-7200-2008`, `hdd-7200-2009`,
//!   `hdd-7200-2014`, `hdd-sas-7200-2014`, `ssd-sata`, `nvme`), fields documented there and
//!   in `crates/uraid-sim/profiles/`.
//! - [`model`]: timing behind the [`model::DiskModel`] trait: a Ruemmler & Wilkes HDD
//!   (seek curve, rotational position from the virtual time, zoned media rate, read-ahead
//!   segments, NCQ with shortest-positioning-time-first) and a flash model (parallel
//!   channels, latencies, a shared link).
//! - [`store`]: sparse member contents with a durable/volatile split, latent sector
//!   errors, silent corruption, power loss with dropped, reordered and torn writes.
//! - [`disks::SimDisks`]: the members, the virtual clock and the event queue (a binary
//!   heap keyed by (time, sequence)), faults, per-member statistics, the trace hash.
//! - [`array::SimArray`]: an engine (anything implementing `uraid_core::ArrayEngine`:
//!   `uraid_core::Engine`, or `uraid_core::array::Array`, the engine with md's upkeep)
//!   driven against `SimDisks`.
//! - [`meta`]: `uraid create` on the simulated members, and the array started from what
//!   they hold through the same assembly as `uraid serve`.
//! - [`check`]: the `uraid sim` checker; [`experiments`]: the seeds' tables; [`cpu`] and
//!   [`md_threads`]: the CPU model the experiments charge.
//!
//! # Writing a random-workload checker on top (what `uraid sim` needs)
//! ```no_run
//! use uraid_sim::*;
//! use uraid_core::testing::MirrorEngine;
//! use uraid_core::Request;
//!
//! let seed = 42;
//! let members = (0..2).map(|_| SimMemberConfig::builtin("hdd-7200-2009", 1 << 30).unwrap()).collect();
//! let mut disks = SimDisks::new(members, seed).unwrap();
//! // Initial images (superblocks) can be written straight into the stores, then made durable.
//! disks.store_mut(0).flush_all();
//! // Faults by time or by I/O count; their random choices come from the seed.
//! disks.schedule(Fault { trigger: FaultTrigger::AfterMemberIos(500), member: 1, kind: FaultKind::FailStop });
//! disks.schedule(Fault {
//!     trigger: FaultTrigger::AtNs(2_000_000_000),
//!     member: 0,
//!     kind: FaultKind::PowerLoss(PowerLossPolicy::default()),
//! });
//! let engine = MirrorEngine::new(2, 1 << 30, 0); // or uraid_core::Engine::new(config)
//! let mut array = SimArray::new(engine, disks);
//! array.submit_at(0, Request::write(1, 0, vec![7; 4096]));
//! array.submit_at(1_000, Request::flush(2));
//! match array.run_until_idle() {
//!     RunOutcome::PowerLost { .. } => {
//!         let crash = array.crash(&PowerLossPolicy::default());
//!         // Check crash.completions against the model (acknowledged writes before an
//!         // acknowledged flush must survive), treat crash.unacknowledged as "old or new",
//!         // then assemble a new engine on crash.disks (read superblocks with
//!         // crash.disks.store(m).peek(..)) and go on: SimArray::new(engine2, crash.disks).
//!     }
//!     RunOutcome::Idle => {
//!         for c in array.take_completions() { let _ = (c.completion, c.completed_ns); }
//!     }
//!     other => panic!("{other:?}"),
//! }
//! ```
//! Statistics: [`SimDisks::stats`] per member (I/Os, bytes, busy time, latency, a
//! queue-depth-over-time histogram), [`SimDisks::fault_log`] (what fired, when, which bytes
//! a corruption touched, what a power loss kept, dropped and tore), and
//! [`SimDisks::trace_hash`] for the summary line.
//!
//! Power-loss semantics: a write completed before a *completed* flush on its member is
//! durable. Every other write (completed but unflushed, or in flight at the cut) survives
//! independently with `keep_probability`, and a surviving multi-sector write is torn with
//! `torn_probability` (each 512-byte sector then lands or not). Sectors are atomic.
//!
//! Simplifications worth knowing: HDD writes are charged media time when served (the
//! write cache only makes back-to-back sequential writes stream and keeps data volatile; it
//! does not absorb random writes); head switches and track skew are folded into the
//! zone's media rate; a latent-error read fails after its normal service time.

pub mod array;
pub mod bench;
pub mod check;
pub mod corruption;
pub mod cpu;
pub mod cpu_bench;
pub mod disks;
pub mod experiments;
// The import-circle walk of uraid-core (docs/architecture.md, "Rooms"), over this crate.
#[cfg(test)]
#[path = "../../uraid-core/src/layering.rs"]
mod layering;
pub mod md_threads;
pub mod meta;
pub mod model;
pub mod profile;
pub mod rebuild;
pub mod rebuild_load;

pub mod store;
pub mod trace;
pub mod verify;

pub use array::{Crash, RunOutcome, SimArray, TimedCompletion};
pub use disks::{Fault, FaultKind, FaultRecord, FaultTrigger, SimDisks, SimMemberConfig, SimMemberStats};
pub use profile::{DiskProfile, HddProfile, ProfileError, SsdProfile};
pub use store::{MemberStore, PowerLossPolicy, PowerLossReport};
pub use trace::TraceHasher;
pub use uraid_core::rng::Rng;
