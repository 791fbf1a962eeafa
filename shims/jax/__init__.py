"""vramlab's JAX: arrays as shapes and types on vramlab's engine, whose
device memory is XLA's BFC allocator (preallocating 75% of the card as JAX
does, unless the settings say otherwise). An array on the GPU holds its
buffer for as long as CPython keeps it, or until ``.delete()``."""

import vramlab_shim as _vs
from jax._array import Array, Device, block_until_ready, device_put, devices, live_arrays, local_devices  # noqa: F401
from jax import numpy, random, tree, tree_util  # noqa: F401
from jax.autodiff import grad, value_and_grad  # noqa: F401

__version__ = "0.10.2+vramlab"
_vs.FRAMEWORK = "jax"


def jit(fun=None, **_):
    """Runs ``fun`` op by op: XLA's fusion and temporaries are not modelled
    for your own functions (the engine's compiled training step is)."""
    if fun is None:
        return jit

    def jitted(*args, **kwargs):
        _vs.note("jax.jit runs your function op by op here: XLA would fuse it and hold fewer temporaries")
        return fun(*args, **kwargs)

    return jitted


def clear_caches():
    """Drops compiled programs: no array is freed."""


def default_backend():
    return "gpu"


def device_count():
    return 1
