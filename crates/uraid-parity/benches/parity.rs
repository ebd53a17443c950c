//! Criterion view of the kernels, in cache: 8 data + P + Q, every kernel at 64 KiB per
//! block and the selected kernel at 4 KiB and 1 MiB. The out-of-cache runs and the
//! ISA-L comparison are in `uraid bench parity`, which controls the working set.
//!
//! Run: `cargo bench -p uraid-parity --bench parity`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
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

fn bench_kernel(c: &mut Criterion, kernel: Kernel, block_bytes: usize) {
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
    let id = |op: &str| BenchmarkId::new(op, format!("{}/{}K", kernel.name(), block_bytes / 1024));

    let mut g = c.benchmark_group("parity_8+2");
    g.throughput(Throughput::Bytes((DATA_BLOCKS * block_bytes) as u64));
    g.bench_function(id("gen_syndrome"), |b| b.iter(|| kernel.gen_syndrome(black_box(&data), p, q)));
    g.bench_function(id("xor_gen"), |b| b.iter(|| kernel.xor_gen(black_box(&data), p)));
    g.bench_function(id("recover_2data"), |b| {
        let mut holed = data.clone();
        holed[2] = &[];
        holed[5] = &[];
        b.iter(|| kernel.recover_2data(black_box(&holed), 2, 5, p, q, out_a, out_b))
    });
    g.finish();

    // The update touches one block, so its throughput is counted in that block's bytes.
    let mut g = c.benchmark_group("parity_rmw");
    g.throughput(Throughput::Bytes(block_bytes as u64));
    g.bench_function(id("rmw_update"), |b| {
        b.iter(|| kernel.rmw_update(1, black_box(data[1]), black_box(&*new), p, q))
    });
    g.finish();
}

fn parity(c: &mut Criterion) {
    for kernel in available_kernels() {
        bench_kernel(c, kernel, 64 * 1024);
    }
    let best = selected_kernel();
    bench_kernel(c, best, 4 * 1024);
    bench_kernel(c, best, 1024 * 1024);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = parity
}
criterion_main!(benches);
