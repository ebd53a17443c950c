//! md geometry.
