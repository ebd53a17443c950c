//! An array from an assembly plan: what `uraid serve`, `uraid sim` and the tests start the
//! same way. The engine gets each slot's member (reached through the caller's index of
//! it), its write-mostly flag and bad-block log, and the resync the superblocks ask for;
//! the superblock state keeps the active members and spares; a hot spare takes a missing
//! slot at once, as md's remove_and_add_spares does.

use std::collections::{BTreeMap, VecDeque};

use super::rounds::{Rounds, Work};
use super::state::Array;
use super::superblocks::{
    empty_ppl_area, ArrayMember, ArraySuperblocks, DevRole, MemberKey, MetaIo, MetaWriteKind,
};
use super::upkeep::{UpkeepClock, UpkeepPeriods};
use crate::api::*;
use crate::config::{ArrayConfig, MemberState, Tunables};
use crate::detmap::DetMap;
use crate::engine::Engine;
use crate::meta::{
    feature, has_ppl, ppl_area, ppl_signature, ppl_usable_sectors, ppl_uses_multiple, AssemblyPlan,
    BadBlocks, Superblock, MAX_SECTOR,
};

/// One offered member, as the caller reads it.
#[derive(Clone, Debug)]
pub struct StartMember {
    /// The caller's index of the device: its member I/O carries it.
    pub key: MemberKey,
    pub name: String,
    pub sb: Superblock,
    /// md's bad-block log as read (None: no log).
    pub bad_blocks: Option<BadBlocks>,
}

impl StartMember {
    /// Member `key` as `read_member` read it; an error names what md would refuse.
    pub fn from_metadata(key: MemberKey, meta: crate::meta::MemberMetadata) -> Result<StartMember, String> {
        Ok(StartMember {
            key,
            sb: meta.offered.superblock.map_err(|e| format!("{}: {e}", meta.offered.name))?,
            name: meta.offered.name,
            bad_blocks: meta.bad_blocks?,
        })
    }
}

#[derive(Clone, Debug, Default)]
pub struct ArrayOptions {
    pub tunables: Tunables,
    pub read_only: bool,
    /// The caller's clock now (its `now_ns` from here on counts on the same clock).
    pub now_ns: TimeNs,
    /// Wall-clock seconds at the caller's `now_ns == 0` (superblock utime).
    pub epoch_seconds: u64,
    pub periods: UpkeepPeriods,
}

impl Array {
    /// Starts the array `plan` describes. `offered` are the plan's offered members in its
    /// order (the plan's member indices point into it); members the plan leaves out
    /// (stale ones) are not used: the caller may add them back.
    pub fn start(
        plan: &AssemblyPlan,
        offered: Vec<StartMember>,
        opts: ArrayOptions,
    ) -> Result<Array, String> {
        let geometry = plan.geometry()?;
        let mut tunables = opts.tunables;
        // A member failure is in the superblocks before anything that relied on it is
        // acknowledged (md's MD_SB_CHANGE_PENDING).
        tunables.hold_completions_on_member_failure = !opts.read_only;
        let config =
            ArrayConfig { geometry, members: plan.member_configs(), tunables, read_only: opts.read_only };
        // Mid-reshape and writable: the reshape goes on while the array serves (see
        // `reshape_ops`); read-only, reads are mapped across the checkpoint by the engine.
        let mut reshaping = None;
        let mut engine = match &plan.reshape {
            Some(r) if !opts.read_only => {
                let io: Vec<Option<usize>> = plan
                    .slots
                    .iter()
                    .map(|s| s.as_ref().and_then(|s| offered.get(s.member)).map(|m| m.key as usize))
                    .collect();
                // A spare's log is not the reshape's: it holds no data of either layout.
                let mut in_slots = plan.slots.iter().flatten().filter_map(|s| offered.get(s.member));
                let any_bad_blocks = in_slots.any(|m| m.bad_blocks.as_ref().is_some_and(|b| !b.is_empty()));
                let dirty = plan.resync.engine_ranges().is_some();
                let (engine, r) = Array::resume_reshape(&config, r, &io, any_bad_blocks, dirty).map_err(|e| {
                    format!("{e} (serve it --read-only to read it, or finish it with `uraid grow --continue`)")
                })?;
                reshaping = Some(r);
                engine
            }
            _ => Engine::new(config).map_err(|e| format!("the engine refused the array: {e}"))?,
        };
        if let (Some(r), None) = (&plan.reshape, &reshaping) {
            engine.set_reshape(r.clone())?;
        }
        let mut members = Vec::new();
        let mut names = BTreeMap::new();
        let mut logs = Vec::new();
        let fresh = offered.get(plan.freshest).map(|m| m.sb.clone());
        for (slot, s) in plan.slots.iter().enumerate() {
            let Some(s) = s else { continue };
            let m = offered.get(s.member).ok_or("the plan names a member that was not offered")?;
            engine.set_io_member(slot, m.key as usize)?;
            if s.write_mostly {
                engine.set_write_mostly(slot, true)?;
            }
            if reshaping.is_none() {
                engine.set_bad_blocks(slot, m.bad_blocks.clone());
            }
            let recovering = s.recovery_offset_sectors.is_some();
            let offsets = (s.data_offset_sectors, s.data_size_sectors, s.new_data_offset_sectors);
            members.push(ArrayMember {
                key: m.key,
                sb: caught_up(&m.sb, fresh.as_ref(), offsets),
                role: DevRole::Active { slot, recovering },
            });
            names.insert(m.key, m.name.clone());
            logs.extend(m.bad_blocks.clone().map(|bb| (m.key, bb)));
        }
        for &i in &plan.spares {
            let m = offered.get(i).ok_or("the plan names a spare that was not offered")?;
            let sb = match &fresh {
                Some(f) => caught_up(&m.sb, Some(f), spare_offsets(&m.sb, f)),
                None => m.sb.clone(),
            };
            members.push(ArrayMember { key: m.key, sb, role: DevRole::Spare });
            names.insert(m.key, m.name.clone());
            logs.extend(m.bad_blocks.clone().map(|bb| (m.key, bb)));
        }
        let ppl = !opts.read_only && members.iter().any(|m| has_ppl(&m.sb));
        if ppl {
            let mut areas = vec![None; plan.slots.len()];
            for m in &mut members {
                if let Some(slot) = m.role.active_slot() {
                    areas[slot] = ppl_area(&m.sb);
                }
                // md's super_1_sync records which kind of log it keeps.
                let multiple =
                    ppl_area(&m.sb).and_then(|(_, s)| ppl_usable_sectors(s)).is_some_and(ppl_uses_multiple);
                if multiple && has_ppl(&m.sb) {
                    m.sb.feature_map = (m.sb.feature_map & !feature::PPL) | feature::MULTIPLE_PPLS;
                }
            }
            engine.enable_ppl(ppl_signature(&plan.uuid), &areas);
        }
        // The freshest superblock first: new members copy its fields.
        let freshest = offered.get(plan.freshest).map(|m| m.key);
        if let Some(pos) = members.iter().position(|m| Some(m.key) == freshest) {
            members.swap(0, pos);
        }
        if members.is_empty() {
            return Err("no member to start the array with".into());
        }
        let resync_pending = plan.resync.engine_ranges().is_some();
        if !opts.read_only && reshaping.is_none() {
            if let Some(ranges) = plan.resync.engine_ranges() {
                engine.start_resync(ranges, opts.now_ns);
            }
        }
        let bitmap =
            plan.bitmap.as_ref().and_then(|b| b.write_intent().map(|w| (w, b.offset_from_sb_sectors)));
        // md's max_write_behind, from the bitmap superblock: only with the bitmap, whose
        // bits cover a behind write until it lands; raid1 only (md's write_behind).
        let write_behind = bitmap.as_ref().map_or(0, |(w, _)| w.superblock().write_behind);
        if write_behind > 0 && !opts.read_only {
            // Other levels keep the field and ignore it, as md does.
            let _ = engine.set_write_behind(write_behind);
        }
        let dirty = plan.resync_offset != MAX_SECTOR;
        let mut sbs = ArraySuperblocks::new(members, plan.events, dirty, resync_pending, bitmap);
        for (key, bb) in logs {
            sbs.load_bad_blocks(key, bb);
        }
        let mut array = Array {
            engine,
            sbs,
            read_only: opts.read_only,
            now_ns: opts.now_ns,
            epoch_seconds: opts.epoch_seconds,
            upkeep: UpkeepClock::new(opts.periods, opts.now_ns),
            rounds: Rounds::default(),
            after: BTreeMap::new(),
            write_barrier: 0,
            dirty_seq: 0,
            pages_seq: 0,
            held: VecDeque::new(),
            writes: DetMap::default(),
            behind: DetMap::default(),
            rmws: Vec::new(),
            splits: DetMap::default(),
            internal: DetMap::default(),
            next_internal: 0,
            arrivals: 0,
            to_engine: VecDeque::new(),
            out_done: VecDeque::new(),
            records_pending: 0,
            write_generation: 0,
            seen_generation: 0,
            clean_flush: false,
            checkpoint_out: false,
            daemon_queued: false,
            bitmap_activity: true,
            recovery_unrecorded: Vec::new(),
            spare_wanted: Vec::new(),
            promoting: Vec::new(),
            closing: None,
            notices: VecDeque::new(),
            released: Vec::new(),
            names,
            sync_samples: VecDeque::new(),
            last_sample_ns: opts.now_ns,
            reshaping,
            takeover: None,
            raid0_grow: None,
            raid0_grow_adds: false,
        };
        if !array.read_only {
            array.empty_ppl_logs();
            let states = array.engine.member_states();
            array.spare_wanted =
                (0..states.len()).filter(|&s| matches!(states[s], MemberState::Missing)).collect();
        }
        array.settle();
        Ok(array)
    }

    /// md's ppl_write_empty_header at every start: each active member's PPL area zeroed and
    /// given an empty header, before any write (a dirty array's log was replayed before
    /// the start, `meta::ppl_recover`). An old log left in an area could otherwise be
    /// taken for this run's after a crash and replayed over parity written since.
    fn empty_ppl_logs(&mut self) {
        let mut ios = Vec::new();
        for m in self.sbs.members() {
            let Some(slot) = m.role.active_slot() else { continue };
            let Some((offset_bytes, bytes)) = empty_ppl_area(&m.sb) else { continue };
            ios.push(MetaIo::Write {
                key: m.key,
                slot: Some(slot),
                what: MetaWriteKind::PplArea,
                offset_bytes,
                bytes,
            });
        }
        if !ios.is_empty() {
            self.write_barrier = self.rounds.push(Work::Raw(ios));
        }
    }
}

/// A member's superblock as the array's rounds write it from now on: one that missed the
/// freshest's round (a power cut inside the round starting or ending a reshape) takes the
/// array's fields from the freshest and `offsets` (data offset, data size, new data
/// offset: where assembly placed it). Left as it was, every later round would write its old
/// shape again, and the round ending the reshape would make nonsense of it.
fn caught_up(sb: &Superblock, fresh: Option<&Superblock>, offsets: (u64, u64, u64)) -> Superblock {
    let mut sb = sb.clone();
    if let Some(fresh) = fresh.filter(|f| sb.events < f.events) {
        sb.take_array_fields(fresh);
        let (data_offset, data_size, new_data_offset) = offsets;
        sb.set_offsets(data_offset, data_size, new_data_offset);
    }
    sb
}

/// A spare's offsets, as assembly places a member's: one that missed the start of a
/// reshape moving the data moves as the others do (mdadm gives every device the same
/// change), one that missed its end has its data offset moved already.
fn spare_offsets(sb: &Superblock, fresh: &Superblock) -> (u64, u64, u64) {
    let (reshaping, was_reshaping) = (fresh.has(feature::RESHAPE_ACTIVE), sb.has(feature::RESHAPE_ACTIVE));
    let own = u64::try_from(sb.new_data_offset()).unwrap_or(sb.data_offset);
    match (reshaping, was_reshaping) {
        (true, false) if fresh.has(feature::NEW_OFFSET) => {
            let moved = sb.data_offset.checked_add_signed(i64::from(fresh.new_offset));
            (sb.data_offset, sb.data_size, moved.unwrap_or(sb.data_offset))
        }
        (false, true) => {
            let size = sb.data_size.saturating_add(sb.data_offset).saturating_sub(own);
            (own, size, own)
        }
        _ => (sb.data_offset, sb.data_size, own),
    }
}
