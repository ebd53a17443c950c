use super::*;

fn hdd() -> HddModel {
    match DiskProfile::builtin("hdd-7200-2009").unwrap() {
        DiskProfile::Hdd(p) => HddModel::new(p, 0),
        _ => unreachable!(),
    }
}

/// Runs `steps` starts on two models of `profile`, one picking as `start` does and
/// one by the full scan, over a queue kept at a wandering depth with random and
/// sequential reads and writes in the first `span_bytes` of the disk. Returns the picks
/// that were not the oldest (so a caller can check the workload reorders at all).
fn compare_picks(profile: &str, span_bytes: u64, seed: u64, steps: usize) -> usize {
    let p = match DiskProfile::builtin(profile).unwrap() {
        DiskProfile::Hdd(p) => p,
        _ => unreachable!(),
    };
    let span_bytes = span_bytes.min(p.capacity_bytes);
    let max_wait = p.max_queue_wait_ns;
    let mut fast = HddModel::new(p.clone(), seed.wrapping_mul(7919));
    assert!(fast.prune, "{profile}: the pick compared must be the bounded search");
    let mut full = HddModel::new(p, seed.wrapping_mul(7919));
    let mut rng = crate::Rng::new(seed);
    let (mut queue, mut seq, mut now) = (Vec::<QueuedIo>::new(), 0u64, 0u64);
    let mut cursors = [0u64, span_bytes / 3, span_bytes / 2];
    let mut reordered = 0;
    for step in 0..steps {
        let depth = 1 + (step / 97 % 32);
        while queue.len() < depth {
            let len = [512u64, 4096, 4096, 65536][rng.below(4) as usize];
            let write = rng.below(3) == 0;
            let offset = if rng.below(2) == 0 {
                let c = &mut cursors[rng.below(3) as usize];
                if *c + len > span_bytes {
                    *c = 0;
                }
                *c += len;
                *c - len
            } else {
                rng.below((span_bytes - len) / 512) * 512
            };
            let op = if write { MemberIoOp::Write } else { MemberIoOp::Read };
            queue.push(QueuedIo { op, offset_bytes: offset, len_bytes: len, arrival_ns: now, seq });
            seq += 1;
        }
        let (i, t) = fast.start(&queue, now);
        let starving = queue[0].arrival_ns.saturating_add(max_wait) <= now;
        let j = if queue.len() > 1 && !starving { full.pick_by_full_scan(&queue, now) } else { 0 };
        let u = full.service(&queue[j], None, now);
        assert_eq!((i, t), (j, u), "step {step}: depth {}", queue.len());
        reordered += usize::from(i != 0);
        queue.remove(i);
        now += t;
    }
    reordered
}

#[test]
fn pick_agrees_with_the_full_scan() {
    for seed in 1..=3 {
        for (profile, span) in [
            ("hdd-7200-2009", 64 << 20),
            ("hdd-7200-2009", u64::MAX),
            ("hdd-7200-2014", 1 << 40),
            ("hdd-sas-7200-2014", 1 << 40),
        ] {
            let reordered = compare_picks(profile, span, seed, 6000);
            assert!(reordered > 1000, "{profile} {span}: only {reordered} picks were not the oldest");
        }
    }
}

#[test]
fn seek_curve_is_continuous_and_monotonic() {
    let m = hdd();
    let b = m.seek_boundary_cylinders;
    assert!((m.seek_ns(b) - (m.seek_c + m.seek_e * b)).abs() < 1.0);
    let mut last = 0.0;
    for d in [1.0, 10.0, 100.0, 1000.0, b, b + 1.0, 100_000.0, 119_999.0] {
        let t = m.seek_ns(d);
        assert!(t >= last, "seek({d}) = {t} < {last}");
        last = t;
    }
    assert!((m.seek_ns(1.0) - 800_000.0).abs() < 1.0);
}

#[test]
fn outer_zone_is_faster() {
    let m = hdd();
    let outer = m.media_ns(0, 1 << 20);
    let inner = m.media_ns(m.p.capacity_bytes - (1 << 20), 1 << 20);
    assert!(inner > outer * 1.5);
}

/// A drive that keeps what it read serves a range again from its buffer; one that
/// does not (seed 001's SAS drives) goes back to the media for it.
#[test]
fn reading_a_range_again() {
    let read = |off: u64, seq: u64, at: u64| QueuedIo {
        op: MemberIoOp::Read,
        offset_bytes: off,
        len_bytes: 128 << 10,
        arrival_ns: at,
        seq,
    };
    for (profile, again_from_buffer) in [("hdd-7200-2014", true), ("hdd-sas-7200-2014", false)] {
        let DiskProfile::Hdd(p) = DiskProfile::builtin(profile).unwrap() else { unreachable!() };
        let bus = p.bus_rate_bytes_per_s;
        let mut m = HddModel::new(p, 0);
        let first = m.start(&[read(1 << 30, 0, 0)], 0).1;
        let t = first + 1_000_000;
        // The next chunk, read ahead meanwhile, comes from the buffer either way.
        let next = m.start(&[read((1 << 30) + (128 << 10), 1, t)], t).1;
        assert!(next < 1_000_000, "{profile}: {next}");
        let t = t + next + 1_000_000;
        // A read further ahead, not touching the first two, between them and the re-read
        // (md's re-read of a row comes after bypassed reads of later rows).
        let ahead = m.start(&[read((1 << 30) + (512 << 10), 2, t)], t).1;
        let t = t + ahead + 1_000_000;
        let again = m.start(&[read(1 << 30, 3, t)], t).1;
        let from_buffer = again < 200_000 + (128 << 10) * 1_000_000_000 / bus;
        assert_eq!(from_buffer, again_from_buffer, "{profile}: reading again took {again} ns");
    }
}
