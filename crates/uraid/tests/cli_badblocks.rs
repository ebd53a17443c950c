//! md's bad-block log under `uraid serve`: a member write that fails (`--debug-fault`) is
//! recorded in that member's log instead of failing it; clients read the right bytes; the
//! log is on disk after stop, read again at the next assembly, shown by `examine` and
//! `detail` as mdadm --examine-badblocks does; real md lists the same entries and
//! assembles the members to the same bytes.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

fn status(s: &Served) -> String {
    let c = s.control.display().to_string();
    let o = bounded(URAID, &["status", "--control", &c], Duration::from_secs(10));
    assert!(o.status.success(), "uraid status: {}", text(&o));
    text(&o)
}

fn detail(s: &Served) -> String {
    let c = s.control.display().to_string();
    let o = bounded(URAID, &["detail", "--control", &c], Duration::from_secs(10));
    assert!(o.status.success(), "uraid detail: {}", text(&o));
    text(&o)
}

/// The "SECTOR for LEN sectors" lines after "Bad-blocks on NAME:".
fn listed(out: &str, name: &str) -> Vec<(u64, u64)> {
    let head = format!("Bad-blocks on {name}:");
    out.lines()
        .skip_while(|l| l.trim() != head)
        .skip(1)
        .map_while(|l| {
            let (s, rest) = l.trim().split_once(" for ")?;
            Some((s.parse().ok()?, rest.strip_suffix(" sectors")?.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_failed_member_write_is_logged_not_fatal_and_md_agrees() {
    let dir = TempDir::new("badblocks");
    let members: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("m{i}"))).collect();
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2", "--size", "16M", "--assume-clean"];
    args.extend(["--bitmap", "none", "--name", "bb"]);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let m1 = members[1].display().to_string();

    // The 5th write to member 1 fails (the first is its superblock marked dirty).
    let served = Served::start(&dir, &members, &["--debug-fault", "member=1,op=write,after=4,count=1"]);
    let src = dir.path("pattern");
    let data: Vec<u8> =
        (0..4usize << 20).map(|i| (i as u8).wrapping_mul(31).wrapping_add(i as u8 >> 3)).collect();
    std::fs::write(&src, &data).unwrap();
    let o = bounded("nbdcopy", &["--flush", src.to_str().unwrap(), &served.url], Duration::from_secs(30));
    assert!(o.status.success(), "nbdcopy in: {}", text(&o));
    let t0 = Instant::now();
    while !served.log_text().contains("recorded in its bad-block log") {
        assert!(t0.elapsed() < Duration::from_secs(15), "no bad block recorded:\n{}", served.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(status(&served).contains("[UU]"), "the member was failed:\n{}", status(&served));
    let shown = listed(&detail(&served), &m1);
    assert!(!shown.is_empty(), "detail lists no bad block:\n{}", detail(&served));
    let whole = read_array(&dir, &served.url);
    assert_eq!(&whole[..data.len()], &data[..], "a read returned what the failed write left");
    served.stop();

    // On disk after stop: the feature bit, the entries, in device sectors past data_offset.
    let ex = ok(uraid(&["examine", &m1]), "uraid examine");
    assert!(ex.contains("bad blocks present."), "{ex}");
    let on_disk = listed(&ex, &m1);
    assert_eq!(on_disk, shown, "{ex}");
    let data_offset: u64 =
        mdadm_field(&ex, "Data Offset").unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(on_disk.iter().all(|&(s, _)| s >= data_offset), "{ex}");
    let ex0 = ok(uraid(&["examine", &members[0].display().to_string()]), "uraid examine");
    assert!(!ex0.contains("Bad-blocks on"), "{ex0}");

    // The next assembly reads the log back: still listed, reads still right.
    let again = Served::start(&dir, &members, &[]);
    assert_eq!(listed(&detail(&again), &m1), shown);
    assert_eq!(read_array(&dir, &again.url), whole);
    again.stop();

    // Real md: the same entries, in mdadm's listing and in md's sysfs after assembly.
    let script = dir.path("md-badblocks.sh");
    std::fs::write(
        &script,
        "mdadm --examine-badblocks /dev/vdb\nmdadm --assemble /dev/md0 /dev/vda /dev/vdb\n\
         echo '=== sysfs'\ncat /sys/block/md0/md/dev-vdb/bad_blocks\necho '=== end'\nmdadm --stop /dev/md0\n",
    )
    .unwrap();
    let o = md_vm(&script, &members, true);
    let out = text(&o);
    assert_eq!(listed(&out, "/dev/vdb"), shown, "mdadm --examine-badblocks:\n{out}");
    let sysfs: Vec<(u64, u64)> = out
        .lines()
        .skip_while(|l| l.trim() != "=== sysfs")
        .skip(1)
        .take_while(|l| l.trim() != "=== end")
        .filter_map(|l| {
            let (a, b) = l.trim().split_once(' ')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    assert_eq!(sysfs, shown, "md's sysfs bad_blocks:\n{out}");
    let md = md_check(&members);
    assert_eq!(md.sha256, sha256_bytes(&whole), "md read other bytes");
    eprintln!("md's check of the array: mismatch_cnt {}", md.mismatch_cnt);
    assert_eq!(md.mismatch_cnt, 0, "md's check skips the listed range as it reads no copy there twice");
}
