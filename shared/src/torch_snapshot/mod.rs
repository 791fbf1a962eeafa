//! Real PyTorch memory snapshots in and out: reading the file that
//! `torch.cuda.memory._dump_snapshot()` writes ([`format`]), rebuilding the
//! allocator's state at the trace's first event ([`initial`]), replaying
//! the trace on vramlab's allocators, exactly or under other settings
//! ([`replay`]), and writing any session as such a file ([`export`]).
//!
//! Only data is read: a pickle that names a Python class or function is
//! refused, nothing is ever executed. Limits, checked before anything is
//! decoded: [`MAX_FILE_BYTES`] of file, [`MAX_EVENTS`] trace events and
//! `decode::MAX_BLOCKS` blocks (for a pickle, also no more than its size
//! holds unshared: `decode::Limits::for_pickle`), `decode::MAX_FIELDS`
//! fields in a record; stack frames beyond [`format::MAX_FRAMES`] per
//! entry, and beyond the file's share in all, are dropped.

mod decode;
pub mod export;
mod fold;
pub mod format;
pub mod initial;
mod intern;
mod pickle;
pub mod replay;
pub mod trace;
pub mod what_if;

pub use format::{Action, Block, BlockState, Frame, MemorySnapshot, Segment, Stack, TraceEntry};
pub use trace::Trace;

/// The largest file read (a snapshot of a long run with deep stacks is a
/// few tens of MB).
pub const MAX_FILE_BYTES: usize = 256 << 20;
/// The most trace events over all devices.
pub const MAX_EVENTS: usize = 4_000_000;

/// The most a file of `len` bytes takes while it is read: twice its size
/// and a little ([`pickle::FLOOR`]); a file that would take more is
/// refused.
pub fn read_limit(len: usize) -> usize {
    pickle::limit(len)
}

/// Why a file could not be read as a snapshot, in words for the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotError(pub String);

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SnapshotError {}

/// Reads a snapshot from a pickle (protocol 2 to 5) or from JSON of the
/// same shape.
pub fn read(bytes: &[u8]) -> Result<MemorySnapshot, SnapshotError> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(SnapshotError(format!(
            "the file is {} MB; snapshots of up to {} MB are read",
            bytes.len() >> 20,
            MAX_FILE_BYTES >> 20
        )));
    }
    let snapshot = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(0x80) => read_pickle(bytes)?,
        Some(b'{') => read_json(bytes)?,
        _ => {
            return Err(SnapshotError(
                "not a PyTorch memory snapshot: expected the pickle that torch.cuda.memory._dump_snapshot() writes, or JSON".into(),
            ))
        }
    };
    Ok(snapshot)
}

fn read_json(bytes: &[u8]) -> Result<MemorySnapshot, SnapshotError> {
    let not_json = |e: &dyn std::fmt::Display| SnapshotError(format!("the file is not JSON: {e}"));
    let text = std::str::from_utf8(bytes).map_err(|e| not_json(&e))?;
    let value = serde_json::from_str(text).map_err(|e| not_json(&e))?;
    from_json(value)
}

/// Reads a snapshot from JSON already parsed (a websocket message's field).
pub fn from_json(value: serde_json::Value) -> Result<MemorySnapshot, SnapshotError> {
    let stacks = intern::Interner::new(decode::MAX_ALL_FRAMES);
    decode::snapshot(&pickle::from_json(value), decode::Limits::UNSHARED, stacks)
        .map_err(|e| SnapshotError(format!("the JSON is not a memory snapshot: {e}")))
}

fn read_pickle(bytes: &[u8]) -> Result<MemorySnapshot, SnapshotError> {
    let frames = decode::MAX_ALL_FRAMES.min(bytes.len() / 2);
    let mut folder = fold::Folder::new(intern::Interner::new(frames));
    let (top, held) = pickle::read(bytes, &mut folder).map_err(SnapshotError)?;
    let limits = decode::Limits::for_pickle(bytes.len(), held);
    let snapshot = decode::snapshot(&top, limits, folder.into_stacks());
    #[cfg(feature = "teardown")]
    pickle::tear_down(vec![top]);
    snapshot.map_err(|e| {
        SnapshotError(if e.starts_with("the pickle") {
            e
        } else {
            format!("the pickle is not a memory snapshot: {e}")
        })
    })
}

/// Writes a snapshot as a pickle (protocol 3) that
/// `torch.cuda.memory._memory_viz` and pytorch.org/memory_viz read.
///
/// Through the snapshot's JSON text and tree (the serialization of its types
/// the page already carries; tuples become lists, which readers take alike).
pub fn write_pickle(snapshot: &MemorySnapshot) -> Vec<u8> {
    let text = serde_json::to_string(snapshot).expect("plain data always serializes");
    let tree: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&text).expect("its own JSON reads back");
    serde_pickle::to_vec(&tree, serde_pickle::SerOptions::new()).expect("plain data always pickles")
}

#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod tests;
