//! `model.generate(ids, max_new_tokens=N, do_sample=False)` under
//! `torch.no_grad()` as transformers 5.24 runs each supported family
//! (`llama`: Llama, Mistral, Qwen2, Qwen3, Phi-3; `gpt2`; `gemma`: Gemma 2
//! and 3): the prefill's forward over the prompt, then one forward per
//! new token, each the training step's own model code run without
//! autograd (`step::decoding`: the cache, the masks, the last position's
//! logits), each op's output allocated and freed where Python drops it.
//!
//! Between forwards, `generate` copies the last logits to float32, takes
//! their argmax, and grows `input_ids` and the attention mask by `cat`.
//! `tests/reference/hf_generate.py` traces transformers' own `generate` on
//! the CPU; the tests below hold every forward's events to it and the
//! whole run's peak within 1%.

use super::config::{Arch, HfConfig};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;
use vramlab_train::kinds::step::Attention;
use vramlab_train::program::{Program, Sink};

pub use vramlab_train::kv_cache::Cache;

/// One `generate` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation {
    pub batch: u64,
    pub prompt: u64,
    pub new_tokens: u64,
    pub cache: Cache,
    pub attention: Attention,
}

/// The most layer forwards one run plays (32 layers x 4,096 new tokens):
/// a run's steps are held in memory, in the page too.
pub const MOST_LAYER_FORWARDS: u64 = 1 << 17;

/// The bytes of the run's largest tensor, at most (in float32): eager
/// attention's scores, the logits, the widest activation, the cache.
fn biggest_tensor(c: &HfConfig, g: Generation) -> u128 {
    let (b, s) = (u128::from(g.batch), u128::from(g.prompt));
    let t = s + u128::from(g.new_tokens);
    let wide = [
        c.hidden,
        2 * c.intermediate,
        (c.heads + 2 * c.kv_heads) * c.head_dim,
    ];
    let widest = u128::from(wide.into_iter().max().unwrap_or(0));
    [
        b * u128::from(c.heads) * s * t,
        b * u128::from(c.vocab),
        b * s * widest,
        b * t * u128::from(c.kv_heads * c.head_dim),
    ]
    .into_iter()
    .max()
    .unwrap_or(0)
        * 4
}

/// The program of `generate` for model `c` loaded in `dtype`, collected.
pub fn program(c: &HfConfig, dtype: Dtype, g: Generation) -> Result<Program, Invalid> {
    let mut p = Program::default();
    play(c, dtype, g, &mut p)?;
    Ok(p)
}

/// `generate` for model `c` loaded in `dtype`, each step given to `sink`
/// as it is made.
pub fn play(c: &HfConfig, dtype: Dtype, g: Generation, sink: &mut dyn Sink) -> Result<(), Invalid> {
    play_on(c, dtype, g, sink, true)
}

/// [`play`] on the CPU, as the reference traces record `generate`.
pub fn play_on_cpu(
    c: &HfConfig,
    dtype: Dtype,
    g: Generation,
    sink: &mut dyn Sink,
) -> Result<(), Invalid> {
    play_on(c, dtype, g, sink, false)
}

fn play_on(
    c: &HfConfig,
    dtype: Dtype,
    g: Generation,
    sink: &mut dyn Sink,
    cuda: bool,
) -> Result<(), Invalid> {
    let mut run = Run::on(c, dtype, g, cuda)?;
    while !run.finished() {
        run.token(sink);
        if sink.stopped() {
            return Ok(());
        }
    }
    run.returns(sink);
    Ok(())
}

/// Whether `generate` can run `g` on model `c`, or why not.
pub fn check(c: &HfConfig, g: Generation) -> Result<(), Invalid> {
    if c.arch == Arch::Gemma2 && g.attention == Attention::Sdpa {
        return Err(Invalid::from(
            "Gemma2ForCausalLM does not support sdpa in transformers (its attention soft-caps the scores): attn_implementation=\"eager\"",
        ));
    }
    if g.batch == 0 || g.prompt == 0 || g.new_tokens == 0 {
        return Err(Invalid::from(
            "batch, prompt length and new tokens are each at least 1",
        ));
    }
    if g.prompt.saturating_add(g.new_tokens) > c.max_positions {
        return Err(Invalid(format!(
            "{} + {} tokens are more than the model's {} positions (max_position_embeddings)",
            g.prompt, g.new_tokens, c.max_positions
        )));
    }
    if c.layers.saturating_mul(g.new_tokens) > MOST_LAYER_FORWARDS {
        return Err(Invalid(format!(
            "{} layers x {} new tokens is more than the {MOST_LAYER_FORWARDS} layer forwards vramlab plays in one run: ask for fewer new tokens",
            c.layers, g.new_tokens
        )));
    }
    let biggest = biggest_tensor(c, g);
    if biggest > 1 << 50 {
        return Err(Invalid(format!(
            "one of its tensors would hold {biggest} bytes: beyond any GPU"
        )));
    }
    Ok(())
}

mod run;

pub use run::Run;

#[cfg(test)]
mod tests;
