//! `uraid list`: the arrays `uraid serve` runs on this machine. Each server leaves a small
//! JSON file in a run folder while it serves (`/run/uraid` for root, else
//! `$XDG_RUNTIME_DIR/uraid` or `/tmp/uraid-UID`; `URAID_RUN_DIR` overrides), removed when it
//! stops; an entry whose process is gone (a kill -9) is left out and removed by `list`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What a running server says of itself.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub uuid: String,
    /// `raid_level`, as `detail --json` names it.
    #[serde(rename = "raid_level", alias = "level")]
    pub level: String,
    pub pid: u32,
    pub control: PathBuf,
    pub url: String,
    pub members: Vec<PathBuf>,
}

fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("URAID_RUN_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid has no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/uraid");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("uraid"),
        None => PathBuf::from(format!("/tmp/uraid-{uid}")),
    }
}

/// The entry of a serving array; its file goes when this is dropped.
pub struct Registered(Option<PathBuf>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Writes `entry` to the run folder. A server that cannot (a read-only /run, say) still
/// serves: `list` then does not show it, and says nothing else is wrong.
pub fn register(entry: &Entry) -> Registered {
    let dir = run_dir();
    let path = dir.join(format!("{}-{}.json", entry.uuid.replace(':', ""), entry.pid));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(&path, serde_json::to_vec_pretty(entry).unwrap_or_default()));
    match written {
        Ok(()) => Registered(Some(path)),
        Err(e) => {
            eprintln!("uraid: cannot record this array in {} for `uraid list`: {e}", dir.display());
            Registered(None)
        }
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists (EPERM: it does, as another user's).
    let rc = unsafe { libc::kill(pid as i32, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Every entry file in `dir` with what it says, in name then pid order.
fn entries(dir: &Path) -> Vec<(PathBuf, Entry)> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(PathBuf, Entry)> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("json"))
        .filter_map(|p| {
            let e = serde_json::from_slice::<Entry>(&std::fs::read(&p).ok()?).ok()?;
            Some((p, e))
        })
        .collect();
    out.sort_by(|a, b| a.1.name.cmp(&b.1.name).then(a.1.pid.cmp(&b.1.pid)));
    out
}

/// The servers running now, without asking them anything.
pub fn running_entries() -> Vec<Entry> {
    entries(&run_dir()).into_iter().map(|(_, e)| e).filter(|e| alive(e.pid)).collect()
}

/// The servers still running, each with its state; the files of those that are not are
/// removed.
fn running(dir: &Path) -> Vec<(Entry, String)> {
    let mut out = Vec::new();
    for (path, entry) in entries(dir) {
        if !alive(entry.pid) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        // The state as `detail` gives it; a server between its start and its control
        // socket (or stopping) shows as such.
        let state = crate::control::request(&entry.control, "detail-json")
            .ok()
            .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok())
            .and_then(|v| v["state"].as_str().map(str::to_string))
            .unwrap_or_else(|| "starting or stopping".to_string());
        out.push((entry, state));
    }
    out
}

#[derive(clap::Args, Clone, Debug)]
pub struct ListArgs {
    /// A JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ListArgs) -> anyhow::Result<()> {
    let dir = run_dir();
    let arrays = running(&dir);
    if args.json {
        let v: Vec<serde_json::Value> = arrays
            .iter()
            .map(|(e, state)| {
                let mut v = serde_json::to_value(e).unwrap_or_default();
                v["state"] = state.clone().into();
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v).context("JSON")?);
        return Ok(());
    }
    if arrays.is_empty() {
        println!("no uraid array is running (none recorded in {})", dir.display());
        return Ok(());
    }
    println!("NAME\tUUID\tLEVEL\tSTATE\tPID\tCONTROL\tURL");
    for (e, state) in &arrays {
        println!(
            "{}\t{}\t{}\t{state}\t{}\t{}\t{}",
            e.name,
            e.uuid,
            e.level,
            e.pid,
            e.control.display(),
            e.url
        );
    }
    Ok(())
}
