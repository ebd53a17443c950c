//! kill -9 of `uraid serve` while writes are in flight, restart: every acknowledged write
//! reads back; after the resync every member agrees with the others: Linux md's `check`
//! (in a VM) finds no mismatch, and each member left out in turn, the array reads the same
//! through the rest. Also a member failed under writes and rebuilt (docs/reliability.md).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use uraid_io::loopdev::LoopDevice;

const BLOCK: u64 = 64 << 10;

fn wait_idle(s: &Served) {
    let t0 = Instant::now();
    let c = s.control.display().to_string();
    loop {
        let p = ok(uraid(&["status", "--control", &c]), "uraid status");
        if !p.contains("resync") && !p.contains("recovery") {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the resync did not end:\n{p}\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn crash_and_check(level: &str, n: usize) {
    let dir = TempDir::new(&format!("crash{level}"));
    let members: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("c{i}"))).collect();
    crash_and_check_on(&dir, level, &members, &members, || ());
}

/// The same on members that are block devices: loop devices over files on the work disk
/// (root and the loop driver, as CI has), detached before md reads their files.
fn crash_and_check_on_loop_devices(level: &str, n: usize) {
    let dir = TempDir::new(&format!("crashblk{level}"));
    let backing_dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("crashblk{level}-{}", std::process::id()));
    std::fs::create_dir_all(&backing_dir).unwrap();
    let files: Vec<PathBuf> = (0..n).map(|i| backing_dir.join(format!("b{i}.img"))).collect();
    let loops: Vec<LoopDevice> = files
        .iter()
        .map(|f| {
            LoopDevice::attach(f, 24 << 20).unwrap_or_else(|e| panic!("this test needs loop devices: {e}"))
        })
        .collect();
    let devices: Vec<PathBuf> = loops.iter().map(|l| l.path().to_path_buf()).collect();
    let loops = std::cell::RefCell::new(Some(loops));
    crash_and_check_on(&dir, level, &devices, &files, || drop(loops.borrow_mut().take()));
    let _ = std::fs::remove_dir_all(&backing_dir);
}

/// `members` as the array's devices, `images` the files md reads afterwards; `release`
/// runs before md reads them.
fn crash_and_check_on(
    dir: &TempDir,
    level: &str,
    members: &[PathBuf],
    images: &[PathBuf],
    release: impl FnOnce(),
) {
    let n = members.len();
    let count = n.to_string();
    let mut args = vec!["create", "--level", level, "--raid-devices", &count, "--bitmap", "internal"];
    let on_files = members == images;
    if on_files {
        args.extend(["--size", "24M"]);
    }
    if level != "1" {
        args.extend(["--chunk", "64K"]);
    }
    args.extend(paths(members));
    ok(uraid(&args), "uraid create");
    let served = Served::start(dir, members, &[]);
    wait_idle(&served);

    // One block after another, each acknowledged before the next is sent; the server is
    // killed part way, with writes in flight.
    let blocks = 160u64;
    let mut qargs: Vec<String> = vec!["-f".into(), "raw".into()];
    for k in 0..blocks {
        qargs.push("-c".into());
        qargs.push(format!("write -P {} {} {BLOCK}", 1 + k % 250, k * BLOCK));
    }
    qargs.push(served.url.clone());
    let mut writer = Command::new("qemu-io")
        .args(&qargs)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("qemu-io (scripts/install-deps.sh installs it)");
    let mut acked = Vec::new();
    let mut lines = BufReader::new(writer.stdout.take().unwrap()).lines();
    let mut server = served;
    while let Some(Ok(line)) = lines.next() {
        if let Some(rest) = line.strip_prefix("wrote 65536/65536 bytes at offset ") {
            acked.push(rest.trim().parse::<u64>().unwrap() / BLOCK);
        }
        if acked.len() == 60 {
            let mut child = server.child.take().unwrap();
            child.kill().unwrap();
            child.wait().unwrap();
            break;
        }
    }
    let _ = writer.kill();
    let _ = writer.wait();
    assert_eq!(acked.len(), 60, "qemu-io stopped early:\n{}", server.log_text());
    drop(server);

    // Restart: the array was dirty, so it resyncs (bitmap-limited).
    let restarted = Served::start(dir, members, &[]);
    wait_idle(&restarted);
    let whole = read_array(dir, &restarted.url);
    for k in &acked {
        let at = (k * BLOCK) as usize;
        let want = (1 + k % 250) as u8;
        assert!(
            whole[at..at + BLOCK as usize].iter().all(|&b| b == want),
            "{level}: acknowledged block {k} did not survive the crash"
        );
    }
    restarted.stop();

    // Every member agrees with the others: any one left out, the rest read the same.
    for skip in 0..n {
        let rest: Vec<PathBuf> =
            members.iter().enumerate().filter(|(i, _)| *i != skip).map(|(_, p)| p.clone()).collect();
        let s = Served::start(dir, &rest, &["--run", "--read-only"]);
        let image = read_array(dir, &s.url);
        assert!(image == whole, "{level}: without member {skip} the array reads differently");
        s.stop();
    }

    // Real md agrees: same bytes, and its own check finds no inconsistent stripe.
    release();
    let md = md_check(images);
    assert_eq!(md.sha256, sha256_bytes(&whole), "{level}: md reads the array differently");
    assert_eq!(md.mismatch_cnt, 0, "{level}: md's check found inconsistent stripes after the resync");
}

#[test]
fn raid1_crash_resync_and_every_member_agrees() {
    crash_and_check("1", 3);
}

#[test]
fn raid5_crash_resync_and_every_member_agrees() {
    crash_and_check("5", 4);
}

#[test]
fn raid6_crash_resync_and_every_member_agrees() {
    crash_and_check("6", 5);
}

#[test]
fn raid10_crash_resync_and_every_member_agrees() {
    crash_and_check("10", 4);
}

#[test]
fn raid6_on_block_devices_crash_resync_and_every_member_agrees() {
    crash_and_check_on_loop_devices("6", 5);
}

#[test]
fn a_member_failed_under_writes_and_rebuilt_passes_md_check() {
    for (level, n) in [("5", 3), ("1", 2)] {
        let dir = TempDir::new(&format!("rebuilt{level}"));
        let members: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("r{i}"))).collect();
        let count = n.to_string();
        let mut args =
            vec!["create", "--level", level, "--raid-devices", &count, "--size", "24M", "--assume-clean"];
        args.extend(paths(&members));
        ok(uraid(&args), "uraid create");
        let served = Served::start(&dir, &members, &["--debug-fault", "member=1,op=write,after=10"]);
        let cmds: Vec<String> =
            (0..64).map(|k| format!("write -P {} {} {BLOCK}", 1 + k, k * BLOCK)).collect();
        qemu_io(&served.url, &cmds);
        let c = served.control.display().to_string();
        // The injected rule keeps failing slot 1's writes: the first failed ranges go to its
        // bad-block log, then the log's own write fails and the member goes out (status
        // shows it at the monitor's next look). A fresh file is rebuilt into its slot.
        let t0 = Instant::now();
        loop {
            let st = ok(uraid(&["status", "--control", &c]), "status");
            if st.contains("(F)") {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the member did not fail:\n{st}\n{}",
                served.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        served.stop();
        let fresh = dir.path("fresh");
        std::fs::write(&fresh, vec![0u8; 24 << 20]).unwrap();
        let mut now: Vec<PathBuf> = members.clone();
        now[1] = fresh.clone();
        let s =
            Served::start(&dir, &now[..1].iter().chain(&now[2..]).cloned().collect::<Vec<_>>(), &["--run"]);
        let c = s.control.display().to_string();
        ok(uraid(&["add", fresh.to_str().unwrap(), "--control", &c]), "uraid add");
        wait_idle(&s);
        let whole = read_array(&dir, &s.url);
        for k in 0..64u64 {
            let at = (k * BLOCK) as usize;
            assert!(
                whole[at..at + BLOCK as usize].iter().all(|&b| b == (1 + k) as u8),
                "{level}: block {k} lost"
            );
        }
        s.stop();
        let md = md_check(&now);
        assert_eq!(md.sha256, sha256_bytes(&whole), "{level}: md reads the rebuilt array differently");
        assert_eq!(md.mismatch_cnt, 0, "{level}: md's check found inconsistent stripes after the rebuild");
    }
}

#[test]
fn a_dirty_degraded_raid5_starts_only_with_force() {
    let dir = TempDir::new("dirtydegraded");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("f{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--size", "16M", "--assume-clean"];
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let served = Served::start(&dir, &members, &[]);
    qemu_io(&served.url, &["write -P 0x6b 0 4M".to_string(), "flush".to_string()]);
    // Killed right after the writes, before the array is marked clean again.
    let mut s = served;
    let mut child = s.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let ex = ok(uraid(&["examine", members[0].to_str().unwrap()]), "uraid examine");
    assert_eq!(mdadm_field(&ex, "State").as_deref(), Some("active"), "the array should be left dirty:\n{ex}");

    let two = &members[..2];
    let before: Vec<String> = members.iter().map(|p| sha256_file(p)).collect();
    let mut a = vec!["serve", "--run", "--unix"];
    let sock = dir.path("x.sock");
    a.push(sock.to_str().unwrap());
    a.extend(paths(two));
    let o = uraid(&a);
    assert!(!o.status.success() && text(&o).contains("--force"), "{}", text(&o));
    // Two of three is enough for a clean raid5: the refusal is about the dirty state.
    assert!(
        text(&o).contains("not shut down cleanly") && !text(&o).contains("not enough members"),
        "{}",
        text(&o)
    );
    assert_eq!(members.iter().map(|p| sha256_file(p)).collect::<Vec<_>>(), before, "a refused start wrote");

    let forced = Served::start(&dir, two, &["--run", "--force"]);
    assert!(forced.log_text().contains("forced"), "{}", forced.log_text());
    let data = read_array(&dir, &forced.url);
    assert!(data[..4 << 20].iter().all(|&b| b == 0x6b), "the flushed writes did not read back");
    forced.stop();
}

/// `create --assume-clean` says the members are in sync: the bitmap starts with no bit set,
/// so a kill -9 in the first seconds of the array's life resyncs what was written then,
/// not the whole array (every bit set at create made it resync everything).
#[test]
fn kill_9_soon_after_an_assume_clean_create_resyncs_only_what_was_written() {
    let dir = TempDir::new("assumeclean");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("a{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--size", "64M", "--assume-clean"];
    args.extend(["--bitmap", "internal", "--bitmap-chunk", "1M"]);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let ex = ok(uraid(&["examine", paths(&members)[0]]), "uraid examine");
    assert!(ex.contains(", 0 dirty"), "a new --assume-clean array has bitmap bits set:\n{ex}");
    let mut served = Served::start(&dir, &members, &[]);
    qemu_io(&served.url, &["write -P 0x5a 1M 64k".to_string()]);
    let mut child = served.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let out = ok(uraid(&["assemble"].iter().copied().chain(paths(&members)).collect::<Vec<_>>()), "assemble");
    // The 64 KiB write lies in one 1 MiB bitmap chunk of each member.
    assert!(
        out.contains("On start: resync of 1 bitmap chunk (1024.00 KiB of each member)"),
        "the restart resyncs more than one chunk for one 64 KiB write, or nothing:\n{out}"
    );
    let s = Served::start(&dir, &members, &[]);
    wait_idle(&s);
    qemu_io(&s.url, &["read -P 0x5a 1M 64k".to_string()]);
    s.stop();
}

/// A rebuild onto a block device: a RAID5 on loop devices (files on the work disk) loses a
/// member under writes, a fresh loop device is added and rebuilt while the writes go on;
/// everything reads back, and md finds the rebuilt array consistent.
#[test]
fn a_rebuild_onto_a_block_device_passes_md_check() {
    let dir = TempDir::new("rebuildblk");
    let backing_dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rebuildblk-{}", std::process::id()));
    std::fs::create_dir_all(&backing_dir).unwrap();
    let files: Vec<PathBuf> = (0..4).map(|i| backing_dir.join(format!("b{i}.img"))).collect();
    let loops: Vec<LoopDevice> = files
        .iter()
        .map(|f| {
            LoopDevice::attach(f, 24 << 20).unwrap_or_else(|e| panic!("this test needs loop devices: {e}"))
        })
        .collect();
    let devs: Vec<PathBuf> = loops.iter().map(|l| l.path().to_path_buf()).collect();
    let mut args =
        vec!["create", "--level", "5", "--raid-devices", "3", "--assume-clean", "--bitmap", "internal"];
    args.extend(paths(&devs[..3]));
    ok(uraid(&args), "uraid create");
    let s = Served::start(&dir, &devs[..3], &[]);
    let first: Vec<String> = (0..32).map(|k| format!("write -P {} {} {BLOCK}", 1 + k, k * BLOCK)).collect();
    qemu_io(&s.url, &first);
    s.ctl("fail", Some(&devs[1]));
    s.ctl("remove", Some(&devs[1]));
    s.ctl("add", Some(&devs[3]));
    let second: Vec<String> = (32..64).map(|k| format!("write -P {} {} {BLOCK}", 1 + k, k * BLOCK)).collect();
    qemu_io(&s.url, &second);
    wait_idle(&s);
    let whole = read_array(&dir, &s.url);
    for k in 0..64u64 {
        let at = (k * BLOCK) as usize;
        assert!(whole[at..at + BLOCK as usize].iter().all(|&b| b == (1 + k) as u8), "block {k} lost");
    }
    let st = s.ctl("status", None);
    assert!(st.contains("[UUU]"), "{st}");
    s.stop();
    drop(loops);
    let md = md_check(&[files[0].clone(), files[3].clone(), files[2].clone()]);
    assert_eq!(md.sha256, sha256_bytes(&whole), "md reads the rebuilt array differently");
    assert_eq!(md.mismatch_cnt, 0, "md's check found inconsistent stripes after the rebuild");
    let _ = std::fs::remove_dir_all(&backing_dir);
}
