//! Every name, shape and count against what PyTorch reports for the same
//! modules (`tests/reference/param_counts.json`, written by
//! `tests/reference/param_counts.py`).

use super::*;
use crate::spec::ModelSpec;
use serde_json::Value;

const PYTORCH: &str = include_str!("../../../../tests/reference/param_counts.json");

fn models(kind: &str) -> Vec<Value> {
    let all: Value = serde_json::from_str(PYTORCH).unwrap();
    let models = all["models"].as_array().unwrap();
    models
        .iter()
        .filter(|m| m["kind"] == kind)
        .cloned()
        .collect()
}

fn u(m: &Value, key: &str) -> u64 {
    m[key].as_u64().unwrap_or_else(|| panic!("{key} in {m}"))
}

/// PyTorch's `[name, shape]` pairs.
fn named(list: &Value) -> Vec<(String, Vec<u64>)> {
    serde_json::from_value(list.clone()).unwrap()
}

fn ours(tensors: &[NamedTensor]) -> Vec<(String, Vec<u64>)> {
    tensors
        .iter()
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect()
}

#[test]
fn mlp_parameters_are_pytorchs() {
    let cases = models("mlp");
    assert_eq!(cases.len(), 2);
    for m in cases {
        let spec = ModelSpec::mlp(
            u(&m, "layers") as u32,
            u(&m, "width"),
            u(&m, "input_dim"),
            u(&m, "classes"),
            Dtype::Float32,
        );
        assert_eq!(spec.param_shapes(), named(&m["parameters"]), "{m}");
        assert_eq!(spec.param_count(), u(&m, "count"));
    }
}

#[test]
fn cnn_parameters_and_buffers_are_pytorchs() {
    let cases = models("cnn");
    assert_eq!(cases.len(), 3);
    for m in cases {
        let shape = CnnShape {
            channels: u(&m, "channels"),
            image_size: u(&m, "image_size"),
            blocks: u(&m, "blocks") as u32,
            width: u(&m, "width"),
            classes: u(&m, "classes"),
        };
        shape.validate().unwrap();
        let params = shape.parameters(Dtype::Float32);
        assert_eq!(ours(&params), named(&m["parameters"]), "{m}");
        assert_eq!(count(&params), u(&m, "count"));
        let buffers: Vec<(String, Vec<u64>, String)> =
            serde_json::from_value(m["buffers"].clone()).unwrap();
        let expected: Vec<_> = shape
            .buffers()
            .into_iter()
            .map(|b| {
                let dtype = if b.dtype == Dtype::Int64 {
                    "int64"
                } else {
                    "float32"
                };
                (b.name, b.shape, dtype.to_string())
            })
            .collect();
        assert_eq!(expected, buffers);
    }
}

#[test]
fn transformer_parameters_are_pytorchs() {
    let cases = models("transformer");
    assert_eq!(cases.len(), 5);
    for m in cases {
        let shape = TransformerShape {
            layers: u(&m, "layers") as u32,
            width: u(&m, "width"),
            heads: u(&m, "heads"),
            seq_len: u(&m, "seq_len"),
            vocab: u(&m, "vocab"),
            mlp_ratio: u(&m, "mlp_ratio"),
            norm: if m["norm"] == "rmsnorm" {
                Norm::RmsNorm
            } else {
                Norm::LayerNorm
            },
            tied: m["tied"] == true,
            lora_rank: m["lora_rank"].as_u64().unwrap_or(0),
        };
        shape.validate().unwrap();
        let params = shape.parameters(Dtype::Float32);
        assert_eq!(ours(&params), named(&m["parameters"]), "{m}");
        assert_eq!(count(&params), u(&m, "count"));
        let trained: Vec<NamedTensor> = params.into_iter().filter(|p| !p.frozen).collect();
        assert_eq!(count(&trained), u(&m, "trainable"), "{m}");
        assert_eq!(m["buffers"], serde_json::json!([]));
    }
}

#[test]
fn gpt2_small_has_its_124m_parameters() {
    let gpt2 = TransformerShape {
        layers: 12,
        width: 768,
        heads: 12,
        seq_len: 1024,
        vocab: 50257,
        mlp_ratio: 4,
        norm: Norm::LayerNorm,
        tied: true,
        lora_rank: 0,
    };
    assert_eq!(count(&gpt2.parameters(Dtype::Float32)), 124_439_808);
}

#[test]
fn shapes_that_cannot_be_built_say_why() {
    let cnn = CnnShape {
        channels: 3,
        image_size: 16,
        blocks: 5,
        width: 32,
        classes: 10,
    };
    assert_eq!(
        cnn.validate().unwrap_err().0,
        "5 blocks halve a 16-pixel image to nothing: use fewer blocks or larger images"
    );
    let t = TransformerShape {
        layers: 2,
        width: 100,
        heads: 3,
        seq_len: 64,
        vocab: 100,
        mlp_ratio: 4,
        norm: Norm::RmsNorm,
        tied: false,
        lora_rank: 0,
    };
    assert_eq!(
        t.validate().unwrap_err().0,
        "heads must divide width: 3 heads cannot share 100 dimensions"
    );
    let t = TransformerShape {
        layers: 0,
        heads: 4,
        ..t
    };
    assert_eq!(
        t.validate().unwrap_err().0,
        "layers must be 1 to 1024, not 0"
    );
}

/// The closed-form activations are exactly what the step's program holds
/// when backward starts, for every option and both norms.
#[test]
fn closed_form_activations_equal_the_programs() {
    use super::estimate::{cnn_saved, transformer_saved, walk};
    use super::step::{cnn_program, program, Options};
    for (layers, width, heads, seq_len, vocab, norm, lora_rank) in [
        (2, 128, 4, 256, 1000, Norm::LayerNorm, 0),
        (3, 96, 3, 100, 777, Norm::RmsNorm, 0),
        (12, 768, 12, 1024, 50257, Norm::LayerNorm, 0),
        (2, 128, 4, 256, 1000, Norm::LayerNorm, 8),
        (3, 96, 3, 100, 777, Norm::RmsNorm, 3),
        (12, 768, 12, 1024, 50257, Norm::LayerNorm, 16),
    ] {
        let t = TransformerShape {
            layers,
            width,
            heads,
            seq_len,
            vocab,
            mlp_ratio: 4,
            norm,
            tied: norm == Norm::LayerNorm,
            lora_rank,
        };
        let amps = [None, Some(Dtype::Float16), Some(Dtype::Bfloat16)];
        for (attention, checkpointing, &amp) in super::step::every_option(&amps) {
            let options = Options {
                attention,
                checkpointing,
                amp,
                ..Options::default()
            };
            {
                for batch in [1, 3, 8] {
                    let (saved, _) = transformer_saved(&t, batch, options);
                    let w = walk(&program(&t, batch, options), false, &Default::default());
                    assert_eq!(saved, w.saved, "{t:?} {options:?} batch {batch}");
                }
            }
        }
    }
    for (layers, width) in [(1, 64), (2, 128), (3, 100), (4, 128), (9, 64), (16, 1024)] {
        for dtype in [Dtype::Float32, Dtype::Float16] {
            let m = super::MlpShape {
                layers,
                width,
                input_dim: 784,
                classes: 10,
                dtype,
            };
            for (checkpointing, amp) in [false, true]
                .map(|ck| [(ck, None), (ck, Some(Dtype::Bfloat16))])
                .concat()
            {
                let options = Options {
                    checkpointing,
                    amp,
                    ..Options::default()
                };
                let batch = 32;
                let w = walk(
                    &super::step::mlp_program(&m, batch, options),
                    false,
                    &Default::default(),
                );
                let saved = super::estimate::mlp_saved(&m, batch, options);
                assert_eq!(saved, w.saved, "{m:?} {options:?}");
            }
        }
    }
    for (channels, image_size, blocks, width) in [(3, 32, 3, 32), (1, 28, 2, 8), (3, 224, 5, 64)] {
        let c = CnnShape {
            channels,
            image_size,
            blocks,
            width,
            classes: 10,
        };
        for batch in [1, 16] {
            for (checkpointing, amp) in [false, true]
                .map(|ck| [(ck, None), (ck, Some(Dtype::Float16))])
                .concat()
            {
                let options = Options {
                    attention: Attention::Eager,
                    checkpointing,
                    amp,
                    ..Options::default()
                };
                let w = walk(&cnn_program(&c, batch, options), false, &Default::default());
                assert_eq!(
                    cnn_saved(&c, batch, options),
                    w.saved,
                    "{c:?} batch {batch} {options:?}"
                );
            }
        }
    }
}
