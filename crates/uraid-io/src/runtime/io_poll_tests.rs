//! The runtime with polled completions: its thread must not sleep while the polled ring
//! holds I/O (nothing would post those completions; it would wake only at its next
//! deadline look), and submitters get no rings of their own.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use uraid_core::testing::MirrorEngine;
use uraid_core::{CompletionRound, Request};

use super::{ArrayRuntime, RuntimeOptions};
use crate::real::{Executor, ExecutorOptions, Member, MemberSet, OpenOptions};

const MEMBER_BYTES: u64 = 1 << 20;

/// Two mirror members in files on the disk the build runs on, taken as pollable (their
/// O_DIRECT writes then go on the polled ring, completing by interrupt: see
/// `Member::assume_pollable`).
fn polled_runtime(name: &str, rt_opts: &RuntimeOptions) -> (ArrayRuntime<MirrorEngine>, Vec<PathBuf>) {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/tmp"));
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<PathBuf> = (0..2)
        .map(|i| {
            let p = dir.join(format!("uraid-rt-polled-{name}-{i}-{}", std::process::id()));
            std::fs::write(&p, vec![0u8; MEMBER_BYTES as usize]).unwrap();
            p
        })
        .collect();
    let members = paths
        .iter()
        .map(|p| {
            let mut m = Member::open(p, &OpenOptions { log: false, ..OpenOptions::default() }).unwrap();
            m.assume_pollable();
            m
        })
        .collect();
    let opts = ExecutorOptions { io_poll: true, log: false, ..ExecutorOptions::default() };
    let ex = Executor::new(MemberSet::from_members(members), &opts).unwrap();
    let engine = MirrorEngine::new(2, MEMBER_BYTES, 0);
    (ArrayRuntime::start(engine, ex, rt_opts).unwrap(), paths)
}

#[test]
fn the_array_thread_spins_rather_than_sleeps_while_polled_io_is_out() {
    // Requests through the channel: the array thread issues every member I/O.
    let rt_opts = RuntimeOptions { run_on_submitter_max_bytes: 0, ..RuntimeOptions::default() };
    let (rt, paths) = polled_runtime("spin", &rt_opts);
    let writes = 20u64;
    let start = Instant::now();
    for i in 0..writes {
        let c = rt.submit_wait(Request::write(i, i * 4096, vec![i as u8; 4096])).unwrap();
        assert!(c.result.is_ok(), "write {i}: {:?}", c.result);
    }
    let took = start.elapsed();
    let polled = rt.handle().control(|_, ex, _| ex.polled_ios()).unwrap();
    assert!(polled >= writes, "only {polled} of the writes' member I/Os were polled");
    // Asleep with polled I/O out, the thread would look again only at its deadline scan
    // (100 ms): each write would take that long.
    assert!(took < Duration::from_millis(50 * writes / 2), "{writes} polled writes took {took:?}");
    rt.shutdown().unwrap();
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn submitters_get_no_rings_of_their_own_with_polled_completions() {
    let (rt, paths) = polled_runtime("rings", &RuntimeOptions::default());
    let h = rt.handle();
    let mut round = CompletionRound::default();
    let mut owed = 0;
    for i in 0..20u64 {
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Box::new(move |c: uraid_core::RequestCompletion, _: &mut CompletionRound| {
            let _ = tx.send(c);
        });
        h.submit_driven(Request::write(i, i * 4096, vec![1; 4096]), done, &mut round).unwrap();
        // A ring of this thread's own: the runtime spinning on the state would keep it
        // from reaping there. Finished here all the same, so the test ends either way.
        while h.thread_owes_io() {
            owed += 1;
            h.drive_thread_io(None, Duration::from_millis(10), &mut round);
        }
        round.end();
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().result.is_ok());
    }
    h.thread_done(&mut round);
    assert_eq!(owed, 0, "a submitter issued member I/O on a ring of its own");
    rt.shutdown().unwrap();
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}
