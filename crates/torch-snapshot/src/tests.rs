//! Snapshot reading, replay and export, on snapshots built from the format
//! as PyTorch defines it.

use super::replay::{replay_exact, replay_what_if, Fragmentation};
use super::what_if::parse_what_if;
use super::*;
use vramlab_core::units::{GIB, MIB};

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

/// The same snapshot as `pickle.dumps(snapshot, protocol=2)`: BINPUT and
/// BINGET instead of MEMOIZE, no FRAME.
const PYTHON_PICKLE_2: &str = concat!(
    "80027d71002858080000007365676d656e747371015d71027d710328580600000064657669636571044b0058",
    "070000006164647265737371058a06000000000001580a000000746f74616c5f73697a6571064a0000200058",
    "0e000000616c6c6f63617465645f73697a6571074d0004580b0000006163746976655f73697a6571084d0004",
    "580e0000007265717565737465645f73697a6571094de803580600000073747265616d710a4b00580c000000",
    "7365676d656e745f74797065710b5805000000736d616c6c710c580f0000007365676d656e745f706f6f6c5f",
    "6964710d4b004b0086710e580d00000069735f657870616e6461626c65710f8958060000006672616d657371",
    "105d71115806000000626c6f636b7371125d7113287d71142868058a06000000000001580400000073697a65",
    "71154d000468094de80358050000007374617465711658100000006163746976655f616c6c6f636174656471",
    "1768105d71187d711928580800000066696c656e616d65711a5808000000747261696e2e7079711b58040000",
    "006c696e65711c4b0c58040000006e616d65711d5807000000666f7277617264711e7561757d711f2868058a",
    "0600040000000168154a00fc1f0068094b0068165808000000696e616374697665712068105d712175657561",
    "580d0000006465766963655f74726163657371225d71235d7124287d7125285806000000616374696f6e7126",
    "580d0000007365676d656e745f616c6c6f63712758040000006164647271288a0600000000000168154a0000",
    "2000680a4b00580700000074696d655f757371294b0168106818757d712a2868265805000000616c6c6f6371",
    "2b68288a0600000000000168154de803680a4b0068294b02681068187565615812000000616c6c6f6361746f",
    "725f73657474696e6773712c7d712d2858170000005059544f5243485f435544415f414c4c4f435f434f4e46",
    "712e5800000000712f580e0000006d61785f73706c69745f73697a6571304affffffff581c00000067617262",
    "6167655f636f6c6c656374696f6e5f7468726573686f6c647131470000000000000000581300000065787061",
    "6e6461626c655f7365676d656e74737132895818000000726f756e6475705f706f776572325f646976697369",
    "6f6e7371337d71342858010000003171354b0058010000003271364b0058010000003471374b005801000000",
    "3871384b005802000000313671394b0058020000003332713a4b0058020000003634713b4b00580300000031",
    "3238713c4b005803000000323536713d4b005803000000353132713e4b00580400000031303234713f4b0058",
    "040000003230343871404b0058040000003430393671414b0058040000003831393271424b00580500000031",
    "3633383471434b005805000000333237363871444b007575752e",
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
    assert_eq!(&*seg.blocks[0].frames[0].name, "forward");
    assert_eq!(seg.blocks[1].size, 2 * MIB - 1024);
    let second = s.device_traces[0].get(1).unwrap();
    assert_eq!(second.action, Action::Alloc);
    assert_eq!(second.frames, seg.blocks[0].frames);
    assert_eq!(second.time_us, Some(2));
    let settings = s.allocator_settings.clone().unwrap();
    assert_eq!(settings.max_split_size, -1);
    assert_eq!(settings.roundup_power2_divisions.len(), 16);
    assert_eq!(read(&bytes_of(PYTHON_PICKLE_2)).unwrap(), s);
}

/// Deep stacks keep their innermost frames only.
#[test]
fn an_entry_keeps_its_first_32_frames() {
    let frame = |i: i64| Frame {
        filename: "model.py".into(),
        line: i,
        name: "forward".into(),
    };
    let mut s = recorded_from_start();
    edit(&mut s, |t| t[1].frames = (0..40).map(frame).collect());
    let back = read(&write_pickle(&s)).unwrap();
    let kept = back.device_traces[0].frames(1);
    assert_eq!(kept.len(), format::MAX_FRAMES);
    assert_eq!(kept[31], frame(31));
}

#[test]
fn a_pickle_that_names_code_is_refused_and_nothing_runs() {
    // pickle.dumps of os.system("ls") by reference: GLOBAL then REDUCE.
    let evil = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
    let err = read(evil).unwrap_err().to_string();
    assert!(err.contains("refers to Python code or classes"), "{err}");
    assert!(err.contains("opcode 0x63 at byte 2"), "{err}");
}

/// A value nested as deep as a file has opcodes (a million one-item tuples
/// in 1 MB, or a million lists each appended into the last through the
/// memo) is refused and dropped without recursing: it used to overflow the
/// stack (the CLI aborted; the page threw "Maximum call stack size
/// exceeded").
#[cfg(feature = "teardown")]
#[test]
fn a_million_nested_containers_are_refused_without_overflowing_the_stack() {
    let n = 1_000_000;
    // NONE, then TUPLE1 a million times.
    let mut tuples = b"\x80\x02N".to_vec();
    tuples.extend(std::iter::repeat_n(0x85u8, n));
    tuples.push(b'.');
    // EMPTY_LIST, BINPUT 1; then a million times EMPTY_LIST, BINPUT 1,
    // APPEND (into the list below), BINGET 1 (the new list on top).
    let mut lists = b"\x80\x02]q\x01".to_vec();
    for _ in 0..n {
        lists.extend_from_slice(b"]q\x01ah\x01");
    }
    lists.push(b'.');
    for (name, input) in [("tuples", tuples), ("lists", lists)] {
        let err = read(&input).unwrap_err().to_string();
        let refused = ["not a memory snapshot", "more than twice its size"];
        assert!(refused.iter().any(|r| err.contains(r)), "{name}: {err}");
    }
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
    let limit = format!("up to {} MB", MAX_FILE_BYTES >> 20);
    assert!(check_size(MAX_FILE_BYTES + 1)
        .unwrap_err()
        .to_string()
        .contains(&limit));
    assert!(check_size(MAX_FILE_BYTES).is_ok());
}

fn block(address: u64, size: u64, requested: u64, state: BlockState) -> Block {
    Block {
        address,
        size,
        requested_size: requested,
        state,
        frames: Stack::default(),
    }
}

fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry {
        addr,
        size,
        ..TraceEntry::new(action)
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
        device_traces: vec![trace.into()],
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
    edit(&mut moved, |t| t[7].addr = BASE + 10 * MIB);
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

/// A block allocated before the recording began kept the rest of the free
/// block it came from (half a MiB: too small to split off), so the next
/// allocation starts half a MiB past its request. Its size is read from
/// where that allocation starts (a real recording of a training step
/// differed at its 179th event without this).
#[test]
fn a_block_from_before_the_recording_ends_where_the_next_allocation_starts() {
    let half = MIB / 2;
    let segment = Segment {
        address: BASE,
        total_size: 20 * MIB,
        blocks: vec![
            block(BASE, 4 * MIB + half, 0, BlockState::Inactive),
            block(
                BASE + 4 * MIB + half,
                8 * MIB,
                8 * MIB,
                BlockState::ActiveAllocated,
            ),
            block(
                BASE + 12 * MIB + half,
                7 * MIB + half,
                0,
                BlockState::Inactive,
            ),
        ],
        ..Segment::default()
    }
    .summed();
    let s = MemorySnapshot {
        segments: vec![segment],
        device_traces: vec![vec![
            entry(Action::Alloc, BASE + 4 * MIB + half, 8 * MIB),
            entry(Action::FreeRequested, BASE, 4 * MIB),
            entry(Action::FreeCompleted, BASE, 4 * MIB),
        ]
        .into()],
        allocator_settings: None,
    };
    let state = initial::initial_state(&s, 0).unwrap();
    let live: Vec<_> = (state.segments[&BASE].blocks.iter())
        .map(|(&a, &(size, _))| (a, size))
        .collect();
    assert_eq!(live, vec![(BASE, 4 * MIB + half)]);
    let run = replay_exact(&s, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
}

/// The same run recorded from its third event on: the state at the first
/// event (one segment, two live blocks) comes from undoing the trace.
#[test]
fn a_recording_that_starts_mid_run_is_rebuilt_then_replayed() {
    let mut s = recorded_from_start();
    edit(&mut s, |t| _ = t.drain(..3));
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
    edit(&mut s, |t| t[3].addr = BASE + 50 * MIB);
    let err = initial::initial_state(&s, 0).unwrap_err().to_string();
    assert!(
        err.starts_with("the trace contradicts its segment list at event 3 (free_completed"),
        "{err}"
    );
    assert!(err.ends_with("no segment holds that address"), "{err}");
}

/// Events 3..7 of a recording as a recording of their own: the trace cut
/// to them, the segments as the recording had them after event 6 (the
/// second segment's block freed by then is back; the gap between blocks
/// an inactive block), and it replays exactly from its first event.
#[test]
fn a_window_is_a_recording_of_its_own() {
    let s = recorded_from_start();
    let w = super::window::window(&s, 0, 3..7).unwrap();
    assert_eq!(w.trace(0).len(), 4);
    assert_eq!(w.trace(0).get(0), s.trace(0).get(3));
    let first = &w.segments[0];
    let blocks: Vec<_> = (first.blocks.iter())
        .map(|b| (b.address, b.size, b.state.is_active()))
        .collect();
    // After event 6 (the 4 MiB block at BASE freed), 6 MiB live at +4 MiB.
    assert_eq!(
        blocks,
        vec![
            (BASE, 4 * MIB, false),
            (BASE + 4 * MIB, 6 * MIB, true),
            (BASE + 10 * MIB, 10 * MIB, false)
        ]
    );
    assert_eq!(first.allocated_size, 6 * MIB);
    let run = replay_exact(&w, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
    // The whole trace is the recording itself.
    let all = super::window::window(&s, 0, 0..usize::MAX).unwrap();
    assert_eq!(all.trace(0).len(), s.trace(0).len());
    assert_eq!(replay_exact(&all, 0).unwrap().exact, Some(true));
    let err = super::window::window(&s, 0, 8..9).unwrap_err().to_string();
    assert_eq!(err, "events 8..9 hold none of the trace's 8 events");
    // Allocated peaks at 26 MiB when the 16 MiB block is made (event 4).
    let (range, peak) = super::window::around_peak(&s, 0, 1).unwrap();
    assert_eq!((range, peak), (3..6, 4));
}

/// A segment list no allocator could hold is refused with its reason,
/// before any replay: a live block outside its segment, two segments
/// over the same addresses.
#[test]
fn a_segment_list_no_allocator_could_hold_is_refused() {
    // Dumped with no trace: the segment list is the state at the start.
    let mut s = recorded_from_start();
    edit(&mut s, Vec::clear);
    s.segments[0].blocks[1].address = BASE - MIB;
    let err = initial::initial_state(&s, 0).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("segment {BASE:#x} overlaps another, or a live block in it does")
    );
    assert!(replay_exact(&s, 0).is_err());
    let mut s = recorded_from_start();
    edit(&mut s, Vec::clear);
    s.segments[1].address = BASE + 10 * MIB;
    let err = initial::initial_state(&s, 0).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "segment {:#x} overlaps another, or a live block in it does",
            BASE + 10 * MIB
        )
    );
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

/// The program called `empty_cache()`: the trace shows the freed 16 MiB
/// segment released with no new segment after it. The exact replay
/// releases it there; a what-if empties the cache there too.
#[test]
fn a_recorded_empty_cache_is_replayed_in_both_kinds_of_run() {
    let mut s = recorded_from_start();
    edit(&mut s, |t| {
        t.extend([
            entry(Action::FreeRequested, BASE + 20 * MIB, 16 * MIB),
            entry(Action::FreeCompleted, BASE + 20 * MIB, 16 * MIB),
            entry(Action::SegmentFree, BASE + 20 * MIB, 16 * MIB),
            entry(Action::Alloc, BASE + 10 * MIB, 2 * MIB),
        ])
    });
    s.segments.pop();
    s.segments[0].blocks.splice(
        2..,
        [
            block(
                BASE + 10 * MIB,
                2 * MIB,
                2 * MIB,
                BlockState::ActiveAllocated,
            ),
            block(BASE + 12 * MIB, 8 * MIB, 0, BlockState::Inactive),
        ],
    );
    let exact = replay_exact(&s, 0).unwrap();
    assert_eq!(exact.exact, Some(true), "{:?}", exact.first_difference);
    assert_eq!(exact.timeline[10].reserved_bytes, 20 * MIB);
    let on_a_t4 = replay_what_if(&s, 0, &parse_what_if("gpu=t4").unwrap()).unwrap();
    // The what-if empties the cache there too.
    assert_eq!(on_a_t4.timeline[9].reserved_bytes, 36 * MIB);
    assert_eq!(on_a_t4.timeline[10].reserved_bytes, 20 * MIB);
    assert_eq!(on_a_t4.segments.len(), 1);
}

/// A release followed by a new segment: the program's `empty_cache()`
/// (its own stack; `torch.cuda.graph` calls it before it captures), which
/// a what-if repeats, or the request's own retry before it asked the
/// driver again (the request's stack, or none as older versions record
/// it), which the what-if's allocator decides again: on a T4 it has room
/// and keeps the cache.
#[test]
fn a_what_if_repeats_the_programs_empty_cache_not_a_requests_retry() {
    let step = vec![frame("train.py", 31, "step")];
    let recorded = |release: Stack| {
        let mut s = recorded_from_start();
        edit(&mut s, |t| {
            t.extend([
                entry(Action::FreeRequested, BASE + 20 * MIB, 16 * MIB),
                entry(Action::FreeCompleted, BASE + 20 * MIB, 16 * MIB),
                TraceEntry {
                    frames: release,
                    ..entry(Action::SegmentFree, BASE + 20 * MIB, 16 * MIB)
                },
                TraceEntry {
                    frames: step.clone().into(),
                    ..entry(Action::SegmentAlloc, BASE + 40 * MIB, 30 * MIB)
                },
                TraceEntry {
                    frames: step.clone().into(),
                    ..entry(Action::Alloc, BASE + 40 * MIB, 30 * MIB)
                },
            ])
        });
        s.segments[1] = Segment {
            address: BASE + 40 * MIB,
            total_size: 30 * MIB,
            segment_type: "large".into(),
            blocks: vec![block(
                BASE + 40 * MIB,
                30 * MIB,
                30 * MIB,
                BlockState::ActiveAllocated,
            )],
            ..Segment::default()
        };
        s
    };
    let empty_cache = vec![frame("memory.py", 224, "empty_cache"), step[0].clone()];
    let on_a_t4 = parse_what_if("gpu=t4").unwrap();
    for (release, reserved) in [
        (empty_cache.into(), 50 * MIB),
        (step.clone().into(), 66 * MIB),
        (Stack::default(), 66 * MIB),
    ] {
        let s = recorded(release);
        let exact = replay_exact(&s, 0).unwrap();
        assert_eq!(exact.exact, Some(true), "{:?}", exact.first_difference);
        assert_eq!(exact.timeline[12].reserved_bytes, 50 * MIB);
        let run = replay_what_if(&s, 0, &on_a_t4).unwrap();
        assert_eq!(run.timeline[12].reserved_bytes, reserved);
    }
}

/// An expandable recording that starts mid-run: undoing `segment_unmap`
/// joins the range back, undoing `segment_map` takes it out again.
#[test]
fn expandable_ranges_are_rebuilt_through_map_and_unmap() {
    let mapped = Segment {
        address: BASE,
        total_size: 40 * MIB,
        is_expandable: true,
        blocks: vec![
            block(BASE, 4 * MIB, 4 * MIB, BlockState::ActiveAllocated),
            block(BASE + 4 * MIB, 16 * MIB, 0, BlockState::Inactive),
            block(
                BASE + 20 * MIB,
                8 * MIB,
                8 * MIB,
                BlockState::ActiveAllocated,
            ),
            block(BASE + 28 * MIB, 12 * MIB, 0, BlockState::Inactive),
        ],
        ..Segment::default()
    };
    let s = MemorySnapshot {
        segments: vec![mapped],
        device_traces: vec![vec![
            entry(Action::SegmentMap, BASE + 20 * MIB, 20 * MIB),
            entry(Action::Alloc, BASE + 20 * MIB, 8 * MIB),
            entry(Action::SegmentUnmap, BASE + 40 * MIB, 20 * MIB),
        ]
        .into()],
        allocator_settings: None,
    };
    let state = initial::initial_state(&s, 0).unwrap();
    let ranges: Vec<(u64, u64, usize)> = state
        .segments
        .values()
        .map(|r| (r.address, r.size, r.blocks.len()))
        .collect();
    assert_eq!(
        ranges,
        vec![(BASE, 20 * MIB, 1), (BASE + 40 * MIB, 20 * MIB, 0)]
    );
    // Replayed from that state, checked event by event: PyTorch would have
    // placed the 8 MiB block in the free 16 MiB at +4 MiB (best fit), not
    // in a newly mapped range, so this made-up trace differs there.
    let run = replay_exact(&s, 0).unwrap();
    assert_eq!(run.exact, Some(false));
    let d = run.first_difference.unwrap();
    assert_eq!(d.event, 1);
    assert_eq!(d.engine, format!("a cached block at {:#x}", BASE + 4 * MIB));
}

/// A what-if on a GPU too small for what the recording already holds at
/// its first event says so, whichever allocator it runs, with the
/// smallest device that holds it: one 20 MiB segment for both blocks, or
/// one 20 MiB page of the large pool's expandable range.
#[test]
fn a_gpu_too_small_for_the_first_event_is_refused() {
    let mut s = recorded_from_start();
    edit(&mut s, |t| _ = t.drain(..3));
    for (what_if, smallest) in [
        ("device_total_bytes=4194304", 20),
        ("device_total_bytes=4194304,expandable_segments=true", 20),
    ] {
        let err = replay_what_if(&s, 0, &parse_what_if(what_if).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("the 10.00 MiB live when the recording starts do not fit: no room for a live 4.00 MiB block on this 4 MiB device. The smallest that holds them: {smallest} MiB; try at least that, or a larger GPU"),
        );
        let at_smallest = format!("device_total_bytes={}", smallest * MIB);
        let at_smallest = what_if.replace("device_total_bytes=4194304", &at_smallest);
        assert!(replay_what_if(&s, 0, &parse_what_if(&at_smallest).unwrap()).is_ok());
        let below = what_if.replace(
            "device_total_bytes=4194304",
            &format!("device_total_bytes={}", (smallest - 1) * MIB),
        );
        assert!(replay_what_if(&s, 0, &parse_what_if(&below).unwrap()).is_err());
    }
}

fn frame(filename: &str, line: i64, name: &str) -> Frame {
    Frame {
        filename: filename.into(),
        line,
        name: name.into(),
    }
}

#[test]
fn the_user_frame_is_the_innermost_python_frame_outside_torch() {
    let cpp = frame("??", 0, "c10::cuda::CUDACachingAllocator::malloc");
    let torch = frame(
        "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
        125,
        "forward",
    );
    let user = frame("train.py", 12, "step");
    let all = [cpp.clone(), torch.clone(), user.clone()];
    assert_eq!(format::user_frame(&all), Some(&user));
    assert_eq!(user.label(), "step (train.py:12)");
    assert_eq!(
        format::user_frame(&[cpp.clone(), torch.clone()]),
        Some(&torch)
    );
    assert_eq!(format::user_frame(std::slice::from_ref(&cpp)), Some(&cpp));
    assert_eq!(cpp.label(), "c10::cuda::CUDACachingAllocator::malloc");
    assert_eq!(format::user_frame(&[]), None);
}

/// The segment map after any event: blocks where the allocator put them,
/// each named by the frame that allocated it.
#[test]
fn the_segments_after_an_event_name_each_block_by_its_frame() {
    let mut s = recorded_from_start();
    edit(&mut s, |t| {
        t[2].frames = vec![frame("train.py", 12, "forward")].into()
    });
    let at = |event, what_if: Option<&vramlab_device::framework::RestartSettings>| {
        replay::segments_at(&s, 0, what_if, event).unwrap()
    };
    // The segment_alloc shows with the request that made it.
    let start = at(0, None);
    assert_eq!(start.len(), 1);
    assert_eq!(start[0].allocated_size, 4 * MIB);
    assert_eq!(start[0].blocks.len(), 2);
    assert_eq!(start, at(1, None));
    let after = at(4, None);
    assert_eq!(after.len(), 2);
    let owners: Vec<_> = after[0]
        .blocks
        .iter()
        .map(|b| (b.address, b.size, b.owner.clone()))
        .collect();
    assert_eq!(
        owners,
        vec![
            (BASE, 4 * MIB, Some("allocated at event 1".to_string())),
            (
                BASE + 4 * MIB,
                6 * MIB,
                Some("forward (train.py:12) (event 2)".to_string())
            ),
            (BASE + 10 * MIB, 10 * MIB, None),
        ]
    );
    assert_eq!(after[0].allocated_size, 10 * MIB);
    assert_eq!(after[1].pool, "large");
    // Beyond the last event: the end, as the dump shows it.
    let end = at(1000, None);
    assert_eq!(end[0].blocks[0].size, 4 * MIB);
    assert_eq!(end[0].blocks[0].requested_size, 3 * MIB);
    // A what-if's own segments: one expandable range, 40 MiB mapped.
    let expandable = parse_what_if("expandable_segments=true").unwrap();
    let mapped: u64 = at(7, Some(&expandable)).iter().map(|s| s.total_size).sum();
    assert_eq!(mapped, 40 * MIB);
}

/// A what-if written as a snapshot is the what-if's own run: an exact
/// replay of it follows every placement, under the settings it carries.
#[test]
fn an_exported_what_if_replays_exactly_under_its_settings() {
    use replay::export_what_if;
    let mut s = recorded_from_start();
    edit(&mut s, |t| {
        t[2].frames = vec![frame("train.py", 12, "forward")].into()
    });
    let split = parse_what_if("max_split_size_mb=21,roundup_power2_divisions=4").unwrap();
    let exported = export_what_if(&s, 0, &split).unwrap();
    let settings = exported.allocator_settings.as_ref().unwrap();
    assert_eq!(settings.max_split_size, 21 << 20);
    assert_eq!(settings.alloc_conf, "max_split_size_mb:21");
    assert_eq!(settings.roundup_power2_divisions["1024"], 4);
    let what_if = replay_what_if(&s, 0, &split).unwrap();
    let again = replay_exact(&exported, 0).unwrap();
    assert_eq!(again.exact, Some(true), "{:?}", again.first_difference);
    assert_eq!(again.peak_reserved_bytes, what_if.peak_reserved_bytes);
    assert_eq!(again.segments, what_if.segments);
    // The 6 MiB block keeps the frame of the request that made it.
    let six = exported.segments[0]
        .blocks
        .iter()
        .find(|b| b.requested_size == 6 * MIB)
        .unwrap();
    assert_eq!(*six.frames, [frame("train.py", 12, "forward")]);
    // On 30 MiB the 16 MiB request fails: an oom with the driver's free
    // bytes, and no alloc for it.
    let small = parse_what_if("device_total_bytes=31457280,context_bytes=0").unwrap();
    let exported = export_what_if(&s, 0, &small).unwrap();
    let oom: Vec<_> = exported.device_traces[0]
        .iter()
        .filter(|e| e.action == Action::Oom)
        .collect();
    assert_eq!(oom.len(), 1);
    assert_eq!(oom[0].device_free, Some(10 * MIB));
    assert_eq!(replay_exact(&exported, 0).unwrap().exact, Some(true));
    // Expandable segments: mapped pages as segment_map, ranges marked.
    let expandable = parse_what_if("expandable_segments=true").unwrap();
    let exported = export_what_if(&s, 0, &expandable).unwrap();
    assert!(exported.segments.iter().all(|s| s.is_expandable));
    assert!(exported.device_traces[0]
        .iter()
        .any(|e| e.action == Action::SegmentMap));
    let as_recorded = replay_what_if(&exported, 0, &Default::default()).unwrap();
    assert_eq!(as_recorded.peak_reserved_bytes, 40 * MIB);
}

/// An expandable recording from the process's start, as PyTorch writes
/// it: 20 MiB pages of one large range mapped on demand (`segment_map`),
/// `empty_cache()` unmapping the whole free page (`segment_unmap`).
fn expandable_from_start(last_block: u64) -> MemorySnapshot {
    use Action::*;
    let trace = vec![
        entry(SegmentMap, BASE, 20 * MIB),
        entry(Alloc, BASE, 4 * MIB),
        entry(Alloc, BASE + 4 * MIB, 6 * MIB),
        // 10 MiB free at the end of the mapped page, one page more.
        entry(SegmentMap, BASE + 20 * MIB, 20 * MIB),
        entry(Alloc, BASE + 10 * MIB, 16 * MIB),
        entry(FreeRequested, BASE + 4 * MIB, 6 * MIB),
        entry(FreeCompleted, BASE + 4 * MIB, 6 * MIB),
        entry(FreeRequested, BASE + 10 * MIB, 16 * MIB),
        entry(FreeCompleted, BASE + 10 * MIB, 16 * MIB),
        entry(SegmentUnmap, BASE + 20 * MIB, 20 * MIB),
        entry(Alloc, last_block, 3 * MIB),
    ];
    use BlockState::*;
    let mut blocks = vec![block(BASE, 4 * MIB, 4 * MIB, ActiveAllocated)];
    if last_block > BASE + 4 * MIB {
        blocks.push(block(
            BASE + 4 * MIB,
            last_block - BASE - 4 * MIB,
            0,
            Inactive,
        ));
    }
    let end = last_block + 3 * MIB;
    blocks.push(block(last_block, 3 * MIB, 3 * MIB, ActiveAllocated));
    blocks.push(block(end, BASE + 20 * MIB - end, 0, Inactive));
    MemorySnapshot {
        segments: vec![Segment {
            address: BASE,
            total_size: 20 * MIB,
            is_expandable: true,
            blocks,
            segment_type: "large".into(),
            ..Segment::default()
        }],
        device_traces: vec![trace.into()],
        allocator_settings: Some(format::AllocatorSettings {
            expandable_segments: true,
            max_split_size: -1,
            ..Default::default()
        }),
    }
}

#[test]
fn an_expandable_recording_replays_exactly_with_its_maps_and_unmaps() {
    let s = expandable_from_start(BASE + 4 * MIB);
    let run = replay_exact(&s, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
    assert_eq!(run.peak_reserved_bytes, 40 * MIB);
    assert_eq!(run.timeline[9].reserved_bytes, 20 * MIB);
    // The trace puts the 3 MiB block 4 MiB further: best fit takes the
    // start of the free piece.
    let moved = expandable_from_start(BASE + 8 * MIB);
    let d = replay_exact(&moved, 0).unwrap().first_difference.unwrap();
    assert_eq!(d.event, 10);
    assert_eq!(
        d.trace,
        format!(
            "alloc of {} bytes: a cached block at {:#x}",
            3 * MIB,
            BASE + 8 * MIB
        )
    );
    assert_eq!(d.engine, format!("a cached block at {:#x}", BASE + 4 * MIB));
    // A wrong map is named with what the allocator mapped instead.
    let mut wrong = s.clone();
    edit(&mut wrong, |t| t[3].addr = BASE + 40 * MIB);
    edit(&mut wrong, |t| t[9].addr = BASE + 40 * MIB);
    let d = replay_exact(&wrong, 0).unwrap().first_difference.unwrap();
    assert_eq!(d.event, 4);
    assert_eq!(
        d.engine,
        format!(
            "{} bytes mapped at {:#x}, the block at {:#x}",
            20 * MIB,
            BASE + 20 * MIB,
            BASE + 10 * MIB
        )
    );
    // A recording whose empty_cache() left the small pool's free page
    // mapped contradicts the allocator, which unmaps it too.
    let small = 0x7e00_0000_0000;
    let mut kept = s.clone();
    edit(&mut kept, |t| {
        _ = t.splice(
            9..9,
            [
                entry(Action::SegmentMap, small, 2 * MIB),
                entry(Action::Alloc, small, 1000),
                entry(Action::FreeRequested, small, 1000),
                entry(Action::FreeCompleted, small, 1000),
            ],
        )
    });
    kept.segments.push(Segment {
        address: small,
        total_size: 2 * MIB,
        is_expandable: true,
        blocks: vec![block(small, 2 * MIB, 0, BlockState::Inactive)],
        segment_type: "small".into(),
        ..Segment::default()
    });
    let d = replay_exact(&kept, 0).unwrap().first_difference.unwrap();
    assert_eq!(d.event, 14);
    assert_eq!(d.trace, "no further segment_unmap");
    assert_eq!(
        d.engine,
        format!(
            "empty_cache() also unmapped {} bytes at {small:#x}",
            2 * MIB
        )
    );
}

/// Changes the first device's trace as a list of entries.
fn edit(s: &mut MemorySnapshot, change: impl FnOnce(&mut Vec<TraceEntry>)) {
    let mut rows: Vec<TraceEntry> = s.device_traces[0].iter().collect();
    change(&mut rows);
    s.device_traces[0] = rows.into();
}

/// Fragmentation is read where it matters: at the peak allocated (26 MiB
/// live in 36 MiB of segments, after event 4), or at the run's first
/// out-of-memory when there is one: the recorded one in the exact replay,
/// the run's own in a what-if (the 16 MiB request at event 4 on 30 MiB).
#[test]
fn fragmentation_is_measured_at_the_peak_allocated_or_at_the_out_of_memory() {
    let s = recorded_from_start();
    let run = replay_exact(&s, 0).unwrap();
    assert_eq!(
        run.fragmentation,
        Fragmentation {
            bytes: 10 * MIB,
            event: 4,
            at_oom: false
        }
    );
    assert_eq!(
        run.fragmentation.moment(),
        "at the peak allocated (event 4)"
    );
    let small = parse_what_if("device_total_bytes=31457280,context_bytes=0").unwrap();
    let run = replay_what_if(&s, 0, &small).unwrap();
    assert_eq!(
        run.fragmentation,
        Fragmentation {
            bytes: 10 * MIB,
            event: 4,
            at_oom: true
        }
    );
    // A recorded out-of-memory after the 3 MiB request (event 7: it took
    // the whole 4 MiB block, so 26 MiB allocated in 36 MiB).
    let mut oom = s.clone();
    edit(&mut oom, |t| t.push(entry(Action::Oom, 0, 64 * MIB)));
    let run = replay_exact(&oom, 0).unwrap();
    assert_eq!(run.fragmentation.moment(), "at the out-of-memory (event 8)");
    assert_eq!(run.fragmentation.bytes, 10 * MIB);
}

/// A snapshot of several GPUs opens on the one that ran out of memory,
/// else on the busiest.
#[test]
fn the_device_shown_first_is_the_one_with_the_out_of_memory() {
    let mut s = recorded_from_start();
    let busy = s.device_traces[0].clone();
    s.device_traces = vec![busy.clone(), Vec::<TraceEntry>::new().into()];
    assert_eq!(replay::default_device(&s), 0);
    s.device_traces[1] = vec![entry(Action::Oom, 0, GIB)].into();
    assert_eq!(replay::recorded_ooms(&s, 1), 1);
    assert_eq!(replay::default_device(&s), 1);
    assert_eq!(replay::busiest_device(&s), 0);
}

/// A what-if is a restart: what was live at the recording's start is
/// allocated anew, the cache the run before it left is not carried over.
#[test]
fn a_what_if_starts_with_the_live_blocks_only() {
    let mut s = recorded_from_start();
    // From event 5 on: two segments (36 MiB) hold 26 MiB live.
    edit(&mut s, |t| _ = t.drain(..5));
    let run = replay_exact(&s, 0).unwrap();
    assert_eq!(run.timeline[0].reserved_bytes, 36 * MIB);
    let same = parse_what_if("garbage_collection_threshold=0").unwrap();
    let run = replay_what_if(&s, 0, &same).unwrap();
    assert_eq!(run.timeline[0].allocated_bytes, 26 * MIB);
    // 4 and 6 MiB share a 20 MiB segment; 16 MiB takes one of its own.
    assert_eq!(run.timeline[0].reserved_bytes, 36 * MIB);
}

/// Requests on two streams, run under expandable segments and written as a
/// recording: each stream's requests map pages in a range of its own (an
/// expandable segment per stream and pool), and the recording replays
/// exactly, from its first event and from the middle (each stream's range
/// rebuilt where it was).
#[test]
fn expandable_segments_on_two_streams_replay_exactly() {
    use Action::*;
    let on = |stream: u64, e: TraceEntry| TraceEntry { stream, ..e };
    let trace = vec![
        on(0, entry(SegmentAlloc, BASE, 20 * MIB)),
        on(0, entry(Alloc, BASE, 4 * MIB)),
        on(7, entry(SegmentAlloc, BASE + 20 * MIB, 20 * MIB)),
        on(7, entry(Alloc, BASE + 20 * MIB, 8 * MIB)),
        on(0, entry(Alloc, BASE + 4 * MIB, 2 * MIB)),
        on(0, entry(FreeRequested, BASE, 4 * MIB)),
        on(0, entry(FreeCompleted, BASE, 4 * MIB)),
        on(7, entry(Alloc, BASE + 28 * MIB, 4 * MIB)),
        on(0, entry(Alloc, BASE, 3 * MIB)),
    ];
    let segment = |address, stream, blocks| Segment {
        address,
        total_size: 20 * MIB,
        stream,
        blocks,
        segment_type: "large".into(),
        ..Segment::default()
    };
    use BlockState::*;
    let s = MemorySnapshot {
        segments: vec![
            segment(
                BASE,
                0,
                vec![
                    block(BASE, 4 * MIB, 3 * MIB, ActiveAllocated),
                    block(BASE + 4 * MIB, 2 * MIB, 2 * MIB, ActiveAllocated),
                    block(BASE + 6 * MIB, 14 * MIB, 0, Inactive),
                ],
            ),
            segment(
                BASE + 20 * MIB,
                7,
                vec![
                    block(BASE + 20 * MIB, 8 * MIB, 8 * MIB, ActiveAllocated),
                    block(BASE + 28 * MIB, 4 * MIB, 4 * MIB, ActiveAllocated),
                    block(BASE + 32 * MIB, 8 * MIB, 0, Inactive),
                ],
            ),
        ],
        device_traces: vec![trace.into()],
        allocator_settings: None,
    };
    assert_eq!(replay_exact(&s, 0).unwrap().exact, Some(true));
    let expandable = parse_what_if("expandable_segments=true").unwrap();
    let e = replay::export_what_if(&s, 0, &expandable).unwrap();
    let ranges: Vec<(u64, u64)> = (e.segments.iter())
        .map(|g| (g.stream, g.total_size / MIB))
        .collect();
    assert_eq!(ranges, vec![(0, 20), (7, 20)]);
    let (first, second) = (e.segments[0].address, e.segments[1].address);
    assert!(
        second >= first + GIB,
        "{first:#x} {second:#x}: a range each"
    );
    let run = replay_exact(&e, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
    for start in 1..e.device_traces[0].len() {
        let w = window::window(&e, 0, start..usize::MAX).unwrap();
        let run = replay_exact(&w, 0).unwrap();
        assert_eq!(
            run.exact,
            Some(true),
            "from {start}: {:?}",
            run.first_difference
        );
    }
}
