//! What assembly reads of one member, from whatever holds it (a file, a block device, a
//! simulated disk, a test's image): the superblock of whichever 1.x placement holds one
//! (1.2 first, mdadm's default), the bitmap area when it has one, and the bad-block log as
//! md's super_1_load reads it. The caller supplies the reads; nothing here writes.

use super::assemble::OfferedMember;
use super::badblocks::BadBlocks;
use super::bitmap::{BitmapSuper, BITMAP_SUPER_BYTES};
use super::superblock::{feature, Superblock, SuperblockError, SuperblockVersion, SB_BYTES};

/// Bitmaps larger than this are not read: md itself keeps them far smaller (128 KiB of
/// reserved space at most), so a bigger one means a corrupted header.
const MAX_BITMAP_BYTES: u64 = 64 << 20;
/// md's largest bad-block log (4 KiB).
const MAX_BBLOG_SECTORS: u16 = 8;

/// One member's metadata as read.
#[derive(Clone, Debug)]
pub struct MemberMetadata {
    pub offered: OfferedMember,
    /// The member's bad-block log: None without a log (or no superblock), an empty set
    /// while the superblock's BAD_BLOCKS bit is clear; Err for a log md would refuse.
    pub bad_blocks: Result<Option<BadBlocks>, String>,
}

/// Reads member `name` of `dev_sectors` through `read(offset_bytes, len)`, which returns
/// what is there (shorter at the device's end, empty on an error).
pub fn read_member(
    name: &str,
    dev_sectors: u64,
    read: &mut dyn FnMut(u64, usize) -> Vec<u8>,
) -> MemberMetadata {
    let mut first_err = None;
    let mut found = None;
    for version in [SuperblockVersion::V1_2, SuperblockVersion::V1_1, SuperblockVersion::V1_0] {
        let Some(at) = version.sb_offset_sectors(dev_sectors) else { continue };
        match Superblock::parse_member(&read(at * 512, SB_BYTES), version, dev_sectors) {
            Ok(sb) => {
                found = Some(Ok(sb));
                break;
            }
            // No magic (or nothing to read) means "look at the next placement"; any other
            // error is a real but damaged superblock, reported as is.
            Err(e @ (SuperblockError::BadMagic { .. } | SuperblockError::Truncated { .. })) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                found = Some(Err(e));
                break;
            }
        }
    }
    let superblock =
        found.unwrap_or_else(|| Err(first_err.unwrap_or(SuperblockError::DeviceTooSmall { dev_sectors })));
    let (bitmap, bad_blocks) = match &superblock {
        Ok(sb) => (read_bitmap(sb, read), read_bad_blocks(name, sb, read)),
        Err(_) => (None, Ok(None)),
    };
    MemberMetadata {
        offered: OfferedMember { name: name.to_string(), dev_sectors, superblock, bitmap },
        bad_blocks,
    }
}

fn read_bitmap(sb: &Superblock, read: &mut dyn FnMut(u64, usize) -> Vec<u8>) -> Option<Vec<u8>> {
    let at = sb.bitmap_sector()? * 512;
    let head = read(at, BITMAP_SUPER_BYTES);
    let len = match BitmapSuper::parse(&head) {
        Ok(bsb) => bsb.bytes_on_disk(512).min(MAX_BITMAP_BYTES),
        // Let the planner report the broken header.
        Err(_) => return Some(head),
    };
    Some(read(at, len as usize))
}

fn read_bad_blocks(
    name: &str,
    sb: &Superblock,
    read: &mut dyn FnMut(u64, usize) -> Vec<u8>,
) -> Result<Option<BadBlocks>, String> {
    let log = match sb.super_offset.checked_add_signed(i64::from(sb.bblog_offset)) {
        Some(at) if sb.has(feature::BAD_BLOCKS) && sb.bblog_size <= MAX_BBLOG_SECTORS => {
            read(at * 512, usize::from(sb.bblog_size) * 512)
        }
        _ => Vec::new(),
    };
    BadBlocks::parse(sb, &log).map_err(|e| format!("{name}: {e}"))
}
