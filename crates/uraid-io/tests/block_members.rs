//! Block-device members (loop devices over files on the work disk): told apart by what
//! they are, never by the file system of their device node (devtmpfs reports tmpfs's
//! magic); always O_DIRECT through the backend, never inline on the array thread; a write
//! that cannot go direct still reaches the device before it completes. And member-I/O
//! deadlines: a member that stops answering is failed, not waited on.
//!
//! These tests need root and the loop driver, as CI has; without them they fail saying so.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::run;
use uraid_core::{MemberIo, MemberIoError, MemberIoOp};
use uraid_io::loopdev::LoopDevice;
use uraid_io::real::fault::{FaultRule, Faults};
use uraid_io::real::{
    Executor, ExecutorOptions, MemberKind, MemberSet, OpenOptions, RegisteredChoice, RegisteredIo,
};

/// A folder under target/ (on the work disk, not tmpfs), removed on drop.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new(tag: &str) -> WorkDir {
        let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        WorkDir(d)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loop device over a fresh file; the device is detached before the folder goes.
fn loop_device(tag: &str, size_bytes: u64) -> (LoopDevice, WorkDir) {
    let dir = WorkDir::new(tag);
    let backing = dir.0.join("backing.img");
    let dev = LoopDevice::attach(&backing, size_bytes)
        .unwrap_or_else(|e| panic!("this test needs a loop device (root, loop driver): {e}"));
    (dev, dir)
}

fn write(id: u64, offset_bytes: u64, data: Vec<u8>) -> MemberIo {
    MemberIo {
        id,
        member: 0,
        op: MemberIoOp::Write,
        offset_bytes,
        len_bytes: data.len() as u64,
        data: data.into(),
    }
}

fn read(id: u64, offset_bytes: u64, len_bytes: u64) -> MemberIo {
    MemberIo { id, member: 0, op: MemberIoOp::Read, offset_bytes, len_bytes, data: Default::default() }
}

#[test]
fn block_device_member_is_direct_and_never_runs_inline() {
    let (dev, _dir) = loop_device("blk-direct", 8 << 20);
    let set = MemberSet::open(&[dev.path()], &OpenOptions { log: false, ..Default::default() }).unwrap();
    let m = set.member(0);
    assert_eq!(m.kind(), MemberKind::BlockDevice, "{} not seen as a block device", dev.path().display());
    assert!(!m.is_memory_backed(), "a block device must never count as memory-backed");
    assert!(m.is_direct(), "a block device is always opened O_DIRECT");
    assert_eq!(m.size_bytes(), 8 << 20);
    // Inline I/O on: a memory-backed member would run these on this thread.
    let opts = ExecutorOptions { log: false, inline_memory_io_max_bytes: 1 << 20, ..Default::default() };
    let mut ex = Executor::new(set, &opts).unwrap();
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut ios = vec![write(1, 1 << 20, block.clone())];
    // A 512-byte-sector device takes sector-aligned I/O direct too.
    let lbs = ex.members().member(0).dio_offset_align();
    ios.push(write(2, 3 * lbs, vec![0x5a; lbs as usize]));
    let done = run(&mut ex, ios);
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    let done = run(&mut ex, vec![read(3, 1 << 20, 4096), read(4, 3 * lbs, lbs)]);
    assert_eq!(done[0].result.as_deref(), Ok(&block[..]));
    assert_eq!(done[1].result.as_deref(), Ok(&vec![0x5a; lbs as usize][..]));
    let st = ex.member_stats()[0];
    assert_eq!(st.kind, Some(MemberKind::BlockDevice));
    assert_eq!(st.inline_ios, 0, "a block device's I/O ran on the calling thread");
    assert_eq!(st.buffered_ios, 0, "aligned I/O of a block device went through the page cache");
}

#[test]
fn unaligned_write_to_a_block_device_is_counted_and_lands_on_the_device() {
    let (dev, _dir) = loop_device("blk-unaligned", 4 << 20);
    let set = MemberSet::open(&[dev.path()], &OpenOptions { log: false, ..Default::default() }).unwrap();
    let mut ex = Executor::new(set, &ExecutorOptions { log: false, ..Default::default() }).unwrap();
    let done = run(&mut ex, vec![write(1, 4096 + 7, vec![0xab; 100])]);
    assert!(done[0].result.is_ok());
    assert_eq!(ex.member_stats()[0].buffered_ios, 1);
    // Read back through the backing file, around the loop device's page cache: the
    // write is there without any flush (it went with RWF_DSYNC).
    let back = std::fs::read(dev.backing()).unwrap();
    assert_eq!(&back[4096 + 7..4096 + 107], &[0xab; 100][..]);
}

#[test]
fn a_member_io_that_never_completes_fails_the_member_after_its_timeout() {
    // A disk file, with every write to it held forever (as a wedged disk would).
    let dir = WorkDir::new("hung");
    let path = dir.0.join("m.img");
    std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
    let set = MemberSet::open(&[&path], &OpenOptions { log: false, ..Default::default() }).unwrap();
    let rule = FaultRule::parse("member=0,op=write,hold").unwrap();
    let opts = ExecutorOptions {
        log: false,
        faults: Some(Arc::new(Faults::new(vec![rule]))),
        member_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let mut ex = Executor::new(set, &opts).unwrap();
    let t0 = Instant::now();
    // A read of the same member goes through; the held write times out, and with it the
    // member: the next read fails at once instead of waiting.
    let done = run(&mut ex, vec![write(1, 0, vec![1; 4096]), read(2, 8192, 4096)]);
    assert_eq!(done[0].result, Err(MemberIoError::Gone));
    assert!(done[1].result.is_ok());
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(300), "timed out early: {waited:?}");
    assert!(ex.member_hung(0));
    assert_eq!(ex.in_flight(), 0);
    let t1 = Instant::now();
    let done = run(&mut ex, vec![read(3, 0, 4096)]);
    assert_eq!(done[0].result, Err(MemberIoError::Gone));
    assert!(t1.elapsed() < Duration::from_millis(200), "a hung member's new I/O waited");
    assert_eq!(ex.member_stats()[0].timed_out_ios, 1);
    // The executor can be dropped: nothing real is outstanding.
    drop(ex);
}

fn executor_registered(dev: &LoopDevice, registered: RegisteredChoice) -> Executor {
    let set = MemberSet::open(&[dev.path()], &OpenOptions { log: false, ..Default::default() }).unwrap();
    Executor::new(set, &ExecutorOptions { log: false, registered, ..Default::default() }).unwrap()
}

#[test]
fn registered_files_and_buffers_carry_a_block_devices_io_by_default() {
    let (dev, _dir) = loop_device("blk-registered", 4 << 20);
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
    let both = |on| RegisteredChoice { files: Some(on), buffers: Some(on) };
    // Both, the default (buffers only: O_DIRECT to a disk) and neither: the same bytes.
    for (choice, registered) in [
        (both(true), RegisteredIo { files: true, buffers: true }),
        (RegisteredChoice::default(), RegisteredIo { files: false, buffers: true }),
        (both(false), RegisteredIo { files: false, buffers: false }),
    ] {
        let mut ex = executor_registered(&dev, choice);
        assert_eq!(ex.registered(), registered);
        let done = run(&mut ex, vec![write(1, 8192, block.clone()), write(2, 65536, vec![0x3c; 512])]);
        assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
        let done = run(&mut ex, vec![read(3, 8192, 4096), read(4, 65536, 512), read(5, 1 << 20, 8192)]);
        assert_eq!(done[0].result.as_deref(), Ok(&block[..]));
        assert_eq!(done[1].result.as_deref(), Ok(&[0x3c; 512][..]));
        assert_eq!(done[2].result.as_deref(), Ok(&[0; 8192][..]));
        // With files, all five went with a fixed file; with buffers, at least the two small
        // reads (their bounce buffers are registered; a write's own buffer may suit O_DIRECT).
        let expected = match registered {
            RegisteredIo { files: true, .. } => 5..=5,
            RegisteredIo { buffers: true, .. } => 2..=4,
            _ => 0..=0,
        };
        assert!(expected.contains(&ex.registered_ios()), "{} registered I/Os", ex.registered_ios());
    }
}

#[test]
fn registered_files_follow_a_replaced_member() {
    let (old, _d1) = loop_device("blk-registered-old", 4 << 20);
    let (new, _d2) = loop_device("blk-registered-new", 4 << 20);
    let mut ex = executor_registered(&old, RegisteredChoice { files: Some(true), buffers: Some(false) });
    assert!(run(&mut ex, vec![write(1, 0, vec![0x11; 4096])])[0].result.is_ok());
    let member =
        uraid_io::real::Member::open(new.path(), &OpenOptions { log: false, ..Default::default() }).unwrap();
    ex.replace_member(0, member).unwrap();
    assert!(run(&mut ex, vec![write(2, 0, vec![0x22; 4096])])[0].result.is_ok());
    assert_eq!(run(&mut ex, vec![read(3, 0, 4096)])[0].result.as_deref(), Ok(&[0x22; 4096][..]));
    // The write after the replacement went to the new device through the ring's updated
    // table, not to the old device through the slot it had before.
    assert_eq!(ex.registered_ios(), 3);
    let old_bytes = std::fs::read(old.backing()).unwrap();
    assert_eq!(&old_bytes[..4096], &[0x11; 4096][..], "the old member was written after it was replaced");
}

#[test]
fn io_poll_is_refused_for_a_loop_device_and_a_file() {
    let (dev, dir) = loop_device("blk-io-poll", 4 << 20);
    let opts = OpenOptions { log: false, ..Default::default() };
    let m = uraid_io::real::Member::open(dev.path(), &opts).unwrap();
    // Loop devices have no poll queues (queue/io_poll is 0).
    let e = m.io_poll_queue().unwrap_err();
    assert!(e.contains("no poll queues") && e.contains("io_poll is 0"), "{e}");
    let file = dir.0.join("plain.img");
    std::fs::File::create(&file).unwrap().set_len(1 << 20).unwrap();
    let f = uraid_io::real::Member::open(&file, &opts).unwrap();
    let e = f.io_poll_queue().unwrap_err();
    assert!(e.contains("not a block device"), "{e}");
    let e = uraid_io::real::check_io_poll([m.io_poll_queue(), f.io_poll_queue()]).unwrap_err();
    assert!(e.contains(&dev.path().display().to_string()), "the refusal names the member: {e}");
}
