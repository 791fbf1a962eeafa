//! `generate` in the process, held to the plan's play of the same call and
//! to what Python keeps after it.

use super::*;
use crate::command::Cache;
use crate::framework::TorchVersion;
use crate::gpu::GpuModel;
use crate::hf::generate::Generation;
use crate::hf::known;
use crate::hf::plan::{self, Question, Task};
use crate::protocol::StepRecord;
use crate::train::kinds::Attention;
use crate::types::Category;

fn run(engine: &mut Engine, line: &str) -> StepRecord {
    let r = engine.run_line(line);
    engine.check_invariants().unwrap();
    r
}

fn process_on(gpu: &str) -> Engine {
    let mut e = Engine::new_simulated();
    let r = run(
        &mut e,
        &format!(r#"{{"cmd":"restart","framework":"pytorch","gpu":"{gpu}"}}"#),
    );
    assert!(r.ok, "{:?}", r.error);
    e
}

fn category(r: &StepRecord, c: Category) -> u64 {
    r.stats.categories.get(&c).copied().unwrap_or(0)
}

/// Each forward's peak is the plan's, plus the prompt and its mask that
/// the process's call holds (4 x 128 int64 each: 4 KiB).
#[test]
fn each_forward_peaks_as_the_plan_plays_it() {
    let qwen = known::find("Qwen3-0.6B").unwrap().config;
    for (cache, attention) in [
        ("dynamic", Attention::Sdpa),
        ("static", Attention::Sdpa),
        ("dynamic", Attention::Eager),
    ] {
        let mut e = process_on("h100-80gb");
        let r = run(
            &mut e,
            r#"{"cmd":"model","name":"m","kind":"hf","config":"Qwen/Qwen3-0.6B"}"#,
        );
        assert!(r.ok, "{:?}", r.error);
        let weights = r.stats.allocated_bytes;
        let line = format!(
            r#"{{"cmd":"generate","name":"out","model":"m","batch_size":4,"prompt_len":128,"new_tokens":64,"cache":"{cache}","attention":"{}"}}"#,
            if attention == Attention::Eager {
                "eager"
            } else {
                "sdpa"
            }
        );
        let r = run(&mut e, &line);
        assert!(r.ok, "{:?}", r.error);
        let by_forward: Vec<u64> =
            serde_json::from_value(r.value.clone().unwrap()["peak_allocated_by_forward"].clone())
                .unwrap();
        let planned = plan::run(&Question {
            config: qwen,
            dtype: qwen.dtype,
            gpu: GpuModel::H100_80gb,
            torch: TorchVersion::default(),
            task: Task::Generate(Generation {
                batch: 4,
                prompt: 128,
                new_tokens: 64,
                cache: if cache == "static" {
                    Cache::Static
                } else {
                    Cache::Dynamic
                },
                attention,
            }),
        })
        .unwrap();
        assert_eq!(planned.weights, weights);
        let expected: Vec<u64> = planned
            .by_token
            .iter()
            .map(|&(p, _)| p + 2 * 4096)
            .collect();
        assert_eq!(by_forward, expected, "{cache} {attention:?}");
        // After it: the weights and `out`, 4 x 192 int64; the cache is gone.
        assert_eq!(r.stats.allocated_bytes, weights + 4 * 192 * 8);
        assert_eq!(category(&r, Category::KvCache), 0);
        let r = run(&mut e, r#"{"cmd":"del","name":"out"}"#);
        assert_eq!(r.stats.allocated_bytes, weights);
    }
}

/// Out of memory mid-way: the exception's frames hold the cache until
/// `del last_exception`.
#[test]
fn an_out_of_memory_keeps_the_cache_on_the_exception() {
    let mut e = process_on("t4");
    assert!(
        run(
            &mut e,
            r#"{"cmd":"model","name":"m","kind":"hf","config":"meta-llama/Llama-3.2-1B"}"#
        )
        .ok
    );
    let weights = e.stats().allocated_bytes;
    let r = run(
        &mut e,
        r#"{"cmd":"generate","model":"m","batch_size":64,"prompt_len":2048,"new_tokens":512}"#,
    );
    assert!(!r.ok);
    let error = r.error.clone().unwrap();
    assert_eq!(error.kind, ErrorKind::OutOfMemory);
    assert!(
        error.message.contains("del last_exception"),
        "{}",
        error.message
    );
    assert!(category(&r, Category::KvCache) > 0);
    assert!(r.stats.allocated_bytes > weights);
    let r = run(&mut e, r#"{"cmd":"del","name":"last_exception"}"#);
    assert_eq!(r.stats.allocated_bytes, weights);
    assert_eq!(category(&r, Category::KvCache), 0);
}

#[test]
fn a_named_prompt_is_read_and_kept() {
    let mut e = process_on("rtx-4090");
    assert!(
        run(
            &mut e,
            r#"{"cmd":"model","name":"m","kind":"hf","config":"gpt2","dtype":"float32"}"#
        )
        .ok
    );
    assert!(
        run(
            &mut e,
            r#"{"cmd":"alloc","name":"ids","shape":[2,100],"dtype":"int64"}"#
        )
        .ok
    );
    let before = e.stats().allocated_bytes;
    let r = run(
        &mut e,
        r#"{"cmd":"generate","model":"m","input_ids":"ids","new_tokens":8}"#,
    );
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.stats.allocated_bytes, before);
    let r = run(
        &mut e,
        r#"{"cmd":"generate","model":"m","input_ids":"ids","batch_size":3}"#,
    );
    assert!(r.error.unwrap().message.contains("2 x 100"));
}

#[test]
fn mistakes_are_named() {
    let mut e = process_on("rtx-4090");
    for (line, says) in [
        (
            r#"{"cmd":"model","name":"m","kind":"hf","config":"Llama-9"}"#,
            "no shipped shape",
        ),
        (r#"{"cmd":"model","name":"m","kind":"hf"}"#, "config.json"),
        (
            r#"{"cmd":"model","name":"m","kind":"hf","config":{"model_type":"bert"}}"#,
            "bert",
        ),
        (
            r#"{"cmd":"generate","model":"nope","prompt_len":4}"#,
            "not defined",
        ),
    ] {
        let r = run(&mut e, line);
        let message = r.error.unwrap().message;
        assert!(message.contains(says), "{line}: {message}");
    }
    assert!(run(&mut e, r#"{"cmd":"model","name":"m","layers":1,"width":8}"#).ok);
    let r = run(&mut e, r#"{"cmd":"generate","model":"m","prompt_len":4}"#);
    assert!(r
        .error
        .unwrap()
        .message
        .contains("not a Hugging Face model"));
    assert!(
        run(
            &mut e,
            r#"{"cmd":"model","name":"g","kind":"hf","config":"gpt2"}"#
        )
        .ok
    );
    assert!(
        run(&mut e, r#"{"cmd":"estimate","model":"g","batch_size":4}"#)
            .error
            .unwrap()
            .message
            .contains("--task train")
    );
    let r = run(
        &mut e,
        r#"{"cmd":"generate","model":"g","prompt_len":1000,"new_tokens":100}"#,
    );
    assert!(r.error.unwrap().message.contains("max_position_embeddings"));
    let r = run(
        &mut e,
        r#"{"cmd":"model","name":"t","kind":"hf","config":"gpt2","dtype":"bfloat16"}"#,
    );
    assert!(r.note.unwrap().contains("bfloat16"));
}

/// `from_pretrained(..., device_map="cuda")`: transformers'
/// `caching_allocator_warmup` reserves the model's bytes in one segment
/// first, and the weights fill it; `from_config(...).to("cuda")` makes a
/// segment a size class. The Python the line shows is the loader's.
#[test]
fn from_pretrained_loads_into_the_segment_its_warmup_leaves() {
    let line = |extra: &str| {
        format!(r#"{{"cmd":"model","name":"m","kind":"hf","config":"Qwen/Qwen3-0.6B"{extra}}}"#)
    };
    let mut e = process_on("h100-80gb");
    let loaded = run(&mut e, &line(r#","from_pretrained":true"#));
    assert!(loaded.ok, "{:?}", loaded.error);
    assert_eq!(loaded.stats.allocated_bytes, 1_192_115_200);
    // The warmup's segment, and one of 2 MiB for the small tensors (norms).
    let warmup = 1_192_115_200_u64.next_multiple_of(2 << 20);
    assert_eq!(loaded.stats.reserved_bytes, warmup + (2 << 20));
    assert_eq!(loaded.stats.segments, 2);
    let mut e = process_on("h100-80gb");
    let built = run(&mut e, &line(""));
    assert_eq!(built.stats.allocated_bytes, 1_192_115_200);
    assert!(built.stats.segments > 1);
    let cmd = crate::command::parse_line(&line(r#","dtype":"bfloat16","from_pretrained":true"#));
    let code = crate::python::code(&cmd.command.unwrap(), Framework::Pytorch);
    assert!(
        code.ends_with(r#"m = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B", dtype=torch.bfloat16, device_map={"": 0})"#),
        "{code}"
    );
}

/// Lesson 20 as the H100 ran it (PyTorch 2.11 within a T4's memory): its
/// static cache runs out in the prefill's MLP, in
/// `down_proj(act_fn(gate_proj(x)) * up_proj(x))`, and the two values
/// waiting on the MLP's stack for the product (640 MiB each) go as the
/// exception leaves the frame, as they did on the GPU; the cache and the
/// frames' variables stay on `last_exception`.
#[test]
fn an_out_of_memory_drops_the_values_on_the_stack() {
    let lesson = include_str!("../../../tests/lessons/20-generate-kv-cache.jsonl");
    let mut e = Engine::new_simulated();
    run(
        &mut e,
        r#"{"cmd":"restart","framework":"pytorch","gpu":"t4","torch_version":"2.11","compute_capability":[9,0]}"#,
    );
    let mut last = None;
    for line in lesson.lines().skip(1) {
        let r = e.run_line(line);
        if line.contains(r#""cache": "static""#) {
            last = Some(r);
            break;
        }
    }
    let r = last.expect("the lesson has a static cache");
    assert_eq!(r.error.expect("it runs out").kind, ErrorKind::OutOfMemory);
    let wide = 320 * 128 * 8192 * 2;
    assert_eq!(
        r.stats.step_peak_allocated_bytes - r.stats.allocated_bytes,
        2 * wide
    );
    assert!(r.stats.categories[&Category::KvCache] > 0);
}
