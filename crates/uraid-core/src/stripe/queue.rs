//! The stripe queue's policy (md's delayed partial stripes, preread bypass): when a
//! head's queued writes may start.

use crate::api::*;
use crate::engine::Mddev;
use crate::ledger::Ledger;

use super::*;

impl Mddev {
    pub(crate) fn cache_force_all(&mut self) {
        let keys: Vec<u64> = std::mem::take(&mut self.cache.delayed);
        for key in keys {
            if let Some(st) = self.cache.heads.get_mut(&key) {
                st.force = true;
                st.delayed_until = None;
            }
            self.cache.mark(key);
        }
        let keys: Vec<u64> = self
            .cache
            .heads
            .iter()
            .filter(|(_, st)| st.towrite_mask.iter().any(|&m| m != 0))
            .map(|(&k, _)| k)
            .collect();
        for key in keys {
            self.cache.heads.get_mut(&key).expect("head").force = true;
            self.cache.mark(key);
        }
    }

    pub(super) fn activate_delayed(&mut self, now: Option<TimeNs>) {
        let keys = std::mem::take(&mut self.cache.delayed);
        for key in keys {
            let Some(st) = self.cache.heads.get_mut(&key) else { continue };
            let due = match (now, st.delayed_until) {
                (None, _) => true,
                (Some(t), Some(d)) => d <= t,
                (Some(_), None) => true,
            };
            if due {
                st.force = true;
                st.delayed_until = None;
                self.cache.mark(key);
            } else {
                self.cache.delayed.push(key);
            }
        }
    }

    pub(crate) fn cache_unplug(&mut self, led: &mut Ledger) {
        if self.cache.preread_active < IO_THRESHOLD {
            self.activate_delayed(None);
        }
        self.run_stripes(led);
    }

    pub(crate) fn cache_next_deadline(&self) -> Option<TimeNs> {
        self.cache.delayed.iter().filter_map(|k| self.cache.heads.get(k)?.delayed_until).min()
    }

    pub(crate) fn cache_tick(&mut self, led: &mut Ledger) {
        self.activate_delayed(Some(self.now_ns));
        self.run_stripes(led);
    }

    /// A member or the whole array failed: every head re-analyses what it can still do.
    pub(crate) fn cache_rehandle_all(&mut self, led: &mut Ledger) {
        let keys: Vec<u64> = self.cache.heads.keys().copied().collect();
        for k in keys {
            self.cache.mark(k);
        }
        self.run_stripes(led);
    }
}

impl Mddev {
    /// The stripe heads holding work, for a report of a hang.
    pub(crate) fn cache_describe(&self) -> String {
        let busy: Vec<String> = self
            .cache
            .heads
            .iter()
            .filter(|(_, st)| !st.idle())
            .take(6)
            .map(|(k, st)| {
                format!(
                    "{k}: writes {:?} inflight {} batch {} sync {} readers {} delayed {:?} force {} queued {}",
                    st.towrite_reqs,
                    st.inflight,
                    st.batch.is_some(),
                    st.sync.is_some(),
                    st.readers.len(),
                    st.delayed_until,
                    st.force,
                    st.queued
                )
            })
            .collect();
        format!(
            "heads {busy:?}, pieces waiting {}, delayed {:?}, preread_active {}",
            self.cache.waiting.len(),
            self.cache.delayed,
            self.cache.preread_active
        )
    }
}
