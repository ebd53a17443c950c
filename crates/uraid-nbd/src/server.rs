//! The NBD server loop over TCP or Unix sockets, with std threads.
//!
//! Per connection: one thread reads and validates requests and submits them to the
//! device; replies go out in completion order (NBD allows out-of-order replies), written
//! by the thread that completes the request when the socket takes them at once, by the
//! connection's writer thread otherwise (see `reply`). A per-connection budget of requests
//! and bytes in flight bounds memory: when it is used up the reader stops reading the
//! socket, so TCP flow control pushes back on the client.
//!
//! A client that starts TLS (`NBD_OPT_STARTTLS`, see `tls`) goes on over one end of a
//! socket pair whose other end a relay thread joins to the TLS session: everything here
//! then runs as for a Unix-socket client, and plaintext connections are left as they were.

use crate::codec::{
    check_request, decode_request_header, Command, Decision, ExportInfo, Negotiation, NegotiationOutcome,
    Session, TlsPolicy, TransmissionContext,
};
use crate::device::{BlockDevice, BlockError, BlockRequest};
use crate::proto::*;
use crate::reply::{Pending, Replies, ReplyBody};
use crate::tls::TlsCredentials;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;
use uraid_core::CompletionRound;

/// One exported device.
#[derive(Clone)]
pub struct Export {
    /// Name clients ask for; the first export is also the default (empty name).
    pub name: String,
    pub description: String,
    pub device: Arc<dyn BlockDevice>,
    /// Serve read-only even if the device is writable.
    pub read_only: bool,
}

impl Export {
    pub fn new(name: impl Into<String>, device: Arc<dyn BlockDevice>) -> Self {
        Export { name: name.into(), description: String::new(), device, read_only: false }
    }

    /// Transmission flags that hold for this export (without `SEND_DF`, which depends
    /// on the session).
    pub fn transmission_flags(&self) -> u16 {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_CACHE;
        if self.read_only || self.device.read_only() {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        }
        if self.device.multi_conn_consistent() {
            flags |= FLAG_CAN_MULTI_CONN;
        }
        flags
    }

    fn info(&self) -> ExportInfo {
        ExportInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            size_bytes: self.device.size_bytes(),
            transmission_flags: self.transmission_flags(),
            block_size: self.device.block_size(),
        }
    }
}

/// Limits and timeouts of the server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Connections beyond this are closed right after accept.
    pub max_connections: usize,
    /// Requests read but not yet answered, per connection.
    pub max_in_flight_requests: usize,
    /// Payload and read-reply bytes held, per connection. One request larger than this
    /// (up to the max block size) is still admitted when nothing else is in flight.
    pub max_in_flight_bytes: usize,
    /// A client that has not finished the handshake in this time is disconnected.
    pub handshake_timeout: Option<Duration>,
    /// A client that does not read its replies for this long is disconnected.
    pub write_timeout: Option<Duration>,
    /// Whether clients may (`On`) or must (`Require`) start TLS; anything but `Off` needs
    /// `tls_credentials`.
    pub tls: TlsPolicy,
    pub tls_credentials: Option<Arc<TlsCredentials>>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_connections: 64,
            max_in_flight_requests: 64,
            max_in_flight_bytes: 64 * 1024 * 1024,
            handshake_timeout: Some(Duration::from_secs(30)),
            write_timeout: Some(Duration::from_secs(60)),
            tls: TlsPolicy::Off,
            tls_credentials: None,
        }
    }
}

/// A configuration the server refuses to start with.
#[derive(Debug)]
pub enum ConfigError {
    NoExports,
    DuplicateName(String),
    BadBlockSize(String),
    /// TLS offered or required with no credentials to run it.
    TlsWithoutCredentials,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::NoExports => f.write_str("no exports"),
            ConfigError::DuplicateName(n) => write!(f, "export name {n:?} used twice"),
            ConfigError::BadBlockSize(n) => write!(f, "export {n:?} has invalid block-size constraints"),
            ConfigError::TlsWithoutCredentials => {
                f.write_str("TLS is on but no certificate or PSK was given")
            }
        }
    }
}
impl std::error::Error for ConfigError {}

struct Shared {
    exports: Vec<Export>,
    /// The exports as they were at start (block sizes); the size each connection is
    /// told is read at its handshake.
    infos: Vec<ExportInfo>,
    opts: ServerOptions,
    shutting_down: AtomicBool,
    /// Read halves of live connections, so shutdown can wake blocked readers.
    connections: Mutex<HashMap<u64, Stream>>,
    next_connection_id: AtomicU64,
    active_connections: AtomicUsize,
    accept_threads: Mutex<Vec<thread::Thread>>,
}

/// An NBD server: a set of exports and options. Serve it on one or more listeners.
pub struct Server {
    shared: Arc<Shared>,
}

/// Stops a running server: no more accepts, new requests get `ESHUTDOWN`, in-flight
/// requests finish and are answered, then `serve_*` returns. Cheap to clone; safe to call
/// from a signal-handling thread.
#[derive(Clone)]
pub struct ShutdownHandle {
    shared: Arc<Shared>,
}

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        for t in self.shared.accept_threads.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            t.unpark();
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Ordering::SeqCst)
    }

    /// Connections currently open (handshaking or transmitting).
    pub fn active_connections(&self) -> usize {
        self.shared.active_connections.load(Ordering::SeqCst)
    }
}

/// Serves `exports` on a TCP listener until shut down through `Server::shutdown_handle`;
/// a convenience for `Server::new(..)?.serve_tcp(..)` when no handle is needed.
pub fn serve_tcp(listener: TcpListener, exports: Vec<Export>, opts: ServerOptions) -> io::Result<()> {
    Server::new(exports, opts).map_err(io::Error::other)?.serve_tcp(listener)
}

/// Like [`serve_tcp`] on a Unix-domain socket.
pub fn serve_unix(listener: UnixListener, exports: Vec<Export>, opts: ServerOptions) -> io::Result<()> {
    Server::new(exports, opts).map_err(io::Error::other)?.serve_unix(listener)
}

const ACCEPT_POLL: Duration = Duration::from_millis(50);
const READ_BUFFER_BYTES: usize = 256 * 1024;
const DISCARD_CHUNK_BYTES: usize = 64 * 1024;

impl Server {
    pub fn new(exports: Vec<Export>, opts: ServerOptions) -> Result<Server, ConfigError> {
        if exports.is_empty() {
            return Err(ConfigError::NoExports);
        }
        for (i, e) in exports.iter().enumerate() {
            if exports[..i].iter().any(|o| o.name == e.name) {
                return Err(ConfigError::DuplicateName(e.name.clone()));
            }
            if !e.device.block_size().is_valid() {
                return Err(ConfigError::BadBlockSize(e.name.clone()));
            }
        }
        if opts.tls != TlsPolicy::Off && opts.tls_credentials.is_none() {
            return Err(ConfigError::TlsWithoutCredentials);
        }
        let infos = exports.iter().map(Export::info).collect();
        Ok(Server {
            shared: Arc::new(Shared {
                exports,
                infos,
                opts,
                shutting_down: AtomicBool::new(false),
                connections: Mutex::new(HashMap::new()),
                next_connection_id: AtomicU64::new(0),
                active_connections: AtomicUsize::new(0),
                accept_threads: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle { shared: Arc::clone(&self.shared) }
    }

    /// Accepts and serves clients until shutdown; returns once every connection closed.
    pub fn serve_tcp(&self, listener: TcpListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        self.serve(|| {
            let (s, _) = listener.accept()?;
            s.set_nonblocking(false)?;
            // Replies are flushed explicitly when the queue runs dry; Nagle only adds latency.
            s.set_nodelay(true)?;
            Ok(Stream::Tcp(s))
        })
    }

    /// Accepts and serves clients until shutdown; returns once every connection closed.
    pub fn serve_unix(&self, listener: UnixListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        self.serve(|| {
            let (s, _) = listener.accept()?;
            s.set_nonblocking(false)?;
            Ok(Stream::Unix(s))
        })
    }

    fn serve(&self, mut accept: impl FnMut() -> io::Result<Stream>) -> io::Result<()> {
        let shared = &self.shared;
        shared.accept_threads.lock().unwrap_or_else(|e| e.into_inner()).push(thread::current());
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        while !shared.shutting_down.load(Ordering::SeqCst) {
            match accept() {
                Ok(stream) => {
                    threads.retain(|t| !t.is_finished());
                    if shared.active_connections.load(Ordering::SeqCst) >= shared.opts.max_connections {
                        let _ = stream.shutdown(Shutdown::Both);
                        continue;
                    }
                    if let Some(t) = self.spawn_connection(stream) {
                        threads.push(t);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::park_timeout(ACCEPT_POLL),
                // ECONNABORTED, EMFILE and friends are transient; back off and keep serving.
                Err(_) => thread::sleep(ACCEPT_POLL),
            }
        }
        for s in shared.connections.lock().unwrap_or_else(|e| e.into_inner()).values() {
            // Wakes readers blocked on the socket; replies can still be written.
            let _ = s.shutdown(Shutdown::Read);
        }
        for t in threads {
            let _ = t.join();
        }
        let me = thread::current().id();
        shared.accept_threads.lock().unwrap_or_else(|e| e.into_inner()).retain(|t| t.id() != me);
        Ok(())
    }

    fn spawn_connection(&self, stream: Stream) -> Option<JoinHandle<()>> {
        let shared = Arc::clone(&self.shared);
        let id = shared.next_connection_id.fetch_add(1, Ordering::SeqCst);
        let registered = stream.try_clone().ok()?;
        shared.connections.lock().unwrap_or_else(|e| e.into_inner()).insert(id, registered);
        shared.active_connections.fetch_add(1, Ordering::SeqCst);
        let spawned = thread::Builder::new().name(format!("nbd-conn-{id}")).spawn({
            let shared = Arc::clone(&shared);
            move || {
                let _ = serve_connection(&shared, stream);
                shared.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                shared.active_connections.fetch_sub(1, Ordering::SeqCst);
            }
        });
        match spawned {
            Ok(t) => Some(t),
            Err(_) => {
                if let Some(s) = shared.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
                    let _ = s.shutdown(Shutdown::Both);
                }
                shared.active_connections.fetch_sub(1, Ordering::SeqCst);
                None
            }
        }
    }
}

/// A connected socket of either family (the member client's too).
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn into_owned_fd(self) -> std::os::fd::OwnedFd {
        match self {
            Stream::Tcp(s) => s.into(),
            Stream::Unix(s) => s.into(),
        }
    }
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    /// What the socket holds now, without waiting (`WouldBlock` when it holds nothing).
    fn read_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: `buf` is valid for `buf.len()` bytes for the call's duration.
            let n =
                unsafe { libc::recv(self.raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Who is at the other end, for messages.
    fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "a client".into()),
            Stream::Unix(_) => "a client on the Unix socket".into(),
        }
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
}

/// The connection thread's round of completions. The thread runs requests itself when
/// the device lets it (the array runtime's submitter rounds) and holds back the replies it
/// makes until it is about to read the socket again: the replies to a burst of requests
/// go out in one `sendmsg`, which wakes the client once instead of once per reply (each
/// wake-up of the client preempts the connection thread; docs/performance.md, "Where
/// replies are sent from"). The round ends before any wait of this thread: reading the
/// socket ([`FlushingReader`]) and waiting for budget (`Budget::acquire`).
type ConnectionRound = Rc<RefCell<CompletionRound>>;

/// The transmission phase's socket reader: ends the connection's round before it reads,
/// and while the thread owes the device I/O only it can finish (see
/// [`BlockDevice::thread_owes_io`]), waits for its socket and that I/O together.
struct FlushingReader {
    stream: Stream,
    round: ConnectionRound,
    device: Arc<dyn BlockDevice>,
}

/// The longest a thread owing device I/O sleeps before it looks again.
const THREAD_IO_WAIT: Duration = Duration::from_millis(100);

impl Read for FlushingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut round = self.round.borrow_mut();
        round.end();
        while self.device.thread_owes_io() {
            let go = self.device.drive_thread_io(Some(self.stream.raw_fd()), THREAD_IO_WAIT, &mut round);
            round.end();
            if !go || !self.device.thread_owes_io() {
                continue;
            }
            // "Readable" may be stale: a poll armed before bytes this thread has read since
            // fires for them. A blocking read would then wait for a client that waits for
            // replies only this thread's ring can finish (docs/reliability.md, "Member
            // faults while running").
            match self.stream.read_now(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
        drop(round);
        self.stream.read(buf)
    }
}

impl std::os::fd::AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.raw_fd()
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The socket the negotiation and the transmission phase talk over: the client's, or after
/// STARTTLS our end of the socket pair to the TLS relay (`tls`).
struct Plain {
    reader: BufReader<Stream>,
    writer: Stream,
    relay: Option<JoinHandle<()>>,
}

fn serve_connection(shared: &Shared, stream: Stream) -> io::Result<()> {
    stream.set_read_timeout(shared.opts.handshake_timeout)?;
    stream.set_write_timeout(shared.opts.write_timeout)?;
    let reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream.try_clone()?);
    let mut plain = Plain { reader, writer: stream.try_clone()?, relay: None };
    let negotiated = handshake(shared, &mut plain, &stream);
    // Kept to close the plaintext side at the end: with TLS, that is what ends the relay.
    let ours = plain.writer.try_clone();
    let relay = plain.relay.take();
    let result = match negotiated {
        Ok(Some((session, leftover))) => {
            let Plain { reader, writer, .. } = plain;
            writer.set_read_timeout(None).and_then(|()| {
                // The handshake consumed everything the reader had buffered (it is in `leftover`).
                let round = ConnectionRound::default();
                let device = Arc::clone(&shared.exports[session.export_index].device);
                let flushing = FlushingReader { stream: reader.into_inner(), round: round.clone(), device };
                let reader = BufReader::with_capacity(READ_BUFFER_BYTES, flushing);
                transmission(shared, session, io::Cursor::new(leftover).chain(reader), writer, &round)
            })
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    if let Ok(ours) = ours {
        let _ = ours.shutdown(Shutdown::Both);
    }
    // The relay sends what the server wrote before it closes the client's socket.
    if let Some(relay) = relay {
        let _ = relay.join();
    }
    let _ = stream.shutdown(Shutdown::Both);
    result
}

/// Runs the handshake; returns the session and any bytes the client already sent past
/// the end of it, or `None` when the connection should just close. After STARTTLS,
/// `plain` talks to the TLS relay instead of `client`.
fn handshake(shared: &Shared, plain: &mut Plain, client: &Stream) -> io::Result<Option<(Session, Vec<u8>)>> {
    // Each connection is told the size as it is now (an array may have grown since the
    // server started; NBD has no resize notice, so a client reconnects to see it).
    let infos = shared.exports.iter().map(Export::info).collect();
    let mut negotiation = Negotiation::new(infos).with_tls(shared.opts.tls);
    plain.writer.write_all(&negotiation.take_output())?;
    let mut pending: Vec<u8> = Vec::new();
    loop {
        if shared.shutting_down.load(Ordering::SeqCst) {
            negotiation.set_shutting_down();
        }
        let available = plain.reader.fill_buf()?;
        if available.is_empty() {
            return Ok(None);
        }
        let n = available.len();
        pending.extend_from_slice(available);
        plain.reader.consume(n);
        while !pending.is_empty() {
            let progress = negotiation.receive(&pending);
            let output = negotiation.take_output();
            if !output.is_empty() {
                plain.writer.write_all(&output)?;
            }
            let Ok(p) = progress else { return Ok(None) };
            pending.drain(..p.consumed_bytes);
            match p.outcome {
                Some(NegotiationOutcome::Transmission(session)) => return Ok(Some((session, pending))),
                Some(NegotiationOutcome::Abort) => return Ok(None),
                Some(NegotiationOutcome::StartTls) => {
                    let Some(credentials) = &shared.opts.tls_credentials else { return Ok(None) };
                    // Bytes behind STARTTLS already read are the start of the TLS stream.
                    let early = std::mem::take(&mut pending);
                    let (ours, relay) = match crate::tls::start(
                        credentials,
                        client.try_clone()?,
                        early,
                        shared.opts.write_timeout,
                    ) {
                        Ok(started) => started,
                        Err(e) => {
                            // The operator's only clue why a client was turned away.
                            eprintln!("nbd: TLS handshake with {} failed: {e}", client.peer());
                            return Ok(None);
                        }
                    };
                    ours.set_read_timeout(shared.opts.handshake_timeout)?;
                    ours.set_write_timeout(shared.opts.write_timeout)?;
                    plain.reader =
                        BufReader::with_capacity(READ_BUFFER_BYTES, Stream::Unix(ours.try_clone()?));
                    plain.writer = Stream::Unix(ours);
                    plain.relay = Some(relay);
                    negotiation.tls_started();
                }
                None => break,
            }
        }
    }
}

/// How long a reader waiting for budget while it owes device I/O sleeps in its ring
/// before it looks at the budget again.
const BUDGET_WAIT_OWING: Duration = Duration::from_millis(5);

/// Counts requests and bytes in flight on one connection.
struct Budget {
    /// Requests, bytes, and whether the reader waits for room.
    state: Mutex<(usize, usize, bool)>,
    freed: Condvar,
    max_requests: usize,
    max_bytes: usize,
}

impl Budget {
    fn acquire(&self, bytes: usize, round: &ConnectionRound, device: &dyn BlockDevice) {
        let full = |st: &(usize, usize, bool)| {
            st.0 > 0 && (st.0 >= self.max_requests || st.1 + bytes > self.max_bytes)
        };
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if full(&st) {
            // Replies this thread holds back release budget: send them before waiting.
            drop(st);
            round.borrow_mut().end();
            st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        }
        while full(&st) && device.thread_owes_io() {
            // Requests only this thread can finish hold budget: finish them rather than
            // wait for a release that would never come. Budget another thread frees meanwhile
            // is seen within the bounded wait.
            drop(st);
            let mut r = round.borrow_mut();
            device.drive_thread_io(None, BUDGET_WAIT_OWING, &mut r);
            r.end();
            drop(r);
            st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        }
        while full(&st) {
            st.2 = true;
            st = self.freed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.0 += 1;
        st.1 += bytes;
    }
    fn release(&self, bytes: usize) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 = st.0.saturating_sub(1);
        st.1 = st.1.saturating_sub(bytes);
        // A notify is a futex syscall; one per reply only when the reader is waiting.
        if std::mem::take(&mut st.2) {
            self.freed.notify_all();
        }
    }
}

fn transmission(
    shared: &Shared,
    session: Session,
    mut reader: impl Read,
    writer: Stream,
    round: &ConnectionRound,
) -> io::Result<()> {
    let export = &shared.exports[session.export_index];
    let info = &shared.infos[session.export_index];
    let device = Arc::clone(&export.device);
    let ctx = TransmissionContext {
        size_bytes: session.size_bytes,
        transmission_flags: session.transmission_flags,
        structured_replies: session.structured_replies,
        block_size: info.block_size,
    };
    let budget = Arc::new(Budget {
        state: Mutex::new((0, 0, false)),
        freed: Condvar::new(),
        max_requests: shared.opts.max_in_flight_requests.max(1),
        max_bytes: shared.opts.max_in_flight_bytes.max(1),
    });
    let release = {
        let budget = Arc::clone(&budget);
        Box::new(move |bytes| budget.release(bytes))
    };
    let replies = Replies::new(writer.into_owned_fd(), session.structured_replies, release);
    let writer_thread = thread::Builder::new().name("nbd-reply".into()).spawn({
        let replies = Arc::clone(&replies);
        move || replies.run_writer()
    })?;

    let mut header = [0u8; REQUEST_HEADER_BYTES];
    let result = loop {
        if let Err(e) = reader.read_exact(&mut header) {
            break if e.kind() == io::ErrorKind::UnexpectedEof { Ok(()) } else { Err(e) };
        }
        let header = match decode_request_header(&header) {
            Some(Ok(h)) => h,
            // Bad magic: framing is lost, nothing sensible can follow.
            _ => break Ok(()),
        };
        let decision = if shared.shutting_down.load(Ordering::SeqCst) && header.command != CMD_DISC {
            let discard = if header.command == CMD_WRITE { header.len_bytes } else { 0 };
            Decision::Reject {
                errno: ESHUTDOWN,
                message: "server is shutting down",
                discard_payload_bytes: discard,
            }
        } else {
            check_request(&header, &ctx)
        };
        let command = match decision {
            Decision::Reject { errno, message, discard_payload_bytes } => {
                if let Err(e) = discard(&mut reader, discard_payload_bytes) {
                    break Err(e);
                }
                budget.acquire(0, round, &*device);
                let body = ReplyBody::Error { errno, message: Cow::Borrowed(message) };
                replies.pending(header.handle, 0).reply(body, &mut round.borrow_mut());
                continue;
            }
            Decision::Execute(Command::Disconnect) => break Ok(()),
            Decision::Execute(c) => c,
        };
        let handle = header.handle;
        let (request, budget_bytes, read_offset) = match command {
            Command::Read { offset_bytes, len_bytes } => {
                (BlockRequest::Read { offset_bytes, len_bytes }, len_bytes as usize, Some(offset_bytes))
            }
            Command::Write { offset_bytes, len_bytes, fua } => {
                // Take the budget before reading the payload: a full budget stops the
                // socket being read at all.
                budget.acquire(len_bytes as usize, round, &*device);
                let data = match read_payload(&mut reader, len_bytes as usize) {
                    Ok(d) => d,
                    Err(e) => {
                        budget.release(len_bytes as usize);
                        break if e.kind() == io::ErrorKind::UnexpectedEof { Ok(()) } else { Err(e) };
                    }
                };
                let request = BlockRequest::Write { offset_bytes, data, fua };
                let pending = replies.pending(handle, len_bytes as usize);
                submit(&*device, request, pending, None, &mut round.borrow_mut());
                continue;
            }
            Command::Flush => (BlockRequest::Flush, 0, None),
            Command::Trim { offset_bytes, len_bytes, fua } => {
                (BlockRequest::Trim { offset_bytes, len_bytes, fua }, 0, None)
            }
            Command::WriteZeroes { offset_bytes, len_bytes, fua, no_hole, fast_only } => (
                BlockRequest::WriteZeroes { offset_bytes, len_bytes, fua, may_trim: !no_hole, fast_only },
                0,
                None,
            ),
            Command::Cache { offset_bytes, len_bytes } => {
                (BlockRequest::Cache { offset_bytes, len_bytes }, 0, None)
            }
            Command::Disconnect => break Ok(()),
        };
        budget.acquire(budget_bytes, round, &*device);
        submit(
            &*device,
            request,
            replies.pending(handle, budget_bytes),
            read_offset,
            &mut round.borrow_mut(),
        );
    };
    // The writer ends once every submitted request has been answered, so joining it waits
    // for the device to finish what was submitted, part of which only this thread can
    // finish. Replies held on this thread go first.
    device.thread_done(&mut round.borrow_mut());
    round.borrow_mut().end();
    replies.reader_done();
    let _ = writer_thread.join();
    result
}

/// Reads and drops `len_bytes` of payload to keep the request framing.
fn discard(reader: &mut impl Read, len_bytes: u32) -> io::Result<()> {
    let mut scratch = [0u8; DISCARD_CHUNK_BYTES];
    let mut left = len_bytes as usize;
    while left > 0 {
        let n = left.min(scratch.len());
        reader.read_exact(&mut scratch[..n])?;
        left -= n;
    }
    Ok(())
}

/// A write's payload.
fn read_payload(reader: &mut impl Read, len_bytes: usize) -> io::Result<Vec<u8>> {
    // Zero-filled first: safe Rust cannot hand uninitialised memory to `Read`, and a
    // `read_to_end` on this chained reader would zero it too, in growing small reads.
    let mut data = vec![0u8; len_bytes];
    reader.read_exact(&mut data)?;
    Ok(data)
}

fn submit(
    device: &dyn BlockDevice,
    request: BlockRequest,
    pending: Pending,
    read_offset: Option<u64>,
    round: &mut CompletionRound,
) {
    let expected_len = match &request {
        BlockRequest::Read { len_bytes, .. } => *len_bytes as usize,
        _ => 0,
    };
    let advisory = matches!(request, BlockRequest::Trim { .. } | BlockRequest::Cache { .. });
    let empty = match &request {
        BlockRequest::Read { len_bytes, .. }
        | BlockRequest::Trim { len_bytes, .. }
        | BlockRequest::WriteZeroes { len_bytes, .. }
        | BlockRequest::Cache { len_bytes, .. } => *len_bytes == 0,
        BlockRequest::Write { data, .. } => data.is_empty(),
        BlockRequest::Flush => false,
    };
    let done = move |result: Result<Vec<u8>, BlockError>, round: &mut CompletionRound| {
        let body = match (result, read_offset) {
            (Ok(data), Some(offset_bytes)) if data.len() == expected_len => {
                ReplyBody::Read { offset_bytes, data }
            }
            (Ok(_), Some(_)) => {
                ReplyBody::Error { errno: EIO, message: Cow::Borrowed("device returned a short read") }
            }
            (Ok(_), None) => ReplyBody::Ok,
            // Trim and cache are hints; a device without them has still done its job.
            (Err(BlockError::NotSupported), None) if advisory => ReplyBody::Ok,
            (Err(e), _) => ReplyBody::Error { errno: e.errno(), message: Cow::Owned(e.to_string()) },
        };
        pending.reply(body, round);
    };
    if empty {
        // Zero-length requests are legal no-ops; the device never sees them.
        done(Ok(Vec::new()), round);
        return;
    }
    device.submit(request, Box::new(done), round);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{BlockRequest, Completion};
    use std::sync::atomic::AtomicBool;

    /// A device whose thread owes ring I/O until its third drive, and whose drives all say
    /// "readable" as a stale socket poll does; the I/O finishing at the third drive is what
    /// lets the client send its next request.
    struct StalePollDevice {
        client: Mutex<UnixStream>,
        drives: AtomicUsize,
        owes: AtomicBool,
    }

    impl BlockDevice for StalePollDevice {
        fn size_bytes(&self) -> u64 {
            0
        }
        fn read_only(&self) -> bool {
            true
        }
        fn multi_conn_consistent(&self) -> bool {
            true
        }
        fn submit(&self, _req: BlockRequest, _done: Completion, _round: &mut CompletionRound) {}
        fn thread_owes_io(&self) -> bool {
            self.owes.load(Ordering::SeqCst)
        }
        fn drive_thread_io(
            &self,
            _: Option<std::os::fd::RawFd>,
            _: Duration,
            _: &mut CompletionRound,
        ) -> bool {
            if self.drives.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                self.client.lock().unwrap().write_all(b"x").unwrap();
                self.owes.store(false, Ordering::SeqCst);
            }
            true
        }
    }

    #[test]
    fn a_stale_readable_never_puts_a_thread_owing_ring_io_to_sleep_on_its_socket() {
        let (ours, client) = UnixStream::pair().unwrap();
        // Without the guard, the read below waits for a byte the client sends only after
        // the owed I/O completes: this timeout turns that deadlock into a failure.
        ours.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let device = Arc::new(StalePollDevice {
            client: Mutex::new(client),
            drives: AtomicUsize::new(0),
            owes: AtomicBool::new(true),
        });
        let mut reader = FlushingReader {
            stream: Stream::Unix(ours),
            round: ConnectionRound::default(),
            device: device.clone(),
        };
        let mut buf = [0u8; 16];
        let n = reader.read(&mut buf).expect("the thread slept on its socket while it owed ring I/O");
        assert_eq!(&buf[..n], b"x");
        assert_eq!(device.drives.load(Ordering::SeqCst), 3);
    }
}
