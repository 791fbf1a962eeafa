//! What reading a snapshot holds, at sizes people record: never more than
//! twice the file (and `read_limit`'s little more) beside the records the
//! file writes out, each as it is kept (`read_bound`), whatever the file;
//! a recording written as Python's pickler writes it takes less than its
//! file once read. Memory is what this binary's allocator hands out while
//! the file is read (the file itself, held by the caller, aside).

use vramlab_shared::torch_snapshot::{self, Action, Records};

mod common;

/// A pickle written as Python's pickler (protocol 4) writes what
/// `torch.cuda.memory._snapshot()` returns: every dict and list memoized,
/// strings and frame dicts written once and fetched back, lists appended
/// in batches of 1,000.
struct Pickler {
    out: Vec<u8>,
    memo: u32,
    strings: std::collections::HashMap<&'static str, u32>,
}

impl Pickler {
    fn new() -> Pickler {
        Pickler {
            out: b"\x80\x04".to_vec(),
            memo: 0,
            strings: Default::default(),
        }
    }

    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }

    fn get(&mut self, id: u32) {
        match u8::try_from(id) {
            Ok(id) => self.out.extend([b'h', id]),
            Err(_) => {
                self.out.push(b'j');
                self.out.extend(id.to_le_bytes());
            }
        }
    }

    fn str(&mut self, s: &'static str) {
        match self.strings.get(s) {
            Some(&id) => self.get(id),
            None => {
                self.out.extend([0x8c, s.len() as u8]);
                self.out.extend(s.as_bytes());
                let id = self.memoize();
                self.strings.insert(s, id);
            }
        }
    }

    /// An int as Python writes it: `BININT1`, `BININT` or `LONG1`.
    fn int(&mut self, v: u64) {
        if v < 256 {
            self.out.extend([b'K', v as u8]);
        } else if v < 1 << 31 {
            self.out.push(b'J');
            self.out.extend((v as u32).to_le_bytes());
        } else {
            let bytes: Vec<u8> = v.to_le_bytes().into_iter().collect();
            let n = 8 - bytes.iter().rev().take_while(|&&b| b == 0).count();
            // A sign byte when the top bit is set.
            let n = if bytes[n - 1] & 0x80 != 0 { n + 1 } else { n };
            self.out.extend([0x8a, n as u8]);
            self.out.extend(&v.to_le_bytes()[..n.min(8)]);
            if n > 8 {
                self.out.push(0);
            }
        }
    }

    /// `{key: value, …}`; its memo id.
    fn dict(&mut self, fields: Vec<(&'static str, Field)>) -> u32 {
        self.out.push(b'}');
        let id = self.memoize();
        self.out.push(b'(');
        for (key, value) in fields {
            self.str(key);
            match value {
                Field::Int(v) => self.int(v),
                Field::Str(s) => self.str(s),
                Field::List(ids) => self.list_of_memo(&ids),
                Field::Dicts(dicts) => self.list_of_dicts(dicts),
                Field::Pair(a, b) => {
                    self.int(a);
                    self.int(b);
                    self.out.push(0x86);
                    self.memoize();
                }
                Field::False => self.out.push(0x89),
            }
        }
        self.out.push(b'u');
        id
    }

    /// A list of dicts written out in it (none fetched back from the memo).
    fn list_of_dicts(&mut self, dicts: Vec<Vec<(&'static str, Field)>>) {
        self.out.push(b']');
        self.memoize();
        let mut dicts = dicts.into_iter().peekable();
        while dicts.peek().is_some() {
            self.out.push(b'(');
            for fields in dicts.by_ref().take(1000) {
                _ = self.dict(fields);
            }
            self.out.push(b'e');
        }
    }

    fn list_of_memo(&mut self, ids: &[u32]) {
        self.out.push(b']');
        self.memoize();
        for batch in ids.chunks(1000) {
            self.out.push(b'(');
            for &id in batch {
                self.get(id);
            }
            self.out.push(b'e');
        }
    }
}

enum Field {
    Int(u64),
    Str(&'static str),
    /// Dicts written before, fetched back from the memo.
    List(Vec<u32>),
    /// Dicts written out here.
    Dicts(Vec<Vec<(&'static str, Field)>>),
    /// A tuple of two ints.
    Pair(u64, u64),
    False,
}

/// A recording of `events` allocations and frees at a few call sites,
/// written as PyTorch 2.x and Python's pickler write it (about 75 bytes
/// an event).
fn recording(events: usize) -> Vec<u8> {
    let mut p = Pickler::new();
    p.out.push(b'}');
    p.memoize();
    p.out.push(b'(');
    // The frames of four call sites, each dict written once and fetched
    // back by every entry made there (a field the reader skips holds them
    // first, as the first entry's list would).
    p.str("frames_of_sites");
    p.out.push(b']');
    p.memoize();
    p.out.push(b'(');
    let mut frames = Vec::new();
    for line in 0..8 {
        frames.push(p.dict(vec![
            ("filename", Field::Str("/home/me/train.py")),
            ("line", Field::Int(10 + line)),
            ("name", Field::Str("forward")),
        ]));
    }
    p.out.push(b'e');
    p.str("segments");
    p.out.push(b']');
    p.memoize();
    p.str("device_traces");
    p.out.push(b']');
    p.memoize();
    p.out.push(b']');
    p.memoize();
    let base = 0x7f00_0000_0000u64;
    let mut batch = 0;
    for i in 0..events {
        if batch == 0 {
            p.out.push(b'(');
        }
        let action = ["alloc", "free_requested", "free_completed"][i % 3];
        let site = (i / 3) % 4;
        let stack = frames[site * 2..site * 2 + 2].to_vec();
        _ = p.dict(vec![
            ("action", Field::Str(action)),
            ("addr", Field::Int(base + 512 * (i as u64 / 3 % 64))),
            ("size", Field::Int(512)),
            ("stream", Field::Int(0)),
            ("time_us", Field::Int(1_763_324_225_801_640 + i as u64)),
            ("frames", Field::List(stack)),
        ]);
        batch += 1;
        if batch == 1000 || i + 1 == events {
            p.out.push(b'e');
            batch = 0;
        }
    }
    p.out.push(b'a');
    p.out.extend(b"u.");
    p.out
}

/// A dump of `segments` segments of `blocks` blocks each and no stack
/// frames (recorded without `context`, or the segments' stacks not
/// recorded), written as PyTorch 2.x and Python's pickler write it: about
/// 110 bytes a segment and 36 a block.
fn segments_without_stacks(segments: u64, blocks: u64) -> Vec<u8> {
    let mut p = Pickler::new();
    p.out.push(b'}');
    p.memoize();
    p.out.push(b'(');
    p.str("segments");
    let mut all = Vec::new();
    for s in 0..segments {
        let (size, address) = (20 << 20, 0x7f00_0000_0000 + s * (20 << 20));
        let block = |b: u64| {
            let part = size / blocks;
            vec![
                ("address", Field::Int(address + b * part)),
                ("size", Field::Int(part)),
                ("requested_size", Field::Int(part - 7)),
                (
                    "state",
                    Field::Str(["active_allocated", "inactive"][b as usize % 2]),
                ),
                ("frames", Field::Dicts(Vec::new())),
            ]
        };
        all.push(vec![
            ("device", Field::Int(0)),
            ("address", Field::Int(address)),
            ("total_size", Field::Int(size)),
            ("allocated_size", Field::Int(size)),
            ("active_size", Field::Int(size)),
            ("requested_size", Field::Int(size)),
            ("stream", Field::Int(0)),
            ("segment_type", Field::Str("large")),
            ("segment_pool_id", Field::Pair(0, 0)),
            ("is_expandable", Field::False),
            ("frames", Field::Dicts(Vec::new())),
            ("blocks", Field::Dicts((0..blocks).map(block).collect())),
        ]);
    }
    p.list_of_dicts(all);
    p.str("device_traces");
    p.list_of_dicts(Vec::new());
    p.out.extend(b"u.");
    p.out
}

/// Reads `file`; the result and the most bytes held while reading it.
fn read(file: &[u8]) -> (Result<torch_snapshot::MemorySnapshot, String>, usize) {
    common::peak_bytes(|| torch_snapshot::read(file).map_err(|e| e.to_string()))
}

/// Real dumps of 1,457 segments in 209 KB and 1,722 in 2.35 MB were
/// refused ("reading the file would take more than twice its size"):
/// a segment's record takes more than twice its bytes in the file. Now
/// what reading holds is bounded by its records, and such dumps read, at
/// any count of segments, within that bound.
#[test]
fn segments_without_stacks_read_within_their_records_bound() {
    for (segments, blocks) in [(1_457, 1), (1_722, 4), (20_000, 2)] {
        let file = segments_without_stacks(segments, blocks);
        let (snapshot, peak) = read(&file);
        let snapshot = snapshot.unwrap_or_else(|e| panic!("{segments} segments: {e}"));
        let records = Records::of(&snapshot);
        assert_eq!(
            records,
            Records {
                segments: segments as usize,
                blocks: (segments * blocks) as usize,
                events: 0
            }
        );
        let seg = &snapshot.segments[7];
        assert_eq!(
            (seg.total_size, seg.segment_type.as_str()),
            (20 << 20, "large")
        );
        assert_eq!(seg.blocks.len() as u64, blocks);
        assert_eq!(seg.blocks[0].requested_size, (20 << 20) / blocks - 7);
        let bound = torch_snapshot::read_bound(file.len(), &records);
        println!(
            "figure: {segments} segments of {blocks} blocks without stacks, {} bytes: read at a peak of {peak} bytes ({:.2}x; bound {bound})",
            file.len(),
            peak as f64 / file.len() as f64
        );
        assert!(
            peak <= bound,
            "{peak} bytes for {} (bound {bound})",
            file.len()
        );
        // The same snapshot streamed as the page reads it, within the same bound.
        let (streamed, peak) = common::peak_bytes(|| streamed(&file, 64 << 10));
        assert_eq!(streamed.unwrap(), snapshot);
        assert!(peak <= bound, "streamed: {peak} bytes (bound {bound})");
    }
}

/// `bytes` read as the page reads a file: streamed in chunks of `size`.
fn streamed(
    bytes: &[u8],
    size: usize,
) -> Result<torch_snapshot::MemorySnapshot, torch_snapshot::SnapshotError> {
    let mut s = torch_snapshot::stream::PickleStream::new(bytes.len())?;
    let chunks: Vec<&[u8]> = bytes.chunks(size).collect();
    let last = |i: usize| i + 1 == chunks.len();
    for (i, c) in chunks.iter().enumerate() {
        s.scan(c, last(i))?;
    }
    for (i, c) in chunks.iter().enumerate() {
        s.read(c, last(i))?;
    }
    s.finish()
}

/// The bound in records: so many bytes a segment, a block, an event,
/// beside twice the file and 2 MiB.
#[test]
fn the_bound_is_stated_in_records() {
    let records = Records {
        segments: 10,
        blocks: 100,
        events: 1_000,
    };
    assert_eq!(
        torch_snapshot::read_bound(1 << 20, &records),
        (2 << 20)
            + (2 << 20)
            + 10 * Records::SEGMENT_BYTES
            + 100 * Records::BLOCK_BYTES
            + 1_000 * Records::EVENT_BYTES
    );
    assert_eq!(
        torch_snapshot::read_bound(1 << 20, &Records::default()),
        torch_snapshot::read_limit(1 << 20)
    );
    // A segment's record with its blocks' places, a block's as read and
    // in its segment, an event in its trace's columns.
    assert_eq!(
        (
            Records::SEGMENT_BYTES,
            Records::BLOCK_BYTES,
            Records::EVENT_BYTES
        ),
        (408, 208, 31)
    );
}

#[test]
fn a_dense_recording_takes_less_than_its_file_once_read() {
    let file = recording(200_000);
    let (snapshot, peak) = read(&file);
    let snapshot = snapshot.unwrap();
    let trace = &snapshot.device_traces[0];
    assert_eq!(trace.len(), 200_000);
    assert_eq!(trace.action(4), Action::FreeRequested);
    assert_eq!(trace.get(3).unwrap().addr, 0x7f00_0000_0200);
    assert_eq!(&*trace.frames(3)[0].filename, "/home/me/train.py");
    let (bytes, held) = (file.len(), common::peak_bytes(|| drop(snapshot.clone())).1);
    println!(
        "figure: a recording of 200,000 events in {bytes} bytes: read at a peak of {peak} bytes ({:.2}x), {held} held after",
        peak as f64 / bytes as f64
    );
    assert!(peak <= bytes * 3 / 2, "{peak} bytes for {bytes}");
    assert!(held < bytes, "{held} bytes held for {bytes}");
    // The same as JSON (as vramlab writes it): read as the pickle is.
    let json = serde_json::to_vec(&snapshot).unwrap();
    let (again, peak) = read(&json);
    assert_eq!(again.unwrap(), snapshot);
    println!(
        "figure: the same as JSON, {} bytes: read at a peak of {peak} bytes ({:.2}x)",
        json.len(),
        peak as f64 / json.len() as f64
    );
    assert!(peak <= json.len(), "{peak} bytes for {}", json.len());
}

/// The shapes a probe used to exhaust memory, at a few MB: each read,
/// refused or not, holds no more than `read_limit` allows.
#[test]
fn no_file_takes_more_than_twice_its_size() {
    let n = 4 << 20;
    let shapes: Vec<(&str, Vec<u8>)> = vec![
        // 25 MB of these took 2.49 GB.
        (
            "empty lists",
            [b"\x80\x04".as_slice(), &vec![b']'; n], b"."].concat(),
        ),
        ("lists appended one by one", {
            let mut f = b"\x80\x04]".to_vec();
            for _ in 0..n / 2 {
                f.extend(b"]a");
            }
            f.push(b'.');
            f
        }),
        ("dicts set", {
            let mut f = b"\x80\x04}(".to_vec();
            for i in 0..n / 6 {
                f.push(b'J');
                f.extend((i as u32).to_le_bytes());
                f.push(b'}');
            }
            f.extend(b"u.");
            f
        }),
        ("one entry fetched back", {
            let mut f = b"\x80\x04}(\x8c\x0ddevice_traces](](".to_vec();
            f.extend(b"}(\x8c\x06action\x8c\x05allocu\x94");
            for _ in 0..n / 2 {
                f.extend(b"h\x00");
            }
            f.extend(b"eeu.");
            f
        }),
        ("JSON of empty arrays", {
            let mut f = b"{\"device_traces\": [".to_vec();
            f.extend(b"[],".repeat(n / 3));
            f.extend(b"[]]}");
            f
        }),
        ("JSON of empty objects", {
            let mut f = b"{\"segments\": [".to_vec();
            f.extend(b"{},".repeat(n / 3));
            f.extend(b"{}]}");
            f
        }),
        ("JSON nested deep", {
            let deep = [vec![b'['; n / 2], vec![b']'; n / 2]].concat();
            [b"{\"x\": ".as_slice(), &deep, b"}"].concat()
        }),
    ];
    for (what, file) in shapes {
        let (result, peak) = read(&file);
        let limit = torch_snapshot::read_limit(file.len());
        println!(
            "figure: {what}, {} bytes: {} at a peak of {peak} bytes ({:.2}x)",
            file.len(),
            if result.is_ok() { "read" } else { "refused" },
            peak as f64 / file.len() as f64
        );
        assert!(peak <= limit, "{what}: {peak} bytes for {}", file.len());
    }
}

/// `--export-snapshot` wrote a 440 MB pickle through its JSON text and a
/// tree of it (6.5 GB held for 199 MB in); streamed, the writer holds its
/// buffer alone, whatever the snapshot's size.
#[test]
fn a_snapshot_is_written_holding_no_copy_of_it() {
    let file = recording(50_000);
    let snapshot = torch_snapshot::read(&file).unwrap();
    let mut written = 0;
    let ((), peak) = common::peak_bytes(|| {
        let mut counting = Counted(&mut written);
        torch_snapshot::write_pickle_to(&snapshot, &mut counting).unwrap();
    });
    println!("figure: a snapshot of 50,000 events written as {written} bytes holding {peak} bytes");
    assert!(written > 2_000_000, "{written}");
    assert!(peak < 64 << 10, "{peak} bytes held");
}

/// A writer that counts what it is given and keeps nothing.
struct Counted<'a>(&'a mut usize);

impl std::io::Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        *self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
