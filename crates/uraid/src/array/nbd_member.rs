//! A member that is an NBD export: uraid-nbd's client connection, seen by the executor as a
//! [`RemoteDevice`] and by the CLI's metadata reads and writes as a device.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use uraid_core::{IoBytes, MemberIoError, MemberIoOp};
use uraid_io::real::{RemoteDevice, RemoteDone};
use uraid_nbd::client::{ClientError, Connection, NbdUri, Op};

pub use uraid_nbd::client::is_nbd_uri;

/// How long connecting and the handshake may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The same server and export is the same device, however the URI spells the port.
fn identity_of(uri: &NbdUri) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    uri.hash(&mut h);
    h.finish()
}

/// A member's identity (as `MemberDev::identity`) from its URI alone, without connecting.
pub fn uri_identity(uri: &str) -> Option<(u64, u64)> {
    NbdUri::parse(uri).ok().map(|u| (u64::MAX - 1, identity_of(&u)))
}

#[derive(Debug)]
pub struct NbdMember {
    conn: Connection,
    identity: u64,
}

/// A write's bytes, owned by the connection until they are sent.
struct Payload(IoBytes);

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl NbdMember {
    /// Connects to the export `uri` names; `writable` refuses a read-only export.
    pub fn connect(uri: &str, writable: bool) -> anyhow::Result<Arc<NbdMember>> {
        let parsed = NbdUri::parse(uri).map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
        let conn = Connection::connect(&parsed, writable, CONNECT_TIMEOUT)
            .map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
        Ok(Arc::new(NbdMember { conn, identity: identity_of(&parsed) }))
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }
}

impl RemoteDevice for NbdMember {
    fn size_bytes(&self) -> u64 {
        self.conn.size_bytes()
    }
    fn identity(&self) -> u64 {
        self.identity
    }
    fn start(&self, op: MemberIoOp, offset_bytes: u64, len_bytes: usize, data: IoBytes, done: RemoteDone) {
        let op = match op {
            MemberIoOp::Read => Op::Read { len_bytes: len_bytes as u32 },
            MemberIoOp::Write => Op::Write(Box::new(Payload(data))),
            MemberIoOp::Flush => Op::Flush,
        };
        // A lost connection is a member gone (md fails it, as for a disk that dropped off
        // the bus); an error the server answered is a failed I/O like a disk's EIO.
        self.conn.submit(
            op,
            offset_bytes,
            Box::new(move |r| {
                done(r.map_err(|e| match e {
                    ClientError::Server(_) => MemberIoError::Io,
                    ClientError::Disconnected(_) => MemberIoError::Gone,
                }))
            }),
        );
    }
}
