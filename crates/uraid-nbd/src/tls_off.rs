//! `tls` for a build without the `tls` feature (no OpenSSL to link, so a plain
//! `cargo build` needs no system library): credentials cannot be loaded, so a server never
//! holds any and refuses STARTTLS by its policy. `cargo build --features tls` gives the
//! real module (docs/operations.md, "NBD over TLS").

use std::convert::Infallible;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

/// Never made in this build.
pub struct TlsCredentials {
    never: Infallible,
}

impl std::fmt::Debug for TlsCredentials {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.never {}
    }
}

#[derive(Debug)]
pub struct TlsCredentialsError(String);

impl std::fmt::Display for TlsCredentialsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for TlsCredentialsError {}

fn not_built<T>() -> Result<T, TlsCredentialsError> {
    Err(TlsCredentialsError(
        "this uraid was built without TLS: build it with `cargo build --release --features tls` \
         (needs libssl-dev and pkg-config)"
            .into(),
    ))
}

impl TlsCredentials {
    pub fn x509(_dir: &Path, _verify_peer: bool) -> Result<TlsCredentials, TlsCredentialsError> {
        not_built()
    }

    pub fn psk(_file: &Path) -> Result<TlsCredentials, TlsCredentialsError> {
        not_built()
    }

    pub fn description(&self) -> &str {
        match self.never {}
    }
}

pub(crate) trait RelaySocket: Read + Write + AsRawFd + Send + 'static {}
impl<T: Read + Write + AsRawFd + Send + 'static> RelaySocket for T {}

pub(crate) fn start<S: RelaySocket>(
    credentials: &TlsCredentials,
    _socket: S,
    _early: Vec<u8>,
    _write_timeout: Option<Duration>,
) -> io::Result<(UnixStream, JoinHandle<()>)> {
    match credentials.never {}
}
