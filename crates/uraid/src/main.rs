//! `uraid`: user-space software RAID, on-disk compatible with Linux md, served over NBD.

mod bench;
mod size_arg;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "uraid", version, about = "User-space software RAID, md-compatible, served over NBD")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks on this machine, each against a peer measured in the same run.
    Bench(bench::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(args),
    };
    if let Err(e) = result {
        eprintln!("uraid: error: {e:#}");
        std::process::exit(1);
    }
}
