//! Snapshots of an engine's process and the deltas between them, as the
//! page receives them (`snapshot::diff`, `snapshot::apply`, their readers).

use crate::snapshot::*;
use crate::Engine;
use serde::Deserialize;

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
