//! A raid5 grow md started and was stopped in the middle of (`mdadm --grow
//! --raid-devices=5` with no backup file: mdadm moves the data offset down, md records
//! `reshape_position`, `delta_disks`, `new_offset` and RESHAPE_ACTIVE). uraid assembles it,
//! maps each sector by its side of the reshape position, and reads back what md held
//! before the grow. The same both ways for raid5 to raid6 with a new member and for a
//! chunk change (md: forwards, the data offset moved down, the old chunk until the end).
//! Layout changes, raid5 to raid6 and takeovers uraid makes while serving, finished or
//! assembled by md.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use uraid_core::meta::{feature, plan_assembly, AssembleOptions, OfferedMember, Superblock};
use uraid_core::reshape::run::{continue_reshape, ReshapeMembers, ReshapeProgress, ReshapeRun};
use uraid_core::reshape::start::{start_grow, GrowMember};

/// A member's superblock wherever its version keeps it: 4 KiB in (1.2), or 8 to 12 KiB
/// before the end, 4 KiB aligned (1.0, md's `super_1_load`).
fn read_sb(p: &Path) -> Superblock {
    let b = std::fs::read(p).unwrap();
    if let Ok(sb) = Superblock::parse(&b[4096..8192], 8) {
        return sb;
    }
    let at = ((b.len() as u64 / 512 - 16) & !7) as usize;
    Superblock::parse(&b[at * 512..at * 512 + 4096], at as u64).unwrap()
}

/// Member images md left mid-grow, and what md said of the array before the grow.
struct MdGrow {
    images: Vec<PathBuf>,
    /// sha256 and bytes of the whole array before the grow (md's /dev/md0).
    sha_before: String,
    size_before: usize,
}

/// VM script lines: md makes a clean raid`level` of the first `n` disks (64 KiB chunk but raid1),
/// fills it with mdvm's pattern, and says its size and sha256.
fn md_make(level: u32, n: usize) -> String {
    md_make_with(level, n, "")
}

/// [`md_make`] with more of mdadm's `--create` options (`extra`).
fn md_make_with(level: u32, n: usize, extra: &str) -> String {
    let disks: Vec<String> = (0..n).map(|i| format!("/dev/vd{}", (b'a' + i as u8) as char)).collect();
    let chunk = if level == 1 { "" } else { "--chunk=64" };
    format!(
        "set -e\n\
         mdadm --create /dev/md0 --run --assume-clean --level={level} --raid-devices={n} {chunk} \
         --metadata=1.2 {extra} {}\n\
         size=$(blockdev --getsize64 /dev/md0)\necho \"=== size $size\"\n\
         mdvm-pattern -o /dev/md0 1 0 $size\nsync\n\
         echo \"=== sha $(sha256sum /dev/md0)\"\n",
        disks.join(" ")
    )
}

/// `n` 32 MiB member files in `dir`.
fn member_files(dir: &TempDir, n: usize) -> Vec<PathBuf> {
    let images: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("m{i}"))).collect();
    for p in &images {
        std::fs::File::create(p).unwrap().set_len(32 << 20).unwrap();
    }
    images
}

/// Runs `script` in the md VM on `images`; its output and the value of `=== KEY value`.
fn md_run(dir: &TempDir, script: &str, images: &[PathBuf]) -> (String, impl Fn(&str) -> String) {
    let path = dir.path("script.sh");
    std::fs::write(&path, script).unwrap();
    script_fields(md_vm(&path, images, false))
}

/// A VM script's output, asserted to have succeeded, and the value of its `=== KEY value`.
fn script_fields(o: std::process::Output) -> (String, impl Fn(&str) -> String) {
    let out = text(&o);
    assert!(o.status.success(), "the md VM script failed:\n{out}");
    let text = out.clone();
    let field = move |key: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("=== {key} ")))
            .unwrap_or_else(|| panic!("no {key}:\n{text}"))
            .trim()
            .to_string()
    };
    (out, field)
}

/// md in the VM: a raid5 of the four `images` made by `md_make` and stopped; its size in
/// bytes and the sha256 of its contents.
fn md_made(dir: &TempDir, images: &[PathBuf]) -> (usize, String) {
    let (_, field) = md_run(dir, &format!("{}mdadm --stop /dev/md0\n", md_make(5, 4)), images);
    (field("size").parse().unwrap(), field("sha").split_whitespace().next().unwrap().to_string())
}

/// md's reshape let run to array sector 8192 at least, then frozen (the position echoed
/// as `=== position`).
const MD_FREEZE_MID_RESHAPE: &str = "i=0\n\
     while [ $i -lt 120 ]; do p=$(cat /sys/block/md0/md/reshape_position); \
     [ \"$p\" != none ] && [ \"$p\" -ge 8192 ] && break; sleep 1; i=$((i+1)); done\n\
     echo frozen > /sys/block/md0/md/sync_action\n\
     echo \"=== position $(cat /sys/block/md0/md/reshape_position)\"\n";

/// md in the VM: a raid`level` of `n` members made by `md_make`, one more member
/// added, the grow to `n + 1` started throttled and frozen partway.
fn md_mid_grow(dir: &TempDir, level: u32, n: usize) -> MdGrow {
    md_mid_grow_with(dir, level, n, "")
}

/// [`md_mid_grow`] of an array made with more of mdadm's `--create` options (`extra`).
fn md_mid_grow_with(dir: &TempDir, level: u32, n: usize, extra: &str) -> MdGrow {
    let images = member_files(dir, n + 1);
    let new = format!("/dev/vd{}", (b'a' + n as u8) as char);
    let script = format!(
        "{}mdadm --add /dev/md0 {new}\n\
         echo 1 > /proc/sys/dev/raid/speed_limit_min\n\
         echo 200 > /proc/sys/dev/raid/speed_limit_max\n\
         mdadm --grow /dev/md0 --raid-devices={}\n\
         {MD_FREEZE_MID_RESHAPE}mdadm --stop /dev/md0\n",
        md_make_with(level, n, extra),
        n + 1
    );
    let (_, field) = md_run(dir, &script, &images);
    let size_before = field("size").parse().unwrap();
    let sha_before = field("sha").split_whitespace().next().unwrap().to_string();
    MdGrow { images, sha_before, size_before }
}

#[test]
fn uraid_reads_an_array_md_left_mid_grow_as_md_held_it_before() {
    let dir = TempDir::new("mdgrow");
    let md = md_mid_grow(&dir, 5, 4);
    // What md left on disk: the reshape fields uraid maps by.
    let sb = read_sb(&md.images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.has(feature::NEW_OFFSET), "{sb:?}");
    assert_eq!((sb.raid_disks, sb.delta_disks), (5, 1), "raid_disks is the new count");
    assert!(sb.new_offset < 0, "mdadm moves the data offset down for a grow: {}", sb.new_offset);
    assert!(
        sb.reshape_position > 0 && sb.reshape_position < md.size_before as u64 / 512,
        "md stopped partway: {}",
        sb.reshape_position
    );
    let sums: Vec<String> = md.images.iter().map(|p| sha256_file(p)).collect();

    let served = Served::start(&dir, &md.images, &["--read-only"]);
    assert!(served.log_text().contains("reshape from 4 to 5 members"), "{}", served.log_text());
    let data = read_array(&dir, &served.url);
    served.stop();
    assert_eq!(data.len(), md.size_before, "md serves the old size until the reshape ends");
    assert_eq!(sha256_bytes(&data), md.sha_before, "the array reads back as md held it before the grow");
    let after: Vec<String> = md.images.iter().map(|p| sha256_file(p)).collect();
    assert_eq!(sums, after, "a read-only start writes nothing");

    // Writable: uraid goes on with md's reshape while it serves, and md's check agrees.
    let served = Served::start(&dir, &md.images, &[]);
    wait_reshaped(&served);
    let data = read_array(&dir, &served.url);
    served.stop();
    assert_eq!(data.len(), md.size_before / 3 * 4, "the new size once the reshape is done");
    assert_eq!(sha256_bytes(&data[..md.size_before]), md.sha_before, "the original extent is unchanged");
    let (sha, size, mismatch, out) = md_after(&dir, &md.images, md.size_before);
    assert_eq!(sha, md.sha_before, "md reads what uraid served:\n{out}");
    assert_eq!(size as usize, md.size_before / 3 * 4, "{out}");
    assert_eq!(mismatch, 0, "md's check after uraid finished md's reshape online:\n{out}");
}

/// uraid serves `images` (throttled), starts `uraid grow --control S <grow>`, and is stopped
/// 3 s later: the superblock of the first member, which records a checkpointed reshape.
fn reshape_while_serving_then_stop(dir: &TempDir, images: &[PathBuf], grow: &[&str]) -> Superblock {
    let served = Served::start(dir, images, &["--sync-speed-max", "1000"]);
    let c = served.control.display().to_string();
    ok(uraid(&[&["grow", "--control", &c][..], grow].concat()), "uraid grow");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let st = served.ctl("status", None);
    assert!(st.contains("reshape ="), "the reshape runs:\n{st}");
    served.stop();
    let sb = read_sb(&images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE), "stopped mid-way: {sb:?}");
    assert!(sb.reshape_position > 0, "windows were checkpointed: {sb:?}");
    sb
}

/// (a) of the issue, online: uraid starts a grow while it serves (`uraid grow --control`)
/// and is stopped mid-way; md assembles the members, finishes the reshape, and the data
/// and md's check agree.
#[test]
fn md_finishes_a_grow_uraid_started_while_serving() {
    let dir = TempDir::new("uraidgrow-online");
    let images = member_files(&dir, 5);
    let (size_before, sha_before) = md_made(&dir, &images[..4]);

    let grow = ["--raid-devices", "5", "--add", images[4].to_str().unwrap()];
    reshape_while_serving_then_stop(&dir, &images[..4], &grow);
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "md finished the grow uraid started while serving:\n{out}");
    assert_eq!(size as usize, size_before / 3 * 4, "{out}");
    assert_eq!(mismatch, 0, "{out}");
}

#[test]
fn md_finishes_a_chunk_change_uraid_started_while_serving() {
    let dir = TempDir::new("uraidchunk-online");
    let images = member_files(&dir, 4);
    let (size_before, sha_before) = md_made(&dir, &images);

    let sb = reshape_while_serving_then_stop(&dir, &images, &["--chunk", "32"]);
    assert_eq!((sb.chunksize, sb.new_chunk, sb.delta_disks), (128, 64, 0), "{sb:?}");
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "md finished the chunk change uraid started while serving:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains("Chunk Size : 32K"), "{out}");
}

/// The member files as `continue_reshape` reaches them: sector-addressed, fsync'ed.
struct Files(Vec<std::fs::File>);

impl ReshapeMembers for Files {
    fn read(&mut self, member: usize, device_sector: u64, len_sectors: u64) -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; (len_sectors * 512) as usize];
        self.0[member].read_exact_at(&mut b, device_sector * 512)?;
        Ok(b)
    }
    fn write(&mut self, member: usize, device_sector: u64, data: &[u8]) -> std::io::Result<()> {
        self.0[member].write_all_at(data, device_sector * 512)
    }
    fn flush(&mut self, member: usize) -> std::io::Result<()> {
        self.0[member].sync_data()
    }
}

/// uraid continues the reshape md left in `images` (offline), for at most `max_windows`.
fn uraid_continue(images: &[PathBuf], max_windows: Option<usize>) -> ReshapeProgress {
    let offered: Vec<OfferedMember> = images
        .iter()
        .enumerate()
        .map(|(i, p)| OfferedMember {
            name: format!("m{i}"),
            dev_sectors: std::fs::metadata(p).unwrap().len() / 512,
            superblock: Ok(read_sb(p)),
            bitmap: None,
        })
        .collect();
    let plan = plan_assembly(&offered, &AssembleOptions::default()).unwrap();
    let reshape = plan.reshape.clone().expect("a reshape in progress");
    let mut superblocks: Vec<Superblock> =
        plan.slots.iter().map(|s| offered[s.as_ref().unwrap().member].superblock.clone().unwrap()).collect();
    let files = plan
        .slots
        .iter()
        .map(|s| {
            let p = &images[s.as_ref().unwrap().member];
            std::fs::OpenOptions::new().read(true).write(true).open(p).unwrap()
        })
        .collect();
    let mut run = ReshapeRun::new(reshape).unwrap();
    // Small windows so a few of them stop partway.
    continue_reshape(&mut run, &mut superblocks, &mut Files(files), 2048, max_windows, 1_800_000_000).unwrap()
}

/// md in the VM on `images`: assembles, lets any reshape finish, then the sha256 of the
/// first `len` bytes, the size, and `mismatch_cnt` after md's own check.
/// A raid0 has no sync_action (see `md_assembles_a_raid0`): called on one, this fails on
/// its missing fields at once instead of waiting out the VM's limit.
fn md_after(dir: &TempDir, images: &[PathBuf], len: usize) -> (String, u64, u64, String) {
    let script = format!(
        "mdadm --examine /dev/vda\nmdadm --assemble /dev/md0 /dev/vd? || exit 3\n\
         cat /proc/mdstat\n\
         [ -e /sys/block/md0/md/sync_action ] || echo '=== no sync_action (a raid0?)'\n\
         i=0; while [ -e /sys/block/md0/md/sync_action ] && [ $i -lt 300 ]; do \
         [ \"$(cat /sys/block/md0/md/reshape_position)\" = none ] && \
         grep -q idle /sys/block/md0/md/sync_action && break; sleep 1; i=$((i+1)); done\n\
         echo \"=== reshape $(cat /sys/block/md0/md/reshape_position)\"\n\
         echo \"=== size $(blockdev --getsize64 /dev/md0)\"\n\
         echo \"=== sha $(head -c {len} /dev/md0 | sha256sum)\"\n\
         echo check > /sys/block/md0/md/sync_action\nsleep 1\n\
         i=0; while [ -e /sys/block/md0/md/sync_action ] && ! grep -q idle /sys/block/md0/md/sync_action \
         && [ $i -lt 300 ]; do sleep 1; i=$((i+1)); done\n\
         echo \"=== mismatch $(cat /sys/block/md0/md/mismatch_cnt)\"\n\
         mdadm --detail /dev/md0\nmdadm --stop /dev/md0\n"
    );
    let (out, field) = md_run(dir, &script, images);
    assert_eq!(field("reshape"), "none", "md finished no reshape:\n{out}");
    let sha = field("sha").split_whitespace().next().unwrap().to_string();
    (sha, field("size").parse().unwrap(), field("mismatch").parse().unwrap(), out)
}

#[test]
fn uraid_finishes_a_grow_md_started_and_md_finishes_one_uraid_continued() {
    let dir = TempDir::new("mdgrow-continue");
    let md = md_mid_grow(&dir, 5, 4);
    let position = read_sb(&md.images[0]).reshape_position;

    // (a) uraid moves a few windows from md's checkpoint and stops; md takes over.
    let partial = TempDir::new("mdgrow-partial");
    let copies: Vec<PathBuf> = md
        .images
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let c = partial.path(&format!("m{i}"));
            std::fs::copy(p, &c).unwrap();
            c
        })
        .collect();
    let got = uraid_continue(&copies, Some(3));
    let ReshapeProgress::Checkpointed { position_sectors } = got else { panic!("{got:?}") };
    assert!(position_sectors > position, "uraid moved windows: {position} -> {position_sectors}");
    assert_eq!(read_sb(&copies[4]).reshape_position, position_sectors, "the checkpoint is on disk");
    let (sha, _, mismatch, out) = md_after(&partial, &copies, md.size_before);
    assert_eq!(sha, md.sha_before, "md finished uraid's checkpoint with the data intact:\n{out}");
    assert_eq!(mismatch, 0, "{out}");

    // (b) uraid finishes the reshape md started; md assembles the result.
    assert_eq!(uraid_continue(&md.images, None), ReshapeProgress::Finished);
    let sb = read_sb(&md.images[0]);
    assert!(!sb.has(feature::RESHAPE_ACTIVE) && !sb.has(feature::NEW_OFFSET), "{sb:?}");
    assert_eq!(sb.data_offset, 1536, "data starts at the moved offset");
    let (sha, size, mismatch, out) = md_after(&dir, &md.images, md.size_before);
    assert_eq!(sha, md.sha_before, "the original extent is unchanged:\n{out}");
    assert_eq!(size as usize, md.size_before / 3 * 4, "the array grew by a member's worth:\n{out}");
    assert_eq!(mismatch, 0, "md's check finds the new parity consistent:\n{out}");
}

#[test]
fn uraid_starts_a_grow_as_mdadm_does_and_md_finishes_it() {
    let dir = TempDir::new("uraidgrow");
    let images = member_files(&dir, 5);
    let (size_before, sha_before) = md_made(&dir, &images[..4]);

    let old: Vec<Superblock> = images[..4].iter().map(|p| read_sb(p)).collect();
    let new = GrowMember { dev_sectors: (32 << 20) / 512, device_uuid: [0x5a; 16], dev_number: None };
    let (superblocks, geo) = start_grow(&old, &[new], 1_800_000_000).unwrap();
    assert_eq!(superblocks[0].new_offset, -512, "mdadm's offset change for 4 to 5 members");
    assert_eq!((geo.previous.raid_disks, geo.next.raid_disks), (4, 5));
    // The new member first, as start_grow asks.
    for (p, sb) in images.iter().zip(&superblocks).rev() {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(&sb.clone().update_csum(), sb.super_offset * 512).unwrap();
        f.sync_data().unwrap();
    }
    // uraid moves the first windows, then md assembles what uraid left and finishes it.
    let got = uraid_continue(&images, Some(3));
    assert!(
        matches!(got, ReshapeProgress::Checkpointed { position_sectors } if position_sectors > 0),
        "{got:?}"
    );
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "md finished the grow uraid started with the data intact:\n{out}");
    assert_eq!(size as usize, size_before / 3 * 4, "{out}");
    assert_eq!(mismatch, 0, "{out}");
}

#[test]
fn uraid_finishes_a_raid6_grow_md_started() {
    let dir = TempDir::new("mdgrow6");
    let md = md_mid_grow(&dir, 6, 5);
    let sb = read_sb(&md.images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.reshape_position > 0, "md stopped partway: {sb:?}");
    assert_eq!((sb.level, sb.raid_disks, sb.delta_disks), (6, 6, 1));
    // The CLI's `uraid grow --continue` (mdadm --grow --continue) on the members md left.
    let o = uraid(&[&["grow", "--continue"][..], &paths(&md.images)].concat());
    assert!(text(&o).contains("reshape from 5 to 6 members done"), "{}", ok(o, "uraid grow --continue"));
    let (sha, size, mismatch, out) = md_after(&dir, &md.images, md.size_before);
    assert_eq!(sha, md.sha_before, "the original extent is unchanged:\n{out}");
    assert_eq!(size as usize, md.size_before / 3 * 4, "{out}");
    assert_eq!(mismatch, 0, "md's check finds P and Q consistent:\n{out}");
}

/// md in the VM: a raid5 of 4 made by `md_make` on the first 4 of `images`, then
/// `mdadm --grow` with `grow` (e.g. `--level=6 --raid-devices=5 --add /dev/vde`), held at
/// `sync_max` (3072 member sectors: 9216 array sectors) and stopped once md checkpointed
/// there. Not `frozen` mid-way: md 6.1 then leaves a same-member restripe with new rows
/// written over old ones above the recorded `reshape_position`, which md itself (and
/// uraid, which follows it) restarts from with that stretch lost.
fn md_mid_restripe(dir: &TempDir, images: &[PathBuf], grow: &str) -> (String, usize) {
    let script = format!(
        "{}echo 1 > /proc/sys/dev/raid/speed_limit_min\n\
         echo 100 > /proc/sys/dev/raid/speed_limit_max\n\
         echo 3072 > /sys/block/md0/md/sync_max\n\
         mdadm --grow /dev/md0 {grow}\n\
         echo 3072 > /sys/block/md0/md/sync_max || true\n\
         cat /sys/block/md0/md/sync_max\n\
         i=0\n\
         while [ $i -lt 240 ]; do p=$(cat /sys/block/md0/md/reshape_position); \
         [ \"$p\" != none ] && [ \"$p\" -ge 9216 ] && break; sleep 1; i=$((i+1)); done\n\
         echo \"=== position $(cat /sys/block/md0/md/reshape_position)\"\n\
         mdadm --stop /dev/md0\n",
        md_make(5, 4)
    );
    let (_, field) = md_run(dir, &script, images);
    (field("sha").split_whitespace().next().unwrap().to_string(), field("size").parse().unwrap())
}

fn copies(images: &[PathBuf], into: &TempDir) -> Vec<PathBuf> {
    images
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let c = into.path(&format!("m{i}"));
            std::fs::copy(p, &c).unwrap();
            c
        })
        .collect()
}

#[test]
fn md_raid5_to_raid6_is_continued_by_uraid_both_ways() {
    let dir = TempDir::new("md5to6");
    let images = member_files(&dir, 5);
    let (sha_before, size_before) =
        md_mid_restripe(&dir, &images, "--level=6 --raid-devices=5 --add /dev/vde");
    // What md left: raid5's takeover as raid6 left-symmetric-6, reshaping to left-symmetric
    // with the same 5 slots, the new member recovered by the reshape.
    let sb = read_sb(&images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.has(feature::NEW_OFFSET), "{sb:?}");
    assert_eq!((sb.level, sb.layout, sb.new_level, sb.new_layout), (6, 18, 6, 2), "{sb:?}");
    assert_eq!((sb.raid_disks, sb.delta_disks, sb.new_offset), (5, 0, -1024), "{sb:?}");
    let q = read_sb(&images[4]);
    assert!(q.has(feature::RECOVERY_OFFSET), "{q:?}");
    assert_eq!(q.recovery_offset, sb.reshape_position / 3, "md recovers the Q member with the reshape");

    // (a) uraid moves a few windows from md's checkpoint and stops; md finishes.
    let partial = TempDir::new("md5to6-partial");
    let part = copies(&images, &partial);
    let got = uraid_continue(&part, Some(3));
    let ReshapeProgress::Checkpointed { position_sectors } = got else { panic!("{got:?}") };
    assert!(position_sectors > sb.reshape_position, "{position_sectors}");
    assert_eq!(read_sb(&part[4]).recovery_offset, position_sectors / 3, "uraid moves it as md does");
    let (sha, size, mismatch, out) = md_after(&partial, &part, size_before);
    assert_eq!(sha, sha_before, "md finished uraid's checkpoint with the data intact:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains("raid6") && out.contains("left-symmetric"), "{out}");

    // (b) `uraid grow --continue` finishes what md started; md checks P and Q.
    let o = uraid(&[&["grow", "--continue"][..], &paths(&images)].concat());
    assert!(text(&o).contains("reshape to raid6 of 5 members"), "{}", ok(o, "uraid grow --continue"));
    let sb = read_sb(&images[4]);
    assert!(!sb.has(feature::RESHAPE_ACTIVE) && !sb.has(feature::RECOVERY_OFFSET), "{sb:?}");
    assert_eq!((sb.level, sb.layout, sb.data_offset), (6, 2, 1024), "{sb:?}");
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "md's check finds P and Q consistent:\n{out}");
}

#[test]
fn uraid_raid5_to_raid6_is_finished_by_md_or_by_uraid() {
    let dir = TempDir::new("uraid5to6");
    let images = member_files(&dir, 5);
    let (size_before, sha_before) = md_made(&dir, &images[..4]);
    let grow = |extra: &[&str]| {
        let add = ["--level", "6", "--add", images[4].to_str().unwrap()];
        uraid(&[&["grow"][..], &add, extra, &paths(&images[..4])].concat())
    };
    // Stopped after 3 windows as a kill -9 would leave it.
    let o = grow(&["--debug-stop-after-windows", "3"]);
    assert!(!o.status.success(), "{}", text(&o));
    let sb = read_sb(&images[0]);
    // The superblocks md writes for the same grow (md_raid5_to_raid6_is_continued_by_uraid_both_ways).
    assert_eq!((sb.level, sb.layout, sb.new_level, sb.new_layout), (6, 18, 6, 2), "{sb:?}");
    assert_eq!((sb.raid_disks, sb.delta_disks, sb.new_offset), (5, 0, -1024), "{sb:?}");
    assert!(sb.reshape_position > 0, "{sb:?}");
    assert_eq!(read_sb(&images[4]).recovery_offset, sb.reshape_position / 3);

    // md finishes a copy of what uraid left.
    let partial = TempDir::new("uraid5to6-partial");
    let part = copies(&images, &partial);
    let (sha, size, mismatch, out) = md_after(&partial, &part, size_before);
    assert_eq!(sha, sha_before, "md finished uraid's raid5 to raid6 with the data intact:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");

    // uraid finishes the original; md assembles the raid6 and checks it.
    ok(uraid(&[&["grow", "--continue"][..], &paths(&images)].concat()), "uraid grow --continue");
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains("raid6"), "{out}");
}

/// md starts the restripe `grow` (mdadm's option) on a raid5 of four and is stopped
/// mid-way, forwards with the data offset moved down; `recorded` checks the rest of what
/// it left. (a) uraid moves a few windows from md's checkpoint and stops; md finishes. (b)
/// `uraid grow --continue` finishes what md started, saying `said`; md's detail then says
/// `detail`.
fn md_restripe_is_continued_by_uraid_both_ways(
    tag: &str,
    grow: &str,
    recorded: impl Fn(&Superblock),
    said: &str,
    detail: &str,
) {
    let dir = TempDir::new(tag);
    let images = member_files(&dir, 4);
    let (sha_before, size_before) = md_mid_restripe(&dir, &images, grow);
    let sb = read_sb(&images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && !sb.has(feature::RESHAPE_BACKWARDS), "{sb:?}");
    assert_eq!((sb.delta_disks, sb.new_offset), (0, -1024), "{sb:?}");
    recorded(&sb);

    let partial = TempDir::new(&format!("{tag}-partial"));
    let part = copies(&images, &partial);
    let got = uraid_continue(&part, Some(3));
    let ReshapeProgress::Checkpointed { position_sectors } = got else { panic!("{got:?}") };
    assert!(position_sectors > sb.reshape_position, "{position_sectors}");
    let (sha, size, mismatch, out) = md_after(&partial, &part, size_before);
    assert_eq!(sha, sha_before, "md finished uraid's checkpoint with the data intact:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");

    let o = uraid(&[&["grow", "--continue"][..], &paths(&images)].concat());
    assert!(text(&o).contains(said), "{}", ok(o, "uraid grow --continue"));
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains(detail), "{out}");
}

#[test]
fn md_chunk_change_is_continued_by_uraid_both_ways() {
    // The old chunk until the end.
    let recorded = |sb: &Superblock| assert_eq!((sb.chunksize, sb.new_chunk), (128, 256), "{sb:?}");
    md_restripe_is_continued_by_uraid_both_ways(
        "mdchunk",
        "--chunk=128",
        recorded,
        "128K chunk",
        "Chunk Size : 128K",
    );
}

#[test]
fn uraid_chunk_change_is_finished_by_md_or_by_uraid() {
    let dir = TempDir::new("uraidchunk");
    let images = member_files(&dir, 4);
    let (size_before, sha_before) = md_made(&dir, &images);
    let grow = |extra: &[&str]| uraid(&[&["grow", "--chunk", "32"][..], extra, &paths(&images)].concat());
    let o = grow(&["--debug-stop-after-windows", "3"]);
    assert!(!o.status.success(), "{}", text(&o));
    let sb = read_sb(&images[0]);
    assert_eq!((sb.chunksize, sb.new_chunk, sb.delta_disks), (128, 64, 0), "{sb:?}");
    assert!(sb.reshape_position > 0 && sb.new_offset < 0, "{sb:?}");

    let partial = TempDir::new("uraidchunk-partial");
    let part = copies(&images, &partial);
    let (sha, size, mismatch, out) = md_after(&partial, &part, size_before);
    assert_eq!(sha, sha_before, "md finished uraid's chunk change with the data intact:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");

    ok(uraid(&[&["grow", "--continue"][..], &paths(&images)].concat()), "uraid grow --continue");
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains("Chunk Size : 32K"), "{out}");
}

#[test]
fn md_layout_change_is_continued_by_uraid_both_ways() {
    // left-symmetric (2) until the end, right-asymmetric (1) from the start, the chunk kept.
    let recorded = |sb: &Superblock| {
        assert_eq!((sb.layout, sb.new_layout, sb.chunksize, sb.new_chunk), (2, 1, 128, 128), "{sb:?}")
    };
    md_restripe_is_continued_by_uraid_both_ways(
        "mdlayout",
        "--layout=right-asymmetric",
        recorded,
        "right-asymmetric",
        "Layout : right-asymmetric",
    );
}

/// The same layout change started by uraid while it serves, stopped mid-way: the
/// superblocks say what md's say for it, and md finishes it. Then a chunk and a layout
/// change in one (`--chunk 128 --layout right-asymmetric`: md's own superblocks for it
/// in the VM say layout 2 to 1, chunk 128 to 256 sectors, new_offset -1024, as here).
#[test]
fn md_finishes_a_layout_change_uraid_started_while_serving() {
    for (grow, new_chunk) in [
        (&["--layout", "right-asymmetric"][..], 128u32),
        (&["--chunk", "128", "--layout", "right-asymmetric"][..], 256),
    ] {
        let dir = TempDir::new("uraidlayout-online");
        let images = member_files(&dir, 4);
        let (size_before, sha_before) = md_made(&dir, &images);

        let sb = reshape_while_serving_then_stop(&dir, &images, grow);
        assert_eq!((sb.layout, sb.new_layout, sb.chunksize, sb.new_chunk), (2, 1, 128, new_chunk), "{sb:?}");
        assert_eq!((sb.delta_disks, sb.new_offset), (0, -1024), "{sb:?}");
        let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
        assert_eq!(sha, sha_before, "md finished the {grow:?} uraid started while serving:\n{out}");
        assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
        assert!(out.contains("Layout : right-asymmetric"), "{out}");
        assert!(out.contains(&format!("Chunk Size : {}K", new_chunk / 2)), "{out}");
    }
}

/// raid5 to raid6 started by uraid while it serves, stopped mid-way: the superblocks say
/// what md's say for the same grow (`md_raid5_to_raid6_is_continued_by_uraid_both_ways`),
/// and md finishes it with P and Q consistent.
#[test]
fn md_finishes_a_raid5_to_raid6_uraid_started_while_serving() {
    let dir = TempDir::new("uraid5to6-online");
    let images = member_files(&dir, 5);
    let (size_before, sha_before) = md_made(&dir, &images[..4]);

    let grow = ["--level", "6", "--add", images[4].to_str().unwrap()];
    let sb = reshape_while_serving_then_stop(&dir, &images[..4], &grow);
    assert_eq!((sb.level, sb.layout, sb.new_level, sb.new_layout), (6, 18, 6, 2), "{sb:?}");
    assert_eq!((sb.raid_disks, sb.delta_disks, sb.new_offset), (5, 0, -1024), "{sb:?}");
    let q = read_sb(&images[4]);
    assert!(q.has(feature::RECOVERY_OFFSET), "{q:?}");
    assert_eq!(q.recovery_offset, q.reshape_position / 3, "{q:?}");
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "md finished the raid5 to raid6 uraid started while serving:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "md's check finds P and Q consistent:\n{out}");
    assert!(out.contains("raid6") && out.contains("left-symmetric"), "{out}");
}

/// md's takeovers made by uraid while serving (`uraid grow --control S --level ...`): a
/// raid1 of two md made becomes a raid5, a raid0 of three a raid4 whose parity slot a
/// member added afterwards is recovered into, a raid6 of five (restriped to
/// left-symmetric-6 first) a raid5 of four and a spare, a raid4 a raid5 (parity-last), a
/// raid5 of two a raid1, and a raid6 with an internal bitmap a raid5 keeping it; md
/// assembles each at its new level, reads what it held before, and its check is clean.
#[test]
fn md_assembles_the_levels_uraid_took_over_while_serving() {
    const BITMAP: &str = "--bitmap=internal --bitmap-chunk=64K";
    let cases = [
        (1u32, 2usize, "5", ""),
        (0, 3, "4", ""),
        (6, 5, "5", BITMAP),
        (4, 4, "5", ""),
        (5, 2, "1", ""),
        (0, 2, "10", ""),
    ];
    for (level, n, to, create) in cases {
        let dir = TempDir::new(&format!("takeover-{level}"));
        // Members added after the takeover: raid4's parity, raid10's mirrors.
        let extra = match (level, to) {
            (0, "4") => 1,
            (0, "10") => n,
            _ => 0,
        };
        let images = member_files(&dir, n + extra);
        let script = format!("{}mdadm --stop /dev/md0\n", md_make_with(level, n, create));
        let (_, field) = md_run(&dir, &script, &images[..n]);
        let size_before: usize = field("size").parse().unwrap();
        let sha_before = field("sha").split_whitespace().next().unwrap().to_string();

        let served = Served::start(&dir, &images[..n], &[]);
        let c = served.control.display().to_string();
        if level == 6 {
            // md's way from raid6: Q onto the last member (a restripe), then the takeover.
            ok(uraid(&["grow", "--control", &c, "--layout", "left-symmetric-6"]), "uraid grow --layout");
            wait_reshaped(&served);
        }
        let said = ok(uraid(&["grow", "--control", &c, "--level", to]), "uraid grow --level");
        assert!(said.contains("takeover"), "{said}");
        for new in &images[n..] {
            ok(uraid(&["add", new.to_str().unwrap(), "--control", &c]), "uraid add");
        }
        if extra > 0 {
            wait_whole(&served, n + extra);
        }
        let detail = ok(uraid(&["detail", "--control", &c]), "uraid detail");
        assert!(detail.contains(&format!("raid{to}")), "{detail}");
        served.stop();
        let sb = read_sb(&images[0]);
        assert_eq!(sb.level, to.parse::<i32>().unwrap(), "{sb:?}");

        let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
        assert_eq!(sha, sha_before, "raid{level} to raid{to}: md reads what it held before:\n{out}");
        assert_eq!((size as usize, mismatch), (size_before, 0), "raid{level} to raid{to}:\n{out}");
        assert!(out.contains(&format!("Raid Level : raid{to}")), "{out}");
        if level == 6 {
            assert!(out.contains("spare"), "md keeps the member Q was on as a spare:\n{out}");
        }
        if !create.is_empty() {
            assert!(out.contains("Intent Bitmap : Internal"), "the bitmap stays:\n{out}");
        }
    }
}

/// md's raid6_takeover made by uraid while serving (`mdadm --grow --level=6 --layout=preserve
/// --add NEW`): md's raid5 of four becomes a left-symmetric-6 raid6 of five with no
/// restripe, the new member recovered into the Q slot; md assembles it (as md's own:
/// level 6, layout 18, raid_disks 5), reads what the raid5 held, and its check is clean.
#[test]
fn md_assembles_the_raid6_uraid_took_over_from_a_raid5_with_q_added() {
    let dir = TempDir::new("takeover-raid5-raid6");
    let images = member_files(&dir, 5);
    let (size_before, sha_before) = md_made(&dir, &images[..4]);

    let served = Served::start(&dir, &images[..4], &[]);
    let c = served.control.display().to_string();
    let new = images[4].to_str().unwrap();
    let said = ok(
        uraid(&["grow", "--control", &c, "--level", "6", "--layout", "preserve", "--add", new]),
        "uraid grow --level 6 --layout preserve",
    );
    assert!(said.contains("takeover"), "{said}");
    wait_whole(&served, 5);
    served.stop();
    let sb = read_sb(&images[4]);
    assert_eq!((sb.level, sb.layout, sb.raid_disks, sb.slot()), (6, 18, 5, Some(4)), "as md's: {sb:?}");

    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "md reads what the raid5 held:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains("Raid Level : raid6") && out.contains("left-symmetric-6"), "{out}");
}

/// md's raid0_takeover_raid1 made by uraid while serving, as mdadm's users run it: md's
/// raid1 of two served, slot 0's member failed and removed, `uraid grow --level 0`
/// (refused before the removal); md assembles the raid0 of one from the member left, with
/// the size and contents the raid1 had.
#[test]
fn md_assembles_the_raid0_uraid_took_over_from_a_raid1_down_to_one_mirror() {
    let dir = TempDir::new("takeover-raid1-raid0");
    let images = member_files(&dir, 2);
    let (_, field) = md_run(&dir, &format!("{}mdadm --stop /dev/md0\n", md_make(1, 2)), &images);
    let size_before: usize = field("size").parse().unwrap();
    let sha_before = field("sha").split_whitespace().next().unwrap().to_string();

    let served = Served::start(&dir, &images, &[]);
    let c = served.control.display().to_string();
    let o = uraid(&["grow", "--control", &c, "--level", "0"]);
    assert!(!o.status.success() && text(&o).contains("one mirror is left"), "{}", text(&o));
    served.ctl("fail", Some(&images[0]));
    served.ctl("remove", Some(&images[0]));
    let said = ok(uraid(&["grow", "--control", &c, "--level", "0"]), "uraid grow --level 0");
    assert!(said.contains("takeover"), "{said}");
    let detail = ok(uraid(&["detail", "--control", &c]), "uraid detail");
    assert!(detail.contains("raid0"), "{detail}");
    served.stop();
    let sb = read_sb(&images[1]);
    assert_eq!((sb.level, sb.raid_disks, sb.chunksize, sb.slot()), (0, 1, 128, Some(0)), "as md's: {sb:?}");
    assert_eq!(sb.dev_number, 1, "the member keeps its number, as md's: {sb:?}");

    md_assembles_a_raid0(&dir, &images[1..], (size_before, &sha_before), size_before);
}

/// A raid0 grow by a member made by uraid while serving (mdadm's way: raid4 with its parity
/// slot empty, grown with the new member in the old parity slot, back to raid0), md's
/// raid0 of three to start: (a) stopped inside the raid4 reshape, the superblocks are what
/// md writes for its own (`mdadm --grow -n 4 --add` on a raid0), and md assembles them,
/// finishes the reshape and reads what it held; (b) run to the end, md assembles the
/// raid0 of four uraid left.
#[test]
fn md_takes_a_raid0_grow_uraid_made_while_serving_midway_and_done() {
    let dir = TempDir::new("raid0grow-online");
    let images = member_files(&dir, 4);
    let script = format!("{}mdadm --stop /dev/md0\n", md_make(0, 3));
    let (_, field) = md_run(&dir, &script, &images[..3]);
    let size_before: usize = field("size").parse().unwrap();
    let sha_before = field("sha").split_whitespace().next().unwrap().to_string();
    let fresh = TempDir::new("raid0grow-online-done");
    let copies: Vec<PathBuf> =
        images.iter().map(|p| fresh.path(p.file_name().unwrap().to_str().unwrap())).collect();
    for (a, b) in images.iter().zip(&copies) {
        std::fs::copy(a, b).unwrap();
    }

    // (a) Stopped mid-way.
    let grow = ["--raid-devices", "4", "--add", images[3].to_str().unwrap()];
    let sb = reshape_while_serving_then_stop(&dir, &images[..3], &grow);
    assert_eq!((sb.level, sb.layout, sb.raid_disks, sb.delta_disks), (4, 5, 5, 1), "as md's: {sb:?}");
    assert_eq!((sb.new_level, sb.new_layout, sb.new_offset), (4, 5, -512), "as md's: {sb:?}");
    let new = read_sb(&images[3]);
    assert_eq!(new.slot(), Some(3), "the new member in the old parity slot: {new:?}");
    assert!(new.has(feature::RECOVERY_OFFSET) && new.recovery_offset >= new.reshape_position / 4, "{new:?}");
    let (sha, size, _, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "md finished the raid4 reshape of uraid's raid0 grow:\n{out}");
    assert_eq!(size as usize, size_before / 3 * 4, "{out}");
    assert!(out.contains("raid4"), "{out}");

    // (b) To the end: md's raid0 of four.
    let served = Served::start(&fresh, &copies[..3], &[]);
    let c = served.control.display().to_string();
    let said = ok(
        uraid(&["grow", "--control", &c, "--raid-devices", "4", "--add", copies[3].to_str().unwrap()]),
        "uraid grow",
    );
    assert!(said.contains("by way of raid4"), "{said}");
    let t0 = std::time::Instant::now();
    while !served.log_text().contains("raid0 grow done") {
        assert!(t0.elapsed() < std::time::Duration::from_secs(120), "{}", served.log_text());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    served.stop();
    md_assembles_a_raid0_of_four(&fresh, &copies, size_before, &sha_before);
}

/// VM script lines that end the VM without md's stop: `sync`, the script's exit status
/// written where the VM's init would write it, and the power cut. md 6.1 hung in its own
/// `mdadm --stop` of a frozen raid0 grow (mdadm and md0_resync blocked) in 4 of 5 runs on
/// 2026-11-28; its freeze has written the superblocks already (docs/reliability.md).
const MD_POWER_OFF: &str = "sleep 2\nsync\necho 0 > /dev/ttyS2\nsync\npoweroff -f\n";

/// md's own raid0 grow (`mdadm --grow -n 4 --add`, through raid4) frozen mid-way and the
/// power cut: md's freeze fails the member being recovered into the old parity slot, so
/// neither md nor uraid assembles it again without `--force`; with `--force` uraid takes
/// the member back as mdadm does, finishes the raid4 reshape while serving, and `--level 0`
/// ends the grow; md assembles the raid0 of four with what the raid0 of three held.
#[test]
fn md_raid0_grow_stopped_mid_way_is_finished_by_uraid() {
    let dir = TempDir::new("mdraid0grow");
    let images = member_files(&dir, 4);
    let script = format!(
        "{}echo 1 > /proc/sys/dev/raid/speed_limit_min\n\
         echo 200 > /proc/sys/dev/raid/speed_limit_max\n\
         mdadm --grow /dev/md0 --raid-devices=4 --add /dev/vdd\n\
         {MD_FREEZE_MID_RESHAPE}{MD_POWER_OFF}",
        md_make(0, 3)
    );
    let (out, field) = md_run(&dir, &script, &images);
    let size_before: usize = field("size").parse().unwrap();
    let sha_before = field("sha").split_whitespace().next().unwrap().to_string();
    let sb = read_sb(&images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.level == 4 && sb.raid_disks == 5, "{sb:?}\n{out}");

    // Bounded: a serve that started would not return.
    let o = bounded(
        URAID,
        &[
            "serve",
            "--run",
            "--unix",
            dir.path("x.sock").to_str().unwrap(),
            images[0].to_str().unwrap(),
            images[1].to_str().unwrap(),
            images[2].to_str().unwrap(),
            images[3].to_str().unwrap(),
        ],
        std::time::Duration::from_secs(60),
    );
    assert!(!o.status.success() && text(&o).contains("--force"), "as md, not without --force: {}", text(&o));
    let served = Served::start(&dir, &images, &["--force", "--run"]);
    let t0 = std::time::Instant::now();
    while !served.log_text().contains("reshape done") {
        assert!(t0.elapsed() < std::time::Duration::from_secs(120), "{}", served.log_text());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let c = served.control.display().to_string();
    let said = ok(uraid(&["grow", "--control", &c, "--level", "0"]), "uraid grow --level 0");
    assert!(said.contains("takeover"), "{said}");
    let t0 = std::time::Instant::now();
    while !ok(uraid(&["detail", "--control", &c]), "uraid detail").contains("Raid Level : raid0") {
        assert!(t0.elapsed() < std::time::Duration::from_secs(30));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let got = read_array(&dir, &served.url);
    assert_eq!(sha256_bytes(&got[..size_before]), sha_before, "uraid finished md's raid0 grow");
    served.stop();

    md_assembles_a_raid0_of_four(&dir, &images, size_before, &sha_before);
}

/// md in the VM assembles `images` as the raid0 of four a raid0 of three grew into: a
/// member's worth larger, its first `size_before` bytes what the three held.
fn md_assembles_a_raid0_of_four(dir: &TempDir, images: &[PathBuf], size_before: usize, sha_before: &str) {
    md_assembles_a_raid0(dir, images, (size_before, sha_before), size_before / 3 * 4);
}

/// md assembles the raid0 on `images` (all of them its members), `size_bytes` large, whose
/// first `before.0` bytes hash to `before.1`. (No check: md's raid0 has no sync_action.)
fn md_assembles_a_raid0(dir: &TempDir, images: &[PathBuf], before: (usize, &str), size_bytes: usize) {
    let (len, sha_before) = before;
    let script = format!(
        "mdadm --assemble /dev/md0 /dev/vd? || exit 3\ncat /proc/mdstat\n\
         echo \"=== size $(blockdev --getsize64 /dev/md0)\"\n\
         echo \"=== sha $(head -c {len} /dev/md0 | sha256sum)\"\n\
         mdadm --detail /dev/md0\nmdadm --stop /dev/md0\n"
    );
    let (out, field) = md_run(dir, &script, images);
    assert_eq!(field("sha").split_whitespace().next().unwrap(), sha_before, "{out}");
    assert_eq!(field("size").parse::<usize>().unwrap(), size_bytes, "{out}");
    let members = format!("Raid Devices : {}", images.len());
    assert!(out.contains("Raid Level : raid0") && out.contains(&members), "{out}");
}

/// An internal bitmap through a grow, both ways. (a) md's grow of an array with a bitmap,
/// frozen mid-way: uraid goes on with it while serving a write, and md reads what uraid
/// served. (b) uraid's grow of such an array while serving, a write in it, stopped
/// mid-way: md finishes it. The bitmap stays on the members; md's check finds nothing.
#[test]
fn a_grow_with_an_internal_bitmap_is_carried_on_by_either_side() {
    const BITMAP: &str = "--bitmap=internal --bitmap-chunk=64K";
    let dir = TempDir::new("bitmap-grow-md");
    let md = md_mid_grow_with(&dir, 5, 4, BITMAP);
    let sb = read_sb(&md.images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.bitmap_sector().is_some(), "{sb:?}");
    let served = Served::start(&dir, &md.images, &[]);
    qemu_io(&served.url, &["write -P 0x5a 1M 1M".to_string()]);
    wait_reshaped(&served);
    let data = read_array(&dir, &served.url);
    served.stop();
    assert!(data[1 << 20..2 << 20].iter().all(|&b| b == 0x5a), "the write while reshaping");
    let (sha, size, mismatch, out) = md_after(&dir, &md.images, md.size_before);
    assert_eq!(sha, sha256_bytes(&data[..md.size_before]), "md reads what uraid served:\n{out}");
    assert_eq!((size as usize, mismatch), (md.size_before / 3 * 4, 0), "{out}");
    assert!(out.contains("Intent Bitmap : Internal"), "the bitmap stays:\n{out}");

    let dir = TempDir::new("bitmap-grow-uraid");
    let images = member_files(&dir, 5);
    let (_, field) =
        md_run(&dir, &format!("{}mdadm --stop /dev/md0\n", md_make_with(5, 4, BITMAP)), &images[..4]);
    let size_before: usize = field("size").parse().unwrap();
    let served = Served::start(&dir, &images[..4], &["--sync-speed-max", "1000"]);
    let c = served.control.display().to_string();
    ok(
        uraid(&["grow", "--control", &c, "--raid-devices", "5", "--add", images[4].to_str().unwrap()]),
        "uraid grow",
    );
    std::thread::sleep(std::time::Duration::from_secs(1));
    qemu_io(
        &served.url,
        &["write -P 0xa5 0 1M".to_string(), format!("write -P 0x3c {} 1M", size_before - (1 << 20))],
    );
    let data = read_array(&dir, &served.url);
    let st = served.ctl("status", None);
    assert!(st.contains("reshape ="), "the reshape runs:\n{st}");
    served.stop();
    let sb = read_sb(&images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.bitmap_sector().is_some(), "stopped mid-way: {sb:?}");
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha256_bytes(&data[..size_before]), "md finished uraid's grow with the writes:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before / 3 * 4, 0), "{out}");
    assert!(out.contains("Intent Bitmap : Internal"), "the bitmap stays:\n{out}");
}

/// VM script lines: md makes a clean raid5 of four with the 1.0 superblock (at the end,
/// data at 0) and a component size 4 MiB short of the 32 MiB members, fills it and says its
/// size and sha256: a restripe then has room only after the data and runs backwards.
fn md_make_room_after() -> String {
    md_make_with(5, 4, "--size=28M").replace("--metadata=1.2", "--metadata=1.0")
}

/// md restripes backwards (a 1.0 array: the data offset moves up, RESHAPE_BACKWARDS, from
/// the array's end down) and is stopped mid-way; uraid moves a few windows on and md
/// finishes, and `uraid grow --continue` finishes md's. Then the other way: uraid starts a
/// backwards restripe on an array md made, stops; md finishes it, and so does uraid.
#[test]
fn a_backwards_restripe_is_continued_by_uraid_and_by_md() {
    let dir = TempDir::new("mdbackwards");
    let images = member_files(&dir, 4);
    // md held at sync_max (3072 sectors of each member moved: md counts a backwards
    // reshape's progress up from 0), as md_mid_restripe holds a forwards one. Frozen
    // (`sync_action` frozen) mid-way instead, md's own members were seen to come back with
    // data md itself then finished wrongly (6.1 kernel, mdadm 4.2, 2 runs in 8).
    let script = format!(
        "{}echo 1 > /proc/sys/dev/raid/speed_limit_min\n\
         echo 2000 > /proc/sys/dev/raid/speed_limit_max\n\
         echo 3072 > /sys/block/md0/md/sync_max\n\
         mdadm --grow /dev/md0 --chunk=128\n\
         echo 3072 > /sys/block/md0/md/sync_max || true\n\
         i=0\n\
         while [ $i -lt 240 ]; do p=$(cat /sys/block/md0/md/reshape_position); \
         [ \"$p\" != none ] && [ \"$p\" -le 162816 ] && break; sleep 1; i=$((i+1)); done\n\
         echo \"=== position $(cat /sys/block/md0/md/reshape_position)\"\n\
         mdadm --stop /dev/md0\n",
        md_make_room_after()
    );
    let (out, field) = md_run(&dir, &script, &images);
    let size_before: usize = field("size").parse().unwrap();
    let sha_before = field("sha").split_whitespace().next().unwrap().to_string();
    let sb = read_sb(&images[0]);
    let end = size_before as u64 / 512;
    assert!(
        sb.has(feature::RESHAPE_ACTIVE) && sb.has(feature::RESHAPE_BACKWARDS) && sb.has(feature::NEW_OFFSET),
        "md's backwards restripe:\n{out}\n{sb:?}"
    );
    assert!(sb.data_offset == 0 && sb.new_offset > 0, "the data moves up: {sb:?}");
    assert!(sb.reshape_position > 0 && sb.reshape_position < end, "md stopped mid-way: {sb:?}");

    // (a) uraid moves a few windows down from md's checkpoint and stops; md finishes.
    let partial = TempDir::new("mdbackwards-partial");
    let part = copies(&images, &partial);
    let got = uraid_continue(&part, Some(3));
    let ReshapeProgress::Checkpointed { position_sectors } = got else { panic!("{got:?}") };
    assert!(position_sectors < sb.reshape_position, "uraid moved windows down: {position_sectors}");
    assert_eq!(read_sb(&part[3]).reshape_position, position_sectors, "the checkpoint is on disk");
    let (sha, size, mismatch, out) = md_after(&partial, &part, size_before);
    assert_eq!(sha, sha_before, "md finished uraid's checkpoint with the data intact:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");

    // (b) `uraid grow --continue` finishes md's; md assembles and checks it.
    let o = uraid(&[&["grow", "--continue"][..], &paths(&images)].concat());
    assert!(text(&o).contains("128K chunk"), "{}", ok(o, "uraid grow --continue"));
    let sb = read_sb(&images[0]);
    assert!(!sb.has(feature::RESHAPE_ACTIVE) && sb.data_offset > 0, "{sb:?}");
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains("Chunk Size : 128K"), "{out}");

    // uraid starts one on an array md made (1.0, room after only): backwards as mdadm's.
    let dir = TempDir::new("uraidbackwards");
    let images = member_files(&dir, 4);
    let (out, field) = md_run(&dir, &format!("{}mdadm --stop /dev/md0\n", md_make_room_after()), &images);
    let size_before: usize = field("size").parse().unwrap();
    let sha_before = field("sha").split_whitespace().next().unwrap().to_string();
    let o = uraid(
        &[&["grow", "--layout", "right-asymmetric", "--debug-stop-after-windows", "3"][..], &paths(&images)]
            .concat(),
    );
    assert!(!o.status.success(), "{out}\n{}", text(&o));
    let sb = read_sb(&images[0]);
    assert!(sb.has(feature::RESHAPE_ACTIVE) && sb.has(feature::RESHAPE_BACKWARDS), "{sb:?}");
    assert!(sb.new_offset > 0 && sb.reshape_position > 0, "{sb:?}");
    assert!(sb.reshape_position < size_before as u64 / 512, "windows were moved: {sb:?}");
    let partial = TempDir::new("uraidbackwards-partial");
    let part = copies(&images, &partial);
    let (sha, size, mismatch, out) = md_after(&partial, &part, size_before);
    assert_eq!(sha, sha_before, "md finished uraid's backwards restripe with the data intact:\n{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains("Layout : right-asymmetric"), "{out}");
    ok(uraid(&[&["grow", "--continue"][..], &paths(&images)].concat()), "uraid grow --continue");
    let (sha, size, mismatch, out) = md_after(&dir, &images, size_before);
    assert_eq!(sha, sha_before, "{out}");
    assert_eq!((size as usize, mismatch), (size_before, 0), "{out}");
    assert!(out.contains("Layout : right-asymmetric"), "{out}");
}
