//! Files that share one list or dict through the pickle's memo, or carry
//! records of a million fields: refused once they decode to more than
//! twice the file's size, in bounded time and memory.

use super::decode::{MAX_BLOCKS, MAX_FIELDS};
use super::*;
use std::sync::Arc;

/// Refused as more than its size holds: as it is read or as it is decoded.
fn refused_for_its_size(file: &[u8]) {
    let err = read(file).unwrap_err().to_string();
    let said = ["than its size holds unshared", "more than twice its size"];
    assert!(said.iter().any(|s| err.contains(s)), "{err}");
}

/// `BINUNICODE`.
fn text(s: &str) -> Vec<u8> {
    let mut out = vec![b'X'];
    out.extend((s.len() as u32).to_le_bytes());
    out.extend(s.as_bytes());
    out
}

/// `BINPUT slot` / `BINGET slot`.
fn put(slot: u8) -> [u8; 2] {
    [b'q', slot]
}
fn get(slot: u8) -> [u8; 2] {
    [b'h', slot]
}

/// A list (`EMPTY_LIST`, memo `slot`) of `n` items: `item`'s bytes, then
/// `n - 1` times the memo's copy of it (`item_slot`).
fn shared_list(slot: u8, item: &[u8], item_slot: u8, n: usize) -> Vec<u8> {
    let mut out = vec![b']'];
    out.extend(put(slot));
    out.push(b'(');
    out.extend(item);
    out.extend(put(item_slot));
    for _ in 1..n {
        out.extend(get(item_slot));
    }
    out.push(b'e');
    out
}

/// `{"action": "alloc", "size": 512, "frames": frames}`.
fn entry(frames: &[u8]) -> Vec<u8> {
    let mut out = vec![b'}', b'('];
    out.extend(text("action"));
    out.extend(text("alloc"));
    out.extend(text("size"));
    out.extend(b"M\x00\x02");
    out.extend(text("frames"));
    out.extend(frames);
    out.push(b'u');
    out
}

/// `{"segments": [], "device_traces": traces}` as a pickle.
fn snapshot_of(traces: &[u8]) -> Vec<u8> {
    let mut out = b"\x80\x02}(".to_vec();
    out.extend(text("segments"));
    out.push(b']');
    out.extend(text("device_traces"));
    out.extend(traces);
    out.extend(b"u.");
    out
}

/// 30,000 device traces that are one memoised list of 4,000 entries: 120
/// million events from 70 KB. They were all expanded before the event
/// limit was checked (4 GiB, then an abort, for 10^8); now no more than
/// the file holds unshared are made.
#[test]
fn events_shared_through_the_memo_stop_at_the_files_share() {
    let trace = shared_list(2, &entry(b"]"), 3, 4_000);
    let mut traces = vec![b']', b'('];
    traces.extend(&trace);
    traces.extend(put(1));
    for _ in 1..30_000 {
        traces.extend(get(1));
    }
    traces.push(b'e');
    let file = snapshot_of(&traces);
    assert!(file.len() < 100_000, "{} bytes", file.len());
    refused_for_its_size(&file);
}

/// 40,001 segments that are one memoised dict with a list of 100 blocks:
/// refused once the file's share of blocks is made.
#[test]
fn blocks_shared_through_the_memo_stop_at_the_files_share() {
    let mut block = vec![b'}', b'('];
    block.extend(text("address"));
    block.extend(b"K\x00");
    block.extend(text("size"));
    block.extend(b"K\x00");
    block.extend(text("state"));
    block.extend(text("inactive"));
    block.push(b'u');
    let mut segment = vec![b'}', b'('];
    for field in ["address", "total_size"] {
        segment.extend(text(field));
        segment.extend(b"K\x00");
    }
    segment.extend(text("blocks"));
    segment.extend(shared_list(4, &block, 5, 100));
    segment.push(b'u');
    let segments = shared_list(6, &segment, 7, MAX_BLOCKS / 100 + 1);
    let mut file = b"\x80\x02}(".to_vec();
    file.extend(text("segments"));
    file.extend(segments);
    file.extend(b"u.");
    refused_for_its_size(&file);
}

/// A record of a million fields, shared a thousand times: each field was
/// looked up among all of them (35 s of CPU for 4 MB). Refused as it is
/// read (its fields alone take more than twice the file), and a record of
/// more fields than any snapshot's, shared, where it is decoded.
#[test]
fn records_of_a_million_fields_are_refused() {
    let wide_record = |fields: u32| {
        let mut wide = vec![b'}', b'('];
        for i in 0..fields {
            wide.push(b'J');
            wide.extend(i.to_le_bytes());
            wide.push(b'N');
        }
        wide.extend(text("action"));
        wide.extend(text("alloc"));
        wide.push(b'u');
        let trace = shared_list(2, &wide, 3, 1_000);
        let mut traces = vec![b']', b'('];
        traces.extend(trace);
        traces.push(b'e');
        snapshot_of(&traces)
    };
    let started = std::time::Instant::now();
    let err = read(&wide_record(1_000_000)).unwrap_err().to_string();
    assert!(err.contains("more than twice its size"), "{err}");
    let err = read(&wide_record(1_000)).unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "a trace entry has 1001 fields; a snapshot's records have at most {MAX_FIELDS}"
        )),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

/// Entries that share one list of frames share one stack: its frames
/// are held once, however many entries refer to it.
#[test]
fn frames_shared_through_the_memo_are_held_once() {
    let mut frame = vec![b'}', b'('];
    frame.extend(text("filename"));
    frame.extend(text("train.py"));
    frame.extend(text("line"));
    frame.extend(b"K\x07");
    frame.push(b'u');
    let frames = shared_list(4, &frame, 5, 10);
    let trace = shared_list(2, &entry(&frames), 3, 50);
    let mut traces = vec![b']', b'('];
    traces.extend(trace);
    traces.push(b'e');
    let s = read(&snapshot_of(&traces)).unwrap();
    let trace = &s.device_traces[0];
    assert_eq!(trace.len(), 50);
    assert!(trace.iter().all(|e| e.frames.len() == 10));
    assert!(trace
        .iter()
        .all(|e| Arc::ptr_eq(&e.frames, trace.frames(0))));
    assert_eq!(&*trace.frames(0)[0].filename, "train.py");
    assert_eq!(trace.frames(0)[0].line, 7);
}

/// Segments written in the fewest bytes a pickle can (14 each, a fifth
/// of what PyTorch writes): each a record of its own, held within the
/// bound its records give, and no more.
#[test]
fn the_fewest_bytes_a_segment_takes_stay_within_its_records_bound() {
    let mut segments = vec![b']', b'('];
    segments.extend(b"}(");
    segments.extend(text("address"));
    segments.extend(put(1));
    segments.extend(b"K\x00");
    segments.extend(text("total_size"));
    segments.extend(put(2));
    segments.extend(b"K\x01");
    segments.extend(text("blocks"));
    segments.extend(put(3));
    segments.extend(b"]u");
    for i in 1..100_000 {
        // Appended a thousand at a time, as Python's pickler batches them.
        if i % 1000 == 0 {
            segments.extend(b"e(");
        }
        segments.extend(b"}(");
        segments.extend(get(1));
        segments.extend(b"K\x00");
        segments.extend(get(2));
        segments.extend(b"K\x01");
        segments.extend(get(3));
        segments.extend(b"]u");
    }
    segments.push(b'e');
    let mut file = b"\x80\x02}(".to_vec();
    file.extend(text("segments"));
    file.extend(segments);
    file.extend(b"u.");
    let (snapshot, records) = read_counted(&file);
    assert_eq!(snapshot.unwrap().segments.len(), 100_000);
    assert_eq!((records.segments, records.blocks), (100_000, 0));
    assert!(read_bound(file.len(), &records) < 32 * file.len() + (4 << 20));
}
