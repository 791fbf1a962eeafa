"""vramlab's torch: tensors as shapes, types and devices on vramlab's
engine. A tensor on the GPU holds a block of the engine's caching
allocator for as long as CPython keeps it; training steps of the models
the engine knows run as the engine's step program."""

import builtins as _b

import vramlab_shim as _vs
from torch._tensor import (  # noqa: F401
    Size,
    Tensor,
    bfloat16,
    bool,
    broadcast_shapes,
    device,
    double,
    dtype,
    float,
    float16,
    float32,
    float64,
    half,
    int,
    int8,
    int16,
    int32,
    int64,
    long,
    short,
    uint8,
)

__version__ = "2.15.0+vramlab"
_vs.FRAMEWORK = "pytorch"
_default = {"device": "cpu", "dtype": float32}
_grad = [True]


def _make(shape, dtype=None, device=None, requires_grad=False, **_):
    from torch._tensor import _dims

    dev = device if device is not None else _default["device"]
    return Tensor(_dims(shape), dtype or _default["dtype"], dev, requires_grad=requires_grad)


def zeros(*shape, **k):
    return _make(shape, **k)


ones = empty = randn = rand = zeros


def full(shape, fill_value, **k):
    return _make(shape, **k)


def randint(low, high=None, size=None, **k):
    if size is None:
        size = high
    k.setdefault("dtype", int64)
    return _make(size, **k)


def arange(start, end=None, step=1, **k):
    if end is None:
        start, end = 0, start
    k.setdefault("dtype", int64 if _b.all(_b.isinstance(v, _b.int) for v in (start, end, step)) else float32)
    return _make((_b.max(0, -(-(end - start) // step)),), **k)


def tensor(data, dtype=None, device=None, requires_grad=False):
    shape = []
    d = data
    while _b.isinstance(d, (_b.list, _b.tuple)):
        shape.append(_b.len(d))
        d = d[0] if d else None
    if dtype is None:
        dtype = float32 if _b.isinstance(d, _b.float) else int64
    t = _make(shape, dtype=dtype, device=device, requires_grad=requires_grad)
    if not shape and _b.isinstance(data, (_b.int, _b.float)):
        t._value = data
    return t


as_tensor = tensor


def from_numpy(a):
    return Tensor(a.shape, _numpy_dtype(a.dtype), "cpu")


def _numpy_dtype(name):
    return {"float64": float64, "float32": float32, "float16": float16, "int64": int64, "int32": int32}.get(
        _b.str(name), float32
    )


def _like(t, dtype=None, device=None, **k):
    return _make(t.shape, dtype=dtype or t.dtype, device=device or t.device, **k)


zeros_like = ones_like = empty_like = randn_like = rand_like = _like


def cat(tensors, dim=0):
    tensors = _b.list(tensors)
    shape = _b.list(tensors[0].shape)
    shape[dim] = _b.sum(t.shape[dim] for t in tensors)
    return tensors[0]._new(shape)


concat = cat


def stack(tensors, dim=0):
    tensors = _b.list(tensors)
    shape = _b.list(tensors[0].shape)
    shape.insert(dim, _b.len(tensors))
    return tensors[0]._new(shape)


def matmul(a, b):
    return a @ b


mm = bmm = matmul


def _elementwise(t, *a, **k):
    return t._new(t.shape)


relu = sigmoid = tanh = exp = log = sqrt = abs = softmax = log_softmax = _elementwise


def sum(t, dim=None, keepdim=False, **k):
    return t._reduce(dim, keepdim)


mean = sum


def manual_seed(seed):
    return None


def set_default_device(d):
    _default["device"] = d


def set_default_dtype(d):
    _default["dtype"] = d


def get_default_dtype():
    return _default["dtype"]


def is_grad_enabled():
    return _grad[0]


class _GradMode:
    def __init__(self, enabled):
        self.enabled = enabled

    def __enter__(self):
        self.prev = _grad[0]
        _grad[0] = self.enabled

    def __exit__(self, *exc):
        _grad[0] = self.prev
        return False

    def __call__(self, f):
        def wrapped(*a, **k):
            with _GradMode(self.enabled):
                return f(*a, **k)

        return wrapped


def no_grad():
    return _GradMode(False)


def enable_grad():
    return _GradMode(True)


inference_mode = no_grad


def set_grad_enabled(flag):
    _grad[0] = flag
    return _GradMode(flag)


from torch import cuda, nn, optim, utils  # noqa: E402,F401
from torch._amp import autocast  # noqa: E402,F401
from torch import amp  # noqa: E402,F401
