//! The snapshot's records read as the pickle builds them
//! ([`super::pickle::Fold`]): a frame's dict as it goes into a list of
//! frames, that list as it goes into its record, an entry as it is
//! appended to its device's trace. Only what reads cleanly is folded; the
//! rest stays as the pickle built it, and the decoder says what is wrong
//! with it where it reads it.

use super::decode::{frame, trace_entry, Budget};
use super::format::{Frame, TraceEntry};
use super::intern::Interner;
use super::pickle::{Fold, Value};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

pub struct Folder {
    b: Budget,
    /// Frames read from dicts the pickle shares through its memo, by the
    /// dict (it stays in the memo: its address is its own).
    shared: HashMap<usize, Rc<Frame>>,
    /// Lists of frames the pickle shares, each emptied but for its stack
    /// when first read (the memo holds the list; its frames are held once,
    /// in the stack).
    stacks: HashSet<usize>,
}

impl Folder {
    pub fn new(stacks: Interner) -> Folder {
        Folder {
            b: Budget::unlimited(stacks),
            shared: HashMap::new(),
            stacks: HashSet::new(),
        }
    }

    pub fn into_stacks(self) -> Interner {
        self.b.into_stacks()
    }

    /// `v` read as a frame when it is a dict of a frame's three fields.
    fn frame(&mut self, v: &Value) -> Option<Rc<Frame>> {
        let Value::Dict(d) = v else { return None };
        let is_frame = {
            let pairs = d.borrow();
            pairs.len() == 3
                && ["filename", "line", "name"].iter().all(|key| {
                    (pairs.iter()).any(|(k, _)| matches!(k, Value::Str(s) if &**s == *key))
                })
        };
        if !is_frame {
            return None;
        }
        let at = Rc::as_ptr(d) as usize;
        if let Some(f) = self.shared.get(&at) {
            return Some(f.clone());
        }
        let f = Rc::new(frame(v, &self.b.stacks).ok()?);
        if Rc::strong_count(d) > 1 {
            self.shared.insert(at, f.clone());
        }
        Some(f)
    }

    /// `v` read as a stack when it is a list of frames.
    fn stack(&mut self, v: &Value) -> Option<Value> {
        let Value::List(l) = v else { return None };
        let at = Rc::as_ptr(l) as usize;
        if self.stacks.contains(&at) {
            return match l.borrow().as_slice() {
                [Value::Stack(s)] => Some(Value::Stack(s.clone())),
                _ => None,
            };
        }
        let stack = {
            let items = l.borrow();
            let frames: Option<Vec<Frame>> = (items.iter())
                .take(super::format::MAX_FRAMES)
                .map(|f| match f {
                    Value::Frame(f) => Some(Frame::clone(f)),
                    _ => None,
                })
                .collect();
            match frames {
                Some(frames) if !items.is_empty() => self.b.stack(frames).ok()?,
                _ => return None,
            }
        };
        if Rc::strong_count(l) > 1 {
            *l.borrow_mut() = vec![Value::Stack(stack.clone())];
            self.stacks.insert(at);
        }
        Some(Value::Stack(stack))
    }
}

impl Fold for Folder {
    fn item(&mut self, v: Value) -> Value {
        if let Some(f) = self.frame(&v) {
            return Value::Frame(f);
        }
        self.stack(&v).unwrap_or(v)
    }

    fn entry(&mut self, v: &Value) -> Option<Result<TraceEntry, String>> {
        let Value::Dict(d) = v else { return None };
        let looks =
            (d.borrow().iter()).any(|(k, _)| matches!(k, Value::Str(s) if &**s == "action"));
        looks.then(|| trace_entry(v, &self.b))
    }

    fn held(&self) -> usize {
        self.b.stacks.borrow().bytes + (self.shared.len() + self.stacks.len()) * 64
    }
}
