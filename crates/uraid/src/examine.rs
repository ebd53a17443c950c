//! `uraid examine`: print each member's md superblock, as mdadm --examine.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use crate::array::member::MemberDev;
use crate::array::report::{bad_blocks_text, examine_json, examine_text};
use uraid_core::meta::{MemberMetadata, OfferedMember};

#[derive(Args, Clone, Debug)]
pub struct ExamineArgs {
    /// A JSON array, one object per member (docs/json.md).
    #[arg(long)]
    pub json: bool,
    /// Member files or block devices.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

pub fn run(args: ExamineArgs) -> anyhow::Result<()> {
    if args.json {
        return run_json(&args.members);
    }
    let mut bad = 0;
    for (i, p) in args.members.iter().enumerate() {
        if i > 0 {
            println!();
        }
        match MemberDev::open(p, false) {
            Err(e) => {
                eprintln!("uraid: {e:#}");
                bad += 1;
            }
            Ok(dev) => match dev.metadata() {
                MemberMetadata { offered: OfferedMember { superblock: Ok(sb), bitmap, .. }, bad_blocks } => {
                    print!("{}", examine_text(&dev.name, &sb, bitmap.as_deref()));
                    // mdadm --examine-badblocks's listing, when the log has entries.
                    match bad_blocks {
                        Ok(Some(bb)) if !bb.is_empty() => {
                            let entries: Vec<_> = bb.entries().collect();
                            print!("\n{}", bad_blocks_text(&dev.name, &entries));
                        }
                        Ok(_) => {}
                        Err(e) => {
                            eprintln!("uraid: {e}");
                            bad += 1;
                        }
                    }
                }
                MemberMetadata { offered: OfferedMember { superblock: Err(e), .. }, .. } => {
                    eprintln!("uraid: {}: {e}", dev.name);
                    bad += 1;
                }
            },
        }
    }
    if bad > 0 {
        bail!("{bad} of {} members {} no usable md superblock", args.members.len(), has(bad));
    }
    Ok(())
}

/// `examine --json`: every member in one array; one that cannot be read is an object with
/// `device` and `error`, and the exit status says so as the text form's does.
fn run_json(members: &[PathBuf]) -> anyhow::Result<()> {
    let mut bad = 0;
    let mut out = Vec::new();
    for p in members {
        let failed = |e: String| serde_json::json!({ "device": p.display().to_string(), "error": e });
        let v = match MemberDev::open(p, false) {
            Err(e) => failed(format!("{e:#}")),
            Ok(dev) => match dev.metadata() {
                MemberMetadata { offered: OfferedMember { superblock: Ok(sb), bitmap, .. }, bad_blocks } => {
                    let entries = match &bad_blocks {
                        Ok(Some(bb)) => Some(bb.entries().collect::<Vec<_>>()),
                        _ => None,
                    };
                    let mut v = examine_json(&dev.name, &sb, bitmap.as_deref(), entries.as_deref());
                    if let Err(e) = bad_blocks {
                        v["bad_blocks_error"] = e.to_string().into();
                        bad += 1;
                    }
                    v
                }
                MemberMetadata { offered: OfferedMember { superblock: Err(e), .. }, .. } => {
                    failed(e.to_string())
                }
            },
        };
        if v.get("error").is_some() {
            bad += 1;
        }
        out.push(v);
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    if bad > 0 {
        bail!("{bad} of {} members {} no usable md superblock", members.len(), has(bad));
    }
    Ok(())
}

/// "1 of 3 members has", "2 of 3 members have".
fn has(n: usize) -> &'static str {
    if n == 1 {
        "has"
    } else {
        "have"
    }
}
