//! What every decoder layer reads besides its input, as transformers
//! makes it before the layers: the positions, the masks (eager attention's,
//! sliding windows', after the packed-sequence check), the rotary cos and
//! sin.

use super::tape::{self, Tape, T};
use super::Model;
use vramlab_train::kinds::step::Attention;
use vramlab_train::program::Holds;

impl Model<'_, '_> {
    /// `position_ids = torch.arange(seq) + past_seen_tokens` (`generate`
    /// makes them before the forward).
    pub(super) fn positions(&mut self) -> T {
        if self.decode.is_some() {
            return self.t.external(0);
        }
        let n = self.run.seq;
        let arange = self.t.alloc("arange", n * 8, Holds::Ids);
        let ids = self.t.alloc("add", n * 8, Holds::Ids);
        self.t.release(arange);
        self.t.plain(ids, n * 8)
    }

    /// Without a cache, each mask `create_*_mask` makes first looks for
    /// packed sequences in the positions (`find_packed_sequence_indices`).
    pub(super) fn packed_check(&mut self) {
        if self.cached() {
            return;
        }
        let (b, n) = (self.run.batch, self.run.seq);
        let first = self.t.alloc("sub", b * 8, Holds::Ids);
        let prepended = self.t.alloc("cat", b * (n + 1) * 8, Holds::Ids);
        let diff = self.t.alloc("sub", b * n * 8, Holds::Ids);
        self.t.release(prepended);
        let ne = self.t.alloc("ne", b * n, Holds::Ids);
        let cumsum = self.t.alloc("cumsum", b * n * 8, Holds::Ids);
        self.t.release(ne);
        let eq = self.t.alloc("eq", b, Holds::Ids);
        let all = self.t.alloc("all", 1, Holds::Ids);
        for s in [eq, all, cumsum, diff, first] {
            self.t.release(s);
        }
    }

    /// A mask's query or key index: `arange(n)` plus the positions seen.
    pub(super) fn mask_index(&mut self, n: u64) -> tape::Sid {
        let arange = self.t.alloc("arange", n * 8, Holds::Ids);
        let shifted = self.t.alloc("add", n * 8, Holds::Ids);
        self.t.release(arange);
        shifted
    }

    /// `create_causal_mask` for eager attention (`eager_mask`): the
    /// batch, head, query and key indices, `kv_idx <= q_idx`, and a batch
    /// of queries x `keys` in the model's type, 0 or its minimum.
    pub(super) fn eager_mask(&mut self, keys: u64) -> T {
        let (b, n) = (self.run.batch, self.run.seq);
        let mut a = |op, bytes| self.t.alloc(op, bytes, Holds::Ids);
        let batch = a("arange", b * 8);
        let head = a("arange", 8);
        let q = self.mask_index(n);
        let kv = self.mask_index(keys);
        let le = self.t.alloc("le", n * keys, Holds::Ids);
        for s in [batch, head, q, kv] {
            self.t.release(s);
        }
        let zero = self.t.alloc("zeros", 4, Holds::Ids);
        let min = self.t.alloc("scalar_tensor", 4, Holds::Ids);
        let bytes = b * n * keys * self.e();
        let mask = self.t.alloc("where", bytes, Holds::Activation);
        for s in [zero, min, le] {
            self.t.release(s);
        }
        self.t.plain(mask, bytes)
    }

    /// `LlamaRotaryEmbedding.forward` under `no_grad`: cos and sin of the
    /// positions (float32, cast to the model's type). Its `inv_freq @
    /// positions` is a batched product on a GPU, the step's first cuBLAS
    /// call (the H100's snapshot has the workspace made there); the CPU
    /// multiplies.
    pub(super) fn rotary(&mut self) -> (T, T) {
        let (n, r) = (self.position_rows(), self.c.rotary);
        let f = |t: &mut Tape<'_>, op, bytes| t.alloc(op, bytes, Holds::Activation);
        let positions = f(self.t, "_to_copy", n * 4);
        let product = if self.on_gpu() { "bmm" } else { "mul" };
        let freqs = f(self.t, product, n * r * 4);
        self.t.release(positions);
        let emb = f(self.t, "cat", n * 2 * r * 4);
        let mut trig = |op| {
            let raw = f(self.t, op, n * 2 * r * 4);
            let scaled = f(self.t, "mul", n * 2 * r * 4);
            self.t.release(raw);
            scaled
        };
        let (cos, sin) = (trig("cos"), trig("sin"));
        // `cos.to(x.dtype), sin.to(x.dtype)` are made before the locals go.
        let cast = self.low().then(|| {
            let bytes = n * 2 * r * self.e();
            [f(self.t, "_to_copy", bytes), f(self.t, "_to_copy", bytes)]
        });
        self.t.release(freqs);
        self.t.release(emb);
        let (cos, sin) = match cast {
            Some([c, s]) => {
                self.t.release(cos);
                self.t.release(sin);
                (c, s)
            }
            None => (cos, sin),
        };
        let bytes = n * 2 * r * self.e();
        (self.t.plain(cos, bytes), self.t.plain(sin, bytes))
    }

    /// The masks a full and a sliding layer read: eager attention's always
    /// (Gemma makes both kinds), sdpa's where a sliding window is shorter
    /// than the sequence.
    pub(super) fn masks(&mut self) -> [Option<T>; 2] {
        if self.decode.is_some() {
            return self.decode_masks();
        }
        let n = self.run.seq;
        let eager = self.run.attention == Attention::Eager;
        self.packed_check();
        if !self.gemma() {
            return match eager {
                true => {
                    let m = self.eager_mask(n);
                    [Some(m), Some(m)]
                }
                false => [None, None],
            };
        }
        let sliding_needed = self.c.sliding_window > 0 && self.run.seq > self.c.sliding_window;
        let full = eager.then(|| self.eager_mask(n));
        self.packed_check();
        let sliding = (eager || sliding_needed).then(|| self.sliding_mask(!eager, n));
        [full, sliding]
    }
}
