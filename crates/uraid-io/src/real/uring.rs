//! io_uring backend.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};
use uraid_core::{MemberIoError, MemberIoOp};

use super::registered::{BufferRegion, RegisteredIo, RingRegistration};
use super::{errno_to_error, IoBuf, MemberSet, Slot};

const WAKE_TOKEN: u64 = u64::MAX;
/// A client thread's own ring (see `guest.rs`) polls that thread's socket with it.
const POLL_TOKEN: u64 = u64::MAX - 1;

pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN) already wakes.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// How the kernel hands completions over (chosen once, by what the kernel accepts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionMode {
    /// `SINGLE_ISSUER | DEFER_TASKRUN` (6.1+): completion work waits until the ring's one
    /// thread asks for events, in a batch, instead of interrupting it or another thread.
    Deferred,
    /// `COOP_TASKRUN` (5.19+): completion work runs at this thread's next kernel entry.
    Cooperative,
    /// Older kernels: completion work interrupts the thread (an IPI).
    Interrupting,
}

impl std::fmt::Display for CompletionMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CompletionMode::Deferred => {
                "completions deferred to the array thread (SINGLE_ISSUER, DEFER_TASKRUN)"
            }
            CompletionMode::Cooperative => "cooperative completions (COOP_TASKRUN)",
            CompletionMode::Interrupting => "completions by interrupt (no COOP_TASKRUN)",
        })
    }
}

/// The most capable ring the kernel accepts. A deferred ring starts disabled: the thread
/// that first uses it (the array thread, not the one that built the executor) enables it
/// and becomes its only issuer (see `enable`).
fn build_ring(entries: u32) -> io::Result<(IoUring, CompletionMode)> {
    let mut b = IoUring::builder();
    b.setup_cqsize(entries * 2);
    let deferred = b
        .clone()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .setup_r_disabled()
        .build(entries);
    if let Ok(r) = deferred {
        return Ok((r, CompletionMode::Deferred));
    }
    if let Ok(r) = b.clone().setup_coop_taskrun().setup_taskrun_flag().build(entries) {
        return Ok((r, CompletionMode::Cooperative));
    }
    Ok((b.build(entries)?, CompletionMode::Interrupting))
}

/// A polled ring (`IORING_SETUP_IOPOLL`): the kernel posts a completion only when this
/// thread asks (`io_uring_enter` with `GETEVENTS` polls the device's poll queues), and it
/// takes nothing but O_DIRECT reads and writes. Single-issuer where the kernel has it,
/// enabled by its first user as [`build_ring`]'s deferred ring is.
fn build_polled_ring(entries: u32) -> io::Result<(IoUring, bool)> {
    let mut b = IoUring::builder();
    b.setup_cqsize(entries * 2).setup_iopoll();
    if let Ok(r) = b.clone().setup_single_issuer().setup_r_disabled().build(entries) {
        return Ok((r, true));
    }
    Ok((b.build(entries)?, false))
}

pub struct UringBackend {
    completions: CompletionMode,
    /// An `IORING_SETUP_IOPOLL` ring ([`UringBackend::new_polled`]): no wake-up or socket
    /// poll on it, and nothing completes unless this thread polls it.
    polled: bool,
    /// A deferred ring not enabled yet (no I/O so far).
    disabled: bool,
    ring: IoUring,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    eventfd: Arc<EventFd>,
    /// Target of the pending eventfd read; boxed so its address is stable.
    eventfd_buf: Box<u64>,
    eventfd_armed: bool,
    /// I/Os pushed and not yet completed (submitted or not).
    outstanding: usize,
    /// While fewer of our I/Os than this are in the kernel, each new one is handed over at
    /// once rather than with the next batch (see `push`).
    submit_at_once_below: usize,
    /// Scratch list of (user_data, result) for `reap`.
    cqes: Vec<(u64, i32)>,
    /// A socket poll is in the kernel (`arm_poll`).
    poll_armed: bool,
    /// That poll completed since it was last armed.
    poll_fired: bool,
    /// Registered files and buffers (`registered.rs`).
    reg: RingRegistration,
    /// Entries pushed with a registered file or buffer.
    registered_ios: u64,
    /// I/Os pushed (see [`UringBackend::pushed`]).
    pushed: u64,
    /// A polled ring's I/Os the device refused to poll (see [`UringBackend::take_refused`]).
    refused: Vec<Slot>,
}

impl UringBackend {
    /// `queue_depth`: the most I/Os the executor keeps in flight. `region`: the executor's
    /// registered bounce buffers, if it has them (kept alive as long as the ring).
    pub fn new(
        entries: u32,
        queue_depth: usize,
        registered: RegisteredIo,
        region: Option<Arc<BufferRegion>>,
    ) -> io::Result<Self> {
        let (ring, completions) = build_ring(entries)?;
        Self::with_ring(
            ring,
            completions,
            completions == CompletionMode::Deferred,
            false,
            queue_depth,
            registered,
            region,
        )
    }

    /// A polled ring (`IORING_SETUP_IOPOLL`, see [`build_polled_ring`]) for O_DIRECT reads
    /// and writes of members whose queues have poll queues; its owner must reap it by
    /// polling ([`poll_pass`], or `reap`, which spins) while it holds I/O.
    pub fn new_polled(
        entries: u32,
        queue_depth: usize,
        registered: RegisteredIo,
        region: Option<Arc<BufferRegion>>,
    ) -> io::Result<Self> {
        let (ring, single_issuer) = build_polled_ring(entries)?;
        // Its completions never wait for task work: the polling thread posts them itself.
        Self::with_ring(
            ring,
            CompletionMode::Interrupting,
            single_issuer,
            true,
            queue_depth,
            registered,
            region,
        )
    }

    fn with_ring(
        ring: IoUring,
        completions: CompletionMode,
        disabled: bool,
        polled: bool,
        queue_depth: usize,
        registered: RegisteredIo,
        region: Option<Arc<BufferRegion>>,
    ) -> io::Result<Self> {
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring lacks IORING_FEAT_EXT_ARG (kernel < 5.11)",
            ));
        }
        Ok(UringBackend {
            disabled,
            polled,
            completions,
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            eventfd: Arc::new(EventFd::new()?),
            eventfd_buf: Box::new(0),
            eventfd_armed: false,
            outstanding: 0,
            submit_at_once_below: queue_depth * 3 / 4,
            cqes: Vec::new(),
            poll_armed: false,
            poll_fired: false,
            reg: RingRegistration::new(registered, region),
            registered_ios: 0,
            pushed: 0,
            refused: Vec::new(),
        })
    }

    pub fn slots_mut(&mut self) -> impl Iterator<Item = &mut Slot> {
        self.slots.iter_mut().flatten()
    }

    pub fn eventfd(&self) -> Arc<EventFd> {
        self.eventfd.clone()
    }

    pub fn push(&mut self, slot: Slot) {
        let idx = super::put_slot(&mut self.slots, &mut self.free, slot);
        self.outstanding += 1;
        self.pushed += 1;
        self.push_sqe(idx);
        // With the device's queue running low, an I/O held back for a batch is time the
        // device sits idle: after a burst of completions, handing the replacements over one
        // by one lets the device start on the first while the rest are still being issued,
        // where one batch at the end would start them all only after the last. With enough
        // in the kernel the batch costs the device nothing and saves system calls.
        // Entries still in the submission queue are not in the kernel yet.
        let unsubmitted = self.ring.submission().len();
        if self.outstanding.saturating_sub(unsubmitted) < self.submit_at_once_below {
            self.submit_pending();
        }
    }

    fn push_sqe(&mut self, idx: usize) {
        let Some(s) = self.slots[idx].as_mut() else { return };
        let remaining = (s.len_bytes - s.done_bytes) as u32;
        let offset = s.offset_bytes + s.done_bytes as u64;
        // SAFETY (for the pointer arithmetic): done_bytes <= len_bytes <= buffer capacity.
        let ptr = unsafe { s.buf.ptr().add(s.done_bytes) };
        // Registered buffer 0 is the executor's region (`registered.rs`).
        let fixed_buf = matches!(s.buf, IoBuf::Registered { .. }) && self.reg.buffers_registered();
        let rw_flags = if s.sync_write { libc::RWF_DSYNC } else { 0 };
        // The same entry on a fixed-file slot or a plain descriptor (distinct types).
        macro_rules! entry {
            ($fd:expr) => {
                match (s.op, fixed_buf) {
                    (MemberIoOp::Read, false) => {
                        opcode::Read::new($fd, ptr, remaining).offset(offset).build()
                    }
                    (MemberIoOp::Read, true) => {
                        opcode::ReadFixed::new($fd, ptr, remaining, 0).offset(offset).build()
                    }
                    (MemberIoOp::Write, false) => {
                        opcode::Write::new($fd, ptr, remaining).offset(offset).rw_flags(rw_flags).build()
                    }
                    (MemberIoOp::Write, true) => opcode::WriteFixed::new($fd, ptr, remaining, 0)
                        .offset(offset)
                        .rw_flags(rw_flags)
                        .build(),
                    (MemberIoOp::Flush, _) => {
                        opcode::Fsync::new($fd).flags(types::FsyncFlags::DATASYNC).build()
                    }
                }
            };
        }
        let file_slot = self.reg.file_slot(s.set_gen, s.fd);
        if file_slot.is_some() || fixed_buf {
            self.registered_ios += 1;
        }
        let entry = match file_slot {
            Some(slot) => entry!(types::Fixed(slot)),
            None => entry!(types::Fd(s.fd)),
        }
        .user_data(idx as u64);
        let entry = if s.force_async { entry.flags(squeue::Flags::ASYNC) } else { entry };
        self.push_entry(&entry);
    }

    /// Registers what this ring uses of member set `gen` and the bounce buffers, where not
    /// done yet: the issuing thread's call, before it pushes an I/O of that set.
    pub fn prepare_registered(&mut self, gen: u64, members: &MemberSet) {
        self.enable();
        self.reg.prepare(&self.ring, gen, members);
    }

    /// The I/Os a polled ring's device refused to poll (`EOPNOTSUPP`), as they were: to be
    /// done again on a ring that takes interrupts.
    pub fn take_refused(&mut self) -> Vec<Slot> {
        std::mem::take(&mut self.refused)
    }

    /// I/Os handed to this ring so far (a short transfer's rest not counted again).
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    pub fn registered_ios(&self) -> u64 {
        self.registered_ios
    }

    pub fn completion_mode(&self) -> CompletionMode {
        self.completions
    }

    /// Enables a deferred ring on the calling thread, which becomes its only issuer: every
    /// later submit and wait must come from it (the kernel answers EEXIST otherwise). The
    /// executor is built on one thread and driven by the array thread; nothing is
    /// submitted before the hand-over, so the first use is the array thread's.
    fn enable(&mut self) {
        if self.disabled {
            self.disabled = false;
            if let Err(e) = self.ring.submitter().register_enable_rings() {
                // Cannot happen on a ring the kernel just built disabled; a ring left
                // disabled fails every submit, which the executor reports as I/O errors.
                eprintln!("uraid-io: enabling the io_uring ring failed: {e}");
            }
        }
    }

    fn push_entry(&mut self, entry: &squeue::Entry) {
        self.enable();
        loop {
            // SAFETY: every buffer an entry points to lives in `slots` (or eventfd_buf) until
            // its completion is reaped; `drain` waits for all before drop.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return;
            }
            // Submission queue full: hand what is queued to the kernel and retry.
            if let Err(e) = self.ring.submit() {
                if e.raw_os_error() != Some(libc::EBUSY) && e.raw_os_error() != Some(libc::EINTR) {
                    // Cannot happen with a healthy ring; do not spin forever on it.
                    std::thread::yield_now();
                }
            }
        }
    }

    fn arm_eventfd(&mut self) {
        // A polled ring takes only O_DIRECT reads and writes; it is never slept in.
        if self.eventfd_armed || self.polled {
            return;
        }
        let ptr: *mut u64 = &mut *self.eventfd_buf;
        let entry = opcode::Read::new(types::Fd(self.eventfd.fd.as_raw_fd()), ptr.cast(), 8)
            .build()
            .user_data(WAKE_TOKEN);
        self.push_entry(&entry);
        self.eventfd_armed = true;
    }

    /// Hands queued entries to the kernel, and lets it post completion work waiting for
    /// this thread (`IORING_SQ_TASKRUN`: a deferred ring posts nothing until asked).
    pub fn submit_pending(&mut self) {
        let sq = self.ring.submission();
        if !sq.is_empty() || sq.taskrun() {
            drop(sq);
            let _ = self.ring.submit();
        }
    }

    /// Arms the wake-up and submits what is queued, for a sleep in
    /// [`wait_for_completion`] on another borrow of the ring; `None` when completions are
    /// waiting already.
    pub fn prepare_sleep(&mut self) -> Option<std::os::fd::RawFd> {
        self.arm_eventfd();
        self.submit_pending();
        let fd = self.ring.as_raw_fd();
        self.ring.completion().is_empty().then_some(fd)
    }

    pub fn reap(&mut self, finished: &mut Vec<(Slot, Result<(), MemberIoError>)>, timeout: Option<Duration>) {
        self.enable();
        let may_block = timeout != Some(Duration::ZERO);
        if may_block && !self.polled {
            self.arm_eventfd();
        }
        let cq_empty = self.ring.completion().is_empty();
        if self.polled {
            // Nothing posts a polled ring's completions but this thread's polling.
            self.spin(timeout.unwrap_or(Duration::MAX));
        } else if may_block && cq_empty {
            let r = match timeout {
                None => self.ring.submit_and_wait(1),
                Some(t) => {
                    let ts = types::Timespec::from(t);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                }
            };
            // ETIME (timeout) and EINTR are ordinary wake-ups; completions are read below.
            let _ = r;
        } else {
            self.submit_pending();
        }
        // Copied out first (retrying a short transfer pushes to the ring); the list is reused.
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(ud, res) in &cqes {
            if ud == WAKE_TOKEN {
                self.eventfd_armed = false;
                continue;
            }
            if ud == POLL_TOKEN {
                self.poll_armed = false;
                self.poll_fired = true;
                continue;
            }
            let idx = ud as usize;
            let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else { continue };
            if self.polled && res == -libc::EOPNOTSUPP && !slot.abandoned {
                // Not an error of the device's data: it cannot poll this I/O (a queue without
                // poll queues fails polled bios so). The owner sends it the other way.
                if let Some(slot) = self.slots[idx].take() {
                    self.free.push(idx);
                    self.outstanding -= 1;
                    self.refused.push(slot);
                }
                continue;
            }
            let outcome = if res < 0 {
                Some(Err(errno_to_error(-res)))
            } else if slot.op == MemberIoOp::Flush {
                Some(Ok(()))
            } else if res == 0 && slot.done_bytes < slot.len_bytes {
                // End of file on a read, no space on a write: no progress is an error.
                Some(Err(MemberIoError::Io))
            } else {
                slot.done_bytes += res as usize;
                (slot.done_bytes >= slot.len_bytes).then_some(Ok(()))
            };
            match outcome {
                Some(result) => {
                    if let Some(slot) = self.slots[idx].take() {
                        self.free.push(idx);
                        self.outstanding -= 1;
                        finished.push((slot, result));
                    }
                }
                // A short transfer: ask for the rest.
                None => self.push_sqe(idx),
            }
        }
        cqes.clear();
        self.cqes = cqes;
        self.submit_pending();
    }

    /// A polled ring: hands queued entries over and polls the devices once, then again
    /// until a completion is posted or `limit` has passed (a polled ring cannot sleep:
    /// nothing would post its completions). Returns at once with nothing in flight.
    fn spin(&mut self, limit: Duration) {
        let start = std::time::Instant::now();
        loop {
            // The crate enters with GETEVENTS on a polled ring: one pass over the poll queues.
            let _ = self.ring.submit();
            if !self.ring.completion().is_empty() || self.outstanding == 0 || start.elapsed() >= limit {
                return;
            }
        }
    }

    /// Asks the kernel to post a completion when `fd` is readable (or hung up), unless such
    /// a poll is already armed; forgets an earlier one that fired. A fire is a hint, not a
    /// promise: a poll still armed from before may fire for bytes read since, so a caller
    /// that must not sleep reads without waiting (the NBD server's `FlushingReader`).
    pub fn arm_poll(&mut self, fd: std::os::fd::RawFd) {
        self.poll_fired = false;
        if self.poll_armed || self.polled {
            return;
        }
        let entry = opcode::PollAdd::new(types::Fd(fd), (libc::POLLIN | libc::POLLRDHUP) as u32)
            .build()
            .user_data(POLL_TOKEN);
        self.push_entry(&entry);
        self.poll_armed = true;
    }

    /// Whether the armed poll fired.
    pub fn poll_fired(&self) -> bool {
        self.poll_fired
    }

    /// I/Os in the kernel that someone still waits for (not timed out and answered).
    pub fn live_outstanding(&self) -> usize {
        self.outstanding - self.slots.iter().flatten().filter(|s| s.abandoned).count()
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Whether completions are posted and not yet reaped (`false` may still have
    /// completion work waiting for this thread: a wait runs it).
    pub fn completions_ready(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }

    pub fn ring_fd(&self) -> std::os::fd::RawFd {
        self.ring.as_raw_fd()
    }

    /// Drops the ring and every buffer the kernel may still write (a timed-out I/O of a
    /// hung device): leaked, never freed.
    pub fn leak(mut self) {
        self.forget_kernel_state();
    }

    fn forget_kernel_state(&mut self) {
        let ring =
            std::mem::replace(&mut self.ring, IoUring::new(8).unwrap_or_else(|_| std::process::abort()));
        std::mem::forget(ring);
        std::mem::forget(std::mem::take(&mut self.slots));
        std::mem::forget(std::mem::replace(&mut self.eventfd_buf, Box::new(0)));
        self.reg.leak();
    }

    /// Wait until the kernel holds no pointer into our buffers.
    pub fn drain(&mut self) {
        if self.eventfd_armed {
            self.eventfd.signal();
        }
        let mut sink = Vec::new();
        let mut rounds = 0u64;
        while self.outstanding > 0 || self.eventfd_armed {
            let before = (self.outstanding, self.eventfd_armed);
            self.reap(&mut sink, Some(Duration::from_millis(100)));
            sink.clear();
            if (self.outstanding, self.eventfd_armed) == before {
                rounds += 1;
                if self.eventfd_armed {
                    self.eventfd.signal();
                }
                // Only I/O that timed out left (a hung device): it may never return, and
                // nobody waits for its answer any more; a second for late ones is enough.
                let only_abandoned = self.slots.iter().flatten().all(|s| s.abandoned);
                if rounds > 600 || (only_abandoned && rounds > 10) {
                    // A device that never answers: leak the ring rather than free buffers the
                    // kernel may still write.
                    self.forget_kernel_state();
                    return;
                }
            }
        }
    }
}

/// Blocks until the ring at `ring_fd` has a completion or `timeout` passes, like
/// `submit_and_wait(1)` with a timeout but submitting nothing: callable while another
/// thread owns the ring's queues (the kernel keeps the waiting side to itself).
pub fn wait_for_completion(ring_fd: std::os::fd::RawFd, timeout: Duration) {
    let ts = types::Timespec::from(timeout);
    let args = types::SubmitArgs::new().timespec(&ts);
    let flags = io_uring::EnterFlags::GETEVENTS | io_uring::EnterFlags::EXT_ARG;
    // SAFETY: io_uring_enter with to_submit 0 reads only `args` and `ts`, both live for the
    // call; EXT_ARG (checked at ring creation) makes `args` an io_uring_getevents_arg
    // (`SubmitArgs` is that struct, transparently). The raw call, not `Submitter`, because
    // another thread owns the ring's queues. ETIME, EINTR and the like are ordinary
    // wake-ups; the owner collects afterwards.
    unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            ring_fd,
            0u32,
            1u32,
            flags.bits(),
            &args as *const types::SubmitArgs,
            std::mem::size_of_val(&args),
        );
    }
}

/// One pass over the poll queues of the polled ring at `ring_fd` (`io_uring_enter` with
/// `GETEVENTS` and no minimum: the kernel polls once and posts what completed, without
/// spinning), from its issuing thread while it does not hold the executor; its owner
/// reaps the posted completions afterwards.
pub fn poll_pass(ring_fd: std::os::fd::RawFd) {
    // SAFETY: io_uring_enter with nothing to submit and no argument reads no memory of
    // ours. Errors (EINTR and the like) only mean no pass this time; the caller loops.
    unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            ring_fd,
            0u32,
            0u32,
            io_uring::EnterFlags::GETEVENTS.bits(),
            std::ptr::null::<libc::c_void>(),
            0usize,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;
    use crate::real::IoBuf;

    #[test]
    fn hands_io_over_at_once_only_while_the_kernel_holds_little() {
        let path = std::env::temp_dir().join(format!("uraid-uring-eager-{}.img", std::process::id()));
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // Queue depth 4: each I/O goes over at once while fewer than 3 are in the kernel.
        let mut u = UringBackend::new(8, 4, RegisteredIo::default(), None).unwrap();
        let mut held = Vec::new();
        for i in 0..5 {
            u.push(Slot {
                id: i,
                member: 0,
                op: MemberIoOp::Read,
                fd: file.as_raw_fd(),
                offset_bytes: i * 4096,
                len_bytes: 4096,
                buf: IoBuf::Plain(Vec::with_capacity(4096)),
                done_bytes: 0,
                force_async: false,
                sync_write: false,
                started_ns: 0,
                abandoned: false,
                set_gen: 0,
            });
            held.push(u.ring.submission().len());
        }
        assert_eq!(held, [0, 0, 0, 1, 2]);
        let mut done = Vec::new();
        while done.len() < 5 {
            u.reap(&mut done, Some(Duration::from_secs(5)));
        }
        assert!(done.iter().all(|(s, r)| r.is_ok() && s.done_bytes == 4096));
        u.drain();
        let _ = std::fs::remove_file(&path);
    }
}
