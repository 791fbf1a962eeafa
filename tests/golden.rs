//! The simulator against a real GPU: every number in tests/golden/, written
//! on an H100 by `scripts/gpu-check.sh` (PyTorch 2.11, JAX 0.11; the
//! versions in tests/golden/PROVENANCE.md), reproduced by `--device sim`,
//! or differing exactly as tests/golden/differences.json records, with
//! its reason. A recorded difference that stops differing fails too, so
//! the record stays true.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use vramlab_shared::torch_snapshot::format::Action;
use vramlab_shared::torch_snapshot::replay::{export_what_if, replay_exact, replay_what_if};
use vramlab_shared::torch_snapshot::{self, what_if::parse_what_if};
use vramlab_shared::Engine;
use vramlab_tests::root;

/// Every stat real PyTorch's `memory_stats()` gives that `vramlab run`
/// prints too.
const PYTORCH_KEYS: [&str; 13] = [
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "requested_bytes",
    "inactive_split_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "segments",
    "allocations",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
];
/// XLA's `bytes_in_use`, `pool_bytes` and `peak_bytes_in_use`.
const JAX_KEYS: [&str; 3] = ["allocated_bytes", "reserved_bytes", "peak_allocated_bytes"];

fn golden() -> std::path::PathBuf {
    root().join("tests/golden")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The recorded differences: (what, where, which number) -> the GPU's
/// value, the simulator's, and why.
fn recorded_differences(kind: &str) -> BTreeMap<(String, String, String), Value> {
    read_json(&golden().join("differences.json"))[kind]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let key = |k: &str| d[k].as_str().unwrap_or_default().to_string();
            assert!(
                d["reason"].as_str().is_some_and(|r| r.len() > 20),
                "{d}: a difference needs its reason"
            );
            ((key("file"), d["at"].to_string(), key("key")), d.clone())
        })
        .collect()
}

/// Compares one number; a difference must be the recorded one.
struct Check {
    recorded: BTreeMap<(String, String, String), Value>,
    seen: Vec<(String, String, String)>,
    checked: usize,
    failures: Vec<String>,
}

impl Check {
    fn new(kind: &str) -> Self {
        Self {
            recorded: recorded_differences(kind),
            seen: Vec::new(),
            checked: 0,
            failures: Vec::new(),
        }
    }

    fn number(&mut self, file: &str, at: &Value, key: &str, gpu: Option<u64>, sim: Option<u64>) {
        self.checked += 1;
        let id = (file.to_string(), at.to_string(), key.to_string());
        match self.recorded.get(&id) {
            Some(d) => {
                self.seen.push(id.clone());
                if d["gpu"].as_u64() != gpu || d["sim"].as_u64() != sim {
                    self.failures.push(format!(
                        "{file} {at} {key}: recorded GPU {} and simulator {}, now {gpu:?} and {sim:?}",
                        d["gpu"], d["sim"]
                    ));
                }
            }
            None if gpu != sim => self
                .failures
                .push(format!("{file} {at} {key}: GPU {gpu:?}, simulator {sim:?}")),
            None => {}
        }
    }

    fn finish(self, what: &str, at_least: usize) {
        let unseen: Vec<_> = self
            .recorded
            .keys()
            .filter(|k| !self.seen.contains(k))
            .collect();
        assert!(
            unseen.is_empty(),
            "{what}: recorded differences not met: {unseen:?}"
        );
        assert!(
            self.failures.is_empty(),
            "{what}: {} of {} numbers differ:\n{}",
            self.failures.len(),
            self.checked,
            self.failures.join("\n")
        );
        assert!(
            self.checked >= at_least,
            "{what}: only {} numbers checked",
            self.checked
        );
        eprintln!("{what}: {} numbers checked", self.checked);
    }
}

/// Tensor-level command files (the lessons' and 200 random ones) replayed
/// in real PyTorch and JAX: every step's stats.
#[test]
fn tensor_replays_match_pytorch_and_jax_number_for_number() {
    let mut check = Check::new("replays");
    let mut files = 0;
    let mut entries: Vec<_> = std::fs::read_dir(golden())
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    entries.sort();
    for path in entries {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let (name, keys) = if let Some(n) = file.strip_suffix(".pytorch.jsonl") {
            (n.to_string(), &PYTORCH_KEYS[..])
        } else if let Some(n) = file.strip_suffix(".jax.jsonl") {
            (n.to_string(), &JAX_KEYS[..])
        } else {
            continue;
        };
        files += 1;
        let commands =
            std::fs::read_to_string(golden().join(format!("{name}.commands.jsonl"))).unwrap();
        let recorded: Vec<Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut engine = Engine::new_simulated();
        let ours: Vec<_> = commands
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| engine.run_line(l))
            .collect();
        assert_eq!(ours.len(), recorded.len(), "{file}: number of steps");
        for (o, g) in ours.iter().zip(&recorded) {
            assert_eq!(o.ok, g["ok"] == true, "{file} step {}: ok", o.step);
            for key in keys {
                check.number(
                    &name,
                    &json!(o.step),
                    key,
                    g["stats"][key].as_u64(),
                    o.stats.get(key),
                );
            }
        }
    }
    assert!(files >= 200, "only {files} replayed files");
    check.finish("tensor replays", 10_000);
}

/// A training step of each kind as step_trace.py runs it, on the GPU
/// (tests/reference/gpu_step.py) and in the simulator under PyTorch 2.11 on
/// an H100, every case in one process as the GPU run played them (each
/// case's model, optimizer and data deleted after it, `empty_cache()`):
/// what lives before the second step (parameters, Adam's state, the loss,
/// and the cuBLAS workspaces 2.11 keeps per handle from earlier cases too:
/// 32 MiB each for the main thread's and autograd's, 1 MiB each for their
/// cuBLASLt calls) and the second step's peak over it.
#[test]
fn training_steps_keep_and_peak_as_on_the_gpu() {
    let mut check = Check::new("steps");
    let all = read_json(&golden().join("gpu_step.json"));
    let mut engine = Engine::new_simulated();
    run(
        &mut engine,
        json!({"cmd":"restart","framework":"pytorch","torch_version":"2.11","gpu":"h100-80gb"}),
    );
    for (i, case) in all["steps"].as_array().unwrap().iter().enumerate() {
        let at = json!(i);
        let label = case_label(case);
        if let Some(e) = case["error"].as_str() {
            eprintln!("{label}: PyTorch itself failed on the GPU ({e})");
            continue;
        }
        let (left, peak) = simulated_steps(&mut engine, case);
        // The GPU run held one batch (x and y); an MLP's simulated data
        // set lives on the device instead (counted apart), other kinds'
        // batches are held after a step as the GPU run held them.
        let batch = if case["kind"] == "mlp" {
            batch_bytes(case)
        } else {
            0
        };
        let gpu_left = case["allocated_before"].as_u64().unwrap() - batch;
        check.number(
            &label,
            &at,
            "left_by_first_step",
            Some(gpu_left),
            Some(left),
        );
        let gpu_peak = case["peak_bytes"].as_u64().unwrap();
        check.number(&label, &at, "second_step_peak", Some(gpu_peak), Some(peak));
    }
    check.finish("training steps", 40);
}

fn run(engine: &mut Engine, line: Value) -> vramlab_shared::StepRecord {
    let r = engine.run_line(&line.to_string());
    assert!(r.ok, "{line}: {:?}", r.error);
    r
}

fn case_label(case: &Value) -> String {
    let mut parts = vec![case["kind"].as_str().unwrap().to_string()];
    for k in ["fused", "checkpointing", "half"] {
        if case[k] == true {
            parts.push(k.to_string());
        }
    }
    for k in ["amp", "lora_rank", "accumulate", "layers"] {
        if !case[k].is_null() {
            parts.push(format!("{k}={}", case[k]));
        }
    }
    parts.join(" ")
}

/// The bytes of one MLP batch the GPU run held: x and y, each in 512-byte
/// blocks.
fn batch_bytes(case: &Value) -> u64 {
    let u = |k: &str| case[k].as_u64().unwrap();
    let block = |n: u64| n.div_ceil(512) * 512;
    let x = if case["half"] == true { 2 } else { 4 };
    block(u("batch") * u("input_dim") * x) + block(u("batch") * 8)
}

const SHAPE: [&str; 11] = [
    "layers",
    "width",
    "input_dim",
    "classes",
    "channels",
    "image_size",
    "blocks",
    "heads",
    "seq_len",
    "vocab",
    "lora_rank",
];

/// One case in `engine`'s process: (allocated before the second step less
/// the data set, the second step's peak over it); then its objects go.
fn simulated_steps(engine: &mut Engine, case: &Value) -> (u64, u64) {
    let mut model = json!({"cmd":"model","name":"model","kind":case["kind"]});
    for (k, v) in case.as_object().unwrap() {
        if SHAPE.contains(&k.as_str()) {
            model[k] = v.clone();
        }
    }
    if case["half"] == true {
        model["dtype"] = json!("float16");
    }
    let u = |k: &str| case[k].as_u64().unwrap_or(0);
    let (features, classes) = match case["kind"].as_str().unwrap() {
        "transformer" => (u("seq_len"), u("vocab")),
        "cnn" => (u("channels") * u("image_size").pow(2), u("classes")),
        _ => (u("input_dim"), u("classes")),
    };
    run(engine, model);
    let before_data = run(
        engine,
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
    );
    // Only an MLP's data set can live on the device; other kinds copy
    // each batch in. The GPU run held one batch instead.
    let data = json!({"cmd":"data","name":"data","on_device":case["kind"] == "mlp","features":features,"classes":classes});
    let data_set = run(engine, data).stats.allocated_bytes - before_data.stats.allocated_bytes;
    let accumulate = case["accumulate"].as_u64().unwrap_or(1);
    let amp = if case["amp"].is_string() {
        case["amp"].clone()
    } else {
        json!(false)
    };
    let train = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,
        "batch_size":case["batch"].as_u64().unwrap() * accumulate,"amp":amp,
        "checkpointing":case["checkpointing"] == true,"accumulate":accumulate,
        "attention":if case["fused"] == true { "sdpa" } else { "eager" }});
    let before = run(engine, train.clone()).stats.allocated_bytes;
    let peak = run(engine, train).stats.step_peak_allocated_bytes - before;
    for name in ["model", "opt", "data"] {
        run(engine, json!({"cmd":"del","name":name}));
    }
    // The loop's `x` and `y` were the GPU run's locals, gone with the case.
    for name in ["x", "y"] {
        engine.run_line(&json!({"cmd":"del","name":name}).to_string());
    }
    for line in [json!({"cmd":"gc"}), json!({"cmd":"empty_cache"})] {
        run(engine, line);
    }
    (before - data_set, peak)
}

/// PyTorch's own snapshots of a run ending in an out-of-memory error on
/// the GPU, with and without expandable segments: replayed exactly.
#[test]
fn gpu_snapshots_replay_exactly() {
    for name in ["snapshot-oom.pickle", "snapshot-oom-expandable.pickle"] {
        let bytes = std::fs::read(golden().join(name)).unwrap();
        let snapshot = torch_snapshot::read(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let run = replay_exact(&snapshot, 0).unwrap();
        assert_eq!(run.exact, Some(true), "{name}: {:?}", run.first_difference);
        assert_eq!(run.recorded_ooms, 1, "{name}");
        assert!(run.events > 2000, "{name}: {} events", run.events);
    }
}

/// PyTorch's own snapshots of CUDA graphs on the GPU (a whole training
/// step captured by `torch.cuda.graph` into its private pool and replayed,
/// kept alive or freed with `empty_cache()` after; torch.compile's
/// reduce-overhead, CUDA graph trees): replayed exactly, private pools and
/// all, the dump naming them.
#[test]
fn cuda_graph_snapshots_replay_exactly() {
    for (name, pool) in [
        ("snapshot-graph.pickle", (1, 0)),
        ("snapshot-graph-freed.pickle", (1, 0)),
        ("snapshot-reduce-overhead.pickle", (0, 1)),
    ] {
        let bytes = std::fs::read(golden().join(name)).unwrap();
        let snapshot = torch_snapshot::read(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let pools: Vec<(u64, u64)> = snapshot
            .segments
            .iter()
            .map(|s| s.segment_pool_id)
            .collect();
        assert!(pools.contains(&pool), "{name}: {pools:?}");
        let run = replay_exact(&snapshot, 0).unwrap();
        assert_eq!(run.exact, Some(true), "{name}: {:?}", run.first_difference);
        assert!(run.events > 300, "{name}: {} events", run.events);
    }
}

/// The same recordings under "what if": with the recorded settings the
/// what-if holds what the GPU held at every request after the first
/// release (the `empty_cache()` that `torch.cuda.graph` calls before it
/// captures is repeated there; a live graph's pool is not released), and
/// its peak is the recording's. Each what-if written as a snapshot, with
/// expandable segments too (a range per private pool), names its private
/// pools' segments and replays exactly.
#[test]
fn cuda_graph_what_ifs_follow_the_recording_and_replay_exactly_when_written() {
    for name in [
        "snapshot-graph.pickle",
        "snapshot-graph-freed.pickle",
        "snapshot-reduce-overhead.pickle",
    ] {
        let bytes = std::fs::read(golden().join(name)).unwrap();
        let snapshot = torch_snapshot::read(&bytes).unwrap();
        let exact = replay_exact(&snapshot, 0).unwrap();
        let as_recorded = replay_what_if(&snapshot, 0, &Default::default()).unwrap();
        let trace = snapshot.trace(0);
        let first_release = (0..trace.len())
            .find(|&i| trace.action(i) == Action::SegmentFree)
            .unwrap();
        let requests: Vec<usize> = (first_release..trace.len())
            .filter(|&i| trace.action(i) == Action::Alloc)
            .collect();
        assert!(requests.len() > 20, "{name}");
        for i in requests {
            let (held, recorded) = (as_recorded.timeline[i], exact.timeline[i]);
            assert_eq!(
                held.reserved_bytes, recorded.reserved_bytes,
                "{name}: event {i}"
            );
        }
        assert_eq!(
            as_recorded.peak_reserved_bytes, exact.peak_reserved_bytes,
            "{name}"
        );
        for what_if in ["max_split_size_mb=64", "expandable_segments=true"] {
            let settings = parse_what_if(what_if).unwrap();
            let written = export_what_if(&snapshot, 0, &settings).unwrap();
            let private = (written.segments.iter()).filter(|s| s.segment_pool_id != (0, 0));
            assert!(private.count() > 0, "{name}, {what_if}");
            let streams: Vec<u64> = written.segments.iter().map(|s| s.stream).collect();
            assert!(streams.iter().all(|&s| s >> 63 == 0), "{name}: {streams:?}");
            let run = replay_exact(&written, 0).unwrap();
            assert_eq!(
                run.exact,
                Some(true),
                "{name}, {what_if}: {:?}",
                run.first_difference
            );
            let what_if_run = replay_what_if(&snapshot, 0, &settings).unwrap();
            assert_eq!(run.peak_reserved_bytes, what_if_run.peak_reserved_bytes);
        }
    }
}

/// The training steps the GPU computed with vramlab's own kernels and
/// cuBLAS (tests/golden/gpu-kernels.txt, from `server/tests/gpu.rs`): the
/// CPU interpreter here computes losses the recorded GPU losses follow,
/// float32 within 1e-5 of them, autocast's half types within 1e-2; so a
/// change to the CPU's arithmetic that the kernels do not share fails.
#[test]
fn the_gpus_kernels_losses_follow_the_cpu_interpreter() {
    let text = std::fs::read_to_string(golden().join("gpu-kernels.txt")).unwrap();
    let train_keys = ["batch_size", "amp", "accumulate", "checkpointing"];
    let mut cases = 0;
    for line in text.lines() {
        let Some((fields, rest)) = line.split_once(": GPU [") else {
            continue;
        };
        let fields = fields.rsplit(" ... ").next().unwrap();
        let all: Value = serde_json::from_str(&format!("{{{fields}}}")).unwrap();
        let gpu: Vec<f64> = rest
            .split(']')
            .next()
            .unwrap()
            .split(", ")
            .map(|s| {
                s.trim_start_matches("Some(")
                    .trim_end_matches(')')
                    .parse()
                    .unwrap()
            })
            .collect();
        let (mut model, mut train) = (
            json!({"cmd":"model","name":"model"}),
            json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":3}),
        );
        for (k, v) in all.as_object().unwrap() {
            let to = if train_keys.contains(&k.as_str()) {
                &mut train
            } else {
                &mut model
            };
            to[k] = v.clone();
        }
        let n = |k: &str| all[k].as_u64().unwrap();
        let (features, classes) = match all["kind"].as_str().unwrap() {
            "mlp" => (n("input_dim"), n("classes")),
            "transformer" => (n("seq_len"), n("vocab")),
            _ => (
                n("channels") * n("image_size") * n("image_size"),
                n("classes"),
            ),
        };
        let mut e = Engine::new_simulated();
        run(&mut e, model);
        run(
            &mut e,
            json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        );
        run(
            &mut e,
            json!({"cmd":"data","name":"data","samples":512,"features":features,"classes":classes}),
        );
        let r = run(&mut e, train);
        let cpu: Vec<f64> = r.value.unwrap()["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["loss"].as_f64().unwrap())
            .collect();
        let tolerance = if all["amp"].is_string() { 1e-2 } else { 1e-5 };
        assert_eq!(cpu.len(), gpu.len(), "{fields}");
        for (c, g) in cpu.iter().zip(&gpu) {
            assert!(
                (c - g).abs() <= tolerance * c.abs(),
                "{fields}: CPU {cpu:?}, GPU {gpu:?}"
            );
        }
        cases += 1;
    }
    assert_eq!(cases, 7, "every kind's case is recorded");
}

/// The snippets of `tests/python/` run by CPython with real PyTorch and JAX
/// on the GPU (`python-snippets.json`, by `scripts/gpu-check.sh`) printed
/// what the shims print (their `.out`), but where the card or the release
/// differs: the golden run's H100 and PyTorch 2.11 against the `.out`'s T4
/// and PyTorch 2.15. TensorFlow was not installed there.
#[test]
fn the_snippets_print_on_a_gpu_what_the_shims_print() {
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/golden/python-snippets.json")).unwrap(),
    )
    .unwrap();
    // Why each of these differs on the golden machine.
    let card_or_release = [
        ("11-oom-message", "80 GB hold what a T4's 15 GB cannot: no out-of-memory"),
        ("17-mem-get-info", "the card's name and size"),
        ("20-train-step", "PyTorch 2.11 keeps each cuBLAS handle's 32 MiB workspace on an H100 (2.15 frees it per call)"),
        ("21-adam-state", "the same: the forward's and backward's handles each keep one"),
        ("22-dataloader", "the same"),
        ("23-total-loss-item", "the same"),
        ("24-total-loss-tensor", "the same"),
        ("25-no-grad", "the same"),
        ("31-matmul", "the same"),
        ("35-jax-arrays", "XLA preallocates 75% of the card"),
        ("44-generate", "the same: generate's first product keeps one"),
        ("42-jax-optax", "the shims run the jitted step op by op (they say so): its temporaries come \
          and go between the new arrays, which then land in other chunks of XLA's BFC allocator, \
          and bytes_in_use counts whole chunks (one under twice the request is not split); XLA's \
          compiled step gave 26,388,736 bytes, the shims' first step 26,374,400"),
    ];
    let mut compared = 0;
    for (name, run) in golden["snippets"].as_object().unwrap() {
        if run["exit"] != 0 || card_or_release.iter().any(|(n, _)| n == name) {
            continue;
        }
        let out = std::fs::read_to_string(root().join(format!("tests/python/{name}.out"))).unwrap();
        assert_eq!(
            run["stdout"].as_str().unwrap(),
            out,
            "{name}: the GPU printed otherwise"
        );
        compared += 1;
    }
    assert!(compared >= 26, "{compared} snippets compared");
}

/// Transformers' snippets (`44-generate.py`, `45-qlora.py`: Qwen3-0.6B's
/// `generate`, QLoRA on Llama-3.2-1B loaded by `from_pretrained` with
/// bitsandbytes' 4 bits, peft's preparation and adapters, two AdamW steps)
/// print under the golden machine's release and card (PyTorch 2.11, an
/// H100) every number the GPU printed, to the byte, but generate's peak.
#[test]
fn transformers_snippets_print_the_gpus_bytes_under_its_release() {
    let golden = read_json(&golden().join("python-snippets.json"));
    let settings = r#"{"framework":"pytorch","torch_version":"2.11","gpu":"h100-80gb"}"#;
    for name in ["44-generate", "45-qlora"] {
        let gpu = golden["snippets"][name]["stdout"].as_str().unwrap();
        let source =
            std::fs::read_to_string(root().join(format!("tests/python/{name}.py"))).unwrap();
        let run = vramlab_tests::python_run_with(&source, settings);
        for (ours, theirs) in run.stdout.lines().zip(gpu.lines()) {
            // Not yet explained: 106,496 bytes (0.008%) under the GPU's.
            // The large requests were the GPU's, in order (its snapshot);
            // generate's small bookkeeping tensors the engine does not
            // make (position ids, finished-sequence flags, the mask's
            // checks) held about 34 KiB at its peak.
            if ours.starts_with("peak in generate:") {
                assert_eq!(theirs, "peak in generate: 1324149760");
                assert_eq!(ours, "peak in generate: 1324043264");
                continue;
            }
            assert_eq!(ours, theirs, "{name}: {}", run.stderr);
        }
        assert_eq!(run.stdout.lines().count(), gpu.lines().count(), "{name}");
    }
}

/// The large requests (over 1 MiB: allocations, and frees as minus their
/// size) the engine makes for `commands`, in order, as its exported
/// snapshot records them.
fn large_requests(commands: &Path) -> Vec<i64> {
    let out = std::env::temp_dir().join(format!("vramlab-events-{}.json", std::process::id()));
    let status = std::process::Command::new(vramlab_tests::vramlab_bin())
        .args(["run", "--device", "sim", "--export-snapshot"])
        .arg(&out)
        .arg(commands)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("vramlab runs");
    assert!(status.success());
    let snapshot = read_json(&out);
    std::fs::remove_file(&out).ok();
    let trace = snapshot["device_traces"][0].as_array().unwrap();
    trace
        .iter()
        .filter(|e| e["size"].as_i64().unwrap() > 1 << 20)
        .filter_map(|e| match e["action"].as_str().unwrap() {
            "alloc" => e["size"].as_i64(),
            "free_requested" => e["size"].as_i64().map(|s| -s),
            _ => None,
        })
        .collect()
}

/// PyTorch's own snapshots of snippets 44 and 45 on the H100
/// (`snapshot-*.events.json`, their large requests by
/// `tests/reference/snapshot_events.py`), against the engine given the
/// commands the shims send for the same lines: Qwen3-0.6B's weights and
/// `generate`'s 64 tokens request for request, to the end (the GPU's
/// process then exits, freeing its weights); QLoRA's `from_pretrained`
/// (the allocator warmup, the checkpoint's order, bitsandbytes'
/// quantization), peft's preparation and adapters, the first forward and
/// the backward up to the final norm's input, where autograd adds the
/// second gradient into the first in place (`can_accumulate_inplace`)
/// and the engine adds it out of place.
#[test]
fn transformers_runs_request_what_the_gpus_snapshots_recorded() {
    for (name, agree) in [("44-generate", None), ("45-qlora", Some(2533))] {
        let gpu: Vec<i64> = serde_json::from_value(
            read_json(&golden().join(format!("snapshot-{name}.events.json")))["events"].clone(),
        )
        .unwrap();
        let ours = large_requests(&golden().join(format!("snapshot-{name}.commands.jsonl")));
        let same = ours.iter().zip(&gpu).take_while(|(a, b)| a == b).count();
        match agree {
            None => {
                assert_eq!(
                    same,
                    ours.len(),
                    "{name}: the engine parts at request {same}"
                );
                assert!(gpu[same..].iter().all(|e| *e < 0), "{name}: the GPU's end");
            }
            Some(n) => assert_eq!(same, n, "{name}: the engine parts at request {same}"),
        }
    }
}

/// The cards `lesson_python_gpu.py` stands a lesson's GPU in for (its
/// `GPU_MODELS`: the memory limit of a lesson naming one) are vramlab's.
#[test]
fn the_gpu_run_limits_a_lesson_to_vramlabs_cards() {
    let out = std::process::Command::new("python3")
        .arg(root().join("tests/reference/lesson_python_gpu.py"))
        .arg("--cards")
        .output()
        .expect("python3 runs");
    let cards: BTreeMap<String, (u64, u64)> = serde_json::from_slice(&out.stdout).unwrap();
    let ours: BTreeMap<String, (u64, u64)> = vramlab_shared::gpu::GpuModel::ALL
        .iter()
        .map(|g| {
            (
                g.id().to_string(),
                (g.spec().total_bytes, g.spec().context_bytes),
            )
        })
        .collect();
    assert_eq!(cards, ours);
}

/// The lessons as Python (`tests/lessons/*.kN.py`) run by CPython with real
/// PyTorch and JAX on the GPU (`lessons-python.json`, by
/// `tests/reference/lesson_python_gpu.py`): the shims, given the same
/// instrumented source under the lesson's settings (with the golden
/// machine's PyTorch release and compute capability), mark the same
/// allocated and reserved bytes after every statement, and the same peak
/// during it, but where a reason below says why not. The source is still what the lesson's code
/// instruments to, so a lesson whose code changed asks for a new GPU run.
#[test]
fn the_lessons_python_marks_on_a_gpu_what_the_shims_mark() {
    let golden = read_json(&golden().join("lessons-python.json"));
    // Where CPython's own collector runs depends on every object the
    // process made (generation 0 collects after 700 new containers): in
    // one GPU run it freed lesson 02's cycle during `empty_cache()`, in the
    // next not (so gc.collect()'s statement peaked at 64 MiB or at 0);
    // gc.collect() frees it in both. Either is right.
    let may_differ = [
        ("02-cycle-needs-gc.k1.py", 9),
        ("02-cycle-needs-gc.k1.py", 11),
    ];
    let addresses = "the CUDA driver's addresses (most likely; this lesson has no snapshot): in \
                     snippet 44's generate on the same H100 the large requests were the engine's, \
                     in order, but 37 of 81 segments came below the one before, the allocator's \
                     best fit broke ties by address, and one 20 MiB segment fewer was made (its \
                     replay with the recorded addresses is exact)";
    let cudnn = "cuDNN's convolution workspaces, cuDNN's own choice at run time (as in \
                 differences.json's CNN step): reserved up to 1.5 GB higher on the GPU; the small \
                 allocated difference at the first of these marks is not yet explained";
    let labels_first = "`cross_entropy(model(inputs.cuda()), targets.cuda())`: PyTorch runs \
                        the model's forward before Python evaluates targets.cuda(), as the \
                        engine's forward command does; the shims run a model's forward when \
                        the loss reads its output, after targets.cuda(), so the labels live \
                        through the forward: its peak is their size higher (512 B to 512 KiB), \
                        and an out-of-memory in it leaves them allocated";
    let differences: &[(&str, &[u64], &str)] = &[
        ("04-jax-preallocation.k1.py", &[4, 5],
         "XLA preallocated 12 GiB + 2 MiB of the H100 standing in for 75% of a 16 GiB card, for \
          any fraction within a few bytes of 12 GiB (xla-fraction.jsonl), and exactly 8 GiB for 50%"),
        ("09-loss-history-leak.k1.py", &[12, 14], labels_first),
        ("12-last-exception.k1.py", &[6, 7], labels_first),
        ("16-long-context-attention.k1.py", &[9],
         "not yet explained: 1 MiB more allocated and 256 MiB more reserved on the GPU after two \
          eager steps (its snapshot shows a 1 MiB block getCUDABlasLtWorkspace allocates in the \
          first addmm with a bias)"),
        ("16-long-context-attention.k2.py", &[11], "not yet explained: 1.8 MB less allocated on \
          the GPU after the fused-attention steps"),
        ("17-transformer-checkpointing.k1.py", &[10, 11, 12, 13, 14],
         "not yet explained: every allocated number equal, 48 MiB more reserved on the GPU from \
          the checkpointed steps on (24 MiB at the out-of-memory)"),
        ("18-cnn-image-size.k1.py", &[9], cudnn),
        ("18-cnn-image-size.k2.py", &[9, 10], cudnn),
        ("19-lora.k1.py", &[11, 12],
         "not yet explained: at the out-of-memory the GPU's failed step held 134 MB more than \
          the engine's (equal once it is deleted), and 117 MB more stays reserved"),
        ("19-lora.k2.py", &[12, 13, 14],
         "not yet explained: at the out-of-memory the engine's failed step holds 33.6 MB more, \
          and reserves 33.5 MB more"),
        ("13-checkpointing.k1.py", &[12],
         "a bias gradient's column sum over 4,096 rows took a 32 MiB staging buffer from the \
          caching allocator (ATen's gpu_reduce_kernel, as in differences.json's steps) in a new \
          segment, freed at once: reserved stays 32 MiB higher, and backward's peak is 20 MiB \
          higher; the CPU's sum, which the simulator follows, takes none"),
        ("13-checkpointing.k1.py", &[7, 11],
         "not yet explained: the forward's peak is 32 KiB lower on the GPU"),
        ("06-activations-and-batch-size.k1.py", &[7, 10, 12], labels_first),
        ("07-optimizer-state.k1.py", &[8], labels_first),
        ("20-generate-kv-cache.k1.py", &[6, 7], addresses),
        ("20-generate-kv-cache.k1.py", &[8, 9],
         "the dynamic cache ran out 59 MB (6 tokens) sooner on the GPU, its reserved 52 MB \
          lower: where the cache's copies landed (the addresses, as above)"),
        ("20-generate-kv-cache.k1.py", &[10, 11],
         "not yet explained: the static cache's prefill ran out in an MLP's product as the \
          engine's did, but with 46.5 MB less allocated on the GPU (9.84 GiB in its message, \
          9.88 in the engine's); what the exception then dropped, the values on the MLP's \
          stack (`act_fn(gate_proj(x))`, `up_proj(x)`: 1.25 GiB), the engine drops too"),
        ("21-qlora.k2.py", &[16],
         "the four-sequence step's backward ran out as the engine's did (the same peak, the \
          same 19.76 GiB in the message, the same bytes freed as autograd unwound but 512), \
          and the GPU reserved 134 MB more: not yet explained"),
        ("08-set-to-none.k1.py", &[8, 9],
         "not yet explained: a training step's peak is 4,096 bytes higher on the GPU"),
    ];
    // Lessons the GPU run stopped at `lesson_python_gpu.py`'s time limit:
    // the marks before it are compared.
    let timed_out: &[(&str, &str)] = &[
        (
            "20-generate-kv-cache.k1.py",
            "stopped at 240 s in the last generate (256 prompts, 1,024 new tokens); marks 1-12 ran",
        ),
        (
            "21-qlora.k1.py",
            "240 s ran out (280 s alone in a second run) before the first mark: `from_config` \
          initializes Llama-3.1-8B's 8 billion weights on the CPU",
        ),
    ];
    let mut compared = 0;
    let mut differing = Vec::new();
    for lesson in golden["lessons"].as_array().unwrap() {
        let file = lesson["file"].as_str().unwrap();
        if lesson.get("skipped").is_some() {
            continue;
        }
        let path = root().join("tests/lessons").join(file);
        let instrumented = std::process::Command::new("python3")
            .arg(root().join("tests/reference/lesson_python_gpu.py"))
            .arg("--instrument")
            .arg(&path)
            .output()
            .expect("python3 runs");
        let source = lesson["source"].as_str().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&instrumented.stdout),
            source,
            "{file}'s code changed since its GPU run: run scripts/gpu-check.sh's lessons_python part"
        );
        let mut settings = lesson["settings"].clone();
        if settings["framework"] == "pytorch" {
            settings["torch_version"] = json!("2.11");
            settings["compute_capability"] = json!([9, 0]);
        }
        let run = vramlab_tests::python_run_with(source, &settings.to_string());
        let marks: Vec<Vec<u64>> = run
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("vramlab-mark "))
            .map(|l| l.split(' ').map(|n| n.parse().unwrap()).collect())
            .collect();
        let gpu: Vec<Vec<u64>> = serde_json::from_value(lesson["marks"].clone()).unwrap();
        if lesson["exit"].is_null() {
            // Stopped at the script's time limit: the marks it reached.
            assert!(
                timed_out.iter().any(|(f, _)| *f == file),
                "{file} timed out on the GPU with no reason recorded"
            );
            assert!(marks.len() >= gpu.len(), "{file}: {}", run.stderr);
        } else {
            assert_eq!(lesson["exit"], 0, "{file} failed on the GPU");
            assert_eq!(marks.len(), gpu.len(), "{file}: {}", run.stderr);
        }
        for (sim, gpu) in marks.iter().zip(&gpu) {
            if sim != gpu {
                differing.push((
                    file.to_string(),
                    gpu[0],
                    format!("GPU {gpu:?}, shims {sim:?}"),
                ));
            }
        }
        compared += 1;
    }
    let explained = |(file, mark, _): &(String, u64, String)| {
        may_differ.contains(&(file.as_str(), *mark))
            || differences
                .iter()
                .any(|(f, marks, _)| f == file && marks.contains(mark))
    };
    let unexplained: Vec<_> = differing.iter().filter(|d| !explained(d)).collect();
    assert!(
        unexplained.is_empty(),
        "differences with no reason: {unexplained:#?}"
    );
    for (file, marks, why) in differences {
        for mark in *marks {
            assert!(
                differing.iter().any(|(f, m, _)| f == file && m == mark),
                "{file} mark {mark} is recorded as differing ({why}), but no longer does"
            );
        }
    }
    assert!(compared >= 23, "{compared} lessons compared");
}
