//! io_uring registered files (`IORING_REGISTER_FILES`, fixed-file SQEs) and registered
//! buffers (`IORING_REGISTER_BUFFERS`, `READ_FIXED`/`WRITE_FIXED`) for the executor's
//! rings. A fixed file spares the kernel `fget`/`fput` per I/O, a registered buffer its
//! page pinning (`pin_user_pages`) per O_DIRECT I/O: whether that pays is measured, not
//! assumed (docs/performance.md, "registered files and buffers"), so both are options.
//!
//! Registration is done lazily by the thread that issues on a ring (a single-issuer ring
//! takes `io_uring_register` from that thread only), before its first I/O and again after
//! the member set changes. A failed registration only turns the feature off for that ring:
//! plain descriptors and buffers then go, as without it.

use std::alloc::{alloc, dealloc, Layout};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Once};

use io_uring::IoUring;

use super::{MemberKind, MemberSet};

/// What of io_uring's registration the executor uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisteredIo {
    /// Members' descriptors in each ring's fixed-file table.
    pub files: bool,
    /// Small O_DIRECT bounce buffers from one region each ring registers.
    pub buffers: bool,
}

/// [`RegisteredIo`] as asked for; `None`: the default (see [`RegisteredChoice::resolve`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisteredChoice {
    pub files: Option<bool>,
    pub buffers: Option<bool>,
}

impl RegisteredChoice {
    /// Buffers by default where some member's I/O goes O_DIRECT through a ring to a disk
    /// or a file on one (a tmpfs member's small I/O runs inline and a remote member's goes
    /// over a socket: nothing to gain there, and memory pinned for nothing). Files only when
    /// asked for: they save less, and a ring's table holds a removed member's file open
    /// (and a block device's exclusive claim) until that ring's thread next issues I/O.
    pub fn resolve(self, members: &MemberSet) -> RegisteredIo {
        let pays = members
            .iter()
            .any(|m| m.is_direct() && matches!(m.kind(), MemberKind::BlockDevice | MemberKind::DiskFile));
        RegisteredIo { files: self.files.unwrap_or(false), buffers: self.buffers.unwrap_or(pays) }
    }
}

/// Size of one registered bounce buffer: the I/O of 4 KiB random reads and writes, where
/// the per-I/O pinning is the largest share of the kernel's work.
pub const REGISTERED_BUFFER_BYTES: usize = 4096;
/// Registered bounce buffers per executor (pinned memory: 1 MiB).
pub const REGISTERED_BUFFERS: usize = 256;

/// Fixed-file slots per member: its direct and its buffered descriptor.
const FILE_SLOTS_PER_MEMBER: usize = 2;
/// Room for members attached later (hot spares, replacements) without a new table.
const SPARE_FILE_SLOTS: usize = 16;

/// The memory of the registered bounce buffers, shared by the executor and its rings and
/// freed only when the last of them lets go (a ring leaked with a hung device's I/O keeps
/// it for ever: the kernel may still write into it).
pub(super) struct BufferRegion {
    base: *mut u8,
    layout: Layout,
}

// SAFETY: the region is plain memory; the executor hands each chunk to one I/O at a time
// and nobody reads or writes a chunk through `&BufferRegion` otherwise.
unsafe impl Send for BufferRegion {}
unsafe impl Sync for BufferRegion {}

impl BufferRegion {
    fn new() -> BufferRegion {
        let layout = Layout::from_size_align(REGISTERED_BUFFERS * REGISTERED_BUFFER_BYTES, 4096)
            .expect("registered buffer layout");
        // SAFETY: the size is non-zero.
        let base = unsafe { alloc(layout) };
        if base.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        BufferRegion { base, layout }
    }

    /// Address of chunk `i`.
    pub(super) fn chunk_addr(&self, i: u32) -> usize {
        self.base as usize + i as usize * REGISTERED_BUFFER_BYTES
    }

    /// The first `len` bytes of chunk `i`, which an I/O filled.
    pub(super) fn chunk(&self, i: u32, len: usize) -> &[u8] {
        // SAFETY: chunk i lies inside the allocation (i < REGISTERED_BUFFERS, len <= chunk
        // size, checked by `take`'s callers); u8 has no invalid bit patterns.
        unsafe {
            std::slice::from_raw_parts(self.chunk_addr(i) as *const u8, len.min(REGISTERED_BUFFER_BYTES))
        }
    }

    fn iovec(&self) -> libc::iovec {
        libc::iovec { iov_base: self.base.cast(), iov_len: self.layout.size() }
    }
}

impl Drop for BufferRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.base, self.layout) }
    }
}

/// The executor's registered bounce buffers and which are free.
pub(super) struct BufferArena {
    pub(super) region: Arc<BufferRegion>,
    free: Vec<u32>,
}

impl BufferArena {
    pub(super) fn new() -> BufferArena {
        BufferArena {
            region: Arc::new(BufferRegion::new()),
            free: (0..REGISTERED_BUFFERS as u32).rev().collect(),
        }
    }

    /// A free chunk for an I/O of `len` bytes, if it fits one and one is free.
    pub(super) fn take(&mut self, len: usize) -> Option<u32> {
        if len > REGISTERED_BUFFER_BYTES {
            return None;
        }
        self.free.pop()
    }

    pub(super) fn give_back(&mut self, chunk: u32) {
        self.free.push(chunk);
    }
}

static REGISTER_FAILED_LOGGED: Once = Once::new();

fn log_failure(what: &str, e: &std::io::Error) {
    REGISTER_FAILED_LOGGED.call_once(|| {
        eprintln!(
            "uraid-io: io_uring: registering {what} failed ({e}); plain descriptors and buffers instead"
        )
    });
}

/// One ring's registrations.
pub(super) struct RingRegistration {
    want: RegisteredIo,
    /// The member-set generation the fixed-file table holds, and its descriptors by slot.
    files_gen: Option<u64>,
    file_slots: Vec<RawFd>,
    /// The table's size once registered (sparse: empty slots take no file).
    table_len: usize,
    /// Registered as buffer 0 of this ring; kept alive as long as the ring (see
    /// [`BufferRegion`]).
    region: Option<Arc<BufferRegion>>,
    buffers_registered: bool,
}

impl RingRegistration {
    pub(super) fn new(want: RegisteredIo, region: Option<Arc<BufferRegion>>) -> RingRegistration {
        RingRegistration {
            want,
            files_gen: None,
            file_slots: Vec::new(),
            table_len: 0,
            region,
            buffers_registered: false,
        }
    }

    /// Brings the ring's tables up to member set `gen` (the issuing thread's call, on an
    /// enabled ring).
    pub(super) fn prepare(&mut self, ring: &IoUring, gen: u64, members: &MemberSet) {
        if self.want.buffers && !self.buffers_registered {
            self.want.buffers = false;
            if let Some(region) = &self.region {
                // SAFETY: the region stays allocated while this ring lives (the ring holds
                // an `Arc` of it, forgotten with the ring if the ring is leaked).
                match unsafe { ring.submitter().register_buffers(&[region.iovec()]) } {
                    Ok(()) => {
                        self.buffers_registered = true;
                        self.want.buffers = true;
                    }
                    Err(e) => log_failure("buffers", &e),
                }
            }
        }
        if self.want.files && self.files_gen != Some(gen) {
            self.register_files(ring, gen, members);
        }
    }

    fn register_files(&mut self, ring: &IoUring, gen: u64, members: &MemberSet) {
        let mut fds = Vec::with_capacity(members.len() * FILE_SLOTS_PER_MEMBER);
        for m in members.iter() {
            fds.push(m.direct_fd().unwrap_or(-1));
            fds.push(m.buffered.as_raw_fd());
        }
        let submitter = ring.submitter();
        if self.table_len == 0 {
            let len = fds.len() + SPARE_FILE_SLOTS;
            if let Err(e) = submitter.register_files_sparse(len as u32) {
                log_failure("files", &e);
                self.want.files = false;
                return;
            }
            self.table_len = len;
        }
        // Members past the table go with plain descriptors; emptied slots are cleared (-1).
        fds.truncate(self.table_len);
        let mut update = fds.clone();
        update.resize(self.file_slots.len().max(fds.len()), -1);
        if let Err(e) = submitter.register_files_update(0, &update) {
            log_failure("files", &e);
            self.want.files = false;
            self.files_gen = None;
            return;
        }
        self.file_slots = fds;
        self.files_gen = Some(gen);
    }

    /// The fixed-file slot of `fd` for an I/O started under member set `gen`, if it has one.
    pub(super) fn file_slot(&self, gen: u64, fd: RawFd) -> Option<u32> {
        if !self.want.files || self.files_gen != Some(gen) || fd < 0 {
            return None;
        }
        self.file_slots.iter().position(|&f| f == fd).map(|i| i as u32)
    }

    /// Whether this ring reads and writes the registered region with `*_FIXED`.
    pub(super) fn buffers_registered(&self) -> bool {
        self.buffers_registered
    }

    /// Keeps the region allocated for ever: the ring is leaked with I/O the kernel may
    /// still complete into it.
    pub(super) fn leak(&mut self) {
        if let Some(r) = self.region.take() {
            std::mem::forget(r);
        }
    }
}
