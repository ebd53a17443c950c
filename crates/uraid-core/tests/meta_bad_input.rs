//! Bad input never panics: truncated, zeroed, corrupted and crafted superblocks and
//! bitmaps come back as errors that say what is wrong.

use uraid_core::meta::*;

const DEV_SECTORS: u64 = 32768;

fn good() -> Superblock {
    let mut p = CreateParams::new(5, vec![Some(DEV_SECTORS); 4]);
    p.name = "t".into();
    p.homehost = Some("h".into());
    p.set_uuid = [7; 16];
    p.device_uuids = (0..4).map(|i| [i as u8; 16]).collect();
    p.bitmap = true;
    create_array(&p).unwrap().superblocks[0].clone().unwrap()
}

fn parse(buf: &[u8]) -> Result<Superblock, SuperblockError> {
    Superblock::parse_member(buf, SuperblockVersion::V1_2, DEV_SECTORS)
}

/// Applies `f` to a good superblock and re-checksums, so the crafted field is what fails.
fn crafted(f: impl FnOnce(&mut Superblock)) -> Result<Superblock, SuperblockError> {
    let mut sb = good();
    f(&mut sb);
    parse(&sb.serialize())
}

#[test]
fn good_superblock_parses() {
    let sb = good();
    assert_eq!(parse(&sb.serialize()).unwrap(), sb);
    assert_eq!(Superblock::parse(&sb.serialize(), 8).unwrap(), sb);
}

#[test]
fn truncated_and_zeroed() {
    let bytes = good().serialize();
    for len in [0, 1, 100, 255, 256, 300, 511] {
        let e = parse(&bytes[..len]).unwrap_err();
        assert!(matches!(e, SuperblockError::Truncated { .. }), "len {len}: {e}");
        assert!(e.to_string().contains("truncated"));
    }
    let e = parse(&[0u8; 4096]).unwrap_err();
    assert!(matches!(e, SuperblockError::BadMagic { found: 0 }));
    assert!(e.to_string().contains("no md superblock"));
}

#[test]
fn every_flipped_bit_in_the_checksummed_area_is_caught() {
    let bytes = good().serialize();
    let sb = good();
    let covered = 256 + 2 * sb.max_dev as usize;
    for byte in 0..covered {
        for bit in 0..8 {
            let mut b = bytes;
            b[byte] ^= 1 << bit;
            assert!(parse(&b).is_err(), "flip at byte {byte} bit {bit} accepted");
        }
    }
    let mut b = bytes;
    b[100] ^= 0x10;
    let e = parse(&b).unwrap_err();
    assert!(matches!(e, SuperblockError::BadChecksum { .. }), "{e}");
    assert!(e.to_string().contains("uraid add MEMBER"), "{e}");
}

#[test]
fn kernel_checks() {
    use SuperblockError as E;
    type Case = (Result<Superblock, E>, fn(&E) -> bool);
    let cases: Vec<Case> = vec![
        (crafted(|s| s.major_version = 0), |e| matches!(e, E::BadMajorVersion { .. })),
        (crafted(|s| s.max_dev = 1921), |e| matches!(e, E::MaxDevTooLarge { .. })),
        (crafted(|s| s.super_offset = 0), |e| matches!(e, E::SuperOffsetMismatch { .. })),
        (
            crafted(|s| s.feature_map |= 1 << 20),
            |e| matches!(e, E::UnknownFeatures { bits } if *bits == 1 << 20),
        ),
        (crafted(|s| s.data_size = 9), |e| matches!(e, E::DataSizeTooSmall { .. })),
        (crafted(|s| s.pad0 = 1), |e| matches!(e, E::NonZeroPadding)),
        (crafted(|s| s.pad3[5] = 1), |e| matches!(e, E::NonZeroPadding)),
        (crafted(|s| s.data_offset = 8), |e| matches!(e, E::DataOffsetOverlapsSuperblock { .. })),
        (crafted(|s| s.data_size = DEV_SECTORS), |e| matches!(e, E::DataSizeExceedsDevice { .. })),
        (crafted(|s| s.feature_map |= feature::RAID0_LAYOUT), |e| {
            matches!(e, E::Raid0LayoutOnNonRaid0 { level: 5 })
        }),
        (crafted(|s| s.feature_map |= feature::PPL), |e| matches!(e, E::PplWithBitmapOrJournal)),
        (
            crafted(|s| {
                s.feature_map = feature::PPL | feature::MULTIPLE_PPLS;
            }),
            |e| matches!(e, E::PplAndMultiplePpls),
        ),
        (crafted(|s| s.raid_disks = 0), |e| matches!(e, E::ZeroRaidDisks)),
        (crafted(|s| s.raid_disks = 129), |e| matches!(e, E::RaidDisksExceedMaxDev { .. })),
        (crafted(|s| s.chunksize = 96), |e| matches!(e, E::BadChunk { .. })),
        (crafted(|s| s.chunksize = 0), |e| matches!(e, E::BadChunk { .. })),
        (crafted(|s| s.chunksize = 4), |e| matches!(e, E::BadChunk { .. })),
        (crafted(|s| s.layout = 9), |e| matches!(e, E::BadLayout { .. })),
        (crafted(|s| s.level = 7), |e| matches!(e, E::UnsupportedLevel { level: 7 })),
        (crafted(|s| s.level = -4), |e| matches!(e, E::UnsupportedLevel { .. })),
        (crafted(|s| s.raid_disks = 1), |e| matches!(e, E::TooFewRaidDisks { .. })),
        (crafted(|s| s.size = s.data_size + 1), |e| matches!(e, E::SizeExceedsDataSize { .. })),
        (
            crafted(|s| {
                s.feature_map |= feature::BAD_BLOCKS;
                s.bblog_size = 9;
            }),
            |e| matches!(e, E::BadBlockLog { .. }),
        ),
        (crafted(|s| s.bitmap_offset = 0), |e| matches!(e, E::BitmapOffsetZero)),
        (
            crafted(|s| {
                s.level = 10;
                s.layout = 0x105;
            }),
            |e| matches!(e, E::BadLayout { level: 10, .. }),
        ),
        (
            crafted(|s| {
                s.level = 10;
                s.layout = 1 << 19 | 0x102;
            }),
            |e| matches!(e, E::BadLayout { .. }),
        ),
        (
            crafted(|s| {
                s.feature_map |= feature::RESHAPE_ACTIVE | feature::NEW_OFFSET;
                s.new_offset = -4090;
            }),
            |e| matches!(e, E::NewDataOffsetOverlapsSuperblock { .. }),
        ),
    ];
    for (i, (res, ok)) in cases.into_iter().enumerate() {
        let e = res.expect_err(&format!("case {i} accepted"));
        assert!(ok(&e), "case {i}: unexpected error {e:?}");
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn odd_max_dev_checksums_the_trailing_half_word() {
    let mut sb = good();
    sb.max_dev = 5;
    sb.dev_roles.truncate(5);
    sb.dev_roles[4] = 3;
    sb.dev_number = 0;
    let bytes = sb.update_csum();
    assert_eq!(parse(&bytes).unwrap(), sb);
    let mut b = bytes;
    b[256 + 8] ^= 1;
    assert!(matches!(parse(&b).unwrap_err(), SuperblockError::BadChecksum { .. }));
}

#[test]
fn version_1_0_and_1_1_placements() {
    assert_eq!(SuperblockVersion::V1_0.sb_offset_sectors(32768), Some(32752));
    assert_eq!(SuperblockVersion::V1_0.sb_offset_sectors(32771), Some(32752));
    assert_eq!(SuperblockVersion::V1_0.sb_offset_sectors(10), None);
    assert_eq!(SuperblockVersion::V1_1.sb_offset_sectors(32768), Some(0));
    assert_eq!(SuperblockVersion::V1_2.sb_offset_sectors(32768), Some(8));
    for version in [SuperblockVersion::V1_0, SuperblockVersion::V1_1] {
        for bitmap in [false, true] {
            let mut p = CreateParams::new(1, vec![Some(DEV_SECTORS); 2]);
            p.version = version;
            p.bitmap = bitmap;
            let c = create_array(&p).unwrap();
            let sb = c.superblocks[0].clone().unwrap();
            let back = Superblock::parse_member(&sb.serialize(), version, DEV_SECTORS)
                .unwrap_or_else(|e| panic!("{version} bitmap {bitmap}: {e}"));
            assert_eq!(back, sb);
            if version == SuperblockVersion::V1_0 {
                assert_eq!(sb.data_offset, 0);
                assert_eq!(sb.super_offset, 32752);
                assert!(sb.data_offset + sb.data_size <= sb.super_offset);
                if bitmap {
                    assert!(sb.bitmap_offset < 0);
                    let bm_start = sb.bitmap_sector().unwrap();
                    assert!(bm_start >= sb.data_size, "bitmap overlaps data");
                }
            } else {
                assert_eq!(sb.super_offset, 0);
            }
        }
    }
}

#[test]
fn random_mutations_never_panic() {
    let base = good().serialize();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let mut b = base;
        let n = 1 + next() % 8;
        for _ in 0..n {
            let at = (next() % 4096) as usize;
            b[at] = next() as u8;
        }
        let len = if next() % 4 == 0 { (next() % 4097) as usize } else { 4096 };
        // Re-checksum half the time so the field checks are reached.
        if next() % 2 == 0 && len >= 256 {
            let max_dev = u32::from_le_bytes(b[220..224].try_into().unwrap());
            if max_dev <= MAX_DEV_LIMIT {
                let c = calc_sb_1_csum(&b, max_dev);
                b[216..220].copy_from_slice(&c.to_le_bytes());
            }
        }
        let dev = next() % (1 << 20);
        let _ = Superblock::parse(&b[..len], next() % 16);
        if let Ok(sb) = Superblock::parse_member(&b[..len], SuperblockVersion::V1_2, dev) {
            let _ = sb.bitmap_sector();
            let _ = sb.name();
            assert_eq!(Superblock::parse_member(&sb.serialize(), SuperblockVersion::V1_2, dev), Ok(sb));
        }
        let _ = BitmapSuper::parse(&b[..len]);
        let _ = BitmapImage::parse(&b[..len]);
    }
}

#[test]
fn bitmap_bad_input() {
    let sb = BitmapSuper::new([1; 16], 30720, 64 << 20);
    let bytes = sb.serialize();
    assert_eq!(BitmapSuper::parse(&bytes).unwrap(), sb);
    assert!(matches!(BitmapSuper::parse(&bytes[..100]), Err(BitmapError::Truncated { .. })));
    assert!(matches!(BitmapSuper::parse(&[0; 256]), Err(BitmapError::BadMagic { .. })));
    let with = |f: fn(&mut BitmapSuper)| {
        let mut s = sb.clone();
        f(&mut s);
        BitmapSuper::parse(&s.serialize())
    };
    assert!(matches!(with(|s| s.version = 6), Err(BitmapError::UnknownVersion { .. })));
    assert!(matches!(with(|s| s.version = 2), Err(BitmapError::UnknownVersion { .. })));
    assert!(with(|s| s.version = 3).is_ok());
    assert!(matches!(with(|s| s.chunksize = 256), Err(BitmapError::ChunkTooSmall { .. })));
    assert!(matches!(with(|s| s.chunksize = 3 << 20), Err(BitmapError::ChunkNotPowerOfTwo { .. })));
    assert!(matches!(with(|s| s.daemon_sleep = 0), Err(BitmapError::DaemonSleepOutOfRange { .. })));
    assert!(matches!(with(|s| s.write_behind = 0x4000), Err(BitmapError::WriteBehindOutOfRange { .. })));
    assert_eq!(sb.check_against_array(&[2; 16], 0), Err(BitmapError::UuidMismatch));
    assert_eq!(sb.check_against_array(&[1; 16], 0), Ok(false));
    assert_eq!(sb.check_against_array(&[1; 16], 1), Ok(true), "behind: stale");
    // A bit array shorter than the bits the header promises.
    let mut s = sb.clone();
    s.chunksize = 4096;
    let e = BitmapImage::parse(&s.serialize()).unwrap_err();
    assert!(matches!(e, BitmapError::Truncated { .. }), "{e}");
    // Huge sync_size never allocates or overflows.
    s.sync_size = u64::MAX;
    s.chunksize = 512;
    assert!(BitmapImage::parse(&s.serialize()).is_err());
}
