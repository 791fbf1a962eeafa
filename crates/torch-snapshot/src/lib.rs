//! Real PyTorch memory snapshots in and out: reading the file that
//! `torch.cuda.memory._dump_snapshot()` writes ([`format`]), rebuilding the
//! allocator's state at the trace's first event ([`initial`]), replaying
//! the trace on vramlab's allocators, exactly or under other settings
//! ([`replay`]), and writing any session as such a file ([`export`]).
//!
//! Only data is read: a pickle that names a Python class or function is
//! refused, nothing is ever executed. Memory: whatever the file, reading
//! it holds no more than twice its size and 2 MiB ([`read_limit`]) beside
//! the records it writes out, each in the form it is kept ([`Records`]:
//! so many bytes a segment, a block, an event; [`read_bound`]), its
//! records folded as they are read ([`fold`]), its frames held once
//! ([`intern`]), its traces column by column ([`trace`]); a recording
//! takes less than its file once read. Limits besides: [`MAX_FILE_BYTES`]
//! of file, [`MAX_EVENTS`] trace events, `decode::MAX_SEGMENTS` segments and `decode::MAX_BLOCKS` blocks,
//! `decode::MAX_FIELDS` fields in a record; stack frames beyond
//! [`format::MAX_FRAMES`] per entry, and beyond the file's share in all,
//! are dropped.

pub mod active;
mod decode;
pub mod diff;
mod error;
pub mod export;
pub mod fix;
mod fold;
pub mod format;
pub mod frame;
pub mod initial;
mod intern;
mod json;
mod pickle;
pub mod pools;
pub mod replay;
pub mod stream;
pub mod trace;
pub mod what_if;
pub mod window;
pub mod wire;

pub use error::{Malformed, SnapshotError, Unexpected};
pub use format::{Action, Block, BlockState, Frame, MemorySnapshot, Segment, Stack, TraceEntry};
pub use trace::Trace;

/// The largest file read: 4 GiB natively; 1.25 GiB in the page, whose
/// wasm32 memory (4 GiB at most) holds the file, its reading (at most
/// what [`read_limit`] leaves) and the replay.
#[cfg(not(target_arch = "wasm32"))]
pub const MAX_FILE_BYTES: usize = 4 << 30;
#[cfg(target_arch = "wasm32")]
pub const MAX_FILE_BYTES: usize = 1280 << 20;
/// The most trace events over all devices (a 4 GiB file of the densest
/// events PyTorch writes holds about 90 million); in the page, what its
/// memory replays beside them (about 55 bytes an event held, and the
/// timeline's 24).
#[cfg(not(target_arch = "wasm32"))]
pub const MAX_EVENTS: usize = 100_000_000;
#[cfg(target_arch = "wasm32")]
pub const MAX_EVENTS: usize = 12_000_000;

/// Refuses a file over [`MAX_FILE_BYTES`] before it is read.
pub fn check_size(len: usize) -> Result<(), SnapshotError> {
    if len > MAX_FILE_BYTES {
        return Err(SnapshotError::TooLarge { bytes: len });
    }
    Ok(())
}

/// The most a file of `len` bytes takes while it is read, beside its
/// records ([`read_bound`]): twice its size and a little
/// ([`pickle::FLOOR`]), and in the page no more than wasm32's memory
/// leaves beside the file; a file that would take more is refused.
pub fn read_limit(len: usize) -> usize {
    pickle::limit(len, 0)
}

/// The most a file of `len` bytes that writes out `records` takes while it
/// is read: [`read_limit`] and the records as they are kept. A record the
/// file shares through its memo (written once, referred to many times) is
/// no record of its own here: its copies count against [`read_limit`].
pub fn read_bound(len: usize, records: &Records) -> usize {
    pickle::limit(len, records.bytes())
}

/// A record's place in the list it is read into: its slot, and as much
/// again and a little while the list grows (its old and new storage).
const PLACE: usize = 3 * pickle::SLOT;

/// The records a snapshot is made of, as reading counts them: what a
/// file's reading may hold beside twice its size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub segments: usize,
    pub blocks: usize,
    pub events: usize,
}

impl Records {
    /// A segment as read, with the name of its pool (its blocks apart).
    const SEGMENT_READ: usize = std::mem::size_of::<Segment>() + 24 + 16;
    /// A block as read, and in its segment's list.
    const BLOCK_READ: usize = 2 * std::mem::size_of::<Block>() + 16;
    /// A segment (its blocks apart): as read, with its place in the list
    /// it is read into (room for that list to grow), and in the
    /// snapshot's list.
    pub const SEGMENT_BYTES: usize = Self::SEGMENT_READ + PLACE + std::mem::size_of::<Segment>();
    /// A block: as read, with its place in the list it is read into, and
    /// in its segment's list.
    pub const BLOCK_BYTES: usize = Self::BLOCK_READ + PLACE;
    /// An event, in its trace's columns.
    pub const EVENT_BYTES: usize = trace::EVENT_BYTES;

    /// The records of `snapshot`.
    pub fn of(snapshot: &MemorySnapshot) -> Records {
        Records {
            segments: snapshot.segments.len(),
            blocks: snapshot.segments.iter().map(|s| s.blocks.len()).sum(),
            events: snapshot.device_traces.iter().map(Trace::len).sum(),
        }
    }

    /// Bytes the reader's fold makes of the segments and blocks (their
    /// places in lists are the machine's to count, the segments' copies
    /// in the snapshot the decoder's).
    pub(crate) fn folded_bytes(&self) -> usize {
        (self.segments.saturating_mul(Self::SEGMENT_READ))
            .saturating_add(self.blocks.saturating_mul(Self::BLOCK_READ))
    }

    /// Bytes they take while read.
    pub fn bytes(&self) -> usize {
        (self.segments.saturating_mul(Self::SEGMENT_BYTES))
            .saturating_add(self.blocks.saturating_mul(Self::BLOCK_BYTES))
            .saturating_add(self.events.saturating_mul(Self::EVENT_BYTES))
    }
}

/// Reads a snapshot from a pickle (protocol 2 to 5) or from JSON of the
/// same shape.
pub fn read(bytes: &[u8]) -> Result<MemorySnapshot, SnapshotError> {
    read_counted(bytes).0
}

/// Reads a snapshot as [`read`] does, and the records it counted beside
/// the file's limit (refused or not): its reading held no more than
/// [`read_bound`] of them.
pub fn read_counted(bytes: &[u8]) -> (Result<MemorySnapshot, SnapshotError>, Records) {
    if let Err(e) = check_size(bytes.len()) {
        return (Err(e), Records::default());
    }
    let (reader, file): (Reader, _) = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(0x80) => (|b, f| pickle::read(b, f), PICKLE),
        Some(b'{') => (|b, f| json::read(b, f), JSON),
        _ => return (Err(SnapshotError::UnknownFormat), Records::default()),
    };
    read_with(bytes, reader, file)
}

/// Reads a snapshot from JSON already parsed (a websocket message's field).
pub fn from_json(value: serde_json::Value) -> Result<MemorySnapshot, SnapshotError> {
    let stacks = intern::Interner::new(decode::MAX_ALL_FRAMES);
    decode::snapshot(&pickle::from_json(value), decode::Limits::UNSHARED, stacks)
        .map_err(|why| SnapshotError::NotASnapshot { file: JSON, why })
}

/// What a file read as a pickle or as JSON is called in its errors.
pub(crate) const PICKLE: &str = "the pickle";
const JSON: &str = "the JSON";

/// The pickle's reader or JSON's: a function, so that [`read_with`] is one
/// copy in the page, not one for each.
type Reader = fn(&[u8], &mut fold::Folder) -> Result<(pickle::Value, pickle::Held), Malformed>;

/// Reads `bytes` with `reader` (the pickle's or JSON's), folding as it
/// goes, then decodes what it built within the rest of the file's limit.
fn read_with(
    bytes: &[u8],
    reader: Reader,
    file: &'static str,
) -> (Result<MemorySnapshot, SnapshotError>, Records) {
    let mut folder = folder_for(bytes.len());
    match reader(bytes, &mut folder) {
        Ok((top, held)) => (decoded(top, held, bytes.len(), folder, file), held.records),
        Err(e) => (Err(e.into()), pickle::Fold::records(&folder)),
    }
}

/// What folds the records of a file of `len` bytes as they are read.
fn folder_for(len: usize) -> fold::Folder {
    let frames = decode::MAX_ALL_FRAMES.min(len / 2);
    fold::Folder::new(intern::Interner::new(frames))
}

/// The snapshot in what a file of `len` bytes built (`top`, holding
/// `held`), decoded within the rest of its limit.
fn decoded(
    top: pickle::Value,
    held: pickle::Held,
    len: usize,
    folder: fold::Folder,
    file: &'static str,
) -> Result<MemorySnapshot, SnapshotError> {
    let limits = decode::Limits::for_file(len, held);
    let snapshot = decode::snapshot(&top, limits, folder.into_stacks());
    #[cfg(feature = "teardown")]
    pickle::tear_down(vec![top]);
    snapshot.map_err(|why| SnapshotError::NotASnapshot { file, why })
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

/// Writes a snapshot as [`write_pickle`] does, streamed to `w` (a tuple a
/// tuple, not a list): what it holds is the writer's buffer, whatever the
/// snapshot's size. For the command line; the page keeps [`write_pickle`],
/// whose serialization it carries already.
pub fn write_pickle_to(snapshot: &MemorySnapshot, w: impl std::io::Write) -> std::io::Result<()> {
    let mut w = w;
    serde_pickle::to_writer(&mut w, snapshot, serde_pickle::SerOptions::new()).map_err(
        |e| match e {
            serde_pickle::Error::Io(e) => e,
            other => std::io::Error::other(other.to_string()),
        },
    )
}

#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod tests;
