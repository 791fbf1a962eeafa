//! The snapshot's records read as the pickle builds them
//! ([`super::pickle::Fold`]): a frame's dict as it goes into a list of
//! frames, that list as it goes into its record, a block's dict as it
//! goes into its segment's list, a segment's as it goes into the
//! snapshot's, an entry as it is appended to its device's trace. Only what
//! reads cleanly is folded, and a block or a segment only where the file
//! writes it out (not shared through its memo: a shared one is copied, as
//! the decoder counts); the rest stays as the pickle built it, and the
//! decoder says what is wrong with it where it reads it.

use super::decode::{block, frame, segment, trace_entry, Budget, MAX_BLOCKS, MAX_SEGMENTS};
use super::format::{Frame, Segment, TraceEntry};
use super::intern::Interner;
use super::pickle::{unique, Fold, Value};
use super::Records;
use crate::error::Unexpected;
use std::cell::RefCell;
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
    /// The records read from what the file writes out, as [`Records`]
    /// counts them (their trace entries counted by the machine).
    records: Records,
}

impl Folder {
    pub fn new(stacks: Interner) -> Folder {
        Folder {
            b: Budget::unlimited(stacks),
            shared: HashMap::new(),
            records: Records::default(),
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
            let python = |i: usize| matches!(&items[i], Value::Frame(f) if super::frame::is_python_file(&f.filename));
            let frames: Option<Vec<Frame>> = (super::frame::kept_frames(items.len(), python))
                .into_iter()
                .map(|i| match &items[i] {
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

    /// `v` read as a block or a segment when it is the dict of one that
    /// the file writes out, with its blocks read already.
    fn record(&mut self, v: &Value) -> Option<Value> {
        let Value::Dict(d) = v else { return None };
        if !unique(v) {
            return None;
        }
        let (is_block, is_segment) = {
            let pairs = d.borrow();
            let has =
                |key: &str| (pairs.iter()).any(|(k, _)| matches!(k, Value::Str(s) if &**s == key));
            (
                has("state") && has("size") && !has("action"),
                has("total_size") && has("blocks"),
            )
        };
        if is_block && self.records.blocks < MAX_BLOCKS {
            let b = block(v, &self.b).ok()?;
            self.records.blocks += 1;
            return Some(Value::Block(Rc::new(b)));
        }
        if is_segment && self.records.segments < MAX_SEGMENTS && self.blocks_read(d) {
            let s: Segment = segment(v, &self.b).ok()?;
            self.records.segments += 1;
            return Some(Value::Segment(Rc::new(RefCell::new(s))));
        }
        None
    }

    /// Whether every item of a segment's `blocks` is a block read (held
    /// there alone).
    fn blocks_read(&self, d: &RefCell<Vec<(Value, Value)>>) -> bool {
        let pairs = d.borrow();
        let blocks = (pairs.iter()).find(|(k, _)| matches!(k, Value::Str(s) if &**s == "blocks"));
        match blocks {
            Some((_, Value::List(l))) => (l.borrow().iter())
                .all(|b| matches!(b, Value::Block(b) if Rc::strong_count(b) == 1)),
            _ => false,
        }
    }
}

impl Fold for Folder {
    fn item(&mut self, v: Value) -> Value {
        if let Some(f) = self.frame(&v) {
            return Value::Frame(f);
        }
        if let Some(r) = self.record(&v) {
            return r;
        }
        self.stack(&v).unwrap_or(v)
    }

    fn entry(&mut self, v: &Value) -> Option<Result<TraceEntry, Unexpected>> {
        let Value::Dict(d) = v else { return None };
        let looks =
            (d.borrow().iter()).any(|(k, _)| matches!(k, Value::Str(s) if &**s == "action"));
        looks.then(|| trace_entry(v, &self.b))
    }

    fn held(&self) -> usize {
        self.b.stacks.borrow().bytes + self.shared.len() * 64 + self.records.folded_bytes()
    }

    fn records(&self) -> Records {
        self.records
    }

    fn entries(&mut self, read: usize, dropped: usize) {
        let events = &mut self.records.events;
        *events = (*events + read).saturating_sub(dropped);
    }
}
