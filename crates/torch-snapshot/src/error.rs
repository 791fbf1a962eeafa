//! Why a snapshot could not be read, replayed or asked about: typed by
//! where it failed, each with words for the user.

use std::fmt;

/// The file's bytes cannot be read as a pickle, JSON or the page's wire
/// form: malformed, or past a limit of their reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed(pub String);

/// What a file holds is not a memory snapshot as PyTorch writes it: the
/// field, and what it holds instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unexpected(pub String);

/// Why a file could not be read as a snapshot, replayed, or asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// Larger than the files read here ([`crate::MAX_FILE_BYTES`]).
    TooLarge { bytes: usize },
    /// Neither a pickle nor JSON.
    UnknownFormat,
    /// The bytes cannot be read (or their reading passes a limit).
    Malformed(Malformed),
    /// Read, but not a memory snapshot: `file` is what was read ("the
    /// pickle", "the JSON").
    NotASnapshot { file: &'static str, why: Unexpected },
    /// The recording cannot be replayed or asked about as asked: what its
    /// events contradict, the event it lacks.
    Replay(String),
    /// The settings asked for cannot be used: a what-if's text, a card
    /// too small for what the recording holds, another framework.
    Settings(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::TooLarge { bytes } => write!(
                f,
                "the file is {} MB; snapshots of up to {} MB are read",
                bytes >> 20,
                crate::MAX_FILE_BYTES >> 20
            ),
            SnapshotError::UnknownFormat => f.write_str(
                "not a PyTorch memory snapshot: expected the pickle that \
                 torch.cuda.memory._dump_snapshot() writes, or JSON",
            ),
            SnapshotError::Malformed(m) => m.fmt(f),
            SnapshotError::NotASnapshot { file, why } => {
                write!(f, "{file} is not a memory snapshot: {why}")
            }
            SnapshotError::Replay(why) | SnapshotError::Settings(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for SnapshotError {}

impl From<Malformed> for SnapshotError {
    fn from(m: Malformed) -> Self {
        SnapshotError::Malformed(m)
    }
}

macro_rules! message {
    ($t:ident) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $t {
            fn from(s: String) -> Self {
                $t(s)
            }
        }

        impl From<&str> for $t {
            fn from(s: &str) -> Self {
                $t(s.to_string())
            }
        }
    };
}

message!(Malformed);
message!(Unexpected);
