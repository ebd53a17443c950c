//! Helpers shared by the executor's integration tests.

use std::time::{Duration, Instant};

use uraid_core::{MemberIo, MemberIoCompletion};
use uraid_io::real::Executor;

/// Submits `ios` and waits (at most 20 s) for all of them; completions sorted by id.
pub fn run(ex: &mut Executor, ios: Vec<MemberIo>) -> Vec<MemberIoCompletion> {
    let n = ios.len();
    for io in ios {
        ex.submit(io);
    }
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        assert!(Instant::now() < deadline, "completions stuck: {} of {n}", out.len());
        ex.wait(&mut out, Some(Duration::from_millis(100)));
    }
    assert_eq!(ex.in_flight(), 0);
    out.sort_by_key(|c| c.id);
    out
}
