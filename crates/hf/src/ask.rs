//! "Will it fit?" asked and answered as JSON, the one reader and writer
//! the command line (`vramlab plan`) and the page's planner share:
//!
//! ```json
//! {"model": "Llama-3.1-8B", "gpu": "rtx-4090", "batch": 4, "prompt": 1024,
//!  "new_tokens": 128, "cache": "dynamic", "attn": "sdpa", "dtype": "bfloat16",
//!  "torch": "2.15"}
//! {"model": "Llama-3.1-8B", "task": "lora", "rank": 16, "batch": 1, "seq": 2048,
//!  "checkpointing": true}
//! ```
//!
//! `model` names a shipped shape; `config` gives a config.json's object
//! instead. `task` is `generate` (the default), `train` (every parameter,
//! AdamW), `lora` (peft's LoRA, AdamW on the adapters) or `qlora`
//! (bitsandbytes' 4-bit weights, `quant_type` nf4 or fp4 and
//! `double_quant`, readied by `prepare_model_for_kbit_training`, LoRA on
//! every linear layer). `"amp": "bfloat16"` runs a training step's forward
//! under `torch.autocast` (the weights then default to float32, as mixed
//! precision keeps them; QLoRA's load and compute in the config's type).
//! Every field but the model has a default. `"task": "serve"` asks
//! for vLLM's start-up instead ([`serve`]).

use super::config::HfConfig;
use super::generate::{Cache, Generation};
use super::known;
use super::plan::{Answer, Change, Question, Remedy, Stop, Task, Training};
use super::step::{lora_targets, Quant4};
use serde_json::{json, Map, Value};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;
use vramlab_device::framework::TorchVersion;
use vramlab_device::gpu::GpuModel;
use vramlab_train::kinds::step::Attention;
use vramlab_train::program::Holds;

mod python;
pub mod serve;

/// What a request names besides its question: what to call the model and
/// how the Python loads its config.
#[derive(Clone, Debug)]
pub struct Asked {
    pub question: Question,
    pub name: String,
    /// `AutoConfig.from_pretrained(...)` or `AutoConfig.for_model(...)`.
    pub load: String,
}

/// A request's fields.
pub const FIELDS: &[&str] = &[
    "model",
    "config",
    "config_path",
    "gpu",
    "batch",
    "prompt",
    "new_tokens",
    "cache",
    "attn",
    "dtype",
    "torch",
    "task",
    "seq",
    "checkpointing",
    "rank",
    "optimizer",
    "quant_type",
    "double_quant",
    "amp",
];

/// The tasks a request may name (`serve`: [`serve`]).
pub const TASKS: &[&str] = &["generate", "train", "lora", "qlora", "serve"];

fn count(r: &Map<String, Value>, key: &str, default: u64) -> Result<u64, Invalid> {
    match r.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_u64()
            .filter(|&n| (1..=1 << 20).contains(&n))
            .ok_or_else(|| Invalid(format!("`{key}` is {v}: a whole number from 1 to 1048576"))),
    }
}

fn named<T: serde::de::DeserializeOwned>(
    r: &Map<String, Value>,
    key: &str,
    default: &str,
) -> Result<T, Invalid> {
    let v = r.get(key).cloned().unwrap_or_else(|| Value::from(default));
    serde_json::from_value(v.clone()).map_err(|e| Invalid(format!("`{key}` is {v}: {e}")))
}

/// The model a request names.
fn model(r: &Map<String, Value>) -> Result<(HfConfig, String, String), Invalid> {
    if let Some(config) = r.get("config") {
        let c = HfConfig::read(config)?;
        let load = match r.get("config_path").and_then(Value::as_str) {
            Some(dir) => format!("AutoConfig.from_pretrained({dir:?})"),
            None => for_model(config),
        };
        return Ok((c, "config.json".to_string(), load));
    }
    let wanted = r.get("model").and_then(Value::as_str).ok_or_else(|| {
        Invalid::from("name a shipped `model` (Llama-3.1-8B, Qwen2.5-7B, …) or give a `config`")
    })?;
    let k = known::find(wanted).ok_or_else(|| {
        let names: Vec<String> = known::all().into_iter().map(|k| k.name).collect();
        Invalid(format!(
            "no shipped shape is called {wanted:?}: {}",
            names.join(", ")
        ))
    })?;
    let repo = k.repo();
    Ok((
        k.config,
        k.name,
        format!("AutoConfig.from_pretrained({repo:?})"),
    ))
}

/// `AutoConfig.for_model(...)` with a pasted config's fields, as Python.
fn for_model(config: &Value) -> String {
    let mut args = Vec::new();
    for (key, v) in config.as_object().into_iter().flatten() {
        let literal = match v {
            Value::Bool(true) => "True".to_string(),
            Value::Bool(false) => "False".to_string(),
            Value::Null => "None".to_string(),
            other => other.to_string(),
        };
        if key == "model_type" {
            args.insert(0, literal);
        } else if key
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            && !v.is_object()
            && !v.is_array()
        {
            args.push(format!("{key}={literal}"));
        }
    }
    format!("AutoConfig.for_model({})", args.join(", "))
}

fn flag(r: &Map<String, Value>, key: &str, default: bool) -> Result<bool, Invalid> {
    match r.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| Invalid(format!("`{key}` is {v}: true or false"))),
    }
}

/// QLoRA's `BitsAndBytesConfig`: the compute type is the type asked for.
fn quant4(r: &Map<String, Value>, c: &HfConfig, dtype: Dtype) -> Result<Quant4, Invalid> {
    if c.arch == super::config::Arch::Gpt2 {
        return Err(Invalid::from(
            "QLoRA is modelled for the Llama, Mistral, Qwen, Phi-3 and Gemma families, whose layers are nn.Linear; GPT-2's are Conv1D",
        ));
    }
    let nf4 = match r.get("quant_type").and_then(Value::as_str) {
        None | Some("nf4") => true,
        Some("fp4") => false,
        Some(other) => {
            return Err(Invalid(format!(
                "`quant_type` is {other:?}: nf4 or fp4 (bnb_4bit_quant_type)"
            )))
        }
    };
    Ok(Quant4 {
        nf4,
        double_quant: flag(r, "double_quant", true)?,
        compute: dtype,
    })
}

/// A request's object, every field one of `fields` (`what`: the kind of
/// request, in the message).
fn fields_of<'a>(
    request: &'a Value,
    fields: &[&str],
    what: &str,
) -> Result<&'a Map<String, Value>, Invalid> {
    let r = request
        .as_object()
        .ok_or_else(|| Invalid::from("a plan request is a JSON object"))?;
    match r.keys().find(|k| !fields.contains(&k.as_str())) {
        Some(unknown) => Err(Invalid(format!(
            "unknown field `{unknown}`{what}, expected one of {}",
            fields.join(", ")
        ))),
        None => Ok(r),
    }
}

/// Reads a request.
pub fn read(request: &Value) -> Result<Asked, Invalid> {
    let r = fields_of(request, FIELDS, "")?;
    let (config, name, load) = model(r)?;
    let gpu: GpuModel = named(r, "gpu", "rtx-4090")?;
    let amp = match r.get("amp") {
        None | Some(Value::Null) => None,
        Some(v) if v == "bfloat16" => Some(Dtype::Bfloat16),
        Some(v) => {
            return Err(Invalid(format!(
                "`amp` is {v}: \"bfloat16\" (torch.autocast around the forward) or null"
            )))
        }
    };
    // Mixed precision keeps float32 weights unless told otherwise; QLoRA
    // loads in the config's type (and computes in it), whatever autocast
    // does: `prepare_model_for_kbit_training` upcasts what is not 4-bit.
    let qlora = r.get("task").and_then(Value::as_str) == Some("qlora");
    let dtype = match r.get("dtype") {
        None if amp.is_some() && !qlora => Dtype::Float32,
        None => config.dtype,
        Some(_) => named::<Dtype>(r, "dtype", "")?,
    };
    if !matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        return Err(Invalid(format!(
            "`dtype` is {}: bfloat16, float16 or float32",
            dtype.torch_name()
        )));
    }
    // transformers' default: sdpa where the model supports it.
    let attention = named::<Attention>(r, "attn", default_attention(&config))?;
    let task = match r.get("task").and_then(Value::as_str).unwrap_or("generate") {
        "generate" => Task::Generate(Generation {
            batch: count(r, "batch", 1)?,
            prompt: count(r, "prompt", 512)?,
            new_tokens: count(r, "new_tokens", 256)?,
            cache: named::<Cache>(r, "cache", "dynamic")?,
            attention,
        }),
        task @ ("train" | "lora" | "qlora") => Task::Train(Training {
            batch: count(r, "batch", 1)?,
            seq: count(r, "seq", 512)?,
            attention,
            // `prepare_model_for_kbit_training` checkpoints by default.
            checkpointing: flag(r, "checkpointing", task == "qlora")?,
            lora: (task != "train").then(|| count(r, "rank", 16)).transpose()?,
            quant: (task == "qlora")
                .then(|| quant4(r, &config, dtype))
                .transpose()?,
            amp,
            adam8bit: match r.get("optimizer").and_then(Value::as_str) {
                None | Some("adamw") => false,
                Some("adamw8bit") => true,
                Some(other) => {
                    return Err(Invalid(format!(
                        "`optimizer` is {other:?}: adamw (torch.optim.AdamW) or adamw8bit (bitsandbytes' AdamW8bit)"
                    )))
                }
            },
        }),
        "serve" => {
            return Err(Invalid::from(
                "a serving request is read by `ask::serve::read`",
            ))
        }
        other => {
            return Err(Invalid(format!(
                "`task` is {other:?}: {}",
                TASKS.join(", ")
            )))
        }
    };
    match task {
        Task::Generate(_) if amp.is_some() => {
            return Err(Invalid::from(
                "`amp` is for training tasks (train, lora): generate runs under no_grad in the weights' type",
            ))
        }
        _ => {}
    }
    Ok(Asked {
        question: Question {
            config,
            dtype,
            gpu,
            task,
            torch: named::<TorchVersion>(r, "torch", "2.15")?,
        },
        name,
        load,
    })
}

pub use python::python;

pub(super) fn task_attention(task: &Task) -> Attention {
    match task {
        Task::Generate(g) => g.attention,
        Task::Train(t) => t.attention,
    }
}

/// The attention transformers picks when none is asked for: sdpa, but
/// eager for Gemma 2 (its soft-capped scores).
fn default_attention(c: &HfConfig) -> &'static str {
    if c.arch == super::config::Arch::Gemma2 {
        "eager"
    } else {
        "sdpa"
    }
}

pub fn attention_name(a: Attention) -> &'static str {
    match a {
        Attention::Eager => "eager",
        Attention::Sdpa => "sdpa",
    }
}

pub fn cache_name(c: Cache) -> &'static str {
    match c {
        Cache::Dynamic => "dynamic",
        Cache::Static => "static",
    }
}

/// Where a run stopped, in words.
pub fn stop_words(stop: &Stop) -> String {
    match stop {
        Stop::Weights => "while loading the weights".into(),
        Stop::State => "while AdamW makes its state (its first step)".into(),
        Stop::Phase(phase) => format!("in the {phase}"),
        Stop::Forward(0) => "in the prefill (the forward over the prompt)".into(),
        Stop::Forward(k) => format!("at new token {k}"),
        Stop::After(k) => format!("after new token {k}'s forward"),
    }
}

/// What the question asks, in a line.
pub fn asked_line(a: &Asked) -> String {
    let q = &a.question;
    let what = match q.task {
        Task::Generate(g) => format!(
            "generate {} x {} prompt tokens + {} new, {} cache, {} attention",
            g.batch,
            g.prompt,
            g.new_tokens,
            cache_name(g.cache),
            attention_name(g.attention),
        ),
        Task::Train(t) => format!(
            "one training step ({}) of {} x {} tokens, {}, {} attention{}{}",
            match (t.lora, t.quant) {
                (Some(rank), Some(q4)) => format!(
                    "QLoRA rank {rank} on every linear layer, {} weights{}",
                    if q4.nf4 { "nf4" } else { "fp4" },
                    if q4.double_quant {
                        " with double quantization"
                    } else {
                        ""
                    }
                ),
                (Some(rank), None) => format!(
                    "LoRA rank {rank} on {}",
                    lora_targets(q.config.arch).join(" and ")
                ),
                (None, _) => "every parameter".to_string(),
            },
            t.batch,
            t.seq,
            if t.adam8bit {
                "AdamW8bit (bitsandbytes)"
            } else {
                "AdamW"
            },
            attention_name(t.attention),
            match (t.checkpointing, t.quant.is_some()) {
                (true, true) => ", gradient checkpointing (reentrant)",
                (true, false) => ", gradient checkpointing",
                (false, _) => "",
            },
            match t.amp {
                Some(_) => ", the forward under torch.autocast (bfloat16)",
                None => "",
            },
        ),
    };
    format!(
        "{} in {} on {}, PyTorch {}: {what}",
        model_words(a),
        q.dtype.torch_name(),
        q.gpu.spec().name,
        q.torch.id(),
    )
}

/// The answer as one JSON object.
pub fn to_json(a: &Asked, answer: &Answer) -> Value {
    let (q, r) = (&a.question, &answer.run);
    let at_peak: Map<String, Value> = r
        .at_peak
        .iter()
        .filter(|(h, b)| *b > 0 || shown(&q.task, *h))
        .map(|(h, b)| (held_name(*h).to_string(), (*b).into()))
        .collect();
    let (batch, tokens) = q.task.batch_and_tokens();
    let mut v = json!({
        "model": a.name,
        "class": q.config.arch.causal_lm(),
        "parameters": parameter_count(&q.config),
        "asked": asked_line(a),
        "task": task_name(&q.task),
        "gpu": q.gpu.id(),
        "gpu_name": q.gpu.spec().name,
        "dtype": q.dtype.torch_name(),
        "torch": q.torch.id(),
        "batch": batch,
        "fits": r.fits(),
        "weights_bytes": r.weights,
        "model_bytes": r.model_bytes,
        "optimizer_state_bytes": r.state,
        "peak_allocated_bytes": r.peak_allocated,
        "peak_reserved_bytes": r.peak_reserved,
        "total_bytes": r.total,
        "context_bytes": r.context,
        "at_peak": at_peak,
        "activations_by_layer": r.activations_by_layer,
        "out_of_memory": r.out_of_memory.as_ref().map(|(s, b)| json!({"where": stop_words(s), "requested_bytes": b})),
        "largest_batch": answer.largest_batch,
        "batch_below_fails": answer.batch_below_fails,
        "fits_with": answer.remedies.iter().map(remedy_json).collect::<Vec<_>>(),
        "python": python(a),
    });
    match q.task {
        Task::Generate(_) => {
            v["prompt"] = tokens.into();
            v["peak_allocated_by_token"] =
                r.by_token.iter().map(|t| t.0).collect::<Vec<_>>().into();
            v["reserved_by_token"] = r.by_token.iter().map(|t| t.1).collect::<Vec<_>>().into();
            v["longest_prompt"] = answer.longest_prompt.into();
            v["prompt_below_fails"] = answer.prompt_below_fails.into();
        }
        Task::Train(t) => {
            v["seq"] = tokens.into();
            v["checkpointing"] = t.checkpointing.into();
            v["rank"] = t.lora.into();
            v["optimizer"] = if t.adam8bit { "adamw8bit" } else { "adamw" }.into();
            v["amp"] = t.amp.map(|d| d.torch_name()).into();
            if let Some(q4) = t.quant {
                v["quant_type"] = if q4.nf4 { "nf4" } else { "fp4" }.into();
                v["double_quant"] = q4.double_quant.into();
            }
            v["longest_seq"] = answer.longest_prompt.into();
            v["seq_below_fails"] = answer.prompt_below_fails.into();
        }
    }
    v
}

/// A change that fits: its words, the request's fields that ask for it,
/// and the run's peaks with it.
fn remedy_json(r: &Remedy) -> Value {
    let mut request = Map::new();
    for c in &r.changes {
        request.extend(change_fields(*c));
    }
    json!({
        "changes": r.changes.iter().map(|c| c.words()).collect::<Vec<_>>(),
        "request": request,
        "peak_allocated_bytes": r.peak_allocated,
        "peak_reserved_bytes": r.peak_reserved,
        "total_bytes": r.total,
    })
}

/// The request's fields that make a change.
fn change_fields(c: Change) -> Map<String, Value> {
    let fields = match c {
        Change::Checkpointing => json!({"checkpointing": true}),
        Change::Accumulate { micro, .. } | Change::Batch(micro) => json!({"batch": micro}),
        Change::Adam8bit => json!({"optimizer": "adamw8bit"}),
        Change::Lora => json!({"task": "lora"}),
        Change::Qlora => json!({"task": "qlora", "checkpointing": true}),
        Change::Gpu(g) => json!({"gpu": g.id()}),
    };
    fields.as_object().cloned().unwrap_or_default()
}

/// What the largest batch or the longest sequence found says: none where
/// not even one fits.
pub fn found_words(n: u64) -> String {
    match n {
        0 => "none (not even 1)".into(),
        n => n.to_string(),
    }
}

/// The activations at the peak by layer, in words: the layers holding
/// the least and the most (none when no layer held any).
pub fn by_layer_words(by_layer: &[u64]) -> Option<String> {
    let (most_at, most) = by_layer
        .iter()
        .enumerate()
        .max_by_key(|(i, b)| (**b, usize::MAX - i))?;
    let (least_at, least) = by_layer.iter().enumerate().min_by_key(|(i, b)| (**b, *i))?;
    if *most == 0 {
        return None;
    }
    Some(format!(
        "the activations the decoder layers made, at the peak: from {} (layer {least_at}) to {} (layer {most_at}) a layer",
        vramlab_core::units::format_size(*least),
        vramlab_core::units::format_size(*most)
    ))
}

/// The model's parameters, counted (`sum(p.numel() for p in
/// model.parameters())`).
pub fn parameter_count(c: &HfConfig) -> u64 {
    super::params::parameters(c).iter().map(|p| p.numel()).sum()
}

/// A count of parameters as people say it: 8.03B, 124.4M.
pub fn count_words(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n => n.to_string(),
    }
}

/// The model as an answer names it: its name, class and size.
pub fn model_words(a: &Asked) -> String {
    let c = &a.question.config;
    format!(
        "{} ({}, {} parameters)",
        a.name,
        c.arch.causal_lm(),
        count_words(parameter_count(c))
    )
}

/// A kind of tensor at a plan's peak, named: the optimizer's own there
/// are its step's temporaries (its state, made before the step, has a
/// row of its own).
pub fn held_name(h: Holds) -> &'static str {
    match h {
        Holds::Optimizer => "the optimizer step's temporaries",
        other => other.name(),
    }
}

/// Whether a kind of tensor has a row for this task even when it holds
/// nothing at the peak (a generation's cache, a step's gradients and
/// optimizer temporaries; the logits, with a step's loss tensors, both).
pub fn shown(task: &Task, h: Holds) -> bool {
    match task {
        Task::Generate(_) => matches!(
            h,
            Holds::Activation | Holds::KvCache | Holds::Logits | Holds::Ids | Holds::Workspace
        ),
        Task::Train(t) => match h {
            Holds::KvCache => false,
            Holds::Dequantized => t.quant.is_some(),
            Holds::WeightCast => t.amp.is_some(),
            _ => true,
        },
    }
}

/// The task's name in a request.
pub fn task_name(task: &Task) -> &'static str {
    match task {
        Task::Generate(_) => "generate",
        Task::Train(Training { quant: Some(_), .. }) => "qlora",
        Task::Train(Training { lora: Some(_), .. }) => "lora",
        Task::Train(_) => "train",
    }
}

/// A request's answer, or its error, as JSON text (the page's planner).
pub fn answer_text(request: &str) -> String {
    let parsed = serde_json::from_str::<Value>(request);
    if let Some(v) = parsed.as_ref().ok().filter(|v| serve::is_serve(v)) {
        return serve::answer(v).to_string();
    }
    let answered = parsed
        .map_err(|e| Invalid(format!("not JSON: {e}")))
        .and_then(|v| read(&v))
        .and_then(|a| Ok(to_json(&a, &super::plan::answer(&a.question)?)));
    match answered {
        Ok(v) => v.to_string(),
        Err(e) => json!({ "error": e.0 }).to_string(),
    }
}

/// The shipped shapes as JSON: name, class, link.
pub fn shapes_text() -> String {
    let rows: Vec<Value> = known::all()
        .into_iter()
        .map(|k| json!({"name": k.name, "class": k.config.arch.causal_lm(), "config_url": k.config_url}))
        .collect();
    Value::from(rows).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_with_its_defaults_and_names_what_is_wrong() {
        let a = read(&json!({"model": "Qwen2.5-7B"})).unwrap();
        assert_eq!(a.name, "Qwen2.5-7B");
        assert_eq!(task_attention(&a.question.task), Attention::Sdpa);
        // transformers' default for Gemma 2, whose scores are soft-capped.
        let gemma = read(&json!({"model": "gemma-2-2b"})).unwrap();
        assert_eq!(task_attention(&gemma.question.task), Attention::Eager);
        assert_eq!(
            (a.question.gpu, a.question.dtype),
            (GpuModel::Rtx4090, Dtype::Bfloat16)
        );
        assert_eq!(a.load, "AutoConfig.from_pretrained(\"Qwen/Qwen2.5-7B\")");
        let e = |v: Value| read(&v).unwrap_err().0;
        assert!(e(json!({"model": "Llama-9"})).contains("no shipped shape is called \"Llama-9\""));
        assert!(e(json!({"model": "gpt2", "batch": 0})).contains("`batch` is 0"));
        assert!(e(json!({"model": "gpt2", "gpu": "v100"}))
            .contains("`gpu` is \"v100\": unknown variant"));
        assert!(e(json!({"model": "gpt2", "lora": 8})).contains("unknown field `lora`"));
        assert!(e(json!({"model": "gpt2", "dtype": "int8"})).contains("`dtype` is int8"));
        assert!(e(json!({})).contains("name a shipped `model`"));
    }

    #[test]
    fn a_pasted_config_is_loaded_in_python_by_its_own_fields() {
        let a = read(&json!({"config": {"model_type": "llama", "hidden_size": 512, "tie_word_embeddings": true,
            "rope_scaling": {"factor": 8.0}}}))
        .unwrap();
        assert_eq!(a.name, "config.json");
        assert_eq!(
            a.load,
            "AutoConfig.for_model(\"llama\", hidden_size=512, tie_word_embeddings=True)"
        );
    }

    #[test]
    fn the_page_gets_an_answer_or_an_error_as_json() {
        let v: Value = serde_json::from_str(&answer_text(
            r#"{"model": "Qwen2.5-0.5B", "gpu": "t4", "new_tokens": 8}"#,
        ))
        .unwrap();
        assert_eq!(v["fits"], true);
        assert!(v["python"].as_str().unwrap().contains("max_new_tokens=8"));
        let v: Value = serde_json::from_str(&answer_text("{")).unwrap();
        assert!(v["error"].as_str().unwrap().starts_with("not JSON"));
        let shapes: Value = serde_json::from_str(&shapes_text()).unwrap();
        assert_eq!(shapes.as_array().unwrap().len(), 12);
    }
}
