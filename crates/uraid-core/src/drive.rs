//! The one loop that drives an [`ArrayEngine`]: the real runtime, the simulator, the tests,
//! `explain` and the benches all move member I/Os and completions through [`pump`], so
//! the order of the steps (issue, complete, finish, tick) is written once. What differs
//! between them is the [`MemberExecutor`] and the clock.

use crate::api::*;

/// Where a driver sends the member I/Os an engine issues, and where it finds their
/// completions.
pub trait MemberExecutor {
    /// Start `io`.
    fn issue(&mut self, io: MemberIo);
    /// Completions ready now, appended to `out`, without waiting.
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>);
}

/// What one [`pump`] moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pumped {
    pub issued: u64,
    pub completed: u64,
    pub finished: u64,
    pub ticked: bool,
}

impl Pumped {
    /// Did anything move?
    pub fn any(&self) -> bool {
        self.issued + self.completed + self.finished > 0 || self.ticked
    }
}

/// One pass at one instant: [`exchange`], then the engine's time-driven work if its
/// deadline has come.
pub fn pump<E: ArrayEngine + ?Sized, X: MemberExecutor + ?Sized>(
    engine: &mut E,
    ex: &mut X,
    now: &mut dyn FnMut() -> TimeNs,
    scratch: &mut Vec<MemberIoCompletion>,
    finished: impl FnMut(RequestCompletion),
) -> Pumped {
    let mut p = exchange(engine, ex, now, scratch, finished);
    p.ticked = tick_if_due(engine, now());
    p
}

/// Every member I/O the engine has goes to `ex`; every completion `ex` has goes to the
/// engine, at `now()`; every finished request to `finished`. `scratch` is the caller's, so
/// a pass allocates nothing.
pub fn exchange<E: ArrayEngine + ?Sized, X: MemberExecutor + ?Sized>(
    engine: &mut E,
    ex: &mut X,
    now: &mut dyn FnMut() -> TimeNs,
    scratch: &mut Vec<MemberIoCompletion>,
    mut finished: impl FnMut(RequestCompletion),
) -> Pumped {
    let mut p = Pumped::default();
    while let Some(io) = engine.pop_member_io() {
        ex.issue(io);
        p.issued += 1;
    }
    scratch.clear();
    ex.poll(scratch);
    if !scratch.is_empty() {
        let t = now();
        p.completed = scratch.len() as u64;
        for c in scratch.drain(..) {
            engine.complete_member_io(c, t);
        }
    }
    while let Some(c) = engine.pop_completion() {
        finished(c);
        p.finished += 1;
    }
    p
}

/// Runs the engine's time-driven work if its deadline is `now_ns` or earlier.
pub fn tick_if_due<E: ArrayEngine + ?Sized>(engine: &mut E, now_ns: TimeNs) -> bool {
    let due = engine.next_deadline_ns().is_some_and(|d| d <= now_ns);
    if due {
        engine.tick(now_ns);
    }
    due
}

/// For executors that complete at once (tests, `explain`, benches): pump until nothing
/// moves, moving the virtual clock `now_ns` by `step_ns` a pass and on to the engine's
/// next deadline when only time is left. False if the engine still holds work it asks
/// nothing for (an engine bug; the caller reports [`ArrayEngine::outstanding`]).
pub fn run_until_idle<E: ArrayEngine + ?Sized, X: MemberExecutor + ?Sized>(
    engine: &mut E,
    ex: &mut X,
    now_ns: &mut TimeNs,
    step_ns: TimeNs,
    mut finished: impl FnMut(RequestCompletion),
) -> bool {
    let mut scratch = Vec::new();
    loop {
        *now_ns += step_ns;
        let t = *now_ns;
        if pump(engine, ex, &mut || t, &mut scratch, &mut finished).any() {
            continue;
        }
        match engine.next_deadline_ns() {
            Some(d) => {
                *now_ns = (*now_ns).max(d);
                engine.tick(*now_ns);
            }
            None => return engine.is_idle(),
        }
    }
}
