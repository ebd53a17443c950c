//! `uraid monitor`: mdadm --monitor for a running array, from outside its server. It polls
//! the control socket for the looks the server's own events compare (`array::events`),
//! and reports what changed the same way: on stderr, and to `--program` as
//! `PROGRAM EVENT ARRAY [MEMBER]`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use crate::array::events::{Events, Seen};

#[derive(Args, Clone, Debug)]
pub struct MonitorArgs {
    /// Control socket of the running `uraid serve`.
    #[arg(long)]
    pub control: PathBuf,
    /// Run as `PATH EVENT ARRAY [MEMBER]` on each event (mdadm --monitor --program).
    #[arg(long)]
    pub program: Option<PathBuf>,
    /// A TestMessage event at start, to check the program runs (mdadm --test).
    #[arg(long)]
    pub test: bool,
    /// Look once, report an array already degraded (and TestMessage with --test), exit
    /// (mdadm --oneshot).
    #[arg(long = "oneshot", short = '1')]
    pub oneshot: bool,
    /// SparesMissing at the first look when the array has fewer spares than N (mdadm.conf's
    /// `spares=N`).
    #[arg(long = "expect-spares", value_name = "N")]
    pub expect_spares: Option<usize>,
    /// Seconds between looks (mdadm --delay).
    #[arg(long, default_value = "1", value_parser = parse_delay)]
    pub delay: Duration,
}

fn parse_delay(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.05..=86_400.0).contains(&x) => Ok(Duration::from_secs_f64(x)),
        _ => Err(format!("{s:?}: give seconds between 0.05 and 86400")),
    }
}

/// One look through the control socket: the array's name and what it looked like.
fn look(args: &MonitorArgs) -> anyhow::Result<(String, Seen)> {
    let reply = crate::control::request(&args.control, "monitor")?;
    let v: serde_json::Value = serde_json::from_str(&reply).context("the server's look is not JSON")?;
    let array = v["array"].as_str().context("the server's look names no array")?.to_string();
    let seen = serde_json::from_value(v["seen"].clone()).context("the server's look")?;
    Ok((array, seen))
}

pub fn run(args: MonitorArgs) -> anyhow::Result<()> {
    // The first look must succeed: a wrong socket is an error, not a quiet wait.
    let (array, first) = look(&args)?;
    eprintln!("uraid: monitoring {array} through {}", args.control.display());
    let mut events = Events::new(&array, args.program.clone(), args.expect_spares);
    if args.test {
        events.test_message();
    }
    events.look(first);
    if args.oneshot {
        events.finish();
        return Ok(());
    }
    // Until killed, as mdadm --monitor. A server that stops is reported once
    // (DeviceDisappeared ARRAY); one that comes back on the socket is watched again from
    // a fresh first look.
    loop {
        std::thread::sleep(args.delay);
        match look(&args) {
            Ok((_, seen)) => events.look(seen),
            Err(_) => events.disappeared(),
        }
    }
}
