//! `uraid bench ...`: benchmarks that print the peer they are compared against.

mod core;
mod devices;
mod disk;
mod nbd;
mod parity;
mod plot;
mod rebuild;
mod rebuild_load;
mod workload;

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// RAID5/6 parity kernels (single core) against Intel ISA-L and streaming-read bandwidth.
    Parity(parity::ParityArgs),
    /// `uraid serve` against `nbdkit file`, and RAID6 against passthrough, with fio's nbd engine.
    Nbd(nbd::NbdArgs),
    /// The engine's own cost (RAID6 8+2 in RAM) against parity + copy of the same bytes.
    Engine(core::EngineArgs),
    /// Simulator speed: simulated member I/Os per real second.
    Sim(core::SimArgs),
    /// What uraid's work (and fio's, with --fio-dir) costs on this machine: the figures
    /// the simulator's CPU profiles scale to the seeds' CPUs (profiles/cpu-host.toml).
    Cpu(core::CpuArgs),
    /// Rebuild speed of a 6-member RAID6 on tmpfs files against reading its survivors;
    /// `--under-load`: the rebuild and clients together, md's pacing against the adaptive.
    Rebuild(rebuild::RebuildArgs),
    /// A `uraid reproduce` experiment's job grid on real members (files or block devices).
    Workload(workload::WorkloadArgs),
    /// RAID5/6 through NBD against btrfs raid5/6 on the same block devices (or loop devices
    /// over files) and against one of them alone, with fio.
    Disk(disk::DiskArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchWhat::Parity(a) => parity::run(a),
        BenchWhat::Nbd(a) => nbd::run(a),
        BenchWhat::Engine(a) => core::run_engine(a),
        BenchWhat::Sim(a) => core::run_sim(a),
        BenchWhat::Cpu(a) => core::run_cpu(a),
        BenchWhat::Rebuild(a) => rebuild::run(a),
        BenchWhat::Workload(a) => workload::run(a),
        BenchWhat::Disk(a) => disk::run(a),
    }
}
