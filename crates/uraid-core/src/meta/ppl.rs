//! md's partial parity log (PPL) for RAID5: the on-disk header and its entries
//! (linux include/uapi/linux/raid/md_p.h `struct ppl_header`, drivers/md/raid5-ppl.c).
//!
//! Each member keeps a PPL area (`sb.ppl.offset`/`sb.ppl.size`, sectors from the
//! superblock). Before a stripe's data and parity go out, md writes to the area of the
//! stripe's parity member a 4 KiB header whose entries name the stripes being written,
//! followed by their partial parity (the XOR of the data that write leaves unchanged).
//! After a crash, parity = partial parity XOR the modified data now on disk, for the
//! logged stripes only, instead of a full resync. Pure and sans-IO, like the rest of
//! `meta`.

use std::fmt;

use super::superblock::{feature, Superblock};

/// Bytes of the header: one page, as md writes it.
pub const PPL_HEADER_SIZE: usize = 4096;
/// Leading bytes of the header md fills with 0xff.
pub const PPL_HDR_RESERVED: usize = 512;
/// Bytes of one `ppl_header_entry`.
pub const PPL_ENTRY_BYTES: usize = 24;
/// md's `PPL_HDR_MAX_ENTRIES`: what fits after the reserved bytes and the fixed fields.
pub const PPL_HDR_MAX_ENTRIES: usize = (PPL_HEADER_SIZE - PPL_HDR_RESERVED - 4 * 4 - 8) / PPL_ENTRY_BYTES;
/// md's `PPL_SPACE_SIZE`: partial parity one header may describe when the area holds
/// several logs (MULTIPLE_PPLS).
pub const PPL_SPACE_SIZE: usize = 128 * 1024;
/// mdadm's `MULTIPLE_PPL_AREA_SIZE_SUPER1` in sectors: the area `--consistency-policy=ppl`
/// reserves after a 1.2 superblock.
pub const PPL_AREA_SECTORS_SUPER1: u16 = (1024 * 1024 / 512) as u16;

const OFF_SIGNATURE: usize = PPL_HDR_RESERVED;
const OFF_GENERATION: usize = OFF_SIGNATURE + 8;
const OFF_ENTRIES_COUNT: usize = OFF_GENERATION + 8;
const OFF_CHECKSUM: usize = OFF_ENTRIES_COUNT + 4;
const OFF_ENTRIES: usize = OFF_CHECKSUM + 4;

/// CRC-32C (Castagnoli, reflected 0x82F63B78), as md's `~crc32c_le(~0, ..)` computes it:
/// initial all-ones, final inversion.
pub fn crc32c(data: &[u8]) -> u32 {
    !crc32c_update(!0, data)
}

/// The raw register update (no inversions), so a checksum can run over several buffers.
pub fn crc32c_update(mut crc: u32, data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// md's PPL signature for native (1.x) metadata: the CRC-32C of the array uuid.
pub fn ppl_signature(set_uuid: &[u8; 16]) -> u32 {
    crc32c(set_uuid)
}

/// One `ppl_header_entry`: a run of consecutive stripes that write the same data members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PplEntry {
    /// First array sector of the modified data (512-byte units for native metadata).
    pub data_sector: u64,
    /// Bytes of partial parity that follow the header for this entry (0 for a full-stripe
    /// write, whose parity is simply recomputed).
    pub pp_size: u32,
    /// Bytes of modified data the entry covers, over all its data members.
    pub data_size: u32,
    /// The member (raid slot) holding the stripe's parity, which is also the one whose
    /// PPL area holds this entry.
    pub parity_disk: u32,
    /// CRC-32C of the entry's partial parity.
    pub checksum: u32,
}

/// A parsed (or to-be-written) PPL header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PplHeader {
    pub signature: u32,
    pub generation: u64,
    pub entries: Vec<PplEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PplError {
    ShortBuffer { len: usize },
    Checksum { stored: u32, computed: u32 },
    Signature { stored: u32, expected: u32 },
    TooManyEntries { count: u32 },
}

impl fmt::Display for PplError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PplError::ShortBuffer { len } => {
                write!(f, "a PPL header is {PPL_HEADER_SIZE} bytes, got {len}")
            }
            PplError::Checksum { stored, computed } => write!(
                f,
                "PPL header checksum does not match (stored {stored:#010x}, computed {computed:#010x})"
            ),
            PplError::Signature { stored, expected } => write!(
                f,
                "PPL header belongs to another array (signature {stored:#010x}, this array's is {expected:#010x})"
            ),
            PplError::TooManyEntries { count } => {
                write!(f, "PPL header claims {count} entries, at most {PPL_HDR_MAX_ENTRIES} fit")
            }
        }
    }
}

impl std::error::Error for PplError {}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl PplHeader {
    /// An empty header, as md writes at the start of an array (`ppl_write_empty_header`).
    pub fn empty(signature: u32) -> Self {
        PplHeader { signature, generation: 0, entries: Vec::new() }
    }

    /// Parses a header, checking its checksum and (when given) the array's signature, as
    /// md's `ppl_load_distributed` does; a header failing either is not used.
    pub fn parse(b: &[u8], expected_signature: Option<u32>) -> Result<PplHeader, PplError> {
        if b.len() < PPL_HEADER_SIZE {
            return Err(PplError::ShortBuffer { len: b.len() });
        }
        let b = &b[..PPL_HEADER_SIZE];
        let stored = le32(b, OFF_CHECKSUM);
        let computed = header_checksum(b);
        if stored != computed {
            return Err(PplError::Checksum { stored, computed });
        }
        let signature = le32(b, OFF_SIGNATURE);
        if let Some(expected) = expected_signature {
            if signature != expected {
                return Err(PplError::Signature { stored: signature, expected });
            }
        }
        let count = le32(b, OFF_ENTRIES_COUNT);
        if count as usize > PPL_HDR_MAX_ENTRIES {
            return Err(PplError::TooManyEntries { count });
        }
        let entries = (0..count as usize)
            .map(|i| {
                let at = OFF_ENTRIES + i * PPL_ENTRY_BYTES;
                PplEntry {
                    data_sector: le64(b, at),
                    pp_size: le32(b, at + 8),
                    data_size: le32(b, at + 12),
                    parity_disk: le32(b, at + 16),
                    checksum: le32(b, at + 20),
                }
            })
            .collect();
        Ok(PplHeader { signature, generation: le64(b, OFF_GENERATION), entries })
    }

    /// The 4 KiB md writes: reserved bytes 0xff, fields little-endian, unused entries
    /// zero, checksum over the whole page with the checksum field zero.
    pub fn serialize(&self) -> Result<[u8; PPL_HEADER_SIZE], PplError> {
        if self.entries.len() > PPL_HDR_MAX_ENTRIES {
            return Err(PplError::TooManyEntries { count: self.entries.len() as u32 });
        }
        let mut b = [0u8; PPL_HEADER_SIZE];
        b[..PPL_HDR_RESERVED].fill(0xff);
        b[OFF_SIGNATURE..OFF_SIGNATURE + 4].copy_from_slice(&self.signature.to_le_bytes());
        b[OFF_GENERATION..OFF_GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        b[OFF_ENTRIES_COUNT..OFF_ENTRIES_COUNT + 4]
            .copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let at = OFF_ENTRIES + i * PPL_ENTRY_BYTES;
            b[at..at + 8].copy_from_slice(&e.data_sector.to_le_bytes());
            b[at + 8..at + 12].copy_from_slice(&e.pp_size.to_le_bytes());
            b[at + 12..at + 16].copy_from_slice(&e.data_size.to_le_bytes());
            b[at + 16..at + 20].copy_from_slice(&e.parity_disk.to_le_bytes());
            b[at + 20..at + 24].copy_from_slice(&e.checksum.to_le_bytes());
        }
        let csum = header_checksum(&b);
        b[OFF_CHECKSUM..OFF_CHECKSUM + 4].copy_from_slice(&csum.to_le_bytes());
        Ok(b)
    }

    /// Bytes of partial parity that follow this header.
    pub fn pp_bytes(&self) -> u64 {
        self.entries.iter().map(|e| u64::from(e.pp_size)).sum()
    }
}

/// CRC-32C of a header page with its checksum field taken as zero.
fn header_checksum(b: &[u8]) -> u32 {
    let crc = crc32c_update(!0, &b[..OFF_CHECKSUM]);
    let crc = crc32c_update(crc, &[0; 4]);
    !crc32c_update(crc, &b[OFF_CHECKSUM + 4..PPL_HEADER_SIZE])
}

/// Where a member's PPL area is, from its superblock: absolute start sector and size in
/// sectors, or `None` when the array has no PPL.
pub fn ppl_area(sb: &Superblock) -> Option<(u64, u64)> {
    if sb.feature_map & (feature::PPL | feature::MULTIPLE_PPLS) == 0 {
        return None;
    }
    let start = sb.super_offset.checked_add_signed(i64::from(sb.ppl_offset()))?;
    Some((start, u64::from(sb.ppl_size())))
}

/// The area as md uses it (`ppl_validate_rdev`): the partial parity space after the
/// header rounded down to whole pages; None when not one page of it fits.
pub fn ppl_usable_sectors(area_sectors: u64) -> Option<u64> {
    let header = (PPL_HEADER_SIZE / 512) as u64;
    let pp = area_sectors.checked_sub(header)? / 8 * 8;
    (pp > 0).then_some(pp + header)
}

/// md's `ppl_init_child_log`: an area that holds two full logs keeps several one after
/// another (MULTIPLE_PPLS), each header describing at most [`PPL_SPACE_SIZE`] of partial
/// parity; a smaller one holds a single log at its start.
pub fn ppl_uses_multiple(area_sectors: u64) -> bool {
    area_sectors * 512 >= 2 * (PPL_SPACE_SIZE + PPL_HEADER_SIZE) as u64
}

/// md's `entry_space`: bytes of partial parity one header may describe in this area.
pub fn ppl_entry_space_bytes(area_sectors: u64) -> u64 {
    if ppl_uses_multiple(area_sectors) {
        PPL_SPACE_SIZE as u64
    } else {
        (area_sectors * 512).saturating_sub(PPL_HEADER_SIZE as u64)
    }
}

/// md's `ppl_load_distributed` scan of one member's area for the newest log: from the
/// area's start, each valid header of this array whose generation does not go down is
/// followed by the next one right after its partial parity; the walk stops at a header
/// that fails its checksum or signature or is older than the one before. Returns the
/// newest header and its offset in sectors from the area's start, or None when even the
/// first header is not valid. `read(offset_sectors)` returns the 4 KiB there.
pub fn latest_ppl_header(
    area_sectors: u64,
    signature: u32,
    read: &mut dyn FnMut(u64) -> Result<Vec<u8>, String>,
) -> Result<Option<(u64, PplHeader)>, String> {
    let header_sectors = (PPL_HEADER_SIZE / 512) as u64;
    let mut newest: Option<(u64, PplHeader)> = None;
    let mut offset = 0u64;
    while offset < area_sectors.saturating_sub(header_sectors) {
        let bytes = read(offset)?;
        let Ok(h) = PplHeader::parse(&bytes, Some(signature)) else { break };
        if newest.as_ref().is_some_and(|(_, prev)| prev.generation > h.generation) {
            break;
        }
        let next = offset + header_sectors + h.pp_bytes() / 512;
        newest = Some((offset, h));
        offset = next;
    }
    Ok(newest)
}

/// The `ppl` union as it sits in the superblock's `bitmap_offset` word.
pub fn ppl_word(offset: i16, size: u16) -> i32 {
    ((u32::from(size) << 16) | u32::from(offset as u16)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_castagnoli_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        // md's entry checksum of one page of zero partial parity (seen in an md-made log).
        assert_eq!(crc32c(&[0u8; 4096]), 0x98F9_4189);
    }

    #[test]
    fn a_header_round_trips_and_a_flipped_bit_is_refused() {
        let h = PplHeader {
            signature: 0x1234_5678,
            generation: 9,
            entries: vec![PplEntry {
                data_sector: 16,
                pp_size: 4096,
                data_size: 4096,
                parity_disk: 2,
                checksum: 7,
            }],
        };
        let mut b = h.serialize().unwrap();
        assert_eq!(PplHeader::parse(&b, Some(0x1234_5678)).unwrap(), h);
        assert!(matches!(PplHeader::parse(&b, Some(1)), Err(PplError::Signature { .. })));
        b[OFF_ENTRIES] ^= 1;
        assert!(matches!(PplHeader::parse(&b, None), Err(PplError::Checksum { .. })));
        assert_eq!(PPL_HDR_MAX_ENTRIES, 148);
    }

    /// md's scan: headers one after another while generations grow; a wrapped log
    /// starts over at the area's start; a torn or foreign header ends the walk.
    #[test]
    fn the_newest_log_is_found_as_md_scans_for_it() {
        let area = 2048u64;
        let sig = 0xabcd_0123;
        let mut img = vec![0u8; (area * 512) as usize];
        let put = |img: &mut Vec<u8>, at: u64, gen: u64, pp_pages: u32| {
            let e = PplEntry {
                data_sector: 0,
                pp_size: pp_pages * 4096,
                data_size: 4096,
                parity_disk: 0,
                checksum: 0,
            };
            let h = PplHeader { signature: sig, generation: gen, entries: vec![e] };
            let at = (at * 512) as usize;
            img[at..at + PPL_HEADER_SIZE].copy_from_slice(&h.serialize().unwrap());
        };
        let scan = |img: &Vec<u8>| {
            latest_ppl_header(area, sig, &mut |off| {
                let at = (off * 512) as usize;
                Ok(img[at..at + PPL_HEADER_SIZE].to_vec())
            })
            .unwrap()
            .map(|(off, h)| (off, h.generation))
        };
        assert_eq!(scan(&img), None, "a zeroed area holds no log");
        put(&mut img, 0, 1, 2);
        put(&mut img, 24, 2, 1);
        put(&mut img, 40, 3, 3);
        assert_eq!(scan(&img), Some((40, 3)));
        // Wrapped: a newer log at the start, an older one right after it.
        put(&mut img, 0, 4, 1);
        put(&mut img, 16, 1, 0);
        assert_eq!(scan(&img), Some((0, 4)), "the walk stops where generations go down");
        // A torn header at the start: md uses nothing from this member.
        img[100] ^= 1;
        assert_eq!(scan(&img), None);
        img[100] ^= 1;
        put(&mut img, 16, 5, 0);
        img[16 * 512 + 600] ^= 1;
        assert_eq!(scan(&img), Some((0, 4)), "a torn later header leaves the one before as newest");
        assert_eq!(ppl_usable_sectors(2048), Some(2048));
        assert_eq!(ppl_usable_sectors(2051), Some(2048));
        assert_eq!(ppl_usable_sectors(8), None);
        assert!(ppl_uses_multiple(2048) && !ppl_uses_multiple(264));
        assert_eq!(ppl_entry_space_bytes(264), 264 * 512 - 4096);
    }
}
