//! `uraid bench rebuild`: how fast a RAID6 of tmpfs files rebuilds one member, next to the
//! limit a rebuild cannot beat: reading the five survivors sequentially, measured in the
//! same run on the same files.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use uraid_core::geometry::algorithm;
use uraid_core::*;
use uraid_io::real::{Executor, ExecutorOptions, MemberSet, OpenOptions};
use uraid_io::runtime::{ArrayRuntime, RuntimeOptions};

use crate::size_arg::parse_size_bytes;

#[derive(Args)]
pub struct RebuildArgs {
    /// Where the member files go (tmpfs by default).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Size of each of the six members.
    #[arg(long = "member-size", default_value = "1G")]
    member_size: String,
    #[arg(long)]
    json: bool,
}

const MEMBERS: usize = 6;
const CHUNK_BYTES: u64 = 512 << 10;

struct TempMembers(Vec<PathBuf>);
impl Drop for TempMembers {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn fill(path: &Path, bytes: u64, seed: u8) -> anyhow::Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut block = vec![0u8; 1 << 20];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    let mut w = std::io::BufWriter::new(f);
    for _ in 0..bytes >> 20 {
        w.write_all(&block).context("filling a member")?;
    }
    w.flush()?;
    Ok(())
}

/// Read every file sequentially, all at once (a thread each), 1 MiB at a time.
fn read_all_sequentially(paths: &[PathBuf]) -> anyhow::Result<f64> {
    let t = Instant::now();
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
    Ok(t.elapsed().as_secs_f64())
}

pub fn run(args: RebuildArgs) -> anyhow::Result<()> {
    let member_bytes = parse_size_bytes(&args.member_size).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(member_bytes >= 64 << 20, "--member-size must be at least 64M");
    let member_bytes = member_bytes / CHUNK_BYTES * CHUNK_BYTES;
    let tmp = TempMembers(
        (0..MEMBERS)
            .map(|m| args.dir.join(format!("uraid-bench-rebuild-{}-{m}.img", std::process::id())))
            .collect(),
    );
    eprintln!("writing {MEMBERS} members of {} MiB under {} ...", member_bytes >> 20, args.dir.display());
    for (m, p) in tmp.0.iter().enumerate() {
        fill(p, member_bytes, m as u8)?;
    }
    // Make the parity consistent is not needed for speed: the rebuild reads and writes the
    // same bytes whatever they hold. Slot 5 is the one rebuilt.
    let survivors: Vec<PathBuf> = tmp.0[..MEMBERS - 1].to_vec();
    let peer_s = read_all_sequentially(&survivors)?;

    let geo = Geometry::new(
        Level::Raid6,
        MEMBERS,
        algorithm::LEFT_SYMMETRIC,
        CHUNK_BYTES / 512,
        &[member_bytes / 512; MEMBERS],
    )
    .map_err(anyhow::Error::msg)?;
    let mut members = vec![MemberConfig { data_offset_bytes: 0, state: MemberState::InSync }; MEMBERS];
    members[MEMBERS - 1].state = MemberState::Recovering { recovery_offset_sectors: 0 };
    let tunables = Tunables {
        sync_speed_min_kib: u64::MAX / 4096,
        sync_speed_max_kib: u64::MAX / 4096,
        ..Tunables::default()
    };
    let t = Instant::now();
    let engine = Engine::new(ArrayConfig { geometry: geo, members, tunables, read_only: false })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let set = MemberSet::open(&tmp.0, &OpenOptions::default()).context("opening members")?;
    let executor = Executor::new(set, &ExecutorOptions::default()).context("executor")?;
    let rt = ArrayRuntime::start(engine, executor, &RuntimeOptions::default()).context("runtime")?;
    let handle = rt.handle();
    loop {
        let active = handle
            .control(|e, _, _| e.downcast_mut::<Engine>().map(|e| e.sync_active()).unwrap_or(false))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if !active {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let rebuild_s = t.elapsed().as_secs_f64();
    let states = handle
        .control(|e, _, _| e.downcast_mut::<Engine>().map(|e| e.member_states()))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    rt.shutdown().map_err(|e| anyhow::anyhow!("{e}"))?;
    anyhow::ensure!(
        states.is_some_and(|s| s[MEMBERS - 1] == MemberState::InSync),
        "the rebuild did not finish with the member in sync"
    );
    let mbps = member_bytes as f64 / rebuild_s / 1e6;
    let peer_mbps = member_bytes as f64 / peer_s / 1e6;
    let ratio = peer_s / rebuild_s;
    if args.json {
        let v = serde_json::json!([{
            "bench": "rebuild", "level": 6, "raid_devices": MEMBERS, "member_bytes": member_bytes,
            "seconds": rebuild_s, "mbps_per_member": mbps,
            "peer": "read five survivors sequentially", "peer_seconds": peer_s, "peer_mbps_per_member": peer_mbps,
            "ratio": ratio,
        }]);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "RAID6, {MEMBERS} members of {} MiB on {}, chunk {} KiB",
            member_bytes >> 20,
            args.dir.display(),
            CHUNK_BYTES >> 10
        );
        println!("{:<44} {:>9} {:>14}", "", "seconds", "MB/s per member");
        println!("{:<44} {:>9.2} {:>14.0}", "rebuild one member (reads 5, writes 1)", rebuild_s, mbps);
        println!("{:<44} {:>9.2} {:>14.0}", "peer: read the 5 survivors sequentially", peer_s, peer_mbps);
        println!("ratio (peer time / rebuild time): {ratio:.2}");
    }
    Ok(())
}
