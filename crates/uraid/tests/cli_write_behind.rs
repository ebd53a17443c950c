//! md's write-behind (issue 27, item 6) on a real run: a RAID1 of a local file and a slow
//! remote leg (nbdkit's delay filter, every write 20 ms late), the remote leg write-mostly
//! with `--write-behind`. fio's writes complete while the slow member's copies are still
//! in flight (`detail --json` counts them), everything reads back; the slow member server
//! is killed mid-run (fio sees no error), restarted, re-added: only the bitmap's dirty
//! chunks are resynced, and the remote leg alone then holds fio's data.
//! nbdkit (with its delay filter) and a fio with its nbd engine are required.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const MEMBER_BYTES: u64 = 256 << 20;
const FIO_REGION: &str = "16m";

/// `nbdkit --filter=delay file FILE wdelay=20ms` on `sock`, once it accepts connections.
fn slow_member(file: &Path, sock: &Path, log: &Path) -> Reaped {
    let _ = std::fs::remove_file(sock);
    let logf = std::fs::File::options().create(true).append(true).open(log).unwrap();
    let child = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "--filter=delay", "-U"])
        .arg(sock)
        .arg("file")
        .arg(file)
        .arg("wdelay=20ms")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(logf)
        .spawn()
        .unwrap_or_else(|e| panic!("nbdkit is required (scripts/install-deps.sh): {e}"));
    let mut p = Reaped(Some(child));
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        if let Some(st) = p.0.as_mut().unwrap().try_wait().unwrap() {
            panic!("nbdkit exited ({st}):\n{}", std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    p
}

fn detail_json(s: &Served) -> serde_json::Value {
    let c = s.control.display().to_string();
    let out = ok(uraid(&["detail", "--json", "--control", &c]), "uraid detail --json");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn fio_args(url: &str, extra: &[&str]) -> Vec<String> {
    fio_verify_job("write-behind", url, FIO_REGION, 20261128, extra)
}

#[test]
fn writes_complete_ahead_of_a_slow_write_mostly_member_and_its_re_add_resyncs_only_dirty_chunks() {
    let o = tool("fio", &["--enghelp=nbd"]);
    assert!(o.status.success() && text(&o).contains("uri"), "this fio has no nbd engine:\n{}", text(&o));
    let dir = TempDir::new("write-behind");
    let (sock, server_log) = (dir.path("member.sock"), dir.path("nbdkit.log"));
    let remote_file = dir.path("remote.img");
    let local = dir.path("local.img");
    for f in [&remote_file, &local] {
        std::fs::File::create(f).unwrap().set_len(MEMBER_BYTES).unwrap();
    }
    let mut server = slow_member(&remote_file, &sock, &server_log);
    let uri = PathBuf::from(format!("nbd+unix:///?socket={}", sock.display()));
    let (uri_s, local_s) = (uri.display().to_string(), local.display().to_string());

    // Refused without a bitmap, as mdadm refuses it.
    let o = uraid(&["create", "-l1", "-n2", "--assume-clean", "--write-behind", "64", &local_s, &uri_s]);
    assert!(!o.status.success() && text(&o).contains("bitmap"), "{}", text(&o));
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2", "--assume-clean"];
    args.extend(["--bitmap", "internal", "--bitmap-chunk", "1M", "--write-mostly", &uri_s]);
    args.extend(["--write-behind", "64", &local_s, &uri_s]);
    ok(uraid(&args), "uraid create --write-behind");
    let ex = ok(uraid(&["examine", &uri_s]), "uraid examine");
    assert!(ex.contains("Write Mode : Allow write behind, max 64"), "{ex}");
    let members = [local.clone(), uri.clone()];
    Served::start(&dir, &members, &[]).stop();
    let s = Served::start(&dir, &members, &["--member-timeout", "5s"]);
    let d = detail_json(&s);
    assert_eq!(d["write_behind"], 64, "{d}");
    let text_detail = s.ctl("detail", None);
    assert!(text_detail.contains("Write Mode : Allow write behind, max 64"), "{text_detail}");

    // Writes and verify; the counters are sampled while fio runs.
    let fio = spawn_fio(&fio_args(&s.url, &[]));
    let mut most_in_flight = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1500) {
        let n = detail_json(&s)["behind_writes_in_flight"].as_u64().unwrap_or(0);
        most_in_flight = most_in_flight.max(n);
        std::thread::sleep(Duration::from_millis(30));
    }
    let o = fio.wait();
    check_fio_run(&o, "random write + verify over a slow write-mostly member", 2048, &s.log_text());
    let d = detail_json(&s);
    let behind = d["write_behind_requests"].as_u64().unwrap();
    eprintln!("write-behind: {behind} of fio's writes completed ahead of the slow member, at most {most_in_flight} seen in flight");
    assert!(behind > 0 && most_in_flight > 0, "no write completed ahead of the slow member: {d}");
    assert!(most_in_flight <= 64, "more than --write-behind writes were behind: {most_in_flight}");

    // Kill the slow member mid-run: the writes behind on it are lost with it; their bits stay.
    let fio = spawn_fio(&fio_args(&s.url, &["--rate_iops=1000"]));
    std::thread::sleep(Duration::from_millis(700));
    server.kill();
    let o = fio.wait();
    check_fio_run(&o, "random write + verify while the slow member dies", 2048, &s.log_text());
    let st = s.ctl("status", None);
    assert!(st.contains("[2/1]") && st.contains("(F)"), "the slow member should be failed:\n{st}");

    let _server = slow_member(&remote_file, &sock, &server_log);
    s.ctl("remove", Some(&uri));
    let msg = s.ctl("add", Some(&uri));
    assert!(msg.contains("re-added") && msg.contains("only the"), "not a bitmap re-add: {msg}");
    let st = wait_in_sync(&s);
    assert!(st.contains("[UU]"), "{st}");
    // fio's 16 MiB region in 1 MiB chunks: the resync writes at most those (and the
    // metadata), never the 256 MiB member.
    let d = detail_json(&s);
    let rebuilt = d["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["raid_device"].as_u64() == Some(1))
        .and_then(|m| m["io"]["write_bytes"].as_u64())
        .unwrap_or_else(|| panic!("no I/O counts for slot 1: {d}"));
    assert!(rebuilt > 0 && rebuilt <= 18 << 20, "the re-add wrote {rebuilt} bytes to the member ({msg})");
    let o = spawn_fio(&fio_args(&s.url, &["--verify_only"])).wait();
    check_fio_run(&o, "verify-only after the re-add", 2048, &s.log_text());
    // The remote leg alone holds everything: the resync covered what was behind.
    s.ctl("fail", Some(&local));
    let o = spawn_fio(&fio_args(&s.url, &["--verify_only"])).wait();
    check_fio_run(&o, "verify-only from the re-added slow member alone", 2048, &s.log_text());
    s.stop();
}
