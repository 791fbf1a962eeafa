//! A pickle reader for data only: the opcodes of protocols 2 to 5 that
//! build None, booleans, integers, floats, strings, bytes, lists, tuples,
//! dicts and sets, with the memo shared as CPython shares it (a value
//! referenced twice is one value). Any opcode that would name a Python
//! class or call a function (`GLOBAL`, `REDUCE`, `BUILD`, `NEWOBJ`, …) is
//! an error: nothing in a file is ever run.
//!
//! The result is a tree of [`Value`]s (JSON is read into the same tree),
//! which `decode` reads into the snapshot's types. What it holds stays
//! within a bound stated in the records it holds (below), whatever the file:
//! - a first pass ([`fetched`]) finds the memo entries the pickle ever
//!   fetches back, and only those are kept (Python's pickler memoizes every
//!   list and dict; a snapshot fetches back its keys, strings and frames);
//! - values are folded into the snapshot's own smaller forms as they go
//!   into their containers ([`Fold`]): a frame's dict into a [`Frame`], a
//!   list of frames into a shared [`Stack`], and the entries appended to a
//!   list into a [`Trace`] of [`TraceEntry`]s;
//!   and a block's and a segment's dicts into a [`Block`] and a
//!   [`Segment`] ([`Fold::item`]);
//! - the bytes held are counted as they are made, and past the limit the
//!   file is refused. The limit is twice the file and [`FLOOR`] for the
//!   pickle's own values, and beside them each record the file writes out
//!   in the form it is kept ([`super::Records`]): a snapshot's records are
//!   what it is made of, and their count, not the file's bytes, is what
//!   they take.

mod machine;
mod scan;

use super::format::{Block, Frame, Segment, Stack, TraceEntry};
use super::trace::Trace;
use crate::error::{Malformed, Unexpected};
pub(super) use machine::{Held, Machine};
use scan::{fetched, Ids, Reader};
pub(super) use scan::{Scan, TRUNCATED};
use std::cell::RefCell;
use std::rc::Rc;

/// Bytes any file may take beyond twice its size (the reader's own tables;
/// small files).
pub const FLOOR: usize = 2 << 20;

/// What a file of `len` bytes may hold while it is read and decoded, its
/// records (written out, not shared through the memo) taking `records`
/// bytes in the form they are kept.
pub fn limit(len: usize, records: usize) -> usize {
    let bound = (len.saturating_mul(2))
        .saturating_add(FLOOR)
        .saturating_add(records);
    room_beside(len).map_or(bound, |room| bound.min(room))
}

/// In the page, what wasm32's 4 GiB leave the reading beside the file
/// (read whole there when it is JSON; a pickle streams): 3 GiB the two
/// share, the rest is the replay's.
#[cfg(target_arch = "wasm32")]
fn room_beside(len: usize) -> Option<usize> {
    Some((3usize << 30).saturating_sub(len))
}

#[cfg(not(target_arch = "wasm32"))]
fn room_beside(_: usize) -> Option<usize> {
    None
}

/// What the machine leaves of the limit for what its count of bytes
/// misses (small allocations it does not see).
const SLACK: usize = 64 << 10;

#[derive(Clone, Debug)]
pub enum Value {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(Rc<str>),
    /// Bytes (no field of a snapshot holds any: only their kind is kept).
    Bytes,
    /// Lists, tuples and sets (built in place after being memoized).
    List(Rc<RefCell<Vec<Value>>>),
    Dict(Rc<RefCell<Vec<(Value, Value)>>>),
    Mark,
    /// A stack frame's dict, read.
    Frame(Rc<Frame>),
    /// A list of stack frames, read (at most `MAX_FRAMES`).
    Stack(Stack),
    /// A list whose items were trace entries, read.
    Trace(Rc<RefCell<Entries>>),
    /// A block's dict, read.
    Block(Rc<Block>),
    /// A segment's dict with its blocks, read (taken by the decoder).
    Segment(Rc<RefCell<Segment>>),
}

/// A list of trace entries read as they were appended, or the reason the
/// first that could not be read gave (the list is then no trace: the
/// decoder says so where it expects one).
#[derive(Debug, Default)]
pub struct Entries {
    pub trace: Trace,
    pub error: Option<Unexpected>,
}

/// What the reader folds values into as they are built.
pub trait Fold {
    /// `v` as it goes into a container: a frame's dict as a
    /// [`Value::Frame`], a list of them as a [`Value::Stack`], a block's
    /// and a segment's dicts as a [`Value::Block`] and a
    /// [`Value::Segment`]; anything else as it is.
    fn item(&mut self, v: Value) -> Value;
    /// `v` read as a trace entry; `None` when it does not look like one.
    fn entry(&mut self, v: &Value) -> Option<Result<TraceEntry, Unexpected>>;
    /// Bytes held by the frames, stacks and records it made.
    fn held(&self) -> usize;
    /// The records it made from what the file wrote out (not shared
    /// through the memo): beside the file's own limit.
    fn records(&self) -> super::Records;
    /// Trace entries the file wrote out, read (`read`), and let go of
    /// with a trace that turned out to be none (`dropped`).
    fn entries(&mut self, read: usize, dropped: usize);
}

impl<F: Fold> Fold for &mut F {
    fn item(&mut self, v: Value) -> Value {
        (**self).item(v)
    }
    fn entry(&mut self, v: &Value) -> Option<Result<TraceEntry, Unexpected>> {
        (**self).entry(v)
    }
    fn held(&self) -> usize {
        (**self).held()
    }
    fn records(&self) -> super::Records {
        (**self).records()
    }
    fn entries(&mut self, read: usize, dropped: usize) {
        (**self).entries(read, dropped)
    }
}

pub(super) const SLOT: usize = std::mem::size_of::<Value>();

const HEADER: usize = 64;

/// Bytes a value holds besides its slot: a container's header and the
/// slots it has reserved, a string's text. Shallow: what it contains is
/// counted as it is made.
fn cost(v: &Value) -> usize {
    match v {
        Value::Str(s) => HEADER / 2 + s.len(),
        Value::List(l) => HEADER + l.borrow().capacity() * SLOT,
        Value::Dict(d) => HEADER + d.borrow().capacity() * 2 * SLOT,
        Value::Trace(t) => HEADER + t.borrow().trace.bytes(),
        Value::Frame(_) => HEADER,
        _ => 0,
    }
}

/// Bytes dropping `v` frees: its own, and those of the strings, frames
/// and containers it alone holds (a record's, as it is folded: a
/// segment's list of blocks and its pool's id).
fn freed(v: &Value) -> usize {
    let alone = |v: &Value| match v {
        Value::Str(s) if Rc::strong_count(s) == 1 => cost(v),
        Value::Frame(f) if Rc::strong_count(f) == 1 => HEADER,
        Value::List(_) | Value::Dict(_) if unique(v) => cost(v),
        _ => 0,
    };
    cost(v)
        + match v {
            Value::List(l) => l.borrow().iter().map(alone).sum(),
            Value::Dict(d) => d.borrow().iter().map(|(k, v)| alone(k) + alone(v)).sum(),
            _ => 0,
        }
}

/// Whether `v` is held only where it is now (folding it frees it).
pub(super) fn unique(v: &Value) -> bool {
    match v {
        Value::List(l) => Rc::strong_count(l) == 1,
        Value::Dict(d) => Rc::strong_count(d) == 1,
        _ => false,
    }
}

/// Runs a pickle's opcodes, folding with `fold`; the value it builds and
/// the bytes it held. With the `teardown` feature (on everywhere, the page
/// too) whatever else it built is taken apart without recursion (a pickle
/// can nest a value as deep as it has opcodes: a million one-item tuples
/// in 1 MB), and the caller drops the value it gets the same way.
pub fn read<F: Fold>(input: &[u8], fold: F) -> Result<(Value, Held), Malformed> {
    let mut m = Machine::new(Reader::whole(input), input.len(), fetched(input)?, fold);
    let top = m.run();
    m.finish(top)
}

/// The second pass's machine over a pickle of `len` bytes that arrives a
/// chunk at a time ([`Machine::feed`]), keeping the memo entries `ids`
/// (the first pass's, [`Scan`]) names.
pub(super) fn streaming<F: Fold>(len: usize, ids: Ids, fold: F) -> Machine<'static, F> {
    Machine::new(Reader::stream(), len, ids, fold)
}

/// Drops `values` one container at a time: each that held the last
/// reference to a list or dict gives up its items here, so no value's
/// depth reaches the stack.
#[cfg(feature = "teardown")]
pub fn tear_down(mut values: Vec<Value>) {
    while let Some(v) = values.pop() {
        match v {
            Value::List(rc) => {
                if let Some(items) = Rc::into_inner(rc) {
                    values.extend(items.into_inner());
                }
            }
            Value::Dict(rc) => {
                if let Some(pairs) = Rc::into_inner(rc) {
                    for (k, v) in pairs.into_inner() {
                        values.push(k);
                        values.push(v);
                    }
                }
            }
            _ => {}
        }
    }
}

/// JSON as the same tree a pickle builds.
pub fn from_json(json: serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match json {
        Json::Null => Value::None,
        Json::Bool(b) => Value::Bool(b),
        Json::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Value::Int(u.into()),
            (_, Some(i)) => Value::Int(i.into()),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::Str(s.into()),
        Json::Array(items) => list(items.into_iter().map(from_json).collect()),
        Json::Object(fields) => Value::Dict(Rc::new(RefCell::new(
            fields
                .into_iter()
                .map(|(k, v)| (Value::Str(k.into()), from_json(v)))
                .collect(),
        ))),
    }
}

pub(super) fn list(items: Vec<Value>) -> Value {
    Value::List(Rc::new(RefCell::new(items)))
}

/// Why `v` is not a trace entry, as the decoder would say it.
fn not_an_entry(v: &Value) -> Unexpected {
    Unexpected(format!(
        "invalid type: {}, expected a dict (a trace entry)",
        kind(v)
    ))
}

/// What a value is, in words.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::None | Value::Mark => "None",
        Value::Bool(_) => "a boolean",
        Value::Int(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Str(_) => "a string",
        Value::Bytes => "bytes",
        Value::List(_) | Value::Stack(_) | Value::Trace(_) => "a list",
        Value::Dict(_) | Value::Frame(_) => "a dict",
        Value::Block(_) => "a block's dict",
        Value::Segment(_) => "a segment's dict",
    }
}

fn pairs(items: Vec<Value>) -> Result<Vec<(Value, Value)>, Malformed> {
    if items.len() % 2 != 0 {
        #[cfg(feature = "teardown")]
        tear_down(items);
        return Err("a dict in the pickle has a key without a value".into());
    }
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}
