//! Every array Linux md made (`shared/fixtures/md`) assembles under `uraid serve` and
//! reads back, over NBD, exactly what Linux read (the manifest's sha256), the degraded
//! RAID6 included.

mod common;

use std::path::PathBuf;

use common::*;
use sha2::{Digest, Sha256};

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/md")
}

#[test]
fn every_md_fixture_serves_linux_md_content() {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures_dir().join("manifest.json")).expect("manifest.json"))
            .expect("manifest parses");
    let fixtures = manifest["fixtures"].as_array().expect("fixtures");
    assert!(fixtures.len() >= 7);
    for f in fixtures {
        let name = f["name"].as_str().unwrap();
        let dir = TempDir::new(name);
        let mut members = Vec::new();
        for m in f["members_in_slot_order"].as_array().unwrap() {
            let m = m.as_str().unwrap();
            let out = dir.path(m.trim_end_matches(".zst"));
            ok(
                tool(
                    "zstd",
                    &[
                        "-q",
                        "-d",
                        "-f",
                        fixtures_dir().join(name).join(m).to_str().unwrap(),
                        "-o",
                        out.to_str().unwrap(),
                    ],
                ),
                "zstd -d",
            );
            members.push(out);
        }
        // Offered in reverse: order must not matter. Read-only: the fixtures stay as made.
        members.reverse();
        let before: Vec<String> = members.iter().map(|m| sha256_file(m)).collect();
        let served = Served::start(&dir, &members, &["--read-only"]);
        let dump = dir.path("array.raw");
        ok(tool("nbdcopy", &[&served.url, dump.to_str().unwrap()]), "nbdcopy");
        let bytes = std::fs::read(&dump).unwrap();
        assert_eq!(bytes.len() as u64, f["md_size_bytes"].as_u64().unwrap(), "{name}: array size");
        let got = format!("{:x}", Sha256::digest(&bytes));
        assert_eq!(got, f["md_sha256"].as_str().unwrap(), "{name}: content differs from what Linux md read");
        let detail = served.ctl("detail", None);
        if name.contains("degraded") {
            assert!(detail.contains("degraded"), "{name}: {detail}");
        }
        served.stop();
        let after: Vec<String> = members.iter().map(|m| sha256_file(m)).collect();
        assert_eq!(before, after, "{name}: a read-only serve wrote to a member");
    }
}
