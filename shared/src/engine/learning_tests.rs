//! The CNN's and the transformer's steps compute on the CPU when small:
//! the loss falls over a training run, LoRA trains its adapters alone, and
//! `forward` + `backward` + `step` compute what `train` computes.

use super::kinds_tests::{engine, gpt, run, with};
use super::*;
use serde_json::{json, Value};

fn losses(value: &Value) -> Vec<f64> {
    value["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["loss"].as_f64().expect("a computed loss"))
        .collect()
}

/// The mean of the first and of the last five steps' losses.
fn ends(l: &[f64]) -> (f64, f64) {
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    (mean(&l[..5]), mean(&l[l.len() - 5..]))
}

fn train(e: &mut Engine, extra: Value) -> Vec<f64> {
    let line = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":30,"batch_size":8});
    let r = run(e, &with(line, &extra));
    assert!(r.ok, "{:?}", r.error);
    let value = r.value.unwrap();
    assert_eq!(value["loss_computed"], true, "{value}");
    losses(&value)
}

#[test]
fn a_small_transformer_learns_its_sequences() {
    let (model, features, classes) = gpt(1, 32, 2, 16, 64);
    let mut e = engine(model, "adam", features, classes);
    let l = train(&mut e, json!({}));
    let (first, last) = ends(&l);
    assert!(l[0] > 3.0, "{l:?}");
    assert!(last < 0.8 * first, "{first} -> {last}: {l:?}");
}

#[test]
fn a_small_cnn_learns_its_clusters() {
    let model =
        json!({"kind":"cnn","channels":3,"image_size":16,"blocks":2,"width":8,"classes":10});
    let mut e = engine(model, "adam", 3 * 16 * 16, 10);
    let l = train(&mut e, json!({}));
    let (first, last) = ends(&l);
    assert!(last < 0.8 * first, "{first} -> {last}: {l:?}");
}

/// Fused attention and checkpointing change memory, not the losses;
/// autocast changes them by its rounding only; gradient accumulation
/// learns too (the mean of the micro-batches' gradients).
#[test]
fn techniques_change_memory_not_the_losses() {
    let (model, features, classes) = gpt(1, 16, 2, 8, 32);
    let fresh = || engine(model.clone(), "adam", features, classes);
    let reference = train(&mut fresh(), json!({}));
    for (extra, tolerance) in [
        (json!({"attention":"sdpa"}), 1e-4),
        (json!({"checkpointing":true}), 1e-4),
        (json!({"amp":"bfloat16"}), 0.01),
    ] {
        let l = train(&mut fresh(), extra.clone());
        for (a, b) in l.iter().zip(&reference) {
            let close = (a - b).abs() < tolerance * b.abs();
            assert!(close, "{extra}: {l:?} vs {reference:?}");
        }
    }
    let l = train(
        &mut engine(model, "adam", features, classes),
        json!({"accumulate":2}),
    );
    assert!(ends(&l).1 < ends(&l).0, "{l:?}");
}

#[test]
fn lora_trains_the_adapters_alone() {
    let (mut model, features, classes) = gpt(1, 32, 2, 16, 64);
    model["lora_rank"] = json!(4);
    let mut e = engine(model, "adamw", features, classes);
    let m = e.train.models.values().next().unwrap().clone();
    let before = m.spec.parameters();
    let l = train(&mut e, json!({}));
    assert!(ends(&l).1 < ends(&l).0, "{l:?}");
    let state = e.train.models.values().next().unwrap();
    let first = crate::train::init::initial_values(&before, m.seed);
    for ((t, now), was) in before
        .iter()
        .zip(state.values.as_ref().unwrap())
        .zip(&first)
    {
        assert_eq!(t.frozen, now == was, "{}", t.name);
    }
}

/// `forward`, `backward`, `opt.step()`, `zero_grad` one at a time give
/// the losses a `train` loop gives.
#[test]
fn statements_compute_what_train_computes() {
    let (transformer, features, classes) = gpt(1, 16, 2, 8, 32);
    let mut lora = transformer.clone();
    lora["lora_rank"] = json!(2);
    let cnn = json!({"kind":"cnn","channels":2,"image_size":8,"blocks":2,"width":4,"classes":5});
    for (model, features, classes) in [
        (transformer, features, classes),
        (lora, features, classes),
        (cnn, 2 * 8 * 8, 5),
    ] {
        let looped = train(
            &mut engine(model.clone(), "adam", features, classes),
            json!({}),
        );
        let mut e = engine(model.clone(), "adam", features, classes);
        for (s, want) in looped.iter().take(3).enumerate() {
            let forward =
                json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":8});
            let got = run(&mut e, &forward).value.unwrap()["loss"]
                .as_f64()
                .unwrap();
            assert!(
                (got - want).abs() < 1e-6,
                "{model}: step {s}: {got} vs {want}"
            );
            for line in [
                json!({"cmd":"backward","name":"loss"}),
                json!({"cmd":"step","optimizer":"opt"}),
                json!({"cmd":"zero_grad","optimizer":"opt"}),
            ] {
                assert!(run(&mut e, &line).ok, "{line}");
            }
        }
    }
}

/// `backward(retain_graph=True)` keeps the forward's values: a second
/// backward adds the same gradients again, as `.grad` accumulates.
#[test]
fn a_retained_graph_backpropagates_twice() {
    let (model, features, classes) = gpt(1, 16, 2, 8, 32);
    let grads = |backwards: &[bool]| {
        let mut e = engine(model.clone(), "adam", features, classes);
        let forward =
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":8});
        assert!(run(&mut e, &forward).ok);
        for &retain in backwards {
            let line = json!({"cmd":"backward","name":"loss","retain_graph": retain});
            assert!(run(&mut e, &line).ok, "{line}");
        }
        let grads = e.train.models.values().next().unwrap().grad_values.clone();
        grads
    };
    let (once, twice) = (grads(&[false]), grads(&[true, false]));
    for (a, b) in once.iter().zip(&twice) {
        for (x, y) in a.as_ref().unwrap().iter().zip(b.as_ref().unwrap()) {
            assert!(
                (2.0 * x - y).abs() <= 1e-6 * x.abs().max(1.0),
                "{x} twice is not {y}"
            );
        }
    }
}

/// A long `train` keeps no dead step's state: each step's graph is
/// forgotten as it dies, so a step's work does not grow with the steps
/// before it (it grew quadratically while every graph waited for the end).
#[test]
fn a_long_run_forgets_each_steps_graph() {
    let mut e = Engine::new_simulated();
    for line in [
        json!({"cmd":"model","name":"model","layers":2,"width":64,"input_dim":32}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data","features":32}),
    ] {
        assert!(run(&mut e, &line).ok, "{line}");
    }
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = most.clone();
    e.set_progress_hook(Some(Box::new(move |e: &mut Engine, _: &Progress| {
        seen.fetch_max(e.train.graphs.len(), std::sync::atomic::Ordering::Relaxed);
        true
    })));
    let line = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":500,"batch_size":8});
    assert!(run(&mut e, &line).ok);
    let most = most.load(std::sync::atomic::Ordering::Relaxed);
    assert!(most <= 1, "{most} graphs held at once");
}
