//! `uraid bench workload`: one experiment on temporary member files with tiny cells, through
//! the binary. Checks the JSON's shape, the peer ratios, the SVG plot, the clean-up of the
//! temporary members and the refusal of members that carry an md superblock. Speed itself
//! is never asserted.

use std::path::PathBuf;
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/var/tmp" };
    let d = PathBuf::from(base).join(format!("uraid-bench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn workload_runs_on_temp_members_and_plots() {
    let dir = scratch("plot");
    let svg = dir.join("rmw.svg");
    // rmw: RAID6 of 10 members; two block sizes only, 50 ms per cell.
    let out = Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["bench", "workload", "rmw", "--dir"])
        .arg(&dir)
        .args(["--member-size", "32M", "--seconds-per-cell", "0.05", "--bs", "4K,64K", "--json", "--plot"])
        .arg(&svg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["experiment"], "rmw");
    assert_eq!(v["cells_run"], 4, "2 block sizes x rmw_level 0/1");
    assert_eq!(v["members"].as_array().unwrap().len(), 10);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "the whole grid is printed");
    let measured: Vec<&serde_json::Value> =
        rows.iter().filter(|r| r["bsize"] == "4K" || r["bsize"] == "64K").collect();
    assert_eq!(measured.len(), 2);
    for r in &measured {
        assert!(r["rmw_level=1"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["rmw_level=0"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Cells not selected are not measured (null in JSON, "-" in the table).
    let skipped = rows.iter().find(|r| r["bsize"] == "8K").unwrap();
    assert!(skipped["rmw_level=1"].is_null(), "{skipped}");
    // The peer and its ratios, measured in the same run.
    assert!(v["peer"]["name"].as_str().unwrap().contains("rmw_level 0"));
    let ratios = &v["peer"]["ratios"][0]["ratios"];
    let r4 = ratios.as_array().unwrap().iter().find(|r| r["row"] == "4K").unwrap();
    assert!(r4["ratio"].as_f64().unwrap() > 0.0, "{r4}");
    for c in v["claims"].as_array().unwrap() {
        assert!(c["claim"].is_string() && c["holds"].is_boolean() && c["figures"].is_string(), "{c}");
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("rmw_level=1") && plot.contains("<polyline"), "{plot}");
    // The temporary members are gone.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("uraid-bench-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn members_with_an_md_superblock_are_refused_without_force() {
    let dir = scratch("sb");
    let mut paths = Vec::new();
    for i in 0..4 {
        let p = dir.join(format!("m{i}"));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(32 << 20).unwrap();
        paths.push(p);
    }
    // md's superblock 1.2 magic 4 KiB into the first member.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&paths[0]).unwrap();
        f.write_all_at(&0xa92b4efcu32.to_le_bytes(), 4096).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["bench", "workload", "nomerges", "--seconds-per-cell", "0.05", "--members"])
        .args(&paths)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("md superblock"));
    std::fs::remove_dir_all(&dir).unwrap();
}
