//! Writing a connection's replies: from the thread that completes the request when the
//! socket takes the reply at once, from the connection's writer thread otherwise.
//!
//! The completing thread sends the reply itself with one non-blocking `sendmsg` (header
//! and payload gathered, no copy), so a reply costs no hand-off to another thread (a
//! wake-up and two context switches). The writer thread only takes over what cannot go out
//! at once: the rest of a reply the socket took only in part (a large read payload beyond
//! the free socket buffer, a client that reads slowly) and everything queued behind it,
//! so replies never interleave on the wire. A completing thread never blocks on the
//! socket, and copies at most one socket buffer's worth per reply; the writer thread
//! blocks, bounded by the socket's send timeout. Large payloads go inline too: the copy
//! costs the same on either thread, the hand-off does not (docs/performance.md, "Where
//! replies are sent from").
//!
//! A reply made in a round of completions (`uraid_core::CompletionRound`: the array
//! thread's loop, or a connection thread that ran a request itself) is held back until the
//! round ends, and then each connection's share goes out in one `sendmsg`: one syscall and
//! one wake-up of the client per round instead of per reply.
//!
//! Every submitted request holds a [`Pending`]; the writer thread ends once the reader
//! has stopped and no request is pending, so the connection answers everything it took.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use uraid_core::{CompletionRound, RoundWork};

use crate::codec::{encode_error_reply, encode_ok_reply, encode_read_reply_header};

/// What a reply says.
pub(crate) enum ReplyBody {
    Ok,
    Read { offset_bytes: u64, data: Vec<u8> },
    Error { errno: u32, message: std::borrow::Cow<'static, str> },
}

/// A reply encoded for the wire, possibly partly sent.
struct Queued {
    header: Vec<u8>,
    payload: Vec<u8>,
    /// Bytes of header + payload already on the wire.
    sent: usize,
    budget_bytes: usize,
}

impl Queued {
    fn total(&self) -> usize {
        self.header.len() + self.payload.len()
    }
}

struct State {
    queue: VecDeque<Queued>,
    /// The writer thread is writing replies it took out of `queue` (without the lock).
    writer_busy: bool,
    /// The socket failed: replies are dropped, their budget still released.
    failed: bool,
    /// Requests submitted and not yet answered (sent or queued).
    pending: usize,
    /// The reader has stopped: no more requests will be submitted.
    reader_done: bool,
    /// Reused to encode headers of replies sent inline.
    scratch: Vec<u8>,
    /// Replies held back until the end of the round they were made in.
    batch: Vec<Queued>,
    /// This connection waits for a round's end (see `Replies::round_end`).
    in_batch: bool,
}

/// Most iovecs one `sendmsg` gets (Linux allows 1024).
const MAX_IOVECS: usize = 512;

/// The reply side of one connection.
pub(crate) struct Replies {
    fd: OwnedFd,
    structured: bool,
    state: Mutex<State>,
    /// Wakes the writer thread: work queued, or the last pending request answered.
    wake: Condvar,
    /// Called with a reply's budget bytes once it is on the wire or dropped.
    release: Box<dyn Fn(usize) + Send + Sync>,
}

/// One request's duty to answer. Dropped without [`Pending::reply`] (a device that lost
/// the completion), it answers EIO, so the client and the connection never wait forever.
pub(crate) struct Pending {
    replies: Arc<Replies>,
    handle: u64,
    budget_bytes: usize,
    answered: bool,
}

impl Pending {
    /// Answers the request: held back until `round` ends.
    pub(crate) fn reply(mut self, body: ReplyBody, round: &mut CompletionRound) {
        self.answered = true;
        self.replies.send(self.handle, self.budget_bytes, body, Some(round));
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            let body = ReplyBody::Error {
                errno: crate::proto::EIO,
                message: std::borrow::Cow::Borrowed("request lost by the device"),
            };
            self.replies.send(self.handle, self.budget_bytes, body, None);
        }
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `sendmsg` of the unsent part of `header` + `payload`; never raises SIGPIPE.
fn send_parts(fd: &OwnedFd, header: &[u8], payload: &[u8], sent: usize, flags: i32) -> io::Result<usize> {
    let (h, p) = if sent < header.len() {
        (&header[sent..], payload)
    } else {
        (&[][..], &payload[sent - header.len()..])
    };
    let mut iov = [
        libc::iovec { iov_base: h.as_ptr() as *mut libc::c_void, iov_len: h.len() },
        libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() },
    ];
    let parts = if h.is_empty() { &mut iov[1..] } else { &mut iov[..] };
    send_iov(fd, parts, flags)
}

/// `sendmsg` of `iov`; never raises SIGPIPE.
fn send_iov(fd: &OwnedFd, iov: &mut [libc::iovec], flags: i32) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid; it points at iovecs over live slices.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: sendmsg reads the buffers described by `msg`, all alive for this call.
        let r = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, flags | libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl RoundWork for Replies {
    fn round_end(&self) {
        self.flush_batch();
    }
}

impl Replies {
    /// `fd`: the connection's socket (a duplicate). `release`: gives budget back.
    pub(crate) fn new(fd: OwnedFd, structured: bool, release: Box<dyn Fn(usize) + Send + Sync>) -> Arc<Self> {
        Arc::new(Replies {
            fd,
            structured,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                writer_busy: false,
                failed: false,
                pending: 0,
                reader_done: false,
                scratch: Vec::with_capacity(64),
                batch: Vec::new(),
                in_batch: false,
            }),
            wake: Condvar::new(),
            release,
        })
    }

    /// Registers a request about to be submitted; answer it through the result.
    pub(crate) fn pending(self: &Arc<Self>, handle: u64, budget_bytes: usize) -> Pending {
        lock(&self.state).pending += 1;
        Pending { replies: Arc::clone(self), handle, budget_bytes, answered: false }
    }

    /// The reader will submit nothing more.
    pub(crate) fn reader_done(&self) {
        lock(&self.state).reader_done = true;
        self.wake.notify_all();
    }

    /// Encodes the reply's header into `header`; returns its payload.
    fn encode(&self, out: &mut Vec<u8>, handle: u64, body: ReplyBody) -> Vec<u8> {
        match body {
            ReplyBody::Ok => {
                encode_ok_reply(out, self.structured, handle);
                Vec::new()
            }
            ReplyBody::Read { offset_bytes, data } => {
                encode_read_reply_header(out, self.structured, handle, offset_bytes, data.len() as u32);
                data
            }
            ReplyBody::Error { errno, message } => {
                encode_error_reply(out, self.structured, handle, errno, &message);
                Vec::new()
            }
        }
    }

    fn fail(&self, st: &mut State) {
        if !st.failed {
            st.failed = true;
            // SAFETY: shutdown on a descriptor we own; wakes a client and our reader.
            unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }

    /// Sends the reply at once, or holds it back until `round` ends.
    fn send(
        self: &Arc<Self>,
        handle: u64,
        budget_bytes: usize,
        body: ReplyBody,
        round: Option<&mut CompletionRound>,
    ) {
        let mut st = lock(&self.state);
        st.pending -= 1;
        if st.failed {
            drop(st);
            (self.release)(budget_bytes);
            self.wake.notify_all();
            return;
        }
        if let Some(round) = round {
            let mut header = Vec::with_capacity(32);
            let payload = self.encode(&mut header, handle, body);
            st.batch.push(Queued { header, payload, sent: 0, budget_bytes });
            if !std::mem::replace(&mut st.in_batch, true) {
                drop(st);
                round.defer(Arc::clone(self) as Arc<dyn RoundWork>);
            }
            return;
        }
        let mut header = std::mem::take(&mut st.scratch);
        header.clear();
        let payload = self.encode(&mut header, handle, body);
        let mut sent = 0;
        if !st.writer_busy && st.queue.is_empty() {
            // Under the lock, so no other thread writes to the socket meanwhile; the call
            // never blocks.
            match send_parts(&self.fd, &header, &payload, 0, libc::MSG_DONTWAIT) {
                Ok(n) => sent = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    self.fail(&mut st);
                    st.scratch = header;
                    drop(st);
                    (self.release)(budget_bytes);
                    self.wake.notify_all();
                    return;
                }
            }
            if sent == header.len() + payload.len() {
                st.scratch = header;
                let wake_writer = st.reader_done && st.pending == 0;
                drop(st);
                (self.release)(budget_bytes);
                if wake_writer {
                    self.wake.notify_all();
                }
                return;
            }
        }
        st.scratch = Vec::with_capacity(64);
        st.queue.push_back(Queued { header, payload, sent, budget_bytes });
        drop(st);
        self.wake.notify_all();
    }

    /// Sends the replies held back for this connection: as many as the socket takes at
    /// once, in one `sendmsg` per `MAX_IOVECS / 2`; the rest goes to the writer thread.
    fn flush_batch(&self) {
        let mut st = lock(&self.state);
        st.in_batch = false;
        let mut batch = std::mem::take(&mut st.batch);
        let mut done = 0usize;
        if st.failed {
            done = batch.len();
        } else if !st.writer_busy && st.queue.is_empty() {
            // Under the lock, as in `send`: nobody else writes meanwhile, nothing blocks.
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(MAX_IOVECS);
            'send: while done < batch.len() {
                iov.clear();
                for q in batch[done..].iter().take(MAX_IOVECS / 2) {
                    for part in [&q.header[..], &q.payload[..]] {
                        if !part.is_empty() {
                            iov.push(libc::iovec {
                                iov_base: part.as_ptr() as *mut libc::c_void,
                                iov_len: part.len(),
                            });
                        }
                    }
                }
                let mut n = match send_iov(&self.fd, &mut iov, libc::MSG_DONTWAIT) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break 'send,
                    Err(_) => {
                        self.fail(&mut st);
                        done = batch.len();
                        break 'send;
                    }
                };
                while n > 0 && done < batch.len() {
                    let q = &mut batch[done];
                    let take = n.min(q.total() - q.sent);
                    q.sent += take;
                    n -= take;
                    if q.sent < q.total() {
                        // Cut mid-reply: the writer thread finishes it.
                        break 'send;
                    }
                    done += 1;
                }
            }
        }
        let released: Vec<usize> = batch.drain(..done).map(|q| q.budget_bytes).collect();
        let queued = !batch.is_empty();
        st.queue.extend(batch);
        let wake_writer = queued || (st.reader_done && st.pending == 0);
        drop(st);
        for bytes in released {
            (self.release)(bytes);
        }
        if wake_writer {
            self.wake.notify_all();
        }
    }

    /// The writer thread's loop: writes what was queued, blocking; returns once the reader
    /// is done and every request has been answered.
    pub(crate) fn run_writer(&self) {
        let mut batch: Vec<Queued> = Vec::new();
        let mut st = lock(&self.state);
        loop {
            if !st.queue.is_empty() {
                batch.extend(st.queue.drain(..));
                st.writer_busy = true;
                let failed = st.failed;
                drop(st);
                let ok = failed || self.write_all(&mut batch);
                for q in batch.drain(..) {
                    (self.release)(q.budget_bytes);
                }
                st = lock(&self.state);
                st.writer_busy = false;
                if !ok {
                    self.fail(&mut st);
                }
                continue;
            }
            // Replies a batching thread holds back still need the socket.
            if st.reader_done && st.pending == 0 && st.batch.is_empty() {
                return;
            }
            st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocking writes of `batch`, in order; false when the socket failed.
    fn write_all(&self, batch: &mut [Queued]) -> bool {
        for q in batch.iter_mut() {
            while q.sent < q.total() {
                match send_parts(&self.fd, &q.header, &q.payload, q.sent, 0) {
                    Ok(0) => return false,
                    Ok(n) => q.sent += n,
                    // Includes the send timeout (EAGAIN): a client that does not read.
                    Err(_) => return false,
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{EIO, SIMPLE_REPLY_MAGIC};
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// Reads one simple reply: (handle, error, payload of `payload_len` if no error).
    fn read_reply(client: &mut UnixStream, payload_len: usize) -> (u64, u32, Vec<u8>) {
        let mut h = [0u8; 16];
        client.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[0..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC);
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let handle = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut data = vec![0u8; if error == 0 { payload_len } else { 0 }];
        client.read_exact(&mut data).unwrap();
        (handle, error, data)
    }

    /// Replies on `server` whose released budget is summed into the returned counter (`+ 1`
    /// per release when `count_releases`, as the budget counts requests as well as bytes).
    fn counting_replies(server: UnixStream, count_releases: bool) -> (Arc<Replies>, Arc<AtomicUsize>) {
        let released = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&released);
        let extra = usize::from(count_releases);
        let replies = Replies::new(
            server.into(),
            false,
            Box::new(move |b| {
                r.fetch_add(b + extra, Ordering::SeqCst);
            }),
        );
        (replies, released)
    }

    fn spawn_writer(replies: &Arc<Replies>) -> std::thread::JoinHandle<()> {
        let replies = Arc::clone(replies);
        std::thread::spawn(move || replies.run_writer())
    }

    /// A client that stops reading must not block the thread completing requests (the
    /// array's only thread): replies the socket cannot take go to the writer thread, in
    /// order, whole; small and large payloads mixed, so some are cut mid-reply.
    #[test]
    fn completing_thread_never_blocks_and_framing_survives_backlog() {
        let (server, mut client) = UnixStream::pair().unwrap();
        let (replies, released) = counting_replies(server, false);
        let sizes = |i: u64| if i % 7 == 0 { 200_000 } else { 4096 };
        let count = 600u64; // ~20 MB: far more than a socket buffer
        let start = Instant::now();
        let mut budget = 0;
        for i in 0..count {
            let data = vec![(i % 251) as u8; sizes(i)];
            budget += data.len();
            let mut round = CompletionRound::default();
            replies.pending(i, data.len()).reply(ReplyBody::Read { offset_bytes: 0, data }, &mut round);
            round.end();
        }
        assert!(start.elapsed() < Duration::from_secs(5), "replying blocked on a client that does not read");
        let writer = spawn_writer(&replies);
        for i in 0..count {
            let (handle, error, data) = read_reply(&mut client, sizes(i));
            assert_eq!((handle, error), (i, 0));
            assert!(data.iter().all(|&b| b == (i % 251) as u8), "reply {i} payload mixed up");
        }
        replies.reader_done();
        writer.join().unwrap();
        assert_eq!(released.load(Ordering::SeqCst), budget);
    }

    /// A completion the device drops without calling it still answers (EIO), and the
    /// writer thread still ends.
    #[test]
    fn dropped_request_answers_eio() {
        let (server, mut client) = UnixStream::pair().unwrap();
        let (replies, _) = counting_replies(server, false);
        let writer = spawn_writer(&replies);
        drop(replies.pending(42, 0));
        assert_eq!(read_reply(&mut client, 0), (42, EIO, vec![]));
        replies.reader_done();
        writer.join().unwrap();
    }

    /// Replies made in a round wait for its end and then all go out; the writer thread does
    /// not end (closing the connection) while some are held back.
    #[test]
    fn batched_replies_go_out_at_flush_and_keep_the_connection_open() {
        let (server, mut client) = UnixStream::pair().unwrap();
        let (replies, released) = counting_replies(server, true);
        let writer = spawn_writer(&replies);
        let pending: Vec<Pending> = (0..3).map(|i| replies.pending(i, 4096)).collect();
        let (replied_tx, replied) = std::sync::mpsc::channel();
        let batcher = std::thread::spawn({
            let replies = Arc::clone(&replies);
            move || {
                let mut round = CompletionRound::default();
                for (i, p) in pending.into_iter().enumerate() {
                    p.reply(ReplyBody::Read { offset_bytes: 0, data: vec![i as u8; 4096] }, &mut round);
                }
                replies.reader_done();
                replied_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                let held = !writer.is_finished();
                round.end();
                writer.join().unwrap();
                held
            }
        });
        replied.recv().unwrap();
        client.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let early = client.read(&mut b);
        assert!(
            matches!(&early, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "a held-back reply reached the client before the flush: {early:?}"
        );
        client.set_nonblocking(false).unwrap();
        for i in 0..3u64 {
            assert_eq!(read_reply(&mut client, 4096), (i, 0, vec![i as u8; 4096]));
        }
        assert!(batcher.join().unwrap(), "the writer thread ended while replies were held back");
        // One release per reply (the budget counts requests as well as bytes).
        assert_eq!(released.load(Ordering::SeqCst), 3 * 4097);
    }
}
