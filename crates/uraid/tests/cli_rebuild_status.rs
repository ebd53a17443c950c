//! What `status` and `detail` tell an operator while a member is rebuilt: the device in
//! the slot by its own name, a failed member as faulty until it is removed, each device
//! credited with the I/O it did.

mod common;

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn sparse_like(p: &Path, like: &Path) {
    let len = std::fs::metadata(like).unwrap().len();
    OpenOptions::new().create(true).truncate(true).write(true).open(p).unwrap().set_len(len).unwrap();
}

fn status(s: &Served) -> String {
    let c = s.control.display().to_string();
    let o = bounded(URAID, &["status", "--control", &c], Duration::from_secs(10));
    assert!(o.status.success(), "uraid status: {}", text(&o));
    text(&o)
}

fn detail_json(s: &Served) -> serde_json::Value {
    let c = s.control.display().to_string();
    let t = ok(uraid(&["detail", "--json", "--control", &c]), "detail --json");
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("detail --json: {e}\n{t}"))
}

/// The device row of `detail --json` whose device is `p`.
fn device<'a>(v: &'a serde_json::Value, p: &Path) -> Option<&'a serde_json::Value> {
    let name = p.display().to_string();
    v["devices"].as_array().unwrap().iter().find(|d| d["device"] == name.as_str())
}

/// The `detail` table's row of `p`: "number slot state..." without the path.
fn row(detail: &str, p: &Path) -> Option<String> {
    let name = p.display().to_string();
    detail
        .lines()
        .find(|l| l.trim_end().ends_with(&name))
        .map(|l| l.trim_end()[..l.trim_end().len() - name.len()].trim().to_string())
}

fn wait_for(s: &Served, what: &str, f: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let st = status(s);
        if f(&st) {
            return st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "status never showed {what}:\n{st}\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn set(s: &Served, name: &str, value: &str) {
    let c = s.control.display().to_string();
    ok(uraid(&["set", name, value, "--control", &c]), "uraid set");
}

#[test]
fn after_fail_and_add_the_added_device_is_the_one_rebuilding_and_the_failed_one_is_faulty() {
    let dir = TempDir::new("rebuild-names");
    let members = create_clean(&dir, "6", 6, "64M", &["--bitmap", "internal"]);
    let (m2, new2) = (members[2].clone(), dir.path("new2"));
    sparse_like(&new2, &m2);
    // 1 MB/s: the 64 MiB rebuild lasts about a minute unless sped up below.
    let s = Served::start(&dir, &members, &["--sync-speed-min", "1000", "--sync-speed-max", "1000"]);
    let data = dir.path("data");
    std::fs::write(
        &data,
        (0..8u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    let o = bounded("nbdcopy", &[data.to_str().unwrap(), &s.url], Duration::from_secs(30));
    assert!(o.status.success(), "nbdcopy: {}", text(&o));

    s.ctl("fail", Some(&m2));
    let v = detail_json(&s);
    let m2_writes = device(&v, &m2).expect("m2 listed")["io"]["write_bytes"].as_u64().unwrap();
    assert!(m2_writes > 0, "m2 wrote nothing before it failed: {v:#}");
    s.ctl("add", Some(&new2));
    let st = wait_for(&s, "the recovery under way", |st| st.contains("recovery =") && !st.contains("= 0.0%"));

    // status: new2 holds slot 2 and rebuilds (listed unmarked, by its device number as
    // md's mdstat; slot 2 is the `_`); m2 is listed as failed.
    let new2_name = new2.display().to_string();
    let m2_name = m2.display().to_string();
    let array_line = st.lines().find(|l| l.contains(" : active raid6 ")).expect("array line");
    let number = device(&detail_json(&s), &new2).expect("new2 listed")["number"].as_u64().unwrap();
    assert!(array_line.split(' ').any(|d| d == format!("{new2_name}[{number}]")), "new2 not listed:\n{st}");
    assert!(
        array_line.split(' ').any(|d| d.starts_with(&format!("{m2_name}[")) && d.ends_with("(F)")),
        "m2 not listed as failed:\n{st}"
    );
    assert!(st.contains("[6/5] [UU_UUU]"), "{st}");

    // detail: the same, and Failed Devices counts m2.
    let detail = s.ctl("detail", None);
    let r = row(&detail, &new2).unwrap_or_else(|| panic!("new2 not in detail:\n{detail}"));
    assert!(r.ends_with("2   spare rebuilding"), "new2's row: {r:?}\n{detail}");
    let r = row(&detail, &m2).unwrap_or_else(|| panic!("m2 not in detail:\n{detail}"));
    assert!(r.ends_with("-   faulty"), "m2's row: {r:?}\n{detail}");
    assert!(detail.contains("Failed Devices : 1"), "{detail}");
    assert!(detail.contains("Working Devices : 6") && detail.contains("Active Devices : 5"), "{detail}");

    // detail --json: the rebuild's writes are new2's, m2's counts stopped when it failed.
    let v = detail_json(&s);
    assert_eq!(v["failed_devices"], 1, "{v:#}");
    let n = device(&v, &new2).expect("new2 listed");
    assert_eq!(
        (n["raid_device"].as_u64(), n["state"].as_str()),
        (Some(2), Some("spare rebuilding")),
        "{v:#}"
    );
    assert!(n["io"]["write_bytes"].as_u64().unwrap() > 0, "new2 credited with no writes: {v:#}");
    let m = device(&v, &m2).expect("m2 listed");
    assert_eq!((m["raid_device"].is_null(), m["state"].as_str()), (true, Some("faulty")), "{v:#}");
    assert_eq!(m["io"]["write_bytes"].as_u64(), Some(m2_writes), "m2 credited with new2's writes: {v:#}");

    // Done: new2 in sync, m2 still faulty until removed.
    set(&s, "sync_speed_max", "200000");
    wait_for(&s, "the rebuild done", |st| st.contains("[6/6] [UUUUUU]") && !st.contains("recovery"));
    let detail = s.ctl("detail", None);
    assert!(row(&detail, &new2).is_some_and(|r| r.ends_with("2   active sync")), "{detail}");
    assert!(row(&detail, &m2).is_some_and(|r| r.ends_with("-   faulty")), "{detail}");
    assert!(detail.contains("Failed Devices : 1"), "{detail}");

    s.ctl("remove", Some(&m2));
    let detail = s.ctl("detail", None);
    assert!(row(&detail, &m2).is_none() && detail.contains("Failed Devices : 0"), "{detail}");
    assert!(!status(&s).contains(&m2_name), "{}", status(&s));
    s.stop();
}

/// Every `path[N]` of `status`'s array line, as (path, N).
fn brackets(st: &str) -> Vec<(String, u64)> {
    let line = st.lines().find(|l| l.contains(" : active ")).unwrap_or_else(|| panic!("{st}"));
    line.split(' ')
        .filter_map(|d| {
            let (path, rest) = d.split_once('[')?;
            Some((path.to_string(), rest.split(']').next()?.parse().ok()?))
        })
        .collect()
}

/// `status`'s brackets are md's device numbers (mdstat prints desc_nr), as detail's Number
/// column, for every device: in a slot, failed, spare or replacement. Before, a device in
/// a slot showed its slot, the others their number, so a hot spare that took slot 1
/// showed `[1]` beside the failed member's `[1](F)`, and a replacement's `[4](R)` was
/// neither the slot it copies nor comparable with the rest.
#[test]
fn status_brackets_are_device_numbers_as_details_number_column() {
    let dir = TempDir::new("brackets");
    let members = create_clean(&dir, "5", 3, "32M", &[]);
    let (spare, new0) = (dir.path("spare"), dir.path("new0"));
    sparse_like(&spare, &members[0]);
    sparse_like(&new0, &members[0]);
    let s = Served::start(&dir, &members, &["--sync-speed-min", "1000", "--sync-speed-max", "1000"]);
    s.ctl("add", Some(&spare));
    s.ctl("fail", Some(&members[1]));
    set(&s, "sync_speed_max", "200000");
    wait_for(&s, "the spare rebuilt", |st| st.contains("[3/3] [UUU]") && !st.contains("recovery"));
    set(&s, "sync_speed_max", "1000");
    let c = s.control.display().to_string();
    let with = ["replace", members[0].to_str().unwrap(), "--with", new0.to_str().unwrap(), "--control", &c];
    ok(uraid(&with), "uraid replace");
    let check = |what: &str| {
        let st = status(&s);
        let v = detail_json(&s);
        let shown = brackets(&st);
        assert_eq!(shown.len(), v["devices"].as_array().unwrap().len(), "{what}:\n{st}\n{v:#}");
        for (path, n) in &shown {
            let d =
                device(&v, Path::new(path)).unwrap_or_else(|| panic!("{what}: {path} not in detail:\n{v:#}"));
            assert_eq!(
                d["number"].as_u64(),
                Some(*n),
                "{what}: {path}'s bracket is not its number:\n{st}\n{v:#}"
            );
        }
        let mut numbers: Vec<u64> = shown.iter().map(|(_, n)| *n).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), shown.len(), "{what}: two devices share a bracket:\n{st}");
        st
    };
    let st = check("during the replacement");
    assert!(st.contains("(R)") && st.contains("(F)"), "{st}");
    set(&s, "sync_speed_max", "200000");
    wait_for(&s, "the replacement done", |st| !st.contains("(R)") && !st.contains("recovery"));
    check("after the replacement");
    s.stop();
}

/// `status` answers what the array is when asked, not a copy taken by a periodic look
/// (once a 100 ms-old snapshot): each add or remove of a spare shows in the very next
/// `status`, ten times over (a periodic copy would miss most of them).
#[test]
fn status_right_after_a_change_shows_it() {
    let dir = TempDir::new("status-now");
    let members = create_clean(&dir, "1", 2, "16M", &[]);
    let spare = dir.path("spare");
    sparse_like(&spare, &members[0]);
    let s = Served::start(&dir, &members, &[]);
    let name = spare.display().to_string();
    for round in 0..10 {
        s.ctl("add", Some(&spare));
        let st = status(&s);
        assert!(st.contains(&format!("{name}[")) && st.contains("(S)"), "round {round}, after add:\n{st}");
        s.ctl("remove", Some(&spare));
        let st = status(&s);
        assert!(!st.contains(&name), "round {round}, after remove:\n{st}");
    }
    s.stop();
}

/// The paths `pid` holds open.
fn open_files(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect()
}

/// `uraid remove` lets the device go: once no I/O started on it is in flight, the server
/// holds no descriptor of it (before, the executor kept every member set it replaced, with
/// a descriptor of every member, until it was dropped).
#[test]
fn a_removed_member_is_closed() {
    let dir = TempDir::new("removed-closed");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal"]);
    let s = Served::start(&dir, &members, &[]);
    let pid = s.child.as_ref().unwrap().id();
    let m1 = std::fs::canonicalize(&members[1]).unwrap();
    assert!(open_files(pid).contains(&m1), "the member is not open to begin with");
    s.ctl("fail", Some(&members[1]));
    s.ctl("remove", Some(&members[1]));
    let t0 = Instant::now();
    while open_files(pid).contains(&m1) {
        assert!(t0.elapsed() < Duration::from_secs(5), "{} is still open after `uraid remove`", m1.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    s.stop();
}

/// `status`'s sync line: the percent and (done/total) in KiB.
fn progress(st: &str) -> Option<(f64, u64, u64)> {
    let line = st.lines().find(|l| l.contains("recovery =") || l.contains("resync ="))?;
    let pct = line.split(" = ").nth(1)?.split('%').next()?.parse().ok()?;
    let inner = line.split('(').nth(1)?.split(')').next()?;
    let (done, total) = inner.split_once('/')?;
    Some((pct, done.parse().ok()?, total.parse().ok()?))
}

#[test]
fn a_recovery_resumed_after_a_restart_counts_the_whole_member_from_its_checkpoint() {
    let dir = TempDir::new("resume-progress");
    let mut members = create_clean(&dir, "6", 6, "32M", &["--bitmap", "internal"]);
    let new2 = dir.path("new2");
    sparse_like(&new2, &members[2]);
    let speed = ["--sync-speed-min", "2000", "--sync-speed-max", "2000"];
    let s = Served::start(&dir, &members, &speed);
    s.ctl("fail", Some(&members[2]));
    s.ctl("add", Some(&new2));
    let st = wait_for(&s, "a fifth of the recovery", |st| progress(st).is_some_and(|(p, _, _)| p >= 20.0));
    let (_, _, total) = progress(&st).unwrap();
    s.stop();

    // Where it stopped, in sectors and as a share of the member, offline too.
    let ex = ok(uraid(&["examine", new2.to_str().unwrap()]), "examine");
    let role = mdadm_field(&ex, "Device Role").expect("Device Role");
    assert!(role.contains("rebuilt to sector ") && role.contains("%)"), "examine: {role}");
    members[2] = new2.clone();
    let asm = ok(
        uraid(&["assemble", "--run"].iter().copied().chain(paths(&members)).collect::<Vec<_>>()),
        "assemble",
    );
    let line = asm.lines().find(|l| l.contains("rebuild of slot 2")).unwrap_or_else(|| panic!("{asm}"));
    assert!(line.contains("from sector ") && line.contains("%)"), "{line}");
    let checkpoint_pct: f64 = line.rsplit('(').next().unwrap().trim_end_matches([')', '%']).parse().unwrap();
    assert!(checkpoint_pct > 10.0, "{line}");

    // Served again, it goes on from there: the whole member is the total, not what remains.
    let s = Served::start(&dir, &members, &[&speed[..], &["--run"]].concat());
    let st = wait_for(&s, "the recovery", |st| progress(st).is_some());
    let (pct, done, again_total) = progress(&st).unwrap();
    assert_eq!(again_total, total, "the recovery's total changed over the restart:\n{st}");
    assert!(pct >= checkpoint_pct - 0.1 && done > 0, "the recovery restarted its count:\n{st}");
    let detail = s.ctl("detail", None);
    let rebuild = detail.lines().find(|l| l.contains("Rebuild Status")).unwrap_or_else(|| panic!("{detail}"));
    let shown: f64 = rebuild.split(" : ").nth(1).unwrap().split('%').next().unwrap().parse().unwrap();
    assert!(rebuild.contains('.') && shown >= checkpoint_pct - 0.1, "{rebuild}");
    s.stop();
}

#[test]
fn a_slow_recovery_says_how_long_in_hours_or_days() {
    let dir = TempDir::new("slow-eta");
    // Sparse: 64 GiB members cost nothing until written; at 1 MB/s, about 18 hours.
    let members = create_clean(&dir, "5", 3, "64G", &["--bitmap", "internal"]);
    let new1 = dir.path("new1");
    sparse_like(&new1, &members[1]);
    let s = Served::start(&dir, &members, &["--sync-speed-min", "1000", "--sync-speed-max", "1000"]);
    s.ctl("fail", Some(&members[1]));
    s.ctl("add", Some(&new1));
    let st = wait_for(&s, "a recovery speed", |st| st.contains("K/sec"));
    let line = st.lines().find(|l| l.contains("recovery =")).unwrap();
    // md's own field stays as md prints it; the words follow.
    let minutes: f64 = line.split("finish=").nth(1).unwrap().split("min").next().unwrap().parse().unwrap();
    assert!(minutes > 180.0, "{line}");
    assert!(line.contains("(about ") && (line.contains(" hours)") || line.contains(" days)")), "{line}");
    // `detail --json` gives the same in numbers, not a preformatted line.
    let control = s.control.display().to_string();
    let json = ok(uraid(&["detail", "--json", "--control", &control]), "detail --json");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let p = &v["progress"];
    assert_eq!(p["action"], "recovery", "{json}");
    let (done, total) = (p["done"].as_u64(), p["total"].as_u64());
    assert!(done.is_some() && total.is_some_and(|t| t > done.unwrap_or(u64::MAX)), "{json}");
    assert!(p["percent"].as_f64().is_some_and(|x| (0.0..100.0).contains(&x)), "{json}");
    assert!(p["speed_kbps"].as_f64().is_some_and(|x| x > 0.0), "{json}");
    assert!(p["eta_s"].as_f64().is_some_and(|x| x > 3.0 * 3600.0), "{json}");
    s.stop();
}

#[test]
fn a_dirty_start_says_how_much_it_resyncs() {
    for (bitmap, says) in [("internal", "bitmap chunk"), ("none", "the whole array")] {
        let dir = TempDir::new("dirty-start");
        let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", bitmap]);
        let mut s = Served::start(&dir, &members, &[]);
        let data = dir.path("data");
        std::fs::write(&data, vec![7u8; 1 << 20]).unwrap();
        let o = bounded("nbdcopy", &[data.to_str().unwrap(), &s.url], Duration::from_secs(30));
        assert!(o.status.success(), "nbdcopy: {}", text(&o));
        // Killed while the superblocks say active.
        let mut child = s.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let s = Served::start(&dir, &members, &[]);
        let log = s.log_text();
        let line =
            log.lines().find(|l| l.contains("not shut down cleanly")).unwrap_or_else(|| panic!("{log}"));
        assert!(line.contains(says), "--bitmap {bitmap}: {line}");
        if bitmap == "internal" {
            assert!(line.contains(" MiB of each member)"), "{line}");
        }
        s.stop();
    }
}
