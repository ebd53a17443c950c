//! STARTTLS at the server level, with OpenSSL as the client (TLS-PSK; GnuTLS clients are in
//! the `uraid` crate's cli_tls): `require` tells nothing before TLS, the negotiation restarts
//! over TLS, and pipelined bursts larger than the relay's buffers (many 1 MiB writes, a
//! 32 MiB write, reads of everything) cross the relay intact; a wrong key is turned away.
// Built with the `tls` feature only (scripts/test.sh turns it on).
#![cfg(feature = "tls")]

mod common;

use common::*;
use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode, SslVersion};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use uraid_nbd::codec::{encode_request_header, RequestHeader};
use uraid_nbd::proto::*;
use uraid_nbd::{MemDevice, ServerOptions, TlsCredentials, TlsPolicy};

const KEY: [u8; 32] = [0x5a; 32];
const MIB: usize = 1 << 20;

/// A psktool-style key file for `alice`, removed with the returned guard's directory.
struct KeyFile(PathBuf);
impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

fn key_file(tag: &str) -> KeyFile {
    let dir = std::env::temp_dir().join(format!("uraid-nbd-tls-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hex: String = KEY.iter().map(|b| format!("{b:02x}")).collect();
    let file = dir.join("keys.psk");
    std::fs::write(&file, format!("alice:{hex}\n")).unwrap();
    KeyFile(file)
}

fn server(policy: TlsPolicy, keys: &KeyFile, size_bytes: usize) -> (TestServer, Arc<MemDevice>) {
    let (dev, export) = mem_export(size_bytes);
    let credentials = Arc::new(TlsCredentials::psk(&keys.0).unwrap());
    let opts = ServerOptions { tls: policy, tls_credentials: Some(credentials), ..ServerOptions::default() };
    (TestServer::start(vec![export], opts), dev)
}

/// Greets, sends STARTTLS (which must be acknowledged) and runs the TLS handshake as `alice`.
fn starttls(addr: SocketAddr, key: &[u8]) -> Result<SslStream<TcpStream>, String> {
    starttls_max(addr, key, None)
}

fn starttls_max(
    addr: SocketAddr,
    key: &[u8],
    max: Option<SslVersion>,
) -> Result<SslStream<TcpStream>, String> {
    let mut s = connect(addr);
    greet(&mut s);
    s.write_all(&option_bytes(OPT_STARTTLS, &[])).unwrap();
    assert_eq!(read_option_reply(&mut s), (OPT_STARTTLS, REP_ACK, vec![]));
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_max_proto_version(max).unwrap();
    // SslConnector leaves the TLS 1.2 PSK suites out by default.
    b.set_cipher_list("ECDHEPSK:PSK").unwrap();
    let key = key.to_vec();
    b.set_psk_client_callback(move |_ssl, _hint, identity, psk| {
        identity[..6].copy_from_slice(b"alice\0");
        psk[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let c = b.build();
    let config = c.configure().unwrap().verify_hostname(false).use_server_name_indication(false);
    config.connect("localhost", s).map_err(|e| e.to_string())
}

fn request(command: u16, handle: u64, offset_bytes: u64, len_bytes: u32) -> Vec<u8> {
    let mut v = Vec::new();
    encode_request_header(&mut v, &RequestHeader { flags: 0, command, handle, offset_bytes, len_bytes });
    v
}

/// A simple reply's errno and handle.
fn simple_reply(s: &mut impl Read) -> (u32, u64) {
    assert_eq!(read_u32(s), SIMPLE_REPLY_MAGIC);
    (read_u32(s), read_u64(s))
}

#[test]
fn require_tells_nothing_before_tls_and_negotiation_restarts_after_it() {
    let keys = key_file("require");
    let (server, _) = server(TlsPolicy::Require, &keys, MIB);
    let mut s = connect(server.addr);
    greet(&mut s);
    for opt in [OPT_LIST, OPT_STRUCTURED_REPLY] {
        s.write_all(&option_bytes(opt, &[])).unwrap();
        let (o, ty, message) = read_option_reply(&mut s);
        assert_eq!((o, ty), (opt, REP_ERR_TLS_REQD), "{}", String::from_utf8_lossy(&message));
    }
    s.write_all(&option_bytes(OPT_GO, &go_data(""))).unwrap();
    assert_eq!(read_option_reply(&mut s).1, REP_ERR_TLS_REQD);
    // EXPORT_NAME cannot be refused with an error: the server closes.
    s.write_all(&option_bytes(OPT_EXPORT_NAME, b"")).unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)), "EXPORT_NAME before TLS was not closed");

    let mut t = starttls(server.addr, &KEY).unwrap();
    t.write_all(&option_bytes(OPT_STARTTLS, &[])).unwrap();
    assert_eq!(read_option_reply(&mut t).1, REP_ERR_INVALID, "a second STARTTLS");
    t.write_all(&option_bytes(OPT_LIST, &[])).unwrap();
    assert_eq!(read_option_reply(&mut t), (OPT_LIST, REP_SERVER, vec![0, 0, 0, 0]));
    assert_eq!(read_option_reply(&mut t), (OPT_LIST, REP_ACK, vec![]));
    t.write_all(&option_bytes(OPT_ABORT, &[])).unwrap();
    assert_eq!(read_option_reply(&mut t), (OPT_ABORT, REP_ACK, vec![]));
}

#[test]
fn wrong_key_is_turned_away_and_tls_1_3_and_1_2_both_work() {
    let keys = key_file("wrong");
    let (server, _) = server(TlsPolicy::On, &keys, MIB);
    assert!(starttls(server.addr, &[0x11; 32]).is_err(), "a wrong PSK was accepted");
    // TLS 1.3 (what GnuTLS clients pick) and TLS 1.2's PSK suites both work.
    for max in [None, Some(SslVersion::TLS1_2)] {
        let mut t = starttls_max(server.addr, &KEY, max).unwrap();
        let want = max.unwrap_or(SslVersion::TLS1_3);
        assert_eq!(t.ssl().version2(), Some(want), "{}", t.ssl().version_str());
        t.write_all(&option_bytes(OPT_ABORT, &[])).unwrap();
        assert_eq!(read_option_reply(&mut t).1, REP_ACK);
    }
}

#[test]
fn pipelined_bursts_larger_than_the_relay_buffers_arrive_intact() {
    const SIZE: usize = 64 * MIB;
    let keys = key_file("burst");
    let (mut server, dev) = server(TlsPolicy::Require, &keys, SIZE);
    let mut t = starttls(server.addr, &KEY).unwrap();
    t.write_all(&option_bytes(OPT_GO, &go_data(""))).unwrap();
    loop {
        let (opt, ty, _) = read_option_reply(&mut t);
        assert_eq!(opt, OPT_GO);
        assert!(ty == REP_INFO || ty == REP_ACK, "GO over TLS: reply type {ty:#x}");
        if ty == REP_ACK {
            break;
        }
    }
    let mut model = vec![0u8; SIZE];
    // 40 MiB of 1 MiB writes sent before any reply is read (within the server's 64 MiB
    // in-flight budget, so it never stops reading), then one 32 MiB write.
    let mut burst = Vec::new();
    for i in 0..40u64 {
        let data = pattern(i + 1, MIB);
        // Unaligned and never overlapping: NBD orders nothing among requests in flight.
        let offset = i as usize * MIB + 4097 * i as usize % MIB;
        model[offset..offset + MIB].copy_from_slice(&data);
        burst.extend_from_slice(&write_request(i, offset as u64, &data));
    }
    t.write_all(&burst).unwrap();
    let mut answered = Vec::new();
    for _ in 0..40 {
        let (errno, handle) = simple_reply(&mut t);
        assert_eq!(errno, 0, "write {handle}");
        answered.push(handle);
    }
    answered.sort_unstable();
    assert_eq!(answered, (0..40).collect::<Vec<_>>());
    let big = pattern(99, 32 * MIB);
    model[16 * MIB..48 * MIB].copy_from_slice(&big);
    t.write_all(&write_request(100, 16 * MIB as u64, &big)).unwrap();
    assert_eq!(simple_reply(&mut t), (0, 100));
    // 64 reads of 1 MiB asked at once: 64 MiB of replies through the relay.
    let reads: Vec<u8> =
        (0..64u64).flat_map(|i| request(CMD_READ, 1000 + i, i * MIB as u64, MIB as u32)).collect();
    t.write_all(&reads).unwrap();
    let mut seen = 0;
    for _ in 0..64 {
        let (errno, handle) = simple_reply(&mut t);
        assert_eq!(errno, 0);
        let i = (handle - 1000) as usize;
        let mut data = vec![0u8; MIB];
        t.read_exact(&mut data).unwrap();
        assert!(data == model[i * MIB..(i + 1) * MIB], "MiB {i} read back wrong over TLS");
        seen += 1;
    }
    assert_eq!(seen, 64);
    t.write_all(&request(CMD_DISC, 0, 0, 0)).unwrap();
    let mut rest = Vec::new();
    let _ = t.read_to_end(&mut rest);
    server.stop();
    assert!(dev.snapshot() == model, "the device holds something else than was written over TLS");
}

/// A server whose handshake and write timeouts are short.
fn impatient_server(keys: &KeyFile) -> TestServer {
    let (_, export) = mem_export(64 * MIB);
    let opts = ServerOptions {
        tls: TlsPolicy::Require,
        tls_credentials: Some(Arc::new(TlsCredentials::psk(&keys.0).unwrap())),
        handshake_timeout: Some(std::time::Duration::from_millis(500)),
        write_timeout: Some(std::time::Duration::from_millis(500)),
        ..ServerOptions::default()
    };
    TestServer::start(vec![export], opts)
}

/// Stops the server on another thread; fails the test if that takes longer than 10 s.
fn stop_within(mut server: TestServer, what: &str) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        server.stop();
        let _ = tx.send(());
    });
    assert!(rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok(), "the server did not stop: {what}");
}

#[test]
fn a_client_silent_after_starttls_is_dropped_at_the_handshake_timeout() {
    let keys = key_file("silent");
    let server = impatient_server(&keys);
    let mut s = connect(server.addr);
    greet(&mut s);
    s.write_all(&option_bytes(OPT_STARTTLS, &[])).unwrap();
    assert_eq!(read_option_reply(&mut s).1, REP_ACK);
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 1];
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
    assert!(t0.elapsed() < std::time::Duration::from_secs(10), "dropped only after {:?}", t0.elapsed());
    stop_within(server, "after a silent client");
}

#[test]
fn a_tls_client_that_reads_no_replies_is_dropped_and_does_not_hold_up_a_stop() {
    let keys = key_file("stalled");
    let server = impatient_server(&keys);
    let mut t = starttls(server.addr, &KEY).unwrap();
    t.write_all(&option_bytes(OPT_GO, &go_data(""))).unwrap();
    while read_option_reply(&mut t).1 != REP_ACK {}
    // 64 MiB of read replies owed to a client that never reads them: more than the
    // socket buffers and the relay hold.
    let reads: Vec<u8> = (0..64u64).flat_map(|i| request(CMD_READ, i, i * MIB as u64, MIB as u32)).collect();
    t.write_all(&reads).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    stop_within(server, "with a TLS client that reads nothing");
    drop(t);
}
