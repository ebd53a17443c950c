//! The HDD model against the figures its profiles claim (virtual time: runs in well under
//! a second of real time).

use uraid_core::{MemberIo, MemberIoOp};
use uraid_sim::{DiskProfile, Rng, SimDisks, SimMemberConfig};

fn whole_disk(profile: &str) -> SimDisks {
    let p = DiskProfile::builtin(profile).unwrap();
    let cap = p.capacity_bytes();
    SimDisks::new(vec![SimMemberConfig::new(p, cap)], 1).unwrap()
}

/// Issue `ios` one at a time (queue depth 1); returns elapsed virtual ns.
fn run_qd1(disks: &mut SimDisks, ios: impl Iterator<Item = (u64, u64)>) -> u64 {
    let start = disks.now_ns();
    let mut out = Vec::new();
    for (i, (offset_bytes, len_bytes)) in ios.enumerate() {
        disks.submit(MemberIo {
            id: i as u64,
            member: 0,
            op: MemberIoOp::Read,
            offset_bytes,
            len_bytes,
            data: Default::default(),
        });
        while out.is_empty() {
            disks.run_next(&mut out).expect("an event");
        }
        assert!(out.pop().unwrap().result.is_ok());
    }
    disks.now_ns() - start
}

fn random_4k_iops(profile: &str, qd: usize, n: usize) -> f64 {
    let mut disks = whole_disk(profile);
    let cap = disks.store(0).size_bytes();
    let mut rng = Rng::new(99);
    let blocks = cap / 4096;
    let mut out = Vec::new();
    let mut issued = 0;
    let mut done = 0;
    let mut submit_one = |disks: &mut SimDisks, issued: &mut usize| {
        let offset_bytes = rng.below(blocks) * 4096;
        let io = MemberIo {
            id: *issued as u64,
            member: 0,
            op: MemberIoOp::Read,
            offset_bytes,
            len_bytes: 4096,
            data: Default::default(),
        };
        disks.submit(io);
        *issued += 1;
    };
    while issued < qd.min(n) {
        submit_one(&mut disks, &mut issued);
    }
    while done < n {
        out.clear();
        disks.run_next(&mut out).expect("an event");
        for _ in out.drain(..) {
            done += 1;
            if issued < n {
                submit_one(&mut disks, &mut issued);
            }
        }
    }
    n as f64 / (disks.now_ns() as f64 / 1e9)
}

/// 1 MiB sequential reads at queue depth 1, 32 MiB at each of 16 places spread over the disk.
fn sequential_mb_per_s(profile: &str) -> (f64, f64, f64) {
    let mut disks = whole_disk(profile);
    let cap = disks.store(0).size_bytes();
    let chunk = 1u64 << 20;
    let per_place = 32 * chunk;
    let places = 16;
    let mut total_ns = 0;
    let mut first = 0.0;
    let mut last = 0.0;
    for p in 0..places {
        let base = (cap - per_place) / (places - 1) * p / chunk * chunk;
        let ns = run_qd1(&mut disks, (0..32).map(|i| (base + i * chunk, chunk)));
        let rate = per_place as f64 / (ns as f64 / 1e9) / 1e6;
        if p == 0 {
            first = rate;
        }
        last = rate;
        total_ns += ns;
    }
    let avg = (per_place * places) as f64 / (total_ns as f64 / 1e9) / 1e6;
    (avg, first, last)
}

#[test]
fn hdd_7200_2009_calibration() {
    let iops = random_4k_iops("hdd-7200-2009", 1, 3000);
    let (seq, outer, inner) = sequential_mb_per_s("hdd-7200-2009");
    eprintln!("hdd-7200-2009: random 4 KiB QD1 {iops:.1}/s; sequential {seq:.1} MB/s (outer {outer:.1}, inner {inner:.1})");
    assert!((75.0..=85.0).contains(&iops), "random 4 KiB reads/s at QD1: {iops:.1}");
    assert!((100.0..=110.0).contains(&seq), "sequential MB/s over the disk: {seq:.1}");
    assert!(outer > inner * 1.4, "zoned: outer {outer:.1} inner {inner:.1}");
}

#[test]
fn ncq_reordering_raises_random_iops() {
    let qd1 = random_4k_iops("hdd-7200-2009", 1, 2000);
    let qd32 = random_4k_iops("hdd-7200-2009", 32, 4000);
    eprintln!("hdd-7200-2009 random 4 KiB: QD1 {qd1:.1}/s, QD32 {qd32:.1}/s");
    // Shortest-positioning-time-first over 32 commands roughly doubles a drive's random IOPS.
    assert!(qd32 > qd1 * 1.6, "QD32 {qd32:.1} vs QD1 {qd1:.1}");
}

#[test]
fn other_profiles_are_sane() {
    let hdd14 = random_4k_iops("hdd-7200-2014", 1, 1000);
    let (seq14, _, _) = sequential_mb_per_s("hdd-7200-2014");
    let ssd = random_4k_iops("ssd-sata", 32, 20_000);
    let nvme = random_4k_iops("nvme", 256, 50_000);
    eprintln!("hdd-7200-2014 {hdd14:.1}/s {seq14:.1} MB/s; ssd-sata QD32 {ssd:.0}/s; nvme QD256 {nvme:.0}/s");
    assert!((70.0..=100.0).contains(&hdd14));
    assert!((120.0..=170.0).contains(&seq14));
    assert!((50_000.0..=140_000.0).contains(&ssd));
    assert!(nvme > 250_000.0);
}

#[test]
fn hdd_7200_2008_calibration() {
    let iops = random_4k_iops("hdd-7200-2008", 1, 3000);
    let (seq, outer, inner) = sequential_mb_per_s("hdd-7200-2008");
    eprintln!("hdd-7200-2008: random 4 KiB QD1 {iops:.1}/s; sequential {seq:.1} MB/s (outer {outer:.1}, inner {inner:.1})");
    // Seed 003's one stream on one drive, at the start of the disk (docs/experiments.md).
    assert!((98.0..=108.0).contains(&outer), "outer MB/s: {outer:.1}");
    assert!((75.0..=90.0).contains(&seq), "sequential MB/s over the disk: {seq:.1}");
    assert!((70.0..=85.0).contains(&iops), "random 4 KiB reads/s at QD1: {iops:.1}");
}
