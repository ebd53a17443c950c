//! `uraid bench nbd` through the binary, with tiny runs: the rows its JSON holds (the
//! one-connection rows first, as before, then the two-connection rows) and how each
//! two-connection row is divided by the one-connection figure of the same run. Speed
//! itself is never asserted. fio (with its nbd engine) and nbdkit are required.

use std::process::Command;

fn bench_nbd(extra: &[&str]) -> Vec<serde_json::Value> {
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/var/tmp" };
    let out = Command::new(env!("CARGO_BIN_EXE_uraid"))
        .args(["bench", "nbd", "--seconds", "1", "--runs", "1", "--size", "16M", "--job", "randread-4k"])
        .args(["--json", "--dir", base])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "needs fio with its nbd engine and nbdkit; stderr: {stderr}");
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

#[test]
fn two_connection_rows_follow_the_one_connection_rows() {
    let rows = bench_nbd(&[]);
    let key = |r: &serde_json::Value| {
        (
            r["array"].as_str().unwrap().to_string(),
            r["peer"].as_str().unwrap().to_string(),
            r["connections"].as_u64().unwrap(),
            r["iodepth"].as_u64().unwrap(),
        )
    };
    let keys: Vec<_> = rows.iter().map(key).collect();
    let k = |a: &str, p: &str, c, d| (a.to_string(), p.to_string(), c, d);
    assert_eq!(
        keys,
        [
            k("passthrough", "nbdkit", 1, 32),
            k("raid6", "passthrough", 1, 32),
            k("passthrough", "passthrough", 2, 16),
            k("raid6", "raid6", 2, 16),
            k("passthrough", "passthrough", 2, 32),
            k("raid6", "raid6", 2, 32),
        ]
    );
    for r in &rows[2..] {
        let one = rows[..2].iter().find(|o| o["array"] == r["array"]).unwrap();
        assert_eq!(r["peer_iops"], one["iops"], "divided by the same run's one connection: {r}");
        assert_eq!((r["peer_connections"].as_u64(), r["peer_iodepth"].as_u64()), (Some(1), Some(32)));
        let ratio = r["iops"].as_f64().unwrap() / r["peer_iops"].as_f64().unwrap();
        assert!((r["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9, "{r}");
        // Judged only where the total depth equals the one connection's.
        let judged = r["iodepth"].as_u64() == Some(16);
        assert_eq!(r["target"].as_f64(), judged.then_some(1.5), "{r}");
    }
    for r in &rows[..2] {
        assert_eq!((r["connections"].as_u64(), r["peer_connections"].as_u64()), (Some(1), Some(1)));
        assert!(r["iops"].as_f64().unwrap() > 0.0, "{r}");
    }

    let rows = bench_nbd(&["--connections", "1"]);
    assert_eq!(rows.len(), 2, "--connections 1 leaves the two-connection rows out");
}
