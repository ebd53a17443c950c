//! The stripe cache while a write batch is on its way to the members: what a read of the
//! same rows sees, and what the cache keeps of the request's buffer (md's skip_copy).

mod common;

use common::*;
use uraid_core::geometry::algorithm;
use uraid_core::*;

const CHUNK_SECTORS: u64 = 128;

fn raid6_driver(n: usize) -> Driver {
    let geo =
        Geometry::new(Level::Raid6, n, algorithm::LEFT_SYMMETRIC, CHUNK_SECTORS, &vec![8192; n]).unwrap();
    let engine = Engine::new(config(geo, 0)).unwrap();
    Driver::new(engine, MemMembers::new(n, 8192 * 512), 7)
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed).fill(&mut v);
    v
}

/// Submit `req`, unplug, and hold back every member I/O it issues (none completes).
fn issue_and_hold(d: &mut Driver, req: Request) -> Vec<MemberIo> {
    d.submit(req);
    d.engine.unplug(d.now_ns);
    std::iter::from_fn(|| d.engine.pop_member_io()).collect()
}

fn complete(d: &mut Driver, ios: Vec<MemberIo>) {
    for io in ios {
        let c = d.members.perform(io);
        d.engine.complete_member_io(c, d.now_ns);
    }
}

#[test]
fn a_read_of_rows_being_written_sees_the_new_data() {
    for (n, write_len) in [(5usize, 3 * 64 * 1024), (6, 4 * 64 * 1024), (6, 4096)] {
        let mut d = raid6_driver(n);
        let old = pattern(write_len, 1);
        d.run_one(Request::write(1, 0, old)).unwrap();
        let new = pattern(write_len, 2);
        let writes = issue_and_hold(&mut d, Request::write(2, 0, new.clone()));
        assert!(writes.iter().any(|io| io.op == MemberIoOp::Write), "the batch is writing");
        // 4 KiB inside the first chunk: the head is busy, so the read goes through the cache.
        let reads = issue_and_hold(&mut d, Request::read(3, 0, 4096));
        complete(&mut d, reads);
        complete(&mut d, writes);
        d.run_until_idle();
        let got = d.take_done(3).expect("read completed").result.unwrap();
        assert_eq!(got[..], new[..got.len()], "{n} members, {write_len}-byte write");
        assert!(d.take_done(2).unwrap().result.is_ok());
    }
}

#[test]
fn full_stripe_writes_leave_the_cache_consistent_with_the_members() {
    // Full-height pieces travel as views of the request (skip_copy); after they land, later
    // partial writes (read-modify-write) and reads must still see exactly what was written.
    let n = 6;
    let mut d = raid6_driver(n);
    let stripe = 4 * 64 * 1024;
    let mut model = vec![0u8; 4 * stripe];
    let mut rng = Rng(11);
    let mut id = 10;
    for round in 0..40u64 {
        id += 1;
        let (off, len) = if round % 3 == 0 {
            (rng.below(4) * stripe as u64, stripe as u64 * (1 + rng.below(2)))
        } else {
            let len = (1 + rng.below(32)) * 512;
            (rng.below((model.len() as u64 - len) / 512) * 512, len)
        };
        let len = len.min(model.len() as u64 - off);
        let data = pattern(len as usize, round + 100);
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
        d.run_one(Request::write(id, off, data)).unwrap();
        id += 1;
        let got = d.run_one(Request::read(id, 0, model.len() as u64)).unwrap();
        assert!(got == model, "round {round}: array differs from what was written");
    }
    // Parity on the members agrees with the data: fail two members and read everything back.
    d.engine.fail_member(0, d.now_ns);
    d.engine.fail_member(3, d.now_ns);
    d.run_until_idle();
    let got = d.run_one(Request::read(id + 1, 0, model.len() as u64)).unwrap();
    assert!(got == model, "degraded read differs: parity was not kept up to date");
}

/// md's chunk_aligned_read: a read across chunks is split at the chunk boundaries and each
/// piece read straight from its member, with no stripe head; a piece whose head is being
/// written goes through the cache and still sees the new data.
#[test]
fn a_read_across_chunks_goes_to_the_members_piece_by_piece() {
    let chunk_bytes = (CHUNK_SECTORS * 512) as usize;
    let mut d = raid6_driver(6);
    // Two stripes of four data chunks.
    let data = pattern(8 * chunk_bytes, 3);
    d.run_one(Request::write(1, 0, data.clone())).unwrap();
    let before = d.engine.stats().aligned_read_bypass;
    // From the middle of chunk 0 to the middle of chunk 3: four pieces, four member reads.
    let (start, len) = (chunk_bytes / 2, 3 * chunk_bytes);
    let reads = issue_and_hold(&mut d, Request::read(2, start as u64, len as u64));
    assert_eq!(reads.len(), 4, "one member read per chunk piece: {reads:?}");
    assert_eq!(d.engine.stats().aligned_read_bypass - before, 4);
    complete(&mut d, reads);
    d.run_until_idle();
    assert_eq!(d.take_done(2).unwrap().result.unwrap()[..], data[start..start + len]);

    // Chunk 4 (the second stripe) being rewritten: the pieces in that stripe go through
    // the cache and see the new data; the two in the first stripe still bypass.
    let new = pattern(chunk_bytes, 4);
    let writes = issue_and_hold(&mut d, Request::write(3, 4 * chunk_bytes as u64, new.clone()));
    let before = d.engine.stats().aligned_read_bypass;
    let (start, len) = (2 * chunk_bytes, 4 * chunk_bytes);
    let reads = issue_and_hold(&mut d, Request::read(4, start as u64, len as u64));
    assert_eq!(d.engine.stats().aligned_read_bypass - before, 2);
    complete(&mut d, reads);
    complete(&mut d, writes);
    d.run_until_idle();
    let got = d.take_done(4).unwrap().result.unwrap();
    let mut want = data[start..start + len].to_vec();
    want[2 * chunk_bytes..3 * chunk_bytes].copy_from_slice(&new);
    assert_eq!(got, want);
}

#[test]
fn small_writes_read_into_recycled_buffers_and_keep_the_data() {
    // Random 4 KiB writes over more heads than the cache holds: once warm, the member reads
    // of a read-modify-write (or reconstruct-write) carry a buffer the cache recycled, so
    // the executor allocates nothing for them; the array still reads back what was written.
    let mut d = raid6_driver(6);
    let t = d.engine.tunables().clone();
    d.engine.set_tunables(Tunables { stripe_cache_size: 17, ..t }).unwrap();
    let array_bytes = 4 * 8192 * 512u64;
    let mut model = vec![0u8; array_bytes as usize];
    d.run_one(Request::write(1, 0, model.clone())).unwrap();
    let mut rng = Rng(11);
    let (mut reads, mut with_buffer) = (0u32, 0u32);
    for i in 0..600u64 {
        let off = rng.below(array_bytes / 4096) * 4096;
        let data = pattern(4096, 100 + i);
        model[off as usize..off as usize + 4096].copy_from_slice(&data);
        d.submit(Request::write(10 + i, off, data));
        d.engine.unplug(d.now_ns);
        loop {
            let ios: Vec<MemberIo> = std::iter::from_fn(|| d.engine.pop_member_io()).collect();
            if ios.is_empty() {
                break;
            }
            for io in &ios {
                if i >= 100 && io.op == MemberIoOp::Read {
                    reads += 1;
                    with_buffer += u32::from(io.data.len() as u64 == io.len_bytes);
                }
            }
            complete(&mut d, ios);
        }
        d.run_until_idle();
        assert!(d.take_done(10 + i).expect("write completed").result.is_ok());
    }
    assert!(reads > 1000, "the writes read from the members ({reads} reads)");
    assert!(with_buffer * 10 >= reads * 9, "{with_buffer} of {reads} member reads carried a recycled buffer");
    let got = d.run_one(Request::read(9, 0, array_bytes)).unwrap();
    assert!(got == model, "the array reads back what was written");
}

/// A flush forces the heads its writes were delayed in (md's delayed partial stripes) and
/// must also run them: no unplug or tick may come (the reshape's window flush has none
/// after it), and the flush then waited forever behind writes never issued (`uraid sim`
/// seeds 962, 31000303, 52000292, and 31000403 on ssd-sata hung there).
#[test]
fn a_flush_runs_the_delayed_writes_it_waits_for() {
    let mut d = raid6_driver(6);
    let data = pattern(4096, 3);
    d.submit(Request::write(1, 0, data.clone()));
    assert!(d.engine.pop_member_io().is_none(), "a partial stripe waits for more writes");
    d.submit(Request::flush(2));
    // No unplug: only what the flush itself starts, and the clock's deadlines.
    let mut guard = 0;
    while d.step() {
        guard += 1;
        assert!(guard < 100_000, "the driver never ran dry");
    }
    for id in [1, 2] {
        let done = d.take_done(id).unwrap_or_else(|| panic!("request {id} never completed"));
        assert!(done.result.is_ok(), "request {id}: {:?}", done.result);
    }
    assert_eq!(d.run_one(Request::read(3, 0, 4096)).unwrap(), data);
}
