//! `uraid set`: tunables of a running array change through the control socket, and a bad
//! name or value is refused with a message while the array keeps serving.

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

#[test]
fn tunables_change_at_run_time() {
    let dir = std::env::temp_dir().join(format!("uraid-set-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let m: Vec<String> = (0..3).map(|i| dir.join(format!("m{i}.img")).display().to_string()).collect();
    let out = uraid(&[
        "create",
        "--level",
        "5",
        "--raid-devices",
        "3",
        "--size",
        "32M",
        "--assume-clean",
        &m[0],
        &m[1],
        &m[2],
    ]);
    assert!(out.status.success(), "create: {}", String::from_utf8_lossy(&out.stderr));
    let sock = dir.join("ctl.sock").display().to_string();
    let unix = dir.join("nbd.sock").display().to_string();
    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_uraid"))
            .args(["serve", "--unix", &unix, "--control", &sock, "--balance", "prefer", &m[0], &m[1], &m[2]])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve"),
    );
    let t = Instant::now();
    while !std::path::Path::new(&sock).exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "control socket never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = uraid(&["set", "rmw_level", "0", "--control", &sock]);
    assert!(out.status.success(), "set: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("rmw_level 0"));
    // The balance chosen when the array was started.
    assert!(String::from_utf8_lossy(&out.stdout).contains("balance prefer"));
    let out = uraid(&["set", "stripe_cache_size", "1024", "--control", &sock]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("stripe_cache_size 1024"));
    let out = uraid(&["set", "balance", "round-robin", "--control", &sock]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("balance round-robin"));
    for bad in [["set", "balance", "fastest"], ["set", "rmw_level", "7"], ["set", "nonsense", "1"]] {
        let out = uraid(&[bad[0], bad[1], bad[2], "--control", &sock]);
        assert!(!out.status.success(), "{bad:?} must be refused");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty(), "{bad:?} must say why");
    }
    // Still serving: the status answers.
    let out = uraid(&["status", "--control", &sock]);
    assert!(out.status.success(), "status after refusals: {}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
