//! fio's nbd engine against `uraid serve`: random writes with crc32c verification while
//! a member is failed through the control socket mid-run, then remove, add, rebuild and a
//! verify-only pass over the same region and seed; and nbdinfo's view of the export's
//! size and flags. fio, nbdinfo and a fio built with its nbd engine are required: a
//! missing tool fails the test (scripts/install-deps.sh installs them).

mod common;

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;

fn require_fio_nbd() {
    let o = tool("fio", &["--enghelp=nbd"]);
    assert!(
        o.status.success() && text(&o).contains("uri"),
        "this fio has no nbd engine (fio 3.19+ built with libnbd is required):\n{}",
        text(&o)
    );
}

/// The fio job: random 8 KiB writes over the first 64 MiB, crc32c in every block.
fn fio_args(url: &str, extra: &[&str]) -> Vec<String> {
    fio_verify_job("uraid-fio", url, "64m", 20240611, extra)
}

fn check_fio(o: &Output, what: &str, s: &Served) {
    check_fio_run(o, what, 8192, &s.log_text());
}

fn wait_in_sync(s: &Served, n: usize) -> String {
    let t0 = Instant::now();
    loop {
        let st = s.ctl("status", None);
        if st.contains(&format!("[{n}/{n}]")) && !st.contains("recovery") {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(40), "rebuild did not finish:\n{st}\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn create_raid6(dir: &TempDir) -> (Vec<PathBuf>, u64) {
    let members: Vec<PathBuf> = (0..6).map(|i| dir.path(&format!("m{i}.img"))).collect();
    let mut args = vec![
        "create",
        "--level",
        "6",
        "--raid-devices",
        "6",
        "--size",
        "32M",
        "--chunk",
        "64K",
        "--bitmap",
        "internal",
        "--assume-clean",
    ];
    args.extend(paths(&members));
    let out = ok(uraid(&args), "create");
    // "array size N (...)": the bytes the export must report.
    let size = out
        .split("array size ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no array size in the create output:\n{out}"));
    (members, size)
}

#[test]
fn fio_verify_survives_member_failure_and_rebuild() {
    require_fio_nbd();
    let dir = TempDir::new("fio");
    let (members, _) = create_raid6(&dir);
    let s = Served::start(&dir, &members, &[]);

    // 8192 writes at most 4000 a second: the write phase lasts over 2 s, so a failure
    // 700 ms in lands in the middle of it. fio then reads every block back and checks it
    // (on the degraded array: reconstruction from P and Q).
    let fio = spawn_fio(&fio_args(&s.url, &["--rate_iops=4000"]));
    std::thread::sleep(Duration::from_millis(700));
    let out = s.ctl("fail", Some(&members[2]));
    assert!(out.contains("faulty"), "{out}");
    let o = fio.wait();
    check_fio(&o, "random write + verify while a member fails", &s);
    let st = s.ctl("status", None);
    assert!(st.contains("[6/5]") && st.contains("(F)"), "the member should be failed:\n{st}");

    s.ctl("remove", Some(&members[2]));
    let out = s.ctl("add", Some(&members[2]));
    assert!(out.contains("recovery started") || out.contains("re-added"), "{out}");
    let st = wait_in_sync(&s, 6);
    assert!(st.contains("[UUUUUU]"), "{st}");
    let o = spawn_fio(&fio_args(&s.url, &["--verify_only"])).wait();
    check_fio(&o, "verify-only after the rebuild", &s);

    // The rebuilt member must hold the right bytes: lose two others (RAID6's limit), so
    // most stripes need it, and verify again.
    s.ctl("fail", Some(&members[0]));
    s.ctl("fail", Some(&members[4]));
    let o = spawn_fio(&fio_args(&s.url, &["--verify_only"])).wait();
    check_fio(&o, "verify-only with the rebuilt member and two failed", &s);
    s.stop();
}

#[derive(Debug, PartialEq, Eq)]
struct Flags {
    is_read_only: bool,
    can_flush: bool,
    can_fua: bool,
    can_trim: bool,
    can_zero: bool,
    can_multi_conn: bool,
}

/// `nbdinfo --json` of the export: its size and flags.
fn nbdinfo(url: &str) -> (u64, Flags) {
    let t = ok(tool("nbdinfo", &["--json", url]), "nbdinfo --json");
    let v: serde_json::Value =
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("nbdinfo's JSON: {e}\n{t}"));
    let e = &v["exports"][0];
    let b = |k: &str| e[k].as_bool().unwrap_or_else(|| panic!("no boolean {k:?} in nbdinfo's output:\n{t}"));
    let flags = Flags {
        is_read_only: b("is_read_only"),
        can_flush: b("can_flush"),
        can_fua: b("can_fua"),
        can_trim: b("can_trim"),
        can_zero: b("can_zero"),
        can_multi_conn: b("can_multi_conn"),
    };
    (e["export-size"].as_u64().unwrap_or_else(|| panic!("no export-size:\n{t}")), flags)
}

#[test]
fn nbdinfo_json_reports_size_and_flags() {
    let dir = TempDir::new("nbdinfo");
    let (members, size) = create_raid6(&dir);

    let s = Served::start(&dir, &members, &[]);
    let (got, flags) = nbdinfo(&s.url);
    assert_eq!(got, size, "export size");
    // One engine behind every connection: a flush on one covers writes made on another.
    let rw = Flags {
        is_read_only: false,
        can_flush: true,
        can_fua: true,
        can_trim: true,
        can_zero: true,
        can_multi_conn: true,
    };
    assert_eq!(flags, rw);
    s.stop();

    let s = Served::start(&dir, &members, &["--read-only"]);
    let (got, flags) = nbdinfo(&s.url);
    assert_eq!(got, size, "export size (read-only)");
    // Nothing that writes is offered; flush stays (a no-op is still true to its word).
    let ro = Flags {
        is_read_only: true,
        can_flush: true,
        can_fua: false,
        can_trim: false,
        can_zero: false,
        can_multi_conn: true,
    };
    assert_eq!(flags, ro);
    s.stop();
}
