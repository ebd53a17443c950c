//! A sub-sector write is a read-modify-write of its sector inside uraid; a whole-sector
//! write to the same sector sent right behind it must not be lost to the write-back of
//! the sector's older bytes.

mod common;

use common::*;

#[test]
fn a_whole_sector_write_behind_a_sub_sector_write_is_kept() {
    let dir = TempDir::new("subsector");
    let members: Vec<_> = (0..3).map(|i| dir.path(&format!("s{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--size", "16M", "--assume-clean"];
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let served = Served::start(&dir, &members, &[]);
    // Sent back to back on one connection, both in flight at once: first the 100 bytes in
    // the middle of a sector, then the whole sector.
    let sectors = 64u64;
    let mut cmds = Vec::new();
    for k in 0..sectors {
        let base = k * 8192;
        cmds.push(format!("aio_write -P 0x22 {} 100", base + 100));
        cmds.push(format!("aio_write -P 0x11 {base} 512"));
    }
    cmds.push("aio_flush".into());
    qemu_io(&served.url, &cmds);
    // Either order is a valid outcome; old bytes (zeroes) around the patch are not.
    let mut checks = Vec::new();
    for k in 0..sectors {
        let base = k * 8192;
        checks.push(format!("read -P 0x11 {base} 100"));
        checks.push(format!("read -P 0x11 {} 312", base + 200));
    }
    qemu_io(&served.url, &checks);
    served.stop();
}
