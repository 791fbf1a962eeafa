//! The plain words every layer of vramlab shares:
//!
//! - [`types`]: which framework, which element type, what a block holds.
//! - [`units`]: byte units and the size format PyTorch prints.
//! - [`error`]: errors as values ([`DeviceError`], [`CommandError`]).
//! - [`fields`], [`by_name`]: JSON objects and unit enums read by hand.
//! - [`collections`], [`hash`]: small maps and a deterministic hash.

pub mod by_name;
pub mod collections;
pub mod error;
pub mod fields;
pub mod hash;
pub mod types;
pub mod units;

pub use error::{CommandError, DeviceError, ErrorKind, Invalid};
pub use types::Framework;
