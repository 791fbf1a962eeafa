//! One training step of a Hugging Face causal LM as transformers 5.24 and
//! PyTorch run it: `loss = model(input_ids=ids, labels=ids).loss`,
//! `loss.backward()`, AdamW's `opt.step()`, `opt.zero_grad()`. The
//! forward is the model's own op order (`llama`: Llama, Mistral, Qwen2,
//! Qwen3, Phi-3), each op saving what autograd saves; the backward is the
//! autograd engine's walk of those nodes (`tape`), so eager or sdpa
//! attention, non-reentrant gradient checkpointing of each decoder layer
//! (`gradient_checkpointing_enable(use_reentrant=False)`) and peft's LoRA
//! follow from the forward alone.
//!
//! The logits, the loss's tensors and their gradients are told apart from
//! the other activations (`Holds::Logits`): over a vocabulary of 128K they
//! are most of a step's peak.
//!
//! `tests/reference/hf_train.py` traces transformers' own step on the CPU;
//! the tests hold this program to it event by event.

mod amp;
pub mod decoding;
mod gemma;
mod gpt2;
mod inputs;
mod kernel;
mod llama;
mod math;
mod ops;
mod quant;
mod tape;
mod weights;

use super::config::{Arch, HfConfig};
use super::params;
use kernel::Sdpa;
use llama::Shared;
use std::rc::Rc;
use tape::{Tape, T};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;
use vramlab_train::kinds::step::{sdp, Attention};
use vramlab_train::kinds::NamedTensor;
use vramlab_train::program::{Holds, Op, Role, Sink};

pub use quant::{Quant4, BLOCK, BLOCK2};
pub use weights::{adapted, fans, lora_targets, quantized};
use weights::{Name, Weights};

/// One training step's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub batch: u64,
    pub seq: u64,
    pub attention: Attention,
    /// `gradient_checkpointing_enable(use_reentrant=False)`.
    pub checkpointing: bool,
    /// peft's LoRA of this rank on the model type's default targets.
    pub lora: Option<u64>,
    /// The GPU's compute capability (none: the CPU, where the reference
    /// traces are recorded).
    pub gpu: Option<(u32, u32)>,
    /// bitsandbytes' `AdamW8bit`: its blockwise kernel updates the state in
    /// place, with no temporaries.
    pub adam8bit: bool,
    /// QLoRA: the decoder's linear layers in bitsandbytes' 4 bits, the rest
    /// upcast to float32 by peft's `prepare_model_for_kbit_training` (the
    /// step then runs in float32: give the config that type), LoRA on
    /// every linear layer (`target_modules="all-linear"`).
    pub quant: Option<Quant4>,
    /// Checkpointing with `use_reentrant=True` (what
    /// `prepare_model_for_kbit_training` leaves).
    pub reentrant: bool,
    /// `torch.autocast` of this type around the forward (the weights in
    /// the config's type).
    pub amp: Option<Dtype>,
    /// Attention with grouped-query heads runs the math kernel (a GPU's
    /// memory-efficient kernel refuses them in PyTorch 2.11, and float32
    /// has no other fused kernel).
    pub math_gqa: bool,
    /// The embeddings' output needs a gradient: peft's
    /// `enable_input_require_grads`, which readies a checkpointed model
    /// for LoRA (and `prepare_model_for_kbit_training` calls whenever it
    /// enables checkpointing, even where the layers then skip it).
    pub input_grads: bool,
    /// The trainable parameters' `.grad` exist before the backward (kept
    /// by `zero_grad(set_to_none=False)`, or accumulating): the backward
    /// adds into them in place.
    pub grads_exist: bool,
}

impl Run {
    /// A plain step of `batch` x `seq` tokens with `attention`: no
    /// checkpointing, LoRA, quantization or autocast, on the CPU (where the
    /// reference traces are recorded); the other settings from it with
    /// struct update syntax.
    pub fn plain(batch: u64, seq: u64, attention: Attention) -> Run {
        Run {
            batch,
            seq,
            attention,
            checkpointing: false,
            lora: None,
            gpu: None,
            adam8bit: false,
            quant: None,
            reentrant: false,
            amp: None,
            math_gqa: false,
            input_grads: false,
            grads_exist: false,
        }
    }
}

/// A step being built: the tape, the model and the run.
pub(super) struct Model<'m, 's> {
    t: &'m mut Tape<'s>,
    c: HfConfig,
    run: Run,
    w: Rc<Weights>,
    kernel: Sdpa,
    /// The `DynamicCache`'s keys and values, layer by layer.
    cache: Vec<T>,
    /// Where `generate` runs the forward (none: a training step).
    decode: Option<decoding::Decoding>,
}

/// What a forward reads besides its tape: the config, the run, the
/// weights and the attention kernel (what a checkpoint's recomputation
/// carries to run a layer again).
#[derive(Clone)]
struct Parts {
    c: HfConfig,
    run: Run,
    w: Rc<Weights>,
    kernel: Sdpa,
}

impl<'m, 's> Model<'m, 's> {
    /// A training forward's model on tape `t`.
    fn new(t: &'m mut Tape<'s>, p: Parts) -> Self {
        Model {
            t,
            c: p.c,
            run: p.run,
            w: p.w,
            kernel: p.kernel,
            cache: Vec::new(),
            decode: None,
        }
    }

    fn parts(&self) -> Parts {
        Parts {
            c: self.c,
            run: self.run,
            w: self.w.clone(),
            kernel: self.kernel,
        }
    }
}

impl Model<'_, '_> {
    fn e(&self) -> u64 {
        self.c.dtype.size_bytes()
    }

    /// The weights are in a half type (norms and softmax upcast).
    fn low(&self) -> bool {
        self.c.dtype != Dtype::Float32
    }

    /// A training forward makes a `DynamicCache` unless checkpointing
    /// turned `use_cache` off; `generate`'s always reads one.
    fn cached(&self) -> bool {
        self.decode.is_some() || !self.run.checkpointing
    }

    /// Module `name`'s weight.
    fn weight(&self, name: Name) -> T {
        self.w.module(name).weight.unwrap_or(self.w.missing)
    }

    /// Module `name`'s bias.
    fn bias(&self, name: Name) -> T {
        self.w.module(name).bias.unwrap_or(self.w.missing)
    }

    /// The decoder layers from the embeddings, each in a checkpoint
    /// region when checkpointing: the last one's output. `kinds` is what
    /// a full and a sliding layer read.
    fn layers(&mut self, embeds: T, kinds: [Shared; 2]) -> T {
        // Llama's and Gemma's first input is also `inputs_embeds`; GPT-2's
        // is the dropout's, named only `hidden_states`.
        let first_held = self.c.arch != Arch::Gpt2;
        let mut x = embeds;
        for l in 0..self.c.layers {
            let s = kinds[usize::from(self.c.sliding(l))];
            self.t.set_layer(Some(l as u32));
            let out = if self.run.checkpointing && self.run.reentrant {
                self.reentrant_layer(l, x, s)
            } else if self.run.checkpointing {
                // The region keeps `partial(layer, **kwargs)` (the mask, cos
                // and sin, the positions, in the order the model passes
                // them) and the input it saved.
                let mut inputs: Vec<T> = s.mask.into_iter().collect();
                match self.c.arch {
                    Arch::Mistral | Arch::Phi3 => inputs.extend([s.positions, s.cos, s.sin, x]),
                    // GPT-2 passes the mask as an argument, saved with the input.
                    Arch::Gpt2 => inputs = [s.positions, x].into_iter().chain(s.mask).collect(),
                    _ => inputs.extend([s.cos, s.sin, s.positions, x]),
                }
                let frame = self.t.checkpoint(&inputs);
                let out = self.any_layer(l, x, &s);
                let parts = self.parts();
                let recompute = Box::new(move |t: &mut Tape<'_>| {
                    let mut m = Model::new(t, parts);
                    let outside = m.t.set_layer(Some(l as u32));
                    let out = m.any_layer(l, x, &s);
                    m.t.drop(out);
                    m.t.set_layer(outside);
                });
                self.t.checkpoint_end(frame, recompute);
                out
            } else {
                self.any_layer(l, x, &s)
            };
            if l > 0 || !first_held {
                self.t.drop(x);
            }
            x = out;
        }
        self.t.set_layer(None);
        x
    }

    /// Decoder layer `l` under reentrant checkpointing: the region holds
    /// `partial(layer, **kwargs)` (the mask, cos and sin, the positions)
    /// and saves its input.
    fn reentrant_layer(&mut self, l: u64, x: T, s: Shared) -> T {
        // In the order the model passes them as keywords.
        let rest = match self.c.arch {
            Arch::Mistral | Arch::Phi3 => [s.positions, s.cos, s.sin],
            _ => [s.cos, s.sin, s.positions],
        };
        let kept: Vec<T> = s.mask.into_iter().chain(rest).collect();
        let parts = self.parts();
        let region: tape::Region = Box::new(move |t: &mut Tape<'_>, x: T| {
            let mut m = Model::new(t, parts.clone());
            let outside = m.t.set_layer(Some(l as u32));
            let out = m.any_layer(l, x, &s);
            m.t.set_layer(outside);
            out
        });
        self.t.reentrant(x, &kept, region)
    }

    fn gemma(&self) -> bool {
        matches!(self.c.arch, Arch::Gemma2 | Arch::Gemma3)
    }

    /// Decoder layer `l`, of the model's family.
    fn any_layer(&mut self, l: u64, x: T, s: &Shared) -> T {
        match self.c.arch {
            Arch::Gpt2 => self.gpt2_block(l, x, s),
            Arch::Gemma2 | Arch::Gemma3 => self.gemma_layer(l, x, s),
            _ => self.layer(l, x, s),
        }
    }

    /// The model's final norm.
    fn final_norm(&mut self, x: T) -> T {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let w = self.weight(Name::top("model.norm"));
        if self.gemma() {
            self.gemma_norm(x, w, rows, c.hidden)
        } else {
            self.rms_norm(x, w, rows, c.hidden)
        }
    }

    /// `model(input_ids=ids, labels=ids).loss`.
    fn forward(&mut self, ids: T) -> T {
        let rows = self.run.batch * self.run.seq;
        let (normed, head) = self.hidden(ids);
        let logits = self.head(normed, head, rows);
        self.finish(normed, logits)
    }

    /// `generate`'s forward (`logits_to_keep=1`): the logits of each
    /// sequence's last position.
    fn decode_forward(&mut self, ids: T) -> T {
        let (normed, head) = self.hidden(ids);
        let last = self.t.share(normed);
        let logits = self.head(last, head, self.run.batch);
        self.t.set_holds(Holds::Activation);
        self.t.drop_all(&[last, normed]);
        logits
    }

    /// The output layer over `rows` of the final norm's output (the
    /// logits, soft-capped in Gemma 2): what they make and what the loss
    /// makes hold the logits.
    fn head(&mut self, normed: T, head: T, rows: u64) -> T {
        let c = self.c;
        self.t.set_holds(Holds::Logits);
        let e = self.e();
        let logits = self.linear_of(normed, (head, None), rows, (c.hidden, c.vocab), e);
        if c.final_softcap {
            return self.softcap_logits(logits);
        }
        logits
    }

    /// The model's forward to the final norm: its output and the output
    /// layer's weight.
    fn hidden(&mut self, ids: T) -> (T, T) {
        let (c, b, n) = (self.c, self.run.batch, self.run.seq);
        let rows = b * n;
        if c.arch == Arch::Gpt2 {
            let normed = self.gpt2_body(ids);
            let head = match c.tied {
                true => self.weight(Name::top("transformer.wte")),
                false => self.weight(Name::top("lm_head")),
            };
            return (normed, head);
        }
        let embed = self.weight(Name::top("model.embed_tokens"));
        let raw = self.t.embedding(embed, ids, rows * c.hidden * self.e());
        let mut embeds = if self.gemma() {
            self.gemma_embeds(raw)
        } else {
            raw
        };
        if self.run.input_grads {
            embeds = self.t.leaf(embeds);
        }
        let positions = self.positions();
        let [full_mask, sliding_mask] = self.masks();
        // Gemma 3's rotary embedding per kind of layer it has, the local
        // (sliding) one first.
        let sliding_layers = (0..c.layers).any(|l| c.sliding(l));
        let full_layers = (0..c.layers).any(|l| !c.sliding(l));
        let (local, global) = match c.arch {
            Arch::Gemma3 => {
                let local = sliding_layers.then(|| self.rotary());
                let global = full_layers.then(|| self.rotary());
                (local, global)
            }
            _ => {
                let one = self.rotary();
                (Some(one), Some(one))
            }
        };
        let none = (self.w.missing, self.w.missing);
        let (full_cos, full_sin) = global.or(local).unwrap_or(none);
        let (sliding_cos, sliding_sin) = local.or(global).unwrap_or(none);
        let kinds = [
            Shared {
                cos: full_cos,
                sin: full_sin,
                positions,
                mask: full_mask,
            },
            Shared {
                cos: sliding_cos,
                sin: sliding_sin,
                positions,
                mask: sliding_mask,
            },
        ];
        let last = self.layers(embeds, kinds);
        let normed = self.final_norm(last);
        self.t.drop(last);
        // The model's forward returns: its arguments, then its locals
        // (Qwen's and Gemma's masks first: their `mask_kwargs` holds the
        // embeddings and positions too).
        let mask_kwargs = matches!(
            c.arch,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma2 | Arch::Gemma3
        );
        if !mask_kwargs {
            self.t.drop_all(&[positions, embeds]);
        }
        self.t
            .drop_all(&decoding::distinct([full_mask, sliding_mask]));
        if mask_kwargs {
            self.t.drop_all(&[embeds, positions]);
        }
        let rotaries: Vec<(T, T)> = match c.arch {
            Arch::Gemma3 => local.into_iter().chain(global).collect(),
            _ => local.into_iter().collect(),
        };
        for (cos, sin) in rotaries {
            self.t.drop_all(&[cos, sin]);
        }
        let head = match c.tied {
            true => embed,
            false => self.weight(Name::top("lm_head")),
        };
        (normed, head)
    }

    /// The loss from the logits; then the model's output goes (its hidden
    /// states, logits and cache).
    fn finish(&mut self, normed: T, logits: T) -> T {
        let loss = self.loss(logits);
        self.t.set_holds(Holds::Activation);
        self.t.drop_all(&[normed, logits]);
        let cache = std::mem::take(&mut self.cache);
        self.t.drop_all(&cache);
        loss
    }

    /// `ForCausalLMLoss`: the logits in float32, the labels shifted by
    /// padding, `cross_entropy` as log-softmax and NLL.
    fn loss(&mut self, logits: T) -> T {
        let (b, n) = (self.run.batch, self.run.seq);
        let wide = if logits.bytes != b * n * self.c.vocab * 4 {
            self.t.cast(logits, b * n * self.c.vocab * 4)
        } else {
            self.t.share(logits)
        };
        let padded = self.t.alloc("constant_pad_nd", b * (n + 1) * 8, Holds::Ids);
        let shifted = self.t.alloc("clone", b * n * 8, Holds::Ids);
        let target = self.t.plain(shifted, b * n * 8);
        let log_probs = self
            .t
            .softmax("_log_softmax", "_log_softmax_backward_data", wide);
        let loss = self.t.nll_loss(log_probs, target);
        self.t.drop_all(&[log_probs, target, wide]);
        self.t.release(padded);
        loss
    }

    /// AdamW's `step()`: on the CPU `_single_tensor_adamw` (each
    /// parameter's `denom` made while the last one's lives); on a GPU
    /// `_multi_tensor_adamw` (`_foreach_sqrt` of every second moment,
    /// freed as it returns).
    fn optimizer_step(&mut self) {
        if self.run.adam8bit {
            return;
        }
        let trainable = self.w.trainable.clone();
        let scratch = |param, name| Role::Scratch { param, name };
        if self.run.gpu.is_some() {
            let mut sqrt = Vec::new();
            for (i, p) in trainable.iter().enumerate() {
                self.t.set_role(scratch(i, "exp_avg_sq_sqrt"));
                sqrt.push(self.t.alloc("_foreach_sqrt", p.bytes, Holds::Optimizer));
            }
            sqrt.into_iter().for_each(|s| self.t.release(s));
            return;
        }
        let mut denom = None;
        for (i, p) in trainable.into_iter().enumerate() {
            self.t.set_role(scratch(i, "denom"));
            let root = self.t.alloc("sqrt", p.bytes, Holds::Optimizer);
            let d = self.t.alloc("div", p.bytes, Holds::Optimizer);
            self.t.release(root);
            if let Some(old) = denom.replace(d) {
                self.t.release(old);
            }
        }
        if let Some(d) = denom {
            self.t.release(d);
        }
    }
}

/// The most rows (batch x sequence) x layers one step plays.
const MOST: u128 = 1 << 40;

/// One training step of model `c`, each allocation and free given to
/// `sink` as it is made. The weights and the optimizer's state are held
/// before it (not in the sink).
pub fn play(c: &HfConfig, run: Run, sink: &mut dyn Sink) -> Result<(), Invalid> {
    play_with(c, run, &params::parameters(c), sink)
}

/// `play` with the model's `named_parameters()` given.
pub fn play_with(
    c: &HfConfig,
    run: Run,
    params: &[NamedTensor],
    sink: &mut dyn Sink,
) -> Result<(), Invalid> {
    if c.arch == Arch::Gemma2 && run.attention == Attention::Sdpa {
        return Err(Invalid::from(
            "Gemma2ForCausalLM does not support sdpa in transformers (its attention soft-caps the scores): attn_implementation=\"eager\"",
        ));
    }
    if run.batch == 0 || run.seq == 0 || run.lora == Some(0) {
        return Err(Invalid::from(
            "batch, sequence length and LoRA rank are each at least 1",
        ));
    }
    if run.seq > c.max_positions {
        return Err(Invalid(format!(
            "a sequence of {} tokens is longer than the model's {} positions (max_position_embeddings)",
            run.seq, c.max_positions
        )));
    }
    let rows = u128::from(run.batch) * u128::from(run.seq);
    let widths = [
        c.vocab,
        c.heads * run.seq,
        2 * c.intermediate,
        3 * c.hidden,
        (c.heads + 2 * c.kv_heads) * c.head_dim,
    ];
    let widest = u128::from(widths.into_iter().max().unwrap_or(0));
    if rows * widest * 4 > MOST * 1024 {
        return Err(Invalid(format!(
            "a batch of {} x {} tokens would make tensors beyond any GPU",
            run.batch, run.seq
        )));
    }
    let mut tape = Tape::new(sink);
    let w = Rc::new(Weights::new(&mut tape, c, params, &run));
    if run.grads_exist {
        tape.grads_exist();
    }
    let ids = tape.external(run.batch * run.seq * 8);
    let kernel = Sdpa(sdp::select(
        run.gpu,
        run.amp.unwrap_or(c.dtype),
        c.head_dim,
        true,
    ));
    let parts = Parts {
        c: *c,
        run,
        w,
        kernel,
    };
    let mut m = Model::new(&mut tape, parts);
    m.t.mark(Op::Phase("forward"));
    let loss = m.forward(ids);
    m.t.clear_amp_cache();
    m.t.mark(Op::Phase("backward"));
    m.t.backward(loss);
    if m.t.stopped() {
        return Ok(());
    }
    m.t.mark(Op::Phase("optimizer step"));
    m.optimizer_step();
    m.t.mark(Op::Phase("zero_grad"));
    m.t.zero_grad();
    m.t.free_graph();
    m.t.drop(loss);
    Ok(())
}

#[cfg(test)]
mod tests;
