//! The block devices a bench runs on: the user's (`--devices`, overwritten only with
//! `--yes-destroy`), or loop devices over files in a folder on a disk (never tmpfs, where
//! the figures would be memory's), attached with direct I/O and detached and removed on
//! drop, errors and Ctrl-C included. `uraid bench disk` and `uraid bench rebuild` share it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use uraid_io::loopdev::LoopDevice;

/// Runs a tool to completion and returns its stdout; its output in the error when it fails.
pub(super) fn sh(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes btrfs, md and partition signatures, so the next system starts from blank devices.
pub(super) fn wipe(devices: &[PathBuf]) -> anyhow::Result<()> {
    sh(Command::new("wipefs").args(["-a", "-q"]).args(devices)).map(drop)
}

/// So that every read job reads from the devices, not from memory.
pub(super) fn drop_caches() -> anyhow::Result<()> {
    // SAFETY: sync has no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .context("cannot drop the page cache (echo 3 > /proc/sys/vm/drop_caches)")
}

/// The devices under test. On drop (errors and Ctrl-C included) the loop devices the bench
/// attached are detached and their files removed; the user's devices are wiped, so that no
/// stale btrfs or md array turns up on them later.
pub(super) struct Devices {
    pub(super) paths: Vec<PathBuf>,
    /// The user's devices, or loop devices over files (and whether direct I/O took).
    pub(super) kind: String,
    /// The folder of the loop devices' files; None with the user's devices.
    dir: Option<PathBuf>,
    loops: Vec<LoopDevice>,
}

impl Devices {
    pub(super) fn user(paths: &[PathBuf], yes_destroy: bool) -> anyhow::Result<Devices> {
        for d in paths {
            let meta = std::fs::metadata(d).with_context(|| format!("{}", d.display()))?;
            if !meta.file_type().is_block_device() {
                bail!("{} is not a block device", d.display());
            }
        }
        let list: Vec<String> = paths.iter().map(|d| d.display().to_string()).collect();
        if !yes_destroy {
            bail!("this bench overwrites {}: add --yes-destroy if that is what you want", list.join(", "));
        }
        eprintln!("overwriting {}", list.join(", "));
        Ok(Devices {
            paths: paths.to_vec(),
            kind: "the user's block devices".into(),
            dir: None,
            loops: Vec::new(),
        })
    }

    /// `count` loop devices over files of `size_bytes` in a folder `uraid-bench-TAG-PID`
    /// made under `parent`, which must be on a disk, not tmpfs.
    pub(super) fn loops(parent: &Path, tag: &str, count: usize, size_bytes: u64) -> anyhow::Result<Devices> {
        // The folder may not exist yet: its nearest existing ancestor tells the filesystem.
        let existing = parent.ancestors().find(|p| p.exists()).unwrap_or(Path::new("."));
        let (magic, free_bytes) = statfs(existing)?;
        use uraid_io::loopdev::TMPFS_MAGIC;
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        if magic == TMPFS_MAGIC || magic == RAMFS_MAGIC {
            bail!(
                "{} is on tmpfs: figures there would be memory's, not disks'; give a --dir on a disk",
                parent.display()
            );
        }
        if free_bytes < size_bytes * count as u64 {
            bail!(
                "{} has {} MiB free; {count} files of {} MiB need more",
                parent.display(),
                free_bytes >> 20,
                size_bytes >> 20
            );
        }
        let dir = parent.join(format!("uraid-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let kind = format!("loop devices over files in {}", parent.display());
        let mut d = Devices { paths: Vec::new(), kind, dir: Some(dir.clone()), loops: Vec::new() };
        for i in 0..count {
            let file = dir.join(format!("disk{i}.img"));
            let dev = LoopDevice::attach(&file, size_bytes).with_context(|| format!("{}", file.display()))?;
            d.paths.push(dev.path().to_path_buf());
            d.loops.push(dev);
        }
        // A host filesystem without O_DIRECT leaves the loop devices buffered: say so.
        let dio = d.paths.iter().all(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).is_ok_and(|s| s.trim() == "1")
        });
        d.kind +=
            if dio { ", direct-io on" } else { ", direct-io OFF (the host's page cache is in the figures)" };
        Ok(d)
    }
}

impl Drop for Devices {
    fn drop(&mut self) {
        let Some(dir) = &self.dir else {
            let _ = wipe(&self.paths);
            return;
        };
        for dev in self.loops.drain(..) {
            let file = dev.backing().to_path_buf();
            drop(dev);
            let _ = std::fs::remove_file(file);
        }
        let _ = std::fs::remove_dir(dir);
    }
}

/// The filesystem type's magic and the bytes free to an unprivileged user under `dir`.
fn statfs(dir: &Path) -> anyhow::Result<(i64, u64)> {
    let c = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: statfs writes only into `fs`; `c` is a NUL-terminated path.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("statfs {}", dir.display()));
    }
    Ok((fs.f_type as i64, fs.f_bavail * fs.f_bsize as u64))
}
