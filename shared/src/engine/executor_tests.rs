//! A Keras step without XLA on the engine (`jit_compile: false`): what it
//! leaves (the variables, the optimizer's state, the loss; no gradient,
//! no batch) and its peak, the one [`crate::train::executor`] schedules.

use super::*;
use crate::train::executor::{peak, schedule, Value as Made};
use crate::train::{ModelSpec, OptimizerKind};
use crate::types::{Category, Dtype};
use serde_json::json;

/// TensorFlow's allocator rounds every request to 256 bytes.
fn bfc(bytes: u64) -> u64 {
    bytes.div_ceil(256) * 256
}

/// A model of 784 -> 2 x 256 -> 10 under TensorFlow with `kind`, trained
/// `steps` steps of 64 by TensorFlow's executor.
fn run(kind: &str, steps: u64) -> (Engine, crate::protocol::StepRecord, Stats) {
    let mut e = Engine::new_simulated();
    for line in [
        json!({"cmd":"restart","framework":"tensorflow"}),
        json!({"cmd":"model","name":"model","layers":2,"width":256}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":kind}),
        json!({"cmd":"data","name":"data","samples":1024,"features":784,"classes":10}),
    ] {
        assert!(e.run_line(&line.to_string()).ok, "{line}");
    }
    let before = e.stats();
    let train = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data",
        "steps":steps,"batch_size":64,"jit_compile":false});
    let r = e.run_line(&train.to_string());
    assert!(r.ok, "{:?}", r.error);
    e.check_invariants().unwrap();
    (e, r, before)
}

/// The schedule's peak with every value rounded as the allocator rounds
/// it.
fn scheduled_peak(kind: OptimizerKind) -> u64 {
    let spec = ModelSpec::mlp(2, 256, 784, 10, Dtype::Float32);
    let program = spec.step_program(64, Default::default());
    let trained: Vec<u64> = (spec.parameters().iter()).map(|t| t.numel() * 4).collect();
    let events = schedule(&program, &trained, kind);
    peak(&events, |v| match v {
        Made::Step(i) => bfc(program.allocs[i].bytes()),
        Made::Temp { scalar: true, .. } => 256,
        Made::Temp { param, .. } | Made::Copy(param) => bfc(trained[param]),
    })
}

#[test]
fn a_step_by_the_executor_leaves_no_gradient_and_no_batch() {
    let (e, r, before) = run("adam", 3);
    let c = e.process.categories();
    for category in [Category::Gradient, Category::Input, Category::Temporary] {
        assert_eq!(c[&category], 0, "{category:?}");
    }
    // Keras's moments, two per variable.
    let params: u64 = [784 * 256 + 256, 256 * 256 + 256, 256 * 10 + 10]
        .iter()
        .sum();
    assert_eq!(
        e.process.stats().requested_bytes,
        before.requested_bytes + 2 * 4 * params + 4
    );
    assert_eq!(r.value.unwrap()["steps"].as_array().unwrap().len(), 3);
}

/// The first step's peak over what lived before it is the schedule's own
/// peak over the batch copied in (the labels die with the loss), to the
/// allocator's chunks (the state is made before it).
#[test]
fn the_first_steps_peak_is_the_schedules() {
    for (kind, optimizer) in [
        ("sgd", OptimizerKind::Sgd),
        ("momentum", OptimizerKind::Momentum),
        ("adam", OptimizerKind::Adam),
    ] {
        let (_, r, before) = run(kind, 1);
        let state = before.allocated_bytes
            + match optimizer {
                OptimizerKind::Sgd => 0,
                OptimizerKind::Momentum => 1,
                _ => 2,
            } * [784 * 256 + 256, 256 * 256 + 256, 256 * 10 + 10]
                .iter()
                .map(|&n| bfc(4 * n))
                .sum::<u64>();
        let (x, y) = (bfc(64 * 784 * 4), bfc(64 * 8));
        let over = r.stats.step_peak_allocated_bytes - state;
        let scheduled = scheduled_peak(optimizer);
        assert!(
            over >= x + scheduled && over <= x + y + scheduled * 11 / 10,
            "{kind}: {over} over, scheduled {}",
            scheduled_peak(optimizer)
        );
    }
}

#[test]
fn jit_compile_off_is_kerass_alone() {
    for framework in ["pytorch", "jax"] {
        let mut e = Engine::new_simulated();
        for line in [
            json!({"cmd":"restart","framework":framework}),
            json!({"cmd":"model","name":"model","layers":1,"width":16}),
            json!({"cmd":"optimizer","name":"opt","model":"model","kind":"sgd"}),
            json!({"cmd":"data","name":"data","samples":64,"features":784,"classes":10}),
        ] {
            assert!(e.run_line(&line.to_string()).ok);
        }
        let train = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"jit_compile":false});
        let r = e.run_line(&train.to_string());
        let message = r.error.unwrap().message;
        assert_eq!(message, super::training::NO_EXECUTOR, "{framework}");
    }
}

/// Every kind, and its techniques, runs on the executor and ends holding
/// only its variables, their state and the loss.
#[test]
fn every_kind_runs_on_the_executor() {
    let models = [
        json!({"kind":"cnn","channels":3,"image_size":16,"blocks":2,"width":8,"classes":10}),
        json!({"kind":"transformer","layers":2,"width":32,"heads":4,"seq_len":16,"vocab":64}),
        json!({"kind":"transformer","layers":2,"width":32,"heads":4,"seq_len":16,"vocab":64,"lora_rank":4}),
    ];
    for model in models {
        for more in [json!({}), json!({"checkpointing": true, "amp": "bfloat16"})] {
            let mut e = Engine::new_simulated();
            let mut m = model.clone();
            m["cmd"] = json!("model");
            m["name"] = json!("model");
            let (features, classes) = match m["kind"].as_str() {
                Some("cnn") => (3 * 16 * 16, 10),
                _ => (16, 64),
            };
            for line in [
                json!({"cmd":"restart","framework":"tensorflow"}),
                m,
                json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
                json!({"cmd":"data","name":"data","samples":64,"features":features,"classes":classes}),
            ] {
                assert!(e.run_line(&line.to_string()).ok, "{line}");
            }
            let mut train = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data",
                "steps":2,"batch_size":4,"jit_compile":false});
            for (k, v) in more.as_object().unwrap() {
                train[k] = v.clone();
            }
            let r = e.run_line(&train.to_string());
            assert!(r.ok, "{model} {more}: {:?}", r.error);
            e.check_invariants().unwrap();
            let c = e.process.categories();
            for category in [Category::Gradient, Category::Input, Category::Temporary] {
                assert_eq!(c[&category], 0, "{model} {more}: {category:?}");
            }
        }
    }
}
