//! `struct mdp_superblock_1` (linux include/uapi/linux/raid/md_p.h): parsing with every
//! check of the kernel's `super_1_load`/`super_1_validate`, serialization with
//! `calc_sb_1_csum`, and the three 1.x placements.

use std::fmt;

/// `MD_SB_MAGIC`.
pub const MD_SB_MAGIC: u32 = 0xa92b_4efc;
/// The kernel reads (and we write) this many bytes at the superblock position.
pub const SB_BYTES: usize = 4096;
/// Size of the fixed part, before `dev_roles`.
pub const SB_FIXED_BYTES: usize = 256;
/// `(4096 - 256) / 2`: the most `dev_roles` entries that fit in the 4 KiB the kernel reads.
pub const MAX_DEV_LIMIT: u32 = ((SB_BYTES - SB_FIXED_BYTES) / 2) as u32;
/// md's `MaxSector`: "no resync needed" in `resync_offset`, "never" elsewhere.
pub const MAX_SECTOR: u64 = u64::MAX;

/// `dev_roles` values above the slot numbers.
pub mod role {
    pub const SPARE: u16 = 0xffff;
    pub const FAULTY: u16 = 0xfffe;
    pub const JOURNAL: u16 = 0xfffd;
    /// Values below this are slot numbers (`MD_DISK_ROLE_MAX`).
    pub const MAX: u16 = 0xff00;
}

/// `devflags` bits.
pub mod devflags {
    pub const WRITE_MOSTLY: u8 = 1;
    pub const FAIL_FAST: u8 = 2;
}

/// `feature_map` bits (`MD_FEATURE_*`).
pub mod feature {
    pub const BITMAP_OFFSET: u32 = 1;
    pub const RECOVERY_OFFSET: u32 = 2;
    pub const RESHAPE_ACTIVE: u32 = 4;
    pub const BAD_BLOCKS: u32 = 8;
    pub const REPLACEMENT: u32 = 16;
    pub const RESHAPE_BACKWARDS: u32 = 32;
    pub const NEW_OFFSET: u32 = 64;
    pub const RECOVERY_BITMAP: u32 = 128;
    pub const CLUSTERED: u32 = 256;
    pub const JOURNAL: u32 = 512;
    pub const PPL: u32 = 1024;
    pub const MULTIPLE_PPLS: u32 = 2048;
    pub const RAID0_LAYOUT: u32 = 4096;
    /// `MD_FEATURE_ALL`: anything else is refused, as the kernel does.
    pub const ALL: u32 = BITMAP_OFFSET
        | RECOVERY_OFFSET
        | RESHAPE_ACTIVE
        | BAD_BLOCKS
        | REPLACEMENT
        | RESHAPE_BACKWARDS
        | NEW_OFFSET
        | RECOVERY_BITMAP
        | CLUSTERED
        | JOURNAL
        | PPL
        | MULTIPLE_PPLS
        | RAID0_LAYOUT;
}

/// md level numbers as stored in `level`.
pub mod level {
    pub const MULTIPATH: i32 = -4;
    pub const LINEAR: i32 = -1;
    pub const RAID0: i32 = 0;
    pub const RAID1: i32 = 1;
    pub const RAID4: i32 = 4;
    pub const RAID5: i32 = 5;
    pub const RAID6: i32 = 6;
    pub const RAID10: i32 = 10;
}

/// Where a 1.x superblock lives on its member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SuperblockVersion {
    /// 1.0: 8..12 KiB before the end of the device, 4 KiB aligned.
    V1_0,
    /// 1.1: at sector 0.
    V1_1,
    /// 1.2: 4 KiB from the start (sector 8). mdadm's default.
    V1_2,
}

impl SuperblockVersion {
    pub fn minor(self) -> u32 {
        match self {
            SuperblockVersion::V1_0 => 0,
            SuperblockVersion::V1_1 => 1,
            SuperblockVersion::V1_2 => 2,
        }
    }

    pub fn from_minor(minor: u32) -> Option<Self> {
        match minor {
            0 => Some(SuperblockVersion::V1_0),
            1 => Some(SuperblockVersion::V1_1),
            2 => Some(SuperblockVersion::V1_2),
            _ => None,
        }
    }

    /// `sb_start` of `super_1_load`; `None` when a 1.0 device is too small to hold one.
    pub fn sb_offset_sectors(self, dev_sectors: u64) -> Option<u64> {
        match self {
            SuperblockVersion::V1_0 => dev_sectors.checked_sub(16).map(|s| s & !7),
            SuperblockVersion::V1_1 => Some(0),
            SuperblockVersion::V1_2 => Some(8),
        }
    }
}

impl fmt::Display for SuperblockVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor())
    }
}

/// Every field of `struct mdp_superblock_1`, in on-disk order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub magic: u32,
    pub major_version: u32,
    pub feature_map: u32,
    pub pad0: u32,
    pub set_uuid: [u8; 16],
    /// NUL-padded; mdadm writes "homehost:name".
    pub set_name: [u8; 32],
    /// Low 40 bits seconds, high 24 bits microseconds.
    pub ctime: u64,
    pub level: i32,
    pub layout: u32,
    /// Used sectors of each member (md's `dev_sectors`); 0 for raid0/linear.
    pub size: u64,
    pub chunksize: u32,
    pub raid_disks: u32,
    /// Signed sectors from the superblock. Shares its bytes with `ppl.offset`/`ppl.size`
    /// when a PPL feature bit is set (see [`Superblock::ppl_offset`]).
    pub bitmap_offset: i32,
    pub new_level: u32,
    pub reshape_position: u64,
    pub delta_disks: i32,
    pub new_layout: u32,
    pub new_chunk: u32,
    pub new_offset: i32,
    pub data_offset: u64,
    pub data_size: u64,
    pub super_offset: u64,
    /// Also `journal_tail` on a journal device.
    pub recovery_offset: u64,
    pub dev_number: u32,
    pub cnt_corrected_read: u32,
    pub device_uuid: [u8; 16],
    pub devflags: u8,
    pub bblog_shift: u8,
    pub bblog_size: u16,
    pub bblog_offset: i32,
    pub utime: u64,
    pub events: u64,
    pub resync_offset: u64,
    pub sb_csum: u32,
    pub max_dev: u32,
    pub pad3: [u8; 32],
    /// `max_dev` entries, indexed by `dev_number`.
    pub dev_roles: Vec<u16>,
}

/// Why a superblock was refused. Each message says what was wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuperblockError {
    Truncated { len: usize, needed: usize },
    BadMagic { found: u32 },
    BadMajorVersion { found: u32 },
    MaxDevTooLarge { max_dev: u32 },
    SuperOffsetMismatch { found: u64, expected: u64 },
    UnknownFeatures { bits: u32 },
    BadChecksum { stored: u32, computed: u32 },
    DataSizeTooSmall { data_size: u64 },
    NonZeroPadding,
    DataOffsetOverlapsSuperblock { data_offset: u64, min: u64 },
    NewDataOffsetOverlapsSuperblock { new_data_offset: i128, min: u64 },
    DataSizeExceedsDevice { data_size: u64, available: u64 },
    DeviceTooSmall { dev_sectors: u64 },
    Raid0LayoutOnNonRaid0 { level: i32 },
    PplWithBitmapOrJournal,
    PplAndMultiplePpls,
    UnsupportedLevel { level: i32 },
    ZeroRaidDisks,
    TooFewRaidDisks { level: i32, raid_disks: u32, min: u32 },
    RaidDisksExceedMaxDev { raid_disks: u32, max_dev: u32 },
    BadChunk { level: i32, chunk_sectors: u32 },
    BadLayout { level: i32, layout: u32 },
    SizeExceedsDataSize { size: u64, data_size: u64 },
    BadBlockLog { bblog_size: u16, bblog_offset: i32 },
    BitmapOffsetZero,
}

impl fmt::Display for SuperblockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use SuperblockError::*;
        match self {
            Truncated { len, needed } => write!(
                f,
                "superblock buffer is {len} bytes, {needed} needed: the member is truncated \
                 or the read was short; check the device size"
            ),
            BadMagic { found } => write!(
                f,
                "no md superblock (magic {found:#010x}, expected {MD_SB_MAGIC:#010x}): this is \
                 not an md 1.x member at this offset; check the metadata version (1.0/1.1/1.2) \
                 or the device"
            ),
            BadMajorVersion { found } => write!(
                f,
                "superblock major version {found} is not 1: only 1.x metadata is supported \
                 (0.90 and external metadata are not)"
            ),
            MaxDevTooLarge { max_dev } => write!(
                f,
                "max_dev {max_dev} exceeds {MAX_DEV_LIMIT}, so dev_roles cannot fit in 4 KiB: \
                 the superblock is corrupted"
            ),
            SuperOffsetMismatch { found, expected } => write!(
                f,
                "super_offset says sector {found} but the superblock was read at sector \
                 {expected}: wrong metadata version for this device, or a copied image; \
                 try another 1.x version"
            ),
            UnknownFeatures { bits } => {
                write!(f, "unknown feature bits {bits:#x}: written by a newer md; refusing to touch it")
            }
            BadChecksum { stored, computed } => write!(
                f,
                "superblock checksum mismatch (stored {stored:#010x}, computed \
                 {computed:#010x}): the superblock is corrupted; leave this member out and, once \
                 the array runs, add it back so it is rebuilt (`uraid add MEMBER --control SOCKET`)"
            ),
            DataSizeTooSmall { data_size } => {
                write!(f, "data_size {data_size} sectors is below md's minimum of 10: corrupted superblock")
            }
            NonZeroPadding => write!(
                f,
                "reserved padding (pad0/pad3) is not zero, which may be a feature this version \
                 does not know: refusing the superblock"
            ),
            DataOffsetOverlapsSuperblock { data_offset, min } => write!(
                f,
                "data_offset {data_offset} overlaps the superblock (must be >= {min}): \
                 corrupted superblock"
            ),
            NewDataOffsetOverlapsSuperblock { new_data_offset, min } => write!(
                f,
                "reshape new data offset {new_data_offset} overlaps the superblock (must be \
                 >= {min}): corrupted superblock"
            ),
            DataSizeExceedsDevice { data_size, available } => write!(
                f,
                "data_size {data_size} sectors does not fit: only {available} sectors after \
                 data_offset; the member is smaller than when the array was made (truncated \
                 image or wrong device)"
            ),
            DeviceTooSmall { dev_sectors } => {
                write!(f, "device of {dev_sectors} sectors is too small to hold a 1.x superblock")
            }
            Raid0LayoutOnNonRaid0 { level } => {
                write!(f, "RAID0_LAYOUT feature set on a level {level} array: corrupted superblock")
            }
            PplWithBitmapOrJournal => {
                write!(f, "PPL is set together with a bitmap or a journal, which md refuses")
            }
            PplAndMultiplePpls => write!(f, "both PPL and MULTIPLE_PPLS are set, which md refuses"),
            UnsupportedLevel { level } => {
                write!(f, "raid level {level} is not supported (linear, 0, 1, 4, 5, 6 and 10 are)")
            }
            ZeroRaidDisks => write!(f, "raid_disks is 0: corrupted superblock"),
            TooFewRaidDisks { level, raid_disks, min } => write!(
                f,
                "raid level {level} needs at least {min} raid disks, the superblock says \
                 {raid_disks}"
            ),
            RaidDisksExceedMaxDev { raid_disks, max_dev } => {
                write!(f, "raid_disks {raid_disks} exceeds max_dev {max_dev}: corrupted superblock")
            }
            BadChunk { level, chunk_sectors } => write!(
                f,
                "chunk of {chunk_sectors} sectors is not valid for raid level {level} (md needs \
                 a power of two of at least 4 KiB for raid4/5/6/10 and a non-zero chunk for \
                 raid0): corrupted superblock"
            ),
            BadLayout { level, layout } => write!(
                f,
                "layout {layout:#x} is not valid for raid level {level}: corrupted superblock \
                 or a layout this version does not know"
            ),
            SizeExceedsDataSize { size, data_size } => write!(
                f,
                "component size {size} sectors exceeds this member's data_size {data_size}: \
                 the member is too small for the array"
            ),
            BadBlockLog { bblog_size, bblog_offset } => write!(
                f,
                "bad-block log of {bblog_size} sectors at offset {bblog_offset} is invalid \
                 (md allows at most 8 sectors at a non-zero offset): corrupted superblock"
            ),
            BitmapOffsetZero => write!(
                f,
                "bitmap feature set with bitmap_offset 0, which would overlay the superblock: \
                 corrupted superblock"
            ),
        }
    }
}

impl std::error::Error for SuperblockError {}

fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// `calc_sb_1_csum` over `256 + 2 * max_dev` bytes of `buf`, with `sb_csum` taken as 0.
/// `max_dev` must already be bounded so the range lies inside `buf`.
pub fn calc_sb_1_csum(buf: &[u8], max_dev: u32) -> u32 {
    let size = SB_FIXED_BYTES + 2 * max_dev as usize;
    let mut sum: u64 = 0;
    let mut off = 0;
    while off + 4 <= size {
        if off != 216 {
            sum += u64::from(le32(buf, off));
        }
        off += 4;
    }
    if size - off == 2 {
        sum += u64::from(le16(buf, off));
    }
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

/// Kernel level checks that make a geometry impossible to run; shared by parse and create.
pub(crate) fn check_geometry(
    level: i32,
    raid_disks: u32,
    layout: u32,
    chunk_sectors: u32,
) -> Result<(), SuperblockError> {
    if raid_disks == 0 {
        return Err(SuperblockError::ZeroRaidDisks);
    }
    let pow2_min_4k = chunk_sectors >= 8 && chunk_sectors.is_power_of_two();
    match level {
        level::LINEAR | level::RAID1 => {}
        level::RAID0 => {
            // raid0 handles any chunk (sector_div), but not none.
            if chunk_sectors == 0 {
                return Err(SuperblockError::BadChunk { level, chunk_sectors });
            }
        }
        level::RAID4 | level::RAID5 | level::RAID6 => {
            if !pow2_min_4k {
                return Err(SuperblockError::BadChunk { level, chunk_sectors });
            }
            let layout_ok = match level {
                // raid4 ignores the algorithm; raid5: algorithm_valid_raid5.
                level::RAID4 => true,
                level::RAID5 => layout <= 5,
                // algorithm_valid_raid6
                _ => layout <= 5 || (8..=10).contains(&layout) || (16..=20).contains(&layout),
            };
            if !layout_ok {
                return Err(SuperblockError::BadLayout { level, layout });
            }
            let min = if level == level::RAID6 { 4 } else { 2 };
            if raid_disks < min {
                return Err(SuperblockError::TooFewRaidDisks { level, raid_disks, min });
            }
        }
        level::RAID10 => {
            if !pow2_min_4k {
                return Err(SuperblockError::BadChunk { level, chunk_sectors });
            }
            // raid10 setup_geo: layout >> 19 must be 0, and far-set modes 0..=2.
            let near = layout & 0xff;
            let far = (layout >> 8) & 0xff;
            if layout >> 19 != 0 || (layout >> 17) > 2 || near == 0 || far == 0 {
                return Err(SuperblockError::BadLayout { level, layout });
            }
            if near * far > raid_disks {
                return Err(SuperblockError::BadLayout { level, layout });
            }
        }
        _ => return Err(SuperblockError::UnsupportedLevel { level }),
    }
    Ok(())
}

impl Superblock {
    /// Parses and checks the superblock read at `expected_sb_offset_sectors`. Offsets 0 and 8
    /// are taken as 1.1/1.2 (data must lie after the superblock), others as 1.0.
    /// Checks that need the device size are in [`Superblock::check_fits_device`].
    pub fn parse(buf: &[u8], expected_sb_offset_sectors: u64) -> Result<Self, SuperblockError> {
        let minor = match expected_sb_offset_sectors {
            0 => 1,
            8 => 2,
            _ => 0,
        };
        Self::parse_inner(buf, expected_sb_offset_sectors, minor)
    }

    /// Parses the superblock of `version` read from a device of `dev_sectors`, with every
    /// check including the device-size ones.
    pub fn parse_member(
        buf: &[u8],
        version: SuperblockVersion,
        dev_sectors: u64,
    ) -> Result<Self, SuperblockError> {
        let sb_start =
            version.sb_offset_sectors(dev_sectors).ok_or(SuperblockError::DeviceTooSmall { dev_sectors })?;
        let sb = Self::parse_inner(buf, sb_start, version.minor())?;
        sb.check_fits_device(version, dev_sectors)?;
        Ok(sb)
    }

    fn parse_inner(buf: &[u8], sb_start: u64, minor: u32) -> Result<Self, SuperblockError> {
        use SuperblockError as E;
        if buf.len() < SB_FIXED_BYTES {
            return Err(E::Truncated { len: buf.len(), needed: SB_BYTES });
        }
        let magic = le32(buf, 0);
        if magic != MD_SB_MAGIC {
            return Err(E::BadMagic { found: magic });
        }
        let major_version = le32(buf, 4);
        if major_version != 1 {
            return Err(E::BadMajorVersion { found: major_version });
        }
        let max_dev = le32(buf, 220);
        if max_dev > MAX_DEV_LIMIT {
            return Err(E::MaxDevTooLarge { max_dev });
        }
        let sb_bytes = SB_FIXED_BYTES + 2 * max_dev as usize;
        if buf.len() < sb_bytes {
            return Err(E::Truncated { len: buf.len(), needed: sb_bytes });
        }
        let super_offset = le64(buf, 144);
        if super_offset != sb_start {
            return Err(E::SuperOffsetMismatch { found: super_offset, expected: sb_start });
        }
        let feature_map = le32(buf, 8);
        if feature_map & !feature::ALL != 0 {
            return Err(E::UnknownFeatures { bits: feature_map & !feature::ALL });
        }
        let sb_csum = le32(buf, 216);
        let computed = calc_sb_1_csum(buf, max_dev);
        if computed != sb_csum {
            return Err(E::BadChecksum { stored: sb_csum, computed });
        }
        let mut pad3 = [0u8; 32];
        pad3.copy_from_slice(&buf[224..256]);
        let sb = Superblock {
            magic,
            major_version,
            feature_map,
            pad0: le32(buf, 12),
            set_uuid: buf[16..32].try_into().unwrap(),
            set_name: buf[32..64].try_into().unwrap(),
            ctime: le64(buf, 64),
            level: le32(buf, 72) as i32,
            layout: le32(buf, 76),
            size: le64(buf, 80),
            chunksize: le32(buf, 88),
            raid_disks: le32(buf, 92),
            bitmap_offset: le32(buf, 96) as i32,
            new_level: le32(buf, 100),
            reshape_position: le64(buf, 104),
            delta_disks: le32(buf, 112) as i32,
            new_layout: le32(buf, 116),
            new_chunk: le32(buf, 120),
            new_offset: le32(buf, 124) as i32,
            data_offset: le64(buf, 128),
            data_size: le64(buf, 136),
            super_offset,
            recovery_offset: le64(buf, 152),
            dev_number: le32(buf, 160),
            cnt_corrected_read: le32(buf, 164),
            device_uuid: buf[168..184].try_into().unwrap(),
            devflags: buf[184],
            bblog_shift: buf[185],
            bblog_size: le16(buf, 186),
            bblog_offset: le32(buf, 188) as i32,
            utime: le64(buf, 192),
            events: le64(buf, 200),
            resync_offset: le64(buf, 208),
            sb_csum,
            max_dev,
            pad3,
            dev_roles: (0..max_dev as usize).map(|i| le16(buf, SB_FIXED_BYTES + 2 * i)).collect(),
        };
        sb.check_fields(minor)?;
        Ok(sb)
    }

    /// The checks of `super_1_load`/`super_1_validate` after the checksum, plus the
    /// geometry the personalities would refuse at run time.
    fn check_fields(&self, minor: u32) -> Result<(), SuperblockError> {
        use SuperblockError as E;
        if self.data_size < 10 {
            return Err(E::DataSizeTooSmall { data_size: self.data_size });
        }
        if self.pad0 != 0 || self.pad3.iter().any(|&b| b != 0) {
            return Err(E::NonZeroPadding);
        }
        if minor != 0 {
            let min = self.super_offset + self.sb_size_bytes() / 512;
            if self.data_offset < min {
                return Err(E::DataOffsetOverlapsSuperblock { data_offset: self.data_offset, min });
            }
            let new_data_offset = self.new_data_offset();
            if new_data_offset < i128::from(min) {
                return Err(E::NewDataOffsetOverlapsSuperblock { new_data_offset, min });
            }
        }
        if self.has(feature::BAD_BLOCKS) && (self.bblog_size > 8 || self.bblog_offset == 0) {
            return Err(E::BadBlockLog { bblog_size: self.bblog_size, bblog_offset: self.bblog_offset });
        }
        if self.has(feature::RAID0_LAYOUT) && self.level != level::RAID0 {
            return Err(E::Raid0LayoutOnNonRaid0 { level: self.level });
        }
        if self.feature_map & (feature::PPL | feature::MULTIPLE_PPLS) != 0 {
            if self.feature_map & (feature::BITMAP_OFFSET | feature::JOURNAL) != 0 {
                return Err(E::PplWithBitmapOrJournal);
            }
            if self.has(feature::PPL) && self.has(feature::MULTIPLE_PPLS) {
                return Err(E::PplAndMultiplePpls);
            }
        } else if self.has(feature::BITMAP_OFFSET) && self.bitmap_offset == 0 {
            return Err(E::BitmapOffsetZero);
        }
        check_geometry(self.level, self.raid_disks, self.layout, self.chunksize)?;
        if self.raid_disks > self.max_dev {
            return Err(E::RaidDisksExceedMaxDev { raid_disks: self.raid_disks, max_dev: self.max_dev });
        }
        if self.level >= 1 && self.size > self.data_size {
            return Err(E::SizeExceedsDataSize { size: self.size, data_size: self.data_size });
        }
        Ok(())
    }

    /// `super_1_load`'s last check: data_size fits between data_offset and the end of the
    /// device (1.1/1.2) or before the superblock (1.0).
    pub fn check_fits_device(
        &self,
        version: SuperblockVersion,
        dev_sectors: u64,
    ) -> Result<(), SuperblockError> {
        let available = match version {
            SuperblockVersion::V1_0 => self.super_offset,
            _ => dev_sectors.saturating_sub(self.data_offset),
        };
        if available < self.data_size {
            return Err(SuperblockError::DataSizeExceedsDevice { data_size: self.data_size, available });
        }
        if version == SuperblockVersion::V1_0
            && self.data_offset.saturating_add(self.data_size) > self.super_offset
        {
            return Err(SuperblockError::DataSizeExceedsDevice {
                data_size: self.data_size,
                available: self.super_offset.saturating_sub(self.data_offset),
            });
        }
        Ok(())
    }

    pub fn has(&self, bit: u32) -> bool {
        self.feature_map & bit != 0
    }

    /// `rdev->sb_size` for 512-byte logical blocks: `256 + 2 * max_dev` rounded up to 512.
    pub fn sb_size_bytes(&self) -> u64 {
        (SB_FIXED_BYTES as u64 + 2 * u64::from(self.max_dev)).div_ceil(512) * 512
    }

    /// The array's own fields taken from `fresh` (the freshest superblock): md's
    /// super_1_sync writes them from the array (mddev), never from the member's old
    /// superblock, so a member that missed a round (a reshape's start or end) records the
    /// array as it is from its next round on. Its offsets are the caller's.
    pub fn take_array_fields(&mut self, fresh: &Superblock) {
        const RESHAPE: u32 = feature::RESHAPE_ACTIVE | feature::RESHAPE_BACKWARDS;
        self.level = fresh.level;
        self.layout = fresh.layout;
        self.size = fresh.size;
        self.chunksize = fresh.chunksize;
        self.raid_disks = fresh.raid_disks;
        self.feature_map = (self.feature_map & !RESHAPE) | (fresh.feature_map & RESHAPE);
        self.reshape_position = fresh.reshape_position;
        self.new_level = fresh.new_level;
        self.delta_disks = fresh.delta_disks;
        self.new_layout = fresh.new_layout;
        self.new_chunk = fresh.new_chunk;
    }

    /// Where this member's data starts now and after the reshape, and its data size (md's
    /// rdev data_offset, new_data_offset, sectors): `NEW_OFFSET` only while a reshape moves
    /// the data.
    pub fn set_offsets(&mut self, data_offset: u64, data_size: u64, new_data_offset: u64) {
        self.data_offset = data_offset;
        self.data_size = data_size;
        let moved = i128::from(new_data_offset) - i128::from(data_offset);
        match i32::try_from(moved) {
            Ok(d) if d != 0 && self.has(feature::RESHAPE_ACTIVE) => {
                self.feature_map |= feature::NEW_OFFSET;
                self.new_offset = d;
            }
            _ => {
                self.feature_map &= !feature::NEW_OFFSET;
                self.new_offset = 0;
            }
        }
    }

    /// A reshape is recorded and has not moved a stripe yet: `reshape_position` where md
    /// starts it, 0 forwards, the array's end backwards (`raid5_size` of the array; md
    /// reshapes backwards only with the same members, see RESHAPE_BACKWARDS).
    pub fn reshape_not_begun(&self) -> bool {
        if !self.has(feature::RESHAPE_ACTIVE) {
            return false;
        }
        if !self.has(feature::RESHAPE_BACKWARDS) {
            return self.reshape_position == 0;
        }
        let chunk = u64::from(self.chunksize.max(self.new_chunk).max(1));
        let parity = if self.level == 6 { 2 } else { 1 };
        let data = u64::from(self.raid_disks).saturating_sub(parity);
        self.reshape_position == (self.size & !(chunk - 1)) * data
    }

    /// data_offset after a reshape that moves the data (`NEW_OFFSET`), else data_offset.
    pub fn new_data_offset(&self) -> i128 {
        let mut off = i128::from(self.data_offset);
        if self.has(feature::RESHAPE_ACTIVE) && self.has(feature::NEW_OFFSET) {
            off += i128::from(self.new_offset);
        }
        off
    }

    /// The role of this member: `dev_roles[dev_number]`, or spare when out of range
    /// (as `super_1_validate`).
    /// The dev_number a device joining this array takes (by `add`, or new to it in a
    /// grow): md's bind_rdev_to_array on a running array, the first from raid_disks up that
    /// no device holds (`used`). Also skipped: a number dev_roles lists as a member or
    /// faulty (a failed member not yet removed keeps its entry; md skips it while the
    /// device is still bound, and its entry must not be overwritten when it is not).
    pub fn free_dev_number(&self, used: &[u32]) -> u32 {
        let listed = |n: u32| self.dev_roles.get(n as usize).is_some_and(|&r| r != role::SPARE);
        (self.raid_disks..).find(|&n| !used.contains(&n) && !listed(n)).unwrap_or(self.raid_disks)
    }

    pub fn role(&self) -> u16 {
        self.dev_roles.get(self.dev_number as usize).copied().unwrap_or(role::SPARE)
    }

    /// Slot of this member when its role is an active slot.
    pub fn slot(&self) -> Option<u32> {
        let r = self.role();
        (r < role::MAX).then_some(u32::from(r))
    }

    /// `set_name` up to the first NUL, lossily decoded.
    pub fn name(&self) -> String {
        let end = self.set_name.iter().position(|&b| b == 0).unwrap_or(32);
        String::from_utf8_lossy(&self.set_name[..end]).into_owned()
    }

    /// Absolute sector of the bitmap superblock when the array has an internal bitmap.
    pub fn bitmap_sector(&self) -> Option<u64> {
        if !self.has(feature::BITMAP_OFFSET) || self.bitmap_offset == 0 {
            return None;
        }
        self.super_offset.checked_add_signed(i64::from(self.bitmap_offset))
    }

    /// PPL offset (signed sectors from the superblock), sharing bytes with bitmap_offset.
    pub fn ppl_offset(&self) -> i16 {
        (self.bitmap_offset as u32 & 0xffff) as u16 as i16
    }

    /// PPL size in sectors.
    pub fn ppl_size(&self) -> u16 {
        (self.bitmap_offset as u32 >> 16) as u16
    }

    /// Bytes 0..4096 as the superblock is stored, with `sb_csum` recomputed.
    /// Bytes past `dev_roles` are zero.
    pub fn serialize(&self) -> [u8; SB_BYTES] {
        let mut b = [0u8; SB_BYTES];
        self.write_fields(&mut b);
        let max_dev = self.max_dev.min(MAX_DEV_LIMIT);
        let csum = calc_sb_1_csum(&b, max_dev);
        b[216..220].copy_from_slice(&csum.to_le_bytes());
        b
    }

    /// Like [`Superblock::serialize`], and stores the checksum in `self.sb_csum` too.
    pub fn update_csum(&mut self) -> [u8; SB_BYTES] {
        let b = self.serialize();
        self.sb_csum = le32(&b, 216);
        b
    }

    fn write_fields(&self, b: &mut [u8; SB_BYTES]) {
        fn put(b: &mut [u8], off: usize, v: &[u8]) {
            b[off..off + v.len()].copy_from_slice(v);
        }
        put(b, 0, &self.magic.to_le_bytes());
        put(b, 4, &self.major_version.to_le_bytes());
        put(b, 8, &self.feature_map.to_le_bytes());
        put(b, 12, &self.pad0.to_le_bytes());
        put(b, 16, &self.set_uuid);
        put(b, 32, &self.set_name);
        put(b, 64, &self.ctime.to_le_bytes());
        put(b, 72, &self.level.to_le_bytes());
        put(b, 76, &self.layout.to_le_bytes());
        put(b, 80, &self.size.to_le_bytes());
        put(b, 88, &self.chunksize.to_le_bytes());
        put(b, 92, &self.raid_disks.to_le_bytes());
        put(b, 96, &self.bitmap_offset.to_le_bytes());
        put(b, 100, &self.new_level.to_le_bytes());
        put(b, 104, &self.reshape_position.to_le_bytes());
        put(b, 112, &self.delta_disks.to_le_bytes());
        put(b, 116, &self.new_layout.to_le_bytes());
        put(b, 120, &self.new_chunk.to_le_bytes());
        put(b, 124, &self.new_offset.to_le_bytes());
        put(b, 128, &self.data_offset.to_le_bytes());
        put(b, 136, &self.data_size.to_le_bytes());
        put(b, 144, &self.super_offset.to_le_bytes());
        put(b, 152, &self.recovery_offset.to_le_bytes());
        put(b, 160, &self.dev_number.to_le_bytes());
        put(b, 164, &self.cnt_corrected_read.to_le_bytes());
        put(b, 168, &self.device_uuid);
        b[184] = self.devflags;
        b[185] = self.bblog_shift;
        put(b, 186, &self.bblog_size.to_le_bytes());
        put(b, 188, &self.bblog_offset.to_le_bytes());
        put(b, 192, &self.utime.to_le_bytes());
        put(b, 200, &self.events.to_le_bytes());
        put(b, 208, &self.resync_offset.to_le_bytes());
        put(b, 216, &self.sb_csum.to_le_bytes());
        put(b, 220, &self.max_dev.to_le_bytes());
        put(b, 224, &self.pad3);
        let max_dev = self.max_dev.min(MAX_DEV_LIMIT) as usize;
        for i in 0..max_dev {
            let r = self.dev_roles.get(i).copied().unwrap_or(role::SPARE);
            put(b, SB_FIXED_BYTES + 2 * i, &r.to_le_bytes());
        }
    }
}

/// Formats a 16-byte uuid as mdadm prints it (`xxxxxxxx:xxxxxxxx:xxxxxxxx:xxxxxxxx`).
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(35);
    for (i, b) in uuid.iter().enumerate() {
        if i > 0 && i % 4 == 0 {
            s.push(':');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Parses mdadm's uuid notation (colons, dashes or none).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s.bytes().filter(|c| !matches!(c, b':' | b'-' | b'.' | b' ')).collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}
