//! Snapshots and deltas read by hand, field by field (every change the page
//! shows comes as one, and serde's derived readers for them are kilobytes of
//! its download). As with the derived readers, fields not named here are
//! ignored; a delta's lists may be missing (they are not written empty).

use super::{Snapshot, SnapshotDelta};
use serde::{Deserialize, Deserializer};
use vramlab_core::fields::{self, Fields};

impl<'de> Deserialize<'de> for Snapshot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fields::read(d, snapshot)
    }
}

fn snapshot(f: &mut Fields) -> Result<Snapshot, serde_json::Error> {
    Ok(Snapshot {
        step: f.take("step")?,
        framework: f.take("framework")?,
        device: f.take("device")?,
        stats: f.take("stats")?,
        segments: f.take("segments")?,
        objects: f.take("objects")?,
        events: f.take("events")?,
    })
}

impl<'de> Deserialize<'de> for SnapshotDelta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fields::read(d, delta)
    }
}

fn delta(f: &mut Fields) -> Result<SnapshotDelta, serde_json::Error> {
    Ok(SnapshotDelta {
        step: f.take("step")?,
        stats: f.take("stats")?,
        peak_allocated_bytes: f.take("peak_allocated_bytes")?,
        peak_reserved_bytes: f.take("peak_reserved_bytes")?,
        segments: f.take_or("segments", Vec::new())?,
        patched_segments: f.take_or("patched_segments", Vec::new())?,
        removed_segments: f.take_or("removed_segments", Vec::new())?,
        objects: f.take_or("objects", Vec::new())?,
        removed_objects: f.take_or("removed_objects", Vec::new())?,
    })
}
