//! NBD over TLS (`NBD_OPT_STARTTLS`) with OpenSSL: X.509 certificates from a directory laid
//! out as nbdkit and qemu expect it, or TLS-PSK keys in psktool's format.
//!
//! OpenSSL rather than rustls: rustls has no external pre-shared keys, which qemu's and
//! libnbd's `tls-creds-psk`/`tls-psk-file` need; one library serves both kinds.
//!
//! The data path writes replies with `sendmsg` on the socket's fd and polls that fd from
//! the connection rings (see `reply`), so it cannot run through a TLS library's stream.
//! After STARTTLS a relay thread runs the TLS session on the client's socket and pumps the
//! plaintext to one end of a socket pair; the negotiation and the transmission phase go on
//! over the other end exactly as for a client on a Unix socket. The cost is one local
//! socket hop each way per request, paid by TLS connections only.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use openssl::ssl::{ErrorCode, SslAcceptor, SslFiletype, SslMethod, SslStream, SslVerifyMode, SslVersion};
use openssl::x509::X509Name;

/// What the server proves itself with, loaded and checked once at start.
pub struct TlsCredentials {
    acceptor: SslAcceptor,
    description: String,
}

impl std::fmt::Debug for TlsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

/// Credentials that cannot be used, said with the file at fault.
#[derive(Debug)]
pub struct TlsCredentialsError(String);

impl std::fmt::Display for TlsCredentialsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for TlsCredentialsError {}

fn refuse<T>(message: String) -> Result<T, TlsCredentialsError> {
    Err(TlsCredentialsError(message))
}

/// The first line of an OpenSSL error stack, without its internal codes' noise.
fn ssl_words(e: &openssl::error::ErrorStack) -> String {
    e.errors()
        .first()
        .map(|x| x.reason().unwrap_or("unknown reason").to_string())
        .unwrap_or_else(|| e.to_string())
}

/// A file the credentials need, checked readable first so the message names it.
fn readable(dir: &Path, name: &str) -> Result<PathBuf, TlsCredentialsError> {
    let path = dir.join(name);
    match std::fs::File::open(&path) {
        Ok(_) => Ok(path),
        Err(e) => refuse(format!("cannot read {}: {}", path.display(), io_error_words(&e))),
    }
}

fn io_error_words(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "no such file".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Longest key taken from a PSK file: OpenSSL's smallest PSK_MAX_PSK_LEN across versions.
const MAX_PSK_BYTES: usize = 256;

impl TlsCredentials {
    /// X.509 from `dir`: `server-cert.pem` (the chain) and `server-key.pem`, and with
    /// `verify_peer` `ca-cert.pem`, the CA client certificates must be signed by (the names
    /// nbdkit and qemu's `tls-creds-x509` use).
    pub fn x509(dir: &Path, verify_peer: bool) -> Result<TlsCredentials, TlsCredentialsError> {
        if !dir.is_dir() {
            return refuse(format!("{} is not a directory", dir.display()));
        }
        let cert = readable(dir, "server-cert.pem")?;
        let key = readable(dir, "server-key.pem")?;
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| TlsCredentialsError(format!("OpenSSL: {}", ssl_words(&e))))?;
        b.set_certificate_chain_file(&cert)
            .or_else(|e| refuse(format!("{}: not a PEM certificate ({})", cert.display(), ssl_words(&e))))?;
        // OpenSSL checks the key against the certificate as it loads it.
        b.set_private_key_file(&key, SslFiletype::PEM).or_else(|e| match ssl_words(&e).as_str() {
            "key values mismatch" => {
                refuse(format!("{} is not the key of {}", key.display(), cert.display()))
            }
            why => refuse(format!("{}: not a PEM private key ({why})", key.display())),
        })?;
        b.check_private_key()
            .or_else(|_| refuse(format!("{} is not the key of {}", key.display(), cert.display())))?;
        if verify_peer {
            let ca = readable(dir, "ca-cert.pem")?;
            b.set_ca_file(&ca).or_else(|e| {
                refuse(format!("{}: not a PEM certificate ({})", ca.display(), ssl_words(&e)))
            })?;
            // Tells the client which CA to pick its certificate by.
            let names = X509Name::load_client_ca_file(&ca).or_else(|e| {
                refuse(format!("{}: not a PEM certificate ({})", ca.display(), ssl_words(&e)))
            })?;
            b.set_client_ca_list(names);
            b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        let peer = if verify_peer { ", client certificates checked against ca-cert.pem" } else { "" };
        Ok(TlsCredentials {
            acceptor: b.build(),
            description: format!("X.509 certificate from {}{peer}", dir.display()),
        })
    }

    /// TLS-PSK from `file`: `username:hexkey` lines as `psktool` writes them.
    pub fn psk(file: &Path) -> Result<TlsCredentials, TlsCredentialsError> {
        let text = match std::fs::read(file) {
            Ok(t) => t,
            Err(e) => return refuse(format!("cannot read {}: {}", file.display(), io_error_words(&e))),
        };
        let keys =
            parse_psk_file(&text).map_err(|e| TlsCredentialsError(format!("{}: {e}", file.display())))?;
        let users = keys.len();
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| TlsCredentialsError(format!("OpenSSL: {}", ssl_words(&e))))?;
        // No certificate: only the PSK key exchanges can succeed (TLS 1.3 derives its
        // suites' keys from the PSK; TLS 1.2 needs the PSK suites named).
        b.set_cipher_list("ECDHEPSK:DHEPSK:PSK:!eNULL:!SHA1")
            .or_else(|e| refuse(format!("OpenSSL has no TLS 1.2 PSK suites ({})", ssl_words(&e))))?;
        b.set_psk_server_callback(move |_ssl, identity, psk| {
            // Unknown user: 0 bytes fails the handshake.
            let Some(key) = identity.and_then(|id| keys.get(id)).filter(|k| k.len() <= psk.len()) else {
                return Ok(0);
            };
            psk[..key.len()].copy_from_slice(key);
            Ok(key.len())
        });
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .or_else(|e| refuse(format!("OpenSSL: {}", ssl_words(&e))))?;
        Ok(TlsCredentials {
            acceptor: b.build(),
            description: format!(
                "TLS-PSK, {users} user{} from {}",
                if users == 1 { "" } else { "s" },
                file.display()
            ),
        })
    }

    /// What the credentials are, for the start-up line.
    pub fn description(&self) -> &str {
        &self.description
    }
}

/// psktool's file: `username:hexkey` per line; blank lines are skipped.
fn parse_psk_file(text: &[u8]) -> Result<HashMap<Vec<u8>, Vec<u8>>, String> {
    let text = std::str::from_utf8(text).map_err(|_| "not text (psktool writes username:hexkey lines)")?;
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let n = i + 1;
        let Some((user, hex)) = line.split_once(':') else {
            return Err(format!("line {n} is not username:hexkey (psktool -p FILE -u NAME writes one)"));
        };
        if user.is_empty() {
            return Err(format!("line {n} has an empty username"));
        }
        let key = decode_hex(hex.trim())
            .ok_or_else(|| format!("line {n}: the key of {user:?} is not an even number of hex digits"))?;
        if key.is_empty() || key.len() > MAX_PSK_BYTES {
            return Err(format!("line {n}: the key of {user:?} must be 1 to {MAX_PSK_BYTES} bytes"));
        }
        if keys.insert(user.as_bytes().to_vec(), key).is_some() {
            return Err(format!("line {n}: {user:?} is given twice"));
        }
    }
    if keys.is_empty() {
        return Err("no keys (psktool -p FILE -u NAME adds one)".into());
    }
    Ok(keys)
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// The client's socket with the bytes already read from it in plaintext put back in front:
/// a client may send its TLS ClientHello right behind STARTTLS.
struct Prefixed<S> {
    early: io::Cursor<Vec<u8>>,
    inner: S,
}

impl<S: Read> Read for Prefixed<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if (self.early.position() as usize) < self.early.get_ref().len() {
            return self.early.read(buf);
        }
        self.inner.read(buf)
    }
}

impl<S: Write> Write for Prefixed<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A socket the relay can drive in non-blocking mode.
pub(crate) trait RelaySocket: Read + Write + AsRawFd + Send + 'static {}
impl<T: Read + Write + AsRawFd + Send + 'static> RelaySocket for T {}

/// Runs the TLS handshake on `socket` (blocking, within its timeouts), then starts the
/// relay. Returns the plaintext end of the pair and the relay thread, which ends once the
/// plaintext end is closed and what it sent is flushed, or the client is gone.
pub(crate) fn start<S: RelaySocket>(
    credentials: &TlsCredentials,
    socket: S,
    early: Vec<u8>,
    write_timeout: Option<Duration>,
) -> io::Result<(UnixStream, JoinHandle<()>)> {
    let prefixed = Prefixed { early: io::Cursor::new(early), inner: socket };
    let tls = credentials.acceptor.accept(prefixed).map_err(|e| {
        let why = match &e {
            openssl::ssl::HandshakeError::Failure(m) | openssl::ssl::HandshakeError::WouldBlock(m) => {
                let e = m.error();
                match (e.ssl_error(), e.io_error()) {
                    (Some(s), _) => ssl_words(s),
                    (None, Some(io)) => io.to_string(),
                    (None, None) => e.to_string(),
                }
            }
            openssl::ssl::HandshakeError::SetupFailure(s) => ssl_words(s),
        };
        io::Error::new(io::ErrorKind::ConnectionAborted, why)
    })?;
    let (ours, theirs) = UnixStream::pair()?;
    let relay = thread::Builder::new()
        .name("nbd-tls".into())
        .spawn(move || relay(tls, theirs, write_timeout.unwrap_or(Duration::MAX)))?;
    Ok((ours, relay))
}

/// Bytes buffered each way in the relay: a few TLS records (16 KiB each).
const RELAY_BUFFER_BYTES: usize = 256 * 1024;
/// The relay's longest sleep; it also bounds how late a stalled client is noticed.
const RELAY_POLL_MS: i32 = 1000;

/// Bytes waiting to go one way.
struct Pipe {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Pipe {
    fn new() -> Pipe {
        Pipe { buf: vec![0; RELAY_BUFFER_BYTES], start: 0, end: 0 }
    }
    fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
    fn room(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }
    fn filled(&mut self, n: usize) {
        self.end += n;
    }
    fn consumed(&mut self, n: usize) {
        self.start += n;
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor this thread owns for the call; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a socket call waits for before it can go on.
enum Want {
    Read,
    Write,
}

fn want(w: Want, events: &mut i16) {
    *events |= match w {
        Want::Read => libc::POLLIN,
        Want::Write => libc::POLLOUT,
    }
}

/// Pumps plaintext between the TLS session and `plain` until both directions are done.
fn relay<S: RelaySocket>(mut tls: SslStream<Prefixed<S>>, mut plain: UnixStream, write_timeout: Duration) {
    let tcp_fd = tls.get_ref().inner.as_raw_fd();
    if set_nonblocking(tcp_fd).is_err() || plain.set_nonblocking(true).is_err() {
        return;
    }
    let mut to_plain = Pipe::new();
    let mut to_tls = Pipe::new();
    let (mut tls_open, mut plain_open, mut plain_write_shut) = (true, true, false);
    // OpenSSL wants a retried write with the same length as the one that could not finish.
    let mut tls_write_len: Option<usize> = None;
    let mut last_sent = Instant::now();
    loop {
        let mut progress = false;
        let (mut tcp_events, mut plain_events) = (0i16, 0i16);
        // Client to server.
        if tls_open {
            let room = to_plain.room();
            if !room.is_empty() {
                match tls.ssl_read(room) {
                    // OpenSSL reports the end as an error; a 0 is taken as the end too.
                    Ok(0) => {
                        tls_open = false;
                        progress = true;
                    }
                    Ok(n) => {
                        to_plain.filled(n);
                        progress = true;
                    }
                    Err(e) => match e.code() {
                        ErrorCode::WANT_READ => want(Want::Read, &mut tcp_events),
                        ErrorCode::WANT_WRITE => want(Want::Write, &mut tcp_events),
                        // close_notify, or the socket closed (or shut by the server's stop).
                        _ => {
                            tls_open = false;
                            progress = true;
                        }
                    },
                }
            }
        }
        if !to_plain.is_empty() {
            match plain.write(to_plain.data()) {
                Ok(n) => {
                    to_plain.consumed(n);
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => want(Want::Write, &mut plain_events),
                // The server side is gone: nothing more to deliver.
                Err(_) => return,
            }
        }
        if !tls_open && to_plain.is_empty() && !plain_write_shut {
            // The server's reader sees the end of the client's stream.
            let _ = plain.shutdown(std::net::Shutdown::Write);
            plain_write_shut = true;
        }
        // Server to client.
        if plain_open {
            let room = to_tls.room();
            if !room.is_empty() {
                match plain.read(room) {
                    Ok(0) => {
                        plain_open = false;
                        progress = true;
                    }
                    Ok(n) => {
                        to_tls.filled(n);
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => want(Want::Read, &mut plain_events),
                    Err(_) => plain_open = false,
                }
            }
        }
        if !to_tls.is_empty() {
            let len = tls_write_len.unwrap_or(to_tls.data().len());
            match tls.ssl_write(&to_tls.data()[..len]) {
                Ok(n) => {
                    to_tls.consumed(n);
                    tls_write_len = None;
                    last_sent = Instant::now();
                    progress = true;
                }
                Err(e) => {
                    tls_write_len = Some(len);
                    match e.code() {
                        ErrorCode::WANT_READ => want(Want::Read, &mut tcp_events),
                        ErrorCode::WANT_WRITE => want(Want::Write, &mut tcp_events),
                        // The client is gone: replies cannot be delivered.
                        _ => return,
                    }
                    // A client that reads no replies is dropped, as on a plain socket.
                    if last_sent.elapsed() > write_timeout {
                        return;
                    }
                }
            }
        }
        if !plain_open && to_tls.is_empty() {
            // The server closed the connection and all it said went out.
            let _ = tls.shutdown();
            return;
        }
        if !tls_open && !plain_open {
            return;
        }
        if !progress {
            // A socket nothing waits on is left out: its hang-up would wake the poll at once,
            // again and again, while the other side is what holds things up.
            let fd = |fd: RawFd, events: i16| if events == 0 { -1 } else { fd };
            let mut fds = [
                libc::pollfd { fd: fd(tcp_fd, tcp_events), events: tcp_events, revents: 0 },
                libc::pollfd { fd: fd(plain.as_raw_fd(), plain_events), events: plain_events, revents: 0 },
            ];
            // SAFETY: `fds` is a valid array of two pollfd for the length given.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, RELAY_POLL_MS) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_file_as_psktool_writes_it() {
        let keys = parse_psk_file(b"alice:00ff10\n\nbob:0A0b\n").unwrap();
        assert_eq!(keys[&b"alice"[..]], vec![0, 0xff, 0x10]);
        assert_eq!(keys[&b"bob"[..]], vec![0x0a, 0x0b]);
    }

    #[test]
    fn malformed_psk_files_say_which_line() {
        for (text, words) in [
            (&b"alice"[..], "line 1 is not username:hexkey"),
            (b"alice:abc", "line 1: the key of \"alice\" is not an even number of hex digits"),
            (b"alice:zz", "not an even number of hex digits"),
            (b":00", "line 1 has an empty username"),
            (b"a:00\na:01", "line 2: \"a\" is given twice"),
            (b"a:", "must be 1 to"),
            (b"\n\n", "no keys"),
            (b"\xff\xfe", "not text"),
        ] {
            let e = parse_psk_file(text).unwrap_err();
            assert!(e.contains(words), "{e:?} should say {words:?}");
        }
    }
}
