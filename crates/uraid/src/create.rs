//! `uraid create`: mdadm --create's options and defaults (superblock 1.2).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use clap::Args;
use uraid_core::geometry::parse_layout;
use uraid_core::meta::{
    create_array, devflags, enough, format_uuid, ppl_area, ppl_signature, CreateParams, PplHeader,
};
use uraid_core::Level;

use crate::array::member::MemberDev;
use crate::array::report::{human_bytes, level_name};
use crate::array::IoContext;
use crate::size_arg::parse_size_bytes;

#[derive(Args, Clone, Debug)]
pub struct CreateArgs {
    /// RAID level: 0, 1, 4, 5, 6, 10 (or raid5, mirror, stripe ...).
    #[arg(long, short = 'l')]
    pub level: String,
    /// Number of slots (members, `missing` included).
    #[arg(long = "raid-devices", short = 'n')]
    pub raid_devices: u32,
    /// Chunk size; a bare number is KiB as in mdadm (default 512K).
    #[arg(long, short = 'c')]
    pub chunk: Option<String>,
    /// md layout: left-symmetric, right-asymmetric, parity-last, n2, f2, o2 ...
    #[arg(long)]
    pub layout: Option<String>,
    /// Write-intent bitmap: internal or none.
    #[arg(long, default_value = "none")]
    pub bitmap: String,
    /// Bytes of array data one bitmap bit covers (mdadm's --bitmap-chunk; a bare number
    /// is KiB; default: as mdadm chooses from the room and the size).
    #[arg(long = "bitmap-chunk")]
    pub bitmap_chunk: Option<String>,
    /// What keeps a raid5's parity consistent after a crash: resync (md's default; a
    /// bitmap narrows it) or ppl (md's partial parity log, raid5 only, no bitmap).
    #[arg(long = "consistency-policy", value_name = "POLICY")]
    pub consistency_policy: Option<String>,
    /// Array name (stored as "homehost:name").
    #[arg(long = "name", short = 'N')]
    pub name: Option<String>,
    /// Members that do not exist yet are created as sparse files of this size; when all
    /// exist it is mdadm's --size (space used on each member). A bare number is KiB.
    #[arg(long, short = 'z')]
    pub size: Option<String>,
    /// The members are known to be in sync already: no initial resync or rebuild.
    #[arg(long = "assume-clean")]
    pub assume_clean: bool,
    /// Overwrite members that already hold an md superblock.
    #[arg(long, short = 'f')]
    pub force: bool,
    /// raid1/raid10: this member is write-mostly (reads avoid it while another copy can
    /// serve them: a slow or remote member). Repeatable; md's devflags, kept on disk.
    #[arg(long = "write-mostly", value_name = "MEMBER")]
    pub write_mostly: Vec<PathBuf>,
    /// raid1 with --bitmap internal: md's write-behind. Up to N writes may complete before
    /// their --write-mostly copies land (their bitmap bits stay until they do); kept in the
    /// bitmap superblock. mdadm's default N is 256.
    #[arg(long = "write-behind", value_name = "N", num_args = 0..=1, default_missing_value = "256")]
    pub write_behind: Option<u32>,
    /// raid1/raid10: md's failfast flag for this member, kept on disk. Repeatable.
    #[arg(long = "failfast", value_name = "MEMBER")]
    pub failfast: Vec<PathBuf>,
    /// Member files or block devices in slot order; `missing` for an absent one.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

/// mdadm's level names: 0, raid5, stripe, mirror ...
pub fn parse_level(text: &str) -> anyhow::Result<Level> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_prefix("raid").unwrap_or(&t);
    let n: i32 = match t {
        "stripe" => 0,
        "mirror" => 1,
        other => other.parse().map_err(|_| anyhow!("level {text:?}: use 0, 1, 4, 5, 6 or 10"))?,
    };
    Level::from_md_level(n).ok_or_else(|| anyhow!("level {text:?} is not supported (0, 1, 4, 5, 6, 10 are)"))
}

/// mdadm reads bare numbers for --chunk and --size as KiB.
pub(crate) fn parse_kib_default(text: &str) -> Result<u64, String> {
    if text.trim().chars().all(|c| c.is_ascii_digit()) {
        text.trim().parse::<u64>().map(|k| k * 1024).map_err(|e| format!("{text:?}: {e}"))
    } else {
        parse_size_bytes(text)
    }
}

pub fn is_missing(p: &Path) -> bool {
    p.as_os_str() == "missing"
}

pub fn run(args: CreateArgs) -> anyhow::Result<()> {
    let summary = create(&args)?;
    println!("{summary}");
    Ok(())
}

/// Creates the array; returns a one-paragraph summary.
pub fn create(args: &CreateArgs) -> anyhow::Result<String> {
    let level = parse_level(&args.level)?;
    if args.members.len() != args.raid_devices as usize {
        bail!(
            "{} members given for --raid-devices {}: give one per slot (use `missing` for an absent one)",
            args.members.len(),
            args.raid_devices
        );
    }
    let layout =
        args.layout.as_deref().map(|l| parse_layout(level, l).map_err(anyhow::Error::msg)).transpose()?;
    let chunk_kib = match &args.chunk {
        None => None,
        Some(c) => {
            let bytes = parse_kib_default(c).map_err(|e| anyhow!("--chunk: {e}"))?;
            if bytes % 1024 != 0 || bytes == 0 {
                bail!("--chunk {c}: must be a non-zero multiple of 1 KiB (md needs a power of two of at least 4K)");
            }
            Some((bytes / 1024) as u32)
        }
    };
    let bitmap = match args.bitmap.as_str() {
        "internal" => true,
        "none" => false,
        other => bail!("--bitmap {other:?}: use internal or none (external bitmaps are not supported)"),
    };
    let ppl = match args.consistency_policy.as_deref() {
        None | Some("resync") => false,
        Some("bitmap") if bitmap => false,
        Some("bitmap") => bail!("--consistency-policy bitmap needs --bitmap internal"),
        Some("ppl") => true,
        Some(other) => {
            bail!("--consistency-policy {other:?}: use resync, bitmap or ppl (journal is not supported)")
        }
    };
    let size_bytes =
        args.size.as_deref().map(|s| parse_kib_default(s).map_err(|e| anyhow!("--size: {e}"))).transpose()?;

    match args.write_behind {
        None | Some(0) => {}
        Some(_) if level.md_level() != 1 => bail!("--write-behind applies to raid1 only"),
        Some(_) if !bitmap => {
            bail!("--write-behind needs --bitmap internal (md: write-behind mode requires a bitmap)")
        }
        Some(n) if n > uraid_core::meta::bitmap::COUNTER_MAX => {
            bail!("--write-behind {n}: md's most is {}", uraid_core::meta::bitmap::COUNTER_MAX)
        }
        Some(_) => {}
    }
    for (flag, list) in [("--write-mostly", &args.write_mostly), ("--failfast", &args.failfast)] {
        if !list.is_empty() && !matches!(level.md_level(), 1 | 10) {
            bail!("{flag} applies to raid1 and raid10 members only");
        }
        if let Some(p) = list.iter().find(|p| is_missing(p) || !args.members.contains(p)) {
            bail!("{flag} {}: not one of the members given", p.display());
        }
    }
    // Check everything before creating or writing anything.
    let mut to_create: Vec<&PathBuf> = Vec::new();
    for (i, p) in args.members.iter().enumerate() {
        if is_missing(p) {
            continue;
        }
        if args.members[..i].iter().any(|q| q == p) {
            bail!("{} is named twice: give each member once", p.display());
        }
        // An NBD URI names an export on a server, never a file to create here.
        let remote = crate::array::nbd_member::is_nbd_uri(&p.to_string_lossy());
        if !remote && !p.exists() {
            if size_bytes.is_none() {
                bail!(
                    "{} does not exist: pass --size to create member files, or create them first",
                    p.display()
                );
            }
            to_create.push(p);
        }
    }
    let creating = !to_create.is_empty();
    let mut created_paths: Vec<PathBuf> = Vec::new();
    let result = (|| -> anyhow::Result<String> {
        for p in &to_create {
            let size = size_bytes.unwrap_or(0);
            if size < 1 << 20 {
                bail!("--size {size} bytes is too small for a member file (at least 1M)");
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .io_context(|| format!("{}: cannot create the member file", p.display()))?;
            created_paths.push(p.to_path_buf());
            f.set_len(size / 512 * 512)
                .io_context(|| format!("{}: cannot size the member file", p.display()))?;
        }
        let mut devs: Vec<Option<MemberDev>> = Vec::new();
        for p in &args.members {
            if is_missing(p) {
                devs.push(None);
                continue;
            }
            let d = MemberDev::open_claimed(p)?;
            if let Some(first) = devs.iter().flatten().find(|o| o.identity == d.identity) {
                bail!("{} and {} are the same device: give each member once", first.name, d.name);
            }
            if !args.force {
                if let Ok(sb) = d.superblock() {
                    bail!(
                        "{} already holds an md superblock (array {}, {}): pass --force to overwrite it",
                        d.name,
                        format_uuid(&sb.set_uuid),
                        sb.name()
                    );
                }
            }
            devs.push(Some(d));
        }
        let mut params = CreateParams::new(
            level.md_level(),
            devs.iter().map(|d| d.as_ref().map(MemberDev::dev_sectors)).collect(),
        );
        params.layout = layout;
        params.chunk_kib = chunk_kib;
        params.size_kib = if creating { None } else { size_bytes.map(|b| b / 1024) };
        params.bitmap = bitmap;
        params.write_behind = args.write_behind.unwrap_or(0);
        params.bitmap_chunk_bytes = match &args.bitmap_chunk {
            None => None,
            Some(_) if !bitmap => bail!("--bitmap-chunk needs --bitmap internal"),
            Some(c) => {
                let b = parse_kib_default(c).map_err(|e| anyhow!("--bitmap-chunk: {e}"))?;
                if b > u64::from(u32::MAX) {
                    bail!(
                        "--bitmap-chunk {c}: md keeps the bitmap chunk in a 32-bit field, so 2G is the most"
                    );
                }
                if !b.is_power_of_two() || b < 4096 {
                    bail!("--bitmap-chunk {c}: must be a power of two of at least 4K");
                }
                Some(b as u32)
            }
        };
        params.ppl = ppl;
        params.assume_clean = args.assume_clean;
        params.homehost = crate::array::homehost();
        params.name = args.name.clone().unwrap_or_else(|| default_name(&args.members));
        params.set_uuid = crate::array::random_uuid()?;
        params.device_uuids =
            (0..devs.len()).map(|_| crate::array::random_uuid()).collect::<anyhow::Result<_>>()?;
        params.ctime_seconds = crate::array::now_seconds();
        let created = create_array(&params).map_err(|e| anyhow!("{e}"))?;
        let first = created.superblocks.iter().flatten().next().expect("create_array returns a member");
        let present: Vec<bool> = devs.iter().map(Option::is_some).collect();
        if !enough(first.level, first.raid_disks, first.layout, true, &present) {
            bail!(
                "{} of {} members are `missing`: a {} with these members could never start; \
                 give more members (nothing was written)",
                present.iter().filter(|p| !**p).count(),
                args.raid_devices,
                level_name(level.md_level())
            );
        }

        for (slot, (dev, sb)) in devs.iter().zip(&created.superblocks).enumerate() {
            let (Some(dev), Some(sb)) = (dev, sb) else { continue };
            let mut sb = sb.clone();
            let path = &args.members[slot];
            if args.write_mostly.contains(path) {
                sb.devflags |= devflags::WRITE_MOSTLY;
            }
            if args.failfast.contains(path) {
                sb.devflags |= devflags::FAIL_FAST;
            }
            let sb_at = sb.super_offset * 512;
            let w = |what: &str, off: u64, data: &[u8]| {
                dev.write_at(off, data).io_context(|| format!("{}: writing the {what}", dev.name))
            };
            w("superblock", sb_at, &sb.serialize())?;
            if sb.bblog_size > 0 {
                let at = sb.super_offset.saturating_add_signed(i64::from(sb.bblog_offset)) * 512;
                w("bad-block log", at, &vec![0u8; usize::from(sb.bblog_size) * 512])?;
            }
            if let Some(bm) = &created.bitmap {
                let at = sb.super_offset.saturating_add_signed(i64::from(bm.offset_from_sb_sectors)) * 512;
                w("bitmap", at, &bm.area)?;
            }
            if let Some((start, sectors)) = ppl_area(&sb) {
                // As md's ppl_write_empty_header: the area zeroed (no old log can be taken
                // for a new one), then an empty header with this array's signature.
                let mut area = vec![0u8; (sectors * 512) as usize];
                let header =
                    PplHeader::empty(ppl_signature(&sb.set_uuid)).serialize().map_err(|e| anyhow!("{e}"))?;
                area[..header.len()].copy_from_slice(&header);
                w("partial parity log", start * 512, &area)?;
            }
            dev.sync().io_context(|| format!("{}: fdatasync after slot {slot}", dev.name))?;
        }
        let array_sectors = crate::array::report::array_sectors_of(first);
        let missing = devs.iter().filter(|d| d.is_none()).count();
        let start_note = if args.assume_clean || level.md_level() == 0 {
            "in sync (no initial resync)".to_string()
        } else if missing > 0 {
            "degraded: `uraid serve --run` starts it; add members to rebuild".to_string()
        } else if matches!(level.md_level(), 4 | 5) {
            "the last member is rebuilt from the others when the array first starts".to_string()
        } else {
            "an initial resync runs when the array first starts".to_string()
        };
        Ok(format!(
            "uraid: created {} array {} ({}), {} devices, array size {} ({}), data offset {} sectors{}; {}",
            level_name(level.md_level()),
            first.name(),
            format_uuid(&first.set_uuid),
            args.raid_devices,
            array_sectors * 512,
            human_bytes(array_sectors * 512),
            first.data_offset,
            if bitmap {
                ", internal bitmap"
            } else if ppl {
                ", partial parity log (ppl)"
            } else {
                ""
            },
            start_note
        ))
    })();
    if result.is_err() {
        // Only files this run created (still empty of metadata) are removed.
        for p in &created_paths {
            let _ = std::fs::remove_file(p);
        }
    }
    result
}

/// The directory holding the first member, as a name: "uraid-demo" for ./uraid-demo/m0.img.
fn default_name(members: &[PathBuf]) -> String {
    members
        .iter()
        .find(|p| !is_missing(p) && !crate::array::nbd_member::is_nbd_uri(&p.to_string_lossy()))
        .and_then(|p| std::path::absolute(p).ok())
        .and_then(|p| p.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "uraid".to_string())
}
