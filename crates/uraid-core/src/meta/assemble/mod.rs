//! Assembly decisions as a pure function, following md.c (`super_1_load`,
//! `super_1_validate`, the personalities' size rules) and mdadm's Assemble.c (`enough`,
//! the event margin, the "reports the freshest as failed" rule, when `--run` is needed).

use std::fmt;

use super::bitmap::{BitmapError, BitmapImage};
pub(crate) mod plan;
mod reshape;
pub use plan::*;

use super::superblock::{feature, level, role, Superblock, SuperblockError, SuperblockVersion, MAX_SECTOR};

/// One device offered for assembly.
#[derive(Clone, Debug)]
pub struct OfferedMember {
    /// How the user named it (path); used in every message about it.
    pub name: String,
    pub dev_sectors: u64,
    /// The result of [`Superblock::parse_member`] (or `parse`) on it.
    pub superblock: Result<Superblock, SuperblockError>,
    /// Bytes read at [`Superblock::bitmap_sector`] (header + bits), when the array has an
    /// internal bitmap and the caller read it.
    pub bitmap: Option<Vec<u8>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AssembleOptions {
    /// `--run`: start even with fewer members than the superblocks expect.
    pub run: bool,
    /// `--uuid`: the array to assemble; default: that of the first valid member.
    pub uuid: Option<[u8; 16]>,
    /// mdadm's `--force`: take members whose event count is behind back into their slots
    /// when the array cannot start without them, and start a dirty degraded raid4/5/6
    /// (md's start_dirty_degraded: stripes being written may hold wrong data, the write
    /// hole); its resync stays owed and runs once the array is whole again.
    pub force: bool,
}

/// Why a member was refused (assembly then writes nothing and starts nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefuseReason {
    BadSuperblock(SuperblockError),
    OtherArray { uuid: [u8; 16], expected: [u8; 16] },
    OfferedTwice { first: String },
    DifferentGeometry { freshest: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedMember {
    pub index: usize,
    pub name: String,
    pub reason: RefuseReason,
}

impl fmt::Display for RefusedMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = &self.name;
        match &self.reason {
            RefuseReason::BadSuperblock(e) => write!(f, "{name}: {e}"),
            RefuseReason::OtherArray { uuid, expected } => write!(
                f,
                "{name}: member of another array ({}), not of {}: leave it out",
                super::superblock::format_uuid(uuid),
                super::superblock::format_uuid(expected)
            ),
            RefuseReason::OfferedTwice { first } => write!(
                f,
                "{name}: the same device as {first} (offered twice, or a copy with the same \
                 device uuid): give each member once"
            ),
            RefuseReason::DifferentGeometry { freshest } => write!(
                f,
                "{name}: same array uuid as {freshest} but a different level, layout or \
                 chunk: refusing to mix them"
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AssemblyError {
    NoMembers,
    Refused(Vec<RefusedMember>),
    /// Every member is a spare: nothing says where the data is.
    NoActiveMembers,
    TooFewMembers {
        level: i32,
        raid_disks: u32,
        in_sync: u32,
        clean: bool,
    },
    NeedsRun {
        in_sync: u32,
        expected: u32,
        missing_slots: Vec<u32>,
    },
    /// A reshape md left that uraid cannot take on; `why` says what and what to do.
    ReshapeInProgress {
        why: String,
    },
    Unsupported {
        what: &'static str,
    },
    Raid0MultiZoneLayout {
        layout: u32,
    },
    Bitmap {
        name: String,
        error: BitmapError,
    },
}

impl fmt::Display for AssemblyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use AssemblyError::*;
        match self {
            NoMembers => write!(f, "no members given"),
            Refused(list) => {
                write!(f, "assembly refused, nothing was written:")?;
                for r in list {
                    write!(f, "\n  {r}")?;
                }
                Ok(())
            }
            NoActiveMembers => write!(f, "every member given is a spare: give the array's active members"),
            TooFewMembers { level, raid_disks, in_sync, clean } => {
                let parity = match *level {
                    4 | 5 => 1,
                    6 => 2,
                    _ => 0,
                };
                // Enough members for a clean start, only not for a dirty one: the refusal is
                // about the dirty state, so it says that first.
                if !clean && parity > 0 && in_sync + parity >= *raid_disks {
                    return write!(
                        f,
                        "the raid{level} array was not shut down cleanly and {in_sync} of its \
                         {raid_disks} members are here: parity may be stale, so a degraded start \
                         could return wrong data (md refuses a dirty degraded array): find the \
                         missing members, or start it anyway with --force (mdadm's --assemble \
                         --force), accepting that stripes being written when it stopped may read \
                         back wrong; nothing was written"
                    );
                }
                write!(
                    f,
                    "not enough members to start the raid{level} array: {in_sync} of \
                     {raid_disks} are present and in sync"
                )?;
                if !clean && parity > 0 {
                    write!(
                        f,
                        "; the array was not shut down cleanly, so parity may be stale and a \
                         degraded start could return wrong data (md refuses a dirty degraded \
                         array): find the missing members, or start it anyway with --force \
                         (mdadm's --assemble --force), accepting that stripes being written \
                         when it stopped may read back wrong; nothing was written"
                    )
                } else {
                    write!(
                        f,
                        ": find the missing members (or, if members are only a few events \
                         behind, --force takes them back); nothing was written"
                    )
                }
            }
            NeedsRun { in_sync, expected, missing_slots } => write!(
                f,
                "only {in_sync} of the {expected} members the array had are here (missing \
                 slots {missing_slots:?}): the array can run degraded; pass --run to start it \
                 anyway, or find the missing members"
            ),
            ReshapeInProgress { why } => write!(f, "a reshape is in progress on this array: {why}"),
            Unsupported { what } => write!(f, "{what} is not supported yet"),
            Raid0MultiZoneLayout { layout } => write!(
                f,
                "multi-zone raid0 without a recorded layout (layout {layout:#x}): md refuses it \
                 unless told the layout (raid0.default_layout=1 or 2); rewrite the superblocks \
                 with --layout=original or --layout=alternate"
            ),
            Bitmap { name, error } => write!(f, "{name}: bitmap: {error}"),
        }
    }
}

impl std::error::Error for AssemblyError {}

fn version_of(sb: &Superblock) -> SuperblockVersion {
    match sb.super_offset {
        0 => SuperblockVersion::V1_1,
        8 => SuperblockVersion::V1_2,
        _ => SuperblockVersion::V1_0,
    }
}

/// mdadm `enough()`: can the array run with these slots in sync?
pub fn enough(level: i32, raid_disks: u32, layout: u32, clean: bool, avail: &[bool]) -> bool {
    let n = raid_disks as usize;
    let avail_disks = avail.iter().take(n).filter(|&&a| a).count();
    let at = |i: usize| avail.get(i).copied().unwrap_or(false);
    match level {
        level::RAID10 => {
            let near = (layout & 0xff) as usize;
            let copies = near * ((layout >> 8) & 0xff) as usize;
            if n == 0 || copies == 0 || near == 0 {
                return false;
            }
            let mut first = 0;
            loop {
                let present = (0..copies).any(|k| at((first + k) % n));
                if !present {
                    return false;
                }
                first = (first + near) % n;
                if first == 0 {
                    return true;
                }
            }
        }
        level::LINEAR | level::RAID0 => avail_disks == n,
        level::RAID1 => avail_disks >= 1,
        level::RAID4 if avail_disks + 1 == n && !at(n - 1) => true,
        level::RAID4 | level::RAID5 => avail_disks + usize::from(clean) >= n,
        level::RAID6 => avail_disks + 2 * usize::from(clean) >= n,
        _ => false,
    }
}

/// raid10 `calc_sectors` then `raid10_size`: (per-member dev_sectors, array sectors).
pub fn raid10_sizes(dev_sectors: u64, raid_disks: u32, layout: u32, chunk_sectors: u32) -> (u64, u64) {
    let shift = chunk_sectors.max(1).trailing_zeros();
    let near = u64::from(layout & 0xff).max(1);
    let far = u64::from((layout >> 8) & 0xff).max(1);
    let rd = u64::from(raid_disks.max(1));
    let array_chunks = (dev_sectors >> shift) / far * rd / near;
    let dev_chunks = (array_chunks * near * far).div_ceil(rd);
    let conf_dev_sectors = dev_chunks << shift;
    let array = ((conf_dev_sectors >> shift) / far * rd / near) << shift;
    (conf_dev_sectors, array)
}

/// raid0 zones from member data sizes: (array sectors, smallest rounded size, zone count,
/// members in zone 1).
fn raid0_zones(data_sizes: &[u64], chunk_sectors: u32) -> (u64, u64, usize, usize) {
    let chunk = u64::from(chunk_sectors.max(1));
    let rounded: Vec<u64> = data_sizes.iter().map(|s| s / chunk * chunk).collect();
    // raid0_size masks again with chunk-1 after create_strip_zones rounded; for the power
    // of two chunks mdadm makes the two agree.
    let array: u64 =
        rounded.iter().map(|s| if chunk.is_power_of_two() { s & !(chunk - 1) } else { *s }).sum();
    let mut distinct = rounded.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let smallest = distinct.first().copied().unwrap_or(0);
    let zone1 = rounded.iter().filter(|&&s| s > smallest).count();
    (array, smallest, distinct.len(), zone1)
}

/// Decides how to assemble the offered members. Pure: no I/O; nothing is written whatever
/// the outcome.
pub fn plan_assembly(
    members: &[OfferedMember],
    opts: &AssembleOptions,
) -> Result<AssemblyPlan, AssemblyError> {
    if members.is_empty() {
        return Err(AssemblyError::NoMembers);
    }
    let mut refused: Vec<RefusedMember> = Vec::new();
    let mut refuse = |index: usize, reason: RefuseReason| {
        refused.push(RefusedMember { index, name: members[index].name.clone(), reason })
    };

    // Valid superblocks that also fit their device.
    let mut valid: Vec<(usize, &Superblock)> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        match &m.superblock {
            Err(e) => refuse(i, RefuseReason::BadSuperblock(e.clone())),
            Ok(sb) => match sb.check_fits_device(version_of(sb), m.dev_sectors) {
                Err(e) => refuse(i, RefuseReason::BadSuperblock(e)),
                Ok(()) => valid.push((i, sb)),
            },
        }
    }
    let Some(uuid) = opts.uuid.or_else(|| valid.first().map(|(_, sb)| sb.set_uuid)) else {
        return Err(AssemblyError::Refused(refused));
    };
    let mut group: Vec<(usize, &Superblock)> = Vec::new();
    for (i, sb) in valid {
        if sb.set_uuid != uuid {
            refuse(i, RefuseReason::OtherArray { uuid: sb.set_uuid, expected: uuid });
            continue;
        }
        let dup = group
            .iter()
            .find(|(j, other)| members[*j].name == members[i].name || other.device_uuid == sb.device_uuid);
        if let Some((j, _)) = dup {
            let first = members[*j].name.clone();
            refuse(i, RefuseReason::OfferedTwice { first });
            continue;
        }
        group.push((i, sb));
    }

    // The freshest non-spare superblock is the reference, as super_1_load's refdev.
    let is_active_role = |sb: &Superblock| {
        let r = sb.role();
        r < role::MAX || r == role::JOURNAL
    };
    // Not an unfinished replacement while a member is there: a power cut in a superblock
    // round can leave the replacement's superblock the freshest, listing itself where the
    // members' older ones do not yet, and every member would then look stale beside it.
    let pick_freshest = |skip_replacements: bool| {
        group
            .iter()
            .filter(|(_, sb)| is_active_role(sb) && !(skip_replacements && sb.has(feature::REPLACEMENT)))
            .fold(None::<(usize, &Superblock)>, |best, &(i, sb)| match best {
                Some((_, b)) if b.events >= sb.events => best,
                _ => Some((i, sb)),
            })
    };
    let freshest = pick_freshest(true).or_else(|| pick_freshest(false));
    let Some((fresh_idx, fresh)) = freshest else {
        if !refused.is_empty() {
            return Err(AssemblyError::Refused(refused));
        }
        return Err(AssemblyError::NoActiveMembers);
    };
    // A member that missed only the round that started a grow (a crash inside it): at
    // position 0 nothing has moved, so its data is where its older superblock says; it
    // does not know the new members yet.
    // md's raid5-to-raid6 takes the raid5 over as the `-6` layout with one more slot.
    let takeover = |sb: &Superblock| {
        use crate::geometry::algorithm::{LEFT_ASYMMETRIC_6, RIGHT_SYMMETRIC_6};
        sb.level == level::RAID5
            && fresh.level == level::RAID6
            && fresh.delta_disks == 0
            && (LEFT_ASYMMETRIC_6..=RIGHT_SYMMETRIC_6).contains(&fresh.layout)
            && sb.layout + LEFT_ASYMMETRIC_6 == fresh.layout
            && sb.raid_disks + 1 == fresh.raid_disks
    };
    let missed_reshape_start = |sb: &Superblock| {
        let same_shape = sb.level == fresh.level
            && sb.layout == fresh.layout
            && i64::from(sb.raid_disks) == i64::from(fresh.raid_disks) - i64::from(fresh.delta_disks);
        fresh.has(feature::RESHAPE_ACTIVE)
            && !sb.has(feature::RESHAPE_ACTIVE)
            && fresh.reshape_not_begun()
            && sb.events.saturating_add(1) == fresh.events
            && sb.chunksize == fresh.chunksize
            && (same_shape || takeover(sb))
    };
    // A member that missed only the round ending a reshape: its next geometry is the
    // freshest's geometry (a level, layout or chunk change included).
    let missed_reshape_end_round = |sb: &Superblock| {
        !fresh.has(feature::RESHAPE_ACTIVE)
            && sb.has(feature::RESHAPE_ACTIVE)
            && sb.events.saturating_add(1) == fresh.events
            && sb.new_level as i32 == fresh.level
            && sb.new_layout == fresh.layout
            && sb.new_chunk == fresh.chunksize
            && sb.raid_disks == fresh.raid_disks
    };
    // A member that dropped out before a reshape its array has since recorded (failed, or
    // cut off): older, with the shape from before. md kicks such a member ("superblock
    // inconsistency") and assembles the rest; it comes back only as a new member.
    let mut older_shape: Vec<(usize, u64)> = Vec::new();
    group.retain(|&(i, sb)| {
        let same = (sb.level == fresh.level
            && sb.layout == fresh.layout
            && sb.chunksize == fresh.chunksize
            && sb.raid_disks == fresh.raid_disks)
            || missed_reshape_start(sb)
            || missed_reshape_end_round(sb);
        if !same && sb.events < fresh.events {
            older_shape.push((i, sb.events));
            return false;
        }
        if !same {
            refused.push(RefusedMember {
                index: i,
                name: members[i].name.clone(),
                reason: RefuseReason::DifferentGeometry { freshest: members[fresh_idx].name.clone() },
            });
        }
        same
    });
    if !refused.is_empty() {
        refused.sort_by_key(|r| r.index);
        return Err(AssemblyError::Refused(refused));
    }

    // A reshape md left: only raid4/5/6 growing by members is taken on (see `reshape`);
    // the rest is refused here, before anything else is looked at.
    if fresh.has(feature::RESHAPE_ACTIVE) {
        let parity = matches!(fresh.level, level::RAID4 | level::RAID5 | level::RAID6);
        if !parity {
            return Err(AssemblyError::ReshapeInProgress {
                why: crate::reshape::unsupported(&format!("a reshape of a raid{} array", fresh.level)),
            });
        }
    }
    if fresh.has(feature::JOURNAL) {
        return Err(AssemblyError::Unsupported { what: "a raid5/6 write journal" });
    }
    if fresh.has(feature::CLUSTERED) {
        return Err(AssemblyError::Unsupported { what: "clustered md" });
    }

    let mut warnings = Vec::new();
    let events = fresh.events;
    let raid_disks = fresh.raid_disks;
    let n = raid_disks as usize;
    let mut slots: Vec<Option<SlotMember>> = vec![None; n];
    let mut slot_events: Vec<u64> = vec![0; n];
    // Whether the slot's holder so far is an unfinished replacement (md's want_replacement).
    let mut slot_replacement: Vec<bool> = vec![false; n];
    let mut spares = Vec::new();
    let mut stale = Vec::new();
    for &(i, events) in &older_shape {
        warnings.push(format!(
            "{} is stale (events {events} behind the array's {}, with the shape from before a reshape); \
             left out and not written (`uraid add {} --control SOCKET` makes it a spare, if that is wanted)",
            members[i].name, fresh.events, members[i].name
        ));
        stale.push(StaleMember {
            member: i,
            slot: None,
            events,
            bitmap_recoverable: false,
            re_addable: false,
        });
    }
    // Stale only by their event count: what `force` may take back, (events, slot, member).
    let mut forcible: Vec<(u64, usize, SlotMember)> = Vec::new();

    let bitmap_events_cleared = fresh
        .has(feature::BITMAP_OFFSET)
        .then(|| members[fresh_idx].bitmap.as_deref())
        .flatten()
        .and_then(|b| BitmapImage::parse(b).ok())
        .map(|img| img.sb.events_cleared);

    for &(i, sb) in &group {
        let name = &members[i].name;
        let r = sb.role();
        if r == role::SPARE {
            spares.push(i);
            continue;
        }
        if r == role::FAULTY {
            warnings.push(format!("{name} is marked faulty; left out"));
            continue;
        }
        if r == role::JOURNAL || r >= role::MAX {
            warnings.push(format!("{name} has role {r:#x}, which is not supported; left out"));
            continue;
        }
        let slot = u32::from(r);
        if slot >= raid_disks {
            warnings
                .push(format!("{name} claims slot {slot} beyond raid_disks {raid_disks}; used as a spare"));
            spares.push(i);
            continue;
        }
        // md's event margin: a member one event behind is still current.
        let too_old = sb.events.saturating_add(1) < events;
        // mdadm: a member that records the freshest member as failed has diverged.
        let fresh_slot_in_its_view = sb.dev_roles.get(fresh.dev_number as usize).copied();
        // Unless it only missed the round that took the freshest in: a spare (or a member
        // re-added in full) given its slot to be rebuilt, recovery_offset set, whose
        // superblock alone, or with some members', got the round before the power was cut.
        // It lists the freshest as the spare it was, not as failed; nothing ran without it.
        let missed_its_activation = fresh.has(feature::RECOVERY_OFFSET)
            && fresh_slot_in_its_view == Some(role::SPARE)
            && sb.events < events;
        // Or the round that re-added it to its own slot (md's --re-add, bitmap-guided): the
        // members that missed it still list it as the faulty member it was. Not when a member
        // of the same event count lists it otherwise: their views of one round differ.
        let missed_its_readd = fresh.has(feature::RECOVERY_OFFSET)
            && fresh_slot_in_its_view == Some(role::FAULTY)
            && sb.events.saturating_add(1) == events
            && group.iter().all(|(_, other)| {
                other.events != sb.events
                    || other.dev_roles.get(fresh.dev_number as usize).copied() == Some(role::FAULTY)
            });
        let disowns_freshest = i != fresh_idx
            && !missed_its_activation
            && !missed_its_readd
            && !missed_reshape_start(sb)
            && fresh.slot().is_some_and(|s| fresh_slot_in_its_view != Some(s as u16));
        // The freshest superblock no longer lists it in its slot: it was failed or
        // removed since, whatever the event margin says.
        let dropped_by_freshest = i != fresh_idx
            && sb.events < events
            && fresh.dev_roles.get(sb.dev_number as usize).copied() != Some(r);
        // The Q slot a raid5-to-raid6 rebuilds holds every row once the reshape ended.
        let rebuilt_and_ended = !fresh.has(feature::RESHAPE_ACTIVE)
            && sb.has(feature::RESHAPE_ACTIVE)
            && rebuilt_by_reshape(sb, slot as usize);
        let recovery = (sb.has(feature::RECOVERY_OFFSET) && !rebuilt_and_ended).then_some(sb.recovery_offset);
        let new_data_offset: u64 = if missed_reshape_start(sb) && fresh.has(feature::NEW_OFFSET) {
            sb.data_offset.checked_add_signed(i64::from(fresh.new_offset)).unwrap_or(sb.data_offset)
        } else {
            sb.new_data_offset().try_into().unwrap_or(sb.data_offset)
        };
        // A member that missed only the round ending a reshape (a crash inside it): every
        // window was moved before that round, so its data sits at its new offset and its
        // data size is md_finish_reshape's.
        let missed_reshape_end = !fresh.has(feature::RESHAPE_ACTIVE) && sb.has(feature::RESHAPE_ACTIVE);
        if missed_reshape_end && sb.events >= events {
            return Err(AssemblyError::ReshapeInProgress {
                why: format!(
                    "{name} records a reshape at the same event count as {} records none: the members \
                     disagree; assemble with Linux md (mdadm --assemble) to sort it out; nothing was written",
                    members[fresh_idx].name
                ),
            });
        }
        let (data_offset, data_size) = if missed_reshape_end && !too_old {
            warnings.push(format!(
                "{name} missed the superblock round that ended the reshape; its data is at the new \
                 offset {new_data_offset}"
            ));
            let size = i128::from(sb.data_size) + i128::from(sb.data_offset) - i128::from(new_data_offset);
            (new_data_offset, u64::try_from(size).unwrap_or(0))
        } else {
            (sb.data_offset, sb.data_size)
        };
        let candidate = SlotMember {
            member: i,
            dev_number: sb.dev_number,
            sb_offset_sectors: sb.super_offset,
            data_offset_sectors: data_offset,
            new_data_offset_sectors: new_data_offset,
            data_size_sectors: data_size,
            recovery_offset_sectors: recovery,
            write_mostly: sb.devflags & super::superblock::devflags::WRITE_MOSTLY != 0,
        };
        if too_old || disowns_freshest || dropped_by_freshest {
            let why = if too_old {
                format!("events {} behind the array's {events}", sb.events)
            } else if disowns_freshest {
                format!("it records {} as failed", members[fresh_idx].name)
            } else {
                "the array has since removed it from its slot".to_string()
            };
            // mdadm --assemble --force takes back the freshest members that dropped out, even
            // those the freshest superblock records as failed (two disks lost to one cable
            // glitch); never one that records the freshest as failed (it diverged).
            if (too_old || dropped_by_freshest) && !disowns_freshest {
                forcible.push((sb.events, slot as usize, candidate));
            }
            // md's re-add: back into its own slot while no other device holds it (a member
            // failed and removed comes back; one a replacement took over does not).
            let slot_taken = fresh
                .dev_roles
                .iter()
                .enumerate()
                .any(|(dev, &role)| dev != sb.dev_number as usize && role == r);
            let re_addable = !disowns_freshest && !slot_taken;
            warnings.push(if re_addable {
                format!(
                    "{name} (slot {slot}) is stale ({why}); left out: `uraid serve` adds it back once \
                     the array runs (on a running array: `uraid add {name} --control SOCKET`)"
                )
            } else {
                let why = if slot_taken { "another device has since taken its slot" } else { &why };
                format!(
                    "{name} (slot {slot}) is stale ({why}); left out and not written (`uraid add {name} \
                     --control SOCKET` makes it a spare, if that is wanted)"
                )
            });
            stale.push(StaleMember {
                member: i,
                slot: Some(slot),
                events: sb.events,
                bitmap_recoverable: bitmap_events_cleared.is_some_and(|ec| sb.events >= ec),
                re_addable,
            });
            continue;
        }
        let s = slot as usize;
        let replacement = sb.has(feature::REPLACEMENT);
        match &slots[s] {
            None => {
                slots[s] = Some(candidate);
                slot_events[s] = sb.events;
                slot_replacement[s] = replacement;
            }
            Some(cur) => {
                // An unfinished replacement never takes its slot from the member it is
                // copying, however fresh its superblock (a power cut during a round can leave
                // it one event ahead): the member holds all the data, the replacement only
                // what the copy reached. md keeps both; uraid keeps the member.
                let better = if replacement != slot_replacement[s] {
                    slot_replacement[s]
                } else {
                    sb.events > slot_events[s]
                        || (sb.events == slot_events[s]
                            && cur.recovery_offset_sectors.is_some()
                            && recovery.is_none())
                };
                let (kept, dropped) = if better { (i, cur.member) } else { (cur.member, i) };
                warnings.push(format!(
                    "{} and {} both claim slot {slot}; using {}, {} left out{}",
                    members[cur.member].name,
                    name,
                    members[kept].name,
                    members[dropped].name,
                    if (better && slot_replacement[s]) || (!better && replacement) {
                        " (an unfinished replacement)"
                    } else {
                        ""
                    }
                ));
                if better {
                    slots[s] = Some(candidate);
                    slot_events[s] = sb.events;
                    slot_replacement[s] = replacement;
                }
            }
        }
    }

    let in_sync_of = |slots: &[Option<SlotMember>]| -> Vec<bool> {
        slots.iter().map(|s| s.as_ref().is_some_and(|m| m.recovery_offset_sectors.is_none())).collect()
    };
    let mut in_sync = in_sync_of(&slots);
    // md's raid5_calc_degraded mid-reshape: a grow counts each layout apart; a member the
    // reshape recovers as it goes (a raid4 grow's first new member in the old parity slot)
    // is missing in the previous layout and there in the next.
    let grow_delta = if fresh.has(feature::RESHAPE_ACTIVE) { fresh.delta_disks.max(0) as u32 } else { 0 };
    let enough_now = |slots: &[Option<SlotMember>], in_sync: &[bool], clean: bool| {
        if grow_delta == 0 || grow_delta >= raid_disks {
            return enough(fresh.level, raid_disks, fresh.layout, clean, in_sync);
        }
        let present: Vec<bool> = slots.iter().map(Option::is_some).collect();
        enough(fresh.level, raid_disks - grow_delta, fresh.layout, clean, in_sync)
            && enough(fresh.level, raid_disks, fresh.new_layout, clean, &present)
    };
    let clean = fresh.resync_offset == MAX_SECTOR;
    // mdadm's Assemble counts a PPL array as clean for `enough`: its log closes the write
    // hole, so md starts it dirty and degraded without --force ("starting dirty degraded
    // array with PPL").
    let ppl = super::ppl_recover::has_ppl(fresh);
    let mut forced_dirty = false;
    if opts.force && !enough_now(&slots, &in_sync, clean || ppl) {
        // mdadm --force: the freshest of the members that are only behind in events come
        // back, one at a time, until the array could start.
        forcible.sort_by_key(|(ev, _, _)| std::cmp::Reverse(*ev));
        for (ev, slot, m) in forcible {
            if enough_now(&slots, &in_sync, true) {
                break;
            }
            if slots[slot].is_some() {
                continue;
            }
            warnings.push(format!(
                "forced: {} (events {ev}, the array's {events}) is taken back into slot {slot}; \
                 writes it missed read back as they were before them",
                members[m.member].name
            ));
            stale.retain(|st: &StaleMember| st.member != m.member);
            slots[slot] = Some(m);
            in_sync = in_sync_of(&slots);
        }
        if !enough_now(&slots, &in_sync, clean || ppl) && enough_now(&slots, &in_sync, true) {
            warnings.push(
                "forced: the array was not shut down cleanly and starts degraded (md's \
                 start_dirty_degraded); stripes being written when it stopped may read back \
                 wrong (the write hole); the resync runs once the array is whole again"
                    .to_string(),
            );
            forced_dirty = true;
        }
    }
    let in_sync_count = in_sync.iter().filter(|&&b| b).count() as u32;
    let rebuilding = slots.iter().flatten().count() as u32 - in_sync_count;
    if !enough_now(&slots, &in_sync, clean || ppl || forced_dirty) {
        return Err(AssemblyError::TooFewMembers {
            level: fresh.level,
            raid_disks,
            in_sync: in_sync_count,
            // No --force hint: a PPL array counted as clean already.
            clean: clean || ppl,
        });
    }
    let degraded_slots: Vec<u32> = (0..raid_disks).filter(|&s| !in_sync[s as usize]).collect();
    // mdadm starts without --run when every member the freshest superblock lists as
    // active is here (an array stopped degraded comes back degraded).
    // Slots, not roles: a replacement shares its slot's entry (md's want_replacement).
    let active_slots: std::collections::BTreeSet<u16> =
        fresh.dev_roles.iter().copied().filter(|&r| u32::from(r) < raid_disks).collect();
    let expected = active_slots.len() as u32;
    if !opts.run && in_sync_count + rebuilding < expected {
        return Err(AssemblyError::NeedsRun {
            in_sync: in_sync_count,
            expected,
            missing_slots: degraded_slots.clone(),
        });
    }
    // Said apart: a missing member is lost redundancy; one being rebuilt (a new raid4/5's
    // last member, as mdadm creates it, or a resumed recovery) comes back by itself.
    let (rebuilt, missing): (Vec<u32>, Vec<u32>) =
        degraded_slots.iter().partition(|&&s| slots[s as usize].is_some());
    // The superblocks `uraid create` wrote (events 0), never started since: a new raid4/5's
    // last member is built from the others (mdadm creates it so), nothing was lost.
    let new_array = fresh.events == 0;
    for (list, what) in [(&missing, "missing"), (&rebuilt, "being rebuilt from the others")] {
        if !list.is_empty() {
            let names: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            let (noun, verb) = if names.len() == 1 { ("slot", "is") } else { ("slots", "are") };
            warnings.push(if new_array && list == &rebuilt {
                format!(
                    "new array: {noun} {} {verb} built from the others as it first starts",
                    names.join(", ")
                )
            } else {
                format!("array is degraded: {noun} {} {verb} {what}", names.join(", "))
            });
        }
    }

    // Sizes as the personalities compute them.
    let chunk = fresh.chunksize;
    let mut layout = fresh.layout;
    let (size_sectors, array_sectors) = match fresh.level {
        level::RAID0 | level::LINEAR => {
            let sizes: Vec<u64> = slots.iter().flatten().map(|m| m.data_size_sectors).collect();
            if fresh.level == level::LINEAR {
                (sizes.iter().copied().min().unwrap_or(0), sizes.iter().sum())
            } else {
                let (array, smallest, zones, zone1) = raid0_zones(&sizes, chunk);
                if zones == 1 || zone1 == 1 {
                    layout = super::create::RAID0_ORIG_LAYOUT;
                } else if !fresh.has(feature::RAID0_LAYOUT) || !(1..=2).contains(&fresh.layout) {
                    return Err(AssemblyError::Raid0MultiZoneLayout { layout: fresh.layout });
                }
                (smallest, array)
            }
        }
        level::RAID1 => (fresh.size, fresh.size),
        level::RAID10 => raid10_sizes(fresh.size, raid_disks, fresh.layout, chunk),
        level::RAID4 | level::RAID5 | level::RAID6 => {
            let dev = fresh.size & !(u64::from(chunk.max(1)) - 1);
            let parity = if fresh.level == level::RAID6 { 2 } else { 1 };
            (dev, dev * u64::from(raid_disks - parity))
        }
        _ => return Err(AssemblyError::Unsupported { what: "this raid level" }),
    };

    let reshape = if fresh.has(feature::RESHAPE_ACTIVE) {
        let r = plan_reshape(fresh, &slots, size_sectors)?;
        warnings.push(format!(
            "a reshape from {} to {} members is in progress at array sector {} of {}: served writable, \
             uraid goes on with a grow by members; otherwise (or --read-only) it is served read-only and \
             `uraid grow --continue` on the stopped members finishes it",
            r.previous.raid_disks,
            r.next.raid_disks,
            r.position_sectors,
            r.array_sectors()
        ));
        Some(r)
    } else {
        None
    };
    let array_sectors = reshape.as_ref().map_or(array_sectors, |r| r.array_sectors());

    // Bitmap: md reads it from the members; we use the freshest member's copy.
    let redundant = fresh.level >= 1;
    let degraded = !degraded_slots.is_empty();
    let bitmap = match fresh.bitmap_sector() {
        None => None,
        Some(_) => {
            let mut plan = BitmapPlan {
                offset_from_sb_sectors: fresh.bitmap_offset,
                chunk_bytes: None,
                sync_size_sectors: None,
                events_cleared: None,
                stale: false,
                image: None,
                resync_start_sector: 0,
            };
            match members[fresh_idx].bitmap.as_deref() {
                None => warnings.push(
                    "the internal bitmap was not read; a resync, if needed, covers everything".to_string(),
                ),
                Some(bytes) => {
                    let name = members[fresh_idx].name.clone();
                    let image = BitmapImage::parse(bytes)
                        .map_err(|error| AssemblyError::Bitmap { name: name.clone(), error })?;
                    let stale_bm = image
                        .sb
                        .check_against_array(&fresh.set_uuid, events)
                        .map_err(|error| AssemblyError::Bitmap { name, error })?;
                    if stale_bm {
                        warnings.push(format!(
                            "bitmap events {} are behind the array's {events}: full resync",
                            image.sb.events
                        ));
                    }
                    // md_bitmap_load: keep every set bit for a re-add while degraded.
                    plan.resync_start_sector =
                        if !degraded || image.sb.events_cleared == events { fresh.resync_offset } else { 0 };
                    plan.chunk_bytes = Some(image.sb.chunksize);
                    plan.sync_size_sectors = Some(image.sb.sync_size);
                    plan.events_cleared = Some(image.sb.events_cleared);
                    plan.stale = stale_bm;
                    plan.image = Some(image);
                }
            }
            Some(plan)
        }
    };

    let resync = if clean || !redundant {
        ResyncNeed::None
    } else {
        match bitmap.as_ref().and_then(|b| b.write_intent()) {
            Some(wib) if !bitmap.as_ref().is_some_and(|b| b.stale) => {
                ResyncNeed::Bitmap { regions: wib.dirty_regions() }
            }
            _ => ResyncNeed::Full { from_sector: fresh.resync_offset },
        }
    };
    // The superblocks `uraid create` wrote (events 0), never started since (a start marks
    // them dirty, events 1 on): the initial resync of a new array, not a crash.
    let never_started = fresh.events == 0 && fresh.resync_offset == 0;
    if resync != ResyncNeed::None {
        warnings.push(if never_started {
            "new array: initial resync needed".to_string()
        } else {
            "array was not shut down cleanly: resync needed".to_string()
        });
    }
    if ppl && resync != ResyncNeed::None {
        warnings.push(
            "the partial parity log (ppl) is replayed before the array starts; the resync is \
             dropped when it recovers the stripes being written"
                .to_string(),
        );
    }

    Ok(AssemblyPlan {
        uuid,
        name: fresh.name(),
        level: fresh.level,
        layout,
        chunk_sectors: chunk,
        raid_disks,
        slots,
        size_sectors,
        array_sectors,
        events,
        freshest: fresh_idx,
        resync_offset: fresh.resync_offset,
        resync,
        bitmap,
        spares,
        stale,
        degraded_slots,
        warnings,
        reshape,
    })
}

/// The reshape the freshest superblock records, over the slots assembly chose. One with a
/// member still recovering is refused: uraid does not continue it; except the Q member
/// md's raid5-to-raid6 rebuilds by the reshape itself. A missing member is not: the reshape
/// goes on degraded, as md's does.
fn plan_reshape(
    fresh: &Superblock,
    slots: &[Option<SlotMember>],
    size_sectors: u64,
) -> Result<crate::reshape::ReshapeGeometry, AssemblyError> {
    let refuse = |why: String| AssemblyError::ReshapeInProgress { why };
    let mut data_offsets = Vec::with_capacity(slots.len());
    let mut new_data_offsets = Vec::with_capacity(slots.len());
    for (slot, s) in slots.iter().enumerate() {
        match s {
            Some(m) if m.recovery_offset_sectors.is_none() || rebuilt_by_reshape(fresh, slot) => {
                data_offsets.push(m.data_offset_sectors);
                new_data_offsets.push(m.new_data_offset_sectors);
            }
            // A member lost mid-reshape: md goes on degraded (the engines reconstruct
            // it); the slot's offsets are the array's, as mdadm sets them on every member.
            None => {
                data_offsets.push(fresh.data_offset);
                new_data_offsets.push(u64::try_from(fresh.new_data_offset()).unwrap_or(fresh.data_offset));
            }
            _ => {
                return Err(refuse(crate::reshape::unsupported(&format!(
                    "slot {slot} is still recovering (a reshape with a member being rebuilt)"
                ))))
            }
        }
    }
    if fresh.new_chunk != fresh.chunksize && fresh.delta_disks != 0 {
        // What uraid restripes keeps the member count (mdadm changes one at a time too).
        return Err(refuse(crate::reshape::unsupported(
            "a chunk change together with a change of member count",
        )));
    }
    // An internal bitmap stays as it is: the restripes uraid runs keep the member size, so
    // its sync space (member sectors) is the same in both layouts, and a write counts in
    // both while the reshape runs (`array::superblocks::SyncRanges`).
    reshape::from_superblock(fresh, size_sectors, data_offsets, new_data_offsets).map_err(refuse)
}

/// md's raid5-to-raid6 (raid5's takeover into a `-6` layout, its Q member added empty,
/// then the reshape to the plain raid6 layout) recorded in `sb`: the previous layout keeps
/// nothing on the Q slot, and the reshape writes every row of it below
/// `reshape_position` (md's reshape_request moves its `recovery_offset` along, a round
/// behind when a cut ended a checkpoint round early; the rows are there either way).
fn rebuilt_by_reshape(sb: &Superblock, slot: usize) -> bool {
    use crate::geometry::algorithm::{LEFT_ASYMMETRIC_6, PARITY_0_6, PARITY_N};
    let q = sb.level == level::RAID6
        && sb.delta_disks == 0
        && (LEFT_ASYMMETRIC_6..=PARITY_0_6).contains(&sb.layout)
        && sb.new_layout != sb.layout
        && slot + 1 == sb.raid_disks as usize;
    // A grow of a raid4 (or parity-last raid5) puts its first new member in the old
    // parity slot (md's raid5_start_reshape; mdadm's raid0 grow).
    let parity_last = sb.level == 4 || (sb.level == 5 && sb.layout == PARITY_N);
    let old_parity_slot = sb.delta_disks > 0
        && parity_last
        && sb.new_layout == sb.layout
        && slot as i64 + 1 == i64::from(sb.raid_disks) - i64::from(sb.delta_disks);
    sb.has(feature::RESHAPE_ACTIVE) && (q || old_parity_slot)
}

#[cfg(test)]
mod engine_start_tests {
    use super::ResyncNeed;

    #[test]
    fn bitmap_regions_become_engine_start_end_ranges() {
        // (start, len) once went through as (start, end), so a region whose length is
        // less than its start was an empty range and never resynced.
        let r = ResyncNeed::Bitmap { regions: vec![(0, 128), (4096, 128)] };
        assert_eq!(r.engine_ranges(), Some(Some(vec![(0, 128), (4096, 4224)])));
        assert_eq!(ResyncNeed::Full { from_sector: 0 }.engine_ranges(), Some(None));
        assert_eq!(ResyncNeed::Full { from_sector: 64 }.engine_ranges(), Some(Some(vec![(64, u64::MAX)])));
        assert_eq!(ResyncNeed::Bitmap { regions: vec![] }.engine_ranges(), None);
        assert_eq!(ResyncNeed::None.engine_ranges(), None);
    }
}
