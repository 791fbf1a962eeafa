//! The aten ops of a decoder's training step, each with what autograd
//! saves for it (`derivatives.yaml`: an input is saved when the other
//! input's gradient needs it) and what its backward allocates, in the
//! order the generated `apply` computes them.

use super::tape::{Sid, Tape, T};

/// The gradient `g` passed on as it is (a view's, an add's).
fn pass(t: &mut Tape<'_>, g: Option<Sid>) -> Option<Sid> {
    let g = g?;
    t.hold(g);
    Some(g)
}

/// `validate_outputs`: a gradient of `bytes` for an input of `to` bytes
/// (broadcast in the forward) summed to the input's shape.
fn sum_to(t: &mut Tape<'_>, g: Option<Sid>, bytes: u64, to: u64) -> Option<Sid> {
    narrowed(t, g, bytes, to, "sum")
}

/// A gradient of `bytes` made into one of `to` bytes by `op`, where it is
/// smaller; the first goes.
fn narrowed(
    t: &mut Tape<'_>,
    g: Option<Sid>,
    bytes: u64,
    to: u64,
    op: &'static str,
) -> Option<Sid> {
    let g = g?;
    if to >= bytes {
        return Some(g);
    }
    let made = t.temp(op, to);
    t.release(g);
    Some(made)
}

/// What `validate_outputs` makes of a gradient of `bytes` for an input
/// of `to` bytes: summed to its shape where it was broadcast, or cast to
/// its type where it is narrower (an autocast product's input, promoted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    Sum(u64),
    Cast(u64),
}

fn fit(t: &mut Tape<'_>, g: Option<Sid>, bytes: u64, f: Fit) -> Option<Sid> {
    match f {
        Fit::Sum(to) => sum_to(t, g, bytes, to),
        Fit::Cast(to) => narrowed(t, g, bytes, to, "_to_copy"),
    }
}

/// Whether input `x` needs a gradient.
fn needs(x: &T) -> bool {
    x.fun.is_some()
}

/// What an op of one tensor saves for its backward.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Saves {
    Nothing,
    Input,
    Output,
}

impl Tape<'_> {
    /// `op` of `x` alone, making `bytes`, saving what `saves` names;
    /// backward one tensor `back` of `x`'s size.
    fn unary(&mut self, op: &'static str, bytes: u64, x: T, saves: Saves, back: &'static str) -> T {
        let xb = x.bytes;
        let saved: &[Sid] = if saves == Saves::Input { &[x.s] } else { &[] };
        self.op1(
            op,
            bytes,
            &[x],
            saved,
            saves == Saves::Output,
            move |t, _| vec![Some(t.grad(0, back, xb))],
        )
    }

    /// `F.embedding(ids, weight)`: saves the indices; backward the
    /// weight's dense gradient.
    pub fn embedding(&mut self, weight: T, ids: T, bytes: u64) -> T {
        let w = weight.bytes;
        self.op1(
            "embedding",
            bytes,
            &[weight, ids],
            &[ids.s],
            false,
            move |t, _| vec![Some(t.grad(0, "embedding_dense_backward", w)), None],
        )
    }

    /// `x @ weight.T (+ bias)` over `rows` rows (`mm`, or `addmm` with a
    /// bias): saves `x` when the weight needs a gradient and the weight
    /// when `x` does. Backward: the bias's (a sum over the rows), the
    /// weight's, then `x`'s.
    pub fn linear(&mut self, x: T, weight: T, bias: Option<T>, bytes: u64) -> T {
        // Released in the saved variables' order of name: `mm`'s `mat2_`
        // then `self_`, `addmm`'s `mat1_` (the input) then `mat2_`.
        let mut saved = Vec::new();
        if needs(&x) {
            saved.push(weight.s);
        }
        if needs(&weight) {
            saved.push(x.s);
        }
        if bias.is_some() {
            saved.reverse();
        }
        let (xb, wb) = (x.bytes, weight.bytes);
        let (gx, gw) = (needs(&x), needs(&weight));
        let Some(b) = bias else {
            return self.op1("mm", bytes, &[x, weight], &saved, false, move |t, _| {
                let w = gw.then(|| t.grad(1, "mm", wb));
                let x = gx.then(|| t.grad(0, "mm", xb));
                vec![x, w]
            });
        };
        let (bb, gb) = (b.bytes, needs(&b));
        self.op1(
            "addmm",
            bytes,
            &[x, weight, b],
            &saved,
            false,
            move |t, g| {
                let b = if gb { pass(t, g[0]) } else { None };
                let x = gx.then(|| t.grad(0, "mm", xb));
                let w = gw.then(|| t.grad(1, "mm", wb));
                t.backward_returned();
                let b = b.map(|g| {
                    let s = t.grad(2, "sum", bb);
                    t.release(g);
                    s
                });
                vec![x, w, b]
            },
        )
    }

    /// `a * b`, of `bytes` (broadcast): saves `b` for `a`'s gradient and
    /// `a` for `b`'s. Backward: `a`'s product, `b`'s, then each summed to
    /// its input's shape.
    pub fn mul(&mut self, a: T, b: T, bytes: u64) -> T {
        self.mul_fit(a, b, bytes, [Fit::Sum(a.bytes), Fit::Sum(b.bytes)])
    }

    /// `mul`, each input's gradient made to fit it as `fits` say.
    pub fn mul_fit(&mut self, a: T, b: T, bytes: u64, fits: [Fit; 2]) -> T {
        // `other_` is released before `self_`.
        let mut saved = Vec::new();
        if needs(&a) {
            saved.push(b.s);
        }
        if needs(&b) {
            saved.push(a.s);
        }
        let (ga, gb) = (needs(&a), needs(&b));
        self.op1("mul", bytes, &[a, b], &saved, false, move |t, _| {
            let x = ga.then(|| t.grad(0, "mul", bytes));
            let y = gb.then(|| t.grad(1, "mul", bytes));
            t.backward_returned();
            let x = fit(t, x, bytes, fits[0]);
            let y = fit(t, y, bytes, fits[1]);
            vec![x, y]
        })
    }

    /// `x * c` of a Python number: saves nothing; backward one product.
    pub fn scale(&mut self, x: T) -> T {
        self.unary("mul", x.bytes, x, Saves::Nothing, "mul")
    }

    /// `x / c` (or another op of `x` and a Python number): backward one
    /// tensor of `x`'s size.
    pub fn scale_as(&mut self, op: &'static str, x: T) -> T {
        self.unary(op, x.bytes, x, Saves::Nothing, op)
    }

    /// `native_layer_norm(x, weight, bias)` over `rows` rows: the output
    /// Python keeps, and the float32 mean and rstd the node saves with the
    /// input, weight and bias. Backward the gradients of the input, the
    /// weight and the bias (those needed).
    pub fn layer_norm(&mut self, x: T, w: T, b: T, rows: u64) -> T {
        let op = "native_layer_norm";
        let back = "native_layer_norm_backward";
        let sizes = [x.bytes, w.bytes, b.bytes];
        let need = [needs(&x), needs(&w), needs(&b)];
        let outs = self.op(
            &[(op, x.bytes), (op, rows * 4), (op, rows * 4)],
            &[x, w, b],
            &[b.s, x.s, w.s],
            &[1, 2],
            move |t, _| {
                (0..3)
                    .map(|i| need[i].then(|| t.grad(i, back, sizes[i])))
                    .collect()
            },
        );
        self.drop_all(&outs[1..]);
        outs[0]
    }

    /// `native_dropout(x, p, train=True)` (CUDA's): the output and a
    /// boolean mask of `numel` elements the node saves; backward one
    /// tensor.
    pub fn native_dropout(&mut self, x: T, numel: u64) -> T {
        let bytes = x.bytes;
        let op = "native_dropout";
        let outs = self.op(&[(op, bytes), (op, numel)], &[x], &[], &[1], move |t, _| {
            vec![Some(t.grad(0, "native_dropout_backward", bytes))]
        });
        self.drop(outs[1]);
        outs[0]
    }

    /// `torch.tanh(x)`: saves its result; backward `tanh_backward`.
    pub fn tanh(&mut self, x: T) -> T {
        self.softmax("tanh", "tanh_backward", x)
    }

    /// `a + b`, of `bytes`: saves nothing; backward passes the gradient to
    /// both (summed to a broadcast input's shape).
    pub fn add(&mut self, a: T, b: T, bytes: u64) -> T {
        self.add_fit(a, b, bytes, [Fit::Sum(a.bytes), Fit::Sum(b.bytes)])
    }

    /// `add`, each input's gradient made to fit it as `fits` say.
    pub fn add_fit(&mut self, a: T, b: T, bytes: u64, fits: [Fit; 2]) -> T {
        let (ga, gb) = (needs(&a), needs(&b));
        self.op1("add", bytes, &[a, b], &[], false, move |t, g| {
            let x = if ga { pass(t, g[0]) } else { None };
            let y = if gb { pass(t, g[0]) } else { None };
            let x = fit(t, x, bytes, fits[0]);
            let y = fit(t, y, bytes, fits[1]);
            vec![x, y]
        })
    }

    /// `a + b` of `numel` elements each, in the wider of their types (a
    /// residual in float32 plus an autocast product's output): the
    /// narrower one's gradient cast back.
    pub fn add_mixed(&mut self, a: T, b: T) -> T {
        let bytes = a.bytes.max(b.bytes);
        self.add_fit(a, b, bytes, [Fit::Cast(a.bytes), Fit::Cast(b.bytes)])
    }

    /// `x + c` of a Python number: backward passes the gradient.
    pub fn add_scalar(&mut self, x: T) -> T {
        self.copy("add", x)
    }

    /// `x.pow(2)`: saves `x`; backward `grad * (2 * x.pow(1))`.
    pub fn square(&mut self, x: T) -> T {
        let bytes = x.bytes;
        self.op1("pow", bytes, &[x], &[x.s], false, move |t, _| {
            vec![Some(three_term(t, "pow", bytes))]
        })
    }

    /// `x.mean(-1, keepdim=True)` of `bytes`: backward `grad.expand() / n`.
    pub fn mean(&mut self, x: T, bytes: u64) -> T {
        self.unary("mean", bytes, x, Saves::Nothing, "div")
    }

    /// `torch.rsqrt(x)`: saves its result; backward
    /// `-0.5 * grad * result.pow(3)`.
    pub fn rsqrt(&mut self, x: T) -> T {
        let bytes = x.bytes;
        self.op1("rsqrt", bytes, &[x], &[], true, move |t, _| {
            vec![Some(three_term(t, "pow", bytes))]
        })
    }

    /// An elementwise op of `x` that saves `x` (SiLU, GELU's tanh, …);
    /// backward one tensor `back`.
    pub fn unary_saving_input(&mut self, op: &'static str, back: &'static str, x: T) -> T {
        self.unary(op, x.bytes, x, Saves::Input, back)
    }

    /// `-x`: backward `-grad`.
    pub fn neg(&mut self, x: T) -> T {
        self.unary("neg", x.bytes, x, Saves::Nothing, "neg")
    }

    /// `torch.cat(parts)`: saves nothing; backward each part a view of
    /// the gradient.
    pub fn cat(&mut self, parts: &[T]) -> T {
        let bytes = parts.iter().map(|p| p.bytes).sum();
        let n = parts.len();
        self.op1("cat", bytes, parts, &[], false, move |t, g| {
            (0..n).map(|_| pass(t, g[0])).collect()
        })
    }

    /// `torch.cat(parts)` of parts some of which are of a narrower type
    /// (`narrow`: promoted in the output): their gradients are casts of
    /// the output's slice, not views of it.
    pub fn cat_promoted(&mut self, parts: &[T], narrow: &[bool]) -> T {
        let bytes = parts.iter().map(|p| p.bytes).sum();
        let sizes: Vec<(u64, bool)> = (parts.iter().zip(narrow))
            .map(|(p, &n)| (p.bytes, n))
            .collect();
        self.op1("cat", bytes, parts, &[], false, move |t, g| {
            (sizes.iter())
                .map(|&(b, narrow)| match narrow {
                    true => g[0].map(|_| t.temp("_to_copy", b)),
                    false => pass(t, g[0]),
                })
                .collect()
        })
    }

    /// `x[..., a:b]` of `bytes`: a view; backward `slice_backward` makes
    /// the whole input's gradient.
    pub fn slice(&mut self, x: T, bytes: u64) -> T {
        let xb = x.bytes;
        self.view(x, bytes, move |t, _| {
            vec![Some(t.grad(0, "slice_backward", xb))]
        })
    }

    /// `x.chunk(n, dim=-1)`: `n` views; backward `cat`s their gradients.
    pub fn split(&mut self, x: T, n: usize) -> Vec<T> {
        let whole = x.bytes;
        self.views(x, n, whole / n as u64, move |t, _| {
            vec![Some(t.grad(0, "cat", whole))]
        })
    }

    /// `x[..., :n]` of the whole last dimension: `alias`, a view whose
    /// backward passes the gradient.
    pub fn alias(&mut self, x: T) -> T {
        self.view(x, x.bytes, |t, g| vec![pass(t, g[0])])
    }

    /// A view of `x` whose backward copies the gradient to `x`'s layout
    /// (`reshape` of a gradient that is not contiguous there).
    pub fn rows_view(&mut self, x: T) -> T {
        let bytes = x.bytes;
        self.view(x, bytes, move |t, _| vec![Some(t.grad(0, "clone", bytes))])
    }

    /// `x.contiguous()`/`clone()` (or another op that keeps `x`'s size and
    /// passes the gradient back as it is): a copy.
    pub fn copy(&mut self, op: &'static str, x: T) -> T {
        self.op1(op, x.bytes, &[x], &[], false, |t, g| vec![pass(t, g[0])])
    }

    /// `x.transpose(1, 2).contiguous()`: a copy whose gradient, transposed
    /// back, is copied again where it is batched (`_unsafe_view`'s
    /// `reshape`).
    pub fn contiguous_heads(&mut self, x: T) -> T {
        self.unary("clone", x.bytes, x, Saves::Nothing, "clone")
    }

    /// `a + b` where `b` is of a wider type (peft's float32 adapters on
    /// half weights): `validate_outputs` casts `a`'s gradient back.
    pub fn add_wider(&mut self, a: T, b: T) -> T {
        let (ab, bytes, ga, gb) = (a.bytes, b.bytes, needs(&a), needs(&b));
        self.op1("add", bytes, &[a, b], &[], false, move |t, g| {
            let y = if gb { pass(t, g[0]) } else { None };
            let x = g[0].filter(|_| ga).map(|_| t.grad(0, "_to_copy", ab));
            vec![x, y]
        })
    }

    /// `x.to(dtype)` of `bytes`: saves nothing; backward the gradient
    /// cast back.
    pub fn cast(&mut self, x: T, bytes: u64) -> T {
        self.unary("_to_copy", bytes, x, Saves::Nothing, "_to_copy")
    }

    /// An op that saves its result ((log-)softmax over the last dimension,
    /// `tanh`); backward one tensor `back`.
    pub fn softmax(&mut self, op: &'static str, back: &'static str, x: T) -> T {
        self.unary(op, x.bytes, x, Saves::Output, back)
    }

    /// `F.nll_loss(log_probs, target)`: the loss and `total_weight`;
    /// saves the log-probabilities, the target and the total weight;
    /// backward the log-probabilities' gradient.
    pub fn nll_loss(&mut self, log_probs: T, target: T) -> T {
        let lb = log_probs.bytes;
        let outs = self.op(
            &[("nll_loss_forward", 4), ("nll_loss_forward", 4)],
            &[log_probs, target],
            &[log_probs.s, target.s],
            &[1],
            move |t, _| vec![Some(t.grad(0, "nll_loss_backward", lb)), None],
        );
        self.drop(outs[1]);
        outs[0]
    }

    /// `bmm(a, b)` of `bytes`: saves both; backward `b`'s then `a`'s.
    pub fn bmm(&mut self, a: T, b: T, bytes: u64) -> T {
        let (ab, bb, ga, gb) = (a.bytes, b.bytes, needs(&a), needs(&b));
        // `mat2_` is released before `self_`.
        let mut saved = Vec::new();
        if ga {
            saved.push(b.s);
        }
        if gb {
            saved.push(a.s);
        }
        self.op1("bmm", bytes, &[a, b], &saved, false, move |t, _| {
            let y = gb.then(|| t.grad(1, "bmm", bb));
            let x = ga.then(|| t.grad(0, "bmm", ab));
            vec![x, y]
        })
    }

    /// `x.expand(...)` to `bytes`: a view; backward sums the gradient back.
    pub fn expand(&mut self, x: T, bytes: u64) -> T {
        let xb = x.bytes;
        self.view(x, bytes, move |t, g| {
            let g = pass(t, g[0]);
            vec![sum_to(t, g, bytes, xb)]
        })
    }
}

/// `grad * (c * x.pow(k))`: the power, the scalar product and the
/// gradient's product, the first two freed once the last is made.
fn three_term(t: &mut Tape<'_>, first: &'static str, bytes: u64) -> Sid {
    let p = t.temp(first, bytes);
    let c = t.temp("mul", bytes);
    let out = t.grad(0, "mul", bytes);
    t.release(p);
    t.release(c);
    out
}
