//! Event by event against PyTorch's own ops (`tests/reference/step_trace.json`,
//! recorded on the CPU: the fused kernel's names there end in `_for_cpu`).

use super::*;
use crate::train::kinds::Norm;
use serde_json::Value;

const PYTORCH: &str = include_str!("../../../../../tests/reference/step_trace.json");

/// The recorded transformer steps without checkpointing.
fn recorded() -> Vec<Value> {
    let all: Value = serde_json::from_str(PYTORCH).unwrap();
    let steps = all["steps"].as_array().unwrap();
    steps
        .iter()
        .filter(|s| s["kind"] == "transformer" && s["checkpointing"] == false)
        .cloned()
        .collect()
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
    }
}

/// `addmm.default` as `addmm`; the CPU's fused kernel by its CUDA name.
fn op(name: &str) -> String {
    let base = name.split('.').next().unwrap();
    base.replace("_for_cpu", "")
}

#[test]
fn eager_and_fused_steps_are_pytorchs_event_by_event() {
    let steps = recorded();
    assert_eq!(steps.len(), 2);
    for s in steps {
        let attention = if s["fused"] == true {
            Attention::Sdpa
        } else {
            Attention::Eager
        };
        let ours = events(&shape(&s), s["batch"].as_u64().unwrap(), attention);
        let theirs: Vec<(String, i64)> = s["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (op(e[0].as_str().unwrap()), e[1].as_i64().unwrap()))
            .collect();
        let ours: Vec<(String, i64)> = ours.iter().map(|e| (e.op.to_string(), e.bytes)).collect();
        assert_eq!(ours, theirs, "{attention:?}");
        assert_eq!(
            peak(&events(&shape(&s), s["batch"].as_u64().unwrap(), attention)),
            s["peak_bytes"].as_u64().unwrap()
        );
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
        };
        let batch = 4;
        let eager = peak(&events(&t, batch, Attention::Eager));
        let fused = peak(&events(&t, batch, Attention::Sdpa));
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
