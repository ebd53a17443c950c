//! GF(2^8) with md's polynomial x^8+x^4+x^3+x^2+1 (0x11d) and generator 2.
//!
//! Every table is built at compile time, so the crate needs no start-up work and no
//! dependency to hold lazily built state.

/// The low byte of md's field polynomial; x^8 reduces to this.
pub const POLY_LOW: u8 = 0x1d;

/// `EXP[i] = g^i`, doubled in length so `EXP[log a + log b]` needs no modulo.
pub static EXP: [u8; 512] = build_exp();
/// `LOG[a]` for a != 0; `LOG[0]` is unused (0).
pub static LOG: [u8; 256] = build_log();
/// Full product table, `MUL[a][b] = a*b`; 64 KiB, used by the byte-wise paths.
pub static MUL: [[u8; 256]; 256] = build_mul();

const fn mul2_const(a: u8) -> u8 {
    let shifted = (a as u16) << 1;
    if shifted & 0x100 != 0 {
        (shifted as u8) ^ POLY_LOW
    } else {
        shifted as u8
    }
}

const fn build_exp() -> [u8; 512] {
    let mut t = [0u8; 512];
    let mut x: u8 = 1;
    let mut i = 0;
    while i < 255 {
        t[i] = x;
        t[i + 255] = x;
        x = mul2_const(x);
        i += 1;
    }
    // Indexes 510 and 511 stay reachable only through log sums <= 508; fill them anyway.
    t[510] = t[0];
    t[511] = t[1];
    t
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        t[exp[i] as usize] = i as u8;
        i += 1;
    }
    t
}

/// Carry-less multiply and reduce, bit by bit: slow but table-free, so it can build tables.
const fn mul_slow(a: u8, b: u8) -> u8 {
    let mut acc = 0u8;
    let mut x = a;
    let mut y = b;
    while y != 0 {
        if y & 1 != 0 {
            acc ^= x;
        }
        x = mul2_const(x);
        y >>= 1;
    }
    acc
}

const fn build_mul() -> [[u8; 256]; 256] {
    let mut t = [[0u8; 256]; 256];
    let mut a = 0;
    while a < 256 {
        let mut b = 0;
        while b < 256 {
            t[a][b] = mul_slow(a as u8, b as u8);
            b += 1;
        }
        a += 1;
    }
    t
}

#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    MUL[a as usize][b as usize]
}

/// g^i for any i (the exponent is taken mod 255).
#[inline]
pub fn pow_g(i: usize) -> u8 {
    EXP[i % 255]
}

/// Multiplicative inverse; panics on 0, which has none.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "0 has no inverse in GF(2^8)");
    EXP[(255 - LOG[a as usize] as usize) % 255]
}

/// The 8x8 bit matrix over GF(2) for "multiply by c", laid out for GF2P8AFFINEQB.
///
/// That instruction computes result bit i as parity(matrix byte (7-i) & x), so byte
/// (7-i) holds, for each input bit k, bit i of c*2^k.
pub const fn affine_matrix(c: u8) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < 8 {
        let mut row = 0u8;
        let mut k = 0;
        while k < 8 {
            if (mul_slow(c, 1 << k) >> i) & 1 != 0 {
                row |= 1 << k;
            }
            k += 1;
        }
        m |= (row as u64) << (8 * (7 - i));
        i += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_log_agree_with_slow_multiply() {
        for a in 1..=255u8 {
            assert_eq!(EXP[LOG[a as usize] as usize], a);
            assert_eq!(mul(a, inv(a)), 1);
            for b in [1u8, 2, 3, 0x1d, 0x80, 0xff] {
                let via_logs = EXP[LOG[a as usize] as usize + LOG[b as usize] as usize];
                assert_eq!(mul(a, b), via_logs);
            }
        }
        // md: 0x80 * 2 wraps through the polynomial.
        assert_eq!(mul(0x80, 2), 0x1d);
        assert_eq!(pow_g(8), 0x1d);
    }
}
