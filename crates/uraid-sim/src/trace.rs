//! The run's trace hash: a 64-bit hash over every simulator event, identical on every
//! machine for the same seed (it hashes integers in a fixed byte order, never pointers,
//! floats or hash-map iteration order).

/// FNV-1a's constants applied a 64-bit word at a time, not per byte: the simulator hashes
/// several words for every member I/O, and per-byte FNV would be a visible share of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceHasher {
    state: u64,
    events: u64,
}

const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;

impl Default for TraceHasher {
    fn default() -> Self {
        TraceHasher { state: FNV_OFFSET, events: 0 }
    }
}

impl TraceHasher {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    pub fn word(&mut self, w: u64) {
        // A final avalanche per word: plain word-wise FNV would let low bits of later words
        // cancel earlier differences too easily.
        let mut x = self.state ^ w;
        x = x.wrapping_mul(FNV_PRIME);
        x ^= x >> 29;
        self.state = x;
    }

    /// One event: a tag saying what happened, then its fields.
    #[inline]
    pub fn event(&mut self, tag: u64, fields: &[u64]) {
        self.events += 1;
        self.word(tag);
        for &f in fields {
            self.word(f);
        }
    }

    pub fn bytes(&mut self, data: &[u8]) {
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().unwrap_or([0; 8])));
        }
        for &b in chunks.remainder() {
            self.word(b as u64);
        }
    }

    pub fn value(&self) -> u64 {
        let mut z = self.state ^ self.events;
        z = (z ^ (z >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        z ^ (z >> 33)
    }

    pub fn events(&self) -> u64 {
        self.events
    }
}
