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

/// The choice is logged only when asked (`URAID_PARITY_LOG=1`); `uraid bench parity`
/// prints every kernel's figures itself.
fn quiet() -> bool {
    !std::env::var_os("URAID_PARITY_LOG").is_some_and(|v| !v.is_empty() && v != "0")
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
    let chosen = choose(&kernels, &best_mb_per_s);
    if !quiet() {
        eprintln!("uraid-parity: raid6: gen() MB/s: {}; using {}", figures.join(", "), chosen.name());
    }
    chosen
}

/// A more capable kernel (later in [`crate::ALL_KERNELS`]) within this fraction of the
/// fastest is taken over it: on a busy machine a probe round can lose a slice of its time,
/// and the wider kernel is the one that wins when the machine is quiet.
const PREFER_CAPABLE_WITHIN: f64 = 0.85;

/// The most capable kernel whose probe came within `PREFER_CAPABLE_WITHIN` of the fastest.
fn choose(kernels: &[Kernel], mb_per_s: &[u64]) -> Kernel {
    let fastest = mb_per_s.iter().copied().max().unwrap_or(0) as f64;
    kernels
        .iter()
        .zip(mb_per_s)
        .filter(|(_, &mb)| mb as f64 >= fastest * PREFER_CAPABLE_WITHIN)
        .map(|(k, _)| *k)
        .next_back()
        .unwrap_or(Kernel::Scalar)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capable_kernel_close_to_the_fastest_is_preferred() {
        let k = [Kernel::Scalar, Kernel::Avx2, Kernel::GfniAvx512];
        assert_eq!(choose(&k, &[15_000, 80_000, 72_000]), Kernel::GfniAvx512);
        assert_eq!(choose(&k, &[15_000, 80_000, 60_000]), Kernel::Avx2);
        assert_eq!(choose(&k, &[15_000, 70_000, 170_000]), Kernel::GfniAvx512);
        assert_eq!(choose(&[], &[]), Kernel::Scalar);
    }
}
