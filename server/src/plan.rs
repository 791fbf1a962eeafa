//! `vramlab plan MODEL --gpu G`: a Hugging Face model's `generate()` or
//! one training step (full or LoRA) played on a simulated GPU
//! (`hf::plan`), asked through the same
//! JSON request the page's planner sends (`hf::ask`), printed as a
//! verdict, the peak and what holds it, and the Python that does the same;
//! `--task serve`, vLLM's start-up (`serve`).

use crate::cli::PlanArgs;
use anyhow::anyhow;
use serde_json::{json, Value};
use std::io::Write;
use std::process::ExitCode;
use vramlab_shared::hf::ask::{self, Asked};
use vramlab_shared::hf::known;
use vramlab_shared::hf::plan::{answer, Answer, Stop, Task};
use vramlab_shared::units::format_size;

mod serve;

/// The request the arguments make: a shipped shape by name, or a
/// config.json file's object.
fn request(args: &PlanArgs) -> anyhow::Result<Value> {
    if args.task == "serve" {
        return with_model(serve::request(args, json!({})), args);
    }
    let mut r = if args.task == "generate" {
        json!({
            "gpu": args.gpu, "batch": args.batch, "prompt": args.prompt,
            "new_tokens": args.new_tokens, "cache": args.cache, "torch": args.torch,
        })
    } else {
        json!({
            "task": args.task, "gpu": args.gpu, "batch": args.batch, "seq": args.seq,
            "torch": args.torch, "optimizer": args.optimizer,
        })
    };
    if let Some(on) = args.checkpointing.filter(|_| args.task != "generate") {
        r["checkpointing"] = on.into();
    }
    if args.task == "lora" || args.task == "qlora" {
        r["rank"] = args.rank.into();
    }
    if let Some(amp) = &args.amp {
        r["amp"] = amp.as_str().into();
    }
    if args.task == "qlora" {
        r["quant_type"] = args.quant_type.as_str().into();
        r["double_quant"] = args.double_quant.into();
    }
    if let Some(a) = &args.attn {
        r["attn"] = a.as_str().into();
    }
    if let Some(d) = &args.dtype {
        r["dtype"] = d.as_str().into();
    }
    with_model(r, args)
}

/// The request with its model: a shipped shape's name, or a config.json
/// file's object and the folder it is in.
fn with_model(mut r: Value, args: &PlanArgs) -> anyhow::Result<Value> {
    let model = args.model.as_deref().unwrap_or_default();
    if known::find(model).is_some() {
        r["model"] = model.into();
        return Ok(r);
    }
    let text = read_config(model).map_err(|e| {
        anyhow!("{model} is neither a shipped shape (vramlab plan --list) nor a readable config.json: {e}")
    })?;
    r["config"] = serde_json::from_str(&text).map_err(|e| anyhow!("{model}: not JSON: {e}"))?;
    let dir = std::path::Path::new(model).parent();
    let dir = dir
        .map(|d| d.display().to_string())
        .filter(|d| !d.is_empty());
    r["config_path"] = dir.unwrap_or_else(|| ".".into()).into();
    Ok(r)
}

/// The most a config.json may hold: the largest published ones (with
/// their labels and tokenizer maps) are a few hundred KB.
const MAX_CONFIG_BYTES: u64 = 8 << 20;

/// A config.json's text, refused past [`MAX_CONFIG_BYTES`] before more is
/// read (`/dev/zero` was read until memory ran out).
fn read_config(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::other(format!(
            "it holds more than {} MiB; a config.json holds a few hundred KB",
            MAX_CONFIG_BYTES >> 20
        )));
    }
    Ok(text)
}

fn print_text(out: &mut impl Write, a: &Asked, answer: &Answer) -> anyhow::Result<()> {
    let (q, r) = (&a.question, &answer.run);
    writeln!(out, "{}", ask::asked_line(a))?;
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
            ask::stop_words(stop),
            format_size(*bytes)
        )?,
    }
    match r.out_of_memory {
        Some((Stop::Weights, _)) => writeln!(
            out,
            "  weights loaded before it ran out: {} of the model's {}",
            format_size(r.weights),
            format_size(r.model_bytes)
        )?,
        _ => writeln!(out, "  weights: {}", format_size(r.weights))?,
    }
    if let Task::Train(_) = q.task {
        writeln!(out, "  the optimizer's state: {}", format_size(r.state))?;
    }
    for (holds, bytes) in &r.at_peak {
        if *bytes == 0 && !ask::shown(&q.task, *holds) {
            continue;
        }
        writeln!(
            out,
            "  {} at the peak: {}",
            ask::held_name(*holds),
            format_size(*bytes)
        )?;
    }
    if let Some(words) = ask::by_layer_words(&r.activations_by_layer) {
        writeln!(out, "  of them, {words}")?;
    }
    if let Some(line) = by_token(&r.by_token).filter(|_| matches!(q.task, Task::Generate(_))) {
        writeln!(out, "{line}")?;
    }
    writeln!(
        out,
        "Largest batch that fits: {}{}",
        ask::found_words(answer.largest_batch),
        not_every_below(answer.batch_below_fails)
    )?;
    match q.task {
        Task::Generate(g) => writeln!(
            out,
            "Longest prompt that fits (with {} new tokens): {}{}",
            g.new_tokens,
            ask::found_words(answer.longest_prompt),
            not_every_below(answer.prompt_below_fails)
        )?,
        Task::Train(_) => writeln!(
            out,
            "Longest sequence that fits: {}{}",
            ask::found_words(answer.longest_prompt),
            not_every_below(answer.prompt_below_fails)
        )?,
    }
    print_remedies(out, answer)?;
    writeln!(out, "\nThe same in Python:\n\n{}", ask::python(a))?;
    Ok(())
}

/// The changes that fit, cheapest first, each with its peak.
fn print_remedies(out: &mut impl Write, answer: &Answer) -> anyhow::Result<()> {
    if answer.remedies.is_empty() {
        return Ok(());
    }
    writeln!(out, "What fits instead, cheapest first (each planned):")?;
    for r in &answer.remedies {
        let words: Vec<String> = r.changes.iter().map(|c| c.words()).collect();
        writeln!(
            out,
            "  {}: peak reserved {} of {}",
            words.join(" and "),
            format_size(r.peak_reserved),
            format_size(r.total)
        )?;
    }
    Ok(())
}

/// What a found value's failing neighbour below says.
fn not_every_below(below: Option<u64>) -> String {
    below.map_or_else(String::new, |b| {
        format!(" ({b} does not: near the limit whether it fits alternates)")
    })
}

/// Each forward's peak of allocated memory, a few of them: the prefill's,
/// the first and last new token's, and evenly between.
fn by_token(peaks: &[(u64, u64)]) -> Option<String> {
    let last = peaks.len().checked_sub(1)?;
    let mut picked: Vec<usize> = (0..=5)
        .map(|i| 1 + i * last.saturating_sub(1) / 5)
        .collect();
    picked.insert(0, 0);
    picked.retain(|&i| i <= last);
    picked.dedup();
    let words: Vec<String> = picked
        .iter()
        .map(|&i| {
            let at = if i == 0 {
                "prefill".to_string()
            } else {
                format!("token {i}")
            };
            format!("{at} {}", format_size(peaks[i].0))
        })
        .collect();
    Some(format!("Peak allocated by forward: {}", words.join(", ")))
}

/// Answers the question on the command line; exit 1 when it does not fit.
pub fn plan(args: &PlanArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    if args.list {
        for k in known::all() {
            let class = k.config.arch.causal_lm();
            writeln!(out, "{:<16} {class:<18} {}", k.name, k.config_url)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let request = request(args)?;
    if args.task == "serve" {
        return serve::plan(args, &request, out);
    }
    let asked = ask::read(&request).map_err(|e| anyhow!("{e}"))?;
    let a = answer(&asked.question).map_err(|e| anyhow!("{e}"))?;
    if args.json {
        writeln!(out, "{}", ask::to_json(&asked, &a))?;
    } else {
        print_text(out, &asked, &a)?;
    }
    Ok(if a.run.fits() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config.json past its bound is refused after reading no more than
    /// the bound (an endless file was read until memory ran out).
    #[cfg(unix)]
    #[test]
    fn an_endless_config_is_refused_at_its_bound() {
        let err = read_config("/dev/zero").unwrap_err().to_string();
        assert!(err.contains("more than 8 MiB"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"model_type":"llama"}"#).unwrap();
        assert_eq!(
            read_config(path.to_str().unwrap()).unwrap(),
            r#"{"model_type":"llama"}"#
        );
    }
}
