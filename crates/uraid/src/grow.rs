//! `uraid grow --control SOCKET`: mdadm --grow's options, sent to the running array as one
//! line of tab-separated `key=value` fields; the array plans, refuses or grows. Without
//! `--control`, a raid4/5/6 grow by members runs offline on the members named (see
//! `grow_offline`), as does `--continue`.

use std::path::PathBuf;

use anyhow::{anyhow, bail};

use crate::control::{abs, request};
use crate::create::{parse_kib_default, parse_level};

#[derive(clap::Args, Clone, Debug)]
pub struct GrowArgs {
    /// Control socket of the running `uraid serve`. Without it: a raid4/5/6 grow by
    /// members (`--raid-devices N --add NEW...`) on the MEMBERS of a stopped array.
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// The members of the stopped array (without --control).
    pub members: Vec<PathBuf>,
    /// Finish a reshape md or uraid left mid-way on the MEMBERS (mdadm --grow --continue).
    #[arg(long = "continue", conflicts_with = "control")]
    pub continue_reshape: bool,
    /// Test only: exit after this many reshape windows, as a kill -9 would.
    #[arg(long, hide = true)]
    pub debug_stop_after_windows: Option<usize>,
    /// Test only: milliseconds of pause before every member write of the reshape.
    #[arg(long, hide = true, default_value_t = 0)]
    pub debug_io_delay_ms: u64,
    /// The new member count (raid1: mirrors; the new ones come from spares and --add).
    #[arg(long = "raid-devices", short = 'n')]
    pub raid_devices: Option<usize>,
    /// A device to add before the grow (as `uraid add`); may repeat.
    #[arg(long = "add")]
    pub add: Vec<PathBuf>,
    /// The new RAID level (0, 1, 4, 5, 6, 10 or md's names).
    #[arg(long)]
    pub level: Option<String>,
    /// The new chunk (a bare number is KiB, as mdadm).
    #[arg(long)]
    pub chunk: Option<String>,
    /// The new layout (left-symmetric, n2 ...); with --level 6 on a raid5, `preserve` is
    /// md's takeover (Q on the new member, no restripe).
    #[arg(long)]
    pub layout: Option<String>,
    /// The component size: `max` (all the room the members have) or a size (bare number:
    /// KiB).
    #[arg(long)]
    pub size: Option<String>,
    /// Grow a mirror count without the spares to fill it (the array runs degraded).
    #[arg(long)]
    pub force: bool,
}

/// The control line's fields (after the verb) of a grow.
fn fields(args: &GrowArgs) -> anyhow::Result<Vec<String>> {
    let mut f = Vec::new();
    if let Some(n) = args.raid_devices {
        f.push(format!("raid-devices={n}"));
    }
    if let Some(l) = &args.level {
        f.push(format!("level={}", parse_level(l)?.md_level()));
    }
    if let Some(c) = &args.chunk {
        let bytes = parse_kib_default(c).map_err(|e| anyhow!("--chunk: {e}"))?;
        if bytes % 512 != 0 || bytes == 0 {
            bail!("--chunk {c}: must be a non-zero multiple of 512 bytes (md needs a power of two of at least 4K)");
        }
        f.push(format!("chunk-sectors={}", bytes / 512));
    }
    if let Some(l) = &args.layout {
        f.push(format!("layout={l}"));
    }
    match args.size.as_deref() {
        None => {}
        Some("max") => f.push("size=max".into()),
        Some(s) => {
            let bytes = parse_kib_default(s).map_err(|e| anyhow!("--size: {e}"))?;
            f.push(format!("size-sectors={}", bytes / 512));
        }
    }
    f.extend(args.add.iter().map(|p| format!("add={}", abs(p))));
    if args.force {
        f.push("force".into());
    }
    Ok(f)
}

/// Sends the grow and prints what the array did, then the recovery or resync it started
/// while attached to a terminal (`uraid status` shows it too).
pub fn run(args: GrowArgs) -> anyhow::Result<()> {
    let f = fields(&args)?;
    let Some(control) = &args.control else {
        let (req, _) = crate::array::running::grow::parse_grow_request(&f.join("\t"))?;
        let off = crate::grow_offline::Offline {
            members: args.members.clone(),
            continue_only: args.continue_reshape,
            stop_after_windows: args.debug_stop_after_windows,
            io_delay: std::time::Duration::from_millis(args.debug_io_delay_ms),
        };
        return crate::grow_offline::run(
            &uraid_core::array::GrowRequest { adding: 0, ..req },
            &args.add,
            &off,
        );
    };
    if !args.members.is_empty() {
        bail!("with --control, name no members: new devices go with --add");
    }
    if f.iter().all(|x| x.starts_with("add=") || x == "force") {
        bail!("nothing to grow: give --raid-devices, --level, --chunk, --layout or --size (with --add for new members)");
    }
    print!("{}", request(control, &format!("grow {}", f.join("\t")))?);
    crate::control::show_progress(control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_read_back_as_sent() {
        let args = GrowArgs {
            control: Some(PathBuf::from("/s")),
            members: vec![],
            continue_reshape: false,
            debug_stop_after_windows: None,
            debug_io_delay_ms: 0,
            raid_devices: Some(3),
            add: vec![PathBuf::from("/a b/m2")],
            level: Some("mirror".into()),
            chunk: Some("128".into()),
            layout: Some("n2".into()),
            size: Some("max".into()),
            force: true,
        };
        let line = fields(&args).unwrap().join("\t");
        let (req, adds) = crate::array::running::grow::parse_grow_request(&line).unwrap();
        assert_eq!(adds, vec!["/a b/m2".to_string()]);
        assert_eq!(req.raid_disks, Some(3));
        assert_eq!(req.level, Some(uraid_core::geometry::Level::Raid1));
        assert_eq!(req.chunk_sectors, Some(256));
        assert_eq!(req.layout.as_deref(), Some("n2"));
        assert_eq!(req.size, Some(uraid_core::array::GrowSize::Max));
        assert!(req.force);
    }
}
