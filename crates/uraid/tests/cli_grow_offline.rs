//! `uraid grow --raid-devices N --add NEW... MEMBERS...` on a stopped raid5/6 (the reshape
//! runs offline here; `cli_grow_online` runs it under a served array), its `--continue`
//! after a kill, and the grows it refuses with every file left as it was. Linux md in the
//! VM assembles the grown members and its `check` finds the parity consistent.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use uraid_core::meta::{feature, Superblock};

const MEMBER_BYTES: u64 = 16 << 20;
/// The component size given to create: room above it is left unused.
const COMPONENT: &str = "12M";
/// The data written before the grow: the whole of a 36 MiB array (3 data members x 12M).
const DATA_BYTES: usize = 36 << 20;

fn read_sb(p: &Path) -> Superblock {
    let b = std::fs::read(p).unwrap();
    Superblock::parse(&b[4096..8192], 8).unwrap()
}

fn blank(dir: &TempDir, name: &str) -> PathBuf {
    let p = dir.path(name);
    std::fs::File::create(&p).unwrap().set_len(MEMBER_BYTES).unwrap();
    p
}

fn hashes(files: &[PathBuf]) -> Vec<String> {
    files.iter().map(|p| sha256_file(p)).collect()
}

/// A clean raid`level` of `n` members `{tag}0..` (64 KiB chunk: mdadm's offset change for
/// a grow fits below uraid's 1 MiB data offset) holding `data` written through serve.
fn array_with_data(
    dir: &TempDir,
    tag: &str,
    level: &str,
    n: usize,
    data: &[u8],
    extra: &[&str],
) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = (0..n).map(|i| blank(dir, &format!("{tag}{i}"))).collect();
    let count = n.to_string();
    let mut args = vec![
        "create",
        "--level",
        level,
        "--raid-devices",
        &count,
        "--chunk",
        "64",
        "--size",
        COMPONENT,
        "--assume-clean",
    ];
    args.extend_from_slice(extra);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let src = dir.path("data");
    std::fs::write(&src, data).unwrap();
    let s = Served::start(dir, &members, &[]);
    ok(tool("nbdcopy", &[src.to_str().unwrap(), &s.url]), "nbdcopy in");
    s.stop();
    members
}

/// Bytes no run of the test shares with another array's (a seed per array).
fn pattern(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..DATA_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn grow(args: &[&str], members: &[PathBuf]) -> std::process::Output {
    let mut a = vec!["grow"];
    a.extend_from_slice(args);
    a.extend(paths(members));
    uraid(&a)
}

/// The array served from `members`: its bytes (`extra`: serve's options).
fn served_bytes(dir: &TempDir, members: &[PathBuf], extra: &[&str]) -> Vec<u8> {
    let s = Served::start(dir, members, extra);
    let data = read_array(dir, &s.url);
    s.stop();
    data
}

#[test]
fn offline_raid5_and_raid6_grows_keep_the_data_serve_writable_and_md_agrees() {
    let dir = TempDir::new("grow-offline");
    let d5 = pattern(5);
    let d6 = pattern(6);
    let mut r5 = array_with_data(&dir, "a", "5", 4, &d5, &[]);
    let mut r6 = array_with_data(&dir, "b", "6", 5, &d6, &[]);
    // A spare of the raid6 during the reshape: its superblock must follow every round.
    let spare = blank(&dir, "bspare");
    {
        let s = Served::start(&dir, &r6, &[]);
        s.ctl("add", Some(&spare));
        s.stop();
    }
    let new5 = blank(&dir, "a4");
    let new6 = blank(&dir, "b5");

    let o = grow(&["--raid-devices", "5", "--add", new5.to_str().unwrap()], &r5);
    let t = ok(o, "uraid grow raid5");
    assert!(t.contains("done") && t.contains("uraid serve"), "{t}");
    let mut with_spare = r6.clone();
    with_spare.push(spare.clone());
    let t =
        ok(grow(&["--raid-devices", "6", "--add", new6.to_str().unwrap()], &with_spare), "uraid grow raid6");
    assert!(t.contains("done"), "{t}");
    r5.push(new5);
    r6.push(new6);
    // Served with its spare, so that the spare follows the writable serve's rounds too.
    let mut all6 = r6.clone();
    all6.push(spare.clone());

    for (members, slots, data, label) in [(&r5, 5, &d5, "raid5 4->5"), (&all6, 6, &d6, "raid6 5->6")] {
        let sb = read_sb(&members[0]);
        assert!(!sb.has(feature::RESHAPE_ACTIVE), "{label}: the reshape is recorded as done: {sb:?}");
        assert_eq!(sb.raid_disks, slots, "{label}");
        let got = served_bytes(&dir, members, &["--read-only"]);
        assert_eq!(got.len(), DATA_BYTES / 3 * 4, "{label}: the array grew by a member's worth");
        assert_eq!(sha256_bytes(&got[..DATA_BYTES]), sha256_bytes(data), "{label}: the original extent");
        assert!(got[DATA_BYTES..].iter().all(|&b| b == 0), "{label}: the new space reads as zeros");
        // Writable: the new space takes writes and reads them back.
        let s = Served::start(&dir, members, &[]);
        qemu_io(&s.url, &["write -P 0x5a 40M 1M".into(), "read -P 0x5a 40M 1M".into()]);
        s.stop();
    }
    // The raid6's spare is still its spare (same events, spare role, new geometry).
    let sp = read_sb(&spare);
    let m0 = read_sb(&r6[0]);
    assert_eq!((sp.events, sp.raid_disks, sp.data_offset), (m0.events, 6, m0.data_offset), "{sp:?}");
    assert_eq!(sp.slot(), None, "{sp:?}");
    let t = ok(uraid(&["examine", spare.to_str().unwrap()]), "examine spare");
    assert!(t.contains("spare"), "{t}");

    // One VM boot: md assembles both grown arrays (the spare too), the original extent
    // unchanged, md's check clean.
    let disks = |first: usize, n: usize| -> String {
        (first..first + n)
            .map(|i| format!("/dev/vd{}", (b'a' + i as u8) as char))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut script = String::from("set -x\n");
    for (md, first, n) in [("md0", 0, r5.len()), ("md1", r5.len(), all6.len())] {
        script.push_str(&format!(
            "mdadm --assemble /dev/{md} {} || exit 3\n\
             echo \"=== size_{md} $(blockdev --getsize64 /dev/{md})\"\n\
             echo \"=== sha_{md} $(head -c {DATA_BYTES} /dev/{md} | sha256sum)\"\n\
             echo check > /sys/block/{md}/md/sync_action\nsleep 1\n\
             while ! grep -q idle /sys/block/{md}/md/sync_action; do sleep 1; done\n\
             echo \"=== mismatch_{md} $(cat /sys/block/{md}/md/mismatch_cnt)\"\n\
             mdadm --detail /dev/{md}\nmdadm --stop /dev/{md}\n",
            disks(first, n)
        ));
    }
    let sh = dir.path("md.sh");
    std::fs::write(&sh, script).unwrap();
    let images: Vec<PathBuf> = r5.iter().chain(&all6).cloned().collect();
    let o = md_vm(&sh, &images, true);
    let out = text(&o);
    assert!(o.status.success(), "md VM:\n{out}");
    let field = |key: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("=== {key} ")))
            .unwrap_or_else(|| panic!("no {key}:\n{out}"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    for (md, data) in [("md0", &d5), ("md1", &d6)] {
        assert_eq!(
            field(&format!("sha_{md}")),
            sha256_bytes(data),
            "{md}: md reads the original extent:\n{out}"
        );
        assert_eq!(field(&format!("size_{md}")), (DATA_BYTES / 3 * 4).to_string(), "{md}:\n{out}");
        assert_eq!(field(&format!("mismatch_{md}")), "0", "{md}: md's check:\n{out}");
    }
    assert!(out.contains("spare"), "md takes the raid6's spare as a spare:\n{out}");
}

#[test]
fn a_grow_killed_after_any_window_is_finished_by_continue() {
    let dir = TempDir::new("grow-kill");
    let data = pattern(7);
    let mut members = array_with_data(&dir, "m", "5", 4, &data, &[]);
    let new = blank(&dir, "m4");
    let o = grow(
        &["--raid-devices", "5", "--add", new.to_str().unwrap(), "--debug-stop-after-windows", "1"],
        &members,
    );
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    members.push(new);
    let mut last = read_sb(&members[0]).reshape_position;
    assert!(last > 0, "one window was checkpointed");

    // Mid-reshape, read-only, it reads back (served writable it would go on with the
    // reshape: `cli_grow_online`).
    let got = served_bytes(&dir, &members, &["--read-only"]);
    assert_eq!(sha256_bytes(&got), sha256_bytes(&data), "mid-reshape, read-only, the data reads back");

    // Killed again after a few more windows, from the checkpoint each time.
    for stop in ["3", "5"] {
        let o = grow(&["--continue", "--debug-stop-after-windows", stop], &members);
        assert_eq!(o.status.code(), Some(137), "{}", text(&o));
        let pos = read_sb(&members[4]).reshape_position;
        assert!(pos > last, "continued from the checkpoint: {last} -> {pos}");
        last = pos;
    }
    let t = ok(grow(&["--continue"], &members), "uraid grow --continue");
    assert!(t.contains("done"), "{t}");
    assert!(!read_sb(&members[0]).has(feature::RESHAPE_ACTIVE));
    let got = served_bytes(&dir, &members, &[]);
    assert_eq!(got.len(), DATA_BYTES / 3 * 4);
    assert_eq!(sha256_bytes(&got[..DATA_BYTES]), sha256_bytes(&data), "the original extent after the kills");
    // Nothing left to continue: refused.
    let o = grow(&["--continue"], &members);
    assert!(!o.status.success() && text(&o).contains("no reshape"), "{}", text(&o));
}

/// A layout change offline (mdadm --grow --layout on a stopped array): killed after a
/// window, continued, the data the same and the new layout recorded.
#[test]
fn an_offline_layout_change_killed_mid_way_is_finished_by_continue() {
    let dir = TempDir::new("grow-layout");
    let data = pattern(8);
    let members = array_with_data(&dir, "l", "6", 5, &data, &[]);
    let o = grow(&["--layout", "right-asymmetric", "--debug-stop-after-windows", "2"], &members);
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    let sb = read_sb(&members[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.reshape_position > 0, "{sb:?}");
    assert_eq!((sb.layout, sb.new_layout, sb.delta_disks), (2, 1, 0), "{sb:?}");
    let t = ok(grow(&["--continue"], &members), "uraid grow --continue");
    assert!(t.contains("done") && t.contains("right-asymmetric"), "{t}");
    let sb = read_sb(&members[0]);
    assert!(!sb.has(feature::RESHAPE_ACTIVE), "{sb:?}");
    assert_eq!((sb.layout, sb.raid_disks), (1, 5), "{sb:?}");
    let got = served_bytes(&dir, &members, &[]);
    assert_eq!(got.len(), DATA_BYTES, "a layout change keeps the size");
    assert_eq!(sha256_bytes(&got), sha256_bytes(&data), "the data after the layout change");
}

/// `uraid grow ARGS MEMBERS` must refuse saying `words`, every file in `files` unchanged.
fn refused(args: &[&str], members: &[PathBuf], words: &str, files: &[PathBuf]) {
    let before = hashes(files);
    let o = grow(args, members);
    let t = text(&o);
    assert!(!o.status.success(), "accepted: {args:?}\n{t}");
    assert!(t.contains(words), "{args:?}: {t}");
    assert!(t.contains("nothing was written"), "{args:?}: {t}");
    assert_eq!(hashes(files), before, "{args:?} changed a file");
}

#[test]
fn refused_offline_grows_change_nothing() {
    let dir = TempDir::new("grow-refused");
    let data = pattern(9);
    let members = array_with_data(&dir, "m", "5", 4, &data, &[]);
    let new = blank(&dir, "new");
    let new2 = blank(&dir, "new2");
    let mut files = members.clone();
    files.extend([new.clone(), new2.clone()]);
    let add = new.to_str().unwrap();

    // A running array: its members are claimed by the server.
    let s = Served::start(&dir, &members, &[]);
    refused(&["--raid-devices", "5", "--add", add], &members, "in use", &files);
    s.stop();
    // Too few new members for the count asked.
    refused(&["--raid-devices", "6", "--add", add], &members, "takes 2 new devices", &files);
    // A new member named that is already one.
    refused(&["--raid-devices", "5", "--add", members[1].to_str().unwrap()], &members, "same device", &files);
    // Not all the members: a degraded array is not grown.
    refused(&["--raid-devices", "5", "--add", add], &members[..3], "every member", &files);
    // Level and chunk together: mdadm refuses it too.
    refused(&["--level", "6", "--chunk", "128", "--add", add], &members, "same operation", &files);

    // Nothing was harmed: the array still reads back.
    let got = served_bytes(&dir, &members, &["--read-only"]);
    assert_eq!(sha256_bytes(&got), sha256_bytes(&data));
}

/// `uraid grow ARGS MEMBERS` slowed by a pause before each member write, SIGKILLed
/// `after` once `watch` (if given) records a reshape: the kill lands inside a window's
/// writes or a superblock round, not only between windows. Returns whether it had
/// already finished.
fn grow_killed_after(
    args: &[&str],
    members: &[PathBuf],
    watch: Option<&Path>,
    after: std::time::Duration,
) -> bool {
    let mut a = vec!["grow", "--debug-io-delay-ms", "4"];
    a.extend_from_slice(args);
    a.extend(paths(members));
    let child = std::process::Command::new(URAID)
        .args(&a)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut r = Reaped(Some(child));
    let t0 = std::time::Instant::now();
    while let Some(p) = watch {
        // A read racing the superblock's write may not parse: read again.
        let sb = std::fs::read(p).ok().and_then(|b| Superblock::parse(&b[4096..8192], 8).ok());
        if sb.is_some_and(|sb| sb.has(feature::RESHAPE_ACTIVE)) || r.try_done() {
            break;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "the grow did not start");
        std::thread::sleep(ms(5));
    }
    std::thread::sleep(after);
    let done = r.try_done();
    r.kill();
    done
}

#[test]
fn a_grow_sigkilled_inside_windows_is_finished_by_continue() {
    let dir = TempDir::new("grow-sigkill");
    let data = pattern(11);
    let mut members = array_with_data(&dir, "m", "6", 5, &data, &[]);
    let new = blank(&dir, "m5");
    let add = new.to_str().unwrap().to_string();
    assert!(
        !grow_killed_after(&["--raid-devices", "6", "--add", &add], &members, Some(&members[0]), ms(100)),
        "killed too late"
    );
    members.push(new);
    let mut last = read_sb(&members[0]).reshape_position;
    assert!(read_sb(&members[0]).has(feature::RESHAPE_ACTIVE), "the reshape had started");
    let mut kills = 1;
    for after in [170, 230, 410, 290] {
        if grow_killed_after(&["--continue"], &members, None, ms(after)) {
            break;
        }
        kills += 1;
        let sb = read_sb(&members[0]);
        if !sb.has(feature::RESHAPE_ACTIVE) {
            break;
        }
        assert!(sb.reshape_position >= last, "the checkpoint never goes back");
        last = sb.reshape_position;
    }
    assert!(kills >= 3, "killed {kills} times only");
    if read_sb(&members[0]).has(feature::RESHAPE_ACTIVE) {
        ok(grow(&["--continue"], &members), "uraid grow --continue");
    }
    let got = served_bytes(&dir, &members, &[]);
    assert_eq!(got.len(), DATA_BYTES / 3 * 4);
    assert_eq!(
        sha256_bytes(&got[..DATA_BYTES]),
        sha256_bytes(&data),
        "the original extent after {kills} kills"
    );
}

fn ms(n: u64) -> std::time::Duration {
    std::time::Duration::from_millis(n)
}

/// An array with an internal bitmap grows offline as without one: the new member gets the
/// array's bitmap beside its superblock, the data offset moves down only to the bitmap's
/// end, and md assembles the result with its bitmap, the same bytes, `mismatch_cnt` 0.
#[test]
fn an_offline_grow_carries_the_internal_bitmap_and_md_agrees() {
    let dir = TempDir::new("grow-offline-bitmap");
    let data = pattern(11);
    let mut members = array_with_data(&dir, "m", "5", 4, &data, &["--bitmap", "internal"]);
    let new = blank(&dir, "new");
    ok(grow(&["--raid-devices", "5", "--add", new.to_str().unwrap()], &members), "uraid grow");
    members.push(new.clone());
    let first = read_sb(&members[0]);
    let added = read_sb(&new);
    assert!(!first.has(feature::RESHAPE_ACTIVE) && first.raid_disks == 5, "{first:?}");
    let bitmap_at = first.bitmap_sector().expect("the bitmap stays");
    assert_eq!(added.bitmap_sector(), Some(bitmap_at), "the new member's bitmap sits where the others' do");
    let image = |p: &PathBuf| {
        let b = std::fs::read(p).unwrap();
        b[bitmap_at as usize * 512..bitmap_at as usize * 512 + 256].to_vec()
    };
    assert_eq!(image(&new), image(&members[0]), "the new member holds the array's bitmap header");
    assert!(first.data_offset > bitmap_at + 8, "data moved onto the bitmap: {}", first.data_offset);
    let got = served_bytes(&dir, &members, &["--read-only"]);
    assert_eq!(sha256_bytes(&got[..DATA_BYTES]), sha256_bytes(&data), "the original extent");
    let md = md_check(&members);
    assert_eq!(md.sha256, sha256_bytes(&got), "md reads what uraid serves");
    assert_eq!(md.mismatch_cnt, 0);
}
