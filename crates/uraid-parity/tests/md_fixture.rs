//! Known answers from Linux md: P and Q stored by a real RAID6 equal what we compute.
//!
//! The fixture (`shared/fixtures/md/raid6-6dev-64k`) is a 6-member left-symmetric RAID6,
//! chunk 64 KiB, data_offset 2048 sectors, written with a pattern and scrubbed with
//! mismatch_cnt 0. Left-symmetric puts P on disk n-1-(stripe % n), Q right after it and
//! data after Q, so the physical walk from Q+1 (md's syndrome slot order) is also the
//! logical data order: data slot i lives on disk (pd + 2 + i) % n.

use std::io::Read;
use std::path::PathBuf;

const MEMBERS: usize = 6;
const CHUNK_BYTES: usize = 64 * 1024;
const DATA_OFFSET_BYTES: usize = 2048 * 512;
/// More than one full rotation of P/Q over the members.
const STRIPES: usize = 14;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/md/raid6-6dev-64k")
}

/// The first `bytes` of a member, decompressing only that far.
fn member_prefix(member: usize, bytes: usize) -> Vec<u8> {
    let path = fixture_dir().join(format!("member{member}.img.zst"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut decoder = ruzstd::StreamingDecoder::new(std::io::BufReader::new(file)).expect("zstd header");
    let mut out = vec![0u8; bytes];
    decoder.read_exact(&mut out).expect("member image shorter than expected");
    out
}

#[test]
fn md_raid6_parity_equals_gen_syndrome() {
    let prefix_bytes = DATA_OFFSET_BYTES + STRIPES * CHUNK_BYTES;
    let members: Vec<Vec<u8>> = (0..MEMBERS).map(|m| member_prefix(m, prefix_bytes)).collect();
    let chunk = |disk: usize, stripe: usize| {
        let at = DATA_OFFSET_BYTES + stripe * CHUNK_BYTES;
        &members[disk][at..at + CHUNK_BYTES]
    };
    let mut nonzero_q_stripes = 0;
    for stripe in 0..STRIPES {
        let pd = MEMBERS - 1 - stripe % MEMBERS;
        let qd = (pd + 1) % MEMBERS;
        let data: Vec<&[u8]> = (0..MEMBERS - 2).map(|i| chunk((pd + 2 + i) % MEMBERS, stripe)).collect();
        for k in uraid_parity::available_kernels() {
            let (mut p, mut q) = (vec![0u8; CHUNK_BYTES], vec![0u8; CHUNK_BYTES]);
            k.gen_syndrome(&data, &mut p, &mut q);
            assert!(p == chunk(pd, stripe), "{}: stripe {stripe} P (disk {pd}) differs from md's", k.name());
            assert!(q == chunk(qd, stripe), "{}: stripe {stripe} Q (disk {qd}) differs from md's", k.name());
            // Recovery from md's own parity, the degraded-read path.
            let mut holed = data.clone();
            holed[0] = &[];
            holed[3] = &[];
            let (mut a, mut b) = (vec![0u8; CHUNK_BYTES], vec![0u8; CHUNK_BYTES]);
            k.recover_2data(&holed, 0, 3, chunk(pd, stripe), chunk(qd, stripe), &mut a, &mut b);
            assert!(a == data[0] && b == data[3], "{}: stripe {stripe} two-data recovery", k.name());
        }
        if chunk(qd, stripe).iter().any(|&b| b != 0) {
            nonzero_q_stripes += 1;
        }
    }
    // The pattern writes 512 bytes every 32 KiB, so every stripe has real parity; an
    // all-zero fixture would make this test vacuous.
    assert_eq!(nonzero_q_stripes, STRIPES);
}
