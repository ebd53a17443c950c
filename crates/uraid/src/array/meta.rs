//! Superblock and bitmap upkeep while an array runs. The decisions (dirty before the
//! first write, clean after a flush when writes stop, events and dev_roles, md_error on
//! a failed metadata write, write-intent bits durable before the writes they cover) are
//! `uraid_core::array::ArraySuperblocks`; this driver performs its rounds as member I/O
//! through the array's executor (`RuntimeHandle::member_io`: a write, then a flush of
//! that member) and keeps the locks and counters threads need.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail};
pub use uraid_core::array::DevRole;
use uraid_core::array::{ArrayMember, ArraySuperblocks, MemberKey, MetaIo, MetaRound, MetaWriteKind};
use uraid_core::meta::{BadBlocks, Superblock, WriteIntentBitmap};
use uraid_core::MemberIoOp;
use uraid_io::real::fault::{FaultOp, Faults};
use uraid_io::real::Member;
use uraid_io::runtime::{RuntimeError, RuntimeHandle};

/// A member as assembly hands it to the keeper.
pub struct MetaDev {
    pub name: String,
    pub path: PathBuf,
    pub file: File,
    pub sb: Superblock,
    pub role: DevRole,
    /// (st_dev, st_ino) or block device number, to recognise it when offered again.
    pub identity: (u64, u64),
    /// md's bad-block log as read at assembly (None: no log, or a new member).
    pub bad_blocks: Option<BadBlocks>,
}

/// The file behind a member key of the core state machine. `file` holds the member's
/// claim (its flock); I/O goes through the executor.
struct MemberFile {
    key: MemberKey,
    name: String,
    path: PathBuf,
    #[allow(dead_code)] // held for its claim, closed when the member leaves
    file: File,
    identity: (u64, u64),
    /// The executor's index for this member while it has no slot (a hot spare).
    spare_index: Option<usize>,
}

/// A member as the control paths see it (a copy: the state lock need not be held).
#[derive(Clone, Debug)]
pub struct DevView {
    pub key: MemberKey,
    pub name: String,
    pub path: PathBuf,
    pub identity: (u64, u64),
    pub sb: Superblock,
    pub role: DevRole,
}

pub struct SbState {
    /// The decisions: superblocks, roles, events, clean/dirty, bitmap.
    pub core: ArraySuperblocks,
    files: Vec<MemberFile>,
    next_key: MemberKey,
}

impl SbState {
    /// The members in the core's order (the freshest superblock first).
    pub fn devs(&self) -> Vec<DevView> {
        self.core
            .members()
            .iter()
            .filter_map(|m| {
                let f = self.files.iter().find(|f| f.key == m.key)?;
                Some(DevView {
                    key: m.key,
                    name: f.name.clone(),
                    path: f.path.clone(),
                    identity: f.identity,
                    sb: m.sb.clone(),
                    role: m.role,
                })
            })
            .collect()
    }

    /// Keeps `dev`'s file under a new key and adds it to the core's members.
    pub fn add_member(&mut self, dev: MetaDev, now_seconds: u64) -> MetaRound {
        let key = self.track(dev.name, dev.path, dev.file, dev.identity);
        self.core.member_added(ArrayMember { key, sb: dev.sb, role: dev.role }, now_seconds)
    }

    fn track(&mut self, name: String, path: PathBuf, file: File, identity: (u64, u64)) -> MemberKey {
        let key = self.next_key;
        self.next_key += 1;
        self.files.push(MemberFile { key, name, path, file, identity, spare_index: None });
        key
    }

    /// Closes the files of members the core no longer has (a removed member can then be
    /// claimed again).
    fn prune(&mut self) {
        let core = &self.core;
        self.files.retain(|f| core.member(f.key).is_some());
    }
}

/// Tells the engine that a member failed under a metadata write (md_error).
pub type MemberFailed = Box<dyn Fn(usize) + Send + Sync>;

pub struct MetaKeeper {
    state: Mutex<SbState>,
    /// Writes that ended and whose bitmap accounting waits for the state lock: they end
    /// on the array thread (a request's callback), which must never wait for the lock,
    /// since its holder may be waiting for that thread to perform a round's I/O.
    ended_writes: Mutex<Vec<(WriteToken, bool)>>,
    /// The running array's way to its members; rounds before it is set are refused.
    runtime: OnceLock<RuntimeHandle>,
    has_bitmap: bool,
    member_failed: OnceLock<MemberFailed>,
    faults: OnceLock<Arc<Faults>>,
    /// Mirrors the core's dirty flag for the write path's lock-free check; cleared early
    /// by [`MetaKeeper::try_mark_clean`] so writers racing it take the lock and wait.
    dirty: AtomicBool,
    writes_in_flight: AtomicU64,
    /// Bumped by every write; the idle check compares it across passes.
    write_generation: AtomicU64,
    read_only: bool,
}

impl MetaKeeper {
    pub fn new(
        devs: Vec<MetaDev>,
        events: u64,
        dirty: bool,
        resync_pending: bool,
        bitmap: Option<(WriteIntentBitmap, i32)>,
        read_only: bool,
    ) -> MetaKeeper {
        let has_bitmap = bitmap.is_some();
        let mut files = Vec::new();
        let mut members = Vec::new();
        let mut logs = Vec::new();
        for (key, d) in (0..).zip(devs) {
            if let Some(bb) = d.bad_blocks {
                logs.push((key, bb));
            }
            files.push(MemberFile {
                key,
                name: d.name,
                path: d.path,
                file: d.file,
                identity: d.identity,
                spare_index: None,
            });
            members.push(ArrayMember { key, sb: d.sb, role: d.role });
        }
        let next_key = files.len() as MemberKey;
        let mut core = ArraySuperblocks::new(members, events, dirty, resync_pending, bitmap);
        for (key, bb) in logs {
            core.load_bad_blocks(key, bb);
        }
        MetaKeeper {
            state: Mutex::new(SbState { core, files, next_key }),
            ended_writes: Mutex::new(Vec::new()),
            runtime: OnceLock::new(),
            has_bitmap,
            member_failed: OnceLock::new(),
            faults: OnceLock::new(),
            dirty: AtomicBool::new(dirty),
            writes_in_flight: AtomicU64::new(0),
            write_generation: AtomicU64::new(0),
            read_only,
        }
    }

    /// Where a failed superblock, bitmap or flush write on a member is reported, as md's
    /// md_error: the member is failed instead of the client's write.
    pub fn on_member_failed(&self, f: MemberFailed) {
        let _ = self.member_failed.set(f);
    }

    /// The array's runtime: rounds are performed through its executor from now on.
    pub fn attach_runtime(&self, handle: RuntimeHandle) {
        let _ = self.runtime.set(handle);
    }

    /// Injected faults of `op=meta` rules (tests of real runs).
    pub fn set_faults(&self, faults: Arc<Faults>) {
        let _ = self.faults.set(faults);
    }

    /// Whether an injected fault fails this metadata I/O on the member in `slot`.
    fn injected(&self, slot: Option<usize>) -> std::io::Result<()> {
        match (self.faults.get(), slot) {
            (Some(f), Some(slot)) if f.hit(slot, FaultOp::Meta) => {
                Err(std::io::Error::other("injected metadata write fault"))
            }
            _ => Ok(()),
        }
    }

    /// The state, with the bitmap accounting of every write that ended so far applied.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, SbState> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let ended = std::mem::take(&mut *self.ended_writes.lock().unwrap_or_else(|e| e.into_inner()));
        for (token, all_members) in ended {
            st.core.end_write(token.sync, all_members);
        }
        st
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::SeqCst)
    }

    pub fn has_bitmap(&self) -> bool {
        self.has_bitmap
    }

    /// One member I/O of a round through the executor: a write then a flush of the
    /// member (md's FUA/preflush), or the flush alone. Ok(false): the member failed it.
    fn perform_io(&self, rt: &RuntimeHandle, st: &mut SbState, io: &MetaIo) -> Result<bool, RuntimeError> {
        let Some(f) = st.files.iter_mut().find(|f| f.key == io.key()) else { return Ok(false) };
        let (slot, what) = match io {
            MetaIo::Write { slot, what: MetaWriteKind::Superblock, .. } => (*slot, "writing the superblock"),
            MetaIo::Write { slot, what: MetaWriteKind::BadBlockLog, .. } => {
                (*slot, "writing the bad-block log")
            }
            MetaIo::Write { slot, .. } => (*slot, "writing a bitmap page"),
            MetaIo::Flush { slot, .. } => (*slot, "flushing before clearing bitmap bits"),
        };
        let failed = |why: &str| {
            eprintln!("uraid: {}: {what} failed ({why}); failing the member", f.name);
            Ok(false)
        };
        if let Err(e) = self.injected(slot) {
            return failed(&e.to_string());
        }
        let index = match (slot, f.spare_index) {
            (Some(slot), _) => slot,
            (None, Some(index)) => index,
            (None, None) => {
                let member = match Member::open(&f.path, &super::running::exec_open_options(self.read_only)) {
                    Ok(m) => m,
                    Err(e) => return failed(&format!("opening it for I/O: {e}")),
                };
                match rt.control(move |_, ex, _| ex.attach_member(member))? {
                    Ok(index) => *f.spare_index.insert(index),
                    Err(e) => return failed(&format!("giving it to the executor: {e}")),
                }
            }
        };
        if let MetaIo::Write { offset_bytes, bytes, .. } = io {
            if let Err(e) = rt.member_io(index, MemberIoOp::Write, *offset_bytes, bytes.clone())? {
                return failed(&format!("{e:?}"));
            }
        }
        match rt.member_io(index, MemberIoOp::Flush, 0, Vec::new())? {
            Ok(()) => Ok(true),
            Err(e) => failed(&format!("{e:?} on the flush")),
        }
    }

    /// Performs `round` and the rounds the core asks for next. Members that fail are
    /// failed in the engine too; only an array with no working member left is an error.
    fn perform(&self, st: &mut SbState, round: MetaRound) -> anyhow::Result<()> {
        if self.read_only {
            return Ok(());
        }
        let Some(rt) = self.runtime.get() else { bail!("the array is not running: metadata not written") };
        let mut next = Some(round);
        while let Some(round) = next.take() {
            let mut stopped = false;
            let failed = round.execute(|io| {
                if stopped {
                    return false;
                }
                self.perform_io(rt, st, io).unwrap_or_else(|_| {
                    stopped = true;
                    false
                })
            });
            if stopped {
                // No member failed: the array thread is gone (stopping, or it died).
                bail!("the array thread stopped under a metadata write; superblocks not updated");
            }
            let out = st.core.round_done(round, &failed, super::now_seconds());
            st.prune();
            if let Some(tell) = self.member_failed.get() {
                for &slot in &out.newly_failed_slots {
                    tell(slot);
                }
            }
            next = out.next.map_err(|e| anyhow!("{e}"))?;
        }
        Ok(())
    }

    /// Before forwarding a write: mark the array dirty (once) and persist the write-intent
    /// bits it needs. The returned token goes to [`MetaKeeper::after_write`].
    pub fn before_write(&self, offset_bytes: u64, len_bytes: u64) -> anyhow::Result<WriteToken> {
        self.writes_in_flight.fetch_add(1, Ordering::SeqCst);
        self.write_generation.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.gate() {
            self.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
        if !self.has_bitmap {
            return Ok(WriteToken { sync: None });
        }
        // Holding the state lock through the page round keeps later writers of these
        // pages waiting until the bits are durable on every member still working.
        let mut st = self.lock();
        let intent = st.core.start_write(offset_bytes, len_bytes);
        if let Some(round) = intent.round {
            if let Err(e) = self.perform(&mut st, round) {
                drop(st);
                self.after_write(WriteToken { sync: intent.sync_range }, false);
                return Err(e);
            }
        }
        Ok(WriteToken { sync: intent.sync_range })
    }

    fn gate(&self) -> anyhow::Result<()> {
        if self.dirty.load(Ordering::SeqCst) || self.read_only {
            return Ok(());
        }
        let mut st = self.lock();
        if !self.dirty.load(Ordering::SeqCst) {
            if let Some(round) = st.core.mark_dirty(super::now_seconds()) {
                self.perform(&mut st, round)?;
            }
            self.dirty.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// After the write completed; `all_members` false (error, or degraded) keeps its bits.
    /// Runs on the array thread: see `ended_writes`.
    pub fn after_write(&self, token: WriteToken, all_members: bool) {
        if token.sync.is_some() {
            self.ended_writes.lock().unwrap_or_else(|e| e.into_inner()).push((token, all_members));
        }
        self.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn write_generation(&self) -> u64 {
        self.write_generation.load(Ordering::SeqCst)
    }

    /// md's safe mode: when no write arrived since `seen_generation`, flush with `flush`
    /// and mark the superblocks clean. Returns whether it did.
    pub fn try_mark_clean(&self, seen_generation: u64, flush: impl FnOnce() -> bool) -> anyhow::Result<bool> {
        if self.read_only || !self.dirty.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let mut st = self.lock();
        if st.core.resync_pending() || st.core.failed() || self.write_generation() != seen_generation {
            return Ok(false);
        }
        // Announce clean first, then look for writers: a writer that got past its dirty
        // check before this store is seen here; one after it waits on the lock we hold.
        self.dirty.store(false, Ordering::SeqCst);
        if self.writes_in_flight.load(Ordering::SeqCst) != 0 || !flush() {
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(false);
        }
        let Some(round) = st.core.mark_clean(super::now_seconds()) else {
            self.dirty.store(st.core.is_dirty(), Ordering::SeqCst);
            return Ok(false);
        };
        if let Err(e) = self.perform(&mut st, round) {
            self.dirty.store(true, Ordering::SeqCst);
            return Err(e);
        }
        Ok(true)
    }

    /// Shutdown after the final flush: clean unless a resync is still owed. md writes
    /// the superblocks on every stop, which also records the last recovery checkpoint.
    pub fn mark_stopped(&self) -> anyhow::Result<()> {
        // md_bitmap_flush: three daemon passes with no wait, so every bit whose writes
        // reached all members is cleared (after a flush) and the next start begins clean.
        for _ in 0..3 {
            self.bitmap_daemon()?;
        }
        let mut st = self.lock();
        let clean = !st.core.resync_pending() && !st.core.failed();
        let round = st.core.stop(super::now_seconds());
        self.perform(&mut st, round)?;
        self.dirty.store(!clean, Ordering::SeqCst);
        Ok(())
    }

    /// One pass of md's bitmap daemon: bits idle for two passes are cleared after a flush
    /// of every member, lazily.
    pub fn bitmap_daemon(&self) -> anyhow::Result<()> {
        if !self.has_bitmap || self.read_only {
            return Ok(());
        }
        let mut st = self.lock();
        match st.core.bitmap_daemon() {
            Some(round) => self.perform(&mut st, round),
            None => Ok(()),
        }
    }

    /// A resync or a recovery brought the whole array in sync: no bit is needed any more.
    pub fn bitmap_all_synced(&self) {
        self.lock().core.bitmap_all_synced();
    }

    /// Applies `change` (a transition of the core, which returns its round) and performs
    /// the round: every working member's superblock is written.
    pub fn update(&self, change: impl FnOnce(&mut SbState, u64) -> MetaRound) -> anyhow::Result<()> {
        let mut st = self.lock();
        let round = change(&mut st, super::now_seconds());
        let result = self.perform(&mut st, round);
        st.prune();
        result
    }

    /// Bytes of the bitmap area as it should be on a new member.
    pub fn bitmap_area(&self) -> Option<(i32, Vec<u8>)> {
        self.lock().core.bitmap_area()
    }
}

/// Carries a write's bitmap range from `before_write` to `after_write`.
pub struct WriteToken {
    sync: Option<(u64, u64)>,
}
