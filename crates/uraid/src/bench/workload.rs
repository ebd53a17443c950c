//! `uraid bench workload EXPERIMENT`: the job grid of `uraid reproduce EXPERIMENT` run in
//! real time on real members (files or block devices), printed in the same tables.
//!
//! Each cell builds the experiment's array (level, layout, chunk, tunables, missing members)
//! on the members with the real executor and the array runtime, drives it for a warm-up and
//! then `--seconds-per-cell` with the cell's job (threads, queue depth, block size,
//! sequential or random, read or write), and reports the rates of the measured window. The
//! counts a table derives per job duration (bytes, I/Os, member I/Os, engine CPU) are scaled
//! from the measured window to the grid's nominal duration, so every rate and ratio in the
//! table is the measured one. The peer of each table is its own baseline configuration
//! (the 1:1 model, rmw_level 0, round-robin, ...), measured in the same run; the ratios to it
//! are printed after the tables.

use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use uraid_core::{ArrayConfig, Engine, Geometry, RequestCompletion, RequestOp};
use uraid_io::real::{BackendKind, Executor, ExecutorOptions, MemberSet, OpenOptions};
use uraid_io::runtime::{ArrayRuntime, RuntimeHandle, RuntimeOptions};
use uraid_sim::experiments::tables::{self, Cell, Report, Table, EXPERIMENTS};
use uraid_sim::experiments::{Access, Job, JobDriver, JobResult, JobRunner, TimedEngine};

use super::plot;
use crate::reproduce::{print_report, report_json};
use crate::size_arg::parse_size_bytes;

#[derive(Args)]
pub struct WorkloadArgs {
    /// stripe-queue, degraded-read, nomerges, mirror-balance, rmw, or all.
    experiment: String,
    /// Member files or block devices to use. THEIR CONTENTS ARE DESTROYED.
    #[arg(long, num_args = 1.., conflicts_with = "dir")]
    members: Vec<PathBuf>,
    /// Create temporary sparse member files in this directory (deleted afterwards). The
    /// default, without --members, is /dev/shm (else /var/tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Size of each temporary member file (K/M/G suffixes).
    #[arg(long, default_value = "1G", value_parser = parse_size_bytes)]
    member_size: u64,
    /// Measured real time per cell (a warm-up of a fifth of it comes first).
    #[arg(long, default_value_t = 1.0)]
    seconds_per_cell: f64,
    /// Run only the cells with these block sizes (e.g. 4K,128K); the others print as "-".
    #[arg(long, value_delimiter = ',', value_parser = parse_size_bytes)]
    bs: Vec<u64>,
    /// Run only the cells with these thread (process) counts, e.g. 1,4.
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Run only reads or only writes.
    #[arg(long, value_parser = ["read", "write"])]
    op: Option<String>,
    /// Run only sequential or only random cells.
    #[arg(long, value_parser = ["seq", "rand"])]
    access: Option<String>,
    /// Write an SVG plot of throughput against block size or thread count here (with
    /// `all`: one file per experiment, the experiment's name added before the extension).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Use --members even when they carry an md superblock.
    #[arg(long)]
    force: bool,
    #[arg(long)]
    json: bool,
}

/// Which cells of the grid run.
#[derive(Clone, Debug, Default)]
struct Filter {
    bs: Vec<u64>,
    threads: Vec<usize>,
    op: Option<RequestOp>,
    access: Option<Access>,
}

impl Filter {
    fn matches(&self, job: &Job) -> bool {
        (self.bs.is_empty() || self.bs.contains(&job.block_bytes))
            && (self.threads.is_empty() || self.threads.contains(&job.threads))
            && self.op.is_none_or(|o| o == job.op)
            && self.access.is_none_or(|a| a == job.access)
    }
}

/// A cell that was not run: its rates are NaN, which the tables print as "-".
fn not_measured() -> JobResult {
    JobResult { mbps: f64::NAN, iops: f64::NAN, ..JobResult::default() }
}

/// Counts the cells an experiment would run (and the members it needs) without running any.
#[derive(Default)]
struct Counter {
    filter: Filter,
    cells: usize,
    members: usize,
}

impl JobRunner for Counter {
    fn run(&mut self, config: ArrayConfig, _: &str, _: u64, job: &Job, _: u64) -> Result<JobResult, String> {
        if !self.filter.matches(job) {
            return Ok(not_measured());
        }
        self.cells += 1;
        self.members = self.members.max(config.geometry.raid_disks);
        Ok(JobResult::default())
    }
}

/// Runs cells on the real members.
struct RealRunner {
    paths: Vec<PathBuf>,
    /// The smallest member's size.
    member_bytes: u64,
    seconds: f64,
    filter: Filter,
    stop: Arc<AtomicBool>,
    progress: Progress,
    backend: Option<BackendKind>,
    direct: Option<bool>,
    cells_run: usize,
}

/// Where the array's data starts on each member, as in the simulated experiments.
const DATA_OFFSET_BYTES: u64 = 1 << 20;

impl JobRunner for RealRunner {
    fn run(
        &mut self,
        config: ArrayConfig,
        _: &str,
        _: u64,
        job: &Job,
        seed: u64,
    ) -> Result<JobResult, String> {
        if !self.filter.matches(job) {
            return Ok(not_measured());
        }
        if self.stop.load(Ordering::Relaxed) {
            return Err("interrupted".into());
        }
        self.progress.start_cell(&describe(&config, job));
        let r = self.run_cell(config, job, seed);
        self.cells_run += 1;
        self.progress.end_cell();
        r
    }
}

fn describe(config: &ArrayConfig, job: &Job) -> String {
    let g = &config.geometry;
    let op = if job.op == RequestOp::Write { "write" } else { "read" };
    let access = if job.access == Access::Sequential { "seq" } else { "rand" };
    format!(
        "{:?} x{} {access} {op} bs {} thr {} qd {}",
        g.level,
        g.raid_disks,
        size_text(job.block_bytes),
        job.threads,
        job.queue_depth
    )
}

fn size_text(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// (engine CPU ns, member reads, member writes) at one moment.
fn snapshot(h: &RuntimeHandle<TimedEngine<Engine>>) -> Result<(u64, u64, u64), String> {
    let cpu = h.control(|t, _, _| t.cpu_ns).map_err(|e| e.to_string())?;
    let s = h.stats().map_err(|e| e.to_string())?;
    Ok((cpu, s.array.member_reads(), s.array.member_writes()))
}

impl RealRunner {
    fn run_cell(&mut self, config: ArrayConfig, job: &Job, seed: u64) -> Result<JobResult, String> {
        let g0 = &config.geometry;
        let n = g0.raid_disks;
        if n > self.paths.len() {
            return Err(format!("this experiment needs {n} members; {} given", self.paths.len()));
        }
        // md rounds each member's data down to a whole number of chunks.
        let unit = if g0.chunk_sectors > 0 { g0.chunk_sectors } else { 128 };
        let sectors = (self.member_bytes.saturating_sub(DATA_OFFSET_BYTES) / 512) / unit * unit;
        let geometry = Geometry::new(g0.level, n, g0.layout, g0.chunk_sectors, &vec![sectors; n])?;
        let config = ArrayConfig { geometry, ..config };
        let engine = Engine::new(config).map_err(|e| e.to_string())?;
        let size = engine.size_bytes();
        let members =
            MemberSet::open(&self.paths[..n], &OpenOptions { direct: true, read_only: false, log: false })
                .map_err(|e| e.to_string())?;
        self.direct = Some(members.iter().all(|m| m.is_direct()));
        let ex = Executor::new(members, &ExecutorOptions { log: false, ..ExecutorOptions::default() })
            .map_err(|e| e.to_string())?;
        self.backend = Some(ex.backend());
        let rt =
            ArrayRuntime::start(TimedEngine { inner: engine, cpu_ns: 0 }, ex, &RuntimeOptions::default())
                .map_err(|e| e.to_string())?;
        let r = self.drive(&rt.handle(), size, job, seed);
        let shut = rt.shutdown().map_err(|e| e.to_string())?;
        let r = r?;
        shut.flush.map_err(|e| format!("the final flush failed: {e:?}"))?;
        Ok(r)
    }

    /// The job in real time: like the simulator's `sim_job::run_job`, with the clock on the wall.
    fn drive(
        &self,
        h: &RuntimeHandle<TimedEngine<Engine>>,
        size: u64,
        job: &Job,
        seed: u64,
    ) -> Result<JobResult, String> {
        let region = if job.region_bytes == 0 { size } else { job.region_bytes.min(size) };
        let bs = job.block_bytes;
        if region < bs * job.threads as u64 {
            return Err(format!("the array ({size} bytes) is too small for this job"));
        }
        let mut driver = JobDriver::new(job, region, seed);
        let (tx, rx) = mpsc::channel::<(RequestCompletion, Instant)>();
        let warmup = Duration::from_secs_f64((self.seconds / 5.0).max(0.02));
        let measured = Duration::from_secs_f64(self.seconds);
        let t0 = Instant::now();
        let (warm_end, end) = (t0 + warmup, t0 + warmup + measured);
        let mut at_warm = None;
        let (mut ios, mut bytes) = (0u64, 0u64);
        loop {
            let now = Instant::now();
            if self.stop.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            if at_warm.is_none() && now >= warm_end {
                at_warm = Some(snapshot(h)?);
            }
            if now >= end {
                break;
            }
            let mut round = uraid_core::CompletionRound::default();
            for r in driver.top_up(job) {
                let tx = tx.clone();
                h.submit(
                    r,
                    Box::new(move |c, _| {
                        let _ = tx.send((c, Instant::now()));
                    }),
                    &mut round,
                )
                .map_err(|e| e.to_string())?;
            }
            let until = if at_warm.is_none() { warm_end } else { end };
            let first = rx.recv_timeout(until.saturating_duration_since(now)).ok();
            for (tc, at) in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                let finished = driver.complete(tc)?;
                if at >= warm_end && at < end {
                    ios += finished;
                    bytes += finished * bs;
                }
            }
        }
        let (cpu1, reads1, writes1) = snapshot(h)?;
        let (cpu0, reads0, writes0) = at_warm.unwrap_or((cpu1, reads1, writes1));
        // Counts per the grid's nominal duration (the tables divide by it).
        let k = job.duration_ns as f64 / measured.as_nanos() as f64;
        let scale = |x: u64| (x as f64 * k).round() as u64;
        let secs = measured.as_secs_f64();
        let mut r = JobResult {
            ios: scale(ios),
            bytes: scale(bytes),
            mbps: bytes as f64 / secs / 1e6,
            iops: ios as f64 / secs,
            engine_cpu_ns: scale(cpu1 - cpu0),
            member_reads: scale(reads1 - reads0),
            member_writes: scale(writes1 - writes0),
            virtual_ns: job.duration_ns,
            ..JobResult::default()
        };
        driver.finish(&mut r);
        Ok(r)
    }
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
struct Progress {
    on: bool,
    total: usize,
    done: usize,
    started: Instant,
}

impl Progress {
    fn new(total: usize) -> Progress {
        Progress { on: std::io::stderr().is_terminal(), total, done: 0, started: Instant::now() }
    }

    fn start_cell(&self, what: &str) {
        if !self.on {
            return;
        }
        const WIDTH: usize = 30;
        let filled = (self.done * WIDTH).checked_div(self.total).unwrap_or(0).min(WIDTH);
        let eta = if self.done > 0 {
            let per = self.started.elapsed().as_secs_f64() / self.done as f64;
            format!("{:.0}s left", per * self.total.saturating_sub(self.done) as f64)
        } else {
            String::new()
        };
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\r\x1b[2K[{}{}] {}/{} {eta} {what}",
            "#".repeat(filled),
            " ".repeat(WIDTH - filled),
            self.done,
            self.total
        );
        let _ = e.flush();
    }

    fn end_cell(&mut self) {
        self.done += 1;
    }

    fn finish(&self) {
        if self.on {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

/// Whether a member carries an md superblock (0.90, 1.0, 1.1 or 1.2).
fn has_md_superblock(path: &Path) -> anyhow::Result<bool> {
    let mut f = std::fs::File::open(path).with_context(|| format!("{}: opening", path.display()))?;
    let size = f.seek(SeekFrom::End(0))?;
    let mut at = vec![0u64, 4096];
    if size >= 128 << 10 {
        at.push((size & !((64 << 10) - 1)) - (64 << 10)); // 0.90
        at.push(((size / 512 - 16) & !7) * 512); // 1.0
    }
    for off in at {
        let mut magic = [0u8; 4];
        f.seek(SeekFrom::Start(off))?;
        if f.read_exact(&mut magic).is_ok() && u32::from_le_bytes(magic) == uraid_core::meta::MD_SB_MAGIC {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Temporary member files, deleted on drop.
struct TempMembers {
    dir: PathBuf,
    paths: Vec<PathBuf>,
}

impl TempMembers {
    fn create(parent: &Path, count: usize, size: u64) -> anyhow::Result<TempMembers> {
        let dir = parent.join(format!("uraid-bench-{}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut t = TempMembers { dir, paths: Vec::new() };
        for i in 0..count {
            let p = t.dir.join(format!("member{i}"));
            let f = std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?;
            f.set_len(size).with_context(|| format!("sizing {}", p.display()))?;
            t.paths.push(p);
        }
        Ok(t)
    }
}

impl Drop for TempMembers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn default_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && std::fs::metadata(shm).is_ok_and(|m| !m.permissions().readonly()) {
        shm.to_path_buf()
    } else {
        PathBuf::from("/var/tmp")
    }
}

/// The table's own baseline: the configuration the others are compared with.
enum Peer {
    /// Two columns of each row: ours / peer's.
    Columns { peer: &'static str, ours: &'static str, label: &'static [&'static str] },
    /// Rows whose `key` column is `peer` vs rows with `ours`, matched by `group`.
    Rows {
        key: &'static str,
        peer: &'static str,
        ours: &'static str,
        group: &'static str,
        value: &'static str,
    },
}

fn peers(experiment: &str) -> (&'static str, Vec<Peer>) {
    match experiment {
        "stripe-queue" => (
            "the 1:1 model (write_batching off)",
            vec![Peer::Columns { peer: "MB/s 1:1", ours: "MB/s batching", label: &["Blk Size", "Num Thr"] }],
        ),
        "degraded-read" => (
            "degraded with the chunk-aligned read bypass (md before the patch)",
            vec![Peer::Columns { peer: "degraded (", ours: "degraded-with-patch", label: &["bs (KiB)"] }],
        ),
        "nomerges" => (
            "nomerges 0 (all merges)",
            vec![
                Peer::Rows { key: "nomerges", peer: "0", ours: "1", group: "", value: "IOPS" },
                Peer::Rows { key: "nomerges", peer: "0", ours: "2", group: "", value: "IOPS" },
            ],
        ),
        "mirror-balance" => (
            "balance round-robin",
            vec![
                Peer::Rows {
                    key: "balance",
                    peer: "round-robin",
                    ours: "load",
                    group: "processes",
                    value: "linear 1MB MBps",
                },
                Peer::Rows {
                    key: "balance",
                    peer: "round-robin",
                    ours: "load",
                    group: "processes",
                    value: "random tps",
                },
            ],
        ),
        "rmw" => (
            "rmw_level 0 (reconstruct-write only)",
            vec![Peer::Columns { peer: "rmw_level=0", ours: "rmw_level=1", label: &["bsize"] }],
        ),
        _ => ("", Vec::new()),
    }
}

fn col(t: &Table, prefix: &str) -> Option<usize> {
    t.columns.iter().position(|c| c.starts_with(prefix))
}

fn num(c: &Cell) -> f64 {
    match c {
        Cell::Num(x) => *x,
        Cell::Int(x) => *x as f64,
        Cell::Text(_) => f64::NAN,
    }
}

/// One line per table and comparison: "what: label ratio, label ratio, ...".
fn ratio_lines(experiment: &str, report: &Report) -> Vec<(String, Vec<(String, f64)>)> {
    let mut out = Vec::new();
    for p in peers(experiment).1 {
        for t in &report.tables {
            match &p {
                Peer::Columns { peer, ours, label } => {
                    let (Some(pc), Some(oc)) = (col(t, peer), col(t, ours)) else { continue };
                    let labels: Vec<usize> = label.iter().filter_map(|l| col(t, l)).collect();
                    let ratios = t
                        .rows
                        .iter()
                        .map(|row| {
                            let l = labels.iter().map(|&i| row[i].to_string()).collect::<Vec<_>>().join("/");
                            (l, num(&row[oc]) / num(&row[pc]))
                        })
                        .collect();
                    out.push((format!("{}: {} / {}", t.title, t.columns[oc], t.columns[pc]), ratios));
                }
                Peer::Rows { key, peer, ours, group, value } => {
                    let (Some(kc), Some(vc)) = (col(t, key), col(t, value)) else { continue };
                    let gc = if group.is_empty() { None } else { col(t, group) };
                    let label = |row: &Vec<Cell>| gc.map(|g| row[g].to_string()).unwrap_or_default();
                    let ratios = t
                        .rows
                        .iter()
                        .filter(|row| row[kc].to_string() == *ours)
                        .filter_map(|row| {
                            let base = t
                                .rows
                                .iter()
                                .find(|r| r[kc].to_string() == *peer && label(r) == label(row))?;
                            let l = if group.is_empty() { row[kc].to_string() } else { label(row) };
                            Some((l, num(&row[vc]) / num(&base[vc])))
                        })
                        .collect();
                    let what = if group.is_empty() {
                        format!("{value}: {key} {ours} / {key} {peer}")
                    } else {
                        format!("{value} by {group}: {ours} / {peer}")
                    };
                    out.push((what, ratios));
                }
            }
        }
    }
    out
}

fn ratio_text(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "-".into()
    }
}

pub fn run(args: WorkloadArgs) -> anyhow::Result<()> {
    let names: Vec<&str> =
        if args.experiment == "all" { EXPERIMENTS.to_vec() } else { vec![args.experiment.as_str()] };
    for n in &names {
        if !EXPERIMENTS.contains(n) {
            bail!("unknown experiment {n:?}; one of {}, or all", EXPERIMENTS.join(", "));
        }
    }
    if !(args.seconds_per_cell > 0.0 && args.seconds_per_cell <= 600.0) {
        bail!("--seconds-per-cell must be in (0, 600]");
    }
    let filter = Filter {
        bs: args.bs.clone(),
        threads: args.threads.clone(),
        op: args.op.as_deref().map(|o| if o == "write" { RequestOp::Write } else { RequestOp::Read }),
        access: args.access.as_deref().map(|a| if a == "seq" { Access::Sequential } else { Access::Random }),
    };
    // A dry pass over the grids: how many cells, and how many members the largest array has.
    let mut counter = Counter { filter: filter.clone(), ..Counter::default() };
    for n in &names {
        tables::run_with(n, &tables::Options::scale(1.0), &mut counter).map_err(anyhow::Error::msg)?;
    }
    if counter.cells == 0 {
        bail!("the selection (--bs/--threads/--op/--access) matches no cell of {}", args.experiment);
    }
    let _temp;
    let paths = if args.members.is_empty() {
        let dir = args.dir.clone().unwrap_or_else(default_dir);
        let t = TempMembers::create(&dir, counter.members, args.member_size)?;
        let p = t.paths.clone();
        _temp = t;
        p
    } else {
        if args.members.len() < counter.members {
            bail!("{} needs {} members; {} given", args.experiment, counter.members, args.members.len());
        }
        for p in &args.members {
            if has_md_superblock(p)? && !args.force {
                bail!(
                    "{} carries an md superblock; the benchmark overwrites its members' data \
                     (use --force to go ahead)",
                    p.display()
                );
            }
        }
        args.members.clone()
    };
    let mut member_bytes = u64::MAX;
    for p in &paths {
        let mut f = std::fs::File::open(p).with_context(|| format!("{}: opening", p.display()))?;
        member_bytes = member_bytes.min(f.seek(SeekFrom::End(0))?);
    }
    if member_bytes < DATA_OFFSET_BYTES + (16 << 20) {
        bail!("members must be at least 17 MiB (the smallest has {member_bytes} bytes)");
    }
    // Ctrl-C stops at the next look and still deletes the temporary members.
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    let mut runner = RealRunner {
        paths: paths.clone(),
        member_bytes,
        seconds: args.seconds_per_cell,
        filter,
        stop,
        progress: Progress::new(counter.cells),
        backend: None,
        direct: None,
        cells_run: 0,
    };
    let mut out = Vec::new();
    for name in &names {
        let before = runner.cells_run;
        let r = tables::run_with(name, &tables::Options::scale(1.0), &mut runner);
        runner.progress.finish();
        let mut r = r.map_err(anyhow::Error::msg)?;
        tidy_unmeasured(&mut r);
        let (peer, _) = peers(name);
        r.setup = format!(
            "on real members: {} x {} ({}, {}), {} s per cell after a {:.2} s warm-up, {} cells run. \
             The job grid is `uraid reproduce {name}`'s; its disk profile and member size do not \
             apply here: {}",
            paths.len(),
            size_text(member_bytes),
            paths.first().and_then(|p| p.parent()).map(|p| p.display().to_string()).unwrap_or_default(),
            match (runner.direct, runner.backend) {
                (Some(d), Some(b)) => format!("{}, {b:?}", if d { "O_DIRECT" } else { "buffered" }),
                _ => "-".into(),
            },
            args.seconds_per_cell,
            (args.seconds_per_cell / 5.0).max(0.02),
            runner.cells_run - before,
            r.setup
        );
        let ratios = ratio_lines(name, &r);
        let plot_path = args.plot.as_ref().map(|p| {
            if names.len() == 1 {
                p.clone()
            } else {
                let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
                let ext = p.extension().and_then(|s| s.to_str()).unwrap_or("svg");
                p.with_file_name(format!("{stem}-{name}.{ext}"))
            }
        });
        if let Some(p) = &plot_path {
            plot::write_svg(p, name, &r).with_context(|| format!("writing the plot {}", p.display()))?;
        }
        if args.json {
            let mut v = report_json(&r);
            v["peer"] = serde_json::json!({
                "name": peer,
                "ratios": ratios.iter().map(|(what, rs)| serde_json::json!({
                    "what": what,
                    "ratios": rs.iter().map(|(l, x)| serde_json::json!({"row": l, "ratio": x.is_finite().then_some(*x)})).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            });
            v["members"] =
                serde_json::json!(paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>());
            v["member_bytes"] = serde_json::json!(member_bytes);
            v["seconds_per_cell"] = serde_json::json!(args.seconds_per_cell);
            v["cells_run"] = serde_json::json!(runner.cells_run - before);
            v["plot"] = serde_json::json!(plot_path.as_ref().map(|p| p.display().to_string()));
            out.push(v);
        } else {
            print_report(&r);
            println!("peer (measured in the same run): {peer}");
            for (what, rs) in &ratios {
                let cells: Vec<String> = rs.iter().map(|(l, x)| format!("{l} {}", ratio_text(*x))).collect();
                println!("  ratio {what}: {}", cells.join(", "));
            }
            if let Some(p) = &plot_path {
                println!("plot: {}", p.display());
            }
            println!();
        }
    }
    if args.json {
        let v = if out.len() == 1 { out.remove(0) } else { serde_json::Value::Array(out) };
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

/// Cells derived from an unmeasured one print "-", and claims that rest on one are dropped
/// (named in the setup instead of reported as findings).
fn tidy_unmeasured(r: &mut Report) {
    for t in &mut r.tables {
        for row in &mut t.rows {
            for c in row.iter_mut() {
                if let Cell::Text(s) = c {
                    if s.contains("NaN") || s.contains("inf") {
                        *c = Cell::Text("-".into());
                    }
                }
            }
        }
    }
    let (kept, dropped): (Vec<_>, Vec<_>) =
        r.claims.drain(..).partition(|c| !c.figures.contains("NaN") && !c.figures.contains("inf"));
    r.claims = kept;
    if !dropped.is_empty() {
        let names: Vec<String> = dropped.iter().map(|c| c.claim.clone()).collect();
        r.setup.push_str(&format!(". Not checked (their cells were not selected): {}", names.join("; ")));
    }
}
