//! `vramlab plan MODEL --gpu G`: a Hugging Face model's `generate()`
//! played on a simulated GPU (`train::hf::plan`), printed as a verdict,
//! the peak and what holds it, and the Python that does the same.

use crate::cli::PlanArgs;
use anyhow::{anyhow, bail};
use std::io::Write;
use std::process::ExitCode;
use vramlab_shared::gpu::GpuModel;
use vramlab_shared::train::hf::generate::{Cache, Generation};
use vramlab_shared::train::hf::known::{self, Known};
use vramlab_shared::train::hf::plan::{answer, Answer, Question, Stop};
use vramlab_shared::train::hf::HfConfig;
use vramlab_shared::train::kinds::step::Attention;
use vramlab_shared::types::Dtype;
use vramlab_shared::units::format_size;

/// The model asked for: a shipped shape, or a config.json read from disk.
fn model(name: &str) -> anyhow::Result<(HfConfig, String)> {
    if let Some(k) = known::find(name) {
        let repo = repo_of(&k);
        return Ok((k.config, format!("AutoConfig.from_pretrained({repo:?})")));
    }
    let text = std::fs::read_to_string(name).map_err(|e| {
        anyhow!("{name} is neither a shipped shape (vramlab plan --list) nor a readable config.json: {e}")
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow!("{name}: not JSON: {e}"))?;
    let config = HfConfig::read(&value).map_err(|e| anyhow!("{name}: {e}"))?;
    Ok((
        config,
        format!("AutoConfig.from_pretrained({:?})", parent(name)),
    ))
}

/// `owner/name` of a shipped shape's config link.
fn repo_of(k: &Known) -> String {
    let path = k.config_url.trim_start_matches("https://huggingface.co/");
    path.split("/blob/").next().unwrap_or(path).to_string()
}

/// The folder a config.json sits in (what `from_pretrained` takes).
fn parent(file: &str) -> String {
    let p = std::path::Path::new(file).parent();
    let dir = p.map(|d| d.display().to_string()).unwrap_or_default();
    if dir.is_empty() {
        ".".into()
    } else {
        dir
    }
}

fn read<T: serde::de::DeserializeOwned>(what: &str, value: &str) -> anyhow::Result<T> {
    serde_json::from_value(serde_json::Value::from(value))
        .map_err(|e| anyhow!("--{what} {value}: {e}"))
}

fn question(args: &PlanArgs, config: HfConfig) -> anyhow::Result<Question> {
    if args.task != "generate" {
        bail!(
            "--task {}: vramlab plan models `generate` today; training, LoRA, QLoRA and serving plans are not built yet",
            args.task
        );
    }
    let gpu = GpuModel::from_id(&args.gpu).ok_or_else(|| {
        let ids: Vec<&str> = GpuModel::ALL.iter().map(|g| g.id()).collect();
        anyhow!("--gpu {}: one of {}", args.gpu, ids.join(", "))
    })?;
    let dtype = match &args.dtype {
        Some(d) => read::<Dtype>("dtype", d)?,
        None => config.dtype,
    };
    if !matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        bail!(
            "--dtype {}: bfloat16, float16 or float32",
            dtype.torch_name()
        );
    }
    Ok(Question {
        config,
        dtype,
        gpu,
        generation: Generation {
            batch: args.batch,
            prompt: args.prompt,
            new_tokens: args.new_tokens,
            cache: read::<Cache>("cache", &args.cache)?,
            attention: read::<Attention>("attn", &args.attn)?,
        },
    })
}

/// The Python that runs the same `generate` and prints its peak.
fn python(q: &Question, load: &str) -> String {
    let g = q.generation;
    let static_cache = if g.cache == Cache::Static {
        ", cache_implementation=\"static\", disable_compile=True"
    } else {
        ""
    };
    let attn = if g.attention == Attention::Eager {
        "eager"
    } else {
        "sdpa"
    };
    format!(
        "import torch\n\
         from transformers import AutoConfig, AutoModelForCausalLM\n\n\
         config = {load}\n\
         model = AutoModelForCausalLM.from_config(config, dtype=torch.{}, attn_implementation=\"{attn}\").to(\"cuda\")\n\
         ids = torch.randint(0, config.vocab_size, ({}, {}), device=\"cuda\")\n\
         with torch.no_grad():\n    \
         model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens={}, do_sample=False{static_cache})\n\
         print(torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())\n",
        q.dtype.torch_name(),
        g.batch,
        g.prompt,
        g.new_tokens
    )
}

fn stop_words(stop: &Stop) -> String {
    match stop {
        Stop::Weights => "while loading the weights".into(),
        Stop::Forward(0) => "in the prefill (the forward over the prompt)".into(),
        Stop::Forward(k) => format!("at new token {k}"),
        Stop::After(k) => format!("after new token {k}'s forward"),
    }
}

fn print_text(
    out: &mut impl Write,
    name: &str,
    q: &Question,
    a: &Answer,
    code: &str,
) -> anyhow::Result<()> {
    let (r, g) = (&a.run, q.generation);
    writeln!(
        out,
        "{name} ({}) in {} on {}: generate {} x {} prompt tokens + {} new, {} cache, {} attention",
        q.config.arch.causal_lm(),
        q.dtype.torch_name(),
        q.gpu.spec().name,
        g.batch,
        g.prompt,
        g.new_tokens,
        if g.cache == Cache::Static {
            "static"
        } else {
            "dynamic"
        },
        if g.attention == Attention::Eager {
            "eager"
        } else {
            "sdpa"
        },
    )?;
    match &r.out_of_memory {
        None => writeln!(
            out,
            "Fits: peak allocated {}, reserved {}, of {} ({} of it the CUDA context).",
            format_size(r.peak_allocated),
            format_size(r.peak_reserved),
            format_size(r.total),
            format_size(r.context)
        )?,
        Some((stop, bytes)) => writeln!(
            out,
            "Does not fit: out of memory {} (a request of {}).",
            stop_words(stop),
            format_size(*bytes)
        )?,
    }
    writeln!(out, "  weights: {}", format_size(r.weights))?;
    for (holds, bytes) in &r.at_peak {
        writeln!(
            out,
            "  {} at the peak: {}",
            holds.name(),
            format_size(*bytes)
        )?;
    }
    writeln!(out, "Largest batch that fits: {}", a.largest_batch)?;
    writeln!(
        out,
        "Longest prompt that fits (with {} new tokens): {}",
        g.new_tokens, a.longest_prompt
    )?;
    writeln!(out, "\nThe same in Python:\n\n{code}")?;
    Ok(())
}

fn print_json(
    out: &mut impl Write,
    name: &str,
    q: &Question,
    a: &Answer,
    code: &str,
) -> anyhow::Result<()> {
    let r = &a.run;
    let at_peak: serde_json::Map<String, serde_json::Value> = r
        .at_peak
        .iter()
        .map(|(h, b)| (h.name().to_string(), (*b).into()))
        .collect();
    let value = serde_json::json!({
        "model": name,
        "gpu": q.gpu.id(),
        "fits": r.fits(),
        "weights_bytes": r.weights,
        "peak_allocated_bytes": r.peak_allocated,
        "peak_reserved_bytes": r.peak_reserved,
        "total_bytes": r.total,
        "context_bytes": r.context,
        "at_peak": at_peak,
        "out_of_memory": r.out_of_memory.as_ref().map(|(s, b)| serde_json::json!({"where": stop_words(s), "requested_bytes": b})),
        "largest_batch": a.largest_batch,
        "longest_prompt": a.longest_prompt,
        "python": code,
    });
    writeln!(out, "{value}")?;
    Ok(())
}

/// Answers the question on the command line; exit 1 when it does not fit.
pub fn plan(args: &PlanArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    if args.list {
        for k in known::all() {
            writeln!(
                out,
                "{:<16} {}  {}",
                k.name,
                k.config.arch.causal_lm(),
                k.config_url
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let name = args.model.as_deref().unwrap_or_default();
    let (config, load) = model(name)?;
    let q = question(args, config)?;
    let a = answer(&q).map_err(|e| anyhow!("{e}"))?;
    let code = python(&q, &load);
    if args.json {
        print_json(out, name, &q, &a, &code)?;
    } else {
        print_text(out, name, &q, &a, &code)?;
    }
    Ok(if a.run.fits() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
