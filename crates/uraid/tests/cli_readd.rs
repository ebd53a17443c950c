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

/// Bytes written to the member in `slot` since the array started (`detail --json`).
fn slot_write_bytes(s: &Served, slot: usize) -> u64 {
    let c = s.control.display().to_string();
    let out = ok(uraid(&["detail", "--json", "--control", &c]), "uraid detail --json");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["raid_device"].as_str().and_then(|s| s.parse::<usize>().ok()) == Some(slot))
        .and_then(|d| d["io"]["write_bytes"].as_u64())
        .unwrap_or_else(|| panic!("no I/O counts for slot {slot}: {out}"))
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
        "1G",
        "--assume-clean",
        "--bitmap",
        "internal",
        "--bitmap-chunk",
        "1M",
    ];
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    // A first clean stop clears the bits create set (md_bitmap_flush), as md would.
    Served::start(&dir, &members, &[]).stop();
    let served = Served::start(&dir, &members, &[]);
    qemu_io(&served.url, &["write -P 0x11 0 4M".to_string(), "flush".to_string()]);
    // Away under a failure: 1 MiB written meanwhile, then added back.
    served.ctl("fail", Some(&members[2]));
    qemu_io(&served.url, &["write -P 0x22 32M 1M".to_string(), "flush".to_string()]);
    served.ctl("remove", Some(&members[2]));
    let before = slot_write_bytes(&served, 2);
    let msg = served.ctl("add", Some(&members[2]));
    assert!(msg.contains("re-added") && msg.contains("only the"), "not a bitmap re-add: {msg}");
    wait_idle(&served);
    // What the re-add wrote to it, from the member's I/O counts: the 1 MiB bitmap chunks
    // whose bits are still set (the 1 MiB written while it was away, and the 4 MiB before
    // it whose bits the daemon may not have cleared yet), a few MiB, not its 1 GiB.
    let rebuilt = slot_write_bytes(&served, 2) - before;
    eprintln!("re-add of a 1 GiB member after 1 MiB written while away: {rebuilt} bytes written to it");
    assert!(rebuilt > 0 && rebuilt <= 6 << 20, "the re-add wrote {rebuilt} bytes to the member ({msg})");
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
    assert_eq!(md_mismatch_cnt(&members), 0, "md's check after the re-adds");
}
