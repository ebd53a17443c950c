//! The control socket of a running `uraid serve`, and the client commands that use it.
//!
//! Protocol: the client sends one line (`detail`, `status`, `progress`, `fail MEMBER`,
//! `remove MEMBER`, `add MEMBER`), the server answers `OK` or `ERR` on the first line,
//! then text, and closes the connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{bail, Context};

/// Sends one command, returns the reply text (an `ERR` reply becomes an error).
pub fn request(sock: &Path, command: &str) -> anyhow::Result<String> {
    let mut s = UnixStream::connect(sock).with_context(|| {
        format!("cannot reach the control socket {}: is `uraid serve` running with it?", sock.display())
    })?;
    s.write_all(command.as_bytes())?;
    s.write_all(b"\n")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status)?;
    let mut text = String::new();
    r.read_to_string(&mut text)?;
    match status.trim_end() {
        "OK" => Ok(text),
        "ERR" => bail!("{}", text.trim_end()),
        other => bail!("unexpected reply from the control socket: {other:?}"),
    }
}
