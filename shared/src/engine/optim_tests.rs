//! bitsandbytes' 8-bit optimizers on the engine: the state a step leaves,
//! what is refused, and `estimate` against the simulated peak.

use super::*;
use crate::types::Category;
use serde_json::{json, Value};

/// The default MLP (784 -> 4 x 1024 -> 10), `opt` with these fields, and
/// one training step at batch 64; the record's stats.
fn one_step(optimizer: Value) -> crate::stats::Stats {
    let step = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":64});
    run_with(optimizer, &[step])
}

/// `opt.step()` alone, after a forward and backward: its record.
fn optimizer_step(optimizer: Value) -> crate::stats::Stats {
    run_with(
        optimizer,
        &[
            json!({"cmd":"forward","name":"loss","model":"model","data":"data","batch_size":64}),
            json!({"cmd":"backward","name":"loss"}),
            json!({"cmd":"step","optimizer":"opt"}),
        ],
    )
}

/// A model, `optimizer` and data, then `lines`: the last one's stats.
fn run_with(optimizer: Value, lines: &[Value]) -> crate::stats::Stats {
    let mut e = Engine::new_simulated();
    let mut opt = json!({"cmd":"optimizer","name":"opt","model":"model"});
    for (k, v) in optimizer.as_object().unwrap() {
        opt[k] = v.clone();
    }
    let mut last = None;
    let setup = [
        json!({"cmd":"model","name":"model"}),
        opt,
        json!({"cmd":"data","name":"data","samples":1024,"features":784,"classes":10}),
    ];
    for line in setup.into_iter().chain(lines.iter().cloned()) {
        let r = e.run_line(&line.to_string());
        e.check_invariants().unwrap();
        assert!(r.ok, "{line}: {:?}", r.error);
        last = Some(r.stats);
    }
    last.unwrap()
}

/// `Optimizer2State.init_state`, by hand, in 512-byte blocks: each weight
/// (4096 elements or more) keeps two uint8 states and two float32 absmax
/// per 256 elements; each bias float32 `state1` and `state2`; the two
/// quantization maps (256 float32) once.
#[test]
fn adam8bit_state_is_what_bitsandbytes_allocates() {
    let first = 2 * 1024 * 784 + 2 * 12_800; // 3136 absmax, 12,544 bytes, one block of 12,800
    let hidden = 3 * (2 * 1024 * 1024 + 2 * 16_384);
    let last = 2 * 10_240 + 2 * 512; // 40 absmax: 160 bytes, one block of 512
    let biases = 4 * 2 * 4096 + 2 * 512; // the 10-wide bias: 40 bytes a state
    let maps = 2 * 1024;
    let stats = one_step(json!({"kind":"adam","bits":8}));
    assert_eq!(
        stats.categories[&Category::OptimizerState],
        first + hidden + last + biases + maps
    );
    let adam32 = one_step(json!({"kind":"adam"}));
    assert_eq!(
        adam32.categories[&Category::OptimizerState],
        2 * adam32.categories[&Category::Parameter]
    );
}

/// bitsandbytes updates in place: `opt.step()` has no `exp_avg_sq.sqrt()`
/// temporaries, so 8-bit Adam's step peaks lower by more than the state.
/// (By more than that sum: the allocator may hand a temporary a cached
/// block larger than it asked for.)
#[test]
fn adam8bit_step_makes_no_temporaries() {
    let adam8 = optimizer_step(json!({"kind":"adamw","bits":8}));
    let adam32 = optimizer_step(json!({"kind":"adamw"}));
    let params = adam32.categories[&Category::Parameter];
    let saved_state =
        adam32.categories[&Category::OptimizerState] - adam8.categories[&Category::OptimizerState];
    assert_eq!(
        adam8
            .categories
            .get(&Category::Temporary)
            .copied()
            .unwrap_or(0),
        0
    );
    let lower = adam32.step_peak_allocated_bytes - adam8.step_peak_allocated_bytes;
    assert!(
        lower >= saved_state + params,
        "{lower} < {}",
        saved_state + params
    );
}

#[test]
fn eight_bit_sgd_and_other_bits_and_other_frameworks_are_refused() {
    let mut e = Engine::new_simulated();
    e.run_line(r#"{"cmd":"model","name":"model"}"#);
    for (line, says) in [
        (
            r#"{"cmd":"optimizer","name":"o","model":"model","kind":"sgd","bits":8}"#,
            "no state",
        ),
        (
            r#"{"cmd":"optimizer","name":"o","model":"model","kind":"adam","bits":4}"#,
            "not 4",
        ),
    ] {
        let r = e.run_line(line);
        assert!(r.error.unwrap().message.contains(says), "{line}");
    }
    let ok =
        e.run_line(r#"{"cmd":"optimizer","name":"o","model":"model","kind":"momentum","bits":8}"#);
    assert!(ok.ok, "{:?}", ok.error);
    let mut tf = Engine::new_simulated();
    tf.run_line(r#"{"cmd":"restart","framework":"tensorflow"}"#);
    tf.run_line(r#"{"cmd":"model","name":"model"}"#);
    let r = tf.run_line(r#"{"cmd":"optimizer","name":"o","model":"model","kind":"adam","bits":8}"#);
    assert!(r.error.unwrap().message.contains("bitsandbytes"));
}
