//! GF(2^8) parity for RAID4/5/6, md-exact.
