//! The delta between two snapshots: what a subscribed client receives while
//! a command runs, and how it turns the old snapshot into the new one.

use super::{BlockSnapshot, ObjectSnapshot, SegmentSnapshot, Snapshot, Stats};
use serde::{Deserialize, Serialize};
use vramlab_core::collections::sort_by_u64;

/// What changed between two snapshots: what a subscribed client receives
/// while a command runs (read by `snapshot::read`).
#[derive(Clone, Debug, PartialEq, Serialize)]
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
    pub removed_objects: Vec<crate::runtime::ObjId>,
}

/// The blocks of a segment that changed (by block address).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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

/// Read by hand (`fields`): every delta carries its changed segments.
impl<'de> Deserialize<'de> for SegmentPatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        vramlab_core::fields::read(d, |f| {
            Ok(SegmentPatch {
                address: f.take("address")?,
                allocated_size: f.take("allocated_size")?,
                requested_size: f.take("requested_size")?,
                blocks: f.take_or("blocks", Vec::new())?,
                removed_blocks: f.take_or("removed_blocks", Vec::new())?,
            })
        })
    }
}

/// Where each item sits, by its key (address or id), sorted for lookup.
struct Index(Vec<(u64, usize)>);

impl Index {
    fn of<T>(items: &[T], key: impl Fn(&T) -> u64) -> Self {
        let mut at: Vec<(u64, usize)> = items.iter().map(&key).zip(0..).collect();
        at.sort_unstable();
        Index(at)
    }

    fn get<'a, T>(&self, items: &'a [T], key: u64) -> Option<&'a T> {
        let i = self.0.binary_search_by_key(&key, |&(k, _)| k).ok()?;
        items.get(self.0[i].1)
    }

    fn contains(&self, key: u64) -> bool {
        self.0.binary_search_by_key(&key, |&(k, _)| k).is_ok()
    }

    /// The keys not in `other`, in order.
    fn missing_from(&self, other: &Index) -> impl Iterator<Item = u64> + '_ {
        let other: Vec<u64> = other.0.iter().map(|&(k, _)| k).collect();
        self.0
            .iter()
            .map(|&(k, _)| k)
            .filter(move |k| other.binary_search(k).is_err())
    }
}

fn patch(old: &SegmentSnapshot, new: &SegmentSnapshot) -> SegmentPatch {
    let before = Index::of(&old.blocks, |b| b.address);
    let after = Index::of(&new.blocks, |b| b.address);
    SegmentPatch {
        address: new.address,
        allocated_size: new.allocated_size,
        requested_size: new.requested_size,
        blocks: new
            .blocks
            .iter()
            .filter(|b| before.get(&old.blocks, b.address) != Some(b))
            .cloned()
            .collect(),
        removed_blocks: before.missing_from(&after).collect(),
    }
}

/// The delta that turns `old` into `new` (events aside: they travel in
/// their own batches).
pub fn diff(old: &Snapshot, new: &Snapshot, peaks: (u64, u64)) -> SnapshotDelta {
    let old_segments = Index::of(&old.segments, |s| s.address);
    let new_segments = Index::of(&new.segments, |s| s.address);
    let old_objects = Index::of(&old.objects, |o| o.id);
    let new_objects = Index::of(&new.objects, |o| o.id);
    SnapshotDelta {
        step: new.step,
        stats: new.stats.clone(),
        peak_allocated_bytes: peaks.0,
        peak_reserved_bytes: peaks.1,
        segments: new
            .segments
            .iter()
            .filter(|s| !old_segments.contains(s.address))
            .cloned()
            .collect(),
        patched_segments: new
            .segments
            .iter()
            .filter_map(|s| {
                let old = old_segments.get(&old.segments, s.address)?;
                (old != s).then(|| patch(old, s))
            })
            .collect(),
        removed_segments: old_segments.missing_from(&new_segments).collect(),
        objects: new
            .objects
            .iter()
            .filter(|o| old_objects.get(&old.objects, o.id) != Some(o))
            .cloned()
            .collect(),
        removed_objects: old_objects.missing_from(&new_objects).collect(),
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
        sort_by_u64(&mut seg.blocks, |b| b.address);
    }
    sort_by_u64(&mut snapshot.segments, |s| s.address);
    snapshot
        .objects
        .retain(|o| !delta.removed_objects.contains(&o.id));
    for obj in &delta.objects {
        match snapshot.objects.iter_mut().find(|o| o.id == obj.id) {
            Some(o) => *o = obj.clone(),
            None => snapshot.objects.push(obj.clone()),
        }
    }
    sort_by_u64(&mut snapshot.objects, |o| o.id);
}
