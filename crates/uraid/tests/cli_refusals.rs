//! Commands that must refuse instead of destroying data: each refusal leaves the sha256 of
//! every file involved unchanged (docs/reliability.md).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

fn create(dir: &TempDir, level: &str, names: &[&str], extra: &[&str]) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = names.iter().map(|n| dir.path(n)).collect();
    let n = names.len().to_string();
    let mut args = vec!["create", "--level", level, "--raid-devices", &n, "--size", "8M", "--assume-clean"];
    args.extend_from_slice(extra);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    members
}

fn hashes(files: &[PathBuf]) -> Vec<String> {
    files.iter().map(|p| sha256_file(p)).collect()
}

/// Runs `uraid serve` expecting it to refuse at once; returns what it printed. A server
/// that starts instead fails the test.
fn serve_refused(args: &[&str]) -> String {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    let o = bounded(URAID, &all, std::time::Duration::from_secs(10));
    assert!(!o.status.success(), "uraid serve should have refused:\n{}", text(&o));
    text(&o)
}

#[test]
fn a_socket_path_that_is_a_member_or_a_file_is_refused_and_kept() {
    let dir = TempDir::new("sockpath");
    let members = create(&dir, "1", &["z0", "z1"], &["--name", "sockpath"]);
    let victim = dir.path("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let mut watched = members.clone();
    watched.push(victim.clone());
    let before = hashes(&watched);
    let z0 = members[0].to_str().unwrap();
    let z1 = members[1].to_str().unwrap();
    let ctl = dir.path("c.sock");

    // The NBD socket named as one of the members.
    let t = serve_refused(&["--run", "--unix", z1, "--control", ctl.to_str().unwrap(), z0, z1]);
    assert!(t.contains("is not a socket"), "{t}");
    // The control socket named as a plain file.
    let t = serve_refused(&[
        "--unix",
        dir.path("n.sock").to_str().unwrap(),
        "--control",
        victim.to_str().unwrap(),
        z0,
        z1,
    ]);
    assert!(t.contains("is not a socket"), "{t}");
    assert_eq!(hashes(&watched), before, "a refused serve changed a file");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn a_second_server_of_the_same_members_is_refused_naming_the_holder() {
    let dir = TempDir::new("twice");
    let members = create(&dir, "5", &["a0", "a1", "a2"], &["--name", "twice"]);
    let served = Served::start(&dir, &members, &[]);
    let other = TempDir::new("twice-b");
    let mut args: Vec<String> = vec![
        "--unix".into(),
        other.path("n.sock").display().to_string(),
        "--control".into(),
        other.path("c.sock").display().to_string(),
    ];
    args.extend(members.iter().map(|p| p.display().to_string()));
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = serve_refused(&a);
    assert!(t.contains("is in use"), "{t}");
    let pid = served.child.as_ref().unwrap().id();
    assert!(t.contains(&format!("pid {pid}")), "the message should name the holder, pid {pid}: {t}");
    // create --force over a served member is refused too.
    let o = uraid(&[
        "create",
        "--level",
        "1",
        "--raid-devices",
        "2",
        "--force",
        members[0].to_str().unwrap(),
        "missing",
    ]);
    assert!(!o.status.success() && text(&o).contains("is in use"), "{}", text(&o));
    served.stop();
}

#[test]
fn add_refuses_a_member_of_another_array_and_one_held_by_another_server() {
    let dir = TempDir::new("addforeign");
    let mine = create(&dir, "1", &["m0", "m1"], &["--name", "mine"]);
    let theirs = create(&dir, "1", &["t0", "t1"], &["--name", "theirs"]);
    // Serve ours degraded (m1 left out), so `add` has a slot to fill.
    let served = Served::start(&dir, &mine[..1], &["--run"]);
    let before = hashes(&theirs);
    let c = served.control.display().to_string();
    let o = uraid(&["add", theirs[0].to_str().unwrap(), "--control", &c]);
    assert!(!o.status.success() && text(&o).contains("another array"), "{}", text(&o));
    assert_eq!(hashes(&theirs), before, "a refused add wrote to the other array's member");

    // Served by another process: refused even with --force.
    let other_dir = TempDir::new("addforeign-b");
    let theirs_served = Served::start(&other_dir, &theirs, &[]);
    let o = uraid(&["add", "--force", theirs[1].to_str().unwrap(), "--control", &c]);
    assert!(!o.status.success() && text(&o).contains("is in use"), "{}", text(&o));
    theirs_served.stop();
    let before = hashes(&theirs);
    // With --force and nobody holding it, it is the user's choice.
    let o = uraid(&["add", "--force", theirs[1].to_str().unwrap(), "--control", &c]);
    assert!(o.status.success(), "{}", text(&o));
    assert_ne!(hashes(&theirs)[1], before[1]);
    served.stop();
}

#[test]
fn add_to_a_failed_array_is_refused_before_writing() {
    let dir = TempDir::new("addfailed");
    let members = create(&dir, "1", &["f0", "f1"], &["--name", "failed"]);
    let spare = dir.path("spare");
    std::fs::write(&spare, vec![0u8; 8 << 20]).unwrap();
    let served = Served::start(&dir, &members, &[]);
    served.ctl("fail", Some(&members[0]));
    let ctl = served.control.display().to_string();
    ok(uraid(&["fail", "--force", members[1].to_str().unwrap(), "--control", &ctl]), "uraid fail --force");
    let before = sha256_file(&spare);
    let o = uraid(&["add", spare.to_str().unwrap(), "--control", &served.control.display().to_string()]);
    assert!(!o.status.success() && text(&o).contains("has failed"), "{}", text(&o));
    assert_eq!(sha256_file(&spare), before, "a refused add wrote to the new member");
    drop(served);
}

/// mdadm --fail refuses a member the array cannot lose ("array will be failed"): the
/// array stays up with that member, clients read on; `--force` insists.
#[test]
fn fail_of_the_last_redundant_member_is_refused_unless_forced() {
    let dir = TempDir::new("faillast");
    let members = create(&dir, "5", &["l0", "l1", "l2"], &["--name", "faillast"]);
    let served = Served::start(&dir, &members, &[]);
    let ctl = served.control.display().to_string();
    qemu_io(&served.url, &["write -P 0x5a 0 1M".to_string(), "flush".to_string()]);
    served.ctl("fail", Some(&members[0]));
    let o = uraid(&["fail", members[1].to_str().unwrap(), "--control", &ctl]);
    let t = text(&o);
    assert!(!o.status.success() && t.contains("would fail the array") && t.contains("--force"), "{t}");
    let st = served.ctl("status", None);
    assert!(st.contains("[3/2]") && st.contains("[_UU]"), "a refused fail changed the array:\n{st}");
    qemu_io(&served.url, &["read -P 0x5a 0 1M".to_string()]);
    let e = ok(tool("mdadm", &["--examine", members[2].to_str().unwrap()]), "mdadm --examine");
    assert!(mdadm_field(&e, "Array State").is_some_and(|a| a.starts_with(".AA")), "{e}");
    // --force: failed as asked; the array has failed and says so.
    let out =
        ok(uraid(&["fail", "--force", members[1].to_str().unwrap(), "--control", &ctl]), "fail --force");
    assert!(out.contains("faulty"), "{out}");
    let st = served.ctl("status", None);
    assert!(st.contains("[3/1]"), "{st}");
    drop(served);
}

#[test]
fn create_refuses_a_shape_that_could_never_start() {
    let dir = TempDir::new("nostart");
    let q2 = dir.path("q2");
    std::fs::write(&q2, vec![7u8; 8 << 20]).unwrap();
    let before = sha256_file(&q2);
    let o =
        uraid(&["create", "--level", "5", "--raid-devices", "3", "missing", "missing", q2.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("could never start"), "{}", text(&o));
    assert_eq!(sha256_file(&q2), before);
    // A raid10 near-2 with both copies of one half missing.
    let files: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("r{i}"))).collect();
    for f in &files {
        std::fs::write(f, vec![1u8; 8 << 20]).unwrap();
    }
    let before = hashes(&files);
    let o = uraid(&[
        "create",
        "--level",
        "10",
        "--raid-devices",
        "4",
        files[0].to_str().unwrap(),
        files[1].to_str().unwrap(),
        "missing",
        "missing",
    ]);
    assert!(!o.status.success() && text(&o).contains("could never start"), "{}", text(&o));
    assert_eq!(hashes(&files), before);
    // One missing of three is a degraded raid5 that starts with --run.
    ok(
        uraid(&[
            "create",
            "--level",
            "5",
            "--raid-devices",
            "3",
            "--force",
            files[0].to_str().unwrap(),
            "missing",
            q2.to_str().unwrap(),
        ]),
        "a degraded raid5",
    );
}

#[test]
fn two_arrays_in_one_folder_get_two_control_sockets() {
    let dir = TempDir::new("twoarrays");
    let a = create(&dir, "1", &["a0", "a1"], &[]);
    let b = create(&dir, "1", &["b0", "b1"], &[]);
    let mut children = Vec::new();
    let mut sockets = Vec::new();
    for (tag, members) in [("a", &a), ("b", &b)] {
        let log = dir.path(&format!("{tag}.log"));
        let mut args =
            vec!["serve".to_string(), "--unix".into(), dir.path(&format!("{tag}.nbd")).display().to_string()];
        args.extend(members.iter().map(|p| p.display().to_string()));
        let child =
            Command::new(URAID).args(&args).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
        children.push(child);
        let t0 = std::time::Instant::now();
        let sock = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find_map(|l| l.strip_prefix("uraid: control socket ")) {
                break PathBuf::from(line.trim());
            }
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(20)
                    && children.last_mut().unwrap().try_wait().unwrap().is_none(),
                "array {tag} did not start:\n{text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        sockets.push(sock);
    }
    assert_ne!(sockets[0], sockets[1], "both arrays got the same default control socket");
    for (sock, members) in sockets.iter().zip([&a, &b]) {
        let st = ok(uraid(&["status", "--control", sock.to_str().unwrap()]), "uraid status");
        assert!(st.contains(members[0].to_str().unwrap()), "{st}");
    }
    for mut c in children {
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        assert!(c.wait().unwrap().success());
    }
}

/// What uraid says reads as English and names commands that exist: a stale or corrupted
/// member is brought back with `uraid add` (there is no `re-add` verb), one region is "1
/// region", "replacing" is spelled so, and no message ends in Rust's "(os error N)".
#[test]
fn messages_read_as_english_and_name_real_commands() {
    let dir = TempDir::new("words");
    let members = create(&dir, "1", &["w0", "w1", "w2"], &["--name", "words", "--bitmap", "internal"]);
    let (w0, w1, w2) =
        (members[0].to_str().unwrap(), members[1].to_str().unwrap(), members[2].to_str().unwrap());
    // No server on the socket: the reason is in the sentence, not tacked on after a question.
    let nobody = dir.path("nobody.sock");
    let t = text(&uraid(&["status", "--control", nobody.to_str().unwrap()]));
    assert!(t.contains("(no such file or directory): is `uraid serve` running with it?"), "{t}");
    // Away: w2 left out while 64 KiB is written, then the server killed (dirty).
    let mut served = Served::start(&dir, &members[..2], &["--run"]);
    qemu_io(&served.url, &["write -P 0x33 1M 64k".to_string(), "flush".to_string()]);
    let mut child = served.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(served);
    let t = text(&uraid(&["assemble", w0, w1, w2]));
    assert!(t.contains("is stale") && t.contains("uraid add") && !t.contains("re-add it"), "{t}");
    assert!(t.contains("resync of 1 bitmap chunk ("), "{t}");
    // Served whole: w2 comes back from the bitmap, "the 1 region written while it was away".
    let served = Served::start(&dir, &members, &[]);
    let t0 = std::time::Instant::now();
    while !served.log_text().contains("re-added") {
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "{}", served.log_text());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let log = served.log_text();
    assert!(log.contains("only the 1 region ") && !log.contains("1 regions"), "{log}");
    while !served.ctl("status", None).contains("[UUU]") {
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "{}", served.log_text());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Replacing with another array's member: refused, and spelled right.
    let theirs = create(&dir, "1", &["x0", "x1"], &["--name", "theirs"]);
    let c = served.control.display().to_string();
    let o = uraid(&["replace", w0, "--with", theirs[0].to_str().unwrap(), "--control", &c]);
    let t = text(&o);
    assert!(
        !o.status.success() && t.contains("replacing it would overwrite") && !t.contains("replaceing"),
        "{t}"
    );
    served.stop();
    // A corrupted superblock: left out and added back with `uraid add`.
    let bad = dir.path("bad");
    std::fs::copy(&members[2], &bad).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&bad).unwrap();
        f.write_all_at(&[0x5a], 4096 + 100).unwrap();
    }
    let t = text(&uraid(&["examine", bad.to_str().unwrap()]));
    assert!(t.contains("checksum mismatch") && t.contains("uraid add") && !t.contains("re-add it"), "{t}");
    // I/O errors in words, without Rust's "(os error N)".
    let gone = dir.path("gone").display().to_string();
    for args in [
        vec!["examine", gone.as_str()],
        vec!["status", "--control", gone.as_str()],
        vec!["create", "-l", "1", "-n", "2", "--size", "8M", "/nonexistent-dir/a", "/nonexistent-dir/b"],
    ] {
        let o = uraid(&args);
        let t = text(&o);
        assert!(!o.status.success() && !t.contains("(os error"), "{args:?}: {t}");
    }
    let t = text(&uraid(&["examine", gone.as_str()]));
    assert!(t.contains("1 of 1 members has no usable"), "{t}");
}

/// mdadm --zero-superblock: refused (nothing written) for a member a running array holds,
/// and for a file with no md superblock, even beside members it could erase; otherwise
/// only the superblock goes: examine finds none, the data area is unchanged.
#[test]
fn zero_superblock_erases_only_superblocks_of_members_nobody_holds() {
    let dir = TempDir::new("zerosb");
    let members = create(&dir, "1", &["q0", "q1"], &["--name", "zerosb"]);
    let plain = dir.path("plain");
    std::fs::write(&plain, vec![0x5au8; 1 << 20]).unwrap();
    let served = Served::start(&dir, &members, &[]);
    let before = hashes(&members);
    let o = uraid(&["zero-superblock", members[0].to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("in use by pid"), "{}", text(&o));
    assert_eq!(hashes(&members), before, "a member of a running array was written");
    served.stop();

    let mut all = members.clone();
    all.push(plain.clone());
    let before = hashes(&all);
    let o = uraid(&["zero-superblock", members[0].to_str().unwrap(), plain.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("no md superblock"), "{}", text(&o));
    assert_eq!(hashes(&all), before, "a refused zero-superblock wrote something");

    let data_at = 2048 * 512u64;
    let data_before = std::fs::read(&members[0]).unwrap()[data_at as usize..].to_vec();
    ok(uraid(&["zero-superblock", members[0].to_str().unwrap()]), "zero-superblock");
    let ex = uraid(&["examine", members[0].to_str().unwrap()]);
    assert!(!ex.status.success() && text(&ex).contains("no md superblock"), "{}", text(&ex));
    assert_eq!(std::fs::read(&members[0]).unwrap()[data_at as usize..], data_before[..], "data changed");
    // The other member is untouched and still examines as a member of the array.
    ok(uraid(&["examine", members[1].to_str().unwrap()]), "examine of the other member");
}
