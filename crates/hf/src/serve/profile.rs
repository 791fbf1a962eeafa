//! vLLM 0.33.0's start-up played on PyTorch's caching allocator: the
//! weights as its model classes make them (`qkv_proj` and `gate_up_proj`
//! fused, the vocabulary padded to 64, one rotary `cos_sin_cache`), the
//! model runner's input buffers, then `profile_run`: the forward over
//! `max_num_batched_tokens` tokens with vLLM's own layers (the residual
//! added and normed in place by `fused_add_rms_norm`, attention's output
//! buffer left unwritten while profiling, `SiluAndMul` into a new half-
//! width tensor) and the sampler twice on the requests' last positions
//! (FlashInfer's top-k/top-p, then PyTorch's with a generator, each on a
//! float32 copy of the logits). It plays the eager order of those ops,
//! what `--enforce-eager` runs; compiled, Inductor fuses the elementwise
//! ops between the same matrix products.

use super::{Card, Serving};
use crate::config::{Arch, HfConfig};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;
use vramlab_core::units::MIB;
use vramlab_device::alloc::{Allocator, BlockId};
use vramlab_device::device::SimDevice;
use vramlab_device::framework::{
    make_allocator, sim_device, RestartSettings, Settings, TorchVersion,
};

/// What the start-up measured before the KV cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profiled {
    /// The weights' allocated bytes ("Model loading took").
    pub weights: u64,
    /// PyTorch's reserved bytes after profiling and `empty_cache()`.
    pub reserved_after: u64,
    /// `allocated_bytes.all.peak − allocated_bytes.all.current` of the
    /// profile run.
    pub transient_peak: u64,
    /// The CUDA graphs' estimate.
    pub cudagraph: u64,
    /// Where it ran out of memory, if it did.
    pub out_of_memory: Option<String>,
}

/// A device and PyTorch's allocator on it, tensors by handle.
struct Gpu {
    device: SimDevice,
    allocator: Box<dyn Allocator>,
    live: Vec<Option<BlockId>>,
}

impl Gpu {
    fn new(card: &Card) -> Result<Gpu, Invalid> {
        let patch = RestartSettings {
            device_total_bytes: Some(card.total),
            compute_capability: Some(card.compute_capability),
            // vLLM 0.33.0 pins PyTorch 2.14; the caching allocator's
            // rules are 2.11's.
            torch_version: Some(TorchVersion::V2_11),
            ..RestartSettings::default()
        };
        let settings = Settings::default()
            .patched(&patch)
            .map_err(|e| Invalid(e.message))?;
        let device = sim_device(&settings)?;
        let mut allocator = make_allocator(&settings, &device);
        allocator.set_tracing(false);
        Ok(Gpu {
            device,
            allocator,
            live: Vec::new(),
        })
    }

    /// A tensor of `bytes`; `Err` with the request refused (past a
    /// pebibyte without asking: no GPU holds it).
    fn alloc(&mut self, bytes: u64) -> Result<usize, u64> {
        if bytes > 1 << 50 {
            return Err(bytes);
        }
        match self.allocator.malloc(&mut self.device, bytes) {
            Ok(b) => {
                self.live.push(b);
                Ok(self.live.len() - 1)
            }
            Err(e) => Err(e.out_of_memory().map_or(bytes, |o| o.requested)),
        }
    }

    fn free(&mut self, handle: usize) {
        if let Some(b) = self.live.get_mut(handle).and_then(Option::take) {
            self.allocator.free(&mut self.device, b);
        }
    }

    fn allocated_now(&self) -> u64 {
        self.allocator.stats().allocated_bytes.current
    }

    fn reserved_now(&self) -> u64 {
        self.allocator.stats().reserved_bytes.current
    }
}

/// The vocabulary as `VocabParallelEmbedding` pads it.
pub fn padded_vocab(c: &HfConfig) -> u64 {
    c.vocab.div_ceil(64) * 64
}

/// One tensor-parallel rank's share of the model: the query and
/// key-value widths, the MLP's and the vocabulary's (all of them at
/// `tp` 1). Column-parallel layers split their outputs, row-parallel
/// ones their inputs; key-value heads fewer than the ranks are copied to
/// each (`LlamaAttention`'s `num_kv_heads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub tp: u64,
    pub q: u64,
    pub kv: u64,
    pub inter: u64,
    pub vocab: u64,
}

impl Shard {
    pub fn of(c: &HfConfig, tp: u64) -> Shard {
        let (heads, kv_heads, head_dim) = if c.arch == Arch::Gpt2 {
            (c.heads, c.heads, c.hidden / c.heads.max(1))
        } else {
            (c.heads, c.kv_heads, c.head_dim)
        };
        Shard {
            tp,
            q: heads / tp * head_dim,
            kv: (kv_heads / tp).max(1) * head_dim,
            inter: c.intermediate / tp,
            vocab: padded_vocab(c) / tp,
        }
    }
}

/// One rank's weights in the order vLLM's model classes make them, as
/// bytes.
pub fn weights(c: &HfConfig, dtype: Dtype, sh: Shard) -> Vec<u64> {
    let e = dtype.size_bytes();
    let (h, v, i) = (c.hidden, sh.vocab, sh.inter);
    let mut out = vec![v * h * e];
    if c.arch == Arch::Gpt2 {
        out.push(c.max_positions * h * e);
        let third = sh.q;
        for _ in 0..c.layers {
            out.extend(
                [
                    h,
                    h,
                    3 * third * h,
                    3 * third,
                    h * third,
                    h,
                    h,
                    h,
                    i * h,
                    i,
                    h * i,
                    h,
                ]
                .map(|n| n * e),
            );
        }
        out.extend([h * e, h * e]);
    } else {
        let (q, kv) = (sh.q, sh.kv);
        for l in 0..c.layers {
            out.push((q + 2 * kv) * h * e);
            if c.qkv_bias {
                out.push((q + 2 * kv) * e);
            }
            out.push(h * q * e);
            if c.o_bias {
                out.push(h * e);
            }
            if l == 0 {
                // `get_rope`'s cache, one for every layer: cos and sin
                // of each position, in the weights' type.
                out.push(c.max_positions * c.head_dim * e);
            }
            if c.arch == Arch::Qwen3 {
                out.extend([c.head_dim * e, c.head_dim * e]);
            }
            out.extend([2 * i * h * e, h * i * e, h * e, h * e]);
        }
        out.push(h * e);
    }
    if !c.tied {
        out.push(v * h * e);
    }
    out
}

/// The model runner's persistent buffers: token ids (int32), positions
/// (int64), the slot mapping (int64), the block table
/// (`max_num_seqs × cdiv(max_model_len, block_size)` int32) and the
/// per-request offsets and lengths.
pub fn runner_buffers(s: &Serving) -> Vec<u64> {
    let (t, r) = (s.max_num_batched_tokens, s.max_num_seqs);
    let blocks = s.max_model_len.div_ceil(s.block_size);
    vec![t * 4, t * 8, t * 8, r * blocks * 4, (r + 1) * 4, r * 4]
}

/// One rank's model as the profile plays it: the config, the rank's
/// share of it, and the weights' element size.
#[derive(Clone, Copy)]
struct Rank<'a> {
    c: &'a HfConfig,
    sh: Shard,
    e: u64,
}

/// A row-parallel layer's output: each rank's partial sums, then (with
/// more than one rank) the all-reduce's new tensor, out of place as
/// `CudaCommunicator.all_reduce` returns it.
fn reduced(g: &mut Gpu, bytes: u64, sh: Shard) -> Result<usize, u64> {
    let partial = g.alloc(bytes)?;
    if sh.tp == 1 {
        return Ok(partial);
    }
    let sum = g.alloc(bytes)?;
    g.free(partial);
    Ok(sum)
}

/// The forward over `t` tokens as vLLM's layers run it, then the hidden
/// states of the `r` requests' last positions. Leaves the final hidden
/// states and the gathered rows live; returns them.
fn forward(g: &mut Gpu, m: Rank, t: u64, r: u64) -> Result<[usize; 2], u64> {
    let Rank { c, sh, e } = m;
    let h = c.hidden;
    if c.arch == Arch::Gpt2 {
        return gpt2_forward(g, m, t, r);
    }
    let (q, kv) = (sh.q, sh.kv);
    // The embedding's output is the residual the whole way: layer 0
    // norms it into a new tensor, the later layers add and norm in place.
    let residual = g.alloc(t * h * e)?;
    let mut hidden = g.alloc(t * h * e)?;
    for _ in 0..c.layers {
        let qkv = g.alloc(t * (q + 2 * kv) * e)?;
        let normed = if c.arch == Arch::Qwen3 {
            Some([g.alloc(t * q * e)?, g.alloc(t * kv * e)?])
        } else {
            None
        };
        let out = g.alloc(t * q * e)?;
        let o = reduced(g, t * h * e, sh)?;
        for x in [Some(qkv), Some(out)]
            .into_iter()
            .chain(normed.into_iter().flatten().map(Some))
            .flatten()
        {
            g.free(x);
        }
        g.free(hidden);
        let gate_up = g.alloc(t * 2 * sh.inter * e)?;
        let act = g.alloc(t * sh.inter * e)?;
        g.free(gate_up);
        let down = reduced(g, t * h * e, sh)?;
        g.free(act);
        g.free(o);
        hidden = down;
    }
    g.free(residual);
    let last = g.alloc(r * h * e)?;
    Ok([hidden, last])
}

/// GPT-2's blocks in vLLM: LayerNorms and residual adds make new tensors.
fn gpt2_forward(g: &mut Gpu, m: Rank, t: u64, r: u64) -> Result<[usize; 2], u64> {
    let Rank { c, sh, e } = m;
    let (h, q) = (c.hidden, sh.q);
    let mut hidden = g.alloc(t * h * e)?;
    for _ in 0..c.layers {
        let ln1 = g.alloc(t * h * e)?;
        let qkv = g.alloc(t * 3 * q * e)?;
        let out = g.alloc(t * q * e)?;
        let proj = reduced(g, t * h * e, sh)?;
        g.free(qkv);
        g.free(out);
        g.free(ln1);
        let added = g.alloc(t * h * e)?;
        g.free(proj);
        g.free(hidden);
        let ln2 = g.alloc(t * h * e)?;
        let fc = g.alloc(t * sh.inter * e)?;
        let act = g.alloc(t * sh.inter * e)?;
        g.free(fc);
        let proj = reduced(g, t * h * e, sh)?;
        g.free(act);
        g.free(ln2);
        hidden = g.alloc(t * h * e)?;
        g.free(proj);
        g.free(added);
    }
    let normed = g.alloc(t * h * e)?;
    g.free(hidden);
    let last = g.alloc(r * h * e)?;
    Ok([normed, last])
}

/// `_dummy_sampler_run`: the logits of `r` rows, then the sampler twice.
/// Each call copies the logits to float32; FlashInfer's top-k/top-p
/// makes masked logits and their softmax, PyTorch's path (the second
/// call, with a generator) the softmax and the exponential noise, the
/// Triton top-k/top-p kernel a buffer it keeps. Returns the kept buffer.
fn sampler(g: &mut Gpu, m: Rank, r: u64, sm: u64) -> Result<usize, u64> {
    let Rank { c, sh, e } = m;
    let rows = g.alloc(r * c.hidden * e)?;
    // Each rank's share of the vocabulary, gathered whole on every rank
    // (`LogitsProcessor`'s all-gather).
    let mut logits = g.alloc(r * sh.vocab * e)?;
    if sh.tp > 1 {
        let gathered = g.alloc(r * sh.vocab * sh.tp * e)?;
        g.free(logits);
        logits = gathered;
    }
    let rv = r * c.vocab * 4;
    let f32 = g.alloc(rv)?;
    let masked = g.alloc(rv)?;
    let probs = g.alloc(rv)?;
    for x in [probs, masked, f32] {
        g.free(x);
    }
    let f32 = g.alloc(rv)?;
    let programs = sm.min(r);
    let kept = g.alloc(programs.next_power_of_two().min(sm) * c.vocab * 4)?;
    let probs = g.alloc(rv)?;
    let noise = g.alloc(rv)?;
    for x in [noise, probs, f32, logits, rows] {
        g.free(x);
    }
    Ok(kept)
}

/// The private pool one capture of `t` tokens fills: the forward's
/// tensors on an allocator of their own (graph pools share no blocks
/// with the rest).
fn capture_pool(card: &Card, m: Rank, t: u64) -> Result<u64, Invalid> {
    let mut g = Gpu::new(card)?;
    match forward(&mut g, m, t, t) {
        Ok(_) => Ok(g.allocator.stats().reserved_bytes.peak),
        Err(_) => Ok(g.reserved_now()),
    }
}

/// The start-up up to the KV cache.
pub fn profile(c: &HfConfig, card: &Card, dtype: Dtype, s: &Serving) -> Result<Profiled, Invalid> {
    let mut g = Gpu::new(card)?;
    let e = dtype.size_bytes();
    let mut out = Profiled::default();
    let sh = Shard::of(c, s.tensor_parallel_size);
    for bytes in weights(c, dtype, sh) {
        if let Err(asked) = g.alloc(bytes) {
            out.out_of_memory = Some(oom("while loading the weights", asked));
            return Ok(out);
        }
    }
    out.weights = g.allocated_now();
    for bytes in runner_buffers(s) {
        if let Err(asked) = g.alloc(bytes) {
            out.out_of_memory = Some(oom("while making the model runner's buffers", asked));
            return Ok(out);
        }
    }
    g.allocator.empty_cache(&mut g.device);
    g.allocator.reset_peak_stats();
    let t = s.max_num_batched_tokens;
    let r = t.min(s.max_num_seqs);
    let m = Rank { c, sh, e };
    let ran = forward(&mut g, m, t, r).and_then(|kept| {
        sampler(&mut g, m, r, card.sms)?;
        Ok(kept)
    });
    match ran {
        Ok(kept) => kept.into_iter().for_each(|x| g.free(x)),
        Err(asked) => {
            out.out_of_memory = Some(oom("in the profile run", asked));
            return Ok(out);
        }
    }
    out.transient_peak = g.allocator.stats().allocated_bytes.peak - g.allocated_now();
    g.allocator.empty_cache(&mut g.device);
    out.reserved_after = g.reserved_now();
    for sizes in s.capture_sizes() {
        if let Some(&largest) = sizes.last() {
            let first = capture_pool(card, m, largest)?;
            let rest = (sizes.len() as u64 - 1) * super::GRAPH_BYTES.max(MIB);
            out.cudagraph += first + rest;
        }
    }
    Ok(out)
}

fn oom(at: &str, asked: u64) -> String {
    format!(
        "CUDA out of memory {at}: tried to allocate {}",
        vramlab_core::units::format_size(asked)
    )
}
