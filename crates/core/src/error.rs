//! Errors as values, in layers: [`DeviceError`] from the driver (out of
//! memory or a failure), [`CommandError`] for a command the engine refused
//! or that failed. Connection errors of the websocket are the protocol's.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Kinds of error a command can end in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The line is not JSON.
    ParseError,
    /// JSON, but not a command: unknown command, missing, unknown or wrong field.
    InvalidCommand,
    /// A value out of range: a size, a fraction, a setting.
    InvalidValue,
    /// Python's `NameError`: the name is not bound.
    NameError,
    /// The framework ran out of device memory.
    OutOfMemory,
    /// What Python raises as a `RuntimeError`: a second backward through a
    /// freed graph, a closed session.
    RuntimeError,
    /// The GPU or its driver failed (not an out-of-memory): a CUDA error, a
    /// context that could not be created.
    DeviceError,
}

crate::read_by_name!(ErrorKind {
    ParseError = "parse_error",
    InvalidCommand = "invalid_command",
    InvalidValue = "invalid_value",
    NameError = "name_error",
    OutOfMemory = "out_of_memory",
    RuntimeError = "runtime_error",
    DeviceError = "device_error",
});

/// An error as a value: what went wrong, in words a user understands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CommandError {
    pub kind: ErrorKind,
    pub message: String,
}

/// Read by hand, as a record is (`fields`).
impl<'de> Deserialize<'de> for CommandError {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::fields::read(d, |f| {
            Ok(CommandError {
                kind: f.take("kind")?,
                message: f.take("message")?,
            })
        })
    }
}

impl CommandError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for CommandError {}

/// A value out of range (a size, a shape, a setting, a field's text), in
/// words a user understands; a command refused for it ends in
/// [`ErrorKind::InvalidValue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid(pub String);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Invalid {
    fn from(message: &str) -> Self {
        Invalid(message.into())
    }
}

impl From<Invalid> for CommandError {
    fn from(e: Invalid) -> Self {
        CommandError::new(ErrorKind::InvalidValue, e.0)
    }
}

/// An invariant of the engine's state that does not hold (checked after
/// every command in debug builds): a fault of vramlab, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broken(pub String);

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Broken {
    fn from(message: &str) -> Self {
        Broken(message.into())
    }
}

/// What a device call can end in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// The driver has not enough free memory (`cudaErrorMemoryAllocation`).
    OutOfMemory,
    /// Any other driver failure, with the driver's words.
    Driver(String),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::OutOfMemory => write!(f, "out of memory"),
            DeviceError::Driver(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for DeviceError {}

impl From<DeviceError> for CommandError {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::OutOfMemory => CommandError::new(
                ErrorKind::OutOfMemory,
                "the driver has not enough free memory",
            ),
            DeviceError::Driver(message) => {
                CommandError::new(ErrorKind::DeviceError, format!("GPU error: {message}"))
            }
        }
    }
}
