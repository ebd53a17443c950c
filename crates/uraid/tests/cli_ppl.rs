//! RAID5 with md's partial parity log (`--consistency-policy ppl`), as far as uraid goes
//! today: create lays it out as mdadm does and examine shows it; `serve` starts such an
//! array but does not write the log yet, so it empties every member's log at start (as md
//! does) — a stale log md left behind must never be replayed over parity uraid changed;
//! real md assembles the result as a PPL array and its check finds parity consistent.

mod common;

use std::path::PathBuf;

use common::*;
use uraid_core::meta::{ppl_area, ppl_signature, PplEntry, PplHeader, Superblock, PPL_HEADER_SIZE};

fn read_sb(p: &PathBuf) -> Superblock {
    let b = std::fs::read(p).unwrap();
    Superblock::parse(&b[4096..8192], 8).unwrap()
}

fn ppl_header(p: &PathBuf) -> (PplHeader, Vec<u8>) {
    let sb = read_sb(p);
    let (start, sectors) = ppl_area(&sb).expect("a PPL area");
    let b = std::fs::read(p).unwrap();
    let area = b[(start * 512) as usize..((start + sectors) * 512) as usize].to_vec();
    (PplHeader::parse(&area, Some(ppl_signature(&sb.set_uuid))).unwrap(), area)
}

#[test]
fn a_ppl_array_is_created_as_mdadm_does_served_with_its_logs_emptied_and_md_assembles_it() {
    let dir = TempDir::new("ppl");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("m{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--chunk", "64", "--size", "16M"];
    args.extend(["--assume-clean", "--consistency-policy", "ppl", "--name", "ppl"]);
    args.extend(paths(&members));
    let out = ok(uraid(&args), "uraid create");
    assert!(out.contains("partial parity log (ppl)"), "{out}");
    let ex = ok(uraid(&["examine", &members[0].display().to_string()]), "uraid examine");
    assert_eq!(mdadm_field(&ex, "PPL").as_deref(), Some("2048 sectors at offset 8 sectors from superblock"));
    assert_eq!(mdadm_field(&ex, "Data Offset").as_deref(), Some("4096 sectors"));
    assert!(ppl_header(&members[2]).0.entries.is_empty(), "create writes an empty log");

    // A log as md leaves it after a run: one entry with its partial parity.
    let sb = read_sb(&members[2]);
    let (start, _) = ppl_area(&sb).unwrap();
    let pp = vec![0x5a; 4096];
    let stale = PplHeader {
        signature: ppl_signature(&sb.set_uuid),
        generation: 7,
        entries: vec![PplEntry {
            data_sector: 16,
            pp_size: 4096,
            data_size: 4096,
            parity_disk: 2,
            checksum: uraid_core::meta::crc32c(&pp),
        }],
    };
    let mut bytes = std::fs::read(&members[2]).unwrap();
    let at = (start * 512) as usize;
    bytes[at..at + PPL_HEADER_SIZE].copy_from_slice(&stale.serialize().unwrap());
    bytes[at + PPL_HEADER_SIZE..at + 2 * PPL_HEADER_SIZE].copy_from_slice(&pp);
    std::fs::write(&members[2], &bytes).unwrap();
    assert_eq!(ppl_header(&members[2]).0.entries.len(), 1);

    let served = Served::start(&dir, &members, &[]);
    let log = served.stop();
    assert!(log.contains("partial parity log"), "serve says the log is not written yet:\n{log}");
    for m in &members {
        let (h, area) = ppl_header(m);
        assert!(h.entries.is_empty(), "{}: the log is emptied at start", m.display());
        assert!(
            area[PPL_HEADER_SIZE..].iter().all(|&b| b == 0),
            "{}: no old partial parity is left",
            m.display()
        );
    }

    let md = md_check(&members);
    assert_eq!(md.mismatch_cnt, 0, "md's check on the PPL array uraid made and served");
}
