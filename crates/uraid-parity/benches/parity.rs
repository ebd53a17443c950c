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

fn stripe(block_bytes: usize) -> Vec<Vec<u8>> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..DATA_BLOCKS)
        .map(|_| {
            (0..block_bytes)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

fn bench_kernel(c: &mut Criterion, kernel: Kernel, block_bytes: usize) {
    let blocks = stripe(block_bytes);
    let data: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
    let (mut p, mut q) = (vec![0u8; block_bytes], vec![0u8; block_bytes]);
    kernel.gen_syndrome(&data, &mut p, &mut q);
    let (mut out_a, mut out_b) = (vec![0u8; block_bytes], vec![0u8; block_bytes]);
    let new = blocks[1].iter().map(|b| !b).collect::<Vec<u8>>();
    let id = |op: &str| BenchmarkId::new(op, format!("{}/{}K", kernel.name(), block_bytes / 1024));

    let mut g = c.benchmark_group("parity_8+2");
    g.throughput(Throughput::Bytes((DATA_BLOCKS * block_bytes) as u64));
    g.bench_function(id("gen_syndrome"), |b| {
        b.iter(|| kernel.gen_syndrome(black_box(&data), &mut p, &mut q))
    });
    g.bench_function(id("xor_gen"), |b| b.iter(|| kernel.xor_gen(black_box(&data), &mut p)));
    g.bench_function(id("recover_2data"), |b| {
        let mut holed = data.clone();
        holed[2] = &[];
        holed[5] = &[];
        b.iter(|| kernel.recover_2data(black_box(&holed), 2, 5, &p, &q, &mut out_a, &mut out_b))
    });
    g.finish();

    // The update touches one block, so its throughput is counted in that block's bytes.
    let mut g = c.benchmark_group("parity_rmw");
    g.throughput(Throughput::Bytes(block_bytes as u64));
    g.bench_function(id("rmw_update"), |b| {
        b.iter(|| kernel.rmw_update(1, black_box(&blocks[1]), black_box(&new), &mut p, &mut q))
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
