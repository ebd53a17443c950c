//! The engine's boundary: what callers hand in (requests, member-I/O completions, time)
//! and what they take out (member I/Os to perform, request completions).
//!
//! Everything here is plain data so that the real executor, the simulator and property
//! tests drive one engine identically.

/// Caller-chosen identifier of an array request; echoed back in its completion.
pub type RequestId = u64;
/// Engine-chosen identifier of a member I/O; the caller echoes it in the completion.
pub type MemberIoId = u64;
/// Virtual or real time in nanoseconds, always passed in by the caller.
pub type TimeNs = u64;

pub const SECTOR_BYTES: u64 = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestOp {
    Read,
    Write,
    Flush,
    /// Discard: the range's contents become unspecified-but-stable; uraid reads it back as zeroes.
    Trim,
    WriteZeroes,
}

/// A request against the array's address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    pub op: RequestOp,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// Force unit access: complete only once this write is durable on every member holding it.
    pub fua: bool,
    /// Payload of a `Write`; empty for every other op.
    pub data: Vec<u8>,
}

impl Request {
    pub fn read(id: RequestId, offset_bytes: u64, len_bytes: u64) -> Self {
        Request { id, op: RequestOp::Read, offset_bytes, len_bytes, fua: false, data: Vec::new() }
    }
    pub fn write(id: RequestId, offset_bytes: u64, data: Vec<u8>) -> Self {
        Request { id, op: RequestOp::Write, offset_bytes, len_bytes: data.len() as u64, fua: false, data }
    }
    pub fn flush(id: RequestId) -> Self {
        Request { id, op: RequestOp::Flush, offset_bytes: 0, len_bytes: 0, fua: false, data: Vec::new() }
    }
    pub fn trim(id: RequestId, offset_bytes: u64, len_bytes: u64) -> Self {
        Request { id, op: RequestOp::Trim, offset_bytes, len_bytes, fua: false, data: Vec::new() }
    }
    pub fn write_zeroes(id: RequestId, offset_bytes: u64, len_bytes: u64) -> Self {
        Request { id, op: RequestOp::WriteZeroes, offset_bytes, len_bytes, fua: false, data: Vec::new() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The array has lost more members than its level survives; nothing more can be served.
    ArrayFailed,
    /// Offset or length beyond the array's end, or a write whose payload length mismatches.
    OutOfRange,
    /// The array is read-only.
    ReadOnly,
    /// Malformed request (unaligned to 512 bytes, payload length mismatch, ...).
    Invalid,
    /// A medium error that redundancy could not cover (raid0, or latent errors beyond parity).
    Io,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RequestError::ArrayFailed => "array failed: more members lost than the level survives",
            RequestError::OutOfRange => "request beyond the end of the array",
            RequestError::ReadOnly => "array is read-only",
            RequestError::Invalid => "invalid request",
            RequestError::Io => "I/O error on a member that redundancy could not cover",
        })
    }
}
impl std::error::Error for RequestError {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestCompletion {
    pub id: RequestId,
    /// The data of a `Read`; empty for other ops.
    pub result: Result<Vec<u8>, RequestError>,
}

/// Refusal at submit time. The request is handed back untouched.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// Back-pressure: a bounded queue or cache is full. Retry after completions drain.
    Busy(Request),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemberIoOp {
    Read,
    Write,
    /// Make every completed write on this member durable (fdatasync / FLUSH CACHE).
    Flush,
}

impl MemberIoOp {
    /// Counts one member I/O of this kind over `len_bytes` in `ms`.
    pub fn count_in(self, ms: &mut crate::stats::MemberStats, len_bytes: u64) {
        match self {
            MemberIoOp::Read => {
                ms.reads += 1;
                ms.read_bytes += len_bytes;
            }
            MemberIoOp::Write => {
                ms.writes += 1;
                ms.write_bytes += len_bytes;
            }
            MemberIoOp::Flush => ms.flushes += 1,
        }
    }
}

/// The payload of a member write: a shared, read-only view of a buffer, so a stripe-cache
/// buffer can feed the member write without a copy while the cache keeps using it.
#[derive(Clone)]
pub struct IoBytes {
    buf: std::sync::Arc<Vec<u8>>,
    start: usize,
    len: usize,
}

impl Default for IoBytes {
    /// No bytes, without an allocation: every read and flush carries one.
    fn default() -> Self {
        static EMPTY: std::sync::OnceLock<std::sync::Arc<Vec<u8>>> = std::sync::OnceLock::new();
        IoBytes { buf: EMPTY.get_or_init(Default::default).clone(), start: 0, len: 0 }
    }
}

impl IoBytes {
    pub fn new() -> Self {
        IoBytes::default()
    }
    /// Bytes `range` of a shared buffer.
    pub fn slice(buf: &std::sync::Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Self {
        assert!(range.end <= buf.len() && range.start <= range.end, "IoBytes range outside its buffer");
        IoBytes { buf: buf.clone(), start: range.start, len: range.end - range.start }
    }
    /// Bytes `range` of this view, sharing its buffer.
    pub fn view(&self, range: std::ops::Range<usize>) -> Self {
        assert!(range.end <= self.len && range.start <= range.end, "IoBytes range outside its view");
        IoBytes { buf: self.buf.clone(), start: self.start + range.start, len: range.end - range.start }
    }
    /// True when this view covers its whole buffer (it is not a window into a larger one).
    pub fn is_whole(&self) -> bool {
        self.start == 0 && self.len == self.buf.len()
    }
    /// True when this view covers its whole buffer and nothing else holds that buffer, so
    /// it may be written in place or reused.
    pub fn is_sole_owner(&self) -> bool {
        self.is_whole() && std::sync::Arc::strong_count(&self.buf) == 1
    }
    /// Writable bytes, copy-on-write: a view that shares its buffer (with a member write in
    /// flight, or with the request it came from) first gets a private copy of its own bytes.
    pub fn make_mut(&mut self) -> &mut [u8] {
        if !self.is_whole() {
            *self = IoBytes::from(self[..].to_vec());
        }
        std::sync::Arc::make_mut(&mut self.buf).as_mut_slice()
    }
    /// The whole buffer back when nothing else shares it and this view covers all of it;
    /// otherwise `self` unchanged. Lets a buffer travel engine -> executor -> engine with no
    /// copy and no fresh allocation (see [`MemberIo::data`] for reads).
    pub fn try_into_unique_vec(self) -> Result<Vec<u8>, IoBytes> {
        if !self.is_whole() {
            return Err(self);
        }
        let (start, len) = (self.start, self.len);
        std::sync::Arc::try_unwrap(self.buf).map_err(|buf| IoBytes { buf, start, len })
    }
    /// The bytes as an owned vector (no copy when this view is the whole, unshared buffer).
    pub fn into_vec(self) -> Vec<u8> {
        self.try_into_unique_vec().unwrap_or_else(|shared| shared[..].to_vec())
    }
}

impl std::ops::Deref for IoBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl From<Vec<u8>> for IoBytes {
    fn from(v: Vec<u8>) -> Self {
        let len = v.len();
        IoBytes { buf: std::sync::Arc::new(v), start: 0, len }
    }
}

impl PartialEq for IoBytes {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}
impl Eq for IoBytes {}

impl std::fmt::Debug for IoBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBytes({} bytes)", self.len)
    }
}

/// One I/O the caller must perform on a member device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberIo {
    pub id: MemberIoId,
    /// Index of the member (the array slot / raid disk role).
    pub member: usize,
    pub op: MemberIoOp,
    /// Absolute byte offset on the member device (data_offset already applied).
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// Payload of a `Write`. For a `Read`, empty or a spare buffer of `len_bytes` that the
    /// executor may read into (and return in the completion) instead of allocating one: the
    /// stripe cache recycles its buffers this way, so a long rebuild neither allocates nor
    /// faults in fresh pages for every block it reads. Empty for a `Flush`.
    pub data: IoBytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberIoError {
    /// Medium or transport error (EIO, short read, ENOSPC...).
    Io,
    /// The device is gone (fail-stop).
    Gone,
}

/// What a member I/O came back with: a read's data, or why it failed.
pub type MemberIoResult = Result<Vec<u8>, MemberIoError>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberIoCompletion {
    pub id: MemberIoId,
    /// The data of a `Read` (exactly `len_bytes`); empty for other ops.
    pub result: MemberIoResult,
}

/// Member I/O ids from here up to twice this are the array's own (superblock, bitmap and
/// log writes and their flushes, see [`crate::array::Array`]): the engine's ids stay below
/// 2^56, and an executor may tell metadata I/O by its id (fault injection does).
pub const ARRAY_META_IO_ID_BASE: MemberIoId = 1 << 58;

/// Is `id` one of the array's own metadata I/Os?
pub fn is_array_meta_io(id: MemberIoId) -> bool {
    (ARRAY_META_IO_ID_BASE..ARRAY_META_IO_ID_BASE << 1).contains(&id)
}

/// Request ids a caller hands to an [`crate::array::Array`] stay below this: the array tags
/// the ids it passes to the engine above it.
pub const MAX_CALLER_REQUEST_ID: RequestId = (1 << 57) - 1;

/// The sans-IO interface every driver runs (the real runtime, the simulator, the tests and
/// the benches): [`crate::Engine`] alone, or [`crate::array::Array`], the engine with md's
/// metadata upkeep around it.
pub trait ArrayEngine {
    fn submit(&mut self, req: Request, now_ns: TimeNs) -> Result<(), SubmitError>;
    fn unplug(&mut self, now_ns: TimeNs);
    fn pop_member_io(&mut self) -> Option<MemberIo>;
    fn complete_member_io(&mut self, completion: MemberIoCompletion, now_ns: TimeNs);
    fn pop_completion(&mut self) -> Option<RequestCompletion>;
    fn next_deadline_ns(&self) -> Option<TimeNs>;
    fn tick(&mut self, now_ns: TimeNs);
    fn fail_member(&mut self, member: usize, now_ns: TimeNs);
    fn is_idle(&self) -> bool;
    /// What is outstanding, for a driver's message when the engine stalls (an engine bug).
    fn outstanding(&self) -> String {
        String::new()
    }
    fn stats_snapshot(&self) -> crate::stats::ArrayStats;
    /// Closing, once every request completed and the driver's final flush did: the
    /// engine's own last steps (an array marks its superblocks clean). Called again after
    /// each round of I/O until it answers; the answer is the close's result.
    fn finish_close(
        &mut self,
        flush: Result<(), RequestError>,
        _now_ns: TimeNs,
    ) -> Option<Result<(), RequestError>> {
        Some(flush)
    }
}

/// Work a completion leaves to the end of the round of completions it was made in: an NBD
/// connection's replies, sent in one syscall per round instead of one per reply.
pub trait RoundWork: Send + Sync {
    fn round_end(&self);
}

/// The completions a thread makes in one round (the array thread's loop, or a connection
/// thread that ran a request itself): each completion callback gets it, and whoever ran
/// the round ends it once nothing more completes before the thread would wait.
#[derive(Default)]
pub struct CompletionRound {
    deferred: Vec<std::sync::Arc<dyn RoundWork>>,
}

impl CompletionRound {
    /// `work` runs at the round's end, once per `defer`: work that several completions of
    /// a round share defers itself once (an NBD connection knows it has replies waiting).
    pub fn defer(&mut self, work: std::sync::Arc<dyn RoundWork>) {
        self.deferred.push(work);
    }

    /// Runs what was deferred.
    pub fn end(&mut self) {
        for w in self.deferred.drain(..) {
            w.round_end();
        }
    }
}

impl Drop for CompletionRound {
    /// A round is never left with work undone (a thread that stops ends it).
    fn drop(&mut self) {
        self.end();
    }
}
