//! The checker's reference model and its read-backs. Per 512-byte sector: the write id it
//! must read back now (`cur`), the last value a completed flush made durable (`durable`),
//! and every write since that flush (`since`): after a crash each sector must hold
//! `durable` or one of `since`, never anything else.

use uraid_core::array::Array;
use uraid_core::rng::Rng;
use uraid_core::{Request, RequestCompletion, RequestOp};

use crate::array::{RunOutcome, SimArray};

pub(super) const SECTOR: u64 = 512;

/// The 512 bytes write `w` puts at array sector `s` (0 = zeroes: trims, write-zeroes, never written).
pub(super) fn pattern(w: u32, s: u64, out: &mut [u8]) {
    if w == 0 {
        out.fill(0);
        return;
    }
    let mut r = Rng::new(((w as u64) << 40) ^ s);
    for c in out.chunks_mut(8) {
        c.copy_from_slice(&r.next_u64().to_le_bytes());
    }
}

/// Write ids from here up name a sector's contents after a write that covered it only in
/// part (an unaligned or sub-sector write's edge sector): kept whole in `Model::mixed`.
const MIXED: u32 = 0x8000_0000;

pub(super) struct Model {
    pub cur: Vec<u32>,
    pub durable: Vec<u32>,
    pub since: Vec<Vec<u32>>,
    /// The contents of each mixed id (>= `MIXED`), by (id, sector).
    mixed: std::collections::BTreeMap<(u32, u64), Box<[u8]>>,
    next_mixed: u32,
    /// Reads in flight that are not sector-aligned: id -> (offset, length) in bytes.
    pub unaligned_reads: std::collections::BTreeMap<u64, (u64, u64)>,
}

impl Model {
    pub fn new(sectors: u64) -> Self {
        Model {
            cur: vec![0; sectors as usize],
            durable: vec![0; sectors as usize],
            since: vec![Vec::new(); sectors as usize],
            mixed: Default::default(),
            next_mixed: MIXED,
            unaligned_reads: Default::default(),
        }
    }

    /// The 512 bytes write id `w` left at sector `s` (a pattern, or a mixed sector's bytes).
    pub fn contents(&self, w: u32, s: u64, out: &mut [u8]) {
        if w >= MIXED {
            out.copy_from_slice(&self.mixed[&(w, s)]);
        } else {
            pattern(w, s, out);
        }
    }

    /// Write `w` (0: zeroes) over bytes `[off, off + len)`, any alignment: the sectors it
    /// covers whole hold `w`, a partly covered sector its old contents with `w`'s bytes
    /// over them (the array's read-modify-write of the edge sector writes it whole).
    pub fn write_bytes(&mut self, w: u32, off: u64, len: u64) {
        let (first, end) = (off / SECTOR, (off + len).div_ceil(SECTOR));
        for s in first..end {
            let lo = (s * SECTOR).max(off) - s * SECTOR;
            let hi = ((s + 1) * SECTOR).min(off + len) - s * SECTOR;
            if lo == 0 && hi == SECTOR {
                self.write(w, s, 1);
                continue;
            }
            let mut now = vec![0u8; SECTOR as usize];
            self.contents(self.cur[s as usize], s, &mut now);
            let mut new = vec![0u8; SECTOR as usize];
            pattern(w, s, &mut new);
            now[lo as usize..hi as usize].copy_from_slice(&new[lo as usize..hi as usize]);
            let id = self.next_mixed;
            self.next_mixed += 1;
            self.mixed.insert((id, s), now.into_boxed_slice());
            self.write(id, s, 1);
        }
    }

    /// Bytes `[off, off + data.len())` as read hold what the model says now.
    pub fn check_bytes(&self, off: u64, data: &[u8], buf: &mut [u8]) -> Result<(), String> {
        let end = off + data.len() as u64;
        for s in off / SECTOR..end.div_ceil(SECTOR) {
            self.contents(self.cur[s as usize], s, buf);
            let lo = (s * SECTOR).max(off);
            let hi = ((s + 1) * SECTOR).min(end);
            if data[(lo - off) as usize..(hi - off) as usize]
                != buf[(lo - s * SECTOR) as usize..(hi - s * SECTOR) as usize]
            {
                return Err(format!(
                    "bytes {lo}..{hi} (sector {s}) differ from the model (expected write {})",
                    self.cur[s as usize]
                ));
            }
        }
        Ok(())
    }

    /// The array grew to `sectors` (a reshape ended): the new space reads zeroes, as the
    /// reshape writes it, durable as the windows it moved.
    pub fn grow_to(&mut self, sectors: u64) {
        let n = sectors.max(self.sectors()) as usize;
        self.cur.resize(n, 0);
        self.durable.resize(n, 0);
        self.since.resize(n, Vec::new());
    }

    pub fn sectors(&self) -> u64 {
        self.cur.len() as u64
    }

    pub fn write(&mut self, w: u32, s0: u64, n: u64) {
        for s in s0..s0 + n {
            self.cur[s as usize] = w;
            self.since[s as usize].push(w);
        }
    }

    pub fn flushed(&mut self) {
        self.durable.copy_from_slice(&self.cur);
        self.since.iter_mut().for_each(|v| v.clear());
    }

    /// After a power cycle sector `s` may hold its durable contents or any write since.
    pub fn holds_durable_or_later(&self, s: u64, got: &[u8], buf: &mut [u8]) -> bool {
        std::iter::once(self.durable[s as usize]).chain(self.since[s as usize].iter().copied()).any(|w| {
            self.contents(w, s, buf);
            buf == got
        })
    }

    /// Sectors `[s0, s1)` as read hold what the model says now.
    pub fn check(&self, s0: u64, s1: u64, data: &[u8], buf: &mut [u8]) -> Result<(), String> {
        for s in s0..s1 {
            let got = &data[((s - s0) * SECTOR) as usize..((s - s0 + 1) * SECTOR) as usize];
            self.contents(self.cur[s as usize], s, buf);
            if got != buf {
                return Err(format!(
                    "sector {s} differs from the model (expected write {})",
                    self.cur[s as usize]
                ));
            }
        }
        Ok(())
    }
}

/// A request in flight: (id, first sector, end sector, op).
pub(super) type Inflight = Vec<(u64, u64, u64, RequestOp)>;

/// A request completed: a read is checked, a flush makes everything before it durable.
pub(super) fn settle(
    model: &mut Model,
    inflight: &mut Inflight,
    c: RequestCompletion,
    buf: &mut [u8],
) -> Result<(), String> {
    let Some(pos) = inflight.iter().position(|x| x.0 == c.id) else {
        return Ok(()); // a verification read
    };
    let (id, s0, s1, op) = inflight.swap_remove(pos);
    let data = c.result.map_err(|e| format!("request {id} ({op:?} sectors {s0}..{s1}) failed: {e}"))?;
    match op {
        RequestOp::Flush => model.flushed(),
        RequestOp::Read => match model.unaligned_reads.remove(&id) {
            Some((off, _)) => model.check_bytes(off, &data, buf).map_err(|e| format!("read {id}: {e}"))?,
            None => model.check(s0, s1, &data, buf).map_err(|e| format!("read {id}: {e}"))?,
        },
        _ => {}
    }
    Ok(())
}

/// Reads the whole array in 128 KiB pieces, handing each to `each` (first sector, result).
/// Err when a read did not finish; `Ok(false)` when the power was lost on the way.
pub(super) fn read_all(
    array: &mut SimArray<Array>,
    next_id: &mut u64,
    each: impl FnMut(u64, Result<Vec<u8>, uraid_core::RequestError>) -> Result<(), String>,
) -> Result<bool, String> {
    read_all_split(array, next_id, false, each)
}

/// One read of sectors `[off, off + len)`: its result, `None` when the power was lost.
fn read_piece(
    array: &mut SimArray<Array>,
    next_id: &mut u64,
    off: u64,
    len: u64,
) -> Result<Option<Result<Vec<u8>, uraid_core::RequestError>>, String> {
    let id = *next_id;
    *next_id += 1;
    array.submit(Request::read(id, off * SECTOR, len * SECTOR));
    match array.run_until_idle() {
        RunOutcome::Idle => {}
        RunOutcome::PowerLost { .. } => return Ok(None),
        other => return Err(format!("a read of sectors {off}+{len} ended {other:?}")),
    }
    let c = array.take_completions().into_iter().find(|c| c.completion.id == id).ok_or("a read was lost")?;
    Ok(Some(c.completion.result))
}

/// As [`read_all`]; with `split_errors` a piece that fails is read again sector by sector,
/// each sector handed to `each` alone (which sectors fail, and that the others read right).
pub(super) fn read_all_split(
    array: &mut SimArray<Array>,
    next_id: &mut u64,
    split_errors: bool,
    mut each: impl FnMut(u64, Result<Vec<u8>, uraid_core::RequestError>) -> Result<(), String>,
) -> Result<bool, String> {
    // The size served: mid-reshape the engine's geometry is the next, larger one.
    let sectors = array.engine().view().array_sectors;
    let mut off = 0;
    while off < sectors {
        let len = 256.min(sectors - off);
        let Some(r) = read_piece(array, next_id, off, len)? else { return Ok(false) };
        if r.is_err() && split_errors {
            for s in off..off + len {
                let Some(r) = read_piece(array, next_id, s, 1)? else { return Ok(false) };
                each(s, r)?;
            }
        } else {
            each(off, r)?;
        }
        off += len;
    }
    Ok(true)
}

/// The whole array reads back as the model says (a power loss on the way ends the check:
/// the power cycle that follows checks everything).
pub(super) fn verify_all(
    array: &mut SimArray<Array>,
    model: &Model,
    next_id: &mut u64,
    buf: &mut [u8],
) -> Result<(), String> {
    read_all(array, next_id, |off, r| {
        let data = r.map_err(|e| format!("final read at sector {off}: {e}"))?;
        let len = data.len() as u64 / SECTOR;
        model.check(off, off + len, &data, buf).map_err(|e| format!("final read-back: {e}"))
    })
    .map(|_| ())
}

/// A failed array answers every read with an error; whatever it still serves must be
/// something acknowledged there (durable, or a write since), never anything else.
pub(super) fn failed_array_serves_nothing_wrong(
    array: &mut SimArray<Array>,
    model: &Model,
    next_id: &mut u64,
    buf: &mut [u8],
) -> Result<(), String> {
    read_all(array, next_id, |off, r| {
        let Ok(data) = r else { return Ok(()) };
        for (k, got) in data.chunks(SECTOR as usize).enumerate() {
            if !model.holds_durable_or_later(off + k as u64, got, buf) {
                return Err(format!("the failed array served sector {} wrong", off + k as u64));
            }
        }
        Ok(())
    })
    .map(|_| ())
}
