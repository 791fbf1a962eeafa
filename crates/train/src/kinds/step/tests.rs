//! Event by event against PyTorch's own ops (`tests/reference/step_trace.json`,
//! recorded on the CPU: the fused kernel's names there end in `_for_cpu`).

use super::*;
use crate::kinds::Norm;
use serde_json::Value;

const PYTORCH: &str = include_str!("../../../../../tests/reference/step_trace.json");

/// The recorded transformer steps.
fn recorded() -> Vec<Value> {
    let all: Value = serde_json::from_str(PYTORCH).unwrap();
    let steps = all["steps"].as_array().unwrap();
    steps
        .iter()
        .filter(|s| s["kind"] == "transformer")
        .cloned()
        .collect()
}

fn options(s: &Value) -> Options {
    Options {
        attention: if s["fused"] == true {
            Attention::Sdpa
        } else {
            Attention::Eager
        },
        checkpointing: s["checkpointing"] == true,
        amp: amp(s),
        ..Options::default()
    }
}

/// The recorded autocast type, if any.
fn amp(s: &Value) -> Option<Dtype> {
    match s["amp"].as_str() {
        Some("float16") => Some(Dtype::Float16),
        Some("bfloat16") => Some(Dtype::Bfloat16),
        _ => None,
    }
}

/// The first event where two traces part, with the events around it.
fn first_difference(ours: &[(String, i64)], theirs: &[(String, i64)]) -> String {
    let at = ours
        .iter()
        .zip(theirs)
        .position(|(a, b)| a != b)
        .unwrap_or(ours.len().min(theirs.len()));
    let around = |t: &[(String, i64)]| t[at.saturating_sub(6)..(at + 6).min(t.len())].to_vec();
    format!(
        "event {at} of {} / {}\nours:   {:?}\ntheirs: {:?}",
        ours.len(),
        theirs.len(),
        around(ours),
        around(theirs)
    )
}

/// A whole step as a trace: forward, backward, Adam, `zero_grad`.
fn events(t: &TransformerShape, batch: u64, options: Options) -> Vec<TraceEvent> {
    let mut events = program(t, batch, options).events();
    let mut trained = t.parameters(Dtype::Float32);
    trained.retain(|p| !p.frozen);
    events.extend(optimizer_events(&trained));
    events
}

fn shape(s: &Value) -> TransformerShape {
    let u = |k: &str| s[k].as_u64().unwrap();
    TransformerShape {
        layers: u("layers") as u32,
        width: u("width"),
        heads: u("heads"),
        seq_len: u("seq_len"),
        vocab: u("vocab"),
        mlp_ratio: 4,
        norm: Norm::LayerNorm,
        tied: true,
        lora_rank: s["lora_rank"].as_u64().unwrap_or(0),
    }
}

/// `addmm.default` as `addmm`; the CPU's fused kernel by its CUDA name.
fn op(name: &str) -> String {
    let base = name.split('.').next().unwrap();
    base.replace("_for_cpu", "")
}

#[test]
fn eager_fused_checkpointed_lora_and_autocast_steps_are_pytorchs_event_by_event() {
    let steps = recorded();
    assert_eq!(steps.len(), 13);
    for s in steps {
        let options = options(&s);
        let ours = events(&shape(&s), s["batch"].as_u64().unwrap(), options);
        let theirs: Vec<(String, i64)> = s["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (op(e[0].as_str().unwrap()), e[1].as_i64().unwrap()))
            .collect();
        let ours: Vec<(String, i64)> = ours.iter().map(|e| (e.op.to_string(), e.bytes)).collect();
        let peak = peak(&events(&shape(&s), s["batch"].as_u64().unwrap(), options));
        assert!(
            ours == theirs,
            "{options:?}: {}",
            first_difference(&ours, &theirs)
        );
        assert_eq!(peak, s["peak_bytes"].as_u64().unwrap());
    }
}

/// A recorded CNN's shape.
fn cnn_shape(s: &Value) -> crate::kinds::CnnShape {
    let u = |k: &str| s[k].as_u64().unwrap();
    crate::kinds::CnnShape {
        channels: u("channels"),
        image_size: u("image_size"),
        blocks: u("blocks") as u32,
        width: u("width"),
        classes: u("classes"),
    }
}

fn pytorch_events(s: &Value) -> Vec<(String, i64)> {
    s["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (op(e[0].as_str().unwrap()), e[1].as_i64().unwrap()))
        .collect()
}

#[test]
fn the_cnn_step_is_pytorchs_event_by_event_checkpointed_or_not_in_float32_and_under_autocast() {
    let all: Value = serde_json::from_str(PYTORCH).unwrap();
    let steps: Vec<&Value> = all["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "cnn")
        .collect();
    assert_eq!(steps.len(), 4);
    for s in steps {
        let u = |k: &str| s[k].as_u64().unwrap();
        let c = cnn_shape(s);
        let mut ours = cnn_program(&c, u("batch"), options(s)).events();
        ours.extend(optimizer_events(&c.parameters(Dtype::Float32)));
        let pairs: Vec<(String, i64)> = ours.iter().map(|e| (e.op.to_string(), e.bytes)).collect();
        let theirs = pytorch_events(s);
        assert!(
            pairs == theirs,
            "{:?}: {}",
            options(s),
            first_difference(&pairs, &theirs)
        );
        assert_eq!(peak(&ours), u("peak_bytes"));
    }
}

/// What eager attention keeps for backward and fused attention does not,
/// per layer: the B·H·S·S probabilities and the S·S mask, less the fused
/// kernel's B·H·S log-sum-exp (both keep q, k, v and the output, as copies
/// or as the projection they are views of). Where the step peaks at the
/// logits' gradient (up to S = 512 here; longer, eager attention's own
/// forward peaks higher) every layer holds them, so the difference is exact.
#[test]
fn eager_attention_keeps_the_square_of_the_sequence_and_fused_does_not() {
    for seq_len in [128, 256, 512] {
        let t = TransformerShape {
            layers: 2,
            width: 128,
            heads: 4,
            seq_len,
            vocab: 1000,
            mlp_ratio: 4,
            norm: Norm::LayerNorm,
            tied: true,
            lora_rank: 0,
        };
        let batch = 4;
        let run = |attention| {
            let options = Options {
                attention,
                checkpointing: false,
                amp: None,
                ..Options::default()
            };
            peak(&events(&t, batch, options))
        };
        let (eager, fused) = (run(Attention::Eager), run(Attention::Sdpa));
        let probabilities = batch * t.heads * seq_len * seq_len * 4;
        let mask = seq_len * seq_len;
        let lse = batch * t.heads * seq_len * 4;
        assert_eq!(
            eager - fused,
            u64::from(t.layers) * (probabilities + mask - lse),
            "seq_len {seq_len}"
        );
    }
}

/// Every free names a live tensor; at the end only the loss and one
/// gradient per trained parameter (its shape) are alive, for every kind of
/// norm, tied or not, attention, checkpointing, with LoRA or without, under
/// autocast or not.
#[test]
fn a_program_frees_what_it_made_and_leaves_one_gradient_per_parameter() {
    let cases = [
        (Norm::LayerNorm, true, 0),
        (Norm::RmsNorm, false, 0),
        (Norm::LayerNorm, true, 4),
        (Norm::RmsNorm, false, 2),
    ];
    for (norm, tied, lora_rank) in cases {
        let amps: &[Option<Dtype>] = if lora_rank > 0 {
            &[None]
        } else {
            &[None, Some(Dtype::Float16), Some(Dtype::Bfloat16)]
        };
        for (attention, checkpointing, &amp) in every_option(amps) {
            {
                let t = TransformerShape {
                    layers: 3,
                    width: 64,
                    heads: 4,
                    seq_len: 32,
                    vocab: 100,
                    mlp_ratio: 4,
                    norm,
                    tied,
                    lora_rank,
                };
                let options = Options {
                    attention,
                    checkpointing,
                    amp,
                    ..Options::default()
                };
                let p = program(&t, 2, options);
                check_marks(&p, lora_rank == 0);
                let mut live = vec![false; p.allocs.len()];
                for op in &p.ops {
                    match *op {
                        Op::Alloc(i) => live[i] = true,
                        Op::Free(i) => {
                            assert!(live[i], "{options:?}: {:?} freed twice", p.allocs[i]);
                            live[i] = false;
                        }
                        _ => {}
                    }
                }
                let mut grads: Vec<(usize, Vec<u64>)> = Vec::new();
                for (i, a) in p.allocs.iter().enumerate().filter(|(i, _)| live[*i]) {
                    match a.role {
                        Role::Grad(param) => grads.push((param, a.shape.to_vec())),
                        Role::Loss => {}
                        _ => panic!("{options:?}: {a:?} (#{i}) outlives the step"),
                    }
                }
                grads.sort();
                let expected: Vec<(usize, Vec<u64>)> = t
                    .parameters(Dtype::Float32)
                    .into_iter()
                    .enumerate()
                    .filter(|(_, p)| !p.frozen)
                    .map(|(i, p)| (i, p.shape))
                    .collect();
                assert_eq!(
                    grads, expected,
                    "{norm:?} tied {tied} r {lora_rank} {options:?}"
                );
            }
        }
    }
}

/// Autocast does not halve a step: at S = 1024 eager attention saves the
/// float32 probabilities and their float16 cast, and the step peaks higher
/// than in float32; the fused kernel keeps no S x S tensor, and the step
/// peaks lower.
#[test]
fn under_autocast_long_eager_attention_peaks_higher_and_fused_lower() {
    let t = TransformerShape {
        layers: 4,
        width: 256,
        heads: 8,
        seq_len: 1024,
        vocab: 8000,
        mlp_ratio: 4,
        norm: Norm::RmsNorm,
        tied: false,
        lora_rank: 0,
    };
    let run = |attention, amp| {
        let options = Options {
            attention,
            checkpointing: false,
            amp,
            ..Options::default()
        };
        peak(&events(&t, 8, options))
    };
    let half = Some(Dtype::Float16);
    let (eager, eager_amp) = (run(Attention::Eager, None), run(Attention::Eager, half));
    let (fused, fused_amp) = (run(Attention::Sdpa, None), run(Attention::Sdpa, half));
    assert!(eager_amp > eager, "{eager_amp} vs {eager}");
    assert!(fused_amp < fused, "{fused_amp} vs {fused}");
}

/// One forward end, with the loss before it and every gradient after it;
/// NLL's node lets go of the targets, the token embedding's (or the first
/// convolution's) of the inputs when it saved them.
fn check_marks(p: &Program, inputs_saved: bool) {
    let ends = p.ops.iter().filter(|op| **op == Op::ForwardEnd).count();
    assert_eq!(ends, 1);
    let end = p.forward_end();
    for (at, op) in p.ops.iter().enumerate() {
        match *op {
            Op::Alloc(i) if at < end => assert!(!matches!(p.allocs[i].role, Role::Grad(_))),
            Op::Alloc(i) => assert_ne!(p.allocs[i].role, Role::Loss),
            Op::Release(_) | Op::Rebind => assert_eq!(at < end, *op == Op::Rebind),
            _ => {}
        }
    }
    let releases = |part| p.ops.iter().filter(|op| **op == Op::Release(part)).count();
    assert_eq!(releases(Batch::Targets), 1);
    assert_eq!(releases(Batch::Inputs), usize::from(inputs_saved));
}

#[test]
fn the_cnn_saves_its_images_unless_autocast_cast_them_outside_a_checkpoint() {
    let c = crate::kinds::CnnShape {
        channels: 3,
        image_size: 16,
        blocks: 2,
        width: 8,
        classes: 10,
    };
    for checkpointing in [false, true] {
        for amp in [None, Some(Dtype::Float16)] {
            let options = Options {
                attention: Attention::Eager,
                checkpointing,
                amp,
                ..Options::default()
            };
            check_marks(&cnn_program(&c, 4, options), checkpointing || amp.is_none());
        }
    }
}

const NO_GRAD: &str = include_str!("../../../../../tests/reference/no_grad_trace.json");

#[test]
fn forward_passes_under_no_grad_are_pytorchs_event_by_event() {
    let all: Value = serde_json::from_str(NO_GRAD).unwrap();
    let steps = all["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 12);
    for s in steps {
        let u = |k: &str| s[k].as_u64().unwrap();
        let options = options(s);
        let mut p = match s["kind"].as_str() {
            Some("cnn") => cnn_no_grad_program(&cnn_shape(s), u("batch"), options),
            Some("mlp") => mlp_no_grad_program(&mlp_shape(s), u("batch"), options),
            _ => no_grad_program(&shape(s), u("batch"), options),
        };
        // A statement binds its loss when it returns; no earlier loss dies.
        p.ops.retain(|op| *op != Op::Rebind);
        assert_eq!(p.forward_end() + 1, p.ops.len());
        let ours = p.events();
        let pairs: Vec<(String, i64)> = ours.iter().map(|e| (e.op.to_string(), e.bytes)).collect();
        let theirs = pytorch_events(s);
        assert!(
            pairs == theirs,
            "{} {options:?}: {}",
            s["kind"],
            first_difference(&pairs, &theirs)
        );
        assert_eq!(peak(&ours), u("peak_bytes"));
    }
}

/// A recorded MLP's shape (`half`: `model.half()`).
fn mlp_shape(s: &Value) -> crate::kinds::MlpShape {
    let u = |k: &str| s[k].as_u64().unwrap();
    crate::kinds::MlpShape {
        layers: u("layers") as u32,
        width: u("width"),
        input_dim: u("input_dim"),
        classes: u("classes"),
        dtype: match s["half"] == true {
            true => Dtype::Float16,
            false => Dtype::Float32,
        },
    }
}

#[test]
fn mlp_steps_plain_checkpointed_half_and_autocast_are_pytorchs_event_by_event() {
    let all: Value = serde_json::from_str(PYTORCH).unwrap();
    let steps: Vec<&Value> = all["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "mlp")
        .collect();
    assert_eq!(steps.len(), 7);
    for s in steps {
        let m = mlp_shape(s);
        let accumulate = s["accumulate"].as_u64().unwrap_or(1);
        let options = Options {
            checkpointing: s["checkpointing"] == true,
            amp: amp(s),
            accumulate,
            ..Options::default()
        };
        let spec = crate::ModelSpec::mlp(m.layers, m.width, m.input_dim, m.classes, m.dtype);
        let mut ours = mlp_program(&m, s["batch"].as_u64().unwrap(), options).events();
        let mut theirs: Vec<(String, i64)> = s["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (op(e[0].as_str().unwrap()), e[1].as_i64().unwrap()))
            .collect();
        if accumulate > 1 {
            // The first micro-batch, whose gradients become `.grad`.
            theirs.truncate(ours.len());
        } else {
            ours.extend(optimizer_events(&spec.parameters()));
            assert_eq!(peak(&ours), s["peak_bytes"].as_u64().unwrap());
        }
        let ours: Vec<(String, i64)> = ours.iter().map(|e| (e.op.to_string(), e.bytes)).collect();
        assert!(
            ours == theirs,
            "{m:?} {options:?}: {}",
            first_difference(&ours, &theirs)
        );
    }
}

/// The regions a program marks, checked: properly nested, autocast around
/// the forward pass (and each recomputation) exactly when asked, one
/// checkpoint region per checkpointed block in forward and one
/// recomputation of it in backward, none under `no_grad`.
fn regions(p: &Program, amp: bool) -> (usize, usize) {
    let mut open = Vec::new();
    let (mut checkpoints, mut recomputes, mut autocasts) = (0, 0, 0);
    for op in &p.ops {
        match *op {
            Op::Begin(r) => {
                match r {
                    Region::Autocast => autocasts += 1,
                    Region::Checkpoint => checkpoints += 1,
                    Region::Recompute => recomputes += 1,
                }
                open.push(r);
            }
            Op::End(r) => assert_eq!(open.pop(), Some(r), "regions cross"),
            Op::Alloc(i) if matches!(p.allocs[i].role, Role::Backward | Role::Grad(_)) => {
                assert!(!open.contains(&Region::Autocast), "backward under autocast");
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "{open:?} never ends");
    assert_eq!(autocasts, if amp { 1 + recomputes } else { 0 });
    (checkpoints, recomputes)
}

#[test]
fn regions_nest_and_mark_every_checkpointed_block_and_autocast() {
    let t = TransformerShape {
        layers: 3,
        width: 64,
        heads: 2,
        seq_len: 8,
        vocab: 50,
        mlp_ratio: 4,
        norm: Norm::LayerNorm,
        tied: true,
        lora_rank: 0,
    };
    let lora = TransformerShape { lora_rank: 2, ..t };
    let c = crate::kinds::CnnShape {
        channels: 1,
        image_size: 8,
        blocks: 2,
        width: 4,
        classes: 3,
    };
    let m = crate::kinds::MlpShape {
        layers: 9,
        width: 8,
        input_dim: 5,
        classes: 3,
        dtype: Dtype::Float32,
    };
    for amp in [None, Some(Dtype::Float16)] {
        for checkpointing in [false, true] {
            let options = Options {
                checkpointing,
                amp,
                ..Options::default()
            };
            let blocks = |n: usize| if checkpointing { (n, n) } else { (0, 0) };
            let a = amp.is_some();
            assert_eq!(regions(&program(&t, 2, options), a), blocks(3));
            assert_eq!(regions(&program(&lora, 2, options), a), blocks(3));
            assert_eq!(regions(&cnn_program(&c, 2, options), a), blocks(2));
            // Nine hidden layers: three segments, two of them checkpointed.
            assert_eq!(regions(&mlp_program(&m, 2, options), a), blocks(2));
            assert_eq!(regions(&no_grad_program(&t, 2, options), a), (0, 0));
            assert_eq!(regions(&cnn_no_grad_program(&c, 2, options), a), (0, 0));
            assert_eq!(regions(&mlp_no_grad_program(&m, 2, options), a), (0, 0));
        }
    }
}

/// `att = att.masked_fill(~mask, -inf).softmax(-1)`: until softmax's
/// output is made, `~mask` and `masked_fill`'s output are the expression's
/// temporaries (an error there drops them); once it is, they are not, and
/// nothing else in the step is one.
#[test]
fn eager_attentions_mask_and_fill_are_temporaries_until_softmax() {
    let t = TransformerShape {
        layers: 1,
        width: 64,
        heads: 2,
        seq_len: 32,
        vocab: 100,
        mlp_ratio: 4,
        norm: Norm::LayerNorm,
        tied: true,
        lora_rank: 0,
    };
    let options = Options {
        attention: Attention::Eager,
        ..Options::default()
    };
    let p = program(&t, 2, options);
    let position = |op: &str| {
        let i = p.allocs.iter().position(|a| a.op == op).unwrap();
        (i, p.ops.iter().position(|o| *o == Op::Alloc(i)).unwrap())
    };
    let (mask, _) = position("bitwise_not");
    let (fill, _) = position("masked_fill");
    let (probs, at_softmax) = position("_softmax");
    for i in [mask, fill] {
        assert_eq!(p.allocs[i].temporary_until, Some(probs));
        assert!(p.temporary_at(i, at_softmax));
        assert!(!p.temporary_at(i, at_softmax + 1));
    }
    let others = (0..p.allocs.len()).filter(|&i| p.allocs[i].temporary_until.is_some());
    assert_eq!(others.count(), 2);
}

/// `criterion(model(x.cuda()), y.cuda())`: the labels are moved where the
/// criterion begins, at its `log_softmax` (in the logits' type; under
/// autocast NLL reads a float32 copy of its output), before NLL reads them.
#[test]
fn the_criterion_begins_at_its_log_softmax() {
    let m = crate::kinds::MlpShape {
        layers: 2,
        width: 8,
        input_dim: 5,
        classes: 3,
        dtype: Dtype::Float32,
    };
    for amp in [None, Some(Dtype::Float16)] {
        let options = Options {
            amp,
            ..Options::default()
        };
        for p in [
            mlp_program(&m, 2, options),
            mlp_no_grad_program(&m, 2, options),
        ] {
            let at = p.criterion_starts();
            let Op::Alloc(i) = p.ops[at] else {
                panic!("{:?}", p.ops[at])
            };
            assert_eq!(p.allocs[i].op, "_log_softmax");
            assert!(at < p.targets_read(), "{amp:?}");
        }
    }
}
