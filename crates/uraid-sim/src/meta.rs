//! md metadata on simulated members: `uraid create`'s superblocks and bitmap written into
//! the stores, and the array started (at first, and again after a power cycle) from what
//! the stores durably hold, through the same [`read_member`], [`plan_assembly`] and
//! [`Array::start`] as `uraid serve`. While it runs, the array's own superblock, bitmap and
//! log writes are member I/O like the data's, so a power loss can drop or tear them.

use uraid_core::array::{Array, ArrayOptions, StartMember, UpkeepPeriods};
use uraid_core::meta::{
    create_array, plan_assembly, read_member, AssembleOptions, AssemblyPlan, CreateParams, MemberMetadata,
    Superblock,
};
use uraid_core::{Geometry, Level, Tunables};

use crate::disks::SimDisks;

/// Virtual seconds start here (superblock ctime/utime).
pub const EPOCH_SECONDS: u64 = 1_700_000_000;

/// md's clocks scaled down a thousandfold to the few virtual milliseconds a checker run
/// spans: the array is marked clean, its bitmap bits cleared and its recovery checkpointed
/// while the workload runs, so a power cut can fall between any of them.
pub const SIM_UPKEEP: UpkeepPeriods =
    UpkeepPeriods { safe_mode_ns: 1_000_000, bitmap_daemon_ns: 5_000_000, recovery_checkpoint_ns: 3_000_000 };

/// `uraid create --assume-clean` on the simulated members, written straight into the
/// stores and made durable.
pub fn create_on_disks(
    disks: &mut SimDisks,
    geo: &Geometry,
    member_bytes: u64,
    data_offset_bytes: u64,
    bitmap_chunk_bytes: Option<u32>,
    seed: u64,
) -> Result<(), String> {
    let n = geo.raid_disks;
    let mut p = CreateParams::new(geo.level.md_level(), vec![Some(member_bytes / 512); n]);
    p.layout = Some(geo.layout);
    if geo.level != Level::Raid1 {
        p.chunk_kib = Some((geo.chunk_sectors / 2) as u32);
    }
    if geo.level != Level::Raid0 {
        p.size_kib = Some((member_bytes - data_offset_bytes) / 1024);
    }
    p.data_offset_sectors = Some(data_offset_bytes / 512);
    p.bitmap = bitmap_chunk_bytes.is_some();
    p.bitmap_chunk_bytes = bitmap_chunk_bytes;
    p.assume_clean = true;
    p.name = "sim".into();
    p.set_uuid = uuid(seed, 0xff);
    p.device_uuids = (0..n).map(|i| uuid(seed, i as u8)).collect();
    p.ctime_seconds = EPOCH_SECONDS;
    let created = create_array(&p).map_err(|e| format!("create: {e}"))?;
    for (slot, sb) in created.superblocks.iter().enumerate() {
        let sb = sb.clone().ok_or("create left a slot empty")?;
        let store = disks.store_mut(slot);
        store.write(sb.super_offset * 512, &sb.serialize()).map_err(|e| format!("create: {e:?}"))?;
        if let (Some(b), Some(at)) = (&created.bitmap, sb.bitmap_sector()) {
            store.write(at * 512, &b.area).map_err(|e| format!("create: {e:?}"))?;
        }
        store.flush_all();
    }
    Ok(())
}

fn uuid(seed: u64, tag: u8) -> [u8; 16] {
    let mut u = [tag; 16];
    u[..8].copy_from_slice(&seed.to_le_bytes());
    u
}

/// What member `m` durably holds, as assembly reads it (even from a member that does
/// not answer: what it would say if it came back).
pub fn member_metadata(disks: &SimDisks, m: usize) -> MemberMetadata {
    let store = disks.store(m);
    read_member(&format!("member{m}"), store.size_bytes() / 512, &mut |offset, len| {
        let end = (offset + len as u64).min(store.size_bytes());
        let mut b = vec![0u8; end.saturating_sub(offset) as usize];
        store.peek(offset, &mut b);
        b
    })
}

/// The readable members offered to `plan_assembly` (a failed member cannot be read), with
/// the member behind each offered index.
pub fn assemble_members(disks: &SimDisks) -> Result<(AssemblyPlan, Vec<usize>), String> {
    let readable: Vec<usize> = (0..disks.member_count()).filter(|&m| !disks.is_failed(m)).collect();
    let offered: Vec<_> = readable.iter().map(|&m| member_metadata(disks, m).offered).collect();
    let plan = plan_assembly(&offered, &AssembleOptions { run: true, uuid: None, force: true })
        .map_err(|e| e.to_string())?;
    Ok((plan, readable))
}

/// What the members durably hold after a power cycle, planned as `uraid serve` plans it.
pub fn assemble_from_disks(disks: &SimDisks) -> Result<AssemblyPlan, String> {
    assemble_members(disks).map(|(plan, _)| plan)
}

/// Starts the array `plan` describes on the simulated members (`offered[i]` is the member
/// behind the plan's offered index `i`; each member's I/O goes to its index).
pub fn start_array(
    disks: &SimDisks,
    plan: &AssemblyPlan,
    offered: &[usize],
    tunables: Tunables,
) -> Result<Array, String> {
    let members = offered
        .iter()
        .map(|&m| StartMember::from_metadata(m as u64, member_metadata(disks, m)))
        .collect::<Result<Vec<_>, String>>()?;
    let opts = ArrayOptions {
        tunables,
        read_only: false,
        now_ns: disks.now_ns(),
        epoch_seconds: EPOCH_SECONDS,
        periods: SIM_UPKEEP,
    };
    Array::start(plan, members, opts)
}

/// The superblock `member` durably holds (read even from a member that does not answer:
/// what it would say if it came back).
pub fn member_superblock(disks: &SimDisks, member: usize) -> Option<Superblock> {
    member_metadata(disks, member).offered.superblock.ok()
}

/// Do the freshest superblocks of the other readable members record `member` as gone from
/// its slot (md_error made durable)? Only then must assembly refuse it as stale.
pub fn failure_recorded(disks: &SimDisks, member: usize) -> bool {
    let Some(own) = member_superblock(disks, member) else { return true };
    let freshest = (0..disks.member_count())
        .filter(|&m| m != member && !disks.is_failed(m))
        .filter_map(|m| member_superblock(disks, m))
        .max_by_key(|sb| sb.events);
    freshest.is_some_and(|f| f.dev_roles.get(own.dev_number as usize).copied() != Some(own.role()))
}
