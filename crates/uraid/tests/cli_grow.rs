//! `uraid grow` (mdadm --grow) on a served array: a raid1 from two mirrors to three, the
//! new one recovered with its progress in `status` and md agreeing afterwards; fewer
//! mirrors once the slot is empty; and every combination md refuses refused with its
//! reason, every file left as it was (the `--add`ed device too).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// An empty device file the size of `like`.
fn blank(dir: &TempDir, name: &str, like: &Path) -> PathBuf {
    let p = dir.path(name);
    std::fs::File::create(&p).unwrap().set_len(std::fs::metadata(like).unwrap().len()).unwrap();
    p
}

/// Each member file `more` bytes longer (a disk that grew).
fn enlarge(files: &[PathBuf], more: u64) {
    for m in files {
        let f = std::fs::OpenOptions::new().write(true).open(m).unwrap();
        f.set_len(f.metadata().unwrap().len() + more).unwrap();
    }
}

fn hashes(files: &[PathBuf]) -> Vec<String> {
    files.iter().map(|p| sha256_file(p)).collect()
}

fn grow(s: &Served, args: &[&str]) -> std::process::Output {
    let c = s.control.display().to_string();
    let mut a = vec!["grow", "--control", &c];
    a.extend_from_slice(args);
    uraid(&a)
}

/// `uraid grow ARGS` must refuse saying `words`, leaving `files` as they were.
fn refused(s: &Served, args: &[&str], words: &str, files: &[PathBuf]) {
    let before = hashes(files);
    let o = grow(s, args);
    let t = text(&o);
    assert!(!o.status.success(), "grow {args:?} should have been refused:\n{t}");
    assert!(t.contains(words), "grow {args:?} should say {words:?}:\n{t}");
    assert!(t.contains("nothing"), "grow {args:?} should say that nothing changed:\n{t}");
    assert_eq!(hashes(files), before, "grow {args:?} was refused but changed a file");
}

fn wait_status(s: &Served, what: &str, done: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let st = s.ctl("status", None);
        if done(&st) {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{what} not seen:\n{st}\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn raid1_grows_from_two_to_three_mirrors_and_md_agrees() {
    let dir = TempDir::new("grow-raid1");
    let members = create_clean(&dir, "1", 2, "8M", &["--bitmap", "internal"]);
    let new = blank(&dir, "m2", &members[0]);
    let s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &["write -P 0x5a 0 3M".into(), "write -P 0xc3 5M 2M".into()]);
    let before = sha256_bytes(&read_array(&dir, &s.url));
    // Slowed, the recovery of the new mirror is seen under way in `status`.
    ok(uraid(&["set", "sync_speed_max", "1000", "--control", &s.control.display().to_string()]), "uraid set");
    let out = ok(grow(&s, &["--raid-devices", "3", "--add", new.to_str().unwrap()]), "uraid grow");
    assert!(out.contains("as a hot spare") && out.contains("raid_disks set to 3 (was 2)"), "{out}");
    let st = wait_status(&s, "the recovery of slot 2", |st| st.contains("recovery ="));
    assert!(st.contains("[3/2] [UU_]"), "{st}");
    ok(
        uraid(&["set", "sync_speed_max", "200000", "--control", &s.control.display().to_string()]),
        "uraid set",
    );
    let st =
        wait_status(&s, "three mirrors in sync", |st| st.contains("[3/3] [UUU]") && !st.contains("recovery"));
    assert!(st.contains("m2[2]"), "{st}");
    assert_eq!(sha256_bytes(&read_array(&dir, &s.url)), before);
    // Written after the grow: on all three.
    qemu_io(&s.url, &["write -P 0x11 6M 512k".into()]);
    let after = sha256_bytes(&read_array(&dir, &s.url));
    s.stop();
    let all = vec![members[0].clone(), members[1].clone(), new.clone()];
    for m in &all {
        let e = ok(uraid(&["examine", m.to_str().unwrap()]), "uraid examine");
        assert_eq!(mdadm_field(&e, "Raid Devices").as_deref(), Some("3"), "{e}");
    }
    // Linux md assembles the three, each a full copy: md's check finds no mismatch.
    let md = md_check(&all);
    assert_eq!(md.sha256, after);
    assert_eq!(md.mismatch_cnt, 0);
}

#[test]
fn raid1_mirror_count_goes_down_only_over_empty_slots_and_up_degraded_only_with_force() {
    let dir = TempDir::new("grow-raid1-down");
    let members = create_clean(&dir, "1", 3, "8M", &[]);
    let s = Served::start(&dir, &members, &[]);
    refused(&s, &["--raid-devices", "2"], "3 slots hold a member, more than --raid-devices 2", &members);
    s.ctl("fail", Some(&members[1]));
    s.ctl("remove", Some(&members[1]));
    refused(&s, &["--raid-devices", "2"], "md would move it down", &members);
    s.ctl("fail", Some(&members[2]));
    s.ctl("remove", Some(&members[2]));
    let out = ok(grow(&s, &["--raid-devices", "2"]), "uraid grow");
    assert!(out.contains("raid_disks set to 2 (was 3)"), "{out}");
    assert!(s.ctl("status", None).contains("[2/1] [U_]"));
    // Up while degraded: md would rebuild the empty slot with the added device first.
    let fresh = blank(&dir, "m3", &members[0]);
    let mut files = members.clone();
    files.push(fresh.clone());
    let fresh_arg = fresh.to_str().unwrap();
    refused(&s, &["--raid-devices", "3", "--add", fresh_arg], "the array is degraded (1 of 2 slots", &files);
    // With --force it grows degraded, as mdadm --grow --force leaves it; adds fill it.
    ok(grow(&s, &["--raid-devices", "3", "--force"]), "uraid grow --force");
    assert!(s.ctl("status", None).contains("[3/1] [U__]"));
    s.ctl("add", Some(&fresh));
    s.ctl("add", Some(&members[1]));
    wait_status(&s, "three mirrors in sync", |st| st.contains("[3/3] [UUU]") && !st.contains("recovery"));
    s.stop();
}

#[test]
fn combinations_md_refuses_are_refused_and_change_nothing() {
    let dir = TempDir::new("grow-refusals-raid1");
    let r1 = create_clean(&dir, "1", 2, "8M", &["--bitmap", "internal"]);
    let spare = blank(&dir, "m2", &r1[0]);
    let mut files = r1.clone();
    files.push(spare.clone());
    let s = Served::start(&dir, &r1, &[]);
    let o = grow(&s, &[]);
    assert!(!o.status.success() && text(&o).contains("nothing to grow"), "{}", text(&o));
    refused(&s, &["--raid-devices", "3"], "need 1 spare", &files);
    refused(&s, &["--chunk", "64"], "raid1 has no chunk", &files);
    refused(&s, &["--layout", "left-symmetric"], "raid1 has no layout", &files);
    refused(&s, &["--level", "6"], "md cannot turn a raid1 into raid6", &files);
    refused(&s, &["--size", "max", "--raid-devices", "3"], "cannot change in the same grow", &files);
    // Refused before the added device is touched.
    refused(
        &s,
        &["--level", "6", "--add", spare.to_str().unwrap()],
        "md cannot turn a raid1 into raid6",
        &files,
    );
    // A check running: md says busy.
    let c = s.control.display().to_string();
    ok(uraid(&["set", "sync_speed_max", "1000", "--control", &c]), "uraid set");
    ok(uraid(&["action", "check", "--control", &c]), "uraid action check");
    refused(
        &s,
        &["--raid-devices", "3", "--add", spare.to_str().unwrap()],
        "performing resync/recovery",
        &files,
    );
    ok(uraid(&["action", "idle", "--control", &c]), "uraid action idle");
    let out = ok(grow(&s, &["--size", "7168"]), "uraid grow --size 7168");
    assert!(out.contains("component size unchanged at 7168K"), "{out}");
    refused(&s, &["--size", "64M"], "more than the members have room for", &files);
    refused(&s, &["--size", "4M"], "does not shrink", &files);
    s.stop();

    let dir = TempDir::new("grow-refusals-raid5");
    let r5 = create_clean(&dir, "5", 3, "8M", &[]);
    let new = blank(&dir, "m3", &r5[0]);
    let mut files = r5.clone();
    files.push(new.clone());
    let s = Served::start(&dir, &r5, &[]);
    refused(&s, &["--raid-devices", "4"], "need 1 spare", &files);
    refused(&s, &["--raid-devices", "2"], "reduce the size of the array", &files);
    refused(
        &s,
        &["--level", "6", "--chunk", "128", "--add", new.to_str().unwrap()],
        "level in the same operation as the chunk size",
        &files,
    );
    refused(&s, &["--level", "10"], "md cannot turn a raid5 into raid10", &files);
    // md's raid4 takeover wants the parity-last layout first.
    refused(&s, &["--level", "4"], "--layout parity-last", &files);
    // A takeover md has no way for.
    refused(&s, &["--level", "0"], "only when its parity member", &files);
    s.stop();

    // A grow by members while serving (cli_grow_online) keeps a write-intent bitmap, as
    // md's reshape does (cli_reshape checks md's view of it)...
    let dir = TempDir::new("grow-refusals-raid5-bitmap");
    let r5 = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--chunk", "64"]);
    let new = blank(&dir, "m3", &r5[0]);
    let s = Served::start(&dir, &r5, &[]);
    let out = ok(grow(&s, &["--raid-devices", "4", "--add", new.to_str().unwrap()]), "grow with a bitmap");
    assert!(out.contains("reshape to raid5 of 4 members started"), "{out}");
    s.stop();
    // ...but is refused, before the device is added, with too little room below the data
    // to move its offset down (mdadm would want a backup file): 8 MiB members with 512 KiB
    // chunks growing from 4 to 5.
    let dir = TempDir::new("grow-refusals-raid5-room");
    let r5 = create_clean(&dir, "5", 4, "8M", &[]);
    let new = blank(&dir, "m4", &r5[0]);
    let mut files = r5.clone();
    files.push(new.clone());
    let s = Served::start(&dir, &r5, &[]);
    refused(
        &s,
        &["--raid-devices", "5", "--add", new.to_str().unwrap()],
        "to move the data offset down",
        &files,
    );
    s.stop();

    let dir = TempDir::new("grow-refusals-raid10");
    let r10 = create_clean(&dir, "10", 4, "8M", &[]);
    let s = Served::start(&dir, &r10, &[]);
    refused(&s, &["--layout", "f2"], "far or offset layout", &r10);
    refused(&s, &["--level", "5"], "md cannot turn a raid10 into raid5", &r10);
    // Members grown while served: their room is seen, but a raid10's size is not built yet.
    enlarge(&r10, 4 << 20);
    refused(&s, &["--size", "max"], "of a raid10 is not built in uraid yet", &r10);
    s.stop();
    let dir = TempDir::new("grow-refusals-raid0");
    let r0 = create_clean(&dir, "0", 2, "8M", &[]);
    let s = Served::start(&dir, &r0, &[]);
    refused(&s, &["--size", "max"], "component size of a raid0", &r0);
    refused(&s, &["--raid-devices", "1"], "reduce the size of the array", &r0);
    s.stop();
}

#[test]
fn a_grown_mirror_killed_mid_recovery_resumes_on_the_next_start() {
    let dir = TempDir::new("grow-raid1-kill");
    let members = create_clean(&dir, "1", 2, "8M", &[]);
    let new = blank(&dir, "m2", &members[0]);
    let s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &["write -P 0x6b 1M 4M".into()]);
    let before = sha256_bytes(&read_array(&dir, &s.url));
    ok(uraid(&["set", "sync_speed_max", "1000", "--control", &s.control.display().to_string()]), "uraid set");
    ok(grow(&s, &["--raid-devices", "3", "--add", new.to_str().unwrap()]), "uraid grow");
    wait_status(&s, "the recovery of slot 2", |st| st.contains("recovery ="));
    std::thread::sleep(Duration::from_millis(1500));
    drop(s); // SIGKILL mid-recovery
    let all = vec![members[0].clone(), members[1].clone(), new.clone()];
    let s = Served::start(&dir, &all, &["--sync-speed-min", "100", "--sync-speed-max", "1000"]);
    let st = s.ctl("status", None);
    assert!(
        st.contains("[3/2] [UU_]") && st.contains("m2[2]"),
        "the new mirror should resume its recovery:\n{st}"
    );
    ok(
        uraid(&["set", "sync_speed_max", "200000", "--control", &s.control.display().to_string()]),
        "uraid set",
    );
    wait_status(&s, "three mirrors in sync", |st| st.contains("[3/3] [UUU]") && !st.contains("recovery"));
    assert_eq!(sha256_bytes(&read_array(&dir, &s.url)), before);
    s.stop();
    let md = md_check(&all);
    assert_eq!((md.sha256, md.mismatch_cnt), (before, 0));
}

#[test]
fn raid1_size_max_uses_the_room_the_members_gained_and_md_agrees() {
    let dir = TempDir::new("grow-size");
    let members = create_clean(&dir, "1", 2, "8M", &["--bitmap", "internal"]);
    let s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &["write -P 0x3c 0 7M".into()]);
    let before = read_array(&dir, &s.url);
    assert_eq!(before.len(), 7 << 20);
    // The disks grow under the running array (a bigger LUN, a longer file), the new space
    // of one holding old bytes: only a resync of it makes the mirrors agree.
    enlarge(&members, 4 << 20);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&members[1]).unwrap();
        f.write_all_at(&vec![0xee; 4 << 20], 8 << 20).unwrap();
    }
    let out = ok(grow(&s, &["--size", "max"]), "uraid grow --size max");
    assert!(
        out.contains("component size set to 11264K (was 7168K)") && out.contains("next connection"),
        "{out}"
    );
    wait_status(&s, "the new space resynced", |st| st.contains("11264 blocks") && !st.contains("resync"));
    // A new connection sees the new size: the old data, then the new space, usable.
    qemu_io(&s.url, &["write -P 0x77 9M 1M".into(), "read -P 0x77 9M 1M".into(), "read -P 0x3c 0 7M".into()]);
    let after = read_array(&dir, &s.url);
    assert_eq!(after.len(), 11 << 20);
    assert_eq!(sha256_bytes(&after[..7 << 20]), sha256_bytes(&before));
    s.stop();
    for m in &members {
        let e = ok(uraid(&["examine", m.to_str().unwrap()]), "uraid examine");
        assert!(mdadm_field(&e, "Array Size").is_some_and(|v| v.starts_with("11264 KiB")), "{e}");
    }
    // Linux md assembles it at the new size: the same data, the mirrors equal.
    let md = md_check(&members);
    assert_eq!(md.sha256, sha256_bytes(&after));
    assert_eq!(md.mismatch_cnt, 0);
}

#[test]
fn a_size_grow_killed_mid_resync_resyncs_the_new_space_on_the_next_start() {
    let dir = TempDir::new("grow-size-kill");
    let members = create_clean(&dir, "1", 2, "8M", &["--bitmap", "internal"]);
    let slow = ["--sync-speed-min", "100", "--sync-speed-max", "500"];
    let s = Served::start(&dir, &members, &slow);
    qemu_io(&s.url, &["write -P 0x3c 0 7M".into()]);
    enlarge(&members, 4 << 20);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&members[1]).unwrap();
        f.write_all_at(&vec![0xee; 4 << 20], 8 << 20).unwrap();
    }
    ok(grow(&s, &["--size", "max"]), "uraid grow --size max");
    wait_status(&s, "the resync of the new space", |st| st.contains("resync ="));
    std::thread::sleep(Duration::from_millis(500));
    drop(s); // SIGKILL mid-resync
    for m in &members {
        let e = ok(uraid(&["examine", m.to_str().unwrap()]), "uraid examine");
        assert!(mdadm_field(&e, "Array Size").is_some_and(|v| v.starts_with("11264 KiB")), "{e}");
    }
    let s = Served::start(&dir, &members, &[]);
    wait_status(&s, "the resync finished", |st| st.contains("11264 blocks") && !st.contains("resync"));
    let after = read_array(&dir, &s.url);
    s.stop();
    let md = md_check(&members);
    assert_eq!((md.sha256, md.mismatch_cnt), (sha256_bytes(&after), 0));
}

#[test]
fn raid5_and_raid6_size_max_grow_the_array_by_the_new_room_of_each_member_and_md_agrees() {
    // Two data members each: 3 for raid5, 4 for raid6.
    parity_size_max("5", 3);
    parity_size_max("6", 4);
}

fn parity_size_max(level: &str, n: usize) {
    let dir = TempDir::new(&format!("grow-size-raid{level}"));
    let members = create_clean(&dir, level, n, "8M", &["--bitmap", "internal"]);
    let s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &["write -P 0x5e 0 12M".into()]);
    let before = read_array(&dir, &s.url);
    // 8 MiB members with mdadm's 2 MiB raid5 data offset: 6 MiB of data each.
    assert_eq!(before.len(), 12 << 20);
    // Stale bytes in one member's new space: the parity there holds only after a resync.
    enlarge(&members, 4 << 20);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&members[n - 1]).unwrap();
        f.write_all_at(&vec![0xee; 4 << 20], 8 << 20).unwrap();
    }
    let out = ok(grow(&s, &["--size", "max"]), "uraid grow --size max");
    assert!(out.contains("component size set to 10240K (was 6144K)"), "{out}");
    wait_status(&s, "the new space resynced", |st| st.contains("20480 blocks") && !st.contains("resync"));
    qemu_io(&s.url, &["write -P 0x77 13M 2M".into(), "read -P 0x77 13M 2M".into()]);
    let after = read_array(&dir, &s.url);
    assert_eq!(after.len(), 20 << 20);
    assert_eq!(sha256_bytes(&after[..12 << 20]), sha256_bytes(&before));
    s.stop();
    let md = md_check(&members);
    assert_eq!((md.sha256, md.mismatch_cnt), (sha256_bytes(&after), 0));
}
