//! A stale member (older events) is never used for data: `uraid serve` leaves it out, then
//! rebuilds it from the others (mdadm --re-add), after which it is a full member again.
//! Uses the degraded RAID6 made by Linux md in ../shared/fixtures/md.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn uraid(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uraid")).args(args).output().expect("run uraid")
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/md/raid6-6dev-64k-degraded")
}

#[test]
fn a_stale_member_is_rebuilt_and_rejoins() {
    let dir = std::env::temp_dir().join(format!("uraid-readd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut members = Vec::new();
    for i in 0..6 {
        let out = dir.join(format!("m{i}.img"));
        let st = Command::new("zstd")
            .args(["-q", "-d", "-f"])
            .arg(fixture().join(format!("member{i}.img.zst")))
            .arg("-o")
            .arg(&out)
            .status()
            .expect("zstd is needed (scripts/install-deps.sh installs it)");
        assert!(st.success(), "zstd failed on member {i}");
        members.push(out.display().to_string());
    }
    let sock = dir.join("ctl.sock").display().to_string();
    let unix = dir.join("nbd.sock").display().to_string();
    let mut args = vec!["serve".to_string(), "--unix".into(), unix, "--control".into(), sock.clone()];
    args.extend(members.iter().cloned());
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_uraid"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < Duration::from_secs(60), "the stale member never rejoined");
        std::thread::sleep(Duration::from_millis(100));
        if !Path::new(&sock).exists() {
            continue;
        }
        let out = uraid(&["status", "--control", &sock]);
        if String::from_utf8_lossy(&out.stdout).contains("[6/6] [UUUUUU]") {
            break;
        }
    }
    // A clean stop, then member 2 carries the array's events and its role.
    unsafe {
        libc::kill(server.0.id() as i32, libc::SIGTERM);
    }
    let mut server = server;
    let status = server.0.wait().unwrap();
    assert!(status.success(), "serve did not stop cleanly");
    let ex = |m: &str| String::from_utf8_lossy(&uraid(&["examine", m]).stdout).to_string();
    let events = |text: &str| text.lines().find(|l| l.trim_start().starts_with("Events")).map(str::to_string);
    let (e0, e2) = (ex(&members[0]), ex(&members[2]));
    assert!(e2.contains("Active device 2"), "{e2}");
    assert_eq!(events(&e0), events(&e2), "the rebuilt member's events differ from the others'");
    // Reassembled with nothing left out.
    let mut a = vec!["assemble"];
    a.extend(members.iter().map(String::as_str));
    let out = uraid(&a);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("is stale"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
