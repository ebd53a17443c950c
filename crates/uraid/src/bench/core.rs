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
    uraid_sim::bench::warm_up_sim(400_000);
    for (profile, qd) in [("nvme", 32usize), ("ssd-sata", 32), ("hdd-7200-2009", 1), ("hdd-7200-2009", 32)] {
        let s = uraid_sim::bench::sim_speed(profile, 8, qd, 400_000);
        rows.push((format!("disks only, {profile}, qd {qd}"), s.member_ios, s.real_seconds));
    }
    // The whole simulator: engine, disks, faults, the model checker.
    let t = Instant::now();
    let mut ios = 0;
    for seed in 1..=args.seeds.max(1) {
        let spec = uraid_sim::check::SimSpec {
            seed,
            ops: 2000,
            profile: "nvme".into(),
            member_bytes: 16 << 20,
            faults: true,
            ..Default::default()
        };
        let r = uraid_sim::check::run_sim(&spec);
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

#[derive(Args)]
pub struct CpuArgs {
    /// Fraction of the default run length (about ten seconds, plus 18 s of fio).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Also measure the kernel's I/O path with fio (libaio, 4 KiB, iodepth 32): reads of
    /// /dev/zero, and direct reads of this block device or file (read only; at least
    /// 512 MiB of written data), random and in merged sequential batches.
    #[arg(long)]
    fio_target: Option<std::path::PathBuf>,
    /// Measure nothing: print the shipped CPU profiles' costs in their era's time.
    #[arg(long)]
    profiles: bool,
}

/// fio's CPU (user + system) per I/O, in ns, from its JSON output.
fn fio_cpu_ns_per_io(args: &[String]) -> anyhow::Result<f64> {
    let out = std::process::Command::new("fio").args(args).arg("--output-format=json").output()?;
    anyhow::ensure!(out.status.success(), "fio failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let job = &v["jobs"][0];
    let ios = job["read"]["total_ios"].as_f64().unwrap_or(0.0);
    let secs = job["job_runtime"].as_f64().unwrap_or(0.0) / 1e3;
    let cpu = (job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0)) / 100.0;
    anyhow::ensure!(ios > 0.0, "fio did no I/O");
    Ok(cpu * secs * 1e9 / ios)
}

/// The shipped profiles, each figure in its era's nanoseconds (rates in GB/s).
fn print_profiles() {
    use uraid_sim::cpu::{CpuCosts, HostCpu};
    let host = HostCpu::builtin();
    println!("host: {} ({} cores, {} MHz measured)", host.cpu, host.cores, host.clock_mhz);
    println!(
        "{:<13} {:>5} {:>6} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8} {:>7} {:>7} {:>8}  cpu",
        "profile",
        "cores",
        "scale",
        "submit ns",
        "bio ns",
        "md req",
        "member rq",
        "page bio",
        "stripe",
        "copy",
        "parity",
        "queue rq"
    );
    for name in uraid_sim::cpu::cpu_profile_names() {
        let c = CpuCosts::named(name).expect("shipped profile");
        if c.is_none() {
            continue;
        }
        let rate = |ps: f64| if ps > 0.0 { format!("{:.1}", 1000.0 / ps) } else { "offload".into() };
        println!(
            "{:<13} {:>5} {:>6.2} {:>9.0} {:>8.0} {:>8.0} {:>9.0} {:>8.0} {:>8.0} {:>7} {:>7} {:>8.0}  {}",
            c.name,
            c.cores,
            c.control_scale,
            c.submit_request_ns,
            c.bio_ns,
            c.md_request_ns,
            c.member_request_ns,
            c.page_bio_ns,
            c.stripe_ns,
            if c.md_copy_ps_per_byte == 0.0 {
                format!("{}*", rate(c.copy_ps_per_byte))
            } else {
                rate(c.copy_ps_per_byte)
            },
            rate(c.parity_ps_per_byte),
            c.queue_request_ns,
            c.cpu
        );
    }
    println!("(copy, parity: GB/s; * md's own copies and parity on offload engines)");
}

pub fn run_cpu(args: CpuArgs) -> anyhow::Result<()> {
    if args.profiles {
        print_profiles();
        return Ok(());
    }
    let scale = args.scale.clamp(0.01, 10.0);
    let f = uraid_sim::cpu_bench::measure(scale);
    println!("# uraid bench cpu on this machine (fastest of 7 runs each)");
    print!("{}", f.toml_lines());
    let Some(target) = args.fio_target else { return Ok(()) };
    let secs = ((6.0 * scale).ceil() as u64).max(1);
    let job = |name: &str, file: &str, extra: &[&str]| -> Vec<String> {
        let mut v = vec![
            format!("--name={name}"),
            format!("--filename={file}"),
            "--ioengine=libaio".into(),
            "--bs=4k".into(),
            "--iodepth=32".into(),
            format!("--runtime={secs}"),
            "--time_based".into(),
            "--readonly".into(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let batched = ["--iodepth_batch_submit=32", "--iodepth_batch_complete_min=16"];
    let t = target.display().to_string();
    let zero = fio_cpu_ns_per_io(&job("zero", "/dev/zero", &["--rw=read", "--size=100g"]))?;
    let zero_batched = fio_cpu_ns_per_io(&job(
        "zero-batched",
        "/dev/zero",
        &["--rw=read", "--size=100g", batched[0], batched[1]],
    ))?;
    let random = fio_cpu_ns_per_io(&job("random", &t, &["--rw=randread", "--direct=1", "--size=512m"]))?;
    let merged = fio_cpu_ns_per_io(&job(
        "merged",
        &t,
        &["--rw=read", "--direct=1", "--size=512m", batched[0], batched[1]],
    ))?;
    println!("# fio CPU per 4 KiB read: /dev/zero {zero:.0} ns (batched {zero_batched:.0}), {t} random {random:.0} ns, sequential merged {merged:.0} ns");
    // fio and its system calls alone; a bio that merges (the merged run's extra over
    // /dev/zero at the same batching); a request of its own (the random run's remainder).
    let bio = (merged - zero_batched).max(0.0);
    println!("submit_request_ns = {zero:.0}");
    println!("bio_ns = {bio:.0}");
    println!("member_request_ns = {:.0}", (random - zero - bio).max(0.0));
    Ok(())
}
