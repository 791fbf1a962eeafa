//! What the engine shows: the stats every result carries, the segment and
//! block map, the event log and the table of live objects.

use crate::alloc::{BlockState, TraceAction};
use crate::device::DeviceInfo;
use crate::protocol::{Category, Framework};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The numbers of DESIGN.md, in bytes or counts. For TensorFlow and JAX,
/// allocated is the BFC allocator's `bytes_in_use` and reserved its
/// `pool_bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// `memory_allocated()`.
    pub allocated_bytes: u64,
    /// `memory_reserved()`.
    pub reserved_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
    /// Free bytes inside segments that also hold live blocks: `empty_cache`
    /// cannot return them ("Non-releasable memory").
    pub inactive_split_bytes: u64,
    /// `max_memory_allocated()`.
    pub peak_allocated_bytes: u64,
    /// `max_memory_reserved()`.
    pub peak_reserved_bytes: u64,
    /// nvidia-smi's view of this process: context + every live segment.
    pub device_used_bytes: u64,
    pub device_total_bytes: u64,
    /// `cudaMemGetInfo` free: what any process could still get.
    pub device_free_bytes: u64,
    pub segments: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// Live blocks (`allocation.all.current`).
    pub allocations: u64,
    pub context_bytes: u64,
    pub other_processes_bytes: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// Peak allocated during the command (not lost between samples).
    pub step_peak_allocated_bytes: u64,
    /// Peak reserved during the command.
    pub step_peak_reserved_bytes: u64,
    /// Allocated bytes by what the blocks hold (the memory_viz legend).
    pub categories: BTreeMap<Category, u64>,
}

impl Stats {
    /// The value of a stat by its JSON name, `categories.<name>` for a
    /// category (for lesson expectations).
    pub fn get(&self, key: &str) -> Option<u64> {
        let v = serde_json::to_value(self).ok()?;
        key.split('.').try_fold(&v, |v, k| v.get(k))?.as_u64()
    }
}

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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentSnapshot {
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub requested_size: u64,
    /// `small` / `large` (PyTorch), `region` (BFC), `uncached`.
    pub pool: String,
    pub blocks: Vec<BlockSnapshot>,
}

/// One entry of the event log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the whole log since the server started the session.
    pub seq: u64,
    /// The command (step) that caused it.
    pub step: u64,
    pub action: EventAction,
    /// Block or segment address; for `oom`, the driver's free bytes.
    pub address: u64,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventAction {
    Alloc,
    Free,
    SegmentAlloc,
    SegmentFree,
    Oom,
    /// The kernel restarted: the process and its context are gone.
    Restart,
}

impl From<TraceAction> for EventAction {
    fn from(a: TraceAction) -> Self {
        match a {
            TraceAction::Alloc => EventAction::Alloc,
            TraceAction::Free => EventAction::Free,
            TraceAction::SegmentAlloc => EventAction::SegmentAlloc,
            TraceAction::SegmentFree => EventAction::SegmentFree,
            TraceAction::Oom => EventAction::Oom,
        }
    }
}

/// A live Python object and why it is alive. On the wire a compact array
/// `[id, kind, label, names, bytes, requested_bytes, refcount, category,
/// kept_alive_by]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "ObjectWire")]
pub struct ObjectSnapshot {
    pub id: u32,
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

#[derive(Deserialize)]
struct ObjectWire(
    u32,
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

/// Everything the views draw, at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

/// What changed between two snapshots: what a subscribed client receives
/// while a command runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotDelta {
    pub step: u64,
    pub stats: Stats,
    /// The highest allocated since the previous snapshot or delta sent to
    /// this client, even if it rose and fell in between.
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Segments that are new, whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<SegmentSnapshot>,
    /// Segments that changed: only their changed blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patched_segments: Vec<SegmentPatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_segments: Vec<u64>,
    /// Objects that are new or changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectSnapshot>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_objects: Vec<u32>,
}

/// The blocks of a segment that changed (by block address).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentPatch {
    pub address: u64,
    pub allocated_size: u64,
    pub requested_size: u64,
    /// Blocks that are new or changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<BlockSnapshot>,
    /// Addresses of blocks that are gone (merged into a neighbour).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_blocks: Vec<u64>,
}

fn patch(old: &SegmentSnapshot, new: &SegmentSnapshot) -> SegmentPatch {
    let before: BTreeMap<u64, &BlockSnapshot> = old.blocks.iter().map(|b| (b.address, b)).collect();
    let after: std::collections::BTreeSet<u64> = new.blocks.iter().map(|b| b.address).collect();
    SegmentPatch {
        address: new.address,
        allocated_size: new.allocated_size,
        requested_size: new.requested_size,
        blocks: new
            .blocks
            .iter()
            .filter(|b| before.get(&b.address) != Some(b))
            .cloned()
            .collect(),
        removed_blocks: before
            .keys()
            .filter(|a| !after.contains(a))
            .copied()
            .collect(),
    }
}

/// The delta that turns `old` into `new` (events aside: they travel in
/// their own batches).
pub fn diff(old: &Snapshot, new: &Snapshot, peaks: (u64, u64)) -> SnapshotDelta {
    let old_segments: BTreeMap<u64, &SegmentSnapshot> =
        old.segments.iter().map(|s| (s.address, s)).collect();
    let new_addresses: std::collections::BTreeSet<u64> =
        new.segments.iter().map(|s| s.address).collect();
    let old_objects: BTreeMap<u32, &ObjectSnapshot> =
        old.objects.iter().map(|o| (o.id, o)).collect();
    let new_ids: std::collections::BTreeSet<u32> = new.objects.iter().map(|o| o.id).collect();
    SnapshotDelta {
        step: new.step,
        stats: new.stats.clone(),
        peak_allocated_bytes: peaks.0,
        peak_reserved_bytes: peaks.1,
        segments: new
            .segments
            .iter()
            .filter(|s| !old_segments.contains_key(&s.address))
            .cloned()
            .collect(),
        patched_segments: new
            .segments
            .iter()
            .filter_map(|s| {
                let old = old_segments.get(&s.address)?;
                (*old != s).then(|| patch(old, s))
            })
            .collect(),
        removed_segments: old_segments
            .keys()
            .filter(|a| !new_addresses.contains(a))
            .copied()
            .collect(),
        objects: new
            .objects
            .iter()
            .filter(|o| old_objects.get(&o.id) != Some(o))
            .cloned()
            .collect(),
        removed_objects: old_objects
            .keys()
            .filter(|id| !new_ids.contains(id))
            .copied()
            .collect(),
    }
}

/// Applies a delta to the snapshot it was computed against.
pub fn apply(snapshot: &mut Snapshot, delta: &SnapshotDelta) {
    snapshot.step = delta.step;
    snapshot.stats = delta.stats.clone();
    snapshot
        .segments
        .retain(|s| !delta.removed_segments.contains(&s.address));
    for seg in &delta.segments {
        match snapshot
            .segments
            .iter_mut()
            .find(|s| s.address == seg.address)
        {
            Some(s) => *s = seg.clone(),
            None => snapshot.segments.push(seg.clone()),
        }
    }
    for p in &delta.patched_segments {
        let Some(seg) = snapshot
            .segments
            .iter_mut()
            .find(|s| s.address == p.address)
        else {
            continue;
        };
        seg.allocated_size = p.allocated_size;
        seg.requested_size = p.requested_size;
        seg.blocks
            .retain(|b| !p.removed_blocks.contains(&b.address));
        for block in &p.blocks {
            match seg.blocks.iter_mut().find(|b| b.address == block.address) {
                Some(b) => *b = block.clone(),
                None => seg.blocks.push(block.clone()),
            }
        }
        seg.blocks.sort_by_key(|b| b.address);
    }
    snapshot.segments.sort_by_key(|s| s.address);
    snapshot
        .objects
        .retain(|o| !delta.removed_objects.contains(&o.id));
    for obj in &delta.objects {
        match snapshot.objects.iter_mut().find(|o| o.id == obj.id) {
            Some(o) => *o = obj.clone(),
            None => snapshot.objects.push(obj.clone()),
        }
    }
    snapshot.objects.sort_by_key(|o| o.id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Engine;

    fn engine_after(lines: &[&str]) -> Engine {
        let mut e = Engine::new_simulated();
        for l in lines {
            assert!(e.run_line(l).ok, "{l}");
        }
        e
    }

    #[test]
    fn a_delta_turns_the_old_snapshot_into_the_new_one() {
        let mut e = engine_after(&[
            r#"{"cmd":"alloc","name":"x","bytes":1000}"#,
            r#"{"cmd":"alloc","name":"y","bytes":30000000}"#,
        ]);
        let old = e.snapshot(0);
        for l in [
            r#"{"cmd":"del","name":"y"}"#,
            r#"{"cmd":"empty_cache"}"#,
            r#"{"cmd":"alloc","name":"z","bytes":5000}"#,
            r#"{"cmd":"hold","name":"h","items":["x"],"cycle":true}"#,
        ] {
            assert!(e.run_line(l).ok);
        }
        let new = e.snapshot(0);
        let delta = diff(&old, &new, (1, 2));
        assert_eq!(delta.removed_segments.len(), 1, "y's segment went back");
        // z split the free tail of x's small segment: only those blocks travel.
        assert_eq!(delta.patched_segments.len(), 1);
        assert_eq!(
            delta.patched_segments[0].blocks.len(),
            2,
            "z and the new free tail"
        );
        let mut rebuilt = old.clone();
        apply(&mut rebuilt, &delta);
        assert_eq!(rebuilt, new);
        // Nothing changed: an empty delta.
        let same = diff(&new, &new, (0, 0));
        assert!(same.segments.is_empty() && same.objects.is_empty());
    }

    #[test]
    fn blocks_and_objects_travel_as_compact_arrays_and_come_back() {
        let e = engine_after(&[r#"{"cmd":"alloc","name":"x","bytes":1000,"category":"input"}"#]);
        let snap = e.snapshot(10);
        let json = serde_json::to_value(&snap).unwrap();
        assert_eq!(
            json["segments"][0]["blocks"][0],
            serde_json::json!([
                snap.segments[0].address,
                1024,
                1000,
                "active_allocated",
                "x",
                "input"
            ])
        );
        assert_eq!(json["objects"][0][2], "x");
        let back: Snapshot = serde_json::from_value(json).unwrap();
        assert_eq!(back, snap);
    }
}
