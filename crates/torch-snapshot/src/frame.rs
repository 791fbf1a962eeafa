//! A stack frame of a snapshot, and a stack of them: where in the user's
//! program a block was allocated or an event happened.

use serde::Serialize;
use std::sync::Arc;

/// Stack frames kept per block or event (a recording may hold hundreds;
/// the first are the innermost, where the allocation happened).
pub const MAX_FRAMES: usize = 32;

/// One stack frame. Its strings are shared: a recording names the same
/// few files and functions in millions of frames.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    pub filename: Arc<str>,
    pub line: i64,
    pub name: Arc<str>,
}

/// A stack of frames, innermost first, shared by every record made at the
/// same place (a recording has a few hundred stacks for millions of
/// events).
pub type Stack = Arc<[Frame]>;

impl Frame {
    /// `name (file:line)`, or the name alone for a frame without a source
    /// file (C++ frames, vramlab's own owner frames).
    pub fn label(&self) -> String {
        if self.filename.ends_with(".py") {
            format!("{} ({}:{})", self.name, self.filename, self.line)
        } else {
            self.name.to_string()
        }
    }

    fn is_python(&self) -> bool {
        self.filename.ends_with(".py")
    }

    fn is_torch(&self) -> bool {
        self.filename.contains("/torch/") || self.filename.starts_with("torch/")
    }
}

/// The frame a reader looks for: the innermost Python frame outside
/// PyTorch's own files, else the innermost Python frame, else the first.
pub fn user_frame(frames: &[Frame]) -> Option<&Frame> {
    frames
        .iter()
        .find(|f| f.is_python() && !f.is_torch())
        .or_else(|| frames.iter().find(|f| f.is_python()))
        .or_else(|| frames.first())
}
