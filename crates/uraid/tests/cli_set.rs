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
    // A mirror's balance is not a RAID5 tunable: `--balance` at start is refused, nothing started.
    let out =
        uraid(&["serve", "--unix", &unix, "--control", &sock, "--balance", "prefer", &m[0], &m[1], &m[2]]);
    assert!(!out.status.success(), "--balance accepted on raid5");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--balance does not apply to a raid5"));
    assert!(!std::path::Path::new(&sock).exists(), "a refused serve left its control socket");
    // The same at start: a floor above md's default ceiling alone is refused.
    let out = uraid(&[
        "serve",
        "--unix",
        &unix,
        "--control",
        &sock,
        "--sync-speed-min",
        "300000",
        &m[0],
        &m[1],
        &m[2],
    ]);
    assert!(!out.status.success(), "--sync-speed-min above the ceiling accepted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("above sync_speed_max 200000"));
    assert!(!std::path::Path::new(&sock).exists(), "a refused serve left its control socket");
    let _server = Server(
        Command::new(env!("CARGO_BIN_EXE_uraid"))
            .args(["serve", "--unix", &unix, "--control", &sock, &m[0], &m[1], &m[2]])
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
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(shown.contains("rmw_level 0"), "{shown}");
    // A mirror's balance is not a RAID5 tunable: not listed.
    assert!(!shown.contains("balance"), "{shown}");
    let out = uraid(&["set", "stripe_cache_size", "1024", "--control", &sock]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("stripe_cache_size 1024"));
    let out = uraid(&["set", "preread_bypass_threshold", "4", "--control", &sock]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("preread_bypass_threshold 4"));
    // `set` changes what it names and nothing else (md's sysfs files are independent).
    let out = uraid(&["set", "sync_speed_max", "4000", "--control", &sock]);
    assert!(out.status.success());
    let out = uraid(&["set", "sync_speed_min", "3000", "--control", &sock]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(shown.contains("sync_speed_min 3000") && shown.contains("sync_speed_max 4000"), "{shown}");
    for (bad, says) in [
        (["set", "balance", "round-robin"], "does not apply to a raid5"),
        (["set", "rmw_level", "7"], "use 0, 1 or 2"),
        (["set", "stripe_cache_size", "16"], "17-32768"),
        (["set", "sync_speed_min", "0"], "at least 1"),
        // A floor above the ceiling would make the ceiling mean nothing (md's throttle
        // lets the floor win): refused, whichever of the two is set (was: accepted).
        (["set", "sync_speed_min", "5000"], "above sync_speed_max 4000"),
        (["set", "sync_speed_max", "2000"], "sync_speed_min 3000 is above sync_speed_max 2000"),
        (["set", "nomerges", "2"], "unknown tunable"),
    ] {
        let out = uraid(&[bad[0], bad[1], bad[2], "--control", &sock]);
        assert!(!out.status.success(), "{bad:?} must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{bad:?} must say why: {err}");
    }
    let out = uraid(&["set", "--control", &sock]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        shown.contains("stripe_cache_size 1024") && shown.contains("rmw_level 0"),
        "refusals changed nothing: {shown}"
    );
    // Still serving: the status answers.
    let out = uraid(&["status", "--control", &sock]);
    assert!(out.status.success(), "status after refusals: {}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
