//! Read balancing across copies for raid1 and raid10 (gmirror's algorithms, seed 003).

use crate::geometry::Extent;
use crate::rdev::MemberRt;

pub use crate::config::Balance;

/// md's fix_read_error for a raid1/10 read: the copies in `bad` failed to read
/// `[start, start + len)` (array sectors), a good copy's data is written over them. Client
/// writes into the range wait while it runs (md freezes the array for it), and it reads
/// the good copy only once no write is in flight there, so what it writes back is never
/// older than an acknowledged write.
#[derive(Debug)]
pub(crate) struct ReadFix {
    pub id: u64,
    pub start: u64,
    pub len: u64,
    /// Members whose copy failed to read (rewritten).
    pub bad: u128,
    /// The read that waits for the fix (md completes a read only after fixing).
    pub req: crate::api::RequestId,
    pub phase: FixPhase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FixPhase {
    /// Writes into the range are in flight: their data must land before the good copy is read.
    Waiting,
    /// A good copy is being read.
    Reading,
    /// The bad copies are being written: how many writes are left.
    Writing(u32),
}

impl ReadFix {
    pub(crate) fn overlaps(&self, sector: u64, len: u64) -> bool {
        self.start < sector + len && sector < self.start + self.len
    }
}

/// `split` divides reads of at least this many bytes across the mirrors.
pub const SPLIT_SLICE_BYTES: u64 = 128 * 1024;

/// `load-time` sends a read to a member left unused this long (gmirror's 2 s), so a
/// member that once answered slowly gets another chance.
const LOAD_TIME_IDLE_NS: u64 = 2_000_000_000;

/// Distances up to this many sectors count as "near"; beyond, all are equal (gmirror's view:
/// a seek is a seek).
const NEAR_SECTORS: u64 = 8 * 1024;

/// Pick which copy serves a read of `len_sectors` from each copy's start. `copies` are the
/// candidates; `exclude` a bit mask of candidate members already tried. Returns an index
/// into `copies`. `now_ns`: the engine's clock.
pub(crate) fn choose_copy(
    balance: Balance,
    members: &[MemberRt],
    copies: &[Extent],
    len_sectors: u64,
    exclude: u128,
    rr_next: &mut usize,
    now_ns: u64,
) -> Option<usize> {
    // The whole piece must be readable: a recovering member's last sector decides (a piece
    // straddling its recovery_offset would be served partly from unrebuilt sectors), and
    // none of it may be in the member's bad-block log (md's read_balance).
    let usable = |i: &usize| {
        let e = &copies[*i];
        (e.member >= 128 || exclude & (1u128 << e.member) == 0)
            && members[e.member].readable_range(e.member_sector, len_sectors)
    };
    let mut candidates: Vec<usize> = (0..copies.len()).filter(usable).collect();
    if candidates.is_empty() {
        return None;
    }
    // Write-mostly members serve a read only when nothing else can (md's read_balance).
    let is_wm = |i: &usize| members[copies[*i].member].write_mostly;
    if candidates.iter().any(|i| !is_wm(i)) {
        candidates.retain(|i| !is_wm(i));
    }
    let pick = match balance {
        Balance::Load | Balance::Split => *candidates.iter().min_by_key(|&&i| {
            let e = &copies[i];
            let m = &members[e.member];
            let distance = m.last_end_sector.abs_diff(e.member_sector);
            let class = if distance == 0 {
                0
            } else if distance <= NEAR_SECTORS {
                1
            } else {
                2
            };
            (m.inflight as u64 * 2 + class, class, e.member)
        })?,
        Balance::LoadTime => {
            let idle = candidates.iter().find(|&&i| {
                now_ns.saturating_sub(members[copies[i].member].last_dispatch_ns) >= LOAD_TIME_IDLE_NS
            });
            match idle {
                Some(&i) => i,
                None => *candidates
                    .iter()
                    .min_by_key(|&&i| (members[copies[i].member].last_delay_ns, copies[i].member))?,
            }
        }
        Balance::RoundRobin => {
            let k = *rr_next % candidates.len();
            *rr_next = rr_next.wrapping_add(1);
            candidates[k]
        }
        Balance::Prefer => *candidates.iter().min_by_key(|&&i| copies[i].member)?,
    };
    Some(pick)
}
