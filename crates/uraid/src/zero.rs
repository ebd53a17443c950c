//! `uraid zero-superblock`: erase the md superblock of members that are not in use (mdadm
//! --zero-superblock), so they are no longer taken for members of their array. Every
//! member is checked first (claimed as md claims its members, its superblock found); one
//! refused leaves all of them as they were.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

use crate::array::member::MemberDev;
use uraid_core::meta::superblock::{format_uuid, SB_BYTES};

#[derive(Args, Clone, Debug)]
pub struct ZeroArgs {
    /// Member files or block devices. Refused for any that a running array (uraid's or the
    /// kernel's md) or a mount holds, or that has no md superblock.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

pub fn run(args: ZeroArgs) -> anyhow::Result<()> {
    let mut found = Vec::new();
    for p in &args.members {
        let dev = MemberDev::open_claimed(p)?;
        let sb = match dev.superblock() {
            Ok(sb) => sb,
            Err(e) => bail!("{}: no md superblock to erase ({e}); nothing was written", dev.name),
        };
        found.push((dev, sb));
    }
    for (dev, sb) in &found {
        let at = sb.super_offset * 512;
        dev.write_at(at, &[0u8; SB_BYTES])
            .and_then(|_| dev.sync())
            .with_context(|| format!("{}: erasing the superblock at byte {at}", dev.name))?;
        eprintln!(
            "uraid: {}: superblock of array {} ({}) erased; its data is untouched",
            dev.name,
            format_uuid(&sb.set_uuid),
            sb.name()
        );
    }
    Ok(())
}
