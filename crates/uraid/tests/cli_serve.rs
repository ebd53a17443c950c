//! `uraid serve` with real clients: qemu-io writes and read-verifies (unaligned too),
//! SIGTERM stops cleanly (superblocks clean, no resync on restart, mdadm agrees), and a
//! member failed through the control socket while writing is added back and rebuilt.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

fn create(dir: &TempDir, level: &str, n: usize, extra: &[&str]) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("m{i}.img"))).collect();
    let ns = n.to_string();
    let mut args = vec!["create", "--level", level, "--raid-devices", &ns, "--size", "48M"];
    if level != "1" {
        args.extend_from_slice(&["--chunk", "64K"]);
    }
    args.extend_from_slice(extra);
    args.extend(paths(&members));
    ok(uraid(&args), "create");
    members
}

/// (offset, len, pattern byte): aligned and unaligned, small and across chunks.
fn patterns() -> Vec<(u64, u64, u8)> {
    let mut v = Vec::new();
    let mut off = 0u64;
    for (i, len) in [512u64, 4096, 1, 777, 65536, 70000, 131072, 3, 200_000, 1 << 20].iter().enumerate() {
        v.push((off, *len, 0x10 + i as u8));
        off += len + 4096 * (i as u64 + 1) + 13;
    }
    v.push((20 << 20, 300_000, 0x77));
    v
}

fn write_cmds(p: &[(u64, u64, u8)]) -> Vec<String> {
    p.iter().map(|(o, l, b)| format!("write -P {b} {o} {l}")).collect()
}

fn read_cmds(p: &[(u64, u64, u8)]) -> Vec<String> {
    p.iter().map(|(o, l, b)| format!("read -P {b} {o} {l}")).collect()
}

fn examine(m: &std::path::Path) -> String {
    ok(tool("mdadm", &["--examine", m.to_str().unwrap()]), "mdadm --examine")
}

#[test]
fn serve_write_verify_sigterm_clean_restart() {
    for bitmap in [false, true] {
        let dir = TempDir::new("serve");
        let extra: &[&str] = if bitmap { &["--bitmap", "internal"] } else { &[] };
        let members = create(&dir, "6", 5, extra);
        let p = patterns();
        let s = Served::start(&dir, &members, &[]);
        qemu_io(&s.url, &write_cmds(&p));
        qemu_io(&s.url, &read_cmds(&p));
        // A new raid6 owes its initial resync; the array is clean only once it is done.
        wait_log(&s, "resync done");
        let info = ok(tool("nbdinfo", &[&s.url]), "nbdinfo");
        assert!(info.contains("can_multi_conn: true"), "{info}");
        let log = s.stop();
        assert!(log.contains("stopped cleanly"), "{log}");
        for m in &members {
            let e = examine(m);
            assert_eq!(mdadm_field(&e, "State").as_deref(), Some("clean"), "{}:\n{e}", m.display());
        }
        let s = Served::start(&dir, &members, &[]);
        qemu_io(&s.url, &read_cmds(&p));
        let log = s.stop();
        assert!(!log.contains("resync"), "a clean stop must not need a resync:\n{log}");
    }
}

#[test]
fn unclean_stop_with_bitmap_resyncs_only_dirty_regions() {
    let dir = TempDir::new("crash");
    let members = create(&dir, "5", 4, &["--bitmap", "internal", "--assume-clean"]);
    let mut s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &["write -P 0x5a 1M 64k".to_string()]);
    // Crash: no clean stop, so the superblocks stay dirty and the bits set.
    let mut child = s.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let e = examine(&members[0]);
    assert_eq!(mdadm_field(&e, "State").as_deref(), Some("active"), "{e}");
    let out = ok(uraid(&["assemble"].iter().copied().chain(paths(&members)).collect::<Vec<_>>()), "assemble");
    assert!(
        out.contains("On start: resync of 1 bitmap chunk ("),
        "with a bitmap, only dirty regions resync:\n{out}"
    );
    let s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &["read -P 0x5a 1M 64k".to_string()]);
    wait_log(&s, "resync done");
    s.stop();
    assert_eq!(mdadm_field(&examine(&members[0]), "State").as_deref(), Some("clean"));
}

fn wait_log(s: &Served, needle: &str) {
    let t0 = Instant::now();
    while !s.log_text().contains(needle) {
        assert!(t0.elapsed() < Duration::from_secs(30), "no {needle:?} in the log:\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_in_sync(s: &Served, n: usize) -> String {
    let t0 = Instant::now();
    loop {
        let st = s.ctl("status", None);
        if st.contains(&format!("[{n}/{n}]")) && !st.contains("recovery") {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "rebuild did not finish:\n{st}\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn fail_while_writing_add_back_rebuild_and_verify() {
    let dir = TempDir::new("rebuild");
    let members = create(&dir, "5", 4, &["--bitmap", "internal", "--assume-clean"]);
    let s = Served::start(&dir, &members, &[]);
    // A writer in the background while a member fails.
    let p: Vec<(u64, u64, u8)> =
        (0..120u64).map(|i| (i * 300_000 + (i % 7) * 100, 65536 + i * 11, (i % 200) as u8 + 1)).collect();
    let url = s.url.clone();
    let cmds = write_cmds(&p);
    let writer = std::thread::spawn(move || qemu_io(&url, &cmds));
    std::thread::sleep(Duration::from_millis(30));
    let out = s.ctl("fail", Some(&members[1]));
    assert!(out.contains("faulty"), "{out}");
    writer.join().unwrap();
    let st = s.ctl("status", None);
    assert!(st.contains("[4/3]") && st.contains("(F)"), "{st}");
    qemu_io(&s.url, &read_cmds(&p));
    // mdadm sees the failure recorded on the survivors.
    let e = examine(&members[0]);
    assert!(mdadm_field(&e, "Array State").is_some_and(|a| a.starts_with("A.AA")), "{e}");

    s.ctl("remove", Some(&members[1]));
    let out = s.ctl("add", Some(&members[1]));
    assert!(out.contains("recovery started") || out.contains("re-added"), "{out}");
    let st = wait_in_sync(&s, 4);
    assert!(st.contains("[UUUU]"), "{st}");
    qemu_io(&s.url, &read_cmds(&p));
    // The rebuilt member now carries data: lose another one and read everything back.
    s.ctl("fail", Some(&members[2]));
    qemu_io(&s.url, &read_cmds(&p));
    s.ctl("remove", Some(&members[2]));
    s.ctl("add", Some(&members[2]));
    wait_in_sync(&s, 4);
    s.stop();
    for m in &members {
        let e = examine(m);
        assert_eq!(mdadm_field(&e, "State").as_deref(), Some("clean"), "{e}");
        assert!(mdadm_field(&e, "Array State").is_some_and(|a| a.starts_with("AAAA")), "{e}");
        assert!(mdadm_field(&e, "Recovery Offset").is_none(), "{e}");
    }
    let s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &read_cmds(&p));
    s.stop();
}

#[test]
fn hot_spare_takes_over_a_failed_member() {
    let dir = TempDir::new("spare");
    let members = create(&dir, "1", 2, &["--assume-clean"]);
    let spare = dir.path("spare.img");
    std::fs::File::create(&spare).unwrap().set_len(48 << 20).unwrap();
    let s = Served::start(&dir, &members, &[]);
    let out = s.ctl("add", Some(&spare));
    assert!(out.contains("hot spare"), "{out}");
    let p = patterns();
    qemu_io(&s.url, &write_cmds(&p));
    s.ctl("fail", Some(&members[0]));
    wait_in_sync(&s, 2);
    s.ctl("fail", Some(&members[1]));
    // Only the former spare holds the data now.
    qemu_io(&s.url, &read_cmds(&p));
    s.stop();
}

#[test]
fn interrupted_rebuild_resumes_from_its_checkpoint() {
    let dir = TempDir::new("resume");
    let members = create(&dir, "5", 4, &["--assume-clean"]);
    let p = patterns();
    let slow = ["--sync-speed-min", "2000", "--sync-speed-max", "4000"];
    let s = Served::start(&dir, &members, &slow);
    qemu_io(&s.url, &write_cmds(&p));
    s.ctl("fail", Some(&members[3]));
    s.ctl("remove", Some(&members[3]));
    s.ctl("add", Some(&members[3]));
    // 48 MiB at 4 MiB/s: stop once a checkpoint (every 3 s) is on the member, well before
    // the end (mdadm reads the superblock while the array runs).
    let t0 = std::time::Instant::now();
    while mdadm_field(&examine(&members[3]), "Recovery Offset").is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no checkpoint recorded:\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = s.ctl("status", None);
    assert!(st.contains("recovery"), "{st}");
    s.stop();
    let e = examine(&members[3]);
    let off: u64 = mdadm_field(&e, "Recovery Offset")
        .and_then(|v| v.split_whitespace().next().map(|n| n.parse().unwrap()))
        .unwrap_or_else(|| panic!("no recovery checkpoint recorded:\n{e}"));
    assert!(off > 0, "{e}");
    let out = ok(uraid(&["assemble"].iter().copied().chain(paths(&members)).collect::<Vec<_>>()), "assemble");
    assert!(out.contains(&format!("rebuild of slot 3 from sector {off}")), "{out}");
    let s = Served::start(&dir, &members, &[]);
    wait_in_sync(&s, 4);
    s.ctl("fail", Some(&members[0]));
    qemu_io(&s.url, &read_cmds(&p));
    s.stop();
}

#[test]
fn stopped_resync_resumes_from_its_checkpoint() {
    let dir = TempDir::new("resync-resume");
    // A new raid6 without a bitmap: a full resync at the first start.
    let members = create(&dir, "6", 4, &["--bitmap", "none"]);
    let slow = ["--sync-speed-min", "2000", "--sync-speed-max", "4000"];
    let s = Served::start(&dir, &members, &slow);
    // About 47 MiB of member sectors at 4 MiB/s: stop once a few MiB are done, well
    // before the end.
    let t0 = std::time::Instant::now();
    let st = loop {
        let st = s.ctl("status", None);
        if resync_done_kib(&st) >= 4096 {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the resync made no progress:\n{st}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let full_kib = resync_total_kib(&st);
    s.stop();
    // mdadm --examine prints no resync offset; uraid examine does.
    let e = ok(uraid(&["examine", members[0].to_str().unwrap()]), "uraid examine");
    let off: u64 = e
        .split("resync from sector ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no resync checkpoint recorded:\n{e}"));
    assert!(off > 0, "{e}");
    // The next start resyncs only what is left, counted as md counts it: the whole member,
    // done from the checkpoint (rounded down to a sync unit, at most 1 MiB), not from 0.
    let s = Served::start(&dir, &members, &slow);
    let st = s.ctl("status", None);
    let (done_kib, total_kib) = (resync_done_kib(&st), resync_total_kib(&st));
    assert!(
        total_kib == full_kib && done_kib + 1024 >= off / 2,
        "resumed resync at {done_kib} of {total_kib} KiB (first start: {full_kib}), checkpoint at sector {off}:\n{st}"
    );
    s.stop();
}

/// What the resync in progress has done, KiB (`uraid status`'s "(done/total)").
fn resync_done_kib(status: &str) -> u64 {
    status
        .split("resync = ")
        .nth(1)
        .and_then(|r| r.split('(').nth(1))
        .and_then(|r| r.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The total of the resync in progress in `uraid status`, KiB.
fn resync_total_kib(status: &str) -> u64 {
    status
        .split("resync = ")
        .nth(1)
        .and_then(|r| r.split('/').nth(1))
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no resync in progress:\n{status}"))
}

/// md's resync reads and compares, and writes parity (raid4/5/6) or a copy (raid10, raid1)
/// only where it disagrees: a new array on sparse files stays sparse through its first
/// resync (was: P and Q of every stripe written, the files allocated in full), and where
/// the redundancy is wrong the resync still makes it right (md's own check finds nothing).
#[test]
fn a_new_array_on_sparse_members_stays_sparse_through_its_resync() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    const MIB: u64 = 1 << 20;
    for (level, n) in [("6", 6), ("10", 4)] {
        let dir = TempDir::new(&format!("sparse{level}"));
        let members: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("s{i}.img"))).collect();
        let ns = n.to_string();
        let mut args = vec!["create", "--level", level, "--raid-devices", &ns, "--size", "32M"];
        args.extend(["--chunk", "64K", "--bitmap", "internal"]);
        args.extend(paths(&members));
        ok(uraid(&args), "create");
        let allocated =
            || -> u64 { members.iter().map(|m| std::fs::metadata(m).unwrap().blocks() * 512).sum() };
        let before = allocated();
        // 1 MiB of one member's data area holds something else: there the redundancy is
        // wrong and the resync must rewrite it.
        let junk: Vec<u8> = (0..MIB as u32).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8 | 1).collect();
        let f = std::fs::OpenOptions::new().write(true).open(&members[1]).unwrap();
        f.write_all_at(&junk, 8 * MIB).unwrap();
        drop(f);
        let s = Served::start(&dir, &members, &[]);
        wait_log(&s, "resync done");
        s.stop();
        let grown = allocated() - before;
        eprintln!("raid{level}: the first resync allocated {} KiB of the members", grown >> 10);
        // The junk (1 MiB) and what it makes wrong: at most the P and Q (or the other
        // copy) of its chunks, and the metadata's updates; not the 64 MiB of P and Q.
        assert!(grown <= 6 * MIB, "raid{level}: the resync allocated {grown} bytes of sparse members");
        assert_eq!(md_mismatch_cnt(&members), 0, "raid{level}: md's check after the resync");
    }
}

/// The parity kernel's choice is the kernel's boot banner (`raid6: ... gen() N MB/s`), not
/// news at every start of an array: a served RAID6 that computes P and Q says nothing of it
/// (before, every start printed "uraid-parity: raid6: gen() MB/s: ..."); `URAID_PARITY_LOG=1`
/// asks for it.
#[test]
fn a_served_array_does_not_print_the_parity_kernel_banner() {
    let dir = TempDir::new("nobanner");
    let members = create(&dir, "6", 4, &["--assume-clean"]);
    let s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &["write -P 0x42 0 1M".to_string(), "flush".to_string()]);
    qemu_io(&s.url, &["read -P 0x42 0 1M".to_string()]);
    let log = s.stop();
    assert!(!log.contains("uraid-parity") && !log.contains("gen() MB/s"), "{log}");
}
