//! `uraid bench engine` and `uraid bench sim`: the engine's own cost in process, and the
//! simulator's speed, each next to its yardstick measured in the same run.

use std::time::Instant;

use clap::Args;

#[derive(Args)]
pub struct EngineArgs {
    /// Fraction of the default run length.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Runs of each workload; the median run (by the figure its target is about) is shown.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long)]
    json: bool,
}

pub fn run_engine(args: EngineArgs) -> anyhow::Result<()> {
    let scale = args.scale.clamp(0.01, 10.0);
    let runs = args.runs.clamp(1, 99);
    let rows = uraid_io::engine_bench::run(scale, runs);
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let (target, met) = r.target();
                serde_json::json!({"workload": r.workload, "requests": r.requests, "requests_per_s": r.requests_per_s,
                    "gbps": r.gbps, "engine_ns_per_request": r.engine_ns_per_request,
                    "peer": r.peer_gbps.map(|_| "copy+gen_syndrome"), "peer_gbps": r.peer_gbps, "ratio": r.ratio,
                    "target": target, "met": met, "runs": runs})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("RAID6 8+2, chunk 64 KiB, members in RAM, queue depth 32, one core; median of {runs} runs");
    println!("peer (full stripes): each request's bytes copied into stripe buffers and P/Q computed, no engine (same run)\n");
    println!(
        "{:<14} {:>12} {:>10} {:>16} {:>12} {:>8}  target",
        "workload", "requests/s", "GB/s", "engine ns/req", "peer GB/s", "ratio"
    );
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
    for r in rows {
        let (target, met) = r.target();
        println!(
            "{:<14} {:>12.0} {:>10.2} {:>16.0} {:>12} {:>8}  {target}: {}",
            r.workload,
            r.requests_per_s,
            r.gbps,
            r.engine_ns_per_request,
            opt(r.peer_gbps, 2),
            opt(r.ratio, 3),
            if met { "met" } else { "missed" }
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct SimArgs {
    /// Simulator runs of `uraid sim` to time (seeds 1..=N).
    #[arg(long, default_value_t = 40)]
    seeds: u64,
    #[arg(long)]
    json: bool,
}

/// The yardstick: simulated member I/Os per real second on one core.
const TARGET_IOS_PER_S: f64 = 1_000_000.0;

pub fn run_sim(args: SimArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    uraid_io::bench::warm_up_sim(400_000);
    for (profile, qd) in [("nvme", 32usize), ("ssd-sata", 32), ("hdd-7200-2009", 1), ("hdd-7200-2009", 32)] {
        let s = uraid_io::bench::sim_speed(profile, 8, qd, 400_000);
        rows.push((format!("disks only, {profile}, qd {qd}"), s.member_ios, s.real_seconds));
    }
    // The whole simulator: engine, disks, faults, the model checker.
    let t = Instant::now();
    let mut ios = 0;
    for seed in 1..=args.seeds.max(1) {
        let spec = uraid_io::sim::check::SimSpec {
            seed,
            ops: 2000,
            profile: "nvme".into(),
            member_bytes: 16 << 20,
            faults: true,
            ..Default::default()
        };
        let r = uraid_io::sim::check::run_sim(&spec);
        anyhow::ensure!(r.ok, "simulation seed {seed} failed: {:?}", r.failure);
        ios += r.member_ios;
    }
    rows.push((
        format!("uraid sim, {} seeds (engine + disks + checker)", args.seeds),
        ios,
        t.elapsed().as_secs_f64(),
    ));
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(what, n, s)| {
                let rate = *n as f64 / s;
                serde_json::json!({"run": what, "member_ios": n, "seconds": s, "ios_per_s": rate,
                    "peer": "target", "peer_ios_per_s": TARGET_IOS_PER_S, "ratio": rate / TARGET_IOS_PER_S})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("simulated member I/Os per real second, one core, after one untimed warm-up run; yardstick: {TARGET_IOS_PER_S:.0}/s\n");
    for (what, n, s) in rows {
        let rate = n as f64 / s;
        println!("{what:<58} {n:>9} I/Os {s:>7.2} s {rate:>12.0}/s  ratio {:.2}", rate / TARGET_IOS_PER_S);
    }
    Ok(())
}
