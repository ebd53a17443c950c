//! Protocol behaviour over real sockets with a raw client: replies, flags, multi-conn
//! consistency, bounded in-flight work, graceful shutdown.

mod common;

use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uraid_core::CompletionRound;
use uraid_nbd::proto::*;
use uraid_nbd::{
    BlockDevice, BlockRequest, BlockSizeConstraints, Completion, DeviceCounters, Export, MemDevice,
    ServerOptions,
};

#[test]
fn round_trip_simple_and_structured() {
    let (dev, export) = mem_export(1 << 20);
    let server = TestServer::start(vec![export], ServerOptions::default());
    for structured in [false, true] {
        let mut c = RawClient::connect(server.addr, structured);
        assert_eq!(c.size_bytes, 1 << 20);
        let data = pattern(structured as u64, 10_001);
        assert_eq!(c.write(1, 12_345, &data), 0);
        assert_eq!(c.read(2, 12_345, 10_001).unwrap(), data);
        // Zero-length requests are no-ops that still get a reply.
        assert_eq!(c.read(3, 0, 0).unwrap(), Vec::<u8>::new());
        assert_eq!(c.write(4, 0, &[]), 0);
        // FUA write, flush, write-zeroes with and without NO_HOLE, trim, cache.
        c.send(CMD_WRITE, CMD_FLAG_FUA, 5, 0, 3, b"abc");
        assert_eq!(c.reply(None).1, 0);
        assert_eq!(c.command(CMD_FLUSH, 0, 6, 0, 0), 0);
        assert_eq!(c.command(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 7, 12_345, 100), 0);
        assert_eq!(c.command(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 8, 12_445, 100), 0);
        assert_eq!(c.command(CMD_TRIM, 0, 9, 20_000, 1000), 0);
        assert_eq!(c.command(CMD_CACHE, 0, 10, 0, 4096), 0);
        let mut expect = data.clone();
        expect[..200].fill(0);
        assert_eq!(c.read(11, 12_345, 10_001).unwrap()[..7000], expect[..7000]);
        c.disconnect();
        assert_eq!(&dev.snapshot()[..3], b"abc");
    }
    assert_eq!(DeviceCounters::get(&dev.counters.fua_writes), 2);
    assert_eq!(DeviceCounters::get(&dev.counters.flushes), 2);
    assert_eq!(DeviceCounters::get(&dev.counters.write_zeroes), 4);
}

#[test]
fn structured_errors_and_df_flag() {
    let (_dev, export) = mem_export(4096);
    let server = TestServer::start(vec![export], ServerOptions::default());
    let mut c = RawClient::connect(server.addr, true);
    assert_ne!(c.flags & FLAG_SEND_DF, 0);
    c.send(CMD_READ, CMD_FLAG_DF, 1, 4000, 200, &[]);
    let chunk = c.chunk();
    assert_eq!((chunk.kind, chunk.flags, chunk.handle), (REPLY_TYPE_ERROR, REPLY_FLAG_DONE, 1));
    assert_eq!(u32::from_be_bytes(chunk.payload[..4].try_into().unwrap()), EINVAL);
    let msg_len = u16::from_be_bytes([chunk.payload[4], chunk.payload[5]]) as usize;
    assert!(String::from_utf8_lossy(&chunk.payload[6..6 + msg_len]).contains("end of the export"));
    c.send(CMD_READ, CMD_FLAG_DF, 2, 0, 100, &[]);
    let chunk = c.chunk();
    assert_eq!((chunk.kind, chunk.payload.len()), (REPLY_TYPE_OFFSET_DATA, 108));
    // Without structured replies DF is neither advertised nor accepted.
    let mut s = RawClient::connect(server.addr, false);
    assert_eq!(s.flags & FLAG_SEND_DF, 0);
    s.send(CMD_READ, CMD_FLAG_DF, 3, 0, 10, &[]);
    assert_eq!(s.simple_reply(), SimpleReply { errno: EINVAL, handle: 3 });
}

#[test]
fn advertised_flags_follow_the_device() {
    let writable = Arc::new(MemDevice::new(8192));
    let read_only = Arc::new(MemDevice::new(8192).read_only(true));
    let inconsistent = Arc::new(PerConnectionCacheDevice(MemDevice::new(8192)));
    let mut forced_ro = Export::new("forced-ro", writable.clone() as Arc<dyn BlockDevice>);
    forced_ro.read_only = true;
    let exports = vec![
        Export::new("rw", writable.clone()),
        Export::new("ro", read_only),
        Export::new("no-multi-conn", inconsistent),
        forced_ro,
    ];
    let server = TestServer::start(exports, ServerOptions::default());

    let rw = RawClient::connect_export(server.addr, "rw", false);
    let base = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_CACHE | FLAG_CAN_MULTI_CONN;
    let write_flags = FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
    assert_eq!(rw.flags, base | write_flags);
    for name in ["ro", "forced-ro"] {
        let mut ro = RawClient::connect_export(server.addr, name, false);
        assert_eq!(ro.flags, base | FLAG_READ_ONLY, "{name}");
        assert_eq!(ro.write(1, 0, b"x"), EPERM);
        assert_eq!(ro.command(CMD_TRIM, 0, 2, 0, 1), EPERM);
        assert_eq!(ro.command(CMD_WRITE_ZEROES, 0, 3, 0, 1), EPERM);
        assert_eq!(ro.read(4, 0, 1).unwrap(), vec![0]);
    }
    let nm = RawClient::connect_export(server.addr, "no-multi-conn", false);
    assert_eq!(nm.flags & FLAG_CAN_MULTI_CONN, 0);
    assert_eq!(writable.snapshot(), vec![0; 8192]);
}

/// Stands for a device whose cache is per connection: it must not claim multi-conn.
struct PerConnectionCacheDevice(MemDevice);
impl BlockDevice for PerConnectionCacheDevice {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn multi_conn_consistent(&self) -> bool {
        false
    }
    fn submit(&self, req: BlockRequest, done: Completion, round: &mut CompletionRound) {
        self.0.submit(req, done, round)
    }
}

/// proto.md: with CAN_MULTI_CONN, a flush on one connection makes writes that another
/// connection saw completed durable.
#[test]
fn can_multi_conn_flush_on_b_covers_write_on_a() {
    let dev = Arc::new(MemDevice::with_write_cache(1 << 20));
    let server = TestServer::start(vec![Export::new("", dev.clone())], ServerOptions::default());
    let mut a = RawClient::connect(server.addr, false);
    let mut b = RawClient::connect(server.addr, true);
    assert_ne!(a.flags & FLAG_CAN_MULTI_CONN, 0);
    for round in 0..20u64 {
        let offset_bytes = round * 40_000 + 7;
        let data = pattern(round + 100, 33_333);
        assert_eq!(a.write(round, offset_bytes, &data), 0);
        // The modelled cache really holds it back until a flush...
        let durable = dev.durable_snapshot();
        assert_ne!(durable[offset_bytes as usize..][..data.len()], data[..]);
        // ...and a flush through the other connection makes it durable.
        assert_eq!(b.command(CMD_FLUSH, 0, round, 0, 0), 0);
        let durable = dev.durable_snapshot();
        assert_eq!(durable[offset_bytes as usize..][..data.len()], data[..], "round {round}");
        // Visible to reads on B as well.
        assert_eq!(b.read(1000 + round, offset_bytes, data.len() as u32).unwrap(), data);
    }
    a.disconnect();
    b.disconnect();
}

/// A device that holds completions until released, to observe what is in flight.
struct GatedDevice {
    inner: MemDevice,
    held: Mutex<Option<Vec<(BlockRequest, Completion)>>>,
    max_held: AtomicUsize,
}

impl GatedDevice {
    fn new(size_bytes: usize) -> Self {
        GatedDevice {
            inner: MemDevice::new(size_bytes),
            held: Mutex::new(Some(Vec::new())),
            max_held: AtomicUsize::new(0),
        }
    }
    fn held(&self) -> usize {
        self.held.lock().unwrap().as_ref().map_or(0, Vec::len)
    }
    fn open(&self) {
        let held = self.held.lock().unwrap().take().unwrap_or_default();
        let mut round = CompletionRound::default();
        for (req, done) in held {
            self.inner.submit(req, done, &mut round);
        }
        round.end();
    }
    fn wait_held(&self, n: usize) {
        let start = Instant::now();
        while self.held() < n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "only {} of {n} requests reached the device",
                self.held()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl BlockDevice for GatedDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn multi_conn_consistent(&self) -> bool {
        true
    }
    fn submit(&self, req: BlockRequest, done: Completion, round: &mut CompletionRound) {
        let mut held = self.held.lock().unwrap();
        match held.as_mut() {
            Some(v) => {
                v.push((req, done));
                self.max_held.fetch_max(v.len(), Ordering::SeqCst);
            }
            None => {
                drop(held);
                self.inner.submit(req, done, round);
            }
        }
    }
}

#[test]
fn in_flight_requests_and_bytes_are_bounded() {
    let dev = Arc::new(GatedDevice::new(1 << 24));
    let opts =
        ServerOptions { max_in_flight_requests: 8, max_in_flight_bytes: 1 << 20, ..Default::default() };
    let server = TestServer::start(vec![Export::new("", dev.clone())], opts);
    let mut c = RawClient::connect(server.addr, false);
    let mut sender = c.stream.try_clone().unwrap();
    // 64 writes of 64 KiB: 4 MiB the server must not buffer at once.
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        for i in 0..64u64 {
            sender.write_all(&write_request(i, i * 65536, &pattern(i, 65536))).unwrap();
        }
    });
    dev.wait_held(8);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(dev.held(), 8, "the server must stop reading once 8 requests are in flight");
    dev.open();
    let mut handles: Vec<u64> = (0..64)
        .map(|_| c.simple_reply())
        .map(|r| {
            assert_eq!(r.errno, 0);
            r.handle
        })
        .collect();
    handles.sort_unstable();
    assert_eq!(handles, (0..64).collect::<Vec<_>>());
    writer.join().unwrap();
    assert_eq!(dev.max_held.load(Ordering::SeqCst), 8);
    // The byte cap binds before the count cap for large reads: 1 MiB / 256 KiB = 4.
    let dev2 = Arc::new(GatedDevice::new(1 << 24));
    let opts =
        ServerOptions { max_in_flight_requests: 64, max_in_flight_bytes: 1 << 20, ..Default::default() };
    let server2 = TestServer::start(vec![Export::new("", dev2.clone())], opts);
    let mut c2 = RawClient::connect(server2.addr, false);
    for i in 0..10u64 {
        c2.send(CMD_READ, 0, i, i << 18, 1 << 18, &[]);
    }
    dev2.wait_held(4);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(dev2.held(), 4);
    dev2.open();
    for _ in 0..10 {
        let (_, errno, data) = c2.reply(Some(1 << 18));
        assert_eq!((errno, data.len()), (0, 1 << 18));
    }
}

/// A device that answers inside `submit` makes its replies on the connection thread,
/// which holds them back to send a burst's replies together; it must send them before it
/// waits for budget, which only those replies give back.
#[test]
fn replies_held_by_the_connection_thread_go_out_before_it_waits_for_budget() {
    let (dev, export) = mem_export(1 << 20);
    let opts = ServerOptions { max_in_flight_requests: 2, ..Default::default() };
    let server = TestServer::start(vec![export], opts);
    let mut c = RawClient::connect(server.addr, false);
    // All twenty in one burst: the server finds the third in its buffer with two replies
    // held and the budget used up.
    let burst: Vec<u8> = (0..20u64).flat_map(|i| write_request(i, i * 512, &pattern(i, 512))).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Write;
        c.stream.write_all(&burst).unwrap();
        let handles: Vec<u64> = (0..20).map(|_| c.simple_reply()).map(|r| r.handle).collect();
        let _ = tx.send(handles);
    });
    let Ok(mut handles) = rx.recv_timeout(Duration::from_secs(20)) else {
        // The connection is stuck; stopping the server would wait for it forever.
        std::mem::forget(server);
        panic!("no replies in 20 s: the connection thread waits for budget its held replies would free");
    };
    handles.sort_unstable();
    assert_eq!(handles, (0..20).collect::<Vec<_>>());
    assert_eq!(dev.snapshot()[19 * 512..20 * 512], pattern(19, 512)[..]);
}

#[test]
fn shutdown_finishes_in_flight_requests_then_returns() {
    let dev = Arc::new(GatedDevice::new(1 << 20));
    let mut server = TestServer::start(vec![Export::new("", dev.clone())], ServerOptions::default());
    let mut c = RawClient::connect(server.addr, true);
    let idle = RawClient::connect(server.addr, false);
    for i in 0..5u64 {
        c.send(CMD_WRITE, 0, i, i * 100, 100, &pattern(i, 100));
    }
    dev.wait_held(5);
    let handle = server.handle.clone();
    let stopper = std::thread::spawn(move || server.stop());
    std::thread::sleep(Duration::from_millis(200));
    assert!(handle.is_shutting_down());
    assert!(!stopper.is_finished(), "serve must wait for in-flight requests");
    dev.open();
    for _ in 0..5 {
        assert_eq!(c.reply(None).1, 0);
    }
    stopper.join().unwrap();
    assert_eq!(handle.active_connections(), 0);
    assert!(c.is_closed());
    drop(idle);
    assert_eq!(dev.inner.snapshot()[400..500], pattern(4, 100)[..]);
}

#[test]
fn minimum_block_size_is_enforced_and_advertised() {
    let bs = BlockSizeConstraints { min_bytes: 512, preferred_bytes: 4096, max_bytes: 1 << 20 };
    let dev = Arc::new(MemDevice::new(1 << 20).with_block_size(bs));
    let server = TestServer::start(vec![Export::new("", dev)], ServerOptions::default());
    let mut s = connect(server.addr);
    greet(&mut s);
    use std::io::Write;
    let mut go = go_data("");
    go.truncate(go.len() - 2);
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    s.write_all(&option_bytes(OPT_GO, &go)).unwrap();
    let mut seen = None;
    loop {
        let (_, ty, p) = read_option_reply(&mut s);
        if ty == REP_ACK {
            break;
        }
        if u16::from_be_bytes([p[0], p[1]]) == INFO_BLOCK_SIZE {
            seen = Some(p[2..].to_vec());
        }
    }
    let expect = [512u32, 4096, 1 << 20].iter().flat_map(|v| v.to_be_bytes()).collect::<Vec<_>>();
    assert_eq!(seen.unwrap(), expect);
    let mut c = RawClient { stream: s, size_bytes: 1 << 20, flags: 0, structured: false };
    assert_eq!(c.read(1, 512, 100), Err(EINVAL));
    assert_eq!(c.write(2, 100, &[1; 512]), EINVAL);
    assert_eq!(c.read(3, 1024, 1024).unwrap(), vec![0; 1024]);
    assert_eq!(c.read(4, 0, (1 << 20) + 512), Err(EINVAL));
}
