//! Real executor vs fio (io_uring engine, O_DIRECT) on the same file in the same run:
//! 4 KiB random read and write at QD32, 1 MiB sequential read and write at QD8, on tmpfs
//! (/dev/shm) and on the work disk. `cargo bench -p uraid-io --bench real_io [-- --secs N]
//! [--rounds N]`: each row runs fio and the executor in turn (the first to go alternating),
//! `--rounds` times (default 3), and shows the median of each, so a burst of other load on
//! the machine does not decide a row.

use std::path::PathBuf;
use std::time::Duration;

use uraid_io::bench::{fio, median_by, real_executor, IoRate, Pattern};
use uraid_io::real::BackendChoice;

/// The run with the median IOPS.
fn median(runs: Vec<IoRate>) -> Option<IoRate> {
    median_by(runs, |r| r.iops)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let d = Duration::from_secs_f64(secs);
    if std::process::Command::new("fio").arg("--version").output().is_err() {
        eprintln!("fio not found: install it (scripts/install-deps.sh); only uraid figures follow");
    }
    let target =
        std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from("target"));
    let file_bytes: u64 = 1 << 30;
    let places =
        [("tmpfs", PathBuf::from("/dev/shm/uraid-bench.img")), ("work disk", target.join("uraid-bench.img"))];
    for (place, path) in places {
        // fio lays the file out (writes it) first, so both read real blocks.
        if !path.exists() {
            let _ = fio(&path, file_bytes, Pattern::SeqWrite1m, 8, Duration::from_millis(200));
            if path.metadata().map(|m| m.len()).unwrap_or(0) < file_bytes {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .expect("bench file");
                f.set_len(file_bytes).expect("size bench file");
            }
        }
        for (pattern, qd) in [
            (Pattern::RandRead4k, 32),
            (Pattern::RandWrite4k, 32),
            (Pattern::SeqRead1m, 8),
            (Pattern::SeqWrite1m, 8),
        ] {
            let (mut peers, mut ours_runs) = (Vec::new(), Vec::new());
            let mut failed = None;
            for round in 0..rounds {
                let mut peer = || {
                    if let Ok(p) = fio(&path, file_bytes, pattern, qd, d) {
                        peers.push(p);
                    }
                };
                let mut ours =
                    || match real_executor(&path, file_bytes, pattern, qd, d, BackendChoice::IoUring) {
                        Ok(o) => ours_runs.push(o),
                        Err(e) => failed = Some(e),
                    };
                // Who goes first alternates: on the work disk the host's cache and the
                // file's fresh layout favour whichever reads first.
                if round % 2 == 0 {
                    peer();
                    ours();
                } else {
                    ours();
                    peer();
                }
            }
            let peer = median(peers);
            let ours = match (failed, median(ours_runs)) {
                (Some(e), _) => Err(e),
                (None, Some(o)) => Ok(o),
                (None, None) => Err(std::io::Error::other("no runs")),
            };
            let pool = real_executor(&path, file_bytes, pattern, qd, d / 2, BackendChoice::ThreadPool);
            match (ours, peer) {
                (Ok(o), Some(p)) => println!(
                    "{place:>9} {pattern:?} qd{qd}: uraid io_uring {:>9.0} IOPS {:>7.1} MB/s | fio {:>9.0} IOPS {:>7.1} MB/s | ratio {:.2}x | thread pool {:>9.0} IOPS",
                    o.iops, o.mb_per_s, p.iops, p.mb_per_s, o.iops / p.iops.max(1.0),
                    pool.map(|r| r.iops).unwrap_or(0.0)
                ),
                (Ok(o), None) => println!("{place:>9} {pattern:?} qd{qd}: uraid io_uring {:>9.0} IOPS {:>7.1} MB/s | fio n/a", o.iops, o.mb_per_s),
                (Err(e), _) => println!("{place:>9} {pattern:?} qd{qd}: uraid failed: {e}"),
            }
        }
        let _ = std::fs::remove_file(&path);
    }
}
