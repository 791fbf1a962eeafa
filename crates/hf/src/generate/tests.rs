//! `generate` held to transformers' own, traced on the CPU
//! (`tests/reference/hf_generate.py`): every forward's allocations and
//! frees in order for every family, eager and sdpa attention, the dynamic
//! and the static cache, float32 and bfloat16; and each forward's peak and what lives after it within 1% on a model of
//! Llama-3.2-1B's layer width (eager and sdpa, both caches), and on Gemma 2
//! (eager) and Gemma 3 (sdpa) models whose sliding window is shorter than
//! the prompt.

use super::{play_on_cpu, program, Cache, Generation};
use crate::config::HfConfig;
use serde_json::Value;
use vramlab_core::types::Dtype;
use vramlab_train::kinds::blocks;
use vramlab_train::kinds::step::Attention;
use vramlab_train::program::{Op, Program};

const TRANSFORMERS: &str = include_str!("../../../../tests/reference/hf_generate.json");

fn cases() -> Vec<Value> {
    let v: Value = serde_json::from_str(TRANSFORMERS).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn config(case: &Value) -> HfConfig {
    let v: Value = serde_json::from_str(TRANSFORMERS).unwrap();
    let fields = &v["configs"][case["model"].as_str().unwrap()];
    HfConfig::read(fields).unwrap()
}

fn ours(case: &Value) -> Program {
    program_of(case).unwrap()
}

fn program_of(case: &Value) -> Result<Program, vramlab_core::error::Invalid> {
    let dtype = match case["dtype"].as_str().unwrap() {
        "float32" => Dtype::Float32,
        _ => Dtype::Bfloat16,
    };
    let g = Generation {
        batch: case["batch"].as_u64().unwrap(),
        prompt: case["prompt"].as_u64().unwrap(),
        new_tokens: case["new_tokens"].as_u64().unwrap(),
        cache: match case["cache"].as_str().unwrap() {
            "static" => Cache::Static,
            _ => Cache::Dynamic,
        },
        attention: match case["attn"].as_str().unwrap() {
            "eager" => Attention::Eager,
            _ => Attention::Sdpa,
        },
    };
    let mut p = Program::default();
    play_on_cpu(&config(case), dtype, g, &mut p)?;
    Ok(p)
}

/// An aten overload's op (`mul.Tensor` → `mul`), the CPU's flash kernel
/// as CUDA's.
fn op(name: &str) -> &str {
    let op = name.split('.').next().unwrap_or(name);
    op.strip_suffix("_for_cpu").unwrap_or(op)
}

/// Forward `k`'s events: (op, bytes), frees negative.
fn forward_events(p: &Program, k: u64) -> Vec<(String, i64)> {
    let start = p.ops.iter().position(|s| *s == Op::Forward(k)).unwrap();
    let end = p.ops.iter().position(|s| *s == Op::Returned(k)).unwrap();
    p.ops[start..end]
        .iter()
        .filter_map(|s| match *s {
            Op::Alloc(i) => Some((
                op(p.allocs[i].op).to_string(),
                blocks(p.allocs[i].bytes()) as i64,
            )),
            Op::Free(i) => Some(("free".into(), -(blocks(p.allocs[i].bytes()) as i64))),
            _ => None,
        })
        .collect()
}

/// (live before, peak, live after) of each forward.
fn forward_peaks(p: &Program) -> Vec<(u64, u64, u64)> {
    let (mut live, mut out) = (0_u64, Vec::new());
    let mut current: Option<(u64, u64)> = None;
    for s in &p.ops {
        match *s {
            Op::Alloc(i) => live += blocks(p.allocs[i].bytes()),
            Op::Free(i) => live -= blocks(p.allocs[i].bytes()),
            Op::Forward(_) => current = Some((live, live)),
            Op::Returned(_) => {
                let (before, peak) = current.take().unwrap();
                out.push((before, peak, live));
            }
            _ => {}
        }
        if let Some((_, peak)) = current.as_mut() {
            *peak = (*peak).max(live);
        }
    }
    out
}

#[test]
fn each_forward_allocates_and_frees_as_transformers_does() {
    let mut checked = 0;
    for case in cases() {
        if case["model"].as_str().unwrap().starts_with("wide") {
            continue;
        }
        if case.get("error").is_some() {
            // transformers refuses the pairing; so does vramlab.
            assert!(program_of(&case).is_err(), "{case:?}");
            continue;
        }
        let p = ours(&case);
        let events = case["events"].as_array().unwrap();
        for (k, call) in case["calls"].as_array().unwrap().iter().enumerate() {
            let range = call["event"].as_u64().unwrap() as usize
                ..call["end_event"].as_u64().unwrap() as usize;
            let theirs: Vec<(String, i64)> = events[range]
                .iter()
                .map(|e| {
                    (
                        op(e[0].as_str().unwrap()).to_string(),
                        e[1].as_i64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(forward_events(&p, k as u64), theirs, "{case:?} forward {k}");
            checked += 1;
        }
    }
    assert_eq!(checked, 60 * 4);
}

#[test]
fn each_forwards_peak_and_what_lives_after_it_are_within_one_percent() {
    let mut checked = 0;
    for case in cases()
        .iter()
        .filter(|c| c["model"].as_str().unwrap().starts_with("wide"))
    {
        let p = ours(case);
        let calls = case["calls"].as_array().unwrap();
        let peaks = forward_peaks(&p);
        assert_eq!(peaks.len(), calls.len());
        for (k, (call, (before, peak, after))) in calls.iter().zip(peaks).enumerate() {
            let get = |key: &str| call[key].as_u64().unwrap() as f64;
            let near = |ours: u64, theirs: f64| ((ours as f64 - theirs) / theirs).abs() < 0.01;
            let rise = get("peak") - get("before");
            assert!(
                near(peak - before, rise),
                "{case:?} forward {k}: peak over before {} against {rise}",
                peak - before
            );
            assert!(
                near(after, get("after")),
                "{case:?} forward {k}: after {after} against {}",
                get("after")
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 6 * 16);
}

#[test]
fn what_generate_cannot_run_is_refused_with_the_reason() {
    let c =
        HfConfig::read(&serde_json::json!({"model_type": "llama", "max_position_embeddings": 100}))
            .unwrap();
    let g = Generation {
        batch: 1,
        prompt: 90,
        new_tokens: 20,
        cache: Cache::Dynamic,
        attention: Attention::Sdpa,
    };
    let e = program(&c, Dtype::Float16, g).unwrap_err().0;
    assert!(e.contains("more than the model's 100 positions"), "{e}");
    let e = program(&c, Dtype::Float16, Generation { batch: 0, ..g })
        .unwrap_err()
        .0;
    assert!(e.contains("at least 1"), "{e}");
    let e = program(
        &c,
        Dtype::Float16,
        Generation {
            prompt: 4,
            new_tokens: 5000,
            ..g
        },
    );
    assert!(e
        .unwrap_err()
        .0
        .contains("more than the model's 100 positions"));
    let long = HfConfig::read(
        &serde_json::json!({"model_type": "llama", "num_hidden_layers": 64,
        "max_position_embeddings": 1_u64 << 30, "num_attention_heads": 64}),
    )
    .unwrap();
    let e = program(
        &long,
        Dtype::Float16,
        Generation {
            prompt: 4,
            new_tokens: 4096,
            ..g
        },
    );
    assert!(e
        .unwrap_err()
        .0
        .contains("64 layers x 4096 new tokens is more than the 131072 layer forwards"));
    let eager = Generation {
        prompt: 1 << 29,
        new_tokens: 1,
        attention: Attention::Eager,
        ..g
    };
    let e = program(&long, Dtype::Float16, eager).unwrap_err().0;
    assert!(e.contains("bytes: beyond any GPU"), "{e}");
    let gemma = HfConfig::read(&serde_json::json!({"model_type": "gemma2"})).unwrap();
    let e = program(&gemma, Dtype::Float32, Generation { prompt: 8, ..g })
        .unwrap_err()
        .0;
    assert!(e.contains("Gemma2ForCausalLM does not support sdpa"), "{e}");
}

#[test]
fn the_dynamic_cache_ends_each_token_one_position_longer_and_the_static_cache_never_grows() {
    let c = HfConfig::read(
        &serde_json::json!({"model_type": "llama", "num_hidden_layers": 2,
        "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}),
    )
    .unwrap();
    let g = Generation {
        batch: 2,
        prompt: 16,
        new_tokens: 8,
        cache: Cache::Dynamic,
        attention: Attention::Sdpa,
    };
    let token = c.layers * g.batch * c.kv_bytes_per_token(Dtype::Float16);
    let held = |p: &Program| -> Vec<u64> {
        let kv: Vec<u64> = forward_peaks(p)
            .iter()
            .map(|&(_, _, after)| after)
            .collect();
        kv.windows(2).map(|w| w[1] - w[0]).collect()
    };
    // Each decode step's cache grows by one token's keys and values per
    // layer (in 512-byte blocks: 2 x 2 layers x batch 2 x 2 heads x 64 x 2
    // bytes = 2 KiB a token, a block multiple).
    let dynamic = program(&c, Dtype::Float16, g).unwrap();
    assert!(
        held(&dynamic).iter().skip(1).all(|&d| d == token),
        "{:?}",
        held(&dynamic)
    );
    let fixed = program(
        &c,
        Dtype::Float16,
        Generation {
            cache: Cache::Static,
            ..g
        },
    )
    .unwrap();
    assert!(
        held(&fixed).iter().skip(1).all(|&d| d == 0),
        "{:?}",
        held(&fixed)
    );
}

const REAL: &str = include_str!("../../../../tests/reference/hf_generate_real.json");

/// Published shapes at full size (`hf_generate.py --real`: Qwen3-0.6B, 4 x
/// 128 + 64 tokens; Gemma-3-1B, 2 x 1,024 + 64, its sliding window of 512
/// shorter than the prompt): every forward's live bytes before it, at its
/// peak and after it within 1% of transformers' own (they differ by the
/// prompt's token ids, which the trace counts from before `generate`).
#[test]
fn at_full_size_every_forward_peaks_as_transformers_does() {
    let v: Value = serde_json::from_str(REAL).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    for case in cases {
        let name = case["model"].as_str().unwrap();
        let config = HfConfig::read(&v["configs"][name]).unwrap();
        let g = Generation {
            batch: case["batch"].as_u64().unwrap(),
            prompt: case["prompt"].as_u64().unwrap(),
            new_tokens: case["new_tokens"].as_u64().unwrap(),
            cache: Cache::Dynamic,
            attention: Attention::Sdpa,
        };
        let ours = forward_peaks(&program(&config, Dtype::Bfloat16, g).unwrap());
        let calls = case["calls"].as_array().unwrap();
        assert_eq!(ours.len(), calls.len(), "{name}: forwards");
        for (k, ((before, peak, after), call)) in ours.iter().zip(calls).enumerate() {
            for (what, o, t) in [
                ("before", before, &call["before"]),
                ("peak", peak, &call["peak"]),
                ("after", after, &call["after"]),
            ] {
                let t = t.as_u64().unwrap();
                let near = o.abs_diff(t) as f64 <= 0.01 * t as f64 || o.abs_diff(t) <= 64 << 10;
                assert!(near, "{name} forward {k} {what}: {o} against {t}");
            }
        }
    }
}
