//! A rebuild under load on simulated disks (issue 26 item 1): a RAID6 of six members of a
//! disk profile rebuilds its last member while clients run random 4 KiB reads and writes
//! (half each, 32 in flight, each resubmitted when it completes: fio's randrw at iodepth
//! 32), under md's pacing and under the adaptive one (`sync_policy`), next to the clients
//! with no rebuild and the rebuild with no clients. On an HDD profile the rebuild's
//! sequential reads and the clients' random I/O compete for the heads (every client I/O
//! between two rebuild reads costs two seeks); on an SSD profile for the channels and the
//! link. Deterministic: virtual time, a seeded client; the CPU is free, so the figures
//! are the disks'. `uraid bench rebuild --under-load --sim PROFILE` prints them.

use uraid_core::geometry::algorithm;
use uraid_core::rng::Rng;
use uraid_core::*;

use crate::array::{RunOutcome, SimArray};
use crate::disks::{SimDisks, SimMemberConfig};

pub const MEMBERS: usize = 6;
pub const CHUNK_BYTES: u64 = 512 << 10;
pub const BLOCK_BYTES: u64 = 4096;
pub const QUEUE_DEPTH: usize = 32;
/// Virtual time before the measured window: the adaptive pacer starts with a probe at
/// the floor and doubles from there, which takes about a second.
pub const WARMUP_NS: u64 = 3_000_000_000;

/// The experiment's settings.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// A built-in disk profile (`hdd-7200-2014`, `ssd-sata`, ...).
    pub profile: String,
    /// Each member's size: the clients' requests spread over all of it.
    pub member_bytes: u64,
    /// Virtual time before the measured window: the adaptive pacer finds its rate.
    pub warmup_ns: u64,
    /// The measured window.
    pub measure_ns: u64,
    pub seed: u64,
}

/// What one phase measured in its window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phase {
    pub client_iops: f64,
    pub client_mean_us: f64,
    pub client_p99_us: f64,
    pub rebuild_mbps: f64,
}

/// The four phases, each on fresh disks.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// The clients with no rebuild.
    pub alone: Phase,
    /// The rebuild with no clients.
    pub idle: Phase,
    pub md: Phase,
    pub adaptive: Phase,
}

/// Runs the four phases.
pub fn run(spec: &LoadSpec) -> Result<LoadReport, String> {
    Ok(LoadReport {
        alone: phase(spec, None, true)?,
        idle: phase(spec, Some(SyncPolicy::Md), false)?,
        md: phase(spec, Some(SyncPolicy::Md), true)?,
        adaptive: phase(spec, Some(SyncPolicy::Adaptive), true)?,
    })
}

/// The RAID6, all in sync, or its last member rebuilt from its start under `policy` with
/// md's default bounds (what a user gets).
fn engine(member_bytes: u64, rebuild: Option<SyncPolicy>) -> Result<Engine, String> {
    let geo = Geometry::new(
        Level::Raid6,
        MEMBERS,
        algorithm::LEFT_SYMMETRIC,
        CHUNK_BYTES / 512,
        &[member_bytes / 512; MEMBERS],
    )?;
    let mut members = vec![MemberConfig { data_offset_bytes: 0, state: MemberState::InSync }; MEMBERS];
    if rebuild.is_some() {
        members[MEMBERS - 1].state = MemberState::Recovering { recovery_offset_sectors: 0 };
    }
    let tunables = Tunables { sync_policy: rebuild.unwrap_or_default(), ..Tunables::default() };
    Engine::new(ArrayConfig { geometry: geo, members, tunables, read_only: false }).map_err(|e| e.to_string())
}

fn rebuilt_sectors(array: &SimArray<Engine>) -> Option<u64> {
    array.engine().sync_status().map(|s| s.done_sectors)
}

/// One phase on fresh disks: the rebuild (when `rebuild`), the clients (when `clients`).
pub fn phase(spec: &LoadSpec, rebuild: Option<SyncPolicy>, clients: bool) -> Result<Phase, String> {
    let engine = engine(spec.member_bytes, rebuild)?;
    let array_bytes = engine.size_bytes();
    let configs = (0..MEMBERS)
        .map(|_| SimMemberConfig::builtin(&spec.profile, spec.member_bytes))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let disks = SimDisks::new(configs, spec.seed).map_err(|e| e.to_string())?;
    let mut array = SimArray::new(engine, disks);
    // Member disks sit behind a block-layer queue that merges what the engine sends at once.
    array.set_member_merging(true);
    let start_ns = spec.warmup_ns;
    let end_ns = spec.warmup_ns + spec.measure_ns;
    let mut rng = Rng::new(spec.seed ^ 0x5eed);
    let blocks = array_bytes / BLOCK_BYTES;
    let mut next_id: RequestId = 1;
    let mut submit = |array: &mut SimArray<Engine>| {
        let id = next_id;
        next_id += 1;
        let offset = rng.below(blocks) * BLOCK_BYTES;
        let req = if rng.below(2) == 0 {
            Request::read(id, offset, BLOCK_BYTES)
        } else {
            Request::write(id, offset, vec![id as u8; BLOCK_BYTES as usize])
        };
        array.submit(req);
    };
    if clients {
        for _ in 0..QUEUE_DEPTH {
            submit(&mut array);
        }
    }
    let mut at_start: Option<Option<u64>> = None;
    let mut lat_ns: Vec<u64> = Vec::new();
    while array.now_ns() < end_ns {
        if at_start.is_none() && array.now_ns() >= start_ns {
            at_start = Some(rebuilt_sectors(&array));
        }
        let limit = if at_start.is_none() { start_ns } else { end_ns };
        let outcome = array.run_until_completion(limit);
        for tc in array.take_completions() {
            if let Err(e) = tc.completion.result {
                return Err(format!("client request {} failed: {e}", tc.completion.id));
            }
            if tc.completed_ns >= start_ns && tc.completed_ns < end_ns {
                lat_ns.push(tc.completed_ns - tc.submitted_ns);
            }
            submit(&mut array);
        }
        match outcome {
            RunOutcome::TimeReached => {}
            RunOutcome::Idle if array.now_ns() < limit => {
                // No clients and the rebuild done: the clock moves on.
                let mut none = Vec::new();
                array.disks_mut().advance_to(limit, &mut none);
            }
            RunOutcome::Idle => {}
            other => return Err(format!("the phase ended {other:?}")),
        }
    }
    let before = at_start.flatten();
    let after = rebuilt_sectors(&array);
    if rebuild.is_some() && (before.is_none() || after.is_none()) {
        return Err("the rebuild finished within the phase: give larger members or a shorter phase".into());
    }
    let rebuilt = after.unwrap_or(0).saturating_sub(before.unwrap_or(0));
    let secs = spec.measure_ns as f64 / 1e9;
    lat_ns.sort_unstable();
    let mean = if lat_ns.is_empty() { 0.0 } else { lat_ns.iter().sum::<u64>() as f64 / lat_ns.len() as f64 };
    Ok(Phase {
        client_iops: lat_ns.len() as f64 / secs,
        client_mean_us: mean / 1e3,
        client_p99_us: lat_ns.get(lat_ns.len() * 99 / 100).copied().unwrap_or(0) as f64 / 1e3,
        rebuild_mbps: rebuilt as f64 * 512.0 / secs / 1e6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On an HDD profile md's rule holds the rebuild at its floor under load while the
    /// adaptive pacer gives it many times that and keeps most of the clients' IOPS.
    #[test]
    fn on_hdds_the_adaptive_rebuild_outruns_mds_floor_and_keeps_the_clients() {
        let spec = LoadSpec {
            profile: "hdd-7200-2014".into(),
            member_bytes: 256 << 30,
            warmup_ns: WARMUP_NS,
            measure_ns: 2_000_000_000,
            seed: 1,
        };
        let r = run(&spec).unwrap();
        assert!(r.idle.rebuild_mbps > 100.0, "{r:?}");
        assert!(r.md.rebuild_mbps < 0.02 * r.idle.rebuild_mbps, "{r:?}");
        assert!(r.adaptive.rebuild_mbps > 10.0 * r.md.rebuild_mbps, "{r:?}");
        assert!(r.adaptive.client_iops > 0.6 * r.alone.client_iops, "{r:?}");
        // Deterministic: the same spec gives the same figures.
        assert_eq!(phase(&spec, Some(SyncPolicy::Adaptive), true).unwrap(), r.adaptive);
    }
}
