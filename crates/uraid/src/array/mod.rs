//! The array behind the CLI: members, assembly, metadata upkeep while running, and the
//! block device the NBD server exports.

pub mod assembly;
pub mod detail;
pub mod detail_info;
pub mod device;
pub mod events;
pub mod latency;
pub mod member;
pub mod member_io;
pub mod nbd_member;
pub mod report;
pub mod running;

/// An I/O error as a person reads it: the system's words without Rust's "(os error N)".
pub fn io_words(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if e.raw_os_error().is_some() => text[..at].to_string(),
        _ => text,
    }
}

/// `with_context` for I/O results, the error in words ([`io_words`]).
pub trait IoContext<T> {
    fn io_context<C: std::fmt::Display>(self, what: impl FnOnce() -> C) -> anyhow::Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io_context<C: std::fmt::Display>(self, what: impl FnOnce() -> C) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::anyhow!("{}: {}", what(), io_words(&e)))
    }
}

/// 16 random bytes for uuids, from the kernel's generator.
pub fn random_uuid() -> anyhow::Result<[u8; 16]> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .io_context(|| "cannot read /dev/urandom for a uuid")?;
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
