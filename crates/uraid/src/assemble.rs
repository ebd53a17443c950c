//! `uraid assemble`: check that the members form a startable array and print its detail.
//! Writes nothing: the array starts (and metadata changes) only under `uraid serve`.

use std::path::PathBuf;

use clap::Args;

use crate::array::assembly::{assemble, resync_words};
use crate::array::detail;
use crate::array::report::{detail_text, sector_of};
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
    /// Check the arrays of the config file's ARRAY lines (only NAME's when given), their
    /// members found by UUID (mdadm --assemble --scan).
    #[arg(long, value_name = "NAME", num_args = 0..=1, conflicts_with = "members")]
    pub scan: Option<Option<String>>,
    /// The config file --scan reads.
    #[arg(long, default_value = crate::config::DEFAULT_PATH)]
    pub config: PathBuf,
    /// Member files or block devices, in any order.
    #[arg(required_unless_present = "scan")]
    pub members: Vec<PathBuf>,
}

pub fn run(args: AssembleArgs) -> anyhow::Result<()> {
    let Some(name) = &args.scan else { return check(&args, &args.members, "<members>") };
    let config = crate::config::Config::load(&args.config)?;
    let arrays = match name {
        Some(n) => vec![config.array(Some(n))?],
        None => config.arrays.iter().collect(),
    };
    let mut failed = 0;
    for (i, a) in arrays.iter().enumerate() {
        if i > 0 {
            println!();
        }
        let hint = format!("--scan {}", a.name);
        let checked = config.find_members(a).and_then(|members| check(&args, &members, &hint));
        if let Err(e) = checked {
            eprintln!("uraid: {}: {e:#}", a.name);
            failed += 1;
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of the {} arrays in {} cannot start", arrays.len(), config.path.display());
    }
    Ok(())
}

/// Checks one array; `serve_with` is what `uraid serve` would be given to serve it.
fn check(args: &AssembleArgs, members: &[PathBuf], serve_with: &str) -> anyhow::Result<()> {
    let a = assemble(members, args.run, args.force, false)?;
    for w in &a.plan.warnings {
        eprintln!("uraid: {w}");
    }
    print!("{}", detail_text(&a.plan.name, &detail::offline(&a)));
    if let Some(words) = resync_words(&a.plan) {
        let why = if matches!(a.plan.resync, ResyncNeed::Full { .. }) { " (no usable bitmap)" } else { "" };
        println!("\nOn start: {words}{why}");
    }
    let rebuilding: Vec<String> = a
        .plan
        .member_configs()
        .iter()
        .enumerate()
        .filter_map(|(s, m)| match m.state {
            uraid_core::MemberState::Recovering { recovery_offset_sectors } => {
                Some(format!("slot {s} from {}", sector_of(recovery_offset_sectors, a.plan.size_sectors)))
            }
            _ => None,
        })
        .collect();
    if !rebuilding.is_empty() {
        println!("On start: rebuild of {}", rebuilding.join(", "));
    }
    println!(
        "\nuraid: the array can start: `uraid serve{}{} {serve_with}` serves it",
        if args.run { " --run" } else { "" },
        if args.force { " --force" } else { "" }
    );
    Ok(())
}
