//! Loop devices over files, for tests and `uraid bench disk`: block-device members on a
//! machine with no spare disks. Each is attached with `losetup --direct-io=on` (so the
//! loop driver does not keep a second copy of the data in the page cache) and detached
//! when dropped, whatever happened in between.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device attached to a file; detached on drop.
#[derive(Debug)]
pub struct LoopDevice {
    device: PathBuf,
    backing: PathBuf,
}

/// statfs's `f_type` of tmpfs.
pub const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Whether `dir` is on tmpfs, where a loop device measures memory, not a disk.
pub fn on_tmpfs(dir: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
    // SAFETY: statfs writes only into `fs`; `c` is a valid C string for the call.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fs.f_type as i64 == TMPFS_MAGIC)
}

impl LoopDevice {
    /// Makes `backing` (`size_bytes`, sparse) if it does not exist and attaches a loop
    /// device to it. Fails with the reason where loop devices cannot be made (not root, no
    /// loop driver, `losetup` missing) or `backing` is on tmpfs.
    pub fn attach(backing: &Path, size_bytes: u64) -> io::Result<LoopDevice> {
        let dir = backing.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if on_tmpfs(dir)? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: on tmpfs; a loop device there measures memory, not a disk", dir.display()),
            ));
        }
        if !backing.exists() {
            std::fs::File::create(backing)?.set_len(size_bytes)?;
        }
        let out =
            Command::new("losetup").args(["-f", "--show", "--direct-io=on"]).arg(backing).output().map_err(
                |e| io::Error::new(e.kind(), format!("losetup (util-linux) is needed for loop devices: {e}")),
            )?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "losetup -f --show --direct-io=on {}: {} (loop devices need root and the loop driver)",
                backing.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(LoopDevice { device, backing: backing.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.device
    }

    pub fn backing(&self) -> &Path {
        &self.backing
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        // Detaching can race a process still closing the device (EBUSY): retry briefly.
        for _ in 0..50 {
            match Command::new("losetup").arg("-d").arg(&self.device).status() {
                Ok(s) if s.success() => return,
                _ => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
        eprintln!("loopdev: could not detach {} (of {})", self.device.display(), self.backing.display());
    }
}
