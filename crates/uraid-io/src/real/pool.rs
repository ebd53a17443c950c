//! Thread-pool backend: pread/pwrite/fdatasync on worker threads, for kernels or sandboxes
//! without io_uring.

use std::collections::VecDeque;
use std::os::unix::io::RawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use uraid_core::{MemberIoError, MemberIoOp};

use super::{errno_to_error, MemberSet, Slot};

struct Job {
    idx: usize,
    fd: RawFd,
    op: MemberIoOp,
    offset_bytes: u64,
    /// Buffer address (owned by the executor's slot, unmoved until the job is reaped).
    ptr: usize,
    len_bytes: usize,
    sync_write: bool,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
    shutdown: bool,
}

#[derive(Default)]
struct Done {
    list: Vec<(usize, Result<(), MemberIoError>)>,
    woken: bool,
}

#[derive(Default)]
pub struct Shared {
    jobs: Mutex<Jobs>,
    jobs_cv: Condvar,
    done: Mutex<Done>,
    done_cv: Condvar,
}

/// A poisoned lock only means another thread panicked; the data (plain queues) is fine.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn wake(&self) {
        lock(&self.done).woken = true;
        self.done_cv.notify_all();
    }

    /// Blocks until a job finished or a wake-up came (both stay for the next `reap`), or
    /// `timeout` passed.
    pub fn wait_for_completion(&self, timeout: Duration) {
        let done = lock(&self.done);
        let _ = self.done_cv.wait_timeout_while(done, timeout, |d| d.list.is_empty() && !d.woken);
    }
}

pub struct PoolBackend {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    outstanding: usize,
    _members: Arc<MemberSet>,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

fn run(job: &Job) -> Result<(), MemberIoError> {
    // SAFETY: the job's buffer is owned by the executor's slot, unmoved and untouched by
    // anyone else until the job is reaped.
    unsafe { sync_io(job.fd, job.op, job.offset_bytes, job.ptr as *mut u8, job.len_bytes, job.sync_write) }
}

/// One member I/O as plain syscalls on the calling thread: pread/pwrite until done,
/// fdatasync for a flush. Shared by the pool's workers and the executor's inline path.
/// `sync_write`: each write reaches the device before it returns (`RWF_DSYNC`).
///
/// # Safety
/// `ptr` must be valid for `len_bytes` (writable for reads) for the whole call, and `fd`
/// must stay open.
pub(super) unsafe fn sync_io(
    fd: RawFd,
    op: MemberIoOp,
    offset_bytes: u64,
    ptr: *mut u8,
    len_bytes: usize,
    sync_write: bool,
) -> Result<(), MemberIoError> {
    if op == MemberIoOp::Flush {
        loop {
            // SAFETY: plain syscall on a descriptor the caller keeps open.
            if unsafe { libc::fdatasync(fd) } == 0 {
                return Ok(());
            }
            let e = errno();
            if e != libc::EINTR {
                return Err(errno_to_error(e));
            }
        }
    }
    let mut done = 0usize;
    while done < len_bytes {
        // SAFETY: done < len_bytes, inside the caller's buffer.
        let p = unsafe { ptr.add(done) }.cast::<libc::c_void>();
        let n = len_bytes - done;
        let off = (offset_bytes + done as u64) as libc::off_t;
        // SAFETY: the caller guarantees the buffer is valid for len_bytes.
        let r = unsafe {
            match op {
                MemberIoOp::Read => libc::pread(fd, p, n, off),
                _ if sync_write => {
                    let iov = libc::iovec { iov_base: p, iov_len: n };
                    libc::pwritev2(fd, &iov, 1, off, libc::RWF_DSYNC)
                }
                _ => libc::pwrite(fd, p, n, off),
            }
        };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(errno_to_error(e));
        }
        if r == 0 {
            // End of file or no room: no progress is an error.
            return Err(MemberIoError::Io);
        }
        done += r as usize;
    }
    Ok(())
}

impl PoolBackend {
    pub fn new(members: Arc<MemberSet>, threads: usize) -> Self {
        let shared = Arc::new(Shared::default());
        let threads = (0..threads.max(1))
            .map(|i| {
                let shared = shared.clone();
                let members = members.clone();
                std::thread::Builder::new()
                    .name(format!("uraid-io-{i}"))
                    .spawn(move || {
                        let _keep_fds_open = members;
                        loop {
                            let job = {
                                let mut jobs = lock(&shared.jobs);
                                loop {
                                    if let Some(j) = jobs.queue.pop_front() {
                                        break Some(j);
                                    }
                                    if jobs.shutdown {
                                        break None;
                                    }
                                    jobs = shared.jobs_cv.wait(jobs).unwrap_or_else(|p| p.into_inner());
                                }
                            };
                            let Some(job) = job else { return };
                            let result = run(&job);
                            lock(&shared.done).list.push((job.idx, result));
                            shared.done_cv.notify_all();
                        }
                    })
                    .expect("spawn uraid-io worker thread")
            })
            .collect();
        PoolBackend {
            shared,
            threads,
            slots: Vec::new(),
            free: Vec::new(),
            outstanding: 0,
            _members: members,
        }
    }

    pub fn slots_mut(&mut self) -> impl Iterator<Item = &mut Slot> {
        self.slots.iter_mut().flatten()
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    pub fn push(&mut self, mut slot: Slot) {
        let job_ptr = slot.buf.ptr() as usize;
        let job = Job {
            idx: 0,
            fd: slot.fd,
            op: slot.op,
            offset_bytes: slot.offset_bytes,
            ptr: job_ptr,
            len_bytes: slot.len_bytes,
            sync_write: slot.sync_write,
        };
        let idx = super::put_slot(&mut self.slots, &mut self.free, slot);
        self.outstanding += 1;
        lock(&self.shared.jobs).queue.push_back(Job { idx, ..job });
        self.shared.jobs_cv.notify_one();
    }

    pub fn reap(&mut self, finished: &mut Vec<(Slot, Result<(), MemberIoError>)>, timeout: Option<Duration>) {
        let list = {
            let mut done = lock(&self.shared.done);
            if done.list.is_empty() && !done.woken && timeout != Some(Duration::ZERO) {
                done = match timeout {
                    None => self
                        .shared
                        .done_cv
                        .wait_while(done, |d| d.list.is_empty() && !d.woken)
                        .unwrap_or_else(|p| p.into_inner()),
                    Some(t) => {
                        self.shared
                            .done_cv
                            .wait_timeout_while(done, t, |d| d.list.is_empty() && !d.woken)
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                    }
                };
            }
            done.woken = false;
            std::mem::take(&mut done.list)
        };
        for (idx, result) in list {
            if let Some(mut slot) = self.slots.get_mut(idx).and_then(Option::take) {
                if result.is_ok() {
                    slot.done_bytes = slot.len_bytes;
                }
                self.free.push(idx);
                self.outstanding -= 1;
                finished.push((slot, result));
            }
        }
    }

    pub fn shutdown(&mut self) {
        // Workers finish the queued jobs first (they pop before checking shutdown).
        lock(&self.shared.jobs).shutdown = true;
        self.shared.jobs_cv.notify_all();
        if self.slots.iter().flatten().any(|s| s.abandoned) {
            // A worker is stuck in a syscall on a hung device and may never return: leave
            // the workers and every buffer they may still write to, rather than wait forever.
            self.threads.clear();
            std::mem::forget(std::mem::take(&mut self.slots));
            return;
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let mut sink = Vec::new();
        self.reap(&mut sink, Some(Duration::ZERO));
    }
}
