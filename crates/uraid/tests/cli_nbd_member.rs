//! Members that are NBD exports (issue 27, item 6): a RAID1 of a local file and a remote
//! leg served by nbdkit, or by another `uraid serve`, on a Unix socket. The member server
//! is killed while fio writes (fio sees no error, the member is failed), restarted on the
//! same data, re-added: the resync writes only the bitmap's dirty chunks, and fio's verify
//! reads everything back, from the local leg and then from the remote one alone. A member
//! server on TCP that stops answering is failed at its failfast deadline. Also the
//! refusals: an unreachable server, an unknown export, a read-only export. And the config
//! line `detail --scan` writes names the export, which `assemble --scan` finds again.
//! nbdkit and a fio with its nbd engine are required (scripts/install-deps.sh).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The member's size and the region fio writes: a re-add that rebuilt the whole member
/// would write 16 times what the region's chunks hold.
const MEMBER_BYTES: u64 = 256 << 20;
const FIO_REGION: &str = "16m";

/// What serves the remote leg.
enum MemberServer {
    /// `nbdkit file FILE`: the data is in the file and survives a restart.
    Nbdkit { file: PathBuf },
    /// Another uraid serving a RAID1 of two files, export `m`.
    Uraid { members: Vec<PathBuf>, control: PathBuf },
}

impl MemberServer {
    /// Starts it on `sock` and waits until it accepts connections.
    fn start(&self, sock: &Path, log: &Path) -> Reaped {
        let _ = std::fs::remove_file(sock);
        let logf = std::fs::File::options().create(true).append(true).open(log).unwrap();
        let mut cmd = match self {
            MemberServer::Nbdkit { file } => {
                let mut c = Command::new("nbdkit");
                c.args(["--foreground", "--exit-with-parent", "-U"]).arg(sock).arg("file").arg(file);
                c
            }
            MemberServer::Uraid { members, control } => {
                let mut c = Command::new(env!("CARGO_BIN_EXE_uraid"));
                c.args(["serve", "--export-name", "m", "--unix"]).arg(sock).arg("--control").arg(control);
                c.args(members);
                c
            }
        };
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(logf).spawn().unwrap_or_else(|e| {
            panic!("the member server is required (scripts/install-deps.sh installs nbdkit): {e}")
        });
        let mut p = Reaped(Some(child));
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            if let Some(st) = p.0.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "the member server exited ({st}):\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "the member server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }
}

fn fio_args(url: &str, extra: &[&str]) -> Vec<String> {
    fio_verify_job("nbd-member", url, FIO_REGION, 20261127, extra)
}

/// 2048 blocks of 8 KiB: fio's 16 MiB region.
fn check_fio(o: &Output, what: &str, s: &Served) {
    check_fio_run(o, what, 2048, &s.log_text());
}

fn detail_json(s: &Served) -> serde_json::Value {
    let c = s.control.display().to_string();
    let out = ok(uraid(&["detail", "--json", "--control", &c]), "uraid detail --json");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Bytes written to the member in `slot` since it joined (`detail --json`).
fn slot_write_bytes(s: &Served, slot: u64) -> u64 {
    let v = detail_json(s);
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["raid_device"].as_u64() == Some(slot))
        .and_then(|d| d["io"]["write_bytes"].as_u64())
        .unwrap_or_else(|| panic!("no I/O counts for slot {slot}: {v}"))
}

fn remote_member_dies_comes_back_and_resyncs_only_dirty_chunks(dir: &TempDir, server: MemberServer) {
    let o = tool("fio", &["--enghelp=nbd"]);
    assert!(o.status.success() && text(&o).contains("uri"), "this fio has no nbd engine:\n{}", text(&o));
    let sock = dir.path("member.sock");
    let server_log = dir.path("member-server.log");
    let local = dir.path("local.img");
    std::fs::File::create(&local).unwrap().set_len(MEMBER_BYTES).unwrap();
    let mut remote_server = server.start(&sock, &server_log);
    let uri = PathBuf::from(format!("nbd+unix:///{}?socket={}", export_of(&server), sock.display()));
    let uri_s = uri.display().to_string();

    // The remote leg is write-mostly, as md's remote mirrors are: reads stay local.
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2", "--assume-clean"];
    args.extend(["--bitmap", "internal", "--bitmap-chunk", "1M", "--write-mostly", &uri_s]);
    let local_s = local.display().to_string();
    args.extend([local_s.as_str(), uri_s.as_str()]);
    ok(uraid(&args), "uraid create");
    assert!(!Path::new(&uri_s).exists(), "create made a file named after the URI");
    let ex = ok(uraid(&["examine", &uri_s]), "uraid examine of the remote member");
    assert!(ex.contains("Active device 1") && ex.contains("write-mostly"), "{ex}");
    let members = [local.clone(), uri.clone()];
    let asm = ok(uraid(&["assemble", &local_s, &uri_s]), "uraid assemble");
    assert!(asm.contains("the array can start"), "{asm}");
    // A first clean stop clears the bits create set.
    Served::start(dir, &members, &[]).stop();
    let s = Served::start(dir, &members, &["--member-timeout", "5s"]);
    assert!(s.log_text().contains("NBD export"), "the executor did not see an NBD member:\n{}", s.log_text());
    let kind = detail_json(&s)["devices"][1]["kind"].clone();
    assert_eq!(kind, "NBD export", "{}", detail_json(&s));

    // 2048 writes at 1000 a second: the member server dies 700 ms into them.
    let fio = spawn_fio(&fio_args(&s.url, &["--rate_iops=1000"]));
    std::thread::sleep(Duration::from_millis(700));
    remote_server.kill();
    let o = fio.wait();
    check_fio(&o, "random write + verify while the member server dies", &s);
    let st = s.ctl("status", None);
    assert!(st.contains("[2/1]") && st.contains("(F)"), "the remote member should be failed:\n{st}");
    let (log, gone) = (s.log_text(), format!("event DeviceDisappeared {uri_s}"));
    assert!(log.contains(&gone) && log.contains(&format!("event Fail {uri_s}")), "{log}");

    // Back on the same data: re-added from the bitmap.
    let _remote_server = server.start(&sock, &server_log);
    s.ctl("remove", Some(&uri));
    let msg = s.ctl("add", Some(&uri));
    assert!(msg.contains("re-added") && msg.contains("only the"), "not a bitmap re-add: {msg}");
    let st = wait_in_sync(&s);
    assert!(st.contains("[UU]"), "{st}");
    // fio's region is 16 MiB of 1 MiB bitmap chunks: the resync writes at most those
    // (plus the superblock and bitmap), never the 256 MiB member.
    let rebuilt = slot_write_bytes(&s, 1);
    eprintln!(
        "re-add of a {MEMBER_BYTES}-byte NBD member after fio on {FIO_REGION}: {rebuilt} bytes written to it"
    );
    assert!(rebuilt > 0 && rebuilt <= 18 << 20, "the re-add wrote {rebuilt} bytes to the member ({msg})");

    let o = spawn_fio(&fio_args(&s.url, &["--verify_only"])).wait();
    check_fio(&o, "verify-only after the re-add", &s);
    // The remote leg alone must hold everything: fail the local one and verify again.
    s.ctl("fail", Some(&local));
    let o = spawn_fio(&fio_args(&s.url, &["--verify_only"])).wait();
    check_fio(&o, "verify-only from the re-added remote member alone", &s);
    // The config line `detail --scan` writes names the export by its URI, and finds it again.
    let scan = ok(uraid(&["detail", "--scan"]), "uraid detail --scan");
    let control = s.control.display().to_string();
    let line = scan.lines().find(|l| l.contains(&control)).unwrap_or_else(|| panic!("not listed:\n{scan}"));
    assert!(line.contains(&format!(",{uri_s}")), "{line}");
    s.stop();
    let conf = dir.path("uraid.conf");
    std::fs::write(&conf, format!("{line}\n")).unwrap();
    let asm = ok(uraid(&["assemble", "--scan", "--config", &conf.display().to_string()]), "assemble --scan");
    assert!(asm.contains(&uri_s) && asm.contains("the array can start"), "{asm}");
}

fn export_of(server: &MemberServer) -> &'static str {
    match server {
        MemberServer::Nbdkit { .. } => "",
        MemberServer::Uraid { .. } => "m",
    }
}

#[test]
fn nbdkit_member_killed_during_fio_is_failed_then_re_added_with_only_dirty_chunks() {
    let dir = TempDir::new("nbd-member-nbdkit");
    let file = dir.path("remote.img");
    std::fs::File::create(&file).unwrap().set_len(MEMBER_BYTES).unwrap();
    remote_member_dies_comes_back_and_resyncs_only_dirty_chunks(&dir, MemberServer::Nbdkit { file });
}

#[test]
fn uraid_served_member_killed_during_fio_is_failed_then_re_added_with_only_dirty_chunks() {
    let dir = TempDir::new("nbd-member-uraid");
    let inner: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("inner{i}.img"))).collect();
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2", "--assume-clean", "--size"];
    let size = format!("{}", MEMBER_BYTES / 1024 + 4096);
    args.push(&size);
    args.extend(paths(&inner));
    ok(uraid(&args), "uraid create (the inner array)");
    let control = dir.path("inner-control.sock");
    remote_member_dies_comes_back_and_resyncs_only_dirty_chunks(
        &dir,
        MemberServer::Uraid { members: inner, control },
    );
}

/// Unreachable server, unknown export, read-only export: refused in words that say what
/// was wrong and what to do; nothing is created or written.
#[test]
fn bad_nbd_members_are_refused_and_nothing_changes() {
    let dir = TempDir::new("nbd-member-refusals");
    let local = dir.path("local.img");
    std::fs::File::create(&local).unwrap().set_len(64 << 20).unwrap();
    let local_s = local.display().to_string();
    let before = sha256_file(&local);
    let refused = |member: &str, words: &[&str]| {
        let o = uraid(&["create", "--level", "1", "--raid-devices", "2", &local_s, member]);
        let t = text(&o);
        assert!(!o.status.success(), "create with {member} succeeded:\n{t}");
        assert!(!t.contains("panicked"), "{t}");
        for w in words {
            assert!(t.contains(w), "the refusal of {member} does not say {w:?}:\n{t}");
        }
        assert_eq!(sha256_file(&local), before, "the refused create wrote to the local member");
        assert!(!Path::new(member).exists(), "a file named {member} was created");
    };
    let gone = dir.path("nobody.sock");
    refused(
        &format!("nbd+unix:///?socket={}", gone.display()),
        &["cannot connect", "is the NBD server running"],
    );
    refused("nbd://127.0.0.1:1/x", &["cannot connect", "is the NBD server running"]);
    refused("nbd://127.0.0.1:notaport/x", &["bad port", "expected nbd://"]);

    let file = dir.path("remote.img");
    std::fs::File::create(&file).unwrap().set_len(64 << 20).unwrap();
    let sock = dir.path("k.sock");
    let log = dir.path("nbdkit.log");
    let _k = MemberServer::Nbdkit { file: file.clone() }.start(&sock, &log);
    // nbdkit's file plugin serves any export name; uraid serve names its exports.
    let inner: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("inner{i}.img"))).collect();
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2", "--assume-clean", "--size", "65M"];
    args.extend(paths(&inner));
    ok(uraid(&args), "uraid create (the inner array)");
    let isock = dir.path("inner.sock");
    let _u =
        MemberServer::Uraid { members: inner, control: dir.path("inner-control.sock") }.start(&isock, &log);
    refused(
        &format!("nbd+unix:///nope?socket={}", isock.display()),
        &["no export of that name", "nbdinfo --list"],
    );
    let ro_sock = dir.path("ro.sock");
    let _ro = {
        let _ = std::fs::remove_file(&ro_sock);
        let c = Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "-r", "-U"])
            .arg(&ro_sock)
            .arg("file")
            .arg(&file)
            .stdin(Stdio::null())
            .spawn()
            .expect("nbdkit");
        let p = Reaped(Some(c));
        let t0 = Instant::now();
        while std::os::unix::net::UnixStream::connect(&ro_sock).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(20), "nbdkit -r did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    };
    let remote_before = sha256_file(&file);
    refused(&format!("nbd+unix:///?socket={}", ro_sock.display()), &["read-only", "must be writable"]);
    assert_eq!(sha256_file(&file), remote_before, "the refused create wrote to the remote member");
    // examine only reads: a read-only export is fine for it.
    let t = text(&uraid(&["examine", &format!("nbd+unix:///?socket={}", ro_sock.display())]));
    assert!(!t.contains("panicked") && !t.contains("read-only"), "{t}");
}

/// A member server on TCP that stops answering (SIGSTOP) is failed by its deadline: `--failfast`
/// gives it md's short one. The writer sees no error; once the server answers again (its
/// late replies are dropped), the member is re-added and reads back what was written.
#[test]
fn a_hung_failfast_nbd_member_is_failed_by_its_deadline_and_comes_back() {
    let dir = TempDir::new("nbd-member-hung");
    let local = dir.path("local.img");
    std::fs::File::create(&local).unwrap().set_len(64 << 20).unwrap();
    let file = dir.path("remote.img");
    std::fs::File::create(&file).unwrap().set_len(64 << 20).unwrap();
    // Over TCP on loopback, as a member on another machine is reached.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let c = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "-i", "127.0.0.1", "-p", &port.to_string(), "file"])
        .arg(&file)
        .stdin(Stdio::null())
        .spawn()
        .expect("nbdkit (scripts/install-deps.sh installs it)");
    let k = Reaped(Some(c));
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "nbdkit did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let uri = PathBuf::from(format!("nbd://127.0.0.1:{port}/"));
    let (uri_s, local_s) = (uri.display().to_string(), local.display().to_string());
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2", "--assume-clean"];
    args.extend(["--bitmap", "internal", "--bitmap-chunk", "1M", "--failfast", &uri_s, &local_s, &uri_s]);
    ok(uraid(&args), "uraid create");
    let members = [local.clone(), uri.clone()];
    let s = Served::start(&dir, &members, &[]);
    qemu_io(&s.url, &["write -P 0x11 0 4M".to_string(), "flush".to_string()]);

    let pid = k.0.as_ref().unwrap().id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let t0 = Instant::now();
    qemu_io(&s.url, &["write -P 0x22 8M 1M".to_string(), "flush".to_string()]);
    let took = t0.elapsed();
    let st = s.ctl("status", None);
    assert!(st.contains("[2/1]") && st.contains("(F)"), "the hung member should be failed:\n{st}");
    assert!(took < Duration::from_secs(10), "the write waited {took:?}: failfast's deadline is 2 s");
    assert!(s.log_text().contains("did not complete within 2.0 s"), "{}", s.log_text());
    unsafe { libc::kill(pid, libc::SIGCONT) };

    s.ctl("remove", Some(&uri));
    // Until the server's late replies are in, the same export may not take the slot again.
    let t0 = Instant::now();
    let msg = loop {
        let c = s.control.display().to_string();
        let o = uraid(&["add", &uri_s, "--control", &c]);
        if o.status.success() {
            break text(&o);
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "add refused: {}", text(&o));
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(msg.contains("re-added"), "not a bitmap re-add: {msg}");
    wait_in_sync(&s);
    s.ctl("fail", Some(&local));
    qemu_io(&s.url, &["read -P 0x11 0 4M".to_string(), "read -P 0x22 8M 1M".to_string()]);
    s.stop();
}
