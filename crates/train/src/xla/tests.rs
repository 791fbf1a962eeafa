//! Against XLA's own `compile().memory_analysis()` of the same steps
//! (`tests/reference/xla_step.json`, written by
//! `tests/reference/xla_step.py` on the CPU backend).

use super::*;
use crate::kinds::step::Options;
use crate::kinds::{CnnShape, Norm, TransformerShape};
use crate::spec::Kind;
use serde_json::Value as Json;

const XLA: &str = include_str!("../../../../tests/reference/xla_step.json");

fn u(row: &Json, key: &str) -> u64 {
    row[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in {row}"))
}

fn spec(row: &Json) -> ModelSpec {
    let kind = row["kind"].as_str().unwrap();
    match kind {
        "mlp" => ModelSpec::mlp(
            u(row, "layers") as u32,
            u(row, "width"),
            u(row, "input_dim"),
            u(row, "classes"),
            Dtype::Float32,
        ),
        "cnn" => ModelSpec::of(
            Kind::Cnn(CnnShape {
                channels: u(row, "channels"),
                image_size: u(row, "image_size"),
                blocks: u(row, "blocks") as u32,
                width: u(row, "width"),
                classes: u(row, "classes"),
            }),
            Dtype::Float32,
        ),
        _ => ModelSpec::of(
            Kind::Transformer(TransformerShape {
                layers: u(row, "layers") as u32,
                width: u(row, "width"),
                heads: u(row, "heads"),
                seq_len: u(row, "seq_len"),
                vocab: u(row, "vocab"),
                mlp_ratio: 4,
                norm: Norm::LayerNorm,
                tied: true,
                lora_rank: 0,
            }),
            Dtype::Float32,
        ),
    }
}

fn ours(row: &Json) -> Executable {
    let spec = spec(row);
    let batch = u(row, "batch");
    let options = Options {
        accumulate: 1,
        ..Default::default()
    };
    let program = spec.step_program(batch, options);
    let optimizer = match row["optimizer"].as_str().unwrap() {
        "adam" => OptimizerKind::Adam,
        "momentum" => OptimizerKind::Momentum,
        _ => OptimizerKind::Sgd,
    };
    let compile = Compile {
        optimizer,
        donate: row["donate"].as_bool().unwrap(),
        alignment: 64,
    };
    executable(&spec, &program, batch, compile)
}

fn rows() -> Vec<Json> {
    let all: Json = serde_json::from_str(XLA).unwrap();
    all["steps"].as_array().unwrap().clone()
}

#[test]
fn arguments_outputs_and_aliases_are_xlas() {
    for row in rows() {
        let e = ours(&row);
        assert_eq!(e.arguments, u(&row, "arguments"), "arguments of {row}");
        assert_eq!(e.outputs, u(&row, "outputs"), "outputs of {row}");
        assert_eq!(e.aliases, u(&row, "aliases"), "aliases of {row}");
    }
}

/// The step's new memory (outputs and temp) against XLA's, as a share
/// of XLA's: every MLP step within 12%, with and without donation, for
/// SGD, momentum and Adam. XLA's temp alone is not held to 10%: without donation it is
/// often the few bytes left over once the outputs host the activations,
/// and the order XLA's CPU scheduler picks moves it further.
#[test]
fn an_mlps_step_memory_is_xlas_within_12_percent() {
    for row in rows().iter().filter(|r| r["kind"] == "mlp") {
        let e = ours(row);
        let xla = u(row, "outputs") + u(row, "temp");
        let off = (e.outputs + e.temp) as f64 / xla as f64 - 1.0;
        assert!(off.abs() <= 0.12, "{off:+.3} for {row}");
    }
}

/// The CNN's and the transformer's temp stay below XLA's on the CPU,
/// which keeps what its GPU backend does not: max pooling's backward
/// (`select_and_scatter`) lowered to a scatter over four int32 index
/// arrays the size of the pooled input; the labels' gradient as a
/// scatter into a logits-sized buffer beside several more logits-sized
/// values. Ours is the step's own values: from a third to four fifths of
/// the CPU's.
#[test]
fn the_cnn_and_the_transformer_keep_what_a_gpu_keeps() {
    for row in rows().iter().filter(|r| r["kind"] != "mlp") {
        let share = ours(row).temp as f64 / u(row, "temp") as f64;
        assert!(
            (0.33..0.85).contains(&share),
            "{share:.2} of XLA's for {row}"
        );
    }
}

/// XLA's GPU backend on an H100 (`tests/golden/xla_step.json`, JAX 0.11):
/// arguments, outputs and aliases are its own, exactly. Its temp is larger
/// than ours: it holds the cuBLAS and cuDNN workspaces XLA's autotuner
/// picks for each matrix product and convolution (up to 32 MiB), which a
/// CPU compile has no use for and we do not count. So the step's new
/// memory (outputs and temp) is ours plus those: 5% to 8% under the GPU's
/// for the transformers, 11% to 15% for the CNNs, and for the MLPs, whose
/// products are all they compute, from 53% under to 18% over.
#[test]
fn on_a_gpu_the_step_is_xlas_but_for_the_autotuned_workspaces() {
    let all: Json =
        serde_json::from_str(include_str!("../../../../tests/golden/xla_step.json")).unwrap();
    assert_eq!(all["versions"]["backend"], "gpu");
    for row in all["steps"].as_array().unwrap() {
        let e = ours(row);
        assert_eq!(e.arguments, u(row, "arguments"), "arguments of {row}");
        assert_eq!(e.outputs, u(row, "outputs"), "outputs of {row}");
        assert_eq!(e.aliases, u(row, "aliases"), "aliases of {row}");
        let xla = u(row, "outputs") + u(row, "temp");
        let off = (e.outputs + e.temp) as f64 / xla as f64 - 1.0;
        let band = match row["kind"].as_str().unwrap() {
            "transformer" => -0.08..-0.05,
            "cnn" => -0.15..-0.11,
            _ => -0.53..0.19,
        };
        assert!(band.contains(&off), "{off:+.3} for {row}");
    }
}
