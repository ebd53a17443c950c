//! A small NBD client for array members that are NBD exports (`nbd://host:port/export`,
//! `nbd+unix:///export?socket=PATH`): the fixed-newstyle handshake with `NBD_OPT_GO`, then
//! READ, WRITE and FLUSH with many requests in flight on one connection, replies matched to
//! requests by handle. Simple replies only (no structured replies, no block status): a
//! member needs nothing more, and every NBD server offers it.
//!
//! Written on this crate's protocol constants rather than libnbd's bindings: the member data
//! path stays in Rust with no C library, and the handshake is a few dozen lines.
//!
//! Threads: a writer sends queued requests (so a server that stops reading never blocks the
//! caller, which is the array's I/O thread), a reader matches replies. When the connection
//! drops, or the server breaks the protocol, every request in flight and every later one
//! fails with [`ClientError::Disconnected`].

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::codec::{encode_request_header, RequestHeader};
use crate::proto::*;
use crate::server::Stream;

/// Where an NBD URI points.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// A parsed NBD URI (the subset of the NBD URI spec a member needs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NbdUri {
    pub target: Target,
    pub export: String,
}

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// Whether `s` is meant as an NBD URI (whether or not it is a valid one).
pub fn is_nbd_uri(s: &str) -> bool {
    s.starts_with("nbd://") || s.starts_with("nbd+unix://")
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| format!("bad escape in {s:?}"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad escape %{hex} in {s:?}"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

impl NbdUri {
    /// Parses `nbd://host[:port][/export]` or `nbd+unix:///[export]?socket=PATH`.
    pub fn parse(s: &str) -> Result<NbdUri, String> {
        let bad = |why: &str| {
            format!("{s}: {why} (expected nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)")
        };
        if let Some(rest) = s.strip_prefix("nbd+unix://") {
            let (path, query) = rest.split_once('?').ok_or_else(|| bad("no ?socket= given"))?;
            let export = path.strip_prefix('/').unwrap_or(path);
            let socket = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .ok_or_else(|| bad("no socket= in the query"))?;
            if socket.is_empty() {
                return Err(bad("socket= is empty"));
            }
            return Ok(NbdUri {
                target: Target::Unix(PathBuf::from(percent_decode(socket).map_err(|e| bad(&e))?)),
                export: percent_decode(export).map_err(|e| bad(&e))?,
            });
        }
        let rest = s.strip_prefix("nbd://").ok_or_else(|| bad("not an NBD URI"))?;
        if rest.contains('?') {
            return Err(bad("query parameters are not supported on nbd://"));
        }
        let (authority, export) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed [ in the host"))?;
            (h.to_string(), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| bad(&format!("bad port {p:?}")))?,
            None => DEFAULT_PORT,
        };
        Ok(NbdUri {
            target: Target::Tcp { host, port },
            export: percent_decode(export).map_err(|e| bad(&e))?,
        })
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target {
            Target::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{}", self.export)
            }
            Target::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", self.export),
            Target::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientError {
    /// The server answered with this NBD error number (`proto::EIO` and so on).
    Server(u32),
    /// The connection is gone (dropped, or the server broke the protocol): why.
    Disconnected(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Server(e) => write!(f, "the server answered error {e}"),
            ClientError::Disconnected(why) => write!(f, "connection lost: {why}"),
        }
    }
}

/// Why a connection could not be made; the message says what to do.
#[derive(Debug)]
pub struct ConnectError(pub String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConnectError {}

/// One request's outcome: a read's bytes, or nothing for a write or flush.
pub type Done = Box<dyn FnOnce(Result<Vec<u8>, ClientError>) + Send>;

/// What a request sends.
pub enum Op {
    Read {
        len_bytes: u32,
    },
    /// The payload, owned until it is sent.
    Write(Box<dyn AsRef<[u8]> + Send>),
    Flush,
}

struct Pending {
    /// A read's length (its payload follows the reply header); 0 for others.
    read_len: usize,
    done: Done,
}

#[derive(Default)]
struct State {
    next_handle: u64,
    pending: HashMap<u64, Pending>,
    /// Set once the connection is unusable: why.
    dead: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    /// Kept to shut the socket down (which ends both threads).
    stream: Stream,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the connection dead and fails everything in flight.
    fn fail_all(&self, why: String) {
        let pending: Vec<Pending> = {
            let mut st = self.lock();
            st.dead.get_or_insert(why.clone());
            st.pending.drain().map(|(_, p)| p).collect()
        };
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        for p in pending {
            (p.done)(Err(ClientError::Disconnected(why.clone())));
        }
    }
}

struct Frame {
    header: Vec<u8>,
    payload: Option<Box<dyn AsRef<[u8]> + Send>>,
}

/// An open connection to one export, in the transmission phase.
pub struct Connection {
    uri: NbdUri,
    size_bytes: u64,
    transmission_flags: u16,
    shared: Arc<Shared>,
    /// `None` once closing.
    tx: Mutex<Option<mpsc::Sender<Frame>>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connection({}, {} bytes)", self.uri, self.size_bytes)
    }
}

fn read_exact_or(s: &mut Stream, buf: &mut [u8], what: &str) -> Result<(), String> {
    s.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => format!("the server closed the connection during {what}"),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("the server did not answer during {what} (timed out)")
        }
        _ => format!("{what}: {e}"),
    })
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap_or_default())
}
fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap_or_default())
}

/// The option-reply error's words for a person.
fn option_error_words(rep: u32) -> &'static str {
    match rep {
        REP_ERR_UNKNOWN => "the server has no export of that name",
        REP_ERR_UNSUP => "the server does not support NBD_OPT_GO (too old)",
        REP_ERR_POLICY => "the server refused by policy",
        REP_ERR_TLS_REQD => "the server requires TLS, which member connections do not offer",
        REP_ERR_SHUTDOWN => "the server is shutting down",
        REP_ERR_INVALID => "the server found the request invalid",
        REP_ERR_PLATFORM => "the server cannot do this on its platform",
        REP_ERR_BLOCK_SIZE_REQD => "the server requires block-size negotiation",
        _ => "the server refused",
    }
}

/// The fixed-newstyle handshake up to `NBD_OPT_GO`'s ACK: the export's size and flags.
fn handshake(s: &mut Stream, export: &str) -> Result<(u64, u16), String> {
    let mut greeting = [0u8; GREETING_BYTES];
    read_exact_or(s, &mut greeting, "the greeting")?;
    if be_u64(&greeting[0..]) != NBDMAGIC {
        return Err("not an NBD server (wrong greeting magic)".into());
    }
    if be_u64(&greeting[8..]) != IHAVEOPT {
        return Err("the server speaks the old-style handshake, which has no export names; \
                    run it in newstyle mode"
            .into());
    }
    let server_flags = be_u16(&greeting[16..]);
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err("the server does not offer the fixed-newstyle handshake".into());
    }
    let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
    let mut client_flags = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        client_flags |= FLAG_C_NO_ZEROES;
    }
    if export.len() > MAX_STRING_BYTES {
        return Err("the export name is longer than 4096 bytes".into());
    }
    let mut out = Vec::with_capacity(64 + export.len());
    out.extend_from_slice(&client_flags.to_be_bytes());
    // NBD_OPT_GO: the name, and no information requests (INFO_EXPORT always comes).
    let data_len = 4 + export.len() + 2;
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&OPT_GO.to_be_bytes());
    out.extend_from_slice(&(data_len as u32).to_be_bytes());
    out.extend_from_slice(&(export.len() as u32).to_be_bytes());
    out.extend_from_slice(export.as_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    s.write_all(&out).map_err(|e| format!("sending the handshake: {e}"))?;
    let mut export_info: Option<(u64, u16)> = None;
    loop {
        let mut h = [0u8; 20];
        read_exact_or(s, &mut h, "option negotiation")?;
        if be_u64(&h[0..]) != OPTION_REPLY_MAGIC {
            return Err("the server sent a malformed option reply".into());
        }
        let (rep, len) = (be_u32(&h[12..]), be_u32(&h[16..]) as usize);
        if len > 64 * 1024 {
            return Err("the server sent an oversized option reply".into());
        }
        let mut data = vec![0u8; len];
        read_exact_or(s, &mut data, "option negotiation")?;
        match rep {
            REP_ACK => break,
            REP_INFO if len >= 12 && be_u16(&data) == INFO_EXPORT => {
                export_info = Some((be_u64(&data[2..]), be_u16(&data[10..])));
            }
            REP_INFO => {}
            r if r & REP_FLAG_ERROR != 0 => {
                let msg = String::from_utf8_lossy(&data);
                let msg = msg.trim();
                let detail = if msg.is_empty() { String::new() } else { format!(" ({msg})") };
                return Err(format!("{}{detail}", option_error_words(r)));
            }
            _ => return Err(format!("the server sent an unexpected option reply {rep}")),
        }
    }
    let (size, flags) = export_info.ok_or("the server sent no export information before its ACK")?;
    // No zero padding after NBD_OPT_GO: that belongs to NBD_OPT_EXPORT_NAME only.
    Ok((size, flags))
}

/// An I/O error in words, without Rust's " (os error N)".
fn words(e: &io::Error) -> String {
    let t = e.to_string();
    match t.rfind(" (os error ") {
        Some(at) => t[..at].to_string(),
        None => t,
    }
}

fn connect_stream(uri: &NbdUri, timeout: Duration) -> Result<Stream, String> {
    match &uri.target {
        Target::Unix(p) => UnixStream::connect(p)
            .map(Stream::Unix)
            .map_err(|e| format!("cannot connect to {}: {}", p.display(), words(&e))),
        Target::Tcp { host, port } => {
            let addrs = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve {host}: {}", words(&e)))?;
            let mut last = format!("{host} resolves to no address");
            for a in addrs {
                match TcpStream::connect_timeout(&a, timeout) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = format!("cannot connect to {a}: {}", words(&e)),
                }
            }
            Err(last)
        }
    }
}

impl Connection {
    /// Connects and negotiates; `writable` refuses a read-only export.
    pub fn connect(uri: &NbdUri, writable: bool, timeout: Duration) -> Result<Connection, ConnectError> {
        let fail = |why: String, hint: &str| ConnectError(format!("{uri}: {why}{hint}"));
        let mut stream = connect_stream(uri, timeout)
            .map_err(|e| fail(e, " (is the NBD server running and listening there?)"))?;
        stream.set_read_timeout(Some(timeout)).map_err(|e| fail(e.to_string(), ""))?;
        stream.set_write_timeout(Some(timeout)).map_err(|e| fail(e.to_string(), ""))?;
        let (size_bytes, transmission_flags) = handshake(&mut stream, &uri.export).map_err(|e| {
            let hint = if e.contains("no export of that name") {
                " (check the export name after the host; `nbdinfo --list` shows the server's exports)"
            } else {
                ""
            };
            fail(e, hint)
        })?;
        if writable && transmission_flags & FLAG_READ_ONLY != 0 {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return Err(fail(
                "the export is read-only".into(),
                " (a member must be writable: start the server without its read-only option, e.g. nbdkit without -r)",
            ));
        }
        // Transmission: requests wait as long as they must; the executor's deadlines decide
        // when a member is too slow.
        stream.set_read_timeout(None).map_err(|e| fail(e.to_string(), ""))?;
        stream.set_write_timeout(None).map_err(|e| fail(e.to_string(), ""))?;
        let reader = stream.try_clone().map_err(|e| fail(e.to_string(), ""))?;
        let writer = stream.try_clone().map_err(|e| fail(e.to_string(), ""))?;
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), stream });
        let (tx, rx) = mpsc::channel::<Frame>();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn(f).map_err(|e| fail(e.to_string(), ""))
        };
        let (s1, s2) = (shared.clone(), shared.clone());
        spawn("nbd-member-tx".into(), Box::new(move || write_loop(writer, rx, s1)))?;
        spawn("nbd-member-rx".into(), Box::new(move || read_loop(reader, s2)))?;
        Ok(Connection { uri: uri.clone(), size_bytes, transmission_flags, shared, tx: Mutex::new(Some(tx)) })
    }

    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    pub fn read_only(&self) -> bool {
        self.transmission_flags & FLAG_READ_ONLY != 0
    }
    /// Why the connection is unusable, once it is.
    pub fn dead(&self) -> Option<String> {
        self.shared.lock().dead.clone()
    }

    /// Sends one request; `done` runs once, on another thread (or on this one at once when
    /// the connection is already gone).
    pub fn submit(&self, op: Op, offset_bytes: u64, done: Done) {
        let (command, len_bytes, read_len, payload) = match op {
            Op::Read { len_bytes } => (CMD_READ, len_bytes, len_bytes as usize, None),
            Op::Write(data) => {
                let len = (*data).as_ref().len() as u32;
                (CMD_WRITE, len, 0, Some(data))
            }
            // Without FLAG_SEND_FLUSH the server writes through: nothing to flush.
            Op::Flush if self.transmission_flags & FLAG_SEND_FLUSH == 0 => return done(Ok(Vec::new())),
            Op::Flush => (CMD_FLUSH, 0, 0, None),
        };
        let handle = {
            let mut st = self.shared.lock();
            if let Some(why) = &st.dead {
                let why = why.clone();
                drop(st);
                return done(Err(ClientError::Disconnected(why)));
            }
            let h = st.next_handle;
            st.next_handle = st.next_handle.wrapping_add(1);
            // Registered before it is sent: the reply may come back at once.
            st.pending.insert(h, Pending { read_len, done });
            h
        };
        let mut header = Vec::with_capacity(REQUEST_HEADER_BYTES);
        encode_request_header(
            &mut header,
            &RequestHeader { flags: 0, command, handle, offset_bytes, len_bytes },
        );
        let sent = match &*self.tx.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(tx) => tx.send(Frame { header, payload }).is_ok(),
            None => false,
        };
        if !sent {
            self.shared.fail_all("the connection is closing".into());
        }
    }

    fn wait(&self, op: Op, offset_bytes: u64) -> io::Result<Vec<u8>> {
        let (tx, rx) = mpsc::channel();
        self.submit(op, offset_bytes, Box::new(move |r| drop(tx.send(r))));
        match rx.recv() {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(ClientError::Server(e))) => Err(io::Error::from_raw_os_error(e as i32)),
            Ok(Err(e)) => Err(io::Error::new(io::ErrorKind::BrokenPipe, e.to_string())),
            Err(_) => Err(io::Error::new(io::ErrorKind::BrokenPipe, "connection lost")),
        }
    }

    /// Reads `len` bytes at `offset_bytes`, waiting for the answer.
    pub fn read_at(&self, offset_bytes: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        // Pieces of at most 16 MiB: under every server's payload limit.
        const PIECE: usize = 16 << 20;
        while out.len() < len {
            let n = (len - out.len()).min(PIECE);
            out.extend(self.wait(Op::Read { len_bytes: n as u32 }, offset_bytes + out.len() as u64)?);
        }
        Ok(out)
    }

    /// Writes `data` at `offset_bytes`, waiting for the answer.
    pub fn write_at(&self, offset_bytes: u64, data: &[u8]) -> io::Result<()> {
        for (i, piece) in data.chunks(16 << 20).enumerate() {
            let at = offset_bytes + (i as u64) * (16 << 20);
            self.wait(Op::Write(Box::new(piece.to_vec())), at)?;
        }
        Ok(())
    }

    pub fn flush(&self) -> io::Result<()> {
        self.wait(Op::Flush, 0).map(drop)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // NBD_CMD_DISC, then close: the server may then end the connection cleanly.
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(tx) = tx {
            let mut header = Vec::with_capacity(REQUEST_HEADER_BYTES);
            let h = RequestHeader {
                flags: 0,
                command: CMD_DISC,
                handle: u64::MAX,
                offset_bytes: 0,
                len_bytes: 0,
            };
            encode_request_header(&mut header, &h);
            let _ = tx.send(Frame { header, payload: None });
        }
    }
}

fn write_loop(mut s: Stream, rx: mpsc::Receiver<Frame>, shared: Arc<Shared>) {
    while let Ok(f) = rx.recv() {
        let is_disc = f.header.get(6..8) == Some(&CMD_DISC.to_be_bytes()[..]);
        let r = s.write_all(&f.header).and_then(|()| match &f.payload {
            Some(p) => s.write_all((**p).as_ref()),
            None => Ok(()),
        });
        if let Err(e) = r {
            shared.fail_all(format!("sending a request: {e}"));
            return;
        }
        if is_disc {
            break;
        }
    }
    // The connection was dropped: nothing more will be asked.
    shared.fail_all("the member connection was closed".into());
}

fn read_loop(mut s: Stream, shared: Arc<Shared>) {
    let why = loop {
        let mut h = [0u8; SIMPLE_REPLY_HEADER_BYTES];
        if let Err(e) = s.read_exact(&mut h) {
            break match e.kind() {
                io::ErrorKind::UnexpectedEof => "the server closed the connection".to_string(),
                _ => format!("reading a reply: {e}"),
            };
        }
        let magic = be_u32(&h);
        if magic != SIMPLE_REPLY_MAGIC {
            break format!("the server sent a reply with magic {magic:#010x} (not a simple reply)");
        }
        let (errno, handle) = (be_u32(&h[4..]), be_u64(&h[8..]));
        let Some(p) = shared.lock().pending.remove(&handle) else {
            break format!("the server answered handle {handle}, which is not in flight");
        };
        let result = if errno != 0 {
            Err(ClientError::Server(errno))
        } else if p.read_len > 0 {
            let mut data = vec![0u8; p.read_len];
            if let Err(e) = s.read_exact(&mut data) {
                let why = format!("reading a reply's data: {e}");
                (p.done)(Err(ClientError::Disconnected(why.clone())));
                break why;
            }
            Ok(data)
        } else {
            Ok(Vec::new())
        };
        (p.done)(result);
    };
    shared.fail_all(why);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_uri_forms() {
        let u = NbdUri::parse("nbd://127.0.0.1:10900/disk1").unwrap();
        assert_eq!(u.target, Target::Tcp { host: "127.0.0.1".into(), port: 10900 });
        assert_eq!(u.export, "disk1");
        let u = NbdUri::parse("nbd://host").unwrap();
        assert_eq!(u.target, Target::Tcp { host: "host".into(), port: DEFAULT_PORT });
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://[::1]:99/a%20b").unwrap();
        assert_eq!(u.target, Target::Tcp { host: "::1".into(), port: 99 });
        assert_eq!(u.export, "a b");
        let u = NbdUri::parse("nbd+unix:///exp?socket=/tmp/s.sock").unwrap();
        assert_eq!(u.target, Target::Unix("/tmp/s.sock".into()));
        assert_eq!(u.export, "exp");
        assert_eq!(u.to_string(), "nbd+unix:///exp?socket=/tmp/s.sock");
        for bad in ["nbd://", "nbd://h:port/x", "nbd+unix:///x", "nbd+unix:///x?socket=", "file:///x"] {
            assert!(NbdUri::parse(bad).is_err(), "{bad} parsed");
        }
    }

    /// Against this crate's own server: many requests in flight, handles matched, errors
    /// of the handshake in words, and a dropped server failing what is in flight.
    #[test]
    fn talks_to_the_server() {
        use crate::{Export, MemDevice, Server, ServerOptions};
        let dir = std::env::temp_dir().join(format!("uraid-nbd-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let mut ro = Export::new("ro", Arc::new(MemDevice::new(1 << 20)));
        ro.read_only = true;
        let exports = vec![Export::new("m", Arc::new(MemDevice::new(4 << 20))), ro];
        let server = Server::new(exports, ServerOptions::default()).unwrap();
        let stop = server.shutdown_handle();
        let t = std::thread::spawn(move || server.serve_unix(listener));
        let uri = |e: &str| NbdUri::parse(&format!("nbd+unix:///{e}?socket={}", sock.display())).unwrap();
        let c = Connection::connect(&uri("m"), true, Duration::from_secs(5)).unwrap();
        assert_eq!(c.size_bytes(), 4 << 20);
        let (tx, rx) = mpsc::channel();
        for i in 0..64u64 {
            let tx = tx.clone();
            let data = vec![i as u8; 4096];
            c.submit(Op::Write(Box::new(data)), i * 4096, Box::new(move |r| tx.send(r).unwrap()));
        }
        for _ in 0..64 {
            rx.recv().unwrap().unwrap();
        }
        c.flush().unwrap();
        for i in (0..64u64).rev() {
            assert_eq!(c.read_at(i * 4096, 4096).unwrap(), vec![i as u8; 4096]);
        }
        let e = Connection::connect(&uri("nope"), true, Duration::from_secs(5)).unwrap_err();
        assert!(e.0.contains("no export of that name"), "{e}");
        let e = Connection::connect(&uri("ro"), true, Duration::from_secs(5)).unwrap_err();
        assert!(e.0.contains("read-only"), "{e}");
        assert!(Connection::connect(&uri("ro"), false, Duration::from_secs(5)).is_ok());
        stop.shutdown();
        drop(c);
        t.join().unwrap().unwrap();
        let e = Connection::connect(&uri("m"), true, Duration::from_secs(5)).unwrap_err();
        assert!(e.0.contains("is the NBD server running"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
