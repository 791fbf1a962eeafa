use super::*;
use crate::kinds::step::{self, Attention, Options};
use crate::kinds::{CnnShape, NamedTensor, Norm, TransformerShape};
use vramlab_core::types::Dtype;

fn gpt(norm: Norm, tied: bool, lora_rank: u64) -> TransformerShape {
    TransformerShape {
        layers: 2,
        width: 8,
        heads: 2,
        seq_len: 5,
        vocab: 7,
        mlp_ratio: 2,
        norm,
        tied,
        lora_rank,
    }
}

fn small_cnn() -> CnnShape {
    CnnShape {
        channels: 2,
        image_size: 6,
        blocks: 2,
        width: 3,
        classes: 3,
    }
}

/// Parameters' shapes and values.
type Params = (Vec<Vec<u64>>, Vec<Vec<f32>>);

/// Deterministic values, different for every parameter and element.
fn values(tensors: &[NamedTensor]) -> Params {
    let shapes = tensors.iter().map(|t| t.shape.clone()).collect();
    let values = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (0..t.numel())
                .map(|j| 0.4 * (0.37 * (j + 1) as f32 + 1.1 * (i + 1) as f32).sin())
                .collect()
        })
        .collect();
    (shapes, values)
}

fn tokens(batch: u64, t: &TransformerShape) -> BatchValues {
    let ids: Vec<f32> = (0..batch * t.seq_len)
        .map(|k| ((3 * k + k / 4) % t.vocab) as f32)
        .collect();
    let targets = ids.iter().map(|v| (v + 2.0) % t.vocab as f32).collect();
    BatchValues {
        inputs: ids,
        input_shape: vec![batch, t.seq_len],
        targets,
    }
}

fn images(batch: u64, c: &CnnShape) -> BatchValues {
    let n = batch * c.channels * c.image_size * c.image_size;
    BatchValues {
        inputs: (0..n).map(|k| (0.31 * k as f32).sin()).collect(),
        input_shape: vec![batch, c.channels, c.image_size, c.image_size],
        targets: (0..batch).map(|b| (b % c.classes) as f32).collect(),
    }
}

fn whole(program: &Program, (shapes, params): &Params, batch: &BatchValues) -> Values {
    let mut values = Values::default();
    let inputs = Inputs {
        shapes,
        params,
        batch,
        state: &[],
    };
    run(program, 0..program.ops.len(), &inputs, &mut values).expect("the program runs");
    values
}

fn options(attention: Attention, checkpointing: bool, amp: Option<Dtype>) -> Options {
    Options {
        attention,
        checkpointing,
        amp,
        ..Options::default()
    }
}

/// Every gradient the program makes is the loss's derivative, checked by
/// central differences at three elements of every parameter; frozen
/// parameters get none. `h`: the step, small enough not to cross a kink
/// (ReLU's, a pooling window's choice).
fn check_gradients(program: &Program, tensors: &[NamedTensor], batch: &BatchValues, h: f32) {
    let params = values(tensors);
    let got = whole(program, &params, batch);
    let loss = |params: &Params| whole(program, params, batch).loss.unwrap();
    assert!(loss(&params).is_finite());
    for (i, t) in tensors.iter().enumerate() {
        let Some(grad) = &got.grads[i] else {
            assert!(t.frozen, "{} has no gradient", t.name);
            continue;
        };
        assert!(!t.frozen, "frozen {} has a gradient", t.name);
        let n = grad.len();
        for j in [0, n / 2, n - 1] {
            let mut plus = params.clone();
            plus.1[i][j] += h;
            let mut minus = params.clone();
            minus.1[i][j] -= h;
            let numeric = (loss(&plus) - loss(&minus)) / (2.0 * h);
            let analytic = grad[j];
            assert!(
                (numeric - analytic).abs() < 2e-3 + 0.03 * analytic.abs(),
                "{}[{j}]: numeric {numeric}, analytic {analytic}",
                t.name
            );
        }
    }
}

#[test]
fn transformer_gradients_are_the_losss_derivatives() {
    for (norm, tied, lora) in [
        (Norm::LayerNorm, true, 0),
        (Norm::RmsNorm, false, 0),
        (Norm::LayerNorm, true, 2),
    ] {
        let t = gpt(norm, tied, lora);
        for attention in [Attention::Eager, Attention::Sdpa] {
            let program = step::program(&t, 2, options(attention, false, None));
            check_gradients(
                &program,
                &t.parameters(Dtype::Float32),
                &tokens(2, &t),
                1e-2,
            );
        }
    }
}

#[test]
fn cnn_gradients_are_the_losss_derivatives() {
    let c = small_cnn();
    let program = step::cnn_program(&c, 4, options(Attention::Eager, false, None));
    check_gradients(
        &program,
        &c.parameters(Dtype::Float32),
        &images(4, &c),
        1e-3,
    );
}

/// Fused or eager attention, checkpointed or not, the same step: the same
/// loss and gradients; under autocast the same to float16's or bfloat16's
/// rounding (and not the same to float32's: it rounds).
#[test]
fn every_technique_computes_the_same_step() {
    let close = |a: &Values, b: &Values, what: &str| {
        let amp = what.contains("Some(");
        let (tolerance, rel) = if amp { (2e-2, 5e-2) } else { (1e-5, 1e-4) };
        let (la, lb) = (a.loss.unwrap(), b.loss.unwrap());
        assert!((la - lb).abs() < tolerance, "{what}: loss {la} vs {lb}");
        if amp {
            assert_ne!(la, lb, "{what}: autocast rounds");
        }
        for (i, (x, y)) in a.grads.iter().zip(&b.grads).enumerate() {
            let (x, y) = (x.as_ref(), y.as_ref());
            assert_eq!(x.is_some(), y.is_some(), "{what}: parameter {i}");
            for (u, v) in x.into_iter().flatten().zip(y.into_iter().flatten()) {
                let bound = tolerance + rel * u.abs().max(v.abs());
                assert!((u - v).abs() < bound, "{what}: parameter {i}: {u} vs {v}");
            }
        }
    };
    for lora in [0, 2] {
        let t = gpt(Norm::LayerNorm, lora == 0, lora);
        let (params, batch) = (values(&t.parameters(Dtype::Float32)), tokens(3, &t));
        let plain = whole(&step::program(&t, 3, Options::default()), &params, &batch);
        for (attention, checkpointing, amp) in step::every_option(&[None, Some(Dtype::Bfloat16)]) {
            let program = step::program(&t, 3, options(attention, checkpointing, *amp));
            let what =
                format!("lora {lora}, {attention:?}, checkpointing {checkpointing}, {amp:?}");
            close(&plain, &whole(&program, &params, &batch), &what);
        }
    }
    let c = small_cnn();
    let (params, batch) = (values(&c.parameters(Dtype::Float32)), images(4, &c));
    let plain = whole(
        &step::cnn_program(&c, 4, Options::default()),
        &params,
        &batch,
    );
    for (checkpointing, amp) in [
        (true, None),
        (false, Some(Dtype::Float16)),
        (true, Some(Dtype::Bfloat16)),
    ] {
        let program = step::cnn_program(&c, 4, options(Attention::Eager, checkpointing, amp));
        let what = format!("cnn, checkpointing {checkpointing}, {amp:?}");
        close(&plain, &whole(&program, &params, &batch), &what);
    }
}

/// Each GPU's attention kernel (the packed gradients and padded
/// log-sum-exp of the memory-efficient one, flash's and cuDNN's buffers,
/// the math kernel's separate ops) computes the CPU kernel's step.
#[test]
fn every_attention_kernel_computes_the_same_step() {
    let t = gpt(Norm::LayerNorm, true, 0);
    let (params, batch) = (values(&t.parameters(Dtype::Float32)), tokens(3, &t));
    for amp in [None, Some(Dtype::Bfloat16)] {
        let cpu = options(Attention::Sdpa, false, amp);
        let plain = whole(&step::program(&t, 3, cpu), &params, &batch);
        for gpu in [(7, 5), (8, 0), (9, 0)] {
            for checkpointing in [false, true] {
                let on_gpu = Options {
                    gpu: Some(gpu),
                    ..options(Attention::Sdpa, checkpointing, amp)
                };
                let computed = whole(&step::program(&t, 3, on_gpu), &params, &batch);
                let what = format!("{gpu:?} {amp:?} checkpointing {checkpointing}");
                let (a, b) = (plain.loss.unwrap(), computed.loss.unwrap());
                assert!((a - b).abs() < 2e-2, "{what}: {a} vs {b}");
                for (x, y) in plain.grads.iter().zip(&computed.grads) {
                    let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
                    for (u, v) in x.iter().zip(y) {
                        assert!((u - v).abs() < 2e-2 + 5e-2 * u.abs().max(v.abs()), "{what}");
                    }
                }
                if amp.is_none() {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "{what}: float32 is the same arithmetic"
                    );
                }
            }
        }
    }
}

#[test]
fn a_forward_under_no_grad_computes_the_steps_loss() {
    let t = gpt(Norm::RmsNorm, false, 0);
    let (params, batch) = (values(&t.parameters(Dtype::Float32)), tokens(2, &t));
    for attention in [Attention::Eager, Attention::Sdpa] {
        let o = options(attention, false, None);
        let step = whole(&step::program(&t, 2, o), &params, &batch);
        let forward = whole(&step::no_grad_program(&t, 2, o), &params, &batch);
        assert_eq!(step.loss, forward.loss);
        assert!(forward.grads.iter().all(Option::is_none));
    }
}

/// The loss at the start is about log(vocabulary) for small weights.
#[test]
fn an_untrained_models_loss_is_about_uniform() {
    let t = gpt(Norm::LayerNorm, true, 0);
    let (shapes, values) = values(&t.parameters(Dtype::Float32));
    let small = values
        .iter()
        .map(|v| v.iter().map(|x| x * 0.01).collect())
        .collect();
    let params = (shapes, small);
    let loss = whole(
        &step::program(&t, 2, Options::default()),
        &params,
        &tokens(2, &t),
    )
    .loss;
    assert!((loss.unwrap() - (7f32).ln()).abs() < 0.01, "{loss:?}");
}

/// As `torch.tensor(x).half()` and `.bfloat16()` round.
#[test]
fn casts_round_to_float16_and_bfloat16() {
    assert_eq!(to_f16(1.0 + 1.0 / 4096.0), 1.0);
    assert_eq!(to_f16(1.0 + 3.0 / 2048.0), 1.0 + 2.0 / 1024.0);
    assert_eq!(to_f16(65519.0), 65504.0);
    assert_eq!(to_f16(-70000.0), f32::NEG_INFINITY);
    assert_eq!(to_f16(3e-8), 5.960_464_5e-8);
    assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 1.0);
    assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 1.0 + 2.0 / 128.0);
    assert_eq!(to_bf16(3.0e38), 3.004_055_3e38);
}

#[test]
fn a_program_that_reads_a_freed_tensor_is_refused_with_its_op() {
    let t = gpt(Norm::LayerNorm, true, 0);
    let mut program = step::program(&t, 1, Options::default());
    let first_free = program
        .ops
        .iter()
        .position(|op| matches!(op, Op::Free(_)))
        .unwrap();
    let Op::Free(dead) = program.ops[first_free] else {
        unreachable!()
    };
    // Free it at once, before the op that reads it.
    program.ops.retain(|op| *op != Op::Free(dead));
    let made = program
        .ops
        .iter()
        .position(|op| *op == Op::Alloc(dead))
        .unwrap();
    program.ops.insert(made + 1, Op::Free(dead));
    let (shapes, params) = values(&t.parameters(Dtype::Float32));
    let batch = tokens(1, &t);
    let inputs = Inputs {
        shapes: &shapes,
        params: &params,
        batch: &batch,
        state: &[],
    };
    let err = run(
        &program,
        0..program.ops.len(),
        &inputs,
        &mut Values::default(),
    )
    .unwrap_err();
    assert!(
        err.0.contains("reads a tensor after it was freed"),
        "{}",
        err.0
    );
}

#[test]
fn the_cost_counts_the_products() {
    let t = gpt(Norm::LayerNorm, true, 0);
    let shapes: Vec<Vec<u64>> = t
        .parameters(Dtype::Float32)
        .into_iter()
        .map(|p| p.shape)
        .collect();
    let one = cost(&step::program(&t, 1, Options::default()), &shapes);
    let four = cost(&step::program(&t, 4, Options::default()), &shapes);
    // The forward's products alone: per token 2 · (3d² + d² + 2 · 2d² + d · vocab).
    let per_token = 2 * (3 * 64 + 64 + 2 * 2 * 64 + 8 * 7);
    assert!(one.flops > 5 * per_token, "{one:?}");
    assert!(four.flops > 3 * one.flops && four.flops < 5 * one.flops);
    assert!(four.host_bytes > one.host_bytes);
}

const PYTORCH: &str = include_str!("../../../../tests/reference/cpu_step.json");

/// The loss and every gradient equal PyTorch's for the same parameters
/// and batch (`tests/reference/cpu_step.py`): per parameter its sum, its
/// absolute sum and its sum weighted by cos(0.5 j), to float32 rounding.
#[test]
fn a_step_computes_what_pytorch_computes() {
    let cases: serde_json::Value = serde_json::from_str(PYTORCH).unwrap();
    let o = |attention| options(attention, false, None);
    let (ln, rms, lora) = (
        gpt(Norm::LayerNorm, true, 0),
        gpt(Norm::RmsNorm, false, 0),
        gpt(Norm::LayerNorm, true, 2),
    );
    let c = small_cnn();
    let m = small_mlp(3, Dtype::Float32);
    let programs = [
        (
            "layernorm, tied, eager",
            step::program(&ln, 2, o(Attention::Eager)),
            ln.parameters(Dtype::Float32),
            tokens(2, &ln),
        ),
        (
            "rmsnorm, untied, sdpa",
            step::program(&rms, 2, o(Attention::Sdpa)),
            rms.parameters(Dtype::Float32),
            tokens(2, &rms),
        ),
        (
            "layernorm, tied, eager, lora 2",
            step::program(&lora, 2, o(Attention::Eager)),
            lora.parameters(Dtype::Float32),
            tokens(2, &lora),
        ),
        (
            "cnn",
            step::cnn_program(&c, 4, o(Attention::Eager)),
            c.parameters(Dtype::Float32),
            images(4, &c),
        ),
        (
            "mlp",
            step::mlp_program(&m, 7, o(Attention::Eager)),
            mlp_params(&m),
            features(7, &m),
        ),
    ];
    for (name, program, tensors, batch) in programs {
        let want = &cases["cases"][name];
        let got = whole(&program, &values(&tensors), &batch);
        let loss = want["loss"].as_f64().unwrap();
        assert!(
            (got.loss.unwrap() as f64 - loss).abs() < 1e-5,
            "{name}: loss {:?} vs {loss}",
            got.loss
        );
        let grads = want["grads"].as_array().unwrap();
        assert_eq!(grads.len(), tensors.len(), "{name}");
        for ((t, g), w) in tensors.iter().zip(&got.grads).zip(grads) {
            let (Some(g), Some(w)) = (g, w.as_array()) else {
                assert!(
                    g.is_none() && w.is_null(),
                    "{name}: {} has a gradient in one only",
                    t.name
                );
                continue;
            };
            let weighted: f64 = g
                .iter()
                .enumerate()
                .map(|(j, v)| *v as f64 * (0.5 * j as f64).cos())
                .sum();
            let sums = [
                g.iter().map(|v| *v as f64).sum::<f64>(),
                g.iter().map(|v| v.abs() as f64).sum(),
                weighted,
            ];
            for (k, (a, b)) in sums.iter().zip(w).enumerate() {
                let b = b.as_f64().unwrap();
                assert!(
                    (a - b).abs() < 1e-5 + 1e-4 * b.abs(),
                    "{name}: {} sum {k}: {a} vs {b}",
                    t.name
                );
            }
        }
    }
}

fn small_mlp(layers: u32, dtype: Dtype) -> crate::kinds::MlpShape {
    crate::kinds::MlpShape {
        layers,
        width: 6,
        input_dim: 5,
        classes: 4,
        dtype,
    }
}

fn features(batch: u64, m: &crate::kinds::MlpShape) -> BatchValues {
    BatchValues {
        inputs: (0..batch * m.input_dim)
            .map(|k| (0.23 * k as f32).cos())
            .collect(),
        input_shape: vec![batch, m.input_dim],
        targets: (0..batch).map(|b| ((3 * b) % m.classes) as f32).collect(),
    }
}

fn mlp_params(m: &crate::kinds::MlpShape) -> Vec<NamedTensor> {
    crate::ModelSpec::mlp(m.layers, m.width, m.input_dim, m.classes, m.dtype).parameters()
}

#[test]
fn an_mlp_program_computes_its_gradients_whatever_the_technique() {
    for layers in [1, 3, 4] {
        let m = small_mlp(layers, Dtype::Float32);
        let tensors = mlp_params(&m);
        let batch = features(7, &m);
        let params = values(&tensors);
        let plain = whole(
            &step::mlp_program(&m, 7, Options::default()),
            &params,
            &batch,
        );
        let loss = plain.loss.unwrap();
        for checkpointing in [false, true] {
            let program = step::mlp_program(&m, 7, options(Attention::Eager, checkpointing, None));
            let got = whole(&program, &params, &batch);
            assert_eq!(got.loss, Some(loss), "{layers} {checkpointing}");
            assert_eq!(got.grads, plain.grads, "{layers} {checkpointing}");
            check_gradients(&program, &tensors, &batch, 1e-3);
        }
        let no_grad = step::mlp_no_grad_program(&m, 7, Options::default());
        assert_eq!(whole(&no_grad, &params, &batch).loss, Some(loss));
        for amp in [Dtype::Float16, Dtype::Bfloat16] {
            let program = step::mlp_program(&m, 7, options(Attention::Eager, false, Some(amp)));
            let low = whole(&program, &params, &batch).loss.unwrap();
            assert!(
                low != loss && (low - loss).abs() < 0.02,
                "{amp:?}: {low} vs {loss}"
            );
        }
    }
}

/// A program written for memory alone (a Hugging Face step's) has no
/// arithmetic to run: the interpreter refuses it, naming the op.
#[test]
fn a_program_for_memory_alone_is_refused() {
    use crate::program::{Alloc, Holds, Sink};
    let mut program = Program::default();
    program.alloc(&Alloc::memory("mm", 4096, Holds::Activation, Some(0)));
    let batch = BatchValues {
        inputs: Vec::new(),
        input_shape: Vec::new(),
        targets: Vec::new(),
    };
    let inputs = Inputs {
        shapes: &[],
        params: &[],
        batch: &batch,
        state: &[],
    };
    let ran = run(
        &program,
        0..program.ops.len(),
        &inputs,
        &mut Values::default(),
    );
    let Err(Unrunnable(why)) = ran else {
        panic!("ran: {ran:?}")
    };
    assert!(
        why.contains("(mm, [4096])") && why.contains("memory alone"),
        "{why}"
    );
}
