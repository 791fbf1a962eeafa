//! One process on a device, in layers; each uses only those listed
//! before it:
//!
//! - [`runtime`]: names, reference counts, cycles and `gc.collect()`.
//! - [`stats`]: the numbers every result carries and the event log's entries.
//! - [`process`]: one process: device + allocator + runtime + event log.
//! - [`snapshot`]: the segment map and live objects, captured from a process.

pub mod process;
pub mod runtime;
pub mod snapshot;
pub mod stats;

pub use snapshot::Snapshot;
pub use stats::Stats;
