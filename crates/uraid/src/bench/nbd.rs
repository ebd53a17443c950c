//! `uraid bench nbd`: `uraid serve` against `nbdkit file` and RAID6 against a passthrough
//! array, with the same fio jobs (`--ioengine=nbd`) in one run.
//!
//! Everything lives on tmpfs (`--dir`, default /dev/shm) so the members cost memory
//! copies only and the figures show the NBD server and the engine, not a disk:
//! - passthrough: a one-member RAID0 (md's mapping with nothing to split or mirror,
//!   no resync owed), served by `uraid serve`;
//! - nbdkit: `nbdkit file` on that same member file; fio's region starts at the member's
//!   data offset there, so both servers move the very same file bytes;
//! - raid6: six members, 512 KiB chunks, served by `uraid serve`.
//!
//! All three servers listen on Unix sockets and run as child processes of the bench,
//! each its own process like a real deployment. The region is written once before any
//! job (reads of tmpfs holes would be cheaper than reads of data). Each job runs
//! `--seconds` on every server, the servers taking turns, `--runs` times; the median run
//! of each is reported, from fio's JSON. Children are stopped when the bench ends, fails or is interrupted.
//!
//! Two-connection rows (`--connections`, issue 26): the 4 KiB jobs and seqread-1m also run
//! as that many fio jobs, each its own NBD connection (fio's nbd engine opens one per job)
//! over its own slice of the region, on the passthrough and the RAID6 server, taking turns
//! with the one-connection runs they are compared with. Each runs twice: at the same total
//! queue depth as the one connection (32 split over the connections: only the spreading
//! differs), and at 32 per connection (what a client opening more connections does).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

#[derive(Args)]
pub struct NbdArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Seconds each fio job runs on each server, per run.
    #[arg(long, default_value_t = 2)]
    seconds: u64,
    /// Runs per job and server, the servers taking turns; the median run is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Bytes of the export the jobs cover (K/M/G suffixes).
    #[arg(long, default_value = "256M", value_parser = crate::size_arg::parse_size_bytes)]
    size: u64,
    /// Directory for the member files; tmpfs keeps disks out of the figures.
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Only these jobs (repeatable; default all).
    #[arg(long = "job", value_parser = ["randread-4k", "randwrite-4k", "seqread-1m", "seqwrite-1m"])]
    jobs: Vec<String>,
    /// Connections of the multi-connection rows (fio jobs, each its own connection);
    /// 1 leaves those rows out.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    connections: u32,
}

/// One fio job of the comparison.
pub(crate) struct Job {
    pub(crate) name: &'static str,
    rw: &'static str,
    block: &'static str,
    iodepth: u32,
}

pub(crate) const JOBS: [Job; 4] = [
    Job { name: "randread-4k", rw: "randread", block: "4k", iodepth: 32 },
    Job { name: "randwrite-4k", rw: "randwrite", block: "4k", iodepth: 32 },
    Job { name: "seqread-1m", rw: "read", block: "1m", iodepth: 32 },
    Job { name: "seqwrite-1m", rw: "write", block: "1m", iodepth: 32 },
];

/// Minimum ratio each row should reach (the targets).
fn target(job: &str, array: &str) -> Option<f64> {
    match (array, job) {
        ("passthrough", _) => Some(1.0),
        ("raid6", "seqwrite-1m") => Some(0.5),
        ("raid6", "seqread-1m") => Some(0.8),
        _ => None,
    }
}

/// The jobs that also run over several connections: the small requests a connection
/// thread runs itself, and one of large requests, which go to the array thread.
const MULTI_CONNECTION_JOBS: [&str; 3] = ["randread-4k", "randwrite-4k", "seqread-1m"];

/// The target for several connections against one: judged at the same total
/// queue depth, where only the spreading over connections differs (not the depth).
fn multi_connection_target(total_iodepth: u32, one_connection_iodepth: u32) -> Option<f64> {
    (total_iodepth == one_connection_iodepth).then_some(1.5)
}

/// Per-connection queue depths of the multi-connection runs: the one connection's depth
/// split over them (at least 1 each), and the one connection's depth on each.
fn multi_connection_depths(iodepth: u32, connections: u32) -> [u32; 2] {
    [(iodepth / connections).max(1), iodepth]
}

#[derive(Serialize)]
struct Row {
    job: &'static str,
    array: &'static str,
    peer: &'static str,
    iops: f64,
    mbps: f64,
    peer_iops: f64,
    peer_mbps: f64,
    /// iops / peer_iops (the same as the MB/s ratio: both sides use the same block size).
    ratio: f64,
    /// The target for this row, if it has one.
    target: Option<f64>,
    /// Per connection.
    iodepth: u32,
    seconds: u64,
    runs: usize,
    /// NBD connections of this row's figure (fio jobs, one connection each).
    connections: u32,
    /// Connections of the peer's figure.
    peer_connections: u32,
    /// The peer's queue depth per connection.
    peer_iodepth: u32,
}

/// One pass of sequential 1 MiB writes: reads then read data rather than holes, which
/// cost neither tmpfs nor a disk anything.
pub(crate) const FILL: Job = Job { name: "fill", rw: "write", block: "1m", iodepth: 8 };

/// A child server: SIGTERM (a clean stop) and wait on drop, SIGKILL if it lingers.
pub(crate) struct Server {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl Server {
    fn spawn(name: &'static str, mut cmd: Command, log: PathBuf, socket: &Path) -> anyhow::Result<Server> {
        let logf = std::fs::File::create(&log)?;
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(logf);
        die_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("cannot start {name}: is it installed?"))?;
        let mut s = Server { name, child: Some(child), log };
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("{name} exited ({st}) before serving:\n{}", s.log_text());
            }
            if t0.elapsed() > Duration::from_secs(20) {
                bail!("{name} did not start serving in 20 s:\n{}", s.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(s)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn alive(&mut self) -> anyhow::Result<()> {
        if let Some(st) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            bail!("{} exited ({st}) during the bench:\n{}", self.name, self.log_text());
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else { return };
        // SAFETY: signalling our own child, which has not been reaped yet.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The child gets SIGKILL if the bench dies first (Ctrl-C, panic, kill).
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The bench's scratch directory, removed on drop (after the servers, declared later).
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn uraid_cmd() -> anyhow::Result<Command> {
    let exe = std::env::current_exe().context("locating the uraid binary")?;
    Ok(Command::new(exe))
}

pub(crate) fn run_uraid(args: &[&str]) -> anyhow::Result<String> {
    let out = uraid_cmd()?.args(args).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("uraid {} failed:\n{text}", args.join(" "));
    }
    Ok(text)
}

pub(crate) fn serve_uraid(
    name: &'static str,
    dir: &Path,
    tag: &str,
    members: &[PathBuf],
) -> anyhow::Result<(Server, String)> {
    let sock = dir.join(format!("{tag}.sock"));
    let mut cmd = uraid_cmd()?;
    cmd.arg("serve")
        .arg("--unix")
        .arg(&sock)
        .arg("--control")
        .arg(dir.join(format!("{tag}.ctl")))
        .args(["--export-name", tag])
        .args(members);
    let server = Server::spawn(name, cmd, dir.join(format!("{tag}.log")), &sock)?;
    Ok((server, format!("nbd+unix:///{tag}?socket={}", sock.display())))
}

/// IOPS and MB/s (10^6 bytes) of one fio run.
pub(crate) struct Measured {
    pub(crate) iops: f64,
    pub(crate) mbps: f64,
}

/// What a fio job runs on.
pub(crate) enum Target<'a> {
    /// An NBD export's URI (fio's nbd engine).
    Nbd(&'a str),
    /// A file or block device, with O_DIRECT and libaio: what an NBD export is measured against.
    Direct(&'a Path),
}

/// Runs one fio job over `[offset, offset + size)` of `target`.
/// `seconds`: time-based for that long; `None`: one pass over the region.
pub(crate) fn fio(
    target: &Target,
    job: &Job,
    offset: u64,
    size: u64,
    seconds: Option<u64>,
    out: &Path,
) -> anyhow::Result<Measured> {
    fio_connections(target, job, job.iodepth, 1, offset, size, seconds, out)
}

/// [`fio`] as `connections` fio jobs of `iodepth` each, each over its own slice of the
/// region (on NBD, each its own connection); the figures are their sum.
#[allow(clippy::too_many_arguments)]
fn fio_connections(
    target: &Target,
    job: &Job,
    iodepth: u32,
    connections: u32,
    offset: u64,
    size: u64,
    seconds: Option<u64>,
    out: &Path,
) -> anyhow::Result<Measured> {
    let Job { rw, block, .. } = *job;
    let connections = connections.max(1);
    // Slices whole in MiB, so 1 MiB blocks fit each one.
    let slice = if connections == 1 { size } else { ((size / connections as u64) >> 20) << 20 };
    if slice == 0 {
        bail!("a region of {size} bytes is too small for {connections} connections");
    }
    let mut cmd = Command::new("fio");
    let on = match target {
        Target::Nbd(uri) => {
            cmd.arg("--ioengine=nbd").arg(format!("--uri={uri}"));
            uri.to_string()
        }
        Target::Direct(path) => {
            let on = path.display().to_string();
            // fallocate=none: the fill pass writes the file as an application would.
            cmd.args(["--ioengine=libaio", "--direct=1", "--fallocate=none"]).arg(format!("--filename={on}"));
            on
        }
    };
    cmd.args(["--name=bench", "--thread=0", "--norandommap", "--randrepeat=0"])
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={block}"))
        .arg(format!("--iodepth={iodepth}"))
        .arg(format!("--offset={offset}"))
        .arg(format!("--size={slice}"))
        .arg("--output-format=json")
        .arg(format!("--output={}", out.display()))
        .stdin(Stdio::null());
    if connections > 1 {
        // One summed entry for all the jobs in fio's JSON.
        cmd.arg(format!("--numjobs={connections}"))
            .arg(format!("--offset_increment={slice}"))
            .arg("--group_reporting=1");
    }
    if let Some(s) = seconds {
        cmd.args(["--time_based=1", "--ramp_time=0"]).arg(format!("--runtime={s}"));
    }
    let o = cmd.output().context("cannot run fio: is it installed (with its nbd engine)?")?;
    let json = std::fs::read_to_string(out).unwrap_or_default();
    if !o.status.success() {
        bail!(
            "fio {rw} bs={block} on {on} failed ({}):\n{}{}{json}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&json).with_context(|| format!("fio's JSON output: {json}"))?;
    let job = &v["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio {rw} bs={block} on {on} reported error {}", job["error"]);
    }
    let mut m = Measured { iops: 0.0, mbps: 0.0 };
    for dir in ["read", "write"] {
        m.iops += job[dir]["iops"].as_f64().unwrap_or(0.0);
        m.mbps += job[dir]["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6;
    }
    Ok(m)
}

/// The run with the median IOPS.
fn median(runs: Vec<Measured>) -> Measured {
    uraid_io::bench::median_by(runs, |m| m.iops).expect("at least one run")
}

/// The data offset of a member, from `uraid examine`.
fn data_offset_bytes(member: &Path) -> anyhow::Result<u64> {
    let text = run_uraid(&["examine", &member.display().to_string()])?;
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(" : ")?;
            (k.trim() == "Data Offset").then(|| v.split_whitespace().next()?.parse::<u64>().ok())?
        })
        .map(|sectors| sectors * 512)
        .with_context(|| format!("no Data Offset in:\n{text}"))
}

pub fn run(args: NbdArgs) -> anyhow::Result<()> {
    if args.seconds == 0 || args.runs == 0 {
        bail!("--seconds and --runs must be at least 1");
    }
    let size = args.size.div_ceil(1 << 20) << 20;
    if size < 16 << 20 {
        bail!("--size must be at least 16M");
    }
    let jobs: Vec<&Job> =
        JOBS.iter().filter(|j| args.jobs.is_empty() || args.jobs.iter().any(|n| n == j.name)).collect();
    for tool in ["fio", "nbdkit"] {
        if Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            bail!("`uraid bench nbd` needs {tool} (apt-get install fio nbdkit)");
        }
    }

    let dir = args.dir.join(format!("uraid-bench-nbd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let scratch = Scratch(dir.clone());
    let dir = scratch.0.as_path();
    // Member sizes with room for the superblock and md's data offset on top of `size`.
    let slack = 8u64 << 20;
    let pass = dir.join("pass0.img");
    let pass_size = format!("{}K", (size + slack) >> 10);
    let pass_s = pass.display().to_string();
    run_uraid(&[
        "create",
        "--level",
        "0",
        "--raid-devices",
        "1",
        "--size",
        &pass_size,
        "--name",
        "pass",
        &pass_s,
    ])?;
    let r6: Vec<PathBuf> = (0..6).map(|i| dir.join(format!("r6-{i}.img"))).collect();
    let r6_s: Vec<String> = r6.iter().map(|p| p.display().to_string()).collect();
    let r6_size = format!("{}K", (size / 4 + slack) >> 10);
    let mut create6: Vec<&str> = vec![
        "create",
        "--level",
        "6",
        "--raid-devices",
        "6",
        "--size",
        &r6_size,
        "--name",
        "r6",
        "--assume-clean",
    ];
    create6.extend(r6_s.iter().map(String::as_str));
    run_uraid(&create6)?;
    let pass_offset = data_offset_bytes(&pass)?;

    // Servers after the scratch directory: they stop (drop) before it is removed.
    let (mut pass_server, pass_uri) =
        serve_uraid("uraid serve (passthrough)", dir, "pass", std::slice::from_ref(&pass))?;
    let (mut r6_server, r6_uri) = serve_uraid("uraid serve (raid6)", dir, "r6", &r6)?;
    let kit_sock = dir.join("nbdkit.sock");
    let mut kit_cmd = Command::new("nbdkit");
    kit_cmd.args(["-f", "--exit-with-parent", "-U"]).arg(&kit_sock).arg("file").arg(&pass);
    let mut kit_server = Server::spawn("nbdkit", kit_cmd, dir.join("nbdkit.log"), &kit_sock)?;
    let kit_uri = format!("nbd+unix:///?socket={}", kit_sock.display());

    let out = dir.join("fio.json");
    let (pass_uri, r6_uri, kit_uri) = (Target::Nbd(&pass_uri), Target::Nbd(&r6_uri), Target::Nbd(&kit_uri));
    fio(&pass_uri, &FILL, 0, size, None, &out)?;
    fio(&r6_uri, &FILL, 0, size, None, &out)?;

    let mut rows = Vec::new();
    let mut multi_rows = Vec::new();
    for job in &jobs {
        let run = |uri: &Target, offset: u64| fio(uri, job, offset, size, Some(args.seconds), &out);
        // Per array (passthrough, raid6) and per-connection depth: the multi-connection runs.
        let multi = args.connections > 1 && MULTI_CONNECTION_JOBS.contains(&job.name);
        let depths =
            if multi { multi_connection_depths(job.iodepth, args.connections).to_vec() } else { vec![] };
        let run_multi = |uri: &Target, iodepth: u32| {
            fio_connections(uri, job, iodepth, args.connections, 0, size, Some(args.seconds), &out)
        };
        let (mut kits, mut passes, mut r6s) = (Vec::new(), Vec::new(), Vec::new());
        let mut multis: Vec<[Vec<Measured>; 2]> = depths.iter().map(|_| [Vec::new(), Vec::new()]).collect();
        for _ in 0..args.runs {
            kits.push(run(&kit_uri, pass_offset)?);
            passes.push(run(&pass_uri, 0)?);
            r6s.push(run(&r6_uri, 0)?);
            for (d, m) in depths.iter().zip(&mut multis) {
                m[0].push(run_multi(&pass_uri, *d)?);
                m[1].push(run_multi(&r6_uri, *d)?);
            }
            for s in [&mut pass_server, &mut r6_server, &mut kit_server] {
                s.alive()?;
            }
        }
        let (kit, pass_m, r6_m) = (median(kits), median(passes), median(r6s));
        let row = |array, peer, m: &Measured, p: &Measured, (connections, iodepth): (u32, u32), target| Row {
            job: job.name,
            array,
            peer,
            iops: m.iops,
            mbps: m.mbps,
            peer_iops: p.iops,
            peer_mbps: p.mbps,
            ratio: if p.iops > 0.0 { m.iops / p.iops } else { 0.0 },
            target,
            iodepth,
            seconds: args.seconds,
            runs: args.runs,
            connections,
            peer_connections: 1,
            peer_iodepth: job.iodepth,
        };
        for (array, peer, m, p) in
            [("passthrough", "nbdkit", &pass_m, &kit), ("raid6", "passthrough", &r6_m, &pass_m)]
        {
            rows.push(row(array, peer, m, p, (1, job.iodepth), target(job.name, array)));
        }
        for (d, [pass_runs, r6_runs]) in depths.iter().zip(multis) {
            let t = multi_connection_target(d * args.connections, job.iodepth);
            let c = (args.connections, *d);
            multi_rows.push(row("passthrough", "passthrough", &median(pass_runs), &pass_m, c, t));
            multi_rows.push(row("raid6", "raid6", &median(r6_runs), &r6_m, c, t));
        }
    }
    // After the one-connection rows, so readers that take the first row of a job and array
    // still find the one-connection figure.
    rows.extend(multi_rows);
    drop(kit_server);
    drop(r6_server);
    drop(pass_server);
    drop(scratch);

    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "fio --ioengine=nbd, median of {} runs of {} s per job and server, {} MiB region on tmpfs, \
         iodepth 32, Unix sockets",
        args.runs,
        args.seconds,
        size >> 20
    );
    println!("| job | array | IOPS | MB/s | peer | peer IOPS | peer MB/s | ratio | target |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows.iter().filter(|r| r.connections == 1) {
        let t = target_cell(r.ratio, r.target);
        println!(
            "| {} | {} | {:.0} | {:.1} | {} | {:.0} | {:.1} | {:.2} | {} |",
            r.job, r.array, r.iops, r.mbps, r.peer, r.peer_iops, r.peer_mbps, r.ratio, t
        );
    }
    let multi: Vec<&Row> = rows.iter().filter(|r| r.connections > 1).collect();
    if !multi.is_empty() {
        println!();
        println!(
            "{} connections (fio jobs, each its own connection and slice of the region) against one \
             connection at iodepth {} on the same server, in the same run:",
            args.connections, multi[0].peer_iodepth
        );
        println!(
            "| job | array | connections x iodepth | IOPS | MB/s | one connection IOPS | ratio | target |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in multi {
            let t = target_cell(r.ratio, r.target);
            println!(
                "| {} | {} | {} x {} | {:.0} | {:.1} | {:.0} | {:.2} | {} |",
                r.job, r.array, r.connections, r.iodepth, r.iops, r.mbps, r.peer_iops, r.ratio, t
            );
        }
    }
    Ok(())
}

/// A table's target cell: whether `ratio` reached the target, if the row has one.
pub(crate) fn target_cell(ratio: f64, target: Option<f64>) -> String {
    match target {
        Some(t) if ratio >= t => format!(">= {t:.1}x met"),
        Some(t) => format!(">= {t:.1}x MISSED"),
        None => String::new(),
    }
}
