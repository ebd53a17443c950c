//! Sets of sectors within one stripe head, as bit masks (a head is at most 128 sectors high).

/// Bit `r` set = row (sector) `r` of the stripe head.
pub type SectorMask = u128;

/// Rows [lo, hi) as a mask.
pub fn rows(lo: u64, hi: u64) -> SectorMask {
    debug_assert!(lo <= hi && hi <= 128);
    if hi <= lo {
        return 0;
    }
    let len = hi - lo;
    let ones = if len == 128 { u128::MAX } else { (1u128 << len) - 1 };
    ones << lo
}

/// Contiguous runs of set bits as (first row, row count).
pub fn runs(mut mask: SectorMask) -> impl Iterator<Item = (u64, u64)> {
    let mut base = 0u64;
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let skip = mask.trailing_zeros() as u64;
        mask = if skip == 128 { 0 } else { mask >> skip };
        base += skip;
        let len = mask.trailing_ones() as u64;
        let start = base;
        mask = if len >= 128 { 0 } else { mask >> len };
        base += len;
        Some((start, len))
    })
}

/// The smallest contiguous span covering every set bit.
pub fn span(mask: SectorMask) -> SectorMask {
    if mask == 0 {
        return 0;
    }
    rows(mask.trailing_zeros() as u64, 128 - mask.leading_zeros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn runs_and_spans() {
        assert_eq!(runs(0).count(), 0);
        assert_eq!(runs(rows(0, 128)).collect::<Vec<_>>(), vec![(0, 128)]);
        assert_eq!(runs(rows(3, 5) | rows(9, 10)).collect::<Vec<_>>(), vec![(3, 2), (9, 1)]);
        assert_eq!(runs(rows(120, 128)).collect::<Vec<_>>(), vec![(120, 8)]);
        assert_eq!(span(rows(3, 5) | rows(9, 10)), rows(3, 10));
        assert_eq!(rows(5, 5), 0);
    }
}
