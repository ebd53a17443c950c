//! The config file (`/etc/uraid.conf`, or `--config FILE`): mdadm.conf's syntax, read by
//! `serve --scan` and `assemble --scan`, written by `detail --scan`.
//!
//! ```text
//! DEVICE /dev/disk/by-id/ata-* /srv/raid/*.img
//! ARRAY host:data metadata=1.2 UUID=3aa5e1f2:... devices=/dev/sdb,/dev/sdc listen=0.0.0.0:10809
//! PROGRAM /usr/local/sbin/raid-alert
//! ```
//!
//! A line starting with blanks continues the one before; `#` starts a comment; keywords
//! and option names are case-insensitive. An array's members are found by its UUID among
//! the devices its `devices=` and the DEVICE lines name (globs), or among the block devices
//! in /proc/partitions when there is no DEVICE line (mdadm's `DEVICE partitions`). Only a
//! device whose superblock carries that UUID becomes a member: a scan opens the others
//! read-only, reads their superblock area and writes nothing to them.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use uraid_core::meta::superblock::{format_uuid, parse_uuid};

use crate::array::member::MemberDev;

pub const DEFAULT_PATH: &str = "/etc/uraid.conf";

/// One ARRAY line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArrayLine {
    /// The line number, for messages.
    pub line: usize,
    /// The first word: the array's name as `detail --scan` prints it (`host:name`).
    pub name: String,
    pub uuid: [u8; 16],
    /// `devices=`: paths or globs, in the order given.
    pub devices: Vec<String>,
    /// uraid's own: where and how `serve --scan` serves it.
    pub listen: Option<String>,
    pub unix: Option<PathBuf>,
    pub export_name: Option<String>,
    pub control: Option<PathBuf>,
    /// mdadm's `spares=`: the monitor says SparesMissing when the array has fewer.
    pub spares: Option<usize>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    pub path: PathBuf,
    /// DEVICE lines' words: globs, or `partitions`.
    pub device_globs: Vec<String>,
    pub arrays: Vec<ArrayLine>,
    /// PROGRAM: the monitor program `serve --scan` runs on events.
    pub program: Option<PathBuf>,
}

/// mdadm.conf's ARRAY options uraid takes and does not need: accepted so an mdadm.conf
/// line reads as it is.
const MDADM_ARRAY_TAGS: &[&str] =
    &["name", "level", "num-devices", "auto", "bitmap", "spare-group", "container", "member"];
/// mdadm.conf's keywords with no meaning here: a warning each, not an error.
const MDADM_IGNORED: &[&str] =
    &["MAILADDR", "MAILFROM", "HOMEHOST", "AUTO", "CREATE", "POLICY", "PART-POLICY"];

impl Config {
    /// Reads `path`; a missing file is an error that says how to make one.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow!(
                "cannot read the config file {}: {}; `uraid detail --scan > {}` writes one for the \
                 arrays running now, or give --config FILE",
                path.display(),
                crate::array::io_words(&e),
                path.display()
            )
        })?;
        let mut c = Config::parse(&text, path)?;
        c.path = path.to_path_buf();
        Ok(c)
    }

    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Config> {
        let mut c = Config::default();
        let at = |n: usize| format!("{} line {n}", path.display());
        for (n, words) in logical_lines(text) {
            let Some((keyword, rest)) = words.split_first() else { continue };
            match keyword.to_ascii_uppercase().as_str() {
                "DEVICE" | "DEV" => c.device_globs.extend(rest.iter().cloned()),
                "ARRAY" => {
                    let a = parse_array(n, rest).map_err(|e| anyhow!("{}: {e}", at(n)))?;
                    if let Some(same) = c.arrays.iter().find(|b| b.uuid == a.uuid || b.name == a.name) {
                        bail!(
                            "{}: array {} repeats the name or UUID of line {}: give each array one \
                             ARRAY line",
                            at(n),
                            a.name,
                            same.line
                        );
                    }
                    c.arrays.push(a);
                }
                "PROGRAM" | "PROG" => match rest {
                    [p] => c.program = Some(PathBuf::from(p)),
                    _ => bail!("{}: PROGRAM takes one path (the program run on events)", at(n)),
                },
                k if MDADM_IGNORED.contains(&k) => {
                    eprintln!(
                        "uraid: {}: {k} is mdadm's and ignored here (uraid runs a PROGRAM on events)",
                        at(n)
                    );
                }
                _ => bail!(
                    "{}: unknown keyword {keyword:?}: lines start with ARRAY, DEVICE or PROGRAM \
                     (docs/operations.md)",
                    at(n)
                ),
            }
        }
        Ok(c)
    }

    /// The ARRAY line `name` names (its first word, the part after `host:`, or its
    /// `name=`), or the only one when `name` is none.
    pub fn array(&self, name: Option<&str>) -> anyhow::Result<&ArrayLine> {
        let names = || self.arrays.iter().map(|a| a.name.as_str()).collect::<Vec<_>>().join(", ");
        match name {
            None => match self.arrays.as_slice() {
                [a] => Ok(a),
                [] => bail!("{} has no ARRAY line", self.path.display()),
                _ => {
                    bail!("{} lists several arrays ({}): name the one to serve", self.path.display(), names())
                }
            },
            Some(want) => self
                .arrays
                .iter()
                .find(|a| a.name == want || a.name.rsplit(':').next() == Some(want))
                .ok_or_else(|| {
                    anyhow!("{} has no ARRAY {want} (it lists: {})", self.path.display(), names())
                }),
        }
    }

    /// The members of `a`: every device its `devices=` and the DEVICE lines name whose
    /// superblock carries its UUID, each once, in path order.
    pub fn find_members(&self, a: &ArrayLine) -> anyhow::Result<Vec<PathBuf>> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        for pattern in &a.devices {
            // An NBD URI names one export, not a pattern (its `?socket=` is no wildcard).
            if crate::array::nbd_member::is_nbd_uri(pattern) {
                candidates.push(PathBuf::from(pattern));
                continue;
            }
            let found = glob(pattern);
            if found.is_empty() {
                eprintln!("uraid: {}: {pattern} (devices= of line {}) names nothing", a.name, a.line);
            }
            candidates.extend(found);
        }
        if self.device_globs.is_empty() {
            candidates.extend(partitions());
        }
        for pattern in &self.device_globs {
            match pattern.as_str() {
                "partitions" => candidates.extend(partitions()),
                "containers" => {}
                p => candidates.extend(glob(p)),
            }
        }
        let mut members: Vec<(PathBuf, (u64, u64))> = Vec::new();
        for path in candidates {
            // Read-only: a device that is not this array's is never opened for writing.
            let Ok(dev) = MemberDev::open(&path, false) else { continue };
            let Ok(sb) = dev.metadata().offered.superblock else { continue };
            if sb.set_uuid != a.uuid || members.iter().any(|(_, id)| *id == dev.identity) {
                continue;
            }
            members.push((path, dev.identity));
        }
        if members.is_empty() {
            bail!(
                "no device with the UUID {} of {} (line {}) among {}: check the UUID (`uraid examine \
                 MEMBER` shows it) and the devices= and DEVICE globs",
                format_uuid(&a.uuid),
                a.name,
                a.line,
                self.searched(a)
            );
        }
        let mut paths: Vec<PathBuf> = members.into_iter().map(|(p, _)| p).collect();
        paths.sort();
        Ok(paths)
    }

    fn searched(&self, a: &ArrayLine) -> String {
        let mut where_: Vec<String> = a.devices.clone();
        if self.device_globs.is_empty() {
            where_.push("/proc/partitions".into());
        }
        where_.extend(self.device_globs.iter().cloned());
        where_.join(" ")
    }
}

/// The file's lines as words, continuation lines joined and comments dropped, each with
/// the number of the line it starts on.
fn logical_lines(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out: Vec<(usize, Vec<String>)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        if words.is_empty() {
            continue;
        }
        let continues = raw.starts_with([' ', '\t']);
        match out.last_mut() {
            Some((_, prev)) if continues => prev.extend(words),
            _ => out.push((i + 1, words)),
        }
    }
    out
}

fn parse_array(line: usize, words: &[String]) -> anyhow::Result<ArrayLine> {
    let Some((name, options)) = words.split_first().filter(|(n, _)| !n.contains('=')) else {
        bail!("ARRAY needs the array's name first, then UUID=... (as `uraid detail --scan` prints)");
    };
    let mut a = ArrayLine { line, name: name.clone(), ..ArrayLine::default() };
    let mut uuid = None;
    for w in options {
        let Some((key, value)) = w.split_once('=') else {
            bail!("ARRAY {name}: {w:?} is not an option: options are KEY=VALUE, e.g. UUID=...");
        };
        if value.is_empty() {
            bail!("ARRAY {name}: {key}= has no value");
        }
        match key.to_ascii_lowercase().as_str() {
            "uuid" => {
                uuid = Some(parse_uuid(value).ok_or_else(|| {
                    anyhow!("ARRAY {name}: UUID={value} is not 32 hex digits (mdadm's form: 8:8:8:8)")
                })?)
            }
            "devices" => a.devices.extend(value.split(',').filter(|d| !d.is_empty()).map(str::to_string)),
            "metadata" => {
                if !matches!(value, "1" | "1.0" | "1.1" | "1.2" | "default") {
                    bail!("ARRAY {name}: metadata={value}: uraid reads md's 1.x superblocks only");
                }
            }
            "listen" => a.listen = Some(value.to_string()),
            "unix" => a.unix = Some(PathBuf::from(value)),
            "export-name" => a.export_name = Some(value.to_string()),
            "control" => a.control = Some(PathBuf::from(value)),
            "spares" => {
                a.spares =
                    Some(value.parse().map_err(|_| {
                        anyhow!("ARRAY {name}: spares={value} is not a number of spare devices")
                    })?)
            }
            k if MDADM_ARRAY_TAGS.contains(&k) => {}
            _ => bail!(
                "ARRAY {name}: unknown option {key}=: uraid takes UUID=, devices=, metadata=, listen=, \
                 unix=, export-name=, control=, spares= (and mdadm's {})",
                MDADM_ARRAY_TAGS.iter().map(|t| format!("{t}=")).collect::<Vec<_>>().join(", ")
            ),
        }
    }
    a.uuid = uuid.ok_or_else(|| {
        anyhow!(
            "ARRAY {name} has no UUID=: uraid finds members by the array's UUID (`uraid examine MEMBER` \
             shows it as Array UUID)"
        )
    })?;
    if a.listen.is_some() && a.unix.is_some() {
        bail!("ARRAY {name}: listen= and unix= both given: the array is served on one of them");
    }
    Ok(a)
}

/// POSIX glob(3), as mdadm expands DEVICE lines: the paths `pattern` matches, sorted; a
/// pattern without wildcards is itself when it exists.
fn glob(pattern: &str) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(pattern) else { return Vec::new() };
    // SAFETY: a zeroed glob_t is glob(3)'s documented starting state; the paths are read
    // before globfree releases them.
    unsafe {
        let mut g: libc::glob_t = std::mem::zeroed();
        let mut out = Vec::new();
        if libc::glob(c.as_ptr(), 0, None, &mut g) == 0 {
            for i in 0..g.gl_pathc {
                let p = *g.gl_pathv.add(i);
                if !p.is_null() {
                    let bytes = std::ffi::CStr::from_ptr(p).to_bytes();
                    out.push(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)));
                }
            }
        }
        libc::globfree(&mut g);
        out
    }
}

/// The block devices /proc/partitions lists (mdadm's `DEVICE partitions`).
fn partitions() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/partitions").unwrap_or_default();
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().nth(3))
        .map(|n| Path::new("/dev").join(n))
        .filter(|p| p.exists())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "3aa5e1f2:0b1c2d3e:4f506172:8394a5b6";

    fn parse(text: &str) -> anyhow::Result<Config> {
        Config::parse(text, Path::new("t.conf"))
    }

    #[test]
    fn detail_scans_lines_read_back_with_mdadms_syntax() {
        let c = parse(&format!(
            "# made by uraid detail --scan\n\
             DEVICE /dev/disk/by-id/ata-* partitions\n\
             ARRAY host:data metadata=1.2 UUID={UUID} devices=/srv/a,/srv/b spares=1\n\
             \tlisten=0.0.0.0:10810 export-name=data   # the served side\n\
             array other uuid={} level=raid1 num-devices=2\n\
             PROGRAM /usr/local/sbin/alert\n",
            UUID.replace(':', "-").replace('3', "4")
        ))
        .unwrap();
        assert_eq!(c.device_globs, ["/dev/disk/by-id/ata-*", "partitions"]);
        assert_eq!(c.program.as_deref(), Some(Path::new("/usr/local/sbin/alert")));
        let a = c.array(Some("data")).unwrap();
        assert_eq!((a.line, a.name.as_str(), format_uuid(&a.uuid)), (3, "host:data", UUID.to_string()));
        assert_eq!(a.devices, ["/srv/a", "/srv/b"]);
        assert_eq!(a.spares, Some(1));
        assert_eq!((a.listen.as_deref(), a.export_name.as_deref()), (Some("0.0.0.0:10810"), Some("data")));
        assert_eq!(c.array(Some("host:data")).unwrap().line, 3);
        assert!(c.array(None).unwrap_err().to_string().contains("several arrays"));
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number_and_what_to_do() {
        let err = |text: &str| parse(text).unwrap_err().to_string();
        let e = err(&format!("\nARRAY a UUID={UUID}\nARRAY b devices=/dev/x\n"));
        assert!(e.starts_with("t.conf line 3: ARRAY b has no UUID=") && e.contains("uraid examine"), "{e}");
        let e = err("ARRAY a UUID=12345\n");
        assert!(e.contains("line 1") && e.contains("not 32 hex digits"), "{e}");
        let e = err(&format!("ARRAY a UUID={UUID} lvel=5\n"));
        assert!(e.contains("unknown option lvel=") && e.contains("devices="), "{e}");
        let e = err("ARAY a\n");
        assert!(e.contains("line 1: unknown keyword \"ARAY\""), "{e}");
        let e = err(&format!("ARRAY a UUID={UUID}\nARRAY b UUID={UUID}\n"));
        assert!(e.contains("line 2") && e.contains("line 1"), "{e}");
        let e = err(&format!("ARRAY UUID={UUID}\n"));
        assert!(e.contains("name first"), "{e}");
        let e = err(&format!("ARRAY a UUID={UUID} metadata=0.90\n"));
        assert!(e.contains("1.x superblocks only"), "{e}");
        let e = err(&format!("ARRAY a UUID={UUID} spares=two\n"));
        assert!(e.contains("spares=two is not a number"), "{e}");
    }
}
