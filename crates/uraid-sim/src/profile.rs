//! Disk profiles: data, not code. Each shipped profile is a TOML file in
//! `crates/uraid-sim/profiles/` (embedded with `include_str!`); users can load their own
//! with [`DiskProfile::parse`]. The fields are documented in the shipped files and on
//! [`HddProfile`] / [`SsdProfile`].
//!
//! Only the flat subset of TOML a profile needs is read (`key = value` lines with
//! integers, floats, booleans and strings, `#` comments), so the crate does not pull a
//! TOML and serde stack for a dozen numbers. An unknown key is an error, so a typo does not
//! silently leave a default in place.

use std::collections::BTreeMap;

/// A rotating disk after Ruemmler & Wilkes 1994.
#[derive(Clone, Debug, PartialEq)]
pub struct HddProfile {
    pub name: String,
    pub capacity_bytes: u64,
    pub rpm: u32,
    /// Cylinders from the outer to the inner edge (the seek curve's x axis).
    pub cylinders: u64,
    /// Recording zones of equal cylinder count; transfer rate falls linearly from outer to inner.
    pub zones: u32,
    pub outer_rate_bytes_per_s: u64,
    pub inner_rate_bytes_per_s: u64,
    /// Seek over one cylinder.
    pub seek_track_to_track_ns: u64,
    /// Seek over a third of the cylinders: what data sheets call "average seek". Short seeks
    /// (up to this distance) follow a + b*sqrt(d), longer ones a line up to the full stroke.
    pub seek_third_stroke_ns: u64,
    pub seek_full_stroke_ns: u64,
    /// Extra settling before a write may start.
    pub write_settle_ns: u64,
    /// Controller time per command (command decode, status).
    pub command_overhead_ns: u64,
    /// Interface rate for data served from or into the drive's buffer.
    pub bus_rate_bytes_per_s: u64,
    /// Read-ahead segments in the drive's buffer (LRU).
    pub cache_segments: u32,
    /// How far the drive reads ahead of the last read into its segment.
    pub readahead_bytes: u64,
    /// Commands the drive holds and reorders (NCQ); 1 = no reordering.
    pub ncq_depth: u32,
    /// A queued command older than this is served next regardless of position (starvation bound).
    pub max_queue_wait_ns: u64,
    /// Write-back cache: writes are volatile until a flush.
    pub write_cache: bool,
    pub flush_ns: u64,
    /// The read buffer keeps data the host has read (true), or only what it has read
    /// ahead of the host (a ring the host's reads consume), so that reading a range again
    /// goes back to the media. Optional in a profile file; true when absent.
    pub keeps_read_data: bool,
}

/// A flash device: parallel channels, fixed latencies, one shared link.
#[derive(Clone, Debug, PartialEq)]
pub struct SsdProfile {
    pub name: String,
    pub capacity_bytes: u64,
    /// Commands served concurrently (flash channels x dies the controller keeps busy).
    pub channels: u32,
    pub read_latency_ns: u64,
    pub write_latency_ns: u64,
    /// Host link rate (SATA 6G, PCIe lanes); transfers share it one after another.
    pub link_rate_bytes_per_s: u64,
    /// Commands the device accepts at once (SATA NCQ 32, NVMe far more).
    pub queue_depth: u32,
    pub write_cache: bool,
    pub flush_ns: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum DiskProfile {
    Hdd(HddProfile),
    Ssd(SsdProfile),
}

pub const BUILTIN_PROFILES: &[(&str, &str)] = &[
    ("hdd-7200-2009", include_str!("../profiles/hdd-7200-2009.toml")),
    ("hdd-7200-2014", include_str!("../profiles/hdd-7200-2014.toml")),
    ("ssd-sata", include_str!("../profiles/ssd-sata.toml")),
    ("nvme", include_str!("../profiles/nvme.toml")),
    ("hdd-sas-7200-2014", include_str!("../profiles/hdd-sas-7200-2014.toml")),
    ("hdd-7200-2008", include_str!("../profiles/hdd-7200-2008.toml")),
];

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Int(u64),
    Float(f64),
    Bool(bool),
    Str(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileError(pub String);

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "disk profile: {}", self.0)
    }
}
impl std::error::Error for ProfileError {}

pub(crate) fn parse_flat_toml(text: &str) -> Result<BTreeMap<String, Value>, ProfileError> {
    let mut out = BTreeMap::new();
    for (lineno, raw) in text.lines().enumerate() {
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        let err = |m: &str| ProfileError(format!("line {}: {m}: {raw:?}", lineno + 1));
        let (key, value) = line.split_once('=').ok_or_else(|| err("expected key = value"))?;
        let key = key.trim();
        let value = value.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(err("bad key"));
        }
        let parsed = if let Some(s) = value.strip_prefix('"') {
            Value::Str(s.strip_suffix('"').ok_or_else(|| err("unterminated string"))?.to_string())
        } else if value == "true" || value == "false" {
            Value::Bool(value == "true")
        } else {
            let digits: String = value.chars().filter(|&c| c != '_').collect();
            if let Ok(i) = digits.parse::<u64>() {
                Value::Int(i)
            } else if let Ok(f) = digits.parse::<f64>() {
                Value::Float(f)
            } else {
                return Err(err("value is not a number, boolean or string"));
            }
        };
        if out.insert(key.to_string(), parsed).is_some() {
            return Err(err("duplicate key"));
        }
    }
    Ok(out)
}

fn strip_comment(line: &str) -> &str {
    let mut in_str = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_str = !in_str,
            '#' if !in_str => return &line[..i],
            _ => {}
        }
    }
    line
}

/// A parsed profile's fields, taken one by one; what is left over is an error.
pub(crate) struct Fields {
    pub(crate) map: BTreeMap<String, Value>,
}

impl Fields {
    pub(crate) fn take(&mut self, key: &str) -> Result<Value, ProfileError> {
        self.map.remove(key).ok_or_else(|| ProfileError(format!("missing field `{key}`")))
    }
    pub(crate) fn u64(&mut self, key: &str) -> Result<u64, ProfileError> {
        match self.take(key)? {
            Value::Int(i) => Ok(i),
            // Data sheets give e.g. 8.5 ms; allow exact-integer floats only.
            Value::Float(f) if f >= 0.0 && f.fract() == 0.0 => Ok(f as u64),
            v => Err(ProfileError(format!("field `{key}` must be a non-negative integer, got {v:?}"))),
        }
    }
    pub(crate) fn u32(&mut self, key: &str) -> Result<u32, ProfileError> {
        let v = self.u64(key)?;
        u32::try_from(v).map_err(|_| ProfileError(format!("field `{key}` too large")))
    }
    pub(crate) fn f64(&mut self, key: &str) -> Result<f64, ProfileError> {
        match self.take(key)? {
            Value::Int(i) => Ok(i as f64),
            Value::Float(f) if f.is_finite() && f >= 0.0 => Ok(f),
            v => Err(ProfileError(format!("field `{key}` must be a non-negative number, got {v:?}"))),
        }
    }
    pub(crate) fn bool(&mut self, key: &str) -> Result<bool, ProfileError> {
        match self.take(key)? {
            Value::Bool(b) => Ok(b),
            v => Err(ProfileError(format!("field `{key}` must be true or false, got {v:?}"))),
        }
    }
    pub(crate) fn string(&mut self, key: &str) -> Result<String, ProfileError> {
        match self.take(key)? {
            Value::Str(s) => Ok(s),
            v => Err(ProfileError(format!("field `{key}` must be a string, got {v:?}"))),
        }
    }
    pub(crate) fn finish(self) -> Result<(), ProfileError> {
        if let Some(k) = self.map.keys().next() {
            return Err(ProfileError(format!("unknown field `{k}`")));
        }
        Ok(())
    }
}

fn positive(name: &str, v: u64) -> Result<u64, ProfileError> {
    if v == 0 {
        return Err(ProfileError(format!("field `{name}` must be > 0")));
    }
    Ok(v)
}

impl DiskProfile {
    /// One of the shipped profiles by name (`hdd-7200-2009`, `hdd-7200-2014`, `ssd-sata`, `nvme`, ...).
    pub fn builtin(name: &str) -> Result<DiskProfile, ProfileError> {
        let text = BUILTIN_PROFILES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t).ok_or_else(|| {
            let names: Vec<&str> = BUILTIN_PROFILES.iter().map(|(n, _)| *n).collect();
            ProfileError(format!("no built-in profile {name:?}; known: {}", names.join(", ")))
        })?;
        DiskProfile::parse(text)
    }

    pub fn parse(text: &str) -> Result<DiskProfile, ProfileError> {
        let mut f = Fields { map: parse_flat_toml(text)? };
        let kind = f.string("kind")?;
        let profile = match kind.as_str() {
            "hdd" => {
                let p = HddProfile {
                    name: f.string("name")?,
                    capacity_bytes: positive("capacity_bytes", f.u64("capacity_bytes")?)?,
                    rpm: positive("rpm", f.u32("rpm")? as u64)? as u32,
                    cylinders: positive("cylinders", f.u64("cylinders")?)?,
                    zones: positive("zones", f.u32("zones")? as u64)? as u32,
                    outer_rate_bytes_per_s: positive(
                        "outer_rate_bytes_per_s",
                        f.u64("outer_rate_bytes_per_s")?,
                    )?,
                    inner_rate_bytes_per_s: positive(
                        "inner_rate_bytes_per_s",
                        f.u64("inner_rate_bytes_per_s")?,
                    )?,
                    seek_track_to_track_ns: f.u64("seek_track_to_track_ns")?,
                    seek_third_stroke_ns: f.u64("seek_third_stroke_ns")?,
                    seek_full_stroke_ns: f.u64("seek_full_stroke_ns")?,
                    write_settle_ns: f.u64("write_settle_ns")?,
                    command_overhead_ns: f.u64("command_overhead_ns")?,
                    bus_rate_bytes_per_s: positive("bus_rate_bytes_per_s", f.u64("bus_rate_bytes_per_s")?)?,
                    cache_segments: f.u32("cache_segments")?,
                    readahead_bytes: f.u64("readahead_bytes")?,
                    ncq_depth: positive("ncq_depth", f.u32("ncq_depth")? as u64)? as u32,
                    max_queue_wait_ns: f.u64("max_queue_wait_ns")?,
                    write_cache: f.bool("write_cache")?,
                    flush_ns: f.u64("flush_ns")?,
                    keeps_read_data: if f.map.contains_key("keeps_read_data") {
                        f.bool("keeps_read_data")?
                    } else {
                        true
                    },
                };
                if p.seek_track_to_track_ns > p.seek_third_stroke_ns
                    || p.seek_third_stroke_ns > p.seek_full_stroke_ns
                {
                    return Err(ProfileError(
                        "seek times must grow: track-to-track <= third stroke <= full stroke".into(),
                    ));
                }
                if p.cylinders < 3 {
                    return Err(ProfileError("cylinders must be at least 3".into()));
                }
                DiskProfile::Hdd(p)
            }
            "ssd" => DiskProfile::Ssd(SsdProfile {
                name: f.string("name")?,
                capacity_bytes: positive("capacity_bytes", f.u64("capacity_bytes")?)?,
                channels: positive("channels", f.u32("channels")? as u64)? as u32,
                read_latency_ns: f.u64("read_latency_ns")?,
                write_latency_ns: f.u64("write_latency_ns")?,
                link_rate_bytes_per_s: positive("link_rate_bytes_per_s", f.u64("link_rate_bytes_per_s")?)?,
                queue_depth: positive("queue_depth", f.u32("queue_depth")? as u64)? as u32,
                write_cache: f.bool("write_cache")?,
                flush_ns: f.u64("flush_ns")?,
            }),
            other => return Err(ProfileError(format!("kind must be \"hdd\" or \"ssd\", got {other:?}"))),
        };
        f.finish()?;
        Ok(profile)
    }

    pub fn name(&self) -> &str {
        match self {
            DiskProfile::Hdd(p) => &p.name,
            DiskProfile::Ssd(p) => &p.name,
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        match self {
            DiskProfile::Hdd(p) => p.capacity_bytes,
            DiskProfile::Ssd(p) => p.capacity_bytes,
        }
    }

    pub fn write_cache(&self) -> bool {
        match self {
            DiskProfile::Hdd(p) => p.write_cache,
            DiskProfile::Ssd(p) => p.write_cache,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse() {
        for (name, _) in BUILTIN_PROFILES {
            let p = DiskProfile::builtin(name).unwrap();
            assert_eq!(p.name(), *name);
        }
    }

    #[test]
    fn typos_and_bad_values_are_errors() {
        let good = BUILTIN_PROFILES[2].1;
        assert!(DiskProfile::parse(&format!("{good}\nchanels = 3\n")).is_err());
        assert!(DiskProfile::parse(&good.replace("kind = \"ssd\"", "kind = \"tape\"")).is_err());
        assert!(DiskProfile::parse("kind = \"ssd\"\nname = \"x\"").is_err());
        assert!(DiskProfile::parse("kind = ssd").is_err());
    }
}
