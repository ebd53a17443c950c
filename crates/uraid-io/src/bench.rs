//! The real executor's benchmarks as plain functions, so `cargo bench -p uraid-io` and
//! `uraid bench` share them. Each is short (seconds) and reports against fio, measured in
//! the same run.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use uraid_core::rng::Rng;
use uraid_core::{IoBytes, MemberIo, MemberIoOp};

use crate::real::{BackendChoice, Executor, ExecutorOptions, MemberSet, OpenOptions};

/// The run in the middle when ordered by `key` (the upper middle of an even count);
/// `None` for no runs. The benchmarks report this run rather than an average, so every
/// figure of a row comes from one real run.
pub fn median_by<T>(mut runs: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = runs.len() / 2;
    (mid < runs.len()).then(|| runs.swap_remove(mid))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    RandRead4k,
    RandWrite4k,
    SeqRead1m,
    SeqWrite1m,
}

impl Pattern {
    pub fn block_bytes(self) -> u64 {
        match self {
            Pattern::RandRead4k | Pattern::RandWrite4k => 4096,
            Pattern::SeqRead1m | Pattern::SeqWrite1m => 1 << 20,
        }
    }
    fn fio_rw(self) -> &'static str {
        match self {
            Pattern::RandRead4k => "randread",
            Pattern::RandWrite4k => "randwrite",
            Pattern::SeqRead1m => "read",
            Pattern::SeqWrite1m => "write",
        }
    }
    fn is_write(self) -> bool {
        matches!(self, Pattern::RandWrite4k | Pattern::SeqWrite1m)
    }
    fn is_random(self) -> bool {
        matches!(self, Pattern::RandRead4k | Pattern::RandWrite4k)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct IoRate {
    pub iops: f64,
    pub mb_per_s: f64,
}

/// The real executor on one file (which must exist with `file_bytes`), keeping `qd` I/Os in
/// flight for `duration`.
pub fn real_executor(
    path: &Path,
    file_bytes: u64,
    pattern: Pattern,
    qd: usize,
    duration: Duration,
    backend: BackendChoice,
) -> std::io::Result<IoRate> {
    // Completed reads are fresh 1 MiB vectors: keep them on the heap, as a server would.
    crate::real::keep_large_buffers_on_heap();
    let set = MemberSet::open(&[path], &OpenOptions { log: false, ..Default::default() })?;
    let mut ex = Executor::new(
        set,
        &ExecutorOptions { backend, queue_depth_per_member: qd, log: false, ..Default::default() },
    )?;
    let bs = pattern.block_bytes();
    let blocks = file_bytes / bs;
    let mut rng = Rng::new(3);
    let mut seq_block = 0u64;
    // One payload shared by every write, as fio reuses its buffers: copying 1 MiB per I/O
    // here would charge the workload generator's memcpy to the executor.
    let payload: IoBytes = vec![0x5Au8; bs as usize].into();
    let mut next = |id: u64, rng: &mut Rng| {
        let block = if pattern.is_random() {
            rng.below(blocks)
        } else {
            seq_block = (seq_block + 1) % blocks;
            seq_block
        };
        let (op, data) = if pattern.is_write() {
            (MemberIoOp::Write, payload.clone())
        } else {
            (MemberIoOp::Read, IoBytes::new())
        };
        MemberIo { id, member: 0, op, offset_bytes: block * bs, len_bytes: bs, data }
    };
    let mut id = 0u64;
    for _ in 0..qd {
        id += 1;
        ex.submit(next(id, &mut rng));
    }
    let mut done = 0u64;
    let mut out = Vec::new();
    let start = Instant::now();
    let end = start + duration;
    loop {
        out.clear();
        ex.wait(&mut out, Some(Duration::from_millis(100)));
        for c in &out {
            if c.result.is_err() {
                return Err(std::io::Error::other(format!("member I/O failed: {:?}", c.result)));
            }
        }
        done += out.len() as u64;
        if Instant::now() >= end {
            break;
        }
        for _ in 0..out.len() {
            id += 1;
            ex.submit(next(id, &mut rng));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Let the rest finish so the next run starts quiet (not counted).
    while ex.in_flight() > 0 {
        out.clear();
        ex.wait(&mut out, Some(Duration::from_millis(100)));
    }
    let iops = done as f64 / secs;
    Ok(IoRate { iops, mb_per_s: iops * bs as f64 / 1e6 })
}

/// fio with the io_uring engine, O_DIRECT, one job, on the same file. Creates (lays out)
/// the file if it does not exist.
pub fn fio(
    path: &Path,
    file_bytes: u64,
    pattern: Pattern,
    qd: usize,
    duration: Duration,
) -> std::io::Result<IoRate> {
    let out = Command::new("fio")
        .arg("--name=uraid-peer")
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--size={file_bytes}"))
        .arg("--ioengine=io_uring")
        .arg("--direct=1")
        .arg(format!("--rw={}", pattern.fio_rw()))
        .arg(format!("--bs={}", pattern.block_bytes()))
        .arg(format!("--iodepth={qd}"))
        .arg(format!("--runtime={}ms", duration.as_millis()))
        .arg("--time_based")
        .arg("--randrepeat=0")
        .arg("--output-format=terse")
        .arg("--terse-version=3")
        .output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!("fio failed: {}", String::from_utf8_lossy(&out.stderr))));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line =
        text.lines().find(|l| l.starts_with("3;")).ok_or_else(|| std::io::Error::other("no terse line"))?;
    let f: Vec<&str> = line.split(';').collect();
    // Terse v3: read bw KiB/s and IOPS at 6 and 7, write at 47 and 48.
    let (bw_i, iops_i) = if pattern.is_write() { (47, 48) } else { (6, 7) };
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Ok(IoRate { iops: num(iops_i), mb_per_s: num(bw_i) * 1024.0 / 1e6 })
}
