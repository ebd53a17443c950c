//! `uraid grow` without `--control`: a raid4/5/6 grow by members, raid5 to raid6 with one
//! new member (`--level 6 --add NEW`) or a chunk or layout change (`--chunk`, `--layout`) on
//! a stopped array's members, and `--continue` of a reshape md or uraid left mid-way (a
//! served array runs its own, see `uraid_core::array::reshape_ops`). It runs here, offline,
//! with the members claimed as `uraid serve` claims them: window after window, each made
//! durable before `reshape_position` moves on in every superblock, so a kill at any
//! point is finished by `uraid grow --continue` or by md.

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use uraid_core::array::{grow_plan as plan, GrowCurrent, GrowPlan, GrowRequest};
use uraid_core::geometry::Level;
use uraid_core::meta::superblock::MAX_SECTOR;
use uraid_core::meta::{plan_assembly, AssembleOptions, AssemblyPlan, Superblock};
use uraid_core::reshape::run::{continue_reshape, ReshapeMembers, ReshapeProgress, ReshapeRun};
use uraid_core::reshape::start::{start_grow_with_spares, start_restripe, GrowMember, Restripe};

use crate::array::assembly::{assemble, Assembled};
use crate::array::member::{open_members, DevIo, MemberDev};
use crate::array::{now_seconds, random_uuid, IoContext};

/// The largest window moved between two checkpoints (md moves a few MiB at a time too).
const WINDOW_MAX_SECTORS: u64 = 16 << 11;

/// What the offline grow was asked for, beyond mdadm's options.
pub struct Offline {
    pub members: Vec<PathBuf>,
    pub continue_only: bool,
    /// Hidden, for tests: exit after this many windows as a kill -9 would leave it.
    pub stop_after_windows: Option<usize>,
    /// Hidden, for tests: a pause before every member write, so a kill -9 lands inside
    /// a window or a superblock round.
    pub io_delay: std::time::Duration,
}

/// The member devices as `continue_reshape` reaches them, by slot then spare. Block
/// devices go through a second, O_DIRECT descriptor (their page cache would otherwise
/// hold the data md or the next `serve` must see); flush is fdatasync.
struct Devices {
    devs: Vec<MemberDev>,
    direct: Vec<Option<std::fs::File>>,
    delay: std::time::Duration,
}

/// O_DIRECT wants offsets, lengths and memory aligned to the logical block size.
const DIRECT_ALIGN: usize = 4096;

impl Devices {
    fn new(devs: Vec<MemberDev>, delay: std::time::Duration) -> anyhow::Result<Devices> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let mut direct = Vec::new();
        for d in &devs {
            let is_block = matches!(&d.io, DevIo::File(f) if f.metadata().is_ok_and(|m| m.file_type().is_block_device()));
            direct.push(if is_block {
                // Not O_EXCL: the claimed descriptor in `devs` already holds the device.
                Some(
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .custom_flags(libc::O_DIRECT)
                        .open(&d.path)
                        .io_context(|| format!("{}: cannot open O_DIRECT", d.name))?,
                )
            } else {
                None
            });
        }
        Ok(Devices { devs, direct, delay })
    }

    fn direct(&self, member: usize, offset: u64, len: usize) -> Option<&std::fs::File> {
        let aligned = offset.is_multiple_of(DIRECT_ALIGN as u64) && len.is_multiple_of(DIRECT_ALIGN);
        self.direct[member].as_ref().filter(|_| aligned)
    }
}

impl ReshapeMembers for Devices {
    fn read(&mut self, member: usize, device_sector: u64, len_sectors: u64) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let (offset, len) = (device_sector * 512, (len_sectors * 512) as usize);
        if let Some(f) = self.direct(member, offset, len) {
            let mut buf = uraid_io::real::AlignedBuf::new(len, DIRECT_ALIGN);
            f.read_exact_at(&mut buf.as_mut_slice()[..len], offset)?;
            return Ok(buf.as_slice()[..len].to_vec());
        }
        let got = self.devs[member].read_at(offset, len)?;
        if got.len() != len {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read past the member's end"));
        }
        Ok(got)
    }
    fn write(&mut self, member: usize, device_sector: u64, data: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        std::thread::sleep(self.delay);
        let offset = device_sector * 512;
        if let Some(f) = self.direct(member, offset, data.len()) {
            let mut buf = uraid_io::real::AlignedBuf::new(data.len(), DIRECT_ALIGN);
            buf.as_mut_slice()[..data.len()].copy_from_slice(data);
            return f.write_all_at(&buf.as_slice()[..data.len()], offset);
        }
        self.devs[member].write_at(offset, data)
    }
    fn flush(&mut self, member: usize) -> std::io::Result<()> {
        self.devs[member].sync()
    }
}

/// Refuses a member set some process serves: `open_members` claims each one (flock or
/// O_EXCL), as a running `uraid serve` holds them.
fn claimed(paths: &[PathBuf]) -> anyhow::Result<Assembled> {
    let a = assemble(paths, false, false, true).map_err(|e| {
        anyhow!(
            "{e}\n(a grow needs every member of the whole, in-sync array; after an interrupted grow, give \
             `uraid grow --continue` every member, the added ones too; nothing was written)"
        )
    })?;
    // A slot the reshape itself rebuilds (raid5 to raid6's Q) is not a lost member:
    // assembly took the reshape on only if every other slot is in sync.
    let rebuilt_by_reshape =
        a.plan.reshape.is_some() && a.plan.degraded_slots.iter().all(|&s| a.plan.slots[s as usize].is_some());
    if !a.plan.degraded_slots.is_empty() && !rebuilt_by_reshape {
        bail!(
            "the array is degraded (slots {:?} missing): rebuild it before a grow (nothing was written)",
            a.plan.degraded_slots
        );
    }
    Ok(a)
}

pub fn run(req: &GrowRequest, adds: &[PathBuf], off: &Offline) -> anyhow::Result<()> {
    if off.members.is_empty() {
        bail!("name the members of the stopped array (or give --control for a running one)");
    }
    if off.continue_only {
        if !adds.is_empty() || *req != GrowRequest::default() {
            bail!("--continue takes only the members: the reshape's shape is in their superblocks");
        }
        let a = claimed(&off.members)?;
        if a.plan.reshape.is_none() {
            bail!("no reshape is in progress on these members: nothing to continue (nothing was written)");
        }
        return finish(a.members, a.superblocks, a.plan, off);
    }
    let a = claimed(&off.members)?;
    // A stale member would keep its old superblock through the reshape and later be taken
    // for a member of the old layout: it is re-added (and rebuilt) first.
    if let Some(st) = a.plan.stale.first() {
        bail!(
            "{} is behind the array (events {}): serve the array and let it be re-added first, or leave \
             it out if the array is whole without it (nothing was written)",
            a.members[st.member].name,
            st.events
        );
    }
    if a.plan.reshape.is_some() {
        bail!("a reshape is already in progress: `uraid grow --continue` the members to finish it (nothing was written)");
    }
    // Compared before claiming: this process's own claim on a member would answer "in use".
    for n in &open_members(adds, false)? {
        if let Some(m) = a.members.iter().find(|m| m.identity == n.identity) {
            bail!(
                "{} and {} are the same device: --add takes a new device, not a member (nothing was written)",
                n.name,
                m.name
            );
        }
    }
    let new_devs = open_members(adds, true)?;
    for n in &new_devs {
        if let Ok(sb) = n.superblock() {
            bail!(
                "{} holds an md superblock of array {}: erase it first with `uraid zero-superblock` if its data \
                 is no longer wanted (nothing was written)",
                n.name,
                uraid_core::meta::superblock::format_uuid(&sb.set_uuid)
            );
        }
    }
    let slot_sbs: Vec<Superblock> =
        a.plan.slots.iter().map(|s| a.superblocks[s.as_ref().expect("whole array").member].clone()).collect();
    let spare_sbs: Vec<Superblock> = a.plan.spares.iter().map(|&i| a.superblocks[i].clone()).collect();
    let fresh = &slot_sbs[0];
    let level = Level::from_md_level(fresh.level).ok_or_else(|| anyhow!("unknown level {}", fresh.level))?;
    let room =
        a.members.iter().zip(&a.superblocks).map(|(m, sb)| m.dev_sectors().saturating_sub(sb.data_offset));
    let cur = GrowCurrent {
        level,
        raid_disks: slot_sbs.len(),
        layout: fresh.layout,
        chunk_sectors: u64::from(fresh.chunksize),
        component_sectors: fresh.size,
        room_sectors: room.min().unwrap_or(0),
        // Offline, only --add devices take the new slots: spares stay spares.
        spares: new_devs.len(),
        slot_held: vec![true; slot_sbs.len()],
        degraded_slots: 0,
        failed: false,
        read_only: false,
        busy: (a.plan.resync_offset != MAX_SECTOR).then(|| "resync".to_string()),
    };
    let req = GrowRequest { adding: new_devs.len(), ..req.clone() };
    let target = match plan(&cur, &req).map_err(|e| anyhow!("{e} (nothing was written)"))? {
        GrowPlan::Reshape(t) => t,
        GrowPlan::Unchanged(why) => bail!("{why} (nothing was written)"),
        _ => bail!(
            "only a raid4/5/6 grow by members runs offline: serve the array and use `uraid grow --control` \
             (nothing was written)"
        ),
    };
    let grows = level.has_parity()
        && target.level == level
        && target.chunk_sectors == cur.chunk_sectors
        && target.layout == cur.layout
        && target.raid_disks > cur.raid_disks;
    let to_raid6 = level == Level::Raid5
        && target.level == Level::Raid6
        && target.chunk_sectors == cur.chunk_sectors
        && target.layout == cur.layout
        && target.raid_disks == cur.raid_disks + 1;
    let restripes = level.has_parity() && target.level == level && target.raid_disks == cur.raid_disks;
    let rechunks = restripes && target.layout == cur.layout && target.chunk_sectors != cur.chunk_sectors;
    let relayouts = restripes && target.layout != cur.layout && target.chunk_sectors == cur.chunk_sectors;
    let both = restripes && target.layout != cur.layout && target.chunk_sectors != cur.chunk_sectors;
    if !(grows || to_raid6 || rechunks || relayouts || both) {
        bail!(
            "uraid reshapes offline a raid4/5/6 grow by members, raid5 to raid6 with one new member \
             (`--level 6 --add NEW`), and a raid4/5/6 chunk and/or layout change; a raid0 grow and the \
             takeovers run on a served array (`uraid grow --control`); use mdadm --grow under Linux md \
             for the rest (nothing was written)"
        );
    }
    if target.raid_disks != cur.raid_disks + new_devs.len() {
        bail!(
            "growing to {} members takes {} new devices with --add, {} given (spares are not taken offline; \
             nothing was written)",
            target.raid_disks,
            target.raid_disks - cur.raid_disks,
            new_devs.len()
        );
    }
    let bitmap = bitmap_area(&a, &slot_sbs)?;
    let bitmap_sectors = bitmap.as_ref().map(|(_, sectors)| *sectors);
    let new_members: Vec<GrowMember> = new_devs
        .iter()
        .map(|d| {
            Ok(GrowMember { dev_sectors: d.dev_sectors(), device_uuid: random_uuid()?, dev_number: None })
        })
        .collect::<anyhow::Result<_>>()?;
    let (all, spares, _) = if grows {
        start_grow_with_spares(&slot_sbs, &spare_sbs, &new_members, now_seconds(), bitmap_sectors)
    } else {
        let change = match new_members.first() {
            Some(&member) => Restripe::Raid6 { member },
            None if both => {
                Restripe::ChunkAndLayout { chunk_sectors: target.chunk_sectors, layout: target.layout }
            }
            None if relayouts => Restripe::Layout { layout: target.layout },
            None => Restripe::Chunk { chunk_sectors: target.chunk_sectors },
        };
        start_restripe(&slot_sbs, &spare_sbs, change, now_seconds(), bitmap_sectors)
    }
    .map_err(|e| anyhow!("{e}"))?;

    // New members first (start_grow's order): a cut before the old members' round leaves
    // the array as it was, the new devices holding superblocks one event ahead.
    let old = cur.raid_disks;
    for (d, sb) in new_devs.iter().zip(&all[old..]) {
        // The bitmap first, as `uraid add` writes it: a new member's copy is the array's.
        if let (Some((area, _)), Some(at)) = (&bitmap, sb.bitmap_sector()) {
            d.write_at(at * 512, area).io_context(|| format!("{}: writing its bitmap", d.name))?;
        }
        d.write_at(sb.super_offset * 512, &sb.clone().update_csum())
            .and_then(|_| d.sync())
            .io_context(|| format!("{}: writing its superblock", d.name))?;
    }
    let slot_members = a.plan.slots.iter().map(|s| s.as_ref().expect("whole array").member);
    let order: Vec<usize> = slot_members.chain(a.plan.spares.iter().copied()).collect();
    for (&i, sb) in order.iter().zip(all[..old].iter().chain(&spares)) {
        let d = &a.members[i];
        d.write_at(sb.super_offset * 512, &sb.clone().update_csum())
            .and_then(|_| d.sync())
            .io_context(|| format!("{}: writing its superblock", d.name))?;
    }
    println!(
        "uraid: reshape of raid{} to {} started (reshape_position 0 in every superblock)",
        level.md_level(),
        shape(target.level, target.raid_disks, target.layout, target.chunk_sectors)
    );
    // Planned again from what is now on disk, the claims kept (a second claim of the
    // same device by this process would be refused, and releasing it lets a serve in).
    let mut devs = a.members;
    devs.extend(new_devs);
    let metadata: Vec<_> = devs.iter().map(MemberDev::metadata).collect();
    let offered: Vec<_> = metadata.into_iter().map(|m| m.offered).collect();
    let plan = plan_assembly(&offered, &AssembleOptions::default()).map_err(|e| anyhow!("{e}"))?;
    let superblocks = offered
        .into_iter()
        .map(|o| o.superblock.map_err(|e| anyhow!("{e}")))
        .collect::<anyhow::Result<_>>()?;
    finish(devs, superblocks, plan, off)
}

/// The internal bitmap as the first slot's member holds it (header and bits) and its
/// reserved size in sectors, when the array has one: the new devices get a copy, and the
/// moved data offset stays clear of it.
fn bitmap_area(a: &Assembled, slot_sbs: &[Superblock]) -> anyhow::Result<Option<(Vec<u8>, u64)>> {
    if slot_sbs[0].bitmap_sector().is_none() {
        return Ok(None);
    }
    let first = a.plan.slots[0].as_ref().expect("whole array").member;
    let area = a.members[first].metadata().offered.bitmap.ok_or_else(|| {
        anyhow!("{}: its internal bitmap could not be read (nothing was written)", a.members[first].name)
    })?;
    let sb = uraid_core::meta::bitmap::BitmapSuper::parse(&area)
        .map_err(|e| anyhow!("{}: bitmap: {e} (nothing was written)", a.members[first].name))?;
    Ok(Some((area, sb.reserved_sectors())))
}

/// "raid6 of 5 members, layout left-symmetric, 64K chunk".
fn shape(level: Level, raid_disks: usize, layout: u32, chunk_sectors: u64) -> String {
    format!(
        "raid{} of {raid_disks} members, layout {}, {}K chunk",
        level.md_level(),
        uraid_core::geometry::layout_name(level, layout),
        chunk_sectors / 2
    )
}

/// Runs the reshape recorded in the members' superblocks to its end, printing progress.
fn finish(
    members: Vec<MemberDev>,
    all_sbs: Vec<Superblock>,
    plan: AssemblyPlan,
    off: &Offline,
) -> anyhow::Result<()> {
    let geo = plan.reshape.clone().ok_or_else(|| anyhow!("the members record no reshape"))?;
    let mut run = ReshapeRun::new(geo).map_err(|e| anyhow!("{e} (nothing was written)"))?;
    let n = plan.slots.len();
    let order: Vec<usize> = plan
        .slots
        .iter()
        .map(|s| s.as_ref().expect("whole array").member)
        .chain(plan.spares.iter().copied())
        .collect();
    let mut superblocks: Vec<Superblock> = order.iter().map(|&i| all_sbs[i].clone()).collect();
    let mut slots: Vec<Option<MemberDev>> = members.into_iter().map(Some).collect();
    let devs: Vec<MemberDev> = order.iter().map(|&i| slots[i].take().expect("each member once")).collect();
    let names: Vec<String> = devs.iter().map(|d| d.path.display().to_string()).collect();
    let mut devices = Devices::new(devs, off.io_delay)?;
    let (from, to) = (run.geometry().previous.raid_disks, n);
    let end = run.total_sectors().max(1);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut windows = 0usize;
    loop {
        if off.stop_after_windows.is_some_and(|max| windows >= max) {
            // As a kill -9 leaves it: the last checkpoint on disk, no message of an end.
            std::process::exit(137);
        }
        let got = continue_reshape(&mut run, &mut superblocks, &mut devices, WINDOW_MAX_SECTORS, Some(1), now_seconds())
            .map_err(|e| {
                anyhow!(
                    "reshape stopped by an I/O error at array sector {}: {e}; the superblocks hold that checkpoint: \
                     fix the device and run `uraid grow --continue` on the members",
                    run.position_sectors()
                )
            })?;
        windows += 1;
        let done = run.done_sectors();
        if tty {
            use std::io::Write;
            let frac = done as f64 / end as f64;
            let filled = (frac * 40.0) as usize;
            print!("\rreshape [{}{}] {:5.1}%", "#".repeat(filled), "-".repeat(40 - filled), frac * 100.0);
            let _ = std::io::stdout().flush();
        }
        if got == ReshapeProgress::Finished {
            break;
        }
    }
    if tty {
        println!();
    }
    // The reshape covers every stripe of the new layout: its size is the array's now.
    let next = &run.geometry().next;
    let what = if from == to {
        format!("reshape to {}", shape(next.level, to, next.layout, next.chunk_sectors))
    } else {
        format!("reshape from {from} to {to} members")
    };
    println!(
        "uraid: {what} done: the array is now {} ({} sectors)",
        crate::array::report::binary_bytes(next.array_sectors() * 512),
        next.array_sectors()
    );
    println!("next: uraid serve {}", names.join(" "));
    Ok(())
}
