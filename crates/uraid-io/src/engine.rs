//! The engine as the executors see it. [`uraid_core::Engine`] implements it; so does
//! [`crate::testing::MirrorEngine`], a tiny stand-in that lets the runtime and the
//! simulator driver be tested on their own.

use uraid_core::stats::ArrayStats;
use uraid_core::{Engine, MemberIo, MemberIoCompletion, Request, RequestCompletion, SubmitError, TimeNs};

/// The sans-IO engine interface (the methods of `uraid_core::Engine`).
pub trait ArrayEngine {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError>;
    fn unplug(&mut self, now_ns: TimeNs);
    fn pop_member_io(&mut self) -> Option<MemberIo>;
    fn complete_member_io(&mut self, completion: MemberIoCompletion, now_ns: TimeNs);
    fn pop_completion(&mut self) -> Option<RequestCompletion>;
    fn next_deadline_ns(&self) -> Option<TimeNs>;
    fn tick(&mut self, now_ns: TimeNs);
    fn fail_member(&mut self, member: usize, now_ns: TimeNs);
    fn is_idle(&self) -> bool;
    fn stats_snapshot(&self) -> ArrayStats;
}

impl ArrayEngine for Engine {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        Engine::submit(self, req, now_ns)
    }
    fn unplug(&mut self, now_ns: TimeNs) {
        Engine::unplug(self, now_ns)
    }
    fn pop_member_io(&mut self) -> Option<MemberIo> {
        Engine::pop_member_io(self)
    }
    fn complete_member_io(&mut self, completion: MemberIoCompletion, now_ns: TimeNs) {
        Engine::complete_member_io(self, completion, now_ns)
    }
    fn pop_completion(&mut self) -> Option<RequestCompletion> {
        Engine::pop_completion(self)
    }
    fn next_deadline_ns(&self) -> Option<TimeNs> {
        Engine::next_deadline_ns(self)
    }
    fn tick(&mut self, now_ns: TimeNs) {
        Engine::tick(self, now_ns)
    }
    fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        Engine::fail_member(self, member, now_ns)
    }
    fn is_idle(&self) -> bool {
        Engine::is_idle(self)
    }
    fn stats_snapshot(&self) -> ArrayStats {
        Engine::stats(self).clone()
    }
}
