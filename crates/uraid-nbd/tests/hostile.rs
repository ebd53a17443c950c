//! Hostile and broken clients: each gets an error reply or a closed connection, while a
//! well-behaved client on another connection keeps working with its data intact.

mod common;

use common::*;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uraid_nbd::proto::*;
use uraid_nbd::ServerOptions;

const SIZE_BYTES: u64 = 4 << 20;
/// The good client owns the first MiB; hostile clients may scribble anywhere else.
const GOOD_REGION_BYTES: u64 = 1 << 20;

fn handshake_to_transmission(server: &TestServer) -> RawClient {
    RawClient::connect(server.addr, false)
}

#[test]
fn hostile_clients_do_not_harm_others() {
    let (dev, export) = mem_export(SIZE_BYTES as usize);
    let opts = ServerOptions { handshake_timeout: Some(Duration::from_secs(2)), ..Default::default() };
    let server = TestServer::start(vec![export], opts);

    // A good client writes and verifies continuously while the hostile ones run.
    let stop = Arc::new(AtomicBool::new(false));
    let good = std::thread::spawn({
        let stop = Arc::clone(&stop);
        let addr = server.addr;
        move || {
            let mut c = RawClient::connect(addr, true);
            let mut round = 0u64;
            while !stop.load(Ordering::SeqCst) || round < 20 {
                let offset_bytes = (round * 7919) % (GOOD_REGION_BYTES - 8192);
                let data = pattern(round, 8192);
                assert_eq!(c.write(round, offset_bytes, &data), 0);
                assert_eq!(c.read(round, offset_bytes, 8192).unwrap(), data, "good client round {round}");
                round += 1;
            }
            c.disconnect();
            round
        }
    });

    // Bad magic in the handshake: closed.
    let mut s = connect(server.addr);
    greet(&mut s);
    s.write_all(b"NOTMAGIC\0\0\0\x07\0\0\0\0").unwrap();
    assert!(closed(&mut s), "bad option magic must close");

    // Unknown client flags: closed.
    let mut s = connect(server.addr);
    let mut greeting = [0u8; 18];
    std::io::Read::read_exact(&mut s, &mut greeting).unwrap();
    s.write_all(&0x8000_0001u32.to_be_bytes()).unwrap();
    assert!(closed(&mut s), "unknown client flags must close");

    // Option with a huge length: closed without the server buffering it.
    let mut s = connect(server.addr);
    greet(&mut s);
    let mut huge = IHAVEOPT.to_be_bytes().to_vec();
    huge.extend_from_slice(&OPT_GO.to_be_bytes());
    huge.extend_from_slice(&0xffff_fff0u32.to_be_bytes());
    s.write_all(&huge).unwrap();
    assert!(closed(&mut s), "oversized option must close");

    // Unknown option: NBD_REP_ERR_UNSUP, then negotiation continues to GO.
    let mut s = connect(server.addr);
    greet(&mut s);
    s.write_all(&option_bytes(0x7777, b"whatever")).unwrap();
    assert_eq!(read_option_reply(&mut s).1, REP_ERR_UNSUP);
    s.write_all(&option_bytes(OPT_GO, &go_data("no-such-export"))).unwrap();
    assert_eq!(read_option_reply(&mut s).1, REP_ERR_UNKNOWN);
    s.write_all(&option_bytes(OPT_EXPORT_NAME, b"no-such-export")).unwrap();
    assert!(closed(&mut s), "EXPORT_NAME of an unknown export must close");

    // Half a handshake, then silence: the handshake timeout closes it.
    let mut s = connect(server.addr);
    greet(&mut s);
    s.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    assert!(closed(&mut s), "stalled handshake must time out");

    // Transmission phase abuse on one connection, which must survive each error.
    let mut c = handshake_to_transmission(&server);
    assert_eq!(c.command(0x55, 0, 1, 0, 0), EINVAL, "unknown command");
    assert_eq!(c.command(CMD_READ, 0x4000, 2, 0, 1), EINVAL, "unknown flag");
    assert_eq!(c.read(3, SIZE_BYTES, 1), Err(EINVAL), "read at the end");
    assert_eq!(c.read(4, u64::MAX - 10, 100), Err(EINVAL), "read wrapping around");
    assert_eq!(c.write(5, SIZE_BYTES - 10, &[0xee; 100]), ENOSPC, "write beyond the end");
    assert_eq!(c.command(CMD_WRITE_ZEROES, 0, 6, SIZE_BYTES, 1), ENOSPC);
    assert_eq!(c.command(CMD_TRIM, 0, 7, SIZE_BYTES - 1, 2), EINVAL);
    assert_eq!(c.read(8, 0, DEFAULT_MAX_PAYLOAD_BYTES + 1), Err(EINVAL), "oversized read");
    // Oversized write: the payload is consumed, so framing holds for the next request.
    let big = vec![0xaa; DEFAULT_MAX_PAYLOAD_BYTES as usize + 4096];
    assert_eq!(c.write(9, 2 << 20, &big), EINVAL, "oversized write");
    assert_eq!(c.read(10, 2 << 20, 16).unwrap(), vec![0; 16], "oversized write must not land");
    assert_eq!(c.write(11, 2 << 20, b"still framed"), 0);
    assert_eq!(c.read(12, 2 << 20, 12).unwrap(), b"still framed");
    // Bad request magic: closed.
    c.stream.write_all(&[0xde, 0xad, 0xbe, 0xef]).unwrap();
    c.stream.write_all(&[0; 24]).unwrap();
    assert!(c.is_closed(), "bad request magic must close");

    // Disconnect in the middle of a write payload.
    let mut c = handshake_to_transmission(&server);
    c.send(CMD_WRITE, 0, 1, 3 << 20, 65536, &[0x11; 1000]);
    drop(c);
    // Disconnect in the middle of a request header.
    let mut c = handshake_to_transmission(&server);
    c.stream.write_all(&REQUEST_MAGIC.to_be_bytes()).unwrap();
    c.stream.write_all(&[0; 5]).unwrap();
    drop(c);
    // Many pipelined requests, then vanish without reading a reply.
    let mut c = handshake_to_transmission(&server);
    for i in 0..200 {
        c.send(CMD_READ, 0, i, 0, 65536, &[]);
    }
    drop(c);
    // Random garbage at every stage.
    for seed in 0..20 {
        let mut s = connect(server.addr);
        let _ = s.write_all(&pattern(seed, 300));
        drop(s);
        let mut c = handshake_to_transmission(&server);
        let _ = c.stream.write_all(&pattern(seed + 1000, 300));
        drop(c);
    }

    stop.store(true, Ordering::SeqCst);
    let rounds = good.join().expect("good client must keep working");
    assert!(rounds >= 20);
    // Nothing the hostile clients did touched the good client's region except the good
    // client itself: replay its last writes and compare.
    let image = dev.snapshot();
    let mut expect = vec![0u8; GOOD_REGION_BYTES as usize];
    for round in 0..rounds {
        let offset_bytes = ((round * 7919) % (GOOD_REGION_BYTES - 8192)) as usize;
        expect[offset_bytes..offset_bytes + 8192].copy_from_slice(&pattern(round, 8192));
    }
    assert!(image[..GOOD_REGION_BYTES as usize] == expect[..], "good client's data damaged");
    // The half-sent write never landed.
    assert_eq!(image[3 << 20..(3 << 20) + 1000], [0; 1000][..]);
    // The server is still up for new clients.
    let mut c = RawClient::connect(server.addr, false);
    assert_eq!(c.read(1, 0, 8).unwrap(), image[..8]);
}

/// Reads until EOF; true if the server closed the connection.
fn closed(s: &mut std::net::TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match std::io::Read::read(s, &mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}
