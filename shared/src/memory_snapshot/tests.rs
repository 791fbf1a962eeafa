//! Snapshot reading, replay and export, on snapshots built from the format
//! as PyTorch defines it.

use super::replay::{parse_what_if, replay_exact, replay_what_if};
use super::*;
use crate::units::{GIB, MIB};
use crate::Engine;

/// `pickle.dumps(snapshot, protocol=4)` by CPython 3.11 of a one-segment
/// snapshot (a 1,000-byte tensor in a small segment): FRAME, MEMOIZE and
/// BINGET (the frames list is one object shared by a block and two trace
/// entries; every repeated key is a memo reference).
const PYTHON_PICKLE: &str = concat!(
    "8004952b030000000000007d94288c087365676d656e7473945d947d94288c06646576696365944b008c0761",
    "646472657373948a060000000000018c0a746f74616c5f73697a65944a000020008c0e616c6c6f6361746564",
    "5f73697a65944d00048c0b6163746976655f73697a65944d00048c0e7265717565737465645f73697a65944d",
    "e8038c0673747265616d944b008c0c7365676d656e745f74797065948c05736d616c6c948c0f7365676d656e",
    "745f706f6f6c5f6964944b004b0086948c0d69735f657870616e6461626c6594898c066672616d6573945d94",
    "8c06626c6f636b73945d94287d942868058a060000000000018c0473697a65944d000468094de8038c057374",
    "617465948c106163746976655f616c6c6f63617465649468105d947d94288c0866696c656e616d65948c0874",
    "7261696e2e7079948c046c696e65944b0c8c046e616d65948c07666f7277617264947561757d942868058a06",
    "00040000000168154a00fc1f0068094b0068168c08696e6163746976659468105d94756575618c0d64657669",
    "63655f747261636573945d945d94287d94288c06616374696f6e948c0d7365676d656e745f616c6c6f63948c",
    "0461646472948a0600000000000168154a00002000680a4b008c0774696d655f7573944b0168106818757d94",
    "2868268c05616c6c6f639468288a0600000000000168154de803680a4b0068294b02681068187565618c1261",
    "6c6c6f6361746f725f73657474696e6773947d94288c175059544f5243485f435544415f414c4c4f435f434f",
    "4e46948c00948c0e6d61785f73706c69745f73697a65944affffffff8c1c676172626167655f636f6c6c6563",
    "74696f6e5f7468726573686f6c64944700000000000000008c13657870616e6461626c655f7365676d656e74",
    "7394898c18726f756e6475705f706f776572325f6469766973696f6e73947d94288c0131944b008c0132944b",
    "008c0134944b008c0138944b008c023136944b008c023332944b008c023634944b008c03313238944b008c03",
    "323536944b008c03353132944b008c0431303234944b008c0432303438944b008c0434303936944b008c0438",
    "313932944b008c053136333834944b008c053332373638944b007575752e",
);

fn bytes_of(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn a_pickle_written_by_python_reads_with_its_shared_objects() {
    let s = read(&bytes_of(PYTHON_PICKLE)).unwrap();
    assert_eq!(s.segments.len(), 1);
    let seg = &s.segments[0];
    assert_eq!((seg.address, seg.total_size), (1 << 40, 2 * MIB));
    assert_eq!(seg.segment_type, "small");
    assert_eq!(seg.blocks[0].state, BlockState::ActiveAllocated);
    assert_eq!(seg.blocks[0].frames[0].name, "forward");
    assert_eq!(seg.blocks[1].size, 2 * MIB - 1024);
    let trace = &s.device_traces[0];
    assert_eq!(trace[1].action, Action::Alloc);
    assert_eq!(trace[1].frames, seg.blocks[0].frames);
    assert_eq!(trace[1].time_us, Some(2));
    let settings = s.allocator_settings.unwrap();
    assert_eq!(settings.max_split_size, -1);
    assert_eq!(settings.roundup_power2_divisions.len(), 16);
}

#[test]
fn a_pickle_that_names_code_is_refused_and_nothing_runs() {
    // pickle.dumps of os.system("ls") by reference: GLOBAL then REDUCE.
    let evil = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
    let err = read(evil).unwrap_err().to_string();
    assert!(err.contains("refers to Python code or classes"), "{err}");
    assert!(err.contains("opcode 0x63 at byte 2"), "{err}");
}

#[test]
fn broken_files_say_what_is_wrong() {
    let whole = bytes_of(PYTHON_PICKLE);
    let err = read(&whole[..whole.len() / 2]).unwrap_err().to_string();
    assert!(err.contains("truncated"), "{err}");
    let err = read(b"GIF89a").unwrap_err().to_string();
    assert!(err.contains("not a PyTorch memory snapshot"), "{err}");
    // A list that holds itself (`l = []; l.append(l)`): read only as deep
    // as the snapshot's types go, then refused.
    let err = read(b"\x80\x04]\x94h\x00a.").unwrap_err().to_string();
    assert!(err.contains("not a memory snapshot: invalid type"), "{err}");
    let err = read(br#"{"segments": 5}"#).unwrap_err().to_string();
    assert!(err.contains("JSON is not a memory snapshot"), "{err}");
    let too_big = vec![0x80u8; MAX_FILE_BYTES + 1];
    assert!(read(&too_big)
        .unwrap_err()
        .to_string()
        .contains("up to 256 MB"));
}

fn block(address: u64, size: u64, requested: u64, state: BlockState) -> Block {
    Block {
        address,
        size,
        requested_size: requested,
        state,
        frames: Vec::new(),
    }
}

fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry {
        action,
        addr,
        size,
        stream: 0,
        device_free: None,
        time_us: None,
        frames: Vec::new(),
    }
}

const BASE: u64 = 0x7f00_0000_0000;

/// A run recorded from the process's start: a 20 MiB segment for small
/// requests, a 16 MiB one of its own for a 16 MiB tensor; a request that
/// fits the cache goes to the smallest free block.
fn recorded_from_start() -> MemorySnapshot {
    use Action::*;
    let trace = vec![
        entry(SegmentAlloc, BASE, 20 * MIB),
        entry(Alloc, BASE, 4 * MIB),
        entry(Alloc, BASE + 4 * MIB, 6 * MIB),
        entry(SegmentAlloc, BASE + 20 * MIB, 16 * MIB),
        entry(Alloc, BASE + 20 * MIB, 16 * MIB),
        entry(FreeRequested, BASE, 4 * MIB),
        entry(FreeCompleted, BASE, 4 * MIB),
        entry(Alloc, BASE, 3 * MIB),
    ];
    use BlockState::*;
    let segment = |address, total_size, blocks| Segment {
        address,
        total_size,
        blocks,
        segment_type: "large".into(),
        ..Segment::default()
    };
    MemorySnapshot {
        segments: vec![
            segment(
                BASE,
                20 * MIB,
                vec![
                    // 1 MiB left over is not split off (`should_split`).
                    block(BASE, 4 * MIB, 3 * MIB, ActiveAllocated),
                    block(BASE + 4 * MIB, 6 * MIB, 6 * MIB, ActiveAllocated),
                    block(BASE + 10 * MIB, 10 * MIB, 0, Inactive),
                ],
            ),
            segment(
                BASE + 20 * MIB,
                16 * MIB,
                vec![block(BASE + 20 * MIB, 16 * MIB, 16 * MIB, ActiveAllocated)],
            ),
        ],
        device_traces: vec![trace],
        allocator_settings: None,
    }
}

#[test]
fn a_recording_replays_exactly_and_a_wrong_placement_is_named() {
    let s = recorded_from_start();
    let run = replay_exact(&s, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
    assert_eq!(run.peak_reserved_bytes, 36 * MIB);
    assert_eq!(run.peak_allocated_bytes, 26 * MIB);
    assert_eq!(run.timeline.len(), 8);
    assert_eq!(run.timeline[7].allocated_bytes, 26 * MIB);
    // The trace says the 3 MiB request went to the first segment's 10 MiB
    // tail: the allocator's best fit is the 4 MiB hole at the base.
    let mut moved = s.clone();
    moved.device_traces[0][7].addr = BASE + 10 * MIB;
    moved.segments[0].blocks = vec![
        block(BASE, 4 * MIB, 0, BlockState::Inactive),
        block(
            BASE + 4 * MIB,
            6 * MIB,
            6 * MIB,
            BlockState::ActiveAllocated,
        ),
        block(
            BASE + 10 * MIB,
            3 * MIB,
            3 * MIB,
            BlockState::ActiveAllocated,
        ),
        block(BASE + 13 * MIB, 7 * MIB, 0, BlockState::Inactive),
    ];
    let run = replay_exact(&moved, 0).unwrap();
    assert_eq!(run.exact, Some(false));
    let d = run.first_difference.unwrap();
    assert_eq!(d.event, 7);
    assert_eq!(
        d.trace,
        format!(
            "alloc of {} bytes: a cached block at {:#x}",
            3 * MIB,
            BASE + 10 * MIB
        )
    );
    assert_eq!(d.engine, format!("a cached block at {BASE:#x}"));
}

/// The same run recorded from its third event on: the state at the first
/// event (one segment, two live blocks) comes from undoing the trace.
#[test]
fn a_recording_that_starts_mid_run_is_rebuilt_then_replayed() {
    let mut s = recorded_from_start();
    s.device_traces[0].drain(..3);
    let state = initial::initial_state(&s, 0).unwrap();
    assert_eq!(state.segments.len(), 1);
    let first = &state.segments[&BASE];
    let live: Vec<_> = first
        .blocks
        .iter()
        .map(|(&a, &(size, _))| (a, size))
        .collect();
    assert_eq!(live, vec![(BASE, 4 * MIB), (BASE + 4 * MIB, 6 * MIB)]);
    let run = replay_exact(&s, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
    // A free of a block the segment list never had contradicts it.
    s.device_traces[0][3].addr = BASE + 50 * MIB;
    let err = initial::initial_state(&s, 0).unwrap_err().to_string();
    assert!(
        err.starts_with("the trace contradicts its segment list at event 3 (free_completed"),
        "{err}"
    );
    assert!(err.ends_with("no segment holds that address"), "{err}");
}

#[test]
fn what_if_runs_the_same_requests_under_other_settings() {
    let s = recorded_from_start();
    // 30 MiB of GPU: the 16 MiB segment does not fit beside the first.
    let small = parse_what_if("device_total_bytes=31457280,context_bytes=0").unwrap();
    let run = replay_what_if(&s, 0, &small).unwrap();
    assert_eq!(run.ooms.len(), 1);
    assert_eq!(run.ooms[0].event, 4);
    assert_eq!(run.ooms[0].requested_bytes, 16 * MIB);
    assert_eq!(run.peak_reserved_bytes, 20 * MIB);
    // Expandable segments map whole 20 MiB pages: 26 MiB of tensors take
    // two, 40 MiB, more than the 36 MiB of the two segments.
    let expandable = parse_what_if("expandable_segments=true").unwrap();
    let run = replay_what_if(&s, 0, &expandable).unwrap();
    assert!(run.ooms.is_empty());
    assert_eq!(run.peak_allocated_bytes, 26 * MIB);
    assert_eq!(run.peak_reserved_bytes, 40 * MIB);
    assert!(parse_what_if("nonsense=1")
        .unwrap_err()
        .to_string()
        .contains("nonsense"));
    assert!(parse_what_if("expandable_segments")
        .unwrap_err()
        .to_string()
        .contains("key=value"));
    let list = parse_what_if("roundup_power2_divisions=[256:1,>:8],gpu=t4").unwrap();
    assert_eq!(list.roundup_power2_divisions.unwrap().for_size(GIB), 8);
}

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
