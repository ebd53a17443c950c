//! Test helpers: a server on an ephemeral loopback port and a tiny raw NBD client.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use uraid_nbd::codec::{encode_request_header, RequestHeader};
use uraid_nbd::proto::*;
use uraid_nbd::{Export, Server, ServerOptions, ShutdownHandle};

pub struct TestServer {
    pub addr: SocketAddr,
    pub handle: ShutdownHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub fn start(exports: Vec<Export>, opts: ServerOptions) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server::new(exports, opts).unwrap();
        let handle = server.shutdown_handle();
        let thread = std::thread::spawn(move || server.serve_tcp(listener));
        TestServer { addr, handle, thread: Some(thread) }
    }

    pub fn uri(&self) -> String {
        format!("nbd://{}/", self.addr)
    }

    /// Shuts down and waits for `serve_tcp` to return.
    pub fn stop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Panics (failing the test) when an external client tool is missing: a test that
/// cannot run must not pass silently.
pub fn require_tool(name: &str) {
    let found = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "required tool `{name}` is not installed; run scripts/install-deps.sh (qemu-utils, libnbd-bin)"
    );
}

pub fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn mem_export(size_bytes: usize) -> (Arc<uraid_nbd::MemDevice>, Export) {
    let dev = Arc::new(uraid_nbd::MemDevice::new(size_bytes));
    (Arc::clone(&dev), Export::new("", dev))
}

/// A write request with its payload as it goes on the wire, for clients that pipeline.
pub fn write_request(handle: u64, offset_bytes: u64, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    let len_bytes = payload.len() as u32;
    encode_request_header(
        &mut buf,
        &RequestHeader { flags: 0, command: CMD_WRITE, handle, offset_bytes, len_bytes },
    );
    buf.extend_from_slice(payload);
    buf
}

/// A deliberately simple, blocking NBD client.
pub struct RawClient {
    pub stream: TcpStream,
    pub size_bytes: u64,
    pub flags: u16,
    pub structured: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct SimpleReply {
    pub errno: u32,
    pub handle: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub payload: Vec<u8>,
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

pub fn read_u16(s: &mut impl Read) -> u16 {
    let mut b = [0; 2];
    s.read_exact(&mut b).unwrap();
    u16::from_be_bytes(b)
}
pub fn read_u32(s: &mut impl Read) -> u32 {
    let mut b = [0; 4];
    s.read_exact(&mut b).unwrap();
    u32::from_be_bytes(b)
}
pub fn read_u64(s: &mut impl Read) -> u64 {
    let mut b = [0; 8];
    s.read_exact(&mut b).unwrap();
    u64::from_be_bytes(b)
}

pub fn option_bytes(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

pub fn go_data(name: &str) -> Vec<u8> {
    let mut v = (name.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&0u16.to_be_bytes());
    v
}

/// Reads the greeting and sends client flags.
pub fn greet(s: &mut TcpStream) {
    assert_eq!(read_u64(s), NBDMAGIC);
    assert_eq!(read_u64(s), IHAVEOPT);
    let _flags = read_u16(s);
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
}

/// Reads one option reply: (option, type, payload).
pub fn read_option_reply(s: &mut impl Read) -> (u32, u32, Vec<u8>) {
    assert_eq!(read_u64(s), OPTION_REPLY_MAGIC);
    let opt = read_u32(s);
    let ty = read_u32(s);
    let len = read_u32(s) as usize;
    let mut payload = vec![0; len];
    s.read_exact(&mut payload).unwrap();
    (opt, ty, payload)
}

impl RawClient {
    pub fn connect(addr: SocketAddr, structured: bool) -> RawClient {
        Self::connect_export(addr, "", structured)
    }

    pub fn connect_export(addr: SocketAddr, name: &str, structured: bool) -> RawClient {
        let mut s = connect(addr);
        greet(&mut s);
        if structured {
            s.write_all(&option_bytes(OPT_STRUCTURED_REPLY, &[])).unwrap();
            assert_eq!(read_option_reply(&mut s).1, REP_ACK);
        }
        s.write_all(&option_bytes(OPT_GO, &go_data(name))).unwrap();
        let (mut size_bytes, mut flags) = (0, 0);
        loop {
            let (_, ty, payload) = read_option_reply(&mut s);
            match ty {
                REP_INFO if u16::from_be_bytes([payload[0], payload[1]]) == INFO_EXPORT => {
                    size_bytes = u64::from_be_bytes(payload[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes([payload[10], payload[11]]);
                }
                REP_INFO => {}
                REP_ACK => break,
                other => panic!("GO failed with reply type {other:#x}"),
            }
        }
        RawClient { stream: s, size_bytes, flags, structured }
    }

    pub fn send(
        &mut self,
        command: u16,
        flags: u16,
        handle: u64,
        offset_bytes: u64,
        len_bytes: u32,
        payload: &[u8],
    ) {
        let mut buf = Vec::new();
        encode_request_header(&mut buf, &RequestHeader { flags, command, handle, offset_bytes, len_bytes });
        buf.extend_from_slice(payload);
        self.stream.write_all(&buf).unwrap();
    }

    pub fn simple_reply(&mut self) -> SimpleReply {
        assert_eq!(read_u32(&mut self.stream), SIMPLE_REPLY_MAGIC);
        let errno = read_u32(&mut self.stream);
        let handle = read_u64(&mut self.stream);
        SimpleReply { errno, handle }
    }

    pub fn chunk(&mut self) -> Chunk {
        assert_eq!(read_u32(&mut self.stream), STRUCTURED_REPLY_MAGIC);
        let flags = read_u16(&mut self.stream);
        let kind = read_u16(&mut self.stream);
        let handle = read_u64(&mut self.stream);
        let len = read_u32(&mut self.stream) as usize;
        let mut payload = vec![0; len];
        self.stream.read_exact(&mut payload).unwrap();
        Chunk { flags, kind, handle, payload }
    }

    /// Any reply, reduced to (handle, errno, read data).
    pub fn reply(&mut self, read_len: Option<usize>) -> (u64, u32, Vec<u8>) {
        let mut magic = [0; 4];
        self.stream.read_exact(&mut magic).unwrap();
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => {
                let errno = read_u32(&mut self.stream);
                let handle = read_u64(&mut self.stream);
                let mut data = vec![0; if errno == 0 { read_len.unwrap_or(0) } else { 0 }];
                self.stream.read_exact(&mut data).unwrap();
                (handle, errno, data)
            }
            STRUCTURED_REPLY_MAGIC => {
                let flags = read_u16(&mut self.stream);
                let kind = read_u16(&mut self.stream);
                let handle = read_u64(&mut self.stream);
                let len = read_u32(&mut self.stream) as usize;
                let mut payload = vec![0; len];
                self.stream.read_exact(&mut payload).unwrap();
                assert_ne!(flags & REPLY_FLAG_DONE, 0, "server sends single-chunk replies");
                match kind {
                    REPLY_TYPE_NONE => (handle, 0, Vec::new()),
                    REPLY_TYPE_OFFSET_DATA => (handle, 0, payload[8..].to_vec()),
                    REPLY_TYPE_ERROR => {
                        (handle, u32::from_be_bytes(payload[..4].try_into().unwrap()), Vec::new())
                    }
                    other => panic!("unexpected chunk type {other}"),
                }
            }
            other => panic!("bad reply magic {other:#x}"),
        }
    }

    pub fn write(&mut self, handle: u64, offset_bytes: u64, data: &[u8]) -> u32 {
        self.send(CMD_WRITE, 0, handle, offset_bytes, data.len() as u32, data);
        let (h, errno, _) = self.reply(None);
        assert_eq!(h, handle);
        errno
    }

    pub fn read(&mut self, handle: u64, offset_bytes: u64, len_bytes: u32) -> Result<Vec<u8>, u32> {
        self.send(CMD_READ, 0, handle, offset_bytes, len_bytes, &[]);
        let (h, errno, data) = self.reply(Some(len_bytes as usize));
        assert_eq!(h, handle);
        if errno == 0 {
            Ok(data)
        } else {
            Err(errno)
        }
    }

    pub fn command(
        &mut self,
        command: u16,
        flags: u16,
        handle: u64,
        offset_bytes: u64,
        len_bytes: u32,
    ) -> u32 {
        self.send(command, flags, handle, offset_bytes, len_bytes, &[]);
        let (h, errno, _) = self.reply(None);
        assert_eq!(h, handle);
        errno
    }

    pub fn disconnect(mut self) {
        self.send(CMD_DISC, 0, 0, 0, 0, &[]);
        let mut rest = Vec::new();
        let _ = self.stream.read_to_end(&mut rest);
        assert!(rest.is_empty(), "no reply to DISC");
    }

    /// True once the server has closed the connection.
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0; 1];
        matches!(self.stream.read(&mut b), Ok(0) | Err(_))
    }
}

/// Deterministic pattern for a given seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
