//! Every kernel the CPU supports against the byte-wise reference, and exhaustive
//! recovery of every two lost members of a 16-disk RAID6 (as lib/raid6/test does).

use uraid_parity::{available_kernels, reference, Kernel};

/// splitmix64: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf.iter_mut() {
            *b = self.next() as u8;
        }
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Blocks carved out of one buffer at odd offsets, so no kernel sees aligned pointers
/// by accident.
struct Stripe {
    buf: Vec<u8>,
    len: usize,
    count: usize,
    misalign: usize,
}

impl Stripe {
    fn random(rng: &mut Rng, count: usize, len: usize) -> Stripe {
        let misalign = rng.below(64);
        let mut buf = vec![0u8; misalign + count * len];
        rng.fill(&mut buf);
        Stripe { buf, len, count, misalign }
    }
    fn blocks(&self) -> Vec<&[u8]> {
        (0..self.count).map(|i| &self.buf[self.misalign + i * self.len..][..self.len]).collect()
    }
}

fn kernels() -> Vec<Kernel> {
    let ks = available_kernels();
    eprintln!("testing kernels: {:?}", ks.iter().map(|k| k.name()).collect::<Vec<_>>());
    ks
}

/// Lengths around every vector width and unroll step, plus odd tails.
const LENGTHS: [usize; 14] = [1, 7, 8, 15, 31, 33, 64, 100, 255, 256, 257, 1000, 1024, 4096 + 77];

fn data_counts() -> Vec<usize> {
    (1..=32).chain([100, 253, 255]).collect()
}

#[test]
fn gen_syndrome_and_xor_gen_match_reference() {
    let mut rng = Rng(1);
    for n in data_counts() {
        for &len in &LENGTHS {
            if n > 32 && len > 1024 {
                continue;
            }
            let stripe = Stripe::random(&mut rng, n, len);
            let data = stripe.blocks();
            let (mut p_ref, mut q_ref) = (vec![0u8; len], vec![0u8; len]);
            reference::gen_syndrome(&data, &mut p_ref, &mut q_ref);
            for k in kernels_cached() {
                let (mut p, mut q) = (vec![0xa5u8; len + 1], vec![0x5au8; len + 3]);
                // Odd output offsets too.
                k.gen_syndrome(&data, &mut p[1..], &mut q[3..]);
                assert_eq!(&p[1..], &p_ref[..], "{} gen P n={n} len={len}", k.name());
                assert_eq!(&q[3..], &q_ref[..], "{} gen Q n={n} len={len}", k.name());
                let mut x = vec![0u8; len];
                k.xor_gen(&data, &mut x);
                assert_eq!(x, p_ref, "{} xor_gen n={n} len={len}", k.name());
            }
        }
    }
}

#[test]
fn large_blocks_use_streaming_stores_and_still_match() {
    // Past STREAM_MIN_STRIPE_BYTES the kernels switch store type; cover both alignments.
    let mut rng = Rng(2);
    let len = uraid_parity::STREAM_MIN_STRIPE_BYTES / 4 + 64 + 5;
    let stripe = Stripe::random(&mut rng, 4, len);
    let data = stripe.blocks();
    let (mut p_ref, mut q_ref) = (vec![0u8; len], vec![0u8; len]);
    reference::gen_syndrome(&data, &mut p_ref, &mut q_ref);
    let (mut pu_ref, mut qu_ref) = (p_ref.clone(), q_ref.clone());
    reference::rmw_update(2, data[2], data[0], &mut pu_ref, &mut qu_ref);
    for k in kernels_cached() {
        // The update path prefetches blocks this large.
        let (mut pu, mut qu) = (p_ref.clone(), q_ref.clone());
        k.rmw_update(2, data[2], data[0], &mut pu, &mut qu);
        assert!(pu == pu_ref && qu == qu_ref, "{} rmw_update", k.name());
        for shift in [0usize, 64, 1] {
            let mut p = vec![0u8; len + 128];
            let mut q = vec![0u8; len + 128];
            let pa = (64 - p.as_ptr() as usize % 64) % 64 + shift;
            let qa = (64 - q.as_ptr() as usize % 64) % 64 + shift;
            k.gen_syndrome(&data, &mut p[pa..pa + len], &mut q[qa..qa + len]);
            assert!(p[pa..pa + len] == p_ref[..], "{} P shift {shift}", k.name());
            assert!(q[qa..qa + len] == q_ref[..], "{} Q shift {shift}", k.name());
            k.xor_gen(&data, &mut p[pa..pa + len]);
            assert!(p[pa..pa + len] == p_ref[..], "{} xor_gen shift {shift}", k.name());
            // Recovery writes its output the same way.
            let (a, b) = (1, 3);
            let mut holed = data.clone();
            holed[a] = &[];
            k.recover_data_from_p(&holed, a, &p_ref, &mut p[pa..pa + len]);
            assert!(p[pa..pa + len] == *data[a], "{} from P shift {shift}", k.name());
            k.recover_data_from_q(&holed, a, &q_ref, &mut q[qa..qa + len]);
            assert!(q[qa..qa + len] == *data[a], "{} from Q shift {shift}", k.name());
            holed[b] = &[];
            k.recover_2data(&holed, a, b, &p_ref, &q_ref, &mut p[pa..pa + len], &mut q[qa..qa + len]);
            assert!(p[pa..pa + len] == *data[a], "{} 2data a shift {shift}", k.name());
            assert!(q[qa..qa + len] == *data[b], "{} 2data b shift {shift}", k.name());
        }
    }
}

/// Streaming stores need aligned P and Q, and the streaming loops differ from the cached
/// ones (vectors per step, prefetch ahead): both stores, every block count and length,
/// with the data misaligned.
#[test]
fn gen_syndrome_with_either_store_matches_reference_at_every_count_and_length() {
    use uraid_parity::Stores;
    let mut rng = Rng(9);
    for n in data_counts() {
        for &len in &LENGTHS {
            if n > 32 && len > 1024 {
                continue;
            }
            let stripe = Stripe::random(&mut rng, n, len);
            let data = stripe.blocks();
            let (mut p_ref, mut q_ref) = (vec![0u8; len], vec![0u8; len]);
            reference::gen_syndrome(&data, &mut p_ref, &mut q_ref);
            let (mut p, mut q) = (vec![0u8; len + 64], vec![0u8; len + 64]);
            let pa = (64 - p.as_ptr() as usize % 64) % 64;
            let qa = (64 - q.as_ptr() as usize % 64) % 64;
            for k in kernels_cached() {
                for stores in [Stores::Cached, Stores::Streaming] {
                    k.gen_syndrome_with(&data, &mut p[pa..pa + len], &mut q[qa..qa + len], stores);
                    assert!(p[pa..pa + len] == p_ref[..], "{} {stores:?} P n={n} len={len}", k.name());
                    assert!(q[qa..qa + len] == q_ref[..], "{} {stores:?} Q n={n} len={len}", k.name());
                }
            }
        }
    }
}

#[test]
fn every_store_choice_gives_the_same_parity() {
    use uraid_parity::Stores;
    let mut rng = Rng(8);
    for len in [64 * 1024, 4096 + 64 + 3] {
        let stripe = Stripe::random(&mut rng, 6, len);
        let data = stripe.blocks();
        let (mut p_ref, mut q_ref) = (vec![0u8; len], vec![0u8; len]);
        reference::gen_syndrome(&data, &mut p_ref, &mut q_ref);
        for k in kernels_cached() {
            for stores in [Stores::Auto, Stores::Cached, Stores::Streaming] {
                let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
                k.gen_syndrome_with(&data, &mut p, &mut q, stores);
                assert!(p == p_ref && q == q_ref, "{} {stores:?} len={len}", k.name());
                k.xor_gen_with(&data, &mut q, stores);
                assert!(q == p_ref, "{} xor {stores:?} len={len}", k.name());
            }
        }
    }
}

#[test]
fn xor_syndrome_and_rmw_update_match_reference() {
    let mut rng = Rng(3);
    for n in data_counts() {
        for &len in &[1usize, 33, 257, 1000, 4096 + 77] {
            if n > 32 && len > 1024 {
                continue;
            }
            let stripe = Stripe::random(&mut rng, n, len);
            let data = stripe.blocks();
            let (mut p0, mut q0) = (vec![0u8; len], vec![0u8; len]);
            rng.fill(&mut p0);
            rng.fill(&mut q0);
            let start = rng.below(n);
            let stop = start + rng.below(n - start);
            // Blocks outside start..=stop may be empty: prove they are not read.
            let mut partial = data.clone();
            for (i, d) in partial.iter_mut().enumerate() {
                if i < start || i > stop {
                    *d = &[];
                }
            }
            let (mut p_ref, mut q_ref) = (p0.clone(), q0.clone());
            reference::xor_syndrome(&data, start, stop, &mut p_ref, &mut q_ref);
            let index = rng.below(n);
            let new = Stripe::random(&mut rng, 1, len);
            let (mut pu_ref, mut qu_ref) = (p0.clone(), q0.clone());
            reference::rmw_update(index, data[index], new.blocks()[0], &mut pu_ref, &mut qu_ref);
            for k in kernels_cached() {
                let (mut p, mut q) = (p0.clone(), q0.clone());
                k.xor_syndrome(&partial, start, stop, &mut p, &mut q);
                assert_eq!(p, p_ref, "{} xor_syndrome P n={n} {start}..={stop} len={len}", k.name());
                assert_eq!(q, q_ref, "{} xor_syndrome Q n={n} {start}..={stop} len={len}", k.name());
                let (mut p, mut q) = (p0.clone(), q0.clone());
                k.rmw_update(index, data[index], new.blocks()[0], &mut p, &mut q);
                assert_eq!(p, pu_ref, "{} rmw P n={n} index={index} len={len}", k.name());
                assert_eq!(q, qu_ref, "{} rmw Q n={n} index={index} len={len}", k.name());
            }
        }
    }
}

#[test]
fn rmw_update_equals_regenerating_the_stripe() {
    // The algebra, not just agreement with the reference: update then compare with a
    // fresh gen_syndrome of the rewritten stripe, for every index up to 254.
    let mut rng = Rng(4);
    let (n, len) = (255, 96 + 5);
    let stripe = Stripe::random(&mut rng, n, len);
    let mut blocks: Vec<Vec<u8>> = stripe.blocks().iter().map(|b| b.to_vec()).collect();
    for k in kernels_cached() {
        let refs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        k.gen_syndrome(&refs, &mut p, &mut q);
        for index in (0..n).step_by(7).chain([n - 1]) {
            let mut new = vec![0u8; len];
            rng.fill(&mut new);
            k.rmw_update(index, &blocks[index], &new, &mut p, &mut q);
            blocks[index] = new;
        }
        let refs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
        let (mut p2, mut q2) = (vec![0u8; len], vec![0u8; len]);
        reference::gen_syndrome(&refs, &mut p2, &mut q2);
        assert_eq!((p, q), (p2, q2), "{}", k.name());
    }
}

#[test]
fn recovery_matches_reference_across_counts_and_lengths() {
    let mut rng = Rng(5);
    for n in data_counts() {
        for &len in &[1usize, 31, 64 + 9, 1000, 4096 + 77] {
            if n > 32 && len > 1024 {
                continue;
            }
            let stripe = Stripe::random(&mut rng, n, len);
            let data = stripe.blocks();
            let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
            reference::gen_syndrome(&data, &mut p, &mut q);
            let a = rng.below(n);
            let mut holed = data.clone();
            holed[a] = &[];
            for k in kernels_cached() {
                let mut out = vec![0u8; len];
                k.recover_data_from_p(&holed, a, &p, &mut out);
                assert_eq!(out, data[a], "{} from P n={n} lost={a} len={len}", k.name());
                let mut out = vec![0u8; len];
                k.recover_data_from_q(&holed, a, &q, &mut out);
                assert_eq!(out, data[a], "{} from Q n={n} lost={a} len={len}", k.name());
            }
            if n >= 2 {
                let b = (a + 1 + rng.below(n - 1)) % n;
                let mut holed = data.clone();
                holed[a] = &[];
                holed[b] = &[];
                for k in kernels_cached() {
                    let (mut oa, mut ob) = (vec![0u8; len], vec![0u8; len]);
                    k.recover_2data(&holed, a, b, &p, &q, &mut oa, &mut ob);
                    assert_eq!(oa, data[a], "{} 2data a n={n} lost={a},{b} len={len}", k.name());
                    assert_eq!(ob, data[b], "{} 2data b n={n} lost={a},{b} len={len}", k.name());
                }
            }
        }
    }
}

/// 16 disks = 14 data + P + Q; every pair of failed members, every kernel.
#[test]
fn exhaustive_two_failures_at_16_disks() {
    const DISKS: usize = 16;
    const DATA: usize = DISKS - 2;
    const P: usize = DATA;
    const Q: usize = DATA + 1;
    let len = 4096 + 13;
    let mut rng = Rng(6);
    let stripe = Stripe::random(&mut rng, DATA, len);
    let data = stripe.blocks();
    let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
    reference::gen_syndrome(&data, &mut p, &mut q);
    for k in kernels_cached() {
        for a in 0..DISKS {
            for b in a + 1..DISKS {
                let mut holed = data.clone();
                for lost in [a, b] {
                    if lost < DATA {
                        holed[lost] = &[];
                    }
                }
                let (mut oa, mut ob) = (vec![0u8; len], vec![0u8; len]);
                let what = format!("{} lost {a},{b}", k.name());
                match (a, b) {
                    (P, Q) => {
                        k.gen_syndrome(&data, &mut oa, &mut ob);
                        assert!(oa == p && ob == q, "{what}");
                    }
                    (_, P) => {
                        k.recover_data_from_q(&holed, a, &q, &mut oa);
                        assert!(oa == data[a], "{what}");
                        let mut full = holed.clone();
                        full[a] = &oa;
                        k.xor_gen(&full, &mut ob);
                        assert!(ob == p, "{what}");
                    }
                    (_, Q) => {
                        k.recover_data_from_p(&holed, a, &p, &mut oa);
                        assert!(oa == data[a], "{what}");
                        let mut full = holed.clone();
                        full[a] = &oa;
                        let mut p2 = vec![0u8; len];
                        k.gen_syndrome(&full, &mut p2, &mut ob);
                        assert!(ob == q, "{what}");
                    }
                    _ => {
                        k.recover_2data(&holed, a, b, &p, &q, &mut oa, &mut ob);
                        assert!(oa == data[a] && ob == data[b], "{what}");
                        // Argument order must not matter.
                        k.recover_2data(&holed, b, a, &p, &q, &mut ob, &mut oa);
                        assert!(oa == data[a] && ob == data[b], "{what} swapped");
                    }
                }
            }
        }
    }
}

#[test]
fn free_functions_use_a_supported_kernel_and_agree() {
    let k = uraid_parity::selected_kernel();
    assert!(k.is_available());
    let mut rng = Rng(7);
    let stripe = Stripe::random(&mut rng, 8, 4096);
    let data = stripe.blocks();
    let (mut p, mut q, mut p_ref, mut q_ref) = (vec![0; 4096], vec![0; 4096], vec![0; 4096], vec![0; 4096]);
    uraid_parity::gen_syndrome(&data, &mut p, &mut q);
    reference::gen_syndrome(&data, &mut p_ref, &mut q_ref);
    assert!(p == p_ref && q == q_ref);
}

#[test]
fn kernel_names_round_trip() {
    for k in uraid_parity::ALL_KERNELS {
        assert_eq!(Kernel::from_name(k.name()), Some(k));
    }
    assert!(Kernel::Scalar.is_available());
    assert_eq!(Kernel::from_name("sse2"), None);
}

fn kernels_cached() -> Vec<Kernel> {
    use std::sync::OnceLock;
    static KS: OnceLock<Vec<Kernel>> = OnceLock::new();
    KS.get_or_init(kernels).clone()
}
