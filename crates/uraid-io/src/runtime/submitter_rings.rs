//! A submitter's own io_uring ring (see `real/guest.rs` and
//! [`super::RuntimeOptions::submitter_rings`]): which ring a thread has, and how it reaps
//! it and finishes what completed there.

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::time::Duration;

use uraid_core::CompletionRound;

use super::{catch_unwind, lock_state, AssertUnwindSafe, Loop, Submitters};
use crate::engine::ArrayEngine;
use crate::real::{wait_for_completion, GuestRingState};

/// A submitter thread's ring for one executor (`None`: the executor gave none) and the
/// I/O it owes there, as of its last look under the lock (only this thread issues to or
/// reaps its ring, so nobody else changes that count).
#[derive(Clone, Copy)]
pub(super) struct ThreadRing {
    pub(super) executor_id: u64,
    pub(super) ring: Option<usize>,
    pub(super) owed: usize,
}

thread_local! {
    static THREAD_RINGS: RefCell<Vec<ThreadRing>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn thread_ring(executor_id: u64) -> Option<ThreadRing> {
    THREAD_RINGS.with(|r| r.borrow().iter().find(|t| t.executor_id == executor_id).copied())
}

pub(super) fn set_thread_ring(t: ThreadRing) {
    THREAD_RINGS.with(|r| {
        let mut r = r.borrow_mut();
        match r.iter_mut().find(|x| x.executor_id == t.executor_id) {
            Some(x) => *x = t,
            None => r.push(t),
        }
    })
}

pub(super) fn forget_thread_ring(executor_id: u64) {
    THREAD_RINGS.with(|r| r.borrow_mut().retain(|t| t.executor_id != executor_id))
}

/// How long a thread that owes I/O waits in its ring at most before it looks again
/// (a member that never answers is timed out by the runtime thread meanwhile).
pub(super) const THREAD_RING_WAIT: Duration = Duration::from_millis(100);

impl<E: ArrayEngine + Send + 'static> Submitters<E> {
    /// This thread's ring, opened at its first round (with the state held).
    pub(super) fn ring(&self, lp: &mut Loop<E>) -> Option<usize> {
        if !self.rings {
            return None;
        }
        if let Some(t) = thread_ring(self.executor_id) {
            return t.ring;
        }
        let ring = lp.ex.open_guest_ring().ok().flatten();
        set_thread_ring(ThreadRing { executor_id: self.executor_id, ring, owed: 0 });
        ring
    }

    /// Runs `f` on the state with the engine's panic caught as `try_run` does; `None` when
    /// the runtime has stopped.
    pub(super) fn with_state<R>(&self, f: impl FnOnce(&mut Loop<E>) -> R) -> Option<R> {
        let mut guard = lock_state(&self.state);
        let lp = guard.as_mut()?;
        match catch_unwind(AssertUnwindSafe(|| f(lp))) {
            Ok(r) => Some(r),
            Err(_) => {
                let dead = guard.take();
                drop(guard);
                drop(dead);
                self.wake.waker.wake();
                None
            }
        }
    }

    /// Reaps this thread's ring and finishes what completed; arms a poll of `readable`.
    fn look(
        &self,
        g: usize,
        readable: Option<RawFd>,
        issue: bool,
        round: &mut CompletionRound,
    ) -> Option<GuestLook> {
        let Some(look) = self.with_state(|lp| lp.guest_look(g, readable, issue, round)) else {
            // Stopped: the executor and its rings are gone, and the requests answered.
            set_thread_ring(ThreadRing { executor_id: self.executor_id, ring: Some(g), owed: 0 });
            return None;
        };
        set_thread_ring(ThreadRing { executor_id: self.executor_id, ring: Some(g), owed: look.state.owed });
        if look.need_runtime {
            // The runtime may sleep holding a request back (Busy) that this thread's
            // completions just made room for: nothing else would wake it.
            self.wake.waker.wake();
        }
        Some(look)
    }
}

impl<E: ArrayEngine + Send + 'static> Submitters<E> {
    /// See [`RuntimeHandle::drive_thread_io`]; with `issue` false, member I/O that the
    /// completions lead to goes to the runtime thread instead (a thread closing its ring).
    pub(super) fn drive_ring(
        &self,
        readable: Option<RawFd>,
        timeout: Duration,
        issue: bool,
        round: &mut CompletionRound,
    ) -> bool {
        let Some(ThreadRing { ring: Some(g), owed, .. }) = thread_ring(self.executor_id) else { return true };
        if owed == 0 {
            return true;
        }
        let Some(look) = self.look(g, readable, issue, round) else { return true };
        if look.state.poll_fired || look.state.owed == 0 {
            return true;
        }
        if !look.state.ready {
            // Replies this round made go out before the thread sleeps.
            round.end();
            wait_for_completion(look.state.ring_fd, timeout);
        }
        let Some(look) = self.look(g, None, issue, round) else { return true };
        look.state.poll_fired || look.state.owed == 0
    }
}

/// What a submitter's look at its ring found.
pub(super) struct GuestLook {
    state: GuestRingState,
    need_runtime: bool,
}

impl<E: ArrayEngine + 'static> Loop<E> {
    /// A submitter's look at its own ring `g` (it holds the state): what completed there is
    /// finished (callbacks run with its `round`), and a poll of `readable` is armed.
    pub(super) fn guest_look(
        &mut self,
        g: usize,
        readable: Option<RawFd>,
        issue: bool,
        round: &mut CompletionRound,
    ) -> GuestLook {
        self.ex.set_guest(true);
        self.ex.set_guest_ring(Some(g), issue);
        std::mem::swap(&mut self.round, round);
        while self.pump() {}
        std::mem::swap(&mut self.round, round);
        if let Some(fd) = readable {
            self.ex.arm_guest_poll(g, fd);
        }
        let state = self.ex.guest_ring_state(g);
        self.ex.set_guest_ring(None, false);
        self.ex.set_guest(false);
        let state = state.unwrap_or(GuestRingState { owed: 0, poll_fired: true, ready: false, ring_fd: -1 });
        GuestLook { state, need_runtime: self.runtime_needed() }
    }
}
