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
use std::collections::HashMap;
use std::rc::Rc;

pub struct Folder {
    b: Budget,
    /// What dicts and lists the pickle shares through its memo were read
    /// as, by their address (they stay in the memo: the address is their
    /// own): a frame's dict as its `Value::Frame`, a list of frames as its
    /// `Value::Stack` (the list emptied: its frames are held once, in the
    /// stack).
    shared: HashMap<usize, Value>,
}

impl Folder {
    pub fn new(stacks: Interner) -> Folder {
        Folder {
            b: Budget::unlimited(stacks),
            shared: HashMap::new(),
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
        if let Some(Value::Frame(f)) = self.shared.get(&at) {
            return Some(f.clone());
        }
        let f = Rc::new(frame(v, &self.b.stacks).ok()?);
        if Rc::strong_count(d) > 1 {
            self.shared.insert(at, Value::Frame(f.clone()));
        }
        Some(f)
    }

    /// `v` read as a stack when it is a list of frames.
    fn stack(&mut self, v: &Value) -> Option<Value> {
        let Value::List(l) = v else { return None };
        let at = Rc::as_ptr(l) as usize;
        if let Some(stack) = self.shared.get(&at) {
            // Unless the pickle appended to it since.
            return (l.borrow().len() == 1).then(|| stack.clone());
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
            self.shared.insert(at, Value::Stack(stack.clone()));
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
        self.b.stacks.borrow().bytes + self.shared.len() * 64
    }
}
