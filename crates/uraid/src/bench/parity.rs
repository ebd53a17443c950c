//! `uraid bench parity`: uraid-parity against Intel ISA-L and the machine's streaming-read
//! bandwidth, single core, in cache (one stripe reused) and out of cache (stripes rotating
//! over a working set larger than the last-level cache).
//!
//! Throughput counts the bytes an operation is about: the data blocks for gen_syndrome
//! and xor_gen, the surviving blocks read for recover_2data, the one rewritten block for
//! rmw_update. Each figure is the median of `--runs` runs; uraid and ISA-L alternate
//! run by run so drift in the machine hits both alike.

#[cfg(feature = "isal")]
mod isal;

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use uraid_parity::Kernel;

#[derive(Args)]
pub struct ParityArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Runs per figure; the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Working set of the out-of-cache rows (K/M/G suffixes); must dwarf the caches.
    #[arg(long, default_value = "1280M", value_parser = crate::size_arg::parse_size_bytes)]
    cold_bytes: u64,
    /// uraid kernel to measure (default: the one uraid-parity selects at start-up).
    #[arg(long)]
    kernel: Option<String>,
    /// Data blocks per stripe, 6..=16 (two parity blocks come on top).
    #[arg(long, default_value_t = 8)]
    data_blocks: usize,
    /// Only these operations (repeatable; default all).
    #[arg(long = "op", value_parser = ["gen_syndrome", "xor_gen", "rmw_update", "recover_2data"])]
    ops: Vec<String>,
    /// Only these block sizes (repeatable; default 4K, 64K and 1M).
    #[arg(long = "block", value_parser = crate::size_arg::parse_size_bytes)]
    blocks: Vec<u64>,
    /// How the out-of-cache stripes lie in memory: `member` (each member's blocks of
    /// consecutive stripes side by side, as a resync or rebuild reads them) or `stripe`
    /// (each stripe's blocks side by side, stripe after stripe).
    #[arg(long, value_enum, default_value_t = Layout::Member)]
    layout: Layout,
}

/// Where block i of stripe s lies in the arena. It decides the out-of-cache rows at small
/// blocks: the streaming read is fast because each of its streams runs on across 4 KiB
/// pages, and so do the kernels' streams when members lie member after member. Stripe
/// after stripe, every stream stops at its 4 KiB block and the next call starts 8 cold ones
/// (docs/parity.md, "Layout: why 4 KiB stripes lie member after member").
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Layout {
    Member,
    Stripe,
}

const BLOCK_SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
/// Hot figures time enough calls to cover this, so timer resolution does not matter.
const HOT_RUN_TIME: Duration = Duration::from_millis(40);
/// Lost blocks in the recovery rows (any two data blocks cost the same).
const LOST: (usize, usize) = (2, 5);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    GenSyndrome,
    XorGen,
    RmwUpdate,
    Recover2Data,
}

impl Op {
    const ALL: [Op; 4] = [Op::GenSyndrome, Op::XorGen, Op::RmwUpdate, Op::Recover2Data];
    fn name(self) -> &'static str {
        match self {
            Op::GenSyndrome => "gen_syndrome",
            Op::XorGen => "xor_gen",
            Op::RmwUpdate => "rmw_update",
            Op::Recover2Data => "recover_2data",
        }
    }
    fn bytes_per_call(self, k: usize, block_bytes: usize) -> usize {
        match self {
            Op::RmwUpdate => block_bytes,
            _ => k * block_bytes,
        }
    }
}

#[derive(Serialize)]
struct Row {
    op: &'static str,
    block_bytes: usize,
    data_blocks: usize,
    cache: &'static str,
    /// How the out-of-cache stripes lie (see [`Layout`]); null for the in-cache rows.
    layout: Option<Layout>,
    #[serde(rename = "impl")]
    imp: String,
    gbps: f64,
    peer_gbps: Option<f64>,
    peer_impl: Option<String>,
    ratio: Option<f64>,
    /// For the out-of-cache rows: the median over runs of the run's GB/s over the mean of
    /// the streaming reads measured just before and after it (1.0 on the stream_read row).
    stream_ratio: Option<f64>,
}

/// Stripes in one 64-byte aligned arena: data blocks 0..k, then P, then Q, each
/// `block_bytes` long, placed as `layout` says.
struct Arena {
    buf: Vec<u8>,
    /// 64-byte aligned start inside `buf`, taken once so block pointers never reborrow it.
    base: *mut u8,
    k: usize,
    block_bytes: usize,
    stripes: usize,
    layout: Layout,
}

impl Arena {
    fn new(k: usize, block_bytes: usize, stripes: usize, layout: Layout) -> Arena {
        let len = (k + 2) * block_bytes * stripes + 64;
        // Filled with data (not left zero) so every page is really backed by memory.
        let mut buf = vec![0u8; len];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for word in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        let offset = (64 - buf.as_ptr() as usize % 64) % 64;
        let base = buf[offset..].as_mut_ptr();
        Arena { buf, base, k, block_bytes, stripes, layout }
    }

    fn resize_view(&mut self, block_bytes: usize) {
        let usable = self.buf.len() - 64;
        self.block_bytes = block_bytes;
        self.stripes = usable / ((self.k + 2) * block_bytes);
    }

    /// All stripes as laid out now, as one slice.
    fn stripes_bytes(&self) -> &[u8] {
        let len = self.stripes * (self.k + 2) * self.block_bytes;
        // SAFETY: base..base+len lies inside `buf` (see new/resize_view).
        unsafe { std::slice::from_raw_parts(self.base, len) }
    }

    /// Block `i` (k = P, k+1 = Q) of stripe `s`.
    fn block(&self, s: usize, i: usize) -> *mut u8 {
        assert!(s < self.stripes && i < self.k + 2);
        let index = match self.layout {
            Layout::Member => i * self.stripes + s,
            Layout::Stripe => s * (self.k + 2) + i,
        };
        // SAFETY: index < stripes * (k + 2), and that many blocks fit in `buf` past `base`
        // (see new/resize_view).
        unsafe { self.base.add(index * self.block_bytes) }
    }
}

#[derive(Clone, Copy)]
enum Impl {
    Uraid(Kernel),
    #[cfg(feature = "isal")]
    IsalEc(isal::Routines),
    #[cfg(feature = "isal")]
    IsalRaid(isal::Routines),
}

impl Impl {
    fn name(self) -> String {
        match self {
            Impl::Uraid(k) => format!("uraid/{}", k.name()),
            #[cfg(feature = "isal")]
            Impl::IsalEc(r) => format!("isa-l-{}/ec{}", isal::VERSION, r.suffix()),
            #[cfg(feature = "isal")]
            Impl::IsalRaid(r) => format!("isa-l-{}/raid{}", isal::VERSION, r.suffix()),
        }
    }
}

struct Ctx {
    #[cfg(feature = "isal")]
    isal: isal::Isal,
    #[cfg(feature = "isal")]
    isal_decode: Vec<u8>,
}

/// Most data blocks `--data-blocks` accepts; keeps the per-call pointer arrays small.
const MAX_DATA_BLOCKS: usize = 16;

/// One operation on stripe `s` of the arena. No allocation, and as few stores as a
/// caller that already holds its block pointers would make: streaming stores end with a
/// store fence, and stores right after it wait for the parity to drain to memory
/// (docs/parity.md, "The store fence"). ISA-L's stores are all cached, so it does not care.
fn exec(ctx: &Ctx, imp: Impl, op: Op, arena: &Arena, s: usize) {
    match imp {
        Impl::Uraid(kernel) => exec_uraid(kernel, op, arena, s),
        #[cfg(feature = "isal")]
        Impl::IsalEc(_) | Impl::IsalRaid(_) => exec_isal(ctx, matches!(imp, Impl::IsalRaid(_)), op, arena, s),
    }
    #[cfg(not(feature = "isal"))]
    let _ = ctx;
}

fn exec_uraid(kernel: Kernel, op: Op, arena: &Arena, s: usize) {
    let (k, len) = (arena.k, arena.block_bytes);
    // SAFETY: every block pointer addresses a distinct `len`-byte block inside the arena,
    // which outlives this call, so the slices below do not overlap one another. `data`
    // is read only in its first k entries, each written just before.
    unsafe {
        let slice = |i: usize| std::slice::from_raw_parts(arena.block(s, i), len);
        let slice_mut = |i: usize| std::slice::from_raw_parts_mut(arena.block(s, i), len);
        let mut data = std::mem::MaybeUninit::<[&[u8]; MAX_DATA_BLOCKS]>::uninit();
        let entries = data.as_mut_ptr() as *mut &[u8];
        for i in 0..k {
            let hole = op == Op::Recover2Data && (i == LOST.0 || i == LOST.1);
            entries.add(i).write(if hole { &[] } else { slice(i) });
        }
        let data = std::slice::from_raw_parts(entries, k);
        match op {
            Op::GenSyndrome => kernel.gen_syndrome(data, slice_mut(k), slice_mut(k + 1)),
            Op::XorGen => kernel.xor_gen(data, slice_mut(k)),
            Op::RmwUpdate => kernel.rmw_update(1, slice(1), slice(0), slice_mut(k), slice_mut(k + 1)),
            Op::Recover2Data => {
                let (out_a, out_b) = (slice_mut(LOST.0), slice_mut(LOST.1));
                kernel.recover_2data(data, LOST.0, LOST.1, slice(k), slice(k + 1), out_a, out_b);
            }
        }
    }
}

#[cfg(feature = "isal")]
fn exec_isal(ctx: &Ctx, raid: bool, op: Op, arena: &Arena, s: usize) {
    let (k, len) = (arena.k, arena.block_bytes);
    let mut ptrs = [std::ptr::null_mut::<u8>(); MAX_DATA_BLOCKS + 2];
    for (i, ptr) in ptrs.iter_mut().enumerate().take(k + 2) {
        *ptr = arena.block(s, i);
    }
    let (p, q) = (ptrs[k], ptrs[k + 1]);
    // SAFETY: every pointer addresses a distinct `len`-byte block inside the arena, which
    // outlives this call.
    unsafe {
        match op {
            Op::GenSyndrome if raid => ctx.isal.pq_gen(&mut ptrs[..k + 2], len),
            Op::GenSyndrome => ctx.isal.ec_gen(&ptrs[..k], p, q, len),
            Op::XorGen => ctx.isal.xor_gen(&mut ptrs[..k + 1], len),
            Op::RmwUpdate => ctx.isal.update(1, ptrs[1], ptrs[0], p, q, len),
            Op::Recover2Data => {
                let (a, b) = (ptrs[LOST.0], ptrs[LOST.1]);
                // Survivors in decode-matrix row order: other data, P, Q.
                let mut survivors = [std::ptr::null_mut::<u8>(); MAX_DATA_BLOCKS];
                let mut n = 0;
                for (i, ptr) in ptrs.iter().enumerate().take(k + 2) {
                    if i != LOST.0 && i != LOST.1 {
                        survivors[n] = *ptr;
                        n += 1;
                    }
                }
                ctx.isal.recover(&ctx.isal_decode, &survivors[..n], a, b, len);
            }
        }
    }
}

/// Seconds per call with one stripe reused (hot), or per stripe over the whole arena
/// once (cold).
fn seconds_per_call(ctx: &Ctx, imp: Impl, op: Op, arena: &Arena, hot: bool) -> f64 {
    if hot {
        exec(ctx, imp, op, arena, 0);
        let started = Instant::now();
        let mut calls = 0u64;
        while started.elapsed() < HOT_RUN_TIME {
            for _ in 0..8 {
                exec(ctx, imp, op, arena, 0);
            }
            calls += 8;
        }
        started.elapsed().as_secs_f64() / calls as f64
    } else {
        let started = Instant::now();
        for s in 0..arena.stripes {
            exec(ctx, imp, op, arena, s);
        }
        started.elapsed().as_secs_f64() / arena.stripes as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Bytes `read_all` reads from one stream before moving to the next: 512 (8 lines) reads
/// faster than the 128 used before, and larger steps gain nothing (docs/parity.md, "The
/// streaming read's chunk: 512 bytes").
const READ_STEP: usize = 512;

/// Reads every byte of `buf` once with wide loads, in `streams` interleaved sequential
/// streams as the parity kernels read their data blocks: one stream alone keeps fewer
/// prefetches in flight and would understate what a core can pull from memory.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_all(buf: &[u8], streams: usize) -> u64 {
    use std::arch::x86_64::*;
    const STEP: usize = READ_STEP;
    let per_stream = buf.len() / streams / STEP * STEP;
    let base = buf.as_ptr();
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut off = 0;
    while off < per_stream {
        for s in 0..streams {
            let ptr = base.add(s * per_stream + off) as *const __m256i;
            for j in 0..STEP / 32 {
                acc[j % 4] = _mm256_xor_si256(acc[j % 4], _mm256_loadu_si256(ptr.add(j)));
            }
        }
        off += STEP;
    }
    let mut out = [0u64; 4];
    let folded = _mm256_xor_si256(_mm256_xor_si256(acc[0], acc[1]), _mm256_xor_si256(acc[2], acc[3]));
    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, folded);
    out.iter().fold(0, |x, y| x ^ y)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn read_all(buf: &[u8], _streams: usize) -> u64 {
    buf.chunks_exact(8).fold(0, |x, c| x ^ u64::from_le_bytes(c.try_into().unwrap()))
}

/// GB/s of one pass over the arena, counting the bytes actually read.
fn stream_read_gbps(arena: &Arena) -> f64 {
    let buf = arena.stripes_bytes();
    let streams = arena.k;
    let started = Instant::now();
    // SAFETY: the caller checked the CPU for AVX2.
    let sum = unsafe { read_all(buf, streams) };
    let secs = started.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    let read_bytes = buf.len() / streams / READ_STEP * READ_STEP * streams;
    read_bytes as f64 / secs / 1e9
}

pub fn run(args: ParityArgs) -> anyhow::Result<()> {
    let kernel = match &args.kernel {
        Some(name) => {
            let k = Kernel::from_name(name).ok_or_else(|| anyhow::anyhow!("no parity kernel {name:?}"))?;
            anyhow::ensure!(k.is_available(), "kernel {name} is not supported by this CPU");
            k
        }
        None => uraid_parity::selected_kernel(),
    };
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    let k = args.data_blocks;
    anyhow::ensure!((6..=MAX_DATA_BLOCKS).contains(&k), "--data-blocks must be 6..={MAX_DATA_BLOCKS}");
    #[cfg(target_arch = "x86_64")]
    anyhow::ensure!(std::arch::is_x86_feature_detected!("avx2"), "the streaming-read probe needs AVX2");

    #[cfg(feature = "isal")]
    let routines = isal_routines_for(kernel);
    let ctx = Ctx {
        #[cfg(feature = "isal")]
        isal: isal::Isal::new(k, routines),
        #[cfg(feature = "isal")]
        isal_decode: isal::Isal::new(k, routines).decode_tables(LOST.0, LOST.1),
    };
    #[cfg(feature = "isal")]
    let peer_note = format!(
        "Intel ISA-L {} ({}), {}",
        isal::VERSION,
        isal::SOURCE,
        match routines {
            isal::Routines::Dispatch => "its own CPU dispatch",
            isal::Routines::Avx2 => {
                "its AVX2 routines (pq_gen_avx2, xor_gen_avx, ec_encode_data_avx2, ec_encode_data_update_avx2)"
            }
        }
    );
    #[cfg(not(feature = "isal"))]
    let peer_note = "none: ISA-L columns need `cargo build --release -p uraid --features isal`".to_string();
    eprintln!(
        "uraid bench parity: {k} data + 2 parity, single core, median of {} runs; uraid kernel {}; cold stripes {}-major; peer {peer_note}",
        args.runs,
        kernel.name(),
        match args.layout {
            Layout::Member => "member",
            Layout::Stripe => "stripe",
        }
    );

    // One arena serves every block size: laid out for the largest, re-viewed for the rest.
    let largest_block = BLOCK_SIZES[BLOCK_SIZES.len() - 1];
    let cold_stripes = (args.cold_bytes as usize).div_ceil((k + 2) * largest_block);
    let mut cold = Arena::new(k, largest_block, cold_stripes, args.layout);
    // Memory bandwidth drifts with what else the machine runs, so the read probe runs
    // once next to every cold run; the stream_read row is the median of all of them.
    let mut stream_runs: Vec<f64> = (0..args.runs).map(|_| stream_read_gbps(&cold)).collect();
    let mut rows = Vec::new();
    let block_sizes: Vec<usize> = if args.blocks.is_empty() {
        BLOCK_SIZES.to_vec()
    } else {
        args.blocks.iter().map(|b| *b as usize).collect()
    };
    anyhow::ensure!(
        block_sizes.iter().all(|b| *b > 0 && *b <= largest_block && b % 64 == 0),
        "--block must be a multiple of 64 bytes, at most 1M"
    );
    let ops: Vec<Op> = Op::ALL
        .into_iter()
        .filter(|op| args.ops.is_empty() || args.ops.iter().any(|o| o == op.name()))
        .collect();
    for block_bytes in block_sizes {
        let hot = Arena::new(k, block_bytes, 1, args.layout);
        cold.resize_view(block_bytes);
        for &op in &ops {
            for hot_run in [true, false] {
                let arena = if hot_run { &hot } else { &cold };
                #[cfg(feature = "isal")]
                let peers: Vec<Impl> = peers_of(op, routines);
                #[cfg(not(feature = "isal"))]
                let peers: Vec<Impl> = Vec::new();
                let mut ours = Vec::new();
                let mut theirs: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
                let bytes = op.bytes_per_call(k, block_bytes) as f64;
                // Each cold run over the mean of the streaming reads measured just before
                // and just after it: memory bandwidth drifts within one bench, and the two
                // reads bracket the run (docs/parity.md, "The streaming read, before and
                // after").
                let mut vs_read = Vec::new();
                for _ in 0..args.runs {
                    let read_before = (!hot_run).then(|| stream_read_gbps(arena));
                    let secs = seconds_per_call(&ctx, Impl::Uraid(kernel), op, arena, hot_run);
                    if let Some(before) = read_before {
                        let after = stream_read_gbps(arena);
                        stream_runs.extend([before, after]);
                        vs_read.push(bytes / secs / 1e9 / ((before + after) / 2.0));
                    }
                    ours.push(secs);
                    for (i, peer) in peers.iter().enumerate() {
                        theirs[i].push(seconds_per_call(&ctx, *peer, op, arena, hot_run));
                    }
                }
                let gbps = bytes / median(ours) / 1e9;
                // Against ISA-L's best for this op.
                let peer = theirs
                    .into_iter()
                    .zip(&peers)
                    .map(|(t, p)| (bytes / median(t) / 1e9, p.name()))
                    .max_by(|a, b| a.0.total_cmp(&b.0));
                rows.push(Row {
                    op: op.name(),
                    block_bytes,
                    data_blocks: k,
                    cache: if hot_run { "hot" } else { "cold" },
                    layout: (!hot_run).then_some(args.layout),
                    imp: Impl::Uraid(kernel).name(),
                    gbps,
                    peer_gbps: peer.as_ref().map(|p| p.0),
                    peer_impl: peer.as_ref().map(|p| p.1.clone()),
                    ratio: peer.as_ref().map(|p| gbps / p.0),
                    stream_ratio: (!hot_run).then(|| median(vs_read)),
                });
            }
        }
    }
    let stream_gbps = median(stream_runs);
    rows.insert(
        0,
        Row {
            op: "stream_read",
            block_bytes: cold.stripes_bytes().len(),
            data_blocks: k,
            cache: "cold",
            layout: Some(args.layout),
            imp: format!("read/avx2 x{k} streams"),
            gbps: stream_gbps,
            peer_gbps: None,
            peer_impl: None,
            ratio: None,
            stream_ratio: Some(1.0),
        },
    );

    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows);
    }
    Ok(())
}

#[cfg(feature = "isal")]
fn peers_of(op: Op, routines: isal::Routines) -> Vec<Impl> {
    match op {
        // ec_encode_data (GFNI on a CPU with it, unless the AVX2 routines are asked
        // for) and the RAID-specific pq_gen.
        Op::GenSyndrome => vec![Impl::IsalEc(routines), Impl::IsalRaid(routines)],
        Op::XorGen => vec![Impl::IsalRaid(routines)],
        Op::RmwUpdate | Op::Recover2Data => vec![Impl::IsalEc(routines)],
    }
}

/// uraid's AVX2 kernel is measured against ISA-L's AVX2 routines, what ISA-L runs on a
/// CPU without AVX-512 or GFNI (AMD Zen 3); on a CPU that has them ISA-L's dispatch
/// would pick wider code than the kernel's. Every other kernel meets ISA-L's own choice.
#[cfg(feature = "isal")]
fn isal_routines_for(kernel: Kernel) -> isal::Routines {
    if kernel == Kernel::Avx2 {
        isal::Routines::Avx2
    } else {
        isal::Routines::Dispatch
    }
}

fn fmt_size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes & ((1 << 20) - 1) == 0 {
        format!("{}M", bytes >> 20)
    } else if bytes & 1023 == 0 {
        format!("{}K", bytes >> 10)
    } else {
        format!("{bytes}")
    }
}

fn print_table(rows: &[Row]) {
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
    println!(
        "{:<14} {:>6} {:>5} {:<20} {:>9} {:>9} {:>6} {:>7}  peer",
        "op", "block", "cache", "impl", "GB/s", "peer GB/s", "ratio", "vs read"
    );
    for r in rows {
        let block = fmt_size(r.block_bytes);
        println!(
            "{:<14} {:>6} {:>5} {:<20} {:>9.2} {:>9} {:>6} {:>7}  {}",
            r.op,
            block,
            r.cache,
            r.imp,
            r.gbps,
            opt(r.peer_gbps, 2),
            opt(r.ratio, 2),
            opt(r.stream_ratio, 2),
            r.peer_impl.as_deref().unwrap_or("-")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_gives_each_block_its_own_bytes_inside_the_arena() {
        for layout in [Layout::Member, Layout::Stripe] {
            let mut arena = Arena::new(6, 4096, 5, layout);
            arena.resize_view(1024);
            let start = arena.base as usize;
            let end = start + arena.stripes_bytes().len();
            let mut blocks: Vec<usize> = (0..arena.stripes)
                .flat_map(|s| (0..arena.k + 2).map(move |i| (s, i)))
                .map(|(s, i)| arena.block(s, i) as usize)
                .collect();
            assert!(blocks.iter().all(|b| *b >= start && b + 1024 <= end));
            blocks.sort_unstable();
            assert!(blocks.windows(2).all(|w| w[1] - w[0] >= 1024), "blocks overlap");
            assert_eq!(blocks.len(), 20 * 8, "a view of 1 KiB blocks holds four times the stripes");
        }
        // Member-major: a member's blocks of consecutive stripes lie side by side.
        let arena = Arena::new(6, 4096, 5, Layout::Member);
        assert_eq!(arena.block(1, 3) as usize - arena.block(0, 3) as usize, 4096);
    }

    /// A peer that computed something else than md's parity would make every ratio
    /// meaningless; ISA-L's AVX2 routines in particular need tables in their own format.
    #[cfg(feature = "isal")]
    #[test]
    fn every_isal_peer_computes_md_parity() {
        use uraid_parity::reference;
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let (k, len) = (8, 4096);
        for routines in [isal::Routines::Dispatch, isal::Routines::Avx2] {
            let ctx = Ctx {
                isal: isal::Isal::new(k, routines),
                isal_decode: isal::Isal::new(k, routines).decode_tables(LOST.0, LOST.1),
            };
            for op in Op::ALL {
                for peer in peers_of(op, routines) {
                    let arena = Arena::new(k, len, 1, Layout::Member);
                    // SAFETY: the arena's blocks are distinct, `len` bytes each, and
                    // outlive every slice taken here; none is used while exec runs.
                    let block = |i: usize| unsafe { std::slice::from_raw_parts_mut(arena.block(0, i), len) };
                    let data: Vec<Vec<u8>> = (0..k).map(|i| block(i).to_vec()).collect();
                    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                    let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
                    reference::gen_syndrome(&refs, &mut p, &mut q);
                    // What each op should leave in the blocks it writes.
                    let expected: Vec<(usize, Vec<u8>)> = match op {
                        Op::GenSyndrome => vec![(k, p.clone()), (k + 1, q.clone())],
                        Op::XorGen => vec![(k, p.clone())],
                        Op::RmwUpdate => {
                            block(k).copy_from_slice(&p);
                            block(k + 1).copy_from_slice(&q);
                            let (mut pu, mut qu) = (p.clone(), q.clone());
                            reference::rmw_update(1, &data[1], &data[0], &mut pu, &mut qu);
                            vec![(k, pu), (k + 1, qu)]
                        }
                        Op::Recover2Data => {
                            block(k).copy_from_slice(&p);
                            block(k + 1).copy_from_slice(&q);
                            block(LOST.0).fill(0);
                            block(LOST.1).fill(0);
                            vec![(LOST.0, data[LOST.0].clone()), (LOST.1, data[LOST.1].clone())]
                        }
                    };
                    exec(&ctx, peer, op, &arena, 0);
                    for (i, want) in expected {
                        assert!(
                            block(i) == want.as_slice(),
                            "{} {}: block {i} differs",
                            peer.name(),
                            op.name()
                        );
                    }
                }
            }
        }
    }
}
