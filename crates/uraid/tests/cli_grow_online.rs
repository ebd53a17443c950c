//! `uraid grow --control S --raid-devices N+1 --add NEW` on a served raid5/raid6: fio with
//! crc32c verification writes and reads throughout the reshape without an error, `status`
//! shows its progress, and once it is done a new NBD connection sees the new size and the
//! new space takes writes. `kill -9` of the server at several points of a reshape, each
//! followed by a restart, resumes it from the checkpoint, and the original extent keeps
//! its sha256; restarted without a member, it goes on degraded as md's does. (md
//! finishing a grow uraid started while serving: `cli_reshape`.)

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

const MEMBER: &str = "40M";

fn blank(dir: &TempDir, name: &str) -> PathBuf {
    let p = dir.path(name);
    let o = tool("truncate", &["-s", MEMBER, p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    p
}

fn grow(s: &Served, n: usize, new: &std::path::Path) -> String {
    let c = s.control.display().to_string();
    let args = ["grow", "--control", &c, "--raid-devices", &n.to_string(), "--add", new.to_str().unwrap()];
    ok(uraid(&args), "uraid grow")
}

/// `members` served with a slow reshape, written whole by fio: the server, the export's
/// size and the sha256 of what it holds.
fn serve_filled(dir: &TempDir, members: &[PathBuf]) -> (Served, usize, String) {
    let s = Served::start(dir, members, &["--sync-speed-max", "4000"]);
    let size = export_size(&s.url) as usize;
    let job = fio_verify_job("fill", &s.url, &size.to_string(), 3, &["--rw=write", "--bs=1m"]);
    let o = spawn_fio(&job).wait();
    assert!(o.status.success(), "{}", text(&o));
    let before = sha256_bytes(&read_array(dir, &s.url));
    (s, size, before)
}

/// `wait_ms` into the reshape `s` runs, `kill -9`; the examine text of `member`, which
/// must show the reshape's checkpoint.
fn kill_mid_reshape(s: Served, wait_ms: u64, member: &std::path::Path) -> String {
    std::thread::sleep(Duration::from_millis(wait_ms));
    s.kill9();
    let sb = text(&uraid(&["examine", member.to_str().unwrap()]));
    assert!(sb.contains("Reshape pos'n"), "killed mid-reshape:\n{sb}");
    sb
}

/// The reshape `s` runs let go at full speed, and waited for; the control socket's path.
fn finish_reshape(s: &Served) -> String {
    let c = s.control.display().to_string();
    ok(uraid(&["set", "sync_speed_max", "200000", "--control", &c]), "uraid set");
    wait_reshaped(s);
    c
}

fn export_size(url: &str) -> u64 {
    let o = tool("nbdinfo", &["--size", url]);
    assert!(o.status.success(), "nbdinfo: {}", text(&o));
    text(&o).trim().parse().unwrap()
}

#[test]
fn raid5_and_raid6_grow_under_fio_verify_and_serve_the_new_size() {
    for (level, n) in [("5", 4usize), ("6", 5)] {
        let dir = TempDir::new(&format!("grow-online-{level}"));
        let members = create_clean(&dir, level, n, MEMBER, &["--chunk", "64"]);
        let new = blank(&dir, "new");
        // Slow enough that fio runs inside the reshape.
        let s = Served::start(&dir, &members, &["--sync-speed-max", "8000"]);
        let before = export_size(&s.url);
        let region = format!("{}", before / 2);
        let first = fio_verify_job("first", &s.url, &region, 7, &[]);
        check_fio_run(&spawn_fio(&first).wait(), "write before the grow", before / 2 / 8192, &s.log_text());

        let said = grow(&s, n + 1, &new);
        assert!(said.contains("reshape to raid") && said.contains("started"), "{said}");
        // Writes and reads with verification while windows move: the second half fresh,
        // the first half read back.
        let second = fio_verify_job("second", &s.url, &region, 8, &[&format!("--offset={region}")]);
        let mut writer = spawn_fio(&second);
        let reread = [&first[..], &["--verify_only".to_string(), "--rw=randread".to_string()]].concat();
        let reader = spawn_fio(&reread);
        // Asked while both fio jobs run (asked after them, a loaded machine saw the
        // reshape done before the reader was).
        let st = s.ctl("status", None);
        assert!(st.contains("reshape ="), "fio ran inside the reshape:\n{st}");
        check_fio_run(&reader.wait(), "verify during the grow", before / 2 / 8192, &s.log_text());
        let t0 = Instant::now();
        while !writer.try_done() {
            assert!(t0.elapsed() < Duration::from_secs(120), "fio hung");
            std::thread::sleep(Duration::from_millis(100));
        }
        check_fio_run(&writer.wait(), "write and verify during the grow", before / 2 / 8192, &s.log_text());

        wait_reshaped(&s);
        // The server's monitor gives the export its new size within a look or two.
        let t0 = Instant::now();
        let mut after = export_size(&s.url);
        while after == before && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(200));
            after = export_size(&s.url);
        }
        let data = n as u64 - if level == "6" { 2 } else { 1 };
        assert_eq!(after, before / data * (data + 1), "raid{level}: a member's worth more");
        // Both halves read back at the new layout, and the new space takes writes.
        let again = [&first[..], &["--verify_only".to_string(), "--rw=randread".to_string()]].concat();
        check_fio_run(&spawn_fio(&again).wait(), "verify after the grow", before / 2 / 8192, &s.log_text());
        let tail = fio_verify_job(
            "tail",
            &s.url,
            &format!("{}", after - before),
            9,
            &[&format!("--offset={before}")],
        );
        check_fio_run(&spawn_fio(&tail).wait(), "the new space", (after - before) / 8192, &s.log_text());
        assert!(s.log_text().contains("reshape done"), "{}", s.log_text());
        s.stop();
    }
}

#[test]
fn a_reshape_killed_at_several_points_resumes_and_keeps_the_data() {
    let dir = TempDir::new("grow-online-kill");
    let mut members = create_clean(&dir, "5", 4, MEMBER, &["--chunk", "64"]);
    let new = blank(&dir, "new");
    let (s, size, before) = serve_filled(&dir, &members);
    grow(&s, 5, &new);
    members.push(new);
    let mut s = Some(s);
    let mut last = 0;
    for wait_ms in [300u64, 1500, 2500] {
        let sb = kill_mid_reshape(s.take().unwrap(), wait_ms, &members[0]);
        let pos: u64 = sb
            .lines()
            .find_map(|l| l.trim().strip_prefix("Reshape pos'n : "))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("killed mid-reshape, examine shows its position:\n{sb}"));
        assert!(pos >= last, "the checkpoint never goes back: {last} -> {pos}");
        last = pos;
        let again = Served::start(&dir, &members, &["--sync-speed-max", "4000"]);
        assert_eq!(export_size(&again.url) as usize, size, "mid-reshape: the old size");
        let got = read_array(&dir, &again.url);
        assert_eq!(
            sha256_bytes(&got),
            before,
            "after kill -9 at {wait_ms} ms, mid-reshape, the data reads back"
        );
        s = Some(again);
    }
    let s = s.unwrap();
    finish_reshape(&s);
    let got = read_array(&dir, &s.url);
    assert!(got.len() > size, "the new size");
    assert_eq!(sha256_bytes(&got[..size]), before, "after the resumed reshape, the original extent");
    s.stop();
}

#[test]
fn a_reshape_killed_then_restarted_without_a_member_goes_on_degraded() {
    // md continues a reshape that lost a member; after kill -9 the array is dirty, so
    // the degraded start takes --force as mdadm's does (no write was in flight: nothing
    // is stale).
    let dir = TempDir::new("grow-online-degraded");
    let mut members = create_clean(&dir, "5", 4, MEMBER, &["--chunk", "64"]);
    let new = blank(&dir, "new");
    let (s, size, before) = serve_filled(&dir, &members);
    grow(&s, 5, &new);
    members.push(new);
    kill_mid_reshape(s, 1000, &members[0]);
    let without: Vec<PathBuf> =
        members.iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, p)| p.clone()).collect();
    let again = Served::start(&dir, &without, &["--sync-speed-max", "4000", "--run", "--force"]);
    assert_eq!(export_size(&again.url) as usize, size, "mid-reshape: the old size");
    assert_eq!(
        sha256_bytes(&read_array(&dir, &again.url)),
        before,
        "degraded, mid-reshape, the data reads back"
    );
    let c = finish_reshape(&again);
    let status = ok(uraid(&["status", "--control", &c]), "uraid status");
    assert!(status.contains("[5/4] [U_UUU]"), "the array runs degraded after the reshape:\n{status}");
    let got = read_array(&dir, &again.url);
    assert!(got.len() > size, "the new size");
    assert_eq!(sha256_bytes(&got[..size]), before, "after the degraded reshape, the original extent");
    again.stop();
}

#[test]
fn a_chunk_change_while_serving_survives_kill_9_and_keeps_the_data() {
    let dir = TempDir::new("grow-online-chunk");
    let members = create_clean(&dir, "5", 4, MEMBER, &["--chunk", "64"]);
    let (s, size, before) = serve_filled(&dir, &members);
    let c = s.control.display().to_string();
    ok(uraid(&["grow", "--control", &c, "--chunk", "32"]), "uraid grow --chunk");
    let sb = kill_mid_reshape(s, 1000, &members[0]);
    assert!(sb.contains("New Chunksize : 32K"), "killed mid-reshape:\n{sb}");
    let again = Served::start(&dir, &members, &["--sync-speed-max", "4000"]);
    assert_eq!(sha256_bytes(&read_array(&dir, &again.url)), before, "mid-reshape, the data reads back");
    let c = finish_reshape(&again);
    let detail = ok(uraid(&["detail", "--control", &c]), "uraid detail");
    assert!(detail.contains("Chunk Size : 32K"), "{detail}");
    assert_eq!(export_size(&again.url) as usize, size, "a chunk change keeps the size");
    assert_eq!(sha256_bytes(&read_array(&dir, &again.url)), before, "after the chunk change");
    again.stop();
}

/// raid5 to raid6 with a new member while serving (`--level 6 --add NEW`): killed mid-way,
/// the new member's recovery recorded with the checkpoint; restarted, the reshape goes on
/// and ends in a raid6 that survives two members gone.
#[test]
fn raid5_to_raid6_while_serving_survives_kill_9_and_ends_with_q() {
    let dir = TempDir::new("grow-online-raid6");
    let members = create_clean(&dir, "5", 4, MEMBER, &["--chunk", "64"]);
    let new = blank(&dir, "q");
    let (s, size, before) = serve_filled(&dir, &members);
    let c = s.control.display().to_string();
    let said =
        ok(uraid(&["grow", "--control", &c, "--level", "6", "--add", new.to_str().unwrap()]), "uraid grow");
    assert!(said.contains("raid6"), "{said}");
    let sb = kill_mid_reshape(s, 1000, &new);
    assert!(sb.contains("Recovery Offset"), "the Q member is recovered by the reshape:\n{sb}");
    let mut all = members.clone();
    all.push(new.clone());
    let again = Served::start(&dir, &all, &["--sync-speed-max", "4000"]);
    assert_eq!(sha256_bytes(&read_array(&dir, &again.url)), before, "mid-reshape, the data reads back");
    let c = finish_reshape(&again);
    let detail = ok(uraid(&["detail", "--control", &c]), "uraid detail");
    assert!(detail.contains("raid6") && detail.contains("left-symmetric"), "{detail}");
    assert_eq!(export_size(&again.url) as usize, size, "raid5 to raid6 keeps the size");
    again.stop();
    let sb = text(&uraid(&["examine", new.to_str().unwrap()]));
    assert!(!sb.contains("Recovery Offset") && !sb.contains("Reshape pos'n"), "{sb}");
    // Two members gone: P and Q rebuild every sector.
    let two_gone = [members[0].clone(), members[2].clone(), members[3].clone()];
    let degraded = Served::start(&dir, &[&two_gone[..], &[new]].concat(), &["--read-only", "--run"]);
    assert_eq!(sha256_bytes(&read_array(&dir, &degraded.url)), before, "raid6 missing two members");
    degraded.stop();
}

/// A raid0 grown by a member while serving (`--raid-devices 4 --add NEW`), mdadm's way
/// through raid4: first to the end under fio, the new size served and md's on-disk raid0
/// at the end; then again, killed mid-reshape: the restart serves the raid4 mid-way with
/// the same bytes, finishes the reshape, and `--level 0` takes it back to raid0.
#[test]
fn a_raid0_grows_by_a_member_while_serving_and_survives_kill_9() {
    let dir = TempDir::new("grow-online-raid0");
    let members = create_clean(&dir, "0", 3, MEMBER, &["--chunk", "64"]);
    let new = blank(&dir, "new");
    let (s, size, before) = serve_filled(&dir, &members);
    let said = grow(&s, 4, &new);
    assert!(said.contains("by way of raid4"), "{said}");
    // Read back as `serve_filled` wrote it (whole 1 MiB blocks, each with its header).
    let reread =
        fio_verify_job("fill", &s.url, &size.to_string(), 3, &["--verify_only", "--rw=read", "--bs=1m"]);
    let reader = spawn_fio(&reread);
    let st = s.ctl("status", None);
    assert!(st.contains("reshape =") || st.contains("raid4"), "fio ran inside the grow:\n{st}");
    check_fio_run(&reader.wait(), "verify during the raid0 grow", size as u64 >> 20, &s.log_text());
    let c = s.control.display().to_string();
    ok(uraid(&["set", "sync_speed_max", "200000", "--control", &c]), "uraid set");
    let t0 = Instant::now();
    while !s.log_text().contains("raid0 grow done") {
        assert!(t0.elapsed() < Duration::from_secs(120), "the grow never ended:\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    let detail = ok(uraid(&["detail", "--control", &c]), "uraid detail");
    assert!(detail.contains("raid0") && detail.contains("Raid Devices : 4"), "{detail}");
    let t0 = Instant::now();
    let mut after = export_size(&s.url);
    while after == size as u64 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        after = export_size(&s.url);
    }
    assert_eq!(after, size as u64 / 3 * 4, "a member's worth more");
    let got = read_array(&dir, &s.url);
    assert_eq!(sha256_bytes(&got[..size]), before, "after the grow");
    s.stop();
    let mut all = members.clone();
    all.push(new.clone());
    for m in &all {
        let sb = text(&uraid(&["examine", m.to_str().unwrap()]));
        assert!(sb.contains("raid0") && !sb.contains("Reshape pos'n"), "{sb}");
    }

    // Again from a raid0 of three, killed inside the raid4 reshape.
    let dir = TempDir::new("grow-online-raid0-kill");
    let members = create_clean(&dir, "0", 3, MEMBER, &["--chunk", "64"]);
    let new = blank(&dir, "new");
    let (s, size, before) = serve_filled(&dir, &members);
    grow(&s, 4, &new);
    let sb = kill_mid_reshape(s, 1500, &new);
    assert!(
        sb.contains("raid4") && sb.contains("Recovery Offset"),
        "the new member in the old parity slot:\n{sb}"
    );
    let mut all = members.clone();
    all.push(new.clone());
    let again = Served::start(&dir, &all, &["--sync-speed-max", "4000", "--run"]);
    assert_eq!(sha256_bytes(&read_array(&dir, &again.url)), before, "mid-reshape, the data reads back");
    let c = finish_reshape(&again);
    let said = ok(uraid(&["grow", "--control", &c, "--level", "0"]), "uraid grow --level 0");
    assert!(said.contains("takeover"), "{said}");
    let t0 = Instant::now();
    loop {
        let detail = ok(uraid(&["detail", "--control", &c]), "uraid detail");
        if detail.contains("Raid Level : raid0") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{detail}");
        std::thread::sleep(Duration::from_millis(200));
    }
    again.stop();
    let again = Served::start(&dir, &all, &[]);
    assert_eq!(export_size(&again.url), size as u64 / 3 * 4);
    let got = read_array(&dir, &again.url);
    assert_eq!(sha256_bytes(&got[..size]), before, "raid0 of four after the restart");
    again.stop();
}
