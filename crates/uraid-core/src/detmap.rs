//! Hash maps whose iteration order depends only on what was inserted, so one simulator seed
//! gives one trace on every run and machine (std's default hasher is randomly keyed).

use std::hash::{BuildHasherDefault, Hasher};

/// A small multiply-rotate hasher for integer keys (FxHash's scheme).
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

pub type DetMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FxHasher>>;
