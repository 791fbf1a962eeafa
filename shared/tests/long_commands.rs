//! A long command holds what its state needs, not what its length made:
//! a Hugging Face model's `train` and `generate`, run for ten times as
//! many steps or tokens, peak at the same memory (this binary's allocator
//! counts it); each reports as it goes and stops when asked.

use std::sync::{Arc, Mutex};
use vramlab_shared::engine::{Engine, Progress};

mod common;

const LLAMA: &str = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":16,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":1000,"max_position_embeddings":100000}"#;

fn kernel() -> Engine {
    let mut e = Engine::new_simulated();
    for line in [
        r#"{"cmd":"restart","framework":"pytorch"}"#.to_string(),
        format!(r#"{{"cmd":"model","name":"model","kind":"hf","config":{LLAMA}}}"#),
        r#"{"cmd":"optimizer","name":"opt","model":"model","kind":"adamw"}"#.into(),
        r#"{"cmd":"data","name":"data","samples":64,"features":32,"classes":1000}"#.into(),
    ] {
        let r = e.run_line(&line);
        assert!(r.ok, "{line}: {:?}", r.error);
    }
    e
}

/// The most bytes held while `line` runs on a fresh kernel.
fn peak_of(line: &str) -> usize {
    let mut e = kernel();
    let (r, peak) = common::peak_bytes(|| e.run_line(line));
    assert!(r.ok, "{line}: {:?}", r.error);
    peak
}

#[test]
fn generate_holds_the_same_however_many_tokens() {
    let line = |n: u64| {
        format!(r#"{{"cmd":"generate","model":"model","prompt_len":16,"new_tokens":{n}}}"#)
    };
    let (short, long) = (peak_of(&line(400)), peak_of(&line(4_000)));
    println!("figure: generate of 400 and 4,000 tokens on 16 layers held {short} and {long} bytes");
    // Each forward's peak (8 bytes a token) is all that grows.
    assert!(long < short + 64 * 1024, "{short} -> {long}");
}

#[test]
fn train_holds_the_same_however_many_steps() {
    let line = |n: u64| {
        format!(
            r#"{{"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":{n},"batch_size":2}}"#
        )
    };
    let (short, long) = (peak_of(&line(10)), peak_of(&line(100)));
    println!("figure: train of 10 and 100 steps on 16 layers held {short} and {long} bytes");
    assert!(long < short + short / 10, "{short} -> {long}");
}

/// `generate` reports after each new token, and a stop ends it as a
/// stopping criterion does: the cache goes, the sequences so far live on.
#[test]
fn generate_reports_each_token_and_stops_when_asked() {
    let mut e = kernel();
    let before = e.stats().allocated_bytes;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    e.set_progress_hook(Some(Box::new(move |_: &mut Engine, p: &Progress| {
        log.lock().unwrap().push((p.done, p.total));
        p.done < 7
    })));
    let r = e.run_line(
        r#"{"cmd":"generate","name":"out","model":"model","prompt_len":16,"new_tokens":1000}"#,
    );
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(
        *seen.lock().unwrap(),
        (1..=7).map(|d| (d, 1000)).collect::<Vec<_>>()
    );
    let value = r.value.unwrap();
    assert_eq!(
        (value["stopped"].clone(), value["new_tokens_made"].clone()),
        (true.into(), 7.into())
    );
    assert!(r
        .note
        .unwrap()
        .starts_with("Stopped after 7 of 1000 new tokens"));
    // The sequences: 16 + 7 tokens of int64, in a 512-byte block.
    assert_eq!(r.stats.allocated_bytes, before + 512);
}
