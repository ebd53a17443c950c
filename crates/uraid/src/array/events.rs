//! mdadm --monitor's events, found the way mdadm finds them: by comparing what the array
//! looks like now with what it looked like at the last look (mdadm compares /proc/mdstat
//! and the detail between polls). Each event goes to stderr and, with
//! `serve --monitor-program PATH` or `uraid monitor --program PATH`, to PATH run as
//! `PATH EVENT ARRAY [MEMBER]`. The server makes the looks ([`seen`]); `uraid monitor`
//! gets the same looks through the control socket, so both find events here, one way.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use uraid_core::array::ArrayView;
use uraid_core::MemberState;

use uraid_core::array::{DevRole, MemberView};

/// The device in `slot`: its active member (the one being rebuilt there, too), else the
/// last member to fail there.
pub(super) fn slot_holder(view: &ArrayView, slot: usize) -> Option<&MemberView> {
    let active = view.members.iter().find(|m| matches!(m.role, DevRole::Active { slot: s, .. } if s == slot));
    active.or_else(|| view.members.iter().rev().find(|m| m.role == DevRole::Faulty { slot }))
}

/// A slot's state as the events see it (md's words; the rebuild's offset left out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum SlotState {
    InSync,
    Rebuilding,
    Faulty,
    Missing,
}

impl From<MemberState> for SlotState {
    fn from(s: MemberState) -> SlotState {
        match s {
            MemberState::InSync => SlotState::InSync,
            MemberState::Recovering { .. } => SlotState::Rebuilding,
            MemberState::Faulty => SlotState::Faulty,
            MemberState::Missing => SlotState::Missing,
        }
    }
}

/// What one look saw, for the next to compare with.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Seen {
    /// Per slot: its state and the device in it.
    slots: Vec<(SlotState, Option<String>)>,
    /// Working devices outside the slots: hot spares and replacements being rebuilt.
    spares: Vec<String>,
    /// Failed devices not yet removed.
    faulty: Vec<String>,
    /// Members whose device went away: its path names nothing, or another file or device.
    gone: Vec<String>,
    degraded: bool,
    /// Devices working outside the in-sync slots, as md counts spare_disks: hot spares,
    /// replacements and the devices being rebuilt into a slot.
    #[serde(default)]
    spare_disks: usize,
    /// A resync, recovery or scrub running, and how many fifths of it are done.
    sync_fifths: Option<u64>,
}

/// One look at the array; `gone` names the members whose device went away (the caller
/// holds their paths and identities).
pub fn seen(view: &ArrayView, gone: Vec<String>) -> Seen {
    let slots = view
        .states
        .iter()
        .enumerate()
        .map(|(slot, &state)| (state.into(), slot_holder(view, slot).map(|m| m.name.clone())))
        .collect();
    let named =
        |f: fn(&DevRole) -> bool| view.members.iter().filter(move |m| f(&m.role)).map(|m| m.name.clone());
    let spares: Vec<String> = named(|r| matches!(r, DevRole::Spare | DevRole::Replacement { .. })).collect();
    let faulty = named(|r| matches!(r, DevRole::Faulty { .. })).collect();
    let sync_fifths =
        view.sync.as_ref().map(|s| (s.done_sectors * 5).checked_div(s.total_sectors).unwrap_or(5));
    let rebuilding = view.states.iter().filter(|s| matches!(s, MemberState::Recovering { .. })).count();
    let spare_disks = spares.len() + rebuilding;
    Seen { slots, spares, faulty, gone, degraded: view.degraded(), spare_disks, sync_fifths }
}

/// The events between two looks: (mdadm's event name, the member it is about). A first
/// look (`before` none) reports only an array already degraded, and SparesMissing when it
/// has fewer spares than `expect_spares` (mdadm.conf's `spares=`), as mdadm does for an
/// array it sees for the first time.
fn between(before: Option<&Seen>, now: &Seen, expect_spares: Option<usize>) -> Vec<(String, Option<String>)> {
    let Some(before) = before else {
        let mut first = Vec::new();
        if now.degraded {
            first.push(("DegradedArray".to_string(), None));
        }
        if expect_spares.is_some_and(|n| now.spare_disks < n) {
            first.push(("SparesMissing".to_string(), None));
        }
        return first;
    };
    let mut out = Vec::new();
    for name in now.gone.iter().filter(|n| !before.gone.contains(n)) {
        out.push(("DeviceDisappeared".to_string(), Some(name.clone())));
    }
    // mdadm's rule: a device that was in sync and is no longer fails (Fail); one that
    // fails without having been in sync (a spare, a device being rebuilt) is FailSpare.
    for (slot, (state, name)) in now.slots.iter().enumerate() {
        let was = before.slots.get(slot).map(|s| s.0);
        if *state == SlotState::Faulty && was.is_some_and(|w| w != SlotState::Faulty) {
            let who = before.slots.get(slot).and_then(|s| s.1.clone()).or_else(|| name.clone());
            let event = if was == Some(SlotState::InSync) { "Fail" } else { "FailSpare" };
            out.push((event.to_string(), who));
        }
    }
    for name in before.spares.iter().filter(|n| now.faulty.contains(n) && !before.faulty.contains(n)) {
        out.push(("FailSpare".to_string(), Some(name.clone())));
    }
    if now.degraded && !before.degraded && now.slots.iter().any(|s| s.0 == SlotState::Faulty) {
        out.push(("DegradedArray".to_string(), None));
    }
    match (before.sync_fifths, now.sync_fifths) {
        (None, Some(f)) => {
            out.push(("RebuildStarted".to_string(), None));
            out.extend((1..=f.min(4)).map(|i| (format!("Rebuild{}", i * 20), None)));
        }
        (Some(b), Some(f)) if f > b => {
            out.extend((b + 1..=f.min(4)).map(|i| (format!("Rebuild{}", i * 20), None)));
        }
        (Some(_), None) => out.push(("RebuildFinished".to_string(), None)),
        _ => {}
    }
    for (slot, (state, name)) in now.slots.iter().enumerate() {
        let was = before.slots.get(slot).map(|s| s.0);
        if *state == SlotState::InSync && was.is_some_and(|w| w != SlotState::InSync) {
            // A rebuild that began and ended between two looks still began and ended.
            if before.sync_fifths.is_none() && now.sync_fifths.is_none() {
                out.push(("RebuildStarted".to_string(), None));
                out.push(("RebuildFinished".to_string(), None));
            }
            out.push(("SpareActive".to_string(), name.clone()));
        }
    }
    out
}

/// Watches one array's looks and reports what changed.
pub struct Events {
    array: String,
    /// To the thread that runs the program, one event after the other, in order.
    program: Option<std::sync::mpsc::Sender<Vec<String>>>,
    runner: Option<std::thread::JoinHandle<()>>,
    last: Option<Seen>,
    /// mdadm.conf's `spares=`: fewer at a first look is SparesMissing.
    expect_spares: Option<usize>,
}

impl Events {
    pub fn new(array: &str, program: Option<PathBuf>, expect_spares: Option<usize>) -> Events {
        let program = program.and_then(|path| {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<String>>();
            let spawned = std::thread::Builder::new().name("uraid-events".into()).spawn(move || {
                for args in rx {
                    let run = std::process::Command::new(&path)
                        .args(&args)
                        .stdin(std::process::Stdio::null())
                        .status();
                    if let Err(e) = run {
                        eprintln!("uraid: {}: cannot run {} for {}: {e}", args[1], path.display(), args[0]);
                    }
                }
            });
            match spawned {
                Ok(t) => Some((tx, t)),
                Err(e) => {
                    eprintln!(
                        "uraid: {array}: no thread for the monitor program ({e}); events go to stderr only"
                    );
                    None
                }
            }
        });
        let (program, runner) = program.map_or((None, None), |(tx, t)| (Some(tx), Some(t)));
        Events { array: array.to_string(), program, runner, last: None, expect_spares }
    }

    /// Compares `now` with the last look; the first look sets the baseline (and reports
    /// an array already degraded).
    pub fn look(&mut self, now: Seen) {
        let events = between(self.last.as_ref(), &now, self.expect_spares);
        self.last = Some(now);
        for (event, member) in events {
            self.report(&event, member.as_deref());
        }
    }

    /// The array went away (its server stopped): mdadm's DeviceDisappeared without a
    /// member. The next look is a first look again.
    pub fn disappeared(&mut self) {
        if self.last.take().is_some() {
            self.report("DeviceDisappeared", None);
        }
    }

    /// Waits until the program has run for every event reported.
    pub fn finish(mut self) {
        self.program = None;
        if let Some(t) = self.runner.take() {
            let _ = t.join();
        }
    }

    /// mdadm --monitor --test's TestMessage, to check the program is run.
    pub fn test_message(&self) {
        self.report("TestMessage", None);
    }

    fn report(&self, event: &str, member: Option<&str>) {
        let about = member.map(|m| format!(" {m}")).unwrap_or_default();
        eprintln!("uraid: {}: event {event}{about}", self.array);
        // Run on a thread of its own: a slow program holds up no look, and events reach it
        // in the order they happened.
        if let Some(tx) = &self.program {
            let mut args = vec![event.to_string(), self.array.clone()];
            args.extend(member.map(str::to_string));
            let _ = tx.send(args);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(states: &[MemberState], sync: Option<u64>) -> Seen {
        Seen {
            slots: states.iter().enumerate().map(|(i, &st)| (st.into(), Some(format!("m{i}")))).collect(),
            degraded: states.iter().any(|x| *x != MemberState::InSync),
            sync_fifths: sync,
            ..Seen::default()
        }
    }

    fn between(before: &Seen, now: &Seen) -> Vec<(String, Option<String>)> {
        super::between(Some(before), now, None)
    }

    #[test]
    fn a_fail_then_a_rebuild_give_mdadms_events_in_order() {
        use MemberState::*;
        let ok = s(&[InSync, InSync, InSync], None);
        let failed = s(&[InSync, Faulty, InSync], None);
        assert_eq!(
            (between(&ok, &failed)),
            vec![("Fail".into(), Some("m1".into())), ("DegradedArray".into(), None)]
        );
        let rebuilding = s(&[InSync, Recovering { recovery_offset_sectors: 0 }, InSync], Some(2));
        assert_eq!(
            (between(&failed, &rebuilding)),
            vec![("RebuildStarted".into(), None), ("Rebuild20".into(), None), ("Rebuild40".into(), None)]
        );
        assert_eq!(
            (between(&rebuilding, &ok)),
            vec![("RebuildFinished".into(), None), ("SpareActive".into(), Some("m1".into()))]
        );
        assert!(between(&ok, &ok).is_empty());
        // Rebuilt between two looks.
        assert_eq!(
            (between(&failed, &ok)),
            vec![
                ("RebuildStarted".into(), None),
                ("RebuildFinished".into(), None),
                ("SpareActive".into(), Some("m1".into()))
            ]
        );
    }

    #[test]
    fn a_device_failing_before_it_was_in_sync_is_failspare_and_a_vanished_one_disappeared() {
        use MemberState::*;
        let failed = s(&[InSync, Faulty, InSync], None);
        let rebuilding = s(&[InSync, Recovering { recovery_offset_sectors: 0 }, InSync], Some(1));
        assert_eq!(
            between(&rebuilding, &failed),
            vec![("FailSpare".into(), Some("m1".into())), ("RebuildFinished".into(), None)]
        );
        let ok = s(&[InSync, InSync], None);
        let with_spare = Seen { spares: vec!["sp".into()], ..ok.clone() };
        let spare_failed = Seen { faulty: vec!["sp".into()], ..ok.clone() };
        assert_eq!(between(&with_spare, &spare_failed), vec![("FailSpare".into(), Some("sp".into()))]);
        let gone = Seen { gone: vec!["m0".into()], ..ok.clone() };
        assert_eq!(between(&ok, &gone), vec![("DeviceDisappeared".into(), Some("m0".into()))]);
        assert!(between(&gone, &gone).is_empty(), "reported once");
        // A first look reports an array already degraded, and nothing else.
        assert_eq!(super::between(None, &failed, None), vec![("DegradedArray".into(), None)]);
        assert!(super::between(None, &ok, None).is_empty());
    }

    /// mdadm(8): SparesMissing when the config says an array should have N spares and it
    /// has fewer when mdadm first sees it; a device being rebuilt counts as md's spare.
    #[test]
    fn a_first_look_with_fewer_spares_than_expected_is_sparesmissing_once() {
        use MemberState::*;
        let ok = s(&[InSync, InSync], None);
        let one_spare = Seen { spares: vec!["sp".into()], spare_disks: 1, ..ok.clone() };
        let missing = vec![("SparesMissing".to_string(), None)];
        assert_eq!(super::between(None, &ok, Some(1)), missing);
        assert!(super::between(None, &one_spare, Some(1)).is_empty());
        assert_eq!(super::between(None, &one_spare, Some(2)), missing);
        assert!(super::between(None, &ok, Some(0)).is_empty());
        let failed = s(&[InSync, Faulty], None);
        assert_eq!(
            super::between(None, &failed, Some(1)),
            vec![("DegradedArray".into(), None), ("SparesMissing".into(), None)]
        );
        // Only at the first look, as mdadm: a later look that loses a spare says FailSpare.
        assert!(super::between(Some(&ok), &ok, Some(1)).is_empty());
        let rebuilding = s(&[InSync, Recovering { recovery_offset_sectors: 0 }], Some(0));
        let view_spares = Seen { spare_disks: 1, ..rebuilding };
        assert!(super::between(None, &view_spares, Some(1)).iter().all(|e| e.0 != "SparesMissing"));
    }
}
