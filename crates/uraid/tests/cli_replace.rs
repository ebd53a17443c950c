//! `uraid replace MEMBER --with NEW` (mdadm --replace, md's want_replacement): under fio's
//! verifying writes the array is never degraded, NEW takes the slot and MEMBER is released;
//! md's own check of the result finds nothing wrong. Every refusal (too small, not an
//! in-sync member, another array's member, a device held by another process, raid0, a
//! degraded array) names its reason and leaves every file as it was.

mod common;

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;

/// Random 8 KiB writes over the first 64 MiB with crc32c in every block (as cli_fio).
fn fio(url: &str, extra: &[&str]) -> Reaped {
    spawn_fio(&fio_verify_job("uraid-replace", url, "64m", 20240611, extra))
}

fn check_fio(o: &Output, what: &str, s: &Served) {
    check_fio_run(o, what, 8192, &s.log_text());
}

fn replace(control: &Path, member: &Path, new: &Path, force: bool) -> Output {
    let c = control.display().to_string();
    let mut args =
        vec!["replace", member.to_str().unwrap(), "--with", new.to_str().unwrap(), "--control", &c];
    if force {
        args.push("--force");
    }
    uraid(&args)
}

/// Whether some process holds an exclusive flock on `p` (the claim of a running array).
fn claimed(p: &Path) -> bool {
    let f = OpenOptions::new().read(true).open(p).unwrap();
    // SAFETY: flock on a descriptor we own.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    r != 0
}

fn sparse(p: &Path, bytes: u64) {
    OpenOptions::new().create(true).truncate(true).write(true).open(p).unwrap().set_len(bytes).unwrap();
}

fn create(dir: &TempDir, level: &str, names: &[&str], size: &str, extra: &[&str]) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = names.iter().map(|n| dir.path(n)).collect();
    let n = names.len().to_string();
    let mut args = vec!["create", "--level", level, "--raid-devices", &n, "--size", size, "--assume-clean"];
    args.extend_from_slice(extra);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    members
}

/// Waits (at most 60 s) until no replacement is shown in `status` any more.
fn wait_replaced(s: &Served) {
    let t0 = Instant::now();
    while s.ctl("status", None).contains("(R)") {
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", s.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn hashes(files: &[PathBuf]) -> Vec<String> {
    files.iter().map(|p| sha256_file(p)).collect()
}

#[test]
fn replace_under_fio_verify_never_degrades_the_array() {
    let o = tool("fio", &["--enghelp=nbd"]);
    assert!(o.status.success() && text(&o).contains("uri"), "this fio has no nbd engine:\n{}", text(&o));
    let dir = TempDir::new("replace-fio");
    let members = create(
        &dir,
        "6",
        &["m0", "m1", "m2", "m3", "m4", "m5"],
        "32M",
        &["--chunk", "64K", "--bitmap", "internal"],
    );
    let new = dir.path("new.img");
    sparse(&new, std::fs::metadata(&members[2]).unwrap().len());
    // About 8 MB/s: the 32 MiB copy lasts some seconds, across fio's writes and its verify.
    let s = Served::start(&dir, &members, &["--sync-speed-min", "8000", "--sync-speed-max", "8000"]);

    let mut job = fio(&s.url, &["--rate_iops=4000"]);
    std::thread::sleep(Duration::from_millis(300));
    let o = replace(&s.control, &members[2], &new, false);
    assert!(o.status.success() && text(&o).contains("rebuilt to replace"), "{}", text(&o));

    // `status` throughout, until fio is done and the replacement has taken the slot: every
    // slot in sync every time, the replacement shown as (R) with its recovery progress.
    let t0 = Instant::now();
    let (mut polls, mut seen_r, mut seen_progress, mut seen_during_fio) = (0, false, false, false);
    let new_name = new.display().to_string();
    loop {
        let st = s.ctl("status", None);
        polls += 1;
        assert!(
            st.contains("[6/6] [UUUUUU]") && !st.contains("degraded") && !st.contains("(F)"),
            "degraded during the replacement (poll {polls}):\n{st}\n{}",
            s.log_text()
        );
        let fio_running = !job.try_done();
        if st.contains("(R)") {
            seen_r = true;
            seen_during_fio |= fio_running;
            seen_progress |= st.contains("recovery =");
        }
        let done = !st.contains("(R)") && st.contains(&format!("{new_name}[")) && !st.contains("recovery");
        if done && !fio_running {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the replacement did not finish:\n{st}\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(seen_r && seen_progress, "the replacement never showed in status ({polls} polls)");
    assert!(seen_during_fio, "the copy did not overlap fio's run; the test proves nothing");
    check_fio(&job.wait(), "random write + verify during the replacement", &s);

    // The old member is out of the array and released, as `remove` would leave it.
    let detail = s.ctl("detail", None);
    assert!(!detail.contains(&members[2].display().to_string()), "{detail}");
    assert!(detail.contains(&new_name) && detail.contains("active sync"), "{detail}");
    // Released once the last I/O of the set it left is reaped: a moment after `status`
    // shows the replacement done on a loaded machine (a clean-clone run saw it still held).
    let t0 = Instant::now();
    while claimed(&members[2]) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!claimed(&members[2]), "the replaced member is still claimed 10 s after the replacement");
    assert!(claimed(&new), "the new member is not claimed");

    // The new member holds the right bytes: lose two others so most stripes need it.
    check_fio(&fio(&s.url, &["--verify_only"]).wait(), "verify-only after the replacement", &s);
    s.ctl("fail", Some(&members[0]));
    s.ctl("fail", Some(&members[4]));
    check_fio(&fio(&s.url, &["--verify_only"]).wait(), "verify-only through the new member", &s);
    s.stop();
}

#[test]
fn replace_then_md_finds_the_array_consistent() {
    let dir = TempDir::new("replace-md");
    let members = create(&dir, "5", &["m0", "m1", "m2"], "16M", &["--bitmap", "internal"]);
    let new = dir.path("new.img");
    sparse(&new, std::fs::metadata(&members[1]).unwrap().len());
    let s = Served::start(&dir, &members, &[]);
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let img = dir.path("data.bin");
    std::fs::write(&img, &data).unwrap();
    ok(tool("nbdcopy", &[img.to_str().unwrap(), &s.url]), "nbdcopy");
    let o = replace(&s.control, &members[1], &new, false);
    assert!(o.status.success(), "{}", text(&o));
    wait_replaced(&s);
    // What uraid serves after the replacement, to compare with what md reads.
    let back = dir.path("back.bin");
    ok(tool("nbdcopy", &[&s.url, back.to_str().unwrap()]), "nbdcopy back");
    let served_sha = sha256_file(&back);
    s.stop();
    // md assembles the members with the new one in slot 1 (the old one left out), reads
    // the same bytes, and its check finds every stripe consistent.
    let images = vec![members[0].clone(), new.clone(), members[2].clone()];
    let md = md_check(&images);
    assert_eq!(md.mismatch_cnt, 0, "md's check after the replacement");
    assert_eq!(md.sha256, served_sha, "md reads other bytes than uraid served");
}

#[test]
fn replace_refusals_name_the_reason_and_write_nothing() {
    let dir = TempDir::new("replace-refuse");
    let members = create(&dir, "5", &["m0", "m1", "m2"], "8M", &["--name", "mine"]);
    let theirs = create(&dir, "1", &["t0", "t1"], "8M", &["--name", "theirs"]);
    let small = dir.path("small.img");
    sparse(&small, 1 << 20);
    let spare = dir.path("spare.img");
    sparse(&spare, std::fs::metadata(&members[0]).unwrap().len());
    let fresh = dir.path("fresh.img");
    sparse(&fresh, std::fs::metadata(&members[0]).unwrap().len());
    let s = Served::start(&dir, &members, &[]);
    let out = s.ctl("add", Some(&spare));
    assert!(out.contains("hot spare"), "{out}");

    let mut all: Vec<PathBuf> = members.clone();
    all.extend(theirs.iter().cloned());
    all.extend([small.clone(), spare.clone(), fresh.clone()]);
    let before = hashes(&all);
    let refused = |member: &Path, new: &Path, force: bool, why: &str| {
        let o = replace(&s.control, member, new, force);
        assert!(!o.status.success() && text(&o).contains(why), "expected {why:?}:\n{}", text(&o));
        assert_eq!(hashes(&all), before, "a refused replace ({why}) changed a file");
        assert!(!s.ctl("status", None).contains("(R)"));
    };
    refused(&members[0], &small, false, "too small");
    refused(&spare, &fresh, false, "not active and in sync");
    refused(&members[0], &members[1], false, "already in the array");
    refused(&members[0], &theirs[0], false, "another array");
    // Held by another process: refused even with --force.
    let other_dir = TempDir::new("replace-refuse-b");
    let theirs_served = Served::start(&other_dir, &theirs, &[]);
    refused(&members[0], &theirs[1], true, "is in use");
    theirs_served.stop();
    let before_degraded = hashes(std::slice::from_ref(&fresh));
    // Without the hot spare, which would take the failed slot and might finish its
    // rebuild before the replace is asked for.
    let out = s.ctl("remove", Some(&spare));
    assert!(out.contains("hot removed"), "{out}");
    s.ctl("fail", Some(&members[2]));
    let o = replace(&s.control, &members[0], &fresh, false);
    assert!(!o.status.success() && text(&o).contains("degraded"), "{}", text(&o));
    assert_eq!(hashes(std::slice::from_ref(&fresh)), before_degraded);
    s.stop();

    // raid0: nothing to copy under.
    let dir0 = TempDir::new("replace-raid0");
    let r0 = create(&dir0, "0", &["a", "b"], "8M", &[]);
    let new0 = dir0.path("n.img");
    sparse(&new0, 16 << 20);
    let s0 = Served::start(&dir0, &r0, &[]);
    let mut files = r0.clone();
    files.push(new0.clone());
    let before = hashes(&files);
    let o = replace(&s0.control, &r0[0], &new0, false);
    assert!(!o.status.success() && text(&o).contains("raid0"), "{}", text(&o));
    assert_eq!(hashes(&files), before);
    s0.stop();
}

#[test]
fn a_stop_in_the_middle_keeps_the_member_and_never_takes_the_unfinished_copy() {
    let dir = TempDir::new("replace-stop");
    let members = create(&dir, "5", &["m0", "m1", "m2"], "16M", &[]);
    let new = dir.path("new.img");
    sparse(&new, std::fs::metadata(&members[1]).unwrap().len());
    // 500 KiB/s: the 16 MiB copy is far from done when the server stops.
    let slow = ["--sync-speed-min", "500", "--sync-speed-max", "500"];
    let s = Served::start(&dir, &members, &slow);
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    let img = dir.path("data.bin");
    std::fs::write(&img, &data).unwrap();
    ok(tool("nbdcopy", &[img.to_str().unwrap(), &s.url]), "nbdcopy");
    let o = replace(&s.control, &members[1], &new, false);
    assert!(o.status.success(), "{}", text(&o));
    // Until the copy has made progress, so the writes below land on both sides of it.
    let t0 = Instant::now();
    loop {
        let st = s.ctl("status", None);
        assert!(st.contains("(R)"), "the copy should still run:\n{st}");
        let copied = st.split_once("% (").and_then(|(_, r)| r.split('/').next()?.parse::<u64>().ok());
        if copied.is_some_and(|k| k > 0) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the copy made no progress:\n{st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Writes after the copy started reach both; then the server stops mid-copy.
    ok(tool("nbdcopy", &[img.to_str().unwrap(), &s.url]), "nbdcopy again");
    s.stop();

    // Offered everything, assembly keeps slot 1's in-sync member and leaves the
    // unfinished replacement out; the data is intact and nothing is degraded.
    let mut offered = members.clone();
    offered.push(new.clone());
    let s = Served::start(&dir, &offered, &[]);
    let st = s.ctl("status", None);
    assert!(st.contains("[3/3] [UUU]") && !st.contains("(R)"), "{st}\n{}", s.log_text());
    assert!(s.log_text().contains("unfinished replacement"), "{}", s.log_text());
    let back = dir.path("back.bin");
    ok(tool("nbdcopy", &[&s.url, back.to_str().unwrap()]), "nbdcopy back");
    let got = std::fs::read(&back).unwrap();
    assert!(got[..data.len()] == data[..], "data changed across the interrupted replacement");
    // The same device can be given again; this time the copy runs to the end.
    let o = replace(&s.control, &members[1], &new, false);
    assert!(o.status.success(), "{}", text(&o));
    wait_replaced(&s);
    assert!(!claimed(&members[1]));
    s.ctl("fail", Some(&members[0]));
    let back2 = dir.path("back2.bin");
    ok(tool("nbdcopy", &[&s.url, back2.to_str().unwrap()]), "nbdcopy through the new member");
    assert!(std::fs::read(&back2).unwrap()[..data.len()] == data[..], "the new member's data differs");
    s.stop();
}

/// The disk a replacement took over, offered again with the others (`serve *.img` in a
/// folder that still holds it), is left out and never written: the array no longer lists
/// it in its slot, so it is no re-add, and only a disk the user names becomes a spare.
#[test]
fn a_replaced_disk_offered_again_is_left_out_and_never_written() {
    let dir = TempDir::new("replaced-again");
    let members = create(&dir, "5", &["m0", "m1", "m2"], "16M", &["--bitmap", "internal"]);
    let new = dir.path("n1.img");
    sparse(&new, std::fs::metadata(&members[1]).unwrap().len());
    let s = Served::start(&dir, &members, &[]);
    let o = replace(&s.control, &members[1], &new, false);
    assert!(o.status.success(), "{}", text(&o));
    wait_replaced(&s);
    s.stop();
    let before = sha256_file(&members[1]);
    let all = vec![members[0].clone(), members[1].clone(), members[2].clone(), new.clone()];
    let s = Served::start(&dir, &all, &[]);
    let t0 = Instant::now();
    while !s.log_text().contains("uraid: serving") {
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", s.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = s.ctl("status", None);
    let log = s.stop();
    assert_eq!(sha256_file(&members[1]), before, "the replaced disk was written:\n{log}");
    assert!(!log.contains("hot spare"), "{log}");
    assert!(log.contains("not written"), "the log does not say why it was left out:\n{log}");
    assert!(status.contains("[UUU]"), "{status}");
}
