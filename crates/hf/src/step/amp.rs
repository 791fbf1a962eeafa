//! `torch.autocast(device_type="cuda", dtype=...)` around the forward (the
//! loss inside it, `backward()` outside, as transformers' `Trainer` runs
//! it), with the weights in their own type: CUDA's policy
//! (`aten/src/ATen/autocast_mode.cpp`) for the ops a decoder runs.
//!
//! - Matrix products (`linear`, `matmul`, `scaled_dot_product_attention`)
//!   cast every floating input to the autocast type, the last argument
//!   first (`cached_cast` of each, as a Linux build evaluates them). The
//!   cast of a float32 weight that requires a gradient is kept in the
//!   autocast cache until the region exits (the forward's end); a frozen
//!   weight's (LoRA's base layers) is made for each use. Under
//!   checkpointing the recomputation casts again, into a cache of its own
//!   that goes when it ends.
//! - Other ops run in their inputs' type, the widest of them
//!   (`bfloat16 + float32` is float32): the residual stream stays in the
//!   weights' type; a gradient that comes back wider than its input is
//!   cast to the input's type (`validate_outputs`).

use super::tape::{Tape, T};
use super::Model;
use vramlab_train::program::Holds;

impl Tape<'_> {
    /// `cached_cast(dtype, w)` of a weight to `bytes`: the cast kept in
    /// the autocast cache when `w` requires a gradient (it is a leaf),
    /// else a new one. Whether it is the cache's.
    pub fn weight_cast(&mut self, w: T, bytes: u64) -> (T, bool) {
        if let Some(&(_, cast)) = self.amp_cache.iter().find(|(s, _)| *s == w.s) {
            return (cast, true);
        }
        let holds = self.set_holds(Holds::WeightCast);
        let cast = self.cast(w, bytes);
        self.set_holds(holds);
        let cacheable = w.fun.is_some();
        if cacheable {
            // The cache holds it, not Python (a recomputation's frames).
            self.unlist(cast.s);
            self.amp_cache.push((w.s, cast));
        }
        (cast, cacheable)
    }

    /// The autocast region exits (the forward's, or a recomputation's):
    /// its cache lets go of the casts.
    pub fn clear_amp_cache(&mut self) {
        for (_, cast) in std::mem::take(&mut self.amp_cache) {
            self.release(cast.s);
        }
    }
}

impl Model<'_, '_> {
    /// The element size matrix products make: the autocast type's, else
    /// the weights'.
    pub(super) fn pe(&self) -> u64 {
        self.run.amp.unwrap_or(self.c.dtype).size_bytes()
    }

    /// `x` cast to the autocast type where autocast would (it is not in it
    /// already): `numel` elements.
    fn amp_input(&mut self, x: T, numel: u64) -> T {
        let lo = self.pe();
        if x.bytes == numel * lo {
            self.t.share(x)
        } else {
            self.t.cast(x, numel * lo)
        }
    }

    /// `F.linear(x, w, b)` of `rows` rows of `fan_in` to `width`, the
    /// weight's elements `w_e` bytes each: under autocast the bias, the
    /// weight and the input cast first (those not in its type).
    pub(super) fn linear_of(
        &mut self,
        x: T,
        (w, b): (T, Option<T>),
        rows: u64,
        fans: (u64, u64),
        w_e: u64,
    ) -> T {
        self.product_of(x, (w, b), rows, fans, (w_e, false))
    }

    /// `linear_of`, or GPT-2's `Conv1D` (`conv1d`): `addmm(bias, x, weight)`.
    pub(super) fn product_of(
        &mut self,
        x: T,
        (w, b): (T, Option<T>),
        rows: u64,
        fans: (u64, u64),
        (w_e, conv1d): (u64, bool),
    ) -> T {
        let (fan_in, width) = fans;
        if self.run.amp.is_none() {
            return self.t.linear(x, w, b, rows * width * w_e);
        }
        let lo = self.pe();
        // What this call makes and lets go of, in the order it makes them.
        let mut temps: Vec<T> = Vec::new();
        let cast = |m: &mut Self, p: T, temps: &mut Vec<T>| {
            if p.bytes / w_e * lo == p.bytes {
                return p;
            }
            let (c, cached) = m.t.weight_cast(p, p.bytes / w_e * lo);
            if !cached {
                temps.push(c);
            }
            c
        };
        // `F.linear(input, weight, bias)` casts the bias, the weight, the
        // input; GPT-2's `Conv1D` (`addmm(bias, x, weight)`) the weight,
        // the input, the bias. The casts go in the order they were made,
        // also when a recomputation stops inside the product.
        let (x16, w16, b16) = if conv1d {
            let w16 = cast(self, w, &mut temps);
            let x16 = self.amp_input(x, rows * fan_in);
            temps.push(x16);
            let b16 = b.map(|b| cast(self, b, &mut temps));
            (x16, w16, b16)
        } else {
            let b16 = b.map(|b| cast(self, b, &mut temps));
            let w16 = cast(self, w, &mut temps);
            let x16 = self.amp_input(x, rows * fan_in);
            temps.push(x16);
            (x16, w16, b16)
        };
        self.t.op_temps = temps.iter().map(|t| t.s).collect();
        let out = self.t.linear(x16, w16, b16, rows * width * lo);
        self.t.op_temps.clear();
        self.t.drop_all(&temps);
        out
    }

    /// Operands of a matrix product under autocast (`matmul`, `sdpa`),
    /// cast last first, each of its `numel` elements.
    pub(super) fn amp_operands<const N: usize>(&mut self, xs: [(T, u64); N]) -> [T; N] {
        let mut out = xs.map(|(x, _)| x);
        for i in (0..N).rev() {
            out[i] = match self.run.amp {
                Some(_) => self.amp_input(xs[i].0, xs[i].1),
                None => self.t.share(xs[i].0),
            };
        }
        out
    }

    /// The operands' casts go in the order they were made (the last
    /// operand's first).
    pub(super) fn drop_operands<const N: usize>(&mut self, xs: [T; N]) {
        for x in xs.into_iter().rev() {
            self.t.drop(x);
        }
    }
}
