//! RAID5 with md's partial parity log (`--consistency-policy ppl`): create lays it out as
//! mdadm does; `serve` empties every member's log at start (as md does) and logs each
//! stripe write's partial parity; kill -9 in the middle of a stripe write on a degraded
//! array, and the restart replays the log: nothing acknowledged is lost and the data
//! nobody wrote reads back as it was, where without the log the same crash shows the
//! write hole. Real md replays a log uraid wrote, and uraid one md wrote.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use uraid_core::meta::{
    plan_assembly, ppl_area, ppl_recover, ppl_signature, read_member, AssembleOptions, MemberMetadata,
    PplEntry, PplHeader, Superblock, PPL_HEADER_SIZE,
};

const CHUNK: u64 = 64 << 10;

fn read_sb(p: &Path) -> Superblock {
    let b = std::fs::read(p).unwrap();
    Superblock::parse(&b[4096..8192], 8).unwrap()
}

fn ppl_header(p: &PathBuf) -> (PplHeader, Vec<u8>) {
    let sb = read_sb(p);
    let (start, sectors) = ppl_area(&sb).expect("a PPL area");
    let b = std::fs::read(p).unwrap();
    let area = b[(start * 512) as usize..((start + sectors) * 512) as usize].to_vec();
    (PplHeader::parse(&area, Some(ppl_signature(&sb.set_uuid))).unwrap(), area)
}

fn read_region(dir: &TempDir, url: &str, len: usize) -> Vec<u8> {
    let out = dir.path("image");
    let o = tool("nbdcopy", &[url, out.to_str().unwrap()]);
    assert!(o.status.success(), "nbdcopy: {}", text(&o));
    let mut data = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    data.truncate(len);
    data
}

fn bytes_at(p: &Path, at: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open(p).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, at).unwrap();
    b
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// mdvm's test pattern (`../shared/tools/mdvm/README.md`): the bytes of `seed` at array
/// bytes [at, at+len), 8-byte aligned.
fn mdvm_pattern(seed: u64, at: u64, len: usize) -> Vec<u8> {
    let splitmix = |x: u64| {
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..len as u64 / 8).flat_map(|w| splitmix(seed ^ ((at / 8) + w)).to_le_bytes()).collect()
}

#[test]
fn a_ppl_array_is_created_as_mdadm_does_served_with_its_logs_emptied_and_md_assembles_it() {
    let dir = TempDir::new("ppl");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("m{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--chunk", "64", "--size", "16M"];
    args.extend(["--assume-clean", "--consistency-policy", "ppl", "--name", "ppl"]);
    args.extend(paths(&members));
    let out = ok(uraid(&args), "uraid create");
    assert!(out.contains("partial parity log (ppl)"), "{out}");
    let ex = ok(uraid(&["examine", &members[0].display().to_string()]), "uraid examine");
    assert_eq!(mdadm_field(&ex, "PPL").as_deref(), Some("2048 sectors at offset 8 sectors from superblock"));
    assert_eq!(mdadm_field(&ex, "Data Offset").as_deref(), Some("4096 sectors"));
    assert!(ppl_header(&members[2]).0.entries.is_empty(), "create writes an empty log");

    // A log as md leaves it after a run: one entry with its partial parity. It belongs to
    // no run of uraid's, so it must be gone before anything is written.
    let sb = read_sb(&members[2]);
    let (start, _) = ppl_area(&sb).unwrap();
    let pp = vec![0x5a; 4096];
    let stale = PplHeader {
        signature: ppl_signature(&sb.set_uuid),
        generation: 7,
        entries: vec![PplEntry {
            data_sector: 16,
            pp_size: 4096,
            data_size: 4096,
            parity_disk: 2,
            checksum: uraid_core::meta::crc32c(&pp),
        }],
    };
    let mut bytes = std::fs::read(&members[2]).unwrap();
    let at = (start * 512) as usize;
    bytes[at..at + PPL_HEADER_SIZE].copy_from_slice(&stale.serialize().unwrap());
    bytes[at + PPL_HEADER_SIZE..at + 2 * PPL_HEADER_SIZE].copy_from_slice(&pp);
    std::fs::write(&members[2], &bytes).unwrap();
    assert_eq!(ppl_header(&members[2]).0.entries.len(), 1);

    let served = Served::start(&dir, &members, &[]);
    for m in &members {
        let (h, area) = ppl_header(m);
        assert!(h.entries.is_empty() && h.generation == 0, "{}: the log is emptied at start", m.display());
        assert!(
            area[PPL_HEADER_SIZE..].iter().all(|&b| b == 0),
            "{}: no old partial parity is left",
            m.display()
        );
    }
    // A 4 KiB write into stripe 0 (parity on slot 2) is logged there first.
    qemu_io(&served.url, &["write -P 0x3c 8192 4096".to_string()]);
    served.stop();
    let (h, area) = ppl_header(&members[2]);
    assert_eq!(h.generation, 1, "the run's first log write");
    assert_eq!(
        h.entries,
        vec![PplEntry {
            data_sector: 16,
            pp_size: 4096,
            data_size: 4096,
            parity_disk: 2,
            checksum: uraid_core::meta::crc32c(&[0; 4096]),
        }],
        "md's entry for a 4 KiB write at array byte 8192 (the fixture in uraid-core/tests/meta_ppl.rs)"
    );
    assert!(area[PPL_HEADER_SIZE..2 * PPL_HEADER_SIZE].iter().all(|&b| b == 0), "partial parity of zeroes");
    let ex = ok(uraid(&["examine", &members[0].display().to_string()]), "uraid examine");
    assert!(
        ex.contains("Feature Map : 0x800"),
        "md's MULTIPLE_PPLS for a 1 MiB area, as md records it:\n{ex}"
    );

    let md = md_check(&members);
    assert_eq!(md.mismatch_cnt, 0, "md's check on the PPL array uraid made and served");
}

/// What the degraded crash left: the members, the region as it must read back (`want`),
/// where the torn write went, and the region as uraid reads it after its restart.
struct Crash {
    dir: TempDir,
    members: Vec<PathBuf>,
    crashed: Vec<PathBuf>,
    want: Vec<u8>,
    torn_at: usize,
    restarted: Vec<u8>,
    log: String,
}

const REGION: usize = 1 << 20;
const TORN: u8 = 0x5c;

/// A RAID5 of 3 (64 KiB chunks) filled with a pattern, then served degraded (slot 2
/// gone). Some writes are acknowledged; then a 4 KiB write into stripe 1's data index 1
/// (slot 0), whose parity is on slot 1 and whose data index 0 was on slot 2: its data
/// lands, its parity write is held back (`--debug-fault ...,hold`), and the server is
/// killed with -9 right then. Restarted with `--run --force`.
fn crash_degraded(ppl: bool) -> Crash {
    let dir = TempDir::new(if ppl { "pplcrash" } else { "nopplcrash" });
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("c{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--chunk", "64", "--size", "16M"];
    args.extend(["--assume-clean", "--name", "crash"]);
    args.extend(if ppl { ["--consistency-policy", "ppl"] } else { ["--bitmap", "none"] });
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let ex = ok(uraid(&["examine", members[0].to_str().unwrap()]), "uraid examine");
    let data_offset: u64 =
        mdadm_field(&ex, "Data Offset").unwrap().split(' ').next().unwrap().parse::<u64>().unwrap() * 512;

    let before = mdvm_pattern(21, 0, REGION);
    let src = dir.path("before");
    std::fs::write(&src, &before).unwrap();
    let served = Served::start(&dir, &members, &[]);
    let o = bounded("nbdcopy", &["--flush", src.to_str().unwrap(), &served.url], Duration::from_secs(30));
    assert!(o.status.success(), "nbdcopy in: {}", text(&o));
    served.stop();

    // Slot 2 is gone. While `gate` exists, slot 1's first write into the data area is held.
    let two = &members[..2];
    let gate = dir.path("gate");
    let rule = format!("member=1,op=write,from={data_offset},when={},hold", gate.display());
    let served = Served::start(&dir, two, &["--run", "--debug-fault", &rule]);
    let mut want = before.clone();
    // Acknowledged: rows of the torn stripe, a stripe whose parity is the missing member,
    // a partial stripe of two members, a full stripe.
    let acked: [(u64, u64, u8); 5] = [
        (3 * CHUNK + 32768, 4096, 0x11),
        (4 * CHUNK + 4096, 8192, 0x22),
        (6 * CHUNK + 61440, 8192, 0x33),
        (8 * CHUNK, 2 * CHUNK, 0x44),
        (10 * CHUNK + 512, 1024, 0x55),
    ];
    let cmds: Vec<String> = acked.iter().map(|&(at, len, p)| format!("write -P {p:#x} {at} {len}")).collect();
    qemu_io(&served.url, &cmds);
    for &(at, len, p) in &acked {
        want[at as usize..(at + len) as usize].fill(p);
    }
    let torn_at = (3 * CHUNK + 8192) as usize;
    std::fs::write(&gate, b"").unwrap();
    let mut writer = Command::new("qemu-io")
        .args(["-f", "raw", "-c", &format!("write -P {TORN:#x} {torn_at} 4096"), &served.url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("qemu-io");
    let member_at = data_offset + CHUNK + 8192;
    let t0 = Instant::now();
    while bytes_at(&members[0], member_at, 4096) != [TORN; 4096] {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the torn write's data never landed:\n{}",
            served.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut server = served;
    let mut child = server.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = writer.kill();
    let _ = writer.wait();
    drop(server);
    // The premise: slot 1 still holds the old parity of that row.
    let old_parity = xor(&before[torn_at - CHUNK as usize..][..4096], &before[torn_at..][..4096]);
    assert_eq!(bytes_at(&members[1], member_at, 4096), old_parity, "the held parity write landed anyway");

    let crashed: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("crashed{i}"))).collect();
    for (m, c) in members.iter().zip(&crashed) {
        std::fs::copy(m, c).unwrap();
    }
    let again = Served::start(&dir, two, &["--run", "--force"]);
    let restarted = read_region(&dir, &again.url, REGION);
    let log = again.stop();
    Crash { dir, members, crashed, want, torn_at, restarted, log }
}

/// The must-show of issue 14: kill -9 during writes on a degraded RAID5 with PPL, restart
/// with --force: every acknowledged write reads back and the data nobody wrote in the torn
/// stripe is unchanged. Real md, handed the members as the crash left them, replays
/// uraid's log and reads the same bytes.
#[test]
fn a_crash_on_a_degraded_raid5_with_ppl_loses_nothing_and_md_replays_uraids_log() {
    let c = crash_degraded(true);
    assert!(c.log.contains("partial parity log replayed"), "{}", c.log);
    assert!(c.log.contains("no resync needed"), "{}", c.log);
    let torn = c.torn_at..c.torn_at + 4096;
    let got = &c.restarted;
    assert!(got[torn.clone()] == [TORN; 4096] || got[torn.clone()] == c.want[torn.clone()]);
    let mut want = c.want.clone();
    want[torn.clone()].copy_from_slice(&got[torn.clone()]);
    let first_bad = (0..REGION).find(|&i| got[i] != want[i]);
    assert_eq!(first_bad, None, "after the replay the array reads back wrong from this byte on");

    // md on the members as kill -9 left them (dirty, degraded, with uraid's log).
    let script = c.dir.path("md-ppl.sh");
    std::fs::write(
        &script,
        format!(
            "mdadm --assemble --run /dev/md0 /dev/vda /dev/vdb 2>&1\ncat /proc/mdstat\n\
             echo '=== sha256'\ndd if=/dev/md0 bs=1M count={} 2>/dev/null | sha256sum | cut -d' ' -f1\n\
             dmesg | grep -i 'md/raid' | tail -n 5\nmdadm --stop /dev/md0\n",
            REGION >> 20
        ),
    )
    .unwrap();
    let o = md_vm(&script, &c.crashed, true);
    let out = text(&o);
    let sha = out.lines().skip_while(|l| l.trim() != "=== sha256").nth(1).map(str::trim);
    assert_eq!(sha, Some(sha256_bytes(got).as_str()), "md's replay of uraid's log reads other bytes:\n{out}");
    assert!(out.contains("dirty degraded array with PPL"), "{out}");
    drop(c.members);
}

/// The same crash without a log: md's write hole. The data nobody wrote in the torn stripe
/// (slot 2's block of that row) is rebuilt from parity that never saw the new data.
#[test]
fn without_ppl_the_same_crash_shows_the_write_hole() {
    let c = crash_degraded(false);
    assert!(c.log.contains("forced"), "{}", c.log);
    let got = &c.restarted;
    let never_written = c.torn_at - CHUNK as usize..c.torn_at - CHUNK as usize + 4096;
    assert_ne!(got[never_written.clone()], c.want[never_written], "the write hole did not show");
    // Everything else, acknowledged writes included, reads back.
    let torn = c.torn_at..c.torn_at + 4096;
    let hole = c.torn_at - CHUNK as usize..c.torn_at - CHUNK as usize + 4096;
    let bad: Vec<usize> = (0..REGION)
        .filter(|&i| got[i] != c.want[i] && !torn.contains(&i) && !hole.contains(&i))
        .take(1)
        .collect();
    assert!(bad.is_empty(), "bytes outside the torn row changed: first at {bad:?}");
}

fn metadata(p: &Path) -> MemberMetadata {
    let f = std::fs::File::open(p).unwrap();
    let size = f.metadata().unwrap().len();
    read_member(&p.display().to_string(), size / 512, &mut |off, len| {
        let mut b = vec![0u8; len];
        let n = f.read_at(&mut b, off).unwrap_or(0);
        b.truncate(n);
        b
    })
}

/// md writes the log: a RAID5 of 4 with PPL, filled with mdvm's pattern, then two writes
/// (72 KiB over two data members of stripe 0, 4 KiB into stripe 2) and a stop. Made dirty
/// and with the parity those writes' newest log entries name undone (as a crash between
/// data and parity leaves them), the array is served without slot 2, which neither write
/// touched: uraid replays md's log and every byte reads as md wrote it.
#[test]
fn uraid_replays_a_log_md_wrote() {
    let dir = TempDir::new("mdppl");
    let images: Vec<PathBuf> = (0..4).map(|i| dir.path(&format!("v{i}"))).collect();
    for p in &images {
        std::fs::write(p, vec![0u8; 16 << 20]).unwrap();
    }
    let b_at = 56 << 10;
    let a_at = 2 * 3 * CHUNK + CHUNK + (12 << 10);
    let script = dir.path("create.sh");
    std::fs::write(
        &script,
        format!(
            "set -e\nmdadm --create /dev/md0 --run --level=5 --raid-devices=4 --chunk=64 --metadata=1.2 \
             --assume-clean --consistency-policy=ppl /dev/vda /dev/vdb /dev/vdc /dev/vdd\n\
             size=$(blockdev --getsize64 /dev/md0)\necho \"=== size $size\"\n\
             mdvm-pattern -o /dev/md0 -d 11 0 $size\nsync\n\
             mdvm-pattern -o /dev/md0 -d 12 {b_at} 73728\nmdvm-pattern -o /dev/md0 -d 13 {a_at} 4096\n\
             mdadm --stop /dev/md0\n"
        ),
    )
    .unwrap();
    let o = md_vm(&script, &images, false);
    let out = text(&o);
    assert!(o.status.success(), "md could not make the array:\n{out}");
    let size: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("=== size "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no size:\n{out}"));
    let mut want = mdvm_pattern(11, 0, size);
    want[b_at as usize..b_at as usize + 73728].copy_from_slice(&mdvm_pattern(12, b_at, 73728));
    want[a_at as usize..a_at as usize + 4096].copy_from_slice(&mdvm_pattern(13, a_at, 4096));

    // As a crash would leave it: dirty.
    for p in &images {
        let mut sb = read_sb(p);
        sb.resync_offset = 0;
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(&sb.update_csum(), 4096).unwrap();
    }
    let keys = [0usize, 1, 3];
    let metas: Vec<MemberMetadata> = keys.iter().map(|&k| metadata(&images[k])).collect();
    let offered: Vec<_> = metas.iter().map(|m| m.offered.clone()).collect();
    let plan = plan_assembly(&offered, &AssembleOptions { run: true, uuid: None, force: false }).unwrap();
    let sbs: Vec<Superblock> = offered.iter().map(|o| o.superblock.clone().unwrap()).collect();
    let rec = ppl_recover(&plan, &sbs, &mut |m, off, len| Ok(bytes_at(&images[keys[m]], off, len))).unwrap();
    assert_eq!(rec.mismatch_count, 0, "{rec:?}");
    // Stripe 0 has its parity on slot 3, stripe 2 on slot 1 (left-symmetric): their newest
    // logs name the rows of the two writes, and nothing else.
    let data_offset = sbs[0].data_offset * 512;
    let in_b = |off: u64| (data_offset..data_offset + CHUNK).contains(&off);
    let a_row = data_offset + 2 * CHUNK + (12 << 10);
    let on = |slot: usize| rec.writes.iter().filter(move |w| w.slot == slot);
    assert!(on(3).count() > 0 && on(3).all(|w| in_b(w.offset_bytes)), "{rec:?}");
    assert!(on(1).count() == 1 && on(1).all(|w| w.offset_bytes == a_row && w.bytes.len() == 4096), "{rec:?}");
    // Undo those parity writes, as a crash between data and parity leaves them.
    for w in rec.writes.iter().filter(|w| w.slot == 1 || w.slot == 3) {
        let f = std::fs::OpenOptions::new().write(true).open(&images[w.slot]).unwrap();
        f.write_all_at(&vec![0u8; w.bytes.len()], w.offset_bytes).unwrap();
    }

    let three: Vec<PathBuf> = keys.iter().map(|&k| images[k].clone()).collect();
    // Read-only, nothing is replayed (nothing may be written): slot 2's data of those rows
    // is rebuilt from the undone parity.
    let ro = Served::start(&dir, &three, &["--run", "--read-only"]);
    let unreplayed = read_region(&dir, &ro.url, size);
    ro.stop();
    assert!(unreplayed != want, "the undone parity leaves nothing to recover: the test shows nothing");
    eprintln!("md's newest logs named {} parity rows to rewrite", rec.writes.len());
    let served = Served::start(&dir, &three, &["--run"]);
    let got = read_region(&dir, &served.url, size);
    let log = served.stop();
    assert!(log.contains("partial parity log replayed"), "{log}");
    let first_bad = (0..size).find(|&i| got[i] != want[i]);
    assert_eq!(first_bad, None, "uraid's replay of md's log reads back wrong from this byte on:\n{log}");
}
