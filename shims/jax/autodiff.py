"""jax.grad and jax.value_and_grad: the gradient of a function with
respect to an argument has that argument's pytree shape, a new array on
the GPU for each leaf. The function runs op by op for its value (its
temporaries come and go as they are made); the backward pass's own
temporaries are not modelled (a note says so)."""

import vramlab_shim as _vs
from jax import numpy as _jnp
from jax import tree as _tree


def _grads_of(args, argnums):
    picked = [argnums] if isinstance(argnums, int) else list(argnums)
    grads = [_tree.map(_jnp.zeros_like, args[i]) for i in picked]
    return grads[0] if isinstance(argnums, int) else tuple(grads)


def value_and_grad(fun, argnums=0, has_aux=False, **_):
    def run(*args, **kwargs):
        _vs.note("jax.grad here: the gradients are shaped as the parameters; the backward pass's "
                 "temporaries are not modelled")
        out = fun(*args, **kwargs)
        return out, _grads_of(args, argnums)

    return run


def grad(fun, argnums=0, has_aux=False, **_):
    both = value_and_grad(fun, argnums, has_aux)

    def run(*args, **kwargs):
        out, grads = both(*args, **kwargs)
        if has_aux:
            return grads, out[1]
        return grads

    return run
