//! NBD protocol codec and server.
