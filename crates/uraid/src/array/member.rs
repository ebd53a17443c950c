//! Opening members (regular files, block devices or NBD exports) and reading their md metadata.
//!
//! Reading never writes: a refused assembly must leave every member byte-identical.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::bail;
use uraid_core::meta::{read_member, MemberMetadata, Superblock, SuperblockError};

use super::nbd_member::{is_nbd_uri, NbdMember};
use super::IoContext;

/// How a member is reached.
#[derive(Debug)]
pub enum DevIo {
    File(File),
    /// An NBD export; the executor shares the connection (see [`MemberDev::exec_member`]).
    Nbd(std::sync::Arc<NbdMember>),
}

/// See [`MemberDev::identity`].
fn identity_of(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::FileTypeExt;
    if meta.file_type().is_block_device() {
        (u64::MAX, meta.rdev())
    } else {
        (meta.dev(), meta.ino())
    }
}

/// `p` as another process must be told it (control requests, the list of running
/// arrays): absolute, except an NBD URI, which names no file here.
pub fn absolute_member(p: &Path) -> PathBuf {
    if is_nbd_uri(&p.to_string_lossy()) {
        return p.to_path_buf();
    }
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// One opened member device.
#[derive(Debug)]
pub struct MemberDev {
    pub path: PathBuf,
    /// How the user named it, used in every message.
    pub name: String,
    pub io: DevIo,
    pub size_bytes: u64,
    /// (st_dev, st_ino) for regular files, st_rdev for block devices: the identity that
    /// catches one member offered twice under two names.
    pub identity: (u64, u64),
}

impl MemberDev {
    pub fn open(path: &Path, writable: bool) -> anyhow::Result<MemberDev> {
        let name = path.display().to_string();
        if is_nbd_uri(&name) {
            let nbd = NbdMember::connect(&name, writable)?;
            use uraid_io::real::RemoteDevice;
            let (size_bytes, identity) = (nbd.size_bytes(), (u64::MAX - 1, nbd.identity()));
            return Ok(MemberDev {
                path: path.to_path_buf(),
                name,
                io: DevIo::Nbd(nbd),
                size_bytes,
                identity,
            });
        }
        let meta = std::fs::metadata(path).io_context(|| format!("{name}: cannot stat the member"))?;
        let ft = meta.file_type();
        use std::os::unix::fs::FileTypeExt;
        if !(ft.is_file() || ft.is_block_device()) {
            bail!("{name}: not a regular file or block device");
        }
        let mut file =
            std::fs::OpenOptions::new().read(true).write(writable).open(path).io_context(|| {
                format!("{name}: cannot open the member{}", if writable { " for writing" } else { "" })
            })?;
        // metadata().len() is 0 for block devices; seeking to the end works for both.
        let size_bytes =
            file.seek(SeekFrom::End(0)).io_context(|| format!("{name}: cannot find its size"))?;
        Ok(MemberDev {
            path: path.to_path_buf(),
            name,
            io: DevIo::File(file),
            size_bytes,
            identity: identity_of(&meta),
        })
    }

    /// Whether its path still names this device: false once the file was deleted or
    /// replaced, or the disk unplugged (its node gone or another device's). The open
    /// descriptor may still work; the device is no longer where the user put it.
    pub fn still_there(&self) -> bool {
        // An export is there while its connection is: a server that went away drops it.
        if let DevIo::Nbd(n) = &self.io {
            return n.connection().dead().is_none();
        }
        std::fs::metadata(&self.path).is_ok_and(|m| identity_of(&m) == self.identity)
    }

    /// Opens `path` for writing and claims it for this process, as md claims its members:
    /// `O_EXCL` on a block device (which also keeps out the kernel's md and mounts), an
    /// exclusive `flock` on a file. The claim lasts while the descriptor is open.
    pub fn open_claimed(path: &Path) -> anyhow::Result<MemberDev> {
        let mut dev = MemberDev::open(path, true)?;
        dev.claim()?;
        Ok(dev)
    }

    pub fn claim(&mut self) -> anyhow::Result<()> {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        // An export cannot be locked from here: keeping other clients off is the server's
        // (nbdkit admits one client at a time with `--filter=limit limit=1`).
        let DevIo::File(file) = &self.io else { return Ok(()) };
        let ft = file.metadata().io_context(|| format!("{}: cannot stat the member", self.name))?;
        if ft.file_type().is_block_device() {
            // O_EXCL on a block device fails with EBUSY while anyone else holds it exclusively;
            // the exclusive descriptor becomes the working one.
            self.io = DevIo::File(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_EXCL)
                    .open(&self.path)
                    .map_err(|e| in_use(&self.name, e, None))?,
            );
            return Ok(());
        }
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(file), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(in_use(&self.name, err, lock_holder(self.identity)));
        }
        Ok(())
    }

    pub fn dev_sectors(&self) -> u64 {
        self.size_bytes / 512
    }

    /// Reads `len` bytes at `offset`; a short read (end of device) returns what is there.
    pub fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let file = match &self.io {
            DevIo::File(f) => f,
            DevIo::Nbd(n) => {
                let len = (len as u64).min(self.size_bytes.saturating_sub(offset)) as usize;
                return n.connection().read_at(offset, len);
            }
        };
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        match &self.io {
            DevIo::File(f) => f.write_all_at(data, offset),
            DevIo::Nbd(n) => n.connection().write_at(offset, data),
        }
    }

    pub fn sync(&self) -> std::io::Result<()> {
        match &self.io {
            DevIo::File(f) => f.sync_data(),
            DevIo::Nbd(n) => n.connection().flush(),
        }
    }

    /// The member as the executor performs its I/O: a file or device opened again, an
    /// export on this same connection.
    pub fn exec_member(&self, opts: &uraid_io::real::OpenOptions) -> std::io::Result<uraid_io::real::Member> {
        match &self.io {
            DevIo::File(_) => uraid_io::real::Member::open(&self.path, opts),
            DevIo::Nbd(n) => uraid_io::real::Member::remote(&self.path, n.clone()),
        }
    }

    /// What assembly reads of the member: its superblock (whichever 1.x placement holds
    /// one), bitmap and bad-block log.
    pub fn metadata(&self) -> MemberMetadata {
        read_member(&self.name, self.dev_sectors(), &mut |offset, len| {
            self.read_at(offset, len).unwrap_or_default()
        })
    }

    /// Its superblock, if one parses (what `examine`, `add` and `create` look at).
    pub fn superblock(&self) -> Result<Superblock, SuperblockError> {
        self.metadata().offered.superblock
    }
}

fn in_use(name: &str, err: std::io::Error, holder: Option<String>) -> anyhow::Error {
    let busy = matches!(err.raw_os_error(), Some(libc::EWOULDBLOCK) | Some(libc::EBUSY));
    if !busy {
        return anyhow::anyhow!("{name}: cannot claim the member: {}", super::io_words(&err));
    }
    let by = holder.map(|h| format!(" by {h}")).unwrap_or_default();
    anyhow::anyhow!(
        "{name} is in use{by}: another `uraid serve`, the kernel's md or a mount holds it; stop that first \
         (nothing was written)"
    )
}

/// The process holding a flock on the file with `identity`, from /proc/locks: "pid N (command)".
fn lock_holder(identity: (u64, u64)) -> Option<String> {
    let (dev, ino) = identity;
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4).map(|p| p.to_string()))?
    })?;
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|c| {
            c.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Some(if cmd.is_empty() { format!("pid {pid}") } else { format!("pid {pid} ({cmd})") })
}

/// Opens every member, refusing one device named twice; `writable` also claims each one
/// (see [`MemberDev::open_claimed`]).
pub fn open_members(paths: &[PathBuf], writable: bool) -> anyhow::Result<Vec<MemberDev>> {
    let mut out: Vec<MemberDev> = Vec::new();
    for p in paths {
        let m = MemberDev::open(p, writable)?;
        if let Some(first) = out.iter().find(|o| o.identity == m.identity) {
            bail!(
                "{} and {} are the same device: give each member once (nothing was written)",
                first.name,
                m.name
            );
        }
        out.push(m);
    }
    if writable {
        for m in &mut out {
            m.claim()?;
        }
    }
    Ok(out)
}
