//! The snapshot's types read from the value tree a pickle (or JSON)
//! builds, field by field by the names `_snapshot()` gives them: a missing
//! field (or `None`) takes its default, a field vramlab does not use is
//! skipped, a value of the wrong kind is refused, saying where. By hand:
//! one small reader instead of serde's code for every type and reader.

use super::format::{
    Action, AllocatorSettings, Block, BlockState, Frame, MemorySnapshot, Segment, Stack, TraceEntry,
};
use super::frame::{is_python_file, kept_frames};
use super::intern::Interner;
use super::pickle::{kind, Held, Value};
use super::trace::{Trace, EVENT_BYTES};
use super::MAX_EVENTS;
use crate::error::Unexpected;
use std::cell::{Cell, Ref, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

/// The most blocks over all segments.
pub const MAX_BLOCKS: usize = 4_000_000;
/// The most segments over all devices (eight 192 GB GPUs in 2 MiB
/// segments hold 750,000).
pub const MAX_SEGMENTS: usize = 1_000_000;
/// The most stack frames kept over the whole snapshot; the frames of later
/// entries are dropped (a pickle may share one list of frames among every
/// entry: each copy costs memory the file does not).
pub const MAX_ALL_FRAMES: usize = 4_000_000;
/// The most fields a record may have (PyTorch writes at most a few dozen):
/// each field is looked up by name among them.
pub const MAX_FIELDS: usize = 256;

/// What decoding may still make: lists a pickle shares through its memo
/// would otherwise be copied as often as they are referenced.
pub(super) struct Budget {
    events: Cell<usize>,
    segments: Cell<usize>,
    blocks: Cell<usize>,
    /// Bytes the records made may still take.
    bytes: Cell<usize>,
    pub(super) stacks: RefCell<Interner>,
}

impl Budget {
    /// No limit but the frames `stacks` may hold (records read as a
    /// pickle is, counted by its reader).
    pub(super) fn unlimited(stacks: Interner) -> Budget {
        Budget {
            events: Cell::new(usize::MAX),
            segments: Cell::new(usize::MAX),
            blocks: Cell::new(usize::MAX),
            bytes: Cell::new(usize::MAX),
            stacks: RefCell::new(stacks),
        }
    }

    pub(super) fn into_stacks(self) -> Interner {
        self.stacks.into_inner()
    }

    /// `n` more records of `what` from `left`; refused once it is spent.
    fn count(&self, left: &Cell<usize>, n: usize, what: &str) -> Result<(), Unexpected> {
        let l = left.get().checked_sub(n).ok_or_else(|| more_than(what))?;
        left.set(l);
        Ok(())
    }

    /// `bytes` more made for `what`; refused once the file's share is
    /// spent.
    fn charge(&self, bytes: usize, what: &str) -> Result<(), Unexpected> {
        let b = self
            .bytes
            .get()
            .checked_sub(bytes)
            .ok_or_else(|| more_than(what))?;
        self.bytes.set(b);
        Ok(())
    }

    /// The stack of `frames`, its new bytes taken from the budget.
    pub(super) fn stack(&self, frames: Vec<Frame>) -> Result<Stack, Unexpected> {
        let mut stacks = self.stacks.borrow_mut();
        let before = stacks.bytes;
        let stack = stacks.stack(frames);
        let grown = stacks.bytes - before;
        self.charge(grown, "stack frames")?;
        Ok(stack)
    }
}

#[cold]
fn more_than(what: &str) -> Unexpected {
    Unexpected(format!(
        "the file holds more {what} than its size holds unshared"
    ))
}

/// How much a snapshot may decode to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub events: usize,
    pub segments: usize,
    pub blocks: usize,
    /// Stack frames in all; the frames of later records are dropped.
    pub frames: usize,
    /// Bytes the records made may take.
    pub bytes: usize,
}

impl Limits {
    /// For a tree that shares nothing (JSON): the absolute limits.
    pub const UNSHARED: Limits = Limits {
        events: MAX_EVENTS,
        segments: MAX_SEGMENTS,
        blocks: MAX_BLOCKS,
        frames: MAX_ALL_FRAMES,
        bytes: usize::MAX,
    };

    /// For a file of `bytes` whose reading held `held`: what it decodes
    /// to takes no more than the rest of its limit
    /// ([`super::pickle::limit`]: twice its size beside the records it
    /// wrote out), whatever its memo shares, less a margin for what
    /// decoding allocates besides (a few strings).
    pub fn for_file(bytes: usize, held: Held) -> Limits {
        const MARGIN: usize = 64 << 10;
        Limits {
            bytes: super::pickle::limit(bytes, held.records.bytes())
                .saturating_sub(held.bytes + MARGIN),
            ..Limits::UNSHARED
        }
    }
}

/// The snapshot at the top of the tree, within `limits` (each record
/// counted as it is made: past a limit, the file is refused), its frames
/// held by `stacks`.
pub fn snapshot(
    top: &Value,
    limits: Limits,
    stacks: Interner,
) -> Result<MemorySnapshot, Unexpected> {
    let f = Fields::of(top, "the snapshot")?;
    let b = Budget {
        events: Cell::new(limits.events),
        segments: Cell::new(limits.segments),
        blocks: Cell::new(limits.blocks),
        bytes: Cell::new(limits.bytes),
        stacks: RefCell::new(stacks),
    };
    Ok(MemorySnapshot {
        segments: f.list("segments", &b, |v| segment(v, &b))?,
        device_traces: f.list("device_traces", &b, |v| trace(v, &b))?,
        allocator_settings: f
            .get("allocator_settings")
            .map(allocator_settings)
            .transpose()?,
    })
}

/// A segment from its dict, or as the reader read it: taken where the
/// tree holds it alone, copied (its blocks counted) where it is shared.
pub(super) fn segment(v: &Value, b: &Budget) -> Result<Segment, Unexpected> {
    b.count(&b.segments, 1, "segments")?;
    if let Value::Segment(s) = v {
        let blocks = s.borrow().blocks.len();
        b.count(&b.blocks, blocks, "blocks")?;
        if Rc::strong_count(s) == 1 {
            return Ok(std::mem::take(&mut *s.borrow_mut()));
        }
        b.charge(
            blocks.saturating_mul(std::mem::size_of::<Block>()),
            "blocks",
        )?;
        return Ok(s.borrow().clone());
    }
    let f = Fields::of(v, "a segment")?;
    let pool = f.list("segment_pool_id", b, |v| int(v, "a segment's pool id"))?;
    let (address, total_size) = in_memory(f.int("address")?, f.int("total_size")?, "a segment")?;
    Ok(Segment {
        device: u32::try_from(f.int_or("device", 0)?).map_err(|_| f.out_of_range("device"))?,
        address,
        total_size,
        allocated_size: f.int_or("allocated_size", 0)?,
        active_size: f.int_or("active_size", 0)?,
        requested_size: f.int_or("requested_size", 0)?,
        stream: f.int_or("stream", 0)?,
        segment_type: f.string_or("segment_type", "large")?,
        segment_pool_id: (
            pool.first().copied().unwrap_or(0),
            pool.get(1).copied().unwrap_or(0),
        ),
        is_expandable: f.bool_or("is_expandable", false)?,
        blocks: f.list("blocks", b, |v| block(v, b))?,
        frames: f.frames(b)?,
    })
}

/// A block from its dict, or as the reader read it.
pub(super) fn block(v: &Value, b: &Budget) -> Result<Block, Unexpected> {
    b.count(&b.blocks, 1, "blocks")?;
    if let Value::Block(block) = v {
        return Ok(Block::clone(block));
    }
    let f = Fields::of(v, "a block")?;
    let state = match f.get("state") {
        None => return Err(f.missing("state")),
        Some(s) => match text(s, "a block's state")?.as_str() {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            other => return Err(format!(
                "unknown block state '{other}' (expected active_allocated, active_pending_free or inactive)"
            ).into()),
        },
    };
    let (address, size) = in_memory(f.int("address")?, f.int("size")?, "a block")?;
    Ok(Block {
        address,
        size,
        requested_size: f.int_or("requested_size", 0)?,
        state,
        frames: f.frames(b)?,
    })
}

/// An address and a size whose range ends inside the 64-bit address
/// space (a range that wraps past 2^64 is no memory a device has).
fn in_memory(address: u64, size: u64, what: &str) -> Result<(u64, u64), Unexpected> {
    match address.checked_add(size) {
        Some(_) => Ok((address, size)),
        None => Err(format!(
            "{what} at address {address} of {size} bytes runs past the end of the address space"
        )
        .into()),
    }
}

/// A device's trace: its entries read as the pickle was (moved, not
/// copied), or each read here.
fn trace(v: &Value, b: &Budget) -> Result<Trace, Unexpected> {
    if let Value::Trace(t) = v {
        // A list of entries the pickle shares (one device's trace given
        // to several) is no recording PyTorch writes.
        if Rc::strong_count(t) > 1 {
            return Err("the file holds more events than its size holds unshared".into());
        }
        let mut t = t.borrow_mut();
        if let Some(e) = &t.error {
            return Err(e.clone());
        }
        b.count(&b.events, t.trace.len(), "events")?;
        return Ok(std::mem::take(&mut t.trace));
    }
    let entries = items(v, "a device trace")?;
    b.count(&b.events, entries.len(), "events")?;
    b.charge(entries.len().saturating_mul(EVENT_BYTES), "events")?;
    let mut trace = Trace::default();
    trace.reserve_exact(entries.len());
    for e in entries.iter() {
        trace.push(trace_entry(e, b)?)?;
    }
    Ok(trace)
}

/// A trace entry read from its dict (uncounted: see [`trace`]).
pub(super) fn trace_entry(v: &Value, b: &Budget) -> Result<TraceEntry, Unexpected> {
    let f = Fields::of(v, "a trace entry")?;
    let action = match f.get("action") {
        Some(a) => Action::from_name(text(a, "a trace entry's action")?),
        None => return Err(f.missing("action")),
    };
    let (addr, size) = in_memory(f.int_or("addr", 0)?, f.int_or("size", 0)?, "a trace entry")?;
    Ok(TraceEntry {
        action,
        addr,
        size,
        stream: f.int_or("stream", 0)?,
        device_free: f
            .get("device_free")
            .map(|v| int(v, "device_free"))
            .transpose()?,
        time_us: f.get("time_us").map(|v| signed(v, "time_us")).transpose()?,
        frames: f.frames(b)?,
    })
}

/// A stack frame read from its dict, its strings held by `stacks`.
pub(super) fn frame(v: &Value, stacks: &RefCell<Interner>) -> Result<Frame, Unexpected> {
    if let Value::Frame(f) = v {
        return Ok(Frame::clone(f));
    }
    let f = Fields::of(v, "a stack frame")?;
    let (filename, name) = (f.string_or("filename", "")?, f.string_or("name", "")?);
    let mut stacks = stacks.borrow_mut();
    Ok(Frame {
        filename: stacks.string(&filename),
        line: f.get("line").map_or(Ok(0), line)?,
        name: stacks.string(&name),
    })
}

fn allocator_settings(v: &Value) -> Result<AllocatorSettings, Unexpected> {
    let f = Fields::of(v, "the allocator settings")?;
    let mut divisions = BTreeMap::new();
    if let Some(d) = f.get("roundup_power2_divisions") {
        let d = Fields::of(d, "roundup_power2_divisions")?;
        for (key, value) in d.pairs.iter() {
            let interval = text(key, "a roundup_power2_divisions interval")?;
            divisions.insert(interval, int(value, "roundup_power2_divisions")?);
        }
    }
    Ok(AllocatorSettings {
        alloc_conf: f.string_or("PYTORCH_CUDA_ALLOC_CONF", "")?,
        max_split_size: f
            .get("max_split_size")
            .map_or(Ok(-1), |v| signed(v, "max_split_size"))?,
        garbage_collection_threshold: match f.get("garbage_collection_threshold") {
            None => 0.0,
            Some(Value::Float(x)) => *x,
            Some(Value::Int(i)) => *i as f64,
            Some(other) => return Err(invalid(other, "a number", "garbage_collection_threshold")),
        },
        expandable_segments: f.bool_or("expandable_segments", false)?,
        roundup_power2_divisions: divisions,
    })
}

#[cold]
#[inline(never)]
fn too_wide(what: &str, fields: usize) -> Unexpected {
    Unexpected(format!(
        "{what} has {fields} fields; a snapshot's records have at most {MAX_FIELDS}"
    ))
}

fn invalid(v: &Value, expected: &str, at: &str) -> Unexpected {
    Unexpected(format!(
        "invalid type: {}, expected {expected} ({at})",
        kind(v)
    ))
}

fn int(v: &Value, at: &str) -> Result<u64, Unexpected> {
    match v {
        Value::Int(i) => {
            u64::try_from(*i).map_err(|_| format!("the integer {i} is out of range ({at})").into())
        }
        _ => Err(invalid(v, "a non-negative integer", at)),
    }
}

fn signed(v: &Value, at: &str) -> Result<i64, Unexpected> {
    match v {
        Value::Int(i) => {
            i64::try_from(*i).map_err(|_| format!("the integer {i} is out of range ({at})").into())
        }
        _ => Err(invalid(v, "an integer", at)),
    }
}

/// A frame's line. PyTorch writes an unknown line as an unsigned 64-bit
/// -1 (18446744073709551615): read as the -1 it stands for, as any value
/// from 2^63 on is read as its 64-bit pattern.
fn line(v: &Value) -> Result<i64, Unexpected> {
    match v {
        Value::Int(i) if (i64::MAX as i128 + 1..=u64::MAX as i128).contains(i) => {
            Ok(*i as u64 as i64)
        }
        v => signed(v, "a frame's line"),
    }
}

fn text(v: &Value, at: &str) -> Result<String, Unexpected> {
    match v {
        Value::Str(s) => Ok(s.to_string()),
        _ => Err(invalid(v, "a string", at)),
    }
}

/// Each item read by `read` (a loop: less code than collecting `Result`s),
/// their bytes taken from the budget first.
fn each<T>(
    (list, what): (&[Value], &str),
    b: &Budget,
    read: impl Fn(&Value) -> Result<T, Unexpected>,
) -> Result<Vec<T>, Unexpected> {
    let n = list.len();
    b.charge(n.saturating_mul(std::mem::size_of::<T>()), what)?;
    let mut out = Vec::with_capacity(list.len());
    for v in list {
        out.push(read(v)?);
    }
    Ok(out)
}

/// Whether `v` is a frame of a Python source file (read without reading
/// the frame).
fn python_frame(v: &Value) -> bool {
    match v {
        Value::Frame(f) => is_python_file(&f.filename),
        Value::Dict(d) => (d.borrow().iter()).any(|(k, v)| {
            matches!((k, v), (Value::Str(k), Value::Str(f)) if &**k == "filename" && is_python_file(f))
        }),
        _ => false,
    }
}

/// A list's items, or a stack's frames as items.
enum Items<'a> {
    List(Ref<'a, Vec<Value>>),
    Frames(Vec<Value>),
}

impl std::ops::Deref for Items<'_> {
    type Target = [Value];
    fn deref(&self) -> &[Value] {
        match self {
            Items::List(l) => l,
            Items::Frames(f) => f,
        }
    }
}

fn items<'a>(v: &'a Value, at: &str) -> Result<Items<'a>, Unexpected> {
    match v {
        Value::List(l) => Ok(Items::List(l.borrow())),
        Value::Stack(s) => Ok(Items::Frames(
            s.iter().map(|f| Value::Frame(Rc::new(f.clone()))).collect(),
        )),
        _ => Err(invalid(v, "a list", at)),
    }
}

/// A dict's pairs, or a frame's fields as pairs.
enum Pairs<'a> {
    Dict(Ref<'a, Vec<(Value, Value)>>),
    Frame(Vec<(Value, Value)>),
}

impl std::ops::Deref for Pairs<'_> {
    type Target = [(Value, Value)];
    fn deref(&self) -> &[(Value, Value)] {
        match self {
            Pairs::Dict(d) => d,
            Pairs::Frame(f) => f,
        }
    }
}

/// A frame's fields as its dict had them.
fn frame_pairs(f: &Frame) -> Vec<(Value, Value)> {
    let key = |k: &str| Value::Str(k.into());
    vec![
        (key("filename"), Value::Str((*f.filename).into())),
        (key("line"), Value::Int(f.line.into())),
        (key("name"), Value::Str((*f.name).into())),
    ]
}

/// A dict's fields, looked up by name.
struct Fields<'a> {
    pairs: Pairs<'a>,
    what: &'static str,
}

impl<'a> Fields<'a> {
    fn of(v: &'a Value, what: &'static str) -> Result<Self, Unexpected> {
        let pairs = match v {
            Value::Dict(d) => Pairs::Dict(d.borrow()),
            Value::Frame(f) => Pairs::Frame(frame_pairs(f)),
            _ => return Err(invalid(v, "a dict", what)),
        };
        match pairs.len() > MAX_FIELDS {
            true => Err(too_wide(what, pairs.len())),
            false => Ok(Fields { pairs, what }),
        }
    }

    /// The field `key`, unless it is missing or `None`.
    fn get(&self, key: &str) -> Option<&Value> {
        self.pairs
            .iter()
            .find(|(k, _)| matches!(k, Value::Str(s) if &**s == key))
            .map(|(_, v)| v)
            .filter(|v| !matches!(v, Value::None))
    }

    fn at(&self, key: &str) -> String {
        format!("`{key}` of {}", self.what)
    }

    fn missing(&self, key: &str) -> Unexpected {
        Unexpected(format!("missing field `{key}` in {}", self.what))
    }

    fn out_of_range(&self, key: &str) -> String {
        format!("{} is out of range", self.at(key))
    }

    fn int(&self, key: &str) -> Result<u64, Unexpected> {
        self.get(key)
            .map_or_else(|| Err(self.missing(key)), |v| int(v, &self.at(key)))
    }

    fn int_or(&self, key: &str, default: u64) -> Result<u64, Unexpected> {
        self.get(key).map_or(Ok(default), |v| int(v, &self.at(key)))
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, Unexpected> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(invalid(v, "a boolean", &self.at(key))),
        }
    }

    fn string_or(&self, key: &str, default: &str) -> Result<String, Unexpected> {
        self.get(key)
            .map_or_else(|| Ok(default.to_string()), |v| text(v, &self.at(key)))
    }

    /// The list `key` (none when missing), each item read by `read`.
    fn list<T>(
        &self,
        key: &str,
        b: &Budget,
        read: impl Fn(&Value) -> Result<T, Unexpected>,
    ) -> Result<Vec<T>, Unexpected> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(v) => each((&items(v, &self.at(key))?, key), b, read),
        }
    }

    /// [`MAX_FRAMES`] of the stack frames (`kept_frames`), innermost first,
    /// while the snapshot's [`MAX_ALL_FRAMES`] last (a stack held once
    /// however often it is used).
    fn frames(&self, b: &Budget) -> Result<Stack, Unexpected> {
        match self.get("frames") {
            None => Ok(Stack::default()),
            Some(Value::Stack(s)) => Ok(s.clone()),
            Some(v) => {
                let all = items(v, &self.at("frames"))?;
                let kept = kept_frames(all.len(), |i| python_frame(&all[i]));
                let size = std::mem::size_of::<Frame>();
                b.charge(kept.len().saturating_mul(size), "stack frames")?;
                let frames = (kept.iter())
                    .map(|&i| frame(&all[i], &b.stacks))
                    .collect::<Result<Vec<_>, _>>()?;
                b.stack(frames)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pickle::from_json;
    use super::*;
    use crate::format::{user_frame, MAX_FRAMES};
    use serde_json::json;

    fn read(v: serde_json::Value) -> Result<MemorySnapshot, Unexpected> {
        snapshot(
            &from_json(v),
            Limits::UNSHARED,
            Interner::new(MAX_ALL_FRAMES),
        )
    }

    #[test]
    fn missing_fields_and_none_take_their_defaults() {
        let s = read(json!({"segments": [{"address": 4096, "total_size": 2097152,
            "stream": null, "blocks": [{"address": 4096, "size": 512, "state": "active_allocated"}]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 512}, {"action": "new_thing"}]]}))
        .unwrap();
        let seg = &s.segments[0];
        assert_eq!(
            (seg.device, seg.stream, seg.segment_type.as_str()),
            (0, 0, "large")
        );
        assert_eq!(
            (seg.segment_pool_id, seg.is_expandable, seg.allocated_size),
            ((0, 0), false, 0)
        );
        assert_eq!(seg.blocks[0].state, BlockState::ActiveAllocated);
        assert_eq!(seg.blocks[0].requested_size, 0);
        assert_eq!(s.device_traces[0].action(0), Action::Alloc);
        assert_eq!(
            s.device_traces[0].action(1),
            Action::Other("new_thing".into())
        );
        assert_eq!(s.device_traces[0].get(1).unwrap().device_free, None);
        assert_eq!(s.allocator_settings, None);
    }

    #[test]
    fn settings_and_pool_ids_are_read() {
        let s = read(
            json!({"segments": [{"address": 0, "total_size": 1, "segment_pool_id": [1, 2]}],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                "garbage_collection_threshold": 1, "roundup_power2_divisions": {"1": 4}}}),
        )
        .unwrap();
        assert_eq!(s.segments[0].segment_pool_id, (1, 2));
        let a = s.allocator_settings.unwrap();
        assert_eq!(
            (a.alloc_conf.as_str(), a.max_split_size),
            ("expandable_segments:True", -1)
        );
        assert_eq!(a.garbage_collection_threshold, 1.0);
        assert_eq!(
            a.roundup_power2_divisions,
            BTreeMap::from([("1".to_string(), 4)])
        );
    }

    #[test]
    fn only_the_first_frames_are_kept() {
        let frames: Vec<_> = (0..100)
            .map(|i| json!({"filename": "a.py", "line": i, "name": "f"}))
            .collect();
        let s = read(json!({"device_traces": [[{"action": "alloc", "frames": frames}]]})).unwrap();
        let kept = s.device_traces[0].frames(0);
        assert_eq!(kept.len(), MAX_FRAMES);
        assert_eq!(kept[MAX_FRAMES - 1].line, MAX_FRAMES as i64 - 1);
    }

    /// A recording made with C++ frames (`context="all"`) has dozens of
    /// them inside the user's line: past the frames kept, the Python ones
    /// are kept first, so the user's line stays (a real recording's
    /// out-of-memory came 33 frames in, after 30 of C++).
    #[test]
    fn past_the_frames_kept_the_python_ones_stay() {
        let mut frames: Vec<_> = (0..40)
            .map(|i| json!({"filename": "CUDACachingAllocator.cpp", "line": i, "name": "c"}))
            .collect();
        frames.push(json!({"filename": "train.py", "line": 88, "name": "step"}));
        frames.push(json!({"filename": "main.py", "line": 3, "name": "<module>"}));
        let s = read(json!({"device_traces": [[{"action": "oom", "frames": frames}]]})).unwrap();
        let kept = s.device_traces[0].frames(0);
        assert_eq!(kept.len(), MAX_FRAMES);
        // Innermost first: the first 30 C++ frames, then the two of Python.
        assert_eq!(
            (
                kept[0].line,
                kept[29].line,
                &*kept[30].filename,
                &*kept[31].filename
            ),
            (0, 29, "train.py", "main.py")
        );
        assert_eq!(user_frame(kept).map(|f| f.line), Some(88));
    }

    /// A real recording that was refused: "the integer
    /// 18446744073709551615 is out of range (a frame's line)".
    #[test]
    fn an_unknown_line_written_unsigned_is_minus_one() {
        let entry = json!({"action": "alloc", "addr": 0, "size": 512, "frames": [
            {"filename": "??", "line": u64::MAX, "name": "??"},
            {"filename": "a.py", "line": 7, "name": "f"},
        ]});
        let s = read(json!({"segments": [], "device_traces": [[entry]]})).unwrap();
        let lines: Vec<i64> = s.device_traces[0]
            .frames(0)
            .iter()
            .map(|f| f.line)
            .collect();
        assert_eq!(lines, [-1, 7]);
    }

    #[test]
    fn wrong_values_are_refused_saying_where() {
        let err = |v| read(v).unwrap_err().0;
        assert_eq!(
            err(json!([1])),
            "invalid type: a list, expected a dict (the snapshot)"
        );
        assert_eq!(
            err(json!({"segments": 5})),
            "invalid type: an integer, expected a list (`segments` of the snapshot)"
        );
        assert_eq!(
            err(json!({"segments": [{"total_size": 1}]})),
            "missing field `address` in a segment"
        );
        assert_eq!(
            err(json!({"segments": [{"address": -1, "total_size": 1}]})),
            "the integer -1 is out of range (`address` of a segment)"
        );
        assert!(err(json!({"segments": [{"address": 0, "total_size": 1, "blocks": [{"address": 0, "size": 1, "state": "odd"}]}]}))
            .starts_with("unknown block state 'odd'"));
    }

    /// A range that wraps past 2^64 is refused where it is read (replay
    /// once panicked on a `segment_map` of such a range).
    #[test]
    fn ranges_that_wrap_the_address_space_are_refused() {
        let err = |v| read(v).unwrap_err().0;
        let top = u64::MAX - 10;
        assert!(
            err(json!({"segments": [{"address": top, "total_size": 11}]})).starts_with(
                "a segment at address 18446744073709551605 of 11 bytes runs past the end"
            )
        );
        let block = json!({"address": top, "size": 20, "state": "inactive"});
        assert!(
            err(json!({"segments": [{"address": 0, "total_size": 1, "blocks": [block]}]}))
                .starts_with("a block at address")
        );
        let trace = json!({"action": "segment_map", "addr": top, "size": 4096});
        assert!(err(json!({"segments": [], "device_traces": [[trace]]}))
            .starts_with("a trace entry at address"));
        assert!(read(json!({"segments": [{"address": top, "total_size": 10}]})).is_ok());
    }
}
