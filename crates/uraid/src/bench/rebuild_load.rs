//! `uraid bench rebuild --under-load`: a RAID6 rebuilding one member while clients run
//! random 4 KiB reads and writes (half each, 32 in flight, closed loop: fio's randrw at
//! iodepth 32), under md's pacing and under the adaptive one (`sync_policy`), next to the
//! same clients with no rebuild and the same rebuild with no clients, all in one run on the
//! same files. The clients run in-process on the array's runtime, so the figures are the
//! engine's and the members', not an NBD client's. Method: docs/performance.md, "Rebuild
//! under load".

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use uraid_core::geometry::algorithm;
use uraid_core::*;
use uraid_io::real::{Executor, ExecutorOptions, MemberSet, OpenOptions};
use uraid_io::runtime::{ArrayRuntime, RuntimeOptions};
// One shape of results for real members and simulated ones.
use uraid_sim::rebuild_load::{LoadReport, Phase};

// The same array and clients as the simulated experiment.
pub(super) use uraid_sim::rebuild_load::{BLOCK_BYTES, CHUNK_BYTES, MEMBERS, QUEUE_DEPTH};

/// Starts the array: all in sync, or slot 5 rebuilt from its start under `policy`.
fn start(
    paths: &[PathBuf],
    member_bytes: u64,
    rebuild: Option<SyncPolicy>,
) -> anyhow::Result<ArrayRuntime<Engine>> {
    // md's defaults for the bounds (1 MB/s floor, 200 MB/s ceiling): what a user gets.
    let tunables = Tunables { sync_policy: rebuild.unwrap_or_default(), ..Tunables::default() };
    let engine = raid6_engine(member_bytes, rebuild.is_some(), tunables)?;
    let set = MemberSet::open(paths, &OpenOptions::default()).context("opening members")?;
    let executor = Executor::new(set, &ExecutorOptions::default()).context("executor")?;
    ArrayRuntime::start(engine, executor, &RuntimeOptions::default()).context("runtime")
}

fn rebuilt_sectors(rt: &ArrayRuntime<Engine>) -> anyhow::Result<u64> {
    let s = rt.handle().control(|e, _, _| e.sync_status()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(s.map_or(u64::MAX, |s| s.done_sectors))
}

/// Clients for `warmup` then `seconds` (none when `clients` is false); the clients and the
/// rebuild's progress measured over the `seconds` (the adaptive pacer finds its rate in the
/// warm-up, as in the simulated experiment).
fn phase(
    rt: &ArrayRuntime<Engine>,
    array_bytes: u64,
    clients: bool,
    warmup: Duration,
    seconds: f64,
) -> anyhow::Result<Phase> {
    let t0 = Instant::now();
    let total = warmup + Duration::from_secs_f64(seconds);
    // When the measured window began, and the rebuild's progress then.
    let mut window: Option<(Instant, u64)> = None;
    let mut lat_us = Vec::new();
    if clients {
        let h = rt.handle();
        let (tx, rx) = mpsc::channel::<(u64, anyhow::Result<()>)>();
        let mut round = CompletionRound::default();
        let mut rng = uraid_core::rng::Rng::new(0x5eed);
        let blocks = array_bytes / BLOCK_BYTES;
        let mut next_id = 1u64;
        let mut started = std::collections::HashMap::new();
        let mut submit = |round: &mut CompletionRound,
                          started: &mut std::collections::HashMap<u64, Instant>| {
            let id = next_id;
            next_id += 1;
            let offset = rng.below(blocks) * BLOCK_BYTES;
            let req = if rng.below(2) == 0 {
                Request::read(id, offset, BLOCK_BYTES)
            } else {
                Request::write(id, offset, vec![id as u8; BLOCK_BYTES as usize])
            };
            let tx = tx.clone();
            started.insert(id, Instant::now());
            h.submit(
                req,
                Box::new(move |c, _| {
                    let _ = tx.send((id, c.result.map(|_| ()).map_err(|e| anyhow::anyhow!("{e:?}"))));
                }),
                round,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))
        };
        for _ in 0..QUEUE_DEPTH {
            submit(&mut round, &mut started)?;
        }
        round.end();
        while t0.elapsed() < total {
            let (id, result) = rx.recv_timeout(Duration::from_secs(30)).context("a client request hung")?;
            result.with_context(|| format!("client request {id}"))?;
            let t = started.remove(&id).context("an unknown completion")?;
            if window.is_none() && t0.elapsed() >= warmup {
                window = Some((Instant::now(), rebuilt_sectors(rt)?));
            }
            if window.is_some() {
                lat_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            submit(&mut round, &mut started)?;
            round.end();
        }
        for _ in 0..started.len() {
            let (id, result) = rx.recv_timeout(Duration::from_secs(30)).context("a client request hung")?;
            result.with_context(|| format!("client request {id}"))?;
        }
    } else {
        std::thread::sleep(warmup);
        window = Some((Instant::now(), rebuilt_sectors(rt)?));
        std::thread::sleep(Duration::from_secs_f64(seconds));
    }
    let (from, before) = window.context("no client request completed within the phase")?;
    let elapsed = from.elapsed().as_secs_f64();
    let after = rebuilt_sectors(rt)?;
    lat_us.sort_by(f64::total_cmp);
    let p99 = lat_us.get(lat_us.len() * 99 / 100).copied().unwrap_or(0.0);
    let rebuilt = if before == u64::MAX { 0 } else { after.min(u64::MAX - 1).saturating_sub(before) };
    let mean = if lat_us.is_empty() { 0.0 } else { lat_us.iter().sum::<f64>() / lat_us.len() as f64 };
    Ok(Phase {
        client_iops: lat_us.len() as f64 / elapsed,
        client_mean_us: mean,
        client_p99_us: p99,
        rebuild_mbps: rebuilt as f64 * 512.0 / elapsed / 1e6,
    })
}

fn run_phase(
    paths: &[PathBuf],
    member_bytes: u64,
    rebuild: Option<SyncPolicy>,
    clients: bool,
    seconds: f64,
) -> anyhow::Result<Phase> {
    let rt = start(paths, member_bytes, rebuild)?;
    // The rebuild is queued at start and begins at the runtime's first turn.
    let t0 = Instant::now();
    while rebuild.is_some() && rebuilt_sectors(&rt)? == u64::MAX {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(10), "the rebuild did not start");
        std::thread::sleep(Duration::from_millis(1));
    }
    let array_bytes = (MEMBERS as u64 - 2) * member_bytes;
    let warmup = Duration::from_nanos(uraid_sim::rebuild_load::WARMUP_NS);
    let p = phase(&rt, array_bytes, clients, warmup, seconds)?;
    if rebuild.is_some() {
        anyhow::ensure!(
            rebuilt_sectors(&rt)? != u64::MAX,
            "the rebuild finished within the phase: give a larger --member-size or fewer --seconds"
        );
    }
    rt.shutdown().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(p)
}

pub fn run(
    paths: &[PathBuf],
    member_bytes: u64,
    seconds: f64,
    json: bool,
    members: &str,
) -> anyhow::Result<()> {
    // The clients alone first and last: a disk still writing back the fill, or a neighbour's
    // burst, tilts one of them; the peer is their mean and both are printed.
    let first = run_phase(paths, member_bytes, None, true, seconds)?;
    let idle = run_phase(paths, member_bytes, Some(SyncPolicy::Md), false, seconds)?;
    let md = run_phase(paths, member_bytes, Some(SyncPolicy::Md), true, seconds)?;
    let adaptive = run_phase(paths, member_bytes, Some(SyncPolicy::Adaptive), true, seconds)?;
    let last = run_phase(paths, member_bytes, None, true, seconds)?;
    let alone = Phase {
        client_iops: (first.client_iops + last.client_iops) / 2.0,
        client_mean_us: (first.client_mean_us + last.client_mean_us) / 2.0,
        client_p99_us: (first.client_p99_us + last.client_p99_us) / 2.0,
        rebuild_mbps: 0.0,
    };
    let report = LoadReport { alone, idle, md, adaptive };
    let title = format!(
        "RAID6, {MEMBERS} members of {} MiB ({members}), chunk {} KiB; clients in-process: random 4 KiB, \
         half reads, {QUEUE_DEPTH} in flight; {seconds} s measured after {} s, each phase on a fresh \
         start; CPU: {}",
        member_bytes >> 20,
        CHUNK_BYTES >> 10,
        uraid_sim::rebuild_load::WARMUP_NS / 1_000_000_000,
        super::disk::cpu_model()
    );
    let alone_note = format!(
        "clients alone: mean of the first and the last phase ({:.0} and {:.0} IOPS)",
        first.client_iops, last.client_iops
    );
    let meta = serde_json::json!({"members": members, "cpu": super::disk::cpu_model(),
        "member_bytes": member_bytes, "seconds": seconds,
        "clients_alone_first_iops": first.client_iops, "clients_alone_last_iops": last.client_iops});
    print_report(&report, json, &title, &alone_note, meta)
}

/// The same phases on simulated disks of each profile (`uraid_sim::rebuild_load`):
/// virtual time, deterministic, the disks' figures with a free CPU.
pub fn run_sim(profiles: &[String], member_bytes: u64, seconds: f64, json: bool) -> anyhow::Result<()> {
    for profile in profiles {
        let spec = uraid_sim::rebuild_load::LoadSpec {
            profile: profile.clone(),
            member_bytes,
            warmup_ns: uraid_sim::rebuild_load::WARMUP_NS,
            measure_ns: (seconds * 1e9) as u64,
            seed: 1,
        };
        let report = uraid_sim::rebuild_load::run(&spec).map_err(anyhow::Error::msg)?;
        let title = format!(
            "simulated {profile}: RAID6, {MEMBERS} members of {} GiB, chunk {} KiB; clients: random 4 KiB, \
             half reads, {QUEUE_DEPTH} in flight; {} s of virtual time measured after {} s, each phase \
             on fresh disks",
            member_bytes >> 30,
            CHUNK_BYTES >> 10,
            seconds,
            uraid_sim::rebuild_load::WARMUP_NS / 1_000_000_000
        );
        let meta = serde_json::json!({"simulated": profile, "member_bytes": member_bytes, "seconds": seconds,
            "warmup_seconds": spec.warmup_ns as f64 / 1e9});
        print_report(&report, json, &title, "", meta)?;
    }
    Ok(())
}

/// The rows against the targets, as a table or one JSON object (`meta` and the figures).
fn print_report(
    r: &LoadReport,
    json: bool,
    title: &str,
    alone_note: &str,
    mut meta: serde_json::Value,
) -> anyhow::Result<()> {
    let (alone, idle) = (r.alone, r.idle);
    let rows = [(SyncPolicy::Md, r.md), (SyncPolicy::Adaptive, r.adaptive)];
    if json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|(policy, p)| {
                serde_json::json!({"policy": policy.name(), "rebuild_mbps": p.rebuild_mbps,
                    "rebuild_share_of_idle": p.rebuild_mbps / idle.rebuild_mbps,
                    "client_iops": p.client_iops, "client_iops_share": p.client_iops / alone.client_iops,
                    "client_mean_us": p.client_mean_us,
                    "client_p99_us": p.client_p99_us, "client_p99_ratio": p.client_p99_us / alone.client_p99_us})
            })
            .collect();
        let fields = serde_json::json!({"bench": "rebuild-under-load", "level": 6, "raid_devices": MEMBERS,
            "idle_rebuild_mbps": idle.rebuild_mbps, "clients_alone_iops": alone.client_iops,
            "clients_alone_mean_us": alone.client_mean_us, "clients_alone_p99_us": alone.client_p99_us,
            "rows": rows});
        if let (Some(m), serde_json::Value::Object(f)) = (meta.as_object_mut(), fields) {
            m.extend(f);
        }
        println!("{}", serde_json::to_string_pretty(&meta)?);
        return Ok(());
    }
    println!("{title}");
    println!(
        "peers, same run: the rebuild with no clients {:.1} MB/s; the clients with no rebuild {:.0} IOPS, \
         mean {:.0} us, p99 {:.0} us",
        idle.rebuild_mbps, alone.client_iops, alone.client_mean_us, alone.client_p99_us
    );
    if !alone_note.is_empty() {
        println!("{alone_note}");
    }
    println!(
        "{:<10} {:>12} {:>14} {:>12} {:>15} {:>10} {:>10}",
        "policy", "rebuild MB/s", "x idle (>=0.3)", "client IOPS", "x alone (>=0.7)", "p99 us", "x alone"
    );
    for (policy, p) in &rows {
        println!(
            "{:<10} {:>12.1} {:>14.2} {:>12.0} {:>15.2} {:>10.0} {:>10.2}",
            policy.name(),
            p.rebuild_mbps,
            p.rebuild_mbps / idle.rebuild_mbps,
            p.client_iops,
            p.client_iops / alone.client_iops,
            p.client_p99_us,
            p.client_p99_us / alone.client_p99_us
        );
    }
    Ok(())
}

/// The benchmarks' RAID6 of `MEMBERS` members, the last rebuilt from its start when
/// `recovering`.
pub(super) fn raid6_engine(
    member_bytes: u64,
    recovering: bool,
    tunables: Tunables,
) -> anyhow::Result<Engine> {
    let geo = Geometry::new(
        Level::Raid6,
        MEMBERS,
        algorithm::LEFT_SYMMETRIC,
        CHUNK_BYTES / 512,
        &[member_bytes / 512; MEMBERS],
    )
    .map_err(anyhow::Error::msg)?;
    let mut members = vec![MemberConfig { data_offset_bytes: 0, state: MemberState::InSync }; MEMBERS];
    if recovering {
        members[MEMBERS - 1].state = MemberState::Recovering { recovery_offset_sectors: 0 };
    }
    Engine::new(ArrayConfig { geometry: geo, members, tunables, read_only: false })
        .map_err(|e| anyhow::anyhow!("{e}"))
}
