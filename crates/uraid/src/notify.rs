//! systemd's readiness protocol (`Type=notify`): when started by systemd with
//! `NOTIFY_SOCKET` set, `uraid serve` says READY=1 once its NBD and control sockets listen,
//! and STOPPING=1 when it begins to stop. Without `NOTIFY_SOCKET`, nothing is sent.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=VALUE` lines) to systemd, if it is listening.
/// Errors are ignored: a lost notice makes systemd time the start out, loudly.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    let _ = match bytes.strip_prefix(b"@") {
        // An abstract socket: its name starts with a NUL byte instead of the '@'.
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            match std::os::unix::net::SocketAddr::from_abstract_name(name) {
                Ok(addr) => sock.send_to_addr(state.as_bytes(), &addr),
                Err(e) => Err(e),
            }
        }
        None => sock.send_to(state.as_bytes(), std::path::Path::new(&path)),
    };
}
