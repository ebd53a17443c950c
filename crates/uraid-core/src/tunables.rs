//! md's run-time tunables as one table: each with md's sysfs name, what it does, the
//! levels that have it, how its value is read and written. `uraid serve`'s flags, the
//! control socket's `set`, the engine's checks and the messages all go through it, so a
//! range or a default is written once. The fields themselves are [`Tunables`].

use crate::config::SyncPolicy;
use crate::config::Tunables;
use crate::geometry::Level;
use crate::mirror::Balance;

/// One tunable of a running array.
pub struct TunableSpec {
    /// md's sysfs name (`/sys/block/mdX/md/NAME`).
    pub name: &'static str,
    pub help: &'static str,
    /// Whether arrays of this level have it (md has no stripe cache on a mirror).
    pub applies_to: fn(Level) -> bool,
    pub get: fn(&Tunables) -> String,
    /// Parses `value` into the tunable, checking its own range.
    pub set: fn(&mut Tunables, &str) -> Result<(), String>,
}

fn parity(level: Level) -> bool {
    level.has_parity()
}

fn mirror(level: Level) -> bool {
    matches!(level, Level::Raid1 | Level::Raid10)
}

fn redundant(level: Level) -> bool {
    level != Level::Raid0
}

/// Every level: a raid0 has no sync of its own, but its grow runs a reshape as a raid4,
/// whose rate these bound (md's knobs there).
fn any(_: Level) -> bool {
    true
}

fn number(name: &str, value: &str) -> Result<u64, String> {
    value.trim().parse().map_err(|_| format!("{name}: {value:?} is not a whole number"))
}

/// md's sync_speed_min/max: a positive KiB/s, or `system` for the default.
fn sync_speed(name: &str, value: &str, default_kib: u64) -> Result<u64, String> {
    if value.trim() == "system" {
        return Ok(default_kib);
    }
    match number(name, value)? {
        0 => Err(format!("{name} must be at least 1 KiB/s (or `system` for md's default, {default_kib})")),
        kib => Ok(kib),
    }
}

/// md's limits on `stripe_cache_size` (raid5_set_cache_size refuses 16 and below).
pub const STRIPE_CACHE_SIZE_RANGE: std::ops::RangeInclusive<usize> = 17..=32768;

pub const TUNABLES: &[TunableSpec] = &[
    TunableSpec {
        name: "stripe_cache_size",
        help: "stripe heads in the stripe cache (17-32768)",
        applies_to: parity,
        get: |t| t.stripe_cache_size.to_string(),
        set: |t, v| {
            let n = number("stripe_cache_size", v)?;
            match usize::try_from(n) {
                Ok(n) if STRIPE_CACHE_SIZE_RANGE.contains(&n) => {
                    t.stripe_cache_size = n;
                    Ok(())
                }
                _ => Err(format!("stripe_cache_size {n} is outside md's range 17-32768")),
            }
        },
    },
    TunableSpec {
        name: "rmw_level",
        help: "0 reconstruct-write only, 1 read-modify-write where it reads less, 2 also where equal",
        applies_to: parity,
        get: |t| t.rmw_level.to_string(),
        set: |t, v| match number("rmw_level", v)? {
            n @ 0..=2 => {
                t.rmw_level = n as u8;
                Ok(())
            }
            n => Err(format!("rmw_level {n}: use 0, 1 or 2")),
        },
    },
    TunableSpec {
        name: "preread_bypass_threshold",
        help: "full-stripe writes that may pass a waiting partial stripe (0 to stripe_cache_size)",
        applies_to: parity,
        get: |t| t.preread_bypass_threshold.to_string(),
        set: |t, v| {
            let n = number("preread_bypass_threshold", v)?;
            if n > t.stripe_cache_size as u64 {
                return Err(format!(
                    "preread_bypass_threshold {n} is above stripe_cache_size {} (md refuses it)",
                    t.stripe_cache_size
                ));
            }
            t.preread_bypass_threshold = n as u32;
            Ok(())
        },
    },
    TunableSpec {
        name: "balance",
        help: "mirror read balancing: load, load-time, round-robin, split or prefer",
        applies_to: mirror,
        get: |t| t.balance.name().to_string(),
        set: |t, v| {
            t.balance = Balance::parse(v.trim())?;
            Ok(())
        },
    },
    TunableSpec {
        name: "sync_speed_min",
        help: "resync/recovery/reshape floor while other I/O runs, KiB/s (or `system`)",
        applies_to: any,
        get: |t| t.sync_speed_min_kib.to_string(),
        set: |t, v| {
            t.sync_speed_min_kib = sync_speed("sync_speed_min", v, Tunables::default().sync_speed_min_kib)?;
            Ok(())
        },
    },
    TunableSpec {
        name: "sync_speed_max",
        help: "resync/recovery/reshape ceiling, KiB/s (or `system`); not below sync_speed_min",
        applies_to: any,
        get: |t| t.sync_speed_max_kib.to_string(),
        set: |t, v| {
            t.sync_speed_max_kib = sync_speed("sync_speed_max", v, Tunables::default().sync_speed_max_kib)?;
            Ok(())
        },
    },
    TunableSpec {
        name: "sync_policy",
        help: "under load: md (the floor) or adaptive (as fast as the clients' latency allows)",
        applies_to: redundant,
        get: |t| t.sync_policy.name().to_string(),
        set: |t, v| {
            t.sync_policy = SyncPolicy::parse(v)?;
            Ok(())
        },
    },
    TunableSpec {
        name: "sync_latency_limit_pct",
        help:
            "adaptive: the clients' mean latency at most this percent of it without background work (101-1000)",
        applies_to: redundant,
        get: |t| t.sync_latency_limit_pct.to_string(),
        set: |t, v| match number("sync_latency_limit_pct", v)? {
            n @ 101..=1000 => {
                t.sync_latency_limit_pct = n;
                Ok(())
            }
            n => Err(format!("sync_latency_limit_pct {n}: give a percent from 101 to 1000")),
        },
    },
];

/// The tunable called `name`, or a message listing the ones there are.
pub fn find(name: &str) -> Result<&'static TunableSpec, String> {
    TUNABLES.iter().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<&str> = TUNABLES.iter().map(|s| s.name).collect();
        format!("unknown tunable {name:?}: the tunables are {}", names.join(", "))
    })
}

impl Tunables {
    /// Sets tunable `name` of an array of `level` to `value`; on an error nothing changed.
    pub fn set_named(&mut self, level: Level, name: &str, value: &str) -> Result<(), String> {
        let spec = find(name)?;
        if !(spec.applies_to)(level) {
            return Err(format!("{name} does not apply to a {} array", level_name(level)));
        }
        let mut next = self.clone();
        (spec.set)(&mut next, value)?;
        next.check().map_err(|e| match name {
            "sync_speed_min" => format!("{e}: raise sync_speed_max first"),
            "sync_speed_max" => format!("{e}: lower sync_speed_min first"),
            _ => e,
        })?;
        *self = next;
        Ok(())
    }

    /// Every table entry's own range, as each `set` checks it, and the sync floor not
    /// above its ceiling. md takes such a pair and its throttle lets the floor win, so
    /// the ceiling a user set would silently mean nothing; uraid refuses it instead.
    pub fn check(&self) -> Result<(), String> {
        for spec in TUNABLES {
            (spec.set)(&mut self.clone(), &(spec.get)(self))?;
        }
        if self.sync_speed_min_kib > self.sync_speed_max_kib {
            return Err(format!(
                "sync_speed_min {} is above sync_speed_max {} (KiB/s)",
                self.sync_speed_min_kib, self.sync_speed_max_kib
            ));
        }
        Ok(())
    }

    /// `name value` lines of the tunables an array of `level` has.
    pub fn describe(&self, level: Level) -> String {
        TUNABLES
            .iter()
            .filter(|s| (s.applies_to)(level))
            .map(|s| format!("{} {}\n", s.name, (s.get)(self)))
            .collect()
    }
}

fn level_name(level: Level) -> String {
    format!("raid{}", level.md_level())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_value_changes_nothing_and_says_why() {
        let mut t = Tunables::default();
        let before = t.clone();
        for (name, value, says) in [
            ("stripe_cache_size", "16", "17-32768"),
            ("rmw_level", "3", "0, 1 or 2"),
            ("sync_speed_min", "0", "at least 1"),
            ("balance", "round-robin", "does not apply"),
            ("nomerges", "2", "unknown tunable"),
            ("preread_bypass_threshold", "300", "above stripe_cache_size"),
        ] {
            let err = t.set_named(Level::Raid5, name, value).unwrap_err();
            assert!(err.contains(says), "{name} {value}: {err}");
            assert_eq!(t, before);
        }
    }

    #[test]
    fn a_sync_floor_above_its_ceiling_is_refused_either_way() {
        let mut t = Tunables::default();
        t.set_named(Level::Raid5, "sync_speed_max", "4000").unwrap();
        let before = t.clone();
        let err = t.set_named(Level::Raid5, "sync_speed_min", "5000").unwrap_err();
        assert!(
            err.contains("above sync_speed_max 4000") && err.contains("raise sync_speed_max first"),
            "{err}"
        );
        assert_eq!(t, before);
        let err = t.set_named(Level::Raid5, "sync_speed_max", "500").unwrap_err();
        assert!(
            err.contains("above sync_speed_max 500") && err.contains("lower sync_speed_min first"),
            "{err}"
        );
        assert_eq!(t, before);
        // Equal is a fixed rate; `system` goes back to md's default.
        t.set_named(Level::Raid5, "sync_speed_min", "4000").unwrap();
        t.set_named(Level::Raid5, "sync_speed_max", "system").unwrap();
        assert_eq!(t.sync_speed_max_kib, Tunables::default().sync_speed_max_kib);
    }

    #[test]
    fn set_changes_only_what_it_names() {
        let mut t = Tunables::default();
        t.set_named(Level::Raid6, "sync_speed_min", "5000").unwrap();
        assert_eq!(t.sync_speed_min_kib, 5000);
        assert_eq!(t.sync_speed_max_kib, Tunables::default().sync_speed_max_kib);
        t.set_named(Level::Raid6, "sync_speed_min", "system").unwrap();
        assert_eq!(t.sync_speed_min_kib, Tunables::default().sync_speed_min_kib);
        t.set_named(Level::Raid1, "balance", "split").unwrap();
        assert_eq!(
            t.describe(Level::Raid1),
            "balance split\nsync_speed_min 1000\nsync_speed_max 200000\nsync_policy adaptive\nsync_latency_limit_pct 130\n"
        );
        assert!(Tunables::default().check().is_ok());
    }
}
