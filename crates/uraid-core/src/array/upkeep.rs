//! md's clocks for a running array: when the superblocks may be marked clean (safe mode),
//! when the bitmap daemon passes, when a recovery's position is checkpointed. The caller
//! asks with its clock (real or virtual milliseconds) and does what is due; the work
//! itself is [`super::ArraySuperblocks`]'.

/// The periods, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpkeepPeriods {
    /// Writes must have stopped this long before the array is marked clean. md's
    /// safe_mode_delay is 200 ms; a second keeps superblock writes rare under bursty I/O.
    pub safe_mode_ms: u64,
    /// md's bitmap daemon_sleep (5 s): a bit idle for two passes is cleared.
    pub bitmap_daemon_ms: u64,
    /// How often a running recovery's position is made durable (md checkpoints its
    /// recovery_cp as the resync thread goes).
    pub recovery_checkpoint_ms: u64,
}

impl Default for UpkeepPeriods {
    fn default() -> Self {
        UpkeepPeriods { safe_mode_ms: 1_000, bitmap_daemon_ms: 5_000, recovery_checkpoint_ms: 3_000 }
    }
}

/// What is due now.
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
    last_safe_mode_ms: u64,
    last_bitmap_ms: u64,
    last_checkpoint_ms: u64,
}

impl UpkeepClock {
    pub fn new(periods: UpkeepPeriods, now_ms: u64) -> UpkeepClock {
        UpkeepClock { periods, last_safe_mode_ms: now_ms, last_bitmap_ms: now_ms, last_checkpoint_ms: now_ms }
    }

    /// What is due at `now_ms`; each returned item's period starts again from now.
    pub fn due(&mut self, now_ms: u64) -> UpkeepDue {
        let take = |last: &mut u64, period: u64| {
            let due = now_ms.saturating_sub(*last) >= period;
            if due {
                *last = now_ms;
            }
            due
        };
        UpkeepDue {
            safe_mode_check: take(&mut self.last_safe_mode_ms, self.periods.safe_mode_ms),
            bitmap_daemon: take(&mut self.last_bitmap_ms, self.periods.bitmap_daemon_ms),
            recovery_checkpoint: take(&mut self.last_checkpoint_ms, self.periods.recovery_checkpoint_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_item_comes_due_once_per_period() {
        let mut c = UpkeepClock::new(UpkeepPeriods::default(), 10_000);
        assert_eq!(c.due(10_500), UpkeepDue::default());
        let d = c.due(11_000);
        assert!(d.safe_mode_check && !d.bitmap_daemon && !d.recovery_checkpoint);
        assert!(!c.due(11_999).safe_mode_check, "its period starts again when it is taken");
        let d = c.due(13_000);
        assert!(d.safe_mode_check && d.recovery_checkpoint && !d.bitmap_daemon);
        assert!(c.due(15_000).bitmap_daemon);
    }
}
