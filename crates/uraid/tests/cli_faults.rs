//! Real member faults under `uraid serve` (`--debug-fault`): a failed superblock, bitmap or
//! flush write fails that member as md does; clients see no error while redundancy lasts,
//! and nothing hangs (docs/reliability.md).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn status(s: &Served) -> String {
    let c = s.control.display().to_string();
    let o = bounded(URAID, &["status", "--control", &c], Duration::from_secs(10));
    assert!(o.status.success(), "uraid status: {}", text(&o));
    text(&o)
}

/// Waits until `status` shows `want` (e.g. "[U_U]"), at most 60 s: a failure the array's
/// own flush finds (safe mode, a recovery checkpoint) comes late on a loaded machine.
fn wait_status(s: &Served, want: &str) -> String {
    let t0 = Instant::now();
    loop {
        let st = status(s);
        if st.contains(want) {
            return st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "status never showed {want}:\n{st}\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pattern_file(dir: &TempDir, len: usize, seed: u8) -> PathBuf {
    let p = dir.path(&format!("pattern-{seed}"));
    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    std::fs::write(&p, data).unwrap();
    p
}

/// nbdcopy without --flush: the data reaches the array, no flush follows from the client.
fn copy_in(src: &Path, url: &str) {
    let o = bounded("nbdcopy", &[src.to_str().unwrap(), url], Duration::from_secs(30));
    assert!(o.status.success(), "nbdcopy in: {}", text(&o));
}

#[test]
fn a_failing_superblock_and_bitmap_write_fails_the_member_not_the_client() {
    let dir = TempDir::new("metafault");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--name", "metafault"]);
    let served = Served::start(&dir, &members, &["--debug-fault", "member=1,op=meta"]);
    let src = pattern_file(&dir, 1 << 20, 3);
    copy_in(&src, &served.url);
    wait_status(&served, "[U_U]");
    assert_eq!(read_array(&dir, &served.url)[..1 << 20].to_vec(), std::fs::read(&src).unwrap());
    served.stop();
    // The others recorded the failure: the next start leaves member 1 out and the data stays.
    let again = Served::start(&dir, &members, &["--run"]);
    assert_eq!(read_array(&dir, &again.url)[..1 << 20].to_vec(), std::fs::read(&src).unwrap());
    again.stop();
}

#[test]
fn a_member_flush_failing_under_the_clean_marking_flush_does_not_hang() {
    let dir = TempDir::new("flushfault");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "none", "--name", "flushfault"]);
    // The first flush of member 2 is the one under its superblock marked dirty; the
    // second, the one the array issues before marking clean, fails.
    let served = Served::start(&dir, &members, &["--debug-fault", "member=2,op=flush,after=1"]);
    let src = pattern_file(&dir, 1 << 20, 5);
    // No client flush: the first flush of the data is the one before marking clean.
    copy_in(&src, &served.url);
    wait_status(&served, "[UU_]");
    assert!(
        !served.log_text().contains("failing the member"),
        "the member failed under a metadata write, not the clean-marking flush:\n{}",
        served.log_text()
    );
    assert_eq!(read_array(&dir, &served.url)[..1 << 20].to_vec(), std::fs::read(&src).unwrap());
    let stopped = Instant::now();
    served.stop();
    assert!(stopped.elapsed() < Duration::from_secs(15), "stopping took {:?}", stopped.elapsed());
}

#[test]
fn a_data_write_error_fails_the_member_and_writes_go_on() {
    let dir = TempDir::new("writefault");
    let members = create_clean(&dir, "6", 4, "16M", &["--bitmap", "internal", "--name", "writefault"]);
    let served = Served::start(&dir, &members, &["--debug-fault", "member=3,op=write,after=20"]);
    let src = pattern_file(&dir, 4 << 20, 9);
    copy_in(&src, &served.url);
    wait_status(&served, "[UUU_]");
    assert_eq!(read_array(&dir, &served.url)[..4 << 20].to_vec(), std::fs::read(&src).unwrap());
    served.stop();
}

/// Superblock writes and their flushes are member I/O through the executor, in order
/// with the data: a member whose flushes fail is failed by the first superblock round
/// (marking the array dirty), before any client flush.
#[test]
fn a_superblock_write_goes_through_the_executor_and_its_failed_flush_fails_the_member() {
    let dir = TempDir::new("sbflush");
    let members = create_clean(&dir, "1", 2, "16M", &["--bitmap", "none", "--name", "sbflush"]);
    let served = Served::start(&dir, &members, &["--debug-fault", "member=1,op=flush"]);
    let src = pattern_file(&dir, 1 << 20, 7);
    copy_in(&src, &served.url);
    wait_status(&served, "[U_]");
    let log = served.log_text();
    assert!(log.contains("writing the superblock failed"), "{log}");
    assert_eq!(read_array(&dir, &served.url)[..1 << 20].to_vec(), std::fs::read(&src).unwrap());
    served.stop();
}

/// A second member fails while a RAID6 rebuilds the first (slowed to 2 MB/s): its writes,
/// or its flushes (the rebuild's checkpoint flushes), start failing once the rebuild runs
/// (`when=`: the rule is armed by a file). Nothing hangs, the member is failed, the
/// rebuild finishes from the rest, clients see no error, and real md assembles the result
/// to the same bytes with `mismatch_cnt` 0.
fn second_failure_during_recovery(op: &str) {
    let dir = TempDir::new(&format!("recfault-{op}"));
    let members = create_clean(&dir, "6", 4, "16M", &["--bitmap", "none", "--name", "recfault"]);
    let arm = dir.path("arm");
    let rule = format!("member=3,op={op},when={}", arm.display());
    let served = Served::start(&dir, &members, &["--debug-fault", &rule, "--sync-speed-max", "2000"]);
    let before = pattern_file(&dir, 4 << 20, 11);
    copy_in(&before, &served.url);
    served.ctl("fail", Some(&members[0]));
    served.ctl("remove", Some(&members[0]));
    wait_status(&served, "[_UUU]");
    served.ctl("add", Some(&members[0]));
    wait_status(&served, "recovery");
    std::fs::write(&arm, b"").unwrap();
    // Writes while it rebuilds: they reach member 3 and fail there.
    let during = pattern_file(&dir, 2 << 20, 13);
    copy_in(&during, &served.url);
    wait_status(&served, "_]");
    assert!(status(&served).contains("recovery"), "member 3 failed while the rebuild ran");
    // The second failure happened mid-rebuild; the rest of the rebuild need not crawl.
    let c = served.control.display().to_string();
    ok(uraid(&["set", "sync_speed_max", "200000", "--control", &c]), "uraid set");
    let t0 = Instant::now();
    while status(&served).contains("recovery") {
        assert!(t0.elapsed() < Duration::from_secs(30), "the rebuild never finished:\n{}", served.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_status(&served, "[UUU_]");
    let mut want = std::fs::read(&before).unwrap();
    want[..2 << 20].copy_from_slice(&std::fs::read(&during).unwrap());
    assert_eq!(read_array(&dir, &served.url)[..4 << 20].to_vec(), want);
    let log = served.stop();
    assert!(log.contains("slot 3 failed"), "{log}");
    std::fs::remove_file(&arm).unwrap();
    // Started again from its superblocks: member 3 stays out, the data stays.
    let again = Served::start(&dir, &members, &["--run"]);
    let out = dir.path("whole");
    let o = bounded("nbdcopy", &[&again.url, out.to_str().unwrap()], Duration::from_secs(30));
    assert!(o.status.success(), "nbdcopy out: {}", text(&o));
    again.stop();
    let whole = std::fs::read(&out).unwrap();
    assert_eq!(whole[..4 << 20], want[..]);
    // What md makes of it: the same bytes, and its own check finds nothing to fix.
    let md = md_check(&members);
    assert_eq!(md.sha256, sha256_bytes(&whole));
    assert_eq!(md.mismatch_cnt, 0);
}

#[test]
fn a_member_whose_writes_fail_during_recovery_is_failed_and_the_rebuild_finishes() {
    second_failure_during_recovery("write");
}

#[test]
fn a_member_whose_flushes_fail_during_recovery_is_failed_and_the_rebuild_finishes() {
    second_failure_during_recovery("flush");
}

/// A member that stops answering (every write held, as a wedged disk or a dead path would)
/// is failed after `--member-timeout`; the client's writes go on degraded, `status` and
/// `detail` answer promptly throughout, and SIGTERM stops the server.
#[test]
fn a_member_that_never_answers_is_failed_after_its_timeout_and_nothing_waits_on_it() {
    let dir = TempDir::new("hung");
    let members = create_clean(&dir, "5", 4, "16M", &["--bitmap", "internal", "--name", "hung"]);
    let arm = dir.path("arm-hang");
    let rule = format!("member=1,op=write,hold,when={}", arm.display());
    let served = Served::start(&dir, &members, &["--member-timeout", "1s", "--debug-fault", &rule]);
    let first = pattern_file(&dir, 1 << 20, 11);
    copy_in(&first, &served.url);
    std::fs::write(&arm, b"").unwrap();
    // Writes while member 1 answers none of them: the copy completes once the member is
    // failed, within the timeout and a few superblock rounds, not never.
    let second = pattern_file(&dir, 2 << 20, 13);
    let o = {
        let url = served.url.clone();
        let src = second.clone();
        std::thread::spawn(move || {
            bounded("nbdcopy", &[src.to_str().unwrap(), &url], Duration::from_secs(30))
        })
    };
    let c = served.control.display().to_string();
    let t0 = Instant::now();
    while !o.is_finished() {
        let asked = Instant::now();
        let st = status(&served);
        let detail = bounded(URAID, &["detail", "--json", "--control", &c], Duration::from_secs(10));
        assert!(detail.status.success(), "detail: {}", text(&detail));
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "status and detail took {:?} with a member hung:\n{st}",
            asked.elapsed()
        );
        assert!(t0.elapsed() < Duration::from_secs(30), "the copy did not finish:\n{}", served.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = o.join().unwrap();
    assert!(o.status.success(), "nbdcopy with a hung member: {}\n{}", text(&o), served.log_text());
    wait_status(&served, "[U_UU]");
    let detail = ok(uraid(&["detail", "--json", "--control", &c]), "detail --json");
    let v: serde_json::Value = serde_json::from_str(&detail).unwrap();
    let hung = v["devices"].as_array().unwrap().iter().find(|d| d["raid_device"] == 1).unwrap_or_else(|| {
        panic!("no slot 1 in {detail}");
    });
    assert!(hung["io"]["timed_out_ios"].as_u64().unwrap() > 0, "no timed-out I/O counted:\n{detail}");
    let whole = read_array(&dir, &served.url);
    assert_eq!(whole[..2 << 20].to_vec(), std::fs::read(&second).unwrap());
    let stopped = Instant::now();
    served.stop();
    assert!(stopped.elapsed() < Duration::from_secs(5), "stopping took {:?}", stopped.elapsed());
}

/// When no member takes the superblocks that mark the array clean, the server must not say
/// "stopped cleanly": it says the close failed and exits with an error.
#[test]
fn a_close_that_no_member_records_is_not_reported_clean() {
    let dir = TempDir::new("closefail");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--name", "closefail"]);
    let arm = dir.path("arm-close");
    let rules: Vec<String> = (0..3).map(|m| format!("member={m},op=meta,when={}", arm.display())).collect();
    let mut extra: Vec<&str> = Vec::new();
    for r in &rules {
        extra.extend(["--debug-fault", r.as_str()]);
    }
    let served = Served::start(&dir, &members, &extra);
    copy_in(&pattern_file(&dir, 1 << 20, 17), &served.url);
    std::fs::write(&arm, b"").unwrap();
    let (st, log) = served.terminate();
    assert!(!log.contains("stopped cleanly"), "reported clean with no superblock written:\n{log}");
    assert!(!st.success(), "exit status {st} after a close nothing recorded:\n{log}");

    // `uraid stop` says so too, and fails.
    let _ = std::fs::remove_file(&arm);
    let served = Served::start(&dir, &members, &[&extra[..], &["--run"]].concat());
    std::fs::write(&arm, b"").unwrap();
    let (out, st, log) = served.stop_verb();
    let said = text(&out);
    assert!(!out.status.success() && said.contains("not closed cleanly"), "uraid stop: {said}\n{log}");
    assert!(!st.success() && !log.contains("stopped cleanly"), "exit status {st}:\n{log}");
}

/// `uraid stop --control` (mdadm --stop) stops the server as SIGTERM does and answers once
/// the array is closed: the superblocks say clean, the server exited with success, and
/// nothing answers on the control socket afterwards.
#[test]
fn uraid_stop_answers_once_the_array_is_closed_clean() {
    let dir = TempDir::new("stopverb");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--name", "stopverb"]);
    let served = Served::start(&dir, &members, &[]);
    let log = served.log_text();
    assert!(log.contains(&format!("uraid stop --control {}", served.control.display())), "{log}");
    assert!(log.contains(", pid "), "the server does not say its pid:\n{log}");
    let src = pattern_file(&dir, 1 << 20, 23);
    copy_in(&src, &served.url);
    let control = served.control.clone();
    let listed = |control: &Path| -> Option<serde_json::Value> {
        let out = ok(uraid(&["list", "--json"]), "list --json");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        v.as_array()?.iter().find(|e| e["control"].as_str() == control.to_str()).cloned()
    };
    let entry = listed(&control).unwrap_or_else(|| panic!("uraid list does not show {}", control.display()));
    assert_eq!(entry["name"].as_str().map(|n| n.ends_with(":stopverb")), Some(true), "{entry}");
    assert_eq!(entry["raid_level"], "raid5", "{entry}");
    assert_eq!(entry["url"].as_str(), Some(served.url.as_str()), "{entry}");
    assert!(
        entry["state"].as_str().is_some_and(|s| s.starts_with("active") || s.starts_with("clean")),
        "{entry}"
    );
    // detail --scan: a config line naming the array's uuid and its members.
    let scan = ok(uraid(&["detail", "--scan"]), "detail --scan");
    let uuid = entry["uuid"].as_str().unwrap();
    let line = scan.lines().find(|l| l.contains(uuid)).unwrap_or_else(|| panic!("{scan}"));
    assert!(line.starts_with("ARRAY ") && line.contains(" metadata=1.2 "), "{line}");
    let devices = line.split(" devices=").nth(1).and_then(|d| d.split(' ').next());
    let devices = devices.unwrap_or_else(|| panic!("{line}"));
    for m in &members {
        assert!(devices.split(',').any(|d| Path::new(d) == std::path::absolute(m).unwrap()), "{line}");
    }
    let (out, st, log) = served.stop_verb();
    assert!(out.status.success() && text(&out).contains("stopverb stopped cleanly"), "{}\n{log}", text(&out));
    assert!(st.success(), "exit status {st}:\n{log}");
    assert!(log.contains("stop asked on the control socket"), "{log}");
    for m in &members {
        let ex = ok(uraid(&["examine", m.to_str().unwrap()]), "examine");
        assert_eq!(mdadm_field(&ex, "State").as_deref(), Some("clean"), "{}:\n{ex}", m.display());
    }
    let again = uraid(&["stop", "--control", control.to_str().unwrap()]);
    assert!(!again.status.success(), "a second stop found a server: {}", text(&again));
    assert!(listed(&control).is_none(), "uraid list still shows the stopped array");
    // A server killed with SIGKILL leaves its entry behind: `list` leaves it out.
    let mut killed = Served::start(&dir, &members, &[]);
    assert!(listed(&killed.control).is_some(), "uraid list does not show the second start");
    let mut child = killed.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(listed(&killed.control).is_none(), "uraid list shows a killed server");
    // The data is there for the next start.
    let served = Served::start(&dir, &members, &[]);
    assert_eq!(read_array(&dir, &served.url)[..1 << 20].to_vec(), std::fs::read(&src).unwrap());
    served.stop();
}

/// mdadm --assemble --force: after two members of a RAID5 dropped out one after the other
/// (the freshest superblock records both as failed), `serve --force --run` takes the
/// freshest of them back and the data written before reads back; without --force the
/// start is refused and nothing is written.
#[test]
fn force_takes_back_the_freshest_member_that_dropped_out() {
    let dir = TempDir::new("forceback");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--name", "forceback"]);
    let mut served = Served::start(&dir, &members, &[]);
    let src = pattern_file(&dir, 1 << 20, 19);
    copy_in(&src, &served.url);
    let c = served.control.display().to_string();
    served.ctl("fail", Some(&members[0]));
    wait_status(&served, "[_UU]");
    ok(uraid(&["fail", "--force", members[2].to_str().unwrap(), "--control", &c]), "fail --force");
    std::thread::sleep(Duration::from_millis(500));
    let mut child = served.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(served);

    let before: Vec<String> = members.iter().map(|m| sha256_file(m)).collect();
    let mut args = vec!["serve", "--unix", "x.sock"];
    args.extend(paths(&members));
    let refused = bounded(URAID, &args, Duration::from_secs(20));
    assert!(!refused.status.success(), "started without --force:\n{}", text(&refused));
    let after: Vec<String> = members.iter().map(|m| sha256_file(m)).collect();
    assert_eq!(before, after, "a refused start wrote to the members");

    let forced = Served::start(&dir, &members, &["--force", "--run"]);
    let log = forced.log_text();
    assert!(
        log.contains("forced:") && log.contains("m2"),
        "m2 (events behind by one) not taken back:\n{log}"
    );
    assert_eq!(read_array(&dir, &forced.url)[..1 << 20].to_vec(), std::fs::read(&src).unwrap());
    forced.stop();
}

/// systemd's Type=notify: under `NOTIFY_SOCKET`, serve says READY=1 (with its pid) once it
/// listens, and STOPPING=1 when a stop begins; the unit template in contrib/ passes
/// `systemd-analyze verify` (its ExecStart pointed at this build).
#[test]
fn serve_tells_systemd_when_it_is_ready_and_when_it_stops() {
    let dir = TempDir::new("sdnotify");
    let members = create_clean(&dir, "1", 2, "16M", &["--name", "sdnotify"]);
    let notify_path = dir.path("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let control = dir.path("sd.ctl");
    let sock = dir.path("sd.sock");
    let log = std::fs::File::create(dir.path("sd.log")).unwrap();
    let mut child = std::process::Command::new(URAID)
        .args(["serve", "--unix", sock.to_str().unwrap(), "--control", control.to_str().unwrap()])
        .args(paths(&members))
        .env("NOTIFY_SOCKET", &notify_path)
        .stderr(log)
        .spawn()
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = notify.recv(&mut buf).expect("no READY=1 from uraid serve");
    let ready = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready}");
    assert!(ready.lines().any(|l| l == format!("MAINPID={}", child.id())), "{ready}");
    // Ready means listening: the control socket answers now.
    ok(uraid(&["status", "--control", control.to_str().unwrap()]), "status after READY=1");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let n = notify.recv(&mut buf).expect("no STOPPING=1 from uraid serve");
    let stopping = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping}");
    assert!(child.wait().unwrap().success());

    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/systemd/uraid@.service"))
            .expect("contrib/systemd/uraid@.service");
    assert!(unit.contains("Type=notify") && unit.contains("ExecStart=/usr/local/bin/uraid serve"), "{unit}");
    let instance = dir.path("uraid@demo.service");
    std::fs::write(&instance, unit.replace("/usr/local/bin/uraid", URAID)).unwrap();
    let o = std::process::Command::new("systemd-analyze")
        .args(["verify", instance.to_str().unwrap()])
        .output()
        .expect("systemd-analyze (package systemd; scripts/install-deps.sh installs it)");
    let said = text(&o);
    assert!(o.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
}

/// mdadm --monitor's program: run with `EVENT ARRAY [MEMBER]` on a fail (Fail, then
/// DegradedArray) and through the rebuild after an add (RebuildStarted, Rebuild20..80,
/// RebuildFinished, SpareActive); `--monitor-test` sends TestMessage at start.
#[test]
fn the_monitor_program_hears_a_fail_and_the_rebuild_after_an_add() {
    let dir = TempDir::new("monitor");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--name", "monitor"]);
    let heard = dir.path("heard");
    let program = dir.path("on-event");
    std::fs::write(&program, format!("#!/bin/sh\necho \"$@\" >> {}\n", heard.display())).unwrap();
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let served = Served::start(
        &dir,
        &members,
        &["--monitor-program", program.to_str().unwrap(), "--monitor-test", "--sync-speed-max", "4000"],
    );
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&heard).unwrap_or_default().lines().map(str::to_string).collect()
    };
    let wait_for = |what: &str| {
        let t0 = Instant::now();
        while !lines().iter().any(|l| l.starts_with(what)) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no {what}: {:?}\n{}",
                lines(),
                served.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for("TestMessage ");
    let array = lines()[0].split(' ').nth(1).unwrap().to_string();
    assert!(array.ends_with(":monitor"), "{:?}", lines());
    served.ctl("fail", Some(&members[1]));
    wait_for("DegradedArray");
    served.ctl("remove", Some(&members[1]));
    let new = dir.path("new1");
    std::fs::File::create(&new).unwrap().set_len(std::fs::metadata(&members[1]).unwrap().len()).unwrap();
    served.ctl("add", Some(&new));
    wait_for("SpareActive");
    let got = lines();
    let pos = |l: &str| got.iter().position(|g| g == l).unwrap_or_else(|| panic!("no {l:?} in {got:?}"));
    let fail = pos(&format!("Fail {array} {}", members[1].display()));
    let degraded = pos(&format!("DegradedArray {array}"));
    let started = pos(&format!("RebuildStarted {array}"));
    let r40 = pos(&format!("Rebuild40 {array}"));
    let finished = pos(&format!("RebuildFinished {array}"));
    let active = pos(&format!("SpareActive {array} {}", new.display()));
    assert!(
        fail < degraded && degraded < started && started < r40 && r40 < finished && finished < active,
        "{got:?}"
    );
    served.stop();
}
