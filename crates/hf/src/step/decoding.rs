//! A forward of `generate` on the same model code as a training step's,
//! under `torch.no_grad()` and `model.eval()` (no node, no dropout): over
//! the prompt, then over one new token at a time, the keys and values
//! read from the cache and written to it, the logits of the last
//! position only (`logits_to_keep=1`).
//!
//! - `DynamicCache`: every layer's keys and values grow by `torch.cat`
//!   each token, so the old and the new tensor live together for a moment
//!   (a sliding layer's stop growing at its window,
//!   `DynamicSlidingWindowLayer`);
//! - `StaticCache`: zeros of the whole length made at the prefill (a
//!   sliding layer's at most its window), written in place.
//!
//! The masks follow the cache: sdpa needs none with a dynamic one
//! (`is_causal`) but a boolean one with a static one; eager attention's
//! are made by `create_causal_mask` inside the forward, or with a static
//! cache by `prepare_inputs_for_generation` before it
//! (`create_masks_for_generate`).

use super::tape::{Tape, T};
use super::weights::Weights;
use super::{Model, Parts, Run, Sdpa};
use crate::config::{Arch, HfConfig};
use std::rc::Rc;
use vramlab_train::kinds::step::{sdp, Attention};
use vramlab_train::kinds::NamedTensor;
use vramlab_train::kv_cache::Cache;
use vramlab_train::program::{Holds, Op, Sink};

/// A layer's cache between forwards: its keys' and values' sink handles
/// and bytes, and how many positions they hold.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kept {
    keys: Option<(usize, u64)>,
    values: Option<(usize, u64)>,
    len: u64,
}

impl Kept {
    /// The handles of what it holds.
    pub fn handles(&self) -> impl Iterator<Item = usize> {
        [self.keys, self.values]
            .into_iter()
            .flatten()
            .map(|(h, _)| h)
    }
}

/// One forward of a `generate` call.
#[derive(Clone, Copy, Debug)]
pub struct Forward {
    /// Which forward of the call (0: the prefill).
    pub index: u64,
    pub batch: u64,
    /// Positions it runs over (the prompt's, then 1).
    pub tokens: u64,
    /// Positions in the cache before it.
    pub past: u64,
    /// Every position the call will see (a static cache's length).
    pub length: u64,
    pub cache: Cache,
    pub attention: Attention,
    /// On a GPU (else as the CPU's reference traces record it).
    pub cuda: bool,
}

/// A layer's cache while a forward runs.
#[derive(Clone, Copy, Default)]
struct Layer {
    keys: Option<T>,
    values: Option<T>,
    len: u64,
}

/// What a model's forward reads when `generate` runs it.
pub(super) struct Decoding {
    f: Forward,
    layers: Vec<Layer>,
    /// Eager attention's masks made before the forward.
    before: Option<[Option<T>; 2]>,
}

/// A model's weights as every forward of a `generate` reads them.
pub struct Loaded(Rc<Weights>);

impl Loaded {
    /// A model's `named_parameters()`.
    pub fn new(params: &[NamedTensor]) -> Loaded {
        Loaded(Rc::new(Weights::frozen(params)))
    }
}

/// Forward `f` of model `c` (its weights loaded), each tensor given to
/// `sink`, `cache` read and left as the forward leaves it: the logits'
/// handle (none where the sink stopped it).
pub fn forward(
    c: &HfConfig,
    weights: &Loaded,
    f: Forward,
    cache: &mut [Kept],
    sink: &mut dyn Sink,
) -> Option<usize> {
    let mut tape = Tape::new(sink);
    tape.set_grad(false);
    let layers = (cache.iter())
        .map(|k| Layer {
            keys: k.keys.map(|(h, b)| tape.adopt(h, b)),
            values: k.values.map(|(h, b)| tape.adopt(h, b)),
            len: k.len,
        })
        .collect();
    let run = Run::plain(f.batch, f.tokens, f.attention);
    let w = weights.0.clone();
    let kernel = Sdpa(sdp::select(None, c.dtype, c.head_dim, true));
    let parts = Parts {
        c: *c,
        run,
        w,
        kernel,
    };
    let mut m = Model::new(&mut tape, parts);
    m.decode = Some(Decoding {
        f,
        layers,
        before: None,
    });
    let before = m.masks_before();
    m.t.mark(Op::Forward(f.index));
    let ids = m.t.external(f.batch * f.tokens * 8);
    let logits = m.decode_forward(ids);
    m.t.mark(Op::Returned(f.index));
    if let Some(masks) = before {
        m.t.drop_all(&distinct(masks));
    }
    let decoding = m.decode.take()?;
    for (kept, layer) in cache.iter_mut().zip(decoding.layers) {
        let mut keep = |t: Option<T>| {
            let t = t?;
            Some((tape.keep(t)?, t.bytes))
        };
        *kept = Kept {
            keys: keep(layer.keys),
            values: keep(layer.values),
            len: layer.len,
        };
    }
    tape.keep(logits)
}

impl Model<'_, '_> {
    fn decoding(&self) -> Option<&Decoding> {
        self.decode.as_ref()
    }

    /// On a GPU: a training step's compute capability, a `generate`'s
    /// flag.
    pub(super) fn on_gpu(&self) -> bool {
        self.run.gpu.is_some() || self.decoding().is_some_and(|d| d.f.cuda)
    }

    /// The rows of the positions the rotary embedding and GPT-2's
    /// position embeddings read: `(1, seq)` in a training step,
    /// `generate`'s `(batch, tokens)` (from the attention mask's cumsum).
    pub(super) fn position_rows(&self) -> u64 {
        match self.decoding() {
            Some(d) => d.f.batch * d.f.tokens,
            None => self.run.seq,
        }
    }

    /// The keys layer `l`'s attention reads (its cache updated).
    pub(super) fn keys_read(&self, l: u64) -> u64 {
        match self.decoding() {
            Some(d) => d.layers.get(l as usize).map_or(0, |x| x.len),
            None => self.run.seq,
        }
    }

    /// The positions layer `l`'s cache holds once this forward's are
    /// in: a sliding layer keeps its window's last (a dynamic one, by the
    /// view of a `cat`: the window less one, then the new).
    fn cached_len(&self, d: &Decoding, sliding: bool) -> u64 {
        let (w, f) = (self.c.sliding_window, d.f);
        match (f.cache, sliding) {
            (Cache::Dynamic, false) => f.past + f.tokens,
            (Cache::Dynamic, true) => f.past.min(w.saturating_sub(1)) + f.tokens,
            (Cache::Static, false) => f.length,
            (Cache::Static, true) => f.length.min(w),
        }
    }

    /// `generate`'s cache update of layer `l` with this forward's keys
    /// and values (`k` and `v` go where the cache is done with them):
    /// what the attention reads.
    pub(super) fn decode_update(&mut self, l: u64, k: T, v: T) -> (T, T) {
        let (c, f) = (self.c, self.decoding().map(|d| d.f));
        let (Some(f), Some(layer)) = (f, self.decoding().and_then(|d| d.layers.get(l as usize)))
        else {
            return (k, v);
        };
        let layer = *layer;
        let sliding = c.sliding(l);
        let row = f.batch * c.kv_heads * c.head_dim * self.e();
        let len = match self.decoding() {
            Some(d) => self.cached_len(d, sliding),
            None => 0,
        };
        let outside = self.t.set_holds(Holds::KvCache);
        let make = |m: &mut Self, op| {
            let s = m.t.alloc(op, len * row, Holds::KvCache);
            m.t.plain(s, len * row)
        };
        let (keys, values) = match f.cache {
            Cache::Dynamic if sliding => {
                // Both `cat`s first, then the window's views rebind.
                let (keys, values) = (make(self, "cat"), make(self, "cat"));
                for old in [layer.keys, layer.values].into_iter().flatten() {
                    self.t.drop(old);
                }
                (keys, values)
            }
            Cache::Dynamic => {
                let keys = make(self, "cat");
                if let Some(old) = layer.keys {
                    self.t.drop(old);
                }
                let values = make(self, "cat");
                if let Some(old) = layer.values {
                    self.t.drop(old);
                }
                (keys, values)
            }
            Cache::Static => {
                let made = match (layer.keys, layer.values) {
                    (Some(keys), Some(values)) => (keys, values),
                    _ => (make(self, "zeros"), make(self, "zeros")),
                };
                // The positions written (`index_copy_`'s index).
                let positions = f.tokens * 8;
                let arange = self.t.alloc("arange", positions, Holds::Ids);
                let index = self.t.alloc("add", positions, Holds::Ids);
                self.t.release(arange);
                self.t.release(index);
                made
            }
        };
        self.t.set_holds(outside);
        if let Some(d) = self.decode.as_mut() {
            d.layers[l as usize] = Layer {
                keys: Some(keys),
                values: Some(values),
                len,
            };
        }
        self.t.drop_all(&[k, v]);
        (self.t.share(keys), self.t.share(values))
    }

    /// With a static cache the masks are made before the forward
    /// (`create_masks_for_generate` in `prepare_inputs_for_generation`),
    /// one per kind of layer, and live until it returns.
    fn masks_before(&mut self) -> Option<[Option<T>; 2]> {
        let d = self.decoding()?;
        if d.f.cache != Cache::Static {
            return None;
        }
        let masks = self.decode_mask_pair();
        if let Some(d) = self.decode.as_mut() {
            d.before = Some(masks);
        }
        Some(masks)
    }

    /// The masks a full and a sliding layer of a `generate` forward read.
    pub(super) fn decode_masks(&mut self) -> [Option<T>; 2] {
        let before = self.decoding().and_then(|d| d.before);
        let Some(masks) = before else {
            return self.decode_mask_pair();
        };
        for m in distinct(masks) {
            self.t.share(m);
        }
        masks
    }

    fn decode_mask_pair(&mut self) -> [Option<T>; 2] {
        let Some(d) = self.decoding() else {
            return [None, None];
        };
        let f = d.f;
        let keys = [self.cached_len(d, false), self.cached_len(d, true)];
        let gemma = matches!(self.c.arch, Arch::Gemma2 | Arch::Gemma3);
        let window = self.c.sliding_window;
        match (f.attention, f.cache) {
            (Attention::Eager, _) if !gemma => {
                let m = self.eager_mask(keys[0]);
                [Some(m), Some(m)]
            }
            (Attention::Eager, _) => {
                let full = self.eager_mask(keys[0]);
                let sliding = self.sliding_mask(false, keys[1]);
                [Some(full), Some(sliding)]
            }
            // The prefill leaves it to `is_causal`.
            (Attention::Sdpa, Cache::Static) if f.past == 0 => [None, None],
            (Attention::Sdpa, Cache::Static) if !gemma => {
                let m = self.boolean_mask(keys[0]);
                [Some(m), Some(m)]
            }
            (Attention::Sdpa, Cache::Static) => [
                Some(self.boolean_mask(keys[0])),
                Some(self.boolean_mask(keys[1])),
            ],
            (Attention::Sdpa, Cache::Dynamic) => {
                let sliding = gemma && window > 0 && f.tokens > window;
                [None, sliding.then(|| self.sliding_mask(true, keys[1]))]
            }
        }
    }

    /// sdpa's mask with a static cache (`sdpa_mask`, which cannot leave
    /// it to `is_causal`): a boolean of queries x keys for each sequence.
    fn boolean_mask(&mut self, keys: u64) -> T {
        let bytes = self.run.batch * self.run.seq * keys;
        let s = self.t.alloc("where", bytes, Holds::Activation);
        self.t.plain(s, bytes)
    }

    /// `scaled_dot_product_attention` under `no_grad` (the keys and values
    /// as the cache holds them): the output and the log-sum-exp, dropped at
    /// once (on the CPU the training step's kernel, which makes the same
    /// two). A static cache's boolean mask, passed after the prefill, is
    /// made a float one first (aten's `convert_boolean_attn_mask`:
    /// `where(mask, 0, -inf)`), which lives while the kernel runs.
    pub(super) fn decode_sdpa(&mut self, q: T, k: T, v: T, mask: Option<T>) -> T {
        let past = self.decoding().map_or(0, |d| d.f.past);
        let float_mask = mask.filter(|_| past > 0).map(|m| {
            let e = self.e();
            let zero = self.t.alloc("scalar_tensor", e, Holds::Activation);
            let inf = self.t.alloc("scalar_tensor", e, Holds::Activation);
            let made = self.t.alloc("where", m.bytes * e, Holds::Activation);
            self.t.release(zero);
            self.t.release(inf);
            made
        });
        let out = if self.on_gpu() {
            let (c, rows) = (self.c, self.run.batch * self.run.seq);
            let op = "_scaled_dot_product_flash_attention";
            let out = self.t.alloc(op, q.bytes, Holds::Activation);
            let lse = self.t.alloc(op, rows * c.heads * 4, Holds::Activation);
            self.t.release(lse);
            self.t.plain(out, q.bytes)
        } else {
            let outs = self.kernel.forward(self.t, &self.c, self.run, q, k, v);
            self.t.drop_all(&outs[1..]);
            outs[0]
        };
        if let Some(m) = float_mask {
            self.t.release(m);
        }
        out
    }
}

/// A full and a sliding layer's masks, each once (one where both read it).
pub(super) fn distinct(masks: [Option<T>; 2]) -> Vec<T> {
    match masks {
        [Some(f), Some(s)] if f.s == s.s => vec![f],
        [f, s] => f.into_iter().chain(s).collect(),
    }
}
