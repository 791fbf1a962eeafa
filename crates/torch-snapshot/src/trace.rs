//! A device's trace: its events ([`TraceEntry`], [`Action`]), held column
//! by column, about 31 bytes an event (PyTorch writes 40 to 300 in its
//! pickle), so that a recording of millions of events takes less memory
//! than its file. Entries go in and come out as rows; the actions,
//! streams and stacks a trace repeats are held once, in small tables, and
//! indexed.

use super::frame::Stack;
use crate::error::Unexpected;
use serde::{Serialize, Serializer};
use std::collections::HashMap;
use std::sync::Arc;

/// One event of a device's trace (`TraceEntry`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceEntry {
    pub action: Action,
    /// Block or segment address (absent on `oom`).
    pub addr: u64,
    /// `alloc`, `free_requested`, `free_completed`: the caller's requested
    /// size; segment events: the segment's (or mapped range's) size; `oom`:
    /// the segment size that could not be had.
    pub size: u64,
    pub stream: u64,
    /// `oom`: the free bytes the driver reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
    pub frames: Stack,
}

impl TraceEntry {
    /// An entry with its action alone (no address, size or frames).
    pub fn new(action: Action) -> Self {
        TraceEntry {
            action,
            addr: 0,
            size: 0,
            stream: 0,
            device_free: None,
            time_us: None,
            frames: Stack::default(),
        }
    }
}

/// `TraceEntry::Action`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    /// An action this version does not know (kept, not replayed).
    Other(Arc<str>),
}

impl Action {
    pub fn name(&self) -> &str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Other(name) => name,
        }
    }

    pub(super) fn from_name(name: String) -> Self {
        match name.as_str() {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            _ => Action::Other(name.into()),
        }
    }
}

impl Serialize for Action {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// Known actions by code; an unknown one is `KNOWN + its index` among the
/// trace's own names.
const KNOWN: u8 = 9;

#[derive(Clone, Debug, Default)]
pub struct Trace {
    action: Vec<u8>,
    addr: Vec<u64>,
    size: Vec<u64>,
    /// Index into `streams`.
    stream: Vec<u16>,
    /// `i64::MIN`: none recorded.
    time_us: Vec<i64>,
    /// Index into `stacks`.
    frames: Vec<u32>,
    /// `(event, bytes)` of the few entries that carry `device_free`, in
    /// event order.
    device_free: Vec<(u32, u64)>,
    others: Vec<Arc<str>>,
    streams: Vec<u64>,
    stacks: Vec<Stack>,
    /// Where each stack is in `stacks`, by its address.
    stack_index: HashMap<usize, u32>,
}

/// Bytes one event takes in the columns.
pub const EVENT_BYTES: usize = 1 + 8 + 8 + 2 + 8 + 4;

impl Trace {
    pub fn len(&self) -> usize {
        self.action.len()
    }

    pub fn is_empty(&self) -> bool {
        self.action.is_empty()
    }

    /// Entry `i`, as its row.
    pub fn get(&self, i: usize) -> Option<TraceEntry> {
        (i < self.len()).then(|| TraceEntry {
            action: self.action(i),
            addr: self.addr[i],
            size: self.size[i],
            stream: self.streams[self.stream[i] as usize],
            device_free: self.device_free(i),
            time_us: Some(self.time_us[i]).filter(|&t| t != i64::MIN),
            frames: self.frames(i).clone(),
        })
    }

    /// Every entry, in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = TraceEntry> + ExactSizeIterator + '_ {
        self.rows(0..self.len())
    }

    /// The entries of `range` (cut to the trace), each made as it is
    /// reached: a view of a few rows deep in a long trace makes those
    /// rows only (`iter().skip(n)` would make the first `n` too).
    pub fn rows(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl DoubleEndedIterator<Item = TraceEntry> + ExactSizeIterator + '_ {
        let end = range.end.min(self.len());
        (range.start.min(end)..end).map(|i| self.get(i).expect("an index below the length"))
    }

    pub fn action(&self, i: usize) -> Action {
        match self.action[i] {
            0 => Action::Alloc,
            1 => Action::FreeRequested,
            2 => Action::FreeCompleted,
            3 => Action::SegmentAlloc,
            4 => Action::SegmentFree,
            5 => Action::SegmentMap,
            6 => Action::SegmentUnmap,
            7 => Action::Snapshot,
            8 => Action::Oom,
            other => Action::Other(self.others[usize::from(other - KNOWN)].clone()),
        }
    }

    /// Entry `i`'s address, size and stream, without making its row.
    pub fn place(&self, i: usize) -> (u64, u64, u64) {
        (
            self.addr[i],
            self.size[i],
            self.streams[self.stream[i] as usize],
        )
    }

    /// The stack frames of entry `i`.
    pub fn frames(&self, i: usize) -> &Stack {
        &self.stacks[self.frames[i] as usize]
    }

    fn device_free(&self, i: usize) -> Option<u64> {
        let at = u32::try_from(i).ok()?;
        let found = self.device_free.binary_search_by_key(&at, |&(e, _)| e);
        found.ok().map(|k| self.device_free[k].1)
    }

    /// Appends `e`; refused past the trace's tables (2^32 events, 65,536
    /// streams, 2^32 stacks, 247 unknown actions).
    pub fn push(&mut self, e: TraceEntry) -> Result<(), Unexpected> {
        let event = u32::try_from(self.len()).map_err(|_| "a trace of more than 2^32 events")?;
        let action = self.action_code(&e.action)?;
        let stream = self.stream_index(e.stream)?;
        let frames = self.stack_index(e.frames)?;
        self.action.push(action);
        self.addr.push(e.addr);
        self.size.push(e.size);
        self.stream.push(stream);
        self.time_us.push(e.time_us.unwrap_or(i64::MIN));
        self.frames.push(frames);
        if let Some(free) = e.device_free {
            self.device_free.push((event, free));
        }
        Ok(())
    }

    fn action_code(&mut self, action: &Action) -> Result<u8, Unexpected> {
        Ok(match action {
            Action::Alloc => 0,
            Action::FreeRequested => 1,
            Action::FreeCompleted => 2,
            Action::SegmentAlloc => 3,
            Action::SegmentFree => 4,
            Action::SegmentMap => 5,
            Action::SegmentUnmap => 6,
            Action::Snapshot => 7,
            Action::Oom => 8,
            Action::Other(name) => {
                let at = match self.others.iter().position(|o| o == name) {
                    Some(at) => at,
                    None => {
                        self.others.push(name.clone());
                        self.others.len() - 1
                    }
                };
                u8::try_from(at + usize::from(KNOWN))
                    .map_err(|_| "a trace of more than 247 kinds of unknown action")?
            }
        })
    }

    fn stream_index(&mut self, stream: u64) -> Result<u16, Unexpected> {
        let at = match self.streams.iter().position(|&s| s == stream) {
            Some(at) => at,
            None => {
                self.streams.push(stream);
                self.streams.len() - 1
            }
        };
        u16::try_from(at).map_err(|_| "a trace on more than 65,536 streams".into())
    }

    fn stack_index(&mut self, stack: Stack) -> Result<u32, Unexpected> {
        let key = Arc::as_ptr(&stack) as *const u8 as usize;
        if let Some(&at) = self.stack_index.get(&key) {
            return Ok(at);
        }
        let at =
            u32::try_from(self.stacks.len()).map_err(|_| "a trace of more than 2^32 stacks")?;
        self.stacks.push(stack);
        self.stack_index.insert(key, at);
        Ok(at)
    }

    /// Room for `n` more events in every column.
    pub fn reserve_exact(&mut self, n: usize) {
        self.action.reserve_exact(n);
        self.addr.reserve_exact(n);
        self.size.reserve_exact(n);
        self.stream.reserve_exact(n);
        self.time_us.reserve_exact(n);
        self.frames.reserve_exact(n);
    }

    /// Events the columns hold room for.
    pub fn capacity(&self) -> usize {
        self.action.capacity()
    }

    /// Bytes the columns and tables hold, besides the stacks themselves.
    pub fn bytes(&self) -> usize {
        self.capacity() * EVENT_BYTES
            + self.device_free.capacity() * 16
            + (self.others.capacity() + self.stacks.capacity()) * 16
            + self.streams.capacity() * 8
            + self.stack_index.capacity() * 24
    }
}

impl PartialEq for Trace {
    fn eq(&self, other: &Trace) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl FromIterator<TraceEntry> for Trace {
    /// # Panics
    /// Past the trace's tables (see [`Trace::push`]): for entries made by
    /// vramlab itself, never from a file.
    fn from_iter<I: IntoIterator<Item = TraceEntry>>(entries: I) -> Trace {
        let mut trace = Trace::default();
        for e in entries {
            trace.push(e).expect("vramlab's own traces fit the tables");
        }
        trace
    }
}

impl From<Vec<TraceEntry>> for Trace {
    fn from(entries: Vec<TraceEntry>) -> Trace {
        entries.into_iter().collect()
    }
}

impl Serialize for Trace {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Frame;

    fn entry(action: Action, addr: u64) -> TraceEntry {
        TraceEntry {
            addr,
            size: 512,
            stream: 7,
            ..TraceEntry::new(action)
        }
    }

    #[test]
    fn rows_come_out_as_they_went_in() {
        let stack: Stack = vec![Frame {
            filename: "train.py".into(),
            line: 3,
            name: "step".into(),
        }]
        .into();
        let rows = vec![
            TraceEntry {
                time_us: Some(-5),
                frames: stack.clone(),
                ..entry(Action::Alloc, 1 << 40)
            },
            TraceEntry {
                device_free: Some(123),
                ..entry(Action::Oom, 0)
            },
            entry(Action::Other("new_thing".into()), 9),
            TraceEntry {
                frames: stack.clone(),
                stream: u64::MAX,
                ..entry(Action::FreeCompleted, 1 << 40)
            },
        ];
        let trace = Trace::from(rows.clone());
        assert_eq!(trace.iter().collect::<Vec<_>>(), rows);
        assert_eq!(trace.rows(1..3).collect::<Vec<_>>(), rows[1..3]);
        assert_eq!(trace.rows(3..9).count(), 1);
        assert_eq!(trace.rows(7..9).count(), 0);
        assert_eq!(trace.get(4), None);
        assert!(Arc::ptr_eq(trace.frames(0), trace.frames(3)));
        assert_eq!((trace.stacks.len(), trace.streams.len()), (2, 2));
        assert_eq!(
            serde_json::to_value(&trace).unwrap(),
            serde_json::to_value(&rows).unwrap()
        );
    }

    #[test]
    fn an_event_takes_its_columns_bytes() {
        let mut trace = Trace::default();
        trace.reserve_exact(1000);
        for i in 0..1000 {
            trace.push(entry(Action::Alloc, i)).unwrap();
        }
        assert_eq!(trace.capacity(), 1000);
        assert!(
            trace.bytes() < 1000 * EVENT_BYTES + 1024,
            "{}",
            trace.bytes()
        );
    }

    #[test]
    fn too_many_unknown_actions_are_refused() {
        let mut trace = Trace::default();
        for i in 0..247 {
            trace
                .push(entry(Action::Other(format!("a{i}").into()), 0))
                .unwrap();
        }
        let err = trace.push(entry(Action::Other("one more".into()), 0));
        assert!(err.unwrap_err().0.contains("unknown action"));
    }
}
