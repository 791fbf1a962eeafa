//! The page's build of the engine (without the `kinds-arithmetic`
//! feature): an MLP's step computes (dense ops only); a CNN's or a
//! transformer's step small enough to compute runs shape-only, and the
//! statement and the loop say a server computes it.

use super::kinds_tests::{engine, gpt};
use crate::train::cpu::NOT_IN_THIS_BUILD;
use serde_json::json;

#[test]
fn a_small_transformer_runs_shape_only_and_says_a_server_computes_it() {
    let (model, features, classes) = gpt(1, 16, 2, 8, 32);
    let mut e = engine(model, "adam", features, classes);
    let forward =
        json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":8});
    let r = e.run_line(&forward.to_string());
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.value.unwrap()["loss_computed"], false);
    assert!(r.note.unwrap().contains(NOT_IN_THIS_BUILD));
    let train = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":2,"batch_size":8});
    let r = e.run_line(&train.to_string());
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.value.unwrap()["loss_computed"], false);
    assert!(r.note.unwrap().contains(NOT_IN_THIS_BUILD));
    e.check_invariants().unwrap();
}

/// An MLP's step is dense ops only: the page computes it, and the loss
/// falls over a short loop, under autocast too.
#[test]
fn an_mlp_learns_in_the_pages_build() {
    for amp in [false, true] {
        let mut e = super::Engine::new_simulated();
        for line in [
            json!({"cmd":"model","name":"model","layers":2,"width":32,"input_dim":16,"classes":4}),
            json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam","lr":0.01}),
            json!({"cmd":"data","name":"data","features":16,"classes":4,"samples":256}),
            json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":30,"batch_size":32,"amp":amp}),
        ] {
            let r = e.run_line(&line.to_string());
            assert!(r.ok, "{line}: {:?}", r.error);
            if line["cmd"] == "train" {
                let v = r.value.unwrap();
                assert_eq!(v["loss_computed"], true);
                let (first, last) = (
                    v["first_loss"].as_f64().unwrap(),
                    v["last_loss"].as_f64().unwrap(),
                );
                assert!(last < 0.8 * first, "amp {amp}: {first} -> {last}");
            }
        }
        e.check_invariants().unwrap();
    }
}

/// A Keras step without XLA is TensorFlow's executor, which the page's
/// build leaves out: refused with where it runs.
#[test]
fn a_keras_step_without_xla_says_a_server_runs_it() {
    let mut e = super::Engine::new_simulated();
    for line in [
        json!({"cmd":"restart","framework":"tensorflow"}),
        json!({"cmd":"model","name":"model","layers":1,"width":16}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data","features":784,"classes":10,"samples":64}),
    ] {
        assert!(e.run_line(&line.to_string()).ok, "{line}");
    }
    let train = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"jit_compile":false});
    let r = e.run_line(&train.to_string());
    assert_eq!(r.error.unwrap().message, super::training::NO_EXECUTOR);
    let compiled = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1});
    assert!(e.run_line(&compiled.to_string()).ok);
}

/// An expandable recording that starts mid-run replays exactly on the
/// command line and the server; the page's build says so and leaves it to
/// "what if".
#[test]
fn an_expandable_recording_from_mid_run_is_left_to_what_if() {
    use crate::torch_snapshot::{replay, Action, MemorySnapshot, Segment, TraceEntry};
    let base = 0x7f00_0000_0000u64;
    let mapped = Segment {
        address: base,
        total_size: 20 << 20,
        is_expandable: true,
        segment_type: "large".into(),
        ..Segment::default()
    };
    let alloc = TraceEntry {
        addr: base,
        size: 4 << 20,
        ..TraceEntry::new(Action::Alloc)
    };
    let free = TraceEntry {
        action: Action::FreeCompleted,
        ..alloc.clone()
    };
    let s = MemorySnapshot {
        segments: vec![mapped],
        device_traces: vec![vec![alloc, free].into()],
        allocator_settings: None,
    };
    let err = replay::replay_exact(&s, 0).unwrap_err().to_string();
    assert!(err.contains("replays under \"what if\" here"), "{err}");
    assert!(replay::replay_what_if(&s, 0, &Default::default()).is_ok());
}
