"""jax.Array as a shape and a type: one buffer on the GPU, allocated by
XLA's BFC allocator when the array is made, freed when CPython frees the
array or ``.delete()`` is called. Each operation makes a new array, as
JAX's eager operations do."""

import warnings
import weakref

import vramlab_shim as vs


class DType:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return "dtype('%s')" % self.name

    def __str__(self):
        return self.name

    def __eq__(self, other):
        return str(self) == str(other)

    def __hash__(self):
        return hash(self.name)


DTYPES = {n: DType(n, s) for n, s in [("float32", 4), ("float16", 2), ("bfloat16", 2), ("float64", 8),
                                        ("int32", 4), ("int64", 8), ("int8", 1), ("uint8", 1),
                                        ("uint32", 4), ("bool", 1)]}


# With jax_enable_x64 off (JAX's default), 64-bit types are 32-bit.
_X64 = {"float64": "float32", "int64": "int32", "uint64": "uint32", "float": "float32", "int": "int32"}


def dtype_of(d, default="float32", where=None):
    """JAX's type for `d`. A 64-bit type asked for by name (`where`: the
    function asked) is truncated with JAX's warning; one that comes from
    host data or Python's `float`/`int` silently."""
    if d is None:
        return DTYPES[default]
    name = getattr(d, "name", None) or getattr(d, "__name__", None) or str(d)
    if name in _X64:
        if where and name not in ("float", "int"):
            warnings.warn(
                "Explicitly requested dtype %s requested in %s is not available, and will be truncated to dtype %s. "
                "To enable more dtypes, set the jax_enable_x64 configuration option or the JAX_ENABLE_X64 shell "
                "environment variable. See https://github.com/jax-ml/jax#current-gotchas for more." % (name, where, _X64[name]),
                stacklevel=3,
            )
        name = _X64[name]
    if name not in DTYPES:
        raise TypeError("JAX has no dtype %r" % (d,))
    return DTYPES[name]


# The engine's type of the same size (a PRNG key's uint32 is 4 bytes).
_ENGINE = {"uint32": "int32"}

_live = weakref.WeakSet()


class Buffer(vs.Owner):
    """One device buffer, named in the engine."""

    def __init__(self, shape, dt):
        self._name = None
        name = vs.fresh_name()
        vs.make(vs.command("alloc", name=name, shape=list(shape), dtype=_ENGINE.get(dt.name, dt.name)))
        self._name = name


def _dims(shape):
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(d) for d in shape)


def broadcast(a, b):
    a, b = list(a), list(b)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise TypeError("add got incompatible shapes for broadcasting: %s, %s." % (tuple(a), tuple(b)))
        out.append(max(x, y))
    return tuple(out)


def shape_of(x):
    return tuple(getattr(x, "shape", ()))


class Array(vs.Shaped):
    """A ``jax.Array`` on the GPU."""

    __array_priority__ = 1000

    def __init__(self, shape, dtype=None):
        self.shape = _dims(shape)
        self.dtype = dtype_of(dtype)
        self._buffer = Buffer(self.shape, self.dtype)
        _live.add(self)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    def __repr__(self):
        if self._buffer is None:
            return "Array(<deleted>, shape=%s, dtype=%s)" % (self.shape, self.dtype)
        return "Array(shape=%s, dtype=%s)" % (self.shape, self.dtype)

    def _check(self):
        if self._buffer is None:
            raise RuntimeError("Array has been deleted with shape=%s%s." % (self.dtype, list(self.shape)))

    # ----- the buffer
    def delete(self):
        """Frees the buffer now, whoever else refers to the array."""
        b, self._buffer = self._buffer, None
        if b is not None:
            b.__del__()

    def is_deleted(self):
        return self._buffer is None

    def block_until_ready(self):
        return self

    def devices(self):
        return {devices()[0]}

    @property
    def device(self):
        return devices()[0]

    def copy(self):
        self._check()
        return Array(self.shape, self.dtype)

    # ----- operations: each makes a new array
    def _new(self, shape, dtype=None):
        self._check()
        return Array(shape, dtype or self.dtype)

    def _binary(self, other):
        return self._new(broadcast(self.shape, shape_of(other)))

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _binary
    __truediv__ = __rtruediv__ = __pow__ = _binary

    def __neg__(self):
        return self._new(self.shape)

    def __matmul__(self, other):
        return self._new(matmul_shape(self.shape, shape_of(other)))

    def __rmatmul__(self, other):
        return self._new(matmul_shape(shape_of(other), self.shape))

    def astype(self, dtype):
        return self._new(self.shape, dtype_of(dtype))

    def reshape(self, *shape):
        return self._new(self._reshaped(shape))

    @property
    def T(self):
        return self._new(tuple(reversed(self.shape)))

    def sum(self, axis=None, **_):
        return self._new(reduced(self.shape, axis))

    mean = max = min = sum

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._new((len(range(*index.indices(self.shape[0]))),) + self.shape[1:])
        if isinstance(index, int):
            return self._new(self.shape[1:])
        raise NotImplementedError("vramlab's jax indexes arrays by one int or one slice")

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        """Each row a new array, as JAX slices one (`key, sub = split(key)`)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        for i in range(self.shape[0]):
            yield self[i]

    def item(self):
        vs.note("arrays hold shapes, not values: .item() gives nan")
        return vs.NotComputed("arrays hold shapes here, not values")

    __float__ = item


def matmul_shape(a, b):
    if not a or not b or a[-1] != (b[-2] if len(b) > 1 else b[0]):
        raise TypeError("dot_general requires contracting dimensions to have the same shape, got %s and %s." % (a, b))
    if len(a) == 1:
        return tuple(b[:-2]) + tuple(b[-1:]) if len(b) > 1 else ()
    if len(b) == 1:
        return tuple(a[:-1])
    return broadcast(a[:-2], b[:-2]) + (a[-2], b[-1])


def reduced(shape, axis):
    if axis is None:
        return ()
    axes = {axis % len(shape)} if isinstance(axis, int) else {a % len(shape) for a in axis}
    return tuple(d for i, d in enumerate(shape) if i not in axes)


class Device:
    """The GPU, as ``jax.devices()[0]``."""

    id = 0
    platform = "gpu"

    @property
    def device_kind(self):
        return vs.device_name()

    def __repr__(self):
        return "CudaDevice(id=0)"

    def memory_stats(self):
        """The BFC allocator's numbers, by XLA's names."""
        s = vs.stats() or {}
        return {
            "bytes_in_use": s.get("allocated_bytes", 0),
            "peak_bytes_in_use": s.get("peak_allocated_bytes", 0),
            # XLA_PYTHON_CLIENT_MEM_FRACTION's default, 75% of the card.
            "bytes_limit": s.get("device_total_bytes", 0) * 3 // 4,
            "bytes_reserved": 0,
            "pool_bytes": s.get("reserved_bytes", 0),
            "peak_pool_bytes": s.get("peak_reserved_bytes", 0),
            "num_allocs": s.get("allocations", 0),
        }


_DEVICE = Device()


def devices(backend=None):
    return [_DEVICE]


local_devices = devices


def device_put(x, device=None):
    """A host array copied to the GPU (an array already there stays)."""
    if isinstance(x, Array):
        return x
    return Array(shape_of(x), getattr(x, "dtype", None))


def block_until_ready(x):
    return x


def live_arrays():
    return [a for a in _live if not a.is_deleted()]
