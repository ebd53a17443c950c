//! `uraid examine`: print each member's md superblock, as mdadm --examine.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use crate::array::member::MemberDev;
use crate::array::report::{bad_blocks_text, examine_text};
use uraid_core::meta::{MemberMetadata, OfferedMember};

#[derive(Args, Clone, Debug)]
pub struct ExamineArgs {
    /// Member files or block devices.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

pub fn run(args: ExamineArgs) -> anyhow::Result<()> {
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
        bail!("{bad} of {} members have no usable md superblock", args.members.len());
    }
    Ok(())
}
