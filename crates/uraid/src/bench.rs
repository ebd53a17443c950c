//! `uraid bench ...`: benchmarks that print the peer they are compared against.

mod parity;

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
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchWhat::Parity(a) => parity::run(a),
    }
}
