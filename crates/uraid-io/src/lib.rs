//! Member I/O executors: real files/devices and the deterministic simulator.
