//! Starting a raid4/5/6 grow by members as mdadm does without a backup file (Grow.c
//! `analyse_change`, `set_new_data_offset`): every member's data offset moves down by
//! mdadm's `min_offset_change`, the size of a whole number of old and new stripes divided
//! by the old data members, so the first new stripes land below the old data; then the
//! superblocks record the new raid_disks, `delta_disks`, `new_offset` and RESHAPE_ACTIVE
//! at `reshape_position` 0, as md writes them when it starts the reshape.

use crate::geometry::{Geometry, Level};
use crate::meta::superblock::{feature, role, Superblock, MAX_SECTOR};
use crate::reshape::ReshapeGeometry;

/// A device joining the array by the grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowMember {
    pub dev_sectors: u64,
    pub device_uuid: [u8; 16],
    /// Its dev_number when it is already the array's spare: md keeps a spare's desc_nr
    /// (from its superblock) when raid5_start_reshape gives it a slot. None for a device
    /// new to the array, which gets a number nobody holds.
    pub dev_number: Option<u32>,
}

impl GrowMember {
    /// A member asked about before its device is known (a check ahead of `--add`): room
    /// for any data offset; the device's own size is checked as it joins.
    pub const STANDIN: GrowMember =
        GrowMember { dev_sectors: u64::MAX / 4, device_uuid: [0; 16], dev_number: None };
}

/// What a refused grow says: what was wrong and what to do; nothing is written.
fn refuse(what: &str, todo: &str) -> String {
    format!("cannot grow the array: {what}; {todo}; nothing was written")
}

/// A device joining the array by a grow or restripe: the array's fields (`reference`'s),
/// its own identity, its own dev_number if it has one, else a free one as `uraid add`
/// gives ([`Superblock::free_dev_number`]; `used`: numbers taken, this one added), an
/// empty bad-block log where the others have theirs, data at the array's data offset.
/// `who` names it in a refusal.
fn joining_superblock(
    reference: &Superblock,
    m: &GrowMember,
    used: &mut Vec<u32>,
    who: &str,
) -> Result<Superblock, String> {
    let data_offset = reference.data_offset;
    let dev_number = m.dev_number.unwrap_or_else(|| reference.free_dev_number(used));
    used.push(dev_number);
    let data_size =
        m.dev_sectors.checked_sub(data_offset).filter(|&s| s >= reference.size).ok_or_else(|| {
            refuse(
                &format!(
                    "{who} has {} sectors, the array needs {} after the {data_offset}-sector data offset",
                    m.dev_sectors, reference.size
                ),
                "give a larger device",
            )
        })?;
    let mut sb = reference.clone();
    sb.device_uuid = m.device_uuid;
    sb.dev_number = dev_number;
    // The log's place as the array's members have it, empty (feature bit clear): a
    // recovery that later copies this superblock for a blank disk records the rows it
    // cannot rebuild there, as md does, instead of failing its target.
    sb.feature_map &= !(feature::RECOVERY_OFFSET | feature::REPLACEMENT | feature::BAD_BLOCKS);
    sb.recovery_offset = 0;
    sb.cnt_corrected_read = 0;
    sb.devflags = 0;
    sb.data_size = data_size;
    Ok(sb)
}

/// mdadm's `min_offset_change` for a grow from `old_data` to `new_data` data members:
/// `compute_backup_blocks` (a whole number of stripes of both layouts) over `old_data`.
pub fn min_offset_change_sectors(chunk_sectors: u64, old_data: u64, new_data: u64) -> u64 {
    lcm(chunk_sectors * old_data, chunk_sectors * new_data) / old_data
}

/// The lowest sector data may start at on a member (mdadm's getinfo_super1 `earliest`):
/// past the superblock's 36 KiB the kernel keeps, the internal bitmap (`bitmap_sectors`
/// long) and the bad-block log.
fn earliest_data_sector(sb: &Superblock, bitmap_sectors: Option<u64>) -> u64 {
    let mut earliest = sb.super_offset + (32 + 4) * 2;
    if let (Some(start), Some(len)) = (sb.bitmap_sector(), bitmap_sectors) {
        earliest = earliest.max(start + len);
    }
    if sb.has(feature::BAD_BLOCKS) && sb.bblog_size > 0 {
        let end =
            sb.super_offset.saturating_add_signed(i64::from(sb.bblog_offset)) + u64::from(sb.bblog_size);
        earliest = earliest.max(end);
    }
    earliest
}

/// The end of the space data may use on a member: the device's end (1.1/1.2), or where the
/// structures md keeps at the end begin (1.0: the superblock, the bitmap and bad-block log
/// before it).
fn latest_data_end_sector(sb: &Superblock, bitmap_sectors: Option<u64>) -> u64 {
    let mut latest = sb.data_offset.saturating_add(sb.data_size);
    if sb.super_offset > sb.data_offset {
        latest = latest.min(sb.super_offset);
        if let (Some(start), Some(_)) = (sb.bitmap_sector(), bitmap_sectors) {
            if start > sb.data_offset {
                latest = latest.min(start);
            }
        }
        if sb.has(feature::BAD_BLOCKS) && sb.bblog_size > 0 && sb.bblog_offset < 0 {
            latest = latest.min(sb.super_offset.saturating_add_signed(i64::from(sb.bblog_offset)));
        }
    }
    latest
}

/// The members (slot order) and spares of a whole, clean raid4/5/6 with no reshape or log
/// that uraid does not yet move: its freshest superblock and level, or what mdadm or uraid
/// needs first. `parity_slot_empty`: the last slot of a raid4 (or parity-last raid5) has
/// no member, and `superblocks` holds the others. `bitmap_sectors`: the internal bitmap's
/// size on the members (header and bits, as mdadm reserves it), when the caller read it.
fn whole_clean_array<'a>(
    superblocks: &'a [Superblock],
    spares: &[Superblock],
    parity_slot_empty: bool,
    bitmap_sectors: Option<u64>,
) -> Result<(&'a Superblock, Level), String> {
    let reference = superblocks.first().ok_or_else(|| refuse("no members given", "give every member"))?;
    let level = Level::from_md_level(reference.level).filter(|l| l.has_parity()).ok_or_else(|| {
        refuse(
            &format!("reshaping a raid{} offline is not handled", reference.level),
            "uraid reshapes raid4/5/6",
        )
    })?;
    if reference.has(feature::RESHAPE_ACTIVE) {
        return Err(refuse("a reshape is already in progress", "let it finish first"));
    }
    if reference.bitmap_sector().is_some() && bitmap_sectors.is_none() {
        return Err(refuse(
            "the array has an internal bitmap whose size was not read (the moved data offset must \
             stay clear of it)",
            "read it first, or remove the bitmap (mdadm --grow --bitmap=none)",
        ));
    }
    if reference.has(feature::PPL | feature::MULTIPLE_PPLS | feature::JOURNAL) {
        return Err(refuse(
            "the array keeps a partial parity log or journal",
            "switch it to resync first (mdadm --grow --consistency-policy=resync)",
        ));
    }
    let raid_disks = reference.raid_disks as usize - usize::from(parity_slot_empty);
    if superblocks.len() != raid_disks {
        return Err(refuse(
            &format!("{} of the {raid_disks} members given", superblocks.len()),
            "a degraded array is not grown: rebuild it first",
        ));
    }
    for (slot, sb) in superblocks.iter().enumerate() {
        let same = sb.set_uuid == reference.set_uuid
            && sb.events == reference.events
            && sb.level == reference.level
            && sb.layout == reference.layout
            && sb.chunksize == reference.chunksize
            && sb.raid_disks == reference.raid_disks;
        if !same || sb.slot() != Some(slot as u32) || sb.has(feature::RECOVERY_OFFSET) {
            return Err(refuse(
                &format!("the member given for slot {slot} is not that slot's current, in-sync member"),
                "give the members of one whole array in slot order",
            ));
        }
        if sb.resync_offset != MAX_SECTOR {
            return Err(refuse("the array was not shut down cleanly", "let its resync finish first"));
        }
    }
    for sb in spares {
        if sb.set_uuid != reference.set_uuid || sb.events != reference.events || sb.slot().is_some() {
            return Err(refuse(
                &format!("device {} given as a spare is not a current spare of this array", sb.dev_number),
                "give only this array's members and spares",
            ));
        }
    }
    Ok((reference, level))
}

/// The superblocks of a grow of the array `superblocks` (its members in slot order, all
/// present and in sync) by `new_members` (returned last, in slot order), and the reshape
/// they describe. Write the new members' superblocks first and flush them, then the
/// others: a cut inside that round then leaves members one event behind that assembly
/// takes back at position 0, never a slot without a superblock. Refused, with nothing to
/// write, where mdadm would need a backup file or uraid cannot follow.
pub fn start_grow(
    superblocks: &[Superblock],
    new_members: &[GrowMember],
    utime: u64,
) -> Result<(Vec<Superblock>, ReshapeGeometry), String> {
    start_grow_with_spares(superblocks, &[], new_members, utime, None).map(|(all, _, geo)| (all, geo))
}

/// [`start_grow`] of an array that also has `spares`: they stay spares, and their
/// superblocks (returned second, in the order given) record the reshape too, as md writes
/// every member's superblock; else assembly would later take them for another array's.
/// `bitmap_sectors`: the internal bitmap's size on the members (header and bits, as
/// mdadm reserves it), which the moved data offset must stay clear of; an array with a
/// bitmap is refused without it.
pub fn start_grow_with_spares(
    superblocks: &[Superblock],
    spares: &[Superblock],
    new_members: &[GrowMember],
    utime: u64,
    bitmap_sectors: Option<u64>,
) -> Result<(Vec<Superblock>, Vec<Superblock>, ReshapeGeometry), String> {
    grow_superblocks(superblocks, spares, new_members, utime, false, bitmap_sectors)
}

/// [`start_grow_with_spares`] of a raid4 (or parity-last raid5) whose parity slot, the
/// last, is empty (`superblocks` holds the others): the first new member takes it, to be
/// recovered by the reshape as md's raid5_start_reshape does, and the new parity slot is
/// empty in turn. mdadm's raid0 grow runs through this (raid0, raid4, grow, raid0).
pub fn start_grow_into_empty_parity_slot(
    superblocks: &[Superblock],
    spares: &[Superblock],
    new_members: &[GrowMember],
    utime: u64,
) -> Result<(Vec<Superblock>, Vec<Superblock>, ReshapeGeometry), String> {
    let parity_last = superblocks
        .first()
        .is_some_and(|r| r.level == 4 || (r.level == 5 && r.layout == crate::geometry::algorithm::PARITY_N));
    if !parity_last {
        return Err(refuse("the array has no parity-last layout", "give a raid4 or a parity-last raid5"));
    }
    // A raid4 taken over from a raid0 has no bitmap.
    grow_superblocks(superblocks, spares, new_members, utime, true, None)
}

fn grow_superblocks(
    superblocks: &[Superblock],
    spares: &[Superblock],
    new_members: &[GrowMember],
    utime: u64,
    parity_slot_empty: bool,
    bitmap_sectors: Option<u64>,
) -> Result<(Vec<Superblock>, Vec<Superblock>, ReshapeGeometry), String> {
    let (reference, level) = whole_clean_array(superblocks, spares, parity_slot_empty, bitmap_sectors)?;
    // A grow moves the data offset down, into room 1.0 (data at 0) and 1.1 lack.
    if reference.super_offset != 8 {
        return Err(refuse("only a 1.2 superblock has its data offset moved by uraid", "use mdadm --grow"));
    }
    if new_members.is_empty() {
        return Err(refuse("no new member given", "give the devices to add"));
    }
    let raid_disks = reference.raid_disks as usize;
    let chunk = u64::from(reference.chunksize);
    let new_disks = raid_disks + new_members.len();
    let parity = level.parity_disks() as u64;
    let min = min_offset_change_sectors(chunk, raid_disks as u64 - parity, new_disks as u64 - parity);
    for sb in superblocks.iter().chain(spares) {
        let before = sb.data_offset.saturating_sub(earliest_data_sector(sb, bitmap_sectors));
        if before < min {
            return Err(refuse(
                &format!(
                    "a member has {before} sectors before its data, the grow needs {min} to move the data \
                     offset down (mdadm would need a backup file)"
                ),
                "use mdadm --grow with --backup-file",
            ));
        }
    }
    let data_offset = reference.data_offset;
    let new_offset =
        i32::try_from(min).map(|m| -m).map_err(|_| refuse("the offset change is too large", "use mdadm"))?;

    // New members: the array's fields, their own identity, their own dev_numbers (spares)
    // or free ones, no bad-block log (none was read from them), data at the array's data
    // offset.
    let mut used: Vec<u32> = superblocks
        .iter()
        .chain(spares)
        .map(|sb| sb.dev_number)
        .chain(new_members.iter().filter_map(|m| m.dev_number))
        .collect();
    let mut all: Vec<Superblock> = superblocks.to_vec();
    for (i, m) in new_members.iter().enumerate() {
        let mut sb = joining_superblock(reference, m, &mut used, &format!("new member {i}"))?;
        if parity_slot_empty && i == 0 {
            // md's raid5_start_reshape: the first new member takes the empty slot below
            // previous_raid_disks, recovered by the reshape from recovery_offset 0.
            sb.feature_map |= feature::RECOVERY_OFFSET;
        }
        all.push(sb);
    }
    let max_dev = all
        .iter()
        .chain(spares)
        .map(|sb| sb.max_dev)
        .max()
        .unwrap_or(0)
        .max(used.iter().max().map_or(0, |m| m + 1));
    // The new members' slots come after the old members' (the first in the empty parity
    // slot, if any).
    let first_new = superblocks.len();
    let roles: Vec<(u32, u16)> =
        (first_new..all.len()).map(|slot| (all[slot].dev_number, slot as u16)).collect();
    let events = reference.events + 1;
    let mut spares = spares.to_vec();
    for sb in all.iter_mut().chain(spares.iter_mut()) {
        sb.max_dev = max_dev;
        sb.dev_roles.resize(max_dev as usize, role::SPARE);
        for &(dev, slot) in &roles {
            sb.dev_roles[dev as usize] = slot;
        }
        sb.raid_disks = new_disks as u32;
        sb.delta_disks = new_members.len() as i32;
        sb.new_level = sb.level as u32;
        sb.new_layout = sb.layout;
        sb.new_chunk = sb.chunksize;
        sb.new_offset = new_offset;
        sb.reshape_position = 0;
        sb.feature_map |= feature::RESHAPE_ACTIVE | feature::NEW_OFFSET;
        sb.events = events;
        sb.utime = utime;
    }
    let g = |n: usize| Geometry::new(level, n, reference.layout, chunk, &vec![reference.size; n]);
    let geo = ReshapeGeometry::new(
        g(raid_disks)?,
        g(new_disks)?,
        0,
        false,
        vec![data_offset; new_disks],
        vec![data_offset - min; new_disks],
    )?;
    Ok((all, spares, geo))
}

/// What a restripe with the same data members changes (mdadm `--grow --level 6 --add NEW`
/// of a raid5, `--grow --chunk` or `--grow --layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restripe {
    /// raid5 to raid6: md's takeover keeps the raid5's rows as a raid6 of the `-6` layout
    /// with its Q on `member`, a new last slot recovered by the reshape to the raid5's
    /// layout in raid6 (mdadm's `analyse_change`).
    Raid6 { member: GrowMember },
    /// The chunk becomes `chunk_sectors`.
    Chunk { chunk_sectors: u64 },
    /// The raid5/6 layout becomes md's algorithm `layout` (mdadm `--grow --layout`).
    Layout { layout: u32 },
    /// Both at once (mdadm `--grow --chunk --layout`: one reshape, as md runs it).
    ChunkAndLayout { chunk_sectors: u64, layout: u32 },
}

/// Why md refuses `chunk_sectors` as the new chunk of an array whose chunk is `chunk`.
fn check_new_chunk(chunk: u64, chunk_sectors: u64) -> Result<(), String> {
    if chunk_sectors == chunk {
        return Err(refuse("the chunk is already that size", "give another --chunk"));
    }
    if chunk_sectors < 8 || !chunk_sectors.is_power_of_two() || u32::try_from(chunk_sectors).is_err() {
        return Err(refuse(
            &format!("--chunk of {chunk_sectors} sectors: md needs a power of two of at least 4K"),
            "give another --chunk",
        ));
    }
    Ok(())
}

/// Why md refuses `layout` as the new layout of a `level` array whose layout is `current`
/// (md's algorithm_valid_raid5 / algorithm_valid_raid6).
fn check_new_layout(level: Level, current: u32, layout: u32) -> Result<(), String> {
    use crate::geometry::algorithm;
    if level == Level::Raid4 {
        return Err(refuse(
            "a raid4 has one layout (parity on its last member)",
            "turn it into raid5 first (uraid grow --level 5)",
        ));
    }
    if layout == current {
        return Err(refuse("the array already has that layout", "give another --layout"));
    }
    let valid = match level {
        Level::Raid5 => layout <= algorithm::PARITY_N,
        _ => {
            layout <= algorithm::PARITY_N
                || (algorithm::ROTATING_ZERO_RESTART..=algorithm::ROTATING_N_CONTINUE).contains(&layout)
                || (algorithm::LEFT_ASYMMETRIC_6..=algorithm::PARITY_0_6).contains(&layout)
        }
    };
    if !valid {
        return Err(refuse(
            &format!("md has no raid{} layout {layout}", level.md_level()),
            "give another --layout",
        ));
    }
    Ok(())
}

/// mdadm's `choose_offset`: a new data offset in [min, max], near the middle of [lo, hi]
/// and on the largest power of two up to 1 MiB the range allows.
pub fn choose_offset_sectors(lo: u64, hi: u64, min: u64, max: u64) -> u64 {
    let mut choice = (lo + hi) / 2;
    let mut bit = 1u64;
    while bit < 2048 {
        if choice & bit != 0 {
            let (up, down) = (choice + bit, choice.wrapping_sub(bit));
            let up_ok = up <= max;
            let down_ok = choice >= bit && down >= min;
            match (up_ok, down_ok) {
                (false, false) => break,
                (false, true) => choice = down,
                (true, false) => choice = up,
                // Both fit: the one further from the edge of [lo, hi].
                (true, true) => choice = if hi.saturating_sub(up) > down - lo { up } else { down },
            }
        }
        bit <<= 1;
    }
    choice
}

/// The superblocks of a restripe of the array `superblocks` (slot order, whole, clean),
/// its `spares` (returned second) and, for raid6, the new member (last of the first list),
/// and the reshape they describe, as md records it once mdadm started it without a backup
/// file: the data offset moves by mdadm's choice (`set_new_data_offset` with no change
/// in data members: to the side with more room). Down when the room is before the data
/// (1.1/1.2): forwards from `reshape_position` 0. Up when it is after (1.0, whose data
/// starts at 0, or members with unused space at their end): backwards from the array's
/// end (RESHAPE_BACKWARDS). Write the new member's superblock first and flush it, then
/// the others'. `bitmap_sectors`: as for [`start_grow_with_spares`].
pub fn start_restripe(
    superblocks: &[Superblock],
    spares: &[Superblock],
    change: Restripe,
    utime: u64,
    bitmap_sectors: Option<u64>,
) -> Result<(Vec<Superblock>, Vec<Superblock>, ReshapeGeometry), String> {
    use crate::geometry::algorithm;
    let (reference, level) = whole_clean_array(superblocks, spares, false, bitmap_sectors)?;
    let raid_disks = reference.raid_disks as usize;
    let chunk = u64::from(reference.chunksize);
    let (prev_level, prev_layout, next_layout, new_chunk, new_member) = match change {
        Restripe::Raid6 { member } => {
            if level != Level::Raid5 {
                return Err(refuse(
                    &format!("--level 6 with a new member is md's raid5 to raid6; this array is {level:?}"),
                    "give a raid5",
                ));
            }
            let takeover = match reference.layout {
                algorithm::LEFT_ASYMMETRIC => algorithm::LEFT_ASYMMETRIC_6,
                algorithm::RIGHT_ASYMMETRIC => algorithm::RIGHT_ASYMMETRIC_6,
                algorithm::LEFT_SYMMETRIC => algorithm::LEFT_SYMMETRIC_6,
                algorithm::RIGHT_SYMMETRIC => algorithm::RIGHT_SYMMETRIC_6,
                other => {
                    return Err(refuse(
                        &format!(
                            "uraid turns only the rotating raid5 layouts into raid6, not layout {other}"
                        ),
                        "use mdadm --grow --level=6 under Linux md",
                    ))
                }
            };
            (Level::Raid6, takeover, reference.layout, chunk, Some(member))
        }
        Restripe::Chunk { chunk_sectors } => {
            check_new_chunk(chunk, chunk_sectors)?;
            (level, reference.layout, reference.layout, chunk_sectors, None)
        }
        Restripe::Layout { layout } => {
            check_new_layout(level, reference.layout, layout)?;
            (level, reference.layout, layout, chunk, None)
        }
        Restripe::ChunkAndLayout { chunk_sectors, layout } => {
            check_new_chunk(chunk, chunk_sectors)?;
            check_new_layout(level, reference.layout, layout)?;
            (level, reference.layout, layout, chunk_sectors, None)
        }
    };
    let new_disks = raid_disks + usize::from(new_member.is_some());
    let data = (new_disks - prev_level.parity_disks()) as u64;
    // mdadm: both chunks must divide the component size (analyse_change).
    if !reference.size.is_multiple_of(new_chunk) {
        return Err(refuse(
            &format!(
                "the component size ({} sectors) is not a whole number of {new_chunk}-sector chunks",
                reference.size
            ),
            "shrink the component size first (mdadm --grow --size)",
        ));
    }
    let min = lcm(chunk * data, new_chunk * data) / data;
    let data_offset = reference.data_offset;
    let mut all: Vec<Superblock> = superblocks.to_vec();
    let mut used: Vec<u32> = superblocks
        .iter()
        .chain(spares)
        .map(|sb| sb.dev_number)
        .chain(new_member.and_then(|m| m.dev_number))
        .collect();
    if let Some(m) = new_member {
        let mut sb = joining_superblock(reference, &m, &mut used, "the new member")?;
        // md's raid5_start_reshape: a device below previous_raid_disks is recovered by the
        // reshape, from recovery_offset 0.
        sb.feature_map |= feature::RECOVERY_OFFSET;
        all.push(sb);
    }
    let before = all
        .iter()
        .chain(spares)
        .map(|sb| sb.data_offset.saturating_sub(earliest_data_sector(sb, bitmap_sectors)))
        .min();
    let before = before.unwrap_or(0);
    let after = all
        .iter()
        .chain(spares)
        .map(|sb| latest_data_end_sector(sb, bitmap_sectors).saturating_sub(sb.data_offset + reference.size))
        .min()
        .unwrap_or(0);
    // A raid5 to raid6 goes forwards only: its new Q member is recovered up to the
    // checkpoint, which md counts from 0.
    let backwards = (before < min || after > before) && after >= min && new_member.is_none();
    if before < min && !backwards {
        let room = if new_member.is_some() {
            format!("raid5 to raid6 moves the data offset down, and a member has {before} sectors before its data")
        } else {
            format!("a member has {before} sectors before its data and {after} after it")
        };
        return Err(refuse(
            &format!(
                "{room}; the restripe needs {min} to move the data offset (mdadm would need a backup file)"
            ),
            "use mdadm --grow with --backup-file",
        ));
    }
    let new_data_offset = if backwards {
        let (lo, hi) = (data_offset + min, data_offset + after);
        choose_offset_sectors(lo, hi, lo, hi)
    } else {
        choose_offset_sectors(data_offset - before, data_offset, data_offset - before, data_offset - min)
    };
    let new_offset = i32::try_from(i128::from(new_data_offset) - i128::from(data_offset))
        .map_err(|_| refuse("the offset change is too large", "use mdadm"))?;
    let max_dev = all
        .iter()
        .chain(spares)
        .map(|sb| sb.max_dev)
        .max()
        .unwrap_or(0)
        .max(used.iter().max().map_or(0, |m| m + 1));
    let events = reference.events + 1;
    let mut spares = spares.to_vec();
    let new_dev = new_member.map(|_| all[raid_disks].dev_number);
    for sb in all.iter_mut().chain(spares.iter_mut()) {
        sb.max_dev = max_dev;
        sb.dev_roles.resize(max_dev as usize, role::SPARE);
        if let Some(dev) = new_dev {
            sb.dev_roles[dev as usize] = raid_disks as u16;
        }
        sb.level = prev_level.md_level();
        sb.layout = prev_layout;
        sb.raid_disks = new_disks as u32;
        sb.delta_disks = 0;
        sb.new_level = prev_level.md_level() as u32;
        sb.new_layout = next_layout;
        sb.new_chunk = new_chunk as u32;
        sb.new_offset = new_offset;
        sb.feature_map |= feature::RESHAPE_ACTIVE | feature::NEW_OFFSET;
        if backwards {
            sb.feature_map |= feature::RESHAPE_BACKWARDS;
        }
        sb.events = events;
        sb.utime = utime;
    }
    let g =
        |layout, chunk| Geometry::new(prev_level, new_disks, layout, chunk, &vec![reference.size; new_disks]);
    let (previous, next) = (g(prev_layout, chunk)?, g(next_layout, new_chunk)?);
    // md's raid5_start_reshape: backwards from raid5_size, the smaller layout's end.
    let position = if backwards { previous.array_sectors().min(next.array_sectors()) } else { 0 };
    for sb in all.iter_mut().chain(spares.iter_mut()) {
        sb.reshape_position = position;
    }
    let geo = ReshapeGeometry::new(
        previous,
        next,
        position,
        backwards,
        vec![data_offset; new_disks],
        vec![new_data_offset; new_disks],
    )?;
    Ok((all, spares, geo))
}

fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_offset_of_a_restripe_is_mdadms() {
        // What mdadm chose in the VM for raid5 to raid6 (min one chunk) and for a 64K to
        // 128K chunk change (min two chunks) of 4 members, data at 2048, 1968 sectors free
        // before it: 1024 both times.
        assert_eq!(choose_offset_sectors(80, 2048, 80, 2048 - 128), 1024);
        assert_eq!(choose_offset_sectors(80, 2048, 80, 2048 - 256), 1024);
        // Little room: the highest the range allows, still at least `min` below.
        let o = choose_offset_sectors(1800, 2048, 1800, 2048 - 128);
        assert!((1800..=1920).contains(&o), "{o}");
    }

    #[test]
    fn the_offset_change_is_mdadms() {
        // What mdadm chose in the VM for 4 to 5 members with 64 KiB chunks: 512 sectors.
        assert_eq!(min_offset_change_sectors(128, 3, 4), 512);
        // 3 to 4 members of raid5: lcm(256, 384) / 2.
        assert_eq!(min_offset_change_sectors(128, 2, 3), 384);
        // Adding two: lcm(384, 640) / 3.
        assert_eq!(min_offset_change_sectors(128, 3, 5), 640);
    }
}
