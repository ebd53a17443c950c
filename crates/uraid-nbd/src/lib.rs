//! NBD protocol codec and server for uraid.
//!
//! - [`codec`]: sans-IO fixed-newstyle handshake ([`codec::Negotiation`]), request
//!   validation ([`codec::check_request`]) and reply encoding. No sockets, no threads.
//! - [`device`]: the [`BlockDevice`] trait the server drives (callback completion, many
//!   requests in flight), with [`MemDevice`] and [`FileDevice`].
//! - [`server`]: [`Server`] over TCP or Unix sockets with a [`ShutdownHandle`].
//! - [`tls`]: `NBD_OPT_STARTTLS` ([`TlsCredentials`]: X.509 or TLS-PSK) through a relay.
//!
//! ```no_run
//! use std::sync::Arc;
//! use uraid_nbd::{Export, MemDevice, Server, ServerOptions};
//! let device = Arc::new(MemDevice::new(64 << 20));
//! let server = Server::new(vec![Export::new("", device)], ServerOptions::default()).unwrap();
//! let stop = server.shutdown_handle(); // call stop.shutdown() from a signal thread
//! let listener = std::net::TcpListener::bind("127.0.0.1:10809").unwrap();
//! server.serve_tcp(listener).unwrap(); // returns after shutdown, in-flight requests done
//! # drop(stop);
//! ```

pub mod client;
pub mod codec;
pub mod device;
pub mod proto;
mod reply;
pub mod server;
#[cfg_attr(not(feature = "tls"), path = "tls_off.rs")]
pub mod tls;

pub use codec::{BlockSizeConstraints, TlsPolicy};
pub use device::{BlockDevice, BlockError, BlockRequest, Completion, DeviceCounters, FileDevice, MemDevice};
pub use server::{serve_tcp, serve_unix, ConfigError, Export, Server, ServerOptions, ShutdownHandle};
pub use tls::{TlsCredentials, TlsCredentialsError};
