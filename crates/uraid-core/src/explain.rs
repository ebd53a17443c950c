//! What one request costs on an idle array: the member I/Os the engine issues for it.

use crate::api::*;
use crate::config::{ArrayConfig, MemberConfig, MemberState, Tunables};
use crate::engine::Engine;
use crate::geometry::Geometry;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberCost {
    pub member: usize,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    /// Member reads and writes (flushes are not counted).
    pub reads: u64,
    pub writes: u64,
    pub per_member: Vec<MemberCost>,
    /// Every member I/O in issue order: (member, op, offset within the member's data area, length).
    pub ios: Vec<(usize, MemberIoOp, u64, u64)>,
    pub full_stripe_writes: u64,
    pub rmw_writes: u64,
    pub rcw_writes: u64,
}

/// Run `op` over [offset_bytes, +len_bytes) on an idle, optimal array of shape `geo` with
/// `tunables`, and report its member I/Os. Members are all zeroes; `failed` members are missing.
pub fn explain(
    geo: Geometry,
    tunables: Tunables,
    failed: &[usize],
    op: RequestOp,
    offset_bytes: u64,
    len_bytes: u64,
) -> Result<Explanation, String> {
    let n = geo.raid_disks;
    let mut members = vec![MemberConfig { data_offset_bytes: 0, state: MemberState::InSync }; n];
    for &f in failed {
        let m = members.get_mut(f).ok_or_else(|| format!("failed member {f} is not one of 0..{n}"))?;
        m.state = MemberState::Missing;
    }
    let mut engine = Engine::new(ArrayConfig { geometry: geo, members, tunables, read_only: false })
        .map_err(|e| e.to_string())?;
    let data = if op == RequestOp::Write { vec![0u8; len_bytes as usize] } else { Vec::new() };
    let req = Request { id: 1, op, offset_bytes, len_bytes, fua: false, data };
    engine.submit(req, 0).map_err(|_| "engine busy".to_string())?;
    engine.unplug(0);
    let mut rec = Recorder {
        per_member: (0..n).map(|member| MemberCost { member, ..Default::default() }).collect(),
        ios: Vec::new(),
        done: Vec::new(),
    };
    let mut result = None;
    crate::drive::run_until_idle(&mut engine, &mut rec, &mut 0, 1, |c| result = Some(c.result));
    match result {
        Some(Ok(_)) => {}
        Some(Err(e)) => return Err(e.to_string()),
        None => return Err("the request did not complete".into()),
    }
    let stats = engine.stats();
    Ok(Explanation {
        reads: rec.per_member.iter().map(|c| c.reads).sum(),
        writes: rec.per_member.iter().map(|c| c.writes).sum(),
        per_member: rec.per_member,
        ios: rec.ios,
        full_stripe_writes: stats.full_stripe_writes,
        rmw_writes: stats.rmw_writes,
        rcw_writes: stats.rcw_writes,
    })
}

/// Members of zeroes that answer at once, counting what they are asked.
struct Recorder {
    per_member: Vec<MemberCost>,
    ios: Vec<(usize, MemberIoOp, u64, u64)>,
    done: Vec<MemberIoCompletion>,
}

impl crate::drive::MemberExecutor for Recorder {
    fn issue(&mut self, io: MemberIo) {
        let c = &mut self.per_member[io.member];
        match io.op {
            MemberIoOp::Read => {
                c.reads += 1;
                c.read_bytes += io.len_bytes;
            }
            MemberIoOp::Write => {
                c.writes += 1;
                c.write_bytes += io.len_bytes;
            }
            MemberIoOp::Flush => {}
        }
        self.ios.push((io.member, io.op, io.offset_bytes, io.len_bytes));
        let data = if io.op == MemberIoOp::Read { vec![0u8; io.len_bytes as usize] } else { Vec::new() };
        self.done.push(MemberIoCompletion { id: io.id, result: Ok(data) });
    }
    fn poll(&mut self, out: &mut Vec<MemberIoCompletion>) {
        out.append(&mut self.done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{algorithm, Level};

    fn cost(level: Level, n: usize, rmw_level: u8, off: u64, len: u64) -> (u64, u64) {
        let geo = Geometry::new(level, n, algorithm::LEFT_SYMMETRIC, 128, &vec![1 << 21; n]).unwrap();
        let t = Tunables { rmw_level, ..Tunables::default() };
        let e = explain(geo, t, &[], RequestOp::Write, off, len).unwrap();
        (e.reads, e.writes)
    }

    #[test]
    fn raid6_64k_write_costs_as_md() {
        // The seed 004 table: one chunk written on 8+2 and 14+2.
        assert_eq!(cost(Level::Raid6, 10, 1, 0, 64 << 10), (3, 3));
        assert_eq!(cost(Level::Raid6, 10, 0, 0, 64 << 10), (7, 3));
        assert_eq!(cost(Level::Raid6, 16, 1, 0, 64 << 10), (3, 3));
        assert_eq!(cost(Level::Raid6, 16, 0, 0, 64 << 10), (13, 3));
        assert_eq!(cost(Level::Raid6, 10, 1, 64 << 10, 64 << 10), (3, 3));
    }

    #[test]
    fn full_stripe_writes_read_nothing() {
        assert_eq!(cost(Level::Raid6, 10, 1, 0, 8 * (64 << 10)), (0, 10));
        assert_eq!(cost(Level::Raid5, 4, 1, 0, 3 * (64 << 10)), (0, 4));
        assert_eq!(cost(Level::Raid5, 4, 0, 0, 3 * (64 << 10)), (0, 4));
    }

    #[test]
    fn rmw_level_two_prefers_rmw_on_ties() {
        // RAID5 4 members, half a stripe: RMW reads old data + P = 2 chunks... vs RCW 1 chunk.
        assert_eq!(cost(Level::Raid5, 4, 1, 0, 64 << 10), (2, 2));
        assert_eq!(cost(Level::Raid5, 4, 0, 0, 64 << 10), (2, 2));
        // 3 members, one chunk: RMW reads data + P (2), RCW reads the other data (1).
        assert_eq!(cost(Level::Raid5, 3, 1, 0, 64 << 10), (1, 2));
        assert_eq!(cost(Level::Raid5, 3, 2, 0, 64 << 10), (1, 2));
    }
}
