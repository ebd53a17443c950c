//! `uraid create` makes arrays real mdadm accepts (every level, with and without a
//! bitmap), `examine`/`assemble` read them back, and bad input is refused with nothing
//! written to any member.

mod common;

use std::path::PathBuf;

use common::*;

const LEVELS: &[&str] = &["0", "1", "4", "5", "6", "10"];

fn create(dir: &TempDir, tag: &str, level: &str, n: usize, extra: &[&str]) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("{tag}-{i}.img"))).collect();
    let mut args = vec!["create", "--level", level, "--raid-devices"];
    let ns = n.to_string();
    args.push(&ns);
    args.extend_from_slice(&["--size", "40M"]);
    args.extend_from_slice(extra);
    args.extend(paths(&members));
    ok(uraid(&args), &format!("create raid{level} {extra:?}"));
    members
}

#[test]
fn every_level_is_accepted_by_mdadm_and_assembles() {
    let dir = TempDir::new("create");
    for level in LEVELS {
        for bitmap in [false, true] {
            if bitmap && *level == "0" {
                continue;
            }
            let tag = format!("r{level}{}", if bitmap { "b" } else { "" });
            let extra: &[&str] = if bitmap { &["--bitmap", "internal"] } else { &[] };
            let members = create(&dir, &tag, level, 4, extra);
            let ours = ok(uraid(&["examine", paths(&members)[0]]), "uraid examine");
            for m in &members {
                let theirs = ok(tool("mdadm", &["--examine", m.to_str().unwrap()]), "mdadm --examine");
                let what = format!("{tag} {}", m.display());
                assert_eq!(mdadm_field(&theirs, "Raid Level"), Some(format!("raid{level}")), "{what}");
                assert_eq!(mdadm_field(&theirs, "Raid Devices").as_deref(), Some("4"), "{what}");
                assert_eq!(mdadm_field(&theirs, "Data Offset"), mdadm_field(&ours, "Data Offset"), "{what}");
                assert_eq!(
                    mdadm_field(&theirs, "Avail Dev Size"),
                    mdadm_field(&ours, "Avail Dev Size"),
                    "{what}"
                );
                if *level != "0" {
                    assert_eq!(
                        mdadm_field(&theirs, "Array Size"),
                        mdadm_field(&ours, "Array Size"),
                        "{what}"
                    );
                }
                assert!(
                    mdadm_field(&theirs, "Checksum").is_some_and(|c| c.ends_with("correct")),
                    "{what}: mdadm finds the checksum wrong:\n{theirs}"
                );
                assert_eq!(
                    mdadm_field(&theirs, "Internal Bitmap").is_some(),
                    bitmap,
                    "{what}: bitmap presence\n{theirs}"
                );
            }
            // mdadm's own assembly checks, without the kernel: it must find every member.
            let detail = ok(
                uraid(&["assemble"].iter().copied().chain(paths(&members)).collect::<Vec<_>>()),
                "assemble",
            );
            assert!(detail.contains(&format!("Raid Level : raid{level}")), "{tag}: {detail}");
            assert!(detail.contains("Raid Devices : 4"), "{tag}: {detail}");
            assert!(detail.contains("the array can start"), "{tag}: {detail}");
        }
    }
}

#[test]
fn round_trip_in_any_order_with_missing_and_run() {
    let dir = TempDir::new("roundtrip");
    let mut members = create(&dir, "r5", "5", 4, &["--assume-clean"]);
    members.reverse();
    let out = ok(uraid(&["assemble"].iter().copied().chain(paths(&members)).collect::<Vec<_>>()), "assemble");
    assert!(out.contains("State : clean"), "{out}");
    assert!(out.contains("Active Devices : 4"), "{out}");
    let offline = ok(uraid(&["detail"].iter().copied().chain(paths(&members)).collect::<Vec<_>>()), "detail");
    assert!(offline.contains("active sync"), "{offline}");

    // A degraded raid1 created with `missing`: assembles, reports the slot missing.
    let m: Vec<PathBuf> = vec![dir.path("m-0.img"), PathBuf::from("missing")];
    ok(
        uraid(&["create", "-l", "1", "-n", "2", "--size", "8M", paths(&m)[0], "missing"]),
        "create with missing",
    );
    let out = ok(uraid(&["assemble", "--run", paths(&m)[0]]), "assemble --run");
    assert!(out.contains("degraded"), "{out}");
    assert!(out.contains("removed"), "{out}");
}

fn hashes(members: &[PathBuf]) -> Vec<String> {
    members.iter().map(|m| sha256_file(m)).collect()
}

/// Runs `uraid assemble` expecting a refusal that mentions `needle`, and checks no member
/// changed by one byte.
fn refused(members: &[PathBuf], extra: &[&str], needle: &str) {
    let existing: Vec<PathBuf> = members.iter().filter(|m| m.exists()).cloned().collect();
    let before = hashes(&existing);
    let mut args = vec!["assemble"];
    args.extend_from_slice(extra);
    args.extend(paths(members));
    let o = uraid(&args);
    let t = text(&o);
    assert!(!o.status.success(), "assembly of {members:?} should be refused:\n{t}");
    assert!(t.contains(needle), "expected {needle:?} in:\n{t}");
    assert!(!t.contains("panicked"), "{t}");
    assert_eq!(hashes(&existing), before, "a refused assembly wrote to a member");
    // `uraid serve` refuses the same way, and writes nothing either.
    let mut args = vec!["serve", "--unix", "/nonexistent-dir/x.sock"];
    args.extend_from_slice(extra);
    args.extend(paths(members));
    let o = uraid(&args);
    assert!(!o.status.success(), "serve of {members:?} should be refused");
    assert_eq!(hashes(&existing), before, "a refused serve wrote to a member");
}

#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let dir = TempDir::new("bad");
    let a = create(&dir, "a", "6", 4, &["--bitmap", "internal"]);
    let b = create(&dir, "b", "6", 4, &["--assume-clean"]);

    // Too few members: raid6 4 members created dirty (initial resync owed) cannot start
    // with 2 (enough for a clean one: the refusal says it is the dirty state); with 1 not
    // at all; with a clean array, one missing needs --run.
    refused(&a[..2], &["--run"], "not shut down cleanly and 2 of its 4 members");
    refused(&a[..1], &["--run"], "not enough members");
    refused(&b[..3], &[], "pass --run");
    // Same member twice.
    refused(&[b[0].clone(), b[0].clone(), b[1].clone(), b[2].clone()], &[], "same device");
    // Another array's member.
    refused(&[b[0].clone(), b[1].clone(), b[2].clone(), a[3].clone()], &[], "another array");

    let copy = |src: &PathBuf, name: &str| {
        let p = dir.path(name);
        std::fs::copy(src, &p).unwrap();
        p
    };
    // Zeroed superblock.
    let z = copy(&b[3], "zeroed.img");
    std::fs::OpenOptions::new().write(true).open(&z).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&z).unwrap();
        f.write_all_at(&[0u8; 4096], 4096).unwrap();
    }
    refused(&[b[0].clone(), b[1].clone(), b[2].clone(), z.clone()], &[], "no md superblock");
    // Corrupted superblock (checksum no longer matches).
    let c = copy(&b[3], "corrupt.img");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&c).unwrap();
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, 4096 + 100).unwrap();
        f.write_all_at(&[byte[0] ^ 0x5a], 4096 + 100).unwrap();
    }
    refused(&[b[0].clone(), b[1].clone(), b[2].clone(), c.clone()], &[], "checksum mismatch");
    // Truncated member (smaller than its superblock says).
    let t = copy(&b[3], "truncated.img");
    std::fs::OpenOptions::new().write(true).open(&t).unwrap().set_len(20 << 20).unwrap();
    refused(&[b[0].clone(), b[1].clone(), b[2].clone(), t.clone()], &[], "does not fit");
    // A file shorter than a superblock.
    let tiny = dir.path("tiny.img");
    std::fs::write(&tiny, [0u8; 1000]).unwrap();
    refused(&[b[0].clone(), b[1].clone(), b[2].clone(), tiny], &[], "superblock");
    // No members that exist.
    let o = uraid(&["assemble", dir.path("nope.img").to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("nope.img"), "{}", text(&o));

    // Create refuses to overwrite a member without --force, and bad geometry.
    let o = uraid(&["create", "-l", "5", "-n", "3", paths(&b)[0], paths(&b)[1], paths(&b)[2]]);
    assert!(!o.status.success() && text(&o).contains("--force"), "{}", text(&o));
    let o = uraid(&["create", "-l", "6", "-n", "3", "--size", "8M", "x1", "x2", "x3"]);
    assert!(!o.status.success() && text(&o).contains("at least 4"), "{}", text(&o));
    assert!(!std::path::Path::new("x1").exists(), "a refused create must not leave files behind");
}

/// A shape md cannot make is refused in the words of the options (not as a "corrupted
/// superblock", which is what the same check says of one found on disk), and no member
/// file is left behind.
#[test]
fn a_bad_shape_is_refused_in_the_options_words_and_creates_nothing() {
    let dir = TempDir::new("badshape");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("s{i}"))).collect();
    for (extra, says) in [
        (
            &["--level", "5", "--raid-devices", "3", "--chunk", "3K"][..],
            "--chunk 3 KiB is not valid for raid5",
        ),
        (&["--level", "6", "--raid-devices", "3"][..], "raid6 needs at least 4 devices; --raid-devices is 3"),
    ] {
        let mut args = vec!["create", "--size", "32M"];
        args.extend_from_slice(extra);
        args.extend(paths(&members));
        let o = uraid(&args);
        let t = text(&o);
        assert!(!o.status.success() && t.contains(says) && !t.contains("corrupted"), "{t}");
        assert!(members.iter().all(|m| !m.exists()), "a refused create left files: {t}");
    }
}

/// What create refuses, it refuses in words about what create takes: no `--data-offset`
/// (create has none) for members too small, and a bitmap chunk beyond what md's 32-bit
/// field holds is said to be that, not "not a power of two". Nothing is left behind.
#[test]
fn create_refusals_name_only_what_create_takes() {
    let dir = TempDir::new("createwords");
    let tiny: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("tiny{i}"))).collect();
    for t in &tiny {
        std::fs::File::create(t).unwrap().set_len(100 << 10).unwrap();
    }
    let before = hashes(&tiny);
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2"];
    args.extend(paths(&tiny));
    let o = uraid(&args);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("too small") && !t.contains("--data-offset"), "{t}");
    assert_eq!(hashes(&tiny), before, "a refused create wrote to a member");

    let big: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("big{i}"))).collect();
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2", "--size", "64M"];
    args.extend(["--bitmap", "internal", "--bitmap-chunk", "4G"]);
    args.extend(paths(&big));
    let o = uraid(&args);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("32-bit") && t.contains("2G"), "{t}");
    assert!(!t.contains("power of two"), "4G is a power of two: {t}");
    assert!(big.iter().all(|m| !m.exists()), "a refused create left files: {t}");
}

/// A new array's first start is not a crash nor a lost member: a new raid4/5 (its last
/// member built from the others, as mdadm creates it) and a new raid1/6/10 (an initial
/// resync) say "new array", never "not shut down cleanly" nor "degraded" (before: a new
/// raid5 started with "array is degraded: slot 2 is being rebuilt from the others").
#[test]
fn a_new_arrays_first_start_says_new_not_unclean_or_degraded() {
    let dir = TempDir::new("firststart");
    for (level, n) in [("5", 3), ("4", 3), ("6", 4), ("1", 2), ("10", 4)] {
        let members = create(&dir, &format!("r{level}"), level, n, &[]);
        let mut args = vec!["assemble"];
        args.extend(paths(&members));
        let o = uraid(&args);
        let t = text(&o);
        let said: Vec<&str> = t.lines().filter(|l| l.starts_with("uraid: ")).collect();
        assert!(o.status.success(), "raid{level}: {t}");
        assert!(said.iter().any(|l| l.contains("new array")), "raid{level}: {said:?}");
        assert!(
            said.iter().all(|l| !l.contains("degraded") && !l.contains("not shut down cleanly")),
            "raid{level}'s first start: {said:?}"
        );
    }
}
