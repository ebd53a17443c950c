//! `uraid bench disk`: RAID5 and RAID6 served by `uraid serve` (fio's nbd engine) against
//! btrfs raid5/raid6 on the same block devices and against one of those devices alone,
//! with the same fio jobs, in one run.
//!
//! The devices are the user's (`--devices`, overwritten) or loop devices over files the
//! bench makes in `--dir`, attached with direct I/O so that the host's page cache does not
//! stand between the loop device and the disk. Every system covers the same share of each
//! device, its first half: one device alone its first half, the arrays and the btrfs file a
//! data set of (devices - 2) halves. Each region is written once before its jobs, so reads
//! read blocks the disk holds rather than holes, which cost a loop file nothing. The page
//! cache is dropped before each read job, and btrfs and the device alone run O_DIRECT, so
//! the figures are the disks' and not memory's. Signatures are wiped before each system,
//! so that neither btrfs nor md finds the other's superblocks.
//!
//! `--runs N` repeats the whole comparison, uraid and btrfs taking turns at going first;
//! a row's ratio is the median of the runs' own ratios (each uraid figure divided by the
//! btrfs figure of its run), printed with the range. Loop devices over a shared disk drift
//! by up to 2x within minutes (docs/performance.md), which one run cannot tell from either
//! system's speed.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use super::devices::{drop_caches, sh, wipe, Devices};
use super::nbd::{
    fio, run_uraid, serve_uraid, target_cell, Job, Measured, Scratch, Server, Target, FILL, JOBS,
};
use crate::size_arg::parse_size_bytes;

#[derive(Args)]
pub struct DiskArgs {
    /// Block devices to use, comma-separated. THEIR CONTENTS ARE DESTROYED (needs --yes-destroy).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["dir", "count", "size"])]
    devices: Vec<PathBuf>,
    /// Confirms that the --devices may be overwritten.
    #[arg(long)]
    yes_destroy: bool,
    /// Without --devices: the folder (not tmpfs) where the loop devices' files are made;
    /// they are detached and removed at the end.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Loop devices to make.
    #[arg(long, default_value_t = 6)]
    count: usize,
    /// Size of each loop device's file (K/M/G suffixes).
    #[arg(long, default_value = "2G", value_parser = parse_size_bytes)]
    size: u64,
    /// RAID levels, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "5,6", value_parser = ["5", "6"])]
    levels: Vec<String>,
    /// Seconds each fio job runs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    runtime: u64,
    /// Times the whole comparison runs, uraid and btrfs taking turns at going first.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// Writes first, so that the reads read what the writes left (btrfs's copy-on-write
/// fragments the file as a real workload would).
const ORDER: [&str; 4] = ["seqwrite-1m", "randwrite-4k", "randread-4k", "seqread-1m"];

/// The minimum uraid/btrfs ratio of a row.
fn target(level: u32, job: &str) -> Option<f64> {
    match (level, job) {
        (6, "randwrite-4k") => Some(5.0),
        (6, "seqwrite-1m") => Some(2.0),
        (6, _) => Some(1.0),
        _ => None,
    }
}

#[derive(Serialize)]
struct Row {
    level: u32,
    job: &'static str,
    /// Medians over the runs (each system's own median).
    uraid_iops: f64,
    btrfs_iops: f64,
    /// The median of `ratios`.
    ratio: f64,
    /// Each run's uraid IOPS / btrfs IOPS of the same run, in run order.
    ratios: Vec<f64>,
    target: Option<f64>,
    one_device_iops: f64,
    /// uraid_iops / (devices x one_device_iops): above 1 the figure is not the disks'.
    devices_ratio: f64,
    /// Every device at once (fio O_DIRECT spreading the job over all of them, the same
    /// region of each, the same queue depth): what the devices give together, the
    /// ceiling a RAID over them meets first when they share a bus, a disk or CPUs.
    all_devices_iops: f64,
    /// uraid_iops / all_devices_iops.
    all_devices_ratio: f64,
}

#[derive(Serialize)]
struct Report {
    cpu: String,
    devices: Vec<PathBuf>,
    /// What the devices are: the user's, or loop devices over files (and whether direct-io took).
    kind: String,
    device_bytes: u64,
    data_set_bytes: u64,
    /// The region of the one device measured alone: the share of each device the arrays use.
    one_device_bytes: u64,
    runtime_secs: u64,
    runs: u64,
    rows: Vec<Row>,
}

/// A btrfs made and mounted on the devices; on drop unmounted and forgotten by the kernel.
struct Btrfs {
    mnt: PathBuf,
    devices: Vec<PathBuf>,
}

impl Btrfs {
    fn make(level: u32, devices: &[PathBuf], mnt: PathBuf) -> anyhow::Result<Btrfs> {
        let profile = format!("raid{level}");
        sh(Command::new("mkfs.btrfs").args(["-f", "-q", "-d", &profile, "-m", &profile]).args(devices))?;
        std::fs::create_dir_all(&mnt)?;
        let fs = Btrfs { mnt, devices: devices.to_vec() };
        // device= for each member: the kernel need not have scanned them.
        let opts: Vec<String> = devices.iter().map(|d| format!("device={}", d.display())).collect();
        sh(Command::new("mount").args(["-t", "btrfs", "-o", &opts.join(",")]).arg(&devices[0]).arg(&fs.mnt))?;
        Ok(fs)
    }
}

impl Drop for Btrfs {
    fn drop(&mut self) {
        if sh(Command::new("umount").arg(&self.mnt)).is_err() {
            let _ = sh(Command::new("umount").arg("-l").arg(&self.mnt));
        }
        // Else the kernel keeps the devices in its btrfs registry after they are wiped.
        let _ = sh(Command::new("btrfs").args(["device", "scan", "--forget"]).args(&self.devices));
    }
}

fn median(values: Vec<f64>) -> f64 {
    uraid_io::bench::median_by(values, |v| *v).unwrap_or(0.0)
}

fn device_bytes(dev: &Path) -> anyhow::Result<u64> {
    Ok(File::open(dev).with_context(|| format!("opening {}", dev.display()))?.seek(SeekFrom::End(0))?)
}

pub(super) fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        info.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim()));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{} ({cores} cores)", model.unwrap_or("unknown CPU"))
}

/// What the systems share while they are measured.
struct Bench {
    runtime_secs: u64,
    scratch: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Bench {
    fn check(&self) -> anyhow::Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    /// Writes `[0, region_bytes)` of `target` once, then runs the jobs on it in ORDER.
    fn measure(
        &self,
        target: &Target,
        region_bytes: u64,
        mut server: Option<&mut Server>,
    ) -> anyhow::Result<Vec<Measured>> {
        let out = self.scratch.join("fio.json");
        let mut step = |job: &Job, secs: Option<u64>| -> anyhow::Result<Measured> {
            if job.name.contains("read") {
                drop_caches()?;
            }
            let m = fio(target, job, 0, region_bytes, secs, &out);
            // Ctrl-C reaches fio and the server too: say so rather than what they did about it.
            self.check()?;
            if let Some(s) = server.as_deref_mut() {
                s.alive()?;
            }
            m
        };
        step(&FILL, None)?;
        let job = |name: &str| JOBS.iter().find(|j| j.name == name).expect("ORDER names JOBS");
        ORDER.iter().map(|&name| step(job(name), Some(self.runtime_secs))).collect()
    }

    fn uraid(&self, level: u32, devices: &[PathBuf], data_set_bytes: u64) -> anyhow::Result<Vec<Measured>> {
        eprintln!("raid{level}: uraid serve through NBD");
        wipe(devices)?;
        let (level_arg, count_arg) =
            (format!("--level={level}"), format!("--raid-devices={}", devices.len()));
        let devs: Vec<String> = devices.iter().map(|d| d.display().to_string()).collect();
        let mut create = vec!["create", &level_arg, &count_arg, "--assume-clean", "--name", "bench"];
        create.extend(devs.iter().map(String::as_str));
        run_uraid(&create)?;
        let name = if level == 5 { "uraid serve (raid5)" } else { "uraid serve (raid6)" };
        let (mut server, uri) = serve_uraid(name, &self.scratch, &format!("raid{level}"), devices)?;
        self.measure(&Target::Nbd(&uri), data_set_bytes, Some(&mut server))
    }

    fn btrfs(&self, level: u32, devices: &[PathBuf], data_set_bytes: u64) -> anyhow::Result<Vec<Measured>> {
        eprintln!("raid{level}: btrfs");
        wipe(devices)?;
        let fs = Btrfs::make(level, devices, self.scratch.join("mnt"))?;
        self.measure(&Target::Direct(&fs.mnt.join("bench.dat")), data_set_bytes, None)
    }

    fn one_device(&self, device: &Path, region_bytes: u64) -> anyhow::Result<Vec<Measured>> {
        eprintln!("one device: {}", device.display());
        wipe(&[device.to_path_buf()])?;
        self.measure(&Target::Direct(device), region_bytes, None)
    }

    /// fio on every device at once: its job spread over them (one file per device, the
    /// first `region_bytes` of each).
    fn all_devices(&self, devices: &[PathBuf], region_bytes: u64) -> anyhow::Result<Vec<Measured>> {
        eprintln!("all {} devices at once", devices.len());
        wipe(devices)?;
        // fio separates file names with ':' and reads '\:' as one (by-path names have them).
        let names: Vec<String> =
            devices.iter().map(|d| d.display().to_string().replace(':', "\\:")).collect();
        let joined = PathBuf::from(names.join(":"));
        self.measure(&Target::Direct(&joined), region_bytes * devices.len() as u64, None)
    }
}

pub fn run(args: DiskArgs) -> anyhow::Result<()> {
    let levels: Vec<u32> = args.levels.iter().map(|l| l.parse().expect("clap checked 5 or 6")).collect();
    let count = if args.devices.is_empty() { args.count } else { args.devices.len() };
    let min_count = if levels.contains(&6) { 4 } else { 3 };
    if count < min_count {
        bail!("raid{} needs at least {min_count} devices", levels.iter().max().unwrap_or(&5));
    }
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "`uraid bench disk` needs root: it attaches loop devices, mounts btrfs and drops the page cache"
        );
    }
    for (tool, package) in [("fio", "fio"), ("mkfs.btrfs", "btrfs-progs"), ("wipefs", "util-linux")] {
        if Command::new(tool).arg("--version").output().is_err() {
            bail!("`uraid bench disk` needs {tool}: apt-get install {package}");
        }
    }
    drop_caches()?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let scratch = Scratch(std::env::temp_dir().join(format!("uraid-bench-disk-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)?;
    // Declared after the scratch folder, which holds the btrfs mount point: dropped before it.
    let devices = if args.devices.is_empty() {
        if args.size < 256 << 20 {
            bail!("--size must be at least 256M (btrfs and the data set need room)");
        }
        Devices::loops(&args.dir, "disk", count, args.size)?
    } else {
        Devices::user(&args.devices, args.yes_destroy)?
    };
    let device_bytes = devices.paths.iter().map(|d| device_bytes(d)).collect::<anyhow::Result<Vec<_>>>()?;
    let device_bytes = device_bytes.into_iter().min().unwrap_or(0);
    let half_bytes = ((device_bytes / 2) >> 20) << 20;
    let data_set_bytes = half_bytes * (count as u64 - 2);

    let bench = Bench { runtime_secs: args.runtime, scratch: scratch.0.clone(), stop };
    // Per run: one device, all devices, and per level uraid and btrfs, each a figure per job.
    let mut one = Vec::new();
    let mut all = Vec::new();
    let mut uraid: Vec<Vec<Vec<Measured>>> = levels.iter().map(|_| Vec::new()).collect();
    let mut btrfs: Vec<Vec<Vec<Measured>>> = levels.iter().map(|_| Vec::new()).collect();
    for run in 0..args.runs {
        eprintln!("run {} of {}", run + 1, args.runs);
        one.push(bench.one_device(&devices.paths[0], half_bytes)?);
        all.push(bench.all_devices(&devices.paths, half_bytes)?);
        for (l, &level) in levels.iter().enumerate() {
            let uraid_first = run % 2 == 0;
            if uraid_first {
                uraid[l].push(bench.uraid(level, &devices.paths, data_set_bytes)?);
            }
            btrfs[l].push(bench.btrfs(level, &devices.paths, data_set_bytes)?);
            if !uraid_first {
                uraid[l].push(bench.uraid(level, &devices.paths, data_set_bytes)?);
            }
        }
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let mut rows = Vec::new();
    for (l, &level) in levels.iter().enumerate() {
        for (i, job) in ORDER.iter().enumerate() {
            let iops = |runs: &[Vec<Measured>]| median(runs.iter().map(|r| r[i].iops).collect());
            let (uraid_iops, btrfs_iops) = (iops(&uraid[l]), iops(&btrfs[l]));
            let ratios: Vec<f64> =
                uraid[l].iter().zip(&btrfs[l]).map(|(u, b)| ratio(u[i].iops, b[i].iops)).collect();
            let (one_device_iops, all_devices_iops) = (iops(&one), iops(&all));
            rows.push(Row {
                level,
                job,
                uraid_iops,
                btrfs_iops,
                ratio: median(ratios.clone()),
                ratios,
                target: target(level, job),
                one_device_iops,
                devices_ratio: ratio(uraid_iops, count as f64 * one_device_iops),
                all_devices_iops,
                all_devices_ratio: ratio(uraid_iops, all_devices_iops),
            });
        }
    }
    let report = Report {
        cpu: cpu_model(),
        devices: devices.paths.clone(),
        kind: devices.kind.clone(),
        device_bytes,
        data_set_bytes,
        one_device_bytes: half_bytes,
        runtime_secs: args.runtime,
        runs: args.runs,
        rows,
    };
    drop(devices);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, count);
    }
    Ok(())
}

fn print_report(r: &Report, count: usize) {
    let list: Vec<String> = r.devices.iter().map(|d| d.display().to_string()).collect();
    println!("CPU: {}", r.cpu);
    println!("devices: {} ({}), {} MiB each", list.join(" "), r.kind, r.device_bytes >> 20);
    println!(
        "data set {} MiB (one device: its first {} MiB); fio iodepth 32, 1 job, {} s per job; \
         page cache dropped before each read job; btrfs and one device O_DIRECT with libaio",
        r.data_set_bytes >> 20,
        r.one_device_bytes >> 20,
        r.runtime_secs
    );
    println!(
        "{} runs, uraid and btrfs taking turns at going first; IOPS are each system's median, \
         uraid/btrfs the median of the runs' own ratios (lowest-highest)",
        r.runs
    );
    let mut level = 0;
    for row in &r.rows {
        if row.level != level {
            level = row.level;
            println!();
            println!(
                "| job | uraid raid{level} IOPS | btrfs raid{level} IOPS | uraid/btrfs | target | \
                 one device IOPS | uraid/({count} x one) | all {count} devices IOPS | uraid/all |"
            );
            println!("|---|---|---|---|---|---|---|---|---|");
        }
        let t = target_cell(row.ratio, row.target);
        let bound = if row.devices_ratio > 1.0 { " ABOVE THE DEVICES" } else { "" };
        let lowest = row.ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = row.ratios.iter().copied().fold(0.0, f64::max);
        let range = if row.ratios.len() > 1 { format!(" ({lowest:.2}-{highest:.2})") } else { String::new() };
        println!(
            "| {} | {:.0} | {:.0} | {:.2}{range} | {t} | {:.0} | {:.2}{bound} | {:.0} | {:.2} |",
            row.job,
            row.uraid_iops,
            row.btrfs_iops,
            row.ratio,
            row.one_device_iops,
            row.devices_ratio,
            row.all_devices_iops,
            row.all_devices_ratio
        );
    }
}
