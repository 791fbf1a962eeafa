//! A snapshot once read, as bytes: how the worker that read a file hands
//! it to the page (one transferable buffer, nothing copied by the
//! browser). Each string and stack is written once and referred to by
//! index; then the segments, the settings and every trace event.
//!
//! [`decode`] takes any bytes: a buffer that is not one [`encode`] wrote
//! is an error, never a panic, and every count is checked against the
//! bytes left before anything is allocated for it.

use super::format::{
    Action, AllocatorSettings, Block, BlockState, Frame, MemorySnapshot, Segment, Stack, Trace,
    TraceEntry,
};
use super::{Malformed, SnapshotError};
use std::collections::HashMap;
use std::sync::Arc;

/// What a buffer starts with (the format's version is its last byte).
const MAGIC: &[u8; 8] = b"vramlab1";

/// Action codes: the known ones in this order, then an unknown one by
/// name.
const ACTIONS: [Action; 9] = [
    Action::Alloc,
    Action::FreeRequested,
    Action::FreeCompleted,
    Action::SegmentAlloc,
    Action::SegmentFree,
    Action::SegmentMap,
    Action::SegmentUnmap,
    Action::Snapshot,
    Action::Oom,
];
const OTHER: u8 = ACTIONS.len() as u8;

const STATES: [BlockState; 3] = [
    BlockState::ActiveAllocated,
    BlockState::ActivePendingFree,
    BlockState::Inactive,
];

/// `snapshot` as bytes.
pub fn encode(snapshot: &MemorySnapshot) -> Vec<u8> {
    let mut out = Out::default();
    out.count(snapshot.segments.len());
    for s in &snapshot.segments {
        out.segment(s);
    }
    out.settings(snapshot.allocator_settings.as_ref());
    out.count(snapshot.device_traces.len());
    for t in &snapshot.device_traces {
        out.count(t.len());
        for e in t.iter() {
            out.event(&e);
        }
    }
    let mut bytes = Vec::with_capacity(out.body.len() + out.tables_len());
    bytes.extend_from_slice(MAGIC);
    out.write_tables(&mut bytes);
    bytes.extend_from_slice(&out.body);
    bytes
}

/// The snapshot [`encode`] wrote as `bytes`.
pub fn decode(bytes: &[u8]) -> Result<MemorySnapshot, SnapshotError> {
    let fail = |why: Malformed| {
        SnapshotError::Malformed(Malformed(format!(
            "the read snapshot did not arrive whole: {why}"
        )))
    };
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| fail("not one".into()))?;
    let mut r = In::new(rest);
    r.tables().map_err(fail)?;
    let snapshot = r.snapshot().map_err(fail)?;
    match r.left() {
        0 => Ok(snapshot),
        n => Err(fail(format!("{n} bytes after its end").into())),
    }
}

/// The writer: the body, and the strings and stacks it refers to.
#[derive(Default)]
struct Out {
    body: Vec<u8>,
    strings: Vec<Arc<str>>,
    string_index: HashMap<Arc<str>, u32>,
    stacks: Vec<Stack>,
    /// By the stack's address: a recording shares each stack.
    stack_index: HashMap<usize, u32>,
}

impl Out {
    fn u8(&mut self, v: u8) {
        self.body.push(v);
    }

    fn u64(&mut self, v: u64) {
        self.body.extend_from_slice(&v.to_le_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.body.extend_from_slice(&v.to_le_bytes());
    }

    fn count(&mut self, n: usize) {
        self.u64(n as u64);
    }

    fn intern(&mut self, s: &Arc<str>) -> u32 {
        if let Some(&at) = self.string_index.get(s) {
            return at;
        }
        let at = self.strings.len() as u32;
        self.strings.push(s.clone());
        self.string_index.insert(s.clone(), at);
        at
    }

    fn string(&mut self, s: &Arc<str>) {
        let at = self.intern(s);
        self.u32(at);
    }

    fn stack(&mut self, stack: &Stack) {
        let key = Arc::as_ptr(stack) as *const u8 as usize;
        let at = match self.stack_index.get(&key) {
            Some(&at) => at,
            None => {
                for f in stack.iter() {
                    self.intern(&f.filename);
                    self.intern(&f.name);
                }
                let at = self.stacks.len() as u32;
                self.stacks.push(stack.clone());
                self.stack_index.insert(key, at);
                at
            }
        };
        self.u32(at);
    }

    fn segment(&mut self, s: &Segment) {
        self.u32(s.device);
        for v in [
            s.address,
            s.total_size,
            s.allocated_size,
            s.active_size,
            s.requested_size,
            s.stream,
            s.segment_pool_id.0,
            s.segment_pool_id.1,
        ] {
            self.u64(v);
        }
        self.string(&Arc::from(s.segment_type.as_str()));
        self.u8(u8::from(s.is_expandable));
        self.stack(&s.frames);
        self.count(s.blocks.len());
        for b in &s.blocks {
            self.u64(b.address);
            self.u64(b.size);
            self.u64(b.requested_size);
            self.u8(STATES.iter().position(|&x| x == b.state).unwrap_or(2) as u8);
            self.stack(&b.frames);
        }
    }

    fn settings(&mut self, settings: Option<&AllocatorSettings>) {
        let Some(a) = settings else {
            return self.u8(0);
        };
        self.u8(1);
        self.string(&Arc::from(a.alloc_conf.as_str()));
        self.u64(a.max_split_size as u64);
        self.u64(a.garbage_collection_threshold.to_bits());
        self.u8(u8::from(a.expandable_segments));
        self.count(a.roundup_power2_divisions.len());
        for (interval, &divisions) in &a.roundup_power2_divisions {
            self.string(&Arc::from(interval.as_str()));
            self.u64(divisions);
        }
    }

    fn event(&mut self, e: &TraceEntry) {
        match ACTIONS.iter().position(|a| *a == e.action) {
            Some(code) => self.u8(code as u8),
            None => {
                self.u8(OTHER);
                self.string(&Arc::from(e.action.name()));
            }
        }
        self.u64(e.addr);
        self.u64(e.size);
        self.u64(e.stream);
        self.u64(e.time_us.map_or(i64::MIN, |t| t) as u64);
        self.stack(&e.frames);
        match e.device_free {
            Some(free) => {
                self.u8(1);
                self.u64(free);
            }
            None => self.u8(0),
        }
    }

    fn tables_len(&self) -> usize {
        let strings: usize = self.strings.iter().map(|s| 8 + s.len()).sum();
        let frames: usize = self.stacks.iter().map(|s| 8 + 16 * s.len()).sum();
        16 + strings + frames
    }

    fn write_tables(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.strings.len() as u64).to_le_bytes());
        for s in &self.strings {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        out.extend_from_slice(&(self.stacks.len() as u64).to_le_bytes());
        let index = |s: &Arc<str>| self.string_index[s];
        for stack in &self.stacks {
            out.extend_from_slice(&(stack.len() as u64).to_le_bytes());
            for f in stack.iter() {
                out.extend_from_slice(&index(&f.filename).to_le_bytes());
                out.extend_from_slice(&f.line.to_le_bytes());
                out.extend_from_slice(&index(&f.name).to_le_bytes());
            }
        }
    }
}

/// The reader: the tables first, then what refers to them.
struct In<'a> {
    bytes: &'a [u8],
    strings: Vec<Arc<str>>,
    stacks: Vec<Stack>,
}

/// The fewest bytes a segment, a block and an event take.
const SEGMENT_BYTES: usize = 4 + 8 * 8 + 4 + 1 + 4 + 8;
const BLOCK_BYTES: usize = 3 * 8 + 1 + 4;
const EVENT_BYTES: usize = 1 + 4 * 8 + 4 + 1;

impl<'a> In<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            strings: Vec::new(),
            stacks: Vec::new(),
        }
    }

    fn left(&self) -> usize {
        self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if n > self.bytes.len() {
            return Err(format!("{n} bytes asked, {} left", self.bytes.len()).into());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, Malformed> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A count of items of at least `each` bytes, which the bytes left
    /// must hold.
    fn count(&mut self, each: usize) -> Result<usize, Malformed> {
        let n = self.u64()?;
        match usize::try_from(n) {
            Ok(n) if n.saturating_mul(each.max(1)) <= self.bytes.len() => Ok(n),
            _ => Err(format!("{n} items of {each} bytes in {} bytes", self.left()).into()),
        }
    }

    fn bool(&mut self) -> Result<bool, Malformed> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(format!("{b} for a yes or no").into()),
        }
    }

    fn string(&mut self) -> Result<Arc<str>, Malformed> {
        let at = self.u32()? as usize;
        (self.strings.get(at).cloned())
            .ok_or_else(|| format!("string {at} of {}", self.strings.len()).into())
    }

    fn stack(&mut self) -> Result<Stack, Malformed> {
        let at = self.u32()? as usize;
        (self.stacks.get(at).cloned())
            .ok_or_else(|| format!("stack {at} of {}", self.stacks.len()).into())
    }

    fn tables(&mut self) -> Result<(), Malformed> {
        let strings = self.count(8)?;
        self.strings.reserve_exact(strings);
        for _ in 0..strings {
            let len = self.count(1)?;
            let text = std::str::from_utf8(self.take(len)?).map_err(|e| e.to_string())?;
            self.strings.push(Arc::from(text));
        }
        let stacks = self.count(8)?;
        self.stacks.reserve_exact(stacks);
        for _ in 0..stacks {
            let frames = self.count(16)?;
            let stack = (0..frames)
                .map(|_| {
                    Ok(Frame {
                        filename: self.string()?,
                        line: self.u64()? as i64,
                        name: self.string()?,
                    })
                })
                .collect::<Result<Vec<Frame>, Malformed>>()?;
            self.stacks.push(stack.into());
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Result<MemorySnapshot, Malformed> {
        let segments = self.count(SEGMENT_BYTES)?;
        let segments = (0..segments)
            .map(|_| self.segment())
            .collect::<Result<_, _>>()?;
        let allocator_settings = self.settings()?;
        let traces = self.count(8)?;
        let device_traces = (0..traces)
            .map(|_| self.trace())
            .collect::<Result<_, _>>()?;
        Ok(MemorySnapshot {
            segments,
            device_traces,
            allocator_settings,
        })
    }

    fn segment(&mut self) -> Result<Segment, Malformed> {
        let device = self.u32()?;
        let mut v = [0u64; 8];
        for slot in &mut v {
            *slot = self.u64()?;
        }
        let segment_type = self.string()?.to_string();
        let is_expandable = self.bool()?;
        let frames = self.stack()?;
        let blocks = self.count(BLOCK_BYTES)?;
        let blocks = (0..blocks)
            .map(|_| self.block())
            .collect::<Result<_, _>>()?;
        Ok(Segment {
            device,
            address: v[0],
            total_size: v[1],
            allocated_size: v[2],
            active_size: v[3],
            requested_size: v[4],
            stream: v[5],
            segment_type,
            segment_pool_id: (v[6], v[7]),
            is_expandable,
            blocks,
            frames,
        })
    }

    fn block(&mut self) -> Result<Block, Malformed> {
        let (address, size, requested_size) = (self.u64()?, self.u64()?, self.u64()?);
        let state = self.u8()?;
        let state = *(STATES.get(state as usize)).ok_or_else(|| format!("block state {state}"))?;
        Ok(Block {
            address,
            size,
            requested_size,
            state,
            frames: self.stack()?,
        })
    }

    fn settings(&mut self) -> Result<Option<AllocatorSettings>, Malformed> {
        if !self.bool()? {
            return Ok(None);
        }
        let alloc_conf = self.string()?.to_string();
        let max_split_size = self.u64()? as i64;
        let garbage_collection_threshold = f64::from_bits(self.u64()?);
        let expandable_segments = self.bool()?;
        let intervals = self.count(12)?;
        let roundup_power2_divisions = (0..intervals)
            .map(|_| Ok((self.string()?.to_string(), self.u64()?)))
            .collect::<Result<_, Malformed>>()?;
        Ok(Some(AllocatorSettings {
            alloc_conf,
            max_split_size,
            garbage_collection_threshold,
            expandable_segments,
            roundup_power2_divisions,
        }))
    }

    fn trace(&mut self) -> Result<Trace, Malformed> {
        let events = self.count(EVENT_BYTES)?;
        let mut trace = Trace::default();
        trace.reserve_exact(events);
        for _ in 0..events {
            let action = match self.u8()? {
                OTHER => Action::Other(self.string()?),
                code => (ACTIONS.get(code as usize).cloned())
                    .ok_or_else(|| Malformed(format!("action {code}")))?,
            };
            let (addr, size, stream) = (self.u64()?, self.u64()?, self.u64()?);
            let time_us = Some(self.u64()? as i64).filter(|&t| t != i64::MIN);
            let frames = self.stack()?;
            let device_free = match self.bool()? {
                true => Some(self.u64()?),
                false => None,
            };
            trace
                .push(TraceEntry {
                    action,
                    addr,
                    size,
                    stream,
                    time_us,
                    frames,
                    device_free,
                })
                .map_err(|e| Malformed(e.0))?;
        }
        Ok(trace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, line: i64, name: &str) -> Frame {
        Frame {
            filename: file.into(),
            line,
            name: name.into(),
        }
    }

    fn sample() -> MemorySnapshot {
        let stack: Stack = vec![frame("train.py", 12, "step"), frame("??", 0, "malloc")].into();
        let block = Block {
            address: 1 << 40,
            size: 1024,
            requested_size: 1000,
            state: BlockState::ActiveAllocated,
            frames: stack.clone(),
        };
        let mut trace = Trace::default();
        for (action, free) in [
            (Action::SegmentAlloc, None),
            (Action::Alloc, None),
            (Action::Other("user_defined".into()), None),
            (Action::Oom, Some(4096)),
        ] {
            let e = TraceEntry {
                action,
                addr: 1 << 40,
                size: 2 << 20,
                stream: 7,
                time_us: Some(3),
                frames: stack.clone(),
                device_free: free,
            };
            trace.push(e).unwrap();
        }
        MemorySnapshot {
            segments: vec![Segment {
                address: 1 << 40,
                total_size: 2 << 20,
                segment_type: "small".into(),
                segment_pool_id: (1, 0),
                blocks: vec![block],
                ..Segment::default()
            }
            .summed()],
            device_traces: vec![Trace::default(), trace],
            allocator_settings: Some(AllocatorSettings {
                alloc_conf: "expandable_segments:True".into(),
                max_split_size: -1,
                garbage_collection_threshold: 0.6,
                expandable_segments: true,
                roundup_power2_divisions: [("1".to_string(), 4)].into(),
            }),
        }
    }

    #[test]
    fn a_snapshot_arrives_as_it_left_its_stacks_shared() {
        let s = sample();
        let bytes = encode(&s);
        let back = decode(&bytes).unwrap();
        assert_eq!(back, s);
        let (block, event) = (&back.segments[0].blocks[0].frames, back.trace(1).frames(1));
        assert!(Arc::ptr_eq(block, event), "one stack, shared");
    }

    /// Every cut of a buffer, and every byte of it changed, is an error or
    /// a snapshot, never a panic.
    #[test]
    fn a_damaged_buffer_is_refused_not_a_panic() {
        let bytes = encode(&sample());
        for cut in 0..bytes.len() {
            let err = decode(&bytes[..cut]).unwrap_err();
            assert!(err.to_string().contains("did not arrive whole"), "{err:?}");
        }
        for at in 0..bytes.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut changed = bytes.clone();
                changed[at] ^= flip;
                let _ = decode(&changed);
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer)
            .unwrap_err()
            .to_string()
            .contains("1 bytes after"));
    }
}
