//! The stack frames of a snapshot, held once: each file name and function
//! name one shared string, each distinct stack one shared list. A
//! recording of millions of events made at a few hundred places holds a
//! few hundred stacks.

use super::format::{Frame, Stack, MAX_FRAMES};
use std::collections::HashSet;
use std::sync::Arc;

pub struct Interner {
    strings: HashSet<Arc<str>>,
    stacks: HashSet<Stack>,
    /// Frames new stacks may still hold; a stack made past it is cut.
    frames_left: usize,
    /// Bytes held by the strings and stacks.
    pub bytes: usize,
}

/// Bytes a table entry takes besides what it points to.
const ENTRY: usize = 32;

impl Interner {
    pub fn new(frames: usize) -> Interner {
        Interner {
            strings: HashSet::new(),
            stacks: HashSet::new(),
            frames_left: frames,
            bytes: 0,
        }
    }

    pub fn string(&mut self, s: &str) -> Arc<str> {
        if let Some(held) = self.strings.get(s) {
            return held.clone();
        }
        let held: Arc<str> = s.into();
        self.bytes += ENTRY + s.len();
        self.strings.insert(held.clone());
        held
    }

    /// The stack of the first [`MAX_FRAMES`] of `frames`.
    pub fn stack(&mut self, mut frames: Vec<Frame>) -> Stack {
        frames.truncate(MAX_FRAMES);
        if let Some(held) = self.stacks.get(frames.as_slice()) {
            return held.clone();
        }
        frames.truncate(self.frames_left);
        self.frames_left -= frames.len();
        self.bytes += ENTRY + frames.len() * std::mem::size_of::<Frame>();
        let stack: Stack = frames.into();
        self.stacks.insert(stack.clone());
        stack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(i: &mut Interner, line: i64) -> Frame {
        Frame {
            filename: i.string("train.py"),
            line,
            name: i.string("step"),
        }
    }

    #[test]
    fn equal_stacks_and_strings_are_held_once() {
        let mut i = Interner::new(100);
        let a = vec![frame(&mut i, 1), frame(&mut i, 2)];
        let (s, t) = (i.stack(a.clone()), i.stack(a));
        assert!(Arc::ptr_eq(&s, &t));
        assert!(Arc::ptr_eq(&s[0].filename, &t[1].filename));
        let bytes = i.bytes;
        let three = frame(&mut i, 3);
        let u = i.stack(vec![three]);
        assert_eq!(u.len(), 1);
        assert!(i.bytes > bytes);
    }

    #[test]
    fn stacks_past_the_budget_are_cut() {
        let mut i = Interner::new(3);
        let long: Vec<Frame> = (0..MAX_FRAMES as i64 + 5)
            .map(|l| frame(&mut i, l))
            .collect();
        assert_eq!(i.stack(long).len(), 3);
        let other = frame(&mut i, 99);
        assert_eq!(i.stack(vec![other]).len(), 0);
    }
}
