"""A small numpy: arrays as shapes and types on the host (no GPU memory)."""

from vramlab_shim import Shaped

float64, float32, float16, int64, int32, uint8 = "float64", "float32", "float16", "int64", "int32", "uint8"
_sizes = {"float64": 8, "float32": 4, "float16": 2, "int64": 8, "int32": 4, "uint8": 1, "bool": 1}


class ndarray(Shaped):
    def __init__(self, shape, dtype="float64"):
        self.shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        self.dtype = str(dtype)

    @property
    def itemsize(self):
        return _sizes.get(self.dtype, 8)

    def astype(self, dtype):
        return ndarray(self.shape, dtype)

    def reshape(self, *shape):
        return ndarray(self._reshaped(shape), self.dtype)

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        taken = sum(1 for i in index if i is not None and i is not Ellipsis)
        if taken > len(self.shape):
            raise IndexError("too many indices for array: array is %d-dimensional, but %d were indexed"
                             % (len(self.shape), taken))
        shape, dim = [], 0
        for i in index:
            if i is Ellipsis:
                shape += self.shape[dim:dim + len(self.shape) - taken]
                dim += len(self.shape) - taken
            elif i is None:
                shape.append(1)
            elif isinstance(i, slice):
                shape.append(len(range(*i.indices(self.shape[dim]))))
                dim += 1
            else:
                dim += 1
        return ndarray(shape + list(self.shape[dim:]), self.dtype)

    def _same(self, *a):
        return ndarray(self.shape, self.dtype)

    def _divided(self, *a):
        """True division: integers become float64, as numpy's do."""
        return ndarray(self.shape, self.dtype if self.dtype.startswith("float") else "float64")

    __add__ = __sub__ = __mul__ = __radd__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = _divided


def zeros(shape, dtype="float64"):
    return ndarray(shape, dtype)


ones = empty = zeros


def array(data, dtype=None):
    shape = []
    while isinstance(data, (list, tuple)):
        shape.append(len(data))
        data = data[0] if data else None
    return ndarray(shape, dtype or ("float64" if isinstance(data, float) else "int64"))


asarray = array


class random:
    @staticmethod
    def rand(*shape):
        return ndarray(shape)

    randn = rand

    @staticmethod
    def randint(low, high=None, size=None):
        return ndarray(size or (), "int64")

    @staticmethod
    def random(size=None):
        return ndarray(size or ())

    @staticmethod
    def seed(s):
        pass
