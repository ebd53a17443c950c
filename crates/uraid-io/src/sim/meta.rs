//! md metadata on simulated members: `uraid create`'s superblocks and bitmap written into
//! the stores, the running array's upkeep by the core's [`ArraySuperblocks`] with its
//! writes and flushes issued as member I/Os (so a power loss can drop or tear them), and
//! re-assembly after a power cycle from what the stores durably hold, by the same
//! [`plan_assembly`] `uraid serve` uses.

use uraid_core::array::{ArrayMember, ArraySuperblocks, DevRole, MetaIo, MetaRound, WriteIntent};
use uraid_core::meta::{
    create_array, plan_assembly, AssembleOptions, AssemblyPlan, CreateParams, OfferedMember, Superblock,
    SuperblockVersion, WriteIntentBitmap, SB_BYTES,
};
use uraid_core::{Engine, EngineEvent, Geometry, Level, MemberIoOp};

use super::array::SimArray;
use super::disks::SimDisks;

/// Virtual seconds start here (superblock ctime/utime).
const EPOCH_SECONDS: u64 = 1_700_000_000;
/// Bitmap area read back at assembly: header plus bits of any array the simulator builds.
const BITMAP_READ_BYTES: usize = 64 << 10;

/// The power was lost while metadata was being written, at this virtual time.
#[derive(Debug)]
pub struct PowerLost(pub u64);

/// The array's metadata, kept by the core state machine; member key = slot.
pub struct SimMeta {
    pub superblocks: ArraySuperblocks,
}

/// `uraid create --assume-clean` on the simulated members (`data_offset_bytes` must match
/// the engine's), written straight into the stores and made durable.
pub fn create_on_disks(
    disks: &mut SimDisks,
    geo: &Geometry,
    member_bytes: u64,
    data_offset_bytes: u64,
    bitmap_chunk_bytes: Option<u32>,
    seed: u64,
) -> Result<SimMeta, String> {
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
    let mut members = Vec::new();
    for (slot, sb) in created.superblocks.iter().enumerate() {
        let sb = sb.clone().ok_or("create left a slot empty")?;
        let store = disks.store_mut(slot);
        store.write(sb.super_offset * 512, &sb.serialize()).map_err(|e| format!("create: {e:?}"))?;
        if let (Some(b), Some(at)) = (&created.bitmap, sb.bitmap_sector()) {
            store.write(at * 512, &b.area).map_err(|e| format!("create: {e:?}"))?;
        }
        store.flush_all();
        members.push(ArrayMember { key: slot as u64, sb, role: DevRole::Active { slot, recovering: false } });
    }
    let events = members[0].sb.events;
    let bitmap = created.bitmap.map(|b| (WriteIntentBitmap::new(b.sb), b.offset_from_sb_sectors));
    Ok(SimMeta { superblocks: ArraySuperblocks::new(members, events, false, false, bitmap) })
}

fn uuid(seed: u64, tag: u8) -> [u8; 16] {
    let mut u = [tag; 16];
    u[..8].copy_from_slice(&seed.to_le_bytes());
    u
}

fn now_seconds(array: &SimArray<Engine>) -> u64 {
    EPOCH_SECONDS + array.now_ns() / 1_000_000_000
}

impl SimMeta {
    /// Performs `round` and the retries the core asks for, each write followed by a flush
    /// of its member; newly failed members are failed in the engine (md_error).
    pub fn perform(&mut self, array: &mut SimArray<Engine>, round: MetaRound) -> Result<(), PowerLost> {
        let mut next = Some(round);
        while let Some(round) = next.take() {
            let mut lost = None;
            let failed = round.execute(|io| {
                if lost.is_some() {
                    return false;
                }
                let member = io.key() as usize;
                let done = match io {
                    MetaIo::Write { offset_bytes, bytes, .. } => array
                        .member_io_wait(member, MemberIoOp::Write, *offset_bytes, bytes.clone())
                        .and_then(|ok| {
                            if ok {
                                array.member_io_wait(member, MemberIoOp::Flush, 0, Vec::new())
                            } else {
                                Ok(false)
                            }
                        }),
                    MetaIo::Flush { .. } => array.member_io_wait(member, MemberIoOp::Flush, 0, Vec::new()),
                };
                done.unwrap_or_else(|at| {
                    lost = Some(at);
                    false
                })
            });
            if let Some(at) = lost {
                return Err(PowerLost(at));
            }
            let out = self.superblocks.round_done(round, &failed, now_seconds(array));
            for slot in out.newly_failed_slots {
                array.fail_member(slot);
            }
            // No working member left: nothing more can be recorded; the engine has failed.
            next = out.next.unwrap_or(None);
        }
        Ok(())
    }

    /// Before a write is handed to the engine: dirty first, then the write-intent bits.
    pub fn before_write(
        &mut self,
        array: &mut SimArray<Engine>,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Option<(u64, u64)>, PowerLost> {
        if let Some(round) = self.superblocks.mark_dirty(now_seconds(array)) {
            self.perform(array, round)?;
        }
        let WriteIntent { sync_range, round } = self.superblocks.start_write(offset_bytes, len_bytes);
        if let Some(round) = round {
            self.perform(array, round)?;
        }
        Ok(sync_range)
    }

    /// The engine's events that change the superblocks; then held completions may go.
    pub fn service_events(&mut self, array: &mut SimArray<Engine>) -> Result<(), PowerLost> {
        while let Some(ev) = array.engine_mut().pop_event() {
            let now = now_seconds(array);
            let round = match ev {
                EngineEvent::MemberFaulty(slot) => Some(self.superblocks.member_failed(slot, now)),
                EngineEvent::RecoveryDone(slot) => Some(self.superblocks.recovery_done(slot, now)),
                EngineEvent::ArrayFailed => Some(self.superblocks.array_failed(now)),
                EngineEvent::ResyncDone => {
                    self.superblocks.resync_done();
                    None
                }
                _ => None,
            };
            if let Some(round) = round {
                self.perform(array, round)?;
            }
        }
        array.engine_mut().metadata_committed();
        Ok(())
    }

    /// md's bitmap daemon at a quiet moment: bits idle for two passes are cleared after a
    /// flush of every member.
    pub fn bitmap_daemon(&mut self, array: &mut SimArray<Engine>) -> Result<(), PowerLost> {
        match self.superblocks.bitmap_daemon() {
            Some(round) => self.perform(array, round),
            None => Ok(()),
        }
    }
}

/// What the members durably hold after a power cycle, offered to `plan_assembly` (a
/// failed member cannot be read and is not offered).
pub fn assemble_from_disks(disks: &SimDisks) -> Result<AssemblyPlan, String> {
    assemble_members(disks).map(|(plan, _)| plan)
}

/// As [`assemble_from_disks`], with the member behind each offered index (the plan's
/// `member` fields count the offered members only).
pub fn assemble_members(disks: &SimDisks) -> Result<(AssemblyPlan, Vec<usize>), String> {
    let readable: Vec<usize> = (0..disks.member_count()).filter(|&m| !disks.is_failed(m)).collect();
    let offered: Vec<OfferedMember> = readable
        .iter()
        .map(|&m| {
            let store = disks.store(m);
            let dev_sectors = store.size_bytes() / 512;
            let superblock =
                Superblock::parse_member(&read_superblock(disks, m), SuperblockVersion::V1_2, dev_sectors);
            let bitmap = superblock.as_ref().ok().and_then(|sb| sb.bitmap_sector()).map(|at| {
                let mut b = vec![0u8; BITMAP_READ_BYTES];
                store.peek(at * 512, &mut b);
                b
            });
            OfferedMember { name: format!("member{m}"), dev_sectors, superblock, bitmap }
        })
        .collect();
    let plan = plan_assembly(&offered, &AssembleOptions { run: true, uuid: None, force: true })
        .map_err(|e| e.to_string())?;
    Ok((plan, readable))
}

fn read_superblock(disks: &SimDisks, member: usize) -> Vec<u8> {
    let mut buf = vec![0u8; SB_BYTES];
    disks.store(member).peek(8 * 512, &mut buf);
    buf
}

/// The superblock `member` durably holds (read even from a member that does not answer:
/// what it would say if it came back).
pub fn member_superblock(disks: &SimDisks, member: usize) -> Option<Superblock> {
    let dev_sectors = disks.store(member).size_bytes() / 512;
    Superblock::parse_member(&read_superblock(disks, member), SuperblockVersion::V1_2, dev_sectors).ok()
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
