//! The step held to transformers' own, traced on the CPU by
//! `tests/reference/hf_train.py` (PyTorch and transformers versions in the
//! file): every allocation and free in order, and the peak over what lived
//! before the step.

use super::{play, Quant4, Run};
use crate::config::HfConfig;
use serde_json::Value;
use vramlab_core::types::Dtype;
use vramlab_train::kinds::step::Attention;
use vramlab_train::program::{Op, Program};

const TRACES: &str = include_str!("../../../../tests/reference/hf_train.json");

/// The caching allocator's 512-byte blocks, as the trace counts bytes.
fn rounded(n: u64) -> i64 {
    (n.div_ceil(512) * 512) as i64
}

/// The program's events as the trace writes them: `[op, bytes]`, and
/// `["free", -bytes]`.
fn events(p: &Program) -> Vec<(String, i64)> {
    (p.ops.iter())
        .filter_map(|s| match *s {
            Op::Alloc(i) if p.allocs[i].bytes() > 0 => {
                Some((p.allocs[i].op.to_string(), rounded(p.allocs[i].bytes())))
            }
            Op::Free(i) if p.allocs[i].bytes() > 0 => {
                Some(("free".to_string(), -rounded(p.allocs[i].bytes())))
            }
            _ => None,
        })
        .collect()
}

fn peak(events: &[(String, i64)]) -> i64 {
    let mut live = 0;
    let mut peak = 0;
    for (_, b) in events {
        live += b;
        peak = peak.max(live);
    }
    peak
}

struct Case {
    name: String,
    run: Run,
    config: HfConfig,
    events: Vec<(String, i64)>,
    peak: i64,
}

/// The trace's events, the op's overload left out.
fn traced(c: &Value) -> Vec<(String, i64)> {
    (c["events"].as_array().into_iter().flatten())
        .map(|e| {
            let op = e[0].as_str().unwrap_or_default();
            let op = op.split('.').next().unwrap_or_default().to_string();
            (op, e[1].as_i64().unwrap_or(0))
        })
        .collect()
}

#[test]
fn steps_with_the_math_kernel_follow_transformers_event_by_event() {
    let cases = math_cases();
    assert_eq!(cases.len(), 12);
    check_cases(cases.into_iter(), true);
}

/// QLoRA's steps follow transformers, peft and bitsandbytes event by event.
#[test]
fn qlora_steps_follow_the_libraries_event_by_event() {
    let cases = qlora_cases();
    assert_eq!(cases.len(), 25);
    check_cases(cases.into_iter(), true);
}

#[test]
fn llama_family_eager_steps_under_autocast_follow_transformers_event_by_event() {
    let cases = amp_cases(
        &["llama", "mistral", "qwen2", "qwen3", "phi3"],
        Some(Attention::Eager),
    );
    assert_eq!(cases.len(), 20);
    check_cases(cases.into_iter(), true);
}

/// GPT-2 and Gemma under autocast. Two of GPT-2's eager checkpointed
/// cases free one storage of the first block's LayerNorm backward a step
/// later than PyTorch does (their peaks are equal): they are held to the
/// peak alone.
#[test]
fn gpt2_and_gemma_steps_under_autocast_follow_transformers_event_by_event() {
    let cases = amp_cases(&["gpt2", "gemma2", "gemma3"], None);
    assert_eq!(cases.len(), 20);
    let late = |c: &Case| c.name.starts_with("gpt2 amp Eager ckpt=true");
    let (loose, exact): (Vec<Case>, Vec<Case>) = cases.into_iter().partition(late);
    assert_eq!(loose.len(), 2);
    check_cases(exact.into_iter(), true);
    check_cases(loose.into_iter(), false);
}

#[test]
fn llama_family_steps_under_autocast_follow_transformers_event_by_event() {
    let cases = amp_cases(
        &["llama", "mistral", "qwen2", "qwen3", "phi3"],
        Some(Attention::Sdpa),
    );
    assert_eq!(cases.len(), 20);
    check_cases(cases.into_iter(), true);
}

/// The run a traced case's fields ask for, on the CPU: its batch,
/// sequence, attention, checkpointing (peft readying a checkpointed model
/// for LoRA) and LoRA; nothing else.
fn case_run(c: &Value) -> Run {
    let lora = c["lora"].as_u64().filter(|&r| r > 0);
    let checkpointing = c["checkpointing"].as_bool().unwrap_or(false);
    let attention = match c["attn"].as_str() {
        Some("eager") => Attention::Eager,
        _ => Attention::Sdpa,
    };
    let (batch, seq) = (c["batch"].as_u64(), c["seq"].as_u64());
    Run {
        checkpointing,
        lora,
        input_grads: lora.is_some() && checkpointing,
        ..Run::plain(batch.unwrap_or(0), seq.unwrap_or(0), attention)
    }
}

/// The traced cases of a reference file (`text`) for `models`: each
/// model's config in the case's type, `adjust`'s run and name for it.
fn traced_cases(
    text: &str,
    models: &[&str],
    adjust: impl Fn(&Value, Run) -> Option<(Run, String)>,
) -> Vec<Case> {
    let traces: Value = serde_json::from_str(text).expect("the traces are JSON");
    let mut out = Vec::new();
    for c in traces["cases"].as_array().into_iter().flatten() {
        let model = c["model"].as_str().unwrap_or_default();
        if !models.contains(&model) || c.get("error").is_some() {
            continue;
        }
        let Some((run, detail)) = adjust(c, case_run(c)) else {
            continue;
        };
        let mut config = HfConfig::read(&traces["configs"][model]).expect("a config");
        config.dtype = match c["dtype"].as_str() {
            Some("bfloat16") => Dtype::Bfloat16,
            _ => Dtype::Float32,
        };
        out.push(Case {
            name: format!(
                "{model} {detail}{:?} ckpt={} lora={:?}",
                run.attention, run.checkpointing, run.lora
            ),
            run,
            config,
            events: traced(c),
            peak: c["peak"].as_i64().unwrap_or(0),
        });
    }
    out
}

fn cases(models: &[&str]) -> Vec<Case> {
    traced_cases(TRACES, models, |c, run| {
        Some((run, format!("{} ", c["dtype"])))
    })
}

const QLORA_MODELS: &[&str] = &["llama", "mistral", "qwen3", "phi3", "gemma3"];

/// `tests/reference/hf_qlora.py`'s steps: in training mode (reentrant
/// checkpoints, also under autocast) and in eval mode (none, the
/// embeddings' output still needing a gradient), float32 activations
/// around 4-bit layers, LoRA of rank 4 on every linear layer.
fn qlora_cases() -> Vec<Case> {
    let text = include_str!("../../../../tests/reference/hf_qlora.json");
    traced_cases(text, QLORA_MODELS, |c, run| {
        let train = c["train"].as_bool().unwrap_or(false);
        let double_quant = c["double_quant"].as_bool().unwrap_or(false);
        let amp = (c["amp"] == "bfloat16").then_some(Dtype::Bfloat16);
        let run = Run {
            checkpointing: train,
            reentrant: train,
            lora: Some(4),
            input_grads: true,
            grads_exist: false,
            amp,
            quant: Some(Quant4 {
                nf4: true,
                double_quant,
                compute: Dtype::Bfloat16,
            }),
            ..run
        };
        Some((
            run,
            format!("qlora double_quant={double_quant} amp={amp:?} "),
        ))
    })
}

/// `tests/reference/hf_math.py`'s steps: float32, sdpa forced to its math
/// kernel with grouped-query heads.
fn math_cases() -> Vec<Case> {
    let text = include_str!("../../../../tests/reference/hf_math.json");
    traced_cases(text, &["llama", "mistral", "qwen3"], |_, run| {
        Some((
            Run {
                math_gqa: true,
                ..run
            },
            "math ".to_string(),
        ))
    })
}

/// `tests/reference/hf_accumulate.py`'s steps: the gradients already
/// there (`zero_grad(set_to_none=False)` before), the backward adding
/// into them.
fn accumulating_cases() -> Vec<Case> {
    let text = include_str!("../../../../tests/reference/hf_accumulate.json");
    traced_cases(text, &["llama", "gpt2", "qwen3"], |_, run| {
        let run = Run {
            grads_exist: true,
            ..run
        };
        Some((run, "onto gradients ".to_string()))
    })
}

/// A step onto gradients that exist adds each new one in place and lets
/// it go: no `.grad` is made, and the step ends where it began.
#[test]
fn steps_onto_existing_gradients_follow_transformers_event_by_event() {
    let cases = accumulating_cases();
    assert_eq!(cases.len(), 12);
    check_cases(cases.into_iter(), true);
}

/// `tests/reference/hf_amp.py`'s steps: float32 weights, the forward
/// under `torch.autocast` in bfloat16 with CUDA's policy.
fn amp_cases(models: &[&str], attention: Option<Attention>) -> Vec<Case> {
    let text = include_str!("../../../../tests/reference/hf_amp.json");
    traced_cases(text, models, |_, run| {
        let run = Run {
            amp: Some(Dtype::Bfloat16),
            ..run
        };
        (attention.is_none_or(|a| a == run.attention)).then(|| (run, "amp ".to_string()))
    })
}

/// The first place the two lists of events part, with what comes around it.
fn first_difference(ours: &[(String, i64)], theirs: &[(String, i64)]) -> Option<String> {
    let i = (0..ours.len().max(theirs.len())).find(|&i| ours.get(i) != theirs.get(i))?;
    let around = |e: &[(String, i64)]| {
        let wide = std::env::var("VRAMLAB_TRACE_WINDOW").map_or(6, |w| w.parse().unwrap_or(6));
        let from = i.saturating_sub(wide);
        (e[from.min(e.len())..(i + 6).min(e.len())].iter())
            .map(|(op, b)| format!("{op} {b}"))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    Some(format!(
        "event {i} of {}/{}:\n  ours:   {}\n  theirs: {}",
        ours.len(),
        theirs.len(),
        around(ours),
        around(theirs)
    ))
}

fn check(models: &[&str], exact: bool) {
    check_but(models, exact, |_| false);
}

/// `check` of every case but those `skip` names.
fn check_but(models: &[&str], exact: bool, skip: impl Fn(&Case) -> bool) {
    check_cases(cases(models).into_iter().filter(|c| !skip(c)), exact);
}

fn check_cases(cases: impl Iterator<Item = Case>, exact: bool) {
    let mut failures = Vec::new();
    for case in cases {
        let mut p = Program::default();
        if let Err(e) = play(&case.config, case.run, &mut p) {
            failures.push(format!("{}: {e}", case.name));
            continue;
        }
        let ours = events(&p);
        let ratio = peak(&ours) as f64 / case.peak as f64;
        if (ratio - 1.0).abs() > 0.01 {
            failures.push(format!(
                "{}: peak {} against {} ({ratio:.4})",
                case.name,
                peak(&ours),
                case.peak
            ));
        }
        if exact {
            if let Some(d) = first_difference(&ours, &case.events) {
                failures.push(format!("{}: {d}", case.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn llama_steps_follow_transformers_event_by_event() {
    check(&["llama"], true);
}

#[test]
fn llama_family_steps_follow_transformers_event_by_event() {
    check(&["mistral", "qwen2", "qwen3", "phi3"], true);
}

#[test]
fn gemma_steps_follow_transformers_event_by_event() {
    check(&["gemma2", "gemma3"], true);
}

/// GPT-2 with and without its dropout. Not traced here: sdpa with
/// attention dropout, which the CPU runs as the math kernel (the scores
/// written out); a GPU's fused kernel takes the dropout itself, as the
/// step models it.
#[test]
fn gpt2_steps_follow_transformers_event_by_event() {
    check_but(&["gpt2", "gpt2-dropout"], true, |c| {
        c.name.starts_with("gpt2-dropout") && c.run.attention == Attention::Sdpa
    });
}

/// What a step's gradients hold: the parameters' `.grad` (here LoRA's
/// adapters) are gradients; the gradient a leaf made of an activation
/// keeps (the embeddings' output under `enable_input_require_grads`, a
/// reentrant checkpoint's detached input under QLoRA) is an activation's.
#[test]
fn only_parameters_gradients_are_told_as_gradients() {
    for case in qlora_cases().into_iter().filter(|c| c.run.reentrant) {
        let mut p = Program::default();
        play(&case.config, case.run, &mut p).unwrap();
        let c = &case.config;
        // LoRA's rank-4 float32 adapters: `lora_A` (4 x in), `lora_B` (out x 4).
        let adapters: Vec<u64> = (crate::params::parameters(c).iter())
            .filter(|p| super::adapted(c, true, &p.name, &p.shape))
            .flat_map(|p| {
                let (out, inp) = super::fans(c, &p.shape);
                [4 * inp * 4, out * 4 * 4]
            })
            .collect();
        let told: Vec<u64> = (p.allocs.iter())
            .filter(|m| m.holds == vramlab_train::program::Holds::Gradient)
            .map(|m| m.bytes())
            .collect();
        assert!(!told.is_empty(), "{}", case.name);
        assert!(
            told.iter().all(|b| adapters.contains(b)),
            "{}: {told:?}",
            case.name
        );
        let rows_wide = case.run.batch * case.run.seq * c.hidden * 4;
        assert!(!adapters.contains(&rows_wide), "{}", case.name);
    }
}

/// The one program's roles, as the autograd tape sets them: the forward's
/// tensors `Forward`, the backward's `Backward`, each piece of a trainable
/// parameter's gradient (its `.grad`, and the sums of a tied weight's
/// gradients) `Grad` of the parameter's index among the trainable ones,
/// and AdamW's temporaries `Scratch` of the parameter they update.
#[test]
fn a_steps_tensors_carry_their_roles() {
    use vramlab_train::program::{Holds, Role};
    for case in cases(&["llama"]).into_iter().take(2) {
        let mut p = Program::default();
        play(&case.config, case.run, &mut p).unwrap();
        let mut phase = "";
        let mut grads = Vec::new();
        let mut scratch = Vec::new();
        for op in &p.ops {
            let i = match *op {
                Op::Phase(name) => {
                    phase = name;
                    continue;
                }
                Op::Alloc(i) => i,
                _ => continue,
            };
            let a = &p.allocs[i];
            match (phase, a.role) {
                ("forward", Role::Forward) => {}
                ("backward", Role::Backward) => {
                    assert_ne!(a.holds, Holds::Gradient, "{} #{i}", a.op)
                }
                ("backward", Role::Grad(param)) => {
                    assert_eq!(a.holds, Holds::Gradient, "{}", case.name);
                    grads.push(param);
                }
                ("optimizer step", Role::Scratch { param, .. }) => scratch.push(param),
                other => panic!("{}: {} made in {other:?}", case.name, a.op),
            }
        }
        grads.sort_unstable();
        grads.dedup();
        let trained: Vec<usize> = (0..grads.len()).collect();
        assert_eq!(grads, trained, "{}: a .grad per parameter", case.name);
        scratch.dedup();
        assert_eq!(scratch, trained, "{}: AdamW's temporaries", case.name);
    }
}
