//! A step compiled by XLA on the engine: what it leaves (parameters and
//! state, the batch, the loss; no gradient), and its peak: the new
//! buffers and the temp of [`crate::train::xla`], or the temp alone when
//! donated.

use super::*;
use crate::protocol::StepRecord;
use crate::stats::Stats;
use crate::train::xla::{self, Compile};
use crate::train::{ModelSpec, OptimizerKind};
use crate::types::{Category, Dtype};
use serde_json::{json, Value};

/// JAX's allocator rounds every request to 256 bytes.
fn bfc(bytes: u64) -> u64 {
    bytes.div_ceil(256) * 256
}

/// The default MLP (784 -> 4 x 1024 -> 10) with Adam under `framework`,
/// then `train`: every record's stats (the train's last).
fn run(framework: &str, train: Value) -> (Engine, Vec<StepRecord>) {
    let mut e = Engine::new_simulated();
    let lines = [
        json!({"cmd":"restart","framework":framework}),
        json!({"cmd":"model","name":"model"}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data","samples":1024,"features":784,"classes":10}),
        train,
    ];
    let records = lines
        .iter()
        .map(|line| {
            let r = e.run_line(&line.to_string());
            e.check_invariants().unwrap();
            r
        })
        .collect();
    (e, records)
}

fn train(more: Value) -> Value {
    let mut t = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":64});
    for (k, v) in more.as_object().unwrap() {
        t[k] = v.clone();
    }
    t
}

/// The executable the engine plays for this step.
fn executable(donate: bool) -> xla::Executable {
    let spec = ModelSpec::mlp(4, 1024, 784, 10, Dtype::Float32);
    let program = spec.step_program(64, Default::default());
    let compile = Compile {
        optimizer: OptimizerKind::Adam,
        donate,
        alignment: 128,
    };
    xla::executable(&spec, &program, 64, compile)
}

fn params_bytes() -> u64 {
    let spec = ModelSpec::mlp(4, 1024, 784, 10, Dtype::Float32);
    spec.parameters().iter().map(|t| bfc(t.numel() * 4)).sum()
}

fn last(records: &[StepRecord]) -> &Stats {
    let r = records.last().unwrap();
    assert!(r.ok, "{:?}", r.error);
    &r.stats
}

#[test]
fn a_jitted_step_keeps_parameters_state_batch_and_loss_and_no_gradient() {
    let (e, records) = run("jax", train(json!({})));
    let stats = last(&records);
    let batch = bfc(64 * 784 * 4) + bfc(64 * 4);
    // Adam's two moments per parameter, the loss.
    assert_eq!(stats.allocated_bytes, 3 * params_bytes() + batch + 256);
    let categories = e.process.categories();
    assert_eq!(categories[&Category::Gradient], 0);
    assert_eq!(categories[&Category::Temporary], 0);
    assert_eq!(categories[&Category::OptimizerState], 2 * params_bytes());
}

/// Without donation the call holds the old and the new parameters and
/// state at once, and its temp; donated, the temp alone.
#[test]
fn a_jitted_steps_peak_is_its_new_buffers_and_temp() {
    let (_, records) = run("jax", train(json!({})));
    let stats = last(&records);
    let temp = bfc(executable(false).temp);
    assert!(temp > 0);
    assert_eq!(
        stats.step_peak_allocated_bytes - stats.allocated_bytes,
        2 * params_bytes() + params_bytes() + temp
    );
    let (_, records) = run("jax", train(json!({"donate": true})));
    let stats = last(&records);
    let temp = bfc(executable(true).temp);
    assert_eq!(
        stats.step_peak_allocated_bytes - stats.allocated_bytes,
        temp
    );
}

/// Keras's step under XLA writes its variables in place: no second copy.
#[test]
fn a_keras_step_compiled_by_xla_writes_its_variables_in_place() {
    let (e, records) = run("tensorflow", train(json!({"steps": 2})));
    let stats = last(&records);
    let temp = executable(true).temp;
    let over = stats.step_peak_allocated_bytes - stats.allocated_bytes;
    // TensorFlow's allocator rounds to 256 bytes too; the last step's
    // loss lives until the call returns the new one.
    assert_eq!(over, bfc(temp) + 256);
    assert_eq!(e.process.categories()[&Category::Gradient], 0);
}

/// The tensors that live after a step, by category: their count and the
/// bytes they asked for.
fn live(e: &Engine) -> std::collections::BTreeMap<Category, (u64, u64)> {
    let mut out = std::collections::BTreeMap::new();
    for &id in e.process.runtime.objects().keys() {
        if let Some(t) = e.process.runtime.tensor(id) {
            let (n, bytes) = out.entry(t.category).or_insert((0, 0));
            *n += 1;
            *bytes += t.bytes;
        }
    }
    out
}

/// What lives after a step is the same after the first and the third
/// (the allocator's chunks may differ: BFC hands out a whole chunk when
/// splitting it would leave less than the request).
#[test]
fn steps_after_the_first_hold_the_same_tensors() {
    let (one, _) = run("jax", train(json!({})));
    let (three, _) = run("jax", train(json!({"steps": 3})));
    assert_eq!(live(&one), live(&three));
    assert_eq!(live(&one)[&Category::OptimizerState].0, 2 * 10);
}

#[test]
fn what_xla_does_not_take_is_refused_with_a_reason() {
    let cases = [
        ("pytorch", json!({"donate": true}), "donate_argnums"),
        ("tensorflow", json!({"donate": true}), "in place"),
        ("jax", json!({"accumulate": 2}), "optax.MultiSteps"),
    ];
    for (framework, more, says) in cases {
        let (_, records) = run(framework, train(more));
        let r = records.last().unwrap();
        let message = &r.error.as_ref().unwrap().message;
        assert!(message.contains(says), "{framework}: {message}");
    }
}

/// The numbers are computed and the model learns, as under PyTorch.
#[test]
fn a_small_jitted_loop_learns() {
    let mut e = Engine::new_simulated();
    for line in [
        json!({"cmd":"restart","framework":"jax"}),
        json!({"cmd":"model","name":"model","layers":1,"width":32,"input_dim":16,"classes":4}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam","lr":0.01}),
        json!({"cmd":"data","name":"data","samples":256,"features":16,"classes":4}),
    ] {
        assert!(e.run_line(&line.to_string()).ok, "{line}");
    }
    let r = e.run_line(&train(json!({"steps": 40, "batch_size": 32, "donate": true})).to_string());
    assert!(r.ok, "{:?}", r.error);
    let value = r.value.unwrap();
    let (first, last) = (
        value["first_loss"].as_f64().unwrap(),
        value["last_loss"].as_f64().unwrap(),
    );
    assert!(last < first * 0.8, "{first} -> {last}");
}

/// `estimate` under JAX predicts the compiled step, not PyTorch's: no
/// gradients, no workspace, and the peak a step then reaches (to the
/// allocator's rounding and JAX's 32-bit labels), with and without
/// donation.
#[test]
fn estimate_predicts_the_compiled_steps_peak() {
    let estimate =
        json!({"cmd":"estimate","model":"model","optimizer":"opt","data":"data","batch_size":64});
    let (_, records) = run("jax", estimate);
    let value = records.last().unwrap().value.clone().unwrap();
    assert_eq!(value["gradient_bytes"], 0);
    assert_eq!(value["workspace_bytes"], 0);
    let predicted = value["peak_bytes"].as_u64().unwrap();
    let donated = value["donated_peak_bytes"].as_u64().unwrap();
    assert!(value["xla_temp_bytes"].as_u64().unwrap() > 0);
    for (more, predicted) in [(json!({}), predicted), (json!({"donate": true}), donated)] {
        let (_, records) = run("jax", train(more));
        let measured = last(&records).step_peak_allocated_bytes;
        let off = predicted as f64 / measured as f64 - 1.0;
        assert!(
            off.abs() < 0.01,
            "{predicted} predicted, {measured} measured"
        );
    }
}

/// The optimizer is named as each framework writes it.
#[test]
fn the_optimizer_is_named_in_the_frameworks_words() {
    for (framework, says) in [
        ("jax", "`opt` = optax.adam(0.001)"),
        ("tensorflow", "`opt` = tf.keras.optimizers.Adam(0.001)"),
        ("pytorch", "`opt` = torch.optim.Adam"),
    ] {
        let (_, records) = run(framework, train(json!({})));
        let note = records[2].note.as_deref().unwrap_or_default();
        assert!(note.starts_with(says), "{framework}: {note}");
    }
}

/// Each parameter is named as the framework's code reaches it.
#[test]
fn parameters_are_named_in_the_frameworks_words() {
    for (framework, first, last) in [
        ("pytorch", "model.0.weight", "model.8.bias"),
        ("jax", "model[0][0]", "model[4][1]"),
        (
            "tensorflow",
            "model.layers[0].kernel",
            "model.layers[4].bias",
        ),
    ] {
        let (e, _) = run(framework, train(json!({})));
        let model = e.process.runtime.lookup("model").unwrap();
        let params = &e.train.models[&model].params;
        let label = |id| e.process.runtime.get(id).unwrap().label.clone();
        assert_eq!(label(params[0]), first, "{framework}");
        assert_eq!(label(*params.last().unwrap()), last, "{framework}");
    }
}

/// Object ids past 2^32 (an hour of training at the step cap makes about
/// four billion): steps go on freeing what they made, in every framework.
#[test]
fn training_goes_on_past_four_billion_objects() {
    for framework in ["pytorch", "jax"] {
        let (mut e, _) = run(framework, train(json!({})));
        e.process.runtime.skip_ids(u64::from(u32::MAX) - 100);
        let before = live(&e);
        let r = e.run_line(&train(json!({"steps": 20})).to_string());
        assert!(r.ok, "{framework}: {:?}", r.error);
        e.check_invariants().unwrap();
        assert_eq!(live(&e), before, "{framework}");
        assert_eq!(
            e.process.categories()[&Category::Gradient],
            0,
            "{framework}"
        );
    }
}
