//! `uraid sim`: the simulator's random-workload checker (`uraid_sim::check`) on the
//! command line: one summary line per run, the reproducing command for a failure.

use clap::Args;
use uraid_sim::check::{run_sim, SimSpec, DRAWS};

use crate::explain::parse_level;
use crate::size_arg::parse_size_bytes;

#[derive(Args, Clone)]
pub struct SimArgs {
    /// Run this one seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Run seeds 1..=N (or seed..seed+N with --seed).
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Level (default: chosen from the seed).
    #[arg(long)]
    level: Option<String>,
    /// Number of members (default: chosen from the seed).
    #[arg(long = "raid-devices", short = 'n')]
    raid_devices: Option<usize>,
    /// md layout name (default: chosen from the seed).
    #[arg(long)]
    layout: Option<String>,
    /// Chunk size, K/M suffixes (default: chosen from the seed).
    #[arg(long)]
    chunk: Option<String>,
    /// Requests per run.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// Requests in flight (default: chosen from the seed).
    #[arg(long = "queue-depth")]
    queue_depth: Option<usize>,
    /// Disk profile: hdd-7200-2008, hdd-7200-2009, hdd-7200-2014, hdd-sas-7200-2014, ssd-sata, nvme.
    #[arg(long, default_value = "nvme")]
    profile: String,
    /// Size of each simulated member.
    #[arg(long = "member-size", default_value = "16M")]
    member_size: String,
    /// Run without faults (power cycle still happens at the end).
    #[arg(long = "no-faults")]
    no_faults: bool,
    /// Testing the tester: read-modify-write skips its parity update.
    #[arg(long = "plant-bug", hide = true)]
    plant_bug: bool,
    /// One JSON object per run instead of a line.
    #[arg(long)]
    json: bool,
}

pub fn spec_from_args(args: &SimArgs, seed: u64) -> anyhow::Result<SimSpec> {
    Ok(SimSpec {
        seed,
        level: args.level.as_deref().map(parse_level).transpose()?,
        raid_devices: args.raid_devices,
        layout: args.layout.clone(),
        chunk_bytes: args.chunk.as_deref().map(parse_size_bytes).transpose().map_err(anyhow::Error::msg)?,
        ops: args.ops,
        queue_depth: args.queue_depth,
        profile: args.profile.clone(),
        member_bytes: parse_size_bytes(&args.member_size).map_err(anyhow::Error::msg)?,
        faults: !args.no_faults,
        plant_bug: args.plant_bug,
    })
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let first = args.seed.unwrap_or(1);
    let mut failed = 0;
    let mut reports = Vec::new();
    for seed in first..first + args.seeds.max(1) {
        let spec = spec_from_args(&args, seed)?;
        let r = run_sim(&spec);
        if !args.json {
            println!(
                "seed={} raid{} n={} layout={} chunk={} qd={} requests={} member_ios={} faults={} power_cycles={} write_hole_exposures={} corruption_exposures={} trace={} {}",
                r.seed, r.level, r.raid_devices, r.layout, r.chunk_bytes, r.queue_depth, r.requests, r.member_ios,
                r.faults.len(), r.power_cycles, r.write_hole_exposures, r.corruption_exposures, r.trace_hash,
                if r.ok && r.array_failed_as_expected { "ok (failed as expected)".to_string() }
                else if r.ok { "ok".to_string() } else { format!("FAILED: {}", r.failure.clone().unwrap_or_default()) }
            );
            if !r.ok {
                println!("  faults: {:?}", r.faults);
                println!("  reproduce: {}", r.reproduce);
            }
        }
        failed += usize::from(!r.ok);
        reports.push(r);
    }
    if args.json {
        let rows: Vec<serde_json::Value> = reports
            .iter()
            .map(|r| {
                serde_json::json!({
                    "seed": r.seed, "level": r.level, "raid_devices": r.raid_devices, "layout": r.layout,
                    "chunk_bytes": r.chunk_bytes, "queue_depth": r.queue_depth, "requests": r.requests,
                    "member_ios": r.member_ios, "trace_hash": r.trace_hash, "faults": r.faults,
                    "power_cycles": r.power_cycles, "write_hole_exposures": r.write_hole_exposures,
                    "corruption_exposures": r.corruption_exposures,
                    "array_failed_as_expected": r.array_failed_as_expected,
                    "resync_after_power_cycle": r.resync_after_power_cycle, "draws": r.draws, "unreadable_sectors": r.unreadable_sectors,
                    "ok": r.ok, "failure": r.failure, "reproduce": r.reproduce,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else if reports.len() > 1 {
        println!("{} runs, {} passed, {} failed", reports.len(), reports.len() - failed, failed);
        // How many seeds drew each of the newer kinds (and how many of those passed).
        let drew: Vec<String> = DRAWS
            .iter()
            .map(|d| {
                let with: Vec<_> = reports.iter().filter(|r| r.draws.contains(d)).collect();
                let eio = with.iter().filter(|r| r.unreadable_sectors > 0).count();
                let eio = if *d == DRAWS[1] {
                    format!(", {eio} with sectors answering EIO")
                } else {
                    String::new()
                };
                format!("{d}: {} ({} ok{eio})", with.len(), with.iter().filter(|r| r.ok).count())
            })
            .collect();
        println!("drawn: {}", drew.join("; "));
    }
    if failed > 0 {
        anyhow::bail!("{failed} simulation run(s) failed");
    }
    Ok(())
}
