//! A started array: the engine on its runtime thread, the metadata keeper, the NBD
//! device, and a monitor thread that turns engine events into superblock updates (member
//! failed, recovery checkpoint and end, resync end), takes hot spares, marks the array
//! clean when writes stop, and runs the bitmap daemon.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use uraid_core::array::{UpkeepClock, UpkeepPeriods};
use uraid_core::meta::{
    feature, ppl_area, ppl_signature, PplHeader, Superblock, SuperblockVersion, MAX_SECTOR,
};
use uraid_core::{Engine, EngineEvent, Geometry, MemberState, Request, SyncKind, SyncStatus};
use uraid_io::real::{Executor, ExecutorOptions, Member, MemberSet, OpenOptions};
use uraid_io::runtime::{ArrayRuntime, RoundHook, RuntimeError, RuntimeHandle, RuntimeOptions};

use super::assembly::Assembled;
use super::detail::{self, DetailInput, SlotView};
use super::device::ArrayDevice;
use super::member::MemberDev;
use super::meta::{DevRole, MetaDev, MetaKeeper};
use super::report::{detail_text, human_bytes, level_name, DetailInfo};

mod replace;

const MONITOR_PERIOD: Duration = Duration::from_millis(100);
const SPEED_WINDOW: Duration = Duration::from_secs(5);
/// How often a waiting flush looks whether the engine holds completions for a failure.
const FLUSH_POLL: Duration = Duration::from_millis(50);

/// What the monitor last saw of the engine.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub states: Vec<MemberState>,
    pub sync: Option<SyncStatus>,
    pub failed: bool,
    pub scrub: Option<super::detail::ScrubView>,
    /// Replacements being rebuilt (md's want_replacement).
    pub replacements: Vec<uraid_core::ReplacementStatus>,
    samples: VecDeque<(Instant, u64)>,
}

impl Snapshot {
    /// Sync speed in sectors per second over the last few seconds.
    pub fn sync_speed_sectors(&self) -> Option<f64> {
        let (t0, d0) = self.samples.front()?;
        let (t1, d1) = self.samples.back()?;
        let dt = t1.duration_since(*t0).as_secs_f64();
        (dt > 0.2 && d1 >= d0).then(|| (d1 - d0) as f64 / dt)
    }
}

pub struct RunningArray {
    pub handle: RuntimeHandle,
    runtime: Mutex<Option<ArrayRuntime>>,
    pub meta: Arc<MetaKeeper>,
    pub device: Arc<ArrayDevice>,
    pub name: String,
    pub geometry: Geometry,
    pub read_only: bool,
    used_dev_sectors: u64,
    snapshot: Mutex<Snapshot>,
    /// Serializes control operations and event handling.
    ops: Mutex<()>,
    stop: AtomicBool,
    monitor: Mutex<Option<JoinHandle<()>>>,
    /// Per slot: the member path the executor has there.
    slot_paths: Mutex<Vec<Option<String>>>,
    /// Slots whose recovery finished but whose flush did not: recorded on a later pass.
    recovery_unrecorded: Mutex<Vec<usize>>,
}

fn engine_of(e: &mut dyn std::any::Any) -> &mut Engine {
    e.downcast_mut::<Engine>().expect("the runtime runs a uraid_core::Engine")
}

pub(super) fn exec_open_options(read_only: bool) -> OpenOptions {
    OpenOptions { direct: true, read_only, log: true }
}

/// Placeholder for a slot with no member: the engine never issues I/O to it.
/// What md's `ppl_write_empty_header` does at every start: each active member's PPL area
/// zeroed and given an empty header. uraid does not log partial parity yet, so a log md
/// left behind must not survive this run: after a crash md would replay it over parity
/// that uraid's writes changed since.
fn reset_ppl_areas(
    members: &[MemberDev],
    superblocks: &[Superblock],
    slot_member: &[Option<usize>],
) -> anyhow::Result<()> {
    for &i in slot_member.iter().flatten() {
        let (m, sb) = (&members[i], &superblocks[i]);
        let Some((start, sectors)) = ppl_area(sb) else { continue };
        let header = PplHeader::empty(ppl_signature(&sb.set_uuid)).serialize().map_err(|e| anyhow!("{e}"))?;
        let mut area = vec![0u8; (sectors * 512) as usize];
        area[..header.len()].copy_from_slice(&header);
        m.write_at(start * 512, &area)
            .with_context(|| format!("{}: emptying the partial parity log", m.name))?;
        m.sync().with_context(|| format!("{}: fdatasync after emptying the partial parity log", m.name))?;
    }
    Ok(())
}

fn absent_member() -> anyhow::Result<Member> {
    Member::open(Path::new("/dev/null"), &OpenOptions { direct: false, read_only: false, log: false })
        .context("opening /dev/null as the placeholder of a missing slot")
}

impl RunningArray {
    /// `inline_request_max_bytes`: see `RuntimeOptions::run_on_submitter_max_bytes`.
    pub fn start(
        a: Assembled,
        read_only: bool,
        inline_request_max_bytes: u64,
        faults: Option<Arc<uraid_io::real::fault::Faults>>,
    ) -> anyhow::Result<Arc<RunningArray>> {
        let Assembled { members, superblocks, plan, mut config, slot_member } = a;
        config.read_only = read_only;
        // A member failure is written to the superblocks before anything more is acknowledged.
        config.tunables.hold_completions_on_member_failure = true;
        let geometry = config.geometry.clone();
        let mut engine =
            Engine::new(config.clone()).map_err(|e| anyhow!("the engine refused the array: {e}"))?;
        for (slot, m) in plan.slots.iter().enumerate() {
            if m.as_ref().is_some_and(|m| m.write_mostly) {
                engine.set_write_mostly(slot, true).map_err(|e| anyhow!("slot {slot}: {e}"))?;
            }
        }
        // md's super_1_load: each member's bad-block log; a log md would refuse stops the start.
        let mut logs = Vec::with_capacity(members.len());
        for (m, sb) in members.iter().zip(&superblocks) {
            logs.push(m.read_bad_blocks(sb)?);
        }
        for (slot, idx) in slot_member.iter().enumerate() {
            if let Some(i) = idx {
                engine.set_bad_blocks(slot, logs[*i].clone());
            }
        }
        if !read_only {
            reset_ppl_areas(&members, &superblocks, &slot_member)?;
        }
        let resync_pending = !matches!(plan.resync, uraid_core::meta::ResyncNeed::None);
        if !read_only {
            if let Some(ranges) = plan.resync.engine_ranges() {
                engine.start_resync(ranges, 0);
            }
        }
        let mut slot_paths = vec![None; slot_member.len()];
        let mut exec_members = Vec::with_capacity(slot_member.len());
        for (slot, idx) in slot_member.iter().enumerate() {
            match idx {
                Some(i) => {
                    exec_members.push(
                        Member::open(&members[*i].path, &exec_open_options(read_only))
                            .with_context(|| format!("{}: opening for I/O", members[*i].name))?,
                    );
                    slot_paths[slot] = Some(members[*i].name.clone());
                }
                None => exec_members.push(absent_member()?),
            }
        }
        let exec_opts = ExecutorOptions { faults: faults.clone(), ..ExecutorOptions::default() };
        let executor = Executor::new(MemberSet::from_members(exec_members), &exec_opts)
            .context("starting the I/O executor")?;

        let mut devs = Vec::new();
        for (i, m) in members.into_iter().enumerate() {
            let role = if let Some(slot) = slot_member.iter().position(|s| *s == Some(i)) {
                let recovering = matches!(config.members[slot].state, MemberState::Recovering { .. });
                DevRole::Active { slot, recovering }
            } else if plan.spares.contains(&i) {
                DevRole::Spare
            } else {
                continue; // stale or otherwise left out: never written
            };
            devs.push(MetaDev {
                name: m.name,
                path: m.path,
                file: m.file,
                sb: superblocks[i].clone(),
                role,
                identity: m.identity,
                bad_blocks: logs[i].take(),
            });
        }
        // The freshest superblock first: new members copy its fields.
        if let Some(pos) =
            devs.iter().position(|d| d.sb.device_uuid == superblocks[plan.freshest].device_uuid)
        {
            devs.swap(0, pos);
        }
        let bitmap =
            plan.bitmap.as_ref().and_then(|b| b.write_intent().map(|w| (w, b.offset_from_sb_sectors)));
        let meta = Arc::new(MetaKeeper::new(
            devs,
            plan.events,
            plan.resync_offset != MAX_SECTOR,
            resync_pending,
            bitmap,
            read_only,
        ));
        // The array thread completes NBD requests in rounds; it sends each round's replies
        // to a connection in one syscall.
        let opts = RuntimeOptions {
            round_end: Some(RoundHook(Arc::new(uraid_nbd::flush_batched_replies))),
            run_on_submitter_max_bytes: inline_request_max_bytes,
            ..RuntimeOptions::default()
        };
        let runtime = ArrayRuntime::start(engine, executor, &opts).context("starting the array thread")?;
        let handle = runtime.handle();
        meta.attach_runtime(handle.clone());
        if let Some(f) = faults {
            meta.set_faults(f);
        }
        let to_engine = handle.clone();
        meta.on_member_failed(Box::new(move |slot| {
            let _ = to_engine.fail_member(slot);
        }));
        let device =
            Arc::new(ArrayDevice::new(handle.clone(), meta.clone(), geometry.array_bytes(), read_only));
        let states: Vec<MemberState> = config.members.iter().map(|m| m.state).collect();
        let arr = Arc::new(RunningArray {
            handle,
            runtime: Mutex::new(Some(runtime)),
            meta,
            device,
            name: plan.name.clone(),
            geometry,
            read_only,
            used_dev_sectors: plan.size_sectors,
            snapshot: Mutex::new(Snapshot { states, ..Default::default() }),
            ops: Mutex::new(()),
            stop: AtomicBool::new(false),
            monitor: Mutex::new(None),
            slot_paths: Mutex::new(slot_paths),
            recovery_unrecorded: Mutex::new(Vec::new()),
        });
        arr.poll(|_, _, _| Ok(()))?;
        let me = arr.clone();
        let t = std::thread::Builder::new()
            .name("uraid-monitor".into())
            .spawn(move || me.monitor_loop())
            .context("starting the monitor thread")?;
        *arr.monitor.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        Ok(arr)
    }

    pub fn snapshot(&self) -> Snapshot {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs `action` on the engine, then drains its events and acts on them.
    fn poll(
        &self,
        action: impl FnOnce(&mut Engine, &mut Executor, u64) -> Result<(), String> + Send + 'static,
    ) -> anyhow::Result<()> {
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        self.poll_locked(action)
    }

    fn poll_locked(
        &self,
        action: impl FnOnce(&mut Engine, &mut Executor, u64) -> Result<(), String> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (result, events, states, sync, failed, resync_owed, (scrub, replacements)) = self
            .handle
            .control(move |e, ex, now| {
                let e = engine_of(e);
                let r = action(e, ex, now);
                let mut events = Vec::new();
                while let Some(ev) = e.pop_event() {
                    events.push(ev);
                }
                let scrub = super::detail::ScrubView {
                    sync_action: e.sync_action().to_string(),
                    last_sync_action: e.last_sync_action().to_string(),
                    mismatch_cnt: e.mismatch_cnt(),
                };
                let scrub = (scrub, e.replacements());
                (r, events, e.member_states(), e.sync_status(), e.is_failed(), e.resync_owed(), scrub)
            })
            .map_err(|e| anyhow!("{e}"))?;
        {
            let mut s = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            match &sync {
                Some(st) => {
                    if s.sync.as_ref().is_some_and(|o| o.kind != st.kind) {
                        s.samples.clear();
                    }
                    s.samples.push_back((now, st.done_sectors));
                    while s.samples.front().is_some_and(|(t, _)| now.duration_since(*t) > SPEED_WINDOW) {
                        s.samples.pop_front();
                    }
                }
                None => s.samples.clear(),
            }
            s.states = states.clone();
            s.sync = sync;
            s.failed = failed;
            s.scrub = Some(scrub);
            s.replacements = replacements;
        }
        let degraded = states.iter().filter(|s| !matches!(s, MemberState::InSync)).count();
        self.device.degraded.store(degraded, Ordering::SeqCst);
        let failure_recorded = events
            .iter()
            .any(|ev| matches!(ev, EngineEvent::MemberFaulty(_) | EngineEvent::BadBlocksRecorded { .. }));
        // Every event is handled even when one fails, and held completions are always
        // released: a superblock write that failed everywhere must not hang the clients.
        let mut first_err = None;
        for ev in events {
            if let Err(e) = self.on_event(ev, &states, resync_owed) {
                eprintln!("uraid: {}: {e:#}", self.name);
                first_err.get_or_insert(e);
            }
        }
        if failure_recorded {
            // The superblocks now say so: the held completions may go.
            self.handle.control(|e, _, _| engine_of(e).metadata_committed()).map_err(|e| anyhow!("{e}"))?;
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        result.map_err(anyhow::Error::msg)
    }

    /// `resync_owed`: the engine still owes a resync (see `Engine::resync_owed`), so a
    /// finished recovery does not bring the array in sync and its bitmap bits stay.
    fn on_event(&self, ev: EngineEvent, states: &[MemberState], resync_owed: bool) -> anyhow::Result<()> {
        match ev {
            EngineEvent::MemberFaulty(slot) => {
                eprintln!("uraid: {}: member in slot {slot} failed; the array runs degraded", self.name);
                self.meta.update(|st, now| st.core.member_failed(slot, now))?;
                self.take_spare(slot)?;
            }
            EngineEvent::RecoveryDone(slot) => {
                eprintln!("uraid: {}: recovery of slot {slot} done", self.name);
                if !self.flush() {
                    // Left recorded as recovering from its last checkpoint: the next start
                    // finishes the recovery instead of trusting unflushed writes.
                    self.recovery_unrecorded.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
                    return Ok(());
                }
                self.meta.update(|st, now| st.core.recovery_done(slot, now))?;
                if states.iter().all(|s| matches!(s, MemberState::InSync)) && !resync_owed {
                    self.meta.bitmap_all_synced();
                }
            }
            EngineEvent::ResyncDone => {
                eprintln!("uraid: {}: resync done", self.name);
                self.meta.lock().core.resync_done();
                // A degraded mirror resyncs its in-sync copies; the bits stay for the rebuild.
                if states.iter().all(|s| matches!(s, MemberState::InSync)) {
                    self.meta.bitmap_all_synced();
                }
            }
            EngineEvent::SyncAborted(kind) => {
                eprintln!("uraid: {}: {kind:?} stopped short (a source or its target failed)", self.name);
            }
            EngineEvent::ArrayFailed => {
                eprintln!(
                    "uraid: {}: the array has FAILED: more members lost than the level survives",
                    self.name
                );
                self.meta.update(|st, now| st.core.array_failed(now))?;
            }
            EngineEvent::ScrubDone { kind, mismatch_cnt_sectors } => {
                eprintln!("uraid: {}: {} done, mismatch_cnt {mismatch_cnt_sectors}", self.name, kind.name());
            }
            EngineEvent::RecoveryStarted(slot) => {
                eprintln!("uraid: {}: recovery of slot {slot} started", self.name);
            }
            EngineEvent::BadBlocksRecorded { slot, sector, sectors } => {
                eprintln!(
                    "uraid: {}: write error on the member in slot {slot}: sectors {sector}+{sectors} \
                     recorded in its bad-block log; the member stays in the array",
                    self.name
                );
                self.meta.update(|st, now| st.core.bad_blocks_recorded(slot, sector, sectors, now))?;
            }
            EngineEvent::BadBlocksCleared { slot, sector, sectors } => {
                self.meta.lock().core.bad_blocks_cleared(slot, sector, sectors);
            }
            EngineEvent::ReplacementCopied(slot) => self.replacement_copied(slot)?,
            EngineEvent::ReplacementFaulty(slot) => self.replacement_failed(slot)?,
        }
        Ok(())
    }

    /// A flush of everything written so far. Gives up (false) rather than wait while the
    /// engine holds completions for a member failure: only the monitor's next poll, which
    /// may be this caller, records it and releases them.
    fn flush(&self) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        let sent = self.handle.submit(
            Request::flush(0),
            Box::new(move |c| {
                let _ = tx.send(c.result.is_ok());
            }),
        );
        if sent.is_err() {
            return false;
        }
        loop {
            match rx.recv_timeout(FLUSH_POLL) {
                Ok(ok) => return ok,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return false,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let held = self.handle.control(|e, _, _| engine_of(e).metadata_pending());
                    if !matches!(held, Ok(false)) {
                        return false;
                    }
                }
            }
        }
    }

    /// A hot spare replaces the member that failed in `slot`.
    fn take_spare(&self, slot: usize) -> anyhow::Result<()> {
        let spare = {
            let devs = self.meta.lock().devs();
            devs.into_iter().find(|d| d.role == DevRole::Spare)
        };
        let Some(spare) = spare else { return Ok(()) };
        let (key, path, name) = (spare.key, spare.path, spare.name);
        let data_offset_bytes = spare.sb.data_offset * 512;
        match self.start_recovery_into(slot, &path, data_offset_bytes, None) {
            Ok(()) => {
                eprintln!("uraid: {}: hot spare {name} takes slot {slot}", self.name);
                self.meta.update(|st, now| st.core.spare_activated(key, slot, now))?;
                self.set_slot_path(slot, Some(name));
            }
            Err(e) => eprintln!("uraid: {}: hot spare {name} could not take slot {slot}: {e:#}", self.name),
        }
        Ok(())
    }

    fn set_slot_path(&self, slot: usize, name: Option<String>) {
        if let Some(p) = self.slot_paths.lock().unwrap_or_else(|e| e.into_inner()).get_mut(slot) {
            *p = name;
        }
    }

    /// Opens `path` for the executor, puts it in `slot` and starts the engine's recovery.
    /// `ranges`: a bitmap re-add's regions (see `Engine::readd_member`); None: all of it.
    fn start_recovery_into(
        &self,
        slot: usize,
        path: &Path,
        data_offset_bytes: u64,
        ranges: Option<Vec<(u64, u64)>>,
    ) -> anyhow::Result<()> {
        let member = Member::open(path, &exec_open_options(self.read_only))
            .with_context(|| format!("{}: opening for I/O", path.display()))?;
        self.poll_locked(move |e, ex, now| {
            // The engine first: it refuses (slot busy, array failed) before anything changes.
            // Its recovery I/O is pumped only after this closure, so the executor has the
            // new member by then.
            e.readd_member(slot, data_offset_bytes, ranges, now)?;
            // The slot's old log was its previous member's; the new one starts without
            // (a write error fails it, as before the log existed).
            e.set_bad_blocks(slot, None);
            if let Err(err) = ex.replace_member(slot, member) {
                e.fail_member(slot, now);
                return Err(format!("cannot put the member in slot {slot}: {err}"));
            }
            Ok(())
        })
    }

    fn monitor_loop(self: Arc<Self>) {
        let started = Instant::now();
        let now_ms = || started.elapsed().as_millis() as u64;
        let mut clock = UpkeepClock::new(UpkeepPeriods::default(), now_ms());
        let mut seen_generation = self.meta.write_generation();
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(MONITOR_PERIOD);
            if let Err(e) = self.poll(|_, _, _| Ok(())) {
                if self.stop.load(Ordering::SeqCst) {
                    break;
                }
                eprintln!("uraid: {}: {e:#}", self.name);
            }
            if self.read_only {
                continue;
            }
            let due = clock.due(now_ms());
            if due.safe_mode_check {
                let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
                match self.meta.try_mark_clean(seen_generation, || self.flush()) {
                    Ok(_) => {}
                    Err(e) => eprintln!("uraid: {}: marking clean: {e:#}", self.name),
                }
                seen_generation = self.meta.write_generation();
            }
            if due.bitmap_daemon {
                if let Err(e) = self.meta.bitmap_daemon() {
                    eprintln!("uraid: {}: bitmap: {e:#}", self.name);
                }
            }
            if due.recovery_checkpoint {
                if let Err(e) = self.checkpoint_recovery() {
                    eprintln!("uraid: {}: recovery checkpoint: {e:#}", self.name);
                }
            }
        }
    }

    /// Records how far a recovery got, after a flush made that much durable.
    fn checkpoint_recovery(&self) -> anyhow::Result<()> {
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let unrecorded =
            std::mem::take(&mut *self.recovery_unrecorded.lock().unwrap_or_else(|e| e.into_inner()));
        for slot in unrecorded {
            let (states, owed) = self
                .handle
                .control(|e, _, _| (engine_of(e).member_states(), engine_of(e).resync_owed()))
                .map_err(|e| anyhow!("{e}"))?;
            if matches!(states.get(slot), Some(MemberState::InSync)) {
                self.on_event(EngineEvent::RecoveryDone(slot), &states, owed)?;
            }
        }
        // A copied replacement whose flush or promotion did not go through is tried again.
        for r in self.snapshot().replacements.iter().filter(|r| r.copied) {
            self.replacement_copied(r.slot)?;
        }
        let Some(sync) = self.snapshot().sync else { return Ok(()) };
        if let SyncKind::Replace { slot } = sync.kind {
            return self.checkpoint_replacement(slot, sync.recovery_offset_sectors);
        }
        let SyncKind::Recovery { member: slot } = sync.kind else { return Ok(()) };
        if !self.flush() {
            return Ok(());
        }
        let offset = sync.recovery_offset_sectors;
        self.meta.update(|st, now| st.core.recovery_checkpoint(slot, offset, now))
    }

    /// Stops serving: monitor, requests (finishing those in flight and flushing), then the
    /// superblocks are marked clean through the still running array thread, which ends last.
    pub fn stop(&self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.monitor.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        // Last look at the engine: pending events and the recovery position.
        let last = self.handle.control(|e, _, _| {
            let e = engine_of(e);
            let mut events = Vec::new();
            while let Some(ev) = e.pop_event() {
                events.push(ev);
            }
            // Stopping: the final superblock write below records any failure; the runtime's
            // closing flush must not wait for it.
            e.metadata_committed();
            (events, e.member_states(), e.sync_status())
        });
        let runtime = self.runtime.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(runtime) = runtime else { bail!("{} was stopped already", self.name) };
        let result = self.quiesced_stop(last);
        runtime.shutdown().map_err(|e| anyhow!("{e}"))?;
        result
    }

    /// The metadata half of `stop`, with requests refused and the array thread still up.
    #[allow(clippy::type_complexity)]
    fn quiesced_stop(
        &self,
        last: Result<(Vec<EngineEvent>, Vec<MemberState>, Option<SyncStatus>), RuntimeError>,
    ) -> anyhow::Result<()> {
        let report = self.handle.quiesce().map_err(|e| anyhow!("{e}"))?;
        let flushed = report.flush.is_ok();
        if let Ok((events, states, sync)) = last {
            for ev in events {
                if let Err(e) = self.on_event_offline(ev, &states) {
                    eprintln!("uraid: {}: {e:#}", self.name);
                }
            }
            if let Some(SyncStatus {
                kind: SyncKind::Recovery { member: slot },
                recovery_offset_sectors,
                ..
            }) = sync
            {
                if flushed {
                    self.meta.lock().core.record_recovery_offset(slot, recovery_offset_sectors);
                }
            }
            // A resync stopped part way: what lies below its position is in sync and
            // flushed, so the next start resyncs from there, not from zero.
            if let Some(SyncStatus { kind: SyncKind::Replace { slot }, recovery_offset_sectors, .. }) = sync {
                if flushed {
                    self.meta.lock().core.record_replacement_offset(slot, recovery_offset_sectors);
                }
            }
            if let Some(SyncStatus { kind: SyncKind::Resync, resync_offset_sectors, .. }) = sync {
                if flushed && resync_offset_sectors > 0 {
                    self.meta.lock().core.record_resync_checkpoint(resync_offset_sectors);
                }
            }
        }
        if self.read_only {
            return Ok(());
        }
        if !flushed {
            bail!("the final flush failed: superblocks left marked dirty so the next start resyncs");
        }
        self.meta.mark_stopped()
    }

    /// Events that arrive while stopping: only metadata, no engine actions.
    fn on_event_offline(&self, ev: EngineEvent, _states: &[MemberState]) -> anyhow::Result<()> {
        match ev {
            EngineEvent::MemberFaulty(slot) => self.meta.update(|st, now| st.core.member_failed(slot, now)),
            EngineEvent::RecoveryDone(slot) => self.meta.update(|st, now| st.core.recovery_done(slot, now)),
            EngineEvent::ResyncDone => {
                self.meta.lock().core.resync_done();
                Ok(())
            }
            // A copy that finished while stopping is not promoted: the superblocks keep the
            // member, and the unfinished replacement is left out at the next start.
            EngineEvent::ReplacementFaulty(slot) => {
                self.meta.update(|st, now| st.core.replacement_failed(slot, now))
            }
            _ => Ok(()),
        }
    }
}

/// Control operations (`uraid fail|remove|add|detail|status` through the socket).
impl RunningArray {
    fn find_dev(&self, what: &str) -> anyhow::Result<usize> {
        let devs = self.meta.lock().devs();
        let target = std::fs::canonicalize(what).ok();
        let identity = MemberDev::open(Path::new(what), false).ok().map(|m| m.identity);
        devs.iter()
            .position(|d| {
                d.name == what
                    || target.is_some() && std::fs::canonicalize(&d.path).ok() == target
                    || identity.is_some() && Some(d.identity) == identity
            })
            .ok_or_else(|| anyhow!("{what} is not a member of this array (see `uraid detail`)"))
    }

    /// Change a tunable while I/O runs (md's /sys/block/mdX/md/NAME; the table is
    /// `uraid_core::tunables::TUNABLES`); an empty name lists them. Answers the values now.
    pub fn set_tunable(&self, name: &str, value: &str) -> anyhow::Result<String> {
        let name = name.to_string();
        let value = value.to_string();
        let level = self.geometry.level;
        let result = self
            .handle
            .control(move |e, _, _| -> Result<String, String> {
                let e = engine_of(e);
                if !name.is_empty() {
                    e.set_tunable(&name, &value)?;
                }
                Ok(e.tunables().describe(level))
            })
            .map_err(|e| anyhow!("{e}"))?;
        result.map_err(|e| anyhow!(e))
    }

    /// md's sync_action: `check` (count mismatches, change nothing), `repair` (rewrite what
    /// is inconsistent), `idle` (stop a check or repair).
    pub fn action(&self, what: &str) -> anyhow::Result<String> {
        let kind = match what {
            "check" => Some(uraid_core::ScrubKind::Check),
            "repair" => Some(uraid_core::ScrubKind::Repair),
            "idle" => None,
            other => bail!("unknown action {other:?}: use check, repair or idle"),
        };
        if self.read_only && kind == Some(uraid_core::ScrubKind::Repair) {
            bail!("the array is served read-only: `repair` would write; use `check`");
        }
        self.poll(move |e, _, now| match kind {
            Some(k) => e.start_scrub(k, now),
            None => {
                e.stop_scrub();
                Ok(())
            }
        })?;
        Ok(match kind {
            Some(k) => format!("uraid: {} started on {}\n", k.name(), self.name),
            None => format!("uraid: {} is idle\n", self.name),
        })
    }

    /// mdadm --fail.
    pub fn fail(&self, what: &str) -> anyhow::Result<String> {
        let i = self.find_dev(what)?;
        let (role, name) = {
            let devs = self.meta.lock().devs();
            (devs[i].role, devs[i].name.clone())
        };
        let DevRole::Active { slot, .. } = role else {
            bail!("{name} is not active in the array ({}); nothing to fail", role_text(role));
        };
        self.poll(move |e, _, now| {
            e.fail_member(slot, now);
            Ok(())
        })?;
        Ok(format!("uraid: set {name} faulty in {}\n", self.name))
    }

    /// mdadm --remove: a failed member or a spare leaves the array's superblocks.
    pub fn remove(&self, what: &str) -> anyhow::Result<String> {
        let i = self.find_dev(what)?;
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let (role, name) = {
            let devs = self.meta.lock().devs();
            (devs[i].role, devs[i].name.clone())
        };
        match role {
            DevRole::Active { .. } => bail!("{name} is active: fail it first (`uraid fail {name}`)"),
            DevRole::Faulty { slot } => self.set_slot_path(slot, None),
            DevRole::Replacement { .. } => {
                bail!("{name} is being rebuilt as a replacement: fail it first (`uraid fail {name}`)")
            }
            DevRole::Spare => {}
        }
        let key = self.meta.lock().devs()[i].key;
        self.meta.update(|st, now| st.core.member_removed(key, now))?;
        Ok(format!("uraid: hot removed {name} from {}\n", self.name))
    }

    /// mdadm --add: rebuild into a missing or failed slot, or become a hot spare. Every
    /// refusal comes before the first write. `force` lets a member of another array be
    /// overwritten.
    pub fn add(&self, what: &str, force: bool) -> anyhow::Result<String> {
        if self.read_only {
            bail!("the array is served read-only: members cannot be added");
        }
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        if self.snapshot().failed {
            bail!(
                "{} has failed (more members lost than {} survives): a new member cannot be \
                 rebuilt from it; nothing was written",
                self.name,
                level_name(self.geometry.level.md_level())
            );
        }
        if self.geometry.level.md_level() == 0 {
            bail!("raid0 has no redundancy to rebuild a member from; nothing was written");
        }
        let path = PathBuf::from(what);
        let mut dev = MemberDev::open(&path, true)?;
        let (reference, taken_slots, returning) = {
            let devs = self.meta.lock().devs();
            let mut returning = false;
            if let Some(d) = devs.iter().find(|d| d.identity == dev.identity) {
                if !matches!(d.role, DevRole::Faulty { .. }) {
                    bail!("{} is already in the array ({})", d.name, role_text(d.role));
                }
                returning = true;
            }
            let taken: Vec<usize> = devs
                .iter()
                .filter_map(|d| match d.role {
                    DevRole::Active { slot, .. } => Some(slot),
                    _ => None,
                })
                .collect();
            (devs[0].sb.clone(), taken, returning)
        };
        let old_sb = dev.read_metadata().0.ok();
        if let Some(sb) = &old_sb {
            if sb.set_uuid != reference.set_uuid && !force {
                bail!(
                    "{} holds the superblock of another array ({}, {}): adding it would overwrite \
                     that array's member; use `uraid add --force` if that is what you want \
                     (nothing was written)",
                    dev.name,
                    uraid_core::meta::format_uuid(&sb.set_uuid),
                    sb.name()
                );
            }
        }
        // Our own failed member is claimed by this process already (its old descriptor).
        if !returning {
            dev.claim()?;
        }
        let states = self.snapshot().states;
        let slot = (0..states.len()).find(|&s| {
            matches!(states[s], MemberState::Missing | MemberState::Faulty) && !taken_slots.contains(&s)
        });
        let dev_number = {
            let devs = self.meta.lock().devs();
            let others = devs.iter().filter(|d| d.identity != dev.identity);
            let used: Vec<u32> = others.map(|d| d.sb.dev_number).collect();
            (0u32..).find(|n| !used.contains(n)).unwrap_or(0)
        };
        let sb = new_member_superblock(&reference, &dev, dev_number, self.used_dev_sectors)?;
        if returning {
            // The failed member given back: it leaves as faulty and comes back as new.
            let faulty = self
                .meta
                .lock()
                .devs()
                .into_iter()
                .find(|d| d.identity == dev.identity && matches!(d.role, DevRole::Faulty { .. }));
            if let Some(faulty) = faulty {
                self.meta.update(|st, now| st.core.member_removed(faulty.key, now))?;
            }
            dev.claim()?;
        }
        // Its own metadata first (recovering from 0, or spare), so a crash leaves it
        // recognisable; the array's superblocks follow.
        let role = match slot {
            Some(slot) => DevRole::Active { slot, recovering: true },
            None => DevRole::Spare,
        };
        self.write_new_member(&dev, &sb, role)?;
        let name = dev.name.clone();
        self.keep_new_member(&dev, &sb)?;
        let Some(slot) = slot else {
            return Ok(format!("uraid: added {name} to {} as a hot spare\n", self.name));
        };
        let readd = self.bitmap_readd_ranges(old_sb.as_ref(), &reference, slot, sb.data_offset);
        self.start_recovery_into(slot, &dev.path, sb.data_offset * 512, readd.as_ref().ok().cloned())?;
        let key = self.meta.lock().devs().into_iter().find(|d| d.identity == dev.identity).map(|d| d.key);
        if let Some(key) = key {
            self.meta.update(|st, now| st.core.spare_activated(key, slot, now))?;
        }
        self.set_slot_path(slot, Some(name.clone()));
        Ok(match readd {
            Ok(ranges) => {
                let sectors: u64 = ranges.iter().map(|(a, b)| b - a).sum();
                format!(
                    "uraid: re-added {name} to {} in slot {slot}: only the {} regions written while \
                     it was away ({}) are rebuilt, from the write-intent bitmap\n",
                    self.name,
                    ranges.len(),
                    human_bytes(sectors * 512)
                )
            }
            Err(why) => format!(
                "uraid: added {name} to {} in slot {slot}; full recovery started ({why})\n",
                self.name
            ),
        })
    }

    /// md's re-add: the sync-space regions a returning member missed, from the bitmap's set
    /// bits; or why it must be rebuilt in full.
    fn bitmap_readd_ranges(
        &self,
        old: Option<&Superblock>,
        array: &Superblock,
        slot: usize,
        data_offset: u64,
    ) -> Result<Vec<(u64, u64)>, String> {
        let old = old.filter(|o| o.set_uuid == array.set_uuid).ok_or("it is new to the array")?;
        if old.role() as usize != slot || old.data_offset != data_offset {
            return Err(format!("it was not slot {slot}'s member with this data offset"));
        }
        if old.has(uraid_core::meta::feature::RECOVERY_OFFSET) {
            return Err("it left while it was being rebuilt".into());
        }
        if self.geometry.level.md_level() == 10 {
            return Err("raid10 re-adds are rebuilt in full".into());
        }
        let st = self.meta.lock();
        let bm = st.core.bitmap().ok_or("the array has no write-intent bitmap")?;
        let cleared = bm.superblock().events_cleared;
        if old.events < cleared {
            return Err(format!(
                "its events {} are older than the bitmap's events_cleared {cleared}: bits were cleared since it left",
                old.events
            ));
        }
        let ranges: Vec<(u64, u64)> = bm.set_regions().into_iter().map(|(s, l)| (s, s + l)).collect();
        Ok(ranges)
    }

    /// A member whose own metadata `write_new_member` wrote joins the keeper as a spare
    /// (its bad-block log was just zeroed: the keeper starts it empty); the array's
    /// superblocks record it.
    fn keep_new_member(&self, dev: &MemberDev, sb: &Superblock) -> anyhow::Result<()> {
        let meta_dev = MetaDev {
            name: dev.name.clone(),
            path: dev.path.clone(),
            file: dev.file.try_clone().context("duplicating the member's descriptor")?,
            sb: sb.clone(),
            role: DevRole::Spare,
            identity: dev.identity,
            bad_blocks: None,
        };
        self.meta.update(|st, now| st.add_member(meta_dev, now))
    }

    fn write_new_member(&self, dev: &MemberDev, sb: &Superblock, role: DevRole) -> anyhow::Result<()> {
        let mut sb = sb.clone();
        if let Some(r) = sb.dev_roles.get_mut(sb.dev_number as usize) {
            *r = match role {
                DevRole::Active { slot, .. } => slot as u16,
                _ => uraid_core::meta::role::SPARE,
            };
        }
        if sb.bblog_size > 0 {
            let at = sb.super_offset.saturating_add_signed(i64::from(sb.bblog_offset)) * 512;
            dev.write_at(at, &vec![0u8; usize::from(sb.bblog_size) * 512])?;
        }
        if let Some((offset, area)) = self.meta.bitmap_area() {
            dev.write_at(sb.super_offset.saturating_add_signed(i64::from(offset)) * 512, &area)?;
        }
        let bytes = sb.update_csum();
        dev.write_at(sb.super_offset * 512, &bytes)?;
        dev.sync().with_context(|| format!("{}: fdatasync", dev.name))?;
        Ok(())
    }

    fn slot_views(&self) -> SlotViews {
        let snap = self.snapshot();
        let devs = self.meta.lock().devs();
        let paths = self.slot_paths.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let slots = snap
            .states
            .iter()
            .enumerate()
            .map(|(slot, state)| {
                let dev = devs.iter().find(|d| match d.role {
                    DevRole::Active { slot: s, .. } | DevRole::Faulty { slot: s } => s == slot,
                    DevRole::Spare | DevRole::Replacement { .. } => false,
                });
                SlotView {
                    dev_number: dev.map(|d| d.sb.dev_number),
                    path: dev.map(|d| d.name.clone()).or_else(|| paths.get(slot).cloned().flatten()),
                    state: *state,
                }
            })
            .collect();
        let spares = devs
            .iter()
            .filter(|d| d.role == DevRole::Spare)
            .map(|d| (d.sb.dev_number, d.name.clone()))
            .collect();
        (slots, spares, Vec::new())
    }

    pub fn detail_info(&self) -> DetailInfo {
        let (slots, spares, others) = self.slot_views();
        let snap = self.snapshot();
        let (sb, bad_blocks) = {
            let st = self.meta.lock();
            let bad: Vec<(String, Vec<(u64, u64)>)> = st
                .devs()
                .into_iter()
                .filter_map(|d| {
                    let bb = st.core.bad_blocks(d.key).filter(|bb| !bb.is_empty())?;
                    Some((d.name, bb.entries().collect()))
                })
                .collect();
            (st.core.members()[0].sb.clone(), bad)
        };
        let mut info = detail::build(&DetailInput {
            sb: &sb,
            array_sectors: self.geometry.array_sectors(),
            used_dev_sectors: self.used_dev_sectors,
            slots: &slots,
            spares: &spares,
            others: &others,
            sync: snap.sync.clone(),
            dirty: self.meta.is_dirty(),
            failed: snap.failed,
            read_only: self.read_only,
            scrub: snap.scrub.clone(),
        });
        info.bad_blocks = bad_blocks;
        self.add_replacement_rows(&mut info);
        info
    }

    pub fn detail(&self) -> String {
        detail_text(&self.name, &self.detail_info())
    }

    /// `detail --json`, with each slot's member I/O counts since the array started.
    pub fn detail_json(&self) -> String {
        let stats = self.handle.stats().ok();
        super::report::detail_json(&self.name, &self.detail_info(), stats.as_ref().map(|s| &s.array))
    }

    /// A /proc/mdstat-like view.
    pub fn status(&self) -> String {
        let snap = self.snapshot();
        let (slots, spares, _) = self.slot_views();
        let sb = self.meta.lock().core.members()[0].sb.clone();
        let level = level_name(sb.level);
        let mut s = format!("Personalities : [{level}]\n");
        let mut devs: Vec<String> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let p = v.path.clone()?;
                let mark = match v.state {
                    MemberState::Faulty => "(F)",
                    MemberState::Missing => return None,
                    _ => "",
                };
                Some(format!("{p}[{i}]{mark}"))
            })
            .collect();
        devs.extend(spares.iter().map(|(n, p)| format!("{p}[{n}](S)")));
        devs.extend(self.replacement_views().into_iter().map(|r| format!("{}[{}](R)", r.name, r.dev_number)));
        let state = if snap.failed {
            "FAILED"
        } else if self.read_only {
            "active (read-only)"
        } else {
            "active"
        };
        s.push_str(&format!("{} : {state} {level} {}\n", self.name, devs.join(" ")));
        let up: String =
            slots.iter().map(|v| if matches!(v.state, MemberState::InSync) { 'U' } else { '_' }).collect();
        let in_sync = up.chars().filter(|&c| c == 'U').count();
        let geo_text = match sb.level {
            1 => String::new(),
            0 | 10 => format!(" {}k chunks", sb.chunksize / 2),
            l => format!(" level {l}, {}k chunk, algorithm {}", sb.chunksize / 2, sb.layout),
        };
        s.push_str(&format!(
            "      {} blocks super 1.{}{} [{}/{}] [{}]\n",
            self.geometry.array_sectors() / 2,
            match sb.super_offset {
                0 => 1,
                8 => 2,
                _ => 0,
            },
            geo_text,
            slots.len(),
            in_sync,
            up
        ));
        if let Some(sync) = &snap.sync {
            let frac = if sync.total_sectors == 0 {
                1.0
            } else {
                sync.done_sectors as f64 / sync.total_sectors as f64
            };
            let filled = ((frac * 20.0) as usize).min(20);
            let bar = format!("[{}>{}]", "=".repeat(filled), ".".repeat(20 - filled));
            let what = mdstat_word(sync.kind);
            let (speed, finish) = match snap.sync_speed_sectors() {
                Some(v) if v > 0.0 => {
                    let left = sync.total_sectors.saturating_sub(sync.done_sectors) as f64 / v;
                    (format!("{:.0}K/sec", v / 2.0), format!("{:.1}min", left / 60.0))
                }
                _ => ("-".to_string(), "-".to_string()),
            };
            s.push_str(&format!(
                "      {bar}  {what} = {:.1}% ({}/{}) finish={finish} speed={speed}\n",
                frac * 100.0,
                sync.done_sectors / 2,
                sync.total_sectors / 2
            ));
        }
        if self.meta.has_bitmap() {
            s.push_str("      bitmap: internal\n");
        }
        s.push_str(&format!("      state: {}\n", self.detail_info().state));
        s
    }

    /// `done total` of the running sync, or `idle`: what the CLI's progress bar polls.
    pub fn progress(&self) -> String {
        match self.snapshot().sync {
            Some(s) => {
                format!("{} {} {}\n", mdstat_word(s.kind), s.done_sectors, s.total_sectors)
            }
            None => "idle\n".to_string(),
        }
    }
}

/// How /proc/mdstat names a running sync ("recovery", where sysfs says "recover").
fn mdstat_word(kind: SyncKind) -> &'static str {
    match kind {
        SyncKind::Recovery { .. } | SyncKind::Replace { .. } => "recovery",
        other => uraid_core::scrub::action_name(other),
    }
}

/// A member's role as mdadm --detail words it.
fn role_text(role: DevRole) -> String {
    match role {
        DevRole::Active { slot, recovering: false } => format!("active in slot {slot}"),
        DevRole::Active { slot, recovering: true } => format!("rebuilding into slot {slot}"),
        DevRole::Spare => "a spare".to_string(),
        DevRole::Faulty { slot } => format!("faulty in slot {slot}"),
        DevRole::Replacement { slot } => format!("replacing slot {slot}'s member"),
    }
}

/// Slots, hot spares (dev_number, name), and other members (state, name).
type SlotViews = (Vec<SlotView>, Vec<(u32, String)>, Vec<(String, String)>);

/// The superblock of a member joining the array: the array's fields, its own identity.
fn new_member_superblock(
    reference: &Superblock,
    dev: &MemberDev,
    dev_number: u32,
    used_dev_sectors: u64,
) -> anyhow::Result<Superblock> {
    let dev_sectors = dev.dev_sectors();
    let version = match reference.super_offset {
        0 => SuperblockVersion::V1_1,
        8 => SuperblockVersion::V1_2,
        _ => SuperblockVersion::V1_0,
    };
    let mut sb = reference.clone();
    sb.device_uuid = super::random_uuid()?;
    sb.dev_number = dev_number;
    sb.feature_map |= feature::RECOVERY_OFFSET;
    sb.recovery_offset = 0;
    sb.cnt_corrected_read = 0;
    sb.devflags = 0;
    let too_small = || {
        anyhow!(
            "{} is too small: {} sectors, the array needs {} sectors of data after the {}-sector data offset",
            dev.name,
            dev_sectors,
            used_dev_sectors,
            reference.data_offset
        )
    };
    match version {
        SuperblockVersion::V1_0 => {
            let sb_at = version.sb_offset_sectors(dev_sectors).ok_or_else(too_small)?;
            // Keep the reference's room between data end and superblock (bitmap, bblog).
            let room = reference.super_offset.saturating_sub(reference.data_offset + reference.data_size);
            sb.super_offset = sb_at;
            sb.data_size = sb_at.checked_sub(room + sb.data_offset).ok_or_else(too_small)?;
        }
        _ => {
            sb.data_size = dev_sectors.checked_sub(sb.data_offset).ok_or_else(too_small)?;
        }
    }
    if sb.data_size < used_dev_sectors.max(reference.size) {
        return Err(too_small());
    }
    if sb.max_dev <= dev_number {
        sb.max_dev = dev_number + 1;
        sb.dev_roles.resize(sb.max_dev as usize, uraid_core::meta::role::SPARE);
    }
    Ok(sb)
}
