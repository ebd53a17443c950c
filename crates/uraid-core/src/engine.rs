//! The array engine: a state machine fed requests, member-I/O completions and time.

use crate::api::*;
use crate::config::{ArrayConfig, ConfigError, MemberState};
use crate::stats::ArrayStats;

pub struct Engine {
    config: ArrayConfig,
    stats: ArrayStats,
}

impl Engine {
    pub fn new(config: ArrayConfig) -> Result<Self, ConfigError> {
        let stats = ArrayStats::new(config.members.len());
        Ok(Engine { config, stats })
    }

    /// Bytes of array address space.
    pub fn size_bytes(&self) -> u64 {
        self.config.geometry.array_bytes()
    }

    /// Hand a request to the engine. Back-pressure returns it untouched.
    pub fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        let _ = (req, now_ns);
        todo!()
    }

    /// The caller has no more requests to submit right now (md's unplug): partial stripes
    /// waiting for more writes may be started.
    pub fn unplug(&mut self, now_ns: TimeNs) {
        let _ = now_ns;
    }

    /// Next member I/O the caller must perform.
    pub fn pop_member_io(&mut self) -> Option<MemberIo> {
        None
    }

    /// Report a member I/O's result.
    pub fn complete_member_io(&mut self, completion: MemberIoCompletion, now_ns: TimeNs) {
        let _ = (completion, now_ns);
    }

    /// Next finished request.
    pub fn pop_completion(&mut self) -> Option<RequestCompletion> {
        None
    }

    /// When `tick` must next be called even if nothing else happens.
    pub fn next_deadline_ns(&self) -> Option<TimeNs> {
        None
    }

    /// Let time-driven work (batching deadlines, background resync/rebuild pacing) run.
    pub fn tick(&mut self, now_ns: TimeNs) {
        let _ = now_ns;
    }

    /// Mark a member faulty (mdadm --fail); the array continues degraded if it can.
    pub fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        let _ = (member, now_ns);
    }

    pub fn member_states(&self) -> Vec<MemberState> {
        self.config.members.iter().map(|m| m.state).collect()
    }

    pub fn stats(&self) -> &ArrayStats {
        &self.stats
    }

    /// No request, member I/O or background work outstanding.
    pub fn is_idle(&self) -> bool {
        true
    }
}
