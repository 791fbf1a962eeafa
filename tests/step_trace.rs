//! A training step's tensors against real PyTorch: the bytes a step adds
//! over what lived before it, at its peak, as `tests/reference/step_trace.py`
//! recorded PyTorch's own ops creating and freeing them (tensor lifetimes on
//! the CPU, each rounded to the caching allocator's 512-byte blocks).

use serde_json::{json, Value};
use vramlab_shared::engine::Engine;

const PYTORCH: &str = include_str!("reference/step_trace.json");

fn reference(kind: &str) -> Vec<Value> {
    let all: Value = serde_json::from_str(PYTORCH).unwrap();
    let steps = all["steps"].as_array().unwrap();
    steps
        .iter()
        .filter(|s| s["kind"] == kind)
        .cloned()
        .collect()
}

/// The peak of the second of two steps over what was allocated before it.
fn simulated_step_peak(engine: &mut Engine, train: &Value) -> u64 {
    let first = engine.run_line(&train.to_string());
    assert!(first.ok, "{:?}", first.error);
    let before = first.stats.allocated_bytes;
    let record = engine.run_line(&train.to_string());
    assert!(record.ok, "{:?}", record.error);
    record.stats.step_peak_allocated_bytes - before
}

#[test]
fn an_mlp_step_peaks_where_pytorchs_does() {
    let cases = reference("mlp");
    assert_eq!(cases.len(), 7);
    for case in &cases {
        mlp_step_peaks_where_pytorchs_does(case);
    }
}

/// One recorded MLP step, in float32 or under autocast.
fn mlp_step_peaks_where_pytorchs_does(case: &Value) {
    let mut engine = Engine::new_simulated();
    for line in [
        // The CPU trace has no cuBLAS workspaces (the simulator's own rule).
        json!({"cmd":"restart","cublas_workspace_config":":0:0"}),
        json!({"cmd":"model","name":"model","layers":case["layers"],"width":case["width"],"input_dim":case["input_dim"],"classes":case["classes"],"dtype":if case["half"] == true { "float16" } else { "float32" }}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data","on_device":true,"features":case["input_dim"],"classes":case["classes"]}),
    ] {
        assert!(engine.run_line(&line.to_string()).ok, "{line}");
    }
    // The recorded autocast type (`"float16"`), or none.
    let amp = if case["amp"].is_string() {
        case["amp"].clone()
    } else {
        json!(false)
    };
    let accumulate = case["accumulate"].as_u64().unwrap_or(1);
    let batch = case["batch"].as_u64().unwrap() * accumulate;
    let checkpointing = case["checkpointing"] == true;
    let train = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":batch,"amp":amp,"checkpointing":checkpointing,"accumulate":accumulate});
    let peak = simulated_step_peak(&mut engine, &train);
    assert_eq!(peak, case["peak_bytes"].as_u64().unwrap(), "{case}");
}
