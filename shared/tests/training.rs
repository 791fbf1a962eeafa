//! What each training technique and each classic mistake does to the exact
//! numbers.

use serde_json::{json, Value};
use vramlab_shared::types::Category;
use vramlab_shared::units::{GIB, MIB};
use vramlab_shared::{Engine, StepRecord};

fn run(e: &mut Engine, cmd: Value) -> StepRecord {
    let r = e.run_line(&cmd.to_string());
    if let Err(m) = e.check_invariants() {
        panic!("after {cmd}: {m}");
    }
    r
}

fn ok(e: &mut Engine, cmd: Value) -> StepRecord {
    let r = run(e, cmd.clone());
    assert!(r.ok, "{cmd}: {:?}", r.error);
    r
}

/// A PyTorch kernel with `model`, `opt` and `data`.
/// `opt` is an optimizer's kind; `adam8` and the like its 8-bit state.
fn setup(model: Value, opt: &str, data: Value) -> Engine {
    let (kind, bits) = opt.strip_suffix('8').map_or((opt, 32), |kind| (kind, 8));
    let mut e = Engine::new_simulated();
    ok(
        &mut e,
        json!({"cmd":"restart","framework":"pytorch","device_total_bytes": 80 * GIB}),
    );
    let mut m = json!({"cmd":"model","name":"model"});
    m.as_object_mut()
        .unwrap()
        .extend(model.as_object().unwrap().clone());
    ok(&mut e, m);
    ok(
        &mut e,
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":kind,"bits":bits}),
    );
    let mut d = json!({"cmd":"data","name":"data"});
    d.as_object_mut()
        .unwrap()
        .extend(data.as_object().unwrap().clone());
    ok(&mut e, d);
    e
}

fn cat(r: &StepRecord, c: Category) -> u64 {
    r.stats.categories[&c]
}

/// Requested bytes of live tensors of a category.
fn requested(e: &Engine, c: Category) -> u64 {
    e.snapshot(0)
        .objects
        .iter()
        .filter(|o| o.category == Some(c))
        .map(|o| o.requested_bytes)
        .sum()
}

fn train(e: &mut Engine, extra: Value) -> StepRecord {
    let mut t = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2});
    t.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    ok(e, t)
}

fn step_peaks(r: &StepRecord) -> Vec<u64> {
    r.value.as_ref().unwrap()["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["peak_allocated_bytes"].as_u64().unwrap())
        .collect()
}

#[test]
fn activations_grow_in_proportion_to_batch_size() {
    let mut acts = Vec::new();
    for batch in [64u64, 128, 256] {
        let mut e = setup(json!({}), "sgd", json!({}));
        let r = ok(
            &mut e,
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":batch}),
        );
        // 4 saved ReLU outputs of batch x 1024 float32, log_softmax (batch x 10),
        // the loss and NLL's total_weight (512-byte blocks).
        let expected = 4 * batch * 1024 * 4 + (batch * 10 * 4).div_ceil(512) * 512 + 2 * 512;
        assert_eq!(cat(&r, Category::Activation), expected, "batch {batch}");
        assert_eq!(
            cat(&r, Category::Input),
            batch * 784 * 4 + (batch * 8).div_ceil(512) * 512
        );
        acts.push(4 * batch * 1024 * 4);
    }
    assert_eq!(acts[1], 2 * acts[0]);
    assert_eq!(acts[2], 2 * acts[1]);
}

#[test]
fn no_grad_forward_keeps_no_activations() {
    let mut e = setup(json!({}), "sgd", json!({}));
    let r = ok(
        &mut e,
        json!({"cmd":"forward","name":"loss","model":"model","data":"data","no_grad":true}),
    );
    // Only the loss itself is left.
    assert_eq!(cat(&r, Category::Activation), 512);
    assert_eq!(cat(&r, Category::Input), 0);
    let r = run(&mut e, json!({"cmd":"backward","name":"loss"}));
    assert_eq!(
        r.error.unwrap().message,
        "element 0 of tensors does not require grad and does not have a grad_fn"
    );
}

#[test]
fn backward_frees_saved_tensors_and_a_second_backward_fails() {
    let mut e = setup(json!({}), "sgd", json!({}));
    ok(
        &mut e,
        json!({"cmd":"forward","name":"loss","model":"model","data":"data"}),
    );
    let r = ok(&mut e, json!({"cmd":"backward","name":"loss"}));
    assert_eq!(
        cat(&r, Category::Activation),
        512,
        "only the loss survives backward"
    );
    assert_eq!(cat(&r, Category::Input), 0);
    assert_eq!(
        requested(&e, Category::Gradient),
        requested(&e, Category::Parameter)
    );
    assert_eq!(cat(&r, Category::Temporary), 0);
    let r = run(&mut e, json!({"cmd":"backward","name":"loss"}));
    assert!(r
        .error
        .unwrap()
        .message
        .starts_with("Trying to backward through the graph a second time"));
    // retain_graph keeps them for a second pass.
    ok(
        &mut e,
        json!({"cmd":"forward","name":"loss2","model":"model","data":"data"}),
    );
    let r = ok(
        &mut e,
        json!({"cmd":"backward","name":"loss2","retain_graph":true}),
    );
    assert!(cat(&r, Category::Activation) > 4 * 64 * 1024 * 4);
    ok(&mut e, json!({"cmd":"backward","name":"loss2"}));
}

#[test]
fn optimizer_state_is_0_1_2_times_the_parameters() {
    for (kind, times) in [("sgd", 0), ("momentum", 1), ("adam", 2), ("adamw", 2)] {
        let mut e = setup(json!({}), kind, json!({}));
        ok(
            &mut e,
            json!({"cmd":"forward","name":"loss","model":"model","data":"data"}),
        );
        ok(&mut e, json!({"cmd":"backward","name":"loss"}));
        let before = requested(&e, Category::OptimizerState);
        assert_eq!(before, 0, "state is lazy");
        ok(&mut e, json!({"cmd":"step","optimizer":"opt"}));
        assert_eq!(
            requested(&e, Category::OptimizerState),
            times * requested(&e, Category::Parameter),
            "{kind}"
        );
        assert_eq!(
            requested(&e, Category::Temporary),
            0,
            "{kind}: temporaries died"
        );
    }
}

#[test]
fn set_to_none_frees_gradients_between_steps() {
    let mut e = setup(json!({}), "sgd", json!({}));
    let r = train(&mut e, json!({"set_to_none": true}));
    assert_eq!(cat(&r, Category::Gradient), 0);
    let r = train(&mut e, json!({"set_to_none": false}));
    assert_eq!(
        requested(&e, Category::Gradient),
        requested(&e, Category::Parameter)
    );
    assert!(cat(&r, Category::Gradient) >= cat(&r, Category::Parameter));
    let r = ok(
        &mut e,
        json!({"cmd":"zero_grad","optimizer":"opt","set_to_none":true}),
    );
    assert_eq!(cat(&r, Category::Gradient), 0);
}

#[test]
fn accumulating_four_micro_batches_of_256_peaks_like_batch_64() {
    // Activations dominate here, as they do when accumulation is the answer.
    let peak = |batch: u64, accumulate: u64| {
        let mut e = setup(json!({}), "sgd", json!({}));
        let r = train(
            &mut e,
            json!({"batch_size": batch, "accumulate": accumulate}),
        );
        *step_peaks(&r).iter().max().unwrap()
    };
    let small = peak(4096, 1);
    let big = peak(16384, 1);
    let accumulated = peak(16384, 4);
    assert!(
        big > 3 * small,
        "a 4x batch needs about 4x: {big} vs {small}"
    );
    // Micro-batches of 4096 hold the same activations; the gradients, kept
    // across micro-batches, come on top (16 MiB here).
    assert!(accumulated >= small, "{accumulated} {small}");
    assert!(
        accumulated as f64 <= 1.25 * small as f64,
        "{accumulated} vs {small}"
    );
}

#[test]
fn checkpointing_keeps_segment_boundaries_only() {
    let model = json!({"layers": 16, "width": 1024});
    let batch = 4096u64;
    let hidden = batch * 1024 * 4;
    let act = |checkpointing: bool| {
        let mut e = setup(model.clone(), "sgd", json!({}));
        let r = ok(
            &mut e,
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":batch,"checkpointing":checkpointing}),
        );
        let saved = cat(&r, Category::Activation);
        let r = ok(&mut e, json!({"cmd":"backward","name":"loss"}));
        (saved, r.stats.step_peak_allocated_bytes, e)
    };
    let (plain, plain_peak, _) = act(false);
    let (ckpt, ckpt_peak, _) = act(true);
    let rest = (batch * 10 * 4).div_ceil(512) * 512 + 2 * 512;
    // 16 hidden layers saved, against 7 under `checkpoint_sequential(model,
    // 4, x)`: its 33 modules in runs of 8, the first three checkpointed
    // (the second's and third's inputs held, the first's is the batch),
    // the last plain (its input, the 12th Linear's, and its 4 ReLU
    // outputs).
    assert_eq!(plain, 16 * hidden + rest);
    assert_eq!(ckpt, 7 * hidden + rest);
    assert!(ckpt_peak < plain_peak, "{ckpt_peak} < {plain_peak}");
}

#[test]
fn amp_saves_activations_in_half_precision() {
    let batch = 512u64;
    let saved = |amp: bool| {
        let mut e = setup(json!({}), "sgd", json!({}));
        ok(
            &mut e,
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":batch,"amp":amp}),
        );
        requested(&e, Category::Activation)
    };
    let fp32 = saved(false);
    let fp16 = saved(true);
    // float16 ReLU outputs (half of 4 x batch x 1024 x 4) and
    // log-probabilities (half of batch x 10 x 4); autocast adds the
    // input's cast, the casts of the weights after the first (the first
    // layer's input needs no gradient) and NLL's float32 copy.
    let halved = 4 * batch * 1024 * 2 + batch * 10 * 2;
    let casts = batch * 784 * 2 + (3 * 1024 * 1024 + 10 * 1024) * 2 + batch * 10 * 4;
    assert_eq!(fp16 + halved, fp32 + casts);
}

#[test]
fn an_on_device_dataset_costs_its_full_size() {
    let mut e = setup(json!({}), "sgd", json!({"on_device": true}));
    let stats = e.stats();
    let x = 60_000u64 * 784 * 4;
    let y = 60_000u64 * 8;
    assert_eq!(
        stats.categories[&Category::Input],
        x.div_ceil(2 * MIB) * 2 * MIB + y.div_ceil(512) * 512
    );
    // Batches are views of it: training adds no input copies.
    let r = train(&mut e, json!({}));
    assert_eq!(cat(&r, Category::Input), stats.categories[&Category::Input]);
}

/// `total_loss += loss` after `loss.backward()` keeps one scalar on the GPU
/// more than `total_loss += loss.item()`, and no more however long the loop
/// runs; `losses.append(loss)` one a step: what PyTorch's own loop keeps
/// (`tests/reference/loss_history.py`).
#[test]
fn loss_history_tensor_keeps_one_scalar_as_in_pytorch() {
    let recorded: Value =
        serde_json::from_str(include_str!("../../tests/reference/loss_history.json")).unwrap();
    let at = |history: &str, i: usize| {
        let r = &recorded[history][i];
        (r["tensors"].as_u64().unwrap(), r["bytes"].as_u64().unwrap())
    };
    let (more_tensors, more_bytes) = (
        at("tensor", 0).0 - at("item", 0).0,
        at("tensor", 0).1 - at("item", 0).1,
    );
    assert_eq!((more_tensors, more_bytes), (1, 512));
    assert_eq!(at("tensor", 1), at("tensor", 0));
    let model = json!({"layers": 2, "width": 128});
    let mut item = setup(model.clone(), "sgd", json!({}));
    let base = train(&mut item, json!({"steps": 100, "loss_history": "item"}));
    let mut tensor = setup(model, "sgd", json!({}));
    let kept = train(&mut tensor, json!({"steps": 100, "loss_history": "tensor"}));
    let grown = |r: &StepRecord| {
        (
            r.stats.allocations - base.stats.allocations,
            r.stats.allocated_bytes - base.stats.allocated_bytes,
        )
    };
    assert_eq!(grown(&kept), (more_tensors, more_bytes));
    let longer = train(&mut tensor, json!({"steps": 100, "loss_history": "tensor"}));
    assert_eq!(grown(&longer), (more_tensors, more_bytes));
    ok(&mut tensor, json!({"cmd":"del","name":"total_loss"}));
    let after = ok(&mut tensor, json!({"cmd":"gc"}));
    assert_eq!(grown(&after), (0, 0));
    // `losses.append(loss)` keeps every step's scalar: one a step, as in
    // PyTorch's loop; the previous loss is what the list holds, not a copy.
    let listed = train(&mut tensor, json!({"steps": 100, "loss_history": "list"}));
    let (tensors, bytes) = (
        at("list", 0).0 - at("item", 0).0,
        at("list", 0).1 - at("item", 0).1,
    );
    assert_eq!((tensors, bytes), (99, 99 * 512));
    assert_eq!(grown(&listed), (tensors, bytes));
    ok(&mut tensor, json!({"cmd":"del","name":"losses"}));
    assert_eq!(grown(&ok(&mut tensor, json!({"cmd":"gc"}))), (0, 0));
    // Under accumulation the list keeps each micro-batch's `loss / k`, k a
    // step: the criterion's own scalar dies at the division
    // (`DivBackward1` saves only the number).
    let mut accumulated = setup(json!({"layers": 2, "width": 128}), "sgd", json!({}));
    let list = json!({"steps": 1, "accumulate": 2, "batch_size": 64, "loss_history": "list"});
    let one = train(&mut accumulated, list.clone());
    let two = train(&mut accumulated, list);
    assert_eq!(two.stats.allocations - one.stats.allocations, 2);
    assert_eq!(
        two.stats.allocated_bytes - one.stats.allocated_bytes,
        2 * 512
    );
}

#[test]
fn keras_models_in_a_loop_grow_without_clear_session() {
    let build = |clear: bool| {
        let mut e = Engine::new_simulated();
        ok(
            &mut e,
            json!({"cmd":"restart","framework":"tensorflow","allow_growth":true}),
        );
        let mut allocated = Vec::new();
        let mut reserved = Vec::new();
        for _ in 0..4 {
            if clear {
                ok(&mut e, json!({"cmd":"clear_session"}));
            }
            let r = ok(
                &mut e,
                json!({"cmd":"model","name":"model","layers":2,"width":1024}),
            );
            // Bytes the tensors asked for (BFC chunks may carry slack).
            allocated.push(r.stats.requested_bytes);
            reserved.push(r.stats.reserved_bytes);
        }
        let r = ok(&mut e, json!({"cmd":"clear_session"}));
        (allocated, reserved, r)
    };
    let (grow, _, _) = build(false);
    assert!(grow.windows(2).all(|w| w[1] > w[0]), "{grow:?}");
    let (flat, pool, last) = build(true);
    assert!(flat.windows(2).all(|w| w[1] == w[0]), "{flat:?}");
    // The pool never shrinks, clear_session or not.
    assert!(pool.windows(2).all(|w| w[1] >= w[0]));
    assert_eq!(last.stats.reserved_bytes, *pool.last().unwrap());
    // Only the model still bound to `model` is left.
    assert_eq!(last.stats.requested_bytes, flat[0]);
}

#[test]
fn a_tf1_session_owns_its_variables_until_closed() {
    let mut e = Engine::new_simulated();
    ok(
        &mut e,
        json!({"cmd":"restart","framework":"tensorflow","allow_growth":true}),
    );
    ok(&mut e, json!({"cmd":"tf_session","name":"sess"}));
    let built = ok(
        &mut e,
        json!({"cmd":"model","name":"model","layers":2,"width":1024}),
    );
    ok(&mut e, json!({"cmd":"del","name":"model"}));
    assert_eq!(
        e.stats().allocated_bytes,
        built.stats.allocated_bytes,
        "the session holds them"
    );
    let closed = ok(&mut e, json!({"cmd":"close","name":"sess"}));
    // All but the GPU device's scratch buffer (1,280 bytes in the pool).
    assert_eq!(closed.stats.allocated_bytes, 1280);
    assert_eq!(closed.stats.reserved_bytes, built.stats.reserved_bytes);
}

#[test]
fn last_exception_keeps_the_failed_steps_tensors() {
    let mut e = Engine::new_simulated();
    ok(
        &mut e,
        json!({"cmd":"restart","framework":"pytorch","device_total_bytes": GIB}),
    );
    ok(
        &mut e,
        json!({"cmd":"model","name":"model","layers":4,"width":1024}),
    );
    ok(&mut e, json!({"cmd":"data","name":"data"}));
    let before = e.stats().allocated_bytes;
    let r = run(
        &mut e,
        json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":65536}),
    );
    let err = r.error.unwrap();
    assert!(
        err.message.starts_with("CUDA out of memory."),
        "{}",
        err.message
    );
    assert!(r.stats.allocated_bytes > before, "the frame's tensors stay");
    let snap = e.snapshot(0);
    let exc = snap
        .objects
        .iter()
        .find(|o| o.label == "last_exception")
        .unwrap();
    assert_eq!(exc.kind, "OutOfMemoryError");
    let r = ok(&mut e, json!({"cmd":"del","name":"last_exception"}));
    // All of it (PyTorch 2.15 keeps no cuBLAS workspace).
    assert_eq!(r.stats.allocated_bytes, before);
}

#[test]
fn the_estimate_matches_the_measured_peak_within_5_percent() {
    let cases = [
        (json!({}), "adam", 64u64, 1u64, false, false),
        (json!({}), "sgd", 64, 1, false, false),
        (json!({}), "adam8", 64, 1, false, false),
        (
            json!({"layers": 8, "width": 2048}),
            "momentum8",
            1024,
            1,
            false,
            false,
        ),
        (
            json!({"layers": 8, "width": 2048}),
            "momentum",
            1024,
            1,
            false,
            false,
        ),
        (
            json!({"layers": 4, "width": 1024}),
            "sgd",
            4096,
            1,
            false,
            false,
        ),
        (
            json!({"layers": 16, "width": 1024}),
            "sgd",
            2048,
            1,
            false,
            true,
        ),
        (
            json!({"layers": 4, "width": 4096}),
            "adamw",
            512,
            1,
            true,
            false,
        ),
        (
            json!({"layers": 4, "width": 1024}),
            "adam",
            2048,
            4,
            false,
            false,
        ),
    ];
    for (model, opt, batch, accumulate, amp, checkpointing) in cases {
        let mut e = setup(model.clone(), opt, json!({}));
        let est = ok(
            &mut e,
            json!({"cmd":"estimate","model":"model","optimizer":"opt","data":"data",
            "batch_size":batch,"accumulate":accumulate,"amp":amp,"checkpointing":checkpointing}),
        );
        let predicted = est.value.unwrap()["peak_bytes"].as_u64().unwrap() as f64;
        let r = train(
            &mut e,
            json!({"steps": 3, "batch_size": batch, "accumulate": accumulate, "amp": amp, "checkpointing": checkpointing}),
        );
        let measured = *step_peaks(&r).iter().max().unwrap() as f64;
        let error = (predicted - measured).abs() / measured;
        assert!(
            error < 0.05,
            "{model} {opt} batch {batch} x{accumulate} amp={amp} ckpt={checkpointing}: predicted {predicted}, measured {measured} ({:.1}%)",
            error * 100.0
        );
    }
}

#[test]
fn the_loss_falls_on_a_small_model_with_real_arithmetic() {
    let mut e = setup(
        json!({"layers": 2, "width": 64, "input_dim": 32, "classes": 4}),
        "adam",
        json!({"samples": 4096, "features": 32, "classes": 4}),
    );
    let r = train(&mut e, json!({"steps": 100, "batch_size": 32}));
    let v = r.value.unwrap();
    assert_eq!(v["loss_computed"], true);
    let first = v["first_loss"].as_f64().unwrap();
    let last = v["last_loss"].as_f64().unwrap();
    assert!(first > 1.0, "starts near ln(4): {first}");
    assert!(last < 0.5 * first, "{first} -> {last}");
    // The default model is too big to compute here: shape-only, said so.
    let mut big = setup(json!({}), "sgd", json!({}));
    let r = train(&mut big, json!({"steps": 1}));
    assert_eq!(r.value.unwrap()["loss_computed"], false);
    assert!(r.note.unwrap().contains("shape-only"));
}

#[test]
fn find_batch_size_picks_the_largest_batch_under_the_threshold() {
    let mut e = Engine::new_simulated();
    ok(
        &mut e,
        json!({"cmd":"restart","framework":"pytorch","device_total_bytes": 2 * GIB}),
    );
    ok(
        &mut e,
        json!({"cmd":"model","name":"model","layers":4,"width":2048}),
    );
    ok(
        &mut e,
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
    );
    ok(&mut e, json!({"cmd":"data","name":"data"}));
    let before = e.stats();
    let r = ok(
        &mut e,
        json!({"cmd":"find_batch_size","model":"model","optimizer":"opt","data":"data","threshold":0.8}),
    );
    let v = r.value.unwrap();
    let limit = v["limit_bytes"].as_u64().unwrap();
    assert_eq!(limit, (0.8 * (2 * GIB - 300 * MIB) as f64) as u64);
    let tried = v["tried"].as_array().unwrap();
    let best = v["batch_size"].as_u64().unwrap();
    let last = tried.last().unwrap();
    assert_eq!(last["fits"], false);
    assert_eq!(last["batch_size"].as_u64().unwrap(), 2 * best);
    for t in &tried[..tried.len() - 1] {
        assert!(t["peak_allocated_bytes"].as_u64().unwrap() <= limit);
    }
    // The trials ran elsewhere: this kernel is untouched.
    assert_eq!(e.stats().allocated_bytes, before.allocated_bytes);
}

fn cat_bytes(r: &StepRecord, c: Category) -> u64 {
    r.stats.categories.get(&c).copied().unwrap_or(0)
}

/// PyTorch 2.9 (`CublasHandlePool.cpp` at revision 26a39059), or 2.15 with
/// `TORCH_CUBLAS_WORKSPACE_CACHE=1`: the first matmul on the Python thread
/// makes a workspace (8,519,680 bytes below compute capability 9.0, 32 MiB
/// on 9.0; 2.15: on 9.x to 12.x), and the first `addmm` with a bias a
/// cuBLASLt one of 1 MiB (`getCUDABlasLtWorkspace`) unless
/// `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`; the first backward's products, on
/// autograd's thread, a second cuBLAS one; `del`, `gc` and `empty_cache`
/// leave them; `torch._C._cuda_clearCublasWorkspaces()` returns them to the
/// cache; `CUBLAS_WORKSPACE_CONFIG=:0:0` makes none.
#[test]
fn kept_cublas_workspaces_come_with_the_first_matmul_on_each_thread() {
    let setup = |e: &mut Engine, restart: Value| {
        ok(e, restart);
        ok(
            e,
            json!({"cmd":"model","name":"model","layers":2,"width":256}),
        );
        ok(e, json!({"cmd":"data","name":"data"}));
    };
    let (cublas, lt) = (8_519_680, MIB);
    let mut e = Engine::new_simulated();
    setup(&mut e, json!({"cmd":"restart","torch_version":"2.9"}));
    let fwd = json!({"cmd":"forward","name":"loss","model":"model","data":"data"});
    let r = ok(&mut e, fwd.clone());
    assert_eq!(cat_bytes(&r, Category::Workspace), cublas + lt);
    let r = ok(&mut e, json!({"cmd":"backward","name":"loss"}));
    assert_eq!(cat_bytes(&r, Category::Workspace), 2 * cublas + lt);
    let r = ok(&mut e, fwd.clone());
    assert_eq!(cat_bytes(&r, Category::Workspace), 2 * cublas + lt);
    for cmd in ["del", "gc", "empty_cache"] {
        let line = match cmd {
            "del" => json!({"cmd":"del","name":"loss"}),
            other => json!({ "cmd": other }),
        };
        let r = ok(&mut e, line);
        assert_eq!(cat_bytes(&r, Category::Workspace), 2 * cublas + lt, "{cmd}");
    }
    let before = e.stats();
    let r = ok(&mut e, json!({"cmd":"clear_cublas_workspaces"}));
    assert_eq!(cat_bytes(&r, Category::Workspace), 0);
    assert_eq!(
        r.stats.allocated_bytes,
        before.allocated_bytes - 2 * cublas - lt
    );
    assert_eq!(r.stats.reserved_bytes, before.reserved_bytes);
    // 2.15 with the cache, cuBLASLt unified, on a B200-class card
    // (compute capability 10.0): 32 MiB each, no cuBLASLt workspace.
    setup(
        &mut e,
        json!({"cmd":"restart","torch_version":"2.15","cublas_workspace_cache":true,"cublaslt_unified_workspace":true,"compute_capability":[10,0]}),
    );
    ok(&mut e, fwd.clone());
    let r = ok(&mut e, json!({"cmd":"backward","name":"loss"}));
    assert_eq!(cat_bytes(&r, Category::Workspace), 64 * MIB);
    // None at all.
    setup(
        &mut e,
        json!({"cmd":"restart","torch_version":"2.9","gpu":"h100-80gb","cublas_workspace_config":":0:0"}),
    );
    ok(&mut e, fwd.clone());
    let r = ok(&mut e, json!({"cmd":"backward","name":"loss"}));
    assert_eq!(cat_bytes(&r, Category::Workspace), 0);
    // TensorFlow makes no cuBLAS workspace this way; its only workspace is
    // the GPU device's Eigen scratch buffer (1,028 bytes, 1,280 in the pool).
    setup(&mut e, json!({"cmd":"restart","framework":"tensorflow"}));
    let r = ok(&mut e, fwd);
    assert_eq!(cat_bytes(&r, Category::Workspace), 1280);
}

/// A 1-layer MLP `m` (64 wide, on 32 features) and its data `d`.
fn small_mlp() -> Engine {
    let mut e = Engine::new_simulated();
    ok(
        &mut e,
        json!({"cmd":"model","name":"m","layers":1,"width":64,"input_dim":32}),
    );
    ok(
        &mut e,
        json!({"cmd":"data","name":"d","features":32,"samples":100}),
    );
    e
}

/// PyTorch 2.15 (the default): each product allocates its workspace for
/// the call and frees it as it returns (`getCurrentCUDABlasHandleWithWorkspace`
/// for `mm`, 8,519,680 bytes below compute capability 9; cuBLASLt's
/// `CublasLtWorkspace` for an `nn.Linear`'s `addmm`, 1 MiB): nothing stays,
/// and `clear_cublas_workspaces` has nothing to clear.
#[test]
fn per_call_cublas_workspaces_are_freed_as_each_product_returns() {
    let mut e = small_mlp();
    let forward = ok(
        &mut e,
        json!({"cmd":"forward","name":"loss","model":"m","data":"d","batch_size":8}),
    );
    assert_eq!(cat_bytes(&forward, Category::Workspace), 0);
    let backward = ok(&mut e, json!({"cmd":"backward","name":"loss"}));
    assert_eq!(cat_bytes(&backward, Category::Workspace), 0);
    let sizes = |step: u64| -> Vec<(String, u64)> {
        let t = trail(&e, step);
        for w in t.windows(2) {
            if let Some(name) = w[0]
                .strip_prefix("alloc ")
                .filter(|n| n.contains("workspace"))
            {
                // Freed at once: the next event is its own free.
                assert_eq!(w[1], format!("free {name}"));
            }
        }
        let events = e.snapshot(usize::MAX).events;
        let allocs = events.iter().filter(|ev| {
            ev.step == step && ev.action == vramlab_shared::snapshot::EventAction::Alloc
        });
        allocs
            .filter_map(|ev| Some((ev.name.clone()?, ev.size)))
            .filter(|(name, _)| name.contains("workspace"))
            .collect()
    };
    let lt = ("cuBLASLt workspace (this call)".to_string(), MIB);
    let cublas = ("cuBLAS workspace (this call)".to_string(), 8_519_680);
    // Two `addmm`s forward; backward the input's and the weights' `mm`s.
    assert_eq!(sizes(forward.step), [lt.clone(), lt]);
    assert_eq!(
        sizes(backward.step),
        [cublas.clone(), cublas.clone(), cublas]
    );
    let r = ok(&mut e, json!({"cmd":"clear_cublas_workspaces"}));
    assert!(r.note.unwrap().contains("keeps no cuBLAS workspace"));
}

/// The events of one command, as `alloc name` / `free name`.
fn trail(e: &Engine, step: u64) -> Vec<String> {
    e.snapshot(usize::MAX)
        .events
        .iter()
        .filter(|ev| ev.step == step)
        .filter_map(|ev| {
            let verb = match ev.action {
                vramlab_shared::snapshot::EventAction::Alloc => "alloc",
                vramlab_shared::snapshot::EventAction::Free => "free",
                _ => return None,
            };
            Some(format!("{verb} {}", ev.name.clone().unwrap_or_default()))
        })
        .collect()
}

/// A second backward, `.grad` present: the seed (`ones_like`) lives
/// through the whole backward; NLL lets go of its total weight and the
/// labels; `AddmmBackward0` makes the input's, the weight's and the bias's
/// gradients (each product with its cuBLAS workspace for the call; each
/// gradient added into `.grad` and freed once made), then the output's
/// gradient goes; ReLU's node lets go of its output, the first Linear's of
/// the batch. Forward: the logits die after the loss and its total weight
/// exist.
#[test]
fn autograd_frees_in_the_engines_order() {
    let mut e = small_mlp();
    let fwd = json!({"cmd":"forward","name":"loss","model":"m","data":"d","batch_size":8});
    ok(&mut e, fwd.clone());
    ok(&mut e, json!({"cmd":"backward","name":"loss"}));
    let forward = ok(&mut e, fwd);
    let t = trail(&e, forward.step);
    let at = |s: &str| {
        t.iter()
            .position(|x| x == s)
            .unwrap_or_else(|| panic!("{s} in {t:?}"))
    };
    assert!(at("alloc loss") < at("free m.2.addmm"));
    let backward = ok(&mut e, json!({"cmd":"backward","name":"loss"}));
    let t = trail(&e, backward.step);
    let ws = [
        "alloc cuBLAS workspace (this call)",
        "free cuBLAS workspace (this call)",
    ];
    let expected = [
        &[
            "alloc m.ones_like",
            "alloc m.nll_loss_backward",
            "free m.nll_loss_forward",
            "free loss.y",
            "alloc m._log_softmax_backward_data",
            "free m.nll_loss_backward",
            "free m._log_softmax",
            "alloc m.2.mm",
        ][..],
        &ws,
        &["alloc m.2.weight.grad (new)"],
        &ws,
        &[
            "free m.2.weight.grad (new)",
            "alloc m.2.bias.grad (new)",
            "free m.2.bias.grad (new)",
            "free m._log_softmax_backward_data",
            "alloc m.1.threshold_backward",
            "free m.2.mm",
            "free m.1.relu",
            "alloc m.0.weight.grad (new)",
        ],
        &ws,
        &[
            "free m.0.weight.grad (new)",
            "alloc m.0.bias.grad (new)",
            "free m.0.bias.grad (new)",
            "free m.1.threshold_backward",
            "free loss.x",
            "free m.ones_like",
        ],
    ]
    .concat();
    assert_eq!(t, expected, "{t:#?}");
}
