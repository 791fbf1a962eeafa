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

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ndarray((len(range(*i.indices(self.shape[0]))),) + self.shape[1:], self.dtype)
        return ndarray(self.shape[1:], self.dtype)

    def _same(self, *a):
        return ndarray(self.shape, self.dtype)

    __add__ = __sub__ = __mul__ = __truediv__ = __radd__ = __rmul__ = _same


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
