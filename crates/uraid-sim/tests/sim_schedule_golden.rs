//! The HDD model's schedules pinned: a mixed workload at NCQ depth on whole and partial
//! disks must give the same trace hash and virtual time as when the values were recorded.
//! The model's pick is hot and gets optimised; an optimisation that changes which command
//! goes next (a tie broken differently, a rounding moved) changes every experiment's
//! numbers, and the same-run-twice tests cannot see that. A deliberate change to the
//! model's behaviour re-records the values here and says so in its commit.

use uraid_core::{MemberIo, MemberIoOp};
use uraid_sim::{DiskProfile, Rng, SimDisks, SimMemberConfig};

/// (trace hash, virtual ns at the end, completed I/Os)
fn run(profile: &str, member_bytes: u64, qd: usize, total: u64, seed: u64) -> (u64, u64, u64) {
    let p = DiskProfile::builtin(profile).unwrap();
    let member_bytes = member_bytes.min(p.capacity_bytes());
    let members = 3;
    let configs = (0..members).map(|_| SimMemberConfig::new(p.clone(), member_bytes)).collect();
    let mut disks = SimDisks::new(configs, seed).unwrap();
    let mut rng = Rng::new(seed ^ 0x60_1DE0);
    let sectors = member_bytes / 512;
    // A few sequential streams per member, so read-ahead hits, streams and write-cache
    // streaming all take part in the picks, not only mechanical positioning.
    let mut cursors: Vec<[u64; 3]> = (0..members)
        .map(|_| [rng.below(sectors / 2) * 512, rng.below(sectors / 2) * 512, rng.below(sectors / 2) * 512])
        .collect();
    let mut next_id = 0u64;
    let mut make = |member: usize, rng: &mut Rng| -> MemberIo {
        next_id += 1;
        let len = [512u64, 4096, 4096, 4096, 8192, 65536, 131072][rng.below(7) as usize];
        let r = rng.below(100);
        let (op, offset) = if next_id.is_multiple_of(97) {
            (MemberIoOp::Flush, 0)
        } else if r < 40 {
            (MemberIoOp::Read, rng.below((member_bytes - len) / 512) * 512)
        } else if r < 65 {
            let c = &mut cursors[member][rng.below(3) as usize];
            if *c + len > member_bytes {
                *c = 0;
            }
            let o = *c;
            *c += len;
            (MemberIoOp::Read, o)
        } else if r < 75 {
            let c = &mut cursors[member][2];
            if *c + len > member_bytes {
                *c = 0;
            }
            let o = *c;
            *c += len;
            (MemberIoOp::Write, o)
        } else {
            (MemberIoOp::Write, rng.below((member_bytes - len) / 512) * 512)
        };
        let (len, data) = match op {
            MemberIoOp::Flush => (0, Vec::new()),
            MemberIoOp::Write => (len, vec![next_id as u8; len as usize]),
            MemberIoOp::Read => (len, Vec::new()),
        };
        MemberIo { id: next_id, member, op, offset_bytes: offset, len_bytes: len, data: data.into() }
    };
    let mut owner = vec![0usize; total as usize + members * qd + 2];
    let mut in_flight = vec![0usize; members];
    // Each member's depth wanders over 1..=qd, so picks run over every queue length.
    let mut target = vec![qd; members];
    let mut issued = 0u64;
    let mut out = Vec::new();
    let mut done = 0u64;
    loop {
        for m in 0..members {
            while in_flight[m] < target[m] && issued < total {
                let io = make(m, &mut rng);
                owner[io.id as usize] = m;
                in_flight[m] += 1;
                disks.submit(io);
                issued += 1;
            }
        }
        out.clear();
        if done >= total || disks.run_next(&mut out).is_none() {
            break;
        }
        for c in out.drain(..) {
            assert!(c.result.is_ok());
            done += 1;
            let m = owner[c.id as usize];
            in_flight[m] -= 1;
            if rng.below(64) == 0 {
                target[m] = 1 + rng.below(qd as u64) as usize;
            }
        }
    }
    (disks.trace_hash(), disks.now_ns(), disks.completed_ios())
}

#[test]
fn hdd_schedules_are_unchanged() {
    let got = [
        run("hdd-7200-2009", u64::MAX, 32, 30_000, 1),
        run("hdd-7200-2009", 64 << 20, 32, 30_000, 2),
        run("hdd-7200-2014", u64::MAX, 32, 30_000, 3),
        run("hdd-7200-2014", 8 << 30, 8, 20_000, 4),
        run("hdd-7200-2009", 1 << 30, 1, 5_000, 5),
    ];
    let want = [
        (0x62766073655f0cfb, 60996830237, 30000),
        (0xb1cb90f78b68467a, 19579449645, 30000),
        (0xb2ede721b0c9060d, 57458130947, 30000),
        (0x4170d295aceac4af, 21525961835, 20000),
        (0x1ced247d6d447ab7, 8925522589, 5000),
    ];
    for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
        assert_eq!(g, w, "run {i}: got ({:#018x}, {}, {})", g.0, g.1, g.2);
    }
}
