//! `uraid bench ...`: benchmarks that print the peer they are compared against.

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Subcommand)]
enum BenchWhat {}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {}
}
