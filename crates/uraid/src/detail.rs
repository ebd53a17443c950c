//! `uraid detail`: the array's detail, from its members (offline) or from a running
//! `uraid serve` through its control socket (`--control PATH`).

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use crate::array::assembly::assemble;
use crate::array::detail;
use crate::array::report::{detail_json, detail_text};

#[derive(Args, Clone, Debug)]
pub struct DetailArgs {
    /// Control socket of a running `uraid serve`.
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Print JSON (on a running array with each member's I/O counts).
    #[arg(long)]
    pub json: bool,
    /// One config line (`ARRAY NAME metadata=1.2 UUID=... devices=...`, mdadm.conf's form,
    /// with where it is served) for each array running on this machine (see `uraid list`):
    /// `uraid serve --scan NAME` reads them back.
    #[arg(long, conflicts_with_all = ["control", "json", "members"])]
    pub scan: bool,
    /// Member files or block devices (offline detail).
    pub members: Vec<PathBuf>,
}

pub fn run(args: DetailArgs) -> anyhow::Result<()> {
    if args.scan {
        for e in crate::list::running_entries() {
            println!("{}", array_line(&e));
        }
        return Ok(());
    }
    if let Some(sock) = &args.control {
        let reply = crate::control::request(sock, if args.json { "detail-json" } else { "detail" })?;
        print!("{reply}");
        return Ok(());
    }
    if args.members.is_empty() {
        bail!("give the array's members, or --control PATH for a running array");
    }
    // --run so a degraded array is described too; nothing is written either way.
    let a = assemble(&args.members, true, false, false)?;
    let info = detail::offline(&a);
    if args.json {
        print!("{}", detail_json(&a.plan.name, &info, &Vec::new(), &Vec::new()));
    } else {
        print!("{}", detail_text(&a.plan.name, &info));
    }
    Ok(())
}

/// A running array's config line: its members, and where it is served, so that
/// `serve --scan NAME` reading it back starts the same array on the same sockets.
fn array_line(e: &crate::list::Entry) -> String {
    let devices: Vec<String> = e.members.iter().map(|m| m.display().to_string()).collect();
    let mut line = format!("ARRAY {} metadata=1.2 UUID={} devices={}", e.name, e.uuid, devices.join(","));
    let export = if let Some(rest) = e.url.strip_prefix("nbd+unix:///") {
        rest.split_once("?socket=").map(|(export, socket)| {
            line += &format!(" unix={socket}");
            export
        })
    } else if let Some((addr, export)) = e.url.strip_prefix("nbd://").and_then(|r| r.split_once('/')) {
        line += &format!(" listen={addr}");
        Some(export)
    } else {
        None
    };
    if let Some(export) = export.filter(|x| !x.is_empty()) {
        line += &format!(" export-name={export}");
    }
    line + &format!(" control={}", e.control.display())
}
