//! The page's build of the engine (without the `kinds-arithmetic`
//! feature): a CNN's or a transformer's step small enough to compute runs
//! shape-only, and the statement and the loop say a server computes it.

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
