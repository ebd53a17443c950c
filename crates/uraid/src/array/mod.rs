//! The array behind the CLI: members, assembly, metadata upkeep while running, and the
//! block device the NBD server exports.

pub mod assembly;
pub mod detail;
pub mod device;
pub mod member;
pub mod report;
pub mod running;

/// 16 random bytes for uuids, from the kernel's generator.
pub fn random_uuid() -> anyhow::Result<[u8; 16]> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| anyhow::anyhow!("cannot read /dev/urandom for a uuid: {e}"))?;
    Ok(b)
}

pub fn now_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// This machine's name, as mdadm's homehost.
pub fn homehost() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
