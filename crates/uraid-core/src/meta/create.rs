//! Creation defaults as mdadm 4.2 computes them (Create.c, super1.c `validate_geometry1`,
//! `init_super1`, `add_internal_bitmap1`, `write_init_super1`), so that Linux md accepts
//! what uraid writes and the fields equal mdadm's.

use std::fmt;

use super::bitmap::{
    bitmap_bytes_on_disk, choose_bm_space, min_bitmap_chunk, BitmapSuper, BITMAP_PAGE_BYTES,
    BITMAP_SUPER_BYTES,
};
use super::ppl::{ppl_word, PPL_AREA_SECTORS_SUPER1};
use super::superblock::{
    check_geometry, feature, level, role, Superblock, SuperblockError, SuperblockVersion, MAX_DEV_LIMIT,
    MAX_SECTOR, MD_SB_MAGIC,
};

/// mdadm `DEFAULT_CHUNK` (KiB) for raid0/4/5/6/10.
pub const DEFAULT_CHUNK_KIB: u32 = 512;
/// mdadm `RAID0_ORIG_LAYOUT`, its default raid0 layout.
pub const RAID0_ORIG_LAYOUT: u32 = 1;
/// `ALGORITHM_LEFT_SYMMETRIC`, mdadm's default for raid5/6.
pub const LEFT_SYMMETRIC: u32 = 2;
/// raid10 `n2`.
pub const RAID10_NEAR2: u32 = 0x102;

/// What `mdadm --create` is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateParams {
    pub version: SuperblockVersion,
    pub level: i32,
    pub raid_disks: u32,
    /// `--layout`; `None` for mdadm's default of the level.
    pub layout: Option<u32>,
    /// `--chunk` in KiB; `None` for the default (512 KiB for striped levels).
    pub chunk_kib: Option<u32>,
    /// `--size` in KiB per member; `None` for the largest that fits.
    pub size_kib: Option<u64>,
    /// Size in sectors of each slot's device; `None` for a `missing` slot.
    pub member_dev_sectors: Vec<Option<u64>>,
    /// `--data-offset` in sectors; `None` for mdadm's rule.
    pub data_offset_sectors: Option<u64>,
    /// `--bitmap=internal`.
    pub bitmap: bool,
    /// `--bitmap-chunk` in bytes; `None` for mdadm's default.
    pub bitmap_chunk_bytes: Option<u32>,
    /// `--write-behind`: md's max_write_behind in the bitmap superblock (raid1 with a
    /// bitmap only; 0 = off).
    pub write_behind: u32,
    /// `--consistency-policy=ppl`: a partial parity log area on every member (raid5 only,
    /// never with a bitmap).
    pub ppl: bool,
    pub assume_clean: bool,
    /// `--homehost`; the name is stored as "homehost:name" when it fits.
    pub homehost: Option<String>,
    pub name: String,
    /// The caller draws uuids (core has no randomness).
    pub set_uuid: [u8; 16],
    /// Per slot (same length as `member_dev_sectors`).
    pub device_uuids: Vec<[u8; 16]>,
    /// Creation time (seconds since the epoch), also the first `utime`.
    pub ctime_seconds: u64,
}

impl CreateParams {
    /// mdadm's defaults for `level` over members of these sizes.
    pub fn new(level: i32, member_dev_sectors: Vec<Option<u64>>) -> Self {
        let n = member_dev_sectors.len();
        CreateParams {
            version: SuperblockVersion::V1_2,
            level,
            raid_disks: n as u32,
            layout: None,
            chunk_kib: None,
            size_kib: None,
            member_dev_sectors,
            data_offset_sectors: None,
            bitmap: false,
            bitmap_chunk_bytes: None,
            write_behind: 0,
            ppl: false,
            assume_clean: false,
            homehost: None,
            name: String::new(),
            set_uuid: [0; 16],
            device_uuids: vec![[0; 16]; n],
            ctime_seconds: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateError {
    MemberCountMismatch { raid_disks: u32, members: usize },
    UuidCountMismatch { members: usize, uuids: usize },
    NoMembers,
    MissingNotAllowed { level: i32 },
    ChunkForbidden { level: i32 },
    BitmapNotMeaningful { level: i32 },
    DeviceTooSmall { slot: usize, dev_sectors: u64 },
    SizeTooLarge { slot: usize, available_kib: u64, size_kib: u64 },
    SizeBelowChunk { size_kib: u64, chunk_kib: u32 },
    NoRoomForBitmap,
    BitmapChunkTooSmall { chunk_bytes: u32, min_bytes: u32 },
    TooManyDevices { raid_disks: u32 },
    PplNotRaid5 { level: i32 },
    PplWithBitmap,
    WriteBehindNeedsBitmap,
    WriteBehindNotRaid1 { level: i32 },
    WriteBehindTooLarge { write_behind: u32 },
    PplNeedsSuperblockAtStart,
    NoRoomForPpl { data_offset: u64 },
    Geometry(SuperblockError),
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CreateError::*;
        match self {
            MemberCountMismatch { raid_disks, members } => write!(
                f,
                "{members} members given for --raid-devices {raid_disks}: give one per slot \
                 (use `missing` for an absent one)"
            ),
            UuidCountMismatch { members, uuids } => {
                write!(f, "{uuids} device uuids for {members} members")
            }
            NoMembers => write!(f, "no member devices given (all are `missing`)"),
            MissingNotAllowed { level } => {
                write!(f, "raid level {level} has no redundancy, so no member may be `missing`")
            }
            ChunkForbidden { level } => {
                write!(f, "a chunk size is meaningless for raid level {level}; drop --chunk")
            }
            BitmapNotMeaningful { level } => {
                write!(f, "a write-intent bitmap is meaningless for raid level {level}; drop --bitmap")
            }
            DeviceTooSmall { slot, dev_sectors } => write!(
                f,
                "member in slot {slot} ({dev_sectors} sectors) is too small for the metadata \
                 and data offset; use a larger device"
            ),
            SizeTooLarge { slot, available_kib, size_kib } => write!(
                f,
                "member in slot {slot} has only {available_kib} KiB for data, --size asks \
                 {size_kib} KiB: lower --size or use a larger device"
            ),
            SizeBelowChunk { size_kib, chunk_kib } => write!(
                f,
                "size {size_kib} KiB is smaller than the {chunk_kib} KiB chunk: use a larger \
                 size or a smaller --chunk"
            ),
            NoRoomForBitmap => write!(
                f,
                "no internal bitmap fits between superblock and data for an array this large: \
                 its bits would need a bitmap chunk beyond the 2G md's 32-bit chunk field holds; \
                 use --bitmap none"
            ),
            BitmapChunkTooSmall { chunk_bytes, min_bytes } => write!(
                f,
                "bitmap chunk {chunk_bytes} bytes is too small to fit the reserved space (at \
                 least {min_bytes} bytes needed): raise --bitmap-chunk"
            ),
            TooManyDevices { raid_disks } => {
                write!(f, "{raid_disks} devices exceed the {MAX_DEV_LIMIT} a 1.x superblock can hold")
            }
            PplNotRaid5 { level } => write!(
                f,
                "--consistency-policy=ppl applies to raid5 only (md's partial parity log), not \
                 raid level {level}"
            ),
            WriteBehindNeedsBitmap => write!(
                f,
                "--write-behind needs a bitmap (its bits cover a write until its write-mostly \
                 copies land): add --bitmap internal"
            ),
            WriteBehindNotRaid1 { level } => {
                write!(f, "--write-behind applies to raid1 only (md's write-behind), not raid level {level}")
            }
            WriteBehindTooLarge { write_behind } => {
                write!(f, "--write-behind {write_behind} exceeds md's most, {}", super::bitmap::COUNTER_MAX)
            }
            PplWithBitmap => write!(
                f,
                "--consistency-policy=ppl and an internal bitmap exclude each other (md refuses \
                 both): drop --bitmap"
            ),
            PplNeedsSuperblockAtStart => write!(
                f,
                "--consistency-policy=ppl is supported with metadata 1.1/1.2 only (the log sits \
                 between superblock and data)"
            ),
            NoRoomForPpl { data_offset } => write!(
                f,
                "no room for the 1 MiB partial parity log between superblock and data (data \
                 offset {data_offset} sectors)"
            ),
            // In the words of the options, not of a superblock found on disk.
            Geometry(SuperblockError::BadChunk { level, chunk_sectors }) => write!(
                f,
                "--chunk {} KiB is not valid for raid{level}: md needs a power of two of at \
                 least 4K for raid4/5/6/10 (e.g. 64K, 512K) and any non-zero chunk for raid0",
                f64::from(*chunk_sectors) / 2.0
            ),
            Geometry(SuperblockError::BadLayout { level, .. }) => write!(
                f,
                "--layout is not a raid{level} layout (raid5/6: left-symmetric, \
                 left-asymmetric, right-symmetric, right-asymmetric, parity-first, parity-last; \
                 raid10: n2, f2, o2 ...)"
            ),
            Geometry(SuperblockError::TooFewRaidDisks { level, raid_disks, min }) => {
                write!(f, "raid{level} needs at least {min} devices; --raid-devices is {raid_disks}")
            }
            Geometry(SuperblockError::ZeroRaidDisks) => write!(f, "--raid-devices must be at least 1"),
            Geometry(e) => write!(f, "invalid geometry: {e}"),
        }
    }
}

impl std::error::Error for CreateError {}

/// Everything written at creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedArray {
    /// Superblock of each slot (`None` for `missing`), checksums set.
    pub superblocks: Vec<Option<Superblock>>,
    /// The bitmap superblock written on every member, with the sector offset from the
    /// superblock and the bytes of the whole bitmap area (mdadm fills the bits with ones
    /// so the first assembly resyncs everything unless --assume-clean).
    pub bitmap: Option<CreatedBitmap>,
    /// The used size of each member in sectors (md's `dev_sectors`; 0 for raid0).
    pub size_sectors: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedBitmap {
    pub sb: BitmapSuper,
    pub offset_from_sb_sectors: i32,
    /// Header + bits, `calc_bitmap_size(.., 4096)` bytes, as mdadm's write_bitmap1 writes.
    pub area: Vec<u8>,
}

/// mdadm `default_layout`.
pub fn default_layout(level: i32) -> u32 {
    match level {
        level::RAID0 => RAID0_ORIG_LAYOUT,
        level::RAID10 => RAID10_NEAR2,
        level::RAID5 | level::RAID6 => LEFT_SYMMETRIC,
        _ => 0,
    }
}

fn is_striped(level: i32) -> bool {
    matches!(level, level::RAID0 | level::RAID4 | level::RAID5 | level::RAID6 | level::RAID10)
}

/// mdadm `validate_geometry1`'s data_offset for 1.1/1.2: room for the superblock (12 KiB
/// counted), the bitmap space of `choose_bm_space`, and reshape headroom of about 0.1% of
/// the device (at most 128 MiB, halved while more than 1/1024 of the device, but not below
/// 4 chunks' worth when a chunk is set), rounded up to 1 MiB. 1.0 keeps data at 0.
pub fn default_data_offset(version: SuperblockVersion, dev_sectors: u64, chunk_kib: u32) -> u64 {
    data_offset_with_room(version, dev_sectors, chunk_kib, choose_bm_space(dev_sectors))
}

/// [`default_data_offset`] with `bmspace` sectors kept after the superblock: with
/// `--consistency-policy=ppl` mdadm keeps the 1 MiB PPL area there instead of the bitmap
/// space (a 16 MiB member with 64 KiB chunks gets data_offset 4096, not 2048: seen in md).
pub fn data_offset_with_room(
    version: SuperblockVersion,
    dev_sectors: u64,
    chunk_kib: u32,
    bmspace: u64,
) -> u64 {
    if version == SuperblockVersion::V1_0 {
        return 0;
    }
    let mut headroom: u64 = 128 * 1024 * 2;
    while (headroom << 10) > dev_sectors && (chunk_kib == 0 || headroom / 2 >= u64::from(chunk_kib) * 2 * 2) {
        headroom >>= 1;
    }
    let data_offset = 12 * 2 + bmspace + headroom;
    data_offset.div_ceil(2048) * 2048
}

/// mdadm `init_super1`: `max_dev` covers raid_disks + spares rounded up so the superblock
/// fills whole 512-byte sectors.
pub fn default_max_dev(devices: u32) -> u32 {
    let sbsize = (256 + 2 * devices as usize).div_ceil(512) * 512;
    ((sbsize - 256) / 2) as u32
}

/// mdadm's `set_name`: "homehost:name" when the name has no ':' and it fits in 31 bytes,
/// else the name truncated to 31 bytes.
pub fn make_set_name(homehost: Option<&str>, name: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    let text = match homehost {
        Some(h) if !name.contains(':') && h.len() + 1 + name.len() < 32 => {
            format!("{h}:{name}")
        }
        _ => name.to_string(),
    };
    let n = text.len().min(31);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

impl Superblock {
    /// The superblock mdadm would write on `slot` for `params` (see [`create_array`]).
    pub fn new_for_create(params: &CreateParams, slot: usize) -> Result<Superblock, CreateError> {
        let created = create_array(params)?;
        created
            .superblocks
            .into_iter()
            .nth(slot)
            .flatten()
            .ok_or(CreateError::MissingNotAllowed { level: params.level })
    }
}

/// Computes every superblock and the bitmap of a new array as mdadm 4.2 would.
///
/// One deliberate choice where mdadm depends on the kernel: for raid4/5 without
/// --assume-clean mdadm adds the last member as a spare that the kernel then recovers
/// (faster than a resync). The superblocks here record that end state directly: the last
/// member has `dev_number = raid_disks` and a `recovery_offset` of 0, and the array is
/// clean (`resync_offset = MaxSector`), which is what md writes once recovery starts.
pub fn create_array(p: &CreateParams) -> Result<CreatedArray, CreateError> {
    let n = p.member_dev_sectors.len();
    if p.raid_disks as usize != n {
        return Err(CreateError::MemberCountMismatch { raid_disks: p.raid_disks, members: n });
    }
    if p.device_uuids.len() != n {
        return Err(CreateError::UuidCountMismatch { members: n, uuids: p.device_uuids.len() });
    }
    if p.raid_disks + 1 > MAX_DEV_LIMIT {
        return Err(CreateError::TooManyDevices { raid_disks: p.raid_disks });
    }
    let missing = p.member_dev_sectors.iter().filter(|m| m.is_none()).count();
    if missing == n {
        return Err(CreateError::NoMembers);
    }
    if p.level <= 0 && missing > 0 {
        return Err(CreateError::MissingNotAllowed { level: p.level });
    }
    if p.bitmap && p.level <= 0 {
        return Err(CreateError::BitmapNotMeaningful { level: p.level });
    }
    if p.write_behind > 0 {
        if p.level != 1 {
            return Err(CreateError::WriteBehindNotRaid1 { level: p.level });
        }
        if !p.bitmap {
            return Err(CreateError::WriteBehindNeedsBitmap);
        }
        if p.write_behind > super::bitmap::COUNTER_MAX {
            return Err(CreateError::WriteBehindTooLarge { write_behind: p.write_behind });
        }
    }
    let layout = p.layout.unwrap_or_else(|| default_layout(p.level));
    let chunk_kib = if is_striped(p.level) {
        p.chunk_kib.filter(|&c| c != 0).unwrap_or(DEFAULT_CHUNK_KIB)
    } else {
        if p.chunk_kib.is_some_and(|c| c != 0) && p.level == level::RAID1 {
            return Err(CreateError::ChunkForbidden { level: p.level });
        }
        p.chunk_kib.unwrap_or(0)
    };
    let chunk_sectors = chunk_kib * 2;
    check_geometry(p.level, p.raid_disks, layout, chunk_sectors).map_err(CreateError::Geometry)?;

    // validate_geometry1 fixes st->data_offset from the first member it sees.
    if p.ppl {
        if p.level != level::RAID5 {
            return Err(CreateError::PplNotRaid5 { level: p.level });
        }
        if p.bitmap {
            return Err(CreateError::PplWithBitmap);
        }
        if p.version == SuperblockVersion::V1_0 {
            return Err(CreateError::PplNeedsSuperblockAtStart);
        }
    }
    let first_dev = p.member_dev_sectors.iter().flatten().copied().next().unwrap_or(0);
    let ppl_sectors = u64::from(PPL_AREA_SECTORS_SUPER1);
    let data_offset = p.data_offset_sectors.unwrap_or_else(|| {
        if p.ppl {
            data_offset_with_room(p.version, first_dev, chunk_kib, ppl_sectors)
        } else {
            default_data_offset(p.version, first_dev, chunk_kib)
        }
    });
    if p.ppl {
        // The area starts 8 sectors after the 1.1/1.2 superblock; the bad-block log follows it.
        let sb_offset = p.version.sb_offset_sectors(first_dev).unwrap_or(0);
        if data_offset < sb_offset + 8 + ppl_sectors + 8 {
            return Err(CreateError::NoRoomForPpl { data_offset });
        }
    }

    // Create.c: freesize per member in KiB, rounded to the chunk; the array uses the least.
    let mut min_kib: Option<u64> = None;
    for (slot, dev) in p.member_dev_sectors.iter().enumerate() {
        let Some(dev) = *dev else { continue };
        let free_sectors = match p.version {
            SuperblockVersion::V1_0 => {
                let overhead = 8 * 2 + 8 + choose_bm_space(dev);
                (dev & !7).checked_sub(overhead)
            }
            _ => dev.checked_sub(data_offset),
        };
        let mut free_kib = free_sectors
            .filter(|&s| s >= 24)
            .ok_or(CreateError::DeviceTooSmall { slot, dev_sectors: dev })?
            / 2;
        if chunk_kib != 0 {
            free_kib &= !(u64::from(chunk_kib) - 1);
        }
        if free_kib == 0 {
            return Err(CreateError::DeviceTooSmall { slot, dev_sectors: dev });
        }
        if let Some(size) = p.size_kib {
            if free_kib < size {
                return Err(CreateError::SizeTooLarge { slot, available_kib: free_kib, size_kib: size });
            }
        }
        min_kib = Some(min_kib.map_or(free_kib, |m: u64| m.min(free_kib)));
    }
    let size_kib = match p.size_kib {
        Some(s) => {
            let rounded = if chunk_kib != 0 { s & !(u64::from(chunk_kib) - 1) } else { s };
            if rounded == 0 {
                return Err(CreateError::SizeBelowChunk { size_kib: s, chunk_kib });
            }
            rounded
        }
        // Size is meaningless for raid0/linear: mdadm leaves it 0 there.
        None if p.level > 0 => {
            let mut s = min_kib.unwrap_or(0);
            if p.level == level::RAID1 {
                // Rounded so a later reshape to raid5 finds a chunk multiple.
                s &= !63;
            }
            s
        }
        None => 0,
    };
    let size_sectors = size_kib * 2;

    // Create.c: clean (resync_offset MaxSector) for raid0/linear, --assume-clean, and
    // degraded raid4/5/6 (recovery, not resync, will fill the missing members).
    let redundancy_missing = match p.level {
        level::RAID4 | level::RAID5 | level::RAID6 => missing > 0,
        _ => false,
    };
    let raid45_recover_last =
        matches!(p.level, level::RAID4 | level::RAID5) && !p.assume_clean && missing == 0;
    let clean = p.level <= 0 || p.assume_clean || redundancy_missing || raid45_recover_last;

    let spares = u32::from(raid45_recover_last);
    let max_dev = default_max_dev(p.raid_disks + spares);
    let mut dev_roles = vec![role::SPARE; max_dev as usize];
    let dev_number_of = |slot: usize| -> u32 {
        if raid45_recover_last && slot + 1 == n {
            p.raid_disks
        } else {
            slot as u32
        }
    };
    for (slot, dev) in p.member_dev_sectors.iter().enumerate() {
        if dev.is_some() {
            dev_roles[dev_number_of(slot) as usize] = slot as u16;
        }
    }

    // Bitmap (add_internal_bitmap1 while creating): 8 sectors after the superblock for
    // 1.1/1.2, before the superblock for 1.0; sized from the space choose_bm_space keeps.
    let bitmap_sync_size = if p.level == level::RAID10 {
        let near = u64::from(layout & 0xff);
        let far = u64::from((layout >> 8) & 0xff);
        size_kib * u64::from(p.raid_disks) / (near * far).max(1) * 2
    } else {
        size_sectors
    };
    let bitmap = if p.bitmap {
        // mdadm: room = choose_bm_space(size) + bblog, less the bblog again.
        let room = choose_bm_space(size_sectors);
        let min_chunk = match p.bitmap_chunk_bytes {
            None => min_bitmap_chunk(bitmap_sync_size, room.min(128 * 2)),
            Some(_) => min_bitmap_chunk(bitmap_sync_size, room),
        }
        .ok_or(CreateError::NoRoomForBitmap)?;
        let chunk = match p.bitmap_chunk_bytes {
            None => min_chunk.max(64 * 1024 * 1024),
            Some(c) if c < min_chunk || !c.is_power_of_two() || c < 512 => {
                return Err(CreateError::BitmapChunkTooSmall { chunk_bytes: c, min_bytes: min_chunk })
            }
            Some(c) => c,
        };
        let offset: i32 = match p.version {
            SuperblockVersion::V1_0 => {
                let bits = bitmap_sync_size * 512 / u64::from(chunk) + 1;
                let room = (bits.div_ceil(8) + BITMAP_SUPER_BYTES as u64).div_ceil(4096) * 8;
                -(room as i32) - 8
            }
            _ => 8,
        };
        let mut sb = BitmapSuper::new(p.set_uuid, bitmap_sync_size, chunk);
        sb.write_behind = p.write_behind;
        Some((sb, offset))
    } else {
        None
    };

    let mut feature_map = 0;
    if bitmap.is_some() {
        feature_map |= feature::BITMAP_OFFSET;
    }
    if p.ppl {
        // mdadm writes PPL; md switches it to MULTIPLE_PPLS itself when the area is large.
        feature_map |= feature::PPL;
    }
    // write_init_super1: raid0 needs an explicit layout only when members differ in
    // whole chunks (more than one zone).
    if p.level == level::RAID0 && layout != 0 && chunk_sectors != 0 {
        let mut per_chunk = p.member_dev_sectors.iter().flatten().map(|d| d / u64::from(chunk_sectors));
        if let Some(first) = per_chunk.next() {
            if per_chunk.any(|x| x != first) {
                feature_map |= feature::RAID0_LAYOUT;
            }
        }
    }

    let mut superblocks = Vec::with_capacity(n);
    for (slot, dev) in p.member_dev_sectors.iter().enumerate() {
        let Some(dsize) = *dev else {
            superblocks.push(None);
            continue;
        };
        let (bm_space, bm_offset): (u64, i64) = match &bitmap {
            Some((bsb, off)) => (bsb.bytes_on_disk(4096) >> 9, i64::from(*off)),
            None if p.ppl => (ppl_sectors, 8),
            None => (choose_bm_space(size_sectors), 8),
        };
        let mut sb = Superblock {
            magic: MD_SB_MAGIC,
            major_version: 1,
            feature_map,
            pad0: 0,
            set_uuid: p.set_uuid,
            set_name: make_set_name(p.homehost.as_deref(), &p.name),
            ctime: p.ctime_seconds,
            level: p.level,
            layout,
            size: size_sectors,
            chunksize: chunk_sectors,
            raid_disks: p.raid_disks,
            bitmap_offset: if p.ppl {
                ppl_word(8, PPL_AREA_SECTORS_SUPER1)
            } else {
                bitmap.as_ref().map_or(0, |(_, o)| *o)
            },
            new_level: 0,
            reshape_position: 0,
            delta_disks: 0,
            new_layout: 0,
            new_chunk: 0,
            new_offset: 0,
            data_offset: 0,
            data_size: 0,
            super_offset: 0,
            recovery_offset: 0,
            dev_number: dev_number_of(slot),
            cnt_corrected_read: 0,
            device_uuid: p.device_uuids[slot],
            devflags: 0,
            bblog_shift: 0,
            bblog_size: 0,
            bblog_offset: 0,
            utime: p.ctime_seconds,
            events: 0,
            resync_offset: if clean { MAX_SECTOR } else { 0 },
            sb_csum: 0,
            max_dev,
            pad3: [0; 32],
            dev_roles: dev_roles.clone(),
        };
        if raid45_recover_last && slot + 1 == n {
            sb.feature_map |= feature::RECOVERY_OFFSET;
            sb.recovery_offset = 0;
        }
        match p.version {
            SuperblockVersion::V1_0 => {
                let mut bm_space = bm_space + 8;
                let sb_offset = (dsize - 16) & !7;
                sb.data_offset = p.data_offset_sectors.unwrap_or(0);
                sb.super_offset = sb_offset;
                if sb_offset < size_sectors + bm_space {
                    bm_space = sb_offset.saturating_sub(size_sectors);
                }
                sb.data_size = sb_offset - bm_space;
                if bm_space >= 8 {
                    sb.bblog_size = 8;
                    sb.bblog_offset = -8;
                }
            }
            SuperblockVersion::V1_1 | SuperblockVersion::V1_2 => {
                let sb_offset = p.version.sb_offset_sectors(dsize).unwrap_or(0);
                sb.super_offset = sb_offset;
                sb.data_offset = data_offset;
                sb.data_size = dsize - data_offset;
                let bm_end = (sb_offset as i64 + bm_offset) as u64 + bm_space;
                if data_offset >= bm_end + 8 {
                    sb.bblog_size = 8;
                    sb.bblog_offset = (bm_offset as u64 + bm_space) as i32;
                } else if data_offset >= sb_offset + 16 {
                    sb.bblog_size = 8;
                    sb.bblog_offset = (data_offset - 8 - sb_offset) as i32;
                }
            }
        }
        sb.update_csum();
        superblocks.push(Some(sb));
    }

    let bitmap = bitmap.map(|(sb, offset)| {
        let bytes = bitmap_bytes_on_disk(sb.sync_size, sb.chunksize, BITMAP_PAGE_BYTES as u64);
        // write_bitmap1 writes ones after the header, --assume-clean or not (md then syncs
        // only set chunks at or after resync_offset and clears the rest lazily, so a crash
        // before it has would resync everything). --assume-clean says every chunk is in
        // sync: no bit is set, and a crash resyncs only what was written since.
        let mut area = vec![if p.assume_clean { 0 } else { 0xff }; bytes as usize];
        area[..BITMAP_SUPER_BYTES].copy_from_slice(&sb.serialize());
        CreatedBitmap { sb, offset_from_sb_sectors: offset, area }
    });

    Ok(CreatedArray { superblocks, bitmap, size_sectors })
}
