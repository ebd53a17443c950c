//! The block-device interface the server drives, plus an in-memory and a file-backed
//! device for tests and benchmarks.
//!
//! The RAID engine sits behind [`BlockDevice`]. Completion is by callback so a device can
//! keep many requests in flight (NBD clients run at queue depth 32 and more) and finish
//! them in any order from any thread.

use crate::codec::BlockSizeConstraints;
use crate::proto;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use uraid_core::CompletionRound;

/// One request against the device's byte address space. The server has already checked
/// that `offset_bytes + len` lies inside [`BlockDevice::size_bytes`], that the device is
/// writable for writing requests, and the alignment to [`BlockDevice::block_size`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockRequest {
    /// Completes with exactly `len_bytes` of data.
    Read { offset_bytes: u64, len_bytes: u32 },
    /// `fua`: complete only once this data is durable.
    Write { offset_bytes: u64, data: Vec<u8>, fua: bool },
    /// Complete only once every write completed before this flush was submitted is durable.
    Flush,
    /// Advisory discard. Afterwards the range's contents are unspecified until rewritten.
    Trim { offset_bytes: u64, len_bytes: u32, fua: bool },
    /// The range must read back as zeroes afterwards.
    WriteZeroes {
        offset_bytes: u64,
        len_bytes: u32,
        fua: bool,
        /// The device may deallocate (punch a hole); false is NBD's `NO_HOLE`.
        may_trim: bool,
        /// NBD's `FAST_ZERO`: if zeroing is not faster than writing zeroes, fail at once
        /// with [`BlockError::NotSupported`] without touching the data.
        fast_only: bool,
    },
    /// Advisory prefetch.
    Cache { offset_bytes: u64, len_bytes: u32 },
}

/// Why a request failed. Maps to the protocol's small, fixed error set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockError {
    Io(String),
    NoSpace,
    InvalidArgument,
    ReadOnly,
    /// The device cannot do this (e.g. fast zeroing); see `BlockRequest::WriteZeroes`.
    NotSupported,
    ShuttingDown,
}

impl BlockError {
    /// The NBD error value.
    pub fn errno(&self) -> u32 {
        match self {
            BlockError::Io(_) => proto::EIO,
            BlockError::NoSpace => proto::ENOSPC,
            BlockError::InvalidArgument => proto::EINVAL,
            BlockError::ReadOnly => proto::EPERM,
            BlockError::NotSupported => proto::ENOTSUP,
            BlockError::ShuttingDown => proto::ESHUTDOWN,
        }
    }
}

impl std::fmt::Display for BlockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockError::Io(msg) => write!(f, "I/O error: {msg}"),
            BlockError::NoSpace => f.write_str("no space left on device"),
            BlockError::InvalidArgument => f.write_str("invalid argument"),
            BlockError::ReadOnly => f.write_str("device is read-only"),
            BlockError::NotSupported => f.write_str("operation not supported"),
            BlockError::ShuttingDown => f.write_str("device is shutting down"),
        }
    }
}
impl std::error::Error for BlockError {}

impl From<std::io::Error> for BlockError {
    fn from(e: std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => BlockError::NoSpace,
            Some(libc::EROFS) | Some(libc::EPERM) => BlockError::ReadOnly,
            Some(libc::EOPNOTSUPP) => BlockError::NotSupported,
            _ => BlockError::Io(e.to_string()),
        }
    }
}

/// Completion callback: `Ok(data)` carries the read data for `Read` and an empty vector
/// for everything else; the round is the completing thread's (see
/// `uraid_core::CompletionRound`): what the callback leaves to the round's end (the reply
/// to the client) happens when that thread ends it.
pub type Completion = Box<dyn FnOnce(Result<Vec<u8>, BlockError>, &mut CompletionRound) + Send>;

/// What the NBD server needs from the thing it exports.
///
/// Contract:
/// - `submit` must not block for long: queue the work and return. It may also complete
///   the request inline (call `done` with `round`, the calling connection thread's, before
///   returning); the server holds no lock then. A device completing on a thread of its own
///   passes that thread's round and ends it before the thread waits.
/// - `done` is called exactly once per request, from any thread, in any order.
/// - A completed write is visible to every later read, whatever connection sends it.
/// - `Flush` covers every write that completed before the flush was submitted;
///   `fua` makes one write durable before it completes.
/// - The server never submits two overlapping writes from one well-behaved client at
///   once, but a hostile client can; the device must stay memory-safe and consistent
///   (either write may win).
pub trait BlockDevice: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    fn read_only(&self) -> bool;
    /// True only if a flush submitted through one connection covers writes completed
    /// through another, i.e. any cache is shared. Decides `NBD_FLAG_CAN_MULTI_CONN`.
    fn multi_conn_consistent(&self) -> bool;
    /// Constraints advertised to clients; the server rejects misaligned requests with
    /// EINVAL when `min_bytes > 1`.
    fn block_size(&self) -> BlockSizeConstraints {
        BlockSizeConstraints::default()
    }
    fn submit(&self, req: BlockRequest, done: Completion, round: &mut CompletionRound);
    /// Whether the calling thread owes the device work only it can do: I/O `submit` issued
    /// on a ring of this thread's own, whose requests (its own and other connections')
    /// finish only when this thread reaps it. While true the thread must not block but in
    /// [`BlockDevice::drive_thread_io`].
    fn thread_owes_io(&self) -> bool {
        false
    }
    /// Does that work: finishes what completed, after waiting up to `timeout` for a
    /// completion or for `readable` to become readable when nothing was ready. Returns
    /// true when the caller should go on (`readable` is readable, or nothing is owed).
    fn drive_thread_io(
        &self,
        _readable: Option<std::os::fd::RawFd>,
        _timeout: std::time::Duration,
        _round: &mut CompletionRound,
    ) -> bool {
        true
    }
    /// The calling thread is done with the device: it finishes what it owes first.
    fn thread_done(&self, _round: &mut CompletionRound) {}
}

/// Counters of requests that reached a device; tests use them to prove that flushes and
/// FUA were passed through.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub write_zeroes: AtomicU64,
    pub caches: AtomicU64,
}

impl DeviceCounters {
    fn count(&self, req: &BlockRequest) {
        let c = match req {
            BlockRequest::Read { .. } => &self.reads,
            BlockRequest::Write { fua, .. } => {
                if *fua {
                    self.fua_writes.fetch_add(1, Ordering::Relaxed);
                }
                &self.writes
            }
            BlockRequest::Flush => &self.flushes,
            BlockRequest::Trim { .. } => &self.trims,
            BlockRequest::WriteZeroes { .. } => &self.write_zeroes,
            BlockRequest::Cache { .. } => &self.caches,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

fn range(offset_bytes: u64, len_bytes: usize, size_bytes: u64) -> Result<std::ops::Range<usize>, BlockError> {
    let end = offset_bytes.checked_add(len_bytes as u64).ok_or(BlockError::InvalidArgument)?;
    if end > size_bytes {
        return Err(BlockError::InvalidArgument);
    }
    Ok(offset_bytes as usize..end as usize)
}

struct MemImage {
    live: Vec<u8>,
    /// With a write cache: the contents as of the last flush (plus FUA writes); what
    /// would survive a power loss.
    durable: Option<Vec<u8>>,
}

/// A RAM disk. Completes every request inline.
///
/// With [`MemDevice::with_write_cache`] it models a volatile write cache shared by all
/// connections: writes land in `live`, and only a flush or FUA makes them durable. That
/// lets tests check that flushes and FUA reach the device in the right order.
pub struct MemDevice {
    image: RwLock<MemImage>,
    size_bytes: u64,
    read_only: bool,
    block_size: BlockSizeConstraints,
    pub counters: DeviceCounters,
}

impl MemDevice {
    pub fn new(size_bytes: usize) -> Self {
        MemDevice {
            image: RwLock::new(MemImage { live: vec![0; size_bytes], durable: None }),
            size_bytes: size_bytes as u64,
            read_only: false,
            block_size: BlockSizeConstraints::default(),
            counters: DeviceCounters::default(),
        }
    }

    pub fn with_write_cache(size_bytes: usize) -> Self {
        let d = MemDevice::new(size_bytes);
        d.image.write().unwrap_or_else(|e| e.into_inner()).durable = Some(vec![0; size_bytes]);
        d
    }

    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    pub fn with_block_size(mut self, block_size: BlockSizeConstraints) -> Self {
        self.block_size = block_size;
        self
    }

    /// Current contents, as a reader sees them.
    pub fn snapshot(&self) -> Vec<u8> {
        self.lock_read().live.clone()
    }

    /// Contents that would survive a power loss (equal to `snapshot` without a cache).
    pub fn durable_snapshot(&self) -> Vec<u8> {
        let img = self.lock_read();
        img.durable.as_ref().unwrap_or(&img.live).clone()
    }

    /// Direct write, bypassing the protocol (test setup).
    pub fn fill(&self, offset_bytes: usize, data: &[u8]) {
        let mut img = self.lock_write();
        img.live[offset_bytes..offset_bytes + data.len()].copy_from_slice(data);
        if let Some(d) = img.durable.as_mut() {
            d[offset_bytes..offset_bytes + data.len()].copy_from_slice(data);
        }
    }

    fn lock_read(&self) -> std::sync::RwLockReadGuard<'_, MemImage> {
        self.image.read().unwrap_or_else(|e| e.into_inner())
    }
    fn lock_write(&self) -> std::sync::RwLockWriteGuard<'_, MemImage> {
        self.image.write().unwrap_or_else(|e| e.into_inner())
    }

    fn execute(&self, req: BlockRequest) -> Result<Vec<u8>, BlockError> {
        let writes = matches!(
            req,
            BlockRequest::Write { .. } | BlockRequest::Trim { .. } | BlockRequest::WriteZeroes { .. }
        );
        if writes && self.read_only {
            return Err(BlockError::ReadOnly);
        }
        match req {
            BlockRequest::Read { offset_bytes, len_bytes } => {
                let r = range(offset_bytes, len_bytes as usize, self.size_bytes)?;
                Ok(self.lock_read().live[r].to_vec())
            }
            BlockRequest::Write { offset_bytes, data, fua } => {
                let r = range(offset_bytes, data.len(), self.size_bytes)?;
                let mut img = self.lock_write();
                img.live[r.clone()].copy_from_slice(&data);
                if fua {
                    if let Some(d) = img.durable.as_mut() {
                        d[r].copy_from_slice(&data);
                    }
                }
                Ok(Vec::new())
            }
            BlockRequest::Trim { offset_bytes, len_bytes, fua }
            | BlockRequest::WriteZeroes { offset_bytes, len_bytes, fua, .. } => {
                // Trimmed ranges read back as zeroes, as uraid's arrays do.
                let r = range(offset_bytes, len_bytes as usize, self.size_bytes)?;
                let mut img = self.lock_write();
                img.live[r.clone()].fill(0);
                if fua {
                    if let Some(d) = img.durable.as_mut() {
                        d[r].fill(0);
                    }
                }
                Ok(Vec::new())
            }
            BlockRequest::Flush => {
                let mut img = self.lock_write();
                let MemImage { live, durable } = &mut *img;
                if let Some(d) = durable.as_mut() {
                    d.copy_from_slice(live);
                }
                Ok(Vec::new())
            }
            BlockRequest::Cache { offset_bytes, len_bytes } => {
                range(offset_bytes, len_bytes as usize, self.size_bytes)?;
                Ok(Vec::new())
            }
        }
    }
}

impl BlockDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn multi_conn_consistent(&self) -> bool {
        // One image and one (modelled) cache shared by every connection.
        true
    }
    fn block_size(&self) -> BlockSizeConstraints {
        self.block_size
    }
    fn submit(&self, req: BlockRequest, done: Completion, round: &mut CompletionRound) {
        self.counters.count(&req);
        done(self.execute(req), round);
    }
}

type Job = (BlockRequest, Completion);

struct FileInner {
    file: File,
    size_bytes: u64,
    read_only: bool,
    counters: DeviceCounters,
}

/// A regular file (or block device node) served by a small pool of worker threads using
/// positional I/O. The page cache is shared by every connection, and `fdatasync` covers
/// all of it, so the device is multi-connection consistent.
pub struct FileDevice {
    inner: Arc<FileInner>,
    queue: Option<mpsc::Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

const ZERO_CHUNK_BYTES: usize = 1024 * 1024;

impl FileDevice {
    /// Opens `path`; its current length is the device size. `workers` threads (at least
    /// one) execute requests, so up to that many run in parallel.
    pub fn open(path: &Path, read_only: bool, workers: usize) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().read(true).write(!read_only).open(path)?;
        let size_bytes = file.metadata()?.len();
        let inner = Arc::new(FileInner { file, size_bytes, read_only, counters: DeviceCounters::default() });
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..workers.max(1))
            .map(|i| {
                let inner = Arc::clone(&inner);
                let rx = Arc::clone(&rx);
                std::thread::Builder::new().name(format!("nbd-file-{i}")).spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok((req, done)) = job else { return };
                    let mut round = CompletionRound::default();
                    done(inner.execute(req), &mut round);
                    round.end();
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(FileDevice { inner, queue: Some(tx), workers })
    }

    pub fn counters(&self) -> &DeviceCounters {
        &self.inner.counters
    }
}

impl Drop for FileDevice {
    fn drop(&mut self) {
        self.queue.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl FileInner {
    fn execute(&self, req: BlockRequest) -> Result<Vec<u8>, BlockError> {
        let writes = matches!(
            req,
            BlockRequest::Write { .. } | BlockRequest::Trim { .. } | BlockRequest::WriteZeroes { .. }
        );
        if writes && self.read_only {
            return Err(BlockError::ReadOnly);
        }
        match req {
            BlockRequest::Read { offset_bytes, len_bytes } => {
                range(offset_bytes, len_bytes as usize, self.size_bytes)?;
                let mut buf = vec![0; len_bytes as usize];
                self.file.read_exact_at(&mut buf, offset_bytes)?;
                Ok(buf)
            }
            BlockRequest::Write { offset_bytes, data, fua } => {
                range(offset_bytes, data.len(), self.size_bytes)?;
                self.file.write_all_at(&data, offset_bytes)?;
                if fua {
                    self.file.sync_data()?;
                }
                Ok(Vec::new())
            }
            BlockRequest::Flush => {
                self.file.sync_data()?;
                Ok(Vec::new())
            }
            BlockRequest::Trim { offset_bytes, len_bytes, fua } => {
                range(offset_bytes, len_bytes as usize, self.size_bytes)?;
                // Trim is advisory: a file system that cannot punch holes just keeps the data.
                if self.fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset_bytes,
                    len_bytes,
                ) && fua
                {
                    self.file.sync_data()?;
                }
                Ok(Vec::new())
            }
            BlockRequest::WriteZeroes { offset_bytes, len_bytes, fua, may_trim, fast_only } => {
                range(offset_bytes, len_bytes as usize, self.size_bytes)?;
                let mode = if may_trim {
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
                } else {
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
                };
                if !self.fallocate(mode, offset_bytes, len_bytes) {
                    if fast_only {
                        return Err(BlockError::NotSupported);
                    }
                    let zeroes = vec![0u8; ZERO_CHUNK_BYTES.min(len_bytes as usize)];
                    let mut done_bytes = 0u64;
                    while done_bytes < u64::from(len_bytes) {
                        let n = (u64::from(len_bytes) - done_bytes).min(zeroes.len() as u64) as usize;
                        self.file.write_all_at(&zeroes[..n], offset_bytes + done_bytes)?;
                        done_bytes += n as u64;
                    }
                }
                if fua {
                    self.file.sync_data()?;
                }
                Ok(Vec::new())
            }
            BlockRequest::Cache { offset_bytes, len_bytes } => {
                range(offset_bytes, len_bytes as usize, self.size_bytes)?;
                // SAFETY: posix_fadvise only reads its integer arguments.
                unsafe {
                    libc::posix_fadvise(
                        std::os::fd::AsRawFd::as_raw_fd(&self.file),
                        offset_bytes as libc::off_t,
                        len_bytes as libc::off_t,
                        libc::POSIX_FADV_WILLNEED,
                    );
                }
                Ok(Vec::new())
            }
        }
    }

    /// True when the kernel did it; false when the file system does not support the mode.
    fn fallocate(&self, mode: libc::c_int, offset_bytes: u64, len_bytes: u32) -> bool {
        if len_bytes == 0 {
            return true;
        }
        // SAFETY: fallocate only reads its integer arguments; the fd is owned by self.file.
        let rc = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&self.file),
                mode,
                offset_bytes as libc::off_t,
                libc::off_t::from(len_bytes),
            )
        };
        rc == 0
    }
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes
    }
    fn read_only(&self) -> bool {
        self.inner.read_only
    }
    fn multi_conn_consistent(&self) -> bool {
        true
    }
    fn submit(&self, req: BlockRequest, done: Completion, round: &mut CompletionRound) {
        self.inner.counters.count(&req);
        match &self.queue {
            Some(q) => {
                if let Err(mpsc::SendError((_, done))) = q.send((req, done)) {
                    done(Err(BlockError::ShuttingDown), round);
                }
            }
            None => done(Err(BlockError::ShuttingDown), round),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dev: &dyn BlockDevice, req: BlockRequest) -> Result<Vec<u8>, BlockError> {
        let (tx, rx) = mpsc::channel();
        dev.submit(req, Box::new(move |r, _| tx.send(r).unwrap()), &mut CompletionRound::default());
        rx.recv().unwrap()
    }

    #[test]
    fn mem_device_write_cache_models_flush_and_fua() {
        let d = MemDevice::with_write_cache(8192);
        run(&d, BlockRequest::Write { offset_bytes: 10, data: vec![1; 10], fua: false }).unwrap();
        assert_eq!(d.snapshot()[10..20], [1; 10]);
        assert_eq!(d.durable_snapshot()[10..20], [0; 10]);
        run(&d, BlockRequest::Write { offset_bytes: 100, data: vec![2; 10], fua: true }).unwrap();
        assert_eq!(d.durable_snapshot()[100..110], [2; 10]);
        assert_eq!(d.durable_snapshot()[10..20], [0; 10]);
        run(&d, BlockRequest::Flush).unwrap();
        assert_eq!(d.durable_snapshot(), d.snapshot());
        assert_eq!(
            run(&d, BlockRequest::Read { offset_bytes: 8190, len_bytes: 4 }),
            Err(BlockError::InvalidArgument)
        );
    }

    #[test]
    fn file_device_round_trip_and_zeroes() {
        let dir = std::env::temp_dir().join(format!("uraid-nbd-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        std::fs::write(&path, vec![0xffu8; 1 << 20]).unwrap();
        let d = FileDevice::open(&path, false, 2).unwrap();
        assert_eq!(d.size_bytes(), 1 << 20);
        run(&d, BlockRequest::Write { offset_bytes: 3, data: vec![7; 5000], fua: true }).unwrap();
        assert_eq!(run(&d, BlockRequest::Read { offset_bytes: 3, len_bytes: 5000 }).unwrap(), vec![7; 5000]);
        for may_trim in [true, false] {
            run(
                &d,
                BlockRequest::WriteZeroes {
                    offset_bytes: 1,
                    len_bytes: 70000,
                    fua: false,
                    may_trim,
                    fast_only: false,
                },
            )
            .unwrap();
            assert_eq!(run(&d, BlockRequest::Read { offset_bytes: 0, len_bytes: 70002 }).unwrap(), {
                let mut v = vec![0u8; 70002];
                v[0] = 0xff;
                v[70001] = 0xff;
                v
            });
        }
        run(&d, BlockRequest::Flush).unwrap();
        drop(d);
        let ro = FileDevice::open(&path, true, 1).unwrap();
        assert_eq!(
            run(&ro, BlockRequest::Trim { offset_bytes: 0, len_bytes: 1, fua: false }),
            Err(BlockError::ReadOnly)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
