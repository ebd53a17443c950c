//! Simulator faults, power-loss semantics and determinism, on the storage layer and through
//! SimArray with the small mirror engine.

use uraid_core::testing::MirrorEngine;
use uraid_core::{MemberIo, MemberIoCompletion, MemberIoError, MemberIoOp, Request};
use uraid_sim::*;

const SECTOR: u64 = 512;

#[test]
fn latent_errors_fail_reads_until_rewritten() {
    let mut s = MemberStore::new(1 << 30, true);
    s.write(0, &[9u8; 16384]).unwrap();
    s.add_latent_error(4096, 1024); // sectors 8 and 9
    assert_eq!(s.read(0, 4096).unwrap(), vec![9u8; 4096]);
    assert_eq!(s.read(4096 + 512, 512), Err(MemberIoError::Io));
    assert_eq!(s.read(0, 16384), Err(MemberIoError::Io));
    assert_eq!(s.latent_error_sectors(), 2);
    // Rewriting one of the two sectors repairs only that one.
    s.write(4096, &[1u8; 512]).unwrap();
    assert_eq!(s.read(4096, 512).unwrap(), vec![1u8; 512]);
    assert_eq!(s.read(4096 + 512, 512), Err(MemberIoError::Io));
    s.write(4000, &[2u8; 2000]).unwrap();
    assert_eq!(s.latent_error_sectors(), 0);
    assert!(s.read(0, 16384).is_ok());
}

#[test]
fn power_loss_keeps_flushed_and_drops_unflushed() {
    let mut s = MemberStore::new(1 << 20, true);
    s.write(0, &[1u8; 4096]).unwrap();
    let mark = s.flush_mark();
    s.write(4096, &[2u8; 4096]).unwrap(); // completed after the flush was issued
    s.flush_complete(mark);
    s.write(0, &[3u8; 4096]).unwrap(); // overwrites flushed data, unflushed
    assert_eq!(s.unflushed_writes(), 2);
    let mut rng = Rng::new(1);
    let report = s.power_loss(&PowerLossPolicy::drop_all(), &mut rng, &[]);
    assert_eq!(report.dropped_writes, 2);
    assert_eq!(s.read(0, 4096).unwrap(), vec![1u8; 4096], "flushed data survives, the overwrite is gone");
    assert_eq!(s.read(4096, 4096).unwrap(), vec![0u8; 4096], "not covered by the flush");

    let mut s = MemberStore::new(1 << 20, true);
    s.write(0, &[5u8; 4096]).unwrap();
    let keep = PowerLossPolicy { keep_probability: 1.0, torn_probability: 0.0 };
    s.power_loss(&keep, &mut rng, &[(8192, &[6u8; 512][..])]);
    assert_eq!(s.read(0, 4096).unwrap(), vec![5u8; 4096]);
    assert_eq!(s.read(8192, 512).unwrap(), vec![6u8; 512], "an in-flight write may land too");

    // Without a write cache every completed write is durable at once.
    let mut s = MemberStore::new(1 << 20, false);
    s.write(0, &[7u8; 4096]).unwrap();
    s.power_loss(&PowerLossPolicy::drop_all(), &mut rng, &[]);
    assert_eq!(s.read(0, 4096).unwrap(), vec![7u8; 4096]);
}

#[test]
fn power_loss_reorders_unflushed_writes() {
    // 64 unflushed writes to distinct blocks, each kept with p = 1/2: some later writes
    // survive while earlier ones are lost (a prefix is not what is kept).
    let mut s = MemberStore::new(1 << 20, true);
    for i in 0..64u64 {
        s.write(i * 4096, &[i as u8 + 1; 4096]).unwrap();
    }
    let mut rng = Rng::new(7);
    let policy = PowerLossPolicy { keep_probability: 0.5, torn_probability: 0.0 };
    let r = s.power_loss(&policy, &mut rng, &[]);
    assert_eq!(r.kept_writes + r.dropped_writes, 64);
    let kept: Vec<bool> = (0..64u64).map(|i| s.read(i * 4096, 1).unwrap()[0] != 0).collect();
    let first_lost = kept.iter().position(|k| !k).unwrap();
    assert!(kept[first_lost..].iter().any(|&k| k), "a later write survived an earlier lost one");
    // Overlapping writes: the survivor set decides; the result is one of the written values
    // or the durable one, block by block.
    let mut s = MemberStore::new(1 << 20, true);
    for v in 1..=20u8 {
        s.write(0, &[v; 4096]).unwrap();
    }
    s.power_loss(&policy, &mut rng, &[]);
    let b = s.read(0, 4096).unwrap();
    assert!(b.iter().all(|&x| x == b[0]) && b[0] <= 20);
}

#[test]
fn torn_writes_land_sector_by_sector() {
    let mut s = MemberStore::new(1 << 20, true);
    s.write(0, &[0xAA; 32768]).unwrap();
    s.flush_all();
    s.write(0, &[0xBB; 32768]).unwrap();
    let mut rng = Rng::new(3);
    let r = s.power_loss(&PowerLossPolicy { keep_probability: 1.0, torn_probability: 1.0 }, &mut rng, &[]);
    assert_eq!(r.torn_writes, 1);
    let data = s.read(0, 32768).unwrap();
    let mut old = 0;
    let mut new = 0;
    for sector in data.chunks(SECTOR as usize) {
        // Sectors are atomic: all old or all new, never a mix.
        if sector.iter().all(|&b| b == 0xAA) {
            old += 1;
        } else if sector.iter().all(|&b| b == 0xBB) {
            new += 1;
        } else {
            panic!("mixed sector");
        }
    }
    assert!(old > 0 && new > 0, "a torn write: {old} old and {new} new sectors");
}

#[test]
fn silent_corruption_flips_bits_that_reads_return() {
    let mut s = MemberStore::new(1 << 20, true);
    s.write(0, &[0u8; 65536]).unwrap();
    s.write(0, &[0x55; 65536]).unwrap();
    let touched = s.corrupt(4096, 4096, 5, &mut Rng::new(11));
    assert_eq!(touched.len(), 5);
    let data = s.read(0, 65536).unwrap();
    let bad: Vec<u64> = (0..65536u64).filter(|&i| data[i as usize] != 0x55).collect();
    assert!(!bad.is_empty() && bad.iter().all(|o| touched.contains(o) && (4096..8192).contains(o)));
}

fn disks(profile: &str, n: usize, seed: u64) -> SimDisks {
    let members = (0..n).map(|_| SimMemberConfig::builtin(profile, 1 << 30).unwrap()).collect();
    SimDisks::new(members, seed).unwrap()
}

fn run_all(d: &mut SimDisks) -> Vec<MemberIoCompletion> {
    let mut out = Vec::new();
    while d.run_next(&mut out).is_some() {}
    out
}

fn rd(id: u64, member: usize, offset_bytes: u64, len_bytes: u64) -> MemberIo {
    MemberIo { id, member, op: MemberIoOp::Read, offset_bytes, len_bytes, data: Default::default() }
}

#[test]
fn fail_stop_and_slow_member() {
    let mut d = disks("hdd-7200-2009", 2, 5);
    for i in 0..8 {
        d.submit(rd(i, 0, i * (64 << 20), 4096));
    }
    d.fail_member(0);
    d.submit(rd(100, 0, 0, 4096));
    let out = run_all(&mut d);
    assert_eq!(out.len(), 9);
    assert!(out.iter().all(|c| c.result == Err(MemberIoError::Gone)));
    assert!(d.is_failed(0) && d.is_idle());

    // The same I/O on a 10x slow member takes 10x as long.
    let time_one = |slow: bool| {
        let mut d = disks("ssd-sata", 1, 5);
        if slow {
            d.schedule(Fault {
                trigger: FaultTrigger::AtNs(0),
                member: 0,
                kind: FaultKind::Slow { latency_percent: 1000 },
            });
            run_all(&mut d);
        }
        let t0 = d.now_ns();
        d.submit(rd(1, 0, 0, 4096));
        run_all(&mut d);
        d.now_ns() - t0
    };
    assert_eq!(time_one(true), time_one(false) * 10);
}

#[test]
fn faults_by_io_count() {
    let mut d = disks("nvme", 1, 9);
    d.schedule(Fault {
        trigger: FaultTrigger::AfterMemberIos(3),
        member: 0,
        kind: FaultKind::LatentErrors { offset_bytes: 0, len_bytes: 4096 },
    });
    for i in 0..6 {
        d.submit(rd(i, 0, 0, 4096));
        run_all(&mut d);
    }
    assert_eq!(d.fault_log().len(), 1);
    assert_eq!(d.stats(0).errors, 3, "reads after the third failed");
}

#[test]
fn flush_waits_for_queued_writes_and_makes_them_durable() {
    let mut d = disks("hdd-7200-2009", 1, 2);
    let w = |id, off: u64, v: u8| MemberIo {
        id,
        member: 0,
        op: MemberIoOp::Write,
        offset_bytes: off,
        len_bytes: 4096,
        data: vec![v; 4096].into(),
    };
    d.submit(w(1, 0, 1));
    d.submit(w(2, 1 << 29, 2));
    d.submit(MemberIo {
        id: 3,
        member: 0,
        op: MemberIoOp::Flush,
        offset_bytes: 0,
        len_bytes: 0,
        data: Default::default(),
    });
    let out = run_all(&mut d);
    assert_eq!(out.iter().map(|c| c.id).collect::<Vec<_>>(), vec![1, 2, 3], "FLUSH is not reordered");
    d.submit(w(4, 8192, 4));
    run_all(&mut d);
    d.power_loss(&PowerLossPolicy::drop_all());
    let s = d.store(0);
    assert_eq!(s.read(0, 4096).unwrap(), vec![1; 4096]);
    assert_eq!(s.read(1 << 29, 4096).unwrap(), vec![2; 4096]);
    assert_eq!(s.read(8192, 4096).unwrap(), vec![0; 4096]);
}

/// A seeded random workload with faults through SimArray + MirrorEngine.
fn workload(seed: u64) -> (u64, u64, Vec<(u64, u64)>) {
    let mut d = disks("hdd-7200-2009", 3, seed);
    d.schedule(Fault { trigger: FaultTrigger::AfterMemberIos(150), member: 2, kind: FaultKind::FailStop });
    d.schedule(Fault {
        trigger: FaultTrigger::AtNs(300_000_000),
        member: 1,
        kind: FaultKind::Corrupt { offset_bytes: 0, len_bytes: 1 << 20, bit_flips: 4 },
    });
    d.schedule(Fault {
        trigger: FaultTrigger::AtNs(0),
        member: 0,
        kind: FaultKind::Slow { latency_percent: 150 },
    });
    let mut array = SimArray::new(MirrorEngine::new(3, 1 << 30, 0), d);
    let mut rng = Rng::derive(seed, 1);
    let mut t = 0;
    for id in 0..400u64 {
        t += rng.below(2_000_000);
        let off = rng.below(1 << 16) * 4096;
        let req = match rng.below(10) {
            0 => Request::flush(id),
            1..=4 => Request::write(id, off, vec![id as u8; 4096 * (1 + rng.below(4) as usize)]),
            _ => Request::read(id, off, 4096),
        };
        array.submit_at(t, req);
    }
    assert_eq!(array.run_until_idle(), RunOutcome::Idle);
    let done: Vec<(u64, u64)> =
        array.completions().iter().map(|c| (c.completion.id, c.completed_ns)).collect();
    assert_eq!(done.len(), 400);
    (array.disks().trace_hash(), array.disks().completed_ios(), done)
}

#[test]
fn same_seed_same_trace_different_seed_different_trace() {
    let a = workload(1234);
    let b = workload(1234);
    let c = workload(1235);
    assert_eq!(a, b);
    assert_ne!(a.0, c.0);
    eprintln!("seed 1234: trace {:016x}, {} member I/Os", a.0, a.1);
}

#[test]
fn sim_array_power_loss_and_restart() {
    let mut d = disks("ssd-sata", 2, 77);
    d.schedule(Fault {
        trigger: FaultTrigger::AfterMemberIos(40),
        member: 0,
        kind: FaultKind::PowerLoss(PowerLossPolicy::drop_all()),
    });
    let mut array = SimArray::new(MirrorEngine::new(2, 1 << 30, 0), d);
    for i in 0..10u64 {
        array.submit_at(i * 1000, Request::write(i, i * 4096, vec![i as u8 + 1; 4096]));
    }
    array.submit_at(1_000_000, Request::flush(100));
    for i in 0..50u64 {
        array.submit_at(2_000_000 + i * 1000, Request::write(200 + i, i * 4096, vec![0xEE; 4096]));
    }
    let outcome = array.run_until_idle();
    assert!(matches!(outcome, RunOutcome::PowerLost { .. }), "{outcome:?}");
    let crash = array.crash(&PowerLossPolicy::drop_all());
    assert!(crash.completions.iter().any(|c| c.completion.id == 100), "the flush was acknowledged");
    assert!(!crash.unacknowledged.is_empty());
    // Everything acknowledged before the acknowledged flush is there; the rest dropped.
    let mut array = SimArray::new(MirrorEngine::new(2, 1 << 30, 0), crash.disks);
    for i in 0..10u64 {
        array.submit(Request::read(1000 + i, i * 4096, 4096));
    }
    assert_eq!(array.run_until_idle(), RunOutcome::Idle);
    for c in array.take_completions() {
        let i = c.completion.id - 1000;
        assert_eq!(c.completion.result, Ok(vec![i as u8 + 1; 4096]));
        assert!(c.completed_ns > c.submitted_ns);
    }
}

#[test]
fn run_until_stops_at_the_time_and_stats_cover_it() {
    let mut array = SimArray::new(MirrorEngine::new(1, 1 << 30, 0), disks("hdd-7200-2009", 1, 4));
    for i in 0..100u64 {
        array.submit_at(0, Request::read(i, i * (8 << 20), 4096));
    }
    assert_eq!(array.run_until(100_000_000), RunOutcome::TimeReached);
    assert_eq!(array.now_ns(), 100_000_000);
    let done = array.completions().len();
    assert!(done > 0 && done < 100);
    assert_eq!(array.run_until_idle(), RunOutcome::Idle);
    let s = array.disks_mut().stats(0).clone();
    assert_eq!(s.reads, 100);
    assert_eq!(s.max_queue_depth, 64, "the mirror engine lets 64 requests in flight");
    assert!(s.mean_queue_depth() > 10.0);
    assert!(s.busy_ns > 0 && s.busy_ns <= array.now_ns());
}
