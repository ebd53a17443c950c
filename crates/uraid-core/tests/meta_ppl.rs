//! md's partial parity log on disk: a log written by real md parses, checks and writes
//! back byte for byte; `create` lays the PPL area out where mdadm does.

use uraid_core::meta::*;

/// Bytes 4096..16384 of slot 2 of a 3-member RAID5 (64 KiB chunk, 16 MiB images) made by
/// mdadm 4.2 on Linux 6.1 with `--consistency-policy=ppl --assume-clean`, after one 4 KiB
/// O_DIRECT write at array byte 8192 and `mdadm --stop`: the superblock, the PPL header
/// md wrote on the parity member of stripe 0, and the first page of partial parity.
/// mdadm --examine printed "PPL : 2048 sectors at offset 8 sectors from superblock",
/// "Data Offset : 4096 sectors", "Bad Block Log : 512 entries available at offset 2056".
const MD_SLOT2: &[u8] = include_bytes!("fixtures/ppl/md-raid5-3dev-64k-ppl-slot2-sb-ppl.bin");

#[test]
fn a_log_written_by_md_parses_checks_and_writes_back_the_same() {
    let sb = Superblock::parse(&MD_SLOT2[..4096], 8).unwrap();
    // mdadm wrote PPL; md itself switched to MULTIPLE_PPLS for a 1 MiB area.
    assert!(sb.has(feature::MULTIPLE_PPLS) && !sb.has(feature::PPL));
    assert_eq!((sb.ppl_offset(), sb.ppl_size()), (8, 2048));
    assert_eq!(ppl_area(&sb), Some((16, 2048)));
    let header_at = (16 * 512 - 4096) as usize;
    let bytes = &MD_SLOT2[header_at..header_at + PPL_HEADER_SIZE];
    let h = PplHeader::parse(bytes, Some(ppl_signature(&sb.set_uuid))).unwrap();
    assert_eq!(h.generation, 1);
    // The 4 KiB written at array sector 16 lies on data member 0 of stripe 0; parity on 2.
    let pp = &MD_SLOT2[header_at + PPL_HEADER_SIZE..header_at + 2 * PPL_HEADER_SIZE];
    assert_eq!(
        h.entries,
        vec![PplEntry {
            data_sector: 16,
            pp_size: 4096,
            data_size: 4096,
            parity_disk: 2,
            checksum: crc32c(pp)
        }]
    );
    assert_eq!(h.serialize().unwrap().as_slice(), bytes, "uraid writes md's bytes");
    // Another array's log, or a damaged one, is not taken.
    assert!(matches!(
        PplHeader::parse(bytes, Some(ppl_signature(&[0; 16]))),
        Err(PplError::Signature { .. })
    ));
    let mut bad = bytes.to_vec();
    bad[600] ^= 0x10;
    assert!(matches!(PplHeader::parse(&bad, None), Err(PplError::Checksum { .. })));
}

fn raid5_ppl() -> CreateParams {
    let mut p = CreateParams::new(level::RAID5, vec![Some(32768); 3]);
    p.chunk_kib = Some(64);
    p.ppl = true;
    p.assume_clean = true;
    p
}

#[test]
fn create_lays_out_the_ppl_area_as_mdadm_did() {
    let md = Superblock::parse(&MD_SLOT2[..4096], 8).unwrap();
    let c = create_array(&raid5_ppl()).unwrap();
    let sb = c.superblocks[2].clone().unwrap();
    assert!(sb.has(feature::PPL) && !sb.has(feature::BITMAP_OFFSET));
    assert_eq!(sb.bitmap_offset, md.bitmap_offset, "the ppl {{offset, size}} word");
    assert_eq!(
        (sb.data_offset, sb.data_size, sb.size, sb.bblog_offset, sb.bblog_size),
        (md.data_offset, md.data_size, md.size, md.bblog_offset, md.bblog_size)
    );
    assert!(Superblock::parse(&sb.serialize(), 8).is_ok(), "md's load rules accept it");
    // Without ppl the same members keep mdadm's usual layout.
    let mut plain = raid5_ppl();
    plain.ppl = false;
    let plain = create_array(&plain).unwrap().superblocks[0].clone().unwrap();
    assert_eq!((plain.data_offset, plain.bitmap_offset, plain.feature_map & feature::PPL), (2048, 0, 0));
}

#[test]
fn ppl_is_refused_where_md_refuses_it() {
    let mut p = raid5_ppl();
    p.bitmap = true;
    assert_eq!(create_array(&p), Err(CreateError::PplWithBitmap));
    let mut p = CreateParams::new(level::RAID6, vec![Some(32768); 4]);
    p.ppl = true;
    assert_eq!(create_array(&p), Err(CreateError::PplNotRaid5 { level: 6 }));
    let mut p = raid5_ppl();
    p.data_offset_sectors = Some(2048);
    assert_eq!(create_array(&p), Err(CreateError::NoRoomForPpl { data_offset: 2048 }));
    assert!(CreateError::PplWithBitmap.to_string().contains("drop --bitmap"));
}

fn offered(sbs: &[Option<Superblock>]) -> Vec<OfferedMember> {
    sbs.iter()
        .enumerate()
        .filter_map(|(i, sb)| {
            let sb = sb.clone()?;
            Some(OfferedMember {
                name: format!("m{i}"),
                dev_sectors: 32768,
                superblock: Ok(sb),
                bitmap: None,
            })
        })
        .collect()
}

/// md with a partial parity log: a clean array starts with no resync; a dirty one owes a
/// full resync until its log is replayed (md keeps `recovery_cp` when the log gives
/// nothing); a dirty degraded one starts without --force, as mdadm's Assemble counts a
/// PPL array as clean; a replay that recovered entries drops the resync.
#[test]
fn a_dirty_ppl_array_starts_degraded_and_its_replay_drops_the_resync() {
    let mut p = raid5_ppl();
    p.set_uuid = [3; 16];
    p.device_uuids = vec![[1; 16], [2; 16], [4; 16]];
    let mut sbs = create_array(&p).unwrap().superblocks;
    let clean = plan_assembly(&offered(&sbs), &AssembleOptions::default()).unwrap();
    assert_eq!(clean.resync, ResyncNeed::None);
    assert!(clean.warnings.is_empty(), "{:?}", clean.warnings);

    for sb in sbs.iter_mut().flatten() {
        sb.resync_offset = 0;
        sb.update_csum();
    }
    let mut dirty = plan_assembly(&offered(&sbs), &AssembleOptions::default()).unwrap();
    assert_eq!(dirty.resync, ResyncNeed::Full { from_sector: 0 });
    assert!(dirty.warnings.iter().any(|w| w.contains("partial parity log")), "{:?}", dirty.warnings);
    let nothing = PplRecovery::default();
    let msg = dirty.apply_ppl_recovery(&nothing);
    assert!(msg.contains("resync stays owed"), "{msg}");
    assert_eq!(dirty.resync, ResyncNeed::Full { from_sector: 0 });
    let replayed = PplRecovery { recovered_entries: 2, ..PplRecovery::default() };
    let msg = dirty.apply_ppl_recovery(&replayed);
    assert!(msg.contains("no resync needed"), "{msg}");
    assert_eq!((dirty.resync.clone(), dirty.resync_offset), (ResyncNeed::None, MAX_SECTOR));
    let torn = PplRecovery { recovered_entries: 2, mismatch_count: 1, ..PplRecovery::default() };
    let mut again = plan_assembly(&offered(&sbs), &AssembleOptions::default()).unwrap();
    again.apply_ppl_recovery(&torn);
    assert_eq!(again.resync, ResyncNeed::Full { from_sector: 0 }, "an unusable log keeps the resync");

    sbs[1] = None;
    let err = plan_assembly(&offered(&sbs), &AssembleOptions::default()).unwrap_err().to_string();
    assert!(err.contains("--run"), "degraded still needs --run: {err}");
    let opts = AssembleOptions { run: true, ..AssembleOptions::default() };
    let degraded = plan_assembly(&offered(&sbs), &opts).unwrap();
    assert_eq!(degraded.degraded_slots, vec![1]);
    assert!(!degraded.warnings.iter().any(|w| w.contains("forced")), "{:?}", degraded.warnings);
}
