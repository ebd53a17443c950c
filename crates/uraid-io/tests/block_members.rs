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
use uraid_io::real::{Executor, ExecutorOptions, MemberKind, MemberSet, OpenOptions};

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
