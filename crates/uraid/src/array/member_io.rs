//! Each device's member-I/O counts on a running array. The engine counts by slot, and a
//! replacement being rebuilt by its own index (`raid_disks + slot`), so a slot's counts
//! run on across the devices that hold it in turn. The book gives each device what its
//! slot counted while it held it: a failed member keeps what it did, the device rebuilt
//! into its slot starts from nothing, a replacement keeps its copy's writes when it takes
//! the slot.
//!
//! The book learns who holds what from each look at the array (every `view`, and the
//! monitor's every 100 ms). The verbs look before they change anything (`add` looks
//! before it attaches the device), and a slot without a working device is idle, so a
//! failed member and the device added after it are told apart exactly.

use std::collections::BTreeMap;

use uraid_core::array::{DevRole, MemberKey, MemberView};
use uraid_core::stats::{ArrayStats, MemberStats};

/// Per device name, its member-I/O counts since the array started.
pub type DeviceIo = Vec<(String, MemberStats)>;

#[derive(Default)]
pub struct IoBook {
    /// Per engine counter (slots, then replacements): the device it counts for now and
    /// the counter's value when that device took it.
    holders: Vec<(Option<MemberKey>, MemberStats)>,
    /// What each device did under counters it no longer holds.
    carried: BTreeMap<MemberKey, MemberStats>,
}

fn plus(a: &MemberStats, b: &MemberStats) -> MemberStats {
    MemberStats {
        reads: a.reads + b.reads,
        writes: a.writes + b.writes,
        flushes: a.flushes + b.flushes,
        read_bytes: a.read_bytes + b.read_bytes,
        write_bytes: a.write_bytes + b.write_bytes,
        errors: a.errors + b.errors,
        busy_ns: a.busy_ns + b.busy_ns,
    }
}

fn minus(a: &MemberStats, b: &MemberStats) -> MemberStats {
    MemberStats {
        reads: a.reads.saturating_sub(b.reads),
        writes: a.writes.saturating_sub(b.writes),
        flushes: a.flushes.saturating_sub(b.flushes),
        read_bytes: a.read_bytes.saturating_sub(b.read_bytes),
        write_bytes: a.write_bytes.saturating_sub(b.write_bytes),
        errors: a.errors.saturating_sub(b.errors),
        busy_ns: a.busy_ns.saturating_sub(b.busy_ns),
    }
}

/// The device engine counter `index` counts for: the active member of a slot, or the
/// replacement being rebuilt for it.
fn holder_of(raid_disks: usize, members: &[MemberView], index: usize) -> Option<MemberKey> {
    members
        .iter()
        .find(|m| match m.role {
            DevRole::Active { slot, .. } => slot == index,
            DevRole::Replacement { slot } => raid_disks + slot == index,
            DevRole::Spare | DevRole::Faulty { .. } => false,
        })
        .map(|m| m.key)
}

impl IoBook {
    /// Takes one look at the array (its members and the engine's counts, taken together)
    /// and answers each member's counts.
    pub fn note(&mut self, raid_disks: usize, members: &[MemberView], stats: &ArrayStats) -> DeviceIo {
        let counters = 2 * raid_disks;
        self.holders.resize(counters.max(self.holders.len()), (None, MemberStats::default()));
        let zero = MemberStats::default();
        for (index, (held_by, base)) in self.holders.iter_mut().enumerate() {
            let now = stats.members.get(index).unwrap_or(&zero);
            let holder = holder_of(raid_disks, members, index);
            if holder == *held_by {
                continue;
            }
            if let Some(old) = held_by.take() {
                let did = minus(now, base);
                let c = self.carried.entry(old).or_default();
                *c = plus(c, &did);
                *base = now.clone();
            }
            // From no holder to one the counter was idle (nothing is issued to a slot
            // without a working device): the base stays where the last holder left it.
            *held_by = holder;
        }
        self.carried.retain(|k, _| members.iter().any(|m| m.key == *k));
        members
            .iter()
            .map(|m| {
                let mut total = self.carried.get(&m.key).cloned().unwrap_or_default();
                for (index, (held_by, base)) in self.holders.iter().enumerate() {
                    if *held_by == Some(m.key) {
                        total = plus(&total, &minus(stats.members.get(index).unwrap_or(&zero), base));
                    }
                }
                (m.name.clone(), total)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(roles: &[(MemberKey, DevRole)]) -> Vec<MemberView> {
        roles
            .iter()
            .map(|&(key, role)| MemberView {
                key,
                name: format!("d{key}"),
                role,
                dev_number: key as u32,
                bad_blocks: Vec::new(),
            })
            .collect()
    }

    fn writes(per_counter: &[u64]) -> ArrayStats {
        ArrayStats {
            members: per_counter.iter().map(|&w| MemberStats { writes: w, ..Default::default() }).collect(),
            ..Default::default()
        }
    }

    fn of(io: &DeviceIo, name: &str) -> u64 {
        io.iter().find(|(n, _)| n == name).map_or(u64::MAX, |(_, s)| s.writes)
    }

    const A0: DevRole = DevRole::Active { slot: 0, recovering: false };
    const A1: DevRole = DevRole::Active { slot: 1, recovering: false };

    #[test]
    fn a_failed_member_keeps_its_counts_and_its_successor_starts_from_none() {
        let mut book = IoBook::default();
        book.note(2, &view(&[(0, A0), (1, A1)]), &writes(&[5, 7]));
        let failed = [(0, A0), (1, DevRole::Faulty { slot: 1 })];
        assert_eq!(of(&book.note(2, &view(&failed), &writes(&[6, 9])), "d1"), 9);
        let added =
            [(0, A0), (1, DevRole::Faulty { slot: 1 }), (2, DevRole::Active { slot: 1, recovering: true })];
        let io = book.note(2, &view(&added), &writes(&[6, 30]));
        assert_eq!((of(&io, "d0"), of(&io, "d1"), of(&io, "d2")), (6, 9, 21));
        let removed = [(0, A0), (2, A1)];
        let io = book.note(2, &view(&removed), &writes(&[6, 31]));
        assert_eq!((of(&io, "d2"), io.len()), (22, 2));
    }

    #[test]
    fn a_replacement_keeps_its_copy_when_it_takes_the_slot() {
        let mut book = IoBook::default();
        let replacing = [(0, A0), (1, A1), (2, DevRole::Replacement { slot: 1 })];
        let io = book.note(2, &view(&replacing), &writes(&[4, 4, 0, 10]));
        assert_eq!(of(&io, "d2"), 10);
        let io = book.note(2, &view(&[(0, A0), (2, A1)]), &writes(&[5, 6, 0, 10]));
        assert_eq!(of(&io, "d2"), 10);
        let io = book.note(2, &view(&[(0, A0), (2, A1)]), &writes(&[5, 9, 0, 10]));
        assert_eq!(of(&io, "d2"), 13);
    }
}
