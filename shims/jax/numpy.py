"""jax.numpy: arrays made on the GPU (each call a new buffer)."""

from functools import reduce

from jax._array import DTYPES, Array, broadcast, dtype_of, matmul_shape, reduced, shape_of

float32, float16, bfloat16, float64 = DTYPES["float32"], DTYPES["float16"], DTYPES["bfloat16"], DTYPES["float64"]
int32, int64, int8, uint8, uint32 = DTYPES["int32"], DTYPES["int64"], DTYPES["int8"], DTYPES["uint8"], DTYPES["uint32"]
bool_ = DTYPES["bool"]
ndarray = Array


def _shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


def zeros(shape, dtype=None):
    return Array(_shape(shape), dtype_of(dtype, where="zeros"))


def ones(shape, dtype=None):
    return Array(_shape(shape), dtype_of(dtype, where="ones"))


def empty(shape, dtype=None):
    return Array(_shape(shape), dtype_of(dtype, where="empty"))


def full(shape, fill_value, dtype=None):
    return Array(_shape(shape), dtype_of(dtype, where="full"))


def zeros_like(a, dtype=None):
    return Array(shape_of(a), dtype or getattr(a, "dtype", None))


ones_like = empty_like = zeros_like


def arange(start, stop=None, step=1, dtype=None):
    if stop is None:
        start, stop = 0, start
    return Array((len(range(int(start), int(stop), int(step))),), dtype or "int32")


def _host_shape(data):
    shape = []
    while isinstance(data, (list, tuple)):
        shape.append(len(data))
        data = data[0] if data else None
    return tuple(shape)


def array(data, dtype=None):
    """A host value copied to the GPU (an array on it is copied too)."""
    if isinstance(data, Array):
        return Array(data.shape, dtype or data.dtype)
    shape = getattr(data, "shape", None)
    if shape is None:
        shape = _host_shape(data)
        default = "float32" if any(isinstance(v, float) for v in _flat(data)) else "int32"
    else:
        default = getattr(data, "dtype", "float32")
    return Array(tuple(shape), dtype_of(dtype, where="array") if dtype is not None else dtype_of(default))


def asarray(data, dtype=None):
    if isinstance(data, Array) and dtype is None:
        return data
    return array(data, dtype)


def _flat(data):
    if isinstance(data, (list, tuple)):
        for d in data:
            yield from _flat(d)
    else:
        yield data


def matmul(a, b):
    return Array(matmul_shape(shape_of(a), shape_of(b)), a.dtype)


dot = matmul


def _binary(a, b):
    x = a if isinstance(a, Array) else b
    return Array(broadcast(shape_of(a), shape_of(b)), x.dtype)


add = subtract = multiply = divide = maximum = minimum = power = _binary


def _unary(a, *_, **__):
    return Array(shape_of(a), a.dtype)


exp = log = tanh = sqrt = abs = negative = sin = cos = _unary


def sum(a, axis=None, **_):
    return Array(reduced(shape_of(a), axis), a.dtype)


mean = max = min = sum


def concatenate(arrays, axis=0):
    first = shape_of(arrays[0])
    axis = axis % len(first)
    total = reduce(lambda n, a: n + shape_of(a)[axis], arrays, 0)
    return Array(first[:axis] + (total,) + first[axis + 1:], arrays[0].dtype)


def stack(arrays, axis=0):
    first = shape_of(arrays[0])
    return Array(first[:axis] + (len(arrays),) + first[axis:], arrays[0].dtype)


def reshape(a, shape):
    return a.reshape(shape)


def transpose(a, axes=None):
    return a.T if axes is None else Array(tuple(a.shape[i] for i in axes), a.dtype)


def dtype(d):
    return dtype_of(d)
