//! `uraid action check|repair` against real Linux md (in a VM, ../shared/tools/mdvm): on
//! images with blocks corrupted at chosen places, uraid's `check` gives md's
//! `mismatch_cnt`; after uraid's `repair`, md's check gives 0; on RAID6 a corrupted data
//! block is located and restored, not baked into parity.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;

fn data_offset_bytes(member: &Path) -> u64 {
    let ex = ok(uraid(&["examine", member.to_str().unwrap()]), "uraid examine");
    let v = mdadm_field(&ex, "Data Offset").expect("Data Offset");
    v.split_whitespace().next().unwrap().parse::<u64>().unwrap() * 512
}

/// Overwrites 4 KiB of `member`'s data area at `offset` (bytes into the data area).
fn corrupt(member: &Path, offset: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(member).unwrap();
    f.write_all_at(&[0xc3u8; 4096], data_offset_bytes(member) + offset).unwrap();
}

fn detail_field(s: &Served, key: &str) -> String {
    let c = s.control.display().to_string();
    let d = ok(uraid(&["detail", "--control", &c]), "uraid detail");
    mdadm_field(&d, key).unwrap_or_else(|| panic!("no {key} in:\n{d}"))
}

/// Runs `action` to its end; returns mismatch_cnt.
fn scrub(s: &Served, action: &str) -> u64 {
    let c = s.control.display().to_string();
    ok(uraid(&["action", action, "--control", &c]), "uraid action");
    let t0 = Instant::now();
    while detail_field(s, "Sync Action") != "idle" {
        assert!(t0.elapsed() < Duration::from_secs(60), "{action} did not end:\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(detail_field(s, "Last Sync Action"), action);
    detail_field(s, "Mismatch Count").parse().unwrap()
}

fn scrub_matches_md(level: &str, n: usize, corruptions: &[(usize, u64)]) {
    let dir = TempDir::new(&format!("scrub{level}"));
    let members: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("d{i}"))).collect();
    let count = n.to_string();
    let mut args = vec![
        "create",
        "--level",
        level,
        "--raid-devices",
        &count,
        "--size",
        "16M",
        "--assume-clean",
        "--bitmap",
        "none",
    ];
    if level != "1" {
        args.extend(["--chunk", "64K"]);
    }
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let served = Served::start(&dir, &members, &[]);
    let cmds: Vec<String> = (0..8).map(|k| format!("write -P {} {} {MIB}", 0x40 + k, k * MIB)).collect();
    qemu_io(&served.url, &cmds);
    // A full pass makes parity and copies agree before blocks are damaged.
    assert_eq!(scrub(&served, "repair"), 0, "{level}: a fresh array had mismatches");
    // What was written, as uraid reads it; md's view after the repair must be the same.
    let written = sha256_bytes(&read_array(&dir, &served.url));
    served.stop();

    for &(member, offset) in corruptions {
        corrupt(&members[member], offset);
    }
    // Only md's count matters here: its check without hashing the array (see md_mismatch_cnt).
    let md_count = md_mismatch_cnt(&members);
    let served = Served::start(&dir, &members, &[]);
    let ours = scrub(&served, "check");
    assert_eq!(ours, md_count, "{level}: uraid's check counted {ours}, md's {md_count}");
    assert!(ours > 0, "{level}: the corruption went unseen");
    let repaired = scrub(&served, "repair");
    assert_eq!(repaired, ours, "{level}: repair counted differently from check");
    assert_eq!(scrub(&served, "check"), 0, "{level}: mismatches left after repair");
    served.stop();
    if level == "6" || level == "1" || level == "10" {
        let after = md_check(&members);
        assert_eq!(after.mismatch_cnt, 0, "{level}: md's check after uraid's repair");
        // The culprit (raid6) or the first copy (mirrors, corrupted here only in later
        // copies) was found: the array holds exactly what was written.
        assert_eq!(after.sha256, written, "{level}: repair did not restore the data");
    } else {
        assert_eq!(md_mismatch_cnt(&members), 0, "{level}: md's check after uraid's repair");
    }
}

#[test]
fn raid5_check_counts_as_md_and_repair_satisfies_md() {
    // A data block, a parity block, two pages of one chunk.
    scrub_matches_md("5", 4, &[(1, 64 << 10), (0, 3 * (64 << 10) + 8192), (2, MIB + 4096)]);
}

#[test]
fn raid6_repair_restores_single_corrupted_data_blocks() {
    // Data blocks on different members in different stripes.
    scrub_matches_md("6", 5, &[(0, 0), (2, 128 << 10), (3, 512 << 10), (4, MIB + 8192)]);
}

#[test]
fn raid1_check_counts_as_md_and_repair_satisfies_md() {
    scrub_matches_md("1", 3, &[(1, 4096), (2, 3 * MIB + 100 * 512 * 8)]);
}

#[test]
fn raid10_check_counts_as_md_and_repair_satisfies_md() {
    scrub_matches_md("10", 4, &[(1, 0), (3, 192 << 10)]);
}

/// md's `idle` stops a check or repair; a recovery goes on (md restarts it at once), so
/// `action idle` during one says so instead of claiming the array idle, and `action check`
/// then says to wait for the recovery, not to stop it.
#[test]
fn idle_during_a_recovery_says_the_recovery_goes_on() {
    let dir = TempDir::new("idle-recovery");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("r{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--size", "32M"];
    args.extend(["--assume-clean", "--bitmap", "none"]);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let s = Served::start(&dir, &members, &["--sync-speed-min", "1000", "--sync-speed-max", "2000"]);
    let c = s.control.display().to_string();
    s.ctl("fail", Some(&members[2]));
    s.ctl("remove", Some(&members[2]));
    s.ctl("add", Some(&members[2]));
    assert_eq!(detail_field(&s, "Sync Action"), "recover");
    let o = uraid(&["action", "idle", "--control", &c]);
    let t = text(&o);
    assert!(!t.contains("is idle"), "idle claimed the array idle during a recovery: {t}");
    assert!(t.contains("recovery") && t.contains("goes on"), "{t}");
    assert_eq!(detail_field(&s, "Sync Action"), "recover", "{t}");
    let o = uraid(&["action", "check", "--control", &c]);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("recovery"), "{t}");
    assert!(!t.contains("stop it first") && !t.contains("(idle)"), "check advised idle again: {t}");
    s.stop();
}
