//! Real NBD clients against the server: qemu-io, qemu-img, nbdinfo, nbdcopy.
//! A missing tool fails the test with a message naming the package to install.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use uraid_nbd::{Export, FileDevice, MemDevice, Server, ServerOptions};

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let base = std::env::var_os("TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let p = base.join(format!("uraid-nbd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// (offset, len) pairs: aligned, unaligned, straddling 4 KiB and 64 KiB boundaries,
/// tiny and large, up to the export's last byte.
fn io_cases(size_bytes: u64) -> Vec<(u64, u64)> {
    let mut v = vec![
        (0, 512),
        (512, 4096),
        (1, 1),
        (4095, 2),
        (65535, 3),
        (12345, 54321),
        (100_000, 1 << 20),
        (3 << 20, 4 << 20),
        (size_bytes - 1, 1),
        (size_bytes - 777, 777),
    ];
    let mut x = 0x1234_5678u64;
    for _ in 0..20 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let len = 1 + (x >> 40) % 300_000;
        let off = (x >> 8) % (size_bytes - len);
        v.push((off, len));
    }
    v
}

#[test]
fn qemu_io_patterns_at_many_offsets_and_sizes() {
    require_tool("qemu-io");
    let size_bytes = 16u64 << 20;
    let (dev, export) = mem_export(size_bytes as usize);
    let server = TestServer::start(vec![export], ServerOptions::default());
    let cases = io_cases(size_bytes);
    // Writes first (non-overlapping patterns would be ideal but later writes simply win,
    // so verify against a model), then one qemu-io run reads everything back.
    let mut model = vec![0u8; size_bytes as usize];
    let mut args: Vec<String> = Vec::new();
    for (i, (off, len)) in cases.iter().enumerate() {
        let byte = 0x10 + i as u8;
        args.push("-c".into());
        args.push(format!("write -P {byte:#x} {off} {len}"));
        model[*off as usize..(off + len) as usize].fill(byte);
    }
    run(Command::new("qemu-io").args(["-f", "raw"]).args(&args).arg(server.uri()));
    assert!(dev.snapshot() == model, "device contents differ from the qemu-io writes");
    // Read-verify only ranges whose final contents are one pattern.
    let mut verify: Vec<String> = Vec::new();
    for (off, len) in &cases {
        let range = &model[*off as usize..(off + len) as usize];
        if range.iter().all(|b| *b == range[0]) {
            verify.push("-c".into());
            verify.push(format!("read -P {:#x} {off} {len}", range[0]));
        }
    }
    assert!(verify.len() >= 20, "too few uniform ranges to verify");
    let out = run(Command::new("qemu-io").args(["-f", "raw"]).args(&verify).arg(server.uri()));
    assert!(!out.contains("Pattern verification failed"), "{out}");
    // A read that must fail verification proves qemu-io's check is live.
    let (off, len) = cases[0];
    let bad = model[off as usize].wrapping_add(1);
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", &format!("read -P {bad:#x} {off} {len}")])
        .arg(server.uri())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("Pattern verification failed"));
    // Write-zeroes and discard through qemu-io.
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -z 4096 8192", "-c", "discard 65536 65536"])
        .arg(server.uri()));
    let img = dev.snapshot();
    assert!(img[4096..12288].iter().all(|b| *b == 0));
}

#[test]
fn qemu_img_convert_256mib_round_trip() {
    require_tool("qemu-img");
    let tmp = TempDir::new("convert");
    let size_bytes = 256usize << 20;
    // Mostly data with some zero runs, so both data and zero paths are used.
    let mut src = vec![0u8; size_bytes];
    for (i, chunk) in src.chunks_mut(1 << 20).enumerate() {
        if i % 5 != 3 {
            chunk.copy_from_slice(&pattern(i as u64, 1 << 20));
        }
    }
    let src_path = tmp.0.join("src.raw");
    std::fs::write(&src_path, &src).unwrap();
    let dev = Arc::new(MemDevice::new(size_bytes));
    dev.fill(0, &vec![0x5a; size_bytes]); // stale data that zero runs must overwrite
    let server = TestServer::start(vec![Export::new("", dev.clone())], ServerOptions::default());
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src_path)
        .arg(server.uri()));
    assert!(dev.snapshot() == src, "export differs from the source after convert");
    let back = tmp.0.join("back.raw");
    run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw"]).arg(server.uri()).arg(&back));
    assert!(std::fs::read(&back).unwrap() == src, "image converted back differs");
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src_path)
        .arg(server.uri()));
}

#[test]
fn nbdinfo_reports_size_and_flags() {
    require_tool("nbdinfo");
    let rw = Arc::new(MemDevice::new(3 << 20));
    let ro = Arc::new(MemDevice::new(5 << 20).read_only(true));
    let mut second = Export::new("second", ro);
    second.description = "a read-only disk".into();
    let server = TestServer::start(vec![Export::new("first", rw), second], ServerOptions::default());

    let out = run(Command::new("nbdinfo").arg("--json").arg(format!("nbd://{}/first", server.addr)));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 3 << 20, "{out}");
    assert_eq!(e["is_read_only"], false, "{out}");
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_multi_conn",
        "can_cache",
        "can_df",
    ] {
        assert_eq!(e[flag], true, "{flag}: {out}");
    }
    assert_eq!(e["block_size_minimum"], 1, "{out}");
    assert_eq!(e["block_size_preferred"], 4096, "{out}");
    assert_eq!(e["block_size_maximum"], 32 << 20, "{out}");
    assert_eq!(v["protocol"], "newstyle-fixed", "{out}");

    let out = run(Command::new("nbdinfo").arg("--json").arg(format!("nbd://{}/second", server.addr)));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let e = &v["exports"][0];
    assert_eq!(e["export-size"], 5 << 20, "{out}");
    assert_eq!(e["is_read_only"], true, "{out}");
    assert_eq!(e["can_multi_conn"], true, "{out}");
    for flag in ["can_fua", "can_trim", "can_zero"] {
        assert_eq!(e[flag], false, "{flag}: {out}");
    }
    assert_eq!(e["description"], "a read-only disk", "{out}");

    let out = run(Command::new("nbdinfo").arg("--list").arg("--json").arg(format!("nbd://{}/", server.addr)));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<_> = v["exports"].as_array().unwrap().iter().map(|e| e["export-name"].clone()).collect();
    assert_eq!(names, ["first", "second"], "{out}");
}

#[test]
fn nbdcopy_round_trip_over_file_device_and_unix_socket() {
    require_tool("nbdcopy");
    require_tool("nbdinfo");
    let tmp = TempDir::new("nbdcopy");
    let size_bytes = 64usize << 20;
    let mut src = vec![0u8; size_bytes];
    for (i, chunk) in src.chunks_mut(256 << 10).enumerate() {
        if i % 7 != 2 {
            chunk.copy_from_slice(&pattern(i as u64 + 9, 256 << 10));
        }
    }
    let src_path = tmp.0.join("src.raw");
    std::fs::write(&src_path, &src).unwrap();
    let img_path = tmp.0.join("export.img");
    std::fs::write(&img_path, vec![0x77u8; size_bytes]).unwrap();
    let dev = Arc::new(FileDevice::open(&img_path, false, 4).unwrap());

    let sock = tmp.0.join("nbd.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let server = Server::new(vec![Export::new("", dev.clone())], ServerOptions::default()).unwrap();
    let stop = server.shutdown_handle();
    let serving = std::thread::spawn(move || server.serve_unix(listener));
    let uri = format!("nbd+unix:///?socket={}", sock.display());

    let out = run(Command::new("nbdinfo").arg("--json").arg(&uri));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["exports"][0]["export-size"], size_bytes as u64, "{out}");

    run(Command::new("nbdcopy").arg("--flush").arg(&src_path).arg(&uri));
    let back = tmp.0.join("back.raw");
    run(Command::new("nbdcopy").arg(&uri).arg(&back));
    assert!(std::fs::read(&back).unwrap() == src, "nbdcopy round trip differs");
    stop.shutdown();
    serving.join().unwrap().unwrap();
    drop(dev);
    assert!(std::fs::read(&img_path).unwrap() == src, "backing file differs");
}

#[test]
fn fio_nbd_engine_random_writes_verify_crc32c() {
    require_tool("fio");
    let (_dev, export) = mem_export(64 << 20);
    let server = TestServer::start(vec![export], ServerOptions::default());
    let out = run(Command::new("fio")
        .args(["--name=verify", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--iodepth=32", "--size=32M"])
        .args([
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .arg(format!("--uri={}", server.uri())));
    let json_start = out.find('{').unwrap_or(0);
    let v: serde_json::Value = serde_json::from_str(&out[json_start..]).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{out}");
    assert_eq!(job["write"]["io_bytes"], 32u64 << 20, "{out}");
    assert_eq!(job["read"]["io_bytes"], 32u64 << 20, "verify reads: {out}");
}
