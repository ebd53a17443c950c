//! mdadm --monitor's events, found the way mdadm finds them: by comparing what the array
//! looks like now with what it looked like at the last look (mdadm compares /proc/mdstat
//! and the detail between polls). Each event goes to stderr and, with
//! `serve --monitor-program PATH`, to PATH run as `PATH EVENT ARRAY [MEMBER]`.

use std::path::PathBuf;

use uraid_core::array::ArrayView;
use uraid_core::MemberState;

use uraid_core::array::{DevRole, MemberView};

/// The device in `slot`: its active member (the one being rebuilt there, too), else the
/// last member to fail there.
pub(super) fn slot_holder(view: &ArrayView, slot: usize) -> Option<&MemberView> {
    let active = view.members.iter().find(|m| matches!(m.role, DevRole::Active { slot: s, .. } if s == slot));
    active.or_else(|| view.members.iter().rev().find(|m| m.role == DevRole::Faulty { slot }))
}

/// What one look saw, for the next to compare with.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Per slot: its state and the device in it.
    slots: Vec<(MemberState, Option<String>)>,
    degraded: bool,
    /// A resync, recovery or scrub running, and how many fifths of it are done.
    sync_fifths: Option<u64>,
}

fn seen(view: &ArrayView) -> Seen {
    let slots = view
        .states
        .iter()
        .enumerate()
        .map(|(slot, &state)| (state, slot_holder(view, slot).map(|m| m.name.clone())))
        .collect();
    let sync_fifths =
        view.sync.as_ref().map(|s| (s.done_sectors * 5).checked_div(s.total_sectors).unwrap_or(5));
    Seen { slots, degraded: view.degraded(), sync_fifths }
}

/// The events between two looks: (mdadm's event name, the member it is about).
fn between(before: &Seen, now: &Seen) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (slot, (state, name)) in now.slots.iter().enumerate() {
        let was = before.slots.get(slot).map(|s| s.0);
        if *state == MemberState::Faulty && was.is_some_and(|w| w != MemberState::Faulty) {
            let who = before.slots.get(slot).and_then(|s| s.1.clone()).or_else(|| name.clone());
            out.push(("Fail".to_string(), who));
        }
    }
    if now.degraded && !before.degraded && now.slots.iter().any(|s| s.0 == MemberState::Faulty) {
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
        if *state == MemberState::InSync && was.is_some_and(|w| w != MemberState::InSync) {
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
    last: Option<Seen>,
}

impl Events {
    pub fn new(array: &str, program: Option<PathBuf>) -> Events {
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
                Ok(_) => Some(tx),
                Err(e) => {
                    eprintln!(
                        "uraid: {array}: no thread for the monitor program ({e}); events go to stderr only"
                    );
                    None
                }
            }
        });
        Events { array: array.to_string(), program, last: None }
    }

    /// Compares `view` with the last look; the first look only sets the baseline.
    pub fn look(&mut self, view: &ArrayView) {
        let now = seen(view);
        let events = self.last.as_ref().map(|before| between(before, &now)).unwrap_or_default();
        self.last = Some(now);
        for (event, member) in events {
            self.report(&event, member.as_deref());
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
            slots: states.iter().enumerate().map(|(i, &st)| (st, Some(format!("m{i}")))).collect(),
            degraded: states.iter().any(|x| *x != MemberState::InSync),
            sync_fifths: sync,
        }
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
}
