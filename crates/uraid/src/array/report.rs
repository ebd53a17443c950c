//! mdadm-like text: `--examine` of one member and `--detail` of an array.

use std::fmt::Write as _;

use uraid_core::geometry::layout_name;
use uraid_core::meta::{feature, format_uuid, raid10_sizes, role, BitmapImage, Superblock, MAX_SECTOR};
use uraid_core::Level;

use super::detail_info::DetailInfo;

/// "30720 sectors (15.00 MiB 15.73 MB)" style sizes: binary and decimal.
pub fn human_bytes(bytes: u64) -> String {
    let dec = [
        ("KB", 1_000u64),
        ("MB", 1_000_000),
        ("GB", 1_000_000_000),
        ("TB", 1_000_000_000_000),
        ("PB", 1_000_000_000_000_000),
        ("EB", 1_000_000_000_000_000_000),
    ];
    format!("{} {}", binary_bytes(bytes), in_units(bytes, &dec))
}

/// The binary half of [`human_bytes`]: "15.00 MiB".
pub fn binary_bytes(bytes: u64) -> String {
    let units = [
        ("KiB", 1u64 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
        ("PiB", 1 << 50),
        ("EiB", 1 << 60),
    ];
    in_units(bytes, &units)
}

/// `bytes` in the largest unit of `list` it holds twice (mdadm's choice).
fn in_units(bytes: u64, list: &[(&str, u64)]) -> String {
    let (name, div) = list.iter().rev().find(|(_, d)| bytes / 2 >= *d).copied().unwrap_or(list[0]);
    format!("{:.2} {name}", bytes as f64 / div as f64)
}

/// `done` of `total` as /proc/mdstat shows it: one decimal, cut, not rounded (99.99% is
/// "99.9%", never "100.0%" before the end).
pub fn percent(done: u64, total: u64) -> String {
    let per_mille =
        if total == 0 { 1000 } else { (u128::from(done.min(total)) * 1000 / u128::from(total)) as u64 };
    format!("{}.{}%", per_mille / 10, per_mille % 10)
}

/// `from` as a share of `whole` after a sector: "sector 9913344 (0.3%)".
pub fn sector_of(from: u64, whole: u64) -> String {
    format!("sector {from} ({})", percent(from, whole))
}

/// A time left in words where md's minutes are hard to read: None under three hours,
/// then "about 5 hours", from two days "about 65 days".
pub fn time_left_words(seconds: f64) -> Option<String> {
    let hours = seconds / 3600.0;
    if !hours.is_finite() || hours < 3.0 {
        return None;
    }
    Some(if hours < 48.0 {
        format!("about {:.0} hours", hours)
    } else {
        format!("about {:.0} days", hours / 24.0)
    })
}

/// `n` of `noun`: "1 region", "3 regions".
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Seconds since the epoch as "Sun Nov 22 01:45:20 2026" (UTC).
pub fn format_time(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let rem = seconds % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let mon = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        [(month - 1) as usize];
    format!("{weekday} {mon} {day:2} {:02}:{:02}:{:02} {year}", rem / 3600, rem / 60 % 60, rem % 60)
}

pub fn level_name(level: i32) -> String {
    match level {
        -1 => "linear".into(),
        l => format!("raid{l}"),
    }
}

pub fn layout_text(level: i32, layout: u32) -> Option<String> {
    match Level::from_md_level(level)? {
        Level::Raid1 | Level::Raid0 => None,
        l => Some(layout_name(l, layout)),
    }
}

/// Array sectors as one member's superblock implies them.
pub fn array_sectors_of(sb: &Superblock) -> u64 {
    let n = u64::from(sb.raid_disks);
    let chunk = u64::from(sb.chunksize.max(1));
    match sb.level {
        0 => (sb.data_size / chunk * chunk) * n,
        1 => sb.size,
        4 | 5 => sb.size * n.saturating_sub(1),
        6 => sb.size * n.saturating_sub(2),
        10 => raid10_sizes(sb.size, sb.raid_disks, sb.layout, sb.chunksize).1,
        _ => sb.data_size,
    }
}

/// What a resync walks, in sectors: md's `resync_max_sectors`, the array for raid10 (its
/// resync_offset counts array sectors), each member's data elsewhere.
pub fn resync_whole_sectors(level: i32, used_dev_sectors: u64, array_sectors: u64) -> u64 {
    if level == 10 {
        array_sectors
    } else {
        used_dev_sectors
    }
}

/// 'A' for every slot some member holds in this superblock's view, '.' otherwise.
pub fn array_state(sb: &Superblock) -> String {
    (0..sb.raid_disks)
        .map(|s| if sb.dev_roles.iter().any(|&r| u32::from(r) == s) { 'A' } else { '.' })
        .collect()
}

pub fn role_text(sb: &Superblock) -> String {
    match sb.role() {
        role::SPARE => "spare".into(),
        role::FAULTY => "faulty".into(),
        role::JOURNAL => "journal".into(),
        r if sb.has(feature::RECOVERY_OFFSET) => {
            let done = percent(sb.recovery_offset, sb.size);
            format!("Active device {r} (rebuilt to sector {}, {done})", sb.recovery_offset)
        }
        r => format!("Active device {r}"),
    }
}

/// What `mdadm --examine` prints for one member.
pub fn examine_text(name: &str, sb: &Superblock, bitmap: Option<&[u8]>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{name}:");
    let mut line = |k: &str, v: String| {
        let _ = writeln!(s, "{k:>15} : {v}");
    };
    line("Magic", format!("{:08x}", sb.magic));
    line(
        "Version",
        format!(
            "1.{}",
            match sb.super_offset {
                0 => 1,
                8 => 2,
                _ => 0,
            }
        ),
    );
    line("Feature Map", format!("{:#x}", sb.feature_map));
    line("Array UUID", format_uuid(&sb.set_uuid));
    line("Name", sb.name());
    line("Creation Time", format_time(sb.ctime & 0xff_ffff_ffff));
    line("Raid Level", level_name(sb.level));
    line("Raid Devices", sb.raid_disks.to_string());
    s.push('\n');
    let mut line = |k: &str, v: String| {
        let _ = writeln!(s, "{k:>15} : {v}");
    };
    line("Avail Dev Size", format!("{} sectors ({})", sb.data_size, human_bytes(sb.data_size * 512)));
    let array = array_sectors_of(sb);
    line("Array Size", format!("{} KiB ({})", array / 2, human_bytes(array * 512)));
    if sb.level > 0 && sb.size != sb.data_size {
        line("Used Dev Size", format!("{} sectors ({})", sb.size, human_bytes(sb.size * 512)));
    }
    line("Data Offset", format!("{} sectors", sb.data_offset));
    if sb.has(feature::NEW_OFFSET) {
        line("New Offset", format!("{} sectors", sb.new_data_offset()));
    }
    line("Super Offset", format!("{} sectors", sb.super_offset));
    if sb.has(feature::RECOVERY_OFFSET) {
        line("Recovery Offset", format!("{} sectors", sb.recovery_offset));
    }
    let state = if sb.resync_offset == MAX_SECTOR {
        "clean".to_string()
    } else if sb.resync_offset == 0 {
        "active".to_string()
    } else {
        let done = percent(sb.resync_offset, resync_whole_sectors(sb.level, sb.size, array));
        format!("active (resync from sector {}, {done})", sb.resync_offset)
    };
    line("State", state);
    line("Device UUID", format_uuid(&sb.device_uuid));
    s.push('\n');
    let mut line = |k: &str, v: String| {
        let _ = writeln!(s, "{k:>15} : {v}");
    };
    if let Some(_at) = sb.bitmap_sector() {
        line("Internal Bitmap", format!("{} sectors from superblock", sb.bitmap_offset));
    }
    if sb.feature_map & (feature::PPL | feature::MULTIPLE_PPLS) != 0 {
        line(
            "PPL",
            format!("{} sectors at offset {} sectors from superblock", sb.ppl_size(), sb.ppl_offset()),
        );
    }
    line("Update Time", format_time(sb.utime & 0xff_ffff_ffff));
    if sb.bblog_size > 0 {
        line(
            "Bad Block Log",
            format!(
                "{} entries available at offset {} sectors{}",
                u32::from(sb.bblog_size) * 64,
                sb.bblog_offset,
                if sb.has(feature::BAD_BLOCKS) { " - bad blocks present." } else { "" }
            ),
        );
    }
    line("Checksum", format!("{:08x} - correct", sb.sb_csum));
    line("Events", sb.events.to_string());
    // mdadm's examine_super1: where a reshape stands (KiB) and what it changes.
    if sb.has(feature::RESHAPE_ACTIVE) {
        line(
            "Reshape pos'n",
            format!("{} ({})", sb.reshape_position / 2, human_bytes(sb.reshape_position * 512)),
        );
        if sb.delta_disks != 0 {
            let to = sb.raid_disks as i64;
            line("Delta Devices", format!("{} ({}->{to})", sb.delta_disks, to - i64::from(sb.delta_disks)));
        }
        if sb.new_level as i32 != sb.level {
            line("New Level", format!("raid{}", sb.new_level));
        }
        if sb.new_layout != sb.layout {
            if let Some(l) = layout_text(sb.new_level as i32, sb.new_layout) {
                line("New Layout", l);
            }
        }
        if sb.new_chunk != sb.chunksize {
            line("New Chunksize", format!("{}K", sb.new_chunk / 2));
        }
    }
    s.push('\n');
    let mut line = |k: &str, v: String| {
        let _ = writeln!(s, "{k:>15} : {v}");
    };
    if let Some(l) = layout_text(sb.level, sb.layout) {
        line("Layout", l);
    }
    if sb.level != 1 && sb.chunksize > 0 {
        line("Chunk Size", format!("{}K", sb.chunksize / 2));
    }
    s.push('\n');
    if sb.devflags != 0 {
        let mut flags = String::new();
        if sb.devflags & uraid_core::meta::devflags::WRITE_MOSTLY != 0 {
            flags.push_str(" write-mostly");
        }
        if sb.devflags & uraid_core::meta::devflags::FAIL_FAST != 0 {
            flags.push_str(" failfast");
        }
        let _ = writeln!(s, "         Flags :{flags}");
    }
    let _ = writeln!(s, "   Device Role : {}", role_text(sb));
    let _ = writeln!(s, "   Array State : {} ('A' == active, '.' == missing)", array_state(sb));
    if let Some(bytes) = bitmap {
        match BitmapImage::parse(bytes) {
            Ok(img) => {
                let _ = writeln!(
                    s,
                    "        Bitmap : {} bits (chunks), {} dirty, chunk {}KiB, events {}, events cleared {}",
                    img.sb.bits(),
                    img.dirty_count(),
                    img.sb.chunksize / 1024,
                    img.sb.events,
                    img.sb.events_cleared
                );
                if img.sb.write_behind > 0 {
                    let _ = writeln!(s, "    Write Mode : {}", write_mode(img.sb.write_behind));
                }
            }
            Err(e) => {
                let _ = writeln!(s, "        Bitmap : unreadable: {e}");
            }
        }
    }
    s
}

/// mdadm --examine-badblocks's listing of one member.
pub fn bad_blocks_text(device: &str, entries: &[(u64, u64)]) -> String {
    let mut s = format!("Bad-blocks on {device}:\n");
    for (sector, len) in entries {
        let _ = writeln!(s, "{sector:>20} for {len} sectors");
    }
    s
}

/// What a running array's executor did with each member device, by device name.
pub type ExecutorIo = Vec<(String, uraid_io::real::ExecutorMemberStats)>;

/// `n` as text, or md's "-" for none.
fn or_dash<T: ToString>(n: Option<T>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "-".to_string())
}

/// A sync's progress for `--json` (docs/json.md): `done` and `total` in KiB as
/// /proc/mdstat counts them, the speed in KiB/s and the time left in seconds (null while
/// unknown).
fn progress_json(p: &super::detail_info::SyncProgress) -> serde_json::Value {
    serde_json::json!({
        "action": p.action,
        "done": p.done_sectors / 2,
        "total": p.total_sectors / 2,
        "percent": if p.total_sectors == 0 { 100.0 } else { p.done_sectors as f64 * 100.0 / p.total_sectors as f64 },
        "speed_kbps": p.speed_kib_per_s,
        "eta_s": p.eta_s,
    })
}

/// What `status --json` and `detail --json` both give: the array's state, its counts,
/// the running sync and one row per device. Numbers are JSON numbers; none is null.
pub fn status_json(title: &str, d: &DetailInfo) -> serde_json::Value {
    let sb = &d.sb;
    let devices: Vec<serde_json::Value> = d
        .rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "number": r.number, "raid_device": r.slot, "state": r.state,
                "device": if r.path == "-" { None } else { Some(&r.path) },
            })
        })
        .collect();
    let mut v = serde_json::json!({
        "name": title,
        "uuid": format_uuid(&sb.set_uuid),
        "raid_level": level_name(sb.level),
        "raid_devices": sb.raid_disks,
        "array_size_bytes": d.array_sectors * 512,
        "state": d.state,
        "active_devices": d.active,
        "working_devices": d.working,
        "failed_devices": d.failed,
        "spare_devices": d.spares,
        "progress": d.sync.as_ref().map(progress_json),
        "devices": devices,
    });
    if let Some(sc) = &d.scrub {
        v["sync_action"] = sc.sync_action.clone().into();
        v["last_sync_action"] = sc.last_sync_action.clone().into();
        v["mismatch_cnt"] = sc.mismatch_cnt.into();
    }
    v
}

/// `--detail --json`: the same facts as [`detail_text`], for scripts: [`status_json`]'s
/// fields and the superblock's; `io` adds each device's member I/O counts on a running
/// array, `exec` each device's kind and the I/O the executor ran buffered, inline or
/// timed out.
pub fn detail_json(
    title: &str,
    d: &DetailInfo,
    io: &super::member_io::DeviceIo,
    exec: &ExecutorIo,
) -> String {
    let sb = &d.sb;
    let mut v = status_json(title, d);
    v["version"] = superblock_version(sb).into();
    v["creation_time"] = (sb.ctime & 0xff_ffff_ffff).into();
    v["update_time"] = (sb.utime & 0xff_ffff_ffff).into();
    v["used_dev_size_bytes"] = (d.used_dev_sectors * 512).into();
    v["events"] = sb.events.into();
    v["bitmap"] = sb.bitmap_sector().is_some().into();
    v["write_behind"] = d.write_behind.into();
    if let Some(n) = d.behind_writes_in_flight {
        v["behind_writes_in_flight"] = n.into();
    }
    if let Some(n) = d.write_behind_requests {
        v["write_behind_requests"] = n.into();
    }
    v["layout"] = layout_text(sb.level, sb.layout).into();
    v["chunk_size_bytes"] = chunk_bytes(sb).into();
    if let Some(devices) = v["devices"].as_array_mut() {
        for (dev, r) in devices.iter_mut().zip(&d.rows) {
            if let Some((_, m)) = io.iter().find(|(name, _)| *name == r.path) {
                dev["io"] = serde_json::json!({
                    "reads": m.reads, "writes": m.writes, "flushes": m.flushes,
                    "read_bytes": m.read_bytes, "write_bytes": m.write_bytes, "errors": m.errors,
                });
            }
            if let Some((_, x)) = exec.iter().find(|(name, _)| *name == r.path) {
                dev["kind"] = x.kind.map(|k| k.name()).unwrap_or("unknown").into();
                dev["direct_io"] = x.direct.into();
                let io = dev
                    .as_object_mut()
                    .and_then(|o| o.entry("io").or_insert(serde_json::json!({})).as_object_mut());
                if let Some(io) = io {
                    io.insert("buffered_ios".into(), x.buffered_ios.into());
                    io.insert("inline_ios".into(), x.inline_ios.into());
                    io.insert("timed_out_ios".into(), x.timed_out_ios.into());
                }
            }
        }
    }
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// "1.2": the superblock's minor version from where it sits.
fn superblock_version(sb: &Superblock) -> &'static str {
    match sb.super_offset {
        0 => "1.1",
        8 => "1.2",
        _ => "1.0",
    }
}

/// The chunk in bytes where the level has chunks (not raid1).
fn chunk_bytes(sb: &Superblock) -> Option<u64> {
    (sb.level != 1 && sb.chunksize > 0).then(|| u64::from(sb.chunksize) * 512)
}

/// `examine --json` of one member: [`examine_text`]'s facts, sizes and offsets in sectors
/// as the superblock keeps them (docs/json.md).
pub fn examine_json(
    name: &str,
    sb: &Superblock,
    bitmap: Option<&[u8]>,
    bad_blocks: Option<&[(u64, u64)]>,
) -> serde_json::Value {
    let array = array_sectors_of(sb);
    let (role, raid_device) = match sb.role() {
        role::SPARE => ("spare", None),
        role::FAULTY => ("faulty", None),
        role::JOURNAL => ("journal", None),
        r => ("active", Some(r)),
    };
    let mut flags = Vec::new();
    if sb.devflags & uraid_core::meta::devflags::WRITE_MOSTLY != 0 {
        flags.push("write-mostly");
    }
    if sb.devflags & uraid_core::meta::devflags::FAIL_FAST != 0 {
        flags.push("failfast");
    }
    let bitmap = bitmap.map(|bytes| match BitmapImage::parse(bytes) {
        Ok(img) => serde_json::json!({
            "bits": img.sb.bits(), "dirty": img.dirty_count(), "chunk_bytes": img.sb.chunksize,
            "events": img.sb.events, "events_cleared": img.sb.events_cleared,
            "write_behind": img.sb.write_behind,
        }),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    });
    let ppl = sb.feature_map & (feature::PPL | feature::MULTIPLE_PPLS) != 0;
    serde_json::json!({
        "device": name,
        "magic": sb.magic,
        "version": superblock_version(sb),
        "feature_map": sb.feature_map,
        "array_uuid": format_uuid(&sb.set_uuid),
        "name": sb.name(),
        "creation_time": sb.ctime & 0xff_ffff_ffff,
        "raid_level": level_name(sb.level),
        "raid_devices": sb.raid_disks,
        "avail_dev_size_sectors": sb.data_size,
        "array_size_sectors": array,
        "used_dev_size_sectors": sb.size,
        "data_offset_sectors": sb.data_offset,
        "super_offset_sectors": sb.super_offset,
        "recovery_offset_sectors": sb.has(feature::RECOVERY_OFFSET).then_some(sb.recovery_offset),
        "state": if sb.resync_offset == MAX_SECTOR { "clean" } else { "active" },
        "resync_offset_sectors": (sb.resync_offset != MAX_SECTOR).then_some(sb.resync_offset),
        "device_uuid": format_uuid(&sb.device_uuid),
        "bitmap_offset_sectors": sb.bitmap_sector().map(|_| sb.bitmap_offset),
        "ppl_offset_sectors": ppl.then(|| sb.ppl_offset()),
        "ppl_size_sectors": ppl.then(|| sb.ppl_size()),
        "update_time": sb.utime & 0xff_ffff_ffff,
        "bad_block_log_entries": (sb.bblog_size > 0).then(|| u32::from(sb.bblog_size) * 64),
        "checksum": sb.sb_csum,
        "events": sb.events,
        "layout": layout_text(sb.level, sb.layout),
        "chunk_size_bytes": chunk_bytes(sb),
        "flags": flags,
        "device_role": role,
        "raid_device": raid_device,
        "array_state": array_state(sb),
        "bitmap": bitmap,
        "bad_blocks": bad_blocks.map(|b| b.iter().map(|(sector, sectors)| serde_json::json!({
            "sector": sector, "sectors": sectors,
        })).collect::<Vec<_>>()),
    })
}

/// mdadm's "Write Mode" line of a bitmap with write-behind (`mdadm -X`).
fn write_mode(max: u32) -> String {
    format!("Allow write behind, max {max}")
}

pub fn detail_text(title: &str, d: &DetailInfo) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{title}:");
    let sb = &d.sb;
    let mut line = |k: &str, v: String| {
        let _ = writeln!(s, "{k:>18} : {v}");
    };
    line(
        "Version",
        format!(
            "1.{}",
            match sb.super_offset {
                0 => 1,
                8 => 2,
                _ => 0,
            }
        ),
    );
    line("Creation Time", format_time(sb.ctime & 0xff_ffff_ffff));
    line("Raid Level", level_name(sb.level));
    line("Array Size", format!("{} KiB ({})", d.array_sectors / 2, human_bytes(d.array_sectors * 512)));
    if sb.level > 0 {
        line(
            "Used Dev Size",
            format!("{} KiB ({})", d.used_dev_sectors / 2, human_bytes(d.used_dev_sectors * 512)),
        );
    }
    line("Raid Devices", sb.raid_disks.to_string());
    line("Total Devices", d.rows.iter().filter(|r| r.path != "-").count().to_string());
    line("Persistence", "Superblock is persistent".into());
    if sb.bitmap_sector().is_some() {
        line("Intent Bitmap", "Internal".into());
    }
    if d.write_behind > 0 {
        line("Write Mode", write_mode(d.write_behind));
    }
    line("Update Time", format_time(sb.utime & 0xff_ffff_ffff));
    line("State", d.state.clone());
    line("Active Devices", d.active.to_string());
    line("Working Devices", d.working.to_string());
    line("Failed Devices", d.failed.to_string());
    line("Spare Devices", d.spares.to_string());
    if let Some(l) = layout_text(sb.level, sb.layout) {
        line("Layout", l);
    }
    if sb.level != 1 && sb.chunksize > 0 {
        line("Chunk Size", format!("{}K", sb.chunksize / 2));
    }
    // mdadm prints the policy for every redundant array: ppl, bitmap or resync.
    if sb.level > 0 {
        let policy = if sb.feature_map & (feature::PPL | feature::MULTIPLE_PPLS) != 0 {
            "ppl"
        } else if sb.bitmap_sector().is_some() {
            "bitmap"
        } else {
            "resync"
        };
        line("Consistency Policy", policy.into());
    }
    if let Some(p) = &d.progress {
        let (k, v) = p.split_once(" : ").unwrap_or(("Status", p.as_str()));
        line(k, v.to_string());
    }
    if let Some(v) = &d.scrub {
        line("Sync Action", v.sync_action.clone());
        line("Last Sync Action", v.last_sync_action.clone());
        line("Mismatch Count", v.mismatch_cnt.to_string());
    }
    line("Name", sb.name());
    line("UUID", format_uuid(&sb.set_uuid));
    line("Events", sb.events.to_string());
    s.push('\n');
    let _ = writeln!(s, "    Number   RaidDevice   State                   Device");
    for r in &d.rows {
        let (number, slot) = (or_dash(r.number), or_dash(r.slot));
        let _ = writeln!(s, "    {number:>6}   {slot:>10}   {:<22}  {}", r.state, r.path);
    }
    for (dev, entries) in &d.bad_blocks {
        s.push('\n');
        s.push_str(&bad_blocks_text(dev, entries));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_past_a_thousand_tebibytes_are_in_pebibytes() {
        assert_eq!(human_bytes(96 << 40), "96.00 TiB 105.55 TB");
        assert_eq!(human_bytes(2048 << 40), "2.00 PiB 2.25 PB");
        assert_eq!(human_bytes(3 << 60), "3.00 EiB 3.46 EB");
        assert_eq!(human_bytes(u64::MAX), "16.00 EiB 18.45 EB");
    }

    #[test]
    fn a_percent_has_one_decimal_and_never_rounds_up_to_done() {
        assert_eq!(percent(9_913_344, 34_359_738_368 / 16), "0.4%");
        assert_eq!(percent(1, 2_000), "0.0%");
        assert_eq!(percent(9_999, 10_000), "99.9%");
        assert_eq!(percent(5, 5), "100.0%");
        assert_eq!(percent(0, 0), "100.0%");
        assert_eq!(percent(u64::MAX - 1, u64::MAX), "99.9%");
    }

    #[test]
    fn a_long_time_left_is_said_in_hours_or_days() {
        assert_eq!(time_left_words(2.9 * 3600.0), None);
        assert_eq!(time_left_words(5.0 * 3600.0).as_deref(), Some("about 5 hours"));
        assert_eq!(time_left_words(93_643.5 * 60.0).as_deref(), Some("about 65 days"));
        assert_eq!(time_left_words(f64::INFINITY), None);
    }
}
