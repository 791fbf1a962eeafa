//! The readers of what users bring, fuzzed with structure and held to
//! limits: the snapshot reader (pickles built from a grammar of the
//! snapshot's own records, with lists and dicts shared through the memo,
//! nesting, wide dicts, wrong types, then bytes mutated) and the
//! command and message readers (each command's and message's shape with
//! values at the edges in its fields). Each
//! input must be answered, a value or an error, never a panic, within a
//! time and a memory limit; memory is what this binary's allocator hands
//! out while the input is read. `VRAMLAB_FUZZ_CASES` runs more inputs.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use vramlab_shared::command::{self, Command};
use vramlab_shared::protocol::{self, ServerMessage};
use vramlab_shared::torch_snapshot;

mod common;

/// Per input: at most this long (a debug build) and this many bytes more
/// than before it.
const TIME_LIMIT: Duration = Duration::from_secs(5);
const MEMORY_LIMIT: usize = 64 << 20;

/// The worst input seen: its time and its memory.
#[derive(Default)]
struct Worst {
    time: Duration,
    bytes: usize,
    inputs: u32,
}

impl Worst {
    /// Runs `read` on one input, holding it to the limits.
    fn measure(&mut self, what: &str, input: &[u8], read: impl FnOnce()) {
        self.measure_within(what, input, MEMORY_LIMIT, read)
    }

    /// Runs `read` on one input, holding it to the time limit and `memory`.
    fn measure_within(&mut self, what: &str, input: &[u8], memory: usize, read: impl FnOnce()) {
        let started = Instant::now();
        let ((), bytes) = common::peak_bytes(read);
        let time = started.elapsed();
        assert!(
            time <= TIME_LIMIT && bytes <= memory,
            "{what}: {time:?} and {bytes} bytes for {} bytes of input: {:?}",
            input.len(),
            String::from_utf8_lossy(&input[..input.len().min(400)])
        );
        self.time = self.time.max(time);
        self.bytes = self.bytes.max(bytes);
        self.inputs += 1;
    }
}

fn cases(default: u32) -> u32 {
    std::env::var("VRAMLAB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A value of a snapshot's shape, before it is written as a pickle.
#[derive(Clone, Debug)]
enum Tree {
    Int(i64),
    Float,
    Str(&'static str),
    None,
    Bool(bool),
    List(Vec<Tree>),
    Dict(Vec<(&'static str, Tree)>),
    /// Written once, then `n` more times through the memo.
    Shared(Box<Tree>, u16),
    /// Bytes the grammar does not make: an opcode, a truncation.
    Raw(Vec<u8>),
}

/// The snapshot's own field names and words, and a few others.
const WORDS: &[&str] = &[
    "segments",
    "device_traces",
    "allocator_settings",
    "action",
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_map",
    "addr",
    "address",
    "size",
    "total_size",
    "requested_size",
    "stream",
    "blocks",
    "state",
    "active_allocated",
    "inactive",
    "frames",
    "filename",
    "line",
    "name",
    "segment_pool_id",
    "is_expandable",
    "expandable_segments",
    "roundup_power2_divisions",
    "",
];

fn tree() -> impl Strategy<Value = Tree> {
    let word = prop::sample::select(WORDS);
    let leaf = prop_oneof![
        prop_oneof![
            Just(0i64),
            Just(512),
            Just(2 << 20),
            Just(-1),
            Just(i64::MAX),
            any::<i64>()
        ]
        .prop_map(Tree::Int),
        word.clone().prop_map(Tree::Str),
        Just(Tree::None),
        Just(Tree::Float),
        any::<bool>().prop_map(Tree::Bool),
        prop::collection::vec(any::<u8>(), 1..6).prop_map(Tree::Raw),
    ];
    leaf.prop_recursive(5, 200, 12, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..12).prop_map(Tree::List),
            prop::collection::vec((prop::sample::select(WORDS), inner.clone()), 0..10)
                .prop_map(Tree::Dict),
            (inner, 1u16..2_000).prop_map(|(t, n)| Tree::Shared(Box::new(t), n)),
        ]
    })
}

/// How far from a real snapshot the grammar strays.
#[derive(Clone, Copy, Debug)]
struct Grammar {
    /// Values no recording holds (-1, `i64::MAX`, unknown words), other
    /// values in a field's place, and mutated bytes.
    odd: bool,
    /// The chance that each field of a record is written.
    present: f64,
}

/// Anything the snapshot's own words can make.
const ODD: Grammar = Grammar {
    odd: true,
    present: 0.9,
};
/// Snapshots as PyTorch writes them: every field there, of its kind.
const WELL_FORMED: Grammar = Grammar {
    odd: false,
    present: 1.0,
};

fn number(g: Grammar) -> BoxedStrategy<Tree> {
    let real = prop_oneof![
        Just(0i64),
        Just(512),
        Just(20 << 20),
        (0i64..1 << 40).prop_map(|a| a & !511),
    ];
    let any = if g.odd {
        prop_oneof![real, Just(-1), Just(i64::MAX)].boxed()
    } else {
        real.boxed()
    };
    any.prop_map(Tree::Int).boxed()
}

/// A list of `item`s, some shared through the memo many times.
fn list_of(item: BoxedStrategy<Tree>) -> BoxedStrategy<Tree> {
    prop_oneof![
        prop::collection::vec(item.clone(), 0..8).prop_map(Tree::List),
        (item, 1u16..3_000).prop_map(|(t, n)| Tree::Shared(Box::new(t), n)),
    ]
    .boxed()
}

fn frames(g: Grammar) -> BoxedStrategy<Tree> {
    let frame = (prop::sample::select(WORDS), number(g)).prop_map(|(name, line)| {
        Tree::Dict(vec![
            ("filename", Tree::Str(name)),
            ("line", line),
            ("name", Tree::Str(name)),
        ])
    });
    list_of(frame.boxed())
}

/// A record with these fields, each present or not, of its kind or not.
fn record(g: Grammar, fields: Vec<(&'static str, BoxedStrategy<Tree>)>) -> BoxedStrategy<Tree> {
    let each: Vec<_> = fields
        .into_iter()
        .map(|(name, value)| {
            let value = if g.present < 1.0 {
                prop::option::weighted(g.present, value).boxed()
            } else {
                value.prop_map(Some).boxed()
            };
            value.prop_map(move |v| (name, v))
        })
        .collect();
    each.prop_map(|fields| {
        Tree::Dict(
            fields
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect(),
        )
    })
    .boxed()
}

/// One of `words`; the last is one no recording writes.
fn word_of(g: Grammar, words: &'static [&'static str]) -> BoxedStrategy<Tree> {
    let words = if g.odd {
        words
    } else {
        &words[..words.len() - 1]
    };
    prop::sample::select(words).prop_map(Tree::Str).boxed()
}

fn trace_entry(g: Grammar) -> BoxedStrategy<Tree> {
    const ACTIONS: &[&str] = &[
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "snapshot",
        "oom",
        "what",
    ];
    record(
        g,
        vec![
            ("action", word_of(g, ACTIONS)),
            ("addr", number(g)),
            ("size", number(g)),
            ("stream", number(g)),
            ("frames", frames(g)),
        ],
    )
}

fn segment(g: Grammar) -> BoxedStrategy<Tree> {
    const STATES: &[&str] = &["active_allocated", "active_pending_free", "inactive", "x"];
    let block = record(
        g,
        vec![
            ("address", number(g)),
            ("size", number(g)),
            ("requested_size", number(g)),
            ("state", word_of(g, STATES)),
            ("frames", frames(g)),
        ],
    );
    record(
        g,
        vec![
            ("address", number(g)),
            ("total_size", number(g)),
            ("stream", number(g)),
            ("segment_type", word_of(g, &["large", "small", "x"])),
            ("is_expandable", any::<bool>().prop_map(Tree::Bool).boxed()),
            ("segment_pool_id", pool_id()),
            ("blocks", list_of(block)),
            ("frames", frames(g)),
        ],
    )
}

/// A segment's pool: the default pools' mostly, a CUDA graph's private
/// pool (as `torch.cuda.graph` or torch.compile names it) sometimes.
fn pool_id() -> BoxedStrategy<Tree> {
    prop_oneof![
        3 => Just((0i64, 0i64)),
        1 => Just((1, 0)),
        1 => Just((0, 1)),
    ]
    .prop_map(|(a, b)| Tree::List(vec![Tree::Int(a), Tree::Int(b)]))
    .boxed()
}

/// `{"segments": [...], "device_traces": [[...]], ...}` of the snapshot's
/// own records, sometimes (when odd) with other values in their places.
fn snapshot_tree(g: Grammar) -> impl Strategy<Value = Tree> {
    let more = if g.odd { 0..2 } else { 0..1 };
    (
        list_of(segment(g)),
        list_of(list_of(trace_entry(g))),
        prop::collection::vec((prop::sample::select(WORDS), tree()), more),
    )
        .prop_map(|(segments, traces, more)| {
            let mut fields = vec![("segments", segments), ("device_traces", traces)];
            fields.extend(more);
            Tree::Dict(fields)
        })
}

/// The pickle of `t` (protocol 4 opcodes, a memo slot per shared value).
fn pickle(t: &Tree) -> Vec<u8> {
    let mut out = b"\x80\x04".to_vec();
    let mut memo = 0u32;
    write(t, &mut out, &mut memo);
    out.push(b'.');
    out
}

fn write(t: &Tree, out: &mut Vec<u8>, memo: &mut u32) {
    match t {
        Tree::Int(i) => {
            out.push(b'\x8a');
            out.push(8);
            out.extend(i.to_le_bytes());
        }
        Tree::Float => {
            out.push(b'G');
            out.extend(0.5f64.to_be_bytes());
        }
        Tree::Str(s) => {
            out.push(b'X');
            out.extend((s.len() as u32).to_le_bytes());
            out.extend(s.as_bytes());
        }
        Tree::None => out.push(b'N'),
        Tree::Bool(b) => out.push(if *b { b'\x88' } else { b'\x89' }),
        Tree::List(items) => {
            out.extend(b"](");
            items.iter().for_each(|i| write(i, out, memo));
            out.push(b'e');
        }
        Tree::Dict(fields) => {
            out.extend(b"}(");
            for (k, v) in fields {
                write(&Tree::Str(k), out, memo);
                write(v, out, memo);
            }
            out.push(b'u');
        }
        Tree::Shared(t, n) => {
            // Into a list: the value, then the memo's copy n times.
            out.extend(b"](");
            write(t, out, memo);
            out.push(b'r');
            out.extend(memo.to_le_bytes());
            for _ in 0..*n {
                out.push(b'j');
                out.extend(memo.to_le_bytes());
            }
            *memo += 1;
            out.push(b'e');
        }
        Tree::Raw(bytes) => out.extend(bytes),
    }
}

/// Mutations of a pickle's bytes: `(position, byte)` to overwrite, and a
/// length to cut it to.
fn mutated(mut bytes: Vec<u8>, flips: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    for &(at, b) in flips {
        if !bytes.is_empty() {
            let at = at % bytes.len();
            bytes[at] = b;
        }
    }
    if let Some(n) = cut {
        bytes.truncate(n % (bytes.len() + 1));
    }
    bytes
}

fn snapshot_inputs(g: Grammar) -> impl Strategy<Value = Vec<u8>> {
    let flips = if g.odd { 0..3 } else { 0..1 };
    let cut = if g.odd {
        prop::option::weighted(0.1, any::<usize>()).boxed()
    } else {
        Just(None).boxed()
    };
    (
        snapshot_tree(g),
        any::<bool>(),
        prop::collection::vec((any::<usize>(), any::<u8>()), flips),
        cut,
    )
        .prop_map(|(t, as_json, flips, cut)| {
            let file = if as_json { json(&t) } else { pickle(&t) };
            mutated(file, &flips, cut)
        })
}

/// `t` as JSON (a shared value written out each time it is used, at most
/// a few times: shared values nest).
fn json(t: &Tree) -> Vec<u8> {
    let mut out = Vec::new();
    write_json(t, &mut out);
    out
}

fn write_json(t: &Tree, out: &mut Vec<u8>) {
    let items = |out: &mut Vec<u8>, items: &mut dyn Iterator<Item = &Tree>| {
        for (i, item) in items.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json(item, out);
        }
    };
    match t {
        Tree::Int(i) => out.extend(i.to_string().as_bytes()),
        Tree::Float => out.extend(b"0.5"),
        Tree::Str(s) => out.extend(serde_json::to_string(s).unwrap().as_bytes()),
        Tree::None => out.extend(b"null"),
        Tree::Bool(b) => out.extend(if *b { "true" } else { "false" }.as_bytes()),
        Tree::List(list) => {
            out.push(b'[');
            items(out, &mut list.iter());
            out.push(b']');
        }
        Tree::Dict(fields) => {
            out.push(b'{');
            for (i, (k, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(serde_json::to_string(k).unwrap().as_bytes());
                out.push(b':');
                write_json(v, out);
            }
            out.push(b'}');
        }
        Tree::Shared(t, n) => {
            out.push(b'[');
            items(
                out,
                &mut std::iter::repeat_n(&**t, usize::from(*n).min(3) + 1),
            );
            out.push(b']');
        }
        Tree::Raw(bytes) => out.extend(bytes),
    }
}

/// A JSON value at the edges, names and words of the protocol included.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![
            Just(0i64),
            Just(-1),
            Just(i64::MAX),
            Just(1 << 40),
            any::<i64>()
        ]
        .prop_map(Value::from),
        prop_oneof![Just(u64::MAX), Just(1e300 as u64)].prop_map(Value::from),
        prop_oneof![Just(0.5f64), Just(-1e300), Just(f64::MIN_POSITIVE)].prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
        prop::sample::select(Command::NAMES).prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Keys: every command's fields, the messages' own, and others.
fn key() -> impl Strategy<Value = String> {
    let mut keys: Vec<&'static str> = command::FIELDS_BY_HAND
        .iter()
        .flat_map(|(_, fields)| fields.iter().copied())
        .collect();
    keys.extend(vramlab_shared::framework::RESTART_FIELDS);
    keys.extend(command::ANNOTATION_KEYS);
    keys.extend([
        "cmd", "type", "id", "command", "record", "snapshot", "stats", "x",
    ]);
    prop::sample::select(keys).prop_map(str::to_string)
}

/// A command, a client message or a server message: its own shape with
/// any values in its fields, as text.
fn message() -> impl Strategy<Value = String> {
    (
        prop::sample::select(Command::NAMES),
        prop::sample::select(vec![
            "command",
            "snapshot",
            "stop",
            "ping",
            "presenter",
            "subscribe",
            "hello",
            "result",
            "delta",
            "events",
            "error",
            "progress",
            "x",
        ]),
        json_value(),
        0u8..3,
    )
        .prop_map(|(cmd, kind, mut v, shape)| {
            let fields = match &mut v {
                Value::Object(fields) => std::mem::take(fields),
                _ => Default::default(),
            };
            let mut line = Value::Object(fields);
            match shape {
                0 => line["cmd"] = json!(cmd),
                1 => {
                    line["type"] = json!(kind);
                    line["command"] = json!({"cmd": cmd});
                }
                _ => line["type"] = json!(kind),
            }
            line.to_string()
        })
}

/// A "will it fit?" request: its own fields and a config.json's, with
/// values at the edges (the page's and `vramlab plan`'s one reader).
fn plan_request() -> impl Strategy<Value = String> {
    use vramlab_shared::hf::{ask, Arch};
    const CONFIG: &[&str] = &[
        "model_type",
        "hidden_size",
        "n_embd",
        "intermediate_size",
        "n_inner",
        "num_hidden_layers",
        "n_layer",
        "num_attention_heads",
        "n_head",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "n_positions",
        "tie_word_embeddings",
        "torch_dtype",
        "sliding_window",
        "sliding_window_pattern",
        "attention_bias",
        "mlp_bias",
        "partial_rotary_factor",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    ];
    let request: Vec<&str> = (ask::FIELDS.iter())
        .filter(|f| !["model", "config"].contains(f))
        .chain(&["x"])
        .copied()
        .collect();
    let types = Arch::MODEL_TYPES;
    let others = [
        "bert",
        "Llama-3.1-8B",
        "bfloat16",
        "float16",
        "int8",
        "t4",
        "h200",
        "v100",
        "dynamic",
        "static",
        "eager",
        "sdpa",
        "generate",
        "train",
        "lora",
        "qlora",
        "",
    ];
    let words: Vec<&str> = types.iter().copied().chain(others).collect();
    let value = || {
        prop_oneof![
            4 => (1u64..48).prop_map(Value::from),
            1 => prop_oneof![Just(0u64), Just(1 << 20), Just(1 << 39), Just(u64::MAX)].prop_map(Value::from),
            1 => prop_oneof![Just(-1i64), Just(i64::MIN)].prop_map(Value::from),
            1 => Just(Value::from(0.5f64)),
            2 => prop::sample::select(words.clone()).prop_map(Value::from),
            1 => any::<bool>().prop_map(Value::from),
            1 => Just(Value::Null),
        ]
    };
    let fields = |keys: Vec<&'static str>, most| {
        prop::collection::vec((prop::sample::select(keys), value()), 0..most)
    };
    let shapes: Vec<String> = vramlab_shared::hf::known::all()
        .into_iter()
        .map(|k| k.name)
        .collect();
    let model = prop_oneof![
        prop::sample::select(shapes).prop_map(|name| ("model", Value::from(name))),
        (prop::sample::select(types), fields(CONFIG.to_vec(), 12)).prop_map(|(t, config)| {
            let mut c: serde_json::Map<String, Value> = config
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            c.insert("model_type".into(), Value::from(t));
            ("config", Value::Object(c))
        }),
    ];
    (model, fields(request, 5)).prop_map(|((key, model), request)| {
        let mut r: serde_json::Map<String, Value> = request
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        r.insert(key.into(), model);
        Value::Object(r).to_string()
    })
}

/// Runs `inputs` cases of `strategy` through `read`.
fn fuzz<T: std::fmt::Debug>(
    strategy: impl Strategy<Value = T>,
    inputs: u32,
    mut read: impl FnMut(T),
) {
    // The test command draws the same inputs each run; a long run
    // (`VRAMLAB_FUZZ_CASES`) draws new ones.
    let mut runner = match std::env::var_os("VRAMLAB_FUZZ_CASES") {
        Some(_) => TestRunner::new(Config::default()),
        None => TestRunner::deterministic(),
    };
    for _ in 0..inputs {
        let value = strategy.new_tree(&mut runner).expect("a case").current();
        read(value);
    }
}

#[test]
fn every_reader_answers_each_input_within_its_limits() {
    let mut snapshots = Worst::default();
    fuzz(snapshot_inputs(ODD), cases(300), |bytes| {
        // Never more than twice the file and a little beside the records
        // it writes out (the file itself, held by the caller, aside).
        let (_, records) = torch_snapshot::read_counted(&bytes);
        let limit = torch_snapshot::read_bound(bytes.len(), &records);
        snapshots.measure_within("the snapshot reader", &bytes, limit, || {
            let _ = torch_snapshot::read(&bytes);
        });
    });
    let mut messages = Worst::default();
    fuzz(message(), cases(1_000), |text| {
        messages.measure("the command and message readers", text.as_bytes(), || {
            let _ = command::parse_line(&text);
            let _ = protocol::parse_client_message(&text);
            let _ = serde_json::from_str::<ServerMessage>(&text);
        });
    });
    for (what, w) in [
        ("snapshot reader", snapshots),
        ("command and message readers", messages),
    ] {
        println!(
            "figure: {what}: {} inputs, worst {:?} and {} KiB each",
            w.inputs,
            w.time,
            w.bytes >> 10
        );
    }
}

/// A pickle streamed in chunks (as the page reads a file) reads as it does
/// whole: the same snapshot, or the same refusal, whatever the chunks'
/// sizes, within the same limit.
#[test]
fn every_pickle_streamed_in_chunks_reads_as_it_does_whole() {
    use vramlab_shared::torch_snapshot::stream::PickleStream;
    let inputs = (snapshot_inputs(ODD), 1usize..4096);
    let mut worst = Worst::default();
    let (mut same, mut pickles) = (0, 0);
    fuzz(inputs, cases(300), |(bytes, size)| {
        if bytes.first() != Some(&0x80) {
            return;
        }
        pickles += 1;
        let (whole, records) = torch_snapshot::read_counted(&bytes);
        let limit = torch_snapshot::read_bound(bytes.len(), &records);
        let mut streamed = None;
        worst.measure_within("the streamed pickle", &bytes, limit, || {
            let chunks: Vec<&[u8]> = bytes.chunks(size).collect();
            let mut s = PickleStream::new(bytes.len()).unwrap();
            let last = |i: usize| i + 1 == chunks.len();
            let read = (chunks.iter().enumerate())
                .try_for_each(|(i, c)| s.scan(c, last(i)))
                .and_then(|()| {
                    (chunks.iter().enumerate()).try_for_each(|(i, c)| s.read(c, last(i)))
                });
            streamed = Some(read.and_then(|()| s.finish()));
        });
        assert_eq!(streamed.unwrap(), whole, "chunks of {size}");
        same += 1;
    });
    println!(
        "figure: streamed pickles: {pickles} read in random chunks, {same} as read whole; worst {:?} and {} KiB",
        worst.time,
        worst.bytes >> 10
    );
}

/// A snapshot read in Your snapshot's worker crosses to the page as the
/// worker read it (`wire`); that buffer damaged, cut or changed, is
/// refused or read, never a panic.
#[test]
fn every_snapshot_that_reads_crosses_to_the_page_unchanged() {
    use vramlab_shared::torch_snapshot::wire;
    let inputs = (
        snapshot_inputs(WELL_FORMED),
        prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        prop::option::weighted(0.3, any::<usize>()),
    );
    let (mut crossed, mut damaged) = (0, 0);
    fuzz(inputs, cases(200), |(bytes, flips, cut)| {
        let Ok(s) = torch_snapshot::read(&bytes) else {
            return;
        };
        let buffer = wire::encode(&s);
        assert_eq!(wire::decode(&buffer).unwrap(), s);
        crossed += 1;
        let changed = mutated(buffer, &flips, cut);
        damaged += u32::from(wire::decode(&changed).is_err());
    });
    println!("figure: {crossed} snapshots crossed whole, {damaged} damaged copies refused");
    assert!(crossed >= 50, "{crossed}");
}

/// "Will it fit?": every request is read, a value or an error; one that
/// reads is planned (a small run played on its GPU, a larger one built),
/// never a panic, within the limits.
#[test]
fn every_plan_request_is_answered_within_its_limits() {
    use vramlab_shared::hf::{ask, generate, plan};
    let mut worst = Worst::default();
    let (mut read, mut played) = (0, 0);
    fuzz(plan_request(), cases(400), |text| {
        worst.measure("the plan reader", text.as_bytes(), || {
            let Ok(asked) = ask::read(&serde_json::from_str(&text).unwrap()) else {
                return;
            };
            read += 1;
            let q = asked.question;
            match q.task {
                plan::Task::Generate(g) => {
                    let forwards = q.config.layers * g.new_tokens;
                    if forwards <= 4096 && g.batch * g.prompt <= 1 << 16 {
                        played += u32::from(plan::run(&q).is_ok());
                    } else if forwards <= 64 {
                        let _ = generate::program(&q.config, q.dtype, g);
                    }
                }
                // A step's program is a few hundred ops a layer, whatever
                // the sizes.
                plan::Task::Train(_) if q.config.layers <= 64 => {
                    played += u32::from(plan::run(&q).is_ok());
                }
                plan::Task::Train(_) => {}
            }
            let _ = ask::python(&asked);
        });
    });
    println!(
        "figure: plan reader: {} inputs ({read} read, {played} played), worst {:?} and {} KiB each",
        worst.inputs,
        worst.time,
        worst.bytes >> 10
    );
    assert!(read >= 40 && played >= 10, "{read} read, {played} played");
}

/// What is done with a snapshot once it reads: the exact replay, a
/// what-if, `--fix`'s search and `vramlab diff` answer each, a value or
/// an error, never a panic.
#[test]
fn every_snapshot_that_reads_replays_fixes_and_compares() {
    use vramlab_shared::torch_snapshot::{diff, fix, replay, what_if};
    let expandable = what_if::parse_what_if("expandable_segments=true").unwrap();
    for (grammar, inputs) in [(WELL_FORMED, cases(200)), (ODD, cases(200))] {
        let (mut read, mut replayed) = (0, 0);
        fuzz(snapshot_inputs(grammar), inputs, |bytes| {
            let Ok(s) = torch_snapshot::read(&bytes) else {
                return;
            };
            read += 1;
            let device = replay::busiest_device(&s);
            if replay::replay_exact(&s, device).is_ok() {
                replayed += 1;
            }
            let _ = replay::replay_what_if(&s, device, &expandable);
            let _ = fix::search_fix(&s, device);
            let _ = diff::diff((&s, device), (&s, device));
        });
        println!("figure: {grammar:?}: {read} snapshots read, {replayed} replayed exactly or differing, fixed and compared");
        assert!(
            read > inputs / 4 || grammar.odd,
            "the grammar makes snapshots that read: {read} of {inputs}"
        );
    }
}

/// Sessions of random allocations and frees on a 64 MiB GPU, exported as
/// snapshots: `--fix` reads the room at each one's out-of-memory, in which
/// the recorded settings run out of memory where the recording did; a
/// recording compared with itself differs in nothing. `empty_cache()`
/// calls among them are the program's (their own stack), which the
/// what-ifs repeat, and the allocator's release-and-retry its own.
#[test]
fn a_recorded_out_of_memory_happens_again_in_the_room_fix_reads() {
    use vramlab_shared::torch_snapshot::{diff, export, fix};
    use vramlab_shared::Engine;
    let ops = prop::collection::vec((0u8..4, 1u64..48), 4..40);
    let mut checked = 0;
    fuzz(ops, cases(200), |ops| {
        let mut e = Engine::new_simulated();
        let start = json!({"cmd":"restart","framework":"pytorch","device_total_bytes": 64u64 << 20,"context_bytes": 0});
        assert!(e.run_line(&start.to_string()).ok);
        for (i, (kind, mib)) in ops.iter().enumerate() {
            let line = match kind {
                0 | 1 => json!({"cmd":"alloc","name":format!("t{}", i % 6),"bytes": mib << 20}),
                2 => json!({"cmd":"del","name":format!("t{}", i % 6)}),
                _ => json!({"cmd":"empty_cache"}),
            };
            let _ = e.run_line(&line.to_string());
        }
        let s = export::from_session(&e.snapshot(usize::MAX));
        let found = fix::search_fix(&s, 0).expect("an exported session replays");
        if let Some(report) = found {
            assert!(report.room_exact, "{report:?}");
            assert_eq!(
                report.recorded.out_of_memory_at,
                Some(report.event),
                "{report:?}"
            );
            checked += 1;
        }
        let same = diff::diff((&s, 0), (&s, 0)).expect("it compares");
        assert_eq!(same.peak_delta(), 0);
        assert!(same.all.is_empty() && same.explaining.is_empty());
    });
    println!("figure: {checked} recorded out-of-memory errors found again in their room");
    assert!(checked > 0, "some sessions run out of memory");
}
