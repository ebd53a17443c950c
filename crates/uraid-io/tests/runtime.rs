//! ArrayRuntime's own logic (Busy hold-back, ids, callbacks, unplug, ticks, fail, stats,
//! shutdown with flush) with the small mirror engine on real temp files, so it does not
//! wait for the real engine.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use uraid_core::stats::ArrayStats;
use uraid_core::testing::MirrorEngine;
use uraid_core::ArrayEngine;
use uraid_core::{
    CompletionRound, MemberIo, MemberIoCompletion, MemberIoOp, Request, RequestCompletion, RequestError,
    SubmitError, TimeNs,
};
use uraid_io::real::{BackendChoice, Executor, ExecutorOptions, MemberSet, OpenOptions};
use uraid_io::runtime::{ArrayRuntime, RuntimeError, RuntimeOptions};

/// MirrorEngine plus counters visible from the test thread.
struct Counted {
    inner: MirrorEngine,
    ticks: Arc<AtomicU64>,
    unplugs: Arc<AtomicU64>,
    busy: Arc<AtomicU64>,
}

impl ArrayEngine for Counted {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        let r = self.inner.submit(req, now_ns);
        if r.is_err() {
            self.busy.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
    fn unplug(&mut self, now_ns: TimeNs) {
        self.unplugs.fetch_add(1, Ordering::Relaxed);
        self.inner.unplug(now_ns)
    }
    fn pop_member_io(&mut self) -> Option<MemberIo> {
        self.inner.pop_member_io()
    }
    fn complete_member_io(&mut self, c: MemberIoCompletion, now_ns: TimeNs) {
        self.inner.complete_member_io(c, now_ns)
    }
    fn pop_completion(&mut self) -> Option<RequestCompletion> {
        self.inner.pop_completion()
    }
    fn next_deadline_ns(&self) -> Option<TimeNs> {
        self.inner.next_deadline_ns()
    }
    fn tick(&mut self, now_ns: TimeNs) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
        self.inner.tick(now_ns)
    }
    fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        self.inner.fail_member(member, now_ns)
    }
    fn is_idle(&self) -> bool {
        self.inner.is_idle()
    }
    fn stats_snapshot(&self) -> ArrayStats {
        self.inner.stats_snapshot()
    }
}

fn files(name: &str, n: usize, len: u64) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    (0..n)
        .map(|i| {
            let p = dir.join(format!("rt-{name}-{i}-{}", std::process::id()));
            std::fs::File::create(&p).unwrap().set_len(len).unwrap();
            p
        })
        .collect()
}

fn runtime_test(backend: BackendChoice) {
    let member_bytes = 4 << 20;
    let paths = files(&format!("{backend:?}"), 2, member_bytes);
    let set = MemberSet::open(&paths, &OpenOptions { log: false, ..Default::default() }).unwrap();
    let ex = Executor::new(set, &ExecutorOptions { backend, log: false, ..Default::default() }).unwrap();
    let mut inner = MirrorEngine::new(2, member_bytes, 4096);
    // Tiny in-flight limit so clients hit Busy and the runtime must hold requests back.
    inner.max_inflight = 3;
    inner.tick_interval_ns = Some(2_000_000);
    inner.arm_tick(0);
    let ticks = Arc::new(AtomicU64::new(0));
    let unplugs = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let engine = Counted { inner, ticks: ticks.clone(), unplugs: unplugs.clone(), busy: busy.clone() };
    let rt = ArrayRuntime::start(engine, ex, &RuntimeOptions { channel_capacity: 8, ..Default::default() })
        .unwrap();

    // Two client threads, overlapping ids on purpose: the runtime keeps them apart.
    let (tx, rx) = mpsc::channel::<RequestCompletion>();
    let clients: Vec<_> = (0..2u64)
        .map(|t| {
            let h = rt.handle();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    let off = (t * 100 + i) * 4096;
                    let tx = tx.clone();
                    let req = Request::write(i, off, vec![(t * 100 + i) as u8; 4096]);
                    h.submit(req, Box::new(move |c, _| tx.send(c).unwrap()), &mut CompletionRound::default())
                        .unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    for c in clients {
        c.join().unwrap();
    }
    let done: Vec<RequestCompletion> = rx.iter().collect();
    assert_eq!(done.len(), 200);
    assert!(done.iter().all(|c| c.result == Ok(vec![])));
    let mut ids: Vec<u64> = done.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..100).flat_map(|i| [i, i]).collect::<Vec<_>>());
    assert!(busy.load(Ordering::Relaxed) > 0, "the test should have exercised Busy");
    assert!(unplugs.load(Ordering::Relaxed) > 0);

    for k in 0..200u64 {
        let c = rt.submit_wait(Request::read(7, k * 4096, 4096)).unwrap();
        assert_eq!(c.id, 7);
        assert_eq!(c.result, Ok(vec![k as u8; 4096]));
    }
    // Out of range comes back as an error, not a hang.
    let c = rt.submit_wait(Request::read(8, member_bytes, 4096)).unwrap();
    assert_eq!(c.result, Err(RequestError::OutOfRange));

    std::thread::sleep(Duration::from_millis(20));
    assert!(ticks.load(Ordering::Relaxed) >= 3, "deadline ticks: {}", ticks.load(Ordering::Relaxed));

    rt.fail_member(0).unwrap();
    let c = rt.submit_wait(Request::read(9, 4096, 4096)).unwrap();
    assert_eq!(c.result, Ok(vec![1u8; 4096]));
    let stats = rt.stats().unwrap();
    assert_eq!(stats.requests_completed, 402);
    assert_eq!(stats.requests_in_flight, 0);
    assert_eq!(stats.array.members[0].reads, 200, "reads after the fail went to member 1");
    assert_eq!(stats.array.members[1].reads, 1);

    // A panicking callback does not take the runtime down.
    rt.submit(
        Request::read(10, 0, 4096),
        Box::new(|_, _| panic!("client bug")),
        &mut CompletionRound::default(),
    )
    .unwrap();
    let handle = rt.handle();
    let report = rt.shutdown().unwrap();
    assert_eq!(report.flush, Ok(()));
    assert_eq!(report.stats.requests_completed, 403, "the final flush is the runtime's own");
    assert!(report.stats.array.members[1].flushes >= 1, "shutdown flushed the live member");
    assert_eq!(
        handle.submit(Request::flush(1), Box::new(|_, _| {}), &mut CompletionRound::default()),
        Err(RuntimeError::Stopped)
    );

    // What was written reached the files.
    let data = std::fs::read(&paths[1]).unwrap();
    assert_eq!(&data[4096 + 5 * 4096..4096 + 6 * 4096], &[5u8; 4096][..]);
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn runtime_on_io_uring() {
    runtime_test(BackendChoice::IoUring);
}

#[test]
fn runtime_on_thread_pool() {
    runtime_test(BackendChoice::ThreadPool);
}

#[test]
fn dropping_the_runtime_shuts_it_down() {
    let paths = files("drop", 1, 1 << 20);
    let set = MemberSet::open(&paths, &OpenOptions { log: false, ..Default::default() }).unwrap();
    let ex = Executor::new(set, &ExecutorOptions { log: false, ..Default::default() }).unwrap();
    let rt = ArrayRuntime::start(MirrorEngine::new(1, 1 << 20, 0), ex, &RuntimeOptions::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    rt.submit(
        Request::write(1, 0, vec![3; 4096]),
        Box::new(move |c, _| tx.send(c).unwrap()),
        &mut CompletionRound::default(),
    )
    .unwrap();
    drop(rt);
    assert_eq!(rx.recv().unwrap().result, Ok(vec![]), "in-flight work finished before the thread stopped");
    let _ = std::fs::remove_file(&paths[0]);
}

/// A small request submitted while the runtime thread sleeps runs on the submitting thread:
/// tmpfs I/O inline, the callback before `submit` returns. A large one goes to the runtime
/// thread.
#[test]
fn small_requests_run_on_the_submitting_thread() {
    let dir = PathBuf::from("/dev/shm");
    assert!(dir.is_dir(), "this test needs tmpfs at /dev/shm");
    let path = dir.join(format!("uraid-rt-submitter-{}", std::process::id()));
    std::fs::File::create(&path).unwrap().set_len(4 << 20).unwrap();
    let set = MemberSet::open(std::slice::from_ref(&path), &OpenOptions { log: false, ..Default::default() })
        .unwrap();
    assert!(set.member(0).is_memory_backed(), "/dev/shm is not tmpfs");
    let ex = Executor::new(set, &ExecutorOptions { log: false, ..Default::default() }).unwrap();
    let rt = ArrayRuntime::start(MirrorEngine::new(1, 4 << 20, 0), ex, &RuntimeOptions::default()).unwrap();
    let me = std::thread::current().id();
    let ran_on = |req: Request| {
        let (tx, rx) = mpsc::channel();
        rt.submit(
            req,
            Box::new(move |c, _| tx.send((std::thread::current().id(), c)).unwrap()),
            &mut CompletionRound::default(),
        )
        .unwrap();
        let inline = rx.try_recv().ok();
        let (thread, c) = inline.unwrap_or_else(|| rx.recv().unwrap());
        (thread, c.result)
    };
    // Let the runtime thread fall asleep first.
    std::thread::sleep(Duration::from_millis(50));
    let (thread, result) = ran_on(Request::write(1, 8192, vec![5; 4096]));
    assert_eq!(result, Ok(vec![]));
    assert_eq!(thread, me, "a 4 KiB write to tmpfs ran on the submitting thread");
    let (thread, result) = ran_on(Request::read(2, 8192, 4096));
    assert_eq!((thread, result), (me, Ok(vec![5; 4096])));
    let big = uraid_io::runtime::DEFAULT_RUN_ON_SUBMITTER_MAX_BYTES as usize * 2;
    let (thread, result) = ran_on(Request::write(3, 0, vec![6; big]));
    assert_eq!(result, Ok(vec![]));
    assert_ne!(thread, me, "a large request goes to the runtime thread");
    drop(rt);
    let _ = std::fs::remove_file(&path);
}

/// Two submitters at once: a small request that finds another submitter's round running
/// waits for that round to end and runs on its own thread (`RuntimeOptions::submitter_wait`);
/// with no wait it goes to the runtime thread, as every request of two busy connections did.
#[test]
fn a_submitter_waits_for_another_submitters_round() {
    for (wait, runs_on_its_thread) in [(Duration::from_secs(20), true), (Duration::ZERO, false)] {
        let path = PathBuf::from("/dev/shm").join(format!("uraid-rt-two-submitters-{}", std::process::id()));
        std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
        let set =
            MemberSet::open(std::slice::from_ref(&path), &OpenOptions { log: false, ..Default::default() })
                .unwrap();
        assert!(set.member(0).is_memory_backed(), "/dev/shm is not tmpfs");
        let ex = Executor::new(set, &ExecutorOptions { log: false, ..Default::default() }).unwrap();
        let opts = RuntimeOptions { submitter_wait: wait, ..RuntimeOptions::default() };
        let rt = ArrayRuntime::start(MirrorEngine::new(1, 1 << 20, 0), ex, &opts).unwrap();
        // Let the runtime thread fall asleep (it wakes by itself only after a second).
        std::thread::sleep(Duration::from_millis(50));
        // The first submitter's callback runs in its round, holding the state until released.
        let (inside_tx, inside_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let first = std::thread::spawn({
            let h = rt.handle();
            move || {
                let held = Box::new(move |c: RequestCompletion, _: &mut CompletionRound| {
                    inside_tx.send(c.result).unwrap();
                    release_rx.recv().unwrap();
                });
                h.submit(Request::write(1, 0, vec![7; 4096]), held, &mut CompletionRound::default()).unwrap();
            }
        });
        assert_eq!(inside_rx.recv().unwrap(), Ok(vec![]));
        let second = std::thread::spawn({
            let h = rt.handle();
            move || {
                let (tx, rx) = mpsc::channel();
                let done = Box::new(move |c: RequestCompletion, _: &mut CompletionRound| {
                    tx.send((std::thread::current().id(), c.result)).unwrap()
                });
                h.submit(Request::read(2, 0, 4096), done, &mut CompletionRound::default()).unwrap();
                (std::thread::current().id(), rx.recv().unwrap())
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        release_tx.send(()).unwrap();
        first.join().unwrap();
        let (second_thread, (ran_on, result)) = second.join().unwrap();
        assert_eq!(result, Ok(vec![7; 4096]));
        assert_eq!(ran_on == second_thread, runs_on_its_thread, "submitter_wait {wait:?}");
        drop(rt);
        let _ = std::fs::remove_file(&path);
    }
}

/// A submitter's round on a disk file leaves the I/O to the sleeping runtime thread and
/// must wake it: without the wake-up each request would wait for the runtime's 1 s
/// safety timeout.
#[test]
fn a_submitter_round_wakes_the_runtime_for_device_io() {
    let paths = files("wake", 1, 1 << 20);
    let set = MemberSet::open(&paths, &OpenOptions { log: false, ..Default::default() }).unwrap();
    assert!(!set.member(0).is_memory_backed(), "the test needs a member on a disk file system");
    let ex = Executor::new(set, &ExecutorOptions { log: false, ..Default::default() }).unwrap();
    let rt = ArrayRuntime::start(MirrorEngine::new(1, 1 << 20, 0), ex, &RuntimeOptions::default()).unwrap();
    for i in 0..20u64 {
        std::thread::sleep(Duration::from_millis(5));
        let t0 = std::time::Instant::now();
        let c = rt.submit_wait(Request::write(i, i * 4096, vec![i as u8; 4096])).unwrap();
        assert_eq!(c.result, Ok(vec![]));
        assert!(t0.elapsed() < Duration::from_millis(750), "write {i} took {:?}", t0.elapsed());
    }
    drop(rt);
    let _ = std::fs::remove_file(&paths[0]);
}

/// An engine whose close writes to its members itself (as an array marks its superblocks
/// clean): the closing writes go through the executor, to a member attached after the
/// start too, after every request completed; the shutdown reports the close's result.
struct Closer {
    inner: MirrorEngine,
    /// Members the close writes a block to.
    targets: Vec<usize>,
    out: Vec<MemberIo>,
    left: Option<usize>,
}

impl ArrayEngine for Closer {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError> {
        self.inner.submit(req, now_ns)
    }
    fn unplug(&mut self, now_ns: TimeNs) {
        self.inner.unplug(now_ns)
    }
    fn pop_member_io(&mut self) -> Option<MemberIo> {
        self.out.pop().or_else(|| self.inner.pop_member_io())
    }
    fn complete_member_io(&mut self, c: MemberIoCompletion, now_ns: TimeNs) {
        if uraid_core::is_array_meta_io(c.id) {
            assert_eq!(c.result, Ok(Vec::new()), "a closing write failed");
            *self.left.as_mut().unwrap() -= 1;
            return;
        }
        self.inner.complete_member_io(c, now_ns)
    }
    fn pop_completion(&mut self) -> Option<RequestCompletion> {
        self.inner.pop_completion()
    }
    fn next_deadline_ns(&self) -> Option<TimeNs> {
        self.inner.next_deadline_ns()
    }
    fn tick(&mut self, now_ns: TimeNs) {
        self.inner.tick(now_ns)
    }
    fn fail_member(&mut self, member: usize, now_ns: TimeNs) {
        self.inner.fail_member(member, now_ns)
    }
    fn is_idle(&self) -> bool {
        self.inner.is_idle()
    }
    fn stats_snapshot(&self) -> ArrayStats {
        self.inner.stats_snapshot()
    }
    fn finish_close(
        &mut self,
        flush: Result<(), RequestError>,
        _now_ns: TimeNs,
    ) -> Option<Result<(), RequestError>> {
        assert!(self.inner.is_idle(), "the close began with requests in flight");
        if self.left.is_none() {
            self.left = Some(self.targets.len());
            for (i, &member) in self.targets.iter().enumerate() {
                let id = uraid_core::ARRAY_META_IO_ID_BASE + i as u64;
                let data = vec![0xc0 + member as u8; 4096];
                self.out.push(MemberIo {
                    id,
                    member,
                    op: MemberIoOp::Write,
                    offset_bytes: 8192,
                    len_bytes: 4096,
                    data: data.into(),
                });
            }
        }
        (self.left == Some(0)).then_some(flush)
    }
}

#[test]
fn the_engines_own_close_runs_through_the_executor() {
    for backend in [BackendChoice::IoUring, BackendChoice::ThreadPool] {
        let paths = files(&format!("close-{backend:?}"), 3, 1 << 20);
        let opts = OpenOptions { log: false, ..Default::default() };
        let set = MemberSet::open(&paths[..2], &opts).unwrap();
        let ex = Executor::new(set, &ExecutorOptions { backend, log: false, ..Default::default() }).unwrap();
        let engine = Closer {
            inner: MirrorEngine::new(2, 1 << 20, 0),
            targets: vec![1, 2],
            out: Vec::new(),
            left: None,
        };
        let rt = ArrayRuntime::start(engine, ex, &RuntimeOptions::default()).unwrap();
        let h = rt.handle();
        let spare = uraid_io::real::Member::open(&paths[2], &opts).unwrap();
        let spare_index = h.control(move |_, ex, _| ex.attach_member(spare).unwrap()).unwrap();
        assert_eq!(spare_index, 2);
        let c = h.submit_wait(Request::write(1, 0, vec![7; 4096])).unwrap();
        assert_eq!(c.result, Ok(Vec::new()));
        assert_eq!(rt.shutdown().unwrap().flush, Ok(()));
        for member in [1usize, 2] {
            let on_disk = std::fs::read(&paths[member]).unwrap();
            assert_eq!(
                &on_disk[8192..12288],
                &[0xc0 + member as u8; 4096][..],
                "{backend:?} member {member}"
            );
        }
        let c = h.submit_wait(Request::read(2, 0, 4096));
        assert!(matches!(
            c,
            Err(RuntimeError::Stopped) | Ok(RequestCompletion { result: Err(RequestError::ArrayFailed), .. })
        ));
        for p in paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Reads `req` through `submit_driven` on this thread and drives the thread's ring until it
/// completes; returns the thread the completion ran on and its result.
fn driven(
    h: &uraid_io::runtime::RuntimeHandle<MirrorEngine>,
    req: Request,
    round: &mut CompletionRound,
) -> (std::thread::ThreadId, Result<Vec<u8>, RequestError>) {
    let (tx, rx) = mpsc::channel();
    h.submit_driven(
        req,
        Box::new(move |c, _| tx.send((std::thread::current().id(), c.result)).unwrap()),
        round,
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    loop {
        if let Ok(done) = rx.try_recv() {
            return done;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the request never completed");
        if h.thread_owes_io() {
            h.drive_thread_io(None, Duration::from_millis(100), round);
            round.end();
        } else {
            return rx.recv_timeout(Duration::from_secs(10)).expect("the request never completed");
        }
    }
}

/// A submitter that drives its own ring (an NBD connection thread) finishes the device I/O
/// of the rounds it runs itself: the completion of a read from a disk file runs on the
/// submitting thread, which owes that I/O until it has reaped it, and wakes no other thread
/// (before, the read went to the runtime thread's ring and completed there).
#[test]
fn a_driven_submitter_finishes_its_device_io_on_its_own_ring() {
    let paths = files("ring", 1, 1 << 20);
    let set = MemberSet::open(&paths, &OpenOptions { log: false, ..Default::default() }).unwrap();
    assert!(!set.member(0).is_memory_backed(), "the test needs a member on a disk file system");
    let ex = Executor::new(set, &ExecutorOptions { log: false, ..Default::default() }).unwrap();
    assert_eq!(
        ex.completion_mode(),
        Some(uraid_io::real::CompletionMode::Deferred),
        "this kernel has no deferred io_uring completions (6.1+): submitter rings do not apply"
    );
    let rt = ArrayRuntime::start(MirrorEngine::new(1, 1 << 20, 0), ex, &RuntimeOptions::default()).unwrap();
    let h = rt.handle();
    assert_eq!(rt.submit_wait(Request::write(1, 8192, vec![9; 4096])).unwrap().result, Ok(vec![]));
    let me = std::thread::current().id();
    let mut round = CompletionRound::default();
    for i in 0..20u64 {
        // Let the runtime thread fall asleep, so this thread runs the round.
        std::thread::sleep(Duration::from_millis(5));
        let (thread, result) = driven(&h, Request::read(10 + i, 8192, 4096), &mut round);
        assert_eq!(result, Ok(vec![9; 4096]));
        assert_eq!(thread, me, "read {i} completed on the runtime thread, not on the submitter's ring");
    }
    assert!(!h.thread_owes_io());
    h.thread_done(&mut round);
    // A plain submit never leaves I/O on this thread.
    let (tx, rx) = mpsc::channel();
    std::thread::sleep(Duration::from_millis(5));
    h.submit(Request::read(99, 8192, 4096), Box::new(move |c, _| tx.send(c.result).unwrap()), &mut round)
        .unwrap();
    assert!(!h.thread_owes_io());
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Ok(vec![9; 4096]));
    drop(rt);
    let _ = std::fs::remove_file(&paths[0]);
}

/// Several driven submitters write and read back at once, each closing its ring with I/O
/// still in flight (a connection that goes away mid-burst): every request completes with
/// the right data, and the runtime shuts down cleanly after.
#[test]
fn driven_submitters_closing_with_io_in_flight_lose_nothing() {
    let paths = files("rings", 2, 4 << 20);
    let set = MemberSet::open(&paths, &OpenOptions { log: false, ..Default::default() }).unwrap();
    let ex = Executor::new(set, &ExecutorOptions { log: false, ..Default::default() }).unwrap();
    let rt = ArrayRuntime::start(MirrorEngine::new(2, 4 << 20, 0), ex, &RuntimeOptions::default()).unwrap();
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let h = rt.handle();
            std::thread::spawn(move || {
                let mut round = CompletionRound::default();
                let (tx, rx) = mpsc::channel();
                let base = t * (1 << 20);
                for pass in 0..4u64 {
                    for i in 0..32u64 {
                        let tx = tx.clone();
                        let fill = (t * 16 + pass * 4 + i % 4) as u8;
                        h.submit_driven(
                            Request::write(i, base + i * 4096, vec![fill; 4096]),
                            Box::new(move |c, _| tx.send((i, c.result)).unwrap()),
                            &mut round,
                        )
                        .unwrap();
                    }
                    // Close the ring with whatever is still in flight, then start over.
                    h.thread_done(&mut round);
                    round.end();
                    assert!(!h.thread_owes_io());
                    for _ in 0..32 {
                        let (_, r) =
                            rx.recv_timeout(Duration::from_secs(10)).expect("a write never completed");
                        assert_eq!(r, Ok(vec![]));
                    }
                    for i in 0..32u64 {
                        let fill = (t * 16 + pass * 4 + i % 4) as u8;
                        let (_, r) = driven(&h, Request::read(100 + i, base + i * 4096, 4096), &mut round);
                        assert_eq!(r, Ok(vec![fill; 4096]), "thread {t} pass {pass} block {i}");
                    }
                }
                h.thread_done(&mut round);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let report = rt.shutdown().unwrap();
    assert_eq!(report.flush, Ok(()));
    assert_eq!(report.stats.member_ios_in_flight, 0);
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
}
