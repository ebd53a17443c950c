//! Read balancing across copies for raid1 and raid10.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Balance {
    /// Outstanding queue depth plus distance from the member's last position.
    #[default]
    Load,
    /// The member sent a request least recently (gmirror's original `load`).
    LoadTime,
    RoundRobin,
    /// Reads of at least `slice` bytes are split across members.
    Split,
    /// Lowest-numbered working member first.
    Prefer,
}
