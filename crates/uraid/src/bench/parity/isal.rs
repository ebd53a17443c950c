//! Intel ISA-L as the peer of `uraid bench parity` (cargo feature `isal`).
//!
//! `erasure-isa-l-sys` vendors ISA-L and builds it from source (needs nasm, autoconf,
//! automake, libtool and libclang). With the encode matrix rows [1..1] and
//! [g^0..g^(k-1)], `ec_encode_data` computes exactly md's P and Q (polynomial 0x11d);
//! ISA-L's own CPU dispatch picks its GFNI AVX-512 code on CPUs that have it. Against
//! uraid's AVX2 kernel the bench calls ISA-L's AVX2 entry points instead ([`Routines`]),
//! what its dispatch runs on a CPU with AVX2 and neither AVX-512 nor GFNI.

use std::os::raw::{c_int, c_void};

use erasure_isa_l_sys as sys;

/// The ISA-L release vendored by the pinned `erasure-isa-l-sys` version (see its
/// `vendor/isa-l/Release_notes.txt`).
pub const VERSION: &str = "2.32.0";
pub const SOURCE: &str = "erasure-isa-l-sys 1.1.0, vendored, built from source";

extern "C" {
    // raid.h; the crate binds only gf_* and ec_*, but libisal.a has these too.
    fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    // The routines ISA-L's dispatch picks on an AVX2 CPU (raid_multibinary.asm,
    // ec_multibinary.asm); there is no xor_gen_avx2, AVX2 CPUs run xor_gen_avx.
    fn xor_gen_avx(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn pq_gen_avx2(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn ec_encode_data_avx2(
        len: c_int,
        k: c_int,
        rows: c_int,
        tables: *mut u8,
        data: *mut *mut u8,
        coding: *mut *mut u8,
    );
    #[allow(clippy::too_many_arguments)]
    fn ec_encode_data_update_avx2(
        len: c_int,
        k: c_int,
        rows: c_int,
        vec_i: c_int,
        tables: *mut u8,
        data: *mut u8,
        coding: *mut *mut u8,
    );
}

/// Which of ISA-L's routines the peer runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Routines {
    /// ISA-L's own CPU dispatch (GFNI AVX-512 where the CPU has it).
    Dispatch,
    /// The AVX2 entry points, whatever the CPU has: `pq_gen_avx2`, `xor_gen_avx`,
    /// `ec_encode_data_avx2`, `ec_encode_data_update_avx2`.
    Avx2,
}

impl Routines {
    /// How the bench's output names the routines.
    pub fn suffix(self) -> &'static str {
        match self {
            Routines::Dispatch => "",
            Routines::Avx2 => "-avx2",
        }
    }
}

/// GF(2^8) with 0x11d, for building matrices; ISA-L's own `gf_mul`.
fn gf_mul(a: u8, b: u8) -> u8 {
    unsafe { sys::gf_mul(a, b) }
}

fn pow_g(i: usize) -> u8 {
    (0..i).fold(1u8, |x, _| gf_mul(x, 2))
}

/// ISA-L state for stripes of `k` data blocks.
pub struct Isal {
    k: usize,
    routines: Routines,
    /// ec_init_tables of the P and Q rows (32 bytes per coefficient).
    pq_tables: Vec<u8>,
}

impl Isal {
    pub fn new(k: usize, routines: Routines) -> Isal {
        let mut rows = vec![1u8; 2 * k];
        for j in 0..k {
            rows[k + j] = pow_g(j);
        }
        let pq_tables = init_tables(routines, k, &mut rows);
        Isal { k, routines, pq_tables }
    }

    /// P and Q with `ec_encode_data`.
    ///
    /// # Safety
    /// `data` holds k pointers to `len` readable bytes; `p`, `q` point to `len` writable bytes.
    pub unsafe fn ec_gen(&self, data: &[*mut u8], p: *mut u8, q: *mut u8, len: usize) {
        self.encode(&self.pq_tables, data, p, q, len);
    }

    /// `ec_encode_data` of the routines chosen, two output rows.
    unsafe fn encode(&self, tables: &[u8], data: &[*mut u8], a: *mut u8, b: *mut u8, len: usize) {
        let mut coding = [a, b];
        let (len, k, tables) = (len as c_int, self.k as c_int, tables.as_ptr() as *mut u8);
        let data = data.as_ptr() as *mut *mut u8;
        match self.routines {
            Routines::Dispatch => sys::ec_encode_data(len, k, 2, tables, data, coding.as_mut_ptr()),
            Routines::Avx2 => ec_encode_data_avx2(len, k, 2, tables, data, coding.as_mut_ptr()),
        }
    }

    /// P and Q with the RAID-specific `pq_gen`; `array` is the k data pointers, then P, then Q
    /// (32-byte aligned, len a multiple of 32).
    ///
    /// # Safety
    /// Every pointer addresses `len` bytes with that alignment.
    pub unsafe fn pq_gen(&self, array: &mut [*mut u8], len: usize) {
        assert_eq!(array.len(), self.k + 2);
        let gen = match self.routines {
            Routines::Dispatch => pq_gen,
            Routines::Avx2 => pq_gen_avx2,
        };
        let rc = gen(array.len() as c_int, len as c_int, array.as_mut_ptr() as *mut *mut c_void);
        assert_eq!(rc, 0, "ISA-L pq_gen failed");
    }

    /// `array` is the k data pointers, then P.
    ///
    /// # Safety
    /// As [`Isal::pq_gen`].
    pub unsafe fn xor_gen(&self, array: &mut [*mut u8], len: usize) {
        assert_eq!(array.len(), self.k + 1);
        let gen = match self.routines {
            Routines::Dispatch => xor_gen,
            Routines::Avx2 => xor_gen_avx,
        };
        let rc = gen(array.len() as c_int, len as c_int, array.as_mut_ptr() as *mut *mut c_void);
        assert_eq!(rc, 0, "ISA-L xor_gen failed");
    }

    /// ISA-L's update path for one rewritten block: P,Q += coef*old, then += coef*new
    /// (two passes over P and Q; linear, so together they add coef*(old^new)).
    ///
    /// # Safety
    /// All pointers address `len` bytes.
    pub unsafe fn update(
        &self,
        index: usize,
        old: *mut u8,
        new: *mut u8,
        p: *mut u8,
        q: *mut u8,
        len: usize,
    ) {
        let mut coding = [p, q];
        let tables = self.pq_tables.as_ptr() as *mut u8;
        let (k, i) = (self.k as c_int, index as c_int);
        let update = match self.routines {
            Routines::Dispatch => sys::ec_encode_data_update,
            Routines::Avx2 => ec_encode_data_update_avx2,
        };
        update(len as c_int, k, 2, i, tables, old, coding.as_mut_ptr());
        update(len as c_int, k, 2, i, tables, new, coding.as_mut_ptr());
    }

    /// Decode tables for two lost data blocks: invert the k x k matrix of the surviving
    /// rows (other data, P, Q) and keep the two rows that give the lost blocks. Inputs
    /// to [`Isal::recover`] are then the survivors in that row order.
    pub fn decode_tables(&self, lost_a: usize, lost_b: usize) -> Vec<u8> {
        let k = self.k;
        let mut survivors = Vec::with_capacity(k * k);
        for i in (0..k).filter(|&i| i != lost_a && i != lost_b) {
            survivors.extend((0..k).map(|j| u8::from(i == j)));
        }
        survivors.extend_from_slice(&vec![1u8; k]);
        survivors.extend((0..k).map(pow_g));
        let mut inverse = vec![0u8; k * k];
        let rc = unsafe { sys::gf_invert_matrix(survivors.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) };
        assert_eq!(rc, 0, "survivor matrix is singular");
        let mut rows = inverse[lost_a * k..(lost_a + 1) * k].to_vec();
        rows.extend_from_slice(&inverse[lost_b * k..(lost_b + 1) * k]);
        init_tables(self.routines, k, &mut rows)
    }

    /// # Safety
    /// `survivors` holds k pointers (surviving data in index order, then P, then Q) to
    /// `len` bytes; outputs address `len` writable bytes.
    pub unsafe fn recover(&self, tables: &[u8], survivors: &[*mut u8], a: *mut u8, b: *mut u8, len: usize) {
        self.encode(tables, survivors, a, b, len);
    }
}

/// Tables for the two rows of `rows` (k coefficients each) in the format `routines` read.
fn init_tables(routines: Routines, k: usize, rows: &mut [u8]) -> Vec<u8> {
    assert_eq!(rows.len(), 2 * k);
    let mut tables = vec![0u8; 32 * k * 2];
    let (k, a, t) = (k as c_int, rows.as_mut_ptr(), tables.as_mut_ptr());
    unsafe {
        match routines {
            Routines::Dispatch => sys::ec_init_tables(k, 2, a, t),
            // The 32-byte-per-coefficient tables the non-GFNI routines read (on a GFNI
            // CPU `ec_init_tables` builds GFNI ones).
            Routines::Avx2 => sys::ec_init_tables_base(k, 2, a, t),
        }
    }
    tables
}
