//! "Will it serve?": a `"task": "serve"` request read, and vLLM's
//! start-up (`hf::serve`) answered as JSON:
//!
//! ```json
//! {"model": "Qwen2.5-7B", "task": "serve", "gpu": "h100-80gb",
//!  "gpu_memory_utilization": 0.9, "max_model_len": 32768,
//!  "max_num_seqs": 256, "kv_cache_dtype": "fp8"}
//! ```
//!
//! Every setting but the model has `vllm serve`'s default on that card;
//! with `tensor_parallel_size`, the answer is one rank's, each on that card.

use super::{count, fields_of, flag, model, named};
use crate::config::HfConfig;
use crate::known;
use crate::serve::{self, auto_dtype, Card, Serving, Startup};
use serde_json::{json, Map, Value};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;
use vramlab_device::gpu::GpuModel;

/// A serving request's fields.
pub const FIELDS: &[&str] = &[
    "model",
    "config",
    "config_path",
    "task",
    "gpu",
    "dtype",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "kv_cache_dtype",
    "enforce_eager",
    "tensor_parallel_size",
];

/// What a serving request asks.
#[derive(Clone, Debug)]
pub struct ServeAsked {
    pub config: HfConfig,
    pub name: String,
    /// What `vllm serve` is given: a shipped shape's Hugging Face
    /// repository, or a pasted config.json's folder (`config_path`, else
    /// `model`), whose random weights `--load-format dummy` makes.
    pub repo: String,
    pub dummy_weights: bool,
    pub gpu: GpuModel,
    pub dtype: Dtype,
    pub serving: Serving,
}

/// Whether a request asks for serving.
pub fn is_serve(request: &Value) -> bool {
    request.get("task").and_then(Value::as_str) == Some("serve")
}

/// Reads a serving request.
pub fn read(request: &Value) -> Result<ServeAsked, Invalid> {
    let r = fields_of(request, FIELDS, " for serving")?;
    let (config, name, _) = model(r)?;
    let gpu: GpuModel = named(r, "gpu", "h100-80gb")?;
    let card = Card::of(gpu);
    let dtype = match r.get("dtype").and_then(Value::as_str) {
        None | Some("auto") => auto_dtype(&config, &card),
        Some(_) => named::<Dtype>(r, "dtype", "")?,
    };
    let defaults = Serving::defaults(&config, &card, dtype);
    let serving = Serving {
        gpu_memory_utilization: utilization(r)?,
        max_model_len: count(r, "max_model_len", defaults.max_model_len)?,
        max_num_seqs: count(r, "max_num_seqs", defaults.max_num_seqs)?,
        max_num_batched_tokens: count(
            r,
            "max_num_batched_tokens",
            defaults.max_num_batched_tokens,
        )?,
        block_size: count(r, "block_size", 16)?,
        kv_bytes: match r.get("kv_cache_dtype").and_then(Value::as_str) {
            None | Some("auto") => dtype.size_bytes(),
            Some("fp8" | "fp8_e4m3" | "fp8_e5m2") => 1,
            Some(other) => {
                return Err(Invalid(format!(
                    "`kv_cache_dtype` is {other:?}: auto (the weights' type) or fp8"
                )))
            }
        },
        enforce_eager: flag(r, "enforce_eager", false)?,
        estimate_cudagraphs: true,
        tensor_parallel_size: count(r, "tensor_parallel_size", 1)?,
    };
    serve::check(&config, &card, dtype, &serving)?;
    let dummy_weights = r.contains_key("config");
    let repo = match r.get("config_path").and_then(Value::as_str) {
        _ if !dummy_weights => known::find(&name).map_or(name.clone(), |k| k.repo()),
        Some(dir) => dir.to_string(),
        None => "model".to_string(),
    };
    Ok(ServeAsked {
        config,
        name,
        repo,
        dummy_weights,
        gpu,
        dtype,
        serving,
    })
}

fn utilization(r: &Map<String, Value>) -> Result<f64, Invalid> {
    match r.get("gpu_memory_utilization") {
        None => Ok(0.9),
        Some(v) => v.as_f64().filter(|u| *u > 0.0 && *u <= 1.0).ok_or_else(|| {
            Invalid(format!(
                "`gpu_memory_utilization` is {v}: a share above 0 and at most 1"
            ))
        }),
    }
}

/// vLLM's start-up for the request.
pub fn startup(a: &ServeAsked) -> Result<Startup, Invalid> {
    serve::startup(&a.config, &Card::of(a.gpu), a.dtype, &a.serving)
}

/// What the command of a pasted config says of its weights.
const DUMMY: &str =
    "# random weights of the config's shapes (--load-format dummy: the same memory); \
for the real model, name its folder or Hub id and drop --load-format dummy --skip-tokenizer-init";

/// The command line that starts the same server.
pub fn command(a: &ServeAsked) -> String {
    let s = &a.serving;
    let d = Serving::defaults(&a.config, &Card::of(a.gpu), a.dtype);
    let mut args = vec![format!("vllm serve {}", a.repo)];
    // A pasted config has no weights: it is served with random ones of
    // its shapes, whose memory is the real ones', and says so.
    if a.dummy_weights {
        args[0] = format!("{DUMMY}\n{}", args[0]);
        args.push("--load-format dummy --skip-tokenizer-init".into());
    }
    if a.dtype != auto_dtype(&a.config, &Card::of(a.gpu)) {
        args.push(format!("--dtype {}", a.dtype.torch_name()));
    }
    if s.gpu_memory_utilization != 0.9 {
        args.push(format!(
            "--gpu-memory-utilization {}",
            s.gpu_memory_utilization
        ));
    }
    let numbers = [
        ("--max-model-len", s.max_model_len, d.max_model_len),
        ("--max-num-seqs", s.max_num_seqs, d.max_num_seqs),
        (
            "--max-num-batched-tokens",
            s.max_num_batched_tokens,
            d.max_num_batched_tokens,
        ),
        ("--block-size", s.block_size, 16),
    ];
    for (flag, value, default) in numbers {
        if value != default {
            args.push(format!("{flag} {value}"));
        }
    }
    if s.kv_bytes == 1 {
        args.push("--kv-cache-dtype fp8".into());
    }
    if s.enforce_eager {
        args.push("--enforce-eager".into());
    }
    if s.tensor_parallel_size > 1 {
        args.push(format!("--tensor-parallel-size {}", s.tensor_parallel_size));
    }
    args.join(" ")
}

/// The answer as one JSON object.
pub fn to_json(a: &ServeAsked, st: &Startup) -> Value {
    let s = &a.serving;
    json!({
        "model": a.name,
        "task": "serve",
        "vllm": "0.33.0",
        "gpu": a.gpu.id(),
        "gpu_name": a.gpu.spec().name,
        "dtype": a.dtype.torch_name(),
        "starts": st.refused.is_none(),
        "refused": st.refused,
        "total_bytes": st.total,
        "requested_bytes": st.requested,
        "weights_bytes": st.weights,
        "consumed_bytes": st.consumed,
        "non_torch_bytes": serve::NON_TORCH_BYTES,
        "transient_peak_bytes": st.transient_peak,
        "cudagraph_bytes": st.cudagraph,
        "available_kv_bytes": st.available,
        "block_bytes": st.block_bytes,
        "num_blocks": st.num_blocks,
        "kv_tokens": st.kv_tokens,
        "max_concurrency": st.max_concurrency,
        "longest_model_len": st.longest_model_len,
        "gpu_memory_utilization": s.gpu_memory_utilization,
        "max_model_len": s.max_model_len,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "block_size": s.block_size,
        "kv_cache_dtype": if s.kv_bytes == 1 { "fp8" } else { "auto" },
        "enforce_eager": s.enforce_eager,
        "tensor_parallel_size": s.tensor_parallel_size,
        "command": command(a),
    })
}

/// A serving request's answer, or its error, as JSON.
pub fn answer(request: &Value) -> Value {
    match read(request).and_then(|a| Ok(to_json(&a, &startup(&a)?))) {
        Ok(v) => v,
        Err(e) => json!({ "error": e.0 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_request_is_answered_with_vllms_numbers_and_command() {
        let v = answer(&json!({"model": "Llama-3.1-8B", "task": "serve",
            "max_model_len": 8192, "kv_cache_dtype": "fp8"}));
        assert_eq!(v["starts"], true, "{v}");
        assert_eq!(v["gpu"], "h100-80gb");
        assert_eq!(v["max_num_seqs"], 1024);
        // fp8 halves a block: 1 MiB for 32 layers.
        assert_eq!(v["block_bytes"], 1 << 20);
        assert_eq!(
            v["command"],
            "vllm serve meta-llama/Llama-3.1-8B --max-model-len 8192 --kv-cache-dtype fp8"
        );
        let tokens = v["kv_tokens"].as_u64().unwrap();
        assert_eq!(tokens, v["num_blocks"].as_u64().unwrap() * 16);
        // Two ranks: each holds half the weights and half the key-value
        // heads of every token, so the cache holds more tokens.
        let two = answer(&json!({"model": "Llama-3.1-8B", "task": "serve",
            "max_model_len": 8192, "kv_cache_dtype": "fp8", "tensor_parallel_size": 2}));
        assert_eq!(two["block_bytes"], 1 << 19);
        assert!(
            two["weights_bytes"].as_u64().unwrap()
                < v["weights_bytes"].as_u64().unwrap() / 2 + (1 << 27)
        );
        assert!(two["kv_tokens"].as_u64().unwrap() > 2 * tokens);
        assert!(two["command"]
            .as_str()
            .unwrap()
            .ends_with("--kv-cache-dtype fp8 --tensor-parallel-size 2"));
        let e =
            answer(&json!({"model": "Llama-3.1-8B", "task": "serve", "tensor_parallel_size": 3}));
        assert!(
            e["error"].as_str().unwrap().contains("1, 2, 4 or 8 GPUs"),
            "{e}"
        );
        let e =
            answer(&json!({"model": "Qwen2.5-0.5B", "task": "serve", "tensor_parallel_size": 4}));
        assert!(
            e["error"]
                .as_str()
                .unwrap()
                .contains("must be divisible by tensor parallel size (4)"),
            "{e}"
        );
        // A pasted config.json: its folder, served with random weights.
        let pasted = answer(&json!({"task": "serve", "config_path": "qwen",
            "config": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                "vocab_size": 151936, "max_position_embeddings": 32768}}));
        assert_eq!(
            pasted["command"],
            format!("{DUMMY}\nvllm serve qwen --load-format dummy --skip-tokenizer-init")
        );
        let e = answer(&json!({"model": "gpt2", "task": "serve", "batch": 4}));
        assert!(e["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `batch`"));
        let e = answer(&json!({"model": "gpt2", "task": "serve", "gpu_memory_utilization": 1.5}));
        assert!(e["error"].as_str().unwrap().contains("at most 1"));
        let e = answer(&json!({"model": "gpt2", "task": "serve", "max_model_len": 4096}));
        assert!(e["error"]
            .as_str()
            .unwrap()
            .contains("longer than the model's 1024"));
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Values at the edges for a serving request's fields.
    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::sample::select(vec![
                json!(0),
                json!(1),
                json!(-1),
                json!(0.5),
                json!(1.5),
                json!(16),
                json!(1 << 20),
                json!(1u64 << 40),
                json!(u64::MAX),
                json!("fp8"),
                json!("auto"),
                json!("bfloat16"),
                json!("float16"),
                json!(true),
                json!(null),
                json!("h100-80gb"),
                json!("t4"),
                json!("Llama-3.1-8B"),
                json!("gpt2"),
                json!("Qwen3-0.6B"),
                json!([]),
            ]),
            (1u64..1 << 41).prop_map(|n| json!(n)),
        ]
    }

    /// A pasted config with edge numbers (the limits `HfConfig::read` keeps).
    fn config() -> impl Strategy<Value = Value> {
        (
            prop::sample::select(vec!["llama", "qwen3", "gpt2", "mistral", "phi3"]),
            prop::collection::vec(1u64..1 << 21, 6),
            1u64..1 << 41,
        )
            .prop_map(|(t, n, positions)| {
                json!({"model_type": t, "hidden_size": n[0], "intermediate_size": n[1],
                    "num_hidden_layers": n[2] % 1025, "num_attention_heads": n[3],
                    "num_key_value_heads": n[4], "head_dim": n[5], "vocab_size": n[0],
                    "max_position_embeddings": positions, "n_embd": n[0], "n_head": n[3],
                    "n_layer": n[2] % 1025, "n_positions": positions})
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any request is answered or refused with a message, never a panic.
        #[test]
        fn any_serving_request_is_answered_or_refused(
            fields in prop::collection::vec((prop::sample::select(FIELDS.to_vec()), value()), 0..8),
            pasted in prop::option::of(config()),
        ) {
            let mut r = json!({"task": "serve", "model": "Llama-3.2-1B"});
            for (k, v) in fields {
                if k != "task" {
                    r[k] = v;
                }
            }
            if let Some(c) = pasted {
                r.as_object_mut().unwrap().remove("model");
                r["config"] = c;
            }
            let v = answer(&r);
            prop_assert!(v.get("error").is_some() || v.get("kv_tokens").is_some(), "{}", v);
        }
    }
}
