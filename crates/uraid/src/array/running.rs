//! A started array: the core's `Array` (engine, superblocks, bitmap, failures, spares,
//! checkpoints, the clean close) on its runtime thread, the NBD device in front of it, the
//! member files it claims, and a monitor thread that prints what the array reports and
//! closes the members it let go. What md.c would do is the core's; this is wiring.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use uraid_core::array::{Array, ArrayOptions, ArrayView, DevRole, MemberKey, MemberView};
use uraid_core::meta::ResyncNeed;
use uraid_core::{ArrayEngine, Geometry, MemberState, SyncKind, SyncStatus, Tunables};
use uraid_io::real::{
    fault::Faults, Executor, ExecutorOptions, Member, MemberSet, OpenOptions, DEFAULT_FAILFAST_TIMEOUT,
};
use uraid_io::runtime::{ArrayRuntime, RuntimeHandle, RuntimeOptions};

use super::assembly::Assembled;
use super::detail::{self, DetailInput, SlotView};
use super::detail_info::{DetailInfo, DeviceRow, ScrubView, SyncProgress};
use super::device::ArrayDevice;
use super::events::slot_holder;
use super::member::MemberDev;
use super::member_io::{DeviceIo, IoBook};
use super::report::{detail_text, level_name, percent, resync_whole_sectors, time_left_words};

pub mod grow;
pub mod metrics;
mod verbs;

const MONITOR_PERIOD: Duration = Duration::from_millis(100);
/// How long a verb waits for the superblocks to record what it changed.
const METADATA_WAIT: Duration = Duration::from_secs(30);

/// How `uraid serve` starts an array.
pub struct StartOptions {
    pub read_only: bool,
    /// See `RuntimeOptions::run_on_submitter_max_bytes`.
    pub inline_request_max_bytes: u64,
    /// See `RuntimeOptions::submitter_rings`.
    pub connection_rings: bool,
    /// See `ExecutorOptions::registered`.
    pub registered: uraid_io::real::RegisteredChoice,
    /// `serve --io-poll`: see `uraid_io::real::check_io_poll`.
    pub io_poll: bool,
    /// Injected member faults (tests of real runs).
    pub faults: Option<Arc<Faults>>,
    pub tunables: Tunables,
    /// See `ExecutorOptions::member_timeout`; md's failfast members get at most
    /// `DEFAULT_FAILFAST_TIMEOUT`.
    pub member_timeout: Duration,
    /// Run with mdadm's arguments on each event (`serve --monitor-program`).
    pub monitor_program: Option<std::path::PathBuf>,
    /// SparesMissing at the first look below this many spares (`serve --expect-spares`).
    pub expect_spares: Option<usize>,
}

pub struct RunningArray {
    pub handle: RuntimeHandle<Array>,
    runtime: Mutex<Option<ArrayRuntime<Array>>>,
    pub device: Arc<ArrayDevice>,
    pub name: String,
    pub geometry: Geometry,
    pub read_only: bool,
    /// md's used dev size (a grow --size changes it).
    used_dev_sectors: std::sync::atomic::AtomicU64,
    /// The syncs this start resumed from a checkpoint (see `counted_from_checkpoint`).
    resumed: Mutex<Vec<Resumed>>,
    /// Member files by key (the executor's index of each): each holds the member's claim.
    members: Mutex<BTreeMap<MemberKey, MemberDev>>,
    /// Serializes control verbs: each reads the array, may write a device, then changes it.
    ops: Mutex<()>,
    /// Which device did which member I/O (the engine counts by slot).
    io_book: Mutex<IoBook>,
    stop: AtomicBool,
    monitor: Mutex<Option<JoinHandle<()>>>,
    events: Mutex<super::events::Events>,
}

pub(super) fn exec_open_options(read_only: bool) -> OpenOptions {
    OpenOptions { direct: true, read_only, log: true }
}

/// What the executor keeps in place of a member the array let go: the engine never issues
/// I/O to it, and the member's descriptor is closed.
fn placeholder() -> std::io::Result<Member> {
    Member::open(Path::new("/dev/null"), &OpenOptions { direct: false, read_only: false, log: false })
}

impl RunningArray {
    pub fn start(a: Assembled, opts: StartOptions) -> anyhow::Result<Arc<RunningArray>> {
        let start_members = a.start_members()?;
        let array_opts = ArrayOptions {
            tunables: opts.tunables,
            read_only: opts.read_only,
            now_ns: 0,
            epoch_seconds: super::now_seconds(),
            ..ArrayOptions::default()
        };
        let array = Array::start(&a.plan, start_members, array_opts).map_err(|e| anyhow!("{e}"))?;
        // The executor's index of each offered member is its key in the array.
        let mut exec_members = Vec::with_capacity(a.members.len());
        for m in &a.members {
            exec_members.push(
                m.exec_member(&exec_open_options(opts.read_only))
                    .with_context(|| format!("{}: opening for I/O", m.name))?,
            );
        }
        if opts.io_poll {
            let members = exec_members.iter().map(|m: &uraid_io::real::Member| m.io_poll_queue());
            uraid_io::real::check_io_poll(members).map_err(|e| anyhow!("--io-poll: {e}"))?;
        }
        let exec_opts = ExecutorOptions {
            faults: opts.faults,
            registered: opts.registered,
            member_timeout: opts.member_timeout,
            io_poll: opts.io_poll,
            ..ExecutorOptions::default()
        };
        let mut executor = Executor::new(MemberSet::from_members(exec_members), &exec_opts)
            .context("starting the I/O executor")?;
        for (key, sb) in a.superblocks.iter().enumerate() {
            if sb.devflags & uraid_core::meta::superblock::devflags::FAIL_FAST != 0 {
                executor.set_member_timeout(key, opts.member_timeout.min(DEFAULT_FAILFAST_TIMEOUT));
            }
        }
        executor.log_choices();
        if opts.connection_rings
            && opts.inline_request_max_bytes > 0
            && executor.completion_mode() == Some(uraid_io::real::CompletionMode::Deferred)
        {
            if executor.io_poll() {
                eprintln!("uraid-io: connection threads leave their requests' member I/O to the array thread's polled ring (no rings of their own with --io-poll)");
            } else {
                eprintln!("uraid-io: connection threads issue and reap their requests' member I/O on io_uring rings of their own");
            }
        }
        let rt_opts = RuntimeOptions {
            run_on_submitter_max_bytes: opts.inline_request_max_bytes,
            submitter_rings: opts.connection_rings,
            ..RuntimeOptions::default()
        };
        let runtime = ArrayRuntime::start(array, executor, &rt_opts).context("starting the array thread")?;
        let handle = runtime.handle();
        // The size the engine serves: mid-reshape, md's old size until the reshape ends.
        let device = Arc::new(ArrayDevice::new(handle.clone(), a.plan.array_sectors * 512, opts.read_only));
        let resumed = resumed_syncs(&a);
        let members = a.members.into_iter().enumerate().map(|(k, m)| (k as MemberKey, m)).collect();
        let arr = Arc::new(RunningArray {
            handle,
            runtime: Mutex::new(Some(runtime)),
            device,
            name: a.plan.name.clone(),
            geometry: a.geometry,
            read_only: opts.read_only,
            used_dev_sectors: a.plan.size_sectors.into(),
            resumed: Mutex::new(resumed),
            members: Mutex::new(members),
            ops: Mutex::new(()),
            io_book: Mutex::new(IoBook::default()),
            stop: AtomicBool::new(false),
            monitor: Mutex::new(None),
            events: Mutex::new(super::events::Events::new(
                &a.plan.name,
                opts.monitor_program.clone(),
                opts.expect_spares,
            )),
        });
        // The events' baseline is the array as it starts, before any verb can change it.
        if let Ok(view) = arr.view() {
            let seen = super::events::seen(&view, arr.gone());
            arr.events.lock().unwrap_or_else(|e| e.into_inner()).look(seen);
        }
        let me = arr.clone();
        let t = std::thread::Builder::new()
            .name("uraid-monitor".into())
            .spawn(move || me.monitor_loop())
            .context("starting the monitor thread")?;
        *arr.monitor.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        Ok(arr)
    }

    /// Runs `f` on the array thread with the array and the executor.
    pub(super) fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Array, &mut Executor, u64) -> R + Send + 'static,
    ) -> anyhow::Result<R> {
        self.handle.control(f).map_err(|e| anyhow!("{e}"))
    }

    pub fn view(&self) -> anyhow::Result<ArrayView> {
        Ok(self.view_and_io()?.0)
    }

    /// The array in one look, with each member's I/O counts (see `member_io`).
    fn view_and_io(&self) -> anyhow::Result<(ArrayView, DeviceIo)> {
        let (mut view, stats) = self.call(|a, _, _| (a.view(), a.stats_snapshot()))?;
        let io = self.note(&mut view, &stats);
        Ok((view, io))
    }

    /// What one look at the array tells the books kept here: who did which I/O, and
    /// whether a sync resumed at start still runs (its progress then counted as md does).
    fn note(&self, view: &mut ArrayView, stats: &uraid_core::stats::ArrayStats) -> DeviceIo {
        let whole = resync_whole_sectors(
            view.sb.level,
            self.used_dev_sectors.load(Ordering::SeqCst),
            view.array_sectors,
        );
        let mut resumed = self.resumed.lock().unwrap_or_else(|e| e.into_inner());
        counted_from_checkpoint(view.sync.as_mut(), whole, &mut resumed);
        let mut book = self.io_book.lock().unwrap_or_else(|e| e.into_inner());
        book.note(view.states.len(), &view.members, stats)
    }

    /// Waits until the superblocks hold every change the array made up to `mark`.
    pub(super) fn wait_metadata(&self, mark: u64) -> anyhow::Result<()> {
        let t0 = std::time::Instant::now();
        while !self.call(move |a, _, _| a.metadata_done(mark))? {
            if t0.elapsed() > METADATA_WAIT {
                bail!("the superblocks were not written within {} s", METADATA_WAIT.as_secs());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Prints what the array reports and closes the members it let go.
    fn monitor_loop(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(MONITOR_PERIOD);
            if let Err(e) = self.look() {
                if !self.stop.load(Ordering::SeqCst) {
                    eprintln!("uraid: {}: {e:#}", self.name);
                }
                return;
            }
        }
    }

    fn look(&self) -> anyhow::Result<()> {
        let (notices, released, mut view, stats) = self.call(|a, ex, _| {
            let notices: Vec<String> = std::iter::from_fn(|| a.pop_notice()).collect();
            let released = a.take_released();
            for &key in &released {
                if let Ok(p) = placeholder() {
                    let _ = ex.replace_member(key as usize, p);
                }
            }
            (notices, released, a.view(), a.stats_snapshot())
        })?;
        self.note(&mut view, &stats);
        // A reshape that ended gives the array its new size: new NBD connections see it.
        let size_bytes = view.array_sectors * 512;
        if !view.read_only && size_bytes != uraid_nbd::BlockDevice::size_bytes(&*self.device) {
            self.used_dev_sectors.store(view.sb.size, Ordering::SeqCst);
            self.device.set_size_bytes(size_bytes);
        }
        for n in notices {
            eprintln!("uraid: {}: {n}", self.name);
        }
        let seen = super::events::seen(&view, self.gone());
        self.events.lock().unwrap_or_else(|e| e.into_inner()).look(seen);
        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        for key in released {
            // Its claim (flock) goes with the file: another array may take it now.
            members.remove(&key);
        }
        Ok(())
    }

    /// The members whose device went away (see `MemberDev::still_there`).
    fn gone(&self) -> Vec<String> {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members.values().filter(|m| !m.still_there()).map(|m| m.name.clone()).collect()
    }

    /// One look for `uraid monitor`: the array's name and what the events compare.
    pub fn monitor_look(&self) -> anyhow::Result<String> {
        let seen = super::events::seen(&self.view()?, self.gone());
        Ok(serde_json::to_string(&serde_json::json!({ "array": self.name, "seen": seen }))? + "\n")
    }

    /// mdadm --monitor --test: a TestMessage event now.
    pub fn test_event(&self) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).test_message();
    }

    /// Stops serving: the runtime finishes the requests in flight and flushes, the array
    /// marks its superblocks clean through it, then the thread ends.
    pub fn stop(&self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.monitor.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        let _ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.look();
        let runtime = self.runtime.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(runtime) = runtime else { bail!("{} was stopped already", self.name) };
        let report = runtime.shutdown().map_err(|e| anyhow!("{e}"))?;
        if self.read_only {
            return Ok(());
        }
        report.flush.map_err(|e| {
            anyhow!(
                "{} was not closed cleanly ({e}): the final flush or the superblocks marking it clean \
                 did not reach the members, so the next start resyncs (see the messages above)",
                self.name
            )
        })
    }

    /// The member `what` names (its name as given, its path, or the same device).
    pub(super) fn find_member(&self, what: &str) -> anyhow::Result<MemberKey> {
        let view = self.view()?;
        let target = std::fs::canonicalize(what).ok();
        // An export is known by its URI: no connection (a dead server may take long to refuse).
        let identity = match super::nbd_member::is_nbd_uri(what) {
            true => super::nbd_member::uri_identity(what),
            false => MemberDev::open(Path::new(what), false).ok().map(|m| m.identity),
        };
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        view.members
            .iter()
            .map(|m| m.key)
            .find(|key| {
                members.get(key).is_some_and(|d| {
                    d.name == what
                        || target.is_some() && std::fs::canonicalize(&d.path).ok() == target
                        || identity.is_some() && Some(d.identity) == identity
                })
            })
            .ok_or_else(|| anyhow!("{what} is not a member of this array (see `uraid detail`)"))
    }

    pub fn detail_info(&self) -> anyhow::Result<DetailInfo> {
        Ok(self.detail_of(&self.view()?))
    }

    fn detail_of(&self, view: &ArrayView) -> DetailInfo {
        let slots: Vec<SlotView> = view
            .states
            .iter()
            .enumerate()
            .map(|(slot, &state)| {
                let m = slot_holder(view, slot);
                SlotView { dev_number: m.map(|m| m.dev_number), path: m.map(|m| m.name.clone()), state }
            })
            .collect();
        let faulty: Vec<(u32, String)> =
            failed_out_of_slot(view).map(|m| (m.dev_number, m.name.clone())).collect();
        let spares: Vec<(u32, String)> = view
            .members
            .iter()
            .filter(|m| m.role == DevRole::Spare)
            .map(|m| (m.dev_number, m.name.clone()))
            .collect();
        let mut info = detail::build(&DetailInput {
            sb: &view.sb,
            array_sectors: view.array_sectors,
            used_dev_sectors: self.used_dev_sectors.load(Ordering::SeqCst),
            slots: &slots,
            spares: &spares,
            faulty: &faulty,
            others: &[],
            sync: view.sync.clone(),
            dirty: view.dirty,
            failed: view.failed,
            read_only: view.read_only,
            scrub: Some(ScrubView {
                sync_action: view.sync_action.clone(),
                last_sync_action: view.last_sync_action.clone(),
                mismatch_cnt: view.mismatch_cnt,
            }),
        });
        // md's detail mid-reshape: "clean, reshaping" and "Reshape Status : N% complete".
        if let Some((done, total)) = view.reshape {
            info.state.push_str(", reshaping");
            info.progress = Some(format!("Reshape Status : {} complete", percent(done, total)));
            let speed = view.reshape_speed_sectors.filter(|v| *v > 0.0);
            info.sync = Some(SyncProgress {
                action: "reshape",
                done_sectors: done,
                total_sectors: total,
                speed_kib_per_s: speed.map(|v| v / 2.0),
                eta_s: speed.map(|v| total.saturating_sub(done) as f64 / v),
            });
        }
        for m in &view.members {
            if let DevRole::Replacement { slot } = m.role {
                info.rows.push(DeviceRow {
                    number: Some(m.dev_number),
                    slot: Some(slot),
                    state: "spare rebuilding replacement".into(),
                    path: m.name.clone(),
                });
                info.working += 1;
                info.spares += 1;
            }
            if !m.bad_blocks.is_empty() {
                info.bad_blocks.push((m.name.clone(), m.bad_blocks.clone()));
            }
        }
        info.write_behind = view.write_behind;
        info.behind_writes_in_flight = Some(view.behind_writes_in_flight);
        info.write_behind_requests = Some(view.write_behind_requests);
        if let (Some(p), Some(v)) = (info.sync.as_mut(), view.sync_speed_sectors.filter(|v| *v > 0.0)) {
            p.speed_kib_per_s = Some(v / 2.0);
            p.eta_s = Some(p.total_sectors.saturating_sub(p.done_sectors) as f64 / v);
        }
        info
    }

    pub fn detail(&self) -> anyhow::Result<String> {
        Ok(detail_text(&self.name, &self.detail_info()?))
    }

    /// `detail --json`, with each slot's member I/O counts since the array started.
    pub fn detail_json(&self) -> anyhow::Result<String> {
        let stats = self.handle.stats().ok();
        let exec: super::report::ExecutorIo = match &stats {
            Some(s) => {
                let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
                let by_key =
                    |(k, m): (&MemberKey, &MemberDev)| Some((m.name.clone(), *s.members.get(*k as usize)?));
                members.iter().filter_map(by_key).collect()
            }
            None => Vec::new(),
        };
        let (view, io) = self.view_and_io()?;
        let info = self.detail_of(&view);
        Ok(super::report::detail_json(&self.name, &info, &io, &exec))
    }

    /// `status --json`: the array's state, counts, sync and devices (docs/json.md).
    pub fn status_json(&self) -> anyhow::Result<String> {
        let view = self.view()?;
        // As `status`: what the array let go by then is released before the answer.
        self.look()?;
        let v = super::report::status_json(&self.name, &self.detail_of(&view));
        Ok(serde_json::to_string_pretty(&v)? + "\n")
    }

    /// A /proc/mdstat-like view.
    pub fn status(&self) -> anyhow::Result<String> {
        let view = self.view()?;
        // What the array let go by then is released before the answer: a member that
        // status no longer lists is no longer claimed.
        self.look()?;
        let sb = &view.sb;
        let level = level_name(sb.level);
        let mut s = format!("Personalities : [{level}]\n");
        let mut devs: Vec<String> = view
            .states
            .iter()
            .enumerate()
            .filter_map(|(slot, state)| {
                // md's device number (mdstat's desc_nr, detail's Number) as for every other
                // device listed here, never the slot: a spare that took slot 1 beside the
                // failed member numbered 1 would read as two devices [1].
                let holder = slot_holder(&view, slot)?;
                let mark = match state {
                    MemberState::Faulty => "(F)",
                    MemberState::Missing => return None,
                    _ => "",
                };
                Some(format!("{}[{}]{mark}", holder.name, holder.dev_number))
            })
            .collect();
        devs.extend(failed_out_of_slot(&view).map(|m| format!("{}[{}](F)", m.name, m.dev_number)));
        for m in &view.members {
            match m.role {
                DevRole::Spare => devs.push(format!("{}[{}](S)", m.name, m.dev_number)),
                DevRole::Replacement { .. } => devs.push(format!("{}[{}](R)", m.name, m.dev_number)),
                _ => {}
            }
        }
        let state = if view.failed {
            "FAILED"
        } else if view.read_only {
            "active (read-only)"
        } else {
            "active"
        };
        s.push_str(&format!("{} : {state} {level} {}\n", self.name, devs.join(" ")));
        let up: String =
            view.states.iter().map(|st| if matches!(st, MemberState::InSync) { 'U' } else { '_' }).collect();
        let in_sync = up.chars().filter(|&c| c == 'U').count();
        let geo_text = match sb.level {
            1 => String::new(),
            0 | 10 => format!(" {}k chunks", sb.chunksize / 2),
            l => format!(" level {l}, {}k chunk, algorithm {}", sb.chunksize / 2, sb.layout),
        };
        let version = match sb.super_offset {
            0 => 1,
            8 => 2,
            _ => 0,
        };
        s.push_str(&format!(
            "      {} blocks super 1.{version}{geo_text} [{}/{in_sync}] [{up}]\n",
            view.array_sectors / 2,
            view.states.len()
        ));
        if let Some(sync) = &view.sync {
            let word = super::detail::sync_word(sync.kind);
            let (done, total) = (sync.done_sectors, sync.total_sectors);
            s.push_str(&progress_line(word, done, total, view.sync_speed_sectors, sync.share_pct));
        }
        if let Some((done, total)) = view.reshape {
            s.push_str(&progress_line(
                "reshape",
                done,
                total,
                view.reshape_speed_sectors,
                view.reshape_share_pct,
            ));
        }
        if view.has_bitmap {
            s.push_str("      bitmap: internal\n");
        }
        s.push_str(&format!("      state: {}\n", self.detail_of(&view).state));
        Ok(s)
    }

    /// `done total` of the running sync, or `idle`: what the CLI's progress bar polls.
    pub fn progress(&self) -> anyhow::Result<String> {
        let view = self.view()?;
        if let Some((done, total)) = view.reshape {
            return Ok(format!("reshape {done} {total}\n"));
        }
        Ok(match view.sync {
            Some(s) => {
                format!("{} {} {}\n", super::detail::sync_word(s.kind), s.done_sectors, s.total_sectors)
            }
            None => "idle\n".to_string(),
        })
    }
}

/// A sync the array resumed at start from where its superblocks say it stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Resumed {
    kind: SyncKind,
    from_sectors: u64,
    /// Seen running: once it is not, it is over, and a later job of its kind is new.
    seen: bool,
}

/// A recovery from a member's recovery_offset, a resync from resync_offset (not a
/// bitmap's).
fn resumed_syncs(a: &Assembled) -> Vec<Resumed> {
    let at = |kind, from_sectors| Resumed { kind, from_sectors, seen: false };
    let mut out: Vec<Resumed> = a
        .plan
        .slots
        .iter()
        .enumerate()
        .filter_map(|(slot, s)| match s.as_ref()?.recovery_offset_sectors? {
            0 => None,
            from => Some(at(SyncKind::Recovery { member: slot }, from)),
        })
        .collect();
    if let ResyncNeed::Full { from_sector } = a.plan.resync {
        if from_sector > 0 {
            out.push(at(SyncKind::Resync, from_sector));
        }
    }
    out
}

/// md counts a resync or recovery over all it walks (`whole`: each member's data, the
/// array for raid10), from where it resumed: the engine's job counts only what was left
/// at start. A job resumed from `from` walks `[start, whole)` for a `start` at most
/// `from` (its first unit's start); it is counted as md would, `start` already done.
/// Any other job (new, or a bitmap's ranges) is left as it is; a resumed sync seen
/// running and then not is forgotten.
fn counted_from_checkpoint(s: Option<&mut SyncStatus>, whole: u64, resumed: &mut Vec<Resumed>) {
    let running = s.and_then(|s| {
        let start = whole.checked_sub(s.total_sectors).filter(|&start| start > 0)?;
        let r = resumed.iter_mut().find(|r| r.kind == s.kind && start <= r.from_sectors)?;
        r.seen = true;
        s.done_sectors += start;
        s.total_sectors = whole;
        Some(r.kind)
    });
    resumed.retain(|r| !r.seen || Some(r.kind) == running);
}

/// Failed members not yet removed whose slot another device holds now: md lists them as
/// faulty, outside the slots, until `remove`.
fn failed_out_of_slot(view: &ArrayView) -> impl Iterator<Item = &MemberView> {
    view.members.iter().filter(|m| match m.role {
        DevRole::Faulty { slot } => slot_holder(view, slot).map(|h| h.key) != Some(m.key),
        _ => false,
    })
}

/// One of mdstat's progress lines: the bar, `WORD = N% (done/total)` in KiB, then md's
/// finish (minutes, however many) and speed, the background work's share of the I/O
/// while clients ran (after md's fields so their parsers hold), and the time left in words
/// when minutes say little.
fn progress_line(
    word: &str,
    done: u64,
    total: u64,
    speed_sectors: Option<f64>,
    share_pct: Option<u8>,
) -> String {
    let share = share_pct.map(|p| format!(" share={p}%")).unwrap_or_default();
    let frac = if total == 0 { 1.0 } else { done as f64 / total as f64 };
    let filled = ((frac * 20.0) as usize).min(20);
    let bar = format!("[{}>{}]", "=".repeat(filled), ".".repeat(20 - filled));
    let (speed, finish, words) = match speed_sectors {
        Some(v) if v > 0.0 => {
            let left = total.saturating_sub(done) as f64 / v;
            let words = time_left_words(left).map(|w| format!(" ({w})")).unwrap_or_default();
            (format!("{:.0}K/sec", v / 2.0), format!("{:.1}min", left / 60.0), words)
        }
        _ => ("-".to_string(), "-".to_string(), String::new()),
    };
    format!(
        "      {bar}  {word} = {} ({}/{}) finish={finish} speed={speed}{share}{words}\n",
        percent(done, total),
        done / 2,
        total / 2
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(kind: SyncKind, done_sectors: u64, total_sectors: u64) -> SyncStatus {
        SyncStatus {
            kind,
            done_sectors,
            total_sectors,
            recovery_offset_sectors: 0,
            resync_offset_sectors: 0,
            also_recovering: Vec::new(),
            share_pct: None,
        }
    }

    #[test]
    fn a_resumed_sync_counts_from_its_checkpoint_and_any_other_as_it_is() {
        let rec = SyncKind::Recovery { member: 2 };
        let at = |kind, from_sectors| Resumed { kind, from_sectors, seen: false };
        let mut resumed = vec![at(rec, 4000), at(SyncKind::Resync, 100)];
        let mut look = |s: Option<&SyncStatus>| {
            let mut s = s.cloned();
            counted_from_checkpoint(s.as_mut(), 10_000, &mut resumed);
            s.map(|s| (s.done_sectors, s.total_sectors))
        };
        // A bitmap's ranges (1000 sectors in all) are not a tail from the checkpoint.
        assert_eq!(look(Some(&status(SyncKind::Resync, 10, 1_000))), Some((10, 1_000)));
        // Resumed at 4000, rounded down to a unit start (3072): 3072 of 10000 done at once.
        assert_eq!(look(Some(&status(rec, 10, 10_000 - 3072))), Some((3082, 10_000)));
        assert_eq!(look(Some(&status(rec, 900, 10_000 - 3072))), Some((3972, 10_000)));
        // Another slot's recovery stays as the engine counts it.
        let other = SyncKind::Recovery { member: 1 };
        assert_eq!(look(Some(&status(other, 10, 6_928))), Some((10, 6_928)));
        // Once it ran and is over, a later job of the slot (a bitmap re-add) is new.
        assert_eq!(look(None), None);
        assert_eq!(look(Some(&status(rec, 10, 6_928))), Some((10, 6_928)));
    }
}
