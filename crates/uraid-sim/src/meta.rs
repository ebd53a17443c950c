//! md metadata on simulated members: `uraid create`'s superblocks and bitmap written into
//! the stores, and the array started (at first, and again after a power cycle) from what
//! the stores durably hold, through the same [`read_member`], [`plan_assembly`] and
//! [`Array::start`] as `uraid serve`. While it runs, the array's own superblock, bitmap and
//! log writes are member I/O like the data's, so a power loss can drop or tear them.

use uraid_core::array::{Array, ArrayOptions, StartMember, UpkeepPeriods};
use uraid_core::meta::{
    create_array, has_ppl, plan_assembly, ppl_recover, read_member, AssembleOptions, AssemblyPlan,
    CreateParams, MemberMetadata, Superblock, MAX_SECTOR,
};
use uraid_core::{Geometry, Level, Tunables};

use crate::disks::SimDisks;

/// Where md's 1.2 superblock sits on a member.
const SUPERBLOCK_BYTES: u64 = 4096;

/// Virtual seconds start here (superblock ctime/utime).
pub const EPOCH_SECONDS: u64 = 1_700_000_000;

/// md's clocks scaled down a thousandfold to the few virtual milliseconds a checker run
/// spans: the array is marked clean, its bitmap bits cleared and its recovery checkpointed
/// while the workload runs, so a power cut can fall between any of them.
pub const SIM_UPKEEP: UpkeepPeriods =
    UpkeepPeriods { safe_mode_ns: 1_000_000, bitmap_daemon_ns: 5_000_000, recovery_checkpoint_ns: 3_000_000 };

/// `uraid create --assume-clean` (with `--consistency-policy=ppl` when `ppl`) on the simulated members, written straight into the
/// stores and made durable.
/// `write_behind`: `--write-mostly` on slot `.0` and `--write-behind .1` (raid1 with a
/// bitmap).
#[allow(clippy::too_many_arguments)]
pub fn create_on_disks(
    disks: &mut SimDisks,
    geo: &Geometry,
    member_bytes: u64,
    data_offset_bytes: u64,
    bitmap_chunk_bytes: Option<u32>,
    ppl: bool,
    seed: u64,
    write_behind: Option<(usize, u32)>,
) -> Result<(), String> {
    let n = geo.raid_disks;
    let mut p = CreateParams::new(geo.level.md_level(), vec![Some(member_bytes / 512); n]);
    p.layout = Some(geo.layout);
    if geo.level != Level::Raid1 {
        p.chunk_kib = Some((geo.chunk_sectors / 2) as u32);
    }
    if geo.level != Level::Raid0 {
        // The geometry's: all of the member after the data offset, or less (room after).
        p.size_kib = Some(geo.member_sectors[0] / 2);
    }
    p.data_offset_sectors = Some(data_offset_bytes / 512);
    p.bitmap = bitmap_chunk_bytes.is_some();
    p.bitmap_chunk_bytes = bitmap_chunk_bytes;
    p.ppl = ppl;
    p.assume_clean = true;
    p.name = "sim".into();
    p.set_uuid = uuid(seed, 0xff);
    p.device_uuids = (0..n).map(|i| uuid(seed, i as u8)).collect();
    p.ctime_seconds = EPOCH_SECONDS;
    p.write_behind = write_behind.map_or(0, |(_, max)| max);
    let created = create_array(&p).map_err(|e| format!("create: {e}"))?;
    for (slot, sb) in created.superblocks.iter().enumerate() {
        let mut sb = sb.clone().ok_or("create left a slot empty")?;
        if write_behind.is_some_and(|(wm, _)| wm == slot) {
            sb.devflags |= uraid_core::meta::superblock::devflags::WRITE_MOSTLY;
            sb.update_csum();
        }
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
    // A blank disk (a hot spare's bay before its `uraid add`) is no member: nobody names it.
    let readable: Vec<usize> =
        (0..disks.member_count()).filter(|&m| !disks.is_failed(m) && !blank(disks, m)).collect();
    let offered: Vec<_> = readable.iter().map(|&m| member_metadata(disks, m).offered).collect();
    let plan = plan_assembly(&offered, &AssembleOptions { run: true, uuid: None, force: true })
        .map_err(|e| e.to_string())?;
    Ok((plan, readable))
}

/// The disk behind each slot (the engine's I/O member): a hot spare or a replacement that
/// took a slot is reached through its own disk, whose index is not the slot's.
pub fn slot_disks(array: &Array) -> Vec<usize> {
    let engine = array.engine();
    (0..engine.geometry().raid_disks).map(|slot| engine.io_member(slot)).collect()
}

/// Nothing was ever written where md's superblock goes.
fn blank(disks: &SimDisks, m: usize) -> bool {
    let mut b = vec![0u8; 4096];
    disks.store(m).peek(SUPERBLOCK_BYTES, &mut b);
    b.iter().all(|&x| x == 0)
}

/// md's ppl_recover before a dirty RAID5 with a partial parity log starts, as `uraid serve`
/// runs it: the logged stripes' parity rewritten and made durable, then the plan told
/// (no resync when every log was sound). Returns what it said, None when nothing was due.
pub fn replay_ppl(
    disks: &mut SimDisks,
    plan: &mut AssemblyPlan,
    offered: &[usize],
) -> Result<Option<String>, String> {
    let superblocks: Vec<Superblock> = offered
        .iter()
        .map(|&m| member_superblock(disks, m).ok_or_else(|| format!("member{m}: no superblock")))
        .collect::<Result<_, _>>()?;
    let fresh = superblocks.get(plan.freshest).ok_or("no freshest member")?;
    if !has_ppl(fresh) || plan.resync_offset == MAX_SECTOR {
        return Ok(None);
    }
    let rec = ppl_recover(plan, &superblocks, &mut |i, offset, len| {
        let mut b = vec![0u8; len];
        disks.store(offered[i]).peek(offset, &mut b);
        Ok(b)
    })
    .map_err(|e| format!("replaying the partial parity log: {e}"))?;
    for w in &rec.writes {
        let store = disks.store_mut(offered[w.member]);
        store.write(w.offset_bytes, &w.bytes).map_err(|e| format!("recovered parity: {e:?}"))?;
    }
    for w in &rec.writes {
        disks.store_mut(offered[w.member]).flush_all();
    }
    Ok(Some(plan.apply_ppl_recovery(&rec)))
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
