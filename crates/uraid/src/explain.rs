//! `uraid explain`: the member I/Os one request costs on an idle array of a given shape.

use anyhow::{bail, Context};
use clap::Args;
use uraid_core::explain::explain;
use uraid_core::geometry::{algorithm, layout_name, parse_layout};
use uraid_core::{Geometry, Level, RequestOp, Tunables};

use crate::size_arg::parse_size_bytes;

#[derive(Args)]
pub struct ExplainArgs {
    /// RAID level: 0, 1, 10, 4, 5, 6 (also raid5 style names).
    #[arg(long)]
    level: String,
    /// Number of slots (members).
    #[arg(long = "raid-devices", short = 'n')]
    raid_devices: usize,
    /// Chunk size (K/M suffixes); not needed for raid1.
    #[arg(long, default_value = "512K")]
    chunk: String,
    /// md layout name (left-symmetric, n2, f2, o2, ...); md's default if omitted.
    #[arg(long)]
    layout: Option<String>,
    /// Usable size of each member (K/M/G/T suffixes).
    #[arg(long, default_value = "1T")]
    size: String,
    /// 0 reconstruct-write only, 1 read-modify-write where it reads less, 2 also where equal.
    #[arg(long = "rmw-level", default_value_t = Tunables::default().rmw_level.to_string())]
    rmw_level: String,
    /// Members (slot numbers) to treat as missing, comma-separated.
    #[arg(long, value_delimiter = ',')]
    failed: Vec<usize>,
    /// Print JSON: the member I/Os one by one.
    #[arg(long)]
    json: bool,
    /// read, write, trim or write-zeroes
    op: String,
    /// Array byte offset (K/M/G suffixes).
    offset: String,
    /// Length in bytes (K/M/G suffixes).
    length: String,
}

pub fn parse_level(text: &str) -> anyhow::Result<Level> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_prefix("raid").unwrap_or(&t);
    let n: i32 = match t {
        "stripe" => 0,
        "mirror" => 1,
        other => other.parse().with_context(|| format!("level {text:?}: use 0, 1, 10, 4, 5 or 6"))?,
    };
    Level::from_md_level(n)
        .with_context(|| format!("level {text:?} is not one uraid supports (0, 1, 10, 4, 5, 6)"))
}

/// md's default layout for a level (what mdadm picks without --layout).
pub fn default_layout(level: Level) -> u32 {
    match level {
        Level::Raid5 | Level::Raid6 => algorithm::LEFT_SYMMETRIC,
        Level::Raid4 => algorithm::PARITY_N,
        Level::Raid10 => 0x102,
        Level::Raid0 => uraid_core::geometry::RAID0_ORIG_LAYOUT,
        Level::Raid1 => 0,
    }
}

pub fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let level = parse_level(&args.level)?;
    let layout = match &args.layout {
        Some(l) => parse_layout(level, l).map_err(anyhow::Error::msg)?,
        None => default_layout(level),
    };
    let chunk_bytes =
        if level == Level::Raid1 { 0 } else { parse_size_bytes(&args.chunk).map_err(anyhow::Error::msg)? };
    let size = parse_size_bytes(&args.size).map_err(anyhow::Error::msg)?;
    let geo = Geometry::new(
        level,
        args.raid_devices,
        layout,
        chunk_bytes / 512,
        &vec![size / 512; args.raid_devices],
    )
    .map_err(anyhow::Error::msg)?;
    let op = match args.op.as_str() {
        "read" => RequestOp::Read,
        "write" => RequestOp::Write,
        "trim" => RequestOp::Trim,
        "write-zeroes" | "write_zeroes" => RequestOp::WriteZeroes,
        other => bail!("op {other:?}: use read, write, trim or write-zeroes"),
    };
    let offset = parse_size_bytes(&args.offset).map_err(anyhow::Error::msg)?;
    let len = parse_size_bytes(&args.length).map_err(anyhow::Error::msg)?;
    if offset % 512 != 0 || len % 512 != 0 || len == 0 {
        bail!("offset and length must be non-zero multiples of 512 bytes");
    }
    if len > 256 << 20 {
        bail!("length {len} is over the 256 MiB explain handles");
    }
    // The table's own parse and range; a mirror, which has no rmw_level, ignores it.
    let mut tunables = Tunables::default();
    let rmw = uraid_core::tunables::find("rmw_level").map_err(anyhow::Error::msg)?;
    (rmw.set)(&mut tunables, &args.rmw_level).map_err(|e| anyhow::anyhow!("--rmw-level: {e}"))?;
    let e =
        explain(geo.clone(), tunables.clone(), &args.failed, op, offset, len).map_err(anyhow::Error::msg)?;
    if args.json {
        let per_member: Vec<serde_json::Value> = e
            .per_member
            .iter()
            .map(|c| {
                serde_json::json!({"member": c.member, "reads": c.reads, "writes": c.writes,
                    "read_bytes": c.read_bytes, "write_bytes": c.write_bytes})
            })
            .collect();
        let ios: Vec<serde_json::Value> = e
            .ios
            .iter()
            .map(|(m, op, off, len)| serde_json::json!({"member": m, "op": format!("{op:?}").to_lowercase(), "offset": off, "len": len}))
            .collect();
        let v = serde_json::json!({
            "level": level.md_level(), "raid_devices": args.raid_devices, "layout": layout_name(level, layout),
            "chunk_bytes": chunk_bytes, "rmw_level": tunables.rmw_level, "op": args.op, "offset": offset, "len": len,
            "reads": e.reads, "writes": e.writes,
            "full_stripe_writes": e.full_stripe_writes, "rmw_writes": e.rmw_writes, "rcw_writes": e.rcw_writes,
            "per_member": per_member, "ios": ios,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "raid{} {} members, chunk {}, layout {}, rmw_level {}{}",
        level.md_level(),
        args.raid_devices,
        if level == Level::Raid1 { "-".into() } else { format!("{}K", chunk_bytes >> 10) },
        layout_name(level, layout),
        tunables.rmw_level,
        if args.failed.is_empty() { String::new() } else { format!(", missing {:?}", args.failed) }
    );
    let how = match (e.full_stripe_writes, e.rmw_writes, e.rcw_writes) {
        (0, 0, 0) => String::new(),
        (f, r, c) => format!(" (stripe writes: {f} full, {r} read-modify-write, {c} reconstruct-write)"),
    };
    println!("{} {}+{}: {} member reads, {} member writes{how}", args.op, offset, len, e.reads, e.writes);
    println!("{:>6} {:>6} {:>6} {:>12} {:>12}", "member", "reads", "writes", "read_bytes", "write_bytes");
    for c in e.per_member.iter().filter(|c| c.reads + c.writes > 0) {
        println!("{:>6} {:>6} {:>6} {:>12} {:>12}", c.member, c.reads, c.writes, c.read_bytes, c.write_bytes);
    }
    Ok(())
}
