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
        .find(|d| d["raid_device"].as_u64() == Some(slot as u64))
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
    let msg = served.ctl("add", Some(&members[2]));
    assert!(msg.contains("re-added") && msg.contains("only the"), "not a bitmap re-add: {msg}");
    wait_idle(&served);
    // What the re-add wrote to it, from the member's I/O counts: the 1 MiB bitmap chunks
    // whose bits are still set (the 1 MiB written while it was away, and the 4 MiB before
    // it whose bits the daemon may not have cleared yet), a few MiB, not its 1 GiB. A device
    // back in a slot counts its I/O from when it joined.
    let rebuilt = slot_write_bytes(&served, 2);
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

/// md keeps a re-added device's bad-block log. A write fails on member 1 (`--debug-fault`)
/// and its range joins member 1's log; member 1 keeps the old bytes there. Failed, removed
/// and added back with nothing written meanwhile, it is in sync at once (the bitmap
/// rebuilds nothing): the range must stay listed, on disk too, and reads there come from
/// the others, as in md.
#[test]
fn a_re_added_member_keeps_its_bad_block_log_and_reads_never_come_from_it() {
    let dir = TempDir::new("readd-bb");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("b{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--size", "16M", "--chunk", "64K"];
    args.extend(["--assume-clean", "--bitmap", "internal", "--bitmap-chunk", "1M", "--name", "rb"]);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let m1 = members[1].display().to_string();
    let ex = ok(uraid(&["examine", &m1]), "uraid examine");
    let data_offset: u64 =
        mdadm_field(&ex, "Data Offset").unwrap().split(' ').next().unwrap().parse().unwrap();
    // Member 1's data writes fail while `armed` exists. Left-symmetric raid5 on 3 with
    // 64 KiB chunks: array bytes 64K..128K are member 1's first chunk.
    let armed = dir.path("armed");
    let rule = format!("member=1,op=write,from={},when={}", data_offset * 512, armed.display());
    let served = Served::start(&dir, &members, &["--debug-fault", &rule]);
    qemu_io(&served.url, &["write -P 0x33 0 1M".to_string(), "flush".to_string()]);
    std::fs::write(&armed, b"").unwrap();
    qemu_io(&served.url, &["write -P 0x77 64K 4K".to_string(), "flush".to_string()]);
    std::fs::remove_file(&armed).unwrap();
    let t0 = Instant::now();
    while !served.log_text().contains("recorded in its bad-block log") {
        assert!(t0.elapsed() < Duration::from_secs(15), "no bad block recorded:\n{}", served.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The clean stop clears the bitmap bits of writes that completed (md_bitmap_flush).
    served.stop();
    let listed_before = bad_blocks_on(&m1);
    assert!(!listed_before.is_empty(), "member 1's log is empty after the failed write");

    let again = Served::start(&dir, &members, &[]);
    again.ctl("fail", Some(&members[1]));
    again.ctl("remove", Some(&members[1]));
    let msg = again.ctl("add", Some(&members[1]));
    assert!(msg.contains("re-added") && msg.contains("only the 0 regions"), "not a bitmap re-add: {msg}");
    wait_idle(&again);
    // `add` returns once the superblocks record it: the log is back on the device.
    assert_eq!(bad_blocks_on(&m1), listed_before, "the log on the device after the re-add");
    let c = again.control.display().to_string();
    let detail = ok(uraid(&["detail", "--control", &c]), "uraid detail");
    assert!(detail.contains(&format!("Bad-blocks on {m1}:")), "the log was dropped at the re-add:\n{detail}");
    qemu_io(&again.url, &["read -P 0x77 64K 4K".to_string(), "read -P 0x33 68K 60K".to_string()]);
    let whole = read_array(&dir, &again.url);
    again.stop();
    // The read rebuilt the listed range from the others and wrote it back, which made it
    // good (md's R5_ReadError: no write has failed on the device since it joined).
    assert_eq!(bad_blocks_on(&m1), vec![], "the range rewritten by the read is still listed");
    let md = md_check(&members);
    assert_eq!(md.sha256, sha256_bytes(&whole), "md read other bytes");
}

/// The (sector, sectors) entries `uraid examine` lists for member `m`.
fn bad_blocks_on(m: &str) -> Vec<(u64, u64)> {
    let ex = ok(uraid(&["examine", m]), "uraid examine");
    ex.lines()
        .skip_while(|l| !l.trim().starts_with("Bad-blocks on"))
        .skip(1)
        .map_while(|l| {
            let (s, rest) = l.trim().split_once(" for ")?;
            Some((s.parse().ok()?, rest.strip_suffix(" sectors")?.parse().ok()?))
        })
        .collect()
}
