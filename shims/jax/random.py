"""jax.random: keys and random arrays, each a new buffer on the GPU."""

from jax._array import Array


def PRNGKey(seed):
    """A key: two uint32 on the GPU."""
    return Array((2,), "uint32")


key = PRNGKey


def split(key, num=2):
    return Array((num, 2), "uint32")


def _shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


def normal(key, shape=(), dtype=None):
    return Array(_shape(shape), dtype)


def uniform(key, shape=(), dtype=None, minval=0.0, maxval=1.0):
    return Array(_shape(shape), dtype)


def randint(key, shape, minval, maxval, dtype=None):
    return Array(_shape(shape), dtype or "int32")


def bernoulli(key, p=0.5, shape=None):
    return Array(_shape(shape or ()), "bool")


def permutation(key, x):
    n = x if isinstance(x, int) else x.shape[0]
    return Array((n,), "int32")
