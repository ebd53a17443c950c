//! GF(2^8) parity for RAID4/5/6, md-exact.
//!
//! Arithmetic is Linux md's: GF(2^8) with polynomial 0x11d and generator g = 2;
//! `P = XOR D_i` and `Q = sum g^i * D_i`, where `data[i]` is the block in md's syndrome
//! slot i (see `shared/reference/md-format.md` section 5 for how slots follow disks).
//!
//! Every function takes blocks of any length and alignment (all the same length) and up
//! to 255 data blocks. Losses and how to recover them:
//!
//! | lost           | recover with |
//! |----------------|--------------|
//! | one data block | [`recover_data_from_p`] |
//! | data + P       | [`recover_data_from_q`], then [`xor_gen`] for P |
//! | data + Q       | [`recover_data_from_p`], then [`gen_syndrome`] for Q |
//! | two data       | [`recover_2data`] |
//! | P + Q          | [`gen_syndrome`] |
//!
//! Speed: blocks aligned to 64 bytes (pages, as O_DIRECT buffers are) run faster in cache
//! than misaligned ones, whose 64-byte loads straddle cache lines (docs/parity.md,
//! "Aligned blocks"). Parity and recovered blocks are written with streaming stores when
//! the blocks read are out of cache (a timed probe now and then, see [`Stores::Auto`]) or
//! the stripe is at least [`STREAM_MIN_STRIPE_BYTES`]. A streaming call ends with a store
//! fence, and the caller's next stores wait for it: one that stores much right after each
//! call loses some speed at 4 KiB blocks (docs/parity.md, "The store fence").
//!
//! The free functions run the kernel picked at first use (CPU detection plus a short
//! benchmark; with `URAID_PARITY_LOG=1` logged once to stderr like the kernel's
//! `raid6: ... gen() N MB/s`, silent otherwise: a served array need not print it at every
//! start). Environment: `URAID_PARITY_KERNEL=scalar|avx2|avx512bw|gfni-avx512|gfni-avx`
//! forces a kernel; `URAID_PARITY_PROBE=0` turns the
//! cache probe off (streaming stores then by stripe size alone). Tests and benchmarks that need a
//! particular kernel call the same operations as methods on [`Kernel`].

mod gf;
mod kernels;
pub mod reference;
mod residency;
mod select;
mod vector;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use select::selected_kernel;

/// md supports up to 256 data + 2 parity disks in its syndrome math, but g^i repeats after
/// 255, so more than 255 data blocks could not be told apart.
pub const MAX_DATA_BLOCKS: usize = 255;

/// Stripes (data plus parity) at least this large get their parity written with
/// streaming (non-temporal) stores where the kernel has them. Such a stripe cannot stay in
/// a core's L2 anyway, so skipping the read-for-ownership of the parity lines is pure
/// gain; below it, streaming evicts parity a hot caller is about to use (docs/parity.md,
/// "Streaming stores: when they pay").
pub const STREAM_MIN_STRIPE_BYTES: usize = 1024 * 1024;

/// [`STREAM_MIN_STRIPE_BYTES`], or `URAID_PARITY_STREAM_MIN_BYTES` when set (for measuring
/// where the crossover lies on a given machine; 0 streams always).
fn stream_min_stripe_bytes() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("URAID_PARITY_STREAM_MIN_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(STREAM_MIN_STRIPE_BYTES)
    })
}

/// Whether [`Stores::Auto`] probes the cache (`URAID_PARITY_PROBE=0` turns it off, to
/// measure what the probe brings).
fn probe_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("URAID_PARITY_PROBE").is_none_or(|v| v != "0"))
}

/// How parity is stored by [`Kernel::gen_syndrome_with`] and [`Kernel::xor_gen_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Stores {
    /// Streaming when the stripe is out of cache, else cached; and streaming for every
    /// stripe of at least [`STREAM_MIN_STRIPE_BYTES`]. Out of cache is measured: each
    /// thread times a load from two data blocks now and then (every 8 MiB of work) and
    /// keeps the answer for its calls in between. Measured because streaming pays out of
    /// cache and costs in cache, and no block size tells the two apart (docs/parity.md,
    /// "Streaming stores: when they pay").
    #[default]
    Auto,
    /// Ordinary stores: the parity stays in cache for a caller about to read it.
    Cached,
    /// Non-temporal stores where the kernel has them (and the output is aligned to its
    /// vector width): for parity that goes straight to a device while the caller works
    /// through more data than the caches hold. Saves the read-for-ownership of P and Q:
    /// 2 line reads for every 8 data lines of an 8+2 stripe.
    Streaming,
}

impl Stores {
    /// `read` are blocks the call reads (at least one); the first and last are probed.
    fn stream(self, stripe_bytes: usize, read: &[&[u8]]) -> bool {
        match self {
            Stores::Auto => {
                stripe_bytes >= stream_min_stripe_bytes()
                    || (probe_enabled()
                        && residency::blocks_cold(&[read[0], read[read.len() - 1]], stripe_bytes))
            }
            Stores::Cached => false,
            Stores::Streaming => true,
        }
    }
}

/// One implementation of the parity operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Portable: 64-bit words (SWAR) and table multiplies. The reference for speed.
    Scalar,
    /// 256-bit vectors; constant multiplies by nibble-table shuffles.
    Avx2,
    /// 512-bit vectors with byte masks; constant multiplies by nibble-table shuffles.
    Avx512bw,
    /// 512-bit GF2P8AFFINEQB: every multiply is one instruction.
    GfniAvx512,
    /// 256-bit (VEX) GF2P8AFFINEQB, for CPUs with GFNI but no AVX-512.
    GfniAvx,
}

/// All kernels, slowest first (the order the start-up log prints them in).
pub const ALL_KERNELS: [Kernel; 5] =
    [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512bw, Kernel::GfniAvx, Kernel::GfniAvx512];

/// The kernels this CPU can run, in [`ALL_KERNELS`] order.
pub fn available_kernels() -> Vec<Kernel> {
    ALL_KERNELS.into_iter().filter(|k| k.is_available()).collect()
}

macro_rules! dispatch {
    ($kernel:expr, $op:ident ( $($arg:expr),* )) => {{
        let kernel: Kernel = $kernel;
        assert!(kernel.is_available(), "uraid-parity: kernel {} is not supported by this CPU", kernel.name());
        // SAFETY: the CPU supports the kernel (checked above) and the caller checked
        // every slice length and index the kernel relies on.
        unsafe {
            match kernel {
                Kernel::Scalar => kernels::scalar::$op($($arg),*),
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2 => kernels::avx2::$op($($arg),*),
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx512bw => kernels::avx512bw::$op($($arg),*),
                #[cfg(target_arch = "x86_64")]
                Kernel::GfniAvx512 => kernels::gfni_avx512::$op($($arg),*),
                #[cfg(target_arch = "x86_64")]
                Kernel::GfniAvx => kernels::gfni_avx::$op($($arg),*),
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!(),
            }
        }
    }};
}

impl Kernel {
    /// The name used by `URAID_PARITY_KERNEL` and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512bw => "avx512bw",
            Kernel::GfniAvx512 => "gfni-avx512",
            Kernel::GfniAvx => "gfni-avx",
        }
    }

    pub fn from_name(name: &str) -> Option<Kernel> {
        ALL_KERNELS.into_iter().find(|k| k.name() == name)
    }

    #[inline]
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                Kernel::Scalar => true,
                Kernel::Avx2 => has!("avx2"),
                Kernel::Avx512bw => has!("avx512f") && has!("avx512bw"),
                Kernel::GfniAvx512 => has!("avx512f") && has!("avx512bw") && has!("gfni"),
                Kernel::GfniAvx => has!("avx2") && has!("gfni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Kernel::Scalar
        }
    }

    /// P = XOR of the data blocks (RAID4/5 parity).
    pub fn xor_gen(self, data: &[&[u8]], p: &mut [u8]) {
        self.xor_gen_with(data, p, Stores::Auto)
    }

    /// [`Kernel::xor_gen`] with a choice of how P is stored.
    pub fn xor_gen_with(self, data: &[&[u8]], p: &mut [u8], stores: Stores) {
        check_blocks(data, 0..data.len(), p.len());
        if data.is_empty() {
            p.fill(0);
            return;
        }
        let stream = stores.stream((data.len() + 1) * p.len(), data);
        dispatch!(self, xor_gen(data, p, stream))
    }

    /// P and Q of the data blocks (RAID6).
    pub fn gen_syndrome(self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        self.gen_syndrome_with(data, p, q, Stores::Auto)
    }

    /// [`Kernel::gen_syndrome`] with a choice of how P and Q are stored.
    pub fn gen_syndrome_with(self, data: &[&[u8]], p: &mut [u8], q: &mut [u8], stores: Stores) {
        assert!(!data.is_empty(), "gen_syndrome needs at least one data block");
        assert_eq!(p.len(), q.len(), "P and Q lengths differ");
        check_blocks(data, 0..data.len(), p.len());
        let stream = stores.stream((data.len() + 2) * p.len(), data);
        dispatch!(self, gen_syndrome(data, p, q, stream))
    }

    /// Folds `data[start..=stop]` into an existing P and Q: P ^= their XOR, Q ^= sum of
    /// `g^i * data[i]`. Entries outside `start..=stop` are not read (may be empty).
    /// With P/Q of the old stripe and `data` = old ^ new of the rewritten blocks, this is
    /// md's read-modify-write update.
    pub fn xor_syndrome(self, data: &[&[u8]], start: usize, stop: usize, p: &mut [u8], q: &mut [u8]) {
        assert!(start <= stop && stop < data.len(), "xor_syndrome: bad range {start}..={stop}");
        assert_eq!(p.len(), q.len(), "P and Q lengths differ");
        check_blocks(data, start..stop + 1, p.len());
        dispatch!(self, xor_syndrome(data, start, stop, p, q))
    }

    /// One pass over one rewritten block: P ^= old ^ new; Q ^= g^data_index * (old ^ new).
    pub fn rmw_update(self, data_index: usize, old: &[u8], new: &[u8], p: &mut [u8], q: &mut [u8]) {
        assert!(data_index < MAX_DATA_BLOCKS, "data index {data_index} out of range");
        let len = p.len();
        assert!(old.len() == len && new.len() == len && q.len() == len, "rmw_update: block lengths differ");
        dispatch!(self, rmw_update(gf::pow_g(data_index), old, new, p, q))
    }

    /// `data[lost] = P ^ XOR` of the other data blocks; `data[lost]` is not read.
    pub fn recover_data_from_p(self, data: &[&[u8]], lost: usize, p: &[u8], out: &mut [u8]) {
        assert!(lost < data.len(), "lost index {lost} out of range");
        assert_eq!(p.len(), out.len(), "P and output lengths differ");
        check_blocks_except(data, lost, lost, out.len());
        let stream = Stores::Auto.stream((data.len() + 1) * out.len(), &[p]);
        dispatch!(self, xor_skip(data, lost, Some(p), out, stream))
    }

    /// `data[lost]` from Q and the other data blocks (for a lost data block and lost P);
    /// `data[lost]` is not read.
    pub fn recover_data_from_q(self, data: &[&[u8]], lost: usize, q: &[u8], out: &mut [u8]) {
        assert!(lost < data.len(), "lost index {lost} out of range");
        assert_eq!(q.len(), out.len(), "Q and output lengths differ");
        check_blocks_except(data, lost, lost, out.len());
        let stream = Stores::Auto.stream((data.len() + 1) * out.len(), &[q]);
        dispatch!(self, recover_q(data, lost, q, out, stream))
    }

    /// Two lost data blocks from P, Q and the other data blocks, in one pass;
    /// `data[lost_a]` and `data[lost_b]` are not read.
    #[allow(clippy::too_many_arguments)]
    pub fn recover_2data(
        self,
        data: &[&[u8]],
        lost_a: usize,
        lost_b: usize,
        p: &[u8],
        q: &[u8],
        out_a: &mut [u8],
        out_b: &mut [u8],
    ) {
        assert!(lost_a != lost_b, "recover_2data: both lost indexes are {lost_a}");
        assert!(lost_a < data.len() && lost_b < data.len(), "lost index out of range");
        let len = out_a.len();
        assert!(out_b.len() == len && p.len() == len && q.len() == len, "recover_2data: lengths differ");
        check_blocks_except(data, lost_a, lost_b, len);
        let stream = Stores::Auto.stream((data.len() + 2) * len, &[p, q]);
        dispatch!(self, recover_2data(data, lost_a, lost_b, p, q, out_a, out_b, stream))
    }
}

#[inline]
fn check_blocks(data: &[&[u8]], range: std::ops::Range<usize>, len: usize) {
    assert!(data.len() <= MAX_DATA_BLOCKS, "{} data blocks; at most {MAX_DATA_BLOCKS}", data.len());
    for i in range {
        assert_eq!(data[i].len(), len, "data block {i} is {} bytes, parity {len}", data[i].len());
    }
}

#[inline]
fn check_blocks_except(data: &[&[u8]], skip_a: usize, skip_b: usize, len: usize) {
    assert!(data.len() <= MAX_DATA_BLOCKS, "{} data blocks; at most {MAX_DATA_BLOCKS}", data.len());
    for (i, d) in data.iter().enumerate() {
        if i != skip_a && i != skip_b {
            assert_eq!(d.len(), len, "data block {i} is {} bytes, expected {len}", d.len());
        }
    }
}

/// P = XOR of the data blocks (RAID4/5 parity).
pub fn xor_gen(data: &[&[u8]], p: &mut [u8]) {
    selected_kernel().xor_gen(data, p)
}

/// P and Q of the data blocks (RAID6).
pub fn gen_syndrome(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    selected_kernel().gen_syndrome(data, p, q)
}

/// Kernel `xor_syndrome` semantics: `P ^= XOR data[start..=stop]`; `Q ^= sum g^i*data[i]`
/// for i in start..=stop. `data.len() > stop`; entries outside start..=stop are not read
/// (may be empty slices).
pub fn xor_syndrome(data: &[&[u8]], start: usize, stop: usize, p: &mut [u8], q: &mut [u8]) {
    selected_kernel().xor_syndrome(data, start, stop, p, q)
}

/// Fused one-pass read-modify-write of one block: P ^= old^new; Q ^= g^data_index*(old^new).
pub fn rmw_update(data_index: usize, old: &[u8], new: &[u8], p: &mut [u8], q: &mut [u8]) {
    selected_kernel().rmw_update(data_index, old, new, p, q)
}

/// One lost data block from P. In `data`, the lost index is ignored (may be empty).
pub fn recover_data_from_p(data: &[&[u8]], lost: usize, p: &[u8], out: &mut [u8]) {
    selected_kernel().recover_data_from_p(data, lost, p, out)
}

/// One lost data block from Q (when P is lost too). The lost index is ignored.
pub fn recover_data_from_q(data: &[&[u8]], lost: usize, q: &[u8], out: &mut [u8]) {
    selected_kernel().recover_data_from_q(data, lost, q, out)
}

/// Two lost data blocks from P and Q. The lost indexes are ignored (may be empty).
pub fn recover_2data(
    data: &[&[u8]],
    lost_a: usize,
    lost_b: usize,
    p: &[u8],
    q: &[u8],
    out_a: &mut [u8],
    out_b: &mut [u8],
) {
    selected_kernel().recover_2data(data, lost_a, lost_b, p, q, out_a, out_b)
}
