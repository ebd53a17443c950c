//! md's clocks for a running array: when the superblocks may be marked clean (safe mode),
//! when the bitmap daemon passes, when a recovery's position is checkpointed. The caller
//! asks with its clock (real or virtual nanoseconds) and does what is due.

/// The periods, in nanoseconds. The simulator scales them down to the virtual time its
/// workloads span, so the clocks tick inside a run as they do inside a day of md's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpkeepPeriods {
    /// Writes must have stopped this long before the array is marked clean. md's
    /// safe_mode_delay is 200 ms; a second keeps superblock writes rare under bursty I/O.
    pub safe_mode_ns: u64,
    /// md's bitmap daemon_sleep (5 s): a bit idle for two passes is cleared.
    pub bitmap_daemon_ns: u64,
    /// How often a running recovery's position is made durable (md checkpoints its
    /// recovery_cp as the resync thread goes).
    pub recovery_checkpoint_ns: u64,
}

impl Default for UpkeepPeriods {
    fn default() -> Self {
        const S: u64 = 1_000_000_000;
        UpkeepPeriods { safe_mode_ns: S, bitmap_daemon_ns: 5 * S, recovery_checkpoint_ns: 3 * S }
    }
}

/// What is due now (or, for [`UpkeepClock::next_due_ns`], what has work to do).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpkeepDue {
    /// Look whether a write arrived since the last look; if none did, flush and mark clean.
    pub safe_mode_check: bool,
    pub bitmap_daemon: bool,
    pub recovery_checkpoint: bool,
}

#[derive(Clone, Debug)]
pub struct UpkeepClock {
    periods: UpkeepPeriods,
    last_safe_mode_ns: u64,
    last_bitmap_ns: u64,
    last_checkpoint_ns: u64,
}

impl UpkeepClock {
    pub fn new(periods: UpkeepPeriods, now_ns: u64) -> UpkeepClock {
        UpkeepClock { periods, last_safe_mode_ns: now_ns, last_bitmap_ns: now_ns, last_checkpoint_ns: now_ns }
    }

    /// What is due at `now_ns`; each returned item's period starts again from now.
    pub fn due(&mut self, now_ns: u64) -> UpkeepDue {
        let take = |last: &mut u64, period: u64| {
            let due = now_ns.saturating_sub(*last) >= period;
            if due {
                *last = now_ns;
            }
            due
        };
        UpkeepDue {
            safe_mode_check: take(&mut self.last_safe_mode_ns, self.periods.safe_mode_ns),
            bitmap_daemon: take(&mut self.last_bitmap_ns, self.periods.bitmap_daemon_ns),
            recovery_checkpoint: take(&mut self.last_checkpoint_ns, self.periods.recovery_checkpoint_ns),
        }
    }
}

impl UpkeepClock {
    /// When the next of the `armed` items comes due (None: none is armed). An idle array
    /// arms nothing and is not woken.
    pub fn next_due_ns(&self, armed: UpkeepDue) -> Option<u64> {
        [
            (armed.safe_mode_check, self.last_safe_mode_ns + self.periods.safe_mode_ns),
            (armed.bitmap_daemon, self.last_bitmap_ns + self.periods.bitmap_daemon_ns),
            (armed.recovery_checkpoint, self.last_checkpoint_ns + self.periods.recovery_checkpoint_ns),
        ]
        .into_iter()
        .filter_map(|(on, at)| on.then_some(at))
        .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_item_comes_due_once_per_period() {
        let mut c = UpkeepClock::new(UpkeepPeriods::default(), 10_000_000_000);
        assert_eq!(c.due(10_500_000_000), UpkeepDue::default());
        let d = c.due(11_000_000_000);
        assert!(d.safe_mode_check && !d.bitmap_daemon && !d.recovery_checkpoint);
        assert!(!c.due(11_999_000_000).safe_mode_check, "its period starts again when it is taken");
        let d = c.due(13_000_000_000);
        assert!(d.safe_mode_check && d.recovery_checkpoint && !d.bitmap_daemon);
        assert!(c.due(15_000_000_000).bitmap_daemon);
        let armed = UpkeepDue { safe_mode_check: true, bitmap_daemon: true, recovery_checkpoint: false };
        assert_eq!(c.next_due_ns(armed), Some(16_000_000_000));
        assert_eq!(c.next_due_ns(UpkeepDue::default()), None, "nothing armed, nothing due");
    }
}
