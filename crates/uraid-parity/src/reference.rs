//! Byte-at-a-time reference: the definition every kernel is tested against.
//!
//! Written for obviousness, not speed: each output byte is the textbook sum
//! `P = XOR D_i`, `Q = sum g^i * D_i`. The kernels also use the `*_from` forms to
//! finish the last few bytes that do not fill a machine word.

use crate::gf::{inv, mul, pow_g};

pub fn xor_gen(data: &[&[u8]], p: &mut [u8]) {
    xor_gen_from(data, p, 0);
}

pub fn gen_syndrome(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    gen_syndrome_from(data, p, q, 0);
}

pub fn xor_syndrome(data: &[&[u8]], start: usize, stop: usize, p: &mut [u8], q: &mut [u8]) {
    xor_syndrome_from(data, start, stop, p, q, 0);
}

pub fn rmw_update(data_index: usize, old: &[u8], new: &[u8], p: &mut [u8], q: &mut [u8]) {
    rmw_update_from(pow_g(data_index), old, new, p, q, 0);
}

pub fn recover_data_from_p(data: &[&[u8]], lost: usize, p: &[u8], out: &mut [u8]) {
    recover_p_from(data, lost, p, out, 0);
}

pub fn recover_data_from_q(data: &[&[u8]], lost: usize, q: &[u8], out: &mut [u8]) {
    recover_q_from(data, lost, q, out, 0);
}

pub fn recover_2data(
    data: &[&[u8]],
    lost_a: usize,
    lost_b: usize,
    p: &[u8],
    q: &[u8],
    out_a: &mut [u8],
    out_b: &mut [u8],
) {
    recover_2data_from(data, lost_a, lost_b, p, q, out_a, out_b, 0);
}

pub(crate) fn xor_gen_from(data: &[&[u8]], p: &mut [u8], from: usize) {
    for (off, pb) in p.iter_mut().enumerate().skip(from) {
        *pb = data.iter().fold(0, |acc, d| acc ^ d[off]);
    }
}

pub(crate) fn gen_syndrome_from(data: &[&[u8]], p: &mut [u8], q: &mut [u8], from: usize) {
    for off in from..p.len() {
        let (mut pb, mut qb) = (0u8, 0u8);
        for (i, d) in data.iter().enumerate() {
            pb ^= d[off];
            qb ^= mul(pow_g(i), d[off]);
        }
        p[off] = pb;
        q[off] = qb;
    }
}

pub(crate) fn xor_syndrome_from(
    data: &[&[u8]],
    start: usize,
    stop: usize,
    p: &mut [u8],
    q: &mut [u8],
    from: usize,
) {
    for off in from..p.len() {
        for (i, d) in data.iter().enumerate().take(stop + 1).skip(start) {
            p[off] ^= d[off];
            q[off] ^= mul(pow_g(i), d[off]);
        }
    }
}

pub(crate) fn rmw_update_from(coef: u8, old: &[u8], new: &[u8], p: &mut [u8], q: &mut [u8], from: usize) {
    for off in from..p.len() {
        let delta = old[off] ^ new[off];
        p[off] ^= delta;
        q[off] ^= mul(coef, delta);
    }
}

pub(crate) fn recover_p_from(data: &[&[u8]], lost: usize, p: &[u8], out: &mut [u8], from: usize) {
    for off in from..out.len() {
        let mut b = p[off];
        for (i, d) in data.iter().enumerate() {
            if i != lost {
                b ^= d[off];
            }
        }
        out[off] = b;
    }
}

pub(crate) fn recover_q_from(data: &[&[u8]], lost: usize, q: &[u8], out: &mut [u8], from: usize) {
    let scale = inv(pow_g(lost));
    for off in from..out.len() {
        let mut b = q[off];
        for (i, d) in data.iter().enumerate() {
            if i != lost {
                b ^= mul(pow_g(i), d[off]);
            }
        }
        out[off] = mul(scale, b);
    }
}

/// Two lost data blocks a and b: with Pxy = P ^ (XOR of survivors) = Da ^ Db and
/// Qxy = Q ^ (sum of survivors) = g^a Da ^ g^b Db, Da = (Qxy ^ g^b Pxy) / (g^a ^ g^b).
#[allow(clippy::too_many_arguments)]
pub(crate) fn recover_2data_from(
    data: &[&[u8]],
    lost_a: usize,
    lost_b: usize,
    p: &[u8],
    q: &[u8],
    out_a: &mut [u8],
    out_b: &mut [u8],
    from: usize,
) {
    let (ga, gb) = (pow_g(lost_a), pow_g(lost_b));
    let denom_inv = inv(ga ^ gb);
    for off in from..out_a.len() {
        let (mut pxy, mut qxy) = (p[off], q[off]);
        for (i, d) in data.iter().enumerate() {
            if i != lost_a && i != lost_b {
                pxy ^= d[off];
                qxy ^= mul(pow_g(i), d[off]);
            }
        }
        let da = mul(denom_inv, qxy ^ mul(gb, pxy));
        out_a[off] = da;
        out_b[off] = pxy ^ da;
    }
}
