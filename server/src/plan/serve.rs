//! `vramlab plan MODEL --task serve --gpu G`: vLLM 0.33.0's start-up
//! (`hf::serve`), printed as its log reports it, with the
//! command line that starts the same server.

use crate::cli::PlanArgs;
use anyhow::anyhow;
use serde_json::{json, Value};
use std::io::Write;
use std::process::ExitCode;
use vramlab_shared::hf::ask::serve::{self, ServeAsked};
use vramlab_shared::hf::serve::{gib, Startup, NON_TORCH_BYTES};

/// The serving request the arguments make, on `base` (the model).
pub fn request(args: &PlanArgs, mut r: Value) -> Value {
    r["task"] = "serve".into();
    r["gpu"] = args.gpu.as_str().into();
    let numbers = [
        ("max_model_len", args.max_model_len),
        ("max_num_seqs", args.max_num_seqs),
        ("max_num_batched_tokens", args.max_num_batched_tokens),
        ("tensor_parallel_size", args.tensor_parallel_size),
    ];
    for (key, value) in numbers {
        if let Some(n) = value {
            r[key] = n.into();
        }
    }
    if let Some(u) = args.gpu_memory_utilization {
        r["gpu_memory_utilization"] = json!(u);
    }
    if let Some(k) = &args.kv_cache_dtype {
        r["kv_cache_dtype"] = k.as_str().into();
    }
    if let Some(d) = &args.dtype {
        r["dtype"] = d.as_str().into();
    }
    if args.enforce_eager {
        r["enforce_eager"] = true.into();
    }
    r
}

fn print_text(out: &mut impl Write, a: &ServeAsked, st: &Startup) -> anyhow::Result<()> {
    let s = &a.serving;
    let g = |b: u64| gib(b as i64);
    let on = match s.tensor_parallel_size {
        1 => format!("one {}", a.gpu.spec().name),
        n => format!(
            "{n} x {} (tensor parallel; each rank's numbers)",
            a.gpu.spec().name
        ),
    };
    writeln!(
        out,
        "{} served by vLLM 0.33.0 on {on} ({}, max_model_len {}, max_num_seqs {}, max_num_batched_tokens {})",
        a.name,
        a.dtype.torch_name(),
        s.max_model_len,
        s.max_num_seqs,
        s.max_num_batched_tokens
    )?;
    writeln!(
        out,
        "total_gpu_memory ({:.2}GiB) x gpu_memory_utilization ({:.2}) = {:.2}GiB",
        g(st.total),
        s.gpu_memory_utilization,
        g(st.requested)
    )?;
    writeln!(out, "Model loading took {:.4} GiB", g(st.weights))?;
    writeln!(
        out,
        "Held after profiling: {:.2} GiB (the weights' segments, the model runner's buffers, {:.2} GiB assumed outside PyTorch)",
        g(st.consumed),
        g(NON_TORCH_BYTES)
    )?;
    writeln!(
        out,
        "Profile run's transient peak: {:.2} GiB; CUDA graphs' estimate: {:.2} GiB",
        g(st.transient_peak),
        g(st.cudagraph)
    )?;
    writeln!(
        out,
        "Available KV cache memory: {:.2} GiB",
        gib(st.available)
    )?;
    writeln!(
        out,
        "GPU KV cache size: {} tokens ({} blocks of {} tokens); maximum concurrency for {} tokens per request: {:.2}x",
        st.kv_tokens, st.num_blocks, s.block_size, s.max_model_len, st.max_concurrency
    )?;
    match &st.refused {
        None => writeln!(out, "Starts.")?,
        Some(why) => writeln!(out, "Does not start: {why}")?,
    }
    writeln!(out, "\nThe same server:\n\n{}", serve::command(a))?;
    Ok(())
}

/// Answers a serving question; exit 1 when vLLM would not start.
pub fn plan(args: &PlanArgs, request: &Value, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let asked = serve::read(request).map_err(|e| anyhow!("{e}"))?;
    let st = serve::startup(&asked).map_err(|e| anyhow!("{e}"))?;
    if args.json {
        writeln!(out, "{}", serve::to_json(&asked, &st))?;
    } else {
        print_text(out, &asked, &st)?;
    }
    Ok(if st.refused.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
