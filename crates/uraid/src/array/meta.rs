//! Superblock and bitmap upkeep while an array runs, as md does it: dirty before the
//! first write and clean after a flush when writes stop (or at shutdown), events and
//! dev_roles on every change, recovery checkpoints, and write-intent bits persisted
//! before the writes they cover.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use uraid_core::meta::{
    array_range_to_sync_range, feature, role, BitmapPageWrite, Superblock, WriteIntentBitmap, MAX_DEV_LIMIT,
    MAX_SECTOR,
};
use uraid_io::real::fault::{FaultOp, Faults};

/// What one member is to the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevRole {
    Active {
        slot: usize,
        recovering: bool,
    },
    Spare,
    /// Failed and not yet removed: its superblock is no longer written.
    Faulty {
        slot: usize,
    },
}

pub struct MetaDev {
    pub name: String,
    pub path: std::path::PathBuf,
    pub file: File,
    pub sb: Superblock,
    pub role: DevRole,
    /// (st_dev, st_ino) or block device number, to recognise it when offered again.
    pub identity: (u64, u64),
}

impl MetaDev {
    fn working(&self) -> bool {
        !matches!(self.role, DevRole::Faulty { .. })
    }
}

pub struct SbState {
    pub devs: Vec<MetaDev>,
    pub events: u64,
    /// A resync is due or running: the array may not be marked clean.
    pub resync_pending: bool,
    /// Where a resync stopped with everything below it in sync and flushed (set on a clean
    /// stop): written as resync_offset instead of 0, so the next start resumes there, as
    /// md records its resync position when it stops.
    pub resync_checkpoint: Option<u64>,
    pub failed: bool,
}

/// Where the bitmap lives on one working member.
struct BitmapTarget {
    file: File,
    offset_bytes: u64,
    identity: (u64, u64),
    slot: Option<usize>,
}

/// Tells the engine that a member failed under a metadata write (md_error).
pub type MemberFailed = Box<dyn Fn(usize) + Send + Sync>;

pub struct MetaKeeper {
    pub state: Mutex<SbState>,
    bitmap: Option<Mutex<WriteIntentBitmap>>,
    bitmap_offset_sectors: i32,
    targets: Mutex<Vec<BitmapTarget>>,
    member_failed: OnceLock<MemberFailed>,
    faults: OnceLock<Arc<Faults>>,
    dirty: AtomicBool,
    writes_in_flight: AtomicU64,
    /// Bumped by every write; the idle check compares it across passes.
    write_generation: AtomicU64,
    level: i32,
    raid_disks: u32,
    chunk_sectors: u32,
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
        let sb = &devs[0].sb;
        let (level, raid_disks, chunk_sectors) = (sb.level, sb.raid_disks, sb.chunksize);
        let bitmap_offset_sectors = bitmap.as_ref().map_or(0, |(_, o)| *o);
        let keeper = MetaKeeper {
            state: Mutex::new(SbState {
                devs,
                events,
                resync_pending,
                resync_checkpoint: None,
                failed: false,
            }),
            bitmap: bitmap.map(|(b, _)| Mutex::new(b)),
            bitmap_offset_sectors,
            targets: Mutex::new(Vec::new()),
            member_failed: OnceLock::new(),
            faults: OnceLock::new(),
            dirty: AtomicBool::new(dirty),
            writes_in_flight: AtomicU64::new(0),
            write_generation: AtomicU64::new(0),
            level,
            raid_disks,
            chunk_sectors,
            read_only,
        };
        let st = keeper.lock();
        keeper.refresh_targets(&st);
        drop(st);
        keeper
    }

    /// Where a failed superblock, bitmap or flush write on a member is reported, as md's
    /// md_error: the member is failed instead of the client's write.
    pub fn on_member_failed(&self, f: MemberFailed) {
        let _ = self.member_failed.set(f);
    }

    /// Injected faults of `op=meta` rules (tests of real runs).
    pub fn set_faults(&self, faults: Arc<Faults>) {
        let _ = self.faults.set(faults);
    }

    /// Whether an injected fault fails this metadata write on the member in `slot`.
    fn injected(&self, slot: Option<usize>) -> std::io::Result<()> {
        match (self.faults.get(), slot) {
            (Some(f), Some(slot)) if f.hit(slot, FaultOp::Meta) => {
                Err(std::io::Error::other("injected metadata write fault"))
            }
            _ => Ok(()),
        }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, SbState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::SeqCst)
    }

    pub fn has_bitmap(&self) -> bool {
        self.bitmap.is_some()
    }

    fn refresh_targets(&self, st: &SbState) {
        let mut t = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        t.clear();
        for d in st.devs.iter().filter(|d| d.working()) {
            if let (Ok(file), Some(at)) = (
                d.file.try_clone(),
                d.sb.super_offset.checked_add_signed(i64::from(self.bitmap_offset_sectors)),
            ) {
                let slot = match d.role {
                    DevRole::Active { slot, .. } => Some(slot),
                    _ => None,
                };
                t.push(BitmapTarget { file, offset_bytes: at * 512, identity: d.identity, slot });
            }
        }
    }

    /// events++, then every working member's bitmap header and superblock, each synced.
    /// `clean` decides resync_offset. A member whose write fails is failed (md_error) and
    /// the others are written again with it recorded as faulty; only an array with no
    /// working member left is an error.
    pub fn write_all(&self, st: &mut SbState, clean: bool) -> anyhow::Result<()> {
        if self.read_only {
            return Ok(());
        }
        loop {
            let failed = self.write_all_once(st, clean);
            self.refresh_targets(st);
            if failed.is_empty() {
                return Ok(());
            }
            self.fail_members(st, &failed);
            if !st.devs.iter().any(|d| d.working()) {
                anyhow::bail!("the superblock write failed on every member");
            }
        }
    }

    /// One pass of [`MetaKeeper::write_all`]; returns the members whose write failed.
    fn write_all_once(&self, st: &mut SbState, clean: bool) -> Vec<(u64, u64)> {
        st.events += 1;
        let max_dev = st
            .devs
            .iter()
            .map(|d| d.sb.dev_number + 1)
            .max()
            .unwrap_or(0)
            .max(st.devs[0].sb.max_dev)
            .min(MAX_DEV_LIMIT);
        let mut roles = vec![role::SPARE; max_dev as usize];
        for d in &st.devs {
            if let Some(r) = roles.get_mut(d.sb.dev_number as usize) {
                *r = match d.role {
                    DevRole::Active { slot, .. } => slot as u16,
                    DevRole::Spare => role::SPARE,
                    DevRole::Faulty { .. } => role::FAULTY,
                };
            }
        }
        let now = super::now_seconds();
        let mut bitmap_failed = Vec::new();
        if let Some(bm) = &self.bitmap {
            let mut bm = bm.lock().unwrap_or_else(|e| e.into_inner());
            bm.superblock_mut().events = st.events;
            let page0 = bm.page_write(0);
            let bytes = bm.page_bytes(&page0);
            drop(bm);
            bitmap_failed = self.write_bitmap_page(&page0, &bytes);
        }
        let mut failed = bitmap_failed.clone();
        for d in st.devs.iter_mut().filter(|d| d.working() && !bitmap_failed.contains(&d.identity)) {
            let sb = &mut d.sb;
            sb.events = st.events;
            sb.utime = now;
            sb.resync_offset = if clean { MAX_SECTOR } else { st.resync_checkpoint.unwrap_or(0) };
            sb.max_dev = max_dev;
            sb.dev_roles = roles.clone();
            match d.role {
                DevRole::Active { recovering: true, .. } => sb.feature_map |= feature::RECOVERY_OFFSET,
                _ => {
                    sb.feature_map &= !feature::RECOVERY_OFFSET;
                    sb.recovery_offset = 0;
                }
            }
            let bytes = sb.update_csum();
            let slot = match d.role {
                DevRole::Active { slot, .. } => Some(slot),
                _ => None,
            };
            let written = self
                .injected(slot)
                .and_then(|_| d.file.write_all_at(&bytes, sb.super_offset * 512))
                .and_then(|_| d.file.sync_data());
            if let Err(e) = written {
                eprintln!("uraid: {}: writing the superblock failed ({e}); failing the member", d.name);
                failed.push(d.identity);
            }
        }
        failed
    }

    /// md_error for members whose metadata write failed: an active member becomes faulty
    /// (the engine is told), a spare leaves. The caller writes the superblocks next.
    fn fail_members(&self, st: &mut SbState, identities: &[(u64, u64)]) {
        let mut slots = Vec::new();
        st.devs.retain_mut(|d| {
            if !identities.contains(&d.identity) {
                return true;
            }
            match d.role {
                DevRole::Active { slot, .. } => {
                    d.role = DevRole::Faulty { slot };
                    slots.push(slot);
                    true
                }
                DevRole::Spare => false,
                DevRole::Faulty { .. } => true,
            }
        });
        if let Some(tell) = self.member_failed.get() {
            for slot in slots {
                tell(slot);
            }
        }
    }

    /// Writes one bitmap page to every working member; returns those where it failed.
    fn write_bitmap_page(&self, w: &BitmapPageWrite, bytes: &[u8]) -> Vec<(u64, u64)> {
        let targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        let mut failed = Vec::new();
        for t in targets.iter() {
            let written = self
                .injected(t.slot)
                .and_then(|_| t.file.write_all_at(bytes, t.offset_bytes + w.offset_bytes))
                .and_then(|_| t.file.sync_data());
            if let Err(e) = written {
                eprintln!("uraid: writing a bitmap page failed ({e}); failing the member");
                failed.push(t.identity);
            }
        }
        failed
    }

    /// Fails the members a bitmap write failed on and records it in the superblocks.
    fn bitmap_write_failed(&self, identities: &[(u64, u64)]) -> anyhow::Result<()> {
        if identities.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        self.fail_members(&mut st, identities);
        let clean = !self.dirty.load(Ordering::SeqCst) && !st.resync_pending && !st.failed;
        self.write_all(&mut st, clean)
    }

    /// Sync-space range of an array byte range (what the bitmap counts in).
    fn sync_range(&self, offset_bytes: u64, len_bytes: u64) -> (u64, u64) {
        let start = offset_bytes / 512;
        let end = (offset_bytes + len_bytes).div_ceil(512);
        array_range_to_sync_range(self.level, self.raid_disks, self.chunk_sectors, start, end - start)
    }

    /// Before forwarding a write: mark the array dirty (once) and persist the write-intent
    /// bits it needs. The returned token goes to [`MetaKeeper::after_write`].
    pub fn before_write(&self, offset_bytes: u64, len_bytes: u64) -> anyhow::Result<WriteToken> {
        self.writes_in_flight.fetch_add(1, Ordering::SeqCst);
        self.write_generation.fetch_add(1, Ordering::SeqCst);
        let token = WriteToken { sync: None };
        if let Err(e) = self.gate(offset_bytes, len_bytes) {
            self.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
        let mut token = token;
        if let Some(bm) = &self.bitmap {
            let (s, l) = self.sync_range(offset_bytes, len_bytes);
            let mut bm = bm.lock().unwrap_or_else(|e| e.into_inner());
            let gate = bm.start_write(s, l);
            token.sync = Some((s, l));
            if !gate.pages_to_write.is_empty() && !self.read_only {
                // Holding the bitmap lock keeps later writers of these pages waiting until
                // the bits are durable on every member; a member that fails the write is
                // failed, so the bits are durable on every member still working.
                let mut failed = Vec::new();
                for w in &gate.pages_to_write {
                    let bytes = bm.page_bytes(w);
                    for id in self.write_bitmap_page(w, &bytes) {
                        if !failed.contains(&id) {
                            failed.push(id);
                        }
                    }
                }
                bm.pages_written(&gate.pages_to_write);
                drop(bm);
                if let Err(e) = self.bitmap_write_failed(&failed) {
                    self.after_write(WriteToken { sync: token.sync.take() }, false);
                    return Err(e);
                }
            }
        }
        Ok(token)
    }

    fn gate(&self, _offset: u64, _len: u64) -> anyhow::Result<()> {
        if self.dirty.load(Ordering::SeqCst) || self.read_only {
            return Ok(());
        }
        let mut st = self.lock();
        if !self.dirty.load(Ordering::SeqCst) {
            self.write_all(&mut st, false)?;
            self.dirty.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// After the write completed; `all_members` false (error, or degraded) keeps its bits.
    pub fn after_write(&self, token: WriteToken, all_members: bool) {
        if let (Some(bm), Some((s, l))) = (&self.bitmap, token.sync) {
            bm.lock().unwrap_or_else(|e| e.into_inner()).end_write(s, l, all_members);
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
        if st.resync_pending || st.failed || self.write_generation() != seen_generation {
            return Ok(false);
        }
        // Announce clean first, then look for writers: a writer that got past its dirty
        // check before this store is seen here; one after it waits on the lock we hold.
        self.dirty.store(false, Ordering::SeqCst);
        if self.writes_in_flight.load(Ordering::SeqCst) != 0 || !flush() {
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(false);
        }
        if let Err(e) = self.write_all(&mut st, true) {
            self.dirty.store(true, Ordering::SeqCst);
            return Err(e);
        }
        Ok(true)
    }

    /// Shutdown after the final flush: clean unless a resync is still owed. md writes
    /// the superblocks on every stop, which also records the last recovery checkpoint.
    pub fn mark_stopped(&self) -> anyhow::Result<()> {
        let mut st = self.lock();
        let clean = !st.resync_pending && !st.failed;
        self.write_all(&mut st, clean)?;
        self.dirty.store(!clean, Ordering::SeqCst);
        Ok(())
    }

    /// One pass of md's bitmap daemon: clear bits idle for two passes, lazily.
    pub fn bitmap_daemon(&self) -> anyhow::Result<()> {
        let Some(bm) = &self.bitmap else { return Ok(()) };
        if self.read_only {
            return Ok(());
        }
        let events = self.lock().events;
        let candidates = bm.lock().unwrap_or_else(|e| e.into_inner()).daemon_pass();
        if candidates.is_empty() {
            return Ok(());
        }
        // A bit may only be cleared once the data and parity it covers are durable on
        // every member (md flushes before writing cleared bits).
        let unflushed: Vec<(u64, u64)> = {
            let targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
            let flushed = |t: &BitmapTarget| self.injected(t.slot).and_then(|_| t.file.sync_data()).is_ok();
            targets.iter().filter(|t| !flushed(t)).map(|t| t.identity).collect()
        };
        if !unflushed.is_empty() {
            // Nothing is cleared this pass: the failed member's writes may not be durable.
            return self.bitmap_write_failed(&unflushed);
        }
        let mut bm = bm.lock().unwrap_or_else(|e| e.into_inner());
        let pages = bm.clear_flushed(&candidates, events);
        let mut failed = Vec::new();
        for w in &pages {
            let bytes = bm.page_bytes(w);
            failed.extend(self.write_bitmap_page(w, &bytes));
        }
        bm.pages_written(&pages);
        drop(bm);
        failed.dedup();
        self.bitmap_write_failed(&failed)
    }

    /// A resync or a recovery brought the whole array in sync: no bit is needed any more.
    pub fn bitmap_all_synced(&self) {
        if let Some(bm) = &self.bitmap {
            let mut bm = bm.lock().unwrap_or_else(|e| e.into_inner());
            let total = bm.superblock().sync_size;
            bm.sync_done(0, total);
        }
    }

    /// Applies `change` to the state and writes every superblock, keeping the array's
    /// current clean/dirty state.
    pub fn update(&self, change: impl FnOnce(&mut SbState)) -> anyhow::Result<()> {
        let mut st = self.lock();
        change(&mut st);
        let clean = !self.dirty.load(Ordering::SeqCst) && !st.resync_pending && !st.failed;
        self.write_all(&mut st, clean)
    }

    /// Bytes of the bitmap area as it should be on a new member.
    pub fn bitmap_area(&self) -> Option<(i32, Vec<u8>)> {
        let bm = self.bitmap.as_ref()?.lock().unwrap_or_else(|e| e.into_inner());
        Some((self.bitmap_offset_sectors, bm.area_bytes()))
    }
}

/// Carries a write's bitmap range from `before_write` to `after_write`.
pub struct WriteToken {
    sync: Option<(u64, u64)>,
}
