//! Training a Hugging Face model in the process, held to the plan's play of
//! the same step (`hf::plan`, itself held to transformers' own step traced
//! on the CPU and to an H100's).

use super::*;
use crate::gpu::GpuModel;
use crate::hf::known;
use crate::hf::plan::{self, Question, Task, Training};
use crate::hf::step::Quant4;
use crate::protocol::StepRecord;
use crate::train::kinds::Attention;
use crate::types::{Category, Dtype};

fn run(engine: &mut Engine, line: &str) -> StepRecord {
    let r = engine.run_line(line);
    engine.check_invariants().unwrap();
    assert!(r.ok, "{line}: {:?}", r.error);
    r
}

/// A simulated process after `lines`, each of which must succeed.
fn process_after(lines: &[&str]) -> Engine {
    let mut e = Engine::new_simulated();
    for line in lines {
        run(&mut e, line);
    }
    e
}

/// A process with a small Llama (`hidden`, `intermediate`, `layers`; a
/// vocabulary of 1,000), AdamW over it, and sequences of `features`
/// tokens.
fn small_llama((hidden, intermediate, layers): (u64, u64, u64), features: u64) -> Engine {
    let config = format!(
        r#"{{"model_type":"llama","hidden_size":{hidden},"intermediate_size":{intermediate},"num_hidden_layers":{layers},"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":1000}}"#
    );
    process_after(&[
        r#"{"cmd":"restart","framework":"pytorch"}"#,
        &format!(r#"{{"cmd":"model","name":"model","kind":"hf","config":{config}}}"#),
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}"#,
        &format!(
            r#"{{"cmd":"data","name":"data","samples":64,"features":{features},"classes":1000}}"#
        ),
    ])
}

/// Two steps statement by statement, each in a function of its own (as
/// the traces and the H100's runs take them); the second's peak over
/// what lived before it.
fn second_step(e: &mut Engine, forward: &str) -> u64 {
    let mut rise = 0;
    for _ in 0..2 {
        let before = e.stats().allocated_bytes;
        e.run_line(r#"{"cmd":"reset_peak_memory_stats"}"#);
        run(e, forward);
        run(e, r#"{"cmd":"backward","name":"loss"}"#);
        run(e, r#"{"cmd":"step","optimizer":"opt"}"#);
        let r = run(
            e,
            r#"{"cmd":"zero_grad","optimizer":"opt","set_to_none":true}"#,
        );
        rise = r.stats.peak_allocated_bytes - before;
        // The step is a function: its `loss` goes as it returns.
        run(e, r#"{"cmd":"del","name":"loss"}"#);
    }
    rise
}

fn planned(name: &str, t: Training, gpu: GpuModel) -> u64 {
    let config = known::find(name).unwrap().config;
    let r = plan::run(&Question {
        config,
        dtype: config.dtype,
        gpu,
        torch: Default::default(),
        task: Task::Train(t),
    })
    .unwrap();
    r.peak_allocated - r.weights - r.state
}

fn training(lora: Option<u64>, quant: Option<Quant4>, checkpointing: bool) -> Training {
    Training {
        batch: 2,
        seq: 256,
        attention: Attention::Sdpa,
        checkpointing,
        lora,
        adam8bit: false,
        quant,
        amp: None,
    }
}

#[test]
fn lora_steps_peak_as_the_plan_plays_them() {
    let mut e = process_after(&[
        r#"{"cmd":"restart","framework":"pytorch","gpu":"h100-80gb"}"#,
        r#"{"cmd":"model","name":"model","kind":"hf","config":"Qwen/Qwen3-0.6B"}"#,
    ]);
    let weights = e.stats().allocated_bytes;
    run(&mut e, r#"{"cmd":"lora","model":"model","rank":16}"#);
    run(
        &mut e,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}"#,
    );
    run(
        &mut e,
        r#"{"cmd":"alloc","name":"ids","shape":[2,256],"dtype":"int64"}"#,
    );
    let forward = r#"{"cmd":"forward","name":"loss","model":"model","data":"","batch_size":2,"checkpointing":true,"attention":"sdpa","batch":["ids","ids"]}"#;
    let rise = second_step(&mut e, forward);
    assert_eq!(
        rise,
        planned(
            "Qwen3-0.6B",
            training(Some(16), None, true),
            GpuModel::H100_80gb
        )
    );
    // What stays: the weights, the adapters and their AdamW state, the
    // prompt; no gradient.
    let r = run(&mut e, r#"{"cmd":"gc"}"#);
    assert_eq!(
        r.stats
            .categories
            .get(&Category::Gradient)
            .copied()
            .unwrap_or(0),
        0
    );
    assert!(r.stats.categories[&Category::OptimizerState] > 0);
    assert!(r.stats.allocated_bytes > weights);
}

#[test]
fn qlora_loads_and_steps_as_the_plan_plays_it() {
    let mut e = process_after(&[
        r#"{"cmd":"restart","framework":"pytorch","gpu":"rtx-4090"}"#,
        r#"{"cmd":"model","name":"model","kind":"hf","config":"meta-llama/Llama-3.2-1B","quantization":"nf4","dtype":"bfloat16"}"#,
        r#"{"cmd":"prepare_kbit","model":"model"}"#,
        r#"{"cmd":"lora","model":"model","rank":16,"all_linear":true}"#,
    ]);
    let config = known::find("Llama-3.2-1B").unwrap().config;
    let quant = Quant4 {
        nf4: true,
        double_quant: true,
        compute: Dtype::Bfloat16,
    };
    let t = training(Some(16), Some(quant), true);
    let r = plan::run(&Question {
        config,
        dtype: config.dtype,
        gpu: GpuModel::Rtx4090,
        torch: Default::default(),
        task: Task::Train(t),
    })
    .unwrap();
    assert_eq!(e.stats().allocated_bytes, r.weights);
    run(
        &mut e,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}"#,
    );
    run(
        &mut e,
        r#"{"cmd":"alloc","name":"ids","shape":[2,256],"dtype":"int64"}"#,
    );
    let forward = r#"{"cmd":"forward","name":"loss","model":"model","data":"","batch_size":2,"checkpointing":true,"attention":"sdpa","batch":["ids","ids"]}"#;
    assert_eq!(
        second_step(&mut e, forward),
        r.peak_allocated - r.weights - r.state
    );
}

#[test]
fn an_out_of_memory_in_the_forward_leaves_its_tensors_on_the_exception() {
    let mut e = process_after(&[
        r#"{"cmd":"restart","framework":"pytorch","gpu":"t4"}"#,
        r#"{"cmd":"model","name":"model","kind":"hf","config":"Qwen/Qwen2.5-0.5B"}"#,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}"#,
        r#"{"cmd":"data","name":"data","samples":64,"features":1024,"classes":151936}"#,
    ]);
    let r = e.run_line(r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":16,"attention":"sdpa"}"#);
    assert!(!r.ok);
    assert_eq!(r.error.unwrap().kind, ErrorKind::OutOfMemory);
    let held = e.stats().allocated_bytes;
    let r = run(&mut e, r#"{"cmd":"del","name":"last_exception"}"#);
    assert!(r.stats.allocated_bytes < held);
    // A smaller batch trains.
    run(
        &mut e,
        r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":1,"attention":"sdpa"}"#,
    );
}

#[test]
fn mistakes_are_named() {
    let mut e = process_after(&[
        r#"{"cmd":"restart","framework":"pytorch","gpu":"h100-80gb"}"#,
        r#"{"cmd":"model","name":"model","kind":"hf","config":"Qwen/Qwen3-0.6B","quantization":"nf4","dtype":"bfloat16"}"#,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}"#,
        r#"{"cmd":"alloc","name":"ids","shape":[1,64],"dtype":"int64"}"#,
    ]);
    let forward = r#"{"cmd":"forward","name":"loss","model":"model","data":"","batch_size":1,"batch":["ids","ids"]}"#;
    for (line, says) in [
        (forward, "after prepare_model_for_kbit_training"),
        (r#"{"cmd":"lora","model":"model","rank":16}"#, "all_linear"),
        (
            r#"{"cmd":"optimizer","name":"o2","model":"model","kind":"sgd"}"#,
            "AdamW",
        ),
        (
            r#"{"cmd":"model","name":"m2","kind":"hf","config":"gpt2","quantization":"int3"}"#,
            "nf4",
        ),
    ] {
        let r = e.run_line(line);
        let message = r.error.map(|e| e.message).unwrap_or_default();
        assert!(message.contains(says), "{line}: {message}");
    }
    run(&mut e, r#"{"cmd":"prepare_kbit","model":"model"}"#);
    run(&mut e, forward);
    run(&mut e, r#"{"cmd":"backward","name":"loss"}"#);
    let r = e.run_line(r#"{"cmd":"backward","name":"loss"}"#);
    assert!(r.error.unwrap().message.contains("second time"));
}

/// Lesson 21's four sequences of QLoRA on an RTX 4090: the forward fits,
/// the backward runs out. As on the H100 (`tests/golden/lessons-python.json`),
/// autograd frees the gradients it was computing as it unwinds, so the
/// exception holds nothing and the loss still holds the graph: what the
/// backward made is gone, and `del loss` frees the forward's activations.
#[test]
fn an_out_of_memory_in_backward_frees_its_gradients_and_leaves_the_graph() {
    let mut e = process_after(&[
        r#"{"cmd":"restart","framework":"pytorch","gpu":"rtx-4090"}"#,
        r#"{"cmd":"model","name":"model","kind":"hf","config":"meta-llama/Llama-3.1-8B","quantization":"nf4","dtype":"bfloat16"}"#,
        r#"{"cmd":"prepare_kbit","model":"model"}"#,
        r#"{"cmd":"lora","model":"model","rank":16,"all_linear":true}"#,
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}"#,
        r#"{"cmd":"alloc","name":"ids","shape":[4,2048],"dtype":"int64"}"#,
    ]);
    let before = e.stats().allocated_bytes;
    run(
        &mut e,
        r#"{"cmd":"forward","name":"loss","model":"model","data":"","batch_size":4,"checkpointing":true,"attention":"sdpa","batch":["ids","ids"]}"#,
    );
    let graph = e.stats().allocated_bytes;
    let r = e.run_line(r#"{"cmd":"backward","name":"loss"}"#);
    let error = r.error.expect("the backward runs out");
    assert_eq!(error.kind, ErrorKind::OutOfMemory);
    assert!(
        error.message.contains("Autograd freed"),
        "{}",
        error.message
    );
    let after = e.stats().allocated_bytes;
    assert!(
        after <= graph && after + 1024 * 1024 > graph,
        "{after} against {graph}"
    );
    let r = e.run_line(r#"{"cmd":"del","name":"last_exception"}"#);
    assert_eq!(r.stats.allocated_bytes, after);
    let r = run(&mut e, r#"{"cmd":"del","name":"loss"}"#);
    assert_eq!(r.stats.allocated_bytes, before);
}

/// `zero_grad(set_to_none=False)` keeps the gradients (zeroed in place):
/// the next backward adds into them and leaves what it found; a loop
/// accumulating two micro-batches peaks below one of their sum; and a
/// backward whose forward found other gradients is refused.
#[test]
fn gradients_kept_by_zero_grad_are_added_into() {
    let mut e = small_llama((256, 512, 2), 128);
    let forward = r#"{"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":4}"#;
    run(&mut e, forward);
    run(&mut e, r#"{"cmd":"backward","name":"loss"}"#);
    run(&mut e, r#"{"cmd":"step","optimizer":"opt"}"#);
    let kept = run(
        &mut e,
        r#"{"cmd":"zero_grad","optimizer":"opt","set_to_none":false}"#,
    );
    assert!(kept.note.unwrap().contains("zeroed in place"));
    let with_grads = e.stats().allocated_bytes;
    run(&mut e, forward);
    let r = run(&mut e, r#"{"cmd":"backward","name":"loss"}"#);
    assert!(r.note.unwrap().contains("in place"));
    run(&mut e, r#"{"cmd":"step","optimizer":"opt"}"#);
    run(
        &mut e,
        r#"{"cmd":"zero_grad","optimizer":"opt","set_to_none":false}"#,
    );
    // The step ended where the one before it did: no new `.grad`.
    assert_eq!(e.stats().allocated_bytes, with_grads);
    run(&mut e, r#"{"cmd":"del","name":"loss"}"#);
    // A forward onto the gradients, then zero_grad(set_to_none=True)
    // before its backward: refused.
    run(&mut e, forward);
    run(
        &mut e,
        r#"{"cmd":"zero_grad","optimizer":"opt","set_to_none":true}"#,
    );
    let refused = e.run_line(r#"{"cmd":"backward","name":"loss"}"#);
    assert!(refused
        .error
        .unwrap()
        .message
        .contains("changed between this loss's forward and its backward"));
    run(&mut e, r#"{"cmd":"del","name":"loss"}"#);
    let whole = run(
        &mut e,
        r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":8}"#,
    );
    let halves = run(
        &mut e,
        r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":8,"accumulate":2}"#,
    );
    let peak = |r: &StepRecord| {
        r.value.as_ref().unwrap()["last_step_peak_allocated_bytes"]
            .as_u64()
            .unwrap()
    };
    assert!(
        peak(&halves) < peak(&whole),
        "{} {}",
        peak(&halves),
        peak(&whole)
    );
}

/// A Hugging Face model's `train` kept every step's graph (its whole
/// program) until the command ended (200 steps of a 256-layer model held
/// 1 GB), said nothing as it went and ran past a stop. Now each step's
/// graph goes as the next loss is bound, every step reports, and a stop
/// ends the loop after the step (or the micro-batch) under way.
#[test]
fn a_long_train_holds_one_step_reports_each_and_stops_when_asked() {
    let mut e = small_llama((64, 128, 8), 32);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    e.set_progress_hook(Some(Box::new(move |e: &mut Engine, p: &Progress| {
        log.lock().unwrap().push((p.done, e.hf.steps.len()));
        p.done < 5
    })));
    let r = run(
        &mut e,
        r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1000,"batch_size":4,"accumulate":2}"#,
    );
    let value = r.value.unwrap();
    assert_eq!(value["stopped"], true);
    assert_eq!(value["steps_done"], 5);
    assert!(r
        .note
        .unwrap()
        .starts_with("Stopped after 5 of 1000 steps."));
    let seen = seen.lock().unwrap().clone();
    // Between the micro-batches of each step, and after it; one graph held.
    assert_eq!(
        seen.iter().map(|&(done, _)| done).collect::<Vec<_>>(),
        [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    );
    assert!(seen.iter().all(|&(_, graphs)| graphs == 1), "{seen:?}");
    // A stop between micro-batches abandons the step before the optimizer.
    e.set_progress_hook(Some(Box::new(|_: &mut Engine, _: &Progress| false)));
    let r = run(
        &mut e,
        r#"{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":3,"batch_size":4,"accumulate":2}"#,
    );
    assert_eq!(r.value.unwrap()["steps_done"], 0);
}
