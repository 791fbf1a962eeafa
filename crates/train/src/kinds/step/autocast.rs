//! Autocast (`torch.autocast('cuda', dtype=...)` around the forward pass and
//! the loss), as `aten/src/ATen/autocast_mode.cpp` runs it: a matrix
//! product or convolution casts each floating input to the autocast type
//! (`cached_cast`, the last argument first), norms and losses run in
//! float32, and softmax asks for a float32 result. The casts of a
//! parameter (a float32 leaf that requires a gradient) are cached until the
//! outermost autocast region exits: a weight is cast once per forward, and
//! a cast that nothing saved (a bias's, or any under checkpointing's first
//! forward) lives until then. Backward, each cast's `ToCopyBackward` turns
//! a gradient back into float32: a parameter's becomes its `.grad`.
//! The cache is a hash map keyed by address, so the order in which it lets
//! go of its casts depends on addresses; here it is the order they were
//! made.

use super::{Arg, Calc, Op, Region, Role, Tape, H};
use vramlab_core::types::Dtype;

/// A cast the autocast cache holds: the parameter's index in
/// `parameters()`, the cast, and whether autograd saved it too.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cached {
    param: usize,
    cast: H,
    saved: bool,
}

impl<S> Tape<S> {
    /// The type matrix products compute in: the autocast type, or float32.
    pub(super) fn low(&self) -> Dtype {
        self.options.amp.unwrap_or(self.dtype)
    }

    pub(super) fn dtype_of(&self, h: H) -> Dtype {
        self.program.allocs[h].dtype
    }

    /// `cached_cast` of parameter `param`: the cast already made in this
    /// region, or a new one. `None` without autocast.
    pub(super) fn cast_param(&mut self, param: usize, shape: Vec<u64>) -> Option<H> {
        let dtype = self.options.amp.filter(|&a| a != self.dtype)?;
        if let Some(c) = self.cache.iter().find(|c| c.param == param) {
            return Some(c.cast);
        }
        let op = ("_to_copy", Calc::Copy(Arg::Param(param)));
        let cast = self.alloc_as(op, shape, dtype, self.role);
        self.cache.push(Cached {
            param,
            cast,
            saved: false,
        });
        Some(cast)
    }

    /// The cast of parameter `param` the cache holds, if any.
    pub(super) fn cached(&self, param: usize) -> Option<H> {
        self.cache.iter().find(|c| c.param == param).map(|c| c.cast)
    }

    /// Autograd saved a cast parameter: the cast outlives the cache.
    pub(super) fn save_cast(&mut self, cast: H) {
        let grad = self.grad;
        if let Some(c) = self.cache.iter_mut().find(|c| c.cast == cast) {
            c.saved = grad;
        }
    }

    /// An activation cast to the autocast type (never cached): a new
    /// tensor, or `x` itself when it has that type already.
    pub(super) fn cast_input(&mut self, x: H) -> H {
        match self.options.amp {
            Some(dtype) => self.cast_to(x, dtype),
            None => x,
        }
    }

    /// `x` as `dtype` (a copy), or `x` itself when it has that type.
    pub(super) fn cast_to(&mut self, x: H, dtype: Dtype) -> H {
        if self.dtype_of(x) == dtype {
            return x;
        }
        let shape = self.program.allocs[x].shape.to_vec();
        let op = ("_to_copy", Calc::Copy(Arg::T(x)));
        self.alloc_as(op, shape, dtype, self.role)
    }

    /// The outermost autocast region exits: the casts nothing saved die.
    pub(super) fn clear_cache(&mut self) {
        if self.options.amp.is_none() {
            return;
        }
        self.program.ops.push(Op::End(Region::Autocast));
        for c in std::mem::take(&mut self.cache) {
            if !c.saved {
                self.free(c.cast);
            }
        }
    }

    /// `ToCopyBackward`: a gradient `g` of a cast, back in `dtype`, with
    /// `role` (a parameter's `.grad`, or an activation's gradient); `g`
    /// dies.
    pub(super) fn uncast(&mut self, g: H, dtype: Dtype, role: Role) -> H {
        let shape = self.program.allocs[g].shape.to_vec();
        let h = self.alloc_as(("_to_copy", Calc::Copy(Arg::T(g))), shape, dtype, role);
        self.free(g);
        h
    }

    /// The `ToCopyBackward` of a layer's weight (parameter `param`) and
    /// bias: their float32 `.grad`s.
    pub(super) fn uncast_grads(&mut self, param: usize, weight: H, bias: H) {
        self.weight_grad_done(weight, param);
        self.weight_grad_done(bias, param + 1);
    }

    /// Parameter `param`'s gradient from `op`: its float32 `.grad`, or
    /// under autocast the gradient of its cast, in the autocast type
    /// (`weight_grad_done` turns it into the `.grad`).
    pub(super) fn weight_grad(
        &mut self,
        op: (&'static str, Calc),
        param: usize,
        shape: Vec<u64>,
    ) -> H {
        let role = match self.options.amp {
            Some(_) => self.role,
            None => Role::Grad(param),
        };
        self.alloc_as(op, shape, self.low(), role)
    }

    /// `weight_grad` from a matrix product.
    pub(super) fn weight_grad_mm(&mut self, param: usize, calc: Calc, shape: Vec<u64>) -> H {
        let g = self.weight_grad(("mm", calc), param, shape);
        self.blas();
        g
    }

    /// Under autocast, the cast's `ToCopyBackward`: the float32 `.grad` of
    /// parameter `param` from its cast's gradient `g`, which dies.
    pub(super) fn weight_grad_done(&mut self, g: H, param: usize) {
        if self.options.amp.is_some() {
            self.uncast(g, self.dtype, Role::Grad(param));
        }
    }

    /// A frozen parameter's cast: autocast caches only the casts of
    /// parameters that require a gradient, so each use makes a new one.
    pub(super) fn cast_frozen(&mut self, param: usize, shape: Vec<u64>) -> Option<H> {
        let dtype = self.options.amp?;
        let op = ("_to_copy", Calc::Copy(Arg::Param(param)));
        Some(self.alloc_as(op, shape, dtype, self.role))
    }

    /// A gradient as `dtype`: through the cast's `ToCopyBackward` when it
    /// has another type (`g` dies), or `g` itself.
    pub(super) fn back_to(&mut self, g: H, dtype: Dtype) -> H {
        if self.dtype_of(g) == dtype {
            return g;
        }
        self.uncast(g, dtype, Role::Backward)
    }
}
