//! What the views draw: the segment and block map and the table of live
//! objects, captured from a process ([`capture`]), and the deltas between
//! two snapshots ([`delta`]).

mod capture;
pub mod delta;
mod read;

pub use crate::stats::{Event, EventAction, Stats};
pub use capture::capture;
pub use delta::{apply, diff, SegmentPatch, SnapshotDelta};

use serde::{Deserialize, Serialize};
use vramlab_core::types::{Category, Framework};
use vramlab_device::alloc::BlockState;
use vramlab_device::device::DeviceInfo;

/// A block in the map, with what owns it. On the wire a block is a compact
/// array `[address, size, requested_size, state, owner, category]` (a
/// snapshot can hold thousands).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "BlockWire")]
pub struct BlockSnapshot {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    /// The name the owning tensor was created under, for allocated blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
}

#[derive(Deserialize)]
struct BlockWire(u64, u64, u64, BlockState, Option<String>, Option<Category>);

impl Serialize for BlockSnapshot {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(6)?;
        t.serialize_element(&self.address)?;
        t.serialize_element(&self.size)?;
        t.serialize_element(&self.requested_size)?;
        t.serialize_element(&self.state)?;
        t.serialize_element(&self.owner)?;
        t.serialize_element(&self.category)?;
        t.end()
    }
}

impl From<BlockWire> for BlockSnapshot {
    fn from(w: BlockWire) -> Self {
        BlockSnapshot {
            address: w.0,
            size: w.1,
            requested_size: w.2,
            state: w.3,
            owner: w.4,
            category: w.5,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub requested_size: u64,
    /// `small` / `large` (PyTorch), `region` (BFC), `uncached`.
    pub pool: String,
    pub blocks: Vec<BlockSnapshot>,
}

/// Read by hand (`fields`): every snapshot carries its segments.
impl<'de> Deserialize<'de> for SegmentSnapshot {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        vramlab_core::fields::read(d, |f| {
            Ok(SegmentSnapshot {
                address: f.take("address")?,
                total_size: f.take("total_size")?,
                allocated_size: f.take("allocated_size")?,
                requested_size: f.take("requested_size")?,
                pool: f.take("pool")?,
                blocks: f.take("blocks")?,
            })
        })
    }
}

/// A live Python object and why it is alive. On the wire a compact array
/// `[id, kind, label, names, bytes, requested_bytes, refcount, category,
/// kept_alive_by]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "ObjectWire")]
pub struct ObjectSnapshot {
    pub id: crate::runtime::ObjId,
    /// `Tensor` or `list`.
    pub kind: String,
    /// The name it was created under.
    pub label: String,
    /// Names bound to it now.
    pub names: Vec<String>,
    /// Device bytes of the tensor's block (0 for other objects).
    pub bytes: u64,
    /// Bytes the tensor asked for (before the allocator's rounding).
    pub requested_bytes: u64,
    pub refcount: u32,
    pub category: Option<Category>,
    /// The chain of references that keeps it alive, e.g. `h -> list`, or a
    /// sentence when only a reference cycle does.
    pub kept_alive_by: String,
}

impl ObjectSnapshot {
    /// An autograd graph node (bookkeeping the object table leaves out).
    pub fn is_autograd_graph(&self) -> bool {
        self.kind == crate::runtime::Class::Graph.name()
    }
}

#[derive(Deserialize)]
struct ObjectWire(
    crate::runtime::ObjId,
    String,
    String,
    Vec<String>,
    u64,
    u64,
    u32,
    Option<Category>,
    String,
);

impl Serialize for ObjectSnapshot {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(9)?;
        t.serialize_element(&self.id)?;
        t.serialize_element(&self.kind)?;
        t.serialize_element(&self.label)?;
        t.serialize_element(&self.names)?;
        t.serialize_element(&self.bytes)?;
        t.serialize_element(&self.requested_bytes)?;
        t.serialize_element(&self.refcount)?;
        t.serialize_element(&self.category)?;
        t.serialize_element(&self.kept_alive_by)?;
        t.end()
    }
}

impl From<ObjectWire> for ObjectSnapshot {
    fn from(w: ObjectWire) -> Self {
        ObjectSnapshot {
            id: w.0,
            kind: w.1,
            label: w.2,
            names: w.3,
            bytes: w.4,
            requested_bytes: w.5,
            refcount: w.6,
            category: w.7,
            kept_alive_by: w.8,
        }
    }
}

/// Everything the views draw, at one moment (read by `read`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    pub step: u64,
    pub framework: Framework,
    pub device: DeviceInfo,
    pub stats: Stats,
    pub segments: Vec<SegmentSnapshot>,
    pub objects: Vec<ObjectSnapshot>,
    /// The most recent events (the log keeps a bounded window).
    pub events: Vec<Event>,
}
