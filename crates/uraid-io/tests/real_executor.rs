//! The real executor on temporary files, through both backends, on tmpfs (buffered: tmpfs
//! refuses O_DIRECT) and on the work disk (O_DIRECT where the file system allows it).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::run;
use uraid_core::{MemberIo, MemberIoError, MemberIoOp};
use uraid_io::real::{
    BackendChoice, BackendKind, Executor, ExecutorOptions, MemberSet, OpenOptions, RegisteredIo,
};

fn temp_file(dir: &Path, name: &str, len: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(format!("{name}-{}", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(len).unwrap();
    p
}

fn dirs() -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from(env!("CARGO_TARGET_TMPDIR"))];
    if Path::new("/dev/shm").is_dir() {
        v.push(PathBuf::from("/dev/shm"));
    }
    v
}

fn executor(paths: &[PathBuf], backend: BackendChoice, qd: usize) -> Executor {
    executor_with(paths, backend, qd, false)
}

fn executor_with(paths: &[PathBuf], backend: BackendChoice, qd: usize, inline: bool) -> Executor {
    let members = MemberSet::open(paths, &OpenOptions { log: false, ..Default::default() }).unwrap();
    // Inline I/O is off unless asked for: most tests are about the backends, and on
    // /dev/shm inline I/O would bypass them.
    let opts = ExecutorOptions {
        backend,
        queue_depth_per_member: qd,
        pool_threads: 4,
        log: false,
        inline_memory_io_max_bytes: if inline { 1 << 20 } else { 0 },
        ..Default::default()
    };
    Executor::new(members, &opts).expect("io_uring must be available on this machine (io_uring_disabled=0)")
}

fn io(id: u64, member: usize, op: MemberIoOp, offset_bytes: u64, len_bytes: u64, data: Vec<u8>) -> MemberIo {
    MemberIo { id, member, op, offset_bytes, len_bytes, data: data.into() }
}

fn exercise(backend: BackendChoice, expect: BackendKind, inline: bool) {
    for dir in dirs() {
        let size = 1 << 20;
        // Names of their own: the tests run in parallel and each removes its files.
        let tag = format!("{backend:?}-{inline}");
        let paths =
            vec![temp_file(&dir, &format!("m0-{tag}"), size), temp_file(&dir, &format!("m1-{tag}"), size)];
        let mut ex = executor_with(&paths, backend, 4, inline);
        assert_eq!(ex.backend(), expect);
        let aligned: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        let odd: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 1) as u8).collect();
        let done = run(
            &mut ex,
            vec![
                io(1, 0, MemberIoOp::Write, 8192, 8192, aligned.clone()),
                io(2, 1, MemberIoOp::Write, 5000, 1000, odd.clone()),
                // Malformed: payload length differs from len_bytes.
                io(3, 0, MemberIoOp::Write, 0, 4096, vec![1; 10]),
                io(4, 7, MemberIoOp::Read, 0, 4096, vec![]),
            ],
        );
        assert!(done[0].result.is_ok() && done[1].result.is_ok(), "{dir:?}: {done:?}");
        assert_eq!(done[2].result, Err(MemberIoError::Io));
        assert_eq!(done[3].result, Err(MemberIoError::Gone));
        let done = run(
            &mut ex,
            vec![
                io(10, 0, MemberIoOp::Read, 8192, 8192, vec![]),
                io(11, 1, MemberIoOp::Read, 5000, 1000, vec![]),
                io(12, 0, MemberIoOp::Flush, 0, 0, vec![]),
                io(13, 1, MemberIoOp::Flush, 0, 0, vec![]),
                // Beyond the end of a regular file: an error, not a panic or zeroes.
                io(14, 0, MemberIoOp::Read, size, 4096, vec![]),
                io(15, 0, MemberIoOp::Read, size - 4096, 8192, vec![]),
                io(16, 1, MemberIoOp::Read, size + 100, 100, vec![]),
            ],
        );
        assert_eq!(done[0].result.as_deref(), Ok(&aligned[..]), "{dir:?}");
        assert_eq!(done[1].result.as_deref(), Ok(&odd[..]), "{dir:?}");
        assert_eq!(done[2].result, Ok(vec![]));
        assert_eq!(done[3].result, Ok(vec![]));
        for c in &done[4..] {
            assert_eq!(c.result, Err(MemberIoError::Io), "{dir:?} id {}", c.id);
        }
        // More I/Os than the queue depth: they wait in the executor and all complete.
        let writes: Vec<MemberIo> = (0..64u64)
            .map(|i| io(100 + i, (i % 2) as usize, MemberIoOp::Write, i * 4096, 4096, vec![i as u8; 4096]))
            .collect();
        assert!(run(&mut ex, writes).iter().all(|c| c.result.is_ok()));
        let reads: Vec<MemberIo> = (0..64u64)
            .map(|i| io(200 + i, (i % 2) as usize, MemberIoOp::Read, i * 4096, 4096, vec![]))
            .collect();
        for (i, c) in run(&mut ex, reads).iter().enumerate() {
            assert_eq!(c.result.as_deref(), Ok(&vec![i as u8; 4096][..]));
        }
        drop(ex);
        for p in paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[test]
fn io_uring_backend() {
    exercise(BackendChoice::IoUring, BackendKind::IoUring, false);
}

#[test]
fn thread_pool_backend() {
    exercise(BackendChoice::ThreadPool, BackendKind::ThreadPool, false);
}

#[test]
fn inline_memory_io_same_results() {
    exercise(BackendChoice::IoUring, BackendKind::IoUring, true);
}

#[test]
fn memory_backed_members_complete_inline() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let disk = temp_file(Path::new(env!("CARGO_TARGET_TMPDIR")), "inline-disk", 1 << 16);
    let mem = temp_file(shm, "inline-mem", 1 << 16);
    let mut ex = executor_with(&[disk.clone(), mem.clone()], BackendChoice::IoUring, 4, true);
    assert!(!ex.members().member(0).is_memory_backed());
    assert!(ex.members().member(1).is_memory_backed());
    ex.submit(io(1, 1, MemberIoOp::Write, 4096, 4096, vec![9; 4096]));
    ex.submit(io(2, 1, MemberIoOp::Read, 4096, 4096, vec![]));
    ex.submit(io(3, 1, MemberIoOp::Flush, 0, 0, vec![]));
    // Done inside submit: a non-blocking poll right away returns all three.
    let mut out = Vec::new();
    assert_eq!(ex.poll(&mut out), 3);
    assert_eq!(out[1].result.as_deref(), Ok(&[9u8; 4096][..]));
    assert!(out[0].result.is_ok() && out[2].result.is_ok());
    assert_eq!(ex.in_flight(), 0);
    drop(ex);
    let _ = std::fs::remove_file(disk);
    let _ = std::fs::remove_file(mem);
}

#[test]
fn auto_prefers_io_uring_and_waker_interrupts_wait() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let paths = vec![temp_file(&dir, "wake", 1 << 16)];
    for backend in [BackendChoice::Auto, BackendChoice::ThreadPool] {
        let mut ex = executor(&paths, backend, 8);
        let waker = ex.waker();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            waker.wake();
        });
        let start = Instant::now();
        let mut out = Vec::new();
        ex.wait(&mut out, Some(Duration::from_secs(10)));
        assert!(start.elapsed() < Duration::from_secs(5), "{backend:?}: waker did not interrupt wait");
        assert!(out.is_empty());
        t.join().unwrap();
    }
    let _ = std::fs::remove_file(&paths[0]);
}

#[test]
fn direct_io_is_used_where_the_file_system_allows_it() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let p = temp_file(&dir, "direct", 1 << 16);
    let set = MemberSet::open(&[&p], &OpenOptions { log: false, ..Default::default() }).unwrap();
    eprintln!("{}: O_DIRECT {}", p.display(), set.member(0).is_direct());
    if Path::new("/dev/shm").is_dir() {
        let q = temp_file(Path::new("/dev/shm"), "direct", 1 << 16);
        let set = MemberSet::open(&[&q], &OpenOptions { log: false, ..Default::default() }).unwrap();
        // tmpfs refuses O_DIRECT (kernels before 6.6) or accepts it; either way I/O works.
        eprintln!("{}: O_DIRECT {}", q.display(), set.member(0).is_direct());
        let _ = std::fs::remove_file(q);
    }
    let _ = std::fs::remove_file(p);
}

/// A read may carry a spare buffer to fill (the stripe cache recycles its buffers that way):
/// the executor reads into it when nothing else holds it, and never writes into a buffer
/// that is shared.
#[test]
fn reads_fill_a_spare_buffer_only_when_unshared() {
    for dir in dirs() {
        for backend in [BackendChoice::IoUring, BackendChoice::ThreadPool] {
            let path = temp_file(&dir, "spare", 1 << 16);
            let mut ex = executor(std::slice::from_ref(&path), backend, 4);
            let data: Vec<u8> = (0..8192u32).map(|i| (i * 11 + 3) as u8).collect();
            assert!(run(&mut ex, vec![io(1, 0, MemberIoOp::Write, 4096, 8192, data.clone())])[0]
                .result
                .is_ok());

            let spare = vec![0xEEu8; 8192];
            let spare_ptr = spare.as_ptr();
            let got = run(&mut ex, vec![io(2, 0, MemberIoOp::Read, 4096, 8192, spare)]);
            let got = got[0].result.as_ref().expect("read");
            assert_eq!(&got[..], &data[..], "{dir:?} {backend:?}");
            // On tmpfs (buffered, or O_DIRECT without a bounce buffer) the bytes land in
            // the spare buffer itself.
            if dir == Path::new("/dev/shm") {
                assert_eq!(got.as_ptr(), spare_ptr, "{backend:?}: the spare buffer was not used");
            }

            let shared = std::sync::Arc::new(vec![0xEEu8; 8192]);
            let view = uraid_core::IoBytes::slice(&shared, 0..8192);
            let read = MemberIo {
                id: 3,
                member: 0,
                op: MemberIoOp::Read,
                offset_bytes: 4096,
                len_bytes: 8192,
                data: view,
            };
            let got = run(&mut ex, vec![read]);
            assert_eq!(got[0].result.as_deref(), Ok(&data[..]), "{dir:?} {backend:?}");
            assert!(shared.iter().all(|&b| b == 0xEE), "{backend:?}: a shared buffer was written");
            drop(ex);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Linux's (major, minor) from uname, (0, 0) if it cannot be read.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The array thread is the ring's only issuer where the kernel has DEFER_TASKRUN (6.1):
/// completion work waits for it instead of interrupting it. The executor is built on
/// one thread and driven by another, as `uraid serve` does: the driving thread, the first
/// to submit, must become the ring's issuer (a ring bound to the builder answers EEXIST).
#[test]
fn a_ring_built_on_one_thread_is_driven_by_another_with_deferred_completions() {
    use uraid_io::real::CompletionMode;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let paths = vec![temp_file(&dir, "deferred-m0", 1 << 20)];
    let ex = executor(&paths, BackendChoice::IoUring, 8);
    if kernel_version() >= (6, 1) {
        assert_eq!(ex.completion_mode(), Some(CompletionMode::Deferred));
    }
    let data: Vec<u8> = (0..16384u32).map(|i| (i * 31 + 7) as u8).collect();
    let expect = data.clone();
    let read_back = std::thread::spawn(move || {
        let mut ex = ex;
        let w = run(&mut ex, vec![io(1, 0, MemberIoOp::Write, 4096, 16384, data)]);
        assert!(w[0].result.is_ok(), "{w:?}");
        let r = run(&mut ex, vec![io(2, 0, MemberIoOp::Read, 4096, 16384, vec![])]);
        r.into_iter().next().expect("one completion").result.expect("read")
    })
    .join()
    .expect("the driving thread");
    assert_eq!(&read_back[..], &expect[..]);
    let _ = std::fs::remove_file(&paths[0]);
}

#[test]
fn registered_buffers_only_where_members_go_direct_to_a_disk() {
    let disk = temp_file(Path::new(env!("CARGO_TARGET_TMPDIR")), "registered-auto", 1 << 16);
    let ex = executor(std::slice::from_ref(&disk), BackendChoice::IoUring, 4);
    assert_eq!(ex.registered(), RegisteredIo { files: false, buffers: true });
    // A pool worker may outlive the executor on a hung device: never registered memory.
    let ex = executor(std::slice::from_ref(&disk), BackendChoice::ThreadPool, 4);
    assert!(!ex.registered().buffers);
    if Path::new("/dev/shm").is_dir() {
        // Memory members' small I/O runs inline: nothing would use the pinned region.
        let shm = temp_file(Path::new("/dev/shm"), "registered-auto", 1 << 16);
        let ex = executor(std::slice::from_ref(&shm), BackendChoice::IoUring, 4);
        assert_eq!(ex.registered(), RegisteredIo::default());
        let _ = std::fs::remove_file(&shm);
    }
    let _ = std::fs::remove_file(&disk);
}
