//! The real executor: members are regular files or block devices.
//!
//! I/O goes through io_uring where the kernel offers it (with `IORING_FEAT_EXT_ARG`, 5.11+)
//! and otherwise through a pool of threads doing pread/pwrite/fdatasync; the choice is made
//! once at start and logged once. Each member is opened with O_DIRECT where its file system
//! accepts it (tmpfs does not: that member is then buffered, logged once per member).
//! O_DIRECT I/O goes through aligned bounce buffers; an I/O whose offset or length is not
//! a multiple of [`DIRECT_ALIGN_BYTES`] goes through a second, buffered descriptor of the
//! same file (Linux keeps the two coherent: direct I/O writes back and invalidates the page
//! cache range it touches). Flush is fdatasync. Every error (EIO, ENOSPC, reads past the
//! end, short transfers that make no progress) becomes a [`MemberIoError`], never a panic.
//!
//! ```no_run
//! use uraid_io::real::{Executor, ExecutorOptions, MemberSet, OpenOptions};
//! let members = MemberSet::open(&["/dev/sdb", "/dev/sdc"], &OpenOptions::default()).unwrap();
//! let mut ex = Executor::new(members, &ExecutorOptions::default()).unwrap();
//! let mut done = Vec::new();
//! ex.submit(uraid_core::MemberIo {
//!     id: 1, member: 0, op: uraid_core::MemberIoOp::Read, offset_bytes: 4096, len_bytes: 4096, data: Default::default(),
//! });
//! while done.is_empty() {
//!     ex.wait(&mut done, Some(std::time::Duration::from_millis(10)));
//! }
//! ```

mod buf;
pub mod fault;
mod guest;
mod member;
mod polled;
mod pool;
mod registered;
mod remote;
mod timeout;
mod uring;

use std::collections::VecDeque;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::{Arc, Once};
use std::time::Duration;

use uraid_core::{MemberIo, MemberIoCompletion, MemberIoError, MemberIoOp};

pub use buf::AlignedBuf;
pub use guest::GuestRingState;
pub use member::{check_io_poll, Member, MemberKind, MemberSet, OpenOptions};
pub use registered::{RegisteredChoice, RegisteredIo, REGISTERED_BUFFERS, REGISTERED_BUFFER_BYTES};
pub use remote::{RemoteDevice, RemoteDone, RemoteResult};
pub use timeout::{DEFAULT_FAILFAST_TIMEOUT, DEFAULT_MEMBER_TIMEOUT};
pub use uring::{wait_for_completion, CompletionMode};

use member::IoPath;

/// Offsets and lengths of O_DIRECT I/O must be multiples of this: 4096 satisfies both
/// 512-byte and 4 KiB logical-sector devices and every file system's block size here.
pub const DIRECT_ALIGN_BYTES: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// io_uring if the kernel offers it, else the thread pool.
    Auto,
    IoUring,
    ThreadPool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    IoUring,
    ThreadPool,
}

/// See [`ExecutorOptions::queue_depth_per_member`].
pub const MAX_BLOCK_QUEUE_DEPTH: usize = 128;

/// See [`ExecutorOptions::inline_memory_io_max_bytes`].
pub const DEFAULT_INLINE_MEMORY_IO_MAX_BYTES: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub struct ExecutorOptions {
    pub backend: BackendChoice,
    /// Member I/Os in flight per member; more wait in the executor, in order. A block
    /// device takes its own request queue's depth instead (`nr_requests`, at most
    /// [`MAX_BLOCK_QUEUE_DEPTH`]): what its driver accepts at once.
    pub queue_depth_per_member: usize,
    /// Worker threads of the fallback pool.
    pub pool_threads: usize,
    pub log: bool,
    /// Reads and writes of memory-backed members (tmpfs) up to this many bytes, and their
    /// flushes, are done with plain syscalls inside `submit` instead of through the
    /// backend (0: never). Such I/O is a page-cache copy that never waits for a device, and
    /// io_uring cannot complete it without blocking, so it hands every one to an io-wq
    /// worker thread: for small I/O the two context switches cost more than the copy.
    /// Larger copies stay with the backend, whose workers copy in parallel with this
    /// thread. The result is ready at the next `poll`.
    pub inline_memory_io_max_bytes: usize,
    /// Injected faults (tests of real runs only).
    pub faults: Option<std::sync::Arc<fault::Faults>>,
    /// A member I/O not completed within this is failed (the SCSI layer's default
    /// command timeout; see `timeout.rs`). Per member: [`Executor::set_member_timeout`].
    pub member_timeout: Duration,
    /// io_uring registered files and buffers (`registered.rs`); by default where they pay.
    pub registered: RegisteredChoice,
    /// O_DIRECT reads and writes of members with poll queues ([`Member::is_pollable`]) go
    /// on a second, polled ring (`IORING_SETUP_IOPOLL`) that the owner reaps by spinning
    /// while it holds I/O (`serve --io-poll`; see [`check_io_poll`]). io_uring only.
    pub io_poll: bool,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        ExecutorOptions {
            backend: BackendChoice::Auto,
            queue_depth_per_member: 32,
            pool_threads: 8,
            log: true,
            inline_memory_io_max_bytes: DEFAULT_INLINE_MEMORY_IO_MAX_BYTES,
            faults: None,
            member_timeout: DEFAULT_MEMBER_TIMEOUT,
            registered: RegisteredChoice::default(),
            io_poll: false,
        }
    }
}

/// Wakes a thread blocked in [`Executor::wait`] from any thread (e.g. a client that just
/// queued a request for the runtime).
#[derive(Clone)]
pub struct Waker {
    inner: WakerInner,
}

#[derive(Clone)]
enum WakerInner {
    EventFd(Arc<uring::EventFd>),
    Pool(Arc<pool::Shared>),
}

/// Blocks the executor's owner until completions may be ready, without holding the
/// executor: other threads may run guest rounds meanwhile. Arm it with
/// [`Executor::prepare_sleep`]; afterwards collect with [`Executor::poll`].
pub struct Sleeper {
    inner: SleeperInner,
}

enum SleeperInner {
    Uring(std::os::fd::RawFd),
    Pool(Arc<pool::Shared>),
    /// Polled I/O is out: no sleep, one pass over the polled ring's poll queues.
    Spin(std::os::fd::RawFd),
}

impl Sleeper {
    /// Returns when a completion or a wake-up is ready, or `timeout` passed.
    pub fn sleep(&self, timeout: Duration) {
        match &self.inner {
            SleeperInner::Uring(fd) => uring::wait_for_completion(*fd, timeout),
            SleeperInner::Pool(s) => s.wait_for_completion(timeout),
            SleeperInner::Spin(fd) => uring::poll_pass(*fd),
        }
    }
}

impl Waker {
    pub fn wake(&self) {
        match &self.inner {
            WakerInner::EventFd(e) => e.signal(),
            WakerInner::Pool(s) => s.wake(),
        }
    }
}

/// One I/O's buffer, kept alive (and unmoved) while the kernel or a worker uses it.
enum IoBuf {
    None,
    /// Reads: capacity `len`, length set once filled.
    Plain(Vec<u8>),
    /// Writes straight from the engine's buffer (the kernel only reads it).
    Shared(uraid_core::IoBytes),
    Aligned(AlignedBuf),
    /// A chunk of the registered bounce buffers (`registered.rs`): its address and index.
    Registered {
        addr: usize,
        chunk: u32,
    },
}

impl IoBuf {
    fn ptr(&mut self) -> *mut u8 {
        match self {
            IoBuf::None => std::ptr::null_mut(),
            IoBuf::Plain(v) => v.as_mut_ptr(),
            IoBuf::Shared(b) => b.as_ptr() as *mut u8,
            IoBuf::Aligned(a) => a.as_mut_ptr(),
            IoBuf::Registered { addr, .. } => *addr as *mut u8,
        }
    }
}

/// An I/O handed to a backend.
struct Slot {
    id: u64,
    member: usize,
    op: MemberIoOp,
    fd: RawFd,
    offset_bytes: u64,
    len_bytes: usize,
    buf: IoBuf,
    done_bytes: usize,
    /// Queue to a worker at once (see `Member::memory_backed`: I/O too large to run inline).
    force_async: bool,
    /// A buffered write that must reach the device before it completes (`IoPath::BufferedSync`).
    sync_write: bool,
    /// When the backend got it, on the executor's clock (see `timeout.rs`).
    started_ns: u64,
    /// Timed out and already answered: the kernel's late completion only frees the slot.
    abandoned: bool,
    /// The generation of the member set whose descriptor `fd` is.
    set_gen: u64,
}

/// Stores `slot` in a backend's table, in a free place if there is one: its index.
fn put_slot(slots: &mut Vec<Option<Slot>>, free: &mut Vec<usize>, slot: Slot) -> usize {
    match free.pop() {
        Some(i) => {
            slots[i] = Some(slot);
            i
        }
        None => {
            slots.push(Some(slot));
            slots.len() - 1
        }
    }
}

/// Map a failed syscall to what the engine needs to know.
fn errno_to_error(errno: i32) -> MemberIoError {
    match errno {
        libc::ENODEV | libc::ENXIO | libc::EBADF | libc::ESHUTDOWN => MemberIoError::Gone,
        _ => MemberIoError::Io,
    }
}

fn finish_slot(
    mut slot: Slot,
    result: Result<(), MemberIoError>,
    aligned_pool: &mut Vec<AlignedBuf>,
    arena: &mut Option<registered::BufferArena>,
) -> MemberIoCompletion {
    if let IoBuf::Registered { chunk, .. } = slot.buf {
        slot.buf = IoBuf::None;
        // Only an executor with an arena makes these.
        let Some(arena) = arena else {
            return MemberIoCompletion { id: slot.id, result: Err(MemberIoError::Io) };
        };
        let result = match (result, slot.op) {
            (Ok(()), MemberIoOp::Read) => Ok(arena.region.chunk(chunk, slot.len_bytes).to_vec()),
            (Ok(()), _) => Ok(Vec::new()),
            (Err(e), _) => Err(e),
        };
        arena.give_back(chunk);
        return MemberIoCompletion { id: slot.id, result };
    }
    let result = match result {
        Err(e) => Err(e),
        Ok(()) => match (slot.op, std::mem::replace(&mut slot.buf, IoBuf::None)) {
            (MemberIoOp::Read, IoBuf::Plain(mut v)) => {
                // SAFETY: the kernel (or pread) filled all `len_bytes` bytes: done_bytes == len.
                unsafe { v.set_len(slot.len_bytes) };
                Ok(v)
            }
            (MemberIoOp::Read, IoBuf::Aligned(a)) => {
                let v = a.as_slice()[..slot.len_bytes].to_vec();
                recycle(aligned_pool, a);
                Ok(v)
            }
            (_, IoBuf::Aligned(a)) => {
                recycle(aligned_pool, a);
                Ok(Vec::new())
            }
            _ => Ok(Vec::new()),
        },
    };
    if let IoBuf::Aligned(a) = std::mem::replace(&mut slot.buf, IoBuf::None) {
        recycle(aligned_pool, a);
    }
    MemberIoCompletion { id: slot.id, result }
}

const ALIGNED_POOL_MAX: usize = 128;

fn recycle(pool: &mut Vec<AlignedBuf>, a: AlignedBuf) {
    if pool.len() < ALIGNED_POOL_MAX {
        pool.push(a);
    }
}

/// An O_DIRECT bounce buffer of `len` bytes: a registered one where it fits and one is
/// free, else from the pool.
fn bounce(arena: &mut Option<registered::BufferArena>, pool: &mut Vec<AlignedBuf>, len: usize) -> IoBuf {
    if let Some(arena) = arena {
        if let Some(chunk) = arena.take(len) {
            return IoBuf::Registered { addr: arena.region.chunk_addr(chunk), chunk };
        }
    }
    IoBuf::Aligned(take_aligned(pool, len))
}

fn take_aligned(pool: &mut Vec<AlignedBuf>, len: usize) -> AlignedBuf {
    match pool.iter().rposition(|b| b.capacity() >= len && b.capacity() <= len.saturating_mul(4)) {
        Some(i) => pool.swap_remove(i),
        None => AlignedBuf::new(len, DIRECT_ALIGN_BYTES as usize),
    }
}

enum Backend {
    Uring(Box<uring::UringBackend>),
    Pool(pool::PoolBackend),
}

struct MemberQueue {
    in_flight: usize,
    /// I/Os this member takes at once.
    depth: usize,
    waiting: VecDeque<MemberIo>,
    /// See [`ExecutorOptions::member_timeout`].
    timeout_ns: u64,
    /// An I/O of this member timed out: everything else it holds is failed with it, and
    /// new I/O fails at once, until another device takes its place.
    hung: bool,
    /// Timed-out I/Os the kernel has not returned yet.
    abandoned: usize,
    /// The device refused a polled I/O: its I/O takes the normal ring from now on.
    poll_refused: bool,
    counts: ExecutorMemberStats,
}

impl MemberQueue {
    fn new(member: &Member, default_depth: usize, timeout: Duration) -> MemberQueue {
        MemberQueue {
            in_flight: 0,
            depth: depth_for(member, default_depth),
            waiting: VecDeque::new(),
            timeout_ns: timeout.as_nanos().min(u64::MAX as u128) as u64,
            hung: false,
            abandoned: 0,
            poll_refused: false,
            counts: ExecutorMemberStats::default(),
        }
    }
}

/// I/Os a member takes at once: a block device its request queue's, else the default.
fn depth_for(member: &Member, default_depth: usize) -> usize {
    match member.device_queue() {
        Some((nr_requests, _)) => nr_requests.clamp(1, MAX_BLOCK_QUEUE_DEPTH),
        None => default_depth,
    }
}

/// What the executor did with one member's I/O, beyond the engine's own counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecutorMemberStats {
    /// What the member is (filled in by [`Executor::member_stats`]).
    pub kind: Option<MemberKind>,
    /// Opened O_DIRECT.
    pub direct: bool,
    /// I/Os through the buffered descriptor (not aligned for O_DIRECT, or O_DIRECT refused).
    pub buffered_ios: u64,
    /// I/Os done inline on the calling thread (memory-backed members only).
    pub inline_ios: u64,
    /// I/Os failed because the member did not answer in time (`member_timeout`).
    pub timed_out_ios: u64,
}

/// Performs member I/O for one array.
pub struct Executor {
    members: Arc<MemberSet>,
    queues: Vec<MemberQueue>,
    queue_depth: usize,
    backend: Backend,
    /// The owner's polled ring (`ExecutorOptions::io_poll`), beside its own in `backend`.
    polled: Option<Box<uring::UringBackend>>,
    /// I/Os the polled ring's devices refused, done again on the normal ring.
    polled_refused: u64,
    /// Completions decided without the kernel (bad member index, malformed I/O).
    ready: Vec<MemberIoCompletion>,
    aligned_pool: Vec<AlignedBuf>,
    /// Registered bounce buffers for small O_DIRECT I/O (`registered.rs`; io_uring only).
    arena: Option<registered::BufferArena>,
    /// What the rings register.
    registered: RegisteredIo,
    in_flight: usize,
    inline_max_bytes: usize,
    /// Scratch list of finished slots for `collect`.
    finished: Vec<(Slot, Result<(), MemberIoError>)>,
    /// Member sets replaced by `replace_member`/`attach_member`, each with its generation,
    /// kept while an I/O started under it may still use its descriptors; dropped after (a
    /// removed member's file is closed then, as md lets go of an rdev once it drained).
    retired: Vec<(u64, Arc<MemberSet>)>,
    /// The generation of `members` (one more at each replacement).
    set_gen: u64,
    /// Another thread is using the executor for a moment (see [`Executor::set_guest`]).
    guest: bool,
    /// I/Os a guest could not run inline nor on a ring of its own, waiting for the owner's
    /// next [`Executor::start_deferred`].
    deferred: Vec<MemberIo>,
    /// Guest threads' own rings (see `guest.rs`), and the one of the guest running now.
    guests: Vec<Option<Box<uring::UringBackend>>>,
    /// When each guest ring's thread last reaped it (the executor's clock; 0: never): its
    /// I/O is late only if its thread looked after the deadline (`timeout.rs`).
    guest_reaped_ns: Vec<u64>,
    /// Per guest ring, the reap time of the stall last logged (`timeout.rs`): one line a stall.
    guest_stall_logged: Vec<Option<u64>>,
    active_guest: Option<usize>,
    /// New I/O of the running guest goes to its ring (see [`Executor::set_guest_ring`]).
    guest_issues: bool,
    /// A guest that may not issue left a member's waiting I/O with room to start: the
    /// owner's next `start_deferred` starts it.
    waiting_unstarted: bool,
    /// See [`Executor::id`].
    id: u64,
    faults: Option<std::sync::Arc<fault::Faults>>,
    /// I/O an injected `hold` rule keeps: never performed, never completed (but timed
    /// out like any other), with when it was held.
    held: Vec<(MemberIo, u64)>,
    /// The executor's clock for member-I/O deadlines.
    clock: std::time::Instant,
    /// The timeout of members attached later.
    member_timeout: Duration,
    /// When `collect` next looks for I/O past its deadline (see `timeout.rs`).
    next_timeout_scan_ns: u64,
    /// I/O of members behind a connection (`remote.rs`).
    remote: remote::RemoteBackend,
    log: bool,
}

static URING_FALLBACK_LOGGED: Once = Once::new();

impl Executor {
    pub fn new(members: MemberSet, opts: &ExecutorOptions) -> io::Result<Executor> {
        let members = Arc::new(members);
        let queue_depth = opts.queue_depth_per_member.max(1);
        let queues: Vec<MemberQueue> =
            members.iter().map(|m| MemberQueue::new(m, queue_depth, opts.member_timeout)).collect();
        let array_queue_depth = queues.iter().map(|q| q.depth).sum::<usize>().max(queue_depth);
        let entries = (array_queue_depth + 1).next_power_of_two().clamp(8, 4096) as u32;
        let registered = opts.registered.resolve(&members);
        let mut arena = registered.buffers.then(registered::BufferArena::new);
        let region = arena.as_ref().map(|a| a.region.clone());
        let backend = match opts.backend {
            BackendChoice::ThreadPool => {
                Backend::Pool(pool::PoolBackend::new(members.clone(), opts.pool_threads))
            }
            BackendChoice::IoUring => Backend::Uring(Box::new(uring::UringBackend::new(
                entries,
                array_queue_depth,
                registered,
                region,
            )?)),
            BackendChoice::Auto => {
                match uring::UringBackend::new(entries, array_queue_depth, registered, region) {
                    Ok(u) => Backend::Uring(Box::new(u)),
                    Err(e) => {
                        if opts.log {
                            URING_FALLBACK_LOGGED.call_once(|| {
                                eprintln!(
                                    "uraid-io: io_uring unavailable ({e}); using a pread/pwrite thread pool"
                                )
                            });
                        }
                        Backend::Pool(pool::PoolBackend::new(members.clone(), opts.pool_threads))
                    }
                }
            }
        };

        if !matches!(backend, Backend::Uring(_)) {
            // A pool worker stuck on a hung device could outlive the arena: plain buffers.
            arena = None;
        }
        let polled = if opts.io_poll {
            if !matches!(backend, Backend::Uring(_)) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "polled completions need io_uring, and the executor runs on the thread pool",
                ));
            }
            let region = arena.as_ref().map(|a| a.region.clone());
            let ring = uring::UringBackend::new_polled(entries, array_queue_depth, registered, region)
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("the kernel refused a polled io_uring ring (IORING_SETUP_IOPOLL): {e}"),
                    )
                })?;
            Some(Box::new(ring))
        } else {
            None
        };
        Ok(Executor {
            members,
            queues,
            queue_depth,
            backend,
            polled,
            polled_refused: 0,
            ready: Vec::new(),
            aligned_pool: Vec::new(),
            arena,
            registered,
            in_flight: 0,
            inline_max_bytes: opts.inline_memory_io_max_bytes,
            finished: Vec::new(),
            retired: Vec::new(),
            set_gen: 0,
            guest: false,
            deferred: Vec::new(),
            guests: Vec::new(),
            guest_reaped_ns: Vec::new(),
            guest_stall_logged: Vec::new(),
            active_guest: None,
            guest_issues: false,
            waiting_unstarted: false,
            id: guest::next_executor_id(),
            faults: opts.faults.clone(),
            held: Vec::new(),
            clock: std::time::Instant::now(),
            member_timeout: opts.member_timeout,
            next_timeout_scan_ns: 0,
            remote: remote::RemoteBackend::default(),
            log: opts.log,
        })
    }

    /// How the io_uring ring takes completions (`None`: the thread pool).
    pub fn completion_mode(&self) -> Option<CompletionMode> {
        match &self.backend {
            Backend::Uring(u) => Some(u.completion_mode()),
            Backend::Pool(_) => None,
        }
    }

    /// What the rings register (see `registered.rs`).
    pub fn registered(&self) -> RegisteredIo {
        RegisteredIo { files: self.registered.files, buffers: self.arena.is_some() }
    }

    /// I/Os handed to the kernel with a registered file or buffer, on every ring so far.
    pub fn registered_ios(&self) -> u64 {
        let own = match &self.backend {
            Backend::Uring(u) => u.registered_ios(),
            Backend::Pool(_) => 0,
        };
        let polled = self.polled.as_ref().map_or(0, |p| p.registered_ios());
        own + polled + self.guests.iter().flatten().map(|g| g.registered_ios()).sum::<u64>()
    }

    pub fn backend(&self) -> BackendKind {
        match self.backend {
            Backend::Uring(_) => BackendKind::IoUring,
            Backend::Pool(_) => BackendKind::ThreadPool,
        }
    }

    pub fn members(&self) -> &MemberSet {
        &self.members
    }

    /// Put `member` in place of member `index` (mdadm --add of a replacement into a slot).
    /// I/O queued or in flight on the old member still completes on the old descriptors.
    pub fn replace_member(&mut self, index: usize, member: Member) -> io::Result<()> {
        if index >= self.members.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("member {index} does not exist ({} members)", self.members.len()),
            ));
        }
        self.check_no_late_io(index, &member)?;
        let mut members = self.members.iter().map(Member::try_clone).collect::<io::Result<Vec<_>>>()?;
        members[index] = member;
        let old = std::mem::replace(&mut self.members, Arc::new(MemberSet { members }));
        self.retired.push((self.set_gen, old));
        self.set_gen += 1;
        let q = &mut self.queues[index];
        q.hung = false;
        q.poll_refused = false;
        q.depth = depth_for(self.members.member(index), self.queue_depth);
        Ok(())
    }

    /// Adds `member` after the others and returns its index: a member with no slot in
    /// the array (a hot spare) whose superblock is still written through the executor.
    /// The engine never addresses it; it stays until the executor is dropped.
    pub fn attach_member(&mut self, member: Member) -> io::Result<usize> {
        let mut members = self.members.iter().map(Member::try_clone).collect::<io::Result<Vec<_>>>()?;
        members.push(member);
        let old = std::mem::replace(&mut self.members, Arc::new(MemberSet { members }));
        self.retired.push((self.set_gen, old));
        self.set_gen += 1;
        self.queues.push(MemberQueue::new(
            self.members.member(self.members.len() - 1),
            self.queue_depth,
            self.member_timeout,
        ));
        Ok(self.members.len() - 1)
    }

    /// Member I/Os submitted and not yet returned by `poll`/`wait`.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn waker(&self) -> Waker {
        match &self.backend {
            Backend::Uring(u) => Waker { inner: WakerInner::EventFd(u.eventfd()) },
            Backend::Pool(p) => Waker { inner: WakerInner::Pool(p.shared()) },
        }
    }

    /// Queue a member I/O. Never blocks and never fails: problems come back as completions.
    pub fn submit(&mut self, io: MemberIo) {
        self.in_flight += 1;
        self.route(io);
    }

    /// While `guest` is set, the executor is used by a thread other than its owner (a
    /// client running an engine round itself, see the runtime): I/O that completes inline
    /// (small I/O of memory-backed members) still runs now; everything else goes to the
    /// guest's own ring if it has one ([`Executor::set_guest_ring`], `guest.rs`), else waits
    /// in a list for the owner's [`Executor::start_deferred`]; and `poll` returns inline
    /// completions and the guest ring's only. So only the owner ever touches the owner's
    /// io_uring ring: a ring has one submitter (completion task work runs on it), and one
    /// reaper (the owner sleeps in the ring without holding the executor, and must not lose
    /// the wake-up a guest would reap).
    pub fn set_guest(&mut self, guest: bool) {
        self.guest = guest;
    }

    /// I/Os a guest left for the owner.
    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty() || self.waiting_unstarted
    }

    /// Starts the I/Os guests left for the owner, in their order (the owner's call only).
    pub fn start_deferred(&mut self) {
        if self.guest {
            return;
        }
        if std::mem::take(&mut self.waiting_unstarted) {
            for member in 0..self.queues.len() {
                self.start_waiting(member);
            }
        }
        for io in std::mem::take(&mut self.deferred) {
            self.route(io);
        }
    }

    /// Starts member `member`'s waiting I/Os while it has room, unless the running guest
    /// may not issue (they then wait for the owner).
    fn start_waiting(&mut self, member: usize) {
        let may_start = !self.guest || self.guest_issues;
        loop {
            let q = &mut self.queues[member];
            if q.in_flight >= q.depth || q.waiting.is_empty() {
                return;
            }
            if !may_start {
                self.waiting_unstarted = true;
                return;
            }
            let Some(next) = q.waiting.pop_front() else { return };
            q.in_flight += 1;
            self.start(next);
        }
    }

    fn route(&mut self, io: MemberIo) {
        let malformed = match io.op {
            MemberIoOp::Write => io.data.len() as u64 != io.len_bytes,
            _ => false,
        } || io.len_bytes > u32::MAX as u64;
        if io.member >= self.members.len() || self.queues[io.member].hung {
            self.ready.push(MemberIoCompletion { id: io.id, result: Err(MemberIoError::Gone) });
            return;
        }
        if malformed {
            self.ready.push(MemberIoCompletion { id: io.id, result: Err(MemberIoError::Io) });
            return;
        }
        match self.injected_fault(&io) {
            fault::FaultAction::Fail => {
                self.ready.push(MemberIoCompletion { id: io.id, result: Err(MemberIoError::Io) });
                return;
            }
            fault::FaultAction::Hold => {
                let now = self.now_ns();
                self.held.push((io, now));
                return;
            }
            fault::FaultAction::Pass => {}
        }
        let q = &mut self.queues[io.member];
        // Inline only behind an empty wait queue, so I/Os still start in submission order.
        let small = io.op == MemberIoOp::Flush || io.len_bytes <= self.inline_max_bytes as u64;
        if self.inline_max_bytes > 0
            && small
            && q.waiting.is_empty()
            && self.deferred.is_empty()
            && self.members.member(io.member).memory_backed
        {
            q.counts.inline_ios += 1;
            let done = run_inline(self.members.member(io.member), io);
            self.ready.push(done);
            return;
        }
        // A remote member's answers come back to the owner only, so the owner starts its I/O.
        if self.guest && (!self.guest_issues || self.members.member(io.member).remote.is_some()) {
            self.deferred.push(io);
            return;
        }
        if q.in_flight >= q.depth {
            q.waiting.push_back(io);
            return;
        }
        q.in_flight += 1;
        self.start(io);
    }

    fn injected_fault(&self, io: &MemberIo) -> fault::FaultAction {
        use fault::FaultAction::*;
        let Some(f) = &self.faults else { return Pass };
        let op = match io.op {
            MemberIoOp::Read => fault::FaultOp::Read,
            MemberIoOp::Write => fault::FaultOp::Write,
            MemberIoOp::Flush => fault::FaultOp::Flush,
        };
        // The array's own metadata I/O also counts for `op=meta` rules.
        let meta = if uraid_core::is_array_meta_io(io.id) {
            f.hit(io.member, fault::FaultOp::Meta, io.offset_bytes)
        } else {
            Pass
        };
        match (f.hit(io.member, op, io.offset_bytes), meta) {
            (Hold, _) | (_, Hold) => Hold,
            (Fail, _) | (_, Fail) => Fail,
            _ => Pass,
        }
    }

    fn start(&mut self, io: MemberIo) {
        let member = self.members.member(io.member);
        if let Some(device) = member.remote.clone() {
            let slot = Slot {
                id: io.id,
                member: io.member,
                op: io.op,
                fd: -1,
                offset_bytes: io.offset_bytes,
                len_bytes: io.len_bytes as usize,
                buf: IoBuf::None,
                done_bytes: 0,
                force_async: false,
                sync_write: false,
                started_ns: self.now_ns(),
                set_gen: self.set_gen,
                abandoned: false,
            };
            let waker = self.waker();
            self.remote.push(&*device, slot, io.data, waker);
            return;
        }
        let (fd, path) = member.path_for(io.op, io.offset_bytes, io.len_bytes);
        let direct = path == IoPath::Direct;
        if !direct && io.op != MemberIoOp::Flush {
            self.queues[io.member].counts.buffered_ios += 1;
        }
        let len = io.len_bytes as usize;
        let read_target = |data| read_target(data, len);
        let buf = match (io.op, direct) {
            (MemberIoOp::Flush, _) => IoBuf::None,
            (MemberIoOp::Read, false) => IoBuf::Plain(read_target(io.data)),
            (MemberIoOp::Read, true) => {
                // Straight into the result when its memory suits O_DIRECT here (tmpfs, for
                // one, takes any 16-byte-aligned buffer); a bounce buffer otherwise. Without
                // a spare buffer from the engine, a fresh vector is only worth allocating
                // where the allocator's usual 16-byte alignment may suffice.
                let v = (!io.data.is_empty() || member.dio_mem_align <= 16).then(|| read_target(io.data));
                match v {
                    Some(v) if (v.as_ptr() as usize as u64).is_multiple_of(member.dio_mem_align) => {
                        IoBuf::Plain(v)
                    }
                    _ => bounce(&mut self.arena, &mut self.aligned_pool, len),
                }
            }
            (MemberIoOp::Write, false) => IoBuf::Shared(io.data),
            // Likewise a write whose bytes already suit O_DIRECT goes out without a copy.
            (MemberIoOp::Write, true)
                if io.data.len() == len
                    && (io.data.as_ptr() as usize as u64).is_multiple_of(member.dio_mem_align) =>
            {
                IoBuf::Shared(io.data)
            }
            (MemberIoOp::Write, true) => {
                let mut b = bounce(&mut self.arena, &mut self.aligned_pool, len);
                match &mut b {
                    IoBuf::Aligned(a) => a.as_mut_slice()[..len].copy_from_slice(&io.data),
                    IoBuf::Registered { addr, .. } => {
                        // SAFETY: the chunk is this I/O's alone and holds `len` bytes (`bounce`).
                        unsafe { std::ptr::copy_nonoverlapping(io.data.as_ptr(), *addr as *mut u8, len) }
                    }
                    _ => {}
                }
                b
            }
        };
        let slot = Slot {
            id: io.id,
            member: io.member,
            op: io.op,
            fd,
            offset_bytes: io.offset_bytes,
            len_bytes: len,
            buf,
            done_bytes: 0,
            force_async: member.memory_backed,
            sync_write: path == IoPath::BufferedSync,
            started_ns: self.clock.elapsed().as_nanos() as u64,
            set_gen: self.set_gen,
            abandoned: false,
        };
        let guest_ring = match self.active_guest {
            Some(g) if self.guest && self.guest_issues => self.guests[g].as_mut(),
            _ => None,
        };
        let registers = self.registered != RegisteredIo::default();
        // Only the owner polls (a guest's ring is its own, and interrupt-driven); a
        // polled ring takes O_DIRECT reads and writes only.
        let polled = match &mut self.polled {
            Some(p)
                if guest_ring.is_none()
                    && direct
                    && io.op != MemberIoOp::Flush
                    && member.pollable
                    && !self.queues[io.member].poll_refused =>
            {
                Some(p)
            }
            _ => None,
        };
        match (guest_ring.or(polled), &mut self.backend) {
            (Some(ring), _) => {
                if registers {
                    ring.prepare_registered(self.set_gen, &self.members);
                }
                ring.push(slot)
            }
            (None, Backend::Uring(u)) => {
                if registers {
                    u.prepare_registered(self.set_gen, &self.members);
                }
                u.push(slot)
            }
            (None, Backend::Pool(p)) => p.push(slot),
        }
    }

    /// Gets ready for the owner to sleep in a [`Sleeper`] without holding the executor:
    /// arms the wake-up and hands queued I/O to the kernel. `None` when there is no need to
    /// sleep: completions are ready already (collect them with `poll`).
    pub fn prepare_sleep(&mut self) -> Option<Sleeper> {
        if !self.ready.is_empty() || !self.deferred.is_empty() || self.remote.has_done() {
            return None;
        }
        if self.spins() {
            // Nothing would post the polled ring's completions while the owner slept.
            let Backend::Uring(u) = &mut self.backend else { return None };
            let p = self.polled.as_mut()?;
            u.submit_pending();
            p.submit_pending();
            if u.completions_ready() || p.completions_ready() {
                return None;
            }
            return Some(Sleeper { inner: SleeperInner::Spin(p.ring_fd()) });
        }
        let inner = match &mut self.backend {
            Backend::Uring(u) => SleeperInner::Uring(u.prepare_sleep()?),
            Backend::Pool(p) => SleeperInner::Pool(p.shared()),
        };
        Some(Sleeper { inner })
    }

    /// Completed member I/Os, without blocking. Returns how many were appended.
    pub fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) -> usize {
        self.collect(out, Some(Duration::ZERO))
    }

    /// Completed member I/Os; blocks until at least one is ready, the waker fires or the
    /// timeout passes (`None`: no timeout). Returns how many were appended.
    pub fn wait(&mut self, out: &mut Vec<MemberIoCompletion>, timeout: Option<Duration>) -> usize {
        self.collect(out, timeout)
    }

    fn collect(&mut self, out: &mut Vec<MemberIoCompletion>, timeout: Option<Duration>) -> usize {
        let before = out.len();
        // Reused between calls: one allocation less per poll on the hot path.
        let mut finished = std::mem::take(&mut self.finished);
        if self.guest {
            // A guest reaps its own ring only; the owner's is the owner's.
            if let Some(g) = self.active_guest {
                if let Some(ring) = self.guests[g].as_mut() {
                    ring.reap(&mut finished, Some(Duration::ZERO));
                    let now = self.clock.elapsed().as_nanos() as u64;
                    if self.guest_reaped_ns.len() <= g {
                        self.guest_reaped_ns.resize(g + 1, 0);
                    }
                    self.guest_reaped_ns[g] = now;
                }
            }
        } else {
            let ready = !self.ready.is_empty() || self.remote.has_done();
            let timeout = if ready { Some(Duration::ZERO) } else { timeout };
            let spins = self.spins();
            // However long the caller would wait, the deadlines below need a look now and then.
            let spin_limit = [timeout, self.timeout_check_in()].into_iter().flatten().min();
            match (&mut self.backend, &mut self.polled) {
                (Backend::Uring(u), Some(p)) if spins => {
                    // Poll the polled ring and look at the other without blocking, in turn,
                    // until something completed or the time is up.
                    let start = std::time::Instant::now();
                    loop {
                        p.reap(&mut finished, Some(Duration::ZERO));
                        u.reap(&mut finished, Some(Duration::ZERO));
                        let done = !finished.is_empty() || p.outstanding() == 0;
                        if done || start.elapsed() >= spin_limit.unwrap_or(Duration::MAX) {
                            break;
                        }
                    }
                }
                (Backend::Uring(u), polled) => {
                    // Only timed-out polled I/O, if any: one pass returns what came back late.
                    if let Some(p) = polled {
                        p.reap(&mut finished, Some(Duration::ZERO));
                    }
                    let timeout = if finished.is_empty() { timeout } else { Some(Duration::ZERO) };
                    u.reap(&mut finished, timeout)
                }
                (Backend::Pool(p), _) => p.reap(&mut finished, timeout),
            }
            self.redo_refused_polled();
            self.remote.reap(&mut finished);
            self.expire_overdue();
        }
        out.append(&mut self.ready);
        for (slot, result) in finished.drain(..) {
            let member = slot.member;
            if slot.abandoned {
                // Answered when it timed out; the kernel is done with its buffer only now.
                self.queues[member].abandoned -= 1;
                drop(finish_slot(slot, result, &mut self.aligned_pool, &mut self.arena));
            } else {
                out.push(finish_slot(slot, result, &mut self.aligned_pool, &mut self.arena));
            }
            self.queues[member].in_flight -= 1;
            self.start_waiting(member);
        }
        self.finished = finished;
        if !self.guest {
            self.release_retired();
        }
        // Flush newly started I/Os to the kernel now rather than at the next wait.
        if self.guest {
            if let Some(ring) = self.active_guest.and_then(|g| self.guests[g].as_mut()) {
                ring.submit_pending();
            }
        } else if let Backend::Uring(u) = &mut self.backend {
            u.submit_pending();
            if let Some(p) = &mut self.polled {
                p.submit_pending();
            }
        }
        let n = out.len() - before;
        self.in_flight -= n;
        n
    }
}

/// A read's result vector: the spare buffer the engine handed over, if it did and it is
/// big enough (no allocation, no fresh pages to fault in; its old contents are overwritten
/// before anyone sees them), else a fresh one. Capacity at least `len`, length unset.
fn read_target(data: uraid_core::IoBytes, len: usize) -> Vec<u8> {
    match data.try_into_unique_vec() {
        Ok(mut v) if v.capacity() >= len => {
            v.clear();
            v
        }
        _ => Vec::with_capacity(len),
    }
}

/// One I/O of a memory-backed member, done now on this thread through the buffered
/// descriptor (on tmpfs the direct one reaches the same pages, so the two agree), straight
/// into the result vector or from the engine's buffer: no bounce buffer, no copy.
fn run_inline(member: &Member, io: MemberIo) -> MemberIoCompletion {
    let fd = member.buffered.as_raw_fd();
    let len = io.len_bytes as usize;
    let result = match io.op {
        MemberIoOp::Read => {
            let mut v = read_target(io.data, len);
            // SAFETY: v has capacity len; sync_io fills all of it or fails.
            unsafe { pool::sync_io(fd, io.op, io.offset_bytes, v.as_mut_ptr(), len, false) }.map(|()| {
                // SAFETY: all len bytes were written by pread.
                unsafe { v.set_len(len) };
                v
            })
        }
        // SAFETY: pwrite only reads the buffer, which `io.data` keeps alive (len checked
        // against data.len() by `route`). Flush touches no buffer.
        MemberIoOp::Write | MemberIoOp::Flush => {
            unsafe { pool::sync_io(fd, io.op, io.offset_bytes, io.data.as_ptr() as *mut u8, len, false) }
                .map(|()| Vec::new())
        }
    };
    MemberIoCompletion { id: io.id, result }
}

impl Drop for Executor {
    fn drop(&mut self) {
        // The kernel or a worker may still write into buffers we own: wait them out.
        self.drop_guest_rings();
        if let Some(p) = &mut self.polled {
            p.drain();
            if self.log {
                eprintln!("uraid-io: io_uring: {} member I/Os were polled", self.polled_ios());
            }
        }
        match &mut self.backend {
            Backend::Uring(u) => u.drain(),
            Backend::Pool(p) => p.shutdown(),
        }
    }
}

/// Raise glibc's mmap and trim thresholds so freed 1 MiB buffers are reused from the heap
/// instead of being unmapped and faulted in again on every request. Process-wide; a no-op
/// elsewhere than glibc.
pub fn keep_large_buffers_on_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator parameters; it is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

impl uraid_core::drive::MemberExecutor for Executor {
    fn issue(&mut self, io: MemberIo) {
        self.submit(io);
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        Executor::poll(self, out);
    }
}
