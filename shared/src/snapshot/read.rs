//! Snapshots and deltas read by hand, field by field (every change the page
//! shows comes as one, and serde's derived readers for them are kilobytes of
//! its download). As with the derived readers, fields not named here are
//! ignored; a delta's lists may be missing (they are not written empty).

use super::{Snapshot, SnapshotDelta};
use crate::fields::{self, Fields};
use serde::{Deserialize, Deserializer};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::diff;
    use crate::Engine;

    #[test]
    fn snapshots_and_deltas_read_back_as_written() {
        let mut e = Engine::new_simulated();
        let old = e.snapshot(10);
        assert!(
            e.run_line(r#"{"cmd":"alloc","name":"x","bytes":3000000}"#)
                .ok
        );
        let new = e.snapshot(10);
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(serde_json::from_str::<Snapshot>(&text).unwrap(), new);
        let delta = diff(&old, &new, e.take_sample_peaks());
        assert!(!delta.segments.is_empty() && delta.removed_objects.is_empty());
        let value = serde_json::to_value(&delta).unwrap();
        assert!(
            value.get("removed_objects").is_none(),
            "empty lists are not written"
        );
        assert_eq!(SnapshotDelta::deserialize(value.clone()).unwrap(), delta);
        let mut value = value;
        value.as_object_mut().unwrap().remove("stats");
        let e = SnapshotDelta::deserialize(value).unwrap_err();
        assert_eq!(e.to_string(), "missing field `stats`");
    }
}
