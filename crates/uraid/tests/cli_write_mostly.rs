//! write-mostly and failfast round-trip through md's superblock both ways: uraid's flags
//! are what mdadm reads, md's are what uraid reads, and a served array avoids reading its
//! write-mostly member.

mod common;

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use common::*;

#[test]
fn write_mostly_and_failfast_round_trip_and_reads_avoid_the_member() {
    let dir = TempDir::new("wm");
    let members: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("w{i}"))).collect();
    let m1 = members[1].to_str().unwrap();
    let mut args = vec!["create", "--level", "1", "--raid-devices", "2", "--size", "16M", "--assume-clean"];
    args.extend(["--write-mostly", m1, "--failfast", m1]);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let ours = ok(uraid(&["examine", m1]), "uraid examine");
    assert_eq!(mdadm_field(&ours, "Flags").as_deref(), Some("write-mostly failfast"), "{ours}");
    let md = tool("mdadm", &["--examine", m1]);
    let md = text(&md);
    assert!(md.contains("write-mostly") && md.contains("failfast"), "mdadm does not see the flags:\n{md}");
    let first = ok(uraid(&["examine", members[0].to_str().unwrap()]), "uraid examine");
    assert_eq!(mdadm_field(&first, "Flags"), None, "{first}");

    // Served: the write-mostly copy is damaged behind uraid's back; no read may see it.
    let served = Served::start(&dir, &members, &["--balance", "round-robin"]);
    qemu_io(&served.url, &["write -P 0x2e 0 4M".to_string(), "flush".to_string()]);
    served.stop();
    let ex = ok(uraid(&["examine", m1]), "uraid examine");
    let off: u64 =
        mdadm_field(&ex, "Data Offset").unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&members[1]).unwrap();
    f.write_all_at(&vec![0u8; 4 << 20], off * 512).unwrap();
    let served = Served::start(&dir, &members, &["--balance", "round-robin"]);
    let reads: Vec<String> = (0..64).map(|k| format!("read -P 0x2e {} 65536", k * 65536)).collect();
    qemu_io(&served.url, &reads);
    served.stop();
}

#[test]
fn md_write_mostly_members_are_read_by_uraid() {
    let dir = TempDir::new("mdwm");
    let images: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("v{i}"))).collect();
    for p in &images {
        std::fs::write(p, vec![0u8; 32 << 20]).unwrap();
    }
    let script = dir.path("create.sh");
    std::fs::write(
        &script,
        "mdadm --create /dev/md0 --run --level=1 --raid-devices=2 --assume-clean --metadata=1.2 \
         /dev/vda --write-mostly /dev/vdb && mdadm --stop /dev/md0\n",
    )
    .unwrap();
    let o = md_vm(&script, &images, false);
    assert!(o.status.success(), "md could not create the array:\n{}", text(&o));
    let ex = ok(uraid(&["examine", images[1].to_str().unwrap()]), "uraid examine");
    assert_eq!(mdadm_field(&ex, "Flags").as_deref(), Some("write-mostly"), "{ex}");
}
