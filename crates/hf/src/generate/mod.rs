//! `model.generate(ids, max_new_tokens=N, do_sample=False)` under
//! `torch.no_grad()` as transformers 5.24 runs each supported family
//! (`llama`: Llama, Mistral, Qwen2, Qwen3, Phi-3; `gpt2`; `gemma`: Gemma 2
//! and 3): the prefill's forward over the prompt,
//! then one forward per new token, each op's output allocated and freed
//! where Python drops it, the keys and values kept by the cache:
//!
//! - `DynamicCache`: every layer's keys and values grow by `torch.cat`
//!   each token, so the old and the new tensor live together for a moment
//!   and the caching allocator sees ever larger requests (a sliding
//!   layer's stop growing at its window);
//! - `StaticCache` (`cache_implementation="static"`): zeros of the whole
//!   length made at the prefill, written in place.
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
use vramlab_train::program::{Alloc, Holds, Op, Program, Sink};

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

/// Where the cache for one layer stands: its tensors and how many
/// positions they hold.
#[derive(Clone, Copy, Default)]
struct Layer {
    keys: Option<usize>,
    values: Option<usize>,
    len: u64,
}

struct Tape<'a> {
    c: &'a HfConfig,
    g: Generation,
    /// The type of the weights and activations.
    dtype: Dtype,
    sink: &'a mut dyn Sink,
    cache: Vec<Layer>,
    /// The decoder layer running, if one.
    layer: Option<u32>,
    /// On a GPU (else as the CPU's reference traces record it).
    cuda: bool,
}

const F32: u64 = 4;

impl Tape<'_> {
    fn e(&self) -> u64 {
        self.dtype.size_bytes()
    }

    fn alloc(&mut self, op: &'static str, bytes: u64, holds: Holds) -> usize {
        self.sink
            .alloc(&Alloc::memory(op, bytes, holds, self.layer))
    }

    fn act(&mut self, op: &'static str, bytes: u64) -> usize {
        self.alloc(op, bytes, Holds::Activation)
    }

    fn free(&mut self, i: usize) {
        self.sink.free(i);
    }

    /// [`Sink::on_stack`].
    fn on_stack(&mut self, i: usize) {
        self.sink.on_stack(i);
    }

    fn free_all(&mut self, is: &[usize]) {
        for &i in is {
            self.free(i);
        }
    }

    /// The layer's cache takes `tokens` new keys and values after `past`
    /// (a dynamic cache by `cat`, a static one into its zeros); then
    /// `fresh`, the tensors they came in, go (Llama's rotated keys and its
    /// values; Phi-3's values and GPT-2's keys and values are views of the
    /// projection, which holds them).
    fn update(&mut self, l: usize, fresh: &[usize], tokens: u64) {
        let c = self.c;
        let row = self.g.batch * c.kv_heads * c.head_dim * self.e();
        let layer = self.cache[l];
        match self.g.cache {
            Cache::Dynamic => {
                // A sliding layer keeps its window's last positions
                // (`DynamicSlidingWindowLayer`), the view of a `cat`.
                let kept = if c.sliding(l as u64) {
                    layer.len.min(c.sliding_window - 1)
                } else {
                    layer.len
                };
                let grown = (kept + tokens) * row;
                let old = [layer.keys, layer.values];
                let k = self.alloc("cat", grown, Holds::KvCache);
                if c.sliding(l as u64) {
                    // Both `cat`s first, then the window's views rebind.
                    let v = self.alloc("cat", grown, Holds::KvCache);
                    self.free_all(&old.into_iter().flatten().collect::<Vec<_>>());
                    self.cache[l] = Layer {
                        keys: Some(k),
                        values: Some(v),
                        len: kept + tokens,
                    };
                    self.free_all(fresh);
                    return;
                }
                if let Some(old) = layer.keys {
                    self.free(old);
                }
                let v = self.alloc("cat", grown, Holds::KvCache);
                if let Some(old) = layer.values {
                    self.free(old);
                }
                self.cache[l] = Layer {
                    keys: Some(k),
                    values: Some(v),
                    len: kept + tokens,
                };
            }
            Cache::Static if layer.keys.is_none() => {
                let length = self.static_length(l);
                let k = self.alloc("zeros", length * row, Holds::KvCache);
                let v = self.alloc("zeros", length * row, Holds::KvCache);
                self.cache[l] = Layer {
                    keys: Some(k),
                    values: Some(v),
                    len: length,
                };
            }
            Cache::Static => {}
        }
        self.free_all(fresh);
    }

    /// A static cache's positions in layer `l` (a sliding layer's at most
    /// its window: `StaticSlidingWindowLayer`).
    fn static_length(&self, l: usize) -> u64 {
        let length = self.g.prompt + self.g.new_tokens - 1;
        if self.c.sliding(l as u64) {
            return length.min(self.c.sliding_window);
        }
        length
    }

    /// The keys layer `l`'s attention reads, its cache updated.
    fn layer_keys(&self, l: usize) -> u64 {
        self.cache[l].len
    }

    /// The positions the model has seen, this forward's included (the
    /// masks' width).
    fn attended(&self, past: u64, tokens: u64) -> u64 {
        match self.g.cache {
            Cache::Dynamic => past + tokens,
            Cache::Static => self.g.prompt + self.g.new_tokens - 1,
        }
    }

    /// `F.scaled_dot_product_attention`: the output and the log-sum-exp
    /// (float32, one per head and query), dropped at once.
    fn sdpa(&mut self, tokens: u64) -> usize {
        let (c, b) = (self.c, self.g.batch);
        let op = "_scaled_dot_product_flash_attention";
        let out = self.act(op, b * c.heads * tokens * c.head_dim * self.e());
        let lse = self.act(op, b * c.heads * tokens * F32);
        self.free(lse);
        out
    }

    /// The attention mask eager attention adds (`create_causal_mask`: a
    /// batch of queries x keys in the model's type); sdpa with a dynamic
    /// cache needs none (`is_causal`), with a static one a boolean one.
    /// Inside the forward: none where [`Self::masks_before`] made them.
    fn mask(&mut self, past: u64, tokens: u64) -> Option<usize> {
        if self.masks_made_before() {
            return None;
        }
        let bytes = self.mask_bytes(past, tokens)?;
        Some(self.act("where", bytes))
    }

    fn mask_bytes(&self, past: u64, tokens: u64) -> Option<u64> {
        let (b, keys) = (self.g.batch, self.attended(past, tokens));
        match self.g.attention {
            Attention::Eager => Some(b * tokens * keys * self.e()),
            Attention::Sdpa if self.g.cache == Cache::Static => Some(b * tokens * keys),
            Attention::Sdpa => None,
        }
    }

    /// With a static cache, `prepare_inputs_for_generation` builds eager
    /// attention's masks (`create_masks_for_generate`) before the
    /// forward, one per kind of layer, and they live until it returns.
    fn masks_made_before(&self) -> bool {
        self.g.cache == Cache::Static && self.g.attention == Attention::Eager
    }

    fn masks_before(&mut self, past: u64, tokens: u64) -> Vec<usize> {
        if !self.masks_made_before() {
            return Vec::new();
        }
        let kinds = match self.c.arch {
            Arch::Gemma2 | Arch::Gemma3 => self.layer_kinds(),
            _ => 1,
        };
        let bytes = self.mask_bytes(past, tokens).unwrap_or(0);
        (0..kinds).map(|_| self.act("where", bytes)).collect()
    }

    /// Forward `k` over `tokens` positions after `past`: the logits of
    /// the last position (`logits_to_keep=1`).
    fn forward(&mut self, k: u64, past: u64, tokens: u64) -> usize {
        let masks = self.masks_before(past, tokens);
        self.sink.mark(Op::Forward(k));
        let logits = match self.c.arch {
            Arch::Gpt2 => self.gpt2_forward(past, tokens),
            Arch::Gemma2 | Arch::Gemma3 => self.gemma_forward(past, tokens),
            _ => self.llama_forward(past, tokens),
        };
        self.sink.mark(Op::Returned(k));
        self.free_all(&masks);
        logits
    }

    /// New token `k` of the run: its forward, then `generate`'s own
    /// tensors for it (the mask grown, the scores, the sequences).
    fn token(&mut self, run: &mut Tokens) {
        let (g, c, k) = (self.g, self.c, run.done);
        let ids_bytes = |len: u64| g.batch * len * 8;
        let tokens = if k == 0 { g.prompt } else { 1 };
        let logits = self.forward(k, run.past, tokens);
        run.past += tokens;
        let len = g.prompt + k;
        let grown = self.alloc("cat", ids_bytes(len + 1), Holds::Ids);
        if let Some(old) = run.mask.replace(grown) {
            self.free(old);
        }
        let wide = self.alloc("_to_copy", g.batch * c.vocab * F32, Holds::Logits);
        if let Some(old) = run.scores.replace(wide) {
            self.free(old);
        }
        let next = self.alloc("argmax", ids_bytes(1), Holds::Ids);
        let longer = self.alloc("cat", ids_bytes(len + 1), Holds::Ids);
        self.free(next);
        if let Some(old) = run.ids.replace(longer) {
            self.free(old);
        }
        self.free(logits);
        run.done += 1;
    }

    /// `generate` returns: its cache, mask and scores go; the sequences
    /// live on in the caller.
    fn returns(&mut self, run: &Tokens) {
        let cache: Vec<usize> = (self.cache.iter())
            .flat_map(|l| [l.keys, l.values])
            .flatten()
            .collect();
        self.free_all(
            &[run.scores, run.mask]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>(),
        );
        self.free_all(&cache);
    }
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

mod gemma;
mod gpt2;
mod llama;
mod run;

pub use run::Run;
use run::Tokens;

#[cfg(test)]
mod tests;
