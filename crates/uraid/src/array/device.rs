//! The array as an NBD block device: each request goes to the runtime thread that owns the
//! array, as it came (any byte range: the array widens unaligned reads and read-modify-
//! writes the edge sectors of unaligned writes, in order with every overlapping write).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use uraid_core::array::Array;
use uraid_core::{CompletionRound, Request, RequestCompletion, RequestError};
use uraid_io::runtime::RuntimeHandle;
use uraid_nbd::{BlockDevice, BlockError, BlockRequest, Completion};

use super::latency::{Latency, Op};

pub struct ArrayDevice {
    handle: RuntimeHandle<Array>,
    /// What a new NBD connection is told (a grow makes it larger; NBD has no resize
    /// notice, so a connection keeps the size it was given).
    size_bytes: std::sync::atomic::AtomicU64,
    read_only: bool,
    /// Each request's time from here to its completion, per operation.
    pub latency: Arc<Latency>,
}

fn to_block_error(e: RequestError) -> BlockError {
    match e {
        RequestError::ReadOnly => BlockError::ReadOnly,
        RequestError::OutOfRange | RequestError::Invalid => BlockError::InvalidArgument,
        RequestError::ArrayFailed | RequestError::Io => BlockError::Io(e.to_string()),
    }
}

impl ArrayDevice {
    pub fn new(handle: RuntimeHandle<Array>, size_bytes: u64, read_only: bool) -> ArrayDevice {
        ArrayDevice { handle, size_bytes: size_bytes.into(), read_only, latency: Arc::default() }
    }

    /// The array grew (`uraid grow --size`): new connections see `size_bytes`.
    pub fn set_size_bytes(&self, size_bytes: u64) {
        self.size_bytes.store(size_bytes, std::sync::atomic::Ordering::SeqCst);
    }

    /// Submits to the runtime; if it has stopped, `done` still runs (with ArrayFailed), so
    /// no NBD request is left unanswered.
    fn send(&self, req: Request, op: Op, done: Completion, round: &mut CompletionRound) {
        let slot = Arc::new(Mutex::new(Some(done)));
        let in_cb = slot.clone();
        let latency = self.latency.clone();
        let t0 = Instant::now();
        let cb = Box::new(move |c: RequestCompletion, round: &mut CompletionRound| {
            latency.record(op, t0.elapsed().as_nanos() as u64);
            if let Some(d) = in_cb.lock().unwrap_or_else(|e| e.into_inner()).take() {
                d(c.result.map_err(to_block_error), round)
            }
        });
        if self.handle.submit_driven(req, cb, round).is_err() {
            if let Some(d) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                d(Err(to_block_error(RequestError::ArrayFailed)), round)
            }
        }
    }
}

impl BlockDevice for ArrayDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    /// One array serves every connection: a flush covers all writes completed before it.
    fn multi_conn_consistent(&self) -> bool {
        true
    }

    fn thread_owes_io(&self) -> bool {
        self.handle.thread_owes_io()
    }

    fn drive_thread_io(
        &self,
        readable: Option<std::os::fd::RawFd>,
        timeout: std::time::Duration,
        round: &mut CompletionRound,
    ) -> bool {
        self.handle.drive_thread_io(readable, timeout, round)
    }

    fn thread_done(&self, round: &mut CompletionRound) {
        self.handle.thread_done(round)
    }

    fn submit(&self, req: BlockRequest, done: Completion, round: &mut CompletionRound) {
        let (req, op) = match req {
            BlockRequest::Read { offset_bytes, len_bytes } => {
                (Request::read(0, offset_bytes, u64::from(len_bytes)), Op::Read)
            }
            BlockRequest::Write { offset_bytes, data, fua } => {
                let mut r = Request::write(0, offset_bytes, data);
                r.fua = fua;
                (r, Op::Write)
            }
            BlockRequest::Flush => (Request::flush(0), Op::Flush),
            BlockRequest::WriteZeroes { fast_only: true, .. } => {
                return done(Err(BlockError::NotSupported), round)
            }
            BlockRequest::WriteZeroes { offset_bytes, len_bytes, fua, .. } => {
                let mut r = Request::write_zeroes(0, offset_bytes, u64::from(len_bytes));
                r.fua = fua;
                (r, Op::WriteZeroes)
            }
            BlockRequest::Trim { offset_bytes, len_bytes, fua } => {
                let mut r = Request::trim(0, offset_bytes, u64::from(len_bytes));
                r.fua = fua;
                (r, Op::Trim)
            }
            BlockRequest::Cache { .. } => return done(Ok(Vec::new()), round),
        };
        self.send(req, op, done, round);
    }
}
