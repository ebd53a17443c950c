//! A member device opened for the executor: O_DIRECT where its file system accepts it,
//! with a buffered descriptor beside it for unaligned I/O (see the module above).

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
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

#[derive(Debug)]
pub struct Member {
    path: PathBuf,
    pub(super) buffered: File,
    direct: Option<File>,
    size_bytes: u64,
    /// Memory alignment O_DIRECT needs on this member (statx `STATX_DIOALIGN`; the
    /// conservative `DIRECT_ALIGN_BYTES` where the kernel does not say). A read whose result
    /// buffer happens to be this aligned is read straight into it, with no bounce buffer.
    pub(super) dio_mem_align: u64,
    /// The file lives in memory (tmpfs): its I/O is a copy to or from the page cache that
    /// never waits for a device, so the executor may do small I/O inline (see
    /// [`ExecutorOptions::inline_memory_io_max_bytes`]), and io_uring is told to hand the rest to a
    /// worker at once (`IOSQE_ASYNC`): its pool adds workers only when one blocks, which a
    /// tmpfs copy never does, so otherwise all of it runs on one worker, one core.
    pub(super) memory_backed: bool,
}

const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Whether an open file lives on tmpfs (memory, possibly swap; never a block device).
fn on_tmpfs(f: &File) -> bool {
    // SAFETY: fstatfs on an open descriptor writes only into `fs`.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatfs(f.as_raw_fd(), &mut fs) };
    rc == 0 && fs.f_type as i64 == TMPFS_MAGIC
}

/// `stx_dio_mem_align` of an open file, if the kernel and file system report it. tmpfs
/// does not report it, but its O_DIRECT is a plain copy from the page cache with no
/// memory alignment constraint.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn dio_mem_align(f: &File) -> Option<u64> {
    // SAFETY: statx on an open descriptor with an empty path writes only into `stx`.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(f.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx)
    };
    if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_mem_align > 0 {
        return Some(stx.stx_dio_mem_align as u64);
    }
    on_tmpfs(f).then_some(1)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn dio_mem_align(_f: &File) -> Option<u64> {
    None
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
        let direct = if opts.direct {
            match open(libc::O_DIRECT) {
                Ok(f) => Some(f),
                Err(e) => {
                    if opts.log {
                        eprintln!(
                            "uraid-io: {}: O_DIRECT refused ({e}); using buffered I/O for this member",
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
        let dio_mem_align = direct
            .as_ref()
            .and_then(dio_mem_align)
            .filter(|a| a.is_power_of_two() && *a <= DIRECT_ALIGN_BYTES)
            .unwrap_or(DIRECT_ALIGN_BYTES);
        let memory_backed = on_tmpfs(&buffered);
        Ok(Member { path, buffered, direct, size_bytes, dio_mem_align, memory_backed })
    }

    /// The same member on duplicated descriptors.
    pub fn try_clone(&self) -> io::Result<Member> {
        Ok(Member {
            path: self.path.clone(),
            buffered: self.buffered.try_clone()?,
            direct: self.direct.as_ref().map(File::try_clone).transpose()?,
            size_bytes: self.size_bytes,
            dio_mem_align: self.dio_mem_align,
            memory_backed: self.memory_backed,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }
    /// On tmpfs: I/O is a memory copy (see [`ExecutorOptions::inline_memory_io_max_bytes`]).
    pub fn is_memory_backed(&self) -> bool {
        self.memory_backed
    }

    /// The descriptor for an I/O and whether it is the O_DIRECT one.
    pub(super) fn fd_for(&self, op: MemberIoOp, offset_bytes: u64, len_bytes: u64) -> (RawFd, bool) {
        match &self.direct {
            Some(f)
                if op != MemberIoOp::Flush
                    && len_bytes > 0
                    && offset_bytes.is_multiple_of(DIRECT_ALIGN_BYTES)
                    && len_bytes.is_multiple_of(DIRECT_ALIGN_BYTES) =>
            {
                (f.as_raw_fd(), true)
            }
            _ => (self.buffered.as_raw_fd(), false),
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
