//! `uraid assemble`: check that the members form a startable array and print its detail.
//! Writes nothing: the array starts (and metadata changes) only under `uraid serve`.

use std::path::PathBuf;

use clap::Args;

use crate::array::assembly::assemble;
use crate::array::detail;
use crate::array::report::{count, detail_text};
use uraid_core::meta::ResyncNeed;

#[derive(Args, Clone, Debug)]
pub struct AssembleArgs {
    /// Start even when members are missing (degraded).
    #[arg(long, short = 'R')]
    pub run: bool,
    /// mdadm's --force: a dirty degraded raid4/5/6, or members a few events behind (see
    /// `uraid serve --force`); nothing is written here either.
    #[arg(long, short = 'f')]
    pub force: bool,
    /// Member files or block devices, in any order.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

pub fn run(args: AssembleArgs) -> anyhow::Result<()> {
    let a = assemble(&args.members, args.run, args.force, false)?;
    for w in &a.plan.warnings {
        eprintln!("uraid: {w}");
    }
    print!("{}", detail_text(&a.plan.name, &detail::offline(&a)));
    match &a.plan.resync {
        ResyncNeed::None => {}
        ResyncNeed::Full { from_sector } => {
            println!("\nOn start: full resync from sector {from_sector} (no usable bitmap)")
        }
        ResyncNeed::Bitmap { regions: r } => {
            let sectors: u64 = r.iter().map(|(_, l)| l).sum();
            println!("\nOn start: bitmap resync of {}, {sectors} sectors", count(r.len(), "region"))
        }
    }
    let rebuilding: Vec<String> = a
        .plan
        .member_configs()
        .iter()
        .enumerate()
        .filter_map(|(s, m)| match m.state {
            uraid_core::MemberState::Recovering { recovery_offset_sectors } => {
                Some(format!("slot {s} from sector {recovery_offset_sectors}"))
            }
            _ => None,
        })
        .collect();
    if !rebuilding.is_empty() {
        println!("On start: rebuild of {}", rebuilding.join(", "));
    }
    println!(
        "\nuraid: the array can start: `uraid serve{}{} <members>` serves it",
        if args.run { " --run" } else { "" },
        if args.force { " --force" } else { "" }
    );
    Ok(())
}
