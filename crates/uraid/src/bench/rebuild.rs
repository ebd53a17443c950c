//! `uraid bench rebuild`: how fast a RAID6 of tmpfs files rebuilds one member, next to the
//! limit a rebuild cannot beat: reading the five survivors sequentially, measured in the
//! same run on the same files.
//!
//! The two take turns `--runs` times and the medians are compared, so a neighbour's burst
//! of load on a shared machine tilts one run, not the result. Each phase also reports the
//! CPU time the process spent in it (all threads, io_uring workers included): on a machine
//! the benchmark does not have to itself, that says more about the work done than the clock.

use std::io::{Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use uraid_core::*;
use uraid_io::real::{Executor, ExecutorOptions, MemberSet, OpenOptions};
use uraid_io::runtime::{ArrayRuntime, RuntimeOptions};

use crate::size_arg::parse_size_bytes;

#[derive(Args)]
pub struct RebuildArgs {
    /// Where the member files go (tmpfs by default); with --loop-devices, the files under
    /// the loop devices (on a disk, not tmpfs).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Members are loop devices (direct I/O) over files in --dir, detached and removed at
    /// the end: block devices on a disk instead of files in memory.
    #[arg(long = "loop-devices", conflicts_with = "devices")]
    loop_devices: bool,
    /// Six block devices to use as members, comma-separated. THEIR CONTENTS ARE DESTROYED
    /// (needs --yes-destroy).
    #[arg(long, value_delimiter = ',')]
    devices: Vec<PathBuf>,
    /// Confirms that the --devices may be overwritten.
    #[arg(long)]
    yes_destroy: bool,
    /// Size of each of the six members.
    #[arg(long = "member-size", default_value = "1G")]
    member_size: String,
    /// Peer and rebuild take turns this many times; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long)]
    json: bool,
    /// Clients (random 4 KiB, half reads, 32 in flight) while a member rebuilds, under md's
    /// pacing and the adaptive one, against each alone (docs/performance.md).
    #[arg(long = "under-load")]
    under_load: bool,
    /// --under-load on simulated disks of these profiles (comma-separated, e.g.
    /// hdd-7200-2014,ssd-sata) instead of real members: deterministic, in virtual time.
    #[arg(long, value_delimiter = ',', requires = "under_load", conflicts_with_all = ["devices", "loop_devices"])]
    sim: Vec<String>,
    /// --sim: each simulated member's size (the clients spread over all of it).
    #[arg(long = "sim-member-size", default_value = "256G")]
    sim_member_size: String,
    /// --under-load: seconds each phase runs (with --sim, virtual seconds measured).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
}

use super::devices::{drop_caches, Devices};
use super::disk::cpu_model;
use super::rebuild_load::{raid6_engine, CHUNK_BYTES, MEMBERS};

struct TempMembers(Vec<PathBuf>);
impl Drop for TempMembers {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The bench's members: files it makes (and removes), or block devices (loop devices it
/// attaches and detaches, or the user's).
enum Members {
    Files { dir: PathBuf, files: TempMembers },
    Devices(Devices),
}

impl Members {
    fn make(args: &RebuildArgs, member_bytes: u64) -> anyhow::Result<Members> {
        if !args.devices.is_empty() {
            anyhow::ensure!(args.devices.len() == MEMBERS, "--devices: give {MEMBERS} block devices");
            let d = Devices::user(&args.devices, args.yes_destroy)?;
            for p in &d.paths {
                let f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
                let bytes = (&f).seek(std::io::SeekFrom::End(0))?;
                anyhow::ensure!(bytes >= member_bytes, "{} is smaller than --member-size", p.display());
            }
            return Ok(Members::Devices(d));
        }
        if args.loop_devices {
            // Loop devices need root, as losetup does; say so before anything is made.
            // SAFETY: geteuid has no arguments and cannot fail.
            anyhow::ensure!(unsafe { libc::geteuid() } == 0, "--loop-devices needs root (losetup)");
            return Ok(Members::Devices(Devices::loops(&args.dir, "rebuild", MEMBERS, member_bytes)?));
        }
        let files = (0..MEMBERS)
            .map(|m| args.dir.join(format!("uraid-bench-rebuild-{}-{m}.img", std::process::id())))
            .collect();
        Ok(Members::Files { dir: args.dir.clone(), files: TempMembers(files) })
    }

    fn paths(&self) -> &[PathBuf] {
        match self {
            Members::Files { files, .. } => &files.0,
            Members::Devices(d) => &d.paths,
        }
    }

    /// What the members are, for the report.
    fn kind(&self) -> String {
        match self {
            Members::Files { dir, .. } => format!("files in {}", dir.display()),
            Members::Devices(d) => d.kind.clone(),
        }
    }
}

/// Writes `bytes` of a pattern at the start of a member, so that its reads read blocks the
/// medium holds (a hole in a loop device's file costs nothing to read).
fn fill(path: &Path, bytes: u64, seed: u8) -> anyhow::Result<()> {
    // No truncation: a block device keeps its size.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut block = vec![0u8; 1 << 20];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    let mut w = std::io::BufWriter::new(f);
    for _ in 0..bytes >> 20 {
        w.write_all(&block).context("filling a member")?;
    }
    w.into_inner().map_err(|e| e.into_error()).context("filling a member")?.sync_all()?;
    Ok(())
}

/// Read every file sequentially, all at once (a thread each), 1 MiB at a time.
fn read_all_sequentially(paths: &[PathBuf]) -> anyhow::Result<()> {
    let handles: Vec<_> = paths
        .iter()
        .cloned()
        .map(|p| {
            std::thread::spawn(move || -> std::io::Result<u64> {
                let f = std::fs::File::open(&p)?;
                let mut buf = vec![0u8; 1 << 20];
                let mut off = 0u64;
                loop {
                    let n = f.read_at(&mut buf, off)?;
                    if n == 0 {
                        return Ok(off);
                    }
                    off += n as u64;
                }
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("reader thread panicked"))??;
    }
    Ok(())
}

/// Start an array on `paths` with the last member to be rebuilt from zero, at full speed,
/// and wait until it is in sync. Timed by the caller: engine and members set up, rebuild,
/// shut down (with the array's final flush).
fn rebuild_once(paths: &[PathBuf], member_bytes: u64) -> anyhow::Result<()> {
    let tunables = Tunables {
        sync_speed_min_kib: u64::MAX / 4096,
        sync_speed_max_kib: u64::MAX / 4096,
        ..Tunables::default()
    };
    let engine = raid6_engine(member_bytes, true, tunables)?;
    let set = MemberSet::open(paths, &OpenOptions::default()).context("opening members")?;
    let executor = Executor::new(set, &ExecutorOptions::default()).context("executor")?;
    let rt = ArrayRuntime::start(engine, executor, &RuntimeOptions::default()).context("runtime")?;
    let handle = rt.handle();
    loop {
        let active = handle.control(|e, _, _| e.sync_active()).map_err(|e| anyhow::anyhow!("{e}"))?;
        if !active {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let states = handle.control(|e, _, _| e.member_states()).map_err(|e| anyhow::anyhow!("{e}"))?;
    rt.shutdown().map_err(|e| anyhow::anyhow!("{e}"))?;
    anyhow::ensure!(
        states[MEMBERS - 1] == MemberState::InSync,
        "the rebuild did not finish with the member in sync"
    );
    Ok(())
}

pub fn run(args: RebuildArgs) -> anyhow::Result<()> {
    let member_bytes = parse_size_bytes(&args.member_size).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(member_bytes >= 64 << 20, "--member-size must be at least 64M");
    let member_bytes = member_bytes / CHUNK_BYTES * CHUNK_BYTES;
    if !args.sim.is_empty() {
        anyhow::ensure!((0.5..=600.0).contains(&args.seconds), "--seconds: give 0.5 to 600");
        let sim_bytes = parse_size_bytes(&args.sim_member_size).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(sim_bytes >= 16 << 30, "--sim-member-size must be at least 16G");
        let sim_bytes = sim_bytes / CHUNK_BYTES * CHUNK_BYTES;
        return super::rebuild_load::run_sim(&args.sim, sim_bytes, args.seconds, args.json);
    }
    let members = Members::make(&args, member_bytes)?;
    let paths = members.paths();
    eprintln!("writing {MEMBERS} members of {} MiB ({}) ...", member_bytes >> 20, members.kind());
    for (m, p) in paths.iter().enumerate() {
        fill(p, member_bytes, m as u8)?;
    }
    let on_block_devices = matches!(members, Members::Devices(_));
    if on_block_devices {
        // The fill went through the page cache: give its memory back before measuring.
        drop_caches()?;
    }
    if args.under_load {
        anyhow::ensure!((0.5..=600.0).contains(&args.seconds), "--seconds: give 0.5 to 600");
        return super::rebuild_load::run(paths, member_bytes, args.seconds, args.json, &members.kind());
    }
    // Make the parity consistent is not needed for speed: the rebuild reads and writes the
    // same bytes whatever they hold. Slot 5 is the one rebuilt.
    let survivors: Vec<PathBuf> = paths[..MEMBERS - 1].to_vec();
    let mut peer = Vec::new();
    let mut rebuild = Vec::new();
    for _ in 0..args.runs.max(1) {
        if on_block_devices {
            // The peer reads buffered: from the devices, not from what the last run cached.
            drop_caches()?;
        }
        peer.push(timed(|| read_all_sequentially(&survivors))?);
        rebuild.push(timed(|| rebuild_once(paths, member_bytes))?);
    }
    let ratios: Vec<f64> = peer.iter().zip(&rebuild).map(|(p, r)| p.seconds / r.seconds).collect();
    let per_run: Vec<serde_json::Value> = peer
        .iter()
        .zip(&rebuild)
        .map(|(p, r)| {
            serde_json::json!({"seconds": r.seconds, "cpu_seconds": r.cpu_seconds,
                "peer_seconds": p.seconds, "peer_cpu_seconds": p.cpu_seconds})
        })
        .collect();
    let (peer, rebuild) = (median(peer), median(rebuild));
    let (peer_s, rebuild_s) = (peer.seconds, rebuild.seconds);
    let mbps = member_bytes as f64 / rebuild_s / 1e6;
    let peer_mbps = member_bytes as f64 / peer_s / 1e6;
    let ratio = peer_s / rebuild_s;
    if args.json {
        let v = serde_json::json!([{
            "bench": "rebuild", "level": 6, "raid_devices": MEMBERS, "member_bytes": member_bytes,
            "runs": ratios.len(), "seconds": rebuild_s, "mbps_per_member": mbps, "cpu_seconds": rebuild.cpu_seconds,
            "peer": "read five survivors sequentially", "peer_seconds": peer_s, "peer_mbps_per_member": peer_mbps,
            "peer_cpu_seconds": peer.cpu_seconds,
            "ratio": ratio, "ratio_per_run": ratios, "per_run": per_run,
        }]);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "RAID6, {MEMBERS} members of {} MiB ({}), chunk {} KiB; CPU: {}",
            member_bytes >> 20,
            members.kind(),
            CHUNK_BYTES >> 10,
            cpu_model()
        );
        println!("median of {} runs, peer and rebuild taking turns", ratios.len());
        println!("{:<44} {:>9} {:>14} {:>12}", "", "seconds", "MB/s per member", "CPU seconds");
        let row = |name: &str, m: &Measured, mbps: f64| {
            println!("{name:<44} {:>9.2} {mbps:>14.0} {:>12.2}", m.seconds, m.cpu_seconds)
        };
        row("rebuild one member (reads 4 of 5, writes 1)", &rebuild, mbps);
        row("peer: read the 5 survivors sequentially", &peer, peer_mbps);
        let per_run: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!("ratio (peer time / rebuild time): {ratio:.2} (per run: {})", per_run.join(" "));
    }
    Ok(())
}

/// One phase's wall-clock and CPU time.
#[derive(Clone, Copy)]
struct Measured {
    seconds: f64,
    cpu_seconds: f64,
}

fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Measured> {
    let (t, cpu) = (Instant::now(), process_cpu_seconds());
    f()?;
    Ok(Measured { seconds: t.elapsed().as_secs_f64(), cpu_seconds: process_cpu_seconds() - cpu })
}

/// The run with the median wall-clock time.
fn median(runs: Vec<Measured>) -> Measured {
    uraid_io::bench::median_by(runs, |m| m.seconds).expect("at least one run")
}

/// User plus system time of the whole process so far.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes only into `ru`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}
