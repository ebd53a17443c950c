//! Members behind a connection (`RemoteDevice`, what an NBD export is to the executor), on
//! both backends: answers that come back on another thread wake `wait` and carry read
//! data; a device that stops answering is failed at its deadline, its late answers are
//! dropped, and it may take its slot again only once they are in.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uraid_core::{IoBytes, MemberIo, MemberIoCompletion, MemberIoError, MemberIoOp};
use uraid_io::real::{BackendChoice, Executor, ExecutorOptions, Member, MemberSet, RemoteDevice, RemoteDone};

/// An in-memory device answering from its own thread, or holding answers while `hold`.
#[derive(Default)]
struct FakeRemote {
    data: Mutex<Vec<u8>>,
    hold: Mutex<bool>,
    held: Mutex<Vec<(MemberIoOp, u64, usize, IoBytes)>>,
    /// Their answers, in the same order.
    held_done: Mutex<Vec<RemoteDone>>,
}

impl std::fmt::Debug for FakeRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FakeRemote")
    }
}

impl FakeRemote {
    fn new(len: usize) -> Arc<FakeRemote> {
        Arc::new(FakeRemote { data: Mutex::new(vec![0; len]), ..Default::default() })
    }
    fn perform(&self, op: MemberIoOp, offset: u64, len: usize, data: &IoBytes) -> Vec<u8> {
        let mut d = self.data.lock().unwrap();
        let at = offset as usize;
        match op {
            MemberIoOp::Read => d[at..at + len].to_vec(),
            MemberIoOp::Write => {
                d[at..at + len].copy_from_slice(data);
                Vec::new()
            }
            MemberIoOp::Flush => Vec::new(),
        }
    }
    /// Answers everything held, late.
    fn release(&self) {
        *self.hold.lock().unwrap() = false;
        let held: Vec<_> = std::mem::take(&mut *self.held.lock().unwrap());
        let dones: Vec<_> = std::mem::take(&mut *self.held_done.lock().unwrap());
        for ((op, offset, len, data), done) in held.into_iter().zip(dones) {
            let r = self.perform(op, offset, len, &data);
            done(Ok(r));
        }
    }
}

impl RemoteDevice for FakeRemote {
    fn size_bytes(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn identity(&self) -> u64 {
        7
    }
    fn start(&self, op: MemberIoOp, offset_bytes: u64, len_bytes: usize, data: IoBytes, done: RemoteDone) {
        if *self.hold.lock().unwrap() {
            self.held.lock().unwrap().push((op, offset_bytes, len_bytes, data));
            self.held_done.lock().unwrap().push(done);
            return;
        }
        let r = self.perform(op, offset_bytes, len_bytes, &data);
        // Answered from another thread, as a connection's reader answers.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            done(Ok(r));
        });
    }
}

fn executor(dev: &Arc<FakeRemote>, backend: BackendChoice) -> Executor {
    let m = Member::remote(std::path::Path::new("fake://remote"), dev.clone()).unwrap();
    let opts = ExecutorOptions { backend, log: false, ..Default::default() };
    Executor::new(MemberSet::from_members(vec![m]), &opts).unwrap()
}

fn io(id: u64, op: MemberIoOp, offset_bytes: u64, data: Vec<u8>, len: u64) -> MemberIo {
    MemberIo { id, member: 0, op, offset_bytes, len_bytes: len, data: data.into() }
}

/// Waits for `n` completions (at most 5 s).
fn collect(ex: &mut Executor, n: usize) -> Vec<MemberIoCompletion> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    while out.len() < n {
        ex.wait(&mut out, Some(Duration::from_secs(1)));
        assert!(t0.elapsed() < Duration::from_secs(5), "{} of {n} completions", out.len());
    }
    out
}

fn round_trip_and_deadline(backend: BackendChoice) {
    let dev = FakeRemote::new(1 << 20);
    let mut ex = executor(&dev, backend);
    assert_eq!(ex.members().member(0).size_bytes(), 1 << 20);
    for i in 0..16u64 {
        ex.submit(io(i, MemberIoOp::Write, i * 4096, vec![i as u8 + 1; 4096], 4096));
    }
    assert!(collect(&mut ex, 16).iter().all(|c| c.result.is_ok()));
    for i in 0..16u64 {
        ex.submit(io(100 + i, MemberIoOp::Read, i * 4096, Vec::new(), 4096));
    }
    for c in collect(&mut ex, 16) {
        let i = c.id - 100;
        assert_eq!(c.result.unwrap(), vec![i as u8 + 1; 4096], "read {i}");
    }
    // A device that stops answering: failed at its deadline, everything it holds too.
    ex.set_member_timeout(0, Duration::from_millis(200));
    *dev.hold.lock().unwrap() = true;
    ex.submit(io(200, MemberIoOp::Write, 0, vec![9; 4096], 4096));
    ex.submit(io(201, MemberIoOp::Read, 0, Vec::new(), 4096));
    let t0 = Instant::now();
    let done = collect(&mut ex, 2);
    assert!(done.iter().all(|c| c.result == Err(MemberIoError::Gone)), "{done:?}");
    assert!(t0.elapsed() >= Duration::from_millis(200));
    assert!(ex.member_hung(0));
    // The same device may not take the slot while its answers are out.
    let again = Member::remote(std::path::Path::new("fake://remote"), dev.clone()).unwrap();
    assert!(ex.replace_member(0, again).is_err());
    // Late answers free their slots and are not reported.
    dev.release();
    let mut out = Vec::new();
    let t0 = Instant::now();
    while ex.in_flight() > 0 || t0.elapsed() < Duration::from_millis(100) {
        ex.wait(&mut out, Some(Duration::from_millis(20)));
        assert!(t0.elapsed() < Duration::from_secs(5), "late answers not taken");
    }
    assert!(out.is_empty(), "late answers reported: {out:?}");
    let again = Member::remote(std::path::Path::new("fake://remote"), dev.clone()).unwrap();
    ex.replace_member(0, again).unwrap();
    ex.submit(io(300, MemberIoOp::Read, 0, Vec::new(), 4096));
    assert_eq!(collect(&mut ex, 1)[0].result, Ok(vec![9; 4096]));
    assert_eq!(ex.member_stats()[0].timed_out_ios, 2);
}

#[test]
fn remote_member_on_io_uring() {
    round_trip_and_deadline(BackendChoice::IoUring);
}

#[test]
fn remote_member_on_the_thread_pool() {
    round_trip_and_deadline(BackendChoice::ThreadPool);
}
