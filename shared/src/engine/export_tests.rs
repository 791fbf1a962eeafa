//! A session's memory written as PyTorch's snapshot and read back by the
//! snapshot reader: the export replays exactly as the session ran.

use crate::torch_snapshot::replay::{replay_exact, replay_what_if};
use crate::torch_snapshot::stream::PickleStream;
use crate::torch_snapshot::what_if::parse_what_if;
use crate::torch_snapshot::{self, *};
use crate::units::MIB;
use crate::Engine;

/// A vramlab session exported and replayed: every placement as the
/// session made it, the same segments at the end.
#[test]
fn an_export_replays_exactly_as_the_session_ran() {
    let mut e = Engine::new_simulated();
    for line in [
        r#"{"cmd":"alloc","name":"a","bytes":6000000}"#,
        r#"{"cmd":"alloc","name":"b","bytes":300}"#,
        r#"{"cmd":"alloc","name":"c","bytes":30000000}"#,
        r#"{"cmd":"del","name":"a"}"#,
        r#"{"cmd":"alloc","name":"d","bytes":2000000}"#,
        r#"{"cmd":"del","name":"c"}"#,
        r#"{"cmd":"empty_cache"}"#,
        r#"{"cmd":"alloc","name":"e","bytes":100000000}"#,
    ] {
        assert!(e.run_line(line).ok, "{line}");
    }
    let session = e.snapshot(usize::MAX);
    let exported = export::from_session(&session);
    let read_back = read(&write_pickle(&exported)).unwrap();
    assert_eq!(read_back, exported);
    // Streamed, as the command line writes it: the same snapshot.
    let mut streamed = Vec::new();
    write_pickle_to(&exported, &mut streamed).unwrap();
    assert_eq!(read(&streamed).unwrap(), exported);
    let run = replay_exact(&read_back, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
    let ends: Vec<(u64, u64)> = run
        .segments
        .iter()
        .map(|s| (s.address, s.total_size))
        .collect();
    let had: Vec<(u64, u64)> = session
        .segments
        .iter()
        .map(|s| (s.address, s.total_size))
        .collect();
    assert_eq!(ends, had);
    let owner = &exported
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.state.is_active())
        .unwrap()
        .frames[0];
    assert!(
        owner.name.starts_with('b') || owner.name.starts_with('d') || owner.name.starts_with('e'),
        "{owner:?}"
    );
    let json = serde_json::to_vec(&exported).unwrap();
    assert_eq!(read(&json).unwrap(), exported);
}

/// An out-of-memory error exported as memory_viz reads it: `oom` with the
/// request's size and the driver's free bytes as `device_free`.
#[test]
fn an_exported_oom_carries_the_free_bytes() {
    let mut e = Engine::new_simulated();
    let r = e.run_line(r#"{"cmd":"alloc","name":"x","bytes":1099511627776}"#);
    assert!(!r.ok);
    let free = r.stats.device_total_bytes - r.stats.device_used_bytes;
    let exported = export::from_session(&e.snapshot(usize::MAX));
    let oom = exported.device_traces[0]
        .iter()
        .find(|t| t.action == Action::Oom)
        .unwrap();
    assert_eq!(oom.device_free, Some(free));
    assert_eq!(oom.size, 1 << 40);
}

/// A session run with expandable segments, written as PyTorch writes one:
/// mapped and unmapped pages, expandable ranges, the settings; it replays
/// exactly, and from its middle too.
#[test]
fn an_expandable_session_is_exported_with_its_mappings() {
    let mut e = Engine::new_simulated();
    let lines = [
        r#"{"cmd":"restart","framework":"pytorch","expandable_segments":true}"#,
        r#"{"cmd":"alloc","name":"a","bytes":50000000}"#,
        r#"{"cmd":"alloc","name":"b","bytes":30000000}"#,
        r#"{"cmd":"del","name":"a"}"#,
        r#"{"cmd":"empty_cache"}"#,
        r#"{"cmd":"alloc","name":"c","bytes":1000}"#,
        r#"{"cmd":"alloc","name":"d","bytes":70000000}"#,
    ];
    for line in lines {
        assert!(e.run_line(line).ok, "{line}");
    }
    let s = export::with_expandable_segments(export::from_session(&e.snapshot(usize::MAX)));
    let actions: Vec<Action> = s.trace(0).iter().map(|t| t.action).collect();
    assert!(actions.contains(&Action::SegmentMap) && actions.contains(&Action::SegmentUnmap));
    assert!(!actions.contains(&Action::SegmentAlloc));
    assert!(s.segments.iter().all(|s| s.is_expandable));
    assert_eq!(replay_exact(&s, 0).unwrap().exact, Some(true));
    for start in 1..actions.len() {
        let w = window::window(&s, 0, start..actions.len()).unwrap();
        let run = replay_exact(&w, 0).unwrap();
        assert_eq!(
            run.exact,
            Some(true),
            "from {start}: {:?}",
            run.first_difference
        );
    }
}

/// A session's releases exported with the stack PyTorch gives them: the
/// request's own for its release-and-retry, `empty_cache()`'s for the
/// program's call; a what-if repeats the second only.
#[test]
fn an_exported_release_carries_its_cause() {
    let mut e = Engine::new_simulated();
    for line in [
        r#"{"cmd":"restart","framework":"pytorch","device_total_bytes":67108864,"context_bytes":0}"#,
        r#"{"cmd":"alloc","name":"a","bytes":41943040}"#,
        r#"{"cmd":"del","name":"a"}"#,
        r#"{"cmd":"alloc","name":"b","bytes":52428800}"#,
        r#"{"cmd":"del","name":"b"}"#,
        r#"{"cmd":"empty_cache"}"#,
        r#"{"cmd":"alloc","name":"c","bytes":10485760}"#,
    ] {
        assert!(e.run_line(line).ok, "{line}");
    }
    let s = export::from_session(&e.snapshot(usize::MAX));
    let trace = s.trace(0);
    let released: Vec<String> = (0..trace.len())
        .filter(|&i| trace.action(i) == Action::SegmentFree)
        .map(|i| trace.frames(i)[0].name.to_string())
        .collect();
    assert_eq!(released, ["b", "torch.cuda.empty_cache()"]);
    let made: Vec<String> = (0..trace.len())
        .filter(|&i| trace.action(i) == Action::SegmentAlloc)
        .map(|i| trace.frames(i)[0].name.to_string())
        .collect();
    assert_eq!(made, ["a", "b", "c"]);
    assert_eq!(replay_exact(&s, 0).unwrap().exact, Some(true));
    // On a larger GPU the retry is not needed, the program's call is.
    let larger = replay_what_if(&s, 0, &parse_what_if("gpu=t4").unwrap()).unwrap();
    let last = larger.timeline.last().unwrap();
    assert_eq!(last.reserved_bytes, 10 * MIB);
}

/// `bytes` streamed in chunks of `size`.
fn streamed(bytes: &[u8], size: usize) -> Result<MemorySnapshot, SnapshotError> {
    let mut s = PickleStream::new(bytes.len())?;
    let chunks: Vec<&[u8]> = bytes.chunks(size.max(1)).collect();
    for (i, c) in chunks.iter().enumerate() {
        s.scan(c, i + 1 == chunks.len())?;
    }
    for (i, c) in chunks.iter().enumerate() {
        s.read(c, i + 1 == chunks.len())?;
    }
    s.finish()
}

/// A session's export, read whole and streamed in chunks of every size
/// from one byte: the same snapshot.
#[test]
fn a_pickle_streamed_in_chunks_of_any_size_reads_as_it_does_whole() {
    let mut engine = Engine::new_simulated();
    for line in [
        r#"{"cmd":"model","name":"m","layers":2,"width":64}"#,
        r#"{"cmd":"data","name":"d"}"#,
        r#"{"cmd":"optimizer","name":"o","model":"m","kind":"adam"}"#,
        r#"{"cmd":"train","model":"m","optimizer":"o","data":"d","steps":2}"#,
    ] {
        assert!(engine.run_line(line).ok, "{line}");
    }
    let bytes = torch_snapshot::write_pickle(&torch_snapshot::export::from_session(
        &engine.snapshot(usize::MAX),
    ));
    let whole = torch_snapshot::read(&bytes).unwrap();
    for size in [1, 2, 3, 7, 64, 1000, 4096, bytes.len()] {
        assert_eq!(streamed(&bytes, size).unwrap(), whole, "chunks of {size}");
    }
}

/// A truncated pickle, a broken one and a file that names code: the
/// same refusals streamed as read whole.
#[test]
fn a_streamed_pickle_is_refused_as_a_whole_one_is() {
    let mut engine = Engine::new_simulated();
    assert!(
        engine
            .run_line(r#"{"cmd":"alloc","name":"x","bytes":1024}"#)
            .ok
    );
    let bytes = torch_snapshot::write_pickle(&torch_snapshot::export::from_session(
        &engine.snapshot(usize::MAX),
    ));
    let cut = &bytes[..bytes.len() / 2];
    let code = b"\x80\x02cos\nsystem\n.".to_vec();
    for bad in [cut, &code[..], &b"\x80\x02(]q\x00h\x07."[..]] {
        let whole = torch_snapshot::read(bad).unwrap_err();
        for size in [1, 5, bad.len()] {
            assert_eq!(streamed(bad, size).unwrap_err(), whole, "chunks of {size}");
        }
    }
}
