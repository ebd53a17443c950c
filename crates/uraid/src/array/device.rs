//! The array as an NBD block device: requests go to the runtime thread that owns the
//! engine; writes first pass the metadata gate (dirty flag, write-intent bits).
//!
//! The engine takes 512-byte aligned requests only; NBD clients may send any byte range,
//! so unaligned reads are widened and unaligned writes become read-modify-write of the
//! edge sectors. Such a read-modify-write is ordered against every overlapping write
//! (see [`SectorLocks`]): a write landing between its read and its write-back would
//! otherwise be overwritten with the sector's older bytes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use uraid_core::{Request, RequestCompletion, RequestError};
use uraid_io::runtime::RuntimeHandle;
use uraid_nbd::{BlockDevice, BlockError, BlockRequest, Completion};

use super::meta::MetaKeeper;

const SECTOR: u64 = 512;

/// Sector spans `[start, end)` of writes in flight. A read-modify-write waits for every
/// overlapping write and holds its span alone; a whole-sector write waits only for an
/// overlapping read-modify-write, so whole-sector writes still run side by side.
#[derive(Default)]
pub struct SectorLocks {
    held: Mutex<SectorSpans>,
    released: Condvar,
}

#[derive(Default)]
struct SectorSpans {
    rmw: Vec<(u64, u64)>,
    writes: Vec<(u64, u64)>,
    waiting: usize,
}

fn overlaps(spans: &[(u64, u64)], span: (u64, u64)) -> bool {
    spans.iter().any(|&(s, e)| s < span.1 && span.0 < e)
}

impl SectorLocks {
    /// Blocks until `span` may be written; `rmw` for a read-modify-write.
    pub fn lock(&self, span: (u64, u64), rmw: bool) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        while overlaps(&held.rmw, span) || rmw && overlaps(&held.writes, span) {
            held.waiting += 1;
            held = self.released.wait(held).unwrap_or_else(|e| e.into_inner());
            held.waiting -= 1;
        }
        if rmw { &mut held.rmw } else { &mut held.writes }.push(span);
    }

    pub fn unlock(&self, span: (u64, u64), rmw: bool) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let list = if rmw { &mut held.rmw } else { &mut held.writes };
        if let Some(i) = list.iter().position(|&h| h == span) {
            list.swap_remove(i);
        }
        let waiters = held.waiting > 0;
        drop(held);
        if waiters {
            self.released.notify_all();
        }
    }
}

type WriteBack = (Request, Box<dyn FnOnce(Result<Vec<u8>, RequestError>) + Send>);

pub struct ArrayDevice {
    handle: RuntimeHandle,
    meta: Arc<MetaKeeper>,
    size_bytes: u64,
    read_only: bool,
    locks: Arc<SectorLocks>,
    /// Submits read-modify-write write-backs: their read completes on the runtime thread,
    /// which must not block on its own full channel.
    write_back: Mutex<std::sync::mpsc::Sender<WriteBack>>,
    /// Slots not in sync, kept by the monitor; a write while degraded keeps its bits.
    pub degraded: Arc<AtomicUsize>,
}

fn to_block_error(e: RequestError) -> BlockError {
    match e {
        RequestError::ReadOnly => BlockError::ReadOnly,
        RequestError::OutOfRange | RequestError::Invalid => BlockError::InvalidArgument,
        RequestError::ArrayFailed | RequestError::Io => BlockError::Io(e.to_string()),
    }
}

impl ArrayDevice {
    pub fn new(
        handle: RuntimeHandle,
        meta: Arc<MetaKeeper>,
        size_bytes: u64,
        read_only: bool,
    ) -> ArrayDevice {
        ArrayDevice {
            handle: handle.clone(),
            meta,
            size_bytes,
            read_only,
            locks: Arc::new(SectorLocks::default()),
            write_back: Mutex::new(spawn_write_back(handle.clone())),
            degraded: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn send(&self, req: Request, done: impl FnOnce(Result<Vec<u8>, RequestError>) + Send + 'static) {
        submit_or_fail(&self.handle, req, done);
    }

    fn read(&self, offset: u64, len: u64, done: Completion) {
        let start = offset / SECTOR * SECTOR;
        let end = (offset + len).div_ceil(SECTOR) * SECTOR;
        let skip = (offset - start) as usize;
        self.send(Request::read(0, start, end - start), move |r| {
            done(r.map_err(to_block_error).map(|mut d| {
                if skip > 0 || d.len() as u64 != len {
                    d.drain(..skip);
                    d.truncate(len as usize);
                }
                d
            }))
        });
    }

    /// A write of `data` at any byte offset (`None` data: zeroes of `len`), then `done`.
    fn write(&self, offset: u64, len: u64, data: Option<Vec<u8>>, fua: bool, done: Completion) {
        let token = match self.meta.before_write(offset, len) {
            Ok(t) => t,
            Err(e) => return done(Err(BlockError::Io(format!("metadata update failed: {e:#}")))),
        };
        let meta = self.meta.clone();
        let degraded = self.degraded.clone();
        let finish = move |r: Result<Vec<u8>, RequestError>| {
            meta.after_write(token, r.is_ok() && degraded.load(Ordering::SeqCst) == 0);
            done(r.map(|_| Vec::new()).map_err(to_block_error));
        };
        let aligned = offset.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR);
        let start = offset / SECTOR * SECTOR;
        let end = (offset + len).div_ceil(SECTOR) * SECTOR;
        let span = (start / SECTOR, end / SECTOR);
        self.locks.lock(span, !aligned);
        let locks = self.locks.clone();
        let finish = move |r: Result<Vec<u8>, RequestError>| {
            locks.unlock(span, !aligned);
            finish(r);
        };
        if aligned {
            let mut req = match data {
                Some(d) => Request::write(0, offset, d),
                None => Request::write_zeroes(0, offset, len),
            };
            req.fua = fua;
            return self.send(req, finish);
        }
        let write_back = self.write_back.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let patch_at = (offset - start) as usize;
        self.send(Request::read(0, start, end - start), move |r| match r {
            Err(e) => finish(Err(e)),
            Ok(mut buf) => {
                match data {
                    Some(d) => buf[patch_at..patch_at + d.len()].copy_from_slice(&d),
                    None => buf[patch_at..patch_at + len as usize].fill(0),
                }
                let mut req = Request::write(0, start, buf);
                req.fua = fua;
                if let Err(std::sync::mpsc::SendError((_, finish))) = write_back.send((req, Box::new(finish)))
                {
                    finish(Err(RequestError::ArrayFailed));
                }
            }
        });
    }
}

/// The thread that submits read-modify-write write-backs, in order; it ends with the device.
fn spawn_write_back(handle: RuntimeHandle) -> std::sync::mpsc::Sender<WriteBack> {
    let (tx, rx) = std::sync::mpsc::channel::<WriteBack>();
    let spawned = std::thread::Builder::new().name("uraid-rmw".into()).spawn(move || {
        for (req, done) in rx {
            submit_or_fail(&handle, req, done);
        }
    });
    if spawned.is_err() {
        eprintln!("uraid: cannot start the read-modify-write thread; unaligned writes will fail");
    }
    tx
}

/// Submits to the runtime; if it has stopped, `done` still runs (with ArrayFailed), so no
/// NBD request is left unanswered.
fn submit_or_fail(
    handle: &RuntimeHandle,
    req: Request,
    done: impl FnOnce(Result<Vec<u8>, RequestError>) + Send + 'static,
) {
    let slot = Arc::new(Mutex::new(Some(done)));
    let in_cb = slot.clone();
    let cb = Box::new(move |c: RequestCompletion| {
        if let Some(d) = in_cb.lock().unwrap_or_else(|e| e.into_inner()).take() {
            d(c.result)
        }
    });
    if handle.submit(req, cb).is_err() {
        if let Some(d) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            d(Err(RequestError::ArrayFailed))
        }
    }
}

impl BlockDevice for ArrayDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    /// One engine serves every connection: a flush covers all writes completed before it.
    fn multi_conn_consistent(&self) -> bool {
        true
    }

    fn submit(&self, req: BlockRequest, done: Completion) {
        match req {
            BlockRequest::Read { offset_bytes, len_bytes } => {
                self.read(offset_bytes, u64::from(len_bytes), done)
            }
            BlockRequest::Write { offset_bytes, data, fua } => {
                let len = data.len() as u64;
                self.write(offset_bytes, len, Some(data), fua, done)
            }
            BlockRequest::Flush => {
                self.send(Request::flush(0), move |r| done(r.map(|_| Vec::new()).map_err(to_block_error)))
            }
            BlockRequest::WriteZeroes { fast_only: true, .. } => done(Err(BlockError::NotSupported)),
            BlockRequest::WriteZeroes { offset_bytes, len_bytes, fua, .. } => {
                self.write_zeroes(offset_bytes, u64::from(len_bytes), fua, done)
            }
            BlockRequest::Trim { offset_bytes, len_bytes, fua } => {
                // Advisory: discard the whole sectors inside the range, leave the edges.
                let start = offset_bytes.div_ceil(SECTOR) * SECTOR;
                let end = (offset_bytes + u64::from(len_bytes)) / SECTOR * SECTOR;
                if end <= start {
                    return done(Ok(Vec::new()));
                }
                let token = match self.meta.before_write(start, end - start) {
                    Ok(t) => t,
                    Err(e) => return done(Err(BlockError::Io(format!("metadata update failed: {e:#}")))),
                };
                let meta = self.meta.clone();
                let mut req = Request::trim(0, start, end - start);
                req.fua = fua;
                let span = (start / SECTOR, end / SECTOR);
                self.locks.lock(span, false);
                let locks = self.locks.clone();
                self.send(req, move |r| {
                    locks.unlock(span, false);
                    meta.after_write(token, false);
                    done(r.map(|_| Vec::new()).map_err(to_block_error))
                });
            }
            BlockRequest::Cache { .. } => done(Ok(Vec::new())),
        }
    }
}

impl ArrayDevice {
    /// Zeroes: whole sectors through the engine's WriteZeroes, edges by read-modify-write.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, done: Completion) {
        let inner_start = offset.div_ceil(SECTOR) * SECTOR;
        let inner_end = (offset + len) / SECTOR * SECTOR;
        if inner_end <= inner_start {
            return self.write(offset, len, None, fua, done);
        }
        let mut parts: Vec<(u64, u64)> = Vec::new();
        if offset < inner_start {
            parts.push((offset, inner_start - offset));
        }
        parts.push((inner_start, inner_end - inner_start));
        if offset + len > inner_end {
            parts.push((inner_end, offset + len - inner_end));
        }
        let remaining = Arc::new(Mutex::new((parts.len(), Some(done), None::<BlockError>)));
        for (o, l) in parts {
            let remaining = remaining.clone();
            self.write(
                o,
                l,
                None,
                fua,
                Box::new(move |r| {
                    let mut g = remaining.lock().unwrap_or_else(|e| e.into_inner());
                    if let Err(e) = r {
                        g.2.get_or_insert(e);
                    }
                    g.0 -= 1;
                    if g.0 == 0 {
                        if let Some(done) = g.1.take() {
                            let err = g.2.take();
                            drop(g);
                            done(match err {
                                Some(e) => Err(e),
                                None => Ok(Vec::new()),
                            });
                        }
                    }
                }),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `lock` in another thread; returns a receiver that fires once it got the span.
    fn lock_in_thread(
        locks: &Arc<SectorLocks>,
        span: (u64, u64),
        rmw: bool,
    ) -> std::sync::mpsc::Receiver<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        let locks = locks.clone();
        std::thread::spawn(move || {
            locks.lock(span, rmw);
            let _ = tx.send(());
        });
        rx
    }

    #[test]
    fn a_read_modify_write_waits_for_overlapping_writes_and_they_for_it() {
        let locks = Arc::new(SectorLocks::default());
        locks.lock((0, 8), false);
        locks.lock((4, 12), false); // whole-sector writes overlap freely
        let rmw = lock_in_thread(&locks, (7, 8), true);
        assert!(rmw.recv_timeout(Duration::from_millis(100)).is_err(), "the RMW ran beside a write");
        locks.unlock((0, 8), false);
        assert!(rmw.recv_timeout(Duration::from_millis(100)).is_err(), "the RMW ran beside a write");
        locks.unlock((4, 12), false);
        rmw.recv_timeout(Duration::from_secs(5)).expect("the RMW was never woken");
        let write = lock_in_thread(&locks, (7, 9), false);
        assert!(write.recv_timeout(Duration::from_millis(100)).is_err(), "a write ran beside the RMW");
        let apart = lock_in_thread(&locks, (8, 9), false);
        apart.recv_timeout(Duration::from_secs(5)).expect("a write outside the RMW's span waited");
        locks.unlock((7, 8), true);
        write.recv_timeout(Duration::from_secs(5)).expect("the write was never woken");
    }
}
