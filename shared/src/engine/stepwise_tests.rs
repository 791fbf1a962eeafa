//! A step one statement at a time, for every kind: the same allocations
//! as a training loop's step, and `retain_graph`, a second backward and
//! `del loss` as PyTorch has them.

use super::kinds_tests::{cnn, engine, gpt, run, with};
use super::*;
use crate::stats::EventAction;
use serde_json::{json, Value};

/// Every case the step programs model: each attention, checkpointing and
/// autocast, LoRA, and the CNN.
fn cases() -> Vec<((Value, u64, u64), Value)> {
    let mut cases = Vec::new();
    let t = gpt(2, 64, 4, 32, 100);
    for attention in ["eager", "sdpa"] {
        for checkpointing in [false, true] {
            for amp in [false, true] {
                let technique =
                    json!({"attention":attention,"checkpointing":checkpointing,"amp":amp});
                cases.push((t.clone(), technique));
            }
        }
    }
    let lora = (with(t.0.clone(), &json!({"lora_rank": 4})), t.1, t.2);
    for technique in [json!({}), json!({"checkpointing":true,"amp":"bfloat16"})] {
        cases.push((lora.clone(), technique));
    }
    let tied = (
        with(t.0.clone(), &json!({"tied": false, "norm": "rmsnorm"})),
        t.1,
        t.2,
    );
    cases.push((tied, json!({})));
    for checkpointing in [false, true] {
        for amp in [false, true] {
            let technique = json!({"checkpointing":checkpointing,"amp":amp});
            cases.push((mlp(5, "float32"), technique.clone()));
            cases.push((cnn(16, 2, 8), technique));
        }
    }
    cases.push((mlp(3, "float16"), json!({"checkpointing":true})));
    cases
}

/// An MLP of `layers` hidden layers of 32 on 20 features, 6 classes.
pub(super) fn mlp(layers: u32, dtype: &str) -> (Value, u64, u64) {
    let model = json!({"layers":layers,"width":32,"input_dim":20,"classes":6,"dtype":dtype});
    (model, 20, 6)
}

/// The allocations' sizes in order, and the peak of live bytes, leaving
/// out the batch (`x`, `y`: a loop's names hold it, a statement's graph
/// lets go of it where its node is done).
fn trace(e: &Engine) -> (Vec<u64>, u64) {
    let mut batch = Vec::new();
    let (mut sizes, mut live, mut peak) = (Vec::new(), 0i64, 0i64);
    for ev in e.process.events() {
        let name = ev.name.as_deref().unwrap_or("");
        let is_batch = ["x", "y", "loss.x", "loss.y"].contains(&name);
        match ev.action {
            EventAction::Alloc if is_batch => batch.push(ev.address),
            EventAction::Alloc => {
                sizes.push(ev.size);
                live += ev.size as i64;
            }
            EventAction::Free if batch.contains(&ev.address) => {
                batch.retain(|&a| a != ev.address);
            }
            EventAction::Free => live -= ev.size as i64,
            _ => {}
        }
        peak = peak.max(live);
    }
    (sizes, peak as u64)
}

#[test]
fn forward_backward_step_and_zero_grad_allocate_what_one_training_step_does() {
    for ((model, features, classes), technique) in cases() {
        let common = json!({"model":"model","data":"data","batch_size":4});
        let mut looped = engine(model.clone(), "adam", features, classes);
        let train = with(json!({"cmd":"train","optimizer":"opt","steps":1}), &common);
        let r = run(&mut looped, &with(train, &technique));
        assert!(r.ok, "{model} {technique}: {:?}", r.error);

        let mut stepped = engine(model.clone(), "adam", features, classes);
        let forward = with(json!({"cmd":"forward","name":"loss"}), &common);
        for line in [
            with(forward, &technique),
            json!({"cmd":"backward","name":"loss"}),
            json!({"cmd":"step","optimizer":"opt"}),
            json!({"cmd":"zero_grad","optimizer":"opt","set_to_none":true}),
        ] {
            let r = run(&mut stepped, &line);
            assert!(r.ok, "{model} {technique} {line}: {:?}", r.error);
        }
        let (ours, theirs) = (trace(&stepped), trace(&looped));
        assert_eq!(ours.0, theirs.0, "{model} {technique}: allocations differ");
        assert_eq!(ours.1, theirs.1, "{model} {technique}: peaks differ");
        assert!(ours.1 > 0);
    }
}

/// Allocated bytes after each line, from a fresh engine.
fn allocated_after(model: &(Value, u64, u64), lines: &[Value]) -> Vec<u64> {
    let mut e = engine(model.0.clone(), "adam", model.1, model.2);
    lines
        .iter()
        .map(|line| {
            let r = run(&mut e, line);
            assert!(r.ok, "{line}: {:?}", r.error);
            r.stats.allocated_bytes
        })
        .collect()
}

#[test]
fn retain_graph_keeps_the_saved_tensors_for_a_second_backward_and_a_third_is_refused() {
    for model in [gpt(1, 32, 2, 16, 64), cnn(16, 2, 8)] {
        let forward =
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":4});
        let backward = json!({"cmd":"backward","name":"loss"});
        let retained = json!({"cmd":"backward","name":"loss","retain_graph":true});
        let once = allocated_after(&model, &[forward.clone(), backward.clone()]);
        let twice = allocated_after(&model, &[forward.clone(), retained, backward.clone()]);
        // After a retained backward the saved tensors are all still there,
        // and the gradients too.
        assert!(twice[1] > once[1], "{}: {twice:?} vs {once:?}", model.0);
        // The second backward adds into .grad and lets go of the graph:
        // the same memory as one backward.
        assert_eq!(twice[2], once[1], "{}", model.0);

        // A retained backward lets go of nothing the graph saved.
        let mut e = engine(model.0.clone(), "adam", model.1, model.2);
        assert!(run(&mut e, &forward).ok);
        let saved = |e: &Engine| {
            let loss = e.process.runtime.lookup("loss").unwrap();
            let graph = crate::train::autograd::find_graph(&e.process, loss).unwrap();
            e.process.runtime.get(graph).unwrap().refs.clone()
        };
        let before = saved(&e);
        assert!(before.len() > 2, "{}: {before:?}", model.0);
        let retained = json!({"cmd":"backward","name":"loss","retain_graph":true});
        assert!(run(&mut e, &retained).ok);
        assert_eq!(saved(&e), before, "{}", model.0);
        assert!(run(&mut e, &backward).ok);
        // What is left is the parameters, which autograd's nodes hold.
        let params = e.train.models.values().next().unwrap().params.len();
        assert_eq!(saved(&e).len(), params, "{}", model.0);
        let r = run(&mut e, &backward);
        let error = r.error.expect("a second backward through a freed graph");
        assert!(error
            .message
            .contains("backward through the graph a second time"));
    }
}

#[test]
fn the_loss_holds_the_saved_tensors_and_del_frees_them() {
    for model in [gpt(1, 32, 2, 16, 64), cnn(16, 2, 8)] {
        let forward =
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":4});
        let after = allocated_after(
            &model,
            &[
                json!({"cmd":"reset_peak_memory_stats"}),
                forward.clone(),
                json!({"cmd":"del","name":"loss"}),
                json!({"cmd":"clear_cublas_workspaces"}),
                forward,
            ],
        );
        // Everything the forward pass made dies with the loss (the cuBLAS
        // workspace its first matrix product made stays until cleared).
        assert!(after[1] > after[2], "{}: {after:?}", model.0);
        assert_eq!(after[3], after[0], "{}: {after:?}", model.0);
        assert_eq!(after[4], after[1], "{}", model.0);
    }
}

/// Under `torch.no_grad()` a forward statement leaves the loss alone (no
/// graph: backward is refused with PyTorch's message), and peaks lower
/// than the same statement recording its graph.
#[test]
fn under_no_grad_a_forward_keeps_nothing_and_cannot_backward() {
    for model in [gpt(2, 64, 4, 32, 100), cnn(16, 2, 8)] {
        for technique in [json!({}), json!({"amp":"float16","checkpointing":true})] {
            let forward = with(
                json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":4}),
                &technique,
            );
            let no_grad = with(forward.clone(), &json!({"no_grad": true}));
            let mut e = engine(model.0.clone(), "adam", model.1, model.2);
            let before = run(&mut e, &json!({"cmd":"clear_cublas_workspaces"}));
            let r = run(&mut e, &no_grad);
            assert!(r.ok, "{}: {:?}", model.0, r.error);
            // The loss (one 512-byte block) is all that is left: PyTorch
            // 2.15's matrix products free their workspaces as they return.
            let left = r.stats.allocated_bytes - before.stats.allocated_bytes;
            assert_eq!(left, 512, "{} {technique}", model.0);
            let r = run(&mut e, &json!({"cmd":"backward","name":"loss"}));
            let error = r.error.expect("no graph to backward through");
            assert!(
                error.message.contains("does not require grad"),
                "{}",
                error.message
            );

            let mut recorded = engine(model.0.clone(), "adam", model.1, model.2);
            let r = run(&mut recorded, &forward);
            assert!(r.ok);
            let inference = run(&mut e, &no_grad).stats.step_peak_allocated_bytes;
            assert!(inference < r.stats.step_peak_allocated_bytes, "{}", model.0);
        }
    }
}

/// `del model` between `forward` and `backward`: the graph holds the
/// parameters (as autograd's nodes do), so backward still runs and fills
/// their `.grad`; the memory goes when the loss goes.
#[test]
fn the_graph_keeps_the_parameters_of_a_deleted_model() {
    for model in [gpt(1, 32, 2, 16, 64), cnn(16, 2, 8)] {
        let mut e = engine(model.0.clone(), "sgd", model.1, model.2);
        let lines = [
            json!({"cmd":"del","name":"opt"}),
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":4}),
            json!({"cmd":"del","name":"model"}),
        ];
        for line in &lines {
            assert!(run(&mut e, line).ok, "{line}");
        }
        let held = run(&mut e, &json!({"cmd":"gc"})).stats.allocated_bytes;
        let r = run(&mut e, &json!({"cmd":"backward","name":"loss"}));
        assert!(r.ok, "{}: {:?}", model.0, r.error);
        let r = run(&mut e, &json!({"cmd":"del","name":"loss"}));
        assert!(r.ok);
        // The parameters, their gradients and the saved tensors are gone
        // (and PyTorch 2.15 keeps no cuBLAS workspace).
        assert_eq!(r.stats.allocated_bytes, 0, "{}: held {held}", model.0);
    }
}

/// The bytes `forward` says its graph saved are the bytes the last
/// backward frees (the gradients and the autograd thread's workspace made
/// by a retained backward before it).
#[test]
fn what_forward_says_it_saved_is_what_backward_frees() {
    for model in [gpt(2, 64, 4, 32, 100), cnn(16, 2, 8)] {
        let mut e = engine(model.0.clone(), "adam", model.1, model.2);
        let mut note = |line: Value| {
            let r = e.run_line(&line.to_string());
            assert!(r.ok, "{line}: {:?}", r.error);
            r.note.unwrap()
        };
        let said = note(
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":4}),
        );
        let saved = said
            .split("with it ")
            .nth(1)
            .and_then(|s| s.split(" of saved").next())
            .unwrap()
            .to_string();
        note(json!({"cmd":"backward","name":"loss","retain_graph":true}));
        let freed = note(json!({"cmd":"backward","name":"loss"}));
        assert!(
            freed.ends_with(&format!("(allocated fell by {saved}).")),
            "{}: {said} / {freed}",
            model.0
        );
    }
}

/// `loss = criterion(model(x), y)` on tensors the code made: the pass
/// reads them where they are (no copy), so it ends where the pass that
/// copies its batch in does; a view's base (rows of a set on the GPU)
/// serves too, and a tensor of another shape is refused.
#[test]
fn a_forward_reads_the_batch_the_code_made() {
    let model = json!({"cmd":"model","name":"model","kind":"mlp","layers":2,"width":256,"input_dim":128,"classes":10});
    let data = json!({"cmd":"data","name":"d","samples":64,"features":128,"classes":10});
    let copied = {
        let mut e = Engine::new_simulated();
        run(&mut e, &model);
        run(&mut e, &data);
        let before = run(&mut e, &json!({"cmd":"gc"})).stats;
        let r = run(
            &mut e,
            &json!({"cmd":"forward","name":"loss","model":"model","data":"d","batch_size":32}),
        );
        assert!(r.ok, "{:?}", r.error);
        r.stats.allocated_bytes - before.allocated_bytes
    };
    for rows in [32, 64] {
        let mut e = Engine::new_simulated();
        run(&mut e, &model);
        run(&mut e, &data);
        let before = run(&mut e, &json!({"cmd":"gc"})).stats;
        run(
            &mut e,
            &json!({"cmd":"alloc","name":"x","shape":[rows,128],"dtype":"float32"}),
        );
        run(
            &mut e,
            &json!({"cmd":"alloc","name":"y","shape":[rows],"dtype":"int64"}),
        );
        let made = run(&mut e, &json!({"cmd":"gc"})).stats.allocated_bytes;
        let given = json!({"cmd":"forward","name":"loss","model":"model","data":"d","batch_size":32,"batch":["x","y"]});
        let r = run(&mut e, &given);
        assert!(r.ok, "{:?}", r.error);
        if rows == 32 {
            assert_eq!(r.stats.allocated_bytes - before.allocated_bytes, copied);
        }
        // `del x, y`: the graph still holds them; backward lets them go.
        run(&mut e, &json!({"cmd":"del","name":"x"}));
        run(&mut e, &json!({"cmd":"del","name":"y"}));
        let held = run(&mut e, &json!({"cmd":"gc"})).stats.allocated_bytes;
        assert_eq!(held, r.stats.allocated_bytes);
        assert!(made > before.allocated_bytes);
    }
    let mut e = Engine::new_simulated();
    run(&mut e, &model);
    run(&mut e, &data);
    run(
        &mut e,
        &json!({"cmd":"alloc","name":"x","shape":[32,100],"dtype":"float32"}),
    );
    run(
        &mut e,
        &json!({"cmd":"alloc","name":"y","shape":[32],"dtype":"int64"}),
    );
    let r = run(
        &mut e,
        &json!({"cmd":"forward","name":"loss","model":"model","data":"d","batch_size":32,"batch":["x","y"]}),
    );
    let error = r.error.unwrap();
    assert_eq!(error.kind, ErrorKind::RuntimeError);
    assert!(
        error
            .message
            .contains("`x` is [32, 100] torch.float32, but the model reads [32, 128]"),
        "{}",
        error.message
    );
}
