//! The kernels in cache: 8 data + P + Q, every kernel at 64 KiB per block and the selected
//! kernel at 4 KiB and 1 MiB; the median of 20 samples of about 50 ms each. The
//! out-of-cache runs and the ISA-L comparison are in `uraid bench parity`, which controls
//! the working set and prints its peer.
//!
//! Run: `cargo bench -p uraid-parity --bench parity`

use std::hint::black_box;
use std::time::{Duration, Instant};
use uraid_parity::{available_kernels, selected_kernel, Kernel};

const DATA_BLOCKS: usize = 8;

/// Random data blocks, each 64-byte aligned as the engine's buffers are (page-aligned for
/// O_DIRECT): plain `Vec`s are only 16-byte aligned, and then every 64-byte load splits
/// across two cache lines, which slows uraid and ISA-L alike (docs/parity.md, "Aligned
/// blocks").
struct Stripe {
    buf: Vec<u8>,
    offset: usize,
    block_bytes: usize,
}

impl Stripe {
    fn new(block_bytes: usize) -> Stripe {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let buf: Vec<u8> = (0..DATA_BLOCKS * block_bytes + 64)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let offset = (64 - buf.as_ptr() as usize % 64) % 64;
        Stripe { buf, offset, block_bytes }
    }
    fn blocks(&self) -> Vec<&[u8]> {
        (0..DATA_BLOCKS)
            .map(|i| &self.buf[self.offset + i * self.block_bytes..][..self.block_bytes])
            .collect()
    }
}

/// A zeroed 64-byte aligned block: (storage, offset).
fn aligned_block(block_bytes: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; block_bytes + 64];
    let offset = (64 - v.as_ptr() as usize % 64) % 64;
    (v, offset)
}

/// Prints the median GB/s of `op` over `bytes` per call: 300 ms of warm-up, then 20 samples.
fn measure(name: &str, bytes: usize, mut op: impl FnMut()) {
    let start = Instant::now();
    let mut calls_per_sample = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        op();
        calls_per_sample += 1;
    }
    // About 50 ms a sample at the warm-up's pace.
    calls_per_sample = (calls_per_sample / 6).max(1);
    let mut gbps: Vec<f64> = (0..20)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls_per_sample {
                op();
            }
            (bytes as u64 * calls_per_sample) as f64 / t.elapsed().as_nanos() as f64
        })
        .collect();
    gbps.sort_by(f64::total_cmp);
    println!("{name:<40} {:>8.2} GB/s (samples {:.2}-{:.2})", gbps[10], gbps[0], gbps[19]);
}

fn bench_kernel(kernel: Kernel, block_bytes: usize) {
    let stripe = Stripe::new(block_bytes);
    let data = stripe.blocks();
    let mut bufs: Vec<(Vec<u8>, usize)> = (0..5).map(|_| aligned_block(block_bytes)).collect();
    let mut views = bufs.iter_mut().map(|(v, o)| &mut v[*o..*o + block_bytes]);
    let (p, q) = (views.next().unwrap(), views.next().unwrap());
    let (out_a, out_b, new) = (views.next().unwrap(), views.next().unwrap(), views.next().unwrap());
    kernel.gen_syndrome(&data, p, q);
    for (n, d) in new.iter_mut().zip(data[1]) {
        *n = !d;
    }
    let id = |op: &str| format!("{op}/{}/{}K", kernel.name(), block_bytes / 1024);
    let stripe_bytes = DATA_BLOCKS * block_bytes;
    measure(&id("gen_syndrome"), stripe_bytes, || kernel.gen_syndrome(black_box(&data), p, q));
    measure(&id("xor_gen"), stripe_bytes, || kernel.xor_gen(black_box(&data), p));
    let mut holed = data.clone();
    holed[2] = &[];
    holed[5] = &[];
    measure(&id("recover_2data"), stripe_bytes, || {
        kernel.recover_2data(black_box(&holed), 2, 5, p, q, out_a, out_b)
    });
    // The update touches one block, so its throughput is counted in that block's bytes.
    measure(&id("rmw_update"), block_bytes, || {
        kernel.rmw_update(1, black_box(data[1]), black_box(&*new), p, q)
    });
}

fn main() {
    println!("parity 8+2, in cache: bytes of data per second");
    for kernel in available_kernels() {
        bench_kernel(kernel, 64 * 1024);
    }
    let best = selected_kernel();
    bench_kernel(best, 4 * 1024);
    bench_kernel(best, 1024 * 1024);
}
