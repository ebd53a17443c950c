//! Kernel choice at first use, like the kernel's `raid6_select_algo`: time `gen_syndrome`
//! of every kernel the CPU supports on a small hot stripe and keep the fastest.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{available_kernels, Kernel};

static SELECTED: OnceLock<Kernel> = OnceLock::new();

/// Same shape as md's boot-time test: 8 data blocks of one page each, in cache.
const PROBE_DATA_BLOCKS: usize = 8;
const PROBE_BLOCK_BYTES: usize = 4096;
/// Per kernel and round; five kernels and five rounds keep the whole choice near 10 ms.
const PROBE_TIME: Duration = Duration::from_micros(400);
const PROBE_ROUNDS: usize = 5;

/// The kernel the free functions use; picked (and logged) on the first call.
pub fn selected_kernel() -> Kernel {
    *SELECTED.get_or_init(select)
}

fn quiet() -> bool {
    std::env::var_os("URAID_PARITY_QUIET").is_some_and(|v| !v.is_empty() && v != "0")
}

fn select() -> Kernel {
    if let Ok(name) = std::env::var("URAID_PARITY_KERNEL") {
        match Kernel::from_name(&name) {
            Some(k) if k.is_available() => {
                if !quiet() {
                    eprintln!("uraid-parity: raid6: using {} (URAID_PARITY_KERNEL)", k.name());
                }
                return k;
            }
            // A forced kernel that silently fell back would make a benchmark lie; say so
            // even when quiet.
            Some(k) => eprintln!("uraid-parity: URAID_PARITY_KERNEL={} not supported by this CPU", k.name()),
            None => eprintln!("uraid-parity: URAID_PARITY_KERNEL={name:?} is not a kernel name"),
        }
    }
    // Rounds interleave the kernels and each keeps its best, so a burst of load from
    // elsewhere on the machine (or a core waking up) cannot decide the choice alone.
    let kernels = available_kernels();
    let mut best_mb_per_s = vec![0u64; kernels.len()];
    for _ in 0..PROBE_ROUNDS {
        for (k, best) in kernels.iter().zip(best_mb_per_s.iter_mut()) {
            *best = (*best).max(probe_gen_mb_per_s(*k));
        }
    }
    let figures: Vec<String> =
        kernels.iter().zip(&best_mb_per_s).map(|(k, mb)| format!("{} {mb}", k.name())).collect();
    let best = kernels.iter().zip(&best_mb_per_s).max_by_key(|(_, mb)| **mb).map(|(k, mb)| (*k, *mb));
    let best = best.unwrap_or((Kernel::Scalar, 0));
    if !quiet() {
        eprintln!(
            "uraid-parity: raid6: gen() MB/s: {}; using {} (URAID_PARITY_QUIET=1 silences this)",
            figures.join(", "),
            best.0.name()
        );
    }
    best.0
}

fn probe_gen_mb_per_s(kernel: Kernel) -> u64 {
    let blocks: Vec<Vec<u8>> = (0..PROBE_DATA_BLOCKS)
        .map(|i| (0..PROBE_BLOCK_BYTES).map(|b| (b * 31 + i * 7) as u8).collect())
        .collect();
    let data: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
    let mut p = vec![0u8; PROBE_BLOCK_BYTES];
    let mut q = vec![0u8; PROBE_BLOCK_BYTES];
    kernel.gen_syndrome(&data, &mut p, &mut q);
    let started = Instant::now();
    let mut rounds = 0u64;
    while started.elapsed() < PROBE_TIME {
        for _ in 0..16 {
            kernel.gen_syndrome(&data, &mut p, &mut q);
        }
        rounds += 16;
    }
    let bytes = rounds * (PROBE_DATA_BLOCKS * PROBE_BLOCK_BYTES) as u64;
    (bytes as f64 / started.elapsed().as_secs_f64() / 1e6) as u64
}
