//! A member device opened for the executor. What the member *is* decides how its I/O runs
//! (see [`MemberKind`]): a block device always O_DIRECT through the backend, a file on a
//! disk file system O_DIRECT where that file system accepts it, a tmpfs file partly inline.
//! A buffered descriptor stays beside the direct one for I/O that cannot be aligned.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use super::*;

#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Try O_DIRECT (falls back to buffered per member where refused).
    pub direct: bool,
    pub read_only: bool,
    /// Log the buffered fallback on stderr (once per member).
    pub log: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { direct: true, read_only: false, log: true }
    }
}

/// What a member is, read from the member itself (`fstat`'s file type; a regular file's
/// own file system), never from the file system its device node sits on: `/dev` is
/// devtmpfs, which reports tmpfs's magic for every disk in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberKind {
    /// A disk, partition, loop or dm device: its I/O waits for hardware, so it never runs on
    /// the array thread, and its writes must reach the device before they count (a
    /// buffered write's error would only surface at the next flush).
    BlockDevice,
    /// A regular file on a disk file system.
    DiskFile,
    /// A regular file on tmpfs: I/O is a copy to or from memory that never waits for a
    /// device (see [`ExecutorOptions::inline_memory_io_max_bytes`]).
    MemoryFile,
    /// Anything else (a character device such as the `/dev/null` placeholder of an absent slot).
    Other,
    /// An export on an NBD server (see [`Member::remote`]).
    Remote,
}

impl MemberKind {
    pub fn name(self) -> &'static str {
        match self {
            MemberKind::BlockDevice => "block device",
            MemberKind::DiskFile => "file",
            MemberKind::MemoryFile => "file in memory (tmpfs)",
            MemberKind::Other => "other",
            MemberKind::Remote => "NBD export",
        }
    }
}

#[derive(Debug)]
pub struct Member {
    path: PathBuf,
    pub(super) buffered: File,
    direct: Option<File>,
    size_bytes: u64,
    kind: MemberKind,
    /// Which device this is (`st_rdev` of a block device, `st_dev`/`st_ino` of a file).
    device_id: (u64, u64),
    /// Offsets and lengths of O_DIRECT I/O must be multiples of this: a block device's
    /// logical block size (`BLKSSZGET`), [`DIRECT_ALIGN_BYTES`] for files.
    dio_offset_align: u64,
    /// Memory alignment O_DIRECT needs on this member (statx `STATX_DIOALIGN`; the logical
    /// block size or the conservative `DIRECT_ALIGN_BYTES` where the kernel does not say). A
    /// read whose result buffer happens to be this aligned is read straight into it.
    pub(super) dio_mem_align: u64,
    /// A block device's request queue: `nr_requests` and whether it is rotational (sysfs).
    queue: Option<(usize, bool)>,
    /// Memory-backed (tmpfs): small I/O may run inline and the rest is handed to an io-wq
    /// worker at once (`IOSQE_ASYNC`): its pool adds workers only when one blocks, which a
    /// tmpfs copy never does, so otherwise all of it runs on one worker, one core.
    pub(super) memory_backed: bool,
    /// A member behind a connection: all its I/O goes there (see `remote.rs`).
    pub(super) remote: Option<std::sync::Arc<dyn RemoteDevice>>,
    /// Its O_DIRECT reads and writes may go on a polled ring ([`Member::io_poll_queue`]),
    /// decided at open: a device added later without poll queues keeps the normal ring.
    pub(super) pollable: bool,
}

use crate::loopdev::TMPFS_MAGIC;

/// Whether an open regular file lives on tmpfs (memory, possibly swap).
fn on_tmpfs(f: &File) -> bool {
    // SAFETY: fstatfs on an open descriptor writes only into `fs`.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatfs(f.as_raw_fd(), &mut fs) };
    rc == 0 && fs.f_type as i64 == TMPFS_MAGIC
}

fn kind_of(f: &File) -> io::Result<(MemberKind, (u64, u64))> {
    use std::os::unix::fs::MetadataExt;
    let md = f.metadata()?;
    let ft = md.file_type();
    let id = if ft.is_block_device() { (md.rdev(), 0) } else { (md.dev(), md.ino()) };
    let kind = if ft.is_block_device() {
        MemberKind::BlockDevice
    } else if ft.is_file() {
        if on_tmpfs(f) {
            MemberKind::MemoryFile
        } else {
            MemberKind::DiskFile
        }
    } else {
        MemberKind::Other
    };
    Ok((kind, id))
}

/// A block device's logical block size, the unit of its O_DIRECT offsets and lengths.
fn logical_block_bytes(f: &File) -> Option<u64> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int into `size`.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), libc::BLKSSZGET, &mut size) };
    (rc == 0 && size > 0 && (size as u64).is_power_of_two()).then_some(size as u64)
}

/// A block device's request-queue attribute `name` from sysfs (a partition's are its
/// disk's, one folder up): the file read and its value.
fn queue_attr(f: &File, name: &str) -> Option<(PathBuf, usize)> {
    use std::os::unix::fs::MetadataExt;
    let rdev = f.metadata().ok()?.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    [base.join("queue").join(name), base.join("../queue").join(name)].into_iter().find_map(|p| {
        let v = std::fs::read_to_string(&p).ok()?.trim().parse::<usize>().ok()?;
        Some((p, v))
    })
}

/// A block device's `queue/nr_requests` and `queue/rotational`.
fn device_queue(f: &File) -> Option<(usize, bool)> {
    let nr = queue_attr(f, "nr_requests")?.1;
    Some((nr, queue_attr(f, "rotational").is_some_and(|(_, r)| r == 1)))
}

/// Whether every member can take polled I/O (`serve --io-poll`), from each member's
/// [`Member::io_poll_queue`]; the first that cannot is the error. A polled ring spins a
/// thread on a device that cannot be polled for nothing, so the option is all or none.
pub fn check_io_poll(members: impl IntoIterator<Item = Result<(), String>>) -> Result<(), String> {
    members.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok(())
}

/// `stx_dio_mem_align` of an open file, if the kernel and file system report it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn statx_dio_mem_align(f: &File) -> Option<u64> {
    // SAFETY: statx on an open descriptor with an empty path writes only into `stx`.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(f.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx)
    };
    (rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_mem_align > 0)
        .then_some(stx.stx_dio_mem_align as u64)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn statx_dio_mem_align(_f: &File) -> Option<u64> {
    None
}

/// How one I/O reaches a member (see [`Member::path_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IoPath {
    Direct,
    Buffered,
    /// Buffered, and a write goes with `RWF_DSYNC`: on a block device a buffered write
    /// would succeed into the page cache and its error surface only at the next flush, so
    /// the write itself must reach the device (md sees a write error at once).
    BufferedSync,
}

impl Member {
    /// Opens one member (see [`MemberSet::open`]).
    pub fn open(path: &Path, opts: &OpenOptions) -> io::Result<Member> {
        let path = path.to_path_buf();
        let open = |flags: i32| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(!opts.read_only)
                .custom_flags(flags | libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        };
        let mut buffered = open(0)?;
        let (kind, device_id) =
            kind_of(&buffered).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let direct = if opts.direct && kind != MemberKind::Other {
            match open(libc::O_DIRECT) {
                Ok(f) => Some(f),
                Err(e) => {
                    if opts.log {
                        let how = if kind == MemberKind::BlockDevice {
                            "buffered I/O with every write synchronous (RWF_DSYNC), slower"
                        } else {
                            "buffered I/O"
                        };
                        eprintln!(
                            "uraid-io: {}: O_DIRECT refused ({e}); using {how} for this member",
                            path.display()
                        );
                    }
                    None
                }
            }
        } else {
            None
        };
        // Works for block devices too, where metadata().len() is 0.
        let size_bytes = buffered.seek(SeekFrom::End(0))?;
        let block_bytes = (kind == MemberKind::BlockDevice).then(|| logical_block_bytes(&buffered)).flatten();
        let dio_offset_align = block_bytes.unwrap_or(DIRECT_ALIGN_BYTES).min(DIRECT_ALIGN_BYTES);
        let dio_mem_align = direct
            .as_ref()
            .and_then(statx_dio_mem_align)
            // tmpfs does not report it, but its O_DIRECT is a plain copy with no memory
            // alignment constraint; a block device's DMA needs at most its block size.
            .or(match kind {
                MemberKind::MemoryFile => Some(1),
                _ => block_bytes,
            })
            .filter(|a| a.is_power_of_two() && *a <= DIRECT_ALIGN_BYTES)
            .unwrap_or(DIRECT_ALIGN_BYTES);
        let memory_backed = kind == MemberKind::MemoryFile;
        let queue = (kind == MemberKind::BlockDevice).then(|| device_queue(&buffered)).flatten();
        let mut m = Member {
            path,
            buffered,
            direct,
            size_bytes,
            kind,
            device_id,
            dio_offset_align,
            dio_mem_align,
            queue,
            memory_backed,
            remote: None,
            pollable: false,
        };
        m.pollable = m.io_poll_queue().is_ok();
        Ok(m)
    }

    /// A member behind a connection, named `path` in messages. Its descriptors are
    /// `/dev/null`, never used for I/O: every I/O goes to `device`.
    pub fn remote(path: &Path, device: std::sync::Arc<dyn RemoteDevice>) -> io::Result<Member> {
        let null = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open("/dev/null")?;
        Ok(Member {
            path: path.to_path_buf(),
            buffered: null,
            direct: None,
            size_bytes: device.size_bytes(),
            kind: MemberKind::Remote,
            device_id: (u64::MAX - 1, device.identity()),
            dio_offset_align: 1,
            dio_mem_align: 1,
            queue: None,
            memory_backed: false,
            remote: Some(device),
            pollable: false,
        })
    }

    /// The same member on duplicated descriptors.
    pub fn try_clone(&self) -> io::Result<Member> {
        Ok(Member {
            path: self.path.clone(),
            buffered: self.buffered.try_clone()?,
            direct: self.direct.as_ref().map(File::try_clone).transpose()?,
            size_bytes: self.size_bytes,
            kind: self.kind,
            device_id: self.device_id,
            dio_offset_align: self.dio_offset_align,
            dio_mem_align: self.dio_mem_align,
            queue: self.queue,
            memory_backed: self.memory_backed,
            remote: self.remote.clone(),
            pollable: self.pollable,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    pub fn kind(&self) -> MemberKind {
        self.kind
    }
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }
    /// On tmpfs: I/O is a memory copy (see [`ExecutorOptions::inline_memory_io_max_bytes`]).
    pub fn is_memory_backed(&self) -> bool {
        self.memory_backed
    }
    /// A block device's request queue depth (`nr_requests`) and whether it is rotational.
    pub fn device_queue(&self) -> Option<(usize, bool)> {
        self.queue
    }
    /// Whether `other` is the same device or file as this member.
    pub fn same_device(&self, other: &Member) -> bool {
        self.kind != MemberKind::Other && self.device_id == other.device_id
    }
    /// Whether this member's I/O could be polled (`IORING_SETUP_IOPOLL`): a block device
    /// opened O_DIRECT whose request queue has poll queues (`queue/io_poll` is 1; an NVMe
    /// disk has them with the `nvme.poll_queues` module parameter). The error says why not.
    pub fn io_poll_queue(&self) -> Result<(), String> {
        let name = self.path.display();
        if self.kind != MemberKind::BlockDevice {
            return Err(format!(
                "{name} is a {}, not a block device: only O_DIRECT block-device I/O can be polled",
                self.kind.name()
            ));
        }
        if self.direct.is_none() {
            return Err(format!("{name} is not opened O_DIRECT: only O_DIRECT I/O can be polled"));
        }
        match queue_attr(&self.buffered, "io_poll") {
            Some((_, 1)) => Ok(()),
            Some((file, _)) => Err(format!(
                "{name} has no poll queues ({} is 0; an NVMe disk gets them from the nvme.poll_queues module parameter)",
                file.display()
            )),
            None => Err(format!("{name}: its request queue has no io_poll attribute in sysfs")),
        }
    }

    /// Whether its O_DIRECT reads and writes go on the polled ring when there is one.
    pub fn is_pollable(&self) -> bool {
        self.pollable
    }

    /// Lets this member's O_DIRECT I/O go on a polled ring although its queue has no poll
    /// queues: the I/O then completes by interrupt and the ring's poll sees it done, so
    /// the polled path runs on this machine's files and loop devices (tests only).
    #[cfg(test)]
    pub(crate) fn assume_pollable(&mut self) {
        self.pollable = self.direct.is_some();
    }

    /// The O_DIRECT descriptor, if the member has one.
    pub(super) fn direct_fd(&self) -> Option<RawFd> {
        self.direct.as_ref().map(File::as_raw_fd)
    }
    /// The unit of this member's O_DIRECT offsets and lengths.
    pub fn dio_offset_align(&self) -> u64 {
        self.dio_offset_align
    }

    /// The descriptor for an I/O and how it goes.
    pub(super) fn path_for(&self, op: MemberIoOp, offset_bytes: u64, len_bytes: u64) -> (RawFd, IoPath) {
        match &self.direct {
            Some(f)
                if op != MemberIoOp::Flush
                    && len_bytes > 0
                    && offset_bytes.is_multiple_of(self.dio_offset_align)
                    && len_bytes.is_multiple_of(self.dio_offset_align) =>
            {
                (f.as_raw_fd(), IoPath::Direct)
            }
            _ if op == MemberIoOp::Write && self.kind == MemberKind::BlockDevice => {
                (self.buffered.as_raw_fd(), IoPath::BufferedSync)
            }
            _ => (self.buffered.as_raw_fd(), IoPath::Buffered),
        }
    }
}

/// The member devices of one array, opened.
#[derive(Debug)]
pub struct MemberSet {
    pub(super) members: Vec<Member>,
}

impl MemberSet {
    pub fn open<P: AsRef<Path>>(paths: &[P], opts: &OpenOptions) -> io::Result<MemberSet> {
        let members = paths.iter().map(|p| Member::open(p.as_ref(), opts)).collect::<io::Result<_>>()?;
        Ok(MemberSet { members })
    }

    /// A set from members opened one by one (e.g. with placeholders for absent slots).
    pub fn from_members(members: Vec<Member>) -> MemberSet {
        MemberSet { members }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
    pub fn member(&self, i: usize) -> &Member {
        &self.members[i]
    }
    pub fn iter(&self) -> impl Iterator<Item = &Member> {
        self.members.iter()
    }
}
