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
        is_python_file(&self.filename)
    }

    fn is_torch(&self) -> bool {
        self.filename.contains("/torch/") || self.filename.starts_with("torch/")
    }
}

/// Which of a stack's `n` frames are kept, innermost first: all of them
/// when they are at most [`MAX_FRAMES`]; else its Python frames first (a
/// recording with C++ frames has dozens of them inside the user's line),
/// then the innermost others, [`MAX_FRAMES`] in all.
pub fn kept_frames(n: usize, is_python: impl Fn(usize) -> bool) -> Vec<usize> {
    if n <= MAX_FRAMES {
        return (0..n).collect();
    }
    let mut keep: Vec<usize> = (0..n).filter(|&i| is_python(i)).take(MAX_FRAMES).collect();
    let rest = MAX_FRAMES - keep.len();
    keep.extend((0..n).filter(|&i| !is_python(i)).take(rest));
    keep.sort_unstable();
    keep
}

/// A source file's name is a Python file's.
pub fn is_python_file(filename: &str) -> bool {
    filename.ends_with(".py")
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
