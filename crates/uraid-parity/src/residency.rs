//! Is a call's stripe in cache? Measured, not guessed: [`Stores::Auto`] asks this before
//! choosing between ordinary and streaming stores for the parity.
//!
//! Why it matters: an ordinary store to a line that is not in cache first reads the line
//! from memory (read-for-ownership), 2 extra line reads per 8 data lines of an 8+2
//! stripe. Streaming stores skip that read but write through to memory, which costs when
//! the stripe is in cache. No block size separates the two cases; whether the stripe is
//! cached does (docs/parity.md, "Streaming stores: when they pay").
//!
//! How: time one load from the last line of two data blocks with the time-stamp counter; a
//! hit in any cache level is several times faster than a miss to memory (docs/parity.md,
//! "The cache probe: timing and cost"). The last line, not the first or the middle: a
//! caller that walks its stripes in memory order (a rebuild over member buffers) has the
//! hardware prefetcher running ahead of it into the start of the next call's blocks
//! (docs/parity.md, "The cache probe reads the blocks' last line").
//! Blocks the call reads (data, or P and Q when it recovers), not the ones it writes:
//! streaming stores evict the written lines, so a probe of them would keep answering "out
//! of cache" once streaming had begun, even for a stripe that is otherwise reused in cache.
//! The answer is kept per thread and re-measured after every [`PROBE_EVERY_BYTES`] of
//! work; a thread's next calls tend to touch memory the way its last ones did (a rebuild
//! streams, a write path reuses buffers it just filled).
//!
//! [`Stores::Auto`]: crate::Stores::Auto

use std::cell::Cell;

/// Work (bytes read and written by parity calls) between two probes on one thread.
/// Rare enough that probing costs next to nothing even in cache, often enough that a
/// thread that turns from cached to streaming work (or back) is noticed within a fraction
/// of a millisecond (docs/parity.md, "The cache probe: timing and cost").
pub(crate) const PROBE_EVERY_BYTES: usize = 8 << 20;

/// A probe slower than this (net of the timer's own cost) went to memory. Between the
/// slowest cache hits seen and the memory latency of any current server (docs/parity.md,
/// "The cache probe: timing and cost").
const MISS_NS: f64 = 75.0;

#[derive(Clone, Copy)]
struct State {
    /// Work left before the next probe; 0 probes on the next call.
    budget: usize,
    /// The last probe's answer.
    cold: bool,
}

thread_local! {
    static STATE: Cell<State> = const { Cell::new(State { budget: 0, cold: false }) };
}

/// Whether `blocks` (blocks the call is about to read) are out of cache, as last
/// measured on this thread; `work_bytes` is what the call reads and writes.
pub(crate) fn blocks_cold(blocks: &[&[u8]], work_bytes: usize) -> bool {
    STATE.with(|cell| {
        let mut s = cell.get();
        if s.budget == 0 {
            if let Some(cold) = probe(blocks) {
                s.cold = cold;
            }
            s.budget = PROBE_EVERY_BYTES;
        }
        s.budget = s.budget.saturating_sub(work_bytes);
        cell.set(s);
        s.cold
    })
}

/// True if loading the last line of the blocks missed every cache; None where there is
/// no cycle counter to time it with.
#[cfg(target_arch = "x86_64")]
fn probe(blocks: &[&[u8]]) -> Option<bool> {
    use std::arch::x86_64::{_mm_lfence, _rdtsc};
    let clock = clock()?;
    if blocks.iter().all(|b| b.is_empty()) {
        return None;
    }
    // SAFETY: each read is of a byte inside a live slice; LFENCE and RDTSC are
    // baseline x86-64 (SSE2, TSC). The fences keep the loads between the two readings.
    let ticks = unsafe {
        _mm_lfence();
        let start = _rdtsc();
        _mm_lfence();
        let mut sink = 0u8;
        // Independent loads: they overlap, so the time is the slowest line's.
        for b in blocks.iter().filter(|b| !b.is_empty()) {
            sink ^= std::ptr::read_volatile(b[b.len() - 1..].as_ptr());
        }
        _mm_lfence();
        let end = _rdtsc();
        std::hint::black_box(sink);
        end.wrapping_sub(start)
    };
    let ns = ticks.saturating_sub(clock.overhead_ticks) as f64 / clock.ticks_per_ns;
    Some(ns > MISS_NS)
}

#[cfg(not(target_arch = "x86_64"))]
fn probe(_blocks: &[&[u8]]) -> Option<bool> {
    None
}

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Clock {
    ticks_per_ns: f64,
    /// What two fenced readings with nothing between them take.
    overhead_ticks: u64,
}

/// The time-stamp counter's rate and overhead, calibrated once per process (~0.2 ms).
/// None if the counter does not advance steadily enough to use (then Auto falls back to
/// the stripe-size rule alone).
#[cfg(target_arch = "x86_64")]
fn clock() -> Option<Clock> {
    use std::arch::x86_64::{_mm_lfence, _rdtsc};
    use std::time::{Duration, Instant};
    static CLOCK: std::sync::OnceLock<Option<Clock>> = std::sync::OnceLock::new();
    *CLOCK.get_or_init(|| {
        // SAFETY: LFENCE and RDTSC are baseline x86-64.
        let read = || unsafe {
            _mm_lfence();
            let t = _rdtsc();
            _mm_lfence();
            t
        };
        let overhead_ticks = (0..64)
            .map(|_| {
                let a = read();
                read().wrapping_sub(a)
            })
            .min()?;
        let (t0, c0) = (Instant::now(), read());
        while t0.elapsed() < Duration::from_micros(200) {
            std::hint::spin_loop();
        }
        let (ns, ticks) = (t0.elapsed().as_nanos() as f64, read().wrapping_sub(c0) as f64);
        let ticks_per_ns = ticks / ns;
        // A counter below 100 MHz or above 20 GHz is not a usable invariant TSC.
        (0.1..20.0).contains(&ticks_per_ns).then_some(Clock { ticks_per_ns, overhead_ticks })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_just_written_is_in_cache() {
        let buf = vec![1u8; 4096];
        let mut hits = 0;
        for _ in 0..32 {
            std::hint::black_box(buf.iter().fold(0u8, |a, b| a ^ b));
            if probe(&[&buf]) == Some(false) {
                hits += 1;
            }
        }
        // Interrupts or a busy machine may spoil a probe now and then, not most of them.
        #[cfg(target_arch = "x86_64")]
        assert!(hits >= 16, "only {hits} of 32 probes of a cached line saw a cache hit");
        let _ = hits;
    }

    #[test]
    fn probes_are_spaced_by_work() {
        let buf = vec![1u8; 64];
        // The first call on a thread probes; afterwards only every PROBE_EVERY_BYTES.
        blocks_cold(&[&buf], PROBE_EVERY_BYTES / 2);
        let left = STATE.with(|c| c.get().budget);
        assert_eq!(left, PROBE_EVERY_BYTES / 2);
        // A second call within the budget does not probe again (a probe would refill it).
        blocks_cold(&[&buf], PROBE_EVERY_BYTES / 4);
        assert_eq!(STATE.with(|c| c.get().budget), PROBE_EVERY_BYTES / 4);
        blocks_cold(&[&buf], PROBE_EVERY_BYTES);
        assert_eq!(STATE.with(|c| c.get().budget), 0);
    }
}
