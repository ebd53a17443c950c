//! md's re-add with a write-intent bitmap: a member that was away comes back and only
//! the regions written meanwhile are rebuilt; Linux md's check agrees afterwards.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

fn wait_idle(s: &Served) {
    let t0 = Instant::now();
    let c = s.control.display().to_string();
    loop {
        let p = ok(uraid(&["status", "--control", &c]), "uraid status");
        if !p.contains("recovery") && !p.contains("resync") && p.contains("[UUU]") {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "recovery did not end:\n{p}\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_member_back_from_a_failure_or_a_restart_rebuilds_only_what_it_missed() {
    let dir = TempDir::new("readd");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("r{i}"))).collect();
    let mut args = vec![
        "create",
        "--level",
        "5",
        "--raid-devices",
        "3",
        "--size",
        "64M",
        "--assume-clean",
        "--bitmap",
        "internal",
    ];
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let served = Served::start(&dir, &members, &[]);
    qemu_io(&served.url, &["write -P 0x11 0 4M".to_string(), "flush".to_string()]);
    // Away under a failure: 1 MiB written meanwhile, then added back.
    served.ctl("fail", Some(&members[2]));
    qemu_io(&served.url, &["write -P 0x22 32M 1M".to_string(), "flush".to_string()]);
    served.ctl("remove", Some(&members[2]));
    let msg = served.ctl("add", Some(&members[2]));
    assert!(msg.contains("re-added") && msg.contains("only the"), "not a bitmap re-add: {msg}");
    wait_idle(&served);
    // Away across a restart: the array runs without it, then it is offered again.
    served.ctl("fail", Some(&members[1]));
    served.ctl("remove", Some(&members[1]));
    qemu_io(&served.url, &["write -P 0x33 48M 1M".to_string(), "flush".to_string()]);
    served.stop();
    let again = Served::start(&dir, &members, &[]);
    wait_idle(&again);
    assert!(
        again.log_text().contains("re-added"),
        "the stale member was not re-added from the bitmap:\n{}",
        again.log_text()
    );
    qemu_io(
        &again.url,
        &[
            "read -P 0x11 0 4M".to_string(),
            "read -P 0x22 32M 1M".to_string(),
            "read -P 0x33 48M 1M".to_string(),
        ],
    );
    again.stop();
    let md = md_check(&members);
    assert_eq!(md.mismatch_cnt, 0, "md's check after the re-adds");
}
