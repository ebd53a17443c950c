//! Arrays made by real Linux md (`../shared/fixtures/md/`): the engine, given each fixture's
//! geometry, must read back exactly the bytes Linux read (the manifest's sha256), the degraded
//! RAID6 included (its stale member left out, so its data is reconstructed).

mod common;

use std::io::Read;
use std::path::PathBuf;

use common::*;
use sha2::{Digest, Sha256};
use uraid_core::geometry::parse_layout;
use uraid_core::*;

pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/md")
}

fn decompress(path: &PathBuf) -> Vec<u8> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    let mut dec = ruzstd::StreamingDecoder::new(std::io::BufReader::new(file)).expect("zstd stream");
    let mut out = Vec::new();
    dec.read_to_end(&mut out).expect("zstd decode");
    out
}

fn chunk_sectors(text: Option<&str>) -> u64 {
    match text {
        Some(t) => t.trim_end_matches('K').parse::<u64>().expect("chunk like 64K") * 2,
        None => 0,
    }
}

#[test]
fn every_fixture_reads_back_as_linux_read_it() {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures_dir().join("manifest.json")).expect("manifest.json"))
            .expect("manifest parses");
    let fixtures = manifest["fixtures"].as_array().expect("fixtures array");
    assert!(fixtures.len() >= 7, "expected the seven fixtures");
    for f in fixtures {
        let name = f["name"].as_str().unwrap();
        let level = Level::from_md_level(f["level"].as_i64().unwrap() as i32).unwrap();
        let slots: Vec<&str> =
            f["members_in_slot_order"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        let stale: Vec<bool> =
            f["members"].as_array().unwrap().iter().map(|m| m["stale"].as_bool().unwrap()).collect();
        let data_offset_sectors: u64 =
            f["data_offset_sectors"].as_str().unwrap().split_whitespace().next().unwrap().parse().unwrap();
        let layout = match (level, f["layout"].as_str()) {
            (Level::Raid0 | Level::Raid1, _) | (_, None) => 0,
            (Level::Raid10, Some(l)) => {
                parse_layout(level, &format!("n{}", l.trim_start_matches("near="))).unwrap()
            }
            (_, Some(l)) => parse_layout(level, l).unwrap(),
        };
        let images: Vec<Vec<u8>> =
            slots.iter().map(|m| decompress(&fixtures_dir().join(name).join(m))).collect();
        let member_sectors = images[0].len() as u64 / 512 - data_offset_sectors;
        let geo = Geometry::new(
            level,
            slots.len(),
            layout,
            chunk_sectors(f["chunk"].as_str()),
            &vec![member_sectors; slots.len()],
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(geo.array_bytes(), f["md_size_bytes"].as_u64().unwrap(), "{name}: array size");
        let mut cfg = config(geo, data_offset_sectors * 512);
        for (slot, &s) in stale.iter().enumerate() {
            if s {
                cfg.members[slot].state = MemberState::Missing;
            }
        }
        let engine = Engine::new(cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut members = MemMembers::new(0, 0);
        members.gone = stale.clone();
        members.images = images;
        let mut d = Driver::new(engine, members, 1);
        let size = d.engine.size_bytes();
        let mut hash = Sha256::new();
        let mut off = 0u64;
        let mut id = 0;
        while off < size {
            let len = (1u64 << 20).min(size - off);
            id += 1;
            let data =
                d.run_one(Request::read(id, off, len)).unwrap_or_else(|e| panic!("{name}: read {off}: {e}"));
            hash.update(&data);
            off += len;
        }
        let got = format!("{:x}", hash.finalize());
        assert_eq!(got, f["md_sha256"].as_str().unwrap(), "{name}: content differs from what Linux md read");
        if stale.iter().any(|&s| s) {
            assert!(d.engine.stats().degraded_reads > 0, "{name}: a degraded array must reconstruct");
        }
    }
}
